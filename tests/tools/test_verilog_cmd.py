"""``elmoe3d verilog`` and the RTL export's walk of the die (:mod:`elmoe3d.synth.export`).

The walk's instance counts are checked against the synthesis roll-up's own rule for the die's
blocks (:data:`elmoe3d.synth.blocks.DIE_BLOCKS`, written apart from the walk) and against the
configuration's figures; the two Verilog forms' equivalence is the cocotb bench's
(``tests/cocotb/test_export.py``)."""

import re

import pytest

import elmoe3d.cli as cli
from elmoe3d.config import preset
from elmoe3d.hw.checked import inspection
from elmoe3d.hw.die import LogicDie
from elmoe3d.synth.blocks import DIE_BLOCKS, component_ports
from elmoe3d.sim.runner import module_ports
from elmoe3d.synth.export import die_blocks, hierarchical_verilog, module_name


def _walk(name):
    """{class name: [(count, params), ...]} of the die at preset ``name``."""
    with inspection():
        found = die_blocks(LogicDie(config=preset(name)))
        out = {}
        for entry in found.values():
            out.setdefault(entry.cls, []).append((entry.count, entry.params))
        found.clear()
    return out


@pytest.mark.parametrize("config", ["small", "paper-4gb", "paper-8gb"])
def test_walk_counts_are_the_die_rollups(config):
    """Every die block the synthesis roll-up counts (its own rule per block, from the
    configuration) is found by the walk as often; the VPU units and controllers below them by
    the configuration's figures."""
    arch = preset(config)
    walk = _walk(config)
    for blk in DIE_BLOCKS:
        cls = blk.path.rpartition(":")[2]
        if cls == "LogicDie":                           # the die's parts: below
            continue
        assert sum(n for n, _ in walk[cls]) == blk.count(arch), (config, blk.label)
    assert walk["LogicDie"] == [(1, walk["LogicDie"][0][1])]
    assert sum(n for n, _ in walk["TensorTile"]) == arch.pes
    assert sum(n for n, _ in walk["DramController"]) == arch.ext_channels
    assert sum(n for n, _ in walk["RingStation"]) == arch.groups
    assert sum(n for n, _ in walk["ExtScheduler"]) == arch.groups
    # the HB word ports, one a PE, and the EXT one: two distinct DramWordPort instances
    assert sorted(n for n, _ in walk["DramWordPort"]) == sorted([arch.pes, 1])
    # the PE's default unit counts (hw/pe: W/32 FP32 converters, min(W/32, 32) requant units)
    words = arch.pe.word_bits // 32
    assert sum(n for n, _ in walk["Fp32Converter"]) == arch.pes * words
    assert sum(n for n, _ in walk["RequantUnit"]) == arch.pes * min(words, 32)
    # a class's distinct instances differ in their parameters
    for cls, entries in walk.items():
        params = [p for _, p in entries]
        assert all(params.count(p) == 1 for p in params), cls


def test_hierarchy_is_one_module_per_distinct_instance():
    """The small die's hierarchical Verilog: one module per distinct block instance (its
    children by their module names, clock and reset connected), the top module named as asked
    with the die's ports; the flat form's top has the same ports."""
    with inspection():
        die = LogicDie(config=preset("small"))
        found = die_blocks(die)
        text = hierarchical_verilog(die, name="top_die")
        names = {key: module_name(e.obj) for key, e in found.items() if e.depth}
        ports = module_ports(text, "top_die")
        found.clear()
        die = None
    headers = re.findall(r"^module (\S+?)\s*\(", text, re.M)
    blocks = {"top_die", *names.values()}
    assert blocks <= set(headers) and len(set(headers)) == len(headers)
    # the rest are Amaranth's internal submodules of a block, named after it, all plain
    # identifiers (no escaped \\name.sub$12)
    for h in set(headers) - blocks:
        assert re.fullmatch(r"[A-Za-z_]\w*", h) and any(h.startswith(b + "_") for b in blocks), h
    for module in names.values():
        body_uses = re.findall(rf"^\s+{module} \w+ \(", text, re.M)
        assert body_uses, module                        # instantiated by its parent
    with inspection():
        die = LogicDie(config=preset("small"))
        wires = [n for d, n, v in component_ports(die)]
        die = None
    assert sorted(ports) == sorted(wires + ["clk", "rst"])


def _run(capsys, *argv):
    code = cli.main(["verilog", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_shows_every_class_with_counts(capsys):
    code, out, _err = _run(capsys, "--list")
    assert code == 0
    walk = _walk("small")
    for cls, entries in walk.items():
        assert cls in out
    assert "tag_width=38" in out and "first=2" in out
    row = next(line for line in out.splitlines() if "Fp32Converter" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:4] == ["vpu", "Fp32Converter", "-", "64"], cells


def test_export_to_a_file_with_its_header(capsys, tmp_path):
    out_file = tmp_path / "ring.v"
    code, out, _err = _run(capsys, "ringstation", "--instance", "2", "-o", str(out_file))
    assert code == 0
    text = out_file.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("// elmoe3d ") and "elmoe3d verilog" in lines[0]
    assert "top module elmoe3d_ring_station_2_small: RingStation (block ring)" in lines[1]
    assert '"first": 2' in lines[1]
    assert lines[2].startswith("// configuration small: {") and '"pes": 4' in lines[2]
    assert lines[3] == "// form: hierarchical (one module per distinct block instance)"
    assert module_ports(text, "elmoe3d_ring_station_2_small")
    assert f"wrote {out_file}:" in out and "2 modules" in out


def test_flat_to_standard_output(capsys):
    code, out, err = _run(capsys, "tensortile", "--flat", "--name", "my_tile")
    assert code == 0
    assert out.startswith("// elmoe3d ") and "// form: flat\n" in out
    assert re.search(r"^module my_tile\(", out, re.M)
    assert "wrote standard output" in err and out.count("\nmodule ") >= 1


@pytest.mark.parametrize("argv,message", [
    (["foo"], "BLOCK: no block or top Component class 'foo'"),
    (["vpu"], "BLOCK vpu: block vpu has the classes CombineUnit, Fp32Converter, RequantUnit, "
              "RowMaxExponent, SwiGLUUnit; name one"),
    (["SwiGLUUnit"], "BLOCK SwiGLUUnit: 2 distinct instances of SwiGLUUnit; --instance N picks "
                     "one: 1 (tag_width=38); 2 (tag_width=0)"),
    (["ringstation", "--instance", "3"], "--instance (of 2 distinct RingStation instances): "
                                         "expected an integer in 1..2, got 3"),
    (["bridge"], "BLOCK bridge: the die at this configuration builds no instance of block "
                 "bridge"),
    (["pe", "--name", "9x"], "--name 9x: expected a Verilog identifier"),
    (["pe", "--name", "module"], "--name module: a Verilog or SystemVerilog keyword"),
    (["ringstation", "--instance", "1", "--flat", "--name", "logic"],
     "--name logic: a Verilog or SystemVerilog keyword"),
    (["pe", "--name", "elmoe3d_PE_0123456789"], "the form of the export's child module names"),
    (["pe", "--config", "big"], "--config: unknown configuration 'big'"),
    (["pe", "--list"], "--list: takes no BLOCK"),
    (["--list", "--instance", ""], "--list: takes no BLOCK"),
    ([], "BLOCK: expected a block or class to export"),
])
def test_mistakes_are_one_line(capsys, tmp_path, argv, message):
    out_file = tmp_path / "x.v"
    code, out, err = _run(capsys, *argv, "-o", str(out_file)) if "--list" not in argv \
        else _run(capsys, *argv)
    assert code == 2
    assert err.strip().splitlines() == [err.strip()] and message in err, err
    assert not out_file.exists() and list(tmp_path.iterdir()) == []


def test_a_failed_conversion_leaves_no_file(capsys, tmp_path, monkeypatch):
    """The file is written only when the Verilog is complete: a conversion that fails leaves
    neither the file nor a temporary one."""
    from elmoe3d.synth import export

    def broken(obj, **kwargs):
        del obj                 # the traceback pytest keeps holds no block (no warning later)
        raise MemoryError("out of memory")
    monkeypatch.setattr(export, "hierarchical_verilog", broken)
    out_file = tmp_path / "pe.v"
    with pytest.raises(MemoryError):
        cli.main(["verilog", "pe", "-o", str(out_file)])
    assert list(tmp_path.iterdir()) == []


def parent_and_child(*, clk_edge=None, zero_width=False) -> tuple:
    """Two small blocks, ``(Child, Parent)``: the child registers ``a + 1``; the parent
    passes its ports through it and, with ``clk_edge``, defines its own ``sync`` domain of
    that edge; with ``zero_width`` the child has a zero-width input ``z`` (no wire).
    Registered as blocks with ``monkeypatch.setattr(export, "block_classes", ...)``."""
    from amaranth.hdl import ClockDomain, Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    class Child(wiring.Component):
        def __init__(self):
            super().__init__({"a": In(4), "y": Out(4)} | ({"z": In(0)} if zero_width else {}))

        def elaborate(self, platform):
            m = Module()
            m.d.sync += self.y.eq(self.a + 1)
            return m

    class Parent(wiring.Component):
        a: In(4)
        y: Out(4)

        def elaborate(self, platform):
            m = Module()
            if clk_edge is not None:
                m.domains.sync = ClockDomain("sync", clk_edge=clk_edge)
            m.submodules.child = child = Child()
            m.d.comb += [child.a.eq(self.a), self.y.eq(child.y)]
            return m

    return Child, Parent


def test_a_block_with_its_own_clock_domain_and_children_is_refused(monkeypatch):
    """A parent that defines a clock domain (here a falling-edge one) would give its
    children, converted alone, a rising-edge domain: the hierarchical form refuses it, naming
    the block; the flat form keeps the edge."""
    from elmoe3d.synth import export
    child, parent = parent_and_child(clk_edge="neg")
    monkeypatch.setattr(export, "block_classes", lambda: (child, parent))
    with inspection():                         # the refused block is never converted
        with pytest.raises(export.ExportError, match=r"Parent \(top\) defines the clock "
                                                     r"domain\(s\) sync: .* export it flat"):
            export.hierarchical_verilog(parent(), name="top")
    assert "negedge" in export.flat_verilog(parent(), name="top")


def test_the_unit_pe_is_built_with_its_defaults(capsys):
    """The unit PE is no instance of the die (the tile builds its arithmetic from the unit
    PE's helpers) and takes no parameter: it is exported built with its defaults."""
    code, out, err = _run(capsys, "unit_pe", "-o", "-")
    assert code == 0
    assert "not on the die: built with its defaults" in err
    ports = module_ports(out, "elmoe3d_unit_pe_small")
    assert {"a", "nibble", "is_msb", "aug", "product"} <= set(ports)


def test_an_interrupt_leaves_no_file_and_no_warning(capsys, tmp_path, monkeypatch):
    """Ctrl-C during the conversion: "interrupted", exit 130, no file, and none of Amaranth's
    "created but never used" warnings for the blocks the walk built."""
    import gc
    import warnings
    from amaranth.hdl import UnusedElaboratable
    from elmoe3d.synth import export

    def interrupted(obj, **kwargs):
        obj.elaborate(None)
        raise KeyboardInterrupt
    monkeypatch.setattr(export, "hierarchical_verilog", interrupted)
    out_file = tmp_path / "pe.v"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli.main(["verilog", "pe", "-o", str(out_file)])
        gc.collect()
    assert code == 130 and "elmoe3d verilog: interrupted" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert not [str(w.message) for w in caught if issubclass(w.category, UnusedElaboratable)]


def test_plain_module_names_keeps_names_apart():
    """Escaped module names become plain identifiers in headers and instantiations, a name
    already taken gets a suffix, and a name that is another's prefix is replaced whole."""
    from elmoe3d.synth.export import plain_module_names
    text = ("module top(a);\n  \\top.x  x (.a(a));\n  \\top.x.y  y (.a(a));\n"
            "  top_x  z (.a(\\top.x.sig ));\nendmodule\n"
            "module \\top.x (a);\nendmodule\nmodule \\top.x.y (a);\nendmodule\n"
            "module top_x(a);\nendmodule\n")
    out = plain_module_names(text)
    assert re.findall(r"^module (\S+?)\s*\(", out, re.M) == ["top", "top_x_2", "top_x_y",
                                                              "top_x"]
    assert "  top_x_2  x (" in out and "  top_x_y  y (" in out and "  top_x  z (" in out
    assert "\\top.x.sig " in out                    # a signal's escaped name is kept

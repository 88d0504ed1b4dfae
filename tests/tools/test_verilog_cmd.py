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
    (["pe", "--config", "big"], "--config big: unknown configuration; expected one of"),
    (["pe", "--list"], "--list: takes no BLOCK"),
    (["--list", "--instance", ""], "--list: takes no BLOCK"),
    ([], "BLOCK: expected a block or class to export"),
    (["pe", "--memories", "m.json"], "--memories: needs --sram macro"),
    (["pe", "--sram-models", "models.v"], "--sram-models: needs --sram macro"),
    (["--list", "--sram", "macro"], "--list: takes no BLOCK"),
    (["pe", "--io-delay", "0.2"], "--io-delay: needs --sdc"),
    (["pe", "--sdc", "pe.sdc", "--io-delay", "1"], "--io-delay: expected a fraction of the "
     "clock period, 0 <= FRACTION < 1, got 1"),
    (["pe", "--sdc", "pe.sdc", "--io-delay", "-0.1"], "got -0.1"),
    (["pe", "--sdc", "pe.sdc", "--io-delay", "nan"], "got nan"),
    (["--list", "--io-delay", "0.2"], "--list: takes no BLOCK"),
    (["pe", "--sram", "macro", "--name", "elmoe3d_sram_512x32_1r1w_nrw"],
     "the form of the export's SRAM macro module names"),
    (["unit_pe", "--sdc", "unit.sdc"], "top module elmoe3d_unit_pe_small has no clock port"),
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


@pytest.mark.parametrize("signal_name,code_said", [
    ("SIGINT", (130, "elmoe3d verilog: interrupted")),
    ("SIGTERM", (143, "elmoe3d verilog: terminated (SIGTERM)"))])
def test_an_interrupt_leaves_no_file_and_no_warning(capsys, tmp_path, monkeypatch,
                                                    signal_name, code_said):
    """Ctrl-C (or SIGTERM, raised as ``errors.Terminated``) during the conversion: the
    command says so with its exit status, no file, and none of Amaranth's "created but never
    used" warnings for the blocks the walk built."""
    import gc
    import warnings
    from amaranth.hdl import UnusedElaboratable
    from elmoe3d.errors import Terminated
    from elmoe3d.synth import export

    def interrupted(obj, **kwargs):
        obj.elaborate(None)
        raise KeyboardInterrupt if signal_name == "SIGINT" else Terminated
    monkeypatch.setattr(export, "hierarchical_verilog", interrupted)
    killed = []                 # main() ends by SIGTERM after the clean-up: not pytest here
    monkeypatch.setattr(cli.os, "kill", lambda pid, sig: killed.append(sig))
    out_file = tmp_path / "pe.v"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = cli.main(["verilog", "pe", "-o", str(out_file)])
        gc.collect()
    assert code == code_said[0] and code_said[1] in capsys.readouterr().err
    assert killed == ([] if signal_name == "SIGINT" else [15])
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


#: The memory zoo's RAMs: name -> (width, depth, read ports as (domain, transparent), write
#: granularity, collision free, struct-shaped words).
ZOO = {
    "a": (64, 64, (("sync", False), ("sync", True)), 8, False, False),
    "f": (64, 64, (("sync", True), ("sync", False)), 8, False, False),
    "b": (32, 128, (("sync", False),), None, True, True),
    "c": (32, 128, (("other", False),), None, False, True),
    "d": (40, 64, (("comb", False),), None, False, False),
    "g": (8, 256, (("sync", False),), None, False, False),
    "e": (8, 255, (("sync", False),), None, False, False),
}


def memory_zoo():
    """A block holding the RAMs of :data:`ZOO`, every port a signature member (random inputs
    reach every word): ``a`` and ``f`` 64 x 64 bits with two read ports, one transparent
    (the second in ``a``, the first in ``f``: two kinds of one base name), 8-bit write
    granules; ``b`` 128 words of a 32-bit struct, collision free (``no_rw_check``); ``c`` the
    same geometry in the domain ``other``, clocked on the falling edge of ``clk``; ``d`` 64 x
    40 bits read asynchronously (a register file, as the FIFOs read); ``g`` 256 x 8 bits, at
    :data:`~elmoe3d.synth.blocks.SRAM_MIN_BITS`; ``e`` 255 x 8 bits, a word below it (stays
    RTL)."""
    from amaranth.hdl import ClockDomain, ClockSignal, Module, unsigned
    from amaranth.lib import data, wiring
    from amaranth.lib.memory import Memory
    from amaranth.lib.wiring import In, Out

    entry = data.StructLayout({"tag": unsigned(12), "value": unsigned(20)})

    class MemoryZoo(wiring.Component):
        def __init__(self):
            members = {}
            for name, (width, depth, reads, gran, _free, _struct) in ZOO.items():
                a = (depth - 1).bit_length()
                members.update({f"{name}_waddr": In(a), f"{name}_wdata": In(width),
                                f"{name}_wen": In(width // gran if gran else 1)})
                for i, _read in enumerate(reads):
                    members.update({f"{name}_raddr{i}": In(a), f"{name}_ren{i}": In(1),
                                    f"{name}_rdata{i}": Out(width)})
            super().__init__(members)

        def elaborate(self, platform):
            m = Module()
            m.domains.other = ClockDomain("other", reset_less=True)
            m.d.comb += ClockSignal("other").eq(~ClockSignal("sync"))
            for name, (width, depth, reads, gran, free, struct) in ZOO.items():
                m.submodules[name] = mem = Memory(
                    shape=entry if struct else unsigned(width), depth=depth, init=[],
                    attrs={"no_rw_check": 1} if free else None)
                wp = mem.write_port(domain=reads[0][0] if reads[0][0] != "comb" else "sync",
                                    granularity=gran)
                m.d.comb += [wp.addr.eq(getattr(self, f"{name}_waddr")),
                             wp.data.eq(getattr(self, f"{name}_wdata")),
                             wp.en.eq(getattr(self, f"{name}_wen"))]
                for i, (domain, transparent) in enumerate(reads):
                    rp = mem.read_port(domain=domain, transparent_for=(wp,) if transparent
                                       else ())
                    m.d.comb += [rp.addr.eq(getattr(self, f"{name}_raddr{i}")),
                                 getattr(self, f"{name}_rdata{i}").eq(rp.data)]
                    if domain != "comb":
                        m.d.comb += rp.en.eq(getattr(self, f"{name}_ren{i}"))
            return m

    return MemoryZoo


def test_sram_macro_kinds():
    """The macro form makes every zoo RAM of at least 2,048 bits a macro instance, each kind
    named by geometry and ports (``a`` and ``f`` one base name: ``_2``), and leaves ``e``, a
    word short, Amaranth's; the memory list gives each kind's ports, clocks,
    read-during-write behaviour and instance path."""
    from elmoe3d.synth.export import SramMacro, flat_verilog, memory_list
    kinds = {}
    with inspection():
        text = flat_verilog(memory_zoo()(), name="zoo", srams=kinds)
    assert list(kinds.values()) == [
        "elmoe3d_sram_64x64_2r1w_g8_wt", "elmoe3d_sram_64x64_2r1w_g8_wt_2",
        "elmoe3d_sram_32x128_1r1w_nrw", "elmoe3d_sram_32x128_1r1w_other",
        "elmoe3d_sram_40x64_1r1w_ar", "elmoe3d_sram_8x256_1r1w"]
    assert list(kinds)[0] == SramMacro(width=64, depth=64, read_ports=(("sync", ()),
                                                                       ("sync", (0,))),
                                       write_ports=(("sync", 8),), collision_free=False)
    arrays = re.findall(r"^\s*reg \[(\d+):0\] \S+ \[(\d+):0\];", text, re.M)
    assert arrays == [("7", "254")]                             # e stays a memory
    listed = memory_list(text, "zoo", kinds)
    a, f, b, c, d, g = listed["macros"]
    assert [m["instances"] for m in listed["macros"]] == [["a"], ["f"], ["b"], ["c"], ["d"],
                                                         ["g"]]
    assert a["read_during_write"] == "per port" and b["read_during_write"] == "never happens"
    assert c["read_during_write"] == "old data" and c["read_ports"][0]["clock"] == "other_clk"
    assert a["read_ports"][1]["transparent_for"] == ["wr0"] and a["read_ports"][0][
        "transparent_for"] == []
    assert a["write_ports"] == [{"name": "wr0", "clock": "clk", "granularity": 8,
                                 "enable_bits": 8}]
    assert d["read_ports"] == [{"name": "rd0", "clock": None, "enable": None,
                                "read_latency_cycles": 0, "transparent_for": []}]
    assert listed["total_bits"] == 2 * 64 * 64 + 2 * 32 * 128 + 40 * 64 + 8 * 256
    assert listed["total_instances"] == 6


def test_memory_list_paths_go_down_the_hierarchy():
    """Macro instance paths run from the top module through every instance on the way: the
    small die's HB controllers' read FIFO storage, ``hb_ctrl0/rfifo/storage`` ...; and an
    escaped instance name is read without its backslash."""
    from elmoe3d.synth import export
    kinds = {}
    with inspection():
        found = export.die_blocks(LogicDie(config=preset("small")))
        text = hierarchical_verilog(found[next(iter(found))].obj, name="die", srams=kinds)
        found.clear()
    listed = export.memory_list(text, "die", kinds)["macros"]
    paths = {p for m in listed for p in m["instances"]}
    assert {f"hb_ctrl{i}/rfifo/storage" for i in range(4)} <= paths
    assert {f"pe{i}/hbuf" for i in range(4)} <= paths and len(paths) == 90
    snippet = ("module t(a);\n  x \\m$3  (\n    .a(a)\n  );\n  y  n (\n  );\nendmodule\n")
    assert export.instance_tree(snippet) == {"t": [("x", "m$3"), ("y", "n")]}


def test_a_ram_with_initial_contents_is_refused_in_the_macro_form():
    """A RAM with non-zero initial contents: an SRAM macro has none, so the macro form
    refuses it, naming where the RAM was made; a zero-initialised one passes."""
    from amaranth.hdl import Module
    from amaranth.lib import wiring
    from amaranth.lib.memory import Memory
    from amaranth.lib.wiring import In, Out
    from elmoe3d.synth.export import ExportError, flat_verilog

    def block(init):
        class Rom(wiring.Component):
            addr: In(6)
            data: Out(64)

            def elaborate(self, platform):
                m = Module()
                m.submodules.mem = mem = Memory(shape=64, depth=64, init=init)
                mem.write_port()
                rp = mem.read_port()
                m.d.comb += [rp.addr.eq(self.addr), self.data.eq(rp.data)]
                return m
        return Rom()

    with inspection():
        assert "elmoe3d_sram_64x64_1r1w" in flat_verilog(block([0, 0]), name="t", srams={})
        with pytest.raises(ExportError, match=r"64 x 64-bit RAM made at .*test_verilog_cmd\.py:"
                                              r"\d+ has initial contents"):
            flat_verilog(block([0, 5]), name="t", srams={})


def test_power_up_contents_are_one_random_word_each():
    """``power_up``: every word of a model's initial contents drawn anew (not one word
    repeated), the same for the same seed; ``None``: zeros."""
    from elmoe3d.synth.export import SramMacro, sram_models
    macro = SramMacro(width=16, depth=64, read_ports=(("sync", ()),),
                      write_ports=(("sync", None),), collision_free=False)
    words = re.findall(r"mem\[\d+\] = 16'h([0-9a-f]+);", sram_models({macro: "m"},
                                                                        power_up=3))
    assert len(words) == 64 and len(set(words)) > 60
    assert words == re.findall(r"mem\[\d+\] = 16'h([0-9a-f]+);",
                               sram_models({macro: "m"}, power_up=3))
    assert set(re.findall(r"mem\[\d+\] = 16'h([0-9a-f]+);",
                          sram_models({macro: "m"}))) == {"0000"}


def test_macro_model_ports_and_clock_domains():
    """A macro's behavioural model has the ports the macro instance connects: one clock a
    domain (``clk``, ``<domain>_clk``), no reset, and each data port at its width."""
    from amaranth.back import verilog
    from elmoe3d.synth.export import SramMacro, SramModel
    macro = SramMacro(width=16, depth=256, read_ports=(("fast", ()),),
                      write_ports=(("sync", 4),), collision_free=False)
    assert macro.base_name == "elmoe3d_sram_16x256_1r1w_g4_fast"
    model = SramModel(macro)
    text = verilog.convert(model, name="m", emit_src=False, ports=model.convert_ports())
    ports = module_ports(text, "m")
    assert sorted(ports) == ["clk", "fast_clk", "rd0_addr", "rd0_data", "rd0_en", "wr0_addr",
                             "wr0_data", "wr0_en"]
    assert re.search(r"input \[3:0\] wr0_en;", text) and re.search(r"input \[7:0\] rd0_addr;",
                                                                     text)


def test_memory_list_agrees_with_the_area_rollup():
    """Two routes to the small PE's SRAMs: the macro export's memory list (conversion, then
    the Verilog's instances) and the area roll-up's inventory of the PE (its elaboration):
    the same RAMs, names, geometries and ASAP7 areas."""
    from elmoe3d.hw.pe import PE
    from elmoe3d.synth.blocks import inventory
    from elmoe3d.synth.export import memory_list
    from elmoe3d.synth.sram import sram_area
    kinds = {}
    with inspection():
        pe = PE(config=preset("small"))
        text = hierarchical_verilog(pe, name="pe", srams=kinds)
        srams = inventory(PE(config=preset("small")), owner="PE")[1]
        pe = None
    listed = memory_list(text, "pe", kinds)
    exported = sorted((path, m["width"], m["depth"], m["area_um2_each"]) for m in listed["macros"]
                      for path in m["instances"])
    rolled = sorted((s.name, s.width, s.depth,
                     round(sram_area(s.width, s.depth, s.read_ports).area, 3)) for s in srams)
    assert exported == rolled and len(rolled) == 12


def test_macro_export_writes_its_three_files(capsys, tmp_path):
    """``--sram macro --sram-models --memories``: the design with macro instances and no
    model, the models apart, the memory list; the summary names each kind. Then one file
    given to two options (the same path, another spelling, through a symbolic link) is
    refused, nothing written."""
    import json
    out, models, listed = (tmp_path / n for n in ("pe.v", "models.v", "srams.json"))
    code, said, _err = _run(capsys, "pe", "--sram", "macro", "-o", str(out), "--sram-models",
                            str(models), "--memories", str(listed))
    assert code == 0
    text, model_text, doc = out.read_text(), models.read_text(), json.loads(listed.read_text())
    kinds = [m["module"] for m in doc["macros"]]
    assert len(kinds) == 7 and doc["total_instances"] == 12 and doc["configuration"] == "small"
    assert sorted(re.findall(r"^module (elmoe3d_sram_\w+)\(", model_text, re.M)) == sorted(kinds)
    # one (* top *) attribute, on the top: Yosys's -auto-top finds it; none on the models
    assert re.findall(r"^\(\* top =\s*1\s*\*\)\n(?:\(\*.*\*\)\n)*module (\w+)", text, re.M) \
        == ["elmoe3d_pe_small"] and "(* top" not in model_text
    assert model_text.startswith("// elmoe3d verilog: behavioural models of the SRAM macros")
    assert doc["generated_by"].startswith("elmoe3d ") and doc["verilog"] == str(out)
    assert doc["sram_models"] == str(models) and doc["sram_liberty"] is None
    assert "\n" not in doc["generated_by"]
    assert doc["macros"][0]["ports"] == {"clk": ["input", 1], "rd0_addr": ["input", 5],
                                         "rd0_data": ["output", 512], "rd0_en": ["input", 1],
                                         "wr0_addr": ["input", 5], "wr0_en": ["input", 1],
                                         "wr0_data": ["input", 512]}
    assert not re.search(r"^module elmoe3d_sram_", text, re.M)
    assert all(re.search(rf"^  {k} \w+ \($", text, re.M) for k in kinds)
    assert text.splitlines()[3].endswith(f"SRAM macros: 7 kinds, 12 instances, behavioural "
                                         f"models in {models}")
    assert "SRAM macros: 7 kinds, 12 instances, 335,872 bits" in said
    assert "elmoe3d_sram_512x8_2r1w_g32_wt: 1 x 8 words of 512 bits, 2 read / 1 write" in said
    for f in (out, models, listed):
        f.unlink()
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "sub")
    for other in (str(out), str(tmp_path / "." / "pe.v")):
        code, _said, err = _run(capsys, "pe", "--sram", "macro", "-o", str(out),
                                "--memories", other)
        assert code == 2 and f"-o and --memories name the same file {out}" in err
    code, _said, err = _run(capsys, "pe", "-o", str(tmp_path / "link" / "pe.v"), "--sdc",
                            str(tmp_path / "sub" / "pe.v"))
    assert code == 2 and "-o and --sdc name the same file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "sub"]
    assert not any((tmp_path / "sub").iterdir())


def test_sdc_clocks_the_top_module_at_the_configuration_clock(capsys, tmp_path):
    """``--sdc``: one ``create_clock`` on the top module's clock port at the configuration's
    logic clock, beside the Verilog that has that port; another clock gives another period,
    another domain's clock port its own clock."""
    from elmoe3d.synth.export import sdc
    out, constraints = tmp_path / "rs.v", tmp_path / "rs.sdc"
    code, said, _err = _run(capsys, "ringstation", "--instance", "1", "-o", str(out),
                            "--sdc", str(constraints))
    assert code == 0 and f"wrote --sdc {constraints}" in said
    lines = constraints.read_text().splitlines()
    assert lines[0].startswith("# elmoe3d verilog: RingStation (block ring) at small")
    assert [ln for ln in lines if not ln.startswith("#")] == [
        "set_units -time ps", "create_clock -name clk -period 1000.0 [get_ports {clk}]"]
    assert "clk" in module_ports(out.read_text(), "elmoe3d_ring_station_1_small")
    assert "-period 800.0 [get_ports {clk}]" in sdc(top="t", ports=["clk", "a"],
                                                    clock_ghz=1.25)
    assert "-period 1000.0 [get_ports {fast_clk}]" in sdc(top="t", ports=["fast_clk", "rst"],
                                                          clock_ghz=1.0)
    # in ns, for a library in ns: the figures and the unit line both
    ns = sdc(top="t", ports=["clk"], clock_ghz=1.25, unit="ns")
    assert "set_units -time ns\ncreate_clock -name clk -period 0.8000 [get_ports {clk}]" in ns
    code, _said, _err = _run(capsys, "ringstation", "--instance", "1", "-o", str(out),
                             "--sdc", str(constraints), "--sdc-unit", "ns")
    assert code == 0 and "-period 1.0000 [get_ports {clk}]" in constraints.read_text()
    code, _said, err = _run(capsys, "ringstation", "--instance", "1", "--sdc-unit", "ns")
    assert code == 2 and "--sdc-unit: needs --sdc" in err
    with pytest.raises(ValueError, match="t: no clock port"):
        sdc(top="t", ports=["a", "rst"], clock_ghz=1.0)
    with pytest.raises(ValueError, match="unit: expected one of ps, ns, got 'us'"):
        sdc(top="t", ports=["clk"], clock_ghz=1.0, unit="us")


def test_io_delay_on_a_top_with_two_clocks_is_one_line(capsys, tmp_path, monkeypatch):
    """The command wraps ``sdc``'s refusal of a top with two clock ports (no die block has
    one: ``sdc`` stands in) into one line naming ``--io-delay``, nothing written."""
    from elmoe3d.synth import export

    def two_clocks(*, top, ports, clock_ghz, comment="", io_delay=None, unit="ps"):
        raise ValueError(f"{top}: 2 clock ports (clk, fast_clk): the I/O delays need one "
                         f"clock")
    monkeypatch.setattr(export, "sdc", two_clocks)
    code, _out, err = _run(capsys, "ringstation", "--instance", "1", "-o",
                           str(tmp_path / "r.v"), "--sdc", str(tmp_path / "r.sdc"),
                           "--io-delay", "0.2")
    assert code == 2 and err.strip() == (
        "elmoe3d verilog: error: --io-delay: elmoe3d_ring_station_1_small: 2 clock ports "
        "(clk, fast_clk): the I/O delays need one clock")
    assert list(tmp_path.iterdir()) == []


def test_sdc_io_delays_on_every_other_port(capsys, tmp_path):
    """``--sdc --io-delay F``: beside the clock, a ``set_input_delay`` on every input but the
    clock (the reset too) and a ``set_output_delay`` on every output, F x the period against
    the clock, a bus as ``name[*]``: one line a port of the exported top, by the Verilog's
    own declarations. A top with two clocks is refused (the ports' domains are unknown)."""
    from elmoe3d.sim.runner import port_directions
    from elmoe3d.synth.export import sdc
    out, constraints = tmp_path / "rs.v", tmp_path / "rs.sdc"
    code, _said, _err = _run(capsys, "ringstation", "--instance", "1", "-o", str(out),
                             "--sdc", str(constraints), "--io-delay", "0.25")
    assert code == 0
    top = "elmoe3d_ring_station_1_small"
    ports = port_directions(out.read_text(), top)
    assert ports["clk"] == ("input", 1) and ports["ring_i__payload"] == ("input", 1035)
    assert ports["ext__0__payload"] == ("output", 512)
    lines = [ln for ln in constraints.read_text().splitlines() if not ln.startswith("#")]
    assert lines[:2] == ["set_units -time ps",
                         "create_clock -name clk -period 1000.0 [get_ports {clk}]"]
    want = {f"set_{d}_delay -clock clk 250.0 [get_ports {{{n}[*]}}]" if w > 1 else
            f"set_{d}_delay -clock clk 250.0 [get_ports {{{n}}}]"
            for n, (d, w) in ports.items() if n != "clk"}
    assert set(lines[2:]) == want and len(lines) == len(ports) + 1
    assert "set_input_delay -clock clk 250.0 [get_ports {rst}]" in want
    assert "set_output_delay -clock clk 250.0 [get_ports {ring_o__payload[*]}]" in want
    assert "set_input_delay -clock clk 250.0 [get_ports {ring_i__valid}]" in want
    assert "inputs arrive and outputs are required 0.25 x the period (250.0 ps)" \
        in constraints.read_text()
    two = {"clk": ("input", 1), "fast_clk": ("input", 1), "a": ("input", 4)}
    with pytest.raises(ValueError, match="t: 2 clock ports \\(clk, fast_clk\\)"):
        sdc(top="t", ports=two, clock_ghz=1.0, io_delay=0.2)
    assert "_delay" not in sdc(top="t", ports=two, clock_ghz=1.0)
    assert "160.0 [get_ports {a[*]}]" in sdc(top="t", ports={"clk": ("input", 1),
                                                           "a": ("output", 4)},
                                             clock_ghz=1.25, io_delay=0.2)
    assert "0.1600 [get_ports {a[*]}]" in sdc(top="t", ports={"clk": ("input", 1),
                                                            "a": ("output", 4)},
                                              clock_ghz=1.25, io_delay=0.2, unit="ns")
    with pytest.raises(ValueError, match="the I/O delays need each port's direction"):
        sdc(top="t", ports=["clk", "a"], clock_ghz=1.0, io_delay=0.2)
    assert "-clock clk 0.0 [get_ports {a}]" in sdc(top="t", ports={"clk": ("input", 1),
                                                                     "a": ("input", 1)},
                                                     clock_ghz=1.0, io_delay=-0.0)
    with pytest.raises(ValueError, match="port\\(s\\) b"):
        port_directions("module m(a, b);\n  input a;\nendmodule\n", "m")


def test_split_writes_a_file_a_module_and_a_filelist(capsys, tmp_path, monkeypatch):
    """``--split DIR``: the export of ``-o`` cut into one file a module (the SRAM models' too,
    each file opened by its part's header comments) and ``files.f``, the top last; Verilator
    lints it through ``-F`` from another folder. ``--split`` with ``-o``, at a file, at ``-``,
    or with another output on one of its files, is refused, nothing written."""
    import json
    import subprocess
    from elmoe3d.sim.runner import split_modules, verilator_environment
    one, folder, listed = tmp_path / "pe.v", tmp_path / "split", tmp_path / "srams.json"
    assert _run(capsys, "pe", "--sram", "macro", "-o", str(one))[0] == 0
    code, said, _err = _run(capsys, "pe", "--sram", "macro", "--split", str(folder),
                            "--memories", str(listed))
    assert code == 0
    head, modules = split_modules(one.read_text())
    mark, *names = (folder / "files.f").read_text().splitlines()
    assert mark == "// elmoe3d verilog --split, top module elmoe3d_pe_small"
    assert sorted(names) == sorted(f"{m}.v" for m in modules) == \
        sorted(p.name for p in folder.iterdir() if p.name != "files.f")
    assert names[-1] == "elmoe3d_pe_small.v" and len(names) == len(modules) > 12
    assert f"wrote {folder}: {len(names)} files, one a module, and files.f" in " ".join(
        said.split())
    models_head = "// elmoe3d verilog: behavioural models of the SRAM macros"

    def stripped(v):            # a module without the comment lines between modules
        return re.sub(r"^(//|/\*).*\n", "", v, flags=re.M).strip()
    split_head = head.replace("behavioural models after the design",
                              f"behavioural models in {folder}, a file each")
    assert split_head != head
    for m, body in modules.items():
        text = (folder / f"{m}.v").read_text()
        assert text.startswith(models_head if m.startswith("elmoe3d_sram_") else split_head)
        (got,) = split_modules(text)[1].values()
        assert stripped(got) == stripped(body)
    assert json.loads(listed.read_text())["verilog"] == str(folder / "files.f")
    monkeypatch.chdir(tmp_path.parent)
    with verilator_environment():
        lint = subprocess.run(["verilator", "--lint-only", "-Wno-lint", "-Wno-style", "-F",
                               str(folder / "files.f"), "--top-module", "elmoe3d_pe_small"],
                              capture_output=True, text=True)
    assert lint.returncode == 0, lint.stderr[-2000:]
    # the models in their own file: files.f names it (relative), first; an export of
    # another block into the same folder removes the modules the last one listed, keeps the
    # rest of the folder, and lints alone
    (folder / "notes.txt").write_text("mine")
    models = tmp_path / "models" / "m.v"
    models.parent.mkdir()
    code, said, _err = _run(capsys, "ringstation", "--instance", "1", "--sram", "macro",
                            "--split", str(folder), "--sram-models", str(models))
    assert code == 0
    names = (folder / "files.f").read_text().splitlines()[1:]
    assert names[0] == "../models/m.v" and names[-1] == "elmoe3d_ring_station_1_small.v"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["files.f", "notes.txt"] + names[1:])
    assert f"the last export's {len(modules)} other module files removed" in " ".join(
        said.split())
    with verilator_environment():
        lint = subprocess.run(["verilator", "--lint-only", "-Wno-lint", "-Wno-style", "-F",
                               str(folder / "files.f"), "--top-module",
                               "elmoe3d_ring_station_1_small"], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stderr[-2000:]
    # the models file inside the folder is listed, and not taken for a stale module
    code, _said, _err = _run(capsys, "ringstation", "--instance", "1", "--sram", "macro",
                             "--split", str(folder), "--sram-models", str(folder / "m.v"))
    assert code == 0 and (folder / "m.v").is_file()
    assert (folder / "files.f").read_text().splitlines()[1] == "m.v"
    code, _said, _err = _run(capsys, "ringstation", "--instance", "1", "--sram", "macro",
                             "--split", str(folder), "--sram-models", str(folder / "m.v"))
    assert code == 0 and (folder / "m.v").is_file()
    # the other outputs inside a new --split folder, the Liberty view in a subfolder of it
    fresh = tmp_path / "fresh"
    code, said, _err = _run(capsys, "ringstation", "--instance", "1", "--sram", "macro",
                            "--split", str(fresh), "--sdc", str(fresh / "r.sdc"),
                            "--sram-liberty", str(fresh / "lib" / "srams.lib"))
    assert code == 0 and (fresh / "r.sdc").is_file() and (fresh / "lib" / "srams.lib").is_file()
    assert "1 x 2 words of 1035 bits" in said
    # a user's own files are never removed: a files.f elmoe3d did not write, or a file of
    # a marked one whose first line is not an export's header
    mine = tmp_path / "proj"
    mine.mkdir()
    (mine / "files.f").write_text("cpu.v\nalu.v\n")
    (mine / "cpu.v").write_text("module cpu; endmodule\n")
    (mine / "alu.v").write_text("module alu; endmodule\n")
    assert _run(capsys, "ringstation", "--instance", "1", "--split", str(mine))[0] == 0
    assert (mine / "cpu.v").is_file() and (mine / "alu.v").is_file()
    with open(mine / "files.f", "a") as f:
        f.write("cpu.v\n")                          # a user adds a file to the export's list
    code, said, _err = _run(capsys, "ringstation", "--instance", "2", "--split", str(mine))
    assert code == 0 and (mine / "cpu.v").is_file()
    assert not (mine / "elmoe3d_ring_station_1_small.v").exists()   # the last export's
    assert "the last export's 3 other module files removed" in " ".join(said.split())
    # mistakes
    (tmp_path / "file").write_text("x")
    (tmp_path / "s3").mkdir()
    (tmp_path / "s4").mkdir()
    for argv, said_err in (
            (["--split", str(tmp_path / "s2"), "-o", str(tmp_path / "x.v")],
             "--split and -o exclude each other"),
            (["--split", str(tmp_path / "file")], f"--split {tmp_path / 'file'}: not a "
                                                   f"directory"),
            (["--split", str(tmp_path / "out.v")], f"--split {tmp_path / 'out.v'}: names a "
                                                    f"folder to write a file a module into"),
            (["--split", str(tmp_path / "q"), "--sdc", str(tmp_path / "q")],
             f"--sdc {tmp_path / 'q'}: is --split's folder"),
            (["--split", str(tmp_path / "q" / "sub"), "--sdc", str(tmp_path / "q")],
             f"--sdc {tmp_path / 'q'}: is --split's folder {tmp_path / 'q' / 'sub'} or holds "
             f"it"),
            (["--split", str(tmp_path / "s3"), "--sdc", str(tmp_path / "s3" / "files.f")],
             "name the same file")):
        code, _out, err = _run(capsys, "ringstation", "--instance", "1", *argv)
        assert code == 2 and said_err in err, err
    code, _out, err = _run(capsys, "ringstation", "--instance", "1", "--split",
                           str(tmp_path / "s4"), "--sdc",
                           str(tmp_path / "s4" / "elmoe3d_ring_station_1_small.v"))
    assert code == 2 and "name the same file" in err, err
    assert not any((tmp_path / n).exists() for n in ("s2", "x.v", "out.v", "q"))
    assert not any((tmp_path / "s3").iterdir()) and not any((tmp_path / "s4").iterdir())


def _liberty_cells(lib: str) -> dict:
    """``cell -> (attributes text, {pin: (kind, body)})`` of a Liberty text as
    :func:`~elmoe3d.synth.export.sram_liberty` writes it (one group a line or an indented
    block)."""
    cells = {}
    for name, body in re.findall(r"^  cell \((\w+)\) \{\n(.*?)^  \}$", lib, re.M | re.S):
        pins = {}
        for part in re.split(r"^(?=    (?:pin|bus) \()", body, flags=re.M)[1:]:
            kind, pin = re.match(r"    (pin|bus) \((\w+)\)", part).groups()
            pins[pin] = (kind, part)
        cells[name] = (body, pins)
    return cells


def test_sram_liberty_charges_each_access_its_energy():
    """``--sram-liberty``'s power: each clock pin a group for every non-empty set of the
    synchronous ports it clocks (``when`` their enables, the others negated; any bit of a
    granular write enable), a cycle charged the active ports' energies of the area roll-up's
    power model (``sram_access_pj``: per 64-bit bank spanned, a read 4400.4625 fJ, a write
    428.9955 fJ, the bank Liberty's figures as test_synth_power's
    test_sram_access_energy_by_hand_from_the_bank_liberty adds them up), half on each edge;
    an asynchronous read's address bits half a read a transition; no group on any other pin.
    The zoo's macros cover two read ports on one clock, granules, another domain's clock and
    a register file."""
    from elmoe3d.synth.export import flat_verilog, sram_liberty
    kinds = {}
    with inspection():
        flat_verilog(memory_zoo()(), name="zoo", srams=kinds)
    cells = _liberty_cells(sram_liberty(kinds))
    group = re.compile(r'internal_power \(\) \{ (?:when : "([^"]*)"; )?rise_power \(scalar\) '
                       r'\{ values \("([^"]+)"\); \} fall_power \(scalar\) \{ values '
                       r'\("([^"]+)"\); \} \}')
    seen_async = seen_two = seen_granules = False
    for macro, module in kinds.items():
        _body, pins = cells[module]
        banks = -(-macro.width // 64)                     # 64-bit banks, rounded up
        read, write = banks * 4400.4625, banks * 428.9955  # fJ
        for pin, (_kind, text) in pins.items():
            groups = group.findall(text)
            assert text.count("internal_power") == len(groups), (module, pin)
            assert all(r == f for _w, r, f in groups)          # half a cycle on each edge
            clocks = dict(macro.clock_ports)
            if pin in clocks.values():
                ports = [(f"rd{i}_en", read) for i, (d, _t) in enumerate(macro.read_ports)
                         if d != "comb" and clocks[d] == pin]
                for j, (d, _g) in enumerate(macro.write_ports):
                    if clocks[d] == pin:
                        bits = macro.enable_width(j)
                        seen_granules |= bits > 1
                        ports.append((f"wr{j}_en" if bits == 1 else "(" + " | ".join(
                            f"wr{j}_en[{b}]" for b in range(bits)) + ")", write))
                seen_two |= len(ports) > 2
                want = {}
                for mask in range(1, 1 << len(ports)):
                    when = " & ".join(en if mask >> k & 1 else f"!{en}"
                                      for k, (en, _e) in enumerate(ports))
                    want[when] = sum(e for k, (_en, e) in enumerate(ports) if mask >> k & 1)
                assert {w: float(r) * 2 for w, r, _f in groups} == pytest.approx(want, rel=2e-6)
            elif pin.endswith("_addr") and macro.read_ports[int(pin[2:].split("_")[0])][0] \
                    == "comb" and pin.startswith("rd"):
                seen_async = True
                assert [(w, float(r)) for w, r, _f in groups] == [("", pytest.approx(
                    read / 2, rel=1e-6))]
            else:
                assert groups == [], (module, pin)
    assert seen_async and seen_two and seen_granules


def test_sram_liberty_times_every_port_and_links_with_yosys(capsys, tmp_path):
    """``--sram-liberty``: a cell a macro kind with its area (the memory list's), every port
    of its model at its width, each input constrained (setup and hold) against its own port's
    clock (the zoo's falling-edge domain its ``other_clk``), each synchronous read's data a
    clock-to-data arc, an asynchronous read's a combinational arc from its address and a
    clock arc from the write's clock, its address unconstrained; the figures the published
    bank's. Yosys reads it as the macros' black boxes: ``hierarchy -check`` on the zoo and on
    the small PE links every instance with no port resized, and fails on a renamed pin."""
    import subprocess
    from elmoe3d.synth import sram
    from elmoe3d.synth.export import flat_verilog, memory_list, sram_liberty
    from elmoe3d.synth.flow import yosys_command
    kinds = {}
    with inspection():
        zoo = flat_verilog(memory_zoo()(), name="zoo", srams=kinds)
    lib = sram_liberty(kinds, comment="the zoo")
    cells = _liberty_cells(lib)
    assert list(cells) == list(kinds.values()) and lib.startswith("/*\n * the zoo\n")
    listed = {m["module"]: m for m in memory_list(zoo, "zoo", kinds)["macros"]}
    setup = f'setup_rising; rise_constraint (scalar) {{ values ("{sram.SETUP_PS:g}"); }}'
    hold = f'hold_rising; rise_constraint (scalar) {{ values ("{sram.HOLD_PS:g}"); }}'
    clock_arc = f'cell_fall (scalar) {{ values ("{sram.READ_CLK_TO_Q_PS:g}"); }}'
    for macro, module in kinds.items():
        body, pins = cells[module]
        assert f"area : {listed[module]['area_um2_each']:.3f};" in body
        clocks = dict(macro.clock_ports)
        assert {p: k for p, (k, _t) in pins.items()} == {
            **{c: "pin" for c in clocks.values()},
            **{n: "bus" if w > 1 else "pin" for _d, n, w in macro.data_ports()}}
        for direction, name, width in macro.data_ports():
            kind, text = pins[name]
            if width > 1:
                assert f"bus_type : elmoe3d_bus_{width};" in text
                assert re.search(rf"type \(elmoe3d_bus_{width}\) \{{.*bit_width : {width}; "
                                 rf"bit_from : {width - 1}; bit_to : 0;", lib)
            side, i = name[:2], int(name.split("_")[0][2:])
            domain = (macro.read_ports if side == "rd" else macro.write_ports)[i][0]
            related = set(re.findall(r'related_(?:bus_)?pins? : "(\w+)"; timing_type : (\w+)',
                                     text))
            if direction == "i":
                assert "direction : input;" in text
                want = set() if domain == "comb" else {(clocks[domain], "setup_rising"),
                                                       (clocks[domain], "hold_rising")}
                assert related == want, (module, name)
                if want:
                    assert setup in text and hold in text
            elif domain == "comb":
                assert related == {(f"rd{i}_addr", "combinational"), ("clk", "rising_edge")}
                # a bus to a bus: every address bit to every data bit, not bit to bit
                assert f'related_bus_pins : "rd{i}_addr"; timing_type : combinational' in text
            else:
                assert related == {(clocks[domain], "rising_edge")} and clock_arc in text
    assert cells["elmoe3d_sram_32x128_1r1w_other"][1]["rd0_addr"][1].count('"other_clk"') == 2

    def link(folder, lib_text, verilog, top):
        (folder / "srams.lib").write_text(lib_text)
        (folder / "design.v").write_text(verilog)
        (folder / "link.ys").write_text(f"read_liberty -lib srams.lib\nread_verilog design.v\n"
                                        f"hierarchy -check -top {top}\nstat\n")
        return subprocess.run([*yosys_command(), "-s", "link.ys"], cwd=folder,
                              capture_output=True, text=True)
    done = link(tmp_path, lib, zoo, "zoo")
    assert done.returncode == 0 and "Resizing" not in done.stdout, done.stdout[-3000:]
    # every macro kind a black-box cell of the top, once a kind (the zoo's RAMs one each)
    assert all(re.search(rf"^\s+1\s+{m}$", done.stdout, re.M) or
               re.search(rf"^\s+{m}\s+1$", done.stdout, re.M) for m in kinds.values()), \
        done.stdout[-3000:]
    bad = link(tmp_path, lib.replace("bus (rd0_data)", "bus (rd0_datum)", 1), zoo, "zoo")
    assert bad.returncode != 0 and "does not have a port named 'rd0_data'" in bad.stderr
    narrow = link(tmp_path, lib.replace("bit_width : 40; bit_from : 39;",
                                        "bit_width : 39; bit_from : 38;"), zoo, "zoo")
    assert "Resizing cell port zoo.d.rd0_data from 40 bits to 39 bits" in narrow.stdout
    # the command: the small PE's macros, with the design
    pe, liberty = tmp_path / "pe.v", tmp_path / "pe.lib"
    code, said, _err = _run(capsys, "pe", "--sram", "macro", "-o", str(pe), "--sram-models",
                            str(tmp_path / "m.v"), "--sram-liberty", str(liberty))
    assert code == 0 and f"wrote --sram-liberty {liberty}" in said
    pe_lib = liberty.read_text()
    assert len(_liberty_cells(pe_lib)) == 7 and "the SRAM macros of elmoe3d_pe_small" in pe_lib
    done = link(tmp_path, pe_lib, pe.read_text(), "elmoe3d_pe_small")
    assert done.returncode == 0 and "Resizing" not in done.stdout, done.stdout[-3000:]
    code, _said, err = _run(capsys, "pe", "--sram-liberty", str(tmp_path / "x.lib"))
    assert code == 2 and "--sram-liberty: needs --sram macro" in err

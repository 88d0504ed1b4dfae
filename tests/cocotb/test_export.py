"""The RTL export's two forms are one design: each block's hierarchical Verilog (one module per
distinct instance, :mod:`elmoe3d.synth.export`) against its flat Verilog in one Verilator
model, every output compared cycle by cycle on random inputs and resets
(:mod:`elmoe3d.sim.export_equivalence`), on the small configuration's blocks as the die builds them.
A hierarchy with two children's modules swapped is caught; a child too wide for an Amaranth
``Instance`` is converted inside its parent and still equal. The SRAM macro form: its models
equal the RTL memories (a model with another read-during-write is caught), and the
hierarchical PE with macros powered up at random runs the real-trace MoE layers bit-exact."""

import re

import pytest

from elmoe3d.config import preset
from elmoe3d.hw.checked import inspection
from elmoe3d.hw.die import LogicDie
from elmoe3d.sim.export_equivalence import run_export_bench
from elmoe3d.synth import export

from .test_ring import check_bench

pytestmark = pytest.mark.cocotb


def _bench(cls, *, label=None, cycles=2000, gate=None, check=True, instance=0):
    """Run the export bench on the small die's ``instance``-th distinct ``cls``; ``gate``
    (the block -> its hierarchical text) replaces the export's text."""
    with inspection():
        found = export.die_blocks(LogicDie(config=preset("small")))
        obj = [e.obj for e in found.values() if e.cls == cls][instance]
        found.clear()
        try:
            text = gate(obj) if gate is not None else None
            return run_export_bench(obj, label=label or cls, cycles=cycles, gate_text=text,
                                    check=check)
        finally:
            obj = None


def test_ring_hierarchy_equals_flat():
    """The streamline ring and its two stations (first = 0 and 2: two modules)."""
    records = check_bench(_bench("StreamlineRing"), ["test_export_equivalence"])
    assert records[0]["comparisons"] == 2000 * records[0]["outputs"] > 0


def test_a_miswired_hierarchy_is_caught():
    """The ring's two station modules swapped in the ring's module (each station then runs
    the other's parameters): the bench finds mismatches."""
    def swapped(ring):
        text = export.hierarchical_verilog(ring, name="gate")
        top = text.index("module gate(")
        names = sorted(set(re.findall(r"^\s+(elmoe3d_RingStation_\w+) \w+ \(", text[top:],
                                      re.M)))
        assert len(names) == 2
        a, b = names
        body = text[top:].replace(a, "SWAP_TOKEN").replace(b, a).replace("SWAP_TOKEN", b)
        return text[:top] + body
    result = _bench("StreamlineRing", label="ring_swapped", cycles=300, gate=swapped,
                    check=False)
    assert result.sim.failures == 1
    assert result.records[0]["mismatches"] > 0 and result.records[0]["first"]


def test_a_child_too_wide_for_an_instance_stays_in_its_parent(monkeypatch):
    """With the instance limit below a station's output bits, the stations are converted
    inside the ring's module (no station module) and the ring still equals its flat form."""
    monkeypatch.setattr(export, "INSTANCE_OUTPUT_BITS", 64)

    def inlined(ring):
        text = export.hierarchical_verilog(ring, name="gate")
        assert not re.search(r"^module elmoe3d_RingStation_", text, re.M)
        return text
    check_bench(_bench("StreamlineRing", label="ring_inlined", cycles=500, gate=inlined),
                ["test_export_equivalence"])


def test_ext_controller_hierarchy_equals_flat():
    """The EXT controller and its eight DRAM channel controllers on random requests
    (``make test-slow``: about a minute of Verilator build)."""
    records = check_bench(_bench("ExtController", cycles=1000), ["test_export_equivalence"])
    assert records[0]["comparisons"] == 1000 * records[0]["outputs"] > 0


#: The seed of the macro models' power-up contents in the PE and die benches.
POWER_UP = 7


def _hierarchical(block, top, srams=None):
    """``block``'s hierarchical Verilog with top module ``top`` (a bench's toplevel)."""
    with inspection():
        try:
            return export.hierarchical_verilog(block, name=top, srams=srams)
        finally:
            block = None


def test_hierarchical_pe_with_macros_runs_the_real_moe_layer_bit_exact():
    """Random inputs barely reach a PE's datapath (its commands are mostly refused), so the
    hierarchical PE (the tile and nine VPU unit modules) in the macro form (its 12 RAMs
    instances of 7 SRAM macro kinds, whose models power up with pseudo-random contents, as a
    real macro's are undefined) runs the PE bench's MoE layers routed by the real Mixtral
    trace, DRAFT and FULL, every output beat against the functional simulator and the golden
    ``ref_moe``, as ``make sim``'s flat PE does. So the hierarchy, the macro wiring and the
    models are right, and the PE does not depend on its RAMs' power-up contents."""
    from elmoe3d.hw.pe import PE
    from elmoe3d.sim.bench_pe import run_pe_bench
    from elmoe3d.sim.runner import build
    arch = preset("small")
    kinds = {}
    text = _hierarchical(PE(config=arch), "pe", srams=kinds)
    assert len(kinds) == 7
    built = build(text + export.sram_models(kinds, power_up=POWER_UP),
                  name="export_pe_hierarchical_macros", toplevel="pe")
    result = run_pe_bench(arch, tests="test_trace_moe/traffic=stalls", built=built,
                          params={"batches": [1, 4]})
    records = check_bench(result, ["test_trace_moe"])
    assert {(r["tokens"], r["mode"]) for r in records} == \
        {(1, "DRAFT"), (1, "FULL"), (4, "DRAFT"), (4, "FULL")}


@pytest.mark.parametrize("sram", ["rtl", "macro"])
def test_hierarchical_die_runs_draft_and_verify_bit_exact(sram):
    """The whole small die, hierarchical, runs the die bench's draft and verify MoE layers
    (real Mixtral routing, the bench's EXT channels) bit-exact against ``ref_moe`` and the
    multi-PE simulation (``make test-slow``: a few minutes of Verilator build); in the macro
    form its 90 RAMs of 17 kinds (the PEs', the FIFOs' and the command queues') are
    macro models powered up at random."""
    from elmoe3d.sim.bench_die import die_kwargs, run_die_bench
    from elmoe3d.sim.runner import build
    arch = preset("small")
    kinds = {} if sram == "macro" else None
    text = _hierarchical(LogicDie(config=arch, **die_kwargs({"die": None})), "die", kinds)
    if kinds is not None:
        assert len(kinds) == 17
        text += export.sram_models(kinds, power_up=POWER_UP)
    built = build(text, name=f"export_die_hierarchical_{sram}", toplevel="die")
    records = check_bench(run_die_bench(arch, tests="test_phases/traffic=smooth", built=built),
                          ["test_phases"])
    assert {r["phase"] for r in records} >= {"draft", "verify"}


def test_a_zero_width_port_is_no_wire(monkeypatch):
    """A child with a zero-width signature member (a ``tag_width=0``-like parameter):
    Amaranth lists it in the child module's ports, the parent's instance has no wire for it;
    the hierarchy converts and equals the flat form."""
    from ..tools.test_verilog_cmd import parent_and_child
    child, parent = parent_and_child(zero_width=True)
    monkeypatch.setattr(export, "block_classes", lambda: (child, parent))
    with inspection():
        check_bench(run_export_bench(parent(), label="zero_width", cycles=200),
                    ["test_export_equivalence"])


def _zoo_bench(*, label, mutate=None, mutate_text=None, cycles=2000):
    """The memory zoo (``tests/tools/test_verilog_cmd.py``) flat against its macro form
    (flat, each macro's behavioural model after it); ``mutate(kinds)`` changes the macros the
    models are built from, ``mutate_text(gate)`` the macro form's text (a test's breakage)."""
    from ..tools.test_verilog_cmd import memory_zoo
    zoo, kinds = memory_zoo(), {}
    broken = mutate is not None or mutate_text is not None
    with inspection():
        gate = export.flat_verilog(zoo(), name="gate", srams=kinds)
        if mutate_text is not None:
            gate = mutate_text(gate)
        models = kinds if mutate is None else mutate(kinds)
        return run_export_bench(zoo(), label=label, cycles=cycles, check=not broken,
                                gate_text=gate + export.sram_models(models))


def test_sram_macros_equal_the_rtl_memories():
    """The macro form of the memory zoo (six macro kinds: two read ports with either one
    transparent, 8-bit write granules, a struct-shaped word, collision free or not, a second
    clock domain on the falling edge, an asynchronous read, exactly 2,048 bits) against the
    RTL memories on random addresses, enables and data: every output equal each cycle."""
    records = check_bench(_zoo_bench(label="zoo_macros"), ["test_export_equivalence"])
    assert records[0]["comparisons"] == 2000 * records[0]["outputs"] > 0


def _old_data(kinds):
    """``a``'s macro with both read ports returning old data (the RTL's second port is
    transparent)."""
    import dataclasses
    return {dataclasses.replace(macro, read_ports=tuple((d, ()) for d, _t in macro.read_ports))
            if module == "elmoe3d_sram_64x64_2r1w_g8_wt" else macro: module
            for macro, module in kinds.items()}


def _sync_clock(gate):
    """Every macro clocked by ``clk`` (``c``'s instance takes the ``other`` domain's clock,
    the falling edge of ``clk``)."""
    text, n = re.subn(r"\.other_clk\([^)]*\)", ".other_clk(clk)", gate)
    assert n == 1
    return text


@pytest.mark.parametrize("label,mutate,mutate_text", [("zoo_old_data", _old_data, None),
                                                      ("zoo_sync_clock", None, _sync_clock)])
def test_a_broken_macro_form_is_caught(label, mutate, mutate_text):
    """A model with another read-during-write, or a macro wired to another clock: the bench
    finds mismatches."""
    result = _zoo_bench(label=label, mutate=mutate, mutate_text=mutate_text, cycles=500)
    assert result.sim.failures == 1
    assert result.records[0]["mismatches"] > 0 and result.records[0]["first"]

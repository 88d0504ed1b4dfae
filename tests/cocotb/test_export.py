"""The RTL export's two forms are one design: each block's hierarchical Verilog (one module per
distinct instance, :mod:`elmoe3d.synth.export`) against its flat Verilog in one Verilator
model, every output compared cycle by cycle on random inputs and resets
(:mod:`elmoe3d.sim.export_equivalence`), on the small configuration's blocks as the die builds them.
A hierarchy with two children's modules swapped is caught; a child too wide for an Amaranth
``Instance`` is converted inside its parent and still equal."""

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


@pytest.mark.parametrize("cls", ["ExtController", "PE", "LogicDie"])
def test_block_hierarchy_equals_flat(cls):
    """The EXT controller (eight DRAM channel controllers), the PE (tile and VPU units) and
    the whole small die (``make test-slow``: 1-2 minutes a block's Verilator build of both
    forms)."""
    records = check_bench(_bench(cls, cycles=1000), ["test_export_equivalence"])
    assert records[0]["comparisons"] == 1000 * records[0]["outputs"] > 0

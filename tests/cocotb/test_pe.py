"""cocotb + Verilator benches of the PE (``sim/bench_pe.py``), run through the one runner.

Whole MoE layers on the small PE, built by ``sw/golden/expert.py`` and routed by the real Mixtral
trace, checked inside the bench with plain equality against the functional simulator (every
``o`` beat, every STATUS counter) and the golden MoE layer ``ref_moe`` (FP32 bits, sticky
flags). These tests check that the comparisons really happened and covered what they should:
each case compared exactly the values its shape gives (:func:`values_compared`). The HB-rate
roofline cases run in exactly the cycles recorded in ``tests/host/test_pe_cycles.py``
(``RECORDED``, which the cycle model is checked against). The build of the PE is shared by
every test here (and across pytest-xdist workers).
"""

import pytest

from elmoe3d.config import preset
from elmoe3d.isa import FUNCTIONAL_STATUS_FIELDS
from elmoe3d.sim.bench_pe import run_pe_bench

from ..host.test_pe_cycles import RECORDED

pytestmark = pytest.mark.cocotb

ARCH = preset("small")


def values_compared(rec, arch=ARCH, *, whole_row_blocks=False):
    """The values ``PEBench.job_case`` (``sim/bench_pe.py``) compares in a case of one PE when
    every output came: each ``o`` beat against fsim (the OUTPUT's DATA beats, ``fp32_per_beat``
    FP32 values of the hidden channels each, of the token rows (``whole_row_blocks``: of whole
    row blocks of ``rows`` rows, the padding rows included, as the streamed expert builder
    writes them; the MoE builder writes the token rows only), and the program's one STATUS
    beat, at its end), that STATUS beat's functional counters, the decoded output (tokens x
    hidden FP32 values) against ``ref_moe``, and the two sticky flags."""
    pe = arch.pe
    tokens, hidden = rec["tokens"], rec["hidden"]
    rows = -(-tokens // pe.rows) * pe.rows if whole_row_blocks else tokens
    assert hidden % pe.fp32_per_beat == 0, rec
    data_beats = rows * hidden // pe.fp32_per_beat
    return data_beats + 1 + len(FUNCTIONAL_STATUS_FIELDS) + tokens * hidden + 2


def _check_one(result, test):
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0
    assert {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"} == {test}
    assert result.records and result.comparisons > 0 and result.mismatches == 0
    for rec in result.records:
        assert rec["mismatches"] == 0 and rec["comparisons"] == values_compared(rec), rec
    return result


def _check(result, *, tests):
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0
    ran = {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"}
    assert ran == set(tests), sim.testcases
    assert result.records, "the bench wrote no case records"
    assert result.comparisons > 0
    assert result.mismatches == 0
    for rec in result.records:
        assert rec["mismatches"] == 0, rec
        assert rec["comparisons"] == values_compared(rec), rec
    assert {r["traffic"] for r in result.records} == {"smooth", "stalls"}
    return result


def test_trace_driven_moe_layers():
    """Batches of 1, 4 and 16 Mixtral-routed tokens, DRAFT and FULL, I = 96 (three WMEM
    buffer-fulls of up/gate weights), with and without idle cycles and backpressure."""
    result = _check(run_pe_bench(ARCH, tests="test_trace_moe"), tests=["test_trace_moe"])
    seen = {(r["tokens"], r["mode"], r["traffic"]) for r in result.records}
    for traffic in ("smooth", "stalls"):
        for tokens in (1, 4, 16):
            for mode in ("DRAFT", "FULL"):
                assert (tokens, mode, traffic) in seen
    for rec in result.records:
        assert rec["source"] == "mixtral-trace" and "synthetic" in rec["note"]
        assert rec["intermediate"] == 96 and rec["gemm_beats"] > 0
    assert max(len(r["experts_run"]) for r in result.records) >= 4


def test_corner_cases():
    """All-zero token, SiLU-saturating gates (VPU flag), accumulator saturation (the sticky
    flag read back through STATUS)."""
    result = _check(run_pe_bench(ARCH, tests="test_corners"), tests=["test_corners"])
    cases = {r["case"] for r in result.records}
    assert cases == {"all-zero token", "SiLU-saturating gates", "accumulator saturation"}
    for rec in result.records:
        if rec["case"] == "accumulator saturation":
            assert rec["acc_overflow"] and rec["status"]["acc_overflow"] == 1
        if rec["case"] == "SiLU-saturating gates":
            assert rec["vpu_saturation"]
        if rec["case"] == "all-zero token":
            assert not rec["acc_overflow"]


#: The RTL cycles, ld words and commands recorded for ``test_hb_roofline``'s cases
#: (``tests/host/test_pe_cycles.py`` ``RECORDED``): (kind, tokens, mode) -> the three.
ROOFLINE_RECORDED = {(kind, tokens, mode): (rtl, ld_words, commands)
                     for bench, arch, kind, _, tokens, mode, rtl, ld_words, commands in RECORDED
                     if bench == "test_hb_roofline" and arch == ARCH.name}


def test_hb_rate_roofline():
    """MoE layers and single experts with the ld stream paced at the HB bank rate: bit-exact,
    and the cycle figures against the roofline (memory: all ld bytes at 51.2 B/cycle; compute:
    one tile beat per cycle) are recorded. The bound asserted is loose (a regression guard, not
    the target: tests never time anything). Each case's cycles, ld words and commands equal
    the RTL figures recorded in ``tests/host/test_pe_cycles.py`` (``RECORDED``), so that
    table, which the cycle model is checked against, is the live RTL's (cycles are simulated
    clock cycles, not time)."""
    result = _check_one(run_pe_bench(ARCH, tests="test_hb_roofline"), "test_hb_roofline")
    for rec in result.records:
        print(f"{rec['case']} {rec['mode']}: {rec['cycles']} cycles, "
              f"{100 * rec['roofline_fraction']:.1f}% of the {rec['roofline_bound']} roofline, "
              f"tile busy {100 * rec['beat_utilization']:.1f}%, "
              f"MACs {100 * rec['mac_utilization']:.1f}% of peak")
        assert 0.5 < rec["roofline_fraction"] <= 1.0
        # Exact, no slack: the cycle model's check allows a cycle for the bench's token bucket
        # (floating point) against its own exact arithmetic; this is the same bench and the
        # same bucket as the recorded run, and the program does not depend on the values.
        assert (rec["cycles"], rec["ld_words"], rec["commands"]) == \
            ROOFLINE_RECORDED[(rec["kind"], rec["tokens"], rec["mode"])], rec
        assert rec["roofline_cycles"] == max(rec["ld_bytes"] / ARCH.hb_bytes_per_cycle,
                                                rec["gemm_beats"])
    assert {r["roofline_bound"] for r in result.records} == {"memory", "compute"}
    assert {(r["kind"], r["tokens"], r["mode"]) for r in result.records} == {
        (k, t, m) for k in ("moe", "expert") for t in (1, 16) for m in ("DRAFT", "FULL")} \
        == set(ROOFLINE_RECORDED)
    assert max(len(r["experts_run"]) for r in result.records) >= 4

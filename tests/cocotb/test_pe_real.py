"""cocotb + Verilator bench of one expert of a real model's shape on the ``mid`` PE
(``sim/bench_pe.py::test_real_expert``): the streamed expert program (token tiles, K-chained
GEMMs, FULL as LSB_ONLY + MSB_ONLY chains) for the Qwen3-30B-A3B expert (H = 2048, I = 768:
one pass over up/gate), synthetic weights, one token, DRAFT and FULL, the ``ld`` stream paced
at the HB bank rate; every ``o`` beat against fsim and the output against ``ref_moe`` bit for
bit. ``make test-slow`` also runs every other row recorded for this bench (Qwen3-30B-A3B at 16
tokens, OLMoE-1B-7B, H = 2048, I = 1024, at 1 and 16; DRAFT and FULL).

The two-pass programs (h larger than HBUF: ``max_keep``, REQUANT chunk by chunk; DeepSeek-V2-Lite,
GLM-4.7-Flash, Qwen1.5-MoE-A2.7B, GPT-OSS-20B) run on this RTL in ``make bench`` figure 10 and,
at a small size, in the Amaranth tests (``tests/amaranth/test_pe.py``,
``test_two_pass_expert_equals_fsim``); ``make test`` keeps one real shape in FULL to stay within its
time budget.

Builds the ``mid`` PE (its own Verilator build, reused when unchanged). The cycles, ld words and
commands of each case equal the RTL figures recorded in ``tests/host/test_pe_cycles.py``
(``RECORDED``, which the cycle model is checked against), and the case compared exactly the
values its shape gives (``tests/cocotb/test_pe.py`` ``values_compared``); the roofline figures
are printed, not judged (``make bench`` reports them for more shapes and batches).
"""

import time

import pytest

from elmoe3d.config import preset
from elmoe3d.sim.bench_pe import build_pe, ld_rate_words, run_pe_bench

from ..host.test_pe_cycles import RECORDED
from .test_pe import values_compared

pytestmark = pytest.mark.cocotb

TEST = "test_real_expert"
#: preset name -> (H, I, passes over up/gate, ld pacing)
SHAPES = {"qwen3-30b-a3b": (2048, 768, 1, "hb"), "olmoe-1b-7b": (2048, 1024, 1, "hb")}
#: The RTL cycles, ld words and commands recorded for ``test_real_expert``'s cases at the HB
#: rate (``tests/host/test_pe_cycles.py`` ``RECORDED``): (model, tokens, mode) -> the three.
REAL_RECORDED = {(model, tokens, mode): (rtl, ld_words, commands)
                 for bench, arch, _, model, tokens, mode, rtl, ld_words, commands in RECORDED
                 if bench == "test_real_expert" and arch == "mid"}
#: The rows ``test_real_expert_mid`` runs (one a mode); ``test_real_expert_mid_recorded_rows``
#: runs every other recorded row.
FIRST_ROWS = {("qwen3-30b-a3b", 1, "FULL"), ("qwen3-30b-a3b", 1, "DRAFT")}


def _run_real(shape_tokens, modes):
    """Run ``test_real_expert`` on the ``mid`` PE for ``shape_tokens`` (preset name -> token
    counts) in ``modes`` at the HB rate; return the records, each checked against its shape,
    the values its shape gives and ``REAL_RECORDED`` exactly."""
    t0 = time.perf_counter()
    mid = preset("mid")
    built = build_pe(mid)
    assert {SHAPES[name][3] for name in shape_tokens} == {"hb"}  # RECORDED's rows: the HB rate
    result = run_pe_bench(mid, tests=TEST, built=built,
                          params={"real_shapes": list(shape_tokens),
                                  "real_shape_tokens": shape_tokens,
                                  "real_modes": list(modes), "real_ld_rate": "hb"})
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0
    assert {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"} == {TEST}
    assert result.records and result.comparisons > 0 and result.mismatches == 0
    records = result.records
    print(f"build and run: {time.perf_counter() - t0:.0f} s")
    for rec in records:
        print(f"{rec['case']} {rec['mode']} ({rec['passes']} pass(es), x "
              f"{'streamed' if rec['x_stream'] else 'resident'}): {rec['cycles']} cycles, ld "
              f"{rec['ld_bytes']} B, {rec['gemm_beats']} beats, "
              f"{100 * rec['roofline_fraction']:.1f}% of the {rec['roofline_bound']} roofline "
              f"({100 * rec['roofline_fraction_weights']:.1f}% counting weight bytes only), "
              f"{rec['comparisons']} values compared; {rec['wall_seconds']:.1f} s RTL, "
              f"{rec['case_seconds']:.1f} s the case")
        assert rec["mismatches"] == 0 and rec["comparisons"] > 0, rec
        hidden, inter, passes, rate = SHAPES[rec["model"]]
        assert rec["ld_rate_words_per_cycle"] == pytest.approx(ld_rate_words(mid, rate))
        assert rec["source"] == f"synthetic weights, {rec['model']} shape"
        assert (rec["hidden"], rec["intermediate"]) == (hidden, inter)
        assert rec["passes"] == passes
        assert (rec["max_keep_gemms"] > 0) == (passes == 2)
        assert rec["gemm_beats"] > 0 and rec["weight_bytes"] > 0
        assert 0 < rec["roofline_fraction"] <= 1.0
        assert rec["comparisons"] == values_compared(rec, mid, whole_row_blocks=True), rec
        # Exact, no slack: the cycle model's check allows a cycle for the bench's token bucket
        # (floating point) against its own exact arithmetic; this is the same bench and the
        # same bucket as the recorded run, and the program does not depend on the values.
        assert (rec["cycles"], rec["ld_words"], rec["commands"]) == \
            REAL_RECORDED[(rec["model"], rec["tokens"], rec["mode"])], rec
    assert sorted((r["model"], r["tokens"], r["mode"]) for r in records) == sorted(
        (m, t, mode) for m, tokens in shape_tokens.items() for t in tokens for mode in modes)
    return records


@pytest.mark.parametrize("mode", ["FULL", "DRAFT"])
def test_real_expert_mid(mode):
    """One mode a test: FULL (its LSB_ONLY + MSB_ONLY chains) in ``make test``, DRAFT in
    ``make test-slow`` (``tests/conftest.py``); the second reuses the first's build."""
    _run_real({"qwen3-30b-a3b": [1]}, [mode])


def test_real_expert_mid_recorded_rows():
    """Every other recorded ``mid`` row live (``make test-slow``): Qwen3-30B-A3B at 16 tokens
    and OLMoE-1B-7B at 1 and 16, DRAFT and FULL, 1.6 M cycles. Only the T=1 Qwen3-30B-A3B rows
    were re-measured by a test before: a change to the RTL that moved the others was caught by
    the cycle model's check only if the model moved with it."""
    rows = {(m, t, mode) for m, t, mode in REAL_RECORDED} - FIRST_ROWS
    assert rows == {(m, t, mode) for m in ("qwen3-30b-a3b", "olmoe-1b-7b") for t in (1, 16)
                    for mode in ("DRAFT", "FULL")} - FIRST_ROWS
    _run_real({"qwen3-30b-a3b": [16], "olmoe-1b-7b": [1, 16]}, ["DRAFT", "FULL"])

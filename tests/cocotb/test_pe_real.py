"""cocotb + Verilator bench of one expert of a real model's shape on the ``mid`` PE
(``sim/bench_pe.py::test_real_expert``): the streamed expert program (token tiles, K-chained
GEMMs, FULL as LSB_ONLY + MSB_ONLY chains) for the Qwen3-30B-A3B expert (H = 2048, I = 768),
synthetic weights, one token, DRAFT and FULL, the ``ld`` stream paced at the HB bank rate;
every ``o`` beat against fsim and the output against ``ref_moe`` bit for bit.

Builds the ``mid`` PE (its own Verilator build, reused when unchanged). The cycle and roofline
figures are printed, not judged (``make bench`` reports them for more shapes and batches).
"""

import pytest

from elmoe3d.config import preset
from elmoe3d.sim.bench_pe import run_pe_bench

pytestmark = pytest.mark.cocotb

TEST = "test_real_expert"


def test_real_expert_mid():
    result = run_pe_bench(preset("mid"), tests=TEST,
                          params={"real_shapes": ["qwen3-30b-a3b"], "real_tokens": [1],
                                  "real_modes": ["DRAFT", "FULL"]})
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0
    assert {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"} == {TEST}
    assert result.records and result.comparisons > 0 and result.mismatches == 0
    for rec in result.records:
        print(f"{rec['case']} {rec['mode']}: {rec['cycles']} cycles, ld {rec['ld_bytes']} B, "
              f"{rec['gemm_beats']} beats, {100 * rec['roofline_fraction']:.1f}% of the "
              f"{rec['roofline_bound']} roofline ({100 * rec['roofline_fraction_weights']:.1f}% "
              f"counting weight bytes only), {rec['comparisons']} values compared")
        assert rec["mismatches"] == 0 and rec["comparisons"] > 0, rec
        assert rec["source"] == "synthetic weights, qwen3-30b-a3b shape"
        assert (rec["hidden"], rec["intermediate"]) == (2048, 768)
        assert rec["gemm_beats"] > 0 and rec["weight_bytes"] > 0
        assert 0 < rec["roofline_fraction"] <= 1.0
        assert rec["comparisons"] >= rec["tokens"] * rec["hidden"]
    assert {(r["model"], r["tokens"], r["mode"]) for r in result.records} == {
        ("qwen3-30b-a3b", 1, "DRAFT"), ("qwen3-30b-a3b", 1, "FULL")}

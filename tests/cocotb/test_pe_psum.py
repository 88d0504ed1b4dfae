"""cocotb + Verilator bench of the PE's psum_in (``sim/bench_pe.py::test_psum_split``): the
verify phase's MSB/LSB split on one PE, RTL == fsim == the golden FULL GEMM, with and without
idle cycles and backpressure. Shares the PE build with ``tests/cocotb/test_pe.py``."""

import pytest

from elmoe3d.config import preset
from elmoe3d.sim.bench_pe import run_pe_bench

pytestmark = pytest.mark.cocotb


def test_psum_split_bench():
    result = run_pe_bench(preset("small"), tests="test_psum_split")
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0
    assert {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"} == \
        {"test_psum_split"}
    assert {r["traffic"] for r in result.records} == {"smooth", "stalls"}
    for rec in result.records:
        assert rec["mismatches"] == 0 and rec["comparisons"] >= 5 * 12, rec   # golden: [5, 12]
        assert rec["link_i_words"] > 0 and rec["gemm_beats"] > 0

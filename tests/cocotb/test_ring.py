"""cocotb + Verilator stress bench of the streamline ring, run through the one runner
(:mod:`elmoe3d.sim.bench_ring`).

The small preset's ring of 4 PEs in two stations (128 B flits holding two words, 8-flit PE
FIFOs): random transfers with random idle cycles and backpressure on every port, and streaming
throughput. Every word is compared with plain equality against ``ref_ring`` inside the bench;
these tests also check that the comparisons happened.
"""

import pytest

from elmoe3d.config import preset
from elmoe3d.sim.bench_ring import RING_TARGET, ring_params, run_ring_bench

pytestmark = pytest.mark.cocotb


def check_bench(result, tests):
    """The run passed every test named in ``tests`` (and no other), compared values and
    found no mismatch; returns its case records."""
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0
    assert {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"} == set(tests)
    assert result.records and result.comparisons > 0 and result.mismatches == 0
    for rec in result.records:
        assert rec["mismatches"] == 0 and rec["comparisons"] > 0, rec
    return result.records


def test_ring_stress_and_throughput():
    # The small preset's ring (the build `elmoe3d bench` uses too): 4 PEs in two stations.
    records = check_bench(run_ring_bench(ring_params(preset("small")),
                                         params={"transfers": 80, "stream_flits": 512}),
                          ["test_ring_stress", "test_ring_throughput"])
    stress = [r for r in records if r["case"] == "ring stress"]
    assert {r["traffic"] for r in stress} == {"smooth", "stalls"}
    assert all(r["multicast_flits"] > 0 and r["streams"] > 1 for r in stress)
    streaming = {r["pattern"]: r for r in records if r["traffic"] == "streaming"}
    assert len(streaming) == 3
    for r in streaming.values():
        assert r["fraction_of_bound"] >= RING_TARGET, r
    assert streaming["unicast round-robin"]["fraction"] >= RING_TARGET

"""cocotb + Verilator stress bench of the streamline ring, run through the one runner
(:mod:`elmoe3d.sim.bench_ring`).

The small preset's ring of 4 PEs in two stations (128 B flits holding two words, 8-flit PE
FIFOs): random transfers with random idle cycles and backpressure on every port, and streaming
throughput. Every word is compared with plain equality against ``ref_ring`` inside the bench;
these tests also check that the comparisons happened, one for every word the golden model
delivers.
"""

import pytest

from elmoe3d.config import preset
from elmoe3d.sim.bench_ring import RING_TARGET, ring_params, run_ring_bench
from elmoe3d.sw.golden.ring import ring_geometry

pytestmark = pytest.mark.cocotb


def golden_words(rec):
    """The words a case of the ring's or the aggregation link's bench (``sim/bench_ring.py``,
    ``sim/bench_agg_link.py``) compares when every word came: each word the golden model
    (``ref_ring``, ``ref_link``) delivers, once. A stress case records that count
    (``words``); a link streaming case delivers ``words_per_destination`` to each of its
    ``pes`` PEs (every PE a destination). None for any other record (the ring's streaming
    cases, whose count :func:`test_ring_stress_and_throughput` checks; other benches')."""
    if rec["case"] in ("ring stress", "link stress"):
        return rec["words"]
    if rec["case"].startswith("link ") and rec["traffic"] == "streaming":
        return rec["pes"] * rec["words_per_destination"]
    return None


def check_bench(result, tests, expected=golden_words):
    """The run passed every test named in ``tests`` (and no other), compared values and
    found no mismatch; returns its case records. Each case compared exactly
    ``expected(rec)`` values (default :func:`golden_words`), or more than none where that is
    None."""
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0
    assert {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"} == set(tests)
    assert result.records and result.comparisons > 0 and result.mismatches == 0
    for rec in result.records:
        want = expected(rec)
        assert rec["mismatches"] == 0 and rec["comparisons"] > 0, rec
        assert want is None or rec["comparisons"] == want, (want, rec)
    return result.records


def test_ring_stress_and_throughput():
    """Stress (80 random transfers of 1-8 words, each to one PE or more) and streaming (512
    full flits a pattern): every word the golden model delivers compared once, none
    mismatching; each streaming pattern at least ``RING_TARGET`` of its bound."""
    # The small preset's ring (the build `elmoe3d bench` uses too): 4 PEs in two stations.
    ring = ring_params(preset("small"))
    transfers, flits = 80, 512
    records = check_bench(run_ring_bench(ring, params={"transfers": transfers,
                                                       "stream_flits": flits}),
                          ["test_ring_stress", "test_ring_throughput"])
    stress = [r for r in records if r["case"] == "ring stress"]
    assert {r["traffic"] for r in stress} == {"smooth", "stalls"}
    assert all(r["multicast_flits"] > 0 and r["streams"] > 1 for r in stress)
    # a word at least per transfer, at most 8 to each of the PEs
    assert all(transfers <= r["words"] <= transfers * 8 * ring["pes"] for r in stress)
    streaming = {r["pattern"]: r for r in records if r["traffic"] == "streaming"}
    assert len(streaming) == 3
    per, _ = ring_geometry(word_bits=ring["word_bits"], flit_bytes=ring["flit_bytes"])
    for r in streaming.values():
        assert r["fraction_of_bound"] >= RING_TARGET, r
        # full flits of `per` words, to one PE each or (multicast) to every PE
        fanout = ring["pes"] if r["pattern"] == "multicast all" else 1
        assert r["flits"] == flits and r["comparisons"] == flits * per * fanout, r
    assert streaming["unicast round-robin"]["fraction"] >= RING_TARGET

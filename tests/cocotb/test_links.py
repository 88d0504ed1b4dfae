"""cocotb + Verilator stress benches of the aggregation link and the streamline ring, run through
the one runner (:mod:`elmoe3d.sim.bench_links`).

Group of 4 PEs (W = 512, 32 B link ports, 4-word destination FIFOs) and the small preset's ring
of 4 PEs in two stations (128 B flits holding two words, 8-flit PE FIFOs): random descriptors /
transfers with random idle cycles and backpressure on every port, corner descriptors, and
streaming throughput.
Every word is compared with plain equality against ``ref_link`` / ``ref_ring`` inside the bench;
these tests also check that the comparisons happened.
"""

import pytest

from elmoe3d.config import ArchConfig, preset
from elmoe3d.sim.bench_links import (LINK_TARGET, RING_TARGET, link_params, ring_params,
                                     run_link_bench, run_ring_bench)

pytestmark = pytest.mark.cocotb

ARCH = ArchConfig(pes=8, pes_per_group=4)


def _check(result, tests):
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0
    assert {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"} == set(tests)
    assert result.records and result.comparisons > 0 and result.mismatches == 0
    for rec in result.records:
        assert rec["mismatches"] == 0 and rec["comparisons"] > 0, rec
    return result.records


def test_link_stress_and_throughput():
    records = _check(run_link_bench(link_params(ARCH, buffer_words=4),
                                    params={"descriptors": 40, "stream_words": 512}),
                     ["test_link_stress", "test_link_throughput"])
    stress = [r for r in records if r["case"] == "link stress"]
    assert {r["traffic"] for r in stress} == {"smooth", "stalls"}
    assert all(set(r["modes"]) == {"BYPASS", "ALL_TO_ALL", "REDUCE_ADD", "REDUCE_MAX"}
               for r in stress)
    streaming = {r["mode"]: r for r in records if r["traffic"] == "streaming"}
    assert set(streaming) == {"BYPASS", "ALL_TO_ALL", "REDUCE_ADD", "REDUCE_MAX"}
    # Cycle counts, not wall time: one flit per cycle per port once the descriptor runs.
    for mode, r in streaming.items():
        assert r["fraction"] >= LINK_TARGET, r
    assert streaming["BYPASS"]["cycles"] == streaming["BYPASS"]["ideal_cycles"]


def test_ring_stress_and_throughput():
    # The small preset's ring (the build `elmoe3d bench` uses too): 4 PEs in two stations.
    records = _check(run_ring_bench(ring_params(preset("small")),
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


def _figs(link_fraction, ring_of_bound, failures=()):
    link = [{"mode": m, "words_per_source": 512, "words_per_destination": 512,
             "ideal_cycles": 1024, "cycles": round(1024 / link_fraction),
             "bytes_per_cycle": 32 * link_fraction, "fraction": link_fraction}
            for m in ("BYPASS", "ALL_TO_ALL", "REDUCE_ADD", "REDUCE_MAX")]
    ring = [{"pattern": "multicast all", "flits": 1024, "cycles": 2048, "bytes_per_cycle": 64.0,
             "fraction": 0.5 * ring_of_bound, "bound": 0.5, "fraction_of_bound": ring_of_bound}]
    return {"link": link, "ring": ring, "failures": list(failures), "logs": ["a.log", "b.log"],
            "aggregation_bytes_per_cycle": 32.0, "streamline_bytes_per_cycle": 128.0,
            "word_bytes": 64, "pes": 4, "pes_per_group": 2, "seed": 1}


@pytest.mark.filterwarnings("ignore")
def test_print_links_reports_missed_targets():
    """print_links (no simulation): met targets print no missed line; a missed link mode, a
    missed ring pattern and a bench failure each give one line naming it."""
    from rich.console import Console
    console = Console(file=open("/dev/null", "w"), width=140)
    from elmoe3d.sim.bench_links import print_links
    assert print_links(console, _figs(1.0, 1.0)) == []
    missed = print_links(console, _figs(0.95, 0.9, ["ring stress: 1 mismatch"]))
    assert len(missed) == 4 + 1 + 1
    assert any("ALL_TO_ALL" in m and "95.00%" in m for m in missed)
    assert any("multicast all" in m for m in missed)
    assert any("ring stress" in m and "a.log" in m for m in missed)
    empty = _figs(1.0, 1.0)
    empty["link"], empty["ring"] = [], []
    assert len(print_links(console, empty)) == 2

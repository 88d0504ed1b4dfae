"""cocotb + Verilator stress bench of the aggregation link, run through the one runner
(:mod:`elmoe3d.sim.bench_agg_link`).

Group of 4 PEs (W = 512, 32 B link ports, 4-word destination FIFOs): random descriptors with
random idle cycles and backpressure on every port, corner descriptors, and streaming
throughput. Every word is compared with plain equality against ``ref_link`` inside the bench;
these tests also check that the comparisons happened. Also figure 8's printer (link and ring
tables, ``elmoe3d bench``).
"""

import pytest

from elmoe3d.config import ArchConfig
from elmoe3d.sim.bench_agg_link import LINK_TARGET, link_params, run_link_bench

from .test_ring import check_bench

pytestmark = pytest.mark.cocotb

ARCH = ArchConfig(pes=8, pes_per_group=4)


def test_link_stress_and_throughput():
    records = check_bench(run_link_bench(link_params(ARCH, buffer_words=4),
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
    """Figure 8's printer (no simulation; the link table of bench_agg_link.print_link, the ring
    table of bench_ring.print_ring, then the failures): met targets print no missed line; a
    missed link mode, a missed ring pattern and a bench failure each give one line naming it."""
    from rich.console import Console
    console = Console(file=open("/dev/null", "w"), width=140)
    from elmoe3d.cli.bench import print_links
    assert print_links(console, _figs(1.0, 1.0)) == []
    missed = print_links(console, _figs(0.95, 0.9, ["ring stress: 1 mismatch"]))
    assert len(missed) == 4 + 1 + 1
    assert any("ALL_TO_ALL" in m and "95.00%" in m for m in missed)
    assert any("multicast all" in m for m in missed)
    assert any("ring stress" in m and "a.log" in m for m in missed)
    empty = _figs(1.0, 1.0)
    empty["link"], empty["ring"] = [], []
    assert len(print_links(console, empty)) == 2


@pytest.mark.filterwarnings("ignore")
def test_bench_tables_carry_their_figure_number():
    """A new user could not match figures 7-9's tables to the README's rows: their titles had
    no number. ``elmoe3d bench`` numbers both of figure 8's tables; alone, a bench's table
    has none."""
    import io
    from rich.console import Console
    from elmoe3d.cli.bench import figure_number, print_links
    from elmoe3d.sim.bench_agg_link import print_link
    out = io.StringIO()
    print_links(Console(file=out, width=300), _figs(1.0, 1.0))
    n = figure_number("links")
    assert n == 8
    assert f"{n}. Aggregation link throughput" in out.getvalue()
    assert f"{n}. Streamline ring throughput" in out.getvalue()
    out = io.StringIO()
    print_link(Console(file=out, width=300), _figs(1.0, 1.0))
    assert "Aggregation link throughput" in out.getvalue() and ". Aggregation" not in out.getvalue()

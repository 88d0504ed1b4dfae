"""The perf model's calibrated compute term (sw.host.perf_calib; issue 26 item 6): on ``make
sim``'s trace run (SIM_TRACE_RUN: real Mixtral GSM8K routing, small configuration, layers
0/8/16/24, 16 tokens, 68 HB slots, Elastic-SD depth 4) the perf model must come within 5% of
the RTL's cycles per step kind. The RTL backend's cycles of a layer-step are the slowest PE of
its slowest group, each PE program run alone with its link words delivered and its ld words a
cycle apart; the PE cycle model (sw.host.pe_cycles.program_cycles) gives exactly those cycles
on the same programs (tests/host/test_pe_cycles.py checks the model against the RTL), so the
reference here is program_cycles of the golden backend's programs, not a Verilator run.

Also: the shipped program table equals a recomputation, the source of the compute term on each
configuration, and the rotation bookkeeping of the array path against the per-layer path."""

import argparse

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from elmoe3d.config import preset
from elmoe3d.sw.host import perf_calib
from elmoe3d.sw.host.compiler import synthetic_model
from elmoe3d.sw.host.compute_calib import pe_key
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.pe_cycles import program_cycles
from elmoe3d.sw.host.perf import PerfModel, token_slices

def _sim_trace_run() -> list:
    """``make sim``'s trace run: the Makefile's SIM_TRACE_RUN, less ``--backend rtl``."""
    import re
    import shlex
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    m = re.search(r"^SIM_TRACE_RUN \?= ((?:.*\\\n)*.*)$", text, re.M)
    args = shlex.split(m.group(1).replace("\\\n", " "))
    i = args.index("--backend")
    assert args[i + 1] == "rtl"
    return args[:i] + args[i + 2:]


SIM_TRACE_RUN = _sim_trace_run()


def _golden_run(monkeypatch):
    """The golden backend on SIM_TRACE_RUN with its jobs kept: ``(doc, layers)``."""
    from elmoe3d.cli import run as runcmd
    from elmoe3d.sw.host.backends import golden
    kept = {}
    orig = golden.GoldenBackend.golden

    def keep(self, steps, ctx):
        recs, layers = orig(self, steps, ctx)
        kept["layers"] = layers
        return recs, layers

    # on the class, through monkeypatch: the registry's golden backend is one instance that
    # later tests read (test_backends' declarations), so nothing may stay set on it
    monkeypatch.setattr(golden.GoldenBackend, "keeps_golden", True)
    monkeypatch.setattr(golden.GoldenBackend, "golden", keep)
    ap = argparse.ArgumentParser()
    runcmd.configure(ap)
    doc = runcmd.execute(ap.parse_args(SIM_TRACE_RUN + ["--backend", "golden"]))
    return doc, kept["layers"]


def test_sim_trace_run_per_step_kind(monkeypatch):
    doc, layers = _golden_run(monkeypatch)
    run = doc["runs"][0]
    # the RTL backend's cycles: per layer-step the slowest PE of every busy group, summed
    # over the step's layers (elmoe3d.sim.bench_host: ld a word a cycle, link words present)
    rtl = {}
    for gl in layers:
        worst = max(program_cycles(job.programs[p], ld_rate=1.0, ld=job.ld[p]).cycles
                    for _, job, _, _ in gl.jobs for p in range(job.pes))
        rtl[gl.step] = rtl.get(gl.step, 0) + worst
    kinds = {}
    for r in run["steps"]:
        k = kinds.setdefault(r["kind"], [0, 0.0])
        k[0] += rtl[r["step"]]
        k[1] += r["perf_cycles"]
    assert set(kinds) == {"ar", "draft", "verify"}
    # the target: within 5% per step kind; AR and draft, compute-bound here, within 0.5%
    # (a verify's layer-steps may be bound by EXT, which a PE run alone never waits for)
    for kind, (model, perf) in kinds.items():
        assert abs(perf / model - 1) <= (0.05 if kind == "verify" else 0.005), \
            (kind, model, perf)
    assert run["perf_compute"]["compute_source"] == "programs"


def test_shipped_table_recomputed():
    arch = preset("small")
    from elmoe3d.sw.host.compiler import SYNTHETIC_SHAPE
    from elmoe3d.sw.host.perf_calib_table import TABLE
    h, i = SYNTHETIC_SHAPE
    assert perf_calib.program_table(arch, h, i) == TABLE[(pe_key(arch), h, i)]


@pytest.mark.parametrize("feed", perf_calib.FEEDS)
def test_group_program_additive(feed):
    """The table's sum (base + each expert's cycles at its rotation) against program_cycles
    of compiled group programs of mixed experts (the overlap at expert boundaries: a few
    cycles), ``ld`` and link words at the feed's rates: a word a cycle (ideal) or the HB
    bank's and the aggregation link's (die)."""
    arch = preset("small")
    cal = perf_calib.ComputeCycles(arch, synthetic_model(model_preset("mixtral-8x7b")), feed)
    assert cal.source == "programs"
    pm = PerfModel(arch, synthetic_model(model_preset("mixtral-8x7b")), feed=feed)
    rate = arch.hb_ld_words_per_cycle if feed == "die" else 1.0
    link = arch.link_words_per_cycle if feed == "die" else None
    assert (rate < 1 and link < 1) or feed == "ideal"
    G = arch.pes_per_group
    for phase, T, experts in (("draft", 5, [(5, True), (2, True), (1, True)]),
                              ("verify", 6, [(1, False), (3, True), (6, True), (2, False)]),
                              ("verify", 9, [(9, False), (4, True)])):
        got = perf_calib.group_program_cycles(arch, 64, 128, phase, T, experts, ld_rate=rate,
                                              link_rate=link)
        want = cal.base(phase, T)
        rot = 0
        for t, c in experts:
            cyc, r = pm.compute(t, phase=phase, cached=c)
            want = want + cyc[rot % G]
            rot += r
        # the group's compute time (its busiest PE) within 1%, every PE within 2%
        assert abs(max(got) / max(want) - 1) <= 0.01, (phase, experts, got, want)
        assert (np.abs(np.array(got) / want - 1) <= 0.02).all(), (phase, experts, got, want)


def test_sources():
    mix = model_preset("mixtral-8x7b")
    assert perf_calib.compute_cycles(preset("small"), synthetic_model(mix)).source == \
        "programs"
    paper = perf_calib.compute_cycles(preset("paper-8gb"), mix)
    assert paper.source == "ffn"
    assert (paper.base("verify", 4) == 0).all()
    # a shape no table holds: MACs / peak, said in the note
    odd = synthetic_model(mix, (96, 160))
    c = perf_calib.compute_cycles(preset("small"), odd)
    assert c.source == "roofline" and "no calibration row" in c.note
    pm = PerfModel(preset("small"), odd)
    x = pm.expert(0, 3, phase="verify", cached=False)
    cyc, _ = pm.compute(3, phase="verify", cached=False)
    per_pe = [a / pm.peak4 + b / pm.peak8 for a, b in zip(x.w4_macs, x.w8_macs)]
    assert np.allclose(cyc[0], per_pe)


def test_extrapolated_past_table():
    """Past the tokens the PE holds, a row-block rotation's slope carries on (monotone)."""
    arch = preset("small")
    cal = perf_calib.compute_cycles(arch, synthetic_model(model_preset("mixtral-8x7b")))
    t = cal.tmax
    a = cal.expert("verify", True, t, None, None)
    b = cal.expert("verify", True, t + 8, None, None)
    assert (b > a).all()
    assert (cal.base("verify", t + 8) >= cal.base("verify", t)).all()


@pytest.mark.parametrize("name, feed", [("qwen3-30b-a3b", "die"), ("mixtral-8x7b", "die"),
                                        ("qwen3-30b-a3b", "ideal")])
def test_paper_draft_expert_is_the_ffn_calibration(name, feed):
    """On a paper configuration (source ``"ffn"``) a draft expert (tensor parallel, the
    intermediate split evenly) costs each PE the compute calibration's cycles of the whole
    FFN on its group (compute_calib.ffn_calibration at W4A8, of the model's feed: link words
    at the aggregation link's rate on the die, a word a cycle ideal), whatever the rotation;
    a verify of an uncached expert at W8A8 splits its row blocks, so the PEs' cycles sum to
    the row blocks' MAC share of the calibration's."""
    from elmoe3d.sw.host.compute_calib import ffn_calibration
    arch = preset("paper-4gb")
    m = model_preset(name)
    pm = PerfModel(arch, m, feed=feed)
    assert pm.calib.source == "ffn"
    assert f"link words at {arch.link_words_per_cycle if feed == 'die' else 1:g}" in \
        pm.calib.note
    cal4 = ffn_calibration(arch, m.hidden, m.expert_intermediate, 4, feed)
    for t in (1, 5, 16, 40):
        cyc, rot = pm.compute(t, phase="draft", cached=True)
        assert rot == 0 and cyc.shape == (arch.pes_per_group,) * 2
        assert np.allclose(cyc, cal4.cycles(t), rtol=1e-12), (t, cyc, cal4.cycles(t))
    cal8 = ffn_calibration(arch, m.hidden, m.expert_intermediate, 8, feed)
    R, G = arch.tile.rows, arch.pes_per_group
    for t in (1, 17, 40):
        cyc, rot = pm.compute(t, phase="verify", cached=False)
        rbn = -(-t // R)
        assert rot == rbn % G
        # every PE's cycles are its row blocks' share of the group's calibrated cycles x G
        share = np.array(token_slices(rbn, G)) / rbn
        assert np.allclose(cyc[0], share * G * cal8.cycles(t), rtol=1e-12), (t, cyc[0])


def test_tail_is_the_stream_bound_tail():
    """The shipped table's tails (cycles after a program's last ld word, taken at
    STARVED_LD_RATE) are the stream-bound figure: every row the same at a quarter of that
    rate; a draft has none; and they are what the die feed adds to an EXT-bound layer after
    its stream, with the EXT's first read."""
    from elmoe3d.sw.host.compiler import SYNTHETIC_SHAPE
    from elmoe3d.sw.host.perf_calib_table import TABLE
    arch = preset("small")
    h, i = SYNTHETIC_SHAPE
    row = TABLE[(pe_key(arch), h, i)]
    assert set(row["tail"]) == {"verify"}
    G = arch.pes_per_group
    for c in (0, 1):
        for t in range(1, row["tmax"] + 1):
            for j in range(G):
                slow = perf_calib.group_program_estimates(
                    arch, h, i, "verify", t, [(1, True)] * (G + j) + [(t, bool(c))],
                    ld_rate=perf_calib.STARVED_LD_RATE / 4,
                    link_rate=arch.link_words_per_cycle)
                assert [e.tail_cycles for e in slow] == row["tail"]["verify"][c][t][j], \
                    (c, t, j)
    cal = perf_calib.compute_cycles(arch, synthetic_model(model_preset("mixtral-8x7b")))
    assert cal.has_tails and not cal.tail("draft", True, 5).any()
    from elmoe3d.sw.host.compiler import LayerWork, Placement
    m = synthetic_model(model_preset("mixtral-8x7b"))
    ids = np.array([[5, -1]] * 3)
    work = LayerWork(layer=0, ids=ids, weights=np.ones((3, 2), np.float32),
                     cached=frozenset())
    pl = Placement(groups=({}, {5: 3}), cached=(frozenset(), frozenset()))
    pm = PerfModel(arch, m)
    die = pm.layer(work, pl, phase="verify", step_tokens=3)
    ideal = PerfModel(arch, m, feed="ideal").layer(work, pl, phase="verify", step_tokens=3)
    tail = max(perf_calib.group_program_estimates(arch, 64, 128, "verify", 3, [(3, False)],
                                                  ld_rate=perf_calib.STARVED_LD_RATE,
                                                  link_rate=arch.link_words_per_cycle),
               key=lambda e: e.tail_cycles).tail_cycles
    assert die.ext_cycles == ideal.ext_cycles + arch.ext.first_read_cycles(1.0) + tail
    # the group's own times start after the EXT's first read (no HB-resident expert); the
    # OUT reduction (the base) starts when every PE that takes part in it is done (die feed)
    cyc = pm.compute(3, phase="verify", cached=False)[0][0]
    base = pm.calib.base("verify", 3)
    own = max(cyc[base > 0]) + max(base)
    assert die.group_cycles[1]["compute"] == own + arch.ext.first_read_cycles(1.0)
    pi = PerfModel(arch, m, feed="ideal")       # each PE's program alone: the sums
    assert ideal.group_cycles[1]["compute"] == max(
        pi.compute(3, phase="verify", cached=False)[0][0] + pi.calib.base("verify", 3))


@pytest.mark.parametrize("ex", [{3: 2, 5: 3, 7: 1}, {4: 1, 6: 1}, {1: 1, 7: 1}])
def test_die_feed_holds_a_groups_pes_together(ex):
    """The die feed runs each expert on its participating PEs (those with cycles in it) in
    lockstep, from the latest of their ready times for the largest of their cycles, and the
    program's base (the OUT reduction) from the latest ready time of every PE taking part in
    it; the ideal feed sums each PE's program alone. The expected figures are worked out here
    with plain loops on groups like the die bench's T = 4 verify layer's (group 1: expert 3, 2
    tokens, and 5, 3 tokens, HB-resident, then 7, one token from EXT on PE 1 only; group 0:
    expert 4, one token from EXT on PE 0 only, then 6, one token, HB-resident; docs/host.md
    section 7) and two one-token experts from EXT on different PEs, which run side by side;
    the array path (``steps_summary``) must agree with ``layer``."""
    from elmoe3d.sw.host.compiler import LayerWork, Placement, Step
    arch = preset("small")
    m = synthetic_model(model_preset("mixtral-8x7b"))
    G = arch.pes_per_group
    cached = frozenset({0, 2, 3, 5, 6})
    ids = np.array([[e, -1] for e, n in ex.items() for _ in range(n)])
    work = LayerWork(layer=0, ids=ids, weights=np.ones(ids.shape, np.float32), cached=cached)
    pl = Placement(groups=({}, ex), cached=(frozenset(), frozenset(ex) & cached))
    T = len(ids)
    got = {}
    for feed in ("die", "ideal"):
        pm = PerfModel(arch, m, feed=feed)
        ready, total, rot = [0.0] * G, [0.0] * G, 0
        for e, n in sorted(ex.items()):
            cyc, r = pm.compute(n, phase="verify", cached=e in cached)
            row = [float(x) for x in cyc[rot % G]]
            rot += r
            part = [p for p in range(G) if row[p] > 0]
            end = max(ready[p] for p in part) + max(row[p] for p in part)
            ready = [end if p in part else ready[p] for p in range(G)]
            total = [a + b for a, b in zip(total, row)]
        base = [float(x) for x in pm.calib.base("verify", T)]
        start = max(ready[p] for p in range(G) if base[p] > 0)
        ready = [start + base[p] if base[p] > 0 else ready[p] for p in range(G)]
        total = [a + b for a, b in zip(total, base)]
        head = pm.head_hb if frozenset(ex) & cached else pm.head_ext
        want = (max(ready) if feed == "die" else max(total)) + head
        c = pm.layer(work, pl, phase="verify", step_tokens=T)
        assert c.group_cycles[1]["compute"] == want, feed
        step = Step(0, "verify", [(0, t) for t in range(T)], {0: work}, 0, placements={0: pl})
        assert pm.steps_summary([step])[0].cycles == c.cycles, feed
        got[feed] = (max(ready), max(total))
    die_ready, die_sum = got["die"]
    if len(ex) == 2 and not frozenset(ex) & cached:
        assert die_ready == die_sum             # side by side on their own PEs: no wait
    else:
        assert die_ready > die_sum              # unbalanced PEs held together: cycles lost


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
@pytest.mark.parametrize("name", ["small", "mid", "paper-4gb", "paper-8gb"])
def test_link_rate_is_the_aggregation_links(name):
    """The die feed's link pacing (ArchConfig.link_words_per_cycle) is the RTL link's: one
    PE word per ``flits_per_word`` cycles (hw/agg_link.py)."""
    from elmoe3d.hw.agg_link import AggregationLink
    import gc
    arch = preset(name)
    link = AggregationLink.from_arch(arch)
    assert arch.link_words_per_cycle == 1 / link.flits_per_word
    del link
    gc.collect()          # the unused link warns here, where it is ignored


def test_die_row_and_tails_only_at_the_tables_link_rate():
    """An arch whose aggregation link differs from the shipped table's (same PE key) takes
    neither the die row nor its tails (taken at the table's link rate), and says so."""
    import dataclasses
    m = synthetic_model(model_preset("mixtral-8x7b"))
    ok = perf_calib.ComputeCycles(preset("small"), m, "die")
    assert ok.has_tails and "link words at the aggregation link's 0.5" in ok.note
    for gbps in (16.0, 64.0):
        arch = dataclasses.replace(preset("small"), aggregation_gbps=gbps)
        cc = perf_calib.ComputeCycles(arch, m, "die")
        assert not cc.has_tails and "no tails" in cc.note, cc.note
        assert (cc.base("verify", 16) == perf_calib.ComputeCycles(arch, m, "ideal")
                .base("verify", 16)).all()


def test_paper_pe_at_another_link_rate_computes_its_calibration(monkeypatch, tmp_path):
    """A paper-PE configuration whose aggregation link differs from the table's (64 GB/s: 1/8
    word a cycle) keeps the ``"ffn"`` source: its die-feed calibration is computed with the
    cycle model at that rate on first use (here a stand-in records the call), the ideal
    feed's read from the table; the note says so."""
    import dataclasses

    from elmoe3d.sw.host import compute_calib as cc
    arch = dataclasses.replace(preset("paper-8gb"), aggregation_gbps=64.0)
    assert arch.link_words_per_cycle == 1 / 8
    m = model_preset("qwen3-30b-a3b")
    calls = []

    def stand_in(a, h, i, bits, *, check=True, link_rate=None):
        calls.append((h, i, bits, link_rate))
        return dataclasses.replace(cc.ffn_calibration(preset("paper-8gb"), h, i, bits),
                                   link_rate=link_rate)
    monkeypatch.setattr(cc, "calibrate", stand_in)
    monkeypatch.setattr(cc, "_CACHE", {})
    monkeypatch.setattr(cc, "calib_root", lambda: tmp_path)    # the stand-in's, not kept
    die = perf_calib.compute_cycles(arch, m, "die")
    assert die.source == "ffn" and "link words at 0.125 a cycle, computed" in die.note
    assert sorted(calls) == [(m.hidden, m.expert_intermediate, b, 1 / 8) for b in (4, 8)]
    ideal = perf_calib.compute_cycles(arch, m, "ideal")
    assert ideal.source == "ffn" and "computed" not in ideal.note and len(calls) == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 300)), max_size=200))
def test_program_order_is_lexsort(pairs):
    """program_order (one stable argsort of a combined key) orders routed experts as
    np.lexsort((order_key, cell)) does: by cell, then by order key, ties kept in place."""
    cell = np.array([c for c, _ in pairs], np.int64)
    key = np.array([k for _, k in pairs], np.int64)
    assert perf_calib.program_order(cell, key).tolist() == np.lexsort((key, cell)).tolist()


@pytest.mark.parametrize("seed", [0, 1])
def test_cells_lockstep_equals_a_loop_per_cell(seed):
    """ComputeCycles.cells with the die feed's lockstep rule (PerfModel._after) on random
    experts, some with idle PEs: each cell's per-PE cycles equal the rule applied one expert
    at a time in program order, bit for bit; the summing path equals per-PE sums."""
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    pm = PerfModel(preset("paper-8gb"), "qwen3-30b-a3b")
    G, n, m = pm.G, 500, 40
    cyc = rng.integers(1, 5000, (n, G)).astype(np.float64)
    cyc[rng.random((n, G)) < 0.3] = 0.0
    cyc[cyc.sum(axis=1) == 0, 0] = 7.0              # every expert has a PE with cycles
    cell = rng.integers(0, m, n)
    key = rng.permutation(n)
    got = pm.calib.cells(cyc, cell, key, m, after=pm._after)
    want = np.zeros((m, G))
    for i in np.lexsort((key, cell)):
        want[cell[i]] = pm._after(want[cell[i]][None], cyc[i][None])[0]
    assert got.tolist() == want.tolist()
    sums = np.zeros((m, G))
    np.add.at(sums, cell, cyc)
    assert np.array_equal(pm.calib.cells(cyc, cell, key, m), sums)

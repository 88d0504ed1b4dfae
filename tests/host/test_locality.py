"""Fig. 16 on real routing (elmoe3d.sw.host.locality): the count table's popularity, Che's
miss rate against the exact LRU on the real traces, the spread across models and benchmarks."""

import numpy as np
import pytest

from elmoe3d.errors import UserError
from elmoe3d.sw.host import locality as lo
from elmoe3d.sw.host import paper_eval as pe
from elmoe3d.sw.host.corpus import ROUTING_FILES, routing_path
from elmoe3d.sw.host.hbcache import HBExpertCache, replay, replay_per_layer
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.trace import import_vllm_jsonl

MIX = model_preset("mixtral-8x7b")


@pytest.fixture(scope="module")
def traces():
    return {name: import_vllm_jsonl(routing_path(name), model=MIX)[0] for name in ROUTING_FILES}


@pytest.fixture(scope="module")
def doc(traces):
    return lo.fig16(traces)


def test_count_popularity_by_hand():
    """Picks over the tokens: the top-1 rows' sum where given, else the picks over top-k; the
    layers stacked in order; each row sums to top-k."""
    a = np.arange(64) + 1                               # 2080 picks = 8 x 260 tokens
    top1 = np.zeros(64, np.int64)
    top1[:2] = (200, 60)
    table = {("olmoe", "expert_counts", "c4", 7): a, ("olmoe", "expert_counts", "c4", 0): a[::-1],
             ("olmoe", "expert_counts_top1", "c4", 7): top1,
             ("mistral", "expert_counts", "book", 15): np.array([3, 1, 0, 0, 0, 0, 0, 0])}
    got = lo.count_popularity(table)
    assert set(got) == {("olmoe-1b-7b", "c4"), ("mixtral-8x7b", "book")}
    p = got["olmoe-1b-7b", "c4"]
    assert p.shape == (2, 64)
    assert np.allclose(p[0], a[::-1] / 260) and np.allclose(p[1], a / 260)
    assert np.allclose(p.sum(axis=1), 8)
    assert np.allclose(got["mixtral-8x7b", "book"], [[1.5, 0.5, 0, 0, 0, 0, 0, 0]])


@pytest.mark.parametrize("table, match", [
    ({("olmoe", "expert_counts", "c4", 0): np.ones(64, np.int64),
      ("olmoe", "expert_counts_top1", "c4", 0): np.ones(64, np.int64)},
     r"expert counts \(olmoe, c4, layer 0\): 64 picks over 64 tokens, expected top-k 8"),
    ({("olmoe", "expert_counts", "c4", 0): np.ones(60, np.int64)},
     r"expert counts \(olmoe, c4, layer 0\): 60 experts, expected 64 \(olmoe-1b-7b\)"),
    ({("grok", "expert_counts", "c4", 0): np.ones(8, np.int64)},
     r"expert counts \(grok, c4, layer 0\): unknown model 'grok'; known: mistral, olmoe"),
    ({("mistral", "expert_counts", "c4", 0): np.zeros(8, np.int64)},
     r"expert counts \(mistral, c4, layer 0\): 0 picks over 0.0 tokens"),
])
def test_count_popularity_names_the_bad_entry(table, match):
    with pytest.raises(UserError, match=match):
        lo.count_popularity(table)


def test_real_count_table():
    """Every (model, domain) of the real table: three layers, rows summing to the preset's
    top-k, probabilities in [0, 1]; the OLMoE tables' picks are 8 x their top-1 picks."""
    got = lo.count_popularity()
    assert len(got) == 13                    # Mixtral 5 domains, OLMoE 6, SFT and DPO on tulu
    for (model, _), p in got.items():
        k, e = (2, 8) if model == "mixtral-8x7b" else (8, 64)
        assert p.shape == (3, e) and np.allclose(p.sum(axis=1), k)
        assert p.min() >= 0 and p.max() <= 1


def test_uniform_popularity_misses_one_minus_the_fraction():
    """Che's miss rate of a uniform popularity is 1 - the cached fraction at every batch (every
    expert cached with h = slots / experts): the rows' slots and batches by hand."""
    p = np.full((3, 16), 4 / 16)
    rows = lo._che_rows({"model": "u"}, p, (0.25, 0.5), (1, 4))
    assert [(r["fraction"], r["batch"], r["slots"]) for r in rows] == [
        (0.25, 1, 12.0), (0.25, 4, 12.0), (0.5, 1, 24.0), (0.5, 4, 24.0)]
    assert [r["che"] for r in rows] == pytest.approx([0.75, 0.75, 0.5, 0.5])
    whole = lo._che_rows({"model": "u"}, p, (0.3,), (1,), whole=True)
    assert whole[0]["slots"] == 15           # round(0.3 x 16) = 5 a layer, x 3 layers


def test_trace_rows_are_the_exact_lru_and_the_model(traces, doc):
    """Each trace row: the exact LRUs (one over all layers, one a layer) of its batch and slots
    where the trace has that many requests, Che from its popularity and Table 3's cache form
    with a Zipf law fitted to it; the merged workload of both traces has 4 requests."""
    rows = [r for r in doc["miss"] if r["kind"] == "trace"]
    merged = lo.merged_trace(traces)
    by = {**traces, "gsm8k+humaneval": merged}
    assert {r["benchmark"] for r in rows} == set(by)
    assert {r["benchmark"] for r in rows if r["mixture"]} == {"gsm8k+humaneval"}
    checked = 0
    for r in rows:
        tr = by[r["benchmark"]]
        p = pe.trace_popularity(tr)
        per = int(round(r["fraction"] * 8))
        assert r["slots"] == per * 32
        assert r["che"] == pytest.approx(1 - pe.che_global(p, per * 32, r["batch"]))
        uniq, hits = pe.ExpertPopularity(8, 2, pe.fit_zipf(p)).step(r["batch"], per)
        assert r["zipf_model"] == pytest.approx(1 - hits / uniq)
        if r["batch"] > len(tr.requests("decode")):
            assert r["exact"] is None and r["exact_layer"] is None
            continue
        if r["fraction"] == 0.25:
            cache = HBExpertCache(capacity_bytes=per * 32 * MIX.expert_msb_bytes, model=MIX)
            assert r["exact"] == 1 - replay(tr, cache, batch=r["batch"]).hit_rate
            assert r["exact_layer"] == 1 - replay_per_layer(tr, MIX, per,
                                                            batch=r["batch"]).hit_rate
            checked += 1
    assert checked == 7                      # batch 1-2 on each trace, 1, 2, 4 on both
    assert sum(r["exact"] is not None for r in rows) == 3 * 7


def test_the_real_traces_miss_more_as_the_batch_grows(doc):
    """Measured on the real traces (both together, an LRU a layer holding a quarter of the
    experts): the miss rate rises with the batch (the paper's Fig. 16(a)), and faster than
    Che's approximation, which sees popularity only (docs/paper.md section 8)."""
    got = {r["batch"]: r for r in doc["miss"] if r["mixture"] and r["fraction"] == 0.25}
    exact = [round(got[b]["exact_layer"], 3) for b in (1, 2, 4)]
    che = [round(got[b]["che"], 3) for b in (1, 2, 4)]
    print("exact a layer", exact, "Che", che)
    assert exact == [0.625, 0.652, 0.688] and che == [0.739, 0.742, 0.745]
    # one LRU over all layers sweeps them cyclically: a step's slices evict each other
    assert [round(got[b]["exact"], 3) for b in (1, 2, 4)] == [0.626, 0.805, 0.911]


def test_unique_experts_within_and_across_requests(doc, traces):
    """Panel (b) is routing_exponents on the traces: windows 2-16 of one request, 2-4
    requests."""
    u = doc["unique"]
    assert u == pe.routing_exponents(list(traces.values()), windows=lo.WINDOWS,
                                     batches=lo.INTER)
    assert [r["n"] for r in u["intra"]] == [2, 4, 8, 16]
    assert [r["n"] for r in u["inter"]] == [2, 3, 4]


def test_spread_by_hand():
    rows = [{"model": m, "family": f, "benchmark": b, "kind": "counts", "fraction": 0.25,
             "batch": 1, "che": c}
            for m, f, b, c in (("a", "a", "x", 0.5), ("a", "a", "y", 0.6), ("b", "b", "x", 0.8),
                               ("b-sft", "b", "x", 0.7), ("b", "b", "z", 0.9))]
    rows.append({**rows[0], "batch": 2, "che": 0.0})
    s = lo.locality_spread(rows)
    assert s["across_benchmarks"]["ranges"] == pytest.approx({"a (counts)": 0.1,
                                                             "b (counts)": 0.1})
    assert s["across_models"]["ranges"] == pytest.approx({"x (counts)": 0.3})
    assert s["across_variants"]["ranges"] == pytest.approx({"b x (counts)": 0.1})
    assert s["ratio"] == pytest.approx(3.0)
    with pytest.raises(UserError, match="no row at fraction 0.3 and batch 1"):
        lo.locality_spread(rows, fraction=0.3)


def test_real_spread(doc):
    """The real routing's spread (count table and traces, a quarter of the experts, batch 1):
    models differ by more than benchmarks on average, OLMoE's domains by as much as models."""
    s = doc["spread"]
    print(s)
    assert set(s["across_benchmarks"]["ranges"]) == {"mixtral-8x7b (counts)",
                                                     "mixtral-8x7b (trace)",
                                                     "olmoe-1b-7b (counts)"}
    assert set(s["across_models"]["ranges"]) == {f"{d} (counts)" for d in
                                                 ("arxiv", "book", "c4", "github", "wikipedia")}
    assert round(s["ratio"], 2) == 2.43
    assert round(s["across_benchmarks"]["ranges"]["olmoe-1b-7b (counts)"], 3) == 0.174


def test_merged_trace_and_bad_input(traces):
    m = lo.merged_trace(traces)
    assert len(m.requests("decode")) == 4 and len(m) == sum(len(t) for t in traces.values())
    ids = sorted({int(r.request) for r in m.requests("decode")})
    assert ids == [0, 1, 2, 3]
    from elmoe3d.sw.host.tracegen import CALIBRATED, synthetic_trace
    olmoe = synthetic_trace("olmoe-1b-7b", CALIBRATED["olmoe-1b-7b"], tokens=4)
    with pytest.raises(UserError, match=r"traces\['d'\]: 64 experts, top-8, 16 layers; "
                                        r"expected the first trace's 8, top-2, 32"):
        lo.merged_trace({"g": traces["gsm8k"], "d": olmoe})
    for kw, match in (({"fractions": (0,)}, "fractions: expected a non-empty sequence"),
                      ({"fractions": "0.5"}, "fractions: expected a sequence"),
                      ({"batches": (0,)}, "batches"), ({"windows": (1,)}, "windows")):
        with pytest.raises(UserError, match=match):
            lo.fig16(traces, **kw)
    with pytest.raises(UserError, match="traces: expected"):
        lo.fig16([traces["gsm8k"]])

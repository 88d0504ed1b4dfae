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
             ("mistral", "expert_counts", "book", 15): np.array([3, 3, 1, 1, 0, 0, 0, 0])}
    got = lo.count_popularity(table)
    assert set(got) == {("olmoe-1b-7b", "c4"), ("mixtral-8x7b", "book")}
    p = got["olmoe-1b-7b", "c4"]
    assert p.shape == (2, 64)
    assert np.allclose(p[0], a[::-1] / 260) and np.allclose(p[1], a / 260)
    assert np.allclose(p.sum(axis=1), 8)
    assert np.allclose(got["mixtral-8x7b", "book"], [[0.75, 0.75, 0.25, 0.25, 0, 0, 0, 0]])
    # an expert every token picks: p = 1, accepted
    one = lo.count_popularity({("mistral", "expert_counts", "c4", 0): np.array([2, 1, 1, 0, 0,
                                                                                0, 0, 0])})
    assert one["mixtral-8x7b", "c4"][0, 0] == 1.0


@pytest.mark.parametrize("table, match", [
    ({("olmoe", "expert_counts", "c4", 0): np.ones(64, np.int64),
      ("olmoe", "expert_counts_top1", "c4", 0): np.ones(64, np.int64)},
     r"expert counts \(olmoe, c4, layer 0\): 64 picks over 64 tokens \(the top-1 rows\), "
     r"expected top-k 8 picks a token"),
    ({("olmoe", "expert_counts", "c4", 0): np.ones(60, np.int64)},
     r"expert counts \(olmoe, c4, layer 0\): 60 experts, expected 64 \(olmoe-1b-7b\)"),
    ({("grok", "expert_counts", "c4", 0): np.ones(8, np.int64)},
     r"expert counts \(grok, c4, layer 0\): unknown model 'grok'; known: mistral, olmoe"),
    ({("mistral", "expert_counts", "c4", 0): np.zeros(8, np.int64)},
     r"expert counts \(mistral, c4, layer 0\): 0 picks over the tokens"),
    ({("mistral", "expert_counts", "c4", 0): np.array([3, 0, 0, 0, 0, 0, 0, 0])},
     r"expert counts \(mistral, c4, layer 0\): 3 picks over the tokens, expected top-k 2"),
    ({("mistral", "expert_counts", "c4", 0): np.array([3, 1, 0, 0, 0, 0, 0, 0])},
     r"expert counts \(mistral, c4, layer 0\): an expert picked 3 times over 2 tokens"),
    ({("mistral", "expert_counts", "c4", 0): np.ones(8, np.int64) * 2,
      ("mistral", "expert_counts", "c4", 7): np.ones(8, np.int64)},
     r"expert counts \(mistral, c4, layer 7\): 4 tokens, layer 0 of the domain has 8"),
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
    rows = lo._rows({"model": "u", "top_k": 4}, p, (0.25, 0.5), (1, 4), zipf=0.0)
    assert [(r["fraction"], r["batch"], r["slots"]) for r in rows] == [
        (0.25, 1, 12.0), (0.25, 4, 12.0), (0.5, 1, 24.0), (0.5, 4, 24.0)]
    assert [r["che_miss"] for r in rows] == pytest.approx([0.75, 0.75, 0.5, 0.5])
    # Table 3's token form on a flat Zipf law: the per-token hit rate is the fraction too
    assert [r["table3_form_miss"] for r in rows] == pytest.approx([0.75, 0.75, 0.5, 0.5])
    whole = lo._rows({"model": "u", "top_k": 4}, p, (0.3,), (1,), whole=True)
    assert whole[0]["slots"] == 15           # round(0.3 x 16) = 5 a layer, x 3 layers
    assert whole[0]["table3_form_miss"] is None


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
        assert r["che_miss"] == pytest.approx(1 - pe.che_global(p, per * 32, r["batch"]))
        uniq, hits = pe.ExpertPopularity(8, 2, pe.fit_zipf(p)).step(r["batch"], per)
        assert r["table3_form_miss"] == pytest.approx(1 - hits / uniq)
        if r["batch"] > len(tr.requests("decode")):
            assert r["exact_miss"] is None and r["exact_layer_miss"] is None
            continue
        if r["fraction"] == 0.25:
            cache = HBExpertCache(capacity_bytes=per * 32 * MIX.expert_msb_bytes, model=MIX)
            assert r["exact_miss"] == 1 - replay(tr, cache, batch=r["batch"]).hit_rate
            assert r["exact_layer_miss"] == 1 - replay_per_layer(tr, MIX, per,
                                                                 batch=r["batch"]).hit_rate
            checked += 1
    assert checked == 7                      # batch 1-2 on each trace, 1, 2, 4 on both
    assert sum(r["exact_miss"] is not None for r in rows) == 3 * 7


def test_the_real_traces_miss_more_as_the_batch_grows(doc):
    """Measured on the real traces (both together, an LRU a layer holding a quarter of the
    experts): the miss rate rises with the batch (the paper's Fig. 16(a)), and faster than
    Che's approximation, which sees popularity only (docs/paper.md section 8)."""
    got = {r["batch"]: r for r in doc["miss"] if r["mixture"] and r["fraction"] == 0.25}
    exact = [round(got[b]["exact_layer_miss"], 3) for b in (1, 2, 4)]
    che = [round(got[b]["che_miss"], 3) for b in (1, 2, 4)]
    print("exact a layer", exact, "Che", che)
    assert exact == [0.625, 0.656, 0.688] and che == [0.739, 0.742, 0.745]
    # one LRU over all layers sweeps them cyclically: a step's slices evict each other
    assert [round(got[b]["exact_miss"], 3) for b in (1, 2, 4)] == [0.625, 0.807, 0.911]


def test_unique_experts_within_and_across_requests(doc, traces):
    """Panel (b) is routing_exponents on the traces: windows 2-16 of one request, 2-4
    requests."""
    u = doc["unique"]
    assert u == pe.routing_exponents(list(traces.values()), windows=lo.WINDOWS,
                                     batches=lo.INTER)
    assert [r["n"] for r in u["intra"]] == [2, 4, 8, 16]
    assert [r["n"] for r in u["inter"]] == [2, 3, 4]


def test_spread_by_hand():
    rows = [{"model": m, "family": f, "benchmark": b, "kind": k, "mixture": False,
             "fraction": 0.25, "batch": 1, "che_miss": c, "exact_layer_miss": x}
            for m, f, b, k, c, x in (
                ("a", "a", "x", "counts", 0.5, None), ("a", "a", "y", "counts", 0.6, None),
                ("b", "b", "x", "counts", 0.8, None), ("b-sft", "b", "x", "counts", 0.7, None),
                ("b", "b", "z", "counts", 0.9, None), ("t", "t", "g", "trace", 0.4, 0.3),
                ("t", "t", "h", "trace", 0.45, 0.2), ("q", "q", "m", "zipf-fit", 0.1, None))]
    rows.append({**rows[0], "batch": 2, "che_miss": 0.0})
    # the traces' mixture is not a benchmark: left out of every spread
    rows.append({**rows[5], "benchmark": "g+h", "mixture": True, "che_miss": 0.99,
                 "exact_layer_miss": 0.99})
    s = lo.locality_spread(rows)
    assert s["across_benchmarks"]["ranges"] == pytest.approx({"a": 0.1, "b": 0.1})
    assert s["across_models"]["ranges"] == pytest.approx({"x": 0.3})
    assert s["across_variants"]["ranges"] == pytest.approx({"b x": 0.1})
    assert s["ratio"] == pytest.approx(3.0)
    assert s["traces"] == pytest.approx({"exact_layer_miss": 0.1, "che_miss": 0.05})
    with pytest.raises(UserError, match="no row at fraction 0.3 and batch 1"):
        lo.locality_spread(rows, fraction=0.3)


def test_real_spread(doc):
    """The real routing's spread (the count table, a quarter of the experts, batch 1): models
    differ more than benchmarks on average, OLMoE's own domains more than the models."""
    s = doc["spread"]
    print(s)
    assert set(s["across_benchmarks"]["ranges"]) == {"mixtral-8x7b", "olmoe-1b-7b"}
    assert set(s["across_models"]["ranges"]) == {"arxiv", "book", "c4", "github", "wikipedia"}
    assert round(s["ratio"], 2) == 1.67
    assert round(s["across_benchmarks"]["ranges"]["olmoe-1b-7b"], 3) == 0.174
    assert round(s["across_models"]["mean"], 3) == 0.148
    assert round(s["traces"]["exact_layer_miss"], 3) == 0.055


def test_merged_trace_and_bad_input(traces):
    """Requests interleaved, one of each trace in turn (a batch of 2 mixes the tasks);
    router scores kept when every trace has them."""
    m = lo.merged_trace(traces)
    reqs = m.requests("decode")
    assert len(reqs) == 4 and len(m) == sum(len(t) for t in traces.values())
    assert [int(r.request) for r in reqs] == [0, 1, 2, 3]
    g, h = traces["gsm8k"].requests("decode"), traces["humaneval"].requests("decode")
    for r, src in zip(reqs, (g[0], h[0], g[1], h[1])):
        assert r.tokens == src.tokens and (r.ids == src.ids).all()
    assert m.scores is None
    from elmoe3d.sw.host.tracegen import CALIBRATED, synthetic_trace
    s1, s2 = (synthetic_trace("mixtral-8x7b", CALIBRATED["mixtral-8x7b"], tokens=3, seed=k)
              for k in (1, 2))
    both = lo.merged_trace({"a": s1, "b": s2})
    assert both.scores is not None and both.scores.shape == (len(s1) + len(s2), 8)
    assert lo.merged_trace({"a": s1, "g": traces["gsm8k"]}).scores is None
    g = traces["gsm8k"]
    import dataclasses
    top1 = dataclasses.replace(g, expert_ids=g.expert_ids[:, :1].copy(),
                               gate_weights=g.gate_weights[:, :1].copy())
    with pytest.raises(UserError, match=r"traces\['t'\]: 8 experts, top-1, 32 layers"):
        lo.merged_trace({"g": g, "t": top1})
    keep = g.layer < 16
    half = dataclasses.replace(g, request=g.request[keep], position=g.position[keep],
                               layer=g.layer[keep], phase=g.phase[keep],
                               expert_ids=g.expert_ids[keep], gate_weights=g.gate_weights[keep],
                               layer_ids=tuple(range(16)))
    with pytest.raises(UserError, match=r"traces\['h'\]: 8 experts, top-2, 16 layers"):
        lo.merged_trace({"g": g, "h": half})
    olmoe = synthetic_trace("olmoe-1b-7b", CALIBRATED["olmoe-1b-7b"], tokens=4)
    with pytest.raises(UserError, match=r"traces\['d'\]: 64 experts, top-8, 16 layers; "
                                        r"expected the first trace's 8, top-2, 32"):
        lo.merged_trace({"g": traces["gsm8k"], "d": olmoe})
    with pytest.raises(UserError, match="traces: expected"):
        lo.merged_trace({})
    for kw, match in (({"fractions": (0,)}, "fractions: expected a non-empty sequence"),
                      ({"fractions": "0.5"}, "fractions: expected a sequence"),
                      ({"batches": (0,)}, "batches"), ({"windows": (1,)}, "windows")):
        with pytest.raises(UserError, match=match):
            lo.fig16(traces, **kw)
    with pytest.raises(UserError, match="traces: expected"):
        lo.fig16([traces["gsm8k"]])

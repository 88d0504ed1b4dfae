"""Elastic-SD (elmoe3d.sw.host.elastic_sd): throttled top-k, pool selection, prefix acceptance, and
the invariants of whole runs on the real Mixtral trace and on a synthetic trace with scores."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from elmoe3d.errors import UserError
from elmoe3d.sw.host.corpus import routing_path
from elmoe3d.sw.host.elastic_sd import (BernoulliAcceptance, CoverageAcceptance, ElasticSD,
                                   accepted_prefix, original_ranking, select_pool, throttle)
from elmoe3d.sw.host.hbcache import HBExpertCache
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.trace import import_vllm_jsonl
from elmoe3d.sw.host.tracegen import CALIBRATED, synthetic_trace

MIX = model_preset("mixtral-8x7b")


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_throttle_keeps_the_original_order_inside_the_pool(data):
    E = data.draw(st.integers(1, 16))
    k = data.draw(st.integers(1, E))
    ranking = np.array(data.draw(st.permutations(range(E))))
    pool = set(data.draw(st.lists(st.integers(0, E - 1), unique=True)))
    got = throttle(ranking, pool, k).tolist()
    assert set(got) <= pool and len(got) == min(k, len(pool))
    pos = [int(np.nonzero(ranking == e)[0][0]) for e in got]
    assert pos == sorted(pos)                                 # original order kept
    # nothing better-ranked in the pool was skipped
    assert got == [int(e) for e in ranking if int(e) in pool][:k]
    mask = np.zeros(E, bool)
    mask[list(pool)] = True
    assert throttle(ranking, mask, k).tolist() == got


def test_original_ranking_with_and_without_scores():
    s = np.array([0.1, 0.4, 0.4, 0.05, 0.05])
    assert original_ranking([1, 2], 5, scores=s).tolist() == [1, 2, 0, 3, 4]   # ties: lower id
    # only the top-k known: recorded order, then the others by hotness, ties by id
    hot = np.array([0, 0, 0, 5, 2])
    assert original_ranking([2, 1], 5, fallback=hot).tolist() == [2, 1, 3, 4, 0]
    assert original_ranking([2, 1], 5).tolist() == [2, 1, 0, 3, 4]
    with pytest.raises(UserError, match="outside"):
        original_ranking([-1, 0], 5)


def test_accepted_prefix():
    assert accepted_prefix([True, False, True, True]) == 1
    assert accepted_prefix([False, True]) == 0
    assert accepted_prefix([True] * 3) == 3 and accepted_prefix([]) == 0


def test_select_pool():
    hot = np.array([[5, 0, 1, 0], [0, 0, 0, 0], [2, 2, 0, 9]])
    lids = (1, 2, 3)
    pool = select_pool(hot, 5, layer_ids=lids, min_per_layer=1)
    # floor: one per layer (the all-cold layer 2 gets its lowest id), then the hottest left
    assert len(pool) == 5 and {(1, 0), (2, 0), (3, 3)} <= set(pool)
    assert set(pool) == {(1, 0), (2, 0), (3, 3), (3, 0), (3, 1)}
    assert pool[-1] == (3, 3)                                  # hottest last (most recent)
    # a cold expert is kept only if already cached
    pool = select_pool(hot, 7, layer_ids=lids, current=[(2, 3)], min_per_layer=1)
    assert (2, 3) in pool and (2, 0) not in pool and (1, 2) in pool
    assert len(pool) == 6                                     # no new cold expert loaded
    # the floor is capped by slots // layers
    assert len(select_pool(hot, 2, layer_ids=lids, min_per_layer=2)) == 2


@pytest.fixture(scope="module")
def real():
    tr = import_vllm_jsonl(routing_path("gsm8k"), model=MIX)[0]
    return tr.select(tr.position < 30)


def slots_cache(slots, model=MIX):
    return HBExpertCache(capacity_bytes=slots * model.expert_msb_bytes, model=model,
                         admit=False)


def check_run(trace, res, cache, depth):
    """The Elastic-SD invariants on every iteration of a run."""
    p = cache.model
    lids, E, k = tuple(p.moe_layer_ids), p.routed_experts, p.top_k
    reqs = {r.request: r for r in trace.requests()}
    nxt_start = {r: depth for r in reqs}
    for it in res.iterations:
        before = set(it.pool_before)
        hot = np.zeros((len(lids), E))
        for n, r_id in enumerate(it.requests):
            rr, t0, d = reqs[r_id], it.start[n], it.drafted[n]
            assert t0 == nxt_start[r_id] and 1 <= d <= depth
            assert 0 <= it.accepted[n] <= d
            nxt_start[r_id] = t0 + min(it.accepted[n] + 1, rr.tokens - t0)
            route = it.draft_routing[n]
            for s in range(d):
                for j, lay in enumerate(lids):
                    chosen = [int(e) for e in route[s, j] if e != E]
                    in_pool = [e for e in range(E) if (lay, e) in before]
                    # draft routing confined to the pool, as many as it allows
                    assert all((lay, e) in before for e in chosen)
                    if rr.present[t0 + s, j]:
                        assert len(chosen) == min(k, len(in_pool))
                        rec = [int(e) for e in rr.ids[t0 + s, j] if (lay, int(e)) in before]
                        assert chosen[:len(rec)] == rec[:len(chosen)]   # original order
                        hot[j, rr.ids[t0 + s, j]] += 1
                    else:
                        assert chosen == []
        # next pool: from this draft's one-hot routing only, before verification
        assert it.pool_after == select_pool(hot, cache.slots, layer_ids=lids,
                                            current=it.pool_before, min_per_layer=min(k, 2))
        assert len(it.pool_after) <= cache.slots
        # verification: original routing, split by the pool the draft used
        for j, lay in enumerate(lids):
            used = set()
            for n, r_id in enumerate(it.requests):
                rr = reqs[r_id]
                for t in range(it.start[n], it.start[n] + it.drafted[n]):
                    if rr.present[t, j]:
                        used.update(int(e) for e in rr.ids[t, j])
            cached = set(it.verify_cached.get(lay, []))
            uncached = set(it.verify_uncached.get(lay, []))
            assert cached | uncached == used and not cached & uncached
            assert all((lay, e) in before for e in cached)
            assert not any((lay, e) in before for e in uncached)
        assert set(it.pool_written) == set(it.pool_after) - before
        streamed = {(lay, e) for lay, es in it.verify_uncached.items() for e in es}
        assert set(it.pool_extra) == set(it.pool_written) - streamed
    assert all(nxt_start[r] >= reqs[r].tokens for r in reqs)
    assert res.tokens == sum(r.tokens for r in reqs.values())
    steps = sum(len(es) for it in res.iterations for st_ in it.draft_steps
                for es in st_.values())
    assert res.draft_hb_bytes == steps * cache.msb_bytes
    v = res.verify
    assert v.hb_read_bytes == int(v.hits.sum()) * cache.msb_bytes
    assert v.ext_read_bytes == (int(v.hits.sum()) * cache.lsb_bytes +
                                int(v.accesses.sum() - v.hits.sum()) *
                                (cache.msb_bytes + cache.lsb_bytes))


@pytest.mark.parametrize("acceptance", [CoverageAcceptance(0.5), BernoulliAcceptance(0.7)])
def test_real_trace_invariants(real, acceptance):
    cache = slots_cache(68)                      # paper-8gb with Mixtral: 68 MSB slices
    res = ElasticSD(cache=cache, depth=4, acceptance=acceptance, min_per_layer=2).run(real)
    check_run(real, res, cache, 4)
    assert res.ranking == "top-k then hotness"
    assert 0 < res.verify.hit_rate < 1 and res.pool_write_bytes > 0
    assert cache.contents() == res.iterations[-1].pool_after
    print(acceptance, res.summary())


def test_acceptance_is_a_prefix_length(real):
    seen = []

    def reject_first(coverage, rng):
        seen.append(len(coverage))
        return np.arange(len(coverage)) > 0      # [F, T, T, T]: later passes do not count

    res = ElasticSD(cache=slots_cache(68), depth=4, acceptance=reject_first).run(real)
    assert res.accepted == 0 and res.mean_accept_length == 1.0
    assert all(a == 0 for it in res.iterations for a in it.accepted)
    res = ElasticSD(cache=slots_cache(68), depth=4,
                    acceptance=lambda c, rng: np.arange(len(c)) != 1).run(real)
    assert all(a == min(1, d) for it in res.iterations for a, d in zip(it.accepted,
                                                                       it.drafted))
    res = ElasticSD(cache=slots_cache(68), depth=4, acceptance=CoverageAcceptance(0.0)).run(real)
    assert res.accepted == res.drafted
    with pytest.raises(UserError, match="acceptance returned"):
        ElasticSD(cache=slots_cache(68), depth=4, acceptance=lambda c, r: [True]).run(real)


@pytest.mark.parametrize("t", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_coverage_acceptance_threshold_is_inclusive(t):
    """A coverage of exactly the threshold is accepted (>=, within 1e-12 of float64
    rounding); 1e-9 below it is not."""
    cov = np.array([t, min(1.0, t + 1e-9), max(0.0, t - 1e-9), 1.0, t - 2 ** -52])
    assert CoverageAcceptance(t)(cov, None).tolist() == [True, True, t == 0.0, True, True]
    # a full coverage summed in another order rounds a unit below 1: still accepted
    assert 0.7 + 0.1 + 0.1 + 0.1 < 1.0
    assert CoverageAcceptance(1.0)(np.array([0.7 + 0.1 + 0.1 + 0.1]), None).tolist() == [True]


def test_coverage_one_accepts_exactly_the_untouched_tokens(real):
    """``CoverageAcceptance(1.0)`` on the real trace: a draft token is accepted iff the pool
    held every expert of its original routing in every layer (coverage exactly 1), up to the
    first that was not; the run has both kinds."""
    res = ElasticSD(cache=slots_cache(150), depth=4,
                    acceptance=CoverageAcceptance(1.0)).run(real)
    full = [c == 1.0 for it in res.iterations for c in it.coverage]
    assert any(f.any() for f in full) and not all(f.all() for f in full)
    got = [a for it in res.iterations for a in it.accepted]
    assert got == [accepted_prefix(f) for f in full]
    print(res.summary())
    assert 0 < res.accepted < res.drafted


def test_batched_run_and_scores_ranking():
    """Synthetic routing with full scores, two requests in lockstep: the draft's experts are
    the k best-scored experts of the pool, in score order."""
    tr = synthetic_trace("mixtral-8x7b", CALIBRATED["mixtral-8x7b"], requests=2, tokens=14,
                         seed=7)
    cache = slots_cache(80)
    res = ElasticSD(cache=cache, depth=3, acceptance=BernoulliAcceptance(0.6),
                    seed=1).run(tr, batch=2)
    check_run(tr, res, cache, 3)
    assert res.ranking == "scores"
    reqs = {r.request: r for r in tr.requests()}
    for it in res.iterations:
        assert len(it.requests) >= 1
        pool = set(it.pool_before)
        for n, r_id in enumerate(it.requests):
            rr = reqs[r_id]
            for s in range(it.drafted[n]):
                for j in range(32):
                    order = np.argsort(-rr.scores[it.start[n] + s, j], kind="stable")
                    want = [int(e) for e in order if (j, int(e)) in pool][:2]
                    assert [int(e) for e in it.draft_routing[n][s, j] if e != 8] == want


def test_throttled_weights():
    tr = synthetic_trace("mixtral-8x7b", CALIBRATED["mixtral-8x7b"], tokens=3, seed=2)
    rr = tr.requests()[0]
    sd = ElasticSD(cache=slots_cache(64), depth=1, acceptance=CoverageAcceptance(1.0))
    mask = np.zeros(8, bool)
    mask[[5, 6, 7]] = True
    ids, w = sd.throttled(rr, 0, 0, mask, np.zeros(8))
    sc = rr.scores[0, 0, ids].astype(np.float64)
    np.testing.assert_allclose(w, sc / sc.sum())            # Mixtral renormalises
    # without scores: recorded weights, the k-th recorded weight for unrecorded experts
    no = dataclasses.replace(tr, scores=None)
    rr = no.requests()[0]
    first = int(rr.ids[0, 0, 0])
    mask = np.zeros(8, bool)
    mask[first] = True
    other = next(e for e in range(8) if e not in rr.ids[0, 0])
    mask[other] = True
    ids, w = sd.throttled(rr, 0, 0, mask, np.zeros(8))
    assert ids.tolist() == [first, other]
    raw = np.array([rr.weights[0, 0, 0], rr.weights[0, 0, 1]], np.float64)
    np.testing.assert_allclose(w, raw / raw.sum())


def test_parameter_errors():
    with pytest.raises(UserError, match="admit=False"):
        ElasticSD(cache=HBExpertCache(capacity_bytes=1 << 40, model=MIX), depth=2,
                  acceptance=CoverageAcceptance(0.5))
    for kw, words in ((dict(depth=0), "depth"), (dict(acceptance=0.5), "acceptance"),
                      (dict(min_per_layer=-1), "min_per_layer")):
        args = dict(cache=slots_cache(4), depth=2, acceptance=CoverageAcceptance(0.5))
        args.update(kw)
        with pytest.raises(UserError, match=words):
            ElasticSD(**args)
    with pytest.raises(UserError, match="threshold"):
        CoverageAcceptance(1.5)
    with pytest.raises(UserError, match="alpha"):
        BernoulliAcceptance(-0.1)
    tr = synthetic_trace("olmoe-1b-7b", CALIBRATED["olmoe-1b-7b"], tokens=3)
    with pytest.raises(UserError, match="are not the MoE layers of"):
        ElasticSD(cache=slots_cache(4), depth=2, acceptance=CoverageAcceptance(0.5)).run(tr)


def test_bernoulli_alpha_measures_its_rate(real):
    """The paper's acceptance rate (accepted / judged) of BernoulliAcceptance(A) is A; accepted
    / drafted is lower (positions past the first rejection are drafted, never judged). Seeds
    0-9 pooled: about 500 judged tokens, a binomial standard error near 0.02."""
    acc = judged = drafted = 0
    for seed in range(10):
        res = ElasticSD(cache=slots_cache(68), depth=4, acceptance=BernoulliAcceptance(0.72),
                        seed=seed).run(real)
        assert res.judged == sum(min(a + 1, d) for it in res.iterations
                                 for a, d in zip(it.accepted, it.drafted))
        assert res.summary()["alpha"] == res.alpha
        acc, judged, drafted = acc + res.accepted, judged + res.judged, drafted + res.drafted
    print(f"seeds 0-9: {acc}/{judged} judged ({acc / judged:.3f}), {acc}/{drafted} drafted")
    assert acc / judged == pytest.approx(0.72, abs=0.05)
    assert acc / drafted < 0.6
    every = ElasticSD(cache=slots_cache(68), depth=4, acceptance=CoverageAcceptance(0.0)).run(real)
    assert every.alpha == 1.0 and every.judged == every.drafted

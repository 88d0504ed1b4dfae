"""Routing statistics and the synthetic generator (elmoe3d.sw.host.tracegen): the README's figures
measured on the real traces, the generator's calibration against them, its parameters' effect.

Calibration recipe (what CALIBRATED holds; run once, ~10 s):
    fit_synthetic("mixtral-8x7b", {"hot_ratio_median": 1.47, "overlap": 0.743,
                  "top1_weight": 0.705}, requests=2, tokens=150)
over zipf x correlation x temperature, then OLMoE's zipf scanned at temperature 1 against the
count table's median hot ratios (docs/traces.md)."""

import numpy as np
import pytest

from elmoe3d.errors import UserError
from elmoe3d.sw.host.corpus import traces_dir
from elmoe3d.sw.host.trace import import_vllm_jsonl
from elmoe3d.sw.host.tracegen import (CALIBRATED, SyntheticRouting, count_skew, expert_count_table,
                                 fit_synthetic, routing_stats, synthetic_trace)

FILES = ("gsm8k_2_routing.jsonl", "humaneval_2_routing.jsonl")


@pytest.fixture(scope="module")
def real_stats():
    return {f: routing_stats(import_vllm_jsonl(traces_dir() / f, model="mixtral-8x7b")[0])
            for f in FILES}


def test_readme_figures_on_the_real_traces(real_stats):
    """README: top-1 weight 0.69-0.72; hottest expert 1.14-1.89x the mean (median 1.47);
    same top-2 set 10-15% of consecutive tokens; overlap 0.7-0.8 of 2."""
    for s in real_stats.values():
        assert 0.69 <= s.top1_weight <= 0.72
        assert 1.13 <= s.hot_ratio.min() and s.hot_ratio.max() <= 1.89
        assert abs(s.hot_ratio_median - 1.47) < 0.01
        assert 0.095 <= s.same_set <= 0.15
        assert 0.68 <= s.overlap <= 0.80
        assert s.hot_ratio.shape == (32,) and (s.never_chosen == 0).all()


def test_count_table_figures():
    """README: OLMoE hottest expert 2.5-7.8x the mean load; top-1 only up to ~35x, with some
    experts never chosen."""
    tab = expert_count_table()
    olmoe = [count_skew(c) for (m, v, d, lay), c in tab.items()
             if m == "olmoe" and v == "expert_counts"]
    top1 = [c for (m, v, d, lay), c in tab.items() if m == "olmoe" and v == "expert_counts_top1"]
    assert len(olmoe) == 18 and all(len(c) == 64 for c in top1)
    assert 2.49 <= min(olmoe) < 2.51 and 7.8 < max(olmoe) <= 7.82   # README rounds
    assert 34 <= max(count_skew(c) for c in top1) <= 37
    assert any((c == 0).any() for c in top1)
    mix = [c for (m, v, d, lay), c in tab.items() if m == "mistral"]
    assert all(len(c) == 8 for c in mix) and {lay for (m, v, d, lay) in tab} == {0, 7, 15}


def test_count_table_errors(tmp_path):
    bad = tmp_path / "c.csv"
    bad.write_text("model,variant,domain,layer,expert,count\nolmoe,x,d,0,0,-3\n")
    with pytest.raises(UserError, match=r"c.csv:2"):
        expert_count_table(bad)
    bad.write_text("model,variant,domain,layer,expert,count\nolmoe,x,d,0,1,3\n")
    with pytest.raises(UserError, match="not 0..0"):
        expert_count_table(bad)
    bad.write_text("a,b\n")
    with pytest.raises(UserError, match="header"):
        expert_count_table(bad)


def _mean_summary(model, params, seeds, **kw):
    rows = [routing_stats(synthetic_trace(model, params, seed=s, **kw)).summary()
            for s in seeds]
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def test_mixtral_calibration_matches_the_real_traces(real_stats):
    gen = _mean_summary("mixtral-8x7b", CALIBRATED["mixtral-8x7b"], range(4), requests=2,
                        tokens=150)
    real = {k: np.mean([s.summary()[k] for s in real_stats.values()]) for k in gen}
    print("real", real, "\ngenerated", gen)
    assert abs(gen["hot_ratio_median"] - real["hot_ratio_median"]) < 0.06
    assert abs(gen["overlap"] - real["overlap"]) < 0.05
    assert abs(gen["top1_weight"] - real["top1_weight"]) < 0.02
    assert 0.08 <= gen["same_set"] <= 0.15


def test_olmoe_calibration_matches_the_count_table():
    tab = expert_count_table()
    real = np.median([count_skew(c) for (m, v, d, lay), c in tab.items()
                      if m == "olmoe" and v == "expert_counts"])
    real1 = np.median([count_skew(c) for (m, v, d, lay), c in tab.items()
                       if m == "olmoe" and v == "expert_counts_top1"])
    s = routing_stats(synthetic_trace("olmoe-1b-7b", CALIBRATED["olmoe-1b-7b"], tokens=1500))
    print(f"real {real:.2f} / {real1:.2f}, generated {s.hot_ratio_median:.2f} / "
          f"{np.median(s.hot_ratio_top1):.2f}")
    assert abs(s.hot_ratio_median - real) < 0.35
    assert abs(np.median(s.hot_ratio_top1) - real1) < 2.5


def test_parameters_move_the_figures_they_name():
    base = dict(requests=1, tokens=300, seed=5)
    lo = routing_stats(synthetic_trace("mixtral-8x7b", SyntheticRouting(0.0, 0.3, 1.0), **base))
    hi = routing_stats(synthetic_trace("mixtral-8x7b", SyntheticRouting(1.0, 0.3, 1.0), **base))
    assert hi.hot_ratio_median > lo.hot_ratio_median + 0.5
    lo = routing_stats(synthetic_trace("mixtral-8x7b", SyntheticRouting(0.3, 0.0, 1.0), **base))
    hi = routing_stats(synthetic_trace("mixtral-8x7b", SyntheticRouting(0.3, 0.9, 1.0), **base))
    assert hi.overlap > lo.overlap + 0.4 and hi.same_set > lo.same_set
    # uncorrelated, unskewed routing: overlap at chance (k^2/E = 0.5)
    assert abs(lo.overlap - 0.5) < 0.08


def test_generated_trace_is_consistent_and_deterministic():
    p = CALIBRATED["mixtral-8x7b"]
    a = synthetic_trace("mixtral-8x7b", p, requests=2, tokens=20, seed=3)
    b = synthetic_trace("mixtral-8x7b", p, requests=2, tokens=20, seed=3)
    np.testing.assert_array_equal(a.expert_ids, b.expert_ids)
    assert a.has_scores and a.weights_renormalised and a.token_count() == 40
    # ids and weights are what the model's router makes of the stored scores
    order = np.argsort(-a.scores, axis=1, kind="stable")[:, :2]
    np.testing.assert_array_equal(a.expert_ids, order)
    top = np.take_along_axis(a.scores, order, 1)
    np.testing.assert_allclose(a.gate_weights, top / top.sum(1, keepdims=True), rtol=1e-5)
    c = synthetic_trace("mixtral-8x7b", p, requests=2, tokens=20, seed=4)
    assert (c.expert_ids != a.expert_ids).any()


def test_fit_recovers_known_parameters():
    truth = SyntheticRouting(zipf=0.6, correlation=0.6, temperature=1.0)
    target = routing_stats(synthetic_trace("mixtral-8x7b", truth, tokens=300, seed=11)).summary()
    p, got = fit_synthetic("mixtral-8x7b", {k: target[k] for k in
                                            ("hot_ratio_median", "overlap", "top1_weight")},
                           tokens=300, seed=11,
                           grid={"zipf": (0.2, 0.6, 1.0), "correlation": (0.2, 0.6, 0.9),
                                 "temperature": (0.5, 1.0, 2.0)})
    assert p == truth


def test_bad_parameters():
    with pytest.raises(ValueError, match="correlation"):
        SyntheticRouting(0.1, 1.0, 1.0)
    with pytest.raises(ValueError, match="zipf"):
        SyntheticRouting(-1, 0.1, 1.0)
    with pytest.raises(ValueError, match="temperature"):
        SyntheticRouting(0.1, 0.1, 0.0)
    with pytest.raises(UserError, match="tokens"):
        synthetic_trace("mixtral-8x7b", CALIBRATED["mixtral-8x7b"], tokens=0)
    with pytest.raises(UserError, match="unknown figure"):
        fit_synthetic("mixtral-8x7b", {"entropy": 1.0})
    with pytest.raises(UserError, match="grid"):
        fit_synthetic("mixtral-8x7b", {"overlap": 1.0}, grid={"depth": (1,)})

"""Elastic-SD audit fixes: an acceptance rule's return must be one bool per draft token
(probabilities or strings are not verdicts), and the public helpers and constructors refuse
nonsense with a named UserError instead of running on it or failing inside NumPy."""

import dataclasses

import numpy as np
import pytest

from elmoe3d.errors import UserError
from elmoe3d.sw.host.elastic_sd import (BernoulliAcceptance, CoverageAcceptance, ElasticSD,
                                        accepted_prefix, original_ranking, select_pool,
                                        select_pool_indices, throttle)
from elmoe3d.sw.host.hbcache import HBExpertCache
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.tracegen import CALIBRATED, synthetic_trace

MIX = model_preset("mixtral-8x7b")


def esd(acceptance, **kw):
    cache = HBExpertCache(capacity_bytes=68 * MIX.expert_msb_bytes, model=MIX.name, admit=False)
    return ElasticSD(cache=cache, depth=3, acceptance=acceptance, **kw)


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace("mixtral-8x7b", CALIBRATED["mixtral-8x7b"], requests=2, tokens=12,
                           seed=5)


# -- the acceptance rule's return (a wrong result before: every float or string was True) ----

@pytest.mark.parametrize("rule, words", [
    (lambda c, r: np.full(len(c), 0.3), "acceptance returned float64 of shape (3,), expected "
                                        "bool of shape (3,)"),
    (lambda c, r: np.array(["no"] * len(c)), "acceptance returned <U2 of shape (3,), expected "
                                             "bool of shape (3,)"),
    (lambda c, r: [0.3] * len(c), "acceptance returned a list read as float64 of shape (3,)"),
    (lambda c, r: np.ones(len(c), np.int64), "acceptance returned int64 of shape (3,)"),
    (lambda c, r: None, "acceptance returned None, expected bool of shape (3,)"),
    (lambda c, r: [True], "acceptance returned a list read as bool of shape (1,), expected "
                          "bool of shape (3,)"),
    (lambda c, r: np.ones((len(c), 1), bool), "acceptance returned bool of shape (3, 1)"),
])
def test_acceptance_return_must_be_bools(trace, rule, words):
    with pytest.raises(UserError) as exc:
        esd(rule).run(trace)
    assert words in str(exc.value)


def test_acceptance_bool_returns_still_count(trace):
    """Bools (an array or a list of Python bools) are verdicts; the built-in rules unchanged."""
    n_all = esd(lambda c, r: [True] * len(c)).run(trace)
    assert n_all.accepted == n_all.drafted > 0
    none = esd(lambda c, r: np.zeros(len(c), bool)).run(trace)
    assert none.accepted == 0
    first = esd(lambda c, r: np.arange(len(c)) == 0).run(trace)
    assert all(a == min(1, d) for it in first.iterations
               for a, d in zip(it.accepted, it.drafted))
    assert esd(CoverageAcceptance(0.0)).run(trace).accepted == n_all.drafted
    b1, b2 = (esd(BernoulliAcceptance(0.6), seed=3).run(trace) for _ in range(2))
    assert b1.accepted == b2.accepted and 0 < b1.accepted < b1.drafted


@pytest.mark.parametrize("accept, words", [
    ([0.3, 0.3], "accept: expected a bool array [n], got float64 of shape (2,)"),
    (np.array(["no"]), "accept: expected a bool array [n], got <U2 of shape (1,)"),
    ([[True]], "accept: expected a bool array [n], got bool of shape (1, 1)"),
])
def test_accepted_prefix_refuses_non_bools(accept, words):
    with pytest.raises(UserError) as exc:
        accepted_prefix(accept)
    assert words in str(exc.value)
    assert accepted_prefix(np.array([True, True, False])) == 2 and accepted_prefix([]) == 0


# -- the constructors --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", ["x", -1, 1.5, True, None])
def test_elastic_sd_seed(seed):
    with pytest.raises(UserError) as exc:
        esd(CoverageAcceptance(0.5), seed=seed)
    assert str(exc.value) == f"seed: expected an integer >= 0, got {seed!r}"


def test_elastic_sd_numpy_seed_runs(trace):
    a = esd(BernoulliAcceptance(0.5), seed=np.int64(7)).run(trace)
    b = esd(BernoulliAcceptance(0.5), seed=7).run(trace)
    assert a.accepted == b.accepted


@pytest.mark.parametrize("cls, name", [(CoverageAcceptance, "threshold"),
                                       (BernoulliAcceptance, "alpha")])
@pytest.mark.parametrize("value", ["0.5", None, True, np.True_, float("nan"), 1.5, -0.1,
                                   [0.5]])
def test_acceptance_parameter(cls, name, value):
    with pytest.raises(UserError) as exc:
        cls(value)
    assert str(exc.value) == f"{name}: expected a number in [0, 1], got {value!r}"


@pytest.mark.parametrize("cls", [CoverageAcceptance, BernoulliAcceptance])
@pytest.mark.parametrize("value", [0, 1, 0.5, np.float32(0.25), np.int64(1)])
def test_acceptance_parameter_in_range(cls, value):
    rule = cls(value)
    assert dataclasses.astuple(rule) == (value,)
    assert rule(np.array([1.0] * 4), np.random.default_rng(0)).dtype == bool


# -- the public helpers ------------------------------------------------------------------------

@pytest.mark.parametrize("kw, words", [
    (dict(slots=-1), "slots: expected an integer >= 0, got -1"),
    (dict(slots=True), "slots: expected an integer >= 0, got True"),
    (dict(slots=1.5), "slots: expected an integer >= 0, got 1.5"),
    (dict(min_per_layer=-1), "min_per_layer: expected an integer >= 0, got -1"),
    (dict(min_per_layer=True), "min_per_layer: expected an integer >= 0, got True"),
    (dict(hotness=np.ones(3)), "hotness: expected a [layers, experts] array, got shape (3,)"),
    (dict(hotness=np.full((2, 3), np.nan)), "hotness: expected finite counts >= 0"),
    (dict(hotness=-np.ones((2, 3))), "hotness: expected finite counts >= 0"),
    (dict(hotness="abc"), "hotness: expected a [layers, experts] array of counts, got str"),
    (dict(layer_ids=[0]), "hotness: 2 layers but 1 layer ids"),
])
def test_select_pool_refuses(kw, words):
    args = dict(hotness=np.ones((2, 3)), slots=4, layer_ids=[0, 1], min_per_layer=1)
    args.update(kw)
    h, slots = args.pop("hotness"), args.pop("slots")
    with pytest.raises(UserError) as exc:
        select_pool(h, slots, **args)
    assert words in str(exc.value)
    with pytest.raises(UserError) as exc:
        select_pool_indices(h, slots, current=np.zeros((2, 3), bool), **args)
    assert words in str(exc.value)


def test_select_pool_indices_current_shape():
    with pytest.raises(UserError, match=r"current: expected a bool mask of shape \(2, 3\), "
                                        r"got bool of shape \(3,\)"):
        select_pool_indices(np.ones((2, 3)), 4, layer_ids=[0, 1], current=np.zeros(3, bool))


def test_select_pool_slots_zero_and_numpy_counts():
    h = np.array([[3, 0, 1], [0, 2, 0]])
    assert select_pool(h, 0, layer_ids=[0, 1]) == []
    assert select_pool(h, np.int64(2), layer_ids=[0, 1]) == [(1, 1), (0, 0)]


@pytest.mark.parametrize("args, words", [
    (([0, 1, 2], {0, 1, 2}, -1), "k: expected an integer >= 0, got -1"),
    (([0, 1, 2], {0, 1, 2}, 1.5), "k: expected an integer >= 0, got 1.5"),
    (([0, 1, 2], {0, 1, 2}, True), "k: expected an integer >= 0, got True"),
    (([0, 5], np.array([True, False]), 2), "ranking: [0, 5] outside the pool mask's 0..1"),
    (([0, -1], np.array([True, False]), 2), "ranking: [0, -1] outside the pool mask's 0..1"),
    (([0, 1, 1], {0, 1}, 2), "ranking: expert id 1 repeats in the row [0, 1, 1]"),
    (([0.0, 1.5], {0, 1}, 2), "ranking: expected one row of integer expert ids"),
])
def test_throttle_refuses(args, words):
    with pytest.raises(UserError) as exc:
        throttle(*args)
    assert words in str(exc.value)


def test_throttle_k_values():
    """k = -1 dropped the last pooled expert before; 0 keeps none; a NumPy k counts."""
    assert throttle([2, 0, 1], {0, 1, 2}, 0).tolist() == []
    assert throttle([2, 0, 1], {0, 1, 2}, np.int64(2)).tolist() == [2, 0]
    assert throttle([2, 0, 1], {0, 1, 2}, 3).tolist() == [2, 0, 1]


@pytest.mark.parametrize("args, kw, words", [
    (([1, 1], 4), {}, "topk_ids: expert id 1 repeats in the row [1, 1]"),
    (([3, 0, 3], 4), {}, "topk_ids: expert id 3 repeats in the row [3, 0, 3]"),
    (([1.5], 4), {}, "topk_ids: expected one row of integer expert ids, got [1.5]"),
    (([1], 4), dict(fallback=[1, 2]), "fallback: expected 4 finite values, got shape (2,)"),
    (([1], 0), {}, "num_experts: expected a positive integer, got 0"),
    (([1], True), {}, "num_experts: expected a positive integer, got True"),
])
def test_original_ranking_refuses(args, kw, words):
    with pytest.raises(UserError) as exc:
        original_ranking(*args, **kw)
    assert words in str(exc.value)


def test_original_ranking_distinct_row_unchanged():
    assert original_ranking(np.array([3, 1], np.int16), 4).tolist() == [3, 1, 0, 2]
    assert original_ranking([], 3).tolist() == [0, 1, 2]

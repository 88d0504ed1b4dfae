"""The host layer's public entry points refuse what the audit found them accepting or failing
on with a raw error: the perf model's per-expert figures and slices (tokens, phase, cached,
PEs), steps priced for a model or configuration they were not scheduled for, compile_group's
``cached``, replay_steps / elastic_steps' ``batch``, ``layers`` and trace, the HB cache's
membership test and capacity from a preset name, and HomeGroups' table of layers."""

import dataclasses

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.errors import UserError
from elmoe3d.sw.host import compiler as host, perf
from elmoe3d.sw.host.backends.perf import run_perf
from elmoe3d.sw.host.compiler import HomeGroups, synthetic_experts
from elmoe3d.sw.host.elastic_sd import CoverageAcceptance, ElasticSD
from elmoe3d.sw.host.hbcache import HBExpertCache, hb_capacity_bytes
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.parallel import compile_group
from elmoe3d.sw.host.perf import PerfModel, channel_slices, token_slices
from elmoe3d.sw.host.tracegen import CALIBRATED, synthetic_trace

MIX = "mixtral-8x7b"
OLMOE = "olmoe-1b-7b"
ARCH = preset("paper-8gb")


def big_cache(model, admit=True):
    return HBExpertCache(capacity_bytes=10 ** 12, model=model, admit=admit)


def trace(model, tokens=3):
    return synthetic_trace(model, CALIBRATED[model], tokens=tokens)


def elastic(model, arch=ARCH, tokens=6):
    slots = 3 * len(model_preset(model).moe_layer_ids)
    cache = HBExpertCache(capacity_bytes=slots * model_preset(model).expert_msb_bytes,
                          model=model, admit=False)
    esd = ElasticSD(cache=cache, depth=2, acceptance=CoverageAcceptance(0.5))
    steps, _ = host.elastic_steps(trace(model, tokens), esd, groups=arch.groups)
    return steps


# ---- the perf model's per-expert figures and slices -----------------------------------------

@pytest.mark.parametrize("method", ["expert", "compute"])
@pytest.mark.parametrize("kw, msg", [
    (dict(tokens=-3), "tokens: expected a positive integer, got -3"),
    (dict(tokens=0), "tokens: expected a positive integer, got 0"),
    (dict(tokens=2.5), "tokens: expected a positive integer, got 2.5"),
    (dict(tokens=2.0), "tokens: expected a positive integer, got 2.0"),
    (dict(tokens=True), "tokens: expected a positive integer, got True"),
    (dict(phase="foo"), "phase: expected one of ('draft', 'verify'), got 'foo'"),
    (dict(cached=1), "cached: expected a bool, got 1"),
])
def test_perf_expert_and_compute_refuse_bad_arguments(method, kw, msg):
    pm = PerfModel(ARCH, MIX)
    args = dict(tokens=2, phase="verify", cached=False) | kw
    # a good call first: the memo holds key (2, "verify", False), which 2.0 and True hash as
    pm.expert(0, 2, phase="verify", cached=False)
    pm.compute(2, phase="verify", cached=False)
    call = (lambda: pm.expert(0, args["tokens"], phase=args["phase"], cached=args["cached"])) \
        if method == "expert" else \
        (lambda: pm.compute(args["tokens"], phase=args["phase"], cached=args["cached"]))
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_perf_expert_takes_numpy_counts_and_flags():
    """A NumPy count is priced as the Python int (its figures were computed in int32 and
    overflowed, then kept in the memo for every later call with that count)."""
    perf._shared_memo.cache_clear()             # the memo's first entry for this key is ours
    pm = PerfModel(ARCH, MIX)
    b = pm.expert(0, np.int32(3), phase="verify", cached=np.True_)
    c, r = pm.compute(np.int32(3), phase="verify", cached=np.True_)
    ref = pm._expert(0, 3, phase="verify", cached=True)
    assert (b.hb_bytes, b.ext_bytes, b.w4_macs, b.w8_macs) == \
        (ref.hb_bytes, ref.ext_bytes, ref.w4_macs, ref.w8_macs)
    assert all(type(x) is int for x in b.w4_macs + b.w8_macs)
    want = pm.calib.expert("verify", True, 3, ref.w4_macs, ref.w8_macs)
    assert (c == want).all() and (c > 0).all()


@pytest.mark.parametrize("call, msg", [
    (lambda: token_slices(3, 0), "pes: expected a positive integer, got 0"),
    (lambda: token_slices(-3, 2), "rbn: expected an integer >= 0, got -3"),
    (lambda: token_slices(3, 1.5), "pes: expected a positive integer, got 1.5"),
    (lambda: channel_slices(128, 0), "pes: expected a positive integer, got 0"),
    (lambda: channel_slices(100, 4), "channels: expected a multiple of 32"),
    (lambda: channel_slices(10, 4), "channels: expected a multiple of 32"),
    (lambda: channel_slices(-32, 4), "channels: expected an integer >= 0, got -32"),
])
def test_slices_refuse_bad_arguments(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_slices_values():
    assert token_slices(5, 2) == [3, 2] and token_slices(0, 3) == [0, 0, 0]
    assert channel_slices(2880, 4) == [736, 736, 704, 704]


# ---- steps priced for another model or configuration ----------------------------------------

@pytest.fixture(scope="module")
def mix_steps():
    return elastic(MIX)


def test_run_perf_refuses_steps_of_a_model_with_other_layers(mix_steps):
    # Mixtral's 32 layers on OLMoE's 16 (was priced as OLMoE); first refused for its top-k,
    # on an OLMoE of Mixtral's top-2 for its layers
    with pytest.raises(ValueError, match=r"step 0: layer 0: routing of shape \(\d+, 2\); "
                                         r"olmoe-1b-7b routes top-8"):
        run_perf(mix_steps, ARCH, OLMOE)
    top2 = dataclasses.replace(model_preset(OLMOE), name="olmoe-top2", top_k=2)
    with pytest.raises(ValueError, match=r"step 0: layer 16 is not a MoE layer of olmoe-top2 "
                                         r"\(0\.\.15\): steps of another model\?"):
        run_perf(mix_steps, ARCH, top2)


def test_run_perf_refuses_steps_of_a_model_with_fewer_experts():
    top8 = dataclasses.replace(model_preset(MIX), name="mixtral-top8", top_k=8)
    steps = elastic(OLMOE)                      # schedule arrays (StepWork): ids up to 63
    with pytest.raises(ValueError, match=r"step \d+: layer \d+: expert id \d+; mixtral-top8 "
                                         r"has experts 0\.\.7: steps of another model"):
        run_perf(steps, ARCH, top8)
    # replay steps (placements only): the same refusal, not an IndexError
    rs = host.replay_steps(trace(OLMOE), big_cache(OLMOE), groups=ARCH.groups)
    with pytest.raises(ValueError, match=r"step 0: layer 0: expert id \d+ outside 0\.\.7: a "
                                         r"step of another model\?"):
        run_perf(rs, ARCH, top8)


def test_run_perf_refuses_steps_of_another_top_k(mix_steps):
    # Mixtral (top-2, 8 experts, 32 layers) fits Qwen3's 48 layers and 128 experts
    with pytest.raises(ValueError, match=r"step 0: layer 0: routing of shape \(\d+, 2\); "
                                         r"qwen3-30b-a3b routes top-8"):
        run_perf(mix_steps, ARCH, "qwen3-30b-a3b")


def test_run_perf_refuses_steps_of_more_groups(mix_steps):
    # paper-8gb's 8 groups priced on paper-4gb's 4: group 4 fell into the next row's cells
    with pytest.raises(ValueError, match=r"paper-4gb has groups 0\.\.3"):
        run_perf(mix_steps, preset("paper-4gb"), MIX)


@pytest.mark.parametrize("field, value, msg", [
    ("group", 8, r"pool write into group 8; paper-8gb has groups 0\.\.7: steps of another "
                 r"configuration\?"),
    ("layer", 40, r"pool write into layer 40, which is not a MoE layer of mixtral-8x7b "
                  r"\(0\.\.31\)"),
])
def test_run_perf_refuses_a_pool_write_outside_the_configuration(mix_steps, field, value, msg):
    """Only a pool write out of range (its step's routed experts all fit): a review's
    mutation removing the writes' range check survived the group test above, which the
    routed experts' own check catches first."""
    st = next(s for s in mix_steps if len(s.writes))
    w = st.writes
    arrays = {k: getattr(w, k).copy() for k in ("layer", "expert", "group", "extra")}
    arrays[field][0] = value
    bad = dataclasses.replace(st, writes=host.PoolWrites(**arrays))
    with pytest.raises(ValueError, match=rf"step {st.index}: " + msg):
        run_perf([bad], ARCH, MIX)


def test_steps_summary_refuses_steps_of_another_top_k(mix_steps):
    pm = PerfModel(ARCH, "qwen3-30b-a3b")
    with pytest.raises(ValueError, match=r"step 0: layer 0: routing of shape \(\d+, 2\); "
                                         r"qwen3-30b-a3b routes top-8"):
        pm.steps_summary(mix_steps[:3])


def test_run_perf_prices_fitting_steps(mix_steps):
    recs = run_perf(mix_steps, ARCH, MIX)
    assert len(recs) == len(mix_steps) and all(r["cycles"] > 0 for r in recs)


# ---- compile_group's cached ---------------------------------------------------------------

@pytest.fixture(scope="module")
def group_args():
    rng = np.random.default_rng(0)
    exs = synthetic_experts(rng, 4, 64, 128)
    x = rng.standard_normal((3, 64))
    ids = np.array([[0, 1], [1, 2], [3, -1]])
    w = np.array([[0.6, 0.4], [0.5, 0.5], [1.0, 0.0]])
    return x, exs, (ids, w)


@pytest.mark.parametrize("cached, msg", [
    ([1.5], "cached: expected integer expert ids, got 1.5"),
    ([True], "cached: expected integer expert ids, got True"),
    (["a"], "cached: expected integer expert ids, got 'a'"),
    (1, "cached: expected an iterable of expert ids, got 1"),
    ("01", "cached: expected an iterable of expert ids, got '01'"),
])
def test_compile_group_refuses_bad_cached(group_args, cached, msg):
    x, exs, routing = group_args
    with pytest.raises(ValueError, match=msg):
        compile_group(x, exs, routing, phase="verify", config=preset("small"), cached=cached)


def test_compile_group_cached_from_a_generator(group_args):
    x, exs, routing = group_args
    a = compile_group(x, exs, routing, phase="verify", config=preset("small"), cached=[0, 1])
    b = compile_group(x, exs, routing, phase="verify", config=preset("small"),
                      cached=(e for e in np.array([0, 1])))
    assert [a.info["experts"][e]["hb"] for e in range(4)] == \
        [b.info["experts"][e]["hb"] for e in range(4)] == [True, True, False, False]


# ---- replay_steps and elastic_steps --------------------------------------------------------

@pytest.mark.parametrize("kw, msg", [
    (dict(batch=0), "batch: expected a positive integer, got 0"),
    (dict(batch=1.5), "batch: expected a positive integer, got 1.5"),
    (dict(batch=True), "batch: expected a positive integer, got True"),
    (dict(layers=5), "layers: expected MoE-layer ids of mixtral-8x7b, got 5"),
    (dict(layers="3"), "layers: expected MoE-layer ids of mixtral-8x7b, got '3'"),
    (dict(layers=[99]), r"layers: 99 is not a MoE layer of mixtral-8x7b \(0\.\.31\)"),
    (dict(layers=[1.0]), r"layers: 1\.0 is not a MoE layer of mixtral-8x7b"),
    (dict(layers=[]), "layers: expected at least one MoE layer of mixtral-8x7b, got none"),
])
def test_replay_steps_refuses_bad_arguments(kw, msg):
    with pytest.raises(UserError, match=msg):
        host.replay_steps(trace(MIX), big_cache(MIX), **kw)


def test_replay_steps_refuses_a_trace_of_another_model():
    with pytest.raises(UserError, match=r"trace layers \(0, 1, 2\)\.\.\. are not the MoE "
                                        r"layers of mixtral-8x7b"):
        host.replay_steps(trace(OLMOE), big_cache(MIX))
    tr = trace(MIX)
    ids = np.asarray(tr.expert_ids)
    third = np.array([min(set(range(8)) - set(r.tolist())) for r in ids])[:, None]
    t3 = dataclasses.replace(tr, expert_ids=np.hstack([ids, third]),
                             gate_weights=np.hstack([tr.gate_weights,
                                                     np.zeros((len(ids), 1), np.float32)]))
    with pytest.raises(UserError, match="trace routes top-3, mixtral-8x7b top-2"):
        host.replay_steps(t3, big_cache(MIX))
    # elastic_steps and ElasticSD.run by the same rule (a review: a raw NumPy broadcast error)
    esd = ElasticSD(cache=big_cache(MIX, admit=False), depth=2,
                    acceptance=CoverageAcceptance(0.5))
    with pytest.raises(UserError, match="trace routes top-3, mixtral-8x7b top-2"):
        host.elastic_steps(t3, esd, groups=preset("paper-8gb").groups)
    with pytest.raises(UserError, match="trace routes top-3, mixtral-8x7b top-2"):
        esd.run(t3)
    with pytest.raises(UserError, match=r"--model mixtral-8x7b: the trace has 8 experts, top-3"):
        host.check_model_trace(t3, MIX)


def test_replay_steps_layers_kept():
    steps = host.replay_steps(trace(MIX), big_cache(MIX), layers=np.array([3, 5]), batch=1)
    assert steps and all(set(st.layers) <= {3, 5} for st in steps)
    assert any(set(st.layers) == {3, 5} for st in steps)


@pytest.mark.parametrize("layers, msg", [
    ([99], r"layers: 99 is not a MoE layer of mixtral-8x7b \(0\.\.31\)"),
    (5, "layers: expected MoE-layer ids of mixtral-8x7b, got 5"),
    ([], "layers: expected at least one MoE layer"),
])
def test_elastic_steps_refuses_bad_layers(layers, msg):
    esd = ElasticSD(cache=big_cache(MIX, admit=False), depth=2,
                    acceptance=CoverageAcceptance(0.5))
    with pytest.raises(UserError, match=msg):
        host.elastic_steps(trace(MIX), esd, layers=layers)


# ---- the HB cache ---------------------------------------------------------------------------

def test_cache_membership_of_what_is_no_key():
    c = big_cache(MIX)
    c.fill([(0, 1), (2, 3)])
    assert (0, 1) in c and [2, 3] in c and np.array([0, 1]) in c
    for key in (5, "ab", "01", (0,), (0, 1, 2), ([0], 1), None, 1.5, (2, 4)):
        assert key not in c, key


def test_hb_capacity_from_a_preset_name():
    assert hb_capacity_bytes("paper-8gb", dense_bytes=5) == \
        hb_capacity_bytes(preset("paper-8gb"), dense_bytes=5) == (8 << 30) - 5
    with pytest.raises(UserError, match="arch: unknown configuration 'nope'; expected one of"):
        hb_capacity_bytes("nope")
    with pytest.raises(UserError, match="arch: expected an ArchConfig or a preset name, got 5"):
        hb_capacity_bytes(5)


# ---- HomeGroups with a table of layers ----------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda h: h.sync([(5, 1)]),
    lambda h: h.move([(5, 1)], []),
    lambda h: h.assign((5, 1)),
    lambda h: h.release((5, 1)),
])
def test_home_groups_name_a_layer_outside_the_table(call):
    h = HomeGroups(2, layer_ids=[0, 1], experts=4)
    with pytest.raises(ValueError, match=r"key \(5, 1\): layer 5 is not among the layer ids "
                                         r"\(0\.\.1\)"):
        call(h)
    assert h.sync([(1, 3)]) == ([(1, 3)], [])

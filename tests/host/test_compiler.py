"""The host compiler (sw.host.compiler), its golden and perf backends (sw.host.backends,
sw.host.perf): the real Mixtral GSM8K routing (../shared/traces) scheduled by Elastic-SD and by
the LRU replay, placed on the die's groups, compiled per PE and run on the multi-PE functional
simulation bit-exactly against ref_moe (synthetic 64x128 experts, labelled); the perf model's
bytes equal the compiled programs', and its latency and energy follow the configuration's
figures."""

import dataclasses
import functools
import pickle

import numpy as np
import pytest

from elmoe3d.config import HB_BANK, preset
from elmoe3d.sw.host import backends, compiler as host
from elmoe3d.sw.host.corpus import routing_path
from elmoe3d.sw.host.elastic_sd import CoverageAcceptance, ElasticSD
from elmoe3d.sw.golden.expert import ref_moe
from elmoe3d.sw.host.hbcache import HBExpertCache, replay
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.perf import PerfModel
from elmoe3d.sw.host.trace import import_vllm_jsonl

MIX = model_preset("mixtral-8x7b")
SMALL = preset("small")
SEED = 20250607


@functools.cache
def _trace():
    tr, _ = import_vllm_jsonl(routing_path("gsm8k"), model=MIX)
    return tr


def _elastic(tokens, layers, *, slots=48, depth=3, arch=SMALL):
    sm = host.synthetic_model(MIX)
    cache = HBExpertCache(capacity_bytes=slots * sm.expert_msb_bytes, model=sm, admit=False)
    esd = ElasticSD(cache=cache, depth=depth, acceptance=CoverageAcceptance(0.5))
    steps, res = host.elastic_steps(host.limit_tokens(_trace(), tokens), esd, layers=layers,
                                    groups=arch.groups)
    return sm, steps, res


def test_golden_equals_ref_moe_on_real_trace():
    """Elastic-SD over the first 10 GSM8K tokens, layers 0, 15 and 31: every group's programs
    on the functional simulation equal ref_moe (FP32 bits, Q.24 sums, flags); the draft steps
    run pool experts only, verify steps have cached and uncached experts, some layers use
    both groups."""
    sm, steps, res = _elastic(10, [0, 15, 31])
    kinds = {s.kind for s in steps}
    assert kinds == {"ar", "draft", "verify"}
    w = host.SyntheticWeights(sm, seed=SEED)
    recs, layers = backends.run_golden(steps, w, SMALL, keep=True)
    assert sum(r["mismatches"] for r in recs) == 0
    assert sum(r["compared"] for r in recs) > 10_000
    two_groups = mixed = 0
    for gl in layers:
        step = steps[gl.step]
        x = w.x(gl.layer, step.tokens)
        work = step.layers[gl.layer]
        if step.kind == "draft":
            assert set(work.routed()) <= work.cached
        for g, job, res_g, ref in gl.jobs:
            # independent recomputation of the group's reference, bit for bit
            again = ref_moe(x, w.experts(gl.layer), job.info["routing"], job.mode)
            assert np.array_equal(res_g.y.view(np.uint32), again.y.view(np.uint32))
            assert np.array_equal(res_g.out, again.out)
            mine = set(step.placements[gl.layer].groups[g])
            assert {int(e) for e in job.info["experts"]} == mine
            c = step.placements[gl.layer].cached[g]
            mixed += bool(c) and bool(mine - c)
        two_groups += len(gl.jobs) == 2
        if len(gl.jobs) == 1:        # one group: the layer equals the whole-layer ref_moe
            ref = ref_moe(x, w.experts(gl.layer), (work.ids, work.weights),
                          "DRAFT" if step.kind == "draft" else "FULL")
            assert np.array_equal(gl.y.view(np.uint32), ref.y.view(np.uint32))
    assert two_groups and mixed
    # a pool update writes exactly the words later programs read from HB: a group's HB image
    # is its cached experts' slices (host.slice_images) in ascending id
    checked = 0
    for gl in layers:
        for g, job, _, _ in gl.jobs:
            c = sorted(steps[gl.step].placements[gl.layer].cached[g])
            if not c or checked > 6:
                continue
            imgs = [host.slice_images(gl.layer, e, w, SMALL) for e in c]
            for p in range(job.pes):
                assert job.hb_images[p] == [x for im in imgs for x in im[p]]
            checked += 1
    assert checked
    assert sum(s.produced for s in steps) == res.tokens == 10


def test_perf_bytes_and_beats_equal_the_programs():
    """On the small configuration the perf model's HB, EXT and link bytes and its tile cycles
    (MACs / peak at W4A8 and W8A8) equal what the compiled programs move and the PEs' STATUS
    gemm_beats count, step by step."""
    sm, steps, _ = _elastic(8, [3, 20])
    recs, _ = backends.run_golden(steps, host.SyntheticWeights(sm, seed=SEED), SMALL)
    perf = backends.run_perf(steps, SMALL, sm)
    assert len(recs) == len(perf)
    for g, p in zip(recs, perf):
        for k in ("hb_read_bytes", "hb_write_bytes", "ext_bytes", "link_bytes", "accesses",
                  "hits"):
            assert g[k] == p[k], (g["step"], k)
        assert g["gemm_beats"] == p["gemm_beats"], g["step"]
        assert p["cycles"] > 0


def _one_layer_step(kind, experts, cached, tokens=1, layer=0):
    ids = np.array([experts] * tokens, np.int64)
    w = np.full(ids.shape, 1 / len(experts), np.float32)
    work = host.LayerWork(layer, ids, w, frozenset(cached))
    homes = host.HomeGroups(4)
    step = host.Step(index=0, kind=kind, tokens=[(0, t) for t in range(tokens)],
                     layers={layer: work}, produced=tokens)
    step.placements = {layer: host.place_layer(work, homes, draft=kind == "draft")}
    return step


def _faster_hb(arch, factor):
    hb = dataclasses.replace(HB_BANK, tck_ns=HB_BANK.tck_ns / factor)
    return dataclasses.replace(arch, hb=hb, hb_bank_gbps=arch.hb_bank_gbps * factor)


def test_perf_bandwidth_bound_steps():
    """An HB-bound draft step takes exactly its busiest bank's bytes / HB bytes per cycle
    after the HB's first read (the die feed; none in the ideal feed), and its stream half as
    long with twice the HB bandwidth (ideal feed: on the die the aggregation link then bounds
    it); an uncached verify step is EXT-bound: the EXT's first
    read + bytes / EXT bytes per cycle (no tail on a paper configuration: no program table);
    energy = bits x pJ/bit of each tier."""
    arch = preset("paper-4gb")
    pm = PerfModel(arch, MIX)
    assert (pm.head_hb, pm.head_ext) == (33, 47)       # tRCD + RL + burst, ns at 1 GHz
    ideal = PerfModel(arch, MIX, feed="ideal")
    assert (ideal.head_hb, ideal.head_ext) == (0, 0)
    G = arch.pes_per_group
    draft = _one_layer_step("draft", [3, 5], {3, 5})
    c = pm.step(draft, draft.placements)
    assert c.bounds == {"hb": 1}
    # two experts go to two different home groups: each bank holds msb/G of one expert
    stream = MIX.expert_msb_bytes / G / arch.hb_bytes_per_cycle
    assert c.cycles == pytest.approx(pm.head_hb + stream)
    assert ideal.step(draft, draft.placements).cycles == pytest.approx(stream)
    assert c.hb_read_bytes == 2 * MIX.expert_msb_bytes and c.ext_bytes == 0
    fast = _faster_hb(arch, 2)
    assert fast.hb_bytes_per_cycle == 2 * arch.hb_bytes_per_cycle
    c2 = PerfModel(fast, MIX, feed="ideal").step(draft, draft.placements)
    assert c2.bounds == {"hb": 1} and c2.cycles == pytest.approx(stream / 2)
    # on the die the group programs' psum words at the aggregation link's 1/16 word a cycle
    # then bound the step: compute, not the faster HB
    c2 = PerfModel(fast, MIX).step(draft, draft.placements)
    assert c2.bounds == {"compute": 1} and c2.cycles > pm.head_hb + stream / 2
    assert c.energy_pj == pytest.approx(c.hb_read_bytes * 8 * arch.hb_pj_per_bit)

    verify = _one_layer_step("verify", [1, 6], set(), tokens=4)
    v = pm.step(verify, verify.placements)
    assert v.bounds == {"ext": 1}
    ext = 2 * (MIX.expert_msb_bytes + MIX.expert_lsb_bytes)
    assert v.ext_bytes == ext
    assert v.cycles == pytest.approx(pm.head_ext + ext / (arch.ext_gbps / arch.clock_ghz))
    assert v.energy_pj == pytest.approx(ext * 8 * arch.ext_pj_per_bit)
    assert v.hit_rate == 0
    # doubling HB bandwidth leaves an EXT-bound step alone
    assert PerfModel(fast, MIX).step(verify, verify.placements).cycles == pytest.approx(v.cycles)


def test_perf_verify_cached_split():
    """A cached expert in verify reads msb/G from each bank of its home group and streams its
    LSB slice (+ the scale copies) from EXT; the psum exchange costs link words."""
    arch = preset("paper-8gb")
    pm = PerfModel(arch, MIX)
    st = _one_layer_step("verify", [2, 7], {2}, tokens=4)
    c = pm.step(st, st.placements)
    L = c.layers[0]
    assert c.hb_read_bytes == MIX.expert_msb_bytes
    assert c.ext_bytes > MIX.expert_msb_bytes + MIX.expert_lsb_bytes + MIX.expert_lsb_bytes
    assert L.link_bytes > 0 and c.hits == 1 and c.accesses == 2
    # the two experts run on different groups (the cold one goes to the idle group)
    assert len(L.group_cycles) == 2


def test_placement_policy():
    """Homes balance the resident slices over the groups (fewest first, ties to the lower
    index) and follow evictions; uncached experts go to the least-loaded group, most tokens
    first."""
    homes = host.HomeGroups(3)
    new, gone = homes.sync([(0, 1), (0, 2), (1, 5), (2, 0)])
    assert [homes.home[k] for k in new] == [0, 1, 2, 0]
    new, gone = homes.sync([(0, 2), (1, 5), (3, 3)])
    assert gone == [(0, 1), (2, 0)] and homes.home[(3, 3)] == 0
    ids = np.array([[0, 4], [4, 6], [4, 7], [6, 0]], np.int64)
    work = host.LayerWork(0, ids, np.ones(ids.shape, np.float32) / 2, frozenset({0}))
    h = host.HomeGroups(2)
    h.assign((0, 0))
    pl = host.place_layer(work, h, draft=False)
    # expert 0 (2 tokens) at home 0; cold: 4 (3 tokens) -> group 1, 6 (2) -> group 0 (2 vs 3),
    # 7 (1) -> group 1 (4 vs 4: lower index) ... check the loads
    assert pl.cached == (frozenset({0}), frozenset())
    assert pl.groups[1][4] == 3 and 6 in pl.groups[0]
    loads = [sum(g.values()) for g in pl.groups]
    assert abs(loads[0] - loads[1]) <= 1
    with pytest.raises(ValueError, match="outside the HB pool"):
        host.place_layer(work, h, draft=True)


def test_replay_steps_match_cache_replay():
    """The decode steps of a plain replay see the same hits as hbcache.replay on the same
    trace (first 60 tokens, paper-8gb reservations), and list the admissions as pool
    writes."""
    arch = preset("paper-8gb")
    tr = host.limit_tokens(_trace(), 60)
    d, kv = host.reserved_hb_bytes(MIX)
    a = HBExpertCache.for_model(MIX, arch, dense_bytes=d, kv_bytes=kv)
    b = HBExpertCache.for_model(MIX, arch, dense_bytes=d, kv_bytes=kv)
    steps = host.replay_steps(tr, a, groups=arch.groups)
    ref = replay(tr, b)
    assert len(steps) == 60
    assert sum(len(set(w.routed()) & w.cached) for s in steps for w in s.layers.values()) \
        == int(ref.hits.sum()) > 0
    assert sum(len(s.writes) for s in steps) * MIX.expert_msb_bytes == ref.hb_write_bytes
    perf = backends.summarise(backends.run_perf(steps, arch, MIX), arch)
    assert perf["hit_rate"] == pytest.approx(ref.hit_rate)
    assert perf["hb_read_bytes"] == ref.hb_read_bytes


@pytest.mark.parametrize("slots", [20, 68])
def test_replay_homes_follow_the_cache_incrementally(monkeypatch, slots):
    """HomeGroups.update (from the step's admitted and evicted keys) gives the same pool
    writes, evictions and placements as a sync over the whole contents, both with a cache
    that thrashes (20 slots: a step's 64 slices do not fit, each layer's admissions evict
    the previous layers') and with one that holds them (68). A layer's step that misses more
    than the cache holds admits only its last ``slots`` misses (Algorithm 1's UpdateCache
    after the step: none is admitted and evicted within it)."""
    tr = host.limit_tokens(_trace(), 40)

    def run():
        cache = HBExpertCache(capacity_bytes=slots * MIX.expert_msb_bytes, model=MIX)
        return host.replay_steps(tr, cache, batch=2, groups=4)

    fast = run()
    with monkeypatch.context() as mp:
        mp.setattr(host.HomeGroups, "update",
                   lambda self, cache: self.sync(cache.contents()))
        slow = run()
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert a.writes == b.writes and a.evicted == b.evicted
        assert a.placements == b.placements
    assert sum(len(s.writes) for s in fast) > 0 and sum(len(s.evicted) for s in fast) > 0
    cache = HBExpertCache(capacity_bytes=2 * MIX.expert_msb_bytes, model=MIX)
    cache.step(0, [1, 2, 3])
    assert cache.last_changes == (((0, 2), (0, 3)), ())
    cache.step(1, [4])
    assert cache.last_changes == (((1, 4),), ((0, 2),))


def test_perf_expert_costs_computed_once_per_shape():
    """PerfModel.expert's figures depend on (tokens, phase, cached) only: the second call
    reuses the first's, with its own id and its own lists."""
    pm = PerfModel(preset("paper-8gb"), "qwen3-30b-a3b")
    a = pm.expert(3, 16, phase="verify", cached=True)
    b = pm.expert(7, 16, phase="verify", cached=True)
    fresh = PerfModel(preset("paper-8gb"), "qwen3-30b-a3b")._expert(7, 16, phase="verify",
                                                                     cached=True)
    assert (a.expert, b.expert) == (3, 7) and b == fresh
    assert a.hb_bytes is not b.hb_bytes and a.w4_macs is not b.w4_macs
    b.w4_macs[0] += 1
    assert pm.expert(9, 16, phase="verify", cached=True).w4_macs == a.w4_macs


def test_layers_and_tokens_selection():
    assert host.parse_layers("0:4", MIX) == [0, 1, 2, 3]
    assert host.parse_layers("3", MIX) == [3]
    assert host.parse_layers("1,5", MIX) == [1, 5]
    assert host.parse_layers("28:", MIX) == [28, 29, 30, 31]
    assert host.parse_layers("0:32:8", MIX) == [0, 8, 16, 24]
    for bad in ("x", "0:40", "5:2", "32", "1:2:0"):
        with pytest.raises(host.UserError, match="--layers"):
            host.parse_layers(bad, MIX)
    tr = host.limit_tokens(_trace(), 170)
    assert tr.token_count() == 170          # 168 of problem 0, 2 of problem 1
    with pytest.raises(host.UserError, match="--tokens"):
        host.limit_tokens(tr, 0)


def test_schedule_step_work_is_a_step_work():
    """The schedule's StepWork (made from its routed experts, the dense arrays on first use)
    behaves as one: frozen, shown and pickled as a StepWork, dataclasses.replace gives one
    with the replaced field, and its arrays equal those its cells give."""
    cells = host.RoutedCells(np.array([0, 1, 1]), np.array([2, 0, 3]), np.array([1, 2, 1]),
                             np.array([True, False, True]), np.array([0, 1, 0]))
    w = host._CellWork((5, 7), cells=cells, experts=4)
    assert isinstance(w, host.StepWork) and repr(w).startswith("StepWork(layers=(5, 7)")
    assert w.tokens.tolist() == [[0, 0, 1, 0], [2, 0, 0, 1]]
    assert w.cached.tolist() == [[False, False, True, False], [False, False, False, True]]
    assert w.group.tolist() == [[-1, -1, 0, -1], [1, -1, -1, 0]]
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.tokens = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.other = 1
    back = pickle.loads(pickle.dumps(w))
    assert type(back) is host.StepWork and back.tokens.tolist() == w.tokens.tolist()
    r = dataclasses.replace(w, group=np.zeros((2, 4), np.int64))
    assert r.group.tolist() == [[0] * 4] * 2 and r.tokens.tolist() == w.tokens.tolist()


def test_move_indices_refuses_an_index_outside_the_table():
    homes = host.HomeGroups(2, layer_ids=[3, 5], experts=4)
    for arrived, left in (([-1, 2], []), ([2], [8])):
        with pytest.raises(ValueError, match=r"flat indices must be in 0\.\.7"):
            homes.move_indices(arrived, left)
    assert (homes.table < 0).all() and homes.count == [0, 0]

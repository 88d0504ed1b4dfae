"""HB expert cache (elmoe3d.sw.host.hbcache): capacity from the config, LRU refreshed on a hit
(against a reference LRU), bytes per tier, per-layer hit rates, replay of the real traces."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from elmoe3d.config import preset
from elmoe3d.errors import UserError
from elmoe3d.sw.host.corpus import routing_path
from elmoe3d.sw.host.hbcache import (HBExpertCache, batch_accesses, hb_capacity_bytes, replay,
                                     replay_per_layer)
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.trace import import_vllm_jsonl

MIX = model_preset("mixtral-8x7b")
MSB, LSB = MIX.expert_msb_bytes, MIX.expert_lsb_bytes


def cache(slots, admit=True, model=MIX):
    return HBExpertCache(capacity_bytes=slots * model.expert_msb_bytes + 1, model=model,
                         admit=admit)


def test_capacity_from_the_config():
    a4, a8 = preset("paper-4gb"), preset("paper-8gb")
    assert hb_capacity_bytes(a4) == 4 << 30 and hb_capacity_bytes(a8) == 8 << 30
    c = HBExpertCache.for_model("qwen3-30b-a3b", a4, dense_bytes=1 << 30, kv_bytes=256 << 20)
    q = model_preset("qwen3-30b-a3b")
    assert c.capacity_bytes == (4 << 30) - (1 << 30) - (256 << 20)
    assert c.slots == c.capacity_bytes // q.expert_msb_bytes
    assert c.msb_bytes == q.expert_msb_bytes and c.lsb_bytes == q.expert_lsb_bytes
    with pytest.raises(UserError, match="dense_bytes.*kv_bytes.*leave no HB"):
        hb_capacity_bytes(a4, dense_bytes=3 << 30, kv_bytes=1 << 30)
    with pytest.raises(UserError, match="kv_bytes"):
        hb_capacity_bytes(a4, kv_bytes=-1)
    with pytest.raises(UserError, match="capacity_bytes"):
        HBExpertCache(capacity_bytes=1.5, model=MIX)


def test_lru_refreshes_on_a_hit():
    c = cache(2)
    assert c.step(0, [1]) == ([], [1])
    assert c.step(0, [2]) == ([], [2])
    assert c.step(0, [1]) == ([1], [])            # hit: 1 becomes the most recent
    c.step(0, [3])                                 # evicts 2, the least recent, not 1
    assert (0, 1) in c and (0, 2) not in c and (0, 3) in c
    assert c.contents() == [(0, 1), (0, 3)]
    assert c.step(0, [1]) == ([1], [])
    assert c.stats.evictions == 1


def test_bytes_per_tier_and_per_layer_hit_rates():
    c = cache(3)
    c.step(0, [1, 2, 1])                           # 1 repeated in a step: one access
    c.step(0, [1, 5])
    c.step(3, [1])
    s = c.stats
    assert s.accesses[0] == 4 and s.hits[0] == 1 and s.accesses[3] == 1 and s.hits[3] == 0
    assert s.hb_read_bytes == MSB and s.ext_read_bytes == LSB + 4 * (MSB + LSB)
    assert s.hb_write_bytes == 4 * MSB              # admissions
    np.testing.assert_allclose(s.layer_hit_rates[[0, 3]], [0.25, 0.0])
    assert np.isnan(s.layer_hit_rates[1]) and s.hit_rate == pytest.approx(0.2)


def test_no_admission_and_zero_slots():
    c = cache(2, admit=False)
    c.step(0, [1])
    assert len(c) == 0 and c.stats.hb_write_bytes == 0
    z = HBExpertCache(capacity_bytes=MSB - 1, model=MIX)
    z.step(0, [1])
    assert z.slots == 0 and len(z) == 0


def test_bad_ids_and_layers():
    c = cache(2)
    with pytest.raises(UserError, match="-1 is not an expert id|expert: -1"):
        c.step(0, [-1])
    with pytest.raises(UserError, match="expert: 8"):
        c.step(0, [8])
    ds = HBExpertCache(capacity_bytes=1 << 30, model="deepseek-v2-lite")
    with pytest.raises(UserError, match="layer: 0 is not a MoE layer"):
        ds.step(0, [1])                            # layer 0 is dense in DeepSeek-V2-Lite
    with pytest.raises(UserError, match="do not fit"):
        cache(1).fill([(0, 1), (0, 2)])


def test_fill_counts_writes_and_extra_reads():
    c = cache(3, admit=False)
    assert c.fill([(0, 1), (0, 2)], streamed=[(0, 1)]) == 2 * MSB
    assert c.stats.ext_extra_bytes == MSB          # (0, 2) was not streamed
    assert c.fill([(0, 2), (1, 4)], streamed=[(1, 4)]) == MSB   # (0, 2) kept: no traffic
    assert c.contents() == [(0, 2), (1, 4)] and c.stats.evictions == 1
    assert c.stats.ext_extra_bytes == MSB


class RefLRU:
    """Reference: a plain list, most recent last."""

    def __init__(self, slots):
        self.slots, self.items = slots, []

    def access(self, key):
        if key in self.items:
            self.items.remove(key)
            self.items.append(key)
            return True
        if self.slots:
            if len(self.items) == self.slots:
                self.items.pop(0)
            self.items.append(key)
        return False

    def step(self, layer, experts):
        """Algorithm 1's order: every distinct expert tested against the contents before the
        step (line 23), then the hits refreshed and the misses admitted (line 30)."""
        order = list(dict.fromkeys(experts))
        hits = [e for e in order if (layer, e) in self.items]
        for e in hits:
            self.access((layer, e))
        for e in order:
            if e not in hits:
                self.access((layer, e))
        return hits, [e for e in order if e not in hits]


def test_a_step_never_turns_its_hit_into_a_miss():
    """Algorithm 1 decides a step's hits against the cache before the step (line 23) and
    updates it after (line 30): a miss admitted early in the step does not evict a slice the
    same step uses later (the old interleaved order missed on 1 here, evicted by 3). A step
    that misses more than the cache holds writes only its last ``slots`` misses."""
    c = cache(2)
    c.step(0, [1])
    c.step(0, [2])                                 # LRU first: 1, 2
    assert c.step(0, [3, 1]) == ([1], [3])         # 1 hits; 3 evicts 2, not 1
    assert c.contents() == [(0, 1), (0, 3)]
    assert c.stats.evictions == 1
    assert c.last_changes == (((0, 3),), ((0, 2),))
    # a step of more experts than slots: its hits first, then the misses in order
    assert c.step(0, [4, 5, 3]) == ([3], [4, 5])
    assert c.contents() == [(0, 4), (0, 5)]
    writes = c.stats.hb_write_bytes
    assert c.step(0, [6, 7, 2]) == ([], [6, 7, 2])          # 6 would not stay: not written
    assert c.contents() == [(0, 7), (0, 2)] and c.last_changes == (((0, 7), (0, 2)),
                                                                   ((0, 4), (0, 5)))
    assert c.stats.hb_write_bytes - writes == 2 * MSB


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5), st.lists(st.tuples(st.integers(0, 3),
                                             st.lists(st.integers(0, 7), max_size=6)),
                                   max_size=40))
def test_steps_match_a_reference_lru(slots, steps):
    """Hits, misses and contents as a reference LRU in Algorithm 1's order; HB writes one MSB
    slice per miss that stays (at most ``slots`` a step), evictions what left."""
    c, ref = cache(slots), RefLRU(slots)
    for layer, experts in steps:
        before = set(ref.items)
        hits, misses = ref.step(layer, experts)
        assert c.step(layer, experts) == (hits, misses)
        assert c.contents() == ref.items
        admitted, evicted = c.last_changes
        assert set(admitted) == set(ref.items) - before
        assert set(evicted) == before - set(ref.items)
    assert c.stats.hb_write_bytes == MSB * (c.stats.evictions + len(ref.items))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 6), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 7)),
                                   max_size=80))
def test_matches_a_reference_lru(slots, accesses):
    c, ref = cache(slots), RefLRU(slots)
    for layer, e in accesses:
        hits, _ = c.step(layer, [e])
        assert bool(hits) == ref.access((layer, e))
        assert c.contents() == ref.items


@pytest.fixture(scope="module")
def gsm8k():
    return import_vllm_jsonl(routing_path("gsm8k"), model=MIX)[0]


def reference_hits(slots):
    """Hit count of an LRU over the raw JSON rows, in (problem, token, layer) order."""
    with open(routing_path("gsm8k")) as f:
        rows = sorted((json.loads(x) for x in f), key=lambda r: (r["problem_id"],
                                                                 r["token_idx"], r["layer"]))
    ref, hits = RefLRU(slots), 0
    for r in rows:
        for e in r["experts"]:
            hits += ref.access((r["layer"], e))
    return hits, 2 * len(rows)


@pytest.mark.parametrize("cfg, slots", [("paper-4gb", 24), ("paper-8gb", 68)])
def test_real_trace_replay(gsm8k, cfg, slots):
    """Mixtral (99 MB MSB slices) at the paper's HB sizes, less 1.59 GiB of dense INT8 weights
    with scales and a 128 MiB KV cache (1k tokens): 24 and 68 slots for 32 layers x 2 experts a
    token. Hit counts equal an independent LRU over the raw rows."""
    dense = 1_706_000_000
    c = HBExpertCache.for_model(MIX, preset(cfg), dense_bytes=dense, kv_bytes=128 << 20)
    assert c.slots == slots
    s = replay(gsm8k, c)
    hits, accesses = reference_hits(slots)
    assert (int(s.hits.sum()), int(s.accesses.sum())) == (hits, accesses)
    assert s.hb_read_bytes == hits * MSB
    assert s.ext_read_bytes == hits * LSB + (accesses - hits) * (MSB + LSB)
    print(cfg, s.summary())


def test_batched_replay_reads_shared_experts_once(gsm8k):
    one = replay(gsm8k, cache(0))
    two = replay(gsm8k, cache(0), batch=2)
    assert int(one.accesses.sum()) == 2 * len(gsm8k)
    assert int(two.accesses.sum()) < int(one.accesses.sum())
    with pytest.raises(UserError, match="batch"):
        replay(gsm8k, cache(0), batch=0)
    with pytest.raises(UserError, match="MoE layers"):
        replay(gsm8k, cache(0, model=model_preset("deepseek-v2-lite")))


# -- bad keys: one UserError naming the argument, nothing truncated or dropped ------------------

@pytest.mark.parametrize("layer", [1.7, 1.0, "x", None, True, 99])
def test_step_refuses_a_layer_that_is_not_an_integer_moe_layer(layer):
    c = cache(4)
    with pytest.raises(UserError, match=f"layer: {layer!r} is not a MoE layer"):
        c.step(layer, [0, 1])
    with pytest.raises(UserError, match="layer: .* is not a MoE layer"):
        c.step(layer, [])                       # checked even when no expert is accessed
    assert len(c) == 0 and c.stats.accesses.sum() == 0


def test_step_takes_numpy_integers_and_refuses_a_scalar_expert():
    c = cache(4)
    assert c.step(np.int64(1), np.array([2, 3], np.int8)) == ([], [2, 3])
    assert c.contents() == [(1, 2), (1, 3)]
    with pytest.raises(UserError, match="experts: expected expert ids, got 3"):
        c.step(0, 3)


@pytest.mark.parametrize("keys, streamed, match", [
    ([(1.7, 0)], (), r"keys: layer: 1.7 is not a MoE layer"),
    ([(0, 1.0)], (), r"keys: expert: 1.0 is not an expert id"),
    ([("x", 0)], (), r"keys: layer: 'x' is not a MoE layer"),
    ([(0,)], (), r"keys: expected \(layer, expert\) pairs, got \(0,\)"),
    ([3], (), r"keys: expected \(layer, expert\) pairs, got 3"),
    ([(0, 1)], [(99, 99)], r"streamed: layer: 99 is not a MoE layer"),   # dropped before
    ([(0, 1)], [(0, 8)], r"streamed: expert: 8 is not an expert id"),
    ([(0, 1)], [(0.5, 1)], r"streamed: layer: 0.5 is not a MoE layer"),
    ([(0, 1)], 5, r"streamed: expected \(layer, expert\) pairs")])
def test_fill_refuses_keys_it_used_to_truncate_or_drop(keys, streamed, match):
    c = cache(4)
    with pytest.raises(UserError, match=match):
        c.fill(keys, streamed=streamed)
    assert len(c) == 0 and c.stats.hb_write_bytes == 0


def test_fill_indices_refuses_float_keys_and_a_misshapen_mask():
    c = cache(4)
    L, E = c.resident_mask().shape
    with pytest.raises(UserError, match="keys: expected integer flat .* got float64"):
        c.fill_indices([0.7, 1.2])                          # was truncated to 0, 1
    with pytest.raises(UserError, match=rf"streamed: expected a bool \[{L}, {E}\] mask"):
        c.fill_indices([0, 1], streamed=np.zeros(L * E, bool))
    with pytest.raises(UserError, match="streamed: expected a bool"):
        c.fill_indices([0, 1], streamed=np.zeros((L, E), int))
    assert c.fill_indices([]) == 0
    assert c.fill_indices(np.array([0, 9], np.int32)) == 2 * MSB


def test_for_model_takes_a_preset_name_and_refuses_other_archs():
    a = HBExpertCache.for_model(MIX, "paper-4gb", kv_bytes=1 << 20)
    b = HBExpertCache.for_model(MIX, preset("paper-4gb"), kv_bytes=1 << 20)
    assert a.capacity_bytes == b.capacity_bytes
    with pytest.raises(UserError, match="arch: unknown configuration 'paper-3gb'"):
        HBExpertCache.for_model(MIX, "paper-3gb")
    with pytest.raises(UserError, match="arch: expected an ArchConfig or a preset name"):
        HBExpertCache.for_model(MIX, 4 << 30)


def test_replay_takes_a_numpy_batch(gsm8k_routing):
    a = replay(gsm8k_routing, cache(8), batch=np.int64(2)).summary()
    assert a == replay(gsm8k_routing, cache(8), batch=2).summary()


@pytest.mark.parametrize("batch, slots", [(1, 1), (1, 2), (2, 2), (2, 3)])
def test_per_layer_replay_is_one_reference_lru_a_layer(gsm8k, batch, slots):
    """replay_per_layer on the real trace equals a reference LRU per layer fed each layer's
    steps (batch_accesses, the steps replay makes), in hits, accesses and bytes."""
    refs, hits, accesses, writes = {}, 0, 0, 0
    for layer, experts in batch_accesses(gsm8k, batch=batch):
        h, m = refs.setdefault(layer, RefLRU(slots)).step(layer, experts)
        hits, accesses = hits + len(h), accesses + len(h) + len(m)
        writes += min(len(m), slots)                 # the misses that stay in the step
    s = replay_per_layer(gsm8k, MIX, slots, batch=batch)
    assert (int(s.hits.sum()), int(s.accesses.sum())) == (hits, accesses)
    assert s.hb_read_bytes == hits * MSB
    assert s.ext_read_bytes == hits * LSB + (accesses - hits) * (MSB + LSB)
    assert s.hb_write_bytes == writes * MSB
    # the same accesses as the one LRU over all layers sees
    assert int(replay(gsm8k, cache(0), batch=batch).accesses.sum()) == accesses
    print(f"batch {batch}, {slots} slots a layer: hit rate {s.hit_rate:.3f}")


def test_batch_accesses_and_per_layer_replay_refuse_bad_input(gsm8k):
    with pytest.raises(UserError, match="batch: expected a positive integer"):
        next(batch_accesses(gsm8k, batch=0))
    with pytest.raises(UserError, match="slots_per_layer: expected an integer >= 0"):
        replay_per_layer(gsm8k, MIX, 1.5)
    with pytest.raises(UserError, match="MoE layers of deepseek-v2-lite"):
        replay_per_layer(gsm8k, "deepseek-v2-lite", 2)
    with pytest.raises(UserError, match="batch"):
        replay_per_layer(gsm8k, MIX, 2, batch=True)


def test_merge_sums_every_field_by_name():
    """``CacheStats.merge`` with every field different on both sides: each sum lands in its
    own field (a test audit swapped ``ext_extra_bytes`` and ``evictions`` in the positional
    call it was; the per-layer replay, its one caller, has ``ext_extra_bytes`` 0)."""
    from elmoe3d.sw.host.hbcache import CacheStats
    a = CacheStats(("x", "y"), np.array([1, 2]), np.array([1, 0]), 1, 2, 3, 4, 5)
    b = CacheStats(("x", "y"), np.array([3, 4]), np.array([2, 4]), 10, 20, 30, 40, 50)
    s = a.merge(b)
    assert (s.accesses.tolist(), s.hits.tolist()) == ([4, 6], [3, 4])
    assert s.summary() == {"accesses": 10, "hits": 7, "hit_rate": 0.7, "hb_read_bytes": 11,
                           "ext_read_bytes": 22, "hb_write_bytes": 33, "ext_extra_bytes": 44,
                           "evictions": 55}
    with pytest.raises(ValueError, match="merge: different layer_ids"):
        a.merge(CacheStats(("x",)))

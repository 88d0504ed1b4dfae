"""HB expert cache (elmoe3d.sw.host.hbcache): capacity from the config, LRU refreshed on a hit
(against a reference LRU), bytes per tier, per-layer hit rates, replay of the real traces."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from elmoe3d.config import preset
from elmoe3d.errors import UserError
from elmoe3d.sw.host.corpus import routing_path
from elmoe3d.sw.host.hbcache import HBExpertCache, hb_capacity_bytes, replay
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

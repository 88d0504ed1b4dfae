"""The fast trace-driven perf path (issue 26 item 7) against its references on a real trace:
``PerfModel.step_summary`` (all layers of a step at once) against ``PerfModel.step`` (layer by
layer), the array placement of ``elastic_steps`` against ``place_layer``, and the run's totals
against figures recorded from the unchanged code."""

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.sw.host import compiler as host
from elmoe3d.sw.host.backends.perf import run_perf
from elmoe3d.sw.host.corpus import traces_dir
from elmoe3d.sw.host.elastic_sd import CoverageAcceptance, ElasticSD
from elmoe3d.sw.host.hbcache import HBExpertCache
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.perf import PerfModel
from elmoe3d.sw.host.trace import import_vllm_jsonl

MIX = "mixtral-8x7b"
FIELDS = ("cycles", "us", "hb_read_bytes", "hb_write_bytes", "ext_bytes", "link_bytes",
          "energy_pj", "hb_energy_pj", "ext_energy_pj", "accesses", "hits", "bounds",
          "tile_cycles", "tokens", "produced", "kind")


@pytest.fixture(scope="module")
def gsm8k():
    path = traces_dir() / "gsm8k_2_routing.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    return import_vllm_jsonl(path, model=MIX)[0]


def elastic(trace, config):
    arch = preset(config)
    dense, kv = host.reserved_hb_bytes(MIX)
    cache = HBExpertCache.for_model(MIX, arch, dense_bytes=dense, kv_bytes=kv, admit=False)
    esd = ElasticSD(cache=cache, depth=4, acceptance=CoverageAcceptance(0.5))
    return arch, host.elastic_steps(trace, esd, groups=arch.groups)[0]


def test_run_totals_equal_the_recorded_figures(gsm8k):
    """``elmoe3d run --trace gsm8k --model mixtral-8x7b --config paper-8gb --backend perf``:
    totals recorded at commit 8f4d3e2, before the fast path (exact: every figure is a sum of
    whole bytes or of the same floats in the same order)."""
    arch, steps = elastic(gsm8k, "paper-8gb")
    recs = run_perf(steps, arch, MIX)
    assert len(recs) == 510
    assert sum(r["cycles"] for r in recs) == 31769704960.0
    assert sum(r["hb_read_bytes"] for r in recs) == 3129771294720.0
    assert sum(r["hb_write_bytes"] for r in recs) == 279435018240.0
    assert sum(r["ext_bytes"] for r in recs) == 2546306646016.0
    assert sum(r["link_bytes"] for r in recs) == 42786800640.0
    assert sum(r["energy_pj"] for r in recs) == 90765028008919.11
    assert sum(r["accesses"] for r in recs) == 42097
    assert sum(r["hits"] for r in recs) == 31585
    assert sum(r["produced"] for r in recs) == 247


@pytest.mark.parametrize("config", ["paper-4gb", "small"])
def test_step_summary_equals_step(gsm8k, config):
    """Every step of an Elastic-SD run (the first 30 tokens) and of an LRU replay: the totals
    of ``step_summary`` equal ``step``'s bit for bit, and the lazily built placements equal
    ``place_layer`` on the steps' own LayerWork."""
    trace = host.limit_tokens(gsm8k, 30)
    model = model_preset(MIX) if config != "small" else host.synthetic_model(MIX)
    arch = preset(config)
    esd_arch, esd_steps = elastic(trace, config) if config != "small" else (None, None)
    if esd_steps is None:
        cache = HBExpertCache(capacity_bytes=20 * model.expert_msb_bytes, model=model,
                              admit=False)
        esd_steps = host.elastic_steps(trace, ElasticSD(cache=cache, depth=3, acceptance=
                                                        CoverageAcceptance(0.3)),
                                       groups=arch.groups, batch=2)[0]
    cache = HBExpertCache(capacity_bytes=20 * model.expert_msb_bytes, model=model)
    replay = host.replay_steps(trace, cache, groups=arch.groups)
    pm = PerfModel(arch, model)
    kinds = set()
    for step in esd_steps + replay:
        kinds.add(step.kind)
        fast, ref = pm.step_summary(step), pm.step(step, step.placements)
        for f in FIELDS:
            assert getattr(fast, f) == getattr(ref, f), (step.index, step.kind, f)
        assert list(fast.bounds) == list(ref.bounds)          # the same first-seen order
    assert kinds == {"ar", "draft", "verify", "decode"}
    # the array placement against place_layer (homes as the schedule had them)
    for step in esd_steps:
        for lay, work in step.layers.items():
            pl = step.placements[lay]
            homes = host.HomeGroups(arch.groups)
            for g, c in enumerate(pl.cached):
                for e in c:
                    homes.home[(lay, e)] = g
                    homes.count[g] += 1
            ref = host.place_layer(work, homes, draft=step.kind == "draft")
            assert [list(d.items()) for d in pl.groups] == [list(d.items()) for d in ref.groups]
            assert pl.cached == ref.cached


def test_step_summary_sees_a_changed_placement(gsm8k):
    """The check above can fail: moving one streamed expert to another group changes the
    figures step_summary reports."""
    arch, steps = elastic(host.limit_tokens(gsm8k, 12), "paper-8gb")
    pm = PerfModel(arch, MIX)
    st = next(s for s in steps if s.kind == "verify")
    w = st.work
    j, e = map(int, np.argwhere((w.tokens > 0) & ~w.cached)[0])
    before = pm.step_summary(st)
    group = w.group.copy()
    group[j, e] = (group[j, e] + 1) % arch.groups
    st.work = host.StepWork(w.layers, w.tokens, w.cached, group)
    assert pm.step_summary(st).cycles != before.cycles or \
        pm.step_summary(st).link_bytes != before.link_bytes

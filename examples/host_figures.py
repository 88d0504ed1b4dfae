"""Figures of the host layer on the real traces (docs/traces.md quotes them).

    python examples/host_figures.py

Prints: the routing figures of the two real Mixtral traces and of the calibrated generator,
OLMoE's count-table skew against the generator, the LRU hit rates and bytes of the HB expert
cache at the paper's 4 GB and 8 GB, and Elastic-SD on the same traces. Reads
../shared/traces (or $ELMOE3D_TRACES); writes nothing.
"""

import time

import numpy as np

from elmoe3d.config import preset
from elmoe3d.sw.host.corpus import ROUTING_FILES, traces_dir
from elmoe3d.sw.host.elastic_sd import BernoulliAcceptance, CoverageAcceptance, ElasticSD
from elmoe3d.sw.host.hbcache import HBExpertCache, replay
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.trace import import_vllm_jsonl
from elmoe3d.sw.host.tracegen import (CALIBRATED, count_skew, expert_count_table, routing_stats,
                                 synthetic_trace)

MIX = model_preset("mixtral-8x7b")
FILES = tuple(ROUTING_FILES.values())

# Reserved HB for Mixtral-8x7B (the cache's parameters, not preset data): non-expert weights
# (embeddings 2 x 32000 x 4096, attention 32 x (2 x 4096^2 + 2 x 4096 x 1024), routers, norms:
# 1.606e9 weights) in G32 INT8 with FP16 scales, and a 1k-token FP16 KV cache
# (32 layers x 2 x 8 KV heads x 128 x 2 B x 1024).
DENSE_WEIGHTS = 2 * 32000 * 4096 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024) + 32 * 8 * 4096 \
    + 65 * 4096
DENSE_BYTES = DENSE_WEIGHTS + DENSE_WEIGHTS // 32 * 2
KV_BYTES = 32 * 2 * 8 * 128 * 2 * 1024

KEYS = ("hot_ratio_min", "hot_ratio_median", "hot_ratio_max", "top1_weight", "same_set",
        "overlap")


def fmt(d):
    return "  ".join(f"{k}={d[k]:.3f}" for k in KEYS)


def main():
    traces = {f: import_vllm_jsonl(traces_dir() / f, model=MIX) for f in FILES}
    print("== routing figures (decode tokens, 32 layers)")
    for f, (tr, rep) in traces.items():
        print(f"{f:28s} tokens={rep.tokens} rows={rep.rows} missing={rep.missing_records}  "
              f"{fmt(routing_stats(tr).summary())}")
    rows = [routing_stats(synthetic_trace(MIX, CALIBRATED[MIX.name], requests=2, tokens=150,
                                          seed=s)).summary() for s in range(8)]
    gen = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
    print(f"{'generated (8 seeds, 2x150)':28s} {fmt(gen)}")
    print(f"  params {CALIBRATED[MIX.name]}")
    tab = expert_count_table()
    for variant in ("expert_counts", "expert_counts_top1"):
        sk = [count_skew(c) for (m, v, d, lay), c in tab.items() if m == "olmoe" and v == variant]
        print(f"OLMoE {variant:18s} hot ratio min/median/max "
              f"{min(sk):.2f}/{np.median(sk):.2f}/{max(sk):.2f}")
    s = routing_stats(synthetic_trace("olmoe-1b-7b", CALIBRATED["olmoe-1b-7b"], tokens=4000))
    print(f"OLMoE generated (4000 tok)  hot ratio median {s.hot_ratio_median:.2f}, top-1 "
          f"median {np.median(s.hot_ratio_top1):.2f}, params {CALIBRATED['olmoe-1b-7b']}")

    print(f"\n== HB expert cache, Mixtral-8x7B: MSB slice {MIX.expert_msb_bytes / 2**20:.1f} MiB, "
          f"reserved dense {DENSE_BYTES / 2**30:.2f} GiB + KV {KV_BYTES / 2**20:.0f} MiB")
    for f, (tr, _) in traces.items():
        for cfg in ("paper-4gb", "paper-8gb"):
            for batch in (1, 2):
                c = HBExpertCache.for_model(MIX, preset(cfg), dense_bytes=DENSE_BYTES,
                                            kv_bytes=KV_BYTES)
                t0 = time.perf_counter()
                st = replay(tr, c, batch=batch)
                dt = time.perf_counter() - t0
                lh = st.layer_hit_rates
                print(f"{f:28s} {cfg} slots={c.slots:3d} batch={batch} LRU hit={st.hit_rate:.3f} "
                      f"(layers {np.nanmin(lh):.2f}..{np.nanmax(lh):.2f})  "
                      f"HB {st.hb_read_bytes / 1e9:7.1f} GB  EXT {st.ext_read_bytes / 1e9:7.1f} "
                      f"GB  HB writes {st.hb_write_bytes / 1e9:7.1f} GB  "
                      f"[{tr.token_count() / dt:.0f} tok/s]")

    print("\n== Elastic-SD, Mixtral-8x7B, depth 4 (first 4 tokens AR), batch 1")
    for f, (tr, _) in traces.items():
        for cfg in ("paper-4gb", "paper-8gb"):
            for acc in (CoverageAcceptance(0.5), BernoulliAcceptance(0.7)):
                c = HBExpertCache.for_model(MIX, preset(cfg), dense_bytes=DENSE_BYTES,
                                            kv_bytes=KV_BYTES, admit=False)
                t0 = time.perf_counter()
                r = ElasticSD(cache=c, depth=4, acceptance=acc).run(tr)
                dt = time.perf_counter() - t0
                s = r.summary()
                print(f"{f:28s} {cfg} {acc!s:34s} accept={s['acceptance_rate']:.3f} "
                      f"len={s['mean_accept_length']:.2f} verify hit={s['verify_hit_rate']:.3f} "
                      f"draft HB {s['draft_hb_bytes'] / 1e9:6.0f} GB  verify HB "
                      f"{s['verify_hb_bytes'] / 1e9:6.0f} / EXT {s['verify_ext_bytes'] / 1e9:6.0f}"
                      f" GB  pool writes {s['pool_write_bytes'] / 1e9:5.0f} GB (extra EXT "
                      f"{s['pool_extra_ext_bytes'] / 1e9:.0f})  [{tr.token_count() / dt:.0f} "
                      f"tok/s]")


if __name__ == "__main__":
    main()

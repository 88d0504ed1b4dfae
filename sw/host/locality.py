"""Fig. 16 of the paper, expert locality (Section 7.3 A), measured on real routing.

The paper characterises GLM-4.7-Flash's expert locality on MT-Bench along four axes: (a) the
cache miss rate rises with the batch size ("batched AR aggregates inter-request expert
activations that expand the working set beyond cache coverage"); (b) for the same token count,
one request's tokens (an SD tree) activate far fewer unique experts than tokens of different
requests (AR); (c, d) locality "varies substantially across models but modestly across
benchmarks". GLM's routing is not in our copy; what is (``../shared/traces/``) is real routing
of two models on eight workloads:

* the Mixtral-8x7B decode traces (GSM8K, HumanEval; 32 layers, top-2 of 8): token by token,
  so the exact LRU can replay them (:func:`~.hbcache.replay`) beside Che's approximation;
* the OLMoE / Mixtral expert-count table (layers 0, 7 and 15 over about 209k tokens a domain:
  arxiv, book, c4, github, wikipedia, and tulu for OLMoE-1B-7B and its SFT and DPO variants;
  OLMoE top-8 of 64): per-expert popularity only, so Che's approximation alone.

:func:`fig16` measures the four panels on them, with the expert cache of Section 7's model
(one LRU of MSB slices over every layer, a step accessing each layer's distinct experts once:
:func:`~.paper_eval.che_global`) holding a fraction of every layer's experts (a fraction, not
bytes, so models of different expert sizes compare), and puts beside them the Table 3 models'
fitted Zipf laws (:data:`~.paper_eval.ZIPF`: fitted on Table 3's Phi_AR cells, not routing
data, so named apart).
"""

from __future__ import annotations

import numpy as np

from ...checks import is_real
from ...errors import UserError
from .paper_eval import (TABLE3_MODELS, ZIPF, ExpertPopularity, _int_seq, che_global,
                         fit_zipf, routing_exponents, trace_popularity)

__all__ = ["COUNT_MODELS", "FRACTIONS", "BATCHES", "WINDOWS", "INTER", "count_popularity", "fig16",
           "locality_spread", "merged_trace"]

#: The count table's ``model`` column -> (the name this figure gives it, the model preset
#: whose top-k and routed-expert count it has: its ``family``; OLMoE's SFT and DPO variants
#: are fine-tuned OLMoE-1B-7B, one family).
COUNT_MODELS = {"mistral": ("mixtral-8x7b", "mixtral-8x7b"),
                "olmoe": ("olmoe-1b-7b", "olmoe-1b-7b"),
                "olmoe-sft": ("olmoe-1b-7b-sft", "olmoe-1b-7b"),
                "olmoe-dpo": ("olmoe-1b-7b-dpo", "olmoe-1b-7b")}
#: The cache sizes: the fraction of each layer's routed experts the LRU holds (MSB slices).
FRACTIONS = (0.125, 0.25, 0.5)
#: Panel (a)'s batch sizes (Table 3's and 2).
BATCHES = (1, 2, 4, 8, 16)
#: Panel (b)'s token counts of one request (consecutive decode tokens, an SD tree's rows).
WINDOWS = (2, 4, 8, 16)
#: Panel (b)'s token counts of different requests (one token each; the traces hold 4).
INTER = (2, 3, 4)
#: The fraction the summary and the plot's panels (a), (c) and (d) use.
PANEL_FRACTION = 0.25


def count_popularity(table=None) -> dict:
    """Per-token pick probabilities from the expert-count table: ``{(model, domain): p}``,
    ``p`` a float ``[layers, experts]`` array (layers 0, 7, 15 in order; a row sums to the
    model's top-k), from the ``expert_counts`` rows (every top-k pick) over the tokens of the
    domain: the ``expert_counts_top1`` rows' sum where the table has them (one top-1 pick a
    token), else the picks over the top-k. ``model`` as :data:`COUNT_MODELS` names it.

    ``table``: ``{(model, variant, domain, layer): counts [E]}``
    (:func:`~.tracegen.expert_count_table`; default: read from the traces folder). Raises
    :class:`UserError` naming the (model, domain, layer) for a model not in
    :data:`COUNT_MODELS`, an expert count not the preset's, picks that are not top-k times the
    top-1 picks, or a domain whose layers have different token counts."""
    from .models import model_preset
    from .tracegen import expert_count_table
    if table is None:
        table = expert_count_table()
    out = {}
    for (name, variant, domain, layer), counts in sorted(table.items()):
        if variant != "expert_counts":
            continue
        if name not in COUNT_MODELS:
            raise UserError(f"expert counts ({name}, {domain}, layer {layer}): unknown model "
                            f"{name!r}; known: {', '.join(COUNT_MODELS)}")
        label, preset = COUNT_MODELS[name]
        m = model_preset(preset)
        where = f"expert counts ({name}, {domain}, layer {layer})"
        if len(counts) != m.routed_experts:
            raise UserError(f"{where}: {len(counts)} experts, expected {m.routed_experts} "
                            f"({preset})")
        picks = int(np.sum(counts))
        top1 = table.get((name, "expert_counts_top1", domain, layer))
        tokens = int(np.sum(top1)) if top1 is not None else picks / m.top_k
        if not tokens or picks != m.top_k * tokens:
            raise UserError(f"{where}: {picks} picks over {tokens} tokens, expected top-k "
                            f"{m.top_k} picks a token ({preset})")
        out.setdefault((label, domain), {})[layer] = np.asarray(counts, float) / tokens
    res = {}
    for key, layers in out.items():
        res[key] = np.stack([layers[j] for j in sorted(layers)])
    return res


def _fractions(fractions) -> tuple:
    if isinstance(fractions, (str, bytes)) or not hasattr(fractions, "__iter__"):
        raise UserError(f"fractions: expected a sequence of cache fractions in (0, 1], got "
                        f"{fractions!r}")
    fr = tuple(fractions)
    if not fr or not all(is_real(f) and 0 < f <= 1 for f in fr):
        raise UserError(f"fractions: expected a non-empty sequence of cache fractions in "
                        f"(0, 1], got {fractions!r}")
    return tuple(float(f) for f in fr)


def _che_rows(source: dict, p: np.ndarray, fractions, batches, whole: bool = False) -> list:
    """Che's miss rate of ``p [layers, experts]`` at every fraction and batch: one row each,
    ``source``'s fields with ``fraction``, ``batch``, ``slots`` (MSB slices over the layers;
    ``whole``: an integer a layer, as a replayed cache has) and ``che`` (miss rate);
    ``exact``, ``exact_layer`` and ``zipf_model`` None (filled where a trace is replayed)."""
    L, E = p.shape
    rows = []
    for f in fractions:
        slots = int(round(f * E)) * L if whole else f * E * L
        rows += [{**source, "fraction": f, "batch": b, "slots": slots,
                  "che": 1 - che_global(p, slots, b), "exact": None, "exact_layer": None,
                  "zipf_model": None} for b in batches]
    return rows


def merged_trace(traces: dict):
    """The requests of every trace of ``traces`` (``{name: RoutingTrace}`` of one model: the
    same experts, top-k and layers) as one :class:`~.trace.RoutingTrace`, each trace's
    request ids offset past the previous ones' (in ``traces``' order): a workload mixing the
    traces' tasks, as MT-Bench mixes its categories. Router scores are kept only when every
    trace has them. Raises :class:`UserError` naming the trace whose experts, top-k or layers
    differ from the first's."""
    from .trace import RoutingTrace
    items = list(traces.items())
    first = items[0][1]
    cols = {k: [] for k in ("request", "position", "layer", "phase", "expert_ids",
                            "gate_weights", "scores")}
    offset = 0
    for name, t in items:
        if (t.num_experts, t.expert_ids.shape[1], tuple(t.layer_ids)) != (
                first.num_experts, first.expert_ids.shape[1], tuple(first.layer_ids)):
            raise UserError(f"traces[{name!r}]: {t.num_experts} experts, top-"
                            f"{t.expert_ids.shape[1]}, {len(t.layer_ids)} layers; expected "
                            f"the first trace's {first.num_experts}, top-"
                            f"{first.expert_ids.shape[1]}, {len(first.layer_ids)}")
        cols["request"].append(t.request.astype(np.int64) + offset)
        offset += int(t.request.max()) + 1 if len(t.request) else 0
        for k in ("position", "layer", "phase", "expert_ids", "gate_weights", "scores"):
            cols[k].append(getattr(t, k))
    parts = cols.pop("scores")
    scores = np.concatenate(parts) if all(x is not None for x in parts) else None
    return RoutingTrace(**{k: np.concatenate(v) for k, v in cols.items()}, scores=scores,
                        num_experts=first.num_experts, layer_ids=tuple(first.layer_ids),
                        model=first.model, source=" + ".join(str(n) for n, _ in items))


def fig16(traces=None, table=None, *, fractions=FRACTIONS, batches=BATCHES,
          windows=WINDOWS) -> dict:
    """Fig. 16 (Section 7.3 A) on real routing: expert locality by batch, by request, by
    model and by benchmark (module docstring).

    ``traces``: ``{benchmark: RoutingTrace}`` of Mixtral-8x7B decode routing (default: the
    real traces of :data:`~.corpus.ROUTING_FILES`); ``table``: the expert-count table
    (:func:`count_popularity`; default: the real one); ``fractions``: cache sizes, fractions
    of each layer's experts in (0, 1]; ``batches``: integers >= 1; ``windows``: integers >= 2.

    Returns a dict: ``miss`` (panels a, c, d), a row per (source, fraction, batch): ``model``,
    ``family`` (its preset: a fine-tuned variant's base model), ``benchmark``, ``kind``
    (``"trace"``: a real decode trace, ``"counts"``: the count table, ``"zipf-fit"``: a Table
    3 model's fitted Zipf law), ``mixture`` (True for the traces' requests together,
    :func:`merged_trace`, a workload of two or more traces), ``layers``, ``experts``,
    ``top_k``, ``fraction``, ``batch``, ``slots`` (MSB slices over the layers; a trace's a
    whole number a layer), ``che`` (Che's miss rate of one LRU over the layers,
    :func:`~.paper_eval.che_global`, from the source's per-layer popularity); on a trace
    also ``zipf_model`` (the miss rate Table 3's cache model gives with a Zipf law fitted to
    the trace: :meth:`~.paper_eval.ExpertPopularity.step`, token form, ``slots / layers`` a
    layer), and where the batch is at most the trace's requests (taken ``batch`` at a time in
    lockstep) the exact LRU's: ``exact`` (one LRU over all layers, :func:`~.hbcache.replay`)
    and ``exact_layer`` (one a layer, :func:`~.hbcache.replay_per_layer`); None otherwise.
    ``unique`` (panel b): :func:`~.paper_eval.routing_exponents` on the traces (the distinct
    experts a layer of ``n`` consecutive tokens of one request, ``windows``, and of one token
    of each of ``n`` requests, :data:`INTER`, against ``n`` independent tokens); ``spread``:
    :func:`locality_spread` of the real sources' single-benchmark rows. Raises
    :class:`UserError` naming the parameter for a bad ``fractions``, ``batches`` or
    ``windows``, a trace not of Mixtral-8x7B's layers and experts, and as
    :func:`count_popularity` and :func:`~.paper_eval.routing_exponents`; for a missing trace
    or table file, naming the file and the traces folder. About 10 s (the exact LRUs)."""
    from .corpus import ROUTING_FILES, ROUTING_MODEL, routing_path, traces_hint
    from .hbcache import HBExpertCache, replay, replay_per_layer
    from .models import model_preset
    from .trace import import_vllm_jsonl
    fractions = _fractions(fractions)
    batches = _int_seq("batches", batches, 1)
    windows = _int_seq("windows", windows, 2)
    mix = model_preset(ROUTING_MODEL)
    if traces is None:
        traces = {}
        for name in ROUTING_FILES:
            path = routing_path(name)
            if not path.is_file():
                raise UserError(f"fig16: the real trace {path} is missing{traces_hint()}")
            traces[name] = import_vllm_jsonl(path, model=mix)[0]
    if not isinstance(traces, dict) or not traces:
        raise UserError(f"traces: expected {{benchmark: RoutingTrace}} of {ROUTING_MODEL}, got "
                        f"{type(traces).__name__}")
    rows = []
    workloads = dict(traces)
    if len(traces) > 1:
        workloads["+".join(map(str, traces))] = merged_trace(traces)
    for bench, tr in workloads.items():
        p = trace_popularity(tr)
        src = {"model": ROUTING_MODEL, "family": ROUTING_MODEL, "benchmark": str(bench),
               "kind": "trace", "mixture": bench not in traces,
               "layers": p.shape[0], "experts": p.shape[1], "top_k": mix.top_k}
        got = _che_rows(src, p, fractions, batches, whole=True)
        requests = len(tr.requests("decode"))
        pop = ExpertPopularity(mix.routed_experts, mix.top_k, fit_zipf(p))
        for r in got:
            per_layer = r["slots"] // p.shape[0]
            uniq, hits = pop.step(r["batch"], per_layer, "token")
            r["zipf_model"] = 1 - hits / uniq
            if r["batch"] <= requests:
                cache = HBExpertCache(capacity_bytes=r["slots"] * mix.expert_msb_bytes,
                                      model=mix)
                r["exact"] = 1 - replay(tr, cache, batch=r["batch"]).hit_rate
                r["exact_layer"] = 1 - replay_per_layer(tr, mix, per_layer,
                                                        batch=r["batch"]).hit_rate
        rows += got
    families = {label: preset for label, preset in COUNT_MODELS.values()}
    if table is None:
        from .corpus import COUNT_FILE, traces_dir
        path = traces_dir() / COUNT_FILE
        if not path.is_file():
            raise UserError(f"fig16: the expert count table {path} is missing{traces_hint()}")
    for (model, domain), p in count_popularity(table).items():
        src = {"model": model, "family": families[model], "benchmark": domain,
               "kind": "counts", "mixture": False, "layers": p.shape[0],
               "experts": p.shape[1], "top_k": int(round(p.sum(axis=1).mean()))}
        rows += _che_rows(src, p, fractions, batches)
    for model in TABLE3_MODELS:
        m = model_preset(model)
        p = ExpertPopularity(m.routed_experts, m.top_k, ZIPF[model]).p[None, :]
        src = {"model": model, "family": model, "mixture": False,
               "benchmark": "mt-bench (Zipf fitted on Table 3)",
               "kind": "zipf-fit", "layers": 1, "experts": m.routed_experts,
               "top_k": m.top_k}
        rows += _che_rows(src, p, fractions, batches)
    total = sum(len(t.requests("decode")) for t in traces.values())
    unique = routing_exponents(list(traces.values()), windows=windows,
                               batches=tuple(n for n in INTER if n <= total) or (2,))
    return {"miss": rows, "unique": unique,
            "spread": locality_spread([r for r in rows if r["kind"] != "zipf-fit"
                                       and not r["mixture"]])}


def locality_spread(rows, fraction: float = PANEL_FRACTION, batch: int = 1) -> dict:
    """How much Che's miss rate varies across benchmarks, across models and across one
    model's fine-tuned variants (panels c and d; the paper: "varies substantially across
    models but modestly across benchmarks"), over :func:`fig16`'s ``miss`` rows at
    ``fraction`` and ``batch``, each source kind apart. ``across_benchmarks``: per (model,
    kind) with two benchmarks or more, the range (max - min) of its benchmarks' miss rates;
    ``across_models``: per (benchmark, kind) with two model families or more, the range over
    the families' base models (a row whose ``model`` is its ``family``); ``across_variants``:
    per (family, benchmark, kind) with two models or more (OLMoE and its SFT and DPO
    variants on tulu), the range over them. Each has ``ranges`` (``{"<key> (<kind>)":
    range}``), their ``mean`` and ``max`` (None without a range); ``ratio`` is the mean range
    across models over the mean across benchmarks (None without both). Raises
    :class:`UserError` for a ``fraction`` or ``batch`` no row has."""
    sel = [r for r in rows if is_real(fraction) and abs(r["fraction"] - fraction) < 1e-12
           and r["batch"] == batch]
    if not sel:
        raise UserError(f"locality_spread: no row at fraction {fraction!r} and batch {batch!r}")

    def ranges(key, over, rows):
        groups = {}
        for r in rows:
            groups.setdefault(key(r) + (r["kind"],), {})[r[over]] = r["che"]
        out = {f"{' '.join(map(str, k[:-1]))} ({k[-1]})": max(v.values()) - min(v.values())
               for k, v in sorted(groups.items()) if len(v) > 1}
        vals = list(out.values())
        return {"ranges": out, "mean": float(np.mean(vals)) if vals else None,
                "max": float(max(vals)) if vals else None}

    base = [r for r in sel if r["model"] == r["family"]]
    res = {"fraction": float(fraction), "batch": int(batch),
           "across_benchmarks": ranges(lambda r: (r["model"],), "benchmark", sel),
           "across_models": ranges(lambda r: (r["benchmark"],), "family", base),
           "across_variants": ranges(lambda r: (r["family"], r["benchmark"]), "model", sel)}
    a, b = res["across_models"]["mean"], res["across_benchmarks"]["mean"]
    res["ratio"] = a / b if a is not None and b else None
    return res

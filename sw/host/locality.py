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

:func:`fig16` measures the four panels on them, with the expert cache holding a fraction of
every layer's experts as MSB slices (a fraction, not bytes, so models of different expert
sizes compare), and puts beside them the Table 3 models' Zipf laws (:data:`~.paper_eval.ZIPF`:
fitted on Table 3's Phi_AR cells, not routing data, so named apart). Every rate is a miss
rate (1 - the hit rate).
"""

from __future__ import annotations

import numpy as np

from ...checks import is_real
from ...errors import UserError
from .paper_eval import (TABLE3_MODELS, ZIPF, ExpertPopularity, _int_seq, cache_check,
                         che_global, fit_zipf, routing_exponents, trace_popularity)

__all__ = ["COUNT_MODELS", "FRACTIONS", "BATCHES", "WINDOWS", "INTER", "PANEL_FRACTION",
           "FIG16_UNITS", "count_popularity", "real_routing", "merged_trace", "fig16",
           "locality_spread"]

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
#: What :func:`fig16`'s ``miss`` rows' rate fields are (its ``--json`` carries them).
FIG16_UNITS = {
    "che_miss": "miss rate, Che's approximation of one LRU over the layers (independent "
                "tokens of the source's per-layer popularity, a step's distinct experts once)",
    "table3_form_miss": "miss rate of Table 3's cache form (ExpertPopularity.step, token form, "
                        "hits capped at the slots; an LRU a layer) with a Zipf law: fitted to "
                        "the trace (kind trace) or Table 3's (kind zipf-fit)",
    "exact_miss": "miss rate, the exact LRU over all layers replayed on the trace",
    "exact_layer_miss": "miss rate, the exact LRU a layer replayed on the trace",
    "slots": "MSB slices over the layers", "fraction": "of every layer's routed experts"}


def count_popularity(table=None) -> dict:
    """Per-token pick probabilities from the expert-count table: ``{(model, domain): p}``,
    ``p`` a float ``[layers, experts]`` array (the table's layers in order; a row sums to the
    model's top-k), from the ``expert_counts`` rows (every top-k pick) over the tokens of the
    domain: the ``expert_counts_top1`` rows' sum where the table has them (one top-1 pick a
    token), else the picks over the top-k. ``model`` as :data:`COUNT_MODELS` names it.

    ``table``: ``{(model, variant, domain, layer): counts [E]}``
    (:func:`~.tracegen.expert_count_table`; default: read from the traces folder). Raises
    :class:`UserError` naming the (model, domain, layer) for a model not in
    :data:`COUNT_MODELS`, an expert count not the preset's, picks that are not top-k a token
    (a top-1 sum that disagrees, or picks not a multiple of top-k), an expert picked more
    often than there are tokens, or a domain whose layers have different token counts."""
    from .models import model_preset
    from .tracegen import expert_count_table
    if table is None:
        table = expert_count_table()
    out, tokens_of = {}, {}
    for (name, variant, domain, layer), counts in sorted(table.items()):
        if variant != "expert_counts":
            continue
        where = f"expert counts ({name}, {domain}, layer {layer})"
        if name not in COUNT_MODELS:
            raise UserError(f"{where}: unknown model {name!r}; known: {', '.join(COUNT_MODELS)}")
        label, preset = COUNT_MODELS[name]
        m = model_preset(preset)
        if len(counts) != m.routed_experts:
            raise UserError(f"{where}: {len(counts)} experts, expected {m.routed_experts} "
                            f"({preset})")
        picks = int(np.sum(counts))
        top1 = table.get((name, "expert_counts_top1", domain, layer))
        tokens = int(np.sum(top1)) if top1 is not None else picks // m.top_k
        if not tokens or picks != m.top_k * tokens:
            raise UserError(f"{where}: {picks} picks over "
                            + (f"{tokens} tokens (the top-1 rows)" if top1 is not None
                               else "the tokens")
                            + f", expected top-k {m.top_k} picks a token ({preset})")
        if int(np.max(counts)) > tokens:
            raise UserError(f"{where}: an expert picked {int(np.max(counts))} times over "
                            f"{tokens} tokens (at most once a token)")
        first = tokens_of.setdefault((label, domain), (layer, tokens))
        if first[1] != tokens:
            raise UserError(f"{where}: {tokens} tokens, layer {first[0]} of the domain has "
                            f"{first[1]}")
        out.setdefault((label, domain), {})[layer] = np.asarray(counts, float) / tokens
    return {key: np.stack([layers[j] for j in sorted(layers)]) for key, layers in out.items()}


def real_routing(who: str = "fig16") -> dict:
    """The real Mixtral-8x7B decode traces of :data:`~.corpus.ROUTING_FILES`, ``{name:
    RoutingTrace}``. Raises :class:`UserError` naming ``who``, the missing file and the traces
    folder (:func:`~.corpus.traces_hint`) when one is not there."""
    from .corpus import ROUTING_FILES, ROUTING_MODEL, routing_path, traces_hint
    from .trace import import_vllm_jsonl
    out = {}
    for name in ROUTING_FILES:
        path = routing_path(name)
        if not path.is_file():
            what = "a folder, not a file" if path.is_dir() else "missing"
            raise UserError(f"{who}: the real trace {path} is {what}{traces_hint()}")
        out[name] = import_vllm_jsonl(path, model=ROUTING_MODEL)[0]
    return out


def merged_trace(traces: dict):
    """The requests of every trace of ``traces`` (``{name: RoutingTrace}`` of one model: the
    same experts, top-k and layers) as one :class:`~.trace.RoutingTrace`, interleaved: the
    ``i``-th request of trace ``t`` (in request-id order) becomes request ``i x len(traces) +
    t``, so a batch of ``len(traces)`` consecutive requests takes one of each trace (a
    workload mixing the traces' tasks, as MT-Bench mixes its categories). Router scores are
    kept only when every trace has them. Raises :class:`UserError` for no traces and naming
    the trace whose experts, top-k or layers differ from the first's."""
    from .trace import RoutingTrace
    if not isinstance(traces, dict) or not traces:
        raise UserError("traces: expected {name: RoutingTrace} of one model, got "
                        f"{traces!r}")
    items = list(traces.items())
    first = items[0][1]
    cols = {k: [] for k in ("request", "position", "layer", "phase", "expert_ids",
                            "gate_weights", "scores")}
    for t_i, (name, t) in enumerate(items):
        if (t.num_experts, t.expert_ids.shape[1], tuple(t.layer_ids)) != (
                first.num_experts, first.expert_ids.shape[1], tuple(first.layer_ids)):
            raise UserError(f"traces[{name!r}]: {t.num_experts} experts, top-"
                            f"{t.expert_ids.shape[1]}, {len(t.layer_ids)} layers; expected "
                            f"the first trace's {first.num_experts}, top-"
                            f"{first.expert_ids.shape[1]}, {len(first.layer_ids)}")
        rank = np.unique(t.request, return_inverse=True)[1]
        cols["request"].append(rank.astype(np.int64) * len(items) + t_i)
        for k in ("position", "layer", "phase", "expert_ids", "gate_weights", "scores"):
            cols[k].append(getattr(t, k))
    parts = cols.pop("scores")
    scores = np.concatenate(parts) if all(x is not None for x in parts) else None
    return RoutingTrace(**{k: np.concatenate(v) for k, v in cols.items()}, scores=scores,
                        num_experts=first.num_experts, layer_ids=tuple(first.layer_ids),
                        model=first.model, source=" + ".join(str(n) for n, _ in items))


def _fractions(fractions) -> tuple:
    if isinstance(fractions, (str, bytes)) or not hasattr(fractions, "__iter__"):
        raise UserError(f"fractions: expected a sequence of cache fractions in (0, 1], got "
                        f"{fractions!r}")
    fr = tuple(fractions)
    if not fr or not all(is_real(f) and 0 < f <= 1 for f in fr):
        raise UserError(f"fractions: expected a non-empty sequence of cache fractions in "
                        f"(0, 1], got {fractions!r}")
    return tuple(float(f) for f in fr)


def _rows(source: dict, p: np.ndarray, fractions, batches, *, whole: bool = False,
          zipf: float | None = None) -> list:
    """A row per fraction and batch of ``p [layers, experts]`` (pick probabilities):
    ``source``'s fields, ``fraction``, ``batch``, ``slots`` (MSB slices over the layers;
    ``whole``: a whole number a layer, as a replayed cache has), ``che_miss``, and with a
    ``zipf`` exponent ``table3_form_miss`` (:data:`FIG16_UNITS`); the exact LRU's None."""
    L, E = p.shape
    rows = []
    for f in fractions:
        per = round(f * E) if whole else f * E
        pop = None if zipf is None else ExpertPopularity(E, source["top_k"], zipf)
        for b in batches:
            row = {**source, "fraction": f, "batch": b, "slots": per * L,
                   "che_miss": 1 - che_global(p, per * L, b), "table3_form_miss": None,
                   "exact_miss": None, "exact_layer_miss": None}
            if pop is not None:
                uniq, hits = pop.step(b, per, "token")
                row["table3_form_miss"] = 1 - hits / uniq
            rows.append(row)
    return rows


def fig16(traces=None, table=None, *, fractions=FRACTIONS, batches=BATCHES,
          windows=WINDOWS) -> dict:
    """Fig. 16 (Section 7.3 A) on real routing: expert locality by batch, by request, by
    model and by benchmark (module docstring).

    ``traces``: ``{benchmark: RoutingTrace}`` of Mixtral-8x7B decode routing (default:
    :func:`real_routing`); ``table``: the expert-count table (:func:`count_popularity`;
    default: the real one); ``fractions``: cache sizes, fractions of each layer's experts in
    (0, 1]; ``batches``: integers >= 1; ``windows``: integers >= 2.

    Returns a dict: ``miss`` (panels a, c, d), a row per (source, fraction, batch): ``model``,
    ``family`` (its preset: a fine-tuned variant's base model), ``benchmark``, ``kind``
    (``"trace"``: a real decode trace, ``"counts"``: the count table, ``"zipf-fit"``: a Table
    3 model's fitted Zipf law), ``mixture`` (True for the traces' requests together,
    :func:`merged_trace`), ``layers``, ``experts``, ``top_k``, ``fraction``, ``batch``,
    ``slots`` and the miss rates of :data:`FIG16_UNITS`: ``che_miss`` on every row;
    ``table3_form_miss`` on trace rows (a Zipf law fitted to the trace) and zipf-fit rows;
    ``exact_miss`` and ``exact_layer_miss`` on trace rows whose batch is at most the trace's
    requests (taken ``batch`` at a time in lockstep; :func:`~.paper_eval.cache_check`), else
    None. ``unique`` (panel b): :func:`~.paper_eval.routing_exponents` on the traces (the
    distinct experts a layer of ``n`` consecutive tokens of one request, ``windows``, and of
    one token of each of ``n`` requests, :data:`INTER`, against ``n`` independent tokens);
    ``spread``: :func:`locality_spread` of the rows. Raises :class:`UserError` naming the
    parameter for a bad ``fractions``, ``batches`` or ``windows``, a trace not of
    Mixtral-8x7B's layers and experts, and as :func:`count_popularity`,
    :func:`real_routing` and :func:`~.paper_eval.routing_exponents`; for a missing table
    file, naming the file and the traces folder. About 10 s (the exact LRUs)."""
    from .corpus import COUNT_FILE, ROUTING_MODEL, traces_dir, traces_hint
    from .models import model_preset
    fractions = _fractions(fractions)
    batches = _int_seq("batches", batches, 1)
    windows = _int_seq("windows", windows, 2)
    mix = model_preset(ROUTING_MODEL)
    if traces is None:
        traces = real_routing("fig16")
    if not isinstance(traces, dict) or not traces:
        raise UserError(f"traces: expected {{benchmark: RoutingTrace}} of {ROUTING_MODEL}, got "
                        f"{type(traces).__name__}")
    if table is None and not (traces_dir() / COUNT_FILE).is_file():
        raise UserError(f"fig16: the expert count table {traces_dir() / COUNT_FILE} is "
                        f"missing{traces_hint()}")
    rows = []
    workloads = dict(traces)
    if len(traces) > 1:
        workloads["+".join(map(str, traces))] = merged_trace(traces)
    for bench, tr in workloads.items():
        p = trace_popularity(tr)
        src = {"model": ROUTING_MODEL, "family": ROUTING_MODEL, "benchmark": str(bench),
               "kind": "trace", "mixture": bench not in traces, "layers": p.shape[0],
               "experts": p.shape[1], "top_k": mix.top_k}
        got = _rows(src, p, fractions, batches, whole=True, zipf=fit_zipf(p))
        exact = [b for b in batches if b <= len(tr.requests("decode"))]
        if exact:
            per = sorted({r["slots"] // p.shape[0] for r in got})
            lru = {(c["slots_per_layer"], c["batch"]): c
                   for c in cache_check(tr, mix, slots_per_layer=per, batches=exact)}
            for r in got:
                c = lru.get((r["slots"] // p.shape[0], r["batch"]))
                if c is not None:
                    r["exact_miss"], r["exact_layer_miss"] = 1 - c["exact"], 1 - c["exact_layer"]
        rows += got
    families = {label: preset for label, preset in COUNT_MODELS.values()}
    for (model, domain), p in count_popularity(table).items():
        src = {"model": model, "family": families[model], "benchmark": domain,
               "kind": "counts", "mixture": False, "layers": p.shape[0],
               "experts": p.shape[1], "top_k": int(round(p.sum(axis=1).mean()))}
        rows += _rows(src, p, fractions, batches)
    for model in TABLE3_MODELS:
        m = model_preset(model)
        p = ExpertPopularity(m.routed_experts, m.top_k, ZIPF[model]).p[None, :]
        src = {"model": model, "family": model, "mixture": False,
               "benchmark": "mt-bench (Zipf fitted on Table 3)", "kind": "zipf-fit",
               "layers": 1, "experts": m.routed_experts, "top_k": m.top_k}
        rows += _rows(src, p, fractions, batches, zipf=ZIPF[model])
    total = sum(len(t.requests("decode")) for t in traces.values())
    unique = routing_exponents(list(traces.values()), windows=windows,
                               batches=tuple(n for n in INTER if n <= total) or (2,))
    return {"miss": rows, "unique": unique, "spread": locality_spread(rows)}


def locality_spread(rows, fraction: float = PANEL_FRACTION, batch: int = 1) -> dict:
    """How much the miss rate varies across benchmarks, across models and across one model's
    fine-tuned variants (panels c and d; the paper: "varies substantially across models but
    modestly across benchmarks"), over :func:`fig16`'s ``miss`` rows at ``fraction`` and
    ``batch``. The three spreads compare one estimator on one kind of data, Che's miss rate on
    the count table's rows: ``across_benchmarks`` per model (its domains), ``across_models``
    per domain over the model families' base models (a row whose ``model`` is its
    ``family``), ``across_variants`` per (family, domain) over its models (OLMoE and its SFT
    and DPO variants on tulu). Each has ``ranges`` (``{"<key>": max - min}``), their ``mean``
    and ``max`` (None without a range); ``ratio`` is the mean range across models over the
    mean across benchmarks (None without both). ``traces``: the single-benchmark traces'
    range (GSM8K against HumanEval) of ``exact_layer_miss`` and of ``che_miss`` (None without
    two traces with the exact rate). Raises :class:`UserError` for a ``fraction`` or
    ``batch`` no row has."""
    sel = [r for r in rows if is_real(fraction) and abs(r["fraction"] - fraction) < 1e-12
           and r["batch"] == batch]
    if not sel:
        raise UserError(f"locality_spread: no row at fraction {fraction!r} and batch {batch!r}")
    counts = [r for r in sel if r["kind"] == "counts"]

    def ranges(key, over, rows, field="che_miss"):
        groups = {}
        for r in rows:
            if r[field] is not None:
                groups.setdefault(key(r), {})[r[over]] = r[field]
        out = {" ".join(map(str, k)): max(v.values()) - min(v.values())
               for k, v in sorted(groups.items()) if len(v) > 1}
        vals = list(out.values())
        return {"ranges": out, "mean": float(np.mean(vals)) if vals else None,
                "max": float(max(vals)) if vals else None}

    res = {"fraction": float(fraction), "batch": int(batch),
           "across_benchmarks": ranges(lambda r: (r["model"],), "benchmark", counts),
           "across_models": ranges(lambda r: (r["benchmark"],), "family",
                                   [r for r in counts if r["model"] == r["family"]]),
           "across_variants": ranges(lambda r: (r["family"], r["benchmark"]), "model", counts)}
    a, b = res["across_models"]["mean"], res["across_benchmarks"]["mean"]
    res["ratio"] = a / b if a is not None and b else None
    single = [r for r in sel if r["kind"] == "trace" and not r["mixture"]]
    res["traces"] = {f: ranges(lambda r: (r["model"],), "benchmark", single, f)["max"]
                     for f in ("exact_layer_miss", "che_miss")}
    return res

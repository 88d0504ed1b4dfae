"""Routing statistics and a calibrated synthetic routing generator (BRIEF section 5).

* :func:`routing_stats` -- the figures ``../shared/traces/README.md`` quotes, measured on any
  trace: per-layer load skew (hottest expert's picks / mean picks per expert), mean top-1 gate
  weight, how often consecutive tokens pick the same top-k set and their mean overlap (experts
  in common).
* :func:`expert_count_table` / :func:`count_skew` -- the per-expert selection counts of
  ``olmoe_mixtral_expert_counts.csv`` (OLMoE-1B-7B and Mixtral over ~205k tokens a domain) and
  their skew.
* :class:`SyntheticRouting` and :func:`synthetic_trace` -- a generator of routing with full
  router scores. Model: router logit of expert e at layer l for token t is
  ``b[l, e] + temperature * z[t, l, e]``; the popularity bias ``b[l, e] = -zipf * ln(1 +
  rank_l(e))`` (a Zipf law over a random per-layer ranking, exponent ``zipf``: the popularity
  skew), and ``z`` a unit Gaussian AR(1) process along the tokens of a request with
  correlation ``correlation`` (the token-to-token overlap: 0 = independent tokens, -> 1 = the
  same experts for ever). The logits are then routed by the model's own router
  (:meth:`~elmoe3d.sw.host.models.ModelPreset.route`: scores, top-k, renormalisation), so ids,
  weights and scores are consistent.
* :func:`fit_synthetic` -- grid search of (zipf, correlation, temperature) that reproduces a
  real trace's figures at the same token count (sampling noise included);
  :data:`CALIBRATED` holds the result for Mixtral (both real traces) and OLMoE (the count
  table), which ``tests/host/test_tracegen.py`` re-measures.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...checks import check_int, is_int, is_real
from ...errors import UserError
from ...paths import read_utf8
from .corpus import COUNT_FILE, traces_dir
from .models import model_preset
from .routelog import usage_counts
from .trace import RoutingTrace, TraceError, _phase_code, file_path


__all__ = ["RoutingStats", "routing_stats", "expert_count_table", "count_skew", "usage_counts",
           "expert_usage", "calibrate_from_usage",
           "SyntheticRouting", "synthetic_trace", "fit_synthetic", "CALIBRATED"]


@dataclass(frozen=True)
class RoutingStats:
    """Figures of a trace's routing (one phase).

    Attributes
    ----------
    hot_ratio : ndarray [L]
        Per layer (the trace's ``layer_ids``): picks of the most-picked expert / mean picks per
        expert (all top-k picks). NaN for a layer with no record in the phase (a partial log);
        :attr:`hot_ratio_median` and :meth:`summary` take their min / median / max over the
        logged layers only.
    hot_ratio_top1 : ndarray [L]
        The same counting only each token's first choice (NaN where ``hot_ratio`` is).
    never_chosen : ndarray [L]
        Per layer: fraction of experts never picked (NaN where ``hot_ratio`` is).
    top1_weight : float
        Mean gate weight of the first choice.
    same_set : float
        Fraction of consecutive (token, next token) pairs of a request, per layer, that pick
        the same top-k set.
    overlap : float
        Mean number of experts the two top-k sets of such a pair share (out of k).
    tokens : int
    """

    hot_ratio: np.ndarray
    hot_ratio_top1: np.ndarray
    never_chosen: np.ndarray
    top1_weight: float
    same_set: float
    overlap: float
    tokens: int

    @property
    def hot_ratio_median(self) -> float:
        """Median of :attr:`hot_ratio` over the logged layers."""
        return float(np.median(_logged(self.hot_ratio)))

    def summary(self) -> dict:
        """The figures as a dict; min / median / max over the logged layers."""
        hot, hot1 = _logged(self.hot_ratio), _logged(self.hot_ratio_top1)
        return {"tokens": self.tokens,
                "hot_ratio_min": float(hot.min()),
                "hot_ratio_median": float(np.median(hot)),
                "hot_ratio_max": float(hot.max()),
                "hot_ratio_top1_median": float(np.median(hot1)),
                "hot_ratio_top1_max": float(hot1.max()),
                "top1_weight": self.top1_weight, "same_set": self.same_set,
                "overlap": self.overlap}


def _logged(per_layer: np.ndarray) -> np.ndarray:
    """The entries of a per-layer figure of :class:`RoutingStats` for the logged layers."""
    return per_layer[~np.isnan(per_layer)]


def routing_stats(trace: RoutingTrace, phase="decode") -> RoutingStats:
    """Measure :class:`RoutingStats` on the ``phase`` rows of ``trace`` (missing records are
    left out of every count; a layer of ``trace.layer_ids`` with no record at all gets NaN in
    the per-layer figures and is left out of their min / median / max).

    Raises
    ------
    TraceError
        ``trace`` is not a :class:`RoutingTrace`, ``phase`` is unknown or has no rows."""
    if not isinstance(trace, RoutingTrace):
        raise TraceError(f"trace: expected a RoutingTrace, got {type(trace).__name__}")
    reqs = trace.requests(phase)
    if not reqs:
        raise TraceError(f"routing_stats: no {phase} rows")
    E, L = trace.num_experts, len(trace.layer_ids)
    load = np.zeros((L, E))
    load1 = np.zeros((L, E))
    top1, same, over, pairs, tokens = [], 0, 0.0, 0, 0
    for rr in reqs:
        tokens += rr.tokens
        for j in range(L):
            p = rr.present[:, j]
            ids = rr.ids[p, j].astype(np.int64)
            np.add.at(load[j], ids.ravel(), 1)
            np.add.at(load1[j], ids[:, 0], 1)
            top1.append(rr.weights[p, j, 0])
            both = rr.present[1:, j] & rr.present[:-1, j]
            consecutive = np.diff(rr.positions) == 1
            both &= consecutive
            if both.any():
                a = np.sort(rr.ids[1:, j][both], axis=1)
                b = np.sort(rr.ids[:-1, j][both], axis=1)
                same += int((a == b).all(axis=1).sum())
                common = (a[:, :, None] == b[:, None, :]).any(axis=2).sum(axis=1)
                over += float(common.sum())
                pairs += int(both.sum())
    logged = load.sum(axis=1) > 0               # a layer of a partial log may have no record
    hot, hot1, never = np.full(L, np.nan), np.full(L, np.nan), np.full(L, np.nan)
    hot[logged] = load[logged].max(axis=1) / (load[logged].sum(axis=1) / E)
    hot1[logged] = load1[logged].max(axis=1) / (load1[logged].sum(axis=1) / E)
    never[logged] = (load[logged] == 0).mean(axis=1)
    return RoutingStats(hot_ratio=hot, hot_ratio_top1=hot1, never_chosen=never,
                        top1_weight=float(np.concatenate(top1).mean()),
                        same_set=same / max(pairs, 1), overlap=over / max(pairs, 1),
                        tokens=tokens)


def expert_count_table(path=None) -> dict:
    """Read ``olmoe_mixtral_expert_counts.csv``: ``{(model, variant, domain, layer):
    counts [E] int64}``, experts 0..E-1.

    Raises
    ------
    UserError
        Naming the file and line: a missing or unreadable file, text that is not UTF-8, a wrong
        header, a bad value, the same (model, variant, domain, layer, expert) on two lines (both
        named), or a gap in the expert ids."""
    path = file_path("path", path) if path is not None else traces_dir() / COUNT_FILE
    if not path.is_file():
        raise UserError(f"{path}: expert count table not found (set ELMOE3D_TRACES)")
    rows = {}
    reader = csv.reader(io.StringIO(read_utf8(path), newline=""))
    want = ["model", "variant", "domain", "layer", "expert", "count"]
    try:
        header = next(reader, None)
        if header is None:
            raise UserError(f"{path}: empty file, expected the header {','.join(want)}")
        if header != want:
            raise UserError(f"{path}:1: header {header}, expected {want}")
        end = reader.line_num
        for row in reader:
            lineno, end = end + 1, reader.line_num      # a quoted field may span lines
            try:
                model, variant, domain, layer, expert, count = row
                key = (model, variant, domain, int(layer))
                e, c = int(expert), int(count)
                if e < 0 or c < 0:
                    raise ValueError("negative expert or count")
                if max(e, c) > np.iinfo(np.int64).max:
                    raise ValueError("expert or count beyond a 64-bit integer")
            except ValueError as exc:
                raise UserError(f"{path}:{lineno}: bad row {row} ({exc})") from None
            first = rows.setdefault(key, {}).setdefault(e, (c, lineno))[1]
            if first != lineno:
                raise UserError(f"{path}:{lineno}: model {model!r}, variant {variant!r}, domain "
                                f"{domain!r}, layer {key[3]}, expert {e} again (first at line "
                                f"{first}); expected one count per expert")
    except csv.Error as exc:
        raise UserError(f"{path}:{reader.line_num}: not a CSV row ({exc})") from None
    out = {}
    for key, d in rows.items():
        if sorted(d) != list(range(len(d))):
            raise UserError(f"{path}: {key}: expert ids are not 0..{len(d) - 1}")
        out[key] = np.array([d[e][0] for e in range(len(d))], np.int64)
    return out


def count_skew(counts) -> float:
    """Hottest expert's count / mean count of one layer's expert counts (1-D, >= 0).

    Raises
    ------
    UserError
        No counts, counts that are not a 1-D list of finite numbers >= 0, or no pick at all
        (every count 0: the mean is 0 and the ratio undefined, as :func:`usage_counts` refuses
        such a layer)."""
    c = np.asarray(counts)
    if c.ndim != 1 or c.dtype.kind not in "iuf":
        what = f"shape {c.shape}" if c.dtype.kind in "iuf" else f"{c.dtype.name} values"
        raise UserError(f"counts: expected a 1-D list of expert counts, got {what}")
    c = c.astype(np.float64)
    if not c.size or not np.isfinite(c).all() or (c < 0).any():
        raise UserError("counts: expected finite counts >= 0, got " + (
            "none" if not c.size else f"{len(c)} with a negative or non-finite one"))
    if not c.any():
        raise UserError(f"counts: no pick ({len(c)} counts, all 0); the hot ratio is undefined")
    return float(c.max() / c.mean())


@dataclass(frozen=True)
class SyntheticRouting:
    """Parameters of :func:`synthetic_trace` (see the module docstring for the model).

    Attributes
    ----------
    zipf : float
        Popularity skew: Zipf exponent of the per-layer logit bias (>= 0; 0 = uniform).
    correlation : float
        Token-to-token correlation of the logit noise along a request, in [0, 1): sets the
        overlap of consecutive tokens' expert sets.
    temperature : float
        Scale of the logit noise (> 0): larger = more token-to-token variety and flatter
        popularity, sharper gate weights.

    Raises
    ------
    ValueError
        A parameter that is not a finite real number (a bool is not) in its range, e.g.
        ``"zipf: expected a number >= 0, got True"``.
    """

    zipf: float
    correlation: float
    temperature: float

    def __post_init__(self):
        for name in _PARAM_RANGES:
            v = getattr(self, name)
            if not _param_ok(name, v):
                raise ValueError(f"{name}: expected {_PARAM_RANGES[name][0]}, got {v!r}")


#: :class:`SyntheticRouting`'s parameters: (the words of the range, the range's test).
_PARAM_RANGES = {"zipf": ("a number >= 0", lambda v: v >= 0),
                 "correlation": ("a number in [0, 1)", lambda v: 0 <= v < 1),
                 "temperature": ("a number > 0", lambda v: v > 0)}


def _finite(v) -> bool:
    """``v`` is a finite real number (:func:`is_real`; a bool is not)."""
    if not is_real(v):
        return False
    try:
        return bool(np.isfinite(float(v)))
    except OverflowError:                            # an int beyond the floats
        return False


def _param_ok(name, v) -> bool:
    return _finite(v) and _PARAM_RANGES[name][1](v)


def _candidates(label, name, values) -> tuple:
    """The candidate values of parameter ``name`` for a grid search (``label``: how the user
    gave them) as a tuple of floats; UserError unless a non-empty list, tuple, range or 1-D
    array of numbers in the parameter's range."""
    if not (isinstance(values, (list, tuple, range))
            or isinstance(values, np.ndarray) and values.ndim == 1) or not len(values):
        raise UserError(f"{label}: expected a non-empty list of numbers, got {values!r}")
    for i, v in enumerate(values):
        if not _param_ok(name, v):
            raise UserError(f"{label}[{i}]: expected {_PARAM_RANGES[name][0]}, got {v!r}")
    return tuple(float(v) for v in values)


def synthetic_trace(model, params: SyntheticRouting, *, requests=1, tokens=256, seed=0,
                    phase="decode") -> RoutingTrace:
    """Generate ``requests`` x ``tokens`` tokens of routing over every MoE layer of ``model``
    (a preset name or :class:`~elmoe3d.sw.host.models.ModelPreset`), with full router scores.

    Deterministic for a given ``seed`` (an integer >= 0). Gate weights are stored without the
    routed scaling factor (as :func:`~elmoe3d.sw.host.trace.trace_from_router_logits` does).

    Raises
    ------
    UserError
        An unknown model, ``params`` not a :class:`SyntheticRouting`, ``requests`` or
        ``tokens`` not a positive integer, ``seed`` not an integer >= 0, ``phase`` not one of
        :data:`~elmoe3d.sw.host.trace.PHASES` (a :class:`TraceError`)."""
    preset = model_preset(model)
    if not isinstance(params, SyntheticRouting):
        raise UserError("params: expected a SyntheticRouting")
    for name, v in (("requests", requests), ("tokens", tokens)):
        if not is_int(v, numpy=False) or v < 1:
            raise UserError(f"{name}: expected a positive integer, got {v!r}")
    seed = check_int("seed", seed, 0, error=UserError)
    code = _phase_code(phase)
    rng = np.random.default_rng(seed)
    E, L = preset.routed_experts, preset.moe_layers
    rank = np.argsort(rng.random((L, E)), axis=1)             # random per-layer ranking
    bias = -params.zipf * np.log1p(rank)
    rho = params.correlation
    ids, ws, ss, req, pos, lay = [], [], [], [], [], []
    for r in range(requests):
        z = rng.standard_normal((L, E))
        logits = np.empty((tokens, L, E))
        for t in range(tokens):
            if t:
                z = rho * z + np.sqrt(1 - rho * rho) * rng.standard_normal((L, E))
            logits[t] = bias + params.temperature * z
        for j, layer in enumerate(preset.moe_layer_ids):
            i, w, s = preset.route(logits[:, j])
            ids.append(i)
            ws.append(w / preset.routed_scaling_factor)
            ss.append(s)
            req.append(np.full(tokens, r))
            pos.append(np.arange(tokens))
            lay.append(np.full(tokens, layer))
    return RoutingTrace(
        request=np.concatenate(req), position=np.concatenate(pos), layer=np.concatenate(lay),
        phase=np.full(requests * tokens * L, code),
        expert_ids=np.concatenate(ids), gate_weights=np.concatenate(ws),
        scores=np.concatenate(ss), num_experts=E, layer_ids=tuple(preset.moe_layer_ids),
        model=preset.name,
        source=f"synthetic zipf={params.zipf} correlation={params.correlation} "
               f"temperature={params.temperature} seed={seed}")


_TARGETS = ("hot_ratio_median", "overlap", "top1_weight", "hot_ratio_top1_median",
            "hot_ratio_top1_max", "same_set")


def _distance(stats: dict, target: dict) -> float:
    return sum(((stats[k] - v) / v) ** 2 for k, v in target.items())


def fit_synthetic(model, target: dict, *, requests=1, tokens=256, seed=0, grid=None) -> tuple:
    """Grid search of :class:`SyntheticRouting` whose generated figures come closest (sum of
    squared relative errors) to ``target`` -- a dict with any of ``hot_ratio_median``,
    ``overlap``, ``top1_weight``, ``hot_ratio_top1_median``, ``hot_ratio_top1_max``,
    ``same_set`` (as in
    :meth:`RoutingStats.summary`) -- at the given token count. ``grid`` maps ``zipf``,
    ``correlation``, ``temperature`` to candidate values (defaults cover the real traces).

    Returns ``(params, generated summary dict)``.

    Raises
    ------
    UserError
        ``target`` not a dict of known figures each a finite number > 0 (the distance divides
        by it), ``grid`` not a dict of known parameters each a non-empty list of numbers in the
        parameter's range; what :func:`synthetic_trace` raises for the other arguments."""
    if not isinstance(target, dict):
        raise UserError(f"target: expected a dict of figure -> value, got "
                        f"{type(target).__name__}")
    unknown = sorted(map(repr, set(target) - set(_TARGETS)))
    if unknown or not target:
        what = f"unknown figure(s) {', '.join(unknown)}" if unknown else "no figure"
        raise UserError(f"target: {what}; expected some of {', '.join(_TARGETS)}")
    for k, v in target.items():
        if not (_finite(v) and v > 0):
            raise UserError(f"target[{k!r}]: expected a number > 0 (the fit compares relative "
                            f"errors), got {v!r}")
    if grid is None:
        grid = {}
    elif not isinstance(grid, dict):
        raise UserError(f"grid: expected a dict of parameter -> candidate values, got "
                        f"{type(grid).__name__}")
    unknown = sorted(map(repr, set(grid) - set(_PARAM_RANGES)))
    if unknown:
        raise UserError(f"grid: unknown key(s) {', '.join(unknown)}; expected some of "
                        f"{', '.join(_PARAM_RANGES)}")
    default = {"zipf": (0.0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0),
               "correlation": (0.0, 0.2, 0.35, 0.5, 0.65, 0.8),
               "temperature": (0.5, 0.75, 1.0, 1.5, 2.0)}
    zs, cs, ts = (_candidates(f"grid[{name!r}]", name, grid.get(name, default[name]))
                  for name in _PARAM_RANGES)
    best = None
    for z in zs:
        for c in cs:
            for t in ts:
                p = SyntheticRouting(zipf=z, correlation=c, temperature=t)
                s = routing_stats(synthetic_trace(model, p, requests=requests, tokens=tokens,
                                                  seed=seed)).summary()
                d = _distance(s, target)
                if best is None or d < best[0]:
                    best = (d, p, s)
    return best[1], best[2]


#: Parameters found by :func:`fit_synthetic` / a scan of ``zipf`` (``docs/traces.md`` gives the
#: recipe and the figures). Mixtral-8x7B: fitted on both real JSONL traces (median hot ratio
#: 1.47, overlap 0.74 of 2, top-1 weight 0.705) at 2 requests x 150 tokens. OLMoE-1B-7B: ``zipf``
#: fitted on the count table (median hot ratio 4.48 of all picks, median top-1 hot ratio 11.9) at
#: 4000 tokens; the count table says nothing of consecutive tokens, so ``correlation`` is
#: Mixtral's, and nothing of gate weights, so ``temperature`` is 1. Only ``zipf / temperature``
#: moves the picks (the top-k of ``b + T z`` is that of ``b / T + z``); ``temperature`` alone then
#: sets the gate weights.
CALIBRATED = {
    "mixtral-8x7b": SyntheticRouting(zipf=0.45, correlation=0.3, temperature=1.8),
    "olmoe-1b-7b": SyntheticRouting(zipf=0.43, correlation=0.3, temperature=1.0),
}


# ---------------------------------------------------------------------------------------------
# Expert-usage statistics (per-layer selection counts) as calibration input
# ---------------------------------------------------------------------------------------------

def expert_usage(path) -> dict:
    """Read an expert-usage statistics file (JSON, :func:`usage_counts`): ``{layer name: counts
    [E]}``.

    Raises
    ------
    UserError
        Naming the file: ``path`` not a path, a missing, unreadable or malformed file, JSON
        nested too deeply to read, a key given twice in one JSON object (which layer's counts
        are meant is ambiguous), or what :func:`usage_counts` refuses."""
    import json
    path = file_path("path", path)

    def unique_keys(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise UserError(f"{path}: key {key!r} given twice in one JSON object; expected "
                                f"one value per key")
            seen.add(key)
        return dict(pairs)

    try:
        doc = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=unique_keys)
    except FileNotFoundError:
        raise UserError(f"{path}: no such expert-usage file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from None
    except ValueError as exc:
        raise UserError(f"{path}: not a JSON document ({exc.msg} at line {exc.lineno}); "
                        f"expert-usage statistics are one JSON object or list") from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply to read; expert-usage statistics are "
                        f"per-layer lists of counts") from None
    try:
        return usage_counts(doc)
    except UserError as exc:
        raise UserError(f"{path}: {exc}") from None


def calibrate_from_usage(model, usage, *, tokens=None, seed=0, zipf=None,
                         progress=None) -> tuple:
    """:class:`SyntheticRouting` for ``model`` whose per-layer load skew matches expert-usage
    statistics (``usage``: a JSON path, a parsed document that :func:`usage_counts` reads, or a
    ``.csv`` count table laid out as ``olmoe_mixtral_expert_counts.csv``, of which the
    ``expert_counts`` tables with the model's expert count are used).

    Target: the median over the usage's layers of the hot ratio (hottest expert's count / mean
    count, :func:`count_skew`), matched by a grid search of ``zipf`` (default 0 .. 2 in steps of
    0.05) at ``tokens`` tokens (default: the tokens the counts stand for, picks / top-k, within
    256 .. 4000: sampling noise raises the hot ratio of few tokens); as for OLMoE's count table
    (:data:`CALIBRATED`), counts say nothing of consecutive tokens or gate weights, so
    ``correlation`` is Mixtral's (0.3) and ``temperature`` 1.
    ``progress``: called with one line saying what the grid search (seconds) is about to do,
    once the usage has been read and checked.

    Returns ``(params, {"target": hot ratio, "generated": hot ratio, "layers": n})``.

    Raises
    ------
    UserError
        ``usage`` neither a path nor a parsed document, what :func:`expert_usage`,
        :func:`usage_counts` or :func:`expert_count_table` refuse, a count table with no pick
        in a layer, the usage's expert count not the model's, ``zipf`` not a non-empty list of
        numbers >= 0, ``tokens`` not a positive integer, ``progress`` not callable."""
    preset = model_preset(model)
    if not isinstance(usage, (dict, list, str, os.PathLike)):
        raise UserError(f"usage: expected an expert-usage JSON path, a parsed document (dict or "
                        f"list) or a .csv count table, got {type(usage).__name__}")
    grid = (_candidates("zipf", "zipf", zipf) if zipf is not None
            else tuple(float(z) for z in np.round(np.arange(0, 2.0001, 0.05), 2)))
    if tokens is not None:
        check_int("tokens", tokens, 1, numpy=False, error=UserError)
    if progress is not None and not callable(progress):
        raise UserError(f"progress: expected a function of one line, got "
                        f"{type(progress).__name__}")
    where = "expert usage"
    if isinstance(usage, (dict, list)):
        counts = usage_counts(usage)
    elif str(usage).lower().endswith(".csv"):
        # a count table in the layout of olmoe_mixtral_expert_counts.csv: its tables of all
        # top-k picks with this model's expert count
        where = str(usage)
        # keyed by the (model, variant, domain, layer) tuple: "/"-joined names could collide
        counts = {key: c.astype(np.float64) for key, c in expert_count_table(usage).items()
                  if key[1] == "expert_counts" and len(c) == preset.routed_experts}
        if not counts:
            raise UserError(f"{usage}: no 'expert_counts' table with {preset.routed_experts} "
                            f"experts ({preset.name})")
    else:
        where = str(usage)
        counts = expert_usage(usage)
    widths = {len(c) for c in counts.values()}
    if widths != {preset.routed_experts}:
        raise UserError(f"{where}: {'/'.join(str(w) for w in sorted(widths))} experts per "
                        f"layer, {preset.name} routes over {preset.routed_experts}")
    skews = []
    for name, c in counts.items():
        try:
            skews.append(count_skew(c))
        except UserError as exc:          # a count table's layer with no pick
            if isinstance(name, tuple):
                name = "/".join(str(x) for x in name)
            raise UserError(f"{where}: {name}: {exc}") from None
    target = float(np.median(skews))
    if tokens is None:
        picks = float(np.median([c.sum() for c in counts.values()]))
        tokens = int(np.clip(round(picks / preset.top_k), 256, 4000))
    if progress is not None:
        name = Path(usage).name if isinstance(usage, (str, Path)) else "the expert usage"
        progress(f"fitting synthetic {preset.name} routing to {name} (hot ratio {target:.2f}: "
                 f"{len(grid)} Zipf exponents tried at {tokens} tokens) ...")
    p, got = fit_synthetic(preset, {"hot_ratio_median": target}, tokens=tokens, seed=seed,
                           grid={"zipf": grid,
                                 "correlation": (CALIBRATED["mixtral-8x7b"].correlation,),
                                 "temperature": (1.0,)})
    return p, {"target": target, "generated": got["hot_ratio_median"], "layers": len(counts),
               "tokens": tokens}

"""Routing-log dialects: what a logger's choices do to the rows, and how the importer undoes them.

Pure functions over rows already parsed by :func:`elmoe3d.sw.host.trace.import_vllm_jsonl` (no file
access, no Amaranth), each for one kind of log seen in the wild (``docs/traces.md`` section 3):

* :func:`warmup_blocks` -- the profiling dummy pass an inference server runs before (or between)
  real requests: a long block of records that are all alike. How it is recognised: a run of at
  least :data:`WARMUP_MIN_ROWS` consecutive records (file order) each of which has uniform gate
  weights (all ``1/k``, k > 1: a router fed constant input) or routes exactly as the previous
  or next record of the same layer (ids equal, weights within :data:`SAME_WEIGHT_TOL`), or of
  at least :data:`WARMUP_MIN_UNIFORM_ROWS` records that all have uniform weights. Real
  decode routing does neither for more than a row or two (the real Mixtral logs: at most one
  such row in a row, none uniform).
* :func:`forward_passes` -- logs whose ``token_idx`` is the row inside a forward pass, not the
  token's position: a request's prefill pass logs rows 0..P-1 and every decode step logs row 0
  again (or, indexed in the whole batch, rows a..a+P-1 and then its decode row). The passes are
  found where a layer's index does not rise, and the positions rebuilt as ``offset of the pass
  + row - the pass's first row``; the first pass is the prefill (when it has more
  than one row), later one-row passes are decode steps, multi-row passes before the first decode
  step are chunked prefill, and a multi-row pass after decode started (a speculative
  verification, or a new prompt on the same id) cannot be placed and is refused.
* :func:`router_norm_mismatch` -- gate weights that disagree with the model's router about
  renormalisation (``norm_topk_prob``).
* :func:`usage_counts` -- expert-usage statistics (per-layer selection counts), which are no
  routing log: the importer names them, the synthetic generator calibrates on them
  (:func:`elmoe3d.sw.host.tracegen.calibrate_from_usage`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import numpy as np

from ...errors import UserError


__all__ = ["WARMUP_MIN_ROWS", "WARMUP_MIN_UNIFORM_ROWS", "SAME_WEIGHT_TOL", "WarmupBlock", "warmup_blocks",
           "PassLayout", "DialectError", "layer_by_layer", "forward_passes",
           "router_norm_mismatch",
           "usage_counts"]

#: Fewest consecutive alike records read as a warm-up (profiling dummy) block. A real decode
#: step never repeats a layer's routing exactly for this long; vLLM's profiling pass logs
#: thousands (its dummy batch x the layers).
WARMUP_MIN_ROWS = 256
#: Two gate weights within this are "the same" when comparing records.
SAME_WEIGHT_TOL = 1e-7
#: Gate weights within this of each other are "uniform".
UNIFORM_TOL = 1e-6
#: Fewest consecutive records with uniform gate weights (k > 1) read as a warm-up block: a
#: trained router never splits its weight exactly evenly, so a short run is evidence enough.
WARMUP_MIN_UNIFORM_ROWS = 32


@dataclass(frozen=True)
class WarmupBlock:
    """Rows ``start .. stop - 1`` (indices into the rows given) of one warm-up block.

    ``uniform``: rows with all k gate weights equal; ``repeated``: rows routed exactly as their
    layer's previous or next record."""
    start: int
    stop: int
    uniform: int
    repeated: int

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def reason(self) -> str:
        if self.uniform == self.rows:
            return "every record has uniform gate weights (1/k)"
        if self.repeated == self.rows:
            return "every record routes exactly as its layer's neighbour"
        return "every record has uniform gate weights or routes exactly as its layer's neighbour"


def _same(ids_a, w_a, ids_b, w_b) -> bool:
    return (np.array_equal(ids_a, ids_b)
            and bool(np.all(np.abs(np.asarray(w_a) - np.asarray(w_b)) <= SAME_WEIGHT_TOL)))


def warmup_blocks(layers, ids, weights, *, keys=None, min_rows=WARMUP_MIN_ROWS,
                  min_uniform=WARMUP_MIN_UNIFORM_ROWS) -> list:
    """Warm-up blocks among records in file order.

    Parameters
    ----------
    layers : sequence of int [R]
    ids : sequence of int arrays [R][k]
    weights : sequence of float arrays [R][k]
    keys : sequence [R], optional
        Each record's (request, position) as logged: a record that repeats its layer's
        previous one under the same key is a duplicated line, not evidence of a dummy pass.
    min_rows : int
        Fewest consecutive alike records that make a block (>= 2).
    min_uniform : int
        Fewest consecutive records that make a block when every one has uniform weights.

    Returns a list of :class:`WarmupBlock`, in file order. See the module docstring for the
    rule."""
    if min_rows < 2:
        raise ValueError(f"min_rows: expected >= 2, got {min_rows}")
    n = len(layers)
    uniform = np.zeros(n, bool)
    repeated = np.zeros(n, bool)
    last = {}
    for i in range(n):
        w = np.asarray(weights[i], np.float64)
        if len(w) > 1 and w.max() - w.min() <= UNIFORM_TOL:
            uniform[i] = True
        j = last.get(layers[i])
        if (j is not None and (keys is None or keys[i] != keys[j])
                and _same(ids[i], weights[i], ids[j], weights[j])):
            repeated[i] = repeated[j] = True
        last[layers[i]] = i
    alike = uniform | repeated
    out, i = [], 0
    while i < n:
        if not alike[i]:
            i += 1
            continue
        j = i
        while j < n and alike[j]:
            j += 1
        u = int(uniform[i:j].sum())
        if j - i >= min_rows or (u == j - i and j - i >= min(min_uniform, min_rows)):
            out.append(WarmupBlock(i, j, u, int(repeated[i:j].sum())))
        i = j
    return out


class DialectError(ValueError):
    """The rows of one request cannot be placed; ``index`` is the offending row (into the rows
    given) and the message says why."""

    def __init__(self, message, index):
        super().__init__(message)
        self.index = index


@dataclass(frozen=True)
class PassLayout:
    """Positions and phases rebuilt for one request's rows (:func:`forward_passes`).

    ``position``, ``phase``: per row (phase names); ``sizes``, ``pass_phase``: tokens and
    phase of each forward pass; ``first_restart``: the row where the index first restarts."""
    position: list
    phase: list
    sizes: list
    pass_phase: list
    first_restart: int

    def passes(self, phase) -> int:
        """Forward passes of ``phase``."""
        return self.pass_phase.count(phase)

    def tokens(self, phase) -> int:
        """Tokens in the forward passes of ``phase``."""
        return sum(s for s, p in zip(self.sizes, self.pass_phase) if p == phase)


def layer_by_layer(layers) -> bool:
    """True if each layer's records are contiguous (a log written layer by layer, as the real
    Mixtral logs are) and there is more than one layer; False for a log that goes pass by pass
    (every layer in turn within each forward pass)."""
    seq = [x for i, x in enumerate(layers) if i == 0 or x != layers[i - 1]]
    return len(seq) == len(set(seq)) and len(seq) > 1


def forward_passes(layers, index, phases=None) -> PassLayout:
    """Rebuild positions and phases of one request whose index is the row inside a forward pass.

    Parameters
    ----------
    layers, index : sequences of int [R], in file order (one request)
    phases : sequence of (str or None) [R], optional
        A phase a row states itself (``"prefill"``/``"decode"``); None where it states none.

    Passes are split where a layer's index does not rise (``index <= previous`` of that layer
    in the current pass): in file order across layers when the log interleaves layers (pass by
    pass), per layer when each layer's records are contiguous (layer by layer; the passes are
    then matched by their order, and every layer must have as many: a record missing from one
    layer's decode steps cannot be placed). A pass's first row is its lowest index over the
    layers (0 when the index is the row inside the request's part of the pass; the request's
    first row in the batch when it is the row inside the whole batch). Raises
    :class:`DialectError` naming the row and the reason when the passes cannot be matched or
    placed."""
    n = len(layers)
    if phases is None:
        phases = [None] * n
    layer_major = layer_by_layer(layers)
    pass_of = [0] * n
    first_restart = None
    if layer_major:
        count = {}
        for lay in dict.fromkeys(layers):
            rows = [i for i in range(n) if layers[i] == lay]
            p, prev = 0, None
            for i in rows:
                if prev is not None and index[i] <= index[prev]:
                    p += 1
                    first_restart = i if first_restart is None else min(first_restart, i)
                pass_of[i] = p
                prev = i
            count[lay] = p + 1
        if len(set(count.values())) > 1:
            lo = min(count, key=count.get)
            hi = max(count, key=count.get)
            i = next(i for i in range(n) if layers[i] == lo)
            raise DialectError(f"the index restarts {count[hi] - 1} times in layer {hi} but "
                               f"{count[lo] - 1} times in layer {lo}, whose records are logged "
                               f"layer by layer: which forward pass lacks a record cannot be "
                               f"told, so its passes cannot be matched across layers", i)
    else:
        p, seen = 0, {}
        for i in range(n):
            lay = layers[i]
            if lay in seen and index[i] <= seen[lay]:
                p += 1
                seen = {}
                first_restart = i if first_restart is None else first_restart
            seen[lay] = index[i]
            pass_of[i] = p
    passes = max(pass_of) + 1
    base = [min(index[i] for i in range(n) if pass_of[i] == q) for q in range(passes)]
    size = [0] * passes
    stated = [set() for _ in range(passes)]
    first_row = [None] * passes
    for i in range(n):
        q = pass_of[i]
        size[q] = max(size[q], index[i] - base[q] + 1)
        if phases[i] is not None:
            stated[q].add(phases[i])
        if first_row[q] is None:
            first_row[q] = i
    phase_of = []
    decode_seen = False
    for q in range(passes):
        if len(stated[q]) > 1:
            raise DialectError(f"a forward pass mixes phases {sorted(stated[q])}", first_row[q])
        if stated[q]:
            ph = next(iter(stated[q]))
            if ph not in ("prefill", "decode"):
                raise DialectError(f"the index restarts inside {ph} rows: positions can be "
                                   f"rebuilt for prefill and decode logs only", first_row[q])
        elif size[q] == 1 and (q > 0 or passes == 1 or max(size) == 1):
            ph = "decode"
        else:
            ph = "prefill"
        if ph == "prefill" and decode_seen:
            raise DialectError(f"a forward pass of {size[q]} rows after decode steps "
                               f"(a speculative verification, or a new prompt under the same "
                               f"request id?): its positions cannot be placed", first_row[q])
        decode_seen |= ph == "decode"
        phase_of.append(ph)
    offset = np.concatenate([[0], np.cumsum(size)]).astype(int)
    position = [int(offset[pass_of[i]] + index[i] - base[pass_of[i]]) for i in range(n)]
    return PassLayout(position=position, phase=[phase_of[pass_of[i]] for i in range(n)],
                      sizes=size, pass_phase=phase_of,
                      first_restart=first_restart if first_restart is not None else 0)


def router_norm_mismatch(sums, preset, tol) -> tuple:
    """Rows whose gate weights disagree with ``preset``'s router about renormalisation.

    ``sums``: float64 [R], each row's gate weights summed as logged. A router that renormalises
    its top-k (``norm_topk_prob``) gives rows summing to 1 (within ``tol``); one that does not
    gives rows summing below 1 (the top-k's share of the softmax; 1 only for a token that puts
    all its weight on k experts). Returns ``(rows that disagree, message)`` or ``(0, None)``:
    with renormalisation, every row not summing to 1 (one is enough to show it); without, the
    rows summing to 1 when they are most of the log (k < E)."""
    sums = np.asarray(sums, np.float64)
    n = len(sums)
    if not n:
        return 0, None
    one = np.abs(sums - 1) <= tol
    k, name = preset.top_k, preset.name
    if preset.norm_topk_prob:
        bad = int((~one).sum())
        if not bad:
            return 0, None
        scaled = np.abs(sums - preset.routed_scaling_factor) <= tol * preset.routed_scaling_factor
        hint = (f"; {int(scaled.sum())} sum to the routed scaling factor "
                f"{preset.routed_scaling_factor} (applied by the logger?)"
                if preset.routed_scaling_factor != 1 and scaled.any() else "")
        return bad, (f"{bad} of {n} rows have gate weights not summing to 1, but {name} "
                     f"renormalises its top-{k} (norm_topk_prob true): weights logged before "
                     f"renormalisation, or a log of another model{hint}")
    if k >= preset.routed_experts:
        return 0, None
    good = int(one.sum())
    if good * 2 <= n:
        return 0, None
    return good, (f"{good} of {n} rows have gate weights summing to 1, but {name} does not "
                  f"renormalise its top-{k} (norm_topk_prob false): weights renormalised by "
                  f"the logger, or a log of another model")


#: Keys under which an expert-usage document may nest its per-layer counts.
_USAGE_KEYS = ("layers", "expert_counts", "counts", "usage")


def usage_counts(doc) -> dict:
    """Per-layer expert selection counts from a parsed JSON document: ``{layer name: counts [E]
    float64}`` in document order.

    Shapes read: a list of per-layer lists (layers named ``"0"``, ``"1"``, ...); an object of
    layer name -> list (``{"encoder.block.1": [...], ...}``); either nested under ``layers``,
    ``expert_counts``, ``counts`` or ``usage`` beside other keys (``model``, ``top_k``,
    ``tokens``, ...). Counts are finite numbers >= 0 (counts or frequencies), every layer with
    the same number of experts (>= 2), at least one pick in each layer.

    Raises :class:`~elmoe3d.errors.UserError` naming the layer and what was expected."""
    if isinstance(doc, dict):
        nested = [k for k in _USAGE_KEYS if k in doc]
        if len(nested) > 1:
            raise UserError(f"expert usage: both {nested[0]!r} and {nested[1]!r} given")
        if nested:
            doc = doc[nested[0]]
    if isinstance(doc, list):
        items = [(str(i), v) for i, v in enumerate(doc)]
    elif isinstance(doc, dict):
        items = list(doc.items())
    else:
        raise UserError(f"expert usage: expected per-layer count lists, got "
                        f"{type(doc).__name__}")
    if not items:
        raise UserError("expert usage: no layer (expected per-layer lists of expert counts: "
                        "a list of lists or an object of layer name -> list, perhaps under "
                        f"{', '.join(map(repr, _USAGE_KEYS))})")
    out, width = {}, None
    for name, v in items:
        if not isinstance(v, list):
            raise UserError(f"expert usage: layer {name!r}: expected a list of counts, got "
                            f"{type(v).__name__}")
        bad = next((i for i, x in enumerate(v)
                    if not isinstance(x, (int, float)) or isinstance(x, bool)), None)
        if bad is not None:
            raise UserError(f"expert usage: layer {name!r}, expert {bad}: expected a count, "
                            f"got {json.dumps(v[bad])}")
        try:
            c = np.asarray(v, np.float64)
        except OverflowError:           # an integer beyond a float64's range (1e308)
            bad = next(i for i, x in enumerate(v) if abs(x) > sys.float_info.max)
            raise UserError(f"expert usage: layer {name!r}, expert {bad}: count of "
                            f"{len(str(v[bad]))} digits, beyond a float64's range") from None
        if len(c) < 2 or not np.isfinite(c).all() or (c < 0).any() or c.sum() <= 0:
            raise UserError(f"expert usage: layer {name!r}: expected >= 2 finite counts >= 0 "
                            f"with at least one pick")
        if width is not None and len(c) != width:
            raise UserError(f"expert usage: layer {name!r} has {len(c)} experts, the first "
                            f"layer {width}")
        width = len(c)
        out[str(name)] = c
    return out

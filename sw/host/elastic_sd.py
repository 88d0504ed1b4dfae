"""Elastic Self-Speculative Decoding on routing traces (paper Section 4.2 and Algorithm 1).

One Elastic-SD iteration, for a batch of requests advancing in lockstep:

1. **Draft** (Algorithm 1 lines 6-17): ``depth`` draft steps. At every MoE layer each token's
   experts are the *throttled top-k*: its original expert ranking restricted to the HB-resident
   pool C of that layer, first k kept (fewer if the pool holds fewer), in the original order
   (:func:`throttle`). Only MSB slices are read, all from HB. Hotness is recorded from the
   token's *original* routing: its original top-k as a one-hot vector, accumulated per layer
   over the draft steps (line 14).
2. **Next pool, before verification**: the accumulated hotness picks the pool of the next draft
   (:func:`select_pool`), sized to the HB slots.
3. **Verify** (lines 18-31): the draft tokens run with the original routing, all together; per
   layer each distinct expert is read once. An expert in the current pool runs its MSB slice
   from HB and its LSB slice from EXT (summed at partial-sum level); an uncached expert streams
   whole from EXT. The next pool's new MSB slices are written into HB during verification
   (line 30): a new slice whose expert verification streams anyway is taken from that stream;
   any other costs an extra EXT read of its MSB slice. Both are counted.
4. **Accept**: the accepted length of a request is the length of the prefix of its draft tokens
   that the acceptance rule accepts (never a token past the first rejection); the request then
   advances by accepted + 1 (the verifier's own token at the first rejection, or after the
   last draft token).

Ranking when the trace lacks router scores (BRIEF section 5): with full ``scores`` the original
ranking is all experts by descending score (ties: lower id first). With only the top-k ids and
weights, the top-k come first in their recorded order and every other expert is ranked after
them by the pool's hotness (the one-hot counts the pool was chosen by: more often routed
first), ties by lower id. The throttled gate weights are then: with scores, the model's rule
(renormalised over the throttled set if ``norm_topk_prob``, raw scores otherwise); without,
recorded weights for recorded experts and the k-th recorded weight (an upper bound on any
unrecorded score) for the others, renormalised if the model renormalises.

Trace semantics: the routing a draft token gets "originally" is taken as the trace's routing of
the token at that position (the target's own routing: the paper's point is that the draft
shares it, Fig. 7); a rejected draft token's routing is likewise the trace's. The trace cannot
say whether a draft token is accepted: that is the ``acceptance`` rule's job
(:class:`CoverageAcceptance` from the routing, :class:`BernoulliAcceptance` with a given
rate, or any callable).

Before the first iteration, the first ``depth`` tokens of each request run autoregressively
(original routing, current pool as cache) to seed the hotness of the first pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...checks import check_int, is_int, is_real
from ...errors import UserError
from .hbcache import CacheStats, HBExpertCache, _check_batch, _check_trace
from .models import ModelPreset


__all__ = ["throttle", "original_ranking", "select_pool", "select_pool_indices", "PoolKeys",
           "RowLists",
           "CoverageAcceptance", "BernoulliAcceptance", "accepted_prefix", "Iteration",
           "ElasticSDResult", "ElasticSD"]


def _id_row(name, ids) -> np.ndarray:
    """``ids`` as int64 ``[n]``: one row of distinct integer expert ids, else
    :class:`UserError` naming ``name`` (and the first repeated id)."""
    row = np.asarray(ids)
    if row.ndim != 1 or (row.size and row.dtype.kind not in "iu"):
        raise UserError(f"{name}: expected one row of integer expert ids, got {ids!r}")
    row = row.astype(np.int64)
    srt = np.sort(row)
    dup = srt[1:][srt[1:] == srt[:-1]]
    if dup.size:
        raise UserError(f"{name}: expert id {int(dup[0])} repeats in the row {row.tolist()}")
    return row


def original_ranking(topk_ids, num_experts, *, scores=None, fallback=None) -> np.ndarray:
    """All expert ids of one (token, layer), best first.

    With ``scores`` [E] (finite): by descending score, ties to the lower id. Otherwise the
    recorded ``topk_ids`` in their order, then the others by descending ``fallback`` [E]
    (hotness; default all zero), ties to the lower id. Raises :class:`UserError` for a
    ``num_experts`` that is no positive integer, ``topk_ids`` that are not one row of integer
    ids, an id outside 0..E-1 (-1 included) or repeated in the row, ``scores`` that are not E
    finite values, or a ``fallback`` that is not E finite values."""
    if not is_int(num_experts) or num_experts < 1:
        check_int("num_experts", num_experts, 1, error=UserError)
    ids = _id_row("topk_ids", topk_ids)
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise UserError(f"topk_ids: {ids.tolist()} outside 0..{num_experts - 1}")
    if scores is not None:
        s = np.asarray(scores, np.float64)
        if s.shape != (num_experts,) or not np.isfinite(s).all():
            raise UserError(f"scores: expected {num_experts} finite values")
        return np.argsort(-s, kind="stable")
    if fallback is None:
        f = np.zeros(num_experts)
    else:
        f = np.asarray(fallback, np.float64)
        if f.shape != (num_experts,) or not np.isfinite(f).all():
            raise UserError(f"fallback: expected {num_experts} finite values, got shape "
                            f"{f.shape}")
    rest = np.setdiff1d(np.arange(num_experts), ids)
    rest = rest[np.argsort(-f[rest], kind="stable")]
    return np.concatenate([ids, rest])


def throttle(ranking, pool, k) -> np.ndarray:
    """Throttled top-k: the first ``k`` experts of ``ranking`` that are in ``pool`` (a set or
    bool mask [E]), in ranking order; fewer if the pool holds fewer. Raises
    :class:`UserError` for a ``k`` that is no integer >= 0, a ``ranking`` that is not one row
    of distinct integer ids, or (a mask ``pool``) an id outside the mask's 0..E-1."""
    if not is_int(k) or k < 0:
        check_int("k", k, 0, error=UserError)
    r = _id_row("ranking", ranking)
    if isinstance(pool, np.ndarray) and pool.dtype == bool:
        if pool.ndim != 1:
            raise UserError(f"pool: expected a set or a bool mask [E], got a mask of shape "
                            f"{pool.shape}")
        if r.size and (r.min() < 0 or r.max() >= pool.size):
            raise UserError(f"ranking: {r.tolist()} outside the pool mask's "
                            f"0..{pool.size - 1}")
    return _throttle(r, pool, k)


def _throttle(ranking, pool, k) -> np.ndarray:
    """:func:`throttle` unchecked (``ranking`` int64, ``k`` an integer >= 0): the per-token
    callers' (:meth:`ElasticSD.throttled`)."""
    if isinstance(pool, np.ndarray) and pool.dtype == bool:
        inpool = pool[ranking]
    else:
        pool = set(int(x) for x in pool)
        inpool = np.array([int(e) in pool for e in ranking], bool)
    return ranking[inpool][:k]


def select_pool(hotness, slots, *, layer_ids, current=(), min_per_layer=1) -> list:
    """The next draft pool: (layer, expert) keys, at most ``slots``.

    ``hotness`` [L, E] holds the accumulated one-hot routing counts. First every layer gets
    its ``min(min_per_layer, E, slots // L)`` hottest experts (so no layer is left without an
    expert when the slots allow), then the remaining slots go to the hottest remaining keys of
    any layer; keys with zero hotness are kept only if already cached (keeping costs nothing,
    loading would). Ties: already cached first, then lower layer, then lower id. Returned
    coldest first (the recency order :meth:`HBExpertCache.fill` takes). Raises
    :class:`UserError` as :func:`select_pool_indices`."""
    h = _check_hotness(hotness, layer_ids)
    L, E = h.shape
    cur = {(int(a), int(b)) for a, b in current}
    j_of = {int(lay): j for j, lay in enumerate(layer_ids)}
    incur = np.zeros((L, E), bool)
    for lay, e in cur:
        if lay in j_of and 0 <= e < E:
            incur[j_of[lay], e] = True
    keys = select_pool_indices(h, slots, layer_ids=layer_ids, current=incur,
                               min_per_layer=min_per_layer)
    j, e = np.divmod(keys, E)
    return [(layer_ids[a], b) for a, b in zip(j.tolist(), e.tolist())]


def _check_hotness(hotness, layer_ids) -> np.ndarray:
    """``hotness`` as float64 ``[L, E]`` (``L = len(layer_ids)``), finite and >= 0, else
    :class:`UserError`."""
    try:
        h = np.asarray(hotness, np.float64)
    except (TypeError, ValueError):
        raise UserError(f"hotness: expected a [layers, experts] array of counts, got "
                        f"{type(hotness).__name__}") from None
    if h.ndim != 2:
        raise UserError(f"hotness: expected a [layers, experts] array, got shape {h.shape}")
    if len(layer_ids) != h.shape[0]:
        raise UserError(f"hotness: {h.shape[0]} layers but {len(layer_ids)} layer ids")
    if h.size and not (np.isfinite(h).all() and h.min() >= 0):
        raise UserError("hotness: expected finite counts >= 0 (NaN, infinite or negative "
                        "entries given)")
    return h


def select_pool_indices(hotness, slots, *, layer_ids, current, min_per_layer=1) -> np.ndarray:
    """:func:`select_pool` on flat indices: ``current`` is the cached keys as a bool
    ``[L, E]`` mask (row ``j``: ``layer_ids[j]``); returns the pool as int64 ``j * E + e``,
    coldest first. Raises :class:`UserError` for ``hotness`` that is not finite counts >= 0
    ``[L, E]`` with ``L = len(layer_ids)``, a ``current`` of another shape, or a ``slots`` or
    ``min_per_layer`` that is no integer >= 0."""
    h = _check_hotness(hotness, layer_ids)
    check_int("slots", slots, 0, error=UserError)
    check_int("min_per_layer", min_per_layer, 0, error=UserError)
    incur = np.asarray(current)
    if incur.shape != h.shape or incur.dtype != bool:
        raise UserError(f"current: expected a bool mask of shape {h.shape}, got {incur.dtype} "
                        f"of shape {incur.shape}")
    return _select_pool_indices(h, slots, layer_ids=layer_ids, current=incur,
                                min_per_layer=min_per_layer)


def _select_pool_indices(hotness, slots, *, layer_ids, current, min_per_layer=1) \
        -> np.ndarray:
    """:func:`select_pool_indices` unchecked: Elastic-SD's per-iteration call, on its own
    hotness counts, mask and checked counts."""
    h = np.asarray(hotness, np.float64)
    L, E = h.shape
    incur = np.asarray(current, bool)
    floor = min(min_per_layer, E, slots // L) if L else 0
    # every key in the order of preference: hotter first, then already cached, then lower
    # layer, then lower id (a total order: each key's place is unique)
    lrank = np.argsort(np.argsort(np.asarray(layer_ids, np.int64), kind="stable"),
                       kind="stable")
    whole = h.size and (h >= 0).all() and (h == np.floor(h)).all()
    if whole and h.max() < 2 ** 15:
        # small whole counts (Elastic-SD's: one iteration's one-hot sums): the key's
        # (rank of -h, cached) part fits in 16 bits, and a stable argsort (a radix sort) of
        # it over the keys laid out in (layer, id) order is the order of the whole key
        prim = ((h.max() - h) * 2).astype(np.uint16) + ~incur            # uint16 [L, E]
        by_lay = np.argsort(lrank, kind="stable")                  # the rows in layer order
        if (by_lay == np.arange(L)).all():
            rest = np.argsort(prim.ravel(), kind="stable")
        else:
            sec = (by_lay[:, None] * E + np.arange(E)).ravel()
            rest = sec[np.argsort(prim.ravel()[sec], kind="stable")]
        # within a row the key orders by (prim, id): the first minimum, or a stable argsort
        by_row = np.argmin(prim, axis=-1)[:, None] if floor == 1 else \
            np.argsort(prim, axis=-1, kind="stable")
    elif whole and h.max() < 2 ** 31:
        # whole counts: one integer key, (rank of -h, cached, layer, id)
        key = ((h.max() - h).astype(np.int64) * 2 + ~incur) * (L * E) \
            + lrank[:, None] * E + np.arange(E)
        rest = np.argsort(key.ravel())
        # each row's first `floor` keys (distinct keys: the one-key floor is the row minimum)
        by_row = np.argmin(key, axis=-1)[:, None] if floor == 1 else np.argsort(key, axis=-1)
    else:
        ee = np.broadcast_to(np.arange(E), (L, E))
        ll = np.broadcast_to(lrank[:, None], (L, E))
        rest = np.lexsort((ee.ravel(), ll.ravel(), ~incur.ravel(), -h.ravel()))
        by_row = np.lexsort((ee, ~incur, -h), axis=-1)
    chosen = np.zeros((L, E), bool)
    if floor:
        chosen[np.arange(L)[:, None], by_row[:, :floor]] = True
    ok = (~chosen & ((h > 0) | incur)).ravel()[rest]
    take = rest[ok][:max(0, slots - int(chosen.sum()))]
    chosen.ravel()[take] = True
    return rest[chosen.ravel()[rest]][::-1]


class LazyRecords(Sequence):
    """A sequence of records held as arrays and made into Python objects on first use
    (:meth:`_records`, kept); equal to any sequence of the same records in the same order
    (a list included). Subclasses give :meth:`_records` and ``__len__``."""

    _recs = None

    def _records(self) -> list:
        raise NotImplementedError

    def _list(self) -> list:
        if self._recs is None:
            self._recs = self._records()
        return self._recs

    def __getitem__(self, i):
        return self._list()[i]

    def __iter__(self):
        return iter(self._list())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and self._list() == list(other)

    __hash__ = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._list()!r})"


class PoolKeys(LazyRecords):
    """A pool's (layer, expert) keys in order, held as flat indices ``j * E + e`` (``j``
    indexing ``layer_ids``) and turned into tuples on first use; equal to any sequence of the
    same keys in the same order (a list included)."""

    def __init__(self, flat, layer_ids, experts: int):
        self.indices = np.asarray(flat, np.int64)
        self._lids, self._E = layer_ids, experts

    def _records(self) -> list:
        j, e = np.divmod(self.indices, self._E)
        return list(zip([self._lids[a] for a in j.tolist()], e.tolist()))

    def __len__(self) -> int:
        return len(self.indices)


class RowLists(Mapping):
    """``{names[j]: x[j][sel[j]] as a list}`` for every row ``j`` of ``x`` (``[R, n]``) with
    a selected entry (``sel``: bool ``[R, n]``), in row order: a read-only mapping built on
    first use (equal to that dict). Elastic-SD's per-layer expert lists."""

    def __init__(self, x, sel, names):
        self._x, self._sel, self._names, self._d = x, sel, names, None

    def _dict(self) -> dict:
        if self._d is None:
            vals = self._x[self._sel].tolist()
            d, c0 = {}, 0
            for j, c in enumerate(self._sel.sum(axis=1).tolist()):
                if c:
                    d[self._names[j]] = vals[c0:c0 + c]
                    c0 += c
            self._d, self._x, self._sel = d, None, None
        return self._d

    def __getitem__(self, key):
        return self._dict()[key]

    def __iter__(self):
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())

    def __repr__(self) -> str:
        return f"RowLists({self._dict()!r})"


def accepted_prefix(accept) -> int:
    """Length of the leading run of True in ``accept`` (acceptance is a prefix length: nothing
    after the first rejection counts). Raises :class:`UserError` for ``accept`` that is not
    one row of bools (probabilities or strings are not verdicts)."""
    a = np.asarray(accept)
    if a.ndim != 1 or (a.size and a.dtype != bool):
        raise UserError(f"accept: expected a bool array [n], got {a.dtype} of shape {a.shape}")
    if not a.size:
        return 0
    rej = np.nonzero(~a)[0]
    return int(rej[0]) if rej.size else len(a)


def _verdict(verdict, n) -> np.ndarray:
    """The acceptance rule's return ``verdict`` as a bool array ``[n]``: a bool array or a
    sequence of bools of length ``n``, else :class:`UserError` naming what it returned (its
    dtype and shape, against bool ``(n,)``)."""
    try:
        a = np.asarray(verdict)
    except (TypeError, ValueError):
        a = None
    if a is not None and a.dtype == bool and a.shape == (n,):
        return a
    got = "None" if verdict is None else (
        f"{type(verdict).__name__}" if a is None or a.dtype == object else
        f"{a.dtype} of shape {a.shape}" if isinstance(verdict, np.ndarray) else
        f"a {type(verdict).__name__} read as {a.dtype} of shape {a.shape}")
    raise UserError(f"acceptance returned {got}, expected bool of shape ({n},) (one verdict "
                    f"per draft token)")


def _token_rows(toks, field) -> np.ndarray:
    """``np.stack([getattr(r, field)[t] for r, t in toks])``, a request's per-token array
    (``ids``, ``present``, ``weights``, ``scores``) at the tokens ``toks`` = [(r, t)]: a slice
    of the request's array (a view: read it only) when they are consecutive positions of one
    request (a batch of one), else the stack."""
    if toks:
        r0, t0 = toks[0]
        a = getattr(r0, field)
        if 0 <= t0 and t0 + len(toks) <= len(a) and all(
                r is r0 and t == t0 + x for x, (r, t) in enumerate(toks)):
            return a[t0:t0 + len(toks)]
    return np.stack([getattr(r, field)[t] for r, t in toks])


def _first_seen(x) -> np.ndarray:
    """bool mask of ``x`` (int ``[L, n]``): True at the first occurrence of each value in its
    row. The (row, value) pairs as one key, in 16 bits when they fit (expert ids: a stable
    argsort of those is a radix sort), sorted stably once for all rows."""
    L, n = x.shape
    if x.size:
        lo, hi = int(x.min()), int(x.max())
        if L * (hi - lo + 1) <= 1 << 16:
            key = (np.arange(L, dtype=np.int64)[:, None] * (hi - lo + 1) + (x - lo)) \
                .astype(np.uint16).reshape(-1)
            order = np.argsort(key, kind="stable")
            sv = key[order]
            first = np.empty(x.size, bool)
            first[0] = True
            np.not_equal(sv[1:], sv[:-1], out=first[1:])
            out = np.empty(x.size, bool)
            out[order] = first
            return out.reshape(L, n)
    order = np.argsort(x, axis=1, kind="stable")
    sv = np.take_along_axis(x, order, axis=1)
    first = np.ones(x.shape, bool)
    first[:, 1:] = sv[:, 1:] != sv[:, :-1]
    out = np.empty(x.shape, bool)
    np.put_along_axis(out, order, first, axis=1)
    return out


def _coverage(w, m) -> list:
    """Per row of gate weights ``w`` ``[n, k]`` (float32) and pool mask ``m`` ``[n, k]``: the
    pooled share of the row's weight, ``w[m].sum() / max(w.sum(), 1e-30)`` in float64 with
    NumPy's own summation order: one by one below 8 terms; exactly 8 (a whole row of a
    top-8 model) in its eight-way pairwise order, ((a0 + a1) + (a2 + a3)) + ((a4 + a5) +
    (a6 + a7)), column by column; more, row by row."""
    w = w.astype(np.float64)
    z = np.where(m, w, 0.0)                 # the pooled weights, 0 elsewhere
    num = np.zeros(len(w))
    for c in range(w.shape[1]):
        num = num + z[:, c]
    cnt = m.sum(axis=1)
    if w.shape[1] == 8:
        r = np.nonzero(cnt == 8)[0]
        a = w[r]
        num[r] = ((a[:, 0] + a[:, 1]) + (a[:, 2] + a[:, 3])) \
            + ((a[:, 4] + a[:, 5]) + (a[:, 6] + a[:, 7]))
        cnt = np.where(cnt == 8, 0, cnt)
    for i in np.nonzero(cnt >= 8)[0].tolist():
        num[i] = w[i][m[i]].sum()
    return (num / np.maximum(w.sum(axis=1), 1e-30)).tolist()


def _first_k(x, pad, k) -> np.ndarray:
    """The first ``k`` entries other than ``pad`` of each row of ``x`` ``[..., n]``, in
    order, ``pad``-filled: ``[..., k]``."""
    ok = x != pad
    pos = np.cumsum(ok, axis=-1)
    out = np.full(x.shape[:-1] + (k,), pad, x.dtype)
    idx = np.nonzero(ok & (pos <= k))
    out[idx[:-1] + (pos[idx] - 1,)] = x[idx]
    return out


def _first_pooled(key, k) -> np.ndarray:
    """Per row of ``key`` ``[..., E]`` (float; +inf: not in the pool): the ids of its ``k``
    smallest finite keys, ascending, ties to the lower id (what a stable argsort of ``key``
    cut to the pooled ones gives), ``E``-padded: int64 ``[..., k]``. Selects with a
    partition, then sorts only those."""
    E = key.shape[-1]
    pooled = key < np.inf
    if E > k:
        v = np.partition(key, k - 1, axis=-1)[..., k - 1:k]                # k-th smallest
        lt = key < v
        eq = (key == v) & pooled
        sel = lt | (eq & (np.cumsum(eq, axis=-1) <= k - lt.sum(axis=-1, keepdims=True)))
    else:
        sel = pooled
    ids = _first_k(np.where(sel, np.arange(E), E), E, k)                   # ascending ids
    kk = np.take_along_axis(key, np.minimum(ids, E - 1), axis=-1)
    kk[ids == E] = np.inf
    return np.take_along_axis(ids, np.argsort(kk, axis=-1, kind="stable"), axis=-1)


def _score_order_key(scores) -> np.ndarray:
    """int64 keys ``[..., E]`` of float32 router ``scores`` ``[..., E]`` whose ascending order
    is the experts' ranking (:func:`original_ranking`: descending score, ties to the lower id),
    distinct within a row: the score's IEEE bits made monotone in its value (the sign bit
    folded: a negative score's magnitude bits negated, so -0.0 and 0.0 are both 0), negated,
    times E, plus the id."""
    E = scores.shape[-1]
    b = np.asarray(scores, np.float32).view(np.int32).astype(np.int64)
    return -np.where(b >= 0, b, -(b & 0x7FFFFFFF)) * E + np.arange(E)


def _first_pooled_keys(key, pooled, k) -> np.ndarray:
    """:func:`_first_pooled` on distinct keys (:func:`_score_order_key`): per row of ``key``
    int64 ``[..., E]``, the ids of its ``k`` smallest keys among those ``pooled`` (bool,
    broadcast to ``key``), ascending, ``E``-padded: int64 ``[..., k]``. A partition picks
    them (no ties to settle: the keys are distinct), then a sort of k per row orders them."""
    E = key.shape[-1]
    big = np.iinfo(np.int64).max
    key = np.where(pooled, key, big)
    if E > k:
        key = np.partition(key, k - 1, axis=-1)[..., :k]
    elif E < k:
        key = np.concatenate([key, np.full(key.shape[:-1] + (k - E,), big)], axis=-1)
    key = np.sort(key, axis=-1)
    return np.where(key == big, E, key % E)


@dataclass(frozen=True)
class CoverageAcceptance:
    """Accept a draft token iff the mean, over its MoE layers, of the fraction of its original
    gate weight whose experts the draft could use (were in the pool) is >= ``threshold``
    (1.0: accepted only if throttling changed nothing). A routing-level proxy for draft-target
    agreement; it never looks at later tokens."""

    threshold: float

    def __post_init__(self):
        """Raises :class:`UserError` for a ``threshold`` that is no real number in [0, 1]
        (a bool, a string, None and NaN included)."""
        if not is_real(self.threshold) or not 0 <= self.threshold <= 1:
            raise UserError(f"threshold: expected a number in [0, 1], got {self.threshold!r}")

    def __call__(self, coverage, rng) -> np.ndarray:
        return np.asarray(coverage) >= self.threshold - 1e-12


@dataclass(frozen=True)
class BernoulliAcceptance:
    """Accept each draft token independently with probability ``alpha`` (the paper's
    acceptance rate, Table 3: what :attr:`ElasticSDResult.alpha` measures; accepted / drafted
    is lower, since tokens past a rejection are drafted but never judged), from the
    simulator's seeded generator."""

    alpha: float

    def __post_init__(self):
        """Raises :class:`UserError` for an ``alpha`` that is no real number in [0, 1] (a
        bool, a string, None and NaN included)."""
        if not is_real(self.alpha) or not 0 <= self.alpha <= 1:
            raise UserError(f"alpha: expected a number in [0, 1], got {self.alpha!r}")

    def __call__(self, coverage, rng) -> np.ndarray:
        return rng.random(len(coverage)) < self.alpha


@dataclass
class Iteration:
    """One draft + verify iteration of a batch.

    Attributes
    ----------
    requests : list of int
    start : list of int
        Index (within each request's tokens) of its first draft token.
    drafted : list of int
        Draft tokens per request (``depth``, fewer at the end of a request).
    accepted : list of int
        Accepted prefix length per request.
    coverage : list of ndarray
        Per request, per draft token: the routing coverage :class:`CoverageAcceptance` reads.
    draft_routing : list of ndarray
        Per request, [drafted, L, k] throttled expert ids (``num_experts`` pads unused slots).
    draft_steps : list of RowLists
        Per draft step: ``{layer: [expert ids]}`` read from HB (union over the batch).
    verify_cached, verify_uncached : RowLists
        ``{layer: [expert ids]}`` of verification: MSB from HB + LSB from EXT, or whole from
        EXT.
    pool_before, pool_after : PoolKeys
        (layer, expert) keys of the pool the draft used and of the one chosen for the next
        draft (coldest first).
    pool_written, pool_extra : PoolKeys
        Keys of ``pool_after`` written into HB during verification (in ``pool_after``'s
        order), and those among them no verification stream carried (extra EXT reads).
    pool_evicted : PoolKeys
        Keys of ``pool_before`` not in ``pool_after`` (their slices leave HB), sorted.
    verify_streamed : ndarray or None
        bool ``[L, E]``: the keys of ``verify_uncached`` (row j: the model's j-th MoE layer).
    """

    requests: list
    start: list
    drafted: list
    accepted: list
    coverage: list
    draft_routing: list
    draft_steps: list
    verify_cached: dict
    verify_uncached: dict
    pool_before: list
    pool_after: list
    pool_written: list
    pool_extra: list
    pool_evicted: list
    verify_streamed: np.ndarray | None = None


@dataclass
class ElasticSDResult:
    """Totals of an Elastic-SD run (bytes; tokens).

    ``draft_hb_bytes``: MSB slices read in draft steps. ``verify``: a :class:`CacheStats` of the
    verification reads (hits = experts found in the pool). ``ar``: the same for the seeding AR
    tokens. ``pool_write_bytes`` / ``pool_extra_ext_bytes``: pool updates. ``tokens``: tokens
    produced (accepted + one per iteration + the AR seed tokens), ``drafted`` / ``accepted``:
    draft tokens made / accepted."""

    iterations: list
    draft_hb_bytes: int
    verify: CacheStats
    ar: CacheStats
    pool_write_bytes: int
    pool_extra_ext_bytes: int
    tokens: int
    drafted: int
    accepted: int
    ranking: str

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted draft tokens (positions past a rejection count as drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def judged(self) -> int:
        """Draft tokens the verifier judged: each (request, iteration) its accepted prefix plus
        the first rejected token, if any (later ones are never reached)."""
        return sum(min(a + 1, d) for it in self.iterations
                   for a, d in zip(it.accepted, it.drafted))

    @property
    def alpha(self) -> float:
        """The paper's acceptance rate (Table 3; EAGLE's definition): accepted / judged draft
        tokens, the probability that a draft token is accepted given its prefix was, so that
        :class:`BernoulliAcceptance` ``(A)`` measures A."""
        j = self.judged
        return self.accepted / j if j else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Mean tokens produced per (request, iteration): accepted + 1."""
        n = sum(len(it.requests) for it in self.iterations)
        return (self.accepted + n) / n if n else 0.0

    def summary(self) -> dict:
        return {"iterations": len(self.iterations), "tokens": self.tokens,
                "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": self.acceptance_rate, "judged": self.judged,
                "alpha": self.alpha, "mean_accept_length": self.mean_accept_length,
                "draft_hb_bytes": self.draft_hb_bytes,
                "verify_hit_rate": self.verify.hit_rate,
                "verify_hb_bytes": self.verify.hb_read_bytes,
                "verify_ext_bytes": self.verify.ext_read_bytes,
                "pool_write_bytes": self.pool_write_bytes,
                "pool_extra_ext_bytes": self.pool_extra_ext_bytes,
                "ar_hit_rate": self.ar.hit_rate, "ranking": self.ranking}


class ElasticSD:
    """Elastic-SD simulator over a routing trace.

    Parameters (keyword-only)
    ----------
    cache : HBExpertCache
        The HB pool (its ``slots`` bound the pool; its model gives k, E, the MoE layers, the
        slice sizes and the gate-weight rule). Demand admission must be off (``admit=False``):
        the pool changes only by the hotness update.
    depth : int
        Draft tokens per iteration (>= 1).
    acceptance : callable
        ``acceptance(coverage [n], rng) -> bool [n]`` for a request's draft tokens; e.g.
        :class:`CoverageAcceptance` or :class:`BernoulliAcceptance`. Only its prefix counts.
        Its return must be bools (a bool array or a list of bools) of length n: anything else
        (probabilities, 0/1 integers, strings, None) makes :meth:`run` raise.
    min_per_layer : int, optional
        Pool floor per layer (default the model's top-k; capped by ``slots // layers``).
    seed : int
        Seed (>= 0) of the generator handed to ``acceptance``.

    Raises
    ------
    UserError
        For a cache that is not an :class:`HBExpertCache` built with ``admit=False``, a
        ``depth`` that is no positive integer, an ``acceptance`` that is not callable, or a
        ``min_per_layer`` or ``seed`` that is no integer >= 0.
    """

    def __init__(self, *, cache, depth, acceptance, min_per_layer=None, seed=0):
        if not isinstance(cache, HBExpertCache):
            raise UserError("cache: expected an HBExpertCache")
        if cache.admit:
            raise UserError("cache: Elastic-SD needs a cache built with admit=False (the pool "
                            "changes only through the hotness update)")
        if not is_int(depth) or depth < 1:
            raise UserError(f"depth: expected a positive integer, got {depth!r}")
        if not callable(acceptance):
            raise UserError("acceptance: expected a callable (coverage, rng) -> bool array")
        m = cache.model.top_k if min_per_layer is None else min_per_layer
        if not is_int(m) or m < 0:
            raise UserError(f"min_per_layer: expected an integer >= 0, got {min_per_layer!r}")
        seed = check_int("seed", seed, 0, error=UserError)
        self._cache, self._depth, self._accept, self._min, self._seed = (
            cache, int(depth), acceptance, int(m), seed)

    @property
    def cache(self) -> HBExpertCache:
        return self._cache

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def model(self) -> ModelPreset:
        return self._cache.model

    def throttled_weights(self, rr, t, j, chosen, fallback_w) -> np.ndarray:
        """Gate weights (float64 ``[len(chosen)]``) of the experts ``chosen`` for token ``t``
        of ``rr`` at layer index ``j`` (see the module docstring): the router scores when
        ``rr`` has them, else the recorded weights with ``fallback_w`` for an expert not
        recorded; renormalised to sum 1 when the model normalises its top-k."""
        p = self.model
        if rr.scores is not None:
            w = rr.scores[t, j, chosen].astype(np.float64)
        else:
            rec = {int(e): float(x) for e, x in zip(rr.ids[t, j], rr.weights[t, j])}
            w = np.array([rec.get(int(e), fallback_w) for e in chosen])
        if p.norm_topk_prob and w.size and w.sum() > 0:
            w = w / w.sum()
        return w

    def throttled(self, rr, t, j, pool_mask, hot_row):
        """Throttled expert ids and gate weights of token ``t`` of ``rr`` at layer index ``j``
        under a pool (bool mask [E] of that layer)."""
        E, k = self.model.routed_experts, self.model.top_k
        sc = None if rr.scores is None else rr.scores[t, j]
        rank = original_ranking(rr.ids[t, j], E, scores=sc, fallback=hot_row)
        chosen = _throttle(rank, pool_mask, k)
        return chosen, self.throttled_weights(rr, t, j, chosen, float(rr.weights[t, j, -1]))

    def _throttle_tokens(self, toks, masks, hot_prev, stacked=None) -> np.ndarray:
        """:meth:`throttled`'s expert ids of the tokens ``toks`` = [(rr, t)] at every layer
        at once, all under one pool: int64 ``[n, L, k]``, ``num_experts`` in unused slots and
        in layers without a record (``masks``: the pool, bool ``[L, E]``; ``hot_prev``: the
        fallback ranking, ``[L, E]``; ``stacked``: the tokens' ``present`` ``[n, L]`` and
        ``ids`` ``[n, L, k]`` rows stacked, if the caller has them). A bad id or score raises
        for the first such token."""
        E, k = self.model.routed_experts, self.model.top_k
        L = masks.shape[0]
        if stacked is None:
            stacked = (_token_rows(toks, "present"), _token_rows(toks, "ids"))
        pres = stacked[0]                                                   # [n, L]
        ids = stacked[1].astype(np.int64)                                   # [n, L, k]
        bad = pres & ((ids < 0) | (ids >= E)).any(axis=2)
        scored = np.array([rr.scores is not None for rr, t in toks])
        sc = None
        if scored.any():
            sc = _token_rows([toks[x] for x in np.nonzero(scored)[0]], "scores")
            inf = np.zeros(bad.shape, bool)                 # a present row with a bad score
            inf[scored] = pres[scored] & ~np.isfinite(sc).all(axis=2)
        if bad.any() or (sc is not None and inf.any()):
            for x in range(len(toks)):                      # the first token at fault raises
                if bad[x].any():
                    original_ranking(ids[x, int(np.nonzero(bad[x])[0][0])], E)   # raises
                if scored[x] and inf[x].any():
                    raise UserError(f"scores: expected {E} finite values")
        out = np.full((len(toks), L, k), E, np.int64)
        if sc is not None:
            if sc.dtype == np.float32:              # a trace's scores: exact integer keys
                out[scored] = _first_pooled_keys(_score_order_key(sc), masks, k)
            else:
                out[scored] = _first_pooled(np.where(masks, -sc.astype(np.float64), np.inf),
                                            k)
        if not scored.all():
            # the recorded ids in the pool, in order, then the pool's others by hotness (ties
            # to the lower id): among the 2k first of those at most k are recorded
            rec = ids[~scored]                                              # [n, L, k]
            rec_ok = np.take_along_axis(masks[None], np.where(rec >= 0, rec, 0) % E, axis=2)
            order = np.lexsort((np.broadcast_to(np.arange(E), (L, E)), -hot_prev, ~masks),
                               axis=-1)[:, :2 * k]                          # [L, c]
            cand_ok = np.take_along_axis(masks, order, axis=1)
            isrec = (order[None, :, :, None] == rec[:, :, None, :]).any(axis=3)
            x = np.concatenate([np.where(rec_ok, rec, E),
                                np.where(cand_ok & ~isrec, order, E)], axis=2)
            out[~scored] = _first_k(x, E, k)
        out[~pres] = E
        return out

    def run(self, trace, *, batch=1, phase="decode") -> ElasticSDResult:
        """Simulate Elastic-SD over the ``phase`` routing of ``trace`` (requests ``batch`` at a
        time in increasing id, each batch in lockstep). The cache's contents at the start are
        the first pool (usually empty); the cache is left holding the last pool. Raises
        :class:`UserError` for a ``batch`` that is no positive integer, a trace of another
        model (its layers, experts or top-k), or an ``acceptance`` return that is not one bool
        per draft token."""
        p, cache = self.model, self._cache
        batch = _check_batch(batch)
        _check_trace(trace, p, top_k=True)
        lids = tuple(p.moe_layer_ids)
        L, E, k = len(lids), p.routed_experts, p.top_k
        rng = np.random.default_rng(self._seed)
        verify = CacheStats(lids)
        ar = CacheStats(lids)
        iterations = []
        draft_hb = tokens = drafted = accepted = 0
        w0, x0 = cache.stats.hb_write_bytes, cache.stats.ext_extra_bytes
        reqs = trace.requests(phase)
        msb, lsb = cache.msb_bytes, cache.lsb_bytes

        def reads(stats, ex, masks):
            # one step's expert reads: ex [L, n] (-1: none), read once per distinct id of a
            # row, HB-resident ones (masks [L, E]) hits; returns the reads and their hits
            keep = _first_seen(ex) & (ex >= 0)
            ok = keep & (ex < E)
            inpool = ok & np.take_along_axis(masks, np.clip(ex, 0, E - 1), axis=1)
            n_c = inpool.sum(axis=1)                              # (inpool is within keep)
            n_u = keep.sum(axis=1) - n_c
            stats.accesses += n_c + n_u
            stats.hits += n_c
            stats.hb_read_bytes += msb * int(n_c.sum())
            stats.ext_read_bytes += lsb * int(n_c.sum()) + (msb + lsb) * int(n_u.sum())
            return keep, inpool, ok

        def routed(toks, stacked=None):
            # the original routing of tokens [(r, t)] as columns: int64 [L, k * len(toks)]
            # (stacked: their present [n, L] and ids [n, L, k] rows, if already stacked)
            pres, ids = stacked or (_token_rows(toks, "present"), _token_rows(toks, "ids"))
            return np.where(pres[:, :, None], ids.astype(np.int64), -1) \
                .transpose(1, 0, 2).reshape(L, -1)

        for b0 in range(0, len(reqs), batch):
            group = reqs[b0:b0 + batch]
            hot = np.zeros((L, E))
            # AR seed: the first `depth` tokens of each request, original routing, each step
            # reading the distinct experts of its tokens per layer
            masks = cache.resident_mask()
            used = np.zeros((L, E), bool)
            for t in range(self._depth):
                live = [(r, t) for r in group if t < r.tokens]
                if not live:
                    continue
                ex = routed(live)
                keep, _, ok = reads(ar, ex, masks)
                jj, cc = np.nonzero(ok)
                used[jj, ex[jj, cc]] = True
                jj, cc = np.nonzero((ex >= 0) & (ex < E))       # one-hot of every token's
                hot += np.bincount(jj * E + ex[jj, cc], minlength=L * E).reshape(L, E)
            tokens += sum(min(self._depth, r.tokens) for r in group)
            nxt = _select_pool_indices(hot, cache.slots, layer_ids=lids, current=masks,
                                       min_per_layer=self._min)
            cache.fill_indices(nxt, streamed=used)        # AR read every expert it used
            pool = PoolKeys(nxt, lids, E)
            masks = cache.resident_mask()
            pos = [min(self._depth, r.tokens) for r in group]
            while any(pp < r.tokens for pp, r in zip(pos, group)):
                hot_prev = hot
                hot = np.zeros((L, E))
                active = [i for i, r in enumerate(group) if pos[i] < r.tokens]
                n_draft = {i: min(self._depth, group[i].tokens - pos[i]) for i in active}
                cover = {i: np.zeros(n_draft[i]) for i in active}
                droute = {i: np.full((n_draft[i], L, k), E, np.int16) for i in active}
                # the draft tokens, step by step (all under this pool and hotness)
                toks = [(i, s) for s in range(self._depth) for i in active if s < n_draft[i]]
                rts = [(group[i], pos[i] + s) for i, s in toks]
                pres_all = _token_rows(rts, "present")                         # [n, L]
                ids_all = _token_rows(rts, "ids")                              # [n, L, k]
                ch_all = self._throttle_tokens(rts, masks, hot_prev,
                                               stacked=(pres_all, ids_all))
                tt, rows = np.nonzero(pres_all)
                ids = ids_all[tt, rows].astype(np.int64)                      # [n_rows, k]
                hot += np.bincount((rows[:, None] * E + ids).ravel(),   # one-hot of the
                                   minlength=L * E).reshape(L, E)       # original top-k
                wts = _token_rows(rts, "weights")[tt, rows]
                covs = _coverage(wts, masks[rows[:, None], ids])
                per_tok = np.bincount(tt, minlength=len(toks)).tolist()
                c0 = 0
                for x, (i, s) in enumerate(toks):
                    droute[i][s] = ch_all[x]
                    cov = float(cover[i][s])
                    for v in covs[c0:c0 + per_tok[x]]:
                        cov += v
                    c0 += per_tok[x]
                    cover[i][s] = cov
                # each draft step's experts per layer: the union of its tokens' (in token
                # order, first seen), all steps at once as rows (step, layer)
                per_s = [[x for x, (i, s_) in enumerate(toks) if s_ == s]
                         for s in range(self._depth)]
                m = max(len(xs) for xs in per_s)
                ch = np.full((self._depth, L, k * m), E, np.int64)
                for s, xs in enumerate(per_s):
                    if xs:
                        ch[s, :, :k * len(xs)] = ch_all[xs].transpose(1, 0, 2).reshape(L, -1)
                ch = ch.reshape(self._depth * L, k * m)
                keep = ch != E
                if m > 1:                         # one token's throttled ids are distinct
                    keep &= _first_seen(ch)
                steps = [RowLists(ch[s * L:(s + 1) * L], keep[s * L:(s + 1) * L], lids)
                         for s in range(self._depth)]
                draft_hb += msb * int(keep.sum())
                for i in active:
                    r = group[i]
                    nl = r.present[pos[i]:pos[i] + n_draft[i]].sum(axis=1)
                    cover[i] = cover[i] / np.maximum(nl, 1)
                acc = {}
                for i in active:
                    verdict = self._accept(cover[i], rng)
                    if type(verdict) is not np.ndarray or verdict.dtype != bool \
                            or verdict.shape != (n_draft[i],):
                        verdict = _verdict(verdict, n_draft[i])
                    acc[i] = accepted_prefix(verdict)
                # next pool, chosen before verification from this draft's hotness
                nxt = _select_pool_indices(hot, cache.slots, layer_ids=lids, current=masks,
                                           min_per_layer=self._min)
                # verify: all draft tokens, original routing, current pool
                vc, vu = {}, {}
                streamed = np.zeros((L, E), bool)
                # (the draft tokens, rts: n_draft never passes a request's end; their rows
                # as stacked for the draft)
                if rts:
                    ex = routed(rts, (pres_all, ids_all))
                    keep, inpool, ok = reads(verify, ex, masks)
                    vc, vu = RowLists(ex, keep & inpool, lids), RowLists(ex, keep & ~inpool, lids)
                    jj, cc = np.nonzero(keep & ~inpool & ok)
                    streamed[jj, ex[jj, cc]] = True
                x_before = cache.stats.ext_extra_bytes
                cache.fill_indices(nxt, streamed=streamed)
                after = cache.resident_mask()
                new = nxt[~masks.reshape(-1)[nxt]]                 # in pool order
                written = PoolKeys(new, lids, E)
                extra = PoolKeys(new[~streamed.reshape(-1)[new]], lids, E)
                evicted = PoolKeys(np.nonzero((masks & ~after).reshape(-1))[0], lids, E)
                assert cache.stats.ext_extra_bytes - x_before == msb * len(extra)
                before, pool = pool, PoolKeys(nxt, lids, E)
                masks = after
                iterations.append(Iteration(
                    requests=[group[i].request for i in active], start=[pos[i] for i in active],
                    drafted=[n_draft[i] for i in active], accepted=[acc[i] for i in active],
                    coverage=[cover[i] for i in active], draft_routing=[droute[i] for i in
                                                                        active],
                    draft_steps=steps, verify_cached=vc, verify_uncached=vu,
                    pool_before=before, pool_after=pool, pool_written=written,
                    pool_extra=extra, pool_evicted=evicted, verify_streamed=streamed))
                for i in active:
                    drafted += n_draft[i]
                    accepted += acc[i]
                    adv = min(acc[i] + 1, group[i].tokens - pos[i])
                    tokens += adv
                    pos[i] += adv
        return ElasticSDResult(
            iterations=iterations, draft_hb_bytes=draft_hb, verify=verify, ar=ar,
            pool_write_bytes=cache.stats.hb_write_bytes - w0,
            pool_extra_ext_bytes=cache.stats.ext_extra_bytes - x0, tokens=tokens,
            drafted=drafted, accepted=accepted,
            ranking="scores" if trace.has_scores else "top-k then hotness")

"""The host compiler: routing-trace steps -> expert work per MoE layer -> expert placement on
the die's PE groups -> per-group PE programs (paper Sections 4.2, 5.1, 5.2; ``docs/host.md``).

A run of the host layer has three stages; the backends (:mod:`.backends`) consume the result:

1. **Steps** (:class:`Step`): what the die executes one after the other. From Elastic-SD
   (:func:`elastic_steps`, paper Algorithm 1 via :class:`~.elastic_sd.ElasticSD`): the
   autoregressive seed tokens (``ar``), then per iteration ``depth`` ``draft`` steps (throttled
   routing, HB pool only, DRAFT numerics) and one ``verify`` step (all draft tokens, original
   routing, FULL numerics, cached experts split MSB from HB / LSB from EXT) that also carries
   the pool update (the next pool's new MSB slices written into HB). From a plain trace replay
   through the LRU cache (:func:`replay_steps`, :class:`~.hbcache.HBExpertCache` with demand
   admission): one ``decode`` step per token position (FULL numerics; misses admitted into HB).
   Each step holds one :class:`LayerWork` per selected MoE layer: the tokens' expert ids and
   gate weights, and the experts whose MSB slice is HB-resident at that moment.
2. **Placement** (:func:`place_layer`, :class:`HomeGroups`) -- the policy:

   * an HB-resident expert has a *home group*: its MSB slice is split by output channel (and
     the down matrix by K) over the G HB banks of one PE group (``docs/parallel.md``, data
     placement). The home is chosen when the slice is written into HB (pool update or
     admission): the group holding the fewest resident slices, ties to the lower index; it is
     released when the slice is evicted. A draft runs each routed pool expert in its home
     group (HB-only tensor parallelism); a verify runs a cached expert in its home group (MSB
     TP from HB, LSB DP from EXT, psum-level synchronisation on the group's link);
   * an uncached (EXT-streamed) expert has no home: each step it goes to the group with the
     least work so far in that layer (token-expert pairs, cached experts counted first;
     longest-processing-time order: most tokens first, ties to the lower id; ties between
     groups to the lower index), where it runs data-parallel over token row blocks with its
     weights multicast on the streamline ring;
   * groups share nothing but the ring: each group's layer result is the MoE sum over its own
     experts (equal bit for bit to :func:`~elmoe3d.sw.golden.expert.ref_moe` with the routing
     restricted to them, :func:`.parallel.group_routing`); the host adds the groups' FP32
     results (ascending group index) for the layer's output.
3. **Programs** (:func:`compile_layer`): one :func:`.parallel.compile_group` per busy group
   (its PE programs, ``ld`` streams per source, HB images, EXT transfers with multicast masks
   and link descriptors). Pool-update writes are :class:`PoolWrite` records: the slice, its
   home group and the bytes written into each of the group's banks (``msb_bytes / G``), and
   whether its source is the verify's own EXT stream or an extra EXT read.

Shapes: the performance model runs the model preset's real shapes; the golden and RTL
backends run the same steps and placement on the small configuration with synthetic weights of
:data:`SYNTHETIC_SHAPE` (:func:`synthetic_model`, :class:`SyntheticWeights`: seeded Gaussians,
labelled synthetic) and the trace's real routing.

Plain NumPy; never imports Amaranth or cocotb.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ...checks import is_int
from ...errors import UserError
from .elastic_sd import ElasticSD, LazyRecords, PoolKeys, _token_rows
from .hbcache import HBExpertCache, _check_batch, _check_trace
from .models import QUANT_GROUP, SCALE_BYTES, ModelPreset, model_preset


__all__ = ["STEP_KINDS", "SYNTHETIC_SHAPE", "SYNTHETIC_NOTE", "LayerWork", "Step", "PoolWrite",
           "PoolWrites", "write_arrays", "StepWork", "RoutedCells", "step_work",
           "HomeGroups", "fill_groups", "Placement", "place_layer", "replay_steps",
           "elastic_steps", "limit_tokens", "parse_layers", "synthetic_model", "synthetic_experts",
           "SyntheticWeights", "compile_layer", "slice_images", "reserved_hb_bytes",
           "KV_CACHE_TOKENS", "check_model_trace"]

#: Step kinds: Elastic-SD's autoregressive seed tokens, draft steps and verify steps; plain
#: replay's decode steps. ``draft`` runs DRAFT numerics (MSB slices only); the others FULL.
STEP_KINDS = ("ar", "draft", "verify", "decode")

#: Expert shape (hidden, intermediate) of the golden and RTL backends on the small
#: configuration: 2 PEs per group divide its 64 up/gate column blocks into intermediate slices
#: of 64 channels (multiples of 32 and of W/32 = 16), as ``sw/host/parallel.py`` needs.
SYNTHETIC_SHAPE = (64, 128)
SYNTHETIC_NOTE = ("expert weights and token activations are synthetic (seeded Gaussians) at "
                  "H x I = {h} x {i}; the routing (expert ids, gate weights) is the trace's")


#: Tokens of FP16 KV cache the HB reserves (:func:`reserved_hb_bytes`).
KV_CACHE_TOKENS = 1024


def reserved_hb_bytes(model) -> tuple:
    """``(dense_bytes, kv_bytes)`` of HB reserved before expert slices (``docs/traces.md``),
    from the preset's shapes (:class:`~.models.ModelPreset`: ``vocab_size``,
    ``attention_heads``, ``kv_heads``, ``head_dim``, ``hidden``, ``layers``,
    ``routed_experts``): the non-expert weights (untied embeddings 2 x vocab x H; attention
    layers x (2 x H x heads x head_dim + 2 x H x kv_heads x head_dim); routers MoE layers x
    experts x H; 2 x layers + 1 norms of H) in G32 INT8 with FP16 scales, and a
    :data:`KV_CACHE_TOKENS`-token FP16 KV cache (layers x 2 x kv_heads x head_dim x 2 B x
    tokens). Presets without attention shapes (all but Mixtral-8x7B) and synthetic models:
    ``(0, 0)`` (pass the figures)."""
    p = model_preset(model)
    if not p.attention_heads:
        return 0, 0
    H, L = p.hidden, p.layers
    q, kv = p.attention_heads * p.head_dim, p.kv_heads * p.head_dim
    fp16 = np.dtype(np.float16).itemsize
    dense = 2 * p.vocab_size * H + L * (2 * H * q + 2 * H * kv) \
        + p.moe_layers * p.routed_experts * H + (2 * L + 1) * H
    return dense + dense // QUANT_GROUP * SCALE_BYTES, L * 2 * kv * fp16 * KV_CACHE_TOKENS


# ---- steps --------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class LayerWork:
    """One MoE layer's expert work in one step.

    Attributes
    ----------
    layer : int
        Decoder-layer index.
    ids : int64 ``[T, k]``
        Each token's experts (-1: empty slot, e.g. a throttled draft token with fewer pool
        experts than k, or a (token, layer) record missing from the trace).
    weights : float32 ``[T, k]``
        Their gate weights (the routed scaling factor applied; 0 in empty slots).
    cached : frozenset of int
        Experts whose MSB slice is HB-resident at this layer during the step.
    """

    layer: int
    ids: np.ndarray
    weights: np.ndarray
    cached: frozenset

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[0])

    def routed(self) -> list:
        """Distinct experts the tokens use, ascending."""
        return sorted(set(int(e) for e in self.ids.reshape(-1) if e >= 0))

    def expert_tokens(self) -> dict:
        """``{expert: tokens routed to it}``."""
        ids = self.ids[self.ids >= 0]
        u, c = np.unique(ids, return_counts=True)
        return {int(e): int(n) for e, n in zip(u, c)}


@dataclass(frozen=True, eq=False)
class StepWork:
    """A step's expert work and placement as arrays over its computed layers (what
    :meth:`.perf.PerfModel.step_summary` reads; :func:`step_work` builds it from a step's
    :class:`LayerWork` and :class:`Placement` records).

    Attributes
    ----------
    layers : tuple of int
        The step's computed layers (``Step.layers``' keys, in their order), L of them.
    tokens : int64 ``[L, E]``
        Tokens routed to each expert (0: not routed).
    cached : bool ``[L, E]``
        Routed experts whose MSB slice is HB-resident.
    group : int64 ``[L, E]``
        PE group each routed expert runs on (-1: not routed).
    cells : RoutedCells or None
        The routed experts alone (:meth:`routed_cells`), when the maker had them at hand.
    """

    layers: tuple
    tokens: np.ndarray
    cached: np.ndarray
    group: np.ndarray
    cells: RoutedCells | None = field(default=None, repr=False)

    def routed_cells(self) -> RoutedCells:
        """The routed experts (``tokens > 0``) as a :class:`RoutedCells`, row-major (found
        once, or as the maker gave them)."""
        if self.cells is None:
            j, e = np.nonzero(self.tokens > 0)
            object.__setattr__(self, "cells", RoutedCells(
                j, e, self.tokens[j, e], self.cached[j, e], self.group[j, e]))
        return self.cells


class RoutedCells(NamedTuple):
    """A :class:`StepWork`'s routed experts in row-major order, each array ``[n]``: ``row``
    (int64, index into its ``layers``), ``expert`` (int64), ``tokens`` (int64, > 0),
    ``cached`` (bool), ``group`` (int64)."""

    row: np.ndarray
    expert: np.ndarray
    tokens: np.ndarray
    cached: np.ndarray
    group: np.ndarray


def step_work(step, experts: int) -> StepWork:
    """``step.work`` if the schedule set it, else a :class:`StepWork` built from
    ``step.layers`` and ``step.placements`` (``experts``: the model's routed experts, E).
    Raises ``ValueError`` for a placed expert id E or more (a step of another model)."""
    if step.work is not None:
        return step.work
    lays = tuple(step.layers)
    tok = np.zeros((len(lays), experts), np.int64)
    cached = np.zeros((len(lays), experts), bool)
    group = np.full((len(lays), experts), -1, np.int64)
    for j, lay in enumerate(lays):
        pl = step.placements[lay]
        try:
            for g, ex in enumerate(pl.groups):
                for e, n in ex.items():
                    tok[j, e] = n
                    group[j, e] = g
                    cached[j, e] = e in pl.cached[g]
        except IndexError:
            raise ValueError(f"step {step.index}: layer {lay}: expert id {e} outside "
                             f"0..{experts - 1}: a step of another model?") from None
    return StepWork(lays, tok, cached, group)


@dataclass(frozen=True)
class PoolWrite:
    """An MSB slice written into HB during a step (Elastic-SD's pool update, Algorithm 1 line
    30, or an LRU admission): ``key`` = (layer, expert); ``group`` its home; ``extra``: True
    when no EXT stream of the step carried the expert (an extra EXT read of the MSB slice)."""

    key: tuple
    group: int
    extra: bool


class PoolWrites(LazyRecords):
    """A step's :class:`PoolWrite` records held as arrays: ``layer``, ``expert`` and
    ``group`` (int64 ``[n]``) and ``extra`` (bool ``[n]``); the records are made on first
    use. Equal to any sequence of the same records in the same order (a list included)."""

    def __init__(self, layer, expert, group, extra):
        self.layer = np.asarray(layer, np.int64)
        self.expert = np.asarray(expert, np.int64)
        self.group = np.asarray(group, np.int64)
        self.extra = np.asarray(extra, bool)

    def _records(self) -> list:
        return [PoolWrite((a, b), g, x) for a, b, g, x in zip(
            self.layer.tolist(), self.expert.tolist(), self.group.tolist(),
            self.extra.tolist())]

    def __len__(self) -> int:
        return len(self.layer)


def write_arrays(writes) -> tuple:
    """``(layer, group, extra)`` of pool-write records (a :class:`PoolWrites` or a sequence
    of :class:`PoolWrite`) as int64, int64 and bool arrays ``[n]``, in record order."""
    if isinstance(writes, PoolWrites):
        return writes.layer, writes.group, writes.extra
    return (np.array([w.key[0] for w in writes], np.int64),
            np.array([w.group for w in writes], np.int64),
            np.array([w.extra for w in writes], bool))


@dataclass(eq=False)
class Step:
    """One step the die executes (module docstring).

    Attributes
    ----------
    index : int
    kind : str
        One of :data:`STEP_KINDS`.
    tokens : list of (request, position)
        The batch, in row order of every :class:`LayerWork`.
    layers : dict
        ``{layer: LayerWork}`` of the selected layers.
    produced : int
        Tokens this step completes (decode/ar: its tokens; verify: accepted + 1 per request;
        draft: 0).
    iteration : int or None
        Elastic-SD iteration (None for ar/decode steps).
    writes : sequence of PoolWrite
        HB writes of the pool update carried by this step (selected layers only): a list, or
        :class:`PoolWrites` (the same records as arrays).
    evicted : sequence of (layer, expert)
        Slices leaving HB after this step (a list, or a :class:`~.elastic_sd.PoolKeys`).
    accepted : list of int
        Verify steps: accepted draft tokens per request.
    placements : dict
        ``{layer: Placement}``: where each layer's experts run (:func:`place_layer`, with the
        homes of the step's HB contents).
    work : StepWork or None
        The same work and placement as arrays, when the schedule made them (else
        :func:`step_work` builds them from ``layers`` and ``placements``).
    """

    index: int
    kind: str
    tokens: list
    layers: dict
    produced: int
    iteration: int | None = None
    writes: list = field(default_factory=list)
    evicted: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    placements: dict = field(default_factory=dict)
    work: StepWork | None = None

    @property
    def phase(self) -> str:
        """``"draft"`` or ``"verify"``: the numerics and scheme of :func:`.parallel.compile_group`
        (ar, decode and verify steps run FULL with the original routing)."""
        return "draft" if self.kind == "draft" else "verify"


def fill_groups(count, n: int) -> np.ndarray:
    """The homes of ``n`` keys given one after the other to the group holding the fewest
    slices, ties to the lower index (:meth:`HomeGroups.assign`'s rule), from the slice counts
    ``count`` (int ``[G]``): int64 ``[n]``. The i-th key takes the i-th smallest (count
    level, group) pair still free (each group's levels ``count[g]``, ``count[g] + 1``, ...),
    which is what the one-by-one rule picks; the row-major nonzero entries of the pairs'
    mask ``[levels, G]`` list them in that order."""
    c = np.asarray(count, np.int64)
    if n <= 0:
        return np.zeros(0, np.int64)
    levels = np.arange(c.min(), c.max() + -(-n // len(c)) + 1)
    return np.flatnonzero(levels[:, None] >= c[None, :])[:n] % len(c)


class HomeGroups:
    """Home group of every HB-resident MSB slice (module docstring, placement policy).

    ``groups``: PE groups of the die. :meth:`sync` makes the homes follow a cache content
    (assigning a home to each new key, releasing departed ones); :meth:`move` and
    :meth:`update` do it from the keys that arrived and left.

    Without ``layer_ids`` the homes are a dict (:attr:`home`). With ``layer_ids`` (the
    model's MoE layers) and ``experts`` (E) they are an array, :attr:`table`, and every key's
    layer must be one of ``layer_ids``; :attr:`home` is then a dict built from the table when
    read (change the homes through the methods), and the flat-index methods
    (:meth:`move_indices`, :meth:`sync_indices`) move many keys at once."""

    def __init__(self, groups: int, *, layer_ids=None, experts: int = 0):
        if not is_int(groups) or groups < 1:
            raise ValueError(f"groups: expected a positive integer, got {groups!r}")
        self.groups = groups = int(groups)
        #: Resident slices per group (a list of int).
        self.count = [0] * groups
        self._row = {int(lay): j for j, lay in enumerate(layer_ids or ())}
        #: int64 ``[len(layer_ids), experts]``: the home of (``layer_ids[j]``, e), -1 for a
        #: key without one (None without ``layer_ids``).
        self.table = None if layer_ids is None else np.full((len(self._row), experts), -1,
                                                            np.int64)
        self._home = {} if layer_ids is None else None      # table: built by `home`
        if layer_ids is not None:
            self._lids = np.array([int(x) for x in layer_ids], np.int64)
            # flat index j * E + e -> its place in (layer, expert) order
            self._lrank = np.argsort(np.argsort(self._lids, kind="stable"), kind="stable")
            self._ascending = bool((np.diff(self._lids) > 0).all())

    @property
    def home(self) -> dict:
        """``{(layer, expert): group}`` of every homed key (with a :attr:`table`: built from
        it, a read-only view)."""
        if self._home is None:
            jj, ee = np.nonzero(self.table >= 0)
            self._home = dict(zip(zip(self._lids[jj].tolist(), ee.tolist()),
                                  self.table[jj, ee].tolist()))
        return self._home

    @home.setter
    def home(self, value):
        if self.table is not None:
            raise AttributeError("home: the homes are held in the table")
        self._home = value

    def _flat(self, key) -> int:
        """The flat table index of ``key`` (``j * E + e``); ValueError for a layer not among
        the table's layer ids or an expert outside 0..E-1."""
        try:
            j = self._row[int(key[0])]
        except KeyError:
            ids = self._lids.tolist()
            raise ValueError(f"key {key!r}: layer {key[0]} is not among the layer ids"
                             + (f" ({ids[0]}..{ids[-1]})" if ids else " (none)")) from None
        e = int(key[1])
        if not 0 <= e < self.table.shape[1]:
            raise ValueError(f"key {key!r}: expert outside 0..{self.table.shape[1] - 1}")
        return j * self.table.shape[1] + e

    def _keys(self, flat) -> list:
        """(layer, expert) tuples of flat table indices."""
        j, e = np.divmod(np.asarray(flat, np.int64), self.table.shape[1])
        return list(zip(self._lids[j].tolist(), e.tolist()))

    def _sorted(self, flat) -> np.ndarray:
        """The distinct flat indices ``flat`` in (layer, expert) order."""
        if self._ascending:                     # flat order is (layer, expert) order
            seen = np.zeros(self.table.size, bool)          # (a mask: cheaper than a sort)
            seen[np.asarray(flat, np.int64)] = True
            return np.flatnonzero(seen)
        flat = np.unique(np.asarray(flat, np.int64))
        E = self.table.shape[1]
        return flat[np.argsort(self._lrank[flat // E] * E + flat % E, kind="stable")]

    def assign(self, key) -> int:
        key = (int(key[0]), int(key[1]))
        if self.table is not None:
            i = self._flat(key)
            g = int(self.table.flat[i])
            if g < 0:
                g = self.count.index(min(self.count))
                self.table.flat[i] = g
                self.count[g] += 1
                if self._home is not None:
                    self._home[key] = g
            return g
        if key not in self._home:
            g = self.count.index(min(self.count))    # fewest slices, ties to the lower index
            self._home[key] = g
            self.count[g] += 1
        return self._home[key]

    def release(self, key):
        key = (int(key[0]), int(key[1]))
        if self.table is not None:
            i = self._flat(key)
            g = int(self.table.flat[i])
            if g >= 0:
                self.table.flat[i] = -1
                self.count[g] -= 1
                if self._home is not None:
                    del self._home[key]
            return
        g = self._home.pop(key, None)
        if g is not None:
            self.count[g] -= 1

    def homes_of(self, layers, mask, *, rows=None) -> np.ndarray:
        """Homes of the keys ``mask`` (bool ``[len(layers), E]``, row j: ``layers[j]``) marks,
        int64 in ``np.nonzero(mask)`` order; a key without a home gets one (:meth:`assign`, in
        that order). ``rows``: the layers' rows of the table if known (int ``[len(layers)]``).
        Needs :attr:`table`."""
        if rows is None:
            rows = [self._row[int(lay)] for lay in layers]
        g = self.table[rows][mask]
        if (g < 0).any():
            jj, ee = np.nonzero(mask)
            for i in np.nonzero(g < 0)[0].tolist():
                g[i] = self.assign((layers[jj[i]], ee[i]))
        return g

    def move_indices(self, arrived, left) -> tuple:
        """:meth:`move` on flat table indices (int ``[n]`` of ``j * E + e``): releases the
        homed keys of ``left``, then gives homes to the unhomed keys of ``arrived``, each in
        (layer, expert) order. Returns int64 arrays ``(new keys, their homes, released
        keys)``, the keys flat and in that order. Needs :attr:`table`. Raises ``ValueError``
        for an index outside the table."""
        t = self.table.reshape(-1)
        left = np.asarray(left, np.int64)
        arrived = np.asarray(arrived, np.int64)
        for name, x in (("arrived", arrived), ("left", left)):
            if x.size and (x.min() < 0 or x.max() >= t.size):
                raise ValueError(f"move_indices: {name}: flat indices must be in 0..{t.size - 1}")
        gone = self._sorted(left[t[left] >= 0])
        count = np.array(self.count, np.int64) - np.bincount(t[gone], minlength=self.groups)
        t[gone] = -1
        new = self._sorted(arrived[t[arrived] < 0])
        gs = fill_groups(count, len(new))
        t[new] = gs
        self.count = (count + np.bincount(gs, minlength=self.groups)).tolist()
        self._home = None
        return new, gs, gone

    def sync_indices(self, flat) -> tuple:
        """:meth:`sync` to the keys ``flat`` (flat table indices): :meth:`move_indices`'
        ``(new keys, their homes, released keys)``. Needs :attr:`table`."""
        want = np.zeros(self.table.size, bool)
        want[np.asarray(flat, np.int64)] = True
        homed = self.table.reshape(-1) >= 0
        return self.move_indices(np.nonzero(want & ~homed)[0], np.nonzero(homed & ~want)[0])

    def move(self, arrived, left) -> tuple:
        """The keys ``left`` leave HB and ``arrived`` enter (``(int, int)`` tuples, as
        :meth:`sync` returns them): releases the homed keys of ``left``, then assigns homes
        to the unhomed keys of ``arrived``, each in sorted order (what :meth:`sync` does when
        the homes held the old contents). Returns ``(new keys, released keys)``, each
        sorted."""
        if self.table is not None:
            new, _, gone = self.move_indices([self._flat(k) for k in arrived],
                                             [self._flat(k) for k in left])
            return self._keys(new), self._keys(gone)
        home, count = self._home, self.count
        gone = sorted({k for k in left if k in home})   # walks left and arrived, not home
        for k in gone:                                  # release()
            count[home.pop(k)] -= 1
        new = sorted({k for k in arrived if k not in home})
        for k in new:                                   # assign()
            g = count.index(min(count))
            home[k] = g
            count[g] += 1
        return new, gone

    def update(self, cache) -> tuple:
        """:meth:`sync` to ``cache``'s contents after one :meth:`~.hbcache.HBExpertCache.step`,
        from that step's admitted and evicted keys only (``cache.last_changes``) instead of a
        walk over every cached slice; the homes must have followed the contents up to that
        step. Returns ``(new keys, released keys)``, each sorted, as :meth:`sync` does."""
        admitted, evicted = cache.last_changes
        return self.move([k for k in admitted if k in cache],
                         [k for k in evicted if k not in cache])

    def sync(self, keys) -> tuple:
        """Homes for exactly ``keys``: returns ``(new keys, released keys)``, each sorted
        (homes are assigned in that order). With a :attr:`table`, raises ``ValueError`` for a
        key whose layer is not among ``layer_ids`` or whose expert is outside 0..E-1."""
        if self.table is not None:
            new, _, gone = self.sync_indices([self._flat(k) for k in keys])
            return self._keys(new), self._keys(gone)
        want = {(int(a), int(b)) for a, b in keys}
        gone = sorted(self._home.keys() - want)
        for k in gone:
            self.release(k)
        new = sorted(want - self._home.keys())
        for k in new:
            self.assign(k)
        return new, gone


def parse_layers(text, model) -> list:
    """Decoder-layer ids from ``--layers``: ``A:B`` (half-open, ``A:`` / ``:B`` allowed),
    ``A:B:S``, ``N`` or ``A,B,...``; each must be a MoE layer of ``model``. None: all.
    Raises :class:`UserError` naming ``--layers``."""
    p = model_preset(model)
    ids = list(p.moe_layer_ids)
    if text is None:
        return ids
    s = str(text).strip()
    try:
        if ":" in s:
            parts = [int(x) if x.strip() else None for x in s.split(":")]
            if len(parts) > 3:
                raise ValueError
            lo, hi = parts[0], parts[1]
            st = parts[2] if len(parts) == 3 else None
            if st is not None and st < 1:
                raise UserError(f"--layers {s!r}: the step must be >= 1")
            out = list(range(lo if lo is not None else ids[0],
                             hi if hi is not None else ids[-1] + 1, st or 1))
        else:
            out = [int(x) for x in s.split(",")]
    except ValueError:
        raise UserError(f"--layers {s!r}: expected A:B, A:B:S, N or a comma-separated list of "
                        f"decoder-layer indices") from None
    bad = [x for x in out if x not in ids]
    if bad:
        raise UserError(f"--layers {s!r}: layer {bad[0]} is not a MoE layer of {p.name} "
                        f"({ids[0]}..{ids[-1]})")
    if not out:
        raise UserError(f"--layers {s!r}: selects no layer")
    twice = sorted({x for x in out if out.count(x) > 1})
    if twice:
        raise UserError(f"--layers {s!r}: layer {twice[0]} given twice")
    return sorted(out)


def limit_tokens(trace, tokens, phase="decode"):
    """The trace restricted to its first ``tokens`` tokens of ``phase`` (requests in increasing
    id, positions in order). None: unchanged. Raises :class:`UserError` naming ``--tokens``."""
    if tokens is None:
        return trace
    if not is_int(tokens) or tokens < 1:
        raise UserError(f"--tokens: expected a positive integer, got {tokens!r}")
    m = trace.phase_mask(phase)
    keep = np.zeros(len(trace), bool)
    left = tokens
    for r in np.unique(trace.request[m]):
        if left <= 0:
            break
        sel = m & (trace.request == r)
        pos = np.unique(trace.position[sel])[:left]
        keep |= sel & np.isin(trace.position, pos)
        left -= len(pos)
    return trace.select(keep)


def _route_rows(rows, E, k, scale):
    """``(ids int64 [T, k], weights float32 [T, k])`` from per-token (ids, weights) lists."""
    ids = np.full((len(rows), k), -1, np.int64)
    w = np.zeros((len(rows), k), np.float32)
    for t, (ri, rw) in enumerate(rows):
        n = len(ri)
        ids[t, :n] = ri
        w[t, :n] = np.asarray(rw, np.float64) * scale
    return ids, w


def _layer_work(layer, rows, cached, model):
    ids, w = _route_rows(rows, model.routed_experts, model.top_k, model.routed_scaling_factor)
    return LayerWork(layer=layer, ids=ids, weights=w, cached=frozenset(int(e) for e in cached))


def _orig(rr, t, j, E):
    """Recorded routing of token t of rr at layer index j (empty if missing)."""
    if not rr.present[t, j]:
        return [], []
    ids = rr.ids[t, j]
    keep = ids < E
    return [int(e) for e in ids[keep]], [float(x) for x in rr.weights[t, j][keep]]


def _selected_layers(layers, model: ModelPreset) -> set:
    """The MoE layers ``layers`` selects (None: all of ``model``'s) as a set of ints.
    Raises :class:`UserError` naming ``layers`` unless it is None or an iterable of at
    least one MoE-layer id of ``model``."""
    ids = list(model.moe_layer_ids)
    if layers is None:
        return set(ids)
    try:
        sel = list(layers) if not isinstance(layers, (str, bytes)) else None
    except TypeError:
        sel = None
    if sel is None:
        raise UserError(f"layers: expected MoE-layer ids of {model.name}, got {layers!r}")
    if not sel:
        raise UserError(f"layers: expected at least one MoE layer of {model.name}, got none")
    known = set(ids)
    for lay in sel:
        if not is_int(lay) or lay not in known:
            raise UserError(f"layers: {lay!r} is not a MoE layer of {model.name} "
                            f"({ids[0]}..{ids[-1]})")
    return {int(lay) for lay in sel}


def replay_steps(trace, cache: HBExpertCache, *, layers=None, batch=1, groups=1,
                 phase="decode") -> list:
    """Decode steps of a plain trace replay through the LRU ``cache`` (demand admission), as
    :func:`.hbcache.replay` runs it: ``batch`` requests in lockstep, one token each per step,
    each MoE layer accessing the union of its tokens' experts once (all layers run through the
    cache; :class:`LayerWork` is kept for ``layers``, default all). A layer's ``cached`` set is
    its hits; admitted misses become :class:`PoolWrite` records of the step (never ``extra``:
    the step streams them), evictions are listed. Homes over ``groups`` PE groups.

    Raises
    ------
    UserError
        ``batch`` not a positive integer; ``layers`` not None or an iterable of MoE-layer ids
        of the cache's model; a ``trace`` whose layers, experts or top-k are not the model's
        (as :func:`.hbcache.replay`); an unknown ``phase``.
    ValueError
        ``groups`` not a positive integer (:class:`HomeGroups`).
    """
    p = cache.model
    batch = _check_batch(batch)
    sel = _selected_layers(layers, p)
    _check_trace(trace, p, top_k=True)
    lids = list(p.moe_layer_ids)
    E = p.routed_experts
    homes = HomeGroups(groups)
    homes.sync(cache.contents())
    steps = []
    reqs = trace.requests(phase)
    for b0 in range(0, len(reqs), batch):
        group = reqs[b0:b0 + batch]
        for t in range(max(r.tokens for r in group)):
            live = [r for r in group if t < r.tokens]
            toks = [(r.request, int(r.positions[t])) for r in live]
            work, writes, evicted, placed = {}, [], [], {}
            for j, lay in enumerate(lids):
                rows = [_orig(r, t, j, E) for r in live]
                experts = [e for ri, _ in rows for e in ri]
                if not experts:
                    continue
                hits, misses = cache.step(lay, experts)
                if lay in sel:
                    work[lay] = _layer_work(lay, rows, hits, p)
                    placed[lay] = place_layer(work[lay], homes, draft=False)
                # membership changes only by admissions (and the evictions they cause)
                new, gone = homes.update(cache) if misses else ([], [])
                writes += [PoolWrite(k, homes.home[k], False) for k in new if k[0] in sel]
                evicted += [k for k in gone if k[0] in sel]
            steps.append(Step(index=len(steps), kind="decode", tokens=toks, layers=work,
                              produced=len(toks), writes=writes, evicted=evicted,
                              placements=placed))
    return steps


def elastic_steps(trace, esd: ElasticSD, *, layers=None, batch=1, groups=1,
                  phase="decode") -> tuple:
    """Run Elastic-SD (:meth:`.elastic_sd.ElasticSD.run`) over ``trace`` and turn its
    iterations into steps: per batch the ``depth`` autoregressive seed tokens (``ar``, pool =
    the cache's contents then; the first pool's slices written during the last of them), then
    per iteration ``depth`` draft steps (the recorded throttled routing; gate weights by
    :meth:`~.elastic_sd.ElasticSD.throttled`'s rule) and one verify step (original routing,
    the iteration's pool, its pool update). Returns ``(steps, ElasticSDResult)``.

    The steps' pool writes are :class:`PoolWrites` and their evictions
    :class:`~.elastic_sd.PoolKeys` (both equal to the lists of records and keys).

    Raises
    ------
    UserError
        ``layers`` not None or an iterable of MoE-layer ids of the model; as
        :meth:`~.elastic_sd.ElasticSD.run` does (``batch``, a trace of another model).
    ValueError
        ``groups`` not a positive integer (:class:`HomeGroups`).
    """
    p = esd.model
    cache = esd.cache
    lids = list(p.moe_layer_ids)
    sel = _selected_layers(layers, p)
    E = p.routed_experts
    pool_start = cache.contents()
    res = esd.run(trace, batch=batch, phase=phase)
    reqs = trace.requests(phase)
    by_id = {r.request: r for r in reqs}
    homes = HomeGroups(groups, layer_ids=lids, experts=E)
    steps = []
    its = list(res.iterations)
    it_no = 0
    pool = list(pool_start)

    jsel = np.array([j for j, lay in enumerate(lids) if lay in sel], np.int64)
    # a step computing every selected layer (the usual case) shares these
    sel_lays, sel_js = tuple(lids[j] for j in jsel), jsel.tolist()
    all_rows = len(jsel) == len(lids)
    row_sel = np.array([lay in sel for lay in lids], bool)          # [L]
    lid_arr = np.array(lids, np.int64)

    def flat_of(keys):
        # (layer, expert) keys as flat indices j * E + e (a PoolKeys holds them already)
        if isinstance(keys, PoolKeys):
            return keys.indices
        return np.array([lids.index(int(a)) * E + int(b) for a, b in keys], np.int64)

    def pool_mask():
        # the homes follow the pool: its keys are those with a home
        return homes.table >= 0

    def orig_ids(toks):
        # the recorded routing of tokens [(rr, t)]: int64 [T, L, k], -1 where none (kept
        # ids first, in order)
        x = _token_rows(toks, "ids").astype(np.int64)
        pres = _token_rows(toks, "present")
        x = np.where(pres[:, :, None] & (x < E), x, -1)
        if ((x[..., :-1] < 0) & (x[..., 1:] >= 0)).any():
            x = np.take_along_axis(x, np.argsort(x < 0, axis=-1, kind="stable"), axis=-1)
        return x

    pending = []                # steps added since the homes last changed, not yet placed
    # the placed ones' (step, item, the homes table then): placed all at once at the end,
    # each under its table, which is cheaper than a call per change of the homes
    deferred = []

    def add(kind, toks, ids, rows_of, mask, produced, **kw):
        # a step of tokens toks = [(rr, t)] routed to ids (int64 [T, L, k], -1: none)
        if len(jsel) < len(lids):
            ids = ids[:, jsel]                                          # [T, Ls, k]
        has = (ids >= 0).any(axis=(0, 2))
        if has.all():                       # every selected layer: nothing to cut
            js, lays, js_list = jsel, sel_lays, sel_js
            mask = mask if all_rows else mask[js]
        else:
            js = jsel[has]
            ids = ids[:, has]
            lays = tuple(lids[j] for j in js)
            js_list = js.tolist()
            mask = mask[js]
        steps.append(Step(index=len(steps), kind=kind,
                          tokens=[(rr.request, int(rr.positions[t])) for rr, t in toks],
                          layers={}, produced=produced, **kw))
        st = steps[-1]
        pending.append((st, (ids, mask, lays, kind == "draft", js)))
        st.layers = _LazyLayers(lays, lambda lay, j: _layer_work(
            lay, [rows_of(rr, t, j) for rr, t in toks],
            np.nonzero(st.work.cached[st.work.layers.index(lay)])[0].tolist(), p), js_list)
        st.placements = _LazyLayers(lays, lambda lay, j: _placement_of(st.work, lay,
                                                                      homes.groups))
        return st

    def place():
        # the pending steps' work, to be placed under the homes now (before they change):
        # every HB expert of theirs has a home (their masks are pool_mask(), taken since the
        # homes last changed), so a copy of the table is all their placement needs
        if pending:
            table = homes.table.copy()
            deferred.extend((st, item, table) for st, item in pending)
            pending.clear()

    def writes(new, gs, gone, streamed):
        # a home move's (new keys, their homes, released keys), flat, as the step's pool
        # writes and evictions of the selected layers; streamed: bool [L, E]
        keep = row_sel[new // E]
        new, gs = new[keep], gs[keep]
        return (PoolWrites(lid_arr[new // E], new % E, gs, ~streamed.reshape(-1)[new]),
                PoolKeys(gone[row_sel[gone // E]], lids, E))

    for b0 in range(0, len(reqs), batch):
        group = reqs[b0:b0 + batch]
        ids_b = {r.request for r in group}
        homes.sync_indices(flat_of(pool))
        lp = pool_mask()
        d = esd.depth
        for t in range(d):
            toks = [(r, t) for r in group if t < r.tokens]
            if toks:
                add("ar", toks, orig_ids(toks), lambda rr, tt, j: _orig(rr, tt, j, E), lp,
                    len(toks))
        mine = []
        while its and set(its[0].requests) <= ids_b:
            mine.append(its.pop(0))
        first_pool = mine[0].pool_before if mine else pool
        used = np.zeros((len(lids), E), bool)           # every expert the AR tokens read
        ar_toks = [(r, t) for t in range(d) for r in group if t < r.tokens]
        if ar_toks:
            x = orig_ids(ar_toks)
            _, jj, _ = np.nonzero(x >= 0)
            used[jj, x[x >= 0]] = True
        place()
        w, g = writes(*homes.sync_indices(flat_of(first_pool)), used)
        if steps and steps[-1].kind == "ar":
            last = steps[-1]
            last.writes = w if not last.writes else list(last.writes) + list(w)
            last.evicted = g if not last.evicted else list(last.evicted) + list(g)
        pool = first_pool
        for it in mine:
            n_it = it_no
            it_no += 1
            lp = pool_mask()                                 # it.pool_before
            rrs = [by_id[q] for q in it.requests]
            for s in range(d):
                toks = [(rr, it.start[i] + s) for i, rr in enumerate(rrs) if s < it.drafted[i]]
                if not toks:
                    continue
                route = {(rr.request, it.start[i] + s): it.draft_routing[i][s]
                         for i, rr in enumerate(rrs) if s < it.drafted[i]}

                def draft_rows(rr, tt, j, route=route):
                    ch = route[(rr.request, tt)][j]
                    ch = [int(e) for e in ch if e < E]
                    if not ch:
                        return [], []
                    wts = esd.throttled_weights(rr, tt, j, np.array(ch),
                                                 float(rr.weights[tt, j, -1]))
                    return ch, [float(x) for x in wts]
                x = (route[(toks[0][0].request, toks[0][1])][None] if len(toks) == 1 else
                     np.stack([route[(rr.request, tt)] for rr, tt in toks])).astype(np.int64)
                add("draft", toks, np.where(x < E, x, -1), draft_rows, lp, 0, iteration=n_it)
            toks = [(rr, it.start[i] + s) for i, rr in enumerate(rrs)
                    for s in range(it.drafted[i])]
            streamed = it.verify_streamed
            if streamed is None:
                streamed = np.zeros((len(lids), E), bool)
                for lay, es in it.verify_uncached.items():
                    streamed[lids.index(lay), es] = True
            st = add("verify", toks, orig_ids(toks), lambda rr, tt, j: _orig(rr, tt, j, E), lp,
                     sum(min(a + 1, rr.tokens - s0)
                         for a, rr, s0 in zip(it.accepted, rrs, it.start)),
                     iteration=n_it, accepted=list(it.accepted))
            place()
            # the homes move from it.pool_before to it.pool_after
            new, gs, gone = homes.move_indices(flat_of(it.pool_written),
                                               flat_of(it.pool_evicted))
            st.writes, st.evicted = writes(new, gs, gone, streamed)
            assert np.isin(new[~streamed.reshape(-1)[new]], flat_of(it.pool_extra)).all()
            pool = it.pool_after
    place()
    works = _place_steps([item for _, item, _ in deferred], homes, experts=E,
                         tables=[table for _, _, table in deferred])
    for (st, _, _), w in zip(deferred, works):
        st.work = w
    return steps, res


class _LazyLayers(Mapping):
    """``{layer: value}`` over ``layers`` whose values ``build(layer, j)`` (``j``: the
    layer's index in ``index``) makes on first use: a schedule's :class:`LayerWork` and
    :class:`Placement` records, which the performance model does not read (it reads
    :class:`StepWork`)."""

    def __init__(self, layers, build, index=None):
        self._layers = tuple(layers)
        self._build = build
        self._j = index                 # the layers' j (None: their positions)
        self._index = None              # {layer: j}, made on the first look-up
        self._made = {}

    def __getitem__(self, layer):
        if self._index is None:
            self._index = dict(zip(self._layers, self._j if self._j is not None else
                                   range(len(self._layers))))
        if layer not in self._index:
            raise KeyError(layer)
        if layer not in self._made:
            self._made[layer] = self._build(layer, self._index[layer])
        return self._made[layer]

    def __iter__(self):
        return iter(self._layers)

    def __len__(self):
        return len(self._layers)


class _CellWork(StepWork):
    """A :class:`StepWork` given by its routed experts alone (a :class:`RoutedCells`, what
    :func:`_place_steps` finds): ``tokens``, ``cached`` and ``group`` are built from them on
    first use, equal to the arrays :func:`step_work` would give (the performance model reads
    only the cells, so a schedule it prices never makes them). Otherwise a StepWork: frozen,
    shown and pickled as one, and ``dataclasses.replace`` gives one."""

    def __init__(self, layers, tokens=None, cached=None, group=None, cells=None, *,
                 experts=None):
        # StepWork's fields (dataclasses.replace passes them all), or layers, cells and
        # experts (the arrays made on first use); frozen: straight into the instance dict
        if tokens is not None:
            self.__dict__.update(layers=layers, cells=cells, _arrays=(tokens, cached, group))
        else:
            self.__dict__.update(layers=layers, cells=cells, _arrays=None,
                                 _shape=(len(layers), experts))

    def __setattr__(self, name, value):
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __repr__(self) -> str:
        return StepWork.__repr__(self).replace(type(self).__qualname__, "StepWork", 1)

    def __reduce__(self):
        return StepWork, (self.layers, self.tokens, self.cached, self.group, self.cells)

    def _dense(self) -> tuple:
        if self._arrays is None:
            c = self.cells
            tok = np.zeros(self._shape, np.int64)
            tok[c.row, c.expert] = c.tokens
            cached = np.zeros(self._shape, bool)
            cached[c.row, c.expert] = c.cached
            group = np.full(self._shape, -1, np.int64)
            group[c.row, c.expert] = c.group
            object.__setattr__(self, "_arrays", (tok, cached, group))
        return self._arrays

    tokens = property(lambda self: self._dense()[0])
    cached = property(lambda self: self._dense()[1])
    group = property(lambda self: self._dense()[2])


def _place_steps(items, homes, *, experts, tables=None) -> list:
    """:func:`place_layer` for every layer of several steps at once: ``items`` =
    [(ids, cached_mask, layers, draft, rows)], a step each: ``ids`` int64 ``[T, L, k]`` (-1:
    empty), ``cached_mask`` bool ``[L, E]`` (the HB pool of each of its ``layers``), ``draft``
    whether only HB-resident experts may be routed (a ValueError names the first layer that
    breaks it), ``rows`` the layers' rows of ``homes.table``. Without ``tables`` every item is
    placed under ``homes`` as they are (an HB expert not homed yet gets a home,
    :meth:`HomeGroups.homes_of`). ``tables``: one homes table per item (int ``[L, E]``, e.g. a
    copy of ``homes.table`` taken when that item's homes held); items under the same table
    pass the same object and come one after another; every HB-resident expert of an item must
    have a home in its table, else ``ValueError``. The steps' layers are placed together as
    rows, each as :func:`place_layer` places it. Returns a :class:`StepWork` per item (made
    from its routed experts; the dense arrays on first use)."""
    E, G = experts, homes.groups
    if not items:
        return []
    flat, r0 = [], 0                       # each routed (row, expert) once per token
    for ids, *_ in items:
        n = ids.shape[1]
        flat.append((np.arange(r0, r0 + n)[None, :, None] * E + ids)[ids >= 0])
        r0 += n
    # the routed experts, row-major, as flat indices row * E + e with their token counts: a
    # sort of the (row, expert) pairs (rows x tokens x k of them; no [rows, E] array)
    fl = np.sort(np.concatenate(flat))
    head = np.empty(len(fl), bool)
    head[:1] = True
    np.not_equal(fl[1:], fl[:-1], out=head[1:])
    at = np.flatnonzero(head)
    rf = fl[at]
    rt = np.diff(np.append(at, len(fl)))                      # their tokens (> 0)
    rj, re = np.divmod(rf, E)
    cached_mask = np.concatenate([it[1] for it in items])
    rc = cached_mask.reshape(-1)[rf]                          # HB-resident or not
    layers = [lay for it in items for lay in it[2]]
    draft = np.repeat([it[3] for it in items], [len(it[2]) for it in items])
    rows = np.concatenate([it[4] for it in items])
    L = len(layers)
    rg = np.empty(len(rf), np.int64)                          # their groups
    cr, cc = rj[rc], re[rc]
    bounds = np.cumsum([0] + [len(it[2]) for it in items]).tolist()
    cuts = np.searchsorted(rj, bounds).tolist()               # each item's cells
    if tables is None:
        gc = homes.table[rows[cr], cc]                        # their homes
        if (gc < 0).any():                                    # some not homed yet
            cached = np.zeros((L, E), bool)
            cached.reshape(-1)[rf[rc]] = True
            gc = homes.homes_of(layers, cached, rows=rows)    # (in the same order)
    else:                                   # each run of items sharing a table: its cells
        x = 0
        while x < len(items):
            y = x + 1
            while y < len(items) and tables[y] is tables[x]:
                y += 1
            a, b = cuts[x], cuts[y]
            rg[a:b] = tables[x][rows[rj[a:b]], re[a:b]]
            x = y
        gc = rg[rc]
        if (gc < 0).any():
            raise ValueError("tables: an HB-resident expert without a home")
    rg[rc] = gc
    cold = np.flatnonzero(~rc)                                # the streamed ones
    cj, ce, ct = rj[cold], re[cold], rt[cold]
    bad = draft[cj]
    if bad.any():
        j = int(cj[np.argmax(bad)])
        raise ValueError(f"work: layer {layers[j]}: draft tokens routed to experts "
                         f"{ce[cj == j].tolist()} outside the HB pool")
    # each group's tokens per row, the cached experts' first (whole numbers: exact)
    load = np.bincount(cr * G + gc, rt[rc], L * G).astype(np.int64).reshape(L, G)
    # the streamed experts, longest processing time first in each row (most tokens first,
    # ties to the lower id: one integer key), then grouped by their rank r in the row: the
    # r-th streamed expert of every row is placed at once, on its row's least-loaded group
    if len(cj):
        T = int(ct.max())
        o = np.argsort((cj * (T + 1) + T - ct) * E + ce)
        cj, ct, cold = cj[o], ct[o], cold[o]
        rank = np.arange(len(cj)) - np.searchsorted(cj, cj)
        o = np.argsort(rank * L + cj)
        cj, ct, cold = cj[o], ct[o], cold[o]
        ends = np.cumsum(np.bincount(rank)).tolist()
        cg = np.empty(len(cj), np.int64)
        a = 0
        for b in ends:
            js = cj[a:b]
            g = load[js].argmin(axis=1)             # ties to the lower group
            load[js, g] += ct[a:b]
            cg[a:b] = g
            a = b
        rg[cold] = cg
    # each step's rows, and its routed experts (row-major: a slice of the batch's), their
    # rows counted from the step's first
    rl = rj - np.repeat(bounds[:-1], np.diff(cuts))
    out = []
    for x, (_, _, lays, _, _) in enumerate(items):
        a, b = cuts[x], cuts[x + 1]
        out.append(_CellWork(tuple(lays), cells=RoutedCells(rl[a:b], re[a:b], rt[a:b],
                                                            rc[a:b], rg[a:b]), experts=E))
    return out


def _placement_of(work: StepWork, layer, groups) -> Placement:
    """The :class:`Placement` of ``layer`` in ``work``, as :func:`place_layer` builds it
    (a group's HB-resident experts in ascending id, then the streamed ones in placement
    order)."""
    j = work.layers.index(layer)
    tok, cached, group = work.tokens[j], work.cached[j], work.group[j]
    cold = np.nonzero((tok > 0) & ~cached)[0]
    cold = cold[np.lexsort((cold, -tok[cold]))]
    per = [dict() for _ in range(groups)]
    for e in np.nonzero(cached)[0].tolist() + cold.tolist():
        per[group[e]][e] = int(tok[e])
    return Placement(groups=tuple(per), cached=tuple(
        frozenset(e for e in per[g] if cached[e]) for g in range(groups)))


# ---- placement ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """Experts of one layer-step per PE group: ``groups[g]`` = ``{expert: tokens}``;
    ``cached[g]`` = the HB-resident ones among them (run MSB-TP from the group's HB)."""

    groups: tuple
    cached: tuple

    def busy(self) -> list:
        return [g for g, ex in enumerate(self.groups) if ex]


def place_layer(work: LayerWork, homes: HomeGroups, *, draft: bool) -> Placement:
    """Place one layer's experts on the die's groups (module docstring, placement policy).
    ``draft``: only HB-resident experts may be routed (a ValueError names ``work``)."""
    G = homes.groups
    per = [dict() for _ in range(G)]
    cached = [set() for _ in range(G)]
    load = [0] * G
    toks = work.expert_tokens()
    cold = []
    for e in sorted(toks):
        if e in work.cached:
            g = homes.assign((work.layer, e))
            per[g][e] = toks[e]
            cached[g].add(e)
            load[g] += toks[e]
        else:
            cold.append(e)
    if draft and cold:
        raise ValueError(f"work: layer {work.layer}: draft tokens routed to experts {cold} "
                         f"outside the HB pool")
    for e in sorted(cold, key=lambda e: (-toks[e], e)):
        g = min(range(G), key=lambda i: (load[i], i))
        per[g][e] = toks[e]
        load[g] += toks[e]
    return Placement(groups=tuple(per), cached=tuple(frozenset(c) for c in cached))


# ---- synthetic weights and the compiled programs -------------------------------------------------

def synthetic_model(model, shape=SYNTHETIC_SHAPE) -> ModelPreset:
    """``model``'s routing (layers, experts, top-k, router rule) with expert shape ``shape``
    (hidden, intermediate): what the golden and RTL backends run on the small configuration."""
    p = model_preset(model)
    h, i = shape
    return dataclasses.replace(p, name=f"{p.name}@{h}x{i}", hidden=h, expert_intermediate=i,
                               shared_experts=0, shared_intermediate=0,
                               expert_format="int8-nested", vocab_size=0, attention_heads=0,
                               kv_heads=0)


def synthetic_experts(rng, n, hidden, inter) -> list:
    """``n`` float64 experts ``(w_up [I, H], w_gate [I, H], w_down [H, I])`` (``I`` =
    ``inter``, ``H`` = ``hidden``, a multiple of 32) drawn from the NumPy generator ``rng``:
    Gaussians x 0.2 with per-group (32 along K) magnitudes spread over two decades,
    10^U(-1.5, 0.5). The experts of :class:`SyntheticWeights` and of the PE and die benches."""
    def weight(shape):
        w = rng.standard_normal(shape)
        mag = 10.0 ** rng.uniform(-1.5, 0.5, (shape[0], shape[1] // QUANT_GROUP))
        return w * np.repeat(mag, QUANT_GROUP, axis=1) * 0.2
    return [(weight((inter, hidden)), weight((inter, hidden)), weight((hidden, inter)))
            for _ in range(n)]


class SyntheticWeights:
    """Seeded synthetic experts and activations (labelled synthetic, :data:`SYNTHETIC_NOTE`).

    Experts of layer l: :func:`synthetic_experts` from a generator seeded by (seed, layer),
    quantized once and kept. Activation of (layer, request, position):
    a seeded Gaussian row (x 2), the same in the draft and the verify of a token."""

    def __init__(self, model, *, seed: int):
        self.model = model_preset(model)
        self.seed = int(seed)
        self._experts = {}

    @property
    def note(self) -> str:
        return SYNTHETIC_NOTE.format(h=self.model.hidden, i=self.model.expert_intermediate)

    def experts(self, layer) -> list:
        from ..golden.expert import Expert
        if layer not in self._experts:
            rng = np.random.default_rng([self.seed, 1, int(layer)])
            ws = synthetic_experts(rng, self.model.routed_experts, self.model.hidden,
                                   self.model.expert_intermediate)
            self._experts[layer] = [Expert.quantize(*w, name=f"synthetic L{layer} E{e}")
                                    for e, w in enumerate(ws)]
        return self._experts[layer]

    def x(self, layer, tokens) -> np.ndarray:
        """float64 ``[T, H]`` activations of ``tokens`` = [(request, position)]."""
        H = self.model.hidden
        return np.stack([np.random.default_rng([self.seed, 2, int(layer), int(r), int(p)])
                         .standard_normal(H) * 2.0 for r, p in tokens]) if tokens else \
            np.zeros((0, H))


def compile_layer(step: Step, work: LayerWork, placement: Placement, weights: SyntheticWeights,
                  arch) -> list:
    """The programs of one layer-step: ``[(group, GroupJob)]`` for every busy group
    (:func:`.parallel.compile_group` with the group's experts and its cached subset). A batch
    the PE's memories cannot hold raises :class:`UserError` naming the step, layer and group."""
    from ..golden.asm import ProgramError
    from .parallel import compile_group
    x = weights.x(work.layer, step.tokens)
    exs = weights.experts(work.layer)
    jobs = []
    for g in placement.busy():
        try:
            jobs.append((g, compile_group(x, exs, (work.ids, work.weights), phase=step.phase,
                                          config=arch, cached=sorted(placement.cached[g]),
                                          group_experts=sorted(placement.groups[g]))))
        except ProgramError as exc:
            raise UserError(f"step {step.index} ({step.kind}, {len(step.tokens)} tokens), "
                            f"layer {work.layer}, group {g}: {exc} (the {arch.name} PE cannot "
                            f"hold this batch: reduce --batch or --depth)") from None
    return jobs


def slice_images(layer, expert, weights: SyntheticWeights, arch) -> list:
    """The words a pool update writes into the G HB banks of the home group for the MSB slice
    of (``layer``, ``expert``): per PE, the up/gate MSB plane and scales of its channel slice
    and the down MSB plane and scales of its K slice, in the layout
    :func:`.parallel.compile_group` reads (a group's HB image is its cached experts' slices
    in ascending id; ``tests/host/test_compiler.py`` checks the concatenation). W-bit ints."""
    from .parallel import compile_group
    x = weights.x(layer, [(0, 0)])
    k = weights.model.top_k
    ids = np.full((1, k), -1, np.int64)
    ids[0, 0] = expert
    w = np.zeros((1, k), np.float32)
    w[0, 0] = 1.0
    job = compile_group(x, weights.experts(layer), (ids, w), phase="draft", config=arch,
                        cached=[expert], group_experts=[expert])
    return [list(img) for img in job.hb_images]


def check_model_trace(trace, model, *, source=None) -> ModelPreset:
    """The preset, after checking the trace's experts, top-k and layers agree with it
    (:class:`UserError` otherwise, naming ``--model`` or ``source``: where the model was
    named when the user gave no ``--model``, e.g. the trace's meta line)."""
    p = model_preset(model)
    try:
        _check_trace(trace, p, top_k=True)
    except UserError:
        where = f"--model {p.name}" if source is None else \
            f"{source} names {p.name}, which does not fit the trace (--model overrides it)"
        raise UserError(f"{where}: the trace has {trace.num_experts} experts, top-"
                        f"{trace.top_k}, layers {trace.layer_ids[0]}..{trace.layer_ids[-1]}; "
                        f"{p.name} has {p.routed_experts}, top-{p.top_k}, layers "
                        f"{p.moe_layer_ids[0]}..{p.moe_layer_ids[-1]}") from None
    return p

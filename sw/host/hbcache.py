"""The HB expert cache: MSB slices of routed experts held in the hybrid-bonded DRAM (paper
Sections 4.2 and 7, BRIEF section 5).

HB holds the dense weights and the KV cache first; what remains holds MSB slices (4 bits a
weight plus the FP16 group scales, :attr:`~elmoe3d.sw.host.models.ModelPreset.expert_msb_bytes`) of
routed experts, keyed by (layer, expert). An expert whose MSB slice is cached runs its MSB half
from HB and streams only its LSB slice from EXT; an uncached expert streams whole from EXT, and
(with demand admission) its MSB slice is written into HB as it passes, evicting the least
recently used slice. A hit refreshes the slice's recency (design brief: "an LRU that does not
refresh on a hit" is a failure kind).

* :class:`HBExpertCache` -- the LRU; :meth:`HBExpertCache.for_model` sizes it from an
  :class:`~elmoe3d.config.ArchConfig` (``hb_bytes``) less the reserved dense-weight and
  KV-cache bytes; :meth:`~HBExpertCache.step` accesses the experts one step (a batch of tokens)
  uses at one layer, each once (weight reuse across the batch); :meth:`~HBExpertCache.fill`
  replaces the contents (Elastic-SD's pool update).
* :class:`CacheStats` -- per-layer accesses and hits, bytes read from HB and EXT, bytes written
  into HB, evictions.
* :func:`replay` -- run a trace's routing through a cache, ``batch`` requests in lockstep
  (:func:`batch_accesses`: the steps it makes); :func:`replay_per_layer` -- the same through
  one LRU a MoE layer.

Units: bytes. The cache models capacity and traffic, not timing (the performance model turns
the bytes into cycles with the config's bandwidths).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields

import numpy as np

from ...checks import is_int
from ...errors import UserError
from .models import ModelPreset, model_preset


__all__ = ["HBExpertCache", "CacheStats", "replay", "replay_per_layer", "batch_accesses",
           "hb_capacity_bytes"]


def _nonneg_int(name, v):
    if not is_int(v) or v < 0:
        raise UserError(f"{name}: expected an integer number of bytes >= 0, got {v!r}")
    return int(v)


def hb_capacity_bytes(arch, *, dense_bytes=0, kv_bytes=0,
                      names=("dense_bytes", "kv_bytes")) -> int:
    """Bytes of HB left for expert MSB slices: ``arch.hb_bytes - dense_bytes - kv_bytes``;
    ``arch`` an :class:`~elmoe3d.config.ArchConfig` or a preset's name (e.g.
    ``"paper-8gb"``). Raises :class:`UserError` naming ``arch`` for another ``arch`` (an
    unknown name, another type), and naming the parameters (``names``: what the caller
    calls them, e.g. its command-line options) when nothing is left."""
    from ...config import ConfigError, arch_config
    try:
        arch = arch_config(arch)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    dense_bytes = _nonneg_int("dense_bytes", dense_bytes)
    kv_bytes = _nonneg_int("kv_bytes", kv_bytes)
    total = arch.hb_bytes
    left = total - dense_bytes - kv_bytes
    if left <= 0:
        raise UserError(f"{names[0]} ({dense_bytes}) + {names[1]} ({kv_bytes}) leave no HB for "
                        f"experts: {arch.name} has {total} bytes of HB "
                        f"({arch.pes} banks x {arch.hb_bank_bytes})")
    return left


@dataclass
class CacheStats:
    """Traffic of an expert cache, per MoE layer (arrays indexed like ``layer_ids``).

    Attributes
    ----------
    layer_ids : tuple
    accesses, hits : ndarray int64 [L]
        Expert accesses (distinct experts per step and layer) and those whose MSB slice was in
        HB.
    hb_read_bytes : int
        MSB slices read from HB (hits).
    ext_read_bytes : int
        LSB slices of hits plus whole experts of misses, read from EXT.
    hb_write_bytes : int
        MSB slices written into HB (admissions and pool updates).
    ext_extra_bytes : int
        EXT reads made only to fill HB (a pool-update slice no verification step streamed).
    evictions : int
    """

    layer_ids: tuple
    accesses: np.ndarray = None
    hits: np.ndarray = None
    hb_read_bytes: int = 0
    ext_read_bytes: int = 0
    hb_write_bytes: int = 0
    ext_extra_bytes: int = 0
    evictions: int = 0

    def __post_init__(self):
        L = len(self.layer_ids)
        if self.accesses is None:
            self.accesses = np.zeros(L, np.int64)
        if self.hits is None:
            self.hits = np.zeros(L, np.int64)

    @property
    def hit_rate(self) -> float:
        """Hits / accesses over all layers (0 if nothing was accessed)."""
        a = int(self.accesses.sum())
        return int(self.hits.sum()) / a if a else 0.0

    @property
    def layer_hit_rates(self) -> np.ndarray:
        """Per-layer hit rate (NaN for a layer never accessed)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.accesses > 0, self.hits / np.maximum(self.accesses, 1), np.nan)

    def merge(self, other: "CacheStats") -> "CacheStats":
        """The two runs' statistics together: every field but ``layer_ids`` summed, field by
        field by name. Raises ``ValueError`` for stats of other layers."""
        if other.layer_ids != self.layer_ids:
            raise ValueError("merge: different layer_ids")
        return CacheStats(self.layer_ids, **{
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self) if f.name != "layer_ids"})

    def summary(self) -> dict:
        return {"accesses": int(self.accesses.sum()), "hits": int(self.hits.sum()),
                "hit_rate": self.hit_rate, "hb_read_bytes": self.hb_read_bytes,
                "ext_read_bytes": self.ext_read_bytes, "hb_write_bytes": self.hb_write_bytes,
                "ext_extra_bytes": self.ext_extra_bytes, "evictions": self.evictions}


class HBExpertCache:
    """LRU cache of expert MSB slices in HB.

    Parameters (keyword-only)
    ----------
    capacity_bytes : int
        HB bytes available to MSB slices (after dense weights and KV cache).
    model : str or ModelPreset
        Gives the slice sizes (``expert_msb_bytes``, ``expert_lsb_bytes``), the MoE layers and
        the expert count (ids are checked against it).
    admit : bool
        Demand admission: write a missed expert's MSB slice into HB (default True). False
        leaves the contents to :meth:`fill` (Elastic-SD's pool).

    Raises :class:`UserError` naming the parameter on a bad value.
    """

    def __init__(self, *, capacity_bytes, model, admit=True):
        self._preset = model_preset(model)
        self._capacity = _nonneg_int("capacity_bytes", capacity_bytes)
        if not isinstance(admit, bool):
            raise UserError(f"admit: expected a bool, got {admit!r}")
        self._admit = admit
        self._lru = OrderedDict()                     # (layer, expert) -> None, LRU first
        self._order = None      # after fill_indices: its flat keys, _lru built on first use
        self._changes = ([], [])                      # the latest step's admitted, evicted
        self._lidx = {lay: j for j, lay in enumerate(self._preset.moe_layer_ids)}
        self._lids = np.asarray(self._preset.moe_layer_ids, np.int64)
        # the cached keys as a bool [L, E] mask by MoE-layer index, kept with the LRU order
        self._mask = np.zeros((len(self._lids), self._preset.routed_experts), bool)
        self.stats = CacheStats(tuple(self._preset.moe_layer_ids))

    @classmethod
    def for_model(cls, model, arch, *, dense_bytes=0, kv_bytes=0, admit=True):
        """A cache sized from ``arch`` (:func:`hb_capacity_bytes`): an
        :class:`~elmoe3d.config.ArchConfig` or a preset's name (e.g. ``"paper-4gb"``). Raises
        :class:`UserError` naming the parameter for another ``arch`` and as
        :func:`hb_capacity_bytes` and the constructor do."""
        return cls(capacity_bytes=hb_capacity_bytes(arch, dense_bytes=dense_bytes,
                                                    kv_bytes=kv_bytes),
                   model=model, admit=admit)

    # -- properties -----------------------------------------------------------------------------
    @property
    def model(self) -> ModelPreset:
        return self._preset

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def msb_bytes(self) -> int:
        """Bytes of one MSB slice (with its group scales)."""
        return self._preset.expert_msb_bytes

    @property
    def lsb_bytes(self) -> int:
        return self._preset.expert_lsb_bytes

    @property
    def slots(self) -> int:
        """MSB slices that fit: ``capacity_bytes // msb_bytes``."""
        return self._capacity // self.msb_bytes

    @property
    def admit(self) -> bool:
        return self._admit

    def _entries(self) -> OrderedDict:
        """The LRU order, ``{(layer, expert): None}`` least recently used first (built from
        :meth:`fill_indices`' keys when first asked for after it)."""
        if self._lru is None:
            j, e = np.divmod(self._order, self._mask.shape[1])
            self._lru = OrderedDict.fromkeys(zip(self._lids[j].tolist(), e.tolist()))
            self._order = None
        return self._lru

    def __len__(self) -> int:
        return len(self._entries())

    def __contains__(self, key) -> bool:
        """``(layer, expert) in cache``: a look-up without side effects (no refresh). A key is
        a (layer, expert) pair: anything else (``5``, ``"ab"``, ``(0,)``) is not in the cache
        (False, as a dict answers for a key it cannot hold)."""
        if not isinstance(key, tuple):
            if isinstance(key, (str, bytes)) or not hasattr(key, "__len__"):
                return False
            key = tuple(key)
        try:
            return key in self._entries()
        except TypeError:                       # an unhashable item
            return False

    def contents(self) -> list:
        """Cached (layer, expert) keys, least recently used first."""
        return list(self._entries())

    def resident_mask(self) -> np.ndarray:
        """The cached keys as a bool ``[L, E]`` array (a copy): row ``j`` is the model's
        ``j``-th MoE layer (``model.moe_layer_ids[j]``), column the expert id."""
        return self._mask.copy()

    def layer_contents(self, layer) -> list:
        """Experts cached at ``layer``, least recently used first."""
        return [e for lay, e in self._entries() if lay == layer]

    # -- access ---------------------------------------------------------------------------------
    def _check_layer(self, layer, what=""):
        """:class:`UserError` unless ``layer`` is an integer id of a MoE layer of the model
        (``what``: a prefix naming the argument it came in, e.g. ``"streamed: "``)."""
        if not is_int(layer) or layer not in self._lidx:
            raise UserError(f"{what}layer: {layer!r} is not a MoE layer of {self._preset.name}")

    def _check(self, layer, expert, what=""):
        """:class:`UserError` unless ``(layer, expert)`` is a key of the model: integer ids of
        a MoE layer and of a routed expert."""
        self._check_layer(layer, what)
        if not is_int(expert) or not 0 <= expert < self._preset.routed_experts:
            raise UserError(f"{what}expert: {expert!r} is not an expert id of "
                            f"{self._preset.name} (0..{self._preset.routed_experts - 1})")

    def _keys(self, keys, what) -> list:
        """``keys``, an iterable of (layer, expert), as checked int pairs (:meth:`_check`);
        :class:`UserError` naming ``what`` otherwise."""
        if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
            raise UserError(f"{what}: expected (layer, expert) pairs, got {keys!r}")
        out = []
        for k in keys:
            try:
                lay, e = k
            except (TypeError, ValueError):
                raise UserError(f"{what}: expected (layer, expert) pairs, got {k!r}") from None
            self._check(lay, e, f"{what}: ")
            out.append((int(lay), int(e)))
        return out

    def _insert(self, key):
        lru = self._entries()
        while len(lru) >= self.slots:
            gone, _ = lru.popitem(last=False)
            self._mask[self._lidx[gone[0]], gone[1]] = False
            self._changes[1].append(gone)
            self.stats.evictions += 1
        lru[key] = None
        self._mask[self._lidx[key[0]], key[1]] = True
        self._changes[0].append(key)
        self.stats.hb_write_bytes += self.msb_bytes

    @property
    def last_changes(self) -> tuple:
        """``(admitted, evicted)``: the (layer, expert) keys the latest :meth:`step` wrote into
        HB and evicted, in that order (a step admits at most :attr:`slots` keys, so none is
        both: an evicted key was resident before the step). Lets a caller follow the contents
        without walking them (:meth:`.compiler.HomeGroups.update`)."""
        return tuple(self._changes[0]), tuple(self._changes[1])

    def step(self, layer, experts) -> tuple:
        """Access the experts one step uses at ``layer`` (all tokens of a batch together):
        each distinct expert once, in the order given. Hits and misses are decided against
        the contents before the step, then the cache is updated (Algorithm 1: line 23 tests
        ``e in C`` for every expert of the step, line 30's UpdateCache follows the loop), so a
        step's own admissions never turn one of its hits into a miss. A hit reads the MSB
        slice from HB and the LSB slice from EXT and refreshes the slice (the hits first, in
        the order given); a miss reads the whole expert from EXT and, with demand admission
        and at least one slot, writes its MSB slice into HB (after the hits, each evicting the
        least recently used; Section 4.2): the last :attr:`slots` misses in the order given
        when the step misses more than the cache holds (the earlier ones would be evicted by
        the later within the step: the contents are an LRU's, without the writes that would
        not stay). Returns ``(hits, misses)`` as lists of ids.
        Traffic (:attr:`stats`) in bytes. Raises :class:`UserError` for a ``layer`` that is not
        an integer MoE layer id, ``experts`` not an iterable of integer expert ids."""
        self._check_layer(layer)
        if isinstance(experts, (str, bytes)) or not hasattr(experts, "__iter__"):
            raise UserError(f"experts: expected expert ids, got {experts!r}")
        layer = int(layer)
        hits, misses = [], []
        self._changes = ([], [])
        seen = set()
        lru = self._entries()
        for e in experts:
            self._check(layer, e)
            e = int(e)
            if e in seen:
                continue
            seen.add(e)
            (hits if (layer, e) in lru else misses).append(e)
        j = self._lidx[layer]
        self.stats.accesses[j] += len(hits) + len(misses)
        self.stats.hits[j] += len(hits)
        self.stats.hb_read_bytes += len(hits) * self.msb_bytes
        self.stats.ext_read_bytes += len(hits) * self.lsb_bytes \
            + len(misses) * (self.msb_bytes + self.lsb_bytes)
        for e in hits:
            lru.move_to_end((layer, e))
        if self._admit and self.slots:
            for e in misses[-self.slots:]:
                self._insert((layer, e))
        return hits, misses

    def fill(self, keys, *, streamed=()) -> int:
        """Make the contents exactly ``keys`` (an iterable of (layer, expert), at most
        :attr:`slots`), in that recency order (last = most recent). Slices already cached are
        kept (no traffic); each new one is written into HB (``hb_write_bytes``); a new one not
        in ``streamed`` (the keys whose whole expert some step read from EXT anyway) costs an
        extra EXT read of its MSB slice (``ext_extra_bytes``; Elastic-SD's pool update,
        Section 4.2). Returns the bytes written.
        Raises :class:`UserError` naming ``keys`` or ``streamed`` for an item that is not a
        (layer, expert) pair of integer ids of the model, naming ``keys`` for a repeated key
        or more keys than slots."""
        keys = self._keys(keys, "keys")
        if len(set(keys)) != len(keys):
            raise UserError("keys: repeated (layer, expert)")
        E = self._preset.routed_experts
        flat = np.array([self._lidx[lay] * E + e for lay, e in keys], np.int64)
        st = np.zeros(self._mask.shape, bool)
        for lay, e in self._keys(streamed, "streamed"):
            st[self._lidx[lay], e] = True
        return self.fill_indices(flat, streamed=st)

    def fill_indices(self, keys, *, streamed=None) -> int:
        """:meth:`fill` with the keys as flat indices: ``keys`` int ``[n]`` of ``j * E + e``
        (``j`` the MoE-layer index, as in :meth:`resident_mask`; recency order, last = most
        recent), ``streamed`` a bool ``[L, E]`` mask (None: nothing streamed). Returns the
        bytes written. Raises :class:`UserError` for keys that are not integers in 0 .. L x E
        - 1, repeated or more than :attr:`slots`, and a ``streamed`` of another shape or
        type."""
        L, E = self._mask.shape
        raw = np.asarray(keys)
        if raw.size and not np.issubdtype(raw.dtype, np.integer):
            raise UserError(f"keys: expected integer flat (layer, expert) indices, got "
                            f"{raw.dtype} values")
        if streamed is not None:
            st = np.asarray(streamed)
            if st.dtype != bool or st.shape != (L, E):
                raise UserError(f"streamed: expected a bool [{L}, {E}] mask, got {st.dtype} "
                                f"{st.shape}")
        keys = raw.astype(np.int64).reshape(-1)
        if keys.size and (keys.min() < 0 or keys.max() >= L * E):
            raise UserError(f"keys: flat (layer, expert) indices outside 0..{L * E - 1}")
        new = np.zeros(L * E, bool)
        new[keys] = True
        if np.count_nonzero(new) != keys.size:
            raise UserError("keys: repeated (layer, expert)")
        if keys.size > self.slots:
            raise UserError(f"keys: {keys.size} MSB slices do not fit in {self.slots} slots "
                            f"({self._capacity} bytes / {self.msb_bytes})")
        old = self._mask.reshape(-1)
        added = new & ~old
        n_new = int(np.count_nonzero(added))
        extra = added if streamed is None else added & ~np.asarray(streamed, bool).reshape(-1)
        self.stats.ext_extra_bytes += int(np.count_nonzero(extra)) * self.msb_bytes
        self.stats.evictions += int(np.count_nonzero(old & ~new))
        self.stats.hb_write_bytes += n_new * self.msb_bytes
        self._lru, self._order = None, keys.copy()
        self._mask = new.reshape(L, E)
        return n_new * self.msb_bytes


def _check_batch(batch) -> int:
    """``batch`` as an int: a positive integer (requests in lockstep); :class:`UserError`
    naming it otherwise."""
    if not is_int(batch) or batch < 1:
        raise UserError(f"batch: expected a positive integer, got {batch!r}")
    return int(batch)


def _check_trace(trace, model: ModelPreset, *, top_k: bool = False) -> None:
    """A trace of ``model``'s MoE layers and routed experts (and with ``top_k``, its top-k);
    :class:`UserError` otherwise."""
    if tuple(trace.layer_ids) != tuple(model.moe_layer_ids):
        raise UserError(f"trace layers {trace.layer_ids[:3]}... are not the MoE layers of "
                        f"{model.name}")
    if trace.num_experts != model.routed_experts:
        raise UserError(f"trace has {trace.num_experts} experts, {model.name} "
                        f"{model.routed_experts}")
    if top_k and trace.top_k != model.top_k:
        raise UserError(f"trace routes top-{trace.top_k}, {model.name} top-{model.top_k}")


def batch_accesses(trace, *, batch=1, phase="decode"):
    """The expert accesses of ``trace``'s ``phase`` routing served ``batch`` requests at a
    time, as :func:`replay` makes them: yields ``(layer, experts)`` per step and MoE layer,
    ``experts`` the ids the batch's tokens chose there (tokens in batch order, experts best
    first; repeats left for the cache to merge), skipping a layer no token of the step
    reaches. Requests in increasing id, a batch's in lockstep, one token each per step.
    Raises :class:`UserError` for a ``batch`` not a positive integer and an unknown
    ``phase``."""
    batch = _check_batch(batch)
    reqs = trace.requests(phase)
    for b0 in range(0, len(reqs), batch):
        group = reqs[b0:b0 + batch]
        steps = max(r.tokens for r in group)
        for t in range(steps):
            for j, layer in enumerate(trace.layer_ids):
                experts = []
                for r in group:
                    if t < r.tokens and r.present[t, j]:
                        experts.extend(int(e) for e in r.ids[t, j])
                if experts:
                    yield layer, experts


def replay(trace, cache: HBExpertCache, *, batch=1, phase="decode") -> CacheStats:
    """Run the ``phase`` routing of ``trace`` through ``cache`` and return the traffic of this
    replay (the cache's own :attr:`~HBExpertCache.stats` accumulate too).

    Requests are taken ``batch`` at a time in increasing id; the requests of a batch advance in
    lockstep, one token each per step, and at every step each MoE layer accesses the union of
    the experts its tokens chose (tokens in batch order, experts best first), so an expert
    shared by several tokens of a step is read once. Missing (token, layer) records access
    nothing. The trace's layers must be the model's MoE layers (the exact LRU that Section 7's
    Che approximation stands for). Traffic in bytes. Raises
    :class:`UserError` for a ``batch`` not a positive integer, a trace whose layers or expert
    count are not the cache model's, and an unknown ``phase``."""
    _check_batch(batch)
    _check_trace(trace, cache.model)
    before = CacheStats(cache.stats.layer_ids, cache.stats.accesses.copy(),
                        cache.stats.hits.copy(), cache.stats.hb_read_bytes,
                        cache.stats.ext_read_bytes, cache.stats.hb_write_bytes,
                        cache.stats.ext_extra_bytes, cache.stats.evictions)
    for layer, experts in batch_accesses(trace, batch=batch, phase=phase):
        cache.step(layer, experts)
    s = cache.stats
    return CacheStats(s.layer_ids, s.accesses - before.accesses, s.hits - before.hits,
                      s.hb_read_bytes - before.hb_read_bytes,
                      s.ext_read_bytes - before.ext_read_bytes,
                      s.hb_write_bytes - before.hb_write_bytes,
                      s.ext_extra_bytes - before.ext_extra_bytes,
                      s.evictions - before.evictions)


def replay_per_layer(trace, model, slots_per_layer, *, batch=1, phase="decode") -> CacheStats:
    """:func:`replay` through one LRU a MoE layer instead of one over all layers: each layer's
    accesses go to its own :class:`HBExpertCache` of ``slots_per_layer`` MSB slices (demand
    admission), the structure of the whole-decoder model's cache (a share of the slots a
    layer, :class:`~.paper_eval.ExpertPopularity`). Returns the layers' traffic summed, in
    bytes. ``model``: a preset (name); ``slots_per_layer``: an integer >= 0. Raises
    :class:`UserError` naming the parameter, and as :func:`replay` does."""
    m = model_preset(model)
    if not is_int(slots_per_layer) or slots_per_layer < 0:
        raise UserError(f"slots_per_layer: expected an integer >= 0, got {slots_per_layer!r}")
    _check_batch(batch)
    _check_trace(trace, m)
    caches = {layer: HBExpertCache(capacity_bytes=int(slots_per_layer) * m.expert_msb_bytes,
                                   model=m) for layer in m.moe_layer_ids}
    for layer, experts in batch_accesses(trace, batch=batch, phase=phase):
        caches[layer].step(layer, experts)
    out = CacheStats(tuple(m.moe_layer_ids))
    for c in caches.values():
        out = out.merge(c.stats)
    return out

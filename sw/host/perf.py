"""Analytical performance model of the logic die running the host's compiled steps (paper
Sections 4.1, 5.1, 5.2, 6 and Table 1; ``docs/host.md``, "Performance model").

Every figure is read from the one :class:`~elmoe3d.config.ArchConfig` (and its DRAM section):
``hb_bank_gbps`` (per PE bank; = ``hb.peak_gbps``), ``ext_gbps`` (= ``ext_channels`` x
``ext.peak_gbps``), ``streamline_gbps``, ``aggregation_gbps``, ``clock_ghz``, the tile's
:meth:`~elmoe3d.config.TileConfig.peak_macs_per_cycle` at W4A8 and W8A8, the PE word width,
``pes_per_group``, ``groups``, ``hb_pj_per_bit`` and ``ext_pj_per_bit``. The expert shapes and
slice sizes come from the :class:`~.models.ModelPreset` (``expert_msb_bytes``,
``expert_lsb_bytes``). Nothing else is typed here.

Per layer of a step (:class:`~.compiler.LayerWork` placed by :func:`~.compiler.place_layer`),
for every expert on group g (G PEs, R tile rows, L lanes, ``rbn`` = ceil(tokens / R) row blocks
split over the PEs as :mod:`.parallel` splits them), the same schemes as
:func:`.parallel.compile_group`:

* bytes: HB reads from bank p = ``msb x I_p / I`` for an HB-resident expert (draft and
  verify alike), ``I_p`` the intermediate channels of PE p's slice (:func:`channel_slices`:
  ``I / G`` when ``I`` is a multiple of 32 x G, else whole 32-weight groups, the larger slices
  on the lowest PEs); EXT ring bytes (each multicast transfer once) = 0 (draft), LSB slice +
  the scale copies the LSB GEMMs need (verify of a cached expert), the whole expert
  (uncached); pool-update writes add ``msb x I_p / I`` to bank p of the home group, extra pool
  reads add ``msb`` to EXT;
* tensor-tile beats per PE: MACs of its GEMMs (rows padded to whole row blocks) at the
  tile's peak: W4A8 GEMMs (DRAFT, MSB_ONLY, LSB_ONLY) at ``peak_macs_per_cycle(4)``, FULL
  ones at ``peak_macs_per_cycle(8)`` (one beat per cycle either way; ``tile_cycles``);
* compute cycles per PE (:mod:`.perf_calib`, issue 26 item 6): the PE cycle model's cycles of
  the group program the compiler emits (fill, drain, SwiGLU / REQUANT / COMBINE passes and
  link steps included): per expert, by kind, tokens and the rotation of its token slices,
  plus each program's base (CLEAR, OUT reduction, OUTPUT, STATUS), from a shipped table of
  program_cycles on the small configuration; on the paper configurations the MACs above
  scaled by the compute calibration's cycles over beats (:mod:`.compute_calib`); MACs / peak
  where no table has the shape (:attr:`~.perf_calib.ComputeCycles.note` says which);
* MXFP4 experts (GPT-OSS-20B: no LSB slice, the "MSB slice" is the whole 4-bit expert): every
  GEMM is W4A8; a verify runs a cached expert as the draft does (HB only, tensor parallel, no
  EXT) and an uncached one data-parallel from EXT;
* link words (the group's descriptors run one at a time, each port moving
  ``aggregation_bytes_per_cycle``): draft: the row-max all-reduce and the down psums
  reduced into the root; verify of a cached expert: the MSB psums of the up/gate channel
  slices to the token owners, the INT8 h scatter and the down MSB psums; and once per verify
  layer the OUT rows reduced into the root.

Timing: double-buffered streams overlap, so a group's layer time is the largest of its HB
time (busiest bank: read + written bytes / ``hb_bytes_per_cycle``), its compute time (busiest
PE's compute cycles) and its link time; the EXT stream is shared by the die: ring bytes /
min(EXT, streamline) bytes per cycle. A layer takes the maximum of the busiest group and the
EXT time (its *bound* names which); a step is its layers in sequence.

The feed (``feed``, :data:`~.perf_calib.FEEDS`): ``"die"`` (the default) is the logic die's:
a busy group's HB and compute times start after its first word (``head_hb``, the HB's first
read, :meth:`~elmoe3d.config.DramConfig.first_read_cycles`: tRCD + RL + a burst, 33 cycles;
``head_ext``, 47, for a group whose experts all stream from EXT), the programs' cycles are
taken at the HB bank's ``ld`` rate with their link words at the aggregation link's where
the program table has both (0.8 and 0.5 words a cycle on the small PE), and a layer's EXT
time adds the EXT's first read and the work after its last word:
the largest tail (:meth:`~.perf_calib.ComputeCycles.tail`, the cycle model's cycles after the
last ``ld`` word of a program ending in that expert, stream-bound) of a group's last expert
in program order, when it has EXT bytes (an MXFP4 cached expert has none: no program table
has MXFP4 experts, so none has a tail), with the OUT reduction and OUTPUT of the step's
tokens. A group that only takes pool writes has no head (its writes wait for no read).
And a group's PEs move through its program together (:meth:`PerfModel._after`,
:meth:`PerfModel._after_base`): the PEs that have cycles in an expert run it in lockstep
(from the latest of their ready times, all for its largest per-PE cycles), and the base (the
OUT reduction into the root, OUTPUT) starts after every PE that takes part in it, instead of
each PE running its program alone:
an EXT chunk is admitted only when every PE it names has room (a multicast LSB slice or
uncached expert moves at its slowest PE's pace) and a cached expert's psums are exchanged
over the link, its down-projection psums last.
``"ideal"`` is the RTL / golden backends' feed (each PE program alone, a word every cycle
from the first, link words too): none of these. Against the die bench (``elmoe3d.sim.bench_die.perf_cycles``,
``docs/host.md`` section 7) the die feed is within 5% per step kind, summed over its 1-, 4-
and 16-token batches (-3.4% draft, -3.3% verify; -1.0% to -7.3% a batch), on the bench's 2
EXT channels; with 8, -3.1% draft and -3.6% verify (-6.5% to +2.3% a batch; 8.7% under
with the programs' link words at a word a cycle, not the link's half; 16.1% before the
group's PEs were held together), where the model is compute-bound: at T = 16 the die's PEs
also wait for EXT words while both groups stream uncached experts at once, which a per-layer
EXT average does not see, and for two LPDDR5 refreshes (``docs/host.md`` section 7).

Energy:
:meth:`~elmoe3d.config.ArchConfig.access_energy_pj` of the HB (read + written) and EXT bytes:
HB bits x ``hb_pj_per_bit`` + EXT bits x ``ext_pj_per_bit`` (the paper's figures; link and
compute energy have no figure in the configuration and are not counted). Not modelled:
attention and the dense layers, the host link and the die's command port, the EXT's
bandwidth over time within a layer (a per-layer total), and DRAM row-miss /
refresh losses (``make bench`` measures those: >= 97% of peak on streaming reads).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ...checks import check_int, is_int
from ...config import ArchConfig
from .compiler import LayerWork, Placement, step_work, write_arrays
from .models import QUANT_GROUP, model_preset
from .perf_calib import FEEDS, compute_cycles, program_order


__all__ = ["ExpertCost", "LayerCost", "StepCost", "PerfModel", "token_slices",
           "channel_slices"]

#: The phases :meth:`PerfModel.expert` and :meth:`PerfModel.compute` price
#: (:attr:`.compiler.Step.phase`).
PHASES = ("draft", "verify")


def token_slices(rbn: int, pes: int) -> list:
    """Row blocks per PE of an expert's ``rbn`` row blocks (DP over tokens): sizes differing by
    at most one, as :mod:`.parallel` cuts them (which PE gets the larger ones rotates; the
    busiest PE's load does not depend on it). Raises ``ValueError`` naming ``rbn`` (an
    integer >= 0) or ``pes`` (a positive integer)."""
    check_int("rbn", rbn, 0)
    check_int("pes", pes, 1)
    base, extra = divmod(rbn, pes)
    return [base + (1 if p < extra else 0) for p in range(pes)]


def channel_slices(channels: int, pes: int) -> list:
    """Intermediate channels per PE of an HB-resident expert (up/gate split by output channel,
    down by K, each PE's share in its own HB bank), in whole 32-weight groups: sizes differing
    by at most one group, the larger ones on the lowest PEs. Equal when ``channels`` is a
    multiple of 32 x ``pes`` (the only split :mod:`.parallel` compiles); otherwise, e.g.
    GPT-OSS-20B's 2880 = 90 groups over 4 PEs: 736, 736, 704, 704 (the busiest bank and PE
    carry 23/90 of the expert instead of 1/4: 2.2 % more time where the bank or the PE bounds
    the layer; zero-padding to 3072 channels would cost 6.7 % more bytes and MACs). Raises
    ``ValueError`` naming ``channels`` (an integer >= 0, a multiple of 32) or ``pes`` (a
    positive integer)."""
    check_int("channels", channels, 0)
    if channels % QUANT_GROUP:
        raise ValueError(f"channels: expected a multiple of {QUANT_GROUP} (whole quantization "
                         f"groups), got {channels}")
    check_int("pes", pes, 1)
    groups = channels // QUANT_GROUP
    base, extra = divmod(groups, pes)
    return [(base + (1 if p < extra else 0)) * QUANT_GROUP for p in range(pes)]


@dataclass
class ExpertCost:
    """One expert on one group in one layer-step."""

    expert: int
    tokens: int
    kind: str                  # "draft", "cached" (verify: MSB-TP + LSB-DP; MXFP4: HB TP),
                               # "uncached"
    hb_bytes: list             # HB bytes read from each of the group's banks
    ext_bytes: float           # EXT ring bytes (multicast transfers once)
    w4_macs: list              # per PE
    w8_macs: list              # per PE
    link_words: int


@dataclass
class LayerCost:
    """A layer-step: per-group and die figures (bytes, cycles)."""

    layer: int
    cycles: float
    bound: str                 # "hb", "ext", "compute" or "link"
    hb_read_bytes: float       # over all banks
    hb_write_bytes: float
    ext_bytes: float
    link_bytes: float
    macs: float
    tile_cycles: float         # compute cycles summed over every PE (= tensor-tile beats)
    group_cycles: dict         # g -> {"hb", "compute", "link"}
    ext_cycles: float
    accesses: int
    hits: int
    experts: list = field(default_factory=list)


@dataclass
class StepCost:
    """A step: its layers in sequence."""

    index: int
    kind: str
    tokens: int
    produced: int
    cycles: float
    us: float
    hb_read_bytes: float
    hb_write_bytes: float
    ext_bytes: float
    link_bytes: float
    energy_pj: float
    hb_energy_pj: float
    ext_energy_pj: float
    accesses: int
    hits: int
    bounds: dict
    tile_cycles: float
    layers: list

    @property
    def hit_rate(self):
        return self.hits / self.accesses if self.accesses else None


@functools.lru_cache(maxsize=64)
def _shared_memo(arch, model, feed) -> tuple:
    return {}, {}, {}, {}


def _memo(arch, model, feed) -> tuple:
    """:class:`PerfModel`'s four per-expert memo dicts for ``(arch, model, feed)``: shared by
    every model of that key (fresh ones for an unhashable configuration)."""
    try:
        return _shared_memo(arch, model, feed)
    except TypeError:
        return {}, {}, {}, {}


class PerfModel:
    """The analytical model (module docstring) for ``arch`` and ``model`` (a preset name or
    :class:`~.models.ModelPreset`, e.g. :func:`.compiler.synthetic_model`).

    An HB-resident expert is split over the group's PEs and banks by :func:`channel_slices`
    (whole 32-weight groups; uneven when the intermediate size is not a multiple of 32 x
    ``pes_per_group``). MXFP4 experts (GPT-OSS-20B) have no LSB slice: 4-bit weights
    throughout, at the W4A8 peak; a verify runs a cached one as the draft runs it (HB-only
    tensor parallelism) and streams an uncached one whole from EXT.

    ``feed``: ``"die"`` (default) or ``"ideal"`` (:data:`~.perf_calib.FEEDS`; module
    docstring, "The feed"); another value raises ``ValueError``."""

    def __init__(self, arch: ArchConfig, model, *, feed: str = "die"):
        if not isinstance(arch, ArchConfig):
            raise TypeError(f"arch: expected an ArchConfig, got {type(arch).__name__}")
        if feed not in FEEDS:
            raise ValueError(f"feed: expected one of {FEEDS}, got {feed!r}")
        self.arch = arch
        self.feed = feed
        self.model = model_preset(model)
        #: The first word of a layer-step's HB / EXT stream, cycles after its start
        #: (:meth:`~elmoe3d.config.DramConfig.first_read_cycles`; 0 in the ``"ideal"`` feed).
        die = feed == "die"
        self.head_hb = arch.hb.first_read_cycles(arch.clock_ghz) if die else 0
        self.head_ext = arch.ext.first_read_cycles(arch.clock_ghz) if die else 0
        self.pe = arch.pe
        G = arch.pes_per_group
        self.G = G
        #: Intermediate channels of each PE's slice (:func:`channel_slices`).
        self.slices = channel_slices(self.model.expert_intermediate, G)
        self._share = [i / self.model.expert_intermediate for i in self.slices]
        self.hb_bpc = arch.hb_bytes_per_cycle
        self.ext_bpc = min(arch.ext_gbps, arch.streamline_gbps) / arch.clock_ghz
        self.link_bpc = arch.aggregation_bytes_per_cycle
        self.peak4 = arch.tile.peak_macs_per_cycle(4)
        self.peak8 = arch.tile.peak_macs_per_cycle(8)
        # the preset's sizes, read once (they are properties computed on every access)
        self._msb = self.model.expert_msb_bytes
        self._lsb = self.model.expert_lsb_bytes
        self._scales = self.model.expert_scale_bytes
        #: The calibrated compute term (:mod:`.perf_calib`): per-PE cycles of each expert and
        #: of each group program, from the PE cycle model where a table has the shape.
        self.calib = compute_cycles(arch, self.model, feed)
        # per-expert figures and their tables: functions of (arch, model, feed) alone, kept
        # across models of the same key (a sweep's or a benchmark's runs build them once)
        self._experts, self._tables, self._comp, self._comp_tables = _memo(arch, self.model,
                                                                           feed)
        # HB bytes per bank of n HB-resident experts on a group, added one by one as
        # layer() adds them (every HB-resident expert reads the same msb x I_p / I)
        hb = [self.msb * s for s in self._share]
        acc = [0.0] * G
        self._hb_sums = [list(acc)]
        for _ in range(self.model.routed_experts):
            acc = [a + b for a, b in zip(acc, hb)]
            self._hb_sums.append(list(acc))
        self._hb_sums = np.array(self._hb_sums)
        # the MoE layers, as a set and as a mask by layer id (steps_summary's checks)
        self._moe = frozenset(int(x) for x in self.model.moe_layer_ids)
        self._moe_mask = np.zeros(max(self._moe) + 1, bool)
        self._moe_mask[list(self._moe)] = True
        self._fit_layers = set()

    # -- sizes ------------------------------------------------------------------------------
    @property
    def msb(self) -> int:
        return self._msb

    @property
    def lsb(self) -> int:
        return self._lsb

    @property
    def scale_bytes(self) -> int:
        """FP16 group scales of one expert (part of its MSB slice)."""
        return self._scales

    def cycles_to_us(self, cycles) -> float:
        return self.arch.cycles_to_us(cycles)

    # -- one expert -------------------------------------------------------------------------
    @staticmethod
    def _check_expert(tokens, phase, cached):
        """``ValueError`` naming the first of ``tokens`` (a positive integer), ``phase``
        (:data:`PHASES`) and ``cached`` (a bool) that is wrong (:meth:`expert`,
        :meth:`compute`; called when their one-line test fails)."""
        check_int("tokens", tokens, 1)
        if phase not in PHASES:
            raise ValueError(f"phase: expected one of {PHASES}, got {phase!r}")
        raise ValueError(f"cached: expected a bool, got {cached!r}")

    def expert(self, e, tokens, *, phase, cached) -> ExpertCost:
        """Bytes, MACs and link words of one expert with ``tokens`` tokens on a group (the
        figures depend on ``tokens``, ``phase`` and ``cached`` only: computed once each).

        Raises
        ------
        ValueError
            ``tokens`` not a positive integer, ``phase`` not one of :data:`PHASES`,
            ``cached`` not a bool (the message names it); a draft of an expert not
            HB-resident."""
        if not (is_int(tokens) and tokens >= 1 and phase in PHASES
                and isinstance(cached, (bool, np.bool_))):
            self._check_expert(tokens, phase, cached)
        key = (tokens, phase, bool(cached))
        c = self._experts.get(key)
        if c is None:               # (a NumPy count as a Python int: no int32 overflow)
            c = self._experts[key] = self._expert(e, int(tokens), phase=phase,
                                                  cached=bool(cached))
        return ExpertCost(e, tokens, c.kind, list(c.hb_bytes), c.ext_bytes, list(c.w4_macs),
                          list(c.w8_macs), c.link_words)

    def _expert(self, e, tokens, *, phase, cached) -> ExpertCost:
        G, R, L = self.G, self.pe.rows, self.pe.lanes
        H, I = self.model.hidden, self.model.expert_intermediate
        Ip = self.slices
        rbn = -(-tokens // R)
        rows = rbn * R
        wpr = R * L // self.pe.q24_per_word
        d_cb = H // L
        Ga = I // QUANT_GROUP
        mxfp4 = self.model.expert_format == "mxfp4"
        hb = [self.msb * s for s in self._share]
        if phase == "draft" or (cached and mxfp4):
            if not cached:
                raise ValueError(f"expert {e}: a draft runs HB-resident experts only")
            w4 = [rows * 2 * i * H + rows * H * i for i in Ip]
            link = -(-rows // self.pe.q16_per_word) + d_cb * rbn * wpr
            return ExpertCost(e, tokens, "draft" if phase == "draft" else "cached", hb, 0.0,
                              w4, [0] * G, link)
        rbs = token_slices(rbn, G)
        if cached:
            owners = [p for p in range(G) if rbs[p]]
            ug_scales = self.scale_bytes * 2 / 3
            # a slice's up/gate scale copies go (multicast, once) to the other token owners
            copied = sum(s for o, s in enumerate(self._share) if any(q != o for q in owners))
            ext = self.lsb + self.scale_bytes / 3 + ug_scales * copied
            w4 = [(rbn - r) * R * 2 * Ip[p] * H + r * R * 2 * (I - Ip[p]) * H
                  + rows * H * Ip[p] + r * R * H * I for p, r in enumerate(rbs)]
            w8 = [r * R * 2 * Ip[p] * H for p, r in enumerate(rbs)]
            link = sum(2 * Ip[o] // L * wpr * (rbn - rbs[o]) for o in range(G)) \
                + rbn * Ga + d_cb * rbn * wpr
            return ExpertCost(e, tokens, "cached", hb, ext, w4, w8, link)
        macs = [r * R * (2 * I * H + H * I) for r in rbs]
        w4, w8 = (macs, [0] * G) if mxfp4 else ([0] * G, macs)
        return ExpertCost(e, tokens, "uncached", [0.0] * G, self.msb + self.lsb, w4, w8, 0)

    def compute(self, tokens, *, phase, cached) -> tuple:
        """``(cycles [G, G], rotation)`` of an expert of ``tokens`` tokens on a group: row
        ``j`` each PE's compute cycles when its token slices start at rotation ``j``, and how
        far it moves the next expert's (:meth:`.perf_calib.ComputeCycles.expert`,
        :meth:`~.perf_calib.ComputeCycles.rotation`; computed once per key). Raises
        ``ValueError`` as :meth:`expert` does."""
        if not (is_int(tokens) and tokens >= 1 and phase in PHASES
                and isinstance(cached, (bool, np.bool_))):
            self._check_expert(tokens, phase, cached)
        key = (tokens, phase, bool(cached))
        c = self._comp.get(key)
        if c is None:
            tokens, cached = int(tokens), bool(cached)      # (no NumPy int32 overflow)
            x = self.expert(0, tokens, phase=phase, cached=cached)
            c = self._comp[key] = (self.calib.expert(phase, cached, tokens, x.w4_macs,
                                                     x.w8_macs),
                                   self.calib.rotation(phase, cached, tokens))
        return c

    def _after(self, ready, cycles):
        """Each PE's compute cycles (float ``[..., G]``) after one more expert of a group
        program, ``ready`` before it and ``cycles`` its per-PE cycles at its rotation
        (``[..., G]``). The ``"ideal"`` feed adds them (each PE's program alone). The
        ``"die"`` feed runs the expert on its *participants* (the PEs with cycles in it) in
        lockstep: they start it at the latest of their ready times and all end it after its
        largest per-PE cycles. A group's PEs take one multicast EXT stream (an EXT chunk is
        admitted only when every PE it names has room for it, so the fastest waits for the
        slowest's FIFO to drain) and a cached expert's psums are exchanged over the
        aggregation link through it (the up/gate psums to the token owners, the h scatter,
        the down psums last), so none runs ahead of or leaves an expert before the others
        that share it; a PE without cycles in it (e.g. an uncached expert's one token on
        another PE) is not held."""
        if self.feed != "die":
            return ready + cycles
        part = cycles > 0
        end = (self._latest(np.where(part, ready, -np.inf))
               + self._latest(np.where(part, cycles, -np.inf)))
        return np.where(part, np.expand_dims(end, -1), ready)

    def _after_base(self, ready, base):
        """Each PE's compute cycles (float ``[..., G]``) after the program's base ``base``
        (CLEAR, the verify's OUT reduction into the root, OUTPUT, STATUS; ``[..., G]``), from
        ``ready`` after its experts. The ``"ideal"`` feed adds it; the ``"die"`` feed starts
        it on every PE with cycles in it at the latest of their ready times (the root reduces
        the others' OUT rows once they are done)."""
        if self.feed != "die":
            return ready + base
        part = base > 0
        start = self._latest(np.where(part, ready, -np.inf))
        return np.where(part, np.expand_dims(start, -1) + base, ready)

    @staticmethod
    def _latest(x):
        # the max over the last (PE) axis, column by column: NumPy's max over a short last
        # axis is slow
        m = x[..., 0]
        for c in range(1, x.shape[-1]):
            m = np.maximum(m, x[..., c])
        return m

    def _check_fit(self, steps, works, cells):
        """``ValueError`` naming the first of ``steps`` (``works`` their
        :class:`~.compiler.StepWork`, ``cells`` its routed experts) that does not fit this
        model and configuration, i.e. steps scheduled for another: a layer (computed or
        written) that is not one of the model's MoE layers, an expert id outside 0..E-1, a
        group outside 0..groups-1 (computed or written); :meth:`_check_top_k` checks the
        top-k. A few whole-array operations a call, and a look-up a step."""
        p, Gr = self.model, self.arch.groups
        E = p.routed_experts
        ids = self.model.moe_layer_ids
        known = f"a MoE layer of {p.name} ({ids[0]}..{ids[-1]}): steps of another model?"
        seen, last = self._fit_layers, None     # layer tuples known to fit (steps share one)
        wls, wgs, wst = [], [], []
        for st, w in zip(steps, works):
            lays = w.layers
            if lays is not last and lays not in seen:
                bad = [x for x in lays if not (is_int(x) and x in self._moe)]
                if bad:
                    raise ValueError(f"step {st.index}: layer {bad[0]!r} is not {known}")
                if len(seen) >= 1024:
                    seen.clear()
                seen.add(lays)
            last = lays
            if len(st.writes):
                wl, wg, _ = write_arrays(st.writes)
                wls.append(wl)
                wgs.append(wg)
                wst.append(st)
        if wls:
            wl, wg = np.concatenate(wls), np.concatenate(wgs)
            ok = self._moe_mask
            bad_l = (wl < 0) | (wl >= len(ok)) | ~ok[np.clip(wl, 0, len(ok) - 1)]
            bad_g = (wg < 0) | (wg >= Gr)
            if bad_l.any() or bad_g.any():
                x = int(np.argmax(bad_l | bad_g))
                st = wst[int(np.searchsorted(np.cumsum([len(a) for a in wls]), x,
                                             side="right"))]
                if bad_l[x]:
                    raise ValueError(f"step {st.index}: pool write into layer {wl[x]}, which is "
                                     f"not {known}")
                raise ValueError(f"step {st.index}: pool write into group {wg[x]}; "
                                 f"{self.arch.name} has groups 0..{Gr - 1}: steps of another "
                                 f"configuration?")
        n = [len(c.row) for c in cells]
        if sum(n):
            e = np.concatenate([c.expert for c in cells])
            g = np.concatenate([c.group for c in cells])
            bad_e, bad_g = (e < 0) | (e >= E), (g < 0) | (g >= Gr)
            if bad_e.any() or bad_g.any():
                x = int(np.argmax(bad_e | bad_g))
                i = int(np.searchsorted(np.cumsum(n), x, side="right"))
                st, lay = steps[i], works[i].layers[cells[i].row[x - sum(n[:i])]]
                what = (f"expert id {e[x]}; {p.name} has experts 0..{E - 1}" if bad_e[x] else
                        f"expert {e[x]} placed on group {g[x]}; {self.arch.name} has groups "
                        f"0..{Gr - 1}")
                raise ValueError(f"step {st.index}: layer {lay}: {what}: steps of another "
                                 f"model or configuration?")

    def _check_top_k(self, steps):
        """``ValueError`` when the first of ``steps`` that computes a layer routes another
        top-k than the model (its first :class:`~.compiler.LayerWork`'s width: steps of
        another model whose layers and expert ids fit this one's, e.g. Mixtral's on
        Qwen3-30B-A3B). One layer of one step: a schedule's steps share their model."""
        k = self.model.top_k
        for st in steps:
            if len(st.layers):
                lw = next(iter(st.layers.values()))
                if np.shape(lw.ids)[1:] != (k,):
                    raise ValueError(f"step {st.index}: layer {lw.layer}: routing of shape "
                                     f"{np.shape(lw.ids)}; {self.model.name} routes top-{k} "
                                     f"([tokens, {k}]): steps of another model?")
                return

    # -- a layer and a step -----------------------------------------------------------------
    def layer(self, work, placement, *, phase, step_tokens, writes=()) -> LayerCost:
        """Cost of one layer-step: ``placement`` from :func:`.compiler.place_layer`,
        ``step_tokens`` the step's batch (the OUT reduction covers all of it), ``writes`` the
        layer's :class:`~.compiler.PoolWrite` records."""
        G, R = self.G, self.pe.rows
        groups = {}
        ext = tail = 0.0
        hb_read = hb_write = link_b = macs = tile = 0.0
        experts = []
        for g, ex in enumerate(placement.groups):
            if not ex and not any(w.group == g for w in writes):
                continue
            hb_pe = [0.0] * G
            w4, w8 = [0] * G, [0] * G
            words = 0
            comp = np.zeros(G)
            rot = 0
            last = None
            for e, n in sorted(ex.items()):
                c = self.expert(e, n, phase=phase, cached=e in placement.cached[g])
                experts.append(c)
                cyc, r = self.compute(n, phase=phase, cached=e in placement.cached[g])
                comp = self._after(comp, cyc[rot % G])
                last = (n, e in placement.cached[g], rot % G, c.ext_bytes)
                rot += r
                hb_pe = [a + b for a, b in zip(hb_pe, c.hb_bytes)]
                ext += c.ext_bytes
                w4 = [a + b for a, b in zip(w4, c.w4_macs)]
                w8 = [a + b for a, b in zip(w8, c.w8_macs)]
                words += c.link_words
            if ex and phase == "verify":
                words += -(-step_tokens // R) * R * self.model.hidden // self.pe.q24_per_word
            n_wr = sum(1 for w in writes if w.group == g)
            wr = [n_wr * self.msb * s for s in self._share]
            ext += sum(self.msb for w in writes if w.group == g and w.extra)
            head = 0
            if ex:
                comp = self._after_base(comp, self.calib.base(phase, step_tokens))
                head = self.head_hb if placement.cached[g] & ex.keys() else self.head_ext
                n, cached, j, x = last
                if x:
                    # the program's work after the last word of its last expert's stream
                    tl = (self.calib.tail(phase, cached, n)[j]
                          + self.calib.base(phase, step_tokens) - self.calib.base(phase, n))
                    tail = max(tail, float(max(tl)))
            per_pe = [a / self.peak4 + b / self.peak8 for a, b in zip(w4, w8)]
            compute = float(max(comp)) + head
            tile += sum(per_pe)
            lb = words * self.pe.word_bytes
            groups[g] = {"hb": max(a + b for a, b in zip(hb_pe, wr)) / self.hb_bpc + head,
                         "compute": compute, "link": lb / self.link_bpc}
            hb_read += sum(hb_pe)
            hb_write += sum(wr)
            link_b += lb
            macs += sum(w4) + sum(w8)
        ext_cycles = ext / self.ext_bpc
        if ext and self.feed == "die":
            ext_cycles = ext_cycles + (self.head_ext + tail)
        terms = [("ext", ext_cycles)] + [(k, v[k]) for v in groups.values()
                                         for k in ("hb", "compute", "link")]
        bound, cycles = max(terms, key=lambda kv: kv[1]) if terms else ("ext", 0.0)
        acc = len(work.routed())
        hits = len(set(work.routed()) & set(work.cached))
        return LayerCost(layer=work.layer, cycles=cycles, bound=bound, hb_read_bytes=hb_read,
                         hb_write_bytes=hb_write, ext_bytes=ext, link_bytes=link_b, macs=macs,
                         tile_cycles=tile, group_cycles=groups, ext_cycles=ext_cycles,
                         accesses=acc, hits=hits, experts=experts)

    def _table(self, phase, tokens):
        """Per-expert figures for 0..``tokens`` tokens (row 0: none) of both kinds (0:
        uncached, 1: HB-resident) as one int64 array ``[2, n, 2 G + 2]``, n > ``tokens``;
        along the last axis: EXT bytes, the W4 MACs of each PE, the W8 MACs of each PE, link
        words. None when a figure is not a whole number (then only :meth:`layer`'s float
        arithmetic reproduces the sums)."""
        t = self._tables.get(phase)
        if t is not None and t.shape[1] > tokens:
            return t
        n = max(tokens + 1, 2 * (t.shape[1] if t is not None else 8))
        G = self.G
        t = np.zeros((2, n, 2 * G + 2), np.int64)
        for c in (0, 1):
            if phase == "draft" and not c:
                continue
            for k in range(1, n):
                x = self.expert(0, k, phase=phase, cached=bool(c))
                if x.ext_bytes != int(x.ext_bytes):
                    return None
                t[c, k] = [int(x.ext_bytes)] + x.w4_macs + x.w8_macs + [x.link_words]
        self._tables[phase] = t
        return t

    def _comp_table(self, phase, n):
        """:meth:`compute` of 0 .. ``n - 1`` tokens (row 0: none) of both kinds (0: uncached,
        1: HB-resident) as arrays: cycles float ``[2, n, G, G]`` (rotation, PE), rotations
        int64 ``[2, n]`` and the tails float ``[2, n, G, G]``
        (:meth:`.perf_calib.ComputeCycles.tail`); kept per phase and grown as :meth:`_table`
        grows."""
        t = self._comp_tables.get(phase)
        if t is not None and t[0].shape[1] >= n:
            return t
        G = self.G
        comp = np.zeros((2, n, G, G))
        rot = np.zeros((2, n), np.int64)
        tail = np.zeros((2, n, G, G))
        for c in ((1,) if phase == "draft" else (0, 1)):
            for k in range(1, n):
                comp[c, k], rot[c, k] = self.compute(k, phase=phase, cached=bool(c))
                tail[c, k] = self.calib.tail(phase, bool(c), k)
        t = self._comp_tables[phase] = (comp, rot, tail)
        return t

    def step_summary(self, step) -> StepCost:
        """:meth:`step`'s totals for ``step`` (placed by its ``placements``, or its ``work``
        arrays, :func:`.compiler.step_work`): :meth:`steps_summary` of that one step."""
        return self.steps_summary([step])[0]

    def steps_summary(self, steps) -> list:
        """:meth:`step`'s totals for each of ``steps`` (placed by their ``placements``, or
        their ``work`` arrays, :func:`.compiler.step_work`), computed over all their layers at
        once with NumPy; equal to :meth:`step`'s figures bit for bit (per layer the same
        figures; per step the same sums in the same order). The returned :class:`StepCost`
        records have no per-layer costs (``layers`` is empty): :meth:`step` gives those.

        Raises
        ------
        ValueError
            As :meth:`layer` does (a draft routed outside the HB pool); steps that do not
            fit the model or configuration (scheduled for another: a layer, expert id,
            group or top-k outside the model's or the configuration's, the message naming
            the step and layer)."""
        self._check_top_k(steps)
        return self._steps_summary(steps)

    def _steps_summary(self, steps) -> list:
        """:meth:`steps_summary` without its top-k check (:func:`.backends.perf.run_perf`
        checks the whole run's once, then prices it in chunks)."""
        a = self.arch
        E = self.model.routed_experts
        Gr, G, R = a.groups, self.G, self.pe.rows
        out = [None] * len(steps)
        if not steps:
            return out
        works = [step_work(st, E) for st in steps]
        cells = [sw.routed_cells() for sw in works]        # the routed experts of each
        self._check_fit(steps, works, cells)
        t_all = np.concatenate([c.tokens for c in cells])
        T = int(t_all.max()) if t_all.size else 0
        tabs = {ph: self._table(ph, T) for ph in {st.phase for st in steps}}
        fast = [i for i, st in enumerate(steps) if tabs[st.phase] is not None]
        # rows: every fast step's computed layers in step order (the routed experts' cells),
        # then the layers a step only writes into (no expert: pool writes only); the routed
        # experts as flat arrays: row, expert, tokens, cached, group
        n_lay = [len(works[i].layers) for i in fast]
        c_lo = np.concatenate([[0], np.cumsum(n_lay)]).astype(np.int64).tolist()
        Rc = c_lo[-1]
        fc = [cells[i] for i in fast]
        n_cell = [len(c.row) for c in fc]
        rj = np.concatenate([c.row for c in fc] + [np.zeros(0, np.int64)]) \
            + np.repeat(np.array(c_lo[:-1], np.int64), n_cell)
        e, t, kind, cg = (np.concatenate([c[f] for c in fc] + [np.zeros(0, dt)])
                          for f, dt in ((1, np.int64), (2, np.int64), (3, bool), (4, np.int64)))
        is_draft = np.repeat(np.array([steps[i].phase == "draft" for i in fast], bool), n_cell)
        cold = ~kind & is_draft
        bad = None                             # the first draft step routed outside the pool
        if cold.any():
            r0 = int(rj[np.argmax(cold)])
            bad = fast[int(np.searchsorted(c_lo, r0, side="right")) - 1]
        for i, st in enumerate(steps):         # in order, as step() would meet them
            if i == bad:
                first = int(e[np.argmax(cold & (rj == r0))])
                raise ValueError(f"expert {first}: a draft runs HB-resident experts only")
            if tabs[st.phase] is None:
                out[i] = self.step(st, st.placements)
        if not fast:
            return out
        segs, w_lo = [], Rc                    # (step, its computed rows, its write-only rows)
        # step -> its writes: (distinct layers, each write's index into them, groups, extra)
        wrs = {}
        for x, i in enumerate(fast):
            wlays = []
            if len(steps[i].writes):
                wl, wg, wx = write_arrays(steps[i].writes)
                u, inv = np.unique(wl, return_inverse=True)
                wrs[i] = (u.tolist(), inv, wg, wx)
                have = set(works[i].layers)
                wlays = [lay for lay in wrs[i][0] if lay not in have]          # sorted
            segs.append((i, c_lo[x], c_lo[x + 1], w_lo, w_lo + len(wlays), wlays))
            w_lo += len(wlays)
        Rn = w_lo
        verify = np.zeros(Rn, bool)
        out_words = np.zeros(Rn, np.int64)     # a verify's OUT reduction, per busy group
        ntok = np.zeros(Rn, np.int64)          # the step's tokens (the programs' base)
        w_cell, w_extra = [], []               # pool writes: (row, group) cells, extra ones
        for i, lo, mid, wlo, whi, wlays in segs:
            st = steps[i]
            ntok[lo:mid] = ntok[wlo:whi] = len(st.tokens)
            if st.phase == "verify":
                ow = -(-len(st.tokens) // R) * R * self.model.hidden // self.pe.q24_per_word
                verify[lo:mid] = verify[wlo:whi] = True
                out_words[lo:mid] = out_words[wlo:whi] = ow
            if i in wrs:
                u, inv, wg, wx = wrs[i]
                row = dict(zip(works[i].layers, range(lo, mid)))
                row.update(zip(wlays, range(wlo, whi)))
                cells = np.array([row[x] for x in u], np.int64)[inv] * Gr + wg
                w_cell.append(cells)
                w_extra.append(cells[wx])
        w_cell = np.concatenate(w_cell) if w_cell else np.zeros(0, np.int64)
        w_extra = np.concatenate(w_extra) if w_extra else np.zeros(0, np.int64)
        n_wr = np.bincount(w_cell, minlength=Rn * Gr).reshape(Rn, Gr)
        n_x = np.bincount(w_extra, minlength=Rn * Gr).reshape(Rn, Gr)
        # per (row, group): the routed experts' figures summed (whole numbers, exact)
        cell = rj * Gr + cg
        m = Rn * Gr
        # each routed expert's table row: draft uncached, cached, verify uncached, cached
        n = T + 1
        W = 2 * G + 2
        tab = np.concatenate([tabs[ph][:, :n] if tabs.get(ph) is not None else
                              np.zeros((2, n, W), np.int64) for ph in ("draft", "verify")])
        tab = tab.reshape(4 * n, W).astype(np.float64)                    # exact: < 2^53
        x = np.take(tab, (verify[rj] * 2 + kind) * n + t, axis=0)          # [cells, W]
        ext_b = x[:, 0]                                                    # EXT bytes
        sums = np.bincount((cell[:, None] * W + np.arange(W)).ravel(), x.ravel(),
                           m * W).astype(np.int64).reshape(Rn, Gr, W)
        ext_g, w4, w8, words = (sums[:, :, 0], sums[:, :, 1:G + 1], sums[:, :, G + 1:2 * G + 1],
                                sums[:, :, -1])
        n_cached = np.bincount(cell[kind], minlength=m).reshape(Rn, Gr)
        busy = np.bincount(cell, minlength=m).reshape(Rn, Gr) > 0
        words = words + busy * out_words[:, None]
        hb_pe = self._hb_sums[n_cached]                                   # [Rn, Gr, G]
        wr = (n_wr * self.msb)[:, :, None] * np.array(self._share)
        per_pe = w4 / self.peak4 + w8 / self.peak8
        # the calibrated compute term: each expert's per-PE cycles at its rotation, added
        # per group program in program order, then the program's base (as layer() adds
        # them, by _after and _after_base)
        ctab = [self._comp_table(ph, n) if tabs.get(ph) is not None else
                (np.zeros((2, n, G, G)), np.zeros((2, n), np.int64), np.zeros((2, n, G, G)))
                for ph in ("draft", "verify")]
        tab_c = np.concatenate([c[0][:, :n] for c in ctab])                 # [4, n, G, G]
        tab_r = np.concatenate([c[1][:, :n] for c in ctab])                 # [4, n]
        k = verify[rj] * 2 + kind
        order = program_order(cell, e)
        j, last = self.calib.rotations(tab_r[k, t], cell, e, order=order)
        comp = self.calib.cells(tab_c[k, t, j], cell, e, m, order=order,
                                after=self._after if self.feed == "die" else None
                                ).reshape(Rn, Gr, G)
        nb = max(int(ntok.max()) + 1 if Rn else 1, n)
        base = np.stack([np.stack([self.calib.base(ph, x) for x in range(nb)])
                         for ph in ("draft", "verify")])                  # [2, nb, G]
        comp = np.where(busy[:, :, None],
                        self._after_base(comp, base[verify.astype(np.int64), ntok][:, None]),
                        0.0)
        lb = words * self.pe.word_bytes
        active = busy | (n_wr > 0)
        ext = (ext_g + n_x * self.msb).sum(axis=1).astype(np.float64)
        ext_cycles = ext / self.ext_bpc
        # the die's feed (layer()): a busy group starts a DRAM read in (HB when it has an
        # HB-resident expert, else EXT); a layer's EXT stream adds its first read and the
        # work after its last word: the largest tail of a group's last expert with EXT bytes
        head = np.where(n_cached > 0, float(self.head_hb), float(self.head_ext)) * busy
        if self.feed == "die":
            tail = np.zeros(Rn)
            if self.calib.has_tails and len(cell):
                tab_t = np.concatenate([c[2][:, :n] for c in ctab])         # [4, n, G, G]
                sel = np.flatnonzero(last & (ext_b > 0))
                ph = verify[rj[sel]].astype(np.int64)
                tl = (tab_t[k[sel], t[sel], j[sel]] + base[ph, ntok[rj[sel]]]
                      - base[ph, t[sel]]).max(axis=1)
                np.maximum.at(tail, rj[sel], tl)
            ext_cycles = np.where(ext > 0, ext_cycles + (self.head_ext + tail), ext_cycles)
        def pe_max(x):
            # the busiest PE of each (row, group): a max over the short last axis, column by
            # column (NumPy's reduction over a 4-wide axis is slow)
            m = x[:, :, 0]
            for c in range(1, x.shape[2]):
                m = np.maximum(m, x[:, :, c])
            return m

        terms = np.stack([pe_max(hb_pe + wr) / self.hb_bpc + head, pe_max(comp) + head,
                          lb / self.link_bpc], axis=2)                    # [Rn, Gr, 3]
        terms = np.where(active[:, :, None], terms, -np.inf).reshape(Rn, Gr * 3)
        terms = np.concatenate([ext_cycles[:, None], terms], axis=1)
        best = terms.argmax(axis=1)
        names = ("ext",) + ("hb", "compute", "link") * Gr

        def seq(x):
            # per row: the sum over the banks of each group, then over the groups, one by one
            # (as layer() adds them), as a list
            g = x[:, :, 0]
            for c in range(1, x.shape[2]):
                g = g + x[:, :, c]
            out = g[:, 0]
            for c in range(1, g.shape[1]):
                out = out + g[:, c]
            return out.tolist()

        cycles = terms[np.arange(Rn), best].tolist()
        hb_r, hb_w, tiles = seq(hb_pe), seq(wr), seq(per_pe)
        ext_l = ext.tolist()
        link_l = lb.sum(axis=1).astype(np.float64).tolist()
        bound = np.array(names)[best].tolist()
        acc = np.bincount(rj, minlength=Rn).tolist()
        hits = np.bincount(rj[kind], minlength=Rn).tolist()
        for i, lo, mid, wlo, whi, _ in segs:
            st = steps[i]

            def rows(x):
                # the step's rows of x in layer order: computed layers, then write-only ones
                return x[lo:mid] + x[wlo:whi]

            h_r, h_w, x = sum(rows(hb_r)), sum(rows(hb_w)), sum(rows(ext_l))
            hb_e, ext_e = a.access_energy_pj(h_r + h_w, x)
            cyc = sum(rows(cycles))
            out[i] = StepCost(index=st.index, kind=st.kind, tokens=len(st.tokens),
                              produced=st.produced, cycles=cyc, us=self.cycles_to_us(cyc),
                              hb_read_bytes=h_r, hb_write_bytes=h_w, ext_bytes=x,
                              link_bytes=sum(rows(link_l)), energy_pj=hb_e + ext_e,
                              hb_energy_pj=hb_e, ext_energy_pj=ext_e,
                              accesses=sum(acc[lo:mid]), hits=sum(hits[lo:mid]),
                              bounds=dict(Counter(rows(bound))),      # first-seen order
                              tile_cycles=sum(rows(tiles)), layers=[])
        return out

    def step(self, step, placements: dict) -> StepCost:
        """Cost of a :class:`~.compiler.Step` with ``placements`` = ``{layer: Placement}``."""
        a = self.arch
        layers = []
        for lay, work in step.layers.items():
            wr = [w for w in step.writes if w.key[0] == lay]
            layers.append(self.layer(work, placements[lay], phase=step.phase,
                                     step_tokens=len(step.tokens), writes=wr))
        # pool writes of layers the step does not compute (no routed token there)
        for lay in sorted({w.key[0] for w in step.writes} - set(step.layers)):
            empty = LayerWork(lay, np.zeros((0, self.model.top_k), np.int64),
                              np.zeros((0, self.model.top_k), np.float32), frozenset())
            pl = Placement(tuple({} for _ in range(a.groups)),
                           tuple(frozenset() for _ in range(a.groups)))
            layers.append(self.layer(empty, pl, phase=step.phase, step_tokens=0,
                                     writes=[w for w in step.writes if w.key[0] == lay]))
        cycles = sum(c.cycles for c in layers)
        hb_r = sum(c.hb_read_bytes for c in layers)
        hb_w = sum(c.hb_write_bytes for c in layers)
        ext = sum(c.ext_bytes for c in layers)
        hb_e, ext_e = a.access_energy_pj(hb_r + hb_w, ext)
        bounds = {}
        for c in layers:
            bounds[c.bound] = bounds.get(c.bound, 0) + 1
        return StepCost(index=step.index, kind=step.kind, tokens=len(step.tokens),
                        produced=step.produced, cycles=cycles, us=self.cycles_to_us(cycles),
                        hb_read_bytes=hb_r, hb_write_bytes=hb_w, ext_bytes=ext,
                        link_bytes=sum(c.link_bytes for c in layers),
                        energy_pj=hb_e + ext_e, hb_energy_pj=hb_e, ext_energy_pj=ext_e,
                        accesses=sum(c.accesses for c in layers),
                        hits=sum(c.hits for c in layers), bounds=bounds,
                        tile_cycles=sum(c.tile_cycles for c in layers), layers=layers)

"""Calibrated compute term of the performance model (:mod:`.perf`; issue 26 item 6; paper
Sections 5.1, 5.2 and 6): the cycles a PE spends on the experts of one layer-step, from the
PE cycle model (:func:`~.pe_cycles.program_cycles`, equal to the RTL's cycles) instead of
MACs / tile peak, so that the model's compute bound carries the pipeline fill and drain, the
SwiGLU / REQUANT / COMBINE passes, the link steps and the ld port the RTL spends cycles on.

The compiler (:func:`.parallel.compile_group`) emits one program per PE of a busy group per
layer-step: a CLEAR, then its experts one after the other in ascending id (each expert's
loads prefetched behind the one before: one fill and drain per program, not per expert),
then (verify) the OUT rows reduced into the root, OUTPUT of the step's ``T`` token rows and
STATUS. A verify splits each expert's ``rbn`` row blocks over the PEs, the extra row blocks
on PEs ``j, j+1, ...`` (mod G), ``j`` advancing by ``rbn mod G`` from expert to expert (its
*rotation*). So a PE's program cycles are, to within a few cycles (the overlap at the
expert boundaries):

    cycles_p = base_p(phase, T) + sum over the group's experts e of m_p(phase, kind_e, t_e, j_e)

with ``t_e`` the expert's tokens, ``kind_e`` HB-resident (cached) or not, ``j_e`` its
rotation (0 in a draft), and the group's compute time the largest ``cycles_p`` (each PE's
program alone: the ``ideal`` feed; the ``die`` feed runs each expert's PEs in lockstep
instead, :meth:`~.perf.PerfModel._after`). Units:
cycles of the logic-die clock, per PE (``[G]`` arrays, G = ``pes_per_group``).

Where the figures come from (:attr:`ComputeCycles.source`):

* ``"programs"``: a table of program_cycles of the compiler's own programs (seeded synthetic
  experts of the model's shape; the cycles do not depend on the values): ``m_p`` of an expert
  = cycles(prefix + expert) - cycles(prefix), the prefix G + j one-token HB-resident experts
  (so the expert starts at rotation j, after another expert as in a real program), and
  ``base_p(T)`` = cycles of a lone one-token HB-resident expert over ``T`` step tokens less
  its ``m_p``; ``ld`` at a word a cycle (the ``"ideal"`` feed: the RTL backend's pacing,
  :mod:`elmoe3d.sim.bench_host`; the HB and EXT streams are the model's separate bounds) and
  again at the HB bank's rate with the link words (SEND, RECV, the psum exchange) at the
  aggregation link's, half a word a cycle on the small PE (the ``"die"`` feed,
  :data:`FEEDS`; the RTL backend runs each PE alone with its link words delivered a word a
  cycle, the die's link moves a 64-byte word in two 32-byte flits: calibrated at a word a
  cycle, the die feed had the verify's final OUT reduction at 213 cycles at T = 16 where the
  die bench spends 368-404); and each program's tail after its last ``ld`` word when its
  stream is the bound (:meth:`ComputeCycles.tail`).
  Shipped for the ``small``
  configuration's synthetic experts (:data:`~.perf_calib_table.TABLE`, written by ``python -m
  elmoe3d.sw.host.perf_calib``; a few seconds), for every ``t`` and ``T`` the PE holds (22
  tokens at H = 64): on ``make sim``'s trace run the largest ``cycles_p`` is within 6 cycles
  of every group's program (``docs/host.md`` section 7). Tokens past the table (a batch the
  compiler would refuse) are extrapolated by whole row-block rotations (G R tokens) with the
  last such step's slope.
* ``"ffn"``: the compute calibration of the whole-decoder model
  (:func:`~.compute_calib.ffn_calibration`, the streamed group programs of
  :mod:`.stream_group`, shipped for the paper PE and every model preset's expert shape, both
  W4A8 and W8A8; its link words at the aggregation link's rate on the ``"die"`` feed, a word
  a cycle on ``"ideal"``): the compiler has no program for a paper-size expert in
  :func:`~.parallel.compile_group`'s layout, so each expert's per-PE MACs (the model's W4A8
  and W8A8 figures) are scaled by the calibration's cycles over the tile beats of the same
  expert at the same tokens (``k_bits(t) = cycles(t) / (ceil(t / R) R 3 H I / (G peak_bits))``:
  fill and drain included once per expert chunk, padding rows and channels as waste), rotated
  as the compiler rotates the token slices; ``base`` is 0 (the programs' CLEAR / OUTPUT /
  STATUS are not in the calibration; a few hundred cycles against 10^4 - 10^5 per expert).
* ``"roofline"``: neither table holds the shape (no program building on the hot path):
  MACs / peak as before, said in :attr:`ComputeCycles.note` (the perf backend prints it).

The tensor-tile beats of a step (``StepCost.tile_cycles``, the ``gemm_beats`` the compiler's
STATUS counts) stay MACs / peak.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from ...config import ArchConfig
from .compute_calib import FEEDS, SEED, die_link_rate, pe_key, table_main, write_table_module


#: This module's name for ``python -m`` (``__name__`` is ``__main__`` there).
MODULE = "elmoe3d.sw.host.perf_calib"

__all__ = ["ComputeCycles", "compute_cycles", "die_rates", "program_table",
           "group_program_cycles",
           "group_program_estimates", "FEEDS", "STARVED_LD_RATE", "program_order",
           "table_shapes", "write_table"]


def _synthetic_experts(hidden: int, intermediate: int, n: int) -> list:
    from ..golden.expert import Expert
    from .compiler import synthetic_experts
    rng = np.random.default_rng([SEED, hidden, intermediate])
    return [Expert.quantize(*w) for w in synthetic_experts(rng, n, hidden, intermediate)]


def group_program_estimates(arch: ArchConfig, hidden: int, intermediate: int, phase: str,
                            tokens: int, experts, *, ld_rate: float = 1.0,
                            link_rate: float | None = None) -> list:
    """Per-PE :func:`~.pe_cycles.program_cycles` estimates (``ld`` at ``ld_rate`` words a
    cycle, link words at ``link_rate`` (None: a word a cycle), the programs' ``ld`` words) of
    the group program :func:`.parallel.compile_group`
    emits for ``phase`` over ``tokens`` step tokens with ``experts`` = ``[(t, cached)]`` in
    program order (expert i routed tokens ``0 .. t - 1``; seeded synthetic ``hidden`` x
    ``intermediate`` weights). Raises :class:`~elmoe3d.sw.golden.asm.ProgramError` when the
    PE cannot hold it."""
    from .parallel import compile_group
    from .pe_cycles import program_cycles
    n = max(len(experts), 1)
    ids = np.full((tokens, n), -1, np.int64)
    w = np.zeros((tokens, n), np.float32)
    for i, (t, _) in enumerate(experts):
        ids[:t, i] = i
        w[:t, i] = 1.0 / n
    x = np.random.default_rng([SEED, 2, tokens]).standard_normal((tokens, hidden)) * 2.0
    job = compile_group(x, _experts(hidden, intermediate), (ids, w), phase=phase, config=arch,
                        cached=[i for i, (_, c) in enumerate(experts) if c],
                        group_experts=list(range(n)))
    return [program_cycles(job.programs[p], ld_rate=ld_rate, link_rate=link_rate, ld=job.ld[p])
            for p in range(job.pes)]


def group_program_cycles(arch: ArchConfig, hidden: int, intermediate: int, phase: str,
                         tokens: int, experts, *, ld_rate: float = 1.0,
                         link_rate: float | None = None) -> list:
    """The per-PE cycles of :func:`group_program_estimates` (ints)."""
    return [e.cycles for e in group_program_estimates(arch, hidden, intermediate, phase,
                                                      tokens, experts, ld_rate=ld_rate,
                                                      link_rate=link_rate)]


@functools.lru_cache(maxsize=None)
def _experts(hidden, intermediate):
    return tuple(_synthetic_experts(hidden, intermediate, 16))


# FEEDS (:data:`.compute_calib.FEEDS`, imported above): how the PEs' ``ld`` words arrive
# (:class:`ComputeCycles`, :class:`.perf.PerfModel`): ``"die"`` as on the logic die (an
# HB-resident slice at the HB bank's rate, link words at the aggregation link's, the streams'
# first words a DRAM read latency in, a bound stream's programs finishing after its last
# word); ``"ideal"`` a word every cycle from the first (the RTL backend's pacing,
# :mod:`elmoe3d.sim.bench_host`, which runs each PE alone with its words at hand).


def die_rates(arch: ArchConfig) -> tuple:
    """``(ld_rate, link_rate)`` of the ``"die"`` feed's program figures on ``arch``: ``ld``
    words a cycle at the HB bank's rate (at most 1) and link words at the aggregation link's
    (:func:`~.compute_calib.die_link_rate`: None when that is a word a cycle or more)."""
    return min(arch.hb_ld_words_per_cycle, 1.0), die_link_rate(arch)

#: ``ld`` words a cycle at which a verify program's
#: :attr:`~.pe_cycles.CycleEstimate.tail_cycles` are taken: well below the PE's own pace, so
#: the tail is the work that follows the last word of a stream that bounds the program (every
#: row of the shipped table the same at a quarter of this rate; a test checks).
STARVED_LD_RATE = 1 / 8


def program_table(arch: ArchConfig, hidden: int, intermediate: int, say=None) -> dict:
    """The ``"programs"`` figures (module docstring) of ``arch``'s group on ``hidden`` x
    ``intermediate`` experts, for every ``t`` and ``T`` from 1 to the most tokens the PE
    holds: ``{"pes", "rows", "tmax", "base": {phase: [[G] per T = 0 .. tmax]}, "expert":
    {phase: [[[[G] per j] per t = 0 .. tmax] per kind (0 uncached, 1 cached)]}, "die":
    {"ld_rate", "link_rate", "base", "expert"} or None, "tail": {"verify": [[[[G] per j] per
    t] per kind]}}`` (ints, cycles; the draft's uncached kind and row 0 are zeros). ``base``
    and ``expert`` at ``ld`` and link words a word a cycle (the RTL backend's pacing: it runs
    each PE alone with its link words delivered); ``die`` the same on the die: ``ld`` at the
    HB bank's rate (:attr:`~elmoe3d.config.ArchConfig.hb_ld_words_per_cycle`, at most 1) and
    SEND / RECV / psum words at the aggregation link's
    (:attr:`~elmoe3d.config.ArchConfig.link_words_per_cycle`; ``link_rate`` None when that is
    a word a cycle or more); ``die`` is None when both are; ``tail`` each PE's cycles after
    its last ``ld`` word (:attr:`~.pe_cycles.CycleEstimate.tail_cycles` at
    :data:`STARVED_LD_RATE`, link words at the die's rate) of a program ending in that
    expert, over ``t`` step tokens."""
    from ..golden.asm import ProgramError
    G, R = arch.pes_per_group, arch.tile.rows
    hb_rate, link_rate = die_rates(arch)

    @functools.lru_cache(maxsize=None)
    def est(phase, T, experts, rate, link=None):
        return group_program_estimates(arch, hidden, intermediate, phase, T, list(experts),
                                       ld_rate=rate, link_rate=link)

    def cyc(phase, T, experts, rate=1.0, link=None):
        return [e.cycles for e in est(phase, T, experts, rate, link)]

    tmax = 0
    while True:
        try:
            for ph in ("draft", "verify"):
                cyc(ph, tmax + 1, ((tmax + 1, True),))
            cyc("verify", tmax + 1, ((tmax + 1, False),))
        except ProgramError:
            break
        tmax += 1
    if tmax < 2 * G * R:
        raise ValueError(f"{arch.name}: the PE holds {tmax} tokens of {hidden} x "
                         f"{intermediate} experts, fewer than the table needs")

    def kinds(ph):
        return (0, 1) if ph == "verify" else (1,)

    def prefix(j):
        return ((1, True),) * (G + j)

    def per_expert(ph, fig):
        # [kind, t, j, PE] of fig(kind, t, j) -> [G]; a draft's rotation is always 0
        out = np.zeros((2, tmax + 1, G, G), np.int64)
        for c in kinds(ph):
            for t in range(1, tmax + 1):
                for j in (range(G) if ph == "verify" else [0]):
                    out[c, t, j] = fig(c, t, j)
                if ph == "draft":
                    out[c, t, 1:] = out[c, t, 0]
        return out

    def figures(rate, link=None):
        out = {"base": {}, "expert": {}}
        for ph in ("draft", "verify"):
            ex = per_expert(ph, lambda c, t, j: [b - a for a, b in zip(
                cyc(ph, t, prefix(j), rate, link),
                cyc(ph, t, prefix(j) + ((t, bool(c)),), rate, link))])
            base = np.zeros((tmax + 1, G), np.int64)
            for T in range(1, tmax + 1):
                base[T] = np.array(cyc(ph, T, ((1, True),), rate, link)) - ex[1, 1, 0]
            out["base"][ph] = base.tolist()
            out["expert"][ph] = ex.tolist()
            if say:
                say(f"{arch.name} {hidden}x{intermediate} {ph} (ld {rate:g}, link words "
                    f"{link or 1:g} a cycle): tmax "
                    f"{tmax}, one token {ex[1, 1, 0].tolist()} + base {base[1].tolist()}")
        return out

    out = {"pes": G, "rows": R, "tmax": tmax, **figures(1.0), "die": None}
    if hb_rate < 1 or link_rate is not None:
        out["die"] = {"ld_rate": hb_rate, "link_rate": link_rate,
                      **figures(hb_rate, link_rate)}
    # a verify's only: a draft streams nothing from EXT (its HB stream is the compute term's);
    # the die feed's only, so at the die's link rate
    out["tail"] = {"verify": per_expert("verify", lambda c, t, j: [e.tail_cycles for e in est(
        "verify", t, prefix(j) + ((t, bool(c)),), STARVED_LD_RATE, link_rate)]).tolist()}
    return out


def _extend(a: np.ndarray, n: int, step: int) -> np.ndarray:
    """``a`` (rows 0 .. tmax) extended to ``n`` rows: row ``t`` past the table = row ``t - q
    step`` (the largest in it) + ``q`` times that row's slope over one ``step``."""
    tmax = a.shape[0] - 1
    if n <= tmax + 1:
        return a[:n]
    out = np.zeros((n,) + a.shape[1:], np.float64)
    out[:tmax + 1] = a
    for t in range(tmax + 1, n):
        q = -(-(t - tmax) // step)
        t0 = t - q * step
        out[t] = a[t0] + q * (a[t0] - a[t0 - step])
    return out


class ComputeCycles:
    """The calibrated compute term (module docstring) of ``arch`` on ``model``
    (:class:`~.models.ModelPreset`): :meth:`expert` ``[G, G]`` per-PE cycles of an expert by
    rotation, :meth:`rotation`, :meth:`base` ``[G]``; :attr:`source` (``"programs"``,
    ``"ffn"`` or ``"roofline"``) and :attr:`note` (what the figures are, one line)."""

    def __init__(self, arch: ArchConfig, model, feed: str = "die"):
        if feed not in FEEDS:
            raise ValueError(f"feed: expected one of {FEEDS}, got {feed!r}")
        self.arch = arch
        self.model = model
        self.feed = feed
        self.G = arch.pes_per_group
        self.R = arch.tile.rows
        self.peak = {4: arch.tile.peak_macs_per_cycle(4), 8: arch.tile.peak_macs_per_cycle(8)}
        self.mxfp4 = model.expert_format == "mxfp4"
        H, I = model.hidden, model.expert_intermediate
        key = pe_key(arch)
        from .perf_calib_table import TABLE
        row = None if self.mxfp4 else TABLE.get((key, H, I))
        self._ffn = {}
        self._past = {}                  # base rows extrapolated past the table, by tokens
        self._tail = None
        if row is not None:
            self.source = "programs"
            self.tmax = row["tmax"]
            figs, rate = row, "a word a cycle"
            if feed == "die":
                hb, link = die_rates(arch)
                die = row["die"]
                if die is not None and (die["ld_rate"], die.get("link_rate")) == (hb, link):
                    figs, rate = die, (f"the HB bank's {hb:g} words a cycle, link words at "
                                       f"the aggregation link's {link or 1:g} a cycle")
                elif hb < 1 or link is not None:
                    rate = (f"a word a cycle: the table has no row at this HB and link rate, "
                            f"{hb:g} and {link or 1:g} words a cycle")
                # the tails are taken at the die row's link rate (program_table)
                if (die.get("link_rate") if die is not None else None) == link:
                    self._tail = {ph: np.array(v, np.float64) for ph, v in row["tail"].items()}
                else:
                    rate += "; no tails: the table's are at another link rate"
            self._base = {ph: np.array(v, np.float64) for ph, v in figs["base"].items()}
            self._ex = {ph: np.array(v, np.float64) for ph, v in figs["expert"].items()}
            self.note = (f"compute: the compiler's programs' cycles (program_cycles, shipped "
                         f"table, {H}x{I}, up to {self.tmax} tokens, ld at {rate}; more "
                         f"tokens extrapolated along a row-block rotation's slope)")
            return
        from .compute_calib import ffn_calibration, table_key
        from .compute_calib_table import TABLE as FFN
        if all(table_key(arch, H, I, b, "ideal") in FFN for b in (4, 8)):
            # a PE and shape the table holds; at a link rate it lacks (another clock or
            # aggregation link), computed with the cycle model on first use
            shipped = all(table_key(arch, H, I, b, feed) in FFN for b in (4, 8))
            self.source = "ffn"
            self._ffn = {b: ffn_calibration(arch, H, I, b, feed) for b in (4, 8)}
            link = self._ffn[4].link_rate
            self.note = (f"compute: per-expert MACs scaled by the streamed group programs' "
                         f"cycles (compute calibration, {H}x{I}, link words at "
                         f"{link or 1:g} a cycle{'' if shipped else ', computed'}); no "
                         f"per-program base")
        else:
            self.source = "roofline"
            self.note = (f"compute: MACs / peak (no calibration row for {H}x{I} on "
                         f"{key}: fill and drain not modelled)")

    def rotation(self, phase: str, cached: bool, tokens: int) -> int:
        """How far the next expert's token-slice rotation moves (``rbn mod G`` for an expert
        a verify splits by row blocks, else 0)."""
        if phase != "verify" or (cached and self.mxfp4):
            return 0
        return -(-tokens // self.R) % self.G

    def _k(self, bits: int, tokens: int) -> float:
        cal = self._ffn[bits]
        ideal = (-(-tokens // self.R) * self.R * 3 * cal.hidden * cal.intermediate
                 / (self.G * self.peak[bits]))
        return cal.cycles(tokens) / ideal

    def expert(self, phase: str, cached: bool, tokens: int, w4, w8) -> np.ndarray:
        """float ``[G, G]``: row ``j`` the cycles each PE spends on an expert of ``tokens``
        tokens (``cached``: HB-resident) started at rotation ``j``; ``w4`` / ``w8``: its
        per-PE W4A8 / W8A8 MACs at rotation 0 (the model's, :class:`.perf.ExpertCost`)."""
        G = self.G
        if self.source == "programs":
            ex = self._ex[phase]
            if tokens > self.tmax:
                ex = _extend(ex.transpose(1, 0, 2, 3), tokens + 1,
                             G * self.R).transpose(1, 0, 2, 3)
            return np.array(ex[int(bool(cached)), tokens], np.float64)
        if self.source == "ffn":
            c = (np.asarray(w4, np.float64) / self.peak[4] * self._k(4, tokens)
                 + np.asarray(w8, np.float64) / self.peak[8] * self._k(8, tokens))
        else:
            c = (np.asarray(w4, np.float64) / self.peak[4]
                 + np.asarray(w8, np.float64) / self.peak[8])
        if phase != "verify" or (cached and self.mxfp4):
            return np.tile(c, (G, 1))
        # a verify's rotation moves which PEs own the extra row blocks; rolling the whole
        # per-PE figure also rolls a cached expert's channel-slice MACs, exact only when the
        # slices are equal (every preset splits I evenly over its group but MXFP4, not rolled)
        return np.stack([np.roll(c, j) for j in range(G)])

    @property
    def has_tails(self) -> bool:
        """Whether :meth:`tail` gives other than zeros (the die feed on a program table)."""
        return self._tail is not None

    def tail(self, phase: str, cached: bool, tokens: int) -> np.ndarray:
        """float ``[G, G]``: row ``j`` each PE's cycles after its last ``ld`` word in a
        program whose last expert is this one (``tokens`` tokens, ``cached``: HB-resident,
        started at rotation ``j``; the program over ``tokens`` step tokens) when its ``ld``
        stream is the bound (:data:`STARVED_LD_RATE`). Zeros unless :attr:`feed` is
        ``"die"``, :attr:`source` ``"programs"`` and ``phase`` ``"verify"`` (a draft streams
        nothing from EXT)."""
        G = self.G
        if self._tail is None or phase not in self._tail:
            return np.zeros((G, G))
        tl = self._tail[phase]
        if tokens > self.tmax:
            tl = _extend(tl.transpose(1, 0, 2, 3), tokens + 1,
                         G * self.R).transpose(1, 0, 2, 3)
        return np.array(tl[int(bool(cached)), tokens], np.float64)

    def base(self, phase: str, tokens: int) -> np.ndarray:
        """float ``[G]``: each PE's cycles outside its experts in a program over ``tokens``
        step tokens (CLEAR, the verify's OUT reduction, OUTPUT, STATUS, the first fill);
        zeros unless :attr:`source` is ``"programs"``."""
        if self.source != "programs":
            return np.zeros(self.G)
        if tokens <= self.tmax:
            return np.array(self._base[phase][tokens], np.float64)
        key = (phase, tokens)
        if key not in self._past:
            self._past[key] = np.array(_extend(self._base[phase], tokens + 1,
                                               self.G * self.R)[tokens], np.float64)
        return self._past[key].copy()

    def cells(self, cyc, cell, order_key, n_cells: int, *, after=None,
              order=None) -> np.ndarray:
        """Per-PE cycles per cell (``[n_cells, G]``) of routed experts given as arrays:
        ``cyc`` float ``[n, G]`` each one's per-PE cycles at its rotation (:meth:`expert`'s
        row :meth:`rotations` gives), ``cell`` int ``[n]`` (the group program each belongs
        to), ``order_key`` int ``[n]`` >= 0 (program order within a cell: the expert id).
        ``after``: None sums the experts' cycles per PE; else a function ``(ready [m, G],
        cycles [m, G]) -> [m, G]`` (each PE's cycles after one more expert; e.g.
        :meth:`.perf.PerfModel._after`; a row of zero cycles must leave its ``ready`` row as
        it is), applied to every cell's experts in program order.
        ``order``: :func:`program_order` of ``cell`` and ``order_key``, when the caller has
        it."""
        G = self.G
        n = len(cell)
        if not n:
            return np.zeros((n_cells, G))
        if after is None:
            return np.bincount((cell[:, None] * G + np.arange(G)).ravel(), cyc.ravel(),
                               n_cells * G).reshape(n_cells, G)
        # the k-th expert of every cell at once, k = 0, 1, ... (a cell's experts in order),
        # over a dense [cells with experts, k, G] array: a cell with fewer experts meets
        # all-zero rows, which ``after`` must leave as they are (no PE has cycles in them)
        order = program_order(cell, order_key) if order is None else order
        c = cell[order]
        first = np.r_[True, c[1:] != c[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
        pos = np.arange(n) - start
        slot = np.cumsum(first) - 1                      # the cell's index among busy ones
        dense = np.zeros((int(slot[-1]) + 1, int(pos.max()) + 1, G))
        dense[slot, pos] = cyc[order]
        ready = np.zeros((len(dense), G))
        for k in range(dense.shape[1]):
            ready = after(ready, dense[:, k])
        out = np.zeros((n_cells, G))
        out[c[first]] = ready
        return out

    def rotations(self, rot, cell, order_key, *, order=None) -> tuple:
        """``(j, last)`` of routed experts given as arrays (:meth:`cells`; ``rot`` int
        ``[n]``, each one's :meth:`rotation`): ``j`` int ``[n]`` the rotation each starts at
        (the sum of ``rot`` over the experts before it in its cell, mod G), ``last`` bool
        ``[n]`` whether it is its cell's last in program order."""
        n = len(cell)
        order = program_order(cell, order_key) if order is None else order
        r = rot[order]
        cs = np.cumsum(r)
        c = cell[order]
        first = np.r_[True, c[1:] != c[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(n), 0))
        before = cs - r - (cs[start] - r[start])
        j = np.empty(n, np.int64)
        j[order] = before % self.G
        last = np.empty(n, bool)
        last[order] = np.r_[c[1:] != c[:-1], True]
        return j, last


def program_order(cell, order_key) -> np.ndarray:
    """int64 ``[n]``: the indices of routed experts (``cell``, ``order_key``: int ``[n]``,
    both >= 0) in program order, by cell and then by ``order_key`` within a cell (as
    ``np.lexsort((order_key, cell))``; one stable sort of a combined key, about 5x faster on
    the perf model's 10^4-expert chunks)."""
    cell = np.asarray(cell, np.int64)
    order_key = np.asarray(order_key, np.int64)
    if not len(cell):
        return np.zeros(0, np.int64)
    return np.argsort(cell * (int(order_key.max()) + 1) + order_key, kind="stable")


@functools.lru_cache(maxsize=None)
def _cached(arch, model, feed):
    return ComputeCycles(arch, model, feed)


def compute_cycles(arch: ArchConfig, model, feed: str = "die") -> ComputeCycles:
    """The :class:`ComputeCycles` of ``arch`` on ``model`` at ``feed`` (:data:`FEEDS`; kept:
    the tables are read once)."""
    try:
        return _cached(arch, model, feed)
    except TypeError:                                   # an unhashable configuration
        return ComputeCycles(arch, model, feed)


# == the shipped table ==========================================================================

def table_shapes() -> list:
    """``(config, hidden, intermediate)`` of the shipped table: the ``small`` configuration's
    synthetic experts (:data:`~.compiler.SYNTHETIC_SHAPE`, what every small run uses)."""
    from .compiler import SYNTHETIC_SHAPE
    return [("small",) + tuple(SYNTHETIC_SHAPE)]


def write_table(path=None, say=print) -> dict:
    """Compute every :func:`table_shapes` row (:func:`program_table`) and write
    ``perf_calib_table.py`` (default: beside this module). Returns the table."""
    from pathlib import Path
    from ...config import preset
    table = {}
    for name, h, i in table_shapes():
        arch = preset(name)
        table[(pe_key(arch), h, i)] = program_table(arch, h, i, say=say)
    write_table_module(path or Path(__file__).with_name("perf_calib_table.py"), table,
                       "The shipped program table of the perf model's compute term", MODULE,
                       "(pe_key, hidden, intermediate)")
    return table


def main(argv=None) -> int:
    return table_main(argv, MODULE, "perf_calib_table.py", write_table)


if __name__ == "__main__":
    sys.exit(main())

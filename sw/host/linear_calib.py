"""Compute calibration of the whole-decoder model's plain GEMMs (:mod:`.paper_eval`; issue 26
item 6): the MACs per cycle one PE reaches on a linear layer (the attention projections, the
router, the scores and weighted sums over the KV cache, the LM head, the dense draft models)
of a given K, output channels and token rows, from the PE cycle model
(:func:`~.pe_cycles.program_cycles`, equal to the RTL's cycles on the live tests) run on the
streamed linear-layer program
(:func:`~elmoe3d.sw.golden.linear_stream.build_streamed_linear_program`).
:mod:`.compute_calib` does the same for the SwiGLU FFNs on a PE group.

What it computes: :func:`linear_calibration` gives a :class:`LinearCalibration` of one PE of an
:class:`~elmoe3d.config.ArchConfig` at K in-features and 4 (DRAFT, W4A8) or 8 (FULL, W8A8)
bits, whose :meth:`~LinearCalibration.cycles` and :meth:`~LinearCalibration.utilisation` take
any output channels a PE (``N_p``: a layer splits its output channels over the die's PEs,
nothing to reduce) and token rows. The program streams every weight once per token tile of
``R`` rows (16 on the paper PE) and emits OUT chunks of ``out_chunk`` channels one after the
other, so its cycles are linear in the chunks; the calibration runs the program at one and two
chunks for 1 .. R and 2R rows and checks three chunks at R + 1 and 3R rows (``fit_error``, 0
cycles on every entry of the shipped table). ``ld`` at a word a cycle (the compute-bound
figure; the HB and EXT times are the model's own bounds); no link.

On the paper PE (32 KB WMEM, 32 KB IOMEM, ``PAPER_IOMEM_SPLIT``: 14 ACT words) x stays in ACT
for K up to 448 and streams above that, once per column block; OUT holds 64 channels of a
16-row tile (Q.24), so OUTPUT runs raw (the FP32 conversion of the Q.24 words is the host's,
bit for bit the PE's). Its utilisation at 1 / 16 rows and 256 channels a PE: K = 2048, W4A8
2.4% / 37.5%, W8A8 3.4% / 54.4%; K = 128, 0.7% / 11.7% and 1.4% / 21.5% (the OUTPUT of each
64-channel chunk, not the GEMM, is the bound at small K).

Cheap at run time: the paper PE's figures for every K :mod:`.paper_eval` asks for on Table 3's
models ship in :data:`~.linear_calib_table.TABLE` (``python -m elmoe3d.sw.host.linear_calib``,
about a minute); any other (PE, K, bits) is computed on first use and kept (about a second a K
up to 4,096 on the paper PE, 25 s at K = 100,000; longer on a PE whose OUT chunk holds
several OUTPUT steps, each partial chunk size being timed too).
tests/host/test_linear_calib.py recomputes shipped entries.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np

from ...config import ArchConfig
from ...errors import UserError
from ...machine import usable_cpus
from .compute_calib import (SEED, Unmeasured, memo_calibration, pe_key, table_main,
                            write_table_module)


#: This module's name for ``python -m``.
MODULE = "elmoe3d.sw.host.linear_calib"

__all__ = ["LinearCalibration", "linear_calibration", "calibrate_linear", "linear_cycles",
           "plan_linear",
           "table_key", "table_in_features", "write_table"]

#: Calibrations in use, by :func:`table_key`.
_CACHE: dict = {}


def table_key(arch: ArchConfig, in_features: int, bits: int) -> tuple:
    """``(pe_key, in_features, bits)``: the shipped table's key of a calibration of ``arch``."""
    return pe_key(arch), int(in_features), int(bits)


def linear_cycles(arch: ArchConfig, in_features: int, out_features: int, bits: int,
                  tokens: int) -> int:
    """Cycles of one PE of ``arch`` running the linear layer ``[out_features, in_features]``
    over ``tokens`` rows (synthetic weights and x, seed :data:`SEED`) in DRAFT (``bits`` 4)
    or FULL (8): :func:`~.pe_cycles.program_cycles` of
    :func:`~elmoe3d.sw.golden.linear_stream.build_streamed_linear_program`'s program, ``ld``
    at a word a cycle, with its ``ld`` words (no link: a layer split over PEs by output
    channels reduces nothing)."""
    from ..golden.datapath import Mode
    from ..golden.linear_stream import build_streamed_linear_program
    from .pe_cycles import program_cycles
    if bits not in (4, 8):
        raise ValueError(f"bits: expected 4 (DRAFT) or 8 (FULL), got {bits!r}")
    rng = np.random.default_rng([SEED, in_features, out_features, tokens])
    x = rng.standard_normal((tokens, in_features))
    w = rng.standard_normal((out_features, in_features)) * 0.05
    job = build_streamed_linear_program(x, w, Mode.DRAFT if bits == 4 else Mode.FULL, arch)
    return program_cycles(job.program, ld_rate=1.0, ld=job.ld).cycles


@dataclass(frozen=True)
class LinearCalibration:
    """Cycles of one PE on a linear layer of ``in_features`` (K) at ``bits``, for any output
    channels a PE (``N_p``) and token rows (:func:`linear_calibration`). The program's OUT
    chunks (``out_chunk`` channels each, whole ``step``-channel OUTPUT steps; the layer's
    channels padded to whole steps) run one after the other, every token tile streaming every
    weight again, so its cycles are linear in the whole chunks: ``tile1[r - 1]`` /
    ``tile2[r - 1]`` the cycles of one tile of ``r`` rows over one / two whole chunks,
    ``period1`` / ``period2`` what each further full tile adds; ``partial[j - 1]``, for ``j = 1
    .. out_chunk / step - 1`` (none on the paper PE, whose chunk is one step), ``(tile, period,
    tile_after, period_after)``: the same for a lone chunk of ``j`` steps and for one whole
    chunk followed by it (a narrower chunk packs its column blocks into other buffer-fulls).
    ``c`` whole chunks and a last chunk of ``j`` steps cost a tile ``tile1 + (c - 1) (tile2 -
    tile1)`` plus, for ``j > 0``, ``tile_after - tile1`` (``c = 0``: ``tile``).
    ``fit_error``: the largest difference (cycles) of that form from
    :func:`linear_cycles` at the checked points (three whole chunks; a whole and a partial one;
    ``R + 1`` and ``3R`` rows; None: not checked). ``peak``: the PE's peak MACs a cycle at
    ``bits``."""

    key: str
    in_features: int
    bits: int
    out_chunk: int
    step: int
    peak: int
    tile1: tuple
    tile2: tuple
    period1: int
    period2: int
    partial: tuple = ()
    fit_error: int | None = None

    def cycles(self, out_features: float, rows: float) -> int:
        """Cycles of one PE on ``out_features`` output channels (``N_p`` > 0; a fractional
        share of a layer is rounded up to whole steps, the slowest PE's) over ``rows`` token
        rows (> 0; fewer than 1 count as 1, fractional rows linear between the integer
        neighbours). Raises ValueError naming the parameter on a value that is not a finite
        positive number."""
        n, r = _positive("out_features", out_features), max(_positive("rows", rows), 1.0)
        steps = max(math.ceil(n / self.step), 1)
        c, j = divmod(steps, self.out_chunk // self.step)
        lo = int(math.floor(r))
        v = self._cycles_int(c, j, lo)
        if r > lo:
            v += (r - lo) * (self._cycles_int(c, j, lo + 1) - v)
        return v

    def _cycles_int(self, c: int, j: int, t: int) -> int:
        R = len(self.tile1)
        tiles = -(-t // R)
        i = t - R * (tiles - 1) - 1
        if c == 0:
            tile, period = self.partial[j - 1][:2]
            return (tiles - 1) * period + tile[i]
        d_tile, d_period = self.tile2[i] - self.tile1[i], self.period2 - self.period1
        tile, period = self.tile1[i] + (c - 1) * d_tile, self.period1 + (c - 1) * d_period
        if j:
            a_tile, a_period = self.partial[j - 1][2:]
            tile, period = tile + a_tile[i] - self.tile1[i], period + a_period - self.period1
        return (tiles - 1) * period + tile

    def utilisation(self, out_features: float, rows: float) -> float:
        """Useful MACs (``K N_p rows``) a cycle over the PE's peak at ``bits``; errors as
        :meth:`cycles`."""
        n, r = _positive("out_features", out_features), max(_positive("rows", rows), 1.0)
        return self.in_features * n * r / self.cycles(n, r) / self.peak


def _positive(name: str, v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a positive number, got {v!r}") from None
    if not math.isfinite(f) or f <= 0:
        raise ValueError(f"{name}: expected a finite positive number, got {v!r}")
    return f


def plan_linear(arch: ArchConfig, in_features: int) -> tuple:
    """``(step, out_chunk)`` of the streamed linear program of K = ``in_features`` on a PE of
    ``arch``: the channels of one OUTPUT step and of one OUT chunk
    (:func:`~elmoe3d.sw.golden.linear_stream.plan_linear_stream`, milliseconds). Raises
    ProgramError on a K the PE cannot stage."""
    from ..golden.linear_stream import plan_linear_stream
    return (plan_linear_stream(in_features, 1, arch).out_padded,
            plan_linear_stream(in_features, 1 << 20, arch).out_chunk)


def calibrate_linear(arch: ArchConfig, in_features: int, bits: int, *,
                     check: bool = True) -> LinearCalibration:
    """A :class:`LinearCalibration` computed with :func:`linear_cycles`: ``2 (R + 1)`` programs
    (one and two whole OUT chunks at ``r = 1 .. R`` and ``2R`` rows) and ``2 (R + 1)`` for each
    partial chunk size (alone, and after a whole chunk); with ``check`` more at ``R + 1`` and
    ``3R`` rows (one and three whole chunks; where a chunk holds more than one step, three
    whole chunks and a one-step chunk, and a lone chunk one step short) for ``fit_error``.
    Raises ProgramError as :func:`~elmoe3d.sw.golden.linear_stream.plan_linear_stream` on a K
    the PE cannot stage."""
    R = arch.tile.rows
    step, oc = plan_linear(arch, in_features)
    spc = oc // step

    def run(chunks, t, j=0):
        return linear_cycles(arch, in_features, chunks * oc + j * step, bits, t)

    def form(c, j):
        tile = tuple(run(c, r, j) for r in range(1, R + 1))
        return tile, run(c, 2 * R, j) - tile[-1]

    tile1 = tuple(run(1, r) for r in range(1, R + 1))
    tile2 = tuple(run(2, r) for r in range(1, R + 1))
    cal = LinearCalibration(pe_key(arch), in_features, bits, oc, step,
                            arch.tile.peak_macs_per_cycle(bits), tile1, tile2,
                            run(1, 2 * R) - tile1[-1], run(2, 2 * R) - tile2[-1],
                            tuple(form(0, j) + form(1, j) for j in range(1, spc)))
    if check:
        points = [(c, 0) for c in (1, 3)] + ([(3, 1), (0, spc - 1)] if spc > 1 else [])
        err = max(abs(run(c, t, j) - cal._cycles_int(c, j, t))
                  for c, j in points for t in (R + 1, 3 * R))
        cal = LinearCalibration(**{**cal.__dict__, "fit_error": int(err)})
    return cal


#: The largest K whose calibration the notice calls "seconds" (paper-4gb, one core, 2026-12-06:
#: 3.5 s at K = 16,384 and 17.4 s at 65,536 a bit width; a new user's K = 200,000 took 152 s
#: for both).
SECONDS_K = 32768


def linear_calibration(arch: ArchConfig, in_features: int, bits: int) -> LinearCalibration:
    """The :class:`LinearCalibration` of a linear layer of ``in_features`` on one PE of
    ``arch`` at ``bits`` (4: DRAFT / W4A8, 8: FULL / W8A8): from the shipped table
    (:data:`~.linear_calib_table.TABLE`) when it holds the key, else computed on first use
    (seconds; a minute or more above K = :data:`SECONDS_K`) and kept, in this process and on
    disk (:func:`~.compute_calib.memo_calibration`). Raises ValueError on another ``bits``,
    :class:`UserError` naming K and the PE on a K the PE cannot stage."""
    if bits not in (4, 8):
        raise ValueError(f"bits: expected 4 or 8, got {bits!r}")
    k = table_key(arch, in_features, bits)
    c = _CACHE.get(k)
    if c is None:
        from ..golden.asm import ProgramError
        from .linear_calib_table import TABLE
        e = TABLE.get(k)
        try:
            c = (memo_calibration("linear", k, lambda: calibrate_linear(
                     arch, in_features, bits, check=False), LinearCalibration,
                     f"a linear layer of K = {in_features} at W{bits}A8",
                     "seconds" if in_features <= SECONDS_K else "a minute or more: it grows "
                     "with K", plan=lambda: plan_linear(arch, in_features))
                 if e is None
                 else LinearCalibration(k[0], int(in_features), int(bits), **e))
        except ProgramError as err:
            raise UserError(f"compute calibration: a linear layer of K = {in_features} does "
                            f"not fit one PE of this configuration ({k[0]}): {err}") from None
        if not isinstance(c, Unmeasured):
            _CACHE[k] = c
    return c


# == the shipped table ============================================================================

def table_in_features() -> list:
    """Every K (padded to whole groups of 32) :mod:`.paper_eval` asks a linear calibration for
    on the models it runs, at its default context (:data:`~.decoder.CONTEXT`): the
    attention projections, the router and LM head (K = hidden), the scores and weighted sums
    over the KV cache (K = head size, compressed-KV size, the mean cached tokens a layer), the
    EAGLE-3 heads and the SLM draft."""
    from .decoder import CONTEXT, DECODER_SHAPES, DRAFT_MODELS, eagle_head
    ks = set()
    for sh in DECODER_SHAPES.values():
        ks.add(sh.model.hidden)
        ks.update(k for _, k, _ in sh.attention_linears)
        ctx = sh.kv_tokens(CONTEXT) // sh.model.layers
        ks.update(k for _, k, _, _, _ in sh.attention_gemms(ctx))
        for d in [eagle_head(sh)] + list(DRAFT_MODELS.values()):
            ks.update(k for _, k, _, _ in d.linears)
            ks.update(k for _, k, _, _, _ in d.attention_gemms(CONTEXT))
    return sorted({-(-k // 32) * 32 for k in ks})


def _entry(job):
    an, k, bits = job
    from ...config import preset
    return calibrate_linear(preset(an), k, bits)


def write_table(path=None, arch_names=("paper-4gb",), say=print, jobs: int = 1) -> dict:
    """Compute every :func:`table_in_features` x bits (4, 8) entry on ``arch_names`` (whose
    :func:`~.compute_calib.pe_key` the paper-8gb preset shares), ``jobs`` processes at a time,
    and write ``linear_calib_table.py`` (default: beside this module). Returns the table."""
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path
    from ...config import preset
    todo = [(an, k, bits) for an in arch_names for k in table_in_features() for bits in (4, 8)]
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        done = list(pool.map(_entry, todo))
    table = {}
    for (an, k, bits), c in zip(todo, done):
        key = table_key(preset(an), k, bits)
        table[key] = {"out_chunk": c.out_chunk, "step": c.step, "peak": c.peak,
                      "tile1": c.tile1, "tile2": c.tile2, "period1": c.period1,
                      "period2": c.period2, "partial": c.partial, "fit_error": c.fit_error}
        say(f"{an} K={k} W{bits}A8: out chunk {c.out_chunk}, 1 / 16 rows at 256 channels a PE "
            f"{c.utilisation(256, 1):.1%} / {c.utilisation(256, 16):.1%}, fit error "
            f"{c.fit_error}")
    write_table_module(path or Path(__file__).with_name("linear_calib_table.py"), table,
                       "The shipped linear-layer calibration of the paper PE", MODULE,
                       "(pe_key, in_features, bits)")
    return table


def main(argv=None) -> int:
    return table_main(argv, MODULE, "linear_calib_table.py",
                      lambda out, say: write_table(out, say=say, jobs=usable_cpus()))


if __name__ == "__main__":
    sys.exit(main())

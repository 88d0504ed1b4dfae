"""Compute calibration of the whole-decoder model (:mod:`.paper_eval`; issue 26 item 6): the
MACs per cycle a PE group reaches on a SwiGLU FFN of a given shape and token-row count, from
the PE cycle model (:func:`~.pe_cycles.group_cycles`: every PE of a group joined by the
aggregation link, equal to the RTL's cycles on the live tests) run on the programs the
compiler emits (:func:`~.stream_group.compile_expert_group`).

What it computes. For an FFN of ``hidden`` x ``intermediate`` (``H`` x ``I``; up, gate and
down: ``3 H I`` MACs a token row) on an :class:`~elmoe3d.config.ArchConfig` (its PE, tile and
IOMEM split, and ``G = pes_per_group``), :func:`ffn_calibration` gives an
:class:`FFNCalibration` with:

* ``chunks`` x ``chunk_intermediate``: the FFN cut into ``n`` equal intermediate chunks (each a
  multiple of 32 channels), ``n`` the smallest that one group holds (:func:`ffn_chunks`,
  :func:`~.stream_group.plan_group`); a SwiGLU FFN is the sum of its intermediate chunks, so
  each chunk is an expert the compiler can emit. On the paper PE (``paper-4gb`` /
  ``paper-8gb``: 16x32x32 tile, 32 KB WMEM and IOMEM, ``PAPER_IOMEM_SPLIT``, 4-PE groups) a
  group holds up to 1,536 channels at H = 2048 or 2880: Qwen3-30B-A3B's, OLMoE's,
  GLM-4.7-Flash's and DeepSeek-V2-Lite's experts are one chunk, GPT-OSS-20B's 2880 two of 1,440,
  DeepSeek-V2-Lite's shared 2816 two of 1,408, the dense FFNs (10,240, 10,944) seven of 1,472
  and eight of 1,376;
* ``tile[r - 1]``: the cycles of the group's root PE (the slowest: it reduces, COMBINEs and
  OUTPUTs) running one chunk over ``r`` token rows, ``r = 1 .. R`` (``R`` = ``tile.rows``, one
  token tile), from :func:`~.pe_cycles.group_cycles` (first command to last ``o`` beat: fill
  and drain included) with the programs' ``ld`` words (the COMBINE sink's zero-gate skip of
  padding rows) and ``ld`` at ``ld_rate`` = 1 word a cycle: the compute-bound figure, the ld
  port never waiting for its source (the HB or EXT time is the model's separate bound); the
  group's link words (the row-max all-reduce, the psum REDUCE_ADDs) at the aggregation link's
  rate on the ``"die"`` feed (:func:`die_link_rate`: 1/16 word a cycle on the paper PE, where
  the link is the larger part of the root's cycles), a word a cycle on ``"ideal"``
  (:data:`FEEDS`);
* ``period``: the cycles one more full token tile adds (``cycles(2R) - cycles(R)``): the
  streamed program runs its token tiles one after the other, each streaming every weight
  again, so ``cycles(T) = (ceil(T / R) - 1) x period + tile[T - R (ceil(T / R) - 1) - 1]``
  per chunk. The generator (:func:`calibrate`) checks this at ``T = R + 1`` and ``T = 3R``
  against group_cycles (``fit_error``, cycles; 0 on every shape of the shipped table);
* ``bits``: 4 = DRAFT (W4A8: MSB planes only, Table 1's peak ``rows x lanes x group`` MACs a
  cycle a PE), 8 = FULL (W8A8 as LSB_ONLY + MSB_ONLY beats, half that peak).

:meth:`FFNCalibration.cycles` (rows may be fractional: a routed expert's mean rows; linear
between the integer neighbours), :meth:`~FFNCalibration.macs_per_cycle` (useful MACs, ``3 H I
rows``, a cycle of one PE: the group's over ``G``) and :meth:`~FFNCalibration.utilisation`
(that over the PE's peak at ``bits``; padding channels and padding rows are waste, as they are
on the die). Units: cycles of the logic-die clock; MACs.

Cheap at run time: the figures of the paper PE for every FFN shape of Table 3's models (and
OLMoE-1B-7B's, the tests' second shape) ship in :data:`~.compute_calib_table.TABLE`, written by
``python -m elmoe3d.sw.host.compute_calib`` (:func:`write_table`, both feeds; about 26
minutes on two cores); any other (PE, shape, bits, link rate) is computed on first use with
group_cycles (seconds to minutes a shape) and kept for the process and on disk under the
build root's ``calib/`` (:func:`memo_calibration`): there is no constant fallback.
tests/host/test_compute_calib.py recomputes shipped entries against group_cycles.

Not modelled here: load imbalance between groups (the model spreads a stage's MACs over every
PE), the host link. The plain GEMMs (attention projections, router, LM head, the dense draft
models) run their own program on one PE each: :mod:`.linear_calib`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ...config import ArchConfig
from ...errors import UserError
from ...machine import usable_cpus


#: This module's name for ``python -m`` (``__name__`` is ``__main__`` there).
MODULE = "elmoe3d.sw.host.compute_calib"

__all__ = ["FFNCalibration", "ffn_calibration", "ffn_chunks", "pe_key", "program_root_cycles",
           "calibrate", "die_link_rate", "table_key", "table_shapes", "write_table", "FEEDS",
           "SEED", "calibrations_needed", "Unmeasured"]

#: Seed of the synthetic weights and activations (values do not change the cycles; the gate
#: weights are non-zero, so only padding rows take the COMBINE sink's zero-gate skip).
SEED = 26


#: How a group's link words move in a calibration (``feed`` of :func:`ffn_calibration`;
#: :data:`.perf_calib.FEEDS` names the same two, for its own pacing): ``"die"`` at the
#: aggregation link's rate (:func:`die_link_rate`), ``"ideal"`` a word a cycle (the group's
#: link at one flit a word: :func:`~.pe_cycles.group_cycles` with its descriptors, tree and
#: FIFOs). ``ld`` is a word a cycle in both: the HB and EXT times are the models' own bounds.
FEEDS = ("die", "ideal")


def die_link_rate(arch: ArchConfig) -> float | None:
    """Link words a cycle of ``arch``'s group programs on the die: the aggregation link's
    (:attr:`~elmoe3d.config.ArchConfig.link_words_per_cycle`: 0.5 on the small PE, 0.0625 on
    the paper PE, a 512 B word in sixteen 32 B flits), None when that is a word a cycle or
    more (:func:`~.pe_cycles.program_cycles`' default)."""
    link = arch.link_words_per_cycle
    return link if link < 1 else None


def pe_key(arch: ArchConfig) -> str:
    """The PE figures a calibration depends on, as a string: the tile, WMEM and IOMEM bytes,
    the IOMEM split and the group size (the PE count and HB do not change a group's cycles;
    the clock and the aggregation link do through the link rate, :func:`table_key`'s last
    field)."""
    t = arch.tile
    return (f"tile {t.rows}x{t.lanes}x{t.group}, wmem {arch.wmem_bytes}, iomem "
            f"{arch.iomem_bytes} {tuple(arch.iomem_split)}, group {arch.pes_per_group}")


def ffn_chunks(hidden: int, intermediate: int, arch: ArchConfig) -> tuple:
    """``(n, chunk_intermediate)``: the fewest equal intermediate chunks (multiples of 32
    channels) of an ``hidden`` x ``intermediate`` SwiGLU FFN one group of ``arch`` holds;
    raises :class:`UserError` if not even 32 channels fit."""
    return _chunks(hidden, intermediate, arch.pe, arch.pes_per_group)


@functools.lru_cache(maxsize=None)
def _chunks(hidden, intermediate, pe, G):
    from ..golden.asm import ProgramError
    from .stream_group import plan_group
    for n in range(1, intermediate // 32 + 1):
        ic = -(-intermediate // n)
        ic = -(-ic // 32) * 32
        try:
            plan_group(hidden, ic, pe, G)
        except ProgramError:
            continue
        return n, ic
    raise UserError(f"compute calibration: no intermediate chunk of an FFN of {hidden} x "
                    f"{intermediate} fits a group of {G} PEs of this configuration")


def program_root_cycles(arch: ArchConfig, hidden: int, intermediate: int, bits: int,
                        tokens: int, *, link_rate: float | None = None) -> int:
    """Cycles of the slowest PE (the root) of ``arch``'s group running one expert of
    ``hidden`` x ``intermediate`` over ``tokens`` rows (synthetic weights, seed :data:`SEED`)
    in DRAFT (``bits`` 4) or FULL (8): :func:`~.pe_cycles.group_cycles` of the group's
    programs from :func:`~.stream_group.compile_expert_group` (each PE's link words as the
    aggregation link moves them: the row-max all-reduce, the members' psums into the root's
    REDUCE_ADD, ``link_rate`` words a cycle, None: a word a cycle), ``ld`` at a word a cycle,
    with the programs' ``ld`` words."""
    from ..golden.datapath import Mode
    from .pe_cycles import group_cycles
    from .shape_sweep import synthetic_expert
    from .stream_group import compile_expert_group
    if bits not in (4, 8):
        raise ValueError(f"bits: expected 4 (DRAFT) or 8 (FULL), got {bits!r}")
    x, ex, gw = synthetic_expert(hidden, intermediate, tokens, [SEED, hidden, intermediate])
    job = compile_expert_group(x, ex, gw, Mode.DRAFT if bits == 4 else Mode.FULL, arch)
    return max(e.cycles for e in group_cycles(job, ld_rate=1.0, link_rate=link_rate))


@dataclass(frozen=True)
class FFNCalibration:
    """Cycles of one PE group on an FFN (module docstring): ``tile[r - 1]`` the root's cycles
    on one token tile of ``r`` rows, ``period`` the cycles of each further full tile, per
    chunk; ``peak``: the PE's peak MACs a cycle at ``bits``; ``fit_error``: the largest
    difference (cycles) of the tile form from group_cycles at the checked row counts (None:
    not checked); ``link_rate``: the link words a cycle it was taken at (None: a word a
    cycle, the ``"ideal"`` feed)."""

    key: str
    hidden: int
    intermediate: int
    bits: int
    chunks: int
    chunk_intermediate: int
    pes: int
    peak: int
    tile: tuple
    period: int
    fit_error: int | None = None
    link_rate: float | None = None

    @property
    def rows_per_tile(self) -> int:
        return len(self.tile)

    def _cycles_int(self, t: int) -> int:
        R = len(self.tile)
        tiles = -(-t // R)
        return self.chunks * ((tiles - 1) * self.period + self.tile[t - R * (tiles - 1) - 1])

    def cycles(self, rows: float) -> float:
        """The group's cycles on ``rows`` token rows (at least 1; fractional rows linear
        between the integer neighbours), every chunk in turn."""
        r = max(float(rows), 1.0)
        lo = int(math.floor(r))
        c = self._cycles_int(lo)
        if r > lo:
            c += (r - lo) * (self._cycles_int(lo + 1) - c)
        return c

    def macs_per_cycle(self, rows: float) -> float:
        """Useful MACs (``3 H I rows``) a cycle of one PE of the group."""
        r = max(float(rows), 1.0)
        return 3 * self.hidden * self.intermediate * r / (self.pes * self.cycles(r))

    def utilisation(self, rows: float) -> float:
        """:meth:`macs_per_cycle` over the PE's peak at ``bits``."""
        return self.macs_per_cycle(rows) / self.peak


def calibrate(arch: ArchConfig, hidden: int, intermediate: int, bits: int, *,
              check: bool = True, link_rate: float | None = None) -> FFNCalibration:
    """An :class:`FFNCalibration` computed with group_cycles (link words at ``link_rate``
    words a cycle, None: a word a cycle): ``R + 1`` compiles (``r = 1 .. R`` and ``2R``), and
    with ``check`` two more (``R + 1`` and ``3R``) for ``fit_error``."""
    n, ic = ffn_chunks(hidden, intermediate, arch)
    R = arch.tile.rows

    def root(t):
        return program_root_cycles(arch, hidden, ic, bits, t, link_rate=link_rate)

    tile = tuple(root(r) for r in range(1, R + 1))
    period = root(2 * R) - tile[-1]
    cal = FFNCalibration(pe_key(arch), hidden, intermediate, bits, n, ic, arch.pes_per_group,
                         arch.tile.peak_macs_per_cycle(bits), tile, period,
                         link_rate=link_rate)
    if check:
        err = 0
        for t in (R + 1, 3 * R):
            got = root(t)
            err = max(err, abs(got - cal._cycles_int(t) // n))
        cal = FFNCalibration(**{**cal.__dict__, "fit_error": err})
    return cal


#: Calibrations in use, by :func:`table_key`: the shipped table's entries read, the others
#: computed (:func:`ffn_calibration`).
_CACHE: dict = {}


def table_key(arch: ArchConfig, hidden: int, intermediate: int, bits: int,
              feed: str = "die") -> tuple:
    """``(pe_key, hidden, intermediate, bits, link_rate)``: the shipped table's key of a
    calibration of ``arch`` (``link_rate`` :func:`die_link_rate` on the ``"die"`` feed, None
    on ``"ideal"``)."""
    if feed not in FEEDS:
        raise ValueError(f"feed: expected one of {FEEDS}, got {feed!r}")
    if bits not in (4, 8):
        raise ValueError(f"bits: expected 4 or 8, got {bits!r}")
    link = die_link_rate(arch) if feed == "die" else None
    return pe_key(arch), int(hidden), int(intermediate), int(bits), link


def _tuples(v):
    """JSON lists back to the tuples a calibration holds (nested: LinearCalibration.partial)."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


#: The folder :func:`calib_root_at` put in place of the build root's, in this thread or task
#: (a context variable: a Dask worker's threads each run their own point).
_CALIB_ROOT: contextvars.ContextVar = contextvars.ContextVar("calib_root", default=None)


def calib_root():
    """Where :func:`memo_calibration` keeps its files: the innermost :func:`calib_root_at`
    folder of this thread (a sweep's shared cache), else ``calib/`` in the build root
    (:func:`~elmoe3d.paths.build_root`)."""
    from ...paths import build_root
    folder = _CALIB_ROOT.get()
    return Path(folder) if folder is not None else build_root() / "calib"


@contextlib.contextmanager
def calib_root_at(folder):
    """Keep the calibrations made inside the ``with`` (in this thread) in ``folder`` (a sweep's
    workers: the cache they share, ``docs/sweep.md`` "Caches")."""
    token = _CALIB_ROOT.set(folder)
    try:
        yield
    finally:
        _CALIB_ROOT.reset(token)


#: The record of :func:`calibrations_needed` in force in this thread or task, or None.
_NEEDED: contextvars.ContextVar = contextvars.ContextVar("calibrations_needed", default=None)


class Unmeasured:
    """What a calibration no shipped table or kept file holds is, inside
    :func:`calibrations_needed`: nothing is computed, and its :meth:`utilisation` is 1 (the
    peak), a stand-in whose figures mean nothing. Never kept in a calibration cache."""

    def utilisation(self, *rows) -> float:
        return 1.0

    def __getattr__(self, name):
        raise AttributeError(f"{name}: a calibration calibrations_needed() did not compute "
                             f"has only utilisation() (the paper_eval model's use; the "
                             f"trace-driven perf model reads more)")


@contextlib.contextmanager
def calibrations_needed():
    """Inside the ``with`` (in this thread), a compute calibration that neither a shipped table
    nor a file kept under :func:`calib_root` holds is not computed: the ``with``'s dict gets
    ``(kind, key) -> (notice, takes)`` (``kind`` ``"ffn"`` or ``"linear"``, ``key`` the table
    key, what :func:`memo_calibration` would say before computing it and how long it would
    take), and the caller an :class:`Unmeasured` in its place. What ``elmoe3d sweep --check``
    runs each perf point under, to say which points will compute a calibration (seconds to
    minutes each) before any does."""
    found: dict = {}
    token = _NEEDED.set(found)
    try:
        yield found
    finally:
        _NEEDED.reset(token)


#: The modules that compute a calibration (:func:`memo_calibration`): the sources of what
#: they can import (:func:`~elmoe3d.sim.runner.import_closure`: the PE and group cycle models,
#: the golden programs, the configuration and the ISA, not the commands, the RTL or the plots)
#: key the calibrations kept on disk.
CALIBRATION_MODULES = ("elmoe3d.sw.host.compute_calib", "elmoe3d.sw.host.linear_calib")


def memo_calibration(kind: str, key: tuple, compute, cls, notice: str | None = None,
                     takes: str = "about a minute or more", plan=None):
    """A calibration (``cls``, a dataclass) of a shape no shipped table holds, made once on
    this machine: ``compute()`` on the first call, its fields kept as JSON under
    :func:`calib_root` (:func:`~elmoe3d.paths.memo_text`), keyed by ``kind``, ``key`` (the table
    key: the PE, the shape, the precision, the link rate), the NumPy and Amaranth versions and
    the sources of the modules :data:`CALIBRATION_MODULES` can run
    (:func:`~elmoe3d.sim.runner.closure_digest`: an edit of one of them makes it again, of
    any other module not; old files stay until removed);
    later processes (a sweep's workers, the next run) read the file. A folder that cannot be
    written costs a recomputation, a damaged file is made again, never an error; an exception
    of ``compute()`` passes through. ``notice`` (what is computed) and ``takes`` (how long it
    takes) are said on the ``elmoe3d.calib`` logger before it starts, so that a first run
    does not look hung. Inside :func:`calibrations_needed`, a calibration not on disk is
    recorded and an :class:`Unmeasured` returned, ``compute`` not called: ``plan()`` (when
    given) runs instead, the cheap part of ``compute`` that raises what it raises on a shape
    the PE cannot run (milliseconds), so that such a point fails here too."""
    from ...paths import memo_text
    from ...sim.runner import source_keyed
    path = calib_root() / (f"{kind}-"
                           f"{source_keyed(modules=CALIBRATION_MODULES, kind=kind, key=key)}.json")
    made, started = [], []

    def parse(text):
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise ValueError("not an object")
        return cls(**{k: _tuples(v) for k, v in fields.items()})
    needed = _NEEDED.get()
    if needed is not None:
        try:
            return parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, TypeError):   # absent or damaged
            if plan is not None:
                plan()
            needed.setdefault((kind, key), (notice, takes))
            return Unmeasured()

    def produce():
        started.append(True)
        if notice:
            logging.getLogger("elmoe3d.calib").warning(
                "elmoe3d: computing the compute calibration of %s on the PE cycle model "
                "(%s, once: kept in %s)", notice, takes, path.parent)
        made.append(compute())
        return json.dumps(dataclasses.asdict(made[0]))
    try:
        text, _ = memo_text(path, produce, check=parse)
    except OSError:
        if made:                                    # computed, not written: still the answer
            return made[0]
        if started:                                 # compute() itself raised it
            raise
        return compute()                            # no folder to keep it in: compute it here
    return made[0] if made else parse(text)


def _lookup(arch: ArchConfig, k: tuple) -> FFNCalibration:
    from .compute_calib_table import TABLE
    key, hidden, intermediate, bits, link = k
    e = TABLE.get(k)
    if e is None:
        return memo_calibration(
            "ffn", k, lambda: calibrate(arch, hidden, intermediate, bits, check=False,
                                        link_rate=link), FFNCalibration,
            f"a {hidden} x {intermediate} FFN at W{bits}A8",
            plan=lambda: ffn_chunks(hidden, intermediate, arch))
    return FFNCalibration(key, hidden, intermediate, bits, e["chunks"],
                          e["chunk_intermediate"], e["pes"], e["peak"], tuple(e["tile"]),
                          e["period"], e.get("fit_error"), link)


def ffn_calibration(arch: ArchConfig, hidden: int, intermediate: int, bits: int,
                    feed: str = "die") -> FFNCalibration:
    """The :class:`FFNCalibration` of an ``hidden`` x ``intermediate`` SwiGLU FFN on a group of
    ``arch`` at ``bits`` (4: DRAFT / W4A8, 8: FULL / W8A8), its link words at the aggregation
    link's rate (``feed`` ``"die"``, the default) or a word a cycle (``"ideal"``;
    :data:`FEEDS`): from the shipped table (:data:`~.compute_calib_table.TABLE`) when it holds
    the key, else computed with group_cycles on first use (seconds to minutes for a real
    shape) and kept, in this process and on disk (:func:`memo_calibration`). Raises
    ValueError on another ``bits`` or ``feed``."""
    k = table_key(arch, hidden, intermediate, bits, feed)
    c = _CACHE.get(k)
    if c is None:
        c = _lookup(arch, k)
        if not isinstance(c, Unmeasured):
            _CACHE[k] = c
    return c


# == the shipped table ============================================================================

#: Extra FFN shapes of the shipped table beside Table 3's models: OLMoE-1B-7B's expert (the
#: tests' second real shape, ``make bench`` figure 11's).
EXTRA_SHAPES = ((2048, 1024),)


def table_shapes() -> list:
    """``(hidden, intermediate)`` of every FFN :mod:`.paper_eval` asks for on the models it can
    run (every :data:`~.decoder.DECODER_SHAPES` model: routed, shared and dense FFNs), and
    :data:`EXTRA_SHAPES`."""
    from .decoder import DECODER_SHAPES, decoder_shape
    out = []
    for name in DECODER_SHAPES:
        s = decoder_shape(name)
        m = s.model
        for inter in (m.expert_intermediate, m.shared_intermediate, s.dense_intermediate):
            if inter and (m.hidden, inter) not in out:
                out.append((m.hidden, int(inter)))
    for sh in EXTRA_SHAPES:
        if sh not in out:
            out.append(sh)
    return out


def _calibrate_entry(job):
    an, h, ic, bits, link = job
    from ...config import preset
    return calibrate(preset(an), h, ic, bits, link_rate=link)


def write_table(path=None, arch_names=("paper-4gb",), say=print, jobs: int = 1) -> dict:
    """Compute every :func:`table_shapes` x bits (4, 8) x :data:`FEEDS` entry on
    ``arch_names`` (whose :func:`pe_key` the paper-8gb preset shares), ``jobs`` processes at
    a time, and write ``compute_calib_table.py`` (default: beside this module). Returns the
    table."""
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path
    from ...config import preset
    entries = {}                                    # table key -> (arch name, chunk key)
    for an in arch_names:
        arch = preset(an)
        for h, i in table_shapes():
            n, ic = ffn_chunks(h, i, arch)
            for bits in (4, 8):
                for feed in FEEDS:
                    k = table_key(arch, h, i, bits, feed)
                    entries.setdefault(k, (an, (an, h, ic, bits, k[-1]), n))
    todo = list(dict.fromkeys(c for _, c, _ in entries.values()))
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        done = dict(zip(todo, pool.map(_calibrate_entry, todo)))
    table = {}
    for k, (an, ck, n) in entries.items():
        key, h, i, bits, link = k
        c = done[ck]
        table[k] = {"chunks": n, "chunk_intermediate": c.intermediate, "pes": c.pes,
                    "peak": c.peak, "tile": list(c.tile), "period": c.period,
                    "fit_error": c.fit_error}
        e = FFNCalibration(key, h, i, bits, n, c.intermediate, c.pes, c.peak, c.tile,
                           c.period)
        say(f"{an} {h}x{i} W{bits}A8 link {link or 1:g} words a cycle: {n} x "
            f"{c.intermediate}, 1 / 16 rows {e.macs_per_cycle(1):,.0f} / "
            f"{e.macs_per_cycle(16):,.0f} MACs a PE-cycle ({e.utilisation(1):.1%} / "
            f"{e.utilisation(16):.1%}), period {c.period}, fit error {c.fit_error}")
    write_table_module(path or Path(__file__).with_name("compute_calib_table.py"), table,
                       "The shipped compute calibration of the paper PE", MODULE,
                       "(pe_key, hidden, intermediate, bits, link_rate)")
    return table


def write_table_module(path, table: dict, title: str, module: str, key: str) -> None:
    """Write ``table`` as a Python module holding ``TABLE = {key: row, ...}`` (``repr`` of
    each key and row, one per line), its docstring naming ``title``, the generating
    ``module`` (``python -m module``) and the ``key``'s fields. Shared by the shipped tables
    of :mod:`.compute_calib` and :mod:`.perf_calib`."""
    from pathlib import Path
    lines = [f'"""{title}', f"(generated by ``python -m {module}``; do not edit: that",
             f'module says what the figures are). Key: ``{key}``."""', "", "TABLE = {"]
    lines += [f"    {k!r}: {v!r}," for k, v in table.items()]
    lines.append("}")
    Path(path).write_text("\n".join(lines) + "\n")


def table_main(argv, module: str, default: str, write) -> int:
    """The command line of a table generator (``python -m module [--out FILE]``): ``write(out,
    say=...)`` with ``out`` None for ``default`` beside the module."""
    import argparse
    ap = argparse.ArgumentParser(prog=f"python -m {module}",
                                 description=f"write the shipped table {default}")
    ap.add_argument("--out", default=None, help=f"output file (default: {default} beside "
                                                f"the module)")
    args = ap.parse_args(argv)
    write(args.out, say=lambda s: print(s, flush=True))
    return 0


def main(argv=None) -> int:
    return table_main(argv, MODULE, "compute_calib_table.py",
                      lambda out, say: write_table(out, say=say, jobs=usable_cpus()))


if __name__ == "__main__":
    sys.exit(main())

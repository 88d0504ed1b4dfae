"""The paper PE in Verilator (``make sim-paper-pe``, ``elmoe3d paper-pe``): build the
``paper-4gb`` PE (16x32x32 tile, W = 4096 bits, 32 KB WMEM, 32 KB IOMEM) with Verilator,
measuring the build's wall time and peak memory, then run one real-shape expert's root-PE
program on it (:func:`elmoe3d.sim.bench_pe.test_paper_group_root`), bit-exact against the
functional group run and ``ref_moe``, and report the simulated cycles per second, the cycles
and the HB roofline fraction.

Not part of ``make test``: the build alone takes far longer than the whole suite.

Build measurement (:func:`measured_build`): Verilog generation (Amaranth) and the Verilator
build (``verilator`` then ``make -j`` of the C++; :func:`elmoe3d.sim.runner.build`) run in a
child process tree measured by :func:`elmoe3d.sim.measure.measured_call`: wall times, the
largest resident set of one process (``/usr/bin/time -v``'s "Maximum resident set size") and
the sampled peak of the whole tree at once. A fresh build's figures are kept in
``measure.json`` in its build folder; when the build is reused (the same Verilog and options)
the stored figures are reported, marked as such, beside this run's Verilog step.

The Verilog is kept in the Verilog cache (:func:`elmoe3d.sim.runner.cached_verilog`, keyed by
every source and the configuration): a re-run reads it instead of generating it again only to
find the build key. A build whose Verilog was read from the cache reports no generation time
(``verilog_cached``).

Amaranth's combinational-cycle check is skipped for these builds by default
(:func:`_comb_cycle_check`: quadratic in the word width, hours at W = 4096). Verilog generated
without it is cached under its own key (``"comb_cycle_check": False``), apart from the checked
Verilog the PE benches generate and read under ``{"PE": repr(arch)}``; a run without the check
reads the checked Verilog where it is cached, a run with it never reads unchecked Verilog.

A smaller tile with the paper memories (``tile="8x16x32"``, :func:`paper_arch`) is the fallback
when the full tile does not fit a machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from pathlib import Path

from ..checks import check_int
from ..config import ArchConfig, ConfigError, TileConfig, preset


__all__ = ["PAPER_TEST", "paper_arch", "parse_tile", "build_name", "measured_build",
           "run_paper_pe", "MEASURE_FILE"]

#: The bench test this runs.
PAPER_TEST = "test_paper_group_root"
#: Build figures kept in a fresh build's folder.
MEASURE_FILE = "measure.json"


def parse_tile(text: str) -> TileConfig:
    """``"RxLxG"`` (e.g. ``"8x16x32"``) as a :class:`TileConfig`; ``ValueError`` naming the
    text otherwise."""
    try:
        rows, lanes, group = (int(v) for v in str(text).lower().split("x"))
    except ValueError:
        raise ValueError(f"tile: expected ROWSxLANESxGROUP (e.g. 8x16x32), got {text!r}") \
            from None
    try:
        return TileConfig(rows=rows, lanes=lanes, group=group)
    except ConfigError as exc:
        raise ValueError(f"tile {text!r}: {exc}") from None


def paper_arch(config: str | ArchConfig = "paper-4gb", tile=None) -> ArchConfig:
    """The preset ``config`` (default the paper's 4 GB die; or an :class:`ArchConfig`), its
    tile replaced by ``tile`` (a :class:`TileConfig` or ``"RxLxG"``) when given: the
    memories, the PE group and the HB rate stay the configuration's. The name says the tile
    (``paper-4gb-t8x16x32``)."""
    arch = config if isinstance(config, ArchConfig) else preset(config)
    if tile is None:
        return arch
    tile = parse_tile(tile) if isinstance(tile, str) else tile
    if tile == arch.tile:
        return arch
    arch = dataclasses.replace(arch, name=f"{arch.name}-t{tile.rows}x{tile.lanes}x{tile.group}",
                               tile=tile)
    arch.pe                                          # ConfigError if the PE cannot be built
    return arch


def build_name(arch: ArchConfig) -> str:
    """The build folder prefix of ``arch``'s PE (as :func:`elmoe3d.sim.bench_pe.build_pe`)."""
    return f"pe_{arch.name.replace('-', '_')}"


@contextlib.contextmanager
def _comb_cycle_check(enabled: bool):
    """Amaranth's combinational-cycle check of the netlist on (``enabled``) or skipped.

    The check walks, for every net, the nets it depends on combinationally; a dynamic part
    select (a word chosen by an index) gives each of its output bits an edge from every input
    bit, so the walk grows with the square of the word width: 335 of the 407 s of the ``mid``
    PE's (W = 1024) Verilog generation, and more than 52 CPU minutes without finishing for the
    paper PE (W = 4096) on 2 cores. It only raises on a cycle; the Verilog text is the same
    either way (and so is the build key). Skipping it is safe for a PE whose RTL passes it at
    ``small`` and ``mid`` (every ``make test``); Verilator also reports combinational loops
    (``UNOPTFLAT``, counted in the build figures)."""
    from amaranth.hdl import _nir
    saved = getattr(_nir.Netlist, "check_comb_cycles", None)
    if enabled or saved is None:
        yield
        return
    _nir.Netlist.check_comb_cycles = lambda self: None
    try:
        yield
    finally:
        _nir.Netlist.check_comb_cycles = saved


def _build(arch: ArchConfig, comb_check: bool = False, verilator_args=()) -> dict:
    """Child process: generate the PE's Verilog or read it from the Verilog cache (the checked
    Verilog of :func:`elmoe3d.sim.bench_pe.build_pe`'s key where it is there or ``comb_check``
    asks for it, else the unchecked Verilog's own key: module docstring), then build it (or
    reuse the build)."""
    from ..hw.pe import PE
    from ..paths import memo_text
    from .runner import build, cached_verilog_made, verilog_cache_path
    checked = {"PE": repr(arch)}                     # the PE benches' key: checked Verilog
    start = time.perf_counter()
    verilog = None
    if not comb_check and verilog_cache_path("pe", checked).is_file():
        try:                                          # read only: never made here unchecked
            verilog, made = memo_text(verilog_cache_path("pe", checked), _not_cached)
        except (_NotCached, OSError):
            verilog = None                            # damaged or unreadable: the own key's
    was_checked = verilog is not None or comb_check
    if verilog is None:
        key = checked if comb_check else {**checked, "comb_cycle_check": False}
        with _comb_cycle_check(comb_check):
            verilog, made = cached_verilog_made(PE(config=arch), name="pe", key=key)
    gen = time.perf_counter() - start
    built = build(verilog, name=build_name(arch), toplevel="pe",
                  extra_args=tuple(verilator_args))
    return {"build_dir": str(built.build_dir), "built": built.built,
            "verilog_seconds": gen, "verilog_cached": not made, "verilog_bytes": len(verilog),
            "verilator_seconds": built.seconds, "comb_cycle_check": was_checked,
            "verilator_args": list(verilator_args)}


class _NotCached(Exception):
    """The checked Verilog is not whole in the cache (:func:`_build` then uses its own key)."""


def _not_cached():
    raise _NotCached


def _verilator_report(build_dir: Path) -> dict:
    """Verilator's own figures from the build log (its "- Verilator: Walltime" line)."""
    import re
    try:
        text = (build_dir / "build.log").read_text(errors="replace")
    except OSError:
        return {}
    m = re.search(r"- Verilator: Walltime ([\d.]+) s \(elab=([\d.]+), cvt=([\d.]+), "
                  r"bld=([\d.]+)\); cpu ([\d.]+) s on (\d+) threads?; allocated ([\d.]+) MB", text)
    if not m:
        return {}
    warnings = {w: len(re.findall(rf"%Warning-{w}\b", text))
                for w in ("UNOPTFLAT", "ALWCOMBORDER")}
    return {"verilator_warnings": warnings, "verilator_walltime_s": float(m[1]),
            "verilator_cpu_s": float(m[5]),
            "verilator_allocated_mb": float(m[7])}


def measured_build(arch: ArchConfig, *, interval: float = 0.5, comb_check: bool = False,
                   verilator_args=()):
    """Build ``arch``'s PE in a measured child process tree; return ``(Build, figures)``.

    ``figures``: ``verilog_seconds`` (generating it, or reading it from the Verilog cache:
    ``verilog_cached``), ``verilog_bytes``, ``comb_cycle_check`` (whether the Verilog, this
    run's or the cached one, passed Amaranth's check), ``verilator_seconds`` (Verilator and
    the C++ compile: :attr:`~elmoe3d.sim.runner.Build.seconds`), ``wall_seconds``,
    ``peak_rss_bytes`` and the others of :func:`~elmoe3d.sim.measure.measured_call`, Verilator's
    own report when its log has one, and ``reused`` (True: the build existed; the build
    figures are the stored ones of the build that made it, ``this_run`` holds this call's).
    ``comb_check``: run Amaranth's combinational-cycle check (:func:`_comb_cycle_check`; off
    by default). ``verilator_args``: more Verilator options (part of the build key), e.g.
    ``-fno-dfg``."""
    from .measure import measured_call
    from .runner import Build
    value, figures = measured_call(_build, arch, comb_check, tuple(verilator_args),
                                   interval=interval)
    build_dir = Path(value["build_dir"])
    here = {**value, **figures}
    stored_path = build_dir / MEASURE_FILE
    if value["built"]:
        result = {**here, **_verilator_report(build_dir), "reused": False,
                  "arch": arch.name, "tile": dataclasses.asdict(arch.tile),
                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        stored_path.write_text(json.dumps(result, indent=1))
    else:
        try:
            stored = json.loads(stored_path.read_text())
        except (OSError, ValueError):
            stored = {"verilator_seconds": value["verilator_seconds"]}
        result = {**stored, "reused": True, "this_run": here}
    built = Build(build_name(arch), "pe", build_dir, False, bool(value["built"]),
                  float(value["verilator_seconds"]))
    return built, result


def run_paper_pe(arch: ArchConfig, *, shape: str = "olmoe-1b-7b", tokens=(1,),
                 modes=("DRAFT", "FULL"), ld_rates=("hb",), seed=None, built=None):
    """Run :data:`PAPER_TEST` on ``arch``'s PE (``built``, else built now) for every tokens
    count of ``tokens``, mode of ``modes`` and ``ld`` rate of ``ld_rates``
    (:func:`elmoe3d.sim.bench_pe.ld_rate_words`: ``"hb"``, ``"full"`` or words per cycle);
    returns the :class:`~elmoe3d.sim.records.BenchResult` (failing tests do not raise: the
    caller reads the records and the runner's counts). Each of ``tokens``, ``modes`` and
    ``ld_rates`` is one value or any iterable of them (NumPy arrays included). Raises
    ``ValueError`` naming ``tokens`` for a count that is not a positive integer, or none."""
    from .bench_pe import as_list, run_pe_bench
    tokens = [check_int("tokens", t, 1) for t in as_list(tokens)]
    if not tokens:
        raise ValueError("tokens: expected at least one positive integer, got none")
    modes, ld_rates = as_list(modes), as_list(ld_rates)
    return run_pe_bench(arch, tests=PAPER_TEST, seed=seed, built=built, check=False,
                        params={"paper_shape": shape, "paper_tokens": tokens,
                                "paper_modes": [str(m).upper() for m in modes],
                                "paper_ld_rate": [str(r) for r in ld_rates]})

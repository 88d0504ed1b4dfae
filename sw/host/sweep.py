"""Design-space sweeps on Dask (issue 27, ``docs/sweep.md``): a spec's points run as Dask tasks
on an embedded :class:`distributed.LocalCluster` or on a cluster's scheduler, their rows
written as they finish, resumable, consolidated into Parquet, CSV and JSON, with Pareto plots.

* :func:`run_sweep` -- expand and validate the spec (:func:`~.sweep_spec.expand`; nothing runs
  if a point is invalid), skip the points whose row is already in the out folder without an
  error and from the same code (a rerun, keyed by the point's id and the row's ``code``,
  :func:`~.sweep_tasks.code_version`), connect to the scheduler (:func:`connect_scheduler`:
  before anything is written, so that one that cannot be reached leaves nothing), submit
  the rest in chunks (:func:`~.sweep_tasks.run_point`, or ``task``), write each row as it
  arrives, then the consolidated tables and the plots.
* Faults: a worker that dies mid-task loses nothing: the scheduler reruns its tasks on another
  worker (``distributed.scheduler.allowed-failures``, default 3); a task that raises inside a
  point records its error in the row (``error``) and the sweep goes on. A point whose row has an
  error runs again on a rerun; a finished one does not. A chunk given up after
  allowed-failures (``KilledWorker``: the scheduler counts a death against every chunk the
  dying worker held) is run again one point a task, one in flight a worker; a point given up
  then gets an error row (``"dask: KilledWorker: ..."``) and the sweep goes on.
* ``workers=0`` runs the points in this process, one after the other (the serial reference the
  tests and ``make bench`` compare Dask runs with).

Out folder::

    OUT/points/<id>.json     one row per finished point (written atomically as it finishes)
    OUT/results.parquet      every row of the spec's points, by point index (pyarrow)
    OUT/results.csv          the same
    OUT/results.json         the same, a list of objects
    OUT/pareto-<model>.png   tokens/s and tokens/J against die mm2 (points with an area), a
                             Pareto front per batch
    OUT/by-<axis>-<model>.png  instead, when a model's points share one die: the same
                             against the swept workload axis with the most values (context,
                             batch, ...; without one, the swept config field with the most:
                             by-tile_rows), a line per scheme, other swept axis and config field
    OUT/sweep.json           "status" ("running" from the start, "complete" once the tables
                             are written; "interrupted" after Ctrl-C, "failed" with its
                             "error" after an exception, both with the "finished" rows a
                             rerun keeps), the spec's name, seed, counts, workers, seconds
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ...checks import is_int
from ...errors import UserError
from ...machine import usable_cpus
from .sweep_spec import (CONFIG_FIELDS, WORKLOAD_FIELDS, SweepSpec, dropped_text, expand,
                         load_spec, need)
from .sweep_tasks import (CACHE_ENV, META_COLUMNS, RESULT_COLUMNS, cache_problem, code_version,
                          default_cache_dir, run_point)


__all__ = ["run_sweep", "run_chunk", "auto_chunk", "MAX_CHUNK", "SweepRun", "ResultStore",
           "consolidate", "pareto_front", "pareto_plots", "comparable", "local_cluster",
           "failed_row", "check_scheduler", "check_dashboard", "check_out", "connect_scheduler",
           "CONNECT_TIMEOUT"]


class ResultStore:
    """The out folder's per-point rows (``points/<id>.json``): :meth:`put` writes one
    atomically, :meth:`get` reads one back (``None`` if absent or damaged)."""

    def __init__(self, out_dir, *, create: bool = True):
        """The store of ``out_dir``; ``create``: make the folder and its ``points/`` now (else
        :meth:`create`; :meth:`get` and :meth:`state` read a missing folder as empty). Raises
        :class:`OSError` when it cannot be made."""
        self.out = Path(out_dir).resolve()
        self.points = self.out / "points"
        if create:
            self.create()

    def create(self) -> None:
        """Make the out folder and its ``points/``, with any missing parents. Raises
        :class:`OSError` when they cannot be made."""
        self.points.mkdir(parents=True, exist_ok=True)

    def path(self, pid: str) -> Path:
        return self.points / f"{pid}.json"

    def get(self, pid: str):
        try:
            return json.loads(self.path(pid).read_text())
        except (OSError, ValueError):
            return None

    def state(self, pid: str, code: str) -> str:
        """``"done"`` (a row without an error, from the same ``code``: a rerun skips it),
        ``"stale"`` (a row without an error from other code: run again), ``"todo"``."""
        row = self.get(pid)
        if row is None or row.get("error"):
            return "todo"
        return "done" if row.get("code") == code else "stale"

    def put(self, row: dict) -> None:
        _write_atomic(self.path(row["id"]), json.dumps(row, default=_json_default))


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a uniquely named temporary file beside it, created
    ``0o666`` less the umask like every other output file (not ``mkstemp``'s private 0o600)."""
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def failed_row(point, error: str) -> dict:
    """The row of a point whose Dask task failed as a whole (e.g. it kept killing its
    worker): the point's fields and ``error``; a rerun runs it again."""
    return {"point": point.index, "id": point.id, "base": point.base, **point.config,
            **point.workload, "error": error}


def _json_default(v):
    if hasattr(v, "item"):
        return v.item()
    return str(v)


@dataclass
class SweepRun:
    """What :func:`run_sweep` did: ``points`` (all of the spec's; the combinations a constraint
    dropped, with no task or equal to another point are none, ``sweep.json``'s ``dropped``
    counts them), ``skipped`` (finished
    before, not run again), ``ran`` (submitted this time), ``errors`` (rows with an error),
    ``rows`` (every point's row, by index), ``workers``, ``dashboard`` (the Dask dashboard's
    address, ``None`` in-process), ``seconds`` (wall, the points' phase), ``files`` (what was
    written)."""

    points: int
    skipped: int
    ran: int
    errors: int
    rows: list
    workers: int
    dashboard: str | None
    seconds: float
    files: dict = field(default_factory=dict)


@contextlib.contextmanager
def local_cluster(workers: int, *, dashboard: str | None = "localhost:8787"):
    """A :class:`distributed.Client` on an embedded ``LocalCluster`` of ``workers`` worker
    processes, one thread each (the perf model, Yosys and Verilator are CPU-bound); closed on
    exit. The workers ignore SIGINT (:func:`~.sweep_tasks.dask_setup`): Ctrl-C stops this
    process, which closes the cluster; closed by an exception (Ctrl-C included), the cluster's
    logging is silenced while it shuts down (its complaints about the tasks cut short would
    bury the one-line message)."""
    import logging
    import dask
    from distributed import Client, LocalCluster
    from .sweep_tasks import dask_setup, quiet_closed_connections
    loud = quiet_closed_connections()           # this process: the scheduler's side
    quiet = None
    try:
        # every task goes to a worker at once (no scheduler-side queue): a point's task is
        # short, and a round trip to the scheduler between two tasks would cost about as much
        # as one
        with dask.config.set({"distributed.scheduler.worker-saturation": float("inf")}):
            # a dashboard port in use: Dask takes another and warns in three lines; the
            # sweep's "dask: ..." line gives the dashboard's address either way
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", r"Port \d+ is already in use", UserWarning)
                cluster = LocalCluster(n_workers=workers, threads_per_worker=1,
                                       processes=True, dashboard_address=dashboard,
                                       silence_logs=logging.ERROR,
                                       **_preloads(dask_setup.__module__))
            with cluster, Client(cluster) as client:
                try:
                    yield client
                except BaseException:
                    quiet = logging.root.manager.disable
                    logging.disable(logging.CRITICAL)
                    raise
    finally:
        loud()
        if quiet is not None:
            logging.disable(quiet)


#: Address schemes Dask registers that a sweep's client cannot use (:func:`check_scheduler`).
UNUSABLE_SCHEMES = ("inproc", "ucx")


def check_scheduler(address: str) -> str:
    """``address`` (``--scheduler``) checked as Dask reads it before anything starts:
    ``SCHEME://HOST:PORT`` with a scheme Dask knows (``tcp://``, ``tls://``, ...; ``tcp://``
    when none is given; not ``inproc://``, a scheduler inside one process) and a port
    1-65535. Returns it; raises :class:`UserError` naming ``--scheduler`` and the schemes."""
    need("distributed")
    import distributed.comm                     # noqa: F401 (registers the schemes)
    from distributed.comm.addressing import get_address_host_port, parse_address
    from distributed.comm.registry import backends, get_backend
    # inproc:// is a scheduler inside one process: not one a sweep's client can reach; ucx://
    # is registered by distributed but a stub that refuses every address (use ucxx://)
    schemes = ", ".join(f"{s}://" for s in sorted(backends) if s not in UNUSABLE_SCHEMES)
    address = str(address)
    scheme = parse_address(address)[0] if address else "tcp"
    try:
        if scheme in UNUSABLE_SCHEMES:
            raise ValueError(scheme)
        get_backend(scheme)
    except (ValueError, ImportError):
        raise UserError(f"--scheduler {address}: unknown address scheme {scheme!r}; expected "
                        f"one of {schemes} (e.g. tcp://HOST:8786)") from None
    try:
        port = get_address_host_port(address)[1]
    except (ValueError, TypeError):
        port = None
    if not is_int(port, numpy=False) or not 0 < port < 65536:
        raise UserError(f"--scheduler {address}: expected {scheme}://HOST:PORT with a port "
                        f"1-65535 (e.g. tcp://HOST:8786)")
    return address


def check_dashboard(address: str) -> str:
    """``address`` (``--dashboard``, the embedded cluster's) checked before anything starts:
    ``HOST:PORT``, ``:PORT`` or ``PORT`` with a port 0-65535 (0: any free port; no HOST: every
    interface) and a HOST (a name or an IPv4 address: Dask takes no IPv6 one) that resolves.
    Returns it; raises :class:`UserError` naming ``--dashboard``."""
    address = str(address)
    host, sep, port = address.rpartition(":")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535 or ":" in host \
            or host.startswith("["):
        raise UserError(f"--dashboard {address}: expected HOST:PORT, :PORT or PORT with a port "
                        f"0-65535, HOST a name or an IPv4 address (e.g. localhost:8787; :8787 "
                        f"or 8787 serves every interface, port 0 any free one)")
    if host:
        try:
            socket.getaddrinfo(host, int(port))
        except (OSError, UnicodeError) as exc:
            raise UserError(f"--dashboard {address}: unknown host {host!r} "
                            f"({getattr(exc, 'strerror', None) or exc})") from None
    return address


#: Seconds :func:`connect_scheduler` waits for the scheduler of ``--scheduler`` to answer.
CONNECT_TIMEOUT = 20


def connect_scheduler(address: str, cache, cache_given: bool, *,
                      timeout: float = CONNECT_TIMEOUT):
    """A :class:`distributed.Client` of the scheduler at ``address`` (``--scheduler``) whose
    workers import elmoe3d's sweep tasks (:func:`_warm_up_workers`) and can write the cache
    folder ``cache`` (:func:`_check_cache`; ``cache_given``: it is ``--cache``'s). Waits at
    most ``timeout`` seconds for the scheduler. :func:`run_sweep` calls it before it prints
    or writes anything: a sweep whose cluster cannot be used leaves no trace. The caller
    closes the client. Raises :class:`UserError` naming ``--scheduler`` when the scheduler
    cannot be reached, or (the client closed) a worker cannot import the tasks or write the
    cache."""
    need("distributed")
    from distributed import Client
    try:
        client = Client(address, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as exc:
        raise UserError(f"--scheduler {address}: cannot connect ({exc})") from None
    try:
        _warm_up_workers(client)
        _check_cache(cache, cache_given, client)
    except BaseException:
        client.close()
        raise
    return client


def _warm_up_workers(client) -> None:
    """Import what a point's task needs on every worker of ``client`` (:func:`_warm_up`), so
    that the rate counts the points. Raises :class:`UserError` when a worker cannot (one
    without the package, say)."""
    try:
        client.run(_warm_up)
    except Exception as exc:
        raise UserError(f"dask workers cannot import elmoe3d's sweep tasks "
                        f"({type(exc).__name__}: {exc}); see docs/sweep.md") from None


def _check_cache(cache: Path, given: bool, client=None) -> None:
    """Raise :class:`UserError` naming ``--cache`` (or the default cache folder when not
    ``given``) unless ``cache`` is a folder the tasks can write, made if missing
    (:func:`~.sweep_tasks.cache_problem`): here, or with ``client`` on every worker."""
    label = f"--cache {cache}" if given else f"the cache folder {cache} (--cache, ${CACHE_ENV})"
    if client is None:
        problem = cache_problem(cache)
        if problem:
            raise UserError(f"{label}: {problem}")
        return
    bad = {w: p for w, p in client.run(cache_problem, str(cache)).items() if p}
    if bad:
        worker, problem = next(iter(bad.items()))
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UserError(f"{label}: {problem} on worker {worker}{more} (a cluster's workers "
                        f"need a cache folder they share)")


def _preloads(module) -> dict:
    """``preload`` (and ``preload_argv``) for the embedded cluster's workers: the user's
    configured ones (``distributed.worker.preload``), which an explicit ``preload`` would
    replace, then ``module``."""
    import dask
    mine = list(dask.config.get("distributed.worker.preload", None) or [])
    argv = dask.config.get("distributed.worker.preload-argv", None) or []
    out = {"preload": [*mine, module]}
    if argv and isinstance(argv[0], (list, tuple)):     # one argv a preload: ours has none
        out["preload_argv"] = [*argv, []]
    return out


def _out_label(out_dir, given: bool) -> str:
    return f"--out {out_dir}" if given else f"the out folder {out_dir} (--out)"


#: The files :func:`run_sweep` writes at the top of the out folder (besides the plots).
OUT_FILES = ("sweep.json", "results.parquet", "results.csv", "results.json")


def check_out(out_dir, given: bool = True) -> None:
    """Raise :class:`UserError` naming ``--out`` (or the default out folder when not
    ``given``) when ``out_dir``, or a folder above it, is a file or cannot be looked at, or
    when the out folder cannot be written: the check and the words of the other commands'
    output folders (:func:`elmoe3d.cli.outputs.check_output_dir`: an existing folder in which
    :data:`OUT_FILES` cannot be written, a new one whose nearest existing folder is not
    writable). Checked before anything is written."""
    from ...cli.outputs import check_output_dir
    label = _out_label(out_dir, given)
    out = Path(out_dir).resolve()
    try:
        for p in (out, *out.parents):
            if p.exists():
                if not p.is_dir():
                    raise UserError(f"{label}: a file, not a folder" if p == out else
                                    f"{label}: cannot make the out folder: {p} is a file, "
                                    f"not a folder")
                break
        check_output_dir(out_dir, "--out" if given else "the out folder", OUT_FILES,
                         image_names=True)
    except OSError as exc:
        raise UserError(f"{label}: cannot look at {exc.filename or out} "
                        f"({exc.strerror or exc})") from None


def _progress(enabled, total, label):
    """A rich progress bar (or a no-op) with ``advance()``."""
    if not enabled or total == 0:
        class _Null:
            def advance(self, n=1):
                pass
        yield _Null()
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn()) as bar:
        tid = bar.add_task(label, total=total)

        class _Bar:
            def advance(self, n=1):
                bar.advance(tid, n)
        yield _Bar()


_progress = contextlib.contextmanager(_progress)


def run_sweep(spec, out_dir, *, scheduler: str | None = None, workers: int | None = None,
              cache_dir=None, progress: bool = True, task=None, retries: int = 0,
              dashboard: str | None = "localhost:8787", plots: bool = True, say=print,
              chunk: int | None = None, out_given: bool = True,
              connect_timeout: float = CONNECT_TIMEOUT) -> SweepRun:
    """Run the sweep ``spec`` (a :class:`~.sweep_spec.SweepSpec` or a spec file) into
    ``out_dir``.

    ``scheduler``: a Dask scheduler address (``tcp://HOST:8786``); else an embedded ``LocalCluster``
    of ``workers`` processes (default: :func:`~elmoe3d.machine.usable_cpus`); ``workers=0`` runs in
    this process. ``cache_dir``: the cache the workers share (default
    :func:`~.sweep_tasks.default_cache_dir`; on a cluster a shared filesystem path). ``task``: the
    function a point runs (default :func:`~.sweep_tasks.run_point`), called as ``task(point,
    cache_dir)``. ``retries``: Dask retries of a task that raises (run_point does not raise; a dead
    worker's tasks are rerun by the scheduler whatever this says). ``chunk``: points a Dask task
    runs (default :func:`auto_chunk`). ``say`` prints the seed, the counts and the dashboard
    address. ``connect_timeout``: seconds to wait for ``scheduler`` to answer.

    Everything that can be checked is checked before anything is written to the out folder and
    before the first line is said: the addresses, the spec and its points, the out and cache
    folders, and, when some point is left to run, the scheduler (connected, its workers
    warmed up and their cache checked: :func:`connect_scheduler`) or the embedded cluster
    (started, its workers warmed up: a cluster that cannot start leaves an earlier sweep's
    out folder as it was). A sweep stopped after
    that (Ctrl-C, an error) keeps its rows, and ``sweep.json`` says "interrupted" or "failed"
    (:func:`_stopped`): a rerun resumes it.

    Returns a :class:`SweepRun`. Raises :class:`UserError` for an invalid spec or point, a
    scheduler address (:func:`check_scheduler`) or a dashboard address
    (:func:`check_dashboard`) that is not one, an unreachable scheduler, an embedded cluster
    that cannot start or whose workers cannot import the tasks, a cache folder the
    tasks cannot write (checked here, or with a scheduler on every worker), an out folder
    that is a file or (rows, tables, plots, sweep.json) cannot be written, or one another
    sweep is running into (:func:`_out_lock`)."""
    if scheduler:
        check_scheduler(scheduler)
    elif workers != 0 and dashboard is not None:
        check_dashboard(dashboard)
    if not isinstance(spec, SweepSpec):
        spec = load_spec(spec)
    counts = {}
    points = expand(spec, counts)
    check_out(out_dir, out_given)
    cache = Path(cache_dir).resolve() if cache_dir is not None else default_cache_dir()
    if not scheduler:                   # a cluster's workers check theirs: connect_scheduler
        _check_cache(cache, cache_dir is not None)
    task = task or run_point
    out = Path(out_dir).resolve()
    with contextlib.ExitStack() as stack:
        # a sweep running into an earlier run's folder is found before a cluster starts
        # (nothing written: the lock itself is taken once the run starts, below)
        _probe_out_lock(out)
        store = ResultStore(out, create=False)          # read what an earlier run finished
        code = code_version()
        states = [store.state(p.id, code) for p in points]
        # the cluster before the out folder is made and the header said: a scheduler that
        # cannot be reached or an embedded cluster that cannot start or import the tasks
        # leaves no trace (nor an earlier sweep's sweep.json marked "failed")
        client = None
        if any(st != "done" for st in states):
            if scheduler:
                client = connect_scheduler(scheduler, cache, cache_dir is not None,
                                           timeout=connect_timeout)
                stack.callback(client.close)
            elif workers != 0:
                need("distributed")
                n = workers if workers is not None else usable_cpus()
                try:
                    client = stack.enter_context(local_cluster(n, dashboard=dashboard))
                except Exception as exc:
                    raise UserError(f"dask: the embedded cluster of {n} worker(s) could not "
                                    f"start ({type(exc).__name__}: {exc}); --workers 0 runs "
                                    f"the points in this process") from None
                _warm_up_workers(client)
        try:
            store.create()
            stack.enter_context(_out_lock(store.out, say))
            try:
                return _run(spec, points, states, store, cache, task, code=code,
                            client=client, progress=progress, retries=retries, plots=plots,
                            say=say, chunk=chunk, dropped=counts)
            except BaseException as exc:
                _stopped(store, points, exc)
                raise
        except OSError as exc:
            # the out folder, its rows, tables, plots, sweep.json or .lock: a one-line error
            if exc.filename is None \
                    or not str(Path(exc.filename).resolve()).startswith(str(out)):
                raise
            raise UserError(f"{_out_label(out_dir, out_given)}: cannot write the out folder: "
                            f"{exc.filename} ({exc.strerror or exc})") from None


#: The out folder's lock file (:func:`_out_lock`).
LOCK_NAME = ".lock"


@contextlib.contextmanager
def _out_lock(out: Path, say):
    """Hold the out folder for this run: an exclusive ``flock`` on ``out/.lock`` (left in the
    folder; the lock is released when the run ends, however it ends, or its process dies),
    holding the holder's pid and host where the file can be written. Raises
    :class:`UserError` when another sweep holds it: two sweeps into one folder would write one
    ``sweep.json`` and one set of tables (a new user ran two side by side without a word). A
    filesystem without ``flock`` (NFS without lockd, some FUSE mounts) runs unlocked, said in
    one line; NFS locks do not exclude other hosts at all with ``local_lock=flock``."""
    import errno
    import fcntl
    try:
        f = open(out / LOCK_NAME, "a+")
    except PermissionError:                     # another user's .lock: flock reads suffice
        f = open(out / LOCK_NAME)
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise UserError(_busy(out, f.read().strip())) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            say(f"note: {out}: this filesystem does not lock files ({exc.strerror}): the run "
                f"goes on unlocked; run one sweep at a time into this folder")
        if f.writable():
            f.seek(0)
            f.truncate()
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            f.flush()
        yield
    finally:
        f.close()


def _probe_out_lock(out: Path) -> None:
    """Raise :class:`_out_lock`'s :class:`UserError` now if another sweep holds ``out``'s
    lock; else nothing (the lock is not kept, nothing is written, and a folder without a lock
    file, or one the filesystem cannot lock, passes)."""
    import fcntl
    try:
        f = open(out / LOCK_NAME)
    except OSError:
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(_busy(out, f.read().strip())) from None
        except OSError:
            return


def _busy(out, holder: str) -> str:
    """The refusal of a sweep into ``out``, which ``holder`` (its lock file's line) holds."""
    return (f"{out}: another sweep is running into this out folder "
            f"({holder or 'another process'}); wait for it to end or give another --out")


def _stopped(store, points, exc) -> None:
    """After ``exc`` stopped a run whose sweep.json says "running": say "interrupted" (Ctrl-C)
    or "failed" (with the error), and how many of the spec's points have a finished row (a
    rerun skips them). A sweep.json that cannot be read or written is left as it is."""
    try:
        doc = json.loads((store.out / "sweep.json").read_text())
        if doc.get("status") != "running":
            return
        code = code_version()
        doc["status"] = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        doc["finished"] = sum(1 for p in points if store.state(p.id, code) == "done")
        if doc["status"] == "failed":
            doc["error"] = f"{type(exc).__name__}: {exc}"
        _write_atomic(store.out / "sweep.json", json.dumps(doc, indent=1,
                                                           default=_json_default))
    except (OSError, ValueError):
        pass


def _earlier_plots(before) -> list:
    """The plots an earlier run's ``sweep.json`` (``before``, or ``None``) lists."""
    files = (before or {}).get("files")
    if not isinstance(files, dict):
        return []
    return [str(v) for k, v in files.items()
            if isinstance(k, str) and k.startswith(("pareto:", "by-")) and isinstance(v, str)]


def _earlier_sweep(out) -> dict | None:
    """The ``sweep.json`` an earlier run left in ``out`` (a dict), or ``None`` (none, or one
    that cannot be read as a JSON object)."""
    try:
        doc = json.loads((Path(out) / "sweep.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _status(store, spec, status, **extra) -> None:
    _write_atomic(store.out / "sweep.json", json.dumps(
        {"name": spec.name, "status": status, "spec": spec.path,
         "spec_sha256": spec.text_hash, "seed": spec.seed, "sampling": spec.sampling,
         **extra}, indent=1, default=_json_default))


def _run(spec, points, states, store, cache, task, *, code, client, progress, retries, plots,
         say, chunk, dropped) -> SweepRun:
    """Run the points whose ``states`` (:meth:`ResultStore.state` under ``code``) are not
    "done" into ``store``, on ``client`` (a scheduler's, connected and checked by
    :func:`connect_scheduler`, or an embedded cluster's, its workers warmed up) or in this
    process (``None``); then the tables and plots. Raises :class:`UserError` (rows missing
    after the run) and :class:`OSError` (the out folder)."""
    todo = [p for p, st in zip(points, states) if st != "done"]
    stale = states.count("stale")
    skipped = len(points) - len(todo)
    before = _earlier_sweep(store.out)
    if before is not None and before.get("spec_sha256") != spec.text_hash:
        say(f"{store.out}: held the sweep {before.get('name')!r} of another spec (or an "
            f"earlier version of this one): its finished rows stay, those of this spec's "
            f"points are reused; its tables and plots are replaced by this run's")
    # results.* of an earlier run stay until this one is consolidated: sweep.json says they
    # are not current
    _status(store, spec, "running", points=len(points), dropped=dropped,
            files=(before or {}).get("files", {}))     # still there: a rerun removes them
    say(f"sweep {spec.name}: {len(points)} points ({skipped} finished before, {len(todo)} to "
        f"run" + (f", {stale} rows from other code rerun" if stale else "")
        + dropped_text(dropped) +
        f"), sampling {spec.sampling}, seed {spec.seed}, cache {cache}")
    dash = None
    start = time.perf_counter()
    n_workers = 0
    if todo and client is not None:
        n_workers = len(client.scheduler_info(n_workers=-1).get("workers", {}))
        dash = client.dashboard_link
        say(f"dask: {n_workers} worker(s), scheduler {client.scheduler.address}, dashboard "
            f"{dash}")
        start = time.perf_counter()
        size = chunk or auto_chunk(todo, n_workers)
        chunks = [todo[i:i + size] for i in range(0, len(todo), size)]
        run_tag = uuid.uuid4().hex[:12]         # keys unique on a shared scheduler
        with _progress(progress, len(todo), f"sweep {spec.name}") as bar:
            failed = _gather(client, chunks, task, cache, retries, run_tag, store, bar,
                             limit=None)
            lost = [p for c, _ in failed for p in c]
            if len(lost) > 1:
                # the scheduler counts a death against every task the dying worker held:
                # run the points of the given-up chunks again one a task, at most one in
                # flight a worker, so that only a point that itself kills workers fails
                failed = _gather(client, [[p] for p in lost], task, cache, retries,
                                 run_tag + "-again", store, bar, limit=max(1, n_workers))
            for c, msg in failed:
                for p in c:
                    store.put(failed_row(p, f"dask: {msg}"))
                bar.advance(len(c))
    elif todo:
        with _progress(progress, len(todo), f"sweep {spec.name}") as bar:
            for p in todo:
                store.put(task(p, str(cache)))
                bar.advance()
    seconds = time.perf_counter() - start
    rows = [store.get(p.id) for p in points]
    missing = [p.index for p, r in zip(points, rows) if r is None]
    if missing:
        raise UserError(f"{store.out}: rows of point(s) {missing[:5]} are missing after the run")
    for p, r in zip(points, rows):
        r["point"] = p.index                      # a row kept from another spec: this spec's place
    with _writing(None) as outputs:         # the tables and plots, all or none
        files = consolidate(rows, store.out, outputs)
        # --no-plots: an earlier run's plots go all the same
        files.update(pareto_plots(rows, store.out, axes=swept_axes(spec),
                                  earlier=_earlier_plots(before), outputs=outputs,
                                  draw=plots))
    errors = sum(1 for r in rows if r.get("error"))
    run = SweepRun(points=len(points), skipped=skipped, ran=len(todo), errors=errors,
                   rows=rows, workers=n_workers, dashboard=dash, seconds=seconds, files=files)
    _status(store, spec, "complete", points=run.points, dropped=dropped, skipped=run.skipped,
            ran=run.ran, stale=stale, errors=run.errors, workers=n_workers, dashboard=dash,
            code=code, seconds=seconds, files={k: str(v) for k, v in files.items()})
    return run


def _gather(client, chunks, task, cache, retries, tag, store, bar, *, limit):
    """Run ``chunks`` (lists of points) as Dask tasks, at most ``limit`` in flight (``None``:
    all at once), writing each finished chunk's rows; returns ``[(chunk, message)]`` of the
    tasks that failed as a whole (e.g. ``KilledWorker`` after allowed-failures)."""
    from distributed import as_completed
    owner = {}
    pending = list(chunks)
    ac = as_completed(with_results=True, raise_errors=False)

    def submit():
        c = pending.pop(0)
        fut = client.submit(run_chunk, task, c, str(cache),
                            key=f"points-{c[0].index}-{c[-1].index}-{tag}", pure=False,
                            retries=retries)
        owner[fut] = c
        ac.add(fut)
    for _ in range(len(pending) if limit is None else min(limit, len(pending))):
        submit()
    failed = []
    for fut, rows in ac:
        if fut.status == "finished":
            for row in rows:
                store.put(row)
            bar.advance(len(rows))
        else:
            try:
                exc = fut.exception()
            except Exception as err:                # cancelled, or the scheduler is gone
                exc = err
            msg = (" ".join(f"{type(exc).__name__}: {exc}".split())[:500] if exc is not None
                   else f"task {fut.status}")
            failed.append((owner[fut], msg))
        del owner[fut]
        if pending:
            submit()
    return failed


#: Most points a Dask task runs (perf-only points take milliseconds: one task a point would
#: be mostly Dask's own overhead).
MAX_CHUNK = 16


def auto_chunk(points, workers: int) -> int:
    """Points a task runs: 1 when any point has an area or RTL task (minutes each), else
    enough for about 8 tasks a worker, at most :data:`MAX_CHUNK`."""
    if any(p.tasks.get("area") or p.tasks.get("rtl") for p in points):
        return 1
    return max(1, min(MAX_CHUNK, len(points) // (8 * max(1, workers))))


def run_chunk(task, points, cache_dir) -> list:
    """One Dask task: ``task(point, cache_dir)`` for each of ``points``; their rows."""
    return [task(p, cache_dir) for p in points]


def _warm_up():
    """Import what a point's perf task needs (run once on every worker before the clock)."""
    from . import paper_eval, sweep_tasks  # noqa: F401
    return os.getpid()


# == tables =========================================================================================

def _columns(rows) -> list:
    first = ["point", "id", "base"]
    seen = list(first)
    for r in rows:
        for k in r:
            if k not in seen and k not in RESULT_COLUMNS and k not in META_COLUMNS:
                seen.append(k)
    present = {k for r in rows for k in r}
    return seen + [c for c in RESULT_COLUMNS if c in present or c == "error"] \
        + [c for c in META_COLUMNS if c in present] \
        + sorted(present - set(seen) - set(RESULT_COLUMNS) - set(META_COLUMNS))


@contextlib.contextmanager
def _writing(outputs):
    """``outputs`` (a caller's :class:`~elmoe3d.cli.outputs.AtomicOutputs`, committed by the
    caller with the rest of its files), or a new one committed when the block completes and
    discarded in any case."""
    if outputs is not None:
        yield outputs
        return
    from ...cli.outputs import atomic_outputs
    with atomic_outputs(None) as outputs:       # an OSError naming the destination
        yield outputs


def consolidate(rows, out_dir, outputs=None) -> dict:
    """Write ``rows`` (dicts, by point index) as ``results.parquet`` (pyarrow; one column per
    key, missing values null), ``results.csv`` and ``results.json`` in ``out_dir``, all three
    or none (into ``outputs``, an :class:`~elmoe3d.cli.outputs.AtomicOutputs` the caller
    commits, or committed here); returns ``{"parquet", "csv", "json"}`` -> path."""
    need("pyarrow")
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    out = Path(out_dir)
    cols = _columns(rows)
    data = {c: [r.get(c) for r in rows] for c in cols}
    arrays = {}
    for c, vals in data.items():
        kinds = {type(v) for v in vals if v is not None}
        if kinds <= {int, float} and float in kinds:
            vals = [None if v is None else float(v) for v in vals]
        elif len(kinds) > 1:
            vals = [None if v is None else str(v) for v in vals]
        arrays[c] = pa.array(vals)
    table = pa.table(arrays)
    files = {"parquet": out / "results.parquet", "csv": out / "results.csv",
             "json": out / "results.json"}
    with _writing(outputs) as outputs:
        for kind, path in files.items():
            tmp = outputs.temp_for(path)
            if kind == "parquet":
                pq.write_table(table, tmp)
            elif kind == "csv":
                pcsv.write_csv(table, tmp)
            else:
                Path(tmp).write_text(json.dumps([{c: r.get(c) for c in cols} for r in rows],
                                                indent=1, default=_json_default))
    return files


def comparable(rows) -> list:
    """``rows`` without the columns that depend on where and when they ran
    (:data:`~.sweep_tasks.META_COLUMNS`), by point index: what a serial and a Dask run of the
    same spec must agree on exactly."""
    return sorted(({k: v for k, v in r.items() if k not in META_COLUMNS} for r in rows),
                  key=lambda r: r["point"])


def _base_pes(row):
    from ...config import preset
    return preset(row["base"]).pes


# == Pareto =========================================================================================

def pareto_front(xs, ys) -> list:
    """Indices of the points no other point dominates when ``x`` (cost, e.g. mm2) is to be
    small and ``y`` (benefit) large, sorted by ``x``."""
    order = sorted(range(len(xs)), key=lambda i: (xs[i], -ys[i]))
    front, best = [], float("-inf")
    for i in order:
        if ys[i] > best:
            front.append(i)
            best = ys[i]
    return front


#: The cost axis of the Pareto plots when no point has an area: the PE count.
FALLBACK_X = ("pes", "PEs (no die area in this sweep: tasks.area)")
#: The workload axes a model's points are drawn against when they all share one cost (a sweep
#: of the workload alone, e.g. over the context), in order of preference among those that vary
#: most; the axis label of each.
TREND_AXES = {"context": "context (tokens a sequence)", "batch": "batch (sequences)",
              "hb_gb": "HB capacity (GB)", "depth": "SD tree depth", "width": "SD tree width",
              "verify": "SD tree nodes verified", "alpha": "acceptance alpha",
              "zipf": "expert popularity Zipf exponent"}
_Y_AXES = (("tokens_per_s", "tokens/s", "throughput"),
           ("tokens_per_j", "tokens/J", "energy as Fig. 15: compute, memory, links, static"))


def swept_axes(spec: SweepSpec) -> set:
    """The axes ``spec`` gives more than one value, by their result columns: workload axes
    (``hb`` as the ``hb_gb`` column that holds its capacity) and config fields (every one a
    random or Latin-hypercube sampling draws more than once)."""
    out = {"hb_gb" if a == "hb" else a for a, axis in spec.workload.items()
           if len(axis.get("values", ())) > 1}
    sampled = spec.sampling != "grid" and (spec.samples or 0) > 1
    return out | {f for f, axis in spec.config.items()
                  if sampled or len(axis.get("values", ())) > 1}


def _axis_file(axis: str) -> str:
    """An axis as its plot's file names it (``by-hb-<model>.png`` for ``hb_gb``,
    ``by-tile_rows-...`` for ``tile.rows``)."""
    return "hb" if axis == "hb_gb" else axis.replace(".", "_")


def _config_axes(swept) -> list:
    """The swept config fields among ``swept`` (None: none known), in
    :data:`~.sweep_spec.CONFIG_FIELDS`' order (``tile.rows`` before ``tile.lanes``)."""
    if not swept:
        return []
    fields = swept - set(WORKLOAD_FIELDS) - {"hb_gb"}
    return sorted(fields, key=lambda f: (CONFIG_FIELDS.index(f) if f in CONFIG_FIELDS
                                         else len(CONFIG_FIELDS), f))


def _axis_label(axis: str) -> str:
    return TREND_AXES.get(axis) or f"{axis} (swept config field)"


def pareto_plots(rows, out_dir, *, axes=None, earlier=(), outputs=None,
                 draw: bool = True) -> dict:
    """Per model, ``pareto-<model>.png``: tokens/s and tokens/J against the die's mm2 of every
    point with an area and perf figures (without any area in the sweep: against the PE count,
    :data:`FALLBACK_X`, and the axis says so), the Pareto front of each batch drawn as a line
    (the schemes of a batch share one: they are alternatives for the same workload).

    A model whose points all share one cost (a sweep of the workload, or of config fields that
    move neither the area nor the PE count) has no front to draw: its plot is
    ``by-<axis>-<model>.png`` instead (``by-hb-...`` for the HB capacity), tokens/s and
    tokens/J against the workload axis of :data:`TREND_AXES` with the most values among
    ``axes`` (the swept ones, :func:`swept_axes`, config fields included; None: every column),
    or, when no workload axis varies, the swept config field with the most values
    (``by-tile_rows-...`` for ``tile.rows``), a line for each combination of the other swept
    axes and config fields that vary (not a config field that follows the x axis, as
    ``tile.lanes`` follows ``tile.rows`` under ``lanes == 2 * rows``), the scheme always (a derived column such as a point's Table 3 alpha, which varies with the
    batch, is no axis of its own). A config field with more than :data:`MAX_LINE_VALUES`
    values (sampled) is the x axis when it has more values than the workload axis, and
    otherwise the points' colour: dots a line key, no lines, a colour bar. The title counts the points drawn and those without a
    number on the axis. A model's plot of the other kind in ``out_dir`` and the plots of
    ``earlier`` (an earlier run's, as its ``sweep.json`` lists them: models no longer swept,
    another spec's) that this run did not draw are removed; no other file is touched. The
    plots are written and the old ones removed all at once (``outputs``: an
    :class:`~elmoe3d.cli.outputs.AtomicOutputs` the caller commits, or committed here).
    ``draw`` False (``--no-plots``): nothing is drawn and those plots are removed all the
    same.

    Returns ``{"pareto:<model>" or "by-<axis>:<model>": path}`` (nothing for a sweep without
    perf figures)."""
    done = [r for r in rows if not r.get("error") and r.get("tokens_per_s") is not None]
    xkey, xlabel = "die_mm2", "logic die area (mm²)"
    pts = [r for r in done if r.get(xkey) is not None]
    if not pts:
        xkey, xlabel = FALLBACK_X
        pts = [dict(r, pes=r["pes"] if r.get("pes") is not None else _base_pes(r))
               for r in done]
    files = {}
    with _writing(outputs) as outputs:
        if pts and draw:
            files = _draw_plots(pts, out_dir, xkey, xlabel, axes, outputs)
        keep = {p.name for p in files.values()}
        models = {r["model"] for r in pts}
        trend = [*TREND_AXES, *_config_axes(None if axes is None else set(axes))]
        other_kind = [f"{kind}-{m}.png" for m in models
                      for kind in ["pareto", *(f"by-{_axis_file(a)}" for a in trend)]]
        for name in [*other_kind, *(Path(p).name for p in earlier)]:
            if name not in keep and _PLOT_NAME.fullmatch(name):     # an earlier run's plot
                outputs.remove_on_commit(Path(out_dir) / name)
    return files


#: The names :func:`pareto_plots` writes (the only files it removes).
_PLOT_NAME = re.compile(r"(pareto|by-[a-z0-9_]+)-[^/\\]+\.png")


def _draw_plots(pts, out_dir, xkey, xlabel, axes, outputs) -> dict:
    """:func:`pareto_plots`' drawing of the rows ``pts`` (each with ``xkey``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.collections
    import matplotlib.pyplot as plt
    files = {}
    swept = None if axes is None else set(axes)
    for model in sorted({r["model"] for r in pts}):
        mine = [r for r in pts if r["model"] == model]
        axis = _trend_axis(mine, swept) if len({r[xkey] for r in mine}) == 1 else None
        fig, panels = plt.subplots(1, 2, figsize=(11, 4.4))
        for ax, (key, label, title) in zip(panels, _Y_AXES):
            good = [r for r in mine if r.get(key) is not None]
            if axis is None:
                _pareto_axes(ax, good, xkey, key, swept)
                ax.set_xlabel(xlabel)
            else:
                _trend_axes(ax, good, axis, key, swept)
                ax.set_xlabel(_axis_label(axis))
            ax.set_ylabel(label)
            ax.set_title(title, fontsize=9)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
        unnamed, rect = _legends(fig, panels)
        count = f"{len(mine)} points"
        if axis is not None:
            drawn = sum(1 for r in mine if _numeric(r.get(axis)))
            count = (f"{drawn} points" if drawn == len(mine) else
                     f"{drawn} of {len(mine)} points ({len(mine) - drawn} without a {axis})")
            count += (f", all on one die of {mine[0][xkey]:g} mm²" if xkey == "die_mm2"
                      else f", all on {mine[0][xkey]} PEs")
        if unnamed:
            count += f"; {unnamed} legend entries, too many to tell apart: no legend " \
                "(results.csv)"
        fig.suptitle(f"{model}: {count}")
        with warnings.catch_warnings():         # a crowded figure: laid out as well as it goes
            warnings.simplefilter("ignore", UserWarning)
            fig.tight_layout(rect=rect)
        kind = "pareto" if axis is None else f"by-{_axis_file(axis)}"
        stem = f"{kind}-{model}"
        path = Path(out_dir) / f"{stem}.png"
        try:
            fig.savefig(outputs.temp_for(path), dpi=90, format="png")
        finally:
            plt.close(fig)
        files[f"{kind}:{model}"] = path
    return files


#: Legend entries a plot names at most: beyond, line colours and styles repeat (10 colours x
#: 4 styles) and a legend could not tell the lines apart; the plot is drawn without one and
#: its title says so. Up to 8 entries each panel has its own legend; more, one legend under
#: both panels. Dots coloured by a field (a colour bar) have only their 10 marker shapes in
#: the legend: :data:`MAX_MARKER_LEGEND`.
MAX_LEGEND = 40
MAX_MARKER_LEGEND = 10


def _legends(fig, panels) -> tuple:
    """The legends of a plot's two panels (their entries are the same: the first panel's are
    used): per panel, under both, or none (:data:`MAX_LEGEND`, :data:`MAX_MARKER_LEGEND`).
    Returns the count of entries left unnamed (0 when the legend names them) and the
    rectangle of the figure left to the panels (``tight_layout``'s ``rect``)."""
    import matplotlib.collections
    handles, labels = panels[0].get_legend_handles_labels()
    n = len(labels)
    shaded = sum(1 for h in handles if isinstance(h, matplotlib.collections.PathCollection)
                 and h.get_array() is not None)
    crowded = n > MAX_LEGEND or shaded > MAX_MARKER_LEGEND
    legends, rect = [], (0, 0, 1, 1)
    if 0 < n <= 8 and not crowded:
        legends = [ax.legend(fontsize=7) for ax in panels]
    elif 8 < n and not crowded:
        ncol = 3 if max(map(len, labels)) > 40 else 4
        rows = -(-n // ncol)
        below = 0.17 * rows + 0.2                           # inches of legend
        fig.set_figheight(fig.get_figheight() + below)
        legends = [fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=7,
                              frameon=False)]
        rect = (0, below / fig.get_figheight(), 1, 1)
    for legend in legends:
        for handle in legend.legend_handles:    # a colour-mapped marker: its shape only
            if isinstance(handle, matplotlib.collections.PathCollection) \
                    and handle.get_array() is not None:
                handle.set_array(None)
                handle.set_color("0.35")
    return n if crowded else 0, rect


def _line_label(fields, values) -> str:
    """A line's legend entry: the scheme's name, ``field value`` for the others, a byte count
    in KiB / MiB / GiB (``hb_bank_bytes 128 MiB``), a field without a value (``depth`` of an
    AR point) left out; ``every point`` when nothing is left."""
    parts = []
    for a, v in zip(fields, values):
        if v is None:
            continue
        if a == "scheme":
            parts.append(str(v))
        elif a.endswith("_bytes") and _numeric(v):
            parts.append(f"{a} {_bytes_text(v)}")
        else:
            parts.append(f"{a} {v}")
    return ", ".join(parts) or "every point"


def _bytes_text(v) -> str:
    """``v`` bytes in the largest binary unit it is a whole number of (``128 MiB``)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if v >= 1 << shift and v % (1 << shift) == 0:
            return f"{v / (1 << shift):g} {unit}"
    return f"{int(v):,} B" if v == int(v) else f"{v:g} B"


def _shade_fields(rows, fields) -> list:
    """Those of ``fields`` (config fields) drawn as the points' colour rather than as lines:
    more than :data:`MAX_LINE_VALUES` numbers in ``rows`` (a sampled field), every value a
    number or None; the most values first."""
    return sorted((a for a in fields if _distinct_numbers(rows, a) > MAX_LINE_VALUES
                   and all(_numeric(r.get(a)) or r.get(a) is None for r in rows)),
                  key=lambda a: -_distinct_numbers(rows, a))


def _shaded_scatter(ax, rows, xkey, ykey, shade, scale, marker, label):
    """``rows`` as dots coloured by their ``shade`` field (``scale``, a matplotlib
    ``Normalize``), a row without a number there grey; returns the coloured collection (for
    the colour bar)."""
    have = [r for r in rows if _numeric(r.get(shade))]
    rest = [r for r in rows if not _numeric(r.get(shade))]
    dots = ax.scatter([r[xkey] for r in have], [r[ykey] for r in have], s=16,
                      c=[r[shade] for r in have], cmap="viridis", norm=scale, marker=marker,
                      label=label, edgecolors="none")
    if rest:
        ax.scatter([r[xkey] for r in rest], [r[ykey] for r in rest], s=16, c="0.6",
                   marker=marker, edgecolors="none")
    return dots


def _shade_scale(rows, shade):
    import matplotlib.colors
    values = [r[shade] for r in rows if _numeric(r.get(shade))]
    return matplotlib.colors.Normalize(min(values), max(values))


def _pareto_axes(ax, good, xkey, key, swept=None):
    """Every point, a colour a scheme, and each batch's front. A swept config field with more
    than :data:`MAX_LINE_VALUES` values (a sampled one, not the x axis) is the points' colour
    instead (a colour bar; a point without a number there grey) and the scheme their marker:
    points of one die that differ only in it were one dot (a new user's sweep)."""
    xs = [r[xkey] for r in good]
    ys = [r[key] for r in good]
    shade = next(iter(_shade_fields(good, [a for a in _config_axes(swept) if a != xkey])), None)
    scale = _shade_scale(good, shade) if shade else None
    for k, s in enumerate(sorted({r["scheme"] for r in good})):
        mine = [r for r in good if r["scheme"] == s]
        if shade is None:
            ax.scatter([r[xkey] for r in mine], [r[key] for r in mine], s=14, alpha=0.7,
                       label=s)
        else:
            dots = _shaded_scatter(ax, mine, xkey, key, shade, scale, "osD^v<>ph*"[k % 10], s)
    if shade:
        ax.figure.colorbar(dots, ax=ax, pad=0.01).set_label(shade, fontsize=7)
    # one front per batch: points of different batches are different workloads; a grey a
    # batch, dark to light, beside the four line styles (a fifth batch repeated the first's
    # style, a new user's sweep)
    batches = sorted({r.get("batch") for r in good}, key=lambda b: (b is None, b or 0))
    for k, b in enumerate(batches):
        sel = [i for i, r in enumerate(good) if r.get("batch") == b]
        front = [sel[i] for i in pareto_front([xs[i] for i in sel], [ys[i] for i in sel])]
        grey = 0.6 * k / max(len(batches) - 1, 1)
        ax.plot([xs[i] for i in front], [ys[i] for i in front], color=f"{grey:.2f}",
                ls=("-", "--", ":", "-.")[k % 4], lw=1, label=f"Pareto front, batch {b}")


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


#: A column with more distinct numbers than this is drawn as a continuum (the x axis, or the
#: points' colour), never as a line a value: random and Latin-hypercube sampling give every
#: point a value of its own, and a line (and a legend entry) each would bury the plot.
MAX_LINE_VALUES = 8


def _distinct_numbers(rows, a) -> int:
    return len({r[a] for r in rows if _numeric(r.get(a))})


def _trend_axis(rows, swept):
    """The axis of :data:`TREND_AXES` in ``swept`` (None: all) with the most distinct numeric
    values in ``rows`` (the first in its order on a tie); when none has two, the swept config
    field with the most (``tile.rows``, ``aggregation_gbps``: a sweep of fields that move
    neither the area nor the PE count, whose points would otherwise share one x); None when
    none has two either. A config field with more than :data:`MAX_LINE_VALUES` values (a
    sampled range) and more values than that workload axis is the x axis instead."""
    best = {}
    for kind, candidates in (("workload", [a for a in TREND_AXES if swept is None or a in swept]),
                             ("config", _config_axes(swept))):
        counts = {a: _distinct_numbers(rows, a) for a in candidates}
        a = max(counts, key=lambda a: counts[a], default=None)     # keeps the first of equals
        if a is not None and counts[a] > 1:
            best[kind] = (a, counts[a])
    workload, config = best.get("workload"), best.get("config")
    if config and (workload is None or (config[1] > MAX_LINE_VALUES and config[1] > workload[1])):
        return config[0]
    return workload[0] if workload else None


def _follows(rows, a, axis) -> bool:
    """Whether column ``a`` and ``axis`` determine each other in ``rows`` (a field swept with
    the axis, as ``tile.lanes`` with ``tile.rows`` under ``lanes == 2 * rows``): then it
    makes no line of its own. One way is not enough: under random sampling every point has
    an x of its own, so any other field is a function of it."""
    def function(x, y):
        seen = {}
        return all(seen.setdefault(_hashable(r.get(x)), _hashable(r.get(y)))
                   == _hashable(r.get(y)) for r in rows)
    return function(axis, a) and function(a, axis)


def _trend_axes(ax, good, axis, key, swept):
    config = _config_axes(swept)
    others = [a for a in ("scheme", *TREND_AXES, *config)
              if a != axis and (a == "scheme" or swept is None or a in swept)
              and len({_hashable(r.get(a)) for r in good}) > 1]
    # a sampled config field (more values than lines can show) is the points' colour, not
    # lines; a row without a number there is drawn grey
    shades = _shade_fields(good, [a for a in others if a in config])
    others = [a for a in others
              if a not in shades and not (a in config and _follows(good, a, axis))]
    lines = {}
    for r in good:
        if _numeric(r.get(axis)):
            lines.setdefault(tuple(_hashable(r.get(a)) for a in others), []).append(r)
    def order(item):                # numbers as numbers: batch 4 before batch 16
        return tuple((0, v, "") if _numeric(v) else (1, 0, str(v)) for v in item[0])
    scale = _shade_scale([r for rs in lines.values() for r in rs], shades[0]) if shades \
        else None
    for k, (group, rs) in enumerate(sorted(lines.items(), key=order)):
        rs.sort(key=lambda r: r[axis])
        label = _line_label(others, group)
        if scale is None:
            ax.plot([r[axis] for r in rs], [r[key] for r in rs], marker="o", ms=3, lw=1,
                    ls=("-", "--", ":", "-.")[k // 10 % 4], label=label)
        else:                       # no line: its neighbours differ in the colour's field
            dots = _shaded_scatter(ax, rs, axis, key, shades[0], scale, "osD^v<>ph*"[k % 10],
                                   label)
    if scale is not None:
        also = f"; also varying: {', '.join(shades[1:])}" if shades[1:] else ""
        ax.figure.colorbar(dots, ax=ax, pad=0.01).set_label(f"{shades[0]}{also}", fontsize=7)
    xs = sorted({r[axis] for r in good if _numeric(r.get(axis))})
    if not xs:
        return
    if axis in ("context", "batch") and xs[0] > 0 and xs[-1] >= 4 * xs[0]:
        ax.set_xscale("log", base=2)
    if len(xs) <= 12:
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()

"""``elmoe3d sweep`` (elmoe3d/cli/sweep.py, elmoe3d.sw.host.sweep*): a 2-worker LocalCluster
equal to a serial run, a worker killed mid-task, a resumed sweep, a failing task recorded beside
its point, bad specs as one exact line, sampling and constraints, the RTL task on the smallest
tile. Nothing here is timed: runs are compared and counted. Seeds are fixed in the specs (and
printed by the sweep)."""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import shutil
import socket
import sys
from pathlib import Path

import pytest

import elmoe3d.cli as cli
from elmoe3d.sw.host import paper_eval as pe
from elmoe3d.cli import sweep as sweep_cli
from elmoe3d.sw.host import sweep_tasks
from elmoe3d.sw.host.sweep import comparable, pareto_front, run_sweep
from elmoe3d.sw.host.sweep_spec import ExprError, compile_expr, expand, load_spec, parse_spec
from elmoe3d.errors import UserError


#: 2 configs x 2 models x 2 batches x 3 schemes = 24 perf points.
SPEC = """\
name: t
seed: 11
config:
  pes: [16, 32]
workload:
  model: [qwen3-30b-a3b, gpt-oss-20b]
  batch: [1, 16]
  scheme: [ar, elastic, eagle]
"""


def _write(tmp_path, text, name="spec.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _quiet(*_):
    pass


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The serial reference run of :data:`SPEC` (in this process)."""
    d = tmp_path_factory.mktemp("serial")
    spec = _write(d, SPEC)
    res = run_sweep(spec, d / "out", workers=0, cache_dir=d / "cache", progress=False,
                    plots=False, say=_quiet)
    assert res.points == 24 and res.ran == 24 and res.errors == 0
    return res


# == Dask ===========================================================================================

def test_two_workers_equal_a_serial_run_from_any_folder(serial, tmp_path, monkeypatch):
    """A 2-worker LocalCluster reached through its scheduler's address (``--scheduler``),
    started from /tmp: the workers need neither the checkout nor its folder."""
    from distributed import LocalCluster
    monkeypatch.chdir("/tmp")
    spec = _write(tmp_path, SPEC)
    lines = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster:
        res = run_sweep(spec, tmp_path / "out", scheduler=cluster.scheduler_address,
                        cache_dir=tmp_path / "cache", progress=False, say=lines.append,
                        chunk=3)
    assert res.workers == 2 and res.ran == 24 and res.errors == 0
    assert res.dashboard and res.dashboard.startswith("http://")
    assert any("dashboard http://" in line for line in lines)
    assert any("seed 11" in line for line in lines)
    assert comparable(res.rows) == comparable(serial.rows)
    assert len({r["pid"] for r in res.rows}) == 2            # both workers ran points
    # the consolidated tables hold the same rows
    import pyarrow.parquet as pq
    table = pq.read_table(res.files["parquet"]).to_pylist()
    full = [{k: r.get(k) for k in table[0]} for r in res.rows]   # absent figures are null
    assert comparable(table) == comparable(full)
    assert comparable(json.loads(res.files["json"].read_text())) == comparable(full)
    assert len(res.files["csv"].read_text().splitlines()) == 25


#: Where :func:`die_once` leaves its marker (set by the test, read in the worker).
MARKER_ENV = "ELMOE3D_TEST_SWEEP_MARKER"


def die_once(point, cache_dir):
    """A point task that kills its own worker process the first time it meets point 5 (the
    marker file, holding the dying process id, says it happened), then runs the point."""
    marker = Path(os.environ[MARKER_ENV])
    if point.index == 5 and not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(1)
    return sweep_tasks.run_point(point, cache_dir)


def test_a_killed_worker_loses_nothing(serial, tmp_path, monkeypatch):
    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    marker = tmp_path / "died"
    monkeypatch.setenv(MARKER_ENV, str(marker))       # the workers inherit it
    spec = _write(tmp_path, SPEC)
    res = run_sweep(spec, tmp_path / "out", workers=2, cache_dir=tmp_path / "cache",
                    progress=False, dashboard=":0", say=_quiet, task=die_once, chunk=2)
    assert marker.exists(), "the task never killed its worker"
    dead = int(marker.read_text())
    assert res.ran == 24 and res.errors == 0
    row5 = next(r for r in res.rows if r["point"] == 5)
    assert row5["pid"] != dead                        # rerun by another worker process
    assert comparable(res.rows) == comparable(serial.rows)


def test_closed_connections_are_not_logged_other_errors_are(capsys):
    """A new user's sweep (2026-12-07) ended, complete, under a worker's 20-line
    ``CommClosedError`` traceback (its heartbeat in flight as the cluster closed). Records of
    a closed connection, as the exception or its explicit cause, are left out, on the named
    loggers and on the child loggers of ``distributed`` (through its handler); any other
    error still shows, one raised while a closed connection was handled too (a review's
    finding). The filters come off again (the client's process is the user's)."""
    import logging
    from distributed.comm.core import CommClosedError
    from tornado.iostream import StreamClosedError
    base = logging.getLogger("distributed")
    handler = logging.StreamHandler(sys.stderr)
    base.addHandler(handler)
    tornado_log = logging.getLogger("tornado.application")
    tornado_log.addHandler(handler)
    child = logging.getLogger("distributed.worker.memory")     # no filter of its own

    def log_error(logger, exc, *, cause=True, then=None):
        try:
            try:
                raise exc
            except Exception as inner:
                if cause:
                    raise RuntimeError("wrapped") from inner
                raise (then or RuntimeError)("while handling it")
        except Exception:
            logger.exception(f"logged {type(exc).__name__} cause={cause} then={then}")
    undo = sweep_tasks.quiet_closed_connections()
    try:
        assert sweep_tasks.quiet_closed_connections()() is None    # idempotent: adds none
        assert tornado_log.filters.count(sweep_tasks._not_a_closed_connection) == 1
        for logger in (tornado_log, child):
            log_error(logger, CommClosedError("in <TCP (closed) heartbeat_worker>"))
            log_error(logger, StreamClosedError())
            log_error(logger, ValueError("a real error"))
            log_error(logger, CommClosedError("closed"), cause=False, then=AttributeError)
        err = capsys.readouterr().err
        assert "heartbeat" not in err and "logged StreamClosedError" not in err
        assert "logged CommClosedError cause=True" not in err
        assert err.count("logged ValueError cause=True then=None") == 2
        assert err.count("AttributeError: while handling it") == 2
    finally:
        undo()
        base.removeHandler(handler)
        tornado_log.removeHandler(handler)
    assert sweep_tasks._not_a_closed_connection not in tornado_log.filters
    assert sweep_tasks._not_a_closed_connection not in handler.filters
    base.addHandler(handler)
    try:
        log_error(child, StreamClosedError())
    finally:
        base.removeHandler(handler)
    assert "StreamClosedError" in capsys.readouterr().err


def always_die(point, cache_dir):
    """A point task that kills its worker process whenever it meets the last point (11)."""
    if point.index == 11:
        os._exit(1)
    return sweep_tasks.run_point(point, cache_dir)


def test_a_point_that_always_kills_its_worker_gets_an_error_row(tmp_path):
    """After allowed-failures (0 here: one death) the chunks the dying worker held are given
    up; their points run again one a task, one in flight a worker, and the poisonous point is
    given up once more: it alone gets an error row, every other point is done, the tables and
    sweep.json are written as complete, and a rerun with a sound task runs just that point."""
    import cloudpickle
    import dask
    # distributed's defaults into dask's config first: a config.set of a "distributed." key
    # made before they are there removes the whole "distributed" table on exit, and the next
    # cluster in this process fails with KeyError 'comm' (seen in a two-worker run of four
    # test files)
    importlib.import_module("distributed")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spec = _write(tmp_path, SPEC.replace("pes: [16, 32]", "pes: [16]"))
    out = tmp_path / "out"
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        res = run_sweep(spec, out, workers=1, cache_dir=tmp_path / "cache", progress=False,
                        dashboard=":0", say=_quiet, task=always_die, chunk=2, plots=False)
    assert (res.points, res.ran) == (12, 12)
    bad = sorted(r["point"] for r in res.rows if r.get("error"))
    assert bad == [11]
    errs = [r["error"] for r in res.rows if r["error"]]
    assert errs[0].startswith("dask: KilledWorker"), errs
    assert all(r.get("tokens_per_s") for r in res.rows if r["point"] < 11)
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["status"] == "complete" and doc["errors"] == 1
    assert len(json.loads((out / "results.json").read_text())) == 12
    again = run_sweep(spec, out, workers=0, cache_dir=tmp_path / "cache", progress=False,
                      say=_quiet, plots=False)
    assert (again.ran, again.skipped, again.errors) == (1, 11, 0)


# == resuming and failing tasks =======================================================================

def test_a_rerun_skips_finished_points_and_reruns_failed_ones(serial, tmp_path, monkeypatch):
    spec = _write(tmp_path, SPEC.replace("batch: [1, 16]", "batch: [1]"))
    out, cache = tmp_path / "out", tmp_path / "cache"
    real = sweep_tasks.perf_task

    def failing(point, cache_dir=None):
        if point.index == 2:
            raise RuntimeError("injected failure")
        return real(point, cache_dir)
    monkeypatch.setattr(sweep_tasks, "perf_task", failing)
    first = run_sweep(spec, out, workers=0, cache_dir=cache, progress=False, say=_quiet,
                      plots=False)
    assert (first.points, first.ran, first.skipped, first.errors) == (12, 12, 0, 1)
    bad = next(r for r in first.rows if r["point"] == 2)
    assert bad["error"] == "perf: RuntimeError: injected failure"
    assert bad.get("tokens_per_s") is None
    monkeypatch.setattr(sweep_tasks, "perf_task", real)
    # the same spec again: 11 finished points skipped, the failed one run again
    again = run_sweep(spec, out, workers=0, cache_dir=cache, progress=False, say=_quiet,
                      plots=False)
    assert (again.ran, again.skipped, again.errors) == (1, 11, 0)
    # a larger spec in the same folder: the 12 finished points are skipped, 12 new ones run
    spec.write_text(SPEC)
    more = run_sweep(spec, out, workers=0, cache_dir=cache, progress=False, say=_quiet,
                      plots=False)
    assert (more.points, more.ran, more.skipped, more.errors) == (24, 12, 12, 0)
    assert comparable(more.rows) == comparable(serial.rows)
    assert len(list((out / "points").glob("*.json"))) == 24


def test_another_specs_out_folder_is_said_and_its_plots_replaced(tmp_path):
    """A new user's trial (2026-12-06): ``--out`` onto another spec's folder mixed the two
    sweeps without a word (results.* this spec's, three of the other's plots left beside). The
    first line now says the folder held another spec's sweep; its rows stay (the points this
    spec shares reuse them), every plot is this run's."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    one = _write(tmp_path, SPEC.replace("pes: [16, 32]", "pes: [16]")
                 .replace("batch: [1, 16]", "batch: [1]"), "one.yaml")
    kw = dict(workers=0, cache_dir=cache, progress=False)
    said = []
    first = run_sweep(one, out, say=said.append, **kw)
    assert not any("another spec" in line for line in said)
    plots = sorted(p.name for p in out.glob("*.png"))
    assert len(plots) == len({r["model"] for r in first.rows}) >= 2
    rows = len(list((out / "points").glob("*.json")))
    model = first.rows[0]["model"]
    two = _write(tmp_path, f"name: two\nworkload:\n  model: [{model}]\n  scheme: [ar]\n"
                           f"  batch: [1]\n", "two.yaml")
    said.clear()
    second = run_sweep(two, out, say=said.append, **kw)
    assert said[0] == (f"{out.resolve()}: held the sweep 't' of another spec "
                       f"(or an earlier version of this one): its finished rows stay, those "
                       f"of this spec's points are reused; its tables and plots are replaced "
                       f"by this run's")
    assert sorted(p.name for p in out.glob("*.png")) == [f"pareto-{model}.png"]
    assert len(json.loads((out / "results.json").read_text())) == second.points
    assert len(list((out / "points").glob("*.json"))) >= rows
    said.clear()                                # the same spec again: nothing to say
    run_sweep(two, out, say=said.append, **kw)
    assert not any("another spec" in line for line in said)
    # --no-plots replaces the plots too: none left showing another run's rows (a new user's
    # finding, 2026-12-07: the three plots of the earlier run stayed, no longer listed);
    # a user's own file stays
    (out / "pareto-efficiency-2024.png").write_bytes(b"mine")
    run_sweep(one, out, say=_quiet, plots=False, **kw)
    assert sorted(p.name for p in out.glob("*.png")) == ["pareto-efficiency-2024.png"]
    # ... after an interrupted run too, whose sweep.json ("running", then "interrupted")
    # still lists the plots it found (a review's finding: it listed none, so they stayed)
    run_sweep(one, out, say=_quiet, **kw)                  # every model of one.yaml's
    drawn = sorted(p.name for p in out.glob("*.png"))
    assert len(drawn) == len(plots) + 1

    def stop(point, cache_dir):
        raise KeyboardInterrupt
    shutil.rmtree(out / "points")
    with pytest.raises(KeyboardInterrupt):
        run_sweep(two, out, say=_quiet, task=stop, **kw)
    assert json.loads((out / "sweep.json").read_text())["status"] == "interrupted"
    assert sorted(p.name for p in out.glob("*.png")) == drawn
    run_sweep(two, out, say=_quiet, plots=False, **kw)
    assert sorted(p.name for p in out.glob("*.png")) == ["pareto-efficiency-2024.png"]


def test_a_second_sweep_into_a_busy_out_folder_is_refused(tmp_path):
    """A new user ran two sweeps into one out folder side by side, without a word: they
    would write one sweep.json and one set of tables. A run holds ``out/.lock`` (``flock``);
    a second is one line naming the folder and the holder, and leaves the first's files as
    they were; once the first has ended, the folder is free."""
    import fcntl
    from elmoe3d.sw.host.sweep import LOCK_NAME
    spec = _write(tmp_path, "name: one\nworkload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n"
                            "  batch: [1]\n")
    out = tmp_path / "out"
    kw = dict(workers=0, cache_dir=tmp_path / "cache", progress=False, plots=False, say=_quiet)
    run_sweep(spec, out, **kw)
    before = (out / "sweep.json").read_text()
    with open(out / LOCK_NAME, "a+") as held:           # the first sweep, still running
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.truncate(0)
        held.write("pid 4242 on host\n")
        held.flush()
        with pytest.raises(UserError) as info:
            run_sweep(spec, out, **kw)
        assert str(info.value) == (f"{out.resolve()}: another sweep is running into this out "
                                   f"folder (pid 4242 on host); wait for it to end or give "
                                   f"another --out")
        assert (out / "sweep.json").read_text() == before
    assert run_sweep(spec, out, **kw).skipped == 1      # released: the folder is free
    assert (out / LOCK_NAME).read_text() == f"pid {os.getpid()} on {socket.gethostname()}\n"
    # two real runs (a review's finding: a shared lock passed the lines above): the first
    # run's task starts the second, into the same folder, new or earlier
    for where in (tmp_path / "new", out):
        said = []

        def task(point, cache_dir):
            with pytest.raises(UserError, match="another sweep is running into this out "
                                                rf"folder \(pid {os.getpid()} on "):
                run_sweep(spec, where, **kw)
            said.append(point.index)
            return sweep_tasks.run_point(point, cache_dir)
        shutil.rmtree(where / "points", ignore_errors=True)
        run_sweep(spec, where, task=task, **kw)
        assert said == [0]
    # a filesystem without flock: the run goes on, unlocked, and says so
    import errno
    real = fcntl.flock

    def no_locks(f, op):
        raise OSError(errno.ENOLCK, "No locks available")
    fcntl.flock = no_locks
    try:
        lines = []
        run_sweep(spec, out, **dict(kw, say=lines.append))
    finally:
        fcntl.flock = real
    assert lines[0] == (f"note: {out.resolve()}: this filesystem does not lock files (No locks "
                        f"available): the run goes on unlocked; run one sweep at a time into "
                        f"this folder")


def test_a_sweep_into_a_folder_of_ones_own_files_removes_none(tmp_path):
    """A review (2026-12-06): the first form of the change above removed every pareto-*.png
    and by-*.png of the out folder, a user's own files included. Only the plots a sweep.json
    lists (and a swept model's plot of the other kind) are removed."""
    out = tmp_path / "mine"
    out.mkdir()
    own = {"by-night.png": b"1", "pareto-efficiency-2024.png": b"2", "holiday.png": b"3"}
    for name, data in own.items():
        (out / name).write_bytes(data)
    spec = _write(tmp_path, "name: one\nworkload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n"
                            "  batch: [1]\n")
    run_sweep(spec, out, workers=0, cache_dir=tmp_path / "cache", progress=False, say=_quiet)
    assert {n: (out / n).read_bytes() for n in own} == own
    assert (out / "pareto-qwen3-30b-a3b.png").exists()


def test_rows_of_other_code_are_run_again(tmp_path, monkeypatch):
    """A row stores the code it came from (the package's source digest and tool versions); a
    rerun after a code change runs every point again instead of keeping stale figures."""
    from elmoe3d.sim import runner
    spec = _write(tmp_path, SPEC.replace("pes: [16, 32]", "pes: [16]")
                  .replace("batch: [1, 16]", "batch: [1]"))
    out, cache = tmp_path / "out", tmp_path / "cache"
    kw = dict(workers=0, cache_dir=cache, progress=False, plots=False)
    first = run_sweep(spec, out, say=_quiet, **kw)
    assert (first.ran, first.skipped) == (6, 0)
    assert run_sweep(spec, out, say=_quiet, **kw).skipped == 6
    monkeypatch.setattr(runner, "source_digest", lambda: "an edited source file")
    lines = []
    changed = run_sweep(spec, out, say=lines.append, **kw)
    assert (changed.ran, changed.skipped, changed.errors) == (6, 0, 0)
    assert "6 rows from other code rerun" in lines[0]
    assert {r["code"] for r in changed.rows} != {r["code"] for r in first.rows}
    assert run_sweep(spec, out, say=_quiet, **kw).skipped == 6


def test_sweep_json_says_running_until_the_end(tmp_path, monkeypatch):
    """sweep.json is "running" while the points run (tables of an earlier run are not
    current) and "complete" once the tables are written."""
    spec = _write(tmp_path, SPEC.replace("pes: [16, 32]", "pes: [16]")
                  .replace("batch: [1, 16]", "batch: [1]"))
    out = tmp_path / "out"
    seen = []

    def task(point, cache_dir):
        seen.append(json.loads((out / "sweep.json").read_text())["status"])
        return sweep_tasks.run_point(point, cache_dir)
    run_sweep(spec, out, workers=0, cache_dir=tmp_path / "c", progress=False, plots=False,
              say=_quiet, task=task)
    assert seen == ["running"] * 6
    assert json.loads((out / "sweep.json").read_text())["status"] == "complete"
    assert not list(out.glob(".*.tmp")) and not list((out / "points").glob(".*.tmp"))


def test_an_interrupted_sweep_says_so_with_the_outputs_mode(tmp_path):
    """Ctrl-C during the points: sweep.json says "interrupted" (not "running" for ever), with
    the rows finished so far; it and the rows have the mode every output file gets (0o666 less
    the umask, as results.*), not a private temporary file's 0o600."""
    import stat
    spec = _write(tmp_path, SPEC.replace("pes: [16, 32]", "pes: [16]")
                  .replace("batch: [1, 16]", "batch: [1]"))
    out = tmp_path / "out"
    calls = []

    def task(point, cache_dir):
        calls.append(point)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return sweep_tasks.run_point(point, cache_dir)
    saved = os.umask(0o022)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_sweep(spec, out, workers=0, cache_dir=tmp_path / "c", progress=False,
                      plots=False, say=_quiet, task=task)
        doc = json.loads((out / "sweep.json").read_text())
        assert doc["status"] == "interrupted" and doc["points"] == 6 and doc["finished"] == 2
        run_sweep(spec, out, workers=0, cache_dir=tmp_path / "c", progress=False, plots=False,
                  say=_quiet)
    finally:
        os.umask(saved)
    assert json.loads((out / "sweep.json").read_text())["status"] == "complete"
    for f in [out / "sweep.json", out / "results.csv", *(out / "points").iterdir()]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f


def test_an_unwritable_out_folder_is_one_line(tmp_path):
    spec = _write(tmp_path, SPEC.replace("pes: [16, 32]", "pes: [16]"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"^--out .*/file/out: cannot make the out folder: "
                                        r".*/file is a file, not a folder$"):
        run_sweep(spec, tmp_path / "file" / "out", workers=0, cache_dir=tmp_path / "c",
                  progress=False, plots=False, say=_quiet)


def test_cli_run_writes_the_tables_and_exits_1_on_a_failed_point(tmp_path, capsys,
                                                                  monkeypatch):
    spec = _write(tmp_path, SPEC.replace("pes: [16, 32]", "pes: [16]"))
    out = tmp_path / "o"
    assert cli.main(["sweep", str(spec), "--workers", "0", "--out", str(out),
                     "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "12 points, 12 run" in text and "0 with an error" in text
    for name in ("results.parquet", "results.csv", "results.json", "sweep.json"):
        assert (out / name).is_file(), name
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["seed"] == 11 and doc["points"] == 12

    def broken(point, cache_dir=None):
        raise ValueError("no model here")
    monkeypatch.setattr(sweep_tasks, "perf_task", broken)
    assert cli.main(["sweep", str(spec), "--workers", "0", "--out", str(tmp_path / "o2"),
                     "--no-progress", "--no-plots"]) == 1
    text = capsys.readouterr().out
    assert "12 with an error" in text
    assert "error at point 0: perf: ValueError: no model here" in text


def test_the_rate_line_of_a_run_with_nothing_to_run_or_in_process(tmp_path, capsys):
    """The last line says "in this process" for --workers 0 and, for a rerun that has nothing
    to do, no rate at all (not "0.0 points/s on no Dask worker(s)")."""
    spec = _write(tmp_path, SPEC.replace("pes: [16, 32]", "pes: [16]"))
    argv = ["sweep", str(spec), "--workers", "0", "--out", str(tmp_path / "o"), "--no-progress",
            "--no-plots"]
    assert cli.main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "12 run (" in text and "points/s in this process)" in text and "Dask" not in text
    assert cli.main(argv) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "sweep t: 12 points, none to run (12 finished before), 0 with an error" in text
    assert "points/s" not in text


# == the perf task is the paper model ==============================================================

def test_a_paper_point_is_table3(tmp_path):
    """A point on the unchanged paper-4gb preset at the paper's alpha and tree gives Table 3's
    Phi_AR and Phi_SD (the same model through ``platform(arch=)``)."""
    d, w, v = pe.TREE
    spec = parse_spec({"workload": {"model": ["qwen3-30b-a3b"], "batch": [4],
                                    "scheme": ["eagle"], "alpha": [0.33], "depth": [d],
                                    "width": [w], "verify": [v], "hb": ["4gb"]}}, path="t.yaml")
    (point,) = expand(spec)
    got = sweep_tasks.perf_task(point)
    row = next(r for r in pe.table3("4gb") if r["model"] == "qwen3-30b-a3b"
               and r["scheme"] == "eagle" and r["batch"] == 4)
    assert got["phi_ar"] == pytest.approx(row["phi_ar"], rel=1e-12)
    assert got["phi_sd"] == pytest.approx(row["phi_sd"], rel=1e-12)
    assert got["slots"] == pytest.approx(row["slots"], rel=1e-12)
    assert got["tokens_per_s"] == pytest.approx(
        max(4 / (row["ar_ms_token"] * 4e-3), 1e3 / row["sd_ms_token"]), rel=1e-9)
    # energy: each mode's access energy as Table 3's rows, the point's whole energy (Fig. 15)
    assert got["ar_pj_token"] == pytest.approx(row["ar_pj_token"], rel=1e-12)
    assert got["sd_pj_token"] == pytest.approx(row["sd_pj_token"], rel=1e-12)
    ours = pe.platform("ours", "4gb")
    em = pe.EvalModel("qwen3-30b-a3b", ours, "eagle", batch=4)
    whole = (sum(em.sd(0.33, d, w, v).energy_per_token.values()) if got["mode"] == "sd"
             else sum(em.ar().energy(ours).values()) / 4)
    assert got["pj_per_token"] == pytest.approx(whole, rel=1e-12)
    assert got["access_pj_per_token"] == pytest.approx(
        row["sd_pj_token"] if got["mode"] == "sd" else row["ar_pj_token"], rel=1e-12)
    assert got["tokens_per_j"] == pytest.approx(1e12 / whole, rel=1e-12)


def test_a_swept_dram_background_moves_the_energy_alone():
    """``hb_background_mw_per_gb`` and ``ext_background_mw_per_gb`` are perf fields: a point's
    whole energy a token grows by its DRAM's background power x the seconds a token (review
    finding: nothing swept them); speed, the logic die's leakage and the access energy stay."""
    spec = parse_spec({"config": {"ext_background_mw_per_gb": [0.0, 20.0],
                                  "hb_background_mw_per_gb": [0.0, 5.0]},
                       "workload": {"model": ["qwen3-30b-a3b"], "scheme": ["ar"]}},
                      path="t.yaml")
    assert sweep_cli._perf_blind(spec) == []
    got = {(p.arch().ext_background_mw_per_gb, p.arch().hb_background_mw_per_gb):
           sweep_tasks.perf_task(p) for p in expand(spec)}
    base = got[(0.0, 0.0)]
    for (ext, hb), r in got.items():
        assert r["tokens_per_s"] == base["tokens_per_s"]
        assert r["access_pj_per_token"] == base["access_pj_per_token"]
        extra = (64 * ext + 4 * hb) * 1e-3 / r["tokens_per_s"] * 1e12      # mW x s a token
        assert r["pj_per_token"] == pytest.approx(base["pj_per_token"] + extra, rel=1e-9)
    assert got[(20.0, 5.0)]["pj_per_token"] > got[(20.0, 0.0)]["pj_per_token"]


def test_more_pes_more_hb_bandwidth_and_peak():
    spec = parse_spec({"config": {"pes": [16, 32]}, "workload": {"model": ["qwen3-30b-a3b"],
                                                                 "scheme": ["ar"]}},
                      path="t.yaml")
    a, b = (sweep_tasks.perf_task(p) for p in expand(spec))
    # the logic die's static power: the measured figure for the unchanged preset, the
    # measured presets' mean per PE for another PE count
    pa, pb = (pe.platform("ours", arch=p.arch()) for p in expand(spec))
    from elmoe3d.synth.energy import DIE_ENERGY
    s4, s8 = (dict(DIE_ENERGY.static_mw)[name] for name in ("paper-4gb", "paper-8gb"))
    assert pa.static_mw == s4
    assert pb.static_mw == pytest.approx(32 * (s4 / 16 + s8 / 32) / 2)   # pes=32 on 4 GB
    assert b["hb_gbps"] == pytest.approx(2 * a["hb_gbps"])
    assert b["peak_tops_w4"] == pytest.approx(2 * a["peak_tops_w4"])
    assert b["hb_gb"] == 2 * a["hb_gb"] == 8


def test_check_refuses_an_out_folder_the_run_would_refuse(tmp_path, capsys):
    """``--check`` refused a bad ``--cache`` but not a bad ``--out`` (exit status 0 for a
    folder the run refuses: a new user's trial); it now says the run's words, making
    nothing."""
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n")
    for out, words in ((spec / "o", f"--out {spec / 'o'}: cannot make the out folder: "
                                      f"{spec} is a file, not a folder"),
                       (spec, f"--out {spec}: a file, not a folder")):
        assert cli.main(["sweep", str(spec), "--check", "--out", str(out)]) == 2
        assert capsys.readouterr().err.strip() == f"elmoe3d sweep: error: {words}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


def test_check_notes_the_points_the_lpddr5_cannot_hold(tmp_path, capsys):
    """``--check`` builds each perf point's two models (``capacity_check``) and notes, before
    any run, the points whose LPDDR5 cannot hold them on ours and on the xPU baseline alone,
    with the first of each; exit status 0 (the spec is valid). The workload's scheme is
    Elastic-SD (the default); the baseline runs AR."""
    spec = _write(tmp_path, "config:\n  ext_bytes: [68719476736]\nworkload:\n"
                            "  model: [qwen3-30b-a3b]\n  batch: [1, 16]\n"
                            "  context: [1024, 23552, 32768]\n")
    assert cli.main(["sweep", str(spec), "--check"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "6 valid points" in out
    assert ("note: 1 perf point(s) do not fit in their LPDDR5 on ours: their rows will be "
            "errors (first, point 5: qwen3-30b-a3b (elastic) at batch 16 and context 32768 on "
            "ours (4 GiB HB): needs 75.4 GiB of LPDDR5") in out
    assert ("note: 1 perf point(s) fit on ours but not on the xPU baseline: ours is measured, "
            "with no speedup (first, point 4: qwen3-30b-a3b (ar) at batch 16 and context 23552 "
            "on xpu: needs 64.7 GiB") in out
    (point,) = [p for p in expand(load_spec(spec)) if p.index == 0]
    assert sweep_tasks.capacity_check(point) == (None, None)
    # a spec whose points all fit says nothing of it
    spec.write_text("workload:\n  model: [qwen3-30b-a3b]\n  batch: [16]\n")
    assert cli.main(["sweep", str(spec), "--check"]) == 0
    assert "LPDDR5" not in capsys.readouterr().out
    # a run says so too, of the points without an xPU baseline (rows without an error)
    spec.write_text("workload:\n  model: [qwen3-30b-a3b]\n  batch: [16]\n  scheme: [ar]\n"
                    "  context: [23552]\n")
    assert cli.main(["sweep", str(spec), "--workers", "0", "--no-progress", "--no-plots",
                     "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1 points, 1 run" in out and "0 with an error" in out
    assert ("note: 1 point(s) without an xPU baseline (their LPDDR5 holds ours, not the xPU's: "
            "phi_ar, phi_sd and xpu_ms_token empty; first, point 0: xPU baseline: "
            "qwen3-30b-a3b (ar) at batch 16 and context 23552 on xpu: needs 64.7 GiB") in out


def test_a_point_the_lpddr5_cannot_hold_is_an_error_row(tmp_path):
    """A point whose EXT footprint exceeds its ``ext_bytes`` on ours (the model's LPDDR5
    capacity check, 2026-12-06) gets an error row naming the GiB needed, and the other points
    run; where ours fits but the xPU baseline does not (ours' HB holds part of the KV cache),
    ours is measured and the speedups are None with ``xpu_error`` saying why. Qwen3-30B-A3B,
    batch 16, AR, 64 GiB: a 32k context needs 75.4 GiB on ours at 4 GB (78.2 on the xPU); a
    23k one 61.9 on ours and 64.7 on the xPU; 128 GiB holds both."""
    spec = parse_spec({"config": {"ext_bytes": [64 << 30, 128 << 30]},
                       "workload": {"model": ["qwen3-30b-a3b"], "batch": [16],
                                    "scheme": ["ar"], "context": [23552, 32768]}},
                      path="t.yaml")
    rows = {(p.arch().ext_bytes >> 30, p.workload["context"]):
            sweep_tasks.run_point(p, tmp_path / "cache") for p in expand(spec)}
    assert len(rows) == 4
    bad = rows.pop((64, 32768))
    assert bad["error"].startswith("perf: CapacityError: qwen3-30b-a3b (ar) at batch 16 and "
                                   "context 32768 on ours (4 GiB HB): needs 75.4 GiB of LPDDR5")
    assert "tokens_per_s" not in bad
    half = rows.pop((64, 23552))
    assert half["error"] is None and half["tokens_per_s"] > 0
    assert half["phi_ar"] is half["xpu_ms_token"] is None
    assert half["xpu_error"].startswith("xPU baseline: qwen3-30b-a3b (ar) at batch 16 and "
                                        "context 23552 on xpu: needs 64.7 GiB of LPDDR5")
    for key, row in rows.items():
        assert row["error"] is row["xpu_error"] is None and row["phi_ar"] > 1, key
    # the capacity changes nothing else (the LPDDR5's background power aside)
    assert rows[(128, 23552)]["tokens_per_s"] == half["tokens_per_s"]


# == specs: sampling, constraints, errors =============================================================

def test_sampling_is_seeded_and_latin_hypercube_strata_are_each_hit_once():
    raw = {"seed": 5, "sampling": "lhs", "samples": 8, "base": "paper-4gb",
           "config": {"clock_ghz": {"min": 0.5, "max": 1.5}, "pes": [8, 16, 32, 64]},
           "workload": {"model": ["qwen3-30b-a3b"]}}
    pts = expand(parse_spec(raw, path="t.yaml"))
    assert len(pts) == 8
    clocks = sorted(p.config["clock_ghz"] for p in pts)
    assert [int((c - 0.5) * 8) for c in clocks] == list(range(8))       # one per stratum
    assert sorted(p.config["pes"] for p in pts) == [8, 8, 16, 16, 32, 32, 64, 64]
    again = expand(parse_spec(raw, path="t.yaml"))
    assert [p.config for p in again] == [p.config for p in pts]
    other = expand(parse_spec({**raw, "seed": 6}, path="t.yaml"))
    assert [p.config for p in other] != [p.config for p in pts]
    rnd = expand(parse_spec({**raw, "sampling": "random"}, path="t.yaml"))
    assert 1 <= len(rnd) <= 8 and all(0.5 <= p.config["clock_ghz"] <= 1.5 for p in rnd)
    # a log range: one sample in each stratum of log2(clock), every one within the range (a
    # test audit's mutation, base-10 powers of a natural log, drew 0.2-4.9 GHz unseen)
    log = {**raw, "config": {"clock_ghz": {"min": 0.5, "max": 2.0, "log": True}}}
    clocks = sorted(p.config["clock_ghz"] for p in expand(parse_spec(log, path="t.yaml")))
    assert all(0.5 <= c <= 2.0 for c in clocks) and len(clocks) == 8
    assert [int((math.log2(c) + 1) / 2 * 8) for c in clocks] == list(range(8))


def test_an_integer_range_rounds_to_the_nearest():
    """An integer range's sample is the nearest integer of its point in the range (1.75 is 2,
    1.25 is 1; truncating, a test audit's mutation, drew the lower bound three times in
    four), within the bounds, and a log integer range likewise (2 ** 1.5 = 2.83 is 3)."""
    from elmoe3d.sw.host.sweep_spec import _sample
    lin = {"min": 1, "max": 2, "log": False, "int": True}
    assert [_sample(lin, u) for u in (0.0, 0.25, 0.49, 0.51, 0.75, 1.0)] == [1, 1, 1, 2, 2, 2]
    log = {"min": 1, "max": 8, "log": True, "int": True}
    assert [_sample(log, u) for u in (0.0, 0.5, 1.0)] == [1, 3, 8]


def test_constraints_filter_and_tasks_mark_points():
    raw = {"config": {"pes": [8, 16, 32], "tile": {"rows": [8, 16], "lanes": [16, 32]}},
           "workload": {"model": ["qwen3-30b-a3b"], "hb": ["4gb", "8gb"]},
           "constraints": ["pes * tile.rows <= 256", "hb == '4gb' or pes >= 16",
                           "tile.lanes == 2 * tile.rows"],         # the PE's rule
           "tasks": {"rtl": "pes == 8 and tile.rows in [8]"}}
    pts = expand(parse_spec(raw, path="t.yaml"))
    # the constraints see the spec's hb; a point's own is empty where its PEs make another
    # HB capacity than paper-<hb>'s, and a die two presets give is one point, with the name
    # of the preset it is
    got = sorted((p.config["pes"], p.config["tile.rows"], p.workload["hb"] or "-", p.base)
                 for p in pts)
    assert got == [(8, 8, "-", "paper-4gb"), (8, 16, "-", "paper-4gb"),
                   (16, 8, "4gb", "paper-4gb"), (16, 16, "4gb", "paper-4gb"),
                   (32, 8, "8gb", "paper-8gb")]
    assert [p.tasks["rtl"] for p in pts].count(True) == 1
    assert len({p.id for p in pts}) == len(pts)


def test_constraints_drop_configurations_arch_config_rejects():
    """Constraints see the preset's fields overlaid with the point's before the configuration
    is built: the docstring's ``pes % pes_per_group == 0`` drops what ArchConfig rejects."""
    raw = {"config": {"pes": [16, 24, 32], "pes_per_group": [8, 16]},
           "workload": {"model": ["qwen3-30b-a3b"]},
           "constraints": ["pes % pes_per_group == 0"]}
    pts = expand(parse_spec(raw, path="t.yaml"))
    assert sorted((p.config["pes"], p.config["pes_per_group"]) for p in pts) == [
        (16, 8), (16, 16), (24, 8), (32, 8), (32, 16)]


def test_ext_bandwidth_is_swept_through_the_channel_count(capsys, tmp_path):
    """docs/sweep.md, Memory bandwidth: ext_channels and ext_gbps listed together, the
    matching pairs kept by a constraint, give one EXT bandwidth per point, which the perf
    model reads (no "differ only by id" note for ext_channels)."""
    spec = _write(tmp_path, "config:\n  ext_channels: [2, 4, 8]\n  ext_gbps: [25.6, 51.2, 102.4]\n"
                            "workload:\n  model: [qwen3-30b-a3b]\n"
                            "constraints:\n  - 'abs(ext_gbps - 12.8 * ext_channels) < 0.01'\n")
    pts = expand(load_spec(spec))
    assert sorted((p.config["ext_channels"], p.config["ext_gbps"]) for p in pts) == [
        (2, 25.6), (4, 51.2), (8, 102.4)]
    assert cli.main(["sweep", str(spec), "--check"]) == 0
    out = capsys.readouterr().out
    assert "3 valid points" in out and "note:" not in out
    # --check says how many combinations the constraints dropped (new-user trial: it was silent)
    assert "3 valid points (sampling grid, seed 0, 6 dropped by the constraints)" in out
    counts = {}
    assert len(expand(load_spec(spec), counts)) == 3
    assert counts == {"constrained": 6, "no_task": 0, "duplicates": 0}


def test_points_with_no_task_are_dropped_and_counted(tmp_path, capsys):
    """``perf: false`` with ``rtl: "pes == 8"``: the 16-PE points have no task. They gave rows
    without a figure; they are now no points, counted by ``--check`` and by the run."""
    spec = _write(tmp_path, "config:\n  pes: [8, 16]\nworkload:\n  model: [qwen3-30b-a3b]\n"
                            "tasks:\n  perf: false\n  rtl: 'pes == 8'\n")
    counts = {}
    pts = expand(load_spec(spec), counts)
    assert [p.config["pes"] for p in pts] == [8] and pts[0].tasks["rtl"]
    assert counts == {"constrained": 0, "no_task": 1, "duplicates": 0}
    assert cli.main(["sweep", str(spec), "--check"]) == 0
    assert ("1 valid points (sampling grid, seed 0, 1 with no task); tasks: perf 0, area 0, "
            "timing 0, rtl 1") in capsys.readouterr().out
    said = []
    res = run_sweep(load_spec(spec), tmp_path / "out", workers=0, task=lambda p, c: {"id": p.id},
                    progress=False, plots=False, say=said.append)
    assert res.points == 1 and "1 with no task" in said[0]
    doc = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert doc["points"] == 1 and doc["dropped"] == {"constrained": 0, "no_task": 1,
                                                     "duplicates": 0}


def test_hb_is_empty_when_the_base_or_the_hb_capacity_is_not_paper_hb():
    def hbs(raw):
        return {p.workload["hb"] for p in expand(parse_spec(raw, path="t.yaml"))}
    model = {"model": ["qwen3-30b-a3b"]}
    assert hbs({"workload": model}) == {"4gb"}
    assert hbs({"workload": {**model, "hb": ["8gb"]}}) == {"8gb"}
    assert hbs({"base": "paper-8gb", "workload": model}) == {None}
    assert hbs({"config": {"hb_bank_bytes": [2 ** 27, 2 ** 29]}, "workload": model}) == {None}
    assert hbs({"config": {"hb_bank_bytes": [2 ** 28, 2 ** 29]}, "workload": model}) == \
        {"4gb", None}                                   # 2^28: paper-4gb's own banks
    # a bank count changes the capacity too (a new user's finding: hb=8gb rows of 16 PEs held
    # 4 GB); a point of the preset's own capacity keeps its name
    counts = {}
    pts = expand(parse_spec({"config": {"pes": [16, 32]},
                             "workload": {**model, "hb": ["4gb", "8gb"]}}, path="t.yaml"),
                 counts)
    # paper-8gb cut to 16 PEs is paper-4gb's die and paper-4gb at 32 PEs paper-8gb's: a
    # point whose hb is empty is keyed by its die's fields, so each die is one point (a
    # review's finding: four points computed two dies twice)
    assert sorted((p.config["pes"], p.workload["hb"] or "-") for p in pts) == \
        [(16, "4gb"), (32, "8gb")]
    assert counts["duplicates"] == 2
    # a die of paper-4gb's capacity from other fields keeps the name (a review's finding: the
    # capacity was checked on a configuration of the HB fields alone)
    assert hbs({"config": {"pes": [2], "pes_per_group": [2], "hb_bank_bytes": [2 ** 31]},
                "workload": model}) == {"4gb"}
    assert hbs({"config": {"pes": [32], "hb_bank_bytes": [2 ** 27]},
                "workload": model}) == {"4gb"}


def test_area_timing_runs_at_the_points_clock(monkeypatch):
    periods = []

    def key(arch, *, period=None, liberty_path=None):
        periods.append(period)
        raise RuntimeError("stop here")
    monkeypatch.setattr(sweep_tasks, "area_key", key)
    spec = parse_spec({"base": "small", "config": {"clock_ghz": [0.5, 2.0]},
                       "workload": {"model": ["qwen3-30b-a3b"]},
                       "tasks": {"perf": False, "timing": True}}, path="t.yaml")
    for p in expand(spec):
        with pytest.raises(RuntimeError, match="stop here"):
            sweep_tasks.area_task(p, "/nonexistent", timing=True)
    assert periods == [2000.0, 500.0]


def test_equal_points_are_one_and_samples_say_how_many_are_distinct(tmp_path, capsys):
    raw = {"workload": {"model": ["qwen3-30b-a3b"], "scheme": ["ar", "eagle"],
                        "depth": [5, 7]}, "seed": 3}
    pts = expand(parse_spec(raw, path="t.yaml"))
    assert sorted((p.workload["scheme"], p.workload["depth"]) for p in pts) == [
        ("ar", None), ("eagle", 5), ("eagle", 7)]
    other_seed = expand(parse_spec({**raw, "seed": 4}, path="t.yaml"))
    assert [p.id for p in other_seed] == [p.id for p in pts]      # no RTL task: seed unused
    spec = _write(tmp_path, "sampling: random\nsamples: 16\nconfig:\n  pes: [16, 32]\n"
                            "  streamline_gbps: [256]\nworkload:\n  model: [qwen3-30b-a3b]\n")
    assert cli.main(["sweep", str(spec), "--check"]) == 0
    out = capsys.readouterr().out
    assert "16 samples -> 2 distinct configurations" in out
    assert "note: the perf model does not read streamline_gbps" in out
    # the compute calibration reads the PE's memories, the group and the link's rate
    spec = _write(tmp_path, "config:\n  wmem_bytes: [65536]\n  aggregation_gbps: [64]\n"
                            "workload:\n  model: [qwen3-30b-a3b]\n")
    assert cli.main(["sweep", str(spec), "--check"]) == 0
    assert "does not read" not in capsys.readouterr().out


def test_check_refuses_the_options_of_a_run(tmp_path, capsys, monkeypatch):
    """``--check`` runs nothing, so the options saying how to run (``--workers`` even at 0,
    ...) are refused by name, not dropped; nothing is made. ``--cache`` it reads (the
    calibrations kept there), and ``--out`` (the rows an earlier run left: a new user asked
    how many points a folder would reuse), making nothing either."""
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n")
    for options, named in ((["--workers", "0", "--cache", tmp_path / "c"], "--workers"),
                           (["--no-plots", "--no-progress"], "--no-progress, --no-plots")):
        assert cli.main(["sweep", str(spec), "--check", *map(str, options)]) == 2
        err = capsys.readouterr().err
        assert err.strip() == (f"elmoe3d sweep: error: {named}: not read with --check (it "
                               f"expands and validates the spec and runs no point)")
    assert sorted(p.name for p in tmp_path.iterdir()) == [spec.name]
    assert cli.main(["sweep", str(spec), "--check"]) == 0
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(tmp_path / "c"),
                     "--out", str(tmp_path / "o")]) == 0
    assert "finished before" not in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == [spec.name]
    # an out folder with rows of these points: how many a run reuses
    spec2 = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  batch: [1, 4]\n",
                   "two.yaml")
    run_sweep(spec, tmp_path / "o", workers=0, cache_dir=tmp_path / "c", progress=False,
              plots=False, say=_quiet)
    assert cli.main(["sweep", str(spec2), "--check", "--out", str(tmp_path / "o"),
                     "--cache", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"note: {tmp_path / 'o'}: 1 of the 2 points finished before (a run reuses them); 1 "
        f"to run")
    shutil.rmtree(tmp_path / "o")
    shutil.rmtree(tmp_path / "c", ignore_errors=True)
    (tmp_path / "two.yaml").unlink()
    # a --cache the run would refuse: a file, or a folder that cannot be made
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(spec)]) == 2
    assert f"--cache {spec}: a file, not a folder" in capsys.readouterr().err
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(spec / "c")]) == 2
    assert f"{spec} is not a folder" in capsys.readouterr().err
    ro = tmp_path / "ro"                             # a folder no file can be created in
    ro.mkdir(mode=0o555)
    import tempfile as tempfile_mod
    real = tempfile_mod.TemporaryFile

    def no_write(*args, dir=None, **kw):             # as root, which writes anywhere
        if dir is not None and Path(dir) == ro:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kw)
    monkeypatch.setattr(sweep_tasks.tempfile, "TemporaryFile", no_write)
    for cache in (ro, ro / "new"):
        assert cli.main(["sweep", str(spec), "--check", "--cache", str(cache)]) == 2
        assert "Permission denied" in capsys.readouterr().err
    assert sorted(p.name for p in ro.iterdir()) == []


def _stand_in_calibrations(monkeypatch):
    """Replace the two calibrators (minutes each on a new PE) by stand-ins that record their
    calls and return the shipped paper-4gb calibration of the same shape under the new key.
    The list of ``(kind, table key)`` they were called for."""
    import dataclasses
    from elmoe3d.config import preset
    from elmoe3d.sw.host import compute_calib, linear_calib
    paper, calls = preset("paper-4gb"), []

    def ffn(arch, hidden, intermediate, bits, *, check=True, link_rate=None):
        key = compute_calib.pe_key(arch), hidden, intermediate, bits, link_rate
        calls.append(("ffn", key))
        shipped = compute_calib.ffn_calibration(paper, hidden, intermediate, bits)
        return dataclasses.replace(shipped, key=key[0], link_rate=link_rate)

    def linear(arch, in_features, bits, *, check=True):
        key = linear_calib.table_key(arch, in_features, bits)
        calls.append(("linear", key))
        return dataclasses.replace(linear_calib.linear_calibration(paper, in_features, bits),
                                   key=key[0])
    monkeypatch.setattr(compute_calib, "calibrate", ffn)
    monkeypatch.setattr(linear_calib, "calibrate_linear", linear)
    for mod in (compute_calib, linear_calib):       # this process's calibrations: none kept
        monkeypatch.setattr(mod, "_CACHE", {})
    return calls


def test_check_notes_the_points_that_will_compute_a_calibration(tmp_path, capsys,
                                                                monkeypatch):
    """``--check`` runs each perf point's model computing no calibration
    (``calibrations_needed``) and notes the points that will compute one a shipped table and
    the cache lack: the very calibrations the run then computes, none of which the run after
    it computes again (kept in the cache), nor ``--check`` notes. The paper's own PE notes
    nothing."""
    calls = _stand_in_calibrations(monkeypatch)
    cache = tmp_path / "cache"
    spec = _write(tmp_path, "config:\n  tile.rows: [16, 8]\n  tile.lanes: [32, 16]\n"
                            "constraints: ['tile.lanes == 2 * tile.rows']\nworkload:\n"
                            "  model: [qwen3-30b-a3b]\n  scheme: [ar, elastic]\n")
    points = expand(load_spec(spec))
    assert len(points) == 4
    needed = [sweep_tasks.calibrations_needed(p, cache) for p in points]
    paper_pe = [p.arch().tile.rows == 16 for p in points]
    assert [not n for n in needed] == paper_pe == [True, True, False, False]
    need = {**needed[2], **needed[3]}
    assert needed[2].keys() < needed[3].keys()          # Elastic-SD's 4-bit steps need more
    assert {kind for kind, _ in need} == {"ffn", "linear"}
    assert all(key[0].startswith("tile 8x16x32") for _, key in need)
    assert calls == [] and not cache.exists()           # nothing computed, nothing made
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(cache)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    first_kind, first_key = next(iter(needed[2]))
    notice = needed[2][first_kind, first_key][0]
    slow = sum(1 for _n, takes in need.values() if takes != "seconds")
    assert slow and slow < len(need)
    assert (f"note: 2 perf point(s) need {len(need)} compute calibration(s) that neither the "
            f"shipped tables nor {cache / 'calib'} hold ({slow} taking a minute or more, "
            f"{len(need) - slow} taking seconds): each is computed once") in out
    link = f", the aggregation link at {first_key[-1]:g} words a cycle" \
        if first_kind == "ffn" else ""
    assert (f"(first, point 2: {notice} on the 8x16x32 tile (rows x lanes x group), 32768 B of "
            f"WMEM, 32768 B of IOMEM split (7, 1, 16, 8), 4 PEs a group{link})") in out
    assert calls == [] and not cache.exists()
    # the run computes exactly those, each once; the next run and --check need none
    for p in points:
        sweep_tasks.perf_task(p, cache)
    assert sorted(calls) == sorted(need) and len(calls) == len(need)
    from elmoe3d.sw.host import compute_calib, linear_calib
    monkeypatch.setattr(compute_calib, "_CACHE", {})
    monkeypatch.setattr(linear_calib, "_CACHE", {})
    assert all(not sweep_tasks.calibrations_needed(p, cache) for p in points)
    for p in points:
        sweep_tasks.perf_task(p, cache)
    assert len(calls) == len(need)                      # read back from the cache's calib/
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(cache)]) == 0
    assert "compute calibration" not in capsys.readouterr().out


def test_check_notes_the_points_that_cannot_run_on_their_pe(tmp_path, capsys):
    """A PE whose IOMEM cannot stage a layer of the model: ``--check`` plans (does not
    compute) the calibrations and notes the point whose row will be an error, with the
    run's own message; the run then records that error and runs the other point."""
    spec = _write(tmp_path, "config:\n  iomem_bytes: [32768, 16384]\nworkload:\n"
                            "  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    cache = tmp_path / "cache"
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(cache)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("note: 1 perf point(s) will fail as they run (their model cannot be built on "
            "their configuration): their rows will be errors (first, point 1: compute "
            "calibration: a linear layer of K = 2048 does not fit one PE of this configuration "
            "(tile 16x32x32, wmem 32768, iomem 16384") in out
    assert "OUT overflows" in out and "compute calibration(s) that" not in out
    bad, good = sorted(expand(load_spec(spec)), key=lambda p: -p.config["iomem_bytes"])[::-1]
    row = sweep_tasks.run_point(bad, str(cache))
    assert row["error"].startswith("perf: UserError: compute calibration: a linear layer of K "
                                   "= 2048 does not fit one PE")
    assert sweep_tasks.run_point(good, str(cache))["error"] is None


def test_check_notes_the_dies_without_an_area_rollup(tmp_path, capsys):
    """``--check`` notes the area points whose die has no roll-up in the cache's ``area/``
    (each runs Yosys), counting points and distinct dies (a timing task is its own entry);
    an entry written there, as a run leaves it, takes its points off the note."""
    cache = tmp_path / "cache"
    spec = _write(tmp_path, "config:\n  pes: [8, 16]\nworkload:\n  model: [qwen3-30b-a3b]\n"
                            "  batch: [1, 4]\ntasks:\n  area: true\n")
    points = expand(load_spec(spec))
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(cache)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (f"note: 4 area point(s), 2 distinct die(s), have no area roll-up in "
            f"{cache / 'area'}: each die runs Yosys on its blocks that {cache / 'synth'} does "
            f"not hold yet") in out and "(first, point 0)" in out
    entries = {sweep_tasks.area_entry(p, cache) for p in points}
    assert len(entries) == 2 and not cache.exists()
    timed = {sweep_tasks.area_entry(p, cache, timing=True) for p in points}
    assert not timed & entries
    done = sweep_tasks.area_entry(points[0], cache)
    done.parent.mkdir(parents=True)
    done.write_text('{"die_mm2": 1}')
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(cache)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "note: 2 area point(s), 1 distinct die(s)" in out
    assert f"(first, point {next(p.index for p in points if p.config['pes'] == 16)})" in out
    assert sweep_tasks.area_task(points[0], cache) == {"die_mm2": 1, "area_cached": True}
    for p in points:
        entry = sweep_tasks.area_entry(p, cache)
        entry.write_text('{"die_mm2": 2}')
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(cache)]) == 0
    assert "area roll-up" not in capsys.readouterr().out


def test_alpha_source_says_where_alpha_came_from():
    spec = parse_spec({"workload": {"model": ["qwen3-30b-a3b"], "batch": [4, 2],
                                    "scheme": ["eagle"]}}, path="t.yaml")
    got = [sweep_tasks.perf_task(p)["alpha_source"] for p in expand(spec)]
    assert got == ["table3 4gb batch 4", "table3 4gb batch 1"]


def test_the_expression_language_refuses_what_it_has_not():
    fn = compile_expr("max(pes, 4) ** 2 // 3 > 10 and not x in [1, 2]", ["pes", "x"])
    assert fn({"pes": 8, "x": 3}) is True
    for text, needle in (("__import__('os')", "Call is not allowed"),
                         ("pes.__class__", "unknown field 'pes.__class__'"),
                         ("[p for p in pes]", "ListComp is not allowed"),
                         ("lambda: 1", "Lambda is not allowed"),
                         ("pes ** 1000", None)):
        if needle is None:
            with pytest.raises(ExprError, match="exponent 1000 is larger than 64"):
                compile_expr(text, ["pes"])({"pes": 2})
        else:
            with pytest.raises(ExprError, match=needle.replace("(", r"\(")
                               .replace(")", r"\)").replace(".", r"\.")):
                compile_expr(text, ["pes"])


BAD = [
    ("config:\n  pez: [16]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: config: unknown field 'pez' (did you mean 'pes'?); known: " + ", ".join(
         __import__("elmoe3d.sw.host.sweep_spec", fromlist=["x"]).CONFIG_FIELDS)),
    ("config:\n  pes: [16, x]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 1 (pes=x, model=qwen3-30b-a3b): pes: expected an integer, got 'x'"),
    # a value of the wrong type is named before a constraint trips over it (not "mult of a
    # string"), as are a boolean and a fraction on an integer field
    ("config:\n  pes: [8, 16, lots]\nworkload:\n  model: [qwen3-30b-a3b]\n"
     "constraints: ['pes * hb_bank_bytes <= 8 * 2**30']\n",
     "{spec}: point 2 (pes=lots, model=qwen3-30b-a3b): pes: expected an integer, got 'lots'"),
    # even where a constraint would drop the point: a wrong type is the spec's mistake
    ("config:\n  pes: [4, 8.0]\nworkload:\n  model: [qwen3-30b-a3b]\n"
     "constraints: ['pes < 6']\n",
     "{spec}: point 1 (pes=8.0, model=qwen3-30b-a3b): pes: expected an integer, got 8.0"),
    ("config:\n  pes: [16, true]\nworkload:\n  model: [qwen3-30b-a3b]\n"
     "constraints: ['pes > 0']\n",
     "{spec}: point 1 (pes=True, model=qwen3-30b-a3b): pes: expected an integer, got True"),
    ("config:\n  wmem_bytes: [16384.5]\nworkload:\n  model: [qwen3-30b-a3b]\n"
     "constraints: ['wmem_bytes > 0']\n",
     "{spec}: point 0 (wmem_bytes=16384.5, model=qwen3-30b-a3b): wmem_bytes: expected an "
     "integer, got 16384.5"),
    ("config:\n  clock_ghz: [1.0, fast]\nworkload:\n  model: [qwen3-30b-a3b]\n"
     "constraints: ['clock_ghz * 2 > 1']\n",
     "{spec}: point 1 (clock_ghz=fast, model=qwen3-30b-a3b): clock_ghz: expected a number, "
     "got 'fast'"),
    ("config:\n  pes: [16, 18]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 1 (pes=18, model=qwen3-30b-a3b): pes: 18 is not a multiple of pes_per_group (4)"),
    ("config:\n  tile.lanes: [32, 7]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 1 (tile.lanes=7, model=qwen3-30b-a3b): tile.lanes: expected an even number, got 7"),
    ("config:\n  hb_bank_gbps: [51.2, 60]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 1 (hb_bank_gbps=60, model=qwen3-30b-a3b): hb_bank_gbps: 60 differs from the HB bank's peak "
     "51.2 GB/s (128 B per 1 x 2.5 ns); a sweep cannot change the HB bandwidth: it is the "
     "bank's DRAM timing (hb), not a sweep field (docs/sweep.md, Memory bandwidth)"),
    # the EXT bandwidth goes with the channel count: the message says how to sweep it
    ("config:\n  ext_channels: [4, 8]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 0 (ext_channels=4, model=qwen3-30b-a3b): ext_gbps: 102.4 differs from "
     "ext_channels x the channel's peak = 51.2 GB/s; to sweep the EXT bandwidth, list ext_gbps "
     "beside ext_channels and keep the pairs that match with the constraint "
     "'abs(ext_gbps - 12.8 * ext_channels) < 0.01' (docs/sweep.md, Memory bandwidth)"),
    ("config:\n  ext_gbps: [102.4, 204.8]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 1 (ext_gbps=204.8, model=qwen3-30b-a3b): ext_gbps: 204.8 differs from "
     "ext_channels x the channel's peak = 102.4 GB/s; to sweep the EXT bandwidth, list ext_gbps "
     "beside ext_channels and keep the pairs that match with the constraint "
     "'abs(ext_gbps - 12.8 * ext_channels) < 0.01' (docs/sweep.md, Memory bandwidth)"),
    # a range draws values a field refuses: the message says to list the allowed ones
    ("sampling: lhs\nsamples: 1\nconfig:\n  hb_bank_bytes: {min: 134217728, max: 536870912}\n"
     "workload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 0 (hb_bank_bytes=390692379, model=qwen3-30b-a3b): hb: capacity 390692379 B "
     "is not a power-of-two number of rows of 16 banks x 2048 B (hb_bank_bytes drawn from a "
     "range, which takes any value in it: give the values the configuration allows as a list, "
     "or drop the others with a constraint)"),
    ("workload:\n  model: [qwen3-30b-a3b, llama]\n",
     "{spec}: point 1 (model=llama): model: expected one of qwen3-30b-a3b, glm-4.7-flash, "
     "deepseek-v2-lite, gpt-oss-20b, mixtral-8x7b or a model of the spec's models: section, "
     "got 'llama'"),
    ("workload:\n  model: [qwen3-30b]\n",
     "{spec}: point 0 (model=qwen3-30b): model: expected one of "
     "qwen3-30b-a3b, glm-4.7-flash, deepseek-v2-lite, gpt-oss-20b, mixtral-8x7b or a model of "
     "the spec's models: section, got 'qwen3-30b' (did you mean 'qwen3-30b-a3b'?)"),
    ("workload:\n  model: [qwen3-30b-a3b]\n  scheme: [elastik]\n",
     "{spec}: point 0 (model=qwen3-30b-a3b, scheme=elastik): scheme: expected one "
     "of ar, eagle, slm, quant, elastic, got 'elastik' (did you mean 'elastic'?)"),
    ("workload:\n  model: [qwen3-30b-a3b]\n  depth: [65]\n",
     "{spec}: point 0 (model=qwen3-30b-a3b, depth=65): depth: expected 1 .. 64 "
     "(paper_eval.MAX_TREE), got 65"),
    ("workload:\n  model: [qwen3-30b-a3b]\n  batch: [0]\n",
     "{spec}: point 0 (model=qwen3-30b-a3b, batch=0): batch: expected a positive integer, "
     "got 0"),
    ("workload:\n  model: [qwen3-30b-a3b]\n  depth: [2]\n  verify: [39]\n",
     "{spec}: point 0 (model=qwen3-30b-a3b, depth=2, verify=39): verify: expected all or 1 .. "
     "depth x width = 16 nodes, got 39"),
    ("workload:\n  model: [qwen3-30b-a3b]\n  verify: [0]\n",
     "{spec}: point 0 (model=qwen3-30b-a3b, verify=0): verify: expected all or 1 .. depth x "
     "width = 56 nodes, got 0"),
    ("workload:\n  model: [qwen3-30b-a3b]\nconstraints: ['pes >']\n",
     "{spec}: constraints[0]: 'pes >' does not parse (invalid syntax)"),
    ("workload:\n  model: [qwen3-30b-a3b]\nconstraints: ['pez > 4']\n",
     "{spec}: constraints[0]: 'pez > 4': unknown field 'pez' (did you mean 'pes'?); "
     "known: "),
    ("workload:\n  model: [qwen3-30b-a3b]\nconstraints: [\"open('x')\"]\n",
     "{spec}: constraints[0]: \"open('x')\": Call is not allowed (only numbers, fields, "
     "arithmetic, comparisons, and/or/not, min/max/abs)"),
    ("workload:\n  model: [qwen3-30b-a3b]\nconstraints: ['pes / 0 > 1']\n",
     "{spec}: point 0 (model=qwen3-30b-a3b): constraint 'pes / 0 > 1': division by zero"),
    ("config:\n  pes: {min: 8, max: 32}\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: config.pes: a range needs sampling random or lhs over the config axes "
     "(workload axes and grids take lists)"),
    ("sweep: 1\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: unknown section 'sweep' (did you mean 'seed'?); known: name, seed, base, "
     "sampling, samples, config, workload, constraints, tasks, models"),
    ("swep: 1\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: unknown section 'swep'; known: name, seed, base, sampling, samples, config, "
     "workload, constraints, tasks, models"),
    # a model without a fitted Zipf exponent or alpha model (Mixtral, a models: entry)
    ("workload:\n  model: [mixtral-8x7b]\n  scheme: [ar]\n",
     "{spec}: point 0 (model=mixtral-8x7b, scheme=ar): zipf: mixtral-8x7b has no fitted Zipf "
     "exponent (paper_eval.ZIPF has Table 3's models): give workload.zipf"),
    ("workload:\n  model: [mixtral-8x7b]\n  zipf: [1.0]\n",
     "{spec}: point 0 (model=mixtral-8x7b, zipf=1.0): alpha: mixtral-8x7b has no fitted "
     "Elastic-SD alpha model (paper_eval.ALPHA_MODEL has Table 3's models): give "
     "workload.alpha"),
    ("workload:\n  model: [qwen3-30b-a3b]\n  zipf: [-1]\n",
     "{spec}: point 0 (model=qwen3-30b-a3b, zipf=-1): zipf: expected an exponent in [0, 10], "
     "got -1"),
    ("workload:\n  model: [qwen3-30b-a3b]\n  zipf: [800]\n",
     "{spec}: point 0 (model=qwen3-30b-a3b, zipf=800): zipf: expected an exponent in [0, 10], "
     "got 800"),
    ("models:\n  my-moe: nowhere/config.json\nworkload:\n  model: [my-moe]\n",
     "{spec}: models.my-moe: {dir}/nowhere/config.json: cannot read the model config (No such "
     "file or directory)"),
    ("models:\n  my-moe: 3\nworkload:\n  model: [my-moe]\n",
     "{spec}: models.my-moe: expected the path of a config.json, got 3"),
    ("workload:\n  model: [qwen3-30b-a3b]\n  hb: [16gb, 16gb]\n",
     "{spec}: workload.hb: expected one of 4gb, 8gb (any case), got '16gb' (2 times)"),
    ("workload:\n  model: [qwen3-30b-a3b]\ntasks:\n  power: true\n",
     "{spec}: tasks: unknown task 'power' (did you mean 'perf'?); known: perf, area, timing, "
     "rtl, rtl_beats"),
    ("config:\n  tile.rows: [16, 8]\nworkload:\n  model: [qwen3-30b-a3b]\ntasks:\n  area: true\n",
     "{spec}: point 1 (tile.rows=8, model=qwen3-30b-a3b): tile.lanes: the PE needs lanes == 2 * "
     "rows so that an activation word (rows x 32 INT8) is as wide as a weight word (lanes x 32 "
     "nibbles); got rows=8, lanes=32 (the PE of a perf and area task)"),
    # a perf point's compute is calibrated on its PE too (let through until 2026-12-07: every
    # such point then failed as it ran)
    ("config:\n  tile.rows: [16, 8]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 1 (tile.rows=8, model=qwen3-30b-a3b): tile.lanes: the PE needs lanes == 2 * "
     "rows so that an activation word (rows x 32 INT8) is as wide as a weight word (lanes x 32 "
     "nibbles); got rows=8, lanes=32 (the PE of a perf task; a sweep of the tile alone: "
     "tasks.perf false, tasks.rtl true)"),
    # and it must be a PE the RTL builds: a 6 x 12 tile passed, then failed as it ran (a new
    # user's trial, 2026-12-07)
    ("base: paper-4gb\nconfig:\n  tile.rows: [6]\n  tile.lanes: [12]\n  wmem_bytes: [24576]\n"
     "  iomem_bytes: [24576]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 0 (tile.rows=6, tile.lanes=12, wmem_bytes=24576, iomem_bytes=24576, "
     "model=qwen3-30b-a3b): config: the PE needs a power-of-two number of lanes (word "
     "addressing by shifts), got 12 (the PE of a perf task; a sweep of the tile alone: "
     "tasks.perf false, tasks.rtl true)"),
    ("workload:\n  model: [qwen3-30b-a3b]\nconstraints: [\"'a' * 10**18 == 'b'\"]\n",
     "{spec}: point 0 (model=qwen3-30b-a3b): constraint \"'a' * 10**18 == 'b'\": mult of a "
     "string or list is not allowed"),
    ("workload:\n  model: [qwen3-30b-a3b]\nconstraints: ['((10**60)**60)**60 > 1']\n",
     "{spec}: point 0 (model=qwen3-30b-a3b): constraint '((10**60)**60)**60 > 1': the power "
     "has more than 4096 bits"),
    ("workload: [1, 2\n", "{spec}, line 2: not YAML (expected ',' or ']', but got "
     "'<stream end>')"),
    # an HB size elmoe3d paper --hb does not take (8GB it takes: below)
    ("workload:\n  model: [qwen3-30b-a3b]\n  hb: ['16gb']\n",
     "{spec}: workload.hb: expected one of 4gb, 8gb (any case), got '16gb'"),
    ("workload:\n  model: [qwen3-30b-a3b]\n  hb: [4gb, '8 gb']\n",
     "{spec}: workload.hb: expected one of 4gb, 8gb (any case), got '8 gb'"),
    # a number that is not finite: ArchConfig takes inf for a positive number, and the run
    # divided by it
    ("config:\n  clock_ghz: [.inf]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 0 (clock_ghz=inf, model=qwen3-30b-a3b): clock_ghz: expected a finite "
     "number, got inf"),
    ("config:\n  hb_pj_per_bit: [.nan]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: point 0 (hb_pj_per_bit=nan, model=qwen3-30b-a3b): hb_pj_per_bit: expected a "
     "finite number, got nan"),
    ("sampling: lhs\nsamples: 4\nconfig:\n  ext_pj_per_bit: {min: 1, max: .inf}\n"
     "workload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: config.ext_pj_per_bit: range bounds must be finite numbers, got inf"),
    # the name names the out folder out/sweep-<name>: no path separator
    ("name: ../../../escaped\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: name: expected text without / \\ or NUL (it names the folder out/sweep-<name>), "
     "got '../../../escaped'"),
    ("name: ''\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: name: expected text without / \\ or NUL (it names the folder out/sweep-<name>), "
     "got ''"),
    ("name: 1.10\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: name: expected text, got 1.1 (YAML read it as a number: quote it)"),
    ("name: on\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: name: expected text, got true (YAML read it as a boolean: quote it)"),
    ("name: 5\nworkload:\n  model: [qwen3-30b-a3b]\n",      # it said "as a int"
     "{spec}: name: expected text, got 5 (YAML read it as an integer: quote it)"),
    ("name: ~\nworkload:\n  model: [qwen3-30b-a3b]\n",      # it said "as a NoneType"
     "{spec}: name: expected text, got null (YAML read it as nothing: quote it)"),
    # a sweep that would compute nothing
    ("workload:\n  model: [qwen3-30b-a3b]\ntasks:\n  perf: false\n",
     "{spec}: tasks: no task selected (perf is false and area, timing and rtl are not given or "
     "false); a point would compute nothing"),
    ("workload:\n  model: [qwen3-30b-a3b]\ntasks:\n  perf: false\n  rtl: 'pes == 3'\n",
     "{spec}: tasks: no point has a task (perf is false and the expressions of area, timing "
     "and rtl are false at every point the constraints keep, 1 with no task)"),
    ("config:\n  pes: [8, 16]\nworkload:\n  model: [qwen3-30b-a3b]\nconstraints:\n"
     "  - 'pes != 8'\ntasks:\n  perf: false\n  rtl: 'pes == 8'\n",
     "{spec}: tasks: no point has a task (perf is false and the expressions of area, timing "
     "and rtl are false at every point the constraints keep, 1 dropped by the constraints, 1 "
     "with no task)"),
    ("config:\n  pes: [8, 16]\nworkload:\n  model: [qwen3-30b-a3b]\nconstraints:\n"
     "  - 'pes > 16'\n",
     "{spec}: no point left after the constraints, 2 dropped by the constraints"),
    ("sampling: lhs\nconfig:\n  pes: [16, 32]\nworkload:\n  model: [qwen3-30b-a3b]\n",
     "{spec}: samples: missing; sampling lhs needs it (how many config points, a positive "
     "integer)"),
]


@pytest.mark.parametrize("text,expected", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_a_bad_spec_is_one_exact_line(tmp_path, capsys, text, expected):
    spec = _write(tmp_path, text)
    assert cli.main(["sweep", str(spec), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    line = err.strip()
    want = "elmoe3d sweep: error: " + expected.format(spec=spec, dir=spec.parent)
    if want.endswith("known: "):
        assert line.startswith(want)
    else:
        assert line == want


def test_workload_names_in_any_case(tmp_path):
    """A workload's scheme and verify are taken in any case, as its model and hb are (a new
    user's ``scheme: [AR]`` was refused beside ``model: [Qwen3-30B-A3B]``): the same points."""
    from elmoe3d.sw.host.sweep_spec import expand, load_spec
    lower = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  batch: [1]\n"
                             "  scheme: [ar, elastic]\n  verify: [all]\n  hb: [8gb]\n", "l.yaml")
    upper = _write(tmp_path, "workload:\n  model: [Qwen3-30B-A3B]\n  batch: [1]\n"
                             "  scheme: [AR, ' Elastic']\n  verify: [All]\n  hb: [8GB]\n",
                   "u.yaml")
    points = [[(p.id, p.workload) for p in expand(load_spec(f))] for f in (lower, upper)]
    assert len(points[0]) == 2 and points[0] == points[1]


def test_a_ranges_values_refused_alike_are_one_line(tmp_path, capsys):
    """Points whose field is drawn from a range and refused for one reason at different values
    are one mistake (six sampled HB bank sizes that are not a power-of-two number of rows gave
    six lines differing in a number); values listed, not ranged, keep a line each (below)."""
    spec = _write(tmp_path, "sampling: random\nsamples: 6\nseed: 3\nbase: paper-4gb\n"
                            "config:\n  hb_bank_bytes: {min: 134217728, max: 536870912}\n"
                            "workload:\n  model: [qwen3-30b-a3b]\n  batch: [1]\n"
                            "  scheme: [ar]\n")
    assert cli.main(["sweep", str(spec), "--check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(r"elmoe3d sweep: error: .*: point 0 \(hb_bank_bytes=\d+, "
                        r"model=qwen3-30b-a3b, batch=1, scheme=ar\): hb: capacity \d+ B is not "
                        r"a power-of-two number of rows .* \(and 5 more points, other values of "
                        r"the range\)", lines[0]), lines[0]
    listed = _write(tmp_path, "base: paper-4gb\nconfig:\n  hb_bank_bytes: [150000000, "
                              "160000000]\nworkload:\n  model: [qwen3-30b-a3b]\n  batch: [1]\n"
                              "  scheme: [ar]\n", "listed.yaml")
    assert cli.main(["sweep", str(listed), "--check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and "more point" not in "".join(lines), lines
    # beside a range, listed values still keep a line each (a review: every number of a
    # ranged point's message was left out of its key, so pes 10 and 14 were one line), and
    # so do the numbers of the spec's own text; a float drawn for an integer field likewise
    # is one mistake
    mixed = _write(tmp_path, "sampling: random\nsamples: 6\nconfig:\n  clock_ghz: {min: 0.9, "
                             "max: 1.1}\n  pes: [10, 14]\nworkload:\n  model: [qwen3-30b-a3b]\n",
                   "mixed.yaml")
    assert cli.main(["sweep", str(mixed), "--check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert sorted(ln.split("): pes: ")[1][:2] for ln in lines) == ["10", "14"], lines
    # the listed value's mistake: no advice about the ranged clock (a new user's finding)
    assert not any("drawn from a range" in ln for ln in lines), lines
    # decided by building the point with the base preset's value in the range's place, not
    # by the message's words (a review): a per-channel capacity quotes neither ext_bytes nor
    # its value, and a listed HB size refused beside a ranged tile.rows is the list's
    # mistake, though "16 banks" and "rows" are in its message
    ext = _write(tmp_path, "sampling: random\nsamples: 4\nseed: 1\nbase: paper-4gb\nconfig:\n"
                           "  ext_bytes: {min: 1000, max: 100000000000}\nworkload:\n"
                           "  model: [qwen3-30b-a3b]\n", "ext.yaml")
    assert cli.main(["sweep", str(ext), "--check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    per_channel = [ln for ln in lines if "ext: capacity" in ln]
    assert per_channel and all("(ext_bytes drawn from a range" in ln for ln in per_channel), \
        lines
    rows = _write(tmp_path, "sampling: random\nsamples: 2\nbase: paper-4gb\nconfig:\n"
                            "  tile.rows: {min: 16, max: 16}\n  hb_bank_bytes: [150000000]\n"
                            "workload:\n  model: [qwen3-30b-a3b]\n", "rows.yaml")
    assert cli.main(["sweep", str(rows), "--check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "hb: capacity 150000000 B" in lines[0] and \
        "drawn from a range" not in lines[0], lines
    # a second review: a listed pes refused against the base's pes_per_group (4) too, but for
    # another reason than against the drawn 5: the range is the cause, the hint stays
    group = _write(tmp_path, "sampling: random\nsamples: 6\nseed: 2\nbase: paper-4gb\n"
                             "config:\n  pes: [6]\n  pes_per_group: {min: 2, max: 6}\n"
                             "workload:\n  model: [qwen3-30b-a3b]\n", "group.yaml")
    assert cli.main(["sweep", str(group), "--check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines and all("(pes_per_group drawn from a range" in ln for ln in lines), lines
    floats = _write(tmp_path, "sampling: random\nsamples: 6\nbase: paper-4gb\nconfig:\n"
                              "  hb_bank_bytes: {min: 134217728.0, max: 536870912.0}\n"
                              "workload:\n  model: [qwen3-30b-a3b]\n", "floats.yaml")
    assert cli.main(["sweep", str(floats), "--check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "hb_bank_bytes: expected an integer, got " in lines[0] and \
        lines[0].endswith("(and 5 more points, other values of the range)"), lines


def test_every_distinct_mistake_is_a_line(tmp_path, capsys):
    """Three mistakes (a new-user trial needed three runs to find them): each is one line, its
    first point named (by its place among the spec's combinations) and the points that share
    it counted; nothing runs. A key given twice in a YAML table is refused (PyYAML keeps the
    last silently)."""
    spec = _write(tmp_path, "config:\n  pes: [16, 17]\nworkload:\n  model: [qwen3-30b-a3b]\n"
                            "  batch: [0, 1]\n  scheme: [ar, warp]\n")
    assert cli.main(["sweep", str(spec), "--check"]) == 2
    err = capsys.readouterr().err
    # each value's own mistakes are all counted on every point (a point's first mistake hid
    # the others: batch=0 counted 1 point of 4); a configuration ArchConfig refuses is named
    # where the point has no other mistake
    assert err.splitlines() == [
        f"elmoe3d sweep: error: {spec}: point 0 (pes=16, model=qwen3-30b-a3b, batch=0, "
        f"scheme=ar): batch: expected a positive integer, got 0 (and 3 more points)",
        f"elmoe3d sweep: error: {spec}: point 1 (pes=16, model=qwen3-30b-a3b, batch=0, "
        f"scheme=warp): scheme: expected one of ar, eagle, slm, quant, elastic, got 'warp' "
        f"(and 3 more points)",
        f"elmoe3d sweep: error: {spec}: point 6 (pes=17, model=qwen3-30b-a3b, batch=1, "
        f"scheme=ar): pes: 17 is not a multiple of pes_per_group (4)"]
    # a new user's trial (2026-12-06): a wrong type in config hid the workload's mistakes
    # (one line for three; README: "a spec with three mistakes gets three lines")
    three = _write(tmp_path, "config:\n  pes: [8]\n  wmem_bytes: ['x']\nworkload:\n  model: "
                             "[qwen3-30b-a3b]\n  batch: [1, '2']\n  scheme: [ar, foo]\n",
                   "three.yaml")
    assert cli.main(["sweep", str(three), "--check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split("): ", 1)[1] for ln in lines] == [
        "wmem_bytes: expected an integer, got 'x' (and 3 more points)",
        "scheme: expected one of ar, eagle, slm, quant, elastic, got 'foo' (and 1 more point)",
        "batch: expected a positive integer, got '2' (and 1 more point)"]
    # at most MAX_MISTAKES distinct lines, then how many more
    from elmoe3d.sw.host.sweep_spec import MAX_MISTAKES
    many = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  batch: ["
                  + ", ".join(str(-i) for i in range(MAX_MISTAKES + 3)) + "]\n", "m.yaml")
    assert cli.main(["sweep", str(many), "--check"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == MAX_MISTAKES + 1
    assert lines[-1] == "elmoe3d sweep: error: ... and 3 more distinct mistakes"
    twice = _write(tmp_path, "models:\n  m: a.json\n  m: b.json\nworkload:\n  model: [m]\n",
                   "d.yaml")
    assert cli.main(["sweep", str(twice), "--check"]) == 2
    assert capsys.readouterr().err == (f"elmoe3d sweep: error: {twice}, line 3: key 'm' given "
                                       f"twice in one table\n")


def test_an_ar_point_takes_any_verify(tmp_path, capsys):
    """AR runs no tree: its verify is not checked (a review found the per-point value checks
    refusing ``verify: [0]`` on an AR-only spec that ran before)."""
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n"
                            "  verify: [0]\n", "ar.yaml")
    assert cli.main(["sweep", str(spec), "--check"]) == 0, capsys.readouterr().err
    assert ": 1 valid points" in capsys.readouterr().out


def test_every_mistake_of_the_spec_itself_is_a_line(tmp_path, capsys):
    """A new-user trial's spec with three misspelt keys (``pez``, ``modle``, ``areaa``) and
    one with two bad constraints printed only their first mistake: each is a line now, with
    the closest known name, exit status 2, nothing written; the mistakes that follow from a
    typo (no workload.model when ``modle`` is close to it) are not lines of their own."""
    typos = _write(tmp_path, "config:\n  pez: [16, 32]\nworkload:\n  modle: [qwen3-30b-a3b]\n"
                             "tasks:\n  areaa: true\n", "typos.yaml")
    from elmoe3d.sw.host.sweep_spec import CONFIG_FIELDS, WORKLOAD_FIELDS
    out = tmp_path / "out"
    assert cli.main(["sweep", str(typos), "--out", str(out), "--workers", "0",
                     "--no-progress"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and "Traceback" not in got.err and not out.exists()
    assert got.err.splitlines() == [
        f"elmoe3d sweep: error: {typos}: config: unknown field 'pez' (did you mean 'pes'?); "
        f"known: {', '.join(CONFIG_FIELDS)}",
        f"elmoe3d sweep: error: {typos}: workload: unknown field 'modle' (did you mean "
        f"'model'?); known: {', '.join(WORKLOAD_FIELDS)}",
        f"elmoe3d sweep: error: {typos}: tasks: unknown task 'areaa' (did you mean 'area'?); "
        f"known: perf, area, timing, rtl, rtl_beats"]
    two = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\nconstraints:\n"
                           "  - 'pes >'\n  - \"open('x')\"\n", "two.yaml")
    assert cli.main(["sweep", str(two), "--check"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"elmoe3d sweep: error: {two}: constraints[0]: 'pes >' does not parse (invalid syntax)",
        f"elmoe3d sweep: error: {two}: constraints[1]: \"open('x')\": Call is not allowed "
        f"(only numbers, fields, arithmetic, comparisons, and/or/not, min/max/abs)"]


def test_the_spec_mistakes_at_every_level_are_collected():
    """Unknown keys at every level (a section, a tile field, a task), values of the wrong
    form (seed, sampling, an axis, an HB size, a task), constraints and task expressions,
    models: entries: one line each, section by section, the spec's own mistakes before its
    points are checked. ``samples`` is not checked against a bad ``sampling``, and "no task
    selected" is not said when a task has a mistake (its value might have selected one)."""
    raw = {"sweep": 1, "seed": -1, "sampling": "sobol", "samples": 3,
           "config": {"pes": [], "tile": {"rowz": [8]}, "clock_ghz": [1.0, 2.0]},
           "workload": {"model": ["qwen3-30b-a3b"], "hb": ["4gb", "16gb"], "batch": [0]},
           "models": {"a": 3, "b": "m.json"},
           "constraints": ["pes > 4", "pez > 4"],
           "tasks": {"perf": False, "area": "pes >"}}
    with pytest.raises(UserError) as info:
        parse_spec(raw, path="s.yaml")
    lines = str(info.value).splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "unknown section 'sweep'; known", "sampling", "seed", "config.pes",
        "config", "workload.hb", "models.a", "models.b", "constraints[1]", "tasks.area"], lines
    assert lines[4].startswith("s.yaml: config: unknown field 'tile.rowz' (did you mean "
                               "'tile.rows'?); known: ")
    assert lines[5] == "s.yaml: workload.hb: expected one of 4gb, 8gb (any case), got '16gb'"
    assert all(line.startswith("s.yaml: ") for line in lines)
    # more than MAX_MISTAKES (10) of them: the first 10, then how many more
    with pytest.raises(UserError) as info:
        parse_spec({**raw, "tasks": {**raw["tasks"], "rtl_beats": 0}}, path="s.yaml")
    assert str(info.value).splitlines()[10:] == ["... and 1 more distinct mistake"]
    # a typo close to a task does not also say that no task is selected; one close to none
    # of them does (perf is false and nothing else is), and so does one close only to a task
    # the section already gives (power: perf is given, false)
    for key, lines_ in (("areaa", 1), ("power", 2), ("colour", 2)):
        with pytest.raises(UserError) as info:
            parse_spec({"workload": {"model": ["qwen3-30b-a3b"]},
                        "tasks": {"perf": False, key: True}}, path="s.yaml")
        assert len(str(info.value).splitlines()) == lines_, str(info.value)
    # a missing model is a line of its own unless a workload key is close to it
    with pytest.raises(UserError) as info:
        parse_spec({"workload": {"bach": [1]}}, path="s.yaml")
    assert str(info.value).splitlines()[1] == ("s.yaml: workload.model: expected at least one "
                                               "model (a preset or a name of models:)")


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_a_spec_that_is_not_utf8_is_one_line(tmp_path, capsys, suffix):
    spec = tmp_path / f"bin{suffix}"
    spec.write_bytes(b"seed: 1\n\xff\xfe\x00bad")
    assert cli.main(["sweep", str(spec), "--check"]) == 2
    assert capsys.readouterr().err == (f"elmoe3d sweep: error: {spec}:2: not UTF-8 text (byte "
                                       f"0xff at offset 8: invalid start byte)\n")


def test_hb_is_taken_in_any_case_as_elmoe3d_paper_takes_it():
    """``8GB`` is ``8gb`` (``elmoe3d paper --hb 8GB``): the same point as the spec with 8gb."""
    def point(hb):
        (p,) = expand(parse_spec({"workload": {"model": ["qwen3-30b-a3b"], "scheme": ["ar"],
                                               "hb": [hb]}}, path="t.yaml"))
        return p
    big = point("8GB")
    assert (big.base, big.workload["hb"]) == ("paper-8gb", "8gb")
    assert big.id == point("8gb").id != point("4Gb").id


def _no_out(tmp_path, capsys, *options):
    """``elmoe3d sweep`` of a one-point spec into ``tmp_path/fresh`` with ``options``: exit
    status 2, one line (returned), and nothing written (no out folder)."""
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    out = tmp_path / "fresh"
    assert cli.main(["sweep", str(spec), "--out", str(out), "--no-progress", "--no-plots",
                     *options]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()
    return err.strip().removeprefix("elmoe3d sweep: error: ")


def test_scheduler_and_dashboard_addresses_are_checked_before_anything_starts(tmp_path, capsys):
    """A --scheduler scheme Dask has not (an http:// dashboard link, say) or no port, a
    --dashboard that is not [HOST]:PORT (or a port above 65535, which Dask replaced by a
    random one) or whose host does not resolve: one line each, before the out folder is made.
    --dashboard is the embedded cluster's: refused with --workers 0 and with --scheduler."""
    schemes = "tcp://, tls://, ws://, wss://"
    assert _no_out(tmp_path, capsys, "--scheduler", "http://x") == (
        f"--scheduler http://x: unknown address scheme 'http'; expected one of {schemes} (e.g. "
        f"tcp://HOST:8786)")
    assert _no_out(tmp_path, capsys, "--scheduler", "tcp://x") == (
        "--scheduler tcp://x: expected tcp://HOST:PORT with a port 1-65535 (e.g. "
        "tcp://HOST:8786)")
    want = ("expected HOST:PORT, :PORT or PORT with a port 0-65535, HOST a name or an IPv4 "
            "address (e.g. localhost:8787; :8787 or 8787 serves every interface, port 0 any "
            "free one)")
    for bad in ("nonsense", ":99999", "localhost:http", "[::1]:8787"):
        assert _no_out(tmp_path, capsys, "--dashboard", bad) == f"--dashboard {bad}: {want}"
    assert _no_out(tmp_path, capsys, "--scheduler", "ucx://h:8786").startswith(
        "--scheduler ucx://h:8786: unknown address scheme 'ucx'")
    from elmoe3d.sw.host.sweep import check_dashboard
    assert check_dashboard("8787") == "8787" and check_dashboard(":0") == ":0"
    assert _no_out(tmp_path, capsys, "--dashboard", "nowhere.invalid:8787").startswith(
        "--dashboard nowhere.invalid:8787: unknown host 'nowhere.invalid' (")
    assert _no_out(tmp_path, capsys, "--dashboard", ":0", "--workers", "0") == (
        "--dashboard and --workers 0 exclude each other (no cluster: the points run in this "
        "process)")
    assert _no_out(tmp_path, capsys, "--dashboard", ":0", "--scheduler", "tcp://h:8786") == (
        "--dashboard and --scheduler exclude each other (--dashboard is the embedded cluster's; "
        "a scheduler serves its own)")


def test_cache_and_out_folders_are_checked_before_anything_starts(tmp_path, capsys):
    """--cache must be a folder the tasks can write (made if missing), --out not a file: one
    line naming the option, before the out folder is made."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert _no_out(tmp_path, capsys, "--workers", "0", "--cache", str(afile)) == (
        f"--cache {afile}: a file, not a folder")
    assert _no_out(tmp_path, capsys, "--workers", "0", "--cache", str(afile / "c")) == (
        f"--cache {afile / 'c'}: cannot create the folder (Not a directory)")
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    assert cli.main(["sweep", str(spec), "--out", str(afile), "--workers", "0",
                     "--cache", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err == (f"elmoe3d sweep: error: --out {afile}: a file, not a "
                                       f"folder\n")
    assert not (tmp_path / "c").exists()                # nothing made for a refused run
    assert afile.read_text() == "x"


def _tree(folder: Path) -> dict:
    """Every file and folder under ``folder``: path -> (bytes or None for a folder, mtime)."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes(),
                                         p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


class _NoScheduler:
    """A stand-in for :class:`distributed.Client` whose scheduler never answers: it records
    each attempt (the address, the timeout, whether the out folder ``out`` existed and what
    had been said by then) and raises Dask's error at once, instead of after the timeout."""

    def __init__(self, monkeypatch, out, said):
        import distributed
        self.calls, self.out, self.said = [], out, said
        monkeypatch.setattr(distributed, "Client", self)

    def __call__(self, address, timeout=None, **kw):
        self.calls.append((address, timeout, self.out.exists(), list(self.said)))
        raise OSError(f"Timed out trying to connect to {address} after {timeout} s")


def test_an_unreachable_scheduler_leaves_no_trace(tmp_path, capsys, monkeypatch):
    """New-user trial: ``--scheduler`` with no scheduler listening printed the sweep's header,
    then the error, and left the out folder with an empty points/ and a "failed" sweep.json.
    The scheduler is connected before the out folder is made and before anything is said: one
    line, no out folder; an out folder with an earlier sweep's results is left as it was
    (sweep.json not marked "failed"). The wait is the stand-in's (no clock)."""
    from elmoe3d.sw.host.sweep import CONNECT_TIMEOUT
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    out = tmp_path / "fresh"
    stub = _NoScheduler(monkeypatch, out, [])
    address = "tcp://127.0.0.1:8786"
    assert cli.main(["sweep", str(spec), "--scheduler", address, "--out", str(out),
                     "--no-progress"]) == 2
    got = capsys.readouterr()
    assert got.out == ""                                # no header
    assert got.err == (f"elmoe3d sweep: error: --scheduler {address}: cannot connect (Timed "
                       f"out trying to connect to {address} after {CONNECT_TIMEOUT} s)\n")
    assert stub.calls == [(address, CONNECT_TIMEOUT, False, [])]
    assert not out.exists()
    # an earlier sweep's out folder: one more point to run, the scheduler unreachable
    earlier = tmp_path / "earlier"
    run_sweep(spec, earlier, workers=0, cache_dir=tmp_path / "c", progress=False,
              plots=False, say=_quiet)
    before = _tree(earlier)
    assert json.loads(before["sweep.json"][0])["status"] == "complete"
    spec.write_text("workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n  batch: [1, 2]\n")
    said = []
    stub = _NoScheduler(monkeypatch, earlier, said)
    with pytest.raises(UserError, match=r"^--scheduler tcp://h:1: cannot connect \(Timed out "
                                        r"trying to connect to tcp://h:1 after 0\.25 s\)$"):
        run_sweep(spec, earlier, scheduler="tcp://h:1", cache_dir=tmp_path / "c",
                  progress=False, plots=False, say=said.append, connect_timeout=0.25)
    assert stub.calls == [("tcp://h:1", 0.25, True, [])] and said == []
    assert _tree(earlier) == before
    # nothing left to run: the scheduler is not needed, so not asked
    spec.write_text("workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    res = run_sweep(spec, earlier, scheduler="tcp://h:1", cache_dir=tmp_path / "c",
                    progress=False, plots=False, say=said.append)
    assert (res.ran, res.skipped) == (0, 1) and len(stub.calls) == 1


@pytest.mark.parametrize("stage", ["start", "warm-up"])
def test_an_embedded_cluster_that_cannot_start_leaves_no_trace(tmp_path, monkeypatch, stage):
    """The embedded cluster (no ``--scheduler``) started after the out folder was made and the
    header said: a cluster that could not start, or whose workers could not import the tasks,
    left a new out folder, or marked an earlier sweep's sweep.json "failed". It starts first
    now, like a scheduler's connection: nothing said, nothing written, the cluster closed; a
    start that fails inside Dask is one line naming the cluster."""
    import contextlib
    from elmoe3d.sw.host import sweep
    closed = []

    @contextlib.contextmanager
    def cluster(n, *, dashboard):
        if stage == "start":
            raise RuntimeError("Nanny failed to start (stand-in)")
        try:
            yield object()
        finally:
            closed.append(n)

    def no_import(client):
        raise UserError("dask workers cannot import elmoe3d's sweep tasks (stand-in)")

    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    earlier = tmp_path / "earlier"
    run_sweep(spec, earlier, workers=0, cache_dir=tmp_path / "c", progress=False,
              plots=False, say=_quiet)
    before = _tree(earlier)
    spec.write_text("workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n  batch: [1, 2]\n")
    monkeypatch.setattr(sweep, "local_cluster", cluster)
    monkeypatch.setattr(sweep, "_warm_up_workers", no_import)
    words = (r"^dask: the embedded cluster of 2 worker\(s\) could not start \(RuntimeError: "
             r"Nanny failed to start \(stand-in\)\); --workers 0 runs the points in this "
             r"process$" if stage == "start" else "stand-in")
    for out in (tmp_path / "fresh", earlier):
        said = []
        with pytest.raises(UserError, match=words):
            run_sweep(spec, out, workers=2, cache_dir=tmp_path / "c", progress=False,
                      plots=False, say=said.append)
        assert said == []
    assert not (tmp_path / "fresh").exists() and _tree(earlier) == before
    assert closed == ([] if stage == "start" else [2, 2])


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_a_run_stopped_on_an_embedded_cluster_says_so_and_closes_it(tmp_path, monkeypatch,
                                                                     exc):
    """With the embedded cluster started before the out folder (above), a run stopped during
    its points (Ctrl-C, an error) still says "interrupted" or "failed" in sweep.json, and the
    cluster still closes with its logging silenced (restored afterwards). A real one-worker
    cluster; the points' gather is the stand-in that stops."""
    import logging
    from distributed import Client, LocalCluster
    from elmoe3d.sw.host import sweep
    seen = {"cluster": [], "client": 0}
    cluster_close, client_close = LocalCluster.close, Client.close

    def watched_cluster(self, *a, **kw):
        seen["cluster"].append(logging.root.manager.disable)
        return cluster_close(self, *a, **kw)

    def watched_client(self, *a, **kw):
        seen["client"] += 1
        return client_close(self, *a, **kw)

    def gather(*a, **kw):
        raise exc("stop")

    monkeypatch.setattr(LocalCluster, "close", watched_cluster)
    monkeypatch.setattr(Client, "close", watched_client)
    monkeypatch.setattr(sweep, "_gather", gather)
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n"
                            "  batch: [1, 2]\n")
    out = tmp_path / "out"
    with pytest.raises(exc):
        run_sweep(spec, out, workers=1, dashboard=":0", cache_dir=tmp_path / "c",
                  progress=False, plots=False, say=_quiet)
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["status"] == ("interrupted" if exc is KeyboardInterrupt else "failed")
    assert seen["cluster"] and seen["cluster"][0] == logging.CRITICAL
    assert seen["client"] >= 1
    assert logging.root.manager.disable == logging.NOTSET


def test_a_scheduler_that_refuses_the_connection_is_one_line(tmp_path):
    """Dask's own client against a port nobody listens on (bound here, so no one can): one
    line and no out folder. The connection is refused at once; the short injected wait only
    bounds Dask's retries, and the outcome is the same whatever it is."""
    import socket
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    out = tmp_path / "fresh"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))                 # bound, not listening: refused
        address = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(UserError, match=rf"^--scheduler {address}: cannot connect \("):
            run_sweep(spec, out, scheduler=address, cache_dir=tmp_path / "c", progress=False,
                      plots=False, say=_quiet, connect_timeout=0.2)
    assert not out.exists()


class _Workers:
    """A stand-in for a connected :class:`distributed.Client` whose workers import the tasks
    but cannot write the cache folder; it records ``close``."""

    closed = False

    def run(self, fn, *args):
        if fn is sweep_tasks.cache_problem:
            return {"tcp://w:1": "cannot create the folder (Read-only file system)"}
        return {"tcp://w:1": 1}

    def close(self):
        self.closed = True


def test_a_cluster_whose_workers_cannot_write_the_cache_leaves_no_trace(tmp_path, capsys,
                                                                         monkeypatch):
    """The workers' cache is checked once connected, before the out folder is made (the
    client closed): one line naming --cache and the worker, nothing written or said."""
    import distributed
    client = _Workers()
    monkeypatch.setattr(distributed, "Client", lambda address, timeout=None: client)
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    out, cache = tmp_path / "fresh", tmp_path / "c"
    assert cli.main(["sweep", str(spec), "--scheduler", "tcp://h:1", "--out", str(out),
                     "--cache", str(cache), "--no-progress"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err == (
        f"elmoe3d sweep: error: --cache {cache}: cannot create the folder (Read-only file "
        f"system) on worker tcp://w:1 (a cluster's workers need a cache folder they share)\n")
    assert client.closed and not out.exists()


def test_an_out_folder_that_cannot_be_written_is_worded_as_the_other_commands(
        tmp_path, capsys, monkeypatch):
    """New-user trial: ``--out /proc/sw`` said "(No such file or directory)" where the other
    commands (``elmoe3d paper table3 --json /proc/x``, ``--plot DIR``) say the folder is not
    writable: the check is theirs (:func:`elmoe3d.cli.outputs.check_output_dir`), before
    anything is made, for a new out folder, an existing one and the default one."""
    from elmoe3d.cli import outputs
    spec = _write(tmp_path, "name: t\nworkload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    argv = ["sweep", str(spec), "--workers", "0", "--no-progress", "--cache",
            str(tmp_path / "c")]
    if Path("/proc").is_dir() and not outputs._writable(Path("/proc")):
        assert cli.main([*argv, "--out", "/proc/sw"]) == 2
        assert capsys.readouterr().err == ("elmoe3d sweep: error: --out /proc/sw: directory "
                                           "/proc is not writable\n")
    # a folder this process cannot write in (the permission bits do not stop root: stand-in)
    locked = tmp_path / "locked"
    (locked / "old").mkdir(parents=True)
    monkeypatch.setattr(outputs, "_writable", lambda folder: Path(folder).resolve() != locked)
    with pytest.raises(UserError) as other:
        outputs.check_output_dir(locked / "new", "--plot", ["a.png"])
    assert str(other.value) == f"--plot {locked / 'new'}: directory {locked} is not writable"
    for out, want in ((locked / "new", f"--out {locked / 'new'}: directory {locked} is not "
                                       f"writable"),
                      (locked, f"--out {locked / 'sweep.json'}: directory {locked} is not "
                               f"writable")):
        assert cli.main([*argv, "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"elmoe3d sweep: error: {want}\n"
    assert sorted(p.name for p in locked.iterdir()) == ["old"]
    monkeypatch.chdir(locked)
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == ("elmoe3d sweep: error: the out folder out/sweep-t: "
                                       "directory . is not writable\n")
    assert not (tmp_path / "c").exists()


def _sigint_in_a_child() -> str:
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-c", "import signal; "
                           "print(getattr(signal.getsignal(signal.SIGINT), '__name__', "
                           "str(signal.getsignal(signal.SIGINT))))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_embedded_clusters_workers_ignore_sigint():
    """Ctrl-C reaches the whole foreground process group: the workers take it with a handler
    that does nothing (else they died mid-task with their tracebacks, and the cluster could
    hang), not SIG_IGN, which the tools a task starts would inherit and so outlive Ctrl-C; the
    client stops and closes the cluster with its logging silenced, restored afterwards."""
    import logging
    import signal
    from distributed import LocalCluster
    from elmoe3d.sw.host import sweep_tasks
    from elmoe3d.sw.host.sweep import local_cluster
    seen = []
    close = LocalCluster.close

    def watched_close(self, *a, **kw):
        seen.append(logging.root.manager.disable)
        return close(self, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LocalCluster, "close", watched_close)
        with pytest.raises(KeyboardInterrupt):
            with local_cluster(1, dashboard=":0") as client:
                handlers = client.run(lambda: signal.getsignal(signal.SIGINT).__name__)
                assert list(handlers.values()) == [sweep_tasks._ignore_sigint.__name__]
                # a program the worker starts gets SIGINT's default back (it stops at Ctrl-C)
                child = client.run(_sigint_in_a_child)
                assert list(child.values()) == ["default_int_handler"]
                raise KeyboardInterrupt
    assert seen and seen[0] == logging.CRITICAL          # silenced while the cluster closed
    assert logging.root.manager.disable == logging.NOTSET


def test_toml_specs_and_check(tmp_path, capsys):
    spec = _write(tmp_path, 'seed = 3\n[config]\npes = [16, 32]\n[workload]\n'
                            'model = ["gpt-oss-20b"]\nbatch = [1, 4]\n', "s.toml")
    assert cli.main(["sweep", str(spec), "--check"]) == 0
    assert "4 valid points (sampling grid, seed 3); tasks: perf 4, area 0, timing 0, rtl 0" \
        in capsys.readouterr().out
    with pytest.raises(UserError, match=r"s\.toml: not TOML"):
        load_spec(_write(tmp_path, "seed = [\n", "s.toml"))


def test_the_own_model_example_checks(capsys, monkeypatch, model_registries):
    """examples/sweep_own_model.yaml (a models: entry, relative to the spec) is valid from any
    folder, and its LPDDR5 (256 GiB) holds every point: Qwen3-235B-A22B's weights alone do not
    fit the paper's 64 GiB (a review finding, 2026-12-06)."""
    spec = Path(__file__).resolve().parents[2] / "examples" / "sweep_own_model.yaml"
    monkeypatch.chdir("/")
    assert cli.main(["sweep", str(spec), "--check"]) == 0
    out = capsys.readouterr().out
    assert "36 valid points" in out and "LPDDR5" not in out


def test_the_pe_shape_example_notes_its_calibrations(capsys, tmp_path, monkeypatch):
    """examples/sweep_pe_shape.yaml (docs/sweep.md's ``--check`` sample) checks from any
    folder, and on an empty cache notes the 8x16x32 tile's calibrations, none of the paper
    tile's (shipped)."""
    spec = Path(__file__).resolve().parents[2] / "examples" / "sweep_pe_shape.yaml"
    monkeypatch.chdir("/")
    assert cli.main(["sweep", str(spec), "--check", "--cache", str(tmp_path / "c")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "16 valid points" in out and "8 perf point(s) need 17 compute calibration(s)" in out
    assert "on the 8x16x32 tile (rows x lanes x group)" in out and "16x32x32" not in out


MIXTRAL_CONFIG = {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
                  "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000}


def test_models_in_a_toml_spec_by_any_case(tmp_path, model_registries):
    """A TOML spec's [models] table, its names in any case in workload.model (names are kept
    lower case); the point runs at the given Zipf exponent. Two names equal but for case are
    refused."""
    (tmp_path / "m.json").write_text(json.dumps(MIXTRAL_CONFIG))
    spec = _write(tmp_path, '[models]\nBig-Mix = "m.json"\n[workload]\nmodel = ["Big-Mix"]\n'
                            'scheme = ["ar"]\nzipf = [0.36]\n', "s.toml")
    (point,) = expand(load_spec(spec))
    assert point.workload["model"] == "big-mix" and point.workload["zipf"] == 0.36
    got = sweep_tasks.perf_task(point)
    mixtral = pe.EvalModel("mixtral-8x7b", pe.platform("ours", "4gb"), zipf=0.36).ar()
    assert got["ar_ms_token"] == pytest.approx(mixtral.seconds * 1e3, rel=1e-12)
    twice = _write(tmp_path, '[models]\nBig-Mix = "m.json"\nbig-mix = "m.json"\n[workload]\n'
                             'model = ["big-mix"]\nzipf = [0.36]\nscheme = ["ar"]\n', "t.toml")
    with pytest.raises(UserError, match=r"t\.toml: models\.Big-Mix: the same name as "
                                        r"models\.big-mix \(names are kept lower case\)"):
        load_spec(twice)


def test_a_model_loaded_before_carries_its_figures(tmp_path, model_registries):
    """A model loaded in this process (hf_config.load_model, or an earlier spec's models:) and
    named by a spec without a models: section still travels with its figures, so a fresh
    worker can run it."""
    from elmoe3d.sw.host.hf_config import load_model
    name = load_model(MIXTRAL_CONFIG, name="mix-copy")
    spec = parse_spec({"workload": {"model": [name], "scheme": ["ar"], "zipf": [0.36]}},
                      path="t.yaml")
    (point,) = expand(spec)
    assert point.figures is not None and point.figures["preset"]["name"] == "mix-copy"


def test_pareto_front():
    xs = [1.0, 2.0, 2.0, 3.0, 4.0]
    ys = [1.0, 3.0, 2.0, 2.5, 5.0]
    assert pareto_front(xs, ys) == [0, 1, 4]
    # a tie in benefit: the costlier point is dominated (a test audit's >= for > kept it), and
    # of two equal points one is on the front
    assert pareto_front([1.0, 2.0], [3.0, 3.0]) == [0]
    assert pareto_front([2.0, 1.0, 3.0], [3.0, 3.0, 4.0]) == [1, 2]
    assert pareto_front([1.0, 1.0], [2.0, 2.0]) == [0]


def test_pareto_plots_per_model(tmp_path):
    from elmoe3d.sw.host.sweep import pareto_plots
    rows = [{"model": m, "scheme": "ar", "die_mm2": a, "tokens_per_s": t, "tokens_per_j": t / 2}
            for m in ("a", "b") for a, t in ((10.0, 5.0), (20.0, 9.0), (15.0, 4.0))]
    rows += [dict(r, batch=16, tokens_per_s=r["tokens_per_s"] * 10) for r in rows]
    fronts = []
    import matplotlib.axes
    real_plot = matplotlib.axes.Axes.plot

    def plot(self, *args, **kw):
        fronts.append(kw.get("label"))
        return real_plot(self, *args, **kw)
    import unittest.mock
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot):
        files = pareto_plots([dict(r, batch=r.get("batch", 1)) for r in rows], tmp_path)
    assert sorted(files) == ["pareto:a", "pareto:b"]
    assert fronts == ["Pareto front, batch 1", "Pareto front, batch 16"] * 4
    assert all(p.stat().st_size > 1000 for p in files.values())
    # five batches: no two fronts drawn alike (the fifth repeated the first's style)
    styles = []

    def plot2(self, *args, **kw):
        styles.append((kw.get("color"), kw.get("ls")))
        return real_plot(self, *args, **kw)
    five = [dict(r, batch=b) for r in rows[:3] for b in (1, 2, 4, 8, 16)]
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot2):
        pareto_plots(five, tmp_path)
    assert len(styles) == 10 and len(set(styles[:5])) == 5 and styles[:5] == styles[5:]


def test_a_workload_sweep_is_drawn_against_its_swept_axis(tmp_path):
    """Points that all share one die have no cost to trade: the plot is against the swept
    workload axis with the most values (context), a line per scheme and batch; a derived column
    that varies (Table 3's alpha, per batch) is no axis, nor a line of its own."""
    from elmoe3d.sw.host.sweep import pareto_plots, swept_axes
    spec = parse_spec({"workload": {
        "model": ["qwen3-30b-a3b"], "batch": [1, 4], "scheme": ["eagle", "elastic"],
        "context": [1024, 4096, 16384], "hb": ["4gb"]}})
    assert swept_axes(spec) == {"batch", "scheme", "context"}
    assert swept_axes(parse_spec({"workload": {
        "model": ["qwen3-30b-a3b"], "hb": ["4gb", "8gb"]}})) == {"hb_gb"}
    rows = [{"model": "a", "scheme": s, "batch": b, "context": c, "pes": 16, "hb_gb": 4.0,
             "alpha": 0.7 + 0.01 * b + (s == "eagle") * 0.05,
             "tokens_per_s": 1e5 / c * b, "tokens_per_j": 1e4 / c}
            for s in ("eagle", "elastic") for b in (1, 4) for c in (16384, 1024, 4096)]
    lines = []
    import matplotlib.axes
    real_plot = matplotlib.axes.Axes.plot

    def plot(self, xs, ys, *args, **kw):
        lines.append((kw.get("label"), list(xs), self.get_xlabel()))
        return real_plot(self, xs, ys, *args, **kw)
    import unittest.mock
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot):
        files = pareto_plots(rows, tmp_path, axes=swept_axes(spec))
    assert sorted(files) == ["by-context:a"]
    assert files["by-context:a"].name == "by-context-a.png"
    assert files["by-context:a"].stat().st_size > 1000
    assert [label for label, _, _ in lines] == ["eagle, batch 1", "eagle, batch 4",
                                                "elastic, batch 1", "elastic, batch 4"] * 2
    # numbers in their order (as strings, batch 16 came before batch 4)
    lines.clear()
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot):
        pareto_plots([dict(r, batch=b) for r in rows[:3] for b in (4, 16)], tmp_path,
                     axes={"batch", "context"})
    assert [label for label, _, _ in lines] == ["batch 4", "batch 16"] * 2
    assert all(xs == [1024, 4096, 16384] for _, xs, _ in lines)
    # without the spec every axis counts, and alpha (four values) would win over context (3)
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot):
        assert sorted(pareto_plots(rows, tmp_path)) == ["by-alpha:a"]
    # two dies: the Pareto plot as before
    two = [dict(r, pes=16 if r["context"] == 1024 else 32) for r in rows]
    assert sorted(pareto_plots(two, tmp_path, axes=swept_axes(spec))) == ["pareto:a"]
    # nothing swept varies: one x, but no axis to draw against either
    assert sorted(pareto_plots(rows[:1], tmp_path, axes=swept_axes(spec))) == ["pareto:a"]


def test_a_crowded_plot_has_one_legend_under_both_panels_or_none(tmp_path):
    """A new user's sweep (2026-12-07) over six workload axes drew about 200 lines a plot,
    each named on both panels (``ar, context 512, depth None, width None, hb_bank_bytes
    134217728``): the legends covered the panels and ran off the figure. Now up to 8 lines
    each panel names them, up to :data:`MAX_LEGEND` one legend under both does, more are
    drawn unnamed (colours and styles repeat beyond 40) and the title says how many; a field
    without a value is left out of a name and a byte count reads in MiB."""
    import matplotlib.axes
    import matplotlib.figure
    import unittest.mock
    from elmoe3d.sw.host.sweep import MAX_LEGEND, pareto_plots
    axes_legends, fig_legends, titles = [], [], []
    real = (matplotlib.axes.Axes.legend, matplotlib.figure.Figure.legend,
            matplotlib.figure.Figure.suptitle)

    def ax_legend(self, *args, **kw):
        out = real[0](self, *args, **kw)
        axes_legends.append([t.get_text() for t in out.get_texts()])
        return out

    def fig_legend(self, *args, **kw):
        out = real[1](self, *args, **kw)
        fig_legends.append([t.get_text() for t in out.get_texts()])
        return out

    def suptitle(self, t, *args, **kw):
        titles.append(t)
        return real[2](self, t, *args, **kw)

    def rows(contexts, batches=(1, 4, 16)):
        return [{"model": "a", "scheme": sc, "batch": b, "context": c, "pes": 16,
                 "depth": None if sc == "ar" else 4, "hb_bank_bytes": 2 ** 27,
                 "tokens_per_s": 10.0 * b + c, "tokens_per_j": 1.0 + b}
                for sc in ("ar", "elastic") for c in contexts for b in batches]
    axes = {"batch", "context", "scheme", "depth"}
    with unittest.mock.patch.object(matplotlib.axes.Axes, "legend", ax_legend), \
            unittest.mock.patch.object(matplotlib.figure.Figure, "legend", fig_legend), \
            unittest.mock.patch.object(matplotlib.figure.Figure, "suptitle", suptitle):
        pareto_plots(rows([512, 1024]), tmp_path, axes=axes)            # 4 lines
        assert axes_legends == [["ar, context 512", "ar, context 1024",
                                 "elastic, context 512, depth 4",
                                 "elastic, context 1024, depth 4"]] * 2
        assert fig_legends == [] and "no legend" not in titles[-1]
        axes_legends.clear()
        batches = list(range(1, MAX_LEGEND // 2 + 1))                      # x: 21 contexts
        many = [512 * (k + 1) for k in range(MAX_LEGEND // 2 + 1)]
        pareto_plots(rows(many, batches), tmp_path, axes=axes)               # 40 lines
        assert axes_legends == [] and len(fig_legends) == 1
        assert len(fig_legends[0]) == MAX_LEGEND and "no legend" not in titles[-1]
        assert fig_legends[0][-1] == f"elastic, batch {MAX_LEGEND // 2}, depth 4"
        fig_legends.clear()
        pareto_plots(rows(many + [512 * 100], batches + [99]), tmp_path, axes=axes)
        assert axes_legends == fig_legends == []                             # 42 lines
        assert titles[-1].endswith("; 42 legend entries, too many to tell apart: no "
                                   "legend (results.csv)")
        # dots coloured by a sampled field: their legend has 10 marker shapes to tell the
        # groups apart (a review's finding), so 11 groups are drawn unnamed
        shaded = [{"model": "a", "scheme": "ar", "batch": b, "pes": 16, "hb_pj_per_bit": h,
                   "ext_pj_per_bit": 2 + h * b % 3, "tokens_per_s": b + h,
                   "tokens_per_j": 1.0 + h} for b in range(1, 12)
                  for h in (0.2 + 0.03 * k for k in range(12))]
        fig_legends.clear()
        pareto_plots(shaded, tmp_path, axes={"batch", "hb_pj_per_bit", "ext_pj_per_bit"})
        assert fig_legends == [] and titles[-1].endswith(
            "; 11 legend entries, too many to tell apart: no legend (results.csv)")
        files = pareto_plots([r for r in shaded if r["batch"] <= 10], tmp_path,
                             axes={"batch", "hb_pj_per_bit", "ext_pj_per_bit"})
        assert len(fig_legends) == 1 and len(fig_legends[0]) == 10
    assert [p.stat().st_size > 1000 for p in files.values()] == [True]


def test_workload_plots_of_several_models_config_fields_and_reruns(tmp_path):
    """Review findings (2026-12-06, seventh session): every model of a sweep gets its by-axis
    plot (the second took the Pareto plot: a name reused for the panels), a config field that
    moves neither the area nor the PE count (the HB) is a line of its own, an earlier run's
    plot of the other kind is removed (and, since a new user's trial, the plots an earlier
    run's sweep.json lists), the HB's file is by-hb, and the title counts what it draws."""
    from elmoe3d.sw.host.sweep import pareto_plots, swept_axes
    spec = parse_spec({"config": {"hb_bank_bytes": [2 ** 27, 2 ** 28]}, "workload": {
        "model": ["qwen3-30b-a3b", "gpt-oss-20b"], "context": [1024, 4096, 16384]}})
    assert swept_axes(spec) == {"hb_bank_bytes", "model", "context"}
    rows = [{"model": m, "scheme": "elastic", "batch": 1, "context": c, "pes": 16,
             "hb_bank_bytes": hb, "tokens_per_s": hb / c, "tokens_per_j": 1.0}
            for m in ("a", "b", "c") for hb in (2 ** 27, 2 ** 28) for c in (1024, 4096, 16384)]
    lines, titles = [], []
    import matplotlib.axes
    import matplotlib.figure
    real_plot, real_title = matplotlib.axes.Axes.plot, matplotlib.figure.Figure.suptitle

    def plot(self, xs, ys, *args, **kw):
        lines.append(kw.get("label"))
        return real_plot(self, xs, ys, *args, **kw)

    def suptitle(self, t, *args, **kw):
        titles.append(t)
        return real_title(self, t, *args, **kw)
    (tmp_path / "pareto-a.png").write_bytes(b"an earlier run's")
    (tmp_path / "by-context-ab.png").write_bytes(b"another model's")
    import unittest.mock
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot), \
            unittest.mock.patch.object(matplotlib.figure.Figure, "suptitle", suptitle):
        files = pareto_plots(rows, tmp_path, axes=swept_axes(spec))
        assert sorted(files) == ["by-context:a", "by-context:b", "by-context:c"]
        assert lines == [f"hb_bank_bytes {hb} MiB" for hb in (128, 256)] * 6
        assert titles == [f"{m}: 6 points, all on 16 PEs" for m in "abc"]
        assert not (tmp_path / "pareto-a.png").exists()
        assert (tmp_path / "by-context-ab.png").read_bytes() == b"another model's"
        # an earlier run's plots, as its sweep.json lists them, go
        files = pareto_plots(rows, tmp_path, axes=swept_axes(spec),
                             earlier=[str(tmp_path / "by-context-ab.png")])
        assert not (tmp_path / "by-context-ab.png").exists()
        # a point without a number on the axis is counted apart; the HB's file is by-hb
        hb = [dict(r, hb_gb=4.0 * (1 + (r["hb_bank_bytes"] > 2 ** 27))) for r in rows
              if r["model"] == "a" and r["context"] == 1024]
        titles.clear()
        files = pareto_plots(hb + [dict(hb[0], hb_gb=None)], tmp_path, axes={"hb_gb"})
        assert sorted(files) == ["by-hb:a"] and files["by-hb:a"].name == "by-hb-a.png"
        assert titles == ["a: 2 of 3 points (1 without a hb_gb), all on 16 PEs"]
        assert not (tmp_path / "by-context-a.png").exists()


def test_a_config_sweep_on_one_die_is_drawn_against_its_field(tmp_path):
    """A new user's sweep of the tile shape (PE count constant, no area task, no workload
    axis but the scheme): every point on one x (16 PEs) before; now against the swept config
    field with the most values, a line a scheme, ``tile.lanes`` (which follows ``tile.rows``)
    no line of its own; its file by-tile_rows. A workload axis that varies still wins."""
    from elmoe3d.sw.host.sweep import pareto_plots, swept_axes
    spec = parse_spec({"config": {"tile.rows": [8, 16], "tile.lanes": [16, 32]},
                       "constraints": ["tile.lanes == 2 * tile.rows"],
                       "workload": {"model": ["qwen3-30b-a3b"], "scheme": ["ar", "elastic"]}})
    axes = swept_axes(spec)
    assert axes == {"tile.rows", "tile.lanes", "scheme"}
    rows = [{"model": "a", "scheme": sc, "batch": 1, "pes": 16, "tile.rows": r,
             "tile.lanes": 2 * r, "tokens_per_s": r * (2 if sc == "elastic" else 1),
             "tokens_per_j": 1.0 + r} for sc in ("ar", "elastic") for r in (16, 8)]
    lines = []
    import matplotlib.axes
    import unittest.mock
    real_plot, real_label = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.set_xlabel
    labels = []

    def plot(self, xs, ys, *args, **kw):
        lines.append((kw.get("label"), list(xs)))
        return real_plot(self, xs, ys, *args, **kw)

    def set_xlabel(self, text, *args, **kw):
        labels.append(text)
        return real_label(self, text, *args, **kw)
    (tmp_path / "by-tile_rows-a.png").write_bytes(b"old")
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot), \
            unittest.mock.patch.object(matplotlib.axes.Axes, "set_xlabel", set_xlabel):
        files = pareto_plots(rows, tmp_path, axes=axes)
    assert sorted(files) == ["by-tile_rows:a"]
    assert files["by-tile_rows:a"].name == "by-tile_rows-a.png"
    assert files["by-tile_rows:a"].stat().st_size > 1000
    assert lines == [("ar", [8, 16]), ("elastic", [8, 16])] * 2
    assert labels == ["tile.rows (swept config field)"] * 2
    # a workload axis that varies is the x axis, the config field its lines
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot):
        files = pareto_plots([dict(r, batch=b) for r in rows for b in (1, 4)], tmp_path,
                             axes=axes | {"batch"})
    assert sorted(files) == ["by-batch:a"] and not (tmp_path / "by-tile_rows-a.png").exists()


def test_area_key_names_the_configuration():
    from elmoe3d.sw.host.sweep_spec import build_arch
    a = sweep_tasks.area_key(build_arch("small", {}))
    assert a == sweep_tasks.area_key(build_arch("small", {}))
    assert a != sweep_tasks.area_key(build_arch("small", {"pes": 8}))
    assert a != sweep_tasks.area_key(build_arch("small", {}), period=1000.0)
    # the DRAM's energy figures price the memory, not the die: one synthesis for all of them
    assert a == sweep_tasks.area_key(build_arch("small", {"ext_pj_per_bit": 5.0,
                                                          "hb_background_mw_per_gb": 0.0,
                                                          "ext_background_mw_per_gb": 1.0}))


def test_area_task_plans_the_whole_die_and_caches_the_rollup(tmp_path, monkeypatch):
    """The area task's wiring on the small die with Yosys replaced by a stand-in whose "area"
    is the job's RTLIL size (the real run: the test below, ELMOE3D_SWEEP_SYNTH=1): every job
    the die's plan holds is synthesised once, the roll-up is cached by the configuration, a
    second call synthesises nothing."""
    from elmoe3d.synth import rollup
    from elmoe3d.synth.flow import SynthResult
    calls = []

    def stand_in(name, rtlil, *, liberty, stubs="", cache_dir=None, timing=None):
        calls.append(name)
        assert Path(cache_dir) == tmp_path / "synth" and timing is None
        return SynthResult(name=name, cells={"X": 1}, area=len(rtlil) / 1000.0, seq_area=0.0)
    monkeypatch.setattr(rollup, "synthesize", stand_in)
    spec = parse_spec({"base": "small", "workload": {"model": ["qwen3-30b-a3b"]},
                       "tasks": {"perf": False, "area": True}}, path="t.yaml")
    (point,) = expand(spec)
    first = sweep_tasks.area_task(point, tmp_path)
    assert len(calls) >= 20                                     # every die block's jobs
    assert first["die_mm2"] > first["pe_mm2"] > 0 and 0 < first["pe_share"] < 1
    assert first["area_cached"] is False and "area_skipped" not in first
    n = len(calls)
    again = sweep_tasks.area_task(point, tmp_path)
    assert again == {**first, "area_cached": True} and len(calls) == n
    assert len(list((tmp_path / "area").glob("*.json"))) == 1


def test_area_task_is_the_synth_rollup_and_caches(tmp_path):
    """The real area task on the ``small`` die (Yosys from a cold cache: minutes, so a
    ``make test-slow`` test, tests/conftest.py SLOW): a die of 4 PEs and one of 8 PEs; the
    second synthesises no PE leaf again (the leaves are cached by their RTLIL), its PE area
    is the first's and its die grows by at least the 4 extra PEs; a repeat of either point
    reads the roll-up cache and returns the same figures."""
    spec = parse_spec({"base": "small", "config": {"pes": [4, 8]},
                       "workload": {"model": ["qwen3-30b-a3b"]},
                       "tasks": {"perf": False, "area": True}}, path="t.yaml")
    four, eight = sorted(expand(spec), key=lambda p: p.arch().pes)
    assert (four.arch().pes, eight.arch().pes) == (4, 8)
    first = sweep_tasks.area_task(four, tmp_path)
    assert first["die_mm2"] > 0 and 0 < first["pe_share"] < 1 and not first["area_cached"]
    made = {f: f.stat().st_mtime_ns for f in (tmp_path / "synth").rglob("*") if f.is_file()}
    big = sweep_tasks.area_task(eight, tmp_path)
    assert not big["area_cached"] and big["pe_mm2"] == first["pe_mm2"]
    assert big["die_mm2"] >= first["die_mm2"] + 4 * first["pe_mm2"] * (1 - 1e-9)
    assert {f: f.stat().st_mtime_ns for f in made} == made   # nothing of the first re-made
    for point, got in ((four, first), (eight, big)):
        again = sweep_tasks.area_task(point, tmp_path)
        assert again == {**got, "area_cached": True}


# == the RTL task ===================================================================================

@pytest.mark.cocotb
def test_rtl_task_on_the_smallest_tile(tmp_path):
    """The tile bench's throughput GEMM on a 1x2x32 tile (the smallest TileConfig): bit-exact,
    one beat a cycle; a second sweep reuses the build (keyed by the Verilog's hash). The
    cache's ``verilator/`` is the suite's build root (a link), so the Verilator runtime objects
    the other cocotb tests compiled are reused."""
    from elmoe3d.sim.runner import build_root
    root = build_root()
    root.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "verilator").symlink_to(root, target_is_directory=True)
    spec = _write(tmp_path, "base: small\nseed: 3\nconfig:\n  tile.rows: [1]\n"
                            "  tile.lanes: [2]\nworkload:\n  model: [qwen3-30b-a3b]\n"
                            "  batch: [1, 4]\ntasks:\n  perf: false\n  rtl: 'batch == 1'\n"
                            "  rtl_beats: 64\n")
    res = run_sweep(spec, tmp_path / "out", workers=0, cache_dir=tmp_path / "cache",
                    progress=False, say=_quiet)
    assert res.errors == 0, [r["error"] for r in res.rows]
    [r0] = res.rows                             # batch 4 has no task: no point
    assert r0["batch"] == 1
    assert r0["rtl_mismatches"] == 0 and r0["rtl_comparisons"] > 0
    assert r0["rtl_beats"] >= 64 and r0["rtl_fraction"] >= 0.99 and r0["rtl_seed"] == 3
    assert list((tmp_path / "cache" / "verilator").glob("tile_r1_l2-*"))
    again = run_sweep(spec, tmp_path / "out2", workers=0, cache_dir=tmp_path / "cache",
                      progress=False, say=_quiet)
    [a0] = again.rows
    assert a0["rtl_built"] is False
    assert comparable(again.rows) == comparable(res.rows)


def test_bench_figure_13_names_rows_unlike_the_serial_run():
    from rich.console import Console
    from elmoe3d.cli.bench import SWEEP_POINTS, SWEEP_SPEC, print_sweep
    from elmoe3d.sw.host.sweep_spec import parse_spec
    assert len(expand(parse_spec(SWEEP_SPEC, path="figure 13"))) == SWEEP_POINTS
    fig = {"points": 384, "seed": 13, "serial": {"points_per_s": 200.0},
           "efficiency": 0.5,
           "dask": {1: {"points_per_s": 100.0, "identical": True, "differing": 0},
                    2: {"points_per_s": 100.0, "identical": False, "differing": 3}}}
    console = Console(record=True, width=200)
    assert print_sweep(console, fig) == [
        "13. sweep on 2 worker(s): 3 row(s) differ from the serial run"]
    assert "scaling efficiency rate2 / (2 x rate1) = 0.50" in console.export_text()


def test_the_verify_size_of_a_swept_tree():
    """The SD tree's verify size: TREE's when the spec gives no tree; every node when it gives
    a depth or width but no verify (TREE's 34 nodes are its 7 x 8 tree's), ``all`` the same
    point as the node count; AR points carry none and are not checked against it."""
    def points(workload):
        return expand(parse_spec({"workload": {"model": ["qwen3-30b-a3b"], **workload}},
                                 path="t.yaml"))
    (p,) = points({})
    assert (p.workload["depth"], p.workload["width"], p.workload["verify"]) == pe.TREE
    (p,) = points({"depth": [2], "width": [3]})
    assert p.workload["verify"] == 6
    a, b = points({"depth": [2], "width": [3], "verify": ["all", 6]}), points({"verify": [5]})
    assert len(a) == 1 and a[0].id == p.id and b[0].workload["verify"] == 5
    (ar,) = points({"scheme": ["ar"], "depth": [2], "verify": [39]})
    assert ar.workload["verify"] is None and ar.workload["depth"] is None


def test_the_example_spec_is_valid():
    from elmoe3d.blocks import ROOT
    pts = expand(load_spec(ROOT / "examples" / "sweep_paper.yaml"))
    assert len(pts) == 384 and all(p.tasks["perf"] and not p.tasks["area"] for p in pts)
    # its comment names the SD tree the points get (the workload's default, paper_eval.TREE)
    text = (ROOT / "examples" / "sweep_paper.yaml").read_text()
    assert f"EAGLE-SD ({pe.TREE[0]} x {pe.TREE[1]} tree, {pe.TREE[2]} verified)" in text
    assert {(p.workload["depth"], p.workload["width"], p.workload["verify"]) for p in pts
            if p.workload["scheme"] != "ar"} == {pe.TREE}


def test_an_out_folder_named_like_an_image_is_still_a_folder(tmp_path):
    """A review of the shared out-folder check: a sweep named ``a.png`` (its default folder
    ``out/sweep-a.png``) or ``--out run.svg`` was refused as "a file, not a folder", which the
    other commands' ``--plot fig.png`` rightly are; a sweep's folder is named by its user."""
    spec = _write(tmp_path, "workload:\n  model: [qwen3-30b-a3b]\n  scheme: [ar]\n")
    out = tmp_path / "run.svg"
    res = run_sweep(spec, out, workers=0, cache_dir=tmp_path / "c", progress=False,
                    plots=False, say=_quiet)
    assert res.ran == 1 and (out / "sweep.json").is_file()


def test_spec_mistakes_an_audit_found_are_named(tmp_path, capsys):
    """An audit (2026-12-06, seventh session): a list as ``base`` gave a TypeError traceback, a
    deeply nested constraint a RecursionError, ``samples: 1000000000`` filled the memory, and
    ``build_arch`` raised TypeError / AttributeError for a field it does not know."""
    from elmoe3d.config import ConfigError, preset
    from elmoe3d.sw.host.sweep_spec import MAX_COMBINATIONS, build_arch
    spec = tmp_path / "s.yaml"
    spec.write_text("base: [paper-4gb]\nworkload:\n  model: [qwen3-30b-a3b]\n")
    assert cli.main(["sweep", str(spec), "--check"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"elmoe3d sweep: error: {spec}: base: unknown configuration ['paper-4gb']; expected "
        f"one of small, mid, paper-4gb, paper-8gb"]
    with pytest.raises(ConfigError, match=r"^unknown configuration \{'a': 1\}"):
        preset({"a": 1})
    # (3000 and 5000 fail in Python's parser; 1000 passes it and is the depth walk's)
    for text in ("not " * 3000 + "pes", "-" * 5000 + "1 < pes", "not " * 1000 + "pes",
                 " + ".join(["pes"] * 500) + " > 0"):
        with pytest.raises(ExprError, match=r"\.\.\.': operators nested or chained more "
                                            r"than 400 deep$"):
            compile_expr(text, ["pes"])
    assert compile_expr("not " * 51 + "pes", ["pes"])({"pes": 0}) is True
    assert compile_expr(" + ".join(["pes"] * 300) + " > 0", ["pes"])({"pes": 1}) is True
    with pytest.raises(UserError, match=r"samples: sampling random needs a positive integer up "
                                        r"to 1,000,000, got 1000000000"):
        parse_spec({"sampling": "random", "samples": 10 ** 9, "config": {"pes": [4, 16]},
                    "workload": {"model": ["qwen3-30b-a3b"]}})
    big = parse_spec({"config": {"pes": list(range(1, 1001)), "tile.rows": list(range(1, 1001)),
                                 "tile.lanes": [1, 2]},
                      "workload": {"model": ["qwen3-30b-a3b"]}})
    with pytest.raises(UserError, match=r"^<spec>: 2,000,000 combinations \(config points x "
                                        r"the workload grid\), more than 1,000,000"):
        expand(big)
    # sampled config points count as their samples, and the workload grid multiplies them
    sampled = parse_spec({"sampling": "random", "samples": 500_001, "config": {"pes": [4, 16]},
                          "workload": {"model": ["qwen3-30b-a3b"], "batch": [1, 4]}})
    with pytest.raises(UserError, match=r"^<spec>: 1,000,002 combinations"):
        expand(sampled)
    wide = parse_spec({"workload": {"model": ["qwen3-30b-a3b"], "batch": list(range(1, 1001)),
                                    "context": list(range(1, 1002))}})
    with pytest.raises(UserError, match=r"^<spec>: 1,001,000 combinations"):
        expand(wide)
    assert MAX_COMBINATIONS == 1_000_000
    for cfg, msg in (({"pez": 8}, r"unknown config field 'pez' \(did you mean 'pes'\?\)"),
                     ({"tile.rowz": 8}, r"unknown config field 'tile.rowz' \(did you mean "
                                        r"'tile.rows'\?\)"),
                     (None, r"config: expected a table of fields, got None"),
                     ({1: 8}, r"unknown config field 1;")):
        with pytest.raises(ConfigError, match="^" + msg):
            build_arch("paper-4gb", cfg)


def test_sigterm_stops_a_sweep_as_ctrl_c_does(tmp_path):
    """SIGTERM (``timeout``, ``kill``, a batch scheduler) on the third point of a sweep run as
    a program: it says "terminated", sweep.json says "interrupted" with the two rows finished
    (it said "running" for ever), and the process then ends by SIGTERM (status -15 here, 143
    in a shell), as it would have without the clean-up."""
    import signal
    import subprocess
    spec = _write(tmp_path, SPEC.replace("pes: [16, 32]", "pes: [16]")
                  .replace("batch: [1, 16]", "batch: [1]"))
    out = tmp_path / "out"
    script = (
        "import os, signal, sys\n"
        "from elmoe3d.sw.host import sweep\n"
        "calls, run_point = [], sweep.run_point\n"
        "def terminated(point, cache_dir):\n"
        "    calls.append(point)\n"
        "    if len(calls) == 3:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return run_point(point, cache_dir)\n"
        "sweep.run_point = terminated\n"
        "import elmoe3d.cli as cli\n"
        f"sys.exit(cli.main(['sweep', {str(spec)!r}, '--out', {str(out)!r}, '--workers', '0',"
        f" '--no-progress', '--cache', {str(tmp_path / 'c')!r}]))\n")
    # the timeout is a hang guard (a sweep the signal failed to stop), not a speed check
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "elmoe3d sweep: terminated (SIGTERM)" in proc.stderr
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["status"] == "interrupted" and doc["finished"] == 2


def test_sampled_config_fields_are_an_axis_and_a_colour_not_a_line_each(tmp_path):
    """A new user's random sample of two continuous config fields (2026-12-07): each point
    had a line and a legend entry of its own (24 samples: 24 entries, the plot buried). Now the
    sampled field with the most values is the x axis (over a workload axis with fewer), the
    other the points' colour (a colour bar), and the lines' keys stay what has few values (the
    batch, the scheme): a legend of four. A grid field that follows nothing but takes a value
    per sampled point (``pes`` here, three choices) still makes lines."""
    import random
    from elmoe3d.sw.host import sweep as sweep_mod
    from elmoe3d.sw.host.sweep import pareto_plots
    rng = random.Random(5)
    print("seed 5")
    samples = [(rng.uniform(0.2, 0.8), rng.uniform(2.0, 6.0)) for _ in range(20)]
    rows = [{"model": "a", "scheme": sc, "batch": b, "pes": 16, "hb_pj_per_bit": hb,
             "ext_pj_per_bit": ext, "tokens_per_s": 10.0 * b, "tokens_per_j": 100.0 / ext}
            for hb, ext in samples for b in (1, 4) for sc in ("ar", "elastic")]
    axes = {"hb_pj_per_bit", "ext_pj_per_bit", "batch", "scheme"}
    drawn, bars, legends = [], [], []
    import matplotlib.axes
    import matplotlib.figure
    import unittest.mock
    real_scatter, real_bar = matplotlib.axes.Axes.scatter, matplotlib.figure.Figure.colorbar
    real_legend, real_plot = matplotlib.axes.Axes.legend, matplotlib.axes.Axes.plot

    def scatter(self, xs, ys, *args, **kw):
        drawn.append((kw.get("label"), list(xs), list(kw.get("c"))))
        return real_scatter(self, xs, ys, *args, **kw)

    def colorbar(self, mappable, *args, **kw):
        bar = real_bar(self, mappable, *args, **kw)
        bars.append(bar)
        return bar

    def legend(self, *args, **kw):
        out = real_legend(self, *args, **kw)
        legends.append([t.get_text() for t in out.get_texts()])
        return out

    def plot(self, *args, **kw):
        raise AssertionError("no line joins points whose colour field differs")
    with unittest.mock.patch.object(matplotlib.axes.Axes, "scatter", scatter), \
            unittest.mock.patch.object(matplotlib.figure.Figure, "colorbar", colorbar), \
            unittest.mock.patch.object(matplotlib.axes.Axes, "legend", legend), \
            unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot):
        files = pareto_plots(rows, tmp_path, axes=axes)
    assert sorted(files) == ["by-hb_pj_per_bit:a"]
    assert files["by-hb_pj_per_bit:a"].stat().st_size > 1000
    groups = ["ar, batch 1", "ar, batch 4", "elastic, batch 1", "elastic, batch 4"]
    assert [label for label, _, _ in drawn] == groups * 2
    assert legends == [groups] * 2
    assert all(len(xs) == 20 and xs == sorted(xs) for _, xs, _ in drawn)
    by_hb = dict(samples)
    assert all(c == [by_hb[x] for x in xs] for _, xs, c in drawn)
    assert [bar.ax.get_ylabel() for bar in bars] == ["ext_pj_per_bit"] * 2
    # a third sampled field is named beside the colour's; a list field sampled with them
    # (ext_channels, three choices) keys the groups: it does not follow the x axis, which
    # determines it (every point has an x of its own) but is not determined by it
    rows3 = [dict(r, clock_ghz=0.5 + r["hb_pj_per_bit"] * r["ext_pj_per_bit"] / 7,
                  ext_channels=(2, 4, 8)[int(r["ext_pj_per_bit"] * 10) % 3]) for r in rows
             if r["scheme"] == "ar" and r["batch"] == 1]
    drawn.clear(), bars.clear()
    with unittest.mock.patch.object(matplotlib.axes.Axes, "scatter", scatter), \
            unittest.mock.patch.object(matplotlib.figure.Figure, "colorbar", colorbar):
        files = pareto_plots(rows3, tmp_path, axes={"hb_pj_per_bit", "ext_pj_per_bit",
                                                     "clock_ghz", "ext_channels"})
    assert sorted(files) == ["by-clock_ghz:a"]
    channels = sorted({r["ext_channels"] for r in rows3})
    assert len(channels) > 1
    assert [label for label, _, _ in drawn] == [f"ext_channels {c}" for c in channels] * 2
    assert [bar.ax.get_ylabel() for bar in bars] == [
        "hb_pj_per_bit; also varying: ext_pj_per_bit"] * 2
    # a review's trials: a point without a number in the colour's field is drawn grey,
    # not a flood of lines; a workload axis with many values (a grid's) stays lines
    holes = [dict(r, ext_pj_per_bit=None) if i == 3 else r for i, r in enumerate(rows)]
    drawn.clear(), bars.clear()
    greys = []

    def scatter2(self, xs, ys, *args, **kw):
        if isinstance(kw.get("c"), str):
            greys.append(list(xs))
            return real_scatter(self, xs, ys, *args, **kw)
        return scatter(self, xs, ys, *args, **kw)
    with unittest.mock.patch.object(matplotlib.axes.Axes, "scatter", scatter2), \
            unittest.mock.patch.object(matplotlib.axes.Axes, "plot", plot):
        files = pareto_plots(holes, tmp_path, axes=axes)
    assert sorted(files) == ["by-hb_pj_per_bit:a"] and len(drawn) == 8
    assert greys == [[rows[3]["hb_pj_per_bit"]]] * 2
    grid = [{"model": "a", "scheme": "ar", "batch": b, "context": c, "pes": 16,
             "tokens_per_s": 1.0 * b, "tokens_per_j": 1.0 / c}
            for b in range(1, 10) for c in (256 * k for k in range(1, 11))]
    lines = []
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot",
                                    lambda self, xs, ys, *a, **kw: lines.append(kw["label"])
                                    or real_plot(self, xs, ys, *a, **kw)):
        assert sorted(pareto_plots(grid, tmp_path, axes={"batch", "context"})) == [
            "by-context:a"]
    assert lines == [f"batch {b}" for b in range(1, 10)] * 2
    # eight values or fewer: lines, as before (a grid's list)
    few = [r for r in rows if r["hb_pj_per_bit"] in sorted(by_hb)[:5]]
    lines = []
    with unittest.mock.patch.object(matplotlib.axes.Axes, "plot",
                                    lambda self, xs, ys, *a, **kw: lines.append(kw["label"])
                                    or real_plot(self, xs, ys, *a, **kw)):
        assert sorted(pareto_plots(few, tmp_path, axes=axes)) == ["by-batch:a"]
    assert len(lines) == 2 * 2 * 5 and sweep_mod.MAX_LINE_VALUES == 8


def test_the_tables_and_plots_are_written_all_or_none(tmp_path, monkeypatch):
    """A review's finding (2026-12-07): the three tables were renamed into place one by one,
    so a CSV write that failed (a full disk) left the new parquet beside the old CSV and JSON
    and its temporary file behind. Now a failure leaves the earlier run's three tables and
    its plots as they were, and no temporary file; the error names the table, not a
    temporary file. A run that succeeds replaces the tables and removes the plots it no
    longer draws, after writing its own."""
    import errno
    import pyarrow.csv
    from elmoe3d.sw.host.sweep import consolidate, pareto_plots
    from elmoe3d.cli.outputs import AtomicOutputs
    old = [{"point": 0, "model": "a", "scheme": "ar", "die_mm2": 1.0, "tokens_per_s": 1.0,
            "tokens_per_j": 1.0}]
    consolidate(old, tmp_path)
    (tmp_path / "by-batch-a.png").write_bytes(b"an earlier run's plot")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real = pyarrow.csv.write_csv

    def full_disk(table, where, *args, **kw):
        Path(where).write_text("point,mod")
        raise OSError(errno.ENOSPC, "No space left on device", str(where))
    monkeypatch.setattr(pyarrow.csv, "write_csv", full_disk)
    new = [dict(old[0], tokens_per_s=2.0), dict(old[0], point=1, die_mm2=2.0)]
    outputs = AtomicOutputs()
    with pytest.raises(OSError) as info:
        try:
            consolidate(new, tmp_path, outputs)
            pareto_plots(new, tmp_path, outputs=outputs)
            outputs.commit()
        except OSError as exc:
            raise outputs.for_user(exc) from None
        finally:
            outputs.discard()
    assert info.value.filename == str(tmp_path / "results.csv")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(OSError) as info:        # consolidate on its own: the same
        consolidate(new, tmp_path)
    assert info.value.filename == str(tmp_path / "results.csv")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    monkeypatch.setattr(pyarrow.csv, "write_csv", real)
    outputs = AtomicOutputs()
    consolidate(new, tmp_path, outputs)
    pareto_plots(new, tmp_path, outputs=outputs, earlier=[str(tmp_path / "by-batch-a.png")])
    assert (tmp_path / "by-batch-a.png").exists()       # not before the commit
    outputs.commit()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "pareto-a.png", "results.csv", "results.json", "results.parquet"]
    assert len(json.loads((tmp_path / "results.json").read_text())) == 2
    # an earlier output that cannot be removed (a folder of that name) is left, the commit
    # done (a review found it failed the run after the new files were in place)
    (tmp_path / "by-batch-b.png").mkdir()
    outputs = AtomicOutputs()
    consolidate(new, tmp_path, outputs)
    pareto_plots(new, tmp_path, outputs=outputs, earlier=[str(tmp_path / "by-batch-b.png")])
    outputs.commit()
    assert (tmp_path / "by-batch-b.png").is_dir() and (tmp_path / "pareto-a.png").exists()


def test_a_sampled_field_colours_the_pareto_points(tmp_path):
    """A new user's sweep (2026-12-07): two dies and a sampled field that moves neither the
    area nor the PE count; the Pareto plot showed one dot where 12 points of a die differed
    in it. Now the field is the points' colour (a colour bar), the scheme their marker, and
    the fronts are unchanged; without such a field the points are coloured by scheme."""
    import random
    from elmoe3d.sw.host.sweep import pareto_plots
    rng = random.Random(9)
    print("seed 9")
    rows = [{"model": "a", "scheme": sc, "batch": 1, "pes": pes, "ext_pj_per_bit": e,
             "tokens_per_s": pes * (2 if sc == "elastic" else 1), "tokens_per_j": 100.0 / e}
            for pes in (16, 32) for e in (rng.uniform(2.0, 6.0) for _ in range(12))
            for sc in ("ar", "elastic")]
    import matplotlib.axes
    import matplotlib.figure
    import unittest.mock
    real_scatter, real_bar = matplotlib.axes.Axes.scatter, matplotlib.figure.Figure.colorbar
    drawn, bars = [], []

    def scatter(self, xs, ys, *args, **kw):
        drawn.append((kw.get("label"), kw.get("c")))
        return real_scatter(self, xs, ys, *args, **kw)

    def colorbar(self, mappable, *args, **kw):
        bar = real_bar(self, mappable, *args, **kw)
        bars.append(bar)
        return bar
    with unittest.mock.patch.object(matplotlib.axes.Axes, "scatter", scatter), \
            unittest.mock.patch.object(matplotlib.figure.Figure, "colorbar", colorbar):
        files = pareto_plots(rows, tmp_path, axes={"pes", "ext_pj_per_bit", "scheme"})
        assert sorted(files) == ["pareto:a"]
        assert [label for label, _ in drawn] == ["ar", "elastic"] * 2
        assert all(len(c) == 24 for _, c in drawn)
        assert [b.ax.get_ylabel() for b in bars] == ["ext_pj_per_bit"] * 2
        drawn.clear(), bars.clear()
        pareto_plots(rows, tmp_path, axes={"pes", "scheme"})     # not swept: by scheme
        assert [(label, c) for label, c in drawn] == [("ar", None), ("elastic", None)] * 2
        assert bars == []

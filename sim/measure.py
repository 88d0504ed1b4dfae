"""Wall time and peak memory of a step that runs in a child process tree (a Verilator build:
``verilator`` then ``make -j`` of ``g++`` processes).

:func:`measured_call` runs a picklable function in a forked child process (``multiprocessing``,
fork context) and measures, while it runs:

* ``wall_seconds`` -- the child's wall time;
* ``peak_rss_bytes`` -- the largest resident set of any single process of the tree (what
  ``/usr/bin/time -v`` prints as "Maximum resident set size"), the larger of
  ``peak_rss_self_bytes`` (the child itself: ``RUSAGE_SELF`` ``ru_maxrss``, e.g. Amaranth's
  Verilog generation) and ``peak_rss_children_bytes`` (``RUSAGE_CHILDREN``: the largest
  descendant it waited for). Linux counts a forked process's resident set at the fork in its
  maximum, so a tool started by a large Python process (``subprocess``) shows at least that
  process's size there: ``peak_rss_by_name`` has the tools' own figures;
* ``peak_tree_rss_bytes`` -- the largest sum of resident sets of the whole tree at one instant
  (psutil's RSS of the child and its descendants, sampled every
  ``interval`` seconds: what the machine must hold with ``make -j`` compiling in parallel;
  a sampled figure, so a short spike between samples can be missed);
* ``peak_process`` -- the command name of the process with the largest sampled RSS;
  ``peak_rss_by_name`` -- the largest sampled RSS of each command name (``verilator_bin``,
  ``cc1plus``, ``python``, ...);
* ``cpu_seconds`` -- user + system CPU time of the child and every descendant it waited for
  (``cpu_self_seconds``, ``cpu_children_seconds``): unlike the wall time, not stretched by
  other work on the machine (``load_average_start`` / ``_end``: the 1-minute load average).

The ``ru_maxrss`` figures assume Linux (KiB); the sampled ones come from psutil.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import sys
import threading
import time
import traceback


__all__ = ["measured_call", "tree_rss", "kill_tree"]


def tree_rss(root_pid):
    """``(sum of RSS bytes, [(rss, pid, name), ...])`` of ``root_pid`` and its descendants
    (psutil; processes that exit meanwhile are skipped)."""
    import psutil
    try:
        root = psutil.Process(root_pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0, []
    out = []
    for p in procs:
        try:
            rss = p.memory_info().rss
            name = p.name()
        except psutil.Error:
            continue
        if rss:
            out.append((rss, p.pid, name))
    return sum(r[0] for r in out), out


def kill_tree(root_pid) -> None:
    """Kill ``root_pid`` and its descendants (psutil; those gone meanwhile are skipped): a
    measured build must not outlive the command that started it (SIGTERM reaches only the
    command, not its process group as Ctrl-C does)."""
    import psutil
    try:
        root = psutil.Process(root_pid)
        procs = root.children(recursive=True) + [root]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=KILL_WAIT_S)     # gone before the command says so


#: Seconds :func:`kill_tree` waits for the killed processes to go (SIGKILL: at once, unless a
#: process is stuck in the kernel).
KILL_WAIT_S = 10


def _load():
    """The 1-minute load average (None where the system has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _child(conn, fn, args, kwargs):
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_DFL)    # not the command's handler: just stop
    try:
        value, error = fn(*args, **kwargs), None
    except BaseException as exc:                          # noqa: BLE001 - sent to the parent
        value, error = None, (type(exc).__name__, str(exc), traceback.format_exc())
    me, kids = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = {"cpu_self_seconds": me.ru_utime + me.ru_stime,
           "cpu_children_seconds": kids.ru_utime + kids.ru_stime}
    conn.send((value, error, me.ru_maxrss * 1024, kids.ru_maxrss * 1024, cpu))
    conn.close()


def measured_call(fn, *args, interval: float = 0.25, **kwargs):
    """Run ``fn(*args, **kwargs)`` in a forked child; return ``(value, figures)`` where
    ``figures`` holds the measurements named in the module docstring. Re-raises an exception
    of ``fn`` as ``RuntimeError`` quoting its type, message and traceback."""
    load = (_load(),)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    start = time.perf_counter()
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs), daemon=False)
    proc.start()
    child.close()
    peak = {"tree": 0, "one": 0, "name": "", "by_name": {}}
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            total, procs = tree_rss(proc.pid)
            if total > peak["tree"]:
                peak["tree"] = total
            for rss, _, name in procs:
                if rss > peak["one"]:
                    peak["one"], peak["name"] = rss, name
                if rss > peak["by_name"].get(name, 0):
                    peak["by_name"][name] = rss
            stop.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = parent.recv()
    except EOFError:
        result = None
    except BaseException:               # Ctrl-C, SIGTERM (errors.Terminated): stop the child
        stop.set()
        kill_tree(proc.pid)
        proc.join()
        raise
    proc.join()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    if result is None:
        raise RuntimeError(f"the measured child process died (exit code {proc.exitcode})")
    value, error, own_rss, children_rss, cpu = result
    if error is not None:
        name, message, tb = error
        raise RuntimeError(f"{name}: {message}\n{tb}")
    figures = {"wall_seconds": wall,
               "peak_rss_bytes": max(own_rss, children_rss, peak["one"]),
               "peak_rss_self_bytes": own_rss, "peak_rss_children_bytes": children_rss,
               "peak_tree_rss_bytes": peak["tree"], "peak_process": peak["name"],
               "peak_rss_by_name": dict(sorted(peak["by_name"].items(), key=lambda kv: -kv[1])),
               "sample_interval_s": interval, **cpu,
               "cpu_seconds": cpu["cpu_self_seconds"] + cpu["cpu_children_seconds"],
               "load_average_start": load[0], "load_average_end": _load()}
    return value, figures


if __name__ == "__main__":                                 # pragma: no cover - manual check
    print(measured_call(sum, [1, 2, 3]), file=sys.stderr)

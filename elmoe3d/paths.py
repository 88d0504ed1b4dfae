"""Where generated build output goes: the simulator's Verilog (``verilog/``) and Verilator
models (``<name>-<digest>/``), the compute calibrations of shapes the shipped tables lack
(``calib/``), the synthesis cache (``synth/``) and the FPGA flow's builds and estimates
(``fpga/``) share one build root, so a command finds the same caches from any working folder
(``make synth``'s warm cache from ``/tmp`` too). :func:`memo_text` is how a file of such a
cache is made once, whatever number of processes want it."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

__all__ = ["BUILD_ROOT_ENV", "build_root", "memo_text"]

#: Environment variable overriding the build root (default ``<repo>/build``).
BUILD_ROOT_ENV = "ELMOE3D_BUILD_DIR"


def build_root() -> Path:
    """``$ELMOE3D_BUILD_DIR`` (resolved), else ``build/`` in the repository (or in the
    current folder when the package is installed elsewhere). Read at each call, so a test or
    a script may set the variable after import."""
    env = os.environ.get(BUILD_ROOT_ENV)
    if env:
        return Path(env).resolve()
    repo = Path(__file__).resolve().parent.parent
    if (repo / "pyproject.toml").is_file():
        return repo / "build"
    return Path.cwd() / "build"


def memo_text(path, produce) -> tuple:
    """``(text, made)``: the text of the file ``path``, made once by ``produce()`` (a str).
    Under an exclusive lock on ``.<name>.lock`` beside it (pytest-xdist workers, sweep workers
    and later runs that want the same file wait for one maker and read its file), the file is
    read when present (``made`` False), else ``produce()`` is written to a temporary file in
    the same folder and renamed into place (``made`` True): never half a file. Creates the
    folder; raises OSError when it cannot (before ``produce`` runs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if path.is_file():
                return path.read_text(), False
            text = produce()
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
            return text, True
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)

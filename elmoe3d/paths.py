"""Where generated build output goes: the simulator's Verilog (``verilog/``) and Verilator
models (``<name>-<digest>/``), the synthesis cache (``synth/``) and the FPGA flow's builds and
estimates (``fpga/``) share one build root, so a command finds the same caches from any
working folder (``make synth``'s warm cache from ``/tmp`` too)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["BUILD_ROOT_ENV", "build_root"]

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

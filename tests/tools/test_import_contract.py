"""The import contract between the layers (issue 23, BRIEF section 8).

* The golden model (``sw/golden``, :mod:`elmoe3d.sw.golden`) is plain NumPy: it never imports
  Amaranth, cocotb, pyserial or torch, nor the host layer, the RTL, the benches, synthesis or the
  CLI -- anywhere, module level or inside a function.
* The host layer (``sw/host``) never imports Amaranth or cocotb at module level: the RTL and
  FPGA backends import them lazily, inside the functions that need them.
* The RTL (``hw/``) never imports the host layer, the benches, synthesis or the CLI.

Two checks. Statically, every ``.py`` file of the layer is parsed (:mod:`ast`) and every
``import`` / ``from ... import`` (relative ones resolved against the file's package, ``from
.. import host`` counted as ``elmoe3d.sw.host``) and every ``importlib.import_module("...")`` /
``__import__("...")`` with a literal name is checked; "module level" is every statement that
runs when the module is imported: outside function bodies (class bodies, decorators and
default values included), not under ``if TYPE_CHECKING:``. A violation is reported as
``file:line: import <module>``. Dynamically, each layer's modules are imported in a fresh
interpreter and ``sys.modules`` is checked afterwards.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from elmoe3d.blocks import ROOT, module_file


#: layer -> (package, forbidden module prefixes, module level only?)
CONTRACT = {
    "golden": ("elmoe3d.sw.golden",
               ("amaranth", "cocotb", "serial", "torch", "elmoe3d.sw.host", "elmoe3d.hw",
                "elmoe3d.sim", "elmoe3d.synth", "elmoe3d.cli"), False),
    "host": ("elmoe3d.sw.host", ("amaranth", "cocotb"), True),
    "hw": ("elmoe3d.hw", ("elmoe3d.sw.host", "elmoe3d.sim", "elmoe3d.synth", "elmoe3d.cli"),
           False),
}


def _forbidden(name, prefixes):
    return next((p for p in prefixes if name == p or name.startswith(p + ".")), None)


def _module_name(package, pkg_dir, path):
    rel = path.relative_to(pkg_dir).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([package, *parts]), path.name == "__init__.py"


def _resolve(node, module, is_package):
    """The absolute module names an ``ImportFrom`` node imports (the module, and each name
    as a possible submodule)."""
    if node.level:
        base = module.split(".")
        base = base if is_package else base[:-1]
        base = base[:len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module
    return [mod] + [f"{mod}.{a.name}" for a in node.names if a.name != "*"]


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    """Collects ``(line, module, module_level)`` for every import in a module."""

    def __init__(self, module, is_package):
        self.module, self.is_package = module, is_package
        self.found, self.depth = [], 0

    def _add(self, node, names):
        for name in names:
            self.found.append((node.lineno, name, self.depth == 0))

    def visit_Import(self, node):
        self._add(node, [a.name for a in node.names])

    def visit_ImportFrom(self, node):
        self._add(node, _resolve(node, self.module, self.is_package))

    def visit_Call(self, node):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if name in ("import_module", "__import__") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            self._add(node, [node.args[0].value])
        self.generic_visit(node)

    def _function(self, node):
        for d in getattr(node, "decorator_list", ()):
            self.visit(d)
        self.visit(node.args)
        if getattr(node, "returns", None) is not None:
            self.visit(node.returns)
        self.depth += 1
        for stmt in node.body if isinstance(node.body, list) else [node.body]:
            self.visit(stmt)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_If(self, node):
        if _is_type_checking(node.test):
            self.depth += 1
            for stmt in node.body:
                self.visit(stmt)
            self.depth -= 1
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)


def imports_of(path: Path, module: str, is_package: bool):
    """``[(line, imported module, module_level)]`` of the source file ``path`` (module
    ``module``)."""
    v = _Imports(module, is_package)
    v.visit(ast.parse(path.read_text(), filename=str(path)))
    return v.found


def violations(layer: str, root: Path | None = None) -> list:
    """``file:line: import <module>`` lines breaking ``layer``'s contract (:data:`CONTRACT`),
    over every ``.py`` file of the layer's folder (``root``: another folder laid out like it)."""
    package, prefixes, module_level_only = CONTRACT[layer]
    pkg_dir = root or module_file(package)
    out = []
    for path in sorted(pkg_dir.rglob("*.py")):
        module, is_package = _module_name(package, pkg_dir, path)
        for line, name, top in imports_of(path, module, is_package):
            bad = _forbidden(name, prefixes)
            if bad and (top or not module_level_only):
                try:
                    shown = path.relative_to(ROOT)
                except ValueError:
                    shown = path
                where = "at module level " if module_level_only else ""
                out.append(f"{shown}:{line}: import {name} ({layer} never imports {bad} "
                           f"{where}-- tests/tools/test_import_contract.py)")
    return out


@pytest.mark.parametrize("layer", list(CONTRACT))
def test_layer_keeps_its_import_contract(layer):
    bad = violations(layer)
    assert not bad, "\n".join(bad)


#: What the golden model may import besides the standard library: NumPy and the package root.
GOLDEN_ALLOWED = ("numpy", "elmoe3d.config", "elmoe3d.isa", "elmoe3d.errors", "elmoe3d.checks",
                  "elmoe3d.sw.golden")


def test_golden_imports_only_numpy_and_the_package_root():
    """Stronger than the list of forbidden modules: the standard library, NumPy, the package
    root's configuration, ISA, errors and number checks, and the golden model itself, nothing
    else."""
    pkg_dir = module_file("elmoe3d.sw.golden")
    bad = []
    for path in sorted(pkg_dir.rglob("*.py")):
        module, is_package = _module_name("elmoe3d.sw.golden", pkg_dir, path)
        for line, name, _ in imports_of(path, module, is_package):
            if name.split(".")[0] not in sys.stdlib_module_names \
                    and not _forbidden(name, GOLDEN_ALLOWED):
                bad.append(f"{path.relative_to(ROOT)}:{line}: import {name} (the golden model "
                           f"imports the standard library and {', '.join(GOLDEN_ALLOWED)} only)")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer", list(CONTRACT))
def test_the_checker_reads_every_file(layer):
    """The walk finds the layer's files and their imports (the package root's for golden, the
    golden model's for host and hw)."""
    package = CONTRACT[layer][0]
    pkg_dir = module_file(package)
    files = sorted(pkg_dir.rglob("*.py"))
    assert len(files) >= 8, files
    seen = set()
    for path in files:
        module, is_package = _module_name(package, pkg_dir, path)
        seen |= {name for _, name, _ in imports_of(path, module, is_package)}
    expected = {"golden": "elmoe3d.config", "host": "elmoe3d.sw.golden.asm",
                "hw": "elmoe3d.isa"}[layer]
    assert expected in seen, sorted(seen)


def test_a_violation_is_named_with_file_and_line(tmp_path):
    """Each rule caught on a planted file: relative and absolute imports, a function's import
    in the golden model, a literal import_module; the host's lazy imports allowed, its
    module-level and class-level ones not."""
    golden = tmp_path / "golden"
    (golden / "sub").mkdir(parents=True)
    (golden / "__init__.py").write_text("")
    (golden / "sub" / "__init__.py").write_text("from ... import host\n")
    (golden / "m.py").write_text(
        "import numpy as np\n"
        "from ..host import compiler\n"
        "from elmoe3d.config import ArchConfig\n"
        "def f():\n"
        "    import amaranth.hdl\n"
        "    import importlib\n"
        "    importlib.import_module('cocotb.triggers')\n")
    assert violations("golden", golden) == [
        f"{golden}/m.py:2: import elmoe3d.sw.host (golden never imports elmoe3d.sw.host -- "
        "tests/tools/test_import_contract.py)",
        f"{golden}/m.py:2: import elmoe3d.sw.host.compiler (golden never imports "
        "elmoe3d.sw.host -- tests/tools/test_import_contract.py)",
        f"{golden}/m.py:5: import amaranth.hdl (golden never imports amaranth -- "
        "tests/tools/test_import_contract.py)",
        f"{golden}/m.py:7: import cocotb.triggers (golden never imports cocotb -- "
        "tests/tools/test_import_contract.py)",
        f"{golden}/sub/__init__.py:1: import elmoe3d.sw.host (golden never imports "
        "elmoe3d.sw.host -- tests/tools/test_import_contract.py)",
    ]
    host = tmp_path / "host"
    host.mkdir()
    (host / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from amaranth.lib import wiring\n"
        "def run():\n"
        "    from cocotb.triggers import RisingEdge\n"
        "class Backend:\n"
        "    from amaranth.hdl import Signal\n"
        "    def go(self, x=__import__('cocotb')):\n"
        "        import amaranth\n")
    assert [v.split(" (")[0] for v in violations("host", host)] == [
        f"{host}/b.py:7: import amaranth.hdl", f"{host}/b.py:7: import amaranth.hdl.Signal",
        f"{host}/b.py:8: import cocotb"]


_IMPORT_ALL = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module(sys.argv[1])
for m in pkgutil.walk_packages(pkg.__path__, sys.argv[1] + "."):
    importlib.import_module(m.name)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize("layer", list(CONTRACT))
def test_importing_a_layer_loads_nothing_forbidden(layer):
    """Every module of the layer imported in a fresh interpreter: nothing forbidden (for the
    host: at module level) is in ``sys.modules`` afterwards."""
    package, prefixes, _ = CONTRACT[layer]
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL, package], capture_output=True,
                          text=True, check=True, cwd=ROOT)
    loaded = json.loads(done.stdout)
    assert any(m.startswith(package + ".") for m in loaded)
    bad = sorted(m for m in loaded if _forbidden(m, prefixes))
    assert not bad, f"importing {package} loads {bad}"

"""``make clean`` keeps the expensive caches; ``make distclean`` removes everything.

A new-user trial (2026-12-04): ``make clean`` deleted ``build/synth``, the Yosys cache whose
cold refill is a 50-minute ``make synth``. The targets run here on a stand-in tree."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

#: The stand-in tree: (path, kept by ``make clean``).
TREE = [
    ("build/synth/0a1b.json", True),
    ("build/synth/power/pe.blif", True),
    ("build/synth/report.json", False),         # make synth's reports, not cache: elmoe3d fpga
    ("build/synth/area.png", False),            # reads that report by default
    ("build/fpga/estimates/3c4d.netlist.json.gz", True),
    ("build/calib/ffn-0a1b2c3d4e5f6a7b.json", True),
    ("build/fpga/ulx3s-85f/top.bit", False),
    ("build/die_small-ae7efa34b560/Vtop", False),
    ("build/.verilator-runtime-123456789abc/verilated.o", False),
    ("build/.die_small-ae7efa34b560.lock", False),
    ("build/verilog/tile.v", False),
    ("build/paper-pe.json", False),
    ("out/paper/fig12_8gb.png", False),
    (".venv/bin/python", True),
]


#: The environment of a make run here: without the variables a parent make (``make test``)
#: passes down, which would turn on its "Entering/Leaving directory" lines.
MAKE_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}

#: Seconds before a make run counts as hung: a guard so that a hang fails this test rather than
#: stalling the suite, not a speed check (a run takes well under a second; 10 minutes leaves a
#: loaded machine any margin).
HANG_GUARD_S = 600


def _make(tmp_path, target, *assignments):
    return subprocess.run(["make", "--no-print-directory", "-f", str(REPO / "Makefile"), target,
                           "VENV=.venv", *assignments], cwd=tmp_path, capture_output=True,
                          text=True, timeout=HANG_GUARD_S, env=MAKE_ENV)


def _tree(tmp_path):
    for name, _ in TREE:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")


def test_clean_keeps_the_synthesis_and_estimate_caches(tmp_path):
    _tree(tmp_path)
    r = _make(tmp_path, "clean")
    assert r.returncode == 0, r.stderr
    for name, kept in TREE:
        assert (tmp_path / name).exists() == kept, name
    assert not (tmp_path / "out").exists()
    assert "kept the caches build/synth build/fpga/estimates build/calib" in r.stdout
    again = _make(tmp_path, "clean")                       # idempotent
    assert again.returncode == 0, again.stderr


def test_clean_keeps_what_keep_caches_names_and_nothing_else(tmp_path):
    """The kept folders are written once, in KEEP_CACHES: the exclusions of the clean are made
    from it (they were written a second time as find ! -name ... options), the folders on the
    way to a kept one (build/a, build/a/b) stay and lose their other entries."""
    tree = {"build/a/b/c/entry.json": True, "build/a/b/other/x": False, "build/a/x": False,
            "build/keep/y": True, "build/synth/0a1b.json": False, "build/z": False,
            "build/fpga/estimates/e.json": False}
    for name in tree:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    r = _make(tmp_path, "clean", "KEEP_CACHES=build/keep build/a/b/c")
    assert r.returncode == 0, r.stderr
    for name, kept in tree.items():
        assert (tmp_path / name).exists() == kept, name
    assert sorted(p.name for p in (tmp_path / "build").iterdir()) == ["a", "keep"]
    assert sorted(p.name for p in (tmp_path / "build/a").iterdir()) == ["b"]
    assert sorted(p.name for p in (tmp_path / "build/a/b").iterdir()) == ["c"]


def test_clean_without_a_build_folder(tmp_path):
    r = _make(tmp_path, "clean")
    assert r.returncode == 0
    assert r.stdout.splitlines()[-1] == ("make clean: no cache to keep (none of build/synth "
                                         "build/fpga/estimates build/calib exists)")


def test_clean_names_only_the_caches_that_exist(tmp_path):
    """``make clean`` said "kept the caches build/synth build/fpga/estimates" when neither
    existed: it names the kept caches that exist."""
    (tmp_path / "build/synth").mkdir(parents=True)
    (tmp_path / "build/synth/0a1b.json").write_text("x")
    (tmp_path / "build/verilog").mkdir()
    r = _make(tmp_path, "clean")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == ("make clean: kept the caches build/synth (make "
                                         "distclean removes them)")
    shutil.rmtree(tmp_path / "build/synth")
    r = _make(tmp_path, "clean")
    assert r.returncode == 0, r.stderr
    assert "no cache to keep" in r.stdout and "kept the caches" not in r.stdout


def test_distclean_removes_everything(tmp_path):
    _tree(tmp_path)
    r = _make(tmp_path, "distclean")
    assert r.returncode == 0, r.stderr
    assert not any((tmp_path / d).exists() for d in ("build", "out", ".venv"))


def test_make_help_says_what_clean_keeps():
    r = subprocess.run(["make", "-s", "--no-print-directory", "-C", str(REPO), "help"],
                       capture_output=True, text=True, timeout=HANG_GUARD_S, env=MAKE_ENV)
    flat = " ".join(r.stdout.split())
    assert "keep the caches build/synth build/fpga/estimates build/calib (Yosys" in flat
    assert "make distclean - remove everything clean leaves too" in flat

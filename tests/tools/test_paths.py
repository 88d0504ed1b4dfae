"""One build root for the simulator, the synthesis cache and the FPGA flow
(:mod:`elmoe3d.paths`): the same folder from any working directory, so ``elmoe3d synth``
run outside the checkout finds ``make synth``'s warm cache (a new user's trial ran it from
another folder and waited for a cold synthesis: the cache was ``build/synth`` of the
working folder)."""

from pathlib import Path

import elmoe3d
from elmoe3d.cli.synth import synth_cache_dir as cache_dir
from elmoe3d.paths import BUILD_ROOT_ENV, build_root
from elmoe3d.sim.runner import build_root as sim_build_root
from elmoe3d.synth import fpga

REPO = Path(elmoe3d.__file__).resolve().parent.parent


def test_the_build_root_does_not_follow_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(BUILD_ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert build_root() == REPO / "build"
    assert sim_build_root is build_root
    assert cache_dir() == REPO / "build" / "synth"
    assert fpga.fpga_root() == REPO / "build" / "fpga"
    assert fpga.estimates_dir() == REPO / "build" / "fpga" / "estimates"


def test_the_build_root_follows_the_variable_read_at_each_call(tmp_path, monkeypatch):
    monkeypatch.setenv(BUILD_ROOT_ENV, str(tmp_path / "b"))
    assert cache_dir() == (tmp_path / "b" / "synth").resolve()
    assert fpga.estimates_dir() == (tmp_path / "b" / "fpga" / "estimates").resolve()
    monkeypatch.setenv(BUILD_ROOT_ENV, str(tmp_path / "c"))
    assert build_root() == (tmp_path / "c").resolve()

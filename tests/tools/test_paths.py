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


# == memo_text: a cache file made once ===========================================================

def test_memo_text_makes_a_file_once_and_never_half(tmp_path):
    """Made by the first caller, read by the next; an exception of the maker leaves no file
    and no temporary one, and the lock is free again; a damaged file (not UTF-8, or refused
    by the check) is made again; the file is readable by the cache's other users."""
    import os
    import stat

    import pytest

    from elmoe3d.paths import memo_text
    path = tmp_path / "c" / "x.json"
    calls = []

    def make():
        calls.append(1)
        return '{"a": 1}'
    assert memo_text(path, make) == ('{"a": 1}', True)
    assert memo_text(path, make) == ('{"a": 1}', False) and len(calls) == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644

    def fails():
        raise RuntimeError("no")
    other = tmp_path / "c" / "y.json"
    with pytest.raises(RuntimeError):
        memo_text(other, fails)
    assert not other.exists() and not list((tmp_path / "c").glob("*.tmp"))
    assert memo_text(other, make) == ('{"a": 1}', True)          # the lock was released
    path.write_bytes(b"\xff\xfe\x00")                            # damaged: not UTF-8
    assert memo_text(path, make) == ('{"a": 1}', True)
    assert memo_text(path, make, check=lambda t: t.startswith("[")) == ('{"a": 1}', True)
    assert len(calls) == 4


def test_memo_text_reads_a_cache_where_no_lock_can_be_made(tmp_path):
    """A cache folder where no lock file can be made (read-only, shared; here the lock's name
    is taken by a folder, which stops root too) is read without a lock when the file is
    there; when it is not, the OSError says so before anything is made."""
    import pytest

    from elmoe3d.paths import memo_text
    (tmp_path / "x.json").write_text("kept")
    for name in ("x", "y"):
        (tmp_path / f".{name}.json.lock").mkdir()
    assert memo_text(tmp_path / "x.json", lambda: "new") == ("kept", False)
    with pytest.raises(OSError):
        memo_text(tmp_path / "y.json", lambda: pytest.fail("made without a place to keep it"))


def test_a_build_root_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    """``$ELMOE3D_BUILD_DIR`` under a regular file: :func:`ensure_build_root` raises one
    UserError naming the variable, the folder and the reason, and ``elmoe3d sim``, ``run
    --backend rtl`` and ``paper-pe`` say so before building anything (a new user got a raw
    traceback); an OSError elsewhere is not the build root's (``build_error`` gives None)."""
    import errno
    import pytest
    import elmoe3d.cli as cli
    from elmoe3d.errors import UserError
    from elmoe3d.paths import build_error, ensure_build_root
    from elmoe3d.sw.host import minilm
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(BUILD_ROOT_ENV, str(blocker / "build"))
    with pytest.raises(UserError, match=rf"\$ELMOE3D_BUILD_DIR {blocker}/build: cannot write "
                                        rf"{blocker}/build \(Not a directory\)"):
        ensure_build_root()
    root = blocker / "build"
    inside = build_error(OSError(errno.ENOSPC, "No space left on device",
                                 str(root / "verilog" / "t.v")))
    assert isinstance(inside, UserError) and "(No space left on device)" in str(inside)
    # not the build root's: outside it, beside it (a shared prefix), out of it by "..",
    # relative, a descriptor, or not an error of writing (a missing file is a bug's)
    for name, code in ((blocker / "x", errno.ENOSPC), (f"{root}2/x", errno.EACCES),
                       (root / ".." / "x", errno.EACCES), ("build/x", errno.EACCES),
                       (7, errno.EACCES), (root / "t.v", errno.ENOENT)):
        assert build_error(OSError(code, "e", name if isinstance(name, int) else str(name))) \
            is None, name
    monkeypatch.setattr(minilm, "minilm_path", lambda: tmp_path)   # sim's inputs: not checked
    from elmoe3d.sim import bench_host, runner

    def built(*a, **k):
        raise AssertionError("built before the build folder was checked")
    monkeypatch.setattr(runner, "generate_verilog", built)
    monkeypatch.setattr(runner, "build", built)
    monkeypatch.setattr(bench_host, "run_host_rtl", built)
    for argv in (["sim"], ["run", "--backend", "rtl", "--trace", "gsm8k"],
                 ["paper-pe", "--build-only"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot write" in err and "ELMOE3D_BUILD_DIR" in err
    assert not (blocker.parent / "build").exists()

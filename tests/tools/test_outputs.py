"""Output files of the CLI (elmoe3d.cli.outputs): checked before the run, written atomically,
with the permissions the umask gives (not the 0600 of a private temporary file)."""

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import elmoe3d.cli as cli
from elmoe3d.errors import UserError
from elmoe3d.cli.outputs import AtomicOutputs, check_output, check_output_dir, write_json


@pytest.fixture
def umask():
    """Set the process umask for one test (restored after)."""
    saved = os.umask(0o022)
    os.umask(saved)
    yield os.umask
    os.umask(saved)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def tmp_files(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_written_files_honour_the_umask(tmp_path, umask, mask):
    umask(mask)
    out = tmp_path / "out.json"
    write_json(out, {"a": 1})
    assert json.loads(out.read_text()) == {"a": 1}
    assert mode(out) == 0o666 & ~mask
    outputs = AtomicOutputs()
    other = tmp_path / "other.bin"
    with open(outputs.temp_for(other), "wb") as f:
        f.write(b"x")
    outputs.commit()
    assert mode(other) == 0o666 & ~mask
    assert tmp_files(tmp_path) == []


def test_discard_leaves_nothing_and_keeps_the_old_file(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("old")
    outputs = AtomicOutputs()
    with open(outputs.temp_for(out), "w") as f:
        f.write("new, unfinished")
    outputs.discard()
    assert out.read_text() == "old"
    assert tmp_files(tmp_path) == []


def test_write_json_failure_is_a_user_error_and_leaves_nothing(tmp_path):
    out = tmp_path / "out.json"
    with pytest.raises(TypeError):                  # not JSON-serialisable: nothing written
        write_json(out, {"x": object()})
    assert not out.exists() and tmp_files(tmp_path) == []
    with pytest.raises(UserError, match=r"--json .*missing.*cannot write"):
        write_json(tmp_path / "missing" / "out.json", {})


def test_check_output(tmp_path):
    assert check_output(tmp_path / "x.json", "--json") == tmp_path / "x.json"
    check_output("relative.json", "--json")
    with pytest.raises(UserError, match="--json .*: is a directory"):
        check_output(tmp_path, "--json")
    with pytest.raises(UserError, match="--plot .*: directory .*nope does not exist"):
        check_output(tmp_path / "nope" / "x.png", "--plot")
    f = tmp_path / "o.txt"                          # a file where a folder was meant
    f.write_text("x")
    with pytest.raises(UserError, match=f"^--json {f}/x.json: {f} is not a directory$"):
        check_output(f / "x.json", "--json")


def test_check_output_dir_and_make_dir(tmp_path):
    """An output folder: existing (its files checked), or new under a writable folder (made
    by make_dir with its parents, removed again by discard, kept by commit); a file refused."""
    assert check_output_dir(tmp_path, "--plot", ["a.png"]) == [tmp_path / "a.png"]
    (tmp_path / "a.png").mkdir()
    with pytest.raises(UserError, match="--plot .*a.png: is a directory"):
        check_output_dir(tmp_path, "--plot", ["a.png"])
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UserError, match=f"^--plot {f}: not a directory$"):
        check_output_dir(f, "--plot", ["a.png"])
    with pytest.raises(UserError, match=f"^--plot {f}/d: {f} is not a directory$"):
        check_output_dir(f / "d", "--plot", ["a.png"])
    # a new folder named like an image file: a file name given for --plot DIR, refused
    with pytest.raises(UserError, match=r"^--plot .*fig14\.PNG: names a folder to write "
                                        r"a\.png into, not a file; give a folder \(e\.g\. "):
        check_output_dir(tmp_path / "fig14.PNG", "--plot", ["a.png"])
    assert not (tmp_path / "fig14.PNG").exists()
    (tmp_path / "old.png").mkdir()                  # an existing folder of that name: taken
    assert check_output_dir(tmp_path / "old.png", "--plot", ["a.png"]) == [
        tmp_path / "old.png" / "a.png"]
    new = tmp_path / "x" / "y"
    assert check_output_dir(new, "--plot", ["a.png", "b.png"]) == [new / "a.png",
                                                                  new / "b.png"]
    assert not (tmp_path / "x").exists()
    outputs = AtomicOutputs()
    with open(outputs.temp_for(outputs.make_dir(new) / "a.png"), "w") as out:
        out.write("unfinished")
    outputs.discard()
    assert not (tmp_path / "x").exists()
    outputs = AtomicOutputs()
    with open(outputs.temp_for(outputs.make_dir(new) / "a.png"), "w") as out:
        out.write("done")
    outputs.commit()
    outputs.discard()
    assert (new / "a.png").read_text() == "done"
    # ``a/../b`` with ``a`` missing: made as ``mkdir -p`` makes it (``a`` first, then ``b``
    # beside it), and both removed again by discard
    odd = tmp_path / "missing" / ".." / "figs"
    assert check_output_dir(odd, "--plot", ["a.png"]) == [odd / "a.png"]
    outputs = AtomicOutputs()
    assert outputs.make_dir(odd) == odd and (tmp_path / "figs").is_dir()
    outputs.discard()
    assert not (tmp_path / "figs").exists() and not (tmp_path / "missing").exists()


def test_check_output_dir_read_only_parent(tmp_path, monkeypatch):
    """A folder the user cannot write into (mode 0o555; as root, which writes anywhere, the
    permission check is what says so: os.access is made to answer as for a plain user)."""
    import elmoe3d.cli.outputs as outputs_mod
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    real = os.access
    monkeypatch.setattr(outputs_mod.os, "access",
                        lambda p, m: False if Path(p) == ro and m & os.W_OK else real(p, m))
    with pytest.raises(UserError, match=f"--plot {ro}/d: directory {ro} is not writable"):
        check_output_dir(ro / "d", "--plot", ["a.png"])
    assert not (ro / "d").exists()


def test_quant_json_honours_the_umask(tmp_path, umask, capsys):
    umask(0o022)
    weights = tmp_path / "w.npz"
    np.savez(weights, w=np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32))
    out = tmp_path / "report.json"
    assert cli.main(["quant", str(weights), "--bits", "4", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["bits"] == [4]
    assert mode(out) == 0o644
    assert tmp_files(tmp_path) == []


@pytest.mark.parametrize("command", ["sim", "bench"])
def test_sim_and_bench_check_json_before_running(command, tmp_path, capsys):
    """A bad --json path is refused at once (exit 2, one line), before any build or run."""
    bad = tmp_path / "no-such-folder" / "out.json"
    assert cli.main([command, "--json", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"elmoe3d {command}: error: --json {bad}: directory" in err
    assert "Traceback" not in err
    assert not (tmp_path / "no-such-folder").exists()


def test_check_output_refuses_a_path_that_is_not_a_regular_file(tmp_path, capsys):
    """Review of issue 26, finding 3: an existing FIFO (or /dev/null, /dev/full) was replaced by
    a regular file. (A FIFO in tmp_path stands for the device nodes.)"""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UserError) as exc:
        check_output(fifo, "--json")
    assert str(exc.value) == f"--json {fifo}: not a regular file"
    assert cli.main(["paper", "table3", "--json", str(fifo)]) == 2
    assert capsys.readouterr().err.strip() == \
        f"elmoe3d paper: error: --json {fifo}: not a regular file"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    outputs = AtomicOutputs()                       # and at commit, if it appeared meanwhile
    outputs.add_json(fifo, {"a": 1})
    with pytest.raises(UserError, match="not a regular file"):
        outputs.commit()
    outputs.discard()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and tmp_files(tmp_path) == []


def test_commit_is_all_or_nothing(tmp_path, monkeypatch):
    """Finding 3: a failed rename of the second output left the first committed. Now the
    first is rolled back: the old file restored, a new one removed."""
    import elmoe3d.cli.outputs as outputs_mod
    old, new = tmp_path / "a.json", tmp_path / "b.png"
    old.write_text("old")
    real = os.replace

    def failing(src, dst):
        if str(dst) == str(new):
            raise OSError(28, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(outputs_mod.os, "replace", failing)
    outputs = AtomicOutputs()
    outputs.add_json(old, {"new": 1})
    with open(outputs.temp_for(new), "wb") as f:
        f.write(b"png")
    with pytest.raises(OSError):
        outputs.commit()
    outputs.discard()
    assert old.read_text() == "old" and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]
    monkeypatch.setattr(outputs_mod.os, "replace", real)
    outputs = AtomicOutputs()                       # no old file: the new one is removed
    first = tmp_path / "c.json"
    outputs.add_json(first, {})
    with open(outputs.temp_for(new), "wb") as f:
        f.write(b"png")
    monkeypatch.setattr(outputs_mod.os, "replace", failing)
    with pytest.raises(OSError):
        outputs.commit()
    outputs.discard()
    assert not first.exists() and not new.exists() and tmp_files(tmp_path) == []


def test_check_output_dir_refuses_a_dangling_link_at_once(tmp_path):
    """A folder path through a symbolic link to nowhere is refused before any run, not when
    the outputs are written at the end (review finding)."""
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError, match=f"--plot {tmp_path}/link/sub: {tmp_path}/link is not "
                                        f"a directory"):
        check_output_dir(tmp_path / "link" / "sub", "--plot", ["a.png"])
    assert not (tmp_path / "nowhere").exists()


def test_a_failed_write_or_rename_names_the_destination(tmp_path, monkeypatch):
    """An OSError on the temporary file (creating, writing or renaming it) names the output
    the user asked for, not the internal ``.NAME.PID-XXXX.tmp`` beside it."""
    import errno
    from elmoe3d.cli import outputs as outputs_mod
    out = tmp_path / "out.json"

    def no_space(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", src, None, dst)
    monkeypatch.setattr(outputs_mod.os, "replace", no_space)
    with pytest.raises(UserError) as info:
        write_json(out, {"a": 1})
    assert str(info.value) == (f"--json {out}: cannot write ([Errno 28] No space left on "
                               f"device: '{out}')")
    assert tmp_files(tmp_path) == [] and not out.exists()
    monkeypatch.undo()
    # a full disk while writing: write() and close() name no file (a new user's full tmpfs
    # said "cannot write output: [Errno 28] No space left on device"); the output being
    # written is named, the one before it is not
    plot = tmp_path / "b.png"

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(UserError) as info:
        with outputs_mod.atomic_outputs(lambda exc: f"cannot write output: {exc}") as outputs:
            outputs.add_json(out, {"a": 1})
            monkeypatch.setattr(outputs_mod.json, "dump", full_disk)
            outputs.add_json(plot, {})
    monkeypatch.undo()
    assert str(info.value) == (f"cannot write output: [Errno 28] No space left on device: "
                               f"'{plot}'")
    assert tmp_files(tmp_path) == [] and not out.exists() and not plot.exists()
    # the commit's backup copy of an existing output (no hard links) on a full disk names
    # that output, not the newest temporary file's
    out.write_text("old\n")

    def no_link(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted", src, None, dst)

    def copy_full(src, dst, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(outputs_mod.os, "link", no_link)
    monkeypatch.setattr(outputs_mod.shutil, "copy2", copy_full)
    with pytest.raises(UserError) as info:
        with outputs_mod.atomic_outputs(lambda exc: f"cannot write output: {exc}") as outputs:
            outputs.add_json(out, {"a": 1})
            outputs.add_json(plot, {})
    monkeypatch.undo()
    assert str(info.value) == (f"cannot write output: [Errno 28] No space left on device: "
                               f"'{out}'")
    assert out.read_text() == "old\n" and not plot.exists() and tmp_files(tmp_path) == []
    out.unlink()
    with pytest.raises(UserError) as info:             # not a write error: left as it was
        with outputs_mod.atomic_outputs(lambda exc: f"cannot write output: {exc}") as outputs:
            outputs.add_json(out, {"a": 1})
            raise PermissionError(errno.EACCES, "Permission denied")
    assert str(info.value) == "cannot write output: [Errno 13] Permission denied"
    if Path("/proc/self").is_dir():
        with pytest.raises(UserError) as info:
            write_json("/proc/elmoe3d-x.json", {})
        assert str(info.value) == ("--json /proc/elmoe3d-x.json: cannot write ([Errno 2] No "
                                   "such file or directory: '/proc/elmoe3d-x.json')")


def test_a_folder_that_refuses_new_files_is_not_writable(tmp_path, monkeypatch):
    """Root passes every permission check, yet cannot create a file in /proc or on a read-only
    mount: a folder where the probe file cannot be created is refused before the run (the
    probe made to fail here), and a writable one leaves no probe file behind."""
    import tempfile

    import elmoe3d.cli.outputs as outputs_mod
    check_output(tmp_path / "ok.json", "--json")
    assert list(tmp_path.iterdir()) == []
    real = tempfile.mkstemp

    def refuse(*a, dir=None, **kw):
        if Path(dir) == tmp_path:
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*a, dir=dir, **kw)

    monkeypatch.setattr(outputs_mod.tempfile, "mkstemp", refuse)
    with pytest.raises(UserError, match=f"--json {tmp_path}/x.json: directory {tmp_path} is "
                                        f"not writable"):
        check_output(tmp_path / "x.json", "--json")
    with pytest.raises(UserError, match=f"--plot {tmp_path}/d: directory {tmp_path} is not "
                                        f"writable"):
        check_output_dir(tmp_path / "d", "--plot", ["a.png"])


def test_outputs_inside_the_traces_folder_are_refused(tmp_path, monkeypatch, capsys):
    """The traces folder holds the real routing every command reads; its permissions do not
    stop root, so an output inside it (a file, a plot folder, through a symbolic link) is
    refused by name before anything runs, whatever the command."""
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "gsm8k_2_routing.jsonl").write_text("")
    monkeypatch.setenv("ELMOE3D_TRACES", str(traces))
    (tmp_path / "link").symlink_to(traces)
    for path in (traces / "x.json", tmp_path / "link" / "x.json"):
        with pytest.raises(UserError, match=f"--json {path}: inside the traces folder {traces}, "
                                            f"the real routing the commands read"):
            check_output(path, "--json")
    with pytest.raises(UserError, match="--plot .*plots: inside the traces folder"):
        check_output_dir(traces / "plots", "--plot", ["fig16.png"])
    assert check_output(tmp_path / "x.json", "--json") == tmp_path / "x.json"
    assert cli.main(["paper", "fig13", "--json", str(traces / "f.json")]) == 2
    assert "inside the traces folder" in capsys.readouterr().err
    assert sorted(p.name for p in traces.iterdir()) == ["gsm8k_2_routing.jsonl"]


def _output_options():
    """(command, option, type) of every output option of every command."""
    from elmoe3d.cli.outputs import output_dir, output_path, stdout_or_path
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.choices and "quant" in a.choices)
    return [(name, action.option_strings[-1], action.type)
            for name, command in sub.choices.items() for action in command._actions
            if action.type in (output_path, output_dir, stdout_or_path)]


def test_a_dash_is_standard_output_only_for_verilog_o(tmp_path, capsys, monkeypatch):
    """``paper table3 --json -`` wrote a file named ``-`` (a new user's; ``verilog -o -`` is
    standard output): every output option but ``verilog -o`` refuses ``-`` when the options
    are parsed, naming what it expects, and writes nothing."""
    from elmoe3d.cli.outputs import output_dir, stdout_or_path
    monkeypatch.chdir(tmp_path)
    options = _output_options()
    assert [(c, o) for c, o, t in options if t is stdout_or_path] == [("verilog", "--out")]
    for command, option, kind in options:
        if kind is stdout_or_path:
            continue
        with pytest.raises(SystemExit) as exc:
            cli.build_parser().parse_args([command, option, "-"])
        assert exc.value.code == 2
        what = "a folder" if kind is output_dir else "a file"
        assert (f"{option}: '-': expected {what} name (only verilog -o writes to standard "
                f"output") in capsys.readouterr().err, (command, option)
    with pytest.raises(SystemExit):
        cli.main(["paper", "table3", "--json", "-"])
    assert list(tmp_path.iterdir()) == []
    assert cli.build_parser().parse_args(["verilog", "-o", "-"]).out == "-"


def test_a_file_output_ending_in_a_slash_is_refused(tmp_path, capsys):
    """``--json notes.txt/`` wrote the report over ``notes.txt`` (``Path`` drops the slash; a
    new user's Medium): every file output refuses a name ending in ``/``, every folder output
    takes one; and the file named is left as it was."""
    from elmoe3d.cli.outputs import output_dir, output_path, stdout_or_path
    options = _output_options()
    files = {(c, o) for c, o, t in options if t in (output_path, stdout_or_path)}
    folders = {(c, o) for c, o, t in options if t is output_dir}
    assert ("quant", "--json") in files and ("run", "--csv") in files
    assert {("sweep", "--out"), ("sweep", "--cache"), ("run", "--plot"), ("paper", "--plot"),
            ("verilog", "--split")} == folders
    for command, option in sorted(files):
        with pytest.raises(SystemExit) as exc:
            cli.build_parser().parse_args([command, option, "notes.txt/"])
        assert exc.value.code == 2
        assert (f"{option}: 'notes.txt/' ends in '/', a folder's name; expected a file "
                f"name") in capsys.readouterr().err, (command, option)
    assert output_dir("plots/") == Path("plots")
    notes = tmp_path / "notes.txt"
    notes.write_text("precious\n")
    weights = tmp_path / "w.npz"
    np.savez(weights, up=np.ones((4, 32), np.float32))
    for name in (f"{notes}/", f"{notes}/.", f"{notes}/..", ".", ".."):
        with pytest.raises(SystemExit):
            cli.main(["quant", str(weights), "--json", name])
        assert "a folder" in capsys.readouterr().err, name
    assert notes.read_text() == "precious\n"

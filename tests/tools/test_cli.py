"""The `elmoe3d` console script's own help (each subcommand has its own tests)."""

import subprocess
import sys

import pytest

import elmoe3d.cli as cli
from elmoe3d.errors import UserError


def test_help_describes_the_tool():
    done = subprocess.run([sys.executable, "-m", "elmoe3d", "--help"], capture_output=True,
                          text=True, check=True)
    text = " ".join(done.stdout.split())
    assert " ".join(cli.DESCRIPTION.split()) in text
    assert "``" not in done.stdout and "console script" not in done.stdout
    for name, (_, help_text) in cli.COMMANDS.items():
        assert f"{name} {help_text}" in text


def test_help_lists_every_paper_figure():
    """``elmoe3d --help`` names every subcommand of ``elmoe3d paper`` (not only table3)."""
    from elmoe3d.cli.paper import FIGURES
    done = subprocess.run([sys.executable, "-m", "elmoe3d", "--help"], capture_output=True,
                          text=True, check=True)
    text = " ".join(done.stdout.split())
    start = text.index("paper the paper's evaluation")
    paper_help = text[start:text.index(" synth ", start)]
    for figure in FIGURES:
        assert f"{figure} (" in paper_help, figure


@pytest.mark.parametrize("argv,extra", [(["paper", "table3", "--model", "mixtral"],
                                         "--model mixtral"),
                                        (["sweep", "s.yaml", "--chek"], "--chek"),
                                        (["run", "--trace", "gsm8k", "--hb", "68"], "--hb 68"),
                                        (["paper", "table3", "--js", "t.json"], "--js t.json")])
def test_an_unknown_option_is_the_commands_error(capsys, argv, extra):
    """New-user trial: an unknown option of a command printed the top-level usage and
    ``elmoe3d: error``; it is the command's usage and error line (exit 2), before any work.
    An abbreviation is no option (a second trial: ``run --hb 68`` ran as ``--hb-slots 68``)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: elmoe3d {argv[0]} ")
    assert err.strip().splitlines()[-1] == \
        f"elmoe3d {argv[0]}: error: unrecognized arguments: {extra}"


@pytest.mark.parametrize("argv", [
    ["run", "--trace", "gsm8k", "--model", "mixtral-8x7b", "--config", "paper-8gb"],
    ["sim"], ["bench"], ["paper-pe"]])
@pytest.mark.parametrize("value", ["abc", "-1"])
def test_bad_seed_env_is_one_line_exit_2(monkeypatch, capsys, argv, value):
    """A bad ``$ELMOE3D_SEED`` is refused in one line (exit status 2) by every command that reads
    it, before any work (``paper-pe``: before its build)."""
    from elmoe3d.sim import paper_pe
    monkeypatch.setenv("ELMOE3D_SEED", value)

    def no_build(*a, **kw):
        raise AssertionError("built despite a bad seed")
    monkeypatch.setattr(paper_pe, "measured_build", no_build)
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2
    assert err.strip().splitlines() == [
        f"elmoe3d {argv[0]}: error: $ELMOE3D_SEED: expected a non-negative integer, got "
        f"'{value}'"]


@pytest.mark.parametrize("command", ["run", "sim", "bench", "paper-pe"])
def test_negative_seed_refused_at_parsing(capsys, command):
    """``--seed -1`` is refused by argparse like any malformed value (its usage, then one error
    line naming --seed, exit status 2), before any work."""
    argv = [command, "--seed", "-1"]
    if command == "run":
        argv += ["--trace", "gsm8k", "--model", "mixtral-8x7b", "--config", "paper-8gb"]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (f"elmoe3d {command}: error: argument --seed: "
                                            f"expected a non-negative integer, got '-1'")
    assert cli.seed_type("0") == 0 and cli.seed_type("12") == 12


@pytest.mark.parametrize("argv", [
    ["run", "--trace", "gsm8k", "--model", "mixtral-8x7b", "--config", "paper-8gb",
     "--tokens", "4", "--layers", "0"],
    ["paper", "table3"]])
def test_closed_stdout_still_writes_the_files(tmp_path, argv):
    """``elmoe3d run ... --json F | head -1``: a reader that has gone (EPIPE on standard
    output) loses the rest of the report, not the files; the command exits quietly with its
    usual status (0 here)."""
    import json
    import os
    out = tmp_path / "out.json"
    read_end, write_end = os.pipe()
    os.close(read_end)                          # every write to stdout fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "elmoe3d", *argv, "--json", str(out)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(out.read_text())


def test_an_option_value_starting_with_a_dash_reaches_the_command(capsys):
    """A value that starts with one ``-`` and is none of the command's options reaches the
    command's own check: argparse alone took ``-3,4`` for an option and said "expected one
    argument". One line naming what was expected, exit 2, no table."""
    assert cli.main(["paper", "table3", "--tree", "-3,4"]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == ("elmoe3d paper: error: --tree: depth and width must be 1 .. 64, "
                           "got '-3,4'")
    assert out == ""


def test_an_option_after_an_option_is_still_an_option(capsys):
    """``--tree --json x``: a value starting with ``--`` stays an option, so ``--tree`` has
    none (argparse's own error, exit 2)."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["paper", "table3", "--tree", "--json", "x.json"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "elmoe3d paper: error: argument --tree: expected one argument"


@pytest.mark.parametrize("command", ["run", "sim", "paper-pe", "verilog", "fpga", "synth"])
def test_every_config_option_takes_a_preset_name_in_any_case(command):
    """``--config paper-8GB`` is paper-8gb on every command taking a preset (``run`` refused
    it as written); synth's comma list is checked by its own parse."""
    from elmoe3d.cli.synth import _configs
    from elmoe3d.config import preset
    extra = {"run": ["--trace", "gsm8k"]}.get(command, [])
    args = cli.build_parser().parse_args([command, *extra, "--config", " Paper-8GB"])
    if command == "synth":
        assert _configs(args.config) == [preset("paper-8gb")]
        with pytest.raises(UserError, match="names a configuration twice"):
            _configs("paper-4gb,PAPER-4GB")
    else:
        assert args.config == "paper-8gb"


def test_option_like_values_and_the_double_dash_are_left_alone():
    """The rewrite of ``--opt -3,4`` touches a value starting with ``-`` and a digit or a
    point only: ``--json -w`` stays an option (a typo, argparse's error), and nothing after
    ``--`` (positionals) changes."""
    parser = cli.build_parser()
    assert cli._dash_values(parser, ["paper", "table3", "--tree", "-3,4", "--json", "-.5"]) \
        == ["paper", "table3", "--tree=-3,4", "--json=-.5"]
    assert cli._dash_values(parser, ["sim", "--json", "-w"]) == ["sim", "--json", "-w"]
    assert cli._dash_values(parser, ["quant", "--", "--bits", "-4"]) == \
        ["quant", "--", "--bits", "-4"]


@pytest.mark.parametrize("argv, msg", [
    (["--tokens", "-3"], "--tokens: expected a positive integer, got -3"),     # a traceback
    (["--tokens", "0"], "--tokens: expected a positive integer, got 0"),       # 0/0 "bit-exact"
    (["--tokens", "abc"], "--tokens: expected a positive integer, got 'abc'"),
    (["--tokens", "1,,4"], "--tokens: expected a positive integer, got ''"),
    (["--jobs", "0"], "--jobs: expected a positive integer, got 0"),
    (["--jobs", "-2"], "--jobs: expected a positive integer, got -2"),
    (["--models", "olmoe"], "models: unknown model 'olmoe'; models are "),
])
def test_shape_sweep_refuses_bad_options_in_one_line(capsys, argv, msg):
    """``python -m elmoe3d.sw.host.shape_sweep`` (README "Real expert shapes"): a new-user
    trial (2026-12-06, seventh session) got a worker's traceback for ``--tokens -3`` and a
    "bit-exact" run of no outputs for ``--tokens 0``."""
    from elmoe3d.sw.host import shape_sweep
    assert shape_sweep.main(["--models", "olmoe-1b-7b"] + argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"shape_sweep: {msg}")


def test_a_sigterm_python_dropped_still_ends_the_command(monkeypatch, capsys):
    """SIGTERM's exception raised inside a ``__del__`` (Amaranth's unused-object checks) is
    dropped by Python and the command runs on: its handler's flag makes ``main`` say
    "terminated" and end by SIGTERM all the same, not exit 0."""
    import signal
    from elmoe3d.cli import blocks as blocks_cmd

    def dropped(args):
        try:
            cli._terminate(signal.SIGTERM, None)
        except KeyboardInterrupt:
            pass                        # as Python does in a __del__
        return 0
    monkeypatch.setattr(blocks_cmd, "run", dropped)
    killed = []
    monkeypatch.setattr(cli.os, "kill", lambda pid, sig: killed.append(sig))
    assert cli.main(["blocks"]) == 143 and killed == [signal.SIGTERM]
    assert "elmoe3d blocks: terminated (SIGTERM)" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_ctrl_c_python_dropped_still_ends_the_command(monkeypatch, capsys):
    """Ctrl-C's ``KeyboardInterrupt`` raised inside a ``__del__`` is dropped by Python and the
    command runs on: the SIGINT handler main installs over Python's own notes it, so ``main``
    says "interrupted" and returns 130, not 0; Python's handler is back afterwards, and a
    handler of the caller's, or SIGINT ignored, is left alone."""
    import signal
    from elmoe3d.cli import blocks as blocks_cmd
    seen, mine = [], []

    def dropped(args):
        seen.append(signal.getsignal(signal.SIGINT))
        try:
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
        except KeyboardInterrupt:
            pass                        # as Python does in a __del__
        return 0
    # Python's own handler, as an interactive shell leaves it (a job started in the
    # background by a script has SIGINT ignored: the last case below)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        monkeypatch.setattr(blocks_cmd, "run", dropped)
        assert cli.main(["blocks"]) == 130 and seen == [cli._interrupt]
        assert capsys.readouterr().err.strip() == "elmoe3d blocks: interrupted"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        # a command that returns after no interrupt is unaffected by the last one's note
        monkeypatch.setattr(blocks_cmd, "run", lambda args: 0)
        assert cli.main(["blocks"]) == 0
        # the caller's own handler: not replaced, not restored to Python's
        signal.signal(signal.SIGINT, lambda signum, frame: mine.append(signum))
        monkeypatch.setattr(blocks_cmd, "run", dropped)
        assert cli.main(["blocks"]) == 0 and mine == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        # SIGINT ignored: left ignored
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        monkeypatch.setattr(blocks_cmd, "run", lambda args: 0)
        assert cli.main(["blocks"]) == 0 and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupt_after_a_commit_names_the_complete_outputs(monkeypatch, capsys, tmp_path):
    """A Ctrl-C that lands after a command committed an output (here between its ``--json``
    and a later step) still ends it with 130 and "interrupted", and names the file written
    whole, which is there and parses; one interrupted before its commit names none and leaves
    no file. The list is the command's own: a second command starts from none."""
    import json
    from elmoe3d.cli import blocks as blocks_cmd
    from elmoe3d.cli.outputs import atomic_outputs, write_json
    done, never = tmp_path / "done.json", tmp_path / "never.json"

    def after_commit(args):
        write_json(done, {"rows": [1, 2]})
        raise KeyboardInterrupt

    def before_commit(args):
        with atomic_outputs(str) as outputs:
            outputs.add_json(never, {"rows": [3]})
            raise KeyboardInterrupt

    monkeypatch.setattr(blocks_cmd, "run", after_commit)
    assert cli.main(["blocks"]) == 130
    assert capsys.readouterr().err.strip() == (
        f"elmoe3d blocks: interrupted after writing 1 complete output: {done}")
    assert json.loads(done.read_text()) == {"rows": [1, 2]}
    monkeypatch.setattr(blocks_cmd, "run", before_commit)
    assert cli.main(["blocks"]) == 130
    assert capsys.readouterr().err.strip() == "elmoe3d blocks: interrupted"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done.json"]


def test_a_bug_is_exit_status_3_in_every_command(monkeypatch, capsys):
    """A review's finding (2026-12-07): an exception that is no user error (a bug) left
    `elmoe3d quant` with Python's status 1, which `run` and `bench` use for a mismatch found;
    only `run` said "internal error", 3. The program (console script, ``python -m elmoe3d``)
    now does for every command; ``main`` lets it through for a caller in Python."""
    from importlib.metadata import entry_points
    from elmoe3d.cli import blocks as blocks_cmd
    assert [e.value for e in entry_points(group="console_scripts", name="elmoe3d")] == [
        "elmoe3d.cli:console_main"]

    def bug(args):
        raise RuntimeError("stand-in bug")
    monkeypatch.setattr(blocks_cmd, "run", bug)
    monkeypatch.setattr(sys, "argv", ["elmoe3d", "blocks"])
    assert cli.console_main() == 3
    err = capsys.readouterr().err
    assert "RuntimeError: stand-in bug" in err and "Traceback" in err
    assert err.strip().splitlines()[-1] == (
        "elmoe3d blocks: internal error (a bug: the traceback above; exit status 3)")
    with pytest.raises(RuntimeError, match="stand-in bug"):
        cli.main(["blocks"])
    monkeypatch.setattr(blocks_cmd, "run", lambda args: 0)
    assert cli.console_main() == 0
    capsys.readouterr()
    # a Ctrl-C before main installs its handlers (while the parser imports the commands)

    def early(argv=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "main", early)
    assert cli.console_main() == 130
    assert capsys.readouterr().err.strip() == "elmoe3d: interrupted"

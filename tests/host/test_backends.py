"""The run backends' registry (sw.host.backends): exactly golden, rtl, fpga and perf, each
declaring what it runs; importing it pulls in no Amaranth, cocotb or pyserial; and what each
backend declares (configurations, options) is what `elmoe3d run` refuses, one line, exit
status 2, before anything runs."""

import subprocess
import sys
import textwrap

import pytest

from elmoe3d.cli import main
from elmoe3d.errors import UserError
from elmoe3d.sw.host.backends import (BACKENDS, SMALL_CONFIG, Backend, backend_options,
                                      check_request)

BASE = ["run", "--trace", "gsm8k", "--model", "mixtral-8x7b", "--tokens", "2", "--layers",
        "0"]
#: Values of every backend option, given where they do not belong.
VALUES = {"port": "/dev/ttyUSB0", "baud": "9600", "deadline": "5"}


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_registry_lists_the_four_backends():
    assert list(BACKENDS) == ["golden", "rtl", "fpga", "perf"]
    declared = {name: (b.small_only, b.keeps_golden, b.compares, b.perf_beside,
                       [opt.name for opt in b.options]) for name, b in BACKENDS.items()}
    assert declared == {"golden": (True, False, True, True, []),
                        "rtl": (True, True, True, True, []),
                        "fpga": (True, True, True, True, ["port", "baud", "deadline"]),
                        "perf": (False, False, False, False, [])}
    for name, b in BACKENDS.items():
        assert isinstance(b, Backend) and b.name == name
        assert b.description and "\n" not in b.description
    with pytest.raises(TypeError):
        BACKENDS["gpu"] = BACKENDS["perf"]          # the registry is read-only


def test_importing_the_registry_imports_no_hdl_cocotb_or_serial():
    """In a fresh interpreter: the registry, every backend's declarations and the request
    checks import no Amaranth, cocotb or pyserial (the RTL bench and the serial port are
    imported when a backend runs or opens its session)."""
    code = textwrap.dedent("""
        import sys
        from elmoe3d.sw.host.backends import BACKENDS, backend_options, check_request
        for b in BACKENDS.values():
            (b.name, b.description, b.small_only, b.keeps_golden, b.compares, b.options)
        check_request("fpga", config="small", options={"port": "x", "baud": None,
                                                       "deadline": None})
        bad = sorted(m for m in sys.modules
                     if m.split(".")[0] in ("amaranth", "cocotb", "serial"))
        print(repr(bad))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def _refusal(name, config, given=()):
    options = {opt.name: None for _, opt in backend_options()}
    for opt_name in given:
        options[opt_name] = next(opt.type for _, opt in backend_options()
                                 if opt.name == opt_name)(VALUES[opt_name])
    try:
        check_request(name, config=config, options=options)
    except UserError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("name", list(BACKENDS))
def test_declared_configurations_are_what_run_refuses(name, capsys):
    """A small-only backend on a paper configuration: refused by `elmoe3d run` with the
    registry's message, word for word; the others are not refused."""
    b = BACKENDS[name]
    message = _refusal(name, "paper-4gb", ["port"] if name == "fpga" else [])
    if not b.small_only:
        assert message is None
        return
    assert message == (f"--backend {name}: runs the small configuration only (the paper "
                       f"configurations are for the perf backend)")
    argv = [*BASE, "--config", "paper-4gb", "--backend", name]
    if name == "fpga":
        argv += ["--port", VALUES["port"]]
    code, out, err = _run(capsys, *argv)
    assert code == 2 and err.strip() == f"elmoe3d run: error: {message}"
    assert _refusal(name, SMALL_CONFIG, ["port"] if name == "fpga" else []) is None


@pytest.mark.parametrize("name", list(BACKENDS))
def test_declared_options_are_what_run_refuses(name, capsys):
    """Every other backend's option given to this one is refused, naming its backend; an
    option this one needs, missing, is refused; a bad value of its own option too."""
    b = BACKENDS[name]
    own = [opt.name for opt in b.options]
    needed = ["port"] if name == "fpga" else []
    for owner, opt in backend_options():
        if opt.name in own:
            continue
        message = _refusal(name, SMALL_CONFIG, needed + [opt.name])
        assert message == (f"--{opt.name}: only with --backend {owner.name} (got --backend "
                           f"{name})")
        argv = [*BASE, "--backend", name, f"--{opt.name}", VALUES[opt.name]]
        argv += [a for n in needed for a in (f"--{n}", VALUES[n])]
        code, out, err = _run(capsys, *argv)
        assert code == 2 and err.strip() == f"elmoe3d run: error: {message}"
    for opt in b.options:
        if opt.needed:
            message = _refusal(name, SMALL_CONFIG)
            assert message == f"--backend {name}: needs --{opt.name} {opt.metavar}, " \
                              f"{opt.needed}"
            code, out, err = _run(capsys, *BASE, "--backend", name)
            assert code == 2 and err.strip() == f"elmoe3d run: error: {message}"
    if name == "fpga":
        assert b.options[0].needed == "the board's serial port (e.g. /dev/ttyUSB0)"
        code, out, err = _run(capsys, *BASE, "--backend", name, "--port", "/nonexistent/tty0",
                              "--baud", "0")
        assert code == 2 and err.strip() == ("elmoe3d run: error: --baud 0: expected a "
                                             "positive integer")


def test_backend_help_and_choices_from_the_registry(capsys, monkeypatch):
    """`elmoe3d run --help` lists every backend with its description, and every backend's
    options under its name; an unknown backend is refused naming the registry's."""
    import argparse

    from elmoe3d.cli import run as run_cmd
    monkeypatch.setenv("COLUMNS", "10000")          # argparse wraps no help line
    parser = argparse.ArgumentParser()
    run_cmd.configure(parser)
    text = parser.format_help()
    assert "golden, rtl, fpga, perf (default perf): " in text
    for b in BACKENDS.values():
        assert f"{b.name}: {b.description}" in text
        for opt in b.options:
            assert f"--{opt.name} {opt.metavar}" in text and f"{b.name}: {opt.help}" in text
    code, out, err = _run(capsys, *BASE, "--backend", "gpu")
    assert code == 2 and err.strip() == ("elmoe3d run: error: --backend gpu: expected one of "
                                         "golden, rtl, fpga, perf")

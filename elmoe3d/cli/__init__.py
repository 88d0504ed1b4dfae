"""The ``elmoe3d`` console script.

Each subcommand lives in its own module, which defines ``configure(parser)`` and
``run(args) -> int``. User mistakes (:class:`~elmoe3d.errors.UserError` and the golden model's
:class:`~elmoe3d.sw.golden.quant.QuantizationError`) print one line and exit with code 2, no traceback.

A closed standard output (``elmoe3d run ... --json F | head -1``: the reader has gone) does not
stop a command: the rest of its report is discarded, its output files are still written, and it
exits quietly with the status it would have had otherwise (0 on success; not 141, so a mismatch
still reads 1).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

from .. import __version__
from ..checks import parse_bytes
from ..errors import Terminated, UserError
from .outputs import COMMITTED


#: What ``elmoe3d --help`` says the tool is.
DESCRIPTION = ("ELMoE-3D design framework: bit-nested INT8 MoE accelerator RTL (Amaranth), its "
               "NumPy golden model, and cocotb + Verilator benches")

#: subcommand -> (module, one-line help)
COMMANDS = {
    "quant": ("elmoe3d.cli.quant", "bit-nested quantization error report for a weight file"),
    "sim": ("elmoe3d.cli.sim", "generate Verilog, run the cocotb + Verilator benches, summarise"),
    "run": ("elmoe3d.cli.run", "run a routing trace through the host compiler and a backend "
                               "(golden, rtl, perf, fpga)"),
    "bench": ("elmoe3d.cli.bench", "the benchmark figures, each beside a baseline (elmoe3d "
                                   "bench --help lists them all)"),
    "paper-pe": ("elmoe3d.cli.paper_pe", "the paper PE (16x32x32 tile, 32 KB memories) in "
                                         "Verilator: build time and memory, the root PE program "
                                         "of one real expert shape checked bit for bit, "
                                         "simulated cycles per second"),
    "paper": ("elmoe3d.cli.paper", "the paper's evaluation from the whole-decoder performance "
                                   "model: table3 (alpha, Phi_AR, Phi_SD beside the paper's), "
                                   "fig12 (memory mapping and SD time per scheme), fig13 "
                                   "(draft and verify latency by batch and HB size), fig14 "
                                   "(speedup over xPU of every platform), fig15 (energy a token "
                                   "by component), fig16 (expert locality on the real "
                                   "routing), cache-check (the expert-cache model against "
                                   "the exact LRU on the real Mixtral traces), cross-validate "
                                   "(Table 3's cells predicted by fits without their batch)"),
    "synth": ("elmoe3d.cli.synth", "Yosys area of every block, rolled up to the logic die"),
    "fpga": ("elmoe3d.cli.fpga", "FPGA prototype: fit estimate, bitstream, utilization and fmax "
                                 "of the board top (YoWASP tools, amaranth-boards)"),
    "sweep": ("elmoe3d.cli.sweep", "design-space sweep on Dask (embedded LocalCluster or a "
                                   "cluster): perf model, area/timing roll-up and RTL benches "
                                   "per point, Parquet/CSV/JSON table, Pareto plots"),
    "verilog": ("elmoe3d.cli.verilog", "the Verilog of the logic die or any block in it at a "
                                       "configuration preset: one module per distinct block "
                                       "instance, or flat (--list shows the blocks)"),
    "blocks": ("elmoe3d.cli.blocks", "the block registry: each block's RTL, golden model, "
                                     "bench, tests, area category and doc section"),
}


def seed_type(text) -> int:
    """``type=`` of every ``--seed`` option that seeds NumPy: a non-negative integer. Raises
    :class:`argparse.ArgumentTypeError` otherwise (argparse then exits with status 2)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def bytes_type(text) -> int:
    """``type=`` of an option giving a number of bytes: :func:`elmoe3d.checks.parse_bytes`
    (``4000000``, ``1e9``, ``512MiB``, ``1.5GB``). Raises :class:`argparse.ArgumentTypeError`
    otherwise (argparse then exits with status 2)."""
    return parse_bytes(None, text, error=argparse.ArgumentTypeError)


#: ``--config``'s metavar and the words of its help where a configuration file is taken.
CONFIG_METAVAR = "NAME|FILE"
CONFIG_FILE_HELP = ("or a configuration file of your own (.yaml, .yml or .toml: a base preset "
                    "and the fields it changes, README \"Your own configuration\")")


def config_arch(text, option: str = "--config"):
    """The :class:`~elmoe3d.config.ArchConfig` that ``option``'s value names: a preset (any
    case, :func:`~elmoe3d.config.preset`) or a configuration file (a name ending in
    ``.yaml``, ``.yml`` or ``.toml``: :func:`~elmoe3d.sw.host.sweep_spec.load_config`).
    Raises :class:`~elmoe3d.errors.UserError` naming ``option`` (and the file's every
    mistake, a line each), with the closest preset names for an unknown one."""
    from ..checks import did_you_mean
    from ..config import PRESETS, preset, preset_key
    if preset_key(text) in PRESETS:
        return preset(text)
    from ..sw.host.sweep_spec import TABLE_SUFFIXES, load_config
    if str(text).lower().endswith(TABLE_SUFFIXES):
        try:
            return load_config(text)
        except UserError as exc:
            raise UserError("\n".join(f"{option} {line}" for line in str(exc).splitlines())) \
                from None
    raise UserError(f"{option} {text}: unknown configuration"
                    f"{did_you_mean(str(text).lower(), PRESETS)}; expected one "
                    f"of {', '.join(PRESETS)}, or a configuration file (.yaml, .yml, .toml)")


def comma_items(text, option) -> list:
    """The items of ``option``'s comma-separated value, stripped. Raises
    :class:`~elmoe3d.errors.UserError` naming ``option`` for an empty value or an empty item
    (``1,,2``, a trailing comma), which would otherwise be dropped without a word."""
    if not str(text).strip():
        raise UserError(f"{option}: an empty value; expected values separated by commas")
    items = [t.strip() for t in str(text).split(",")]
    if "" in items:
        raise UserError(f"{option} {text}: an empty item; expected values separated by commas")
    return items


def given_options(args, names) -> list:
    """The options among ``names`` (``args`` attribute names, e.g. ``"no_plots"``) given on the
    command line, as flags (``"--no-plots"``): those whose value is neither None (an option's
    absent default) nor False (a switch left off). ``0`` counts as given (``0 == False``)."""
    return [f"--{name.replace('_', '-')}" for name in names
            if getattr(args, name) is not None and getattr(args, name) is not False]


def note_shadowed_path(command: str, keyword: str, meaning: str) -> None:
    """A one-line note on standard error when ``keyword``, a name the command reads as one of
    its bundled inputs (``quant minilm``, ``run --trace gsm8k``), is also a file or folder in
    the current folder: the keyword wins (as documented), and the note says how to name the
    local one (``./minilm``), where a new user's own ``minilm/`` was passed over silently."""
    import os.path
    if os.path.lexists(keyword):
        kind = "folder" if os.path.isdir(keyword) else "file"
        print(f"elmoe3d {command}: note: {keyword!r} is {meaning}, not the {kind} {keyword} "
              f"here; write ./{keyword} for that", file=sys.stderr)


def fill_defaults(args, defaults) -> None:
    """Set each option of ``defaults`` (``{attribute name: value}``) that ``args`` holds as
    None, i.e. not given: its default, applied after :func:`given_options` has refused it
    where it does not apply."""
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, but never wrapping a line inside a hyphenated name (``cache-check``,
    ``paper-8gb``)."""

    def _split_lines(self, text, width):
        import textwrap
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width,
                             break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        import textwrap
        return textwrap.fill(self._whitespace_matcher.sub(" ", text).strip(), width,
                             initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an abbreviation is not an option (``run --hb 68`` was taken for
    # ``--hb-slots 68``; ``--hb 8gb`` for a bad --hb-slots value)
    parser = argparse.ArgumentParser(prog="elmoe3d", description=DESCRIPTION,
                                     formatter_class=_HelpFormatter, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"elmoe3d {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text,
                                    formatter_class=_HelpFormatter, allow_abbrev=False)
        importlib.import_module(module).configure(sub_parser)
        sub_parser.set_defaults(_module=module)
    return parser


def _dash_values(parser: argparse.ArgumentParser, argv) -> list:
    """``argv`` with ``--opt -3,4`` written ``--opt=-3,4`` where ``--opt`` is an option of the
    command taking one value and ``-3,4`` starts with ``-`` and a digit or a point: argparse
    takes such a value (not a plain negative number) for an option, so the command's own
    check (which names what it expected) never saw it. A value that looks like an option
    (``--json``, ``-w``) stays one (``--tree --json`` is still "expected one argument"), and
    nothing after a ``--`` is touched."""
    argv = list(sys.argv[1:] if argv is None else argv)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    cmd = next((i for i, a in enumerate(argv) if a in sub.choices), None)
    if cmd is None:
        return argv
    opts = sub.choices[argv[cmd]]._option_string_actions
    out = argv[:cmd + 1]
    rest = iter(argv[cmd + 1:])
    for a in rest:
        if a == "--":                               # positionals only from here
            out.append(a)
            out.extend(rest)
            break
        action = opts.get(a)
        if action is not None and action.nargs is None:             # one value
            value = next(rest, None)
            if value is not None and len(value) > 1 and value[0] == "-" \
                    and (value[1].isdigit() or value[1] == "."):
                out.append(f"{a}={value}")
                continue
            out.append(a)
            if value is not None:
                out.append(value)
            continue
        out.append(a)
    return out


def _parse(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an unknown option of a command is that command's error
    (its usage and ``elmoe3d CMD: error: unrecognized arguments: ...``, exit 2), not the
    top-level parser's."""
    args, extra = parser.parse_known_args(_dash_values(parser, argv))
    if extra:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


class _ClosedPipeGuard:
    """Standard output while a command runs: once a write or flush meets a reader that has gone
    (:class:`BrokenPipeError`), standard output is pointed at ``/dev/null`` (also for the
    interpreter's last flush) and further output is discarded, so that the command goes on to
    write its files. Everything else is the wrapped stream's."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = False

    def write(self, text):
        if not self.broken:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._discard()
        return len(text)

    def flush(self):
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._discard()

    def _discard(self):
        self.broken = True
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):     # not a file (a test's capture)
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)

    def __getattr__(self, name):
        return getattr(self._stream, name)


#: Set by the SIGTERM and SIGINT handlers: an exception raised while Python runs a
#: ``__del__`` (Amaranth's unused-object checks) is lost, so :func:`main` also looks here
#: when the command returns.
_TERMINATED = []
_INTERRUPTED = []


def _terminate(signum, frame):
    """SIGTERM's handler while a command runs: :class:`~elmoe3d.errors.Terminated`, so that
    the command's Ctrl-C clean-up runs; :func:`main` then says "terminated" and ends the
    process by SIGTERM itself (its status 143 in a shell)."""
    _TERMINATED.append(signum)
    raise Terminated


def _interrupt(signum, frame):
    """SIGINT's (Ctrl-C's) handler while a command runs: Python's own
    (:class:`KeyboardInterrupt`), which also notes it for :func:`main`, in case Python drops
    the exception in a ``__del__``."""
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def _own_handlers() -> list:
    """Install :func:`_terminate` and :func:`_interrupt` where the signal has its default
    action (SIGTERM's, Python's KeyboardInterrupt for SIGINT), in the main thread only,
    unless someone chose otherwise (ignored, or a handler of theirs): the signals taken, to
    put back after the command."""
    if threading.current_thread() is not threading.main_thread():
        return []
    taken = []
    for signum, default, handler in ((signal.SIGTERM, signal.SIG_DFL, _terminate),
                                     (signal.SIGINT, signal.default_int_handler, _interrupt)):
        if signal.getsignal(signum) is default:
            signal.signal(signum, handler)
            taken.append((signum, default))
    return taken


def _written(shown: int = 3) -> str:
    """The outputs a command committed before a Ctrl-C or SIGTERM ended it, as the tail of
    the "interrupted" line: they are complete (written whole and renamed into place), the rest
    were never made. Empty if none."""
    if not COMMITTED:
        return ""
    names = [str(p) for p in dict.fromkeys(COMMITTED)]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (f" after writing {len(names)} complete output{'s' if len(names) > 1 else ''}: "
            + ", ".join(names[:shown]) + more)


def main(argv=None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    from ..sw.golden.quant import QuantizationError
    stdout = sys.stdout
    if stdout is not None:
        sys.stdout = _ClosedPipeGuard(stdout)
    # SIGTERM as Ctrl-C (its clean-up runs); both noted where Python may drop them
    _TERMINATED.clear()
    _INTERRUPTED.clear()
    COMMITTED.clear()
    taken = _own_handlers()
    try:
        code = int(importlib.import_module(args._module).run(args) or 0)
        if _TERMINATED:             # raised where Python dropped it: the command ran on
            raise Terminated
        if _INTERRUPTED:
            raise KeyboardInterrupt
        return code
    except (UserError, QuantizationError) as exc:
        for line in str(exc).splitlines() or [""]:       # a mistake a line (a sweep's several)
            print(f"elmoe3d {args.command}: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated):
            print(f"elmoe3d {args.command}: terminated (SIGTERM){_written()}", file=sys.stderr)
            # cleaned up: now end as SIGTERM ends a process (the parent sees the signal, and a
            # program that called main() in-process, such as pytest, stops too)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return 143                  # SIGTERM blocked or handled by the caller
        print(f"elmoe3d {args.command}: interrupted{_written()}", file=sys.stderr)
        return 130
    except OSError as exc:
        from ..paths import build_error
        error = build_error(exc)
        if error is None:
            raise
        print(f"elmoe3d {args.command}: error: {error}", file=sys.stderr)
        return 2
    finally:
        sys.stdout = stdout
        for signum, default in taken:
            signal.signal(signum, default)


def console_main() -> int:
    """The ``elmoe3d`` program (the console script and ``python -m elmoe3d``): :func:`main`,
    and for an exception it lets through (a bug, not the user's input) the traceback and
    "internal error", exit status 3, the same for every command (1 is a mismatch a check
    found, 2 the user's input). :func:`main` itself lets it through, for a program or test
    that calls it."""
    try:
        return main()
    except KeyboardInterrupt:           # before main installs its handlers (the imports)
        print("elmoe3d: interrupted", file=sys.stderr)
        return 130
    except Exception:
        import traceback
        traceback.print_exc()
        command = next((a for a in sys.argv[1:] if a in COMMANDS), None)
        print(f"elmoe3d{' ' + command if command else ''}: internal error (a bug: the "
              f"traceback above; exit status 3)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    raise SystemExit(console_main())

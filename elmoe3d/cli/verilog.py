"""``elmoe3d verilog``: the Verilog of the logic die or of any block in it, at a configuration
preset (:mod:`elmoe3d.synth.export`; README "RTL export").

Usage::

    elmoe3d verilog --list [--config NAME]          # the die's blocks: instances, parameters
    elmoe3d verilog BLOCK [--config NAME] [-o FILE | --split DIR] [--flat] [--instance N]
                    [--name TOP]
                    [--sdc FILE [--sdc-unit ps|ns] [--io-delay FRACTION]]
                    [--sram macro [--sram-models FILE] [--sram-liberty FILE]
                                  [--memories FILE]]

``BLOCK`` is a block of ``elmoe3d blocks`` (``die``, ``pe``, ``ring``, ...) or a top class
(``LogicDie``, ``PE``, ``SwiGLUUnit``, ...), as the die at ``--config`` builds it. A block or
class with several distinct instances (the VPU's units with and without a tag, the ring's two
stations) needs ``--instance N``, N as ``--list`` numbers them. The form is hierarchical by
default (one module per distinct instance: the paper dies in minutes); ``--flat`` converts the
block whole, as ``make sim`` builds it (the paper dies are out of reach so). Without ``-o``
(or with ``-o -``) the Verilog goes to standard output and the summary to standard error. The
file starts with a comment naming the tool version, block, configuration (every field) and
form; it is written only when complete. ``--split DIR`` writes one file a module instead
(``DIR/<module>.v``, each opening with that comment) and the filelist ``DIR/files.f`` (the
top last; ``verilator -F DIR/files.f``), removing the module files an earlier ``--split``
into DIR listed and this one has not. A mistake is one line naming the option (exit status 2).

``--sram macro`` makes each RAM the area roll-up counts as a macro
(:func:`elmoe3d.synth.blocks.is_sram_macro`: a write port, at least 2,048 bits; read
asynchronously, as the FIFOs are, a register-file macro) an instance of a macro module, one module
a kind (``elmoe3d_sram_<width>x<depth>_<r>r<w>w...``, :class:`elmoe3d.synth.export.SramMacro`),
for a memory compiler's macros to replace; their behavioural models (Amaranth memories with the
macro's ports) follow the design, or go to ``--sram-models FILE``. ``--memories FILE`` writes
the macro list as JSON (:func:`elmoe3d.synth.export.memory_list`: each kind's geometry, ports,
write granules, read-during-write behaviour, ASAP7 area estimate and instance paths);
``--sram-liberty FILE`` a Liberty view of each kind (:func:`elmoe3d.synth.export.sram_liberty`).
``--sdc FILE`` writes a ``create_clock`` at the configuration's logic clock a clock port, in ps
(``set_units -time ps``, the ASAP7 libraries' unit; ``--sdc-unit ns`` for a library in ns); with
``--io-delay FRACTION`` also a ``set_input_delay`` on every other input and a
``set_output_delay`` on every output, that fraction of the period (a top with one clock port).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path

from ..errors import UserError
from .outputs import (atomic_outputs, check_distinct, check_output, check_output_dir,
                      output_dir, output_path, plain_printer, report_console,
                      stdout_or_path)


def configure(parser) -> None:
    from ..config import PRESETS, preset_key
    from . import CONFIG_FILE_HELP, CONFIG_METAVAR
    parser.add_argument("block", nargs="?", default=None, metavar="BLOCK",
                        help="a block (elmoe3d blocks: die, pe, tile, vpu, ring, ...) or a top "
                             "class (LogicDie, PE, SwiGLUUnit, ...) of the die at --config")
    parser.add_argument("--config", default="small", metavar=CONFIG_METAVAR, type=preset_key,
                        help=f"configuration preset: {', '.join(PRESETS)} (default small), "
                             f"{CONFIG_FILE_HELP}")
    parser.add_argument("--list", action="store_true",
                        help="list the die's distinct block instances (count, parameters that "
                             "tell instances of one class apart) and exit")
    parser.add_argument("--instance", metavar="N", default=None,
                        help="which instance of a block with several distinct ones (1, 2, ... "
                             "as --list numbers them within the class)")
    parser.add_argument("--flat", action="store_true",
                        help="convert the block whole (every instance elaborated, identical "
                             "modules merged) instead of one module per distinct instance")
    parser.add_argument("--name", metavar="TOP", default=None,
                        help="top module name (default elmoe3d_<block>_<config>)")
    parser.add_argument("-o", "--out", metavar="FILE", type=stdout_or_path, default=None,
                        help="write the Verilog to FILE (default, or -: standard output)")
    parser.add_argument("--split", metavar="DIR", type=output_dir, default=None,
                        help="write one file a module into DIR (<module>.v, the SRAM models' "
                             "too unless --sram-models) and the filelist DIR/files.f (the "
                             "top last; verilator -F DIR/files.f); instead of -o")
    parser.add_argument("--sdc", metavar="FILE", type=output_path, default=None,
                        help="write timing constraints to FILE: a create_clock at the "
                             "configuration's logic clock on each clock port of the top "
                             "module (no I/O delays without --io-delay)")
    parser.add_argument("--sdc-unit", choices=("ps", "ns"), default=None,
                        help="with --sdc: the time unit of its figures and its set_units line "
                             "(default ps, the ASAP7 libraries' and --sram-liberty's)")
    parser.add_argument("--io-delay", metavar="FRACTION", type=float, default=None,
                        help="with --sdc: input and output delays on every other port, this "
                             "fraction of the clock period (0 <= FRACTION < 1; one clock port)")
    parser.add_argument("--sram", choices=("rtl", "macro"), default="rtl",
                        help="rtl: every memory as Amaranth's behavioural Verilog (default); "
                             "macro: each RAM of at least 2,048 bits with a write port an "
                             "instance of an SRAM (or, read asynchronously, register-file) "
                             "macro module, one module a kind, their behavioural models after "
                             "the design")
    parser.add_argument("--sram-models", metavar="FILE", type=output_path, default=None,
                        help="with --sram macro: write the macros' behavioural models to FILE "
                             "instead of after the design (to link a memory compiler's)")
    parser.add_argument("--sram-liberty", metavar="FILE", type=output_path, default=None,
                        help="with --sram macro: write a Liberty view of each macro kind to "
                             "FILE (area, pins, setup/hold and clock-to-data arcs and access "
                             "energies from one published ASAP7 SRAM bank; a placeholder for "
                             "a compiler's views)")
    parser.add_argument("--memories", metavar="FILE", type=output_path, default=None,
                        help="with --sram macro: write the list of SRAM macros to FILE (JSON: "
                             "geometry, ports, read-during-write, area estimate, instances)")


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: The export's child module names (:func:`elmoe3d.synth.export.module_name`) and their
#: internal submodules' (:func:`~elmoe3d.synth.export.plain_module_names`).
_CHILD_MODULE = re.compile(r"elmoe3d_[A-Za-z0-9]+_[0-9a-f]{10}(_\w*)?\Z")


def _check_name(name) -> None:
    """``--name``: a Verilog identifier that Yosys writes as it is (not a keyword, which it
    escapes: ``module``, ``logic``, ``int``, ...) and no child module's name."""
    from amaranth.back import verilog
    from amaranth.hdl import Module
    if not _IDENTIFIER.match(name):
        raise UserError(f"--name {name}: expected a Verilog identifier (letters, digits, _, "
                        f"not starting with a digit)")
    if name.startswith("elmoe3d_sram_"):
        raise UserError(f"--name {name}: the form of the export's SRAM macro module names "
                        f"(elmoe3d_sram_...); choose another")
    if _CHILD_MODULE.match(name):
        raise UserError(f"--name {name}: the form of the export's child module names "
                        f"(elmoe3d_<Class>_<10 hex digits>); choose another")
    probe = verilog.convert(Module(), name=name, ports={}, emit_src=False)
    if not re.search(rf"^module {re.escape(name)}\(", probe, re.M):
        raise UserError(f"--name {name}: a Verilog or SystemVerilog keyword; choose another")


def _label(entry, twins) -> str:
    """``entry``'s parameters that differ from its ``twins`` (other instances of its class)."""
    from ..synth.rollup import param_differences
    shown = []
    for k, v in entry.params.items():
        shown += param_differences(k, v, [t.params.get(k) for t in twins])
    return ", ".join(shown)


def _by_class(found) -> dict:
    """class name -> its distinct instances in walk order."""
    out = {}
    for entry in found.values():
        out.setdefault(entry.cls, []).append(entry)
    return out


def _pick(found, text, instance):
    """The one instance ``BLOCK`` (``text``) and ``--instance`` name: a class of the die's
    instances by name (any letter case), else a block of :data:`elmoe3d.blocks.BLOCKS` (its
    top classes)."""
    from ..blocks import block
    hits = [e for e in found.values() if e.cls.lower() == text.lower()]
    if not hits:
        try:
            b = block(text)
        except ValueError as exc:
            raise UserError(f"BLOCK: {exc}") from None
        tops = {top.rpartition(":")[2] for top in b.tops}
        hits = [e for e in found.values() if e.block == b.name and e.cls in tops]
        if not hits:
            alone = _alone(b)
            if alone is None:
                raise UserError(f"BLOCK {text}: the die at this configuration builds no "
                                f"instance of block {b.name} (elmoe3d verilog --list shows "
                                f"what it builds; the FPGA board's blocks: elmoe3d fpga)")
            return alone
        classes = sorted({e.cls for e in hits})
        if len(classes) > 1:
            raise UserError(f"BLOCK {text}: block {b.name} has the classes "
                            f"{', '.join(classes)}; name one")
    cls = hits[0].cls
    if instance is None:
        if len(hits) > 1:
            options = "; ".join(f"{i} ({_label(e, [t for t in hits if t is not e])})"
                                for i, e in enumerate(hits, 1))
            raise UserError(f"BLOCK {text}: {len(hits)} distinct instances of {cls}; "
                            f"--instance N picks one: {options}")
        return hits[0]
    from ..checks import parse_int
    n = parse_int(f"--instance (of {len(hits)} distinct {cls} instances)", instance,
                  lo=1, hi=len(hits), error=UserError)
    return hits[n - 1]


def _alone(b):
    """Block ``b`` that the die does not build but that needs no parameter (the IA8xW5 unit
    PE, whose arithmetic the tile builds from its helpers): its one top class built with
    its defaults, as a :class:`~elmoe3d.synth.export.DieBlock` of count 0; else None."""
    import inspect
    from ..synth.blocks import instance_key, resolve
    from ..synth.export import DieBlock
    if len(b.tops) != 1:
        return None
    cls = resolve(b.tops[0], optional=True)
    if cls is None or any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL,
                                                                  p.VAR_KEYWORD)
                          for p in inspect.signature(cls.__init__).parameters.values()
                          if p.name != "self"):
        return None
    obj = cls()
    return DieBlock(key=instance_key(obj), obj=obj, block=b.name, count=0, depth=0,
                    params={})


def _list(say, console, found, arch) -> None:
    from rich.table import Table
    table = Table(title=f"Block instances of the logic die at {arch.name} (elmoe3d verilog "
                        f"BLOCK [--instance N])", title_justify="left")
    for col in ("block", "class", "instance", "on the die", "parameters that differ"):
        table.add_column(col, no_wrap=col != "parameters that differ")
    classes = _by_class(found)
    for entry in found.values():
        twins = classes[entry.cls]
        index = twins.index(entry) + 1
        others = [t for t in twins if t is not entry]
        table.add_row(entry.block, "  " * entry.depth + entry.cls,
                      str(index) if others else "-", f"{entry.count:,}",
                      _label(entry, others) if others else "")
    console.print(table)


def _pes_under(found, entry) -> int:
    """How many PEs one instance of ``entry`` holds (itself included)."""
    def under(key):
        node = found[key]
        own = 1 if node.cls == "PE" else 0
        return own + sum(n * under(k) for k, n in node.children.items())
    return under(entry.key) if entry.key in found else 0


def default_name(entry, found, arch) -> str:
    """``elmoe3d_<class in snake case>[_<instance>]_<config>``: ``elmoe3d_pe_small``,
    ``elmoe3d_ring_station_2_small``, ``elmoe3d_logic_die_paper_4gb``."""
    twins = _by_class(found).get(entry.cls, [entry])
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", entry.cls).lower()
    index = f"_{twins.index(entry) + 1}" if len(twins) > 1 else ""
    return f"elmoe3d_{snake}{index}_{arch.name}".replace("-", "_")


def header(*, block, arch, flat, name, srams=None) -> str:
    """The comment the exported file starts with: tool version, block, configuration (every
    field, JSON) and form (``srams``: how the SRAM macros are given, if they are)."""
    from .. import __version__
    from ..sim.runner import source_digest
    form = "flat" if flat else "hierarchical (one module per distinct block instance)"
    if srams:
        form += f"; {srams}"
    params = {k: v for k, v in block.params.items()        # configurations: the line below
              if not dataclasses.is_dataclass(v)}
    return (f"// elmoe3d {__version__} (source {source_digest()[:16]}): elmoe3d verilog\n"
            f"// top module {name}: {block.cls} (block {block.block}), parameters "
            f"{json.dumps(params, sort_keys=True, default=str)}\n"
            f"// configuration {arch.name}: {json.dumps(arch.to_dict(), sort_keys=True)}\n"
            f"// form: {form}\n")


def run(args) -> int:
    from ..hw.checked import inspection
    from ..hw.die import LogicDie
    from ..sim.runner import module_ports, port_directions
    from ..synth.export import (ExportError, die_blocks, flat_verilog, hierarchical_verilog,
                                memory_list, sdc, sram_liberty, sram_models)
    from . import config_arch
    arch = config_arch(args.config)
    macro_files = [(option, path) for option, path in (("--sram-models", args.sram_models),
                                                        ("--sram-liberty", args.sram_liberty),
                                                        ("--memories", args.memories))
                   if path is not None]
    if args.list and (args.flat or args.sram != "rtl" or macro_files
                      or any(v is not None for v in (args.block, args.out, args.name,
                                                     args.instance, args.sdc,
                                                     args.io_delay, args.split,
                                                     args.sdc_unit))):
        raise UserError("--list: takes no BLOCK, -o, --split, --flat, --name, --instance, "
                        "--sdc, --sdc-unit, --io-delay or --sram options (it lists the die's "
                        "blocks)")
    if args.split is not None:
        if args.out is not None:
            raise UserError("--split and -o exclude each other (--split writes a file a "
                            "module, -o one file)")
        if args.split.suffix.lower() in (".v", ".sv") and not args.split.is_dir():
            raise UserError(f"--split {args.split}: names a folder to write a file a module "
                            f"into, not a file; give a folder (e.g. "
                            f"{args.split.with_suffix('')}), or -o for one file")
        check_output_dir(args.split, "--split", [FILELIST])
        folder = Path(os.path.abspath(args.split))
        for option, path in [("--sdc", args.sdc)] + macro_files:
            if path is not None and (folder == Path(os.path.abspath(path))
                                     or folder.is_relative_to(os.path.abspath(path))):
                raise UserError(f"{option} {path}: is --split's folder {args.split} or holds "
                                f"it")
    if args.sdc_unit is not None and args.sdc is None:
        raise UserError("--sdc-unit: needs --sdc (the unit of its figures)")
    if args.io_delay is not None:
        if args.sdc is None:
            raise UserError("--io-delay: needs --sdc (it sets the SDC's input and output "
                            "delays)")
        if not 0 <= args.io_delay < 1:
            raise UserError(f"--io-delay: expected a fraction of the clock period, 0 <= "
                            f"FRACTION < 1, got {args.io_delay:g}")
    if args.sdc is not None:
        _check_output(args.sdc, "--sdc", args.split)
    for option, path in macro_files:
        if args.sram != "macro":
            raise UserError(f"{option}: needs --sram macro (with --sram rtl there are no "
                            f"macros)")
        _check_output(path, option, args.split)
    if not args.list and args.block is None:
        raise UserError("BLOCK: expected a block or class to export (elmoe3d verilog --list "
                        "shows them), or --list")
    name = args.name
    if name is not None:
        _check_name(name)
    if args.out == "-":
        args.out = None                                       # -o -: standard output
    if args.out is not None:
        check_output(args.out, "-o")
    split_list = None if args.split is None else args.split / FILELIST
    check_distinct([("-o", args.out), ("--split", split_list), ("--sdc", args.sdc)]
                   + macro_files)
    to_stdout = args.out is None and args.split is None and not args.list
    console = report_console()
    if to_stdout:
        from rich.console import Console
        console = Console(stderr=True, highlight=False)
    say = plain_printer(console, soft_wrap=True)
    with inspection():
        found, entry, interrupted = die_blocks(LogicDie(config=arch)), None, None
        try:                        # the blocks go before the scope ends, on an error too
            if args.list:
                _list(say, console, found, arch)
                return 0
            entry = _pick(found, args.block, args.instance)
            name = name or default_name(entry, found, arch)
            block_label = f"{entry.cls} (block {entry.block})"
            where = f"{entry.count:,} on the die" if entry.count else \
                "not on the die: built with its defaults"
            say(f"elmoe3d verilog: {entry.cls} (block {entry.block}, {where}) at {arch.name}, "
                f"{'flat' if args.flat else 'hierarchical'}, top module {name}")
            start = time.monotonic()
            kinds = {} if args.sram == "macro" else None
            if args.flat:
                pes = _pes_under(found, entry)
                if pes > 1:
                    say(f"  flat: Amaranth elaborates each of the {pes} PEs (one paper PE: "
                        f"about 2.5 minutes and 2.4 GB here); the default, hierarchical form "
                        f"converts one")
            try:
                if args.flat:
                    text = flat_verilog(entry.obj, name=name, srams=kinds)
                else:
                    text = hierarchical_verilog(entry.obj, name=name, srams=kinds,
                                                progress=lambda s: say(f"  converting {s}"))
            except ExportError as exc:
                raise UserError(f"BLOCK {args.block}: {exc}") from None
            models, macros, srams = "", None, None
            if kinds is not None:
                macros = memory_list(text, name, kinds)
                models = (f"// elmoe3d verilog: behavioural models of the SRAM macros of "
                          f"{name} ({_plural(len(kinds), 'kind')}), {block_label} at "
                          f"{arch.name}\n" + sram_models(kinds))
                srams = (f"SRAM macros: {_plural(len(kinds), 'kind')}, "
                         f"{_plural(macros['total_instances'], 'instance')}, "
                         f"behavioural models "
                         + (f"in {args.sram_models}" if args.sram_models else
                            f"in {args.split}, a file each" if args.split is not None
                            else "after the design"))
            seconds = time.monotonic() - start
            header_lines = header(block=entry, arch=arch, flat=args.flat, name=name,
                                  srams=srams).splitlines(True)
            text = "".join(header_lines) + text
            if args.split is not None:
                split = _split(args.split, text, models if not args.sram_models else "", name,
                               args.sram_models)
            if not args.sram_models:
                text, models = text + models, ""
            ports = module_ports(text, name)
        except KeyboardInterrupt as exc:
            # raised again below, once the scope has collected the blocks the traceback's
            # frames held: no "created but never used" warning follows "interrupted"
            interrupted = type(exc)             # Ctrl-C, or SIGTERM (errors.Terminated)
        finally:
            found.clear()
            entry = None
    if interrupted is not None:
        raise interrupted
    constraints = None
    if args.sdc is not None:
        if not any(p == "clk" or p.endswith("_clk") for p in ports):
            raise UserError(f"--sdc {args.sdc}: top module {name} has no clock port (nothing "
                            f"to constrain)")
        directions = port_directions(text, name)
        try:
            constraints = sdc(top=name, ports=directions, unit=args.sdc_unit or "ps",
                              clock_ghz=arch.clock_ghz, io_delay=args.io_delay,
                              comment=f"elmoe3d verilog: {block_label} at {arch.name}, top "
                                      f"module {name}")
        except ValueError as exc:                         # more than one clock: no I/O delays
            raise UserError(f"--io-delay: {exc}") from None
    if args.split is not None:
        verilog_files = [("--split", path, content) for path, content in split]
        check_distinct([(o, p) for o, p, _t in verilog_files]
                       + [("--sdc", args.sdc)] + macro_files)
    else:
        verilog_files = [("-o", None if to_stdout else args.out, text)]
    files = [*verilog_files,
             ("--sdc", args.sdc, constraints),
             ("--sram-models", args.sram_models, models),
             ("--sram-liberty", args.sram_liberty, None if kinds is None else sram_liberty(
                 kinds, comment=f"{header_lines[0].removeprefix('// ').rstrip()}: the SRAM "
                                f"macros of {name}, {block_label} at {arch.name}")),
             ("--memories", args.memories, macros and json.dumps(
                 {"generated_by": header_lines[0].removeprefix("// ").rstrip("\n"),
                  "block": block_label,
                  "configuration": arch.name,
                  "verilog": "standard output" if to_stdout
                  else os.path.abspath(args.out or split_list),
                  "sram_models": os.path.abspath(args.sram_models) if args.sram_models
                  else None,
                  "sram_liberty": os.path.abspath(args.sram_liberty) if args.sram_liberty
                  else None,
                  **macros},
                 indent=1) + "\n")]
    files = [(o, p, t) for o, p, t in files if p is not None]

    def error(exc):
        options = [o for o, p, _t in files if str(p) == str(exc.filename)] or \
            [" / ".join(o for o, _p, _t in files)]
        return f"{options[0]}: cannot write ({exc})"

    stale = _stale_modules(args.split, split) if args.split is not None else []
    with atomic_outputs(error) as outputs:
        if args.split is not None:
            outputs.make_dir(args.split)
        for _option, path, content in files:
            outputs.make_dir(Path(path).parent)     # one inside --split's new folder
            with open(outputs.temp_for(path), "w", encoding="utf-8") as f:
                f.write(content)
    for path in stale:                  # the last export's modules this one has not
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if to_stdout:
        sys.stdout.write(text)
        sys.stdout.flush()
    modules = len(re.findall(r"^module ", text, re.M))
    written = text if args.split is None else "".join(t for _p, t in split)
    where = "standard output" if to_stdout else str(args.out) if args.split is None else \
        f"{args.split}: {len(split) - 1} files, one a module, and {FILELIST}" + \
        (f" (the last export's {len(stale)} other module files removed)" if stale else "")
    say(f"wrote {where}: {len(written):,} bytes, {written.count(chr(10)):,} lines, {modules} "
        f"module{'s' if modules != 1 else ''}, {len(ports)} ports of {name} "
        f"(conversion {seconds:.1f} s)")
    if macros is not None:
        _macro_summary(say, macros)
    for option, path, content in files[0 if to_stdout else len(verilog_files):]:
        say(f"wrote {option} {path}: {len(content):,} bytes")
    return 0


def _check_output(path, option: str, split) -> None:
    """:func:`~.outputs.check_output` of ``path``, or, for a file inside ``--split``'s folder
    ``split`` (which the export makes), :func:`~.outputs.check_output_dir` of its folder:
    ``--sdc DIR/x.sdc`` beside the modules, on the first export into DIR too."""
    inside = split is not None and Path(os.path.abspath(path)).is_relative_to(
        os.path.abspath(split))
    if inside and not Path(path).parent.exists():
        check_output_dir(Path(path).parent, option, [Path(path).name])
    else:
        check_output(path, option)


#: The filelist ``--split`` writes beside the modules' files.
FILELIST = "files.f"


def _split(folder, text: str, models: str, top: str, models_file=None) -> list:
    """``--split``'s files: ``(folder / <module>.v, its text)`` for each module of ``text``
    (the design, after its header) and of ``models`` (the SRAM macros' models, after theirs),
    each file opened by its part's header comments, then the filelist ``folder / files.f``:
    the file names (relative to the filelist, as ``verilator -F`` reads them), one a line,
    ``models_file`` first when the models went there (``--sram-models``), the design's top
    module ``top`` last."""
    from ..sim.runner import split_modules
    out = []
    for part in (models, text):
        head, modules = split_modules(part)
        out += [(folder / f"{m}.v", head + body) for m, body in modules.items()]
    names = [p.name for p, _t in out if p.stem != top] + [f"{top}.v"]
    if models_file is not None:
        names.insert(0, os.path.relpath(os.path.realpath(models_file),
                                        os.path.realpath(folder)))
    return out + [(folder / FILELIST,
                   f"{FILELIST_MARK} {top}\n" + "".join(f"{n}\n" for n in names))]


#: The first line of a filelist ``--split`` writes (a comment to ``verilator -F``): the mark
#: by which a later ``--split`` knows the folder's earlier export.
FILELIST_MARK = "// elmoe3d verilog --split, top module"


def _ours(path: Path) -> bool:
    """Whether ``path`` is a file an elmoe3d export wrote: its first line the export's header
    comment (``// elmoe3d <version> ...: elmoe3d verilog``, or the SRAM models' ``// elmoe3d
    verilog: ...``)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError):
        return False
    return first.startswith("// elmoe3d ") and "elmoe3d verilog" in first


def _stale_modules(folder, split) -> list:
    """The module files an earlier ``--split`` into ``folder`` wrote that this one does not:
    the names its ``files.f`` lists, only when that filelist carries :data:`FILELIST_MARK`
    (elmoe3d wrote it), only plain ``.v`` names of that folder, and only files whose first
    line is an export's header (:func:`_ours`): removed once this export is written, so that
    the folder holds one design; a user's own file is never touched."""
    try:
        old = (Path(folder) / FILELIST).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    if not old or not old[0].startswith(FILELIST_MARK):
        return []
    new = {p.name for p, _t in split} | set(split[-1][1].split())   # the new files.f's too
    return [Path(folder) / n for n in (line.strip() for line in old[1:])
            if n not in new and n.endswith(".v") and "/" not in n and os.sep not in n
            and (Path(folder) / n).is_file() and _ours(Path(folder) / n)]


def _plural(n: int, noun: str) -> str:
    """``1 kind``, ``2 kinds``, ``1,024 instances``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _macro_summary(say, macros) -> None:
    """The SRAM macros' kinds, one line each, and their totals."""
    say(f"SRAM macros: {_plural(len(macros['macros']), 'kind')}, "
        f"{_plural(macros['total_instances'], 'instance')}, {macros['total_bits']:,} bits, "
        f"{macros['total_area_um2'] / 1e6:.4f} mm^2 (ASAP7 estimate, elmoe3d.synth.sram)")
    for m in macros["macros"]:
        grains = ", ".join(f"{w['granularity']}-bit granules" for w in m["write_ports"]
                           if w["enable_bits"] > 1)
        reads = len(m["read_ports"])
        asynchronous = sum(r["clock"] is None for r in m["read_ports"])
        kind = "" if not asynchronous else " asynchronous" if asynchronous == reads else \
            f" ({asynchronous} asynchronous)"
        say(f"  {m['module']}: {m['count']} x {_plural(m['depth'], 'word')} of {m['width']} "
            f"bits, "
            f"{reads} read{kind} / {len(m['write_ports'])} write port"
            f"{'s' if len(m['write_ports']) > 1 else ''}"
            f"{', ' + grains if grains else ''}, read during write: "
            f"{m['read_during_write']}")

"""``elmoe3d fpga``: build the FPGA prototype's bitstream and report utilization and fmax.

::

    elmoe3d fpga [--board NAME] [--config NAME|auto|default] [--json F] [--seed N]
                 [--hb-words N] [--ext-words N] [--baud B] [--max-runs N]
                 [--estimate-only] [--hierarchy] [--force] [--no-asic] [--list-boards]

``make fpga BOARD=ulx3s-85f [CONFIG=...]`` runs it. The board top
(:class:`elmoe3d.hw.board.BoardPlatformTop`: UART bridge, load router, one PE, HB / EXT
stand-ins in block RAM) goes through Amaranth's platform flow for the board's
``amaranth-boards`` class with the YoWASP tools (:mod:`elmoe3d.synth.fpga`); the outputs land
in ``build/fpga/<board>/``: ``top.bit`` (the bitstream), ``top_report.json`` (nextpnr's
report), ``top.rpt`` / ``top.tim`` / ``build.log`` (Yosys, nextpnr, the build script), and
``report.json`` (this command's figures; ``--json`` puts them elsewhere).

``--config``: ``default`` (the board's named configuration,
:data:`elmoe3d.synth.fpga.FPGA_CONFIGS`; the board's fit search if it has none), ``auto``
(the fit search: Yosys estimates of the candidates, largest first; the largest that fits is
built, and what limits it is reported), a named configuration, or a preset of
:mod:`elmoe3d.config` (one PE of it). Every configuration is estimated first (Yosys alone,
cached with its netlist, which the build then takes: no second Yosys run); one that does not
fit stops there with one line (``--force`` places and routes it anyway: nextpnr's verdict).
``--estimate-only`` stops after the estimate; ``--hierarchy`` adds an estimate block by block
(Yosys without flattening: LUT4 positions, flip-flops, DSPs and block RAMs of every block of
the board top, in the JSON as ``hierarchy``). The report: utilization (used / available /
% of LUT4 positions, flip-flops, MULT18X18D, DP16KD and every other cell type used), fmax per
clock against its constraint, the step times, and beside them the ASIC area roll-up of the
same PE configuration (:mod:`elmoe3d.synth`, cached in ``build/synth``; ``--no-asic`` skips it).

Exit status: 0 with a bitstream (also when the timing is not met: the report says so); 2 with
one line for a bad option, an unknown board or configuration, a configuration that cannot fit,
or a tool that failed (named with its log file); nothing is written then.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..checks import check_int
from ..errors import UserError
from . import given_options
from .outputs import check_output, output_path, plain_printer, write_json


__all__ = ["configure", "run", "print_report", "report_rows", "asic_rollup", "block_rows",
           "print_blocks"]


def _resource(cell: str) -> str:
    """A cell type as the user reads it: nextpnr's TRELLIS_COMB is LUT4 positions."""
    return "LUT4 positions (TRELLIS_COMB)" if cell == "TRELLIS_COMB" else cell


def _allowed_pct(cell: str) -> int:
    from ..synth import fpga
    return round(100 * fpga.LUT_MARGIN) if cell == "TRELLIS_COMB" else 100


def configure(parser) -> None:
    from ..synth.fpga import DEFAULT_BOARD, DEFAULT_SEED
    parser.add_argument("--board", metavar="NAME", default=DEFAULT_BOARD,
                        help=f"amaranth-boards board (default {DEFAULT_BOARD}; --list-boards)")
    parser.add_argument("--config", metavar="NAME", default="default", type=_config_name,
                        help="default (the board's named configuration), auto (fit search), "
                             "a named FPGA configuration or a preset (default: default)")
    parser.add_argument("--json", metavar="F", type=output_path, default=None,
                        help="write the figures as JSON (default fpga/<board>/report.json "
                             "under the build root: the checkout's build/)")
    parser.add_argument("--seed", metavar="N", type=int, default=None,
                        help=f"nextpnr placement seed (default {DEFAULT_SEED}; not with "
                             f"--estimate-only)")
    parser.add_argument("--hb-words", metavar="N", type=int, default=None,
                        help="HB stand-in depth in W-bit words (power of two)")
    parser.add_argument("--ext-words", metavar="N", type=int, default=None,
                        help="EXT stand-in depth in W-bit words (power of two)")
    parser.add_argument("--baud", metavar="B", type=int, default=None,
                        help="UART rate the board top is built for (default 1000000)")
    parser.add_argument("--route-patience", metavar="N", type=int, default=None,
                        help="stop nextpnr when its router2 has not cut its overused wires "
                             "by 5 %% in N iterations (default 5; 0: never stop it)")
    parser.add_argument("--max-runs", metavar="N", type=int, default=None,
                        help="most Yosys estimates the fit search (--config auto) runs "
                             "(default 4)")
    parser.add_argument("--estimate-only", action="store_true",
                        help="stop after the Yosys estimate (no place and route)")
    parser.add_argument("--force", action="store_true",
                        help="place and route even when the estimate says it does not fit")
    parser.add_argument("--hierarchy", action="store_true",
                        help="also estimate block by block (a second Yosys run, without "
                             "flattening: 4-12 minutes for a board top here): where the LUTs, "
                             "flip-flops, DSPs and block RAMs go; with --estimate-only, no "
                             "place and route follows")
    parser.add_argument("--no-asic", action="store_true",
                        help="leave out the ASIC area roll-up of the same configuration")
    parser.add_argument("--list-boards", action="store_true",
                        help="list the supported boards with their devices and capacities")


def _config_name(text: str) -> str:
    """``--config``'s name, case and surrounding blanks aside where it names one (auto,
    default, a named FPGA configuration, a preset: all lower case); anything else as typed,
    for its error."""
    from ..config import PRESETS
    from ..synth.fpga import FPGA_CONFIGS
    key = text.strip().lower()
    known = {"auto", "default", *(c.name for c in FPGA_CONFIGS.values()), *PRESETS}
    return key if key in known else text


def _console():
    from .outputs import report_console
    return report_console(120)


def list_boards(say) -> None:
    from rich.table import Table
    from ..synth.fpga import BOARDS, DEFAULT_BOARD
    t = Table(title="Boards (amaranth-boards 0.0.21, ECP5 with a UART); capacities: Lattice "
                    "ECP5 and ECP5-5G Family Data Sheet FPGA-DS-02012, Table 1.1",
              title_justify="left")
    for h in ("board", "device", "clock", "LUT4", "FF", "MULT18X18D", "DP16KD", "description"):
        t.add_column(h, justify="left" if h in ("board", "device", "clock", "description")
                     else "right")
    for name, b in BOARDS.items():
        cls = b.platform_class
        d = b.device
        t.add_row(name + (" (default)" if name == DEFAULT_BOARD else ""), d.name,
                  f"{b.clock} {cls().default_clk_frequency / 1e6:g} MHz", f"{d.lut4:,}",
                  f"{d.ff:,}", str(d.mult18), str(d.ebr), b.description)
    say(t)


def _options_given(args) -> list:
    """The options given of every option but ``--list-boards`` (``--board`` and ``--config``
    when not their defaults)."""
    from ..synth.fpga import DEFAULT_BOARD
    return ([o for o, given in (("--board", args.board.lower() != DEFAULT_BOARD),
                                ("--config", args.config != "default")) if given]
            + given_options(args, ("json", "seed", "hb_words", "ext_words", "baud",
                                   "route_patience", "max_runs", "estimate_only", "force",
                                   "hierarchy", "no_asic")))


#: The largest ``--seed`` (nextpnr reads it as a C ``int``).
MAX_SEED = 2**31 - 1


def run(args) -> int:
    from ..synth import fpga

    console = _console()
    say = plain_printer(console)
    if args.list_boards:
        others = _options_given(args)
        if others:
            raise UserError(f"--list-boards takes no other option, got {', '.join(others)}")
        list_boards(say)
        return 0
    bd = fpga.board(args.board)
    for value, option in ((args.hb_words, "--hb-words"), (args.ext_words, "--ext-words"),
                          (args.baud, "--baud"), (args.max_runs, "--max-runs")):
        if value is not None:
            check_int(option, value, lo=1, error=UserError)
    if args.seed is not None and not 0 <= args.seed <= MAX_SEED:
        raise UserError(f"--seed: expected an integer from 0 to {MAX_SEED} (nextpnr's int), "
                        f"got {args.seed}")
    if args.force and args.estimate_only:
        raise UserError("--force places and routes a design the estimate says does not fit; "
                        "--estimate-only stops before place and route: give one of them")
    if args.estimate_only:                       # options of place and route only
        pnr = given_options(args, ("seed", "route_patience"))
        if pnr:
            raise UserError(f"{', '.join(pnr)}: nextpnr's, and --estimate-only stops before "
                            f"place and route: leave {'them' if len(pnr) > 1 else 'it'} out "
                            f"or drop --estimate-only")
    patience = args.route_patience
    if patience is None:
        patience = fpga.ROUTE_PATIENCE
    elif patience < 0:
        raise UserError(f"--route-patience: expected 0 (never stop) or a positive number of "
                        f"router2 iterations, got {patience}")
    for value, option in ((args.hb_words, "--hb-words"), (args.ext_words, "--ext-words")):
        if value is not None and value & (value - 1):
            raise UserError(f"{option}: expected a power of two, got {value}")
    fpga.check_device(bd.device)
    # every option checked before anything is removed or built
    name = args.config
    no_named = name == "default" and bd.name not in fpga.FPGA_CONFIGS
    if name == "auto" or no_named:
        if args.hb_words or args.ext_words:
            raise UserError("--hb-words/--ext-words: the fit search (--config auto) chooses "
                            "the stand-in depths")
        if args.baud:                   # the search's clock and this rate, before any search
            import dataclasses
            named = fpga.FPGA_CONFIGS.get(bd.name)
            fpga.check_clock(dataclasses.replace(
                fpga.candidates(bd.device)[0][1], baud=args.baud,
                clk_hz=named.clk_hz if named else None), bd)
    else:
        if args.max_runs is not None:
            raise UserError(f"--max-runs: only with --config auto (the fit search); "
                            f"--config {name} runs one estimate")
        cfg = fpga.resolve_config(name, bd.name, hb_words=args.hb_words,
                                  ext_words=args.ext_words, baud=args.baud)
        fpga.check_fits_at_all(cfg, bd.device)
        fpga.check_clock(cfg, bd)
    build_dir = fpga.fpga_root() / bd.name
    json_path = args.json if args.json is not None else build_dir / "report.json"
    if args.json is None:
        build_dir.mkdir(parents=True, exist_ok=True)
        json_path.unlink(missing_ok=True)       # a failed run leaves no report of an old one
    check_output(json_path, "--json")
    fpga.tool_env()                              # fails early if a tool is missing

    started = time.monotonic()
    doc = {"board": _board_doc(bd), "search": None, "estimate": None}
    if no_named:
        say(f"elmoe3d fpga: {bd.name} has no named configuration: running the fit search")
        name = "auto"
    if name == "auto":
        say(f"elmoe3d fpga: fit search on {bd.name} ({bd.device.name})")
        search = fpga.fit_search(bd, say=say, **({} if args.max_runs is None else
                                                 {"max_runs": args.max_runs}))
        doc["search"] = search.to_json()
        say(f"  {search.limit}")
        if search.chosen is None:
            raise UserError(f"no configuration fits {bd.name}: {search.limit}")
        cfg = search.chosen
        if args.baud:
            import dataclasses
            cfg = dataclasses.replace(cfg, baud=args.baud)
        doc["estimate"] = search.tried[-1][1].to_json()
        source = "fit search"
    else:
        source = "named default" if name == "default" or name in {
            c.name for c in fpga.FPGA_CONFIGS.values()} else "preset"
    doc["config"] = {**cfg.summary(), "source": source, "documented_estimate": cfg.estimate}
    fpga.check_clock(cfg, bd)
    say(f"elmoe3d fpga: {bd.name} ({bd.device.name}), configuration {cfg.name} ({source}): "
        f"{fpga.describe(cfg)}")

    if doc["estimate"] is None:
        say(f"elmoe3d fpga: Yosys estimate of the board top (cache {fpga.estimates_dir()}/; "
            "the build takes its netlist)")
        est = fpga.estimate(fpga.board_top(cfg), bd.platform(),
                            script_after_read=cfg.script_after_read)
        say(f"  {fpga.estimate_line(est)}"
            + ("  (cached)" if est.cached else f"  ({est.seconds:.0f} s)"))
        doc["estimate"] = est.to_json()
    if args.hierarchy:
        say("elmoe3d fpga: Yosys estimate block by block (not flattened)")
        hest = fpga.estimate(fpga.board_top(cfg), bd.platform(),
                             script_after_read=cfg.script_after_read, hierarchy=True)
        doc["hierarchy"] = hest.to_json()
        print_blocks(say, doc["hierarchy"])
    est = doc["estimate"]
    if args.estimate_only:
        if not args.no_asic:
            doc["asic"] = asic_rollup(cfg.arch, say=say, pe_params=_asic_pe_params(cfg))
        print_report(say, doc)
        doc["seconds"] = round(time.monotonic() - started, 1)
        write_json(json_path, doc)
        say(f"elmoe3d fpga: estimate only (no place and route); JSON: {json_path}")
        return 0
    if not est["fits"] and not args.force:
        lim = est["limit"]
        raise UserError(
            f"{cfg.name} does not fit {bd.name} ({bd.device.name}): {_resource(lim)} "
            f"{est['used'][lim]:,} of {est['available'][lim]:,} ({100 * est['used'][lim] / est['available'][lim]:.1f} %, "
            f"allowed {_allowed_pct(lim)} %) by the Yosys estimate; no bitstream "
            f"(--estimate-only writes the estimate and the ASIC roll-up as JSON; --force "
            f"places and routes it anyway)")

    if not args.no_asic:
        doc["asic"] = asic_rollup(cfg.arch, say=say, pe_params=_asic_pe_params(cfg))
    say(f"elmoe3d fpga: building {build_dir}/top.bit (one Yosys / nextpnr job at a time)")
    if cfg.note:
        say(f"  note: {cfg.note}")
    seed = fpga.DEFAULT_SEED if args.seed is None else args.seed
    res = fpga.build(fpga.board_top(cfg), bd.platform(), build_dir=build_dir,
                     seed=seed,
                     script_after_read=cfg.script_after_read, say=say, router=cfg.router,
                     placer=cfg.placer, route_patience=patience)
    doc["build"] = {"dir": str(res.build_dir), "bitstream": str(res.bitstream),
                    "nextpnr_report": str(res.report_path),
                    "logs": {k: str(v) for k, v in res.logs.items()},
                    "seed": seed, "router": cfg.router,
                    "route_patience": patience,
                    "placer": cfg.placer,
                    "synth_cached": res.synth_cached,
                    "seconds": {k: round(v, 1) for k, v in res.seconds.items()}}
    doc.update(res.report)
    doc["seconds"] = round(time.monotonic() - started, 1)
    print_report(say, doc)
    write_json(json_path, doc)
    say(f"JSON: {json_path}")
    return 0


def _board_doc(bd) -> dict:
    cls = bd.platform_class
    return {"name": bd.name, "description": bd.description, "device": bd.device.name,
            "package": cls.package, "speed": cls.speed, "clock": bd.clock,
            "clock_mhz": cls().default_clk_frequency / 1e6,
            "capacity": bd.device.capacity()}


# ---- the report -----------------------------------------------------------------------------

def report_rows(doc) -> dict:
    """The printed tables of a report document, as rows of strings: ``utilization``
    (resource, used, available, %), ``fmax`` (clock, achieved MHz, constraint MHz, met) and
    ``beside`` (what, FPGA, ASIC); :func:`print_report` prints exactly these. A document
    without a build (``--estimate-only``) shows the Yosys estimate's figures and no fmax."""
    u = doc.get("utilization") or _estimate_utilization(doc["estimate"])
    util = [(k, f"{v['used']:,}", f"{v['available']:,}",
             "-" if v["pct"] is None else f"{v['pct']:.2f}") for k, v in u.items()]
    fmax = [(k, f"{v['achieved_mhz']:.2f}", f"{v['constraint_mhz']:.2f}",
             "yes" if v["met"] else "NO") for k, v in doc.get("fmax", {}).items()]
    beside = []
    asic = doc.get("asic")

    def fpga_cell(k):
        v = u.get(k)
        if v is None or not v["available"]:
            return "-"
        return f"{v['used']:,} {k} ({100 * v['used'] / v['available']:.1f} %)"

    a = (lambda k: f"{asic[k]:.4f} mm²") if asic else (lambda k: "-")
    beside.append(("logic", fpga_cell("TRELLIS_COMB") + ", " + fpga_cell("TRELLIS_FF"),
                   a("pe_logic_mm2")))
    muls = fpga_cell("MULT18X18D")
    if doc["config"].get("tile_dsp_pairs"):
        muls += ", two IA8xW5 products each"
    if doc["config"].get("lut_multipliers"):
        muls += " + Booth LUT multipliers (" + ", ".join(
            f"{a}x{b}" for a, b in doc["config"]["lut_multipliers"]) + ")"
    beside.append(("multipliers", muls, a("pe_mac_mm2")))
    beside.append(("memories", fpga_cell("DP16KD"), a("pe_sram_mm2")))
    slowest = min(doc.get("fmax", {}).values(), key=lambda v: v["achieved_mhz"], default=None)
    beside.append(("clock", "-" if slowest is None else
                   f"fmax {slowest['achieved_mhz']:.2f} MHz (board clock "
                   f"{slowest['constraint_mhz']:.2f} MHz)",
                   f"{asic['clock_ghz']:g} GHz target" if asic else "-"))
    pp = asic.get("paper") if asic else None
    beside.append(("one PE", f"{doc['board']['device']}: 1 PE",
                   "-" if not asic else f"{asic['pe_mm2']:.4f} mm²" + (
                       f" ({100 * pp['share_of_die']:.2f} % of the paper 4 GB die, "
                       f"{pp['die_mm2']:.2f} mm²; its PEs are {pp['pe_mm2']:.3f} mm² each)"
                       if pp else "")))
    return {"utilization": util, "fmax": fmax, "beside": beside}


def _estimate_utilization(est) -> dict:
    return {k: {"used": est["used"][k], "available": est["available"][k],
                "pct": est["pct"][k]} for k in est["used"]}


#: Blocks below this share of the board top's LUT4 positions (and with no DSP or block RAM)
#: are left out of the printed block table (the JSON has them all).
BLOCK_MIN_SHARE = 0.01


def block_rows(hier: dict) -> tuple[list, int]:
    """Rows of the block table of a hierarchical estimate (``doc["hierarchy"]``): block
    (indented by depth), LUT4 positions with everything inside (and % of the device), its own
    LUT4 positions, flip-flops, MULT18X18D and DP16KD with everything inside; and how many
    blocks were left out (:data:`BLOCK_MIN_SHARE`)."""
    blocks = hier["blocks"]
    top = blocks[0]["total"]["TRELLIS_COMB"] or 1
    avail = hier["available"]["TRELLIS_COMB"]
    rows, left = [], 0
    for b in blocks:
        t = b["total"]
        if (b["depth"] and t["TRELLIS_COMB"] < BLOCK_MIN_SHARE * top
                and not t["MULT18X18D"] and not t["DP16KD"]):
            left += 1
            continue
        name = b["path"].rsplit(".", 1)[-1] if b["depth"] else b["path"]
        name = name.split("$", 1)[0]                   # Yosys' uniquifying suffix
        rows.append(("  " * b["depth"] + name,
                     f"{t['TRELLIS_COMB']:,} ({100 * t['TRELLIS_COMB'] / avail:.1f} %)",
                     f"{b['own']['TRELLIS_COMB']:,}", f"{t['TRELLIS_FF']:,}",
                     str(t["MULT18X18D"]), str(t["DP16KD"])))
    return rows, left


def print_blocks(say, hier: dict) -> None:
    """Print :func:`block_rows`."""
    from rich.table import Table
    rows, left = block_rows(hier)
    t = Table(title="Where the resources go (Yosys, not flattened: the total differs from the "
                    "flat estimate)", title_justify="left")
    for i, h in enumerate(("block", "LUT4 positions", "own", "FF", "MULT18X18D", "DP16KD")):
        t.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    say(t)
    if left:
        say(f"  ({left} smaller blocks under {100 * BLOCK_MIN_SHARE:g} % of the LUT4 positions "
            f"and without DSPs or block RAM left out; the JSON has every block)")


def print_report(say, doc) -> None:
    """Print the tables of :func:`report_rows` and the timing verdict."""
    from rich.table import Table
    rows = report_rows(doc)
    b, c = doc["board"], doc["config"]
    tables = (
        (f"FPGA utilization: {b['name']} ({b['device']}), configuration {c['name']}"
         + ("" if "utilization" in doc else " (Yosys estimate, not placed)"),
         ("resource", "used", "available", "%"), rows["utilization"]),
        ("fmax (nextpnr)", ("clock", "achieved MHz", "constraint MHz", "met"), rows["fmax"]),
        (f"FPGA beside the ASIC roll-up of the same PE configuration ({c['arch']})",
         ("", "FPGA", "ASIC (ASAP7 roll-up)"), rows["beside"]),
    )
    for title, header, body in tables:
        if not body or (title.startswith("FPGA beside") and not doc.get("asic")):
            continue                # --estimate-only: no fmax; --no-asic: nothing beside
        t = Table(title=title, title_justify="left")
        for i, h in enumerate(header):
            t.add_column(h, justify="left" if i == 0 or title.startswith("FPGA beside")
                         else "right")
        for r in body:
            t.add_row(*r)
        say(t)
    if "timing_met" not in doc:
        say("timing: not placed and routed (estimate only)")
    elif doc["timing_met"]:
        say("timing: met on every clock")
    else:
        bad = [f"{k} achieved {v['achieved_mhz']:.2f} MHz < constraint "
               f"{v['constraint_mhz']:.2f} MHz" for k, v in doc["fmax"].items() if not v["met"]]
        say(f"timing: NOT MET ({'; '.join(bad)}); the bitstream is built but the design is "
            f"not guaranteed to work at the board clock")
    s = doc.get("build", {}).get("seconds")
    if s:
        say("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in s.items()))


# ---- the ASIC roll-up beside it -------------------------------------------------------------

def _asic_pe_params(cfg) -> dict:
    """The board PE's time-shared VPU units for the ASIC roll-up; the tile stays the ASIC's
    (one unit PE per product: DSP pairing is an FPGA mapping, not an ASIC datapath)."""
    return {"requant_units": cfg.requant_units, "fp32_units": cfg.fp32_units,
            "combine_units": cfg.combine_units, "swiglu_units": cfg.swiglu_units}


def asic_rollup(arch, *, say=print, jobs: int = 1, paper_report=None,
                pe_params=None) -> dict:
    """The ASIC area of ``arch``'s PE through :mod:`elmoe3d.synth` (the roll-up of ``make
    synth``: the PE's own logic synthesised with its SRAMs as macros, the tile from its area
    model, the VPU units; cached in ``build/synth``, so only the PE's own logic is new for a
    new memory depth): mm² of the PE (logic, SRAM, MAC) and its categories. Beside it, from
    ``make synth``'s report (``paper_report``, default ``build/synth/report.json``, if
    present): the paper 4 GB die and PE, and this PE's share of that die. The die of ``arch``
    itself is not rolled up (its controllers and links are a dozen more Yosys runs, over ten
    minutes on this machine, for blocks the board does not have). ``pe_params``: the PE's
    keyword arguments (the board's time-shared VPU units)."""
    import json
    from ..synth.liberty import BUNDLED_LIBERTY, read_liberty
    from .synth import synth_cache_dir
    from ..synth.rollup import Planner, evaluate, logic_area, sram_total
    from ..hw.pe import PE
    lib = read_liberty(BUNDLED_LIBERTY)
    started = time.monotonic()

    def progress(done, total, label, r):
        note = "cached" if r.cached else f"{r.seconds:.0f} s"
        say(f"  asic [{done}/{total}] {label}: {r.area:,.0f} um² ({note})")

    planner = Planner(liberty=lib, cache_dir=synth_cache_dir(), jobs=jobs, progress=progress)
    node = planner.plan(PE(config=arch, **(pe_params or {})), label="PE")
    say(f"elmoe3d fpga: ASIC roll-up of the {arch.name} PE ({len(planner._jobs)} Yosys jobs, "
        f"cache {synth_cache_dir()}/)")
    planner.run()
    pe = evaluate(node, planner.results)
    total = logic_area(pe) + sram_total(pe)
    out = {"config": arch.name, "liberty": str(lib.path), "clock_ghz": arch.clock_ghz,
           "pe_mm2": total / 1e6, "pe_logic_mm2": logic_area(pe) / 1e6,
           "pe_sram_mm2": sram_total(pe) / 1e6, "pe_mac_mm2": pe.get("MAC", 0.0) / 1e6,
           "pe_breakdown_um2": dict(pe), "paper": None}
    path = Path(paper_report) if paper_report else synth_cache_dir() / "report.json"
    try:
        paper = json.loads(path.read_text())["configs"]["paper-4gb"]
        out["paper"] = {"source": str(path), "die_mm2": paper["die_total"] / 1e6,
                        "pe_mm2": paper["pe_total"] / 1e6, "pes": paper["pes"],
                        "share_of_die": total / paper["die_total"]}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    out["seconds"] = round(time.monotonic() - started, 1)
    return out

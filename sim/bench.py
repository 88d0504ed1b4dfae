"""``elmoe3d bench`` (what ``make bench`` runs): the benchmark figures, each beside a baseline
measured in the same run (BRIEF section 6; tests never time anything, this command does).

1. **Tile throughput in RTL simulation** -- the cocotb bench's ``test_throughput``: a long FULL
   GEMM with an always-valid source and an always-ready sink; accepted beats / (cycles from the
   first accepted beat to the last result minus ``tile.latency``). Baseline: peak, one beat
   (one group-column per lane) per cycle. Target >= 0.99.
2. **Golden bit-exact GEMM** -- :func:`elmoe3d.sw.datapath.gemm` against float32 ``np.matmul``
   on the same ``[M, K] x [K, N]`` shape, as a throughput ratio (``t_matmul / t_gemm``), with
   the weight-stationary operand prepared (what the hardware does: weights are laid out once)
   and cold (preparation included). Median of repeated timings. Target >= 0.25.
3. **Simulation speed** -- simulated cycles per second of the cocotb bench during the
   throughput run, beside the same simulator with only the clock running (no stream traffic).

Columns of figure 2: *np.matmul f32* is the baseline's time per call; *gemm prepared* is
``gemm`` with the weight layout cached (the hardware lays weights out once and reuses them);
*gemm cold* includes preparing it; *ratio* = np.matmul time / gemm time (100% would be as fast
as float32 np.matmul; higher is faster).

Exit status: 0 when every target is met and the RTL results are bit-exact; 1 when a target is
missed or a result mismatched (the last lines say which); 2 on a usage or setup error or a
failed simulation (one line naming the log).
"""

from __future__ import annotations

import re
import statistics
import time

import numpy as np

from ..errors import UserError
from ..outputs import check_output, write_json


#: (label, M, K, N, weight): MiniLM FFN shapes, prefill (256 tokens) and a decode batch.
GEMM_SHAPES = (
    ("MiniLM up-proj, 256 tokens", 256, 384, 1536, "up"),
    ("MiniLM up-proj, decode batch 16", 16, 384, 1536, "up"),
    ("MiniLM down-proj, 256 tokens", 256, 1536, 384, "down"),
)
THROUGHPUT_TARGET = 0.99
GOLDEN_TARGET = 0.25


def configure(parser):
    parser.add_argument("--config", default="small", metavar="NAME",
                        help="configuration preset for the RTL figures (default: small; only "
                             "small is simulated for now)")
    parser.add_argument("--seed", type=int, default=None,
                        help="random seed (default: $ELMOE3D_SEED, else a fixed seed)")
    parser.add_argument("--repeats", type=int, default=7,
                        help="timed repetitions per golden GEMM figure (median; default 7)")
    parser.add_argument("--beats", type=int, default=4096,
                        help="minimum length of the RTL throughput GEMM in beats "
                             "(default 4096)")
    parser.add_argument("--json", metavar="OUT", default=None,
                        help="write the figures to OUT (JSON; checked before the run, written "
                             "only when it completes)")


def median_time(fn, repeats: int, min_seconds: float = 0.05) -> float:
    """Median over ``repeats`` samples of the seconds per call of ``fn``; each sample loops
    until ``min_seconds`` have passed. One untimed warm-up call first."""
    fn()
    samples = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        samples.append(elapsed / calls)
    return statistics.median(samples)


def _operands(seed):
    """Real MiniLM layer-0 FFN weights and activations when installed, else random ones.
    Returns (source, {"up": w, "down": w}, {"up": x, "down": x})."""
    from ..sw.minilm import ffn_activations, ffn_weights, minilm_path
    from ..sw.corpus import gsm8k_prompts
    from .bench_tile import default_traces
    traces = default_traces()
    if minilm_path() is not None and traces.is_file():
        up, down = ffn_weights(0)
        ffn_in, ffn_mid = ffn_activations(gsm8k_prompts(traces), 0)
        return ("real MiniLM layer-0 weights and activations", {"up": up, "down": down},
                {"up": ffn_in, "down": ffn_mid})
    rng = np.random.default_rng(seed)
    return ("random weights and activations (MiniLM not installed)",
            {"up": rng.standard_normal((1536, 384)) * 0.05,
             "down": rng.standard_normal((384, 1536)) * 0.05},
            {"up": rng.standard_normal((300, 384)), "down": rng.standard_normal((300, 1536))})


def golden_figures(seed, repeats):
    from ..sw.datapath import Mode, gemm
    from ..sw.quant import QuantizedWeight, quantize_activations, quantize_weights
    source, weights, acts = _operands(seed)
    out = []
    for label, m, k, n, which in GEMM_SHAPES:
        w = weights[which]
        assert w.shape == (n, k), (label, w.shape)
        x = np.resize(acts[which], (m, k))            # repeat real tokens up to M rows
        a_q = quantize_activations(x).q
        qw = quantize_weights(w, name=which)
        a32 = np.ascontiguousarray(a_q.astype(np.float32))
        w32 = np.ascontiguousarray(np.asarray(w, np.float32).T)        # [K, N]
        t_matmul = median_time(lambda: np.matmul(a32, w32), repeats)
        gemm(a_q, qw, Mode.FULL)                       # prepare the weight-stationary operand
        t_prepared = median_time(lambda: gemm(a_q, qw, Mode.FULL), repeats)

        def cold():
            fresh = QuantizedWeight(q=qw.q, scale=qw.scale, bits=qw.bits, name=qw.name)
            return gemm(a_q, fresh, Mode.FULL)
        t_cold = median_time(cold, repeats)
        macs = m * k * n
        out.append({"label": label, "M": m, "K": k, "N": n, "source": source,
                    "matmul_f32_s": t_matmul, "gemm_prepared_s": t_prepared,
                    "gemm_cold_s": t_cold, "ratio_prepared": t_matmul / t_prepared,
                    "ratio_cold": t_matmul / t_cold,
                    "matmul_gmacs": macs / t_matmul / 1e9,
                    "gemm_prepared_gmacs": macs / t_prepared / 1e9})
    return out


def rtl_figures(cfg, seed, beats):
    from .bench_tile import run_tile_bench
    res = run_tile_bench(cfg, tests=("test_throughput", "test_clock_rate"), seed=seed,
                         params={"throughput_beats": beats})
    thr = next(r for r in res.records if r["case"] == "throughput")
    clk = next(r for r in res.records if r["case"] == "clock only")
    return {"rows": cfg.rows, "lanes": cfg.lanes, "beats": thr["beats"], "cycles": thr["cycles"],
            "latency": thr["latency"], "first_accept": thr["first_accept"],
            "last_result": thr["last_result"], "fraction": thr["fraction"],
            "comparisons": thr["comparisons"], "mismatches": thr["mismatches"],
            "sim_cycles_per_s": thr["cycles_per_second"],
            "clock_only_cycles_per_s": clk["cycles_per_second"],
            "seed": res.sim.seed, "log": str(res.sim.log_file)}


#: Caption of the golden-GEMM table: what its columns mean.
GOLDEN_COLUMNS = ("prepared: gemm with the weight layout cached (the hardware lays weights out "
                  "once); cold: including that preparation; ratio: np.matmul time / gemm time "
                  "(higher is faster)")


def _one_line(exc) -> str:
    """A simulation error or failure as one line: its first line, plus the log it names."""
    text = str(exc)
    first = text.splitlines()[0].rstrip(":; ") if text else type(exc).__name__
    logs = re.findall(r"\blog (\S+?\.log)\b", text)
    if logs and logs[-1] not in first:
        first += f" (log {logs[-1]})"
    return first


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from .main import sim_config
    from .runner import SimulationError, SimulationFailure, resolve_seed

    arch = sim_config(args.config)
    if args.repeats < 1 or args.beats < 1:
        raise UserError("--repeats and --beats must be positive")
    if args.json:
        check_output(args.json, "--json")
    console = Console(highlight=False)
    if not console.is_terminal:            # logs and pipes: wide enough for the tables
        console.width = max(console.width, 120)
    seed = resolve_seed(args.seed)
    cfg = arch.tile
    console.print(f"elmoe3d bench: config {arch.name}, seed {seed}")

    console.print(f"[1/3] RTL throughput of the {cfg.rows}x{cfg.lanes}x{cfg.group} tile "
                  f"(cocotb + Verilator) ...")
    try:
        rtl = rtl_figures(cfg, seed, args.beats)
    except (SimulationError, SimulationFailure) as exc:
        raise UserError(f"RTL throughput bench: {_one_line(exc)}") from None
    console.print("[2/3] golden GEMM vs float32 np.matmul ...")
    golden = golden_figures(seed, args.repeats)
    console.print("[3/3] simulation speed (measured during 1)")
    console.print()

    missed = []
    ok_thr = rtl["fraction"] >= THROUGHPUT_TARGET and rtl["mismatches"] == 0
    if rtl["fraction"] < THROUGHPUT_TARGET:
        missed.append(f"1. tile throughput {rtl['fraction']:.4f} of peak < target "
                      f"{THROUGHPUT_TARGET}")
    if rtl["mismatches"]:
        missed.append(f"1. {rtl['mismatches']} mismatching RTL result value(s) (log "
                      f"{rtl['log']})")
    console.print(f"[bold]1. Tile throughput (RTL)[/]: {rtl['beats']:,} beats accepted, first "
                  f"accept at cycle {rtl['first_accept']}, last result at cycle "
                  f"{rtl['last_result']}, latency {rtl['latency']} (tile.latency) -> "
                  f"[bold]{rtl['fraction']:.4f}[/] of peak (baseline: peak = 1 beat = one "
                  f"group-column per lane per cycle); target >= {THROUGHPUT_TARGET}: "
                  f"{'[green]met[/]' if ok_thr else '[red]MISSED[/]'}; results bit-exact: "
                  f"{rtl['comparisons']:,} values, {rtl['mismatches']} mismatches")

    table = Table(title="2. Golden bit-exact GEMM vs float32 np.matmul (median of "
                        f"{args.repeats}; {golden[0]['source']})", title_justify="left",
                  caption=GOLDEN_COLUMNS, caption_justify="left")
    for col in ("shape", "M x K x N", "np.matmul f32", "gemm prepared", "ratio",
                "gemm cold", "ratio cold"):
        table.add_column(col, justify="left" if col == "shape" else "right")
    for g in golden:
        if g["ratio_prepared"] < GOLDEN_TARGET:
            missed.append(f"2. golden GEMM {g['label']}: prepared ratio "
                          f"{g['ratio_prepared']:.1%} < target {GOLDEN_TARGET:.0%}")
        table.add_row(g["label"], f"{g['M']}x{g['K']}x{g['N']}",
                      f"{g['matmul_f32_s'] * 1e3:.3f} ms", f"{g['gemm_prepared_s'] * 1e3:.3f} ms",
                      f"{g['ratio_prepared']:.1%}", f"{g['gemm_cold_s'] * 1e3:.3f} ms",
                      f"{g['ratio_cold']:.1%}")
    ok_gold = all(g["ratio_prepared"] >= GOLDEN_TARGET for g in golden)
    console.print(table)
    console.print(f"   target: prepared ratio >= {GOLDEN_TARGET:.0%} on every shape: "
                  f"{'[green]met[/]' if ok_gold else '[red]MISSED[/]'}")
    console.print(f"[bold]3. Simulation speed[/]: {rtl['sim_cycles_per_s']:,.0f} simulated "
                  f"cycles/s with stream traffic (source, sink, monitor coroutines); baseline "
                  f"{rtl['clock_only_cycles_per_s']:,.0f} cycles/s with only the clock running "
                  f"({rtl['sim_cycles_per_s'] / rtl['clock_only_cycles_per_s']:.0%})")
    if args.json:
        write_json(args.json, {"config": arch.name, "seed": seed, "rtl": rtl, "golden": golden,
                               "targets": {"throughput": THROUGHPUT_TARGET,
                                           "golden": GOLDEN_TARGET},
                               "missed": missed})
    if missed:
        for line in missed:
            console.print(f"[bold red]missed[/]: {escape(line)}")
        console.print(f"[bold red]elmoe3d bench: {len(missed)} target(s) missed[/] (exit 1)")
        return 1
    console.print("[bold green]elmoe3d bench: every target met[/]")
    return 0

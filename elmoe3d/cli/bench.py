"""``elmoe3d bench`` (what ``make bench`` runs): the benchmark figures, each beside a baseline
measured in the same run (design brief section 6; tests never time anything, this command does).

1. **Tile throughput in RTL simulation** -- the cocotb bench's ``test_throughput``: a long FULL
   GEMM with an always-valid source and an always-ready sink; accepted beats / (cycles from the
   first accepted beat to the last result minus ``tile.latency``). Baseline: peak, one beat
   (one group-column per lane) per cycle. Target >= 0.99.
2. **Golden bit-exact GEMM** -- :func:`elmoe3d.sw.golden.datapath.gemm` against float32 ``np.matmul``
   on the same ``[M, K] x [K, N]`` shape, as a throughput ratio (``t_matmul / t_gemm``), with
   the weight-stationary operand prepared (what the hardware does: weights are laid out once)
   and cold (preparation included). Median of repeated timings. Target >= 0.25.
3. **Simulation speed** -- simulated cycles per second of the cocotb bench during the
   throughput run, beside the same simulator with only the clock running (no stream traffic).
4. **PE cycles against the HB roofline** -- the PE bench's ``test_hb_roofline``
   (:mod:`elmoe3d.sim.bench_pe`), for batches of :data:`ROOFLINE_BATCHES` tokens, DRAFT and
   FULL: a MoE layer (the experts the real Mixtral trace routes the batch to, synthetic
   weights, back to back in one program) and one expert over all the tokens; the ``ld`` stream
   paced at the HB bank rate (``hb_bank_gbps / clock_ghz`` = 51.2 B per cycle at 1 GHz) by a
   token bucket, outputs always ready, results checked bit for bit against fsim and
   ``ref_moe``. Roofline cycles = max(ld bytes / 51.2, tile beats at one per cycle); figure =
   roofline cycles / measured cycles (first command accepted to last output taken). Target
   >= 0.95 on every case.
5. **PE-array utilization on a compute-bound batch** -- from the same runs, the cases of
   :data:`UTILIZATION_BATCH` tokens (compute-bound): useful MACs (3 H I per routed token and
   expert) / (peak MACs per cycle of the tile at the mode's weight width x measured cycles),
   and tile beats / measured cycles. No target of its own: on a compute-bound batch the
   roofline of figure 4 is the compute roofline, so its target covers this figure.
6. **Accuracy of the expert** (golden model, no RTL) -- cosine similarity and SQNR of the
   DRAFT and FULL golden expert (:func:`elmoe3d.sw.golden.expert.expert_accuracy`) against the
   float64 reference on real weights and activations. MiniLM's FFN is GELU with no gate, so
   the "expert" is ``encoder.layer.L.intermediate.dense`` as up, ``encoder.layer.L+1
   .intermediate.dense`` as gate and ``encoder.layer.L.output.dense`` as down (L =
   :data:`ACCURACY_LAYER`, biases dropped), on the real inputs of layer L's FFN for the GSM8K
   prompts. Reported, no target.
7. **DRAM controllers** (:mod:`elmoe3d.sim.bench_dram`) -- the HB bank controller and the
   LPDDR5 controller driving the behavioural device models, which check every timing
   constraint (a violation fails the run): streaming-read efficiency = bytes delivered / (peak
   bytes per cycle x cycles). Targets: HB >= 97% of 51.2 GB/s per bank, LPDDR5 >= 99% of
   102.4 GB/s; the random-row runs report the row-conflict loss (no target).
8. **Streamline ring and aggregation link** (:mod:`elmoe3d.sim.bench_ring`,
   :mod:`elmoe3d.sim.bench_agg_link`) -- throughput on long streaming transfers (always-valid
   sources, always-ready sinks) as a fraction of 128 B/cycle (ring) and 32 B/cycle per port
   (link), every word checked against :mod:`elmoe3d.sw.golden.ring` and
   :mod:`elmoe3d.sw.golden.agg_link`. Target >= 0.99 of the rate (multicast: of the PE-side
   bound).
9. **Logic die** (:mod:`elmoe3d.sim.bench_die`) -- the die bench's MoE layers (real Mixtral
   routing, batches of 1, 4 and 16 tokens, draft and verify, smooth traffic): cycles, HB and
   EXT bytes per cycle against their peaks, link bytes, and the verify-phase overlap = the
   fraction of the psum exchange (BYPASS / REDUCE_ADD link descriptors, first flit to last
   word) inside the LSB-fetch window (first to last EXT word the ring delivers to the
   group), measured cycle by cycle from the die's ``probe`` output, with the exposed
   exchange cycles and their share of the layer (:func:`elmoe3d.sim.bench_die
   .exchange_figures`). The overlap is reported beside the paper's goal of 1.0 (Section 5.2),
   not judged; targets: every output bit-exact (``run_group`` and ``ref_moe``), zero DRAM
   timing violations.

10. **Real expert shapes on the mid PE** -- the PE bench's ``test_real_expert``
   (:mod:`elmoe3d.sim.bench_pe`) on the ``mid`` preset (the paper PE's 32 KB WMEM / 32 KB
   IOMEM, 4x8x32 tile): one expert of each SwiGLU model preset (:func:`real_shapes`; H x I of
   the preset, synthetic weights) over :data:`REAL_TOKENS` tokens (GPT-OSS-20B: 1,
   :data:`REAL_SHAPE_TOKENS`), DRAFT and FULL, through the streamed expert program (two passes
   over up/gate with ``max_keep`` where h does not fit HBUF, x streamed where it does not fit
   ACT beside the h codes), the ``ld`` stream at the HB bank rate; per case the passes, whether
   x streams, cycles, the roofline fraction of figure 4 (all ld bytes) and with only the
   weight bytes in the memory term, the bit-exact comparisons against fsim and ``ref_moe``
   and the wall time. Mixtral-8x7B, which the builder refuses on mid (:data:`REAL_REFUSED`),
   is a row with the builder's error. Reported, no roofline target; mismatches and other
   refusals fail. Skipped with ``--skip-real``; alone (with 11) with ``--only-real``.
11. **Tile MACs per cycle** (:func:`peak_mac_figures`) -- useful MACs per cycle against Table 1's
   per-PE peak (W4A8: rows x lanes x group; W8A8: half), the ``ld`` stream at the port's full
   rate (one word a cycle) so HB does not bound it, one full row block of tokens: on the ``mid``
   RTL (:data:`PEAK_SHAPES`, bit-exact) and, from the cycle model, the paper PE's root program
   of an OLMoE-1B-7B expert split over a 4-PE group (at the full and the HB rate). Reported, no
   target; mismatches fail. With figure 10 under ``--skip-real`` / ``--only-real``.

12. **Performance-model speed** -- :func:`elmoe3d.sw.host.paper_eval.model_speed`.
13. **Sweep scaling** (:func:`sweep_figures`, ``elmoe3d sweep``, ``docs/sweep.md``) -- a
   perf-model sweep of :data:`SWEEP_POINTS` points (:data:`SWEEP_SPEC`) run in this process,
   then on an embedded Dask ``LocalCluster`` of 1 and of 2 worker processes, in the same run:
   points per second of each (from the first task submitted to the last row written, the
   cluster's start and the workers' imports excluded), the scaling efficiency ``rate2 / (2 x
   rate1)``, and every row of both Dask runs compared with the serial run's (the columns that
   say where and when a point ran left out). Target: identical results; the rates and the
   efficiency are reported. Alone with ``--only-sweep``.

Columns of figure 2: *np.matmul f32* is the baseline's time per call; *gemm prepared* is
``gemm`` with the weight layout cached (the hardware lays weights out once and reuses them);
*gemm cold* includes preparing it; *ratio* = np.matmul time / gemm time (100% would be as fast
as float32 np.matmul; higher is faster), the median of the rounds' ratios (each round times the
three in turn), so under a varying load it may differ from the ratio of the printed medians.
Both run with BLAS on one thread (threadpoolctl).

Exit status: 0 when every target is met and the RTL results are bit-exact; 1 when a target is
missed or a result mismatched (the last lines say which); 2 on a usage or setup error or a
failed simulation (one line naming the log).
"""

from __future__ import annotations

import functools
import re
import statistics
import time

import numpy as np

from ..errors import UserError
from . import fill_defaults, given_options, seed_type
from .outputs import output_path, check_output, write_json
from .sim import SIM_CONFIGS, add_config_option


#: The registry of the figures, in the order they are numbered, run and printed: (key, short
#: title). ``elmoe3d bench --help``, the step count and the figure numbers in the options' help
#: are derived from it; the module docstring defines each (a test holds the two to the same
#: titles and count).
FIGURES = (
    ("throughput", "Tile throughput in RTL simulation"),
    ("golden", "Golden bit-exact GEMM"),
    ("sim-speed", "Simulation speed"),
    ("roofline", "PE cycles against the HB roofline"),
    ("utilization", "PE-array utilization on a compute-bound batch"),
    ("accuracy", "Accuracy of the expert"),
    ("dram", "DRAM controllers"),
    ("links", "Streamline ring and aggregation link"),
    ("die", "Logic die"),
    ("real", "Real expert shapes on the mid PE"),
    ("peak", "Tile MACs per cycle"),
    ("model-speed", "Performance-model speed"),
    ("sweep", "Sweep scaling"),
)


def figure_number(key: str) -> int:
    """The number of figure ``key`` of :data:`FIGURES` (1-based)."""
    return [k for k, _ in FIGURES].index(key) + 1


def _steps(*keys) -> str:
    """The step label of the figures ``keys``: ``"10"``, ``"10-11"`` (consecutive) or
    ``"10, 12"``."""
    nums = sorted(figure_number(k) for k in keys)
    if len(nums) > 1 and nums == list(range(nums[0], nums[-1] + 1)):
        return f"{nums[0]}-{nums[-1]}"
    return ", ".join(map(str, nums))


def _figure_list(*keys) -> str:
    """``"10 and 11"`` for the figures ``keys``."""
    nums = [str(figure_number(k)) for k in keys]
    return nums[0] if len(nums) == 1 else f"{', '.join(nums[:-1])} and {nums[-1]}"


def description() -> str:
    """``elmoe3d bench --help``'s description: every figure of :data:`FIGURES`, numbered."""
    return (f"the {len(FIGURES)} benchmark figures, each beside a baseline measured in the same "
            f"run: " + "; ".join(f"{i}. {title}" for i, (_, title) in
                                 enumerate(FIGURES, 1)) + ".")


#: (label, M, K, N, weight): MiniLM FFN shapes, prefill (256 tokens) and a decode batch.
GEMM_SHAPES = (
    ("MiniLM up-proj, 256 tokens", 256, 384, 1536, "up"),
    ("MiniLM up-proj, decode batch 16", 16, 384, 1536, "up"),
    ("MiniLM down-proj, 256 tokens", 256, 1536, 384, "down"),
)
THROUGHPUT_TARGET = 0.99
GOLDEN_TARGET = 0.25
#: Figure 4: cycles per expert on the PE as a fraction of the HB roofline, on every case.
ROOFLINE_TARGET = 0.95
#: Figure 4: batch sizes (tokens) of the HB-rate runs: one decode token (memory-bound) and the
#: compute-bound batch of figure 5.
ROOFLINE_BATCHES = (1, 16)
#: Figure 5: the compute-bound batch whose PE-array utilization is reported.
UTILIZATION_BATCH = 16
#: Figure 10: tokens per case, modes, and the tokens of shapes that run fewer: GPT-OSS-20B
#: (H = I = 2880, two passes over up/gate and x streamed) at 16 tokens would take longer in
#: Verilator than the rest of the figure together (:data:`REAL_NOTE`).
REAL_TOKENS = (1, 16)
REAL_MODES = ("DRAFT", "FULL")
REAL_SHAPE_TOKENS = {"gpt-oss-20b": (1,)}
#: Figure 10: shapes the streamed expert builder refuses on the mid PE, with the text its
#: one-line error names (a row of the figure; any other refusal is a failure).
REAL_REFUSED = {"mixtral-8x7b": "ACT overflows"}
REAL_NOTE = ("GPT-OSS-20B at 1 token only: at 16 tokens (four token tiles, x streamed) its "
             "DRAFT run alone is 3.1 million cycles (measured 2026-12-01: bit-exact, 18 "
             "minutes in Verilator), FULL 4.8 million by the cycle model")
#: Figure 11: the shapes whose tile MACs per cycle are measured on the mid RTL, and the shape
#: of the paper PE's row (cycle model; the RTL run is ``make sim-paper-pe``).
PEAK_SHAPES = ("qwen3-30b-a3b", "olmoe-1b-7b")
PAPER_PEAK_SHAPE = "olmoe-1b-7b"
#: Figure 13: the sweep spec whose points per second are measured: 4 models x 4 batches x 3
#: schemes x 4 PE counts x 2 HB bank sizes on paper-4gb = 384 perf-model points.
SWEEP_SPEC = {
    "name": "bench-figure-13", "seed": 13, "base": "paper-4gb",
    "config": {"pes": [8, 16, 32, 64], "hb_bank_bytes": [128 << 20, 256 << 20]},
    "workload": {"model": ["qwen3-30b-a3b", "glm-4.7-flash", "deepseek-v2-lite",
                           "gpt-oss-20b"],
                 "batch": [1, 4, 8, 16], "scheme": ["ar", "elastic", "eagle"]}}
SWEEP_POINTS = 384
#: Figure 13: the local worker counts measured.
SWEEP_WORKERS = (1, 2)
#: Figure 6: MiniLM layer L whose FFN (with layer L+1's up-projection as the gate) is the expert.
ACCURACY_LAYER = 0


#: Defaults of ``--repeats`` and ``--beats`` (None on the command line, so that one given to a run
#: that reads neither is refused, see :data:`UNREAD_OPTIONS`).
DEFAULT_REPEATS = 7
DEFAULT_BEATS = 4096
#: The options a run of only some figures reads none of, and why: given, they are refused, not
#: dropped.
UNREAD_OPTIONS = {
    "only_sweep": (("config", "seed", "repeats", "beats", "skip_real"),
                   "the sweep figure runs its own spec, with its own seed"),
    "only_real": (("config", "repeats", "beats"),
                  "the real-shape figures run the mid PE and no golden or throughput GEMM"),
    "only_speed": (("config", "seed", "repeats", "beats", "skip_real"),
                   "the model-speed figure times the performance models on their own presets")}


#: Figure 12's step line.
SPEED_WHAT = "whole-decoder performance model: simulated tokens per second (one core)"


def configure(parser):
    parser.description = description()
    real = _figure_list("real", "peak")
    add_config_option(parser, "for the RTL figures", default=None)
    parser.add_argument("--seed", type=seed_type, default=None,
                        help="random seed (default: $ELMOE3D_SEED, else a fixed seed)")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"timed repetitions per golden GEMM figure (median; default "
                             f"{DEFAULT_REPEATS})")
    parser.add_argument("--beats", type=int, default=None,
                        help=f"minimum length of the RTL throughput GEMM in beats "
                             f"(default {DEFAULT_BEATS})")
    parser.add_argument("--skip-real", action="store_true",
                        help=f"skip figures {real} (real expert shapes and tile MACs per cycle "
                             f"on the mid PE)")
    parser.add_argument("--only-real", action="store_true",
                        help=f"run only figures {real} (real expert shapes and tile MACs per "
                             f"cycle on the mid PE)")
    parser.add_argument("--only-sweep", action="store_true",
                        help=f"run only figure {figure_number('sweep')} (sweep points per "
                             f"second on 1 and 2 local Dask workers)")
    parser.add_argument("--only-speed", action="store_true",
                        help=f"run only figure {figure_number('model-speed')} (simulated tokens "
                             f"per second of the performance models, one core)")
    parser.add_argument("--json", metavar="OUT", type=output_path, default=None,
                        help="write the figures to OUT (JSON; checked before the run, written "
                             "only when it completes)")


#: The longest RTL throughput GEMM ``--beats`` asks for: a million beats is hours of cocotb
#: simulation already (the default is 4,096), and the bench holds the GEMM's operands, results
#: and golden values in memory, which far longer ones exhaust (10^10 asked for 1.16 TiB).
MAX_BEATS = 1 << 20


def interleaved_times(fns, repeats: int, min_seconds: float = 0.05) -> list:
    """Seconds per call of each of ``fns``: ``repeats`` samples each, taken in turn (one
    sample of every function, then the next round), so that a load on the machine that comes
    and goes falls on all of them alike. Each sample loops until ``min_seconds`` have passed;
    one untimed warm-up call of each first. Returns one list of ``repeats`` samples per
    function."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, samples):
            calls, start = 0, time.perf_counter()
            while True:
                fn()
                calls += 1
                elapsed = time.perf_counter() - start
                if elapsed >= min_seconds:
                    break
            out.append(elapsed / calls)
    return samples


def paired_ratio(base, ours) -> float:
    """Median over rounds of ``base / ours`` from :func:`interleaved_times`' samples of the
    same rounds: the baseline measured in the same moment as ours."""
    return statistics.median(b / o for b, o in zip(base, ours))


@functools.lru_cache(maxsize=None)
def _minilm_ffn_inputs(layer):
    """``(prompts, ffn_in, ffn_mid)``: the real inputs of MiniLM layer ``layer``'s FFN for the
    GSM8K prompts (computed once per process; figures 2 and 6 share them)."""
    from ..sw.host.minilm import ffn_activations
    from ..sw.host.corpus import gsm8k_prompts
    from ..sim.bench_tile import default_traces
    prompts = gsm8k_prompts(default_traces())
    ffn_in, ffn_mid = ffn_activations(prompts, layer)
    return len(prompts), ffn_in, ffn_mid


def _operands(seed):
    """Real MiniLM layer-0 FFN weights and activations when installed, else random ones.
    Returns (source, {"up": w, "down": w}, {"up": x, "down": x})."""
    from ..sw.host.minilm import ffn_weights, minilm_path
    from ..sim.bench_tile import default_traces
    traces = default_traces()
    if minilm_path() is not None and traces.is_file():
        up, down = ffn_weights(0)
        _, ffn_in, ffn_mid = _minilm_ffn_inputs(0)
        return ("real MiniLM layer-0 weights and activations", {"up": up, "down": down},
                {"up": ffn_in, "down": ffn_mid})
    rng = np.random.default_rng(seed)
    return ("random weights and activations (MiniLM not installed)",
            {"up": rng.standard_normal((1536, 384)) * 0.05,
             "down": rng.standard_normal((384, 1536)) * 0.05},
            {"up": rng.standard_normal((300, 384)), "down": rng.standard_normal((300, 1536))})


def _one_blas_thread():
    """A ``with`` in which NumPy's BLAS runs on one thread (threadpoolctl): figure 2's baseline
    and the golden GEMM (whose products are BLAS float64 matmuls) alike. With the machine's
    threads a loaded 2-core machine made one baseline's rounds swing 10x (a new user's run,
    2026-12-07), and the paired ratio and the printed medians told different stories."""
    return _threadpoolctl().threadpool_limits(limits=1, user_api="blas")


def _threadpoolctl():
    """The ``threadpoolctl`` module, or :class:`UserError` saying how to install it (checked
    before figure 1 runs when figure 2 will)."""
    try:
        import threadpoolctl
    except ImportError:
        raise UserError("elmoe3d bench needs threadpoolctl (figure 2 pins BLAS to one thread): "
                        "pip install -e '.[dev]' (make venv installs it)") from None
    return threadpoolctl


def golden_figures(seed, repeats):
    from ..sw.golden.datapath import Mode, gemm
    from ..sw.golden.quant import QuantizedWeight, quantize_activations, quantize_weights
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
        gemm(a_q, qw, Mode.FULL)                       # prepare the weight-stationary operand

        def cold():
            fresh = QuantizedWeight(q=qw.q, scale=qw.scale, bits=qw.bits, name=qw.name)
            return gemm(a_q, fresh, Mode.FULL)
        with _one_blas_thread():
            base, prepared, fresh = interleaved_times(
                (lambda: np.matmul(a32, w32), lambda: gemm(a_q, qw, Mode.FULL), cold), repeats)
        t_matmul, t_prepared, t_cold = (statistics.median(t) for t in (base, prepared, fresh))
        macs = m * k * n
        out.append({"label": label, "M": m, "K": k, "N": n, "source": source,
                    "matmul_f32_s": t_matmul, "gemm_prepared_s": t_prepared,
                    "gemm_cold_s": t_cold, "ratio_prepared": paired_ratio(base, prepared),
                    "ratio_cold": paired_ratio(base, fresh),
                    "matmul_gmacs": macs / t_matmul / 1e9,
                    "gemm_prepared_gmacs": macs / t_prepared / 1e9})
    return out


def rtl_figures(cfg, seed, beats):
    from ..sim.bench_tile import run_tile_bench
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


def pe_figures(arch, seed):
    """Figures 4 and 5 from one run of the PE bench's ``test_hb_roofline`` (its records carry
    the roofline and utilization figures, :func:`elmoe3d.sim.bench_pe.roofline_figures`).

    Returns ``{"cases": [...], "utilization": [...], "failures": [...], "log", "seed"}``:
    per case (kind x batch x mode) the record's cycles, bytes, beats, roofline and
    utilization fields; ``utilization`` holds the compute-bound cases of
    :data:`UTILIZATION_BATCH` tokens; failures are recorded failing cases (a mismatch, an
    aborted test) and failed cocotb tests, one line each."""
    from ..sim.bench_pe import run_pe_bench
    res = run_pe_bench(arch, tests="test_hb_roofline", seed=seed, check=False,
                       params={"roofline_batches": list(ROOFLINE_BATCHES)})
    keys = ("case", "kind", "mode", "tokens", "hidden", "intermediate", "experts_run",
            "cycles", "gemm_beats", "weight_bytes", "ld_bytes", "hb_bytes_per_cycle",
            "memory_cycles", "roofline_cycles", "roofline_bound", "roofline_fraction",
            "roofline_fraction_weights", "beat_utilization", "mac_utilization", "useful_macs",
            "peak_macs_per_cycle", "weight_bits", "comparisons", "mismatches")
    cases, failures = [], []
    for rec in res.records:
        if rec.get("mismatches") or "roofline_fraction" not in rec:
            failures.append(f"{rec['case']} {rec.get('mode', '-')}: "
                            + (rec.get("error") or f"{rec['mismatches']} mismatching value(s)"))
        if "roofline_fraction" in rec:
            cases.append({k: rec.get(k) for k in keys})
    util = [c for c in cases if c["tokens"] == UTILIZATION_BATCH
            and c["roofline_bound"] == "compute" and c.get("mac_utilization") is not None]
    for tc in res.sim.testcases:
        if tc.status == "failed" and not failures:
            failures.append(f"{tc.name}: {tc.message.splitlines()[0] if tc.message else 'failed'}")
    if not res.sim.tests:
        failures.append("test_hb_roofline did not run")
    return {"cases": cases, "utilization": util, "failures": failures,
            "hb_bytes_per_cycle": arch.hb_bytes_per_cycle, "word_bytes": arch.pe.word_bytes,
            "seed": res.sim.seed, "log": str(res.sim.log_file)}


def real_shapes() -> tuple:
    """Figure 10's shapes: every SwiGLU model preset
    (:data:`~elmoe3d.sw.host.models.MODEL_PRESETS`, in its order)."""
    from ..sw.host.models import MODEL_PRESETS
    return tuple(name for name, p in MODEL_PRESETS.items() if p.ffn == "swiglu")


def real_expert_figures(seed, shapes=None, tokens=REAL_TOKENS, modes=REAL_MODES,
                        shape_tokens=REAL_SHAPE_TOKENS, ld_rate="hb"):
    """Figure 10: one run of the PE bench's ``test_real_expert`` on the ``mid`` preset over
    ``shapes`` (default :func:`real_shapes`), ``tokens`` (``shape_tokens[shape]`` where given)
    and ``modes``, the ``ld`` stream at ``ld_rate`` (:func:`elmoe3d.sim.bench_pe.ld_rate_words`;
    figure 11 runs it at ``"full"``). Returns ``{"cases": [...], "failures": [...], "log", "seed",
    "build_seconds", "run_seconds", "note"}`` (a case per shape x tokens x mode: the record's
    figures, with the program's ``passes`` and ``x_stream``; one case with ``refused`` for a
    shape the builder refuses: a failure unless :data:`REAL_REFUSED` expects it)."""
    from ..config import preset
    from ..sim.bench_pe import build_pe, run_pe_bench
    shapes = real_shapes() if shapes is None else tuple(shapes)
    arch = preset("mid")
    t0 = time.perf_counter()
    built = build_pe(arch)
    t1 = time.perf_counter()
    res = run_pe_bench(arch, tests="test_real_expert", seed=seed, check=False, built=built,
                       params={"real_shapes": list(shapes), "real_tokens": list(tokens),
                               "real_modes": list(modes),
                               "real_shape_tokens": {k: list(v) for k, v in
                                                     shape_tokens.items()},
                               "real_ld_rate": ld_rate})
    t2 = time.perf_counter()
    keys = ("case", "model", "mode", "tokens", "hidden", "intermediate", "passes",
            "x_stream", "max_keep_gemms", "cycles", "gemm_beats", "ld_bytes", "weight_bytes",
            "roofline_cycles", "roofline_bound", "roofline_fraction",
            "roofline_fraction_weights", "mac_utilization", "macs_per_cycle",
            "peak_macs_per_cycle", "weight_bits", "beat_utilization", "ld_bytes_per_cycle",
            "comparisons", "mismatches", "wall_seconds", "case_seconds", "refused")
    cases, failures = [], []
    for rec in res.records:
        if rec.get("refused"):
            want = REAL_REFUSED.get(rec.get("model"))
            if want is None or want not in rec["refused"]:
                failures.append(f"{rec['case']}: refused by the builder: {rec['refused']}")
        elif rec.get("mismatches") or "roofline_fraction" not in rec:
            failures.append(f"{rec['case']} {rec.get('mode', '-')}: "
                            + (rec.get("error") or f"{rec['mismatches']} mismatching value(s)"
                               + (f" ({rec['details'][0]})" if rec.get("details") else "")))
        cases.append({k: rec.get(k) for k in keys})
    for tc in res.sim.testcases:
        if tc.status == "failed" and not failures:
            failures.append(f"{tc.name}: {tc.message.splitlines()[0] if tc.message else 'failed'}")
    if not res.sim.tests:
        failures.append("test_real_expert did not run")
    note = REAL_NOTE if any(shape_tokens.get(s) for s in shapes) else ""
    return {"cases": cases, "failures": failures, "arch": arch.name,
            "hb_bytes_per_cycle": arch.hb_bytes_per_cycle, "word_bytes": arch.pe.word_bytes,
            "seed": res.sim.seed, "log": str(res.sim.log_file),
            "build_seconds": t1 - t0, "run_seconds": t2 - t1, "note": note}


def print_real(console, figs) -> list:
    """Print figure 10; return the failure lines (mismatches, failed runs)."""
    from rich.markup import escape
    from rich.table import Table
    table = Table(title=f"{figure_number('real')}. Real expert shapes on the {figs['arch']} PE "
                        f"(streamed expert program, synthetic weights, ld at "
                        f"{figs['hb_bytes_per_cycle']:g} B "
                        f"per cycle; build {figs['build_seconds']:.0f} s, run "
                        f"{figs['run_seconds']:.0f} s)", title_justify="left",
                  caption="passes: over up/gate (2: h does not fit HBUF; the second pass "
                          "keeps the row max, max_keep); x: resident in ACT or streamed a K "
                          "chunk per buffer-full; fraction: roofline cycles (all ld bytes) / "
                          "measured cycles; weights: the same with only the weight bytes in "
                          "the memory term; bit-exact: values compared against fsim and "
                          "ref_moe / mismatches; wall: the RTL run (the case with builder, "
                          "ref_moe and fsim)" + (f". {figs['note']}" if figs.get("note")
                                                 else ""),
                  caption_justify="left")
    for col in ("shape", "H x I", "tokens", "mode", "passes", "x", "cycles", "ld bytes",
                "beats", "bound", "fraction", "weights", "bit-exact", "wall"):
        table.add_column(col, justify="left" if col in ("shape", "mode", "x", "bound")
                         else "right")
    refused = []
    for c in figs["cases"]:
        shape = escape(str(c.get("model") or c["case"]))
        hxi = f"{c.get('hidden')}x{c.get('intermediate')}"
        if c.get("refused"):
            table.add_row(shape, hxi, "-", "-", "-", "-", "[yellow]refused[/]", *["-"] * 7)
            refused.append(f"{shape} ({hxi}): refused by the builder: "
                           f"{escape(str(c['refused']))}")
            continue
        frac = c.get("roofline_fraction")
        wfrac = c.get("roofline_fraction_weights")
        wall, case_s = c.get("wall_seconds"), c.get("case_seconds")
        table.add_row(shape, hxi, str(c.get("tokens")),
                      str(c.get("mode")), str(c.get("passes") or "-"),
                      "-" if c.get("x_stream") is None else
                      ("streamed" if c["x_stream"] else "resident"),
                      f"{c.get('cycles') or 0:,}",
                      f"{c.get('ld_bytes') or 0:,}", f"{c.get('gemm_beats') or 0:,}",
                      str(c.get("roofline_bound") or "-"),
                      f"{frac:.1%}" if frac is not None else "-",
                      f"{wfrac:.1%}" if wfrac is not None else "-",
                      f"{c.get('comparisons') or 0:,} / {c.get('mismatches')}"
                      if c.get("mismatches") == 0 else
                      f"[red]{c.get('comparisons') or 0:,} / {c.get('mismatches')}[/]",
                      "-" if wall is None else f"{wall:.0f} s" + (
                          "" if case_s is None else f" ({case_s:.0f} s)"))
    console.print(table)
    for line in refused:
        console.print(f"   {line}")
    n = figure_number("real")
    missed = [f"{n}. real expert shapes: {line} (log {figs['log']})" for line in figs["failures"]]
    if not figs["cases"]:
        missed.append(f"{n}. real expert shapes: no case measured")
    console.print("   reported, no roofline target; every case must be bit-exact")
    return missed


def peak_mac_figures(seed) -> dict:
    """Figure 11: the tile's MACs per cycle with the ``ld`` stream at the port's full rate (one
    word a cycle), on the largest decode batch one row block holds (``tile.rows`` tokens), beside
    Table 1's peak (rows x lanes x group MACs a cycle at W4A8, half at W8A8).

    * ``mid`` PE, RTL (cocotb + Verilator): figure 10's bench (:func:`real_expert_figures`) on
      :data:`PEAK_SHAPES`, ``ld_rate="full"``, bit-exact;
    * paper PE (``paper-4gb``), cycle model (:func:`elmoe3d.sw.host.pe_cycles.program_cycles`,
      equal to the RTL's cycles on the paper PE's runs): the root PE's program of an OLMoE-1B-7B
      expert split over a 4-PE group (:func:`elmoe3d.sw.host.stream_group.compile_expert_group`,
      what ``make sim-paper-pe`` runs on the RTL), 16 tokens, at the full rate and at the HB
      rate.

    Streamed expert programs use each weight word for one tile beat (x of more than one row
    block does not fit IOMEM beside h at these shapes), so no decode batch is compute-bound:
    the figure is the tile's ceiling with weights arriving as fast as the PE takes them.
    Returns ``{"mid": <real_expert_figures>, "paper": [rows], "paper_arch", "table1_tops":
    {"W4A8", "W8A8"}}`` (a paper row: the model's cycles and beats with the figures of
    :func:`elmoe3d.sim.bench_pe.roofline_figures`)."""
    from ..config import preset
    from ..sim.bench_pe import ld_rate_words, real_expert_weights, roofline_figures
    from ..sw.golden.datapath import Mode
    from ..sw.host.models import MODEL_PRESETS
    from ..sw.host.pe_cycles import program_cycles
    from ..sw.host.stream_group import compile_expert_group
    mid = real_expert_figures(seed, shapes=PEAK_SHAPES, tokens=(preset("mid").tile.rows,),
                              shape_tokens={}, ld_rate="full")
    arch = preset("paper-4gb")
    model = MODEL_PRESETS[PAPER_PEAK_SHAPE]
    hidden, inter, tokens = int(model.hidden), int(model.expert_intermediate), arch.tile.rows
    expert, x, gw = real_expert_weights(np.random.default_rng(seed), hidden, inter, tokens)
    rows = []
    for mode in (Mode.DRAFT, Mode.FULL):
        job = compile_expert_group(x, expert, gw, mode, arch)
        prog, ld = job.programs[job.root], job.ld[job.root]
        for rate_name in ("full", "hb"):
            rate = ld_rate_words(arch, rate_name)
            est = program_cycles(prog, ld_rate=rate, ld=ld)
            rec = {"model": PAPER_PEAK_SHAPE, "hidden": hidden, "intermediate": inter,
                   "tokens": tokens, "mode": mode.name, "ld_rate": rate_name, "pes": job.pes,
                   "cycles": est.cycles, "gemm_beats": est.beats, "ld_words": len(ld),
                   "ld_bytes": len(ld) * arch.pe.word_bytes, "weight_bytes": 0}
            rows.append(roofline_figures(rec, arch, tokens * 3 * hidden * inter // job.pes,
                                         ld_rate=rate))
    return {"mid": mid, "paper": rows, "paper_arch": arch.name,
            "table1_tops": {"W4A8": arch.peak_tops(4), "W8A8": arch.peak_tops(8)}}


def print_peak(console, figs) -> list:
    """Print figure 11; return the failure lines (mismatches, failed runs of the mid RTL)."""
    from rich.markup import escape
    from rich.table import Table
    n = figure_number("peak")
    table = Table(title=f"{n}. Tile MACs per cycle, one full row block of tokens, ld at the "
                        "port's full rate (a word a cycle; the paper PE also at the HB rate)",
                  title_justify="left",
                  caption="MACs/cycle: useful MACs (3 H I T; the root PE's share on the paper "
                          "group) / measured cycles; peak: Table 1's per-PE figure at the "
                          "mode's weight width (rows x lanes x group a cycle at W4A8, half at "
                          "W8A8); tile busy: GEMM beats / cycles. Each weight word feeds one "
                          "beat, so the ld port (weights, scales, x) bounds the tile; the "
                          "paper PE streams x through its 14 ACT words once per column "
                          "block. Synthetic weights in the real shapes.",
                  caption_justify="left")
    for col in ("PE", "source", "shape", "T", "mode", "ld", "cycles", "MACs/cycle", "peak",
                "of peak", "tile busy", "bit-exact"):
        table.add_column(col, justify="left" if col in ("PE", "source", "shape", "mode", "ld")
                         else "right")
    mid = figs["mid"]
    for c in mid["cases"]:
        if c.get("refused") or not c.get("cycles"):
            continue
        rate = c["ld_bytes_per_cycle"] / mid["word_bytes"]
        table.add_row(mid["arch"], "RTL", escape(str(c["model"])), str(c["tokens"]),
                      str(c["mode"]), "full" if rate == 1 else f"{rate:g} words/cycle",
                      f"{c['cycles']:,}", f"{c['macs_per_cycle']:,.0f}",
                      f"{c['peak_macs_per_cycle']:,}", f"{c['mac_utilization']:.1%}",
                      f"{c['beat_utilization']:.1%}",
                      f"{c['comparisons']:,} / {c['mismatches']}")
    for r in figs["paper"]:
        table.add_row(figs["paper_arch"], "cycle model", f"{r['model']} (root of {r['pes']})",
                      str(r["tokens"]), r["mode"], r["ld_rate"], f"{r['cycles']:,}",
                      f"{r['macs_per_cycle']:,.0f}", f"{r['peak_macs_per_cycle']:,}",
                      f"{r['mac_utilization']:.1%}", f"{r['beat_utilization']:.1%}", "-")
    console.print(table)
    tops = figs["table1_tops"]
    console.print(f"   Table 1 peak of the {figs['paper_arch']} die: {tops['W4A8']:.0f} TOPS "
                  f"W4A8, {tops['W8A8']:.0f} TOPS W8A8; reported, no target (the paper PE on "
                  f"the RTL: make sim-paper-pe PAPER_PE_ARGS='--tokens 16 --ld-rate hb,full')")
    missed = [f"{n}. tile MACs per cycle: {line} (log {mid['log']})" for line in mid["failures"]]
    if not any(c.get("cycles") for c in mid["cases"]):
        missed.append(f"{n}. tile MACs per cycle: no case measured on the mid RTL")
    return missed


def accuracy_figures(layer=ACCURACY_LAYER):
    """Figure 6: error metrics (mse, sqnr_db, cosine, max_abs) of the DRAFT and FULL golden
    expert against float64, MiniLM layer ``layer``'s up and down with layer ``layer + 1``'s
    up as the gate, on the real inputs of layer ``layer``'s FFN. Raises
    :class:`~elmoe3d.errors.UserError` when the weights or the prompts are missing."""
    from ..sw.golden.expert import expert_accuracy
    from ..sw.host.minilm import ffn_weights
    up, down = ffn_weights(layer)
    gate, _ = ffn_weights(layer + 1)
    prompts, x, _ = _minilm_ffn_inputs(layer)
    metrics = expert_accuracy(x, up, gate, down)
    name = "encoder.layer.{}.{}.dense.weight".format
    return {"layer": layer, "up": name(layer, "intermediate"),
            "gate": name(layer + 1, "intermediate"), "down": name(layer, "output"),
            "hidden": int(up.shape[1]), "intermediate": int(up.shape[0]),
            "tokens": int(x.shape[0]), "prompts": prompts,
            "activations": f"inputs of layer {layer}'s FFN (after the attention block's "
                           f"LayerNorm) for the GSM8K prompts",
            "draft": metrics["draft"], "full": metrics["full"]}


#: Definition of figure 4, printed under its table.
ROOFLINE_DEFINITION = (
    "roofline cycles = max(ld bytes / HB bytes per cycle, tile beats at one per cycle), ld "
    "bytes = everything the program loads (weight nibble planes and scales -- DRAFT: MSB "
    "planes only -- token tables, activations); figure = roofline cycles / measured cycles, "
    "from the first command accepted to the last output taken, the ld stream paced at the HB "
    "bank rate by a token bucket (holding at most two words), outputs always ready; "
    "'weights': the same figure with only the weight bytes in the memory term; MoE layer: the "
    "experts the real Mixtral trace routes the batch to (top-2 of 8), back to back in one "
    "program; one expert: all tokens through expert 0; synthetic expert weights; results "
    "bit-exact against fsim and ref_moe")


#: Caption of the golden-GEMM table: what its columns mean.
GOLDEN_COLUMNS = ("prepared: gemm with the weight layout cached (the hardware lays weights out "
                  "once); cold: including that preparation; ratio: np.matmul time / gemm time "
                  "(higher is faster)")


def dram_figures(arch, seed) -> dict:
    """Figure 7 (:func:`elmoe3d.sim.bench_dram.dram_figures`; imported here, not at start-up,
    as it imports cocotb)."""
    from ..sim.bench_dram import dram_figures as figures
    return figures(arch, seed)


def print_dram(console, figs) -> list:
    from ..sim.bench_dram import print_dram as show
    return show(console, figs, figure_number("dram"))


def link_figures(arch, seed) -> dict:
    """Figure 8: :func:`elmoe3d.sim.bench_agg_link.link_figures` and
    :func:`elmoe3d.sim.bench_ring.ring_figures` in one dict
    (:func:`elmoe3d.sim.cocotb_cycles.join_figures`)."""
    from ..sim.bench_agg_link import link_figures as link
    from ..sim.bench_ring import ring_figures as ring
    from ..sim.cocotb_cycles import join_figures
    return join_figures(link(arch, seed), ring(arch, seed))


def print_links(console, figs) -> list:
    """Figure 8's tables (link, then ring), then its failures; the missed-target lines."""
    from ..sim.bench_agg_link import print_link
    from ..sim.bench_ring import print_ring
    from ..sim.cocotb_cycles import failure_lines
    n = figure_number("links")
    return print_link(console, figs, n) + print_ring(console, figs, n) + failure_lines(figs,
                                                                                    "links")


def die_figures(arch, seed) -> dict:
    """Figure 9 (:func:`elmoe3d.sim.bench_die.die_figures`)."""
    from ..sim.bench_die import die_figures as figures
    return figures(arch, seed)


def print_die(console, figs) -> list:
    from ..sim.bench_die import print_die as show
    return show(console, figs, figure_number("die"))


def _one_line(exc) -> str:
    """A simulation error or failure as one line: its first line, plus the log it names."""
    text = str(exc)
    first = text.splitlines()[0].rstrip(":; ") if text else type(exc).__name__
    logs = re.findall(r"\blog (\S+?\.log)\b", text)
    if logs and logs[-1] not in first:
        first += f" (log {logs[-1]})"
    return first


def print_pe(console, pe) -> list:
    """Print figures 4 and 5; return the missed-target lines."""
    from rich.markup import escape
    from rich.table import Table
    missed = []
    n, nu = figure_number("roofline"), figure_number("utilization")
    hb = pe["hb_bytes_per_cycle"]
    shapes = sorted({(c["hidden"], c["intermediate"]) for c in pe["cases"]})
    table = Table(title=f"{n}. PE cycles / HB roofline (ld stream at {hb:g} B per cycle = "
                        f"{hb / pe['word_bytes']:g} words of {pe['word_bytes']} B; experts H x "
                        f"I = {', '.join(f'{h}x{i}' for h, i in shapes) or '-'})",
                  title_justify="left", caption=ROOFLINE_DEFINITION, caption_justify="left")
    for col in ("case", "mode", "ld bytes", "beats", "bound", "roofline", "cycles",
                "fraction", "weights", "target"):
        table.add_column(col, justify="left" if col in ("case", "mode", "bound", "target")
                         else "right", no_wrap=col == "case")
    for c in pe["cases"]:
        ok = c["roofline_fraction"] >= ROOFLINE_TARGET
        if not ok:
            missed.append(f"{n}. PE HB roofline, {c['case']} {c['mode']}: "
                          f"{c['roofline_fraction']:.1%} < target {ROOFLINE_TARGET:.0%}")
        weights = c.get("roofline_fraction_weights")
        table.add_row(escape(c["case"]), c["mode"], f"{c['ld_bytes']:,}",
                      f"{c['gemm_beats']:,}", c["roofline_bound"],
                      f"{c['roofline_cycles']:,.0f}", f"{c['cycles']:,}",
                      f"{c['roofline_fraction']:.1%}",
                      f"{weights:.1%}" if weights is not None else "-",
                      "[green]met[/]" if ok else "[red]MISSED[/]")
    console.print(table)
    if not pe["cases"]:
        missed.append(f"{n}. PE HB roofline: no case measured")
    for line in pe["failures"]:
        missed.append(f"{n}. PE HB-rate bench: {line} (log {pe['log']})")
    met = pe["cases"] and all(c["roofline_fraction"] >= ROOFLINE_TARGET for c in pe["cases"])
    console.print(f"   target: >= {ROOFLINE_TARGET:.0%} of the roofline on every case: "
                  f"{'[green]met[/]' if met else '[red]MISSED[/]'}")
    console.print(f"[bold]{nu}. PE-array utilization[/] on the compute-bound batch of "
                  f"{UTILIZATION_BATCH} tokens (same runs as {n}): MACs = useful multiply-"
                  f"accumulates (3 x H x I per routed token and expert, padding excluded) / "
                  f"(peak MACs per cycle of the tile at the mode's weight width x measured "
                  f"cycles); tile busy = tile beats / measured cycles")
    for u in pe["utilization"]:
        console.print(f"   {escape(u['case'])} {u['mode']}: MACs [bold]"
                      f"{u['mac_utilization']:.1%}[/] of peak ({u['useful_macs']:,} / "
                      f"({u['peak_macs_per_cycle']} per cycle at {u['weight_bits']}-bit weights "
                      f"x {u['cycles']:,} cycles)); tile busy {u['beat_utilization']:.1%}")
    if not pe["utilization"]:
        console.print("   [red]not measured[/]")
        missed.append(f"{nu}. PE-array utilization: no compute-bound case of "
                      f"{UTILIZATION_BATCH} tokens")
    console.print(f"   no target of its own (on a compute-bound batch the roofline of {n} is "
                  f"the compute roofline, so its target covers this figure)")
    return missed


def print_accuracy(console, acc, error=None):
    """Print figure 6 (or why it is missing)."""
    from rich.markup import escape
    from rich.table import Table
    n = figure_number("accuracy")
    if acc is None:
        console.print(f"[bold]{n}. Accuracy of the expert[/]: [red]not measured[/]: "
                      f"{escape(error or '')}")
        return
    console.print(f"[bold]{n}. Accuracy of the expert[/] (golden model vs float64, no RTL). "
                  f"MiniLM's FFN is GELU with no gate, so the SwiGLU expert is made of up = "
                  f"{acc['up']}, gate = {acc['gate']} (layer {acc['layer'] + 1}'s "
                  f"up-projection), down = {acc['down']} (biases dropped; H = {acc['hidden']}, "
                  f"I = {acc['intermediate']}); x = the {acc['activations']} "
                  f"({acc['prompts']} prompts, {acc['tokens']} tokens); reference: float64 "
                  f"down(silu(gate x) * up x) on the float weights; gate weight 1")
    table = Table()
    for col in ("mode", "cosine", "SQNR dB", "MSE", "max abs"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for mode in ("draft", "full"):
        m = acc[mode]
        table.add_row(mode.upper(), f"{m['cosine']:.6f}", f"{m['sqnr_db']:.2f}",
                      f"{m['mse']:.3e}", f"{m['max_abs']:.3e}")
    console.print(table)
    console.print("   reported, no target")


def speed_figures() -> dict:
    """Figure 12: the whole-decoder model's simulated tokens per second on one core, every
    paper model at 8 GB (:func:`elmoe3d.sw.host.paper_eval.model_speed`)."""
    from ..sw.host.paper_eval import model_speed
    return model_speed("8gb")


#: Figure 12's trace-driven path: the synthetic traces' tokens (the schedule is ``elmoe3d
#: run``'s default: its ``DEFAULT_DEPTH`` and ``DEFAULT_ACCEPTANCE``).
TRACE_SYNTHETIC_TOKENS = 64


def trace_path_speed() -> dict:
    """Figure 12's second path: the trace-driven perf path of ``elmoe3d run --backend perf``
    at its defaults (Elastic-SD at ``run.DEFAULT_DEPTH`` and ``run.DEFAULT_ACCEPTANCE``, batch 1,
    every MoE layer) at ``paper-8gb``, timed in CPU seconds of this process (``time.process_time``:
    the schedule and the perf backend, not the trace's import): Mixtral-8x7B on the real gsm8k trace
    and every Table 3 model on :data:`TRACE_SYNTHETIC_TOKENS` tokens of synthetic routing (OLMoE's
    calibration, seed 0; none of their routing is in ``../shared/traces``). Returns ``{model:
    {"trace", "tokens", "tokens_per_s", "seconds"}}``, or ``{"error": ...}`` when the real trace is
    missing."""
    import time
    from ..config import preset
    from ..sw.host import compiler as host
    from ..sw.host.backends.perf import run_perf
    from ..sw.host.corpus import ROUTING_MODEL, routing_path
    from ..sw.host.elastic_sd import ElasticSD
    from ..sw.host.hbcache import HBExpertCache
    from ..sw.host.paper_eval import TABLE3_MODELS
    from ..sw.host.trace import import_vllm_jsonl
    from ..sw.host.tracegen import CALIBRATED, synthetic_trace
    from .run import DEFAULT_ACCEPTANCE, DEFAULT_DEPTH, parse_acceptance
    arch = preset("paper-8gb")
    path = routing_path("gsm8k")
    if not path.is_file():
        return {"error": f"{path} not found (set ELMOE3D_TRACES)"}
    runs = [(ROUTING_MODEL, "gsm8k", import_vllm_jsonl(path, model=ROUTING_MODEL)[0])]
    runs += [(m, f"synthetic {TRACE_SYNTHETIC_TOKENS}", synthetic_trace(
        m, CALIBRATED["olmoe-1b-7b"], tokens=TRACE_SYNTHETIC_TOKENS, seed=0))
        for m in TABLE3_MODELS]
    out = {}
    for model, name, trace in runs:
        dense, kv = host.reserved_hb_bytes(model)
        t0 = time.process_time()
        cache = HBExpertCache.for_model(model, arch, dense_bytes=dense, kv_bytes=kv,
                                        admit=False)
        esd = ElasticSD(cache=cache, depth=DEFAULT_DEPTH,
                        acceptance=parse_acceptance(DEFAULT_ACCEPTANCE))
        steps, _ = host.elastic_steps(trace, esd, groups=arch.groups)
        run_perf(steps, arch, model)
        dt = time.process_time() - t0
        n = trace.token_count()
        out[model] = {"trace": name, "tokens": n, "tokens_per_s": n / dt, "seconds": dt}
    return out


def sweep_figures() -> dict:
    """Figure 13: :data:`SWEEP_SPEC` run serially, then on :data:`SWEEP_WORKERS` local Dask
    workers, each into a fresh folder. Returns ``{"points", "serial": {"points_per_s",
    "seconds"}, "dask": {N: {"points_per_s", "seconds", "identical", "differing"}},
    "efficiency", "seed"}`` (``differing``: rows unlike the serial run's)."""
    import tempfile
    from ..sw.host.sweep import comparable, run_sweep
    from ..sw.host.sweep_spec import parse_spec
    spec = parse_spec(SWEEP_SPEC, path=f"make bench figure {figure_number('sweep')}")
    out = {"seed": spec.seed, "dask": {}}
    with tempfile.TemporaryDirectory(prefix="elmoe3d-bench-sweep-") as tmp:
        def one(workers):
            return run_sweep(spec, f"{tmp}/w{workers}", workers=workers,
                             cache_dir=f"{tmp}/cache", progress=False, plots=False,
                             dashboard=None, say=lambda m: None)
        serial = one(0)
        ref = comparable(serial.rows)
        out["points"] = serial.points
        out["serial"] = {"points_per_s": serial.ran / serial.seconds, "seconds": serial.seconds}
        for n in SWEEP_WORKERS:
            r = one(n)
            got = comparable(r.rows)
            out["dask"][n] = {"points_per_s": r.ran / r.seconds, "seconds": r.seconds,
                              "workers": r.workers, "identical": got == ref,
                              "differing": sum(a != b for a, b in zip(got, ref))
                              + abs(len(got) - len(ref))}
    r1, r2 = out["dask"][1]["points_per_s"], out["dask"][2]["points_per_s"]
    out["efficiency"] = r2 / (2 * r1)
    return out


def print_sweep(console, sweep) -> list:
    num = figure_number("sweep")
    missed = [f"{num}. sweep on {n} worker(s): {d['differing']} row(s) differ from the serial run"
              for n, d in sweep["dask"].items() if not d["identical"]]
    d1, d2 = sweep["dask"][1], sweep["dask"][2]
    console.print(f"[bold]{num}. Sweep scaling[/] (elmoe3d sweep, {sweep['points']} perf-model "
                  f"points, seed {sweep['seed']}): serial {sweep['serial']['points_per_s']:,.1f} "
                  f"points/s; Dask LocalCluster 1 worker {d1['points_per_s']:,.1f}, 2 workers "
                  f"{d2['points_per_s']:,.1f} points/s; scaling efficiency rate2 / (2 x rate1) = "
                  f"[bold]{sweep['efficiency']:.2f}[/] (reported); results identical to the "
                  f"serial run: " + ("[green]yes[/] (1 and 2 workers, every row)" if not missed
                                     else "[red]NO[/]"))
    return missed


def print_speed(console, speed, trace=None) -> list:
    from ..sw.host.paper_eval import SPEED_TARGET, TREE
    n = figure_number("model-speed")
    missed = [f"{n}. performance model on {m}: {v['tokens_per_s']:,.0f} simulated tokens/s < "
              f"target {SPEED_TARGET:,}" for m, v in speed.items()
              if v["tokens_per_s"] < SPEED_TARGET]
    console.print(f"[bold]{n}. Performance-model speed[/] (elmoe3d paper, 8 GB; a round = xPU AR, "
                  f"our AR and an Elastic-SD {TREE[0]} x {TREE[1]} tree verifying {TREE[2]} "
                  f"nodes at batch 1, 4, 8, 16; "
                  f"CPU time of one core): "
                  + ", ".join(f"{m} {v['tokens_per_s']:,.0f}" for m, v in speed.items())
                  + f" simulated tokens/s (ours' tokens only); target >= {SPEED_TARGET:,}: "
                  + ("[red]MISSED[/]" if missed else "[green]met[/]")
                  + " by this analytical model; the trace-driven path below")
    if trace is not None:
        if "error" in trace:
            console.print(f"   trace-driven perf path: not measured ({trace['error']})",
                          markup=False)
        else:
            console.print("   trace-driven perf path (elmoe3d run --backend perf, paper-8gb, "
                          "Elastic-SD depth 4; schedule + backend, CPU time of one core): "
                          + ", ".join(f"{m} ({v['trace']}) {v['tokens_per_s']:,.0f} simulated "
                                      f"tokens/s = {v['tokens_per_s'] / SPEED_TARGET:.2f}x the "
                                      f"target ({v['tokens']} tokens in {v['seconds']:.2f} s)"
                                      for m, v in trace.items())
                          + "; reported, not judged")
    return missed


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from .sim import sim_config
    from ..sim.runner import SimulationError, SimulationFailure, resolve_seed

    onlys = [f"--{o.replace('_', '-')}" for o in UNREAD_OPTIONS if getattr(args, o)]
    if len(onlys) > 1:
        raise UserError(f"{' and '.join(onlys)} exclude each other")
    for only, (unread, why) in UNREAD_OPTIONS.items():
        given = given_options(args, unread) if getattr(args, only) else []
        if given:
            raise UserError(f"{', '.join(given)}: not read with --{only.replace('_', '-')} "
                            f"({why})")
    fill_defaults(args, {"config": SIM_CONFIGS[0], "repeats": DEFAULT_REPEATS,
                         "beats": DEFAULT_BEATS})
    arch = sim_config(args.config)
    if args.repeats < 1 or args.beats < 1:
        raise UserError("--repeats and --beats must be positive")
    if args.beats > MAX_BEATS:
        raise UserError(f"--beats {args.beats}: at most {MAX_BEATS:,} (the bench simulates "
                        f"every beat and holds the GEMM's operands and results in memory)")
    if args.json:
        check_output(args.json, "--json")
    console = Console(highlight=False)
    if not console.is_terminal:            # logs and pipes: wide enough for the tables
        console.width = max(console.width, 170)
    if args.skip_real and args.only_real:
        raise UserError("--skip-real and --only-real exclude each other")
    alone = args.only_sweep or args.only_speed          # one figure without a seed
    if not (alone or args.only_real):       # figure 2 will run: its setup, before figure 1
        _threadpoolctl()
    seed = None if alone else resolve_seed(args.seed)   # not $ELMOE3D_SEED either
    cfg = arch.tile
    console.print("elmoe3d bench: " + ("the sweep figure" if args.only_sweep else
                                       "the model-speed figure" if args.only_speed else
                                       f"seed {seed}" if args.only_real else
                                       f"config {arch.name}, seed {seed}"))

    steps = len(FIGURES)
    if alone:
        if args.only_sweep:
            key, what = "sweep", "sweep points per second, serial and 1 / 2 local Dask workers"
        else:
            key, what = "model-speed", SPEED_WHAT
        console.print(f"[{figure_number(key)}/{steps}] {what} ...")
        if args.only_sweep:
            sweep = sweep_figures()
            doc = {"seed": sweep["seed"], "sweep": sweep}
            console.print()
            missed = print_sweep(console, sweep)
        else:
            doc = {"perf_model_speed": speed_figures(), "trace_path_speed": trace_path_speed()}
            console.print()
            missed = print_speed(console, doc["perf_model_speed"], doc["trace_path_speed"])
        if args.json:
            write_json(args.json, {**doc, "missed": missed})
        for line in missed:
            console.print(f"[bold red]missed[/]: {escape(line)}")
        return 1 if missed else 0

    def step(key, what):
        """Print the line of figure ``key``'s step, numbered by :data:`FIGURES`."""
        console.print(f"[{figure_number(key)}/{steps}] {what}")

    def simulate(key, what, title, fn, *fn_args):
        """Print figure ``key``'s step line and run a cocotb figure; a failed simulation is one
        line."""
        step(key, f"{what} ...")
        try:
            return fn(*fn_args)
        except (SimulationError, SimulationFailure) as exc:
            raise UserError(f"{title}: {_one_line(exc)}") from None

    real_what = (f"real expert shapes ({', '.join(real_shapes())}) on the mid PE, tokens "
                 f"{', '.join(map(str, REAL_TOKENS))}"
                 + "".join(f" ({k}: {', '.join(map(str, v))})"
                           for k, v in REAL_SHAPE_TOKENS.items())
                 + ", DRAFT and FULL (cocotb + Verilator)")
    peak_what = ("tile MACs per cycle, ld at the full rate: mid RTL (cocotb + Verilator), "
                 "paper PE (cycle model)")
    if args.only_real:
        real = simulate("real", real_what, "real-expert bench", real_expert_figures, seed)
        peak = simulate("peak", peak_what, "tile MACs-per-cycle bench", peak_mac_figures, seed)
        console.print()
        missed = print_real(console, real) + print_peak(console, peak)
        if args.json:
            write_json(args.json, {"seed": seed, "real": real, "peak": peak, "missed": missed})
        for line in missed:
            console.print(f"[bold red]missed[/]: {escape(line)}")
        return 1 if missed else 0

    rtl = simulate("throughput", f"RTL throughput of the {cfg.rows}x{cfg.lanes}x{cfg.group} "
                                 f"tile (cocotb + Verilator)", "RTL throughput bench",
                   rtl_figures, cfg, seed, args.beats)
    step("golden", "golden GEMM vs float32 np.matmul ...")
    golden = golden_figures(seed, args.repeats)
    step("sim-speed", f"simulation speed (measured during {figure_number('throughput')})")
    pe = simulate("roofline", f"PE cycles with the ld stream at the HB bank rate (cocotb + "
                              f"Verilator), batches {', '.join(map(str, ROOFLINE_BATCHES))}, MoE "
                              f"layer and one expert, DRAFT and FULL", "PE HB-roofline bench",
                  pe_figures, arch, seed)
    step("utilization", f"PE-array utilization on the compute-bound batch of "
                        f"{UTILIZATION_BATCH} tokens (measured during "
                        f"{figure_number('roofline')})")
    step("accuracy", "accuracy of the expert on MiniLM weights (golden model) ...")
    try:
        accuracy, accuracy_error = accuracy_figures(), None
    except UserError as exc:
        accuracy, accuracy_error = None, str(exc)
    dram = simulate("dram", "HB bank and LPDDR5 controllers against the timing-checked DRAM "
                            "models (cocotb + Verilator)", "DRAM bench", dram_figures, arch, seed)
    links = simulate("links", "streamline ring and aggregation link throughput (cocotb + "
                              "Verilator)", "ring/link bench", link_figures, arch, seed)
    die = simulate("die", "logic die: draft and verify MoE layers, verify-phase overlap "
                          "(cocotb + Verilator)", "die bench", die_figures, arch, seed)
    real = peak = None
    if args.skip_real:
        console.print(f"[{_steps('real', 'peak')}/{steps}] real expert shapes on the mid PE: "
                      f"skipped (--skip-real)")
    else:
        real = simulate("real", real_what, "real-expert bench", real_expert_figures, seed)
        peak = simulate("peak", peak_what, "tile MACs-per-cycle bench", peak_mac_figures, seed)
    step("model-speed", f"{SPEED_WHAT} ...")
    speed = speed_figures()
    trace_speed = trace_path_speed()
    step("sweep", "sweep points per second, serial and 1 / 2 local Dask workers ...")
    sweep = sweep_figures()
    console.print()

    missed = []
    n = {key: figure_number(key) for key, _ in FIGURES}
    ok_thr = rtl["fraction"] >= THROUGHPUT_TARGET and rtl["mismatches"] == 0
    if rtl["fraction"] < THROUGHPUT_TARGET:
        missed.append(f"{n['throughput']}. tile throughput {rtl['fraction']:.4f} of peak < target "
                      f"{THROUGHPUT_TARGET}")
    if rtl["mismatches"]:
        missed.append(f"{n['throughput']}. {rtl['mismatches']} mismatching RTL result value(s) "
                      f"(log {rtl['log']})")
    console.print(f"[bold]{n['throughput']}. Tile throughput (RTL)[/]: {rtl['beats']:,} beats "
                  f"accepted, first accept at cycle {rtl['first_accept']}, last result at cycle "
                  f"{rtl['last_result']}, latency {rtl['latency']} (tile.latency) -> "
                  f"[bold]{rtl['fraction']:.4f}[/] of peak (baseline: peak = 1 beat = one "
                  f"group-column per lane per cycle); target >= {THROUGHPUT_TARGET}: "
                  f"{'[green]met[/]' if ok_thr else '[red]MISSED[/]'}; results bit-exact: "
                  f"{rtl['comparisons']:,} values, {rtl['mismatches']} mismatches")

    table = Table(title=f"{n['golden']}. Golden bit-exact GEMM vs float32 np.matmul (median of "
                        f"{args.repeats}; {golden[0]['source']})", title_justify="left",
                  caption=GOLDEN_COLUMNS, caption_justify="left")
    for col in ("shape", "M x K x N", "np.matmul f32", "gemm prepared", "ratio",
                "gemm cold", "ratio cold"):
        table.add_column(col, justify="left" if col == "shape" else "right")
    for g in golden:
        if g["ratio_prepared"] < GOLDEN_TARGET:
            missed.append(f"{n['golden']}. golden GEMM {g['label']}: prepared ratio "
                          f"{g['ratio_prepared']:.1%} < target {GOLDEN_TARGET:.0%}")
        table.add_row(g["label"], f"{g['M']}x{g['K']}x{g['N']}",
                      f"{g['matmul_f32_s'] * 1e3:.3f} ms", f"{g['gemm_prepared_s'] * 1e3:.3f} ms",
                      f"{g['ratio_prepared']:.1%}", f"{g['gemm_cold_s'] * 1e3:.3f} ms",
                      f"{g['ratio_cold']:.1%}")
    ok_gold = all(g["ratio_prepared"] >= GOLDEN_TARGET for g in golden)
    console.print(table)
    console.print(f"   target: prepared ratio >= {GOLDEN_TARGET:.0%} on every shape: "
                  f"{'[green]met[/]' if ok_gold else '[red]MISSED[/]'}")
    console.print(f"[bold]{n['sim-speed']}. Simulation speed[/]: "
                  f"{rtl['sim_cycles_per_s']:,.0f} simulated cycles/s with stream traffic "
                  f"(source, sink, monitor coroutines); baseline "
                  f"{rtl['clock_only_cycles_per_s']:,.0f} cycles/s with only the clock running "
                  f"({rtl['sim_cycles_per_s'] / rtl['clock_only_cycles_per_s']:.0%})")
    missed += print_pe(console, pe)
    print_accuracy(console, accuracy, accuracy_error)
    if accuracy_error:
        missed.append(f"{n['accuracy']}. accuracy not measured: {accuracy_error}")
    missed += [f"{n['dram']}. {line}" for line in print_dram(console, dram)]
    missed += [f"{n['links']}. {line}" for line in print_links(console, links)]
    missed += [f"{n['die']}. {line}" for line in print_die(console, die)]
    if real is not None:
        missed += print_real(console, real) + print_peak(console, peak)
    missed += print_speed(console, speed, trace_speed)
    missed += print_sweep(console, sweep)
    if args.json:
        write_json(args.json, {"config": arch.name, "seed": seed, "rtl": rtl, "golden": golden,
                               "pe": pe, "accuracy": accuracy, "dram": dram,
                               "links": links, "die": die, "real": real, "peak": peak,
                               "perf_model_speed": speed,
                               "trace_path_speed": trace_speed, "sweep": sweep,
                               "targets": {"throughput": THROUGHPUT_TARGET,
                                           "golden": GOLDEN_TARGET,
                                           "roofline": ROOFLINE_TARGET},
                               "missed": missed})
    if missed:
        for line in missed:
            console.print(f"[bold red]missed[/]: {escape(line)}")
        console.print(f"[bold red]elmoe3d bench: {len(missed)} target(s) missed[/] (exit 1)")
        return 1
    console.print("[bold green]elmoe3d bench: every target met[/]")
    return 0

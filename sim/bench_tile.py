"""cocotb bench of the tensor tile, :class:`elmoe3d.hw.tile.TensorTile`.

Run through :mod:`elmoe3d.sim.runner` (never directly): the runner builds the tile's Verilog and
writes ``params.json`` (read with :func:`~elmoe3d.sim.runner.load_params`), so this one module
serves every :class:`~elmoe3d.config.TileConfig`::

    {"tile": {"rows": 2, "lanes": 4},           # TileConfig fields (required)
     "traces": "/path/gsm8k_2_outputs.jsonl",   # GSM8K prompts for the MiniLM activations
     "minilm": {"layer": 0, "tokens": 8, "up_channels": 16, "down_tokens": 4,
                "down_channels": 8},
     "random_beats": 200,                       # raw random beat sequence length
     "throughput_beats": 1024}                  # minimum length of the throughput GEMM

Streams are driven with plain cocotb coroutines: a source that presents beats (optionally with
random idle cycles, during which it drives garbage payloads), a sink that drives ``o.ready``
(optionally with random backpressure) and a monitor that collects every accepted result and
checks the stream rule (a presented result stays valid and unchanged until taken). Payloads are
packed and unpacked only through the Amaranth layouts (:func:`~elmoe3d.hw.layouts.pack_beats`,
:func:`~elmoe3d.hw.layouts.unpack_results`).

Every result is compared with plain equality against :func:`elmoe3d.sw.golden.tile.ref_tile`, and
each GEMM reassembled from the results against :func:`elmoe3d.sw.golden.datapath.gemm`. Comparisons
are counted in accumulator values; mismatches count every differing accumulator, overflow flag
or mode, every missing or extra result and every stream-protocol violation. Each test writes
``summary-<test>.json`` (a list of case records) into the run folder, then fails if any case
had a mismatch. Seeds: :func:`~elmoe3d.sim.runner.resolve_seed`, one generator per case.

Tests: ``test_minilm`` (real all-MiniLM-L6-v2 FFN weights and activations, all four modes, the
MSB_ONLY + LSB_ONLY split against FULL), ``test_random``, ``test_corners`` (each with
``traffic`` = ``smooth`` or ``stalls``, :mod:`elmoe3d.sim.traffic`) and ``test_throughput``
(always-valid source, always-ready sink: accepted beats per cycle, and the result latency
against ``tile.latency``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import cocotb
from cocotb.triggers import RisingEdge

from ..config import TileConfig, tile_latency
from ..hw.layouts import pack_beats, tile_beat_layout, unpack_results
from ..hw.tile import TensorTile
from ..sw.golden.datapath import Mode, gemm
from ..sw.host.corpus import PROMPT_FILE, gsm8k_prompts, traces_dir
from ..sw.golden.quant import GROUP, QuantizedWeight, quantize_activations, quantize_weights
from ..sw.golden.tile import channels_per_block, ref_tile, tile_assemble, tile_schedule
from . import cocotb_streams as streams
from .records import BenchResult, CaseRecorder, failed_cases, run_bench
from .runner import case_rng, load_params, resolve_seed
from .traffic import BENCH_TRAFFIC, traffic as pattern


#: Results recorded in detail per case when values differ.
MAX_DETAILS = 8


def _minilm_missing() -> bool:
    from ..sw.host.minilm import minilm_path
    return minilm_path() is None


# -- the stream harness ----------------------------------------------------------------------

@dataclass
class StreamRun:
    """What one beat sequence did on the DUT."""

    results: dict                      # acc int64 [R, M, N], overflow bool [R, M, N], mode [R]
    accept_cycles: list                # cycle of each accepted beat
    result_cycles: list                # cycle of each accepted result
    start_cycle: int
    end_cycle: int
    expected: int                      # results the beats ask for
    errors: list = field(default_factory=list)    # protocol violations, missing/extra results
    wall_seconds: float = 0.0

    @property
    def cycles(self) -> int:
        """Cycles from the first presented beat to the last result."""
        return self.end_cycle - self.start_cycle + 1


class TileBench(CaseRecorder):
    """Clock, reset, stream source/sink/monitor and comparisons for one TensorTile DUT."""

    def __init__(self, dut, config: TileConfig, seed: int, test: str, traffic: str = "-"):
        self.dut = dut
        self.config = config
        self.seed = seed
        self.test = test
        self.traffic = traffic
        self.beat_layout = tile_beat_layout(config)
        self.latency = tile_latency(1)          # the DUT's: TensorTile(config=config), one pass
        self.records = []

    cycle = staticmethod(streams.cycle)

    def rng(self, case: str) -> np.random.Generator:
        return case_rng(self.seed, f"{self.test}/{case}")

    async def start(self):
        dut = self.dut
        await streams.start(dut, ("i__valid", "i__payload", "o__ready"))
        dut._log.info("TensorTile rows=%d lanes=%d latency=%d; seed %d", self.config.rows,
                      self.config.lanes, self.latency, self.seed)

    async def stream(self, beats, *, rng, idle=0.0, backpressure=0.0) -> StreamRun:
        """Send ``beats`` through the DUT and collect its results."""
        dut = self.dut
        words = pack_beats(self.config, beats)
        expected = int(np.count_nonzero(beats["last"]))
        raws, result_cycles, accept_cycles, errors = [], [], [], []
        monitor = cocotb.start_soon(streams.monitor(dut, "o", raws, result_cycles, errors))
        sink = cocotb.start_soon(streams.drive_ready(dut, "o", rng, backpressure))
        start = self.cycle()
        wall = time.perf_counter()
        await streams.offer(dut, "i", words, rng, idle, bits=self.beat_layout.size,
                            log=accept_cycles)
        # Generous bound: every beat could wait for a stalled result.
        deadline = self.cycle() + (self.latency + 8) * (expected + 2) * 20 + 100
        while len(raws) < expected and self.cycle() < deadline:
            await RisingEdge(dut.clk)
        if len(raws) < expected:
            errors.append(f"only {len(raws)} of {expected} results after "
                          f"{self.cycle() - start} cycles")
        end = result_cycles[-1] if result_cycles else self.cycle()
        wall = time.perf_counter() - wall
        # Drain with the sink ready: nothing more may come out.
        sink.cancel()
        dut.o__ready.value = 1
        for _ in range(self.latency + 4):
            await RisingEdge(dut.clk)
        monitor.cancel()
        dut.o__ready.value = 0
        if len(raws) > expected:
            errors.append(f"{len(raws) - expected} extra result(s) beyond the {expected} "
                          f"the beats ask for")
        return StreamRun(results=unpack_results(self.config, raws[:expected]),
                         accept_cycles=accept_cycles, result_cycles=result_cycles[:expected],
                         start_cycle=start, end_cycle=end, expected=expected, errors=errors,
                         wall_seconds=wall)

    # -- comparisons --

    @staticmethod
    def compare_results(rtl, ref, details, result_cycles=()):
        """RTL results vs ref_tile results: (values compared, mismatches). A missing result
        counts all its values as compared and mismatched. ``result_cycles``: the cycle each
        result was taken on ``o`` (:class:`StreamRun`), named in the details with its
        simulation time, where a waveform shows it."""
        n_ref = len(ref["mode"])
        n_rtl = len(rtl["mode"])
        per = ref["acc"][0].size if n_ref else 0
        values = n_ref * per
        mismatches = 0
        for i in range(n_ref):
            if i >= n_rtl:
                mismatches += 2 * per + 1
                continue
            bad_acc = rtl["acc"][i] != ref["acc"][i]
            bad_ovf = rtl["overflow"][i] != ref["overflow"][i]
            bad_mode = int(rtl["mode"][i]) != int(ref["mode"][i])
            mismatches += int(bad_acc.sum()) + int(bad_ovf.sum()) + int(bad_mode)
            when = f" (on o: {streams.handshake_at(result_cycles[i])})" \
                if i < len(result_cycles) else ""
            for r, n in zip(*np.nonzero(bad_acc | bad_ovf)):
                if len(details) < MAX_DETAILS:
                    details.append(f"result {i}{when} row {r} lane {n}: RTL acc "
                                   f"{int(rtl['acc'][i, r, n])} ovf "
                                   f"{bool(rtl['overflow'][i, r, n])}, ref_tile acc "
                                   f"{int(ref['acc'][i, r, n])} ovf "
                                   f"{bool(ref['overflow'][i, r, n])}")
            if bad_mode and len(details) < MAX_DETAILS:
                details.append(f"result {i}{when}: RTL mode {int(rtl['mode'][i])}, ref_tile "
                               f"mode {int(ref['mode'][i])}")
        return values, mismatches

    @staticmethod
    def compare_acc(got, want, names, details):
        """Two Accumulators ([M tokens, N channels]): (values compared, mismatches).
        ``names``: what ``got`` and ``want`` are (``("RTL", "gemm()")``), each value in the
        details named so (a split check compares two RTL results, neither one expected)."""
        bad = (got.acc != want.acc) | (got.overflow != want.overflow)
        for m, n in zip(*np.nonzero(bad)):
            if len(details) < MAX_DETAILS:
                details.append(f"{names[0]} vs {names[1]} [token {m}, channel {n}]: "
                               f"{names[0]} acc {int(got.acc[m, n])} ovf "
                               f"{bool(got.overflow[m, n])}, {names[1]} acc "
                               f"{int(want.acc[m, n])} ovf {bool(want.overflow[m, n])}")
        mismatches = int((got.acc != want.acc).sum()) + int((got.overflow != want.overflow).sum())
        return int(want.acc.size), mismatches

    def record(self, **rec):
        rec.setdefault("test", self.test)
        self.records.append(rec)
        self.dut._log.info(
            "%-34s %-8s %-14s %5d beats %6d cycles %6d values %d mismatches",
            rec["case"], rec.get("mode") or "mixed",
            "x".join(map(str, rec["shape"])) if rec.get("shape") else "-", rec["beats"],
            rec["cycles"], rec["comparisons"], rec["mismatches"])
        for line in rec.get("details", []):
            self.dut._log.error("  %s: %s", rec["case"], line)
        return rec

    async def gemm_case(self, case, source, a_q, qw, mode, traffic, *, extra=None):
        """Schedule ``a_q x qw^T`` in ``mode``, stream it, compare with ref_tile and gemm.

        Returns the reassembled RTL Accumulator (None if results are missing)."""
        mode = Mode(mode)
        flow = pattern(traffic).for_ports("i", "o")
        rows, lanes = self.config.rows, self.config.lanes
        beats = tile_schedule(a_q, qw, mode, rows, lanes)
        run = await self.stream(beats, rng=self.rng(f"{case}/{mode.name}/{traffic}"),
                                idle=flow.idle_at("i"), backpressure=flow.backpressure_at("o"))
        details = list(run.errors)
        ref = ref_tile(beats)
        tile_values, tile_bad = self.compare_results(run.results, ref, details,
                                                     run.result_cycles)
        golden = gemm(a_q, qw, mode)
        assembled = None
        gemm_values, gemm_bad = int(golden.acc.size), int(2 * golden.acc.size)
        if len(run.results["mode"]) == run.expected:
            assembled = tile_assemble(run.results, a_q.shape[0], qw.q.shape[0], mode, rows,
                                      lanes)
            gemm_values, gemm_bad = self.compare_acc(assembled, golden, ("RTL GEMM", "gemm()"),
                                                     details)
        self.record(case=case, source=source, mode=mode.name, traffic=traffic,
                    shape=[int(a_q.shape[0]), int(a_q.shape[1]), int(qw.q.shape[0])],
                    beats=len(beats["mode"]), results=run.expected, cycles=run.cycles,
                    tile_values=tile_values, gemm_values=gemm_values,
                    comparisons=tile_values + gemm_values,
                    mismatches=tile_bad + gemm_bad + len(run.errors),
                    overflowed=int(golden.overflow.sum()), details=details, **(extra or {}))
        return assembled

    async def beats_case(self, case, source, beats, traffic):
        """Stream a raw beat sequence (any modes, first/last pattern), compare with ref_tile."""
        flow = pattern(traffic).for_ports("i", "o")
        run = await self.stream(beats, rng=self.rng(f"{case}/{traffic}"), idle=flow.idle_at("i"),
                                backpressure=flow.backpressure_at("o"))
        details = list(run.errors)
        ref = ref_tile(beats)
        values, bad = self.compare_results(run.results, ref, details, run.result_cycles)
        self.record(case=case, source=source, mode=None, traffic=traffic, shape=None,
                    beats=len(beats["mode"]), results=run.expected, cycles=run.cycles,
                    tile_values=values, gemm_values=0, comparisons=values,
                    mismatches=bad + len(run.errors),
                    overflowed=int(ref["overflow"].any(axis=(1, 2)).sum()), details=details)

    def fail(self, case, message, *, source="bench", mode=None, traffic=None, shape=None):
        """Record a failed check that compares no values (a bench precondition, an aborted
        test) as a case with one mismatch, so it shows in the summary and fails the test."""
        return self.record(case=case, source=source, mode=mode,
                           traffic=traffic or self.traffic, shape=shape, beats=0, results=0,
                           cycles=0, tile_values=0, gemm_values=0, comparisons=0, mismatches=1,
                           overflowed=0, details=[message], error=message)

    def check_split(self, case, source, traffic, full, msb, lsb, shape):
        """numerics §5: MSB_ONLY + LSB_ONLY equals FULL bit for bit (three RTL Accumulators).
        The identity holds only without saturation: a saturated operand is a failed case."""
        from ..sw.golden.datapath import Accumulator
        saturated = [name for name, acc in (("FULL", full), ("MSB_ONLY", msb),
                                            ("LSB_ONLY", lsb)) if acc.overflow.any()]
        if saturated:
            return self.fail(f"{case} split", f"{', '.join(saturated)} saturated: MSB_ONLY + "
                             f"LSB_ONLY = FULL holds only without saturation, so the split "
                             f"cannot be checked on this slice", source=source, mode="MSB+LSB",
                             traffic=traffic, shape=shape)
        details = []
        split = Accumulator(msb.acc + lsb.acc, msb.overflow | lsb.overflow)
        values, bad = self.compare_acc(split, full, ("MSB_ONLY + LSB_ONLY", "RTL FULL"),
                                       details)
        return self.record(case=f"{case} split", source=source, mode="MSB+LSB", traffic=traffic,
                           shape=shape, beats=0, results=0, cycles=0, tile_values=0,
                           gemm_values=values, comparisons=values, mismatches=bad,
                           overflowed=0, details=details)

    def finish(self):
        """Write the summary; fail (AssertionError) if any case mismatched or failed."""
        path = self.write_summary()
        bad = [r for r in self.records if r["mismatches"]]
        total = sum(r["comparisons"] for r in self.records)
        self.dut._log.info("%s: %s, %s compared, %s; summary %s", self.test,
                           counted(len(self.records), "case"),
                           counted(total, "accumulator value"),
                           counted(len(bad), "failing case"), path)
        if os.environ.get("WAVES", "") == "1":
            for wave in sorted(Path(path.parent).glob("dump.*")):
                self.dut._log.info("%s: waves %s", self.test, wave.resolve())
        assert not bad, (f"{counted(len(bad), 'case')} failed (seed {self.seed}): "
                         + failed_cases(bad))


def counted(n: int, noun: str) -> str:
    """``1 case``, ``2 cases``, ``0 mismatches``."""
    plural = noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")
    return f"{n:,} {noun if n == 1 else plural}"


def _config() -> TileConfig:
    params = load_params()
    if "tile" not in params:
        raise RuntimeError("bench_tile: params.json has no 'tile' entry; run this bench "
                           "through elmoe3d.sim.runner")
    return TileConfig(**params["tile"])


async def _bench(dut, test, traffic="-") -> TileBench:
    bench = TileBench(dut, _config(), resolve_seed(), test, traffic)
    await bench.start()
    return bench


# -- operands --------------------------------------------------------------------------------

def _evenly(total: int, count: int) -> np.ndarray:
    count = min(count, total)
    return np.unique(np.linspace(0, total - 1, count).round().astype(int))


def default_traces() -> Path:
    """The GSM8K prompt file (see :func:`elmoe3d.sw.host.corpus.traces_dir`)."""
    return traces_dir() / PROMPT_FILE


def _random_weights(rng, n, k, name):
    """Float weights with group magnitudes spread over five decades (varied FP16 exponents)."""
    w = rng.standard_normal((n, k))
    mag = 10.0 ** rng.uniform(-4, 1, (n, k // GROUP))
    return quantize_weights(w * np.repeat(mag, GROUP, axis=1), name=name)


def _random_beats(rng, count, config: TileConfig):
    """A raw random beat sequence: random codes, nibbles, FP16 bit patterns (every exponent,
    both signs), modes changing from beat to beat, random first/last."""
    rows, lanes = config.rows, config.lanes
    first = rng.random(count) < 0.2
    last = rng.random(count) < 0.2
    first[0] = True
    last[-1] = True
    return {
        "act": rng.integers(-128, 128, (count, rows, GROUP)).astype(np.int8),
        "wgt": rng.integers(0, 16, (count, lanes, GROUP)).astype(np.uint8),
        "scale": rng.integers(0, 1 << 16, (count, lanes)).astype(np.uint16),
        "mode": rng.integers(0, 4, count).astype(np.int64),
        "first": first,
        "last": last,
    }


# -- tests -----------------------------------------------------------------------------------

@cocotb.test(skip=_minilm_missing())
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_minilm(dut, traffic):
    """Real all-MiniLM-L6-v2 FFN weights and real activations on GSM8K prompts."""
    from ..sw.host.minilm import ffn_activations, ffn_weights
    bench = await _bench(dut, f"test_minilm-{traffic}", traffic)
    with bench.summary():
        params = load_params()
        opts = {"layer": 0, "tokens": 8, "up_channels": 16, "down_tokens": 4, "down_channels": 8,
                **params.get("minilm", {})}
        layer = int(opts["layer"])
        prompts = gsm8k_prompts(params.get("traces") or default_traces())
        ffn_in, ffn_mid = ffn_activations(prompts, layer)
        up, down = ffn_weights(layer)
        dut._log.info("MiniLM layer %d: %d real tokens from %d GSM8K prompts", layer,
                      ffn_in.shape[0], len(prompts))

        tok = _evenly(ffn_in.shape[0], int(opts["tokens"]))
        ch = _evenly(up.shape[0], int(opts["up_channels"]))
        a_up = quantize_activations(ffn_in[tok], name=f"layer{layer}.ffn_in").q
        w_up = quantize_weights(up[ch], name=f"encoder.layer.{layer}.intermediate.dense.weight")
        case = f"minilm L{layer} up"
        rtl = {}
        for mode in (Mode.FULL, Mode.DRAFT, Mode.MSB_ONLY, Mode.LSB_ONLY):
            rtl[mode] = await bench.gemm_case(case, "minilm", a_up, w_up, mode, traffic)

        # Split verification (numerics §5): MSB_ONLY + LSB_ONLY must equal FULL bit for bit.
        if all(rtl[m] is not None for m in (Mode.FULL, Mode.MSB_ONLY, Mode.LSB_ONLY)):
            bench.check_split(case, "minilm", traffic, rtl[Mode.FULL], rtl[Mode.MSB_ONLY],
                              rtl[Mode.LSB_ONLY], [int(a_up.shape[0]), int(a_up.shape[1]),
                                                   int(w_up.q.shape[0])])

        tok = _evenly(ffn_mid.shape[0], int(opts["down_tokens"]))
        ch = _evenly(down.shape[0], int(opts["down_channels"]))
        a_down = quantize_activations(ffn_mid[tok], name=f"layer{layer}.ffn_mid").q
        w_down = quantize_weights(down[ch], name=f"encoder.layer.{layer}.output.dense.weight")
        for mode in (Mode.FULL, Mode.DRAFT):
            await bench.gemm_case(f"minilm L{layer} down", "minilm", a_down, w_down, mode, traffic)


@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_random(dut, traffic):
    """Random GEMMs with ragged edges in every mode, and a raw random beat sequence."""
    bench = await _bench(dut, f"test_random-{traffic}", traffic)
    with bench.summary():
        params = load_params()
        rng = bench.rng("operands")
        m = 2 * bench.config.rows + 1
        n = 2 * channels_per_block(Mode.FULL, bench.config.lanes) + 1
        a_q = rng.integers(-128, 128, (m, 3 * GROUP)).astype(np.int8)
        qw = _random_weights(rng, n, 3 * GROUP, "random")
        for mode in Mode:
            await bench.gemm_case("random gemm", "random", a_q, qw, mode, traffic)
        beats = _random_beats(bench.rng("beats"), int(params.get("random_beats", 200)),
                              bench.config)
        await bench.beats_case("random beats (mixed modes)", "random", beats, traffic)


@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_corners(dut, traffic):
    """-128/127 codes, all-zero groups (scale 0), subnormal scales, FP16 max scale driving
    int64 saturation with the sticky flag."""
    bench = await _bench(dut, f"test_corners-{traffic}", traffic)
    with bench.summary():
        rng = bench.rng("operands")
        m = 2 * bench.config.rows
        n = 2 * channels_per_block(Mode.FULL, bench.config.lanes)

        # Extremes: every code and activation -128 or 127 (the quantizer never emits -128; the
        # datapath must still take it), a few scales from the smallest normal to the largest.
        a_q = rng.choice(np.array([-128, 127], np.int8), (m, 2 * GROUP))
        q = rng.choice(np.array([-128, 127], np.int8), (n, 2 * GROUP))
        scales = np.array([1.0, 2.0 ** -14, 0.5, 65504.0, 3.0], np.float16)
        qw = QuantizedWeight(q=q, scale=rng.choice(scales, (n, 2)), name="extremes")
        for mode in Mode:
            await bench.gemm_case("corner -128/127", "corner", a_q, qw, mode, traffic)

        # All-zero groups: scale 0 from the quantizer; and scale 0 under nonzero codes, which
        # must contribute nothing (a DRAFT of a zero group is 16*0 + 8 = 8, times scale 0).
        w = rng.standard_normal((n, 4 * GROUP))
        w[:, GROUP:2 * GROUP] = 0
        w[0] = 0
        qz = quantize_weights(w, name="zero-groups")
        if not ((qz.scale[:, 1] == 0).all() and (qz.scale[0] == 0).all()):
            bench.fail("corner zero groups", "the quantizer gave a nonzero scale to an all-zero "
                       "group", source="corner")
        a_q = rng.integers(-128, 128, (m, 4 * GROUP)).astype(np.int8)
        for mode in (Mode.FULL, Mode.DRAFT):
            await bench.gemm_case("corner zero groups", "corner", a_q, qz, mode, traffic)
        scale0 = np.asarray(qz.scale).copy()
        scale0[:, 2] = 0
        qz0 = QuantizedWeight(q=rng.integers(-128, 128, (n, 4 * GROUP)).astype(np.int8),
                              scale=scale0, name="scale0-nonzero-codes")
        for mode in (Mode.FULL, Mode.DRAFT):
            await bench.gemm_case("corner scale 0, codes != 0", "corner", a_q, qz0, mode, traffic)

        # Subnormal scales: tiny weights through the quantizer, and raw subnormal bit patterns.
        qs = quantize_weights(rng.standard_normal((n, 2 * GROUP)) * 1e-6, name="subnormal")
        if not (np.abs(qs.scale) < np.float16(2.0 ** -14)).all():
            bench.fail("corner subnormal scales", "the tiny weights did not get subnormal FP16 "
                       "scales", source="corner")
        a_q = rng.integers(-128, 128, (m, 2 * GROUP)).astype(np.int8)
        for mode in (Mode.FULL, Mode.DRAFT):
            await bench.gemm_case("corner subnormal scales", "corner", a_q, qs, mode, traffic)
        bits = np.array([0x0001, 0x03FF, 0x0200, 0x0155], np.uint16)
        qsb = QuantizedWeight(q=rng.integers(-128, 128, (n, 2 * GROUP)).astype(np.int8),
                              scale=rng.choice(bits, (n, 2)).view(np.float16),
                              name="subnormal-bits")
        await bench.gemm_case("corner subnormal bit patterns", "corner", a_q, qsb, Mode.FULL,
                              traffic)

        # Saturation: scale 65504 (the FP16 maximum), |psum| = 2^19 per group: each term is
        # 2047 * 2^48 ~ 2^59, so 16 groups pass 2^63. Rows: saturate high then come back down
        # (sticky flag stays set), saturate low, stay in range, zero.
        groups = 24
        k = groups * GROUP
        a_sat = np.zeros((m, k), np.int8)
        a_sat[0, :20 * GROUP] = -128
        a_sat[0, 20 * GROUP:] = 127
        a_sat[1 % m, :] = 127
        if m > 2:
            a_sat[2, :4 * GROUP] = -128
        q_sat = np.full((n, k), -128, np.int8)
        q_sat[1 % n] = 127
        if n > 2:
            q_sat[2, ::2] = 127
        qmax = QuantizedWeight(q=q_sat, scale=np.full((n, groups), 65504.0, np.float16),
                               name="fp16-max-scale")
        for mode in (Mode.FULL, Mode.DRAFT, Mode.MSB_ONLY):
            golden = gemm(a_sat, qmax, mode)
            if mode is Mode.FULL and not golden.overflow.any():
                bench.fail("corner int64 saturation", "the saturation corner does not saturate "
                           "in gemm()", source="corner", mode="FULL")
            await bench.gemm_case("corner int64 saturation", "corner", a_sat, qmax, mode, traffic)


@cocotb.test()
async def test_throughput(dut):
    """A long FULL GEMM with an always-valid source and an always-ready sink.

    Figure: accepted beats / (cycles from the first accepted beat to the last result, minus
    ``tile.latency``); 1.0 is one beat (one group-column per lane) per cycle. Checks that each
    result comes exactly ``tile.latency`` cycles after its ``last`` beat is accepted."""
    bench = await _bench(dut, "test_throughput")
    with bench.summary():
        params = load_params()
        target = int(params.get("throughput_beats", 1024))
        rows, lanes = bench.config.rows, bench.config.lanes
        rng = bench.rng("operands")
        m, n = 4 * rows, 4 * channels_per_block(Mode.FULL, lanes)
        groups = -(-target // 16)                  # 16 output blocks of `groups` beats each
        a_q = rng.integers(-127, 128, (m, groups * GROUP)).astype(np.int8)
        qw = _random_weights(rng, n, groups * GROUP, "throughput")
        beats = tile_schedule(a_q, qw, Mode.FULL, rows, lanes)
        run = await bench.stream(beats, rng=bench.rng("traffic"))
        details = list(run.errors)
        values, bad = bench.compare_results(run.results, ref_tile(beats), details,
                                            run.result_cycles)
        golden = gemm(a_q, qw, Mode.FULL)
        gvalues, gbad = int(golden.acc.size), int(2 * golden.acc.size)
        if len(run.results["mode"]) == run.expected:
            got = tile_assemble(run.results, m, n, Mode.FULL, rows, lanes)
            gvalues, gbad = bench.compare_acc(got, golden, ("RTL GEMM", "gemm()"), details)
        nbeats = len(beats["mode"])
        first, last_result = run.accept_cycles[0], run.end_cycle
        span = last_result - first + 1 - bench.latency
        fraction = nbeats / span if span > 0 else 0.0
        last_idx = np.flatnonzero(beats["last"])
        lat_bad = 0
        for i, (b, rc) in enumerate(zip(last_idx, run.result_cycles)):
            if rc - run.accept_cycles[b] != bench.latency:
                lat_bad += 1
                if len(details) < MAX_DETAILS:
                    details.append(f"result {i}: {rc - run.accept_cycles[b]} cycles after its last "
                                   f"beat, tile.latency says {bench.latency}")
        stalls = (run.accept_cycles[-1] - first + 1) - nbeats
        if stalls:
            details.append(f"the tile refused {stalls} beat-cycle(s) although the sink was always "
                           f"ready (documented: one beat per cycle)")
        cycles_per_second = run.cycles / run.wall_seconds if run.wall_seconds else 0.0
        bench.record(case="throughput", source="random", mode="FULL", traffic="always",
                     shape=[m, groups * GROUP, n], beats=nbeats, results=run.expected,
                     cycles=run.cycles, tile_values=values, gemm_values=gvalues,
                     comparisons=values + gvalues,
                     mismatches=bad + gbad + len(run.errors) + lat_bad + (1 if stalls else 0),
                     overflowed=int(golden.overflow.sum()), details=details,
                     latency=bench.latency, first_accept=first, last_result=last_result,
                     fraction=fraction, wall_seconds=run.wall_seconds,
                     cycles_per_second=cycles_per_second)
        dut._log.info("throughput: %d beats, first accept cycle %d, last result cycle %d, latency "
                      "%d -> %.4f beats/cycle; %.0f simulated cycles/s", nbeats, first,
                      last_result, bench.latency, fraction, cycles_per_second)


@cocotb.test()
async def test_clock_rate(dut):
    """Baseline for the bench's simulation speed: the same DUT with only the clock running
    and one coroutine awaiting each rising edge (no stream traffic, no payload packing)."""
    bench = await _bench(dut, "test_clock_rate")
    with bench.summary():
        cycles = int(load_params().get("clock_cycles", 5000))
        wall = time.perf_counter()
        for _ in range(cycles):
            await RisingEdge(dut.clk)
        wall = time.perf_counter() - wall
        bench.record(case="clock only", source="baseline", mode=None, traffic="idle", shape=None,
                     beats=0, results=0, cycles=cycles, tile_values=0, gemm_values=0,
                     comparisons=0, mismatches=0, overflowed=0, details=[], wall_seconds=wall,
                     cycles_per_second=cycles / wall if wall else 0.0)


# -- host side -------------------------------------------------------------------------------

#: Test names in the order the host runs and reports them.
TESTS = ("test_minilm", "test_random", "test_corners", "test_throughput", "test_clock_rate")


#: A host-side run of this bench: the runner's result and the case records (dicts, see
#: :meth:`TileBench.record`) of every test that ran, in run order.
TileBenchResult = BenchResult


def build_tile(config: TileConfig, *, waves=None, root=None):
    """Verilog + Verilator build of ``TensorTile(config=config)`` (reused when unchanged),
    under ``root`` (default :func:`~elmoe3d.sim.runner.build_root`)."""
    from .runner import build
    return build(TensorTile(config=config), name=f"tile_r{config.rows}_l{config.lanes}",
                 toplevel="tensor_tile", waves=waves, root=root,
                 verilog_key={"TensorTile": repr(config)})


def run_tile_bench(config: TileConfig, *, tests=None, seed=None, waves=None, params=None,
                   built=None, check=True) -> TileBenchResult:
    """Build (or reuse) the tile and run the named tests of this bench (default: all).

    ``params`` are merged over ``{"tile": config, "traces": default_traces()}``. With
    ``check=True`` a failing test raises :class:`~elmoe3d.sim.runner.SimulationFailure`;
    records are read from the run folder's ``summary-*.json`` files either way."""
    built = built or build_tile(config, waves=waves)
    merged = {"tile": {"rows": config.rows, "lanes": config.lanes},
              "traces": str(default_traces()), **(params or {})}
    return run_bench(built, test_module=__name__, tests=tests, default_tests=TESTS,
                     params=merged, prefix="bench_tile", seed=seed, check=check)

"""cocotb bench of the processing element, :class:`elmoe3d.hw.pe.PE`: whole SwiGLU experts and
MoE layers from a command stream (paper Sections 4.1, 5.2, Fig. 10b).

Run through :mod:`elmoe3d.sim.runner` (never directly): the runner builds the PE's Verilog and
writes ``params.json`` (read with :func:`~elmoe3d.sim.runner.load_params`)::

    {"arch": "small",                           # preset name (or an ArchConfig dict)
     "routing": "/path/gsm8k_2_routing.jsonl",  # real Mixtral-8x7B routing (top-2 of 8)
     "hidden": 64, "intermediate": 96,          # synthetic expert shape
     "batches": [1, 4, 16],                     # tokens per MoE layer (trace test)
     "modes": ["DRAFT", "FULL"]}

Every case builds a PE program with :func:`elmoe3d.sw.golden.expert.build_moe_program` (the expert
builder: quantization, weight layout, WMEM buffer-fulls with double buffering), runs it on the
RTL with a cocotb driver per stream (``cmd``, ``ld``, ``link_i`` sources with optional idle
cycles that drive garbage payloads; ``o``, ``link_o`` sinks with optional backpressure; a
monitor per output checking that an offered beat stays valid and unchanged until taken), and
compares with plain equality:

* every ``o`` DATA beat and ``link_o`` word against the functional simulator
  (:mod:`elmoe3d.sw.golden.pe`) running the same program and ``ld`` stream;
* the decoded FP32 output ``[T, H]`` (as bits) against the golden MoE layer
  :func:`elmoe3d.sw.golden.expert.ref_moe` (no program involved);
* the STATUS beat's functional counters against fsim and its sticky flags (accumulator
  overflow, VPU saturation) against both fsim and ``ref_moe``.

Expert weights and token activations are synthetic (seeded Gaussians); the routing -- which
experts each token runs through and with what gate weight -- is the real Mixtral trace
(``traces/gsm8k_2_routing.jsonl``, one JSON line per problem, layer and decode token). Each
test writes ``summary-<test>.json`` (case records) into the run folder, then fails if any case
had a mismatch. Seeds: :func:`~elmoe3d.sim.runner.resolve_seed`, one generator per case.

Tests: ``test_trace_moe`` (batches 1, 4, 16; DRAFT and FULL; I larger than one WMEM buffer),
``test_corners`` (all-zero token, SiLU-saturating gate pre-activations, accumulator saturation
with the sticky flag read back through STATUS), each with ``traffic`` = ``smooth`` or
``stalls`` (:mod:`elmoe3d.sim.traffic`); ``test_hb_roofline`` (MoE layers and single experts
with the ``ld`` stream paced at the HB bank rate: cycles against the HB-bandwidth roofline and
PE-array utilization; the definitions are in its docstring); ``test_psum_split`` (the verify
phase's MSB/LSB split on one PE: an MSB_ONLY GEMM with ``psum_in`` fed, on ``link_i``, the
LSB_ONLY psums another PE would send, against fsim and the golden FULL GEMM; ``smooth`` or
``stalls``); ``test_real_expert`` (one expert of a real model's shape, ``real_shapes`` /
``real_tokens`` / ``real_modes``, through the streamed expert program of
:mod:`elmoe3d.sw.golden.expert_stream` at the HB rate; needs a PE as large as the ``mid``
preset's, so it is not among the default tests); ``test_paper_group_root`` (the root PE's
program of one real-shape expert split over a PE group, ``paper_shape`` default OLMoE-1B-7B,
its ``link_i`` words from the functional group run; on the paper PE under ``make
sim-paper-pe``, :mod:`elmoe3d.sim.paper_pe`; not among the default tests).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import cocotb
from cocotb.triggers import RisingEdge

from ..config import ArchConfig, PEOptions, preset
from ..hw.pe import PE
from ..isa import Sink, Target
from ..sw.golden import asm, pe as fsim
from ..sw.golden.asm import OKind
from ..sw.host.corpus import routing_path
from ..sw.golden.datapath import Mode, gemm
from ..sw.golden.expert import Expert, build_moe_program, ref_moe
from ..sw.host.compiler import synthetic_experts
from ..sw.golden.quant import quantize_weights
from . import cocotb_streams as streams
from .records import (BenchResult, CaseRecorder, arch_from_params, arch_param, failed_cases,
                      run_bench)
from .runner import case_rng, load_params, resolve_seed
from .traffic import BENCH_TRAFFIC, traffic as pattern


#: Differences recorded in detail per case.
MAX_DETAILS = 8
#: Default synthetic expert shape: I = 96 spans three WMEM buffer-fulls of up/gate weights
#: (and two of down weights) on the small PE.
DEFAULTS = {"arch": "small", "hidden": 64, "intermediate": 96, "experts": 8,
            "batches": [1, 4, 16], "modes": ["DRAFT", "FULL"],
            "layers": {"1": 0, "4": 15, "16": 31}, "problem": 0}
SYNTHETIC_NOTE = ("expert weights and token activations are synthetic (seeded Gaussians); "
                  "the routing (expert ids and gate weights) is the real Mixtral-8x7B trace")


def default_routing() -> Path:
    """The real Mixtral GSM8K routing trace (:func:`elmoe3d.sw.host.corpus.routing_path`)."""
    return routing_path("gsm8k")


def read_routing(path, *, problem: int, layer: int, tokens: int, n_experts: int = 8):
    """``(ids int64 [T, 2], weights float64 [T, 2], token_idx [T])`` of the first ``tokens``
    decode tokens of ``problem`` at ``layer`` (records sorted by token index; missing records
    are skipped, as the trace README says a few are). Raises ``ValueError`` naming the file
    (and line) if a line is not a JSON record with the fields read, fewer records exist or an
    id is out of range. (The bench's own reader of the ``../shared/traces`` format; a user's
    log goes through :func:`elmoe3d.sw.host.trace.import_vllm_jsonl`, which ``elmoe3d sim``
    also runs on this file before it builds anything.)"""
    recs, fields = [], ("problem_id", "layer", "token_idx", "experts", "gating_probs")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON ({exc})") from None
            missing = [k for k in fields if not isinstance(r, dict) or k not in r]
            if missing:
                raise ValueError(f"{path}:{lineno}: a routing record needs the fields "
                                 f"{', '.join(fields)}; missing {', '.join(missing)}")
            if r["problem_id"] == problem and r["layer"] == layer:
                recs.append(r)
    recs.sort(key=lambda r: r["token_idx"])
    if len(recs) < tokens:
        raise ValueError(f"{path}: only {len(recs)} records for problem {problem}, layer "
                         f"{layer}; need {tokens}")
    recs = recs[:tokens]
    ids = np.array([r["experts"] for r in recs], np.int64)
    wts = np.array([r["gating_probs"] for r in recs], np.float64)
    if ids.min() < 0 or ids.max() >= n_experts:
        raise ValueError(f"{path}: expert ids outside 0..{n_experts - 1}")
    return ids, wts, np.array([r["token_idx"] for r in recs], np.int64)


# -- the stream harness ----------------------------------------------------------------------

@dataclass
class PERun:
    """What one program did on the DUT."""

    o: list                            # (kind, data int) per accepted o beat
    link_o: list                       # accepted link_o words
    start_cycle: int
    end_cycle: int
    errors: list = field(default_factory=list)
    wall_seconds: float = 0.0
    first_cmd_cycle: int | None = None
    o_cycles: list = field(default_factory=list)       # the cycle each o beat was taken

    @property
    def cycles(self) -> int:
        """Cycles from the first command accepted (offered, if none was) to the last output
        taken, both counted."""
        start = self.start_cycle if self.first_cmd_cycle is None else self.first_cmd_cycle
        return self.end_cycle - start + 1


class _DataBeats:
    """The DATA beats of an RTL run as :meth:`StreamedJob.decode` reads them (``.data()``, as
    an fsim result has)."""

    def __init__(self, words, pe):
        self.words, self.pe = list(words), pe

    def data(self) -> np.ndarray:
        if not self.words:
            return np.zeros((0, self.pe.fp32_per_beat), np.float32)
        return asm.unpack_fp32(asm.ints_to_words(self.words, self.pe), self.pe)


class PEBench(CaseRecorder):
    """Clock, reset, stream drivers, monitors and comparisons for one PE DUT."""

    def __init__(self, dut, arch: ArchConfig, seed: int, test: str, traffic: str = "-"):
        self.dut = dut
        self.traffic = traffic
        self.arch = arch
        self.pe = arch.pe
        self.seed = seed
        self.test = test
        options = PEOptions(config=arch)         # the DUT's: PE(config=arch), build_pe
        self.tile_latency = options.tile_latency
        self.sink_latency = {int(k): v for k, v in options.sink_latency.items()}
        self.records = []
        self.note = SYNTHETIC_NOTE                 # what the finish line says about the data
        self.word_mask = (1 << self.pe.word_bits) - 1

    cycle = staticmethod(streams.cycle)

    def rng(self, case: str) -> np.random.Generator:
        return case_rng(self.seed, f"{self.test}/{case}")

    async def start(self):
        dut = self.dut
        await streams.start(dut, [f"{port}__{sig}" for port in ("cmd", "ld", "link_i")
                                  for sig in ("valid", "payload")] + ["o__ready", "link_o__ready"])
        dut._log.info("PE %s: rows=%d lanes=%d W=%d bits, WMEM %d words/plane/buffer; tile "
                      "latency %d, sink latencies %s; seed %d", self.arch.name, self.pe.rows,
                      self.pe.lanes, self.pe.word_bits, self.pe.wmem_words, self.tile_latency,
                      self.sink_latency, self.seed)

    async def run(self, program, ld, link_i=(), *, n_o, n_link, rng, traffic,
                  ld_rate=None) -> PERun:
        """Drive the encoded ``program`` and the ``ld`` / ``link_i`` streams; collect ``o`` and
        ``link_o`` until ``n_o`` beats and ``n_link`` words came out (or a deadline), then
        drain: nothing more may come out."""
        dut = self.dut
        flow = pattern(traffic).for_ports("cmd", "ld", "link_i", "o", "link_o")
        o_raw, o_cyc, l_raw, l_cyc, errors = [], [], [], [], []
        W = self.pe.word_bits
        mons = [cocotb.start_soon(streams.monitor(dut, "o", o_raw, o_cyc, errors)),
                cocotb.start_soon(streams.monitor(dut, "link_o", l_raw, l_cyc, errors)),
                cocotb.start_soon(streams.drive_ready(dut, "o", rng,
                                                     flow.backpressure_at("o"))),
                cocotb.start_soon(streams.drive_ready(dut, "link_o", rng,
                                                     flow.backpressure_at("link_o")))]
        cmd_log = []
        idle = flow.idle_at
        srcs = [cocotb.start_soon(streams.offer(dut, "cmd", program, rng, idle("cmd"), bits=128,
                                                log=cmd_log)),
                cocotb.start_soon(streams.offer(dut, "ld", ld, rng, idle("ld"), bits=W,
                                                rate=ld_rate)),
                cocotb.start_soon(streams.offer(dut, "link_i", link_i, rng, idle("link_i"),
                                                bits=W))]
        start = self.cycle()
        wall = time.perf_counter()
        budget = 200 + 40 * (len(program) + len(ld) + len(link_i)) + 8 * n_o
        deadline = start + int(budget / (1 - flow.idle) / (1 - flow.backpressure))
        while (not all(s.done() for s in srcs) or len(o_raw) < n_o or len(l_raw) < n_link) \
                and self.cycle() < deadline:
            await RisingEdge(dut.clk)
        if self.cycle() >= deadline:
            errors.append(f"deadline: {len(o_raw)}/{n_o} o beats, {len(l_raw)}/{n_link} link "
                          f"words after {self.cycle() - start} cycles "
                          f"(sources done: {[s.done() for s in srcs]})")
        ends = o_cyc[-1:] + l_cyc[-1:]
        end = max(ends) if ends else self.cycle()
        wall = time.perf_counter() - wall
        for task in srcs + mons[2:]:
            task.cancel()
        dut.o__ready.value = 1
        dut.link_o__ready.value = 1
        for port in ("cmd", "ld", "link_i"):
            getattr(dut, f"{port}__valid").value = 0
        for _ in range(64):
            await RisingEdge(dut.clk)
        for task in mons[:2]:
            task.cancel()
        dut.o__ready.value = 0
        dut.link_o__ready.value = 0
        if len(o_raw) > n_o or len(l_raw) > n_link:
            errors.append(f"extra output: {len(o_raw)} o beats (expected {n_o}), {len(l_raw)} "
                          f"link words (expected {n_link})")
        o = [(raw & 1, raw >> 1) for raw in o_raw]          # kind in bit 0, data above
        return PERun(o=o, link_o=l_raw, start_cycle=start, end_cycle=end, errors=errors,
                     wall_seconds=wall, first_cmd_cycle=cmd_log[0] if cmd_log else None,
                     o_cycles=o_cyc)

    # -- one program, all comparisons --

    async def moe_case(self, case, source, x, experts, routing, mode, traffic, *, extra=None,
                       ld_rate=None):
        """Build the MoE program, run it on the RTL, fsim and ref_moe, compare, record.
        ``ld_rate`` (words per cycle) paces the ``ld`` stream (the HB bank rate)."""
        mode = Mode[mode] if isinstance(mode, str) else Mode(mode)
        job = build_moe_program(x, experts, routing, mode, self.arch)
        gold = ref_moe(x, experts, routing, mode)
        inter = int(experts[0][0].shape[0] if isinstance(experts[0], tuple)
                    else experts[0].intermediate)
        return await self.job_case(case, source, job, gold, mode, traffic, routing=routing,
                                   intermediate=inter, extra=extra, ld_rate=ld_rate)

    async def job_case(self, case, source, job, gold, mode, traffic, *, routing, intermediate,
                       extra=None, ld_rate=None):
        """Run a prebuilt ``job`` (a :class:`~elmoe3d.sw.golden.expert.PEJob`: the MoE builder's
        or the streamed expert builder's) on the RTL and on fsim, compare every ``o`` beat and
        ``link_o`` word with fsim, the decoded output with ``gold`` (``ref_moe``'s result) bit
        for bit (the RTL's DATA beats through ``job.decode``), the STATUS counters and flags;
        record the case."""
        mode = Mode[mode] if isinstance(mode, str) else Mode(mode)
        ref = job.run_fsim()
        run = await self.run(job.program.encode(), job.ld, n_o=len(ref.o),
                             n_link=len(ref.link_o), rng=self.rng(f"{case}/{mode.name}/{traffic}"),
                             traffic=traffic, ld_rate=ld_rate)
        details = list(run.errors)
        mismatches = len(run.errors)
        comparisons = 0
        # o beats and link words vs fsim, word for word
        for i, want in enumerate(ref.o):
            comparisons += 1
            if i >= len(run.o):
                mismatches += 1
                continue
            kind, data = run.o[i]
            when = f" ({streams.handshake_at(run.o_cycles[i])})" \
                if i < len(run.o_cycles) else ""
            if kind != int(want.kind):
                mismatches += 1
                details.append(f"o beat {i}{when}: kind {kind}, fsim {int(want.kind)}")
            elif kind == OKind.DATA and data != want.data:
                mismatches += 1
                if len(details) < MAX_DETAILS:
                    details.append(f"o beat {i}{when}: DATA differs from fsim")
        for i, want in enumerate(ref.link_o):
            comparisons += 1
            if i >= len(run.link_o) or run.link_o[i] != want:
                mismatches += 1
        # decoded output vs the golden MoE layer (FP32 bits)
        data = [d for k, d in run.o if k == OKind.DATA]
        y = None
        try:
            y = job.decode(_DataBeats(data, self.pe))
        except Exception as exc:                       # noqa: BLE001 - recorded as a mismatch
            details.append(f"decode: {type(exc).__name__}: {exc}")
        if y is not None and y.shape != gold.y.shape:
            details.append(f"decoded shape {y.shape}, ref_moe {gold.y.shape}")
            y = None
        if y is not None:
            bad = y.view(np.uint32) != gold.y.view(np.uint32)
            comparisons += int(bad.size)
            mismatches += int(bad.sum())
            for t, c in zip(*np.nonzero(bad)):
                if len(details) < MAX_DETAILS:
                    details.append(f"y[{t}, {c}]: RTL {y[t, c]!r}, ref_moe {gold.y[t, c]!r}")
        else:
            comparisons += job.tokens * job.hidden
            mismatches += job.tokens * job.hidden
            details.append(f"only {len(data)} DATA beats")
        # STATUS: functional counters vs fsim, sticky flags vs fsim and ref_moe
        st_rtl = [asm.unpack_status(d) for k, d in run.o if k == OKind.STATUS]
        st_ref = ref.statuses()
        status = st_rtl[-1] if st_rtl else {}
        for got, want in zip(st_rtl, st_ref):
            for name in asm.FUNCTIONAL_STATUS_FIELDS:
                comparisons += 1
                if got[name] != want[name]:
                    mismatches += 1
                    details.append(f"STATUS.{name}: RTL {got[name]}, fsim {want[name]}")
        if len(st_rtl) != len(st_ref):
            mismatches += 1
            details.append(f"{len(st_rtl)} STATUS beats, fsim {len(st_ref)}")
        flags = (bool(status.get("acc_overflow")), bool(status.get("vpu_saturation")))
        comparisons += 2
        if flags != (gold.acc_overflow, gold.vpu_saturation):
            mismatches += 1
            details.append(f"flags (acc_overflow, vpu_saturation): RTL {flags}, ref_moe "
                           f"{(gold.acc_overflow, gold.vpu_saturation)}")
        ids = np.asarray(routing[0])
        used = sorted(set(int(e) for e in ids.reshape(-1) if e >= 0))
        beats = int(status.get("gemm_beats", 0))
        wbytes = self.pe.word_bytes * sum(c.fields["words"] for c in job.program
                                          if c.op.name == "LOAD" and c.fields["target"] <= 2)
        rec = dict(case=case, source=source, mode=mode.name, traffic=traffic,
                   tokens=int(job.tokens), hidden=int(job.hidden),
                   intermediate=int(intermediate),
                   experts_run=used, commands=len(job.program), ld_words=len(job.ld),
                   gemm_beats=beats, cycles=run.cycles, weight_bytes=wbytes,
                   ld_bytes=self.pe.word_bytes * len(job.ld),
                   beats_per_cycle=beats / run.cycles if run.cycles else 0.0,
                   status={k: int(v) for k, v in status.items()},
                   acc_overflow=flags[0], vpu_saturation=flags[1],
                   comparisons=comparisons, mismatches=mismatches, details=details[:MAX_DETAILS],
                   wall_seconds=run.wall_seconds,
                   cycles_per_second=run.cycles / run.wall_seconds if run.wall_seconds else 0.0,
                   note=SYNTHETIC_NOTE)
        rec.update(extra or {})
        return self.record(**rec)

    def record(self, **rec):
        rec.setdefault("test", self.test)
        self.records.append(rec)
        self.dut._log.info("%-30s %-5s %-6s T=%-3d experts %-16s %6d cycles %5d beats "
                           "flags %d%d %6d values %d mismatches", rec["case"], rec["mode"],
                           rec["traffic"], rec["tokens"], rec["experts_run"], rec["cycles"],
                           rec["gemm_beats"], rec["acc_overflow"], rec["vpu_saturation"],
                           rec["comparisons"], rec["mismatches"])
        for line in rec.get("details", []):
            self.dut._log.error("  %s: %s", rec["case"], line)
        return rec

    def fail(self, case, message, *, source="bench", mode="-", traffic=None):
        """Record a failed check that compares no values (a bench precondition, an aborted
        test) as a case with one mismatch, so it shows in the summary and fails the test."""
        return self.record(case=case, source=source, mode=mode,
                           traffic=traffic or self.traffic, tokens=0, experts_run=[],
                           cycles=0, gemm_beats=0, acc_overflow=False, vpu_saturation=False,
                           comparisons=0, mismatches=1, details=[message], error=message)

    def finish(self):
        """Write the summary; fail (AssertionError) if any case mismatched or failed."""
        path = self.write_summary()
        bad = [r for r in self.records if r["mismatches"]]
        total = sum(r["comparisons"] for r in self.records)
        self.dut._log.info("%s: %d cases, %d values compared, %d failing case(s); %s; "
                           "summary %s", self.test, len(self.records), total, len(bad),
                           self.note, path)
        assert not bad, f"{len(bad)} case(s) failed (seed {self.seed}): " + failed_cases(bad)


async def _bench(dut, test, traffic="-") -> PEBench:
    bench = PEBench(dut, arch_from_params(load_params()), resolve_seed(), test, traffic)
    await bench.start()
    return bench


# -- tests -----------------------------------------------------------------------------------

@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_trace_moe(dut, traffic):
    """MoE layers on one PE, routed by the real Mixtral trace: batches of 1, 4 and 16 decode
    tokens, DRAFT and FULL, I larger than one WMEM buffer."""
    bench = await _bench(dut, f"test_trace_moe-{traffic}", traffic)
    with bench.summary():
        params = {**DEFAULTS, **load_params()}
        path = Path(params.get("routing") or default_routing())
        hidden, inter, n_exp = int(params["hidden"]), int(params["intermediate"]), \
            int(params["experts"])
        experts = synthetic_experts(bench.rng("experts"), n_exp, hidden, inter)
        dut._log.info("routing: %s; %d synthetic experts H=%d I=%d (%s)", path, n_exp, hidden,
                      inter, SYNTHETIC_NOTE)
        for batch in params["batches"]:
            layer = int(params["layers"].get(str(batch), 0))
            ids, wts, tok_idx = read_routing(path, problem=int(params["problem"]), layer=layer,
                                             tokens=int(batch), n_experts=n_exp)
            x = bench.rng(f"x/{batch}").standard_normal((int(batch), hidden))
            for mode in params["modes"]:
                await bench.moe_case(f"trace L{layer} batch {batch}", "mixtral-trace", x,
                                     experts, (ids, wts), mode, traffic,
                                     extra={"layer": layer, "trace_tokens": tok_idx.tolist(),
                                            "routing_file": path.name})


def _saturating_expert(rng, hidden, inter):
    """An expert whose up and gate GEMMs saturate the Q.24 accumulator for an input token of
    constant 127 (codes 127): codes -127 with the FP16 maximum scale (65504), so each of the
    H/32 >= 18 groups adds about -2^59 (the sum passes -2^63 at the 17th group)."""
    assert hidden // 32 >= 18, hidden
    big = np.full((inter, hidden), -127.0 * 65504.0)
    up = quantize_weights(big, name="up-max")
    assert (np.asarray(up.scale, np.float32) == 65504).all()
    gate = quantize_weights(big, name="gate-max")
    down = quantize_weights(rng.standard_normal((hidden, inter)) * 0.2, name="down")
    return Expert(up, gate, down)


def _silu_corner_expert(rng, hidden, inter):
    """An expert whose gate rows span tiny to huge magnitudes (both signs): pre-activations
    inside the sigmoid table, beyond +16 (silu = g), below -16 (silu = 0) and beyond the Q16.16
    range (saturation)."""
    mags = np.array([0.05, 0.5, 5.0, 60.0, -0.5, -5.0, -60.0, 1e5])
    gate = rng.standard_normal((inter, hidden)) * 0.05 + mags[np.arange(inter) % len(mags),
                                                              None] / hidden
    up = rng.standard_normal((inter, hidden)) * 0.2
    down = rng.standard_normal((hidden, inter)) * 0.2
    return (up, gate, down)


@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_corners(dut, traffic):
    """All-zero token; SiLU-saturating gate pre-activations; accumulator saturation with the
    sticky flag read back through STATUS."""
    bench = await _bench(dut, f"test_corners-{traffic}", traffic)
    with bench.summary():
        params = {**DEFAULTS, **load_params()}
        hidden, inter = int(params["hidden"]), int(params["intermediate"])
        rng = bench.rng("corners")
        experts = synthetic_experts(rng, 2, hidden, inter)
        x = rng.standard_normal((4, hidden))
        x[2] = 0.0
        ids = np.array([[0, 1], [1, 0], [0, 1], [1, -1]])
        wts = np.array([[0.6, 0.4], [0.75, 0.25], [0.5, 0.5], [1.0, 0.0]])
        for mode in ("DRAFT", "FULL"):
            rec = await bench.moe_case("all-zero token", "corner", x, experts, (ids, wts), mode,
                                       traffic)
        silu = _silu_corner_expert(rng, hidden, inter)
        xs = np.abs(rng.standard_normal((3, hidden))) + 0.5
        xs[1] *= -1.0
        for mode in ("DRAFT", "FULL"):
            rec = await bench.moe_case("SiLU-saturating gates", "corner", xs, [silu],
                                       (np.zeros((3, 1), np.int64), np.ones((3, 1))), mode,
                                       traffic)
            if not (rec["mismatches"] or rec["vpu_saturation"]):
                bench.fail("SiLU-saturating gates", "the SiLU corner did not saturate",
                           mode=mode)
        # H = 576: 18 groups per up/gate accumulation (OUT holds 2 rows of 576 on the small PE)
        sat_h = int(params.get("saturation_hidden", 576))
        sat = _saturating_expert(rng, sat_h, 32)
        xa = np.full((2, sat_h), 127.0)
        xa[1] = rng.standard_normal(sat_h)
        for mode in ("FULL",):
            rec = await bench.moe_case("accumulator saturation", "corner", xa, [sat],
                                       (np.zeros((2, 1), np.int64), np.ones((2, 1))), mode,
                                       traffic)
            if not (rec["mismatches"] or rec["acc_overflow"]):
                bench.fail("accumulator saturation", "the saturation corner did not saturate",
                           mode=mode)


@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_psum_split(dut, traffic):
    """Psum-level synchronisation (paper 5.2, ``docs/pe.md`` psum_in): the PE holds only the
    MSB plane of a weight (as from HB) and runs an MSB_ONLY GEMM with ``psum_in`` to RAW; its
    ``link_i`` carries the LSB_ONLY RAW psums of the same activations and LSB plane (what the
    PE fetching the LSB slices from EXT sends, computed by fsim). The RAW words must equal
    fsim's and decode to the golden FULL GEMM (``sw.golden.datapath.gemm``) bit for bit."""
    bench = await _bench(dut, f"test_psum_split-{traffic}", traffic)
    with bench.summary():
        pe = bench.pe
        rng = bench.rng("psum-split")
        m, n, k = 2 * pe.rows + 1, 3 * pe.lanes, 160           # K: 5 groups per result
        a_q = rng.integers(-127, 128, (m, k)).astype(np.int8)
        qw = quantize_weights(rng.standard_normal((n, k)) * np.exp(
            rng.standard_normal((n, 1))), name="psum-split")
        msb, lsb, scl = asm.pack_weight_matrix(qw.q, qw.scale, pe)
        acts = asm.pack_act_matrix(a_q, pe)
        G, rbn, cbn = k // 32, -(-m // pe.rows), -(-n // pe.lanes)
        geo = dict(wbuf=0, act_base=0, w_base=0, row_blocks=rbn, col_blocks=cbn, groups=G,
                   sink=Sink.RAW, wait=True, release=True)

        def program(mode, plane, psum_in):
            prog = asm.Program(pe)
            prog.load(Target.ACT, 0, len(acts))
            prog.load(Target.WLSB if mode is Mode.LSB_ONLY else Target.WMSB, 0, len(plane))
            prog.load(Target.WSCALE, 0, len(scl), signal=True)
            prog.gemm(mode=mode, psum_in=psum_in, **geo)
            prog.barrier()
            prog.status()
            return prog, asm.words_to_ints(np.concatenate([acts, plane, scl]))

        lsb_prog, lsb_ld = program(Mode.LSB_ONLY, lsb, False)
        psums = fsim.run(lsb_prog, lsb_ld).link_o
        prog, ld = program(Mode.MSB_ONLY, msb, True)
        ref = fsim.run(prog, ld, psums)
        run = await bench.run(prog.encode(), ld, psums, n_o=len(ref.o), n_link=len(ref.link_o),
                              rng=bench.rng(f"psum-split/{traffic}"), traffic=traffic)
        details, comparisons = list(run.errors), 0
        mismatches = len(run.errors)
        for i, want in enumerate(ref.link_o):
            comparisons += 1
            if i >= len(run.link_o) or run.link_o[i] != want:
                mismatches += 1
                if len(details) < MAX_DETAILS:
                    details.append(f"link_o word {i} differs from fsim")
        st_rtl = [asm.unpack_status(d) for kind, d in run.o if kind == OKind.STATUS]
        status = st_rtl[-1] if st_rtl else {}
        for name in asm.FUNCTIONAL_STATUS_FIELDS:
            comparisons += 1
            if status.get(name) != ref.statuses()[0][name]:
                mismatches += 1
                details.append(f"STATUS.{name}: RTL {status.get(name)}, fsim "
                               f"{ref.statuses()[0][name]}")
        want = gemm(a_q, qw, Mode.FULL).acc                      # [m, n]
        if len(run.link_o) == len(ref.link_o):
            vals = asm.unpack_q24(asm.ints_to_words(run.link_o, pe), pe)
            acc = vals.reshape(cbn, rbn, pe.rows, pe.lanes).transpose(1, 2, 0, 3)
            acc = acc.reshape(rbn * pe.rows, cbn * pe.lanes)[:m, :n]
            bad = acc != want
            comparisons += int(bad.size)
            mismatches += int(bad.sum())
            for r, c in list(zip(*np.nonzero(bad)))[:2]:
                details.append(f"acc[{r}, {c}]: RTL {acc[r, c]}, golden FULL {want[r, c]}")
        else:
            comparisons += want.size
            mismatches += want.size
        beats = int(status.get("gemm_beats", 0))
        bench.record(case="MSB_ONLY + LSB psum_in", source="synthetic", mode="MSB_ONLY",
                     traffic=traffic, tokens=m, experts_run=[], cycles=run.cycles,
                     gemm_beats=beats, link_i_words=len(psums),
                     beats_per_cycle=beats / run.cycles if run.cycles else 0.0,
                     acc_overflow=bool(status.get("acc_overflow")),
                     vpu_saturation=bool(status.get("vpu_saturation")),
                     comparisons=comparisons, mismatches=mismatches, details=details,
                     note="activations and weights are synthetic (seeded)")


#: Roofline cases: (kind, label). ``moe``: a MoE layer, every expert the real trace routes a
#: token to, back to back on one PE (the steady state); ``expert``: one expert over all tokens.
ROOFLINE_KINDS = (("moe", "MoE layer"), ("expert", "one expert"))


def ld_rate_words(arch: ArchConfig, value="hb") -> float:
    """The ``ld`` pacing of a bench parameter, in words per cycle: ``"hb"`` (default) the HB
    bank rate (``hb_bytes_per_cycle`` / word bytes: 0.8 on the small PE, 0.4 on mid, 0.1 on
    the paper PE), ``"full"`` the ``ld`` port's own rate (one word a cycle: the fastest the
    default PE takes words, so the PE, not HB, bounds it; a PE whose memories are written in
    P parts, ``PEOptions.load_word_cycles``, takes a word every P cycles, so there "full"
    overstates what reaches the memories), or a number in (0, 1].

    Raises ``ValueError`` naming the value otherwise."""
    if value is None or str(value).lower() == "hb":
        return arch.hb_ld_words_per_cycle
    if str(value).lower() == "full":
        return 1.0
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = float("nan")
    if not 0 < rate <= 1:
        raise ValueError(f"ld rate {value!r}: expected 'hb', 'full' or words per cycle in "
                         f"(0, 1]")
    return rate


def roofline_figures(rec, arch: ArchConfig, macs: int, ld_rate=None):
    """Add the roofline and utilization figures to a case record of :meth:`PEBench.moe_case`
    (see :func:`test_hb_roofline` for the definitions). ``ld_rate``: the words per cycle the
    ``ld`` stream was paced at (default the HB bank rate); the memory term of the roofline is
    the ld bytes at that rate. Also ``macs_per_cycle`` = useful MACs / measured cycles beside
    ``peak_macs_per_cycle`` (Table 1's per-PE peak at the mode's weight width: rows x lanes x
    group MACs a cycle at W4, half that at W8)."""
    hb = arch.hb_bytes_per_cycle
    ld_bytes_per_cycle = hb if ld_rate is None else float(ld_rate) * arch.pe.word_bytes
    mem = rec["ld_bytes"] / ld_bytes_per_cycle
    beats = rec["gemm_beats"]
    bits = 4 if rec["mode"] == "DRAFT" else 8
    peak = arch.tile.peak_macs_per_cycle(bits)
    cycles = rec["cycles"] or 1
    rec.update(
        hb_bytes_per_cycle=hb, memory_cycles=mem, roofline_cycles=max(mem, beats),
        roofline_bound="memory" if mem >= beats else "compute",
        roofline_fraction=max(mem, beats) / cycles,
        roofline_fraction_all_ld=max(mem, beats) / cycles,
        roofline_fraction_weights=max(rec["weight_bytes"] / ld_bytes_per_cycle, beats) / cycles,
        ld_bytes_per_cycle=ld_bytes_per_cycle,
        beat_utilization=beats / cycles, useful_macs=int(macs), weight_bits=bits,
        peak_macs_per_cycle=peak, macs_per_cycle=macs / cycles,
        mac_utilization=macs / (peak * cycles))
    return rec


@cocotb.test()
async def test_hb_roofline(dut):
    """Cycles of whole experts on one PE against the HB-bandwidth roofline, the ``ld`` stream
    paced at the HB bank rate, outputs always ready; bit-exact against fsim and ``ref_moe``.

    Cases, for each batch of ``roofline_batches`` tokens (default 1: memory-bound, and 16:
    compute-bound) and each mode (DRAFT: MSB planes only; FULL): a **MoE layer** (``moe``:
    every expert the real Mixtral trace routes one of the tokens to, top-2 of 8 synthetic
    experts, run back to back in one program: the steady state of the paper's design) and
    **one expert** over all the tokens (``expert``). Experts are ``hidden`` x
    ``roofline_intermediate`` (default 64 x 256).

    Definitions (per case, the whole program as measured):

    * HB rate: ``hb_bank_gbps / clock_ghz`` bytes per cycle (51.2 B at 1 GHz: 0.8 ``ld``
      words of 64 B on the small PE), by a token bucket that gains that many words per cycle
      and holds at most two, so a stalled PE cannot bank bandwidth.
    * roofline cycles = max(all ``ld`` bytes / HB bytes per cycle, tile beats at one per
      cycle); ``ld`` bytes count everything the program loads: weight planes, scales, token
      tables and activations. ``roofline_bound`` names the larger term.
    * measured cycles = from the cycle the first command is accepted to the cycle the last
      ``o`` beat (the final STATUS) is taken, both counted.
    * ``roofline_fraction`` = roofline cycles / measured cycles (target >= 0.95);
      ``roofline_fraction_all_ld`` is the same figure (kept for old readers);
      ``roofline_fraction_weights`` counts only the weight bytes in the memory term.
    * ``beat_utilization`` = tile beats / measured cycles; ``mac_utilization`` = useful MACs
      (3 H I per routed token and expert, padding rows excluded) / (peak MACs per cycle of the
      tile at the mode's weight width: 4 bits DRAFT, 8 bits FULL x measured cycles).
    """
    bench = await _bench(dut, "test_hb_roofline", "smooth")
    with bench.summary():
        params = {**DEFAULTS, **load_params()}
        hidden = int(params["hidden"])
        inter = int(params.get("roofline_intermediate", 256))
        n_exp = int(params["experts"])
        rate = bench.arch.hb_ld_words_per_cycle
        rng = bench.rng("roofline")
        experts = synthetic_experts(rng, n_exp, hidden, inter)
        path = Path(params.get("routing") or default_routing())
        kinds = params.get("roofline_kinds", [k for k, _ in ROOFLINE_KINDS])
        for tokens in params.get("roofline_batches", [1, 16]):
            tokens = int(tokens)
            x = rng.standard_normal((tokens, hidden))
            for kind, label in ROOFLINE_KINDS:
                if kind not in kinds:
                    continue
                if kind == "moe":
                    layer = int(params["layers"].get(str(tokens), 0))
                    ids, wts, _ = read_routing(path, problem=int(params["problem"]),
                                               layer=layer, tokens=tokens, n_experts=n_exp)
                    exps, routing = experts, (ids, wts)
                    extra = {"layer": layer, "routing_file": path.name}
                else:
                    exps = experts[:1]
                    routing = (np.zeros((tokens, 1), np.int64), np.ones((tokens, 1)))
                    extra = {}
                used = sorted({int(e) for e in np.asarray(routing[0]).reshape(-1) if e >= 0})
                routed = int((np.asarray(routing[0]) >= 0).sum())
                case = f"{label} T={tokens}" + (f" ({len(used)} experts)" if kind == "moe"
                                                  else "")
                for mode in ("DRAFT", "FULL"):
                    rec = await bench.moe_case(case, "roofline", x, exps, routing, mode,
                                               "smooth", ld_rate=rate,
                                               extra=dict(extra, kind=kind))
                    if rec["mismatches"] or not rec["cycles"]:
                        continue
                    roofline_figures(rec, bench.arch, routed * 3 * hidden * inter)
                    dut._log.info(
                        "  %s %s: %d cycles; ld %d B (%.0f cycles at the HB rate), %d beats "
                        "-> %.1f%% of the %s roofline; tile busy %.1f%%, MACs %.1f%% of peak",
                        rec["case"], mode, rec["cycles"], rec["ld_bytes"],
                        rec["memory_cycles"], rec["gemm_beats"],
                        100 * rec["roofline_fraction"], rec["roofline_bound"],
                        100 * rec["beat_utilization"], 100 * rec["mac_utilization"])


#: ``test_real_expert`` defaults: model presets (:data:`~elmoe3d.sw.host.models.MODEL_PRESETS`)
#: whose expert shape (``hidden`` x ``expert_intermediate``) is run, tokens per case, modes;
#: ``real_shape_tokens`` (preset name -> tokens) replaces ``real_tokens`` for a shape.
REAL_DEFAULTS = {"real_shapes": ["qwen3-30b-a3b"], "real_tokens": [1],
                 "real_modes": ["DRAFT", "FULL"], "real_shape_tokens": {},
                 "real_ld_rate": "hb"}


REAL_NOTE = ("expert weights (~N(0, 0.05)), token activations (~N(0, 1)) and gate weights "
             "(uniform 0.1..1) are synthetic (seeded); only the shape is the model's")


def real_expert_weights(rng, hidden, inter, tokens):
    """Synthetic expert of a real shape: ``(expert, x, gate_weights)`` with weights
    ~N(0, 0.05), x ~N(0, 1), gate weights uniform in 0.1..1."""
    wu = (rng.standard_normal((inter, hidden)) * 0.05).astype(np.float32)
    wg = (rng.standard_normal((inter, hidden)) * 0.05).astype(np.float32)
    wd = (rng.standard_normal((hidden, inter)) * 0.05).astype(np.float32)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    gw = rng.uniform(0.1, 1.0, tokens).astype(np.float32)
    return Expert.quantize(wu, wg, wd), x, gw


@cocotb.test()
async def test_real_expert(dut):
    """One expert of a real model's shape on the DUT's PE (the streamed expert program,
    :func:`elmoe3d.sw.golden.expert_stream.build_streamed_expert_program`: token tiles,
    K-chained GEMMs across WMEM buffer-fulls, FULL as LSB_ONLY + MSB_ONLY chains), synthetic
    weights; the ``ld`` stream paced at ``real_ld_rate`` (:func:`ld_rate_words`: default the HB
    bank rate; ``"full"``, one word a cycle, measures the tile's MACs per cycle with HB out of
    the way), outputs always ready (smooth).

    For each shape of ``real_shapes`` (model preset names), tokens of ``real_tokens`` (or of
    ``real_shape_tokens[shape]``) and mode of ``real_modes``: every ``o`` beat against fsim,
    the decoded output against ``ref_moe`` (FP32 bits) and the STATUS beat; the record has
    cycles, ``ld_bytes``, ``weight_bytes``, ``gemm_beats``, the program's ``passes`` over
    up/gate and whether x streams (``x_stream``, from the builder's ``info``) and the roofline
    figures of :func:`roofline_figures` (definitions in :func:`test_hb_roofline`;
    ``roofline_fraction_weights`` counts only the weight bytes). A shape the builder refuses
    (:func:`~elmoe3d.sw.golden.expert_stream.plan_expert_stream`: its memories cannot stage
    it) is one record with ``refused`` (the one-line error), no values compared and no
    mismatch."""
    from ..sw.golden.asm import ProgramError
    from ..sw.golden.expert_stream import build_streamed_expert_program, plan_expert_stream
    from ..sw.host.models import MODEL_PRESETS
    bench = await _bench(dut, "test_real_expert", "smooth")
    bench.note = REAL_NOTE
    with bench.summary():
        params = {**REAL_DEFAULTS, **load_params()}
        rate = ld_rate_words(bench.arch, params["real_ld_rate"])
        for name in params["real_shapes"]:
            model = MODEL_PRESETS[name]
            hidden, inter = int(model.hidden), int(model.expert_intermediate)
            try:
                plan_expert_stream(hidden, inter, bench.arch)
            except ProgramError as exc:
                bench.record(case=f"{name} expert {hidden}x{inter}", model=name,
                             source=f"{name} shape", mode="-", traffic="smooth", tokens=0,
                             hidden=hidden, intermediate=inter, experts_run=[], cycles=0,
                             gemm_beats=0, acc_overflow=False, vpu_saturation=False,
                             comparisons=0, mismatches=0, details=[], refused=str(exc),
                             kind="real-expert", note=REAL_NOTE)
                dut._log.info("  %s %dx%d: refused by the builder: %s", name, hidden, inter,
                              exc)
                continue
            for tokens in params.get("real_shape_tokens", {}).get(name, params["real_tokens"]):
                tokens = int(tokens)
                case = f"{name} expert {hidden}x{inter} T={tokens}"
                expert, x, gw = real_expert_weights(bench.rng(case), hidden, inter, tokens)
                routing = (np.zeros((tokens, 1), np.int64), gw.astype(np.float16)[:, None])
                for mode in params["real_modes"]:
                    mode = Mode[mode]
                    t0 = time.perf_counter()
                    job = build_streamed_expert_program(x, expert, gw, mode, bench.arch)
                    gold = ref_moe(x, [expert], routing, mode)
                    rec = await bench.job_case(
                        case, f"synthetic weights, {name} shape", job, gold, mode, "smooth",
                        routing=routing, intermediate=inter, ld_rate=rate,
                        extra=dict(kind="real-expert", model=name, tiles=job.info.get("tiles"),
                                   builder_gemm_beats=job.info.get("gemm_beats"),
                                   weight_words=job.info.get("weight_words"),
                                   act_words=job.info.get("act_words"),
                                   passes=job.info.get("passes"),
                                   x_stream=job.info.get("x_stream"),
                                   ld_rate_words_per_cycle=rate,
                                   max_keep_gemms=sum(1 for c in job.program
                                                      if c.fields.get("max_keep")),
                                   note=REAL_NOTE))
                    # the whole case: builder, ref_moe, fsim and the RTL run
                    rec["case_seconds"] = time.perf_counter() - t0
                    if not rec["cycles"]:
                        continue
                    roofline_figures(rec, bench.arch, tokens * 3 * hidden * inter,
                                     ld_rate=rate)
                    dut._log.info(
                        "  %s %s (%d pass(es), x %s): %d cycles; ld %d B, weights %d B (%.0f "
                        "cycles at %.2f words/cycle), %d beats -> %.1f%% of the %s roofline (%.1f%% "
                        "counting weight bytes only), %.0f MACs/cycle (%.1f%% of the peak "
                        "%d); %d values, %d mismatches; %.1f s wall",
                        case, mode.name, rec["passes"],
                        "streamed" if rec["x_stream"] else "resident", rec["cycles"],
                        rec["ld_bytes"], rec["weight_bytes"],
                        rec["memory_cycles"], rate, rec["gemm_beats"],
                        100 * rec["roofline_fraction"], rec["roofline_bound"],
                        100 * rec["roofline_fraction_weights"], rec["macs_per_cycle"],
                        100 * rec["mac_utilization"], rec["peak_macs_per_cycle"],
                        rec["comparisons"], rec["mismatches"], rec["wall_seconds"])


#: ``test_paper_group_root`` defaults: the model preset whose expert shape is run, tokens, modes
#: and ``ld`` rates (:func:`ld_rate_words`); each of tokens, modes and rates may be a list.
PAPER_DEFAULTS = {"paper_shape": "olmoe-1b-7b", "paper_tokens": [1],
                  "paper_modes": ["DRAFT", "FULL"], "paper_ld_rate": ["hb"]}


def as_list(value) -> list:
    """A bench parameter given as one value (text included) or an iterable of them (list,
    tuple, range, generator, array of any shape: its elements), as a list."""
    if isinstance(value, np.ndarray):
        return np.ravel(value).tolist()
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return [value]
    return list(value)


def paper_group_case(arch: ArchConfig, shape: str, tokens: int, mode, rng):
    """One real-shape expert split over a PE group of ``arch`` (``pes_per_group`` PEs,
    :func:`elmoe3d.sw.host.stream_group.compile_expert_group`) and run on the functional
    simulator joined by the golden aggregation link (:func:`~elmoe3d.sw.host.parallel.run_group`).

    Returns ``(job, res, link_i, gold, expert_info)``: the group job, its
    :class:`~elmoe3d.sw.host.parallel.GroupResult`, each PE's ``link_i`` words
    (:func:`~elmoe3d.sw.host.pe_runs.link_inputs`), ``ref_moe`` of the expert alone and
    ``(hidden, intermediate)``. Weights, x and gate weights: :func:`real_expert_weights`."""
    from ..sw.host.models import MODEL_PRESETS
    from ..sw.host.parallel import run_group
    from ..sw.host.pe_runs import link_inputs
    from ..sw.host.stream_group import compile_expert_group
    mode = Mode[mode] if isinstance(mode, str) else Mode(mode)
    model = MODEL_PRESETS[shape]
    hidden, inter = int(model.hidden), int(model.expert_intermediate)
    expert, x, gw = real_expert_weights(rng, hidden, inter, int(tokens))
    job = compile_expert_group(x, expert, gw, mode, arch)
    res = run_group(job)
    routing = (np.zeros((int(tokens), 1), np.int64), gw.astype(np.float16)[:, None])
    gold = ref_moe(x, [expert], routing, mode)
    return job, res, link_inputs(job, res), gold, (hidden, inter)


@cocotb.test()
async def test_paper_group_root(dut):
    """The root PE of a real-shape expert split over a PE group (``paper_shape``, default
    OLMoE-1B-7B: H = 2048, I = 1024; synthetic weights) on the DUT's PE -- the paper PE
    (``paper-4gb``: 16x32x32 tile, W = 4096 bits, 32 KB WMEM and IOMEM) under
    ``make sim-paper-pe`` (``elmoe3d paper-pe``), not among the default tests.

    For each mode of ``paper_modes`` (``paper_tokens`` tokens): the group's programs from
    :func:`paper_group_case`; the root PE's program runs on the RTL with its own ``ld`` words
    paced at ``paper_ld_rate`` (:func:`ld_rate_words`: default the HB bank rate,
    ``hb_bytes_per_cycle`` / word bytes = 0.1 words of 512 B per cycle; ``"full"``: one word a
    cycle) and, on ``link_i``, the words the functional group run's link delivers to it (the
    row-max all-reduce word of each token tile, then the members' reduced down psums for its
    ``psum_in``), outputs always ready. Compared: every ``o`` beat (DATA bit for bit, STATUS
    counters) and ``link_o`` word (its row maxima) against the functional group run, and the
    decoded FP32 output (``job.decode`` of the RTL's DATA beats) against ``ref_moe`` and the
    group run's output, bit for bit. The record has the cycles, simulated cycles per second and
    the roofline figures of :func:`roofline_figures` (useful MACs: the root's share, 3 H I T /
    G)."""
    from ..sw.host.pe_runs import compare_run
    bench = await _bench(dut, "test_paper_group_root", "smooth")
    bench.note = REAL_NOTE
    with bench.summary():
        params = {**PAPER_DEFAULTS, **load_params()}
        shape = params["paper_shape"]
        cases = [(int(t), str(m), str(r)) for t in as_list(params["paper_tokens"])
                 for m in as_list(params["paper_modes"])
                 for r in as_list(params["paper_ld_rate"])]
        group = {}
        for tokens, mode, rate_name in cases:
            mode = Mode[mode]
            rate = ld_rate_words(bench.arch, rate_name)
            case = (f"{shape} expert, root PE of {bench.arch.pes_per_group} T={tokens}, ld "
                    f"{rate_name}")
            if (tokens, mode) not in group:       # one functional group run for every ld rate
                wall = time.perf_counter()
                group[tokens, mode] = paper_group_case(bench.arch, shape, tokens, mode,
                                                       bench.rng(f"{shape}/T{tokens}")), \
                    time.perf_counter() - wall
            (job, res, link_i, gold, (hidden, inter)), prep = group[tokens, mode]
            r = job.root
            want_o = [(int(b.kind), int(b.data)) for b in res.o[r]]
            dut._log.info("%s %s, ld %s (%.2f words/cycle): group of %d PEs, I padded to %d "
                          "(%d a PE); root PE %d: %d commands, %d ld words, %d link_i words, "
                          "%d o beats, %d link_o words (functional group run %.1f s)", case,
                          mode.name, rate_name, rate, job.pes,
                          job.info["intermediate_padded"], job.info["slice"], r,
                          len(job.programs[r]), len(job.ld[r]), len(link_i[r]), len(want_o),
                          len(res.link_o[r]), prep)
            run = await bench.run(job.programs[r].encode(), job.ld[r], link_i[r],
                                  n_o=len(want_o), n_link=len(res.link_o[r]),
                                  rng=bench.rng(f"{case}/{mode.name}/{rate_name}"),
                                  traffic="smooth",
                                  ld_rate=rate)
            cmp = compare_run(run.o, run.link_o, want_o, res.link_o[r], run.errors)
            details, comparisons, mismatches = cmp["details"], cmp["comparisons"], \
                cmp["mismatches"]
            status = cmp["status"]
            data = [d for k, d in run.o if k == OKind.DATA]
            y = None
            try:
                y = job.decode(_DataBeats(data, bench.pe).data())
            except Exception as exc:                   # noqa: BLE001 - recorded as a mismatch
                details.append(f"decode: {type(exc).__name__}: {exc}")
            if y is not None and y.shape == gold.y.shape:
                for name, want in (("ref_moe", gold.y), ("the group run", res.y)):
                    bad = y.view(np.uint32) != want.view(np.uint32)
                    comparisons += int(bad.size)
                    mismatches += int(bad.sum())
                    for t, c in list(zip(*np.nonzero(bad)))[:2]:
                        details.append(f"y[{t}, {c}]: RTL {y[t, c]!r}, {name} {want[t, c]!r}")
            else:
                comparisons += 2 * gold.y.size
                mismatches += 2 * gold.y.size
                details.append(f"decoded {None if y is None else y.shape}, ref_moe "
                               f"{gold.y.shape}")
            beats = int(status.get("gemm_beats", 0))
            prog = job.programs[r]
            wbytes = bench.pe.word_bytes * sum(c.fields["words"] for c in prog
                                               if c.op.name == "LOAD"
                                               and c.fields["target"] <= 2)
            rec = dict(case=case, source=f"synthetic weights, {shape} shape", mode=mode.name,
                       traffic="smooth", tokens=tokens, hidden=hidden, intermediate=inter,
                       intermediate_padded=int(job.info["intermediate_padded"]),
                       pes=int(job.pes), root=int(r), slice=int(job.info["slice"]),
                       experts_run=[0], commands=len(prog), ld_words=len(job.ld[r]),
                       link_i_words=len(link_i[r]), o_beats=len(want_o),
                       link_o_words=len(res.link_o[r]), gemm_beats=beats, cycles=run.cycles,
                       weight_bytes=wbytes, ld_bytes=bench.pe.word_bytes * len(job.ld[r]),
                       ld_rate=rate_name, ld_rate_words_per_cycle=rate,
                       beats_per_cycle=beats / run.cycles if run.cycles else 0.0,
                       status={k: int(v) for k, v in status.items()},
                       acc_overflow=bool(status.get("acc_overflow")),
                       vpu_saturation=bool(status.get("vpu_saturation")),
                       comparisons=comparisons, mismatches=mismatches,
                       details=details[:MAX_DETAILS], wall_seconds=run.wall_seconds,
                       cycles_per_second=run.cycles / run.wall_seconds if run.wall_seconds
                       else 0.0, prep_seconds=prep, kind="paper-group-root", model=shape,
                       passes=job.info["per_pe"][r].get("passes"),
                       tiles=job.info["per_pe"][r].get("tiles"), note=REAL_NOTE)
            rec = bench.record(**rec)
            if not rec["cycles"]:
                continue
            roofline_figures(rec, bench.arch, tokens * 3 * hidden * inter // job.pes,
                             ld_rate=rate)
            dut._log.info(
                "  %s %s: %d cycles in %.1f s (%.0f cycles/s); ld %d B, weights %d B (%.0f "
                "cycles at %.2f words/cycle), %d beats -> %.1f%% of the %s roofline (%.1f%% "
                "counting weight bytes only), %.0f MACs/cycle (%.1f%% of the peak %d); %d "
                "values, %d mismatches",
                case, mode.name, rec["cycles"], rec["wall_seconds"], rec["cycles_per_second"],
                rec["ld_bytes"], rec["weight_bytes"], rec["memory_cycles"], rate,
                rec["gemm_beats"], 100 * rec["roofline_fraction"], rec["roofline_bound"],
                100 * rec["roofline_fraction_weights"], rec["macs_per_cycle"],
                100 * rec["mac_utilization"], rec["peak_macs_per_cycle"], rec["comparisons"],
                rec["mismatches"])


# -- host side -------------------------------------------------------------------------------

#: Test names in the order the host runs and reports them.
#: ``test_real_expert`` is not among them: real expert shapes need the ``mid`` preset
#: (``run_pe_bench(preset("mid"), tests="test_real_expert")``); nor is
#: ``test_paper_group_root`` (the paper PE: ``make sim-paper-pe``).
TESTS = ("test_trace_moe", "test_corners", "test_hb_roofline", "test_psum_split")


#: A host-side run of this bench: the runner's result and the case records.
PEBenchResult = BenchResult


def build_pe(arch: ArchConfig, *, waves=None):
    """Verilog + Verilator build of ``PE(config=arch)`` (reused when unchanged)."""
    from .runner import build
    return build(PE(config=arch), name=f"pe_{arch.name.replace('-', '_')}", toplevel="pe",
                 waves=waves, verilog_key={"PE": repr(arch)})


def run_pe_bench(arch: ArchConfig | None = None, *, tests=None, seed=None, waves=None,
                 params=None, built=None, check=True) -> PEBenchResult:
    """Build (or reuse) the PE and run the named tests of this bench (default: all).

    ``params`` are merged over ``{"arch": arch.name, "routing": default_routing()}``. With
    ``check=True`` a failing test raises :class:`~elmoe3d.sim.runner.SimulationFailure`;
    records are read from the run folder's ``summary-*.json`` files either way."""
    arch = arch or preset("small")
    built = built or build_pe(arch, waves=waves)
    merged = {"arch": arch_param(arch), "routing": str(default_routing()), **(params or {})}
    return run_bench(built, test_module=__name__, tests=tests, default_tests=TESTS,
                     params=merged, prefix="bench_pe", seed=seed, check=check)

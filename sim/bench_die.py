"""cocotb bench of the logic die, :class:`elmoe3d.hw.die.LogicDie`: multi-PE MoE layers in the
draft and verify phases, every PE's loads from its HB bank, the LPDDR5 channels (through the
streamline ring) and the host, psums and row maxima over the aggregation links (paper
Sections 4.1, 5.1, 5.2; Fig. 6, 9, 10).

Run through :mod:`elmoe3d.sim.runner` (never directly): the runner builds the die's Verilog
with the parameters ``params["die"]`` (keyword arguments of ``LogicDie``) and writes
``params.json``::

    {"arch": "small", "die": {"ext_channels": 2, ...},
     "routing": "/path/gsm8k_2_routing.jsonl",  # real Mixtral-8x7B routing (top-2 of 8)
     "hidden": 64, "intermediate": 128, "experts": 8, "tokens": [1, 4, 16],
     "layers": {"1": 0, "4": 15, "16": 31},
     "cached": [0, 2, 3, 5, 6],                 # HB-resident experts (the draft pool)
     "ext_layout": "stream",                    # EXT placement (EXT_LAYOUTS)
     "dump_probes": false}                      # true: probes-<test>-<phase>-T<n>.json
                                                # (every cycle's probe value and every
                                                # host beat's cycle and queue) per case

The host side of every case: each PE group serves a share of the experts (expert ``e`` on
group ``e % groups``); :func:`elmoe3d.sw.host.parallel.compile_group` compiles the group's work
(draft: HB-only TP over the cached experts; verify: MSB-TP from HB + LSB-DP from EXT with
psum-level synchronisation for cached experts, uncached experts streamed whole from EXT).
The HB banks get each PE's MSB slices and scales by the behavioural model's backdoor (or,
in the pool-update case, through the die's host DMA ``HB_WRITE`` path); EXT (the LPDDR5
models) holds the groups' transfers (LSB slices, scale copies, uncached experts) with their
words in the order the EXT queue reads them, the groups' transfers interleaved
(``params["ext_layout"]``, :data:`EXT_LAYOUTS`; ``"group"``: each group's image at its own
base address). The host then streams, on one command stream with per-queue room bits, every PE's
program, every group's link descriptors and the EXT read descriptors (group-local masks
shifted to the die's PEs), and on the DMA stream the HOST loads' words.

Checked with plain equality, per group:

* every ``o`` beat of every PE of the group against the multi-PE functional simulation
  (:func:`elmoe3d.sw.host.parallel.run_group`): DATA beats bit for bit, STATUS beats on their
  functional fields;
* the root PE's decoded FP32 output ``[T, H]`` (as bits) against the golden MoE layer
  :func:`elmoe3d.sw.golden.expert.ref_moe` for the group's routing (and against ``run_group``);
* the sticky flags (OR over the group's PEs) against ``ref_moe``;
* every DRAM command against the timing rules (:class:`elmoe3d.sw.golden.dram.DramDevice`:
  zero violations, refresh rate checked at the end); the die's ``errors`` output stays 0.

Measured cycle by cycle from the die's read-only ``probe`` output
(:func:`elmoe3d.hw.die.die_probe_layout`, sampled every cycle of a case):

* the **verify-phase overlap** (paper Section 5.2: the LSB fetch should hide the psum
  exchange), per group g: the *psum exchange* X_g = the cycles of g's BYPASS and REDUCE_ADD
  link descriptors (the ones carrying Q.24 psums, :data:`PSUM_MODES`), each from the cycle its
  first flit moved to the cycle its last word entered the destination FIFOs (not the cycles
  a taken descriptor waits for its sources' first word); the *LSB-fetch window* F_g = from
  the first to the last cycle the ring delivered an EXT word to a PE of g. ``overlap`` =
  sum_g |X_g & F_g| / sum_g |X_g|; ``exposed_cycles`` = the die cycles in which some group
  exchanges psums outside its window, ``exposed_share`` = exposed / the layer's cycles (of
  which ``exposed_final_cycles`` are the layer-final OUT-row reduction, after the last GEMM
  by construction); ``concurrent`` = the stricter share of X_g in cycles an EXT word reached
  g. Precise definitions: :func:`exchange_figures`;
* every probe bit's count (``exchange["counts"]``: EXT words delivered and refused per PE,
  load words, load waits and holds, HB words, link words, descriptors), checked: the link of
  every group took exactly the descriptors sent, and the ring delivered exactly the EXT words
  the programs load;
* each PE's STATUS counters (``pe_status``: cycles, load_busy, exec_busy, stall, gemm_beats
  ...).

Expert weights and token activations are synthetic (seeded Gaussians); the routing is the
real Mixtral trace. Traffic ``smooth``: the host offers a beat every cycle, ``o`` always
ready; ``stalls``: idle host cycles and backpressure on the die's ``o``
(:mod:`elmoe3d.sim.traffic`; ports ``host`` and ``o``). Each test writes
``summary-<test>.json`` into the run folder and fails if any case failed. Seeds:
:func:`~elmoe3d.sim.runner.resolve_seed`, one generator per case.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from ..config import LINK_OP_LATENCY, ArchConfig, preset
from ..hw.agg_link import link_op_layout, pack_link_op
from ..hw.die import (DmaKind, HostQueue, LogicDie, die_errors_layout, die_o_layout,
                      die_probe_layout, dma_bit, host_cmd_layout, host_dma_layout, queue_bit)
from ..hw.ext_stream import ext_read_layout
from ..hw.isa import command_layout
from ..isa import Source
from ..sw.golden import asm
from ..sw.golden.asm import OKind
from ..sw.golden.expert import Expert, ref_moe
from ..sw.host.compiler import synthetic_experts
from ..sw.golden.agg_link import LinkMode
from ..sw.golden.ext_sched import round_robin
from ..sw.host.parallel import check_link_schedule, compile_group, ext_load_order, run_group
from . import cocotb_streams as streams
from .bench_pe import SYNTHETIC_NOTE, default_routing, read_routing
from .dram_bus import dram_bus, drive_devices
from ..sw.golden.dram import DramDevice, TimingViolation, backdoor_write
from .records import (BenchResult, CaseRecorder, arch_from_params, arch_param, failed_cases,
                      figure_prefix, run_bench)
from .runner import case_rng, load_params, resolve_seed
from .traffic import BENCH_TRAFFIC, traffic as pattern


__all__ = ["DEFAULTS", "DIE_DEFAULTS", "TESTS", "DieBenchResult", "build_die", "run_die_bench",
           "die_kwargs", "PSUM_MODES", "probe_fields", "exchange_figures", "die_figures",
           "print_die"]

#: Clock period of the bench (ns of simulation time; only cycles are reported).
CLOCK_NS = streams.CLOCK_NS
MAX_DETAILS = 8
#: LogicDie parameters of the bench build (merged under ``params["die"]``): two LPDDR5
#: channels (a scaled ExtController with the same per-channel behaviour) keep the build small.
DIE_DEFAULTS = {"ext_channels": 2, "hb_queue_depth": 16, "ext_queue_depth_bursts": 16,
                "ext_read_buffer": 16}
DEFAULTS = {"arch": "small", "hidden": 64, "intermediate": 128, "experts": 8,
            "tokens": [1, 4, 16],
            "layers": {"1": 0, "4": 15, "16": 31}, "problem": 0,
            "cached": [0, 2, 3, 5, 6], "pool_tokens": 4, "ext_layout": "stream",
            "ext_order": "load"}
#: Placements of the EXT data (``params["ext_layout"]``): ``"stream"``, every transfer's words
#: in the order the EXT queue reads them (the groups' transfers interleaved: one sequential
#: stream); ``"group"``, each group's ``GroupJob.ext_image`` at its own base (the groups'
#: interleaved reads alternate between two regions, which at 16 tokens share banks at
#: different rows: row conflicts, ``docs/memory.md``).
EXT_LAYOUTS = ("stream", "group")
#: Orders of each group's EXT transfers on the EXT queue (``params["ext_order"]``):
#: ``"load"``, :func:`elmoe3d.sw.host.parallel.ext_load_order` (the order the PEs' load
#: engines start their EXT LOADs, timing-free: the PEs' runs interleaved for the EXT
#: scheduler's window); ``"program"``, ``GroupJob.ext_transfers`` as compiled (each PE's in
#: its program order, one PE's run after another's).
EXT_ORDERS = ("load", "program")


def group_experts(used, phase: str, cached, groups: int) -> list:
    """The bench's placement: per group the experts of ``used`` (the routed ones, ascending)
    that it runs: expert e on group e mod ``groups``, a draft's only the ``cached`` ones."""
    return [[e for e in used if e % groups == g and (phase != "draft" or e in cached)]
            for g in range(groups)]


def die_kwargs(params) -> dict:
    """The LogicDie keyword arguments of a run (``DIE_DEFAULTS`` under ``params["die"]``)."""
    return {**DIE_DEFAULTS, **(params.get("die") or {})}


def _ints(values):
    return [int(v) for v in values]


#: Link descriptor modes that carry Q.24 psums in the programs of :mod:`elmoe3d.sw.host.parallel`:
#: BYPASS (an owner's MSB_ONLY up/gate psums to a token owner), REDUCE_ADD (the down
#: projection's MSB_ONLY psums summed into the token owner, and the layer-final sum of the
#: OUT rows on the root). ALL_TO_ALL carries the INT8 h rows (activations) and REDUCE_MAX the
#: row maxima: neither is a psum exchange.
PSUM_MODES = (LinkMode.BYPASS, LinkMode.REDUCE_ADD)


def probe_fields(arch) -> dict:
    """``{field: (bit offset, width)}`` of :func:`elmoe3d.hw.die.die_probe_layout`."""
    return {name: (f.offset, f.width) for name, f in die_probe_layout(arch)}


def _bits(value, offsets, name):
    off, width = offsets[name]
    return value >> off & ((1 << width) - 1)


def exchange_figures(events, offsets, *, pes_per_group, flits_per_word, link_ops, final_ops,
                     first, end, op_latency=LINK_OP_LATENCY) -> dict:
    """The verify-phase overlap of one layer from the die's per-cycle ``probe`` values.

    Parameters
    ----------
    events : list of (cycle, int)
        The ``probe`` value (:func:`elmoe3d.hw.die.die_probe_layout`) of every cycle in which
        it was not 0, cycles ascending (a cycle not listed had every bit 0).
    offsets : dict
        :func:`probe_fields`.
    pes_per_group, flits_per_word : int
        G, and S = W / (8 x the link's flit bytes) link cycles per W-bit word.
    op_latency : int
        The link's cycles from a descriptor taken to its first flit moving
        (:data:`elmoe3d.config.LINK_OP_LATENCY`).
    link_ops : list of (list of LinkOp or None)
        Per group, the descriptors sent to its link in order (None: the group had no work).
    final_ops : list of int
        Per group, how many of its last descriptors are the layer-final OUT-row reduction.
    first, end : int
        The layer's first and last cycle (first command taken, last ``o`` beat).

    Definitions (every set a set of cycles in ``[first, end]``, per group g)
    -----------
    * A descriptor's *exchange span*: from the cycle its first flit moved to the cycle its
      last word entered the destination FIFOs (the link's ``done``): ``[max(taken +
      op_latency, h0 - (S - 1) + op_latency - 1), done]``, where h0 is the first cycle a
      source word of the descriptor was accepted (``link_o_word``; a word's S flits enter the
      link's flit buffer on S consecutive cycles, the last with the word's handshake, and move
      on ``op_latency - 1`` cycles later, unless a destination FIFO is full). The cycles a
      taken descriptor waits for its sources' first word (the psums are still being computed)
      are not in it.
    * X_g, the *psum exchange*: the union of the spans of g's descriptors in
      :data:`PSUM_MODES`.
    * E_g: the cycles in which the ring delivered an EXT word to a PE of g (``ext_word``);
      the *LSB-fetch window* F_g = [min E_g, max E_g] (LSB planes, scale copies and uncached
      experts: every EXT word of the layer).
    * ``overlap`` = sum_g |X_g & F_g| / sum_g |X_g| (None without psum exchange): the
      fraction of the psum exchange the LSB fetch hides. The paper's goal is 1.0.
    * ``concurrent`` = sum_g |X_g & E_g| / sum_g |X_g|: the stricter per-cycle share (an EXT
      word arrived in the same cycle).
    * ``exposed_cycles`` = |U_g (X_g - F_g)| (die cycles in which some group exchanges psums
      outside its LSB-fetch window); ``exposed_share`` = that / (end - first + 1);
      ``exposed_final_cycles``: the part of it in the layer-final OUT reductions, which follow
      the last GEMM and so cannot overlap any fetch by construction.
    * ``overlap_in_layer``: ``overlap`` without the layer-final OUT reductions (the psum
      exchange of the experts' GEMMs, ``layer_psum_cycles`` cycles).

    Also returns ``descriptors`` (per group: descriptors the link took, which must equal the
    descriptors sent) and ``counts``: per probe field, the cycles each bit was 1.
    """
    G, S = pes_per_group, flits_per_word
    NG = len(link_ops)
    counts = {name: [0] * width for name, (_, width) in offsets.items()}
    ext = [[] for _ in range(NG)]
    # per group: list of [taken, first word, done] of every descriptor taken
    desc = [[] for _ in range(NG)]
    for cyc, v in events:
        if cyc < first or cyc > end:
            continue
        for name, (off, width) in offsets.items():
            b = v >> off & ((1 << width) - 1)
            i = 0
            while b:
                if b & 1:
                    counts[name][i] += 1
                b >>= 1
                i += 1
        ew = _bits(v, offsets, "ext_word")
        lo = _bits(v, offsets, "link_o_word")
        done = _bits(v, offsets, "link_done")
        took = _bits(v, offsets, "link_op")
        for g in range(NG):
            if ew >> (g * G) & ((1 << G) - 1):
                ext[g].append(cyc)
            d = desc[g]
            # a word accepted in this cycle belongs to the descriptor taken before it
            if lo >> (g * G) & ((1 << G) - 1) and d and d[-1][1] is None and d[-1][0] < cyc:
                d[-1][1] = cyc
            if done >> g & 1 and d and d[-1][2] is None:
                d[-1][2] = cyc
            if took >> g & 1:
                d.append([cyc, None, None])
    psum, hidden, conc, layer, layer_hidden = 0, 0, 0, 0, 0
    per_group, exposed, exposed_final = [], set(), set()
    for g in range(NG):
        ops = link_ops[g] or []
        window = (ext[g][0], ext[g][-1]) if ext[g] else None
        eset = set(ext[g])
        x, xf = set(), set()
        for k, (taken, h0, done) in enumerate(desc[g]):
            if k >= len(ops) or ops[k].mode not in PSUM_MODES or h0 is None:
                continue
            span = range(max(taken + op_latency, h0 - (S - 1) + op_latency - 1),
                         (done if done is not None else end) + 1)
            x.update(span)
            if k >= len(ops) - final_ops[g]:
                xf.update(span)
        inside = {c for c in x if window and window[0] <= c <= window[1]}
        psum += len(x)
        hidden += len(inside)
        conc += len(x & eset)
        exposed |= x - inside
        exposed_final |= xf - inside
        layer += len(x - xf)
        layer_hidden += len(inside - xf)
        per_group.append({"group": g, "descriptors": len(desc[g]), "descriptors_sent": len(ops),
                          "psum_cycles": len(x), "hidden_cycles": len(inside),
                          "ext_window": list(window) if window else None,
                          "ext_cycles": len(eset)})
    cycles = end - first + 1
    return {"psum_cycles": psum, "hidden_cycles": hidden, "concurrent_cycles": conc,
            "overlap": hidden / psum if psum else None,
            "concurrent": conc / psum if psum else None,
            "layer_psum_cycles": layer,
            "overlap_in_layer": layer_hidden / layer if layer else None,
            "exposed_cycles": len(exposed), "exposed_final_cycles": len(exposed_final),
            "exposed_share": len(exposed) / cycles if cycles > 0 else 0.0,
            "groups": per_group, "counts": counts}


class DieBench(CaseRecorder):
    """Clock, reset, DRAM models, the host driver and the output monitor of one die DUT."""

    def __init__(self, dut, params, test, traffic="-"):
        self.dut, self.test, self.traffic = dut, test, traffic
        self.params = {**DEFAULTS, **params}
        self.arch = arch = arch_from_params(self.params, DEFAULTS["arch"])
        self.pe = arch.pe
        self.seed = resolve_seed()
        # the DUT's figures, from its parameters (no second die built to read them)
        self.die = SimpleNamespace(**LogicDie.host_figures(config=arch,
                                                           **die_kwargs(self.params)))
        self.records = []
        self.violations = []
        self.o_layout = die_o_layout(arch)
        self.cmd_layout = host_cmd_layout(arch)
        self.dma_layout = host_dma_layout(arch)
        self.ext_layout = ext_read_layout(arch.pes)
        self.probe_offsets = probe_fields(arch)

    cycle = staticmethod(streams.cycle)

    def rng(self, case):
        return case_rng(self.seed, f"{self.test}/{case}")

    # -- DRAM models --

    def preload_hb(self, p, words):
        """Backdoor: PE ``p``'s HB bank holds ``words`` from word 0."""
        backdoor_write([self.hb_devs[p]], 0, words, self.pe.word_bytes)

    def preload_ext(self, base, words):
        """Backdoor: EXT words ``base ..`` hold ``words`` (striped over the channels: stripe s
        = one burst per channel, channel 0 lowest)."""
        backdoor_write(self.ext_devs, base, words, self.pe.word_bytes)

    # -- start --

    async def start(self):
        dut, arch = self.dut, self.arch
        n_ext = self.die.ext_channels
        # the DRAM models start clocking in the first cycle out of reset (settle=0)
        await streams.start(dut, ["host_cmd__valid", "host_dma__valid", "o__ready",
                                  "errors_clear"]
                            + [f"hb__{p}__rd_valid" for p in range(arch.pes)]
                            + [f"ext__{c}__rd_valid" for c in range(n_ext)], settle=0)
        self.hb_devs = [DramDevice(arch.hb, clock_ghz=arch.clock_ghz, name=f"hb{p}", seed=p)
                        for p in range(arch.pes)]
        self.ext_devs = [DramDevice(arch.ext, clock_ghz=arch.clock_ghz, name=f"ext{c}",
                                    seed=100 + c) for c in range(n_ext)]
        self.devices = [(d, f"hb__{p}") for p, d in enumerate(self.hb_devs)] + \
            [(d, f"ext__{c}") for c, d in enumerate(self.ext_devs)]
        cocotb.start_soon(drive_devices(dut, [(d, dram_bus(dut, p)) for d, p in self.devices],
                                        self.violations))
        await RisingEdge(dut.clk)
        dut._log.info("die %s: %d groups x %d PEs, W=%d bits, HB %s, EXT %d x %s, link FIFO %d "
                      "words; seed %d", arch.name, arch.groups, arch.pes_per_group,
                      self.pe.word_bits, arch.hb.standard, n_ext, arch.ext.standard,
                      self.die.link_buffer_words, self.seed)

    # -- host driver and output monitor --

    async def _host(self, port, queues, room_sig, rng, idle, log):
        """Offer the beats of ``queues`` (a dict bit -> deque of payload ints) on ``port``,
        round robin over the queues whose room bit is set; never a queue written at the
        previous edge (its room may just have fallen), so every beat offered is taken."""
        dut = self.dut
        valid = getattr(dut, f"{port}__valid")
        payload = getattr(dut, f"{port}__payload")
        ready = getattr(dut, f"{port}__ready")
        order = sorted(queues)
        rr = 0
        offered = None
        while any(queues.values()) or offered is not None:
            await ReadOnly()
            room = int(getattr(dut, room_sig).value)
            if offered is not None:
                if ready.value != 1:
                    raise AssertionError(f"cycle {self.cycle()}: {port} beat of queue "
                                         f"{offered} not taken though its room bit was set")
                queues[offered].popleft()
                log.append((self.cycle(), offered))
            last = offered
            offered = None
            if not (idle and rng.random() < idle):
                for k in range(len(order)):
                    q = order[(rr + k) % len(order)]
                    if queues[q] and room >> q & 1 and q != last:
                        offered, rr = q, (rr + k + 1) % len(order)
                        break
            await RisingEdge(dut.clk)
            valid.value = int(offered is not None)
            if offered is not None:
                payload.value = queues[offered][0]
        await RisingEdge(dut.clk)
        valid.value = 0

    async def _probes(self, events):
        """Append ``(cycle, probe value)`` for every cycle whose ``probe`` is not 0."""
        probe = self.dut.probe
        while True:
            await ReadOnly()
            v = probe.value.to_unsigned()
            if v:
                events.append((self.cycle(), v))
            await RisingEdge(self.dut.clk)

    async def run(self, cmd_queues, dma_queues, *, n_o, rng, traffic, budget):
        """Stream the host queues into the die and collect ``o`` beats until ``n_o`` came
        out (or ``budget`` cycles passed), then drain: nothing more may come out. Returns
        ``(beats as (cycle, pe, kind, data), errors, first command cycle, probe events, host
        beats)`` (probe events: :meth:`_probes`; host beats: ``{"cmd": [(cycle, queue bit)],
        "dma": [...]}``, every beat each host port took)."""
        dut = self.dut
        flow = pattern(traffic).for_ports("host", "o")
        idle, bp = flow.idle_at("host"), flow.backpressure_at("o")
        out, out_cyc, errors, cmd_log, dma_log, events = [], [], [], [], [], []
        probes = cocotb.start_soon(self._probes(events))
        mons = [cocotb.start_soon(streams.drive_ready(dut, "o", rng, bp)),
                cocotb.start_soon(streams.monitor(dut, "o", out, out_cyc, errors))]
        hosts = [cocotb.start_soon(self._host("host_cmd", cmd_queues, "cmd_room", rng, idle,
                                              cmd_log)),
                 cocotb.start_soon(self._host("host_dma", dma_queues, "dma_room", rng, idle,
                                              dma_log))]
        start = self.cycle()
        deadline = start + int(budget / (1 - flow.idle) / (1 - flow.backpressure))
        while (not all(h.done() for h in hosts) or len(out) < n_o) \
                and self.cycle() < deadline and not self.violations:
            await RisingEdge(dut.clk)
        for h in hosts:
            if h.done() and h.exception() is not None:
                errors.append(f"host driver: {h.exception()}")
        if self.cycle() >= deadline:
            left = {q: len(d) for q, d in {**cmd_queues, **dma_queues}.items() if d}
            errors.append(f"deadline: {len(out)}/{n_o} o beats after {self.cycle() - start} "
                          f"cycles; host beats left per queue {left}")
        for h in hosts:
            h.cancel()
        dut.host_cmd__valid.value = 0
        dut.host_dma__valid.value = 0
        for m in mons:
            m.cancel()
        dut.o__ready.value = 1
        for _ in range(40):
            await ReadOnly()
            if dut.o__valid.value == 1:
                out.append(dut.o__payload.value.to_unsigned())
                out_cyc.append(self.cycle())
            await RisingEdge(dut.clk)
        probes.cancel()
        if len(out) > n_o:
            errors.append(f"extra output: {len(out)} o beats, expected {n_o}")
        if int(dut.errors.value):
            errors.append(f"die errors output = {int(dut.errors.value):#b}")
        beats = []
        for cyc, raw in zip(out_cyc, out):
            view = self.o_layout.from_bits(raw)
            beats.append((cyc, int(view.pe), view.beat.kind.value,
                          int(view.beat.data)))
        return (beats, errors, (cmd_log[0][0] if cmd_log else start), events,
                {"cmd": cmd_log, "dma": dma_log})

    # -- one MoE layer on the die --

    def _cmd(self, queue, index, body):
        return self.cmd_layout.const({"queue": queue, "index": index, "body": body}).as_bits()

    async def moe_case(self, case, x, experts, routing, phase, traffic, *, cached,
                       hb_by_dma=()):
        """Compile every group's share, preload the memories, run the die, compare, record.
        ``hb_by_dma``: PEs whose HB image is written through the host DMA (pool update)."""
        arch, pe = self.arch, self.pe
        G, NG = arch.pes_per_group, arch.groups
        rng = self.rng(f"{case}/{phase}/{traffic}")
        used = sorted({int(e) for e in np.asarray(routing[0]).reshape(-1) if e >= 0})
        jobs = []
        for g, mine in enumerate(group_experts(used, phase, cached, NG)):
            if not mine:
                jobs.append(None)
                continue
            job = compile_group(x, experts, routing, phase=phase, config=arch,
                                cached=[e for e in cached if e in mine], group_experts=mine,
                                buffer_words=self.die.link_buffer_words)
            jobs.append((mine, job, run_group(job)))
        cmd_q = {queue_bit(arch, HostQueue.PE, p): deque() for p in range(arch.pes)}
        cmd_q.update({queue_bit(arch, HostQueue.LINK, g): deque() for g in range(NG)})
        cmd_q.update({queue_bit(arch, HostQueue.EXT, g): deque() for g in range(NG)})
        dma_q = {dma_bit(arch, k, p): deque() for k in DmaKind for p in range(arch.pes)}
        stripe_words = max(1, self.die.ext_stripe_bytes // pe.word_bytes)
        layout = self.params["ext_layout"]
        if layout not in EXT_LAYOUTS:
            raise ValueError(f"ext_layout: expected one of {EXT_LAYOUTS}, got {layout!r}")
        base, n_o = 0, 0
        ext_lists = []
        dma_hb = {}
        for g, item in enumerate(jobs):
            if item is None:
                continue
            _, job, res = item
            for j in range(G):
                p = g * G + j
                if p in hb_by_dma:
                    dma_hb[p] = job.hb_images[j]
                else:
                    self.preload_hb(p, job.hb_images[j])
                for c in job.programs[j].encode():
                    cmd_q[queue_bit(arch, HostQueue.PE, p)].append(
                        self._cmd(HostQueue.PE, p, {"cmd": command_layout().from_bits(c)}))
                for w in job.streams(j)[Source.HOST]:
                    dma_q[dma_bit(arch, DmaKind.LD, p)].append(self.dma_layout.const(
                        {"kind": DmaKind.LD, "pe": p, "data": int(w)}).as_bits())
                n_o += len(res.o[j])
            for op in job.link_ops:
                cmd_q[queue_bit(arch, HostQueue.LINK, g)].append(self._cmd(
                    HostQueue.LINK, g, {"link": link_op_layout(G).from_bits(
                        pack_link_op(op, G))}))
            if layout == "group":
                self.preload_ext(base, job.ext_image)
            trs = job.ext_transfers
            if self.params["ext_order"] == "load":
                trs = ext_load_order(job)
            elif self.params["ext_order"] != "program":
                raise ValueError(f"ext_order: expected one of {EXT_ORDERS}, got "
                                 f"{self.params['ext_order']!r}")
            # the order sent, under the die's EXT admission rule (raises on a deadlock)
            # (each group has its own EXT queue and scheduler window)
            check_link_schedule(job, ext_transfers=trs, ext_fifo_words=self.die.ext_fifo_words,
                                ext_chunk_words=self.die.ext_chunk_words,
                                ext_window=self.die.ext_window)
            ext_lists.append([(base + tr.addr, tr, g) for tr in trs])
            base += -(-len(job.ext_image) // stripe_words) * stripe_words
        # the groups' EXT reads interleaved (each group's in its order)
        order = round_robin(ext_lists)
        if layout == "stream":
            # the transfers' words laid out in the order they are read (one sequential
            # stream through the LPDDR5 rows), each transfer from a stripe boundary
            image = []
            for k, (_, tr, g) in enumerate(order):
                order[k] = (len(image), tr, g)
                image += list(tr.words) + [0] * (-len(tr.words) % stripe_words)
            self.preload_ext(0, image)
        for addr, tr, g in order:
            cmd_q[queue_bit(arch, HostQueue.EXT, g)].append(self._cmd(
                HostQueue.EXT, g, {"ext": self.ext_layout.const(
                {"addr": addr, "words": len(tr.words), "dst_mask": tr.dst_mask << (g * G)})}))
        dram0 = self.dram_stats()
        if dma_hb:
            await self._pool_update(dma_hb, rng)
        words = sum(len(d) for d in cmd_q.values()) + sum(len(d) for d in dma_q.values())
        ext_words = sum(len(j[1].ext_image) for j in jobs if j)
        hb_words = sum(len(w) for j in jobs if j for w in j[1].hb_images)
        budget = 4000 + 30 * words + 4 * (ext_words + hb_words)
        wall = time.perf_counter()
        beats, errors, first, events, host = await self.run(cmd_q, dma_q, n_o=n_o, rng=rng,
                                                      traffic=traffic, budget=budget)
        wall = time.perf_counter() - wall
        end = beats[-1][0] if beats else self.cycle()
        by_pe = [[(k, d) for _, q, k, d in beats if q == p] for p in range(arch.pes)]
        details, mismatches, comparisons = list(errors), len(errors), 0
        groups = []
        pe_status = [None] * arch.pes        # each PE's last STATUS beat's counters
        for g, item in enumerate(jobs):
            if item is None:
                continue
            mine, job, res = item
            gold = ref_moe(x, experts, job.info["routing"], job.mode)
            flags = [False, False]
            for j in range(G):
                got, want = by_pe[g * G + j], res.o[j]
                comparisons += len(want)
                if len(got) != len(want):
                    mismatches += 1
                    details.append(f"group {g} PE {j}: {len(got)} o beats, run_group "
                                   f"{len(want)}")
                for i, ((kind, data), w) in enumerate(zip(got, want)):
                    if kind != int(w.kind):
                        mismatches += 1
                        details.append(f"group {g} PE {j} beat {i}: kind {kind}, run_group "
                                       f"{int(w.kind)}")
                    elif kind == OKind.DATA and data != w.data:
                        mismatches += 1
                        details.append(f"group {g} PE {j} beat {i}: DATA differs")
                    elif kind == OKind.STATUS:
                        s, sw = asm.unpack_status(data), asm.unpack_status(w.data)
                        pe_status[g * G + j] = {n: int(s[n]) for n, _ in asm.STATUS_FIELDS
                                                if n not in ("acc_overflow", "vpu_saturation")}
                        flags[0] |= bool(s["acc_overflow"])
                        flags[1] |= bool(s["vpu_saturation"])
                        for name in asm.FUNCTIONAL_STATUS_FIELDS:
                            if s[name] != sw[name]:
                                mismatches += 1
                                details.append(f"group {g} PE {j} STATUS.{name}: RTL "
                                               f"{s[name]}, run_group {sw[name]}")
            data = [d for k, d in by_pe[g * G + job.root] if k == OKind.DATA]
            T, H = job.tokens, job.hidden
            if len(data) * pe.fp32_per_beat >= T * H:
                y = job.decode(asm.unpack_fp32(asm.ints_to_words(data, pe), pe).reshape(-1))
                for name, ref in (("ref_moe", gold.y), ("run_group", res.y)):
                    bad = y.view(np.uint32) != np.asarray(ref, np.float32).view(np.uint32)
                    comparisons += int(bad.size)
                    mismatches += int(bad.sum())
                    for t, c in list(zip(*np.nonzero(bad)))[:2]:
                        details.append(f"group {g} y[{t}, {c}]: RTL {y[t, c]!r}, {name} "
                                       f"{ref[t, c]!r}")
            else:
                mismatches += T * H
                comparisons += T * H
                details.append(f"group {g}: only {len(data)} DATA beats from the root")
            comparisons += 2
            if tuple(flags) != (gold.acc_overflow, gold.vpu_saturation):
                mismatches += 1
                details.append(f"group {g} flags (acc_overflow, vpu_saturation): RTL "
                               f"{tuple(flags)}, ref_moe {(gold.acc_overflow, gold.vpu_saturation)}")
            tr = job.traffic()
            groups.append({"group": g, "experts": mine,
                           "cached": [e for e in cached if e in mine],
                           "tokens": int(job.tokens), "link_ops": tr["link_ops"],
                           "link_words_sent": tr["link_words_sent"],
                           "ext_ring_bytes": sum(tr["ext_ring_bytes"].values()),
                           "hb_bytes": [sum(h.values()) for h in tr["hb_bytes"]],
                           "host_bytes": tr["host_bytes"]})
        if self.violations:
            mismatches += len(self.violations)
            details += self.violations[:2]
        cycles = end - first + 1
        exchange = exchange_figures(
            events, self.probe_offsets, pes_per_group=G,
            flits_per_word=self.pe.word_bytes // int(arch.aggregation_bytes_per_cycle),
            link_ops=[item[1].link_ops if item else None for item in jobs],
            final_ops=[self._final_ops(item[1]) if item else 0 for item in jobs],
            first=first, end=end)
        for eg in exchange["groups"]:
            comparisons += 1
            if eg["descriptors"] != eg["descriptors_sent"]:
                mismatches += 1
                details.append(f"group {eg['group']}: the link took {eg['descriptors']} "
                               f"descriptors, {eg['descriptors_sent']} were sent")
        if self.params.get("dump_probes"):
            out = Path(load_params().get("out_dir") or os.getcwd())
            name = f"probes-{self.test}-{phase}-T{x.shape[0]}.json"
            (out / name).write_text(json.dumps({"first": first, "end": end, "events": events,
                                                "fields": self.probe_offsets, **host}))
        ext_words = sum(exchange["counts"]["ext_word"])
        want_ext = sum(sum(item[1].traffic()["ext_pe_bytes"]) for item in jobs if item) \
            // pe.word_bytes
        comparisons += 1
        if ext_words != want_ext:
            mismatches += 1
            details.append(f"the ring delivered {ext_words} EXT words to the PEs, the "
                           f"programs' EXT loads take {want_ext}")
        dram1 = self.dram_stats()
        dram = {k: ({n: v - dram0[k][n] for n, v in dram1[k].items()}
                    if isinstance(dram1[k], dict) else dram1[k]) for k in dram1}
        rec = dict(case=case, phase=phase, traffic=traffic, tokens=int(x.shape[0]),
                   experts_run=used, groups=groups, cycles=cycles, comparisons=comparisons,
                   mismatches=mismatches, details=details[:MAX_DETAILS],
                   hb_by_dma=sorted(hb_by_dma), dram=dram,
                   hb_bytes_per_cycle=dram["hb"]["bytes_read"] / cycles,
                   ext_bytes_per_cycle=dram["ext"]["bytes_read"] / cycles,
                   link_bytes=sum(g["link_words_sent"] for g in groups) * pe.word_bytes,
                   exchange=exchange, pe_status=pe_status,
                   wall_seconds=wall, note=SYNTHETIC_NOTE)
        return self.record(**rec)

    def _final_ops(self, job) -> int:
        """Descriptors at the end of a verify job's ``link_ops`` that sum the OUT rows on the
        root (:func:`elmoe3d.sw.host.parallel.compile_group`: ``out_words`` in steps of
        ``buffer_words``); 0 for the draft."""
        if job.phase != "verify" or job.pes < 2:
            return 0
        R = self.pe.rows
        out_words = -(-job.tokens // R) * R * job.hidden // self.pe.q24_per_word
        return -(-out_words // job.buffer_words)

    async def _pool_update(self, images, rng):
        """Write PE images into HB through the host DMA (``HB_WRITE``, whole bursts in
        address order), then wait until the HB ports are idle (every write is in the
        controller's queue before any read of the next programs)."""
        arch, W = self.arch, self.pe.word_bits
        kb = max(1, arch.hb.burst_bytes // self.pe.word_bytes)
        dma_q = {dma_bit(arch, DmaKind.HB_WRITE, p): deque() for p in images}
        for p, words in images.items():
            words = list(words) + [0] * (-len(words) % kb)
            for a, w in enumerate(words):
                dma_q[dma_bit(arch, DmaKind.HB_WRITE, p)].append(self.dma_layout.const(
                    {"kind": DmaKind.HB_WRITE, "pe": p, "addr": a,
                     "data": int(w) & ((1 << W) - 1)}).as_bits())
        log = []
        await self._host("host_dma", dma_q, "dma_room", rng, 0.0, log)
        for _ in range(64):
            await RisingEdge(self.dut.clk)

    def dram_stats(self) -> dict:
        keys = ("rd", "wr", "act", "pre", "refpb", "refab", "bytes_read", "bytes_written",
                "row_hits", "row_misses", "row_conflicts")
        out = {}
        for name, devs in (("hb", self.hb_devs), ("ext", self.ext_devs)):
            out[name] = {k: sum(int(d.stats.get(k, 0)) for d in devs) for k in keys}
        out["violations"] = len(self.violations)
        return out

    # -- records --

    def record(self, **rec):
        rec.setdefault("test", self.test)
        self.records.append(rec)
        self.dut._log.info("%-24s %-6s %-6s T=%-3d experts %-20s %7d cycles %6d values "
                           "%d mismatches; HB %.1f B/cycle, EXT %.1f B/cycle", rec["case"],
                           rec["phase"], rec["traffic"], rec["tokens"], rec["experts_run"],
                           rec["cycles"], rec["comparisons"], rec["mismatches"],
                           rec.get("hb_bytes_per_cycle", 0.0), rec.get("ext_bytes_per_cycle", 0.0))
        ex = rec.get("exchange")
        if ex and ex["psum_cycles"]:
            self.dut._log.info("  psum exchange %d cycles, %d inside the LSB-fetch window "
                               "(overlap %.3f, %s without the final OUT reduction, concurrent "
                               "%.3f); exposed %d cycles (%d of them the final OUT reduction), "
                               "%.1f%% of the layer",
                               ex["psum_cycles"], ex["hidden_cycles"], ex["overlap"],
                               ex["overlap_in_layer"], ex["concurrent"], ex["exposed_cycles"],
                               ex["exposed_final_cycles"], 100 * ex["exposed_share"])
        for line in rec.get("details", []):
            self.dut._log.error("  %s: %s", rec["case"], line)
        return rec

    def fail(self, case, message):
        return self.record(case=case, phase="-", traffic=self.traffic, tokens=0, experts_run=[],
                           cycles=0, comparisons=0, mismatches=1, details=[message],
                           error=message)

    def finish(self):
        for dev, name in self.devices:
            try:
                dev.finish()
            except TimingViolation as exc:
                self.violations.append(str(exc))
                self.fail("DRAM refresh", str(exc))
        path = self.write_summary()
        bad = [r for r in self.records if r["mismatches"]]
        self.dut._log.info("%s: %d cases, %d values compared, %d failing; DRAM %s; %s; "
                           "summary %s", self.test, len(self.records),
                           sum(r["comparisons"] for r in self.records), len(bad),
                           self.dram_stats(), SYNTHETIC_NOTE, path)
        assert not bad and not self.violations, (
            f"{len(bad)} case(s) failed (seed {self.seed}): "
            + failed_cases(bad, "phase")
            + (f"; DRAM violations: {self.violations[:2]}" if self.violations else ""))


async def _bench(dut, test, traffic="-") -> DieBench:
    bench = DieBench(dut, load_params(), test, traffic)
    await bench.start()
    return bench


def _experts(bench, params):
    hidden, inter, n = int(params["hidden"]), int(params["intermediate"]), int(params["experts"])
    ws = synthetic_experts(bench.rng("experts"), n, hidden, inter)
    return [Expert.quantize(*w, name=f"synthetic{i}") for i, w in enumerate(ws)]


# -- tests -----------------------------------------------------------------------------------

@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_phases(dut, traffic):
    """For each batch of ``tokens`` Mixtral-routed decode tokens: the draft (HB-only TP over
    the cached experts) and the verify (cached experts MSB-TP/LSB-DP, uncached ones from EXT)
    of the layer on the whole die, every group serving its share of the experts."""
    bench = await _bench(dut, f"test_phases-{traffic}", traffic)
    with bench.summary():
        params = bench.params
        path = Path(params.get("routing") or default_routing())
        experts = _experts(bench, params)
        cached = [int(e) for e in params["cached"]]
        dut._log.info("routing %s; %d synthetic experts H=%d I=%d, cached %s (%s)", path,
                      len(experts), int(params["hidden"]), int(params["intermediate"]), cached,
                      SYNTHETIC_NOTE)
        for tokens in params["tokens"]:
            layer = int(params["layers"].get(str(tokens), 0))
            ids, wts, _ = read_routing(path, problem=int(params["problem"]), layer=layer,
                                       tokens=int(tokens), n_experts=len(experts))
            x = bench.rng(f"x/{tokens}").standard_normal((int(tokens), int(params["hidden"])))
            for phase in ("draft", "verify"):
                await bench.moe_case(f"trace L{layer} T={tokens}", x, experts, (ids, wts),
                                     phase, traffic, cached=cached)


@cocotb.test()
async def test_pool_update(dut):
    """The expert-pool update path: PE 0's and PE 3's HB images written through the host DMA
    (HB_WRITE, whole bursts), the others by the backdoor; then the draft runs from them."""
    bench = await _bench(dut, "test_pool_update", "smooth")
    with bench.summary():
        params = bench.params
        experts = _experts(bench, params)
        cached = [int(e) for e in params["cached"]]
        tokens = int(params["pool_tokens"])
        layer = int(params["layers"].get(str(tokens), 0))
        ids, wts, _ = read_routing(Path(params.get("routing") or default_routing()),
                                   problem=int(params["problem"]), layer=layer, tokens=tokens,
                                   n_experts=len(experts))
        x = bench.rng("x").standard_normal((tokens, int(params["hidden"])))
        await bench.moe_case(f"pool update T={tokens}", x, experts, (ids, wts), "draft",
                             "smooth", cached=cached, hb_by_dma=(0, bench.arch.pes - 1))


@cocotb.test()
async def test_host_errors(dut):
    """``errors`` is 0 after the bench's reset. A host command naming a group that does not
    exist is taken and dropped, and sets the sticky ``errors`` bit 0 (bit 1 stays clear).
    Then, with bit 0 still set (nothing clears it in between), a link descriptor with
    ``chunk`` = 0 for the last group: its link rejects it (taken, never busy) and
    ``errors.link_bad_desc`` shows that group's bit beside bit 0; one ``errors_clear``
    strobe of every bit clears them all."""
    bench = await _bench(dut, "test_host_errors", "smooth")
    with bench.summary():
        arch = bench.arch
        index_bits = bench.cmd_layout["index"].shape.width
        if (1 << index_bits) <= arch.groups:
            bench.fail("bad group index", f"no out-of-range group index fits {index_bits} bits")
            return
        op = link_op_layout(arch.pes_per_group).const({"words": 1, "src_mask": 1,
                                                       "dst_mask": 1})
        bad = bench._cmd(HostQueue.LINK, (1 << index_bits) - 1, {"link": op})
        before = int(dut.errors.value)
        await RisingEdge(dut.clk)
        dut.host_cmd__payload.value = bad
        dut.host_cmd__valid.value = 1
        await ReadOnly()
        taken = dut.host_cmd__ready.value == 1
        await RisingEdge(dut.clk)
        dut.host_cmd__valid.value = 0
        for _ in range(3):
            await RisingEdge(dut.clk)
        after = int(dut.errors.value)
        room = int(dut.cmd_room.value)
        details = []
        if before != 0:
            details.append(f"errors = {before:#b} after reset")
        if not taken:
            details.append("the beat naming a missing group was not taken")
        if after != 0b01:
            details.append(f"errors = {after:#b} after the bad beat, expected 0b01")
        if room != (1 << (arch.pes + 2 * arch.groups)) - 1:
            details.append(f"cmd_room = {room:#b}: a queue took the dropped beat")
        bench.record(case="bad group index", phase="-", traffic="smooth", tokens=0,
                     experts_run=[], cycles=0, comparisons=4, mismatches=len(details),
                     details=details, dram=bench.dram_stats(), note="host error path, no data")

        # a descriptor the link must reject (it deadlocked the link before the check)
        E = die_errors_layout(arch, bench.die.ext_channels)
        g = arch.groups - 1
        op = link_op_layout(arch.pes_per_group).const({
            "mode": LinkMode.ALL_TO_ALL.value, "src_mask": 1, "dst_mask": 1, "words": 2,
            "chunk": 0})
        await RisingEdge(dut.clk)
        dut.host_cmd__payload.value = bench._cmd(HostQueue.LINK, g, {"link": op})
        dut.host_cmd__valid.value = 1
        await ReadOnly()
        taken = dut.host_cmd__ready.value == 1
        await RisingEdge(dut.clk)
        dut.host_cmd__valid.value = 0
        busy = 0
        # queue -> link -> flag, then a few cycles more in which a wrongly run descriptor
        # would show link_busy
        for _ in range(bench.die.link_error_latency + 4):
            await RisingEdge(dut.clk)
            await ReadOnly()
            busy |= dut.probe.value.to_unsigned() >> bench.probe_offsets["link_busy"][0] \
                & ((1 << arch.groups) - 1)
        flagged = int(dut.errors.value)
        room = int(dut.cmd_room.value)
        await RisingEdge(dut.clk)
        dut.errors_clear.value = (1 << E.size) - 1
        await RisingEdge(dut.clk)
        dut.errors_clear.value = 0
        for _ in range(2):
            await RisingEdge(dut.clk)
        cleared = int(dut.errors.value)
        want = E.const({"cmd_index": 1, "link_bad_desc": 1 << g}).as_bits()
        details = []
        if not taken:
            details.append("the descriptor was not taken")
        if busy:
            details.append(f"link_busy = {busy:#b}: a rejected descriptor ran")
        if flagged != want:
            details.append(f"errors = {flagged:#b} after the chunk-0 descriptor, expected "
                           f"{want:#b}")
        if room != (1 << (arch.pes + 2 * arch.groups)) - 1:
            details.append(f"cmd_room = {room:#b}: the link queue kept the descriptor")
        if cleared != 0:
            details.append(f"errors = {cleared:#b} after errors_clear of every bit")
        bench.record(case="bad link descriptor", phase="-", traffic="smooth", tokens=0,
                     experts_run=[], cycles=0, comparisons=5, mismatches=len(details),
                     details=details, dram=bench.dram_stats(), note="host error path, no data")


# -- host side -------------------------------------------------------------------------------

TESTS = ("test_phases", "test_pool_update", "test_host_errors")


#: A host-side run of this bench (the runner's result and the case records).
DieBenchResult = BenchResult


def build_die(arch: ArchConfig, die: dict | None = None, *, waves=None):
    """Verilog + Verilator build of ``LogicDie(config=arch, **die)`` (reused when unchanged)."""
    from .runner import build
    kwargs = die_kwargs({"die": die})
    return build(LogicDie(config=arch, **kwargs), name=f"die_{arch.name.replace('-', '_')}",
                 toplevel="die", waves=waves,
                 verilog_key={"LogicDie": repr(arch), "kwargs": repr(sorted(kwargs.items()))})


def run_die_bench(arch: ArchConfig | None = None, *, tests=None, seed=None, waves=None,
                  params=None, die=None, built=None, check=True) -> DieBenchResult:
    """Build (or reuse) the die and run the named tests of this bench (default: all).
    ``params`` are merged over ``{"arch": arch.name, "routing": default_routing(), "die":
    die}``; records are read from the run folder's ``summary-*.json`` files."""
    arch = arch or preset("small")
    die = die_kwargs({"die": die})
    built = built or build_die(arch, die, waves=waves)
    merged = {"arch": arch_param(arch), "routing": str(default_routing()), "die": die,
              **(params or {})}
    return run_bench(built, test_module=__name__, tests=tests, default_tests=TESTS,
                     params=merged, prefix="bench_die", seed=seed, check=check)


# -- figure 9 of ``elmoe3d bench`` ----------------------------------------------------------

#: Figure 9: the paper's design goal for the verify-phase overlap (all of the psum exchange
#: hidden behind the LSB fetch; paper Section 5.2). Reported beside the measurement, not a
#: pass/fail target.
OVERLAP_GOAL = 1.0


def perf_cycles(arch, tokens: int, phase: str, params=None) -> float:
    """The performance model's cycles (:class:`~elmoe3d.sw.host.perf.PerfModel`, the die
    feed) of the bench's ``test_phases`` case of ``tokens`` tokens in ``phase``: the same
    routing, layer, cached experts and placement (expert e on group e mod the groups), the
    model's shapes the bench's synthetic ``hidden`` x ``intermediate``, and the bench
    build's EXT channels (``params["die"]``, :data:`DIE_DEFAULTS`) in ``arch``."""
    import dataclasses
    from ..sw.host.compiler import LayerWork, Placement, synthetic_model
    from ..sw.host.perf import PerfModel
    params = {**DEFAULTS, **(params or {})}
    ch = die_kwargs(params)["ext_channels"] or arch.ext_channels
    arch = dataclasses.replace(arch, ext_channels=ch,
                               ext_bytes=arch.ext_bytes // arch.ext_channels * ch,
                               ext_gbps=arch.ext.peak_gbps * ch)
    n = int(params["experts"])
    layer = int(params["layers"].get(str(tokens), 0))
    ids, wts, _ = read_routing(Path(params.get("routing") or default_routing()),
                               problem=int(params["problem"]), layer=layer, tokens=int(tokens),
                               n_experts=n)
    cached = frozenset(int(e) for e in params["cached"])
    if phase == "draft":
        ids = np.where(np.isin(ids, list(cached)), ids, -1)
    work = LayerWork(layer=layer, ids=ids, weights=np.asarray(wts, np.float32), cached=cached)
    tokens_of = work.expert_tokens()
    groups = [{e: tokens_of[e] for e in mine}
              for mine in group_experts(sorted(tokens_of), phase, cached, arch.groups)]
    placement = Placement(groups=tuple(groups),
                          cached=tuple(frozenset(set(g) & cached) for g in groups))
    model = synthetic_model("mixtral-8x7b", (int(params["hidden"]), int(params["intermediate"])))
    return PerfModel(arch, model).layer(work, placement, phase=phase,
                                        step_tokens=int(tokens)).cycles


#: Figure 9: the perf model's target against the die, per step kind (issue 26 item 6).
PERF_TARGET = 0.05


def perf_by_kind(cases) -> dict:
    """``{phase: (die cycles, perf model cycles)}`` summed over figure 9's ``cases`` (the
    per-kind comparison of :data:`PERF_TARGET`)."""
    out = {}
    for c in cases:
        die, perf = out.get(c["phase"], (0, 0.0))
        out[c["phase"]] = (die + c["cycles"], perf + c["perf_cycles"])
    return out


def die_figures(arch, seed=None) -> dict:
    """Figure 9: the die bench's ``test_phases`` with smooth traffic on ``arch``
    (:class:`~elmoe3d.config.ArchConfig`; the bench build, :data:`DIE_DEFAULTS`): per batch
    and phase the cycles, HB and EXT bytes per cycle against their peaks, link bytes, the
    verify-phase overlap (:func:`exchange_figures`), bit-exact comparisons and mismatches,
    DRAM timing violations.

    Returns ``{"cases": [...], "failures": [...], "seed", "log", "hb_peak_bytes_per_cycle"
    (all banks), "ext_peak_bytes_per_cycle" (the bench's channels), "pes", "ext_channels",
    "overlap_goal"}``; failures are failing cases and cocotb tests, one line each."""
    channels = DIE_DEFAULTS.get("ext_channels") or arch.ext_channels
    res = run_die_bench(arch, tests="test_phases/traffic=smooth", seed=seed, check=False)
    cases, failures = [], []
    for r in res.records:
        if r.get("error"):
            failures.append(f"{r['case']}: {r['error']}")
            continue
        ex = r.get("exchange") or {}
        cases.append({
            "tokens": r["tokens"], "phase": r["phase"], "experts": r["experts_run"],
            "cycles": r["cycles"],
            "perf_cycles": perf_cycles(arch, r["tokens"], r["phase"]),
            "hb_bytes_per_cycle": r["hb_bytes_per_cycle"],
            "ext_bytes_per_cycle": r["ext_bytes_per_cycle"], "link_bytes": r["link_bytes"],
            "psum_cycles": ex.get("psum_cycles", 0), "overlap": ex.get("overlap"),
            "overlap_in_layer": ex.get("overlap_in_layer"),
            "concurrent": ex.get("concurrent"), "exposed_cycles": ex.get("exposed_cycles", 0),
            "exposed_final_cycles": ex.get("exposed_final_cycles", 0),
            "exposed_share": ex.get("exposed_share", 0.0),
            "comparisons": r["comparisons"], "mismatches": r["mismatches"],
            "violations": r["dram"]["violations"], "details": r["details"][:2]})
        if r["mismatches"]:
            failures.append(f"T={r['tokens']} {r['phase']}: {r['mismatches']} mismatch(es): "
                            f"{'; '.join(r['details'][:2])}")
    for tc in res.sim.testcases:
        if tc.status == "failed" and not failures:
            failures.append(f"{tc.name}: "
                            f"{tc.message.splitlines()[0] if tc.message else 'failed'}")
    if not res.sim.tests:
        failures.append("test_phases did not run")
    return {"cases": cases, "failures": failures, "seed": res.sim.seed,
            "log": str(res.sim.log_file), "pes": arch.pes,
            "hb_peak_bytes_per_cycle": arch.hb_bytes_per_cycle * arch.pes,
            "ext_peak_bytes_per_cycle": arch.ext.peak_gbps * channels / arch.clock_ghz,
            "ext_channels": channels, "overlap_goal": OVERLAP_GOAL}


#: Definition printed under figure 9.
DIE_DEFINITION = (
    "cycles: first host command taken to the last o beat; HB/EXT: bytes the DRAM models "
    "delivered / cycles (% of the peak of every bank / of the bench's LPDDR5 channels); link: "
    "bytes the PEs put on the aggregation links. Overlap (verify) = psum-exchange cycles "
    "inside the LSB-fetch window / psum-exchange cycles, per group: exchange = spans of the "
    "BYPASS / REDUCE_ADD descriptors from their first flit to their last word delivered; "
    "window = first to last EXT word the ring delivered to the group. Exposed = exchange "
    "cycles outside the window (final: the layer-final OUT-row reduction, after the last "
    "GEMM by construction), share of the layer's cycles; in layer: the overlap without that "
    "final reduction. Every o beat compared with "
    "run_group, every output with ref_moe; DRAM timing checked on every command.")


def print_die(console, figs, number: int | None = None) -> list:
    """Print figure 9's table; return the missed-target lines (mismatches, DRAM timing
    violations, failed runs; the overlap is reported against the paper's goal, not judged)."""
    from rich.table import Table
    missed = []
    hb_peak, ext_peak = figs["hb_peak_bytes_per_cycle"], figs["ext_peak_bytes_per_cycle"]
    table = Table(title=figure_prefix(number) + f"Logic die, MoE layer of the Mixtral routing "
                        f"({figs['pes']} PEs, HB "
                        f"peak {hb_peak:g} B/cycle, EXT {figs['ext_channels']} channels "
                        f"{ext_peak:g} B/cycle; overlap goal {figs['overlap_goal']:g})",
                  title_justify="left", caption=DIE_DEFINITION, caption_justify="left")
    for col in ("T", "phase", "cycles", "perf model", "HB B/cycle", "EXT B/cycle", "link bytes",
                "psum cycles", "overlap (in layer)", "exposed (final)", "compared", "mismatches",
                "DRAM viol.", "target"):
        table.add_column(col, justify="left" if col in ("phase", "target") else "right")
    for c in figs["cases"]:
        ok = c["mismatches"] == 0 and c["violations"] == 0
        if c["mismatches"]:
            missed.append(f"die T={c['tokens']} {c['phase']}: {c['mismatches']} mismatch(es) "
                          f"in {c['comparisons']:,} comparisons")
        if c["violations"]:
            missed.append(f"die T={c['tokens']} {c['phase']}: {c['violations']} DRAM timing "
                          f"violation(s)")
        verify = c["phase"] == "verify"
        overlap = "-"
        if verify and c["overlap"] is not None:
            inner = c.get("overlap_in_layer")
            overlap = f"{c['overlap']:.3f} ({inner:.3f})" if inner is not None \
                else f"{c['overlap']:.3f} (-)"
        exposed = (f"{c['exposed_cycles']:,} ({c['exposed_final_cycles']:,}) "
                   f"{c['exposed_share']:.1%}") if verify else "-"
        table.add_row(str(c["tokens"]), c["phase"], f"{c['cycles']:,}",
                      f"{c['perf_cycles']:,.0f} ({c['perf_cycles'] / c['cycles'] - 1:+.1%})",
                      f"{c['hb_bytes_per_cycle']:.1f} ({c['hb_bytes_per_cycle'] / hb_peak:.0%})",
                      f"{c['ext_bytes_per_cycle']:.1f} "
                      f"({c['ext_bytes_per_cycle'] / ext_peak:.0%})",
                      f"{c['link_bytes']:,}", f"{c['psum_cycles']:,}" if verify else "-",
                      overlap, exposed, f"{c['comparisons']:,}", str(c["mismatches"]),
                      str(c["violations"]), "[green]met[/]" if ok else "[red]MISSED[/]")
    console.print(table)
    kinds = perf_by_kind(figs["cases"])
    if kinds:
        console.print("perf model (die feed) / die, per step kind over the batches: " + "; ".join(
            f"{k} {perf:,.0f} / {die:,} ({perf / die - 1:+.1%})"
            for k, (die, perf) in kinds.items()) + f"; target within {PERF_TARGET:.0%}")
    for k, (die, perf) in kinds.items():
        if abs(perf / die - 1) > PERF_TARGET:
            missed.append(f"die {k}: the perf model's {perf:,.0f} cycles are "
                          f"{perf / die - 1:+.1%} off the die's {die:,}")
    if not figs["cases"]:
        missed.append("logic die: no case measured")
    for line in figs["failures"]:
        missed.append(f"die bench: {line} (log {figs['log']})")
    return missed

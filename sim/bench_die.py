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
     "cached": [0, 2, 3, 5, 6]}                 # HB-resident experts (the draft pool)

The host side of every case: each PE group serves a share of the experts (expert ``e`` on
group ``e % groups``); :func:`elmoe3d.sw.parallel.compile_group` compiles the group's work
(draft: HB-only TP over the cached experts; verify: MSB-TP from HB + LSB-DP from EXT with
psum-level synchronisation for cached experts, uncached experts streamed whole from EXT).
The HB banks get each PE's MSB slices and scales by the behavioural model's backdoor (or,
in the pool-update case, through the die's host DMA ``HB_WRITE`` path); EXT (the LPDDR5
models) holds each group's image (LSB slices, scale copies, uncached experts) at its own base
address. The host then streams, on one command stream with per-queue room bits, every PE's
program, every group's link descriptors and the EXT read descriptors (group-local masks
shifted to the die's PEs), and on the DMA stream the HOST loads' words.

Checked with plain equality, per group:

* every ``o`` beat of every PE of the group against the multi-PE functional simulation
  (:func:`elmoe3d.sw.parallel.run_group`): DATA beats bit for bit, STATUS beats on their
  functional fields;
* the root PE's decoded FP32 output ``[T, H]`` (as bits) against the golden MoE layer
  :func:`elmoe3d.sw.expert.ref_moe` for the group's routing (and against ``run_group``);
* the sticky flags (OR over the group's PEs) against ``ref_moe``;
* every DRAM command against the timing rules (:class:`elmoe3d.sim.dram_model.DramDevice`:
  zero violations, refresh rate checked at the end); the die's ``errors`` output stays 0.

Expert weights and token activations are synthetic (seeded Gaussians); the routing is the
real Mixtral trace. Traffic ``smooth``: the host offers a beat every cycle, ``o`` always
ready; ``stalls``: idle host cycles and backpressure on the die's ``o``. Each test writes
``summary-<test>.json`` into the run folder and fails if any case failed. Seeds:
:func:`~elmoe3d.sim.runner.resolve_seed`, one generator per case.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import ReadOnly, RisingEdge

from ..config import ArchConfig, preset
from ..hw.agg_link import link_op_layout, pack_link_op
from ..hw.die import (DmaKind, HostQueue, LogicDie, die_o_layout, dma_bit, host_cmd_layout,
                      host_dma_layout, queue_bit)
from ..hw.ext_stream import ext_read_layout
from ..hw.isa import command_layout
from ..isa import Source
from ..sw import asm
from ..sw.asm import OKind
from ..sw.expert import Expert, ref_moe
from ..sw.parallel import compile_group, run_group
from .bench_pe import SYNTHETIC_NOTE, _synthetic_experts, default_routing, read_routing
from .dram_model import DramDevice, TimingViolation
from .runner import case_rng, load_params, resolve_seed


__all__ = ["DEFAULTS", "DIE_DEFAULTS", "TESTS", "DieBenchResult", "build_die", "run_die_bench",
           "die_kwargs"]

#: Clock period of the bench (ns of simulation time; only cycles are reported).
CLOCK_NS = 10
#: traffic name -> (probability the host offers nothing in a cycle, probability the die's
#: ``o`` is not ready in a cycle).
TRAFFIC = {"smooth": (0.0, 0.0), "stalls": (0.3, 0.4)}
MAX_DETAILS = 8
#: LogicDie parameters of the bench build (merged under ``params["die"]``): two LPDDR5
#: channels (a scaled ExtController with the same per-channel behaviour) keep the build small.
DIE_DEFAULTS = {"ext_channels": 2, "hb_queue_depth": 16, "ext_queue_depth_bursts": 16,
                "ext_read_buffer": 16}
DEFAULTS = {"arch": "small", "hidden": 64, "intermediate": 128, "experts": 8,
            "tokens": [1, 4, 16],
            "layers": {"1": 0, "4": 15, "16": 31}, "problem": 0,
            "cached": [0, 2, 3, 5, 6], "pool_tokens": 4}


def arch_from_params(params) -> ArchConfig:
    arch = params.get("arch", DEFAULTS["arch"])
    return preset(arch) if isinstance(arch, str) else ArchConfig.from_dict(arch)


def die_kwargs(params) -> dict:
    """The LogicDie keyword arguments of a run (``DIE_DEFAULTS`` under ``params["die"]``)."""
    return {**DIE_DEFAULTS, **(params.get("die") or {})}


def _ints(values):
    return [int(v) for v in values]


def _to_bytes(words, nbytes):
    return b"".join(int(w).to_bytes(nbytes, "little") for w in words)


class DieBench:
    """Clock, reset, DRAM models, the host driver and the output monitor of one die DUT."""

    def __init__(self, dut, params, test, traffic="-"):
        self.dut, self.test, self.traffic = dut, test, traffic
        self.params = {**DEFAULTS, **params}
        self.arch = arch = arch_from_params(self.params)
        self.pe = arch.pe
        self.seed = resolve_seed()
        probe = LogicDie(config=arch, **die_kwargs(self.params))
        probe._MustUse__silence = True
        self.die = probe
        self.records = []
        self.violations = []
        self.o_layout = die_o_layout(arch)
        self.cmd_layout = host_cmd_layout(arch)
        self.dma_layout = host_dma_layout(arch)
        self.ext_layout = ext_read_layout(arch.pes)

    @staticmethod
    def cycle() -> int:
        return int(get_sim_time("ns")) // CLOCK_NS

    def rng(self, case):
        return case_rng(self.seed, f"{self.test}/{case}")

    # -- DRAM models --

    def _bus(self, prefix):
        dut = self.dut
        return {n: getattr(dut, f"{prefix}__{n}") for n in (
            "row_valid", "row_kind", "row_bank", "row_addr", "col_valid", "col_write",
            "col_bank", "col_addr", "col_wdata", "rd_valid", "rd_data")}

    async def _devices(self):
        """Clock every DRAM model once per logic cycle with the command bus it sampled; its
        read data goes back during the next cycle. A violation is recorded and that model
        stops (the test then fails)."""
        devs = [(d, self._bus(p)) for d, p in self.devices]
        rd = [None] * len(devs)
        shown = [False] * len(devs)
        live = [True] * len(devs)
        while True:
            for i, (_, h) in enumerate(devs):
                if rd[i] is not None:
                    h["rd_data"].value = rd[i]
                if shown[i] != (rd[i] is not None):
                    shown[i] = rd[i] is not None
                    h["rd_valid"].value = int(shown[i])
            await ReadOnly()
            for i, (dev, h) in enumerate(devs):
                if not live[i]:
                    continue
                row = col = None
                if h["row_valid"].value == 1:
                    row = (int(h["row_kind"].value), int(h["row_bank"].value),
                           int(h["row_addr"].value))
                if h["col_valid"].value == 1:
                    write = int(h["col_write"].value)
                    col = (write, int(h["col_bank"].value), int(h["col_addr"].value),
                           int(h["col_wdata"].value) if write else 0)
                try:
                    rd[i] = dev.clock(row, col)
                except TimingViolation as exc:
                    self.violations.append(str(exc))
                    self.dut._log.error("%s", exc)
                    live[i] = False
                    rd[i] = None
            await RisingEdge(self.dut.clk)

    def preload_hb(self, p, words):
        """Backdoor: PE ``p``'s HB bank holds ``words`` from word 0."""
        dev = self.hb_devs[p]
        bb = dev.cfg.burst_bytes
        raw = _to_bytes(words, self.pe.word_bytes)
        raw += bytes(-len(raw) % bb)
        for b in range(len(raw) // bb):
            dev.memory[dev.cfg.decode(b)] = int.from_bytes(raw[b * bb:(b + 1) * bb], "little")

    def preload_ext(self, base, words):
        """Backdoor: EXT words ``base ..`` hold ``words`` (striped over the channels: stripe s
        = one burst per channel, channel 0 lowest)."""
        chans = self.ext_devs
        bb = chans[0].cfg.burst_bytes
        stripe = bb * len(chans)
        start = base * self.pe.word_bytes
        assert start % stripe == 0, (base, stripe)
        raw = _to_bytes(words, self.pe.word_bytes)
        raw += bytes(-len(raw) % stripe)
        for s in range(len(raw) // stripe):
            addr = start // stripe + s
            for c, dev in enumerate(chans):
                off = s * stripe + c * bb
                dev.memory[dev.cfg.decode(addr)] = int.from_bytes(raw[off:off + bb], "little")

    # -- start --

    async def start(self):
        dut, arch = self.dut, self.arch
        Clock(dut.clk, CLOCK_NS, unit="ns").start(start_high=False)
        dut.rst.value = 1
        for port in ("host_cmd", "host_dma"):
            getattr(dut, f"{port}__valid").value = 0
        dut.o__ready.value = 0
        n_ext = self.die.ext_channels
        for p in range(arch.pes):
            getattr(dut, f"hb__{p}__rd_valid").value = 0
        for c in range(n_ext):
            getattr(dut, f"ext__{c}__rd_valid").value = 0
        for _ in range(3):
            await RisingEdge(dut.clk)
        dut.rst.value = 0
        self.hb_devs = [DramDevice(arch.hb, clock_ghz=arch.clock_ghz, name=f"hb{p}", seed=p)
                        for p in range(arch.pes)]
        self.ext_devs = [DramDevice(arch.ext, clock_ghz=arch.clock_ghz, name=f"ext{c}",
                                    seed=100 + c) for c in range(n_ext)]
        self.devices = [(d, f"hb__{p}") for p, d in enumerate(self.hb_devs)] + \
            [(d, f"ext__{c}") for c, d in enumerate(self.ext_devs)]
        cocotb.start_soon(self._devices())
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
                log.append(self.cycle())
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

    async def _monitor(self, out, rng, backpressure, errors):
        dut = self.dut
        held = None
        while True:
            dut.o__ready.value = 0 if backpressure and rng.random() < backpressure else 1
            await ReadOnly()
            v = dut.o__valid.value == 1
            raw = dut.o__payload.value.to_unsigned() if v else None
            if held is not None and (not v or raw != held[0]):
                errors.append(f"cycle {self.cycle()}: o beat offered at cycle {held[1]} was "
                              f"withdrawn or changed before it was taken")
            held = None
            if v:
                if dut.o__ready.value == 1:
                    out.append((self.cycle(), raw))
                else:
                    held = (raw, self.cycle())
            await RisingEdge(dut.clk)

    async def run(self, cmd_queues, dma_queues, *, n_o, rng, traffic, budget):
        """Stream the host queues into the die and collect ``o`` beats until ``n_o`` came
        out (or ``budget`` cycles passed), then drain: nothing more may come out. Returns
        ``(beats as (cycle, pe, kind, data), errors, first command cycle)``."""
        dut = self.dut
        idle, bp = TRAFFIC[traffic]
        out, errors, cmd_log, dma_log = [], [], [], []
        mon = cocotb.start_soon(self._monitor(out, rng, bp, errors))
        hosts = [cocotb.start_soon(self._host("host_cmd", cmd_queues, "cmd_room", rng, idle,
                                              cmd_log)),
                 cocotb.start_soon(self._host("host_dma", dma_queues, "dma_room", rng, idle,
                                              dma_log))]
        start = self.cycle()
        deadline = start + int(budget / (1 - idle) / (1 - bp))
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
        mon.cancel()
        dut.o__ready.value = 1
        for _ in range(40):
            await ReadOnly()
            if dut.o__valid.value == 1:
                out.append((self.cycle(), dut.o__payload.value.to_unsigned()))
            await RisingEdge(dut.clk)
        if len(out) > n_o:
            errors.append(f"extra output: {len(out)} o beats, expected {n_o}")
        if int(dut.errors.value):
            errors.append(f"die errors output = {int(dut.errors.value):#b}")
        beats = []
        for cyc, raw in out:
            view = self.o_layout.from_bits(raw)
            beats.append((cyc, int(view.pe), view.beat.kind.value,
                          int(view.beat.data)))
        return beats, errors, (cmd_log[0] if cmd_log else start)

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
        ids = np.asarray(routing[0])
        used = sorted({int(e) for e in ids.reshape(-1) if e >= 0})
        jobs = []
        for g in range(NG):
            mine = [e for e in used if e % NG == g]
            if phase == "draft":
                mine = [e for e in mine if e in cached]
            if not mine:
                jobs.append(None)
                continue
            job = compile_group(x, experts, routing, phase=phase, config=arch,
                                cached=[e for e in cached if e in mine], group_experts=mine,
                                buffer_words=self.die.link_buffer_words)
            jobs.append((mine, job, run_group(job)))
        cmd_q = {queue_bit(arch, HostQueue.PE, p): deque() for p in range(arch.pes)}
        cmd_q.update({queue_bit(arch, HostQueue.LINK, g): deque() for g in range(NG)})
        ext_bit = queue_bit(arch, HostQueue.EXT)
        cmd_q[ext_bit] = deque()
        dma_q = {dma_bit(arch, k, p): deque() for k in DmaKind for p in range(arch.pes)}
        stripe_words = max(1, self.die.ext_stripe_bytes // pe.word_bytes)
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
            self.preload_ext(base, job.ext_image)
            ext_lists.append([self._cmd(HostQueue.EXT, 0, {"ext": self.ext_layout.const(
                {"addr": base + tr.addr, "words": len(tr.words), "dst_mask": tr.dst_mask << (
                    g * G)})}) for tr in job.ext_transfers])
            base += -(-len(job.ext_image) // stripe_words) * stripe_words
        # the groups' EXT reads interleaved (each group's in its order)
        while any(ext_lists):
            for lst in ext_lists:
                if lst:
                    cmd_q[ext_bit].append(lst.pop(0))
        dram0 = self.dram_stats()
        if dma_hb:
            await self._pool_update(dma_hb, rng)
        words = sum(len(d) for d in cmd_q.values()) + sum(len(d) for d in dma_q.values())
        ext_words = sum(len(j[1].ext_image) for j in jobs if j)
        hb_words = sum(len(w) for j in jobs if j for w in j[1].hb_images)
        budget = 4000 + 30 * words + 4 * (ext_words + hb_words)
        wall = time.perf_counter()
        beats, errors, first = await self.run(cmd_q, dma_q, n_o=n_o, rng=rng, traffic=traffic,
                                              budget=budget)
        wall = time.perf_counter() - wall
        end = beats[-1][0] if beats else self.cycle()
        by_pe = [[(k, d) for _, q, k, d in beats if q == p] for p in range(arch.pes)]
        details, mismatches, comparisons = list(errors), len(errors), 0
        groups = []
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
        dram1 = self.dram_stats()
        dram = {k: ({n: v - dram0[k][n] for n, v in dram1[k].items()}
                    if isinstance(dram1[k], dict) else dram1[k]) for k in dram1}
        rec = dict(case=case, phase=phase, traffic=traffic, tokens=int(x.shape[0]),
                   experts_run=used, groups=groups, cycles=cycles, comparisons=comparisons,
                   mismatches=mismatches, details=details[:MAX_DETAILS],
                   hb_by_dma=sorted(hb_by_dma), dram=dram,
                   hb_bytes_per_cycle=dram["hb"]["bytes_read"] / cycles,
                   ext_bytes_per_cycle=dram["ext"]["bytes_read"] / cycles,
                   wall_seconds=wall, note=SYNTHETIC_NOTE)
        return self.record(**rec)

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
        for line in rec.get("details", []):
            self.dut._log.error("  %s: %s", rec["case"], line)
        return rec

    def fail(self, case, message):
        return self.record(case=case, phase="-", traffic=self.traffic, tokens=0, experts_run=[],
                           cycles=0, comparisons=0, mismatches=1, details=[message],
                           error=message)

    def write_summary(self) -> Path:
        out = Path(load_params().get("out_dir") or os.getcwd())
        path = out / f"summary-{self.test}.json"
        path.write_text(json.dumps(self.records, indent=1))
        return path

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
            + "; ".join(f"{r['case']} {r['phase']} ({r['traffic']}): "
                        + (r.get("error") or f"{r['mismatches']} mismatches, first: "
                           f"{r['details'][:2]}") for r in bad)
            + (f"; DRAM violations: {self.violations[:2]}" if self.violations else ""))

    @contextlib.contextmanager
    def summary(self):
        try:
            yield self
        except Exception as exc:                       # noqa: BLE001 - recorded, then failed
            self.dut._log.error("%s aborted", self.test, exc_info=True)
            self.fail("test aborted", f"{type(exc).__name__}: {exc}")
        except BaseException:
            self.write_summary()
            raise
        self.finish()


async def _bench(dut, test, traffic="-") -> DieBench:
    bench = DieBench(dut, load_params(), test, traffic)
    await bench.start()
    return bench


def _experts(bench, params):
    hidden, inter, n = int(params["hidden"]), int(params["intermediate"]), int(params["experts"])
    ws = _synthetic_experts(bench.rng("experts"), n, hidden, inter)
    return [Expert.quantize(*w, name=f"synthetic{i}") for i, w in enumerate(ws)]


# -- tests -----------------------------------------------------------------------------------

@cocotb.test()
@cocotb.parametrize(traffic=list(TRAFFIC))
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
    """A host command naming a group that does not exist is taken and dropped, and sets the
    sticky ``errors`` bit 0 (bit 1 stays clear); a reset clears it."""
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
        if room != (1 << (arch.pes + arch.groups + 1)) - 1:
            details.append(f"cmd_room = {room:#b}: a queue took the dropped beat")
        bench.record(case="bad group index", phase="-", traffic="smooth", tokens=0,
                     experts_run=[], cycles=0, comparisons=4, mismatches=len(details),
                     details=details, dram=bench.dram_stats(), note="host error path, no data")


# -- host side -------------------------------------------------------------------------------

TESTS = ("test_phases", "test_pool_update", "test_host_errors")


@dataclass(frozen=True)
class DieBenchResult:
    sim: object
    records: list

    @property
    def comparisons(self) -> int:
        return sum(r["comparisons"] for r in self.records)

    @property
    def mismatches(self) -> int:
        return sum(r["mismatches"] for r in self.records)


def build_die(arch: ArchConfig, die: dict | None = None, *, waves=None):
    """Verilog + Verilator build of ``LogicDie(config=arch, **die)`` (reused when unchanged)."""
    from .runner import build
    kwargs = {**DIE_DEFAULTS, **(die or {})}
    return build(LogicDie(config=arch, **kwargs), name=f"die_{arch.name.replace('-', '_')}",
                 toplevel="die", waves=waves)


def run_die_bench(arch: ArchConfig | None = None, *, tests=None, seed=None, waves=None,
                  params=None, die=None, built=None, check=True) -> DieBenchResult:
    """Build (or reuse) the die and run the named tests of this bench (default: all).
    ``params`` are merged over ``{"arch": arch.name, "routing": default_routing(), "die":
    die}``; records are read from the run folder's ``summary-*.json`` files."""
    from .runner import run
    arch = arch or preset("small")
    die = {**DIE_DEFAULTS, **(die or {})}
    built = built or build_die(arch, die, waves=waves)
    tests = [tests] if isinstance(tests, str) else list(tests or TESTS)
    arch_param = arch.name if arch.name in ("small", "paper-4gb", "paper-8gb") \
        and preset(arch.name) == arch else arch.to_dict()
    merged = {"arch": arch_param, "routing": str(default_routing()), "die": die,
              **(params or {})}
    name = "-".join(t.removeprefix("test_") for t in tests)
    result = run(built, test_module=__name__, testcase=tests, params=merged, seed=seed,
                 run_name=f"bench_die-{name}", check=check)
    records = []
    for case in result.testcases:
        base, _, param = case.name.partition("/")
        label = f"{base}-{param.partition('=')[2]}" if param else base
        path = result.test_dir / f"summary-{label}.json"
        if path.is_file():
            records.extend(json.loads(path.read_text()))
    return DieBenchResult(sim=result, records=records)

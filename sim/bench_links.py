"""cocotb benches of the aggregation link and the streamline ring, and their bench figures.

Run through :mod:`elmoe3d.sim.runner` (never directly), with :func:`run_link_bench` /
:func:`run_ring_bench`; the runner writes ``params.json`` (read with
:func:`~elmoe3d.sim.runner.load_params`)::

    {"link": {"pes": 4, "word_bits": 512, "flit_bytes": 32, "buffer_words": 4},
     "descriptors": 40,            # random descriptors per stress test (after the corners)
     "max_words": 16,              # words per source of a random descriptor, at most
     "ring": {"pes": 4, "pes_per_group": 2, "word_bits": 512, "flit_bytes": 128,
              "stream_bits": 4, "buffer_flits": 8},
     "transfers": 60,              # random transfers per ring stress test
     "stream_words": 512,          # link throughput: words per source per descriptor
     "stream_flits": 1024}         # ring throughput: flits per pattern

DUTs: :class:`~elmoe3d.hw.agg_link.AggregationLink` (top ``agg_link``, tests ``test_link_*``)
and :class:`~elmoe3d.hw.ring.StreamlineRing` (top ``streamline_ring``, tests ``test_ring_*``).
Every port is driven from one per-cycle loop: sources present their items with random idle
cycles (garbage payloads while not valid), sinks drop ``ready`` at random (the patterns of
:mod:`elmoe3d.sim.traffic`), and every output is
checked against the stream rule (an offered item stays valid and unchanged until taken).
Payloads are packed only through the Amaranth layouts (:func:`~elmoe3d.hw.agg_link.pack_link_op`,
:func:`~elmoe3d.hw.ring.pack_flit`).

Checks: every destination's word sequence equals the golden model
(:func:`elmoe3d.sw.golden.links.ref_link` over the descriptor sequence, :func:`elmoe3d.sw.golden.links.ref_ring`)
with plain equality -- so every word / flit arrived once, intact and in order -- no word arrives
after the expected ones, the link pulses ``done`` once per descriptor, every source word is
taken and its sticky ``errors`` stay 0 (bad descriptors are the Amaranth-simulator tests' part,
``tests/amaranth/test_agg_link.py``). Each test writes ``summary-<test>.json`` (case records) into the run folder and then
fails if a case mismatched.

Figures (:func:`link_figures`, :func:`print_links`, for ``elmoe3d bench``): streaming traffic
(always-valid sources, always-ready sinks) through the link in each mode (bytes per port per
cycle as a fraction of ``aggregation_bytes_per_cycle``) and through the ring in three patterns
(flits accepted per cycle as a fraction of one ``streamline_bytes_per_cycle`` flit, and of the
bound the PEs' ``ext`` ports set). Target :data:`LINK_TARGET` / :data:`RING_TARGET`.
"""

from __future__ import annotations

import random

import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from ..sw.golden.links import (LinkMode, LinkOp, RingFlit, ref_link, ref_ring, ring_flits,
                        ring_geometry)
from . import cocotb_streams as streams
from .records import BenchResult, run_bench, write_summary
from .runner import case_rng, load_params, resolve_seed
from .traffic import BENCH_TRAFFIC, SMOOTH, traffic as traffic_pattern


__all__ = ["LINK_TARGET", "RING_TARGET", "random_link_op", "corner_link_ops",
           "random_ring_flits", "link_params", "ring_params", "run_link_bench", "run_ring_bench",
           "link_figures",
           "print_links", "LinkBenchResult"]

#: Figures: streaming fraction of the port rate, every link mode and ring pattern.
LINK_TARGET = 0.99
RING_TARGET = 0.99
LINK_TESTS = ("test_link_stress", "test_link_throughput")
RING_TESTS = ("test_ring_stress", "test_ring_throughput")
#: Ring throughput patterns: name -> description.
RING_PATTERNS = {
    "unicast round-robin": "full flits to PE 0, 1, 2, ... in turn (EXT streaming LSB slices "
                           "to the DP PEs)",
    "unicast random": "full flits to a random PE each",
    "multicast all": "full flits to every PE (weights shared by data-parallel PEs)",
}


# ---- traffic ---------------------------------------------------------------------------------

def random_link_op(rng: random.Random, pes: int, *, max_words: int = 16) -> LinkOp:
    """A random valid descriptor for a group of ``pes``: any mode, masks, chunk 1..3,
    0..``max_words`` words (ALL_TO_ALL: a multiple of chunk x destinations)."""
    mode = LinkMode(rng.randrange(4))
    dst = rng.randrange(1, 1 << pes)
    src = 1 << rng.randrange(pes) if mode == LinkMode.BYPASS else rng.randrange(1, 1 << pes)
    chunk = 1
    if mode == LinkMode.ALL_TO_ALL:
        nd = bin(dst).count("1")
        chunk = rng.randrange(1, 4)
        words = chunk * nd * rng.randrange(0, max(1, max_words // (chunk * nd)) + 1)
    else:
        words = rng.randrange(0, max_words + 1)
    return LinkOp(mode, src, dst, words, chunk)


def _lanes_word(values, bits, word_bits):
    mask = (1 << bits) - 1
    assert len(values) * bits == word_bits
    return sum((v & mask) << (bits * j) for j, v in enumerate(values))


def corner_link_ops(rng: random.Random, pes: int, word_bits: int):
    """Corner descriptors with their source words: ``[(op, data[s])]``. REDUCE_ADD saturating
    up and down mid-chain (and an exact sum that only ascending order saturates), REDUCE_MAX
    with 0xFFFFFFFF and 0x80000000 lanes, a single source, all destinations, ALL_TO_ALL with
    chunk = 1, a zero-word descriptor, BYPASS multicast to every PE."""
    allm = (1 << pes) - 1
    n64, n32 = word_bits // 64, word_bits // 32
    hi, lo = (1 << 63) - 1, -(1 << 63)
    out = []

    def words(s, k, kind):
        if kind == "add":
            pick = [hi, lo, -1, 1, hi, lo, 0, rng.randrange(-(1 << 63), 1 << 63)]
            return _lanes_word([pick[(s * 3 + k + j) % len(pick)] for j in range(n64)], 64,
                               word_bits)
        pick = [0xFFFFFFFF, 0, 0x80000000, 0x7FFFFFFF, rng.getrandbits(32)]
        return _lanes_word([pick[(s + 2 * k + j) % len(pick)] for j in range(n32)], 32,
                           word_bits)

    op = LinkOp(LinkMode.REDUCE_ADD, allm, allm, 3)
    out.append((op, [[words(s, k, "add") for k in range(3)] for s in range(pes)]))
    op = LinkOp(LinkMode.REDUCE_MAX, allm, allm, 3)
    out.append((op, [[words(s, k, "max") for k in range(3)] for s in range(pes)]))
    single = 1 << (pes - 1)
    op = LinkOp(LinkMode.REDUCE_ADD, single, allm, 2)
    out.append((op, [[words(s, k, "add") for k in range(2)] if s == pes - 1 else []
                     for s in range(pes)]))
    op = LinkOp(LinkMode.ALL_TO_ALL, allm, allm, 2 * pes, 1)
    out.append((op, [[rng.getrandbits(word_bits) for _ in range(2 * pes)] for _ in range(pes)]))
    op = LinkOp(LinkMode.BYPASS, 1, allm, 0)
    out.append((op, [[] for _ in range(pes)]))
    op = LinkOp(LinkMode.BYPASS, 1, allm, 5)
    out.append((op, [[rng.getrandbits(word_bits) for _ in range(5)] if s == 0 else []
                     for s in range(pes)]))
    return out


def random_ring_flits(rng: random.Random, *, pes: int, word_bits: int, flit_bytes: int,
                      transfers: int, stream_bits: int, max_words: int = 8,
                      p_multicast: float = 0.4) -> list:
    """Flits of ``transfers`` random word transfers (unicast or random multicast masks, 1 to
    ``max_words`` words, stream ids), interleaved flit by flit between up to three open
    transfers (a word spanning flits keeps its flits together), plus a flit naming no PE."""
    _, span = ring_geometry(word_bits=word_bits, flit_bytes=flit_bytes)
    pending = []
    for t in range(transfers):
        mask = rng.randrange(1, 1 << pes) if rng.random() < p_multicast else 1 << rng.randrange(pes)
        data = [rng.getrandbits(word_bits) for _ in range(rng.randrange(1, max_words + 1))]
        fl = ring_flits(data, mask, word_bits=word_bits, flit_bytes=flit_bytes,
                        stream=t % (1 << stream_bits))
        pending.append([fl[i:i + span] for i in range(0, len(fl), span)])
    out, live = [], []
    while pending or live:
        while pending and len(live) < 3:
            live.append(pending.pop(0))
        k = rng.randrange(len(live))
        out.extend(live[k].pop(0))
        if not live[k]:
            live.pop(k)
    out.insert(len(out) // 2, RingFlit(rng.getrandbits(8 * flit_bytes), 0))
    return out


# ---- the per-cycle harness -------------------------------------------------------------------

class _Source:
    """Presents ``items`` on stream ``prefix`` in order, idling with probability ``idle``."""

    def __init__(self, dut, prefix, items, rng, idle, bits):
        self.valid_sig = getattr(dut, f"{prefix}__valid")
        self.payload_sig = getattr(dut, f"{prefix}__payload")
        self.ready_sig = getattr(dut, f"{prefix}__ready")
        self.items, self.rng, self.idle, self.bits = list(items), rng, idle, bits
        self.pos, self.valid, self.taken = 0, False, []

    def drive(self):
        if not self.valid and self.pos < len(self.items):
            self.valid = not (self.idle and self.rng.random() < self.idle)
        self.valid_sig.value = int(self.valid)
        self.payload_sig.value = self.items[self.pos] if self.valid else \
            self.rng.getrandbits(self.bits)

    def sample(self, cycle):
        if self.valid and self.ready_sig.value == 1:
            self.taken.append(cycle)
            self.pos += 1
            self.valid = False

    @property
    def finished(self):
        return self.pos == len(self.items)


class _Sink:
    """Drives ``ready`` of stream ``prefix`` (not ready with probability ``stall``), collects
    the items taken and checks the stream rule."""

    def __init__(self, dut, prefix, rng, stall, name):
        self.valid_sig = getattr(dut, f"{prefix}__valid")
        self.payload_sig = getattr(dut, f"{prefix}__payload")
        self.ready_sig = getattr(dut, f"{prefix}__ready")
        self.rng, self.stall, self.name = rng, stall, name
        self.ready, self.held, self.got, self.cycles, self.first = True, None, [], [], None
        self.errors = []

    def drive(self):
        self.ready = not (self.stall and self.rng.random() < self.stall)
        self.ready_sig.value = int(self.ready)

    def sample(self, cycle):
        if self.valid_sig.value == 1:
            item = self.payload_sig.value.to_unsigned()
            if self.first is None:
                self.first = cycle
            if self.held is not None and item != self.held[0]:
                self.errors.append(f"cycle {cycle}: {self.name} item offered at cycle "
                                   f"{self.held[1]} changed before it was taken")
            if self.ready:
                self.got.append(item)
                self.cycles.append(cycle)
                self.held = None
            elif self.held is None:
                self.held = (item, cycle)
        elif self.held is not None:
            self.errors.append(f"cycle {cycle}: {self.name} item offered at cycle "
                               f"{self.held[1]} withdrawn before it was taken")
            self.held = None


async def _run(dut, sources, sinks, *, expected, deadline, drain, extra=None):
    """Run the per-cycle loop until every source is finished, ``expected`` items were taken
    from the sinks and ``drain`` more cycles passed (to catch extra items), or ``deadline``
    cycles. ``extra(cycle)`` is called in the read-only phase of each cycle."""
    start = streams.cycle()
    quiet = 0
    while True:
        for s in sources:
            s.drive()
        for k in sinks:
            k.drive()
        await ReadOnly()
        cycle = streams.cycle()
        for s in sources:
            s.sample(cycle)
        for k in sinks:
            k.sample(cycle)
        if extra:
            extra(cycle)
        await RisingEdge(dut.clk)
        done = all(s.finished for s in sources) and sum(len(k.got) for k in sinks) >= expected
        quiet = quiet + 1 if done else 0
        if quiet > drain or cycle - start > deadline:
            return cycle - start


def _mismatch_details(name, got, want, limit=4):
    out = []
    if len(got) != len(want):
        out.append(f"{name}: {len(got)} words, expected {len(want)}")
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            out.append(f"{name} word {i}: {a:#x} != {b:#x}")
            if len(out) >= limit:
                break
    return out


class _Records:
    def __init__(self, dut, test, seed):
        self.dut, self.test, self.seed, self.records = dut, test, seed, []

    def add(self, **rec):
        self.records.append(rec)
        self.dut._log.info("%s: %s", self.test,
                           {k: v for k, v in rec.items() if k != "details"})
        return rec

    def finish(self):
        write_summary(self.test, self.records)
        bad = [r for r in self.records if r["mismatches"]]
        assert self.records, f"{self.test}: no case ran"
        assert not bad, (f"{len(bad)} case(s) failed (seed {self.seed}): "
                         + "; ".join(f"{r['case']} ({r['traffic']}): {r['mismatches']} "
                                     f"mismatches, {r['details'][:3]}" for r in bad))


# ---- aggregation link ------------------------------------------------------------------------

def _link_params():
    p = load_params()
    return p["link"], p


def _link_dut_info(lp):
    from ..hw.agg_link import AggregationLink
    link = AggregationLink(**lp)
    link._MustUse__silence = True            # only its properties are read
    return link


async def _link_case(dut, link, ops, data, *, rng, flow):
    """Run descriptors ``ops`` with per-descriptor source words ``data[k][s]`` under traffic
    ``flow`` (a :class:`~elmoe3d.sim.traffic.Traffic`, ports ``op``, ``pe_i``, ``pe_o``); returns
    ``(got per PE, want per PE, sinks, op source, done cycles, cycles, errors)``."""
    from ..hw.agg_link import link_op_layout, pack_link_op
    G, W = link.pes, link.word_bits
    want = [[] for _ in range(G)]
    for op, d in zip(ops, data):
        for pe, words in enumerate(ref_link(op, d, word_bits=W)):
            want[pe].extend(words)
    inputs = [[w for d in data for w in d[s]] for s in range(G)]
    op_bits = link_op_layout(G).size
    op_src = _Source(dut, "op", [pack_link_op(op, G) for op in ops], rng, flow.idle_at("op"),
                     op_bits)
    srcs = [_Source(dut, f"pe_i__{s}", inputs[s], rng, flow.idle_at("pe_i"), W)
            for s in range(G)]
    sinks = [_Sink(dut, f"pe_o__{d}", rng, flow.backpressure_at("pe_o"), f"pe_o[{d}]")
             for d in range(G)]
    dones = []

    def watch(cycle):
        if dut.done.value == 1:
            dones.append(cycle)

    total = sum(map(len, want))
    flits = sum(len(x) for x in inputs) * link.flits_per_word
    deadline = int((flits + total * link.flits_per_word + 50 * len(ops) + 200)
                   / max(0.05, flow.rate) * 4)
    cycles = await _run(dut, [op_src, *srcs], sinks, expected=total, deadline=deadline,
                        drain=4 * link.flits_per_word + 8, extra=watch)
    errors = [e for k in sinks for e in k.errors]
    if len(dones) != len(ops):
        errors.append(f"done pulsed {len(dones)} times for {len(ops)} descriptors")
    for s, src in enumerate(srcs):
        if not src.finished:
            errors.append(f"pe_i[{s}]: {src.pos} of {len(src.items)} words taken")
    if not op_src.finished:
        errors.append(f"op: {op_src.pos} of {len(ops)} descriptors taken")
    if int(dut.errors.value):
        errors.append(f"errors = {int(dut.errors.value):#b} on valid descriptors")
    return [k.got for k in sinks], want, sinks, op_src, dones, cycles, errors


@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_link_stress(dut, traffic):
    """Corner descriptors, then random descriptors, random source words, random idle
    cycles and backpressure on every port (``stalls``) or none (``smooth``)."""
    lp, p = _link_params()
    link = _link_dut_info(lp)
    seed = resolve_seed()
    test = f"test_link_stress-{traffic}"
    rec = _Records(dut, test, seed)
    rng = random.Random(int(case_rng(seed, test).integers(1 << 62)))
    G, W = link.pes, link.word_bits
    await streams.start(dut, ["op__valid", "errors_clear"]
                        + [f"pe_i__{s}__valid" for s in range(G)]
                        + [f"pe_o__{d}__ready" for d in range(G)])
    dut._log.info("AggregationLink G=%d W=%d flit=%d B buffer=%d words latency=%d; seed %d",
                  G, W, link.flit_bytes, link.buffer_words, link.latency, seed)
    corners = corner_link_ops(rng, G, W)
    ops = [op for op, _ in corners]
    data = [d for _, d in corners]
    for _ in range(int(p.get("descriptors", 40))):
        op = random_link_op(rng, G, max_words=int(p.get("max_words", 16)))
        ops.append(op)
        data.append([[rng.getrandbits(W) for _ in range(op.words)] if s in op.srcs else []
                     for s in range(G)])
    got, want, sinks, _, _, cycles, errors = await _link_case(
        dut, link, ops, data, rng=rng, flow=traffic_pattern(traffic))
    details = list(errors)
    for d in range(G):
        details += _mismatch_details(f"pe_o[{d}]", got[d], want[d])
    compared = sum(min(len(g), len(w)) for g, w in zip(got, want))
    mism = sum(a != b for g, w in zip(got, want) for a, b in zip(g, w)) \
        + sum(abs(len(g) - len(w)) for g, w in zip(got, want)) + len(errors)
    modes = sorted({op.mode.name for op in ops})
    rec.add(case="link stress", traffic=traffic, descriptors=len(ops), modes=modes,
            words=sum(map(len, want)), cycles=cycles, comparisons=compared, mismatches=mism,
            details=details[:8])
    rec.finish()


def _streaming_op(mode, G, words):
    allm = (1 << G) - 1
    if mode == LinkMode.BYPASS:
        return LinkOp(mode, 1, allm, words)
    if mode == LinkMode.ALL_TO_ALL:
        return LinkOp(mode, allm, allm, words - words % G, 1)
    return LinkOp(mode, allm, allm, words)


@cocotb.test()
async def test_link_throughput(dut):
    """Each mode on a long descriptor (``stream_words`` per source, every PE a source and a
    destination; BYPASS from PE 0 to all), always-valid sources, always-ready sinks. Records
    the cycles the flits took (first flit moved to last flit moved) against the port-limited
    ideal ``max(words sent, words received) x flits per word``, and checks every word."""
    lp, p = _link_params()
    link = _link_dut_info(lp)
    seed = resolve_seed()
    rec = _Records(dut, "test_link_throughput", seed)
    rng = random.Random(int(case_rng(seed, "test_link_throughput").integers(1 << 62)))
    G, W, S = link.pes, link.word_bits, link.flits_per_word
    await streams.start(dut, ["op__valid", "errors_clear"]
                        + [f"pe_i__{s}__valid" for s in range(G)]
                        + [f"pe_o__{d}__ready" for d in range(G)])
    n = int(p.get("stream_words", 512))
    for mode in LinkMode:
        op = _streaming_op(mode, G, n)
        data = [[[rng.getrandbits(W) for _ in range(op.words)] if s in op.srcs else []
                 for s in range(G)]]
        got, want, sinks, op_src, dones, _, errors = await _link_case(
            dut, link, [op], data, rng=rng, flow=SMOOTH)
        taken = op_src.taken[0]
        last = max(k.cycles[-1] for k in sinks if k.cycles)
        first = min(k.first for k in sinks if k.first is not None)
        measured = last - taken - link.op_latency - link.latency + S
        ideal = max(op.words, op.delivered_words()) * S
        details = list(errors)
        if first - taken != link.op_latency + link.latency:
            details.append(f"first word offered {first - taken} cycles after the descriptor, "
                           f"expected op_latency + latency = {link.op_latency + link.latency}")
        for d in range(G):
            details += _mismatch_details(f"pe_o[{d}]", got[d], want[d])
        mism = len(details)
        port_bytes = max(op.words, op.delivered_words()) * W // 8
        rec.add(case=f"link {mode.name}", traffic="streaming", mode=mode.name, pes=G,
                words_per_source=op.words, words_per_destination=op.delivered_words(),
                chunk=op.chunk, port_bytes=port_bytes, cycles=measured, ideal_cycles=ideal,
                bytes_per_cycle=port_bytes / measured, flit_bytes=link.flit_bytes,
                fraction=ideal / measured, latency=link.latency, op_latency=link.op_latency,
                comparisons=sum(map(len, want)), mismatches=mism, details=details[:8])
    rec.finish()


# ---- streamline ring -------------------------------------------------------------------------

def _ring_params():
    p = load_params()
    return p["ring"], p


def _ring_dut_info(rp):
    from ..hw.ring import StreamlineRing
    ring = StreamlineRing(**rp)
    ring._MustUse__silence = True
    return ring


async def _ring_case(dut, ring, flits, *, rng, flow):
    """Inject ``flits`` under traffic ``flow`` (ports ``inject``, ``ext``); returns ``(got per
    PE, want per PE, source, sinks, cycles, errors)``."""
    from ..hw.ring import pack_flit
    P = ring.pes
    kw = dict(pes=P, word_bits=ring.word_bits, flit_bytes=ring.flit_bytes,
              stream_bits=ring.stream_bits)
    want = ref_ring(flits, pes=P, word_bits=ring.word_bits, flit_bytes=ring.flit_bytes)
    src = _Source(dut, "inject", [pack_flit(f, **kw) for f in flits], rng,
                  flow.idle_at("inject"), ring.flit_layout.size)
    sinks = [_Sink(dut, f"ext__{p}", rng, flow.backpressure_at("ext"), f"ext[{p}]")
             for p in range(P)]
    total = sum(map(len, want))
    deadline = int((len(flits) + total + 100) / max(0.05, flow.rate) * 4)
    cycles = await _run(dut, [src], sinks, expected=total, deadline=deadline,
                        drain=ring.groups + ring.words_per_flit + 8)
    errors = [e for k in sinks for e in k.errors]
    if not src.finished:
        errors.append(f"inject: {src.pos} of {len(flits)} flits taken")
    return [k.got for k in sinks], want, src, sinks, cycles, errors


async def _ring_reset(dut, ring):
    await streams.start(dut, ["inject__valid"] + [f"ext__{p}__ready" for p in range(ring.pes)])


@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_ring_stress(dut, traffic):
    """Random unicast and multicast transfers of several streams interleaved flit by flit,
    a flit naming no PE, random idle injection cycles and backpressure on every PE port
    (``stalls``) or none (``smooth``)."""
    rp, p = _ring_params()
    ring = _ring_dut_info(rp)
    seed = resolve_seed()
    test = f"test_ring_stress-{traffic}"
    rec = _Records(dut, test, seed)
    rng = random.Random(int(case_rng(seed, test).integers(1 << 62)))
    await _ring_reset(dut, ring)
    dut._log.info("StreamlineRing %d PEs in %d groups, W=%d, flit %d B, %d flits per PE "
                  "FIFO, latency %s; seed %d", ring.pes, ring.groups, ring.word_bits,
                  ring.flit_bytes, ring.buffer_flits, ring.latency, seed)
    flits = random_ring_flits(rng, pes=ring.pes, word_bits=ring.word_bits,
                              flit_bytes=ring.flit_bytes, transfers=int(p.get("transfers", 60)),
                              stream_bits=ring.stream_bits)
    got, want, _, _, cycles, errors = await _ring_case(dut, ring, flits, rng=rng,
                                                       flow=traffic_pattern(traffic))
    details = list(errors)
    for q in range(ring.pes):
        details += _mismatch_details(f"ext[{q}]", got[q], want[q])
    mism = sum(a != b for g, w in zip(got, want) for a, b in zip(g, w)) \
        + sum(abs(len(g) - len(w)) for g, w in zip(got, want)) + len(errors)
    rec.add(case="ring stress", traffic=traffic, flits=len(flits),
            streams=len({f.stream for f in flits}),
            multicast_flits=sum(bin(f.dst_mask).count("1") > 1 for f in flits),
            words=sum(map(len, want)), cycles=cycles,
            comparisons=sum(min(len(g), len(w)) for g, w in zip(got, want)),
            mismatches=mism, details=details[:8])
    rec.finish()


def _pattern_flits(pattern, rng, ring, n):
    per = ring.words_per_flit
    masks = {"unicast round-robin": lambda i: 1 << (i % ring.pes),
             "unicast random": lambda i: 1 << rng.randrange(ring.pes),
             "multicast all": lambda i: (1 << ring.pes) - 1}[pattern]
    return [RingFlit(rng.getrandbits(8 * ring.flit_bytes), masks(i), i % 2, i == n - 1, per)
            for i in range(n)]


@cocotb.test()
async def test_ring_throughput(dut):
    """Each pattern of :data:`RING_PATTERNS` on ``stream_flits`` full flits, always-valid
    injection, always-ready PEs: flits per cycle from the first flit taken to the last word
    delivered (less the last group's latency), against one
    flit per cycle and against the bound of the PE ports (the busiest PE takes one word per
    cycle), and every word checked."""
    rp, p = _ring_params()
    ring = _ring_dut_info(rp)
    seed = resolve_seed()
    rec = _Records(dut, "test_ring_throughput", seed)
    rng = random.Random(int(case_rng(seed, "test_ring_throughput").integers(1 << 62)))
    await _ring_reset(dut, ring)
    n = int(p.get("stream_flits", 1024))
    for pattern in RING_PATTERNS:
        flits = _pattern_flits(pattern, rng, ring, n)
        got, want, src, sinks, _, errors = await _ring_case(dut, ring, flits, rng=rng,
                                                            flow=SMOOTH)
        details = list(errors)
        for q in range(ring.pes):
            details += _mismatch_details(f"ext[{q}]", got[q], want[q])
        # First flit taken to last word delivered, less the last group's latency.
        last = max(k.cycles[-1] for k in sinks if k.cycles)
        cycles = last - src.taken[0] + 1 - ring.latency[-1]
        busiest = max(map(len, want)) * ring.flits_per_word      # cycles the busiest port needs
        bound = min(1.0, n / busiest)
        rec.add(case=f"ring {pattern}", traffic="streaming", pattern=pattern,
                description=RING_PATTERNS[pattern], flits=n, cycles=cycles,
                flit_bytes=ring.flit_bytes, bytes_per_cycle=n * ring.flit_bytes / cycles,
                fraction=n / cycles, bound=bound, fraction_of_bound=n / cycles / bound,
                latency=list(ring.latency), comparisons=sum(map(len, want)),
                mismatches=len(details), details=details[:8])
    rec.finish()


# ---- host side -------------------------------------------------------------------------------

#: A run of this bench: the runner's result and the case records.
LinkBenchResult = BenchResult


def link_params(arch, *, pes=None, buffer_words=None) -> dict:
    """``params["link"]`` for ``arch`` (group size ``pes`` overrides ``pes_per_group``)."""
    from ..hw.agg_link import DEFAULT_BUFFER_WORDS
    fb = arch.aggregation_bytes_per_cycle
    return {"pes": pes or arch.pes_per_group, "word_bits": arch.pe.word_bits,
            "flit_bytes": int(fb), "buffer_words": buffer_words or DEFAULT_BUFFER_WORDS}


def ring_params(arch, *, buffer_flits=None, stream_bits=None) -> dict:
    """``params["ring"]`` for ``arch``."""
    from ..hw.ring import DEFAULT_BUFFER_FLITS, DEFAULT_STREAM_BITS
    return {"pes": arch.pes, "pes_per_group": arch.pes_per_group,
            "word_bits": arch.pe.word_bits, "flit_bytes": int(arch.streamline_bytes_per_cycle),
            "stream_bits": stream_bits or DEFAULT_STREAM_BITS,
            "buffer_flits": buffer_flits or DEFAULT_BUFFER_FLITS}


def run_link_bench(link: dict, *, tests=None, seed=None, params=None, waves=None,
                   check=True) -> LinkBenchResult:
    """Build (or reuse) an :class:`~elmoe3d.hw.agg_link.AggregationLink` with parameters
    ``link`` and run the named ``test_link_*`` tests (default both)."""
    from ..hw.agg_link import AggregationLink
    from .runner import build
    dut = AggregationLink(**link)
    name = "agg_link_g{pes}_w{word_bits}_f{flit_bytes}_b{buffer_words}".format(**link)
    built = build(dut, name=name, toplevel="agg_link", waves=waves)
    return run_bench(built, test_module=__name__, tests=tests, default_tests=LINK_TESTS,
                     params={"link": link, **(params or {})}, prefix="bench_links", seed=seed,
                     check=check)


def run_ring_bench(ring: dict, *, tests=None, seed=None, params=None, waves=None,
                   check=True) -> LinkBenchResult:
    """Build (or reuse) a :class:`~elmoe3d.hw.ring.StreamlineRing` with parameters ``ring``
    and run the named ``test_ring_*`` tests (default both)."""
    from ..hw.ring import StreamlineRing
    from .runner import build
    dut = StreamlineRing(**ring)
    name = ("ring_p{pes}_g{pes_per_group}_w{word_bits}_f{flit_bytes}_s{stream_bits}"
            "_b{buffer_flits}").format(**ring)
    built = build(dut, name=name, toplevel="streamline_ring", waves=waves)
    return run_bench(built, test_module=__name__, tests=tests, default_tests=RING_TESTS,
                     params={"ring": ring, **(params or {})}, prefix="bench_links", seed=seed,
                     check=check)


def link_figures(arch, seed=None, *, stream_words=512, stream_flits=1024) -> dict:
    """Ring and link throughput on streaming traffic for ``arch``
    (:class:`~elmoe3d.config.ArchConfig`): the ``test_link_throughput`` and
    ``test_ring_throughput`` records (each word also checked against the golden models).

    Returns ``{"link": [...], "ring": [...], "failures": [...], "seed", "logs",
    "aggregation_bytes_per_cycle", "streamline_bytes_per_cycle", "word_bytes"}``; failures are
    mismatching cases and failed cocotb tests, one line each."""
    link = run_link_bench(link_params(arch), tests="test_link_throughput", seed=seed,
                          params={"stream_words": stream_words}, check=False)
    ring = run_ring_bench(ring_params(arch), tests="test_ring_throughput", seed=seed,
                          params={"stream_flits": stream_flits}, check=False)
    failures = []
    for res, what in ((link, "test_link_throughput"), (ring, "test_ring_throughput")):
        for r in res.records:
            if r["mismatches"]:
                failures.append(f"{r['case']}: {r['mismatches']} mismatch(es): "
                                f"{'; '.join(r['details'][:2])}")
        for tc in res.sim.testcases:
            if tc.status == "failed" and not any(r["mismatches"] for r in res.records):
                failures.append(f"{tc.name}: {tc.message.splitlines()[0] if tc.message else 'failed'}")
        if not res.sim.tests:
            failures.append(f"{what} did not run")
    return {"link": link.records, "ring": ring.records, "failures": failures,
            "seed": link.sim.seed, "logs": [str(link.sim.log_file), str(ring.sim.log_file)],
            "aggregation_bytes_per_cycle": arch.aggregation_bytes_per_cycle,
            "streamline_bytes_per_cycle": arch.streamline_bytes_per_cycle,
            "word_bytes": arch.pe.word_bytes, "pes": arch.pes,
            "pes_per_group": arch.pes_per_group}


#: Definitions printed under the tables.
LINK_DEFINITION = (
    "fraction = ideal cycles / measured cycles; ideal = max(words a source sends, words a "
    "destination receives) x flits per word (one flit of the port width per cycle per port); "
    "measured = first flit moved to last flit moved (descriptor taken + op_latency to last "
    "word offered - latency). Every PE sources and receives (BYPASS: PE 0 to every PE); "
    "ALL_TO_ALL includes the wavefront skew of (sources - 1) chunks.")
RING_DEFINITION = (
    "fraction = flits / cycles from the first flit injected to the last word delivered, less "
    "the last group's latency (the last flit's further words count against it); bound = "
    "the PE ports' limit (the busiest PE takes one word per cycle); every word checked "
    "against ref_ring.")


def print_links(console, figs) -> list:
    """Print the link and ring throughput tables; return the missed-target lines."""
    from rich.markup import escape
    from rich.table import Table
    missed = []
    agg, sl = figs["aggregation_bytes_per_cycle"], figs["streamline_bytes_per_cycle"]
    table = Table(title=f"Aggregation link throughput ({figs['pes_per_group']} PEs per group, "
                        f"{figs['word_bytes']} B words, ports of {agg:g} B per cycle)",
                  title_justify="left", caption=LINK_DEFINITION, caption_justify="left")
    for col in ("mode", "words/source", "words/dest", "ideal", "cycles", "B/cycle",
                "fraction", "target"):
        table.add_column(col, justify="left" if col in ("mode", "target") else "right")
    for r in figs["link"]:
        ok = r["fraction"] >= LINK_TARGET
        if not ok:
            missed.append(f"aggregation link {r['mode']}: {r['fraction']:.2%} of {agg:g} B per "
                          f"cycle < target {LINK_TARGET:.0%}")
        table.add_row(r["mode"], f"{r['words_per_source']:,}", f"{r['words_per_destination']:,}",
                      f"{r['ideal_cycles']:,}", f"{r['cycles']:,}",
                      f"{r['bytes_per_cycle']:.2f}", f"{r['fraction']:.2%}",
                      "[green]met[/]" if ok else "[red]MISSED[/]")
    console.print(table)
    if not figs["link"]:
        missed.append("aggregation link throughput: no case measured")
    table = Table(title=f"Streamline ring throughput ({figs['pes']} PEs, "
                        f"{figs['pes'] // figs['pes_per_group']} stations, flits of {sl:g} B)",
                  title_justify="left", caption=RING_DEFINITION, caption_justify="left")
    for col in ("pattern", "flits", "cycles", "B/cycle", "fraction", "bound",
                "of bound", "target"):
        table.add_column(col, justify="left" if col in ("pattern", "target") else "right")
    for r in figs["ring"]:
        ok = r["fraction_of_bound"] >= RING_TARGET
        if not ok:
            missed.append(f"streamline ring {r['pattern']}: {r['fraction_of_bound']:.2%} of "
                          f"the bound < target {RING_TARGET:.0%}")
        table.add_row(escape(r["pattern"]), f"{r['flits']:,}", f"{r['cycles']:,}",
                      f"{r['bytes_per_cycle']:.1f}", f"{r['fraction']:.2%}",
                      f"{r['bound']:.2f}", f"{r['fraction_of_bound']:.2%}",
                      "[green]met[/]" if ok else "[red]MISSED[/]")
    console.print(table)
    if not figs["ring"]:
        missed.append("streamline ring throughput: no case measured")
    for line in figs["failures"]:
        missed.append(f"links bench: {line} (logs {', '.join(figs['logs'])})")
    return missed

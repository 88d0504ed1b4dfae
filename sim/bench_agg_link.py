# amaranth: UnusedElaboratable=no
"""cocotb bench of the aggregation link, and its bench figures (``elmoe3d bench`` figure 8, with
:mod:`elmoe3d.sim.bench_ring`).

Run through :mod:`elmoe3d.sim.runner` (never directly), with :func:`run_link_bench`; the runner
writes ``params.json`` (read with :func:`~elmoe3d.sim.runner.load_params`)::

    {"link": {"pes": 4, "word_bits": 512, "flit_bytes": 32, "buffer_words": 4},
     "descriptors": 40,            # random descriptors per stress test (after the corners)
     "max_words": 16,              # words per source of a random descriptor, at most
     "stream_words": 512}          # link throughput: words per source per descriptor

DUT: :class:`~elmoe3d.hw.agg_link.AggregationLink` (top ``agg_link``, tests ``test_link_*``).
Every port is driven from one per-cycle loop (:mod:`elmoe3d.sim.cocotb_cycles`): sources present
their items with random idle cycles (garbage payloads while not valid), sinks drop ``ready`` at
random (the patterns of :mod:`elmoe3d.sim.traffic`), and every output is checked against the
stream rule (an offered item stays valid and unchanged until taken). Descriptors are packed
only through the Amaranth layout (:func:`~elmoe3d.hw.agg_link.pack_link_op`).

Checks: every destination's word sequence equals the golden model
(:func:`elmoe3d.sw.golden.agg_link.ref_link` over the descriptor sequence) with plain equality
-- so every word arrived once, intact and in order -- no word arrives after the expected ones,
the link pulses ``done`` once per descriptor, every source word is taken and its sticky
``errors`` stay 0 (bad descriptors are the Amaranth-simulator tests' part,
``tests/amaranth/test_agg_link.py``). Each test writes ``summary-<test>.json`` (case records)
into the run folder and then fails if a case mismatched.

Figures (:func:`link_figures`, :func:`print_link`): streaming traffic (always-valid sources,
always-ready sinks) through the link in each mode (bytes per port per cycle as a fraction of
``aggregation_bytes_per_cycle``). Target :data:`LINK_TARGET`.

The first line turns off Amaranth's unused-elaboratable warning for this file: the tests build
an :class:`~elmoe3d.hw.agg_link.AggregationLink` only to read its properties.
"""

from __future__ import annotations

import random

import cocotb

from ..sw.golden.agg_link import LinkMode, LinkOp, ref_link
from ..sw.golden.datapath import INT64_MAX, INT64_MIN, UINT32_MAX
from ..sw.golden.vpu import INT32_MAX, INT32_MIN
from . import cocotb_streams as streams
from .cocotb_cycles import (CaseRecords, Sink, Source, port_details, run_cycles,
                            throughput_figures, word_mismatches, words_compared)
from .records import BenchResult, figure_prefix, run_bench
from .runner import load_params
from .traffic import BENCH_TRAFFIC, SMOOTH, traffic as traffic_pattern


__all__ = ["LINK_TARGET", "random_link_op", "corner_link_ops", "link_params", "run_link_bench",
           "link_figures", "print_link", "LinkBenchResult"]

#: Figures: streaming fraction of the port rate, every link mode.
LINK_TARGET = 0.99
LINK_TESTS = ("test_link_stress", "test_link_throughput")


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
    hi, lo = INT64_MAX, INT64_MIN
    out = []

    def words(s, k, kind):
        if kind == "add":
            pick = [hi, lo, -1, 1, hi, lo, 0, rng.randrange(INT64_MIN, INT64_MAX + 1)]
            return _lanes_word([pick[(s * 3 + k + j) % len(pick)] for j in range(n64)], 64,
                               word_bits)
        # unsigned 32-bit lanes: the largest, 0, and either side of the sign bit
        pick = [UINT32_MAX, 0, INT32_MIN & UINT32_MAX, INT32_MAX, rng.getrandbits(32)]
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


# ---- the bench ------------------------------------------------------------------------------

def _link_params():
    p = load_params()
    return p["link"], p


def _link_dut_info(lp):
    from ..hw.agg_link import AggregationLink
    return AggregationLink(**lp)             # only its properties are read


async def _link_case(dut, link, ops, data, *, rng, flow):
    """Run descriptors ``ops`` with per-descriptor source words ``data[k][s]`` under traffic
    ``flow`` (a :class:`~elmoe3d.sim.traffic.Traffic`, ports ``op``, ``pe_i``, ``pe_o``); returns
    ``(got per PE, want per PE, sinks, op source, done cycles, cycles, errors)``."""
    from ..hw.agg_link import link_op_layout, pack_link_op
    flow = flow.for_ports("op", "pe_i", "pe_o")
    G, W = link.pes, link.word_bits
    want = [[] for _ in range(G)]
    for op, d in zip(ops, data):
        for pe, words in enumerate(ref_link(op, d, word_bits=W)):
            want[pe].extend(words)
    inputs = [[w for d in data for w in d[s]] for s in range(G)]
    op_bits = link_op_layout(G).size
    op_src = Source(dut, "op", [pack_link_op(op, G) for op in ops], rng, flow.idle_at("op"),
                    op_bits)
    srcs = [Source(dut, f"pe_i__{s}", inputs[s], rng, flow.idle_at("pe_i"), W)
            for s in range(G)]
    sinks = [Sink(dut, f"pe_o__{d}", rng, flow.backpressure_at("pe_o"), f"pe_o[{d}]")
             for d in range(G)]
    dones = []

    def watch(cycle):
        if dut.done.value == 1:
            dones.append(cycle)

    total = sum(map(len, want))
    flits = sum(len(x) for x in inputs) * link.flits_per_word
    deadline = int((flits + total * link.flits_per_word + 50 * len(ops) + 200)
                   / max(0.05, flow.rate) * 4)
    cycles = await run_cycles(dut, [op_src, *srcs], sinks, expected=total, deadline=deadline,
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
    rec, rng = CaseRecords.open(dut, f"test_link_stress-{traffic}")
    G, W = link.pes, link.word_bits
    await streams.start(dut, ["op__valid", "errors_clear"]
                        + [f"pe_i__{s}__valid" for s in range(G)]
                        + [f"pe_o__{d}__ready" for d in range(G)])
    dut._log.info("AggregationLink G=%d W=%d flit=%d B buffer=%d words latency=%d (reduce "
                  "%d), op_latency=%d; seed %d", G, W, link.flit_bytes, link.buffer_words,
                  link.latency, link.reduce_latency, link.op_latency, rec.seed)
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
    details = errors + port_details("pe_o", got, want)
    compared = words_compared(got, want)
    mism = word_mismatches(got, want) + len(errors)
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
    rec, rng = CaseRecords.open(dut, "test_link_throughput")
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
        latency = link.word_latency(mode)
        measured = last - taken - link.op_latency - latency + S
        ideal = max(op.words, op.delivered_words()) * S
        details = list(errors)
        if first - taken != link.op_latency + latency:
            details.append(f"first word offered {first - taken} cycles after the descriptor, "
                           f"expected op_latency + word_latency = {link.op_latency + latency}")
        details += port_details("pe_o", got, want)
        mism = len(details)
        port_bytes = max(op.words, op.delivered_words()) * W // 8
        rec.add(case=f"link {mode.name}", traffic="streaming", mode=mode.name, pes=G,
                words_per_source=op.words, words_per_destination=op.delivered_words(),
                chunk=op.chunk, port_bytes=port_bytes, cycles=measured, ideal_cycles=ideal,
                bytes_per_cycle=port_bytes / measured, flit_bytes=link.flit_bytes,
                fraction=ideal / measured, latency=latency, op_latency=link.op_latency,
                comparisons=sum(map(len, want)), mismatches=mism, details=details[:8])
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
                     params={"link": link, **(params or {})}, prefix="bench_agg_link", seed=seed,
                     check=check)


def link_figures(arch, seed=None, *, stream_words=512) -> dict:
    """Aggregation-link throughput on streaming traffic for ``arch``
    (:class:`~elmoe3d.config.ArchConfig`): the ``test_link_throughput`` records (each word also
    checked against the golden model).

    Returns ``{"link": [...], "failures": [...], "seed", "logs", "aggregation_bytes_per_cycle",
    "word_bytes", "pes_per_group"}``; failures are mismatching cases and failed cocotb tests,
    one line each (:func:`~elmoe3d.sim.cocotb_cycles.figure_failures`)."""
    link = run_link_bench(link_params(arch), tests="test_link_throughput", seed=seed,
                          params={"stream_words": stream_words}, check=False)
    return throughput_figures("link", link, "test_link_throughput",
                              aggregation_bytes_per_cycle=arch.aggregation_bytes_per_cycle,
                              word_bytes=arch.pe.word_bytes, pes_per_group=arch.pes_per_group)


#: Definition printed under the table.
LINK_DEFINITION = (
    "fraction = ideal cycles / measured cycles; ideal = max(words a source sends, words a "
    "destination receives) x flits per word (one flit of the port width per cycle per port); "
    "measured = first flit moved to last flit moved (descriptor taken + op_latency to last "
    "word offered - the mode's latency; a reduce mode's includes the reduction tree's "
    "stages). Every PE sources and receives (BYPASS: PE 0 to every PE); "
    "ALL_TO_ALL includes the wavefront skew of (sources - 1) chunks.")


def print_link(console, figs, number: int | None = None) -> list:
    """Print the link throughput table of :func:`link_figures`; return the missed-target lines
    (not the failures: :func:`~elmoe3d.sim.cocotb_cycles.failure_lines`)."""
    from rich.table import Table
    missed = []
    agg = figs["aggregation_bytes_per_cycle"]
    table = Table(title=figure_prefix(number) + f"Aggregation link throughput ("
                        f"{figs['pes_per_group']} PEs per group, "
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
    return missed

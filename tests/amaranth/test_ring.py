"""Streamline ring (:class:`elmoe3d.hw.ring.StreamlineRing`, :class:`RingStation`) in the Amaranth
simulator against :func:`elmoe3d.sw.golden.ring.ref_ring`, plus the golden model's rules.

Every PE's delivered word sequence is compared with plain equality (so every flit arrived once,
intact, in injection order, hence in order within every stream). Traffic: random transfers,
corner cases, and the EXT transfers the host compiler makes of the real Mixtral-8x7B GSM8K
routing trace (:func:`test_real_mixtral_ext_traffic`). Seeds are fixed and printed.
"""

import random

import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from elmoe3d.config import EXT_CHUNK_WORDS, preset
from elmoe3d.hw.checked import inspection
from elmoe3d.hw.ring import RingStation, StreamlineRing, pack_flit, ring_flit_layout
from elmoe3d.isa import Source
from elmoe3d.sim.amaranth_streams import StreamSink
from elmoe3d.sim.bench_ring import random_ring_flits
from elmoe3d.sim.traffic import STALLS
from elmoe3d.sw.golden.ext_sched import ext_chunk_order
from elmoe3d.sw.golden.ring import RingFlit, ref_ring, ref_ring_streams, ring_flits, ring_geometry
from elmoe3d.sw.host.compiler import compile_layer
from elmoe3d.sw.host.parallel import ext_load_order

from ..real_inputs import REAL_LAYERS, REAL_TRAFFIC_SEED, mixtral_steps

pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


def run_ring(dut, flits, *, seed=0, idle=0.0, stall=0.0, max_cycles=20000):
    """Inject ``flits`` (RingFlit) with random idles, random not-ready cycles on every ``ext``
    port; checks the stream rule on ``ext``. Returns (words per PE, log with ``inject`` cycles,
    ``recv`` cycles per PE and ``cycles``)."""
    P = dut.pes
    kw = dict(pes=P, word_bits=dut.word_bits, flit_bytes=dut.flit_bytes,
              stream_bits=dut.stream_bits)
    raws = [pack_flit(f, **kw) for f in flits]
    total = sum(map(len, ref_ring(flits, pes=P, word_bits=dut.word_bits,
                                  flit_bytes=dut.flit_bytes)))
    rng = random.Random(seed)
    sinks = [StreamSink(dut.ext[p], rng, stall, f"PE {p}") for p in range(P)]
    got = [k.got for k in sinks]
    log = {"inject": [], "recv": [k.cycles for k in sinks]}
    nbits = ring_flit_layout(**kw).size

    async def bench(ctx):
        pos, cycle, valid, quiet = 0, 0, False, 0
        while True:
            if not valid and pos < len(raws):
                valid = rng.random() >= idle
            ctx.set(dut.inject.valid, valid)
            ctx.set(dut.inject.payload.as_value(), raws[pos] if valid else rng.getrandbits(nbits))
            for k in sinks:
                k.drive(ctx)
            if valid and ctx.get(dut.inject.ready):
                log["inject"].append(cycle)
                pos += 1
                valid = False
            for k in sinks:
                k.sample(ctx, cycle)
            n = sum(map(len, got))
            assert n <= total, f"cycle {cycle}: more words than injected"
            quiet = quiet + 1 if n == total and pos == len(raws) else 0
            if quiet > 4 + dut.groups + dut.words_per_flit:
                break
            assert cycle < max_cycles, f"timeout: {n} of {total} words"
            cycle += 1
            await ctx.tick()
        log["cycles"] = cycle

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return got, log


# ---- golden --------------------------------------------------------------------------------

def test_golden_geometry_and_delivery():
    assert ring_geometry(word_bits=512, flit_bytes=128) == (2, 1)
    assert ring_geometry(word_bits=4096, flit_bytes=128) == (1, 4)
    assert ring_geometry(word_bits=1024, flit_bytes=128) == (1, 1)
    with pytest.raises(ValueError, match="flit_bytes"):
        ring_geometry(word_bits=512, flit_bytes=96)
    with pytest.raises(ValueError, match="word_bits"):
        ring_geometry(word_bits=768, flit_bytes=64)
    # Two words per flit; an odd transfer leaves the last flit half full.
    fl = ring_flits([1, 2, 3], 0b101, word_bits=64, flit_bytes=16, stream=2)
    assert [(f.words, f.last, f.stream) for f in fl] == [(2, False, 2), (1, True, 2)]
    assert fl[0].data == 1 | 2 << 64
    fl += ring_flits([9], 0b010, word_bits=64, flit_bytes=16, stream=1)
    assert ref_ring(fl, pes=3, word_bits=64, flit_bytes=16) == [[1, 2, 3], [9], [1, 2, 3]]
    assert ref_ring_streams(fl, pes=3, word_bits=64, flit_bytes=16)[1] == {1: [9]}
    # A word spanning two flits.
    fl = ring_flits([0xAABB], 0b1, word_bits=16, flit_bytes=1)
    assert [f.data for f in fl] == [0xBB, 0xAA]
    assert ref_ring(fl, pes=1, word_bits=16, flit_bytes=1) == [[0xAABB]]
    with pytest.raises(ValueError, match="incomplete"):
        ref_ring(fl[:1], pes=1, word_bits=16, flit_bytes=1)
    with pytest.raises(ValueError, match="dst_mask"):
        RingFlit(0, 0b100).check(pes=2, word_bits=64, flit_bytes=16, stream_bits=2)
    with pytest.raises(ValueError, match="words"):
        RingFlit(0, 0b1, words=3).check(pes=2, word_bits=64, flit_bytes=16, stream_bits=2)
    with pytest.raises(ValueError, match="stream"):
        pack_flit(RingFlit(0, 1, stream=4), pes=2, word_bits=64, flit_bytes=16, stream_bits=2)
    with pytest.raises(ValueError, match="flits"):
        ref_ring([RingFlit(0, 0b100)], pes=2, word_bits=64, flit_bytes=16)


def test_parameters_and_errors():
    ring = StreamlineRing.from_arch(preset("small"))
    assert (ring.pes, ring.groups, ring.word_bits, ring.flit_bytes) == (4, 2, 512, 128)
    assert (ring.words_per_flit, ring.flits_per_word, ring.latency) == (2, 1, (1, 2))
    with inspection():                      # only inspected
        paper = StreamlineRing.from_arch(preset("paper-8gb"))
        assert (paper.groups, paper.flits_per_word, paper.latency[-1]) == (8, 4, 8)
        del paper
    for name in ("pes", "groups", "latency", "flit_bytes"):
        with pytest.raises(AttributeError):
            setattr(ring, name, 1)
    base = dict(pes=4, pes_per_group=2, word_bits=512, flit_bytes=128)
    for kw, msg in ((dict(pes=3), "pes"), (dict(pes_per_group=0), "pes_per_group"),
                    (dict(flit_bytes=96), "flit_bytes"), (dict(buffer_flits=0), "buffer_flits"),
                    (dict(stream_bits=0), "stream_bits"), (dict(word_bits=500), "word_bits")):
        with pytest.raises(ValueError, match=msg):
            StreamlineRing(**(base | kw))
    with pytest.raises(TypeError):
        StreamlineRing(4, 2, 512, 128)
    with pytest.raises(ValueError, match="first_pe"):
        RingStation(pes=4, first_pe=3, local_pes=2, word_bits=512, flit_bytes=128,
                    stream_bits=4, buffer_flits=2)
    with inspection():
        st = RingStation(pes=4, first_pe=2, local_pes=2, word_bits=512, flit_bytes=128,
                         stream_bits=4, buffer_flits=2)
        assert st.latency == 1 and st.ring_i.payload.shape() == ring.flit_layout
        del st
    Fragment.get(ring, None)


# ---- RTL against the golden model ------------------------------------------------------------

# name -> (pes, pes_per_group, word_bits, flit_bytes, buffer_flits)
GEOMS = {"4x2-W512-F128": (4, 2, 512, 128, 3),      # the small preset: two words per flit
         "6x2-W256-F32": (6, 2, 256, 32, 2),        # one word per flit
         "4x1-W512-F32": (4, 1, 512, 32, 2),        # a word spans two flits
         "4x2-W128-F64": (4, 2, 128, 64, 1)}        # four words per flit, one-flit FIFOs


@pytest.mark.parametrize("traffic", ["smooth", "stalls"])
@pytest.mark.parametrize("geom", list(GEOMS))
def test_random_traffic(geom, traffic):
    P, G, W, F, depth = GEOMS[geom]
    dut = StreamlineRing(pes=P, pes_per_group=G, word_bits=W, flit_bytes=F, stream_bits=3,
                         buffer_flits=depth)
    rng = random.Random(f"{geom}/{traffic}")
    flits = random_ring_flits(rng, pes=P, word_bits=W, flit_bytes=F, transfers=14,
                              stream_bits=3, max_words=6)  # with a flit naming no PE
    assert any(f.dst_mask == 0 for f in flits)
    idle, stall = (0.0, 0.0) if traffic == "smooth" else (0.3, 0.4)
    got, log = run_ring(dut, flits, seed=len(flits), idle=idle, stall=stall)
    assert got == ref_ring(flits, pes=P, word_bits=W, flit_bytes=F)
    assert len(log["inject"]) == len(flits)


def test_latency_and_full_rate():
    """Always-valid injection, always-ready PEs: one flit per cycle (round-robin unicast, each
    PE at a word per cycle), every word at the latency of its group; multicast to every PE
    with two words per flit is bounded by the PE ports (one flit per two cycles)."""
    P, G, W, F = 4, 2, 512, 128
    dut = StreamlineRing(pes=P, pes_per_group=G, word_bits=W, flit_bytes=F, buffer_flits=4)
    rng = random.Random(7)
    n = 64
    flits = [RingFlit(rng.getrandbits(8 * F), 1 << (i % P), words=2) for i in range(n)]
    got, log = run_ring(dut, flits)
    assert got == ref_ring(flits, pes=P, word_bits=W, flit_bytes=F)
    assert log["inject"] == list(range(n))
    for i in range(4):             # first word of flit i at latency[group] after injection
        p = i % P
        assert log["recv"][p][0] - log["inject"][i] == dut.latency[p // G]
    flits = [RingFlit(rng.getrandbits(8 * F), 0b1111, words=2) for _ in range(n)]
    got, log = run_ring(dut, flits)
    assert got == ref_ring(flits, pes=P, word_bits=W, flit_bytes=F)
    span = log["inject"][-1] - log["inject"][0] + 1
    assert span <= 2 * n        # bounded by the PE ports: 2 words per flit, 1 per cycle


@pytest.mark.parametrize("traffic", ["smooth", "stalls"])
def test_station_alone(traffic):
    """One RingStation (PEs 2, 3 of 6; one word spanning two flits) with random idles on
    ``ring_i`` and backpressure on ``ext`` and ``ring_o``: its PEs get ``ref_ring``'s words,
    ``ring_o`` carries exactly the flits naming later PEs, in order, with the group's bits
    cleared and everything else intact."""
    P, W, F = 6, 256, 16
    dut = RingStation(pes=P, first_pe=2, local_pes=2, word_bits=W, flit_bytes=F,
                      stream_bits=2, buffer_flits=2)
    rng = random.Random(f"station/{traffic}")
    # Upstream stations cleared PEs 0 and 1: bits only for PEs 2..5.
    flits = [RingFlit(f.data, f.dst_mask & 0b111100, f.stream, f.last, f.words)
             for f in random_ring_flits(rng, pes=P, word_bits=W, flit_bytes=F, transfers=16,
                                        stream_bits=2, max_words=4)]
    kw = dict(pes=P, word_bits=W, flit_bytes=F, stream_bits=2)
    layout = ring_flit_layout(**kw)
    raws = [pack_flit(f, **kw) for f in flits]
    want = ref_ring(flits, pes=P, word_bits=W, flit_bytes=F)[2:4]
    want_fwd = [pack_flit(RingFlit(f.data, f.dst_mask & 0b110000, f.stream, f.last, f.words),
                          **kw) for f in flits if f.dst_mask & 0b110000]
    idle, stall = (0.0, 0.0) if traffic == "smooth" else (0.3, 0.4)
    got, fwd = [[], []], []

    async def bench(ctx):
        pos, valid, quiet, cycle = 0, False, 0, 0
        held = [None] * 3
        outs = [dut.ext[0], dut.ext[1], dut.ring_o]
        sinks = [got[0], got[1], fwd]
        while quiet < 12:
            if not valid and pos < len(raws):
                valid = rng.random() >= idle
            ctx.set(dut.ring_i.valid, valid)
            ctx.set(dut.ring_i.payload.as_value(), raws[pos] if valid else
                    rng.getrandbits(layout.size))
            ready = [rng.random() >= stall for _ in outs]
            for port, r in zip(outs, ready):
                ctx.set(port.ready, r)
            if valid and ctx.get(dut.ring_i.ready):
                pos, valid = pos + 1, False
            for k, (port, r) in enumerate(zip(outs, ready)):
                if ctx.get(port.valid):
                    v = ctx.get(port.payload)
                    v = v.as_value().value if k == 2 else v
                    assert held[k] is None or held[k] == v, f"cycle {cycle}: port {k} changed"
                    held[k] = None if r else v
                    if r:
                        sinks[k].append(v)
                else:
                    assert held[k] is None, f"cycle {cycle}: port {k} valid dropped"
            done = pos == len(raws) and len(fwd) >= len(want_fwd) and \
                all(len(g) >= len(w) for g, w in zip(got, want))
            quiet = quiet + 1 if done else 0
            cycle += 1
            assert cycle < 5000, "timeout"
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert got == want and fwd == want_fwd
    assert want_fwd and all(want)


# ---- real traffic: the Mixtral-8x7B GSM8K trace through the host compiler ----------------

@pytest.mark.parametrize("traffic", ["smooth", "stalls"])
def test_real_mixtral_ext_traffic(gsm8k_routing, traffic):
    """The EXT weight traffic of the first verify step of the real Mixtral-8x7B GSM8K trace
    (:func:`mixtral_steps`: 8 decode tokens, positions 4-7 of both requests, with their
    original routing; layers 0, 8, 16, 24) on the ``small`` die's ring (4 PEs in 2 stations,
    W = 512, 128 B flits of two words; the die's FIFO depth and stream bits), with random
    idle injection cycles and backpressure on every PE port (``stalls``) or none
    (``smooth``).

    Real: the routing, hence the experts each group runs, which of them are HB-resident (their LSB
    planes and scales come from EXT) or streamed whole from EXT, and the PEs holding their tokens:
    so every transfer's destinations (multicast to the PEs that need it) and each PE's share, from
    the host compiler (:func:`~elmoe3d.sw.host.compiler.compile_layer`, 458 transfers of 4 or 32
    words, 2,856 to 4,488 words per PE). The words are the synthetic experts' weight planes and FP16
    scales. Assumed: each group's transfers in :func:`~elmoe3d.sw.host.parallel.ext_load_order`
    (what the die bench sends), chunked and merged as the die does while credits never run short
    (:func:`~elmoe3d.sw.golden.ext_sched.ext_chunk_order`), each chunk cut into flits by
    :func:`~elmoe3d.sw.golden.ring.ring_flits` with its number as stream id (the EXT streamer's
    numbering), layers one after another. The golden delivery is checked against the host too (each
    PE's words are its EXT LOAD words in program order); then every word each PE's ``ext`` port
    delivers must equal :func:`ref_ring`'s, in order."""
    arch = preset("small")
    G = arch.pes_per_group
    dut = StreamlineRing.from_arch(arch)
    steps, weights = mixtral_steps(gsm8k_routing, arch)
    step = next(s for s in steps if s.kind == "verify")
    chunks, loads, transfers = [], [[] for _ in range(arch.pes)], []
    for layer in sorted(step.layers):
        jobs = compile_layer(step, step.layers[layer], step.placements[layer], weights, arch)
        chunks += ext_chunk_order(
            [(g, [(tr.addr, tr.words, tr.dst_mask) for tr in ext_load_order(job)])
             for g, job in jobs], G, EXT_CHUNK_WORDS)
        for g, job in jobs:
            transfers += [(len(tr.words), tr.dst_mask << g * G) for tr in job.ext_transfers]
            for j in range(G):
                loads[g * G + j] += job.streams(j)[Source.EXT]
    flits = [f for k, (_, _, words, mask) in enumerate(chunks)
             for f in ring_flits(words, mask, word_bits=dut.word_bits,
                                 flit_bytes=dut.flit_bytes, stream=k % (1 << dut.stream_bits))]
    want = ref_ring(flits, pes=dut.pes, word_bits=dut.word_bits, flit_bytes=dut.flit_bytes)
    assert want == loads                    # the mapping delivers what the programs load
    # non-trivial: 8 tokens of both requests, 4 layers, transfers of several lengths,
    # multicast in both stations, every PE served, and unequal amounts per PE
    assert len(step.tokens) == 8 and {r for r, _ in step.tokens} == {0, 1}
    assert sorted(step.layers) == list(REAL_LAYERS)
    assert len({n for n, _ in transfers}) >= 2
    multicast = {m for _, m in transfers if m & (m - 1)}
    assert any(m & 0b0011 for m in multicast) and any(m & 0b1100 for m in multicast)
    assert all(want) and len(set(map(len, want))) > 1
    idle, stall = (0.0, 0.0) if traffic == "smooth" else (STALLS.idle, STALLS.backpressure)
    seed = REAL_TRAFFIC_SEED
    print(f"seed {seed}: tokens {step.tokens}, {len(transfers)} transfers "
          f"{sorted(set(transfers))}, {len(chunks)} chunks, {len(flits)} flits, words per PE "
          f"{[len(w) for w in want]}")
    got, log = run_ring(dut, flits, seed=seed, idle=idle, stall=stall, max_cycles=40000)
    assert got == want
    assert len(log["inject"]) == len(flits)


@pytest.mark.parametrize("geom", [(64, 16), (64, 8), (64, 4), (256, 8)])
def test_golden_transfers_round_trip(geom):
    """ring_flits then ref_ring gives every PE named exactly its transfers' words, in order,
    for flits holding several words, one word and a fraction of a word."""
    W, F = geom
    rng = random.Random(f"roundtrip/{W}/{F}")
    P = 5
    flits, want = [], [[] for _ in range(P)]
    for t in range(20):
        mask = rng.randrange(0, 1 << P)
        words = [rng.getrandbits(W) for _ in range(rng.randrange(1, 6))]
        flits += ring_flits(words, mask, word_bits=W, flit_bytes=F, stream=t % 4)
        for p in range(P):
            if mask >> p & 1:
                want[p] += words
    assert ref_ring(flits, pes=P, word_bits=W, flit_bytes=F) == want
    streams = ref_ring_streams(flits, pes=P, word_bits=W, flit_bytes=F)
    assert [sum(map(len, d.values())) for d in streams] == [len(w) for w in want]

"""The EXT read streamer (:class:`elmoe3d.hw.ext_stream.ExtStreamer`) in the Amaranth simulator:
random descriptors (unicast and multicast masks, odd and even lengths), word reads answered by
the bench from a memory with random latency, random backpressure on the ring's injection port.
The flits are compared by plain equality with the golden cut
:func:`elmoe3d.sw.golden.ring.ring_flits` of each transfer (stream ids numbering the descriptors)."""

import random

import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from elmoe3d.hw.ext_stream import ExtStreamer, ext_read_layout
from elmoe3d.sw.golden.ring import RingFlit, ring_flits, word_beats


def mem_word(a, W):
    return random.Random(a * 13 + 1).getrandbits(W)


def offer_desc(ctx, port, layout, pend):
    """Drive the EXT read descriptor stream ``port`` (payload :func:`ext_read_layout`
    ``layout``) with ``pend`` = ``(addr, words, dst_mask)``, or no beat for None (a beat
    offered is held until taken: the stream rule)."""
    ctx.set(port.valid, pend is not None)
    if pend is not None:
        ctx.set(port.payload, layout.const({"addr": pend[0], "words": pend[1],
                                            "dst_mask": pend[2]}))


@pytest.mark.parametrize("W,FB,lanes", [(512, 128, 1), (64, 64, 1), (64, 8, 1), (256, 8, 1),
                                         (512, 128, 2), (64, 32, 2), (64, 32, 4)])
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_flits_match_golden(W, FB, lanes, stall):
    """``lanes`` > 1: the bench hands the words over in beats cut as the golden word_beats
    from bursts of 4 words (the small die's LPDDR5 port at 8 channels), at every offset."""
    seed = W + FB + int(10 * stall) + 1000 * (lanes - 1)
    print(f"seed {seed}")
    rng = random.Random(seed)
    pes, sb = 4, 3
    descs = [(rng.randrange(1 << 20), rng.randint(1, 9), rng.randint(1, 15)) for _ in range(10)]
    dut = ExtStreamer(pes=pes, word_bits=W, flit_bytes=FB, stream_bits=sb, inflight=2,
                      lanes=lanes)
    want = []
    for i, (a, n, mask) in enumerate(descs):
        want += ring_flits([mem_word(a + k, W) for k in range(n)], mask, word_bits=W,
                           flit_bytes=FB, stream=i % (1 << sb))
    layout = ext_read_layout(pes)
    got = []

    async def bench(ctx):
        di, pend, reads, cycle = 0, None, [], 0
        while True:
            if pend is None and di < len(descs) and rng.random() >= stall:
                pend = descs[di]
            offer_desc(ctx, dut.desc, layout, pend)
            rr = rng.random() >= stall
            ctx.set(dut.rd_req.ready, rr)
            dv = bool(reads) and reads[0][0] <= cycle
            ctx.set(dut.rd_data.valid, dv)
            if dv and lanes == 1:
                ctx.set(dut.rd_data.payload, reads[0][1])
            elif dv:
                ctx.set(dut.rd_data.payload.words, len(reads[0][1]))
                ctx.set(dut.rd_data.payload.data,
                        sum(w << (W * i) for i, w in enumerate(reads[0][1])))
            ir = rng.random() >= stall
            ctx.set(dut.inject.ready, ir)
            if ctx.get(dut.rd_req.valid) and rr:
                p = ctx.get(dut.rd_req.payload)
                t = cycle + rng.randint(1, 5)
                a, k = int(p.addr), 0
                if lanes == 1:
                    reads += [(t, mem_word(a + k, W)) for k in range(int(p.words))]
                else:
                    for n in word_beats(a, int(p.words), words_per_burst=4, lanes=lanes):
                        reads.append((t, [mem_word(a + k + i, W) for i in range(n)]))
                        k += n
            if ctx.get(dut.inject.valid) and ir:
                f = ctx.get(dut.inject.payload)
                got.append(RingFlit(int(f.data), int(f.dst_mask), int(f.stream), bool(f.last),
                                    int(f.words)))
            if dv and ctx.get(dut.rd_data.ready):
                reads.pop(0)
            if pend is not None and ctx.get(dut.desc.ready):
                pend, di = None, di + 1
            if di == len(descs) and not reads and len(got) >= len(want):
                break
            await ctx.tick()
            cycle += 1
            assert cycle < 5000, f"timeout: {len(got)}/{len(want)} flits"
        ctx.set(dut.desc.valid, 0)
        ctx.set(dut.rd_data.valid, 0)
        for _ in range(5):
            await ctx.tick()
            assert not ctx.get(dut.inject.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    assert got == want


def test_parameters():
    s = ExtStreamer(pes=16, word_bits=4096, flit_bytes=128, stream_bits=4)
    assert (s.words_per_flit, s.flits_per_word, s.latency) == (1, 4, 1)
    Fragment.get(s, None)
    with pytest.raises(ValueError, match="flit_bytes"):
        ExtStreamer(pes=4, word_bits=512, flit_bytes=96, stream_bits=4)
    with pytest.raises(ValueError, match="inflight"):
        ExtStreamer(pes=4, word_bits=512, flit_bytes=128, stream_bits=4, inflight=0)
    wide = ExtStreamer(pes=4, word_bits=512, flit_bytes=128, stream_bits=4, lanes=2)
    assert wide.lanes == 2
    Fragment.get(wide, None)
    for lanes in (3, 4):
        with pytest.raises(ValueError, match="lanes"):
            ExtStreamer(pes=4, word_bits=512, flit_bytes=128, stream_bits=4, lanes=lanes)
    with pytest.raises(ValueError, match="lanes"):
        ExtStreamer(pes=16, word_bits=4096, flit_bytes=128, stream_bits=4, lanes=2)
    with pytest.raises(ValueError, match="pes"):
        ext_read_layout(0)


@pytest.mark.parametrize("lanes", [1, 2])
def test_wide_beats_give_a_flit_a_cycle(lanes):
    """With W = 512 and 128 B flits (the small die), words offered ``lanes`` a beat in every
    cycle and the ring always ready: one descriptor of 64 words leaves as 32 flits in 32
    cycles after the first at 2 words a beat (a flit a cycle, 128 B), in 64 at 1 (64 B a
    cycle, the one-word path); the flits are the golden cut."""
    W, FB, n = 512, 128, 64
    dut = ExtStreamer(pes=4, word_bits=W, flit_bytes=FB, stream_bits=4, inflight=2, lanes=lanes)
    words = [mem_word(k, W) for k in range(n)]
    want = ring_flits(words, 0b0101, word_bits=W, flit_bytes=FB, stream=0)
    got, when = [], []

    async def bench(ctx):
        ctx.set(dut.desc.payload, ext_read_layout(4).const(
            {"addr": 0, "words": n, "dst_mask": 0b0101}))
        ctx.set(dut.rd_req.ready, 1)
        ctx.set(dut.inject.ready, 1)
        k, cycle, pend = 0, 0, True
        while len(got) < len(want):
            ctx.set(dut.desc.valid, pend)
            sent = pend and ctx.get(dut.desc.ready)
            ctx.set(dut.rd_data.valid, k < n)
            if k < n and lanes == 1:
                ctx.set(dut.rd_data.payload, words[k])
            elif k < n:
                ctx.set(dut.rd_data.payload.words, 2)
                ctx.set(dut.rd_data.payload.data, words[k] | words[k + 1] << W)
            if k < n and ctx.get(dut.rd_data.ready):
                k += lanes
            if ctx.get(dut.inject.valid):
                f = ctx.get(dut.inject.payload)
                got.append(RingFlit(int(f.data), int(f.dst_mask), int(f.stream), bool(f.last),
                                    int(f.words)))
                when.append(cycle)
            pend = pend and not sent
            await ctx.tick()
            cycle += 1
            assert cycle < 500, f"timeout: {len(got)}/{len(want)} flits"

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    assert got == want
    assert when[-1] - when[0] == (len(want) - 1) * (2 // lanes)

"""The PE-word port of a DRAM controller (:class:`elmoe3d.hw.dram_port.DramWordPort`) in the
Amaranth simulator, against an in-order burst memory played by the bench with random latency
and backpressure: word writes (whole bursts) then word reads of random ranges, compared with a
word-level model of the memory by plain equality. Both geometries: bursts of several words (the
small die's HB bank) and words of several bursts (the paper's PE), and equal widths."""

import random

import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from elmoe3d.hw.dram_port import DramWordPort
from elmoe3d.sw.golden.ring import word_beats


#: The controller's burst address width in these benches.
ADDR_BITS = 16


def burst_init(addr, bits):
    return random.Random(addr * 31 + 5).getrandbits(bits)


def run_port(W, B, writes, reads, *, seed, stall, lanes=1, length_bits=12):
    """``writes``: list of (word addr, word); ``reads``: list of (addr, n). Returns the words
    read (``lanes`` > 1: the beats, ``(words, [slot words])``) and the controller's request
    log. The port addresses ``2^ADDR_BITS`` bursts."""
    dut = DramWordPort(word_bits=W, burst_bits=B, addr_bits=ADDR_BITS, length_bits=length_bits,
                       inflight=3, lanes=lanes)
    rng = random.Random(seed)
    mem = {}                                   # burst addr -> burst (written)
    out = {"rd": [], "reqs": []}
    n_rd = sum(n for _, n in reads)

    async def bench(ctx):
        ops = []                               # [write, addr, length, done]
        wi = ri = 0
        pend_rd = pend_wr = None
        delay = 0
        cycle = 0
        phase_reads = False
        while True:
            # sources
            if pend_wr is None and wi < len(writes) and rng.random() > stall:
                pend_wr = writes[wi]
            if phase_reads and pend_rd is None and ri < len(reads) and rng.random() > stall:
                pend_rd = reads[ri]
            ctx.set(dut.wr.valid, pend_wr is not None)
            if pend_wr is not None:
                ctx.set(dut.wr.payload.addr, pend_wr[0])
                ctx.set(dut.wr.payload.data, pend_wr[1])
            ctx.set(dut.rd_req.valid, pend_rd is not None)
            if pend_rd is not None:
                ctx.set(dut.rd_req.payload.addr, pend_rd[0])
                ctx.set(dut.rd_req.payload.words, pend_rd[1])
            # controller: requests, write data, read data, in order
            req_ready = rng.random() > stall
            ctx.set(dut.req.ready, req_ready)
            head = ops[0] if ops else None
            rv = head is not None and not head[0] and delay == 0
            ctx.set(dut.rdata.valid, rv)
            if rv:
                a = head[1] + head[3]
                ctx.set(dut.rdata.payload, mem.get(a, burst_init(a, B)))
            wready = head is not None and head[0] and rng.random() > stall
            ctx.set(dut.wdata.ready, wready)
            ctx.set(dut.rd_data.ready, rng.random() > stall)
            # sample
            if ctx.get(dut.req.valid) and req_ready:
                p = ctx.get(dut.req.payload)
                ops.append([bool(p.write), int(p.addr), int(p.length), 0])
                out["reqs"].append((bool(p.write), int(p.addr), int(p.length)))
            if ctx.get(dut.rd_data.valid) and ctx.get(dut.rd_data.ready):
                beat = ctx.get(dut.rd_data.payload)
                if lanes == 1:
                    out["rd"].append(beat)
                else:
                    n = int(beat.words)
                    out["rd"].append((n, [(int(beat.data) >> (W * i)) & ((1 << W) - 1)
                                          for i in range(n)]))
            if head is not None:
                if head[0] and wready and ctx.get(dut.wdata.valid):
                    mem[head[1] + head[3]] = ctx.get(dut.wdata.payload)
                    head[3] += 1
                elif rv and ctx.get(dut.rdata.ready):
                    head[3] += 1
                    delay = rng.randint(0, 3) if stall else 0
                elif delay:
                    delay -= 1
                if head[3] == head[2]:
                    ops.pop(0)
            if pend_wr is not None and ctx.get(dut.wr.ready):
                pend_wr = None
                wi += 1
            if pend_rd is not None and ctx.get(dut.rd_req.ready):
                pend_rd = None
                ri += 1
            if wi == len(writes) and not ops and pend_wr is None:
                phase_reads = True
            got = len(out["rd"]) if lanes == 1 else sum(n for n, _ in out["rd"])
            if phase_reads and ri == len(reads) and got == n_rd and not ops:
                break
            await ctx.tick()
            cycle += 1
            assert cycle < 20000, f"timeout: {len(out['rd'])}/{n_rd} words"
        for port in (dut.rdata, dut.rd_req, dut.wr):
            ctx.set(port.valid, 0)
        for _ in range(6):
            await ctx.tick()
            assert not ctx.get(dut.rd_data.valid) and not ctx.get(dut.req.valid)

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    return out, mem


def word_model(W, B, writes):
    """Word address -> word after ``writes`` (bursts not written keep their initial bits)."""
    def read(a):
        for wa, wd in reversed(writes):
            if wa == a:
                return wd
        if B >= W:
            kb = B // W
            return (burst_init(a // kb, B) >> (W * (a % kb))) & ((1 << W) - 1)
        kw = W // B
        return sum(burst_init(a * kw + k, B) << (B * k) for k in range(kw))
    return read


@pytest.mark.parametrize("W,B", [(64, 128), (32, 128), (64, 64), (128, 32)])
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_writes_then_reads(W, B, stall):
    seed = W * 1000 + B + int(stall * 10)
    print(f"seed {seed}")
    rng = random.Random(seed)
    kb = max(1, B // W)
    writes = []
    for _ in range(6):
        base = rng.randrange(0, 200) * kb
        writes += [(base + k, rng.getrandbits(W)) for k in range(kb)]
    reads = [(rng.randrange(0, 200 * kb), rng.randint(1, 9)) for _ in range(12)]
    reads += [(a, 1) for a, _ in writes[::3]]
    out, _ = run_port(W, B, writes, reads, seed=seed, stall=stall)
    model = word_model(W, B, writes)
    assert out["rd"] == [model(a + k) for a, n in reads for k in range(n)]
    check_read_requests(W, B, reads, out["reqs"])


def check_read_requests(W, B, reads, reqs):
    """One burst request per read, covering exactly its bursts."""
    kb, kw = max(1, B // W), max(1, W // B)
    rd_reqs = [r for r in reqs if not r[0]]
    assert len(rd_reqs) == len(reads)
    for (a, n), (_, ba, bl) in zip(reads, rd_reqs):
        if B >= W:
            assert (ba, bl) == (a // kb, (a + n - 1) // kb - a // kb + 1)
        else:
            assert (ba, bl) == (a * kw, n * kw)


@pytest.mark.parametrize("W,B", [(64, 128), (32, 128), (64, 64), (128, 32)])
def test_top_of_the_address_space(W, B):
    """Corners of the controller's fields: writes and reads of the last bursts of the
    ``2^ADDR_BITS`` (a read ending exactly on the last word), at addresses with every high
    burst-address bit set in turn, and reads of the longest burst count ``length_bits``
    allows (63 here; 60 when a word is 4 bursts), under random backpressure. A burst address
    cut short anywhere reads another burst's data (the bench's bursts differ by address)."""
    seed = W * 7 + B
    print(f"seed {seed}")
    rng = random.Random(seed)
    kb, kw = max(1, B // W), max(1, W // B)
    top = (1 << ADDR_BITS) * kb // kw                 # words the port addresses
    longest = (2 ** 6 - 1) * kb // kw                 # words in 63 bursts
    writes = []
    for base in (top - kb, top - 2 * kb, (1 << (ADDR_BITS - 1)) * kb // kw):
        base -= base % kb
        writes += [(base + k, rng.getrandbits(W)) for k in range(kb)]
    reads = [(top - 1, 1), (top - 5, 5), (top - longest, longest), (0, longest)]
    for bit in range(ADDR_BITS - 4, ADDR_BITS):      # each high burst-address bit alone
        a = (1 << bit) * kb // kw + rng.randrange(kb)
        reads.append((a, rng.randint(1, 7)))
    reads += [(a, 1) for a, _ in writes]
    reads.append(((1 << (ADDR_BITS - 1)) * kb // kw - 3, 2 * kb + 3))   # across bit 15
    out, _ = run_port(W, B, writes, reads, seed=seed, stall=0.4, length_bits=6)
    model = word_model(W, B, writes)
    assert all(a + n <= top for a, n in reads)
    assert out["rd"] == [model(a + k) for a, n in reads for k in range(n)]
    check_read_requests(W, B, reads, out["reqs"])
    assert max(bl for w, _, bl in out["reqs"] if not w) == 63 // kw * kw   # the longest


@pytest.mark.parametrize("W,B,lanes", [(64, 256, 2), (64, 256, 4), (32, 128, 2)])
@pytest.mark.parametrize("stall", [0.0, 0.4])
def test_wide_reads(W, B, lanes, stall):
    """``lanes`` words a beat: the beats cut as the golden word_beats (every read at every
    offset in a burst, odd and even lengths), their words the memory's, by plain equality."""
    seed = W * 100 + B + lanes + int(stall * 10)
    print(f"seed {seed}")
    rng = random.Random(seed)
    kb = B // W
    reads = [(rng.randrange(0, 100) * kb + off, rng.randint(1, 11)) for off in range(kb)
             for _ in range(3)]
    rng.shuffle(reads)
    out, _ = run_port(W, B, [], reads, seed=seed, stall=stall, lanes=lanes)
    model = word_model(W, B, [])
    want_counts = [n for a, k in reads for n in word_beats(a, k, words_per_burst=kb,
                                                              lanes=lanes)]
    assert [n for n, _ in out["rd"]] == want_counts
    assert [w for _, ws in out["rd"] for w in ws] == \
        [model(a + k) for a, n in reads for k in range(n)]
    if stall == 0.0 and lanes == 2:
        assert max(want_counts) == 2


def test_word_beats_rule():
    assert word_beats(0, 8, words_per_burst=4, lanes=2) == [2, 2, 2, 2]
    assert word_beats(1, 6, words_per_burst=4, lanes=2) == [2, 1, 1, 2]
    assert word_beats(3, 3, words_per_burst=4, lanes=4) == [1, 2]
    assert word_beats(5, 3, words_per_burst=1, lanes=1) == [1, 1, 1]
    assert word_beats(0, 0, words_per_burst=4, lanes=2) == []
    with pytest.raises(ValueError, match="lanes"):
        word_beats(0, 4, words_per_burst=4, lanes=3)


def test_parameters():
    p = DramWordPort(word_bits=512, burst_bits=1024, addr_bits=20, length_bits=16)
    assert (p.words_per_burst, p.bursts_per_word, p.latency) == (2, 1, 0)
    Fragment.get(p, None)
    q = DramWordPort(word_bits=4096, burst_bits=1024, addr_bits=20, length_bits=16)
    assert (q.words_per_burst, q.bursts_per_word, q.latency) == (1, 4, 4)
    Fragment.get(q, None)
    with pytest.raises(ValueError, match="word_bits"):
        DramWordPort(word_bits=96, burst_bits=128, addr_bits=8, length_bits=8)
    with pytest.raises(ValueError, match="inflight"):
        DramWordPort(word_bits=64, burst_bits=128, addr_bits=8, length_bits=8, inflight=0)
    w = DramWordPort(word_bits=512, burst_bits=2048, addr_bits=20, length_bits=16, lanes=2)
    assert (w.lanes, w.words_per_burst) == (2, 4)
    Fragment.get(w, None)
    with pytest.raises(ValueError, match="lanes: 4 words a beat"):
        DramWordPort(word_bits=512, burst_bits=1024, addr_bits=8, length_bits=8, lanes=4)
    with pytest.raises(ValueError, match="lanes"):
        DramWordPort(word_bits=64, burst_bits=256, addr_bits=8, length_bits=8, lanes=3)

"""The per-PE load router (:class:`elmoe3d.hw.load_router.LoadRouter`) in the Amaranth
simulator.

A random program (LOADs from HOST, HB and EXT of random sizes among other commands) goes in on
``cmd_i``; the bench models the three sources with random timing (an HB bank answering read
requests after a random latency, the ring's ``ext`` port, the host DMA stream) and random
backpressure on ``cmd_o``, ``ld`` and ``hb_req``. Checked with plain equality: every command
comes out unchanged and in order; ``ld`` carries exactly each LOAD's words from its source in
LOAD order; the HB requests cover exactly the HB LOADs' address ranges in order, none longer
than the burst; the HB words requested and not yet forwarded never exceed the FIFO bound; and
the HB controller's data is always accepted. Seeds are fixed and printed.
"""

import random

import pytest
from amaranth.hdl import Fragment, Value
from amaranth.sim import Simulator

from elmoe3d import isa
from elmoe3d.config import preset
from elmoe3d.hw.checked import inspection
from elmoe3d.hw.load_router import ADDR_BITS, WORDS_BITS, LoadRouter
from elmoe3d.isa import Op, Source, Target
from elmoe3d.sim.traffic import SMOOTH, Traffic


ARCH = preset("small")
W = ARCH.pe.word_bits
#: The router tests' rough traffic: every source idles 0.35, every sink (``cmd_o``, ``ld``,
#: ``hb_req``) is not ready 0.45 (not :data:`elmoe3d.sim.traffic.ROUGH`, the PE's).
ROUTER_ROUGH = Traffic("rough", idle=0.35, backpressure=0.45)


def random_program(rng, n_cmds, *, max_words=20, srcs=(Source.HOST, Source.HB, Source.EXT),
                   empty=0.0, high=0.0):
    """``(encoded commands, loads)``; loads are ``(src, hb_addr, words)`` in program order.
    A LOAD has 0 words with probability ``empty``; an HB LOAD reads the top of the 32-bit HB
    address space (ending at most on its last word) with probability ``high``."""
    cmds, loads = [], []
    for _ in range(n_cmds):
        if rng.random() < 0.6:
            src = rng.choice(srcs)
            words = 0 if empty and rng.random() < empty else rng.randint(1, max_words)
            addr = rng.randrange(0, 1 << 20) if src == Source.HB else rng.randrange(0, 1 << 32)
            if src == Source.HB and high and rng.random() < high:
                addr = (1 << ADDR_BITS) - words - addr
            cmds.append(isa.encode(Op.LOAD, target=rng.choice(list(Target)), buf=rng.randint(0, 1),
                                   addr=rng.randrange(1 << 16), words=words,
                                   signal=rng.randint(0, 1), src=src, hb_addr=addr))
            loads.append((src, addr, words))
        else:
            op = rng.choice([Op.GEMM, Op.REQUANT, Op.BARRIER, Op.SEND, Op.RECV, Op.STATUS])
            fields = {f.name: rng.randrange(1 << f.width) for f in isa.OPS[op]
                      if f.name not in ("mode", "sink", "target")}
            cmds.append(isa.encode(op, **fields))
    return cmds, loads


def hb_word(addr):
    """The bench's HB bank contents: a W-bit word derived from its address."""
    r = random.Random(addr * 7919 + 1)
    return r.getrandbits(W)


def run_router(dut, cmds, loads, *, seed, idle=0.0, stall=0.0, hb_latency=(1, 6),
               ext_hold=0, max_cycles=None):
    """Drive the router; return a dict of what it did. ``ext_hold``: the ext source offers
    nothing for that many cycles (to watch HB prefetch)."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    ext_words = [rng.getrandbits(W) for s, _, n in loads if s == Source.EXT for _ in range(n)]
    host_words = [rng.getrandbits(W) for s, _, n in loads if s == Source.HOST for _ in range(n)]
    expect_ld = []
    ei = hi = 0
    for src, addr, n in loads:
        if src == Source.EXT:
            expect_ld += ext_words[ei:ei + n]
            ei += n
        elif src == Source.HOST:
            expect_ld += host_words[hi:hi + n]
            hi += n
        else:
            expect_ld += [hb_word(addr + k) for k in range(n)]
    if max_cycles is None:
        rate = max(0.05, (1 - idle) * (1 - stall))
        max_cycles = 400 + ext_hold + int(6 * (len(cmds) + len(expect_ld)) / rate)
    out = {"cmd": [], "ld": [], "hb_req": [], "max_outstanding": 0, "cycles": 0,
           "expect_ld": expect_ld, "req_cycles": [], "ld_cycles": []}

    async def bench(ctx):
        ci = ei = hi = 0
        pend = {}                 # stream -> value currently offered (held until taken)
        hb_pipe = []              # (cycle ready, word) answering requests, in order
        hb_forwarded = 0          # HB words forwarded on ld
        hb_requested = 0
        held = {}                 # outputs offered and not taken: must stay unchanged
        cycle = 0

        def offer(name, items, idx):
            if name not in pend and idx < len(items) and rng.random() >= idle:
                pend[name] = items[idx]
            return pend.get(name)

        while True:
            c = offer("cmd", cmds, ci)
            e = offer("ext", ext_words, ei) if cycle >= ext_hold else pend.get("ext")
            h = offer("host", host_words, hi)
            ctx.set(dut.cmd_i.valid, c is not None)
            if c is not None:
                ctx.set(dut.cmd_i.payload.as_value(), c)
            ctx.set(dut.ext.valid, e is not None)
            if e is not None:
                ctx.set(dut.ext.payload, e)
            ctx.set(dut.host.valid, h is not None)
            if h is not None:
                ctx.set(dut.host.payload, h)
            hbv = bool(hb_pipe) and hb_pipe[0][0] <= cycle
            ctx.set(dut.hb_data.valid, hbv)
            if hbv:
                ctx.set(dut.hb_data.payload, hb_pipe[0][1])
            readies = {p: rng.random() >= stall for p in ("cmd_o", "ld", "hb_req")}
            for p, r in readies.items():
                ctx.set(getattr(dut, p).ready, r)

            # outputs, checked against the stream rule
            for p in ("cmd_o", "ld", "hb_req"):
                port = getattr(dut, p)
                v = ctx.get(port.valid)
                val = ctx.get(Value.cast(port.payload)) if v else None
                if p in held:
                    assert v and val == held[p], f"seed {seed} cycle {cycle}: {p} changed " \
                                                 f"or withdrawn before it was taken"
                    del held[p]
                if v:
                    if readies[p]:
                        if p == "cmd_o":
                            out["cmd"].append(val)
                        elif p == "ld":
                            out["ld"].append(val)
                            out["ld_cycles"].append(cycle)
                        else:
                            a, n = val & ((1 << 32) - 1), val >> 32
                            out["hb_req"].append((a, n))
                            out["req_cycles"].append(cycle)
                            lat = rng.randint(*hb_latency)
                            start = max([cycle + lat] + [t + 1 for t, _ in hb_pipe[-1:]])
                            hb_pipe += [(start + k, hb_word(a + k)) for k in range(n)]
                            hb_requested += n
                    else:
                        held[p] = val
            if hbv:
                assert ctx.get(dut.hb_data.ready), \
                    f"seed {seed} cycle {cycle}: HB data refused (a request without room)"
                hb_pipe.pop(0)
            if c is not None and ctx.get(dut.cmd_i.ready):
                ci += 1
                del pend["cmd"]
            if e is not None and ctx.get(dut.ext.ready):
                ei += 1
                del pend["ext"]
            if h is not None and ctx.get(dut.host.ready):
                hi += 1
                del pend["host"]
            # HB words forwarded so far: ld words that belong to HB LOADs
            n_ld, pos = len(out["ld"]), 0
            hb_forwarded = 0
            for src, _, n in loads:
                if pos >= n_ld:
                    break
                if src == Source.HB:
                    hb_forwarded += min(n, n_ld - pos)
                pos += n
            outstanding = hb_requested - hb_forwarded
            out["max_outstanding"] = max(out["max_outstanding"], outstanding)
            assert outstanding <= dut.hb_fifo_words, \
                f"seed {seed} cycle {cycle}: {outstanding} HB words outstanding"
            if ci == len(cmds) and len(out["ld"]) == len(expect_ld) and \
                    len(out["cmd"]) == len(cmds) and not hb_pipe:
                break
            await ctx.tick()
            cycle += 1
            assert cycle < max_cycles, (f"seed {seed}: timeout, {len(out['cmd'])}/{len(cmds)} "
                                        f"commands, {len(out['ld'])}/{len(expect_ld)} ld words")
        # drain: nothing more comes out
        ctx.set(dut.cmd_i.valid, 0)
        ctx.set(dut.ext.valid, 0)
        ctx.set(dut.host.valid, 0)
        ctx.set(dut.hb_data.valid, 0)
        for _ in range(10):
            await ctx.tick()
            for p in ("cmd_o", "ld", "hb_req"):
                assert not ctx.get(getattr(dut, p).valid), f"seed {seed}: extra {p} beat"
        out["cycles"] = cycle

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    return out


def check(out, cmds, loads, dut):
    assert out["cmd"] == cmds
    assert out["ld"] == out["expect_ld"]
    want = [(a + k) for s, a, n in loads if s == Source.HB for k in range(n)]
    got = [(a + k) for a, n in out["hb_req"] for k in range(n)]
    assert got == want
    assert all(1 <= n <= dut.hb_burst_words for _, n in out["hb_req"])


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_programs(traffic, seed):
    flow = SMOOTH if traffic == "smooth" else ROUTER_ROUGH
    print(f"seed {seed}, traffic {traffic}")
    rng = random.Random(seed)
    cmds, loads = random_program(rng, 40, empty=0.15, high=0.5)
    dut = LoadRouter(config=ARCH, queue_depth=4, hb_fifo_words=12, hb_burst_words=5,
                     ext_fifo_words=3, host_fifo_words=2)
    out = run_router(dut, cmds, loads, seed=seed, idle=flow.idle, stall=flow.backpressure)
    check(out, cmds, loads, dut)
    assert {s for s, _, _ in loads} == {Source.HOST, Source.HB, Source.EXT}
    assert any(n == 0 for _, _, n in loads)
    assert any(a >> 31 for s, a, _ in loads if s == Source.HB)


@pytest.mark.parametrize("longest", [False, True], ids=["empty", "longest"])
def test_empty_and_longest_loads(longest):
    """The LOAD ``words`` field's corners: 0-word LOADs of every source (they forward nothing,
    ask HB for nothing and do not hold up the LOADs behind them) around an HB LOAD ending on
    the last word of the 32-bit HB address space, and (``longest``, 65,535 cycles: a
    ``make test-slow`` case) the longest HB LOAD, ``2^16 - 1`` words, ending there too."""
    top = (1 << ADDR_BITS) - 1
    n = (1 << WORDS_BITS) - 1 if longest else 13
    loads = [(Source.HB, 7, 0), (Source.EXT, 0, 0), (Source.HOST, 0, 0),
             (Source.HB, top + 1 - n, n), (Source.HB, 9, 0),
             (Source.EXT, 0, 1), (Source.HB, top, 1), (Source.HOST, 0, 0), (Source.HOST, 0, 1)]
    print(f"seed 8, LOAD words {[w for _, _, w in loads]}")
    cmds = [isa.encode(Op.LOAD, target=Target.ACT, words=w, src=src, hb_addr=a)
            for src, a, w in loads]
    dut = LoadRouter(config=ARCH, queue_depth=4, hb_fifo_words=12, hb_burst_words=5,
                     ext_fifo_words=3, host_fifo_words=2)
    out = run_router(dut, cmds, loads, seed=8, idle=0.0 if longest else ROUTER_ROUGH.idle,
                     stall=0.0 if longest else ROUTER_ROUGH.backpressure)
    check(out, cmds, loads, dut)
    assert len(out["ld"]) == n + 3
    assert out["hb_req"][-1] == (top, 1)


@pytest.mark.parametrize("seed", [4, 5])
def test_one_word_fifos(seed):
    """The board's router: its data FIFOs one word deep and HB reads of one word
    (``elmoe3d.hw.board.ROUTER_FIFO_WORDS``), under rough traffic; the board top builds its
    router so."""
    from elmoe3d.hw.board import ROUTER_FIFO_WORDS, BoardTop
    print(f"seed {seed}")
    w = ROUTER_FIFO_WORDS
    rng = random.Random(seed)
    cmds, loads = random_program(rng, 30)
    dut = LoadRouter(config=ARCH, queue_depth=8, hb_fifo_words=w, hb_burst_words=w,
                     ext_fifo_words=w, host_fifo_words=w)
    out = run_router(dut, cmds, loads, seed=seed, idle=ROUTER_ROUGH.idle,
                     stall=ROUTER_ROUGH.backpressure)
    check(out, cmds, loads, dut)
    with inspection():                      # the board: inspected only, never elaborated
        board = BoardTop(config=ARCH, clk_hz=5_000_000, baud=1_000_000)
        r = board.router
        assert (r.hb_fifo_words, r.hb_burst_words, r.ext_fifo_words, r.host_fifo_words) == \
            (w, w, w, w) == (1, 1, 1, 1)
        del board, r


def test_back_to_back_at_full_rate():
    """Always-valid sources and always-ready sinks: one ld word per cycle across LOADs of
    every source (no idle cycle between LOADs)."""
    rng = random.Random(7)
    print("seed 7")
    cmds, loads = random_program(rng, 30, max_words=6)
    cmds = [c for c in cmds if isa.decode(c)[0] is Op.LOAD]
    dut = LoadRouter(config=ARCH, queue_depth=8, hb_fifo_words=16, hb_burst_words=4)
    out = run_router(dut, cmds, loads, seed=7, hb_latency=(1, 1))
    check(out, cmds, loads, dut)
    cyc = out["ld_cycles"]
    # after the first word (fill latency), every cycle carries a word
    assert cyc[-1] - cyc[0] == len(cyc) - 1, (cyc[0], cyc[-1], len(cyc))


def test_hb_prefetch_overlaps_other_loads():
    """While an EXT LOAD waits for its words, the HB reads of the following LOADs are issued
    up to the FIFO bound, and no further (the bench asserts the bound on every cycle)."""
    cmds = [isa.encode(Op.LOAD, target=Target.ACT, words=4, src=Source.EXT),
            isa.encode(Op.LOAD, target=Target.WMSB, words=10, src=Source.HB, hb_addr=100),
            isa.encode(Op.LOAD, target=Target.WSCALE, words=30, src=Source.HB, hb_addr=5000)]
    loads = [(Source.EXT, 0, 4), (Source.HB, 100, 10), (Source.HB, 5000, 30)]
    dut = LoadRouter(config=ARCH, queue_depth=4, hb_fifo_words=16, hb_burst_words=4)
    out = run_router(dut, cmds, loads, seed=3, ext_hold=60, hb_latency=(2, 2))
    check(out, cmds, loads, dut)
    early = sum(n for (a, n), t in zip(out["hb_req"], out["req_cycles"]) if t < 60)
    # the FIFO filled before any EXT word, but for less than one burst (requests keep their
    # burst size rather than shrink to the room left): here 4 + 4 + 2 then 4 words
    assert 16 - dut.hb_burst_words < early <= 16
    assert early == 14
    assert out["ld_cycles"][0] >= 60


def test_parameters():
    r = LoadRouter(config=ARCH.pe, queue_depth=3, hb_fifo_words=9, hb_burst_words=9,
                   ext_fifo_words=2, host_fifo_words=5)
    assert (r.queue_depth, r.hb_fifo_words, r.hb_burst_words, r.ext_fifo_words,
            r.host_fifo_words, r.latency, r.cmd_latency) == (3, 9, 9, 2, 5, 1, 0)
    Fragment.get(r, None)                 # elaborates at these parameters
    with pytest.raises(ValueError, match="hb_burst_words"):
        LoadRouter(config=ARCH, hb_fifo_words=4, hb_burst_words=5)
    for name in ("queue_depth", "hb_fifo_words", "hb_burst_words", "ext_fifo_words",
                 "host_fifo_words"):
        with pytest.raises(ValueError, match=name):
            LoadRouter(config=ARCH, **{name: 0})
    with pytest.raises(TypeError, match="config"):
        LoadRouter(config="small")

"""Aggregation link (:class:`elmoe3d.hw.agg_link.AggregationLink`) in the Amaranth simulator
against its golden model :func:`elmoe3d.sw.golden.agg_link.ref_link`, plus the golden model's
own rules.

Every comparison is plain equality on the W-bit words each destination PE receives. Traffic:
random descriptors and words, corner cases, bad descriptors, and the descriptors and ``link_o``
words the host compiler and the multi-PE functional simulation make of the real Mixtral-8x7B
GSM8K routing trace (:func:`test_real_mixtral_link_traffic`). Seeds are fixed, in the test ids
or printed.
"""

import random

import numpy as np
import pytest
from amaranth.hdl import Fragment
from amaranth.sim import Simulator

from elmoe3d.config import ArchConfig, preset
from elmoe3d.hw.agg_link import (DEFAULT_BUFFER_WORDS, AggregationLink, LinkModeRTL, ReduceTree,
                                 link_op_layout, pack_link_op)
from elmoe3d.hw.checked import inspection
from elmoe3d.sim.amaranth_streams import StreamSink
from elmoe3d.sim.bench_agg_link import random_link_op
from elmoe3d.sim.traffic import STALLS
from elmoe3d.sw.golden.datapath import INT64_MAX, INT64_MIN
from elmoe3d.sw.golden.agg_link import (LinkMode, LinkOp, link_op_fault, ref_link,
                                        reduce_add_words, reduce_max_words)
from elmoe3d.sw.host.backends.golden import run_layer_golden

from ..real_inputs import REAL_LAYERS, REAL_TRAFFIC_SEED, mixtral_steps

# Constructors that raise, and instances only inspected, leave unused elaboratables behind.
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


def _word(values, dtype, word_bits):
    raw = np.asarray(values, dtype).tobytes()
    assert len(raw) * 8 == word_bits
    return int.from_bytes(raw, "little")


def random_word(rng, word_bits):
    return rng.getrandbits(word_bits)


def run_link(dut, ops, inputs, *, seed=0, idle=0.0, stall=0.0, op_gap=0.0, max_cycles=20000):
    """Drive descriptors ``ops`` and per-PE word lists ``inputs`` (each source's words for all
    descriptors, in order) through ``dut`` with random source idles, sink stalls and gaps before
    descriptors; check the stream rule on every ``pe_o`` (a word offered and not taken stays
    unchanged). Returns ``(received per PE, log)``: log has the cycle of every descriptor taken
    (``op``), every ``done`` pulse, every word taken per source (``take``) and offered/taken per
    destination (``first_valid``, ``recv``), and ``cycles``."""
    G = dut.pes
    raws = [pack_link_op(op, G) for op in ops]
    rng = random.Random(seed)
    sinks = [StreamSink(dut.pe_o[d], rng, stall, f"PE {d}") for d in range(G)]
    got = [k.got for k in sinks]
    log = {"op": [], "done": [], "take": [[] for _ in range(G)], "recv": [k.cycles for k in sinks],
           "cycles": 0}
    total = sum(op.delivered_words() * len(op.dsts) for op in ops)

    async def bench(ctx):
        pos = [0] * G
        opi, cycle = 0, 0
        valid = [False] * G
        op_valid = False
        quiet = 0
        while True:
            if not op_valid and opi < len(ops):
                op_valid = rng.random() >= op_gap
            ctx.set(dut.op.valid, op_valid)
            if op_valid:
                ctx.set(dut.op.payload.as_value(), raws[opi])
            for s in range(G):
                if not valid[s] and pos[s] < len(inputs[s]):
                    valid[s] = rng.random() >= idle
                ctx.set(dut.pe_i[s].valid, valid[s])
                ctx.set(dut.pe_i[s].payload, inputs[s][pos[s]] if valid[s] else
                        rng.getrandbits(dut.word_bits))
            for k in sinks:
                k.drive(ctx)
            if op_valid and ctx.get(dut.op.ready):
                log["op"].append(cycle)
                op_valid = False
                opi += 1
            if ctx.get(dut.done):
                log["done"].append(cycle)
            for s in range(G):
                if valid[s] and ctx.get(dut.pe_i[s].ready):
                    log["take"][s].append(cycle)
                    pos[s] += 1
                    valid[s] = False
            for k in sinks:
                k.sample(ctx, cycle)
            n = sum(map(len, got))
            assert n <= total, f"cycle {cycle}: more words delivered than sent"
            quiet = quiet + 1 if n == total and opi == len(ops) else 0
            if quiet > 3 * dut.flits_per_word + 8:
                break
            assert cycle < max_cycles, f"timeout: {n} of {total} words after {cycle} cycles"
            cycle += 1
            await ctx.tick()
        log["cycles"] = cycle
        log["pos"] = pos
        log["first_valid"] = [k.first for k in sinks]
        log["errors"] = ctx.get(dut.errors.as_value())

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return got, log


def expected(ops, data, G, word_bits):
    """Per-destination concatenation of ref_link over the descriptor sequence; ``data[k][s]``
    is source s's words for descriptor k."""
    out = [[] for _ in range(G)]
    for op, d in zip(ops, data):
        for pe, words in enumerate(ref_link(op, d, word_bits=word_bits)):
            out[pe].extend(words)
    return out


def make_traffic(rng, ops, G, word_bits):
    """Random words per descriptor and source: ``(data[k][s], inputs[s])``."""
    data = [[[random_word(rng, word_bits) for _ in range(op.words)] if s in op.srcs else []
             for s in range(G)] for op in ops]
    inputs = [[w for d in data for w in d[s]] for s in range(G)]
    return data, inputs


# ---- parameters and layout -----------------------------------------------------------------

def test_parameters_and_errors():
    dut = AggregationLink(pes=4, word_bits=512, flit_bytes=32, buffer_words=8)
    assert (dut.pes, dut.word_bits, dut.flit_bytes, dut.buffer_words) == (4, 512, 32, 8)
    assert dut.flits_per_word == 2 and dut.latency == 2 and dut.op_latency == 2
    assert dut.reduce_stages == 2 and dut.reduce_latency == 4
    assert [dut.word_latency(m) for m in LinkMode] == [2, 2, 4, 4]
    assert dut.reject_cycles == 1 and dut.errors_latency == 1
    for name in ("pes", "word_bits", "flit_bytes", "buffer_words", "latency", "reject_cycles",
                 "errors_latency"):
        with pytest.raises(AttributeError):
            setattr(dut, name, 1)
    with pytest.raises(TypeError):
        AggregationLink(4, 512, 32, 8)
    for kw, msg in ((dict(pes=0), "pes"), (dict(word_bits=500), "word_bits"),
                    (dict(flit_bytes=12), "flit_bytes"), (dict(flit_bytes=128), "word_bits"),
                    (dict(buffer_words=0), "buffer_words"), (dict(pes=2.0), "pes")):
        args = dict(pes=4, word_bits=512, flit_bytes=32, buffer_words=8) | kw
        with pytest.raises(ValueError, match=msg):
            AggregationLink(**args)
    arch = preset("paper-4gb")
    with inspection():                      # only inspected
        link = AggregationLink.from_arch(arch)
        assert (link.pes, link.word_bits, link.flit_bytes, link.flits_per_word) == \
            (4, 4096, 32, 16)
        small = AggregationLink.from_arch(preset("small"), buffer_words=4)
        assert (small.pes, small.word_bits, small.flit_bytes) == (2, 512, 32)
        del link, small
    assert dut.op.payload.shape() == link_op_layout(4)
    Fragment.get(dut, None)


def test_link_op_validation_names_the_field():
    for kw, field in ((dict(mode=7), "mode"), (dict(src_mask=0), "src_mask"),
                      (dict(dst_mask=0), "dst_mask"), (dict(words=-1), "words"),
                      (dict(words=1 << 16), "words"), (dict(chunk=0), "chunk"),
                      (dict(mode=LinkMode.BYPASS, src_mask=3), "src_mask"),
                      (dict(mode=LinkMode.ALL_TO_ALL, dst_mask=3, chunk=2, words=6), "words"),
                      (dict(words=True), "words"), (dict(src_mask="1"), "src_mask")):
        args = dict(mode=LinkMode.REDUCE_ADD, src_mask=1, dst_mask=1, words=4, chunk=1) | kw
        with pytest.raises(ValueError, match=field):
            LinkOp(**args)
    op = LinkOp(LinkMode.REDUCE_MAX, 0b101, 0b1, 2)
    with pytest.raises(ValueError, match="src_mask"):
        op.check(2)
    with pytest.raises(ValueError, match="src_mask"):
        ref_link(op, [[1, 2], [3, 4]], word_bits=64)
    with pytest.raises(ValueError, match="inputs"):
        ref_link(op, [[1], [3], [4, 5]], word_bits=64)
    with pytest.raises(ValueError, match="word_bits"):
        ref_link(op, [[1, 2], [3, 4], [4, 5]], word_bits=48)
    with pytest.raises(ValueError, match="src_mask"):
        pack_link_op(op, 2)
    layout = link_op_layout(3)
    view = layout.from_bits(pack_link_op(op, 3))
    assert (LinkModeRTL(view.mode), int(view.src_mask), int(view.dst_mask), int(view.words),
            int(view.chunk)) == (LinkModeRTL.REDUCE_MAX, 0b101, 1, 2, 1)


def test_golden_modes_by_hand():
    W = 128
    a = [_word([1, -2], "<i8", W), _word([INT64_MAX, 5], "<i8", W)]
    b = [_word([10, 20], "<i8", W), _word([1, INT64_MIN], "<i8", W)]
    c = [_word([100, 200], "<i8", W), _word([-1, -6], "<i8", W)]
    out = ref_link(LinkOp(LinkMode.REDUCE_ADD, 0b111, 0b101, 2), [a, b, c], word_bits=W)
    # Saturation at every step in ascending source order: (MAX + 1) saturates, then - 1.
    assert out[0] == out[2] == [_word([111, 218], "<i8", W),
                                _word([INT64_MAX - 1, INT64_MIN], "<i8", W)]
    assert out[1] == []
    assert reduce_add_words([a, b, c], word_bits=W)[1] is True
    m = ref_link(LinkOp(LinkMode.REDUCE_MAX, 0b11, 0b10, 1),
                 [[_word([0xFFFFFFFF, 1, 7, 0], "<u4", W)],
                  [_word([3, 0x80000000, 7, 0], "<u4", W)]], word_bits=W)
    assert m == [[], [_word([0xFFFFFFFF, 0x80000000, 7, 0], "<u4", W)]]
    # ALL_TO_ALL: 2 sources x 4 chunks of 1 word to 2 destinations.
    s0, s1 = [0, 1, 2, 3], [10, 11, 12, 13]
    out = ref_link(LinkOp(LinkMode.ALL_TO_ALL, 0b11, 0b101, 4, 1), [s0, s1, []], word_bits=W)
    assert out == [[0, 10, 2, 12], [], [1, 11, 3, 13]]
    out = ref_link(LinkOp(LinkMode.ALL_TO_ALL, 0b10, 0b1, 4, 2), [[], s1], word_bits=W)
    assert out == [s1, []]
    out = ref_link(LinkOp(LinkMode.BYPASS, 0b10, 0b11, 3), [[], s1], word_bits=W)
    assert out == [s1[:3], s1[:3]]


# ---- RTL against the golden model ------------------------------------------------------------

GEOMS = {"G2-W512-F32": (2, 512, 32, 4), "G4-W256-F32": (4, 256, 32, 3),
         "G3-W512-F64": (3, 512, 64, 2), "G4-W512-F16": (4, 512, 16, 5),
         # the host's larger groups (MAX_LINK_PES = 16): 3- and 4-level reduction trees; a
         # flit per word (W = flit) included
         "G8-W128-F8": (8, 128, 8, 3), "G16-W64-F8": (16, 64, 8, 2)}


@pytest.mark.parametrize("mode", list(LinkMode), ids=lambda m: m.name)
@pytest.mark.parametrize("geom", ["G2-W512-F32", "G4-W256-F32"])
def test_each_mode_smooth_traffic(mode, geom):
    G, W, F, depth = GEOMS[geom]
    rng = random.Random(f"{geom}/{mode.name}")
    dut = AggregationLink(pes=G, word_bits=W, flit_bytes=F, buffer_words=depth)
    allm = (1 << G) - 1
    if mode == LinkMode.BYPASS:
        ops = [LinkOp(mode, 1 << (G - 1), allm, 6), LinkOp(mode, 1, 1 << (G - 1), 5)]
    elif mode == LinkMode.ALL_TO_ALL:
        ops = [LinkOp(mode, allm, allm, 2 * G * 2, 2), LinkOp(mode, 0b1, allm, G, 1)]
    else:
        ops = [LinkOp(mode, allm, allm, 7), LinkOp(mode, 0b10, 0b1, 3)]
    data, inputs = make_traffic(rng, ops, G, W)
    got, log = run_link(dut, ops, inputs)
    assert got == expected(ops, data, G, W)
    assert len(log["done"]) == len(ops)
    assert log["pos"] == [len(x) for x in inputs]


@pytest.mark.parametrize("geom", list(GEOMS))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_descriptors_with_idles_and_backpressure(geom, seed):
    G, W, F, depth = GEOMS[geom]
    rng = random.Random(f"{geom}/{seed}")
    dut = AggregationLink(pes=G, word_bits=W, flit_bytes=F, buffer_words=depth)
    ops = [random_link_op(rng, G, max_words=12) for _ in range(10)]
    data, inputs = make_traffic(rng, ops, G, W)
    got, log = run_link(dut, ops, inputs, seed=seed, idle=STALLS.idle, stall=STALLS.backpressure,
                        op_gap=0.3)
    assert got == expected(ops, data, G, W)
    assert len(log["done"]) == len(ops)


def test_corners_saturation_and_max():
    """Saturation in both directions mid-chain, 0xFFFFFFFF in max, single source, all
    destinations, chunk = 1."""
    G, W = 4, 256
    dut = AggregationLink(pes=G, word_bits=W, flit_bytes=32, buffer_words=2)
    i64 = lambda v: _word(v, "<i8", W)
    u32 = lambda v: _word(v, "<u4", W)
    add_in = [[i64([INT64_MAX, INT64_MIN, -1, 0]), i64([INT64_MAX] * 4)],
              [i64([1, -1, INT64_MIN, 0]), i64([INT64_MAX] * 4)],
              [i64([-5, 3, INT64_MIN, 0]), i64([INT64_MIN] * 4)],
              [i64([0, 0, 1, -1]), i64([5, 6, 7, 8])]]
    max_in = [[u32([0xFFFFFFFF, 0, 1, 2, 3, 4, 5, 6])], [u32([0, 0xFFFFFFFF] + [0] * 6)],
              [u32([7] * 8)], [u32([0x80000000] * 8)]]
    ops = [LinkOp(LinkMode.REDUCE_ADD, 0b1111, 0b1111, 2),
           LinkOp(LinkMode.REDUCE_MAX, 0b1111, 0b1111, 1),
           LinkOp(LinkMode.REDUCE_ADD, 0b0100, 0b0011, 1),            # single source
           LinkOp(LinkMode.ALL_TO_ALL, 0b1111, 0b1111, 4, 1),
           LinkOp(LinkMode.BYPASS, 0b1000, 0b1111, 3)]
    rng = random.Random(5)
    data = [add_in, max_in,
            [[], [], [i64([INT64_MIN, 1, 2, 3])], []],
            [[rng.getrandbits(W) for _ in range(4)] for _ in range(G)],
            [[], [], [], [rng.getrandbits(W) for _ in range(3)]]]
    inputs = [[w for d in data for w in d[s]] for s in range(G)]
    want = expected(ops, data, G, W)
    assert want[0][0] == i64([INT64_MAX - 5, INT64_MIN + 3, INT64_MIN + 1, -1])
    # MAX + MAX saturates to MAX, + MIN = -1, + 5..8 (the exact sum would overflow).
    assert want[0][1] == i64([4, 5, 6, 7])
    assert want[0][2] == want[3][2] == u32([0xFFFFFFFF, 0xFFFFFFFF] + [0x80000000] * 6)
    for stall in (0.0, 0.5):
        got, log = run_link(dut, ops, inputs, seed=3, idle=stall, stall=stall)
        assert got == want


@pytest.mark.parametrize("pes", [1, 2, 5, 8, 16])
def test_reduce_tree_equals_the_ascending_chain(pes):
    """:class:`ReduceTree` alone (64-bit flits): lanes near the int64 bounds so the ascending
    chain saturates mid-way (the order matters), random masks, REDUCE_ADD against
    :func:`reduce_add_words` and REDUCE_MAX against :func:`reduce_max_words`, a flit entering
    every cycle with random stalls; each result ``stages`` advances after its flits."""
    W = 64
    rng = random.Random(f"tree/{pes}")
    dut = ReduceTree(pes=pes, flit_bits=W)
    assert dut.stages == max(1, (pes - 1).bit_length())
    big = [INT64_MAX, INT64_MIN, INT64_MAX - 3, INT64_MIN + 7, 1 << 62, -(1 << 62), -1, 0, 5]
    cases = []
    for k in range(120):
        add = k % 3 != 2
        mask = rng.randrange(1, 1 << pes)
        if add:
            vals = [rng.choice(big) if rng.random() < 0.7 else rng.randrange(INT64_MIN, INT64_MAX)
                    for _ in range(pes)]
            words = [v & ((1 << 64) - 1) for v in vals]
            srcs = [[words[s]] for s in range(pes) if mask >> s & 1]
            want = reduce_add_words(srcs, word_bits=W)[0][0]
        else:
            words = [rng.choice([0, 0xFFFFFFFF, 0x80000000, rng.getrandbits(32)])
                     | rng.choice([0, 0xFFFFFFFF, rng.getrandbits(32)]) << 32 for _ in range(pes)]
            srcs = [[words[s]] for s in range(pes) if mask >> s & 1]
            want = reduce_max_words(srcs, word_bits=W)[0]
        cases.append((add, mask, words, want))
    got = []

    async def bench(ctx):
        sent, cycle, advances, mode = 0, 0, 0, None
        entered = []                        # advances counted when each case entered
        while len(got) < len(cases):
            en = rng.random() >= 0.25
            # the mode is held while the tree holds flits (the link's descriptors)
            can = sent < len(cases) and (mode is None or cases[sent][0] == mode
                                         or not ctx.get(dut.pending))
            send = en and can and rng.random() >= 0.1
            if send:
                add, mask, words, _ = cases[sent]
                mode = add
                ctx.set(dut.add, add)
                ctx.set(dut.mask, mask)
                for s in range(pes):
                    ctx.set(dut.i[s], words[s])
            ctx.set(dut.en, en)
            ctx.set(dut.i_valid, send)
            if en and ctx.get(dut.o_valid):
                assert advances - entered[len(got)] == dut.stages
                got.append(ctx.get(dut.o))
            if send:
                entered.append(advances)
                sent += 1
            advances += en
            cycle += 1
            await ctx.tick()
            assert cycle < 20 * len(cases), "the tree lost a flit"

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert got == [c[3] for c in cases]


@pytest.mark.parametrize("geom", [(2, 512, 32), (16, 64, 8)], ids=["G2-W512", "G16-W64"])
def test_latency_and_full_rate_streaming(geom):
    """Always-valid sources, always-ready sinks: one flit per cycle per port, the first word
    offered ``op_latency + word_latency(mode)`` cycles after the descriptor is taken (the
    reduce modes through a 1- and a 4-level tree), and an ALL_TO_ALL that skews into a
    wavefront and then runs every port at full rate."""
    G, W, F = geom
    dut = AggregationLink(pes=G, word_bits=W, flit_bytes=F, buffer_words=4)
    S = dut.flits_per_word
    n, allm = 48, (1 << G) - 1
    for op in (LinkOp(LinkMode.BYPASS, 0b01, allm, n), LinkOp(LinkMode.REDUCE_ADD, allm, allm, n),
               LinkOp(LinkMode.REDUCE_MAX, allm, 0b10, n),
               LinkOp(LinkMode.ALL_TO_ALL, allm, allm, n, 1)):
        data, inputs = make_traffic(random.Random(op.mode), [op], G, W)
        got, log = run_link(dut, [op], inputs)
        assert got == expected([op], data, G, W)
        first = min(log["first_valid"][d] for d in op.dsts)
        last = max(log["recv"][d][-1] for d in op.dsts)
        assert first - log["op"][0] == dut.op_latency + dut.word_latency(op.mode)
        skew = (len(op.srcs) - 1) * op.chunk * S if op.mode == LinkMode.ALL_TO_ALL else 0
        ideal = max(op.words, op.delivered_words()) * S
        assert last - first == ideal - S + skew, op


@pytest.mark.parametrize("pes", [1, 2, 3, 4])
def test_golden_properties_on_random_descriptors(pes):
    """ref_link on random descriptors: ALL_TO_ALL delivers every source word exactly once
    (destination i gets exactly the chunks j = i mod nd); BYPASS copies the source; with
    small values REDUCE_ADD is the exact lane sum and REDUCE_MAX the lane max; non-destinations
    get nothing and words beyond ``words`` are ignored."""
    rng = random.Random(f"golden/{pes}")
    W = 128
    for _ in range(60):
        op = random_link_op(rng, pes, max_words=12)
        small = op.mode in (LinkMode.REDUCE_ADD, LinkMode.REDUCE_MAX) and rng.random() < 0.5
        lanes = [[[rng.randrange(-1000, 1000) for _ in range(2)] for _ in range(op.words + 2)]
                 for _ in range(pes)]
        if small:
            inputs = [[_word(v, "<i8", W) if op.mode == LinkMode.REDUCE_ADD else
                       _word([x & 0xFFFFFFFF for x in v for _ in (0, 1)], "<u4", W)
                       for v in src] for src in lanes]
        else:
            inputs = [[rng.getrandbits(W) for _ in range(op.words + 2)] for _ in range(pes)]
        out = ref_link(op, inputs, word_bits=W)
        for d in range(pes):
            if d not in op.dsts:
                assert out[d] == []
            else:
                assert len(out[d]) == op.delivered_words()
        if op.mode == LinkMode.BYPASS:
            assert all(out[d] == inputs[op.srcs[0]][:op.words] for d in op.dsts)
        elif op.mode == LinkMode.ALL_TO_ALL:
            sent = sorted(w for s in op.srcs for w in inputs[s][:op.words])
            assert sorted(w for d in op.dsts for w in out[d]) == sent
            nd, c = len(op.dsts), op.chunk
            for i, d in enumerate(op.dsts):
                mine = sorted(w for s in op.srcs for j in range(i, op.words // c, nd)
                              for w in inputs[s][j * c:(j + 1) * c])
                assert sorted(out[d]) == mine
        elif small and op.mode == LinkMode.REDUCE_ADD:
            want = [_word([sum(lanes[s][k][j] for s in op.srcs) for j in range(2)], "<i8", W)
                    for k in range(op.words)]
            assert all(out[d] == want for d in op.dsts)
        elif small:
            want = [_word([max(lanes[s][k][j] & 0xFFFFFFFF for s in op.srcs)
                           for j in range(2) for _ in (0, 1)], "<u4", W)
                    for k in range(op.words)]
            assert all(out[d] == want for d in op.dsts)


# ---- real traffic: the Mixtral-8x7B GSM8K trace through the host compiler ----------------

#: Real-traffic groups: the ``small`` die's (2 PEs, what ``make sim`` and the die bench run)
#: and the paper's group size with the small PE (``ArchConfig(pes=8, pes_per_group=4)``, the
#: cocotb link bench's): 3- and 4-source reductions through a 2-level tree, 4-way ALL_TO_ALL.
REAL_ARCHS = {"small-G2": preset("small"), "G4": ArchConfig(pes=8, pes_per_group=4)}


@pytest.mark.parametrize("traffic", ["smooth", "stalls"])
@pytest.mark.parametrize("arch", list(REAL_ARCHS))
def test_real_mixtral_link_traffic(gsm8k_routing, arch, traffic):
    """The aggregation-link traffic of the real Mixtral-8x7B GSM8K trace, every descriptor of
    its first 9 layer-steps (``tests/real_inputs.py``, :func:`mixtral_steps`: the 4 autoregressive
    seed steps and 4 draft steps of 2 tokens -- positions 0-7 of both requests -- and the verify
    step of their 8 draft tokens) at layers 0, 8, 16 and 24, on one group's link (every group's link
    is the same block; the busy groups' descriptors run one group after another, layer after layer),
    with random source idles, sink backpressure and descriptor gaps (``stalls``) or none
    (``smooth``).

    Real: the routing (the draft's throttled to the Elastic-SD pool), hence which experts
    each group runs and with how many tokens per PE, so every descriptor (mode, masks,
    lengths) is the host compiler's
    (:func:`~elmoe3d.sw.host.backends.golden.run_layer_golden`:
    :func:`~elmoe3d.sw.host.parallel.compile_group` per busy group), and
    every payload word is a PE's ``link_o`` word in the multi-PE functional simulation
    (:func:`~elmoe3d.sw.host.parallel.run_group`, itself checked against ``ref_moe``) of the
    synthetic experts and activations under the trace's gate weights: per-token row maxima
    (REDUCE_MAX), MSB_ONLY up/gate psums (BYPASS), INT8 h rows (ALL_TO_ALL), down-projection
    psums and the gate-weighted Q.24 expert outputs of the layer-final reduction
    (REDUCE_ADD). Every word every PE receives must equal :func:`ref_link`'s, in order;
    every descriptor pulses ``done`` once, every source word is taken, no error flag rises."""
    cfg = REAL_ARCHS[arch]
    G, W = cfg.pes_per_group, cfg.pe.word_bits
    steps, weights = mixtral_steps(gsm8k_routing, cfg)
    steps = steps[:9]
    assert [s.kind for s in steps] == ["ar"] * 4 + ["draft"] * 4 + ["verify"]
    ops, data, seen = [], [], set()
    for step in steps:
        for layer in sorted(step.layers):
            gl = run_layer_golden(step, layer, weights, cfg)
            assert gl.mismatches == 0, gl.details
            for g, job, res, _ in gl.jobs:
                assert job.buffer_words == DEFAULT_BUFFER_WORDS
                pos = [0] * G
                for op in job.link_ops:
                    data.append([res.link_o[s][pos[s]:pos[s] + op.words] if s in op.srcs
                                 else [] for s in range(G)])
                    for s in op.srcs:
                        pos[s] += op.words
                    ops.append(op)
                assert pos == [len(x) for x in res.link_o]      # every link_o word moved
                seen.add((step.kind, layer, g))
    inputs = [[w for d in data for w in d[s]] for s in range(G)]
    want = expected(ops, data, G, W)
    # non-trivial: every step kind, layer and group; every mode; reductions of several
    # sources; several destinations; descriptors of unequal lengths; every PE receives
    assert {k for k, _, _ in seen} == {"ar", "draft", "verify"}
    assert {l for _, l, _ in seen} == set(REAL_LAYERS) and {g for _, _, g in seen} == {0, 1}
    assert {op.mode for op in ops} == set(LinkMode)
    assert max(len(op.srcs) for op in ops if op.mode == LinkMode.REDUCE_ADD) == G
    if G == 4:                              # 3- and 4-source reductions through the 2-level tree
        assert {3, 4} <= {len(op.srcs) for op in ops if op.mode == LinkMode.REDUCE_ADD}
        assert any(len(op.dsts) == G for op in ops if op.mode == LinkMode.ALL_TO_ALL)
    assert any(len(op.dsts) > 1 for op in ops if op.mode == LinkMode.ALL_TO_ALL)
    assert len({op.words for op in ops}) >= 4 and all(want)
    assert any(w for d in want for w in d)
    dut = AggregationLink.from_arch(cfg, buffer_words=DEFAULT_BUFFER_WORDS)
    idle, stall, gap = (0.0, 0.0, 0.0) if traffic == "smooth" else \
        (STALLS.idle, STALLS.backpressure, 0.3)
    seed = REAL_TRAFFIC_SEED
    modes = {m.name: sum(op.mode == m for op in ops) for m in LinkMode}
    print(f"seed {seed}: {len(ops)} descriptors {modes}, lengths "
          f"{sorted({op.words for op in ops})}, words sent per PE {[len(x) for x in inputs]}, "
          f"received {[len(x) for x in want]}")
    got, log = run_link(dut, ops, inputs, seed=seed, idle=idle, stall=stall, op_gap=gap,
                        max_cycles=60000)
    assert got == want
    assert len(log["done"]) == len(ops) and log["pos"] == [len(x) for x in inputs]
    assert log["errors"] == 0


# ---- bad descriptors: rejected or drained, flagged, never a hang ---------------------------

def raw_op(G, mode, src_mask, dst_mask, words, chunk):
    """A descriptor payload from raw field values (LinkOp would refuse the bad ones)."""
    return link_op_layout(G).const({"mode": LinkModeRTL(int(mode)), "src_mask": src_mask,
                                    "dst_mask": dst_mask, "words": words,
                                    "chunk": chunk}).as_bits()


#: Cycles :func:`run_host` waits with the link idle and every ``pe_o`` empty (the cycle a
#: descriptor is taken counts when the link is not busy) before it reads ``errors``.
HOST_QUIET = 3


def run_host(dut, raws, inputs, *, seed=0, idle=0.0, stall=0.0, clear=(), clear_on_take=(),
             budget=3000):
    """A host that sends descriptor payloads ``raws`` one at a time: it offers the next one
    when the link is idle and every ``pe_o`` has been emptied for ``HOST_QUIET`` cycles, then
    reads ``errors``; after descriptor k in ``clear`` it pulses ``errors_clear`` (all bits) for a
    cycle; for k in ``clear_on_take`` it pulses it in the cycle the descriptor is taken. The
    sources offer ``inputs`` (each PE's words for all descriptors) with random idles, the
    sinks stall at random. A descriptor that does not finish within ``budget`` cycles fails
    the test (a hang). Returns ``(received per PE, log)``: per descriptor the ``errors``
    value read, ``bounds`` (received words per PE), ``pos`` (words taken per source),
    ``done`` (pulses) and ``cycles``."""
    G = dut.pes
    rng = random.Random(seed)
    sinks = [StreamSink(dut.pe_o[d], rng, stall, f"PE {d}") for d in range(G)]
    log = {"errors": [], "bounds": [], "pos": [], "done": [], "cycles": []}

    async def bench(ctx):
        pos, valid, cycle = [0] * G, [False] * G, 0

        async def tick(op_valid, raw, clr):
            nonlocal cycle
            ctx.set(dut.op.valid, op_valid)
            ctx.set(dut.op.payload.as_value(), raw)
            for s in range(G):
                if not valid[s] and pos[s] < len(inputs[s]):
                    valid[s] = rng.random() >= idle
                ctx.set(dut.pe_i[s].valid, valid[s])
                ctx.set(dut.pe_i[s].payload, inputs[s][pos[s]] if valid[s] else 0)
            for k in sinks:
                k.drive(ctx)
            taken = op_valid and ctx.get(dut.op.ready)
            ctx.set(dut.errors_clear.as_value(), 0b11 if clr is True or (clr and taken) else 0)
            done = ctx.get(dut.done)
            for s in range(G):
                if valid[s] and ctx.get(dut.pe_i[s].ready):
                    pos[s] += 1
                    valid[s] = False
            for k in sinks:
                k.sample(ctx, cycle)
            busy = ctx.get(dut.busy) or any(ctx.get(dut.pe_o[d].valid) for d in range(G))
            cycle += 1
            await ctx.tick()
            return taken, done, busy

        for k, raw in enumerate(raws):
            start, taken, dones, quiet = cycle, False, 0, 0
            while quiet < HOST_QUIET:
                assert cycle - start < budget, \
                    f"descriptor {k} ({raw:#x}) not finished after {budget} cycles: a hang"
                t, done, busy = await tick(not taken, raw,
                                           "take" if k in clear_on_take else False)
                quiet = 0 if (busy or not (taken or t)) else quiet + 1
                taken, dones = taken or t, dones + done
            log["errors"].append(ctx.get(dut.errors.as_value()))
            log["bounds"].append([len(x.got) for x in sinks])
            log["pos"].append(list(pos))
            log["done"].append(dones)
            log["cycles"].append(cycle - start)
            if k in clear:
                await tick(False, 0, True)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return [k.got for k in sinks], log


BAD_DESC, BAD_LENGTH = 0b01, 0b10          # link_errors_layout bits


def natural_prefix(G, mode, src, dst, words, chunk, data, word_bits):
    """What each destination receives from an ALL_TO_ALL whose ``words`` is rounded up to the
    next multiple of chunk x destinations (the sources' words padded with zeros): a bad-length
    descriptor delivers a prefix of it."""
    nd = bin(dst).count("1")
    up = -(-words // (chunk * nd)) * chunk * nd
    padded = [d + [0] * (up - len(d)) if d else [] for d in data]
    return ref_link(LinkOp(mode, src, dst, up, chunk), padded, word_bits=word_bits)


@pytest.mark.parametrize("geom", ["G2-W512-F32", "G4-W256-F32"])
def test_bad_descriptor_rejected_flag_sticky_and_corrected_descriptor_bit_exact(geom):
    """Each descriptor LinkOp refuses at take (chunk = 0 in ALL_TO_ALL -- which deadlocked
    -- and in REDUCE_MAX, no destination, no source, BYPASS with every source) is taken in one
    cycle and dropped: no source word is taken, nothing is delivered, no ``done``, and
    ``errors.bad_desc`` rises. The flag stays set through the corrected descriptor that
    follows (which moves the words the bad one left, bit-exact against ``ref_link``) until
    the host's clear, and stays 0 after it while descriptors are good."""
    G, W, F, depth = GEOMS[geom]
    allm = (1 << G) - 1
    A2A, RMAX, RADD, BYP = (LinkMode.ALL_TO_ALL, LinkMode.REDUCE_MAX, LinkMode.REDUCE_ADD,
                            LinkMode.BYPASS)
    cases = [  # (bad raw fields, the corrected LinkOp)
        ((A2A, allm, allm, 2 * G, 0), LinkOp(A2A, allm, allm, 2 * G, 1)),
        ((RMAX, allm, 0b1, 3, 0), LinkOp(RMAX, allm, 0b1, 3, 1)),
        ((A2A, allm, 0, 2 * G, 1), LinkOp(A2A, allm, allm, 2 * G, 2)),
        ((RADD, 0, allm, 4, 1), LinkOp(RADD, allm, allm, 4, 1)),
        ((BYP, allm, allm, 3, 1), LinkOp(BYP, 1 << (G - 1), allm, 3, 1)),
    ]
    rng = random.Random(f"bad-desc/{geom}")
    print(f"seed bad-desc/{geom}")
    dut = AggregationLink(pes=G, word_bits=W, flit_bytes=F, buffer_words=depth)
    raws, ops = [], []
    for bad, good in cases:
        assert link_op_fault(*bad, pes=G) == "bad_desc"
        raws += [raw_op(G, *bad), pack_link_op(good, G)]
        ops.append(good)
    last = LinkOp(RADD, allm, allm, 2)          # after the clear: good, flag stays 0
    raws.append(pack_link_op(last, G))
    ops.append(last)
    data, inputs = make_traffic(rng, ops, G, W)
    got, log = run_host(dut, raws, inputs, seed=7, idle=0.3, stall=0.3,
                        clear=[2 * len(cases) - 1])
    n = len(cases)
    for k in range(n):
        before = log["pos"][2 * k - 1] if k else [0] * G
        assert log["pos"][2 * k] == before, "a rejected descriptor took source words"
        assert log["bounds"][2 * k] == (log["bounds"][2 * k - 1] if k else [0] * G)
        assert log["done"][2 * k] == 0 and log["done"][2 * k + 1] == 1
        # taken in the cycle offered (the first quiet cycle), never busy: the host's wait
        assert log["cycles"][2 * k] == dut.reject_cycles + HOST_QUIET - 1
    assert log["errors"][:2 * n] == [BAD_DESC] * (2 * n)    # sticky until the clear
    assert log["errors"][2 * n] == 0
    assert got == expected(ops, data, G, W)
    assert log["pos"][-1] == [len(x) for x in inputs]


@pytest.mark.parametrize("geom,fields", [
    ("G2-W512-F32", (0b11, 0b11, 3, 2)),       # a half chunk: deadlocked
    ("G2-W512-F32", (0b11, 0b11, 1, 1)),       # one chunk of a 2-destination round
    ("G4-W256-F32", (0b1111, 0b1011, 7, 2)),
    ("G4-W256-F32", (0b0110, 0b1111, 5, 1)),
])
def test_bad_all_to_all_length_drains_and_flags(geom, fields):
    """An ALL_TO_ALL whose ``words`` is not a multiple of chunk x destinations (LinkOp refuses
    it; a half-filled last chunk deadlocked the link): every source still gives exactly
    ``words`` words, each destination receives a prefix of what the next multiple would give
    it, ``done`` pulses once, ``errors.bad_length`` rises (``bad_desc`` does not) and stays
    through the good descriptor after it, which is bit-exact; with and without idles and
    backpressure."""
    G, W, F, depth = GEOMS[geom]
    src, dst, words, chunk = fields
    mode = LinkMode.ALL_TO_ALL
    assert link_op_fault(mode, src, dst, words, chunk, pes=G) == "bad_length"
    good = LinkOp(LinkMode.REDUCE_ADD, (1 << G) - 1, dst, 3)
    for seed, (idle, stall) in enumerate([(0.0, 0.0), (0.3, 0.5)]):
        rng = random.Random(f"bad-length/{geom}/{fields}/{seed}")
        print(f"seed bad-length/{geom}/{fields}/{seed}")
        dut = AggregationLink(pes=G, word_bits=W, flit_bytes=F, buffer_words=depth)
        bad_data = [[rng.getrandbits(W) for _ in range(words)] if src >> s & 1 else []
                    for s in range(G)]
        gdata, ginputs = make_traffic(rng, [good], G, W)
        inputs = [bad_data[s] + ginputs[s] for s in range(G)]
        got, log = run_host(dut, [raw_op(G, mode, src, dst, words, chunk),
                                  pack_link_op(good, G)], inputs, seed=seed, idle=idle,
                            stall=stall)
        assert log["pos"][0] == [len(d) for d in bad_data]
        assert log["done"] == [1, 1] and log["errors"] == [BAD_LENGTH] * 2
        natural = natural_prefix(G, mode, src, dst, words, chunk, bad_data, W)
        want_good = expected([good], gdata, G, W)
        for d in range(G):
            cut = log["bounds"][0][d]
            assert got[d][:cut] == natural[d][:cut]
            assert got[d][cut:] == want_good[d]


def test_clear_strobe_meeting_a_new_error_leaves_it_set():
    """A clear strobe in the very cycle a bad descriptor is taken: setting wins (the flag is
    1 afterwards); a later clear alone clears it; ``bad_desc`` and ``bad_length`` are
    separate bits."""
    G, W, F, depth = GEOMS["G2-W512-F32"]
    dut = AggregationLink(pes=G, word_bits=W, flit_bytes=F, buffer_words=depth)
    A2A = LinkMode.ALL_TO_ALL
    raws = [raw_op(G, A2A, 0b11, 0b11, 2, 0),      # bad_desc, cleared in its take cycle
            raw_op(G, A2A, 0b11, 0b11, 3, 2),      # bad_length, while bad_desc is still set
            pack_link_op(LinkOp(A2A, 0b11, 0b11, 2, 1), G)]
    rng = random.Random(11)
    inputs = [[rng.getrandbits(W) for _ in range(5)] for _ in range(G)]
    got, log = run_host(dut, raws, inputs, clear_on_take=[0], clear=[1])
    assert log["errors"] == [BAD_DESC, BAD_DESC | BAD_LENGTH, 0]
    assert log["pos"][-1] == [5, 5]


@pytest.mark.parametrize("geom", ["G3-W512-F64", "G4-W512-F16"])
def test_random_raw_descriptors_never_hang_and_match_the_golden_classification(geom):
    """60 random raw descriptors, good ones and bad ones of both kinds (chunk 0, empty masks,
    several BYPASS sources, ALL_TO_ALL lengths off the multiple), with idles and
    backpressure; the host reads and clears ``errors`` after each. Every descriptor finishes
    within the cycle budget; the flag read equals :func:`link_op_fault`'s classification;
    good descriptors are bit-exact against ``ref_link``, rejected ones move nothing and
    drained ones deliver a prefix of the next multiple and take exactly ``words`` words of
    every source."""
    G, W, F, depth = GEOMS[geom]
    rng = random.Random(f"raw/{geom}")
    print(f"seed raw/{geom}")
    dut = AggregationLink(pes=G, word_bits=W, flit_bytes=F, buffer_words=depth)
    fields = []
    for _ in range(60):
        mode = LinkMode.ALL_TO_ALL if rng.random() < 0.4 else rng.randrange(4)
        src = 0 if rng.random() < 0.08 else rng.randrange(1, 1 << G)
        if mode == LinkMode.BYPASS and rng.random() < 0.7:
            src = 1 << rng.randrange(G)
        dst = 0 if rng.random() < 0.08 else rng.randrange(1, 1 << G)
        chunk = 0 if rng.random() < 0.1 else rng.randrange(1, 4)
        words = rng.randrange(0, 9)
        if mode == LinkMode.ALL_TO_ALL and chunk and dst and rng.random() < 0.3:
            words = chunk * bin(dst).count("1") * rng.randrange(0, 3)
        fields.append((mode, src, dst, words, chunk))
    faults = [link_op_fault(*f, pes=G) for f in fields]
    print({x: faults.count(x) for x in (None, "bad_desc", "bad_length")})
    assert all(faults.count(x) >= 5 for x in (None, "bad_desc", "bad_length"))
    data, inputs = [], [[] for _ in range(G)]
    for f, fault in zip(fields, faults):
        mode, src, dst, words, chunk = f
        takers = [] if fault == "bad_desc" else (
            LinkOp(*f).srcs if fault is None else [s for s in range(G) if src >> s & 1])
        d = [[rng.getrandbits(W) for _ in range(words)] if s in takers else [] for s in range(G)]
        data.append(d)
        for s in range(G):
            inputs[s] += d[s]
    got, log = run_host(dut, [raw_op(G, *f) for f in fields], inputs, seed=3, idle=0.25,
                        stall=0.35, clear=range(len(fields)))
    flag = {None: 0, "bad_desc": BAD_DESC, "bad_length": BAD_LENGTH}
    assert log["errors"] == [flag[x] for x in faults]
    prev = [0] * G
    for k, (f, fault) in enumerate(zip(fields, faults)):
        bounds = log["bounds"][k]
        part = [got[d][prev[d]:bounds[d]] for d in range(G)]
        if fault is None:
            assert part == ref_link(LinkOp(*f), data[k], word_bits=W), k
        elif fault == "bad_desc":
            assert part == [[]] * G and log["done"][k] == 0, k
        else:
            natural = natural_prefix(G, *f, data[k], W)
            assert all(part[d] == natural[d][:len(part[d])] for d in range(G)), k
        prev = bounds
    assert log["pos"][-1] == [len(x) for x in inputs]


def test_link_op_fault_is_exactly_what_link_op_refuses():
    """``link_op_fault`` is None exactly for the field values LinkOp accepts, over every mode,
    mask pair of a 3-PE group, words 0..7 and chunk 0..3; out-of-layout values are errors."""
    G = 3
    for mode in range(4):
        for src in range(1 << G):
            for dst in range(1 << G):
                for words in range(8):
                    for chunk in range(4):
                        fault = link_op_fault(mode, src, dst, words, chunk, pes=G)
                        try:
                            LinkOp(mode, src, dst, words, chunk)
                            ok = True
                        except ValueError:
                            ok = False
                        assert (fault is None) == ok, (mode, src, dst, words, chunk)
    for kw, name in ((dict(mode=4), "mode"), (dict(src_mask=8), "src_mask"),
                     (dict(words=1 << 16), "words"), (dict(chunk=-1), "chunk")):
        args = dict(mode=0, src_mask=1, dst_mask=1, words=1, chunk=1) | kw
        with pytest.raises(ValueError, match=name):
            link_op_fault(**args, pes=G)

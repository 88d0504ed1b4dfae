"""The EXT admission scheduler (:class:`elmoe3d.hw.ext_sched.ExtScheduler`) in the Amaranth
simulator, cycle for cycle against its golden model
(:class:`elmoe3d.sw.golden.ext_sched.ExtSchedModel`, the rule :func:`ext_pick`): every cycle
``desc.ready`` and the offered chunk equal the model's (plain equality). Per PE a consumer pops
the words it holds at its own rate (one PE stopped for a while: credit exhaustion), the sink
stalls at random; at the end every PE has received exactly its descriptors' word addresses in
host order, and never more words than its credits."""

import random

import pytest
from amaranth.sim import Simulator

from elmoe3d.hw.ext_sched import ExtScheduler
from elmoe3d.hw.ext_stream import ext_read_layout
from elmoe3d.sw.golden.ext_sched import ExtSchedModel, ext_chunk_order, ext_pick, round_robin

from .test_die_ext_stream import offer_desc


def _simulate(dut, bench):
    """Run the testbench ``bench`` on ``dut`` with a 1 GHz clock until it returns."""
    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()


def _run(descs, *, pes, window, credits, chunk_words, rates, stall, seed, stop=None):
    rng = random.Random(seed)
    dut = ExtScheduler(pes=pes, window=window, credits=credits, chunk_words=chunk_words)
    model = ExtSchedModel(pes=pes, window=window, credits_max=credits, chunk_words=chunk_words)
    layout = ext_read_layout(pes)
    want = [[a + k for a, n, mask in descs if mask >> p & 1 for k in range(n)]
            for p in range(pes)]
    got = [[] for _ in range(pes)]
    held = [0] * pes
    stats = {"cycles": 0, "chunks": 0, "exhausted": 0, "done_at": [None] * pes}

    async def bench(ctx):
        di, cycle, pend = 0, 0, None
        while True:
            if pend is None and di < len(descs) and rng.random() >= stall:
                pend = descs[di]                 # held until taken (stream rule)
            offer_desc(ctx, dut.desc, layout, pend)
            ready = rng.random() >= stall
            ctx.set(dut.chunk.ready, ready)
            cmask = 0
            for p in range(pes):
                halted = stop is not None and p == stop[0] and stop[1] <= cycle < stop[2]
                if held[p] and not halted and rng.random() < rates[p]:
                    cmask |= 1 << p
                    held[p] -= 1
            ctx.set(dut.credit, cmask)
            # outputs of this cycle: RTL == model
            assert bool(ctx.get(dut.desc.ready)) == model.desc_ready, f"cycle {cycle}: desc.ready"
            v = bool(ctx.get(dut.chunk.valid))
            if v:
                c = ctx.get(dut.chunk.payload)
                rtl = (int(c.addr), int(c.words), int(c.dst_mask))
            else:
                rtl = None
            assert rtl == model.out, f"cycle {cycle}: chunk {rtl}, model {model.out}"
            assert not ctx.get(dut.errors.bad_credit), f"cycle {cycle}: false bad_credit"
            if any(model.credits[p] < chunk_words for p in range(pes)):
                stats["exhausted"] += 1
            if v and ready:
                a, n, mask = rtl
                stats["chunks"] += 1
                for p in range(pes):
                    if mask >> p & 1:
                        got[p] += range(a, a + n)
                        held[p] += n
                        assert held[p] <= credits, f"cycle {cycle}: PE {p} holds {held[p]}"
                        if len(got[p]) == len(want[p]):
                            stats["done_at"][p] = cycle
            take = pend is not None and model.desc_ready
            model.step(pend, ready, cmask)
            if take:
                di, pend = di + 1, None
            await ctx.tick()
            cycle += 1
            if di == len(descs) and all(len(g) == len(w) for g, w in zip(got, want)) \
                    and model.out is None:
                break
            assert cycle < 20000, f"timeout: {[len(g) for g in got]} of {[len(w) for w in want]}"
        stats["cycles"] = cycle

    _simulate(dut, bench)
    assert got == want
    print(stats)
    return stats


@pytest.mark.parametrize("pes,window,credits,chunk_words", [
    (4, 8, 32, 8), (4, 4, 8, 8), (2, 1, 4, 1), (3, 2, 5, 3), (8, 8, 16, 4)])
@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_random_against_model(pes, window, credits, chunk_words, stall):
    seed = pes * 1000 + window * 100 + credits + chunk_words + int(10 * stall)
    print(f"seed {seed}")
    rng = random.Random(seed)
    descs, a = [], 0
    for _ in range(40):
        n = rng.choice([0, 1, 1, 2, chunk_words, chunk_words + 1, rng.randint(1, 3 * credits)])
        mask = rng.choice([1 << rng.randrange(pes), rng.randint(1, (1 << pes) - 1)])
        descs.append((a, n, mask))
        a += n + rng.randint(0, 3)
    rates = [rng.choice([0.1, 0.5, 1.0]) for _ in range(pes)]
    st = _run(descs, pes=pes, window=window, credits=credits, chunk_words=chunk_words,
              rates=rates, stall=stall, seed=seed, stop=(0, 50, 250))
    assert st["exhausted"] > 0


def test_corners():
    """One-word transfers back to back, multicast to every PE, a PE stopped until its credits
    are exhausted (from cycle 25, after the multicast) while the others' descriptors pass
    it (no head-of-line blocking)."""
    pes, credits, cw = 4, 8, 4
    descs = [(100 + i, 1, 1 << (i % pes)) for i in range(12)]        # one-word, back to back
    descs += [(200, 9, 0b1111), (300, 64, 0b0001)]                   # multicast; PE 0's long
    descs += [(400 + 8 * i, 8, 1 << (1 + i % 3)) for i in range(9)]  # others behind it
    st = _run(descs, pes=pes, window=4, credits=credits, chunk_words=cw,
              rates=[1.0] * pes, stall=0.0, seed=1, stop=(0, 25, 400))
    # PE 0 is stopped for 400 cycles but the others get all their words well within them
    assert st["cycles"] > 400 and st["exhausted"] > 0
    assert max(st["done_at"][1:]) < 200 and st["done_at"][0] > 400, st["done_at"]


def test_pick_rule():
    """:func:`ext_pick` on hand cases: an older entry sharing a PE blocks, credits gate."""
    assert ext_pick([(0, 5, 0b01), (9, 3, 0b10)], [8, 8], 4) == (0, 4)
    assert ext_pick([(0, 5, 0b01), (9, 3, 0b10)], [3, 8], 4) == (1, 3)
    assert ext_pick([(0, 5, 0b01), (9, 3, 0b11)], [3, 8], 4) is None   # blocked by the older
    assert ext_pick([(0, 2, 0b11)], [2, 1], 4) is None                 # one PE short
    assert ext_pick([], [1], 4) is None


def test_chunk_order_with_full_credits():
    """:func:`ext_chunk_order` on a hand case: each group's descriptors oldest first, chunk
    after chunk (a chunk's address advancing), the groups in turn, masks moved to the die's
    PEs; a descriptor of no words is refused by group."""
    queues = [(0, [(100, list(range(6)), 0b01), (200, [7], 0b11)]),
              (1, [(300, [8, 9, 10], 0b10)])]
    assert ext_chunk_order(queues, 2, 4) == [
        (0, 100, [0, 1, 2, 3], 0b0001), (1, 300, [8, 9, 10], 0b1000),
        (0, 104, [4, 5], 0b0001), (0, 200, [7], 0b0011)]
    with pytest.raises(ValueError, match="group 1: a descriptor of no words"):
        ext_chunk_order([(1, [(0, [], 0b1)])], 2, 4)
    for mask in (0, 0b100):
        with pytest.raises(ValueError, match=f"group 0: dst_mask {mask:#x} is empty or leaves "
                                             f"the group of 2 PEs"):
            ext_chunk_order([(0, [(0, [1], mask)])], 2, 4)
    assert round_robin([[1, 2, 3], [], [4], [5, 6]]) == [1, 4, 5, 2, 6, 3]
    assert round_robin([]) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chunk_order_is_the_scheduler_models_with_full_credits(seed):
    """Each group's chunks of :func:`ext_chunk_order` are what :class:`ExtSchedModel` (the
    RTL scheduler's cycle model, checked against it above) issues from the same descriptors
    when no PE's credits run short and the sink always takes: random groups of random
    descriptors (lengths around the chunk, single and multicast masks), window 4."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    G, chunk = 4, 8
    queues = []
    for g in range(3):
        descs, a = [], 0
        for _ in range(rng.randint(1, 12)):
            n = rng.choice([1, chunk - 1, chunk, chunk + 1, rng.randint(1, 5 * chunk)])
            descs.append((a, [rng.randrange(1 << 16) for _ in range(n)],
                          rng.randint(1, (1 << G) - 1)))
            a += n + rng.randint(0, 3)
        queues.append((g, descs))
    order = ext_chunk_order(queues, G, chunk)
    for g, descs in queues:
        total = sum(len(w) for _, w, _ in descs)
        model = ExtSchedModel(pes=G, window=4, credits_max=total + 1, chunk_words=chunk)
        pending, issued = list(descs), []
        while pending or model.entries or model.out is not None:
            if model.out is not None:
                issued.append(model.out)
            offer = (pending[0][0], len(pending[0][1]), pending[0][2]) if pending else None
            if offer is not None and model.desc_ready:
                pending.pop(0)
            model.step(offer, out_ready=True)
        mine = [(a, len(w), m >> g * G) for gg, a, w, m in order if gg == g]
        assert mine == issued and len(issued) >= len(descs)
        for a0, words, _ in descs:              # each descriptor's chunks carry its words
            got = [x for gg, a, w, _ in order if gg == g and a0 <= a < a0 + len(words)
                   for x in w]
            assert got == words
    groups = [g for g, *_ in order]
    assert groups[:3] == [0, 1, 2]                           # the groups take turns


@pytest.mark.parametrize("kw,msg", [({"window": 0}, "window"), ({"credits": 2}, "credits"),
                                    ({"chunk_words": 0}, "chunk_words"), ({"pes": 0}, "pes")])
def test_parameter_errors(kw, msg):
    args = {"pes": 2, "window": 2, "credits": 4, "chunk_words": 4, **kw}
    with pytest.raises(ValueError, match=msg):
        ExtScheduler(**args)


def test_bad_credit_is_flagged_not_wrapped():
    """A credit returned for a PE whose counter is full (no outstanding credit; the golden
    model raises) sets the sticky ``errors.bad_credit`` :attr:`errors_latency` cycles later
    and is refused: with 4 credits and 1-word chunks, a descriptor of 8 words then issues 4
    chunks, not 5 (a wrapped counter). A credit in the cycle a chunk takes words is not an
    error; the clear clears the flag."""
    dut = ExtScheduler(pes=2, window=2, credits=4, chunk_words=1)
    model = ExtSchedModel(pes=2, window=2, credits_max=4, chunk_words=1)
    with pytest.raises(AssertionError, match="never taken"):
        model.step(credit_mask=0b01)
    log = {"errors": [], "chunks": 0}

    async def bench(ctx):
        ctx.set(dut.credit, 0b01)                    # PE 0 full: refused
        await ctx.tick()
        ctx.set(dut.credit, 0)
        log["errors"].append(ctx.get(dut.errors.bad_credit))
        ctx.set(dut.errors_clear.bad_credit, 1)
        await ctx.tick()
        ctx.set(dut.errors_clear.bad_credit, 0)
        await ctx.tick()
        log["errors"].append(ctx.get(dut.errors.bad_credit))
        ctx.set(dut.chunk.ready, 1)
        ctx.set(dut.desc.valid, 1)
        ctx.set(dut.desc.payload, {"addr": 0, "words": 8, "dst_mask": 0b01})
        await ctx.tick()
        ctx.set(dut.desc.valid, 0)
        for _ in range(20):
            if ctx.get(dut.chunk.valid):
                log["chunks"] += 1
            log["errors"].append(ctx.get(dut.errors.bad_credit))
            await ctx.tick()

    _simulate(dut, bench)
    assert log["errors"][0] == 1, "bad credit not flagged"
    assert set(log["errors"][1:]) == {0}, "not cleared, or a later false flag"
    assert log["chunks"] == 4, f"{log['chunks']} chunks: the refused credit was counted"


@pytest.mark.parametrize("outstanding", [False, True])
def test_credit_in_an_admission_cycle(outstanding):
    """A credit in the very cycle the scheduler admits a chunk for its PE (4 credits, 2-word
    chunks, one 6-word descriptor for PE 0; the admissions in cycles 1 and 2). Before the
    first admission (a full counter: no word out) it is bogus, since the chunk's words cannot
    have been popped yet: flagged and refused, as the golden model raises, and two chunks
    come. At the second admission (2 words out) it is real: counted, so with one more credit
    later the third chunk comes, and nothing is flagged."""
    dut = ExtScheduler(pes=1, window=2, credits=4, chunk_words=2)
    credit_at = {2, 5} if outstanding else {1, 5}
    log = {"errors": [], "chunks": 0}

    async def bench(ctx):
        ctx.set(dut.chunk.ready, 1)
        offer_desc(ctx, dut.desc, ext_read_layout(1), (0, 6, 1))
        await ctx.tick()                                # cycle 0: the descriptor taken
        offer_desc(ctx, dut.desc, ext_read_layout(1), None)
        for cycle in range(1, 30):
            ctx.set(dut.credit, int(cycle in credit_at))
            log["chunks"] += ctx.get(dut.chunk.valid)
            log["errors"].append(ctx.get(dut.errors.bad_credit))
            await ctx.tick()

    _simulate(dut, bench)
    if outstanding:
        assert set(log["errors"]) == {0}, "a real credit flagged"
        assert log["chunks"] == 3, f"{log['chunks']} chunks: the real credit was refused"
    else:
        assert 1 in log["errors"], "a bogus credit in an admission cycle not flagged"
        assert log["chunks"] == 2, f"{log['chunks']} chunks: the bogus credit was counted"
        model = ExtSchedModel(pes=1, window=2, credits_max=4, chunk_words=2)
        model.step((0, 6, 1), True, 0)               # cycle 0: the descriptor enters
        with pytest.raises(AssertionError, match="never taken"):
            model.step(None, True, 0b1)               # cycle 1: admitted, and the credit


def test_group_merge_rotates_and_shifts():
    """:class:`ExtGroupMerge`: a queue's beat reaches its group's scheduler with the group's
    bits of ``dst_mask``; the groups' chunks reach ``out`` with the mask shifted back to the
    die's PEs, and groups that always have a chunk are served in rotation (from the group after
    the last served; a group without one is skipped; a stalled ``out`` keeps the turn, takes
    nothing, and keeps the chunk it offers, unchanged, even when an earlier group gets one)."""
    from elmoe3d.hw.ext_sched import ExtGroupMerge

    NG, G = 3, 2
    dut = ExtGroupMerge(groups=NG, pes_per_group=G)
    got, descs, held = [], [], []

    async def bench(ctx):
        for g in range(NG):
            ctx.set(dut.queue[g].valid, 1)
            other = 0b01 << G * ((g + 1) % NG)          # another group's PE: not passed
            ctx.set(dut.queue[g].payload, {"addr": 10 + g, "words": 3,
                                           "dst_mask": 0b11 << (g * G) | other})
            ctx.set(dut.desc[g].ready, g != 1)
            ctx.set(dut.chunk[g].payload, {"addr": 100 * g, "words": 1 + g,
                                           "dst_mask": 0b10})
        for g in range(NG):
            descs.append((ctx.get(dut.desc[g].valid), ctx.get(dut.desc[g].payload.addr),
                          ctx.get(dut.desc[g].payload.dst_mask), ctx.get(dut.queue[g].ready)))
        for cycle in range(14):
            valid = [1, 1, 1] if cycle < 6 else [1, 0, 1] if cycle < 10 else [0, 1, 0]
            for g in range(NG):
                ctx.set(dut.chunk[g].valid, valid[g])
            ctx.set(dut.out.ready, cycle != 3)
            if ctx.get(dut.out.valid) and ctx.get(dut.out.ready):
                readies = [ctx.get(dut.chunk[g].ready) for g in range(NG)]
                got.append((ctx.get(dut.out.payload.addr) // 100,
                            ctx.get(dut.out.payload.words), ctx.get(dut.out.payload.dst_mask),
                            readies))
            elif cycle == 3:
                got.append("stall")
                # nothing taken from any scheduler while out stalls
                assert [ctx.get(dut.chunk[g].ready) for g in range(NG)] == [0] * NG
            await ctx.tick()
        # a chunk offered and not taken stays on offer: group 1's chunk offered during a
        # stall, then group 0 (earlier in the rotation from rr) gets one: still group 1's
        ctx.set(dut.out.ready, 0)
        for g in range(NG):
            ctx.set(dut.chunk[g].valid, int(g == 1))
        offered = [(ctx.get(dut.out.valid), ctx.get(dut.out.payload.addr))]
        await ctx.tick()
        ctx.set(dut.chunk[0].valid, 1)
        offered.append((ctx.get(dut.out.valid), ctx.get(dut.out.payload.addr)))
        ctx.set(dut.out.ready, 1)
        offered.append((ctx.get(dut.out.valid), ctx.get(dut.out.payload.addr),
                        [ctx.get(dut.chunk[g].ready) for g in range(NG)]))
        await ctx.tick()
        held.extend(offered)

    _simulate(dut, bench)
    assert descs == [(1, 10, 0b11, 1), (1, 11, 0b11, 0), (1, 12, 0b11, 1)]
    assert held == [(1, 100), (1, 100), (1, 100, [0, 1, 0])], held
    served = [x if x == "stall" else x[0] for x in got]
    assert served == [0, 1, 2, "stall", 0, 1, 2, 0, 2, 0, 1, 1, 1, 1], served
    for x in got:
        if x != "stall":
            g, words, mask, readies = x
            assert words == 1 + g and mask == 0b10 << (g * G)
            assert readies == [int(h == g) for h in range(NG)], "only the served group's ready"


@pytest.mark.parametrize("groups,pes_per_group", [(1, 1), (1, 8), (2, 4), (3, 2), (4, 1),
                                                  (4, 8)])
def test_group_merge_random(groups, pes_per_group):
    """:class:`ExtGroupMerge` on random traffic against its documented rule, 1-4 groups of 1-8
    PEs: each queue's beat reaches its group's scheduler with the group's mask bits (``ready``
    passed back); the schedulers' chunks (each held on offer until taken, the stream rule)
    reach ``out`` with the mask shifted back, from the group after the last served the first
    with a chunk, a chunk offered and not taken staying on offer until taken; a scheduler's
    chunk is taken exactly when ``out`` takes it."""
    NG, G = groups, pes_per_group
    seed = 1000 * NG + G
    rng = random.Random(seed)
    from elmoe3d.hw.ext_sched import ExtGroupMerge
    dut = ExtGroupMerge(groups=NG, pes_per_group=G)
    served, errors = [], []

    async def bench(ctx):
        chunks = [None] * NG            # each scheduler's chunk on offer (addr, words, mask)
        rr, held = 0, None              # the rule's state
        for cycle in range(400):
            for g in range(NG):
                if chunks[g] is None and rng.random() < 0.4:
                    chunks[g] = (rng.randrange(1 << 12), rng.randrange(1, 8),
                                 rng.randrange(1, 1 << G))
                ctx.set(dut.chunk[g].valid, chunks[g] is not None)
                if chunks[g] is not None:
                    ctx.set(dut.chunk[g].payload, dict(zip(("addr", "words", "dst_mask"),
                                                           chunks[g])))
                q = (rng.randrange(1 << 12), rng.randrange(1, 8), rng.randrange(1 << NG * G))
                ctx.set(dut.queue[g].valid, rng.random() < 0.5)
                ctx.set(dut.queue[g].payload, dict(zip(("addr", "words", "dst_mask"), q)))
                ctx.set(dut.desc[g].ready, rng.random() < 0.5)
            ready = rng.random() < 0.7
            ctx.set(dut.out.ready, ready)
            # the rule
            pick = held
            if pick is None:
                pick = next(((rr + k) % NG for k in range(NG) if chunks[(rr + k) % NG]), None)
            want = None if pick is None else (chunks[pick][0], chunks[pick][1],
                                              chunks[pick][2] << pick * G)
            got = (ctx.get(dut.out.payload.addr), ctx.get(dut.out.payload.words),
                   ctx.get(dut.out.payload.dst_mask)) if ctx.get(dut.out.valid) else None
            if got != want:
                errors.append((cycle, "out", got, want))
            for g in range(NG):
                took = ctx.get(dut.chunk[g].valid) and ctx.get(dut.chunk[g].ready)
                if took != (want is not None and ready and g == pick):
                    errors.append((cycle, "chunk ready", g))
                d, q = dut.desc[g], dut.queue[g]
                if (ctx.get(d.valid), ctx.get(d.payload.addr), ctx.get(d.payload.words),
                        ctx.get(d.payload.dst_mask), ctx.get(q.ready)) != (
                        ctx.get(q.valid), ctx.get(q.payload.addr), ctx.get(q.payload.words),
                        ctx.get(q.payload.dst_mask) >> g * G & ((1 << G) - 1),
                        ctx.get(d.ready)):
                    errors.append((cycle, "desc", g))
            if want is not None and ready:
                served.append(pick)
                chunks[pick], rr, held = None, (pick + 1) % NG, None
            else:
                held = pick if want is not None else None
            await ctx.tick()

    _simulate(dut, bench)
    assert not errors, (f"seed {seed}", errors[:5])
    assert len(served) > 100 and set(served) == set(range(NG)), (f"seed {seed}", served[:20])

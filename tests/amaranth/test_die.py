"""The logic die (:class:`elmoe3d.hw.die.LogicDie`): host payload layouts, queue numbering,
parameter checks and elaboration at the bench's size and at the paper's 16 and 32 PEs (the
cocotb bench ``tests/cocotb/test_die.py`` simulates the small die)."""

import pytest
from amaranth.hdl import Fragment

from elmoe3d import isa
from elmoe3d.config import preset
from elmoe3d.hw.agg_link import LinkModeRTL, link_op_layout, pack_link_op
from elmoe3d.hw.checked import inspection
from elmoe3d.hw.die import (DmaKind, HostQueue, LogicDie, die_errors_layout, die_o_layout,
                            die_probe_layout, dma_bit, host_cmd_layout, host_dma_layout,
                            queue_bit)
from elmoe3d.hw.ext_stream import ext_read_layout
from elmoe3d.hw.isa import OKind, command_layout
from elmoe3d.sw.golden.agg_link import LinkMode, LinkOp

SMALL = preset("small")


def test_host_layouts_round_trip():
    arch = SMALL
    cmd = isa.encode(isa.Op.LOAD, target=isa.Target.WMSB, words=7, src=isa.Source.HB,
                     hb_addr=123456)
    L = host_cmd_layout(arch)
    v = L.from_bits(L.const({"queue": HostQueue.PE, "index": 3,
                             "body": {"cmd": command_layout().from_bits(cmd)}}).as_bits())
    assert (v.queue, int(v.index), v.body.cmd.as_value().value) == (HostQueue.PE, 3, cmd)
    op = pack_link_op(LinkOp(LinkMode.REDUCE_ADD, 0b11, 0b01, 5), arch.pes_per_group)
    v = L.from_bits(L.const({"queue": HostQueue.LINK, "index": 1,
                             "body": {"link": link_op_layout(2).from_bits(op)}}).as_bits())
    assert v.body.link.as_value().value == op and int(v.body.link.words) == 5
    e = ext_read_layout(arch.pes).const({"addr": 99, "words": 12, "dst_mask": 0b1010})
    v = L.from_bits(L.const({"queue": HostQueue.EXT, "body": {"ext": e}}).as_bits())
    assert (int(v.body.ext.addr), int(v.body.ext.words), int(v.body.ext.dst_mask)) == \
        (99, 12, 0b1010)
    D = host_dma_layout(arch)
    v = D.from_bits(D.const({"kind": DmaKind.HB_WRITE, "pe": 2, "addr": 5,
                             "data": (1 << 511) | 3}).as_bits())
    assert (v.kind, int(v.pe), int(v.addr), int(v.data)) == (DmaKind.HB_WRITE, 2, 5,
                                                             (1 << 511) | 3)
    O = die_o_layout(arch)
    v = O.from_bits(O.const({"pe": 1, "beat": {"kind": OKind.STATUS, "data": 77}}).as_bits())
    assert (int(v.pe), v.beat.kind, int(v.beat.data)) == (1, OKind.STATUS, 77)


def test_queue_numbering():
    arch = preset("paper-4gb")
    assert [queue_bit(arch, HostQueue.PE, p) for p in (0, 15)] == [0, 15]
    assert [queue_bit(arch, HostQueue.LINK, g) for g in (0, 3)] == [16, 19]
    assert [queue_bit(arch, HostQueue.EXT, g) for g in (0, 3)] == [20, 23]
    assert (dma_bit(arch, DmaKind.LD, 7), dma_bit(arch, DmaKind.HB_WRITE, 7)) == (7, 23)


def test_parameters_named():
    with pytest.raises(TypeError, match="config"):
        LogicDie(config=SMALL.pe)
    with pytest.raises(ValueError, match="cmd_queue_depth"):
        LogicDie(config=SMALL, cmd_queue_depth=0)
    with pytest.raises(ValueError, match="hb_burst_words"):
        LogicDie(config=SMALL, router={"hb_fifo_words": 4, "hb_burst_words": 8})
    with pytest.raises(ValueError, match="router"):
        LogicDie(config=SMALL, router=[1])
    with pytest.raises(ValueError, match="^ext_window: "):
        LogicDie(config=SMALL, ext_window=0)
    with pytest.raises(ValueError, match="^ext_chunk_words: "):
        LogicDie(config=SMALL, ext_chunk_words=0)
    with pytest.raises(ValueError, match="^router: ext_fifo_words 2 is less than "
                                         "ext_chunk_words"):
        LogicDie(config=SMALL, router={"ext_fifo_words": 2})
    with pytest.raises(ValueError, match="^router: ext_fifo_words: expected a positive integer"):
        LogicDie(config=SMALL, router={"ext_fifo_words": 0})
    with pytest.raises(ValueError, match="^router: .*unexpected keyword.*'hb_fifo'"):
        LogicDie(config=SMALL, router={"hb_fifo": 8})
    with pytest.raises(ValueError, match="ext_channels: expected a positive integer"):
        die_errors_layout(SMALL, 0)
    with pytest.raises(TypeError, match="arch"):
        die_errors_layout(SMALL.pe)
    assert die_errors_layout(SMALL)["ext_refresh"].width == SMALL.ext_channels


def test_ext_fifo_words_default_and_given():
    """The default EXT FIFO (the schedulers' credits): 64 cycles of a PE's EXT share, at least
    a chunk (26 words at 2 channels, 64 at 8, 13 on the paper dies; not rounded to whole
    chunks, which made the die bench slower); a ``router`` setting is kept as given."""
    assert LogicDie._router(SMALL, None, 2, 64, 4)["ext_fifo_words"] == 26
    assert LogicDie._router(SMALL, None, 8, 64, 4)["ext_fifo_words"] == 64
    assert LogicDie._router(SMALL, None, 2, 1, 4)["ext_fifo_words"] == 4
    for name in ("paper-4gb", "paper-8gb"):
        assert LogicDie._router(preset(name), None, None, 64, 4)["ext_fifo_words"] == 13
    with inspection():
        assert LogicDie(config=SMALL, ext_channels=2,
                        router={"ext_fifo_words": 6}).ext_fifo_words == 6


def test_small_die_elaborates():
    die = LogicDie(config=SMALL, ext_channels=2)
    assert (die.ext_channels, die.link_buffer_words, die.o_latency) == (2, 64, 1)
    assert (die.queue_latency, die.errors_latency, die.link_error_latency) == (1, 1, 2)
    assert die.ext_stripe_bytes == 2 * SMALL.ext.burst_bytes
    assert die.ext_lanes == die.ext_port.lanes == die.streamer.lanes == 1   # a 64 B stripe
    Fragment.get(die, None)
    names = set(die.signature.members)
    assert {"host_cmd", "cmd_room", "host_dma", "dma_room", "o", "errors", "errors_clear",
            "probe", "hb", "ext"} <= names
    assert len(die.probe.as_value()) == die_probe_layout(SMALL).size == 8 * SMALL.pes + \
        3 * SMALL.groups + 3


@pytest.mark.parametrize("name", ["paper-4gb", "paper-8gb"])
def test_paper_dies_elaborate(name):
    """The paper's 16- and 32-PE dies: every block is built (its parameters checked), the
    die's own logic (host queues, DMA routing, output merge, the wiring) elaborates, and so do
    the die's own blocks at the paper's widths (W = 4096: 4 HB bursts per word, 2 EXT stripes
    per word, 4 ring flits per word). The PE, controllers, links and ring are elaborated by
    their own tests and by synthesis."""
    arch = preset(name)
    with inspection():                          # the blocks left unelaborated: no warning
        die = LogicDie(config=arch)
        assert die.ext_channels == 8 and die.ext_stripe_bytes == 256
        assert len(die.signature.members["hb"].dimensions) == 1
        assert die.signature.members["hb"].dimensions[0] == arch.pes
        m = die.elaborate(None)                 # the die's logic, sub-blocks not lowered
        assert die._hb_ports[0].bursts_per_word == 4
        assert die._ext_port.bursts_per_word == 2
        assert die._streamer.flits_per_word == 4
        assert die.ext_lanes == 1                    # a word spans flits
        for block in (die.router, die._hb_ports[0], die._ext_port, die._streamer):
            Fragment.get(block, None)
        # the rest (PEs, controllers, links, ring, queues) are elaborated by their own tests
        # and by synthesis (a paper PE alone takes 20 s of CPU to elaborate)
        # every block under its name (Amaranth's public m.submodules[name] look-up)
        names = [f"{kind}{p}" for p in range(arch.pes)
                 for kind in ("pe", "router", "hb_ctrl", "hb_port")]
        names += [f"link{g}" for g in range(arch.groups)]
        names += ["ring", "ext_ctrl", "ext_port", "ext_stream"]
        subs = [m.submodules[name] for name in names]
        assert len({id(s) for s in subs}) == len(names) == 4 * arch.pes + arch.groups + 4
        del die, m, subs, block                 # the rest: inspected only, dropped here


def test_ext_lanes():
    """The LPDDR5 word port and the streamer move ``ext_lanes`` words a cycle: by default a
    flit (2 words) on the small die at 8 channels (4-word stripes), 1 at 2 channels; set, the
    value is used (1: the one-word path) or refused by name."""
    with inspection():
        assert LogicDie.ext_lanes_of(SMALL, 8) == 2 and LogicDie.ext_lanes_of(SMALL, 2) == 1
        die = LogicDie(config=SMALL, ext_channels=8)
        assert (die.ext_lanes, die.ext_port.lanes, die.streamer.lanes) == (2, 2, 2)
        assert LogicDie(config=SMALL, ext_channels=8, ext_lanes=1).ext_lanes == 1
        with pytest.raises(ValueError, match="ext_lanes"):
            LogicDie(config=SMALL, ext_lanes=0)
        with pytest.raises(ValueError, match="lanes"):
            LogicDie(config=SMALL, ext_channels=2, ext_lanes=2)
        del die


#: Cycles the die test watches a set flag (it must stay set) before the host clears it.
WATCH = 16


def test_errors_output_reflects_the_blocks_sticky_flags():
    """The small die in the Amaranth simulator (its LPDDR5 channels on timing-checked device
    models, tREFI shortened so the refresh debt grows within a thousand cycles), every flag
    watched for ``WATCH`` cycles, then cleared through ``errors_clear``; every other bit of
    ``errors`` stays 0 throughout:

    * a link descriptor with ``chunk`` = 0 for group 1 sets ``link_bad_desc`` bit 1 exactly
      :attr:`LogicDie.link_error_latency` cycles after the host's beat is taken;
    * PEs 0 and 1 SEND 3 words each and group 0 gets an ALL_TO_ALL over both of them with
      ``words`` = 3, ``chunk`` = 1 (not a multiple of chunk x 2 destinations): the link drains
      it and sets ``link_bad_length`` bit 0 (``link_bad_desc`` bit 0 stays 0);
    * ``hb_refresh`` cannot be reached through the host interface: an HB controller is only
      held by a client that withholds ``wdata`` or does not take ``rdata``, and on the die
      its clients never do (a PE's load router requests only what its FIFO can hold, and the
      word port issues a write request with its burst data already in hand), so valid or
      not, host traffic never pushes its refresh to the limit. The wiring is checked by
      setting PE 2's HB controller's own flag register from the bench (a poke, not an
      overflow): only ``hb_refresh`` bit 2 rises, and bit 2 of ``errors_clear`` clears that
      controller's flag;
    * likewise the bit-to-channel order of ``ext_refresh``: both channels get the same
      requests and are held by the same joined read data, so real traffic overflows them
      together; LPDDR5 channel 1's flag register is poked and only bit 1 rises (and clears);
    * last, the host traffic that overflowed the LPDDR5 refresh before the die had its EXT
      scheduler (:class:`elmoe3d.hw.ext_sched.ExtScheduler`): an EXT read descriptor of 600
      words for a PE that never loads them. The scheduler admits only that PE's credits
      (the router's ``ext_fifo_words``, in whole chunks), so the ring and the LPDDR5 read
      buffers never fill: exactly those words reach the PE, the controllers keep refreshing and
      ``ext_refresh`` stays 0 for longer than the old overflow took (it rose within 3,000
      cycles) plus two refresh windows. Like the HB controllers', the LPDDR5 controllers'
      flag now cannot be reached through the host interface (the flag's level behaviour
      under a real overflow is tested on the controller, ``tests/amaranth/test_dram.py``)."""
    import dataclasses
    import math

    from amaranth.sim import Simulator

    from elmoe3d.sim.amaranth_streams import sample_dram_bus
    from elmoe3d.sw.golden.dram import DramDevice

    ext = dataclasses.replace(SMALL.ext, tREFI=400.0, tRFCpb=40.0, tPBR2PBR=20.0)
    arch = dataclasses.replace(SMALL, ext=ext)          # refresh interval 40 CK (50 cycles)
    die = LogicDie(config=arch, ext_channels=2)
    interval = math.ceil(ext.refresh_interval_ck * die._ext.channel.tck_logic)   # cycles
    E = die_errors_layout(arch, 2)
    assert [(n, f.offset, f.width) for n, f in E] == [
        ("cmd_index", 0, 1), ("dma_pe", 1, 1), ("ext_bad_mask", 2, 1), ("link_bad_desc", 3, 2),
        ("link_bad_length", 5, 2), ("hb_refresh", 7, 4), ("ext_refresh", 11, 2),
        ("ext_bad_credit", 13, 2)]
    lat, G = die.errors_latency, arch.pes_per_group
    C = host_cmd_layout(arch)
    L = link_op_layout(G)

    def link_beat(group, **fields):
        return C.const({"queue": HostQueue.LINK, "index": group,
                        "body": {"link": L.const(fields)}}).as_bits()

    bad_desc = link_beat(1, mode=LinkModeRTL.ALL_TO_ALL, src_mask=0b11, dst_mask=0b11,
                         words=4, chunk=0)
    bad_length = link_beat(0, mode=LinkModeRTL.ALL_TO_ALL, src_mask=0b11, dst_mask=0b11,
                           words=3, chunk=1)
    send = isa.encode(isa.Op.SEND, target=isa.Target.ACT, addr=0, words=3)
    sends = [C.const({"queue": HostQueue.PE, "index": p,
                      "body": {"cmd": command_layout().from_bits(send)}}).as_bits()
             for p in range(G)]
    ext_read = C.const({"queue": HostQueue.EXT, "index": 1, "body": {"ext": ext_read_layout(
        arch.pes).const({"addr": 0, "words": 600, "dst_mask": 0b0100})}}).as_bits()
    devs = [DramDevice(ext, clock_ghz=arch.clock_ghz, seed=c) for c in range(2)]
    log, taken, marks = [], {}, {}
    ext_words = [0]                 # EXT words the ring delivered to PE 2's router

    def flags(**fields):
        return E.const(fields).as_bits()

    async def bench(ctx):
        beats, rds = [("bad_desc", bad_desc), ("send0", sends[0]), ("send1", sends[1]),
                      ("bad_length", bad_length)], [None, None]

        async def step(clear=0, poke=None):
            cycle = len(log)
            ext_words[0] += ctx.get(die.probe.ext_word) >> 2 & 1
            ctx.set(die.host_cmd.valid, bool(beats))
            if beats:
                ctx.set(die.host_cmd.payload.as_value(), beats[0][1])
            if poke is not None:
                ctx.set(poke, 1)
            ctx.set(die.errors_clear.as_value(), clear)
            for c, bus in enumerate(die.ext):
                ctx.set(bus.rd_valid, rds[c] is not None)
                ctx.set(bus.rd_data, rds[c] or 0)
            if beats and ctx.get(die.host_cmd.ready):
                taken[beats.pop(0)[0]] = cycle
            for c, (bus, dev) in enumerate(zip(die.ext, devs)):
                rds[c] = dev.clock(*sample_dram_bus(ctx, bus))
            err = E.from_bits(ctx.get(die.errors.as_value()))
            log.append(err.as_value().value)
            await ctx.tick()
            return err

        async def until(what, pred, budget):
            for _ in range(budget):
                if pred(await step()):
                    marks[what] = len(log) - 1
                    return
            marks[what] = None

        async def watch_and_clear(what, clear):
            for _ in range(WATCH):
                await step()
            marks[what + " clear"] = len(log)
            await step(clear=clear)
            for _ in range(2 * lat):
                await step()

        # link_bad_desc, group 1: the beat taken in cycle 0
        for _ in range(die.link_error_latency + 1):
            await step()
        marks["bad_desc"] = len(log) - 1
        await watch_and_clear("bad_desc", flags(link_bad_desc=0b10))
        # link_bad_length, group 0
        await until("bad_length", lambda e: e.link_bad_length != 0, 2000)
        if marks["bad_length"] is None:
            return
        await watch_and_clear("bad_length", flags(link_bad_length=0b01))
        # hb_refresh bit 2 / ext_refresh bit 1: the blocks' own flag registers poked
        for what, reg, bit in (("hb", die._hb[2].errors.refresh_overflow,
                                flags(hb_refresh=0b0100)),
                               ("ext", die._ext._ctrl[1].errors.refresh_overflow,
                                flags(ext_refresh=0b10))):
            marks[what] = len(log)
            await step(poke=reg)
            await watch_and_clear(what, bit)
        # the EXT read for a PE that never loads: held by the scheduler, no overflow
        marks["quiet"] = len(log)
        ext_words[0] = 0
        beats.append(("ext_read", ext_read))
        await until("overflow", lambda e: e.ext_refresh != 0,
                    3000 + 2 * (ext.max_postponed + 1) * interval)

    sim = Simulator(die)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    print(f"die errors: takes {taken}, marks {marks}")
    for dev in devs:
        dev.finish()                          # refresh rate up to the end

    def field(name, a, b=None):
        """The values of ``errors.<name>`` in cycles a..b-1."""
        return {int(E.from_bits(v)[name]) for v in log[a:b]}

    def first(name):
        return next(c for c, v in enumerate(log) if E.from_bits(v)[name])

    assert taken["bad_desc"] == 0
    rise = taken["bad_desc"] + die.link_error_latency
    assert marks["bad_desc"] == rise and first("link_bad_desc") == rise, \
        "not exactly link_error_latency after the beat"
    k = marks["bad_desc clear"]
    assert field("link_bad_desc", rise, k + lat) == {0b10}, "group 1's bit only, sticky"
    assert field("link_bad_desc", k + lat) == {0}, "not cleared for good"
    assert marks["bad_length"] is not None, "group 0's link never flagged the bad length"
    rise = first("link_bad_length")
    k = marks["bad_length clear"]
    assert field("link_bad_length", rise, k + lat) == {0b01}, "group 0's bit only, sticky"
    assert field("link_bad_length", k + lat) == {0}, "not cleared for good"
    for name in ("cmd_index", "dma_pe", "ext_bad_mask", "hb_refresh", "ext_refresh"):
        assert field(name, 0, marks["hb"]) == {0}, name
    for what, bit in (("hb", flags(hb_refresh=0b0100)), ("ext", flags(ext_refresh=0b10))):
        k = marks[what + " clear"]
        assert set(log[marks[what]:k + lat]) == {bit}, f"{what}: a single bit, sticky"
        assert set(log[k + lat:k + 2 * lat + 1]) == {0}, f"{what}: not cleared"
    assert "ext_read" in taken
    assert marks["overflow"] is None, "an LPDDR5 controller reached the refresh limit"
    assert set(log[marks["quiet"]:]) == {0}
    # whole chunks only: the credits rounded down to a multiple of the chunk (ext_pick)
    credits, chunk = die.ext_fifo_words, die.ext_chunk_words
    assert ext_words[0] == credits - credits % chunk, \
        f"{ext_words[0]} EXT words reached PE 2, not its credits in whole chunks"


def test_ext_bad_mask_is_flagged_and_dropped():
    """An EXT beat for group g whose ``dst_mask`` is empty or names a PE of another group
    (EXT multicast is within a group) is taken, sets ``errors.ext_bad_mask`` (sticky, cleared
    by its strobe) and is dropped: group g's scheduler never sees it and nothing is read. A
    good beat after it is queued and flags nothing."""
    from amaranth.sim import Simulator

    arch = SMALL                                 # 4 PEs, 2 groups of 2
    die = LogicDie(config=arch, ext_channels=2)
    E = die_errors_layout(arch, 2)
    C = host_cmd_layout(arch)
    X = ext_read_layout(arch.pes)

    def ext_beat(group, mask):
        return C.const({"queue": HostQueue.EXT, "index": group, "body": {"ext": X.const(
            {"addr": 0, "words": 8, "dst_mask": mask})}}).as_bits()

    bad = [ext_beat(1, 0), ext_beat(1, 0b0001), ext_beat(0, 0b0101), ext_beat(0, 0b1000)]
    seen = {"desc": 0, "errors": [], "taken": 0}

    async def bench(ctx):
        for beat in bad:
            ctx.set(die.host_cmd.valid, 1)
            ctx.set(die.host_cmd.payload.as_value(), beat)
            assert ctx.get(die.host_cmd.ready), "a bad-mask beat is taken at once"
            await ctx.tick()
            ctx.set(die.host_cmd.valid, 0)
            for _ in range(3):
                for s in die._ext_sched:
                    seen["desc"] |= ctx.get(s.desc.valid)
                seen["errors"].append(ctx.get(die.errors.as_value()))
                await ctx.tick()
            ctx.set(die.errors_clear.as_value(), E.const({"ext_bad_mask": 1}).as_bits())
            await ctx.tick()
            ctx.set(die.errors_clear.as_value(), 0)
            await ctx.tick()
            assert ctx.get(die.errors.as_value()) == 0, "the clear did not clear it"
        # a good beat: queued for group 1, no flag
        ctx.set(die.host_cmd.valid, 1)
        ctx.set(die.host_cmd.payload.as_value(), ext_beat(1, 0b1100))
        await ctx.tick()
        ctx.set(die.host_cmd.valid, 0)
        for _ in range(3):
            seen["taken"] |= ctx.get(die._ext_sched[1].desc.valid)
            assert ctx.get(die.errors.as_value()) == 0
            await ctx.tick()

    sim = Simulator(die)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    flag = E.const({"ext_bad_mask": 1}).as_bits()
    assert set(seen["errors"]) == {flag}, "not exactly ext_bad_mask, sticky"
    assert not seen["desc"], "a bad-mask beat reached a scheduler"
    assert seen["taken"], "the good beat did not reach group 1's scheduler"


def test_first_missing_group_index_is_flagged_and_dropped():
    """A LINK or EXT beat naming group ``groups`` (the first index past the last group, not
    only the largest the index field holds) is taken at once, sets ``errors.cmd_index`` and
    nothing else, and reaches no queue (``cmd_room`` stays all ones); the same beats for the
    last group are taken and flag nothing."""
    from amaranth.sim import Simulator

    arch = SMALL                                 # 4 PEs, 2 groups of 2
    NG, P, G = arch.groups, arch.pes, arch.pes_per_group
    die = LogicDie(config=arch, ext_channels=2)
    E = die_errors_layout(arch, 2)
    C = host_cmd_layout(arch)
    assert (1 << C["index"].shape.width) > NG + 1  # index NG fits and is not the largest
    X = ext_read_layout(P)
    L = link_op_layout(G)
    beats = {
        HostQueue.LINK: lambda g: C.const({"queue": HostQueue.LINK, "index": g, "body": {
            "link": L.const({"words": 1, "chunk": 1, "src_mask": 1, "dst_mask": 1})}}).as_bits(),
        HostQueue.EXT: lambda g: C.const({"queue": HostQueue.EXT, "index": g, "body": {
            "ext": X.const({"addr": 0, "words": 8,
                            "dst_mask": 1 << (G * (g % NG))})}}).as_bits(),
    }
    all_room = (1 << (P + 2 * NG)) - 1
    flag = E.const({"cmd_index": 1}).as_bits()
    log = []

    async def bench(ctx):
        for good in (False, True):
            for queue, beat in beats.items():
                ctx.set(die.host_cmd.valid, 1)
                ctx.set(die.host_cmd.payload.as_value(), beat(NG - 1 if good else NG))
                taken = ctx.get(die.host_cmd.ready)
                await ctx.tick()
                ctx.set(die.host_cmd.valid, 0)
                await ctx.tick()
                log.append((queue.name, good, taken, ctx.get(die.errors.as_value()),
                            None if good else ctx.get(die.cmd_room)))
                ctx.set(die.errors_clear.as_value(), flag)
                await ctx.tick()
                ctx.set(die.errors_clear.as_value(), 0)
                await ctx.tick()

    sim = Simulator(die)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    assert log == [("LINK", False, 1, flag, all_room), ("EXT", False, 1, flag, all_room),
                   ("LINK", True, 1, 0, None), ("EXT", True, 1, 0, None)]

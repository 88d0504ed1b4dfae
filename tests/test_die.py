"""The logic die (:class:`elmoe3d.hw.die.LogicDie`): host payload layouts, queue numbering,
parameter checks and elaboration at the bench's size and at the paper's 16 and 32 PEs (the
cocotb bench ``tests/test_die_cocotb.py`` simulates the small die)."""

import pytest
from amaranth.hdl import Fragment

from elmoe3d import isa
from elmoe3d.config import preset
from elmoe3d.hw.agg_link import link_op_layout, pack_link_op
from elmoe3d.hw.die import (DmaKind, HostQueue, LogicDie, die_errors_layout, die_o_layout,
                            die_probe_layout, dma_bit, host_cmd_layout, host_dma_layout,
                            queue_bit)
from elmoe3d.hw.ext_stream import ext_read_layout
from elmoe3d.hw.isa import OKind, command_layout
from elmoe3d.sw.links import LinkMode, LinkOp

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
    assert queue_bit(arch, HostQueue.EXT) == 20
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


def test_small_die_elaborates():
    die = LogicDie(config=SMALL, ext_channels=2)
    assert (die.ext_channels, die.link_buffer_words, die.o_latency) == (2, 64, 1)
    assert die.ext_stripe_bytes == 2 * SMALL.ext.burst_bytes
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
    die = LogicDie(config=arch)
    assert die.ext_channels == 8 and die.ext_stripe_bytes == 256
    assert len(die.signature.members["hb"].dimensions) == 1
    assert die.signature.members["hb"].dimensions[0] == arch.pes
    m = die.elaborate(None)                     # the die's logic, sub-blocks not lowered
    assert die._hb_ports[0].bursts_per_word == 4
    assert die._ext_port.bursts_per_word == 2
    assert die._streamer.flits_per_word == 4
    for block in (die.router, die._hb_ports[0], die._ext_port, die._streamer):
        Fragment.get(block, None)
    # the rest (PEs, controllers, links, ring, queues) are elaborated by their own tests and
    # by synthesis (a paper PE alone takes 20 s of CPU to elaborate)
    subs = [s for s, *_ in list(m._named_submodules.values()) + m._anon_submodules]
    assert len(subs) >= 4 * arch.pes + arch.groups
    for block in subs + die._ext._ctrl + [die, m]:
        block._MustUse__silence = True


def test_errors_output_reflects_the_blocks_sticky_flags():
    """The small die in the Amaranth simulator (its LPDDR5 channels on timing-checked device
    models, tREFI shortened so the refresh debt grows within a thousand cycles): a link
    descriptor with ``chunk`` = 0 for group 1 sets ``errors.link_bad_desc`` bit 1 only, and
    the host's clear strobe clears it for good; an EXT read descriptor for a PE that never
    loads its words fills the ring and the LPDDR5 read buffers, the channels force their
    refresh and ``errors.ext_refresh`` rises for both (no DRAM timing violation); clearing
    bit 0 leaves bit 1; the other bits stay 0 (an HB controller cannot be held through the
    host interface: its router reads only what its FIFO can hold)."""
    import dataclasses

    from amaranth.sim import Simulator

    from elmoe3d.sim.dram_model import DramDevice, RowCmd

    ext = dataclasses.replace(SMALL.ext, tREFI=400.0, tRFCpb=40.0, tPBR2PBR=20.0)
    arch = dataclasses.replace(SMALL, ext=ext)          # refresh interval 40 CK (50 cycles)
    die = LogicDie(config=arch, ext_channels=2)
    E = die_errors_layout(arch, 2)
    assert [(n, f.offset, f.width) for n, f in E] == [
        ("cmd_index", 0, 1), ("dma_pe", 1, 1), ("link_bad_desc", 2, 2),
        ("link_bad_length", 4, 2), ("hb_refresh", 6, 4), ("ext_refresh", 10, 2)]
    C = host_cmd_layout(arch)
    bad_link = C.const({"queue": HostQueue.LINK, "index": 1, "body": {"link": link_op_layout(
        arch.pes_per_group).const({"mode": 1, "src_mask": 3, "dst_mask": 3, "words": 4,
                                   "chunk": 0})}}).as_bits()
    ext_read = C.const({"queue": HostQueue.EXT, "body": {"ext": ext_read_layout(
        arch.pes).const({"addr": 0, "words": 600, "dst_mask": 0b0100})}}).as_bits()
    devs = [DramDevice(ext, clock_ghz=arch.clock_ghz, seed=c) for c in range(2)]
    seen = {}

    def field(value, name):
        return value >> E[name].offset & ((1 << E[name].width) - 1)

    async def bench(ctx):
        beats, rds, rise = [bad_link, ext_read], [None, None], None
        for cycle in range(3000):
            ctx.set(die.host_cmd.valid, bool(beats))
            if beats:
                ctx.set(die.host_cmd.payload.as_value(), beats[0])
            clear = 0
            if cycle == 20:
                clear = 1 << E["link_bad_desc"].offset + 1
            if rise is not None and cycle == rise + 100:
                clear = 1 << E["ext_refresh"].offset
            ctx.set(die.errors_clear.as_value(), clear)
            for c, bus in enumerate(die.ext):
                ctx.set(bus.rd_valid, rds[c] is not None)
                ctx.set(bus.rd_data, rds[c] or 0)
            if beats and ctx.get(die.host_cmd.ready):
                beats.pop(0)
            for c, (bus, dev) in enumerate(zip(die.ext, devs)):
                row = col = None
                if ctx.get(bus.row_valid):
                    row = (RowCmd(ctx.get(bus.row_kind).value), ctx.get(bus.row_bank),
                           ctx.get(bus.row_addr))
                if ctx.get(bus.col_valid):
                    col = (ctx.get(bus.col_write), ctx.get(bus.col_bank),
                           ctx.get(bus.col_addr), ctx.get(bus.col_wdata))
                rds[c] = dev.clock(row, col)
            err = ctx.get(die.errors.as_value())
            if cycle in (2, 19, 21, 22):
                seen[cycle] = err
            if rise is None and field(err, "ext_refresh") == 0b11:
                rise = cycle
            if rise is not None and cycle in (rise + 101, rise + 102):
                seen["ext cleared"] = err
                if cycle == rise + 102:
                    break
            await ctx.tick()
        seen["rise"] = rise

    sim = Simulator(die)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    print(f"die errors seen: {seen}")
    for dev in devs:
        dev.finish()                          # refresh rate up to the end
    link_bit = 1 << E["link_bad_desc"].offset + 1
    assert seen[2] == seen[19] == link_bit            # group 1's link only, sticky
    assert seen[21] == seen[22] == 0                  # cleared
    assert seen["rise"] is not None, "the LPDDR5 controllers never forced a refresh"
    assert seen["ext cleared"] == 0b10 << E["ext_refresh"].offset    # bit 0 cleared alone

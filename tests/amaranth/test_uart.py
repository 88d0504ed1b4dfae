"""hw.uart (Amaranth simulator): TX -> RX loopback of random bytes with random idle gaps at
several divisors, the TX waveform against the 8N1 bit sequence, a sender whose bit period is
off by up to 3 %, a framing error (stop bit 0) counted with the next byte still received, an
overrun counted, and the parameter checks."""

import random

import pytest
from amaranth.hdl import Module
from amaranth.sim import Simulator

from elmoe3d.hw.uart import UartRx, UartTx
from elmoe3d.sim.bench_board import bits_8n1


def _simulate(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def _char_levels(byte, divisor):
    """One 8N1 character as line levels, one per cycle (each bit ``divisor`` cycles)."""
    return [b for b in bits_8n1(byte) for _ in range(divisor)]


def _feed(divisor, levels, *, ready=True):
    """Drive a ``UartRx(divisor=divisor)``'s line with ``levels`` (one per cycle), its output's
    ``ready`` held at ``ready``. Returns the receiver, the ``(cycle, byte)`` of every cycle its
    output was valid, and its ``framing_errors``, ``overruns``, ``o.valid`` and ``o.payload``
    after the last level."""
    rx = UartRx(divisor=divisor)
    offered, end = [], []

    async def bench(ctx):
        ctx.set(rx.o.ready, ready)
        for cycle, level in enumerate(levels):
            ctx.set(rx.rx, level)
            if ctx.get(rx.o.valid):
                offered.append((cycle, ctx.get(rx.o.payload)))
            await ctx.tick()
        end.extend((ctx.get(rx.framing_errors), ctx.get(rx.overruns), ctx.get(rx.o.valid),
                    ctx.get(rx.o.payload)))

    _simulate(rx, bench)
    return rx, offered, tuple(end)


def _loopback(divisor, data, seed, idle=0.3, stall=0.0):
    rx, tx = UartRx(divisor=divisor), UartTx(divisor=divisor)
    m = Module()
    m.submodules.rx, m.submodules.tx = rx, tx
    m.d.comb += rx.rx.eq(tx.tx)
    rng = random.Random(seed)
    print(f"seed {seed}")
    got, line = [], []

    async def bench(ctx):
        i = 0
        cycle = 0
        deadline = 100 + len(data) * divisor * 14 * 3
        valid = False
        while (i < len(data) or len(got) < len(data)) and cycle < deadline:
            if not valid and i < len(data) and rng.random() >= idle:
                valid = True
            ctx.set(tx.i.valid, valid)
            if valid:
                ctx.set(tx.i.payload, data[i])
            ready_o = rng.random() >= stall
            ctx.set(rx.o.ready, ready_o)
            if ctx.get(rx.o.valid) and ready_o:
                got.append(ctx.get(rx.o.payload))
            if valid and ctx.get(tx.i.ready):
                i += 1
                valid = False
            line.append(ctx.get(tx.tx))
            await ctx.tick()
            cycle += 1
        ctx.set(tx.i.valid, 0)
        for _ in range(divisor * 12):
            if ctx.get(rx.o.valid):
                got.append(ctx.get(rx.o.payload))
            await ctx.tick()
        got.append(("errors", ctx.get(rx.framing_errors), ctx.get(rx.overruns)))

    _simulate(m, bench)
    return got, line


@pytest.mark.parametrize("divisor,stall", [(4, 0.0), (5, 0.5), (8, 0.0), (13, 0.5)])
def test_loopback_random_bytes(divisor, stall):
    """With and without backpressure on the receiver's output (a byte not taken at once
    stays on offer; at most a character time of stall, so no overrun)."""
    rng = random.Random(divisor)
    print(f"seed {divisor}")
    data = [rng.randrange(256) for _ in range(40)] + [0x00, 0xFF, 0x7E, 0x7D, 0x55, 0xAA]
    got, line = _loopback(divisor, data, seed=divisor, stall=stall)
    assert got[:-1] == data
    assert got[-1] == ("errors", 0, 0)


def test_tx_waveform_is_8n1():
    """The TX line, sampled once per bit, is idle high then start, data LSB first, stop."""
    divisor = 5
    data = [0x35, 0xC8]
    _, line = _loopback(divisor, data, seed=1, idle=0.0)
    first = line.index(0)
    want = [b for byte in data for b in bits_8n1(byte)]
    sampled = [line[first + k * divisor + divisor // 2] for k in range(len(want))]
    assert sampled == want
    # every bit lasts exactly divisor cycles
    assert line[first:first + divisor] == [0] * divisor
    assert all(v == 1 for v in line[:first])


def _drive_line(divisor_rx, chars, period, gap_bits=1.5, ready=True):
    """Drive rx with characters whose bits last ``period`` clock cycles (a float: the
    sender's clock differs); ``chars`` holds (byte, stop level). Returns the bytes taken
    (none when not ``ready``), then ``("errors", framing errors, overruns, o.valid,
    o.payload)``."""
    edges = []
    t = 5.0
    for byte, stop in chars:
        for b in bits_8n1(byte, stop):
            edges.append((t, b))
            t += period
        edges.append((t, 1))
        t += gap_bits * period
    levels, k, level = [], 0, 1
    for cycle in range(int(t + 4 * divisor_rx * 12)):
        while k < len(edges) and edges[k][0] <= cycle:
            level = edges[k][1]
            k += 1
        levels.append(level)
    _, offered, end = _feed(divisor_rx, levels, ready=ready)
    return [byte for _, byte in offered if ready] + [("errors", *end)]


@pytest.mark.parametrize("divisor,skew", [(8, 0.97), (8, 1.03), (25, 0.98), (25, 1.02),
                                          (4, 1.0)])
def test_baud_mismatch_within_tolerance(divisor, skew):
    rng = random.Random(int(divisor * skew * 100))
    print(f"seed {int(divisor * skew * 100)}")
    data = [rng.randrange(256) for _ in range(24)]
    got = _drive_line(divisor, [(b, 1) for b in data], divisor * skew, gap_bits=0.0)
    assert got[:-1] == data
    assert got[-1][1:3] == (0, 0)


@pytest.mark.parametrize("divisor,skew,ok", [
    # the margins for back-to-back characters (hw.uart): -(d - d//2 - 1) / (10 d) and
    # +(d//2) / (9 d): -3.75 / +5.56 % at divisor 8, -4.8 / +5.33 % at 25
    (8, 0.965, True), (8, 1.05, True), (25, 0.955, True), (25, 1.05, True),
    (8, 0.95, False), (8, 1.07, False), (25, 0.94, False), (25, 1.065, False)])
def test_baud_mismatch_margins(divisor, skew, ok):
    """Just inside the stated margins every character arrives; beyond them some do not (a
    sample lands in the neighbouring bit)."""
    rng = random.Random(int(divisor * skew * 1000))
    print(f"seed {int(divisor * skew * 1000)}")
    data = [rng.randrange(256) for _ in range(32)]
    got = _drive_line(divisor, [(b, 1) for b in data], divisor * skew, gap_bits=0.0)
    if ok:
        assert got[:-1] == data and got[-1][1:3] == (0, 0)
    else:
        assert got[:-1] != data or got[-1][1] != 0


@pytest.mark.parametrize("divisor,pulse", [(8, 2), (8, 3), (25, 11)])
def test_glitch_in_start_rejected(divisor, pulse):
    """A low pulse shorter than half a bit on the idle line: START finds the line high again
    at mid-bit and goes back to IDLE: no byte, no framing error, and the next character
    (which follows the glitch by two bit times) arrives intact."""
    seq = [1] * 7 + [0] * pulse + [1] * (2 * divisor) + _char_levels(0xA7, divisor) \
        + [1] * (divisor * 3)
    _, offered, (framing, overruns, _, _) = _feed(divisor, seq)
    assert [byte for _, byte in offered] + [("errors", framing, overruns)] \
        == [0xA7, ("errors", 0, 0)]


def test_framing_error_counted_and_next_byte_received():
    data = [(0x12, 1), (0xA5, 0), (0x00, 0), (0x3C, 1), (0x7E, 1)]
    got = _drive_line(6, data, 6.0)
    assert got[:-1] == [0x12, 0x3C, 0x7E]
    assert got[-1][1:3] == (2, 0)


def test_break_then_resync():
    """A line held low (a break: 0x00 with stop 0, then low for a while) counts one framing
    error; the receiver waits for the line to go high and takes the next character."""
    divisor = 6
    seq = [1] * 10 + [0] * (divisor * 30) + [1] * (divisor * 2) + _char_levels(0x5A, divisor) \
        + [1] * (divisor * 14)
    _, offered, (framing, _, _, _) = _feed(divisor, seq)
    assert [byte for _, byte in offered] + [framing] == [0x5A, 1]


def test_overrun_counted_and_held_byte_kept():
    """Nobody takes o: the first byte stays on offer unchanged, the next two are counted as
    overruns."""
    got = _drive_line(5, [(0x11, 1), (0x22, 1), (0x33, 1)], 5.0, ready=False)
    errors, framing, overruns, valid, payload = got[-1]
    assert (framing, overruns, valid, payload) == (0, 2, 1, 0x11)


@pytest.mark.parametrize("cls", [UartRx, UartTx])
@pytest.mark.parametrize("bad", [3, 0, 4.0, True, "8"])
def test_divisor_validated(cls, bad):
    with pytest.raises(ValueError, match="divisor"):
        cls(divisor=bad)


@pytest.mark.parametrize("divisor", [4, 7, 8])
def test_rx_latency_measured(divisor):
    """The byte is offered exactly UartRx.latency cycles after the start bit's falling edge
    reaches rx."""
    seq = [1] * 3 + _char_levels(0x96, divisor) + [1] * (divisor * 3)
    rx, offered, _ = _feed(divisor, seq, ready=False)
    # the falling edge is set before the clock edge of cycle 3
    assert [cycle for cycle, _ in offered[:1]] == [3 + rx.latency]

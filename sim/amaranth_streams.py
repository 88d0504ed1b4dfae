"""Amaranth-simulator stream bench shared by the unit tests of streaming blocks (the tensor
tile, the VPU units): one input stream, one output stream, a random source and a random sink,
and the stream protocol checked on every cycle (:func:`drive_pipeline`); and the random sink
with the same checks for one output stream of a block with several (:class:`StreamSink`, the
aggregation link's and the streamline ring's unit tests).

:func:`sample_dram_bus` reads the commands on a DRAM controller's command bus in a testbench, as
:func:`elmoe3d.sim.dram_bus.sample_bus` does for the cocotb benches.

This is for fast unit tests (``amaranth.sim``); the cocotb + Verilator benches go through
:mod:`elmoe3d.sim.runner`.
"""

from __future__ import annotations

import random

from amaranth.sim import Simulator


__all__ = ["drive_pipeline", "StreamSink", "sample_dram_bus"]


def sample_dram_bus(ctx, bus) -> tuple:
    """``(row, col)`` commands on a DRAM command bus (the controller's ``dram`` port,
    :mod:`elmoe3d.hw.dram`) this cycle, in the form
    :meth:`elmoe3d.sw.golden.dram.DramDevice.clock` takes: ``row`` = ``(RowCmd, bank, addr)``
    or None, ``col`` = ``(write, bank, addr, wdata)`` or None."""
    from ..sw.golden.dram import RowCmd
    row = col = None
    if ctx.get(bus.row_valid):
        row = (RowCmd(ctx.get(bus.row_kind).value), ctx.get(bus.row_bank),
               ctx.get(bus.row_addr))
    if ctx.get(bus.col_valid):
        col = (ctx.get(bus.col_write), ctx.get(bus.col_bank), ctx.get(bus.col_addr),
               ctx.get(bus.col_wdata))
    return row, col


class StreamSink:
    """The consumer of one output stream of a DUT in an Amaranth testbench.

    Each cycle, :meth:`drive` sets ``ready`` (not ready with probability ``stall``: one draw
    of ``rng``, a ``random.Random``, per cycle, also when ``stall`` is 0), then :meth:`sample`
    takes the payload offered while ready and checks the stream rule: an item offered and not
    taken stays valid and unchanged (``AssertionError`` naming the cycle and ``name``). An
    always-ready stream (``stream.Signature(always_ready=True)``) takes every item; ``stall``
    must then be 0 (``ValueError``).

    Attributes: ``got`` (items taken, in order), ``cycles`` (the cycle each was taken),
    ``first`` (the first cycle an item was offered, None before). ``read`` maps the payload
    view to the item (default: ``ctx.get`` of the payload)."""

    def __init__(self, stream, rng, stall, name, read=None):
        if stream.signature.always_ready and stall:
            raise ValueError(f"{name}: an always-ready stream cannot stall (stall={stall!r})")
        self.stream, self.rng, self.stall, self.name, self.read = stream, rng, stall, name, read
        self.got, self.cycles, self.first = [], [], None
        self.ready, self.held = False, None

    def drive(self, ctx) -> bool:
        self.ready = self.rng.random() >= self.stall
        if not self.stream.signature.always_ready:    # else ready is the constant 1
            ctx.set(self.stream.ready, self.ready)
        return self.ready

    def sample(self, ctx, cycle):
        if ctx.get(self.stream.valid):
            item = ctx.get(self.stream.payload)
            if self.read is not None:
                item = self.read(item)
            assert self.held is None or item == self.held, \
                f"cycle {cycle}: {self.name}: an item offered and not taken changed"
            if self.first is None:
                self.first = cycle
            if self.ready:
                self.got.append(item)
                self.cycles.append(cycle)
                self.held = None
            else:
                self.held = item
        else:
            assert self.held is None, \
                f"cycle {cycle}: {self.name}: valid dropped before the handshake"


def drive_pipeline(dut, inputs, *, n_results, seed, idle=0.0, stall=0.0, drain=12,
                   max_cycles=None, read=None, passes=1, in_pass=None):
    """Drive ``inputs`` into ``dut.i`` and collect ``n_results`` payloads from ``dut.o``.

    The source offers the next input with probability ``1 - idle`` each cycle (and holds it until
    taken); the sink is ready with probability ``1 - stall`` (``random.Random(seed)``). Checks,
    every cycle: ``i.ready == ~o.valid | o.ready`` (a pipeline with a global stall; with
    ``passes`` P > 1, only once an input has been offered in P - 1 such cycles before); a result
    offered and not taken stays valid and unchanged; no more than ``n_results`` results, and
    none in the ``drain`` cycles after the last one (nothing duplicated). Raises
    ``AssertionError`` naming the cycle on a violation or after ``max_cycles`` (default: scaled
    to the traffic).

    Parameters
    ----------
    dut : wiring.Component with ``i`` (In) and ``o`` (Out) streams
    inputs : sequence of int or Const
        Input payloads: an ``int`` is set as the payload's raw bits, anything else as the
        payload view's value (e.g. ``layout.const(fields)``).
    read : callable, optional
        Maps each output payload view to the value collected (default: the view's raw int
        through ``ctx.get``).
    in_pass : callable, optional
        ``in_pass(value, p) -> int``: the raw payload offered in pass ``p`` of an input (a
        source that changes part of it from pass to pass, the tile's ``streamed_weights``).
        With it the bench also checks the DUT's ``phase`` (the pass offered) and
        ``next_pass`` (a pass before the last one taken) every cycle.

    Returns
    -------
    (outputs, log) : outputs in arrival order; log with the cycle of every accepted input
    (``accept``) and every taken result (``emit``), and ``latency`` (``dut.latency``).
    """
    n_in = len(inputs)
    rng = random.Random(seed)
    sink = StreamSink(dut.o, rng, stall, "o", read)
    got, accept = sink.got, []
    if max_cycles is None:
        rate = max(1e-3, (1 - idle) * (1 - stall))
        max_cycles = 100 + int((n_in * passes + 4 * n_results + dut.latency + 10) / rate * 4)

    async def bench(ctx):
        idx, cycle, valid, quiet, offered = 0, 0, False, 0, 0
        while True:
            if not valid and idx < n_in:
                valid = rng.random() >= idle
            ctx.set(dut.i.valid, valid)
            if valid:
                value = inputs[idx]
                if in_pass is not None:
                    ctx.set(dut.i.payload.as_value(), in_pass(value, offered))
                elif isinstance(value, int):
                    ctx.set(dut.i.payload.as_value(), value)
                else:
                    ctx.set(dut.i.payload, value)
            ready = sink.drive(ctx)
            o_valid, i_ready = ctx.get(dut.o.valid), ctx.get(dut.i.ready)
            advance = not o_valid or ready
            assert i_ready == (advance and offered == passes - 1), f"cycle {cycle}: i.ready"
            if in_pass is not None:
                assert ctx.get(dut.phase) == offered, f"cycle {cycle}: phase"
                assert ctx.get(dut.next_pass) == (valid and advance and offered < passes - 1), \
                    f"cycle {cycle}: next_pass"
            if valid and advance and not i_ready:
                offered += 1
            sink.sample(ctx, cycle)
            assert len(got) <= n_results, f"cycle {cycle}: unexpected extra result"
            if valid and i_ready:
                accept.append(cycle)
                idx += 1
                valid = False
                offered = 0
            if idx == n_in and len(got) == n_results:
                quiet += 1
                if quiet > drain:
                    return
            await ctx.tick()
            cycle += 1
            assert cycle < max_cycles, \
                f"timeout: {idx}/{n_in} inputs accepted, {len(got)}/{n_results} results"

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    return got, {"accept": accept, "emit": sink.cycles, "latency": dut.latency}

"""Amaranth-simulator stream bench shared by the unit tests of streaming blocks (the tensor
tile, the VPU units): one input stream, one output stream, a random source and a random sink,
and the stream protocol checked on every cycle.

This is for fast unit tests (``amaranth.sim``); the cocotb + Verilator benches go through
:mod:`elmoe3d.sim.runner`.
"""

from __future__ import annotations

import random

from amaranth.sim import Simulator


__all__ = ["drive_pipeline"]


def drive_pipeline(dut, inputs, *, n_results, seed, idle=0.0, stall=0.0, drain=12,
                   max_cycles=None, read=None):
    """Drive ``inputs`` into ``dut.i`` and collect ``n_results`` payloads from ``dut.o``.

    The source offers the next input with probability ``1 - idle`` each cycle (and holds it until
    taken); the sink is ready with probability ``1 - stall`` (``random.Random(seed)``). Checks,
    every cycle: ``i.ready == ~o.valid | o.ready`` (a pipeline with a global stall); a result
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

    Returns
    -------
    (outputs, log) : outputs in arrival order; log with the cycle of every accepted input
    (``accept``) and every taken result (``emit``), and ``latency`` (``dut.latency``).
    """
    n_in = len(inputs)
    rng = random.Random(seed)
    got, accept, emit = [], [], []
    if max_cycles is None:
        rate = max(1e-3, (1 - idle) * (1 - stall))
        max_cycles = 100 + int((n_in + 4 * n_results + dut.latency + 10) / rate * 4)

    async def bench(ctx):
        idx, cycle, valid, pending, quiet = 0, 0, False, None, 0
        while True:
            if not valid and idx < n_in:
                valid = rng.random() >= idle
            ctx.set(dut.i.valid, valid)
            if valid:
                value = inputs[idx]
                if isinstance(value, int):
                    ctx.set(dut.i.payload.as_value(), value)
                else:
                    ctx.set(dut.i.payload, value)
            ready = rng.random() >= stall
            ctx.set(dut.o.ready, ready)
            o_valid, i_ready = ctx.get(dut.o.valid), ctx.get(dut.i.ready)
            assert i_ready == (not o_valid or ready), f"cycle {cycle}: i.ready"
            if o_valid:
                payload = ctx.get(dut.o.payload)
                if read is not None:
                    payload = read(payload)
                if pending is not None:
                    assert payload == pending, f"cycle {cycle}: stalled result changed"
                if ready:
                    got.append(payload)
                    emit.append(cycle)
                    pending = None
                else:
                    pending = payload
            else:
                assert pending is None, f"cycle {cycle}: o.valid dropped before the handshake"
            assert len(got) <= n_results, f"cycle {cycle}: unexpected extra result"
            if valid and i_ready:
                accept.append(cycle)
                idx += 1
                valid = False
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
    return got, {"accept": accept, "emit": emit, "latency": dut.latency}

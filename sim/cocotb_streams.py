"""cocotb stream drivers shared by the cocotb + Verilator benches (``sim/bench_*.py``): the
bench clock and reset, a source that offers words on an input stream, a sink that drives
``ready`` with random backpressure, and a monitor that collects what an output stream gives
and checks the stream rule.

Streams are the Verilog ports Amaranth emits for ``amaranth.lib.stream`` interfaces:
``<port>__valid``, ``<port>__payload``, ``<port>__ready``. Cycles are counted in periods of
:data:`CLOCK_NS` of simulation time (only cycle counts are reported).
"""

from __future__ import annotations

from cocotb.clock import Clock
from cocotb.simtime import get_sim_time
from cocotb.triggers import ReadOnly, RisingEdge


__all__ = ["CLOCK_NS", "cycle", "edge_ns", "handshake_at", "start", "offer", "drive_ready", "monitor"]

#: Clock period of the benches (ns of simulation time).
CLOCK_NS = 10


def cycle() -> int:
    """The current cycle: simulation time in units of :data:`CLOCK_NS`."""
    return int(get_sim_time("ns")) // CLOCK_NS


def edge_ns(c: int) -> int:
    """The simulation time (ns) of the rising edge that begins cycle ``c`` of :func:`cycle`:
    the clock starts low (:func:`start`), so its rising edges fall half a period into each
    :data:`CLOCK_NS` (5, 15, 25 ns ...). A handshake :func:`monitor` logs at cycle ``c`` is
    valid and ready from ``edge_ns(c)`` and taken at the edge ``edge_ns(c + 1)``: what a
    waveform shows."""
    return c * CLOCK_NS + CLOCK_NS // 2


def handshake_at(c: int) -> str:
    """Where a waveform shows a handshake :func:`monitor` logged at cycle ``c``: ``"valid and
    ready from 355 ns, taken at the 365 ns edge"`` (:func:`edge_ns`; under backpressure the
    beat may have been valid for cycles before ``ready`` rose)."""
    return f"valid and ready from {edge_ns(c)} ns, taken at the {edge_ns(c + 1)} ns edge"


async def start(dut, zero=(), *, settle: int = 1):
    """Start ``dut.clk`` (period :data:`CLOCK_NS`), hold ``dut.rst`` for 3 cycles with the
    inputs named in ``zero`` (e.g. ``"i__valid"``) at 0, release it, then wait ``settle``
    more rising edges."""
    Clock(dut.clk, CLOCK_NS, unit="ns").start(start_high=False)
    dut.rst.value = 1
    for name in zero:
        getattr(dut, name).value = 0
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    for _ in range(settle):
        await RisingEdge(dut.clk)


async def offer(dut, port, words, rng, idle=0.0, *, bits=None, rate=None, log=None):
    """Offer ``words`` (ints) in order on the input stream ``port``, each held until taken.

    ``rng`` is a NumPy generator. Before a word, with probability ``idle``, ``valid`` drops for
    1-3 cycles, during which the payload is random garbage of ``bits`` bits (None: left as it
    was). With ``rate`` (words per cycle, < 1) a token bucket paces the stream: it gains
    ``rate`` words per cycle and holds at most two (one word in flight and one buffered), so a
    stalled DUT cannot bank bandwidth. ``log`` collects the cycle each word was taken."""
    valid = getattr(dut, f"{port}__valid")
    payload = getattr(dut, f"{port}__payload")
    ready = getattr(dut, f"{port}__ready")
    credit = 1.0
    for word in words:
        if rate is not None:
            while credit < 1.0:
                valid.value = 0
                await RisingEdge(dut.clk)
                credit = min(2.0, credit + rate)
        if idle and rng.random() < idle:
            valid.value = 0
            for _ in range(int(rng.integers(1, 4))):
                if bits is not None:
                    # Garbage while not valid: the DUT must ignore the payload.
                    payload.value = int.from_bytes(rng.bytes((bits + 7) // 8), "little") \
                        & ((1 << bits) - 1)
                await RisingEdge(dut.clk)
        payload.value = int(word)
        valid.value = 1
        while True:
            await ReadOnly()
            taken = ready.value == 1
            await RisingEdge(dut.clk)
            if rate is not None:
                credit = min(2.0, credit + rate - (1.0 if taken else 0.0))
            if taken:
                if log is not None:
                    log.append(cycle() - 1)
                break
    valid.value = 0


async def drive_ready(dut, port, rng, backpressure=0.0):
    """Drive ``<port>__ready`` every cycle: low with probability ``backpressure`` (``rng`` a
    NumPy generator; no draw when ``backpressure`` is 0). Runs until cancelled."""
    ready = getattr(dut, f"{port}__ready")
    while True:
        ready.value = 0 if backpressure and rng.random() < backpressure else 1
        await RisingEdge(dut.clk)


async def monitor(dut, port, out, cycles, errors):
    """Collect every payload taken on the output stream ``port`` (as an unsigned int, into
    ``out``, its cycle into ``cycles``) and check the stream rule: a payload offered and not
    taken stays valid and unchanged (a violation appends a line naming the cycles to
    ``errors``). Runs until cancelled."""
    valid = getattr(dut, f"{port}__valid")
    payload = getattr(dut, f"{port}__payload")
    ready = getattr(dut, f"{port}__ready")
    held = None                        # a payload offered but not taken in the last cycle
    while True:
        await ReadOnly()
        v = valid.value == 1
        raw = payload.value.to_unsigned() if v else None
        if held is not None and (not v or raw != held[0]):
            errors.append(f"cycle {cycle()}: {port} beat offered at cycle {held[1]} was "
                          f"withdrawn or changed before it was taken")
        held = None
        if v:
            if ready.value == 1:
                out.append(raw)
                cycles.append(cycle())
            else:
                held = (raw, cycle())
        await RisingEdge(dut.clk)

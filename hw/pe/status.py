"""The PE's performance counters, sticky flags and its STATUS word (paper Section 5.2;
``docs/pe.md``, "STATUS")."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ..isa import status_layout
from .common import COUNTER_BITS


__all__ = ["COUNTERS", "StatusCounters"]


#: The counters, in the order of :data:`elmoe3d.sw.golden.asm.STATUS_FIELDS`.
COUNTERS = ("cycles", "load_busy", "exec_busy", "stall", "gemm_beats", "words_loaded",
            "words_sent", "words_received")


class StatusCounters(wiring.Component):
    """:data:`COUNTERS`, :data:`~elmoe3d.hw.pe.common.COUNTER_BITS`-bit counters (wrapping), the
    sticky flags ``acc_overflow`` (a tile accumulator or a ``psum_in`` addition saturated) and
    ``vpu_saturation`` (any VPU saturation), and the snapshot a STATUS command sends
    (:func:`elmoe3d.hw.isa.status_layout`).

    Ports
    -----
    inc : In, one bit per counter (:data:`COUNTERS`)
        Count one in this cycle.
    clear : In(1)
        Reset every counter to zero (``CLEAR counters``; it wins over ``inc``).
    acc_set, vpu_set : In(1)
        Set ``acc_overflow`` / ``vpu_saturation``.
    flags_clear : In(1)
        Clear both flags (``CLEAR flags``; wins over ``acc_set``, not over ``vpu_set``).
    snap : In(1)
        Take the snapshot (the counters' values before this cycle's counts) into :attr:`beat`.
    beat : Out, :func:`~elmoe3d.hw.isa.status_layout`
        The last snapshot (from the cycle after ``snap``).

    Latency: a count shows in the snapshot taken a cycle later; ``beat`` one cycle after
    ``snap``.

    Timing (issue 25): ``inc`` and ``clear`` reach only flip-flops: per counter the
    registered increment ``pending``, which the 48-bit register adds a cycle later, and one
    registered ``clear`` for all of them, after which the register reads as 0; a counter's
    value is ``count + pending`` (0 in the cycle after a clear: what :attr:`beat` and the
    next cycle's register take). The counts, the wrap-around and what a snapshot reads are
    those of a counter that adds ``inc`` in its own cycle: the deep ready and accept logic that drives ``inc`` (a tile
    beat taken, an ``ld`` word taken) does not end in a 48-bit carry chain.

    Parameters
    ----------
    config : ArchConfig or PEConfig
        The word width W of the STATUS word.
    """

    def __init__(self, *, config):
        self._layout = status_layout(config)
        super().__init__({
            "inc": In(data.StructLayout({name: 1 for name in COUNTERS})),
            "clear": In(1),
            "acc_set": In(1),
            "vpu_set": In(1),
            "flags_clear": In(1),
            "snap": In(1),
            "beat": Out(self._layout),
        })

    @property
    def latency(self) -> int:
        """Cycles from ``snap`` to the snapshot on ``beat``."""
        return 1

    def elaborate(self, platform):
        m = Module()
        status_now = Signal(self._layout)
        # ``clear`` is registered too: the register it empties is read as 0 in the cycle after
        # (what a register cleared in that cycle holds), so no 48-bit carry chain or its
        # enable starts at the deep logic that starts a CLEAR
        cleared = Signal()
        m.d.sync += cleared.eq(self.clear)
        for name in COUNTERS:
            # value = reg + pending; an increment is added a cycle after it is counted, so the
            # 48-bit carry chain starts at flip-flops (``clear`` drops both)
            reg = Signal(COUNTER_BITS, name=f"count_{name}")
            pending = Signal(name=f"pending_{name}")
            value = Signal(COUNTER_BITS, name=f"value_{name}")
            m.d.comb += value.eq(Mux(cleared, 0, reg) + pending)
            m.d.sync += [pending.eq(getattr(self.inc, name) & ~self.clear), reg.eq(value)]
            m.d.comb += getattr(status_now, name).eq(value)
        flag_acc = Signal()           # a tile accumulator saturated
        flag_vpu = Signal()           # any VPU saturation
        with m.If(self.acc_set):
            m.d.sync += flag_acc.eq(1)
        with m.If(self.flags_clear):
            m.d.sync += [flag_acc.eq(0), flag_vpu.eq(0)]
        with m.If(self.vpu_set):
            m.d.sync += flag_vpu.eq(1)
        m.d.comb += [status_now.acc_overflow.eq(flag_acc),
                     status_now.vpu_saturation.eq(flag_vpu)]
        with m.If(self.snap):
            m.d.sync += self.beat.eq(status_now)
        return m

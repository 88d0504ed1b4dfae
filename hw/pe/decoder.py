"""The PE's command decoder (paper Section 4.1; ``docs/pe.md``, "Engines and
synchronisation")."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Value, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ...isa import Op
from ..checked import check_param
from ..isa import command_layout, op_layout
from .common import SEQ


__all__ = ["LOAD_FIELDS", "load_entry_layout", "CommandDecoder"]


#: The LOAD fields the PE uses (``src`` and ``hb_addr`` are for the die's load router).
LOAD_FIELDS = ("target", "buf", "addr", "words", "signal", "fence")


def load_entry_layout() -> data.StructLayout:
    """A queued LOAD: ``cmd`` (the :data:`LOAD_FIELDS` of the command) and ``need``, the number
    of execute commands taken before it (its fence waits for them)."""
    cmd = data.StructLayout({name: op_layout(Op.LOAD)[name].shape for name in LOAD_FIELDS})
    return data.StructLayout({"cmd": cmd, "need": unsigned(SEQ)})


class CommandDecoder(wiring.Component):
    """Takes commands in program order and hands them to the engines: LOADs to a queue of
    ``load_queue_depth`` entries for the load engine (so that a LOAD waiting for a buffer flag
    or a fence does not hold back the execute commands behind it), REQUANT to the
    requantization engine when it is free, everything else to a one-command register in front
    of the execute engine (decoded while the current command runs). Every execute command
    gets a sequence number (the order it was taken in; REQUANT included); a LOAD carries the
    number of execute commands taken before it. LOADs after a BARRIER, a ``CLEAR counters`` or a
    STATUS are queued while it waits (the load engine holds them until it has started:
    :attr:`xn_hold`, :class:`~elmoe3d.hw.pe.load.LoadEngine` ``hold``), so the commands behind
    them are decoded meanwhile.

    Ports
    -----
    cmd : In, stream of :func:`~elmoe3d.hw.isa.command_layout`
    ld : Out, stream of :func:`load_entry_layout`
        The head of the LOAD queue (``ready``: the load engine takes it).
    xn, xn_valid, xn_seq : Out
        The next execute command, held until ``xn_take``, and its number.
    xn_take : In(1)
        The execute engine takes ``xn`` in this cycle.
    x_seq : Out(SEQ)
        Execute commands taken so far (the next one's number).
    xn_hold : Out(1)
        ``xn`` is a BARRIER, a ``CLEAR counters`` or a STATUS: later LOADs take no word until it
        has started (the counters it clears or sends count exactly the LOADs before it).
    rq_busy : In(1)
        The requantization engine holds a REQUANT.
    rq_issue : Out(1)
        A REQUANT is taken in this cycle (its arguments are ``cmd.payload``'s, its number
        ``x_seq``).

    Latency: a command taken in cycle t is in ``xn`` or at the queue's head from t + 1.

    Parameters
    ----------
    load_queue_depth : int
        Entries of the LOAD queue.

    Raises
    ------
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, load_queue_depth):
        check_param("load_queue_depth", load_queue_depth)
        self._depth = load_queue_depth
        super().__init__({
            "cmd": In(stream.Signature(command_layout())),
            "ld": Out(stream.Signature(load_entry_layout())),
            "xn": Out(command_layout()),
            "xn_valid": Out(1),
            "xn_seq": Out(SEQ),
            "xn_take": In(1),
            "x_seq": Out(SEQ),
            "xn_hold": Out(1),
            "rq_busy": In(1),
            "rq_issue": Out(1),
        })

    @property
    def load_queue_depth(self) -> int:
        """Entries of the LOAD queue."""
        return self._depth

    @property
    def latency(self) -> int:
        """Cycles from taking a command to handing it over."""
        return 1

    def elaborate(self, platform):
        m = Module()
        cmd_op = Value.cast(self.cmd.payload.op)
        is_load = cmd_op == Op.LOAD
        xn, xn_valid, xn_seq, x_seq = self.xn, self.xn_valid, self.xn_seq, self.x_seq
        xn_op = Value.cast(xn.op)
        m.d.comb += self.xn_hold.eq((xn_op == Op.BARRIER) | (xn_op == Op.STATUS)
                                    | ((xn_op == Op.CLEAR) & Value.cast(xn.args.clear.counters)))
        entry = load_entry_layout()
        ld_queue = m.submodules.ld_queue = SyncFIFO(width=entry.size, depth=self._depth)
        # REQUANT goes straight to the requantization engine (one at a time), numbered in order
        is_rq = cmd_op == Op.REQUANT
        m.d.comb += self.cmd.ready.eq(Mux(is_load, ld_queue.w_rdy,
                                          Mux(is_rq, ~self.rq_busy, ~xn_valid | self.xn_take)))
        take = self.cmd.valid & self.cmd.ready
        m.d.comb += self.rq_issue.eq(take & is_rq)
        ld_in = data.View(entry, ld_queue.w_data)
        m.d.comb += [*(getattr(ld_in.cmd, name).eq(getattr(self.cmd.payload.args.load, name))
                       for name in LOAD_FIELDS),
                     ld_in.need.eq(x_seq),
                     ld_queue.w_en.eq(take & is_load)]
        m.d.comb += [self.ld.valid.eq(ld_queue.r_rdy), self.ld.payload.eq(ld_queue.r_data),
                     ld_queue.r_en.eq(self.ld.ready)]
        with m.If(take & ~is_load):
            m.d.sync += x_seq.eq(x_seq + 1)
        with m.If(take & ~is_load & ~is_rq):
            m.d.sync += [xn.eq(self.cmd.payload), xn_valid.eq(1), xn_seq.eq(x_seq)]
        with m.Elif(self.xn_take):
            m.d.sync += xn_valid.eq(0)
        return m

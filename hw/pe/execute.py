"""The PE's execute engine control: the command register, the state machine that runs GEMM,
OUTPUT, CLEAR, SEND, RECV, BARRIER and STATUS in program order, and CLEAR itself (paper
Sections 4.1 and 5.2; ``docs/pe.md``, "Engines and synchronisation")."""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ...isa import Op
from ..checked import check_param
from ..isa import command_layout, op_layout
from .common import SEQ, check_bool, older


__all__ = ["EXEC_STATES", "ExecuteEngine", "ClearEngine"]


#: The execute engine's multi-cycle states (one ``in_<name>`` output each), left on ``done``.
EXEC_STATES = ("CLEAR", "STATUS", "SEND", "RECV", "OUTPUT")


class ExecuteEngine(wiring.Component):
    """Takes the decoder's next execute command (``xn``) into its command register (``xc``)
    and runs it. GEMM waits for its buffer flag (``wait``) and, with ``rq_wait``, for every
    REQUANT taken before it, then hands its descriptor to the GEMM issue and the sink
    (``gemm_start``; a GEMM with an empty loop nest only releases its buffer) and issues its
    beats (``issuing``); in the cycle of its last beat the next GEMM, if decoded, ready and a
    descriptor slot free, starts (:attr:`~elmoe3d.hw.pe.PE.gemm_gap` 0). A GEMM with
    ``acc_hold`` (K-chained, no result) needs no descriptor slot, so the ``acc_cont`` GEMM
    after it follows back to back as well. The other commands first wait until every earlier
    GEMM and REQUANT has completed (DRAIN; BARRIER and ``CLEAR counters`` also for the LOADs
    before them to finish, the later ones held in the load engine meanwhile), then run in
    their state (``in_<name>``, :data:`EXEC_STATES`) until ``done``. A command that finishes (a GEMM's
    last read, ``done``, BARRIER's one cycle) takes the next decoded command in the same
    cycle.

    Ports
    -----
    xn, xn_valid, xn_seq : In
        The decoder's next execute command and its number.
    xn_take : Out(1)
        ``xn`` is taken in this cycle.
    xc, xc_seq : Out
        The command being executed.
    full : In(2)
        The WMEM buffer flags.
    rq_busy, rq_seq : In
        The requantization engine's REQUANT (if any) and its number.
    dq_valid : In(1)
        The sink's pending descriptor slot is taken.
    step, final : In(1)
        The GEMM issue makes a beat's reads; it is the GEMM's last.
    gemm_busy : In(1)
        An earlier GEMM is still issuing, in the tile or in a sink.
    output_busy : In(1)
        What OUTPUT waits for instead of ``gemm_busy`` (the PE's choice: with two OUT banks
        the COMBINE sink's writes are left out, OUTPUT's reads wait for those to their words).
    ld_busy : In(1)
        The load engine runs or holds a LOAD taken before the command in ``xc`` (LOADs after
        a BARRIER or ``CLEAR counters`` queue meanwhile and do not count).
    done : In(1)
        The current multi-cycle command finishes in this cycle.
    idle, busy, barrier, issuing, start : Out(1)
        IDLE; not IDLE; a BARRIER (or ``CLEAR counters``) drains; GEMM beats may be issued;
        DRAIN hands over to the command's state in this cycle.
    hold_loads : Out(1)
        A BARRIER, ``CLEAR counters`` or STATUS drains: the LOADs after it take no word yet.
    in_clear, in_status, in_send, in_recv, in_output : Out(1)
        The state (:data:`EXEC_STATES`).
    wait_flag, rq_wait : Out(1)
        A GEMM waits for its buffer flag; a command waits for a REQUANT.
    release : Out(1)
        The GEMM in ``xc`` releases its buffer (``full[xc.wbuf]`` cleared) in this cycle.
    start_cur, start_next : Out(1)
        A GEMM starts: the one in ``xc``, or (back to back, taken from ``xn`` in this cycle)
        the one in ``xn``.
    """

    def __init__(self):
        super().__init__({
            "xn": In(command_layout()),
            "xn_valid": In(1),
            "xn_seq": In(SEQ),
            "xn_take": Out(1),
            "xc": Out(command_layout()),
            "xc_seq": Out(SEQ),
            "full": In(2),
            "rq_busy": In(1),
            "rq_seq": In(SEQ),
            "dq_valid": In(1),
            "step": In(1),
            "final": In(1),
            "gemm_busy": In(1),
            "output_busy": In(1),
            "ld_busy": In(1),
            "done": In(1),
            "idle": Out(1),
            "busy": Out(1),
            "barrier": Out(1),
            "hold_loads": Out(1),
            "issuing": Out(1),
            "start": Out(1),
            **{f"in_{name.lower()}": Out(1) for name in EXEC_STATES},
            "wait_flag": Out(1),
            "rq_wait": Out(1),
            "release": Out(1),
            "start_cur": Out(1),
            "start_next": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        xn, xn_valid, xn_seq, xc, xc_seq = self.xn, self.xn_valid, self.xn_seq, self.xc, self.xc_seq
        xn_op, xop = Value.cast(xn.op), Value.cast(xc.op)
        full, dq_valid = self.full, self.dq_valid
        st = {name: getattr(self, f"in_{name.lower()}") for name in EXEC_STATES}

        def gx(name):
            return Value.cast(getattr(xc.args.gemm, name))

        def rq_before(seq):
            """A REQUANT taken before the command ``seq`` has not completed."""
            return self.rq_busy & older(self.rq_seq, seq)

        def gemm_view(view):
            return lambda name: Value.cast(getattr(view.args.gemm, name))

        def gemm_ready(f, seq, releasing=Const(0, 1)):
            return ((~f("wait") | (Mux(f("wbuf"), full[1], full[0]) & ~releasing))
                    & (~f("rq_wait") | ~rq_before(seq)))

        def gemm_empty(f):
            return (f("row_blocks") == 0) | (f("col_blocks") == 0) | (f("groups") == 0)

        def slot_free(f):
            """The GEMM's sink descriptor has a slot (a GEMM with ``acc_hold`` has none)."""
            return ~dq_valid | f("acc_hold")

        def take_next():
            m.d.comb += self.xn_take.eq(1)
            m.d.sync += [xc.eq(xn), xc_seq.eq(xn_seq)]

        # BARRIER, and CLEAR of the counters, wait for the LOADs before them to finish, the later
        # ones held until they start, so that words_loaded counts exactly the LOADs after them
        x_is_barrier = (xop == Op.BARRIER) | ((xop == Op.CLEAR)
                                              & Value.cast(xc.args.clear.counters))
        with m.FSM(name="ex") as ex_fsm:
            def dispatch():
                """Take the decoded next command, if any, into its first state (else IDLE)."""
                with m.If(xn_valid):
                    take_next()
                    with m.Switch(xn_op):
                        with m.Case(Op.GEMM):
                            m.next = "GEMM_START"
                        with m.Case(Op.BARRIER, Op.CLEAR, Op.STATUS, Op.SEND, Op.RECV,
                                    Op.OUTPUT):
                            m.next = "DRAIN"
                        with m.Default():
                            m.next = "IDLE"
                with m.Else():
                    m.next = "IDLE"

            with m.State("IDLE"):
                m.d.comb += self.idle.eq(1)
                dispatch()
            with m.State("GEMM_START"):
                ready = gemm_ready(gx, xc_seq)
                m.d.comb += [self.wait_flag.eq(~ready),
                             self.rq_wait.eq(gx("rq_wait") & rq_before(xc_seq))]
                with m.If(ready & gemm_empty(gx)):
                    with m.If(gx("release")):
                        m.d.comb += self.release.eq(1)
                    dispatch()
                with m.Elif(ready & slot_free(gx)):
                    m.d.comb += self.start_cur.eq(1)
                    m.next = "GEMM_RUN"
            with m.State("GEMM_RUN"):
                m.d.comb += self.issuing.eq(1)
                with m.If(self.step & self.final):
                    with m.If(gx("release")):
                        m.d.comb += self.release.eq(1)
                    # the next GEMM, decoded and ready, issues its first beat in the next cycle
                    nx = gemm_view(xn)
                    releasing = gx("release") & (nx("wbuf") == gx("wbuf"))
                    with m.If(xn_valid & (xn_op == Op.GEMM) & gemm_ready(nx, xn_seq, releasing)
                              & ~gemm_empty(nx) & slot_free(nx)):
                        take_next()
                        m.d.comb += self.start_next.eq(1)
                    with m.Else():
                        dispatch()
            with m.State("DRAIN"):
                m.d.comb += [self.barrier.eq(x_is_barrier), self.rq_wait.eq(rq_before(xc_seq)),
                             self.hold_loads.eq(x_is_barrier | (xop == Op.STATUS))]
                busy = Mux(xop == Op.OUTPUT, self.output_busy, self.gemm_busy)
                with m.If(~busy & ~rq_before(xc_seq) & ~(x_is_barrier & self.ld_busy)):
                    m.d.comb += self.start.eq(1)
                    with m.Switch(xop):
                        with m.Case(Op.BARRIER):
                            m.next = "BARRIER"
                        for op in (Op.CLEAR, Op.STATUS, Op.SEND, Op.RECV, Op.OUTPUT):
                            with m.Case(op):
                                m.next = op.name
            # a command that finishes hands over to the next one in the same cycle
            with m.State("BARRIER"):
                dispatch()
            for name in st:
                with m.State(name):
                    m.d.comb += st[name].eq(1)
                    with m.If(self.done):
                        dispatch()
        m.d.comb += self.busy.eq(~ex_fsm.ongoing("IDLE"))
        return m


class ClearEngine(wiring.Component):
    """CLEAR: the sticky flags and the counters when it starts; OUT and the row maxima in one
    cycle through their valid bits (``valid_bits``), or zeros written a row a cycle, every OUT
    bank and ROWMAX at once, for ``cycles`` cycles (:attr:`~elmoe3d.hw.pe.PE.clear_cycles`).

    Ports
    -----
    start : In(1)
        CLEAR starts (``args`` valid).
    args : In, ``op_layout(Op.CLEAR)``
    active : In(1)
        The execute engine is in CLEAR.
    flags, counters : Out(1)
        Clear the sticky flags / the counters in this cycle.
    clear_out, clear_rowmax : Out(1)
        Clear OUT / ROWMAX (valid bits: in this cycle; else write zeros into row ``row``).
    row : Out
        The row written (no valid bits).
    done : Out(1)
        CLEAR finishes in this cycle.

    Parameters
    ----------
    valid_bits : bool
        OUT and ROWMAX have valid bits.
    cycles : int
        Cycles of a CLEAR of OUT or ROWMAX without valid bits.

    Raises
    ------
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, valid_bits, cycles):
        check_bool("valid_bits", valid_bits)
        check_param("cycles", cycles)
        self._valid_bits, self._cycles = valid_bits, cycles
        super().__init__({
            "start": In(1),
            "args": In(op_layout(Op.CLEAR)),
            "active": In(1),
            "flags": Out(1),
            "counters": Out(1),
            "clear_out": Out(1),
            "clear_rowmax": Out(1),
            "row": Out(range(cycles)),
            "done": Out(1),
        })

    @property
    def cycles(self) -> int:
        """Cycles of CLEAR with ``out`` or ``rowmax``, from its start to its last write."""
        return 1 if self._valid_bits else self._cycles

    def elaborate(self, platform):
        m = Module()
        with m.If(self.start):
            m.d.comb += [self.flags.eq(self.args.flags), self.counters.eq(self.args.counters)]
        m.d.comb += [self.clear_out.eq(self.active & self.args.out),
                     self.clear_rowmax.eq(self.active & self.args.rowmax)]
        if self._valid_bits:
            m.d.comb += self.done.eq(self.active)
        else:
            n_clr, clr_row = self._cycles, self.row
            clr_last = (clr_row == n_clr - 1) | ~(self.clear_out | self.clear_rowmax)
            m.d.comb += self.done.eq(self.active & clr_last)
            with m.If(self.active):
                m.d.sync += clr_row.eq(Mux(clr_last, 0, clr_row + 1))
        return m

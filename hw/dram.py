"""Generic DRAM channel controller: requests in, ACT/PRE/RD/WR/REF out under the channel's
timing, read data out in order (issue 4; paper Sections 4.1 and 6, Table 1).

One block serves both memory tiers: :class:`~elmoe3d.hw.hb_ctrl.HBController` (an HB bank per
PE) and each channel of :class:`~elmoe3d.hw.ext_ctrl.ExtController` (LPDDR5) are this
controller with their :class:`~elmoe3d.config.DramConfig`. Its request payload, error flags
and DRAM bus are defined in :mod:`elmoe3d.hw.dram_layouts` (importable from here).
"""

from __future__ import annotations

from fractions import Fraction

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..checks import check_int
from ..config import DramConfig
from .checked import CheckedComponent
from .dram_layouts import RowKind, dram_bus_signature, dram_errors_layout, request_layout
from .layouts import STICKY_LATENCY, address_bits, sticky_flags


__all__ = ["RowKind", "request_layout", "dram_bus_signature", "dram_errors_layout",
           "DramController"]


def _count_up_down(m, counter, inc, dec):
    """``counter`` (sync) + 1 on a cycle with ``inc`` and not ``dec``, - 1 on one with ``dec``
    and not ``inc``; unchanged otherwise (both: one in, one out)."""
    with m.If(inc & ~dec):
        m.d.sync += counter.eq(counter + 1)
    with m.Elif(dec & ~inc):
        m.d.sync += counter.eq(counter - 1)


class _Timers:
    """Down-counters of DRAM clocks, one per timing constraint and scope. A command loads a
    counter with ``L - 1`` (L = the constraint in clocks) unless it holds more; every clock
    edge counts down to 0; the constrained command may issue while the counter is 0."""

    def __init__(self):
        self._loads = {}
        self._sigs = {}

    def new(self, name, maxval):
        sig = Signal(range(max(2, maxval)), name=name)
        self._loads[id(sig)] = []
        self._sigs[id(sig)] = sig
        return sig

    def load(self, sig, cond, clocks):
        if clocks > 1:
            self._loads[id(sig)].append((cond, clocks - 1))

    def elaborate(self, m, tick):
        for key, loads in self._loads.items():
            sig = self._sigs[key]
            nxt = Mux(sig != 0, sig - 1, 0)
            for cond, value in loads:
                nxt = Mux(cond & (nxt < value), value, nxt)
            with m.If(tick):
                m.d.sync += sig.eq(nxt)


class DramController(CheckedComponent):
    """Controller of one DRAM channel: in-order requests, open-page policy, row commands
    looked ahead, refresh on idle banks.

    Clocking: the controller runs in the logic clock (``clock_ghz``, 1 GHz on the die) and
    issues commands only on DRAM command-clock edges, which a phase accumulator places on the
    logic cycles ``c`` where ``floor((c + 1) q / p)`` increments (``p / q`` = tCK in logic
    cycles exactly: 5/2 for the HB bank's 2.5 ns, 5/4 for LPDDR5's 1.25 ns). All timing
    counters count DRAM clocks (:meth:`DramConfig.ck`), so the command stream is exactly what
    a controller in the DRAM clock domain would issue, at the DRAM's full rate.

    Address mapping (:meth:`DramConfig.decode`): burst address bits, LSB first, bank group,
    column, bank within the group, row. Streaming reads alternate bank groups on every burst
    (tCCD_S apart), keep ``bank_groups`` rows open, and reach the next banks while the
    current rows are read, so ACT and PRE are hidden.

    Pipeline:

    1. Burst generator: takes a request, writes one decoded burst (write, bank, row,
       column) per logic cycle into the burst queue (:attr:`queue_depth` entries).
    2. Row preparation (look-ahead pointer ``prep``, up to the whole queue ahead of the
       head): an entry whose bank has its row open is *prepared* (its bank's pending count
       goes up); a closed bank gets an ACT (tRP/tRC/tRFC per bank, tRRD_S/tRRD_L, tFAW over
       the channel, tPBR2ACT); a bank open at another row gets a PRE once no prepared entry
       still needs the open row (tRAS, tRTP, write recovery, tPPD). Open-page policy: rows
       stay open until a conflict or a refresh closes them.
    3. Column issue at the head, in request order: RD/WR of a prepared entry (tRCD, tCCD_L in
       the bank group, tCCD_S in the channel, WR->RD tWTR_S/L, RD->WR turnaround); a RD only
       when the read buffer has room for its data (credits), a WR only with its ``wdata``
       beat.
    4. Refresh (:attr:`DramConfig.per_bank_refresh`): one refresh is owed every
       ``refresh_interval_ck`` clocks. Per-bank: the controller refreshes, in any order
       within a round, a unit none of whose banks is at the bank index (within its group) of
       an entry anywhere in the queue (PRE first if a bank is open): a sequential stream
       alternates bank groups on every burst, so a queued entry for bank (ba, bg) means the
       stream reads (ba, bg') of every other group a few bursts later, which the queue may
       not hold yet (a stream paced by its client, as the die's EXT chunks are). Refreshing
       any unit without a queued entry instead (before 2026-12-04) refreshed such banks and
       stalled the die bench's EXT stream for about tRFCpb (112 LPDDR5 clocks, 140 ns) twice
       in its 16-token verify layer at 8 channels (``docs/memory.md``, "Refresh"). A stream
       still waits when a refresh lands on the index it moves to at the end of a row, or on
       banks it reads after draining the queue (the controller does not see where the next
       request goes). When every unrefreshed unit is at a queued entry's bank index (random
       traffic) it falls back to one none of whose own banks is queued (the earlier rule:
       without it, 2 KB random-row requests on the HB bank lost 2 points of efficiency to
       urgent refreshes); owed refreshes accumulate while every unrefreshed unit has a queued
       bank. When
       ``max_postponed / 2`` refreshes are owed it becomes urgent: the look-ahead stops
       before the lowest unrefreshed unit, which is drained, precharged and refreshed.
       All-bank mode does the same with every bank in one unit (REFAB). Draining needs the
       head of the queue to issue; a client can stop it (a write whose ``wdata`` does not
       come, ``rdata`` not taken with the read buffer full), and then the unit's prepared
       entries keep its rows open. When ``max_postponed`` refreshes are owed (JEDEC: a
       controller must not postpone more than 8) the refresh is *forced*: the look-ahead is
       rolled back to the head (no entry prepared, so no row is held open for one), the
       unit is precharged and refreshed, and the look-ahead reopens the rows afterwards;
       the sticky ``errors.refresh_overflow`` is set. Once forced, every urgent unit held
       open is forced until the debt is below ``max_postponed / 2`` again. The debt counter
       stops at ``max_postponed + 1`` (a refresh owed beyond it would be dropped); forcing
       keeps it out of reach while the refresh interval (``refresh_interval_ck``: 97 HB
       clocks, 390 LPDDR5) is longer than tRFCpb (64, 112), so a unit refreshed last in
       one round is ready for the next; and the flag is set before it could be reached.
    5. Read data: the device's bursts enter a FIFO of :attr:`read_buffer` bursts and leave on
       ``rdata`` in request order; backpressure on ``rdata`` only delays later RDs.

    Commands: HB-style ``dual_command_bus`` configurations issue a row and a column command
    in the same clock; otherwise a column command has priority and a row command takes a
    clock without one.

    Ports
    -----
    req : In stream, :func:`request_layout` (``addr`` in bursts of ``burst_bytes`` bytes)
    wdata : In stream, ``burst_bytes * 8`` bits: write bursts, in request order
    rdata : Out stream, ``burst_bytes * 8`` bits: read bursts, in request order
    dram : Out :func:`dram_bus_signature` -- to the DRAM channel (in simulation, the model)
    errors : Out :func:`dram_errors_layout`
        Sticky error flags (``refresh_overflow``), set in the cycle after the event
        (:attr:`errors_latency`) -- a level: in every cycle the debt is at the limit --,
        cleared only by ``errors_clear`` (or reset) once the debt is below the limit.
    errors_clear : In :func:`dram_errors_layout`
        Write-1-to-clear: a 1 clears that flag in the next cycle, unless the same cycle sets
        it again (setting wins).

    Parameters
    ----------
    dram : DramConfig
        Channel geometry and timing, with ``rows`` set (``arch.hb``, ``arch.ext``).
    clock_ghz : float
        Logic clock; the DRAM command clock must not be faster.
    queue_depth : int
        Burst-queue entries (power of two, >= 4); the look-ahead reach.
    read_buffer : int
        Read-data FIFO in bursts (>= 2); must cover RL + burst clocks at full rate.
    length_bits : int
        Width of the request ``length`` field (1..32).

    Raises
    ------
    TypeError
        ``dram`` is not a DramConfig.
    ValueError
        A parameter is out of range (the message names it); ``dram.max_postponed`` < 2
        (the urgent and the forced refresh levels would coincide).
    """

    @classmethod
    def check(cls, *, dram, clock_ghz, queue_depth, read_buffer, length_bits):
        """The constructor's checks (:class:`~elmoe3d.hw.checked.CheckedComponent`):
        raises before the object exists."""
        if not isinstance(dram, DramConfig):
            raise TypeError(f"dram: expected a DramConfig, got {type(dram).__name__}")
        if dram.rows is None:
            raise ValueError("dram: rows is not set; use arch.hb / arch.ext (rows derived from "
                             "the capacity) or DramConfig.with_capacity()")
        if not isinstance(clock_ghz, (int, float)) or isinstance(clock_ghz, bool) \
                or not clock_ghz > 0:
            raise ValueError(f"clock_ghz: expected a positive number, got {clock_ghz!r}")
        ratio = Fraction(str(dram.tck_ns)) * Fraction(str(clock_ghz))
        if ratio < 1:
            raise ValueError(f"clock_ghz: the DRAM command clock ({1 / dram.tck_ns:g} GHz) must "
                             f"not be faster than the logic clock ({clock_ghz:g} GHz)")
        if ratio.denominator > 64:
            raise ValueError(f"clock_ghz: tCK = {ratio} logic cycles; expected a ratio with a "
                             f"denominator <= 64")
        for name, value, lo in (("queue_depth", queue_depth, 4), ("read_buffer", read_buffer, 2),
                                ("length_bits", length_bits, 1)):
            check_int(name, value, lo, numpy=False)
        if queue_depth & (queue_depth - 1):
            raise ValueError(f"queue_depth: expected a power of two, got {queue_depth}")
        if length_bits > 32:
            raise ValueError(f"length_bits: expected at most 32, got {length_bits}")
        if dram.max_postponed < 2:
            raise ValueError(f"dram: max_postponed = {dram.max_postponed}; this controller "
                             f"needs at least 2 (a refresh becomes urgent at max_postponed / 2 "
                             f"owed and is forced at max_postponed owed: with fewer the two "
                             f"coincide and every owed refresh is forced and flagged)")

    def __init__(self, *, dram: DramConfig, clock_ghz: float, queue_depth: int = 128,
                 read_buffer: int = 16, length_bits: int = 16):
        ratio = Fraction(str(dram.tck_ns)) * Fraction(str(clock_ghz))
        self._dram, self._clock_ghz, self._ratio = dram, clock_ghz, ratio
        self._queue_depth, self._read_buffer, self._length_bits = \
            queue_depth, read_buffer, length_bits
        self._addr_bits = address_bits(dram.bursts)
        super().__init__({
            "req": In(stream.Signature(request_layout(self._addr_bits, length_bits))),
            "wdata": In(stream.Signature(dram.burst_bytes * 8)),
            "rdata": Out(stream.Signature(dram.burst_bytes * 8)),
            "dram": Out(dram_bus_signature(dram)),
            "errors": Out(dram_errors_layout()),
            "errors_clear": In(dram_errors_layout()),
        })

    @property
    def config(self) -> DramConfig:
        return self._dram

    @property
    def clock_ghz(self) -> float:
        return self._clock_ghz

    @property
    def queue_depth(self) -> int:
        return self._queue_depth

    @property
    def read_buffer(self) -> int:
        return self._read_buffer

    @property
    def addr_bits(self) -> int:
        """Width of the request address (bursts): log2 of the capacity in bursts."""
        return self._addr_bits

    @property
    def length_bits(self) -> int:
        return self._length_bits

    @property
    def burst_bytes(self) -> int:
        return self._dram.burst_bytes

    @property
    def tck_logic(self) -> Fraction:
        """DRAM command-clock period in logic cycles (exact)."""
        return self._ratio

    @property
    def read_latency_ck(self) -> int:
        """DRAM clocks from the ACT of a closed bank to its first read burst complete:
        tRCD + RL + burst (the logic-side latency adds the queue, the clock-edge phase and the
        read FIFO; the benches measure it)."""
        return self._dram.first_read_ck

    @property
    def errors_latency(self) -> int:
        """Cycles from the debt reaching the postponing limit, or from an ``errors_clear``
        strobe (the debt below the limit), to ``errors`` showing it."""
        return STICKY_LATENCY

    @property
    def peak_bytes_per_cycle(self) -> float:
        """Peak data rate in bytes per logic cycle (51.2 for the HB bank at 1 GHz)."""
        return self._dram.peak_gbps / self._clock_ghz

    def elaborate(self, platform):
        m = Module()
        d = self._dram
        ck = d.ck
        nb, ng = d.banks, d.bank_groups
        units = d.refresh_units
        Q = self._queue_depth
        bgb, colb, bab = (ng - 1).bit_length(), (d.columns - 1).bit_length(), \
            (d.banks_per_group - 1).bit_length()
        bankb, rowb, colw = address_bits(nb), address_bits(d.rows), address_bits(d.columns)
        p, q = self._ratio.numerator, self._ratio.denominator
        bus = self.dram

        # -- DRAM command-clock edges on the logic clock --
        phase = Signal(range(p))
        tick = Signal()
        m.d.comb += tick.eq(phase + q >= p)
        m.d.sync += phase.eq(Mux(tick, phase + q - p, phase + q))
        m.d.comb += bus.tick.eq(tick)

        # -- burst queue --
        entry = data.StructLayout({"write": unsigned(1), "bank": unsigned(bankb),
                                   "row": unsigned(rowb), "col": unsigned(colw)})
        m.submodules.queue = queue = Memory(shape=entry, depth=Q, init=[])
        wport = queue.write_port()
        hport = queue.read_port(domain="comb")
        pport = queue.read_port(domain="comb")
        sport = queue.read_port(domain="comb")
        ptrw = Q.bit_length()
        wp, hp, pp, sp = Signal(ptrw), Signal(ptrw), Signal(ptrw), Signal(ptrw)
        full = Signal()
        m.d.comb += [full.eq((wp - hp)[:ptrw] == Q),
                     wport.addr.eq(wp[:ptrw - 1]), hport.addr.eq(hp[:ptrw - 1]),
                     pport.addr.eq(pp[:ptrw - 1])]
        # the precharge scout runs ahead of the look-ahead pointer (never behind it)
        sp_cur = Signal(ptrw)
        m.d.comb += [sp_cur.eq(Mux((sp - hp)[:ptrw] < (pp - hp)[:ptrw], pp, sp)),
                     sport.addr.eq(sp_cur[:ptrw - 1])]

        # -- 1. burst generator --
        cur_valid, cur_write = Signal(), Signal()
        cur_addr = Signal(self._addr_bits)
        cur_left = Signal(self._length_bits)
        push = Signal()
        last = Signal()
        m.d.comb += [push.eq(cur_valid & ~full), last.eq(cur_left == 1),
                     self.req.ready.eq(~cur_valid | (push & last))]
        a = cur_addr
        m.d.comb += [wport.en.eq(push),
                     wport.data.write.eq(cur_write),
                     wport.data.bank.eq(Cat(a[:bgb], a[bgb + colb:bgb + colb + bab])),
                     wport.data.col.eq(a[bgb:bgb + colb]),
                     wport.data.row.eq(a[bgb + colb + bab:])]
        with m.If(push):
            m.d.sync += [wp.eq(wp + 1), cur_addr.eq(cur_addr + 1), cur_left.eq(cur_left - 1)]
            with m.If(last):
                m.d.sync += cur_valid.eq(0)
        with m.If(self.req.valid & self.req.ready):
            m.d.sync += [cur_valid.eq(self.req.payload.length != 0),
                         cur_write.eq(self.req.payload.write),
                         cur_addr.eq(self.req.payload.addr),
                         cur_left.eq(self.req.payload.length)]

        # -- bank state --
        is_open = [Signal(name=f"open{b}") for b in range(nb)]
        open_row = [Signal(rowb, name=f"open_row{b}") for b in range(nb)]
        pending = [Signal(range(Q + 1), name=f"pending{b}") for b in range(nb)]
        a_open, a_row, a_pending = Array(is_open), Array(open_row), Array(pending)

        t = _Timers()
        act_wait = [t.new(f"act_wait{b}", max(ck("tRC"), ck("tRP"), ck("tRFCab"),
                                              ck("tRFCpb"))) for b in range(nb)]
        pre_wait = [t.new(f"pre_wait{b}", max(ck("tRAS"), ck("tRTP"), d.wr_to_pre_ck))
                    for b in range(nb)]
        rcd_wait = [t.new(f"rcd_wait{b}", ck("tRCD")) for b in range(nb)]
        ccd_l = [t.new(f"ccd_l{g}", ck("tCCD_L")) for g in range(ng)]
        wtr_l = [t.new(f"wtr_l{g}", d.wtr_ck(True)) for g in range(ng)]
        rrd_l = [t.new(f"rrd_l{g}", ck("tRRD_L")) for g in range(ng)]
        ccd_s = t.new("ccd_s", max(ck("tCCD_S"), d.burst_ck))
        wtr_s = t.new("wtr_s", d.wtr_ck(False))
        rtw = t.new("rtw", d.rtw_ck)
        rrd_s = t.new("rrd_s", ck("tRRD_S"))
        ppd = t.new("ppd", ck("tPPD"))
        pbr2act = t.new("pbr2act", ck("tPBR2ACT"))
        pbr2pbr = t.new("pbr2pbr", ck("tPBR2PBR"))
        faw = [t.new(f"faw{i}", ck("tFAW")) for i in range(4)]
        faw_ptr = Signal(2)
        a_act_wait, a_pre_wait, a_rcd_wait = Array(act_wait), Array(pre_wait), Array(rcd_wait)
        a_ccd_l, a_wtr_l, a_rrd_l, a_faw = Array(ccd_l), Array(wtr_l), Array(rrd_l), Array(faw)

        # -- 3. column issue at the head --
        outstanding = Signal(range(self._read_buffer + 1))
        he = hport.data
        hg = he.bank[:bgb] if bgb else Const(0, 1)
        h_ready = Signal()
        col_go = Signal()
        m.d.comb += [
            h_ready.eq((hp != pp) & (a_rcd_wait[he.bank] == 0) & (a_ccd_l[hg] == 0)
                       & (ccd_s == 0)
                       & Mux(he.write, (rtw == 0) & self.wdata.valid,
                             (a_wtr_l[hg] == 0) & (wtr_s == 0)
                             & (outstanding < self._read_buffer))),
            col_go.eq(tick & h_ready),
            self.wdata.ready.eq(col_go & he.write),
            bus.col_valid.eq(col_go), bus.col_write.eq(he.write), bus.col_bank.eq(he.bank),
            bus.col_addr.eq(he.col), bus.col_wdata.eq(self.wdata.payload),
        ]
        col_rd, col_wr = col_go & ~he.write, col_go & he.write
        with m.If(col_go):
            m.d.sync += hp.eq(hp + 1)

        # -- 2. row preparation --
        pe_ = pport.data
        pg = pe_.bank[:bgb] if bgb else Const(0, 1)
        p_valid = Signal()
        p_hit = Signal()
        ref_block = Signal(nb)
        m.d.comb += [p_valid.eq(pp != wp),
                     p_hit.eq(a_open[pe_.bank] & (a_row[pe_.bank] == pe_.row))]
        blocked = ref_block.bit_select(pe_.bank, 1)
        pass_go = Signal()
        p_pre_ok, p_act_ok = Signal(), Signal()
        m.d.comb += [
            pass_go.eq(p_valid & p_hit & ~blocked),
            p_pre_ok.eq(p_valid & a_open[pe_.bank] & ~p_hit & (a_pending[pe_.bank] == 0)
                        & (a_pre_wait[pe_.bank] == 0) & (ppd == 0)),
            p_act_ok.eq(p_valid & ~a_open[pe_.bank] & ~blocked & (a_act_wait[pe_.bank] == 0)
                        & (rrd_s == 0) & (a_rrd_l[pg] == 0) & (a_faw[faw_ptr] == 0)
                        & (pbr2act == 0)),
        ]
        with m.If(pass_go):
            m.d.sync += pp.eq(pp + 1)
        # entries per bank anywhere in the queue (the refresh avoids banks the queue needs)
        queued = [Signal(range(Q + 1), name=f"queued{b}") for b in range(nb)]
        for b in range(nb):
            _count_up_down(m, queued[b], push & (wport.data.bank == b), col_go & (he.bank == b))
        # precharge scout: closes a bank open at another row than a later entry needs, once no
        # prepared entry needs that row, while the look-ahead waits on earlier banks
        se = sport.data
        s_valid, s_conflict, s_pre_ok = Signal(), Signal(), Signal()
        m.d.comb += [
            s_valid.eq(sp_cur != wp),
            s_conflict.eq(a_open[se.bank] & (a_row[se.bank] != se.row)),
            s_pre_ok.eq(s_valid & s_conflict & (a_pending[se.bank] == 0)
                        & (a_pre_wait[se.bank] == 0) & (ppd == 0)
                        & ~(p_valid & (pe_.bank == se.bank))),
        ]
        for b in range(nb):
            _count_up_down(m, pending[b], pass_go & (pe_.bank == b), col_go & (he.bank == b))

        # -- 4. refresh --
        interval = d.refresh_interval_ck
        ref_timer = Signal(range(interval))
        owed = Signal(range(d.max_postponed + 2))
        urgent = Signal()
        force = Signal()                   # the JEDEC limit: no further postponing
        m.d.comb += [urgent.eq(owed >= max(1, d.max_postponed // 2)),
                     force.eq(owed >= d.max_postponed)]
        done = Signal(units)
        unit_of = [b % units for b in range(nb)]
        members = [[b for b in range(nb) if unit_of[b] == u] for u in range(units)]
        # idle: no entry anywhere in the queue at the bank index (within its group) of any of
        # the unit's banks. A streaming read alternates bank groups on every burst
        # (DramConfig.decode), so an entry for bank (ba, bg) means the stream reads (ba, bg')
        # of the other groups within a few bursts, entries the queue may not hold yet
        bpg = nb // ng
        ba_queued = [Cat(*[queued[b] != 0 for b in range(nb) if b // ng == k]).any()
                     for k in range(bpg)]
        # free: no entry queued for the unit's own banks (the fallback when every unit is at a
        # queued bank index: random traffic)
        idle, free = Signal(units), Signal(units)
        for u in range(units):
            m.d.comb += [
                idle[u].eq(
                    ~Cat(*[ba_queued[k] for k in sorted({b // ng for b in members[u]})]).any()),
                free[u].eq(Cat(*[queued[b] == 0 for b in members[u]]).all())]
        # lowest unrefreshed unit (urgent) / lowest unrefreshed idle unit
        cand, cand_valid = Signal(range(max(2, units))), Signal()
        urgent_unit = Signal(range(max(2, units)))
        for u in reversed(range(units)):
            with m.If(~done[u]):
                m.d.comb += urgent_unit.eq(u)
        with m.If(urgent):
            m.d.comb += [cand.eq(urgent_unit), cand_valid.eq(owed != 0)]
        with m.Else():
            # one priority encoder over the idle units, or the free ones when none is idle
            # (idle implies free; two chained encoders cost the HB controller 70 ps)
            pick = Signal(units)
            m.d.comb += [pick.eq(Mux((~done & idle).any(), ~done & idle, ~done & free)),
                         cand_valid.eq((owed != 0) & (~done & free).any())]
            for u in reversed(range(units)):
                with m.If(pick[u]):
                    m.d.comb += cand.eq(u)
        for b in range(nb):
            m.d.comb += ref_block[b].eq(urgent & (urgent_unit == unit_of[b]))
        # per unit: a bank to precharge first, or ready to refresh
        u_pre_ok = Signal(units)
        u_pre_bank = Array(Signal(bankb, name=f"u_pre_bank{u}") for u in range(units))
        u_ref_ok = Signal(units)
        for u in range(units):
            for b in reversed(members[u]):
                with m.If(is_open[b] & (pending[b] == 0) & (pre_wait[b] == 0)):
                    m.d.comb += [u_pre_ok[u].eq(ppd == 0), u_pre_bank[u].eq(b)]
            m.d.comb += u_ref_ok[u].eq(
                Cat(*[~is_open[b] & (act_wait[b] == 0) for b in members[u]]).all()
                & (rrd_s == 0) & (pbr2pbr == 0 if d.per_bank_refresh else 1))
        cand_open = Signal()
        m.d.comb += cand_open.eq(Cat(*[Cat(*[is_open[b] for b in members[u]]).any()
                                       for u in range(units)]).bit_select(cand, 1))
        ref_pre_ok = Signal()
        ref_ok = Signal()
        m.d.comb += [ref_pre_ok.eq(cand_valid & cand_open & u_pre_ok.bit_select(cand, 1)),
                     ref_ok.eq(cand_valid & ~cand_open & u_ref_ok.bit_select(cand, 1))]

        # -- row-command arbitration: refresh first, then the look-ahead --
        row_free = Signal()
        m.d.comb += row_free.eq(tick & (~col_go if not d.dual_command_bus else 1))
        row_go = Signal()
        row_kind = Signal(RowKind)
        row_bank = Signal(bankb)
        with m.If(ref_ok):
            m.d.comb += [row_kind.eq(RowKind.REFPB if d.per_bank_refresh else RowKind.REFAB),
                         row_bank.eq(cand)]
        with m.Elif(ref_pre_ok):
            m.d.comb += [row_kind.eq(RowKind.PRE), row_bank.eq(u_pre_bank[cand])]
        with m.Elif(p_pre_ok):
            m.d.comb += [row_kind.eq(RowKind.PRE), row_bank.eq(pe_.bank)]
        with m.Elif(p_act_ok):
            m.d.comb += [row_kind.eq(RowKind.ACT), row_bank.eq(pe_.bank)]
        with m.Else():
            m.d.comb += [row_kind.eq(RowKind.PRE), row_bank.eq(se.bank)]
        m.d.comb += [
            row_go.eq(row_free & (ref_ok | ref_pre_ok | p_pre_ok | p_act_ok | s_pre_ok)),
            bus.row_valid.eq(row_go), bus.row_kind.eq(row_kind), bus.row_bank.eq(row_bank),
            bus.row_addr.eq(pe_.row),
        ]
        s_pre_go = row_go & ~ref_ok & ~ref_pre_ok & ~p_pre_ok & ~p_act_ok
        with m.If(s_valid & (~s_conflict | s_pre_go)):
            m.d.sync += sp.eq(sp_cur + 1)
        with m.Else():
            m.d.sync += sp.eq(sp_cur)
        is_act = row_go & (row_kind == RowKind.ACT)
        is_pre = row_go & (row_kind == RowKind.PRE)
        is_ref = row_go & ((row_kind == RowKind.REFPB) | (row_kind == RowKind.REFAB))
        rg = row_bank[:bgb] if bgb else Const(0, 1)

        # -- state updates --
        for b in range(nb):
            act_b = is_act & (row_bank == b)
            pre_b = is_pre & (row_bank == b)
            ref_b = is_ref & (cand == unit_of[b])
            rd_b = col_rd & (he.bank == b)
            wr_b = col_wr & (he.bank == b)
            with m.If(act_b):
                m.d.sync += [is_open[b].eq(1), open_row[b].eq(pe_.row)]
            with m.If(pre_b):
                m.d.sync += is_open[b].eq(0)
            t.load(act_wait[b], act_b, ck("tRC"))
            t.load(act_wait[b], pre_b, ck("tRP"))
            t.load(act_wait[b], ref_b, d.refresh_ck)
            t.load(pre_wait[b], act_b, ck("tRAS"))
            t.load(pre_wait[b], rd_b, ck("tRTP"))
            t.load(pre_wait[b], wr_b, d.wr_to_pre_ck)
            t.load(rcd_wait[b], act_b, ck("tRCD"))
        for g in range(ng):
            t.load(ccd_l[g], col_go & (hg == g), ck("tCCD_L"))
            t.load(wtr_l[g], col_wr & (hg == g), d.wtr_ck(True))
            t.load(rrd_l[g], is_act & (rg == g), ck("tRRD_L"))
        t.load(ccd_s, col_go, max(ck("tCCD_S"), d.burst_ck))
        t.load(wtr_s, col_wr, d.wtr_ck(False))
        t.load(rtw, col_rd, d.rtw_ck)
        t.load(rrd_s, is_act, ck("tRRD_S"))
        t.load(ppd, is_pre, ck("tPPD"))
        if d.per_bank_refresh:
            t.load(pbr2act, is_ref, ck("tPBR2ACT"))
            t.load(pbr2pbr, is_ref, ck("tPBR2PBR"))
        for i in range(4):
            t.load(faw[i], is_act & (faw_ptr == i), ck("tFAW"))
        with m.If(is_act):
            m.d.sync += faw_ptr.eq(faw_ptr + 1)
        t.elaborate(m, tick)

        # refresh bookkeeping
        owed_up = Signal()
        with m.If(tick):
            with m.If(ref_timer == interval - 1):
                m.d.sync += ref_timer.eq(0)
                m.d.comb += owed_up.eq(1)
            with m.Else():
                m.d.sync += ref_timer.eq(ref_timer + 1)
        with m.If(owed_up & ~is_ref & (owed != d.max_postponed + 1)):
            m.d.sync += owed.eq(owed + 1)
        with m.Elif(is_ref & ~owed_up):
            m.d.sync += owed.eq(owed - 1)
        done_next = Signal(units)
        m.d.comb += done_next.eq(done | Mux(is_ref, (Const(1, units) << cand)[:units], 0))
        m.d.sync += done.eq(Mux(done_next.all(), 0, done_next))

        # forced refresh: the urgent unit's rows are held open by prepared entries behind a
        # head that does not issue; roll the look-ahead back to the head (after the pointer
        # and count updates above, so this wins), so the unit can be precharged and
        # refreshed. The blocked look-ahead cannot prepare the unit's entries again before
        # the refresh; the others it prepares again at one entry per cycle.
        # Once forced, every urgent unit is forced until the debt is back below the urgent
        # level (a client that holds the head pins every unit its queued entries touch).
        forcing = Signal()
        with m.If(force):
            m.d.sync += forcing.eq(1)
        with m.Elif(~urgent):
            m.d.sync += forcing.eq(0)
        pinned = Signal(units)
        for u in range(units):
            m.d.comb += pinned[u].eq(Cat(*[pending[b] != 0 for b in members[u]]).any())
        rollback = Signal()
        m.d.comb += rollback.eq((force | forcing) & pinned.bit_select(urgent_unit, 1))
        with m.If(rollback):
            m.d.sync += pp.eq(hp + col_go)
            for b in range(nb):
                m.d.sync += pending[b].eq(0)
        # a level: set in every cycle the debt is at the limit, so a clear meanwhile is lost
        sticky_flags(m, self.errors, set_={"refresh_overflow": force}, clear=self.errors_clear)

        # -- 5. read data --
        m.submodules.rfifo = rfifo = SyncFIFOBuffered(width=d.burst_bytes * 8,
                                                      depth=self._read_buffer)
        m.d.comb += [rfifo.w_en.eq(bus.rd_valid), rfifo.w_data.eq(bus.rd_data),
                     self.rdata.valid.eq(rfifo.r_rdy), self.rdata.payload.eq(rfifo.r_data),
                     rfifo.r_en.eq(self.rdata.ready)]
        taken = self.rdata.valid & self.rdata.ready
        _count_up_down(m, outstanding, col_rd, taken)
        return m

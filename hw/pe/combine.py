"""The PE's COMBINE sink: result rows through :class:`~elmoe3d.hw.vpu.CombineUnit` s, weighted
by the token's gate and added into OUT (paper Section 4.1, Eq. 6, Fig. 10b; ``docs/pe.md``,
"GEMM address generation")."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data
from amaranth.lib.wiring import In, Out

from ...isa import Sink
from ..isa import tok_entry_layout
from ..vpu import CombineUnit
from ...config import check_mul_stages, combine_row_cycles, combine_sink_latency, unit_count
from .common import UnitDriver, check_choice, check_word_bits, log2, unit_streams
from .result import row_layout


__all__ = ["CombineSink"]


class CombineSink(UnitDriver):
    """COMBINE: the row in stage A (``row``, a COMBINE row while ``row_valid``) goes to OUT word
    ``slot * stride + ch / (W/64)``, its L values (L/2 in FULL mode) at position ``ch mod
    W/64`` (``slot``, ``e_h`` and the gate weight from the token's TOK entry ``tok``). The row
    leaves stage A into stage C, its OUT word read meanwhile (held in the read port, which is
    transparent; a read waits while a write to the same granules is still in the units:
    ``stall``), and enters the J = ``combine_units`` :class:`~elmoe3d.hw.vpu.CombineUnit` s in
    ``L/J`` (FULL: ``L/2/J``, at least one) sub-steps, lanes ``[s J, (s+1) J)`` in sub-step
    ``s``; each sub-step writes its own OUT granules. A row whose gate weight is +-0 adds
    exactly 0 and is skipped. With ``out_parts`` P > 1 (``narrow_out``; J <= W/64/P) each
    sub-step's values lie in one part of the OUT word: the part of sub-step 0 is read with the
    row, each next sub-step's part in the cycle before it.

    The units are :attr:`units`, which the PE instantiates (its direct children, for
    synthesis, :mod:`elmoe3d.synth.blocks`) and connects to ``unit<j>_i`` / ``unit<j>_o``.

    Ports
    -----
    row_valid, row : In
        Stage A (:func:`~elmoe3d.hw.pe.result.row_layout`).
    tok_entry : In, :func:`~elmoe3d.hw.isa.tok_entry_layout`
        The row's TOK entry.
    feed, feed_tok, feed_load : In
        The row offered to stage A, its TOK entry, and stage A taking it in this cycle (the
        result stage's ``feed``, ``feed_tok``, ``~stall``): the row's OUT word address and
        whether its gate weight is live are computed there and registered beside stage A, so
        that ``stall`` comes from registers (no multiplier, no TOK read in front of the
        tile's ``advance``; issue 25).
    stall : Out(1)
        Hold the row in stage A.
    rd_issue, rd_addr : Out
        The OUT read of a row entering stage C.
    rd_next, rd_next_addr : Out
        The next sub-step's part (``out_parts`` > 1).
    rd_data : In
        The OUT read port's data.
    w_en, w_addr, w_data, w_mask : Out
        The OUT write.
    vpu_set : Out(1)
        A unit saturated (the sticky ``vpu_saturation``).
    busy : Out(1)
        A row in stage C or in the units.
    a_skip : Out(1)
        Stage A holds a COMBINE row whose gate weight is +-0: it leaves in this cycle and
        writes nothing.
    pair_probe : In(15)
        A pair of OUT words (``2 p`` and ``2 p + 1``) OUTPUT is about to read.
    pair_busy : Out(1)
        OUTPUT may not read the pair in this cycle: a write to a word of ``pair_probe`` is
        still to come from stage C or the units (a read in the cycle of the write itself sees
        it: the read port is transparent), or stage C's row has sub-steps after this one
        (they take their OUT values from the data the read port holds).

    Parameters
    ----------
    lanes, word_bits : int
        L and W.
    combine_units : int
        J, a power of two dividing L (checked by the PE).
    mul_stages : int
        Passed to the units.
    out_parts : int
        Parts of an OUT word (``narrow_out``: P, else 1).

    Raises
    ------
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, lanes, word_bits, combine_units, mul_stages, out_parts=1):
        check_word_bits(word_bits)
        check_choice("lanes", lanes, (word_bits // 128,))
        unit_count("combine_units", combine_units, lanes, f"dividing lanes = {lanes}")
        check_mul_stages(mul_stages)
        check_choice("out_parts", out_parts,
                     tuple(p for p in (1, 2, 4) if combine_units <= word_bits // 64 // p))
        self._lanes, self._word_bits, self._j = lanes, word_bits, combine_units
        self._out_parts = out_parts
        self._mul_stages = mul_stages
        OV, P = word_bits // 64, out_parts
        n_sub_max = self.row_cycles[False]
        self._tag_layout = data.StructLayout({"addr": unsigned(16), "pos": unsigned(log2(OV)),
                                              "full": unsigned(1),
                                              "sub": unsigned(max(log2(n_sub_max), 1))})
        self._units = [CombineUnit(tag_width=self._tag_layout.size if j == 0 else 0,
                                   mul_stages=mul_stages, always_ready=True)
                       for j in range(combine_units)]
        self._latency = self._units[0].latency
        addr_bits = log2(OV) - log2(OV // P) + 16 if P > 1 else 16
        members = {
            "row_valid": In(1),
            "row": In(row_layout(lanes)),
            "tok_entry": In(tok_entry_layout()),
            "feed": In(row_layout(lanes)),
            "feed_tok": In(tok_entry_layout()),
            "feed_load": In(1),
            "stall": Out(1),
            "rd_issue": Out(1),
            "rd_addr": Out(addr_bits),
            "rd_next": Out(1),
            "rd_next_addr": Out(addr_bits if P > 1 else 0),
            "rd_data": In(word_bits // P),
            "w_en": Out(1),
            "w_addr": Out(addr_bits),
            "w_data": Out(word_bits // P),
            "w_mask": Out(OV // P),
            "vpu_set": Out(1),
            "busy": Out(1),
            "a_skip": Out(1),
            "pair_probe": In(15),
            "pair_busy": Out(1),
        }
        super().__init__(members, self._units)


    @property
    def row_cycles(self) -> dict:
        """Cycles per result row, by FULL (``True``: L/2 values) and not (L):
        :func:`elmoe3d.config.combine_row_cycles`."""
        return combine_row_cycles(self._lanes, self._j)

    @property
    def latency(self) -> int:
        """Cycles from the tile result taken to its first OUT write, no stall:
        :func:`elmoe3d.config.combine_sink_latency` (the PE's ``sink_latency[Sink.COMBINE]``)."""
        return combine_sink_latency(self._mul_stages)

    def elaborate(self, platform):
        m = Module()
        L, W, J, P = self._lanes, self._word_bits, self._j, self._out_parts
        OV = W // 64
        log_ov = log2(OV)
        narrow_o = P > 1
        cmb_lat = self._latency
        cmb_i, cmb_o = unit_streams(self, J)
        a = self.row
        a_full, a_ch, a_acc = a.full, a.ch, a.acc
        tok_entry = self.tok_entry

        n_sub_max = self.row_cycles[False]
        a_cmb = self.row_valid & (a.sink == Sink.COMBINE)
        c_addr = Signal(16)           # stage A's row's OUT word (registered with the row)
        c_live = Signal()             # its gate weight is not +-0 (registered with the row)
        c_pos = Signal(log_ov)
        c_mask = Signal(OV)
        with m.If(self.feed_load):
            m.d.sync += [
                c_addr.eq(self.feed_tok.slot * self.feed.stride + (self.feed.ch >> log_ov)),
                # a row with gate weight +-0 adds exactly 0 (term 0, no saturation): skipped
                c_live.eq((self.feed_tok.gate & 0x7FFF) != 0),
            ]
        m.d.comb += c_pos.eq(a_ch[:log_ov])
        for q in range(OV):
            m.d.comb += c_mask[q].eq(Mux(a_full, (q // (L // 2)) == (c_pos >> log2(L // 2)),
                                         (q // L) == (c_pos >> log2(L))))

        def lane_mask(full, sub):
            """OUT granules of the row's lanes [sub J, (sub+1) J)."""
            if n_sub_max == 1:
                return Const((1 << OV) - 1, OV)
            return Cat(Mux(full, ((q % (L // 2)) // J) == sub, ((q % L) // J) == sub)
                       for q in range(OV))

        c_valid = Signal()            # stage C holds a row; one sub-step enters the units
        c_sub = Signal(range(max(n_sub_max, 2)))
        c_y = Signal(data.ArrayLayout(signed(64), L))
        c_e_h = Signal(signed(8))
        c_gw = Signal(16)
        c_row_mask = Signal(OV)
        c_tag_layout = self._tag_layout
        c_tag = Signal(c_tag_layout)  # the row's (registered); sub: the unit tag's sub-step
        c_tag_in = Signal(c_tag_layout)
        c_last = Signal()             # the row's last sub-step enters in this cycle
        n_sub_full = self.row_cycles[True]
        m.d.comb += [
            c_tag_in.addr.eq(c_tag.addr),
            c_tag_in.pos.eq(c_tag.pos),
            c_tag_in.full.eq(c_tag.full),
            c_tag_in.sub.eq(c_sub),
            c_last.eq(c_valid & (c_sub == Mux(c_tag.full, n_sub_full - 1, n_sub_max - 1))),
        ]
        # unit entries at t, t-1, ..., t-cmb_lat+1 (valid, address, granules): their writes
        # are still to come when an OUT word is read in cycle t
        hz = [(c_valid, c_tag.addr, c_row_mask & lane_mask(c_tag.full, c_sub))]
        for k in range(1, cmb_lat):
            hz.append((Signal(name=f"hz_v{k}"), Signal(16, name=f"hz_a{k}"),
                       Signal(OV, name=f"hz_m{k}")))
            for dst, src in zip(hz[k], hz[k - 1]):
                m.d.sync += dst.eq(src)
        hazard = Const(0, 1)
        for v, addr, msk in hz:
            hazard = hazard | (v & (addr == c_addr) & (msk & c_mask).any())
        # OUTPUT's pair read waits for the writes still to come to the pair (stage C's row and
        # the rows in the units), and while stage C's row has sub-steps after this cycle (they
        # take their OUT values from the data the read port holds)
        pair_busy = c_valid & ~c_last
        for v, addr, _ in hz:
            pair_busy = pair_busy | (v & ((addr >> 1) == self.pair_probe))
        m.d.comb += self.pair_busy.eq(pair_busy)
        c_held = c_valid & ~c_last    # stage C still busy with its row next cycle
        c_issue = a_cmb & c_live & ~hazard & ~c_held
        m.d.comb += [self.stall.eq(a_cmb & c_live & (hazard | c_held)),
                     self.a_skip.eq(a_cmb & ~c_live)]
        m.d.comb += self.rd_issue.eq(c_issue)
        if narrow_o:
            # the part of sub-step 0's values with the row, then each next sub-step's part
            # in the cycle before it (its J values lie in one part of OV/P: J <= OV/P)
            log_ovp = log2(OV // P)

            def c_part(pos, sub):
                return (pos + sub * J)[log_ovp:log_ov]
            m.d.comb += [self.rd_addr.eq(Cat(c_part(c_pos, 0), c_addr)),
                         self.rd_next.eq(c_valid & ~c_last),
                         self.rd_next_addr.eq(Cat(c_part(c_tag.pos, c_sub + 1), c_tag.addr))]
        else:
            m.d.comb += self.rd_addr.eq(c_addr)
        with m.If(c_issue):
            m.d.sync += [
                c_valid.eq(1),
                c_sub.eq(0),
                c_e_h.eq(tok_entry.e_h),
                c_gw.eq(tok_entry.gate),
                c_row_mask.eq(c_mask),
                c_tag.addr.eq(c_addr),
                c_tag.pos.eq(c_pos),
                c_tag.full.eq(a_full),
            ]
            for j in range(L):
                m.d.sync += c_y[j].eq(Mux(a_full, a_acc[(2 * j) % L], a_acc[j]))
        with m.Elif(c_last):
            m.d.sync += c_valid.eq(0)
        with m.Elif(c_valid):
            m.d.sync += c_sub.eq(c_sub + 1)
        for j in range(J):
            lanes_j = [c_y[v] for v in range(j, L, J)]           # lane s J + j in sub-step s
            lane = (c_sub * J + j) if n_sub_max > 1 else j
            m.d.comb += [
                cmb_i[j].valid.eq(c_valid),
                cmb_i[j].payload.acc_y.eq(Array(lanes_j)[c_sub] if n_sub_max > 1
                                          else lanes_j[0]),
                cmb_i[j].payload.e_h.eq(c_e_h),
                cmb_i[j].payload.gw.eq(c_gw),
                cmb_i[j].payload.out.eq(self.rd_data.word_select(
                    (c_tag.pos + lane)[:log_ov - log2(P)], 64)),
                cmb_i[j].payload.flag.eq(0),
            ]
        m.d.comb += cmb_i[0].payload.tag.eq(c_tag_in)
        cmb_out = cmb_o[0].valid
        cmb_tag_out = data.View(c_tag_layout, cmb_o[0].payload.tag)
        cmb_full = cmb_tag_out.full
        ow_data = Signal(W)
        ow_mask = Signal(OV)
        out_lanes = lane_mask(cmb_full, cmb_tag_out.sub)
        for q in range(OV):
            m.d.comb += [
                ow_data[64 * q:64 * (q + 1)].eq(
                    Mux(cmb_full, cmb_o[(q % (L // 2)) % J].payload.out,
                        cmb_o[(q % L) % J].payload.out)),
                ow_mask[q].eq(out_lanes[q] & Mux(
                    cmb_full, (q // (L // 2)) == (cmb_tag_out.pos >> log2(L // 2)),
                    (q // L) == (cmb_tag_out.pos >> log2(L)))),
            ]
        m.d.comb += self.w_en.eq(cmb_out)
        if narrow_o:                  # the sub-step's values: one part
            w_part = c_part(cmb_tag_out.pos, cmb_tag_out.sub)
            m.d.comb += [self.w_addr.eq(Cat(w_part, cmb_tag_out.addr)),
                         self.w_data.eq(ow_data.word_select(w_part, W // P)),
                         self.w_mask.eq(ow_mask.word_select(w_part, OV // P))]
        else:
            m.d.comb += [self.w_addr.eq(cmb_tag_out.addr), self.w_data.eq(ow_data),
                         self.w_mask.eq(ow_mask)]
        cmb_flag = Const(0, 1)
        for j in range(J):
            if n_sub_max > 1:
                live = ~cmb_full | ((cmb_tag_out.sub * J + j) < L // 2)
            else:
                live = Const(1, 1) if j < L // 2 else ~cmb_full
            cmb_flag = cmb_flag | (live & cmb_o[j].payload.flag)
        m.d.comb += self.vpu_set.eq(cmb_out & cmb_flag)
        cmb_inflight = Signal(range(64))
        m.d.sync += cmb_inflight.eq(cmb_inflight + c_valid - cmb_out)
        m.d.comb += self.busy.eq(c_valid | (cmb_inflight != 0))
        return m

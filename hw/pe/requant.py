"""The PE's requantization engine: REQUANT, HBUF rows (Q16.16) to INT8 codes in ACT and their
exponents into TOK (paper Section 4.1, Eq. 4-5, Fig. 10b; ``docs/pe.md``, "REQUANT")."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Signal, signed, unsigned
from amaranth.lib import data
from amaranth.lib.wiring import In, Out

from ...isa import Op
from ..isa import op_layout
from ..vpu import RequantUnit, RowMaxExponent
from ...config import max_requant_units, unit_count
from .common import (SEQ, UnitDriver, check_choice, check_word_bits, log2, unit_stream,
                     unit_streams)


__all__ = ["RequantEngine"]


class RequantEngine(UnitDriver):
    """REQUANT, one at a time: handed over by the decoder (``issue``), started when every
    execute command before it has completed (``older_done``), then run beside later GEMMs.

    Per token row ``t``: the row max (ROWMAX, a read port of its own) ->
    :class:`~elmoe3d.hw.vpu.RowMaxExponent` -> ``e_h`` into TOK (byte 1 of the row's entry) and
    ``e'`` held for the row, prepared while the previous row streams; then C =
    ``requant_units`` values per cycle: HBUF word ``t * I/(W/32) + c/(W/32)`` (with
    ``io_parts`` > 1 its part) -> C :class:`~elmoe3d.hw.vpu.RequantUnit` s -> ACT bytes
    (byte enables), a word of W/32 values in ``W/32 / C`` cycles. ``hold`` (the load engine
    writes ACT in this cycle: it has the ACT write port first) stalls the units' outputs.
    ``pad_rows`` P: the last P rows of the last row block are padding (no token): they are not
    streamed (no row max read, no ``e_h``, no HBUF read); the last live row's ACT writes
    also write zeros into their bytes of the same words (the codes of a row are C bytes of an
    ACT word a cycle, every row of the row block in the same word), so a padding row costs
    no cycle.

    The units are :attr:`units` and :attr:`rowmax_exponent`, which the PE instantiates (its
    direct children, for synthesis, :mod:`elmoe3d.synth.blocks`) and connects to
    ``unit<i>_i`` / ``unit<i>_o`` and ``rme_i`` / ``rme_o``.

    Ports
    -----
    issue : In(1)
        The decoder takes a REQUANT (``args`` and ``seq_in`` valid); only while not ``busy``.
    args : In, ``op_layout(Op.REQUANT)``
    seq_in : In(SEQ)
        The REQUANT's sequence number.
    older_done : In(1)
        Every execute command before ``seq`` has completed.
    hold : In(1)
        No ACT write in this cycle (outputs held).
    busy, seq : Out(1), Out(SEQ)
        A REQUANT is held (from the cycle after ``issue`` to its last ACT write) and its number.
    vpu_saturation : Out(1)
        A code was clipped in this cycle (the sticky ``vpu_saturation`` flag).
    rmax_rd, rmax_addr : Out ; rmax_data : In
        ROWMAX read (its own port).
    hbuf_rd, hbuf_addr, hbuf_en : Out ; hbuf_data : In
        HBUF read (``hbuf_rd``: the engine has the port; ``hbuf_en``: read, else hold).
    tok_w_en, tok_w_addr, tok_w_data, tok_w_mask : Out
        TOK write (``e_h`` bytes).
    act_w_en, act_w_addr, act_w_data, act_w_mask : Out
        ACT write (codes, byte enables).

    Parameters
    ----------
    rows, word_bits, group : int
        R, W and the group size G (activations per row and word part).
    requant_units : int
        C (checked by the PE).
    io_parts : int
        Parts of an ACT, TOK, HBUF and ROWMAX word (``narrow_iomem``: P, else 1).

    Raises
    ------
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, rows, word_bits, group, requant_units, io_parts):
        check_word_bits(word_bits)
        check_choice("rows", rows, (word_bits // 256,))
        check_choice("group", group, (32,))
        check_choice("io_parts", io_parts, (1, 2, 4))
        top = max_requant_units(word_bits) // io_parts
        unit_count("requant_units", requant_units, top, f"in 1..min(W/32, 32)/io_parts = 1..{top}")
        self._rows, self._word_bits, self._group = rows, word_bits, group
        self._c, self._io_parts = requant_units, io_parts
        W, P = word_bits, io_parts
        self._tag_layout = data.StructLayout({"addr": unsigned(16),
                                              "byte": unsigned(log2(rows * 32)),
                                              "zpad": unsigned(1)})
        self._units = [RequantUnit(tag_width=self._tag_layout.size if i == 0 else 0)
                       for i in range(requant_units)]
        self._rme = RowMaxExponent(always_ready=True)
        narrow = P > 1
        log_q, log_qr = log2(W // 32), log2(W // 32 // P)
        members = {
            "issue": In(1),
            "args": In(op_layout(Op.REQUANT)),
            "seq_in": In(SEQ),
            "older_done": In(1),
            "hold": In(1),
            "busy": Out(1),
            "seq": Out(SEQ),
            "vpu_saturation": Out(1),
            "rmax_rd": Out(1),
            "rmax_addr": Out(16),
            "rmax_data": In(W // P),
            "hbuf_rd": Out(1),
            "hbuf_addr": Out((log_q - log_qr) + 16 if narrow else 16),
            "hbuf_en": Out(1),
            "hbuf_data": In(W // P),
            "tok_w_en": Out(1),
            "tok_w_addr": Out(16),
            "tok_w_data": Out(W // P),
            "tok_w_mask": Out(W // P // 8),
            "act_w_en": Out(1),
            "act_w_addr": Out((5 - log2(group // P)) + 16 if narrow else 16),
            "act_w_data": Out(W // P),
            "act_w_mask": Out(W // P // 8),
            "rme_i": Out(unit_stream(self._rme, "i")),
            "rme_o": In(unit_stream(self._rme, "o")),
        }
        super().__init__(members, self._units)


    @property
    def rowmax_exponent(self) -> RowMaxExponent:
        """The :class:`~elmoe3d.hw.vpu.RowMaxExponent` (for the PE to instantiate)."""
        return self._rme

    @property
    def word_cycles(self) -> int:
        """Cycles per HBUF word (W/32 values): ``W/32 / requant_units``."""
        return self._word_bits // 32 // self._c

    def elaborate(self, platform):
        m = Module()
        R, W, G, C, P = self._rows, self._word_bits, self._group, self._c, self._io_parts
        OV, Q = W // 64, W // 32
        log_q, log_c = log2(Q), log2(C)
        narrow = P > 1
        log_tk, log_rm = log2(OV) - log2(P), log_q - log2(P)
        rq_i, rq_o = unit_streams(self, C)
        rme_i, rme_o = self.rme_i, self.rme_o
        rq_busy, rq_seq = self.busy, self.seq

        rq_ch = Signal(16)
        rq_groups = rq_ch >> 5
        rq_run = Signal()             # started (every earlier command done)
        rq_rows = Signal(17)          # rows still to stream
        rq_pad = Signal()             # padding rows follow the last live row (zeros beside it)
        rq_r = Signal(range(max(R, 2)))
        rq_act_row = Signal(16)       # act_base + rb * I/32
        rq_c = Signal(16)             # channel of the next chunk in the row
        rq_haddr = Signal(16)         # HBUF word of the next chunk
        rq_e = Signal(signed(8))      # e' of the streaming row
        rq_cur = Signal()             # a row is streaming
        # row preparation: read the max of row rp_t, e' one cycle later, then e' waits in e_next
        rp_t = Signal(16)
        rp_end = Signal(16)
        rp_rd = Signal()              # the max of rp_t is in the read port's data
        e_next = Signal(signed(8))
        e_next_valid = Signal()
        with m.If(self.issue):
            t0 = self.args.tok_base
            ch = self.args.channels
            rows = self.args.row_blocks * R - self.args.pad_rows
            m.d.sync += [
                rq_busy.eq(1), rq_run.eq(0), rq_seq.eq(self.seq_in), rq_ch.eq(ch),
                rq_rows.eq(rows), rq_r.eq(0), rq_pad.eq(self.args.pad_rows != 0),
                rq_act_row.eq(self.args.act_base),
                rq_c.eq(0), rq_haddr.eq(t0 * (ch >> log_q)), rq_cur.eq(0),
                rp_t.eq(t0), rp_end.eq(t0 + rows), rp_rd.eq(0), e_next_valid.eq(0),
            ]
        with m.If(rq_busy & ~rq_run & self.older_done):
            m.d.sync += rq_run.eq(1)
        # preparation
        rp_issue = rq_run & (rp_t != rp_end) & ~rp_rd & ~rme_o.valid & ~e_next_valid
        m.d.comb += [self.rmax_rd.eq(rp_issue), self.rmax_addr.eq(rp_t >> log_rm)]
        m.d.sync += rp_rd.eq(rp_issue)
        rq_max = self.rmax_data.word_select(rp_t[:log_rm], 32) if log_rm else self.rmax_data
        m.d.comb += [rme_i.valid.eq(rp_rd), rme_i.payload.max.eq(rq_max)]
        e_h_word = Cat(*([Const(0, 8), rme_o.payload.e_h, Const(0, 48)] * OV))
        m.d.comb += [self.tok_w_en.eq(rme_o.valid), self.tok_w_addr.eq(rp_t >> log_tk),
                     self.tok_w_data.eq(e_h_word[:W // P]),
                     self.tok_w_mask.eq(Const(1 << 1, OV // P * 8) << (rp_t[:log_tk] << 3))]
        with m.If(rme_o.valid):
            m.d.sync += [e_next.eq(rme_o.payload.e), e_next_valid.eq(1), rp_t.eq(rp_t + 1)]
        # streaming; the ACT write port goes to the load engine first (REQUANT writes ACT every
        # cycle, and the next expert's activations load beside it): REQUANT holds meanwhile
        rq_hold = self.hold
        h1_valid = Signal()
        # the values of an HBUF read: a word, or with narrow_iomem a part, of QR values
        QR = Q // P
        log_qr = log2(QR)
        h1_sel = Signal(range(max(QR // C, 2)))
        h1_e = Signal(signed(8))
        h1_tag = Signal(self._tag_layout)
        for i in range(C):
            m.d.comb += [
                rq_i[i].valid.eq(h1_valid),
                rq_i[i].payload.h.eq(self.hbuf_data.word_select(
                    (h1_sel << log_c) + i if QR > C else i, 32)),
                rq_i[i].payload.e.eq(h1_e),
                rq_o[i].ready.eq(~rq_hold),
            ]
        m.d.comb += rq_i[0].payload.tag.eq(h1_tag)
        rq_adv = rq_i[0].ready
        rq_out = rq_o[0].valid
        rq_tag_out = data.View(self._tag_layout, rq_o[0].payload.tag)
        rq_byte = rq_tag_out.byte
        rq_row = rq_byte[5:]          # the row of the codes; with zpad the rows after it too
        span = G // P                 # a row's bytes in an ACT word (narrow_iomem: in a part)
        lg = log2(span)
        act_data = Signal(W // P)
        for b in range(W // P // 8):  # the units' codes in the row's bytes, zeros elsewhere
            m.d.comb += act_data[8 * b:8 * (b + 1)].eq(
                rq_o[b % C].payload.h_q & (b // span == rq_row).replicate(8))
        chunk = (Const((1 << C) - 1, span) << rq_byte[:lg])[:span]
        act_mask = Cat(chunk & ((r == rq_row) | (rq_tag_out.zpad & (r > rq_row))).replicate(span)
                       for r in range(R))
        m.d.comb += [self.act_w_data.eq(act_data), self.act_w_mask.eq(act_mask)]
        if narrow:                    # the part of the byte's depth, its place in the part
            m.d.comb += self.act_w_addr.eq(Cat(rq_byte[lg:5], rq_tag_out.addr))
        else:
            m.d.comb += self.act_w_addr.eq(rq_tag_out.addr)
        m.d.comb += self.act_w_en.eq(rq_out & ~rq_hold)
        rq_clip = Const(0, 1)
        for o in rq_o:
            rq_clip = rq_clip | o.payload.clip
        m.d.comb += self.vpu_saturation.eq(rq_out & ~rq_hold & rq_clip)
        with m.If(rq_adv):
            m.d.sync += h1_valid.eq(0)
        m.d.comb += [self.hbuf_rd.eq(rq_cur),
                     self.hbuf_addr.eq(Cat(rq_c[log_qr:log_q], rq_haddr) if narrow else rq_haddr),
                     self.hbuf_en.eq(rq_adv)]
        rq_step = rq_cur & rq_adv
        row_end = rq_step & (rq_c + C == rq_ch)
        with m.If(rq_step):
            byte = (rq_r << 5) + (rq_c[:5] if C < 32 else 0)
            m.d.sync += [
                h1_valid.eq(1),
                h1_e.eq(rq_e),
                h1_sel.eq(rq_c[log_c:log_qr] if QR > C else 0),
                h1_tag.addr.eq(rq_act_row + (rq_c >> 5)),
                h1_tag.byte.eq(byte),
                h1_tag.zpad.eq(rq_pad & (rq_rows == 1)),   # the last live row
                rq_c.eq(rq_c + C),
            ]
            with m.If(((rq_c + C) & (Q - 1)) == 0):
                m.d.sync += rq_haddr.eq(rq_haddr + 1)
            with m.If(row_end):
                m.d.sync += [rq_c.eq(0), rq_cur.eq(0), rq_rows.eq(rq_rows - 1)]
                with m.If(rq_r == R - 1):
                    m.d.sync += [rq_r.eq(0), rq_act_row.eq(rq_act_row + rq_groups)]
                with m.Else():
                    m.d.sync += rq_r.eq(rq_r + 1)
        with m.If(e_next_valid & (~rq_cur | row_end)):
            m.d.sync += [rq_e.eq(e_next), rq_cur.eq(1), e_next_valid.eq(0)]
        rq_done = rq_run & (rq_rows == 0) & ~h1_valid & ~rq_out
        with m.If(rq_done):
            m.d.sync += [rq_busy.eq(0), rq_run.eq(0)]
        return m

"""The PE's SWIGLU sink: result rows through :class:`~elmoe3d.hw.vpu.SwiGLUUnit` s into HBUF,
and the row maxima (paper Section 4.1, Eq. 3, Fig. 10b; ``docs/pe.md``, "GEMM address
generation")."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data
from amaranth.lib.wiring import In, Out

from ...isa import Sink
from ..isa import tok_entry_layout
from ..vpu import SwiGLUUnit
from ...config import check_mul_stages, swiglu_row_cycles, swiglu_sink_latency, unit_count
from .common import UnitDriver, check_choice, check_word_bits, log2, unit_streams
from .result import row_layout


__all__ = ["SwiGLUSink"]


def _max_levels(values, levels):
    """The maxima after ``levels`` levels of a balanced compare-select tree over ``values``
    (unsigned, one width): pairs ``(2i, 2i+1)`` per level, an odd last one passed on."""
    values = list(values)
    for _ in range(levels):
        if len(values) == 1:
            break
        nxt = [Mux(values[i + 1] > values[i], values[i + 1], values[i])
               for i in range(0, len(values) - 1, 2)]
        if len(values) % 2:
            nxt.append(values[-1])
        values = nxt
    return values


class SwiGLUSink(UnitDriver):
    """SWIGLU: the row in stage A (``row``, a SWIGLU row while ``row_valid``) enters the S =
    ``swiglu_units`` :class:`~elmoe3d.hw.vpu.SwiGLUUnit` s. A row has L/2 (DRAFT) or L/4 (FULL,
    per half) channels; each half of a weight word holds ``[up c..c+L/4-1, gate
    c..c+L/4-1]`` (``docs/pe.md``): DRAFT pairs lane ``j`` with lane ``j + L/4`` within each
    half of the result, FULL (lane 2i = MSB lane i of the half) lane ``2j`` with lane ``L/2 +
    2j``. The units take channels ``[s S, (s+1) S)`` of the row in sub-step ``s`` (at least
    one sub-step), the row held in stage A meanwhile (``stall``); each sub-step writes its
    HBUF values (a masked word write, ``hbuf_w_*``) and then updates the row's max |h| by a
    read-modify-write of its ROWMAX register (the read port is transparent: a sub-step's
    update sees the previous one's write; the sub-step with channel 0 of the row starts the
    max, unless the GEMM has ``max_keep``: then it raises it like the others).

    The units are :attr:`units`, which the PE instantiates (its direct children, for
    synthesis, :mod:`elmoe3d.synth.blocks`) and connects to ``unit<j>_i`` / ``unit<j>_o``.

    Latency: :attr:`latency` cycles from the tile result taken to its first HBUF write; the
    row-max write follows a cycle later.

    Ports
    -----
    row_valid, row : In
        Stage A (:func:`~elmoe3d.hw.pe.result.row_layout`).
    tok_entry : In, :func:`~elmoe3d.hw.isa.tok_entry_layout`
        The TOK entry of the row (``e_x``).
    stall : Out(1)
        Hold the row in stage A (sub-steps left).
    hbuf_w_en, hbuf_w_addr, hbuf_w_data, hbuf_w_mask : Out
        The HBUF write.
    rmax_rd, rmax_addr : Out ; rmax_data : In
        The ROWMAX read (transparent port).
    rmax_w_en, rmax_w_addr, rmax_w_data, rmax_w_mask : Out
        The ROWMAX write.
    vpu_set : Out(1)
        A unit saturated (the sticky ``vpu_saturation``).
    busy : Out(1)
        Rows in the units or a row-max update to come.

    Parameters
    ----------
    lanes, word_bits : int
        L and W.
    swiglu_units : int
        S, a power of two dividing L/2 (checked by the PE).
    mul_stages : int
        Passed to the units.
    io_parts : int
        Parts of an HBUF and ROWMAX word (``narrow_iomem``: P, else 1).

    Raises
    ------
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, lanes, word_bits, swiglu_units, mul_stages, io_parts=1):
        check_word_bits(word_bits)
        check_choice("lanes", lanes, (word_bits // 128,))
        unit_count("swiglu_units", swiglu_units, lanes // 2,
                   f"dividing lanes / 2 = {lanes // 2}")
        check_mul_stages(mul_stages)
        check_choice("io_parts", io_parts, (1, 2, 4))
        self._lanes, self._word_bits, self._s = lanes, word_bits, swiglu_units
        self._mul_stages = mul_stages
        self._io_parts = io_parts
        W, Q, P = word_bits, word_bits // 32, io_parts
        log_q = log2(Q)
        self._tag_layout = data.StructLayout({
            "addr": unsigned(16), "pos": unsigned(max(log_q, 1)), "full": unsigned(1),
            "t": unsigned(16), "start": unsigned(1)})
        self._units = [SwiGLUUnit(tag_width=self._tag_layout.size if j == 0 else 0,
                                  mul_stages=mul_stages, always_ready=True)
                       for j in range(swiglu_units)]
        narrow = P > 1
        members = {
            "row_valid": In(1),
            "row": In(row_layout(lanes)),
            "tok_entry": In(tok_entry_layout()),
            "stall": Out(1),
            "hbuf_w_en": Out(1),
            "hbuf_w_addr": Out(max(log_q, 1) - log2(Q // P) + 16 if narrow else 16),
            "hbuf_w_data": Out(W // P),
            "hbuf_w_mask": Out(Q // P),
            "rmax_rd": Out(1),
            "rmax_addr": Out(16),
            "rmax_data": In(W // P),
            "rmax_w_en": Out(1),
            "rmax_w_addr": Out(16),
            "rmax_w_data": Out(W // P),
            "rmax_w_mask": Out(Q // P),
            "vpu_set": Out(1),
            "busy": Out(1),
        }
        super().__init__(members, self._units)


    @property
    def row_cycles(self) -> dict:
        """Cycles per result row, by FULL (``True``: L/4 channels) and not (L/2):
        :func:`elmoe3d.config.swiglu_row_cycles`."""
        return swiglu_row_cycles(self._lanes, self._s)

    @property
    def latency(self) -> int:
        """Cycles from the tile result taken to its first HBUF write, no stall:
        :func:`elmoe3d.config.swiglu_sink_latency` (the PE's ``sink_latency[Sink.SWIGLU]``);
        the row-max write follows a cycle later."""
        return swiglu_sink_latency(self._mul_stages)

    def elaborate(self, platform):
        m = Module()
        L, W, S, P = self._lanes, self._word_bits, self._s, self._io_parts
        Q = W // 32
        log_q = log2(Q)
        narrow = P > 1
        log_rm = log_q - log2(P)
        sw_i, sw_o = unit_streams(self, S)
        a = self.row
        a_full, a_t, a_ch, a_stride, a_acc = a.full, a.t, a.ch, a.stride, a.acc

        n_sw_max = self.row_cycles[False]
        n_sw_full = self.row_cycles[True]
        grain = {False: S, True: min(S, L // 4)}     # values an HBUF write takes, by FULL
        sw_sub = Signal(range(max(n_sw_max, 2)))
        a_sw = self.row_valid & (a.sink == Sink.SWIGLU)
        sw_last = Signal()            # the row's last sub-step enters the units in this cycle
        m.d.comb += sw_last.eq(sw_sub == Mux(a_full, n_sw_full - 1, n_sw_max - 1))
        with m.If(a_sw):
            m.d.sync += sw_sub.eq(Mux(sw_last, 0, sw_sub + 1))
        m.d.comb += self.stall.eq(a_sw & ~sw_last)
        # Tag of unit 0: HBUF word address, position of the sub-step's first value in the
        # word, FULL, token row, start (channel 0 of the row and not max_keep: the row max
        # starts).
        sw_tag_layout = self._tag_layout

        def sw_pair(c, full):
            """(up, gate) accumulator lanes of channel ``c`` of a row."""
            if full:
                return (2 * c) % L, (L // 2 + 2 * c) % L
            d_up = (c // (L // 4)) * (L // 2) + c % (L // 4)
            return d_up, d_up + L // 4

        def by_sub(values):
            return Array(values)[sw_sub] if n_sw_max > 1 else values[0]

        for j in range(S):
            # (a FULL row never reaches sub-steps n_sw_full.., whose entries are don't-care:
            # selecting among only its sub-steps measured 749 LUT4 positions more on the
            # board top, 2026-11-30, so the mux is the same shape for both modes)
            up, gate = (
                Mux(a_full, by_sub([a_acc[sw_pair(s * S + j, True)[k]] for s in range(n_sw_max)]),
                    by_sub([a_acc[sw_pair(s * S + j, False)[k]] for s in range(n_sw_max)]))
                for k in range(2))
            m.d.comb += [
                sw_i[j].valid.eq(a_sw),
                sw_i[j].payload.acc_up.eq(up),
                sw_i[j].payload.acc_gate.eq(gate),
                sw_i[j].payload.e_x.eq(self.tok_entry.e_x),
            ]
        sw_tag_in = Signal(sw_tag_layout)
        m.d.comb += [
            sw_tag_in.addr.eq(a_t * a_stride + (a_ch >> log_q)),
            sw_tag_in.pos.eq((a_ch[:log_q] + sw_sub * S)[:log_q] if log_q else 0),
            sw_tag_in.full.eq(a_full),
            sw_tag_in.t.eq(a_t),
            sw_tag_in.start.eq((a_ch == 0) & (sw_sub == 0) & ~a.keep),
            sw_i[0].payload.tag.eq(sw_tag_in),
        ]
        sw_out = sw_o[0].valid
        sw_tag_out = data.View(sw_tag_layout, sw_o[0].payload.tag)
        sw_full = sw_tag_out.full
        # HBUF write: value q of the word <- h[q mod G], enabled where q // G == pos // G (G
        # the values of a sub-step: S, or L/4 in FULL mode when fewer channels than units)
        hb_data = Signal(W)
        hb_mask = Signal(Q)
        gf, gd = grain[True], grain[False]
        for q in range(Q):
            m.d.comb += [
                hb_data[32 * q:32 * (q + 1)].eq(
                    Mux(sw_full, sw_o[q % gf].payload.h, sw_o[q % gd].payload.h)),
                hb_mask[q].eq(Mux(sw_full, (q // gf) == (sw_tag_out.pos >> log2(gf)),
                                  (q // gd) == (sw_tag_out.pos >> log2(gd)))),
            ]
        m.d.comb += self.hbuf_w_en.eq(sw_out)
        if narrow:
            # (a part holds Q/P values, a multiple of the grains: every part of hb_data is
            # the same, and the enabled values lie in the part of pos)
            qr = Q // P
            hb_part = Value.cast(sw_tag_out.pos)[log2(qr):]
            m.d.comb += [self.hbuf_w_addr.eq(Cat(hb_part, sw_tag_out.addr)),
                         self.hbuf_w_data.eq(hb_data[:W // P]),
                         self.hbuf_w_mask.eq(hb_mask.word_select(hb_part, qr))]
        else:
            m.d.comb += [self.hbuf_w_addr.eq(sw_tag_out.addr), self.hbuf_w_data.eq(hb_data),
                         self.hbuf_w_mask.eq(hb_mask)]
        # row max |h| of the valid lanes, then a read-modify-write of the row's register: a
        # tree of compare-selects over the S units (log2 S levels), its first half in the
        # cycle the units' results arrive, the rest beside the ROWMAX read in the next one
        # (the same two cycles as before: no latency added)
        mags = []
        sw_sat = Const(0, 1)
        for j in range(S):
            h = sw_o[j].payload.h
            mag = Signal(unsigned(32), name=f"sw_abs{j}")
            # (a FULL row's channels s S + j < L/4 in all its sub-steps: units j >= L/4 idle)
            live = Const(1, 1) if j < L // 4 else ~sw_full
            m.d.comb += mag.eq(Mux(live, Mux(h < 0, -h, h), 0))
            mags.append(mag)
            sw_sat = sw_sat | (live & sw_o[j].payload.sat)
        m.d.comb += self.vpu_set.eq(sw_out & sw_sat)
        levels = log2(S)
        parts = _max_levels(mags, (levels + 1) // 2)
        # (the sub-step that writes channel 0 of the row starts the row's max: docs/pe.md)
        rm_valid = Signal()
        rm_t = Signal(16)
        rm_parts = [Signal(unsigned(32), name=f"rm_part{i}") for i in range(len(parts))]
        rm_start = Signal()
        m.d.sync += [rm_valid.eq(sw_out), rm_t.eq(sw_tag_out.t), rm_start.eq(sw_tag_out.start)]
        m.d.sync += [reg.eq(part) for reg, part in zip(rm_parts, parts)]
        rm_max = Signal(unsigned(32))
        m.d.comb += rm_max.eq(_max_levels(rm_parts, levels)[0])
        m.d.comb += [self.rmax_rd.eq(sw_out), self.rmax_addr.eq(sw_tag_out.t >> log_rm)]
        rm_old = self.rmax_data.word_select(rm_t[:log_rm], 32) if log_rm else self.rmax_data
        rm_new = Mux(~rm_start & (rm_old > rm_max), rm_old, rm_max)
        m.d.comb += [self.rmax_w_en.eq(rm_valid), self.rmax_w_addr.eq(rm_t >> log_rm),
                     self.rmax_w_data.eq(rm_new.replicate(Q // P)),
                     self.rmax_w_mask.eq(Const(1, Q // P) << rm_t[:log_rm] if log_rm else 1)]
        sw_inflight = Signal(range(64))
        m.d.sync += sw_inflight.eq(sw_inflight + a_sw - sw_out)
        m.d.comb += self.busy.eq(rm_valid | (sw_inflight != 0))
        return m

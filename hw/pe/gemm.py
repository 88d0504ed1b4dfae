"""The PE's GEMM issue: the address generator, the weight, scale and activation reads and the
tile beat (paper Sections 4.1 and 5.2, Fig. 10b; ``docs/pe.md``, "GEMM address
generation")."""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...checks import is_int, python_int_hint
from ...config import TileConfig
from ...isa import Op
from ..isa import op_layout
from ..layouts import TileMode, tile_beat_layout
from .common import SEQ, check_choice, check_word_bits, log2


__all__ = ["GemmIssue"]


class GemmIssue(wiring.Component):
    """Walks a GEMM's beats (column block ``cb``, FULL half ``half``, row block ``rb``, group
    ``g``; ``docs/pe.md``) while ``issuing``, one beat per cycle the tile takes: synchronous
    reads of ACT, the WMEM planes the mode needs (the GEMM's buffer only: the other may be
    loading meanwhile; the MSB plane unless LSB_ONLY, the LSB plane in FULL and LSB_ONLY) and
    the scale word (1 cycle; the data held while the tile stalls), then the beat: FULL
    interleaves half ``half`` of the MSB and LSB words onto lanes 2i / 2i+1 (lane 2i <-
    MSB[half L/2 + i], lane 2i+1 <- LSB[half L/2 + i]), scale entry ``entry & 7`` of word
    ``entry >> 3``; ``first`` at group 0 unless ``acc_cont``, ``last`` at the last group
    unless ``acc_hold`` (K-chained GEMMs: the tile keeps its accumulators in between). With
    ``weight_parts`` P > 1 (``streamed_weights``) a weight word is read a tile pass at a time
    (part 0 with the beat, part ``phase + 1`` while the tile takes pass ``phase``), and
    likewise ACT with ``act_parts`` P > 1 (``narrow_iomem``).

    Ports
    -----
    args : In, ``op_layout(Op.GEMM)``
        The GEMM being issued.
    start_cur, start_next, next_args : In
        A GEMM starts (its first beat is issued from the next cycle): the one in ``args``, or
        the one in ``next_args``; the counters are reset.
    issuing : In(1)
        Beats may be issued (the execute engine runs the GEMM).
    step, final : Out(1)
        A beat's reads are made in this cycle; it is the GEMM's last.
    low_done, high_done : Out(1)
        A beat's reads are made in this cycle, and no later read of the GEMM is in the
        buffer's lower half (the beat's column block starts at word ``low_words`` or above;
        column blocks ascend) / upper half (the GEMM's words, ``w_base .. w_base + col_blocks
        groups - 1``, all lie below ``low_words``). Never without ``low_words``.
    beat : Out, stream of :func:`~elmoe3d.hw.layouts.tile_beat_layout`
        To the tile.
    phase, next_pass : In
        The tile's pass counter and its next-pass strobe (:class:`~elmoe3d.hw.tile.TensorTile`).
    result_taken : In(1)
        The tile's result was taken (for :attr:`busy`).
    busy : Out(1)
        Issuing, a beat waiting for the tile, or a last beat whose result is not yet taken.
    seq : In(SEQ)
        The number of the GEMM in ``args``.
    held, held_seq : Out
        A beat of a GEMM with ``acc_hold`` waits for the tile (its reads are not all made:
        the GEMM has not completed), and that GEMM's number. Such a GEMM has no result and no
        sink descriptor, so this is the last place its work is tracked.
    w_cond, w_addr, msb_en, lsb_en, scl_addr, scl_en : Out
        The beat's WMEM reads (one enable bit per buffer memory; ``w_cond`` the request's
        condition, constant 1 unless read by parts).
    w_pass_addr, msb_pass_en, lsb_pass_en : Out
        The next weight part's reads (``next_pass``; ``weight_parts`` > 1).
    msb_data, lsb_data, scl_data : In, per buffer memory
        The read ports' data.
    act_addr, act_pass_addr : Out ; act_data : In
        The beat's ACT read (and the next part's).

    Parameters
    ----------
    tile : TileConfig
    word_bits : int
        W.
    passes : int
        The tile's passes P.
    weight_parts, act_parts : int
        Parts of a WMEM / ACT word: P or 1.
    wbuf_memories : int
        2 (a memory per buffer) or 1 (the buffer the top address bit).
    wmem_words, wscale_words : int
        Words of a buffer's plane and scales.
    low_words : int
        Words of a buffer's lower half with a flag of its own
        (:attr:`~elmoe3d.config.PEConfig.wmem_low_words`; 0: none).

    Raises
    ------
    TypeError
        ``tile`` is not a :class:`~elmoe3d.config.TileConfig`.
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, tile: TileConfig, word_bits, passes, weight_parts, act_parts,
                 wbuf_memories, wmem_words, wscale_words, low_words=0):
        if not isinstance(tile, TileConfig):
            raise TypeError(f"tile: expected a TileConfig, got {tile!r}")
        check_word_bits(word_bits)
        check_choice("passes", passes, (1, 2, 4))
        check_choice("weight_parts", weight_parts, sorted({1, passes}))
        check_choice("act_parts", act_parts, sorted({1, passes}))
        check_choice("wbuf_memories", wbuf_memories, (1, 2))
        for name, words in (("wmem_words", wmem_words), ("wscale_words", wscale_words)):
            if (not is_int(words, numpy=False) or words < 1
                    or (wbuf_memories == 1 and words & (words - 1))):
                raise ValueError(f"{name}: expected a positive integer (a power of two with "
                                 f"wbuf_memories=1){python_int_hint(words)}, got {words!r}")
        self._tile, self._word_bits, self._passes = tile, word_bits, passes
        self._wparts, self._aparts = weight_parts, act_parts
        self._split = wbuf_memories == 2
        self._wmem_words, self._wscale_words = wmem_words, wscale_words
        if not is_int(low_words, numpy=False) or not 0 <= low_words < wmem_words or low_words % 8:
            raise ValueError(f"low_words: expected 0 or a multiple of 8 below wmem_words"
                             f"{python_int_hint(low_words)}, got {low_words!r}")
        self._low = low_words
        W, nbuf, lp = word_bits, 2 if self._split else 1, log2(weight_parts)
        w_bits = 16 if self._split else log2(wmem_words) + 1
        scl_bits = 16 if self._split else log2(wscale_words * weight_parts) + 1
        super().__init__({
            "args": In(op_layout(Op.GEMM)),
            "start_cur": In(1),
            "start_next": In(1),
            "next_args": In(op_layout(Op.GEMM)),
            "issuing": In(1),
            "step": Out(1),
            "final": Out(1),
            "low_done": Out(1),
            "high_done": Out(1),
            "beat": Out(stream.Signature(tile_beat_layout(tile))),
            "phase": In(log2(passes)),
            "next_pass": In(1),
            "result_taken": In(1),
            "busy": Out(1),
            "seq": In(SEQ),
            "held": Out(1),
            "held_seq": Out(SEQ),
            "w_cond": Out(1),
            "w_addr": Out(lp + w_bits),
            "msb_en": Out(nbuf),
            "lsb_en": Out(nbuf),
            "scl_addr": Out(scl_bits),
            "scl_en": Out(nbuf),
            "w_pass_addr": Out(lp + 16 if weight_parts > 1 else 0),
            "msb_pass_en": Out(nbuf),
            "lsb_pass_en": Out(nbuf),
            "msb_data": In(W // weight_parts).array(nbuf),
            "lsb_data": In(W // weight_parts).array(nbuf),
            "scl_data": In(W // weight_parts).array(nbuf),
            "act_addr": Out(log2(act_parts) + 17),
            "act_pass_addr": Out(log2(act_parts) + 16 if act_parts > 1 else 0),
            "act_data": In(W // act_parts),
        })

    @property
    def gap(self) -> int:
        """Idle tile cycles between two GEMMs that follow each other (the next one starts in
        the last cycle of the previous one)."""
        return 0

    def elaborate(self, platform):
        m = Module()
        R, L, G = self._tile.rows, self._tile.lanes, self._tile.group
        P, parts, io_parts = self._passes, self._wparts, self._aparts
        split = self._split
        log_parts, part_lane = log2(parts), 128 // parts   # a lane: 32 nibbles
        args = self.args

        def gx(name):
            return Value.cast(getattr(args, name))

        def in_buffer(addr, buf, depth):
            return Cat(addr[:log2(depth)], buf)

        g_is_full = gx("mode") == TileMode.FULL.value
        g_cb = Signal(10)
        g_half = Signal()
        g_rb = Signal(8)
        g_g = Signal(8)
        g_act_row = Signal(16)                   # act_base + rb * groups
        g_w_blk = Signal(16)                     # w_base + cb * groups
        g_last_g = g_g == gx("groups") - 1
        g_last_rb = g_rb == gx("row_blocks") - 1
        g_last_half = ~g_is_full | g_half
        g_last_cb = g_cb == gx("col_blocks") - 1
        m.d.comb += self.final.eq(g_last_g & g_last_rb & g_last_half & g_last_cb)

        # beat stage: the read ports' data plus the beat's side band
        bv = Signal()
        b_mode = Signal(2)
        b_wbuf = Signal()
        b_half = Signal()
        b_slot = Signal(3)
        b_first = Signal()
        b_last = Signal()
        b_hold = Signal()                        # the beat's GEMM holds its accumulators
        adv = ~bv | self.beat.ready
        g_step = self.step
        m.d.comb += g_step.eq(self.issuing & adv)
        if self._low:
            # column blocks ascend: from a block at or above the lower half every read is above
            # it; a GEMM whose words all lie in the lower half leaves the upper half unread
            w_end = gx("w_base") + gx("col_blocks") * gx("groups")
            m.d.comb += [self.low_done.eq(g_step & (g_w_blk >= self._low)),
                         self.high_done.eq(g_step & (w_end <= self._low))]
        w_addr = Signal(16)
        m.d.comb += w_addr.eq(g_w_blk + g_g)
        g_lsb_only = gx("mode") == TileMode.LSB_ONLY.value
        g_reads_msb, g_reads_lsb = ~g_lsb_only, g_is_full | g_lsb_only
        b_is_full = b_mode == TileMode.FULL.value
        b_is_lsb = b_mode == TileMode.LSB_ONLY.value
        # streamed_weights: part 0 with the beat, part phase + 1 while the tile takes pass phase
        b_waddr = Signal(16)                     # the beat's word (in its memory)
        b_part = (self.phase + 1)[:log_parts] if parts > 1 else Const(0, 0)
        # narrow_iomem: the ACT word of the beat, read the same way
        b_aaddr = Signal(16)
        log_io = log2(io_parts)
        b_apart = (self.phase + 1)[:log_io] if io_parts > 1 else Const(0, 0)
        # a scale word holds 8 entries; with streamed_weights a part 8/P, read with the beat
        scl_shift = 3 - log_parts

        m.d.comb += self.w_cond.eq(1 if parts == 1 else g_step)
        if split:
            g_waddr = w_addr
            m.d.comb += self.scl_addr.eq(w_addr >> scl_shift)
            for b in range(2):
                w_rd = g_step & (gx("wbuf") == b)
                b_rd = b_wbuf == b
                m.d.comb += [self.msb_en[b].eq(w_rd & g_reads_msb),
                             self.lsb_en[b].eq(w_rd & g_reads_lsb),
                             self.msb_pass_en[b].eq(b_rd & ~b_is_lsb),
                             self.lsb_pass_en[b].eq(b_rd & (b_is_full | b_is_lsb)),
                             self.scl_en[b].eq(w_rd)]
        else:
            g_wbuf = gx("wbuf")
            g_waddr = in_buffer(w_addr, g_wbuf, self._wmem_words)
            m.d.comb += [
                self.scl_addr.eq(in_buffer(w_addr >> scl_shift, g_wbuf,
                                           self._wscale_words * parts)),
                self.msb_en.eq(g_step & g_reads_msb), self.lsb_en.eq(g_step & g_reads_lsb),
                self.msb_pass_en.eq(~b_is_lsb), self.lsb_pass_en.eq(b_is_full | b_is_lsb),
                self.scl_en.eq(g_step)]
        if parts == 1:
            m.d.comb += self.w_addr.eq(g_waddr)
        else:
            m.d.comb += [self.w_addr.eq(Cat(Const(0, log_parts), g_waddr)),
                         self.w_pass_addr.eq(Cat(b_part, b_waddr))]
        if io_parts > 1:
            m.d.comb += [self.act_addr.eq(Cat(Const(0, log_io), g_act_row + g_g)),
                         self.act_pass_addr.eq(Cat(b_apart, b_aaddr))]
        else:
            m.d.comb += self.act_addr.eq(g_act_row + g_g)
        with m.If(adv):
            m.d.sync += [
                b_waddr.eq(g_waddr),
                b_aaddr.eq(g_act_row + g_g),
                bv.eq(self.issuing),
                b_mode.eq(gx("mode")),
                b_wbuf.eq(gx("wbuf")),
                b_half.eq(g_half),
                b_slot.eq(w_addr[:3]),
                # K-chained GEMMs (docs/pe.md): acc_cont continues the held accumulators,
                # acc_hold keeps them (no result)
                b_first.eq((g_g == 0) & ~gx("acc_cont")),
                b_last.eq(g_last_g & ~gx("acc_hold")),
                b_hold.eq(gx("acc_hold")),
                self.held_seq.eq(self.seq),
            ]
        with m.If(g_step):
            with m.If(g_last_g):
                m.d.sync += g_g.eq(0)
                with m.If(g_last_rb):
                    m.d.sync += [g_rb.eq(0), g_act_row.eq(gx("act_base"))]
                    with m.If(g_last_half):
                        m.d.sync += [g_half.eq(0), g_cb.eq(g_cb + 1),
                                     g_w_blk.eq(g_w_blk + gx("groups"))]
                    with m.Else():
                        m.d.sync += g_half.eq(1)
                with m.Else():
                    m.d.sync += [g_rb.eq(g_rb + 1), g_act_row.eq(g_act_row + gx("groups"))]
            with m.Else():
                m.d.sync += g_g.eq(g_g + 1)
        for start, f in ((self.start_cur, args), (self.start_next, self.next_args)):
            with m.If(start):
                m.d.sync += [g_cb.eq(0), g_half.eq(0), g_rb.eq(0), g_g.eq(0),
                             g_act_row.eq(f.act_base), g_w_blk.eq(f.w_base)]

        # the tile beat (docs/pe.md "GEMM address generation"): FULL interleaves half `half` of
        # the MSB and LSB words, lane 2i <- MSB[half*L/2 + i], lane 2i+1 <- LSB[half*L/2 + i]
        beat = self.beat.payload
        if split:
            msb_word, lsb_word, scl_word = (Mux(b_wbuf, d[1], d[0])
                                            for d in (self.msb_data, self.lsb_data,
                                                      self.scl_data))
        else:
            msb_word, lsb_word, scl_word = (d[0] for d in (self.msb_data, self.lsb_data,
                                                           self.scl_data))
        scl_entry = scl_word.word_select(b_slot[:scl_shift], 16 * L) if scl_shift else scl_word
        for n in range(L):               # (streamed_weights: the pass's part, lane by lane)
            src_full = Mux(b_half, n // 2 + L // 2, n // 2)
            full_wgt = (msb_word if n % 2 == 0 else lsb_word).word_select(src_full, part_lane)
            plain_wgt = Mux(b_is_lsb, lsb_word, msb_word)[part_lane * n:part_lane * (n + 1)]
            m.d.comb += [
                Value.cast(beat.wgt[n])[:part_lane].eq(Mux(b_is_full, full_wgt, plain_wgt)),
                beat.scale[n].eq(Mux(b_is_full, scl_entry.word_select(src_full, 16),
                                     scl_entry[16 * n:16 * (n + 1)])),
            ]
        if io_parts > 1:              # (narrow_iomem: the pass's part, row by row)
            row_bits = 8 * G // P
            for r in range(R):
                m.d.comb += Value.cast(beat.act[r])[:row_bits].eq(
                    self.act_data[row_bits * r:row_bits * (r + 1)])
        else:
            m.d.comb += Value.cast(beat.act).eq(self.act_data)
        m.d.comb += [
            Value.cast(beat.mode).eq(b_mode),
            beat.first.eq(b_first),
            beat.last.eq(b_last),
            self.beat.valid.eq(bv),
        ]
        tile_pending = Signal(range(16))         # last beats accepted, results not yet taken
        tile_in = self.beat.valid & self.beat.ready
        m.d.sync += tile_pending.eq(tile_pending + (tile_in & beat.last) - self.result_taken)
        m.d.comb += [self.busy.eq(self.issuing | bv | (tile_pending != 0)),
                     self.held.eq(bv & b_hold)]
        return m

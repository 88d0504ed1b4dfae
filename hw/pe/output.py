"""The PE's OUTPUT engine: OUT rows (Q.24 values) to FP32 ``o`` DATA beats through
:class:`~elmoe3d.hw.vpu.Fp32Converter` s, or with ``raw`` the OUT words themselves (paper
Section 4.1, Fig. 10b; ``docs/pe.md``, "OUTPUT")."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib.wiring import In, Out

from ...isa import Op
from ..isa import op_layout
from ..vpu import Fp32Converter
from ...config import unit_count
from .common import UnitDriver, check_choice, check_word_bits, log2, unit_streams


__all__ = ["OutputEngine"]


class OutputEngine(UnitDriver):
    """OUTPUT: ``row_blocks * rows * channels / (W/32)`` beats, each W/32 FP32 values from two
    OUT words (``2 row`` and ``2 row + 1``, Q.24) through K = ``fp32_units``
    :class:`~elmoe3d.hw.vpu.Fp32Converter` s, one beat every ``W/32 / K`` cycles with a ready
    ``o``.

    With K < W/32 the pair of OUT words (or with one OUT memory each word of the pair in turn,
    with ``out_parts`` > 1 each of its parts) is held in the OUT read port, whose data stays
    while its ``en`` is low, and converted in W/32 / K sub-steps, unit ``j`` taking value
    ``s K + j`` in sub-step ``s``; the results are assembled in :attr:`bits` (the converters
    carry ``s`` as their tag) and the beat is offered once complete.

    OUTPUT ``raw`` (``channels`` a multiple of W/64): ``row_blocks * rows * channels / (W/64)``
    beats, each one OUT word unchanged (W/64 Q.24 values), words 0, 1, ... in address order,
    read by the same reads in the same order as the FP32 pairs (the converters idle) and moved
    into :attr:`bits` whenever it is free or its beat is taken in that cycle. Raw beat rate
    with a ready ``o`` (:attr:`raw_beat_cycles`, ``PEOptions.output_raw_beat_cycles``):

    * two OUT banks: a read fetches both banks' words (``2 row``, ``2 row + 1``), two beats,
      the next pair read in the cycle the second word moves on: one beat a cycle;
    * ``out_banks=1``: a word a read, the next read as the word moves on: one beat a cycle;
    * ``out_parts`` P > 1 (``narrow_out``, the FPGA lean PE): a word is assembled in
      :attr:`bits` from its P parts, a part read a cycle: one beat every P cycles (the
      memory's W/P bits a cycle).

    The first raw beat is offered ``2 + raw_beat_cycles`` cycles after OUTPUT leaves its drain
    (the state change, the OUT read: ``PEOptions.output_latency`` without the converters).

    With two OUT banks OUTPUT may start while the COMBINE sink still writes OUT (the PE lets
    it leave its drain once the tile, the result stage and the SWIGLU sink are idle): it reads
    the first pair in the cycle it starts (``start``) and each pair only while ``rd_hold`` is
    low (no write to it still in the COMBINE units, :class:`~elmoe3d.hw.pe.combine.CombineSink`
    ``pair_busy``).

    With K = W/32 converters (one sub-step a beat) an FP32 beat goes to ``o`` straight from
    the converters' output registers (their pipeline holds it under backpressure): the beat
    register is then only for raw beats.

    The converters are :attr:`units`, which the PE instantiates (its direct children, so that
    synthesis finds them, :mod:`elmoe3d.synth.blocks`) and connects to ``unit<j>_i`` and
    ``unit<j>_o``.

    Ports
    -----
    start : In(1)
        OUTPUT starts (``args`` valid in this cycle): the row counter is loaded.
    args : In, ``op_layout(Op.OUTPUT)``
        The command's ``row_blocks``, ``channels`` and ``raw``.
    active : In(1)
        The execute engine is in OUTPUT (reads are made only then).
    rd_addr, rd_en : Out
        The OUT read (a row of both banks with two banks: ``Cat(part, word)`` with one).
    rd_hold : In(1)
        Two banks: the pair at ``rd_addr`` may not be read in this cycle (a COMBINE write to
        it is still to come).
    rd_data : In
        The read port's data: both banks' words (2 W bits), or the word (part) read.
    o_ready : In(1)
        The beat on :attr:`bits` is taken in this cycle if :attr:`valid`.
    valid, bits : Out(1), Out(W)
        A complete beat (W/32 FP32 values, or with ``raw`` one OUT word).
    done : Out(1)
        OUTPUT's last beat is taken in this cycle (every converter drained).

    Parameters
    ----------
    rows : int
        R, token rows per row block.
    word_bits : int
        W.
    fp32_units : int
        K, a power of two dividing W/32 (checked by the PE).
    out_banks : int
        2 (a pair read in one cycle) or 1.
    out_parts : int
        Parts of an OUT word (``narrow_out``: P, else 1).

    Raises
    ------
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, rows, word_bits, fp32_units, out_banks, out_parts):
        check_word_bits(word_bits)
        check_choice("rows", rows, (word_bits // 256,))
        unit_count("fp32_units", fp32_units, word_bits // 32,
                   f"dividing W/32 = {word_bits // 32}")
        check_choice("out_banks", out_banks, (1, 2) if fp32_units < word_bits // 32 else (2,))
        check_choice("out_parts", out_parts, (1,) if out_banks == 2 else
                     tuple(p for p in (1, 2, 4) if fp32_units <= word_bits // 64 // p))
        self._rows, self._word_bits, self._k = rows, word_bits, fp32_units
        self._out_banks, self._out_parts = out_banks, out_parts
        q = word_bits // 32
        steps = q // fp32_units
        self._units = [Fp32Converter(tag_width=log2(steps) if j == 0 and steps > 1 else 0)
                       for j in range(fp32_units)]
        if out_banks == 2:
            addr_bits, data_bits = 16, 2 * word_bits
        else:
            addr_bits, data_bits = log2(2 * out_parts) + 16, word_bits // out_parts
        members = {
            "start": In(1),
            "args": In(op_layout(Op.OUTPUT)),
            "active": In(1),
            "rd_addr": Out(addr_bits),
            "rd_en": Out(1),
            "rd_hold": In(1),
            "rd_data": In(data_bits),
            "o_ready": In(1),
            "valid": Out(1),
            "bits": Out(word_bits),
            "done": Out(1),
        }
        super().__init__(members, self._units)


    @property
    def beat_cycles(self) -> int:
        """Cycles per FP32 beat with a ready ``o``: ``W/32 / fp32_units``."""
        return self._word_bits // 32 // self._k

    @property
    def raw_beat_cycles(self) -> int:
        """Cycles per raw beat (OUTPUT ``raw``: one OUT word) with a ready ``o``: 1, or with
        ``out_parts`` P > 1 (``narrow_out``) P, a part read a cycle."""
        return self._out_parts

    def elaborate(self, platform):
        m = Module()
        R, W, K = self._rows, self._word_bits, self._k
        Q, OV = W // 32, W // 64
        log_ov = log2(OV)
        out_parts = self._out_parts
        cv_i, cv_o = unit_streams(self, K)

        op_row = Signal(16)
        op_left = Signal(17)          # pairs of OUT words (FP32 beats) still to read
        raw = Signal()                # OUTPUT raw: the words themselves, no converters
        # row_blocks R channels / (W/64) words in pairs (R is even; FP32: channels a
        # multiple of W/32, so the pairs are its beats)
        n_pairs = Signal(17)
        m.d.comb += n_pairs.eq(self.args.row_blocks * (R // 2) * (self.args.channels >> log_ov))
        with m.If(self.start):
            m.d.sync += [op_row.eq(0), raw.eq(self.args.raw), op_left.eq(n_pairs)]
        S = Q // K                    # sub-steps per beat
        ov = Signal()                 # the beat's OUT words are in the read port's data
        cv_s = Signal(range(max(S, 2)))
        cv_ready = cv_i[0].ready
        cv_last = (cv_s == S - 1) if S > 1 else Const(1, 1)
        # the beat register: with S = 1 sub-step (K = W/32 converters) only for raw beats,
        # an FP32 beat goes to `o` straight from the converters' output registers
        bypass = S == 1
        beat_valid = Signal() if bypass else self.valid
        beat_bits = Signal(W) if bypass else self.bits
        data_taken = self.valid & self.o_ready
        # raw: the read port's data (a pair, a word or a word's part) moves into the beat
        # register whenever that is free or its beat is taken in this cycle
        raw_take = Signal()
        m.d.comb += raw_take.eq(raw & ov & (~beat_valid | self.o_ready))
        raw_beat = Signal()           # raw_take completes a beat
        if self._out_banks == 2:
            # raw: two beats a read, word 2 row (bank 0) then 2 row + 1 (bank 1)
            raw_hi = Signal()
            with m.If(self.start):
                m.d.sync += raw_hi.eq(0)
            with m.If(raw_take):
                m.d.sync += [raw_hi.eq(~raw_hi), beat_bits.eq(self.rd_data.word_select(raw_hi, W))]
            m.d.comb += raw_beat.eq(raw_take)
            op_adv = ~ov | Mux(raw, raw_take & raw_hi, cv_ready & cv_last)
            # the first pair is read in the cycle OUTPUT starts; a pair whose COMBINE write is
            # still to come waits (rd_hold)
            rd_row = Mux(self.start, 0, op_row)
            rd_left = Mux(self.start, n_pairs, op_left)
            rd_go = (self.start | (self.active & op_adv)) & (rd_left != 0) & ~self.rd_hold
            m.d.comb += [self.rd_addr.eq(rd_row), self.rd_en.eq(rd_go)]
            with m.If(self.start | (self.active & op_adv)):
                m.d.sync += ov.eq(rd_go)
                with m.If(rd_go):
                    m.d.sync += [op_row.eq(rd_row + 1), op_left.eq(rd_left - 1)]
            pair_values = [self.rd_data[64 * v:64 * (v + 1)] for v in range(Q)]

            def cv_value(j):          # unit j's value in sub-step cv_s
                return Array(pair_values[j::K])[cv_s] if S > 1 else pair_values[j]
        else:
            # one OUT memory: NR = 2 reads a beat, word 2 row + half (narrow_out: NR = 2 P,
            # its parts, read op_sub = half P + part at address Cat(op_sub, row)); read i is in
            # the read port for sub-steps [i SR, (i + 1) SR), SR = S / NR, and the next is read
            # in the last of them. Raw: the same reads in the same order, words 2 row and
            # 2 row + 1 (part by part), each read into the beat register as it comes
            NR = 2 * out_parts
            SR = S // NR
            op_sub = Signal(log2(NR))
            with m.If(self.start):
                m.d.sync += op_sub.eq(0)
            op_adv = ~ov | Mux(raw, raw_take,
                               cv_ready & (cv_s[:log2(SR)] == SR - 1 if SR > 1
                                           else Const(1, 1)))
            m.d.comb += [self.rd_addr.eq(Cat(op_sub, op_row)), self.rd_en.eq(op_adv)]
            with m.If(self.active & op_adv):
                m.d.sync += ov.eq(op_left != 0)
                with m.If(op_left != 0):
                    m.d.sync += op_sub.eq(op_sub + 1)
                    with m.If(op_sub == NR - 1):
                        m.d.sync += [op_row.eq(op_row + 1), op_left.eq(op_left - 1)]
            if out_parts > 1:
                raw_part = Signal(log2(out_parts))     # the part in the read port's data
                with m.If(self.start):
                    m.d.sync += raw_part.eq(0)
                with m.If(raw_take):
                    m.d.sync += [raw_part.eq(raw_part + 1),
                                 beat_bits.word_select(raw_part, W // out_parts)
                                 .eq(self.rd_data)]
                m.d.comb += raw_beat.eq(raw_take & (raw_part == out_parts - 1))
            else:
                with m.If(raw_take):
                    m.d.sync += beat_bits.eq(self.rd_data)
                m.d.comb += raw_beat.eq(raw_take)
            # sub-step s takes values [s K, (s + 1) K) of the beat: of its read, values
            # [(s mod SR) K, ...), so unit j selects by the sub-step's low bits
            read_values = [self.rd_data[64 * v:64 * (v + 1)] for v in range(OV // out_parts)]

            def cv_value(j):
                return (Array(read_values[j::K])[cv_s[:log2(SR)]] if SR > 1
                        else read_values[j])
        cv_feed = ov & ~raw           # the converters take the read port's values (FP32)
        if S > 1:
            with m.If(cv_feed & cv_ready):
                m.d.sync += cv_s.eq(Mux(cv_last, 0, cv_s + 1))
        cv_take = Signal()
        for j in range(K):
            m.d.comb += [
                cv_i[j].valid.eq(cv_feed),
                cv_i[j].payload.value.eq(cv_value(j)),
                cv_o[j].ready.eq(self.o_ready if bypass else ~beat_valid | data_taken),
            ]
        m.d.comb += cv_take.eq(cv_o[0].valid & cv_o[0].ready)
        cv_inflight = Signal(range(8))
        m.d.sync += cv_inflight.eq(cv_inflight + (cv_feed & cv_ready) - cv_take)
        cv_bits = Cat(o.payload.bits for o in cv_o)
        if S > 1:
            m.d.comb += cv_i[0].payload.tag.eq(cv_s)
            cv_tag = cv_o[0].payload.tag
            with m.If(cv_take):
                m.d.sync += beat_bits.word_select(cv_tag, 32 * K).eq(cv_bits)
            cv_beat = cv_take & (cv_tag == S - 1)
        else:
            cv_beat = Const(0, 1)
        with m.If(cv_beat | raw_beat):
            m.d.sync += beat_valid.eq(1)
        with m.Elif(beat_valid & self.o_ready):
            m.d.sync += beat_valid.eq(0)
        if bypass:
            m.d.comb += [self.valid.eq(Mux(raw, beat_valid, cv_o[0].valid)),
                         self.bits.eq(Mux(raw, beat_bits, cv_bits))]
        # done with the last beat taken (the execute engine hands over in that cycle)
        # (bypass: the converters' last beat is taken in this cycle)
        cv_drained = (cv_inflight == Mux(cv_take, 1, 0)) if bypass else (cv_inflight == 0)
        m.d.comb += self.done.eq(self.active & (op_left == 0) & ~ov & cv_drained
                                 & (~beat_valid | self.o_ready))
        return m

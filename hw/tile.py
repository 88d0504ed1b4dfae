"""The bit-sliced tensor tile: unit PEs, 32-way adder trees, slice combining, fused
dequantization and Q.24 accumulators (paper Sections 4.1 and 4.3; numerics §3-5).

The golden model of this block's stream behaviour is :func:`elmoe3d.sw.golden.tile.ref_tile`.
"""

from __future__ import annotations

from amaranth.hdl import Array, C, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out

from ..checks import is_int, python_int_hint
from ..config import TileConfig, tile_latency
from ..sw.golden.datapath import PSUM_BITS
from .checked import CheckedComponent
from .fixed import sat_add64
from .layouts import TileMode, tile_beat_layout, tile_result_layout
from .unit_pe import SliceCombiner, lane_controls, weight_field


__all__ = ["TensorTile", "TREE_SHAPE", "PSUM_SHAPE", "SCALED_SHAPE", "TERM_SHAPE",
           "PAIR_SHIFT"]


#: One 32-way adder-tree output. Unit-PE products lie in [-2032, 2048] (13 bits signed), so a
#: sum of 32 lies in [-65024, 65536]: +65536 = 32 * (-128) * (-16) needs 18 signed bits
#: (13 + log2(32)); 17 bits would wrap the all-(-128) x all-(msb -8, aug 0) group.
TREE_SHAPE = signed(18)
#: Combined group psum after the slice shift. Every mode computes sum_k a[k] * w[k] with
#: w = q (FULL, -128..127), 16*msb + 8 (DRAFT, -120..120), 16*msb (MSB_ONLY, -128..112) or
#: lsb (LSB_ONLY, 0..15), so |psum| <= 32 * 128 * 128 = 2^19 (numerics §4: 21 signed
#: bits, the golden model's :data:`~elmoe3d.sw.golden.datapath.PSUM_BITS`): [-520192, 524288]
#: fits signed(21) exactly.
PSUM_SHAPE = signed(PSUM_BITS)
#: psum times the signed FP16 mantissa (|m| <= 2047, 12 bits signed): 21 + 12 = 33 bits.
SCALED_SHAPE = signed(33)
#: The Q.24 term after the exponent shift (0..30): |term| < 2^20 * 2^11 * 2^30 = 2^61.
TERM_SHAPE = signed(64)

#: Bit position of the second field in a DSP pair operand (``dsp_pairs``): a low product
#: ``a * (f + 16)`` lies in [-3968, 3937] and needs 13 signed bits, so the high field sits at
#: bit 13 and the packed operand is 18 bits signed, one ECP5 MULT18X18D port.
PAIR_SHIFT = 13

_ACC_SHAPE = signed(64)


def _adder_tree(terms):
    """Balanced binary adder tree; Amaranth grows the width by one bit per level, so every
    node is exact (13 bits -> 18 bits after five levels for 32 unit-PE products)."""
    terms = list(terms)
    while len(terms) > 1:
        nxt = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms = nxt
    return terms[0]


#: Adder-tree levels in stage 1a: the unit PEs and the first TREE_SPLIT levels of every
#: 32-way tree (sums of 2^TREE_SPLIT products, 32 / 2^TREE_SPLIT registers per tree) are
#: registered; stage 1b adds the rest, so neither stage holds the whole multiply-and-reduce
#: (docs/synth.md, "Timing").
TREE_SPLIT = 2


def _tree_levels(terms, levels):
    """The partial sums after the first ``levels`` levels of :func:`_adder_tree` over
    ``terms`` (the same pairing, so adding them with :func:`_adder_tree` is the whole tree)."""
    terms = list(terms)
    for _ in range(levels):
        if len(terms) == 1:
            break
        nxt = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms = nxt
    return terms


def _pair_operand(f_low, f_high):
    """The 18-bit signed operand ``(f_low + 16) + f_high * 2**PAIR_SHIFT`` of a DSP pair.

    ``f_low + 16`` (0..31) is the 5-bit field with its sign bit inverted; ``f_high`` (-16..15)
    fills bits 13..17 with its own sign: the operand lies in [-131072, 122911]."""
    return Cat(f_low[:4], ~f_low[4], C(0, PAIR_SHIFT - 5), f_high).as_signed()


class TensorTile(CheckedComponent):
    """Tensor tile of ``rows x lanes x 32`` bit-sliced IA8xW5 unit PEs with fused dequantization.

    Each input beat carries one K-group (32 deep) of activations for every row and one weight
    nibble per unit PE (see :func:`~elmoe3d.hw.layouts.tile_beat_layout`). For every row m and
    lane n, 32 unit PEs (:func:`~elmoe3d.hw.unit_pe.weight_field`, numerics §3) feed a 32-way
    adder tree (exact: :data:`TREE_SHAPE`, 18 bits signed). A :class:`~.unit_pe.SliceCombiner`
    per lane pair forms the group psum (numerics §4, :data:`PSUM_SHAPE`, 21 bits signed):

    * FULL: lane 2j is the MSB slice (aug 0), lane 2j+1 the LSB slice; channel j's psum
      ``(tree[2j] << 3) + tree[2j+1]`` is accumulated at lane 2j with lane 2j's scale; lane
      2j+1 adds nothing (its accumulator keeps its value; ``first`` still clears it).
    * DRAFT: every lane an MSB slice with aug 1, psum ``tree << 3``.
    * MSB_ONLY: every lane an MSB slice with aug 0, psum ``tree << 3``.
    * LSB_ONLY: every lane an LSB slice, psum ``tree``.

    Fused dequantization (numerics §5, paper 4.1 "partial sums ... immediately scaled"): the lane's
    FP16 scale bits split into sign s, exponent e and fraction f; ``mant = f`` if e == 0 else
    ``1024 + f``; ``shift = 0`` if e == 0 else ``e - 1`` (e == 31 follows the same rule, shift
    30); ``term = (psum * (-1)^s * mant) << shift`` (exact, :data:`TERM_SHAPE`), and
    ``acc = (first ? 0 : acc) + term`` saturated to the int64 bounds, with a sticky overflow flag
    (cleared by ``first``). The beat that has ``last`` set emits the accumulators, the flags and
    its mode on ``o`` (:func:`~elmoe3d.hw.layouts.tile_result_layout`). Modes may change from
    beat to beat inside an accumulation.

    Pipeline (initiation interval 1; each stage within the paper's 1 GHz clock at 0.7 V on
    ASAP7, ``docs/synth.md`` "Timing")::

        cycle t    : beat accepted; weight fields (mode mux)          -> input register
        cycle t+1  : unit PEs + first TREE_SPLIT adder-tree levels     -> register s1a
        cycle t+2  : rest of the trees, slice combine, scale decode   -> register s1 (psums)
        cycle t+3  : psum * signed mantissa (21 x 12 bits)             -> register s2 (33 bits)
        cycle t+4  : exponent shift, saturating add                   -> accumulators, o.valid
        cycle t+5  : o.valid (if the beat was ``last``)

    The input register ends the source's paths (the PE's SRAM read and beat forming) at the
    tile's edge; stage 1 (multipliers and 32-way trees, 1.2-1.3 ns in one cycle) is cut
    after :data:`TREE_SPLIT` levels; the scale decode and the slice combine run beside the
    last tree levels, so stage 2 is the dequantization multiply alone.

    The result is read straight from the accumulator registers. While a result is pending and
    the sink is not ready (``o.valid & ~o.ready``) the whole pipeline holds and ``i.ready`` is
    low, so no beat is lost or duplicated and no accumulator changes; otherwise one beat is
    accepted per cycle. ``i.ready`` depends combinationally on ``o.ready`` (never on ``i.valid``);
    ``o.valid`` is a register.

    DSP pairs (``dsp_pairs=True``, for FPGAs; the results are bit-identical): lanes 2j and
    2j+1 of a row share one multiplier per depth k, ``p = a * ((f_2j + 16) + f_2j+1 * 2^13)``
    (8 x 18 bits signed, one ECP5 MULT18X18D; :data:`PAIR_SHIFT`). The low 13 bits of ``p``
    are ``a * (f_2j + 16)`` exactly (it lies in [-3968, 3937]) and ``p >> 13`` is
    ``a * f_2j+1`` minus one when that low part is negative. Lane 2j's tree sums the low parts
    and subtracts ``16 * sum_k a[k]`` (one 32-way activation sum per row, shared by its lane
    pairs); lane 2j+1's tree sums ``p >> 13`` and adds the count of negative low parts. The
    tile then needs ``rows * lanes * 32 / 2`` multipliers instead of ``rows * lanes * 32``.

    Parameters
    ----------
    config : TileConfig
        ``rows`` (M), ``lanes`` (N, even) and ``group`` (32).
    dsp_pairs : bool
        Two IA8xW5 products per multiplier (above). Default ``False`` (the ASIC datapath:
        one unit PE per product, paper Fig. 8).
    passes : int
        P, the stage-1 passes per beat (1, 2 or 4; default 1). With P > 1 the unit PEs and
        adder trees are built for ``group / P`` depths: pass p multiplies depths
        ``[p G/P, (p+1) G/P)`` and adds the partial trees, so the tile takes one beat every P
        cycles (``i.ready`` is high only in the last pass) with ``multipliers / P``
        multipliers; the dequantization (stages 2 and 3) runs in P sub-steps of
        ``rows * lanes / P`` accumulators each, so :attr:`latency` is 4 + P. Results are
        unchanged (an FPGA option, like ``dsp_pairs``). The source must keep ``valid`` and
        the payload of an offered beat through all P passes (the stream rule: a beat stays
        until taken), except the weights with ``streamed_weights`` and the activations with
        ``streamed_acts``. The pipeline diagram below is for P = 1.
    streamed_weights : bool
        With P > 1 (default False): the source presents the weights a pass at a time. In
        the cycle of pass p (:attr:`phase`), nibbles ``0 .. G/P - 1`` of ``wgt[n]`` carry
        the lane's depths ``p G/P .. (p+1) G/P - 1`` and the other nibbles are ignored; the
        activations, scales and side band stay as in the stream rule. A source that reads
        the weights from memories G/P nibbles wide (the PE's ``streamed_weights``) then
        needs no beat-wide weight register or multiplexer: it reads part 0 when it forms a
        beat (the cycle before it offers it) and part ``phase + 1`` in every cycle
        :attr:`next_pass` is high (the data one cycle later, a synchronous read), holding
        the read port while the tile holds the beat. Results unchanged.
    streamed_acts : bool
        The same for the activations (default False): in pass p, bytes ``0 .. G/P - 1`` of
        every row ``act[r]`` carry the row's depths ``p G/P ..``, the other bytes ignored
        (the PE's ``narrow_iomem``: an ACT memory W/P bits wide).

    Attributes
    ----------
    i : In(stream.Signature(tile_beat_layout(config)))
    o : Out(stream.Signature(tile_result_layout(config)))
    phase : Signal(range(P)), not a port
        The pass of the offered beat (0 with P = 1).
    next_pass : Signal(1), not a port
        High in a cycle whose pass p < P - 1 of an offered beat is taken: the tile is in
        pass p + 1 of the same beat in the next cycle (never high with P = 1).

    Raises
    ------
    TypeError
        ``config`` is not a :class:`~elmoe3d.config.TileConfig`; ``dsp_pairs`` is not a bool;
        ``passes`` is not 1, 2 or 4; ``streamed_weights`` or ``streamed_acts`` is not a bool
        (checked before the block exists).
    """

    @classmethod
    def check(cls, *, config, dsp_pairs, passes, streamed_weights, streamed_acts):
        if not isinstance(config, TileConfig):
            raise TypeError(f"config: expected a TileConfig, got {type(config).__name__}")
        if not isinstance(dsp_pairs, bool):
            raise TypeError(f"dsp_pairs: expected a bool, got {dsp_pairs!r}")
        if (not is_int(passes, numpy=False) or passes not in (1, 2, 4)
                or config.group % passes or (config.rows * config.lanes) % passes):
            raise TypeError(f"passes: expected 1, 2 or 4 dividing the group of {config.group} "
                            f"and the {config.rows * config.lanes} accumulators"
                            f"{python_int_hint(passes)}, got {passes!r}")
        for name, value in (("streamed_weights", streamed_weights),
                            ("streamed_acts", streamed_acts)):
            if not isinstance(value, bool):
                raise TypeError(f"{name}: expected a bool, got {value!r}")

    def __init__(self, *, config: TileConfig, dsp_pairs: bool = False, passes: int = 1,
                 streamed_weights: bool = False, streamed_acts: bool = False):
        self._config = config
        self._dsp_pairs = dsp_pairs
        self._passes = passes
        self._streamed_weights = streamed_weights and passes > 1
        self._streamed_acts = streamed_acts and passes > 1
        self.phase = Signal(range(passes), name="phase")
        self.next_pass = Signal(name="next_pass")
        super().__init__({
            "i": In(stream.Signature(tile_beat_layout(config))),
            "o": Out(stream.Signature(tile_result_layout(config))),
        })

    @property
    def config(self) -> TileConfig:
        return self._config

    @property
    def dsp_pairs(self) -> bool:
        """Two products per multiplier (FPGA DSP packing); results unchanged."""
        return self._dsp_pairs

    @property
    def passes(self) -> int:
        """P: stage-1 passes per beat (one beat every P cycles)."""
        return self._passes

    @property
    def streamed_weights(self) -> bool:
        """The weights come a pass at a time (always False with one pass)."""
        return self._streamed_weights

    @property
    def streamed_acts(self) -> bool:
        """The activations come a pass at a time (always False with one pass)."""
        return self._streamed_acts

    @property
    def multipliers(self) -> int:
        """Hardware multipliers of the unit-PE array: ``rows * lanes * group``, halved with
        :attr:`dsp_pairs`, divided by :attr:`passes`."""
        n = self.rows * self.lanes * self.group // self._passes
        return n // 2 if self._dsp_pairs else n

    @property
    def rows(self) -> int:
        """M: activation rows per beat."""
        return self._config.rows

    @property
    def lanes(self) -> int:
        """N: unit-PE lanes (adder trees, accumulators) per row."""
        return self._config.lanes

    @property
    def group(self) -> int:
        """G: adder-tree depth (32)."""
        return self._config.group

    @property
    def latency(self) -> int:
        """Cycles from accepting a ``last`` beat (cycle t) to ``o.valid`` (cycle t + 5; t + 4 +
        P with :attr:`passes` P, whose dequantization takes P sub-steps) with an always-ready
        sink (:func:`elmoe3d.config.tile_latency`)."""
        return tile_latency(self._passes)

    def elaborate(self, platform):
        m = Module()
        rows, lanes, group = self.rows, self.lanes, self.group
        beat = self.i.payload

        # Global stall: a result is pending and the sink does not take it.
        advance = Signal()
        P = self._passes
        depth = group // P                       # unit-PE depths built
        phase = self.phase                       # the pass of the offered beat
        last_pass = phase == P - 1
        m.d.comb += [
            advance.eq(~(self.o.valid & ~self.o.ready)),
            self.i.ready.eq(advance & last_pass),
            self.next_pass.eq(advance & self.i.valid & ~last_pass),
        ]
        if P > 1:
            with m.If(advance & self.i.valid):
                m.d.sync += phase.eq(Mux(last_pass, 0, phase + 1))

        # ---- stage 0: pass select and weight fields -> the input register --------------------
        # The offered beat (or pass) is registered as it is taken, so the source's read data
        # and beat forming (the PE's SRAM read, buffer and mode muxes) end at this register
        # and the unit PEs start from one. It holds the pass's operands: the activations and
        # the 5-bit weight fields (the mode's LSB-augmentation mux is in front of it). A delay
        # line of (valid, operands, side band, pass) that moves with ``advance``: the source
        # protocol is unchanged.
        def in_pass(values, streamed=False):
            """The ``depth`` operands of the current pass (depths p * depth + k); streamed:
            the source's first ``depth`` operands are the pass's."""
            values = list(values)
            if P == 1 or streamed:
                return values[:depth]
            return [Array(values[p * depth + k] for p in range(P))[phase] for k in range(depth)]

        r_valid = Signal(name="r_valid")
        r_phase = Signal(range(P), name="r_phase")
        r_first = Signal(name="r_first")
        r_last = Signal(name="r_last")
        r_mode = Signal(TileMode, name="r_mode")
        r_scale = Signal(data.ArrayLayout(unsigned(16), lanes), name="r_scale")
        with m.If(advance):
            m.d.sync += [
                r_valid.eq(self.i.valid),
                r_phase.eq(phase),
                r_first.eq(beat.first),
                r_last.eq(beat.last),
                r_mode.eq(beat.mode),
                r_scale.eq(beat.scale),
            ]
        # The 5-bit weight field of a unit PE depends only on its lane and depth (the weight
        # operand is broadcast down the rows), so the LSB-augmentation mux is built once per
        # (lane, k) and shared by the rows' multipliers.
        fields = []
        for n in range(lanes):
            is_msb, aug = lane_controls(beat.mode, n % 2)
            lane_fields = []
            for k, nib in enumerate(in_pass((beat.wgt[n][k] for k in range(group)),
                                            self._streamed_weights)):
                field = Signal(signed(5), name=f"field_{n}_{k}")
                with m.If(advance):
                    m.d.sync += field.eq(weight_field(nib, is_msb, aug))
                lane_fields.append(field)
            fields.append(lane_fields)
        acts = []
        for r in range(rows):
            row = []
            for k, a in enumerate(in_pass((beat.act[r][k] for k in range(group)),
                                          self._streamed_acts)):
                sel = Signal(signed(8), name=f"act_{r}_{k}")
                with m.If(advance):
                    m.d.sync += sel.eq(a)
                row.append(sel)
            acts.append(row)

        # ---- stage 1a: unit PEs and the first TREE_SPLIT adder-tree levels ---------------------
        # ---- stage 1b: the rest of the trees, slice combine, scale decode ---------------------
        s1_valid = Signal()
        s1_first = Signal()
        s1_last = Signal()
        s1_mode = Signal(TileMode)
        s1_mant = [Signal(signed(12), name=f"s1_mant_{n}") for n in range(lanes)]
        s1_shift = [Signal(range(31), name=f"s1_shift_{n}") for n in range(lanes)]
        s1_psum = {}

        # stage 1a registers every pass (a_*: the pass's partial tree sums and side band)
        a_valid = Signal(name="a_valid")
        a_phase = Signal(range(P), name="a_phase")
        a_first = Signal(name="a_first")
        a_last = Signal(name="a_last")
        a_mode = Signal(TileMode, name="a_mode")
        a_scale = Signal(data.ArrayLayout(unsigned(16), lanes), name="a_scale")
        with m.If(advance):
            m.d.sync += [
                a_valid.eq(r_valid),
                a_phase.eq(r_phase),
                a_first.eq(r_first),
                a_last.eq(r_last),
                a_mode.eq(r_mode),
                a_scale.eq(r_scale),
            ]
        a_last_pass = a_phase == P - 1

        def split(name, terms):
            """Stage 1a's registers of the first :data:`TREE_SPLIT` levels of a tree over
            ``terms`` (exact widths); stage 1b adds them."""
            regs = []
            for i, part in enumerate(_tree_levels(terms, TREE_SPLIT)):
                reg = Signal(part.shape(), name=f"{name}_{i}")
                with m.If(advance):
                    m.d.sync += reg.eq(part)
                regs.append(reg)
            return regs

        # stage 1b takes a beat in its last pass (with P > 1 only then: its registers hold the
        # beat's psums through the P dequantization sub-steps that follow)
        s1_take = advance if P == 1 else advance & a_valid & a_last_pass
        with m.If(s1_take):
            m.d.sync += [
                s1_first.eq(a_first),
                s1_last.eq(a_last),
                s1_mode.eq(a_mode),
            ]
        if P == 1:                               # with P > 1, dq_busy below tracks the beat
            with m.If(s1_take):
                m.d.sync += s1_valid.eq(a_valid)

        # the scale decode (numerics §5) in stage 1b: s1 holds the signed mantissa and shift
        for n in range(lanes):
            bits = a_scale[n]
            sign, exp, frac = bits[15], bits[10:15], bits[0:10]
            mag = Signal(unsigned(11), name=f"mant_mag_{n}")
            m.d.comb += mag.eq(Mux(exp == 0, frac, frac + 1024))
            with m.If(s1_take):
                m.d.sync += [
                    s1_mant[n].eq(Mux(sign, -mag, mag)),
                    s1_shift[n].eq(Mux(exp == 0, 0, exp - 1)),
                ]

        for r in range(rows):
            if self._dsp_pairs:
                trees = self._paired_trees(m, acts[r], fields, r, split)
            else:
                trees = [_adder_tree(split(f"a_tree_{r}_{n}",
                                           [acts[r][k] * fields[n][k] for k in range(depth)]))
                         for n in range(lanes)]
            totals = []
            for n in range(lanes):
                if P == 1:
                    total = trees[n]
                else:
                    # the earlier passes' sum (exact: a partial sum of the group's tree)
                    part = Signal(TREE_SHAPE, name=f"part_{r}_{n}")
                    total = Mux(a_phase == 0, 0, part) + trees[n]
                    with m.If(advance & a_valid & ~a_last_pass):
                        m.d.sync += part.eq(total)
                tree = Signal(TREE_SHAPE, name=f"tree_{r}_{n}")
                m.d.comb += tree.eq(total)           # exact: see TREE_SHAPE
                totals.append(tree)
            for j in range(lanes // 2):
                comb = SliceCombiner(width=TREE_SHAPE.width)
                m.submodules[f"combine_{r}_{j}"] = comb
                m.d.comb += [
                    comb.mode.eq(a_mode),
                    comb.even.eq(totals[2 * j]),
                    comb.odd.eq(totals[2 * j + 1]),
                ]
                for n, out in ((2 * j, comb.out_even), (2 * j + 1, comb.out_odd)):
                    psum = Signal(PSUM_SHAPE, name=f"s1_psum_{r}_{n}")
                    with m.If(s1_take):
                        m.d.sync += psum.eq(out)     # exact: see PSUM_SHAPE
                    s1_psum[r, n] = psum

        # ---- stage 2: psum * signed mantissa ---------------------------------------------------
        # The rows x lanes accumulators in S = P sub-steps of ``per`` slots: sub-step q of a
        # beat dequantizes accumulators [q per, (q+1) per) (row-major), each slot one of them
        # (S = 1: every accumulator its own slot, one sub-step, the ASIC datapath).
        S = P
        cells = [(r, n) for r in range(rows) for n in range(lanes)]
        per = len(cells) // S
        sub = Signal(range(S), name="dq_sub")    # the sub-step in stage 2
        if S == 1:
            active = s1_valid
        else:
            active = Signal(name="dq_busy")
            with m.If(advance):
                with m.If(s1_take):
                    m.d.sync += [active.eq(1), sub.eq(0)]
                with m.Elif(active):
                    m.d.sync += [active.eq(sub != S - 1), sub.eq(Mux(sub == S - 1, 0, sub + 1))]

        def pick(values, j, index):
            """Slot ``j``'s value in sub-step ``index`` (values by cell)."""
            if S == 1:
                return values[j]
            return Array(values[q * per + j] for q in range(S))[index]

        s2_valid = Signal()
        s2_first = Signal()
        s2_last = Signal()
        s2_mode = Signal(TileMode)
        s2_sub = Signal(range(S), name="s2_sub")
        s2_shift = [Signal(range(31), name=f"s2_shift_{j}") for j in range(per)]
        s2_scaled = [Signal(SCALED_SHAPE, name=f"s2_scaled_{j}") for j in range(per)]

        for j in range(per):
            with m.If(advance):
                m.d.sync += [
                    s2_scaled[j].eq(pick([s1_psum[c] for c in cells], j, sub)
                                    * pick([s1_mant[n] for _, n in cells], j, sub)),
                    s2_shift[j].eq(pick([s1_shift[n] for _, n in cells], j, sub)),
                ]

        with m.If(advance):
            m.d.sync += [
                s2_valid.eq(active),
                s2_sub.eq(sub),
                s2_first.eq(s1_first),
                s2_last.eq(s1_last),
                s2_mode.eq(s1_mode),
            ]

        # ---- stage 3: exponent shift and saturating accumulation -------------------------------
        out_mode = Signal(TileMode)
        accs = [Signal(_ACC_SHAPE, name=f"acc_{r}_{n}") for r, n in cells]
        flags = [Signal(name=f"ovf_{r}_{n}") for r, n in cells]
        for j in range(per):
            term = Signal(TERM_SHAPE, name=f"term_{j}")
            base = Signal(_ACC_SHAPE, name=f"base_{j}")
            wrap = Signal(name=f"wrap_{j}")
            value = Signal(_ACC_SHAPE, name=f"value_{j}")
            m.d.comb += [
                term.eq(s2_scaled[j] << s2_shift[j]),
                base.eq(Mux(s2_first, 0, pick(accs, j, s2_sub))),
            ]
            sum_, ovf = sat_add64(base, term)
            m.d.comb += [wrap.eq(ovf), value.eq(sum_)]
            for q in range(S):
                i = q * per + j
                with m.If(advance & s2_valid & (s2_sub == q)):
                    m.d.sync += [flags[i].eq(Mux(s2_first, 0, flags[i]) | wrap),
                                 accs[i].eq(value)]
        for i, (r, n) in enumerate(cells):
            m.d.comb += [
                self.o.payload.acc[r][n].eq(accs[i]),
                self.o.payload.overflow[r][n].eq(flags[i]),
            ]

        with m.If(advance):
            m.d.sync += self.o.valid.eq(s2_valid & s2_last & (s2_sub == S - 1))
            with m.If(s2_valid):
                m.d.sync += out_mode.eq(s2_mode)
        m.d.comb += self.o.payload.mode.eq(out_mode)

        return m

    def _paired_trees(self, m, act, fields, r, split):
        """The ``lanes`` adder-tree sums of row ``r`` over the pass's ``len(act)`` depths with
        two products per multiplier; ``split(name, terms)`` registers the first levels of a
        tree (stage 1a) and returns the partial sums to add."""
        lanes, group = self.lanes, len(act)
        act_sum = Signal(signed(8 + 5), name=f"act_sum_{r}")      # 32 x [-128, 127]
        m.d.comb += act_sum.eq(_adder_tree(split(f"a_act_{r}", [act[k] for k in range(group)])))
        trees = []
        for j in range(lanes // 2):
            lows, highs, negs = [], [], []
            for k in range(group):
                p = Signal(signed(8 + 18), name=f"pair_{r}_{j}_{k}")
                m.d.comb += p.eq(act[k] * _pair_operand(fields[2 * j][k], fields[2 * j + 1][k]))
                lows.append(p[:PAIR_SHIFT].as_signed())
                highs.append(p[PAIR_SHIFT:].as_signed())
                negs.append(p[PAIR_SHIFT - 1])
            low = Signal(TREE_SHAPE, name=f"pair_low_{r}_{j}")
            high = Signal(TREE_SHAPE, name=f"pair_high_{r}_{j}")
            # both sums are exact in TREE_SHAPE (they equal the unpaired trees)
            m.d.comb += [
                low.eq(_adder_tree(split(f"a_low_{r}_{j}", lows)) - (act_sum << 4)),
                high.eq(_adder_tree(split(f"a_high_{r}_{j}", highs))
                        + _adder_tree(split(f"a_neg_{r}_{j}", negs))),
            ]
            trees += [low, high]
        return trees

"""The processing element (PE): memories, command decoder, load and execute engines, the
tensor tile and its VPU sinks, joined from the parts in this package (paper Sections 4.1 and
5.2, Fig. 6 centre, Fig. 10b).

The contract is ``docs/pe.md``; the ISA is :mod:`elmoe3d.isa` (Amaranth layouts in
:mod:`elmoe3d.hw.isa`); the numerics are ``docs/numerics.md``. The functional reference is
:mod:`elmoe3d.sw.golden.pe`: the RTL and it run the same programs in the same tests and are compared
with plain equality.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, Value, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...config import PEConfig, PEOptions
from ...isa import Op, Target
from ..isa import command_layout, o_beat_layout
from ..tile import TensorTile
from .combine import CombineSink
from .common import act_part_elems, older, unit_streams
from .decoder import CommandDecoder
from .execute import EXEC_STATES, ClearEngine, ExecuteEngine
from .gemm import GemmIssue
from .link import LinkPort
from .load import LoadEngine
from .memories import PEMemories
from .output import OutputEngine
from .requant import RequantEngine
from .result import ResultStage
from .status import StatusCounters
from .swiglu import SwiGLUSink


__all__ = ["PE"]


class PE(wiring.Component):
    """One ELMoE-3D processing element: runs fused SwiGLU experts (up, gate, down) from a
    command stream, draft (MSB slices, LSB augmentation) or full precision (paper Sections 4.1
    and 5.2, Fig. 6 centre, Fig. 10b; contract ``docs/pe.md``; golden model
    :mod:`elmoe3d.sw.golden.pe`).

    Ports (W = ``lanes * 128`` bits; ``amaranth.lib.stream``)
    ----------------------------------------------------------
    cmd : In, :func:`elmoe3d.hw.isa.command_layout` (128 bits)
        Commands (:mod:`elmoe3d.isa`), in program order.
    ld : In, W bits
        Load data: weight nibble planes, scales, activations, token table (LOADs consume it in
        order; ``LOAD.src`` and ``LOAD.hb_addr`` are for the die's load router).
    o : Out, :func:`elmoe3d.hw.isa.o_beat_layout`
        ``kind`` DATA (W/32 FP32 results of OUTPUT) or STATUS (counters and sticky flags).
    link_o, link_i : Out / In, W bits
        Aggregation-link port: RAW psums and SEND words out, RECV and ``psum_in`` words in.

    Memories (:class:`~elmoe3d.hw.pe.memories.PEMemories`; sizes
    :class:`~elmoe3d.config.PEConfig`)
    ------------------------------------------------------------------------------------
    WMEM: 2 buffers x (MSB plane, LSB plane) x ``wmem_words`` words plus 2 x ``wscale_words``
    scale words (separate planes: a DRAFT GEMM reads only MSB words, and the planes can arrive
    from different sources). IOMEM: ACT (byte enables, for REQUANT), TOK (byte enables, for
    e_h), HBUF (32-bit enables), OUT (64-bit enables, transparent read for the COMBINE
    read-modify-write) and one 32-bit row-max register per TOK entry, W/32 a word (ROWMAX: a
    transparent memory with a second read port for REQUANT); OUT and ROWMAX with valid bits
    (one-cycle ``CLEAR``). One write port each; every part of the PE requests the ports, the
    load engine with the lowest priority.

    Parts (each a :class:`~amaranth.lib.wiring.Component` of this package)
    ------------------------------------------------------------------------
    :class:`~.decoder.CommandDecoder` (commands in order: LOADs to a queue of
    :attr:`load_queue_depth`, REQUANT to its engine, the rest to the execute engine; sequence
    numbers for completion tracking), :class:`~.load.LoadEngine` (``ld`` into the memories,
    the WMEM buffer flags, fences), :class:`~.execute.ExecuteEngine` (GEMM, OUTPUT, CLEAR,
    SEND, RECV, BARRIER, STATUS in program order; a ready GEMM follows the previous one with
    no idle cycle, :attr:`gemm_gap`) with :class:`~.execute.ClearEngine`,
    :class:`~.gemm.GemmIssue` (address generator, WMEM / ACT reads, the tile beat) ->
    :class:`~elmoe3d.hw.tile.TensorTile` (:attr:`tile_latency`) -> :class:`~.result.ResultStage`
    (descriptors, result register with ``psum_in``, RAW sink, the rows of the VPU sinks) ->
    :class:`~.swiglu.SwiGLUSink` / :class:`~.combine.CombineSink` (:attr:`sink_latency`),
    :class:`~.requant.RequantEngine` (REQUANT beside later GEMMs), :class:`~.output.OutputEngine`
    (OUTPUT through the FP32 converters), :class:`~.link.LinkPort` (SEND, RECV) and
    :class:`~.status.StatusCounters` (STATUS: 48-bit counters and the sticky flags
    ``acc_overflow`` and ``vpu_saturation``, :data:`elmoe3d.sw.golden.asm.STATUS_FIELDS`). The
    VPU units and the tile are the PE's own children (synthesis leaves,
    :mod:`elmoe3d.synth.blocks`), connected to their parts' ports.

    A result is taken every :attr:`result_cycles` cycles, so GEMMs with at least that many
    groups run at one beat per cycle (II = 1; one beat every ``tile_passes`` cycles).

    After elaboration, :attr:`probes` maps a few internal control signals (load transfer,
    tile beat, buffer flags, execute-engine waits, REQUANT busy and waits, fence waits) by
    name, for benches that account cycles, and ``rw_collision`` (``rw_collision_<memory>``
    per memory): a word of WMSB, WLSB, WSCALE, ACT or HBUF read and written in the same
    cycle. Those memories are synthesised with Yosys's ``no_rw_check`` (no read-first
    emulation on an FPGA), so the benches assert it never fires. The same signal is the
    attribute :attr:`rw_collision` (``Signal(1)``, not a port, there before elaboration), which
    :class:`~elmoe3d.hw.board.BoardTop` turns into its sticky ``rw_collision`` output.

    Parameters
    ----------
    config : ArchConfig or PEConfig
        The tile shape must have ``lanes % 4 == 0``, ``lanes == 2 * rows`` and a power-of-two
        ``lanes``.
    mul_stages : int
        Registers after each VPU multiplier (1..4).
    requant_units : int or None
        C, the RequantUnits of the requantization engine: a power of two in
        ``1..min(W/32, 32)``; None (default) = ``min(W/32, 32)``. Fewer units save FPGA
        area (each has a 32-bit shifter and rounding) at ``W/32 / C`` cycles per HBUF word.
    fp32_units : int or None
        K, the Fp32Converters of the OUTPUT engine: a power of two dividing W/32; None
        (default) = W/32 (one ``o`` beat per cycle). Fewer units cost ``W/32 / K`` cycles per
        ``o`` beat; the beats themselves (values, order) do not change.
    combine_units : int or None
        J, the CombineUnits of the COMBINE sink: a power of two dividing ``lanes``; None
        (default) = ``lanes`` (one result row per cycle). Fewer units cost ``lanes / J``
        cycles per row (``lanes / 2 / J``, at least one, in FULL mode).
    swiglu_units : int or None
        S, the SwiGLUUnits of the SWIGLU sink: a power of two dividing ``lanes / 2``; None
        (default) = ``lanes / 2`` (one result row per cycle). Fewer units (each has two 64-bit
        rounding shifters, the sigmoid ROM and two multipliers) cost ``lanes / 2 / S``
        cycles per row (``lanes / 4 / S``, at least one, in FULL mode).
    tile_dsp_pairs : bool
        Passed to the tensor tile as ``dsp_pairs`` (two IA8xW5 products per FPGA DSP
        multiplier); default False.
    tile_passes : int
        Passed to the tensor tile as ``passes`` (1, 2 or 4; default 1): the unit PEs of a
        beat in that many cycles with that many times fewer multipliers, a GEMM beat every
        ``tile_passes`` cycles.
    out_valid_bits : bool
        OUT and ROWMAX with a valid bit per word (default True): ``CLEAR out`` / ``CLEAR
        rowmax`` take one cycle, and a word reads as zero until written, also after a reset.
        False: no valid bits (and none of the W-bit read gates and write masks they need);
        CLEAR writes zeros, both OUT banks (or the one OUT memory) and ROWMAX a row a cycle
        (:attr:`clear_cycles`), and a reset leaves the memories as they were (power-up
        contents are zero; every program the host builds starts with ``CLEAR out rowmax``).
    wbuf_memories : int
        2 (default): each WMEM buffer's MSB plane, LSB plane and scales are memories of their
        own (an SRAM macro each, :mod:`elmoe3d.synth`). 1: both buffers of a plane in one
        memory of twice the depth, the buffer the top address bit (one W-bit read and write
        bus per plane instead of two and no buffer multiplexer; on an ECP5 a 1,024-word
        plane is 29 DP16KD in 1,024 x 18 mode against 2 x 15); needs a power-of-two
        ``wmem_words``. The same cycles and results: a LOAD into one buffer and a GEMM
        reading the other use the memory's two ports.
    out_banks : int
        2 (default): OUT in two banks (even and odd words), so that OUTPUT reads an o beat's
        two words in one cycle. 1: one memory (one W-bit read and write bus instead of two,
        no bank multiplexer); OUTPUT reads the two words one after the other, each for half
        of the beat's FP32 sub-steps, so it needs ``fp32_units`` below W/32 and keeps its
        throughput; ``CLEAR out`` without valid bits takes ``out_words`` cycles.
    streamed_weights : bool
        False (default): the WMSB and WLSB planes are W bits wide and a GEMM beat reads a word
        of each. True (needs ``tile_passes`` P > 1; an FPGA option): WMSB, WLSB and WSCALE are
        W/P bits wide and P times as deep (the parts' layout:
        :class:`~elmoe3d.hw.pe.memories.PEMemories`), the planes read a tile pass at a time
        (``TensorTile(streamed_weights=True)``), so a plane's read data, its block-RAM data
        pins and the beat's weight multiplexers are W/P bits wide. A LOAD into them writes a
        word in P cycles (``ld.ready`` in the last). Every result is unchanged, and so are a
        GEMM's cycles once its weights are in (one that waits for its own weight LOAD starts
        up to P - 1 cycles a weight word later).
    narrow_iomem : bool
        False (default): ACT, TOK, HBUF and ROWMAX are W bits wide. True (needs
        ``tile_passes`` P > 1 and ``requant_units`` at most min(W/32, 32)/P; an FPGA option):
        they are W/P bits wide and P times as deep (:class:`~elmoe3d.hw.pe.memories.PEMemories`),
        ACT read a tile pass at a time (``TensorTile(streamed_acts=True)``). REQUANT and the
        SWIGLU and COMBINE sinks read and write the one part their values are in, in the same
        cycles; a LOAD or RECV into them writes a word in P cycles, a part a cycle
        (``ld.ready`` / ``link_i.ready`` in the last), a SEND reads a word in P cycles and
        offers it the cycle after (P + 1 cycles a word), and CLEAR without valid bits writes
        ROWMAX a part a cycle. Every result is unchanged; a GEMM's beats after its loads come
        in the same cycles.
    narrow_out : bool
        False (default): OUT is W bits wide. True (needs ``tile_passes`` P > 1, ``out_banks``
        1, ``out_valid_bits`` False, and ``combine_units`` and ``fp32_units`` at most W/64/P;
        an FPGA option): OUT is W/P bits wide and P times as deep. The COMBINE sink reads the
        part of each sub-step's values one cycle ahead, OUTPUT a part for each ``W/64/P /
        fp32_units`` sub-steps (the same beat rate), a RECV with ``accumulate`` adds a part a
        cycle; LOAD, plain RECV and SEND as ACT with ``narrow_iomem``, and CLEAR writes a
        part a cycle (:attr:`clear_cycles`). Every result is unchanged.

    Raises
    ------
    TypeError
        ``config`` is neither an ArchConfig nor a PEConfig.
    ValueError
        The tile shape does not suit the PE; ``mul_stages``, ``requant_units``,
        ``fp32_units``, ``combine_units``, ``swiglu_units``, ``tile_dsp_pairs``,
        ``tile_passes``, ``out_valid_bits``, ``wbuf_memories``, ``out_banks``,
        ``streamed_weights``, ``narrow_iomem`` or ``narrow_out`` out of range (the message
        names it).
    """

    def __init__(self, *, config, mul_stages: int = 1, requant_units: int | None = None,
                 fp32_units: int | None = None, combine_units: int | None = None,
                 swiglu_units: int | None = None, tile_dsp_pairs: bool = False,
                 tile_passes: int = 1, out_valid_bits: bool = True, wbuf_memories: int = 2,
                 out_banks: int = 2, streamed_weights: bool = False,
                 narrow_iomem: bool = False, narrow_out: bool = False):
        # validated once, with the messages above (elmoe3d.config.PEOptions)
        self._opts = PEOptions(
            config=config, mul_stages=mul_stages, requant_units=requant_units,
            fp32_units=fp32_units, combine_units=combine_units, swiglu_units=swiglu_units,
            tile_dsp_pairs=tile_dsp_pairs, tile_passes=tile_passes,
            out_valid_bits=out_valid_bits, wbuf_memories=wbuf_memories, out_banks=out_banks,
            streamed_weights=streamed_weights, narrow_iomem=narrow_iomem, narrow_out=narrow_out)
        pe_config = self._opts.config
        W = pe_config.word_bits
        super().__init__({
            "cmd": In(stream.Signature(command_layout())),
            "ld": In(stream.Signature(unsigned(W))),
            "o": Out(stream.Signature(o_beat_layout(pe_config))),
            "link_o": Out(stream.Signature(unsigned(W))),
            "link_i": In(stream.Signature(unsigned(W))),
        })
        # not a port: a design around the PE may watch it (BoardTop keeps it sticky)
        self.rw_collision = Signal(name="rw_collision")

    # ---- parameters (elmoe3d.config.PEOptions) ----------------------------------------------

    @property
    def options(self) -> PEOptions:
        """The validated build options (unit counts resolved) and the timing they imply."""
        return self._opts

    @property
    def config(self) -> PEConfig:
        """Memory geometry (:class:`~elmoe3d.config.PEConfig`)."""
        return self._opts.config

    @property
    def rows(self) -> int:
        """M: token rows per tile beat."""
        return self._opts.rows

    @property
    def lanes(self) -> int:
        """N: unit-PE lanes per row."""
        return self._opts.lanes

    @property
    def word_bits(self) -> int:
        """W: bits of every memory word and of every ``ld``, ``o`` and link beat."""
        return self._opts.word_bits

    @property
    def mul_stages(self) -> int:
        """Registers after each VPU multiplier (``SwiGLUUnit`` / ``CombineUnit``)."""
        return self._opts.mul_stages

    @property
    def requant_units(self) -> int:
        """C: :class:`~elmoe3d.hw.vpu.RequantUnit` s of the requantization engine, INT8 codes
        per cycle; an HBUF word takes :attr:`requant_word_cycles` cycles."""
        return self._opts.requant_units

    @property
    def fp32_units(self) -> int:
        """K: :class:`~elmoe3d.hw.vpu.Fp32Converter` s of the OUTPUT engine; an ``o`` DATA beat
        takes :attr:`output_beat_cycles` cycles."""
        return self._opts.fp32_units

    @property
    def combine_units(self) -> int:
        """J: :class:`~elmoe3d.hw.vpu.CombineUnit` s of the COMBINE sink; a result row takes
        :attr:`combine_row_cycles` cycles."""
        return self._opts.combine_units

    @property
    def swiglu_units(self) -> int:
        """S: :class:`~elmoe3d.hw.vpu.SwiGLUUnit` s of the SWIGLU sink; a result row takes
        :attr:`swiglu_row_cycles` cycles."""
        return self._opts.swiglu_units

    @property
    def out_banks(self) -> int:
        """OUT memories: 2 (even and odd words) or 1."""
        return self._opts.out_banks

    @property
    def wbuf_memories(self) -> int:
        """Memories per WMEM plane: 2 (one per buffer) or 1 (both buffers in one)."""
        return self._opts.wbuf_memories

    @property
    def out_valid_bits(self) -> bool:
        """OUT and ROWMAX have valid bits (one-cycle CLEAR)."""
        return self._opts.out_valid_bits

    @property
    def tile_dsp_pairs(self) -> bool:
        """The tile's ``dsp_pairs`` (two IA8xW5 products per FPGA DSP multiplier)."""
        return self._opts.tile_dsp_pairs

    @property
    def tile_passes(self) -> int:
        """The tile's ``passes`` (a GEMM beat every ``tile_passes`` cycles)."""
        return self._opts.tile_passes

    @property
    def streamed_weights(self) -> bool:
        """WMSB, WLSB and WSCALE W/P bits wide, the planes read a tile pass at a time."""
        return self._opts.streamed_weights

    @property
    def narrow_iomem(self) -> bool:
        """ACT, TOK, HBUF and ROWMAX W/P bits wide, ACT read a tile pass at a time."""
        return self._opts.narrow_iomem

    @property
    def narrow_out(self) -> bool:
        """OUT W/P bits wide."""
        return self._opts.narrow_out

    def _tile_params(self) -> dict:
        return self._opts.tile_params

    # ---- timing (cycles; elmoe3d.config.PEOptions) ------------------------------------------

    @property
    def combine_row_cycles(self) -> dict:
        """Cycles of the COMBINE sink per result row, by FULL (:attr:`PEOptions.combine_row_cycles
        <elmoe3d.config.PEOptions.combine_row_cycles>`)."""
        return self._opts.combine_row_cycles

    @property
    def swiglu_row_cycles(self) -> dict:
        """Cycles of the SWIGLU sink per result row, by FULL (:attr:`PEOptions.swiglu_row_cycles
        <elmoe3d.config.PEOptions.swiglu_row_cycles>`)."""
        return self._opts.swiglu_row_cycles

    @property
    def clear_cycles(self) -> int:
        """Cycles of ``CLEAR`` with ``out`` or ``rowmax`` (:attr:`PEOptions.clear_cycles
        <elmoe3d.config.PEOptions.clear_cycles>`)."""
        return self._opts.clear_cycles

    @property
    def output_beat_cycles(self) -> int:
        """Cycles per ``o`` DATA beat of OUTPUT with a ready ``o``: ``W/32 / fp32_units``."""
        return self._opts.output_beat_cycles

    @property
    def requant_word_cycles(self) -> int:
        """Cycles per HBUF word of REQUANT: ``W/32 / requant_units`` (a token row of
        ``channels`` values in ``channels / requant_units`` cycles; the next row's e' is
        prepared meanwhile, so very short rows take longer)."""
        return self._opts.requant_word_cycles

    @property
    def load_queue_depth(self) -> int:
        """LOAD commands the decoder can queue for the load engine."""
        return self._opts.load_queue_depth

    @property
    def tile_latency(self) -> int:
        """Cycles from the tile accepting a ``last`` beat to its result."""
        return self._opts.tile_latency

    @property
    def swiglu_latency(self) -> int:
        """Cycles of the SwiGLU unit."""
        return self._opts.swiglu_latency

    @property
    def combine_latency(self) -> int:
        """Cycles of the combine unit."""
        return self._opts.combine_latency

    @property
    def sink_latency(self) -> dict:
        """Cycles from the sink taking a tile result to the first effect of its first row, per
        sink (:attr:`PEOptions.sink_latency <elmoe3d.config.PEOptions.sink_latency>`)."""
        return self._opts.sink_latency

    @property
    def result_cycles(self) -> dict:
        """Cycles the sink holds one tile result, by ``(sink, psum_in)``
        (:attr:`PEOptions.result_cycles <elmoe3d.config.PEOptions.result_cycles>`)."""
        return self._opts.result_cycles

    @property
    def gemm_gap(self) -> int:
        """Idle tile cycles between the last beat of a GEMM and the first beat of the next
        GEMM waiting behind it: none (decoded meanwhile, it starts in the last cycle)."""
        return self._opts.gemm_gap

    def elaborate(self, platform):
        m = Module()
        opts = self._opts
        cfg = opts.config
        R, L, W = cfg.rows, cfg.lanes, cfg.word_bits
        G, P = opts.tile_config.group, opts.tile_passes
        # parts of a word: WMSB, WLSB and WSCALE (streamed_weights), ACT, TOK, HBUF and ROWMAX
        # (narrow_iomem), OUT (narrow_out); a word's part p at address w P + p
        parts = P if opts.streamed_weights else 1
        io_parts = P if opts.narrow_iomem else 1
        out_parts = P if opts.narrow_out else 1
        vb = opts.out_valid_bits

        # ---- memories (docs/pe.md "Memories"; the ports' multiplexers are built at the end)
        mems = PEMemories(m, config=cfg, weight_parts=parts, io_parts=io_parts,
                          out_parts=out_parts, wbuf_memories=opts.wbuf_memories,
                          out_banks=opts.out_banks, valid_bits=vb)

        # ---- the parts ----------------------------------------------------------------------
        dec = m.submodules.decoder = CommandDecoder(load_queue_depth=opts.load_queue_depth)
        link = m.submodules.link = LinkPort(rows=R, group=G, word_bits=W, passes=P,
                                            narrow_iomem=opts.narrow_iomem,
                                            narrow_out=opts.narrow_out)
        parted = ((Target.WMSB, Target.WLSB, Target.WSCALE) if parts > 1 else ()) \
            + link.narrow_targets
        lde = m.submodules.load = LoadEngine(word_bits=W, parted=parted, passes=P,
                                             low_words=cfg.wmem_low_words)
        ex = m.submodules.execute = ExecuteEngine()
        clr = m.submodules.clear = ClearEngine(valid_bits=vb, cycles=opts.clear_cycles)
        tile = m.submodules.tile = TensorTile(**opts.tile_params)
        gi = m.submodules.gemm = GemmIssue(
            tile=opts.tile_config, word_bits=W, passes=P, weight_parts=parts,
            act_parts=io_parts, wbuf_memories=opts.wbuf_memories, wmem_words=cfg.wmem_words,
            wscale_words=cfg.wscale_words, low_words=cfg.wmem_low_words)
        rs = m.submodules.result = ResultStage(tile=opts.tile_config, word_bits=W,
                                               tail=opts.completion_cycles, io_parts=io_parts)
        sw = m.submodules.swiglu = SwiGLUSink(lanes=L, word_bits=W,
                                              swiglu_units=opts.swiglu_units,
                                              mul_stages=opts.mul_stages, io_parts=io_parts)
        cmb = m.submodules.combine = CombineSink(lanes=L, word_bits=W,
                                                 combine_units=opts.combine_units,
                                                 mul_stages=opts.mul_stages,
                                                 out_parts=out_parts)
        rqe = m.submodules.requant = RequantEngine(rows=R, word_bits=W, group=G,
                                                   requant_units=opts.requant_units,
                                                   io_parts=io_parts)
        opx = m.submodules.output = OutputEngine(rows=R, word_bits=W,
                                                 fp32_units=opts.fp32_units,
                                                 out_banks=opts.out_banks, out_parts=out_parts)
        stat = m.submodules.status = StatusCounters(config=cfg)
        # the VPU units are the PE's own children (synthesis leaves, elmoe3d.synth.blocks)
        for prefix, part, units in (("swiglu", sw, sw.units), ("combine", cmb, cmb.units),
                                    ("requant", rqe, rqe.units), ("fp32_", opx, opx.units)):
            for j, (unit, to_unit, from_unit) in enumerate(zip(units,
                                                               *unit_streams(part, len(units)))):
                m.submodules[f"{prefix}{j}"] = unit
                wiring.connect(m, to_unit, unit.i)
                wiring.connect(m, unit.o, from_unit)
        m.submodules.rowmax_exponent = rme = rqe.rowmax_exponent
        wiring.connect(m, rqe.rme_i, rme.i)
        wiring.connect(m, rme.o, rqe.rme_o)

        # ---- streams ------------------------------------------------------------------------
        wiring.connect(m, wiring.flipped(self.cmd), dec.cmd)
        wiring.connect(m, dec.ld, lde.queue)
        wiring.connect(m, wiring.flipped(self.ld), lde.ld)
        wiring.connect(m, gi.beat, tile.i)
        wiring.connect(m, tile.o, rs.result)
        wiring.connect(m, link.link_o, wiring.flipped(self.link_o))
        wiring.connect(m, wiring.flipped(self.link_i), link.link_i)

        # ---- control ------------------------------------------------------------------------
        xc = ex.xc
        xop = Value.cast(xc.op)
        st = {name: getattr(ex, f"in_{name.lower()}") for name in EXEC_STATES}
        ld_busy = lde.active | dec.ld.valid
        # LOADs queue behind a BARRIER, CLEAR counters or STATUS (decoded while it waits): the
        # load engine holds a LOAD while one taken before it has not started, and a BARRIER
        # waits only for the LOADs before it (a LOAD's `need` counts the execute commands
        # before it)
        def load_hold(need):
            return ((dec.xn_valid & dec.xn_hold & older(dec.xn_seq, need))
                    | (ex.hold_loads & older(ex.xc_seq, need)))
        ld_before_x = ((lde.active & ~older(ex.xc_seq, lde.need))
                       | (dec.ld.valid & ~older(ex.xc_seq, dec.ld.payload.need)))
        ld_take = dec.ld.valid & dec.ld.ready
        gemm_busy = Signal()
        m.d.comb += gemm_busy.eq(gi.busy | rs.busy | sw.busy | cmb.busy)
        # OUTPUT with two OUT banks starts while the COMBINE sink still writes (and while stage
        # A holds a row it skips, gate 0): it reads a pair of OUT words only when no write to
        # them is still in the units (CombineSink.pair_busy)
        early_output = opts.output_early
        if early_output:
            output_busy = (gi.busy | rs.busy_behind | (rs.row_valid & ~cmb.a_skip)
                           | sw.busy)
        else:
            output_busy = gemm_busy
        output_start = ex.start & (xop == Op.OUTPUT)
        if early_output:
            m.d.comb += [cmb.pair_probe.eq(opx.rd_addr), opx.rd_hold.eq(cmb.pair_busy)]
        # completion tracking: (valid, seq) of every place an unfinished execute command can be;
        # a command is complete when no valid entry carries its number
        inflight = {f"result{k}": (rs.pending[k], rs.pending_seq[k])
                    for k in range(len(rs.pending))}
        inflight.update(xn=(dec.xn_valid, dec.xn_seq), xc=(ex.busy, ex.xc_seq),
                        rq=(rqe.busy, rqe.seq), held=(gi.held, gi.held_seq))

        def done_before(ref, *, skip=()):
            pending = [v & older(q, ref) for name, (v, q) in inflight.items() if name not in skip]
            return ~Cat(pending).any()

        status_done = st["STATUS"] & self.o.ready
        m.d.comb += [
            dec.xn_take.eq(ex.xn_take), dec.rq_busy.eq(rqe.busy),
            ex.xn.eq(dec.xn), ex.xn_valid.eq(dec.xn_valid), ex.xn_seq.eq(dec.xn_seq),
            ex.full.eq(lde.full), ex.rq_busy.eq(rqe.busy), ex.rq_seq.eq(rqe.seq),
            ex.dq_valid.eq(rs.dq_valid), ex.step.eq(gi.step), ex.final.eq(gi.final),
            ex.gemm_busy.eq(gemm_busy), ex.output_busy.eq(output_busy),
            ex.ld_busy.eq(ld_before_x),
            ex.done.eq(clr.done | link.send_done | link.recv_done | status_done | opx.done),
            # the fence and hold of the LOAD run in the next cycle (the queue's head if the
            # engine takes it now), which the load engine registers (docs/synth.md "Timing")
            lde.fence_ok.eq(Mux(ld_take, done_before(dec.ld.payload.need),
                                done_before(lde.need))),
            lde.hold.eq(Mux(ld_take, load_hold(dec.ld.payload.need), load_hold(lde.need))),
            lde.release.eq(ex.release), lde.release_buf.eq(xc.args.gemm.wbuf),
            # the releasing GEMM reads a half of its buffer no more (a flag per half)
            lde.release_low.eq(gi.low_done & xc.args.gemm.release),
            lde.release_high.eq(gi.high_done & xc.args.gemm.release),
            gi.args.eq(xc.args.gemm), gi.next_args.eq(dec.xn.args.gemm),
            gi.start_cur.eq(ex.start_cur), gi.start_next.eq(ex.start_next),
            gi.issuing.eq(ex.issuing),
            gi.phase.eq(tile.phase), gi.next_pass.eq(tile.next_pass),
            gi.result_taken.eq(tile.o.valid & tile.o.ready), gi.seq.eq(ex.xc_seq),
            rs.start_cur.eq(ex.start_cur), rs.args.eq(xc.args.gemm), rs.seq.eq(ex.xc_seq),
            rs.start_next.eq(ex.start_next), rs.next_args.eq(dec.xn.args.gemm),
            rs.next_seq.eq(dec.xn_seq),
            rs.psum_valid.eq(self.link_i.valid), rs.psum_data.eq(self.link_i.payload),
            rs.raw_ready.eq(self.link_o.ready), rs.stall.eq(sw.stall | cmb.stall),
            sw.row_valid.eq(rs.row_valid), sw.row.eq(rs.row), sw.tok_entry.eq(rs.tok_entry),
            cmb.row_valid.eq(rs.row_valid), cmb.row.eq(rs.row), cmb.tok_entry.eq(rs.tok_entry),
            cmb.feed.eq(rs.feed), cmb.feed_tok.eq(rs.feed_tok),
            cmb.feed_load.eq(~(sw.stall | cmb.stall)),
            clr.start.eq(ex.start & (xop == Op.CLEAR)), clr.args.eq(xc.args.clear),
            clr.active.eq(st["CLEAR"]),
            link.send_start.eq(ex.start & (xop == Op.SEND)), link.send_args.eq(xc.args.send),
            link.recv_start.eq(ex.start & (xop == Op.RECV)), link.recv_args.eq(xc.args.recv),
            link.sending.eq(st["SEND"]), link.receiving.eq(st["RECV"]),
            link.raw_valid.eq(rs.raw_valid), link.raw_data.eq(rs.raw_data),
            link.psum_need.eq(rs.psum_need),
            rqe.issue.eq(dec.rq_issue), rqe.args.eq(self.cmd.payload.args.requant),
            rqe.seq_in.eq(dec.x_seq), rqe.older_done.eq(done_before(rqe.seq, skip=("rq",))),
            # the ACT write port goes to the load engine first: REQUANT holds meanwhile
            rqe.hold.eq(lde.active & (lde.target == Target.ACT) & (lde.left != 0)
                        & ~lde.blocked & self.ld.valid),
            opx.start.eq(output_start), opx.args.eq(xc.args.output),
            opx.active.eq(st["OUTPUT"]), opx.o_ready.eq(self.o.ready & ~st["STATUS"]),
        ]
        counts = {
            "cycles": 1,
            "load_busy": ld_busy,
            "exec_busy": ~ex.idle | gemm_busy | rqe.busy,
            "stall": ex.wait_flag | ex.barrier | ex.rq_wait,
            "gemm_beats": tile.i.valid & tile.i.ready,
            "words_loaded": lde.xfer,
            "words_sent": self.link_o.valid & self.link_o.ready,
            "words_received": self.link_i.valid & self.link_i.ready,
        }
        m.d.comb += [getattr(stat.inc, name).eq(inc) for name, inc in counts.items()]
        m.d.comb += [
            stat.clear.eq(clr.counters), stat.flags_clear.eq(clr.flags),
            stat.acc_set.eq(rs.acc_set),
            stat.vpu_set.eq(sw.vpu_set | cmb.vpu_set | link.vpu_set | rqe.vpu_saturation),
            stat.snap.eq(ex.start & (xop == Op.STATUS)),
            self.o.valid.eq(st["STATUS"] | opx.valid),
            Value.cast(self.o.payload.kind).eq(st["STATUS"]),
            self.o.payload.data.eq(Mux(st["STATUS"], Value.cast(stat.beat), opx.bits)),
        ]

        # ---- the parts' memory reads and writes, in each port's priority order
        mems.connect(m, gemm=gi, next_pass=tile.next_pass, result=rs, swiglu=sw, combine=cmb,
                     clear=clr, link=link, requant=rqe, output=opx, sending=st["SEND"],
                     # with two OUT banks OUTPUT reads its first pair as it starts
                     outputting=st["OUTPUT"] | (output_start if early_output else 0))
        # the ports' multiplexers; the load engine writes with the lowest priority
        m.d.comb += lde.grant.eq(mems.build(
            m, payload=self.ld.payload, target=lde.target, buf=lde.buf, addr=lde.addr,
            xfer=lde.xfer, part=lde.part, part_write=lde.part_write, parted=parted,
            act_elems=act_part_elems(R, G, P), lanes=L))

        # internal signals a test bench may watch (cycle accounting); no logic of their own
        collisions = mems.collisions
        self.probes = {"ld_xfer": lde.xfer, "ld_active": lde.active, "ld_blocked": lde.blocked,
                       "tile_in": tile.i.valid & tile.i.ready, "g_issuing": ex.issuing,
                       "ex_idle": ex.idle, "gemm_busy": gemm_busy, "wait_flag": ex.wait_flag,
                       "barrier": ex.barrier, "xop": xop, "full0": lde.full[0],
                       "full1": lde.full[1], "low0": lde.low[0], "low1": lde.low[1],
                       "high0": lde.high[0], "high1": lde.high[1],
                       "tile_out": tile.o.valid & tile.o.ready,
                       "result_skid": rs.skid_valid,
                       "hbuf_write": sw.hbuf_w_en, "out_write": cmb.w_en,
                       "tile_held_mid_beat": tile.i.valid & (tile.phase != 0)
                                             & ~tile.next_pass & ~tile.i.ready,
                       "rq_busy": rqe.busy, "rq_wait": ex.rq_wait,
                       "rq_rowmax_read": rqe.rmax_rd,
                       "fence_wait": lde.fence_wait,
                       "rw_collision": self.rw_collision,
                       **{f"rw_collision_{k}": v for k, v in collisions.items()}}
        m.d.comb += self.rw_collision.eq(Cat(collisions.values()).any())
        return m

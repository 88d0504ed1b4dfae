"""The processing element (PE): memories, command decoder, load and execute engines, the
tensor tile and its VPU sinks (paper Sections 4.1 and 5.2, Fig. 6 centre, Fig. 10b).

The contract is ``docs/pe.md``; the ISA is :mod:`elmoe3d.isa` (Amaranth layouts in
:mod:`elmoe3d.hw.isa`); the numerics are ``docs/numerics.md``. The functional reference is
:mod:`elmoe3d.sw.golden.pe`: the RTL and it run the same programs in the same tests and are compared
with plain equality.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ...config import PEConfig, TileConfig, pe_config as as_pe_config
from ...isa import Op, Sink, Target
from ..fixed import sat_add64
from ..isa import command_layout, o_beat_layout, op_layout, status_layout, tok_entry_layout
from ..layouts import TileMode
from ..tile import TensorTile
from ..vpu import CombineUnit, Fp32Converter, RequantUnit, RowMaxExponent, SwiGLUUnit
from .common import COUNTER_BITS as _COUNTER_BITS, SEQ, fld, log2 as _log2, older, unit_count
from .decoder import CommandDecoder
from .load import LoadEngine
from .output import OutputEngine
from .requant import RequantEngine
from .status import StatusCounters
from .memories import BankedReads as _BankedReads, BankedWrites as _BankedWrites, \
    Reads as _Reads, Writes as _Writes, memory as _memory


__all__ = ["PE", "unit_count"]


def _latency(cls, **params) -> int:
    """The ``latency`` property of a block built with ``params`` (the instance is only
    inspected, never elaborated)."""
    block = cls(**params)
    block._MustUse__silence = True
    return block.latency


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
        order).
    o : Out, :func:`elmoe3d.hw.isa.o_beat_layout`
        ``kind`` DATA (W/32 FP32 results of OUTPUT) or STATUS (counters and sticky flags).
    link_o, link_i : Out / In, W bits
        Aggregation-link port: RAW psums and SEND words out, RECV words in.

    Memories (``amaranth.lib.memory``, one write and one synchronous read port each)
    ---------------------------------------------------------------------------------
    WMEM: 2 buffers x (MSB plane, LSB plane) x ``wmem_words`` words plus 2 x ``wscale_words``
    scale words (the planes are separate memories, so a DRAFT GEMM reads only MSB words and
    the planes can arrive from different sources; a memory per buffer, or both buffers of a
    plane in one with ``wbuf_memories=1``); IOMEM: ACT (byte write enables, for REQUANT), TOK
    (byte enables, for e_h), HBUF (32-bit enables), OUT in two banks (even and odd words, or
    one memory with ``out_banks=1``; 64-bit enables, transparent read for the COMBINE
    read-modify-write, valid bits), and one 32-bit row-max register per TOK entry, W/32 registers per word (the
    ROWMAX word of SEND / RECV; a transparent memory with 32-bit enables, valid bits and a
    second read port for REQUANT). Valid bits make ``CLEAR out`` / ``CLEAR rowmax`` one
    cycle. Sizes: :class:`~elmoe3d.config.PEConfig`.

    Engines (``docs/pe.md``, "Engines and synchronisation")
    -------------------------------------------------------
    * Decoder: takes commands in order and numbers the execute commands; LOADs go to a queue
      of :attr:`load_queue_depth` entries for the load engine, REQUANT to the requantization
      engine (when it is free), everything else to a one-command register in front of the
      execute engine. BARRIER (and ``CLEAR counters``) holds back later LOADs until all earlier
      work is done.
    * Load engine (``LOAD.src`` and ``LOAD.hb_addr`` are for the die's load router and are not
      even queued: the words arrive on ``ld`` in LOAD order whatever their source):
      one ``ld`` beat per cycle into the target memory, the next LOAD from the
      cycle after the previous one's last word (lowest write priority, but for ACT above
      REQUANT, which holds meanwhile); a load into a WMEM plane of a buffer whose flag
      ``full[b]`` is set waits for the GEMM that releases it; ``signal`` sets ``full[b]`` when
      the load completes; ``fence`` waits until every execute command before the LOAD has
      completed (sequence numbers against every place an unfinished command can be: the
      command register, the execute engine, REQUANT, the GEMM descriptors, the result and
      sink registers and a delay line as long as the VPU pipelines).
    * Execute engine: GEMM (``wait`` for ``full[wbuf]``; ``release`` clears it when the last
      weight word has been read, so the next load overlaps the GEMM's drain; ``rq_wait`` for
      earlier REQUANTs), OUTPUT, CLEAR, SEND, RECV (``ROWMAX`` with ``accumulate``: unsigned
      max; OUT: saturating add), BARRIER, STATUS. A GEMM whose buffer is
      ready follows the previous one's last beat with no idle cycle (:attr:`gemm_gap`) and may
      start while earlier ones drain; other commands first wait until every earlier GEMM and
      REQUANT has completed.
    * Requantization engine: REQUANT, started when every earlier execute command has
      completed, then beside later GEMMs.

    GEMM datapath (II = 1; one beat every ``tile_passes`` cycles)
    ----------------------
    Address generator (cb, half, rb, g; ``docs/pe.md``) -> synchronous reads of ACT, both
    WMEM planes and the scale word (1 cycle; data held while the tile stalls) -> beat
    forming (FULL: half ``half`` of the MSB and LSB words interleaved onto lanes 2i / 2i+1,
    scale entry ``entry & 7`` of word ``entry >> 3``) -> :class:`~elmoe3d.hw.tile.TensorTile`
    (:attr:`tile_latency` cycles, global stall) -> result register (``psum_in``: the
    ``rows * lanes / (W/64)`` ``link_i`` words of the result, one a cycle, added into it with
    saturating s64 additions that set ``acc_overflow``; word ``k`` holds rows ``2k`` and
    ``2k + 1``, which the sink takes once it is added; a ``link_i`` word not yet valid stalls
    the sink) -> the sink (every sink in every mode; MSB_ONLY and LSB_ONLY results have the
    DRAFT layout):

    * RAW: ``rows * lanes / (W/64)`` link words per result (accumulator ``[r][n]`` at value
      ``r * lanes + n``).
    * SWIGLU and COMBINE: one result row per cycle (SWIGLU with fewer than ``lanes / 2``
      :attr:`swiglu_units`: one row per :attr:`swiglu_row_cycles`; COMBINE with fewer than
      ``lanes`` :attr:`combine_units`: one row per :attr:`combine_row_cycles`). Cycle 0: TOK
      entry read. SWIGLU: S = :attr:`swiglu_units` :class:`~elmoe3d.hw.vpu.SwiGLUUnit` s
      (default ``lanes / 2``; the row's channels in sub-steps of S, the row held in stage
      A) -> masked HBUF word write, then the row-max read-modify-write (per sub-step).
      COMBINE: OUT word read (stalling while a write to the same granules is in flight; rows
      with gate weight +-0 add nothing and are skipped)
      -> J = :attr:`combine_units` :class:`~elmoe3d.hw.vpu.CombineUnit` s (default
      ``lanes``; the row's lanes in ``lanes / J`` sub-steps) -> masked OUT writes.
      :attr:`sink_latency`.

    A result is taken every ``rows * swiglu_row_cycles`` cycles (SWIGLU; COMBINE ``rows *
    combine_row_cycles``) or ``rows * lanes / (W/64)`` cycles (RAW, with a ready link), one
    more with ``psum_in`` (a ``link_i`` word offered every cycle) unless a row takes several
    cycles (:attr:`result_cycles`), so GEMMs with at least that many groups run at one beat
    per cycle (II = 1). REQUANT: per token row, the row max ->
    :class:`~elmoe3d.hw.vpu.RowMaxExponent` (e', e_h written into TOK; prepared while the
    previous row streams) -> C = :attr:`requant_units` :class:`~elmoe3d.hw.vpu.RequantUnit` s,
    C values per cycle, into ACT
    (byte enables; one HBUF word in ``W/32 / C`` cycles). OUTPUT: two OUT words (one per bank,
    or one after the other with ``out_banks=1``; W/32 Q.24 values) per beat through K = :attr:`fp32_units`
    :class:`~elmoe3d.hw.vpu.Fp32Converter` s, one ``o`` beat every ``W/32 / K`` cycles
    (:attr:`output_beat_cycles`; sub-step ``s`` converts values ``[s K, (s+1) K)`` while the
    OUT read port holds the pair, or with ``out_banks=1`` the word of the pair those values
    are in, and the beat is offered once assembled).

    STATUS: 48-bit counters (cycles, load engine busy, execute engine busy, stall on a buffer
    flag or BARRIER, GEMM beats, words loaded / sent / received) and the sticky flags
    ``acc_overflow`` (a tile accumulator saturated) and ``vpu_saturation``
    (:data:`elmoe3d.sw.golden.asm.STATUS_FIELDS`).

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
        of each. True (needs ``tile_passes`` P > 1; an FPGA option): they are W/P bits wide
        and P times as deep, part p of word w at address ``w P + p`` (with both buffers in
        one memory, ``(b wmem_words + w) P + p`` for buffer b) holding depths
        ``p G/P .. (p+1) G/P - 1`` of every lane (lane n's bits ``128 n + 128 p/P ..`` of the
        loaded word, lane after lane). The tile takes its weights a pass at a time
        (``TensorTile(streamed_weights=True)``): the beat reads part 0 and every further pass
        the next part, so a weight plane's read data, its block-RAM data pins and the beat's
        weight multiplexers are W/P bits wide instead of W. WSCALE too is W/P bits wide (part
        p of a scale word holds its entries ``8 p/P ..``; the beat reads the part of its
        entry). A LOAD into WMSB, WLSB or WSCALE writes a word in P cycles (part by part,
        ``ld.ready`` in the last), other LOADs one word a cycle as before. Every result is
        unchanged, and so are a GEMM's cycles once its weights are in (one that waits for
        its own weight LOAD starts up to P - 1 cycles a weight word later).
    narrow_iomem : bool
        False (default): ACT, TOK, HBUF and ROWMAX are W bits wide. True (needs
        ``tile_passes`` P > 1 and ``requant_units`` at most min(W/32, 32)/P; an FPGA option):
        they are W/P bits wide and P times as deep, part p of word w at address ``w P + p``.
        ACT's part p holds depths ``p G/P .. (p+1) G/P - 1`` of every row (bytes ``r G + p G/P ..`` of
        the word, row after row), so the tile takes its activations a pass at a time
        (``TensorTile(streamed_acts=True)``) as it does the weights with
        ``streamed_weights``; the others' part p holds bits ``p W/P ..`` (HBUF values and
        row-max registers ``p W/32/P ..``, TOK entries ``p W/64/P ..``). REQUANT and the
        SWIGLU and COMBINE sinks read and write the one part their values are in, in the same
        cycles (the row-max read-modify-write included); a LOAD or RECV into them writes a
        word in P cycles (``ld.ready`` / ``link_i.ready`` in the last; a ROWMAX RECV with
        ``accumulate`` takes the maximum a part a cycle), a SEND of them reads a word in P
        cycles into a W-bit register and offers it the cycle after (P + 1 cycles a word), and
        CLEAR without valid bits writes ROWMAX a part a cycle. Every result is unchanged; a
        GEMM's beats after its loads come in the same cycles.
    narrow_out : bool
        False (default): OUT is W bits wide. True (needs ``tile_passes`` P > 1, ``out_banks``
        1, ``out_valid_bits`` False, and ``combine_units`` and ``fp32_units`` at most W/64/P;
        an FPGA option): OUT is W/P bits wide and P times as deep, part p of word w at
        ``w P + p`` holding values ``p W/64/P ..`` (bits ``p W/P ..``). The COMBINE sink
        reads and writes the part of each sub-step's values (read one cycle ahead, in the
        same cycles), OUTPUT reads a part for each ``W/64/P / fp32_units`` sub-steps (the
        same beat rate), a RECV with ``accumulate`` adds a part a cycle; LOAD, plain RECV and
        SEND as ACT with ``narrow_iomem``, and CLEAR writes a part a cycle
        (:attr:`clear_cycles`). Every result is unchanged.

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
        pe_config = as_pe_config(config)
        rows, lanes = pe_config.rows, pe_config.lanes
        if lanes % 4 or lanes != 2 * rows:
            raise ValueError(f"config: the PE needs lanes % 4 == 0 and lanes == 2 * rows, got "
                             f"rows={rows}, lanes={lanes}")
        if lanes & (lanes - 1):
            raise ValueError(f"config: the PE needs a power-of-two number of lanes (word "
                             f"addressing by shifts), got {lanes}")
        if (not isinstance(mul_stages, int) or isinstance(mul_stages, bool)
                or not 1 <= mul_stages <= 4):
            raise ValueError(f"mul_stages: expected an integer in 1..4, got {mul_stages!r}")
        W = pe_config.word_bits
        Q = W // 32
        requant_units = unit_count("requant_units", requant_units, min(Q, 32),
                                    f"in 1..min(W/32, 32) = 1..{min(Q, 32)}")
        fp32_units = unit_count("fp32_units", fp32_units, Q, f"dividing W/32 = {Q} (1..{Q})")
        combine_units = unit_count("combine_units", combine_units, lanes,
                                    f"dividing lanes = {lanes} (1..{lanes})")
        swiglu_units = unit_count("swiglu_units", swiglu_units, lanes // 2,
                                   f"dividing lanes / 2 = {lanes // 2} (1..{lanes // 2})")
        if not isinstance(tile_dsp_pairs, bool):
            raise ValueError(f"tile_dsp_pairs: expected a bool, got {tile_dsp_pairs!r}")
        if (not isinstance(tile_passes, int) or isinstance(tile_passes, bool)
                or tile_passes not in (1, 2, 4)):
            raise ValueError(f"tile_passes: expected 1, 2 or 4, got {tile_passes!r}")
        if not isinstance(out_valid_bits, bool):
            raise ValueError(f"out_valid_bits: expected a bool, got {out_valid_bits!r}")
        if (not isinstance(wbuf_memories, int) or isinstance(wbuf_memories, bool)
                or wbuf_memories not in (1, 2)):
            raise ValueError(f"wbuf_memories: expected 1 or 2, got {wbuf_memories!r}")
        w_words = pe_config.wmem_words
        if wbuf_memories == 1 and w_words & (w_words - 1):
            raise ValueError(f"wbuf_memories: one memory for both buffers needs a power-of-two "
                             f"wmem_words (the buffer is the top address bit), got {w_words}")
        self._wbuf_memories = wbuf_memories
        if (not isinstance(out_banks, int) or isinstance(out_banks, bool)
                or out_banks not in (1, 2)):
            raise ValueError(f"out_banks: expected 1 or 2, got {out_banks!r}")
        if out_banks == 1 and fp32_units == W // 32:
            raise ValueError(f"out_banks: one OUT memory needs fewer than W/32 = {W // 32} "
                             f"fp32_units (an o beat's two OUT words are read one after the "
                             f"other, one per half of its sub-steps), got fp32_units="
                             f"{fp32_units}")
        self._out_banks = out_banks
        if not isinstance(streamed_weights, bool):
            raise ValueError(f"streamed_weights: expected a bool, got {streamed_weights!r}")
        if streamed_weights and tile_passes == 1:
            raise ValueError("streamed_weights: the weights come a pass at a time, so it needs "
                             "tile_passes 2 or 4, got tile_passes=1")
        self._streamed_weights = streamed_weights
        if not isinstance(narrow_iomem, bool):
            raise ValueError(f"narrow_iomem: expected a bool, got {narrow_iomem!r}")
        if narrow_iomem:
            if tile_passes == 1:
                raise ValueError("narrow_iomem: ACT comes a tile pass at a time, so it needs "
                                 "tile_passes 2 or 4, got tile_passes=1")
            # REQUANT's C codes of a cycle go into one ACT part (32/P depths of a row) from one
            # HBUF part (W/32/P values); the SWIGLU sink's S <= lanes / 2 values always fit
            # (W/32/P = 4 lanes / P)
            per_part = min(Q, 32) // tile_passes
            if requant_units > per_part:
                raise ValueError(f"narrow_iomem: the requant_units values of a cycle must lie "
                                 f"in one HBUF part and one ACT row part, min(W/32, 32)/P = "
                                 f"{per_part} values, got requant_units={requant_units}")
        self._narrow_iomem = narrow_iomem
        if not isinstance(narrow_out, bool):
            raise ValueError(f"narrow_out: expected a bool, got {narrow_out!r}")
        if narrow_out:
            per_part = W // 64 // tile_passes
            needs = (("tile_passes", tile_passes > 1, "2 or 4"),
                     ("out_banks", out_banks == 1, "1"),
                     ("out_valid_bits", not out_valid_bits, "False"),
                     ("combine_units", combine_units <= per_part, f"at most W/64/P = {per_part}"),
                     ("fp32_units", fp32_units <= per_part, f"at most W/64/P = {per_part}"))
            for name, ok, want in needs:
                if not ok:
                    got = {"tile_passes": tile_passes, "out_banks": out_banks,
                           "out_valid_bits": out_valid_bits, "combine_units": combine_units,
                           "fp32_units": fp32_units}[name]
                    raise ValueError(f"narrow_out: OUT in W/P-bit parts needs {name} {want}, "
                                     f"got {name}={got}")
        self._narrow_out = narrow_out
        self._pe = pe_config
        self._tile_config = TileConfig(rows=rows, lanes=lanes)
        self._mul_stages = mul_stages
        self._requant_units = requant_units
        self._fp32_units = fp32_units
        self._combine_units = combine_units
        self._swiglu_units = swiglu_units
        self._tile_dsp_pairs = tile_dsp_pairs
        self._out_valid_bits = out_valid_bits
        self._tile_passes = tile_passes
        super().__init__({
            "cmd": In(stream.Signature(command_layout())),
            "ld": In(stream.Signature(unsigned(W))),
            "o": Out(stream.Signature(o_beat_layout(pe_config))),
            "link_o": Out(stream.Signature(unsigned(W))),
            "link_i": In(stream.Signature(unsigned(W))),
        })
        # not a port: a design around the PE may watch it (BoardTop keeps it sticky)
        self.rw_collision = Signal(name="rw_collision")

    # ---- parameters ---------------------------------------------------------------------------

    @property
    def config(self) -> PEConfig:
        """Memory geometry (:class:`~elmoe3d.config.PEConfig`)."""
        return self._pe

    @property
    def rows(self) -> int:
        """M: token rows per tile beat."""
        return self._pe.rows

    @property
    def lanes(self) -> int:
        """N: unit-PE lanes per row."""
        return self._pe.lanes

    @property
    def word_bits(self) -> int:
        """W: bits of every memory word and of every ``ld``, ``o`` and link beat."""
        return self._pe.word_bits

    @property
    def mul_stages(self) -> int:
        """Registers after each VPU multiplier (``SwiGLUUnit`` / ``CombineUnit``)."""
        return self._mul_stages

    @property
    def requant_units(self) -> int:
        """C: :class:`~elmoe3d.hw.vpu.RequantUnit` s of the requantization engine, INT8 codes
        per cycle (a power of two in 1..min(W/32, 32); default min(W/32, 32)). One HBUF word
        (W/32 values) takes ``W/32 / C`` cycles (:attr:`requant_word_cycles`)."""
        return self._requant_units

    @property
    def fp32_units(self) -> int:
        """K: :class:`~elmoe3d.hw.vpu.Fp32Converter` s of the OUTPUT engine (a power of two
        dividing W/32; default W/32). One ``o`` DATA beat (W/32 FP32 values, two OUT words)
        takes ``W/32 / K`` cycles (:attr:`output_beat_cycles`)."""
        return self._fp32_units

    @property
    def combine_units(self) -> int:
        """J: :class:`~elmoe3d.hw.vpu.CombineUnit` s of the COMBINE sink (a power of two
        dividing ``lanes``; default ``lanes``). A result row takes :attr:`combine_row_cycles`
        cycles in the sink instead of one."""
        return self._combine_units

    @property
    def combine_row_cycles(self) -> dict:
        """Cycles the COMBINE sink spends on one result row, by mode FULL (``True``: L/2
        values) and not FULL (``False``: L values): ``ceil(values / combine_units)``."""
        L, J = self.lanes, self._combine_units
        return {True: max(L // 2 // J, 1), False: L // J}

    @property
    def out_banks(self) -> int:
        """OUT memories: 2 (even and odd words) or 1."""
        return self._out_banks

    @property
    def wbuf_memories(self) -> int:
        """Memories per WMEM plane: 2 (one per buffer) or 1 (both buffers in one)."""
        return self._wbuf_memories

    @property
    def out_valid_bits(self) -> bool:
        """OUT and ROWMAX have valid bits (one-cycle CLEAR)."""
        return self._out_valid_bits

    @property
    def clear_cycles(self) -> int:
        """Cycles of ``CLEAR`` with ``out`` or ``rowmax`` set, from its start to its last
        write: 1 with :attr:`out_valid_bits`, otherwise one per row of the larger of the OUT
        banks (``ceil(out_words / out_banks)``; ``out_words * P`` parts with
        :attr:`narrow_out`) and ROWMAX (``ceil(tok_entries / (W/32))``, times P with
        :attr:`narrow_iomem`)."""
        if self._out_valid_bits:
            return 1
        cfg = self._pe
        parts = self._tile_passes if self._narrow_out else 1
        rm_parts = self._tile_passes if self._narrow_iomem else 1
        return max(-(-cfg.out_words * parts // self._out_banks),
                   -(-cfg.tok_entries // (cfg.word_bits // 32)) * rm_parts)

    @property
    def swiglu_units(self) -> int:
        """S: :class:`~elmoe3d.hw.vpu.SwiGLUUnit` s of the SWIGLU sink (a power of two
        dividing ``lanes / 2``; default ``lanes / 2``). A result row takes
        :attr:`swiglu_row_cycles` cycles in the sink instead of one."""
        return self._swiglu_units

    @property
    def swiglu_row_cycles(self) -> dict:
        """Cycles the SWIGLU sink spends on one result row, by mode FULL (``True``: L/4
        channels) and not FULL (``False``: L/2 channels): ``ceil(channels / swiglu_units)``."""
        L, S = self.lanes, self._swiglu_units
        return {True: max(L // 4 // S, 1), False: L // 2 // S}

    @property
    def output_beat_cycles(self) -> int:
        """Cycles per ``o`` DATA beat of OUTPUT with a ready ``o``: ``W/32 / fp32_units`` (the
        converters take values ``[s K, (s+1) K)`` of the beat in sub-step ``s``)."""
        return self.word_bits // 32 // self._fp32_units

    @property
    def requant_word_cycles(self) -> int:
        """Cycles per HBUF word (W/32 Q16.16 values) of REQUANT: ``W/32 / requant_units``;
        a token row of ``channels`` values streams in ``channels / requant_units`` cycles (the
        next row's e' is prepared meanwhile, in a few cycles, so very short rows take
        longer)."""
        return self.word_bits // 32 // self._requant_units

    @property
    def tile_dsp_pairs(self) -> bool:
        """Passed to :class:`~elmoe3d.hw.tile.TensorTile` as ``dsp_pairs`` (two IA8xW5
        products per FPGA DSP multiplier)."""
        return self._tile_dsp_pairs

    @property
    def tile_passes(self) -> int:
        """Passed to :class:`~elmoe3d.hw.tile.TensorTile` as ``passes`` (a GEMM beat every
        ``tile_passes`` cycles)."""
        return self._tile_passes

    @property
    def streamed_weights(self) -> bool:
        """WMSB and WLSB W/P bits wide, read a tile pass at a time (P = :attr:`tile_passes`),
        and WSCALE W/P bits wide; a LOAD into them takes P cycles a word."""
        return self._streamed_weights

    @property
    def narrow_iomem(self) -> bool:
        """ACT, TOK, HBUF and ROWMAX W/P bits wide (P = :attr:`tile_passes`), ACT read a tile
        pass at a time; a LOAD, RECV or SEND of them takes P cycles a word (SEND P + 1)."""
        return self._narrow_iomem

    @property
    def narrow_out(self) -> bool:
        """OUT W/P bits wide (P = :attr:`tile_passes`); a LOAD, RECV or SEND of it takes P
        cycles a word (SEND P + 1), CLEAR a cycle a part."""
        return self._narrow_out

    def _tile_params(self) -> dict:
        return {"config": self._tile_config, "dsp_pairs": self._tile_dsp_pairs,
                "passes": self._tile_passes, "streamed_weights": self._streamed_weights,
                "streamed_acts": self._narrow_iomem}

    @property
    def load_queue_depth(self) -> int:
        """LOAD commands the decoder can queue for the load engine (so that a LOAD waiting for
        a buffer flag or a fence does not block the execute commands behind it)."""
        return 16

    @property
    def tile_latency(self) -> int:
        """Cycles from the tile accepting a ``last`` beat to its result
        (:attr:`TensorTile.latency <elmoe3d.hw.tile.TensorTile.latency>`)."""
        return _latency(TensorTile, **self._tile_params())

    @property
    def swiglu_latency(self) -> int:
        """Cycles of the SwiGLU unit (:attr:`SwiGLUUnit.latency`)."""
        return _latency(SwiGLUUnit, mul_stages=self._mul_stages)

    @property
    def combine_latency(self) -> int:
        """Cycles of the combine unit (:attr:`CombineUnit.latency`)."""
        return _latency(CombineUnit, mul_stages=self._mul_stages)

    @property
    def sink_latency(self) -> dict:
        """Cycles from the sink taking a tile result to the first effect of its first row, per
        sink (no stall): RAW 1 (first link word offered), SWIGLU 2 + the SwiGLU unit (HBUF
        write; the row-max update follows a cycle later), COMBINE 3 + the combine unit (OUT
        write; TOK read, OUT read and the unit in between)."""
        return {Sink.RAW: 1,
                Sink.SWIGLU: 2 + self.swiglu_latency,
                Sink.COMBINE: 3 + self.combine_latency}

    @property
    def result_cycles(self) -> dict:
        """Cycles the sink holds one tile result (``rows x lanes`` accumulators), by
        ``(sink, psum_in)``, with ready outputs and, for ``psum_in``, a ``link_i`` word offered
        in every cycle: RAW ``rows * lanes / (W/64)`` (one link word a cycle), SWIGLU ``rows *
        swiglu_row_cycles[False]`` (one row a cycle with the default ``swiglu_units``; the
        non-FULL figure), COMBINE ``rows * combine_row_cycles[False]`` (one row a cycle with
        the default ``combine_units``; the non-FULL figure, FULL rows take
        ``combine_row_cycles[True]``); ``psum_in`` adds its ``rows * lanes / (W/64)``
        words (one a cycle, overlapped with the sink, which takes a row or word as soon as it
        has been added) and one cycle per result, except where a row takes several cycles
        (time-shared units: the addition hides behind the previous result's last row). A GEMM
        with at least that many groups issues one tile beat per cycle."""
        raw = self.rows * self.lanes // (self.word_bits // 64)
        out = {(Sink.RAW, False): raw, (Sink.RAW, True): raw + 1}
        for sink, row in ((Sink.SWIGLU, self.swiglu_row_cycles[False]),
                          (Sink.COMBINE, self.combine_row_cycles[False])):
            out[(sink, False)], out[(sink, True)] = self.rows * row, self.rows * row + (row == 1)
        return out

    @property
    def gemm_gap(self) -> int:
        """Idle tile cycles between the last beat of a GEMM and the first beat of the next
        GEMM waiting behind it (its buffer already full, its descriptor slot free): none, the
        next GEMM is decoded while the current one runs and starts in its last cycle."""
        return 0

    def elaborate(self, platform):
        m = Module()
        cfg = self._pe
        R, L, W = cfg.rows, cfg.lanes, cfg.word_bits
        OV = W // 64                  # Q.24 values per OUT word = TOK entries per word
        Q = W // 32                   # Q16.16 values per HBUF word = FP32 values per o beat
        log_ov, log_q = _log2(OV), _log2(Q)

        # ---- memories (one write port, one synchronous read port each) ------------------------
        # A memory with ``collision_free`` is never read and written at the same word in one
        # cycle by a program that keeps to the buffer flags, fences and REQUANT waits (reads
        # are enabled only for the words a consumer takes; :attr:`probes` ``rw_collision``
        # shows any, and the benches assert it never fires). It carries Yosys's
        # ``no_rw_check`` attribute, which the FPGA flow applies to its read port
        # (:func:`elmoe3d.synth.fpga.apply_no_rw_check`): no W-bit bypass register and
        # multiplexer emulating read-first around the block RAM.
        collisions = {}

        def memory(name, depth, *, width=W, **kw):
            return _memory(m, collisions, name, depth, width=width, **kw)

        # WMEM: per plane a memory per buffer, or (wbuf_memories == 1) one memory of twice the
        # depth addressed by Cat(word address, buffer): the same words at the same ports
        split = self._wbuf_memories == 2
        # streamed_weights: the MSB and LSB planes in P parts of W/P bits a word (part p of word
        # w at w P + p: depths p G/P .. of every lane, lane after lane)
        P = self._tile_passes
        parts = P if self._streamed_weights else 1
        log_parts, part_lane = _log2(parts), 128 // parts   # a lane: 32 nibbles

        def wmem_plane(name, depth, parts=1):
            if split:
                return [memory(f"{name}{b}", depth * parts, width=W // parts,
                               collision_free=True) for b in range(2)]
            return memory(name, 2 * depth * parts, width=W // parts, collision_free=True)

        def in_buffer(addr, buf, depth):
            return Cat(addr[:_log2(depth)], buf)

        wmsb = wmem_plane("wmsb", cfg.wmem_words, parts)
        wlsb = wmem_plane("wlsb", cfg.wmem_words, parts)
        wscl = wmem_plane("wscale", cfg.wscale_words, parts)   # (8/P scale entries a part)
        wmem_depths = {Target.WMSB: cfg.wmem_words, Target.WLSB: cfg.wmem_words,
                       Target.WSCALE: cfg.wscale_words}
        # narrow_iomem: ACT, TOK, HBUF and ROWMAX in P parts of W/P bits a word (part p of word
        # w at w P + p): ACT's part p holds depths p G/P .. of every row, row after row (bytes
        # act_elems[p] of the word), the others bits p W/P .. of the word; narrow_out: OUT the
        # same way
        narrow, narrow_o = self._narrow_iomem, self._narrow_out
        io_parts = P if narrow else 1
        out_parts = P if narrow_o else 1
        narrow_targets = (((Target.ACT, Target.TOK, Target.HBUF, Target.ROWMAX) if narrow else ())
                          + ((Target.OUT,) if narrow_o else ()))
        G = self._tile_config.group
        # (TOK, ROWMAX, OUT and, with streamed_weights, WSCALE the same way: bits p W/P ..)
        act_elems = [[r * G + p * (G // P) + j for r in range(R) for j in range(G // P)]
                     for p in range(P)]

        def io_parts_of(value, target):
            """The P parts of a W-bit ``value`` of a ``target`` stored in parts."""
            if target == Target.ACT:
                return [Cat(value[8 * e:8 * (e + 1)] for e in part) for part in act_elems]
            return [value.word_select(p, W // P) for p in range(P)]

        def io_word_of(target):
            """The inverse of :func:`io_parts_of`: (bit range of the word, bits of the part)
            pairs of each part."""
            if target == Target.ACT:
                return [[((8 * e, 8 * (e + 1)), (8 * j, 8 * (j + 1))) for j, e in enumerate(part)]
                        for part in act_elems]
            return [[((p * W // P, (p + 1) * W // P), (0, W // P))] for p in range(P)]

        act_rp, act_w = memory("act", cfg.act_words * io_parts, width=W // io_parts,
                               granularity=8, collision_free=True)
        tok_rp, tok_w = memory("tok", cfg.tok_words * io_parts, width=W // io_parts,
                               granularity=8)
        hbuf_rp, hbuf_w = memory("hbuf", cfg.hbuf_words * io_parts, width=W // io_parts,
                                 granularity=32, collision_free=True)
        # OUT and the row-max registers have valid bits (out_valid_bits): CLEAR takes one cycle
        # OUT in two banks (even and odd words): OUTPUT reads two words, one o beat, a cycle
        vb = self._out_valid_bits
        if self._out_banks == 2:
            out_banks = [memory(f"out{b}", (cfg.out_words + 1 - b) // 2, granularity=64,
                                transparent=True, valid_bits=vb) for b in range(2)]
            out_rp = _BankedReads([rp for rp, _ in out_banks])
            out_w = _BankedWrites([wr for _, wr in out_banks])
            out_w_banks = out_w.banks
        else:                         # one memory (out_banks=1): OUTPUT reads word by word
            out_rp, out_w = memory("out", cfg.out_words * out_parts, width=W // out_parts,
                                   granularity=64, transparent=True, valid_bits=vb)
            out_w_banks = [out_w]
        # the row maxima, W/32 registers of 32 bits per word (the ROWMAX word of SEND / RECV):
        # one read port for the SWIGLU sink's updates (and SEND / RECV), one for REQUANT
        rmax_words = -(-cfg.tok_entries // Q)
        rmax_rp, rmax_rq, rmax_w = memory("rowmax", rmax_words * io_parts, width=W // io_parts,
                                          granularity=32, transparent=True, valid_bits=vb,
                                          read_ports=2)
        load_targets = {
            **{t: [plane[0][1], plane[1][1]] if split else [plane[1]]
               for t, plane in ((Target.WMSB, wmsb), (Target.WLSB, wlsb), (Target.WSCALE, wscl))},
            Target.ACT: [act_w],
            Target.TOK: [tok_w],
            Target.HBUF: [hbuf_w],
            Target.OUT: [out_w],
        }

        # ---- sticky flags ------------------------------------------------------------------------
        flag_acc = Signal()           # a tile accumulator saturated
        flag_vpu = Signal()           # any VPU saturation
        set_vpu = []                  # conditions that set flag_vpu in this cycle

        # ---- command decoder: LOADs to the load engine's queue, REQUANT to its engine, the
        # next execute command in a register (xn); sequence numbers for completion tracking
        dec = m.submodules.decoder = CommandDecoder(load_queue_depth=self.load_queue_depth)
        wiring.connect(m, wiring.flipped(self.cmd), dec.cmd)
        ex_idle = Signal()
        ex_barrier = Signal()
        x_seq = dec.x_seq                        # execute commands taken so far
        xn, xn_valid, xn_seq = dec.xn, dec.xn_valid, dec.xn_seq   # the next execute command
        xn_take = Signal()                       # the execute engine takes xn in this cycle
        xn_op = Value.cast(xn.op)
        rq_busy = Signal()            # the requantization engine holds a REQUANT
        rq_seq = Signal(SEQ)
        rq_issue = dec.rq_issue
        m.d.comb += [dec.xn_take.eq(xn_take), dec.ex_barrier.eq(ex_barrier),
                     dec.rq_busy.eq(rq_busy)]

        # completion tracking: (valid, seq) of every place an unfinished execute command can be
        # (filled in below); a command is complete when no valid entry carries its number
        inflight = {}

        def done_before(ref, *, skip=()):
            pending = [v & older(q, ref) for name, (v, q) in inflight.items() if name not in skip]
            return ~Cat(pending).any()

        # ---- load engine and the WMEM buffer flags ---------------------------------------------
        parted = ((Target.WMSB, Target.WLSB, Target.WSCALE) if parts > 1 else ()) + narrow_targets
        lde = m.submodules.load = LoadEngine(word_bits=W, parted=parted, passes=P)
        wiring.connect(m, wiring.flipped(self.ld), lde.ld)
        wiring.connect(m, dec.ld, lde.queue)
        full = [lde.full[0], lde.full[1]]

        def full_sel(b):
            return Mux(b, full[1], full[0])

        ld_release = Signal()         # a GEMM releases its buffer (full[wbuf] cleared)
        ld_active, ld_target, ld_buf = lde.active, lde.target, lde.buf
        ld_addr, ld_left, ld_fence, ld_need = lde.addr, lde.left, lde.fence, lde.need
        ld_blocked, ld_xfer = lde.blocked, lde.xfer
        ld_part, ld_part_write = lde.part, lde.part_write
        ld_busy = ld_active | dec.ld.valid
        fence_ok = Signal()                      # every execute command before ld_need is done
        ld_grant = Signal()
        m.d.comb += [lde.fence_ok.eq(fence_ok), lde.grant.eq(ld_grant),
                     lde.release.eq(ld_release)]

        # ---- execute engine: GEMM address generator -------------------------------------------
        xc = Signal(command_layout())            # the command being executed
        xc_seq = Signal(SEQ)
        xop = Value.cast(xc.op)

        def gx(name):
            return fld(xc, Op.GEMM, name)

        m.d.comb += lde.release_buf.eq(gx("wbuf"))

        g_is_full = gx("mode") == TileMode.FULL.value
        g_cb = Signal(10)
        g_half = Signal()
        g_rb = Signal(8)
        g_g = Signal(8)
        g_act_row = Signal(16)                   # act_base + rb * groups
        g_w_blk = Signal(16)                     # w_base + cb * groups
        g_issuing = Signal()
        g_last_g = g_g == gx("groups") - 1
        g_last_rb = g_rb == gx("row_blocks") - 1
        g_last_half = ~g_is_full | g_half
        g_last_cb = g_cb == gx("col_blocks") - 1
        g_final = g_last_g & g_last_rb & g_last_half & g_last_cb

        # beat stage: the read ports' data plus the beat's side band
        bv = Signal()
        b_mode = Signal(2)
        b_wbuf = Signal()
        b_half = Signal()
        b_slot = Signal(3)
        b_first = Signal()
        b_last = Signal()
        tile = m.submodules.tile = TensorTile(**self._tile_params())
        adv = ~bv | tile.i.ready
        g_step = g_issuing & adv
        w_addr = Signal(16)
        m.d.comb += w_addr.eq(g_w_blk + g_g)
        # only the words a beat takes are read: the GEMM's buffer (the other may be loading
        # meanwhile), the MSB plane unless LSB_ONLY, the LSB plane in FULL and LSB_ONLY (a
        # DRAFT GEMM may run while the LSB plane of its buffer is loaded)
        g_lsb_only = gx("mode") == TileMode.LSB_ONLY.value
        g_reads_msb, g_reads_lsb = ~g_lsb_only, g_is_full | g_lsb_only
        b_is_full = b_mode == TileMode.FULL.value
        b_is_lsb = b_mode == TileMode.LSB_ONLY.value
        # streamed_weights: part 0 with the beat, part phase + 1 while the tile takes pass phase
        b_waddr = Signal(16)                     # the beat's word (in its memory)
        b_part = (tile.phase + 1)[:log_parts] if parts > 1 else Const(0, 0)
        # narrow_iomem: the ACT word of the beat, read the same way
        b_aaddr = Signal(16)
        log_io = _log2(io_parts)
        log_np = _log2(P) if narrow_targets else 0    # part counters of SEND / RECV
        b_apart = (tile.phase + 1)[:log_io] if narrow else Const(0, 0)

        # a scale word holds 8 entries; with streamed_weights a part 8/P, read with the beat
        scl_shift = 3 - log_parts

        def w_planes(planes, addr, b_addr):
            (msb, g_en, b_en), (lsb, g_en_l, b_en_l) = planes
            for rp, en, b_rd in ((msb, g_en, b_en), (lsb, g_en_l, b_en_l)):
                if parts == 1:
                    rp.request(1, addr, en)
                else:
                    rp.request(g_step, Cat(Const(0, log_parts), addr), en)
                    rp.request(tile.next_pass, Cat(b_part, b_addr), b_rd)

        if split:
            for b in range(2):
                w_rd = g_step & (gx("wbuf") == b)
                b_rd = b_wbuf == b
                w_planes(((wmsb[b][0], w_rd & g_reads_msb, b_rd & ~b_is_lsb),
                          (wlsb[b][0], w_rd & g_reads_lsb, b_rd & (b_is_full | b_is_lsb))),
                         w_addr, b_waddr)
                wscl[b][0].request(1, w_addr >> scl_shift, w_rd)
            g_waddr = w_addr
        else:
            g_wbuf = gx("wbuf")
            g_waddr = in_buffer(w_addr, g_wbuf, cfg.wmem_words)
            w_planes(((wmsb[0], g_step & g_reads_msb, ~b_is_lsb),
                      (wlsb[0], g_step & g_reads_lsb, b_is_full | b_is_lsb)), g_waddr, b_waddr)
            wscl[0].request(1, in_buffer(w_addr >> scl_shift, g_wbuf, cfg.wscale_words * parts),
                            g_step)
        with m.If(adv):
            m.d.sync += [
                b_waddr.eq(g_waddr),
                b_aaddr.eq(g_act_row + g_g),
                bv.eq(g_issuing),
                b_mode.eq(gx("mode")),
                b_wbuf.eq(gx("wbuf")),
                b_half.eq(g_half),
                b_slot.eq(w_addr[:3]),
                b_first.eq(g_g == 0),
                b_last.eq(g_last_g),
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

        # the tile beat (docs/pe.md "GEMM address generation"): FULL interleaves half `half` of
        # the MSB and LSB words, lane 2i <- MSB[half*L/2 + i], lane 2i+1 <- LSB[half*L/2 + i]
        beat = tile.i.payload
        if split:
            msb_word, lsb_word, scl_word = (Mux(b_wbuf, plane[1][0].data, plane[0][0].data)
                                            for plane in (wmsb, wlsb, wscl))
        else:
            msb_word, lsb_word, scl_word = (plane[0].data for plane in (wmsb, wlsb, wscl))
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
        if narrow:                    # (narrow_iomem: the pass's part, row by row)
            row_bits = 8 * G // P
            for r in range(R):
                m.d.comb += Value.cast(beat.act[r])[:row_bits].eq(
                    act_rp.data[row_bits * r:row_bits * (r + 1)])
        else:
            m.d.comb += Value.cast(beat.act).eq(act_rp.data)
        m.d.comb += [
            Value.cast(beat.mode).eq(b_mode),
            beat.first.eq(b_first),
            beat.last.eq(b_last),
            tile.i.valid.eq(bv),
        ]
        tile_pending = Signal(range(16))         # last beats accepted, results not yet taken
        tile_in = tile.i.valid & tile.i.ready
        tile_out = tile.o.valid & tile.o.ready
        m.d.sync += tile_pending.eq(tile_pending + (tile_in & beat.last) - tile_out)

        # ---- sink: GEMM descriptors, result capture --------------------------------------------
        # A GEMM hands its sink parameters over when it starts issuing; the sink holds one
        # pending and one active descriptor, so back-to-back GEMMs overlap their drain.
        def desc_regs(prefix):
            return {
                "sink": Signal(2, name=f"{prefix}_sink"),
                "full": Signal(name=f"{prefix}_full"),
                "rbn": Signal(8, name=f"{prefix}_rbn"),
                "cbn": Signal(10, name=f"{prefix}_cbn"),
                "out_base": Signal(16, name=f"{prefix}_out_base"),
                "tok_base": Signal(8, name=f"{prefix}_tok_base"),
                "stride": Signal(16, name=f"{prefix}_stride"),
                "pin": Signal(name=f"{prefix}_pin"),
                "seq": Signal(SEQ, name=f"{prefix}_seq"),
            }
        dq, ds = desc_regs("dq"), desc_regs("ds")
        dq_valid = Signal()
        s_active = Signal()
        s_cb = Signal(10)
        s_half = Signal()
        s_rb = Signal(8)
        s_t0 = Signal(16)            # tok_base + rb * rows
        s_ch = Signal(16)            # out_base + block index * channels per block
        s_last = (s_rb == ds["rbn"] - 1) & (~ds["full"] | s_half) & (s_cb == ds["cbn"] - 1)
        block_channels = Mux(ds["sink"] == Sink.SWIGLU,
                             Mux(ds["full"], L // 4, L // 2),
                             Mux(ds["full"], L // 2, L))

        res_valid = Signal()
        res_acc = Signal(data.ArrayLayout(data.ArrayLayout(signed(64), L), R))
        res_sink = Signal(2)
        res_full = Signal()
        res_t0 = Signal(16)
        res_ch = Signal(16)
        res_stride = Signal(16)
        res_pin = Signal()           # the held result takes psum_in words
        res_seq = Signal(SEQ)
        res_done = Signal()          # the sink finishes the held result in this cycle
        m.d.comb += tile.o.ready.eq(~res_valid | res_done)

        with m.If(res_done):
            m.d.sync += res_valid.eq(0)
        with m.If(tile_out):
            m.d.sync += [
                res_valid.eq(1),
                res_acc.eq(tile.o.payload.acc),
                res_sink.eq(ds["sink"]),
                res_full.eq(ds["full"]),
                res_t0.eq(s_t0),
                res_ch.eq(s_ch),
                res_stride.eq(ds["stride"]),
                res_pin.eq(ds["pin"]),
                res_seq.eq(ds["seq"]),
                flag_acc.eq(flag_acc | Value.cast(tile.o.payload.overflow).any()),
            ]
            with m.If(s_rb == ds["rbn"] - 1):
                m.d.sync += [s_rb.eq(0), s_t0.eq(ds["tok_base"]),
                             s_ch.eq(s_ch + block_channels)]
                with m.If(~ds["full"] | s_half):
                    m.d.sync += [s_half.eq(0), s_cb.eq(s_cb + 1)]
                with m.Else():
                    m.d.sync += s_half.eq(1)
            with m.Else():
                m.d.sync += [s_rb.eq(s_rb + 1), s_t0.eq(s_t0 + R)]
            with m.If(s_last):
                m.d.sync += s_active.eq(0)
        with m.If(dq_valid & (~s_active | (tile_out & s_last))):
            m.d.sync += [dq_valid.eq(0), s_active.eq(1), s_cb.eq(0), s_half.eq(0),
                         s_rb.eq(0), s_t0.eq(dq["tok_base"]), s_ch.eq(dq["out_base"])]
            m.d.sync += [ds[k].eq(dq[k]) for k in dq]

        # ---- psum_in: link_i words added into the held result, one word (W/64 values) a cycle --
        # word k holds accumulators [r][n] at value positions k*W/64 .. (the RAW layout), i.e.
        # rows 2k and 2k+1 (W/64 = 2 * lanes); the sinks take a word's rows once it is added
        raw_words = R * L // OV
        pin_k = Signal(range(raw_words + 1))      # words of the held result added so far
        pin_need = res_valid & res_pin & (pin_k != raw_words)
        pin_take = Signal()
        res_bits = Value.cast(res_acc)
        pin_old = res_bits.word_select(pin_k[:max(_log2(raw_words), 1)] if raw_words > 1 else 0,
                                       W)
        pin_sum = Signal(W)
        pin_ovf = Signal(OV)
        for j in range(OV):
            total, wrap = sat_add64(pin_old[64 * j:64 * (j + 1)],
                                    self.link_i.payload[64 * j:64 * (j + 1)])
            m.d.comb += [pin_sum[64 * j:64 * (j + 1)].eq(total), pin_ovf[j].eq(wrap)]
        with m.If(pin_take):
            m.d.sync += pin_k.eq(pin_k + 1)
            for k in range(raw_words):
                with m.If(pin_k == k):
                    m.d.sync += res_bits.word_select(k, W).eq(pin_sum)
            with m.If(pin_ovf.any()):
                m.d.sync += flag_acc.eq(1)
        with m.If(tile_out):
            m.d.sync += pin_k.eq(0)

        # ---- RAW sink: accumulators onto link_o, W/64 values per word ----------------------------
        raw_k = Signal(range(max(raw_words, 2)))
        raw_valid = res_valid & (res_sink == Sink.RAW) & (~res_pin | (raw_k < pin_k))
        raw_take = raw_valid & self.link_o.ready
        with m.If(raw_take):
            m.d.sync += raw_k.eq(Mux(raw_k == raw_words - 1, 0, raw_k + 1))
        raw_done = raw_take & (raw_k == raw_words - 1)

        # ---- VPU sinks: one result row per cycle (COMBINE: per combine_row_cycles) --------------
        # stage A: the row and its TOK entry (read in flight); SWIGLU rows enter the SwiGLU units
        # from here, COMBINE rows read their OUT word (stalling on a write still in flight)
        res_r = Signal(range(max(R, 2)))
        vpu_rows = res_valid & (res_sink != Sink.RAW) & (~res_pin | ((res_r >> 1) < pin_k))
        stall_a = Signal()
        row_take = vpu_rows & ~stall_a
        row_t = Signal(16)
        m.d.comb += row_t.eq(res_t0 + res_r)
        with m.If(row_take):
            m.d.sync += res_r.eq(Mux(res_r == R - 1, 0, res_r + 1))
        vpu_res_done = row_take & (res_r == R - 1)

        a_valid = Signal()
        a_acc = Signal(data.ArrayLayout(signed(64), L))
        a_sink = Signal(2)
        a_full = Signal()
        a_t = Signal(16)
        a_ch = Signal(16)
        a_stride = Signal(16)
        a_seq = Signal(SEQ)
        with m.If(~stall_a):
            m.d.sync += [
                a_valid.eq(row_take),
                a_acc.eq(res_acc[res_r]),
                a_sink.eq(res_sink),
                a_full.eq(res_full),
                a_t.eq(row_t),
                a_ch.eq(res_ch),
                a_stride.eq(res_stride),
                a_seq.eq(res_seq),
            ]
        # (narrow_iomem: TOK and ROWMAX words of OV/P entries and Q/P registers)
        log_tk, log_rm = log_ov - _log2(io_parts), log_q - _log2(io_parts)
        tok_entry = data.View(tok_entry_layout(), tok_rp.data.word_select(a_t[:log_tk], 64))

        # SwiGLU lanes: P = L/2 (DRAFT) or L/4 (FULL, per half) channels per row. Each half of
        # a weight word holds [up c..c+L/4-1, gate c..c+L/4-1] (docs/pe.md): DRAFT pairs lane
        # j with lane j + L/4 within each half of the result; FULL (lane 2i = MSB lane i of
        # the half) pairs lane 2j with lane L/2 + 2j. S = swiglu_units units take channels
        # [s S, (s+1) S) of the row in sub-step s (P/S sub-steps, at least one), the row held
        # in stage A meanwhile; each sub-step writes its own HBUF values and updates the row max.
        S = self._swiglu_units
        n_sw_max = L // 2 // S
        n_sw_full = max(L // 4 // S, 1)
        grain = {False: S, True: min(S, L // 4)}     # values an HBUF write takes, by FULL
        sw_sub = Signal(range(max(n_sw_max, 2)))
        a_sw = a_valid & (a_sink == Sink.SWIGLU)
        sw_last = Signal()            # the row's last sub-step enters the units in this cycle
        m.d.comb += sw_last.eq(sw_sub == Mux(a_full, n_sw_full - 1, n_sw_max - 1))
        with m.If(a_sw):
            m.d.sync += sw_sub.eq(Mux(sw_last, 0, sw_sub + 1))
        # Tag of unit 0: HBUF word address, position of the sub-step's first value in the
        # word, FULL, token row, start (channel 0 of the row: the row max starts).
        sw_tag = {"addr": unsigned(16), "pos": unsigned(max(log_q, 1)), "full": unsigned(1),
                  "t": unsigned(16), "start": unsigned(1)}
        sw_tag_layout = data.StructLayout(sw_tag)
        sw_units = []

        def sw_pair(c, full):
            """(up, gate) accumulator lanes of channel ``c`` of a row."""
            if full:
                return (2 * c) % L, (L // 2 + 2 * c) % L
            d_up = (c // (L // 4)) * (L // 2) + c % (L // 4)
            return d_up, d_up + L // 4

        def by_sub(values):
            return Array(values)[sw_sub] if n_sw_max > 1 else values[0]

        for j in range(S):
            unit = SwiGLUUnit(tag_width=sw_tag_layout.size if j == 0 else 0,
                              mul_stages=self._mul_stages)
            m.submodules[f"swiglu{j}"] = unit
            sw_units.append(unit)
            # (a FULL row never reaches sub-steps n_sw_full.., whose entries are don't-care:
            # selecting among only its sub-steps measured 749 LUT4 positions more on the
            # board top, 2026-11-30, so the mux is the same shape for both modes)
            up, gate = (
                Mux(a_full, by_sub([a_acc[sw_pair(s * S + j, True)[k]] for s in range(n_sw_max)]),
                    by_sub([a_acc[sw_pair(s * S + j, False)[k]] for s in range(n_sw_max)]))
                for k in range(2))
            m.d.comb += [
                unit.i.valid.eq(a_sw),
                unit.i.payload.acc_up.eq(up),
                unit.i.payload.acc_gate.eq(gate),
                unit.i.payload.e_x.eq(tok_entry.e_x),
                unit.o.ready.eq(1),
            ]
        sw_tag_in = Signal(sw_tag_layout)
        m.d.comb += [
            sw_tag_in.addr.eq(a_t * a_stride + (a_ch >> log_q)),
            sw_tag_in.pos.eq((a_ch[:log_q] + sw_sub * S)[:log_q] if log_q else 0),
            sw_tag_in.full.eq(a_full),
            sw_tag_in.t.eq(a_t),
            sw_tag_in.start.eq((a_ch == 0) & (sw_sub == 0)),
            sw_units[0].i.payload.tag.eq(sw_tag_in),
        ]
        sw_out = sw_units[0].o.valid
        sw_tag_out = data.View(sw_tag_layout, sw_units[0].o.payload.tag)
        sw_full = sw_tag_out.full
        # HBUF write: value q of the word <- h[q mod G], enabled where q // G == pos // G (G
        # the values of a sub-step: S, or L/4 in FULL mode when fewer channels than units)
        hb_data = Signal(W)
        hb_mask = Signal(Q)
        gf, gd = grain[True], grain[False]
        for q in range(Q):
            m.d.comb += [
                hb_data[32 * q:32 * (q + 1)].eq(
                    Mux(sw_full, sw_units[q % gf].o.payload.h, sw_units[q % gd].o.payload.h)),
                hb_mask[q].eq(Mux(sw_full, (q // gf) == (sw_tag_out.pos >> _log2(gf)),
                                  (q // gd) == (sw_tag_out.pos >> _log2(gd)))),
            ]
        if narrow:
            # (a part holds Q/P values, a multiple of the grains: every part of hb_data is
            # the same, and the enabled values lie in the part of pos)
            qr = Q // P
            hb_part = Value.cast(sw_tag_out.pos)[_log2(qr):]
            hbuf_w.request(sw_out, Cat(hb_part, sw_tag_out.addr), hb_data[:W // P],
                           hb_mask.word_select(hb_part, qr))
        else:
            hbuf_w.request(sw_out, sw_tag_out.addr, hb_data, hb_mask)
        # row max |h| of the valid lanes, then a read-modify-write of the row's register (the
        # read port is transparent: a sub-step's update sees the previous sub-step's write)
        absmax = Const(0, unsigned(32))
        sw_sat = Const(0, 1)
        for j, unit in enumerate(sw_units):
            h = unit.o.payload.h
            mag = Signal(unsigned(32), name=f"sw_abs{j}")
            # (a FULL row's channels s S + j < L/4 in all its sub-steps: units j >= L/4 idle)
            live = Const(1, 1) if j < L // 4 else ~sw_full
            m.d.comb += mag.eq(Mux(live, Mux(h < 0, -h, h), 0))
            absmax = Mux(mag > absmax, mag, absmax)
            sw_sat = sw_sat | (live & unit.o.payload.sat)
        set_vpu.append(sw_out & sw_sat)
        # (the sub-step that writes channel 0 of the row starts the row's max: docs/pe.md)
        rm_valid = Signal()
        rm_t = Signal(16)
        rm_max = Signal(unsigned(32))
        rm_start = Signal()
        m.d.sync += [rm_valid.eq(sw_out), rm_t.eq(sw_tag_out.t), rm_max.eq(absmax),
                     rm_start.eq(sw_tag_out.start)]
        rmax_rp.request(sw_out, sw_tag_out.t >> log_rm, 1)
        rm_old = rmax_rp.data.word_select(rm_t[:log_rm], 32) if log_rm else rmax_rp.data
        rm_new = Mux(~rm_start & (rm_old > rm_max), rm_old, rm_max)
        rmax_w.request(rm_valid, rm_t >> log_rm, rm_new.replicate(Q // io_parts),
                       Const(1, Q // io_parts) << rm_t[:log_rm] if log_rm else 1)
        sw_inflight = Signal(range(64))
        m.d.sync += sw_inflight.eq(sw_inflight + a_sw - sw_out)

        # COMBINE: OUT word slot*stride + ch/OV, L (L/2 FULL) values at position ch mod OV.
        # A row leaves stage A into stage C (its OUT word read, held in the read port) and
        # enters the J = combine_units CombineUnits in n_sub = L/J (FULL: L/2/J) sub-steps,
        # lanes [s J, (s+1) J) in sub-step s; each sub-step writes its own OUT granules.
        cmb_lat = self.combine_latency
        J = self._combine_units
        n_sub_max = L // J
        a_cmb = a_valid & (a_sink == Sink.COMBINE)
        c_addr = Signal(16)
        c_pos = Signal(log_ov)
        c_mask = Signal(OV)
        m.d.comb += [
            c_addr.eq(tok_entry.slot * a_stride + (a_ch >> log_ov)),
            c_pos.eq(a_ch[:log_ov]),
        ]
        for q in range(OV):
            m.d.comb += c_mask[q].eq(Mux(a_full, (q // (L // 2)) == (c_pos >> _log2(L // 2)),
                                         (q // L) == (c_pos >> _log2(L))))

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
        c_tag_layout = data.StructLayout({"addr": unsigned(16), "pos": unsigned(log_ov),
                                          "full": unsigned(1),
                                          "sub": unsigned(max(_log2(n_sub_max), 1))})
        c_tag = Signal(c_tag_layout)  # the row's (registered); sub: the unit tag's sub-step
        c_tag_in = Signal(c_tag_layout)
        c_last = Signal()             # the row's last sub-step enters in this cycle
        n_sub_full = max(L // 2 // J, 1)
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
        for v, a, msk in hz:
            hazard = hazard | (v & (a == c_addr) & (msk & c_mask).any())
        # a row with gate weight +-0 adds exactly 0 (term 0, no saturation): it is skipped
        c_live = (tok_entry.gate & 0x7FFF) != 0
        c_held = c_valid & ~c_last    # stage C still busy with its row next cycle
        c_issue = a_cmb & c_live & ~hazard & ~c_held
        m.d.comb += stall_a.eq((a_cmb & c_live & (hazard | c_held)) | (a_sw & ~sw_last))
        if narrow_o:
            # the part of sub-step 0's values with the row, then each next sub-step's part
            # in the cycle before it (its J values lie in one part of OV/P: J <= OV/P)
            log_ovp = _log2(OV // P)

            def c_part(pos, sub):
                return (pos + sub * J)[log_ovp:log_ov]
            out_rp.request(c_issue, Cat(c_part(c_pos, 0), c_addr), 1)
            out_rp.request(c_valid & ~c_last, Cat(c_part(c_tag.pos, c_sub + 1), c_tag.addr), 1)
        else:
            out_rp.request(c_issue, c_addr, 1)
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
        cmb_units = []
        for j in range(J):
            unit = CombineUnit(tag_width=c_tag_layout.size if j == 0 else 0,
                               mul_stages=self._mul_stages)
            m.submodules[f"combine{j}"] = unit
            cmb_units.append(unit)
            lanes_j = [c_y[v] for v in range(j, L, J)]           # lane s J + j in sub-step s
            lane = (c_sub * J + j) if n_sub_max > 1 else j
            m.d.comb += [
                unit.i.valid.eq(c_valid),
                unit.i.payload.acc_y.eq(Array(lanes_j)[c_sub] if n_sub_max > 1 else lanes_j[0]),
                unit.i.payload.e_h.eq(c_e_h),
                unit.i.payload.gw.eq(c_gw),
                unit.i.payload.out.eq(out_rp.data.word_select(
                    (c_tag.pos + lane)[:log_ov - _log2(out_parts)], 64)),
                unit.i.payload.flag.eq(0),
                unit.o.ready.eq(1),
            ]
        m.d.comb += cmb_units[0].i.payload.tag.eq(c_tag_in)
        cmb_out = cmb_units[0].o.valid
        cmb_tag_out = data.View(c_tag_layout, cmb_units[0].o.payload.tag)
        cmb_full = cmb_tag_out.full
        ow_data = Signal(W)
        ow_mask = Signal(OV)
        out_lanes = lane_mask(cmb_full, cmb_tag_out.sub)
        for q in range(OV):
            m.d.comb += [
                ow_data[64 * q:64 * (q + 1)].eq(
                    Mux(cmb_full, cmb_units[(q % (L // 2)) % J].o.payload.out,
                        cmb_units[(q % L) % J].o.payload.out)),
                ow_mask[q].eq(out_lanes[q] & Mux(
                    cmb_full, (q // (L // 2)) == (cmb_tag_out.pos >> _log2(L // 2)),
                    (q // L) == (cmb_tag_out.pos >> _log2(L)))),
            ]
        if narrow_o:                  # the sub-step's values: one part
            w_part = c_part(cmb_tag_out.pos, cmb_tag_out.sub)
            out_w.request(cmb_out, Cat(w_part, cmb_tag_out.addr),
                          ow_data.word_select(w_part, W // P), ow_mask.word_select(w_part, OV // P))
        else:
            out_w.request(cmb_out, cmb_tag_out.addr, ow_data, ow_mask)
        cmb_flag = Const(0, 1)
        for j, unit in enumerate(cmb_units):
            if n_sub_max > 1:
                live = ~cmb_full | ((cmb_tag_out.sub * J + j) < L // 2)
            else:
                live = Const(1, 1) if j < L // 2 else ~cmb_full
            cmb_flag = cmb_flag | (live & unit.o.payload.flag)
        set_vpu.append(cmb_out & cmb_flag)
        cmb_inflight = Signal(range(64))
        m.d.sync += cmb_inflight.eq(cmb_inflight + c_valid - cmb_out)

        vpu_busy = a_valid | c_valid | rm_valid | (sw_inflight != 0) | (cmb_inflight != 0)

        # completion of GEMMs: a descriptor (dq, ds), a held result, a row in stage A, then a
        # row in the SwiGLU or combine pipeline: a delay line as long as the longest of them
        # (no stall after stage A), whose last entry is the cycle the row's last write is made
        inflight.update(dq=(dq_valid, dq["seq"]), ds=(s_active, ds["seq"]),
                        res=(res_valid, res_seq), a=(a_valid, a_seq))
        # (with time-shared combine units a row stays in stage C for its sub-steps: the line
        # covers its last write; defensive, as DRAIN also waits for vpu_busy)
        tail = max(self.swiglu_latency, self.combine_row_cycles[False] + self.combine_latency) + 1
        feed = (a_valid & ~stall_a, a_seq)       # a row leaves stage A
        for k in range(tail):
            v, q = Signal(name=f"tail_v{k}"), Signal(SEQ, name=f"tail_seq{k}")
            m.d.sync += [v.eq(feed[0]), q.eq(feed[1])]
            inflight[f"tail{k}"] = feed = (v, q)
        m.d.comb += res_done.eq(raw_done | vpu_res_done)
        gemm_busy = Signal()
        m.d.comb += gemm_busy.eq(g_issuing | bv | (tile_pending != 0) | res_valid | dq_valid
                                 | s_active | vpu_busy)

        # ---- execute engine: control -------------------------------------------------------------
        x_addr = Signal(16)
        x_left = Signal(17)
        x_target = Signal(3)
        st = {name: Signal(name=f"st_{name.lower()}") for name in
              ("CLEAR", "STATUS", "SEND", "RECV", "OUTPUT")}
        x_done = Signal()             # the current multi-cycle op finishes in this cycle
        x_start = Signal()            # DRAIN hands over to the op's state in this cycle
        g_wait_flag = Signal()        # a GEMM waits for its buffer flag
        counters_clear = Signal()

        rq_wait_stall = Signal()      # a GEMM or another command waits for the REQUANT

        def rq_before(seq):
            """A REQUANT taken before the command ``seq`` has not completed."""
            return rq_busy & older(rq_seq, seq)

        def gemm_view(view):
            return lambda name: fld(view, Op.GEMM, name)

        def gemm_ready(f, seq, releasing=Const(0, 1)):
            return ((~f("wait") | (full_sel(f("wbuf")) & ~releasing))
                    & (~f("rq_wait") | ~rq_before(seq)))

        def gemm_empty(f):
            return (f("row_blocks") == 0) | (f("col_blocks") == 0) | (f("groups") == 0)

        def start_gemm(f, seq):
            m.d.sync += [
                g_cb.eq(0), g_half.eq(0), g_rb.eq(0), g_g.eq(0),
                g_act_row.eq(f("act_base")), g_w_blk.eq(f("w_base")),
                dq_valid.eq(1),
                dq["sink"].eq(f("sink")),
                dq["full"].eq(f("mode") == TileMode.FULL.value),
                dq["rbn"].eq(f("row_blocks")),
                dq["cbn"].eq(f("col_blocks")),
                dq["out_base"].eq(f("out_base")),
                dq["tok_base"].eq(f("tok_base")),
                dq["stride"].eq(f("stride")),
                dq["pin"].eq(f("psum_in")),
                dq["seq"].eq(seq),
            ]

        def take_next():
            m.d.comb += xn_take.eq(1)
            m.d.sync += [xc.eq(xn), xc_seq.eq(xn_seq)]

        # BARRIER, and CLEAR of the counters, wait for the load engine to go idle and hold back
        # later LOADs, so that words_loaded counts exactly the LOADs before them in the program
        x_is_barrier = (xop == Op.BARRIER) | ((xop == Op.CLEAR) & fld(xc, Op.CLEAR, "counters"))
        with m.FSM(name="ex") as ex_fsm:
            with m.State("IDLE"):
                m.d.comb += ex_idle.eq(1)
                with m.If(xn_valid):
                    take_next()
                    with m.Switch(xn_op):
                        with m.Case(Op.GEMM):
                            m.next = "GEMM_START"
                        with m.Case(Op.BARRIER, Op.CLEAR, Op.STATUS, Op.SEND, Op.RECV,
                                    Op.OUTPUT):
                            m.next = "DRAIN"
            with m.State("GEMM_START"):
                ready = gemm_ready(gx, xc_seq)
                m.d.comb += [g_wait_flag.eq(~ready),
                             rq_wait_stall.eq(gx("rq_wait") & rq_before(xc_seq))]
                with m.If(ready & gemm_empty(gx)):
                    with m.If(gx("release")):
                        m.d.comb += ld_release.eq(1)
                    m.next = "IDLE"
                with m.Elif(ready & ~dq_valid):
                    start_gemm(gx, xc_seq)
                    m.next = "GEMM_RUN"
            with m.State("GEMM_RUN"):
                m.d.comb += g_issuing.eq(1)
                with m.If(g_step & g_final):
                    with m.If(gx("release")):
                        m.d.comb += ld_release.eq(1)
                    # the next GEMM, decoded and ready, issues its first beat in the next cycle
                    nx = gemm_view(xn)
                    releasing = gx("release") & (nx("wbuf") == gx("wbuf"))
                    with m.If(xn_valid & (xn_op == Op.GEMM) & gemm_ready(nx, xn_seq, releasing)
                              & ~gemm_empty(nx) & ~dq_valid):
                        take_next()
                        start_gemm(nx, xn_seq)
                    with m.Else():
                        m.next = "IDLE"
            with m.State("DRAIN"):
                m.d.comb += [ex_barrier.eq(x_is_barrier), rq_wait_stall.eq(rq_before(xc_seq))]
                with m.If(~gemm_busy & ~rq_before(xc_seq) & ~(x_is_barrier & ld_busy)):
                    m.d.comb += x_start.eq(1)
                    with m.Switch(xop):
                        with m.Case(Op.BARRIER):
                            m.next = "BARRIER"
                        for op in (Op.CLEAR, Op.STATUS, Op.SEND, Op.RECV, Op.OUTPUT):
                            with m.Case(op):
                                m.next = op.name
            with m.State("BARRIER"):
                m.next = "IDLE"
            for name in st:
                with m.State(name):
                    m.d.comb += st[name].eq(1)
                    with m.If(x_done):
                        m.next = "IDLE"
        inflight.update(xn=(xn_valid, xn_seq), xc=(~ex_fsm.ongoing("IDLE"), xc_seq))

        # ---- CLEAR (OUT and the row maxima: one cycle through their valid bits, or zeros
        # written a row a cycle, every OUT bank and ROWMAX at once) -----------------------------
        with m.If(x_start & (xop == Op.CLEAR)):
            with m.If(fld(xc, Op.CLEAR, "flags")):
                m.d.sync += [flag_acc.eq(0), flag_vpu.eq(0)]
            m.d.comb += counters_clear.eq(fld(xc, Op.CLEAR, "counters"))
        clr_out = st["CLEAR"] & fld(xc, Op.CLEAR, "out")
        clr_rmax = st["CLEAR"] & fld(xc, Op.CLEAR, "rowmax")
        if vb:
            m.d.comb += [out_w.clear.eq(clr_out), rmax_w.clear.eq(clr_rmax)]
            clear_done = st["CLEAR"]
        else:
            n_clr = self.clear_cycles
            clr_row = Signal(range(n_clr))
            for wr, en in (*((bank, clr_out) for bank in out_w_banks), (rmax_w, clr_rmax)):
                wr.request(en & (clr_row < wr.depth), clr_row, 0)
            clr_last = (clr_row == n_clr - 1) | ~(clr_out | clr_rmax)
            clear_done = st["CLEAR"] & clr_last
            with m.If(st["CLEAR"]):
                m.d.sync += clr_row.eq(Mux(clr_last, 0, clr_row + 1))

        # ---- SEND: IOMEM words onto link_o -------------------------------------------------------
        with m.If(x_start & (xop == Op.SEND)):
            m.d.sync += [x_target.eq(fld(xc, Op.SEND, "target")),
                         x_addr.eq(fld(xc, Op.SEND, "addr")),
                         x_left.eq(fld(xc, Op.SEND, "words"))]
        sv = Signal()                 # read data of the target is valid in its read port
        send_adv = ~sv | self.link_o.ready
        send_reads = {Target.ACT: act_rp, Target.TOK: tok_rp, Target.HBUF: hbuf_rp,
                      Target.OUT: out_rp, Target.ROWMAX: rmax_rp}
        def is_narrow(target_sig):
            return Cat(target_sig == t for t in narrow_targets).any()

        # a memory in parts (narrow_iomem, narrow_out): a word's P parts read one a cycle
        # (s_part), each put in its place in s_word the cycle after (s_cap), the word offered
        # once complete (s_full)
        s_narrow = is_narrow(x_target)
        s_part, s_cap_part = Signal(log_np), Signal(log_np)
        s_cap, s_full = Signal(), Signal()
        s_word = Signal(W)
        s_go = (st["SEND"] & s_narrow & (x_left != 0) & (~s_full | self.link_o.ready)
                & ~(s_cap & (s_cap_part == P - 1)))
        for target, rp in send_reads.items():
            if target in narrow_targets:
                rp.request(st["SEND"] & (x_target == target), Cat(s_part, x_addr), s_go)
            else:
                rp.request(st["SEND"] & (x_target == target), x_addr, send_adv & (x_left != 0))
        send_data = Signal(W)
        with m.Switch(x_target):
            for target, rp in send_reads.items():
                with m.Case(target):
                    m.d.comb += send_data.eq(s_word if target in narrow_targets else rp.data)
        with m.If(st["SEND"] & send_adv & ~s_narrow):
            m.d.sync += sv.eq(x_left != 0)
            with m.If(x_left != 0):
                m.d.sync += [x_addr.eq(x_addr + 1), x_left.eq(x_left - 1)]
        send_done = st["SEND"] & Mux(s_narrow, (x_left == 0) & ~s_cap & ~s_full,
                                     send_adv & (x_left == 0))
        if narrow_targets:
            m.d.sync += [s_cap.eq(s_go), s_cap_part.eq(s_part)]
            with m.If(s_go):
                m.d.sync += s_part.eq(s_part + 1)
                with m.If(s_part == P - 1):
                    m.d.sync += [x_addr.eq(x_addr + 1), x_left.eq(x_left - 1)]
            for target in narrow_targets:
                for p, places in enumerate(io_word_of(target)):
                    with m.If(s_cap & (x_target == target) & (s_cap_part == p)):
                        m.d.sync += [s_word[w0:w1].eq(send_reads[target].data[p0:p1])
                                     for (w0, w1), (p0, p1) in places]
            with m.If(s_cap & (s_cap_part == P - 1)):
                m.d.sync += s_full.eq(1)
            with m.Elif(self.link_o.ready):
                m.d.sync += s_full.eq(0)
        m.d.comb += [
            self.link_o.valid.eq(Mux(st["SEND"], Mux(s_narrow, s_full, sv), raw_valid)),
            self.link_o.payload.eq(Mux(st["SEND"], send_data,
                                       Value.cast(res_acc).word_select(raw_k, W))),
        ]

        # ---- RECV: link_i words into IOMEM (accumulate: saturating add into OUT) -----------------
        with m.If(x_start & (xop == Op.RECV)):
            m.d.sync += [x_target.eq(fld(xc, Op.RECV, "target")),
                         x_addr.eq(fld(xc, Op.RECV, "addr")),
                         x_left.eq(fld(xc, Op.RECV, "words"))]
        recv_acc = fld(xc, Op.RECV, "accumulate")
        # link_i: RECV, or a GEMM's psum_in words (never both: RECV waits for every GEMM)
        # (a memory in parts: a word in P cycles, a part a cycle, taken with its last)
        r_part = Signal(log_np)
        r_narrow = is_narrow(x_target)
        recv_part = st["RECV"] & (x_left != 0) & r_narrow & self.link_i.valid
        m.d.comb += self.link_i.ready.eq(
            (st["RECV"] & (x_left != 0) & (~r_narrow | (r_part == P - 1))) | pin_need)
        recv_take = self.link_i.valid & self.link_i.ready & st["RECV"]
        m.d.comb += pin_take.eq(self.link_i.valid & pin_need)
        with m.If(recv_take):
            m.d.sync += [x_addr.eq(x_addr + 1), x_left.eq(x_left - 1)]
        if narrow_targets:
            with m.If(recv_part):
                m.d.sync += r_part.eq(r_part + 1)
        for target, wr in {Target.ACT: act_w, Target.TOK: tok_w, Target.HBUF: hbuf_w,
                           Target.OUT: out_w, Target.ROWMAX: rmax_w}.items():
            if target in narrow_targets:
                plain = recv_part & (x_target == target)
                if target in (Target.OUT, Target.ROWMAX):
                    plain = plain & ~recv_acc
                wr.request(plain, Cat(r_part, x_addr),
                           Array(io_parts_of(self.link_i.payload, target))[r_part])
                continue
            plain = recv_take & (x_target == target)
            if target in (Target.OUT, Target.ROWMAX):
                plain = plain & ~recv_acc
            wr.request(plain, x_addr, self.link_i.payload)
        # accumulate: read at accept, combine and write one cycle later (the read ports are
        # transparent, so back-to-back words to one address see each other): OUT saturating
        # s64 addition, ROWMAX unsigned 32-bit max
        # (narrow_out / narrow_iomem: OUT / ROWMAX a part a cycle, r_pdata the part of link_i)
        r_valid = Signal()
        r_addr = Signal(16)
        r_is_out = x_target == Target.OUT
        out_rp.request(st["RECV"] & r_is_out, Cat(r_part, x_addr) if narrow_o else x_addr, 1)
        rmax_rp.request(st["RECV"] & ~r_is_out, Cat(r_part, x_addr) if narrow else x_addr, 1)
        m.d.sync += [r_valid.eq(Mux(r_narrow, recv_part, recv_take) & recv_acc),
                     r_addr.eq(Mux(r_narrow, Cat(r_part, x_addr), x_addr))]
        if narrow_targets:
            r_pdata = Signal(W // P)
            m.d.sync += r_pdata.eq(self.link_i.payload.word_select(r_part, W // P))
        if not (narrow and narrow_o):
            r_data = Signal(W)
            m.d.sync += r_data.eq(self.link_i.payload)
        r_out_data = r_pdata if narrow_o else r_data
        r_rmax_data = r_pdata if narrow else r_data
        ov_acc = OV // out_parts                  # values of an OUT read
        acc_sum = Signal(W // out_parts)
        acc_ovf = Signal(ov_acc)
        for j in range(ov_acc):
            total, wrap = sat_add64(out_rp.data[64 * j:64 * (j + 1)],
                                    r_out_data[64 * j:64 * (j + 1)])
            m.d.comb += [acc_sum[64 * j:64 * (j + 1)].eq(total), acc_ovf[j].eq(wrap)]
        out_w.request(r_valid & r_is_out, r_addr, acc_sum)
        set_vpu.append(r_valid & r_is_out & acc_ovf.any())
        max_word = Signal(W // io_parts)
        for j in range(Q // io_parts):
            old, new = rmax_rp.data[32 * j:32 * (j + 1)], r_rmax_data[32 * j:32 * (j + 1)]
            m.d.comb += max_word[32 * j:32 * (j + 1)].eq(Mux(new > old, new, old))
        rmax_w.request(r_valid & ~r_is_out, r_addr, max_word)
        recv_done = st["RECV"] & (x_left == 0) & ~r_valid

        # ---- REQUANT engine: HBUF rows -> INT8 codes in ACT, e_h into TOK ------------------------
        # Handed over by the execute engine (which goes on with later commands), it starts when
        # every earlier execute command has completed and then runs beside later GEMMs. Per
        # token row t: the row max -> e' (RowMaxExponent) -> e_h into TOK, prepared for the next
        # row while the current one streams; then C = requant_units values per cycle: HBUF
        # word t*I/(W/32) + c/(W/32) -> C RequantUnits -> ACT bytes. The row maxima have a read
        # port of their own (the SWIGLU sink updates other rows meanwhile).
        rqe = m.submodules.requant = RequantEngine(
            rows=R, word_bits=W, group=G, requant_units=self._requant_units, io_parts=io_parts)
        m.submodules.rowmax_exponent = rqe.rowmax_exponent
        wiring.connect(m, rqe.rme_i, rqe.rowmax_exponent.i)
        wiring.connect(m, rqe.rowmax_exponent.o, rqe.rme_o)
        for i, unit in enumerate(rqe.units):
            m.submodules[f"requant{i}"] = unit
            wiring.connect(m, getattr(rqe, f"unit{i}_i"), unit.i)
            wiring.connect(m, unit.o, getattr(rqe, f"unit{i}_o"))
        rq_older_done = Signal()      # every execute command before the REQUANT is done
        # the ACT write port goes to the load engine first: REQUANT holds meanwhile
        rq_hold = (ld_active & (ld_target == Target.ACT) & (ld_left != 0) & ~ld_blocked
                   & self.ld.valid)
        m.d.comb += [rqe.issue.eq(rq_issue), rqe.args.eq(self.cmd.payload.args.requant),
                     rqe.seq_in.eq(x_seq), rqe.older_done.eq(rq_older_done),
                     rqe.hold.eq(rq_hold), rq_busy.eq(rqe.busy), rq_seq.eq(rqe.seq),
                     rqe.rmax_data.eq(rmax_rq.data), rqe.hbuf_data.eq(hbuf_rp.data)]
        inflight["rq"] = (rq_busy, rq_seq)
        rmax_rq.request(rqe.rmax_rd, rqe.rmax_addr, 1)
        tok_w.request(rqe.tok_w_en, rqe.tok_w_addr, rqe.tok_w_data, rqe.tok_w_mask)
        act_w.request(rqe.act_w_en, rqe.act_w_addr, rqe.act_w_data, rqe.act_w_mask)
        set_vpu.append(rqe.vpu_saturation)
        hbuf_rp.request(rqe.hbuf_rd, rqe.hbuf_addr, rqe.hbuf_en)

        # ---- OUTPUT: OUT rows -> FP32 on o, W/32 values (two OUT words) a beat -----------------
        opx = m.submodules.output = OutputEngine(
            rows=R, word_bits=W, fp32_units=self._fp32_units, out_banks=self._out_banks,
            out_parts=out_parts)
        for j, unit in enumerate(opx.units):
            m.submodules[f"fp32_{j}"] = unit
            wiring.connect(m, getattr(opx, f"unit{j}_i"), unit.i)
            wiring.connect(m, unit.o, getattr(opx, f"unit{j}_o"))
        m.d.comb += [opx.start.eq(x_start & (xop == Op.OUTPUT)), opx.args.eq(xc.args.output),
                     opx.active.eq(st["OUTPUT"]), opx.o_ready.eq(self.o.ready & ~st["STATUS"])]
        if self._out_banks == 2:
            out_rp.request(st["OUTPUT"], opx.rd_addr, opx.rd_en, pair=True)
            m.d.comb += opx.rd_data.eq(out_rp.pair_data)
        else:
            out_rp.request(st["OUTPUT"], opx.rd_addr, opx.rd_en)
            m.d.comb += opx.rd_data.eq(out_rp.data)
        beat_valid, beat_bits, output_done = opx.valid, opx.bits, opx.done

        # ---- performance counters and STATUS -----------------------------------------------------
        stat = m.submodules.status = StatusCounters(config=cfg)
        for name, inc in {
            "cycles": Const(1, 1),
            "load_busy": ld_busy,
            "exec_busy": ~ex_idle | gemm_busy | rq_busy,
            "stall": g_wait_flag | ex_barrier | rq_wait_stall,
            "gemm_beats": tile_in,
            "words_loaded": ld_xfer,
            "words_sent": self.link_o.valid & self.link_o.ready,
            "words_received": self.link_i.valid & self.link_i.ready,
        }.items():
            m.d.comb += getattr(stat.inc, name).eq(inc)
        m.d.comb += [stat.clear.eq(counters_clear), stat.acc_overflow.eq(flag_acc),
                     stat.vpu_saturation.eq(flag_vpu),
                     stat.snap.eq(x_start & (xop == Op.STATUS))]
        status_beat = stat.beat
        status_done = st["STATUS"] & self.o.ready
        m.d.comb += [
            self.o.valid.eq(st["STATUS"] | beat_valid),
            Value.cast(self.o.payload.kind).eq(st["STATUS"]),
            self.o.payload.data.eq(Mux(st["STATUS"], Value.cast(status_beat), beat_bits)),
        ]
        with m.If(Cat(set_vpu).any()):
            m.d.sync += flag_vpu.eq(1)

        # internal signals a test bench may watch (cycle accounting); no logic of their own
        # (rw_collision is driven above, for BoardTop)
        self.probes = {"ld_xfer": ld_xfer, "ld_active": ld_active, "ld_blocked": ld_blocked,
                       "tile_in": tile_in, "g_issuing": g_issuing, "ex_idle": ex_idle,
                       "gemm_busy": gemm_busy, "wait_flag": g_wait_flag, "barrier": ex_barrier,
                       "xop": xop, "full0": full[0], "full1": full[1],
                       "tile_out": tile_out, "hbuf_write": sw_out, "out_write": cmb_out,
                       "tile_held_mid_beat": tile.i.valid & (tile.phase != 0)
                                             & ~tile.next_pass & ~tile.i.ready,
                       "rq_busy": rq_busy, "rq_wait": rq_wait_stall,
                       "fence_wait": ld_active & ld_fence & ~fence_ok,
                       "rw_collision": self.rw_collision,
                       **{f"rw_collision_{k}": v for k, v in collisions.items()}}
        m.d.comb += self.rw_collision.eq(Cat(collisions.values()).any())
        m.d.comb += x_done.eq(clear_done | send_done | recv_done | status_done | output_done)
        m.d.comb += [fence_ok.eq(done_before(ld_need)),
                     rq_older_done.eq(done_before(rq_seq, skip=("rq",)))]

        # ---- the ACT read port: the GEMM's unless SEND holds it; TOK: the sink's unless SEND -----
        if narrow:
            act_rp.request(g_step, Cat(Const(0, log_io), g_act_row + g_g))
            act_rp.request(tile.next_pass, Cat(b_apart, b_aaddr))
        else:
            act_rp.request(~st["SEND"], g_act_row + g_g, g_step)
        tok_rp.request(~st["SEND"], row_t >> log_tk, ~stall_a)

        # ---- build the port muxes; the load engine writes with the lowest priority ---------------
        if parts > 1:                 # the parts of the loaded word (streamed_weights)
            lane_bits = 128
            ld_parts = Array(Cat(self.ld.payload[lane_bits * n + part_lane * p:][:part_lane]
                                 for n in range(L)) for p in range(parts))
        grants = []
        for target, writes in load_targets.items():
            for b, wr in enumerate(writes):
                sel = ld_target == target
                addr = ld_addr
                if len(writes) == 2:
                    sel = sel & (ld_buf == b)
                elif target in wmem_depths:           # both buffers in one memory
                    addr = in_buffer(ld_addr, ld_buf, wmem_depths[target])
                if parts > 1 and target in (Target.WMSB, Target.WLSB):
                    wr.build(m, low=(ld_part_write & sel, Cat(ld_part, addr),
                                     ld_parts[ld_part], None))
                elif target in parted:  # (WSCALE with streamed_weights, narrow IOMEM)
                    wr.build(m, low=(ld_part_write & sel, Cat(ld_part, addr),
                                     Array(io_parts_of(self.ld.payload, target))[ld_part], None))
                else:
                    wr.build(m, low=(ld_xfer & sel, addr, self.ld.payload, None))
                grants.append((sel, wr.free(ld_addr) if isinstance(wr, _BankedWrites)
                               else ~wr.busy))
        grant = Const(1, 1)
        for sel, ok in grants:
            grant = Mux(sel, ok, grant)
        m.d.comb += ld_grant.eq(grant)
        rmax_w.build(m)
        wmem_reads = [w[0] for w in wmsb + wlsb + wscl] if split else [
            plane[0] for plane in (wmsb, wlsb, wscl)]
        for reads in (*wmem_reads, act_rp, tok_rp, hbuf_rp, out_rp,
                      rmax_rp, rmax_rq):
            reads.build(m)
        return m

"""The PE command ISA, defined once (paper Sections 4.1, 5.2; BRIEF section 4).

This module is plain Python (no Amaranth, no NumPy) so that the host, the assembler and the
functional simulator in :mod:`elmoe3d.sw` and the RTL in :mod:`elmoe3d.hw` all read the same
table. :func:`elmoe3d.hw.isa.command_layout` turns it into an Amaranth ``data.StructLayout``;
:func:`encode` / :func:`decode` pack and unpack the same bits in Python. A test checks that the
two agree bit for bit.

A command is :data:`COMMAND_BITS` wide: ``op`` in the low :data:`OP_BITS` bits, then the
operation's fields in the order listed in :data:`OPS`, from the least significant bit up
(Amaranth's ``StructLayout`` order). Unused high bits are zero.

Engines: ``LOAD`` runs on the load engine (``ld`` stream -> memories), ``REQUANT`` on the
requantization engine, everything else on the execute engine; they run concurrently and
synchronise through

* the two WMEM buffer flags (``LOAD.signal`` sets ``full[buf]``; ``GEMM.wait`` waits for it;
  ``GEMM.release`` clears it when the GEMM has read its last weight word; the RTL keeps a flag
  per buffer half and clears a half's as soon as the GEMM has read that half for the last
  time, so a LOAD into it need not wait for the rest: ``docs/pe.md``);
* ``LOAD.fence``: the load (and so every later one) waits until every execute command before
  it in the program, REQUANT included, has completed (its results written); the execute
  engine does not wait;
* ``REQUANT``: starts when every earlier execute command has completed, then runs beside later
  GEMMs; a GEMM with ``rq_wait`` waits until it has completed (every other execute command
  waits for it anyway); ``pad_rows``: the last rows of its last row block are padding (no
  token), their codes written zero beside the last live row's, in none of its cycles;
* ``BARRIER``: waits until all three engines are idle; later LOADs (queued meanwhile) take no
  word until then (so do the LOADs after a ``CLEAR counters``, which count from it).

Multi-PE work (paper Sections 5.1, 5.2): ``GEMM.psum_in`` adds ``rows * lanes / (W/64)``
``link_i`` words (the RAW psum layout) into every result before its sink (psum-level
synchronisation: MSB slices on one PE plus the LSB psums of another equal FULL bit for bit);
K tiling (paper-size experts, ``docs/pe.md`` "K-chained GEMMs"): ``GEMM.acc_hold`` keeps the
tile's accumulators after the GEMM's last group instead of emitting a result, and
``GEMM.acc_cont`` starts the next GEMM from them instead of from zero, so one result sums the
groups of any number of WMEM buffer-fulls (and of LSB_ONLY and MSB_ONLY GEMMs: a FULL result
that reads each weight byte once); both need a GEMM of one result. ``GEMM.max_keep`` (SWIGLU):
the block that writes channel 0 of a row raises its row max instead of starting it (the second
pass of an expert whose h does not fit HBUF keeps the max of the first). SEND / RECV of
:attr:`Target.ROWMAX` exchange the per-token row maxima (RECV ``accumulate``:
unsigned max) for the max all-reduce before REQUANT; ``LOAD.src`` (:class:`Source`) and
``LOAD.hb_addr`` tell the die's load router where a LOAD's words come from (the PE ignores
them).

``docs/pe.md`` states the rules a program must keep (``elmoe3d.sw.golden.asm.SyncChecker`` checks
them).

The formats the PE's memories and its ``o`` stream share with the host are defined here too:
:data:`SCALES_PER_WORD` (a WSCALE word), :data:`TOK_FIELDS` (one 64-bit token-table entry),
:class:`OKind` and :data:`OKIND_BITS` (the ``o`` beat's kind), :data:`COUNTER_BITS` and
:data:`STATUS_FIELDS` (the STATUS beat). :mod:`elmoe3d.hw.isa` builds the Amaranth layouts from
them and :mod:`elmoe3d.sw.golden.asm` packs the same bits in NumPy.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


__all__ = ["COMMAND_BITS", "OP_BITS", "TARGET_BITS", "SINK_BITS", "SOURCE_BITS", "MODE_BITS",
           "Op", "Target", "Sink", "Source", "Field", "OPS", "W_TARGETS", "encode", "decode",
           "IsaError", "SCALES_PER_WORD", "TOK_FIELDS", "TOK_ENTRY_BITS", "OKind", "OKIND_BITS",
           "COUNTER_BITS", "STATUS_FIELDS", "TIMING_STATUS_FIELDS", "FUNCTIONAL_STATUS_FIELDS"]

#: Bits of one command.
COMMAND_BITS = 128
#: Bits of the ``op`` field (the low bits of a command).
OP_BITS = 4
#: Bits of the enumerated fields: ``target`` (:class:`Target`), ``sink`` (:class:`Sink`),
#: ``src`` (:class:`Source`) and ``mode`` (the tile mode, ``elmoe3d.sw.golden.datapath.Mode``).
TARGET_BITS = 3
SINK_BITS = 2
SOURCE_BITS = 2
MODE_BITS = 2


class IsaError(ValueError):
    """A command field is out of range or unknown; the message names the op and field."""


class Op(enum.IntEnum):
    """Command opcodes."""

    NOP = 0
    #: Load engine: copy ``words`` beats of the ``ld`` stream into ``target`` at ``addr``.
    LOAD = 1
    #: Execute engine: tiled GEMM through the tensor tile; results go to ``sink`` (with
    #: ``psum_in``, after adding ``link_i`` psums into them).
    GEMM = 2
    #: Per-token requantization of the H buffer to INT8 activations (BRIEF 3.7).
    REQUANT = 3
    #: FP32 conversion of the output accumulators onto the ``o`` stream (BRIEF 3.8); with
    #: ``raw``, the Q.24 OUT words themselves (partial outputs summed exactly elsewhere).
    OUTPUT = 4
    #: Clear state: output accumulators, per-token row max, sticky flags, performance counters
    #: (a bit mask: ``out``, ``rowmax``, ``flags``, ``counters``).
    CLEAR = 5
    #: Send memory words on the link port (activations or psums).
    SEND = 6
    #: Receive link-port words into memory; ``accumulate`` adds them into OUT (psum
    #: reduction, saturating) or takes the unsigned max into ROWMAX (max all-reduce).
    RECV = 7
    #: Wait until all three engines are idle (all earlier commands complete).
    BARRIER = 8
    #: Emit the performance counters and sticky flags as one ``o`` beat.
    STATUS = 9


class Target(enum.IntEnum):
    """Memories a LOAD, SEND or RECV addresses."""

    WMSB = 0     #: WMEM MSB nibble plane (of buffer ``buf``)
    WLSB = 1     #: WMEM LSB nibble plane (of buffer ``buf``)
    WSCALE = 2   #: WMEM group scales (of buffer ``buf``), 8 entries per word
    ACT = 3      #: IOMEM activation words (INT8 codes, the tile's ``act`` field)
    TOK = 4      #: token table: per row, exponent, gate weight, output slot
    HBUF = 5     #: IOMEM H buffer (SwiGLU output, Q16.16)
    OUT = 6      #: IOMEM output accumulators (Q.24)
    #: per-TOK-entry row-max registers (u32 max |h|, W/32 entries per word; SEND / RECV only,
    #: RECV ``accumulate`` takes the unsigned max: the max all-reduce before REQUANT)
    ROWMAX = 7


class Sink(enum.IntEnum):
    """Where the execute engine sends tile results of a GEMM."""

    SWIGLU = 0   #: VPU: h = silu(gate) * up into HBUF, row max updated (up/gate interleaved)
    COMBINE = 1  #: VPU: out += gate_weight * y into OUT (down projection)
    RAW = 2      #: raw Q.24 accumulators onto the link port (psum exchange, BRIEF 3.5)


class Source(enum.IntEnum):
    """Where the words of a LOAD come from (``LOAD.src``). The PE ignores it (its words arrive
    on ``ld`` in LOAD order whatever the source); the logic die's per-PE load router reads it
    (with ``LOAD.hb_addr``) to pick the source of each LOAD's words and to issue HB reads."""

    HOST = 0     #: the host command / DMA interface
    HB = 1       #: the PE's hybrid-bonded DRAM bank, from word ``hb_addr`` (W-bit PE words)
    EXT = 2      #: external memory (LPDDR5) through the streamline ring


@dataclass(frozen=True)
class Field:
    name: str
    width: int


#: Fields of each op, least significant first (after ``op``).
OPS: dict[Op, tuple[Field, ...]] = {
    Op.NOP: (),
    Op.LOAD: (Field("target", TARGET_BITS), Field("buf", 1), Field("addr", 16),
              Field("words", 16), Field("signal", 1), Field("fence", 1),
              Field("src", SOURCE_BITS), Field("hb_addr", 32)),
    Op.GEMM: (Field("mode", MODE_BITS), Field("wbuf", 1), Field("act_base", 16),
              Field("w_base", 16), Field("row_blocks", 8), Field("col_blocks", 10),
              Field("groups", 8), Field("sink", SINK_BITS), Field("out_base", 16),
              Field("tok_base", 8),
              Field("wait", 1), Field("release", 1), Field("stride", 16),
              Field("rq_wait", 1), Field("psum_in", 1),
              Field("acc_cont", 1), Field("acc_hold", 1), Field("max_keep", 1)),
    Op.REQUANT: (Field("row_blocks", 8), Field("channels", 16), Field("act_base", 16),
                 Field("tok_base", 8), Field("pad_rows", 8)),
    Op.OUTPUT: (Field("row_blocks", 8), Field("channels", 16), Field("raw", 1)),
    Op.CLEAR: (Field("out", 1), Field("rowmax", 1), Field("flags", 1), Field("counters", 1)),
    Op.SEND: (Field("target", TARGET_BITS), Field("addr", 16), Field("words", 16)),
    Op.RECV: (Field("target", TARGET_BITS), Field("addr", 16), Field("words", 16),
              Field("accumulate", 1)),
    Op.BARRIER: (),
    Op.STATUS: (),
}

for _op, _fields in OPS.items():
    assert OP_BITS + sum(f.width for f in _fields) <= COMMAND_BITS, _op
assert max(Op) < 1 << OP_BITS and max(Target) < 1 << TARGET_BITS
assert max(Sink) < 1 << SINK_BITS and max(Source) < 1 << SOURCE_BITS

#: WMEM targets of LOAD (they take a buffer number and a signal).
W_TARGETS = (Target.WMSB, Target.WLSB, Target.WSCALE)


# ---- memory-word and output formats --------------------------------------------------------------

#: FP16 group-scale entries of ``lanes`` scales in one WSCALE word (W = lanes * 128 bits =
#: 8 x lanes x 16): entry ``e`` of a buffer's scales is slot ``e % 8`` of word ``e // 8``.
SCALES_PER_WORD = 8

#: Token-table entry, least significant first: (name, bits, signed). ``e_x`` activation
#: exponent, ``e_h`` down-projection exponent (written by REQUANT), ``gate`` FP16 bits of the
#: gate weight, ``slot`` OUT row; a TOK word holds W/64 entries, entry ``j`` at bit 64 j.
TOK_FIELDS = (("e_x", 8, True), ("e_h", 8, True), ("gate", 16, False), ("slot", 8, False),
              ("pad", 24, False))
#: Bits of one token-table entry.
TOK_ENTRY_BITS = sum(bits for _, bits, _ in TOK_FIELDS)
assert TOK_ENTRY_BITS == 64


class OKind(enum.IntEnum):
    """Kind of an ``o`` beat: its bit 0 (:data:`OKIND_BITS`); the W data bits sit above it."""

    DATA = 0     #: W/32 FP32 results (OUTPUT), or W/64 Q.24 values (OUTPUT raw)
    STATUS = 1   #: counters and sticky flags (STATUS), :data:`STATUS_FIELDS`


#: Bits of the ``kind`` field of an ``o`` beat.
OKIND_BITS = 1
assert max(OKind) < 1 << OKIND_BITS

#: Width of the STATUS performance counters.
COUNTER_BITS = 48

#: STATUS beat contents, least significant first: (name, bits), zero-padded to W. Counters count
#: since the last ``CLEAR counters`` (or reset); flags are sticky until ``CLEAR flags``.
#:
#: cycles, load_busy, exec_busy, stall
#:     clock cycles: all, load engine busy, execute engine busy, execute engine waiting on a
#:     buffer flag or a BARRIER (RTL only: the functional simulator reports 0)
#: gemm_beats
#:     tensor-tile beats issued by GEMMs
#: words_loaded, words_sent, words_received
#:     ``ld`` beats consumed, ``link_o`` words sent (SEND, RAW sink), ``link_i`` words
#:     received (RECV, GEMM ``psum_in``)
#: acc_overflow
#:     a GEMM accumulator saturated (the tile's sticky overflow flag of any result, or a
#:     ``psum_in`` addition)
#: vpu_saturation
#:     any VPU saturation: Q16.16 conversion, SwiGLU product, REQUANT clip, COMBINE term or OUT
#:     addition, RECV accumulation
STATUS_FIELDS = (("cycles", COUNTER_BITS), ("load_busy", COUNTER_BITS),
                 ("exec_busy", COUNTER_BITS), ("stall", COUNTER_BITS),
                 ("gemm_beats", COUNTER_BITS), ("words_loaded", COUNTER_BITS),
                 ("words_sent", COUNTER_BITS), ("words_received", COUNTER_BITS),
                 ("acc_overflow", 1), ("vpu_saturation", 1))
#: STATUS fields that depend on timing (not modelled by the functional simulator).
TIMING_STATUS_FIELDS = ("cycles", "load_busy", "exec_busy", "stall")
#: STATUS fields every backend must agree on.
FUNCTIONAL_STATUS_FIELDS = tuple(n for n, _ in STATUS_FIELDS if n not in TIMING_STATUS_FIELDS)


def encode(op, **fields) -> int:
    """Pack one command into an integer of :data:`COMMAND_BITS` bits.

    Missing fields are 0. Raises :class:`IsaError` naming the op and field for an unknown field
    or a value outside ``[0, 2^width)`` (enums are accepted for their integer value)."""
    try:
        op = Op(op)
    except ValueError:
        raise IsaError(f"unknown opcode {op!r}") from None
    word, pos = int(op), OP_BITS
    known = {f.name for f in OPS[op]}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise IsaError(f"{op.name}: unknown field(s) {', '.join(unknown)}; fields are "
                       f"{', '.join(f.name for f in OPS[op]) or 'none'}")
    for f in OPS[op]:
        value = int(fields.get(f.name, 0))
        if not 0 <= value < (1 << f.width):
            raise IsaError(f"{op.name}.{f.name} = {value} does not fit {f.width} bits")
        word |= value << pos
        pos += f.width
    return word


def decode(word: int) -> tuple[Op, dict]:
    """Unpack an integer command into ``(op, {field: value})``; raises :class:`IsaError` on an
    unknown opcode or nonzero unused bits."""
    word = int(word)
    if not 0 <= word < (1 << COMMAND_BITS):
        raise IsaError(f"command {word:#x} does not fit {COMMAND_BITS} bits")
    opcode = word & ((1 << OP_BITS) - 1)
    try:
        op = Op(opcode)
    except ValueError:
        raise IsaError(f"unknown opcode {opcode} in command {word:#x}") from None
    pos, out = OP_BITS, {}
    for f in OPS[op]:
        out[f.name] = (word >> pos) & ((1 << f.width) - 1)
        pos += f.width
    if word >> pos:
        raise IsaError(f"{op.name}: nonzero bits above bit {pos} in command {word:#x}")
    return op, out

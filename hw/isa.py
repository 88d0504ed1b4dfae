"""Amaranth layouts of the PE's command ISA, memory words and output beats (``docs/pe.md``).

Everything here is built from the plain-Python tables in :mod:`elmoe3d.isa` (commands, token
entries, ``o`` beat kinds, STATUS fields), so the RTL, the benches and the host share one
definition; ``tests/golden/test_isa.py`` checks that ``layout.const(...).as_bits()`` equals
:func:`elmoe3d.isa.encode` and the NumPy packers of :mod:`elmoe3d.sw.golden.asm` bit for bit.

Layouts
-------
* :func:`command_layout` -- ``op`` (:class:`OpCode`) then ``args``, a union of one struct per op
  (:func:`op_layout`), :data:`~elmoe3d.isa.COMMAND_BITS` wide.
* :func:`tok_entry_layout` (64 bits), :func:`tok_word_layout` (W/64 entries).
* Memory words (W = lanes * 128 bits): :func:`wgt_word_layout`, :func:`act_word_layout` (the
  tile beat's ``wgt`` / ``act`` fields), :func:`scale_word_layout`, :func:`hbuf_word_layout`,
  :func:`out_word_layout`, :func:`fp32_word_layout`.
* :func:`o_beat_layout` (``kind`` :class:`OKind` + W data bits) and :func:`status_layout`.
"""

from __future__ import annotations

import types

from amaranth.hdl import Shape, signed, unsigned
from amaranth.lib import data, enum

from .. import isa
from ..config import TileConfig, pe_config
from .layouts import TileMode, tile_beat_layout


__all__ = ["OpCode", "TargetCode", "SinkCode", "SourceCode", "OKind", "op_layout", "command_layout",
           "tok_entry_layout", "tok_word_layout", "wgt_word_layout", "act_word_layout",
           "scale_word_layout", "hbuf_word_layout", "out_word_layout", "fp32_word_layout",
           "status_layout", "o_beat_layout"]


def _shaped_enum(name, members, width, doc):
    """An ``amaranth.lib.enum.Enum`` of ``width`` bits with the members of a Python IntEnum."""
    def body(ns):
        for m in members:
            ns[m.name] = m.value
        ns["__doc__"] = doc
        ns["__module__"] = __name__
    return types.new_class(name, (enum.Enum,), {"shape": width}, body)


OpCode = _shaped_enum("OpCode", isa.Op, isa.OP_BITS,
                      "RTL encoding of :class:`elmoe3d.isa.Op` (the same integer values).")

TargetCode = _shaped_enum("TargetCode", isa.Target, isa.TARGET_BITS,
                          "RTL encoding of :class:`elmoe3d.isa.Target`.")

SinkCode = _shaped_enum("SinkCode", isa.Sink, isa.SINK_BITS,
                        "RTL encoding of :class:`elmoe3d.isa.Sink`.")

SourceCode = _shaped_enum("SourceCode", isa.Source, isa.SOURCE_BITS,
                          "RTL encoding of :class:`elmoe3d.isa.Source` (``LOAD.src``).")

OKind = _shaped_enum("OKind", isa.OKind, isa.OKIND_BITS,
                     "Kind of an ``o`` beat (:class:`elmoe3d.isa.OKind`).")

#: Fields whose values are enumerations (the width must match the ISA table).
_ENUM_FIELDS = {"target": TargetCode, "sink": SinkCode, "mode": TileMode, "src": SourceCode}


def _field_shape(field: isa.Field):
    shape = _ENUM_FIELDS.get(field.name)
    if shape is not None and Shape.cast(shape).width == field.width:
        return shape
    return unsigned(field.width)


def op_layout(op) -> data.StructLayout:
    """Fields of one op (``elmoe3d.isa.OPS[op]``, least significant first)."""
    return data.StructLayout({f.name: _field_shape(f) for f in isa.OPS[isa.Op(op)]})


def command_layout() -> data.StructLayout:
    """One command: ``op`` (:class:`OpCode`, :data:`~elmoe3d.isa.OP_BITS`) and ``args``, a
    union of :func:`op_layout` for every op keyed by the lower-case op name, padded to
    :data:`~elmoe3d.isa.COMMAND_BITS`.

    ``command_layout().const({"op": OpCode.GEMM, "args": {"gemm": {...}}}).as_bits()`` equals
    ``elmoe3d.isa.encode(Op.GEMM, ...)``."""
    members = {op.name.lower(): op_layout(op) for op in isa.Op}
    args_bits = isa.COMMAND_BITS - isa.OP_BITS
    union = data.UnionLayout(members)
    assert union.size <= args_bits
    fields = {"op": OpCode, "args": union}
    if union.size < args_bits:
        fields["pad"] = unsigned(args_bits - union.size)
    layout = data.StructLayout(fields)
    assert layout.size == isa.COMMAND_BITS
    return layout


_pe = pe_config


def tok_entry_layout() -> data.StructLayout:
    """One 64-bit token-table entry (:data:`elmoe3d.isa.TOK_FIELDS`): ``e_x`` s8 (activation
    exponent), ``e_h`` s8 (down-projection exponent, written by REQUANT), ``gate`` u16 (FP16
    gate weight), ``slot`` u8 (OUT row), ``pad``."""
    return data.StructLayout({name: signed(bits) if sgn else unsigned(bits)
                              for name, bits, sgn in isa.TOK_FIELDS})


def tok_word_layout(config) -> data.ArrayLayout:
    """One TOK word / LOAD beat: W/64 entries."""
    return data.ArrayLayout(tok_entry_layout(), _pe(config).tok_per_word)


def _tile(config) -> TileConfig:
    pe = _pe(config)
    return TileConfig(rows=pe.rows, lanes=pe.lanes)


def wgt_word_layout(config) -> data.ArrayLayout:
    """One WMEM plane word: ``[lanes][32] x unsigned(4)`` (the tile beat's ``wgt`` field)."""
    return tile_beat_layout(_tile(config))["wgt"].shape


def act_word_layout(config) -> data.ArrayLayout:
    """One ACT word: ``[rows][32] x signed(8)`` (the tile beat's ``act`` field)."""
    return tile_beat_layout(_tile(config))["act"].shape


def scale_word_layout(config) -> data.ArrayLayout:
    """One WSCALE word: ``[8][lanes] x unsigned(16)`` FP16 bits (entry ``slot``, lane ``n``;
    :data:`~elmoe3d.isa.SCALES_PER_WORD` entries)."""
    return data.ArrayLayout(data.ArrayLayout(unsigned(16), _pe(config).lanes),
                            isa.SCALES_PER_WORD)


def hbuf_word_layout(config) -> data.ArrayLayout:
    """One HBUF word: W/32 Q16.16 values, ``signed(32)``."""
    return data.ArrayLayout(signed(32), _pe(config).q16_per_word)


def out_word_layout(config) -> data.ArrayLayout:
    """One OUT word (and one RAW link word): W/64 Q.24 values, ``signed(64)``."""
    return data.ArrayLayout(signed(64), _pe(config).q24_per_word)


def fp32_word_layout(config) -> data.ArrayLayout:
    """The data of an ``o`` DATA beat: W/32 FP32 values (raw bits, ``unsigned(32)``)."""
    return data.ArrayLayout(unsigned(32), _pe(config).fp32_per_beat)


def status_layout(config) -> data.StructLayout:
    """The data of an ``o`` STATUS beat (:data:`elmoe3d.isa.STATUS_FIELDS`), padded to W:
    counters of :data:`~elmoe3d.isa.COUNTER_BITS` bits ``cycles``, ``load_busy``,
    ``exec_busy``, ``stall`` (timing), ``gemm_beats``, ``words_loaded``, ``words_sent``,
    ``words_received`` (functional), and the sticky flags ``acc_overflow`` and
    ``vpu_saturation``."""
    pe = _pe(config)
    fields = {name: unsigned(bits) for name, bits in isa.STATUS_FIELDS}
    used = sum(bits for _, bits in isa.STATUS_FIELDS)
    if used < pe.word_bits:
        fields["pad"] = unsigned(pe.word_bits - used)
    return data.StructLayout(fields)


def o_beat_layout(config) -> data.StructLayout:
    """One ``o`` beat: ``kind`` (:class:`OKind`) then ``data`` (W bits: :func:`fp32_word_layout`
    for DATA, :func:`status_layout` for STATUS)."""
    return data.StructLayout({"kind": OKind, "data": unsigned(_pe(config).word_bits)})

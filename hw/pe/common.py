"""Small rules shared by the PE's parts (:mod:`elmoe3d.hw.pe`): unit counts, sequence numbers,
command fields."""

from __future__ import annotations

from amaranth.hdl import Value


__all__ = ["COUNTER_BITS", "SEQ", "log2", "unit_count", "fld", "older"]


#: Width of the performance counters (``elmoe3d.sw.golden.asm.STATUS_FIELDS``).
COUNTER_BITS = 48

#: Bits of an execute command's sequence number (the order the decoder took it in; wraps).
SEQ = 16


def log2(n: int) -> int:
    """log2 of a power of two ``n`` (an ``AssertionError`` otherwise: callers pass checked
    figures)."""
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


def unit_count(name, value, top, what):
    """A time-shared unit count: ``None`` -> ``top``, else a power of two in 1..``top``
    (``ValueError`` naming ``name``, ``what`` saying the range)."""
    if value is None:
        return top
    if (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top
            or value & (value - 1)):
        raise ValueError(f"{name}: expected a power of two {what}, got {value!r}")
    return value


def fld(view, op, name):
    """Field ``name`` of the ``op`` arguments of a command view (a ``Value``)."""
    return Value.cast(getattr(getattr(view.args, op.name.lower()), name))


def older(seq, ref):
    """``seq`` was taken before ``ref`` (sequence numbers of :data:`SEQ` bits wrap around)."""
    return (seq - ref)[SEQ - 1]

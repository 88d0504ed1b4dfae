"""Small rules shared by the PE's parts (:mod:`elmoe3d.hw.pe`): sequence numbers, command
fields, words stored in parts."""

from __future__ import annotations

from amaranth.hdl import Cat
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...checks import is_int, python_int_hint
from ...isa import COUNTER_BITS        # width of the performance counters (STATUS fields)


__all__ = ["COUNTER_BITS", "SEQ", "log2", "older", "act_part_elems", "parts_of", "word_of"]


#: Bits of an execute command's sequence number (the order the decoder took it in; wraps).
SEQ = 16


def log2(n: int) -> int:
    """log2 of a power of two ``n`` (an ``AssertionError`` otherwise: callers pass checked
    figures)."""
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


def older(seq, ref):
    """``seq`` was taken before ``ref`` (sequence numbers of :data:`SEQ` bits wrap around)."""
    return (seq - ref)[SEQ - 1]


def act_part_elems(rows: int, group: int, parts: int) -> list:
    """The bytes of an ACT word (``rows x group`` INT8 activations, row after row) that part
    ``p`` of ``parts`` holds (``narrow_iomem``): depths ``p G/P .. (p+1) G/P - 1`` of every
    row, row after row."""
    return [[r * group + p * (group // parts) + j for r in range(rows)
             for j in range(group // parts)] for p in range(parts)]


def parts_of(value, act: bool, *, word_bits: int, act_elems: list) -> list:
    """The P parts (``len(act_elems)``) of a W-bit word ``value`` of a memory stored in parts:
    ACT's by :func:`act_part_elems` (``act``), the others' bits ``p W/P ..``."""
    if act:
        return [Cat(value[8 * e:8 * (e + 1)] for e in part) for part in act_elems]
    P = len(act_elems)
    return [value.word_select(p, word_bits // P) for p in range(P)]


def word_of(act: bool, *, word_bits: int, act_elems: list) -> list:
    """The inverse of :func:`parts_of`: per part, (bit range in the word, bit range in the
    part) pairs."""
    if act:
        return [[((8 * e, 8 * (e + 1)), (8 * j, 8 * (j + 1))) for j, e in enumerate(part)]
                for part in act_elems]
    P, W = len(act_elems), word_bits
    return [[((p * W // P, (p + 1) * W // P), (0, W // P))] for p in range(P)]


def check_choice(name: str, value, choices) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an integer in ``choices``."""
    if not is_int(value, numpy=False) or value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(map(str, choices))}"
                         f"{python_int_hint(value)}, got {value!r}")


def check_word_bits(word_bits) -> None:
    """``ValueError`` unless ``word_bits`` is a PE word width: ``lanes * 128`` bits for a
    power-of-two number of lanes of at least 4 (``elmoe3d.config.PEOptions``)."""
    if (not is_int(word_bits, numpy=False) or word_bits < 512
            or word_bits & (word_bits - 1)):
        raise ValueError(f"word_bits: expected 128 x a power-of-two number of lanes (at least "
                         f"4){python_int_hint(word_bits)}, got {word_bits!r}")


def check_bool(name: str, value) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected a bool, got {value!r}")


def unit_stream(unit, port: str) -> stream.Signature:
    """The ``stream.Signature`` of VPU unit ``unit``'s ``port`` (``"i"`` or ``"o"``), as its
    driver declares it: the payload layout and the unit's ``always_ready``."""
    return stream.Signature(getattr(unit, port).payload.shape(), always_ready=unit.always_ready)


def unit_ports(units) -> dict:
    """Signature members through which a PE part drives its VPU units (the units are the PE's
    own children, synthesis leaves, joined by the PE): ``unit{j}_i`` (Out, into unit ``j``) and
    ``unit{j}_o`` (In, out of it), one stream pair per unit of ``units``."""
    members = {}
    for j, unit in enumerate(units):
        members[f"unit{j}_i"] = Out(unit_stream(unit, "i"))
        members[f"unit{j}_o"] = In(unit_stream(unit, "o"))
    return members


class UnitDriver(wiring.Component):
    """A PE part that drives VPU units (SwiGLU, combine, requant, FP32 converters): its
    signature is ``members`` plus :func:`unit_ports` of ``units``; the PE instantiates the
    units as its own children (:attr:`units`) and connects them (:func:`unit_streams`)."""

    def __init__(self, members: dict, units):
        self._units = list(units)
        super().__init__({**members, **unit_ports(self._units)})

    @property
    def units(self) -> list:
        """The VPU units this part drives, in port order (for the PE to instantiate)."""
        return list(self._units)


def unit_streams(part, count: int) -> tuple:
    """``part``'s ports to its ``count`` VPU units (:func:`unit_ports`): the list of ``unit{j}_i``
    and the list of ``unit{j}_o``."""
    return ([getattr(part, f"unit{j}_i") for j in range(count)],
            [getattr(part, f"unit{j}_o") for j in range(count)])

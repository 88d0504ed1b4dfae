"""The bit-sliced IA8xW5 unit PE and the slice combiner (paper Section 4.3, Fig. 8; numerics §3).

One unit PE multiplies an INT8 activation by a signed 5-bit weight field. An INT8 weight
``q = 16*msb + lsb`` is split into two 4-bit slices that enter two unit PEs:

* the MSB slice as the left-aligned field ``{msb[3:0], aug}`` = ``2*msb + aug`` (signed, -16..15),
  where ``aug`` is driven by the LSB-augmentation mux: 1 in a draft (the half-unit offset
  ``16*msb + 8``), 0 when the product is combined with the LSB slice;
* the LSB slice as the field ``{0, lsb[3:0]}`` = ``lsb`` (0..15).

The :class:`SliceCombiner` forms the INT8 product (or group partial sum) from the two slice
results: ``(msb_part << 3) + lsb_part`` in FULL mode, ``msb_part << 3`` in DRAFT and MSB_ONLY,
``lsb_part`` in LSB_ONLY. The executable definition is :func:`elmoe3d.sw.golden.datapath.unit_pe`,
:func:`~elmoe3d.sw.golden.datapath.msb_field`, :func:`~elmoe3d.sw.golden.datapath.lsb_field` and
:func:`~elmoe3d.sw.golden.datapath.slice_product`.

Both blocks are combinational (latency :data:`elmoe3d.config.UNIT_PE_LATENCY`, 0).
"""

from __future__ import annotations

from amaranth.hdl import C, Cat, Module, Mux, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..config import UNIT_PE_LATENCY
from .checked import CheckedComponent, check_param
from .layouts import TileMode


__all__ = ["UnitPE", "SliceCombiner", "weight_field", "lane_controls",
           "PRODUCT_SHAPE", "FIELD_SHAPE"]


#: The 5-bit weight field entering the multiplier: -16..15.
FIELD_SHAPE = signed(5)
#: Exact product shape: a in [-128, 127] times a field in [-16, 15] lies in [-2032, 2048];
#: +2048 = (-128) * (-16) needs 13 signed bits.
PRODUCT_SHAPE = signed(13)


def weight_field(nibble, is_msb, aug):
    """The unit PE's signed 5-bit weight field (an expression of shape ``signed(5)``).

    ``is_msb``: ``{nibble, aug}`` read as two's complement (``2*msb + aug``). Otherwise
    ``{0, nibble}`` (``lsb``). Concatenation is unsigned in HDL: the result is cast with
    ``as_signed()`` explicitly.
    """
    msb = Cat(aug, nibble)                  # Cat is LSB first: bit 0 = aug, bits 1..4 = nibble
    lsb = Cat(nibble, C(0, 1))              # bit 4 = 0: always non-negative
    return Mux(is_msb, msb, lsb).as_signed()


def lane_controls(mode, lane_parity: int):
    """The LSB-augmentation mux and slice select of one lane, as ``(is_msb, aug)`` expressions.

    ``mode`` is a :class:`TileMode` value; ``lane_parity`` is 0 for an even lane (2j) and 1 for
    an odd lane (2j+1).

    * FULL: lane 2j is the MSB slice with ``aug = 0``, lane 2j+1 the LSB slice.
    * DRAFT: every lane is an MSB slice with ``aug = 1``.
    * MSB_ONLY: every lane is an MSB slice with ``aug = 0``.
    * LSB_ONLY: every lane is an LSB slice.
    """
    if lane_parity not in (0, 1):
        raise ValueError(f"lane_parity: expected 0 or 1, got {lane_parity!r}")
    is_full = mode == TileMode.FULL
    is_lsb_only = mode == TileMode.LSB_ONLY
    if lane_parity == 0:
        is_msb = ~is_lsb_only
    else:
        is_msb = ~is_lsb_only & ~is_full
    aug = mode == TileMode.DRAFT
    return is_msb, aug


class UnitPE(wiring.Component):
    """IA8xW5 unit PE with the LSB-augmentation mux (combinational).

    Ports
    -----
    a : In(signed(8))
        Activation code.
    nibble : In(unsigned(4))
        Weight slice: the two's-complement MSB slice (``q >> 4``) or the LSB slice (``q & 15``).
    is_msb : In(1)
        1: the field is ``{nibble, aug}`` (signed, ``2*msb + aug``); 0: ``{0, nibble}``.
    aug : In(1)
        LSB-augmentation mux output; ignored for an LSB slice.
    product : Out(signed(13))
        ``a * field``, exact, in [-2032, 2048].
    """

    def __init__(self):
        super().__init__({
            "a": In(signed(8)),
            "nibble": In(unsigned(4)),
            "is_msb": In(1),
            "aug": In(1),
            "product": Out(PRODUCT_SHAPE),
        })

    @property
    def latency(self) -> int:
        """Cycles from inputs to ``product``: 0 (combinational,
        :data:`elmoe3d.config.UNIT_PE_LATENCY`)."""
        return UNIT_PE_LATENCY

    def elaborate(self, platform):
        m = Module()
        field = weight_field(self.nibble, self.is_msb, self.aug)
        m.d.comb += self.product.eq(self.a * field)
        return m


class SliceCombiner(CheckedComponent):
    """Combines the results of a lane pair (2j, 2j+1) according to the mode (combinational).

    The inputs are unit-PE products or adder-tree outputs of the even (MSB in FULL) and odd
    (LSB in FULL) lane, each ``signed(width)``; the outputs are ``signed(width + 4)``, wide
    enough for ``(x << 3) + y`` whatever the inputs.

    ========= ===================== =================
    mode      out_even              out_odd
    ========= ===================== =================
    FULL      ``(even << 3) + odd`` 0 (adds nothing)
    DRAFT     ``even << 3``         ``odd << 3``
    MSB_ONLY  ``even << 3``         ``odd << 3``
    LSB_ONLY  ``even``              ``odd``
    ========= ===================== =================

    Parameters
    ----------
    width : int
        Input width in bits (>= 1). 13 for unit-PE products, 18 for 32-way adder-tree sums.

    Raises
    ------
    ValueError
        ``width`` is not a positive integer (checked before the block exists).
    """

    @classmethod
    def check(cls, *, width):
        check_param("width", width)

    def __init__(self, *, width: int):
        self._width = width
        super().__init__({
            "mode": In(TileMode),
            "even": In(signed(width)),
            "odd": In(signed(width)),
            "out_even": Out(signed(width + 4)),
            "out_odd": Out(signed(width + 4)),
        })

    @property
    def width(self) -> int:
        return self._width

    @property
    def latency(self) -> int:
        """Cycles from inputs to outputs: 0 (combinational,
        :data:`elmoe3d.config.UNIT_PE_LATENCY`)."""
        return UNIT_PE_LATENCY

    def elaborate(self, platform):
        m = Module()
        with m.Switch(self.mode):
            with m.Case(TileMode.FULL):
                m.d.comb += [
                    self.out_even.eq((self.even << 3) + self.odd),
                    self.out_odd.eq(0),
                ]
            with m.Case(TileMode.DRAFT, TileMode.MSB_ONLY):
                m.d.comb += [
                    self.out_even.eq(self.even << 3),
                    self.out_odd.eq(self.odd << 3),
                ]
            with m.Case(TileMode.LSB_ONLY):
                m.d.comb += [
                    self.out_even.eq(self.even),
                    self.out_odd.eq(self.odd),
                ]
        return m

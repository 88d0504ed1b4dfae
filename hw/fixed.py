"""Fixed-point arithmetic shared by the RTL blocks: saturating 64-bit addition and
round-half-to-even right shifts (``docs/numerics.md`` §5, §7 and §8).

Every helper is **combinational** (latency 0: it builds expressions or ``comb`` logic, no
register); the blocks that use it place it in their pipelines. The golden model defines the
same rules in plain NumPy, and the bounds are taken from it, never typed here:

* :func:`sat_add64`: golden :func:`elmoe3d.sw.golden.datapath.saturating_add`; the tile's
  accumulators, the PE's link and OUT read-modify-writes, the VPU's expert combination and the
  aggregation link's REDUCE_ADD.
* :func:`rne_shift`: golden :func:`elmoe3d.sw.golden.vpu.rshift_rne` by a constant; the SwiGLU
  interpolation and SiLU, the FP32 conversion's mantissa.
* :func:`rshift_rne_sat`: golden ``sat(rshift_rne(v, s), bits)`` (:mod:`elmoe3d.sw.golden.vpu`); the
  SwiGLU inputs and output, the INT8 requantization, the expert-combination term.
"""

from __future__ import annotations

from amaranth.hdl import C, Const, Module, Mux, Signal, Value, signed, unsigned

from ..sw.golden.datapath import INT64_MAX, INT64_MIN


__all__ = ["INT64_MIN", "INT64_MAX", "sat_add64", "rne_shift", "rshift_rne_sat"]


def sat_add64(a, b):
    """Saturating signed 64-bit addition (numerics §5 and §8; golden
    :func:`elmoe3d.sw.golden.datapath.saturating_add`): ``(value, wrap)`` expressions.

    ``a`` and ``b`` are 64-bit values read as two's complement (an unsigned slice is taken as
    signed). The exact sum is 65 bits; when it does not fit in 64 bits (``wrap``, 1 bit) the
    value is :data:`INT64_MAX` for a positive and :data:`INT64_MIN` for a negative sum. ``value``
    has shape ``signed(64)``. Combinational.
    """
    total = a.as_signed() + b.as_signed()          # signed(65), exact
    wrap = total[64] != total[63]
    value = Mux(wrap, Mux(total[64], Const(INT64_MIN, signed(64)),
                          Const(INT64_MAX, signed(64))), total[:64].as_signed())
    return value, wrap


def rne_shift(v, k: int):
    """``rshift_rne(v, k)`` for a constant ``k >= 1`` (numerics §7, §8: round half to even):
    ``(v >> k) + (round bit & (sticky | lsb))``. Combinational.

    ``v`` keeps its signedness; the result is one bit wider than ``v >> k`` (the carry of the
    rounding increment), ``w - k + 1`` bits for a ``w``-bit ``v``.
    """
    v = Value.cast(v)
    q = v >> k
    rnd = v[k - 1]
    sticky = v[:k - 1] != 0 if k > 1 else C(0, 1)
    return q + (rnd & (sticky | q[0]))


def rshift_rne_sat(m: Module, v, s, *, out_bits: int, name: str):
    """Combinational ``sat(rshift_rne(v, s), out_bits)`` (numerics §7): ``(value, saturated)``
    Signals of shape ``signed(out_bits)`` and 1, added to ``m``'s ``comb`` domain (names start
    with ``name``).

    ``v`` is a signed value of width ``w``; ``s`` a signed shift (right for ``s > 0``, an exact
    left shift for ``s <= 0``), any width. Right shifts are clamped to ``w`` (a shift by ``w``
    or more gives 0: ``|v / 2^w| <= 1/2`` and the tie goes to the even 0) and rounded with
    ``(v + 2^(k-1) - 1 + bit_k(v)) >> k``; left shifts are clamped to ``out_bits`` (any nonzero
    value shifted that far saturates).
    """
    v = Value.cast(v).as_signed()
    s = Value.cast(s).as_signed()
    w = len(v)
    kr = Signal(range(w + 1), name=f"{name}_kr")
    kl = Signal(range(out_bits + 1), name=f"{name}_kl")
    m.d.comb += [
        kr.eq(Mux(s > w, w, Mux(s > 0, s, 0))),
        kl.eq(Mux(-s > out_bits, out_bits, Mux(s < 0, -s, 0))),
    ]
    # Right: v + (2^(k-1) - 1) + bit k of v, then an arithmetic shift by k (round half even).
    km1 = Signal(range(w), name=f"{name}_km1")
    half_m1 = Signal(unsigned(w), name=f"{name}_half_m1")
    lsb = Signal(name=f"{name}_lsb")
    biased = Signal(signed(w + 2), name=f"{name}_biased")
    right = Signal(signed(w), name=f"{name}_right")
    m.d.comb += [
        km1.eq(Mux(kr == 0, 0, kr - 1)),
        half_m1.eq(Mux(kr == 0, 0, (C(1, w) << km1)[:w] - 1)),
        lsb.eq((v >> kr)[0]),
        biased.eq(v + half_m1 + Mux(kr == 0, 0, lsb)),
        right.eq(biased >> kr),
    ]
    left = Signal(signed(w + out_bits), name=f"{name}_left")
    m.d.comb += left.eq(v << kl)
    pre = Signal(signed(w + out_bits), name=f"{name}_pre")
    m.d.comb += pre.eq(Mux(s > 0, right, left))
    lo, hi = -(1 << (out_bits - 1)), (1 << (out_bits - 1)) - 1
    value = Signal(signed(out_bits), name=f"{name}_val")
    flag = Signal(name=f"{name}_sat")
    m.d.comb += [
        flag.eq((pre < lo) | (pre > hi)),
        value.eq(Mux(pre < lo, lo, Mux(pre > hi, hi, pre[:out_bits]))),
    ]
    return value, flag

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

from amaranth.hdl import C, Cat, Const, Module, Mux, Signal, Value, signed, unsigned

from ..sw.golden.datapath import INT64_MAX, INT64_MIN


__all__ = ["INT64_MIN", "INT64_MAX", "sat_add64", "rne_shift", "rshift_rne_sat",
           "rshift_rne_parts", "rne_sat_finish", "mul_parts", "mul_sum"]


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
    with ``name``): :func:`rne_sat_finish` of :func:`rshift_rne_parts`. A pipelined block
    registers the two parts between the halves instead (one more cycle).

    ``v`` is a signed value of width ``w``; ``s`` a signed shift (right for ``s > 0``, an exact
    left shift for ``s <= 0``), any width. Right shifts are clamped to ``w`` (a shift by ``w``
    or more gives 0: ``|v / 2^w| <= 1/2`` and the tie goes to the even 0) and rounded half to
    even; left shifts are clamped to ``out_bits`` (any nonzero value shifted that far
    saturates).
    """
    pre, inc = rshift_rne_parts(m, v, s, out_bits=out_bits, name=name)
    return rne_sat_finish(m, pre, inc, out_bits=out_bits, name=name)


def rshift_rne_parts(m: Module, v, s, *, out_bits: int, name: str):
    """The first half of :func:`rshift_rne_sat`: the shifted value before rounding and its
    rounding increment, ``(pre, inc)`` Signals of shape ``signed(w + out_bits)`` and 1 (``w``
    the width of ``v``), in ``m``'s ``comb`` domain. Combinational: the barrel shifters and
    the round and sticky bits, no carry chain.

    Right shift by ``k = min(s, w)``: ``pre = v >> k`` (floor), ``inc = r & (sticky | lsb)``
    with ``r`` bit ``k - 1`` of ``v`` and ``sticky`` the OR of the bits below it (round half
    to even); left shift (``s <= 0``) by ``min(-s, out_bits)``: exact, ``inc = 0``."""
    v = Value.cast(v).as_signed()
    s = Value.cast(s).as_signed()
    w = len(v)
    kr = Signal(range(w + 1), name=f"{name}_kr")
    kl = Signal(range(out_bits + 1), name=f"{name}_kl")
    m.d.comb += [
        kr.eq(Mux(s > w, w, Mux(s > 0, s, 0))),
        kl.eq(Mux(-s > out_bits, out_bits, Mux(s < 0, -s, 0))),
    ]
    q = Signal(signed(w), name=f"{name}_q")
    rnd = Signal(name=f"{name}_rnd")
    km1 = Signal(range(w), name=f"{name}_km1")
    below = Signal(unsigned(w), name=f"{name}_below")       # bits 0 .. k-2 set
    sticky = Signal(name=f"{name}_sticky")
    m.d.comb += [
        km1.eq(Mux(kr == 0, 0, kr - 1)),
        q.eq(v >> kr),
        rnd.eq((Cat(C(0, 1), v) >> kr)[0]),                 # bit k-1 of v, 0 for k = 0
        below.eq(Mux(kr < 2, 0, (C(1, w) << km1)[:w] - 1)),
        sticky.eq((v.as_unsigned() & below) != 0),
    ]
    left = Signal(signed(w + out_bits), name=f"{name}_left")
    m.d.comb += left.eq(v << kl)
    pre = Signal(signed(w + out_bits), name=f"{name}_pre")
    inc = Signal(name=f"{name}_inc")
    m.d.comb += [
        pre.eq(Mux(s > 0, q, left)),
        inc.eq((s > 0) & rnd & (sticky | q[0])),
    ]
    return pre, inc


def rne_sat_finish(m: Module, pre, inc, *, out_bits: int, name: str):
    """The second half of :func:`rshift_rne_sat`: ``sat(pre + inc, out_bits)``, ``(value,
    saturated)`` Signals of shape ``signed(out_bits)`` and 1 in ``m``'s ``comb`` domain (the
    rounding increment and the saturation compare)."""
    pre = Value.cast(pre).as_signed()
    lo, hi = -(1 << (out_bits - 1)), (1 << (out_bits - 1)) - 1
    # the range checks of pre + inc read pre alone (constant compares beside the increment),
    # and the increment needs only the out_bits bits kept when nothing saturates
    over = Signal(name=f"{name}_over")
    under = Signal(name=f"{name}_under")
    kept = Signal(signed(out_bits), name=f"{name}_kept")
    m.d.comb += [
        over.eq((pre > hi) | ((pre == hi) & inc)),
        under.eq((pre < lo - 1) | ((pre == lo - 1) & ~inc)),
        kept.eq(pre[:out_bits] + inc),
    ]
    value = Signal(signed(out_bits), name=f"{name}_val")
    flag = Signal(name=f"{name}_sat")
    m.d.comb += [
        flag.eq(over | under),
        value.eq(Mux(over, hi, Mux(under, lo, kept))),
    ]
    return value, flag


def mul_parts(a, b, chunks: int):
    """The partial products of ``a * b`` with ``b`` cut into ``chunks`` slices (the low ones
    unsigned, the top one with ``b``'s sign): a list of ``(product, shift)`` with ``a * b ==
    sum(product << shift)`` exactly (each product at its exact width). A pipelined
    multiplier registers them and adds them (:func:`mul_sum`) in the next cycle."""
    a, b = Value.cast(a), Value.cast(b)
    w = len(b)
    k = -(-w // chunks)
    parts = []
    for i in range(chunks):
        lo, hi = i * k, min((i + 1) * k, w)
        if lo >= hi:
            break
        piece = b[lo:hi]
        if hi == w and b.shape().signed:
            piece = piece.as_signed()
        parts.append((a * piece, lo))
    return parts


def mul_sum(parts, shifts):
    """``sum(part << shift)`` of registered :func:`mul_parts` (exact)."""
    total = None
    for p, sh in zip(parts, shifts):
        term = Value.cast(p) << sh
        total = term if total is None else total + term
    return total

"""Golden model of the VPU: SwiGLU in Q16.16, per-token INT8 requantization, expert combination
and the Q.24 -> FP32 conversion (plain NumPy; ``docs/numerics.md`` §7-8).

The executable definition of the VPU numerics. The RTL in :mod:`elmoe3d.hw.vpu` is compared with
these functions by plain equality. Every function is exact integer arithmetic: int64 where every
intermediate provably fits, Python integers (NumPy ``object`` arrays) where it may not (the
75-bit ``acc_y * m`` of the expert combination, left shifts by many bits).

Formats
-------
* Q.24: int64 ``value * 2^24`` (GEMM accumulators, expert outputs).
* Q16.16: int32 ``value * 2^16``, range [-32768, 32768), step 2^-16 (the VPU format).
* Q0.16: the sigmoid, 0..65536 (65536 = 1.0), 17 bits unsigned.

Rounding is round half to even everywhere (:func:`rshift_rne`); every saturation is reported in
a boolean mask that the hardware ORs into its sticky saturation flag.

This module never imports Amaranth.
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from functools import lru_cache

import numpy as np

from ...checks import is_int
from .datapath import INT64_MAX, INT64_MIN, UINT32_MAX, saturating_add


__all__ = [
    "INT32_MIN", "INT32_MAX", "INT64_MIN", "INT64_MAX", "Q16_FRAC_BITS", "Q24_FRAC_BITS",
    "SIG_ENTRIES", "SIG_STEP_BITS", "SIG_FRAC_BITS", "SILU_LIMIT",
    "rshift_rne", "sat", "to_q16", "sigmoid_table", "sigmoid_q16", "silu_q16", "swiglu_q16",
    "row_max", "requant_exponent", "requant_shift", "row_requant",
    "gate_weight_fields", "combine_term", "combine", "q24_to_fp32",
]

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
#: Fractional bits of the VPU's Q16.16 format.
Q16_FRAC_BITS = 16
#: Fractional bits of the GEMM accumulator and the expert output (Q.24).
Q24_FRAC_BITS = 24
#: Entries of the sigmoid table: sigmoid(i/16 - 16) for i = 0..512.
SIG_ENTRIES = 513
#: The table step is 1/16 = 2^12 in Q16.16: ``i = (g + 16*2^16) >> 12``.
SIG_STEP_BITS = 12
#: Fractional bits of the sigmoid value (Q0.16).
SIG_FRAC_BITS = 16
#: |g| bound of the table in Q16.16: the table covers [-16, 16) = [-2^20, 2^20).
SILU_LIMIT = 16 << 16


# ---- integer helpers --------------------------------------------------------------------------

def _as_int(v):
    """``v`` as an int64 array, or an object array of Python ints if it does not fit."""
    arr = np.asarray(v)
    if arr.dtype == object:
        return arr
    if arr.dtype.kind == "b":
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"expected an integer array, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > INT64_MAX:
        return arr.astype(object)
    return arr.astype(np.int64)


def _rshift_rne_obj(v, s):
    """rshift_rne on Python ints (object arrays or scalars); ``s`` may be any integer."""
    v = np.asarray(v, dtype=object)
    s = np.asarray(s, dtype=object)
    v, s = np.broadcast_arrays(v, s)
    out = np.empty(v.shape, dtype=object)
    for idx in np.ndindex(v.shape):
        x, k = int(v[idx]), int(s[idx])
        if k <= 0:
            out[idx] = x << -k
        else:
            q = x >> k
            r = x - (q << k)
            half = 1 << (k - 1)
            out[idx] = q + (1 if r > half or (r == half and q & 1) else 0)
    return out


def _rshift_rne_i64(v, s):
    """rshift_rne for int64 ``v`` and ``s >= 0`` (int64 arrays, broadcasting); never overflows:
    a shift by >= 64 gives 0 (|v| <= 2^63, so |v / 2^s| <= 1/2, and the tie -1/2 goes to 0)."""
    v, s = np.broadcast_arrays(np.asarray(v, np.int64), np.asarray(s, np.int64))
    big = s >= 64
    k = np.where(big, 1, s)
    q = v >> k
    r = v - (q << k)                      # in [0, 2^k): q << k lies between v - 2^k and v
    half = np.int64(1) << np.maximum(k - 1, 0)
    up = (k > 0) & ((r > half) | ((r == half) & ((q & 1) == 1)))
    return np.where(big, 0, np.where(k == 0, v, q + up)).astype(np.int64)


def rshift_rne(v, s):
    """``v / 2^s`` rounded half to even for ``s > 0``; the exact ``v * 2^-s`` for ``s <= 0``.

    numerics.md section 7 (the VPU's only rounding primitive). Elementwise with NumPy
    broadcasting.

    Parameters
    ----------
    v : integer array-like (int64, or object array of Python ints)
    s : integer array-like (any magnitude)

    Returns
    -------
    ndarray
        int64 when ``v`` is an int64-compatible array and every result fits in int64; otherwise
        an ``object`` array of exact Python ints (left shifts by many bits).
    """
    v = _as_int(v)
    s = np.asarray(s)
    if s.dtype.kind not in "iu" and s.dtype != object:
        raise TypeError(f"rshift_rne: shift must be integer, got dtype {s.dtype}")
    if v.dtype == object or s.dtype == object:
        return _try_int64(_rshift_rne_obj(v, s))
    s = s.astype(np.int64)
    v, s = np.broadcast_arrays(v, s)
    left = s <= 0
    if not left.any():
        return _rshift_rne_i64(v, s)
    kl = np.where(left, -s, 0)
    kc = np.minimum(kl, 63)
    fits = (~left) | ((kl <= 63) & (v >= (INT64_MIN >> kc)) & (v <= (INT64_MAX >> kc))) | (v == 0)
    if not fits.all():
        return _try_int64(_rshift_rne_obj(v, s))
    right = _rshift_rne_i64(v, np.where(left, 0, s))
    return np.where(left, np.where(v == 0, 0, v << kc), right).astype(np.int64)


def _try_int64(obj):
    """An object array of Python ints as int64 if every element fits, else unchanged."""
    obj = np.asarray(obj, dtype=object)
    if obj.size == 0:
        return obj.astype(np.int64)
    lo, hi = min(obj.flat), max(obj.flat)
    if lo >= INT64_MIN and hi <= INT64_MAX:
        return obj.astype(np.int64)
    return obj


def sat(v, bits: int):
    """Saturate to the signed ``bits``-bit range.

    Parameters
    ----------
    v : integer array-like (int64 or object array of Python ints)
    bits : int, 1..64

    Returns
    -------
    (value, saturated) : (int64 ndarray, bool ndarray)
        ``value = clip(v, -2^(bits-1), 2^(bits-1) - 1)``; ``saturated`` where the clip changed v.
    """
    if not is_int(bits) or not 1 <= bits <= 64:
        raise ValueError(f"sat: bits must be an integer in 1..64, got {bits!r}")
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    v = _as_int(v)
    if v.dtype == object:
        below = np.asarray(v < lo, bool)
        above = np.asarray(v > hi, bool)
        mid = np.where(below | above, 0, v).astype(np.int64)
    else:
        below, above, mid = v < lo, v > hi, v
    value = np.where(below, lo, np.where(above, hi, mid)).astype(np.int64)
    return value, below | above


def _shift_sat(v, s, bits):
    """``sat(rshift_rne(v, s), bits)`` for int64 ``v`` without leaving int64 (fast path)."""
    v, s = np.broadcast_arrays(np.asarray(v, np.int64), np.asarray(s, np.int64))
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    left = s <= 0
    k = np.minimum(np.where(left, -s, 0), 63)
    big_left = left & (-s > 63)
    # A left shift by k fits iff ceil(lo / 2^k) <= v <= floor(hi / 2^k): lo >> k is exact
    # (lo is a power of two) for k <= bits - 1, and the ceiling is 0 beyond.
    lo_k = np.where(k <= bits - 1, lo >> np.minimum(k, bits - 1), 0)
    l_over = left & ((v > (hi >> k)) | (big_left & (v > 0)))
    l_under = left & ((v < lo_k) | (big_left & (v < 0)))
    l_ok = left & ~l_over & ~l_under
    shifted = np.where(l_ok, v << np.where(l_ok, k, 0), 0)
    right = _rshift_rne_i64(v, np.where(left, 0, s))
    val = np.where(left, shifted, right)
    r_over = ~left & (val > hi)
    r_under = ~left & (val < lo)
    over, under = l_over | r_over, l_under | r_under
    val = np.where(over, hi, np.where(under, lo, val)).astype(np.int64)
    return val, over | under


# ---- 7.1 into fixed point -----------------------------------------------------------------------

def to_q16(acc, e_x):
    """Q.24 GEMM accumulator to Q16.16: ``sat32(rshift_rne(acc, 8 - e_x))`` (numerics 7.1).

    The real value of ``acc`` is ``acc * 2^(e_x - 24)``; the result ``u`` has real value
    ``u * 2^-16``.

    Parameters
    ----------
    acc : int64 array, any shape
    e_x : integer array broadcastable against ``acc`` (the token's activation exponent; for a
        token-major ``[T, I]`` block pass ``e_x[:, None]``)

    Returns
    -------
    (u, saturated) : (int64 ndarray holding int32 values, bool ndarray), shape of the broadcast
    """
    e_x = np.asarray(e_x, np.int64)
    acc = _as_int(acc)
    if acc.dtype == object:
        raise TypeError("to_q16: acc must hold int64 values")
    return _shift_sat(acc, (Q24_FRAC_BITS - Q16_FRAC_BITS) - e_x, 32)


# ---- 7.2 SiLU --------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _sigmoid_table():
    rows = []
    with localcontext() as ctx:
        ctx.prec = 60
        for i in range(SIG_ENTRIES):
            x = Decimal(i) / 16 - 16
            val = Decimal(1 << SIG_FRAC_BITS) / (1 + (-x).exp())
            rows.append(int(val.to_integral_value(rounding="ROUND_HALF_EVEN")))
    table = np.array(rows, np.int64)
    table.flags.writeable = False
    return table


def sigmoid_table() -> np.ndarray:
    """The 513-entry sigmoid table ``T[i] = rint(sigmoid(i/16 - 16) * 2^16)`` (numerics 7.2).

    int64 array of shape ``[513]`` (read-only), values 0..65536 (17 bits unsigned; ``T[0] = 0``,
    ``T[512] = 65536``), non-decreasing. Computed once in 60-digit decimal arithmetic (correctly
    rounded ``exp``), so the table does not depend on the platform's libm.
    """
    return _sigmoid_table()


def sigmoid_q16(g):
    """Interpolated sigmoid in Q0.16 for ``-16 <= g < 16`` (numerics 7.2), int64 array.

    ``i = (g + 16*2^16) >> 12``, ``frac = (g + 16*2^16) & 4095``,
    ``sig = T[i] + rshift_rne((T[i+1] - T[i]) * frac, 12)``. Outside the table range the value
    returned is that of the clamped index and is not used by :func:`silu_q16`.
    """
    g = np.asarray(g, np.int64)
    t = sigmoid_table()
    x = np.clip(g, -SILU_LIMIT, SILU_LIMIT - 1) + SILU_LIMIT
    i = x >> SIG_STEP_BITS
    frac = x & ((1 << SIG_STEP_BITS) - 1)
    return t[i] + _rshift_rne_i64((t[i + 1] - t[i]) * frac, SIG_STEP_BITS)


def silu_q16(g):
    """SiLU in Q16.16 (numerics 7.2): ``rshift_rne(g * sigmoid_q16(g), 16)`` for
    ``-16 <= g < 16``; ``g`` for ``g >= 16``; 0 for ``g < -16``.

    Parameters
    ----------
    g : integer array, Q16.16 values (int32 range)

    Returns
    -------
    int64 ndarray of Q16.16 values in [-18254, 2^31 - 1] (never saturates; -18254, about
    -0.2785, is the minimum over all inputs, near g = -1.28).
    """
    g = np.asarray(g, np.int64)
    if g.size and (g.min() < INT32_MIN or g.max() > INT32_MAX):
        raise ValueError("silu_q16: g must hold int32 (Q16.16) values")
    inner = _rshift_rne_i64(g * sigmoid_q16(g), SIG_FRAC_BITS)
    return np.where(g >= SILU_LIMIT, g, np.where(g < -SILU_LIMIT, 0, inner)).astype(np.int64)


# ---- 7.3 SwiGLU --------------------------------------------------------------------------------------

def swiglu_q16(acc_up, acc_gate, e_x):
    """SwiGLU ``h = silu(gate) * up`` in Q16.16 (numerics 7.1-7.3). Elementwise.

    ``u = sat32(rshift_rne(acc_up, 8 - e_x))``, ``g`` likewise, ``s = silu_q16(g)``,
    ``h = sat32(rshift_rne(s * u, 16))`` (``|s * u| < 2^62``: exact in int64).

    Parameters
    ----------
    acc_up, acc_gate : int64 arrays (Q.24 accumulators of the up and gate GEMMs), same shape
    e_x : integer array broadcastable against them (per-token activation exponent; pass
        ``e_x[:, None]`` for ``[T, I]`` blocks)

    Returns
    -------
    (h, sat) : (int32 ndarray, bool ndarray)
        ``h`` in Q16.16; ``sat`` where ``u``, ``g`` or ``h`` saturated.
    """
    u, su = to_q16(acc_up, e_x)
    g, sg = to_q16(acc_gate, e_x)
    s = silu_q16(g)
    h, sh = _shift_sat(s * u, SIG_FRAC_BITS, 32)
    return h.astype(np.int32), su | sg | sh


# ---- 7.4-7.5 row max and requantization ------------------------------------------------------------

def row_max(h) -> np.ndarray:
    """``M[t] = max |h[t, i]|`` over the last axis (numerics 7.4): int64 ``[...]`` (up to 2^31).
    An empty last axis gives 0."""
    h = np.asarray(h, np.int64)
    if h.shape[-1] == 0:
        return np.zeros(h.shape[:-1], np.int64)
    return np.abs(h).max(axis=-1)


def _bit_length(m):
    """Exact bit length of non-negative int64 values (vectorised)."""
    m = np.asarray(m, np.int64)
    _, e = np.frexp(m.astype(np.float64))
    e = e.astype(np.int64)
    # float64 may round m up to the next power of two: correct by at most one either way.
    e = np.where((e > 0) & ((np.int64(1) << np.clip(e - 1, 0, 62)) > m), e - 1, e)
    e = np.where((e < 63) & ((np.int64(1) << np.clip(e, 0, 62)) <= m) & (m > 0), e + 1, e)
    return e


def requant_exponent(rowmax) -> np.ndarray:
    """``e'`` = the smallest integer with ``rowmax <= 127 * 2^e'``; 0 for ``rowmax == 0``
    (numerics 7.5).

    Takes the row max so that a split intermediate dimension can all-reduce the max first.

    Parameters
    ----------
    rowmax : integer array, values in [0, 2^32 - 1] (the max |h| of a Q16.16 row is at most
        2^31; the 32-bit range is what :class:`elmoe3d.hw.vpu.RowMaxExponent` accepts)

    Returns
    -------
    int64 ndarray, same shape; in [-6, 26] for a nonzero row max (-6 for 1, 25 for 2^31, 26
    above 127 * 2^25).

    Raises
    ------
    ValueError
        A row max outside [0, 2^32 - 1].
    """
    m = np.asarray(rowmax)
    if m.dtype.kind not in "iu":
        raise TypeError(f"requant_exponent: expected integers, got dtype {m.dtype}")
    m = m.astype(np.int64)
    if m.size and (m.min() < 0 or m.max() > UINT32_MAX):
        raise ValueError("requant_exponent: row max must lie in [0, 2^32 - 1]")
    b = _bit_length(m)
    # e' is b - 7 or b - 6: 127 * 2^(b-8) < 2^(b-1) <= m < 2^b < 127 * 2^(b-6).
    # m <= 127 * 2^(b-7)  <=>  128 m <= 127 * 2^b   (exact in int64: m < 2^32).
    e = np.where(128 * m <= 127 * (np.int64(1) << b), b - 7, b - 6)
    return np.where(m == 0, 0, e).astype(np.int64)


def requant_shift(h, e_prime):
    """``clip(rshift_rne(h, e'), -127, 127)`` (numerics 7.5). Elementwise.

    Parameters
    ----------
    h : integer array of Q16.16 values (int32 range)
    e_prime : integer array broadcastable against ``h`` (any int8 value; pass ``e'[:, None]``
        for ``[T, I]`` blocks)

    Returns
    -------
    (h_q, clipped) : (int8 ndarray, bool ndarray)
        ``clipped`` where the clip changed the value. With ``e'`` from :func:`requant_exponent`
        of the row's (or a larger) max it never does.
    """
    h = np.asarray(h, np.int64)
    val, clipped = _shift_sat(h, np.asarray(e_prime, np.int64), 8)
    clipped = clipped | (val == -128)
    val = np.maximum(val, -127)
    return val.astype(np.int8), clipped


def row_requant(h, rowmax=None):
    """Per-token requantization of a SwiGLU block to INT8 (numerics 7.4-7.5).

    Parameters
    ----------
    h : int32 array ``[T, I]`` (Q16.16)
    rowmax : integer array ``[T]``, optional
        The row max to use; defaults to :func:`row_max` of ``h``. A PE holding a slice of the
        intermediate dimension passes the all-reduced max of all slices.

    Returns
    -------
    (h_q, e_h) : (int8 ``[T, I]``, int64 ``[T]``)
        ``h[t, i]`` is about ``h_q[t, i] * 2^e_h[t]`` (real units); ``e_h = e' - 16``.

    Raises
    ------
    ValueError
        ``rowmax`` smaller than the row's own max (the clip would bite).
    """
    h = np.asarray(h)
    if h.ndim != 2:
        raise ValueError(f"row_requant: h must be [T, I], got shape {h.shape}")
    own = row_max(h)
    if rowmax is None:
        rowmax = own
    rowmax = np.asarray(rowmax, np.int64)
    if rowmax.shape != own.shape:
        raise ValueError(f"row_requant: rowmax must have shape {own.shape}, got {rowmax.shape}")
    if (rowmax < own).any():
        raise ValueError("row_requant: rowmax is smaller than the row's own max |h|")
    e_prime = requant_exponent(rowmax)
    h_q, clipped = requant_shift(h, e_prime[:, None])
    assert not clipped.any()
    return h_q, e_prime - Q16_FRAC_BITS


# ---- 8. expert combination ------------------------------------------------------------------------

def gate_weight_fields(gw):
    """FP16 gate weight as ``(m, E)`` with ``w = m * 2^E`` exactly (numerics 8).

    Normal (exponent field e in 1..30): ``m = 1024 + f``, ``E = e - 25``; subnormal (e = 0):
    ``m = f``, ``E = -24``; e = 31 follows the normal rule (``E = 6``; never produced by a
    router); the sign bit negates ``m``.

    Parameters
    ----------
    gw : float16 array (values) or uint16 array (raw FP16 bits)

    Returns
    -------
    (m, E) : int64 arrays; |m| <= 2047, E in [-24, 6]
    """
    gw = np.asarray(gw)
    if gw.dtype == np.float16:
        bits = gw.view(np.uint16)
    elif gw.dtype == np.uint16:
        bits = gw
    else:
        raise TypeError(f"gate weight: expected float16 values or uint16 bits, got {gw.dtype}")
    bits = bits.astype(np.int64)
    e, f, neg = (bits >> 10) & 31, bits & 1023, (bits >> 15) & 1
    m = np.where(e == 0, f, 1024 + f)
    m = np.where(neg == 1, -m, m)
    E = np.where(e == 0, -24, e - 25)
    return m.astype(np.int64), E.astype(np.int64)


def combine_term(acc_y, e_h, gate_weight_fp16):
    """One weighted down-projection output in Q.24 (numerics 8). Elementwise, broadcasting.

    ``term = sat64(rshift_rne(acc_y * m, -(e_h + E)))`` where ``w = m * 2^E`` is the FP16 gate
    weight (:func:`gate_weight_fields`). ``acc_y * m`` is up to 75 bits: it is formed exactly
    (int64 where ``|acc_y| < 2^52``, Python ints elsewhere).

    Parameters
    ----------
    acc_y : int64 array (Q.24 down-GEMM accumulators, real value ``acc_y * 2^(e_h - 24)``)
    e_h : integer array (per-token exponent; ``e_h[:, None]`` for ``[T, H]``)
    gate_weight_fp16 : float16 values or uint16 FP16 bits (``[:, None]`` for ``[T, H]``)

    Returns
    -------
    (term, saturated) : (int64 ndarray, bool ndarray)
    """
    acc_y = np.asarray(acc_y, np.int64)
    m, E = gate_weight_fields(gate_weight_fp16)
    s = -(np.asarray(e_h, np.int64) + E)
    acc_y, m, s = np.broadcast_arrays(acc_y, m, s)
    small = (acc_y > -(1 << 52)) & (acc_y < (1 << 52))    # |acc_y * m| < 2^63 (no np.abs:
    #                                                       |INT64_MIN| wraps)
    term, satd = _shift_sat(np.where(small, acc_y * m, 0), s, 64)
    if not small.all():
        idx = np.nonzero(~small)
        prod = acc_y[idx].astype(object) * m[idx].astype(object)
        big_t, big_s = sat(_rshift_rne_obj(prod, s[idx]), 64)
        term = term.copy()
        satd = satd.copy()
        term[idx] = big_t
        satd[idx] = big_s
    return term.astype(np.int64), satd


def combine(out, flags, acc_y, e_h, gw):
    """Add one expert's weighted output into the token outputs (numerics 8): the VPU's
    read-modify-write of the OUT memory.

    Parameters
    ----------
    out : int64 ``[T, H]`` (Q.24 running sums)
    flags : bool ``[T, H]`` (sticky saturation flags)
    acc_y : int64 ``[T, H]`` (this expert's down-GEMM accumulators)
    e_h : integer ``[T]`` (the tokens' down-projection exponents)
    gw : float16 or uint16 (FP16 bits) ``[T]`` (the router's gate weights for this expert)

    Returns
    -------
    (out_new, flags_new) : (int64 ``[T, H]``, bool ``[T, H]``)
        ``out + term`` saturated at the int64 bounds; the flag is set by a saturating term or a
        saturating addition and stays set.
    """
    out = np.asarray(out, np.int64)
    flags = np.asarray(flags, bool)
    acc_y = np.asarray(acc_y, np.int64)
    if out.ndim != 2 or out.shape != acc_y.shape or flags.shape != out.shape:
        raise ValueError(f"combine: out, flags and acc_y must be [T, H] of one shape, got "
                         f"{out.shape}, {flags.shape}, {acc_y.shape}")
    e_h = np.asarray(e_h)
    gw = np.asarray(gw)
    if e_h.shape != out.shape[:1] or gw.shape != out.shape[:1]:
        raise ValueError(f"combine: e_h and gw must have shape {out.shape[:1]}, got "
                         f"{e_h.shape}, {gw.shape}")
    term, st = combine_term(acc_y, e_h[:, None], gw[:, None])
    new, so = saturating_add(out, term)            # the accumulator's rule
    return new, flags | st | so


def q24_to_fp32(out) -> np.ndarray:
    """``float32(out * 2^-24)`` rounded to nearest, ties to even (numerics 8).

    Exact for ``|out| < 2^24``; every int64 gives a finite normal (or zero) float32
    (``|value| <= 2^39``). Not ``out.astype(float64)`` then float32 (double rounding).

    Parameters
    ----------
    out : int64 array (Q.24), any shape

    Returns
    -------
    float32 ndarray, same shape
    """
    out = np.asarray(out)
    if out.dtype.kind not in "iu":
        raise TypeError(f"q24_to_fp32: expected integers, got dtype {out.dtype}")
    out = out.astype(np.int64)
    neg = out < 0
    u = out.astype(np.uint64)
    mag = np.where(neg, ~u + np.uint64(1), u)             # |out| in uint64 (2^63 included)
    hi = (mag >> np.uint64(32)).astype(np.int64)
    lo = (mag & np.uint64(UINT32_MAX)).astype(np.int64)
    b = np.where(hi > 0, _bit_length(hi) + 32, _bit_length(lo))
    sh = np.maximum(b - 24, 0).astype(np.uint64)
    q = mag >> sh
    r = mag - (q << sh)
    half = np.where(sh > 0, np.uint64(1) << (np.maximum(sh, np.uint64(1)) - np.uint64(1)),
                    np.uint64(0))
    up = (sh > 0) & ((r > half) | ((r == half) & ((q & np.uint64(1)) == 1)))
    q = q + up.astype(np.uint64)                            # <= 2^24: exact in float32
    val = np.ldexp(q.astype(np.float64), sh.astype(np.int64) - Q24_FRAC_BITS)
    return np.where(neg, -val, val).astype(np.float32)

"""Exact emulation of the bit-sliced IA8xW5 datapath and the fused-dequantization accumulator.

The executable definition of docs/numerics.md, items 3-5 (paper Section 4.3, Fig. 8; Section 4.1
"partial sums are accumulated through a 32-way adder tree and immediately scaled"). The RTL in
:mod:`elmoe3d.hw` is checked against these functions with plain equality.

Fixed point: the accumulator is a signed 64-bit integer holding ``value * 2^24`` (Q.24). A group
psum is scaled by its FP16 group scale exactly: for a normal scale (exponent field e in 1..30,
mantissa m = 1024 + fraction) the term is ``psum * m << (e - 1)``; for a subnormal scale
(e = 0) it is ``psum * fraction``. Terms are added with saturation at the int64 bounds and a
sticky overflow flag. Because every term is an exact integer, results do not depend on the order
of accumulation, on K tiling, on batch size or on how work is split across PEs, as long as no
accumulator saturates (a saturated result is flagged and, as in any saturating datapath, then
depends on the order in which terms arrived; the golden model adds groups in ascending K).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ...checks import is_int
from .quant import (GROUP, QuantizationError, QuantizationTypeError, QuantizedActivation,
                    QuantizedWeight, _lsb, _msb, _to_array, _what_type, as_int8_codes)


__all__ = [
    "Mode", "ACC_FRAC_BITS", "PSUM_BITS", "INT64_MIN", "INT64_MAX", "UINT32_MAX",
    "parse_mode", "msb_field", "lsb_field", "unit_pe", "slice_product", "effective_weight",
    "scale_fields", "scale_term", "group_psums", "group_psums_reference",
    "Accumulator", "saturating_add", "accumulate", "check_gemm_operands", "gemm", "gemm_reference",
    "acc_to_float",
]

#: Fractional bits of the fused-dequantization accumulator.
ACC_FRAC_BITS = 24
#: Width of a signed group psum after the slice shift (numerics §4): every mode's
#: ``|sum_k a[k] * w[k]|`` over a group of 32 is at most ``32 * 128 * 128 = 2^19``, which
#: ``[-2^20, 2^20 - 1]`` holds (the RTL's psum register).
PSUM_BITS = 21
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
#: Largest unsigned 32-bit value (a row-max register holds max |h|, Q16.16, as u32; the low
#: half of a 64-bit magnitude).
UINT32_MAX = (1 << 32) - 1


class Mode(enum.IntEnum):
    """Unit-PE operating mode (numerics §3). The integer values are the RTL encoding."""

    #: Both slices: two unit PEs per weight, ``(a*{msb,0}) << 3 + a*{0,lsb} = a*q``.
    FULL = 0
    #: MSB slice with the LSB-augmentation mux at 1: ``(a*{msb,1}) << 3 = a*(16*msb + 8)``.
    DRAFT = 1
    #: MSB slice with the mux at 0: ``a*16*msb``; the HB half of a verify split.
    MSB_ONLY = 2
    #: LSB slice alone: ``a*lsb``; the EXT half of a verify split.
    LSB_ONLY = 3


def msb_field(msb, aug):
    """The unit PE's 5-bit signed weight field ``{msb[3:0], aug}`` = ``2*msb + aug``
    (int16, in [-16, 15]). ``msb`` integers in [-8, 7], ``aug`` 0 or 1 (broadcasting).
    Raises :class:`~.quant.QuantizationError` (a ``QuantizationTypeError`` for a dtype that is
    not an integer one) for anything else: nothing wraps."""
    return _msb_field(as_int8_codes(msb, "msb_field: msb", lo=-8, hi=7),
                      as_int8_codes(aug, "msb_field: aug", lo=0, hi=1))


def _msb_field(msb, aug):
    """:func:`msb_field` of operands known to be in range (the tile's own nibbles)."""
    return np.asarray(msb, np.int16) * 2 + np.asarray(aug, np.int16)


def lsb_field(lsb):
    """The 5-bit field ``{0, lsb[3:0]}`` = lsb (int16, in [0, 15]). Raises
    :class:`~.quant.QuantizationError` for an ``lsb`` that is not an integer in [0, 15]."""
    return _lsb_field(as_int8_codes(lsb, "lsb_field: lsb", lo=0, hi=15))


def _lsb_field(lsb):
    """:func:`lsb_field` of nibbles known to be in 0..15."""
    return np.asarray(lsb, np.int16)


def unit_pe(a, field):
    """IA8xW5 unit-PE product: int8 activation ``a`` times the signed 5-bit ``field``
    (:func:`msb_field`, :func:`lsb_field`), int32 with ``|p| <= 2048``, broadcasting. Raises
    :class:`~.quant.QuantizationError` for an ``a`` outside int8 or a ``field`` outside
    [-16, 15] (integers only)."""
    return _unit_pe(as_int8_codes(a, "unit_pe: a"),
                    as_int8_codes(field, "unit_pe: field", lo=-16, hi=15))


def _unit_pe(a, field):
    """:func:`unit_pe` of operands known to be in range (the tile's checked beats)."""
    return np.asarray(a, np.int32) * np.asarray(field, np.int32)


def slice_product(a, q, mode) -> np.ndarray:
    """Product of activation ``a`` and INT8 weight ``q`` as the bit-sliced datapath forms it
    (slice by slice, with the shift of the slice combiner). int32, broadcasting. ``mode`` as
    :func:`parse_mode`. Raises :class:`~.quant.QuantizationError` naming ``slice_product``
    and the operand for ``a`` or ``q`` outside int8 (integers only) or an unknown ``mode``."""
    mode = parse_mode(mode, "slice_product")
    q = as_int8_codes(q, "slice_product: q")
    msb, lsb = _msb(q), _lsb(q)
    a = as_int8_codes(a, "slice_product: a")
    if mode is Mode.FULL:
        return (_unit_pe(a, _msb_field(msb, 0)) << 3) + _unit_pe(a, _lsb_field(lsb))
    if mode is Mode.DRAFT:
        return _unit_pe(a, _msb_field(msb, 1)) << 3
    if mode is Mode.MSB_ONLY:
        return _unit_pe(a, _msb_field(msb, 0)) << 3
    return _unit_pe(a, _lsb_field(lsb))


def effective_weight(q, mode) -> np.ndarray:
    """The weight value a mode multiplies by (int16, ``q``'s shape): q, 16*msb + 8, 16*msb or
    lsb. ``mode`` as :func:`parse_mode`. Raises :class:`~.quant.QuantizationError` naming
    ``effective_weight`` and ``q`` for codes outside int8, or an unknown ``mode``."""
    mode = parse_mode(mode, "effective_weight")
    q = as_int8_codes(q, "effective_weight: q")
    if mode is Mode.FULL:
        return q.astype(np.int16)
    if mode is Mode.DRAFT:
        return _msb(q).astype(np.int16) * 16 + 8
    if mode is Mode.MSB_ONLY:
        return _msb(q).astype(np.int16) * 16
    return _lsb(q).astype(np.int16)


def _fp16(scale, what):
    """``scale`` as a float16 array, or a :class:`~.quant.QuantizationTypeError` naming
    ``what``: a float32 or float64 scale would be rounded to FP16 without a word."""
    arr = _to_array(scale, what, "FP16 group scales (float16)")
    if arr.dtype != np.float16:
        raise QuantizationTypeError(f"{what}: expected FP16 group scales (float16), got "
                                    f"{_what_type(scale, arr)}")
    return arr


def scale_fields(scale):
    """Split FP16 scales (float16, any shape) into (exponent field e, fraction f) as int64
    arrays. Raises :class:`~.quant.QuantizationTypeError` for a dtype other than float16."""
    bits = _fp16(scale, "scale_fields: scale").view(np.uint16).astype(np.int64)
    return (bits >> 10) & 31, bits & 1023


def _mantissa_shift(scale):
    """``(m, shift)`` with ``scale * 2^24 == m << shift`` and the sign of the scale applied to
    m. Exponent 31 (Inf/NaN) is not produced by the quantizer; it extends the same rule."""
    e, f = scale_fields(scale)
    sign = np.where(np.asarray(scale).view(np.uint16) >> 15, -1, 1)
    m = np.where(e == 0, f, 1024 + f) * sign
    shift = np.where(e == 0, 0, e - 1)
    return m.astype(np.int64), shift.astype(np.int64)


def scale_term(psum, scale) -> np.ndarray:
    """Exact Q.24 term ``psum * scale * 2^24`` as the datapath forms it (numerics §5): int64,
    broadcasting, ``|term| < 2^61``. ``psum`` integers of :data:`PSUM_BITS` signed bits (a
    group psum is within ``2^19``); ``scale`` float16, every bit pattern read by the mantissa
    and shift rule as the RTL does (the sign applied; exponent 31, which no quantizer makes,
    shifts by 30). Raises :class:`~.quant.QuantizationError` for a psum outside that range
    (the term would wrap) and :class:`~.quant.QuantizationTypeError` for psums that are not
    integers or scales that are not float16."""
    psum = _psums(psum, "scale_term: psum")
    return _scale_term(psum, _fp16(scale, "scale_term: scale"))


def _psums(psum, what):
    """``psum`` as an integer array of :data:`PSUM_BITS`-bit signed values, or a
    :class:`~.quant.QuantizationError` (a ``QuantizationTypeError`` for a dtype) naming
    ``what``: a wider psum would wrap in :func:`_scale_term`."""
    arr = _to_array(psum, what, "integer group psums")
    if not np.issubdtype(arr.dtype, np.integer):
        raise QuantizationTypeError(f"{what}: expected integer group psums, got "
                                    f"{_what_type(psum, arr)}")
    lim = 1 << (PSUM_BITS - 1)
    if arr.size and (arr.min() < -lim or arr.max() > lim - 1):
        raise QuantizationError(f"{what}: expected {PSUM_BITS}-bit signed group psums in "
                                f"[{-lim}, {lim - 1}], got values in [{arr.min()}, "
                                f"{arr.max()}]")
    return arr


def _scale_term(psum, scale):
    """:func:`scale_term` of checked operands (:func:`_psums`, float16 ``scale``)."""
    m, shift = _mantissa_shift(scale)
    return (psum.astype(np.int64) * m) << shift


def _psum_operands(a, w_eff, caller):
    """``(a, w_eff)`` checked as group-psum operands: int8 activation codes ``[M, K]`` and
    effective weights ``[N, K]`` in [-128, 127] (:func:`effective_weight`: every mode's are),
    K a non-zero multiple of 32; a :class:`~.quant.QuantizationError` naming ``caller``
    otherwise. Within those ranges every group psum is within ``2^19``."""
    a = as_int8_codes(a, f"{caller}: a")
    w = as_int8_codes(w_eff, f"{caller}: w_eff")
    if a.ndim != 2 or w.ndim != 2 or a.shape[1] != w.shape[1] or not a.shape[1] \
            or a.shape[1] % GROUP:
        raise QuantizationError(f"{caller}: expected a[M, K] and w_eff[N, K] with K a non-zero "
                                f"multiple of {GROUP}, got {tuple(a.shape)} and "
                                f"{tuple(w.shape)}")
    return a, w


def group_psums_reference(a, w_eff) -> np.ndarray:
    """Exact group psums ``psum[m, n, g] = sum_k a[m, k] * w_eff[n, k]`` over each group of 32,
    in int64 arithmetic (slow, obviously right): int64 ``[M, N, K/32]``. Raises as
    :func:`group_psums`."""
    a, w = _psum_operands(a, w_eff, "group_psums_reference")
    a, w = a.astype(np.int64), w.astype(np.int64)
    mdim, k = a.shape
    ndim = w.shape[0]
    g = k // GROUP
    return np.einsum("mgk,ngk->mng", a.reshape(mdim, g, GROUP), w.reshape(ndim, g, GROUP))


def group_psums(a, w_eff) -> np.ndarray:
    """Exact group psums (int32, shape ``[M, N, K/32]``) through float32 BLAS.

    Exact because every partial sum is an integer of magnitude at most 32 * 128 * 128 = 2^19,
    well inside float32's 24-bit significand, whatever the summation order. ``a`` int8 codes
    ``[M, K]``, ``w_eff`` effective weights ``[N, K]`` (:func:`effective_weight`).

    Raises
    ------
    QuantizationError
        an operand outside [-128, 127] (its psums could leave float32's exact range), not
        2-D, or a K that differs or is not a non-zero multiple of 32.
    QuantizationTypeError
        an operand that is not integers.
    """
    a, w = _psum_operands(a, w_eff, "group_psums")
    mdim, k = a.shape
    ndim = w.shape[0]
    g = k // GROUP
    a3 = a.astype(np.float32).reshape(mdim, g, GROUP).transpose(1, 0, 2)   # [G, M, 32]
    w3 = w.astype(np.float32).reshape(ndim, g, GROUP).transpose(1, 2, 0)   # [G, 32, N]
    return np.matmul(a3, w3).transpose(1, 2, 0).astype(np.int32)


@dataclass(frozen=True, eq=False)
class Accumulator:
    """Fused-dequantization accumulator state.

    Attributes
    ----------
    acc : ndarray of int64, shape ``[M, N]``
        Q.24 values: the real value is ``acc * 2^-24`` (times the activation scale).
    overflow : ndarray of bool, shape ``[M, N]``
        Sticky flag: some addition saturated at the int64 bounds.

    Raises
    ------
    QuantizationTypeError
        ``acc`` not integers that int64 holds (floats, uint64, bool; Python ints or lists of
        them are converted to int64 when every value fits), ``overflow`` not bool, or either
        no array (ragged nested lists).
    QuantizationError
        ``acc`` not 2-D, an integer beyond int64, or ``overflow`` not of ``acc``'s shape.
    """

    acc: np.ndarray
    overflow: np.ndarray

    def __post_init__(self):
        acc = _int64_operand(self.acc, "Accumulator: acc", "int64 Q.24 accumulators [M, N]")
        ovf = _to_array(self.overflow, "Accumulator: overflow", "bool flags [M, N]")
        if ovf.dtype != np.bool_:
            raise QuantizationTypeError(f"Accumulator: overflow: expected bool flags [M, N], "
                                        f"got {_what_type(self.overflow, ovf)}")
        if acc.ndim != 2:
            raise QuantizationError(f"Accumulator: acc: expected a 2-D array [M, N], got shape "
                                    f"{tuple(acc.shape)}")
        if ovf.shape != acc.shape:
            raise QuantizationError(f"Accumulator: expected acc and overflow of one shape "
                                    f"[M, N], got {tuple(acc.shape)} and {tuple(ovf.shape)}")
        object.__setattr__(self, "acc", acc)
        object.__setattr__(self, "overflow", ovf)

    @classmethod
    def zeros(cls, m, n):
        """The reset state: ``acc`` 0 (int64) and ``overflow`` False, shape ``[m, n]``.
        Raises :class:`~.quant.QuantizationError` naming ``m`` or ``n`` for a negative one,
        :class:`~.quant.QuantizationTypeError` for one that is no integer (bool included)."""
        for name, v in (("m", m), ("n", n)):
            if not is_int(v) or v < 0:
                err = QuantizationError if is_int(v) else QuantizationTypeError
                raise err(f"Accumulator.zeros: {name}: expected an integer >= 0, got {v!r}")
        return cls(np.zeros((m, n), np.int64), np.zeros((m, n), bool))

    def __eq__(self, other):
        return (isinstance(other, Accumulator) and np.array_equal(self.acc, other.acc)
                and np.array_equal(self.overflow, other.overflow))


def _int64_operand(x, what, expected):
    """``x`` as an int64 array without changing a value, or a named error: an int64 array
    as it is (no copy: the hot path), another signed or a narrower unsigned integer dtype
    converted; Python ints (and lists of them) only where every value fits int64.

    Raises :class:`~.quant.QuantizationTypeError` naming ``what`` for floats (they would be
    truncated), bool, uint64 (its values above ``INT64_MAX`` have no int64 form: view two's
    complement bits as int64 explicitly), other dtypes and ragged lists, and
    :class:`~.quant.QuantizationError` for a Python integer beyond int64."""
    if isinstance(x, np.ndarray) and x.dtype == np.int64:
        return x
    arr = _to_array(x, what, expected)
    if arr.dtype == np.int64:
        return arr
    if not isinstance(x, (np.ndarray, np.generic)) and arr.dtype.kind in "fuO":
        # Python ints beyond int64 come out as uint64, float64 or object arrays
        obj = np.asarray(x, dtype=object)
        bad = [v for v in obj.flat if is_int(v) and not INT64_MIN <= v <= INT64_MAX]
        if bad and all(is_int(v) for v in obj.flat):
            bad = int(bad[0])
            raise QuantizationError(f"{what}: expected {expected}, got the integer {bad}, "
                                    f"beyond int64 [{INT64_MIN}, {INT64_MAX}]")
    if arr.dtype.kind == "i" or (arr.dtype.kind == "u" and arr.dtype.itemsize < 8):
        return arr.astype(np.int64)
    hint = " (view two's complement bits with .view(np.int64))" if arr.dtype == np.uint64 \
        else ""
    raise QuantizationTypeError(f"{what}: expected {expected}, got {_what_type(x, arr)}{hint}")


def saturating_add(acc, term):
    """Saturating signed 64-bit addition, elementwise: ``(sum, overflowed)``.

    ``acc`` and ``term`` are int64 (broadcast together; other signed or narrower unsigned
    integer arrays, Python ints and lists of them are taken as int64 when every value fits);
    a sum beyond the int64 range clamps to ``INT64_MAX`` (positive ``term``) or ``INT64_MIN``
    (negative) and sets the bool ``overflowed``. The accumulator's rule (numerics),
    ``hw.fixed.sat_add64`` in the RTL.

    Returns
    -------
    (sum, overflowed) : (int64 ndarray, bool ndarray), the broadcast shape

    Raises
    ------
    QuantizationTypeError
        an operand of floats (never truncated), bool, uint64 (no int64 form above
        ``INT64_MAX``: view two's complement bits as int64 first) or another non-integer type,
        or ragged nested lists.
    QuantizationError
        a Python integer beyond int64; shapes that do not broadcast together.
    """
    acc = _int64_operand(acc, "saturating_add: acc", "int64 integers")
    term = _int64_operand(term, "saturating_add: term", "int64 integers")
    try:
        if acc.shape != term.shape:
            np.broadcast_shapes(acc.shape, term.shape)
    except ValueError:
        raise QuantizationError(f"saturating_add: acc and term: expected shapes that broadcast "
                                f"together, got {tuple(acc.shape)} and "
                                f"{tuple(term.shape)}") from None
    return _saturating_add(acc, term)


def _saturating_add(acc, term):
    """:func:`saturating_add` of int64 arrays (the accumulator's inner loop)."""
    with np.errstate(over="ignore"):
        total = acc + term                       # wraps; detect by the sign rule
    ovf = ((acc ^ total) & (term ^ total)) < 0
    total = np.where(ovf, np.where(term > 0, INT64_MAX, INT64_MIN), total)
    return total, ovf


def accumulate(psums, scale, init: Accumulator | None = None) -> Accumulator:
    """Scale group psums and add them, group by group in ascending K, into the Q.24 accumulator.

    Parameters
    ----------
    psums : int array, shape ``[M, N, G]``
    scale : float16 array, shape ``[N, G]``
    init : Accumulator, optional
        Carry-in state (K tiling); defaults to zeros.

    Raises
    ------
    QuantizationError
        ``psums`` not 3-D or outside :data:`PSUM_BITS` signed bits; ``scale`` not of shape
        ``[N, G]``; ``init`` not ``[M, N]``.
    QuantizationTypeError
        ``psums`` not integers; ``scale`` not float16 (no silent rounding to FP16); ``init``
        not an :class:`Accumulator`.
    """
    psums = _psums(psums, "accumulate: psums")
    if psums.ndim != 3:
        raise QuantizationError(f"accumulate: psums: expected shape [M, N, G], got "
                                f"{tuple(psums.shape)}")
    mdim, ndim, g = psums.shape
    scale = _fp16(scale, "accumulate: scale")
    if scale.shape != (ndim, g):
        raise QuantizationError(f"accumulate: scale: expected one FP16 scale per output "
                                f"channel and group, shape [N, G] = {(ndim, g)}, got "
                                f"{tuple(scale.shape)}")
    if init is not None:
        _check_init(init, (mdim, ndim), "accumulate")
    state = init or Accumulator.zeros(mdim, ndim)
    acc, flag = state.acc.copy(), state.overflow.copy()
    terms = _scale_term(psums, scale[None, :, :])
    for j in range(g):
        acc, ovf = _saturating_add(acc, terms[:, :, j])
        flag |= ovf
    return Accumulator(acc, flag)


def parse_mode(mode, caller: str = "parse_mode") -> Mode:
    """``mode`` (a :class:`Mode`, its integer or its name, ``"DRAFT"`` or ``"draft"``) as a
    :class:`Mode`, or a :class:`QuantizationError` naming ``caller`` and listing the modes."""
    try:
        if isinstance(mode, str):
            return Mode[mode.upper()]
        if not is_int(mode):
            raise ValueError(mode)                      # 1.0 or True would read as DRAFT
        return Mode(mode)
    except (KeyError, ValueError, TypeError):
        names = ", ".join(f"{m.name} ({m.value})" for m in Mode)
        raise QuantizationError(f"{caller}: mode: expected a Mode, one of {names}, "
                                f"got {mode!r}") from None


def check_gemm_operands(a_q, qw: QuantizedWeight, mode=Mode.FULL, init=None, *,
                        caller: str = "gemm"):
    """Validate GEMM operands; returns ``a_q`` as an array.

    Every message starts with ``caller`` and names the argument and what was expected.

    Raises
    ------
    QuantizationTypeError
        (a ``QuantizationError`` and a ``TypeError``) ``a_q`` is not int8 codes (a float
        array, a :class:`~.quant.QuantizedActivation`), ``qw`` is not a
        :class:`~.quant.QuantizedWeight`, or ``init`` is neither None nor an
        :class:`Accumulator` of int64 ``acc`` and bool ``overflow``.
    QuantizationError
        (a ``ValueError``) an unknown ``mode`` (a :class:`Mode`, its integer value or its name
        are taken, :func:`parse_mode`); shapes that do not match (``init`` must be ``[M, N]``);
        a slice mode on a weight that is not bit-nested INT8 (``qw.bits != 8``).
    """
    if not isinstance(qw, QuantizedWeight):
        raise QuantizationTypeError(f"{caller}: qw: expected a QuantizedWeight "
                                    f"(quantize_weights(w)), got {type(qw).__name__}")
    mode = parse_mode(mode, caller)
    if mode is not Mode.FULL and qw.bits != 8:
        raise QuantizationError(f"{caller}: mode {mode.name} needs bit-nested INT8 weights; "
                                f"{qw.name!r} has {qw.bits}-bit codes (use FULL)")
    if isinstance(a_q, QuantizedActivation):
        raise QuantizationTypeError(f"{caller}: a_q: expected int8 activation codes [M, K], got "
                                    f"a QuantizedActivation (pass its .q)")
    a_q = _to_array(a_q, f"{caller}: a_q", "int8 activation codes [M, K]")
    if a_q.dtype != np.int8:
        raise QuantizationTypeError(f"{caller}: a_q: expected int8 activation codes [M, K] "
                                    f"(quantize_activations(x).q), got dtype {a_q.dtype}")
    if a_q.ndim != 2 or qw.q.ndim != 2:
        raise QuantizationError(f"{caller}: expected a[M, K] and {qw.name}[N, K], got "
                                f"{tuple(a_q.shape)} and {tuple(qw.q.shape)}")
    if a_q.shape[1] != qw.q.shape[1]:
        raise QuantizationError(f"{caller}: K mismatch: activations have K = {a_q.shape[1]}, "
                                f"{qw.name!r} has K = {qw.q.shape[1]}")
    if init is not None:
        _check_init(init, (a_q.shape[0], qw.q.shape[0]), caller)
    return a_q


def _check_init(init, shape, caller):
    if not isinstance(init, Accumulator):
        raise QuantizationTypeError(f"{caller}: init: expected None or an Accumulator (a "
                                    f"previous GEMM's result), got {type(init).__name__}")
    acc, ovf = init.acc, init.overflow          # int64 and bool: Accumulator checks them
    if acc.shape != shape or ovf.shape != shape:
        raise QuantizationError(f"{caller}: init: expected an Accumulator of shape [M, N] = "
                                f"{shape}, got acc {tuple(acc.shape)} and overflow "
                                f"{tuple(ovf.shape)}")


def gemm_reference(a_q, qw: QuantizedWeight, mode=Mode.FULL,
                   init: Accumulator | None = None) -> Accumulator:
    """Bit-exact GEMM the slow, obvious way: slice products -> group psums -> scaled,
    saturating accumulation in ascending K. ``a_q`` int8 ``[M, K]``; ``qw`` ``[N, K]``.
    Raises as :func:`check_gemm_operands`."""
    a_q = check_gemm_operands(a_q, qw, mode, init, caller="gemm_reference")
    mdim, k = a_q.shape
    ndim = qw.q.shape[0]
    prods = slice_product(a_q[:, None, :], qw.q[None, :, :], mode)        # [M, N, K]
    psums = prods.reshape(mdim, ndim, k // GROUP, GROUP).sum(axis=-1, dtype=np.int64)
    return accumulate(psums, qw.scale, init)


_FAST_CACHE_ATTR = "_elmoe3d_fast_cache"


def _fast_operand(qw: QuantizedWeight, mode: Mode):
    """Weight-stationary float64 operand ``w_eff * m * 2^shift`` ([K, N]) plus per-row bounds,
    cached on the weight object (the hardware also lays weights out once)."""
    cache = qw.__dict__.setdefault(_FAST_CACHE_ATTR, {})
    if mode in cache:
        return cache[mode]
    w_eff = effective_weight(qw.q, mode).astype(np.float64)                # [N, K]
    m, shift = _mantissa_shift(qw.scale)                                   # [N, G]
    col_scale = np.ldexp(m.astype(np.float64), shift.astype(np.int32))     # exact
    w_scaled = w_eff * np.repeat(col_scale, GROUP, axis=1)                 # exact: <= 2^19 * 2^s
    abs_row = np.abs(w_scaled).sum(axis=1)                                 # ~sum |w| * scale
    live = (m != 0) & (np.abs(w_eff).reshape(*m.shape, GROUP).max(axis=-1) > 0)
    min_shift = np.where(live, shift, 1 << 20).min(axis=1)                 # [N]
    entry = (np.ascontiguousarray(w_scaled.T), abs_row, min_shift)
    cache[mode] = entry
    return entry


def gemm(a_q, qw: QuantizedWeight, mode=Mode.FULL, init: Accumulator | None = None) -> Accumulator:
    """Bit-exact GEMM with fused dequantization: ``acc[m, n] = sum_g psum[m, n, g] * scale[n, g]``
    in Q.24, equal to :func:`gemm_reference` bit for bit.

    Fast path: one float64 BLAS GEMM against the weight-stationary operand
    ``w_eff * scale * 2^24``. Every product and partial sum there is an integer multiple of
    ``2^min_shift`` (the smallest group exponent of the row) bounded by
    ``max|a| * sum_k |w_eff * scale|``; where that bound over ``2^min_shift`` stays below 2^52
    and the bound itself below 2^62, float64 is exact in any summation order and no
    accumulator can saturate, so the result equals the sequential int64 datapath. Output
    channels that fail the check take :func:`gemm_reference`.

    Parameters
    ----------
    a_q : ndarray of int8, shape ``[M, K]``
        (a ``[..., K]`` :func:`~.quant.quantize_activations` result: ``q.reshape(-1, K)``)
    qw : QuantizedWeight, shape ``[N, K]``
    mode : Mode, its integer value or its name (``"FULL"``, ``"draft"``): :func:`parse_mode`
    init : Accumulator, optional
        Carry-in (K tiling).

    Returns
    -------
    Accumulator with ``acc`` int64 ``[M, N]`` and ``overflow`` bool ``[M, N]``.

    Raises
    ------
    QuantizationTypeError, QuantizationError
        Bad operands, named (:func:`check_gemm_operands`): float activations, a wrong
        ``init``, shapes that do not match.
    """
    a_q = check_gemm_operands(a_q, qw, mode, init)
    mode = parse_mode(mode, "gemm")
    mdim = a_q.shape[0]
    ndim = qw.q.shape[0]
    w_scaled, abs_row, min_shift = _fast_operand(qw, mode)
    amax = float(np.abs(a_q.astype(np.int16)).max(initial=0))
    bound = amax * abs_row * (1 + 1e-12)
    if init is not None:
        carry = np.abs(init.acc.astype(np.float64)).max(axis=0) if mdim else 0.0
        bound = bound + carry * (1 + 1e-12)
        carry_flag = init.overflow.any(axis=0)
    else:
        carry_flag = np.zeros(ndim, bool)
    exact = (bound < 2.0 ** 62) & (bound < np.ldexp(1.0, np.minimum(min_shift, 900) + 52)) \
        & ~carry_flag
    with np.errstate(invalid="ignore"):        # inexact columns are recomputed below
        acc = (a_q.astype(np.float64) @ w_scaled).astype(np.int64)
    if init is not None:
        acc = acc + init.acc
    flag = np.zeros((mdim, ndim), bool) if init is None else init.overflow.copy()
    if not exact.all():
        cols = np.flatnonzero(~exact)
        sub = QuantizedWeight(q=qw.q[cols], scale=qw.scale[cols], bits=qw.bits, name=qw.name)
        sub_init = None if init is None else Accumulator(init.acc[:, cols], init.overflow[:, cols])
        slow = gemm_reference(a_q, sub, mode, sub_init)
        acc[:, cols] = slow.acc
        flag[:, cols] = slow.overflow
    return Accumulator(acc, flag)


def acc_to_float(acc, act_exp) -> np.ndarray:
    """Real GEMM output ``acc * 2^(e - 24)`` in float64 (one rounding of acc to 53 bits).

    ``acc`` int64 ``[M, N]`` (an :class:`Accumulator`'s ``acc``); ``act_exp`` int ``[M]``
    per-token activation exponents (:func:`~.quant.quantize_activations`' ``exp``).

    Raises
    ------
    QuantizationTypeError
        ``acc`` is an :class:`Accumulator` (pass its ``.acc``) or not an integer array;
        ``act_exp`` is a :class:`~.quant.QuantizedActivation` (pass its ``.exp``) or not
        integers (a float exponent would be truncated; an empty one, for an ``acc`` of no rows,
        may have any dtype, as ``[]`` does).
    QuantizationError
        ``acc`` is not 2-D, or ``act_exp`` does not hold one exponent per row of ``acc``
        (a wrongly shaped one would broadcast into a wrong result)."""
    if isinstance(acc, Accumulator):
        raise QuantizationTypeError("acc_to_float: acc: expected the int64 array [M, N] of an "
                                    "Accumulator, got the Accumulator (pass its .acc)")
    if isinstance(act_exp, QuantizedActivation):
        raise QuantizationTypeError("acc_to_float: act_exp: expected the int exponents [M] of a "
                                    "QuantizedActivation, got the QuantizedActivation (pass its "
                                    ".exp)")
    acc = _to_array(acc, "acc_to_float: acc", "int64 Q.24 accumulators [M, N]")
    e = _to_array(act_exp, "acc_to_float: act_exp", "integer exponents [M]")
    if not np.issubdtype(acc.dtype, np.integer):
        raise QuantizationTypeError(f"acc_to_float: acc: expected int64 Q.24 accumulators "
                                    f"[M, N], got dtype {acc.dtype}")
    if e.size and not np.issubdtype(e.dtype, np.integer):   # [] is float64: no value to cut
        raise QuantizationTypeError(f"acc_to_float: act_exp: expected integer exponents [M], "
                                    f"got dtype {e.dtype}")
    if acc.ndim != 2:
        raise QuantizationError(f"acc_to_float: acc: expected [M, N] accumulators, got shape "
                                f"{tuple(acc.shape)}")
    if e.shape != (acc.shape[0],):
        raise QuantizationError(f"acc_to_float: act_exp: expected one exponent per row of acc, "
                                f"shape ({acc.shape[0]},), got shape {tuple(e.shape)}")
    if e.size and (e.min() < -(1 << 31) or e.max() >= 1 << 31):
        raise QuantizationError(f"acc_to_float: act_exp: expected int32 exponents, got values "
                                f"in [{e.min()}, {e.max()}]")
    return np.ldexp(acc.astype(np.float64), e.astype(np.int32)[:, None] - ACC_FRAC_BITS)

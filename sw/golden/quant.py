"""Bit-nested INT8 quantization: the golden model of weights, slices, drafts and activations.

This module is the executable definition of docs/numerics.md, items 1, 2 and 6 (paper Section 4.3,
Fig. 8). Plain NumPy; it never imports Amaranth or cocotb.

Weights ``W[..., N, K]`` are quantized symmetrically in groups of ``G = 32`` along K (the last
axis, the input-feature axis of a PyTorch ``Linear`` weight), one FP16 scale per (row, group).
The INT8 code splits exactly into a signed 4-bit MSB slice and an unsigned 4-bit LSB slice,
``q == 16 * msb + lsb``; the MSB slice alone is the draft weight.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import numpy as np

from ...checks import is_int, is_real


__all__ = [
    "GROUP", "QuantizationError", "QuantizationTypeError", "DraftMethod",
    "fp16_scale_for", "QuantizedWeight", "quantize_weights",
    "draft_method", "as_int8_codes", "msb_slice", "lsb_slice", "join_slices", "draft_codes",
    "draft_weights",
    "QuantizedActivation", "quantize_activations", "quantize_activations_fp16",
]

#: Quantization group size along K; also the depth of one adder tree.
GROUP = 32

_FP16_MAX = float(np.finfo(np.float16).max)


class QuantizationError(ValueError):
    """Bad input to the quantizer. The message names the tensor and the position."""


class QuantizationTypeError(QuantizationError, TypeError):
    """An operand of the wrong type or dtype (float codes, an object array, an Accumulator for
    an array). A :class:`QuantizationError` (so the CLI prints it as one line) and a
    ``TypeError`` (what the GEMM operand checks raised before)."""


class DraftMethod(str, enum.Enum):
    """How a k-bit draft weight is derived (paper Fig. 8, Fig. 17c)."""

    #: Keep the top k bits of q, drop the rest: ``(q >> d) << d``. Error in ``[0, 2^d)``.
    TRUNCATE = "truncate"
    #: Round q to the nearest multiple of ``2^d`` (half up), clipped to the k-bit range.
    #: This alters the MSB slice, so it is not bit-nested.
    ROUND = "round"
    #: LSB augmentation: truncate, then add the half-unit ``2^(d-1)`` (the hardwired 1 of the
    #: unit PE's 5-bit field). Bit-nested: the stored MSB slice is unchanged.
    LSB_AUG = "lsb-aug"
    #: A separate k-bit symmetric quantization with its own FP16 group scales.
    DEDICATED = "dedicated"


def draft_method(method, caller: str = "draft") -> DraftMethod:
    """``method`` (a :class:`DraftMethod` or its value, ``"lsb-aug"``, or its name,
    ``"LSB_AUG"``) as a :class:`DraftMethod`. Raises :class:`QuantizationError` naming
    ``caller`` and listing the methods for anything else."""
    if isinstance(method, DraftMethod):
        return method
    if isinstance(method, str):
        for m in DraftMethod:
            if method in (m.value, m.name):
                return m
    names = ", ".join(repr(m.value) for m in DraftMethod)
    raise QuantizationError(f"{caller}: method: expected one of {names}, got {method!r}")


def _position(shape, flat_index):
    """Human-readable (row, column) of a flat index into an array of ``shape``."""
    idx = np.unravel_index(int(flat_index), shape)
    *lead, col = idx
    if len(lead) == 1:
        return f"row {lead[0]}, column {col} (group {col // GROUP})"
    return f"row {tuple(int(i) for i in lead)}, column {col} (group {col // GROUP})"


def _to_array(x, what: str, expected: str) -> np.ndarray:
    """``np.asarray(x)``, or a :class:`QuantizationTypeError` naming ``what`` and ``expected``
    where NumPy cannot make one array of ``x`` (ragged nested lists): the golden API's one
    check of that, so no caller shows NumPy's "inhomogeneous shape" error."""
    try:
        return np.asarray(x)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        dtype = getattr(x, "dtype", None)
        if isinstance(x, (list, tuple)) and x and getattr(x[0], "dtype", None) is not None:
            try:                        # rows of another library's arrays: is one unreadable?
                np.asarray(x[0])
            except (TypeError, ValueError, OverflowError, RuntimeError):
                x, dtype = x[0], x[0].dtype
                what = f"{what}[0]"
        if dtype is not None and not isinstance(x, (list, tuple)):
            # another library's array NumPy cannot read: a torch BF16 tensor (NumPy has no
            # BF16), one that requires grad (torch refuses), a GPU tensor
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise QuantizationTypeError(
                f"{what}: expected {expected}, got a {type(x).__name__} of dtype {dtype} "
                f"NumPy cannot read ({why}); convert it first, e.g. x.detach().cpu().float() "
                f"for a torch tensor (BF16 widens to float32 exactly)") from None
        raise QuantizationTypeError(f"{what}: expected {expected}, got a {type(x).__name__} "
                                    f"NumPy cannot turn into one array (rows of different "
                                    f"lengths?)") from None


def _what_type(x, arr: np.ndarray) -> str:
    """How an error names an operand ``x`` of the wrong type (``arr`` is ``np.asarray(x)``):
    a scalar that is no NumPy value (None, a str, a file name) by its Python type and value,
    anything else by its dtype."""
    if arr.ndim == 0 and not isinstance(x, (np.ndarray, np.generic)):
        return f"a {type(x).__name__} ({x!r:.60})"
    return f"dtype {arr.dtype}"


def fp16_scale_for(amax, qmax: int = 127):
    """Smallest FP16 ``s >= 0`` with ``qmax * float32(s) >= amax``, element-wise.

    This is ``amax / qmax`` rounded *up* to FP16, so no code is clipped by more than rounding,
    including where ``s`` is subnormal (numerics §1). ``amax == 0`` gives ``s == 0``; any
    ``amax > 0`` gives at least the smallest FP16 subnormal, ``2^-24`` (about 5.96e-8), never 0.

    Parameters
    ----------
    amax : array_like of float (or of integers), >= 0, any shape
    qmax : int
        Largest code magnitude (127 for INT8; ``2^(k-1) - 1`` for k bits).

    Returns
    -------
    (scale, ok) : (ndarray of float16, ndarray of bool)
        ``ok`` is False where no finite FP16 scale is large enough (FP16 overflow).

    Raises
    ------
    QuantizationError
        an ``amax`` that is negative or NaN (not a magnitude), or ``qmax`` below 1.
    QuantizationTypeError
        an ``amax`` that is not real numbers (None, a string, complex, bool, ragged lists).
    """
    if not is_int(qmax) or qmax < 1:
        raise QuantizationError(f"fp16_scale_for: qmax: expected a positive integer, got "
                                f"{qmax!r}")
    expected = "real magnitudes (float or integer, >= 0)"
    arr = _to_array(amax, "fp16_scale_for: amax", expected)
    if arr.dtype == object and arr.size and all(is_real(v) for v in arr.flat):
        arr = arr.astype(np.float64)                     # Python ints beyond int64
    if arr.dtype.kind not in "fiu":
        raise QuantizationTypeError(f"fp16_scale_for: amax: expected {expected}, got "
                                    f"{_what_type(amax, arr)}")
    amax = arr.astype(np.float64)
    bad = np.isnan(amax) | (amax < 0)
    if bad.any():
        idx = np.unravel_index(int(np.flatnonzero(bad)[0]), amax.shape)
        where = f" at index {tuple(int(i) for i in idx)}" if amax.ndim else ""
        raise QuantizationError(f"fp16_scale_for: amax: expected magnitudes (>= 0, not NaN), "
                                f"got {amax[idx]}{where}")
    amax = np.abs(amax)                                  # -0.0 -> +0.0: a scale's sign is clear
    with np.errstate(over="ignore"):
        near = (amax / qmax).astype(np.float16)
        down = np.nextafter(near, np.float16(-np.inf))
        up = np.nextafter(near, np.float16(np.inf))

    def fits(s):
        return (s >= 0) & np.isfinite(s) & (qmax * s.astype(np.float64) >= amax)

    scale = np.where(fits(down), down, np.where(fits(near), near, up)).astype(np.float16)
    return scale, fits(scale)


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A group-quantized weight tensor.

    Attributes
    ----------
    q : ndarray of int8, shape ``[..., N, K]``, K a non-zero multiple of 32
        Codes in ``[-2^(bits-1), qmax]`` with ``qmax = 2^(bits-1) - 1``
        (:func:`quantize_weights` gives ``[-qmax, qmax]``; the datapath is exact at
        ``-2^(bits-1)`` too).
    scale : ndarray of float16, shape ``[..., N, K // 32]``
        Group scales, finite and non-negative (the sign bit clear); 0 for an all-zero group
        (:func:`quantize_weights` gives a group of nonzero weights at least ``2^-24``, even
        one whose codes are all 0).
    bits : int
        Code width (8 for the bit-nested INT8 format; 2..7 for a dedicated draft).
    name : str
        Tensor name used in error messages and reports.

    Raises
    ------
    QuantizationError
        ``bits`` outside 2..8; codes that are not integers or lie outside the range above;
        no codes (K = 0); scales of the wrong shape, NaN, Inf or negative (a scale the
        quantizer never makes, which the datapath would read as a number: names the row and
        group).
    QuantizationTypeError
        codes that are not integers (bool included); scales that are not float16; codes or
        scales that are no array (ragged nested lists).
    """

    q: np.ndarray
    scale: np.ndarray
    bits: int = 8
    name: str = "weight"

    def __post_init__(self):
        name = self.name
        if not is_int(self.bits) or not 2 <= self.bits <= 8:
            raise QuantizationError(f"tensor {name!r}: bits must be an integer in 2..8, "
                                    f"got {self.bits!r}")
        lo, hi = -(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1
        q = as_int8_codes(self.q, f"tensor {name!r} codes", lo=lo, hi=hi)
        scale = _to_array(self.scale, f"tensor {name!r} scales",
                          "float16 group scales [..., N, K/32]").copy()
        if scale.dtype != np.float16:
            raise QuantizationTypeError(f"tensor {name!r}: scales must be float16 (FP16 group "
                                    f"scales), got dtype {scale.dtype}")
        if q.ndim < 2 or q.shape[-1] % GROUP or scale.shape != (*q.shape[:-1],
                                                                  q.shape[-1] // GROUP):
            raise QuantizationError(f"tensor {name!r}: codes of shape {tuple(q.shape)} need "
                                    f"scales of shape [..., N, K/{GROUP}], got "
                                    f"{tuple(scale.shape)}")
        if q.shape[-1] == 0:
            raise QuantizationError(f"tensor {name!r}: expected codes of shape [..., N, K] with "
                                    f"K >= {GROUP}, got shape {tuple(q.shape)}")
        bad = (scale.view(np.uint16) >> 10) >= 31               # sign set, or exponent 31
        if bad.any():
            idx = np.unravel_index(int(np.flatnonzero(bad)[0]), scale.shape)
            *row, group = idx
            row = row[0] if len(row) == 1 else tuple(int(i) for i in row)
            raise QuantizationError(f"tensor {name!r}: row {row}, group {group}: scale "
                                    f"{scale[idx]}: expected a finite, non-negative FP16 group "
                                    f"scale")
        q = q.copy()
        q.setflags(write=False)            # the fast GEMM caches a layout of these arrays
        scale.setflags(write=False)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "scale", scale)

    @property
    def shape(self) -> tuple:
        """The codes' shape ``[..., N, K]`` (the float weight's)."""
        return self.q.shape

    def _bit_nested(self, what):
        if self.bits != 8:
            raise QuantizationError(f"tensor {self.name!r}: the {what} slice is of the "
                                    f"bit-nested INT8 format (bits 8), this is a {self.bits}-bit "
                                    f"quantization")

    @property
    def msb(self) -> np.ndarray:
        """Signed 4-bit MSB slice, int8 in ``[-8, 7]``. Raises :class:`QuantizationError`
        unless ``bits == 8`` (the bit-nested format)."""
        self._bit_nested("MSB")
        return msb_slice(self.q)

    @property
    def lsb(self) -> np.ndarray:
        """Unsigned 4-bit LSB slice, uint8 in ``[0, 15]`` (cast before signed arithmetic:
        NumPy 2 keeps ``lsb - 8`` in uint8, which wraps). Raises :class:`QuantizationError`
        unless ``bits == 8``."""
        self._bit_nested("LSB")
        return lsb_slice(self.q)

    def scale_per_column(self) -> np.ndarray:
        """Group scales repeated along K: float32, shape ``[..., N, K]``."""
        return np.repeat(self.scale.astype(np.float32), GROUP, axis=-1)

    def dequantize(self, codes=None) -> np.ndarray:
        """``codes * scale`` in float64, shape ``[..., N, K]`` (``codes`` defaults to ``q``;
        pass draft codes on the same grid, :func:`draft_codes`, to dequantize a draft).
        Raises :class:`QuantizationError` for ``codes`` that are not integers in
        ``[-128, 127]`` (every draft code is) or not of shape ``q.shape``."""
        if codes is None:
            codes = self.q
        else:
            codes = as_int8_codes(codes, f"tensor {self.name!r}: dequantize: codes")
            if codes.shape != self.q.shape:
                raise QuantizationError(f"tensor {self.name!r}: dequantize: expected codes of "
                                        f"shape {tuple(self.q.shape)}, got "
                                        f"{tuple(codes.shape)}")
        return codes.astype(np.float64) * self.scale_per_column().astype(np.float64)


def quantize_weights(w, *, bits: int = 8, name: str = "weight") -> QuantizedWeight:
    """Symmetric group quantization of ``w`` with FP16 scales (numerics §1).

    ``s`` = the smallest FP16 with ``qmax * float32(s) >= max|W|`` over the group, then
    ``q = clip(rint(W / float32(s)), -qmax, qmax)`` computed in float32 (round half to even).

    Small groups: an all-zero group (``-0.0`` included) has ``s = 0`` and ``q = 0``. Any other
    group has ``s >= 2^-24`` (about 5.96e-8, the smallest FP16 subnormal, the format's
    resolution): a group with ``max|W| <= qmax * 2^-24`` gets exactly that scale, so its
    codes step by ``2^-24`` and reach only ``rint(max|W| * 2^24)``; one with ``0 < max|W|
    <= 2^-25`` (about 2.98e-8, half the smallest scale) is stored as ``q = 0`` everywhere with
    the non-zero scale ``2^-24``: its weights are lost, without an error or a warning (the
    format cannot hold them). Find such groups as ``(W != 0).any(-1) & (q == 0).all(-1)``
    over the groups (``reshape(..., K // 32, 32)``); ``elmoe3d quant`` counts them per
    tensor (a ``note:`` line, ``zero_groups`` in its JSON).

    Parameters
    ----------
    w : array_like of float (or of integers), shape ``[..., N, K]`` with ``K % 32 == 0``
        Weights; converted to float32 first (float16, bfloat16-decoded and float32 are exact).
        An integer array is taken as its values: raw bfloat16 bits held as ``uint16`` (NumPy
        has no bfloat16) must be decoded first, ``(u16.astype(np.uint32) << 16).view(
        np.float32)``, as the weight-file readers do.
    bits : int
        Code width, 2..8. 8 is the bit-nested format; 2..7 is a dedicated k-bit quantization.
    name : str
        Tensor name for error messages.

    Returns
    -------
    QuantizedWeight
        ``q`` int8 ``[..., N, K]`` in ``[-qmax, qmax]``, ``scale`` float16 ``[..., N, K/32]``.

    Raises
    ------
    QuantizationError
        ``w`` has fewer than 2 dimensions or no element; K is not divisible by 32; a weight is
        NaN or Inf; a group needs a scale above the FP16 maximum (65504). The message names
        the tensor, the row and the group.
    QuantizationTypeError
        ``w`` is no float or integer array: a str (a file name: read the tensor first), None,
        ragged nested lists, a bool, complex or object array, a masked array; ``name`` not a
        str. Named with what was found.
    """
    if not isinstance(name, str):
        raise QuantizationTypeError(f"quantize_weights: name: expected the tensor's name (a "
                                    f"str), got {type(name).__name__}")
    if not is_int(bits) or not 2 <= bits <= 8:
        raise QuantizationError(f"tensor {name!r}: bits must be an integer in 2..8, got {bits!r}")
    if isinstance(w, np.ma.MaskedArray):
        raise QuantizationTypeError(f"tensor {name!r}: a masked array (its masked values would "
                                    f"be quantized as they are); fill or drop them first, e.g. "
                                    f"w.filled(0)")
    expected = "a float (or integer) weight array of shape [..., N, K]"
    arr = _to_array(w, f"tensor {name!r}", expected)
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        hint = (" (a file name? read the tensor first)"
                if isinstance(w, (str, bytes, os.PathLike)) else "")
        raise QuantizationTypeError(f"tensor {name!r}: expected {expected}, got "
                                    f"{_what_type(w, arr)}{hint}")
    w = arr
    if w.ndim < 2:
        raise QuantizationError(f"tensor {name!r}: expected a weight of shape [..., N, K], "
                                f"got shape {tuple(w.shape)}")
    k = w.shape[-1]
    if w.size == 0:
        raise QuantizationError(f"tensor {name!r}: expected a non-empty weight, got shape "
                                f"{tuple(w.shape)}")
    if k % GROUP:
        raise QuantizationError(f"tensor {name!r}: K = {k} (last axis of shape "
                                f"{tuple(w.shape)}) is not divisible by the group size {GROUP}")
    with np.errstate(over="ignore", invalid="ignore"):
        w32 = w.astype(np.float32)
    bad = ~np.isfinite(w32)
    if bad.any():
        flat = int(np.flatnonzero(bad)[0])
        value = w.reshape(-1)[flat]
        what = (f"non-finite weight {value}" if not np.isfinite(value)
                else f"weight {value} beyond the float32 range")
        raise QuantizationError(f"tensor {name!r}: {what} at {_position(w.shape, flat)}")
    qmax = (1 << (bits - 1)) - 1
    grouped = w32.reshape(*w.shape[:-1], k // GROUP, GROUP)
    amax = np.abs(grouped).max(axis=-1)
    scale, ok = fp16_scale_for(amax, qmax)
    if not ok.all():
        flat = int(np.flatnonzero(~ok)[0])
        idx = np.unravel_index(flat, amax.shape)
        *row, group = idx
        row = row[0] if len(row) == 1 else tuple(int(i) for i in row)
        raise QuantizationError(
            f"tensor {name!r}: row {row}, group {group}: max|W| = {float(amax[idx]):.6g} needs "
            f"an FP16 scale above {_FP16_MAX:g} (FP16 overflow)")
    s32 = scale.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(s32 > 0, grouped / np.where(s32 > 0, s32, 1), 0).astype(np.float32)
    q = np.clip(np.rint(ratio), -qmax, qmax).astype(np.int8).reshape(w.shape)
    return QuantizedWeight(q=q, scale=scale, bits=bits, name=name)


def as_int8_codes(q, what: str = "codes", *, lo: int = -128, hi: int = 127) -> np.ndarray:
    """``q`` as an int8 array, refusing anything that would wrap silently.

    Raises :class:`QuantizationTypeError` naming ``what`` for a dtype that is not an integer
    one (floats would truncate; bool is a mask, not codes) or ragged nested lists, and
    :class:`QuantizationError` for a value outside ``[lo, hi]`` (so ``astype(int8)`` of 128
    never becomes -128), with its index."""
    q = _to_array(q, what, "integer codes")
    if not np.issubdtype(q.dtype, np.integer):
        raise QuantizationTypeError(f"{what}: expected integer codes, got dtype {q.dtype}")
    if q.size and (q.min() < lo or q.max() > hi):
        bad = np.unravel_index(int(np.flatnonzero((q < lo) | (q > hi))[0]), q.shape)
        where = f" at index {tuple(int(i) for i in bad)}" if q.ndim else ""
        raise QuantizationError(f"{what}: value {q[bad]}{where} is outside [{lo}, {hi}]")
    return q if q.dtype == np.int8 else q.astype(np.int8)


def msb_slice(q) -> np.ndarray:
    """``q >> 4``, arithmetic (floor): int8 in ``[-8, 7]`` for every int8 including -128, same
    shape. Raises :class:`QuantizationError` naming ``msb_slice: q`` for codes that are not
    int8 values (:func:`as_int8_codes`)."""
    return _msb(as_int8_codes(q, "msb_slice: q"))


def lsb_slice(q) -> np.ndarray:
    """``q & 15``: uint8 in ``[0, 15]``, same shape. Raises as :func:`msb_slice`."""
    return _lsb(as_int8_codes(q, "lsb_slice: q"))


def _msb(q):
    """:func:`msb_slice` of an int8 array."""
    return np.right_shift(q, 4)


def _lsb(q):
    """:func:`lsb_slice` of an int8 array."""
    return (q.view(np.uint8) & 15).astype(np.uint8)


def join_slices(msb, lsb) -> np.ndarray:
    """``16 * msb + lsb`` as int8 (exact inverse of the two slices), of the two operands'
    broadcast shape. Raises :class:`QuantizationError` for an MSB outside ``[-8, 7]`` or an
    LSB outside ``[0, 15]`` (integers only), which would wrap silently, and for shapes that
    do not broadcast together."""
    msb = as_int8_codes(msb, "join_slices: msb (MSB slice)", lo=-8, hi=7)
    lsb = as_int8_codes(lsb, "join_slices: lsb (LSB slice)", lo=0, hi=15)
    try:
        np.broadcast_shapes(msb.shape, lsb.shape)
    except ValueError:
        raise QuantizationError(f"join_slices: msb and lsb: expected slices of one shape (or "
                                f"shapes that broadcast), got {tuple(msb.shape)} and "
                                f"{tuple(lsb.shape)}") from None
    return (msb.astype(np.int16) * 16 + lsb.astype(np.int16)).astype(np.int8)


def draft_codes(q, bits: int, method) -> np.ndarray:
    """k-bit draft codes derived from INT8 codes, on the INT8 grid (int16, same shape as q).

    Parameters
    ----------
    q : array_like of int8
    bits : int
        k in 2..7 (k = 4 is the MSB slice the hardware stores apart).
    method : DraftMethod or str
        TRUNCATE, ROUND or LSB_AUG. DEDICATED needs the float weights: use
        :func:`draft_weights`.

    With ``d = 8 - k``: TRUNCATE gives ``(q >> d) << d``; LSB_AUG gives that plus ``2^(d-1)``
    (at k = 4: ``16 * msb + 8``, the unit PE's DRAFT mode); ROUND gives
    ``clip((q + 2^(d-1)) >> d, -2^(k-1), 2^(k-1) - 1) << d``. Every result lies in
    ``[-128, 127]``.

    Raises
    ------
    QuantizationError
        an unknown ``method`` or DEDICATED; ``bits`` outside 2..7; codes outside int8.
    QuantizationTypeError
        codes that are not integers.
    """
    method = draft_method(method, "draft_codes")
    if not is_int(bits) or not 2 <= bits <= 7:
        raise QuantizationError(f"draft_codes: bits: expected an integer in 2..7 (draft "
                                f"bits), got {bits!r}")
    d = 8 - int(bits)
    q16 = as_int8_codes(q, "draft_codes: q").astype(np.int16)
    if method is DraftMethod.TRUNCATE:
        return (q16 >> d) << d
    if method is DraftMethod.LSB_AUG:
        return ((q16 >> d) << d) + (1 << (d - 1))
    if method is DraftMethod.ROUND:
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        return np.clip((q16 + (1 << (d - 1))) >> d, lo, hi) << d
    raise QuantizationError(f"draft_codes: method {method.value!r} is not derived from INT8 "
                            f"codes; use draft_weights()")


def draft_weights(w, qw: QuantizedWeight, bits: int, method) -> np.ndarray:
    """Dequantized k-bit draft weights (float64, shape of ``w``) for accuracy experiments.

    ``qw`` is the quantization of ``w`` (INT8 for TRUNCATE, ROUND and LSB_AUG); DEDICATED
    re-quantizes ``w`` at ``bits`` (2..8) with its own scales, the other methods derive codes
    (2..7 bits) from ``qw.q`` and use ``qw.scale``. ``w`` is checked to be the weight ``qw``
    quantizes: :func:`quantize_weights` of it at ``qw.bits`` gives ``qw``'s codes and scales
    exactly (a draft measured against another ``w`` would give a wrong error silently; this
    costs one quantization of ``w``).

    Raises
    ------
    QuantizationError
        ``w``'s shape is not ``qw``'s, or ``w`` is not the weight ``qw`` quantizes (the first
        row and group that differ named); ``bits`` out of range; an unknown ``method``;
        TRUNCATE, ROUND or LSB_AUG on a ``qw`` that is not INT8 (its codes are not on the grid
        the draft codes cut); as :func:`quantize_weights` for ``w`` (a NaN, ...).
    QuantizationTypeError
        ``qw`` is no :class:`QuantizedWeight`; as :func:`quantize_weights` for ``w``.
    """
    method = draft_method(method, "draft_weights")
    if not isinstance(qw, QuantizedWeight):
        raise QuantizationTypeError(f"draft_weights: qw: expected a QuantizedWeight "
                                    f"(quantize_weights(w)), got {type(qw).__name__}")
    top = 8 if method is DraftMethod.DEDICATED else 7
    if not is_int(bits) or not 2 <= bits <= top:
        raise QuantizationError(f"draft_weights: bits: expected an integer in 2..{top} for "
                                f"{method.value!r} (draft bits), got {bits!r}")
    if method is not DraftMethod.DEDICATED and qw.bits != 8:
        raise QuantizationError(f"draft_weights: method {method.value!r} cuts INT8 codes; "
                                f"tensor {qw.name!r} has {qw.bits}-bit codes (quantize w at "
                                f"bits=8, or use 'dedicated')")
    if np.shape(w) != qw.shape:
        raise QuantizationError(f"draft_weights: w has shape {tuple(np.shape(w))}, but qw "
                                f"(tensor {qw.name!r}) is the quantization of a {tuple(qw.shape)} "
                                f"weight")
    again = quantize_weights(w, bits=qw.bits, name=qw.name)
    codes = (again.q != qw.q).reshape(*qw.scale.shape, GROUP).any(-1)
    differ = codes | (again.scale.view(np.uint16) != qw.scale.view(np.uint16))
    if differ.any():
        *row, group = np.unravel_index(int(np.flatnonzero(differ)[0]), differ.shape)
        row = int(row[0]) if len(row) == 1 else tuple(int(i) for i in row)
        raise QuantizationError(f"draft_weights: w is not the weight qw (tensor {qw.name!r}) "
                                f"quantizes: {int(differ.sum())} of {differ.size} groups differ, "
                                f"first row {row}, group {group}")
    if method is DraftMethod.DEDICATED:
        return quantize_weights(w, bits=bits, name=qw.name).dequantize()
    return qw.dequantize(draft_codes(qw.q, bits, method))


@dataclass(frozen=True, eq=False)
class QuantizedActivation:
    """Per-token INT8 activations with power-of-two scales (numerics §6).

    Attributes
    ----------
    q : ndarray of int8, shape ``[..., K]``
    exp : ndarray of int32, shape ``[...]``
        Scale exponent e: the real value is ``q * 2^e``.

    Raises
    ------
    QuantizationTypeError
        ``q`` or ``exp`` not integers (a float would truncate) or ragged nested lists.
    QuantizationError
        ``q`` a scalar or outside int8; ``exp`` not of shape ``q.shape[:-1]`` or outside int32.
    """

    q: np.ndarray
    exp: np.ndarray

    def __post_init__(self):
        q = as_int8_codes(self.q, "QuantizedActivation: q")
        exp = _to_array(self.exp, "QuantizedActivation: exp", "integer exponents [...]")
        if not np.issubdtype(exp.dtype, np.integer):
            raise QuantizationTypeError(f"QuantizedActivation: exp: expected integer "
                                        f"exponents, got dtype {exp.dtype}")
        if q.ndim < 1 or exp.shape != q.shape[:-1]:
            raise QuantizationError(f"QuantizedActivation: expected q [..., K] and exp [...], "
                                    f"got shapes {tuple(q.shape)} and {tuple(exp.shape)}")
        if exp.size and (exp.min() < -(1 << 31) or exp.max() >= 1 << 31):
            raise QuantizationError(f"QuantizedActivation: exp: expected int32 exponents, got "
                                    f"values in [{exp.min()}, {exp.max()}]")
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "exp", exp.astype(np.int32, copy=False))

    def dequantize(self) -> np.ndarray:
        """``q * 2^exp`` in float64, shape ``[..., K]``: ``np.ldexp``, exact wherever that
        value is a float64, i.e. ``|q * 2^exp| < 2^1024`` and ``q * 2^exp`` a multiple of
        ``2^-1074``. That holds for every code :func:`quantize_activations` makes from finite
        ``x`` except a token with ``max|x| >= 2^1024 - 2^1017`` (about 1.7837e308, within 0.8%
        of float64's maximum), whose largest code, 64 at ``exp = 1018``, gives ``+-inf``. An
        ``exp`` given by hand can do worse (``exp = 2000`` gives ``+-inf``, ``exp = -1100``
        rounds to 0; NumPy warns of the overflow): the integers ``q`` and ``exp`` are the
        exact form."""
        return np.ldexp(self.q.astype(np.float64), self.exp[..., None].astype(np.int32))


def _activation_array(x, name):
    """``x`` as a float64 array of shape ``[..., K]`` with K >= 1 (``x`` itself if it is one,
    not a copy: the callers only read it), or a :class:`QuantizationError` naming the
    activation: strings, object and complex arrays are refused rather than converted (a string
    array of numerals would otherwise pass)."""
    if isinstance(x, QuantizedActivation):
        raise QuantizationTypeError(f"activation {name!r}: expected real values [..., K], got a "
                                    f"QuantizedActivation (already quantized)")
    arr = _to_array(x, f"activation {name!r}", "a float or integer array of shape [..., K]")
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise QuantizationTypeError(f"activation {name!r}: expected a float or integer array of "
                                    f"shape [..., K], got dtype {arr.dtype}")
    if arr.ndim < 1:
        raise QuantizationError(f"activation {name!r}: expected shape [..., K], got a scalar")
    if arr.shape[-1] == 0:
        raise QuantizationError(f"activation {name!r}: expected at least one feature (K >= 1), "
                                f"got shape {tuple(arr.shape)}")
    return arr.astype(np.float64, copy=False)      # float64 as it is: never written here


def _check_finite_tokens(x, name):
    bad = ~np.isfinite(x)
    if bad.any():
        flat = int(np.flatnonzero(bad)[0])
        idx = np.unravel_index(flat, x.shape)
        raise QuantizationError(f"activation {name!r}: non-finite value {x[idx]} at token "
                                f"{tuple(int(i) for i in idx[:-1])}, feature {idx[-1]}")


def quantize_activations(x, *, name: str = "activation") -> QuantizedActivation:
    """Per-token INT8 quantization with a power-of-two scale.

    ``e`` is the smallest integer with ``max|x| * 2^-e <= 127``, found exactly from
    ``frexp`` (not a floating log2); ``q = clip(rint(x * 2^-e), -127, 127)`` (round half to
    even). An all-zero token has ``e = 0``. A token is the last axis: ``x`` may have any
    number of leading axes (a 1-D ``x`` is one token, a ``[B, T, K]`` batch gives ``exp``
    ``[B, T]``); :func:`~.datapath.gemm` and the PE programs take ``[M, K]`` codes, so pass
    them ``q.reshape(-1, K)`` (with ``exp.reshape(-1)``), or ``x[None]`` for one token.

    Parameters
    ----------
    x : array_like of float (or of integers), shape ``[..., K]`` with K >= 1

    Returns
    -------
    QuantizedActivation
        ``q`` int8 ``[..., K]`` in ``[-127, 127]``, ``exp`` int32 ``[...]`` (``x``'s leading
        shape).

    Raises
    ------
    QuantizationError
        NaN or Inf in ``x`` (names the token and feature); a scalar or K = 0.
    QuantizationTypeError
        ``x`` is not a float or integer array (strings, an object or complex array, ragged
        lists, a :class:`QuantizedActivation`): named with the dtype found.
    """
    x = _activation_array(x, name)
    _check_finite_tokens(x, name)
    amax = np.abs(x).max(axis=-1)
    mant, e2 = np.frexp(amax)                 # amax = mant * 2^e2, mant in [0.5, 1)
    exp = np.where(np.ldexp(mant, 7) <= 127, e2 - 7, e2 - 6)
    exp = np.where(amax == 0, 0, exp).astype(np.int32)
    q = np.clip(np.rint(np.ldexp(x, -exp[..., None])), -127, 127).astype(np.int8)
    return QuantizedActivation(q=q, exp=exp)


def quantize_activations_fp16(x, *, name: str = "activation"):
    """Per-token INT8 with an FP16 scale (for comparison with power-of-two scales only).

    Returns ``(q int8 [..., K], scale float16 [...])``; the real value is ``q * scale``, with
    ``scale`` the smallest FP16 with ``127 * scale >= max|x|`` (:func:`fp16_scale_for`) and
    ``q = clip(rint(x / scale), -127, 127)`` in float64. An all-zero token has ``scale = 0``
    and ``q = 0``; any other token has ``scale >= 2^-24`` (about 5.96e-8, the smallest FP16
    subnormal): one with ``0 < max|x| <= 2^-25`` (about 2.98e-8) gets ``q = 0`` everywhere
    and the non-zero scale ``2^-24``, without an error: the values are below the FP16 scale's
    resolution (find such tokens as ``(x != 0).any(-1) & (q == 0).all(-1)``). Raises as
    :func:`quantize_activations`, and :class:`QuantizationError` for a token whose
    ``max|x|`` exceeds ``127 * 65504`` (FP16 scale overflow).
    """
    x = _activation_array(x, name)
    _check_finite_tokens(x, name)
    amax = np.abs(x).max(axis=-1)
    scale, ok = fp16_scale_for(amax, 127)
    if not ok.all():
        raise QuantizationError(f"activation {name!r}: a token's max|x| exceeds "
                                f"127 * {_FP16_MAX:g} (FP16 scale overflow)")
    s = scale.astype(np.float64)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.rint(x / np.where(s > 0, s, 1)), 0)
    return np.clip(q, -127, 127).astype(np.int8), scale

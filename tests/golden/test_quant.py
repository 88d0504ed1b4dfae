"""Golden model: weight and activation quantization, slices, drafts (numerics §1, 3.2, 3.6)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from elmoe3d.sw.golden.quant import (
    DraftMethod, QuantizationError, QuantizationTypeError, draft_codes, draft_weights,
    fp16_scale_for, join_slices, lsb_slice, msb_slice, quantize_activations,
    quantize_activations_fp16, quantize_weights,
)

ALL_INT8 = np.arange(-128, 128).astype(np.int8)
FP16_ALL = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16)   # every finite fp16 >= 0


# --- slices -------------------------------------------------------------------------------------

def test_slices_join_back_for_every_int8():
    msb, lsb = msb_slice(ALL_INT8), lsb_slice(ALL_INT8)
    assert msb.min() == -8 and msb.max() == 7
    assert lsb.min() == 0 and lsb.max() == 15
    assert np.array_equal(16 * msb.astype(np.int32) + lsb, ALL_INT8.astype(np.int32))
    assert np.array_equal(join_slices(msb, lsb), ALL_INT8)


def test_msb_slice_is_floor_not_truncation_toward_zero():
    # -5 >> 4 must be -1 (floor), not 0; -128 >> 4 is -8.
    assert msb_slice(np.int8(-5)) == -1
    assert msb_slice(np.int8(-128)) == -8
    assert lsb_slice(np.int8(-5)) == 11          # -5 = 16*(-1) + 11


# --- scale rule ---------------------------------------------------------------------------------

def test_scale_is_smallest_fp16_that_covers_amax():
    # Exhaustive over the fp16 grid: for amax at, just below and just above 127*s.
    s = FP16_ALL[1:-1]
    for amax in (127.0 * s.astype(np.float64),
                 np.nextafter(127.0 * s.astype(np.float64), 0),
                 np.nextafter(127.0 * s.astype(np.float64), np.inf)):
        scale, ok = fp16_scale_for(amax)
        assert ok.all()
        assert (127.0 * scale.astype(np.float64) >= amax).all()
        below = np.nextafter(scale, np.float16(0))
        smaller_fits = (below < scale) & (127.0 * below.astype(np.float64) >= amax)
        assert not smaller_fits.any()


def test_scale_overflow_is_reported():
    scale, ok = fp16_scale_for(np.array([127.0 * 65504, 127.0 * 65504 * 1.0001]))
    assert ok.tolist() == [True, False]
    w = np.zeros((3, 64), np.float32)
    w[2, 40] = 1e8
    with pytest.raises(QuantizationError, match=r"'up'.*row 2, group 1.*FP16"):
        quantize_weights(w, name="up")


def test_zero_group_has_zero_scale_and_codes():
    w = np.zeros((2, 64), np.float32)
    w[1, 33] = 0.5
    qw = quantize_weights(w)
    assert qw.scale[0, 0] == 0 and qw.scale[0, 1] == 0 and qw.scale[1, 0] == 0
    assert not qw.q[0].any() and not qw.q[1, :32].any()
    assert qw.q[1, 33] == 127


def test_subnormal_scale_never_clips_beyond_rounding():
    tiny = np.float32(3e-6)                        # /127 is below fp16's normal range
    w = np.full((1, 32), tiny, np.float32)
    w[0, ::2] *= -0.37
    qw = quantize_weights(w)
    s = qw.scale[0, 0]
    assert 0 < s < np.finfo(np.float16).tiny        # subnormal
    assert np.abs(qw.q).max() <= 127
    err = np.abs(qw.dequantize() - w.astype(np.float64))
    assert err.max() <= 0.5 * float(s) * (1 + 1e-6)


@pytest.mark.parametrize("bad, where", [(np.nan, "row 1, column 37 \\(group 1\\)"),
                                        (np.inf, "row 1, column 37 \\(group 1\\)")])
def test_non_finite_weights_are_named(bad, where):
    w = np.ones((2, 64), np.float32)
    w[1, 37] = bad
    with pytest.raises(QuantizationError, match=f"'gate'.*{where}"):
        quantize_weights(w, name="gate")


def test_k_not_divisible_by_group():
    with pytest.raises(QuantizationError, match=r"'down'.*K = 100.*group size 32"):
        quantize_weights(np.ones((4, 100), np.float32), name="down")


def test_float64_beyond_float32_range_is_an_error_not_inf():
    w = np.ones((1, 32))
    w[0, 3] = 1e300
    # it read "beyond the float32 range weight 1e+300"
    with pytest.raises(QuantizationError, match=r": weight 1e\+300 beyond the float32 range at "
                                                 r"row 0, column 3 \(group 0\)$"):
        quantize_weights(w)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 4), st.sampled_from([32, 64, 96])),
                  elements=st.floats(-1e4, 1e4, width=32)))
def test_weight_codes_in_range_and_error_bounded(w):
    qw = quantize_weights(w)
    assert qw.q.dtype == np.int8 and np.abs(qw.q.astype(int)).max(initial=0) <= 127
    s = qw.scale_per_column().astype(np.float64)
    err = np.abs(qw.dequantize() - w.astype(np.float64))
    # Half a step of rounding, plus float32 division rounding.
    assert (err <= 0.5 * s * (1 + 1e-6) + 1e-30).all()
    # With a normal scale the largest |w| of a group maps to 126 or 127 (no wasted range); a
    # subnormal scale sits on a coarser grid, so only the error bound above applies there.
    g = np.abs(qw.q.astype(int)).reshape(*qw.q.shape[:-1], -1, 32).max(axis=-1)
    assert ((g >= 126) | (qw.scale < np.finfo(np.float16).tiny)).all()


# --- drafts -------------------------------------------------------------------------------------

def test_draft_codes_at_four_bits():
    q = ALL_INT8
    msb = msb_slice(q).astype(np.int16)
    assert np.array_equal(draft_codes(q, 4, "truncate"), 16 * msb)
    assert np.array_equal(draft_codes(q, 4, "lsb-aug"), 16 * msb + 8)
    rounded = draft_codes(q, 4, DraftMethod.ROUND)
    assert rounded.min() == -128 and rounded.max() == 112           # clipped to 4-bit range
    assert (np.abs(rounded - q) <= 16).all()
    # ties round up (towards +inf), as numerics 3.2 defines ROUND: 8 -> 16, -8 -> 0, 24 -> 32
    # (a tie rounded down passed the bounds above; a test audit's mutation)
    assert draft_codes(np.int8([8, -8, 24, -24]), 4, "round").tolist() == [16, 0, 32, -16]


@pytest.mark.parametrize("bits", range(2, 8))
def test_round_draft_equals_round_half_up_of_every_code(bits):
    """ROUND against an independent reference, every INT8 code: ``floor(q / 2^d + 1/2)``
    clipped to the k-bit range, times ``2^d``."""
    import math
    d = 8 - bits
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    want = [min(hi, max(lo, math.floor(int(q) / 2 ** d + 0.5))) << d for q in ALL_INT8]
    assert draft_codes(ALL_INT8, bits, "round").tolist() == want


@pytest.mark.parametrize("bits", range(2, 8))
def test_draft_error_ranges(bits):
    q = ALL_INT8.astype(np.int16)
    d = 8 - bits
    trunc = q - draft_codes(q.astype(np.int8), bits, "truncate")
    aug = q - draft_codes(q.astype(np.int8), bits, "lsb-aug")
    assert trunc.min() == 0 and trunc.max() == (1 << d) - 1               # clipping error
    assert aug.min() == -(1 << (d - 1)) and aug.max() == (1 << (d - 1)) - 1   # rounding error


def test_lsb_augmentation_beats_truncation_on_gaussian_weights():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    qw = quantize_weights(w)
    mse = {m: np.mean((draft_weights(w, qw, 4, m) - w) ** 2) for m in DraftMethod}
    assert mse[DraftMethod.LSB_AUG] < 0.5 * mse[DraftMethod.TRUNCATE]
    assert mse[DraftMethod.DEDICATED] < mse[DraftMethod.TRUNCATE]


def test_dedicated_draft_uses_its_own_scale():
    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    q4 = quantize_weights(w, bits=4)
    assert np.abs(q4.q).max() == 7
    assert np.all(7 * q4.scale.astype(np.float64) >= np.abs(w).reshape(1, 2, 32).max(-1))


def test_bad_draft_bits():
    with pytest.raises(QuantizationError, match="2..7"):
        draft_codes(ALL_INT8, 8, "truncate")
    with pytest.raises(ValueError):
        draft_codes(ALL_INT8, 4, "nearest")


# --- activations --------------------------------------------------------------------------------

def test_activation_exponent_is_exact_at_boundaries():
    # max|x| exactly 127 * 2^e is representable at e; a hair above needs e + 1.
    for e in (-30, -7, 0, 3, 20):
        x = np.array([[np.ldexp(127.0, e), np.ldexp(-1.0, e)]])
        assert quantize_activations(x).exp[0] == e
        x = np.array([[np.nextafter(np.ldexp(127.0, e), np.inf), 0.0]])
        assert quantize_activations(x).exp[0] == e + 1
        x = np.array([[np.ldexp(64.0, e)]])           # 64*2^e: e-1 would give 128 > 127
        assert quantize_activations(x).exp[0] == e


@settings(max_examples=80, deadline=None)
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 70)),
                  elements=st.floats(-1e30, 1e30) | st.floats(-1e-30, 1e-30)))
def test_activation_exponent_is_smallest(x):
    qa = quantize_activations(x)
    amax = np.abs(x).max(axis=-1)
    e = qa.exp.astype(np.int64)
    nz = amax > 0
    assert (np.ldexp(amax, -e) <= 127).all()
    assert (np.ldexp(amax[nz], -(e[nz] - 1)) > 127).all()
    assert (qa.exp[~nz] == 0).all()
    assert np.array_equal(qa.q, np.rint(np.ldexp(x, -e[:, None])).astype(np.int8))


def test_activation_rounding_is_half_even_and_zero_token():
    x = np.array([[127.0, 2.5, -2.5, 3.5, 0.5], [0.0] * 5])
    qa = quantize_activations(x)
    assert qa.q[0].tolist() == [127, 2, -2, 4, 0]
    assert qa.exp.tolist() == [0, 0] and not qa.q[1].any()


def test_activation_non_finite_named():
    x = np.zeros((3, 8))
    x[2, 5] = np.nan
    with pytest.raises(QuantizationError, match=r"'h'.*token \(2,\), feature 5"):
        quantize_activations(x, name="h")


def test_fp16_activation_scale_variant_is_no_worse_than_pow2():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 384)) * rng.uniform(0.1, 10, (64, 1))
    qa = quantize_activations(x)
    q16, s16 = quantize_activations_fp16(x)
    err_pow2 = np.mean((qa.dequantize() - x) ** 2)
    err_fp16 = np.mean((q16 * s16.astype(np.float64)[:, None] - x) ** 2)
    assert err_fp16 <= err_pow2
    assert np.abs(q16.astype(int)).max() <= 127


def test_bad_api_inputs_are_refused_by_name():
    """A new-user trial (2026-12-03) found these passed silently or crashed in NumPy: an
    out-of-range slice joined into a wrapped code, a draft of a differently shaped weight, an
    empty weight (crashed later in gemm), and the MSB/LSB slices of a 4-bit quantization."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    qw = quantize_weights(w, name="up")
    with pytest.raises(QuantizationError, match=r"join_slices: msb \(MSB slice\): value 9 .* "
                                                r"outside \[-8, 7\]"):
        join_slices(np.array([9]), np.array([0]))
    with pytest.raises(QuantizationError, match=r"join_slices: lsb \(LSB slice\): value 20 .* "
                                                r"outside \[0, 15\]"):
        join_slices(np.array([0]), np.array([20]))
    with pytest.raises(QuantizationError, match=r"w has shape \(32, 64\), but qw \(tensor 'up'\)"):
        draft_weights(w[:32, :64], qw, 4, "lsb-aug")
    with pytest.raises(QuantizationError, match=r"'e': expected a non-empty weight, got shape "
                                                r"\(64, 0\)"):
        quantize_weights(np.zeros((64, 0)), name="e")
    q4 = quantize_weights(w, bits=4, name="d")
    for attr in ("msb", "lsb"):
        with pytest.raises(QuantizationError, match=r"'d': the .* 4-bit quantization"):
            getattr(q4, attr)
    # the good paths stay exact
    assert np.array_equal(join_slices(qw.msb, qw.lsb), qw.q)
    assert draft_weights(w, qw, 4, "lsb-aug").shape == w.shape


def test_activations_of_the_wrong_type_are_refused_by_name():
    """A new-user trial (2026-12-04): strings were converted (a numeral string array passed) or
    crashed in NumPy, object and complex arrays were cast silently (complex lost its imaginary
    part, None became a NaN "value"), K = 0 crashed in a NumPy reduction."""
    from elmoe3d.sw.golden.quant import QuantizationTypeError, QuantizedActivation
    dtype_error = r"activation 'x': expected a float or integer array of shape \[\.\.\., K\], got dtype "
    for bad, dtype in ((["a", "b"], "<U1"), (np.array([["1", "2"]]), "<U1"),
                       (np.array([[1.0, 2.0]], dtype=object), "object"),
                       (np.array([[1, None]], dtype=object), "object"),
                       (np.array([[1 + 2j]]), "complex128"), (np.array([[True]]), "bool")):
        for fn in (quantize_activations, quantize_activations_fp16):
            with pytest.raises(QuantizationTypeError, match=dtype_error + dtype + "$"):
                fn(bad, name="x")
    with pytest.raises(QuantizationError, match=r"'x': .* cannot turn into one array"):
        quantize_activations([[1.0, 2.0], [3.0]], name="x")
    qa = quantize_activations(np.ones((2, 32)), name="x")
    assert isinstance(qa, QuantizedActivation)
    with pytest.raises(QuantizationError, match=r"'x': expected real values .* got a "
                                                r"QuantizedActivation"):
        quantize_activations(qa, name="x")
    with pytest.raises(QuantizationError, match=r"'x': expected at least one feature \(K >= 1\), "
                                                r"got shape \(2, 0\)"):
        quantize_activations(np.zeros((2, 0)), name="x")
    with pytest.raises(QuantizationError, match=r"'x': expected shape \[\.\.\., K\], got a scalar"):
        quantize_activations_fp16(1.0, name="x")
    # integer and float inputs stay accepted
    assert np.array_equal(quantize_activations(np.arange(32).reshape(1, 32)).q,
                          quantize_activations(np.arange(32.0).reshape(1, 32)).q)


def test_activations_of_float64_are_not_copied():
    """The operand checks (strings, object, ragged, ...) ended in ``astype(np.float64)``, which
    copied every input, float64 too (a whole batch of activations): a float64 array is now used
    as it is, other dtypes converted, and the input is never written (read-only works)."""
    from elmoe3d.sw.golden import quant
    x = np.random.default_rng(1).standard_normal((4, 64))
    assert quant._activation_array(x, "x") is x
    for dtype in (np.float32, np.int16):
        y = quant._activation_array(x.astype(dtype), "x")
        assert y.dtype == np.float64 and np.array_equal(y, x.astype(dtype))
    x.flags.writeable = False
    before = x.copy()
    for fn in (quantize_activations, quantize_activations_fp16):
        fn(x, name="x")
    assert np.array_equal(x, before)


def test_hand_built_weights_and_drafts_are_checked():
    """A review of the public API (2026-12-05): a hand-built QuantizedWeight took Inf, NaN and
    negative scales (gemm then read them by the datapath rule, unlike dequantize) and K = 0;
    drafts were cut from 4-bit codes; dequantize took any codes; bool passed as codes; an
    unknown draft method raised a bare ValueError."""
    from elmoe3d.sw.golden.quant import (QuantizationTypeError, QuantizedWeight,
                                         as_int8_codes, draft_method)
    q = np.ones((2, 64), np.int8)
    for bits, shown in ((0x7C00, "inf"), (0x7E00, "nan"), (0xBC00, "-1.0"), (0x8000, "-0.0")):
        scale = np.full((2, 2), 1.0, np.float16)
        scale.view(np.uint16)[1, 1] = bits
        with pytest.raises(QuantizationError, match=rf"'t': row 1, group 1: scale {shown}: "
                                                    r"expected a finite, non-negative"):
            QuantizedWeight(q=q, scale=scale, name="t")
    with pytest.raises(QuantizationError, match=r"'t': expected codes .* K >= 32, got shape "
                                                r"\(2, 0\)"):
        QuantizedWeight(q=np.ones((2, 0), np.int8), scale=np.ones((2, 0), np.float16),
                        name="t")
    with pytest.raises(QuantizationTypeError, match="got dtype bool"):
        QuantizedWeight(q=q.astype(bool), scale=np.ones((2, 2), np.float16))
    with pytest.raises(QuantizationTypeError, match="got dtype bool"):
        msb_slice(np.array([True, False]))
    with pytest.raises(QuantizationError, match=r"value 300 at index \(1, 2\) is outside"):
        as_int8_codes(np.array([[0, 0, 0], [0, 0, 300]]))

    rng = np.random.default_rng(11)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    qw, qw4 = quantize_weights(w, name="up"), quantize_weights(w, bits=4, name="d")
    with pytest.raises(QuantizationError, match=r"'lsb-aug' cuts INT8 codes; tensor 'd' has "
                                                r"4-bit codes"):
        draft_weights(w, qw4, 4, "lsb-aug")
    assert np.array_equal(draft_weights(w, qw4, 3, "dedicated"),
                          quantize_weights(w, bits=3).dequantize())
    with pytest.raises(QuantizationError, match=r"'up': dequantize: expected codes of shape "
                                                r"\(8, 64\), got \(64,\)"):
        qw.dequantize(qw.q[0])
    with pytest.raises(QuantizationTypeError, match="dequantize: codes: expected integer"):
        qw.dequantize(qw.q.astype(np.float64))
    with pytest.raises(QuantizationError, match=r"draft_codes: method: expected one of "
                                                r"'truncate', 'round', 'lsb-aug', 'dedicated', "
                                                r"got 'lsb_aug'"):
        draft_codes(qw.q, 4, "lsb_aug")
    assert draft_method("LSB_AUG") is DraftMethod.LSB_AUG is draft_method("lsb-aug")
    # every draft code of every k dequantizes through the checked path
    for k in range(2, 8):
        for m in ("truncate", "round", "lsb-aug"):
            codes = draft_codes(ALL_INT8, k, m)
            assert codes.min() >= -128 and codes.max() <= 127
            # draft_weights against codes x group scale computed here, not its own path
            want = draft_codes(qw.q, k, m) * np.repeat(qw.scale.astype(np.float64), 32, -1)
            assert np.array_equal(draft_weights(w, qw, k, m), want)
    with pytest.raises(QuantizationError, match=r"amax: expected magnitudes"):
        fp16_scale_for(np.array([1.0, np.nan]))
    with pytest.raises(QuantizationError, match=r"amax: expected magnitudes"):
        fp16_scale_for(np.array([-1.0]))


def test_hand_built_activations_are_checked():
    """The same review: QuantizedActivation took float codes and exponents (dequantize then
    truncated nothing, the GEMM refused them far from where they were made)."""
    from elmoe3d.sw.golden.quant import QuantizationTypeError, QuantizedActivation
    with pytest.raises(QuantizationTypeError, match="QuantizedActivation: q: expected integer"):
        QuantizedActivation(q=np.array([[0.5]]), exp=np.array([0]))
    with pytest.raises(QuantizationTypeError, match="QuantizedActivation: exp: expected integer"):
        QuantizedActivation(q=np.ones((2, 3), np.int8), exp=np.zeros(2))
    with pytest.raises(QuantizationError, match=r"got shapes \(2, 3\) and \(3,\)"):
        QuantizedActivation(q=np.ones((2, 3), np.int8), exp=np.zeros(3, np.int64))
    qa = quantize_activations(np.array([[1.0, -2.0], [0.0, 0.0]]))
    again = QuantizedActivation(q=qa.q.astype(np.int64), exp=qa.exp.astype(np.int64))
    assert again.q.dtype == np.int8 and again.exp.dtype == np.int32
    assert np.array_equal(again.dequantize(), qa.dequantize())


def test_a_second_review_of_the_quantizer_checks():
    """A review of the change above: bool qmax passed, -0.0 magnitudes gave a -0.0 scale
    (which QuantizedWeight refuses), amax errors named no value, draft_weights took any qw."""
    from elmoe3d.sw.golden.quant import QuantizationTypeError, QuantizedWeight
    with pytest.raises(QuantizationError, match=r"fp16_scale_for: qmax: expected a positive "
                                                r"integer, got True"):
        fp16_scale_for(np.array([1.0]), True)
    with pytest.raises(QuantizationError, match=r"amax: .* got nan at index \(1,\)"):
        fp16_scale_for(np.array([1.0, np.nan]))
    scale, ok = fp16_scale_for(np.array([-0.0, 0.0]))
    assert ok.all() and not np.signbit(scale).any()
    w = np.zeros((2, 32))
    w[0, 3] = -0.0
    qw = quantize_weights(w)
    assert not np.signbit(qw.scale).any()
    with pytest.raises(QuantizationTypeError, match=r"draft_weights: qw: expected a "
                                                    r"QuantizedWeight"):
        draft_weights(w, w, 4, "truncate")
    with pytest.raises(QuantizationTypeError, match=r"scales must be float16 .* got dtype "
                                                    r"float32"):
        QuantizedWeight(q=np.zeros((2, 32), np.int8), scale=np.zeros((2, 1), np.float32))


def test_draft_weights_checks_w_is_the_weight_qw_quantizes():
    """``draft_weights(w * 2, qw, ...)`` and a ``w`` with a NaN returned ``qw``'s drafts
    silently, so an SQNR against the wrong ``w`` went unnoticed (a new user's); a ``bits``
    out of range named ``draft_codes``, an internal function. Each is now one error naming
    ``draft_weights`` and the tensor."""
    rng = np.random.default_rng(7)
    print("seed 7")
    w = rng.standard_normal((4, 64))
    qw = quantize_weights(w, name="up")
    # LSB augmentation at k = 4 by hand: 16 * msb + 8, times the group scale
    msb = (qw.q.astype(np.int16) >> 4)
    want = (16 * msb + 8) * np.repeat(qw.scale.astype(np.float64), 32, -1)
    assert np.array_equal(draft_weights(w, qw, 4, "lsb-aug"), want)
    with pytest.raises(QuantizationError, match=r"draft_weights: w is not the weight qw "
                                                r"\(tensor 'up'\) quantizes: 8 of 8 groups "
                                                r"differ, first row 0, group 0"):
        draft_weights(w * 2, qw, 4, "round")
    moved = w.copy()
    moved[2, 40] += 0.3                               # one group, its codes or its scale
    with pytest.raises(QuantizationError, match=r"1 of 8 groups differ, first row 2, group 1"):
        draft_weights(moved, qw, 4, "truncate")
    moved[2, 40] = np.nan
    with pytest.raises(QuantizationError, match=r"tensor 'up': non-finite weight nan at row 2"):
        draft_weights(moved, qw, 4, "truncate")
    for bits, method, top in ((8, "lsb-aug", 7), (1, "truncate", 7), (0, "dedicated", 8),
                              (9, "dedicated", 8)):
        with pytest.raises(QuantizationError, match=rf"draft_weights: bits: expected an "
                                                    rf"integer in 2\.\.{top} for '{method}'"):
            draft_weights(w, qw, bits, method)
    assert np.array_equal(draft_weights(w, qw, 8, "dedicated"), qw.dequantize())


def test_quantize_weights_refuses_a_masked_array_and_a_name_not_a_str():
    w = np.ma.masked_array(np.ones((2, 32)), mask=np.eye(2, 32, dtype=bool))
    with pytest.raises(QuantizationTypeError, match=r"tensor 'weight': a masked array .* "
                                                    r"w\.filled\(0\)"):
        quantize_weights(w)
    for name in (None, 5):
        with pytest.raises(QuantizationTypeError, match=r"quantize_weights: name: expected the "
                                                        r"tensor's name \(a str\), got "):
            quantize_weights(np.ones((2, 32)), name=name)

"""Golden model: bit-sliced datapath, group psums, Q.24 fused dequantization, exact GEMM
(numerics §3-5)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from elmoe3d.sw.golden.datapath import (
    INT64_MAX, INT64_MIN, Accumulator, Mode, accumulate, acc_to_float, effective_weight, gemm,
    gemm_reference, group_psums, group_psums_reference, lsb_field, msb_field, scale_term,
    slice_product, unit_pe,
)
from elmoe3d.sw.golden.quant import QuantizedWeight, quantize_activations, quantize_weights

ALL_INT8 = np.arange(-128, 128).astype(np.int8)


def test_unit_pe_fields_span_5_bits():
    msb = np.arange(-8, 8)
    for aug in (0, 1):
        f = msb_field(msb, aug)
        assert f.min() == -16 + aug and f.max() == 14 + aug
    assert np.array_equal(lsb_field(np.arange(16)), np.arange(16))
    a = ALL_INT8[:, None]
    p = unit_pe(a, msb_field(msb, 0)[None, :])
    assert p.max() == 2048 and p.min() == -127 * 16        # needs 13 signed bits


def test_slice_products_for_every_int8_pair():
    a = ALL_INT8[:, None]
    q = ALL_INT8[None, :]
    aq = a.astype(np.int32) * q.astype(np.int32)
    full = slice_product(a, q, Mode.FULL)
    assert np.array_equal(full, aq)
    assert np.array_equal(slice_product(a, q, Mode.MSB_ONLY) + slice_product(a, q, Mode.LSB_ONLY),
                          aq)
    msb = np.right_shift(q, 4).astype(np.int32)
    assert np.array_equal(slice_product(a, q, Mode.DRAFT), a.astype(np.int32) * (16 * msb + 8))
    for mode in Mode:
        assert np.array_equal(slice_product(a, q, mode),
                              a.astype(np.int32) * effective_weight(q, mode).astype(np.int32))


def test_worst_case_group_psum_needs_21_bits():
    a = np.full((1, 32), -128, np.int8)
    w = np.full((1, 32), -128, np.int16)
    assert group_psums(a, w)[0, 0, 0] == 1 << 19
    assert group_psums_reference(a, w)[0, 0, 0] == 1 << 19


def test_scale_term_matches_exact_rational_value():
    # Every finite fp16 (both signs): psum * s * 2^24 must equal the term exactly.
    bits = np.concatenate([np.arange(0, 0x7C00), np.arange(0x8000, 0xFC00)]).astype(np.uint16)
    s = bits.view(np.float16)
    for psum in (1, -3, 1 << 19, -(1 << 19)):
        exact = [int(v) for v in (np.float64(psum) * s.astype(np.float64) * 2.0 ** 24)
                 .astype(object)]
        # float64 holds psum*s*2^24 exactly (<= 20 + 11 significant bits)
        assert scale_term(np.full(s.shape, psum), s).tolist() == exact


def test_accumulator_saturates_and_flag_is_sticky():
    big = np.float16(65504)
    psums = np.array([[[1 << 19] * 40]])             # 40 groups of the largest psum
    out = accumulate(psums, np.full((1, 40), big))
    assert out.acc[0, 0] == INT64_MAX and out.overflow[0, 0]
    down = accumulate(-psums, np.full((1, 40), big))
    assert down.acc[0, 0] == INT64_MIN and down.overflow[0, 0]
    # Coming back from saturation keeps the flag.
    mixed = np.concatenate([psums, -psums[:, :, :1]], axis=2)
    back = accumulate(mixed, np.full((1, 41), big))
    assert back.acc[0, 0] < INT64_MAX and back.overflow[0, 0]


def _random_weight(rng, n, k, *, zero_group=True, subnormal=False, huge=False):
    q = rng.integers(-128, 128, (n, k)).astype(np.int8)
    scale = rng.uniform(1e-3, 4, (n, k // 32)).astype(np.float16)
    if zero_group:
        scale[0, 0] = 0
        q[0, :32] = 0
    if subnormal:
        scale[:, -1] = np.uint16(5).view(np.float16)
    if huge:
        scale[:] = np.float16(65504)
    return QuantizedWeight(q=q, scale=scale, name="w")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 9), st.integers(1, 9), st.integers(1, 6),
       st.sampled_from(list(Mode)), st.booleans(), st.booleans())
def test_fast_gemm_equals_reference(seed, m, n, g, mode, subnormal, huge):
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    a = rng.integers(-128, 128, (m, g * 32)).astype(np.int8)
    qw = _random_weight(rng, n, g * 32, subnormal=subnormal, huge=huge)
    assert gemm(a, qw, mode) == gemm_reference(a, qw, mode)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 12), st.integers(2, 12), st.integers(1, 6))
def test_full_equals_msb_only_plus_lsb_only(seed, m, n, g):
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    a = rng.integers(-128, 128, (m, g * 32)).astype(np.int8)
    qw = _random_weight(rng, n, g * 32, subnormal=bool(seed & 1))
    full = gemm(a, qw, Mode.FULL)
    msb, lsb = gemm(a, qw, Mode.MSB_ONLY), gemm(a, qw, Mode.LSB_ONLY)
    assert not (full.overflow.any() or msb.overflow.any() or lsb.overflow.any())
    assert np.array_equal(full.acc, msb.acc + lsb.acc)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(2, 10), st.integers(2, 10), st.integers(2, 6),
       st.sampled_from(list(Mode)), st.data())
def test_independent_of_k_tiling_and_mn_split(seed, m, n, g, mode, data):
    rng = np.random.default_rng(seed)
    print(f"seed {seed}")
    a = rng.integers(-128, 128, (m, g * 32)).astype(np.int8)
    qw = _random_weight(rng, n, g * 32)
    whole = gemm(a, qw, mode)
    # K tiled at group boundaries, carried through the accumulator.
    cut = data.draw(st.integers(1, g - 1)) * 32
    part = gemm(a[:, :cut], QuantizedWeight(qw.q[:, :cut], qw.scale[:, :cut // 32]), mode)
    tiled = gemm(a[:, cut:], QuantizedWeight(qw.q[:, cut:], qw.scale[:, cut // 32:]), mode, part)
    assert tiled == whole
    # K groups in any order (exact integers: order cannot matter without saturation).
    perm = rng.permutation(g)
    cols = (perm[:, None] * 32 + np.arange(32)).ravel()
    assert gemm(a[:, cols], QuantizedWeight(qw.q[:, cols], qw.scale[:, perm]), mode) == whole
    # M split (batch / DP) and N split (output channels / TP).
    ms = data.draw(st.integers(1, m - 1))
    ns = data.draw(st.integers(1, n - 1))
    top, bottom = gemm(a[:ms], qw, mode), gemm(a[ms:], qw, mode)
    assert np.array_equal(np.vstack([top.acc, bottom.acc]), whole.acc)
    left = gemm(a, QuantizedWeight(qw.q[:ns], qw.scale[:ns]), mode)
    right = gemm(a, QuantizedWeight(qw.q[ns:], qw.scale[ns:]), mode)
    assert np.array_equal(np.hstack([left.acc, right.acc]), whole.acc)


def test_fast_path_falls_back_when_exponents_spread():
    # Scales 2^-24 and 65504 in one row: the float64 fast path cannot be exact; results must
    # still equal the int64 datapath.
    rng = np.random.default_rng(3)
    print("seed 3")
    q = rng.integers(-127, 128, (2, 64)).astype(np.int8)
    scale = np.array([[np.uint16(1).view(np.float16), 65504]] * 2, np.float16)
    a = rng.integers(-128, 128, (3, 64)).astype(np.int8)
    qw = QuantizedWeight(q, scale)
    assert gemm(a, qw) == gemm_reference(a, qw)


def test_saturating_gemm_matches_reference_and_flags():
    k = 32 * 64
    a = np.full((2, k), -128, np.int8)
    q = np.full((3, k), -128, np.int8)
    q[1] = 127
    qw = QuantizedWeight(q, np.full((3, k // 32), 65504, np.float16))
    out = gemm(a, qw)
    assert out == gemm_reference(a, qw)
    assert out.overflow[:, 0].all() and out.acc[0, 0] == INT64_MAX
    assert out.acc[0, 1] == INT64_MIN
    init = Accumulator(out.acc, out.overflow)
    again = gemm(a[:, :32], QuantizedWeight(q[:, :32], qw.scale[:, :1]), Mode.LSB_ONLY, init)
    assert again.overflow[:, :2].all()



def test_gemm_rejects_bad_operands():
    qw = quantize_weights(np.ones((4, 64), np.float32), name="up")
    with pytest.raises(TypeError, match="int8"):
        gemm(np.ones((2, 64)), qw)
    with pytest.raises(ValueError, match="K mismatch.*'up'"):
        gemm(np.ones((2, 32), np.int8), qw)


def test_acc_to_float_needs_one_exponent_per_row():
    """A wrongly shaped exponent array would broadcast into a wrong result: refused, naming
    the argument and the shape expected."""
    acc = np.arange(12, dtype=np.int64).reshape(3, 4) << 24
    assert np.array_equal(acc_to_float(acc, [0, 1, -1]),
                          np.arange(12).reshape(3, 4) * np.array([[1.0], [2.0], [0.5]]))
    with pytest.raises(ValueError, match=r"act_exp: expected one exponent per row of acc, "
                                         r"shape \(3,\), got shape \(1,\)"):
        acc_to_float(acc, [0])
    with pytest.raises(ValueError, match=r"act_exp: .* got shape \(3, 1\)"):
        acc_to_float(acc, np.zeros((3, 1), np.int32))
    with pytest.raises(ValueError, match=r"acc: expected \[M, N\] accumulators"):
        acc_to_float(acc.reshape(-1), np.zeros(12, np.int32))


def test_acc_to_float_of_no_rows_takes_an_empty_exponent_list():
    """``acc_to_float(np.zeros((0, N), np.int64), [])`` worked before the exponents' dtype was
    checked, then failed (``np.asarray([])`` is float64): an empty exponent array has no value
    to truncate, so its dtype is not refused; a non-empty float one still is."""
    from elmoe3d.sw.golden.quant import QuantizationTypeError
    for exps in ([], np.zeros(0), np.zeros(0, np.int32)):
        out = acc_to_float(np.zeros((0, 5), np.int64), exps)
        assert out.shape == (0, 5) and out.dtype == np.float64
    with pytest.raises(QuantizationTypeError, match=r"act_exp: expected integer exponents"):
        acc_to_float(np.zeros((1, 5), np.int64), [0.0])


def test_end_to_end_accuracy_against_float64():
    rng = np.random.default_rng(5)
    print("seed 5")
    w = rng.standard_normal((96, 384)).astype(np.float32) * 0.05
    x = rng.standard_normal((16, 384))
    qa, qw = quantize_activations(x), quantize_weights(w)
    ref = x @ w.astype(np.float64).T
    full = acc_to_float(gemm(qa.q, qw).acc, qa.exp)
    draft = acc_to_float(gemm(qa.q, qw, Mode.DRAFT).acc, qa.exp)

    def sqnr(y):
        return 10 * np.log10(np.sum(ref ** 2) / np.sum((y - ref) ** 2))
    assert sqnr(full) > 30
    assert 10 < sqnr(draft) < sqnr(full)


def test_weight_codes_that_would_wrap_are_refused():
    from elmoe3d.sw.golden.quant import QuantizationError, lsb_slice, msb_slice
    scale = np.ones((1, 1), np.float16)
    with pytest.raises(QuantizationError, match=r"'w' codes.*200.*outside \[-128, 127\]"):
        QuantizedWeight(np.full((1, 32), 200, np.int16), scale, name="w")
    with pytest.raises(QuantizationError, match="integer codes"):
        msb_slice(np.array([128.0]))
    with pytest.raises(QuantizationError, match="outside"):
        lsb_slice(np.array([-129]))
    with pytest.raises(QuantizationError, match="float16"):
        QuantizedWeight(np.zeros((1, 32), np.int8), np.ones((1, 1), np.float32))
    with pytest.raises(QuantizationError, match=r"scales of shape"):
        QuantizedWeight(np.zeros((2, 64), np.int8), np.ones((2, 1), np.float16))
    with pytest.raises(QuantizationError, match=r"outside \[-8, 7\]"):
        QuantizedWeight(np.full((1, 32), 9, np.int8), scale, bits=4)
    # In-range wider integers are accepted and stored as int8.
    assert QuantizedWeight(np.full((1, 32), -128, np.int64), scale).q.dtype == np.int8


def test_quantized_weight_is_immutable_so_the_gemm_cache_cannot_go_stale():
    rng = np.random.default_rng(6)
    print("seed 6")
    q = rng.integers(-127, 128, (4, 64)).astype(np.int8)
    qw = QuantizedWeight(q, np.ones((4, 2), np.float16))
    a = rng.integers(-128, 128, (2, 64)).astype(np.int8)
    before = gemm(a, qw)
    q[:] = 0                                   # the caller's array is copied, not aliased
    assert gemm(a, qw) == before == gemm_reference(a, qw)
    with pytest.raises(ValueError):
        qw.q[0, 0] = 1
    with pytest.raises(ValueError):
        qw.scale[0, 0] = 0


def test_slice_modes_need_bit_nested_int8():
    w4 = quantize_weights(np.ones((2, 32), np.float32), bits=4, name="d4")
    a = np.ones((1, 32), np.int8)
    assert gemm(a, w4, Mode.FULL) == gemm_reference(a, w4, Mode.FULL)
    with pytest.raises(ValueError, match="DRAFT needs bit-nested INT8.*'d4'"):
        gemm(a, w4, Mode.DRAFT)


def test_gemm_and_acc_to_float_refuse_wrong_operands_by_name():
    """A new-user trial (2026-12-04): a float array for codes, a QuantizedActivation or an
    ndarray init crashed with NumPy or attribute errors, a wrongly shaped init with a broadcast
    error, an Accumulator in acc_to_float was reported as 'got shape ()', and float exponents
    were truncated silently. Each is now a QuantizationError naming the function, the argument
    and what was expected (a TypeError too where the type is wrong, as before)."""
    from elmoe3d.sw.golden.quant import QuantizationError, QuantizationTypeError
    rng = np.random.default_rng(3)
    print("seed 3")
    qw = quantize_weights(rng.standard_normal((16, 64)).astype(np.float32), name="up")
    x = rng.standard_normal((4, 64))
    qa = quantize_activations(x)
    for fn in (gemm, gemm_reference):
        name = fn.__name__
        with pytest.raises(QuantizationTypeError, match=rf"^{name}: a_q: expected int8 activation "
                                                         r"codes \[M, K\] .* got dtype float64$"):
            fn(x, qw)
        with pytest.raises(TypeError, match=rf"^{name}: a_q: .* got a QuantizedActivation "
                                            r"\(pass its \.q\)$"):
            fn(qa, qw)
        with pytest.raises(QuantizationTypeError, match=rf"^{name}: qw: expected a QuantizedWeight"
                                                         r" .* got ndarray$"):
            fn(qa.q, qw.q)
        for init in (np.zeros((4, 16), np.int64), 0):
            with pytest.raises(QuantizationTypeError, match=rf"^{name}: init: expected None or an "
                                                             r"Accumulator"):
                fn(qa.q, qw, init=init)
        for m, n in ((3, 16), (4, 8)):
            with pytest.raises(QuantizationError, match=rf"^{name}: init: expected an Accumulator "
                                                         rf"of shape \[M, N\] = \(4, 16\), got acc "
                                                         rf"\({m}, {n}\)"):
                fn(qa.q, qw, init=Accumulator.zeros(m, n))
        # (an Accumulator of float acc is refused when it is made: test_api_inputs.py)
        with pytest.raises(QuantizationTypeError, match=r"^Accumulator: acc: expected int64 Q\.24 "
                                                         r"accumulators \[M, N\], got dtype "
                                                         r"float64$"):
            fn(qa.q, qw, init=Accumulator(np.zeros((4, 16)), np.zeros((4, 16), bool)))
        with pytest.raises(QuantizationError, match=rf"^{name}: mode: expected a Mode, one of "
                                                     r"FULL \(0\), .* got 7$"):
            fn(qa.q, qw, mode=7)
    acc = gemm(qa.q, qw)
    with pytest.raises(QuantizationTypeError, match=r"^acc_to_float: acc: .* got the Accumulator "
                                                     r"\(pass its \.acc\)$"):
        acc_to_float(acc, qa.exp)
    with pytest.raises(QuantizationTypeError, match=r"^acc_to_float: act_exp: .* got the "
                                                     r"QuantizedActivation \(pass its \.exp\)$"):
        acc_to_float(acc.acc, qa)
    with pytest.raises(QuantizationTypeError, match=r"^acc_to_float: acc: expected int64 Q\.24 "
                                                     r"accumulators \[M, N\], got dtype float64$"):
        acc_to_float(acc.acc.astype(np.float64), qa.exp)
    with pytest.raises(QuantizationTypeError, match=r"^acc_to_float: act_exp: expected integer "
                                                     r"exponents \[M\], got dtype float64$"):
        acc_to_float(acc.acc, qa.exp + 0.5)
    # the good path with a carry-in is unchanged
    assert gemm(qa.q, qw, init=acc) == gemm_reference(qa.q, qw, init=acc)


def test_low_level_helpers_refuse_what_would_wrap_or_round():
    """A review of the public API (2026-12-05): the exported datapath helpers truncated float
    activations, masked or wrapped fields, wrapped psums beyond the psum register, broadcast a
    wrongly shaped scale and rounded float64 scales to FP16 without a word; gemm refused the
    mode names ref_linear takes."""
    from elmoe3d.sw.golden.datapath import PSUM_BITS, parse_mode
    from elmoe3d.sw.golden.quant import QuantizationError, QuantizationTypeError
    with pytest.raises(QuantizationTypeError, match=r"slice_product: a: expected integer codes, "
                                                     r"got dtype float64"):
        slice_product(np.array([0.7]), np.array([100]), Mode.FULL)
    with pytest.raises(QuantizationError, match=r"slice_product: a: value 300 .* outside "
                                                 r"\[-128, 127\]"):
        slice_product(np.array([300], np.int16), np.array([100]), Mode.FULL)
    with pytest.raises(QuantizationTypeError, match=r"unit_pe: a: expected integer codes, got "
                                                     r"dtype float64"):
        unit_pe(2.9, 3)
    with pytest.raises(QuantizationError, match=r"unit_pe: field: value 16 is outside \[-16, 15\]"):
        unit_pe(3, 16)
    with pytest.raises(QuantizationError, match=r"msb_field: msb: value 20 is outside \[-8, 7\]"):
        msb_field(20, 1)
    with pytest.raises(QuantizationError, match=r"msb_field: aug: value 2 is outside \[0, 1\]"):
        msb_field(0, 2)
    with pytest.raises(QuantizationError, match=r"lsb_field: lsb: value 17 is outside \[0, 15\]"):
        lsb_field(17)
    lim = 1 << (PSUM_BITS - 1)
    one = np.float16(1.0)
    assert scale_term(np.array([-lim, lim - 1]), one).tolist() == [-lim << 24, (lim - 1) << 24]
    for bad in (-lim - 1, lim, 1 << 40):
        with pytest.raises(QuantizationError, match=rf"scale_term: psum: expected {PSUM_BITS}"
                                                     r"-bit signed group psums"):
            scale_term(np.int64(bad), np.float16(65504))
    psums = np.ones((1, 1, 2), np.int64)
    with pytest.raises(QuantizationError, match=r"accumulate: scale: .* shape \[N, G\] = "
                                                 r"\(1, 2\), got \(1, 1\)"):
        accumulate(psums, np.ones((1, 1), np.float16))
    with pytest.raises(QuantizationTypeError, match=r"accumulate: scale: expected FP16 group "
                                                     r"scales \(float16\), got dtype float64"):
        accumulate(psums, np.full((1, 2), 0.1))
    with pytest.raises(QuantizationError, match=r"group_psums: a: value 300"):
        group_psums(np.full((1, 32), 300), np.ones((1, 32), np.int8))
    with pytest.raises(QuantizationError, match=r"group_psums_reference: expected a\[M, K\] .* "
                                                 r"got \(1, 48\) and \(1, 48\)"):
        group_psums_reference(np.ones((1, 48), np.int8), np.ones((1, 48), np.int8))
    with pytest.raises(QuantizationError, match=r"acc_to_float: act_exp: expected int32"):
        acc_to_float(np.zeros((1, 1), np.int64), np.array([1 << 31]))
    # every FP16 bit pattern still reads by the RTL's rule (exponent 31 shifts by 30)
    assert scale_term(np.int64(1), np.uint16(0x7C00).view(np.float16)) == 1024 << 30
    assert parse_mode("draft") is parse_mode("DRAFT") is parse_mode(1) is Mode.DRAFT
    for bad in ("drafts", True, 1.5, None):
        with pytest.raises(QuantizationError, match=r"^gemm: mode: expected a Mode"):
            parse_mode(bad, "gemm")
    qw = quantize_weights(np.random.default_rng(3).standard_normal((8, 64)), name="w")
    qa = quantize_activations(np.random.default_rng(4).standard_normal((2, 64)))
    assert gemm(qa.q, qw, "DRAFT") == gemm_reference(qa.q, qw, Mode.DRAFT)


def test_a_second_review_of_the_low_level_checks():
    """A review of the change above: 1.0 and np.True_ still read as DRAFT, accumulate's other
    shapes and an empty weight (N = 0, which the GEMM takes) were untested."""
    from elmoe3d.sw.golden.datapath import parse_mode
    from elmoe3d.sw.golden.quant import QuantizationError
    for bad in (1.0, np.True_, np.float64(2)):
        with pytest.raises(QuantizationError, match=r"^parse_mode: mode: expected a Mode"):
            parse_mode(bad)
    assert parse_mode(np.int64(3)) is Mode.LSB_ONLY
    with pytest.raises(QuantizationError, match=r"accumulate: psums: expected shape \[M, N, G\]"):
        accumulate(np.ones((1, 2), np.int64), np.ones((1, 2), np.float16))
    empty = QuantizedWeight(q=np.zeros((0, 64), np.int8), scale=np.zeros((0, 2), np.float16))
    qa = quantize_activations(np.ones((3, 64)))
    assert gemm(qa.q, empty) == gemm_reference(qa.q, empty) == Accumulator.zeros(3, 0)

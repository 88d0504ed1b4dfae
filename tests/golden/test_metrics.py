"""Float64 error metrics and the reference linear layer (elmoe3d.sw.golden.metrics)."""

import math

import numpy as np
import pytest

from elmoe3d.sw.golden.metrics import ErrorSums, error_metrics, reference_linear


def test_hand_computed_values():
    m = error_metrics([1, 2, 3, 4], [1, 2, 3, 5])
    # err = [0, 0, 0, 1]: sum ref^2 = 30, sum err^2 = 1, ref.approx = 34, |approx|^2 = 39
    assert m["mse"] == 0.25
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(30.0), abs=1e-12)
    assert m["sqnr_db"] == pytest.approx(14.771212547, abs=1e-9)
    assert m["cosine"] == pytest.approx(34 / math.sqrt(30 * 39), abs=1e-15)
    assert m["max_abs"] == 1.0
    assert all(isinstance(v, float) for v in m.values())


def test_negative_error_and_2d():
    ref = np.array([[3.0, -4.0], [0.0, 0.0]])
    approx = np.array([[3.0, -4.5], [0.0, 0.25]])
    m = error_metrics(ref, approx)
    assert m["mse"] == pytest.approx((0.25 + 0.0625) / 4)
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(25 / 0.3125))
    assert m["max_abs"] == 0.5
    dot = 9 + 18
    assert m["cosine"] == pytest.approx(dot / math.sqrt(25 * (9 + 20.25 + 0.0625)))


def test_exact_match_is_infinite_sqnr():
    m = error_metrics(np.arange(5.0), np.arange(5.0))
    assert m["sqnr_db"] == math.inf
    assert m["mse"] == 0.0 and m["max_abs"] == 0.0 and m["cosine"] == 1.0


def test_zero_vectors():
    m = error_metrics(np.zeros(4), np.zeros(4))
    assert m == {"mse": 0.0, "sqnr_db": math.inf, "cosine": 1.0, "max_abs": 0.0}
    m = error_metrics(np.zeros(2), np.array([0.0, 2.0]))
    assert m["sqnr_db"] == -math.inf and m["cosine"] == 0.0 and m["mse"] == 2.0


def test_shape_mismatch_is_a_clear_value_error():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        error_metrics(np.zeros((2, 3)), np.zeros((3, 2)))


def test_float64_even_for_float16_inputs():
    # In float16 the squared error of 1e-4 would underflow to 0 and report +inf dB.
    ref = np.ones(8, np.float16)
    approx = ref + np.float16(1e-3)
    m = error_metrics(ref, approx)
    assert math.isfinite(m["sqnr_db"]) and m["mse"] > 0


def test_pooled_sums_equal_concatenation():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(7, 5)), rng.normal(size=(3, 11))
    ea, eb = a + rng.normal(scale=0.1, size=a.shape), b + rng.normal(scale=0.3, size=b.shape)
    pooled = (ErrorSums.of(a, ea) + ErrorSums.of(b, eb)).metrics()
    whole = error_metrics(np.concatenate([a.ravel(), b.ravel()]),
                          np.concatenate([ea.ravel(), eb.ravel()]))
    for key in whole:
        assert pooled[key] == pytest.approx(whole[key], rel=1e-12)


def test_reference_linear():
    x = np.array([[1.0, 2.0], [0.5, -1.0]], np.float32)
    w = np.array([[1.0, 0.0], [2.0, 3.0], [-1.0, 1.0]])      # [N=3, K=2]
    y = reference_linear(x, w)
    assert y.dtype == np.float64 and y.shape == (2, 3)
    np.testing.assert_array_equal(y, [[1.0, 8.0, 1.0], [0.5, -2.0, -1.5]])
    with pytest.raises(ValueError, match="K = 2"):
        reference_linear(np.zeros((1, 3)), w)


def test_non_finite_values_are_named():
    """A review (2026-12-05): a NaN approximation gave cosine -1.0 and Inf a math error."""
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match=r"error_metrics: approx: non-finite value .* at "
                                             r"index \(1, 0\)"):
            error_metrics(np.ones((2, 2)), np.array([[1.0, 1.0], [bad, 1.0]]))
    with pytest.raises(ValueError, match=r"error_metrics: ref: non-finite value -inf"):
        error_metrics([-np.inf], [1.0])


def test_sums_beyond_float64_are_an_error_not_a_cosine():
    """A review: identical arrays of 1e200 came out with cosine -1.0 (NaN clamped)."""
    with pytest.raises(ValueError, match=r"sums of squares overflow float64 \(values up to "
                                         r"1e\+200\)"):
        error_metrics([1e200], [1e200])
    big = ErrorSums.of([1e154], [1e154])
    with pytest.raises(ValueError, match="pooled sums of squares overflow"):
        (big + big + big).metrics()
    assert error_metrics([1e150, 1.0], [1e150, 2.0])["cosine"] == 1.0

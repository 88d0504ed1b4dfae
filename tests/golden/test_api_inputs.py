"""Input validation of the golden numerics API (``sw/golden/datapath.py``, ``quant.py``,
``linear_stream.py``, ``expert_stream.py``): an audit at b2f0a8b (2026-12-06) found ragged
lists surfacing as NumPy's "inhomogeneous shape" error, Python ints wrapping in
``saturating_add``, an ``Accumulator`` of lists crashing the GEMM with an AttributeError,
messages naming the wrong function or parameter, a truthy ``raw_output="yes"`` taken as True
and docstrings contradicting what the model does. Every bad input is now a one-line error
naming the function and the parameter; the numerics of valid input are unchanged."""

import pathlib

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.sw.golden.datapath import (
    INT64_MAX, INT64_MIN, PSUM_BITS, Accumulator, Mode, acc_to_float, accumulate,
    effective_weight, gemm, gemm_reference, saturating_add, scale_term, slice_product,
)
from elmoe3d.sw.golden.linear_stream import (build_streamed_linear_program, plan_linear_stream,
                                             ref_linear)
from elmoe3d.sw.golden.quant import (
    QuantizationError, QuantizationTypeError, QuantizedActivation, QuantizedWeight,
    as_int8_codes, draft_codes, fp16_scale_for, join_slices, lsb_slice, msb_slice,
    quantize_activations, quantize_activations_fp16, quantize_weights,
)

from ..conftest import hf_module

SEED = 2612
RAGGED = [[1, 2], [3]]
TINY = 2.0 ** -24                    # the smallest FP16 subnormal: the smallest non-zero scale
RAGGED_MSG = r"got a list NumPy cannot turn into one array \(rows of different lengths\?\)$"


def _layer(t=3, k=64, n=96):
    rng = np.random.default_rng(SEED)
    return rng.normal(size=(t, k)), rng.normal(size=(n, k)) * 0.05


# --- 1. linear layers ------------------------------------------------------------------------

def test_ref_linear_names_ragged_x():
    _, w = _layer()
    with pytest.raises(QuantizationTypeError, match=r"^x: expected activations \[T, K\] .* "
                                                    + RAGGED_MSG):
        ref_linear([[1.0] * 64, [1.0] * 63], w)


def test_build_streamed_linear_program_names_ragged_x():
    _, w = _layer()
    with pytest.raises(QuantizationTypeError, match=r"^x: expected activations \[T, K\] .* "
                                                    + RAGGED_MSG):
        build_streamed_linear_program([[1.0] * 64, [1.0] * 63], w, config=preset("small"))


def test_linear_layers_name_a_ragged_weight():
    x, _ = _layer()
    with pytest.raises(QuantizationTypeError, match=r"^tensor 'w': expected a float "
                                                    r"\(or integer\) weight array .* " + RAGGED_MSG):
        ref_linear(x, [[1.0] * 64, [1.0] * 63])


@pytest.mark.parametrize("raw", ["yes", 1, 0, "False"])
def test_raw_output_must_be_a_bool(raw):
    x, w = _layer()
    with pytest.raises(TypeError, match=r"^build_streamed_linear_program: raw_output: expected "
                                        rf"None \(the PE's default\) or a bool, got {raw!r}$"):
        build_streamed_linear_program(x, w, config=preset("small"), raw_output=raw)
    with pytest.raises(TypeError, match=r"^plan_linear_stream: raw_output: expected None"):
        plan_linear_stream(64, 96, preset("small"), raw_output=raw)


def test_raw_output_takes_bools():
    """A bool (NumPy's too) picks the OUTPUT format; None the PE's default (FP32 on the small
    PE, whose OUT holds an FP32 chunk)."""
    for raw, want in ((True, True), (np.True_, True), (False, False), (None, False)):
        plan = plan_linear_stream(64, 96, preset("small"), raw_output=raw)
        assert plan.raw_output is want


def test_linear_output_range_and_resolution_are_documented_and_flagged():
    """Q.24 outputs: +-2^39 saturates (vpu_saturation), below 2^-25 flushes to 0 unflagged;
    the hardware's numerics, stated in the docstrings with the flag to check."""
    x, w = _layer()
    big = ref_linear(x * 1e30, w)
    assert big.vpu_saturation and np.abs(big.y).max() == 2.0 ** 39
    tiny = ref_linear(x * 1e-8, w)
    assert not tiny.vpu_saturation and not tiny.acc_overflow and not tiny.y.any()
    for fn in (ref_linear, build_streamed_linear_program):
        doc = " ".join(fn.__doc__.split())
        assert "2^-24" in doc and "2^39" in doc and "vpu_saturation" in doc, fn.__name__
    doc = " ".join(build_streamed_linear_program.__doc__.split())
    assert "TypeError ``config`` missing (None) or not an ArchConfig or PEConfig" in doc


# --- 2. saturating_add ---------------------------------------------------------------------

def test_saturating_add_of_python_ints_saturates_instead_of_wrapping():
    total, ovf = saturating_add(2 ** 62, 2 ** 62)
    assert int(total) == INT64_MAX and bool(ovf)
    total, ovf = saturating_add([-(2 ** 62), 5], [-(2 ** 62) - 1, 6])
    assert total.tolist() == [INT64_MIN, 11] and ovf.tolist() == [True, False]


def test_saturating_add_widens_narrow_integers_to_int64():
    total, ovf = saturating_add(np.array([2 ** 31 - 1], np.int32), np.array([1], np.int32))
    assert total.dtype == np.int64 and total.tolist() == [2 ** 31] and not ovf.any()
    total, _ = saturating_add(np.array([INT64_MAX]), np.array([7], np.uint32))
    assert total.tolist() == [INT64_MAX]


@pytest.mark.parametrize("acc, words", [
    (np.array([1.5]), r"got dtype float64$"),
    (np.array([1], np.uint64), r"got dtype uint64 \(view two's complement bits with "
                               r"\.view\(np\.int64\)\)$"),
    (np.array([True]), r"got dtype bool$"),
    (2.0, r"got a float \(2\.0\)$"),
    ("3", r"got a str \('3'\)$"),
    (RAGGED, RAGGED_MSG),
])
def test_saturating_add_refuses_what_is_not_int64(acc, words):
    with pytest.raises(QuantizationTypeError, match=r"^saturating_add: acc: expected int64 "
                                                    r"integers, " + words):
        saturating_add(acc, np.int64(1))
    with pytest.raises(QuantizationTypeError, match=r"^saturating_add: term: "):
        saturating_add(np.int64(1), acc)


@pytest.mark.parametrize("value", [2 ** 63, -(2 ** 63) - 1, 2 ** 70])
def test_saturating_add_refuses_python_ints_beyond_int64(value):
    for arg in (value, [1, value], [-1, value]):
        with pytest.raises(QuantizationError, match=rf"^saturating_add: term: expected int64 "
                                                    rf"integers, got the integer {value}, beyond "
                                                    r"int64"):
            saturating_add(0, arg)


def test_saturating_add_names_shapes_that_do_not_broadcast():
    with pytest.raises(QuantizationError, match=r"^saturating_add: acc and term: expected "
                                                r"shapes that broadcast together, got \(2,\) "
                                                r"and \(3,\)$"):
        saturating_add(np.zeros(2, np.int64), np.zeros(3, np.int64))


def test_saturating_add_of_int64_is_unchanged():
    rng = np.random.default_rng(SEED)
    a, b = rng.integers(INT64_MIN, INT64_MAX, (2, 500), endpoint=True, dtype=np.int64)
    total, ovf = saturating_add(a, b)
    want = [min(max(int(x) + int(y), INT64_MIN), INT64_MAX) for x, y in zip(a, b)]
    assert total.dtype == np.int64 and total.tolist() == want
    assert ovf.tolist() == [not INT64_MIN <= int(x) + int(y) <= INT64_MAX for x, y in zip(a, b)]


# --- 3. Accumulator ------------------------------------------------------------------------

def test_an_accumulator_of_lists_works_as_a_gemm_carry_in():
    qw = quantize_weights(np.random.default_rng(SEED).normal(size=(4, 64)), name="w")
    qa = quantize_activations(np.random.default_rng(SEED + 1).normal(size=(3, 64)))
    init = Accumulator([[0] * 4] * 3, [[False] * 4] * 3)
    assert init.acc.dtype == np.int64 and init.overflow.dtype == np.bool_
    assert gemm(qa.q, qw, init=init) == gemm(qa.q, qw) == gemm_reference(qa.q, qw, init=init)


@pytest.mark.parametrize("acc, ovf, err, words", [
    (np.zeros((2, 2)), np.zeros((2, 2), bool), QuantizationTypeError,
     r"acc: expected int64 Q\.24 accumulators \[M, N\], got dtype float64"),
    (np.zeros((2, 2), np.uint64), np.zeros((2, 2), bool), QuantizationTypeError,
     r"acc: expected int64 .* got dtype uint64"),
    (np.zeros((2, 2), np.int64), np.zeros((2, 2), np.int8), QuantizationTypeError,
     r"overflow: expected bool flags \[M, N\], got dtype int8"),
    (RAGGED, [[False] * 2] * 2, QuantizationTypeError, r"acc: .*" + RAGGED_MSG),
    (np.zeros(2, np.int64), np.zeros(2, bool), QuantizationError,
     r"acc: expected a 2-D array \[M, N\], got shape \(2,\)$"),
    (np.zeros((2, 2, 2), np.int64), np.zeros((2, 2, 2), bool), QuantizationError,
     r"acc: expected a 2-D array \[M, N\], got shape \(2, 2, 2\)$"),
    (np.zeros((2, 2), np.int64), np.zeros((2, 3), bool), QuantizationError,
     r"expected acc and overflow of one shape \[M, N\], got \(2, 2\) and \(2, 3\)"),
    ([[2 ** 63]], [[False]], QuantizationError, r"acc: .* got the integer 9223372036854775808"),
])
def test_accumulator_refuses_bad_fields(acc, ovf, err, words):
    with pytest.raises(err, match=r"^Accumulator: " + words):
        Accumulator(acc, ovf)


@pytest.mark.parametrize("m, n, err, name", [
    (-1, 2, QuantizationError, "m"), (2, -3, QuantizationError, "n"),
    (2.5, 2, QuantizationTypeError, "m"), (True, 1, QuantizationTypeError, "m"),
    (2, None, QuantizationTypeError, "n"),
])
def test_accumulator_zeros_names_a_bad_size(m, n, err, name):
    bad = {"m": m, "n": n}[name]
    with pytest.raises(err, match=rf"^Accumulator\.zeros: {name}: expected an integer >= 0, "
                                  rf"got {bad!r}$"):
        Accumulator.zeros(m, n)
    assert Accumulator.zeros(np.int64(2), 0).acc.shape == (2, 0)


# --- 4. groups below the FP16 scale's resolution ----------------------------------------------

def test_tiny_weight_groups_are_documented_as_they_behave():
    qw = quantize_weights(np.full((2, 32), 1e-9))
    assert not qw.q.any() and (qw.scale == TINY).all()          # q = 0, scale not 0
    w = np.zeros((3, 32))
    w[1, 0], w[2, 0] = 2.0 ** -25, 2.0 ** -25 * 1.001            # at and just above the edge
    qw = quantize_weights(w)
    assert qw.q[:, 0].tolist() == [0, 0, 1] and qw.scale[:, 0].tolist() == [0.0, TINY, TINY]
    doc = " ".join(quantize_weights.__doc__.split())
    assert "An all-zero group has ``s = 0`` and ``q = 0``." not in doc
    assert "0 < max|W| <= 2^-25" in doc and "zero_groups" in doc


def test_tiny_activation_tokens_are_documented_as_they_behave():
    q, s = quantize_activations_fp16([[1e-10, 5e-11], [2.0 ** -25 * 1.001, 0], [0, 0]])
    assert q.tolist() == [[0, 0], [1, 0], [0, 0]] and s.tolist() == [TINY, TINY, 0.0]
    assert "0 < max|x| <= 2^-25" in " ".join(quantize_activations_fp16.__doc__.split())


# --- 5. quantizer inputs --------------------------------------------------------------------

def test_quantize_weights_names_ragged_rows():
    with pytest.raises(QuantizationTypeError, match=r"^tensor 'up': expected a float "
                                                    r"\(or integer\) weight array of shape \[\.\.\., N, K\], "
                                                    + RAGGED_MSG):
        quantize_weights(RAGGED, name="up")


@pytest.mark.parametrize("w, got", [
    ("weights.safetensors", r"a str \('weights\.safetensors'\) \(a file name\? read the tensor "
                            r"first\)"),
    (pathlib.Path("w.npz"), r"a PosixPath \(PosixPath\('w\.npz'\)\) \(a file name\?"),
    (None, r"a NoneType \(None\)"),
    (np.ones((2, 32), bool), r"dtype bool"),
    (np.ones((2, 32), complex), r"dtype complex128"),
])
def test_quantize_weights_says_what_it_got(w, got):
    with pytest.raises(QuantizationTypeError, match=r"^tensor 'weight': expected a float "
                                                    r"\(or integer\) weight array of shape \[\.\.\., N, K\], got "
                                                    + got):
        quantize_weights(w)


def test_a_torch_tensor_numpy_cannot_read_is_named_with_the_way_out():
    """A review's finding (2026-12-07): a torch BF16 tensor was said to be ragged lists, and
    one that requires grad raised torch's RuntimeError; now both name the dtype, torch's
    reason and the conversion, and the converted tensor quantizes as the float32 array."""
    torch = hf_module("torch")
    w = torch.from_numpy(_layer()[1].astype(np.float32))
    for bad, why in ((w.bfloat16(), r"torch\.bfloat16 NumPy cannot read \(Got unsupported "
                                    r"ScalarType BFloat16\)"),
                     (w.clone().requires_grad_(True), r"torch\.float32 NumPy cannot read "
                                                      r"\(Can't call numpy\(\) on Tensor that "
                                                      r"requires grad")):
        for f, what in ((quantize_weights, "tensor 'weight'"),
                        (quantize_activations, "activation 'activation'")):
            with pytest.raises(QuantizationTypeError, match=rf"^{what}: expected .*, got a "
                               rf"Tensor of dtype {why}.*; convert it first, e\.g\. "
                               rf"x\.detach\(\)\.cpu\(\)\.float\(\)"):
                f(bad)
        if bad.dtype == torch.bfloat16:     # rows of such tensors: the row is named
            with pytest.raises(QuantizationTypeError, match=r"^tensor 'weight'\[0\]: expected "
                               r".*, got a Tensor of dtype torch\.bfloat16 NumPy cannot read"):
                quantize_weights(list(bad))
        fixed = quantize_weights(bad.detach().cpu().float())
        expect = quantize_weights(bad.detach().float().numpy())
        np.testing.assert_array_equal(fixed.q, expect.q)
        np.testing.assert_array_equal(fixed.scale, expect.scale)


def test_quantized_weight_and_as_int8_codes_name_ragged_lists():
    with pytest.raises(QuantizationTypeError, match=r"^tensor 'd' codes: expected integer codes, "
                                                    + RAGGED_MSG):
        QuantizedWeight(q=RAGGED, scale=np.zeros((2, 1), np.float16), name="d")
    with pytest.raises(QuantizationTypeError, match=r"^tensor 'd' scales: expected float16 "
                                                    r"group scales .*" + RAGGED_MSG):
        QuantizedWeight(q=np.zeros((2, 32), np.int8), scale=RAGGED, name="d")
    with pytest.raises(QuantizationTypeError, match=r"^my codes: expected integer codes, "
                                                    + RAGGED_MSG):
        as_int8_codes(RAGGED, "my codes")


def test_gemm_takes_mode_names_as_documented_and_names_a_bad_one():
    qw = quantize_weights(np.random.default_rng(SEED).normal(size=(4, 64)), name="w")
    qa = quantize_activations(np.random.default_rng(SEED + 1).normal(size=(3, 64)))
    assert gemm(qa.q, qw, "FULL") == gemm(qa.q, qw, Mode.FULL)
    assert "its name" in gemm.__doc__
    with pytest.raises(QuantizationError, match=r"^gemm: mode: expected a Mode, one of FULL "
                                                r"\(0\), DRAFT \(1\), MSB_ONLY \(2\), LSB_ONLY "
                                                r"\(3\), got 'FAST'$"):
        gemm(qa.q, qw, "FAST")


def test_quantize_activations_of_any_leading_shape_is_documented_and_reshapes_for_gemm():
    x = np.random.default_rng(SEED).normal(size=(2, 3, 64))
    qa3 = quantize_activations(x)
    assert qa3.q.shape == (2, 3, 64) and qa3.exp.shape == (2, 3)
    qa2 = quantize_activations(x.reshape(-1, 64))
    assert np.array_equal(qa3.q.reshape(-1, 64), qa2.q)
    assert np.array_equal(qa3.exp.reshape(-1), qa2.exp)
    one = quantize_activations(x[0, 0])
    assert one.q.shape == (64,) and one.exp.shape == ()
    doc = " ".join(quantize_activations.__doc__.split())
    assert "a 1-D ``x`` is one token" in doc and "q.reshape(-1, K)" in doc


# --- 6. messages naming the function and parameter -------------------------------------------

@pytest.mark.parametrize("call, words", [
    (lambda: slice_product(np.array([1]), [200], Mode.FULL),
     r"slice_product: q: value 200 at index \(0,\) is outside \[-128, 127\]"),
    (lambda: effective_weight([200], Mode.FULL),
     r"effective_weight: q: value 200 at index \(0,\) is outside \[-128, 127\]"),
    (lambda: msb_slice([200]), r"msb_slice: q: value 200"),
    (lambda: lsb_slice([-129]), r"lsb_slice: q: value -129"),
    (lambda: draft_codes([200], 4, "truncate"), r"draft_codes: q: value 200"),
    (lambda: draft_codes([1], 8, "truncate"),
     r"draft_codes: bits: expected an integer in 2\.\.7 \(draft bits\), got 8"),
    (lambda: join_slices([0, 1, 2], [0, 1]),
     r"join_slices: msb and lsb: expected slices of one shape \(or shapes that broadcast\), "
     r"got \(3,\) and \(2,\)"),
    (lambda: accumulate(np.ones((1, 1, 2), np.int64) << PSUM_BITS, np.ones((1, 2), np.float16)),
     rf"accumulate: psums: expected {PSUM_BITS}-bit signed group psums"),
])
def test_value_errors_name_the_function_and_parameter(call, words):
    with pytest.raises(QuantizationError, match="^" + words):
        call()


@pytest.mark.parametrize("call, words", [
    (lambda: scale_term(np.int64(3), np.float32(0.5)),
     r"scale_term: scale: expected FP16 group scales \(float16\), got dtype float32"),
    (lambda: scale_term(np.int64(3), 0.5),
     r"scale_term: scale: expected FP16 group scales \(float16\), got a float \(0\.5\)"),
    (lambda: accumulate(np.ones((1, 1, 2)), np.ones((1, 2), np.float16)),
     r"accumulate: psums: expected integer group psums, got dtype float64"),
    (lambda: accumulate([[[1, 2]], [[3]]], np.ones((1, 2), np.float16)),
     r"accumulate: psums: expected integer group psums, " + RAGGED_MSG),
    (lambda: fp16_scale_for(None),
     r"fp16_scale_for: amax: expected real magnitudes \(float or integer, >= 0\), got a "
     r"NoneType \(None\)"),
    (lambda: fp16_scale_for("abc"), r"fp16_scale_for: amax: .* got a str \('abc'\)"),
    (lambda: fp16_scale_for(1j), r"fp16_scale_for: amax: .* got a complex \(1j\)"),
    (lambda: fp16_scale_for(np.array([1 + 0j])), r"fp16_scale_for: amax: .* got dtype "
                                                  r"complex128"),
    (lambda: fp16_scale_for([True]), r"fp16_scale_for: amax: .* got dtype bool"),
    (lambda: fp16_scale_for(RAGGED), r"fp16_scale_for: amax: .*" + RAGGED_MSG),
])
def test_type_errors_name_the_function_and_parameter(call, words):
    with pytest.raises(QuantizationTypeError, match="^" + words + "$"):
        call()


def test_fp16_scale_for_still_takes_every_real_magnitude():
    want = fp16_scale_for(np.array([0.0, 1.0, 127.0, 2.0 ** 70]))
    for amax in ([0, 1, 127, 2 ** 70], [0.0, 1.0, 127.0, 2.0 ** 70],
                 np.array([0, 1, 127, 2 ** 40], np.int64)):
        scale, ok = fp16_scale_for(amax)
        n = 3 if isinstance(amax, np.ndarray) else 4
        assert np.array_equal(scale[:n], want[0][:n]) and np.array_equal(ok[:n], want[1][:n])


# --- 7. decode and dequantize ---------------------------------------------------------------

def test_streamed_job_decode_names_a_missing_result():
    x, w = _layer()
    job = build_streamed_linear_program(x, w, config=preset("small"))
    for bad in (None, job, np.zeros(4)):
        with pytest.raises(TypeError, match=r"^decode: result: expected the result of a run "
                                            r"\(job\.run_fsim\(\), or anything with \.data\(\)\), "
                                            rf"got {type(bad).__name__}$"):
            job.decode(bad)


def test_dequantize_docstring_says_where_it_is_not_exact():
    with np.errstate(over="ignore"):
        assert np.isinf(QuantizedActivation(q=np.int8([[1]]), exp=[2000]).dequantize()).all()
        edge = quantize_activations([np.finfo(np.float64).max, 1.0])
        assert edge.exp == 1018 and edge.q[0] == 64 and np.isinf(edge.dequantize()[0])
    doc = " ".join(QuantizedActivation.dequantize.__doc__.split())
    assert "(exact)" not in doc and "exp = 2000" in doc and "2^1024 - 2^1017" in doc


@pytest.mark.parametrize("call, words", [
    (lambda: gemm(RAGGED, quantize_weights(np.ones((2, 32)))), r"gemm: a_q: expected int8 "
                                                               r"activation codes \[M, K\], "),
    (lambda: gemm_reference(RAGGED, quantize_weights(np.ones((2, 32)))),
     r"gemm_reference: a_q: expected int8 activation codes \[M, K\], "),
    (lambda: acc_to_float(RAGGED, [0, 0]), r"acc_to_float: acc: expected int64 Q\.24 "
                                           r"accumulators \[M, N\], "),
    (lambda: acc_to_float(np.zeros((2, 1), np.int64), [[0], []]),
     r"acc_to_float: act_exp: expected integer exponents \[M\], "),
    (lambda: QuantizedActivation(q=np.zeros((2, 2, 1), np.int8), exp=RAGGED),
     r"QuantizedActivation: exp: expected integer exponents \[\.\.\.\], "),
])
def test_the_other_array_operands_name_ragged_lists(call, words):
    """The same review: the GEMM's, acc_to_float's and QuantizedActivation's other array
    operands turned ragged lists into NumPy's error too."""
    with pytest.raises(QuantizationTypeError, match="^" + words + RAGGED_MSG):
        call()

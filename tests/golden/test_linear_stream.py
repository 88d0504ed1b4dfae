"""The streamed linear-layer program (``sw/golden/linear_stream.py``): bit-exact against
``ref_linear`` on the functional simulator for random, corner-case and real (MiniLM) inputs, x
resident and streamed, FP32 and raw outputs, on the small, mid and paper PEs; ``ref_linear``
against a float64 reference; one-line errors for what a PE cannot stage.
(The RTL runs of the program: tests/amaranth/test_pe.py, tests/host/test_pe_cycles.py.)"""

import dataclasses

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.sw.golden.asm import ProgramError
from elmoe3d.sw.golden.datapath import Mode
from elmoe3d.sw.golden.linear_stream import (build_streamed_linear_program, plan_linear_stream,
                                             ref_linear)
from elmoe3d.sw.golden.quant import quantize_weights

SEED = 2612


def _check(x, w, mode, config, raw_output=None):
    job = build_streamed_linear_program(x, w, mode, config, raw_output=raw_output)
    res = job.run_fsim()
    got = job.decode(res)
    ref = ref_linear(x, w, mode)
    assert got.shape == ref.y.shape == (len(x), np.shape(w)[0] if not hasattr(w, "q")
                                        else w.q.shape[0])
    mismatches = int((got.view(np.uint32) != ref.y.view(np.uint32)).sum())
    assert mismatches == 0, f"{mismatches} of {got.size} FP32 outputs differ"
    assert bool(res.statuses()[-1]["acc_overflow"]) == ref.acc_overflow
    assert bool(res.statuses()[-1]["vpu_saturation"]) == ref.vpu_saturation
    return job


@pytest.mark.parametrize("arch,K,N,T,x_stream", [
    ("small", 64, 96, 3, False), ("small", 256, 100, 17, False),
    ("mid", 2048, 200, 5, False), ("mid", 96, 40, 1, False),
    ("paper-4gb", 2048, 256, 17, True), ("paper-4gb", 128, 300, 4, False),
    ("paper-4gb", 2880, 128, 2, True),
])
@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.FULL])
def test_random_bit_exact(arch, K, N, T, x_stream, mode):
    seed = SEED + K + N + T
    print(f"seed {seed}: {arch} K={K} N={N} T={T} {mode.name}")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(T, K))
    w = rng.normal(size=(N, K)) * 0.05
    job = _check(x, w, mode, preset(arch))
    assert job.plan.x_stream == x_stream
    R = preset(arch).pe.rows
    assert job.info["tiles"] == -(-T // R)
    # every weight word streams once per token tile: one beat a group and column block (two
    # in FULL: LSB_ONLY + MSB_ONLY)
    blocks = job.plan.out_padded // preset(arch).tile.lanes
    assert job.info["gemm_beats"] == (2 if mode is Mode.FULL else 1) * blocks * K // 32 \
        * job.info["tiles"]


def test_raw_and_fp32_outputs_agree():
    """The mid PE holds an FP32 OUT chunk: OUTPUT FP32 and OUTPUT raw (converted on the host as
    the PE would) give the same bits; the paper PE does not, so it defaults to raw."""
    rng = np.random.default_rng(SEED)
    x, w = rng.normal(size=(3, 256)), rng.normal(size=(160, 256))
    a = _check(x, w, Mode.FULL, preset("mid"), raw_output=False)
    b = _check(x, w, Mode.FULL, preset("mid"), raw_output=True)
    assert not a.plan.raw_output and b.plan.raw_output
    assert plan_linear_stream(256, 160, preset("paper-4gb")).raw_output


def test_corner_tokens():
    """An all-zero token, a token of large values and one of tiny values beside normal ones;
    INT8 weight codes at both ends (-128 and 127 in one group)."""
    rng = np.random.default_rng(SEED + 1)
    x = rng.normal(size=(5, 512))
    x[0] = 0
    x[2] *= 1e4
    x[3] *= 1e-4
    w = rng.normal(size=(64, 512))
    w[0, :32] = np.where(np.arange(32) % 2, 1.0, -1.0)
    qw = quantize_weights(w, name="w")
    assert qw.q.min() == -128 or qw.q.max() == 127
    for mode in (Mode.DRAFT, Mode.FULL):
        for arch in ("small", "paper-4gb"):
            _check(x, qw, mode, preset(arch))
    assert not np.any(ref_linear(x, qw, Mode.FULL).y[0])


def test_k_chained_and_streamed_x_on_a_small_act():
    """An ACT of 8 words on the small PE: K = 512 (16 groups) streams in 4-group slots, each
    column block K-chained over 4 buffer-fulls."""
    cfg = dataclasses.replace(preset("small"), name="small-act8", iomem_bytes=4096,
                              iomem_split=(4, 2, 2, 24))
    rng = np.random.default_rng(SEED + 2)
    x, w = rng.normal(size=(3, 512)), rng.normal(size=(48, 512))
    for mode in (Mode.DRAFT, Mode.FULL):
        job = _check(x, w, mode, cfg)
        assert job.plan.x_stream and (cfg.pe.act_words, job.plan.x_chunk) == (8, 4)
        gemms = [c.fields for c in job.program if c.op.name == "GEMM"]
        assert sum(g["acc_hold"] for g in gemms) and sum(g["acc_cont"] for g in gemms)


def test_ref_linear_against_float():
    """The golden layer is the float layer up to INT8 quantization: relative error well under
    the INT8 step on a random layer (FULL), larger but bounded in DRAFT (4-bit MSB slices)."""
    rng = np.random.default_rng(SEED + 3)
    x, w = rng.normal(size=(8, 1024)), rng.normal(size=(256, 1024)) * 0.02
    ref = x @ w.T
    for mode, bound in ((Mode.FULL, 0.02), (Mode.DRAFT, 0.2)):
        y = ref_linear(x, w, mode).y
        err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        print(f"{mode.name}: relative error {err:.4f}")
        assert err < bound


def test_real_minilm_layers_bit_exact(minilm_file):
    """Real trained weights and their real inputs: all-MiniLM-L6-v2's layer-2 FFN, its up
    projection (384 -> 1536) on the FFN input and its down projection (1536 -> 384) on the
    GELU output (two plain linear layers), on the paper PE and the mid PE."""
    from elmoe3d.sw.host import minilm
    up, down = minilm.ffn_weights(2)
    ffn_in, ffn_mid = minilm.ffn_activations(["The PE array runs every GEMM of the decoder.",
                                              "Hybrid bonding stacks DRAM on logic."], 2)
    print(f"{len(ffn_in)} real tokens")
    for arch in ("paper-4gb", "mid"):
        for mode in (Mode.DRAFT, Mode.FULL):
            _check(ffn_in, up, mode, preset(arch))
            _check(ffn_mid, down, mode, preset(arch))


@pytest.mark.parametrize("K,N,cfg,match", [
    (100, 64, "mid", "K = 100 is not a positive multiple of 32"),
    (0, 64, "mid", "K = 0 is not a positive multiple of 32"),
    (64, 0, "mid", "N = 0: expected at least one output channel"),
])
def test_plan_errors(K, N, cfg, match):
    with pytest.raises(ProgramError, match=match):
        plan_linear_stream(K, N, preset(cfg))


def test_plan_refuses_non_integer_features():
    with pytest.raises(ProgramError, match=r"linear layer: out_features: expected an integer, "
                                           r"got 2.5"):
        plan_linear_stream(64, 2.5, preset("mid"))


def test_out_overflow_names_the_memory():
    cfg = dataclasses.replace(preset("paper-4gb"), iomem_split=(14, 1, 16, 1))
    with pytest.raises(ProgramError,
                       match=r"linear K=64 -> N=64: OUT overflows: .* need 16 of the 2 OUT words"):
        plan_linear_stream(64, 64, cfg)


def test_build_errors():
    rng = np.random.default_rng(SEED)
    x, w = rng.normal(size=(2, 64)), rng.normal(size=(32, 64))
    with pytest.raises(ValueError, match=r"x: expected \[T, K=64\] \(w is \[N=32, K=64\], "
                                         r"PyTorch Linear layout\), got \(2, 96\)"):
        build_streamed_linear_program(rng.normal(size=(2, 96)), w, Mode.FULL, preset("mid"))
    with pytest.raises(ValueError,
                       match="mode: a linear layer runs in FULL or DRAFT, not LSB_ONLY"):
        build_streamed_linear_program(x, w, Mode.LSB_ONLY, preset("mid"))
    with pytest.raises(ValueError, match=r"mode: expected one of \['FULL', 'DRAFT'\], got 7"):
        ref_linear(x, w, 7)
    # a transposed weight is named as such: x's K against w's [N, K]
    with pytest.raises(ValueError, match=r"\(w is \[N=64, K=32\], PyTorch Linear layout\)"):
        ref_linear(x, w.T)
    with pytest.raises(ValueError, match=r"x: expected \[T, K=64\]"):
        ref_linear(rng.normal(size=(2, 96)), w)
    with pytest.raises(ProgramError, match="do not fit the TOK entry's signed 8-bit e_x"):
        build_streamed_linear_program(x * 1e40, w, Mode.FULL, preset("mid"))

"""The streamed expert program (``sw/golden/expert_stream.py``) for real expert shapes: bit-exact
against ``ref_moe`` on the functional simulator, K-chained GEMMs, and a one-line error naming the
memory for every shape a PE cannot stage. Weights are synthetic (seeded normal), in each model's
real shape (``MODEL_PRESETS``)."""

import dataclasses

import numpy as np
import pytest

from elmoe3d.config import PEConfig, preset
from elmoe3d.sw.golden.asm import ProgramError
from elmoe3d.sw.golden.datapath import Mode
from elmoe3d.sw.golden.expert import ref_moe
from elmoe3d.sw.golden.expert_stream import build_streamed_expert_program, plan_expert_stream
from elmoe3d.sw.host.models import MODEL_PRESETS
from elmoe3d.sw.host.shape_sweep import synthetic_expert

SEED = 2024
SWIGLU_MODELS = sorted(n for n, p in MODEL_PRESETS.items() if p.ffn == "swiglu")


def _case(hidden, inter, tokens, seed):
    print(f"seed {seed}: H={hidden} I={inter} T={tokens}")
    return synthetic_expert(hidden, inter, tokens, seed)


def _check(x, ex, gw, mode, config):
    job = build_streamed_expert_program(x, ex, gw, mode, config)
    res = job.run_fsim()
    got = job.decode(res)
    t = len(x)
    ref = ref_moe(x, [ex], (np.zeros((t, 1), np.int64), gw.astype(np.float16)[:, None]), mode)
    mismatches = int((got.view(np.uint32) != ref.y.view(np.uint32)).sum())
    assert mismatches == 0, f"{mismatches} of {got.size} FP32 outputs differ"
    assert res.statuses()[-1]["acc_overflow"] == ref.acc_overflow
    assert res.statuses()[-1]["vpu_saturation"] == ref.vpu_saturation
    return job


#: (model, tokens) run in make test; every SwiGLU preset at 1, 4 and 16 tokens in both modes is
#: the shape sweep of ``make bench`` (``elmoe3d.sw.host.shape_sweep``)
MID_CASES = [("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 16), ("olmoe-1b-7b", 4)]


@pytest.mark.parametrize("model,tokens", MID_CASES)
@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.FULL])
def test_real_shapes_bit_exact_on_mid(model, tokens, mode):
    p = MODEL_PRESETS[model]
    x, ex, gw = _case(p.hidden, p.expert_intermediate, tokens, SEED + tokens)
    job = _check(x, ex, gw, mode, preset("mid"))
    info = job.info
    R = preset("mid").pe.rows
    assert info["tiles"] == -(-tokens // R)
    # the weights stream once per token tile; DRAFT loads no LSB plane
    msb_words = 3 * p.hidden * p.expert_intermediate // 32 // preset("mid").tile.lanes
    planes = 2 if mode is Mode.FULL else 1
    assert info["weight_words"] > planes * msb_words * info["tiles"]
    assert info["gemm_beats"] == planes * msb_words * info["tiles"]


def test_k_chained_gemms_bit_exact():
    """A WMEM of 16 words a plane cuts every up/gate column block (64 groups) into 4 K-chained
    GEMMs and every down block (24 groups) into 2; a partial last token tile."""
    cfg = dataclasses.replace(preset("mid"), wmem_bytes=8 << 10)
    x, ex, gw = _case(2048, 768, 5, SEED)
    for mode in (Mode.DRAFT, Mode.FULL):
        job = _check(x, ex, gw, mode, cfg)
        gemms = [c.fields for c in job.program if c.op.name == "GEMM"]
        assert sum(g["acc_hold"] for g in gemms) > 0 and sum(g["acc_cont"] for g in gemms) > 0
        if mode is Mode.FULL:
            assert {g["mode"] for g in gemms} == {int(Mode.LSB_ONLY), int(Mode.MSB_ONLY)}


def test_corner_tokens():
    """An all-zero token and a token of large values beside normal ones."""
    x, ex, gw = _case(2048, 768, 3, SEED + 7)
    x[0] = 0
    x[2] *= 1e4
    for mode in (Mode.DRAFT, Mode.FULL):
        _check(x, ex, gw, mode, preset("mid"))


@pytest.mark.parametrize("model,tokens,mode", [("deepseek-v2-lite", 1, Mode.DRAFT),
                                               ("deepseek-v2-lite", 1, Mode.FULL),
                                               ("glm-4.7-flash", 5, Mode.DRAFT)])
def test_two_passes_bit_exact(model, tokens, mode):
    """I too large for HBUF: two passes over up/gate (the first for the row max, the second
    chunk by chunk with max_keep and a REQUANT per chunk); x stays resident above the codes."""
    p = MODEL_PRESETS[model]
    x, ex, gw = _case(p.hidden, p.expert_intermediate, tokens, SEED + 11)
    job = _check(x, ex, gw, mode, preset("mid"))
    assert job.info["passes"] == 2 and not job.info["x_stream"]
    gemms = [c.fields for c in job.program if c.op.name == "GEMM"]
    assert any(g["max_keep"] for g in gemms)


@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.FULL])
def test_streamed_x_bit_exact(mode):
    """x (H = 4096: 128 ACT words) does not fit ACT: each up/gate buffer-full brings its K chunk
    of x into one of two fenced ACT slots."""
    x, ex, gw = _case(4096, 512, 5, SEED + 12)
    job = _check(x, ex, gw, mode, preset("mid"))
    assert job.info["x_stream"] and job.info["passes"] == 1
    assert job.info["act_words"] > job.info["tiles"] * (4096 // 32) * 2


#: (arch, model) -> what happens: "runs", or the memory the one-line error names
EXPECTED = {("mid", "mixtral-8x7b"): "ACT overflows"}


@pytest.mark.parametrize("model", SWIGLU_MODELS)
@pytest.mark.parametrize("arch", ["mid", "paper-4gb"])
def test_every_preset_runs_or_is_refused_naming_the_memory(model, arch):
    """On mid every SwiGLU preset but Mixtral-8x7B streams through one PE; the paper PE alone
    (32 KB IOMEM, 16-row tile) holds no real expert: its ACT cannot hold a row block's h codes
    beside two x slots (GPT-OSS-20B's I = 2880 is not whole 128-value HBUF words)."""
    p = MODEL_PRESETS[model]
    want = EXPECTED.get((arch, model), "runs" if arch == "mid" else "ACT overflows")
    if (arch, model) == ("paper-4gb", "gpt-oss-20b"):
        want = "not a multiple of 128"
    try:
        plan = plan_expert_stream(p.hidden, p.expert_intermediate, preset(arch))
    except ProgramError as e:
        msg = str(e)
        assert "\n" not in msg and f"H={p.hidden}" in msg and want in msg, msg
        return
    assert want == "runs"
    pe = preset(arch).pe
    assert plan.h_base + plan.h_act <= pe.act_words
    assert pe.rows * plan.i_chunk // pe.q16_per_word <= pe.hbuf_words


TINY = dict(rows=4, lanes=8, word_bits=1024, wmem_words=64, act_words=200, tok_words=8,
            hbuf_words=16, out_words=24)


@pytest.mark.parametrize("hidden,inter,pe,what", [
    (2040, 768, {}, "H = 2040 is not a multiple of 32"),
    (2048, 770, {}, "I = 770 is not a multiple of 32"),
    (4096, 14336, {}, "ACT overflows: a row block's h codes .I/32 = 448 words."),
    (2048, 768, dict(hbuf_words=2), "HBUF overflows"),
    (2048, 768, dict(out_words=4), "OUT overflows"),
    (2048, 768, dict(tok_words=0), "TOK overflows"),
])
def test_bad_shapes_one_line_error(hidden, inter, pe, what):
    config = PEConfig(**{**TINY, **pe}) if pe else preset("mid")
    with pytest.raises(ProgramError, match=what) as e:
        plan_expert_stream(hidden, inter, config)
    assert "\n" not in str(e.value)


def test_bad_mode_and_missing_config():
    x, ex, gw = _case(2048, 768, 1, SEED)
    with pytest.raises(ValueError, match="mode: an expert runs in FULL or DRAFT"):
        build_streamed_expert_program(x, ex, gw, Mode.LSB_ONLY, preset("mid"))
    with pytest.raises(TypeError, match="config="):
        build_streamed_expert_program(x, ex, gw, Mode.FULL)

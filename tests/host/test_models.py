"""Model presets (elmoe3d.sw.host.models): figures against the paper's Table 2 and the traces'
README, byte sizes, the routers' order of operations, lookup errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from elmoe3d.errors import UserError
from elmoe3d.sw.host.models import MODEL_PRESETS, MODEL_SOURCES, ModelPreset, model_preset


# Paper Table 2: (total experts, shared, top-k); the traces README: Mixtral 8 top-2, OLMoE 64
# top-8. Independent of the config.json figures typed in sw/host/models.py.
PAPER_TABLE2 = {"qwen3-30b-a3b": (128, 0, 8), "glm-4.7-flash": (64, 1, 4),
                "deepseek-v2-lite": (64, 2, 6), "gpt-oss-20b": (32, 0, 4)}
TRACES_README = {"mixtral-8x7b": (8, 2), "olmoe-1b-7b": (64, 8)}


def test_the_eight_presets_exist():
    assert set(MODEL_PRESETS) == (set(PAPER_TABLE2) | set(TRACES_README)
                                  | {"qwen1.5-moe-a2.7b", "switch-base-128"})


def test_switch_base_128_every_other_encoder_block_two_matrix_experts():
    """google/switch-base-128: encoder_sparse_step=2 makes blocks 1, 3, ..., 11 sparse; top-1
    of 128; ReLU experts wi [3072, 768] and wo [768, 3072]: 2 x 768 x 3072 weights."""
    p = model_preset("switch-base-128")
    assert list(p.moe_layer_ids) == [1, 3, 5, 7, 9, 11] and p.moe_layers == 6
    assert (p.routed_experts, p.top_k, p.norm_topk_prob, p.ffn) == (128, 1, False, "relu")
    assert p.expert_weights == 2 * 768 * 3072 and p.ffn_matrices == 2
    assert model_preset("mixtral-8x7b").ffn_matrices == 3


@pytest.mark.parametrize("model_id, name", [
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"), ("MIXTRAL-8x7b", "mixtral-8x7b"),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
    ("allenai/OLMoE-1B-7B-0924-Instruct", "olmoe-1b-7b"), ("google/switch-base-128",
                                                          "switch-base-128"),
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
    ("deepseek-ai/DeepSeek-V3-Lite", None),
    ("mistralai/Mixtral-8x22B-v0.1", None), ("Qwen/Qwen3-235B-A22B", None), ("gpt2", None)])
def test_preset_for_model_id(model_id, name):
    from elmoe3d.sw.host.models import preset_for_model_id
    p = preset_for_model_id(model_id)
    assert (p.name if p else None) == name


@pytest.mark.parametrize("name", sorted(PAPER_TABLE2))
def test_paper_table2(name):
    p = model_preset(name)
    assert (p.routed_experts, p.shared_experts, p.top_k) == PAPER_TABLE2[name]


@pytest.mark.parametrize("name", sorted(TRACES_README))
def test_trace_models(name):
    p = model_preset(name)
    assert (p.routed_experts, p.top_k) == TRACES_README[name]


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_every_figure_has_a_source(name):
    p = model_preset(name)
    src = MODEL_SOURCES[name]
    assert p.hf_repo.count("/") == 1
    for attr in ("layers", "hidden", "expert_intermediate", "routed_experts", "top_k",
                 "norm_topk_prob", "scoring"):
        assert src.get(attr), (name, attr)
    if p.first_dense_layers:
        assert str(p.first_dense_layers) in src["first_dense_layers"]
    if p.shared_experts:
        assert src.get("shared_experts")
    if p.routed_scaling_factor != 1.0:
        assert str(p.routed_scaling_factor) in src["routed_scaling_factor"]
    # each integer figure appears in its cited field
    for attr in ("layers", "hidden", "expert_intermediate", "routed_experts", "top_k"):
        assert f"={getattr(p, attr)}" in src[attr], (name, attr)


def test_moe_layers():
    ds = model_preset("deepseek-v2-lite")
    assert ds.moe_layers == 26 and list(ds.moe_layer_ids)[:2] == [1, 2]
    assert model_preset("mixtral-8x7b").moe_layer_ids == range(32)


def test_slice_bytes_by_hand():
    p = model_preset("Mixtral-8x7B")                      # case-insensitive
    w = 3 * 4096 * 14336
    assert p.expert_weights == w
    assert p.expert_msb_bytes == w // 2 + (w // 32) * 2   # 4-bit plane + FP16 scale per 32
    assert p.expert_lsb_bytes == w // 2
    assert p.expert_bytes == w + (w // 32) * 2            # INT8 + scales
    g = model_preset("gpt-oss-20b")                       # MXFP4: 4 bits + E8M0 per 32, no LSB
    wg = 3 * 2880 * 2880
    assert (g.expert_msb_bytes, g.expert_lsb_bytes) == (wg // 2 + wg // 32, 0)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(UserError) as e:
        model_preset("mixtral-8x22b")
    for name in MODEL_PRESETS:
        assert name in str(e.value)
    assert model_preset(model_preset("olmoe-1b-7b")) is MODEL_PRESETS["olmoe-1b-7b"]


def test_preset_validation_names_the_field():
    base = dict(name="x", hf_repo="a/b", layers=2, first_dense_layers=0, hidden=64,
                expert_intermediate=32, routed_experts=4, shared_experts=0,
                shared_intermediate=0, top_k=2, norm_topk_prob=True, scoring="softmax")
    ModelPreset(**base)
    for change, word in ((dict(top_k=5), "top_k"), (dict(scoring="relu"), "scoring"),
                         (dict(first_dense_layers=2), "first_dense_layers"),
                         (dict(hidden=48), "multiples"), (dict(layers=True), "layers"),
                         (dict(shared_experts=1), "shared")):
        with pytest.raises(ValueError, match=word):
            ModelPreset(**{**base, **change})


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_mixtral_router_equals_softmax_over_the_topk_logits(seed):
    """softmax -> top-k -> renormalise equals softmax over the k largest logits (GPT-OSS's
    formulation): the order of operations is right, and raw logits are never the weights."""
    p = model_preset("mixtral-8x7b")
    z = np.random.default_rng(seed).normal(0, 3, (5, 8))
    ids, w, s = p.route(z)
    top = np.argsort(-z, axis=1, kind="stable")[:, :2]
    np.testing.assert_array_equal(ids, top)
    np.testing.assert_allclose(w, _softmax(np.take_along_axis(z, top, 1)), rtol=1e-12)
    np.testing.assert_allclose(s, _softmax(z), rtol=1e-12)


def test_olmoe_router_keeps_the_unrenormalised_probabilities():
    p = model_preset("olmoe-1b-7b")
    z = np.random.default_rng(1).normal(0, 1, (3, 64))
    ids, w, s = p.route(z)
    np.testing.assert_allclose(w, np.take_along_axis(_softmax(z), ids.astype(int), 1))
    assert (w.sum(1) < 1).all()


def test_glm_router_is_sigmoid_renormalised_and_scaled():
    p = model_preset("glm-4.7-flash")
    z = np.random.default_rng(2).normal(0, 1, (4, 64))
    ids, w, s = p.route(z)
    sig = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(s, sig)
    sel = np.take_along_axis(sig, ids.astype(int), 1)
    np.testing.assert_allclose(w, 1.8 * sel / sel.sum(1, keepdims=True))
    # a selection bias moves the choice, not the weights' source (noaux_tc)
    bias = np.zeros(64)
    bias[5] = 10.0
    ids_b, w_b, _ = p.route(z, selection_bias=bias)
    assert (ids_b[:, 0] == 5).all()
    sel_b = np.take_along_axis(sig, ids_b.astype(int), 1)
    np.testing.assert_allclose(w_b, 1.8 * sel_b / sel_b.sum(1, keepdims=True))


def test_router_ties_and_errors():
    p = model_preset("mixtral-8x7b")
    ids, _, _ = p.route(np.zeros((1, 8)))
    assert ids.tolist() == [[0, 1]]                       # ties to the lower id
    with pytest.raises(ValueError, match="NaN"):
        p.route(np.full((1, 8), np.nan))
    with pytest.raises(ValueError, match=r"\[\.\.\., 8\]"):
        p.route(np.zeros((1, 7)))
    with pytest.raises(ValueError, match="selection_bias"):
        p.route(np.zeros((1, 8)), selection_bias=np.zeros(3))


def test_g32_byte_rule_written_once():
    """Review of issue 26, nit 13: decoder.weight_bytes and the expert slice sizes share
    models.g32_bytes."""
    from elmoe3d.sw.host.decoder import weight_bytes
    from elmoe3d.sw.host.models import g32_bytes
    assert weight_bytes(64) == g32_bytes(64) == 64 + 2 * 2
    for name in ("qwen3-30b-a3b", "gpt-oss-20b"):
        m = model_preset(name)
        scale = 2 if m.expert_format == "int8-nested" else 1
        assert m.expert_msb_bytes == g32_bytes(m.expert_weights, 4, scale)
        assert m.expert_scale_bytes == g32_bytes(m.expert_weights, 0, scale)

"""Models from a Hugging Face ``config.json`` (``sw/host/hf_config.py``): every preset with a
whole-decoder shape (and OLMoE's and Qwen1.5-MoE's routing presets) is its own config read by
the loader (the fields below are typed from the published ``config.json`` files, the values
:data:`~.models.MODEL_SOURCES` and :data:`~.decoder.DECODER_SOURCES` cite); DeepSeek-V3's,
GLM-4.5's and Qwen3-235B-A22B's configs give their published parameter counts; a loaded model
runs through the whole-decoder model and a sweep as a preset of the same figures; bad configs
are one clear error naming the file and the config field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import elmoe3d.cli as cli
from elmoe3d.errors import UserError
from elmoe3d.sw.host import hf_config, paper_eval as pe, sweep_tasks
from elmoe3d.sw.host.decoder import DECODER_SHAPES, decoder_shape, weight_bytes
from elmoe3d.sw.host.hf_config import (default_name, load_model, model_figures,
                                       model_from_config, register_figures, same_figures)
from elmoe3d.sw.host.models import MODEL_PRESETS, model_preset
from elmoe3d.sw.host.sweep_spec import expand, parse_spec

#: The fields the loader reads of each preset's published config.json (the rest of each file,
#: rope, norms, token ids, is not read).
CONFIGS = {
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "vocab_size": 151936, "sliding_window": None,
        "use_sliding_window": False, "max_window_layers": 48},
    "glm-4.7-flash": {
        "model_type": "glm4_moe_lite", "num_hidden_layers": 47, "hidden_size": 2048,
        "intermediate_size": 10240, "moe_intermediate_size": 1536, "n_routed_experts": 64,
        "n_shared_experts": 1, "num_experts_per_tok": 4, "first_k_dense_replace": 1,
        "norm_topk_prob": True, "routed_scaling_factor": 1.8, "topk_method": "noaux_tc",
        "n_group": 1, "topk_group": 1, "num_attention_heads": 20, "num_key_value_heads": 20,
        "q_lora_rank": 768, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64, "v_head_dim": 256, "vocab_size": 154880,
        "num_nextn_predict_layers": 1},
    "deepseek-v2-lite": {
        "model_type": "deepseek_v2", "num_hidden_layers": 27, "hidden_size": 2048,
        "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
        "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
        "moe_layer_freq": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
        "scoring_func": "softmax", "topk_method": "greedy", "num_attention_heads": 16,
        "num_key_value_heads": 16, "q_lora_rank": None, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "vocab_size": 102400},
    "gpt-oss-20b": {
        "model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880,
        "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
        "experts_per_token": 4, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "vocab_size": 201088, "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
        "quantization_config": {"quant_method": "mxfp4"}},
    "mixtral-8x7b": {
        "model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
        "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "sliding_window": None},
    "olmoe-1b-7b": {
        "model_type": "olmoe", "num_hidden_layers": 16, "hidden_size": 2048,
        "intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8,
        "norm_topk_prob": False, "num_attention_heads": 16, "num_key_value_heads": 16,
        "vocab_size": 50304},
    "qwen1.5-moe-a2.7b": {
        "model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048,
        "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_experts": 60,
        "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
        "norm_topk_prob": False, "decoder_sparse_step": 1, "num_attention_heads": 16,
        "num_key_value_heads": 16, "vocab_size": 151936, "sliding_window": 32768,
        "use_sliding_window": False, "max_window_layers": 21},
}


#: Every test here leaves the model registries as it found them.
pytestmark = pytest.mark.usefixtures("model_registries")


#: Configs of models the project has no preset for, with their published totals (billions of
#: weights, the input embedding included) and active weights a token.
OTHERS = {
    "deepseek-v3": ({
        "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "moe_layer_freq": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid", "n_group": 8, "topk_group": 4, "num_attention_heads": 128,
        "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "vocab_size": 129280, "num_nextn_predict_layers": 1}, 671, 37),
    "glm-4.5": ({
        "model_type": "glm4_moe", "num_hidden_layers": 92, "hidden_size": 5120,
        "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_routed_experts": 160,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "num_attention_heads": 96,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151552,
        "num_nextn_predict_layers": 1}, 355, 32),
}


def _totals(preset, shape):
    """(all weights, active weights a token), the input embedding included, in billions."""
    z = shape.sizes()
    embed = shape.vocab * preset.hidden
    active = (z.static + preset.moe_layers * preset.top_k * preset.expert_weights + embed)
    return (z.static + z.experts + embed) / 1e9, active / 1e9


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_preset_is_its_config_json(name):
    preset, shape = model_from_config(CONFIGS[name], name=name)
    assert same_figures(preset, MODEL_PRESETS[name])
    assert not same_figures(preset, dataclasses.replace(preset, layers=preset.layers + 1))
    if name in DECODER_SHAPES:
        assert shape == DECODER_SHAPES[name]
    # the preset's own config under its name keeps the preset (no clash, nothing replaced)
    before = MODEL_PRESETS[name]
    assert load_model(CONFIGS[name], name=name) == name
    assert MODEL_PRESETS[name] is before


@pytest.mark.parametrize("name", list(OTHERS))
def test_other_models_have_their_published_sizes(name):
    """DeepSeek-V3 and GLM-4.5, read from their configs, have their published sizes (the
    published figures rounded; GLM-4.5's counts its multi-token-prediction layer)."""
    cfg, total, active = OTHERS[name]
    load_model(cfg, name=name)                      # the shape's sizes look the model up
    preset, shape = model_preset(name), decoder_shape(name)
    got_total, got_active = _totals(preset, shape)
    # the published figures round the real ones; GLM-4.5's 355B counts its MTP layer, which
    # decode does not run (about 2.5B of weights)
    assert got_total == pytest.approx(total, rel=0.01 if name != "glm-4.5" else 0.02)
    assert got_active == pytest.approx(active, rel=0.06)
    if name == "deepseek-v3":
        assert (preset.first_dense_layers, preset.moe_layers, preset.scoring) == (3, 58,
                                                                                "sigmoid")
        assert (preset.routed_scaling_factor, preset.shared_intermediate) == (2.5, 2048)
        assert (shape.attention, shape.q_lora_rank) == ("mla", 1536)
    else:
        assert (shape.attention, shape.kv_heads, shape.head_dim) == ("gqa", 8, 128)
        assert (preset.first_dense_layers, preset.shared_intermediate, preset.top_k) == (3, 1536,
                                                                                        8)


def test_the_example_config_is_qwen3_235b_a22b():
    """``examples/models/qwen3-235b-a22b.json`` gives 235.09B weights, 22.19B active."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "examples" / "models" / "qwen3-235b-a22b.json"
    name = load_model(path)
    assert name == "qwen3-235b-a22b"                          # from _name_or_path
    preset, shape = model_preset(name), decoder_shape(name)
    total, active = _totals(preset, shape)
    assert total == pytest.approx(235.09, abs=0.01) and active == pytest.approx(22.19, abs=0.01)


def test_every_whole_decoder_preset_has_its_config_here():
    assert set(DECODER_SHAPES) <= set(CONFIGS)


def test_a_loaded_model_runs_as_the_preset_of_the_same_figures(tmp_path):
    """Qwen3-30B-A3B's config loaded from a file under another name gives the preset's AR
    step and SD iteration to the last bit at the same Zipf exponent. (EAGLE-SD's head is
    looked up by name: the copy gets the placeholder head, whose shapes are Qwen3-30B-A3B's
    published head's, FFN 3 x hidden and the target's heads.)"""
    path = tmp_path / "my-qwen3" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(CONFIGS["qwen3-30b-a3b"]))
    name = load_model(path)
    assert name == "my-qwen3"                      # the folder of a config.json names it
    ours = pe.platform("ours", "4gb")
    z = pe.ZIPF["qwen3-30b-a3b"]
    for scheme in ("elastic", "eagle"):
        mine = pe.EvalModel(name, ours, scheme, batch=4, zipf=z)
        ref = pe.EvalModel("qwen3-30b-a3b", ours, scheme, batch=4)
        assert mine.ar().seconds == ref.ar().seconds
        a, b = mine.sd(0.5, *pe.TREE), ref.sd(0.5, *pe.TREE)
        assert (a.per_token_s, a.energy_pj_per_token) == (b.per_token_s, b.energy_pj_per_token)


def test_tied_embeddings_are_stored_once(tmp_path):
    """``tie_word_embeddings`` (False when absent, as every preset): a tied model's input
    embedding is its LM head's weights, so its LPDDR5 footprint (``ext_footprint``) holds them
    once; a value not true or false names the field."""
    untied = load_model(CONFIGS["qwen3-30b-a3b"], name="untied")
    tied = load_model({**CONFIGS["qwen3-30b-a3b"], "tie_word_embeddings": True}, name="tied")
    assert not decoder_shape(untied).tied_embeddings and decoder_shape(tied).tied_embeddings
    ours = pe.platform("ours", "4gb")
    a, b = (pe.EvalModel(n, ours, zipf=1.0).ext_footprint()["target weights"]
            for n in (untied, tied))
    shape = decoder_shape("qwen3-30b-a3b")
    assert a - b == pytest.approx(weight_bytes(shape.vocab * shape.model.hidden))
    with pytest.raises(UserError, match=r"tie_word_embeddings: expected true or false"):
        load_model({**CONFIGS["qwen3-30b-a3b"], "tie_word_embeddings": "yes"}, name="bad")


def test_layer_layouts_and_sliding_windows():
    q2 = CONFIGS["qwen1.5-moe-a2.7b"]
    # Qwen2-MoE: layer i is MoE when (i + 1) % decoder_sparse_step == 0
    p, s = model_from_config({**q2, "decoder_sparse_step": 2}, name="every-other")
    assert list(p.moe_layer_ids) == list(range(1, 24, 2)) and s.dense_intermediate == 5632
    p, _ = model_from_config({**q2, "mlp_only_layers": [0, 1]}, name="two-dense")
    assert (p.first_dense_layers, p.moe_layers) == (2, 22)
    # layer_types say which layers slide; Mixtral's sliding_window slides every layer
    kinds = ["full_attention"] * 20 + ["sliding_attention"] * 4
    _, s = model_from_config({**q2, "use_sliding_window": True, "layer_types": kinds},
                             name="slide")
    assert (s.sliding_window, s.sliding_layers) == (32768, 4)
    _, s = model_from_config({**CONFIGS["mixtral-8x7b"], "sliding_window": 4096}, name="m")
    assert (s.sliding_window, s.sliding_layers) == (4096, 32)
    # Qwen3-MoE has no shared expert whatever the config carries
    p, _ = model_from_config({**CONFIGS["qwen3-30b-a3b"],
                              "shared_expert_intermediate_size": 5632}, name="q3")
    assert p.shared_experts == 0
    # an integral number from another tool's JSON is an integer, a fraction is not
    assert model_from_config({**q2, "num_experts_per_tok": 4.0}, name="f")[0].top_k == 4
    with pytest.raises(UserError, match="num_experts_per_tok: expected a positive integer"):
        model_from_config({**q2, "num_experts_per_tok": 4.5}, name="f")
    # every G32 matrix on the grid: a shared expert or a dense FFN off it is refused
    with pytest.raises(UserError, match="shared_expert_intermediate_size: expected a multiple"):
        model_from_config({**q2, "shared_expert_intermediate_size": 100}, name="x")
    with pytest.raises(UserError, match="intermediate_size: expected a multiple"):
        model_from_config({**q2, "mlp_only_layers": [0], "intermediate_size": 100}, name="x")
    # GLM-4.7-Flash: mlp_layer_types decide (transformers reads them, not first_k_dense_replace)
    glm = {**CONFIGS["glm-4.7-flash"], "mlp_layer_types": ["dense"] * 2 + ["sparse"] * 45}
    del glm["first_k_dense_replace"]
    p, s = model_from_config(glm, name="g")
    assert (p.first_dense_layers, s.dense_intermediate) == (2, 10240)


def test_figures_travel_as_plain_data():
    name = load_model(CONFIGS["deepseek-v2-lite"], name="ds-copy")
    figures = json.loads(json.dumps(model_figures(name)))      # what a worker receives
    del MODEL_PRESETS[name], DECODER_SHAPES[name]
    assert register_figures(figures) == name
    assert same_figures(model_preset(name), dataclasses.replace(
        MODEL_PRESETS["deepseek-v2-lite"], name=name))
    assert decoder_shape(name) == dataclasses.replace(DECODER_SHAPES["deepseek-v2-lite"],
                                                      preset=name)
    # an edited config under the same name, in a long-lived session or worker: replaced
    edited = load_model({**CONFIGS["deepseek-v2-lite"], "num_hidden_layers": 9}, name=name)
    assert model_preset(edited).layers == 9
    assert register_figures(figures) == name and model_preset(name).layers == 27
    # a preset's name is never taken over
    with pytest.raises(UserError, match="model name 'deepseek-v2-lite' is a preset with other "
                                        "figures; give this model another name"):
        register_figures({**figures, "preset": {**figures["preset"],
                                                "name": "deepseek-v2-lite", "layers": 9},
                          "shape": {**figures["shape"], "preset": "deepseek-v2-lite"}})


def test_default_names(tmp_path):
    """A model's name without ``name=``: the Hugging Face cache's, the folder's, the file's,
    the ``_name_or_path``'s."""
    snap = tmp_path / "models--Qwen--Qwen3-235B-A22B" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    cfg = {k: v for k, v in CONFIGS["qwen3-30b-a3b"].items()}
    assert default_name(_cfg_file(snap, cfg)) == "qwen3-235b-a22b"     # the Hugging Face cache
    (tmp_path / "My-MoE").mkdir()
    assert default_name(_cfg_file(tmp_path / "My-MoE", cfg)) == "my-moe"
    assert default_name(_cfg_file(tmp_path, cfg, "other.json")) == "other"
    assert default_name({**cfg, "_name_or_path": "org/Some-Model/"}) == "some-model"
    assert default_name(cfg) is None


def _cfg_file(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return path


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.pop("num_experts"), "{f}: num_experts: missing (a qwen3_moe config has it)"),
    (lambda c: c.update(hidden_size="2048"),
     "{f}: hidden_size: expected a positive integer up to 16,777,216, got \"2048\""),
    (lambda c: c.update(hidden_size=2 ** 40),
     "{f}: hidden_size: expected a positive integer up to 16,777,216, got 1099511627776"),
    (lambda c: c.update(model_type=["qwen3_moe"]),
     "{f}: model_type: expected one of mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, "
     "deepseek_v3, glm4_moe, glm4_moe_lite, gpt_oss, got [\"qwen3_moe\"]"),
    (lambda c: c.update(experts_per_token=4),
     "{f}: num_experts_per_tok: disagrees with experts_per_token (4): got "
     "{{'num_experts_per_tok': 8, 'experts_per_token': 4}}"),
    (lambda c: c.update(num_experts=True), "{f}: num_experts: expected a positive integer up to "
     "16,777,216, got true"),
    (lambda c: c.pop("model_type"),
     "{f}: model_type: expected one of mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, "
     "deepseek_v3, glm4_moe, glm4_moe_lite, gpt_oss, missing"),
    (lambda c: c.pop("head_dim"), "{f}: head_dim: missing (a qwen3_moe config has it)"),
    (lambda c: c.pop("num_key_value_heads"),
     "{f}: num_key_value_heads: missing (a qwen3_moe config has it)"),
    (lambda c: c.update(layer_types=["slidng_attention"] * 48),
     "{f}: layer_types: layer 0: expected one of sliding_attention, full_attention, got "
     "\"slidng_attention\""),
    (lambda c: c.update(use_sliding_window="false"),
     "{f}: use_sliding_window: expected true or false, got \"false\""),
    (lambda c: c.update(use_sliding_window=True),
     "{f}: use_sliding_window: true without layer_types: give layer_types (which layers slide)"),
    (lambda c: c.update(mlp_only_layers=[False]),
     "{f}: mlp_only_layers: expected a list of layer indices 0 .. 47, got [false]"),
    (lambda c: c.update(mlp_only_layers=0),
     "{f}: mlp_only_layers: expected a list of layer indices 0 .. 47, got 0"),
    (lambda c: c.update(quantization_config="mxfp4"),
     "{f}: quantization_config: expected an object (quant_method, ...), got \"mxfp4\""),
    (lambda c: c.update(model_type="llama"),
     "{f}: model_type: expected one of mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, "
     "deepseek_v3, glm4_moe, glm4_moe_lite, gpt_oss, got \"llama\""),
    (lambda c: c.update(mlp_only_layers=[3]),
     "{f}: mlp_only_layers: [3] with decoder_sparse_step 1: only a leading run of dense layers "
     "(0 .. k-1) with every later layer MoE is supported"),
    (lambda c: c.update(moe_intermediate_size=700),
     "{f}: moe_intermediate_size: expected a multiple of the quantization group 32 (G32 "
     "weights), got 700"),
    (lambda c: c.update(num_key_value_heads=5),
     "{f}: num_key_value_heads: expected a divisor of num_attention_heads (32), got 5"),
    (lambda c: c.update(num_experts_per_tok=200),
     "{f}: num_experts_per_tok: expected at most the routed experts (128), got 200"),
    (lambda c: c.update(layer_types=["full_attention"]),
     "{f}: layer_types: expected a list of 48 layer kinds (num_hidden_layers), got "
     '["full_attention"]'),
    (lambda c: c.update(norm_topk_prob="yes"),
     "{f}: norm_topk_prob: expected true or false, got \"yes\""),
])
def test_a_bad_qwen3_config_names_the_file_and_the_field(tmp_path, edit, message):
    """One edit of Qwen3-30B-A3B's config, one exact line naming the file and the field."""
    cfg = json.loads(json.dumps(CONFIGS["qwen3-30b-a3b"]))
    edit(cfg)
    path = _cfg_file(tmp_path, cfg)
    with pytest.raises(UserError) as err:
        model_from_config(path, name="mine")
    assert str(err.value) == message.format(f=path)


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.pop("first_k_dense_replace"),
     "{f}: first_k_dense_replace: missing (a deepseek_v3 config has it)"),
    (lambda c: c.pop("n_shared_experts"),
     "{f}: n_shared_experts: missing (a deepseek_v3 config has it)"),
    (lambda c: c.pop("q_lora_rank"),
     "{f}: q_lora_rank: missing (a deepseek_v3 config has it; null for a plain q_proj)"),
    (lambda c: c.pop("routed_scaling_factor"),
     "{f}: routed_scaling_factor: missing (a deepseek_v3 config has it)"),
    (lambda c: c.update(routed_scaling_factor=float("inf")),
     "{f}: routed_scaling_factor: expected a finite number > 0, got Infinity"),
    (lambda c: c.update(routed_scaling_factor=10 ** 400),      # an audit: OverflowError
     "{f}: routed_scaling_factor: expected a finite number > 0, got 1" + "0" * 400),
    (lambda c: c.update(moe_layer_freq=2),
     "{f}: moe_layer_freq: only 1 (every layer after first_k_dense_replace is MoE) is "
     "supported, got 2"),
])
def test_a_bad_deepseek_v3_config_names_the_file_and_the_field(tmp_path, edit, message):
    """The fields ``transformers`` would default to DeepSeek-V3's own figures are required."""
    cfg = json.loads(json.dumps(OTHERS["deepseek-v3"][0]))
    edit(cfg)
    path = _cfg_file(tmp_path, cfg)
    with pytest.raises(UserError) as err:
        model_from_config(path, name="mine")
    assert str(err.value) == message.format(f=path)


def test_glm_flash_layer_kinds_must_agree(tmp_path):
    """GLM-4.7-Flash's dense layers come from ``mlp_layer_types`` (the first alone when it is
    absent or null), as ``transformers`` reads them; a ``first_k_dense_replace`` that says
    otherwise is refused, not silently preferred."""
    glm = {**CONFIGS["glm-4.7-flash"], "mlp_layer_types": ["dense"] * 2 + ["sparse"] * 45}
    with pytest.raises(UserError, match="first_k_dense_replace: 1 disagrees with the layer kinds "
                                        r"\(2 leading dense layers: mlp_layer_types, which "
                                        r"transformers reads\)"):
        model_from_config(glm, name="g")
    for kinds in (None, "absent"):
        cfg = {**CONFIGS["glm-4.7-flash"], "first_k_dense_replace": 3, "mlp_layer_types": kinds}
        if kinds == "absent":
            del cfg["mlp_layer_types"]
        with pytest.raises(UserError, match="first_k_dense_replace: 3 disagrees with the layer "
                                            r"kinds \(1 leading dense layers"):
            model_from_config(cfg, name="g")
        del cfg["first_k_dense_replace"]
        assert model_from_config(cfg, name="g")[0].first_dense_layers == 1
    glm["mlp_layer_types"] = ["sparse", "dense"] + ["sparse"] * 45
    with pytest.raises(UserError, match="mlp_layer_types: only a leading run of dense layers"):
        model_from_config(glm, name="g")


def test_a_checkpoint_folder_reads_its_config_json(tmp_path, monkeypatch):
    """A folder holding a ``config.json`` (a checkpoint's, as a new user gave a sweep's
    ``models:``) is read as that file, named after the folder; a folder without one is one
    error naming it (it was "cannot read the model config (Is a directory)")."""
    shipped = Path(__file__).resolve().parents[2] / "examples" / "models" / \
        "qwen3-235b-a22b.json"
    cfg = json.loads(shipped.read_text())
    cfg.pop("_name_or_path", None)
    folder = tmp_path / "My-MoE"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    preset, shape = model_from_config(folder)
    assert preset.name == "my-moe"
    # the folder given as '.' or '..' is named too (a review's: 'config' and a refusal)
    sub = folder / "sub"
    sub.mkdir()
    with monkeypatch.context() as m:
        m.chdir(folder)
        assert default_name(".") == "my-moe"
        m.chdir(sub)
        assert model_from_config("..")[0].name == "my-moe"
    assert (preset, shape) == model_from_config(folder / "config.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError) as exc:
        model_from_config(empty)
    assert str(exc.value) == (f"{empty}: a folder without a config.json (expected the model "
                              f"config or the folder that holds it)")


def test_unreadable_and_clashing_configs(tmp_path):
    with pytest.raises(UserError, match=r"nope\.json: cannot read the model config"):
        model_from_config(tmp_path / "nope.json")
    bad = _cfg_file(tmp_path, '{"model_type": "mixtral",\n "hidden_size": }', "bad.json")
    with pytest.raises(UserError, match=r"bad\.json: not JSON \(line 2: Expecting value\)"):
        model_from_config(bad)
    with pytest.raises(UserError, match=r"lst\.json: expected a JSON object of config fields, "
                                        r"got list"):
        model_from_config(_cfg_file(tmp_path, "[1, 2]", "lst.json"))
    # an audit (2026-12-06): a raw ValueError / RecursionError from json.loads
    huge = _cfg_file(tmp_path, '{"model_type": "mixtral", "x": 1' + "0" * 5000 + "}", "h.json")
    with pytest.raises(UserError, match=r"h\.json: not a config\.json this reader takes "
                                        r"\(Exceeds the limit \(4300 digits\)"):
        model_from_config(huge)
    deep = _cfg_file(tmp_path, "[" * 100000 + "]" * 100000, "d.json")
    with pytest.raises(UserError, match=r"d\.json: not a config\.json this reader takes"):
        model_from_config(deep)
    binary = tmp_path / "w.safetensors"
    binary.write_bytes(b"\x80\xff\x00" * 10)
    with pytest.raises(UserError, match=r"w\.safetensors: not a config\.json \(not UTF-8 "
                                        r"text\)"):
        model_from_config(binary)
    with pytest.raises(UserError, match="config: no name: pass name="):
        model_from_config(CONFIGS["mixtral-8x7b"])
    with pytest.raises(UserError, match="config: model name 'no way': expected letters"):
        model_from_config(CONFIGS["mixtral-8x7b"], name="no way")
    # another model under a taken name
    with pytest.raises(UserError, match="model name 'qwen3-30b-a3b' is a preset with other "
                                        "figures; give this model another name"):
        load_model(CONFIGS["glm-4.7-flash"], name="qwen3-30b-a3b")
    assert "qwen3-30b-a3b" in MODEL_PRESETS and MODEL_PRESETS["qwen3-30b-a3b"].hidden == 2048


# == in a sweep ===================================================================================

def test_a_sweep_runs_a_models_entry_on_a_worker_that_never_saw_the_file(tmp_path):
    """A spec's ``models:`` entry (relative to the spec) runs at the workload's Zipf exponent;
    the point carries the figures, so a worker registers the model without the file, and the
    result is the preset's of the same figures."""
    (tmp_path / "models").mkdir()
    _cfg_file(tmp_path / "models", CONFIGS["qwen3-30b-a3b"], "q3.json")
    spec = parse_spec({"models": {"copy-of-qwen3": "models/q3.json"},
                       "workload": {"model": ["copy-of-qwen3"], "batch": [4],
                                    "scheme": ["elastic"], "alpha": [0.57],
                                    "zipf": [pe.ZIPF["qwen3-30b-a3b"]]}},
                      path=str(tmp_path / "s.yaml"))
    (point,) = expand(spec)
    assert point.workload["zipf"] == 1.55 and point.figures is not None
    del MODEL_PRESETS["copy-of-qwen3"], DECODER_SHAPES["copy-of-qwen3"]      # a fresh worker
    got = sweep_tasks.perf_task(point)
    assert "copy-of-qwen3" in DECODER_SHAPES
    ref = parse_spec({"workload": {"model": ["qwen3-30b-a3b"], "batch": [4],
                                   "scheme": ["elastic"], "alpha": [0.57]}}, path="r.yaml")
    want = sweep_tasks.perf_task(expand(ref)[0])
    assert {k: got[k] for k in want} == want
    # the figures are part of the point's id: an edited config is another point
    other = parse_spec({"models": {"copy-of-qwen3": "models/q3.json"},
                        "workload": {"model": ["copy-of-qwen3"], "batch": [4],
                                     "scheme": ["elastic"], "alpha": [0.57],
                                     "zipf": [1.55]}}, path=str(tmp_path / "s.yaml"))
    assert expand(other)[0].id == point.id
    _cfg_file(tmp_path / "models", {**CONFIGS["qwen3-30b-a3b"], "num_hidden_layers": 24},
              "q3.json")
    del MODEL_PRESETS["copy-of-qwen3"], DECODER_SHAPES["copy-of-qwen3"]
    edited = parse_spec({"models": {"copy-of-qwen3": "models/q3.json"},
                         "workload": {"model": ["copy-of-qwen3"], "batch": [4],
                                      "scheme": ["elastic"], "alpha": [0.57],
                                      "zipf": [1.55]}}, path=str(tmp_path / "s.yaml"))
    assert expand(edited)[0].id != point.id


def test_the_cli_names_a_bad_models_entry(tmp_path, capsys):
    _cfg_file(tmp_path, {**CONFIGS["mixtral-8x7b"], "model_type": "llama"}, "m.json")
    spec = tmp_path / "s.yaml"
    spec.write_text("models:\n  mine: m.json\nworkload:\n  model: [mine]\n  zipf: [1.0]\n")
    assert cli.main(["sweep", str(spec), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"elmoe3d sweep: error: {spec}: models.mine: {tmp_path / 'm.json'}: "
                   f"model_type: expected one of {', '.join(hf_config.FAMILIES)}, got \"llama\"")


def test_a_sweep_keeps_new_shapes_calibrations_in_its_cache(tmp_path, monkeypatch):
    """A models: entry whose expert shape no shipped table holds is calibrated on first use,
    and the calibration goes to the sweep's shared cache (``<cache>/calib``), where the next
    worker reads it (here a stand-in for the cycle model records the calls)."""
    from elmoe3d.sw.host import compute_calib as cc
    calls = []

    def stand_in(arch, h, i, bits, *, check=True, link_rate=None):
        calls.append((h, i, bits))
        return dataclasses.replace(cc.ffn_calibration(arch, h, 768, bits), intermediate=i)
    monkeypatch.setattr(cc, "calibrate", stand_in)
    monkeypatch.setattr(cc, "_CACHE", {})
    _cfg_file(tmp_path, {**CONFIGS["qwen3-30b-a3b"], "moe_intermediate_size": 800}, "q.json")
    spec = parse_spec({"models": {"wide": "q.json"},
                       "workload": {"model": ["wide"], "zipf": [1.55], "scheme": ["ar"]}},
                      path=str(tmp_path / "s.yaml"))
    (point,) = expand(spec)
    first = sweep_tasks.perf_task(point, tmp_path / "cache")
    assert sorted(calls) == [(2048, 800, 8)]                 # AR: the W8A8 calibration
    assert len(list((tmp_path / "cache" / "calib").glob("ffn-*.json"))) == 1
    monkeypatch.setattr(cc, "_CACHE", {})                    # the next worker
    assert sweep_tasks.perf_task(point, tmp_path / "cache") == first and len(calls) == 1


@pytest.mark.parametrize("name, fields, match", [
    ("qwen3-30b-a3b", {"decoder_sparse_step": 100},
     "decoder_sparse_step: 100 leaves no MoE layer among the 48 layers"),
    ("qwen1.5-moe-a2.7b", {"mlp_only_layers": list(range(24))},
     "mlp_only_layers: every layer dense leaves no MoE layer among the 24 layers"),
    ("deepseek-v2-lite", {"first_k_dense_replace": 27},
     "first_k_dense_replace: 27 leaves no MoE layer among the 27 layers"),
    ("glm-4.7-flash", {"mlp_layer_types": ["dense"] * 47, "first_k_dense_replace": 47},
     "mlp_layer_types: every layer dense leaves no MoE layer among the 47 layers")])
def test_a_layout_without_moe_layers_names_the_config_field(name, fields, match):
    """The error named the preset's field (``first_dense_layers``), not the config's."""
    with pytest.raises(UserError, match=r"config: " + match + r" \(num_hidden_layers\)"):
        model_from_config({**CONFIGS[name], **fields}, name="m")


@pytest.mark.parametrize("source", [None, [1, 2], 3])
def test_a_source_that_is_neither_a_path_nor_a_dict_is_refused(source):
    with pytest.raises(UserError, match="source: expected the path of a config.json or its dict"):
        model_from_config(source, name="m")

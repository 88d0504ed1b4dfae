"""Models from a Hugging Face ``config.json`` (``sw/host/hf_config.py``): every preset with a
whole-decoder shape is its own config read by the loader (the config fields below are the
published ``config.json`` values that :data:`~.models.MODEL_SOURCES` and
:data:`~.decoder.DECODER_SOURCES` cite); a loaded model runs through the whole-decoder model and
a sweep exactly as a preset of the same figures; bad configs are one clear error naming the file
and the field."""

from __future__ import annotations

import dataclasses
import json

import pytest

import elmoe3d.cli as cli
from elmoe3d.errors import UserError
from elmoe3d.sw.host import hf_config, paper_eval as pe, sweep_tasks
from elmoe3d.sw.host.decoder import DECODER_SHAPES, decoder_shape
from elmoe3d.sw.host.hf_config import (load_model, model_figures, model_from_config,
                                       register_figures)
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


@pytest.fixture(autouse=True)
def _registries():
    """Every test leaves the model registries as it found them."""
    presets, shapes = dict(MODEL_PRESETS), dict(DECODER_SHAPES)
    yield
    MODEL_PRESETS.clear()
    MODEL_PRESETS.update(presets)
    DECODER_SHAPES.clear()
    DECODER_SHAPES.update(shapes)


def _figures_only(p):
    """A preset without what a config does not carry (its repository, the trace host's
    attention fields)."""
    return dataclasses.replace(p, hf_repo="", vocab_size=0, attention_heads=0, kv_heads=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_preset_is_its_config_json(name):
    preset, shape = model_from_config(CONFIGS[name], name=name)
    assert _figures_only(preset) == _figures_only(MODEL_PRESETS[name])
    if name in DECODER_SHAPES:
        assert shape == DECODER_SHAPES[name]
    # the preset's own config under its name registers nothing new and is no clash
    assert load_model(CONFIGS[name], name=name) == name
    assert MODEL_PRESETS[name] is model_preset(name)


def test_every_whole_decoder_preset_has_its_config_here():
    assert set(DECODER_SHAPES) <= set(CONFIGS)


def test_a_loaded_model_runs_as_the_preset_of_the_same_figures(tmp_path):
    """Qwen3-30B-A3B's config loaded from a file under another name gives the preset's AR
    step and SD iteration to the last bit (the model is its figures, not its name)."""
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


def test_layer_layouts_and_sliding_windows():
    q2 = CONFIGS["qwen1.5-moe-a2.7b"]
    # Qwen2-MoE: layer i is MoE when (i + 1) % decoder_sparse_step == 0
    p, s = model_from_config({**q2, "decoder_sparse_step": 2}, name="every-other")
    assert list(p.moe_layer_ids) == list(range(1, 24, 2)) and s.dense_intermediate == 5632
    p, _ = model_from_config({**q2, "mlp_only_layers": [0, 1]}, name="two-dense")
    assert (p.first_dense_layers, p.moe_layers) == (2, 22)
    # use_sliding_window slides the layers from max_window_layers on; Mixtral every layer
    _, s = model_from_config({**q2, "use_sliding_window": True}, name="slide")
    assert (s.sliding_window, s.sliding_layers) == (32768, 3)
    _, s = model_from_config({**CONFIGS["mixtral-8x7b"], "sliding_window": 4096}, name="m")
    assert (s.sliding_window, s.sliding_layers) == (4096, 32)
    # Qwen3-MoE has no shared expert whatever the config carries
    p, _ = model_from_config({**CONFIGS["qwen3-30b-a3b"], "shared_expert_intermediate_size": 0},
                             name="q3")
    assert p.shared_experts == 0


def test_figures_travel_as_plain_data():
    name = load_model(CONFIGS["deepseek-v2-lite"], name="ds-copy")
    figures = json.loads(json.dumps(model_figures(name)))      # what a worker receives
    del MODEL_PRESETS[name], DECODER_SHAPES[name]
    assert register_figures(figures) == name
    assert _figures_only(model_preset(name)) == dataclasses.replace(
        _figures_only(MODEL_PRESETS["deepseek-v2-lite"]), name=name)
    assert decoder_shape(name) == dataclasses.replace(DECODER_SHAPES["deepseek-v2-lite"],
                                                      preset=name)


def _cfg_file(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return path


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.pop("num_experts"), "{f}: num_experts: missing (a qwen3_moe config has it)"),
    (lambda c: c.update(hidden_size="2048"),
     "{f}: hidden_size: expected a positive integer, got '2048'"),
    (lambda c: c.update(model_type="llama"),
     "{f}: model_type: expected one of mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v2, "
     "deepseek_v3, glm4_moe, glm4_moe_lite, gpt_oss, got 'llama'"),
    (lambda c: c.update(mlp_only_layers=[3]),
     "{f}: mlp_only_layers [3] with decoder_sparse_step 1: only a leading run of dense layers "
     "(0 .. k-1) with every later layer MoE is supported"),
    (lambda c: c.update(moe_intermediate_size=700),
     "{f}: mine: hidden and expert_intermediate must be multiples of the quantization group 32"),
    (lambda c: c.update(num_key_value_heads=5),
     "{f}: num_key_value_heads: expected a divisor of num_attention_heads (32), got 5"),
    (lambda c: c.update(num_experts_per_tok=200), "{f}: mine: top_k (200) > routed_experts (128)"),
    (lambda c: c.update(layer_types=["full_attention"]),
     "{f}: layer_types: expected a list of 48 layer kinds (num_hidden_layers), got "
     "['full_attention']"),
    (lambda c: c.update(norm_topk_prob="yes"),
     "{f}: norm_topk_prob: expected true or false, got 'yes'"),
])
def test_a_bad_config_names_the_file_and_the_field(tmp_path, edit, message):
    cfg = json.loads(json.dumps(CONFIGS["qwen3-30b-a3b"]))
    edit(cfg)
    path = _cfg_file(tmp_path, cfg)
    with pytest.raises(UserError) as err:
        model_from_config(path, name="mine")
    assert str(err.value) == message.format(f=path)


def test_unreadable_and_clashing_configs(tmp_path):
    with pytest.raises(UserError, match=r"nope\.json: cannot read the model config"):
        model_from_config(tmp_path / "nope.json")
    bad = _cfg_file(tmp_path, '{"model_type": "mixtral",\n "hidden_size": }', "bad.json")
    with pytest.raises(UserError, match=r"bad\.json: not JSON \(line 2: Expecting value\)"):
        model_from_config(bad)
    with pytest.raises(UserError, match=r"lst\.json: expected a JSON object of config fields, "
                                        r"got list"):
        model_from_config(_cfg_file(tmp_path, "[1, 2]", "lst.json"))
    with pytest.raises(UserError, match="config: no name: pass name="):
        model_from_config(CONFIGS["mixtral-8x7b"])
    with pytest.raises(UserError, match="config: model name 'no way': expected letters"):
        model_from_config(CONFIGS["mixtral-8x7b"], name="no way")
    # another model under a taken name
    with pytest.raises(UserError, match="model name 'qwen3-30b-a3b' is already a model with "
                                        "other figures; give this one another name"):
        load_model(CONFIGS["glm-4.7-flash"], name="qwen3-30b-a3b")
    assert "qwen3-30b-a3b" in MODEL_PRESETS and MODEL_PRESETS["qwen3-30b-a3b"].hidden == 2048


# == in a sweep ===================================================================================

def test_a_sweep_runs_a_models_entry_on_a_worker_that_never_saw_the_file(tmp_path):
    """A spec's ``models:`` entry (relative to the spec) runs at the workload's Zipf exponent;
    the point carries the figures, so a worker registers the model without the file, and the
    result is the preset's of the same figures."""
    (tmp_path / "models").mkdir()
    _cfg_file(tmp_path / "models", CONFIGS["qwen3-30b-a3b"], "q3.json")
    spec = parse_spec({"models": {"half-qwen3": "models/q3.json"},
                       "workload": {"model": ["half-qwen3"], "batch": [4],
                                    "scheme": ["elastic"], "alpha": [0.57],
                                    "zipf": [pe.ZIPF["qwen3-30b-a3b"]]}},
                      path=str(tmp_path / "s.yaml"))
    (point,) = expand(spec)
    assert point.workload["zipf"] == 1.55 and point.figures is not None
    del MODEL_PRESETS["half-qwen3"], DECODER_SHAPES["half-qwen3"]      # a fresh worker
    got = sweep_tasks.perf_task(point)
    assert "half-qwen3" in DECODER_SHAPES
    ref = parse_spec({"workload": {"model": ["qwen3-30b-a3b"], "batch": [4],
                                   "scheme": ["elastic"], "alpha": [0.57]}}, path="r.yaml")
    want = sweep_tasks.perf_task(expand(ref)[0])
    assert {k: got[k] for k in want} == want
    # the figures are part of the point's id: an edited config is another point
    other = parse_spec({"models": {"half-qwen3": "models/q3.json"},
                        "workload": {"model": ["half-qwen3"], "batch": [4],
                                     "scheme": ["elastic"], "alpha": [0.57],
                                     "zipf": [1.55]}}, path=str(tmp_path / "s.yaml"))
    assert expand(other)[0].id == point.id
    _cfg_file(tmp_path / "models", {**CONFIGS["qwen3-30b-a3b"], "num_hidden_layers": 24},
              "q3.json")
    del MODEL_PRESETS["half-qwen3"], DECODER_SHAPES["half-qwen3"]
    edited = parse_spec({"models": {"half-qwen3": "models/q3.json"},
                         "workload": {"model": ["half-qwen3"], "batch": [4],
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
                   f"model_type: expected one of {', '.join(hf_config.FAMILIES)}, got 'llama'")

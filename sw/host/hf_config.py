"""MoE models from a Hugging Face ``config.json``: the figures the presets hold, read the same way.

The presets of :data:`~.models.MODEL_PRESETS` and :data:`~.decoder.DECODER_SHAPES` were typed in
from their models' ``config.json`` (:data:`~.models.MODEL_SOURCES` and
:data:`~.decoder.DECODER_SOURCES` name each field). This module reads those fields from a
``config.json`` itself, so that a model the project ships no preset for can run through the
whole-decoder model (:class:`~.paper_eval.EvalModel`) and the design-space sweep
(``models:`` in a sweep spec, ``docs/sweep.md``), and so that the presets are checked against
their configs by the same code (``tests/host/test_hf_config.py``).

* :func:`model_from_config` -- a ``config.json`` (path or dict) to a ``(ModelPreset,
  DecoderShape)`` pair; nothing registered.
* :func:`load_model` -- the same, registered under its name (a preset of the same name must
  have the same figures), so every function that takes a model name takes it.
* :func:`model_figures` / :func:`register_figures` -- a registered model as plain data and
  back (what a sweep sends to its workers, which may not see the file).

Supported ``model_type`` values (:data:`FAMILIES`): ``mixtral``, ``qwen2_moe``, ``qwen3_moe``,
``olmoe``, ``deepseek_v2``, ``deepseek_v3``, ``glm4_moe``, ``glm4_moe_lite``, ``gpt_oss``. What
the figures do not carry is fixed per family from the modelling code of ``transformers`` (the
scoring function where the config has no ``scoring_func``; Mixtral's always renormalised top-k;
Qwen3-MoE's missing shared expert). Left out: multi-token-prediction layers
(``num_nextn_predict_layers``, not run in decode), group-limited routing (``n_group``,
``topk_group``: it changes which experts, not how many), attention biases and norms (a few
thousand weights). The ``ModelPreset`` attention fields used by the trace-driven host
(``vocab_size``, ``attention_heads``, ``kv_heads``) stay 0: the whole-decoder model reads the
attention from the ``DecoderShape``.

Errors are :class:`~elmoe3d.errors.UserError` naming the file and the field: a missing or
non-integer field, an unsupported ``model_type``, a layer layout the models cannot express
(MoE layers other than every ``n``-th after a dense prefix), shapes off the G = 32 grid.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from ...errors import UserError
from .decoder import DECODER_SHAPES, DecoderShape
from .models import MODEL_PRESETS, ModelPreset

__all__ = ["FAMILIES", "model_from_config", "load_model", "model_figures", "register_figures",
           "read_config"]

#: ``model_type`` -> (attention, default scoring, default ``norm_topk_prob``): the families
#: :func:`model_from_config` reads, with what their ``transformers`` modelling code fixes when
#: the config does not say (``scoring_func``, ``norm_topk_prob``). Mixtral and GPT-OSS always
#: renormalise the top-k weights (their routers have no switch).
FAMILIES = {
    "mixtral": ("gqa", "softmax", True),
    "qwen2_moe": ("gqa", "softmax", False),
    "qwen3_moe": ("gqa", "softmax", False),
    "olmoe": ("gqa", "softmax", False),
    "deepseek_v2": ("mla", "softmax", False),
    "deepseek_v3": ("mla", "sigmoid", True),
    "glm4_moe": ("gqa", "sigmoid", True),
    "glm4_moe_lite": ("mla", "sigmoid", True),
    "gpt_oss": ("gqa", "softmax", True),
}
_ALWAYS_RENORMALISED = ("mixtral", "gpt_oss")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_MISSING = object()


def read_config(source) -> tuple:
    """``(config dict, label)`` of ``source``: a path to a ``config.json`` (label: the path)
    or a dict (label ``"config"``). Raises :class:`UserError` naming the file when it cannot
    be read or is not a JSON object."""
    if isinstance(source, dict):
        return source, "config"
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the model config ({exc.strerror})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a JSON object of config fields, got "
                        f"{type(cfg).__name__}")
    return cfg, str(path)


class _Fields:
    """Typed reads of one config's fields; every error names ``where`` and the field."""

    def __init__(self, cfg: dict, where: str, family: str):
        self.cfg, self.where, self.family = cfg, where, family

    def int(self, key, default=_MISSING, *, low=1) -> int:
        v = self.cfg.get(key, default)
        if v is _MISSING:
            raise UserError(f"{self.where}: {key}: missing (a {self.family} config has it)")
        if v is None and default is not _MISSING:
            v = default
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            need = "a positive integer" if low >= 1 else f"an integer >= {low}"
            raise UserError(f"{self.where}: {key}: expected {need}, got {v!r}")
        return v

    def bool(self, key, default) -> bool:
        v = self.cfg.get(key, default)
        if not isinstance(v, bool):
            raise UserError(f"{self.where}: {key}: expected true or false, got {v!r}")
        return v

    def number(self, key, default) -> float:
        v = self.cfg.get(key, default)
        if v is None:
            v = default
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise UserError(f"{self.where}: {key}: expected a number > 0, got {v!r}")
        return float(v)

    def first(self, *keys, default=_MISSING) -> int:
        """The first of ``keys`` the config has (aliases, e.g. GPT-OSS's two top-k fields)."""
        for k in keys:
            if self.cfg.get(k) is not None:
                return self.int(k)
        if default is not _MISSING:
            return default
        raise UserError(f"{self.where}: {keys[0]}: missing (a {self.family} config has it)")


def _name(cfg: dict, where: str, name) -> str:
    if name is None:
        raw = cfg.get("_name_or_path")
        if isinstance(raw, str) and raw.strip("/"):
            name = raw.strip("/").rsplit("/", 1)[-1]
        elif where != "config":
            p = Path(where)
            name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
        else:
            raise UserError("config: no name: pass name= (the config has no _name_or_path)")
    key = str(name).strip().lower()
    if not _NAME.match(key):
        raise UserError(f"{where}: model name {name!r}: expected letters, digits, '.', '_' "
                        f"and '-' (pass name=)")
    return key


def _layer_layout(f: _Fields, family: str, layers: int) -> tuple:
    """``(first_dense_layers, moe_layer_step)`` of the config's MoE layer layout."""
    cfg = f.cfg
    if family in ("qwen2_moe", "qwen3_moe"):
        step = f.int("decoder_sparse_step", 1)
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
            raise UserError(f"{f.where}: mlp_only_layers: expected a list of layer indices, "
                            f"got {only!r}")
        if only:
            if step != 1 or sorted(only) != list(range(len(only))):
                raise UserError(f"{f.where}: mlp_only_layers {only} with decoder_sparse_step "
                                f"{step}: only a leading run of dense layers (0 .. k-1) with "
                                f"every later layer MoE is supported")
            return len(only), 1
        # transformers Qwen2MoeDecoderLayer: layer i is MoE when (i + 1) % step == 0
        return step - 1, step
    if family in ("deepseek_v2", "deepseek_v3", "glm4_moe", "glm4_moe_lite"):
        freq = f.int("moe_layer_freq", 1)
        if freq != 1:
            raise UserError(f"{f.where}: moe_layer_freq: only 1 (every layer after "
                            f"first_k_dense_replace is MoE) is supported, got {freq}")
        return f.int("first_k_dense_replace", 0, low=0), 1
    return 0, 1


def _sliding(f: _Fields, family: str, layers: int) -> tuple:
    """``(sliding_window, sliding_layers)``: ``layer_types`` where the config lists them,
    else the family's rule (Mixtral: every layer when ``sliding_window`` is set; Qwen: the
    layers from ``max_window_layers`` on when ``use_sliding_window``)."""
    cfg = f.cfg
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise UserError(f"{f.where}: layer_types: expected a list of {layers} layer kinds "
                            f"(num_hidden_layers), got {types!r}")
        n = sum(t == "sliding_attention" for t in types)
        return (f.int("sliding_window"), n) if n else (0, 0)
    if family == "mixtral":
        return (f.int("sliding_window"), layers) if cfg.get("sliding_window") else (0, 0)
    if family in ("qwen2_moe", "qwen3_moe") and cfg.get("use_sliding_window"):
        first = f.int("max_window_layers", layers, low=0)
        n = max(layers - first, 0)
        return (f.int("sliding_window"), n) if n else (0, 0)
    return 0, 0


def model_from_config(source, *, name: str | None = None) -> tuple:
    """The ``(ModelPreset, DecoderShape)`` of a Hugging Face MoE ``config.json`` (a path or the
    parsed dict), named ``name`` (default: the last part of ``_name_or_path``, else the
    folder of a ``config.json``, else the file's stem; lower case). Nothing is registered
    (:func:`load_model` does). Raises :class:`UserError` naming the file and field (module
    docstring)."""
    cfg, where = read_config(source)
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise UserError(f"{where}: model_type: expected one of {', '.join(FAMILIES)}, got "
                        f"{family!r}")
    f = _Fields(cfg, where, family)
    attention, scoring_default, norm_default = FAMILIES[family]
    key = _name(cfg, where, name)
    layers, hidden = f.int("num_hidden_layers"), f.int("hidden_size")
    heads = f.int("num_attention_heads")
    first_dense, step = _layer_layout(f, family, layers)
    # routed experts and their FFN
    if family in ("mixtral", "gpt_oss"):
        routed, inter = f.int("num_local_experts"), f.int("intermediate_size")
    elif family == "olmoe":
        routed, inter = f.int("num_experts"), f.int("intermediate_size")
    elif family in ("qwen2_moe", "qwen3_moe"):
        routed, inter = f.int("num_experts"), f.int("moe_intermediate_size")
    else:
        routed, inter = f.int("n_routed_experts"), f.int("moe_intermediate_size")
    top_k = f.first("num_experts_per_tok", "experts_per_token")
    # shared experts: Qwen2-MoE one of its own size; DeepSeek / GLM n of the expert's size;
    # Qwen3-MoE none (Qwen3MoeSparseMoeBlock has no shared expert whatever the config says)
    shared, shared_inter = 0, 0
    if family == "qwen2_moe":
        shared_inter = f.int("shared_expert_intermediate_size", 0, low=0)
        shared = 1 if shared_inter else 0
    elif family in ("deepseek_v2", "deepseek_v3", "glm4_moe", "glm4_moe_lite"):
        shared = f.int("n_shared_experts", 0, low=0)
        shared_inter = shared * inter
    scoring = cfg.get("scoring_func", scoring_default) or scoring_default
    if scoring not in ("softmax", "sigmoid"):
        raise UserError(f"{where}: scoring_func: expected softmax or sigmoid, got {scoring!r}")
    norm = (True if family in _ALWAYS_RENORMALISED
            else f.bool("norm_topk_prob", norm_default))
    quant = cfg.get("quantization_config") or {}
    mxfp4 = isinstance(quant, dict) and quant.get("quant_method") == "mxfp4"
    try:
        preset = ModelPreset(
            name=key, hf_repo=str(cfg.get("_name_or_path") or key), layers=layers,
            first_dense_layers=first_dense, hidden=hidden, expert_intermediate=inter,
            routed_experts=routed, shared_experts=shared, shared_intermediate=shared_inter,
            top_k=top_k, norm_topk_prob=norm, scoring=scoring,
            routed_scaling_factor=f.number("routed_scaling_factor", 1.0),
            expert_format="mxfp4" if mxfp4 else "int8-nested", moe_layer_step=step)
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None
    window, sliding = _sliding(f, family, layers)
    dense = f.int("intermediate_size") if preset.moe_layers < layers else 0
    if attention == "gqa":
        kv = f.int("num_key_value_heads", heads)
        head_dim = f.int("head_dim", hidden // heads)
        att = dict(kv_heads=kv, head_dim=head_dim)
    else:
        att = dict(q_lora_rank=f.int("q_lora_rank", 0, low=0),
                   kv_lora_rank=f.int("kv_lora_rank"), qk_nope_dim=f.int("qk_nope_head_dim"),
                   qk_rope_dim=f.int("qk_rope_head_dim"), v_head_dim=f.int("v_head_dim"))
    try:
        shape = DecoderShape(preset=key, vocab=f.int("vocab_size"), attention=attention,
                             q_heads=heads, dense_intermediate=dense, sliding_window=window,
                             sliding_layers=sliding, **att)
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None
    if attention == "gqa" and heads % att["kv_heads"]:
        raise UserError(f"{where}: num_key_value_heads: expected a divisor of "
                        f"num_attention_heads ({heads}), got {att['kv_heads']}")
    return preset, shape


def _same(a, b) -> bool:
    """Equal in every figure (a preset's ``hf_repo`` and the trace host's attention fields
    aside)."""
    if isinstance(a, ModelPreset):
        skip = dict(hf_repo="", vocab_size=0, attention_heads=0, kv_heads=0)
        return dataclasses.replace(a, **skip) == dataclasses.replace(b, **skip)
    return a == b


def _register(preset: ModelPreset, shape: DecoderShape, where: str) -> str:
    old, old_shape = MODEL_PRESETS.get(preset.name), DECODER_SHAPES.get(preset.name)
    if old is not None and not (_same(old, preset)
                                and (old_shape is None or old_shape == shape)):
        raise UserError(f"{where}: model name {preset.name!r} is already a model with other "
                        f"figures; give this one another name")
    if old is None:
        MODEL_PRESETS[preset.name] = preset
    if old_shape is None:
        DECODER_SHAPES[preset.name] = shape
    return preset.name


def load_model(source, *, name: str | None = None) -> str:
    """Read a ``config.json`` (:func:`model_from_config`) and register it, so that every
    function taking a model name (:func:`~.models.model_preset`,
    :func:`~.decoder.decoder_shape`, :class:`~.paper_eval.EvalModel`) takes its name, which
    is returned. Loading a preset's own config (same figures) returns the preset's name;
    another model under a taken name raises :class:`UserError`. The expert popularity (a Zipf
    exponent, ``EvalModel(zipf=)``) and the draft's acceptance are not in a config: give
    them."""
    preset, shape = model_from_config(source, name=name)
    return _register(preset, shape, "config" if isinstance(source, dict) else str(source))


def model_figures(name: str) -> dict:
    """A registered model as plain data, ``{"preset": {...}, "shape": {...}}`` (JSON-able;
    :func:`register_figures` takes it back)."""
    from .decoder import decoder_shape
    from .models import model_preset
    return {"preset": dataclasses.asdict(model_preset(name)),
            "shape": dataclasses.asdict(decoder_shape(name))}


def register_figures(figures: dict) -> str:
    """Register a model from :func:`model_figures`' data (a sweep worker's copy); its name.
    Raises :class:`UserError` on a name taken by other figures."""
    try:
        preset = ModelPreset(**figures["preset"])
        shape = DecoderShape(**figures["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"model figures: {exc}") from None
    return _register(preset, shape, f"model {preset.name!r}")

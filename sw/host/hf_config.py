"""MoE models from a Hugging Face ``config.json``: the figures the presets hold, read the same way.

The presets of :data:`~.models.MODEL_PRESETS` and :data:`~.decoder.DECODER_SHAPES` were typed in
from their models' ``config.json`` (:data:`~.models.MODEL_SOURCES` and
:data:`~.decoder.DECODER_SOURCES` name each field). This module reads those fields from a
``config.json`` itself, so that a model the project ships no preset for can run through the
whole-decoder model (:class:`~.paper_eval.EvalModel`) and the design-space sweep
(``models:`` in a sweep spec, ``docs/sweep.md`` "Your own model"), and so that the presets are
checked against their configs by the same code (``tests/host/test_hf_config.py``).

* :func:`model_from_config` -- a ``config.json`` (path or dict) to a ``(ModelPreset,
  DecoderShape)`` pair; nothing registered.
* :func:`load_model` -- the same, registered under its name (:func:`default_name` or
  ``name=``), so every function that takes a model name takes it.
* :func:`model_figures` / :func:`register_figures` -- a registered model as plain data and
  back (what a sweep sends to its workers, which may not see the file).

Supported ``model_type`` values (:data:`FAMILIES`): ``mixtral``, ``qwen2_moe``, ``qwen3_moe``,
``olmoe``, ``deepseek_v2``, ``deepseek_v3``, ``glm4_moe``, ``glm4_moe_lite``, ``gpt_oss``. What
the ``transformers`` modelling code fixes rather than reads is fixed the same way (the scoring
function, DeepSeek-V2's aside; Mixtral's and GPT-OSS's always renormalised top-k; Qwen3-MoE's
missing shared expert; GLM-4.7-Flash's dense layers from ``mlp_layer_types``, the first layer by
default). A field whose absence ``transformers`` fills with a figure of its reference model
(DeepSeek-V3's ``first_k_dense_replace``, ``n_shared_experts``, ``q_lora_rank``,
``routed_scaling_factor``; the KV heads; GPT-OSS's ``layer_types``), or that the other fields
cannot tell (``head_dim`` of Qwen3-MoE, GLM-4.5 and GPT-OSS, whose released heads are not
``hidden / heads``, and whose defaults have changed between ``transformers`` versions) is
required, not guessed. Left out: multi-token-prediction layers (``num_nextn_predict_layers``,
not run in decode), group-limited routing (``n_group``, ``topk_group``: it changes which
experts, not how many), attention biases and norms (a few thousand weights). The ``ModelPreset``
attention fields of the trace-driven host (``vocab_size``, ``attention_heads``, ``kv_heads``)
stay 0: the whole-decoder model reads the attention from the ``DecoderShape``.

Errors are :class:`~elmoe3d.errors.UserError` naming the file and the config field: a missing
field or one of the wrong type (a bool or a string for an integer, an unknown layer kind), an
unsupported ``model_type``, a layer layout the models cannot express (MoE layers other than every
``n``-th after a dense prefix), shapes off the G = 32 grid, a file that is not UTF-8 JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path

from ...checks import expected_int, is_int
from ...errors import UserError
from .decoder import DECODER_SHAPES, DecoderShape
from .models import MODEL_PRESETS, QUANT_GROUP, ModelPreset

__all__ = ["FAMILIES", "model_from_config", "load_model", "model_figures", "register_figures",
           "read_config", "ConfigFields", "default_name", "same_figures", "loaded_models",
           "INT_MAX"]

#: ``model_type`` -> (attention, scoring, default ``norm_topk_prob``): the families
#: :func:`model_from_config` reads, with what their ``transformers`` modelling code fixes: the
#: scoring function (DeepSeek-V2's alone follows the config's ``scoring_func``) and the
#: renormalisation where the config does not say (``norm_topk_prob``, the config class's
#: default). Mixtral and GPT-OSS always renormalise the top-k weights (no switch).
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
#: Families whose router scales the routed gate weights by ``routed_scaling_factor``.
_SCALED = ("deepseek_v2", "deepseek_v3", "glm4_moe", "glm4_moe_lite")
#: Families whose head size is ``hidden_size / num_attention_heads`` when the config has no
#: ``head_dim`` (the others' config classes default to a figure of their own reference model:
#: the field is required).
_HEAD_DIM_DERIVED = ("mixtral", "qwen2_moe", "olmoe")
_LAYER_KINDS = ("sliding_attention", "full_attention")
#: The largest integer a config field may hold (a layer count, a width, a vocabulary): far
#: above any real model's, below what would exhaust memory.
INT_MAX = 1 << 24
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_MISSING = object()
#: Names :func:`load_model` and :func:`register_figures` registered (a config's figures may
#: replace them; a built-in preset's never).
_LOADED: set = set()


def read_config(source, *, file="config.json", kind="model config") -> tuple:
    """``(config dict, label)`` of ``source``: a path to a ``config.json``, or to the folder
    holding one (a checkpoint's folder; label: the file's path), or a dict (label
    ``"config"``); ``file`` and ``kind`` name what the file should be in the messages (e.g.
    ``"sentence_bert_config.json"``, ``"sentence-transformers config"``). Raises
    :class:`UserError` naming the file when it cannot be read, is not UTF-8 JSON text or is
    not a JSON object, naming a folder without ``file``, and naming ``source`` when it is
    neither a path nor a dict."""
    if isinstance(source, dict):
        return source, "config"
    if not isinstance(source, (str, os.PathLike)):
        raise UserError(f"source: expected the path of a {file} or its dict, got "
                        f"{type(source).__name__}")
    path = Path(source)
    if path.is_dir():
        if not (path / file).is_file():
            raise UserError(f"{path}: a folder without a {file} (expected the {kind} or the "
                            f"folder that holds it)")
        path = path / file
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {kind} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a {file} (not UTF-8 text)") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError) as exc:   # an integer of over 4,300 digits, deep nests
        raise UserError(f"{path}: not a {file} this reader takes ({exc})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a JSON object of config fields, got "
                        f"{type(cfg).__name__}")
    return cfg, str(path)


def _show(v) -> str:
    """A config value as the JSON file spells it (``true``, ``"2048"``, ``null``)."""
    try:
        return json.dumps(v)
    except (TypeError, ValueError):
        return repr(v)


class ConfigFields:
    """Typed reads of one config's fields (a dict from :func:`read_config`: ``where`` its
    label, ``family`` the kind of config, for the message of a missing field); every error
    names ``where`` and the field. The one integer and number rule of the config readers
    (this module's and MiniLM's, :mod:`.minilm`)."""

    def __init__(self, cfg: dict, where: str, family: str):
        self.cfg, self.where, self.family = cfg, where, family

    def error(self, key, text) -> UserError:
        """The :class:`UserError` of field ``key``: the file, the field, ``text``."""
        return UserError(f"{self.where}: {key}: {text}")

    def missing(self, key, note="") -> UserError:
        """The error of a required field ``key`` the config lacks."""
        return self.error(key, f"missing (a {self.family} config has it{note})")

    def int(self, key, default=_MISSING, *, low=1, null=_MISSING) -> int:
        """Field ``key``, an integer in ``low`` .. :data:`INT_MAX`; ``default`` when absent
        (required without one), ``null`` when it is JSON null (refused without one)."""
        if key not in self.cfg:
            if default is _MISSING:
                raise self.missing(key)
            return default
        v = self.cfg[key]
        if v is None and null is not _MISSING:
            return null
        if isinstance(v, float) and v.is_integer():         # 2.0 from another tool's JSON
            v = int(v)
        if not is_int(v, numpy=False) or not low <= v <= INT_MAX:
            raise self.error(key, f"expected {expected_int(low)} up to {INT_MAX:,}, got "
                                  f"{_show(v)}")
        return v

    def grid(self, key, v) -> int:
        """``v`` (field ``key``'s value), refused unless a multiple of the quantization group
        (G32 weights)."""
        if v % QUANT_GROUP:
            raise self.error(key, f"expected a multiple of the quantization group {QUANT_GROUP} "
                             f"(G32 weights), got {v}")
        return v

    def bool(self, key, default) -> bool:
        """Field ``key``, true or false; ``default`` when absent."""
        v = self.cfg.get(key, default)
        if not isinstance(v, bool):
            raise self.error(key, f"expected true or false, got {_show(v)}")
        return v

    def number(self, key, default=_MISSING) -> float:
        """Field ``key``, a finite number > 0; ``default`` when absent (required without)."""
        if key not in self.cfg and default is not _MISSING:
            return float(default)
        v = self.cfg.get(key)
        if key not in self.cfg:
            raise self.missing(key)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf \
                or v > sys.float_info.max:          # an integer no float holds
            raise self.error(key, f"expected a finite number > 0, got {_show(v)}")
        return float(v)

    def first(self, *keys) -> int:
        """Field ``keys[0]`` or its aliases (GPT-OSS's two top-k fields), which must agree
        where several are given."""
        got = {k: self.int(k) for k in keys if self.cfg.get(k) is not None}
        if not got:
            raise self.missing(keys[0])
        if len(set(got.values())) > 1:
            raise self.error(keys[0], "disagrees with " + ", ".join(
                f"{k} ({v})" for k, v in got.items() if k != keys[0]) + f": got {got}")
        return next(iter(got.values()))

    def kinds(self, key, layers: int, kinds: tuple) -> list:
        """Field ``key``: a list of ``layers`` strings, each one of ``kinds``."""
        v = self.cfg[key]
        if not isinstance(v, list) or len(v) != layers:
            raise self.error(key, f"expected a list of {layers} layer kinds (num_hidden_layers), "
                             f"got {_show(v)}")
        for i, t in enumerate(v):
            if t not in kinds:
                raise self.error(key, f"layer {i}: expected one of {', '.join(kinds)}, got "
                                 f"{_show(t)}")
        return v


def default_name(source) -> str | None:
    """The name a ``config.json`` gets without ``name=``: the last part of its
    ``_name_or_path``, else its folder (a Hugging Face cache's ``models--ORG--NAME`` for a
    file in one of its snapshots), else the file's stem; lower case. None for a dict without
    ``_name_or_path``."""
    cfg, where = read_config(source)
    raw = cfg.get("_name_or_path")
    if isinstance(raw, str) and raw.strip("/"):
        return raw.strip("/").rsplit("/", 1)[-1].lower()
    if where == "config":
        return None
    p = Path(os.path.abspath(where))           # '.' or '..' given as the folder: its name
    if p.name != "config.json" or not p.parent.name:
        return p.stem.lower()
    if p.parent.parent.name == "snapshots" and p.parents[2].name.startswith("models--"):
        return p.parents[2].name.split("--")[-1].lower()       # HF cache: models--ORG--NAME
    return p.parent.name.lower()


def _name(source, where: str, name) -> str:
    """The registry key of a model: ``name`` or :func:`default_name`, lower case, checked."""
    if name is None:
        name = default_name(source)
        if name is None:
            raise UserError("config: no name: pass name= (the config has no _name_or_path)")
    key = str(name).strip().lower()
    if not _NAME.match(key):
        raise UserError(f"{where}: model name {name!r}: expected letters, digits, '.', '_' "
                        f"and '-' (pass name=)")
    return key


def _layer_layout(f: ConfigFields, family: str, layers: int) -> tuple:
    """``(first_dense_layers, moe_layer_step)`` of the config's MoE layer layout. Raises
    :class:`UserError` naming the config field that leaves no MoE layer among the
    ``layers`` (``num_hidden_layers``)."""
    first, step, key = _layout_of(f, family, layers)
    if first >= layers:
        v = f.cfg.get(key)
        what = "every layer dense" if isinstance(v, list) else _show(v)
        raise f.error(key, f"{what} leaves no MoE layer among the {layers} layers "
                      f"(num_hidden_layers)")
    return first, step


def _layout_of(f: ConfigFields, family: str, layers: int) -> tuple:
    """``(first_dense_layers, moe_layer_step, the config field that set them)``."""
    cfg = f.cfg
    if family in ("qwen2_moe", "qwen3_moe"):
        step = f.int("decoder_sparse_step", 1)
        only = cfg.get("mlp_only_layers", [])
        if only is None:
            only = []
        if not isinstance(only, list) or not all(
                is_int(i, numpy=False) and 0 <= i < layers
                for i in only):
            raise f.error("mlp_only_layers", f"expected a list of layer indices 0 .. "
                          f"{layers - 1}, got {_show(only)}")
        if only:
            if step != 1 or sorted(only) != list(range(len(only))):
                raise f.error("mlp_only_layers", f"{only} with decoder_sparse_step {step}: only "
                              f"a leading run of dense layers (0 .. k-1) with every later "
                              f"layer MoE is supported")
            return len(only), 1, "mlp_only_layers"
        # transformers Qwen2MoeDecoderLayer: layer i is MoE when (i + 1) % step == 0
        return step - 1, step, "decoder_sparse_step"
    if family in _SCALED:
        freq = f.int("moe_layer_freq", 1)
        if freq != 1:
            raise f.error("moe_layer_freq", f"only 1 (every layer after first_k_dense_replace "
                          f"is MoE) is supported, got {freq}")
        if family == "glm4_moe_lite":
            # transformers Glm4MoeLite: the layer kinds decide (default: the first layer dense),
            # first_k_dense_replace is not read; where a config gives it, it must agree
            if cfg.get("mlp_layer_types") is None:
                kinds = ["dense"] + ["sparse"] * (layers - 1)
            else:
                kinds = f.kinds("mlp_layer_types", layers, ("dense", "sparse"))
            k = kinds.index("sparse") if "sparse" in kinds else layers
            if kinds != ["dense"] * k + ["sparse"] * (layers - k):
                raise f.error("mlp_layer_types", "only a leading run of dense layers with every "
                              "later layer sparse is supported")
            given = f.int("first_k_dense_replace", k, low=0)
            if given != k:
                raise f.error("first_k_dense_replace", f"{given} disagrees with the layer kinds "
                              f"({k} leading dense layers: mlp_layer_types, which transformers "
                              f"reads)")
            return k, 1, ("mlp_layer_types" if cfg.get("mlp_layer_types") is not None
                          else "first_k_dense_replace")
        return f.int("first_k_dense_replace", low=0), 1, "first_k_dense_replace"
    return 0, 1, "num_hidden_layers"


def _sliding(f: ConfigFields, family: str, layers: int) -> tuple:
    """``(sliding_window, sliding_layers)``: ``layer_types`` where the config lists them
    (required for GPT-OSS), else Mixtral's rule (every layer when ``sliding_window`` is set);
    Qwen's ``use_sliding_window`` without ``layer_types`` is refused (which layers slide has
    changed between ``transformers`` versions)."""
    cfg = f.cfg
    if "layer_types" in cfg or family == "gpt_oss":
        if "layer_types" not in cfg:
            raise f.missing("layer_types")
        n = f.kinds("layer_types", layers, _LAYER_KINDS).count("sliding_attention")
        return (f.int("sliding_window"), n) if n else (0, 0)
    if family == "mixtral":
        return (f.int("sliding_window"), layers) if cfg.get("sliding_window") is not None \
            else (0, 0)
    if family in ("qwen2_moe", "qwen3_moe") and f.bool("use_sliding_window", False):
        raise f.error("use_sliding_window", "true without layer_types: give layer_types (which "
                      "layers slide)")
    return 0, 0


def model_from_config(source, *, name: str | None = None) -> tuple:
    """The ``(ModelPreset, DecoderShape)`` of a Hugging Face MoE ``config.json`` (a path or the
    parsed dict), named ``name`` (default :func:`default_name`; lower case). Nothing is
    registered (:func:`load_model` does). A field whose absence ``transformers`` fills with a
    default of its reference model (DeepSeek-V3's ``first_k_dense_replace``, a head size)
    is required rather than guessed. Raises :class:`UserError` naming the file and the config
    field (module docstring)."""
    cfg, where = read_config(source)
    family = cfg.get("model_type")
    if not isinstance(family, str) or family not in FAMILIES:
        got = "missing" if "model_type" not in cfg else f"got {_show(family)}"
        raise UserError(f"{where}: model_type: expected one of {', '.join(FAMILIES)}, {got}")
    f = ConfigFields(cfg, where, family)
    attention, scoring, norm_default = FAMILIES[family]
    key = _name(source, where, name)
    layers, hidden = f.int("num_hidden_layers"), f.int("hidden_size")
    heads = f.int("num_attention_heads")
    first_dense, step = _layer_layout(f, family, layers)
    # routed experts and their FFN
    if family in ("mixtral", "gpt_oss"):
        routed, inter_key = f.int("num_local_experts"), "intermediate_size"
    elif family == "olmoe":
        routed, inter_key = f.int("num_experts"), "intermediate_size"
    elif family in ("qwen2_moe", "qwen3_moe"):
        routed, inter_key = f.int("num_experts"), "moe_intermediate_size"
    else:
        routed, inter_key = f.int("n_routed_experts"), "moe_intermediate_size"
    inter = f.int(inter_key)
    top_k = f.first("num_experts_per_tok", "experts_per_token")
    if top_k > routed:
        raise f.error("num_experts_per_tok", f"expected at most the routed experts ({routed}), "
                      f"got {top_k}")
    f.grid("hidden_size", hidden)
    f.grid(inter_key, inter)
    # shared experts: Qwen2-MoE one of its own size; DeepSeek / GLM n of the expert's size;
    # Qwen3-MoE none (Qwen3MoeSparseMoeBlock has no shared expert whatever the config says)
    shared, shared_inter = 0, 0
    if family == "qwen2_moe":
        shared_inter = f.grid("shared_expert_intermediate_size",
                              f.int("shared_expert_intermediate_size", low=0))
        shared = 1 if shared_inter else 0
    elif family in _SCALED:
        shared = f.int("n_shared_experts", low=0)
        shared_inter = shared * inter
    if family == "deepseek_v2":
        scoring = cfg.get("scoring_func", "softmax")
        if scoring not in ("softmax", "sigmoid"):
            raise f.error("scoring_func", f"expected softmax or sigmoid, got {_show(scoring)}")
    norm = True if family in _ALWAYS_RENORMALISED else f.bool("norm_topk_prob", norm_default)
    quant = cfg.get("quantization_config")
    if quant is not None and not isinstance(quant, dict):
        raise f.error("quantization_config", f"expected an object (quant_method, ...), got "
                      f"{_show(quant)}")
    mxfp4 = bool(quant) and quant.get("quant_method") == "mxfp4"
    scale = (f.number("routed_scaling_factor", 1.0 if family == "deepseek_v2" else _MISSING)
             if family in _SCALED else 1.0)
    try:
        preset = ModelPreset(
            name=key, hf_repo=str(cfg.get("_name_or_path") or key), layers=layers,
            first_dense_layers=first_dense, hidden=hidden, expert_intermediate=inter,
            routed_experts=routed, shared_experts=shared, shared_intermediate=shared_inter,
            top_k=top_k, norm_topk_prob=norm, scoring=scoring, routed_scaling_factor=scale,
            expert_format="mxfp4" if mxfp4 else "int8-nested", moe_layer_step=step)
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None
    window, sliding = _sliding(f, family, layers)
    dense = (f.grid("intermediate_size", f.int("intermediate_size"))
             if preset.moe_layers < layers else 0)
    if attention == "gqa":
        kv = f.int("num_key_value_heads")
        if heads % kv:
            raise f.error("num_key_value_heads", f"expected a divisor of num_attention_heads "
                          f"({heads}), got {kv}")
        head_dim = f.int("head_dim", hidden // heads if family in _HEAD_DIM_DERIVED
                         else _MISSING)
        att = dict(kv_heads=kv, head_dim=head_dim)
    else:
        if "q_lora_rank" not in cfg:
            raise f.missing("q_lora_rank", "; null for a plain q_proj")
        att = dict(q_lora_rank=f.int("q_lora_rank", null=0),
                   kv_lora_rank=f.int("kv_lora_rank"), qk_nope_dim=f.int("qk_nope_head_dim"),
                   qk_rope_dim=f.int("qk_rope_head_dim"), v_head_dim=f.int("v_head_dim"))
    try:
        shape = DecoderShape(preset=key, vocab=f.int("vocab_size"), attention=attention,
                             q_heads=heads, dense_intermediate=dense, sliding_window=window,
                             sliding_layers=sliding,
                             tied_embeddings=f.bool("tie_word_embeddings", False), **att)
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None
    return preset, shape


def same_figures(a: ModelPreset, b: ModelPreset) -> bool:
    """Equal in every figure a config carries: the repository and the trace host's attention
    fields (``vocab_size``, ``attention_heads``, ``kv_heads``, set on some presets) aside."""
    skip = dict(hf_repo="", vocab_size=0, attention_heads=0, kv_heads=0)
    return dataclasses.replace(a, **skip) == dataclasses.replace(b, **skip)


def _register(preset: ModelPreset, shape: DecoderShape, where: str) -> str:
    """Register the pair under ``preset.name``: a name new, or a loaded model's (replaced: an
    edited config in a long-lived session or worker), or a preset's of the same figures
    (kept). A preset of other figures raises :class:`UserError`."""
    name = preset.name
    old, old_shape = MODEL_PRESETS.get(name), DECODER_SHAPES.get(name)
    if old is not None and name not in _LOADED:
        if not (same_figures(old, preset) and (old_shape is None or old_shape == shape)):
            raise UserError(f"{where}: model name {name!r} is a preset with other figures; "
                            f"give this model another name")
        if old_shape is None:
            DECODER_SHAPES[name] = shape
        return name
    MODEL_PRESETS[name], DECODER_SHAPES[name] = preset, shape
    _LOADED.add(name)
    return name


def load_model(source, *, name: str | None = None) -> str:
    """Read a ``config.json`` (:func:`model_from_config`) and register it, so that every
    function taking a model name (:func:`~.models.model_preset`,
    :func:`~.decoder.decoder_shape`, :class:`~.paper_eval.EvalModel`) takes its name, which
    is returned. Loading a preset's own config under its name keeps the preset; another model
    under a preset's name raises :class:`UserError`; loading a config again under a name it
    had replaces the figures. What is looked up by name (``paper_eval.ZIPF``,
    ``ALPHA_MODEL``, ``decoder.EAGLE3_HEADS``) is a preset's only: a loaded model needs its
    expert popularity (a Zipf exponent, ``EvalModel(zipf=)``) and its drafts' acceptance
    given, and its EAGLE-3 head is the placeholder of :func:`~.decoder.eagle_head`."""
    preset, shape = model_from_config(source, name=name)
    return _register(preset, shape, "config" if isinstance(source, dict) else str(source))


def loaded_models() -> frozenset:
    """Names of the models :func:`load_model` or :func:`register_figures` registered in this
    process (not the built-in presets)."""
    return frozenset(_LOADED)


def model_figures(name: str) -> dict:
    """A registered model as plain data, ``{"preset": {...}, "shape": {...}}`` (JSON-able;
    :func:`register_figures` takes it back)."""
    from .decoder import decoder_shape
    from .models import model_preset
    return {"preset": dataclasses.asdict(model_preset(name)),
            "shape": dataclasses.asdict(decoder_shape(name))}


def register_figures(figures: dict) -> str:
    """Register a model from :func:`model_figures`' data (a sweep worker's copy, which may
    replace an earlier copy of another version of the config); its name. Raises
    :class:`UserError` on a preset's name with other figures."""
    try:
        preset = ModelPreset(**figures["preset"])
        shape = DecoderShape(**figures["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"model figures: {exc}") from None
    return _register(preset, shape, f"model {preset.name!r}")

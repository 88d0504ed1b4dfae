"""MoE model presets as data, with the router each model runs (BRIEF section 5, paper Table 2).

Every figure comes from the model's public Hugging Face ``config.json``; :data:`MODEL_SOURCES`
names the repository and, for each preset attribute, the config field it was read from (or, for
behaviour the config does not carry, the modelling code that fixes it). Nothing here is
estimated.

* :class:`ModelPreset` -- one model: layers, first dense layers, hidden and expert intermediate
  sizes, routed and shared experts, top-k, scoring function, whether the top-k weights are
  renormalised, routed scaling factor, expert weight format, attention shapes (vocabulary,
  query and key-value heads) where the host reserves HB for them; derived sizes in bytes of an
  expert's MSB slice (the unit the HB cache and the Elastic-SD draft hold) and LSB slice.
* :func:`model_preset` -- look a preset up by name (case-insensitive); an unknown name raises
  :class:`~elmoe3d.errors.UserError` listing the known ones.
* :meth:`ModelPreset.route` -- the model's router in the right order (design brief section 5,
  "softmax, top-k and renormalisation applied in the wrong order, or raw logits used as gate
  weights"): scores = softmax (or sigmoid) of the logits over *all* routed experts, then top-k
  of the scores, then (only if the model does) renormalisation of the k weights to sum 1, then
  the routed scaling factor.

Byte sizes of an expert (numerics contract §1, §2): an expert is three matrices (up, gate:
``[intermediate, hidden]``; down: ``[hidden, intermediate]``), ``3 * hidden * intermediate``
weights in groups of G = 32 along K with one FP16 scale per group. Its MSB slice is 4 bits a
weight plus the FP16 group scales (the draft runs on it alone, and FULL mode reuses the same
scale words); its LSB slice is the other 4 bits a weight. GPT-OSS-20B ships MXFP4 experts (4-bit
E2M1 values with one 8-bit E8M0 scale per 32): the whole expert is its "MSB slice" (the paper
applies Elastic-SD to it by expert throttling alone) and it has no LSB slice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ...checks import is_int
from ...errors import UserError


__all__ = ["ModelPreset", "MODEL_PRESETS", "MODEL_SOURCES", "model_preset", "QUANT_GROUP",
           "SCALE_BYTES", "g32_bytes"]

#: Weight-quantization group along K (numerics contract §1; ``TileConfig.group``).
QUANT_GROUP = 32
#: Bytes of one FP16 group scale.
SCALE_BYTES = 2


def g32_bytes(weights, bits: int = 8, scale_bytes: int = SCALE_BYTES) -> float:
    """Bytes of ``weights`` group-quantized weights at ``bits`` bits a weight (8: INT8, 4: the
    MSB slice or a 4-bit copy) with one ``scale_bytes`` scale per :data:`QUANT_GROUP` weights
    (FP16: 2; MXFP4's E8M0: 1). The one statement of the G32 byte rule
    (:func:`~.decoder.weight_bytes` and :attr:`ModelPreset.expert_msb_bytes` use it)."""
    return weights * bits / 8 + weights / QUANT_GROUP * scale_bytes

_SCORINGS = ("softmax", "sigmoid")
_FORMATS = ("int8-nested", "mxfp4")
_FFNS = ("swiglu", "relu")


@dataclass(frozen=True)
class ModelPreset:
    """Shape and routing of one MoE model.

    Attributes
    ----------
    name : str
        Preset name (lower case), e.g. ``"mixtral-8x7b"``.
    hf_repo : str
        Hugging Face repository whose ``config.json`` the figures come from.
    layers : int
        Decoder layers (``num_hidden_layers``).
    first_dense_layers : int
        Leading layers with a dense FFN instead of an MoE block (``first_k_dense_replace``;
        0 where every layer is MoE). MoE layers are ``first_dense_layers .. layers - 1``.
    hidden : int
        Model width (``hidden_size``).
    expert_intermediate : int
        Intermediate size of one routed expert (``moe_intermediate_size``, or
        ``intermediate_size`` for models whose only FFNs are experts).
    routed_experts : int
        Routed experts per MoE layer.
    shared_experts : int
        Always-active shared experts per MoE layer (0 if none).
    shared_intermediate : int
        Total intermediate size of a layer's shared expert FFN (0 if none).
    top_k : int
        Routed experts chosen per token and layer.
    norm_topk_prob : bool
        Whether the k selected weights are renormalised to sum 1.
    scoring : str
        ``"softmax"`` or ``"sigmoid"``: how router logits become scores.
    routed_scaling_factor : float
        Multiplier applied to the routed gate weights after (re)normalisation (1.0 if none).
    expert_format : str
        ``"int8-nested"`` (G32 INT8 split into MSB/LSB slices, the paper's baseline) or
        ``"mxfp4"`` (GPT-OSS-20B's shipped 4-bit experts: no LSB slice).
    moe_layer_step : int
        Every ``moe_layer_step``-th layer from ``first_dense_layers`` on is an MoE layer, the
        others dense (1 for the decoder LLMs; 2 for Switch Transformers' ``encoder_sparse_step``).
    ffn : str
        Expert FFN: ``"swiglu"`` (up, gate and down projections: what the PE's VPU and the host
        compiler run) or ``"relu"`` (two projections, ``wi`` and ``wo``: Switch Transformers;
        a preset for routing statistics and trace calibration, refused by the run backends).
    vocab_size, attention_heads, kv_heads : int
        Attention shapes (``vocab_size``, ``num_attention_heads``, ``num_key_value_heads``),
        set for the presets whose non-expert weights the host reserves HB for
        (:func:`.compiler.reserved_hb_bytes`); 0 elsewhere. The head size is
        :attr:`head_dim` = ``hidden / attention_heads``.
    """

    name: str
    hf_repo: str
    layers: int
    first_dense_layers: int
    hidden: int
    expert_intermediate: int
    routed_experts: int
    shared_experts: int
    shared_intermediate: int
    top_k: int
    norm_topk_prob: bool
    scoring: str
    routed_scaling_factor: float = 1.0
    expert_format: str = "int8-nested"
    moe_layer_step: int = 1
    ffn: str = "swiglu"
    vocab_size: int = 0
    attention_heads: int = 0
    kv_heads: int = 0

    def __post_init__(self):
        for f in ("layers", "hidden", "expert_intermediate", "routed_experts", "top_k",
                  "moe_layer_step"):
            v = getattr(self, f)
            if not is_int(v, numpy=False) or v < 1:
                raise ValueError(f"{self.name}: {f}: expected a positive integer, got {v!r}")
        for f in ("first_dense_layers", "shared_experts", "shared_intermediate", "vocab_size",
                  "attention_heads", "kv_heads"):
            v = getattr(self, f)
            if not is_int(v, numpy=False) or v < 0:
                raise ValueError(f"{self.name}: {f}: expected an integer >= 0, got {v!r}")
        if self.first_dense_layers >= self.layers:
            raise ValueError(f"{self.name}: first_dense_layers ({self.first_dense_layers}) "
                             f"leaves no MoE layer of {self.layers}")
        if self.top_k > self.routed_experts:
            raise ValueError(f"{self.name}: top_k ({self.top_k}) > routed_experts "
                             f"({self.routed_experts})")
        if (self.shared_experts == 0) != (self.shared_intermediate == 0):
            raise ValueError(f"{self.name}: shared_experts and shared_intermediate must be both "
                             f"zero or both positive")
        if self.scoring not in _SCORINGS:
            raise ValueError(f"{self.name}: scoring: expected one of {_SCORINGS}, "
                             f"got {self.scoring!r}")
        if self.ffn not in _FFNS:
            raise ValueError(f"{self.name}: ffn: expected one of {_FFNS}, got {self.ffn!r}")
        if self.expert_format not in _FORMATS:
            raise ValueError(f"{self.name}: expert_format: expected one of {_FORMATS}, "
                             f"got {self.expert_format!r}")
        if (self.hidden % QUANT_GROUP) or (self.expert_intermediate % QUANT_GROUP):
            raise ValueError(f"{self.name}: hidden and expert_intermediate must be multiples "
                             f"of the quantization group {QUANT_GROUP}")
        if not self.routed_scaling_factor > 0:
            raise ValueError(f"{self.name}: routed_scaling_factor must be > 0")
        attention = (self.vocab_size, self.attention_heads, self.kv_heads)
        if any(attention) and not all(attention):
            raise ValueError(f"{self.name}: vocab_size, attention_heads and kv_heads must be "
                             f"all zero or all positive")
        if self.attention_heads and (self.hidden % self.attention_heads
                                     or self.attention_heads % self.kv_heads):
            raise ValueError(f"{self.name}: attention_heads ({self.attention_heads}) must divide "
                             f"hidden ({self.hidden}) and be a multiple of kv_heads "
                             f"({self.kv_heads})")

    # -- layers ---------------------------------------------------------------------------------
    @property
    def moe_layers(self) -> int:
        """Number of MoE layers."""
        return len(self.moe_layer_ids)

    @property
    def moe_layer_ids(self) -> range:
        """Decoder-layer indices of the MoE layers (the ``layer`` column of a trace)."""
        return range(self.first_dense_layers, self.layers, self.moe_layer_step)

    @property
    def head_dim(self) -> int:
        """Attention head size: ``hidden / attention_heads`` (0 without attention shapes)."""
        return self.hidden // self.attention_heads if self.attention_heads else 0

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices of one expert: 3 for SwiGLU (up, gate, down), 2 for ReLU."""
        return 3 if self.ffn == "swiglu" else 2

    # -- sizes ----------------------------------------------------------------------------------
    @property
    def expert_weights(self) -> int:
        """Weights of one routed expert: ``ffn_matrices * hidden * expert_intermediate`` (up,
        gate, down for SwiGLU)."""
        return self.ffn_matrices * self.hidden * self.expert_intermediate

    @property
    def expert_scale_bytes(self) -> int:
        """Bytes of one expert's group scales (part of its MSB slice): 2-byte FP16 per 32
        weights for INT8 experts, 1-byte E8M0 per 32 for MXFP4."""
        scale = SCALE_BYTES if self.expert_format == "int8-nested" else 1
        return int(g32_bytes(self.expert_weights, 0, scale))

    @property
    def expert_msb_bytes(self) -> int:
        """Bytes of one expert's MSB slice as held in HB: 4 bits a weight plus the group scales
        (:attr:`expert_scale_bytes`)."""
        scale = SCALE_BYTES if self.expert_format == "int8-nested" else 1
        return int(g32_bytes(self.expert_weights, 4, scale))

    @property
    def expert_lsb_bytes(self) -> int:
        """Bytes of one expert's LSB slice (4 bits a weight; 0 for MXFP4 experts)."""
        return self.expert_weights // 2 if self.expert_format == "int8-nested" else 0

    @property
    def expert_bytes(self) -> int:
        """Bytes of one whole expert (MSB slice with scales + LSB slice)."""
        return self.expert_msb_bytes + self.expert_lsb_bytes

    @property
    def routed_expert_count(self) -> int:
        """Routed experts over all MoE layers."""
        return self.moe_layers * self.routed_experts

    # -- router ---------------------------------------------------------------------------------
    def scores(self, logits) -> np.ndarray:
        """Router scores of logits ``[..., routed_experts]`` (float64): softmax over all routed
        experts, or element-wise sigmoid. Raises ValueError on a wrong last axis or NaN/Inf."""
        z = np.asarray(logits, dtype=np.float64)
        if z.ndim < 1 or z.shape[-1] != self.routed_experts:
            raise ValueError(f"logits: expected shape [..., {self.routed_experts}] for "
                             f"{self.name}, got {z.shape}")
        if not np.isfinite(z).all():
            raise ValueError("logits: NaN or Inf router logits")
        if self.scoring == "sigmoid":
            return 1.0 / (1.0 + np.exp(-z))
        z = z - z.max(axis=-1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=-1, keepdims=True)

    def route(self, logits, *, selection_bias=None):
        """Route logits ``[T, routed_experts]`` as the model does.

        Order: scores over all experts (softmax/sigmoid) -> top-k of the scores (of
        ``scores + selection_bias`` when given: DeepSeek-V3-style ``noaux_tc`` correction bias,
        used for selection only) -> renormalise the k weights if ``norm_topk_prob`` ->
        multiply by ``routed_scaling_factor``. Ties go to the lower expert id.

        Returns ``(ids [T, k] int16 best first, weights [T, k] float64, scores [T, E] float64)``.
        Raises ValueError (as :meth:`scores`) for logits not ``[T, routed_experts]`` or not
        finite, and a ``selection_bias`` not ``routed_experts`` finite values (callers such as
        :func:`~.trace.trace_from_router_logits` turn it into their own error).
        """
        s = self.scores(logits)
        if s.ndim != 2:
            raise ValueError(f"logits: expected [T, {self.routed_experts}], got {s.shape}")
        sel = s
        if selection_bias is not None:
            bias = np.asarray(selection_bias, np.float64)
            if bias.shape != (self.routed_experts,) or not np.isfinite(bias).all():
                raise ValueError(f"selection_bias: expected {self.routed_experts} finite "
                                 f"values, got shape {bias.shape}")
            sel = s + bias
        # stable sort of -sel: ties keep the lower id first
        order = np.argsort(-sel, axis=-1, kind="stable")[:, : self.top_k]
        w = np.take_along_axis(s, order, axis=-1)
        if self.norm_topk_prob:
            w = w / w.sum(axis=-1, keepdims=True)
        w = w * self.routed_scaling_factor
        return order.astype(np.int16), w, s


def _p(**kw) -> ModelPreset:
    return ModelPreset(**kw)


#: The presets, by lower-case name.
MODEL_PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    # Paper Table 2 -------------------------------------------------------------------------------
    _p(name="qwen3-30b-a3b", hf_repo="Qwen/Qwen3-30B-A3B", layers=48, first_dense_layers=0,
       hidden=2048, expert_intermediate=768, routed_experts=128, shared_experts=0,
       shared_intermediate=0, top_k=8, norm_topk_prob=True, scoring="softmax"),
    _p(name="glm-4.7-flash", hf_repo="zai-org/GLM-4.7-Flash", layers=47, first_dense_layers=1,
       hidden=2048, expert_intermediate=1536, routed_experts=64, shared_experts=1,
       shared_intermediate=1536, top_k=4, norm_topk_prob=True, scoring="sigmoid",
       routed_scaling_factor=1.8),
    _p(name="deepseek-v2-lite", hf_repo="deepseek-ai/DeepSeek-V2-Lite", layers=27,
       first_dense_layers=1, hidden=2048, expert_intermediate=1408, routed_experts=64,
       shared_experts=2, shared_intermediate=2 * 1408, top_k=6, norm_topk_prob=False,
       scoring="softmax"),
    _p(name="gpt-oss-20b", hf_repo="openai/gpt-oss-20b", layers=24, first_dense_layers=0,
       hidden=2880, expert_intermediate=2880, routed_experts=32, shared_experts=0,
       shared_intermediate=0, top_k=4, norm_topk_prob=True, scoring="softmax",
       expert_format="mxfp4"),
    # Models of the real traces -------------------------------------------------------------------
    _p(name="mixtral-8x7b", hf_repo="mistralai/Mixtral-8x7B-v0.1", layers=32,
       first_dense_layers=0, hidden=4096, expert_intermediate=14336, routed_experts=8,
       shared_experts=0, shared_intermediate=0, top_k=2, norm_topk_prob=True,
       scoring="softmax", vocab_size=32000, attention_heads=32, kv_heads=8),
    _p(name="olmoe-1b-7b", hf_repo="allenai/OLMoE-1B-7B-0924", layers=16, first_dense_layers=0,
       hidden=2048, expert_intermediate=1024, routed_experts=64, shared_experts=0,
       shared_intermediate=0, top_k=8, norm_topk_prob=False, scoring="softmax"),
    _p(name="qwen1.5-moe-a2.7b", hf_repo="Qwen/Qwen1.5-MoE-A2.7B", layers=24,
       first_dense_layers=0, hidden=2048, expert_intermediate=1408, routed_experts=60,
       shared_experts=1, shared_intermediate=5632, top_k=4, norm_topk_prob=False,
       scoring="softmax"),
    # Expert-usage statistics (calibration input; not run by the backends) --------------------------
    _p(name="switch-base-128", hf_repo="google/switch-base-128", layers=12,
       first_dense_layers=1, moe_layer_step=2, hidden=768, expert_intermediate=3072,
       routed_experts=128, shared_experts=0, shared_intermediate=0, top_k=1,
       norm_topk_prob=False, scoring="softmax", ffn="relu"),
)}

#: The models of the paper's Table 3 (preset names), in its order: the whole-decoder model's
#: evaluation (:mod:`.paper_eval`) and the compute calibration's shipped table
#: (:mod:`.compute_calib`) cover these.
TABLE3_MODELS = ("qwen3-30b-a3b", "glm-4.7-flash", "deepseek-v2-lite", "gpt-oss-20b")

#: Where each figure comes from: preset name -> attribute -> "config.json field" (of the preset's
#: ``hf_repo``) or the modelling code that fixes a behaviour the config does not carry.
MODEL_SOURCES: dict[str, dict[str, str]] = {
    "qwen3-30b-a3b": {
        "layers": "num_hidden_layers=48",
        "first_dense_layers": "decoder_sparse_step=1, mlp_only_layers=[] (every layer MoE)",
        "hidden": "hidden_size=2048", "expert_intermediate": "moe_intermediate_size=768",
        "routed_experts": "num_experts=128", "shared_experts": "none (Qwen3MoeSparseMoeBlock)",
        "top_k": "num_experts_per_tok=8", "norm_topk_prob": "norm_topk_prob=true",
        "scoring": "softmax (transformers Qwen3MoeSparseMoeBlock)"},
    "glm-4.7-flash": {
        "layers": "num_hidden_layers=47", "first_dense_layers": "first_k_dense_replace=1",
        "hidden": "hidden_size=2048", "expert_intermediate": "moe_intermediate_size=1536",
        "routed_experts": "n_routed_experts=64",
        "shared_experts": "n_shared_experts=1 (shared FFN of n_shared * moe_intermediate_size)",
        "top_k": "num_experts_per_tok=4", "norm_topk_prob": "norm_topk_prob=true",
        "scoring": "sigmoid (topk_method=noaux_tc, Glm4MoeLite gate as DeepSeek-V3)",
        "routed_scaling_factor": "routed_scaling_factor=1.8"},
    "deepseek-v2-lite": {
        "layers": "num_hidden_layers=27", "first_dense_layers": "first_k_dense_replace=1",
        "hidden": "hidden_size=2048", "expert_intermediate": "moe_intermediate_size=1408",
        "routed_experts": "n_routed_experts=64", "shared_experts": "n_shared_experts=2",
        "top_k": "num_experts_per_tok=6", "norm_topk_prob": "norm_topk_prob=false",
        "scoring": "scoring_func=softmax (topk_method=greedy)",
        "routed_scaling_factor": "routed_scaling_factor=1.0"},
    "gpt-oss-20b": {
        "layers": "num_hidden_layers=24", "hidden": "hidden_size=2880",
        "expert_intermediate": "intermediate_size=2880", "routed_experts": "num_local_experts=32",
        "top_k": "num_experts_per_tok=4 (experts_per_token=4)",
        "norm_topk_prob": "softmax over the top-k logits (transformers GptOssTopKRouter), "
                          "which equals softmax -> top-k -> renormalise",
        "scoring": "softmax", "expert_format": "quantization_config.quant_method=mxfp4"},
    "mixtral-8x7b": {
        "layers": "num_hidden_layers=32", "hidden": "hidden_size=4096",
        "expert_intermediate": "intermediate_size=14336", "routed_experts": "num_local_experts=8",
        "top_k": "num_experts_per_tok=2",
        "norm_topk_prob": "always renormalised (transformers MixtralSparseMoeBlock: "
                          "routing_weights /= sum)",
        "scoring": "softmax", "vocab_size": "vocab_size=32000",
        "attention_heads": "num_attention_heads=32", "kv_heads": "num_key_value_heads=8"},
    "olmoe-1b-7b": {
        "layers": "num_hidden_layers=16", "hidden": "hidden_size=2048",
        "expert_intermediate": "intermediate_size=1024", "routed_experts": "num_experts=64",
        "top_k": "num_experts_per_tok=8", "norm_topk_prob": "norm_topk_prob=false",
        "scoring": "softmax (transformers OlmoeSparseMoeBlock)"},
    "qwen1.5-moe-a2.7b": {
        "layers": "num_hidden_layers=24", "hidden": "hidden_size=2048",
        "expert_intermediate": "moe_intermediate_size=1408", "routed_experts": "num_experts=60",
        "shared_experts": "one shared expert of shared_expert_intermediate_size=5632 "
                          "(with a sigmoid shared_expert_gate)",
        "top_k": "num_experts_per_tok=4", "norm_topk_prob": "norm_topk_prob=false",
        "scoring": "softmax (transformers Qwen2MoeSparseMoeBlock)"},
    "switch-base-128": {
        "layers": "num_layers=12 (the encoder; num_decoder_layers=12 likewise)",
        "first_dense_layers": "encoder_sparse_step=2: block i is sparse when i % 2 == 1 "
                              "(transformers SwitchTransformersStack), blocks 1, 3, ..., 11",
        "moe_layer_step": "encoder_sparse_step=2",
        "hidden": "d_model=768", "expert_intermediate": "d_ff=3072",
        "routed_experts": "num_experts=128", "top_k": "num_selected_experts=1",
        "norm_topk_prob": "no renormalisation: the expert output is scaled by the router "
                          "probability (transformers SwitchTransformersTop1Router)",
        "scoring": "softmax (router_dtype=float32)",
        "ffn": "feed_forward_proj=relu, is_gated_act=false (wi, wo)"},
}


def model_preset(name) -> ModelPreset:
    """The preset called ``name`` (case-insensitive; a :class:`ModelPreset` passes through).

    Raises :class:`~elmoe3d.errors.UserError` listing the known names."""
    if isinstance(name, ModelPreset):
        return name
    key = str(name).strip().lower()
    try:
        return MODEL_PRESETS[key]
    except KeyError:
        same = preset_for_model_id(key)           # a checkpoint's id: name its preset
        raise UserError(f"unknown model preset {name!r}"
                        + (f" (a checkpoint of {same.name}: give {same.name})" if same else "")
                        + f"; known presets: {', '.join(MODEL_PRESETS)}") from None


#: Words of a checkpoint name that do not change the routing: fine-tunes and re-quantizations
#: of one base model route alike (``Mixtral-8x7B-Instruct-v0.1-FP8`` is ``mixtral-8x7b``).
_VARIANT_WORDS = {"instruct", "chat", "base", "it", "sft", "dpo", "fp8", "fp16", "bf16", "awq",
                  "gptq", "int4", "int8", "hf"}


def _model_words(text) -> tuple:
    base = str(text).strip().lower().rsplit("/", 1)[-1]
    words = [w for w in re.split(r"[-_]", base) if w]
    return tuple(w for w in words if w not in _VARIANT_WORDS
                 and not re.fullmatch(r"v\d+\.\d+(\.\d+)*|\d{4}", w))


def preset_for_model_id(model_id) -> ModelPreset | None:
    """The preset a log's model id names, or None: a preset name, its Hugging Face repository,
    or a checkpoint of the same base model (organisation, version and variant words such as
    ``Instruct``, ``FP8``, dotted versions such as ``v0.1`` and 4-digit release dates ignored;
    a generation such as ``V2`` is kept:
    ``mistralai/Mixtral-8x7B-Instruct-v0.1`` is ``mixtral-8x7b``)."""
    key = str(model_id).strip().lower()
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    words = _model_words(key)
    for p in MODEL_PRESETS.values():
        if key == p.hf_repo.lower() or words in (_model_words(p.hf_repo), _model_words(p.name)):
            return p
    return None

"""The whole decoder of an MoE model, per step and batch: weights, KV cache and MACs of every
part (paper Sections 6-7; issue 26 item 1).

A :class:`~.models.ModelPreset` carries the expert shapes the host and the PE use; this module
adds what the rest of the decoder needs, as :class:`DecoderShape` (one per paper model, every
figure read from the model's Hugging Face ``config.json``; :data:`DECODER_SOURCES` names the
field of each, as :data:`~.models.MODEL_SOURCES` does), and turns a step into bytes and MACs:

* attention with its KV cache: GQA (Qwen3-30B-A3B, GPT-OSS-20B, Mixtral-8x7B), DeepSeek-V2's
  multi-head latent attention (DeepSeek-V2-Lite, GLM-4.7-Flash: the compressed KV of
  ``kv_lora_rank + qk_rope_head_dim`` values a token and layer is what is cached), GPT-OSS's
  sliding-window layers (``sliding_window`` tokens of KV on every other layer);
* dense FFN layers (``first_dense_layers`` of them), shared experts, the router, the LM head
  and the embedding rows;
* the routed experts (their bytes come from the preset: :attr:`~.models.ModelPreset.expert_bytes`
  and its MSB / LSB slices).

Weights are G32 INT8 with one FP16 scale per 32 (the paper's baseline precision, Section 7,
"Inference Framework": 8.5 bits a weight, :data:`~.models.QUANT_GROUP`,
:data:`~.models.SCALE_BYTES`); GPT-OSS-20B's experts stay MXFP4 as shipped (the preset's
``expert_format``). Their MSB slice (the draft's 4-bit weights, Elastic-SD and the nested
dense layers) is 4 bits plus the same scales. The KV cache is FP16 (:data:`KV_BYTES`; the
paper does not say). Units: bytes and multiply-accumulates (MACs); nothing here is timed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import UserError
from .models import ModelPreset, g32_bytes, model_preset


__all__ = ["DecoderShape", "DECODER_SHAPES", "DECODER_SOURCES", "decoder_shape", "gqa_attention_gemms",
           "weight_bytes", "KV_BYTES", "DecoderSizes"]

#: Bytes of one cached K or V value (FP16; the paper gives no KV precision).
KV_BYTES = 2


def weight_bytes(weights, bits=8) -> float:
    """Bytes of ``weights`` G32-quantized weights at ``bits`` bits (8: INT8, 4: the MSB slice)
    with one FP16 scale per :data:`~.models.QUANT_GROUP` weights (:func:`~.models.g32_bytes`)."""
    return g32_bytes(weights, bits)


def gqa_attention_gemms(q_heads: int, kv_heads: int, head_dim: int, context: int) -> tuple:
    """The attention GEMMs of one token of one sequence over ``context`` cached tokens in one
    grouped-query layer (:meth:`DecoderShape.attention_gemms`' form): per KV head,
    ``scores`` (``q_heads / kv_heads`` query rows x ``head_dim`` -> ``context``) and
    ``values`` (``context`` -> ``head_dim``)."""
    g = q_heads // kv_heads
    return (("scores", head_dim, context, g, kv_heads),
            ("values", context, head_dim, g, kv_heads))


@dataclass(frozen=True)
class DecoderShape:
    """The non-expert shapes of one decoder (its experts are the :class:`~.models.ModelPreset`'s).

    Attributes
    ----------
    preset : str
        The :class:`~.models.ModelPreset` name.
    vocab : int
        Vocabulary (``vocab_size``): the LM head is ``vocab x hidden``.
    attention : str
        ``"gqa"`` (grouped-query; multi-head when ``kv_heads == q_heads``) or ``"mla"``
        (DeepSeek-V2's multi-head latent attention).
    q_heads, kv_heads, head_dim : int
        GQA heads and head size (MLA: ``q_heads`` only).
    q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim : int
        MLA: query down-projection rank (0: a plain ``q_proj``), compressed-KV rank, per-head
        no-RoPE and RoPE query/key sizes, value head size.
    dense_intermediate : int
        Intermediate size of the leading dense FFN layers (``intermediate_size``; 0 without).
    sliding_window, sliding_layers : int
        Tokens a sliding-window layer attends to and how many layers slide (0, 0: none).
    """

    preset: str
    vocab: int
    attention: str
    q_heads: int
    kv_heads: int = 0
    head_dim: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    dense_intermediate: int = 0
    sliding_window: int = 0
    sliding_layers: int = 0

    def __post_init__(self):
        if self.attention not in ("gqa", "mla"):
            raise ValueError(f"{self.preset}: attention: expected 'gqa' or 'mla', got "
                             f"{self.attention!r}")
        need = (("kv_heads", "head_dim") if self.attention == "gqa"
                else ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim"))
        for f in ("vocab", "q_heads") + need:
            if getattr(self, f) < 1:
                raise ValueError(f"{self.preset}: {f}: expected a positive integer")

    @property
    def model(self) -> ModelPreset:
        return model_preset(self.preset)

    # -- weights of one layer -------------------------------------------------------------------
    @property
    def attention_weights(self) -> int:
        """Weights of one layer's attention projections."""
        H = self.model.hidden
        if self.attention == "gqa":
            q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
            return 2 * H * q + 2 * H * kv
        qk = self.qk_nope_dim + self.qk_rope_dim
        q = (H * self.q_lora_rank + self.q_lora_rank * self.q_heads * qk if self.q_lora_rank
             else H * self.q_heads * qk)
        kv_a = H * (self.kv_lora_rank + self.qk_rope_dim)
        kv_b = self.kv_lora_rank * self.q_heads * (self.qk_nope_dim + self.v_head_dim)
        o = self.q_heads * self.v_head_dim * H
        return q + kv_a + kv_b + o

    @property
    def attention_linears(self) -> tuple:
        """One layer's attention projections as linear layers, ``(name, K, N)`` (in and out
        features, PyTorch ``Linear`` shapes): GQA ``q``, ``k``, ``v``, ``o``; MLA ``q`` (or
        ``q_a`` and ``q_b`` with a query rank), ``kv_a`` (to the compressed KV and the RoPE
        key), ``kv_b``, ``o``. Their ``K x N`` sum to :attr:`attention_weights`."""
        H = self.model.hidden
        if self.attention == "gqa":
            q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
            return (("q", H, q), ("k", H, kv), ("v", H, kv), ("o", q, H))
        qk = self.q_heads * (self.qk_nope_dim + self.qk_rope_dim)
        q = ((("q_a", H, self.q_lora_rank), ("q_b", self.q_lora_rank, qk)) if self.q_lora_rank
             else (("q", H, qk),))
        return q + (("kv_a", H, self.kv_lora_rank + self.qk_rope_dim),
                    ("kv_b", self.kv_lora_rank,
                     self.q_heads * (self.qk_nope_dim + self.v_head_dim)),
                    ("o", self.q_heads * self.v_head_dim, H))

    def attention_gemms(self, context: int) -> tuple:
        """One token's attention over ``context`` cached tokens in one full layer as the
        GEMMs of one sequence, ``(name, K, N, rows, count)``: ``scores`` (the queries times
        the cached keys) and ``values`` (the scores times the cached values); ``rows`` the
        query rows one token gives a GEMM (the query heads that share its KV: GQA's
        ``q_heads / kv_heads``, MLA's absorbed form every head over the compressed KV),
        ``count`` the GEMMs (GQA's KV heads, MLA's one). ``rows x K x N x count`` sums to
        :meth:`attention_macs`."""
        if self.attention == "gqa":
            return gqa_attention_gemms(self.q_heads, self.kv_heads, self.head_dim, context)
        return (("scores", self.kv_lora_rank + self.qk_rope_dim, context, self.q_heads, 1),
                ("values", context, self.kv_lora_rank, self.q_heads, 1))

    @property
    def kv_values_per_token(self) -> int:
        """K and V values one token leaves in one layer's cache (MLA: the compressed KV and
        the shared RoPE key)."""
        if self.attention == "gqa":
            return 2 * self.kv_heads * self.head_dim
        return self.kv_lora_rank + self.qk_rope_dim

    def attention_macs(self, context: int) -> int:
        """MACs of one token's attention over ``context`` cached tokens in one full layer
        (scores and the weighted sum; MLA absorbed into the compressed KV)."""
        if self.attention == "gqa":
            return 2 * self.q_heads * self.head_dim * context
        return self.q_heads * (2 * self.kv_lora_rank + self.qk_rope_dim) * context

    def kv_tokens(self, context: int) -> int:
        """Cached tokens read over all layers for one sequence at ``context`` (sliding layers
        read at most ``sliding_window``)."""
        L = self.model.layers
        slide = min(context, self.sliding_window) if self.sliding_layers else context
        return (L - self.sliding_layers) * context + self.sliding_layers * slide

    def sizes(self) -> "DecoderSizes":
        return DecoderSizes.of(self)


@dataclass(frozen=True)
class DecoderSizes:
    """Weight counts of a decoder by part (weights, not bytes), built by :meth:`of`.

    ``attention`` (all layers), ``router`` (all MoE layers), ``dense_ffn`` (the leading dense
    layers), ``shared`` (shared experts of all MoE layers), ``lm_head``; ``static`` is their
    sum (what HB holds first, paper Fig. 12); ``experts`` the routed experts of all layers."""

    attention: int
    router: int
    dense_ffn: int
    shared: int
    lm_head: int
    experts: int

    @classmethod
    def of(cls, shape: DecoderShape) -> "DecoderSizes":
        m = shape.model
        H = m.hidden
        dense_layers = m.layers - m.moe_layers
        return cls(attention=m.layers * shape.attention_weights,
                   router=m.moe_layers * m.routed_experts * H,
                   dense_ffn=dense_layers * m.ffn_matrices * H * shape.dense_intermediate,
                   shared=m.moe_layers * m.ffn_matrices * H * m.shared_intermediate,
                   lm_head=shape.vocab * H,
                   experts=m.routed_expert_count * m.expert_weights)

    @property
    def static(self) -> int:
        return self.attention + self.router + self.dense_ffn + self.shared + self.lm_head


def _s(**kw) -> DecoderShape:
    return DecoderShape(**kw)


#: The decoder shapes, by preset name.
DECODER_SHAPES: dict[str, DecoderShape] = {s.preset: s for s in (
    _s(preset="qwen3-30b-a3b", vocab=151936, attention="gqa", q_heads=32, kv_heads=4,
       head_dim=128),
    _s(preset="glm-4.7-flash", vocab=154880, attention="mla", q_heads=20, q_lora_rank=768,
       kv_lora_rank=512, qk_nope_dim=192, qk_rope_dim=64, v_head_dim=256,
       dense_intermediate=10240),
    _s(preset="deepseek-v2-lite", vocab=102400, attention="mla", q_heads=16, q_lora_rank=0,
       kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
       dense_intermediate=10944),
    _s(preset="gpt-oss-20b", vocab=201088, attention="gqa", q_heads=64, kv_heads=8,
       head_dim=64, sliding_window=128, sliding_layers=12),
    _s(preset="mixtral-8x7b", vocab=32000, attention="gqa", q_heads=32, kv_heads=8,
       head_dim=128),
)}

#: Where each figure comes from: preset -> attribute -> ``config.json`` field of the preset's
#: Hugging Face repository.
DECODER_SOURCES: dict[str, dict[str, str]] = {
    "qwen3-30b-a3b": {
        "vocab": "vocab_size=151936 (tie_word_embeddings=false)",
        "q_heads": "num_attention_heads=32", "kv_heads": "num_key_value_heads=4",
        "head_dim": "head_dim=128 (not hidden / heads)"},
    "glm-4.7-flash": {
        "vocab": "vocab_size=154880 (tie_word_embeddings=false)",
        "attention": "Glm4MoeLiteAttention: DeepSeek-V3 MLA",
        "q_heads": "num_attention_heads=20", "q_lora_rank": "q_lora_rank=768",
        "kv_lora_rank": "kv_lora_rank=512", "qk_nope_dim": "qk_nope_head_dim=192",
        "qk_rope_dim": "qk_rope_head_dim=64", "v_head_dim": "v_head_dim=256",
        "dense_intermediate": "intermediate_size=10240 (first_k_dense_replace=1)"},
    "deepseek-v2-lite": {
        "vocab": "vocab_size=102400 (tie_word_embeddings=false)",
        "attention": "DeepseekV2Attention: MLA", "q_heads": "num_attention_heads=16",
        "q_lora_rank": "q_lora_rank=null (plain q_proj)", "kv_lora_rank": "kv_lora_rank=512",
        "qk_nope_dim": "qk_nope_head_dim=128", "qk_rope_dim": "qk_rope_head_dim=64",
        "v_head_dim": "v_head_dim=128",
        "dense_intermediate": "intermediate_size=10944 (first_k_dense_replace=1)"},
    "gpt-oss-20b": {
        "vocab": "vocab_size=201088 (tie_word_embeddings=false)",
        "q_heads": "num_attention_heads=64", "kv_heads": "num_key_value_heads=8",
        "head_dim": "head_dim=64", "sliding_window": "sliding_window=128",
        "sliding_layers": "layer_types: sliding_attention on the 12 even layers of 24"},
    "mixtral-8x7b": {
        "vocab": "vocab_size=32000", "q_heads": "num_attention_heads=32",
        "kv_heads": "num_key_value_heads=8", "head_dim": "hidden_size / num_attention_heads"},
}


def decoder_shape(name) -> DecoderShape:
    """The :class:`DecoderShape` of a preset (name or :class:`~.models.ModelPreset`); raises
    :class:`~elmoe3d.errors.UserError` naming the presets that have one."""
    key = model_preset(name).name
    try:
        return DECODER_SHAPES[key]
    except KeyError:
        raise UserError(f"model {key!r} has no whole-decoder shape; known: "
                        f"{', '.join(DECODER_SHAPES)}") from None

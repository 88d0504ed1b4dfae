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
  and its MSB / LSB slices);
* the dense draft models of the SD schemes (:class:`DraftModel`: each target's published
  EAGLE-3 head, :func:`eagle_head`; Qwen2.5-1.5B-Instruct, :data:`QWEN25_1P5B`), and every
  weight of a step as linear layers (:attr:`DecoderShape.attention_linears`,
  :meth:`DecoderShape.attention_gemms`, :attr:`DraftModel.linears`) for the compute model.

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


__all__ = ["DecoderShape", "DECODER_SHAPES", "DECODER_SOURCES", "decoder_shape",
           "gqa_attention_gemms", "weight_bytes", "KV_BYTES", "CONTEXT", "DecoderSizes",
           "DraftModel", "EAGLE3_HEADS", "eagle_head", "QWEN25_1P5B", "DRAFT_MODELS"]

#: Bytes of one cached K or V value (FP16; the paper gives no KV precision).
KV_BYTES = 2
#: Tokens of context a sequence attends to (Section 7: "1k sequence length").
CONTEXT = 1024


def weight_bytes(weights, bits=8) -> float:
    """Bytes of ``weights`` G32-quantized weights at ``bits`` bits (8: INT8, 4: the MSB slice)
    with one FP16 scale per :data:`~.models.QUANT_GROUP` weights (:func:`~.models.g32_bytes`)."""
    return g32_bytes(weights, bits)


def gqa_attention_gemms(q_heads: int, kv_heads: int, head_dim: int, context: int) -> tuple:
    """The attention GEMMs of one token of one sequence over ``context`` cached tokens in one
    grouped-query layer (:meth:`DecoderShape.attention_gemms`' form): per KV head,
    ``scores`` (``q_heads / kv_heads`` query rows x ``head_dim`` -> ``context``) and
    ``values`` (``context`` -> ``head_dim``). Raises ValueError unless ``kv_heads`` divides
    ``q_heads``."""
    if kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(f"kv_heads: expected a positive divisor of q_heads ({q_heads}), got "
                         f"{kv_heads}")
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
    tied_embeddings : bool
        The input embedding is the LM head's weights (``tie_word_embeddings``; False for
        every preset): it is then stored once.
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
    tied_embeddings: bool = False

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

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token leaves in one layer's KV cache: :attr:`kv_values_per_token` at
        :data:`KV_BYTES` each."""
        return self.kv_values_per_token * KV_BYTES

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
        """The weight counts of this decoder by part (:class:`DecoderSizes`; the input
        embedding, ``vocab x hidden``, is not among them)."""
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


# == draft models ==================================================================================

@dataclass(frozen=True)
class DraftModel:
    """A dense draft model (EAGLE-3 head, small LM): ``layers`` decoder layers of GQA attention
    and a SwiGLU FFN, an LM head of ``vocab`` rows; ``extra`` more weights (EAGLE-3's fc);
    ``source`` names the figures' origin.

    ``bits``: how its weights are stored (:attr:`weight_bytes`): 16, BF16 as released (the
    default: Qwen2.5-1.5B-Instruct's and every EAGLE-3 head's ``config.json`` say ``torch_dtype
    bfloat16``; the paper's G32 INT8, Section 7 "Inference Framework", is said of the target
    models, and its alphas are those of the released drafts), or 8, G32 INT8 as the target (what
    the first landing assumed). Its compute runs on the die at W8A8 either way, as its linear
    layers (:attr:`linears`, :meth:`attention_gemms`; section 2 of docs/paper.md): BF16 weights
    as G32 INT8 on the PE, the bytes read as stored."""

    name: str
    layers: int
    hidden: int
    attn_in: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    extra: int
    source: str
    bits: int = 16

    def __post_init__(self):
        if self.extra % self.hidden:
            raise ValueError(f"{self.name}: extra: expected a multiple of hidden "
                             f"({self.hidden}) weights (a hidden-wide fc), got {self.extra}")
        if self.bits not in (8, 16):
            raise ValueError(f"{self.name}: bits: expected 8 (G32 INT8) or 16 (BF16), got "
                             f"{self.bits!r}")

    @property
    def weight_bytes(self) -> float:
        """Bytes of its weights: 2 a weight in BF16, G32 INT8 with FP16 scales at 8 bits."""
        return self.step_bytes(True)

    @property
    def weights(self) -> int:
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.attn_in * (q + 2 * kv) + q * self.hidden
        return (self.layers * (attn + 3 * self.hidden * self.intermediate)
                + self.vocab * self.hidden + self.extra)

    def step_weights(self, first: bool = True) -> int:
        """Weights one draft step reads: all of :attr:`weights` on an iteration's first step;
        a later step skips the fc of ``extra`` (EAGLE-3's fc maps the target's concatenated 3 x
        hidden features, which only the first step takes: later steps feed the head's own
        hidden-wide state; SpecForge / SGLang ``llama_eagle3``)."""
        return self.weights - (0 if first else self.extra)

    def step_bytes(self, first: bool = True) -> float:
        """Bytes of :meth:`step_weights`, stored as :attr:`weight_bytes`."""
        n = self.step_weights(first)
        return 2.0 * n if self.bits == 16 else weight_bytes(n)

    def step_linears(self, first: bool = True) -> tuple:
        """:attr:`linears` of one draft step: the fc on the first step only
        (:meth:`step_weights`)."""
        return self.linears if first else tuple(x for x in self.linears if x[0] != "fc")

    @property
    def linears(self) -> tuple:
        """All its weights as linear layers, ``(name, K, N, count)`` (``count`` layers of
        the shape; one draft step's: :meth:`step_linears`): q, k, v, o, gate, up and down of
        every layer, the LM head, and
        the fc of ``extra`` weights (EAGLE-3's 3 x hidden -> hidden). ``K x N x count`` sums
        to :attr:`weights`."""
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        H, L = self.hidden, self.layers
        out = (("q", self.attn_in, q, L), ("k", self.attn_in, kv, L),
               ("v", self.attn_in, kv, L), ("o", q, H, L), ("gate", H, self.intermediate, L),
               ("up", H, self.intermediate, L), ("down", self.intermediate, H, L),
               ("lm_head", H, self.vocab, 1))
        return out + ((("fc", self.extra // H, H, 1),) if self.extra else ())

    def attention_gemms(self, context: int) -> tuple:
        """One token's attention over ``context`` cached tokens in all its layers
        (:func:`~.decoder.gqa_attention_gemms` of a layer, ``count`` over the layers)."""
        return tuple((n, k, m, r, c * self.layers)
                     for n, k, m, r, c in gqa_attention_gemms(self.q_heads, self.kv_heads,
                                                              self.head_dim, context))

    @property
    def kv_per_token(self) -> int:
        """KV bytes a token leaves in all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim * KV_BYTES


#: The EAGLE-3 head of each Table 3 target, from a published head's ``config.json`` (one
#: ``LlamaForCausalLMEagle3`` decoder layer at the target's ``hidden_size``): ``intermediate_size``,
#: ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``draft_vocab_size``, and the
#: source. Every one is 32,000 draft tokens and ``torch_dtype`` bfloat16. MLA targets get a GQA
#: (or MHA) head: EAGLE-3 heads are Llama layers whatever the target's attention.
EAGLE3_HEADS = {
    "qwen3-30b-a3b": (6144, 32, 4, 128, 32000,
                      "sgl-project/SpecForge configs/qwen3-30B-eagle3.json: hidden_size=2048, "
                      "intermediate_size=6144, num_attention_heads=32, num_key_value_heads=4, "
                      "head_dim=128, draft_vocab_size=32000, torch_dtype=bfloat16"),
    "glm-4.7-flash": (8192, 16, 4, 128, 32000,
                      "thoughtworks/GLM-4.7-Flash-Eagle3 (the head the EAGLE README lists for "
                      "GLM-4.7-Flash; 291 MB in BF16): hidden 2048, 16 q / 4 kv heads of 128, "
                      "SwiGLU 8192, draft vocab 32000, no embed_tokens (the target's)"),
    "deepseek-v2-lite": (10944, 16, 16, 128, 32000,
                         "SpecForge configs/deepseek-v2-lite-eagle3.json: hidden_size=2048, "
                         "intermediate_size=10944, num_attention_heads=16, "
                         "num_key_value_heads=16, head_dim=128, draft_vocab_size=32000, "
                         "torch_dtype=bfloat16"),
    "gpt-oss-20b": (17280, 64, 8, 64, 32000,
                    "sgl-project/SpecForge configs/gpt-oss-20B-eagle3.json: hidden_size=2880, "
                    "intermediate_size=17280, num_attention_heads=64, num_key_value_heads=8, "
                    "head_dim=64, draft_vocab_size=32000, torch_dtype=bfloat16"),
}


def eagle_head(shape: DecoderShape) -> DraftModel:
    """The EAGLE-3 head of a target (Li et al. 2025b): one decoder layer at the target's width
    whose attention takes the concatenated embedding and feature (2 x hidden), an fc fusing
    three target features (3 x hidden -> hidden) and its own LM head over the draft vocabulary
    (the input embedding is the target's). FFN, heads and draft vocabulary from the published
    head of :data:`EAGLE3_HEADS`; a target without one (Mixtral) gets the placeholder of the
    first landing: FFN 3 x hidden, the target's GQA heads, 32,000 tokens."""
    m = shape.model
    H = m.hidden
    if m.name in EAGLE3_HEADS:
        inter, qh, kvh, hd, vocab, src = EAGLE3_HEADS[m.name]
        return DraftModel(f"eagle3-{m.name}", 1, H, 2 * H, inter, qh, kvh, hd, vocab,
                          3 * H * H, f"EAGLE-3 (Li et al. 2025b), fc 3H->H; {src}")
    if shape.attention == "gqa":
        qh, kvh, hd = shape.q_heads, shape.kv_heads, shape.head_dim
    else:
        qh, kvh, hd = shape.q_heads, shape.q_heads, 128
    return DraftModel(f"eagle3-{m.name}", 1, H, 2 * H, 3 * H, qh, kvh, hd, 32000, 3 * H * H,
                      "EAGLE-3 (Li et al. 2025b): one layer, fc 3H->H, draft vocab 32000; "
                      "FFN 3H and heads: placeholders (no published head read)")


#: Qwen2.5-1.5B-Instruct (SLM-SD's draft, Section 7), from its config.json: num_hidden_layers=28,
#: hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
#: head dim 1536 / 12 = 128, vocab_size=151936, tie_word_embeddings=true, torch_dtype=bfloat16
#: (stored so: :attr:`DraftModel.bits`).
QWEN25_1P5B = DraftModel("qwen2.5-1.5b-instruct", 28, 1536, 1536, 8960, 12, 2, 128, 151936, 0,
                         "Qwen/Qwen2.5-1.5B-Instruct config.json (torch_dtype=bfloat16)")
DRAFT_MODELS = {"slm": QWEN25_1P5B}

"""capture_hf (elmoe3d.sw.host.trace) on real ``transformers`` MoE models: a tiny Mixtral and a tiny
OLMoE, randomly initialised from a config (seeded; never ``from_pretrained``, no hub access), so
the traces are labelled *not pretrained*. Needs the ``hf`` extra (torch, transformers), which
``make venv`` installs; skipped where it is absent (failed under ``make test``).

Three references, each independent of the code under test:

* the NumPy reference below: softmax over all experts -> top-k -> renormalise only when the
  model does (Mixtral always; OLMoE per ``norm_topk_prob``), per layer and token;
* the routing the model really used: forward hooks on every router module record the top-k
  indices and weights it handed to its experts;
* batch / padding invariance: a right- and a left-padded batch routes every real token like
  the same row run alone.
"""

import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"          # before transformers is imported: no hub access
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest

from elmoe3d.errors import UserError
from elmoe3d.sim.runner import DEFAULT_SEED
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.trace import PHASES, RoutingTrace, capture_hf

from ..conftest import no_real_weights

try:
    import torch
    import transformers
except ImportError as e:                    # the hf extra, which make venv installs
    no_real_weights(f"{e.name} is not installed (pip install -e '.[hf]'): no real router to "
                    f"capture", module=True)

SEED = DEFAULT_SEED          # fixed: not $ELMOE3D_SEED, a user's choice for the benches
VOCAB, HIDDEN, LAYERS, S = 96, 32, 2, 12
#: float32 (model) vs float64 (trace) softmax of the same float32 logits.
WEIGHT_TOL = 2e-6


def tiny_mixtral():
    """2 layers, hidden 32, 8 experts, top-2 (preset mixtral-8x7b's router)."""
    cfg = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=64, router_jitter_noise=0.1,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(SEED)
    return transformers.MixtralForCausalLM(cfg)


def tiny_olmoe(norm_topk_prob=False):
    """2 layers, hidden 32, 64 experts, top-8 (preset olmoe-1b-7b's router: no renorm)."""
    cfg = transformers.OlmoeConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=8, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=4, num_experts=64, num_experts_per_tok=8,
        norm_topk_prob=norm_topk_prob, max_position_embeddings=64, pad_token_id=0,
        bos_token_id=1, eos_token_id=2)
    torch.manual_seed(SEED + 1)
    return transformers.OlmoeForCausalLM(cfg)


MODELS = {"mixtral-8x7b": tiny_mixtral, "olmoe-1b-7b": tiny_olmoe}


@pytest.fixture(scope="module", params=sorted(MODELS))
def case(request):
    print(f"seed {SEED}; tiny {request.param}, random weights")
    return request.param, MODELS[request.param]()


def reference_route(logits, k, renormalise):
    """The models' rule, written out: softmax over all E, top-k (best first), renormalise."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    if renormalise:
        w = w / w.sum(-1, keepdims=True)
    return ids, w, p


def routers(hf_model):
    """The router modules (one per MoE layer, in layer order)."""
    mods = [m for m in hf_model.modules() if type(m).__name__.endswith("TopKRouter")]
    assert len(mods) == LAYERS, [type(m).__name__ for m in hf_model.modules()]
    return mods


def capture_with_hooks(hf_model, ids, preset, **kw):
    """capture_hf, while hooks record what each router returned: (logits, weights, indices)."""
    seen = []
    handles = [m.register_forward_hook(lambda mod, args, out: seen.append(
        tuple(o.detach().float().numpy() for o in out))) for m in routers(hf_model)]
    try:
        trace = capture_hf(hf_model, ids, preset, **kw)
    finally:
        for h in handles:
            h.remove()
    assert len(seen) == LAYERS
    return trace, seen


def test_capture_matches_model_routing_and_reference(case, tmp_path):
    name, hf_model = case
    p = model_preset(name)
    renorm = bool(getattr(hf_model.config, "norm_topk_prob", True))   # Mixtral: always
    assert renorm == p.norm_topk_prob
    rng = np.random.default_rng(SEED)
    B = 2
    ids = rng.integers(3, VOCAB, (B, S))
    hf_model.train()                      # capture must switch to eval (no jitter) and restore
    trace, seen = capture_with_hooks(hf_model, ids, name)
    assert hf_model.training

    # shapes and metadata
    T = B * S
    assert len(trace) == T * LAYERS and trace.layer_ids == (0, 1)
    assert trace.num_experts == p.routed_experts and trace.top_k == p.top_k
    assert trace.model == name and trace.source == "hf output_router_logits"
    assert trace.has_scores and trace.weights_renormalised == renorm
    assert (trace.phase == PHASES.index("prefill")).all()
    assert trace.token_count("prefill") == T
    assert any(n.startswith("pretrained: no") for n in trace.notes), trace.notes
    assert any(f"{type(hf_model).__name__}, transformers {transformers.__version__}" in n
               for n in trace.notes), trace.notes

    for layer, (logits, top_w, top_i) in enumerate(seen):
        assert logits.shape == (T, p.routed_experts) and top_i.shape == (T, p.top_k)
        rows = trace.layer == layer
        np.testing.assert_array_equal(trace.request[rows], np.repeat(np.arange(B), S))
        np.testing.assert_array_equal(trace.position[rows], np.tile(np.arange(S), B))
        ref_i, ref_w, ref_p = reference_route(logits, p.top_k, renorm)
        # the independent reference
        np.testing.assert_array_equal(trace.expert_ids[rows], ref_i)
        np.testing.assert_allclose(trace.gate_weights[rows], ref_w, rtol=0, atol=WEIGHT_TOL)
        np.testing.assert_allclose(trace.scores[rows], ref_p, rtol=0, atol=WEIGHT_TOL)
        # what the model itself routed to (its experts got exactly these)
        np.testing.assert_array_equal(trace.expert_ids[rows], top_i)
        np.testing.assert_allclose(trace.gate_weights[rows], top_w, rtol=0, atol=WEIGHT_TOL)
        if not renorm:
            assert (np.abs(trace.gate_weights[rows].sum(1) - 1) > 1e-3).all()

    # the label survives the file round trip
    back = RoutingTrace.load(trace.save(tmp_path / "tiny"))
    assert back.notes == trace.notes and back.meta() == trace.meta()
    np.testing.assert_array_equal(back.expert_ids, trace.expert_ids)


def test_padding_dropped_and_rows_route_like_alone(case):
    name, hf_model = case
    rng = np.random.default_rng(SEED + 2)
    ids = rng.integers(3, VOCAB, (2, S))
    mask = np.ones((2, S), np.int64)
    mask[0, S - 4:] = 0                   # row 0 right-padded: 8 tokens
    mask[1, :5] = 0                       # row 1 left-padded: 7 tokens
    ids[mask == 0] = 0                    # pad_token_id
    tr = capture_hf(hf_model, ids, name, attention_mask=mask, phase="decode",
                    notes=("padding case",))
    assert tr.notes[-1] == "padding case"
    assert len(tr) == LAYERS * int(mask.sum()) and tr.token_count("decode") == mask.sum()
    rr = tr.requests("decode")
    assert [r.tokens for r in rr] == [8, 7] and all(r.present.all() for r in rr)
    for row, r in enumerate(rr):
        np.testing.assert_array_equal(r.positions, np.arange(r.tokens))
        alone = capture_hf(hf_model, ids[row:row + 1, mask[row] == 1], name, phase="decode")
        (a,) = alone.requests("decode")
        np.testing.assert_array_equal(r.ids, a.ids)
        np.testing.assert_allclose(r.weights, a.weights, rtol=0, atol=1e-5)


def test_capture_rejects_bad_input_and_mismatched_preset(case):
    name, hf_model = case
    ids = np.arange(3, 3 + S).reshape(1, S)
    with pytest.raises(UserError, match=r"input_ids: expected an integer \[batch, seq\]"):
        capture_hf(hf_model, ids[0], name)
    with pytest.raises(UserError, match="input_ids: expected an integer"):
        capture_hf(hf_model, ids.astype(np.float32), name)
    with pytest.raises(UserError, match=r"attention_mask: expected shape \(1, 12\)"):
        capture_hf(hf_model, ids, name, attention_mask=np.ones((1, S - 1)))
    with pytest.raises(UserError, match="attention_mask: expected 0 .padding. or 1"):
        capture_hf(hf_model, ids, name, attention_mask=np.full((1, S), 2))
    other = "olmoe-1b-7b" if name == "mixtral-8x7b" else "mixtral-8x7b"
    with pytest.raises(UserError, match=r"config\.num_(local_)?experts = \d+ \(preset "
                                        r"routed_experts = \d+\)"):
        capture_hf(hf_model, ids, other)
    with pytest.raises(UserError, match="2 layers given, 1 layer ids"):
        capture_hf(hf_model, ids, name, layer_ids=(0,))


def test_olmoe_norm_topk_prob_must_match_the_preset():
    renormalising = tiny_olmoe(norm_topk_prob=True)   # olmoe-1b-7b does not renormalise
    with pytest.raises(UserError, match=r"config\.norm_topk_prob = True \(preset "
                                        r"norm_topk_prob = False\)"):
        capture_hf(renormalising, np.arange(3, 9).reshape(1, 6), "olmoe-1b-7b")


def test_missing_torch_names_the_install(monkeypatch):
    """The guard, exercised where torch is installed (tests/host/test_trace.py's copy skips here)."""
    monkeypatch.setitem(sys.modules, "torch", None)      # `import torch` raises ImportError
    with pytest.raises(UserError, match=r"pip install 'elmoe3d\[hf\]'"):
        capture_hf(object(), [[3, 4, 5]], "olmoe-1b-7b")

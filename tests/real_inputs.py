"""Real inputs shared by the block tests.

* :func:`mixtral_steps`: real-routing schedules (``tests/amaranth/test_ring.py``,
  ``tests/amaranth/test_agg_link.py``): the host's own layer-steps of the real Mixtral-8x7B
  GSM8K trace (the ``gsm8k_routing`` fixture of ``tests/conftest.py``), so the ring and the
  link see the traffic of one schedule. (``tests/amaranth/test_dram.py`` runs its own,
  ``real_layer_steps``: one request, depth 2 and the paper-8gb die's 68 slots, a step whose
  expert slices mix hits and misses in one PE's bank.)
* :func:`minilm_moe`: a real MoE layer (``tests/amaranth/test_vpu.py``,
  ``tests/amaranth/test_pe.py``): experts cut from all-MiniLM-L6-v2's real FFN weights, the
  real FFN inputs of GSM8K prompt tokens, the real gate weights of the Mixtral-8x7B GSM8K
  trace, run by the golden model.
"""

from types import SimpleNamespace

import numpy as np

from elmoe3d.sw.host.backends.golden import TRACE_WEIGHTS_SEED, trace_steps

#: The MoE layers of ``make sim``'s trace run (``--layers 0:32:8``).
REAL_LAYERS = (0, 8, 16, 24)
#: Decode positions 0 .. REAL_POSITIONS - 1 of each of the trace's two requests.
REAL_POSITIONS = 8
#: The seed of the idle and backpressure cycles of the real-traffic tests (the data are the
#: trace's and the schedule's: nothing else is drawn).
REAL_TRAFFIC_SEED = 11


def mixtral_steps(trace, arch):
    """``(steps, weights)`` of :func:`~elmoe3d.sw.host.backends.golden.trace_steps` on the
    real Mixtral-8x7B GSM8K routing ``trace``: positions ``0 .. REAL_POSITIONS - 1`` of both
    requests decoded in lockstep (batch 2) by Elastic-SD at depth 4 (coverage acceptance 0.5,
    an HB cache of 32 experts' MSB slices; the pool and the throttled draft routing come from
    the trace) at :data:`REAL_LAYERS`, the experts placed on the groups of ``arch``; the
    synthetic experts and activations of seed ``TRACE_WEIGHTS_SEED`` (printed)."""
    print(f"seed: synthetic weights {TRACE_WEIGHTS_SEED}")
    return trace_steps(trace.select(trace.position < REAL_POSITIONS), arch,
                       layers=REAL_LAYERS, depth=4, batch=2)


# ---- a real MoE layer: MiniLM's FFN weights and inputs, the Mixtral trace's gate weights --------

#: MiniLM (all-MiniLM-L6-v2) encoder layer whose FFN weights and FFN inputs are used.
MINILM_LAYER = 2
#: MiniLM's hidden size: the whole hidden dimension of :func:`minilm_moe`'s experts.
MINILM_HIDDEN = 384
#: Tokens of the real MoE layer: MiniLM's first 16 tokens of the first GSM8K prompt ([CLS]
#: included), paired by position with the trace's first 16 rows of request 0 at one layer.
MOE_TOKENS = 16
#: The Mixtral-8x7B decoder layer whose routing (top-2 of 8, with gate weights) is used.
MOE_TRACE_LAYER = 0
#: Experts cut from MiniLM's layer-2 FFN (intermediate 1536): expert e takes rows
#: ``192e .. 192e + 95`` of the up projection as its up weights, the next 96 rows as its gate
#: weights and the down projection's 96 columns ``192e ..`` as its down weights.
MOE_EXPERTS, MOE_INTER = 8, 96


def minilm_moe(gsm8k_prompts, gsm8k_routing, *, hidden=MINILM_HIDDEN, tokens=MOE_TOKENS):
    """A real MoE layer and its golden run (:func:`~elmoe3d.sw.golden.expert.ref_moe`, FULL).
    Needs all-MiniLM-L6-v2 installed (the ``minilm_file`` fixture of ``tests/conftest.py``
    skips or fails for want of it); ``gsm8k_prompts``, ``gsm8k_routing``: those fixtures.

    * activations ``x`` float64 ``[tokens, hidden]``: the layer-2 FFN inputs of
      all-MiniLM-L6-v2 (its real weights, float64 forward pass of
      :mod:`elmoe3d.sw.host.minilm`) on the first GSM8K prompt's first ``tokens`` tokens;
      quantized per token to INT8 by ``ref_moe`` (real ``e_x``);
    * experts: 8 slices of MiniLM's layer-2 FFN, as described at :data:`MOE_EXPERTS` (a GELU
      FFN's up projection split into up and gate halves of 96 channels), G32-quantized;
    * routing: expert ids and gate weights of the Mixtral-8x7B GSM8K trace
      (``gsm8k_2_routing.jsonl``), request 0, layer 0, positions ``0 .. tokens - 1``; the gate
      weights converted to FP16 bits by :func:`~elmoe3d.sw.golden.expert.parse_routing`, the
      conversion ``ref_moe`` itself applies, and split per expert by
      :func:`~elmoe3d.sw.golden.expert.expert_tokens`. The trace's tokens are Mixtral's and
      the activations MiniLM's: they are paired by position, not the same tokens.

    ``hidden`` < 384 cuts the hidden dimension to MiniLM's first ``hidden`` channels (a
    multiple of 32): the first ``hidden`` features of ``x``, the first ``hidden`` input
    columns of the up/gate weights and the first ``hidden`` output rows of the down weights.
    Nothing is invented: G32 groups run along the input axis, so the cut experts' codes and
    scales are exactly the whole experts' first groups (up/gate) and first rows (down); the
    activations' per-token exponents are those of the cut rows.

    Returns a namespace: ``x``, ``experts`` (the :class:`~elmoe3d.sw.golden.expert.Expert` s),
    ``ids`` ``[tokens, 2]``, ``bits`` uint16 ``[tokens, 2]`` (``(ids, bits)`` is a routing
    ``ref_moe`` and the program builders take), ``result`` (the FULL :class:`ExpertResult`,
    ``detail`` with the ``acc_up``, ``acc_gate``, ``h``, ``h_q``, ``e_h``, ``acc_y`` of every
    expert), ``e_x`` int64 ``[tokens]`` and ``routed``: ``(e, rows, gw bits, detail)`` per
    routed expert, in ascending id (the order ``ref_moe`` and a PE program combine them)."""
    from elmoe3d.sw.golden.expert import Expert, expert_tokens, parse_routing, ref_moe
    from elmoe3d.sw.host import minilm
    if hidden % 32 or not 0 < hidden <= MINILM_HIDDEN:
        raise ValueError(f"hidden: {hidden} is not a multiple of 32 in 32..{MINILM_HIDDEN}")
    up, down = minilm.ffn_weights(MINILM_LAYER)
    ffn_in, _ = minilm.ffn_activations(gsm8k_prompts[:1], MINILM_LAYER)
    assert up.shape == (4 * MINILM_HIDDEN, MINILM_HIDDEN) and len(ffn_in) >= tokens
    x = ffn_in[:tokens, :hidden]
    step = 2 * MOE_INTER
    experts = [Expert.quantize(up[step * e:step * e + MOE_INTER, :hidden],
                               up[step * e + MOE_INTER:step * (e + 1), :hidden],
                               down[:hidden, step * e:step * e + MOE_INTER], name=f"minilm.{e}")
               for e in range(MOE_EXPERTS)]
    tr = gsm8k_routing
    sel = np.flatnonzero((tr.request == 0) & (tr.layer == MOE_TRACE_LAYER))
    sel = sel[np.argsort(tr.position[sel], kind="stable")][:tokens]
    assert tr.position[sel].tolist() == list(range(tokens))
    assert tr.num_experts == MOE_EXPERTS
    ids, bits = parse_routing((tr.expert_ids[sel], tr.gate_weights[sel]), tokens, MOE_EXPERTS)
    result = ref_moe(x, experts, (ids, bits))
    routed = []
    for e in range(MOE_EXPERTS):
        rows, gw = expert_tokens(ids, bits, e)
        if len(rows):
            d = result.detail["experts"][e]
            assert d["tokens"].tolist() == rows.tolist()
            routed.append((e, rows, gw, d))
    return SimpleNamespace(x=x, experts=experts, ids=ids, bits=bits, result=result,
                           e_x=np.asarray(result.detail["e_x"], np.int64), routed=routed)

"""Routing-log fixtures, one per dialect seen in the wild (issue: real logs and bad input).

Each writer lays out synthetic Mixtral-8x7B routing (:func:`elmoe3d.sw.host.tracegen.synthetic_trace`,
the calibrated parameters, fixed seeds) the way one kind of logger does, and returns what an
import must find, counted here from the layout (never from the importer). None is a copy of a
real log.
"""

import json

import numpy as np

from elmoe3d.sw.host.tracegen import CALIBRATED, synthetic_trace

MODEL = "mixtral-8x7b"
LAYERS = 32


def routing(tokens, requests=2, seed=0):
    """``ids [R, T, L, 2]`` and ``weights [R, T, L, 2]`` (lists) of synthetic Mixtral routing."""
    tr = synthetic_trace(MODEL, CALIBRATED[MODEL], requests=requests, tokens=tokens, seed=seed)
    ids = np.zeros((requests, tokens, LAYERS, 2), int)
    w = np.zeros((requests, tokens, LAYERS, 2))
    ids[tr.request, tr.position, tr.layer] = tr.expert_ids
    w[tr.request, tr.position, tr.layer] = tr.gate_weights
    return ids, w


def write_lines(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def meta_route(path, tokens=(20, 12)):
    """Dialect 1: a flat ``{"type": "meta", ...}`` first line naming the model by its Hugging
    Face id and logging layer 0 only, then ``{"type": "route", "req_id": "r1", ...}`` lines
    (string request ids), with ``{"type": "step"}`` lines between requests."""
    ids, w = routing(max(tokens))
    objs = [{"type": "meta", "model_id": "mistralai/Mixtral-8x7B-Instruct-v0.1", "top_k": 2,
             "layers_logged": [0], "vllm_version": "0.6.3"}]
    for r, n in enumerate(tokens):
        objs.append({"type": "step", "step": r})
        for t in range(n):
            objs.append({"type": "route", "req_id": f"r{r + 1}", "token_idx": t, "layer": 0,
                         "topk_ids": ids[r, t, 0].tolist(),
                         "topk_weights": w[r, t, 0].tolist()})
    write_lines(path, objs)
    return {"records": sum(tokens), "kept": sum(tokens), "decode": sum(tokens), "prefill": 0,
            "warmup": 0, "duplicates": 0, "missing": 0, "layers_absent": LAYERS - 1,
            "requests": {"r1": 0, "r2": 1}, "other": {"step": len(tokens)}}


def warmup(path, tokens=(24, 16), dummy=(64, 32)):
    """Dialect 2: an inference server's profiling dummy passes logged as routing: a block of
    ``dummy[0]`` tokens x 32 layers with uniform gate weights (0.5, 0.5) on experts (0, 1)
    before the first request (logged under request 0, positions overlapping the real ones), and
    a block of ``dummy[1]`` tokens with one identical routing per layer between the requests,
    with a null request id. Layer-major inside each request, like the real logs."""
    ids, w = routing(max(tokens), seed=1)
    objs = []
    for lay in range(LAYERS):
        for t in range(dummy[0]):
            objs.append({"problem_id": 0, "layer": lay, "experts": [0, 1],
                         "gating_probs": [0.5, 0.5], "token_idx": t})
    first_block = (1, len(objs))
    for r, n in enumerate(tokens):
        if r == 1:
            start = len(objs) + 1
            for lay in range(LAYERS):
                for t in range(dummy[1]):
                    objs.append({"problem_id": None, "layer": lay,
                                 "experts": [lay % 8, 7 - lay % 8],
                                 "gating_probs": [0.7, 0.3], "token_idx": t})
            second_block = (start, len(objs))
        for lay in range(LAYERS):
            for t in range(n):
                objs.append({"problem_id": r, "layer": lay, "experts": ids[r, t, lay].tolist(),
                             "gating_probs": w[r, t, lay].tolist(), "token_idx": t})
    write_lines(path, objs)
    kept = sum(tokens) * LAYERS
    return {"records": kept + LAYERS * sum(dummy), "kept": kept, "decode": kept, "prefill": 0,
            "warmup": LAYERS * sum(dummy), "duplicates": 0, "missing": 0, "layers_absent": 0,
            "blocks": [first_block + (LAYERS * dummy[0],), second_block + (LAYERS * dummy[1],)],
            "tokens": dict(enumerate(tokens))}


def forward_pass_index(path, prompt=(12, 7), decode=(20, 9)):
    """Dialect 3: the index is the row inside each forward pass. Two requests batched: each
    pass logs every layer in turn (pass by pass, layers interleaved); a request's prefill pass
    logs rows 0..P-1, each decode step logs row 0. Request 1's prompt is split into two chunks
    (chunked prefill: rows 0..3, then 0..P-5). Returns also the routing by true position."""
    n = max(p + d for p, d in zip(prompt, decode))
    ids, w = routing(n, seed=2)
    passes = []                                     # (request, first position, rows)
    for r, (p, d) in enumerate(zip(prompt, decode)):
        chunks = [(0, p)] if r == 0 else [(0, 4), (4, p - 4)]
        passes.append([(r, s, c) for s, c in chunks] + [(r, p + t, 1) for t in range(d)])
    order = []
    for q in range(max(len(x) for x in passes)):
        for x in passes:
            if q < len(x):
                order.append(x[q])
    objs = []
    for r, s, c in order:
        for lay in range(LAYERS):
            for i in range(c):
                objs.append({"req_id": r, "layer": lay, "token_idx": i,
                             "expert_ids": ids[r, s + i, lay].tolist(),
                             "gate_weights": w[r, s + i, lay].tolist()})
    write_lines(path, objs)
    pre = sum(prompt) * LAYERS
    dec = sum(decode) * LAYERS
    return {"records": pre + dec, "kept": pre + dec, "prefill": pre, "decode": dec, "warmup": 0,
            "duplicates": 0, "missing": 0, "layers_absent": 0, "ids": ids, "weights": w,
            "prompt": prompt, "decode_tokens": decode}


def token_pos_restart(path, prompt=(9, 5), decode=(14, 6), drop=((0, 3, 4),)):
    """Dialect 4: ``token_pos`` with a request's prefill rows first (positions 0..P-1), then
    every decode row at position 0; layer by layer within each request (like the real logs).
    ``drop``: (request, layer, prompt row) records left out (a logger's missing records)."""
    n = max(p + d for p, d in zip(prompt, decode))
    ids, w = routing(n, seed=3)
    objs = []
    for r, (p, d) in enumerate(zip(prompt, decode)):
        for lay in range(LAYERS):
            for t in range(p + d):
                if (r, lay, t) in drop:
                    continue
                objs.append({"seq_id": r, "layer_idx": lay, "token_pos": t if t < p else 0,
                             "topk_ids": ids[r, t, lay].tolist(),
                             "topk_weights": w[r, t, lay].tolist()})
    write_lines(path, objs)
    pre = sum(prompt) * LAYERS - len(drop)
    dec = sum(decode) * LAYERS
    return {"records": pre + dec, "kept": pre + dec, "prefill": pre, "decode": dec, "warmup": 0,
            "duplicates": 0, "missing": len(drop), "layers_absent": 0, "ids": ids, "weights": w,
            "prompt": prompt, "decode_tokens": decode}


def unrenormalised(path, model="mixtral-8x7b", renormalised=False, tokens=10, k=2, experts=8,
                   layers=LAYERS):
    """Dialect 5: gate weights that disagree with the router: the top-k's softmax share as
    logged without renormalisation (``renormalised=False``) or divided by its sum."""
    rng = np.random.default_rng(5)
    objs = []
    for lay in range(layers):
        for t in range(tokens):
            z = rng.normal(0, 1.5, experts)
            p = np.exp(z) / np.exp(z).sum()
            top = np.argsort(-p, kind="stable")[:k]
            wt = p[top] / (p[top].sum() if renormalised else 1.0)
            objs.append({"problem_id": 0, "layer": lay, "token_idx": t,
                         "experts": top.tolist(), "gating_probs": wt.tolist()})
    write_lines(path, objs)
    n = tokens * layers
    return {"rows": n, "records": n, "kept": n, "prefill": 0, "decode": n, "warmup": 0,
            "duplicates": 0, "missing": 0, "layers_absent": 0}


def switch_usage(path, layers=6, experts=128, tokens=4096, zipf=1.0, seed=6):
    """Dialect 6: expert-usage statistics of a Switch Transformer's encoder (top-1 of 128):
    per-layer selection counts as one JSON document, layers named as the model's modules."""
    rng = np.random.default_rng(seed)
    doc = {"model": "google/switch-base-128", "top_k": 1, "tokens": tokens, "layers": {}}
    for i in range(layers):
        pop = 1.0 / (1 + rng.permutation(experts)) ** zipf
        c = rng.multinomial(tokens, pop / pop.sum())
        doc["layers"][f"encoder.block.{2 * i + 1}.layer.1.mlp"] = c.tolist()
    path.write_text(json.dumps(doc, indent=1))
    return doc

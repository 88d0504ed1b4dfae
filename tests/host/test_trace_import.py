"""vLLM-style JSONL importer (elmoe3d.sw.host.trace.import_vllm_jsonl): the real Mixtral traces of
../shared/traces, the schema variants, and every malformed case (an error naming file and line,
or a counted warning naming the line; never a silent drop)."""

import json
from collections import Counter

import numpy as np
import pytest

from elmoe3d.sw.host.corpus import routing_path, traces_dir
from elmoe3d.sw.host.trace import PHASES, RoutingTrace, TraceError, import_vllm_jsonl

# Counted independently of the importer (plain json over the files): rows, tokens per problem,
# (token, layer) records absent.
REAL = {"gsm8k_2_routing.jsonl": (7889, {0: 168, 1: 79}, 15),
        "humaneval_2_routing.jsonl": (10779, {0: 83, 1: 255}, 37)}


def raw_rows(name):
    with open(traces_dir() / name) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def gsm8k():
    return import_vllm_jsonl(routing_path("gsm8k"), model="mixtral-8x7b")


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_traces(name):
    rows, tokens, missing = REAL[name]
    tr, rep = import_vllm_jsonl(traces_dir() / name, model="mixtral-8x7b")
    assert len(tr) == rep.rows == rows == rep.lines
    assert rep.tokens == sum(tokens.values()) == tr.token_count()
    assert rep.requests == 2 and tr.layer_ids == tuple(range(32))
    assert {r.request: r.tokens for r in tr.requests()} == tokens
    assert rep.missing_records == missing
    assert all(1 <= n <= 4 for n in rep.missing_by_layer.values())
    assert rep.missing_by_layer == tr.missing_records()
    assert not rep.malformed and rep.position_gaps == 0 and tr.weights_renormalised
    assert (tr.phase == PHASES.index("decode")).all() and tr.top_k == 2
    assert rep.unknown_fields == Counter() and rep.sorted_rows == 0
    # the count once, on the counts line; the event line gives them by layer, summing to it
    summary = rep.summary()
    assert f"; {missing} (token, layer) records missing" in summary[1]
    by_layer = [s for s in summary if "the missing (token, layer) records by layer:" in s]
    assert len(by_layer) == 1 and "records missing" not in by_layer[0]
    assert sum(int(x.split(": ")[1]) for x in by_layer[0].split("by layer: ")[1].split(", ")) \
        == missing
    # every row as in the file
    raw = {(r["problem_id"], r["token_idx"], r["layer"]): r for r in raw_rows(name)}
    for i in range(0, len(tr), 97):
        r = raw[(int(tr.request[i]), int(tr.position[i]), int(tr.layer[i]))]
        assert tr.expert_ids[i].tolist() == r["experts"]
        np.testing.assert_allclose(tr.gate_weights[i], r["gating_probs"], rtol=1e-6)


def test_real_trace_round_trips_through_the_canonical_format(gsm8k, tmp_path):
    tr, _ = gsm8k
    back = RoutingTrace.load(tr.save(tmp_path / "gsm8k"))
    for name in ("request", "position", "layer", "phase", "expert_ids", "gate_weights"):
        np.testing.assert_array_equal(getattr(back, name), getattr(tr, name))
    assert back.meta() == tr.meta() and back.model == "mixtral-8x7b"


def write(tmp_path, lines, name="log.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def row(p=0, layer=0, t=0, ids=(1, 0), w=(0.6, 0.4), **extra):
    d = {"problem_id": p, "layer": layer, "experts": list(ids), "gating_probs": list(w),
         "token_idx": t}
    d.update(extra)
    return d


def grid(tokens=3, layers=2, **kw):
    return [row(t=t, layer=l, **kw) for l in range(layers) for t in range(tokens)]


def test_top_k_not_given_is_most_valid_lines(tmp_path):
    """Without top_k (no model, meta line or argument) the top-k is the expert count of most
    lines that reach its check: malformed, warm-up and padding lines do not vote (a review's:
    three bad lines of 3 made every good line of 2 'wrong'; a bad position, layer, request or
    phase kept a line from voting only since the vote and the import share their checks), and
    lines that disagree with no
    count most lines' are refused in both modes, naming the counts."""
    good = [row(t=0, ids=(0, 1)), row(t=1, ids=(1, 2))]
    for bad in ([row(t=5 + i, ids=("a", "b", "c"), w=(0.5, 0.3, 0.2)) for i in range(3)],
                [row(t=5 + i, ids=(1, 2, 3), w=(0.5, 0.3, 0.2), warmup=True)
                 for i in range(3)],
                [row(t=5 + i, ids=(1, 2, 3), w=(0.5, 0.3, 0.2), padding=True)
                 for i in range(3)],
                [row(t=5 + i, ids=(1, 2, 3), w=(0.5,)) for i in range(3)],
                # malformed in a field checked before the top-k (position, layer, request,
                # phase): every check before the top-k one keeps a line from voting
                [row(t=-1, ids=(1, 2, 3), w=(0.5, 0.3, 0.2)) for i in range(3)],
                [row(t=5 + i, layer="x", ids=(1, 2, 3), w=(0.5, 0.3, 0.2)) for i in range(3)],
                [row(p=-1, t=5 + i, ids=(1, 2, 3), w=(0.5, 0.3, 0.2)) for i in range(3)],
                [row(t=5 + i, ids=(1, 2, 3), w=(0.5, 0.3, 0.2), phase="sample")
                 for i in range(3)]):
        path = write(tmp_path, bad + good, "bad.jsonl")
        tr, rep = import_vllm_jsonl(path, num_experts=8, on_error="warn")
        assert len(tr) == 2 and tr.expert_ids.shape[1] == 2, rep.malformed
        assert "top_k not given: 2, the expert count of 2 of 2 lines" in rep.notes
    # a tie, or a count of no majority: refused, in warn mode too
    for counts in ((3, 2, 3, 2), (2, 2, 3, 4)):
        lines = [row(t=i, ids=tuple(range(n)), w=(1 / n,) * n) for i, n in enumerate(counts)]
        path = write(tmp_path, lines, "tie.jsonl")
        for on_error in ("raise", "warn"):
            with pytest.raises(TraceError, match=r"top_k not given and no expert count is most "
                                                 r"lines' \(2 line\(s\) of 2, "):
                import_vllm_jsonl(path, num_experts=8, on_error=on_error)
    # a malformed line that no longer votes leaves a tie: raise names the file's first
    # mistake (line 1, not the vote), warn the tie with the lines left out (a review's)
    lines = [row(t=0, ids=(0, 1), w=("a", "b")), row(t=1, ids=(2,), w=(1.0,)),
             row(t=2, ids=(0, 1))]
    path = write(tmp_path, lines, "tie2.jsonl")
    with pytest.raises(TraceError, match=r"tie2\.jsonl:1: gate weights must be a list of "
                                         r"numbers"):
        import_vllm_jsonl(path, num_experts=8)
    with pytest.raises(TraceError, match=r"\(1 line\(s\) of 1, 1 line\(s\) of 2; 1 malformed, "
                                         r"warm-up or padding line\(s\) not counted\)"):
        import_vllm_jsonl(path, num_experts=8, on_error="warn")
    # a stray line first: most lines decide, and the stray one is flagged as such
    lines = [row(t=0, ids=(1, 2, 3), w=(0.5, 0.3, 0.2))] + [row(t=i, ids=(0, 1))
                                                            for i in range(1, 4)]
    with pytest.raises(TraceError, match=r":1: 3 experts, expected top_k = 2") as e:
        import_vllm_jsonl(write(tmp_path, lines, "first.jsonl"), num_experts=8)
    assert e.value.stray


def test_the_meta_lines_phase_is_every_unmarked_rows(tmp_path):
    """A meta line's ``phase`` is the phase of every row that gives none (a test audit's
    mutation ignored it: no fixture put a phase in a meta line); a row's own phase wins, and
    the ``phase=`` argument applies only without one in the meta line."""
    lines = [{"meta": {"num_experts": 8, "top_k": 2, "phase": "prefill"}}] + grid(tokens=3)
    lines[-1] = row(t=2, layer=1, phase="decode")
    tr, _ = import_vllm_jsonl(write(tmp_path, lines))
    prefill, decode = PHASES.index("prefill"), PHASES.index("decode")
    assert tr.phase.tolist().count(prefill) == 5 and tr.phase.tolist().count(decode) == 1
    tr, _ = import_vllm_jsonl(write(tmp_path, grid(tokens=3), "plain.jsonl"), num_experts=8,
                              top_k=2, phase="prefill")
    assert set(tr.phase.tolist()) == {prefill}
    with pytest.raises(TraceError, match="phase"):
        import_vllm_jsonl(write(tmp_path, [{"meta": {"phase": "sample"}}] + grid(), "b.jsonl"))


def test_variant_schema_gives_the_same_trace(tmp_path, gsm8k):
    """The first 300 real rows rewritten with a meta line, topk_ids / topk_weights /
    token_pos / request_id, weights not renormalised (x 0.9) and warm-up rows: after
    renormalisation and the warm-up drop, the same routing."""
    raw = raw_rows("gsm8k_2_routing.jsonl")[:300]
    lines = [{"meta": {"model": "mixtral-8x7b", "num_experts": 8, "top_k": 2,
                       "renormalized": False, "warmup_tokens": 0}}]
    for r in raw:
        lines.append({"request_id": r["problem_id"], "layer": r["layer"],
                      "topk_ids": r["experts"],
                      "topk_weights": [0.9 * x for x in r["gating_probs"]],
                      "token_pos": r["token_idx"]})
    lines.insert(5, {"request_id": 9, "layer": 0, "topk_ids": [0, 1],
                     "topk_weights": [0.5, 0.5], "token_pos": 0, "warmup": True})
    tr, rep = import_vllm_jsonl(write(tmp_path, lines), model="mixtral-8x7b",
                                renormalise="model")
    assert rep.meta["renormalized"] is False and rep.dropped_warmup == 1
    assert rep.renormalised_rows == 300 and tr.weights_renormalised
    ref = import_vllm_jsonl(write(tmp_path, [json.dumps(r) for r in raw], "ref.jsonl"),
                            model="mixtral-8x7b")[0]
    np.testing.assert_array_equal(tr.expert_ids, ref.expert_ids)
    np.testing.assert_allclose(tr.gate_weights, ref.gate_weights, rtol=1e-6)
    np.testing.assert_array_equal(tr.position, ref.position)


def test_unnormalised_weights_kept_or_renormalised(tmp_path):
    path = write(tmp_path, grid(w=(0.5, 0.3)))
    tr, rep = import_vllm_jsonl(path, num_experts=8)
    assert rep.unnormalised_rows == 6 and not tr.weights_renormalised
    np.testing.assert_allclose(tr.gate_weights[0], [0.5, 0.3])
    tr, rep = import_vllm_jsonl(path, num_experts=8, renormalise="topk")
    assert rep.renormalised_rows == 6 and tr.weights_renormalised
    np.testing.assert_allclose(tr.gate_weights[0], [0.625, 0.375])
    # Mixtral renormalises its top-2: the note on the weights as logged says this import
    # renormalised them (a new user read it as the weights still not summing to 1)
    for renormalise, tail in (("topk", True), ("keep", False)):
        _, rep = import_vllm_jsonl(path, model="mixtral-8x7b", renormalise=renormalise)
        (note,) = [n for n in rep.notes if "not summing to 1" in n]
        assert note.startswith("6 of 6 rows have gate weights not summing to 1, but mixtral")
        assert note.endswith("; as logged: this import renormalised the 6 row(s) not summing "
                             "to 1 over their top-k") == tail, note
    # OLMoE does not renormalise: its note is of the rows that do sum to 1, and the import's
    # renormalisation touched the others only, as the count says
    w1 = [0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05]                  # sums to 1
    lines = [row(ids=[(5 * t + l + 7 * j) % 64 for j in range(8)],
                 w=w1 if t < 3 else [0.8 * x for x in w1], layer=l, t=t)
             for l in range(16) for t in range(4)]
    _, rep = import_vllm_jsonl(write(tmp_path, lines, "o3.jsonl"), model="olmoe-1b-7b",
                               renormalise="topk")
    (note,) = [n for n in rep.notes if "summing to 1" in n]
    assert note.startswith("48 of 64 rows have gate weights summing to 1, but olmoe-1b-7b")
    assert note.endswith("this import renormalised the 16 row(s) not summing to 1 over their "
                         "top-k") and rep.renormalised_rows == 16
    # OLMoE does not renormalise: "model" keeps its weights
    tr, rep = import_vllm_jsonl(write(tmp_path, [row(ids=list(range(8)), w=[0.1] * 8,
                                                     layer=l) for l in range(16)], "o2.jsonl"),
                                model="olmoe-1b-7b", renormalise="model")
    assert rep.unnormalised_rows == 16 and rep.renormalised_rows == 0
    np.testing.assert_allclose(tr.gate_weights[0], [0.1] * 8)


def test_warmup_tokens_and_padding_are_dropped_and_counted(tmp_path):
    lines = grid(tokens=5) + [row(t=9, padding=True)]
    tr, rep = import_vllm_jsonl(write(tmp_path, lines), num_experts=8, warmup_tokens=2)
    assert rep.dropped_warmup == 4 and rep.dropped_padding == 1
    assert tr.token_count() == 3 and tr.position.min() == 2
    assert any("warm-up" in s for s in rep.summary())
    lines = [{"meta": {"warmup_tokens": 1, "num_experts": 8}}] + grid(tokens=3)
    tr, rep = import_vllm_jsonl(write(tmp_path, lines))
    assert rep.dropped_warmup == 2 and tr.token_count() == 2


def test_reorders_best_first_and_counts_it(tmp_path):
    tr, rep = import_vllm_jsonl(write(tmp_path, [row(ids=(3, 5), w=(0.2, 0.8))]),
                                num_experts=8)
    assert tr.expert_ids[0].tolist() == [5, 3] and rep.sorted_rows == 1
    assert rep.issues == [(1, "reordered", "ids reordered best first")]


def test_inferred_sizes_and_unknown_fields_are_noted(tmp_path):
    tr, rep = import_vllm_jsonl(write(tmp_path, grid(colour="red")))
    assert tr.num_experts == 2 and tr.top_k == 2 and tr.layer_ids == (0, 1)
    text = "\n".join(rep.summary())
    assert "num_experts not given" in text and "top_k not given" in text
    assert "layers not given" in text and rep.unknown_fields == Counter(colour=6)
    assert rep.warning_count >= 6 + 3


def test_missing_layers_and_gaps_are_counted(tmp_path):
    lines = [r for r in grid(tokens=4, layers=3) if not (r["token_idx"] == 1 and
                                                          r["layer"] == 2)]
    lines = [r for r in lines if r["token_idx"] != 2]            # a whole token absent
    tr, rep = import_vllm_jsonl(write(tmp_path, lines), num_experts=8, top_k=2)
    assert rep.missing_by_layer == {2: 1} and rep.position_gaps == 1
    assert tr.token_count() == 3


# malformed line -> (kind, words in the message)
MALFORMED = [
    ('{"problem_id": 0, "layer": 0,', "bad-json", "not JSON"),
    ("[1, 2]", "not-object", "JSON object"),
    (row(ids=(-1, 0)), "unknown-expert", "-1 is padding"),
    (row(ids=(8, 0)), "unknown-expert", ">= num_experts"),
    (row(ids=(1, 0, 2), w=(0.5, 0.3, 0.2)), "wrong-k", "3 experts, expected top_k = 2"),
    (row(ids=(1,), w=(1.0,)), "wrong-k", r": 1 expert, expected top_k = 2"),
    (row(w=(0.6,)), "length-mismatch", "2 expert ids but 1 weights"),
    (row(w=(1.2, -0.2)), "negative-weight", "raw router logits"),
    (row(w=(3.1, 0.4)), "bad-weight", "not a probability"),
    (row(w=(float("nan"), 0.4)), "bad-weight", "NaN"),
    (row(ids=(2, 2)), "repeated-expert", "repeat"),
    ({"problem_id": 0, "layer": 0, "experts": [1, 0], "gating_probs": [0.6, 0.4]},
     "missing-field", "no position field"),
    (row(token_pos=0), "ambiguous-field", "'token_idx' and 'token_pos'"),
    (row(layer=True), "bad-type", "layer must be an integer"),
    (row(ids=(1.0, 0)), "bad-type", "list of integers"),
    (row(layer=40), "bad-layer", "not a MoE layer"),
    (row(phase="sample"), "bad-phase", "phase must be one of"),
    (row(), "duplicate", "already on line 1"),
    ({"meta": {"top_k": 2}}, "late-meta", "first line"),
    (row(router_logits=[0.0] * 8), "bad-scores", "given here but not on the first row"),
]


@pytest.mark.parametrize("bad, kind, words", MALFORMED, ids=[m[1] + str(i) for i, m in
                                                              enumerate(MALFORMED)])
def test_malformed_line_raises_naming_file_and_line(tmp_path, bad, kind, words):
    good = grid(tokens=2)
    lines = good[:2] + [bad] + good[2:]
    if kind == "duplicate":
        lines = [good[0], bad] + good[1:]
    path = write(tmp_path, lines)
    with pytest.raises(TraceError, match=words) as e:
        import_vllm_jsonl(path, model="mixtral-8x7b")
    line = 2 if kind == "duplicate" else 3
    assert f"{path}:{line}:" in str(e.value)
    assert e.value.kind == kind and e.value.stray       # after good lines: skipping it helps
    # warn mode: skipped, counted, the line listed; the good rows all kept
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b", on_error="warn")
    assert rep.malformed == Counter({kind: 1})
    assert [(ln, kd) for ln, kd, _ in rep.issues] == [(line, kind)]
    assert len(tr) == len(good)
    said = "duplicate line(s) (the first kept)" if kind == "duplicate" else f"[{kind}]"
    assert any(f"{said}: line {line}" in s for s in rep.summary())


def test_scores_and_router_logits_columns(tmp_path):
    z = np.random.default_rng(0).normal(0, 1, (2, 8))
    sc = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    lines = [row(layer=0, router_scores=sc[0].tolist()), row(layer=1, router_logits=z[1].tolist())]
    tr, rep = import_vllm_jsonl(write(tmp_path, lines), num_experts=8, top_k=2,
                                model="mixtral-8x7b", on_error="warn")
    assert tr.has_scores and tr.scores.shape == (2, 8) and not rep.malformed
    np.testing.assert_allclose(tr.scores, sc.astype(np.float32), rtol=1e-6)


def test_ids_not_the_top_k_of_their_scores_are_noted(tmp_path):
    """Router logits or scores whose top-k is not the logged ids (a log's columns out of step;
    a grouped or biased router may route so) are kept, counted and noted with the first line
    (a new user's log with two such rows imported silently); ids that are the top-k, in any
    order and with a tie at the k-th score, are not."""
    z = np.array([[0.1, 2.0, -1.0, 3.0, 0.0, 0.0, -2.0, 1.0],
                  [1.0, 1.0, 1.0, 0.5, 0.0, -1.0, -1.0, -1.0]])
    good = [row(t=0, ids=(3, 1), w=(0.6, 0.4), router_logits=z[0].tolist()),
            row(t=1, ids=(1, 0), w=(0.5, 0.5), router_logits=z[1].tolist()),     # a tie
            row(t=2, ids=(1, 3), w=(0.6, 0.4), router_logits=z[0].tolist())]     # any order
    _, rep = import_vllm_jsonl(write(tmp_path, good, "g.jsonl"), model="mixtral-8x7b")
    assert rep.scores_disagree == 0
    bad = good + [row(t=3, ids=(0, 5), w=(0.6, 0.4), router_logits=z[0].tolist()),
                  row(t=4, ids=(3, 7), w=(0.6, 0.4), router_logits=z[0].tolist())]
    _, rep = import_vllm_jsonl(write(tmp_path, bad, "b.jsonl"), model="mixtral-8x7b")
    assert rep.scores_disagree == 2 and not rep.malformed
    assert any(n.startswith("line 4: expert ids [0, 5] are not the top-2 of the line's router "
                            "scores ([3, 1]); 2 such row(s) in all (scores_disagree") for n in
               rep.notes), rep.notes
    # counted over the rows kept: a repeated line is one (a review's)
    _, rep = import_vllm_jsonl(write(tmp_path, bad + bad[-1:], "d.jsonl"), model="mixtral-8x7b",
                               on_error="warn")
    assert rep.scores_disagree == 2 and rep.duplicates == 1


def test_a_prefill_pass_without_phases_is_noted(tmp_path):
    """A log without phases whose requests start with a pass of several positions a layer (a
    prefill) and go on one a pass is read as decode, as logged, and noted (a new user's
    6-token prefills ran as 12 decode tokens unsaid); a log sorted by layer, or one whose
    rows give their phase, is not noted."""
    def lines(prefill, phase=False):
        out = []
        for req in range(2):
            out += [row(p=req, layer=lay, t=t, ids=(t % 8, (t + 1) % 8),
                        **({"phase": "prefill"} if phase else {}))
                    for lay in range(4) for t in range(prefill)]
            out += [row(p=req, layer=lay, t=t, ids=((t + lay) % 8, (t + lay + 3) % 8),
                        **({"phase": "decode"} if phase else {}))
                    for t in range(prefill, 9) for lay in range(4)]
        return out
    said = ("2 request(s) start with a forward pass of several positions a layer, then one a "
            "pass (request 0: positions 0..5, 24 rows): a prefill the log marks no phase of, "
            "read as decode steps; give those rows \"phase\": \"prefill\" to read them as "
            "prefill")
    tr, rep = import_vllm_jsonl(write(tmp_path, lines(6), "np.jsonl"), num_experts=8, top_k=2)
    assert said in rep.notes and tr.token_count("decode") == 18
    by_layer = sorted(lines(6), key=lambda r: (r["problem_id"], r["layer"]))
    # a review's false alarms: a repeated first line, a layer-major log missing two records,
    # a meta line saying the phase
    decode = lines(1)
    for name, text in (("phased.jsonl", lines(6, phase=True)),
                       ("decode.jsonl", decode),
                       ("by-layer.jsonl", by_layer),
                       ("repeated.jsonl", decode[:1] + decode),
                       ("holes.jsonl", [r for i, r in enumerate(by_layer) if i not in (5, 40)]),
                       ("meta.jsonl", [{"meta": {"phase": "decode"}}] + lines(6))):
        _, rep = import_vllm_jsonl(write(tmp_path, text, name), num_experts=8, top_k=2,
                                   on_error="warn")
        assert not any("forward pass of several" in n for n in rep.notes), name


def test_mixed_integer_and_string_request_ids_are_noted(tmp_path):
    """Integer and string request ids in one log are each kind's own requests, and a note
    says so, naming a pair that reads alike (a new user's one "0" among integer ids split
    request 0 under the note "request ids are strings" alone)."""
    lines = [row(p="0" if (p, t, lay) == (0, 2, 0) else p, layer=lay, t=t)
             for t in range(3) for lay in range(2) for p in (0, 1)]
    tr, rep = import_vllm_jsonl(write(tmp_path, lines), num_experts=8, top_k=2)
    assert "request ids mix integers and strings (2 integer id(s)): each kind its own " \
           "requests, so 0 and '0' are two" in rep.notes
    assert len(set(tr.request.tolist())) == 3
    _, rep = import_vllm_jsonl(write(tmp_path, [dict(x, problem_id=str(x["problem_id"]))
                                                for x in lines], "s.jsonl"),
                               num_experts=8, top_k=2)
    assert not any("mix integers" in n for n in rep.notes)


def test_renormalising_a_router_that_does_not_is_noted(tmp_path):
    """``renormalise="topk"`` on a model whose router does not renormalise (OLMoE's top-8 of
    64, weights summing below 1) does as asked and says the weights now differ from the
    model's (a new user's ran silently); on a renormalising model, or with "model", no note."""
    ids, w = tuple(range(8)), (0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05)
    lines = [row(t=t, layer=lay, ids=ids, w=w) for t in range(2) for lay in range(16)]
    path = write(tmp_path, lines, "olmoe.jsonl")
    said = "renormalised over the top-k as asked, though olmoe-1b-7b's router does not"
    tr, rep = import_vllm_jsonl(path, model="olmoe-1b-7b", renormalise="topk")
    assert any(n.startswith(said) for n in rep.notes) and tr.weights_renormalised
    _, rep = import_vllm_jsonl(path, model="olmoe-1b-7b", renormalise="model")
    assert not any(n.startswith("renormalised over the top-k") for n in rep.notes)
    mix = write(tmp_path, [row(t=t, layer=lay, w=(0.5, 0.3)) for t in range(2)
                           for lay in range(32)], "mix.jsonl")
    _, rep = import_vllm_jsonl(mix, model="mixtral-8x7b", renormalise="topk")
    assert not any(n.startswith("renormalised over the top-k") for n in rep.notes)


def test_a_layer_off_by_the_numbering_gets_a_hint(tmp_path):
    """A layer one past the model's last MoE layer, or below its first (1-based numbering, or
    DeepSeek's MoE layers counted from 0), is refused with a hint at the numbering (a new
    user's got the range alone)."""
    for model, layer, hint in (("mixtral-8x7b", 32, "(expected one of 0..31); layers numbered "
                                                    "from 1? The index is the decoder layer's, "
                                                    "from 0"),
                               ("deepseek-v2-lite", 0, "(expected one of 1..26); a dense layer, "
                                                       "or MoE layers numbered from 0? The index "
                                                       "is the decoder layer's"),
                               ("mixtral-8x7b", 40, "(expected one of 0..31)")):
        from elmoe3d.sw.host.models import model_preset
        top = model_preset(model).top_k
        path = write(tmp_path, [row(layer=layer, ids=tuple(range(top)), w=(1 / top,) * top)],
                     f"{model}{layer}.jsonl")
        with pytest.raises(TraceError) as exc:
            import_vllm_jsonl(path, model=model)
        assert str(exc.value).endswith(f":1: layer {layer} is not a MoE layer {hint}")


def test_file_level_errors(tmp_path):
    with pytest.raises(TraceError, match="no such"):
        import_vllm_jsonl(tmp_path / "none.jsonl")
    lfs = write(tmp_path, ["version https://git-lfs.github.com/spec/v1"], "lfs.jsonl")
    with pytest.raises(TraceError, match="LFS"):
        import_vllm_jsonl(lfs)
    meta = write(tmp_path, [{"meta": {"num_experts": 64}}] + grid(), "m.jsonl")
    with pytest.raises(TraceError, match="num_experts disagrees.*model says 8.*meta line says 64"):
        import_vllm_jsonl(meta, model="mixtral-8x7b")
    with pytest.raises(TraceError, match="is not mixtral"):
        import_vllm_jsonl(write(tmp_path, [{"meta": {"model": "olmoe-1b-7b"}}] + grid(),
                                "m2.jsonl"), model="mixtral-8x7b")
    with pytest.raises(TraceError, match="meta line must be"):
        import_vllm_jsonl(write(tmp_path, [{"meta": 3}] + grid(), "m3.jsonl"))
    path = write(tmp_path, grid())
    for kw, words in ((dict(on_error="ignore"), "on_error"), (dict(renormalise="yes"),
                                                              "renormalise"),
                      (dict(renormalise="model"), "needs model"),
                      (dict(warmup_tokens=-1), "warmup_tokens"),
                      (dict(model="mixtral-8x22b"), "unknown model preset")):
        with pytest.raises(Exception, match=words):
            import_vllm_jsonl(path, **kw)
    _, rep = import_vllm_jsonl(write(tmp_path, [{"meta": {"colour": 1}}] + grid(), "m4.jsonl"),
                               num_experts=8)
    assert any("unknown meta key 'colour'" in n for n in rep.notes)


@pytest.mark.parametrize("text", ["", "\n\n", '{"meta": {"model": "mixtral-8x7b"}}\n'])
def test_a_log_without_routing_records_is_refused(tmp_path, text):
    """An empty log imported as a trace of invented sizes (num_experts 1, top_k 1)."""
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    for model in (None, "mixtral-8x7b"):
        with pytest.raises(TraceError, match=r"empty\.jsonl: no routing records \(0 records "
                                             r"read, 0 kept"):
            import_vllm_jsonl(path, model=model)


def test_a_directory_is_named_a_directory(tmp_path):
    with pytest.raises(TraceError, match="a directory, not a routing log"):
        import_vllm_jsonl(tmp_path)
    with pytest.raises(TraceError, match="a directory, not a trace file"):
        RoutingTrace.load(tmp_path)


def test_an_unknown_routing_trace_name_is_a_user_error():
    from elmoe3d.errors import UserError
    for name in ("mmlu", None):
        with pytest.raises(UserError, match="routing trace .*: expected one of gsm8k, humaneval"):
            routing_path(name)

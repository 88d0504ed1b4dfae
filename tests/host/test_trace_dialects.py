"""Routing-log dialects found in the wild (elmoe3d.sw.host.trace.import_vllm_jsonl with
elmoe3d.sw.host.routelog): flat meta lines and string request ids, profiling dummy passes, forward-pass
indices, token_pos restarts, gate weights that disagree with the router, expert-usage statistics
offered as a trace. Every fixture is ours (tests/host/routelog_dialects.py); the expected counts come
from the fixture's layout, never from the importer."""

import json
from collections import Counter

import numpy as np
import pytest

from . import routelog_dialects as D
from elmoe3d.errors import UserError
from elmoe3d.sw.host.corpus import traces_dir
from elmoe3d.sw.host.routelog import forward_passes, router_norm_mismatch, warmup_blocks
from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.trace import PHASES, TraceError, import_vllm_jsonl
from elmoe3d.sw.host.tracegen import calibrate_from_usage, expert_usage, usage_counts

COUNTED = ("records", "kept", "prefill", "decode", "warmup", "duplicates", "missing",
           "layers_absent")


def check_counts(rep, want):
    got = rep.counts()
    assert {k: got[k] for k in COUNTED} == {k: want[k] for k in COUNTED}
    line = rep.counts_line()
    assert f"{want['records']} records read, {want['kept']} kept" in line
    assert f"{want['warmup']} warm-up" in line and f"{want['duplicates']} duplicate" in line


def by_position(tr):
    """``{(request, position, layer): (phase, ids, weights)}`` of a trace."""
    return {(int(r), int(p), int(l)): (PHASES[ph], ids.tolist(), w)
            for r, p, l, ph, ids, w in zip(tr.request, tr.position, tr.layer, tr.phase,
                                           tr.expert_ids, tr.gate_weights)}


# -- 1. flat meta line, "type": "route" records, string request ids ---------------------------

def test_flat_meta_line_and_string_request_ids(tmp_path):
    path = tmp_path / "meta.jsonl"
    want = D.meta_route(path)
    for model in ("mixtral-8x7b", None):            # None: the model from the meta line's id
        tr, rep = import_vllm_jsonl(path, model=model)
        check_counts(rep, want)
        assert tr.model == "mixtral-8x7b" and tr.layer_ids == tuple(range(32))
        assert rep.request_names == want["requests"] and rep.requests == 2
        assert rep.other_records == Counter(want["other"])
        assert rep.layers_logged == (0,) and rep.layers_absent == tuple(range(1, 32))
        assert rep.missing_by_layer == {}            # absent layers are not "missing records"
        assert "1..31" in "\n".join(rep.summary())
    # every row as written, request r2 numbered 1
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    routes = [r for r in rows if r.get("type") == "route"]
    got = by_position(tr)
    for r in routes:
        _, ids, w = got[(want["requests"][r["req_id"]], r["token_idx"], 0)]
        assert ids == r["topk_ids"]
        np.testing.assert_allclose(w, r["topk_weights"], rtol=1e-6)


def test_meta_layers_logged_rejects_a_record_of_another_layer(tmp_path):
    path = tmp_path / "meta.jsonl"
    D.meta_route(path)
    lines = path.read_text().splitlines()
    extra = json.loads(lines[2])
    extra["layer"], extra["token_idx"] = 5, 99
    path.write_text("\n".join(lines[:3] + [json.dumps(extra)] + lines[3:]) + "\n")
    with pytest.raises(TraceError, match=r":4: layer 5 is not in the meta line's layers_logged"):
        import_vllm_jsonl(path)
    _, rep = import_vllm_jsonl(path, on_error="warn")
    assert rep.malformed == Counter({"bad-layer": 1})


def test_meta_model_disagreeing_with_the_argument(tmp_path, capsys):
    path = tmp_path / "meta.jsonl"
    D.meta_route(path)
    with pytest.raises(TraceError, match=r"is not olmoe-1b-7b \(it is mixtral-8x7b's\)"):
        import_vllm_jsonl(path, model="olmoe-1b-7b")
    # a model id no preset knows: noted; --model decides
    text = path.read_text().replace("mistralai/Mixtral-8x7B-Instruct-v0.1", "acme/moe-9000")
    path.write_text(text)
    code, out, err = run_cli(capsys, "--trace", str(path), *PERF, "--layers", "0")
    assert code == 2 and "--model: required with meta.jsonl" in err
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF,
                             "--layers", "0")
    assert code == 0 and "meta model 'acme/moe-9000' is not a known preset" in out


# -- 2. profiling dummy passes ------------------------------------------------------------------

def test_profiling_dummy_blocks_are_detected_dropped_and_reported(tmp_path):
    path = tmp_path / "warmup.jsonl"
    want = D.warmup(path)
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b")
    check_counts(rep, want)
    assert [(a, b, n) for a, b, n, _ in rep.warmup_blocks] == want["blocks"]
    assert "uniform gate weights" in rep.warmup_blocks[0][3]
    assert "exactly as its layer's neighbour" in rep.warmup_blocks[1][3]
    assert {r.request: r.tokens for r in tr.requests()} == want["tokens"]
    text = "\n".join(rep.summary())
    assert "lines 1-2048: 2048 records dropped as a warm-up" in text and "--keep-warmup" in text
    # the kept rows are the real ones: no uniform row is left
    assert not (tr.gate_weights[:, 0] == tr.gate_weights[:, 1]).any()


def test_keep_warmup_imports_the_dummy_rows_and_says_what_they_break(tmp_path):
    path = tmp_path / "warmup.jsonl"
    D.warmup(path)
    with pytest.raises(TraceError, match=":2817: no request id"):
        import_vllm_jsonl(path, model="mixtral-8x7b", keep_warmup=True)
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b", keep_warmup=True, on_error="warn")
    assert rep.dropped_warmup == 0 and not rep.warmup_blocks
    # the null-id block has no request; under request 0 the dummy's 64 positions and the real
    # 24 repeat the index, so they are read as two forward passes, and the report says so
    assert rep.malformed == Counter({"missing-field": 32 * 32})
    assert len(tr) == (64 + 24 + 16) * 32 and "2 prefill pass(es) of 88" in rep.reconstructed["0"]


def test_warmup_rule_needs_a_long_alike_run():
    """Below the run length nothing is dropped; uniform weights of k = 1 are not evidence."""
    lay = [0, 1] * 8
    ids = [np.array([0, 1])] * 16
    w = [np.array([0.5, 0.5])] * 16
    assert [(b.start, b.stop) for b in warmup_blocks(lay, ids, w, min_rows=16)] == [(0, 16)]
    assert warmup_blocks(lay, ids, w, min_rows=17) == []
    rng = np.random.default_rng(0)
    ids1 = [np.array([int(rng.integers(8))]) for _ in range(16)]
    assert warmup_blocks(lay, ids1, [np.array([1.0])] * 16, min_rows=4) == []


def test_warmup_tokens_argument_and_meta(tmp_path):
    """--warmup N: the first N positions of every request (after the positions are rebuilt)."""
    path = tmp_path / "tp.jsonl"
    want = D.token_pos_restart(path)
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b", warmup_tokens=3)
    assert rep.dropped_warmup == 2 * 3 * 32            # (the missing record is position 4)
    assert tr.position.min() == 3 and rep.rows == want["kept"] - rep.dropped_warmup


# -- 3 and 4. the index is the row inside a forward pass ----------------------------------------

@pytest.mark.parametrize("writer", [D.forward_pass_index, D.token_pos_restart])
def test_positions_rebuilt_from_forward_passes(tmp_path, writer):
    path = tmp_path / "passes.jsonl"
    want = writer(path)
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b")
    check_counts(rep, want)
    assert not rep.malformed and rep.position_gaps == 0
    assert set(rep.reconstructed) == {"0", "1"}
    got = by_position(tr)
    n = 0
    for r, (p, d) in enumerate(zip(want["prompt"], want["decode_tokens"])):
        for t in range(p + d):
            for lay in range(32):
                if (r, t, lay) not in got:
                    continue
                phase, ids, w = got[(r, t, lay)]
                assert phase == ("prefill" if t < p else "decode")
                assert ids == want["ids"][r, t, lay].tolist()
                np.testing.assert_allclose(w, want["weights"][r, t, lay], rtol=1e-6)
                n += 1
    assert n == want["kept"]
    assert tr.token_count("prefill") == sum(want["prompt"])
    assert tr.token_count("decode") == sum(want["decode_tokens"])


def test_a_pass_that_cannot_be_placed_is_refused_with_its_line(tmp_path):
    path = tmp_path / "passes.jsonl"
    D.forward_pass_index(path)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    # a 3-row pass of request 0 after its decode steps (a speculative verification?)
    extra = [dict(rows[0], token_idx=i, layer=lay) for lay in range(32) for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + extra))
    first = len(rows) + 1
    with pytest.raises(TraceError, match=rf":{first}: request 0: .*3 rows after decode steps"):
        import_vllm_jsonl(path, model="mixtral-8x7b")
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b", on_error="warn")
    assert rep.malformed["unplaceable"] == (12 + 20 + 3) * 32
    assert set(np.unique(tr.request)) == {1}                  # request 1 still imported


def test_a_genuine_duplicate_in_a_pass_log_is_still_a_duplicate(tmp_path):
    path = tmp_path / "passes.jsonl"
    D.token_pos_restart(path)
    lines = path.read_text().splitlines()
    lines.insert(20, lines[19])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=":21: .*already on line 20"):
        import_vllm_jsonl(path, model="mixtral-8x7b")


def test_every_line_logged_twice_is_duplicates_not_warmup(tmp_path):
    """Two tensor-parallel ranks logging the same records: every line twice in a row. The
    copies are duplicates (counted); the originals are kept; nothing is read as warm-up."""
    path = tmp_path / "w.jsonl"
    want = D.warmup(path, dummy=(0, 0))
    lines = path.read_text().splitlines()
    path.write_text("".join(x + "\n" + x + "\n" for x in lines))
    with pytest.raises(TraceError, match=":2: .*already on line 1"):
        import_vllm_jsonl(path, model="mixtral-8x7b")
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b", on_error="warn")
    assert rep.counts()["duplicates"] == want["kept"] and rep.dropped_warmup == 0
    assert len(tr) == want["kept"] and rep.records == 2 * want["kept"]
    # the event line words them as the counts do: duplicates, not malformed (a new user's)
    assert any(f"skipped {want['kept']} duplicate line(s) (the first kept): line 2, 4, " in x
               for x in rep.summary())
    assert not any("[duplicate]" in x for x in rep.summary())


def test_pass_log_with_two_decode_steps_routed_alike_and_a_line_logged_twice(tmp_path):
    path = tmp_path / "passes.jsonl"
    want = D.token_pos_restart(path)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    # decode steps 3 and 4 of request 0 route alike in layer 2 (both logged at position 0)
    dec = [i for i, r in enumerate(rows) if r["seq_id"] == 0 and r["layer_idx"] == 2
           and r["token_pos"] == 0]
    rows[dec[4]] = dict(rows[dec[4]], topk_ids=rows[dec[3]]["topk_ids"],
                        topk_weights=rows[dec[3]]["topk_weights"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b")
    assert rep.rows == want["kept"] and not rep.malformed
    # ... and a line logged twice in that log is a duplicate, the rest placed
    lines = path.read_text().splitlines()
    lines.insert(20, lines[19])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=":21: .*already on line 20"):
        import_vllm_jsonl(path, model="mixtral-8x7b")
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b", on_error="warn")
    assert rep.malformed == Counter({"duplicate": 1}) and rep.rows == want["kept"]


def test_a_missing_decode_record_in_a_layer_by_layer_pass_log_is_refused(tmp_path):
    path = tmp_path / "passes.jsonl"
    D.token_pos_restart(path, drop=((0, 3, 12),))
    with pytest.raises(TraceError, match="request 0: .*restarts 14 times in layer 0 but 13 "
                                         "times in layer 3.*which forward pass lacks a record"):
        import_vllm_jsonl(path, model="mixtral-8x7b")
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b", on_error="warn")
    assert rep.malformed["unplaceable"] == (9 + 14) * 32 - 1 and set(tr.request) == {1}


def test_mixed_integer_and_string_request_ids(tmp_path):
    objs = [{"req_id": v, "layer": 0, "token_idx": 0, "experts": [1, 0],
             "gating_probs": [0.6, 0.4]} for v in (0, "0", 1, "r1")]
    path = D.write_lines(tmp_path / "m.jsonl", objs)
    tr, rep = import_vllm_jsonl(path, num_experts=8)
    assert rep.request_names == {0: 0, "0": 1, 1: 2, "r1": 3} and len(tr) == 4
    assert "'0' -> 1" in "\n".join(rep.notes) and "0 -> 0" in "\n".join(rep.notes)


@pytest.mark.parametrize("lines, words", [
    ([], "0 records read, 0 kept"), (['{"type": "meta", "top_k": 2}'], "0 records read"),
    (['{"meta": {"num_experts": 8}}', "{oops", "[1]"], "2 records read, 0 kept"),
])
def test_empty_logs_are_counted_and_run_says_so(tmp_path, capsys, lines, words):
    """A log with no routing record left is refused naming the file, with the counts (it
    imported as a trace of invented sizes before: num_experts 1, top_k 1)."""
    path = tmp_path / "e.jsonl"
    path.write_text("".join(x + "\n" for x in lines))
    with pytest.raises(TraceError, match="e.jsonl: no routing records \\(") as exc:
        import_vllm_jsonl(path, num_experts=8, on_error="warn")
    assert words in str(exc.value)
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF)
    assert code == 2 and "Traceback" not in err
    if not lines[1:]:
        assert "no routing records (0 records read" in err


def test_forward_passes_rules():
    # pass by pass, two layers: prefill of 3, two decode steps
    lay = [0, 0, 0, 1, 1, 1, 0, 1, 0, 1]
    idx = [0, 1, 2, 0, 1, 2, 0, 0, 0, 0]
    out = forward_passes(lay, idx)
    assert out.position == [0, 1, 2, 0, 1, 2, 3, 3, 4, 4]
    assert out.pass_phase == ["prefill", "decode", "decode"] and out.sizes == [3, 1, 1]
    # every pass one row: decode steps only (the prefill was not logged)
    assert forward_passes([0, 0, 0], [0, 0, 0]).phase == ["decode"] * 3
    # the index as the row in the whole batch: this request's prefill on rows 5..7, its
    # decode steps on row 1: each pass starts at its own first row
    out = forward_passes([0, 0, 0, 0, 0], [5, 6, 7, 1, 1])
    assert out.position == [0, 1, 2, 3, 4] and out.sizes == [3, 1, 1]
    # layer by layer with an unequal number of passes
    with pytest.raises(ValueError, match="which forward pass lacks a record cannot be told"):
        forward_passes([0, 0, 0, 1, 1], [0, 1, 0, 0, 1])
    # stated phases are kept; a draft log cannot be rebuilt
    assert forward_passes([0, 0], [0, 0], ["decode", "decode"]).phase == ["decode"] * 2
    with pytest.raises(ValueError, match="prefill and decode logs only"):
        forward_passes([0, 0], [0, 0], ["verify", "verify"])


def test_real_logs_are_read_as_before():
    """The real Mixtral logs have unique positions and no warm-up block: nothing rebuilt or
    dropped (their figures are pinned in test_trace_import.py)."""
    for name in ("gsm8k_2_routing.jsonl", "humaneval_2_routing.jsonl"):
        _, rep = import_vllm_jsonl(traces_dir() / name, model="mixtral-8x7b")
        assert not rep.warmup_blocks and not rep.reconstructed and not rep.router_mismatch
        assert rep.counts()["warmup"] == 0 and rep.counts()["prefill"] == 0


# -- 5. gate weights against the model's router -------------------------------------------------

@pytest.mark.parametrize("model, k, experts, layers, renormalised, flagged", [
    ("mixtral-8x7b", 2, 8, 32, False, True), ("mixtral-8x7b", 2, 8, 32, True, False),
    ("olmoe-1b-7b", 8, 64, 16, True, True), ("olmoe-1b-7b", 8, 64, 16, False, False)])
def test_gate_weights_against_the_router(tmp_path, model, k, experts, layers, renormalised,
                                         flagged):
    path = tmp_path / "w.jsonl"
    want = D.unrenormalised(path, renormalised=renormalised, k=k, experts=experts,
                            layers=layers)
    _, rep = import_vllm_jsonl(path, model=model)
    assert rep.router_mismatch == (want["rows"] if flagged else 0)
    text = "\n".join(rep.notes)
    if flagged:
        verb = "not summing to 1" if not renormalised else "summing to 1"
        assert f"{want['rows']} of {want['rows']} rows have gate weights {verb}" in text
        assert f"norm_topk_prob {'true' if not renormalised else 'false'}" in text
    else:
        assert "norm_topk_prob" not in text


def test_router_mismatch_names_the_scaling_factor():
    glm = model_preset("glm-4.7-flash")
    n, msg = router_norm_mismatch(np.array([1.8, 1.8, 1.0]), glm, 1e-3)
    assert n == 2 and "2 sum to the routed scaling factor 1.8" in msg


# -- 6. expert-usage statistics -----------------------------------------------------------------

def test_expert_usage_offered_as_a_trace_is_named(tmp_path):
    path = tmp_path / "switch_usage.json"
    D.switch_usage(path)
    with pytest.raises(TraceError) as e:
        import_vllm_jsonl(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: expert-usage statistics (selection counts of 6 layer(s) x "
                          f"128 experts), not a routing log")
    assert "--trace synthetic:" in msg and "column" not in msg
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": "world"}, indent=2))
    with pytest.raises(TraceError, match="one JSON object spanning the file, not a routing log"):
        import_vllm_jsonl(other)


def test_expert_usage_calibrates_the_generator(tmp_path):
    path = tmp_path / "switch_usage.json"
    doc = D.switch_usage(path)
    counts = expert_usage(path)
    assert list(counts) == list(doc["layers"]) and all(len(c) == 128 for c in counts.values())
    params, fit = calibrate_from_usage("switch-base-128", path, tokens=512,
                                       zipf=(0.0, 0.5, 1.0, 1.5))
    assert fit["layers"] == 6 and fit["tokens"] == 512
    # the grid point whose generated skew is nearest the target's
    assert abs(fit["generated"] - fit["target"]) / fit["target"] < 0.25 and params.zipf > 0
    with pytest.raises(UserError, match="128 experts per layer, mixtral-8x7b routes over 8"):
        calibrate_from_usage("mixtral-8x7b", path)


@pytest.mark.parametrize("doc, words", [
    ({"layers": {"a": [1, 2], "b": [1, 2, 3]}}, "layer 'b' has 3 experts"),
    ([[1, -2]], "finite counts >= 0"), ({"layers": {"a": "x"}}, "expected a list of counts"),
    ({"layers": {}}, "no layer \\(expected per-layer lists of expert counts"),
    ({"layers": [[1]], "counts": [[1]]}, "both"),
    # a layer with no pick (0/0 in the calibration downstream; a test audit's mutation let
    # it through), the first or a later one
    ({"layers": {"a": [0, 0, 0, 0], "b": [3, 1, 0, 2]}}, "layer 'a': .* with at least one pick"),
    ([[3, 1], [0.0, 0.0]], "layer '1': .* with at least one pick"),
    (3, "expected per-layer count lists")])
def test_expert_usage_errors(doc, words):
    with pytest.raises(UserError, match=words):
        usage_counts(doc)


# -- 7. every import prints its counts; a run over unlogged layers is refused -----------------

def run_cli(capsys, *argv):
    from elmoe3d.cli import main
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


PERF = ("--config", "paper-8gb", "--backend", "perf", "--tokens", "8")


@pytest.mark.parametrize("writer", [D.meta_route, D.warmup, D.forward_pass_index,
                                    D.token_pos_restart, D.unrenormalised])
def test_run_prints_each_dialect_counts(tmp_path, capsys, writer):
    path = tmp_path / "log.jsonl"
    want = writer(path)
    j = tmp_path / "r.json"
    extra = ("--layers", "0") if writer is D.meta_route else ()
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF,
                             "--json", str(j), *extra)
    assert code == 0, err
    first = out.splitlines()[0]
    assert (f"({want['records']} records read, {want['kept']} kept ({want['prefill']} prefill, "
            f"{want['decode']} decode); dropped: {want['warmup']} warm-up, 0 padding, "
            f"{want['duplicates']} duplicate, 0 malformed; {want['missing']} (token, layer) "
            f"records missing") in first
    doc = json.loads(j.read_text())
    assert {k: doc["import_counts"][k] for k in COUNTED} == {k: want[k] for k in COUNTED}
    assert doc["tokens"] == 8
    if writer is D.warmup:
        assert out.count("dropped as a warm-up (profiling dummy) block") == 2
    elif writer is D.meta_route:
        assert "31 layer(s) absent; 2 line(s) of other record types skipped)" in first
        assert "request ids are strings" in out and "from the meta line" not in out
    elif writer is D.unrenormalised:
        assert (f"import: {path}: {want['rows']} of {want['rows']} rows have gate weights not "
                f"summing to 1, but mixtral-8x7b renormalises its top-2") in out
    else:
        assert out.count("positions rebuilt from") == 2


def test_run_refuses_a_log_of_one_layer_unless_layers_asks_for_it(tmp_path, capsys):
    path = tmp_path / "meta.jsonl"
    want = D.meta_route(path)
    code, out, err = run_cli(capsys, "--trace", str(path), *PERF)
    assert code == 2 and not out
    assert err.strip().splitlines() == [
        "elmoe3d run: error: --trace: 31 of 32 MoE layers of mixtral-8x7b have no record "
        "(1..31): figures over all layers would stand for routing nobody logged; pass "
        "--layers 0 to run the logged layer(s) only [import: 32 records read, 32 kept (0 "
        "prefill, 32 decode); dropped: 0 warm-up, 0 padding, 0 duplicate, 0 malformed; 0 "
        "(token, layer) records missing; 31 layer(s) absent; 2 line(s) of other record types "
        "skipped]"]
    code, out, err = run_cli(capsys, "--trace", str(path), *PERF, "--layers", "0:4")
    assert code == 2 and "--layers: layer(s) 1..3 have no record in the trace" in err
    j = tmp_path / "r.json"
    code, out, err = run_cli(capsys, "--trace", str(path), *PERF, "--layers", "0",
                             "--json", str(j))
    assert code == 0, err
    assert f"({want['records']} records read, {want['kept']} kept" in out
    assert "31 layer(s) absent" in out and "1 of 32 MoE layers" in out
    doc = json.loads(j.read_text())
    assert doc["layers"] == [0] and doc["hb_share"] == 1 / 32
    # one layer's share of the slots: the draft pool cannot hold all of layer 0's experts
    esd = doc["runs"][0]["elastic_sd"]
    assert doc["runs"][0]["hb_slots"] < 8 and esd["acceptance_rate"] < 0.9


def test_run_warmup_options(tmp_path, capsys):
    path = tmp_path / "tp.jsonl"
    D.token_pos_restart(path)
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF,
                             "--warmup", "3")
    assert code == 0 and "dropped: 192 warm-up" in out
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF,
                             "--warmup", "-1")
    assert code == 2 and "--warmup: expected an integer >= 0, got -1" in err
    wpath = tmp_path / "w.jsonl"
    D.warmup(wpath)
    code, out, err = run_cli(capsys, "--trace", str(wpath), "--model", "mixtral-8x7b", *PERF,
                             "--keep-warmup")
    assert code == 2 and f"{wpath}:2817: no request id" in err
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF,
                             "--keep-warmup", "--warmup", "2")
    assert code == 2 and "give one of them" in err
    code, out, err = run_cli(capsys, "--trace", "synthetic:" + str(tmp_path / "u.json"),
                             "--model", "mixtral-8x7b", *PERF, "--keep-warmup")
    assert code == 2 and "no such file" in err


def test_run_on_expert_usage(tmp_path, capsys):
    path = tmp_path / "switch_usage.json"
    D.switch_usage(path)
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF)
    assert code == 2 and "expert-usage statistics (selection counts of 6 layer(s) x 128" in err
    assert "Traceback" not in err and "column" not in err
    code, out, err = run_cli(capsys, "--trace", f"synthetic:{path}", "--model",
                             "switch-base-128", *PERF)
    assert code == 2 and "two-matrix relu FFNs, not SwiGLU" in err
    # usage of the right width calibrates synthetic routing that runs
    doc = {"layers": [list(range(1, 9))] * 4}
    upath = tmp_path / "mixtral_usage.json"
    upath.write_text(json.dumps(doc))
    code, out, err = run_cli(capsys, "--trace", f"synthetic:{upath}", "--model",
                             "mixtral-8x7b", *PERF)
    assert code == 0, err
    assert "synthetic routing, 8 tokens, zipf" in out.splitlines()[0]


# -- what a new user brought: doubled lines pass by pass, short dummy blocks, file forms -----

@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_a_line_logged_twice_in_a_pass_by_pass_log(tmp_path, capsys, which):
    path = tmp_path / "passes.jsonl"
    want = D.forward_pass_index(path)
    lines = path.read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    # request 0's first decode line of layer 7, or its prefill row 3 of layer 7
    at = next(i for i, r in enumerate(rows) if r["req_id"] == 0 and r["layer"] == 7
              and r["token_idx"] == (3 if which == "prefill" else 0)
              and (which == "prefill" or i > 12 * 32))
    lines.insert(at + 1, lines[at])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=rf":{at + 2}: .*already on line {at + 1}"):
        import_vllm_jsonl(path, model="mixtral-8x7b")
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b", on_error="warn")
    assert rep.malformed == Counter({"duplicate": 1}) and rep.rows == want["kept"]
    assert rep.missing_records == 0 and tr.token_count("decode") == sum(want["decode_tokens"])
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF,
                             "--on-error", "warn")
    assert code == 0, err
    assert f"{want['records'] + 1} records read, {want['kept']} kept" in out
    assert "1 duplicate, 0 malformed" in out


def test_a_short_block_of_uniform_weights_is_warmup_and_a_null_request_named(tmp_path):
    ids, w = D.routing(8, requests=1, seed=9)
    dummy = [{"request_id": 0, "layer": lay, "experts": [0, 1], "gating_probs": [0.5, 0.5],
              "token_idx": t} for lay in range(32) for t in range(4)]
    real = [{"request_id": 0, "layer": lay, "experts": ids[0, t, lay].tolist(),
             "gating_probs": w[0, t, lay].tolist(), "token_idx": t}
            for lay in range(32) for t in range(8)]
    path = D.write_lines(tmp_path / "w.jsonl", dummy + real)
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b")
    assert rep.dropped_warmup == 128 and rep.rows == 256 and tr.token_count() == 8
    # fewer uniform rows than WARMUP_MIN_UNIFORM_ROWS are no warmup: routing, here records
    # of 5 of the 32 layers that the real tokens repeat with another routing. They were read
    # as a restarted index (every real token shifted by 4) until an audit (2026-12-06): a
    # restart repeats the index in most of a request's layers, a conflict is named
    path = D.write_lines(tmp_path / "w2.jsonl", dummy[:20] + real)
    with pytest.raises(TraceError, match=r":21: record \(request 0, position 0, layer 0, "
                                         r"decode\) already on line 1 with another routing"):
        import_vllm_jsonl(path, model="mixtral-8x7b")
    tr, rep = import_vllm_jsonl(path, model="mixtral-8x7b", on_error="warn")
    assert rep.dropped_warmup == 0 and rep.malformed == {"conflict": 40}
    assert rep.rows == 236 and tr.token_count() == 8 and not rep.reconstructed
    path = D.write_lines(tmp_path / "w3.jsonl", [dict(real[0], request_id=None)] + real[1:])
    with pytest.raises(TraceError, match=":1: no request id \\(the field is absent or null"):
        import_vllm_jsonl(path, model="mixtral-8x7b")


def test_file_forms_gzip_bom_comments_hf_names(tmp_path, capsys):
    import gzip
    path = tmp_path / "log.jsonl"
    want = D.token_pos_restart(path)
    text = path.read_text()
    gz = tmp_path / "log.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(text)
    bom = tmp_path / "log.ndjson"
    bom.write_text("\ufeff# logged by our hook\n" + text.replace("topk_ids", "selected_experts")
                   .replace("topk_weights", "routing_weights"), encoding="utf-8")
    for p in (gz, bom):
        tr, rep = import_vllm_jsonl(p, model="mixtral-8x7b")
        check_counts(rep, want)
        code, out, err = run_cli(capsys, "--trace", str(p), "--model", "mixtral-8x7b", *PERF)
        assert code == 0, err
    assert any("1 comment line(s)" in n for n in rep.notes)
    code, out, err = run_cli(capsys, "--trace", str(tmp_path), "--model", "mixtral-8x7b")
    assert code == 2 and "is a folder" in err
    other = tmp_path / "log.parquet"
    other.write_text("x")
    code, out, err = run_cli(capsys, "--trace", str(other), "--model", "mixtral-8x7b")
    assert code == 2 and ".jsonl.gz" in err and "got .parquet" in err
    code, out, err = run_cli(capsys, "--trace", str(path), *PERF)
    assert code == 2 and "it has no meta line naming the model" in err
    # gzip data by its bytes, whatever the name (a new user's .jsonl of gzip data was "'utf-8'
    # codec can't decode byte 0x8b"), and a truncated .gz (a logger killed mid-write): refused
    # naming --on-error warn, which reads the lines it holds (the last one cut short)
    named = tmp_path / "gz-data.jsonl"
    named.write_bytes(gz.read_bytes())
    tr, rep = import_vllm_jsonl(named, model="mixtral-8x7b")
    check_counts(rep, want)
    assert "gzip data in a file not named .gz: decompressed" in rep.notes
    from elmoe3d.sw.host.corpus import routing_path
    data = gzip.compress(routing_path("gsm8k").read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[:len(data) * 2 // 3])
    with pytest.raises(TraceError, match=r"cut\.jsonl\.gz: cannot read \(the gzip data ends "
                                         r"early: a truncated file; --on-error warn reads the "
                                         r"lines it holds\)"):
        import_vllm_jsonl(cut, model="mixtral-8x7b")
    tr, rep = import_vllm_jsonl(cut, model="mixtral-8x7b", on_error="warn")
    assert 1000 < rep.rows < 7889 and not rep.malformed
    assert any("the gzip data ends early" in n for n in rep.notes)
    # a cut inside a character is a cut line too, not an undecodable file (a review's)
    accent = gzip.compress(("".join(routing_path("gsm8k").read_text().splitlines(True)[:50])
                            + '{"note": "é' * 200).encode())
    cut.write_bytes(accent[:-12])
    _, rep = import_vllm_jsonl(cut, model="mixtral-8x7b", on_error="warn")
    assert rep.rows == 50
    # a log of several gzip members (a logger appending with "ab") is read whole (a review
    # found the first member alone read, unsaid)
    lines = routing_path("gsm8k").read_text().splitlines(True)
    two = tmp_path / "two.jsonl.gz"
    two.write_bytes(gzip.compress("".join(lines[:4000]).encode())
                    + gzip.compress("".join(lines[4000:]).encode()))
    _, rep = import_vllm_jsonl(two, model="mixtral-8x7b")
    assert rep.rows == 7889


def test_run_on_error_warn_keeps_a_log_with_a_cut_off_last_line(tmp_path, capsys):
    path = tmp_path / "log.jsonl"
    want = D.warmup(path, dummy=(0, 0))
    path.write_text(path.read_text()[:-30])
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF)
    assert code == 2 and "not JSON" in err
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF,
                             "--on-error", "warn")
    assert code == 0, err
    assert (f"{want['records']} records read, {want['kept'] - 1} kept" in out
            and "1 malformed; 1 (token, layer) records missing" in out)
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b", *PERF,
                             "--on-error", "ignore")
    assert code == 2 and "--on-error ignore: expected one of raise, warn" in err


def test_synthetic_from_the_count_table_csv(capsys):
    csv = traces_dir() / "olmoe_mixtral_expert_counts.csv"
    code, out, err = run_cli(capsys, "--trace", f"synthetic:{csv}", "--model", "mixtral-8x7b",
                             *PERF)
    assert code == 0, err
    assert "synthetic routing, 8 tokens" in out and "olmoe_mixtral_expert_counts.csv" in out
    code, out, err = run_cli(capsys, "--trace", f"synthetic:{csv}", "--model", "qwen3-30b-a3b",
                             *PERF)
    assert code == 2 and "no 'expert_counts' table with 128 experts" in err


def test_run_says_when_batch_exceeds_the_requests_and_nothing_was_drafted(tmp_path, capsys):
    path = tmp_path / "log.jsonl"
    D.warmup(path, dummy=(0, 0))
    j = tmp_path / "r.json"
    code, out, err = run_cli(capsys, "--trace", str(path), "--model", "mixtral-8x7b",
                             "--config", "paper-8gb", "--tokens", "3", "--batch", "3",
                             "--json", str(j))
    assert code == 0, err
    assert "--batch 3 but the trace has 1 request(s): 1 run in lockstep" in out
    assert "Elastic-SD drafted nothing: every request ends within its autoregressive seed of 4" \
        in out
    assert json.loads(j.read_text())["runs"][0]["elastic_sd"]["iterations"] == 0

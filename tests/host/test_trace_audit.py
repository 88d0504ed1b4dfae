"""Audit fixes of elmoe3d.sw.host.trace: a record logged twice with another routing is a
conflicting duplicate (not a log whose index restarts at each forward pass), implausible
layers / expert ids / positions, deeply nested JSON, the .npz metadata's field types,
RoutingTrace's layer_ids / notes / ragged columns, save() into a bad path (atomically) and
trace_from_router_logits with no layer. Every error names its parameter, file, line or field."""

import json
import os

import numpy as np
import pytest

from . import routelog_dialects as D
from elmoe3d.errors import UserError
from elmoe3d.sw.host.corpus import traces_dir
from elmoe3d.sw.host.trace import (MAX_LAYERS, RoutingTrace, TraceError, capture_hf,
                                   import_vllm_jsonl, trace_from_router_logits)

from ..conftest import hf_module

MIX = "mixtral-8x7b"
GSM8K = "gsm8k_2_routing.jsonl"


def rec(req=0, pos=0, layer=0, ex=(0, 1), w=(0.6, 0.4), **kw):
    out = {"problem_id": req, "layer": layer, "experts": list(ex), "gating_probs": list(w),
           "token_idx": pos}
    out.update(kw)
    return out


def write(path, objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n"
                            for o in objs))
    return path


def run_cli(capsys, *argv):
    from elmoe3d.cli import main
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- 1. a record logged again with another routing -------------------------------------------

@pytest.fixture(scope="module")
def gsm8k_lines():
    return (traces_dir() / GSM8K).read_text().splitlines()


@pytest.fixture(scope="module")
def gsm8k_import():
    return import_vllm_jsonl(traces_dir() / GSM8K, model=MIX)


def _conflicting(lines, at=99, insert=None):
    """The real log with line ``at + 1``'s record written again with its experts swapped:
    appended at the end, or inserted after line ``insert``."""
    r = json.loads(lines[at])
    r["experts"] = r["experts"][::-1]
    extra = json.dumps(r)
    if insert is None:
        return lines + [extra]
    return lines[:insert] + [extra] + lines[insert:]


@pytest.mark.parametrize("insert", [None, 100, 5000])
def test_conflicting_record_in_a_real_log_is_an_error_naming_both_lines(
        tmp_path, gsm8k_lines, gsm8k_import, insert):
    """Was: read as 'the index restarts at each forward pass', request 0's 168 decode tokens
    rebuilt as a prefill, exit 0 (appended), or refused as an unplaceable request (inserted)."""
    path = write(tmp_path / "d.jsonl", _conflicting(gsm8k_lines, insert=insert))
    line = len(gsm8k_lines) + 1 if insert is None else insert + 1
    with pytest.raises(TraceError) as exc:
        import_vllm_jsonl(path, model=MIX)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:{line}: record (request 0, position 99, layer 0, decode) "
                          f"already on line 100 with another routing (experts [4, 6], ")
    assert "experts [6, 4]" in msg and msg.endswith(
        "here): the index never falls back to the start of a forward pass, as it would in "
        "every layer of a log whose index restarts at each pass")
    assert exc.value.kind == "conflict"
    # warn: both lines skipped and counted, the rest read as the log it is (no rebuild)
    tr, rep = import_vllm_jsonl(path, model=MIX, on_error="warn")
    ref, ref_rep = gsm8k_import
    assert rep.malformed == {"conflict": 2}
    assert sorted(ln for ln, kind, _ in rep.issues if kind == "conflict") == sorted([100, line])
    assert not rep.reconstructed and rep.counts()["prefill"] == 0
    assert rep.rows == ref_rep.rows - 1 and rep.records == ref_rep.records + 1
    assert tr.token_count("decode") == ref.token_count("decode") == 247
    assert rep.missing_records == ref_rep.missing_records + 1
    assert rep.missing_by_layer[0] == ref_rep.missing_by_layer.get(0, 0) + 1
    # every other record kept as logged
    keep = ~((tr.request == 0) & (tr.position == 99) & (tr.layer == 0))
    assert len(tr) == int(keep.sum())


def test_conflicting_record_run_refused_or_skipped(tmp_path, capsys, gsm8k_lines):
    path = write(tmp_path / "d.jsonl", _conflicting(gsm8k_lines))
    perf = ("--model", MIX, "--config", "paper-8gb", "--backend", "perf", "--tokens", "8")
    code, out, err = run_cli(capsys, "--trace", str(path), *perf)
    assert code == 2 and "Traceback" not in err
    assert f"{path}:{len(gsm8k_lines) + 1}: record (request 0, position 99, layer 0" in err
    assert "already on line 100 with another routing" in err
    code, out, err = run_cli(capsys, "--trace", str(path), *perf, "--on-error", "warn")
    assert code == 0, err
    assert "7888 kept (0 prefill, 7888 decode)" in out and "2 malformed" in out
    assert "[conflict]: line 100, 7890" in out and "restarts at each forward pass" not in out


def test_small_pass_by_pass_log_with_a_conflicting_record(tmp_path):
    rows = [rec(pos=t, layer=lay, ex=(t % 8, (t + 1) % 8)) for t in range(5)
            for lay in range(2)]
    path = write(tmp_path / "s.jsonl", rows + [rec(pos=2, layer=0, ex=(5, 6))])
    with pytest.raises(TraceError, match=r":11: record \(request 0, position 2, layer 0, "
                                         r"decode\) already on line 5 with another routing"):
        import_vllm_jsonl(path, model=MIX)
    tr, rep = import_vllm_jsonl(path, model=MIX, on_error="warn")
    assert rep.malformed == {"conflict": 2} and len(tr) == 9 and not rep.reconstructed
    assert tr.position.tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 4]


def test_a_restart_log_whose_decode_passes_log_fewer_layers_is_rebuilt(tmp_path):
    """A review (2026-12-06): the rule first counted the restarting layers against all of the
    request's layers, so a log whose decode passes log 10 of the prefill's 32 layers was
    refused as a conflict (and with warn lost its prompt). The layers counted are those logged
    from the first restart on."""
    ids, w = (a.tolist() for a in D.routing(18, requests=1, seed=5))
    rows = [rec(pos=t, layer=lay, ex=ids[0][t][lay], w=w[0][t][lay])
            for t in range(8) for lay in range(32)]                     # the prefill pass
    rows += [rec(pos=0, layer=lay, ex=ids[0][t][lay], w=w[0][t][lay])   # decode, index 0
             for t in range(8, 18) for lay in range(10)]
    tr, rep = import_vllm_jsonl(write(tmp_path / "few.jsonl", rows), model=MIX)
    assert not rep.malformed and set(rep.reconstructed) == {"0"}
    assert tr.token_count("prefill") == 8 and tr.token_count("decode") == 10
    assert [r.positions.tolist() for r in tr.requests("decode")] == [list(range(8, 18))]


@pytest.mark.parametrize("copies", [0, 12])
def test_conflicts_in_two_layers_beside_identical_copies_stay_conflicts(tmp_path, copies):
    """Two records logged again with another routing, in two layers, at positions that are no
    pass start, are conflicts, not restarts, also beside identical copies of other records
    (a copy is a duplicate, never a restart: a review's mutation that counted copies as
    restarts survived every test)."""
    ids, w = (a.tolist() for a in D.routing(6, requests=1, seed=6))
    rows = [rec(pos=t, layer=lay, ex=ids[0][t][lay], w=w[0][t][lay])
            for t in range(6) for lay in range(32)]
    dup = [dict(r) for r in rows[:copies]]            # copies of pass starts (position 0)
    bad = [rec(pos=3, layer=lay, ex=[(e + 1) % 8 for e in ids[0][3][lay]], w=w[0][3][lay])
           for lay in (4, 9)]
    path = write(tmp_path / "two.jsonl", rows + dup + bad)
    with pytest.raises(TraceError, match=r"record \(request 0, position 3, layer 4, decode\) "
                                         r"already on line 101 with another routing"):
        import_vllm_jsonl(path, model=MIX)
    tr, rep = import_vllm_jsonl(path, model=MIX, on_error="warn")
    assert rep.malformed == dict({"conflict": 4}, **({"duplicate": copies} if copies else {}))
    assert not rep.reconstructed and tr.token_count("decode") == 6


def test_a_restart_log_is_still_rebuilt_with_a_record_missing(tmp_path):
    """The rule does not break the real restart case: the index restarts in every layer
    (here one decode record of layer 5 is missing: its layer still restarts elsewhere)."""
    path = tmp_path / "fp.jsonl"
    want = D.forward_pass_index(path)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    at = [i for i, r in enumerate(rows) if r["req_id"] == 0 and r["layer"] == 5
          and r["token_idx"] == 0][-1]
    del rows[at]
    D.write_lines(path, rows)
    tr, rep = import_vllm_jsonl(path, model=MIX)
    assert not rep.malformed and set(rep.reconstructed) == {"0", "1"}
    assert rep.rows == want["kept"] - 1 and rep.missing_records == 1
    assert tr.token_count("decode") == sum(want["decode_tokens"])
    assert tr.token_count("prefill") == sum(want["prompt"])


# -- 6, 7 and the other columns: values beyond any model or the format --------------------------

@pytest.mark.parametrize("row, words", [
    (rec(layer=2 ** 40), ":1: layer 1099511627776 is beyond any MoE model's layers "
                         "(0..1023 read without model="),
    (rec(layer=MAX_LAYERS), ":1: layer 1024 is beyond any MoE model's layers"),
    (rec(ex=(2 ** 70, 1)), ":1: expert id 1180591620717411303424 is beyond any model's experts "
                           "(the trace format's ids are 0..32767)"),
    (rec(ex=(40000, 1)), ":1: expert id 40000 is beyond any model's experts"),
    # named by the line's own field names (token_idx, problem_id; a new user's)
    (rec(pos=2 ** 70), ":1: token_idx 1180591620717411303424 is beyond the trace format's "
                       "positions (0..2147483647)"),
    (rec(req=2 ** 70), ":1: problem_id must be an integer in 0..2147483647 or a string id, "
                       "got 1180591620717411303424"),
    (rec(pos=None), ":1: token_idx must be an integer >= 0, got None"),
])
def test_values_beyond_any_model_name_the_line(tmp_path, row, words):
    path = write(tmp_path / "a.jsonl", [row])
    with pytest.raises(TraceError) as exc:
        import_vllm_jsonl(path)
    assert f"{path}{words}" in str(exc.value)
    # warn: the line skipped and counted; a good line beside it is kept
    path = write(tmp_path / "b.jsonl", [rec(pos=0, layer=1), row])
    tr, rep = import_vllm_jsonl(path, on_error="warn")
    assert len(tr) == 1 and sum(rep.malformed.values()) == 1 and tr.layer_ids == (0, 1)


def test_layers_up_to_the_maximum_are_read(tmp_path):
    path = write(tmp_path / "a.jsonl", [rec(layer=MAX_LAYERS - 1)])
    tr, rep = import_vllm_jsonl(path)
    assert tr.layer_ids == tuple(range(MAX_LAYERS)) and len(rep.layers_absent) == MAX_LAYERS - 1


@pytest.mark.parametrize("meta, words", [
    ({"num_layers": 2 ** 40}, "meta num_layers: expected an integer in 1..1024, got "
                              "1099511627776"),
    ({"num_layers": True}, "meta num_layers: expected an integer in 1..1024, got True"),
    ({"layers_logged": [0, 2 ** 40]}, "meta layers_logged: expected a non-empty list of layer "
                                      "indices in 0..1023, got [0, 1099511627776]"),
    ({"layer_ids": 5}, "meta layer_ids: expected a sorted list of distinct layer indices in "
                       "0..32767, got 5"),
    ({"layer_ids": ["a"]}, "meta layer_ids[0]: expected an integer in 0..32767, got 'a'"),
    ({"layer_ids": [0.5]}, "meta layer_ids[0]: expected an integer in 0..32767, got 0.5"),
    ({"model": 5}, "meta model: expected a string, got 5"),
    ({"source": [1]}, "meta source: expected a string, got [1]"),
])
def test_meta_line_fields_of_the_wrong_type_or_range(tmp_path, meta, words):
    path = write(tmp_path / "a.jsonl", [{"meta": meta}, rec()])
    with pytest.raises(TraceError) as exc:
        import_vllm_jsonl(path)
    assert str(exc.value) == f"{path}: {words}"


# -- 8. deeply nested JSON ------------------------------------------------------------------

@pytest.mark.parametrize("line, words", [
    ("[" * 100_000 + "]" * 100_000, "not readable JSON (arrays or objects nested too deeply)"),
    ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "not readable JSON (arrays or objects nested too deeply)"),
    ('{"a": ' + "9" * 5000 + "}", "not readable JSON (Exceeds the limit (4300 digits)"),
])
def test_unreadable_json_names_the_line(tmp_path, line, words):
    path = write(tmp_path / "a.jsonl", [line])
    with pytest.raises(TraceError) as exc:
        import_vllm_jsonl(path)
    assert str(exc.value).startswith(f"{path}:1: {words}") and exc.value.kind == "bad-json"
    path = write(tmp_path / "b.jsonl", [rec(), line])
    tr, rep = import_vllm_jsonl(path, on_error="warn")
    assert len(tr) == 1 and rep.malformed == {"bad-json": 1} and rep.issues[0][0] == 2


# -- 9. the .npz metadata ------------------------------------------------------------------

def small(**kw):
    d = dict(request=[0, 0], position=[0, 1], layer=[0, 0], phase=[1, 1],
             expert_ids=[[0, 1], [1, 2]], gate_weights=[[0.6, 0.4], [0.7, 0.3]],
             num_experts=4, layer_ids=(0,))
    d.update(kw)
    return RoutingTrace(**d)


def _with_meta(tmp_path, **over):
    path = small().save(tmp_path / "t.npz")
    with np.load(path) as z:
        arrays = {n: z[n] for n in z.files}
    meta = json.loads(arrays["meta"].tobytes())
    meta.update(over)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("over, words", [
    (dict(layer_ids=5), "meta.layer_ids: expected a sorted list of distinct layer indices in "
                        "0..32767, got 5"),
    (dict(layer_ids=None), "meta.layer_ids: expected a sorted list of distinct layer indices "
                           "in 0..32767, got None"),
    (dict(layer_ids=[[0]]), "meta.layer_ids[0]: expected an integer in 0..32767, got [0]"),
    (dict(layer_ids=["a"]), "meta.layer_ids[0]: expected an integer in 0..32767, got 'a'"),
    (dict(layer_ids=[0.7]), "meta.layer_ids[0]: expected an integer in 0..32767, got 0.7"),
    (dict(layer_ids=[True]), "meta.layer_ids[0]: expected an integer in 0..32767, got True"),
    (dict(layer_ids="0"), "meta.layer_ids: expected a sorted list of distinct layer indices "
                          "in 0..32767, got '0'"),
    (dict(notes=5), "meta.notes: expected a list of strings, got 5"),
    (dict(notes="abc"), "meta.notes: expected a list of strings, got 'abc'"),
    (dict(notes=["a", 1]), "meta.notes[1]: expected a string, got 1"),
    (dict(model=5), "meta.model: expected a preset name (a string) or null, got 5"),
    (dict(source=[1]), "meta.source: expected a string, got [1]"),
    (dict(weights_renormalised="no"), "meta.weights_renormalised: expected true or false, got "
                                      "'no'"),
    (dict(top_k="2"), "meta.top_k: expected a positive integer, got '2'"),
    (dict(num_experts="4"), "meta.num_experts: expected a positive integer, got '4'"),
])
def test_load_names_the_file_and_the_meta_field(tmp_path, over, words):
    path = _with_meta(tmp_path, **over)
    with pytest.raises(TraceError) as exc:
        RoutingTrace.load(path)
    assert str(exc.value) == f"{path}: {words}"


def test_load_and_import_refuse_a_path_that_is_not_one():
    with pytest.raises(UserError, match="^path: expected a file name, got 5$"):
        RoutingTrace.load(5)
    with pytest.raises(UserError, match="^path: expected a file name, got None$"):
        import_vllm_jsonl(None)


# -- 5 and 14: RoutingTrace's metadata, ragged columns ----------------------------------------

@pytest.mark.parametrize("kw, words", [
    (dict(layer_ids=[0.7]), "layer_ids[0]: expected an integer in 0..32767, got 0.7"),
    (dict(layer_ids=[True]), "layer_ids[0]: expected an integer in 0..32767, got True"),
    (dict(layer_ids=[np.True_]), "layer_ids[0]: expected an integer in 0..32767, got "
                                 "np.True_"),
    (dict(layer_ids="0"), "layer_ids: expected a sorted list of distinct layer indices in "
                          "0..32767, got '0'"),
    (dict(layer_ids=0), "layer_ids: expected a sorted list of distinct layer indices in "
                        "0..32767, got 0"),
    (dict(layer_ids=None), "layer_ids: expected a sorted list of distinct layer indices in "
                           "0..32767, got None"),
    (dict(layer_ids=[40000]), "layer_ids[0]: expected an integer in 0..32767, got 40000"),
    (dict(layer_ids=[-1, 0]), "layer_ids[0]: expected an integer in 0..32767, got -1"),
    (dict(layer_ids=[]), "layer_ids: expected a sorted list of distinct layer indices in "
                         "0..32767, got []"),
    (dict(notes="abc"), "notes: expected a list of strings, got 'abc'"),
    (dict(notes=[1]), "notes[0]: expected a string, got 1"),
    (dict(model=5), "model: expected a preset name (a string) or None, got 5"),
    (dict(source=5), "source: expected a string, got 5"),
    (dict(expert_ids=[[0, 1], [1]]), "expert_ids: expected a 2-D array, got a ragged sequence "
                                     "(rows of different lengths)"),
    (dict(gate_weights=[[0.6, 0.4], [0.7]]), "gate_weights: expected a 2-D array, got a "
                                             "ragged sequence (rows of different lengths)"),
])
def test_routing_trace_refuses_instead_of_converting(kw, words):
    with pytest.raises(TraceError) as exc:
        small(**kw)
    assert str(exc.value) == words


def test_routing_trace_still_takes_sequences_of_ints():
    for lids in ([0], (0,), range(1), np.array([0], np.int16), [np.int64(0)]):
        tr = small(layer_ids=lids)
        assert tr.layer_ids == (0,) and all(type(x) is int for x in tr.layer_ids)
    assert small(notes=["a", "b"]).notes == ("a", "b")


# -- 14: save() ------------------------------------------------------------------------------

def test_save_into_a_missing_folder_or_onto_a_folder(tmp_path):
    tr = small()
    with pytest.raises(UserError) as exc:
        tr.save(tmp_path / "nodir" / "x.npz")
    assert str(exc.value) == (f"path {tmp_path / 'nodir' / 'x.npz'}: directory "
                              f"{tmp_path / 'nodir'} does not exist")
    (tmp_path / "z.npz").mkdir()
    with pytest.raises(UserError, match=r"^path .*z\.npz: is a directory$"):
        tr.save(tmp_path / "z.npz")
    with pytest.raises(UserError, match="^path: expected a file name, got 5$"):
        tr.save(5)
    with pytest.raises(UserError, match="^path: expected a file name, got ''$"):
        tr.save("")


def test_save_is_atomic(tmp_path, monkeypatch):
    """A write that fails leaves neither a partial file nor a temporary one, and an existing
    trace whole."""
    tr = small()
    old = tr.save(tmp_path / "t.npz")
    before = old.read_bytes()
    real = np.savez_compressed

    def fail(f, **arrays):
        real(f, **arrays)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", fail)
    with pytest.raises(UserError, match=r"^path .*t\.npz: cannot write the trace \(.*No space "
                                        r"left on device"):
        small(notes=["new"]).save(old)
    with pytest.raises(UserError, match="cannot write the trace"):
        tr.save(tmp_path / "new.npz")
    assert old.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["t.npz"]
    monkeypatch.setattr(np, "savez_compressed", real)
    assert RoutingTrace.load(small(notes=["new"]).save(old)).notes == ("new",)
    assert sorted(os.listdir(tmp_path)) == ["t.npz"]


# -- 14: trace_from_router_logits ------------------------------------------------------------

@pytest.mark.parametrize("args, kw, words", [
    (([],), dict(layer_ids=[]), "logits: no layer given (expected one [T, E] array per MoE "
                                "layer)"),
    (([],), {}, "logits: no layer given"),
    ((5,), {}, "logits: expected a sequence of [T, E] arrays (one per MoE layer), got int"),
    (("ab",), {}, "logits: expected a sequence of [T, E] arrays (one per MoE layer), got str"),
    (([[[1.0] * 8, [2.0] * 7]],), dict(layer_ids=[0]),
     "logits[0]: expected a [T, 8] array of numbers, got ragged rows or values that are not "
     "numbers"),
    (([np.array([["a"] * 8])],), dict(layer_ids=[0]), "logits[0]: expected a [T, 8] array"),
    (([np.zeros((2, 8))],), dict(layer_ids="0"), "layer_ids: expected a sorted list of distinct "
                                                  "layer indices in 0..32767, got '0'"),
    (([np.zeros((2, 8))],), dict(layer_ids=[0.5]), "layer_ids[0]: expected an integer in "
                                                    "0..32767, got 0.5"),
    (([np.zeros((2, 8))],), dict(layer_ids=[0], notes="ab"),
     "notes: expected a list of strings, got 'ab'"),
])
def test_trace_from_router_logits_refuses(args, kw, words):
    with pytest.raises(TraceError) as exc:
        trace_from_router_logits(*args, MIX, **kw)
    assert str(exc.value).startswith(words)


def test_trace_from_router_logits_keeps_notes():
    tr = trace_from_router_logits([np.zeros((2, 8))], MIX, layer_ids=[3], notes=["n1", "n2"])
    assert tr.notes == ("n1", "n2") and tr.layer_ids == (3,)


def test_capture_hf_refuses_a_string_of_notes():
    hf_module("torch")
    with pytest.raises(TraceError, match="^notes: expected a list of strings, got 'ab'$"):
        capture_hf(object(), [[1, 2]], MIX, notes="ab")

"""Canonical routing-trace format (elmoe3d.sw.host.trace): validation, round trips, on-disk failure
kinds, router logits to trace (the Hugging Face capture: tests/host/test_trace_hf.py)."""

import json
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from elmoe3d.sw.host.models import model_preset
from elmoe3d.sw.host.trace import (PHASES, TRACE_VERSION, RoutingTrace, TraceError,
                              trace_from_router_logits)


def small_trace(rows=None, **over):
    """Two requests x 3 tokens x layers (0, 1), E = 4, k = 2."""
    req, pos, lay, ids, w = [], [], [], [], []
    for r in range(2):
        for t in range(3):
            for layer in (0, 1):
                req.append(r)
                pos.append(t)
                lay.append(layer)
                a = (r + t + layer) % 4
                ids.append([a, (a + 1) % 4])
                w.append([0.75, 0.25])
    kw = dict(request=req, position=pos, layer=lay, phase=[1] * len(req), expert_ids=ids,
              gate_weights=w, num_experts=4, layer_ids=(0, 1))
    kw.update(over)
    return RoutingTrace(**kw)


def same(a: RoutingTrace, b: RoutingTrace):
    for name in ("request", "position", "layer", "phase", "expert_ids", "gate_weights"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert (a.scores is None) == (b.scores is None)
    if a.scores is not None:
        np.testing.assert_array_equal(a.scores, b.scores)
    assert a.meta() == b.meta()


def test_columns_and_dense_view():
    tr = small_trace()
    assert len(tr) == 12 and tr.top_k == 2 and tr.weights_renormalised
    assert tr.expert_ids.dtype == np.int16 and tr.gate_weights.dtype == np.float32
    assert tr.token_count() == 6 and tr.missing_records() == {}
    reqs = tr.requests()
    assert [r.request for r in reqs] == [0, 1] and reqs[1].ids.shape == (3, 2, 2)
    assert reqs[1].ids[2, 1].tolist() == [0, 1]           # (1 + 2 + 1) % 4 = 0
    with pytest.raises(ValueError):
        reqs[0].ids[0, 0, 0] = 3                          # read-only


def test_missing_record_is_an_out_of_range_sentinel_never_minus_one():
    tr = small_trace()
    tr = tr.select(~((tr.request == 0) & (tr.position == 1) & (tr.layer == 1)))
    assert tr.missing_records() == {1: 1}
    rr = tr.requests()[0]
    assert not rr.present[1, 1] and (rr.ids[1, 1] == 4).all()
    with pytest.raises(IndexError):                       # -1 would silently be the last one
        np.zeros(4)[rr.ids[1, 1]]


@pytest.mark.parametrize("over, column, words", [
    (dict(expert_ids=[[-1, 0]] + [[0, 1]] * 11), "expert_ids", "-1 is not an expert"),
    (dict(expert_ids=[[4, 0]] + [[0, 1]] * 11), "expert_ids", ">= num_experts"),
    (dict(expert_ids=[[1, 1]] + [[0, 1]] * 11), "expert_ids", "repeated"),
    (dict(gate_weights=[[0.5, -0.1]] + [[0.75, 0.25]] * 11), "gate_weights", "negative"),
    (dict(gate_weights=[[0.25, 0.75]] + [[0.75, 0.25]] * 11), "gate_weights", "best first"),
    (dict(gate_weights=[[np.nan, 0.1]] + [[0.75, 0.25]] * 11), "gate_weights", "NaN"),
    (dict(layer=[2] + [0] * 11), "layer", "not in layer_ids"),
    (dict(phase=[7] * 12), "phase", "phase code"),
    (dict(position=[0] * 12), "rows", "appears"),
    (dict(position=[-1] + [0] * 11), "position", "negative"),
    (dict(layer_ids=(1, 0)), "layer_ids", "sorted"),
    (dict(num_experts=0), "num_experts", "positive"),
    (dict(expert_ids=[[0.5, 1]] * 12), "expert_ids", "integers"),
    (dict(scores=np.ones((12, 3))), "scores", r"\[12, 4\]"),
    (dict(request=[0] * 11), "position", "rows"),
])
def test_validation_names_column_and_row(over, column, words):
    with pytest.raises(TraceError, match=f"{column}.*{words}"):
        small_trace(**over)


def test_draft_rows_may_repeat_a_position():
    tr = small_trace(phase=[PHASES.index("draft")] * 12, position=[0] * 12)
    assert len(tr) == 12
    with pytest.raises(TraceError, match="draft"):
        tr.requests("draft")
    with pytest.raises(TraceError, match="phase"):
        tr.requests("sample")


def test_round_trip_with_and_without_scores(tmp_path):
    tr = small_trace()
    same(tr, RoutingTrace.load(tr.save(tmp_path / "a")))
    assert (tmp_path / "a.npz").is_file()
    sc = np.random.default_rng(0).random((12, 4)).astype(np.float32)
    tr2 = small_trace(scores=sc, model="x", source="s", notes=("n1",))
    same(tr2, RoutingTrace.load(tr2.save(tmp_path / "b.npz")))


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_round_trip_random(tmp_path_factory, data):
    E = data.draw(st.integers(1, 12))
    k = data.draw(st.integers(1, E))
    n = data.draw(st.integers(0, 20))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    ids = np.array([rng.permutation(E)[:k] for _ in range(n)]).reshape(n, k)
    w = -np.sort(-rng.random((n, k)), axis=1)
    tr = RoutingTrace(request=np.arange(n), position=np.zeros(n, int),
                      layer=rng.integers(0, 3, n), phase=rng.integers(0, 4, n),
                      expert_ids=ids, gate_weights=w, num_experts=E, layer_ids=(0, 1, 2),
                      scores=rng.random((n, E)) if data.draw(st.booleans()) else None)
    path = tr.save(tmp_path_factory.mktemp("rt") / "t.npz")
    same(tr, RoutingTrace.load(path))


def _rewrite(path, edit):
    with np.load(path) as z:
        arrays = {n: z[n] for n in z.files}
    edit(arrays)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def _set_meta(key, value):
    def edit(a):
        m = json.loads(a["meta"].tobytes())
        if value is KeyError:
            del m[key]
        else:
            m[key] = value
        a["meta"] = np.frombuffer(json.dumps(m).encode(), np.uint8)
    return edit


@pytest.mark.parametrize("edit, words", [
    (_set_meta("version", TRACE_VERSION + 1), "version"),
    (_set_meta("format", "other"), "format"),
    (_set_meta("colour", "red"), "unknown.*colour"),
    (_set_meta("top_k", KeyError), "missing.*top_k"),
    (_set_meta("top_k", 3), "top_k 3"),
    (_set_meta("weights_renormalised", False), "weights_renormalised"),
    (lambda a: a.update(extra=np.zeros(3)), "unknown.*extra"),
    (lambda a: a.pop("phase"), "missing.*phase"),
    (lambda a: a.pop("meta"), "no 'meta'"),
    (lambda a: a.update(expert_ids=np.full((12, 2), -1, np.int16)), "expert_ids: row 0"),
])
def test_load_rejects_with_the_file_named(tmp_path, edit, words):
    path = small_trace().save(tmp_path / "t.npz")
    _rewrite(path, edit)
    with pytest.raises(TraceError, match=words) as e:
        RoutingTrace.load(path)
    assert str(path) in str(e.value)


def test_load_rejects_missing_truncated_and_lfs(tmp_path):
    with pytest.raises(TraceError, match="no such"):
        RoutingTrace.load(tmp_path / "none.npz")
    path = small_trace().save(tmp_path / "t.npz")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match="not a readable"):
        RoutingTrace.load(path)
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n")
    with pytest.raises(TraceError, match="LFS"):
        RoutingTrace.load(path)
    assert zipfile.is_zipfile(small_trace().save(tmp_path / "ok.npz"))


def _pickled(path):
    import pickle
    path.write_bytes(pickle.dumps({"expert_ids": [[0, 1]]}))


def _garbage(path):
    path.write_bytes(b"not a trace at all\n" * 8)


def _npy(path):
    with open(path, "wb") as f:                     # a .npy under a .npz name: no context manager
        np.save(f, np.arange(4))


def _npy_with_end_record(path):
    """A .npy whose data holds a zip's end record 50 KB before its end: zipfile.is_zipfile
    says yes, np.load reads it as .npy (review finding)."""
    data = np.random.default_rng(5).integers(0, 255, 100_000, dtype=np.uint8)
    data[-50_000:-49_996] = np.frombuffer(b"PK\x05\x06", np.uint8)
    with open(path, "wb") as f:
        np.save(f, data)
    assert zipfile.is_zipfile(path)


def _object_column(path):
    _rewrite(path, lambda a: a.update(notes=np.array([{"x": 1}], dtype=object)))


def _bad_crc(path):
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("expert_ids.npy")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw[start + info.compress_size // 2] ^= 0xFF        # inside the member's data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("spoil, why", [
    (_pickled, "not a zip archive"), (_garbage, "not a zip archive"), (_npy, "not a zip archive"),
    (_npy_with_end_record, "not a zip archive"),
    (_object_column, "array 'notes' holds pickled Python objects"), (_bad_crc, "corrupt")])
def test_an_unreadable_npz_is_one_clear_line(tmp_path, capsys, spoil, why):
    """A pickled, garbage, object-array or damaged .npz: one line naming the file, why, and
    the format expected; never numpy's hint to load it unsafely with allow_pickle."""
    path = small_trace().save(tmp_path / "t.npz")
    spoil(path)
    with pytest.raises(TraceError) as e:
        RoutingTrace.load(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: not a readable .npz trace: {why}")
    assert msg.endswith("expected an elmoe3d-routing-trace .npz (a zip of plain NumPy arrays "
                        "request, position, layer, phase, expert_ids, gate_weights, optional "
                        "scores, and meta; docs/traces.md)")
    assert "\n" not in msg and "allow_pickle" not in msg and "pickle.load" not in msg
    from elmoe3d.cli import main
    assert main(["run", "--trace", str(path), "--model", "mixtral-8x7b"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"elmoe3d run: error: {msg}"]


def test_trace_from_router_logits_routes_like_the_model():
    p = model_preset("glm-4.7-flash")                    # sigmoid, renormalised, scaled by 1.8
    rng = np.random.default_rng(3)
    logits = [rng.normal(0, 1, (5, 64)) for _ in range(p.moe_layers)]
    tr = trace_from_router_logits(logits, p, request=[0, 0, 0, 1, 1],
                                  position=[0, 1, 2, 0, 1])
    assert tr.layer_ids == tuple(range(1, 47)) and tr.has_scores and tr.model == p.name
    assert len(tr) == 5 * 46 and tr.weights_renormalised      # stored without the 1.8 scaling
    ids, w, s = p.route(logits[3])
    rows = tr.layer == 4
    np.testing.assert_array_equal(tr.expert_ids[rows], ids)
    np.testing.assert_allclose(tr.gate_weights[rows], (w / 1.8).astype(np.float32))
    np.testing.assert_allclose(tr.scores[rows], s.astype(np.float32))
    assert tr.phase[0] == PHASES.index("prefill")
    with pytest.raises(TraceError, match="45 layers given"):
        trace_from_router_logits(logits[:-1], p)
    with pytest.raises(TraceError, match=r"logits\[0\]"):
        trace_from_router_logits([np.zeros((5, 8))] * 46, p)
    # one request id is every token's (a new user's request=0 was refused as shape ())
    one = trace_from_router_logits(logits, p, request=7)
    assert set(one.request.tolist()) == {7} and one.token_count("prefill") == 5




def test_the_trace_keeps_its_own_copy_of_a_callers_arrays():
    """A trace built from views of the caller's writable arrays copies them: writing into the
    caller's array changes neither the trace nor its cached requests() (review finding)."""
    t = small_trace()
    ids = np.array(t.expert_ids)
    view = RoutingTrace(request=t.request, position=t.position, layer=t.layer, phase=t.phase,
                        expert_ids=ids[:], gate_weights=t.gate_weights,
                        num_experts=t.num_experts, layer_ids=t.layer_ids)
    before = view.requests()[0].ids.copy()
    ids[...] = (ids + 1) % t.num_experts
    assert (view.expert_ids == t.expert_ids).all()
    assert (view.requests()[0].ids == before).all()
    assert not view.expert_ids.flags.writeable


def test_a_repeated_row_is_counted_as_itself():
    """A review's finding (2026-12-07): the message named the first repeated row but the
    count of the most repeated one ((request 0, position 0, layer 0) twice, said 3 times)."""
    with pytest.raises(TraceError, match=r"rows: \(request 0, position 0, layer 0, phase "
                                         r"\w+\) appears 2 times$"):
        small_trace(position=[0, 0, 0, 0, 1, 1] + [0] * 6)

"""Audit fixes of elmoe3d.sw.host.tracegen: conflicting or garbled count tables and usage files
are refused naming the file (and line), a partial trace's absent layers are left out of the
figures instead of turning them into NaN, and every public entry point names a wrong argument
instead of failing inside NumPy."""

import json
import warnings

import numpy as np
import pytest

from elmoe3d.cli import main
from elmoe3d.errors import UserError
from elmoe3d.sw.host.trace import TraceError
from elmoe3d.sw.host.tracegen import (CALIBRATED, SyntheticRouting, calibrate_from_usage,
                                      count_skew, expert_count_table, expert_usage,
                                      fit_synthetic, routing_stats, synthetic_trace)

HEADER = "model,variant,domain,layer,expert,count\n"
MIX = "mixtral-8x7b"
SMALL_GRID = {"zipf": (0.1,), "correlation": (0.3,), "temperature": (1.0,)}


def _cli(capsys, *argv):
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- count table and usage files: conflicting, garbled ----------------------------------------

def test_count_table_duplicate_row_names_both_lines(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text(HEADER + "m,v,d,0,0,5\nm,v,d,0,1,3\nm,v,d,0,0,7\n")
    with pytest.raises(UserError) as e:
        expert_count_table(path)
    assert str(e.value) == (f"{path}:4: model 'm', variant 'v', domain 'd', layer 0, expert 0 "
                            f"again (first at line 2); expected one count per expert")
    # the same (model, variant, domain, layer) spelled '00': still the same layer
    path.write_text(HEADER + "m,v,d,0,0,5\nm,v,d,00,0,7\n")
    with pytest.raises(UserError, match=r"dup\.csv:3: .*layer 0, expert 0 again \(first at "
                                        r"line 2\)"):
        expert_count_table(path)
    # distinct rows are read as before
    path.write_text(HEADER + "m,v,d,0,1,3\nm,v,d,0,0,5\nm,v,d,1,0,7\nm,v,d,1,1,1\n")
    tab = expert_count_table(path)
    assert sorted(tab) == [("m", "v", "d", 0), ("m", "v", "d", 1)]
    np.testing.assert_array_equal(tab[("m", "v", "d", 0)], [5, 3])
    np.testing.assert_array_equal(tab[("m", "v", "d", 1)], [7, 1])


def test_count_table_line_numbers_count_quoted_newlines(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text(HEADER + 'm,"v\nw",d,0,0,5\nm,"v\nw",d,0,0,6\n')
    with pytest.raises(UserError, match=r"q\.csv:4: .*variant 'v\\nw'.*expert 0 again \(first "
                                        r"at line 2\)"):
        expert_count_table(path)


def test_count_table_not_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(HEADER.encode() + b"m,v,d,0,0,5\nm,v\xff,d,0,1,3\n")
    with pytest.raises(UserError) as e:
        expert_count_table(path)
    assert str(e.value) == f"{path}:3: not UTF-8 text (byte 0xff at offset 55: invalid start byte)"


@pytest.mark.parametrize("text, words", [
    ("", "empty file, expected the header model,variant,domain,layer,expert,count"),
    ("a,b\n", ":1: header ['a', 'b']")])
def test_count_table_empty_or_wrong_header(tmp_path, text, words):
    path = tmp_path / "h.csv"
    path.write_text(text)
    with pytest.raises(UserError, match=f"^{path}" + r".*" + words.replace("[", r"\[")):
        expert_count_table(path)


def test_count_table_with_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (HEADER + "m,v,d,0,0,5\nm,v,d,0,1,2\n").encode())
    np.testing.assert_array_equal(expert_count_table(path)[("m", "v", "d", 0)], [5, 2])


@pytest.mark.parametrize("reader", [expert_count_table, expert_usage])
def test_readers_name_a_path_that_is_no_path(reader):
    with pytest.raises(UserError, match="^path: expected a file name, got 5$"):
        reader(5)


def test_usage_json_duplicate_key_is_refused(tmp_path):
    path = tmp_path / "u.json"
    path.write_text('{"layers": {"0": [5, 1, 1, 1, 1, 1, 1, 1], '
                    '"0": [1, 1, 1, 1, 1, 1, 1, 1]}}')
    with pytest.raises(UserError) as e:
        expert_usage(path)
    assert str(e.value) == (f"{path}: key '0' given twice in one JSON object; expected one "
                            f"value per key")
    path.write_text('{"layers": [[1, 2]], "layers": [[2, 1]]}')
    with pytest.raises(UserError, match="key 'layers' given twice"):
        expert_usage(path)
    path.write_text('{"layers": {"0": [5, 1], "1": [1, 1]}}')
    assert {k: list(v) for k, v in expert_usage(path).items()} == {"0": [5, 1], "1": [1, 1]}


def test_usage_json_nested_too_deeply(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError) as e:
        expert_usage(path)
    assert str(e.value) == (f"{path}: JSON nested too deeply to read; expert-usage statistics "
                            f"are per-layer lists of counts")


@pytest.mark.parametrize("name, data, words", [
    ("dup.csv", (HEADER + "m,expert_counts,d,0,0,5\nm,expert_counts,d,0,0,7\n").encode(),
     "dup.csv:3: model 'm', variant 'expert_counts', domain 'd', layer 0, expert 0 again "
     "(first at line 2)"),
    ("bad.csv", HEADER.encode() + b"m,v,d,0,0,\xff\n", "bad.csv:2: not UTF-8 text (byte 0xff"),
    ("deep.json", ("[" * 100_000 + "]" * 100_000).encode(), "deep.json: JSON nested too deeply"),
    ("dup.json", b'{"layers": {"a": [1, 2, 3, 4, 5, 6, 7, 8], "a": [1, 1, 1, 1, 1, 1, 1, 1]}}',
     "dup.json: key 'a' given twice in one JSON object"),
    # a review's finding (2026-12-07): counts beyond a float64 or an int64 were a traceback
    ("huge.json", ("[[" + "1" * 401 + ", 1, 1, 1, 1, 1, 1, 1]]").encode(),
     "huge.json: expert usage: layer '0', expert 0: count of 401 digits, beyond a float64's "
     "range"),
    ("huge.csv", (HEADER + "m,expert_counts,d,0,0,100000000000000000000\n").encode(),
     "huge.csv:2: bad row ['m', 'expert_counts', 'd', '0', '0', '100000000000000000000'] "
     "(expert or count beyond a 64-bit integer)")])
def test_run_synthetic_trace_names_the_file(tmp_path, capsys, name, data, words):
    path = tmp_path / name
    path.write_bytes(data)
    code, _, err = _cli(capsys, "--trace", f"synthetic:{path}", "--model", MIX,
                        "--config", "paper-8gb", "--tokens", "8")
    assert code == 2 and err.count("\n") == 1 and words in err and "fitting" not in err


# -- routing_stats on a partial trace -----------------------------------------------------------

def test_routing_stats_skips_an_absent_layer():
    tr = synthetic_trace(MIX, CALIBRATED[MIX], requests=2, tokens=40, seed=1)
    full = routing_stats(tr)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        part = routing_stats(tr.select(tr.layer != 3))
        summary = part.summary()
        median = part.hot_ratio_median
    assert np.isnan(part.hot_ratio[3]) and np.isnan(part.hot_ratio_top1[3])
    assert np.isnan(part.never_chosen[3])
    keep = np.arange(len(tr.layer_ids)) != 3
    np.testing.assert_array_equal(part.hot_ratio[keep], full.hot_ratio[keep])
    np.testing.assert_array_equal(part.hot_ratio_top1[keep], full.hot_ratio_top1[keep])
    np.testing.assert_array_equal(part.never_chosen[keep], full.never_chosen[keep])
    assert median == summary["hot_ratio_median"] == float(np.median(full.hot_ratio[keep]))
    assert summary["hot_ratio_min"] == float(full.hot_ratio[keep].min())
    assert summary["hot_ratio_max"] == float(full.hot_ratio[keep].max())
    assert summary["hot_ratio_top1_median"] == float(np.median(full.hot_ratio_top1[keep]))
    assert summary["hot_ratio_top1_max"] == float(full.hot_ratio_top1[keep].max())
    assert all(np.isfinite(v) for v in summary.values())
    # a complete trace: no NaN anywhere
    assert np.isfinite(full.hot_ratio).all() and np.isfinite(full.never_chosen).all()


def test_routing_stats_names_a_trace_that_is_none():
    with pytest.raises(TraceError, match="^trace: expected a RoutingTrace, got dict$"):
        routing_stats({})


# -- synthetic_trace, SyntheticRouting ----------------------------------------------------------

@pytest.mark.parametrize("seed", ["x", -1, 1.5, True, None])
def test_synthetic_trace_bad_seed(seed):
    with pytest.raises(UserError) as e:
        synthetic_trace(MIX, CALIBRATED[MIX], tokens=3, seed=seed)
    assert str(e.value) == f"seed: expected an integer >= 0, got {seed!r}"


def test_synthetic_trace_numpy_seed_is_the_same_seed():
    a = synthetic_trace(MIX, CALIBRATED[MIX], tokens=5, seed=np.int64(3))
    b = synthetic_trace(MIX, CALIBRATED[MIX], tokens=5, seed=3)
    np.testing.assert_array_equal(a.expert_ids, b.expert_ids)


@pytest.mark.parametrize("phase", ["foo", 1, None])
def test_synthetic_trace_bad_phase(phase):
    with pytest.raises(TraceError) as e:
        synthetic_trace(MIX, CALIBRATED[MIX], tokens=3, phase=phase)
    assert str(e.value) == f"phase: expected one of prefill, decode, draft, verify, got {phase!r}"


def test_synthetic_trace_phase_is_stored():
    tr = synthetic_trace(MIX, CALIBRATED[MIX], tokens=3, phase="prefill")
    assert len(routing_stats(tr, "prefill").hot_ratio) == 32


@pytest.mark.parametrize("args, words", [
    (("a", 0.3, 1.0), "zipf: expected a number >= 0, got 'a'"),
    ((True, 0.3, 1.0), "zipf: expected a number >= 0, got True"),
    ((0.1, "a", 1.0), "correlation: expected a number in [0, 1), got 'a'"),
    ((0.1, np.False_, 1.0), "correlation: expected a number in [0, 1), got np.False_"),
    ((0.1, 0.3, None), "temperature: expected a number > 0, got None"),
    ((0.1, 0.3, 10 ** 400), "temperature: expected a number > 0, got 1000"),
    ((0.1, 0.3, float("nan")), "temperature: expected a number > 0, got nan")])
def test_synthetic_routing_bad_parameters(args, words):
    with pytest.raises(ValueError) as e:
        SyntheticRouting(*args)
    assert str(e.value).startswith(words)


def test_synthetic_routing_takes_numpy_numbers():
    p = SyntheticRouting(np.float32(0.5), np.float64(0.25), np.int64(2))
    assert p.zipf == 0.5 and p.correlation == 0.25 and p.temperature == 2


# -- fit_synthetic, calibrate_from_usage --------------------------------------------------------

@pytest.mark.parametrize("target, grid, words", [
    ({"overlap": 0.0}, SMALL_GRID,
     "target['overlap']: expected a number > 0 (the fit compares relative errors), got 0.0"),
    ({"overlap": "a"}, SMALL_GRID, "target['overlap']: expected a number > 0"),
    ({"overlap": True}, SMALL_GRID, "target['overlap']: expected a number > 0"),
    ({"overlap": float("inf")}, SMALL_GRID, "target['overlap']: expected a number > 0"),
    (["overlap"], SMALL_GRID, "target: expected a dict of figure -> value, got list"),
    ({}, SMALL_GRID, "target: no figure; expected some of hot_ratio_median, overlap"),
    ({"entropy": 1.0}, SMALL_GRID, "target: unknown figure(s) 'entropy'; expected some of"),
    ({"overlap": 0.5}, {"zipf": ()}, "grid['zipf']: expected a non-empty list of numbers, got ()"),
    ({"overlap": 0.5}, {"zipf": 0.1}, "grid['zipf']: expected a non-empty list of numbers, got "
                                      "0.1"),
    ({"overlap": 0.5}, {"zipf": "0.1"}, "grid['zipf']: expected a non-empty list of numbers"),
    ({"overlap": 0.5}, {"zipf": ["0.1"]}, "grid['zipf'][0]: expected a number >= 0, got '0.1'"),
    ({"overlap": 0.5}, {"correlation": [0.3, 1.0]},
     "grid['correlation'][1]: expected a number in [0, 1), got 1.0"),
    ({"overlap": 0.5}, {"temperature": [True]}, "grid['temperature'][0]: expected a number > 0"),
    ({"overlap": 0.5}, [("zipf", (0.1,))], "grid: expected a dict of parameter -> candidate "
                                           "values, got list"),
    ({"overlap": 0.5}, {"depth": (1,)}, "grid: unknown key(s) 'depth'; expected some of zipf, "
                                        "correlation, temperature")])
def test_fit_synthetic_bad_arguments(target, grid, words):
    with pytest.raises(UserError) as e:
        fit_synthetic(MIX, target, tokens=4, grid=grid)
    assert str(e.value).startswith(words)


def test_fit_synthetic_takes_a_numpy_grid():
    p, got = fit_synthetic(MIX, {"overlap": np.float64(0.5)}, tokens=8,
                           grid={"zipf": np.array([0.1, 0.5]), "correlation": range(1),
                                 "temperature": [1]})
    assert p in (SyntheticRouting(0.1, 0.0, 1.0), SyntheticRouting(0.5, 0.0, 1.0))
    assert type(p.zipf) is float and np.isfinite(got["overlap"])


USAGE = {"0": [5, 1, 1, 1, 1, 1, 1, 1]}


@pytest.mark.parametrize("usage, kw, words", [
    (USAGE, {"zipf": []}, "zipf: expected a non-empty list of numbers, got []"),
    (USAGE, {"zipf": 0.5}, "zipf: expected a non-empty list of numbers, got 0.5"),
    (USAGE, {"zipf": [0.1, -1]}, "zipf[1]: expected a number >= 0, got -1"),
    (USAGE, {"zipf": [True]}, "zipf[0]: expected a number >= 0, got True"),
    (USAGE, {"tokens": 1.5}, "tokens: expected a positive integer, got 1.5"),
    (USAGE, {"progress": 5}, "progress: expected a function of one line, got int"),
    (5, {}, "usage: expected an expert-usage JSON path, a parsed document (dict or list) or a "
            ".csv count table, got int")])
def test_calibrate_from_usage_bad_arguments(usage, kw, words):
    kw = {"zipf": [0.1], "tokens": 8, **kw}
    with pytest.raises(UserError) as e:
        calibrate_from_usage(MIX, usage, **kw)
    assert str(e.value) == words


def test_calibrate_from_count_table_with_a_layer_without_picks(tmp_path):
    path = tmp_path / "c.csv"
    rows = [f"m,expert_counts,d,{layer},{e},{0 if layer == 1 else e + 1}\n"
            for layer in (0, 1) for e in range(8)]
    path.write_text(HEADER + "".join(rows))
    with pytest.raises(UserError) as e:
        calibrate_from_usage(MIX, path, zipf=[0.1], tokens=8)
    assert str(e.value) == (f"{path}: m/expert_counts/d/1: counts: no pick (8 counts, all 0); "
                            f"the hot ratio is undefined")


# -- count_skew ---------------------------------------------------------------------------------

@pytest.mark.parametrize("counts, words", [
    ([], "counts: expected finite counts >= 0, got none"),
    ([0, 0], "counts: no pick (2 counts, all 0); the hot ratio is undefined"),
    ([-1, 1], "counts: expected finite counts >= 0, got 2 with a negative or non-finite one"),
    ([1, float("nan")], "counts: expected finite counts >= 0, got 2 with a negative or "
                        "non-finite one"),
    ([[1, 2], [3, 4]], "counts: expected a 1-D list of expert counts, got shape (2, 2)"),
    (["5", "1"], "counts: expected a 1-D list of expert counts, got str32 values"),
    ([True, False], "counts: expected a 1-D list of expert counts, got bool values"),
    (5, "counts: expected a 1-D list of expert counts, got shape ()")])
def test_count_skew_bad_counts(counts, words):
    with pytest.raises(UserError) as e:
        count_skew(counts)
    assert str(e.value) == words


def test_count_skew_values():
    assert count_skew([3, 1]) == 1.5
    assert count_skew(np.array([0, 4, 0, 0], np.int64)) == 4.0
    assert count_skew([2.5]) == 1.0


def test_usage_from_a_file_and_a_document_agree(tmp_path):
    path = tmp_path / "u.json"
    path.write_text(json.dumps({"layers": USAGE}))
    a = calibrate_from_usage(MIX, path, zipf=[0.1, 0.5], tokens=8)
    b = calibrate_from_usage(MIX, USAGE, zipf=(0.1, 0.5), tokens=8)
    assert a == b and a[1]["target"] == pytest.approx(5 / (12 / 8))

"""`elmoe3d quant`: the weight-error report on real and hand-made weight files."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import elmoe3d.cli as cli
import elmoe3d.cli.quant as quant_cmd
from elmoe3d.errors import UserError
from elmoe3d.sw.golden.metrics import error_metrics
from elmoe3d.sw.golden.quant import DraftMethod, draft_weights, quantize_weights

from ..conftest import hf_module

RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def only_quant_subcommand(monkeypatch):
    """In-process runs build a parser with the quant subcommand only, so that these tests do
    not depend on the other subcommands' modules; the subprocess tests below run the real,
    complete console entry point."""
    monkeypatch.setattr(cli, "COMMANDS", {"quant": cli.COMMANDS["quant"]})


def run_main(capsys, *argv):
    rc = cli.main(["quant", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# --- --bits --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, bits", [("4", [4]), ("2-7", [2, 3, 4, 5, 6, 7]),
                                        ("3,5", [3, 5]), (" 2-3,6 ", [2, 3, 6])])
def test_parse_bits(text, bits):
    assert quant_cmd.parse_bits(text) == bits


@pytest.mark.parametrize("text", ["8", "1-3", "7-2", "abc", "", "4.5", "-4"])
def test_parse_bits_rejects(text):
    with pytest.raises(UserError, match="--bits"):
        quant_cmd.parse_bits(text)


def test_parse_bits_checks_a_range_before_expanding_it():
    """An audit (2026-12-06): ``--bits 2-20000000`` built the range first (5.7 s, 1.4 GB);
    the bounds are now checked first, so the message names the bound (the range built first
    named 8, its first value out of 2..7)."""
    with pytest.raises(UserError, match=r"draft bit widths must be in 2\.\.7 \(got 100\)"):
        quant_cmd.parse_bits("2-100")
    with pytest.raises(UserError, match=r"draft bit widths must be in 2\.\.7 \(got 1\)"):
        quant_cmd.parse_bits("1-3")
    assert quant_cmd.parse_bits("3-5") == [3, 4, 5]


@pytest.mark.parametrize("text, twice", [("4,4", 4), ("2-7,4", 4), ("3,2-4", 3),
                                         ("2-4,4-6", 4)])
def test_parse_bits_refuses_a_width_given_twice(text, twice):
    """``--bits 4,4`` was taken as ``4`` while ``run --depth 4 4`` is refused (a new user's
    finding): a width given twice is named."""
    with pytest.raises(UserError, match=rf"^--bits {re.escape(repr(text))}: {twice} given "
                                        rf"twice \(each width is one column\)$"):
        quant_cmd.parse_bits(text)
    # a width out of range is named as such first (a review: 8,8 said "given twice")
    with pytest.raises(UserError, match=r"^--bits '8,8': draft bit widths must be in 2\.\.7 "
                                        r"\(got 8\); 8 bits is the INT8 baseline"):
        quant_cmd.parse_bits("8,8")


def test_parse_bits_says_what_a_range_is():
    with pytest.raises(UserError, match=r"^--bits '7-2': empty range 7-2 \(expected LO-HI with "
                                        r"LO <= HI, e.g. 2-7\)$"):
        quant_cmd.parse_bits("7-2")


# --- numbers ------------------------------------------------------------------------------

def test_chunked_analysis_equals_golden_draft_weights(monkeypatch):
    """Row chunking and the pooled sums give exactly the metrics of the golden model's
    draft_weights() over the whole tensor (3-D tensor: the last axis is K)."""
    w = (RNG.standard_normal((3, 5, 96)) * np.exp(RNG.standard_normal((3, 5, 1)))).astype(
        np.float32)
    w[1, 2, 32:64] = 0.0                                   # an all-zero group
    monkeypatch.setattr(quant_cmd, "CHUNK_ELEMENTS", 2 * 96)  # 2 rows per chunk, ragged end
    bits = [2, 4, 7]
    res = quant_cmd.analyse_tensor(w, name="w", bits=bits)
    qw = quantize_weights(w, name="w")
    ref = error_metrics(w, qw.dequantize())
    assert res.int8.metrics() == pytest.approx(ref, rel=1e-12)
    for k in bits:
        for m in DraftMethod:
            want = error_metrics(w, draft_weights(w, qw, k, m))
            assert res.drafts[(m.value, k)].metrics() == pytest.approx(want, rel=1e-12), (m, k)


def npz(tmp_path, name="w.npz", **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def test_skipped_tensors_are_listed_and_json_is_strict(tmp_path, capsys):
    path = npz(tmp_path, **{"fc.weight": RNG.standard_normal((8, 64)).astype(np.float32),
                            "fc.bias": np.ones(8, np.float32),
                            "ids": np.arange(64, dtype=np.int64).reshape(2, 32),
                            "zero.weight": np.zeros((2, 32), np.float16)})
    out_json = tmp_path / "r.json"
    rc, out, err = run_main(capsys, path, "--bits", "3-4", "--json", out_json, "--per-tensor")
    assert rc == 0, err
    assert "skipped 2 of 4 selected tensors (1-D: 1; non-float dtype I64: 1): fc.bias, ids" \
        in out
    assert "fc.weight" in out and "zero.weight" in out          # per-tensor table
    doc = json.loads(out_json.read_text())                       # strict JSON (no Infinity)
    assert doc["bits"] == [3, 4] and doc["methods"] == ["truncate", "round", "lsb-aug",
                                                        "dedicated"]
    assert [t["name"] for t in doc["tensors"]] == ["fc.weight", "zero.weight"]
    assert doc["tensors"][1]["shape"] == [2, 32] and doc["tensors"][1]["dtype"] == "F16"
    assert doc["tensors"][1]["int8"]["sqnr_db"] is None          # exact zero error: +inf
    assert doc["tensors"][1]["drafts"]["lsb-aug"]["3"]["max_abs"] == 0.0   # scale 0, not 1
    assert {s["name"]: s["reason"] for s in doc["skipped"]} == \
        {"fc.bias": "1-D", "ids": "non-float dtype I64"}
    assert doc["aggregate"]["elements"] == 8 * 64 + 2 * 32 and doc["aggregate"]["tensors"] == 2
    # Pooled, not averaged: the zero tensor adds elements but no signal and no error.
    fc = doc["tensors"][0]["drafts"]["truncate"]["4"]
    agg = doc["aggregate"]["drafts"]["truncate"]["4"]
    assert agg["sqnr_db"] == pytest.approx(fc["sqnr_db"], abs=1e-9)
    assert agg["mse"] == pytest.approx(fc["mse"] * 512 / 576)
    assert leftovers(tmp_path) == []


# --- a dedicated draft whose scale is beyond FP16: n/a, not an error -------------------------

FP16_MAX = 65504.0


@pytest.mark.parametrize("amax, na", [
    (FP16_MAX, False),                                         # 1 x 65504: the largest fit
    (float(np.nextafter(np.float32(FP16_MAX), np.float32(np.inf))), True),
])
def test_dedicated_2bit_na_from_the_fp16_maximum(amax, na):
    """At k = 2 (qmax = 1) the dedicated scale is max|W| itself: n/a exactly above 65504."""
    w = RNG.standard_normal((2, 64)).astype(np.float32)
    w[1, 40] = amax
    res = quant_cmd.analyse_tensor(w, name="w", bits=[2, 3])
    assert (("dedicated", 2) in res.na) is na
    assert (("dedicated", 2) in res.drafts) is not na
    assert ("dedicated", 3) in res.drafts and ("truncate", 2) in res.drafts
    if na:
        assert res.na[("dedicated", 2)] == [f"tensor 'w': row 1, group 1: max|W| = "
                                            f"{float(np.float32(amax)):.6g} needs an FP16 scale "
                                            f"above 65504 (FP16 overflow)"]


def test_dedicated_scale_beyond_fp16_is_na_and_the_rest_reported(tmp_path, capsys):
    """A legal tensor (INT8 scale 1e6/127 fits FP16) whose dedicated drafts need a scale beyond
    FP16 at k = 2..5 (1e6 / (2^(k-1) - 1) > 65504) and not at k = 6, 7: exit code 0, INT8
    and the other methods reported with the golden model's numbers, the dedicated cells of that
    tensor n/a with the reason, the aggregate of those cells n/a too."""
    a = RNG.standard_normal((4, 64)).astype(np.float32)
    b = RNG.standard_normal((3, 96)).astype(np.float32)
    b[2, 70] = -1e6                                     # row 2, group 2
    path = npz(tmp_path, **{"a.weight": a, "b.weight": b})
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    rc, out, err = run_main(capsys, path, "--json", out_json, "--plot", out_png, "--per-tensor")
    assert rc == 0, err
    assert err == ""
    reason = ("tensor 'b.weight': row 2, group 2: max|W| = 1e+06 needs an FP16 scale above "
              "65504 (FP16 overflow)")
    doc = json.loads(out_json.read_text())
    ta, tb = doc["tensors"]
    qb = quantize_weights(b, name="b.weight")
    assert tb["int8"] == pytest.approx(error_metrics(b, qb.dequantize()), rel=1e-12)
    for k in range(2, 8):
        for m in ("truncate", "round", "lsb-aug"):
            want = error_metrics(b, draft_weights(b, qb, k, m))
            assert tb["drafts"][m][str(k)] == pytest.approx(want, rel=1e-12), (m, k)
        assert set(ta["drafts"]["dedicated"][str(k)]) == {"mse", "sqnr_db", "cosine", "max_abs"}
    for k in (2, 3, 4, 5):
        assert tb["drafts"]["dedicated"][str(k)] == {"na": reason}, k
        assert doc["aggregate"]["drafts"]["dedicated"][str(k)] == {
            "na": f"dedicated {k}-bit draft n/a for 1 of 2 tensors: {reason}"}
    for k in (6, 7):
        want = error_metrics(b, draft_weights(b, qb, k, "dedicated"))
        assert tb["drafts"]["dedicated"][str(k)] == pytest.approx(want, rel=1e-12), k
        assert "na" not in doc["aggregate"]["drafts"]["dedicated"][str(k)]
    # the other methods' aggregates pool both tensors
    assert doc["aggregate"]["elements"] == a.size + b.size
    assert doc["aggregate"]["drafts"]["lsb-aug"]["2"]["mse"] == pytest.approx(
        (ta["drafts"]["lsb-aug"]["2"]["mse"] * a.size + tb["drafts"]["lsb-aug"]["2"]["mse"]
         * b.size) / (a.size + b.size), rel=1e-12)
    # printed: the n/a rows, one line per n/a cell naming the reason, n/a in the per-tensor table
    rows = [[c.strip() for c in re.split(r"[│|]", line) if c.strip()]
            for line in out.splitlines()]
    assert ["dedicated", "2", "n/a", "n/a", "n/a", "n/a"] in rows
    assert ["dedicated", "6", "n/a", "n/a", "n/a", "n/a"] not in rows
    notes = [line for line in out.splitlines() if "draft n/a for" in line]
    assert notes == [f"dedicated {k}-bit draft n/a for 1 of 2 tensors: {reason}"
                     for k in (2, 3, 4, 5)]
    (row_a,) = [r for r in rows if r[:1] == ["a.weight"]]          # per-tensor table, k = 2
    (row_b,) = [r for r in rows if r[:1] == ["b.weight"]]
    assert row_b[1] == "3x96" and row_b[3] == "2" and row_b[-1] == "n/a", row_b
    assert row_a[3] == "2" and row_a[-1] != "n/a", row_a
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert leftovers(tmp_path) == []


@pytest.mark.minilm
def test_a_local_minilm_folder_gets_a_note(minilm_file, tmp_path, capsys, monkeypatch):
    """``quant minilm`` reads the bundled weights even where the current folder has a
    ``minilm/`` of the user's own; a note says so and names ``./minilm`` (it was silent)."""
    from elmoe3d.cli.quant import _resolve_weights
    monkeypatch.chdir(tmp_path)
    assert _resolve_weights("minilm") == minilm_file and capsys.readouterr().err == ""
    (tmp_path / "minilm").mkdir()
    assert _resolve_weights("minilm") == minilm_file
    assert capsys.readouterr().err == (
        "elmoe3d quant: note: 'minilm' is the bundled all-MiniLM-L6-v2 weights, not the folder "
        "minilm here; write ./minilm for that\n")
    assert _resolve_weights("./minilm") == Path("minilm")
    # the package missing: its error names ./minilm too
    from elmoe3d.sw.host import minilm as minilm_mod
    monkeypatch.setattr(minilm_mod, "minilm_path", lambda: None)
    with pytest.raises(UserError, match=r"which is not installed .*; write \./minilm for the "
                                        r"minilm here$"):
        _resolve_weights("minilm")


@pytest.mark.minilm
def test_minilm_table_truncation_worse_than_lsb_aug(minilm_file, tmp_path, capsys):
    out_json, out_png = tmp_path / "minilm.json", tmp_path / "minilm.png"
    tensors = "encoder.layer.0.intermediate.dense.weight,encoder.layer.0.output.dense.weight"
    rc, out, err = run_main(capsys, "minilm", "--tensors", tensors, "--bits", "2-7",
                            "--json", out_json, "--plot", out_png)
    assert rc == 0, err
    # The printed table: rows "method │ bits │ MSE │ SQNR dB │ cosine │ max abs", each bit
    # width's best SQNR marked "*" (bold is lost in a captured log)
    rows, starred = {}, {}
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[│|]", line) if c.strip()]
        if len(cells) == 6 and cells[1].isdigit():
            key = (cells[0], int(cells[1]))
            if cells[3].endswith("*"):
                starred.setdefault(key[1], []).append(key[0])
            rows[key] = [float(c.rstrip("*")) for c in cells[2:]]
    assert set(rows) == {("int8", 8)} | {(m, k) for m in quant_cmd.METHODS for k in range(2, 8)}
    for k in range(2, 8):
        best = max(quant_cmd.METHODS, key=lambda m: rows[(m, k)][1])
        assert starred[k] == [best], (k, starred.get(k))
    assert 8 not in starred and "bold, *: best SQNR per bit width" in " ".join(out.split())
    mse_trunc, mse_aug = rows[("truncate", 4)][0], rows[("lsb-aug", 4)][0]
    assert mse_trunc > 2.5 * mse_aug, (mse_trunc, mse_aug)
    doc = json.loads(out_json.read_text())
    assert doc["file"] == str(minilm_file)
    assert [(t["name"], t["shape"]) for t in doc["tensors"]] == [
        ("encoder.layer.0.intermediate.dense.weight", [1536, 384]),
        ("encoder.layer.0.output.dense.weight", [384, 1536])]
    agg = doc["aggregate"]
    assert agg["elements"] == 2 * 1536 * 384
    d = agg["drafts"]
    assert d["truncate"]["4"]["mse"] == pytest.approx(mse_trunc, rel=1e-3)
    for k in map(str, range(2, 7)):
        assert d["lsb-aug"][k]["mse"] < 0.6 * d["truncate"][k]["mse"], k
    # At 7 bits the "half unit" 2^(d-1) is one whole INT8 step: the code error is {0, +1}
    # instead of truncation's {-1, 0}, so neither wins clearly.
    assert d["lsb-aug"]["7"]["mse"] == pytest.approx(d["truncate"]["7"]["mse"], rel=0.15)
    for k in map(str, range(2, 8)):
        assert agg["int8"]["sqnr_db"] > d["dedicated"][k]["sqnr_db"]
    for m in quant_cmd.METHODS:
        sq = [d[m][str(k)]["sqnr_db"] for k in range(2, 8)]
        assert sq == sorted(sq), (m, sq)
    assert 40 < agg["int8"]["sqnr_db"] < 50 and agg["int8"]["cosine"] > 0.9999
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out_png.stat().st_size > 10_000
    assert leftovers(tmp_path) == []


# --- errors: exit 2, one line naming the tensor, no traceback, no output files ----------------

def bad_files(tmp_path):
    good = RNG.standard_normal((4, 64)).astype(np.float32)
    nan = good.copy()
    nan[2, 40] = np.nan
    inf = good.copy()
    inf[3, 1] = -np.inf
    huge = good.copy()
    huge[1, 33] = 1e7                      # INT8 scale 1e7/127 > 65504
    big = good.copy()
    big[0, 5] = 1e5                        # INT8 fine; a dedicated 2-bit scale is not
    files = {}
    for name, arr in [("nan", nan), ("inf", inf), ("huge", huge)]:
        files[name] = tmp_path / f"{name}.safetensors"
        save_file({"a.weight": good, "b.weight": arr}, str(files[name]))  # bad one second
    files["big_then_nan"] = tmp_path / "big_then_nan.safetensors"   # n/a first, then an error
    save_file({"a.weight": big, "b.weight": nan}, str(files["big_then_nan"]))
    files["three_bad"] = tmp_path / "three_bad.safetensors"   # and a good one, a skipped one
    save_file({"a.weight": nan, "b.weight": good, "c.weight": inf, "d.weight": huge,
               "odd.weight": np.ones((4, 48), np.float32)}, str(files["three_bad"]))
    files["k48"] = npz(tmp_path, "k48.npz", **{"a.weight": good,
                                               "odd.weight": np.ones((4, 48), np.float32)})
    files["lfs"] = tmp_path / "lfs.safetensors"
    files["lfs"].write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\n"
                            "size 123\n")
    files["cut"] = tmp_path / "cut.safetensors"
    files["cut"].write_bytes(files["nan"].read_bytes()[:-100])
    files["bias"] = npz(tmp_path, "bias.npz", bias=np.ones(4, np.float32))
    files["empty"] = tmp_path / "empty.safetensors"
    save_file({}, str(files["empty"]))
    return files


ERROR_CASES = {
    "missing file": (lambda f, d: [d / "nope.safetensors"],
                     r"nope\.safetensors: no such file; expected a weight file \(\.safetensors, "
                     r"\.npz\) or minilm \(the bundled all-MiniLM-L6-v2\)"),
    # a second new-user trial typed the bundled weights' name with capitals
    "minilm capitalised": (lambda f, d: ["MiniLM"],
                           r"MiniLM: no such file \(the bundled all-MiniLM-L6-v2 weights are "
                           r"'minilm', lower case\)"),
    "missing tensor": (lambda f, d: [f["nan"], "--tensors", "c.weight"],
                       r"no tensor matches 'c\.weight' \(did you mean [ab]\.weight"),
    "only K not divisible": (lambda f, d: [f["k48"], "--tensors", "odd.*"],
                             r"none of the 1 selected tensors is a floating weight .*K not a "
                             r"multiple of the group size 32"),
    "nan": (lambda f, d: [f["nan"]],
            r"tensor 'b\.weight': non-finite weight nan at row 2, column 40 \(group 1\)"),
    "inf": (lambda f, d: [f["inf"]],
            r"tensor 'b\.weight': non-finite weight -inf at row 3, column 1 \(group 0\)"),
    "fp16 overflow": (lambda f, d: [f["huge"]],
                      r"tensor 'b\.weight': row 1, group 1: .*FP16 overflow"),
    "nan after a dedicated draft that is n/a": (
        lambda f, d: [f["big_then_nan"], "--bits", "2-4"],
        r"tensor 'b\.weight': non-finite weight nan at row 2, column 40 \(group 1\)"),
    # A new-user trial (2026-12-04): the run stopped at the first bad tensor and named it
    # alone; every bad tensor is now named in the one error (all checked), nothing written.
    "every bad tensor named": (
        lambda f, d: [f["three_bad"], "--bits", "4"],
        r"three_bad\.safetensors: 3 of the 4 tensors to quantize cannot be quantized "
        r"\(nothing written\): tensor 'a\.weight': non-finite weight nan at row 2, column 40 "
        r"\(group 1\); "
        r"tensor 'c\.weight': non-finite weight -inf at row 3, column 1 \(group 0\); "
        r"tensor 'd\.weight': row 1, group 1: .*FP16 overflow\)$"),
    "bad bits": (lambda f, d: [f["nan"], "--bits", "1-8"], r"--bits '1-8': .* 2\.\.7"),
    "lfs pointer": (lambda f, d: [f["lfs"]], r"lfs\.safetensors: is a Git LFS pointer"),
    "truncated": (lambda f, d: [f["cut"]], r"cut\.safetensors: tensor 'b\.weight': data ends "
                                           r"at byte \d+ but the file has only"),
    "nothing to quantize": (lambda f, d: [f["bias"]],
                            r"none of the 1 selected tensors is a floating weight .*1-D"),
    # a new-user trial (2026-12-06) got "none of the 0 selected tensors ... ()"
    "no tensors in the file": (lambda f, d: [f["empty"]], r"empty\.safetensors: holds no "
                                                          r"tensors$"),
    "no pattern in --tensors": (lambda f, d: [f["nan"], "--tensors", ","],
                                r"--tensors ',': no pattern; expected fnmatch globs"),
    "output folder missing": (lambda f, d: [f["k48"], "--json", d / "no" / "r.json"],
                              r"--json .*r\.json: directory .*no does not exist"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_error_cases_in_process(case, tmp_path, capsys):
    files = bad_files(tmp_path)
    make_args, pattern = ERROR_CASES[case]
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    argv = make_args(files, tmp_path)
    if "--json" not in argv:
        argv += ["--json", out_json, "--plot", out_png]
    rc, out, err = run_main(capsys, *argv)
    assert rc == 2, (out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("elmoe3d quant: error: ")
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err
    assert not out_json.exists() and not out_png.exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("case", ["missing file", "nan", "bad bits"])
def test_error_cases_subprocess(case, tmp_path):
    files = bad_files(tmp_path)
    make_args, pattern = ERROR_CASES[case]
    out_json = tmp_path / "r.json"
    argv = [str(a) for a in make_args(files, tmp_path)] + ["--json", str(out_json)]
    proc = subprocess.run([sys.executable, "-m", "elmoe3d", "quant", *argv], cwd=tmp_path,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(pattern, lines[0]), proc.stderr
    assert not out_json.exists() and leftovers(tmp_path) == []


def test_subprocess_success_exit_zero(tmp_path):
    path = npz(tmp_path, **{"w": RNG.standard_normal((4, 32)).astype(np.float32)})
    proc = subprocess.run([sys.executable, "-m", "elmoe3d", "quant", str(path), "--bits", "4"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "lsb-aug" in proc.stdout and "w.npz: 1 tensor, 128 weights" in proc.stdout


def test_bf16_file_gives_the_numbers_of_its_float32_values(tmp_path, capsys):
    import struct
    w32 = RNG.standard_normal((6, 64)).astype(np.float32)
    bits16 = (w32.view(np.uint32) >> 16).astype("<u2")               # exact bfloat16 values
    exact = (bits16.astype(np.uint32) << 16).view(np.float32)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [6, 64],
                               "data_offsets": [0, bits16.nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    bf = tmp_path / "bf.safetensors"
    bf.write_bytes(struct.pack("<Q", len(header)) + header + bits16.tobytes())
    f32 = tmp_path / "f32.safetensors"
    save_file({"w": exact}, str(f32))
    docs = []
    for path in (bf, f32):
        out_json = tmp_path / f"{path.stem}.json"
        rc, out, err = run_main(capsys, path, "--bits", "4", "--json", out_json)
        assert rc == 0, err
        docs.append(json.loads(out_json.read_text()))
    assert docs[0]["tensors"][0]["dtype"] == "BF16" and docs[1]["tensors"][0]["dtype"] == "F32"
    assert docs[0]["aggregate"] == docs[1]["aggregate"]


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_output_that_is_the_weight_file_is_refused(tmp_path, capsys, option):
    """``elmoe3d quant m2.npz --json m2.npz`` (or through a symbolic link) would overwrite the
    weights: one line naming both, exit status 2, the file untouched."""
    path = npz(tmp_path, name="m2.npz", **{"up.weight": np.ones((2, 32), np.float32)})
    before = path.read_bytes()
    link = tmp_path / "m2.svg"
    link.symlink_to(path.name)
    for dest in (path, link):
        if option == "--plot" and dest is path:
            continue                            # a .npz is no plot suffix: refused anyway
        rc, out, err = run_main(capsys, path, option, dest)
        assert rc == 2 and out == ""
        assert err.strip() == (f"elmoe3d quant: error: {option} and WEIGHTS name the same file "
                               f"{dest}: the output would overwrite the input")
        assert path.read_bytes() == before


@pytest.mark.parametrize("name, magic", [("sqnr", b"\x89PNG\r\n\x1a\n"),
                                         ("sqnr.PNG", b"\x89PNG\r\n\x1a\n"),
                                         ("sqnr.eps", b"%!PS-Adobe"),
                                         ("sqnr.jpg", b"\xff\xd8\xff")])
def test_plot_takes_the_format_matplotlib_writes_for_its_suffix(name, magic, tmp_path, capsys):
    """``--plot`` follows the one rule of ``elmoe3d synth`` (outputs.plot_format): any format
    matplotlib writes, PNG without a suffix (only .png, .pdf, .svg were taken before)."""
    path = npz(tmp_path, **{"w": RNG.standard_normal((4, 32)).astype(np.float32)})
    out = tmp_path / name
    rc, _, err = run_main(capsys, path, "--bits", "4", "--plot", out)
    assert rc == 0, err
    assert out.read_bytes().startswith(magic)
    assert leftovers(tmp_path) == []


def test_plot_suffix_matplotlib_does_not_write_is_refused(tmp_path, capsys):
    path = npz(tmp_path, **{"w": RNG.standard_normal((4, 32)).astype(np.float32)})
    out = tmp_path / "sqnr.xyz"
    rc, stdout, err = run_main(capsys, path, "--plot", out)
    assert rc == 2 and stdout == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"elmoe3d quant: error: --plot {out}: unsupported suffix '.xyz' "
                          f"(matplotlib writes ")
    assert ".png" in err and ".pdf" in err and ".svg" in err and ".eps" in err
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_tensor_whose_k_is_no_multiple_of_32_is_skipped_and_reported(tmp_path, capsys):
    """One 2-D tensor whose K is not a multiple of the group size 32 does not abort the report:
    it is skipped and named with the reason, like a 1-D tensor (report and JSON)."""
    files = bad_files(tmp_path)
    out_json = tmp_path / "r.json"
    rc, out, err = run_main(capsys, files["k48"], "--bits", "4", "--json", out_json)
    assert rc == 0, err
    assert ("skipped 1 of 2 selected tensors (K not a multiple of the group size 32: 1): "
            "odd.weight") in " ".join(out.split())
    doc = json.loads(out_json.read_text())
    assert [t["name"] for t in doc["tensors"]] == ["a.weight"]
    assert doc["skipped"] == [{"name": "odd.weight", "file": str(files["k48"]), "dtype": "F32",
                               "shape": [4, 48],
                               "reason": "K not a multiple of the group size 32"}]


def test_help_says_how_bad_and_skipped_tensors_are_handled(capsys):
    with pytest.raises(SystemExit):
        cli.main(["quant", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "are skipped and listed" in flat
    assert "is an error naming every such tensor (all are checked), and nothing is written" in flat


def test_groups_that_quantize_to_all_zeros_are_reported(tmp_path, capsys):
    """New-user trial: a tensor of weights near 1e-9 gave "SQNR 0.00, cosine 0.000000" and no
    word why. A G32 group whose weights are nonzero but all under half the smallest FP16 scale
    (2.98e-8) quantizes to all-zero codes: counted per tensor (``zero_groups`` in the JSON) and
    named in a note; not an error (the format cannot hold them; a real model may carry such
    groups), and groups of exact zeros are not counted."""
    rng = np.random.default_rng(7)
    a = rng.normal(size=(4, 64)).astype(np.float32)
    a[1, :32] *= 1e-9                      # one tiny group of row 1
    a[3] *= 1e-9                           # both groups of row 3
    a[2, 32:] = 0.0                        # exact zeros: nothing lost
    b = rng.normal(size=(8, 32)).astype(np.float32)
    path, out = tmp_path / "w.npz", tmp_path / "q.json"
    np.savez(path, a=a, b=b)
    assert cli.main(["quant", str(path), "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("note: 3 group(s) of 32 weights in 1 tensor(s) hold nonzero weights that all "
            "quantize to 0 (max|W| at most 2.98e-08, half the smallest FP16 group scale): a (3)"
            ) in text
    doc = json.loads(out.read_text())
    assert {t["name"]: t["zero_groups"] for t in doc["tensors"]} == {"a": 3, "b": 0}
    assert doc["aggregate"]["zero_groups"] == 3
    # just above the limit a group keeps a code: not counted
    a[3] = 0.0
    a[3, 0] = 3.0e-8
    np.savez(path, a=a, b=b)
    assert cli.main(["quant", str(path), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["aggregate"]["zero_groups"] == 1


# --- sharded checkpoints (a new user's finding, 2026-12-07) ---------------------------------

def _sharded(folder):
    """A two-shard checkpoint as Hugging Face writes it (and the same tensors in one file):
    shard 1 holds an FFN weight and a norm, shard 2 another FFN weight."""
    rng = np.random.default_rng(11)
    one = {"model.layers.0.mlp.up_proj.weight": rng.normal(size=(64, 128)).astype(np.float32),
           "model.layers.0.norm.weight": np.ones(128, np.float32)}
    two = {"model.layers.1.mlp.up_proj.weight": rng.normal(size=(32, 96)).astype(np.float32)}
    hf = folder / "hf"
    hf.mkdir()
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    for tensors, name in zip((one, two), names):
        save_file(tensors, str(hf / name))
    index = {"metadata": {"total_size": 0},
             "weight_map": {**{k: names[0] for k in one}, **{k: names[1] for k in two}}}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    save_file({**one, **two}, str(folder / "whole.safetensors"))
    return hf, names, index


def test_a_sharded_checkpoint_is_one_model(tmp_path, capsys):
    """Its folder, its index and its shards given one by one each give the single file's
    pooled figures (every number of the JSON's aggregate), with each tensor's file named."""
    hf, names, _ = _sharded(tmp_path)
    rc, _, err = run_main(capsys, tmp_path / "whole.safetensors", "--bits", "3-4", "--json",
                          tmp_path / "whole.json")
    assert rc == 0, err
    whole = json.loads((tmp_path / "whole.json").read_text())
    for i, args in enumerate(([hf], [hf / "model.safetensors.index.json"],
                              [hf / n for n in names])):
        out = tmp_path / f"s{i}.json"
        rc, text, err = run_main(capsys, *args, "--bits", "3-4", "--json", out)
        assert rc == 0, err
        doc = json.loads(out.read_text())
        assert doc["aggregate"] == whole["aggregate"]
        assert doc["files"] == [str(hf / n) for n in names]
        assert [(t["name"], t["file"]) for t in doc["tensors"]] == [
            ("model.layers.0.mlp.up_proj.weight", str(hf / names[0])),
            ("model.layers.1.mlp.up_proj.weight", str(hf / names[1]))]
        assert [(t["name"], t["file"], t["reason"]) for t in doc["skipped"]] == [
            ("model.layers.0.norm.weight", str(hf / names[0]), "1-D")]
        assert "2 tensors, 11,264 weights" in text
    # --tensors selects over every shard; a glob matching none of them is the usual error
    rc, text, err = run_main(capsys, hf, "--tensors", "*layers.1.*", "--bits", "4")
    assert rc == 0 and "1 tensor, 3,072 weights" in text
    rc, _, err = run_main(capsys, hf, "--tensors", "*layers.7.*")
    assert rc == 2 and f"{hf}: no tensor matches '*layers.7.*'" in err


def test_a_folders_npz_beside_safetensors_is_named_not_read(tmp_path, capsys):
    """A folder's ``.safetensors`` files are its checkpoint; its ``.npz`` files beside them were
    passed over silently (a new user's). They are named in a note and in the JSON's
    ``not_read``; a folder of ``.npz`` alone has nothing to note."""
    mix = tmp_path / "mix"
    mix.mkdir()
    save_file({"a.weight": np.ones((4, 32), np.float32)}, str(mix / "a.safetensors"))
    np.savez(mix / "b.npz", **{"b.weight": np.ones((4, 32), np.float32)})
    np.savez(mix / "c.npz", **{"c.weight": np.ones((4, 32), np.float32)})
    out = tmp_path / "r.json"
    rc, text, err = run_main(capsys, mix, "--bits", "4", "--json", out)
    assert rc == 0, err
    assert (f"note: not read: {mix / 'b.npz'}, {mix / 'c.npz'} (a folder's .safetensors files "
            f"are read when it has any") in " ".join(text.split())
    doc = json.loads(out.read_text())
    assert doc["not_read"] == [str(mix / "b.npz"), str(mix / "c.npz")]
    assert [t["name"] for t in doc["tensors"]] == ["a.weight"]
    # named on the command line as well, b.npz is read, and not listed as not read
    rc, text, err = run_main(capsys, mix, mix / "b.npz", "--bits", "4", "--json", out)
    assert rc == 0, err
    doc = json.loads(out.read_text())
    assert doc["not_read"] == [str(mix / "c.npz")]
    assert [t["name"] for t in doc["tensors"]] == ["a.weight", "b.weight"]
    (mix / "a.safetensors").unlink()
    rc, text, err = run_main(capsys, mix, "--bits", "4", "--json", out)
    assert rc == 0 and "not read" not in text, err
    assert json.loads(out.read_text())["not_read"] == []


@pytest.mark.parametrize("case, words", [
    ("empty folder", r"empty: no weight file in this folder \(expected \.safetensors or \.npz "
                     r"files, or a sharded checkpoint's \*\.safetensors\.index\.json\)"),
    ("shard missing", r"model\.safetensors\.index\.json: names 1 shard\(s\) not beside it: "
                      r"model-00002-of-00002\.safetensors"),
    ("wrong shard", r"model\.safetensors\.index\.json: maps tensor "
                    r"'model\.layers\.0\.mlp\.up_proj\.weight' to "
                    r"model-00002-of-00002\.safetensors, but it is in "
                    r"model-00001-of-00002\.safetensors"),
    ("no such tensor", r"model\.safetensors\.index\.json: maps tensor 'lm_head\.weight' to "
                       r"model-00002-of-00002\.safetensors, which does not hold it"),
    ("no weight_map", r"model\.safetensors\.index\.json: expected a checkpoint index, an object "
                      r"with \"weight_map\""),
    ("not json", r"model\.safetensors\.index\.json: not a checkpoint index \(not JSON"),
    ("two indexes", r"hf: holds 2 checkpoint indexes"),
    # a review's trials (2026-12-07): a shard outside the folder, an index that lists some of
    # a shard's tensors, the index as an output
    ("shard outside", r"model\.safetensors\.index\.json: maps tensor "
                      r"'model\.layers\.1\.mlp\.up_proj\.weight' to \.\./whole\.safetensors, "
                      r"outside the index's folder"),
    ("absolute shard", r"model\.safetensors\.index\.json: maps tensor "
                       r"'model\.layers\.1\.mlp\.up_proj\.weight' to /\S*whole\.safetensors, "
                       r"outside the index's folder"),
    ("unlisted tensor", r"model\.safetensors\.index\.json: does not list tensor "
                        r"'model\.layers\.0\.norm\.weight', which its shard "
                        r"model-00001-of-00002\.safetensors holds"),
    ("index as output", r"--json and WEIGHTS"),
    ("given twice", r"model-00001-of-00002\.safetensors: given twice"),
    ("tensor in two files", r"tensor 'model\.layers\.0\.mlp\.up_proj\.weight' is in both "),
    ("bad tensor in a shard", r"^elmoe3d quant: error: \S*model-00002-of-00002\.safetensors: "
                              r"tensor 'model\.layers\.1\.mlp\.up_proj\.weight': non-finite "
                              r"weight nan"),
])
def test_a_sharded_checkpoints_mistakes_are_one_line_naming_the_file(case, words, tmp_path,
                                                                       capsys):
    hf, names, index = _sharded(tmp_path)
    idx = hf / "model.safetensors.index.json"
    args = [hf]
    if case == "empty folder":
        (tmp_path / "empty").mkdir()
        args = [tmp_path / "empty"]
    elif case == "shard missing":
        (hf / names[1]).unlink()
    elif case == "wrong shard":
        index["weight_map"]["model.layers.0.mlp.up_proj.weight"] = names[1]
        idx.write_text(json.dumps(index))
    elif case == "no such tensor":
        index["weight_map"]["lm_head.weight"] = names[1]
        idx.write_text(json.dumps(index))
    elif case == "no weight_map":
        idx.write_text(json.dumps({"metadata": {}}))
    elif case == "not json":
        idx.write_text("{weight_map")
    elif case == "two indexes":
        (hf / "other.safetensors.index.json").write_text(json.dumps(index))
    elif case == "shard outside":
        index["weight_map"]["model.layers.1.mlp.up_proj.weight"] = "../whole.safetensors"
        idx.write_text(json.dumps(index))
    elif case == "absolute shard":
        index["weight_map"]["model.layers.1.mlp.up_proj.weight"] = str(
            tmp_path / "whole.safetensors")
        idx.write_text(json.dumps(index))
    elif case == "unlisted tensor":
        del index["weight_map"]["model.layers.0.norm.weight"]
        idx.write_text(json.dumps(index))
    elif case == "given twice":
        args = [hf, hf / names[0]]
    elif case == "tensor in two files":
        args = [tmp_path / "whole.safetensors", hf / names[0]]
    elif case == "bad tensor in a shard":
        bad = np.full((32, 96), np.nan, np.float32)
        save_file({"model.layers.1.mlp.up_proj.weight": bad}, str(hf / names[1]))
    out = tmp_path / "r.json"
    if case == "index as output":
        out = idx
    before = idx.read_bytes()
    rc, _, err = run_main(capsys, *args, "--json", out)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(words, err.strip()), err
    assert idx.read_bytes() == before
    assert (case == "index as output" or not out.exists()) and leftovers(tmp_path) == []


def test_an_index_may_spell_a_shard_two_ways(tmp_path, capsys):
    """``./x`` and ``x`` are one shard (a review found "given twice (as hf and hf)"); the
    report equals the plain index's, and --json's ``file`` is null for several arguments."""
    hf, names, index = _sharded(tmp_path)
    plain = tmp_path / "plain.json"
    assert run_main(capsys, hf, "--bits", "4", "--json", plain)[0] == 0
    index["weight_map"]["model.layers.0.norm.weight"] = "./" + names[0]
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    out = tmp_path / "r.json"
    rc, _, err = run_main(capsys, hf, "--bits", "4", "--json", out)
    assert rc == 0, err
    assert json.loads(out.read_text())["aggregate"] == json.loads(plain.read_text())["aggregate"]
    rc, _, err = run_main(capsys, *(hf / n for n in names), "--bits", "4", "--json", out)
    doc = json.loads(out.read_text())
    assert rc == 0 and doc["file"] is None and doc["files"] == [str(hf / n) for n in names]


def test_a_checkpoint_transformers_shards_is_read_whole(tmp_path, capsys):
    """The real format: a tiny Mixtral written by transformers' ``save_pretrained`` in nine
    shards with its ``model.safetensors.index.json``; its folder gives the same pooled figures
    as one file holding the same tensors, and every expert tensor of every shard."""
    transformers = hf_module("transformers")
    torch = hf_module("torch")
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     num_local_experts=4, num_experts_per_tok=2,
                                     vocab_size=256)
    model = transformers.MixtralForCausalLM(cfg)
    model.save_pretrained(tmp_path / "tiny", max_shard_size="100KB")
    shards = sorted((tmp_path / "tiny").glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "tiny" / "model.safetensors.index.json").is_file()
    from elmoe3d.sw.host.weights import open_checkpoint
    ckpt = open_checkpoint(tmp_path / "tiny")
    whole = {n: ckpt.load(n) for n in ckpt.infos}
    save_file(whole, str(tmp_path / "one.safetensors"))
    docs = []
    for weights in (tmp_path / "tiny", tmp_path / "one.safetensors"):
        out = tmp_path / f"{len(docs)}.json"
        rc, _, err = run_main(capsys, weights, "--tensors", "*experts*", "--bits", "4",
                              "--json", out)
        assert rc == 0, err
        docs.append(json.loads(out.read_text()))
    # equal but for the order the tensors' error sums are pooled in (file order here, the
    # name order safetensors writes there): the last bit of a float sum
    a, b = docs[0]["aggregate"], docs[1]["aggregate"]
    assert a["tensors"] == b["tensors"] > 0 and a["elements"] == b["elements"]
    for key in ("int8",):
        assert a[key] == pytest.approx(b[key], rel=1e-12)
    for method, cells in a["drafts"].items():
        assert cells["4"] == pytest.approx(b["drafts"][method]["4"], rel=1e-12)
    assert len(docs[0]["files"]) == len(shards)
    assert {t["name"] for t in docs[0]["tensors"]} == {t["name"] for t in docs[1]["tensors"]}

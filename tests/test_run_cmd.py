"""``elmoe3d run``: perf and golden runs on the real Mixtral trace with JSON, CSV and plots;
bad input is one line and exit status 2, and a failed run leaves no output file."""

import csv
import json

import pytest

from elmoe3d.cli import main
from elmoe3d.sw.corpus import traces_dir

BASE = ["run", "--trace", "gsm8k", "--model", "mixtral-8x7b"]


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_perf_run_writes_json_csv_plots(tmp_path, capsys):
    j, c, d = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "plots"
    code, out, err = _run(capsys, *BASE, "--config", "paper-8gb", "--backend", "perf",
                          "--tokens", "12", "--layers", "0:8", "--depth", "2", "4",
                          "--json", str(j), "--csv", str(c), "--plot", str(d))
    assert code == 0, err
    doc = json.loads(j.read_text())
    assert doc["config"] == "paper-8gb" and doc["shapes"] == {
        "hidden": 4096, "intermediate": 14336, "synthetic": False}
    assert [r["depth"] for r in doc["runs"]] == [2, 4]
    for r in doc["runs"]:
        s = r["summary"]
        assert s["produced"] == 12 and s["cycles"] > 0 and s["ext_bytes"] > 0
        assert s["energy_pj"] == pytest.approx(
            (s["hb_read_bytes"] + s["hb_write_bytes"]) * 8 * 0.43 + s["ext_bytes"] * 8 * 3.88)
        assert r["tokens_simulated_per_s"] > 0
        assert {st["kind"] for st in r["steps"]} == {"ar", "draft", "verify"}
    rows = list(csv.DictReader(c.open()))
    assert len(rows) == sum(len(r["steps"]) for r in doc["runs"])
    assert {"hit_rate", "cycles", "ext_bytes"} <= set(rows[0])
    assert sorted(p.name for p in d.iterdir()) == ["bytes_per_tier.png", "hit_rate.png",
                                                  "latency.png"]
    assert "tokens simulated per second" in out and "depth 4" in out


def test_golden_run_bit_exact(capsys):
    code, out, err = _run(capsys, *BASE, "--config", "small", "--backend", "golden",
                          "--tokens", "5", "--layers", "7:9", "--schedule", "replay")
    assert code == 0, err
    assert "0 mismatches" in out and "synthetic" in out


def test_npz_trace_and_model_from_it(tmp_path, capsys):
    from elmoe3d.sw.trace import import_vllm_jsonl
    tr, _ = import_vllm_jsonl(traces_dir() / "gsm8k_2_routing.jsonl", model="mixtral-8x7b")
    path = tr.save(tmp_path / "t.npz")
    code, out, err = _run(capsys, "run", "--trace", str(path), "--config", "paper-4gb",
                          "--tokens", "6", "--layers", "0", "--schedule", "replay")
    assert code == 0, err
    assert "mixtral-8x7b" in out


@pytest.mark.parametrize("argv, what", [
    (["--model", "mixtral-9x9b"], "unknown model preset"),
    (["--layers", "40:41"], "--layers"),
    (["--layers", "a:b"], "--layers"),
    (["--config", "paper-16gb"], "--config"),
    (["--backend", "gpu"], "--backend"),
    (["--backend", "golden", "--config", "paper-4gb"], "small configuration only"),
    (["--tokens", "0"], "--tokens"),
    (["--depth", "0"], "--depth"),
    (["--acceptance", "always"], "--acceptance"),
    (["--model", "olmoe-1b-7b"], "--model"),
])
def test_bad_input_one_line_exit_2_no_outputs(tmp_path, capsys, argv, what):
    j, c, d = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "plots"
    # a repeated option: the last one counts (argparse)
    args = BASE + ["--tokens", "3"] + argv + ["--json", str(j), "--csv", str(c), "--plot",
                                              str(d)]
    code, out, err = _run(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and what in lines[0] and lines[0].startswith("elmoe3d run: error:")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_missing_trace_and_bad_outputs(tmp_path, capsys):
    code, _, err = _run(capsys, "run", "--trace", str(tmp_path / "none.jsonl"), "--model",
                        "mixtral-8x7b")
    assert code == 2 and "--trace" in err and len(err.strip().splitlines()) == 1
    code, _, err = _run(capsys, *BASE, "--json", str(tmp_path / "no" / "r.json"))
    assert code == 2 and "--json" in err
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = _run(capsys, *BASE, "--plot", str(f))
    assert code == 2 and "--plot" in err
    code, _, err = _run(capsys, *BASE, "--json", str(tmp_path / "a"), "--csv",
                        str(tmp_path / "a"))
    assert code == 2 and "same file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]

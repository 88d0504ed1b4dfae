"""``elmoe3d run``: perf and golden runs on the real Mixtral trace with JSON, CSV and plots;
bad input is one line and exit status 2, and a failed run leaves no output file."""

import csv
import json
from pathlib import Path

import pytest

from elmoe3d.cli import main
from elmoe3d.config import preset
from elmoe3d.sw.host.corpus import routing_path
from elmoe3d.sw.host.models import model_preset

BASE = ["run", "--trace", "gsm8k", "--model", "mixtral-8x7b"]


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_perf_run_writes_json_csv_plots(tmp_path, capsys):
    j, c, d = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "out" / "plots"
    code, out, err = _run(capsys, *BASE, "--config", "paper-8gb", "--backend", "perf",
                          "--tokens", "12", "--layers", "0:8", "--depth", "2", "4",
                          "--json", str(j), "--csv", str(c), "--plot", str(d))
    assert code == 0, err
    doc = json.loads(j.read_text())
    mix, arch = model_preset("mixtral-8x7b"), preset("paper-8gb")
    assert doc["config"] == "paper-8gb" and doc["shapes"] == {
        "hidden": mix.hidden, "intermediate": mix.expert_intermediate, "synthetic": False}
    assert [r["depth"] for r in doc["runs"]] == [2, 4]
    for r in doc["runs"]:
        s = r["summary"]
        assert s["produced"] == 12 and s["cycles"] > 0 and s["ext_bytes"] > 0
        assert s["energy_pj"] == pytest.approx(
            (s["hb_read_bytes"] + s["hb_write_bytes"]) * 8 * arch.hb_pj_per_bit
            + s["ext_bytes"] * 8 * arch.ext_pj_per_bit)
        assert r["tokens_simulated_per_s"] > 0
        assert {st["kind"] for st in r["steps"]} == {"ar", "draft", "verify"}
    rows = list(csv.DictReader(c.open()))
    assert len(rows) == sum(len(r["steps"]) for r in doc["runs"])
    assert {"hit_rate", "cycles", "ext_bytes"} <= set(rows[0])
    assert sorted(p.name for p in d.iterdir()) == ["bytes_per_tier.png", "hit_rate.png",
                                                  "latency.png"]
    assert "tokens simulated per second" in out and "depth 4" in out


def test_prefill_rows_not_run_get_a_note(tmp_path, capsys):
    """A log's prefill rows are imported and counted but not run (the design decodes): the run
    says so, in its output and its JSON (a new user's 480 prefill rows left out unsaid)."""
    lines = []
    for req in range(2):
        lines += [{"request_id": req, "layer": lay, "token_pos": t, "phase": "prefill",
                   "expert_ids": [t % 8, (t + 1) % 8], "gate_weights": [0.6, 0.4]}
                  for lay in range(32) for t in range(6)]
        lines += [{"request_id": req, "layer": lay, "token_pos": t, "phase": "decode",
                   "expert_ids": [(t + lay) % 8, (t + lay + 3) % 8], "gate_weights": [0.7, 0.3]}
                  for t in range(6, 10) for lay in range(32)]
    log = tmp_path / "pf.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "r.json"
    assert main(["run", "--trace", str(log), "--model", "mixtral-8x7b", "--config",
                 "paper-8gb", "--json", str(out)]) == 0
    said = "384 prefill row(s) of the trace not run: the run decodes its decode tokens"
    assert said in " ".join(capsys.readouterr().out.split())
    doc = json.loads(out.read_text())
    assert said in doc["note"] and doc["tokens"] == 8


def test_golden_run_bit_exact(capsys):
    code, out, err = _run(capsys, *BASE, "--config", "small", "--backend", "golden",
                          "--tokens", "5", "--layers", "7:9", "--schedule", "replay")
    assert code == 0, err
    assert "0 mismatches" in out and "synthetic" in out


def test_a_local_file_named_like_a_named_trace_gets_a_note(tmp_path, capsys, monkeypatch):
    """``--trace gsm8k`` reads the named real trace even where the current folder has a file
    ``gsm8k``; a note says so and how to name the local file (it was passed over silently)."""
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--trace", "gsm8k", "--config", "paper-8gb", "--tokens", "2", "--layers",
            "0:2"]
    code, _, err = _run(capsys, *argv)
    assert code == 0 and "note:" not in err, err
    (tmp_path / "gsm8k").write_text("{}\n")
    code, _, err = _run(capsys, *argv)
    assert code == 0, err
    assert err.strip() == (f"elmoe3d run: note: 'gsm8k' is the named real trace "
                           f"{routing_path('gsm8k')}, not the file gsm8k here; write ./gsm8k "
                           f"for that")


def test_named_trace_takes_its_model(tmp_path, capsys):
    """``--trace gsm8k`` without ``--model`` runs as Mixtral-8x7B, the model that routed it:
    the same records as with ``--model mixtral-8x7b`` given; the trace file itself, read by
    path, still asks for the model (it has no meta line)."""
    docs = []
    for model in ([], ["--model", "mixtral-8x7b"]):
        j = tmp_path / f"r{len(docs)}.json"
        code, out, err = _run(capsys, "run", "--trace", "gsm8k", *model, "--config",
                              "paper-8gb", "--tokens", "6", "--layers", "0:4", "--json", str(j))
        assert code == 0, err
        docs.append(json.loads(j.read_text()))
    assert docs[0]["model"] == "mixtral-8x7b"
    for a, b in zip(docs[0]["runs"], docs[1]["runs"], strict=True):     # all but the speed
        assert (a["steps"], a["summary"]) == (b["steps"], b["summary"])
    code, _, err = _run(capsys, "run", "--trace", str(routing_path("gsm8k")),
                        "--config", "paper-8gb", "--tokens", "6")
    assert code == 2 and err.strip().endswith(
        "--model: required with gsm8k_2_routing.jsonl (it has no meta line naming the model); "
        "its 8 experts, top-2, are mixtral-8x7b's")
    # a log of no preset's sizes is not pointed at one (a new user's 64 experts, top-8, were
    # told "e.g. --model mixtral-8x7b")
    odd = tmp_path / "odd.jsonl"
    odd.write_text("".join(json.dumps({"request_id": 0, "layer": 0, "token_pos": t,
                                       "expert_ids": [t % 16, 15 - t % 16],
                                       "gate_weights": [0.6, 0.4]}) + "\n" for t in range(4)))
    code, _, err = _run(capsys, "run", "--trace", str(odd), "--config", "paper-8gb")
    assert code == 2 and err.strip().endswith("its 16 experts, top-2, are no preset's"), err


def test_an_npz_trace_of_some_layers_runs_them(tmp_path, capsys):
    """A trace the library writes of some of a model's MoE layers (``trace_from_router_logits``
    with ``layer_ids``, as ``capture_hf`` on a cut model) runs with ``--layers`` as a log of
    those layers does (a new user's was refused even with ``--model``), the others absent;
    without ``--layers`` the advice names the logged span as A:B."""
    import numpy as np
    from elmoe3d.sw.host.trace import trace_from_router_logits
    logits = np.random.default_rng(3).normal(size=(4, 5, 8))
    tr = trace_from_router_logits(logits, "mixtral-8x7b", request=np.zeros(5, int),
                                  position=np.arange(5), layer_ids=[0, 1, 2, 3], phase="decode")
    path = tr.save(tmp_path / "fl4.npz")
    out = tmp_path / "r.json"
    code, text, err = _run(capsys, "run", "--trace", str(path), "--config", "paper-8gb",
                           "--layers", "0:4", "--json", str(out))
    assert code == 0, err
    assert "layers 0..3 of mixtral-8x7b's 32 MoE layers" in text
    doc = json.loads(out.read_text())
    assert doc["layers"] == [0, 1, 2, 3] and doc["tokens"] == 5
    code, _, err = _run(capsys, "run", "--trace", str(path), "--config", "paper-8gb")
    assert code == 2 and "pass --layers 0:4 to run the logged layer(s) only" in err
    # layers that do not start at 0 likewise; another model's trace is not widened: its own
    # layers are named (a review's: an OLMoE trace read as Mixtral's 32 layers)
    mid = trace_from_router_logits(logits, "mixtral-8x7b", layer_ids=[4, 5, 6, 7],
                                   phase="decode").save(tmp_path / "mid.npz")
    code, _, err = _run(capsys, "run", "--trace", str(mid), "--config", "paper-8gb",
                        "--layers", "4:8")
    assert code == 0, err
    olmoe = trace_from_router_logits(np.random.default_rng(4).normal(size=(4, 5, 64)),
                                     "olmoe-1b-7b", layer_ids=[0, 1, 2, 3],
                                     phase="decode").save(tmp_path / "olmoe.npz")
    code, _, err = _run(capsys, "run", "--trace", str(olmoe), "--model", "mixtral-8x7b",
                        "--config", "paper-8gb", "--layers", "0:4")
    assert code == 2 and "the trace has 64 experts, top-8, layers 0..3;" in err


def test_warn_refuses_a_log_mostly_malformed(tmp_path, capsys):
    """``--on-error warn`` skips stray lines; a log most of whose lines are malformed (raw
    router logits logged as gate weights) is refused naming the count and the first line,
    where it ran on the few lines left (a new user followed the absent-layers advice into a
    run on 3.5% of the log); a few malformed lines are still skipped."""
    def log(name, bad):
        lines = [{"request_id": 0, "layer": lay, "token_pos": t,
                  "expert_ids": [lay % 8, (lay + 1) % 8],
                  "gate_weights": [3.2, -1.1] if bad(t * 32 + lay) else [0.7, 0.3]}
                 for t in range(4) for lay in range(32)]
        path = tmp_path / name
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return path
    code, _, err = _run(capsys, "run", "--trace", str(log("most.jsonl", lambda i: i % 29)),
                        "--model", "mixtral-8x7b", "--config", "paper-8gb", "--on-error", "warn")
    assert code == 2 and err.strip().splitlines() == [
        f"elmoe3d run: error: {tmp_path / 'most.jsonl'}: 123 of its 128 routing records "
        f"malformed (padding and duplicates aside; kept 5): --on-error warn skips "
        f"stray lines, not most of a log; the first, line 2 [negative-weight]: negative gate "
        f"weight -1.1 (raw router logits used as weights?)"]
    # a minority malformed beside many warm-up rows is not "most" (a review's: 40 malformed
    # of 128 with 64 warm-up rows dropped was refused)
    code, _, err = _run(capsys, "run", "--trace", str(log("warm.jsonl", lambda i: i % 3 == 1)),
                        "--model", "mixtral-8x7b", "--config", "paper-8gb", "--on-error", "warn",
                        "--warmup", "2")
    assert code == 0, err
    code, out, err = _run(capsys, "run", "--trace",
                          str(log("few.jsonl", lambda i: i % 29 == 1)), "--model",
                          "mixtral-8x7b", "--config", "paper-8gb", "--on-error", "warn")
    assert code == 0, err
    assert "128 records read, 123 kept" in " ".join(out.split())


def test_npz_trace_and_model_from_it(tmp_path, capsys):
    from elmoe3d.sw.host.trace import import_vllm_jsonl
    tr, _ = import_vllm_jsonl(routing_path("gsm8k"), model="mixtral-8x7b")
    path = tr.save(tmp_path / "t.npz")
    code, out, err = _run(capsys, "run", "--trace", str(path), "--config", "paper-4gb",
                          "--tokens", "6", "--layers", "0", "--schedule", "replay")
    assert code == 0, err
    assert "mixtral-8x7b" in out
    # a model field naming a preset whose experts the trace does not have, and no --model:
    # the error names the file's field, not an option the user never gave
    import dataclasses
    wrong = dataclasses.replace(tr, model="qwen3-30b-a3b").save(tmp_path / "q.npz")
    code, out, err = _run(capsys, "run", "--trace", str(wrong), "--config", "paper-4gb",
                          "--tokens", "6", "--layers", "0")
    assert code == 2 and err.count("\n") == 1
    assert ("q.npz's model field names qwen3-30b-a3b, which does not fit the trace (--model "
            "overrides it): the trace has 8 experts") in err


@pytest.mark.parametrize("argv, what", [
    (["--model", "mixtral-9x9b"], "--model mixtral-9x9b: unknown model preset 'mixtral-9x9b'; "
                                  "known presets"),
    (["--model", "mistralai/Mixtral-8x7B-Instruct-v0.1"],          # a new user's
     "unknown model preset 'mistralai/Mixtral-8x7B-Instruct-v0.1' (a checkpoint of "
     "mixtral-8x7b: give mixtral-8x7b)"),
    (["--layers", "40:41"], "--layers"),
    (["--layers", "a:b"], "--layers"),
    (["--config", "paper-16gb"], "--config"),
    (["--backend", "gpu"], "--backend"),
    (["--backend", "golden", "--config", "paper-4gb"], "small configuration only"),
    (["--tokens", "0"], "--tokens: expected a positive integer, got 0"),
    (["--depth", "0"], "--depth: expected a positive integer, got 0"),
    (["--batch", "-2"], "--batch: expected a positive integer, got -2"),
    (["--warmup", "-1"], "--warmup: expected an integer >= 0, got -1"),
    (["--acceptance", "always"], "--acceptance"),
    (["--model", "olmoe-1b-7b"], "--model"),
    (["--traffic", "stalls"], "--traffic: only with --backend rtl"),
    (["--acceptance", ""], "--acceptance '': expected"),
    (["--schedule", "replay", "--depth", "8"], "--depth: an Elastic-SD option"),
    (["--schedule", "replay", "--acceptance", "bernoulli:0.5"], "--acceptance: an Elastic-SD"),
    (["--depth", "4", "4"], "--depth 4 4: a depth given twice"),
    (["--layers", "0,0"], "--layers '0,0': layer 0 given twice"),
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
    code, _, err = _run(capsys, *BASE, "--plot", str(tmp_path / "fig.png"))
    assert code == 2 and "--plot" in err and "names a folder" in err
    assert not (tmp_path / "fig.png").exists()
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = _run(capsys, *BASE, "--plot", str(f))
    assert code == 2 and "--plot" in err
    code, _, err = _run(capsys, *BASE, "--json", str(tmp_path / "a"), "--csv",
                        str(tmp_path / "a"))
    assert code == 2 and "same file" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# -- every preset on every backend (issue 22, item 13) -----------------------------------------

@pytest.fixture(scope="module")
def preset_traces(tmp_path_factory):
    """A small synthetic routing trace (.npz, 6 tokens) per model preset: the real traces are
    Mixtral's."""
    from elmoe3d.sw.host.models import MODEL_PRESETS
    from elmoe3d.sw.host.tracegen import SyntheticRouting, synthetic_trace
    d = tmp_path_factory.mktemp("presets")
    return {name: synthetic_trace(p, SyntheticRouting(1.0, 0.5, 1.0), tokens=6, seed=3)
            .save(d / f"{name}.npz") for name, p in MODEL_PRESETS.items()}


def _hardware_stand_ins(monkeypatch):
    """The RTL and FPGA backends' hardware stood in for by the functional simulation's own
    beats (every PE program is offered, the CLI's checks and outputs run): what this test
    checks is the CLI on every preset up to the hardware; the programs are the golden
    backend's, run on the Verilog by tests/cocotb/test_host_rtl.py and on the Python board by
    tests/host/test_fpga_driver.py."""
    from types import SimpleNamespace

    from elmoe3d.sim import bench_host
    from elmoe3d.sw.host import fpga
    from elmoe3d.sw.golden.asm import OKind
    from elmoe3d.sw.host.pe_runs import case_ints, check_layers, compare_run, hex_str, pe_cases

    def echo(golden_layers, arch):
        records = []
        for case in pe_cases(golden_layers):
            c = case_ints(case)
            cmp_ = compare_run(c["o"], c["link_o"], c["o"], c["link_o"])
            records.append({"key": case["key"], "cycles": 1, "acc_overflow": bool(
                cmp_["status"].get("acc_overflow")), "vpu_saturation": bool(
                cmp_["status"].get("vpu_saturation")), "comparisons": cmp_["comparisons"],
                "mismatches": cmp_["mismatches"], "details": [],
                "o_data": [hex_str(d) for k, d in c["o"] if k == OKind.DATA],
                "naks": {}, **{k: 0 for k in ("frames", "retransmissions", "polls",
                                               "bytes_sent", "bytes_received", "seconds")}})
        by_key = {tuple(r["key"]): r for r in records}
        return records, check_layers(golden_layers, by_key, arch.pe)

    def rtl(golden_layers, arch, **kw):
        records, layers = echo(golden_layers, arch)
        return bench_host.HostRTLResult(records=records, layers=layers,
                                        sim=SimpleNamespace(log_file="(stand-in)"),
                                        build_seconds=0.0, built=False)

    def fpga_run(golden_layers, arch, board, **kw):
        records, layers = echo(golden_layers, arch)
        return fpga.HostFPGAResult(records=records, layers=layers, info=None)

    info = SimpleNamespace(baud=1_000_000, version=1, rows=2, lanes=4, word_bits=512,
                           hb_words=512, ext_words=1024, frame_words=8, clk_hz=25_000_000)
    board = SimpleNamespace(hello=lambda: info, close=lambda: None, port="stand-in",
                            baud=1_000_000)
    monkeypatch.setattr(bench_host, "run_host_rtl", rtl)
    monkeypatch.setattr(fpga, "run_host_fpga", fpga_run)
    monkeypatch.setattr(fpga.FpgaBoard, "open", classmethod(lambda cls, *a, **kw: board))


#: The presets of the paper's Table 2 and of the real traces: each runs on the perf backend
#: on every configuration and on golden, RTL and FPGA on the small one (synthetic shapes).
MUST_RUN = ("qwen3-30b-a3b", "glm-4.7-flash", "deepseek-v2-lite", "gpt-oss-20b",
            "mixtral-8x7b", "olmoe-1b-7b", "qwen1.5-moe-a2.7b")


def test_every_preset_runs_on_every_backend_or_is_refused(preset_traces, tmp_path, capsys,
                                                          monkeypatch):
    """Every model preset x configuration x backend either runs (exit 0, a JSON document
    with its steps; golden, RTL and FPGA: values compared, 0 mismatches) or is refused up
    front: one line, exit status 2, no output written. Exit status 1 (a mismatch) and any
    other never occur; the presets of MUST_RUN are never refused where their backend claims
    them. The perf backend runs every preset on every configuration (GPT-OSS-
    20B's 2880 channels split unevenly over a group's 4 PEs, sw/host/perf.py channel_slices);
    golden, RTL and FPGA run the small configuration only."""
    from elmoe3d.cli.run import BACKENDS, CONFIGS
    from elmoe3d.sw.host.models import model_preset
    _hardware_stand_ins(monkeypatch)
    seen = {}
    for name, path in preset_traces.items():
        layers = ",".join(map(str, model_preset(name).moe_layer_ids[:2]))
        for config in CONFIGS:
            for backend in BACKENDS:
                j = tmp_path / f"{name}-{config}-{backend}.json"
                argv = ["run", "--trace", str(path), "--config", config, "--backend",
                        backend, "--tokens", "3", "--layers", layers, "--depth",
                        "2",
                        "--json", str(j)]
                if backend == "fpga":
                    argv += ["--port", "stand-in"]
                code, out, err = _run(capsys, *argv)
                seen[name, config, backend] = code
                what = f"{name} on {config}, {backend}: {err}"
                refuse = backend in ("golden", "rtl", "fpga") and config != "small"
                if code == 2 and (refuse or name not in MUST_RUN):
                    lines = err.strip().splitlines()
                    assert len(lines) == 1 and lines[0].startswith("elmoe3d run: error: "), \
                        what
                    assert not refuse or "small configuration only" in lines[0], what
                    assert not j.exists()
                    continue
                assert code == 0 and not refuse, what
                doc = json.loads(j.read_text())
                assert doc["model"] == name and len(doc["layers"]) == 2
                s = doc["runs"][0]["summary"]
                assert s["produced"] == 3 and s["ext_bytes"] > 0, what
                if backend == "perf":
                    assert s["cycles"] > 0 and s["tokens_per_s"] > 0, what
                else:
                    assert s["compared"] > 0 and s["mismatches"] == 0, what
    assert set(seen.values()) == {0, 2}
    assert sum(seen[k] == 0 for k in seen if k[0] in MUST_RUN) == len(MUST_RUN) * (3 + 3)


def test_gpt_oss_20b_perf_uneven_split(preset_traces, tmp_path, capsys):
    """GPT-OSS-20B (H = I = 2880: 90 groups of 32 over 4 PEs) runs on the paper
    configurations: its MXFP4 experts (no LSB slice) streamed whole when uncached, the bank
    with the larger channel slice (736 of 2880) bounding the drafts."""
    from elmoe3d.config import preset
    from elmoe3d.sw.host.models import model_preset
    from elmoe3d.sw.host.perf import PerfModel, channel_slices
    gpt = model_preset("gpt-oss-20b")
    assert channel_slices(2880, 4) == [736, 736, 704, 704]
    assert channel_slices(14336, 4) == [3584] * 4
    pm = PerfModel(preset("paper-4gb"), gpt)
    d = pm.expert(0, 1, phase="draft", cached=True)
    assert sum(d.hb_bytes) == pytest.approx(gpt.expert_msb_bytes)
    assert max(d.hb_bytes) == pytest.approx(gpt.expert_msb_bytes * 736 / 2880)
    v = pm.expert(0, 5, phase="verify", cached=True)           # MXFP4: as the draft, HB only
    assert v.ext_bytes == 0 and v.w8_macs == [0] * 4 and v.hb_bytes == d.hb_bytes
    u = pm.expert(0, 5, phase="verify", cached=False)
    assert u.ext_bytes == gpt.expert_msb_bytes and u.w8_macs == [0] * 4
    assert sum(u.w4_macs) == 16 * 3 * 2880 * 2880          # one row block of 16 token rows
    j = tmp_path / "g.json"
    code, out, err = _run(capsys, "run", "--trace", str(preset_traces["gpt-oss-20b"]),
                          "--config", "paper-4gb", "--backend", "perf", "--json", str(j))
    assert code == 0, err
    doc = json.loads(j.read_text())
    assert doc["shapes"] == {"hidden": 2880, "intermediate": 2880, "synthetic": False}
    kinds = {st["kind"] for st in doc["runs"][0]["steps"]}
    assert kinds == {"ar", "draft", "verify"}
    assert all(st["bounds"] == {"hb": 24} for st in doc["runs"][0]["steps"]
               if st["kind"] == "draft")


def test_perf_refusal_is_one_line(monkeypatch, capsys):
    """A model the perf model cannot map is refused before anything runs: one line, exit
    status 2 (not a traceback and exit 1, the status of a mismatch)."""
    from elmoe3d.sw.host import perf

    def refuse(self, arch, model):
        raise ValueError("stand-in: no mapping")
    monkeypatch.setattr(perf.PerfModel, "__init__", refuse)
    code, out, err = _run(capsys, *BASE, "--config", "paper-4gb", "--tokens", "2")
    assert code == 2 and err.strip() == ("elmoe3d run: error: --model mixtral-8x7b on --config "
                                         "paper-4gb: the performance model cannot map it "
                                         "(stand-in: no mapping)")


def test_internal_error_exits_3(monkeypatch, capsys):
    """A bug (an unexpected exception) prints its traceback and exits 3: exit status 1 means
    a golden/RTL mismatch only."""
    from elmoe3d.sw.host.backends import perf as perf_backend

    def boom(*a, **kw):
        raise RuntimeError("stand-in bug")
    monkeypatch.setattr(perf_backend, "run_perf", boom)
    code, out, err = _run(capsys, *BASE, "--config", "paper-4gb", "--tokens", "2",
                          "--layers", "0")
    assert code == 3
    assert "RuntimeError: stand-in bug" in err and "internal error" in err


@pytest.mark.parametrize("schedule", ["elastic", "replay"])
def test_hb_slots_zero_is_no_expert_cache(schedule, tmp_path, capsys):
    """``--hb-slots 0``: no expert cache. Every expert is streamed from EXT (hit rate 0, no
    HB traffic); Elastic-SD has no pool to draft from, so every token is decoded
    autoregressively (``ar`` steps only), and the output says so. Negative slots are bad
    input."""
    j = tmp_path / "r.json"
    code, out, err = _run(capsys, *BASE, "--config", "paper-4gb", "--tokens", "6",
                          "--layers", "0:4", "--hb-slots", "0", "--schedule", schedule,
                          "--json", str(j))
    assert code == 0, err
    run = json.loads(j.read_text())["runs"][0]
    s = run["summary"]
    assert run["hb_slots"] == 0 and s["hit_rate"] == 0 and s["produced"] == 6
    assert s["hb_read_bytes"] == 0 and s["hb_write_bytes"] == 0 and s["ext_bytes"] > 0
    kinds = {st["kind"] for st in run["steps"]}
    if schedule == "elastic":
        assert kinds == {"ar"} and len(run["steps"]) == 6 and run["elastic_sd"] is None
        assert "the draft cannot run" in run["note"]
        assert "the draft cannot run; every token decoded autoregressively" in \
            " ".join(out.split())
    else:
        assert kinds == {"decode"} and "nothing admitted" in run["note"]
    # the golden backend runs it too, bit-exact
    code, out, err = _run(capsys, *BASE, "--config", "small", "--backend", "golden",
                          "--tokens", "3", "--layers", "5", "--hb-slots", "0",
                          "--schedule", schedule)
    assert code == 0 and "0 mismatches" in out, err
    code, out, err = _run(capsys, *BASE, "--hb-slots", "-1")
    assert code == 2 and "--hb-slots: expected an integer >= 0, got -1" in err


# -- an output that is an input file (issue: silent data loss) -------------------------------

@pytest.mark.parametrize("how", ["same", "symlink", "hardlink", "csv", "plot"])
def test_output_that_is_the_trace_is_refused(tmp_path, capsys, how):
    """``--json`` (or ``--csv``, a ``--plot`` file) naming the trace file itself, by its path, a
    symbolic link or a hard link, would overwrite the input: one line naming both options,
    exit status 2, the trace untouched."""
    import os
    trace = tmp_path / "mytrace.jsonl"
    trace.write_bytes((routing_path("gsm8k")).read_bytes())
    before = trace.read_bytes()
    opt, dest = "--json", trace
    if how == "symlink":
        dest = tmp_path / "link.json"
        dest.symlink_to(trace.name)
    elif how == "hardlink":
        dest = tmp_path / "hard.jsonl"
        os.link(trace, dest)
    elif how == "csv":
        opt = "--csv"
    elif how == "plot":
        opt, dest = "--plot", tmp_path / "plots"
        dest.mkdir()
        os.link(trace, dest / "latency.png")
    code, out, err = _run(capsys, "run", "--trace", str(trace), "--model", "mixtral-8x7b",
                          "--config", "paper-4gb", "--tokens", "2", "--layers", "0", opt,
                          str(dest))
    assert code == 2 and out == ""
    opt_named = "--plot latency" if how == "plot" else opt
    assert err.strip().splitlines() == [
        f"elmoe3d run: error: {opt_named} and --trace name the same file "
        f"{dest / 'latency.png' if how == 'plot' else dest}: the output would overwrite the "
        f"input"]
    assert trace.read_bytes() == before


def test_output_that_is_the_usage_file_is_refused(tmp_path, capsys):
    """``--trace synthetic:u.json --json u.json``: the usage statistics are an input too."""
    usage = tmp_path / "u.json"
    usage.write_text('{"stand-in": 1}\n')
    code, _, err = _run(capsys, "run", "--trace", f"synthetic:{usage}", "--model",
                        "olmoe-1b-7b", "--config", "paper-4gb", "--json", str(usage))
    assert code == 2
    assert err.strip() == (f"elmoe3d run: error: --json and --trace name the same file {usage}: "
                           f"the output would overwrite the input")
    assert usage.read_text() == '{"stand-in": 1}\n'


def test_synthetic_trace_fit_says_what_it_does(tmp_path, capsys):
    """``--trace synthetic:USAGE``: the fit of the synthetic routing (seconds of grid search)
    is announced by one progress line on standard error; a usage file refused before the fit
    is still one error line, with no progress line."""
    usage = tmp_path / "mixtral_usage.json"
    usage.write_text(json.dumps({"layers": [list(range(1, 9))] * 4}))
    code, out, err = _run(capsys, "run", "--trace", f"synthetic:{usage}", "--model",
                          "mixtral-8x7b", "--config", "paper-8gb", "--tokens", "8")
    assert code == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "elmoe3d run: fitting synthetic mixtral-8x7b routing to mixtral_usage.json (hot ratio ")
    assert "41 Zipf exponents tried at 256 tokens) ..." in lines[0]
    assert out.startswith("trace:")                             # the report is on stdout
    code, out, err = _run(capsys, "run", "--trace", f"synthetic:{usage}", "--model",
                          "olmoe-1b-7b", "--config", "paper-8gb", "--tokens", "8")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "fitting" not in err


@pytest.mark.parametrize("rule, field", [("coverage:2", "threshold"),
                                         ("bernoulli:-1", "alpha")])
def test_acceptance_out_of_range_names_the_option(capsys, rule, field):
    code, out, err = _run(capsys, *BASE, "--config", "paper-8gb", "--acceptance", rule)
    value = float(rule.partition(":")[2])
    assert code == 2 and err.strip() == (f"elmoe3d run: error: --acceptance {rule!r}: {field}: "
                                         f"expected a number in [0, 1], got {value!r}")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_a_failed_write_names_the_users_path(capsys, monkeypatch):
    """/proc refuses new files even to root: refused before the run. Where such a folder
    looked writable (the probe made to pass), the failed write names the user's --json, not
    the temporary file beside it."""
    args = (*BASE, "--config", "paper-8gb", "--tokens", "4", "--layers", "0", "--json",
            "/proc/elmoe3d-x.json")
    code, out, err = _run(capsys, *args)
    assert code == 2 and out == ""
    assert err.strip() == ("elmoe3d run: error: --json /proc/elmoe3d-x.json: directory /proc "
                           "is not writable")
    import elmoe3d.cli.outputs as outputs_mod
    monkeypatch.setattr(outputs_mod, "_writable", lambda folder: True)
    code, out, err = _run(capsys, *args)
    assert code == 2 and ".tmp" not in err
    assert err.strip() == ("elmoe3d run: error: cannot write output: [Errno 2] No such file or "
                           "directory: '/proc/elmoe3d-x.json'")


def _jsonl_lines(n):
    return (routing_path("gsm8k")).read_text().splitlines()[:n]


def test_a_malformed_jsonl_line_hints_on_error_warn(tmp_path, capsys):
    """A cut-off last line said ``cut.jsonl:35: not JSON (...) (read as --model
    mixtral-8x7b)``: the model has nothing to do with JSON syntax, and the option that skips
    bad lines was not named. The model stays where the check depends on it (an expert id out
    of range); the hint names an option ``elmoe3d run --help`` lists."""
    lines = _jsonl_lines(35)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:-1] + [lines[-1][:40]]) + "\n")
    code, _, err = _run(capsys, "run", "--trace", str(cut), "--model", "mixtral-8x7b")
    assert code == 2
    [line] = err.strip().splitlines()
    assert "cut.jsonl:35: not JSON (Unterminated string starting at column 39)" in line
    assert "--model" not in line
    assert line.endswith("; --on-error warn skips malformed lines (counted and listed)")
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--on-error MODE" in capsys.readouterr().out
    bad = json.loads(lines[2])
    bad["experts"] = [99, 0]
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text("\n".join(lines[:2] + [json.dumps(bad)] + lines[3:]) + "\n")
    code, _, err = _run(capsys, "run", "--trace", str(wrong), "--model", "mixtral-8x7b")
    assert code == 2
    [line] = err.strip().splitlines()
    assert ("wrong.jsonl:3: expert id 99 >= num_experts (8) (read as --model mixtral-8x7b); "
            "--on-error warn skips malformed lines") in line


def test_skipped_lines_are_listed_with_their_kind_in_brackets(tmp_path, capsys):
    """``--on-error warn`` lists the skipped lines by kind, ``[kind]``; the report printed it
    as rich markup, which took ``[bad-json]`` for a tag and dropped it ("skipped 1 malformed
    line(s) : line 35", a new user's trial, 2026-12-06). The trace's path keeps its brackets
    too."""
    lines = _jsonl_lines(35)
    folder = tmp_path / "[run]"
    folder.mkdir()
    cut = folder / "cut.jsonl"
    cut.write_text("\n".join(lines[:-1] + [lines[-1][:40]]) + "\n")
    code, out, err = _run(capsys, "run", "--trace", str(cut), "--model", "mixtral-8x7b",
                          "--on-error", "warn", "--backend", "perf", "--layers", "0")
    assert code == 0, err
    text = " ".join(out.split())
    assert f"import: {cut}: skipped 1 malformed line(s) [bad-json]: line 35" in text
    assert f"trace: {cut} (" in text


def test_a_trace_of_another_top_k_names_the_presets_that_fit(capsys, tmp_path):
    """The Mixtral trace (top-2) read as Qwen3-30B-A3B (top-8): the error names the presets
    whose top-k the lines have (a new user's trial followed the ``--on-error warn`` hint
    instead, which skips every line)."""
    code, _, err = _run(capsys, "run", "--trace", "gsm8k", "--model", "qwen3-30b-a3b")
    assert code == 2
    assert "2 experts, expected top_k = 8 (the presets with top_k = 2: mixtral-8x7b)" in err
    assert "--on-error" not in err          # skipping the lines would skip every line
    # one stray line of another top-k after lines of the model's: skipping it is the remedy,
    # and the hint says so (it was left out for every wrong top-k)
    lines = routing_path("gsm8k").read_text().splitlines(keepends=True)
    row = json.loads(lines[500])
    key = next(k for k in ("experts", "expert_ids", "topk_ids") if k in row)
    wkey = next(k for k in ("gating_probs", "gate_weights", "topk_weights") if k in row)
    row[key], row[wkey] = row[key] + [7 if 7 not in row[key] else 6], row[wkey] + [0.0]
    stray = tmp_path / "stray.jsonl"
    stray.write_text("".join(lines[:500]) + json.dumps(row) + "\n" + "".join(lines[501:]))
    code, _, err = _run(capsys, "run", "--trace", str(stray), "--model", "mixtral-8x7b")
    assert code == 2
    assert err.strip() == (f"elmoe3d run: error: {stray}:501: 3 experts, expected top_k = 2 "
                           f"(read as --model mixtral-8x7b); --on-error warn skips malformed "
                           f"lines (counted and listed)")
    # the stray line first: most lines decide, with the model given or not (the first line
    # decided: without --model its 3 became the top-k and every other line "wrong")
    first = tmp_path / "first.jsonl"
    first.write_text(json.dumps(row) + "\n" + "".join(lines[1:]))
    for model in (["--model", "mixtral-8x7b"], []):
        code, _, err = _run(capsys, "run", "--trace", str(first), *model)
        assert code == 2, err
        assert f"{first}:1: 3 experts, expected top_k = 2" in err, err
        assert err.rstrip().endswith("; --on-error warn skips malformed lines (counted and "
                                     "listed)"), err


def test_a_reservation_leaving_no_hb_names_the_option(capsys):
    """``--dense-bytes`` larger than the HB: the error names the option and the model's KV
    reservation it was added to (it named the library's ``dense_bytes``)."""
    code, _, err = _run(capsys, "run", "--trace", "gsm8k", "--model", "mixtral-8x7b",
                        "--config", "paper-4gb", "--backend", "perf", "--dense-bytes",
                        str(10 ** 18))
    assert code == 2
    assert f"--dense-bytes ({10 ** 18}) + mixtral-8x7b's KV cache (" in err
    assert "leave no HB for experts: paper-4gb has 4294967296 bytes of HB" in err


def test_a_reservation_takes_e_notation_and_units(capsys):
    """``--dense-bytes 1e9`` was refused as no integer (a new user's trial); it and ``1GB``
    reserve 10^9 bytes, which the error of an oversized reservation quotes back."""
    for given in ("1e9", "1GB", "1000000000"):
        code, out, err = _run(capsys, "run", "--trace", "gsm8k", "--model", "mixtral-8x7b",
                              "--config", "paper-4gb", "--backend", "perf", "--kv-bytes",
                              "4GiB", "--dense-bytes", given)
        assert code == 2, (given, err)
        assert "--dense-bytes (1000000000) + --kv-bytes (4294967296) " in err, (given, err)
    with pytest.raises(SystemExit) as exc:
        main(["run", "--trace", "gsm8k", "--dense-bytes", "1.5"])
    assert exc.value.code == 2
    assert "argument --dense-bytes: expected a whole number of bytes >= 0 (4000000, 1e9, " \
           "512MiB or 1.5GB), got '1.5'" in capsys.readouterr().err


def test_a_named_trace_missing_names_the_traces_folder(capsys, monkeypatch, tmp_path):
    """``--trace gsm8k`` with ``$ELMOE3D_TRACES`` pointing at a folder without it: the error
    names the variable and its value (a new user's trial found it said only ``no such
    file``)."""
    monkeypatch.setenv("ELMOE3D_TRACES", str(tmp_path))
    code, _, err = _run(capsys, "run", "--trace", "gsm8k", "--model", "mixtral-8x7b")
    assert code == 2
    assert f"(the traces folder: $ELMOE3D_TRACES = {tmp_path})" in err


def test_an_unknown_trace_name_lists_the_named_traces(capsys):
    """``--trace nosuchset`` said only ``no such file nosuchset``: the error names the trace
    sets (``NAMED_TRACES``) and the ``synthetic:FILE`` form."""
    from elmoe3d.cli.run import NAMED_TRACES, SYNTHETIC_PREFIX
    code, _, err = _run(capsys, "run", "--trace", "nosuchset", "--model", "mixtral-8x7b")
    assert code == 2
    assert err.strip().splitlines() == [
        f"elmoe3d run: error: --trace nosuchset: no such file nosuchset; expected a routing "
        f"log file, a named trace ({', '.join(NAMED_TRACES)}) or {SYNTHETIC_PREFIX}FILE"]
    assert {"gsm8k", "humaneval"} <= set(NAMED_TRACES)


def test_tokens_beyond_the_trace_are_noted(tmp_path, capsys):
    """``--tokens`` above the trace's decode tokens runs them all and says so (a note in the
    output and the JSON), not silently."""
    j = tmp_path / "r.json"
    code, out, err = _run(capsys, *BASE, "--config", "paper-8gb", "--tokens", "99999",
                          "--layers", "0:2", "--json", str(j))
    assert code == 0, err
    doc = json.loads(j.read_text())
    assert doc["tokens"] == 247
    assert "--tokens 99999 but the trace has 247 decode tokens: all 247 run" in doc["note"]
    assert "--tokens 99999 but the trace has 247" in out


def test_synthetic_trace_mistakes_name_what_is_wrong(tmp_path, capsys):
    """``--trace synthetic:`` with no file, and a usage table with a string among its counts:
    each one line naming what is wrong (the folder '.' and the type 'list' were named)."""
    code, _, err = _run(capsys, "run", "--trace", "synthetic:", "--model", "mixtral-8x7b")
    assert code == 2 and "--trace 'synthetic:': expected synthetic:FILE" in err
    usage = tmp_path / "u.json"
    usage.write_text(json.dumps([[1, 2, "x", 4, 5, 6, 7, 8]] * 2))
    code, _, err = _run(capsys, "run", "--trace", f"synthetic:{usage}", "--model",
                        "mixtral-8x7b")
    assert code == 2 and err.count("\n") == 1
    assert "expert usage: layer '0', expert 2: expected a count, got \"x\"" in err


@pytest.mark.parametrize("built, seconds", [(True, 1e-9), (False, 1e-9), (True, 1e6)])
def test_a_verilator_build_is_left_out_of_the_simulation_speed(built, seconds, monkeypatch,
                                                               capsys, tmp_path):
    """A new user's finding (2026-12-07): the first RTL run's `sim tok/s` counted the
    Verilator build (0.1 tokens/s against 0.9 the next time). A build this run made is now
    reported apart and left out of the speed; a reused build (its own compile time in the
    figures) is not subtracted. A stand-in backend reports a build of 1 ns."""
    from elmoe3d.sw.host.backends import golden
    real = golden.GoldenBackend.run

    def with_build(self, steps, ctx):
        res = real(self, steps, ctx)
        res.figures = {"built": built, "build_seconds": seconds}
        return res
    monkeypatch.setattr(golden.GoldenBackend, "run", with_build)
    out_json = tmp_path / "r.json"
    code, out, err = _run(capsys, *BASE, "--config", "small", "--backend", "golden",
                          "--tokens", "2", "--layers", "0", "--json", str(out_json))
    assert code == 0, err
    run = json.loads(out_json.read_text())["runs"][0]
    w = run["wall_seconds"]
    assert w["build"] == (seconds if built else 0.0)
    if seconds > 1:     # a build longer than the run (a stand-in): no speed, said so
        assert run["tokens_simulated_per_s"] is None
        assert "): n/a tokens simulated per second" in " ".join(out.split())
        return
    tokens = json.loads(out_json.read_text())["tokens"]
    assert run["tokens_simulated_per_s"] == pytest.approx(
        tokens / (w["schedule"] + w["backend"] - w["build"]), rel=1e-12)
    said = "of which the Verilator build 0.00 s, left out of the speed" in " ".join(out.split())
    assert said == built


def test_a_full_disk_names_the_plot_being_written(tmp_path, capsys, monkeypatch):
    """The three plots' temporary files were all made before the first was drawn, so a full
    disk named the last (latency.png) while hit_rate.png failed (a review's); each is now
    made just before it is written. Nothing is left behind."""
    import errno
    from matplotlib.figure import Figure

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Figure, "savefig", full)
    plots = tmp_path / "plots"
    code, _, err = _run(capsys, *BASE, "--config", "paper-8gb", "--tokens", "2", "--layers",
                        "0:2", "--plot", str(plots))
    assert code == 2
    assert err.strip() == (f"elmoe3d run: error: cannot write output: [Errno 28] No space "
                           f"left on device: '{plots / 'hit_rate.png'}'")
    assert not plots.exists()


def test_a_seed_nothing_uses_gets_a_note(capsys):
    """``--seed`` on the perf backend with a logged trace and coverage acceptance changed
    nothing, silently (a new user's); a note says so. Where the seed is drawn from (Bernoulli
    acceptance, the golden backend's synthetic weights) there is no note."""
    argv = [*BASE, "--config", "paper-8gb", "--tokens", "2", "--layers", "0:2"]
    code, _, err = _run(capsys, *argv, "--seed", "5")
    assert code == 0 and err.strip() == (
        "elmoe3d run: note: --seed 5 is not used: the perf backend on a logged trace with "
        "coverage acceptance draws nothing at random"), err
    code, _, err = _run(capsys, *argv, "--seed", "5", "--acceptance", "bernoulli:0.7")
    assert code == 0 and "note" not in err, err
    code, _, err = _run(capsys, *BASE, "--tokens", "2", "--layers", "0:2", "--backend",
                        "golden", "--seed", "5")
    assert code == 0 and "note" not in err, err


def test_hb_slots_above_what_fits_gets_a_note(tmp_path, capsys):
    """``--hb-slots 68`` with reservations that leave 14 ran with 14, silently (a new user's):
    the note says so; a cap the HB holds gets none."""
    j = tmp_path / "r.json"
    argv = ["run", "--trace", "gsm8k", "--layers", "0:32:8", "--tokens", "8", "--backend",
            "perf", "--dense-bytes", "4000000", "--json", str(j)]
    code, out, err = _run(capsys, *argv, "--hb-slots", "68")
    assert code == 0, err
    doc = json.loads(j.read_text())
    slots = doc["runs"][0]["hb_slots"]
    assert slots < 68
    assert (f"--hb-slots 68 but {slots} fit the HB the dense weights and KV cache leave: "
            f"{slots} used") in doc["note"] and "--hb-slots 68 but" in " ".join(out.split())
    code, out, err = _run(capsys, *argv, "--hb-slots", str(slots))
    assert code == 0 and "--hb-slots" not in (json.loads(j.read_text()).get("note") or "")

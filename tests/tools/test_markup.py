"""Text from the user or the file system keeps its brackets in the reports.

The reports print with ``rich``, which reads ``[word]`` as a markup tag (a lower-case letter,
``#``, ``/`` or ``@`` after the bracket) and drops it: a file ``w[x].safetensors`` printed as
``w.safetensors``, a sweep ``s[x]``'s progress bar as ``sweep s``. Each test runs a command
(in this process) on bracketed paths or names and looks for them, brackets included, in what
it printed.
"""

from __future__ import annotations

import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from elmoe3d.cli import main
from elmoe3d.hw.checked import inspection
from elmoe3d.sw.host.corpus import routing_path


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _flat(text):
    """``text`` with every run of white space one space (rich wraps long lines)."""
    return " ".join(text.split())


@pytest.fixture
def folder(tmp_path):
    """A folder named ``[x]``."""
    d = tmp_path / "[x]"
    d.mkdir()
    return d


# -- elmoe3d quant ------------------------------------------------------------------------------

@pytest.fixture
def weights(folder):
    """``w[x].safetensors``: a plain weight, one whose 2- and 3-bit dedicated drafts are n/a
    (a group scale beyond FP16), one with groups that quantize to 0, and a 1-D bias that is
    skipped; every name bracketed."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(0)
    tiny = np.full((8, 64), 1e-9, np.float32)
    tiny[:, :32] = rng.standard_normal((8, 32))
    path = folder / "w[x].safetensors"
    save_file({"a[x].weight": rng.standard_normal((8, 64)).astype(np.float32),
               "b[big].weight": (rng.standard_normal((8, 64)) * 1e5).astype(np.float32),
               "c[tiny].weight": tiny,
               "d[bias].bias": np.zeros(8, np.float32)}, str(path))
    return path


def test_quant_report_lines_keep_the_file_and_tensor_names(weights, capsys):
    """The table's title (the file's name), the n/a lines (the quantizer's reason names the
    tensor), the skipped tensors and the all-zero groups note: each lost its ``[...]``."""
    code, out, err = _run(capsys, "quant", str(weights))
    assert code == 0, err
    text = _flat(out)
    assert "w[x].safetensors: 3 tensors, 1,536 weights" in text
    assert "dedicated 2-bit draft n/a for 1 of 3 tensors: tensor 'b[big].weight': row" in text
    assert "skipped 1 of 4 selected tensors (1-D: 1): d[bias].bias" in text
    assert "half the smallest FP16 group scale): c[tiny].weight (8)" in text


def test_quant_per_tensor_table_keeps_the_tensor_names(weights, capsys):
    code, out, err = _run(capsys, "quant", str(weights), "--per-tensor", "--bits", "4")
    assert code == 0, err
    for name in ("a[x].weight", "b[big].weight", "c[tiny].weight"):
        assert re.search(rf"│ {re.escape(name)} +│ 8x64", out), name


def test_quant_progress_shows_the_tensor_names(weights, capsys, monkeypatch):
    """The progress bar (a terminal's standard error only) shows the tensor being quantized
    through a markup column: its description must be the name escaped."""
    from rich.progress import Progress
    from rich.text import Text
    shown = []
    update = Progress.update

    def record(self, task_id, **kw):
        if kw.get("description") is not None:
            shown.append(Text.from_markup(kw["description"]).plain)   # as TextColumn does
        return update(self, task_id, **kw)
    monkeypatch.setattr(Progress, "update", record)
    code, _, err = _run(capsys, "quant", str(weights), "--bits", "4")
    assert code == 0, err
    assert shown == ["a[x].weight", "b[big].weight", "c[tiny].weight"]


# -- elmoe3d run --------------------------------------------------------------------------------

@pytest.fixture
def trace(folder):
    path = folder / "t[x].jsonl"
    path.write_text("\n".join(routing_path("gsm8k").read_text().splitlines()[:40]) + "\n")
    return path


def test_run_summary_title_keeps_the_trace_name(trace, capsys):
    code, out, err = _run(capsys, "run", "--trace", str(trace), "--model", "mixtral-8x7b",
                          "--backend", "perf", "--layers", "0", "--config", "paper-8gb")
    assert code == 0, err
    assert "elmoe3d run: t[x].jsonl, mixtral-8x7b, paper-8gb" in _flat(out)


def test_run_fpga_line_keeps_the_port(trace, capsys, monkeypatch):
    """The FPGA backend's line names ``--port`` (any pyserial URL); the board is a stand-in
    (tests/tools/test_run_cmd.py) that keeps the port it was opened at."""
    from elmoe3d.sw.host import fpga
    from .test_run_cmd import _hardware_stand_ins
    _hardware_stand_ins(monkeypatch)
    board = fpga.FpgaBoard.open("stand-in")

    def open_(cls, port, **kw):
        return SimpleNamespace(**{**vars(board), "port": port})
    monkeypatch.setattr(fpga.FpgaBoard, "open", classmethod(open_))
    port = "socket://[x]:7"
    code, out, err = _run(capsys, "run", "--trace", str(trace), "--model", "mixtral-8x7b",
                          "--backend", "fpga", "--port", port, "--layers", "0",
                          "--tokens", "2", "--schedule", "replay")
    assert code == 0, err
    assert f"replay: FPGA on {port} at 1000000 baud" in _flat(out)


# -- elmoe3d sweep ------------------------------------------------------------------------------

def test_sweep_progress_bar_keeps_the_name(folder, capsys):
    """The progress bar's description (``sweep NAME``), printed once at its end when standard
    output is not a terminal, read as markup: ``sweep s``."""
    spec = folder / "spec.yaml"
    spec.write_text('name: "s[x]"\nconfig:\n  pes: [16]\nworkload:\n'
                    "  model: [qwen3-30b-a3b]\n  batch: [1]\n  scheme: [ar]\n")
    code, out, err = _run(capsys, "sweep", str(spec), "--workers", "0", "--out",
                          str(folder / "out"), "--cache", str(folder / "cache"), "--no-plots")
    assert code == 0, err
    assert re.search(r"^sweep s\[x\] +━", out, re.M), out


# -- elmoe3d fpga -------------------------------------------------------------------------------

def test_fpga_estimate_lines_keep_the_paths(folder, capsys, monkeypatch):
    """The estimate's cache folder (under ``$ELMOE3D_BUILD_DIR``) and ``--json``'s file; the
    estimate itself is stood in for (tests/tools/test_fpga_flow.py)."""
    from elmoe3d.synth import fpga
    monkeypatch.setattr(fpga, "estimate", lambda top, platform, **kw: fpga.estimate_from_stat(
        {"LUT4": 1000, "TRELLIS_FF": 100}, fpga.DEVICES[platform.device]))
    monkeypatch.setattr(fpga, "board_top", lambda cfg: ("top of", cfg.name))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(folder / "build"))
    json_path = folder / "e[x].json"
    code, out, err = _run(capsys, "fpga", "--estimate-only", "--no-asic", "--json",
                          str(json_path))
    assert code == 0, err
    text = _flat(out)
    assert f"(cache {folder / 'build' / 'fpga' / 'estimates'}/;" in text
    assert f"JSON: {json_path}" in text


# -- elmoe3d synth ------------------------------------------------------------------------------

class _Planned(Exception):
    pass


def test_synth_first_line_keeps_the_liberty_and_cache_paths(folder, capsys, monkeypatch):
    """``--liberty`` and the cache (under ``$ELMOE3D_BUILD_DIR``), named in the first line and
    the sources; the run stops at the first block planned (no Yosys run)."""
    from elmoe3d.synth import flow, rollup
    from elmoe3d.synth.liberty import BUNDLED_LIBERTY

    class Planner:
        def __init__(self, **kw):
            pass

        def plan(self, *a, **kw):
            raise _Planned
    monkeypatch.setattr(flow, "yosys_command", lambda: ["true"])
    monkeypatch.setattr(rollup, "Planner", Planner)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(folder / "build"))
    lib = folder / "l[x].lib.gz"
    shutil.copy(BUNDLED_LIBERTY, lib)
    # the die's blocks are built and dropped when the planning stops: inspected, not elaborated
    with inspection(), pytest.raises(_Planned):
        main(["synth", "--config", "small", "--liberty", str(lib)])
    text = _flat(capsys.readouterr().out)
    assert f"elmoe3d synth: liberty {lib} (" in text
    assert f"cache {folder / 'build' / 'synth'}/" in text


# -- elmoe3d bench ------------------------------------------------------------------------------

def test_bench_trace_path_line_keeps_the_traces_folder(folder, capsys, monkeypatch):
    """Figure 12's trace-driven path, not measured: the line names the missing trace under
    ``$ELMOE3D_TRACES``. The bench's figures need the RTL benches (minutes), so this runs
    the figure's two functions, on the bench's console settings."""
    from elmoe3d.cli import bench
    from elmoe3d.cli.outputs import report_console
    monkeypatch.setenv("ELMOE3D_TRACES", str(folder))
    trace = bench.trace_path_speed()
    assert "error" in trace
    bench.print_speed(report_console(170), {}, trace)
    text = _flat(capsys.readouterr().out)
    assert f"not measured ({routing_path('gsm8k')} not found (set ELMOE3D_TRACES))" in text

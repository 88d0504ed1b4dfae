"""The RTL backend: the golden run (:mod:`.golden`), then every PE program of every busy
group on the PE's Verilog (cocotb + Verilator) with the link traffic of the golden link
model, every ``o`` beat and link word and the FP32 outputs checked bit for bit
(``docs/host.md``, "Golden and RTL backends").

The bench is :mod:`elmoe3d.sim.bench_host` (:func:`~elmoe3d.sim.bench_host.run_host_rtl`),
imported when the backend runs: cocotb and Amaranth stay out of ``sw/``.

Cycles per layer-step: the slowest PE of the slowest group, every PE run alone with its link
words pre-delivered (a lower bound of the die's).
"""

from __future__ import annotations

from .golden import GoldenBackend
from . import BackendRun, RunContext
from .records import merge_layers


__all__ = ["RTLBackend", "CYCLES_NOTE"]

#: What the RTL backend's cycles are (the run's ``rtl.cycles_note``).
CYCLES_NOTE = ("per layer-step: the slowest PE of the slowest group, every PE run alone with "
               "its link words pre-delivered (a lower bound of the die's)")


class RTLBackend(GoldenBackend):
    """``rtl``: :meth:`~.golden.GoldenBackend.golden` with the jobs kept, then
    :func:`~elmoe3d.sim.bench_host.run_host_rtl` (``ctx.options["traffic"]``: the bench's
    stream pattern). Records: the golden ones with the RTL's cycles and comparisons merged
    (:func:`.records.merge_layers`). Figures: ``{"pe_runs", "pe_cycles", "log",
    "build_seconds", "built", "cycles_note"}`` (``"error"``: the details of cases the bench
    lost, counted as :attr:`~.BackendRun.lost_mismatches`)."""

    name = "rtl"
    description = ("the golden run, then every PE program on the PE's Verilog (cocotb + "
                   "Verilator), checked bit for bit")
    keeps_golden = True
    reference = "the functional simulation and ref_moe"

    def run(self, steps, ctx: RunContext) -> BackendRun:
        from ....paths import ensure_build_root
        from ....sim import bench_host
        ensure_build_root()         # a folder that cannot be written: one line, before the run
        records, glayers = self.golden(steps, ctx)
        rtl = bench_host.run_host_rtl(glayers, ctx.arch, seed=ctx.seed,
                                      traffic=ctx.options["traffic"])
        lost = merge_layers(records, rtl.layers, ctx.arch, timed=True)
        figures = {"pe_runs": len(rtl.records),
                   "pe_cycles": sum(r["cycles"] for r in rtl.records),
                   "log": str(rtl.sim.log_file),
                   "build_seconds": rtl.build_seconds, "built": rtl.built,
                   "cycles_note": CYCLES_NOTE}
        if lost:
            figures["error"] = lost["details"]
        return BackendRun(records=records, figures=figures,
                          lost_mismatches=lost["mismatches"] if lost else 0)

    def report(self, label: str, figures: dict) -> list:
        from rich.markup import escape          # the lines are rich markup; paths are not
        x = figures
        lines = [f"{label}: RTL {x['pe_runs']} PE program runs, {x['pe_cycles']:,} PE cycles "
                 f"in all; {x['cycles_note']}; log {escape(str(x['log']))}"]
        if x.get("error"):
            lines.append(f"[bold red]RTL bench error[/]: {escape(str(x['error']))}")
        return lines

"""cocotb bench of the host backend's RTL runs: every PE program the host compiler produced
(:mod:`elmoe3d.sw.host.compiler`, :func:`elmoe3d.sw.host.parallel.compile_group` per PE group) run on the
processing element's Verilog, PE by PE, with the group's link traffic from the golden link
model (``docs/host.md``, "RTL backend").

Run through :mod:`elmoe3d.sim.runner` by :func:`run_host_rtl` (never directly). Each case is
one PE's program of one group of one layer-step: its encoded commands, its ``ld`` words (all
sources merged, in LOAD order: what the die's load router forwards), and its ``link_i`` words:
the words the group's aggregation link delivers to that PE, computed on the host by running
the group's descriptors (:func:`elmoe3d.sw.golden.agg_link.ref_link`) over the other PEs' ``link_o``
words of the multi-PE functional simulation (:func:`elmoe3d.sw.host.parallel.run_group`). The
bench offers all of them at once (the PE takes ``link_i`` words only when a RECV or a
``psum_in`` GEMM needs them) and compares with plain equality:

* every ``o`` beat against the functional simulation (DATA beats bit for bit, STATUS beats
  on :data:`~elmoe3d.sw.golden.asm.FUNCTIONAL_STATUS_FIELDS`), every ``link_o`` word likewise;
* the host then decodes the root PE's DATA beats and compares the FP32 output with the golden
  MoE layer (``ref_moe`` with the group's routing) and the sticky flags, bit for bit.

Cycles: from the first command accepted to the last output taken, with every ``link_i`` word
available from the start: a lower bound of the PE's time inside the die. ``params.json``::

    {"arch": "small", "traffic": "smooth", "cases": [{"name", "program": [hex],
     "ld": [hex], "link_i": [hex], "o": [[kind, hex]], "link_o": [hex]}, ...]}

The cases and both comparisons are :mod:`elmoe3d.sw.host.pe_runs` (shared with the FPGA backend).
Each run writes ``summary-test_programs.json`` (one record per case, with the RTL's DATA
beats as hex) and fails if any case mismatched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import cocotb

from ..sw.golden.asm import OKind
from ..sw.host.pe_runs import (PERunsResult, case_ints, check_layers, compare_run, hex_str,
                          link_inputs, pe_cases)
from .bench_pe import PEBench
from .records import arch_from_params, arch_param, read_records
from .runner import load_params, resolve_seed


__all__ = ["pe_cases", "link_inputs", "run_host_rtl", "HostRTLResult"]


# pe_cases and link_inputs (imported from elmoe3d.sw.host.pe_runs, shared with the FPGA backend)
# stay names of this module: run_host_rtl looks pe_cases up here.


@cocotb.test()
async def test_programs(dut):
    """Every compiled PE program of the host's layer-steps, compared with the functional
    simulation beat for beat."""
    params = load_params()
    traffic = params.get("traffic", "smooth")
    bench = PEBench(dut, arch_from_params(params), resolve_seed(), "test_programs", traffic)
    await bench.start()
    with bench.summary():
        for case in params["cases"]:
            c = case_ints(case)
            wall = time.perf_counter()
            run = await bench.run(c["program"], c["ld"], c["link_i"], n_o=len(c["o"]),
                                  n_link=len(c["link_o"]), rng=bench.rng(case["name"]),
                                  traffic=traffic)
            wall = time.perf_counter() - wall
            cmp_ = compare_run(run.o, run.link_o, c["o"], c["link_o"], run.errors)
            status = cmp_["status"]
            bench.record(case=case["name"], source="host", mode=case.get("phase", "-"),
                         traffic=traffic, tokens=int(case.get("tokens", 0)),
                         experts_run=case.get("experts", []), cycles=run.cycles,
                         gemm_beats=int(status.get("gemm_beats", 0)),
                         acc_overflow=bool(status.get("acc_overflow")),
                         vpu_saturation=bool(status.get("vpu_saturation")),
                         comparisons=cmp_["comparisons"], mismatches=cmp_["mismatches"],
                         details=cmp_["details"][:8],
                         o_data=[hex_str(d) for k, d in run.o if k == OKind.DATA],
                         key=case.get("key"), wall_seconds=wall)


# -- host side -------------------------------------------------------------------------------

@dataclass
class HostRTLResult(PERunsResult):
    """``records``: the bench's per-case records; ``layers``: per layer-step ``{"step",
    "layer", "cycles" (max over its groups of the max over each group's PEs), "compared",
    "mismatches", "details"}`` with the host's FP32 comparison of every group's output
    against ref_moe included; ``sim``: the runner's result. ``mismatches`` / ``compared``:
    :class:`~elmoe3d.sw.host.pe_runs.PERunsResult`."""

    sim: object
    build_seconds: float
    built: bool


def run_host_rtl(golden_layers, arch, *, seed=None, traffic="smooth", waves=None) -> \
        HostRTLResult:
    """Run the PE programs of ``golden_layers`` on the PE's Verilog (built or reused by
    :func:`elmoe3d.sim.bench_pe.build_pe`) and check them (module docstring)."""
    from .bench_pe import build_pe
    from .runner import run
    built = build_pe(arch, waves=waves)
    cases = pe_cases(golden_layers)
    result = run(built, test_module=__name__, testcase="test_programs",
                 params={"arch": arch_param(arch), "traffic": traffic, "cases": cases},
                 seed=seed, run_name="bench_host", check=False)
    records = read_records(result)
    by_key = {tuple(r["key"]): r for r in records if r.get("key")}
    out = check_layers(golden_layers, by_key, arch.pe)
    if not records or len(records) != len(cases):
        out.append({"step": None, "layer": None, "cycles": 0, "compared": 0, "mismatches": 1,
                    "details": [f"the bench ran {len(records)} of {len(cases)} cases "
                                f"(log {result.log_file})"]})
    return HostRTLResult(records=records, layers=out, sim=result,
                         build_seconds=built.seconds, built=built.built)

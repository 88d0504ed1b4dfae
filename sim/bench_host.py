"""cocotb bench of the host backend's RTL runs: every PE program the host compiler produced
(:mod:`elmoe3d.sw.host`, :func:`elmoe3d.sw.parallel.compile_group` per PE group) run on the
processing element's Verilog, PE by PE, with the group's link traffic from the golden link
model (``docs/host.md``, "RTL backend").

Run through :mod:`elmoe3d.sim.runner` by :func:`run_host_rtl` (never directly). Each case is
one PE's program of one group of one layer-step: its encoded commands, its ``ld`` words (all
sources merged, in LOAD order: what the die's load router forwards), and its ``link_i`` words:
the words the group's aggregation link delivers to that PE, computed on the host by running
the group's descriptors (:func:`elmoe3d.sw.links.ref_link`) over the other PEs' ``link_o``
words of the multi-PE functional simulation (:func:`elmoe3d.sw.parallel.run_group`). The
bench offers all of them at once (the PE takes ``link_i`` words only when a RECV or a
``psum_in`` GEMM needs them) and compares with plain equality:

* every ``o`` beat against the functional simulation (DATA beats bit for bit, STATUS beats
  on :data:`~elmoe3d.sw.asm.FUNCTIONAL_STATUS_FIELDS`), every ``link_o`` word likewise;
* the host then decodes the root PE's DATA beats and compares the FP32 output with the golden
  MoE layer (``ref_moe`` with the group's routing) and the sticky flags, bit for bit.

Cycles: from the first command accepted to the last output taken, with every ``link_i`` word
available from the start: a lower bound of the PE's time inside the die. ``params.json``::

    {"arch": "small", "traffic": "smooth", "cases": [{"name", "program": [hex],
     "ld": [hex], "link_i": [hex], "o": [[kind, hex]], "link_o": [hex]}, ...]}

Each run writes ``summary-test_programs.json`` (one record per case, with the RTL's DATA
beats as hex) and fails if any case mismatched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import cocotb

from ..sw import asm
from ..sw.asm import OKind
from .bench_pe import PEBench
from .records import arch_from_params, arch_param, read_records
from .runner import load_params, resolve_seed


__all__ = ["pe_cases", "link_inputs", "run_host_rtl", "HostRTLResult"]


def _hex(v) -> str:
    return format(int(v), "x")


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
            prog = [int(c, 16) for c in case["program"]]
            ld = [int(w, 16) for w in case["ld"]]
            link_i = [int(w, 16) for w in case["link_i"]]
            want_o = [(int(k), int(d, 16)) for k, d in case["o"]]
            want_l = [int(w, 16) for w in case["link_o"]]
            wall = time.perf_counter()
            run = await bench.run(prog, ld, link_i, n_o=len(want_o), n_link=len(want_l),
                                  rng=bench.rng(case["name"]), traffic=traffic)
            wall = time.perf_counter() - wall
            details = list(run.errors)
            bad = len(run.errors)
            compared = len(want_o) + len(want_l)
            if len(run.o) != len(want_o):
                bad += 1
                details.append(f"{len(run.o)} o beats, fsim {len(want_o)}")
            status = {}
            for i, ((kind, data), (wk, wd)) in enumerate(zip(run.o, want_o)):
                if kind != wk:
                    bad += 1
                    details.append(f"o beat {i}: kind {kind}, fsim {wk}")
                elif kind == OKind.DATA and data != wd:
                    bad += 1
                    details.append(f"o beat {i}: DATA differs from fsim")
                elif kind == OKind.STATUS:
                    s, w = asm.unpack_status(data), asm.unpack_status(wd)
                    status = s
                    for name in asm.FUNCTIONAL_STATUS_FIELDS:
                        if s[name] != w[name]:
                            bad += 1
                            details.append(f"STATUS.{name}: RTL {s[name]}, fsim {w[name]}")
            if run.link_o != want_l:
                bad += 1 + sum(a != b for a, b in zip(run.link_o, want_l))
                details.append(f"link_o: {len(run.link_o)} words, fsim {len(want_l)}; "
                               f"differing")
            bench.record(case=case["name"], source="host", mode=case.get("phase", "-"),
                         traffic=traffic, tokens=int(case.get("tokens", 0)),
                         experts_run=case.get("experts", []), cycles=run.cycles,
                         gemm_beats=int(status.get("gemm_beats", 0)),
                         acc_overflow=bool(status.get("acc_overflow")),
                         vpu_saturation=bool(status.get("vpu_saturation")),
                         comparisons=compared, mismatches=bad, details=details[:8],
                         o_data=[_hex(d) for k, d in run.o if k == OKind.DATA],
                         key=case.get("key"), wall_seconds=wall)


# -- host side -------------------------------------------------------------------------------

def link_inputs(job, res) -> list:
    """Each PE's ``link_i`` words of a group run: the group's descriptors applied in order
    (:func:`~elmoe3d.sw.links.ref_link`) to the PEs' ``link_o`` words of ``res``
    (:class:`~elmoe3d.sw.parallel.GroupResult`) -- what the aggregation link delivers."""
    from ..sw.links import ref_link
    G = job.pes
    pos = [0] * G
    inbox = [[] for _ in range(G)]
    for op in job.link_ops:
        got = ref_link(op, [res.link_o[s][pos[s]:pos[s] + op.words] for s in range(G)],
                       word_bits=job.pe.word_bits)
        for s in op.srcs:
            pos[s] += op.words
        for q in range(G):
            inbox[q].extend(got[q])
    return inbox


def pe_cases(layers) -> list:
    """The bench cases of golden layer-steps (:class:`elmoe3d.sw.backends.GoldenLayer` with
    their jobs kept): one per PE of every busy group."""
    cases = []
    for gl in layers:
        for g, job, res, _ in gl.jobs:
            ins = link_inputs(job, res)
            experts = sorted(int(e) for e in job.info["experts"])
            for p in range(job.pes):
                cases.append({
                    "name": f"step {gl.step} L{gl.layer} group {g} PE {p}",
                    "key": [gl.step, gl.layer, g, p], "phase": job.phase,
                    "tokens": int(job.tokens), "experts": experts,
                    "program": [_hex(c) for c in job.programs[p].encode()],
                    "ld": [_hex(w) for w in job.ld[p]],
                    "link_i": [_hex(w) for w in ins[p]],
                    "o": [[int(b.kind), _hex(b.data)] for b in res.o[p]],
                    "link_o": [_hex(w) for w in res.link_o[p]]})
    return cases


@dataclass
class HostRTLResult:
    """``records``: the bench's per-case records; ``layers``: per layer-step ``{"step",
    "layer", "cycles" (max over its groups of the max over each group's PEs), "compared",
    "mismatches", "details"}`` with the host's FP32 comparison of every group's output
    against ref_moe included; ``sim``: the runner's result."""

    records: list
    layers: list
    sim: object
    build_seconds: float
    built: bool

    @property
    def mismatches(self) -> int:
        return sum(r["mismatches"] for r in self.layers)

    @property
    def compared(self) -> int:
        return sum(r["compared"] for r in self.layers)


def run_host_rtl(golden_layers, arch, *, seed=None, traffic="smooth", waves=None) -> \
        HostRTLResult:
    """Run the PE programs of ``golden_layers`` on the PE's Verilog (built or reused by
    :func:`elmoe3d.sim.bench_pe.build_pe`) and check them (module docstring)."""
    import numpy as np
    from .bench_pe import build_pe
    from .runner import run
    built = build_pe(arch, waves=waves)
    cases = pe_cases(golden_layers)
    result = run(built, test_module=__name__, testcase="test_programs",
                 params={"arch": arch_param(arch), "traffic": traffic, "cases": cases},
                 seed=seed, run_name="bench_host", check=False)
    records = read_records(result)
    by_key = {tuple(r["key"]): r for r in records if r.get("key")}
    pe = arch.pe
    out = []
    for gl in golden_layers:
        compared = bad = 0
        cycles = 0
        details = []
        for g, job, res, ref in gl.jobs:
            recs = [by_key.get((gl.step, gl.layer, g, p)) for p in range(job.pes)]
            if any(r is None for r in recs):
                bad += 1
                details.append(f"group {g}: the bench reported no result for some PE")
                continue
            compared += sum(r["comparisons"] for r in recs)
            bad += sum(r["mismatches"] for r in recs)
            details += [d for r in recs for d in r.get("details", [])][:4]
            cycles = max(cycles, max(r["cycles"] for r in recs))
            data = [int(d, 16) for d in recs[job.root]["o_data"]]
            T, H = job.tokens, job.hidden
            compared += T * H + 2
            if len(data) * pe.fp32_per_beat < T * H:
                bad += T * H
                details.append(f"group {g}: only {len(data)} DATA beats from the root")
            else:
                y = job.decode(asm.unpack_fp32(asm.ints_to_words(data, pe), pe).reshape(-1))
                diff = np.asarray(y, np.float32).view(np.uint32) != \
                    np.asarray(ref.y, np.float32).view(np.uint32)
                bad += int(diff.sum())
                if diff.any():
                    details.append(f"group {g}: {int(diff.sum())} FP32 outputs differ from "
                                   f"ref_moe")
            flags = (any(r["acc_overflow"] for r in recs), any(r["vpu_saturation"]
                                                              for r in recs))
            if flags != (ref.acc_overflow, ref.vpu_saturation):
                bad += 1
                details.append(f"group {g}: flags {flags}, ref_moe "
                               f"{(ref.acc_overflow, ref.vpu_saturation)}")
        out.append({"step": gl.step, "layer": gl.layer, "cycles": cycles, "compared": compared,
                    "mismatches": bad, "details": details[:4]})
    if not records or len(records) != len(cases):
        out.append({"step": None, "layer": None, "cycles": 0, "compared": 0, "mismatches": 1,
                    "details": [f"the bench ran {len(records)} of {len(cases)} cases "
                                f"(log {result.log_file})"]})
    return HostRTLResult(records=records, layers=out, sim=result,
                         build_seconds=built.seconds, built=built.built)

"""PE program runs of golden layer-steps, and their checks: shared by the backends that run the
host's compiled programs on hardware, one PE at a time (``docs/host.md``):

* the RTL backend (``elmoe3d.sim.bench_host``: the PE's Verilog under cocotb + Verilator);
* the FPGA backend (:func:`elmoe3d.sw.host.fpga.run_host_fpga`: the PE on a board, over its UART).

:func:`pe_cases` turns the kept jobs of :func:`elmoe3d.sw.host.backends.run_golden` into one case
per PE of every busy group: its encoded program, its ``ld`` words (all sources merged, in LOAD
order), its ``link_i`` words (:func:`link_inputs`: the group's descriptors run by the golden
link model over the other PEs' ``link_o`` words) and the functional simulation's ``o`` beats
and ``link_o`` words. :func:`compare_run` checks one run of a case beat for beat;
:func:`check_layers` then decodes every group's root-PE DATA beats and compares the FP32
output and the sticky flags with ``ref_moe``, bit for bit. :func:`elmoe3d.sw.host.backends.golden.trace_golden_layers` gives
the golden layer-steps of the real routing trace that the board bench and the backends' tests
run. Plain Python + NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..golden import asm
from ..golden.asm import OKind


__all__ = ["hex_str", "link_inputs", "pe_cases", "case_ints", "compare_run", "check_layers",
           "PERunsResult"]


def hex_str(v) -> str:
    """An integer as the hex string of the cases and records (no prefix, lower case)."""
    return format(int(v), "x")


def link_inputs(job, res) -> list:
    """Each PE's ``link_i`` words of a group run: the group's descriptors applied in order
    (:func:`~elmoe3d.sw.golden.agg_link.ref_link`) to the PEs' ``link_o`` words of ``res``
    (:class:`~elmoe3d.sw.host.parallel.GroupResult`) -- what the aggregation link delivers."""
    from ..golden.agg_link import ref_link
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
    """The cases of golden layer-steps (:class:`elmoe3d.sw.host.backends.GoldenLayer` with their
    jobs kept): one per PE of every busy group, JSON-ready (integers as hex strings):
    ``{"name", "key": [step, layer, group, pe], "phase", "tokens", "experts", "program",
    "ld", "link_i", "o": [[kind, hex]], "link_o"}``."""
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
                    "program": [hex_str(c) for c in job.programs[p].encode()],
                    "ld": [hex_str(w) for w in job.ld[p]],
                    "link_i": [hex_str(w) for w in ins[p]],
                    "o": [[int(b.kind), hex_str(b.data)] for b in res.o[p]],
                    "link_o": [hex_str(w) for w in res.link_o[p]]})
    return cases


def case_ints(case) -> dict:
    """A case of :func:`pe_cases` with its hex strings parsed: ``{"program": [int], "ld":
    [int], "link_i": [int], "o": [(kind, int)], "link_o": [int]}``, what a runner sends
    (program, ld, link_i) and what :func:`compare_run` wants (o, link_o)."""
    return {"program": [int(c, 16) for c in case["program"]],
            "ld": [int(w, 16) for w in case["ld"]],
            "link_i": [int(w, 16) for w in case["link_i"]],
            "o": [(int(k), int(d, 16)) for k, d in case["o"]],
            "link_o": [int(w, 16) for w in case["link_o"]]}


def compare_run(o, link_o, want_o, want_link, errors=()) -> dict:
    """Compare one PE run with the functional simulation: ``o`` beats ``[(kind, data)]``
    (DATA bit for bit, STATUS on :data:`~elmoe3d.sw.golden.asm.FUNCTIONAL_STATUS_FIELDS`, kinds
    equal) and ``link_o`` words. ``errors``: the runner's own complaints, each a mismatch.

    Returns ``{"comparisons", "mismatches", "details", "status"}`` (``status``: the last
    STATUS beat unpacked, ``{}`` if none)."""
    details = list(errors)
    bad = len(details)
    if len(o) != len(want_o):
        bad += 1
        details.append(f"{len(o)} o beats, fsim {len(want_o)}")
    status = {}
    for i, ((kind, data), (wk, wd)) in enumerate(zip(o, want_o)):
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
                    details.append(f"STATUS.{name}: run {s[name]}, fsim {w[name]}")
    if list(link_o) != list(want_link):
        bad += 1 + sum(a != b for a, b in zip(link_o, want_link))
        details.append(f"link_o: {len(link_o)} words, fsim {len(want_link)}; differing")
    return {"comparisons": len(want_o) + len(want_link), "mismatches": bad,
            "details": details, "status": status}


def check_layers(golden_layers, by_key, pe) -> list:
    """Per layer-step of ``golden_layers``, the runs' records ``by_key`` (``(step, layer,
    group, pe) -> {"comparisons", "mismatches", "details", "cycles", "acc_overflow",
    "vpu_saturation", "o_data": [hex DATA beats]}``) totalled, and every group's root-PE
    output decoded and compared with ref_moe (FP32 bits and sticky flags).

    Returns ``[{"step", "layer", "cycles" (max over the layer-step's PEs), "compared",
    "mismatches", "details"}]``."""
    out = []
    for gl in golden_layers:
        compared = bad = 0
        cycles = 0
        details = []
        for g, job, res, ref in gl.jobs:
            recs = [by_key.get((gl.step, gl.layer, g, p)) for p in range(job.pes)]
            if any(r is None for r in recs):
                bad += 1
                details.append(f"group {g}: no result for some PE")
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
    return out



@dataclass
class PERunsResult:
    """The result of a backend that ran the cases of :func:`pe_cases`: ``records`` (one per
    run), ``layers`` (:func:`check_layers`). The RTL and FPGA backends' results extend it."""

    records: list
    layers: list

    @property
    def mismatches(self) -> int:
        """Mismatches over every layer-step (beats, link words, FP32 outputs, flags)."""
        return sum(r["mismatches"] for r in self.layers)

    @property
    def compared(self) -> int:
        """Values compared over every layer-step."""
        return sum(r["compared"] for r in self.layers)

"""The RTL backend of the host (sim.bench_host): compiled PE programs of real-trace layer-steps
(Mixtral GSM8K routing, synthetic 64x128 experts) on the PE's Verilog with the group's link
traffic from the golden link model, bit-exact against the functional simulation and ref_moe;
and the checks catch a wrong beat (bench side) and a wrong FP32 output (host side)."""

import copy
import functools

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.sim import bench_host
from elmoe3d.sw.host.backends.golden import trace_golden_layers

SMALL = preset("small")


@functools.cache
def _golden():
    return trace_golden_layers(SMALL, tokens=5)


@pytest.mark.cocotb
def test_rtl_backend_bit_exact_and_catches_errors(monkeypatch):
    steps, layers = _golden()
    draft = next(gl for gl in layers if steps[gl.step].kind == "draft")
    verify = next(gl for gl in layers if steps[gl.step].kind == "verify"
                  and any(job.info["experts"] and job.link_ops for _, job, _, _ in gl.jobs))
    # a host-side error: a copy of the verify layer whose ref_moe output is off by one ulp
    wrong = copy.copy(verify)
    g, job, res, ref = verify.jobs[0]
    bad_ref = copy.copy(ref)
    y = ref.y.copy()
    y.view(np.uint32)[0, 0] ^= 1
    bad_ref.y = y
    wrong.jobs = [(g, job, res, bad_ref)] + verify.jobs[1:]
    wrong.step = -1
    # a bench-side error: one expected o DATA beat with a flipped bit
    real_cases = bench_host.pe_cases

    def with_tampered(gls):
        cases = real_cases(gls)
        t = copy.deepcopy(next(c for c in cases if any(k == 0 for k, _ in c["o"])))
        i = next(n for n, (k, _) in enumerate(t["o"]) if k == 0)
        t["o"][i][1] = format(int(t["o"][i][1], 16) ^ (1 << 5), "x")
        t["name"], t["key"] = "tampered", None
        return cases + [t]
    monkeypatch.setattr(bench_host, "pe_cases", with_tampered)
    out = bench_host.run_host_rtl([draft, verify, wrong], SMALL, seed=11)
    by = {(r["step"], r["layer"]): r for r in out.layers}
    assert by[(draft.step, draft.layer)]["mismatches"] == 0
    assert by[(verify.step, verify.layer)]["mismatches"] == 0
    assert by[(draft.step, draft.layer)]["compared"] > 0
    assert by[(verify.step, verify.layer)]["cycles"] > 0
    assert by[(-1, verify.layer)]["mismatches"] == 1          # the one-ulp output
    tampered = [r for r in out.records if r["case"] == "tampered"]
    assert len(tampered) == 1 and tampered[0]["mismatches"] >= 1
    assert all(r["mismatches"] == 0 for r in out.records if r["case"] != "tampered")
    # every PE of every group ran, link words included
    n_pe = sum(job.pes for gl in (draft, verify, wrong) for _, job, _, _ in gl.jobs)
    assert len(out.records) == n_pe + 1

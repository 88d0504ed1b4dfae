"""Backends that run the host's compiled steps (:mod:`.host`; ``docs/host.md``).

* :func:`run_perf` -- the analytical performance model (:class:`.perf.PerfModel`) over every
  step: per-step latency (cycles, us), bytes per tier, hit rates, energy.
* :func:`run_golden` -- the programs of every layer-step (:func:`.host.compile_layer`: one
  :class:`~.parallel.GroupJob` per busy group) on the multi-PE functional simulation
  (:func:`.parallel.run_group`), each group's FP32 output, Q.24 sums and sticky flags checked
  bit for bit against :func:`.expert.ref_moe` with the group's routing; the bytes each tier
  moves are the programs' (:meth:`~.parallel.GroupJob.traffic`) and the pool updates' HB
  payloads (:func:`.host.slice_images`).
* The RTL backend runs the same :class:`GoldenLayer` jobs on the PE's Verilog
  (``elmoe3d.sim.bench_host``; cocotb stays out of ``sw/``), the FPGA backend on a board over
  its UART (:func:`.fpga.run_host_fpga`); both check them with :mod:`.pe_runs`.

Both return one record (a plain dict, JSON-ready) per step; :func:`summarise` totals them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .compiler import Step, SyntheticWeights, compile_layer, slice_images
from .perf import PerfModel


__all__ = ["GoldenLayer", "run_golden", "run_perf", "summarise", "step_record"]


def _hit(acc, hits):
    return hits / acc if acc else None


def step_record(step: Step, *, cycles=None, us=None, hb_read=0.0, hb_write=0.0, ext=0.0,
                link=0.0, energy_pj=None, hb_pj=None, ext_pj=None, accesses=0, hits=0,
                **extra) -> dict:
    """The per-step record every backend emits (bytes over the whole die)."""
    rec = {"step": step.index, "kind": step.kind, "iteration": step.iteration,
           "tokens": len(step.tokens), "produced": step.produced,
           "layers": len(step.layers), "cycles": cycles, "us": us,
           "hb_read_bytes": float(hb_read), "hb_write_bytes": float(hb_write),
           "ext_bytes": float(ext), "link_bytes": float(link),
           "energy_pj": energy_pj, "hb_energy_pj": hb_pj, "ext_energy_pj": ext_pj,
           "accesses": int(accesses), "hits": int(hits), "hit_rate": _hit(accesses, hits),
           "pool_writes": len(step.writes), "pool_extra": sum(w.extra for w in step.writes)}
    rec.update(extra)
    return rec


def run_perf(steps, arch, model, *, progress=None) -> list:
    """Perf-model records of ``steps`` (model: the preset whose shapes run)."""
    pm = PerfModel(arch, model)
    out = []
    for step in steps:
        c = pm.step(step, step.placements)
        out.append(step_record(step, cycles=c.cycles, us=c.us, hb_read=c.hb_read_bytes,
                               hb_write=c.hb_write_bytes, ext=c.ext_bytes, link=c.link_bytes,
                               energy_pj=c.energy_pj, hb_pj=c.hb_energy_pj,
                               ext_pj=c.ext_energy_pj, accesses=c.accesses, hits=c.hits,
                               bounds=c.bounds, gemm_beats=c.tile_cycles))
        if progress:
            progress(step)
    return out


@dataclass(eq=False)
class GoldenLayer:
    """One layer-step on the functional simulation: ``jobs`` = ``[(group, GroupJob,
    GroupResult, ExpertResult of ref_moe)]``; ``y`` the host's sum of the groups' outputs."""

    step: int
    layer: int
    jobs: list
    y: np.ndarray
    compared: int
    mismatches: int
    details: list


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def run_layer_golden(step: Step, layer: int, weights: SyntheticWeights, arch) -> GoldenLayer:
    """Compile and run one layer-step; compare every group with ref_moe."""
    from ..golden.expert import ref_moe
    from .parallel import run_group
    work = step.layers[layer]
    x = weights.x(layer, step.tokens)
    exs = weights.experts(layer)
    jobs = []
    compared = bad = 0
    details = []
    y = np.zeros((len(step.tokens), weights.model.hidden), np.float32)
    for g, job in compile_layer(step, work, step.placements[layer], weights, arch):
        res = run_group(job)
        ref = ref_moe(x, exs, job.info["routing"], job.mode)
        n = (_bits(res.y) != _bits(ref.y)).sum() + (res.out != ref.out).sum()
        n += (res.acc_overflow != ref.acc_overflow) + (res.vpu_saturation != ref.vpu_saturation)
        compared += 2 * ref.y.size + 2
        bad += int(n)
        if n:
            details.append(f"step {step.index} layer {layer} group {g}: {int(n)} values differ "
                           f"from ref_moe")
        y = y + res.y
        jobs.append((g, job, res, ref))
    return GoldenLayer(step=step.index, layer=layer, jobs=jobs, y=y, compared=compared,
                       mismatches=bad, details=details)


def traffic_bytes(jobs, pe) -> dict:
    """Bytes of a layer-step's programs: HB reads (all banks), EXT ring bytes (multicast
    once), link bytes (descriptor words x word bytes), tile beats (STATUS ``gemm_beats``)."""
    hb = ext = link = beats = 0
    for _, job, res, _ in jobs:
        tr = job.traffic()
        hb += sum(sum(h.values()) for h in tr["hb_bytes"])
        ext += sum(tr["ext_ring_bytes"].values())
        link += sum(op.words for op in job.link_ops) * pe.word_bytes
        beats += sum(int(s["gemm_beats"]) for s in res.statuses)
    return {"hb": hb, "ext": ext, "link": link, "beats": beats}


def run_golden(steps, weights: SyntheticWeights, arch, *, keep=False, progress=None) -> tuple:
    """Run every layer-step of ``steps`` on the functional simulation (module docstring).
    Returns ``(records, layers)``: one record per step, and the :class:`GoldenLayer` list
    (their jobs kept only with ``keep``, for the RTL backend)."""
    pe = arch.pe
    records, layers = [], []
    for step in steps:
        hb = ext = link = beats = 0
        acc = hits = compared = bad = 0
        details = []
        for lay in sorted(step.layers):
            gl = run_layer_golden(step, lay, weights, arch)
            t = traffic_bytes(gl.jobs, pe)
            hb, ext, link, beats = hb + t["hb"], ext + t["ext"], link + t["link"], \
                beats + t["beats"]
            work = step.layers[lay]
            acc += len(work.routed())
            hits += len(set(work.routed()) & work.cached)
            compared += gl.compared
            bad += gl.mismatches
            details += gl.details
            if not keep:
                gl.jobs = [(g, None, None, None) for g, *_ in gl.jobs]
            layers.append(gl)
        # pool-update payloads: the slice words each bank of the home group receives
        writes = 0
        for w in step.writes:
            imgs = slice_images(w.key[0], w.key[1], weights, arch)
            writes += sum(len(img) for img in imgs) * pe.word_bytes
        extra = sum(w.extra for w in step.writes) * weights.model.expert_msb_bytes
        hb_pj, ext_pj = arch.access_energy_pj(hb + writes, ext + extra)
        records.append(step_record(step, hb_read=hb, hb_write=writes, ext=ext + extra,
                                   link=link, accesses=acc, hits=hits, compared=compared,
                                   mismatches=bad, details=details[:4], gemm_beats=beats,
                                   hb_pj=hb_pj, ext_pj=ext_pj, energy_pj=hb_pj + ext_pj))
        if progress:
            progress(step)
    return records, layers


def summarise(records, arch) -> dict:
    """Totals of a backend's step records: steps, tokens produced, cycles and us (when
    timed), bytes per tier, hit rate over the non-draft steps, energy, mismatches."""
    tot = {k: sum(r[k] or 0 for r in records) for k in
           ("hb_read_bytes", "hb_write_bytes", "ext_bytes", "link_bytes", "produced",
            "accesses", "hits", "pool_writes", "pool_extra")}
    nd = [r for r in records if r["kind"] != "draft"]
    acc = sum(r["accesses"] for r in nd)
    tot["hit_rate"] = _hit(acc, sum(r["hits"] for r in nd))
    tot["steps"] = len(records)
    tot["kinds"] = {k: sum(1 for r in records if r["kind"] == k)
                    for k in sorted({r["kind"] for r in records})}
    if records and all(r["cycles"] is not None for r in records):
        cyc = sum(r["cycles"] for r in records)
        tot["cycles"] = cyc
        tot["us"] = arch.cycles_to_us(cyc)
        tot["tokens_per_s"] = tot["produced"] / (tot["us"] * 1e-6) if cyc else None
        tot["us_per_token"] = tot["us"] / tot["produced"] if tot["produced"] else None
    if records and all(r["energy_pj"] is not None for r in records):
        tot["energy_pj"] = sum(r["energy_pj"] for r in records)
        tot["hb_energy_pj"] = sum(r["hb_energy_pj"] for r in records)
        tot["ext_energy_pj"] = sum(r["ext_energy_pj"] for r in records)
        tot["energy_mj_per_token"] = (tot["energy_pj"] * 1e-9 / tot["produced"]
                                      if tot["produced"] else None)
    if any("mismatches" in r for r in records):
        tot["compared"] = sum(r.get("compared", 0) for r in records)
        tot["mismatches"] = sum(r.get("mismatches", 0) for r in records)
    return tot

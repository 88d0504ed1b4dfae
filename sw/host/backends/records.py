"""What every run backend reports, and the helpers the backends share (``docs/host.md``).

* :func:`step_record` -- the per-step record every backend emits: a plain dict, JSON-ready;
  bytes over the whole die, cycles and us when the backend times the step.
* :func:`summarise` -- the totals of a run's records.
* :class:`GoldenLayer` -- one layer-step of the golden run (:mod:`.golden`), the unit the RTL
  and FPGA backends run again on hardware; :func:`traffic_bytes` -- the bytes its programs
  move per tier.
* :func:`merge_layers` -- a hardware backend's per-layer-step results added to the golden
  records.
* :func:`format_bytes` -- a byte count as the run's tables and report lines print it.

Plain Python + NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


__all__ = ["step_record", "summarise", "GoldenLayer", "traffic_bytes", "merge_layers",
           "format_bytes"]


def _hit(acc, hits):
    return hits / acc if acc else None


def _extra(writes) -> int:
    """Pool writes no EXT stream carried (an array's count for :class:`~..compiler.PoolWrites`)."""
    x = getattr(writes, "extra", None)
    if x is not None:
        return int(np.count_nonzero(x))
    return sum(w.extra for w in writes)


def step_record(step, *, cycles=None, us=None, hb_read=0.0, hb_write=0.0, ext=0.0,
                link=0.0, energy_pj=None, hb_pj=None, ext_pj=None, accesses=0, hits=0,
                **extra) -> dict:
    """The per-step record every backend emits for ``step`` (:class:`~..compiler.Step`):
    bytes over the whole die (``hb_read``, ``hb_write``, ``ext``, ``link``), ``cycles`` and
    ``us`` (None: untimed), energies in pJ (None: not estimated), expert reads
    (``accesses``) and HB hits; ``extra`` entries are added as they are."""
    rec = {"step": step.index, "kind": step.kind, "iteration": step.iteration,
           "tokens": len(step.tokens), "produced": step.produced,
           "layers": len(step.layers), "cycles": cycles, "us": us,
           "hb_read_bytes": float(hb_read), "hb_write_bytes": float(hb_write),
           "ext_bytes": float(ext), "link_bytes": float(link),
           "energy_pj": energy_pj, "hb_energy_pj": hb_pj, "ext_energy_pj": ext_pj,
           "accesses": int(accesses), "hits": int(hits), "hit_rate": _hit(accesses, hits),
           "pool_writes": len(step.writes), "pool_extra": _extra(step.writes)}
    rec.update(extra)
    return rec


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


def merge_layers(recs, layer_results, arch, *, timed) -> dict | None:
    """Add a hardware backend's per-layer-step results (``[{"step", "layer", "cycles",
    "compared", "mismatches", "details"}]``, :func:`~..pe_runs.check_layers`) to the golden
    step records ``recs``, in place: compared, mismatches, details (the golden run's own
    mismatches kept as ``golden_mismatches``); cycles and us when ``timed``. Returns the
    results of no step (``"step": None``: a bench that lost cases), or None."""
    per_step = {}
    for lr in layer_results:
        s = per_step.setdefault(lr["step"], {"cycles": 0, "compared": 0, "mismatches": 0,
                                             "details": []})
        s["cycles"] += lr["cycles"]
        s["compared"] += lr["compared"]
        s["mismatches"] += lr["mismatches"]
        s["details"] += lr["details"]
    for r in recs:
        s = per_step.pop(r["step"], None)
        if s:
            if timed:
                r["cycles"] = s["cycles"]
                r["us"] = arch.cycles_to_us(s["cycles"])
            r["golden_mismatches"] = r["mismatches"]
            r["compared"] += s["compared"]
            r["mismatches"] += s["mismatches"]
            r["details"] = (r["details"] + s["details"])[:4]
    return per_step.pop(None, None)


def format_bytes(x) -> str:
    """``x`` bytes in TB, GB, MB, kB (two decimals) or B; ``"-"`` for None."""
    if x is None:
        return "-"
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:.0f} B"

"""The perf backend: the analytical performance model (:class:`elmoe3d.sw.host.perf.PerfModel`)
over every step (``docs/host.md``, "Performance model"): per-step latency (cycles, us), bytes
per tier, hit rates, energy. Any configuration; plain Python + NumPy.
"""

from __future__ import annotations

from ..perf import PerfModel
from . import Backend, BackendRun, RunContext
from .records import step_record


__all__ = ["PerfBackend", "run_perf"]


#: Steps :func:`run_perf` hands :meth:`~elmoe3d.sw.host.perf.PerfModel.steps_summary` at once
#: (its arrays hold every layer of them: a few MB at the paper models' sizes).
CHUNK_STEPS = 64


def run_perf(steps, arch, model, *, progress=None) -> list:
    """Perf-model records of ``steps`` (``model``: the preset whose shapes run; each record
    adds the layer-steps' ``bounds`` and the tile's ``gemm_beats``), :data:`CHUNK_STEPS` steps
    at a time. ``progress(step)`` is called after each step. Raises ``ValueError`` when the
    model cannot map ``model``."""
    pm = PerfModel(arch, model)
    steps = list(steps)
    out = []
    for c0 in range(0, len(steps), CHUNK_STEPS):
        chunk = steps[c0:c0 + CHUNK_STEPS]
        for step, c in zip(chunk, pm.steps_summary(chunk)):
            out.append(step_record(step, cycles=c.cycles, us=c.us, hb_read=c.hb_read_bytes,
                                   hb_write=c.hb_write_bytes, ext=c.ext_bytes,
                                   link=c.link_bytes, energy_pj=c.energy_pj,
                                   hb_pj=c.hb_energy_pj, ext_pj=c.ext_energy_pj,
                                   accesses=c.accesses, hits=c.hits, bounds=c.bounds,
                                   gemm_beats=c.tile_cycles))
            if progress:
                progress(step)
    return out


class PerfBackend(Backend):
    """``perf``: :func:`run_perf` on the run's model shapes; every configuration."""

    name = "perf"
    description = ("the analytical performance model: per-step latency, bytes per tier, hit "
                   "rates, energy")
    perf_beside = False

    def run(self, steps, ctx: RunContext) -> BackendRun:
        return BackendRun(records=run_perf(steps, ctx.arch, ctx.model, progress=ctx.progress))

"""The perf backend: the analytical performance model (:class:`elmoe3d.sw.host.perf.PerfModel`)
over every step (``docs/host.md``, "Performance model"): per-step latency (cycles, us), bytes
per tier, hit rates, energy. Any configuration; plain Python + NumPy.
"""

from __future__ import annotations

from ..perf import PerfModel
from . import Backend, BackendRun, RunContext
from .records import step_record


__all__ = ["PerfBackend", "run_perf", "compute_figures"]


#: Layer-steps :func:`run_perf` hands :meth:`~elmoe3d.sw.host.perf.PerfModel.steps_summary`
#: at once (whole steps, at least one): its arrays hold every layer of them, and beyond about
#: a thousand rows they outgrow the CPU's caches (on Qwen3-30B-A3B's 48 layers x 128 experts,
#: 64 steps at once took 8.1 ms, the same steps 1,024 rows at a time 5.9 ms).
CHUNK_ROWS = 1024


def _chunks(steps) -> list:
    """``steps`` cut into runs of whole steps of at most :data:`CHUNK_ROWS` layers (a longer
    step alone)."""
    out, cur, rows = [], [], 0
    for st in steps:
        n = len(st.layers)
        if cur and rows + n > CHUNK_ROWS:
            out.append(cur)
            cur, rows = [], 0
        cur.append(st)
        rows += n
    return out + ([cur] if cur else [])


def run_perf(steps, arch, model, *, feed="die", progress=None) -> list:
    """Perf-model records of ``steps`` (``model``: the preset whose shapes run; each record
    adds the layer-steps' ``bounds`` and the tile's ``gemm_beats``), :data:`CHUNK_ROWS`
    layer-steps at a time. ``progress(step)`` is called after each step. Raises
    ``ValueError`` when the model cannot map ``model``, and for steps that do not fit
    ``model`` or ``arch`` (scheduled for another: a layer, expert id, group or top-k outside
    theirs; :meth:`~elmoe3d.sw.host.perf.PerfModel.steps_summary`)."""
    pm = PerfModel(arch, model, feed=feed)
    steps = list(steps)
    pm._check_top_k(steps)                      # once (steps_summary would, a chunk each)
    out = []
    for chunk in _chunks(steps):
        for step, c in zip(chunk, pm._steps_summary(chunk)):
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
    perf_feed = "die"

    def run(self, steps, ctx: RunContext) -> BackendRun:
        recs = run_perf(steps, ctx.arch, ctx.model, progress=ctx.progress)
        return BackendRun(records=recs, figures=compute_figures(ctx.arch, ctx.model))

    def report(self, label: str, figures: dict) -> list:
        return [f"{label}: perf model {figures['compute']}"]


def compute_figures(arch, model, feed="die") -> dict:
    """``{"compute_source", "compute", "feed"}``: where the perf model's compute term comes
    from on ``arch`` and ``model`` at ``feed`` (:class:`~elmoe3d.sw.host.perf_calib.ComputeCycles`:
    ``"programs"``, ``"ffn"`` or ``"roofline"``, the fallback to MACs / peak) and that as one
    line."""
    from ..models import model_preset
    from ..perf_calib import compute_cycles
    c = compute_cycles(arch, model_preset(model), feed)
    return {"compute_source": c.source, "compute": c.note, "feed": feed}

"""The golden backend: the host's compiled programs on the functional simulation
(``docs/host.md``, "Golden and RTL backends").

:func:`run_golden` runs the programs of every layer-step (:func:`~..compiler.compile_layer`:
one :class:`~..parallel.GroupJob` per busy group) on the multi-PE functional simulation
(:func:`~..parallel.run_group`), each group's FP32 output, Q.24 sums and sticky flags checked
bit for bit against :func:`~elmoe3d.sw.golden.expert.ref_moe` with the group's routing; the
bytes each tier moves are the programs' (:func:`.records.traffic_bytes`) and the pool updates'
HB payloads (:func:`~..compiler.slice_images`). The RTL and FPGA backends
(:class:`GoldenBackend` subclasses) run the same :class:`~.records.GoldenLayer` jobs again on
hardware and check them with :mod:`..pe_runs`.

Small configuration only (synthetic weights at the golden model's shapes; the trace's real
routing). Plain Python + NumPy.
"""

from __future__ import annotations

import numpy as np

from ..compiler import SyntheticWeights, compile_layer, slice_images
from . import Backend, BackendRun, RunContext
from .records import GoldenLayer, step_record, traffic_bytes


__all__ = ["GoldenBackend", "run_golden", "run_layer_golden", "trace_steps",
           "trace_golden_layers", "TRACE_WEIGHTS_SEED"]


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def run_layer_golden(step, layer: int, weights: SyntheticWeights, arch) -> GoldenLayer:
    """Compile and run one layer-step (``step``: :class:`~..compiler.Step`); compare every
    group with ref_moe."""
    from ...golden.expert import ref_moe
    from ..parallel import run_group
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


def run_golden(steps, weights: SyntheticWeights, arch, *, keep=False, progress=None) -> tuple:
    """Run every layer-step of ``steps`` on the functional simulation (module docstring).
    Returns ``(records, layers)``: one record per step, and the :class:`GoldenLayer` list
    (their jobs kept only with ``keep``, for the RTL and FPGA backends). ``progress(step)``
    is called after each step."""
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


class GoldenBackend(Backend):
    """``golden``: :func:`run_golden` over the steps, synthetic weights of the run's seed.
    Records: bytes per tier, hit rates, energy, ``compared`` / ``mismatches`` (no cycles)."""

    name = "golden"
    description = ("the per-PE programs on the multi-PE functional simulation, every group "
                   "checked bit for bit against ref_moe")
    small_only = True
    reference = "ref_moe"

    def golden(self, steps, ctx: RunContext) -> tuple:
        """:func:`run_golden` of ``steps`` (``(records, layers)``), the jobs kept when
        :attr:`keeps_golden`."""
        return run_golden(steps, SyntheticWeights(ctx.model, seed=ctx.seed), ctx.arch,
                          keep=self.keeps_golden, progress=ctx.progress)

    def run(self, steps, ctx: RunContext) -> BackendRun:
        records, _ = self.golden(steps, ctx)
        return BackendRun(records=records)


#: The seed of the synthetic experts the real traces' golden layer-steps run with.
TRACE_WEIGHTS_SEED = 7


def trace_steps(trace, arch, *, layers, depth: int = 2, slots: int = 32, batch: int = 1,
                shape=None) -> tuple:
    """``(steps, weights)``: the Elastic-SD layer-steps of the real Mixtral-8x7B routing
    ``trace`` (a :class:`~elmoe3d.sw.host.trace.RoutingTrace`, checked against the preset:
    :class:`~elmoe3d.errors.UserError` otherwise) at MoE ``layers``, for the groups of ``arch``
    (:class:`~elmoe3d.config.ArchConfig`): depth ``depth``, coverage acceptance 0.5, an HB
    cache of ``slots`` experts' MSB slices without admission, ``batch`` requests in lockstep
    (:func:`~elmoe3d.sw.host.compiler.elastic_steps`: autoregressive, draft and verify steps);
    ``weights`` the synthetic experts of ``shape`` = (hidden, intermediate) (default
    :data:`~elmoe3d.sw.host.compiler.SYNTHETIC_SHAPE`), seed :data:`TRACE_WEIGHTS_SEED`
    (:class:`~elmoe3d.sw.host.compiler.SyntheticWeights`). The routing, hence the pool, the
    hits and misses, are the trace's, the experts' placement on the groups the host's policy
    (:func:`~elmoe3d.sw.host.compiler.place_layer`) on it; the weights and activations are
    synthetic."""
    from .. import compiler
    from ..corpus import ROUTING_MODEL
    from ..elastic_sd import CoverageAcceptance, ElasticSD
    from ..hbcache import HBExpertCache
    mix = compiler.check_model_trace(trace, ROUTING_MODEL)
    sm = compiler.synthetic_model(mix, compiler.SYNTHETIC_SHAPE if shape is None else shape)
    cache = HBExpertCache(capacity_bytes=slots * sm.expert_msb_bytes, model=sm, admit=False)
    esd = ElasticSD(cache=cache, depth=depth, acceptance=CoverageAcceptance(0.5))
    steps, _ = compiler.elastic_steps(trace, esd, layers=list(layers), groups=arch.groups,
                                      batch=batch)
    return steps, compiler.SyntheticWeights(sm, seed=TRACE_WEIGHTS_SEED)


def trace_golden_layers(arch, *, tokens: int, layer: int = 15, shape=None) -> tuple:
    """``(steps, layers)``: the golden layer-steps of the real Mixtral GSM8K routing trace
    (``gsm8k_2_routing.jsonl`` in :func:`~elmoe3d.sw.host.corpus.traces_dir`), its first
    ``tokens`` decode tokens, MoE layer ``layer``, by :func:`trace_steps`' defaults (Elastic-SD
    depth 2, coverage acceptance 0.5, an HB cache of 32 experts' MSB slices, no admission)
    for the groups of ``arch`` (:class:`~elmoe3d.config.ArchConfig`); synthetic experts of
    ``shape`` = (hidden, intermediate) (default
    :data:`~elmoe3d.sw.host.compiler.SYNTHETIC_SHAPE`), weights seed
    :data:`TRACE_WEIGHTS_SEED`. ``layers`` are the :class:`GoldenLayer` of :func:`run_golden`
    with the jobs kept."""
    from ..compiler import limit_tokens
    from ..corpus import ROUTING_MODEL, routing_path
    from ..trace import import_vllm_jsonl
    tr, _ = import_vllm_jsonl(routing_path("gsm8k"), model=ROUTING_MODEL)
    steps, weights = trace_steps(limit_tokens(tr, tokens), arch, layers=[layer], shape=shape)
    _, layers = run_golden(steps, weights, arch, keep=True)
    return steps, layers

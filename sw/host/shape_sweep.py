"""Every model preset's real expert shape on the functional simulator: the one-PE streamed
program on ``mid`` and the 4-PE group program on the paper PE, at 1, 4 and 16 tokens, DRAFT and
FULL, each checked bit for bit against :func:`~elmoe3d.sw.golden.expert.ref_moe` (issue 24;
``docs/pe.md`` "Real expert shapes"). Weights are synthetic (seeded normal, the real shapes);
a shape a PE cannot stage is reported with the builder's one-line error.

``python -m elmoe3d.sw.host.shape_sweep [--jobs N] [--models a,b] [--tokens 1,4,16]`` prints
the table; ``make bench`` prints it as a figure.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from ...checks import parse_int
from ...config import preset
from ..golden.asm import ProgramError
from ..golden.datapath import Mode
from ..golden.expert import Expert, ref_moe
from ..golden.expert_stream import build_streamed_expert_program, plan_expert_stream
from .models import MODEL_PRESETS


__all__ = ["SweepCase", "sweep_cases", "run_case", "run_sweep", "synthetic_expert", "main"]

#: (preset, how): one PE of ``mid``, or an aggregation group of paper PEs; a shape that does
#: not fit runs on the preset's :func:`~.stream_group.fitting_config`
TARGETS = (("mid", "one PE"), ("paper-4gb", "group"))
SEED = 24


@dataclass(frozen=True)
class SweepCase:
    model: str
    arch: str
    tokens: int
    mode: str


def sweep_cases(models=None, tokens=(1, 4, 16), modes=("DRAFT", "FULL")) -> list:
    """The cases of the sweep: every SwiGLU preset (or ``models``) x target x tokens x mode."""
    names = models or sorted(n for n, p in MODEL_PRESETS.items() if p.ffn == "swiglu")
    for n in names:
        if n not in MODEL_PRESETS:
            raise ValueError(f"models: unknown model {n!r}; models are "
                             f"{', '.join(sorted(MODEL_PRESETS))}")
    return [SweepCase(n, arch, t, m) for n in names for arch, _ in TARGETS for t in tokens
            for m in modes]


def synthetic_expert(hidden: int, intermediate: int, tokens: int, seed) -> tuple:
    """``(x [T, H] float32, Expert, gate weights [T] float32)``: seeded normal weights
    (std 0.05) and inputs (std 1) and uniform gate weights in 0.1..1, in a real shape. The
    synthetic case of the sweep and of the tests (labelled synthetic wherever reported)."""
    rng = np.random.default_rng(seed)
    wu, wg = (rng.standard_normal((intermediate, hidden)).astype(np.float32) * 0.05
              for _ in range(2))
    wd = rng.standard_normal((hidden, intermediate)).astype(np.float32) * 0.05
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    gw = rng.uniform(0.1, 1.0, tokens).astype(np.float32)
    return x, Expert.quantize(wu, wg, wd), gw


def _weights(model, tokens):
    p = MODEL_PRESETS[model]
    H, I = p.hidden, p.expert_intermediate
    return synthetic_expert(H, I, tokens, [SEED, H, I, tokens])


def run_case(case: SweepCase) -> dict:
    """Build and run one case; returns a record: ``status`` ("bit-exact", "MISMATCH" or
    "refused"), ``config`` (the configuration it ran on), ``compared`` / ``mismatches`` (FP32
    outputs), ``pes`` (1, or the group's PEs), ``passes``, ``x_stream``, ``ld_words`` and
    ``gemm_beats`` (per PE: the root's for a group), ``error``. A ``mid`` case runs the
    one-PE program; a paper case the preset's aggregation group. A shape that does not fit
    runs on :func:`~.stream_group.fitting_config` of the preset (the smallest group, then an
    IOMEM split that holds it: a different hardware configuration, named in ``config``);
    refused when none does."""
    from .parallel import run_group
    from .stream_group import compile_expert_group, fitting_config, plan_group
    rec = {"model": case.model, "arch": case.arch, "tokens": case.tokens, "mode": case.mode,
           "shape": f"{MODEL_PRESETS[case.model].hidden}x"
                    f"{MODEL_PRESETS[case.model].expert_intermediate}"}
    mode = Mode[case.mode]
    cfg = preset(case.arch)
    p = MODEL_PRESETS[case.model]
    single = case.arch == "mid"
    try:                                  # refused before any weight is built
        if single:
            plan_expert_stream(p.hidden, p.expert_intermediate, cfg)
        else:
            plan_group(p.hidden, p.expert_intermediate, cfg.pe, cfg.pes_per_group)
    except ProgramError as e:
        fit = fitting_config(p.hidden, p.expert_intermediate, cfg)
        if fit is None:
            return dict(rec, status="refused", config=cfg.name, pes=0, compared=0,
                        mismatches=0, error=f"{e}; no aggregation group of the die's "
                                            f"{cfg.pes} PEs holds it under any IOMEM split")
        cfg, single = fit, False
    rec.update(config=cfg.name, pes=1 if single else cfg.pes_per_group)
    x, ex, gw = _weights(case.model, case.tokens)
    try:
        if single:
            job = build_streamed_expert_program(x, ex, gw, mode, cfg)
            y = job.decode(job.run_fsim())
            info = job.info
        else:
            job = compile_expert_group(x, ex, gw, mode, cfg)
            y = run_group(job).y
            info = job.info["per_pe"][job.root]
    except ProgramError as e:
        return dict(rec, status="refused", error=str(e), compared=0, mismatches=0)
    t = len(x)
    ref = ref_moe(x, [ex], (np.zeros((t, 1), np.int64), gw.astype(np.float16)[:, None]), mode)
    bad = int((y.view(np.uint32) != ref.y.view(np.uint32)).sum())
    return dict(rec, status="bit-exact" if bad == 0 else "MISMATCH", compared=int(y.size),
                mismatches=bad, passes=info["passes"], x_stream=info["x_stream"],
                ld_words=info["ld_words"], gemm_beats=info["gemm_beats"], error="")


def run_sweep(cases, jobs: int = 1) -> list:
    """Records of :func:`run_case` for ``cases``, in order (``jobs`` worker processes)."""
    if jobs <= 1:
        return [run_case(c) for c in cases]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(run_case, cases))


def table(records) -> str:
    lines = ["| model (H x I) | PE | tokens | mode | passes | x | result |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        how = "one PE" if r["pes"] == 1 else f"{r['pes']}-PE group"
        if r["status"] == "refused":
            lines.append(f"| {r['model']} ({r['shape']}) | {r['config']} {how} | {r['tokens']} | "
                         f"{r['mode']} | - | - | refused: {r['error']} |")
            continue
        x = "streamed" if r["x_stream"] else "resident"
        lines.append(f"| {r['model']} ({r['shape']}) | {r['config']} {how} | {r['tokens']} | "
                     f"{r['mode']} | {r['passes']} | {x} | {r['status']}: "
                     f"{r['compared'] - r['mismatches']}/{r['compared']} FP32 outputs |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m elmoe3d.sw.host.shape_sweep",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="2", metavar="N",
                    help="worker processes, a positive integer (default 2)")
    ap.add_argument("--models", default="", help="comma-separated model presets (default all "
                                                 "SwiGLU presets)")
    ap.add_argument("--tokens", default="1,4,16", metavar="T[,T...]",
                    help="comma-separated token counts of each case, positive integers "
                         "(default 1,4,16)")
    args = ap.parse_args(argv)
    try:
        jobs = parse_int("--jobs", args.jobs, lo=1)
        tokens = tuple(parse_int("--tokens", t, lo=1) for t in args.tokens.split(","))
        cases = sweep_cases([m for m in args.models.split(",") if m] or None, tokens)
    except ValueError as e:
        print(f"shape_sweep: {e}", file=sys.stderr)
        return 2
    recs = run_sweep(cases, jobs)
    print(table(recs))
    bad = [r for r in recs if r["status"] == "MISMATCH"]
    ok = sum(r["status"] == "bit-exact" for r in recs)
    print(f"{ok} cases bit-exact, {len(bad)} mismatching, "
          f"{sum(r['status'] == 'refused' for r in recs)} refused; "
          f"{sum(r['compared'] for r in recs)} FP32 outputs compared")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

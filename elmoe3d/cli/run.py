"""``elmoe3d run``: drive the design from a routing trace (``docs/host.md``).

::

    elmoe3d run --trace FILE --model PRESET --config small|paper-4gb|paper-8gb
                --backend golden|rtl|fpga|perf [--port PORT [--baud B] [--deadline S]]
                [--layers SLICE] [--tokens N]
                [--schedule elastic|replay] [--depth D [D ...]] [--acceptance RULE]
                [--batch B] [--hb-slots N] [--dense-bytes B] [--kv-bytes B] [--seed S]
                [--json F] [--csv F] [--plot DIR]

The trace (a vLLM-style JSONL routing log, or the canonical ``.npz`` of
:mod:`elmoe3d.sw.host.trace`; ``gsm8k`` and ``humaneval`` stand for the real Mixtral traces in
``../shared/traces`` or ``$ELMOE3D_TRACES``) is scheduled into steps
(:mod:`elmoe3d.sw.host.compiler`): Elastic-SD (default; one run per ``--depth``) or a plain
replay through the LRU cache. Every step's expert work is placed on the die's PE groups and
compiled, then run by a backend of the registry :data:`elmoe3d.sw.host.backends.BACKENDS`
(which also says which configurations and options each takes, and refuses the rest):

* ``perf`` -- the analytical model (:mod:`elmoe3d.sw.host.perf`) on the model's real shapes (on
  ``small``, the synthetic shapes the golden and RTL backends run): per-step latency (cycles,
  us), bytes per tier (HB read/write, EXT, link), hit rates, energy; and how many trace tokens
  the model simulates per second of wall time;
* ``golden`` -- the per-PE programs on the multi-PE functional simulation, every group's
  output checked bit for bit against ``ref_moe`` (``small`` only; synthetic weights at
  H x I = 64 x 128, the trace's real routing);
* ``rtl`` -- the golden run, then every PE program on the PE's Verilog (cocotb + Verilator)
  with the link traffic of the golden link model, every ``o`` beat and link word and the
  FP32 outputs checked bit for bit (``small`` only);
* ``fpga`` -- the golden run, then every PE program on the FPGA board at ``--port`` (its UART,
  ``--baud``; :mod:`elmoe3d.sw.host.fpga`, ``docs/fpga.md``), checked exactly as ``rtl``'s
  (``small`` only; the board must be built for the same configuration: its INFO is checked).
  ``--deadline S``: each PE program gets S seconds (default 10) plus 20 times its bytes' wire
  time at ``--baud``; the first program that misses it stops the run (status 2, the program
  named).

``--layers`` picks the layers compiled and reported (``A:B``, ``A:B:S``, ``N``, ``A,B``; the
cache and Elastic-SD still see every layer); ``--tokens N`` keeps the trace's first N tokens.
Outputs: a summary table (and one row per run), ``--json`` (everything, per step),
``--csv`` (one row per step), ``--plot DIR`` (``hit_rate.png``, ``bytes_per_tier.png``,
``latency.png``; DIR and its missing parents are created); all are checked before the run (an
output that is another output or the trace file, also through a link, is refused) and written
atomically after it, so a failed run leaves none (nor a folder it created).

``--hb-slots 0`` runs with no expert cache: every expert is streamed from EXT (hit rate 0).
Elastic-SD then has no pool to draft from, so its draft cannot run: every token is decoded
autoregressively (``ar`` steps, FULL, original routing) and the output says so; a replay
admits nothing.

Exit status: 0; 1 only when a golden, RTL or FPGA comparison found a mismatch; 2 on bad input
or a request the backend cannot serve (one line naming the option, before anything runs);
3 on an internal error (a bug: the traceback is printed).
"""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path

from ..checks import check_int, did_you_mean
from ..errors import UserError
from ..sw.host.backends import (BACKENDS, SMALL_CONFIG, RunContext, backend_options,
                                check_request, run_perf, summarise)
from ..sw.host.backends.records import format_bytes as _b
from ..sw.host.backends.perf import compute_figures
from ..sw.host.corpus import ROUTING_FILES, ROUTING_MODEL
from . import bytes_type, fill_defaults, seed_type
from .outputs import (atomic_outputs, check_distinct, check_output, check_output_dir, output_dir,
                      output_path, report_console)


__all__ = ["configure", "run", "resolve_trace", "parse_acceptance", "CONFIGS", "BACKENDS",
           "execute"]

CONFIGS = (SMALL_CONFIG, "paper-4gb", "paper-8gb")
#: ``--backend``'s default.
DEFAULT_BACKEND = "perf"
#: Defaults of ``--traffic``, ``--depth`` and ``--acceptance`` (None on the command line, so
#: that one given where it does not apply is refused).
DEFAULT_TRAFFIC = "smooth"
DEFAULT_DEPTH = 4
DEFAULT_ACCEPTANCE = "coverage:0.5"
SCHEDULES = ("elastic", "replay")
#: Real traces by name (files in :func:`elmoe3d.sw.host.corpus.traces_dir`).
NAMED_TRACES = ROUTING_FILES
#: The model that routed the named traces (``../shared/traces/README.md``: Mixtral-8x7B-Instruct),
#: the ``--model`` they take when none is given (their files have no meta line naming it).
NAMED_TRACE_MODEL = ROUTING_MODEL
#: ``--trace synthetic:USAGE.json``: synthetic routing calibrated on expert-usage statistics.
SYNTHETIC_PREFIX = "synthetic:"
#: What a run with no HB slot does under Elastic-SD (printed, and the run's ``note``).
NO_POOL_NOTE = ("no HB slots: Elastic-SD has no pool to draft from, so the draft cannot run; "
                "every token decoded autoregressively (AR, FULL), every expert streamed from "
                "EXT (hit rate 0)")
#: CSV columns (one row per step).
CSV_COLUMNS = ("run", "depth", "step", "kind", "iteration", "tokens", "produced", "layers",
               "cycles", "us", "perf_cycles", "hb_read_bytes", "hb_write_bytes", "ext_bytes",
               "link_bytes",
               "accesses", "hits", "hit_rate", "energy_pj", "pool_writes", "pool_extra",
               "compared", "mismatches")


def configure(parser) -> None:
    from ..config import preset_key
    parser.add_argument("--trace", required=True, metavar="FILE",
                        help="routing trace: vLLM-style .jsonl or canonical .npz; "
                             f"{' or '.join(map(repr, NAMED_TRACES))} for the real Mixtral "
                             f"traces; {SYNTHETIC_PREFIX}USAGE.json for synthetic routing "
                             "calibrated on expert-usage statistics (or "
                             f"{SYNTHETIC_PREFIX}COUNTS.csv laid out as olmoe_mixtral_expert_counts.csv: "
                             "its tables with the model's expert count)")
    parser.add_argument("--model", default=None, metavar="PRESET",
                        help="model preset (e.g. mixtral-8x7b; default: the .npz trace's model, "
                             f"the JSONL meta line's, or {NAMED_TRACE_MODEL} for "
                             f"{' and '.join(NAMED_TRACES)})")
    parser.add_argument("--config", default="small", metavar="NAME", type=preset_key,
                        help=f"architecture preset: {', '.join(CONFIGS)} (default small)")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, metavar="NAME",
                        help=f"{', '.join(BACKENDS)} (default {DEFAULT_BACKEND}): "
                             + "; ".join(f"{b.name}: {b.description}"
                                         for b in BACKENDS.values()))
    parser.add_argument("--layers", default=None, metavar="SLICE",
                        help="MoE layers compiled and reported: A:B, A:B:S, N or A,B,... "
                             "(decoder-layer indices; default all)")
    parser.add_argument("--tokens", type=int, default=None, metavar="N",
                        help="keep the trace's first N decode tokens (default all)")
    parser.add_argument("--warmup", type=int, default=None, metavar="N",
                        help="JSONL logs: drop the first N positions of every request as "
                             "warm-up (besides the detected profiling dummy blocks)")
    parser.add_argument("--keep-warmup", action="store_true",
                        help="JSONL logs: keep every row read as warm-up (detected profiling "
                             "dummy blocks, \"warmup\": true rows) as real routing")
    parser.add_argument("--on-error", default="raise", metavar="MODE",
                        help="JSONL logs: raise (default: the first malformed line is an error) "
                             "or warn (malformed lines skipped, counted and listed)")
    parser.add_argument("--renormalise", default="keep", metavar="MODE",
                        help="JSONL logs: keep (gate weights as logged, default), topk (divide "
                             "each row by its sum) or model (only if the model's router does)")
    parser.add_argument("--schedule", default="elastic", metavar="NAME",
                        help="elastic (Elastic-SD draft/verify, default) or replay (plain "
                             "decode through the LRU cache)")
    parser.add_argument("--depth", type=int, nargs="+", default=None, metavar="D",
                        help="Elastic-SD draft depth(s); one run per value (default 4)")
    parser.add_argument("--acceptance", default=None, metavar="RULE",
                        help="Elastic-SD acceptance: coverage:T (pool share of the gate "
                             "weight >= T) or bernoulli:A (rate A) (default coverage:0.5)")
    parser.add_argument("--batch", type=int, default=1, metavar="B",
                        help="requests in lockstep (default 1)")
    parser.add_argument("--hb-slots", type=int, default=None, metavar="N",
                        help="cap the HB expert-slice slots (default: the HB capacity less the "
                             "reservations; 0: no expert cache, Elastic-SD then decodes "
                             "autoregressively)")
    parser.add_argument("--dense-bytes", type=bytes_type, default=None, metavar="B",
                        help="HB bytes reserved for dense weights (4000000, 1e9, 512MiB, "
                             "1.5GB; default: the model's figure for real shapes, 0 for "
                             "synthetic ones)")
    parser.add_argument("--kv-bytes", type=bytes_type, default=None, metavar="B",
                        help="HB bytes reserved for the KV cache (default as --dense-bytes)")
    parser.add_argument("--seed", type=seed_type, default=None,
                        help="seed of the synthetic weights, activations and Bernoulli "
                             "acceptance (default $ELMOE3D_SEED, else a fixed seed)")
    parser.add_argument("--traffic", default=None, metavar="NAME",
                        help="rtl: smooth, or stalls (idle source cycles and backpressure; "
                             "elmoe3d.sim.traffic)")
    for backend, opt in backend_options():
        parser.add_argument(f"--{opt.name}", type=opt.type, default=None, metavar=opt.metavar,
                            help=f"{backend.name}: {opt.help}")
    parser.add_argument("--json", type=output_path, default=None, metavar="F",
                        help="write the runs, their summaries and every step as JSON")
    parser.add_argument("--csv", type=output_path, default=None, metavar="F",
                        help="write one row per step as CSV")
    parser.add_argument("--plot", type=output_dir, default=None, metavar="DIR",
                        help="write hit_rate.png, bytes_per_tier.png, latency.png into DIR "
                             "(created if missing)")


# -- inputs -----------------------------------------------------------------------------------

def resolve_trace(text) -> Path:
    """The trace file of ``--trace`` (a named real trace, a path, or ``synthetic:USAGE``'s
    usage file); UserError if missing."""
    from ..sw.host.corpus import routing_path, traces_hint
    text = str(text)
    usage = text.startswith(SYNTHETIC_PREFIX)
    if usage and not text[len(SYNTHETIC_PREFIX):].strip():
        raise UserError(f"--trace {text!r}: expected {SYNTHETIC_PREFIX}FILE (an expert-usage "
                        f"JSON or a counts CSV)")
    if text in NAMED_TRACES:
        path = routing_path(text)
    else:
        path = Path(text[len(SYNTHETIC_PREFIX):] if usage else text)
    if path.is_dir():
        raise UserError(f"--trace {text}: {path} is a folder; give one routing log file")
    if not path.is_file():
        raise UserError(f"--trace {text}: no such file {path}" + (
            traces_hint() if text in NAMED_TRACES else "" if usage else
            f"; expected a routing log file, a named trace ({', '.join(NAMED_TRACES)}) or "
            f"{SYNTHETIC_PREFIX}FILE"))
    if usage:
        return path
    if _kind(path) is None:
        raise UserError(f"--trace {text}: expected a JSON-lines routing log ("
                        f"{', '.join(LOG_SUFFIXES)}) or a .npz trace, got "
                        f"{''.join(path.suffixes[-2:]) or 'no suffix'}")
    return path


#: File names read as JSON-lines routing logs (a ``.json`` is sniffed: one document is named).
LOG_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".json", ".txt")


def _kind(path) -> str | None:
    """``"npz"``, ``"log"`` or None from a trace file's name."""
    name = path.name.lower()
    if name.endswith(".npz"):
        return "npz"
    return "log" if name.endswith(LOG_SUFFIXES) else None


def load_trace(path: Path, model, *, warmup=None, keep_warmup=False, usage=False, tokens=None,
               seed=0, on_error="raise", renormalise="keep"):
    """``(RoutingTrace, preset, import report or None, import note)``; the model from
    ``--model``, the .npz, or the JSONL meta line. ``usage``: ``path`` is expert-usage
    statistics, and the trace is synthetic routing calibrated on them
    (:func:`~elmoe3d.sw.host.tracegen.calibrate_from_usage`), ``tokens`` tokens."""
    from ..sw.host.models import model_preset
    from ..sw.host.trace import MODEL_LINE_KINDS, RoutingTrace, TraceError, import_vllm_jsonl
    rep = None
    if (warmup is not None or keep_warmup or on_error != "raise" or renormalise != "keep") \
            and (usage or _kind(path) == "npz"):
        raise UserError("--warmup, --keep-warmup, --on-error, --renormalise: only for JSONL "
                        "routing logs")
    if warmup is not None and keep_warmup:
        raise UserError("--warmup N drops positions as warm-up and --keep-warmup keeps every "
                        "warm-up row: give one of them")
    if usage:
        from ..sw.host.tracegen import calibrate_from_usage, synthetic_trace
        if model is None:
            raise UserError("--model: required with --trace synthetic:FILE")
        params, fit = calibrate_from_usage(
            model, path, progress=lambda line: print(f"elmoe3d run: {line}", file=sys.stderr,
                                                     flush=True))
        tr = synthetic_trace(model, params, tokens=tokens or 256, seed=seed)
        name = model
        note = (f"synthetic routing, {tr.token_count()} tokens, zipf {params.zipf} fitted on "
                f"{fit['layers']} layer(s) of {path.name} (hot ratio {fit['target']:.2f}, "
                f"generated {fit['generated']:.2f})")
    elif _kind(path) == "npz":
        tr = RoutingTrace.load(path)
        name = model or tr.model
        if name is None:
            raise UserError(f"--model: {path.name} names no model; give --model PRESET")
        note = f"{len(tr)} rows"
    else:
        try:
            tr, rep = import_vllm_jsonl(path, model=model, warmup_tokens=warmup,
                                        keep_warmup=keep_warmup, on_error=on_error,
                                        renormalise=renormalise)
        except TraceError as exc:
            # the model only where the line's check depends on it; a bad line can be skipped
            raise UserError(
                f"{exc}" + (f" (read as --model {model})" if model and exc.kind in
                            MODEL_LINE_KINDS else "") +
                ("; --on-error warn skips malformed lines (counted and listed)"
                 if exc.kind is not None and exc.stray else "")) from None
        c = rep.counts()
        routed = c["records"] - c["padding"] - c["duplicates"]      # warm-up rows count:
        # a malformed line is counted malformed whatever its position
        if 2 * c["malformed"] > routed:
            # --on-error warn skips stray lines; most lines malformed is another format (raw
            # logits as weights, another model's ids), not strays: refused, the first named
            line, kind, msg = next(i for i in rep.issues if i[1] != "duplicate")
            raise UserError(f"{path}: {c['malformed']} of its {routed} routing records "
                            f"malformed (padding and duplicates aside; kept "
                            f"{c['kept']}): --on-error warn skips stray lines, not most of a "
                            f"log; the first, line {line} [{kind}]: {msg}")
        name = model or tr.model
        if name is None or model is None and any(n.startswith("meta model") for n in rep.notes):
            why = ("its meta line names no known preset" if rep.meta else
                   "it has no meta line naming the model")
            from ..sw.host.models import MODEL_PRESETS
            fits = [m.name for m in MODEL_PRESETS.values()
                    if (m.routed_experts, m.top_k) == (tr.num_experts, tr.top_k)]
            raise UserError(f"--model: required with {path.name} ({why}); its "
                            f"{tr.num_experts} experts, top-{tr.top_k}, are "
                            + (f"{' or '.join(fits)}'s" if fits else "no preset's"))
        note = rep.counts_line()
    p = model_preset(name)
    moe = tuple(p.moe_layer_ids)
    if _kind(path) == "npz" and tuple(tr.layer_ids) != moe and set(tr.layer_ids) < set(moe) \
            and (tr.num_experts, tr.top_k) == (p.routed_experts, p.top_k) \
            and tr.model in (None, p.name):     # another model's trace: check_model_trace names
        # a trace of some of the model's MoE layers (trace_from_router_logits with layer_ids,
        # capture_hf on a cut model): the others are absent, as a log's unlogged layers are
        import dataclasses
        from ..sw.host.trace import _span_text
        part = f"layers {_span_text(tr.layer_ids)} of {p.name}'s {len(moe)} MoE layers"
        tr = dataclasses.replace(tr, layer_ids=moe, notes=tuple(tr.notes) + (part,))
        note += f"; {part}"
    from ..sw.host.compiler import check_model_trace
    check_model_trace(tr, p, source=None if model is not None else
                      f"{path.name}'s " + ("model field" if _kind(path) == "npz" else
                                          "meta line"))
    return tr, p, rep, note


def _check_ffn(model):
    """Refuse a preset whose experts the backends cannot run (UserError, one line)."""
    if model.ffn != "swiglu":
        raise UserError(f"--model {model.name}: its experts are two-matrix {model.ffn} FFNs, "
                        f"not SwiGLU; the PE's VPU and the host compiler run SwiGLU experts "
                        f"only (the preset serves routing statistics and trace calibration: "
                        f"elmoe3d.sw.host.tracegen)")


def check_layer_coverage(trace, model, layers, asked) -> list:
    """The MoE layers of ``layers`` that the trace has no record of, after refusing a run that
    would report figures for them: every layer of ``layers`` must have records (``asked``: they
    came from ``--layers``). Raises :class:`UserError` naming the absent and the logged
    layers."""
    import numpy as np
    from ..sw.host.trace import _span_text
    have = set(int(x) for x in np.unique(trace.layer))
    absent = [x for x in layers if x not in have]
    if not absent:
        return []
    logged = sorted(have & set(model.moe_layer_ids))
    consecutive = len(logged) > 2 and logged == list(range(logged[0], logged[-1] + 1))
    layers_arg = (f"{logged[0]}:{logged[-1] + 1}" if consecutive else     # 0:16, not 0,1,...
                  ",".join(str(x) for x in logged))
    hint = (f"pass --layers {layers_arg} to run the logged layer(s) only"
            if logged else "the trace has no MoE layer of the model")
    if asked:
        raise UserError(f"--layers: layer(s) {_span_text(absent)} have no record in the trace; "
                        f"{hint}")
    raise UserError(f"--trace: {len(absent)} of {len(layers)} MoE layers of {model.name} have "
                    f"no record ({_span_text(absent)}): figures over all layers would stand "
                    f"for routing nobody logged; {hint}")


def parse_acceptance(text):
    """``coverage:T`` / ``bernoulli:A`` -> the Elastic-SD acceptance rule (UserError)."""
    from ..sw.host.elastic_sd import BernoulliAcceptance, CoverageAcceptance
    kind, _, val = str(text).partition(":")
    try:
        v = float(val)
    except ValueError:
        raise UserError(f"--acceptance {text!r}: expected coverage:T or bernoulli:A with a "
                        f"number in [0, 1]") from None
    rules = {"coverage": CoverageAcceptance, "bernoulli": BernoulliAcceptance}
    if kind not in rules:
        raise UserError(f"--acceptance {text!r}: expected coverage:T or bernoulli:A")
    try:
        return rules[kind](v)
    except UserError as exc:                # the rule's own check: a value out of range
        raise UserError(f"--acceptance {text!r}: {exc}") from None


def _choice(option, value, choices):
    """``value`` as the one of ``choices`` it names, in any case and with blanks around it
    (``8GB`` is ``8gb``, ``Table3`` is ``table3``); else a :class:`UserError` naming
    ``option``, every choice and the one close to it if only one is (``tabel3``: did you
    mean 'table3'?; ``16gb`` is as close to ``4gb`` as to ``8gb``: no guess)."""
    key = str(value).strip().lower()
    for c in choices:
        if key == str(c).lower():
            return c
    raise UserError(f"{option} {value}: expected one of {', '.join(map(str, choices))}"
                    f"{did_you_mean(key, choices, only_one=True)}")


def _at_least(option, value, lo):
    """``value`` unless it is an integer below ``lo`` (an option not given, ``None``, passes):
    :func:`~elmoe3d.checks.check_int`'s words, as a :class:`UserError` naming ``option``."""
    return value if value is None else check_int(option, value, lo=lo, error=UserError)


# -- the run ------------------------------------------------------------------------------------

def _cache(model, arch, args, *, admit, real, share=1.0):
    """The HB expert cache of a run; ``share``: the fraction of the model's MoE layers the trace
    logs, which get that share of the expert capacity (the other layers' slots are not theirs
    to take)."""
    from ..sw.host.hbcache import HBExpertCache, hb_capacity_bytes
    from ..sw.host.compiler import reserved_hb_bytes
    dense, kv = reserved_hb_bytes(model) if real else (0, 0)
    dense = dense if args.dense_bytes is None else args.dense_bytes
    kv = kv if args.kv_bytes is None else args.kv_bytes
    names = ("--dense-bytes" if args.dense_bytes is not None else
             f"{model.name}'s dense weights", "--kv-bytes" if args.kv_bytes is not None else
             f"{model.name}'s KV cache")
    cap = int(hb_capacity_bytes(arch, dense_bytes=dense, kv_bytes=kv, names=names) * share)
    if args.hb_slots is not None:
        cap = min(cap, args.hb_slots * model.expert_msb_bytes)
    return HBExpertCache(capacity_bytes=cap, model=model, admit=admit), dense, kv


def _add_note(doc, text):
    """Append ``text`` to the run document's ``note`` (``; `` between notes)."""
    doc["note"] = f"{doc['note']}; {text}" if doc.get("note") else text


def execute(args, *, progress_factory=None) -> dict:
    """Run everything ``args`` asks for and return the JSON document (no output written).
    ``progress_factory(total, description)`` returns a callable advanced once per step."""
    import numpy as np
    from ..config import ConfigError, preset
    from ..sim.runner import resolve_seed
    from ..sw.host import compiler as host

    backend = _choice("--backend", args.backend, BACKENDS)
    schedule = _choice("--schedule", args.schedule, SCHEDULES)
    try:
        args.config = _choice("--config", args.config, CONFIGS)
    except UserError as exc:
        raise UserError(f"{exc} (the configurations run takes; another preset's or a "
                        f"configuration file's base: and config: run in a sweep spec's perf "
                        f"task, with a workload:, docs/sweep.md; elmoe3d verilog, synth and "
                        f"paper-pe take a configuration file)") from None
    from ..sim.traffic import BENCH_TRAFFIC
    # options of one backend or schedule only are refused elsewhere, not dropped
    if args.traffic is not None and backend != "rtl":
        raise UserError(f"--traffic: only with --backend rtl (the {backend} backend has no "
                        f"stream to stall)")
    if schedule == "replay":
        given = [o for o, v in (("--depth", args.depth), ("--acceptance", args.acceptance))
                 if v is not None]
        if given:
            raise UserError(f"{' and '.join(given)}: "
                            + ("Elastic-SD options" if len(given) > 1 else
                               "an Elastic-SD option")
                            + "; --schedule replay decodes without drafting")
    fill_defaults(args, {"traffic": DEFAULT_TRAFFIC, "depth": [DEFAULT_DEPTH],
                         "acceptance": DEFAULT_ACCEPTANCE})
    if len(set(args.depth)) < len(args.depth):
        raise UserError(f"--depth {' '.join(map(str, args.depth))}: a depth given twice "
                        f"(one run per depth)")
    args.traffic = _choice("--traffic", args.traffic, BENCH_TRAFFIC)
    for opt, v in (("--tokens", args.tokens), ("--batch", args.batch)):
        _at_least(opt, v, 1)
    for opt, v in (("--hb-slots", args.hb_slots), ("--dense-bytes", args.dense_bytes),
                   ("--kv-bytes", args.kv_bytes)):
        _at_least(opt, v, 0)
    for d in args.depth:
        _at_least("--depth", d, 1)
    try:
        arch = preset(args.config)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    options = {opt.name: getattr(args, opt.name, None) for _, opt in backend_options()}
    options["traffic"] = args.traffic
    be = check_request(backend, config=args.config, options=options)
    acceptance = parse_acceptance(args.acceptance) if schedule == "elastic" else None
    path = resolve_trace(args.trace)
    if args.trace in NAMED_TRACES:
        from . import note_shadowed_path
        note_shadowed_path("run", args.trace, f"the named real trace {path}")
    if args.model is None and args.trace in NAMED_TRACES:
        args.model = NAMED_TRACE_MODEL
    if args.model is not None:
        from ..sw.host.models import model_preset
        try:                                        # an unknown preset fails before the import
            preset_ = model_preset(args.model)
        except UserError as e:
            raise UserError(f"--model {args.model}: {e}") from None
        _check_ffn(preset_)
    warmup = getattr(args, "warmup", None)
    _at_least("--warmup", warmup, 0)
    usage = str(args.trace).startswith(SYNTHETIC_PREFIX)
    from ..sw.host.elastic_sd import BernoulliAcceptance
    if args.seed is not None and backend == "perf" and not usage and \
            not isinstance(acceptance, BernoulliAcceptance):
        print(f"elmoe3d run: note: --seed {args.seed} is not used: the perf backend on a "
              f"logged trace with {'coverage' if acceptance else 'no'} acceptance draws "
              f"nothing at random", file=sys.stderr)
    on_error = _choice("--on-error", getattr(args, "on_error", "raise"), ("raise", "warn"))
    renorm = _choice("--renormalise", getattr(args, "renormalise", "keep"),
                     ("keep", "topk", "model"))
    trace, real_model, report, note = load_trace(
        path, args.model, warmup=warmup, keep_warmup=getattr(args, "keep_warmup", False),
        usage=usage, tokens=args.tokens, seed=resolve_seed(args.seed), on_error=on_error,
        renormalise=renorm)
    _check_ffn(real_model)
    layers = host.parse_layers(args.layers, real_model)
    available = trace.token_count()
    # the design decodes: a log's prefill (and logged draft) rows are read, counted, not run
    from ..sw.host.trace import PHASES
    not_run = {ph: int(trace.phase_mask(ph).sum()) for ph in PHASES if ph != "decode"}
    trace = host.limit_tokens(trace, args.tokens)
    if not trace.phase_mask("decode").any():
        raise UserError(f"--trace {args.trace}: no decode tokens ({note})")
    try:
        check_layer_coverage(trace.select(trace.phase_mask("decode")), real_model, layers,
                             asked=args.layers is not None)
    except UserError as exc:
        raise UserError(f"{exc} [import: {note}]") from None
    logged = len(set(np.unique(trace.layer[trace.phase_mask("decode")]).tolist())
                 & set(real_model.moe_layer_ids))
    real = args.config != SMALL_CONFIG
    model = real_model if real else host.synthetic_model(real_model)
    # every backend reports the perf model's figures: a model it cannot take is refused here
    from ..sw.host.perf import PerfModel
    try:
        PerfModel(arch, model)
    except ValueError as exc:
        raise UserError(f"--model {real_model.name} on --config {arch.name}: the performance "
                        f"model cannot map it ({exc})") from None
    seed = resolve_seed(args.seed)
    doc = {"trace": str(path), "import": note, "model": real_model.name,
           "import_counts": report.counts() if report else None,
           "import_events": report.summary()[2:] if report else [],
           "shapes": {"hidden": model.hidden, "intermediate": model.expert_intermediate,
                      "synthetic": not real},
           "config": arch.name, "backend": backend, "schedule": schedule,
           "layers": layers, "tokens": trace.token_count(), "batch": args.batch, "seed": seed,
           "runs": []}
    if not real:
        doc["note"] = host.SYNTHETIC_NOTE.format(h=model.hidden, i=model.expert_intermediate)
    n_req = len(np.unique(trace.request[trace.phase_mask("decode")]))
    if args.batch > n_req:
        _add_note(doc,
            f"--batch {args.batch} but the trace has {n_req} request(s): {n_req} run in "
            f"lockstep")
    if any(not_run.values()):
        _add_note(doc,
            " and ".join(f"{n} {ph} row(s)" for ph, n in not_run.items() if n)
            + " of the trace not run: the run decodes its decode tokens (prefill is not "
              "modelled)")
    if args.tokens is not None and args.tokens > available:
        _add_note(doc,
            f"--tokens {args.tokens} but the trace has {available} decode tokens: all "
            f"{available} run")
    if logged < real_model.moe_layers:
        doc["hb_share"] = logged / real_model.moe_layers
        _add_note(doc,
            f"the trace logs {logged} of {real_model.moe_layers} MoE layers: their experts get "
            f"{logged}/{real_model.moe_layers} of the HB expert capacity, as in a full log")
    if args.hb_slots is not None:                  # a cap: say where the HB leaves fewer
        fit = _cache(model, arch, args, admit=False, real=real,
                     share=doc.get("hb_share", 1.0))[0].slots
        if fit < args.hb_slots:
            _add_note(doc,
                f"--hb-slots {args.hb_slots} but {fit} fit the HB the dense weights and KV "
                f"cache leave: {fit} used")
    depths = args.depth if schedule == "elastic" else [None]
    # the backend's session (the FPGA board) opens before the first run: a missing device
    # fails in seconds, not after the golden run
    with be.session(arch, options) as session:
        if session is not None:
            doc.update(session.doc)
        ctx = RunContext(arch=arch, model=model, seed=seed, options=options, session=session,
                         progress_factory=progress_factory)
        for depth in depths:
            _one_run(doc, args, depth, be, ctx, trace, schedule, acceptance, layers, real)
    return doc


def _one_run(doc, args, depth, be, ctx, trace, schedule, acceptance, layers, real):
    """One run of backend ``be`` (``ctx``: its :class:`RunContext` less the run's label and
    progress) at Elastic-SD ``depth`` (None: replay); appended to ``doc["runs"]``."""
    import dataclasses

    from ..sw.host import compiler as host
    arch, model, seed, progress_factory = ctx.arch, ctx.model, ctx.seed, ctx.progress_factory
    t0 = time.perf_counter()
    cache, dense, kv = _cache(model, arch, args, admit=schedule == "replay", real=real,
                              share=doc.get("hb_share", 1.0))
    note = None
    if cache.slots == 0:
        note = (NO_POOL_NOTE if schedule == "elastic" else
                "no HB slots: every expert streamed from EXT, nothing admitted (hit rate 0)")
    if schedule == "elastic" and cache.slots == 0:
        # no pool: the draft cannot run, every token is autoregressive (module docstring)
        steps = host.replay_steps(trace, cache, layers=layers, batch=args.batch,
                                  groups=arch.groups)
        for s in steps:
            s.kind = "ar"
        esd_summary = None
    elif schedule == "elastic":
        from ..sw.host.elastic_sd import ElasticSD
        esd = ElasticSD(cache=cache, depth=depth, acceptance=acceptance, seed=seed)
        steps, res = host.elastic_steps(trace, esd, layers=layers, batch=args.batch,
                                        groups=arch.groups)
        esd_summary = res.summary()
    else:
        steps = host.replay_steps(trace, cache, layers=layers, batch=args.batch,
                                  groups=arch.groups)
        esd_summary = None
    t_sched = time.perf_counter() - t0
    label = f"depth {depth}" if depth else "replay"
    tick = progress_factory(len(steps), f"{be.name} {label}") if progress_factory \
        else None
    t1 = time.perf_counter()
    run = {"label": label, "depth": depth, "hb_slots": cache.slots,
           "msb_bytes": cache.msb_bytes, "dense_bytes": dense, "kv_bytes": kv,
           "elastic_sd": esd_summary, "note": note}
    result = be.run(steps, dataclasses.replace(ctx, label=label, progress=tick))
    recs = result.records
    if result.figures is not None:
        run[be.name] = result.figures
    t_run = time.perf_counter() - t1
    run["summary"] = summarise(recs, arch)
    if result.lost_mismatches:
        run["summary"]["mismatches"] += result.lost_mismatches
    # a Verilator build made by this run (not one reused) is no simulation: left out of the
    # speed, reported apart
    figures = result.figures or {}
    t_build = float(figures["build_seconds"]) if figures.get("built") else 0.0
    run["wall_seconds"] = {"schedule": t_sched, "backend": t_run, "build": t_build}
    if be.perf_beside:
        # the perf model on the same steps and shapes, beside the measured figures
        perf = run_perf(steps, arch, model, feed=be.perf_feed)
        for r, p in zip(recs, perf):
            r["perf_cycles"] = p["cycles"]
        run["perf_cycles"] = sum(p["cycles"] for p in perf)
        run["perf_compute"] = compute_figures(arch, model, be.perf_feed)
    toks = trace.token_count()
    t_sim = t_sched + t_run - t_build
    run["tokens_simulated_per_s"] = toks / t_sim if t_sim > 0 else None
    run["steps"] = recs
    doc["runs"].append(run)


# -- output -------------------------------------------------------------------------------------

def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def summary_table(doc):
    from rich.markup import escape
    from rich.table import Table
    sh = doc["shapes"]
    synth = f" (synthetic {sh['hidden']}x{sh['intermediate']} experts)" if sh["synthetic"] \
        else ""
    title = (f"elmoe3d run: {escape(Path(doc['trace']).name)}, {doc['model']}{synth}"
             f", {doc['config']}, backend {doc['backend']}, {doc['schedule']}, "
             f"{len(doc['layers'])} layers, {doc['tokens']} tokens")
    t = Table(title=title, title_justify="left")
    cols = ["run", "steps", "tokens", "hit rate", "HB read", "HB write", "EXT", "link",
            "cycles", "tokens/s", "DRAM mJ/token"]
    compares = BACKENDS[doc["backend"]].compares
    if compares:
        cols += ["compared", "mismatches"]
    cols += ["sim tok/s"]
    for c in cols:
        t.add_column(c, justify="left" if c == "run" else "right", no_wrap=True)
    for run in doc["runs"]:
        s = run["summary"]
        row = [run["label"], str(s["steps"]), str(s["produced"]), _pct(s["hit_rate"]),
               _b(s["hb_read_bytes"]), _b(s["hb_write_bytes"]),
               _b(s["ext_bytes"]), _b(s["link_bytes"]),
               f"{s['cycles']:,.0f}" if "cycles" in s else "-",
               f"{s['tokens_per_s']:,.1f}" if s.get("tokens_per_s") else "-",
               f"{s['energy_mj_per_token']:.3f}" if s.get("energy_mj_per_token") is not None
               else "-"]
        if compares:
            bad = s.get("mismatches", 0)
            row += [f"{s.get('compared', 0):,}", f"[bold red]{bad}[/]" if bad else "0"]
        speed = run["tokens_simulated_per_s"]
        row += ["-" if speed is None else f"{speed:,.1f}"]
        t.add_row(*row)
    return t


def kind_table(run, backend):
    from rich.table import Table
    t = Table(title=f"{run['label']}: per step kind", title_justify="left")
    for c in ("kind", "steps", "mean cycles", "mean us", "HB read", "EXT", "link",
              "hit rate", "bound (layer-steps)"):
        t.add_column(c, justify="left" if c in ("kind", "bound (layer-steps)") else "right",
                     no_wrap=True)
    for kind in ("ar", "decode", "draft", "verify"):
        rs = [r for r in run["steps"] if r["kind"] == kind]
        if not rs:
            continue
        cyc = [r["cycles"] for r in rs if r["cycles"] is not None]
        acc = sum(r["accesses"] for r in rs)
        bounds = {}
        for r in rs:
            for k, v in (r.get("bounds") or {}).items():
                bounds[k] = bounds.get(k, 0) + v
        t.add_row(kind, str(len(rs)),
                  f"{sum(cyc) / len(cyc):,.0f}" if cyc else "-",
                  f"{sum(r['us'] for r in rs if r['us'] is not None) / len(rs):,.1f}"
                  if cyc else "-",
                  _b(sum(r["hb_read_bytes"] for r in rs)), _b(sum(r["ext_bytes"] for r in rs)),
                  _b(sum(r["link_bytes"] for r in rs)),
                  _pct(sum(r["hits"] for r in rs) / acc if acc else None),
                  ", ".join(f"{k} {v}" for k, v in sorted(bounds.items())) or "-")
    return t


def write_csv(path, doc):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for run in doc["runs"]:
            for r in run["steps"]:
                vals = {**r, "run": run["label"], "depth": run["depth"]}
                w.writerow(["" if vals.get(c) is None else vals.get(c) for c in CSV_COLUMNS])


def write_plots(path_of, doc):
    """The PNG plots hit_rate, bytes_per_tier and latency; ``path_of(name)`` gives each one's
    file, called just before it is written (an output's temporary file made then, so that a
    full disk names the plot being written)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def fig():
        f = Figure(figsize=(7, 4), layout="constrained")
        FigureCanvasAgg(f)
        return f, f.add_subplot()
    tag = f"{doc['model']} on {doc['config']} ({doc['backend']}, {Path(doc['trace']).name})"
    f, ax = fig()
    for run in doc["runs"]:
        pts = [(r["step"], r["hit_rate"]) for r in run["steps"]
               if r["kind"] != "draft" and r.get("hit_rate") is not None]
        if pts:
            ax.plot(*zip(*pts), ".-", label=f"{run['label']} ({_pct(run['summary']['hit_rate'])})")
    ax.set_xlabel("step")
    ax.set_ylabel("HB hit rate (expert reads, non-draft steps)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"hit rate over time: {tag}", fontsize=9)
    f.savefig(path_of("hit_rate"), format="png", dpi=120)

    f, ax = fig()
    tiers = ("hb_read_bytes", "hb_write_bytes", "ext_bytes", "link_bytes")
    labels = [run["label"] for run in doc["runs"]]
    import numpy as np
    xs = np.arange(len(labels))
    for i, tier in enumerate(tiers):
        ax.bar(xs + (i - 1.5) * 0.2, [run["summary"][tier] / 1e9 for run in doc["runs"]], 0.2,
               label=tier.replace("_bytes", "").replace("_", " "))
    ax.set_xticks(xs, labels)
    ax.set_ylabel("GB")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(f"bytes per tier: {tag}", fontsize=9)
    f.savefig(path_of("bytes_per_tier"), format="png", dpi=120)

    f, ax = fig()
    any_t = False
    for run in doc["runs"]:
        for kind, style in (("ar", "^"), ("decode", "o"), ("draft", "."), ("verify", "s")):
            pts = [(r["step"], r["us"]) for r in run["steps"]
                   if r["kind"] == kind and r.get("us") is not None]
            if pts:
                any_t = True
                ax.plot(*zip(*pts), style, markersize=3, label=f"{run['label']} {kind}")
    if any_t:
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "the golden backend has no timing", ha="center",
                transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("latency (us)")
    ax.grid(True, alpha=0.3)
    ax.set_title(f"latency per step: {tag}", fontsize=9)
    f.savefig(path_of("latency"), format="png", dpi=120)


PLOTS = ("hit_rate", "bytes_per_tier", "latency")


def _check_outputs(args):
    """Refuse unusable output paths, two outputs that are one file, and an output that is the
    trace (or the usage statistics) it would overwrite (UserError, one line)."""
    dests = []
    for opt, dest in (("--json", args.json), ("--csv", args.csv)):
        if dest is not None:
            dests.append((opt, check_output(dest, opt)))
    if args.plot is not None:
        files = check_output_dir(args.plot, "--plot", [f"{name}.png" for name in PLOTS])
        dests += [(f"--plot {name}", path) for name, path in zip(PLOTS, files)]
    check_distinct(dests, [("--trace", resolve_trace(args.trace))] if dests else ())


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item"):
        return x.item()
    return x


def run(args) -> int:
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)
    _check_outputs(args)
    err = Console(stderr=True)
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                        transient=True, disable=not err.is_terminal)

    def factory(total, description):
        task = progress.add_task(description, total=total)
        return lambda _step: progress.advance(task)

    try:
        with progress:
            doc = _clean(execute(args, progress_factory=factory))
    except UserError:
        raise
    except Exception as exc:    # a bug: not a mismatch (1) and not the user's input (2)
        from ..paths import build_error
        error = build_error(exc)
        if error is not None:           # the build folder, not a bug
            raise error from None
        import traceback
        traceback.print_exc()
        print("elmoe3d run: internal error (the traceback above; exit status 3)",
              file=sys.stderr)
        return 3

    out = report_console(200)
    be = BACKENDS[doc["backend"]]
    # the trace's text (its path, the import's events, "[kind]" included) is not rich markup
    out.print(f"trace: {doc['trace']} ({doc['import']})", soft_wrap=True, markup=False)
    for line in doc.get("import_events") or ():
        out.print(f"import: {line}", soft_wrap=True, markup=False)
    if doc.get("note"):
        out.print(f"note: {doc['note']}", markup=False)
    out.print(summary_table(doc))
    for r in doc["runs"]:
        out.print(kind_table(r, doc["backend"]))
        if r.get("note"):
            out.print(f"{r['label']}: {r['note']}")
        if r.get("elastic_sd") and not r["elastic_sd"]["iterations"]:
            out.print(f"{r['label']}: Elastic-SD drafted nothing: every request ends within its "
                      f"autoregressive seed of {r['depth']} token(s) (the draft depth)")
        elif r.get("elastic_sd"):
            e = r["elastic_sd"]
            out.print(f"{r['label']}: Elastic-SD {e['iterations']} iterations, accepted "
                      f"{e['accepted']}/{e['drafted']} drafted ({_pct(e['acceptance_rate'])}; "
                      f"alpha {e['alpha']:.3f} = accepted / {e['judged']} judged, the paper's "
                      f"acceptance rate), "
                      f"{e['mean_accept_length']:.2f} tokens/iteration; HB slots "
                      f"{r['hb_slots']} of {_b(r['msb_bytes'])} MSB slices")
        w = r["wall_seconds"]
        build = (f", of which the Verilator build {w['build']:.2f} s, left out of the speed"
                 if w.get("build") else "")
        speed = (f"{r['tokens_simulated_per_s']:,.1f}" if r["tokens_simulated_per_s"]
                 is not None else "n/a")
        out.print(f"{r['label']}: {doc['backend']} simulated {doc['tokens']} trace tokens in "
                  f"{w['schedule'] + w['backend']:.2f} s (schedule {w['schedule']:.2f} s, "
                  f"backend {w['backend']:.2f} s{build}): {speed} tokens "
                  f"simulated per second")
        if r.get(be.name):
            for line in be.report(r["label"], r[be.name]):
                out.print(line)
        if r.get("perf_cycles") is not None:
            cyc = r["summary"].get("cycles")
            out.print(f"{r['label']}: the perf model puts the same steps at "
                      f"{r['perf_cycles']:,.0f} cycles"
                      + (f" (RTL lower bound / perf = {cyc / r['perf_cycles']:.2f}"
                         + (f"; the RTL ran with --traffic {args.traffic}, idle cycles and "
                            f"backpressure the perf model does not have"
                            if args.traffic != "smooth" else "") + ")"
                         if cyc and r["perf_cycles"] else "")
                      + (f"; {r['perf_compute']['compute']}" if r.get("perf_compute") else ""))

    with atomic_outputs(lambda exc: f"cannot write output: {exc}") as outputs:
        if args.json is not None:
            outputs.add_json(args.json, doc, allow_nan=False)
        if args.csv is not None:
            write_csv(outputs.temp_for(args.csv), doc)
        if args.plot is not None:
            outputs.make_dir(args.plot)
            write_plots(lambda n: outputs.temp_for(Path(args.plot) / f"{n}.png"), doc)

    if be.compares:
        bad = sum(r["summary"].get("mismatches", 0) for r in doc["runs"])
        cmp_ = sum(r["summary"].get("compared", 0) for r in doc["runs"])
        if bad or not cmp_:
            out.print(f"[bold red]elmoe3d run: FAILED[/] ({bad:,} mismatches of {cmp_:,} "
                      f"values compared)")
            return 1
        out.print(f"[bold green]elmoe3d run: {cmp_:,} values compared bit for bit, 0 "
                  f"mismatches[/] ({be.name} vs {be.reference})")
    return 0

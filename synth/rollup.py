"""Hierarchical area roll-up: plan the leaves, synthesise them (in parallel, cached), multiply
by the instance counts the RTL elaborates to, and break the total down like the paper's
Fig. 11.

A :class:`Planner` walks a block: the block is hollowed (:func:`~elmoe3d.synth.blocks.hollow`)
into one synthesis job for its own logic plus its SRAM macros, and each distinct registered
sub-block instance is planned in turn (memoised on :func:`~elmoe3d.synth.blocks.instance_key`)
and counted. The tensor tile is the exception: its area is the model ``a + b L + c R L`` solved
from three small tiles (:data:`~elmoe3d.synth.blocks.TILE_FIT`), split into categories by the
attribution leaves. :meth:`Planner.run` synthesises every job once; :func:`evaluate` then gives
a node's area by category (logic categories and ``sram:<role>`` lines, um^2).

Categories inside a PE: ``MAC`` (the IA8xW5 multipliers), ``adder tree`` (the 32-way trees and
their registers), ``bit-slice support`` (the LSB-augmentation mux and slice select of every
weight field, and the slice combiners' shifts and multiplexers), ``dequantization`` (FP16 scale
decode, psum x mantissa, exponent shift, saturating Q.24 accumulators), ``tile control``,
``VPU`` and ``PE control`` (decoder, engines, address generation, beat forming, result
registers, write arbitration, small FIFOs), plus ``sram:WMEM`` and ``sram:IOMEM``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
from collections import Counter
from dataclasses import dataclass, field

from amaranth.back import rtlil

from ..hw.checked import inspection
from .blocks import (BLOCK_TYPES, PE_DIRECT_MAX_LANES, PE_FIT_LANES, TILE_FIT, DotRowLeaf,
                     LaneFieldsLeaf, MulLeaf, hollow, instance_key, instance_params,
                     inventory)
from .flow import SynthResult, stop_running, synthesize
from .sram import sram_area


__all__ = ["Planner", "Node", "TileNode", "evaluate", "logic_area", "sram_total",
           "tile_model", "param_differences"]


@dataclass
class Node:
    """A synthesised block: its own logic (job ``job``) in ``category``, its SRAMs and its
    sub-blocks ``children`` as (node, count)."""

    label: str
    category: str
    job: str
    srams: list = field(default_factory=list)
    children: list = field(default_factory=list)
    #: Black-box module name in the job's netlist -> the child node it stands for (timing).
    boxes: dict = field(default_factory=dict)


@dataclass
class TileNode:
    """A tensor tile of ``rows`` x ``lanes`` x 32 unit PEs, area from the tile model."""

    label: str
    rows: int
    lanes: int


@dataclass
class PEModelNode:
    """A PE too large to synthesise whole: its own logic from the control model (fit jobs
    ``fits``: lanes -> job), its SRAMs and sub-blocks from its elaboration."""

    label: str
    category: str
    lanes: int
    fits: dict
    srams: list = field(default_factory=list)
    children: list = field(default_factory=list)
    #: Sub-block class name -> child node: the fits' black boxes (their own, smaller
    #: sub-blocks) stand for the PE's sub-blocks of the same class (timing).
    boxes: dict = field(default_factory=dict)


@dataclass
class _Job:
    name: str
    label: str
    rtlil: str
    stubs: str = ""
    timed: bool = True            # mapped for delay too when the planner times
    params: dict | None = None    # the block instance's parameters (instance_params)


#: The most characters of differences a job's label shows (:meth:`Planner.label`): the first
#: ones that fit, then ``...``; when not even the first fits, the job's name instead.
LABEL_PARAM_CHARS = 40


def param_differences(name, value, others) -> list:
    """``name=value`` for ``value`` unlike one of ``others``; of a dataclass (a configuration),
    each field that differs, as ``name.field=value`` (nested dataclasses likewise)."""
    if all(o == value for o in others):
        return []
    if dataclasses.is_dataclass(value) and all(type(o) is type(value) for o in others):
        out = []
        for f in dataclasses.fields(value):
            out += param_differences(f"{name}.{f.name}", getattr(value, f.name),
                                     [getattr(o, f.name) for o in others])
        return out
    return [f"{name}={value!r}"]


def _tile_job(r, lanes):
    return f"tile_r{r}_l{lanes}"


class Planner:
    """Collects the synthesis jobs of one or more blocks, runs them, keeps the results.

    Parameters
    ----------
    liberty : Liberty
    cache_dir : Path or None
    jobs : int
        Yosys processes at once.
    progress : callable or None
        Called as ``progress(done, total, job_label, result)`` after every job.
    timing : float or None
        Clock period (ps): every job is also mapped for delay and timed
        (:func:`~elmoe3d.synth.flow.synthesize`); ``None``: area only.

    Blocks the planner leaves unelaborated (a tile whose area is a model, an instance equal to
    one planned already, the sub-blocks black-boxed in a hollow) are kept until
    :meth:`release` (which :meth:`run` calls first) drops them in an
    :func:`~elmoe3d.hw.checked.inspection` scope: a caller that holds no reference to the
    blocks it planned by then hears no ``UnusedElaboratable`` warning about them.
    """

    def __init__(self, *, liberty, cache_dir=None, jobs: int = 1, progress=None, timing=None):
        self.liberty = liberty
        self.timing = timing
        #: Jobs added while this is False are synthesised for area only (the roll-up check
        #: and the PE-count scaling need no timing).
        self.time_new_jobs = True
        self.cache_dir = cache_dir
        self.jobs = max(1, int(jobs))
        self.progress = progress
        self._jobs = {}                  # name -> _Job
        self._by_text = {}               # sha256 of RTLIL + stubs -> job name
        self._nodes = {}                 # instance key -> Node
        self.results = {}                # name -> SynthResult
        self._types = [(bt, bt.load()) for bt in BLOCK_TYPES]
        self._classes = [cls for _, cls in self._types if cls is not None]
        self._unelaborated = []          # blocks left unelaborated, until release()

    # ---- planning -------------------------------------------------------------------------

    def _type_of(self, obj):
        for bt, cls in self._types:
            if cls is not None and type(obj) is cls:
                return bt
        return None

    def add_job(self, name, label, elaboratable_or_text, stubs="", timed=True, params=None):
        if name in self._jobs and not isinstance(elaboratable_or_text, str):
            self._unelaborated.append(elaboratable_or_text)
        if name not in self._jobs:
            text = elaboratable_or_text
            if not isinstance(text, str):
                text = rtlil.convert(text, name="top", emit_src=False)
            # instances with different parameters can elaborate to the same logic (a block
            # that stores the whole configuration but uses a part of it): synthesise once
            digest = hashlib.sha256((text + "\0" + stubs).encode()).hexdigest()
            if digest in self._by_text:
                return self._by_text[digest]
            self._by_text[digest] = name
            self._jobs[name] = _Job(name, label, text, stubs, timed and self.time_new_jobs,
                                    params)
        return name

    def plan(self, obj, *, label=None, category=None):
        """The :class:`Node` (or :class:`TileNode`) of block ``obj``, its jobs registered."""
        key = instance_key(obj)
        if key in self._nodes:
            self._unelaborated.append(obj)   # an equal instance was elaborated already
            return self._nodes[key]
        bt = self._type_of(obj)
        label = label or (bt.label if bt else type(obj).__name__)
        if bt is not None and bt.model == "tile":
            node = TileNode(label=label, rows=obj.rows, lanes=obj.lanes)
            self._unelaborated.append(obj)
            self._plan_tile_leaves()
        elif bt is not None and bt.label == "PE" and obj.lanes > PE_DIRECT_MAX_LANES:
            node = self._plan_pe_model(obj, label)
        else:
            h = hollow(obj, owner=label, leaf_classes=self._classes)
            self._unelaborated += h.unelaborated
            # a block with sub-blocks is synthesised hollow: the job is its own logic alone
            job = self.add_job(f"{type(obj).__name__}_{_short(key)}",
                               f"{label} (own logic)" if h.subs else label, h.rtlil, h.stubs,
                               params=instance_params(obj))
            own = category or (f"{label} control" if label == "PE" else
                               (bt.category if bt else label))
            node = Node(label=label, category=own, job=job, srams=h.srams)
            for sub_key, (rep, count) in h.subs.items():
                child = self.plan(rep)
                node.children.append((child, count))
                node.boxes[_box_module(rep, sub_key)] = child
        self._nodes[key] = node
        return node

    def _plan_pe_model(self, pe, label):
        from ..config import PEConfig
        from ..hw.pe import PE
        cfg = pe.config
        subs, srams, unelaborated = inventory(pe, owner=label, leaf_classes=self._classes)
        self._unelaborated += unelaborated
        fits = {}
        for lanes in PE_FIT_LANES:
            variant = PEConfig(rows=lanes // 2, lanes=lanes, word_bits=128 * lanes,
                               wmem_words=cfg.wmem_words, act_words=cfg.act_words,
                               tok_words=cfg.tok_words, hbuf_words=cfg.hbuf_words,
                               out_words=cfg.out_words)
            small = PE(config=variant, mul_stages=pe.mul_stages)
            key = instance_key(small)
            h = hollow(small, owner=label, leaf_classes=self._classes)
            self._unelaborated += h.unelaborated
            fits[lanes] = self.add_job(f"PE_fit_{_short(key)}",
                                       f"PE control fit, {lanes} lanes", h.rtlil, h.stubs)
        node = PEModelNode(label=label, category="PE control", lanes=pe.lanes, fits=fits,
                           srams=srams)
        for sub_key, (rep, count) in subs.items():
            child = self.plan(rep)
            node.children.append((child, count))
            node.boxes[type(rep).__name__] = child
        return node

    def plan_whole(self, obj, *, name, label):
        """A job synthesising ``obj`` whole (only its RAMs as macros): the roll-up check (area
        only: not timed)."""
        h = hollow(obj, owner=label, leaf_classes=())
        self.add_job(name, label, h.rtlil, h.stubs, timed=False)
        return h.srams

    def _plan_tile_leaves(self):
        if "leaf_mul" in self._jobs:
            return
        from ..config import TileConfig
        from ..hw.tile import TensorTile
        from ..hw.unit_pe import SliceCombiner
        for r, lanes in TILE_FIT:
            self.add_job(_tile_job(r, lanes), f"tile {r}x{lanes}x32 (model fit)",
                         TensorTile(config=TileConfig(rows=r, lanes=lanes)))
        self.add_job("leaf_mul", "IA8xW5 multiplier", MulLeaf())
        self.add_job("leaf_dot_row", "dot row (32 mul + tree)", DotRowLeaf())
        self.add_job("leaf_fields_even", "lane fields, even lane", LaneFieldsLeaf(parity=0))
        self.add_job("leaf_fields_odd", "lane fields, odd lane", LaneFieldsLeaf(parity=1))
        self.add_job("leaf_combiner", "slice combiner", SliceCombiner(width=18))

    # ---- running --------------------------------------------------------------------------

    def release(self):
        """Drop the blocks planned but left unelaborated (class docstring)."""
        with inspection():
            self._unelaborated.clear()

    def run(self):
        """Synthesise every planned job not yet done (``jobs`` at a time, largest first);
        :meth:`release` first."""
        self.release()
        todo = [j for j in self._jobs.values() if j.name not in self.results]
        todo.sort(key=lambda j: -len(j.rtlil))
        total, done = len(todo), 0
        if not todo:
            return self.results

        def one(job):
            return job, synthesize(job.label, job.rtlil, liberty=self.liberty, stubs=job.stubs,
                                   cache_dir=self.cache_dir,
                                   timing=self.timing if job.timed else None)

        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs)
        try:
            futures = [pool.submit(one, j) for j in todo]
            for fut in concurrent.futures.as_completed(futures):
                job, result = fut.result()
                self.results[job.name] = result
                done += 1
                if self.progress:
                    self.progress(done, total, self.label(job.name), result)
        except KeyboardInterrupt:
            # stopped (Ctrl-C; SIGTERM is a KeyboardInterrupt here, elmoe3d.errors.Terminated):
            # the queued jobs are dropped and the running Yosys processes stopped, so the run
            # ends now (a new user's SIGTERM waited 9.5 minutes for the queue)
            pool.shutdown(wait=False, cancel_futures=True)
            stop_running()
            pool.shutdown(wait=True)
            raise
        finally:
            pool.shutdown(wait=True)    # a job's error: the others finish (and are cached)
        return self.results

    def label(self, name) -> str:
        """The report label of the planned job ``name``: its block's label, and where two
        jobs share one, the parameters that tell their instances apart (e.g. ``ring station
        (first=2)``)."""
        job = self._jobs[name]
        twins = [j for j in self._jobs.values() if j.label == job.label and j is not job]
        if not twins or job.params is None:
            return job.label
        shown = []
        for k, v in job.params.items():
            others = [t.params.get(k) if t.params is not None else None for t in twins]
            shown += param_differences(k.lstrip("_"), v, others)
        kept = []
        for s in shown:                               # the first differences that fit
            if len(", ".join(kept + [s])) > LABEL_PARAM_CHARS:
                break
            kept.append(s)
        if not kept:
            kept = [f"job {name}"]                    # no short difference: the job's name
        elif len(kept) < len(shown):
            kept.append("...")
        if job.label.endswith(")"):                   # "PE (own logic; rows=2, ...)"
            return f"{job.label[:-1]}; {', '.join(kept)})"
        return f"{job.label} ({', '.join(kept)})"

    @property
    def job_count(self) -> int:
        """How many synthesis jobs are planned."""
        return len(self._jobs)

    def bad_blocks(self) -> list:
        """Sorted labels of the finished jobs with latches, check problems or unmapped
        (``$``-prefixed) cells: what ``elmoe3d synth`` and the sweep's area task refuse."""
        return sorted(self.label(n) for n, r in self.results.items()
                      if r.latches or r.problems or any(t.startswith("$") for t in r.blackboxes))

    def result(self, name) -> SynthResult:
        return self.results[name]


def _short(key):
    from .blocks import short_key
    return short_key(key)


def _box_module(rep, key):
    """The black-box module name :func:`~elmoe3d.synth.blocks.hollow` gives sub-block
    ``rep`` (instance key ``key``)."""
    return f"elmoe3d_bb_{type(rep).__name__}_{_short(key)}"


# ---- the tile model -----------------------------------------------------------------------

def _area(result):
    return result.area


def tile_model(results, metric=_area) -> dict:
    """Coefficients of ``area(R, L) = a + b L + c R L`` (um^2) from the three fit tiles, and
    the categories of ``b`` (per lane) and ``c`` (per row and lane). ``metric``: the figure
    of a synthesis result fitted (default its area; the static power uses its leakage)."""
    t12 = metric(results[_tile_job(1, 2)])
    t22 = metric(results[_tile_job(2, 2)])
    t14 = metric(results[_tile_job(1, 4)])
    c = (t22 - t12) / 2                  # one more row of 2 lanes
    b = (t14 - t12) / 2 - c              # two more lanes of 1 row
    a = t12 - 2 * b - 2 * c
    mul = metric(results["leaf_mul"])
    dot = metric(results["leaf_dot_row"])
    fields = (metric(results["leaf_fields_even"]) + metric(results["leaf_fields_odd"])) / 2
    comb = metric(results["leaf_combiner"])
    per_rl = {"MAC": 32 * mul, "adder tree": dot - 32 * mul, "bit-slice support": comb / 2}
    per_rl["dequantization"] = c - sum(per_rl.values())
    per_l = {"bit-slice support": fields, "dequantization": b - fields}
    return {"a": a, "b": b, "c": c, "per_rl": per_rl, "per_l": per_l}


def _tile_breakdown(node: TileNode, results, metric=_area) -> Counter:
    m = tile_model(results, metric)
    out = Counter()
    out["tile control"] += m["a"]
    for cat, v in m["per_l"].items():
        out[cat] += v * node.lanes
    for cat, v in m["per_rl"].items():
        out[cat] += v * node.rows * node.lanes
    return out


def pe_control_model(node: PEModelNode, results, metric=_area) -> dict:
    """``a + b L + c L^2`` through the three hollow PEs of :data:`PE_FIT_LANES` lanes (the
    beat forming and memory ports grow with the word width W = 128 L, the result registers and
    the sinks' row selection with rows x lanes = L^2 / 2), evaluated at the PE's lanes."""
    (x0, x1, x2) = sorted(node.fits)
    y0, y1, y2 = (metric(results[node.fits[x]]) for x in (x0, x1, x2))
    # Lagrange interpolation through the three points
    def basis(x, xa, xb, xc):
        return (x - xb) * (x - xc) / ((xa - xb) * (xa - xc))
    x = node.lanes
    value = (y0 * basis(x, x0, x1, x2) + y1 * basis(x, x1, x0, x2) + y2 * basis(x, x2, x0, x1))
    return {"points": {x0: y0, x1: y1, x2: y2}, "lanes": x, "area": value}


# ---- evaluation ---------------------------------------------------------------------------

def evaluate(node, results, metric=_area) -> Counter:
    """Area of one instance of ``node`` by category (um^2): logic categories and
    ``sram:<role>``. With another ``metric`` (a figure of a synthesis result, e.g. its
    leakage: :func:`elmoe3d.synth.energy.leakage_nw`) the same roll-up of that figure, logic
    only (no SRAM lines)."""
    if isinstance(node, TileNode):
        return _tile_breakdown(node, results, metric)
    out = Counter()
    if isinstance(node, PEModelNode):
        out[node.category] += pe_control_model(node, results, metric)["area"]
    else:
        out[node.category] += metric(results[node.job])
    if metric is _area:
        for s in node.srams:
            out[f"sram:{s.role}"] += sram_area(s.width, s.depth, s.read_ports).area
    for child, count in node.children:
        for cat, v in evaluate(child, results, metric).items():
            out[cat] += v * count
    return out


def logic_area(breakdown: Counter) -> float:
    return sum(v for k, v in breakdown.items() if not k.startswith("sram:"))


def sram_total(breakdown: Counter) -> float:
    return sum(v for k, v in breakdown.items() if k.startswith("sram:"))


def leaf_table(node, results, count=1, rows=None, seen_depth=0):
    """Rows (label, instances, cells per instance, um^2 per instance, um^2 total) of every
    synthesised node under ``node`` (instances multiplied down the tree)."""
    rows = [] if rows is None else rows
    if isinstance(node, TileNode):
        m = tile_model(results)
        area = m["a"] + m["b"] * node.lanes + m["c"] * node.rows * node.lanes
        rows.append((f"{node.label} {node.rows}x{node.lanes}x32 (model)", count, None, area,
                     area * count))
        return rows
    if isinstance(node, PEModelNode):
        area = pe_control_model(node, results)["area"]
        rows.append((f"{node.label} control (model, {node.lanes} lanes)", count, None, area,
                     area * count))
    else:
        r = results[node.job]
        rows.append((f"{node.label} (own logic)", count, r.cell_count, r.area, r.area * count))
    for child, n in node.children:
        leaf_table(child, results, count * n, rows)
    return rows

"""Hierarchical timing: the worst register-to-register path of every block, the paths that
cross its sub-blocks' boundaries included.

Every synthesis job is a leaf: a block's own logic with its registered sub-blocks and SRAM
macros as black boxes (:func:`~elmoe3d.synth.blocks.hollow`). Its timing run
(:mod:`elmoe3d.synth.flow`, :mod:`elmoe3d.synth.sta`) gives, beside its own worst
register-to-register path, a boundary model at bus granularity: the worst delay from each
input bus (a port, or a black box's output ``instance/port``) to a register, from registers
to each output bus (a port, or a black box's input), and from each input bus to each output
bus through logic alone.

A block is a graph of these arcs (:func:`block_model`): vertices are ``launch`` (every
register's clock edge), ``capture`` (every register's setup) and the buses; edges are the
arcs of the block's own job, with its black-box pins, plus the boundary model of every
sub-block instance, itself built the same way (recursively) from its own job and
sub-blocks, and of every SRAM macro (clock to read data :data:`~elmoe3d.synth.sram.
READ_CLK_TO_Q_PS`, setup :data:`~elmoe3d.synth.sram.SETUP_PS`). The longest
``launch -> capture`` path is the block's worst register-to-register path: inside one leaf, or
from a register of the block through its logic into a sub-block's input logic and register,
from a sub-block's register through the block's logic into another sub-block, through a
sub-block's combinational input-to-output arcs (a ready chain), and so on. The block's own
boundary model (for its parent) is the longest path between its ports and the registers.

Limits (``docs/synth.md``, "Timing"): arcs are per bus, not per bit, so a chain may join the
worst bit of one arc to the worst bit of the next (an upper bound); a cycle between buses
(which a bit-level netlist would not have) is cut and reported; a sub-block's boundary arcs
are timed with a fixed input transition and output load (:data:`~elmoe3d.synth.sta.
PORT_SLEW_PS`, :data:`~elmoe3d.synth.sta.PORT_LOAD_FF`); each leaf is mapped on its own, so
a chain adds delays ABC minimised one leaf at a time. The tensor tile is timed from its fit
tiles (the worst of their arcs: the tile's paths are per row and lane, the fits have the
same ones, but smaller broadcast fanouts), and a PE too large to synthesise from its largest
control fit (:data:`~elmoe3d.synth.blocks.PE_FIT_LANES`; paths that grow with the lanes are
longer at the paper size: the trend over the fits is reported).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sram import READ_CLK_TO_Q_PS, SETUP_PS


__all__ = ["Model", "block_model", "leaf_rows", "describe", "LAUNCH", "CAPTURE"]


LAUNCH, CAPTURE = "launch", "capture"


@dataclass
class Model:
    """A block's timing: ``r2r`` its worst register-to-register path (``None`` if it has
    none), and its boundary arcs ``i2r`` (input bus -> path to a register), ``r2o`` (output
    bus -> path from a register), ``i2o`` ((input bus, output bus) -> combinational path).
    A path is a dict: ``ps`` and ``segments`` (``[block, from, to, ps]`` each), see
    :func:`describe`. ``cut`` lists the bus-level cycles cut."""

    r2r: dict | None
    i2r: dict = field(default_factory=dict)
    r2o: dict = field(default_factory=dict)
    i2o: dict = field(default_factory=dict)
    cut: list = field(default_factory=list)


def _path(ps, segments):
    return {"ps": ps, "segments": segments}


def _leaf_model(label, t) -> Model:
    """The model of one timed job ``t`` (:attr:`SynthResult.timing`) with no sub-blocks
    resolved (its black-box pins stay buses of its own)."""
    r = t.get("reg2reg")
    r2r = _path(r["ps"], [[label, r["start"], r["end"], r["ps"]]]) if r else None
    i2r = {b: _path(v, [[label, b, t.get("in2reg_to", {}).get(b, "register"), v]])
           for b, v in t["in2reg"].items()}
    r2o = {b: _path(v, [[label, t.get("reg2out_from", {}).get(b, "register"), b, v]])
           for b, v in t["reg2out"].items()}
    i2o = {}
    for key, v in t["in2out"].items():
        a, b = key.split(" -> ", 1)
        i2o[(a, b)] = _path(v, [[label, a, b, v]])
    return Model(r2r=r2r, i2r=i2r, r2o=r2o, i2o=i2o)


def _worst(models) -> Model:
    """Arc by arc, the worst of several models of the same block (the tile's fits)."""
    out = Model(r2r=None)
    for m in models:
        if m.r2r and (out.r2r is None or m.r2r["ps"] > out.r2r["ps"]):
            out.r2r = m.r2r
        for name in ("i2r", "r2o", "i2o"):
            mine, theirs = getattr(out, name), getattr(m, name)
            for k, p in theirs.items():
                if k not in mine or p["ps"] > mine[k]["ps"]:
                    mine[k] = p
        out.cut += m.cut
    return out


class _Graph:
    def __init__(self):
        self.edges = {}                  # u -> {v: path}

    def add(self, u, v, path):
        cur = self.edges.setdefault(u, {}).get(v)
        if cur is None or path["ps"] > cur["ps"]:
            self.edges[u][v] = path

    def longest(self, source):
        """Longest paths from ``source``: {vertex: path}; cycles cut (reported)."""
        order, state, cut = [], {}, []
        stack = [(source, iter(sorted(self.edges.get(source, {}))))]
        state[source] = 1
        while stack:
            u, it = stack[-1]
            for v in it:
                if state.get(v) == 1:
                    cut.append((u, v))
                    continue
                if v not in state:
                    state[v] = 1
                    stack.append((v, iter(sorted(self.edges.get(v, {})))))
                    break
            else:
                stack.pop()
                state[u] = 2
                order.append(u)
        order.reverse()
        cutset = set(cut)
        best = {source: _path(0.0, [])}
        for u in order:
            if u not in best:
                continue
            for v, p in self.edges.get(u, {}).items():
                if (u, v) in cutset:
                    continue
                ps = best[u]["ps"] + p["ps"]
                if v not in best or ps > best[v]["ps"]:
                    best[v] = _path(ps, best[u]["segments"] + p["segments"])
        return best, cut


def _prefixed(path, inst):
    return _path(path["ps"], [[f"{inst}: {seg[0]}", *seg[1:]] for seg in path["segments"]])


def _sram_model(stub_ports) -> Model:
    """An SRAM macro: read data from its clock edge, every input with setup."""
    m = Model(r2r=None)
    for port, direction in stub_ports.items():
        if direction == "output":
            m.r2o[port] = _path(READ_CLK_TO_Q_PS,
                                [["SRAM macro", "clock", port, READ_CLK_TO_Q_PS]])
        else:
            m.i2r[port] = _path(SETUP_PS, [["SRAM macro", port, "setup", SETUP_PS]])
    return m


def block_model(node, results, stubs, memo=None) -> Model:
    """The :class:`Model` of a roll-up node (:mod:`elmoe3d.synth.rollup`: a synthesised block,
    the tile from its fits, a PE from its largest control fit) from the planner's timed
    ``results`` (job -> :class:`~elmoe3d.synth.flow.SynthResult`) and ``stubs`` (job -> its
    black-box stubs, for their port directions), sub-blocks included (module docstring)."""
    from .rollup import PEModelNode, TileNode
    from .sta import stub_ports
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, TileNode):
        from .blocks import TILE_FIT
        fits = [f"tile_r{r}_l{lanes}" for r, lanes in TILE_FIT]
        model = _worst([_leaf_model(f"{node.label} (fit {results[j].name})",
                                    results[j].timing) for j in fits])
        memo[id(node)] = model
        return model
    if isinstance(node, PEModelNode):
        job = node.fits[max(node.fits)]
        label = f"{node.label} control ({max(node.fits)}-lane fit)"

        def child_of(module):
            cls = module[len("elmoe3d_bb_"):].rsplit("_", 1)[0]
            return node.boxes.get(cls)
    else:
        job = node.job
        label = f"{node.label}"

        def child_of(module):
            return node.boxes.get(module)
    result = results[job]
    t = result.timing
    if t is None:
        raise ValueError(f"{label}: no timing in the synthesis result (run with timing)")
    ports = stub_ports(stubs.get(job, ""))
    g = _Graph()
    own = _leaf_model(label, t)
    if own.r2r:
        g.add(LAUNCH, CAPTURE, own.r2r)
    for b, p in own.i2r.items():
        g.add(b, CAPTURE, p)
    for b, p in own.r2o.items():
        g.add(LAUNCH, b, p)
    for (a, b), p in own.i2o.items():
        g.add(a, b, p)
    unresolved = []
    for inst, module in sorted(t.get("blackboxes", {}).items()):
        if module.startswith("elmoe3d_sram_"):
            sub = _sram_model(ports.get(module, {}))
        else:
            child = child_of(module)
            if child is None:
                unresolved.append(f"{inst} ({module})")
                continue
            sub = block_model(child, results, stubs, memo)
        short = _instance(inst)
        if sub.r2r:
            g.add(LAUNCH, CAPTURE, _prefixed(sub.r2r, short))
        for b, p in sub.i2r.items():
            g.add(f"{inst}/{b}", CAPTURE, _prefixed(p, short))
        for b, p in sub.r2o.items():
            g.add(LAUNCH, f"{inst}/{b}", _prefixed(p, short))
        for (a, b), p in sub.i2o.items():
            g.add(f"{inst}/{a}", f"{inst}/{b}", _prefixed(p, short))
    best, cut = g.longest(LAUNCH)
    model = Model(r2r=best.get(CAPTURE) if CAPTURE in best and best[CAPTURE]["segments"]
                  else None)
    model.cut = [f"{u} -> {v}" for u, v in cut]
    if unresolved:
        model.cut.append("black boxes without a timing model: " + ", ".join(unresolved))
    inputs = sorted({b for b in own.i2r} | {a for a, _ in own.i2o})
    inputs = [b for b in inputs if "/" not in b]
    outputs = [b for b in own.r2o if "/" not in b] + \
        [b for _, b in own.i2o if "/" not in b]
    for b in outputs:
        if b in best:
            model.r2o[b] = best[b]
    for a in inputs:
        reach, more = g.longest(a)
        model.cut += [f"{u} -> {v}" for u, v in more if f"{u} -> {v}" not in model.cut]
        if CAPTURE in reach:
            model.i2r[a] = reach[CAPTURE]
        for b in set(outputs):
            if b in reach and b != a:
                model.i2o[(a, b)] = reach[b]
    memo[id(node)] = model
    return model


def _instance(inst: str) -> str:
    """A black-box instance's readable name (Yosys' flattened ``name.bb``)."""
    inst = inst.lstrip("\\")
    return inst[:-3] if inst.endswith(".bb") else inst


def describe(path, period) -> dict:
    """A path as the report shows it: ``ps``, ``slack``, ``start``, ``end`` and
    ``segments``."""
    segs = path["segments"]
    return {"ps": path["ps"], "slack": period - path["ps"],
            "start": f"{segs[0][0]}: {segs[0][1]}", "end": f"{segs[-1][0]}: {segs[-1][2]}",
            "segments": [{"block": s[0], "from": s[1], "to": s[2], "ps": s[3]} for s in segs]}


def leaf_rows(results, jobs, period) -> list:
    """One row per timed job: its own worst register-to-register path, and its worst input
    to register, register to output and input to output arcs (ps)."""
    rows = []
    for name, label in jobs:
        t = results[name].timing
        if t is None:
            continue
        r = t.get("reg2reg")

        def top(d):
            if not d:
                return None
            k = max(d, key=d.get)
            return {"bus": k, "ps": d[k]}
        rows.append({"job": name, "block": label, "cells": t["cells"], "area": t["area"],
                     "reg2reg": None if r is None else
                     {k: r[k] for k in ("ps", "slack", "start", "end", "levels", "clk_to_q",
                                        "logic", "setup")},
                     "in2reg": top(t["in2reg"]), "reg2out": top(t["reg2out"]),
                     "in2out": top(t["in2out"]), "abc_ps": t.get("abc_ps"),
                     "sta_abc_ps": t.get("sta_abc_ps")})
    return rows

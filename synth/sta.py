"""Static timing of a mapped netlist with the Liberty NLDM tables (block-level, one clock).

The timing run of :mod:`elmoe3d.synth.flow` maps a block with ABC's delay-driven mapping
(``abc -D``: mapping, buffering, gate sizing against the clock period) and writes the netlist
as BLIF. :func:`analyze` times it: arrival times and slews, rise and fall separately, are
propagated through every cell from the tables of the Liberty file the flow mapped with
(:class:`~elmoe3d.synth.liberty.Table`: bilinear interpolation, linear extrapolation, as ABC's
``stime`` and OpenSTA), and checked against the flip-flops' setup constraints.

Conventions (the same as ABC's ``stime``; each a module constant):

* **Loads.** A net's load is the sum of the input capacitances it drives (``rise_capacitance``
  for rising, ``fall_capacitance`` for falling transitions, else ``capacitance``); no wire
  load (the ASAP7 libraries have no wire-load model; placement is not modelled). An output
  port and an input pin of a black box (a sub-block or an SRAM macro, timed elsewhere) each
  add :data:`PORT_LOAD_FF` (the flip-flop's D capacitance: as if it fed one register).
* **Buffer trees.** ABC sees all the port and black-box pins of one net as one primary
  output, so it builds no tree for them (an SRAM macro's 512 byte enables driven by one
  signal, say). A cell-driven net whose two or more such pins alone exceed its driving pin's
  ``max_capacitance`` reaches them through the fastest balanced tree of the library's
  buffers (:meth:`TimingLib.buffer_tree`, chosen at a :data:`PORT_SLEW_PS` input): the net
  carries the root buffer's input, the pins are reached the tree's delay later (timed from
  the net's rise and fall transitions). This is the design-rule repair a placement flow
  makes; :attr:`Timing.buffer_trees` counts them.
* **Arcs.** The ``timing`` groups from the same input pin (several ``when`` conditions) are
  merged into their element-wise worst case, as ABC reads them; the sense is their common
  one (positive or negative unate), else non-unate. A cell's output slew is the worst over its
  arcs.
* **Clock.** One ideal clock (no skew, no latency) with transition :data:`CLOCK_SLEW_PS`
  at every flip-flop. A register-to-register path is clock-to-Q (the ``rising_edge`` tables at
  the clock slew and the Q net's load) + the logic + setup (``setup_rising`` at the D slew and
  the clock slew); its slack is the period minus that.
* **Ports.** Input ports and black-box outputs start with arrival 0 and transition
  :data:`PORT_SLEW_PS`; they are grouped into buses (``name[3]`` -> ``name``) for the block's
  boundary model (:class:`Timing`): the worst
  delay from each input bus to a register (with setup), from registers to each output bus
  (with clock-to-Q) and from each input bus to each output bus (combinational), black-box
  pins named ``instance/port``, used by
  :mod:`elmoe3d.synth.timing` to add paths that cross block boundaries.

:func:`analyze` with ``abc_conventions=True`` instead reproduces ABC's ``stime`` on the
combinational network ABC saw (flip-flop outputs and input ports driven by ABC's PI driving
cell, each endpoint a PO with ABC's PO load, no clock-to-Q or setup): the flow compares it
with the figure ABC itself writes (``stime -d``), so every block checks this STA against ABC.

Raises :class:`TimingError` (a :class:`~elmoe3d.errors.UserError`) for a netlist cell the
library does not describe, naming the cell.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field

from ..errors import UserError
from .liberty import DELAY_TABLES, Liberty, Table


__all__ = ["TimingError", "Netlist", "Gate", "read_blif", "stub_ports", "TimingLib",
           "Timing", "analyze", "CLOCK_SLEW_PS", "PORT_SLEW_PS", "PORT_LOAD_FF", "bus_of"]


#: Transition of the ideal clock at every flip-flop (ps).
CLOCK_SLEW_PS = 20.0
#: Transition of an input port or a black-box output (ps): a signal from another block.
PORT_SLEW_PS = 20.0
#: Load of an output port or a black-box input (fF): one flip-flop D pin of the library
#: (:meth:`TimingLib.port_load`); this default when the library has no flip-flop.
PORT_LOAD_FF = 0.56
#: Fanouts per stage tried for a buffer tree to the port and black-box pins of one net
#: (:meth:`TimingLib.buffer_tree`).
TREE_FANOUTS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)

_DELAY_VARS = ("input_net_transition", "total_output_net_capacitance")
_CONSTRAINT_VARS = ("constrained_pin_transition", "related_pin_transition")
REG = "(registers)"


class TimingError(UserError):
    """The netlist cannot be timed with the library; the message names the cell."""


# ---- netlists -------------------------------------------------------------------------------

@dataclass
class Gate:
    """One cell instance: library (or black-box) ``type``, instance ``name``, ``pins``
    (pin name, with ``[i]`` for a bus bit -> net name)."""

    type: str
    name: str
    pins: dict


@dataclass
class Netlist:
    """A flat mapped netlist: input port bits ``inputs`` (each its own net), output port
    bits ``outputs`` as ``(port bit, net)`` and ``gates``; ``constants`` are the nets tied
    to 0 or 1."""

    inputs: list
    outputs: list
    gates: list
    constants: set = field(default_factory=set)


def read_blif(text: str) -> Netlist:
    """The netlist of Yosys' ``write_blif -gates -cname`` output (one model). Aliases
    (``.names a b`` with cover ``1 1``, ``.conn``) are merged into one net."""
    inputs, outputs, gates, constants = [], [], [], set()
    alias = {}
    lines = []
    buf = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        line = buf + line
        buf = ""
        if line.strip():
            lines.append(line.split())
    i = 0
    while i < len(lines):
        tok = lines[i]
        head = tok[0]
        if head == ".inputs":
            inputs += tok[1:]
        elif head == ".outputs":
            outputs += tok[1:]
        elif head in (".gate", ".subckt"):
            pins = dict(p.split("=", 1) for p in tok[2:])
            name = ""
            if i + 1 < len(lines) and lines[i + 1][0] == ".cname":
                name = " ".join(lines[i + 1][1:])
                i += 1
            gates.append(Gate(tok[1], name, pins))
        elif head == ".names":
            cover = []
            while i + 1 < len(lines) and not lines[i + 1][0].startswith("."):
                cover.append(lines[i + 1])
                i += 1
            if len(tok) == 2:
                constants.add(tok[1])
            elif len(tok) == 3 and cover == [["1", "1"]]:
                alias[tok[2]] = tok[1]
            else:
                raise TimingError(f"netlist: .names {' '.join(tok[1:])} is not a buffer or a "
                                  f"constant (an unmapped cell)")
        elif head == ".conn":
            alias[tok[2]] = tok[1]
        i += 1

    def root(n):
        seen = 0
        while n in alias and seen < 1000000:
            n = alias[n]
            seen += 1
        return n

    if alias:
        for g in gates:
            g.pins = {p: root(n) for p, n in g.pins.items()}
        constants = {root(n) for n in constants}
    outputs = [(n, root(n)) for n in outputs]
    return Netlist(inputs=inputs, outputs=outputs, gates=gates, constants=constants)


_STUB = re.compile(r"module\s+(\S+)\s*\((.*?)\);", re.S)
_STUB_PORT = re.compile(r"(input|output)\s*(?:\[[^\]]*\])?\s*(\w+)")


def stub_ports(stubs: str) -> dict:
    """Black-box module -> {port: 'input' | 'output'} from the flow's Verilog stubs."""
    out = {}
    for m in _STUB.finditer(stubs):
        out[m.group(1).lstrip("\\")] = {p: d for d, p in _STUB_PORT.findall(m.group(2))}
    return out


_BIT = re.compile(r"\[\d+\]$")


def bus_of(name: str) -> str:
    """``name[3]`` -> ``name``."""
    return _BIT.sub("", name)


# ---- the library's timing view -------------------------------------------------------------

@dataclass
class _Arc:
    related: str
    sense: str                   # "pos", "neg" or "non"
    tables: dict                 # kind -> list of Table (worst case over them)
    abc_sense: str = ""          # the first arc's sense: what ABC reads


@dataclass
class _CellTiming:
    name: str
    caps: dict                   # input pin -> (rise, fall)
    arcs: dict                   # output pin -> [_Arc] (combinational)
    clock: str = ""              # flip-flop: clock pin
    clk_to_q: dict = field(default_factory=dict)   # output -> _Arc
    setup: dict = field(default_factory=dict)      # data pin -> {kind: [Table]}
    fast: dict = field(default_factory=dict)       # output -> [_fast(arc)]
    max_cap: dict = field(default_factory=dict)    # output -> max_capacitance (fF, NaN: none)


def _fast(arc):
    """An arc as the propagation loop reads it: (related pin, positive, negative, the same
    as ABC reads them, then cell_rise, cell_fall, rise_transition, fall_transition lookups
    (slew, load) -> ps)."""
    def one(kind):
        ts = arc.tables.get(kind) or arc.tables[_OTHER[kind]]
        if len(ts) == 1:
            return ts[0]
        return lambda x, y: max(t(x, y) for t in ts)
    return (arc.related, arc.sense in ("pos", "non"), arc.sense in ("neg", "non"),
            arc.abc_sense in ("pos", "non"), arc.abc_sense in ("neg", "non"),
            one("cell_rise"), one("cell_fall"), one("rise_transition"), one("fall_transition"))


def _merged(tables):
    """The element-wise worst case of tables with the same indices (as ABC reads several
    ``when`` arcs), else the list itself (looked up one by one, the largest taken)."""
    first = tables[0]
    if len(tables) > 1 and all(t.index == first.index and t.variables == first.variables and
                               len(t.values) == len(first.values) for t in tables):
        values = tuple(tuple(max(col) for col in zip(*rows)) for rows in
                       zip(*(t.values for t in tables)))
        return [Table(kind=first.kind, template=first.template, variables=first.variables,
                      index=first.index, values=values, line=first.line)]
    return list(tables)


def _sense(arcs) -> str:
    senses = {a.timing_sense for a in arcs}
    if senses == {"positive_unate"}:
        return "pos"
    if senses == {"negative_unate"}:
        return "neg"
    return "non"


class TimingLib:
    """The timing view of a :class:`~elmoe3d.synth.liberty.Liberty`: input capacitances,
    merged combinational arcs, flip-flop clock-to-Q and setup tables. Checks the library
    first (:meth:`~elmoe3d.synth.liberty.Liberty.check_timing`)."""

    def __init__(self, lib: Liberty):
        lib.check_timing()
        self.lib = lib
        self.cells = {}
        self.buffers = []            # (name, input cap, fast arc, max_capacitance)
        self._trees = {}
        for cell in lib.cells.values():
            caps = {}
            for pname, pin in cell.pins.items():
                if pin.direction == "input":
                    c = pin.caps.get("capacitance", 0.0)
                    caps[pname] = (pin.caps.get("rise_capacitance", c),
                                   pin.caps.get("fall_capacitance", c))
            ct = _CellTiming(name=cell.name, caps=caps, arcs={})
            clocks = [p for p, pin in cell.pins.items() if pin.clock]
            if cell.sequential and clocks:
                ct.clock = clocks[0]
            for out in cell.outputs:
                pin = cell.pins[out]
                by_related = defaultdict(list)
                for a in pin.arcs:
                    by_related[(a.timing_type, a.related_pin)].append(a)
                for (ttype, related), arcs in by_related.items():
                    tables = _compile({k: _merged([a.tables[k] for a in arcs if k in a.tables])
                                       for k in DELAY_TABLES if any(k in a.tables for a in arcs)},
                                      *_DELAY_VARS)
                    arc = _Arc(related=related, sense=_sense(arcs), tables=tables,
                               abc_sense=_sense(arcs[:1]))
                    if ttype == "combinational" and not cell.sequential:
                        ct.arcs.setdefault(out, []).append(arc)
                    elif ttype == "rising_edge" and related == ct.clock:
                        ct.clk_to_q[out] = arc
            for d, pin in cell.pins.items():
                setups = [a for a in pin.arcs if a.timing_type == "setup_rising"
                          and a.related_pin == ct.clock]
                if setups:
                    ct.setup[d] = _compile(
                        {k: _merged([a.tables[k] for a in setups if k in a.tables])
                         for k in ("rise_constraint", "fall_constraint")
                         if any(k in a.tables for a in setups)}, *_CONSTRAINT_VARS)
            ct.fast = {out: [_fast(a) for a in arcs] for out, arcs in ct.arcs.items()}
            ct.max_cap = {out: cell.pins[out].max_capacitance for out in cell.outputs}
            self.cells[cell.name] = ct
            (out, fn), = cell.outputs.items() if len(cell.outputs) == 1 else ((None, ""),)
            if (not cell.sequential and not cell.dont_use and len(cell.inputs) == 1
                    and fn.strip().strip('"') == cell.inputs[0] and out in ct.fast
                    and math.isfinite(ct.max_cap[out])):
                self.buffers.append((cell.name, max(caps[cell.inputs[0]]), ct.fast[out][0],
                                     ct.max_cap[out]))
        flops = [c for c in self.cells.values() if c.clock and c.setup]
        self.port_load = max((max(c.caps[d]) for c in flops for d in c.setup), default=
                             PORT_LOAD_FF)

    def cell(self, name: str) -> _CellTiming | None:
        return self.cells.get(name)

    def buffer_tree(self, pins: int, pin_load: float) -> dict | None:
        """The fastest balanced buffer tree from one net to ``pins`` loads of ``pin_load`` fF
        each (:data:`TREE_FANOUTS` per stage, one buffer cell of the library throughout, no
        stage above the buffer's ``max_capacitance``), timed at :data:`PORT_SLEW_PS` input:
        ``cell``, ``fanout``, ``stages``, ``root_cap`` (fF, the load the net sees), ``loads``
        (fF per stage) and ``arc`` (the buffer's fast arc). ``None`` without a buffer cell."""
        key = (pins, pin_load)
        if key not in self._trees:
            best = None
            for name, cin, arc, max_cap in self.buffers:
                for f in TREE_FANOUTS:
                    if f * max(cin, pin_load) > max_cap:
                        continue
                    stages = 1
                    while f ** stages < pins:
                        stages += 1
                    loads = [f * cin] * (stages - 1) + [-(-pins // f ** (stages - 1)) * pin_load]
                    tree = {"cell": name, "fanout": f, "stages": stages, "root_cap": cin,
                            "loads": loads, "arc": arc}
                    d = max(tree_delay(tree, PORT_SLEW_PS)[:2])
                    if best is None or d < best[0]:
                        best = (d, tree)
            self._trees[key] = best and best[1]
        return self._trees[key]


def tree_delay(tree: dict, slew_r: float, slew_f: float | None = None) -> tuple:
    """Rise and fall delay (ps) through ``tree`` (:meth:`TimingLib.buffer_tree`: buffers, so a
    rise stays a rise) and the rise and fall transitions at its loads, from a net with rise
    and fall transitions ``slew_r`` and ``slew_f`` (ps; ``slew_f`` defaults to ``slew_r``)."""
    cr, cf, rt, ft = tree["arc"][5:]
    d_r = d_f = 0.0
    s_r, s_f = slew_r, slew_r if slew_f is None else slew_f
    for load in tree["loads"]:
        d_r, d_f = d_r + cr(s_r, load), d_f + cf(s_f, load)
        s_r, s_f = rt(s_r, load), ft(s_f, load)
    return d_r, d_f, s_r, s_f


class _T2:
    """A table compiled for fast lookups along two named variables (``x``, ``y``): the same
    arithmetic as :meth:`~elmoe3d.synth.liberty.Table.lookup` (bilinear, linear
    extrapolation), index segments found by bisection."""

    __slots__ = ("i1", "i2", "rows", "swap", "table")

    def __init__(self, table: Table, x: str, y: str):
        self.table = table
        v = table.variables
        self.swap = len(v) == 2 and v[0] == y and v[1] == x
        if len(table.index) != 2 or len(table.index[0]) < 2 or len(table.index[1]) < 2 or \
                (len(v) == 2 and {v[0], v[1]} != {x, y}):
            self.i1 = None                      # anything else: the general lookup
        else:
            self.i1, self.i2, self.rows = table.index[0], table.index[1], table.values

    def __call__(self, x: float, y: float) -> float:
        i1 = self.i1
        if i1 is None:
            t = self.table
            names = t.variables
            vals = dict(zip(names, (x, y))) if not self.swap else dict(zip(names, (y, x)))
            return t.lookup(**vals) if names else t.lookup()
        if self.swap:
            x, y = y, x
        i2, rows = self.i2, self.rows
        s = bisect_right(i1, x, 1, len(i1) - 1) - 1
        l = bisect_right(i2, y, 1, len(i2) - 1) - 1
        fs = (x - i1[s]) / (i1[s + 1] - i1[s])
        fl = (y - i2[l]) / (i2[l + 1] - i2[l])
        r0, r1 = rows[s], rows[s + 1]
        p0 = r0[l] + fl * (r0[l + 1] - r0[l])
        p1 = r1[l] + fl * (r1[l + 1] - r1[l])
        return p0 + fs * (p1 - p0)


def _compile(tables, x, y):
    return {k: [_T2(t, x, y) for t in ts] for k, ts in tables.items()}


_OTHER = {"cell_rise": "cell_fall", "cell_fall": "cell_rise",
          "rise_transition": "fall_transition", "fall_transition": "rise_transition"}


def _delay(tables, kind, slew, load):
    ts = tables.get(kind) or tables[_OTHER[kind]]     # only rise or only fall: as ABC does
    if len(ts) == 1:
        return ts[0](slew, load)
    return max(t(slew, load) for t in ts)


def _constraint(tables, kind, d_slew, clk_slew):
    ts = tables.get(kind) or tables.get("rise_constraint") or tables.get("fall_constraint")
    return max(t(d_slew, clk_slew) for t in ts)


# ---- results --------------------------------------------------------------------------------

@dataclass
class Timing:
    """The timing of one block (ps; loads fF).

    Attributes
    ----------
    period : float
        Clock period the slack is taken against.
    reg2reg : dict or None
        Worst register-to-register path: ``ps`` (clock-to-Q + logic + setup), ``slack``,
        ``clk_to_q``, ``logic``, ``setup``, ``start`` and ``end`` (register names: the
        signal a flip-flop holds, bit included), ``levels`` (cells), ``path`` (``[cell type,
        output net, arrival ps]`` from start to end, at most 80 steps, the middle elided).
        ``None``: the block has no register-to-register path.
    in2reg, reg2out : dict
        Input bus -> worst delay to a register (with setup); output bus -> worst delay from a
        register (with clock-to-Q). Buses: ports, and black-box pins as ``instance/port``.
    in2out : dict
        ``"in_bus -> out_bus"`` -> worst combinational delay.
    in2reg_to, reg2out_from : dict
        The register at the end of each bus's worst ``in2reg`` path, at the start of each
        bus's worst ``reg2out`` path.
    blackboxes : dict
        Black-box instance -> module name.
    abc_ps, sta_abc_ps : float
        ABC's own ``stime`` delay of the network it mapped (integer ps, ``None`` if ABC did
        not write it) and this STA's figure under ABC's conventions.
    cells, area : int, float
        Cells and cell area (um^2) of the timing netlist.
    loops : int
        Combinational cells left out of the propagation (in loops).
    buffer_trees : dict
        ``nets`` given a buffer tree to their port and black-box pins and the ``pins`` they
        reach (module docstring, "Buffer trees"); the trees' cells are not in ``cells`` or
        ``area``.
    """

    period: float
    reg2reg: dict | None
    in2reg: dict
    reg2out: dict
    in2out: dict
    in2reg_to: dict = field(default_factory=dict)
    reg2out_from: dict = field(default_factory=dict)
    blackboxes: dict = field(default_factory=dict)
    abc_ps: float | None = None
    sta_abc_ps: float | None = None
    cells: int = 0
    area: float = 0.0
    loops: int = 0
    buffer_trees: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        from dataclasses import asdict
        return asdict(self)


# ---- analysis -------------------------------------------------------------------------------

def _reg_name(gate: Gate) -> str:
    """The signal a flip-flop holds, from its instance name (``rename -wire`` gives
    ``<signal>$_DFF_P_``; ABC and Yosys prefix ``$abc$N$``)."""
    name = gate.name.lstrip("\\")
    name = re.sub(r"^(\$abc\$\d+\$)+", "", name)
    name = re.sub(r"\$_[A-Z0-9_]*_$", "", name)
    return name or gate.name


def comb_order(net, tlib, comb, driver, fanout_gates) -> list:
    """The combinational cells ``comb`` (indices into ``net.gates``) in topological order
    (Kahn's algorithm): a cell after every combinational cell that drives one of its inputs.
    ``driver``: net -> (gate index, pin); ``fanout_gates(net)``: the gate indices the net
    drives. Cells in combinational loops are left out (the caller compares the lengths)."""
    comb_set = set(comb)
    indeg = {}
    for gi in comb:
        g = net.gates[gi]
        ct = tlib.cell(g.type)
        indeg[gi] = sum(1 for p, n in g.pins.items()
                        if p in ct.caps and n in driver and driver[n][0] in comb_set)
    ready = [gi for gi in comb if indeg[gi] == 0]
    order = []
    while ready:
        gi = ready.pop()
        order.append(gi)
        g = net.gates[gi]
        ct = tlib.cell(g.type)
        for p, n in g.pins.items():
            if p in ct.caps:
                continue
            for gj in fanout_gates(n):
                if gj in comb_set:
                    indeg[gj] -= 1
                    if indeg[gj] == 0:
                        ready.append(gj)
    return order


def net_graph(net: Netlist, tlib: TimingLib, stubs: dict, *, port_load: float,
              abc_conventions: bool = False) -> tuple:
    """The nets of a mapped netlist: ``(driver, fanout, seq, comb, boxes, loads_r, loads_f,
    po_nets)``. ``driver``: net -> (gate index, pin); ``fanout``: net -> [(gate index, pin)];
    ``seq`` / ``comb`` / ``boxes``: gate indices of the flip-flops, the combinational cells
    and the black boxes (``stubs``: module -> {port: direction}); ``loads_r`` / ``loads_f``:
    net -> rise / fall input capacitance it drives (fF), black-box inputs and output ports
    ``port_load`` each. With ``abc_conventions`` the nets ABC sees as primary outputs
    (flip-flop D pins, black-box inputs, output ports) are collected in ``po_nets`` instead
    of loaded. Raises :class:`TimingError` for a cell neither in ``tlib`` nor in ``stubs``."""
    const = net.constants
    loads_r = defaultdict(float)
    loads_f = defaultdict(float)
    fanout = defaultdict(list)            # net -> [(gate index, pin)]
    driver = {}                           # net -> (gate index, pin)
    seq, comb, boxes = [], [], []
    po_nets = set()
    for gi, g in enumerate(net.gates):
        ct = tlib.cell(g.type)
        if ct is None:
            ports = stubs.get(g.type)
            if ports is None:
                raise TimingError(f"netlist cell {g.name or '?'} of type {g.type}: not in the "
                                  f"library and not a known black box")
            boxes.append(gi)
            for p, n in g.pins.items():
                d = ports.get(bus_of(p))
                if d == "output":
                    driver[n] = (gi, p)
                elif d == "input" and n not in const:
                    if abc_conventions:
                        po_nets.add(n)
                    else:
                        loads_r[n] += port_load
                        loads_f[n] += port_load
                    fanout[n].append((gi, p))
            continue
        (seq if ct.clock else comb).append(gi)
        for p, n in g.pins.items():
            if p in ct.caps:
                if ct.clock and p == ct.clock:
                    continue
                if abc_conventions and ct.clock:     # a flip-flop's D: an ABC PO
                    po_nets.add(n)
                else:
                    loads_r[n] += ct.caps[p][0]
                    loads_f[n] += ct.caps[p][1]
                fanout[n].append((gi, p))
            else:
                driver[n] = (gi, p)
    for _, n in net.outputs:
        if n not in const:
            if abc_conventions:
                po_nets.add(n)
            else:
                loads_r[n] += port_load
                loads_f[n] += port_load
    return driver, fanout, seq, comb, boxes, loads_r, loads_f, po_nets


def analyze(net: Netlist, tlib: TimingLib, *, period: float = 1000.0, stubs: dict | None = None,
            abc_conventions: bool = False, abc_driver: str | None = None,
            abc_load: float | None = None) -> Timing:
    """Time ``net`` (see the module docstring). ``stubs``: black-box module -> {port:
    direction} (:func:`stub_ports`). With ``abc_conventions`` the result's ``sta_abc_ps`` is
    the largest arrival at any endpoint under ABC's ``stime`` conventions (PI driving cell
    ``abc_driver``, PO load ``abc_load``) and nothing else is computed."""
    stubs = stubs or {}
    const = net.constants
    port_load = abc_load if abc_conventions and abc_load is not None else tlib.port_load
    driver, fanout, seq, comb, boxes, loads_r, loads_f, po_nets = net_graph(
        net, tlib, stubs, port_load=port_load, abc_conventions=abc_conventions)
    for n in po_nets:                        # ABC: one PO per signal, whatever reads it
        loads_r[n] += port_load
        loads_f[n] += port_load
    trees = {} if abc_conventions else _repair(net, tlib, driver, fanout, boxes, loads_r,
                                               loads_f, port_load)

    # arrival state: net -> {source: [arr_rise, arr_fall]}; slews net -> [rise, fall]
    arr = {}
    slew = {}
    pred = {}                 # (net, 0|1) -> (gate index, input net, 0|1) for source REG
    launch = {}               # net -> flip-flop gate index (REG sources)
    boxes_of = {}

    def start(n, source, a_r, a_f, s_r, s_f):
        arr.setdefault(n, {})[source] = [a_r, a_f]
        s = slew.setdefault(n, [0.0, 0.0])
        s[0], s[1] = max(s[0], s_r), max(s[1], s_f)

    driver_cell = tlib.cell(abc_driver) if abc_driver else None

    def abc_input(n):
        """ABC's PI timing (Scl_LibHandleInputDriver): the driving cell's delay under the
        load minus under no load, its slew under the load, input slew 0."""
        if driver_cell is None:
            return 0.0, 0.0, 0.0, 0.0
        (arc,) = next(iter(driver_cell.arcs.values()))
        t = arc.tables
        lr, lf = loads_r[n], loads_f[n]
        ar = _delay(t, "cell_rise", 0.0, lr) - _delay(t, "cell_rise", 0.0, 0.0)
        af = _delay(t, "cell_fall", 0.0, lf) - _delay(t, "cell_fall", 0.0, 0.0)
        return ar, af, _delay(t, "rise_transition", 0.0, lr), \
            _delay(t, "fall_transition", 0.0, lf)

    for n in net.inputs:
        if n in const:
            continue
        if abc_conventions:
            start(n, "in", *abc_input(n))
        else:
            start(n, bus_of(n), 0.0, 0.0, PORT_SLEW_PS, PORT_SLEW_PS)
    for gi in boxes:
        g = net.gates[gi]
        ports = stubs[g.type]
        boxes_of[g.name] = g.type
        for p, n in g.pins.items():
            if ports.get(bus_of(p)) == "output" and n not in const:
                if abc_conventions:
                    start(n, "in", *abc_input(n))
                else:
                    start(n, f"{g.name}/{bus_of(p)}", 0.0, 0.0, PORT_SLEW_PS, PORT_SLEW_PS)
    for gi in seq:
        g = net.gates[gi]
        ct = tlib.cell(g.type)
        for out, arc in ct.clk_to_q.items():
            n = g.pins.get(out)
            if n is None or n in const:
                continue
            if abc_conventions:
                start(n, "in", *abc_input(n))
                continue
            lr, lf = loads_r[n], loads_f[n]
            t = arc.tables
            start(n, REG, _delay(t, "cell_rise", CLOCK_SLEW_PS, lr),
                  _delay(t, "cell_fall", CLOCK_SLEW_PS, lf),
                  _delay(t, "rise_transition", CLOCK_SLEW_PS, lr),
                  _delay(t, "fall_transition", CLOCK_SLEW_PS, lf))
            launch[n] = gi

    order = comb_order(net, tlib, comb, driver,
                       lambda n: (gj for gj, _ in fanout.get(n, ())))
    loops = len(comb) - len(order)

    ninf = -math.inf
    for gi in order:
        g = net.gates[gi]
        pins = g.pins
        for out, arcs in tlib.cell(g.type).fast.items():
            on = pins.get(out)
            if on is None:
                continue
            lr, lf = loads_r[on], loads_f[on]
            res = {}
            sr_out = sf_out = 0.0
            best_r = best_f = None
            for related, pos, neg, abc_pos, abc_neg, cr, cf, rt, ft in arcs:
                inn = pins.get(related)
                a_in = arr.get(inn) if inn is not None else None
                if a_in is None or inn in const:
                    continue
                if abc_conventions:
                    pos, neg = abc_pos, abc_neg
                s_in = slew[inn]
                # a positive-unate arc takes the output's rise from the input's rise (index
                # 0) and its fall from the fall (1); a negative one the other way round
                for ir, jf in ((0, 1),) * pos + ((1, 0),) * neg:
                    s_r, s_f = s_in[ir], s_in[jf]
                    d_r, d_f = cr(s_r, lr), cf(s_f, lf)
                    x = rt(s_r, lr)
                    if x > sr_out:
                        sr_out = x
                    x = ft(s_f, lf)
                    if x > sf_out:
                        sf_out = x
                    for src, a in a_in.items():
                        cur = res.get(src)
                        if cur is None:
                            cur = res[src] = [ninf, ninf]
                        v = a[ir] + d_r
                        if v > cur[0]:
                            cur[0] = v
                            if src == REG:
                                best_r = (inn, ir)
                        v = a[jf] + d_f
                        if v > cur[1]:
                            cur[1] = v
                            if src == REG:
                                best_f = (inn, jf)
            if res:
                arr[on] = res
                slew[on] = [sr_out, sf_out]
                if best_r is not None:
                    pred[(on, 0)] = (gi, *best_r)
                if best_f is not None:
                    pred[(on, 1)] = (gi, *best_f)

    if abc_conventions:
        worst = 0.0
        ends = [n for _, n in net.outputs if n in arr]
        for gi in seq + boxes:
            g = net.gates[gi]
            ct = tlib.cell(g.type)
            for p, n in g.pins.items():
                if n in arr and ((ct is not None and p in ct.setup) or
                                 (ct is None and stubs[g.type].get(bus_of(p)) == "input")):
                    ends.append(n)
        for n in ends:
            worst = max(worst, *(max(a) for a in arr[n].values()))
        return Timing(period=period, reg2reg=None, in2reg={}, reg2out={}, in2out={},
                      sta_abc_ps=worst, cells=len(net.gates), loops=loops)

    # endpoints
    in2reg, reg2out, in2out, in2reg_to = {}, {}, {}, {}
    worst = None
    for gi in seq:
        g = net.gates[gi]
        ct = tlib.cell(g.type)
        for d, tables in ct.setup.items():
            n = g.pins.get(d)
            if n is None or n not in arr:
                continue
            s = slew[n]
            setup = (_constraint(tables, "rise_constraint", s[0], CLOCK_SLEW_PS),
                     _constraint(tables, "fall_constraint", s[1], CLOCK_SLEW_PS))
            for src, a in arr[n].items():
                for o in (0, 1):
                    total = a[o] + setup[o]
                    if src == REG:
                        if worst is None or total > worst[0]:
                            worst = (total, n, o, setup[o], gi)
                    elif total > in2reg.get(src, -math.inf):
                        in2reg[src] = total
                        in2reg_to[src] = _reg_name(g)
    ends = [(n, bus_of(p)) for p, n in net.outputs]
    for gi in boxes:
        g = net.gates[gi]
        for p, n in g.pins.items():
            if stubs[g.type].get(bus_of(p)) == "input":
                ends.append((n, f"{g.name}/{bus_of(p)}"))
    reg2out_at = {}
    extra = {n: tree_delay(t, *slew[n])[:2] for n, t in trees.items() if n in arr}
    for n, bus in ends:
        d_r, d_f = extra.get(n, (0.0, 0.0))
        for src, a in arr.get(n, {}).items():
            v = max(a[0] + d_r, a[1] + d_f)
            if src == REG:
                if v > reg2out.get(bus, -math.inf):
                    reg2out[bus] = v
                    reg2out_at[bus] = (n, 0 if a[0] + d_r >= a[1] + d_f else 1)
            else:
                key = f"{src} -> {bus}"
                in2out[key] = max(in2out.get(key, -math.inf), v)

    def origin(n, o):
        """The flip-flop launching the worst register path to (net, transition)."""
        cur = (n, o)
        while cur in pred:
            _, inn, i = pred[cur]
            cur = (inn, i)
        gi = launch.get(cur[0])
        return (_reg_name(net.gates[gi]) if gi is not None else "?"), cur

    reg2out_from = {bus: origin(*at)[0] for bus, at in reg2out_at.items()}
    reg2reg = None
    if worst is not None:
        total, n, o, setup, end_gi = worst
        steps = []
        cur = (n, o)
        while cur in pred:
            gi, inn, i = pred[cur]
            steps.append([net.gates[gi].type, cur[0], round(arr[cur[0]][REG][cur[1]], 2)])
            cur = (inn, i)
        start_gi = launch.get(cur[0])
        clk_q = arr[cur[0]][REG][cur[1]]
        steps.append([net.gates[start_gi].type if start_gi is not None else "?", cur[0],
                      round(clk_q, 2)])
        steps.reverse()
        levels = len(steps) - 1
        if len(steps) > 80:
            steps = steps[:40] + [["...", f"{len(steps) - 80} steps", None]] + steps[-40:]
        reg2reg = {"ps": total, "slack": period - total, "clk_to_q": clk_q,
                   "logic": arr[n][REG][o] - clk_q, "setup": setup,
                   "start": _reg_name(net.gates[start_gi]) if start_gi is not None else "?",
                   "end": _reg_name(net.gates[end_gi]), "levels": levels, "path": steps}
    return Timing(period=period, reg2reg=reg2reg, in2reg=in2reg, reg2out=reg2out,
                  in2out=in2out, in2reg_to=in2reg_to, reg2out_from=reg2out_from,
                  blackboxes=boxes_of, cells=len(net.gates), loops=loops,
                  buffer_trees={"nets": len(trees),
                                "pins": sum(t["pins"] for t in trees.values())})


def _repair(net, tlib, driver, fanout, boxes, loads_r, loads_f, port_load) -> dict:
    """Buffer trees for the nets whose port and black-box input pins overload their driver
    (ABC saw those pins as one primary output, so it built no tree for them): a net driven by
    a cell whose two or more such pins alone load it beyond the cell pin's
    ``max_capacitance`` gets :meth:`TimingLib.buffer_tree` to them, as a design-rule repair
    after placement would, when the tree's root loads the net less than the pins; the net then
    carries the root instead of the pins (``loads_r`` / ``loads_f`` changed in place). Returns
    net -> tree (with ``pins``). ``driver``, ``fanout``, ``boxes``: from :func:`net_graph`."""
    boxes = set(boxes)
    pins = defaultdict(int)
    for n, reads in fanout.items():           # black-box input pins (net_graph's fanout)
        pins[n] += sum(1 for gi, _ in reads if gi in boxes)
    for _, n in net.outputs:
        if n not in net.constants:
            pins[n] += 1
    trees = {}
    for n, k in pins.items():
        drv = driver.get(n)
        ct = tlib.cell(net.gates[drv[0]].type) if drv is not None and k > 1 else None
        if ct is None or not k * port_load > ct.max_cap.get(drv[1], math.nan):
            continue
        tree = tlib.buffer_tree(k, port_load)
        if tree is None or tree["root_cap"] >= k * port_load:
            continue
        for loads in (loads_r, loads_f):
            loads[n] += tree["root_cap"] - k * port_load
        trees[n] = dict(tree, pins=k)
    return trees


"""Power of a mapped netlist from the Liberty internal-power and leakage tables, net switching
and annotated switching activity (block-level, one clock, zero-delay).

The timing run of :mod:`elmoe3d.synth.flow` maps a leaf for delay and writes it as BLIF
(:func:`~elmoe3d.synth.sta.read_blif`). :func:`analyze_power` computes its energy per clock
cycle and its leakage from

* **activity**: a signal probability ``p`` (P(net = 1)) and a toggle rate ``t`` (transitions
  per clock cycle, 0..1 in a zero-delay model) for every register output, input port and
  black-box output (:class:`Activity`; from simulation, :mod:`elmoe3d.synth.activity`, or a
  stated default for the nets not annotated). They are propagated to every net through each
  cell's Boolean function with the lag-one (zero-delay) model of probabilistic power
  estimation: every input is a two-state Markov chain over a clock cycle (``P(0->1) =
  P(1->0) = t/2``), inputs of a cell independent of each other (the usual spatial
  independence assumption), and a cell output's ``t`` is the probability that its function
  differs between the previous and the present input vector, ``p`` the probability that it
  is 1 (F. N. Najm, "Transition density: a new measure of activity in digital circuits",
  IEEE Trans. CAD 12(2), 1993, for the propagation of probability and activity through
  Boolean functions; R. Marculescu, D. Marculescu, M. Pedram, "Efficient power estimation
  for highly correlated input streams", DAC 1995, and A. Ghosh, S. Devadas, K. Keutzer,
  J. White, "Estimation of average switching activity in combinational and sequential
  circuits", DAC 1992, for the zero-delay transition probability). Zero delay: glitches are
  not counted (Najm's transition density, which counts them under the independence
  assumption, grows without bound along adder carry chains). Reconvergent fanout is not
  modelled (the independence assumption).
* **internal energy** of every cell output transition from its ``internal_power`` tables
  (``rise_power`` / ``fall_power``, summed over the power pins VDD and VSS as ASAP7 gives
  them; the library's energy unit, fJ, = capacitance unit x voltage unit^2) at the slew of
  the input that caused it and the output net's load, an output toggle shared between the
  related inputs in proportion to ``P(dy/dx_i) t_i`` (Boolean difference); arcs with
  ``when`` states are averaged over the states' probabilities; input-pin (passive) groups
  are energy per toggle of that input in each ``when`` state (the flip-flop's D pin, and
  its clock pin once per rising and once per falling clock edge, at the clock transition);
* **net switching** ``1/2 C V^2`` per toggle, ``C`` the sum of the input-pin capacitances
  the net drives (mean of rise and fall capacitance) plus one flip-flop D pin for an output
  port or a black-box input (:data:`~elmoe3d.synth.sta.PORT_LOAD_FF`, as the STA); no wire
  capacitance (the ASAP7 libraries have no wire-load model and nothing is placed);
  ``V`` the library's ``nom_voltage``;
* **clock pins**: the flip-flops' clock-pin capacitance charged and discharged once a cycle
  (``C V^2``); the clock tree (buffers, wires) is not modelled;
* **leakage** of every cell: its ``leakage_power`` ``when`` states averaged by their
  probabilities (inputs from the propagation, a flip-flop's state from its register's
  ``p``), else the cell's unconditional value.

Slews are propagated as the STA does (:mod:`elmoe3d.synth.sta`: worst transition over a
cell's arcs, ports :data:`~elmoe3d.synth.sta.PORT_SLEW_PS`, clock
:data:`~elmoe3d.synth.sta.CLOCK_SLEW_PS`); a table is looked up at the mean of the rise and
fall transition of the related net.

Raises :class:`PowerError` (a :class:`~elmoe3d.errors.UserError`, one line) for a netlist
cell the library does not describe and, through :func:`check_power`, for a library without
the tables power needs (the message names the file and the cell).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from ..errors import UserError
from .liberty import Liberty, LibertyError, eval_function
from .sta import (CLOCK_SLEW_PS, PORT_SLEW_PS, Netlist, TimingError, TimingLib, _reg_name,
                  bus_of, comb_order, net_graph)


__all__ = ["PowerError", "Activity", "PowerLib", "Power", "analyze_power", "check_power",
           "DEFAULT_ACTIVITY", "energy_unit_fj", "leakage_unit_nw"]


class PowerError(UserError):
    """The netlist's power cannot be computed with the library; the message names the cell."""


@dataclass(frozen=True)
class Activity:
    """Switching activity of one net: ``p`` = P(net is 1), ``t`` = transitions per clock cycle
    (0 <= t <= 2 min(p, 1 - p): a net toggles at most once a cycle and only as often as it
    changes value)."""

    p: float
    t: float

    def clamped(self) -> "Activity":
        p = min(max(float(self.p), 0.0), 1.0)
        return Activity(p, min(max(float(self.t), 0.0), 2 * min(p, 1 - p)))


#: The activity of a register, port or black-box output the simulation did not annotate:
#: P(1) = 0.5, one toggle every 10 cycles (the default input activity of vectorless power
#: tools, e.g. OpenSTA's ``set_power_activity -input`` default density 0.1).
DEFAULT_ACTIVITY = Activity(0.5, 0.1)


_UNIT = re.compile(r"^\s*([0-9.eE+-]*)\s*([a-zA-Z]+)\s*$")
_SCALE = {"f": 1e-15, "p": 1e-12, "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0}


def _unit(text: str, base: str) -> float:
    """``"1pW"`` -> 1e-12 (for base ``W``), ``"1 ff"`` -> 1e-15 (base ``f``)."""
    text = text.replace(" ", "")
    m = _UNIT.match(text)
    if not m:
        raise ValueError(text)
    num = float(m.group(1) or 1.0)
    unit = m.group(2)
    if unit.lower().endswith(base.lower()):
        prefix = unit[:-len(base)]
    else:
        raise ValueError(text)
    return num * _SCALE[prefix.lower() if prefix != "m" and prefix != "M" else prefix.lower()]


def leakage_unit_nw(lib: Liberty) -> float:
    """The library's leakage power unit in nW (``1pW`` -> 0.001)."""
    try:
        return _unit(lib.units.get("leakage_power_unit") or "1nW", "W") / 1e-9
    except (ValueError, KeyError):
        raise LibertyError(f"--liberty {lib.path}: leakage_power_unit "
                           f"{lib.units.get('leakage_power_unit')!r} is not a power unit") \
            from None


def energy_unit_fj(lib: Liberty) -> float:
    """The internal-power energy unit in fJ: capacitive load unit x voltage unit^2."""
    try:
        cap = lib.units.get("capacitive_load_unit") or "1 pf"
        num, unit = cap.split()
        c = float(num) * _unit("1" + unit, "f")
        v = _unit(lib.units.get("voltage_unit") or "1V", "V")
    except (ValueError, KeyError):
        raise LibertyError(f"--liberty {lib.path}: capacitive_load_unit / voltage_unit "
                           f"{lib.units.get('capacitive_load_unit')!r} / "
                           f"{lib.units.get('voltage_unit')!r} cannot be read") from None
    return c * v * v / 1e-15


def check_power(lib: Liberty, cells=None) -> None:
    """Raise :class:`~elmoe3d.synth.liberty.LibertyError` (one line naming the file, the line
    and the cell) unless every cell (of ``cells``, default all with an output function) has
    what power needs: ``internal_power`` with ``rise_power`` or ``fall_power`` on every
    output (a combinational output from every input its function reads, a flip-flop output
    from its clock), at least one ``leakage_power`` value, and no NaN or infinity in them;
    and the library a finite ``nom_voltage``."""
    if not (isinstance(lib.nom_voltage, float) and math.isfinite(lib.nom_voltage)
            and lib.nom_voltage > 0):
        raise LibertyError(f"--liberty {lib.path}: no usable nom_voltage (needed for the "
                           f"switching energy 1/2 C V^2)")
    names = cells if cells is not None else [n for n, c in lib.cells.items()
                                            if any(c.outputs.values()) and not c.dont_use]
    for name in names:
        cell = lib.cells[name]
        where = f"{lib.path}:{cell.line}: cell {cell.name}"
        if not cell.leakage:
            raise LibertyError(f"{where}: no leakage_power (needed for power)")
        for lk in cell.leakage:
            if not math.isfinite(lk.value):
                raise LibertyError(f"{where}: leakage_power {lk.value!r} is not a finite "
                                   f"number")
        clocks = [p for p, pin in cell.pins.items() if pin.clock]
        for out, function in cell.outputs.items():
            if not function:
                continue
            pin = cell.pins[out]
            related = clocks if cell.sequential else \
                [p for p in cell.inputs if re.search(
                    rf"(?<![A-Za-z0-9_]){re.escape(p)}(?![A-Za-z0-9_\[])", function)]
            for r in related:
                groups = [g for g in pin.power if g.related_pin == r]
                if not any({"rise_power", "fall_power"} & set(g.tables) for g in groups):
                    raise LibertyError(f"{where}: no internal_power for output {out} from "
                                       f"input {r} (needed for power: rise_power, fall_power)")
        for pin in cell.pins.values():
            for g in pin.power:
                for kind, table in g.tables.items():
                    if not table.values or not table.finite():
                        raise LibertyError(f"{where}: pin {pin.name}: internal_power {kind} "
                                           f"(line {table.line}) holds a NaN or infinite "
                                           f"value")


# ---- the library's power view ---------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _prob(expr: str, probs: dict, functions: dict, cache: dict) -> float:
    """P(expr = 1) with the named pins independent with P(1) = ``probs[pin]``; a pin in
    ``functions`` (a cell output) is its function of the others."""
    if not expr:
        return 1.0
    names = sorted(set(_NAME.findall(expr)) - set(functions))
    for f in functions.values():
        names = sorted(set(names) | (set(_NAME.findall(f)) - set(functions)))
    names = [n for n in names if n in probs]
    total = 0.0
    for bits in itertools.product((0, 1), repeat=len(names)):
        vals = dict(zip(names, bits))
        w = 1.0
        for n, b in vals.items():
            w *= probs[n] if b else 1.0 - probs[n]
        if w == 0.0:
            continue
        key = (expr, bits, tuple(names))
        v = cache.get(key)
        if v is None:
            full = dict(vals)
            for o, f in functions.items():
                full[o] = eval_function(f, vals)
            v = cache[key] = eval_function(expr, full)
        if v:
            total += w
    return total


@dataclass
class _Group:
    """Internal-power tables of one (pin, related pin, when): rise and fall lookups summed
    over the power pins, (slew[, load]) -> energy in the library's unit."""

    when: str
    rise: list
    fall: list

    @staticmethod
    def _at(tables, slew, load):
        total = 0.0
        for t in tables:
            if not t.variables:
                total += t.values[0][0]
                continue
            vals = {}
            for v in t.variables:
                vals[v] = load if "capacitance" in v else slew
            total += t.lookup(**vals)
        return total

    def energy(self, slew, load, rise=True):
        return self._at(self.rise if rise else self.fall, slew, load)


def _groups(pin_power, related):
    out = defaultdict(lambda: ([], []))
    for g in pin_power:
        if g.related_pin != related:
            continue
        r, f = out[g.when]
        if "rise_power" in g.tables:
            r.append(g.tables["rise_power"])
        elif "power" in g.tables:
            r.append(g.tables["power"])
        if "fall_power" in g.tables:
            f.append(g.tables["fall_power"])
        elif "power" in g.tables:
            f.append(g.tables["power"])
    return [_Group(w, r or f, f or r) for w, (r, f) in out.items()]


@dataclass
class _CellPower:
    name: str
    inputs: tuple
    functions: dict                  # output -> function (combinational)
    tables: dict                     # output -> truth table over inputs (row: inputs MSB first)
    out_arcs: dict                   # output -> {related input: [_Group]}
    passive: dict                    # input pin -> [_Group] (energy per input toggle)
    leakage: list                    # [(when, value)] summed over power pins
    leak_default: float
    clock: str = ""
    state: str = ""                  # flip-flop output pin (QN)
    state_inverted: bool = False


class PowerLib:
    """The power view of a :class:`~elmoe3d.synth.liberty.Liberty` (with its timing view for
    slews and loads); checks the library first (:func:`check_power`)."""

    def __init__(self, lib: Liberty, tlib: TimingLib | None = None):
        check_power(lib)
        self.lib = lib
        self.tlib = tlib or TimingLib(lib)
        self.voltage = lib.nom_voltage
        self.energy_fj = energy_unit_fj(lib)
        self.leak_nw = leakage_unit_nw(lib)
        self.cells = {}
        for cell in lib.cells.values():
            clocks = [p for p, pin in cell.pins.items() if pin.clock]
            functions = {o: f for o, f in cell.outputs.items() if f and not cell.sequential}
            tables = {}
            for o, f in functions.items():
                try:
                    tables[o] = tuple(eval_function(f, dict(zip(cell.inputs, bits))) for bits in
                                      itertools.product((0, 1), repeat=len(cell.inputs)))
                except LibertyError:
                    pass
            out_arcs = {}
            for o in cell.outputs:
                rel = clocks if cell.sequential else cell.inputs
                out_arcs[o] = {r: _groups(cell.pins[o].power, r) for r in rel}
            passive = {p: _groups(cell.pins[p].power, "") for p in cell.inputs
                       if any(g.related_pin == "" for g in cell.pins[p].power)}
            by_when = defaultdict(float)
            default = None
            for lk in cell.leakage:
                if lk.when:
                    by_when[lk.when] += lk.value
                else:
                    default = (default or 0.0) + lk.value
            if default is None:
                default = sum(by_when.values()) / max(len(by_when), 1)
            cp = _CellPower(name=cell.name, inputs=cell.inputs, functions=functions,
                            tables=tables, out_arcs=out_arcs, passive=passive,
                            leakage=list(by_when.items()), leak_default=default,
                            clock=clocks[0] if cell.sequential and clocks else "")
            if cell.sequential:
                cp.state = next(iter(cell.outputs), "")
                cp.state_inverted = _inverting(cell, cp.state)
            self.cells[cell.name] = cp


def _inverting(cell, out) -> bool:
    """Whether flip-flop output ``out`` holds the complement of the data input it samples
    (DFFHQNx1: ``ff (IQN, IQNN) { next_state : "!D"; }``, ``QN = IQN``)."""
    for st in cell.state:
        if st.kind != "ff" or len(st.args) < 1 or "next_state" not in st.attrs:
            continue
        nxt = st.attrs["next_state"].strip('"')
        data = [p for p in cell.inputs if re.search(rf"(?<![A-Za-z0-9_]){re.escape(p)}"
                                                   rf"(?![A-Za-z0-9_])", nxt)]
        if len(data) != 1:
            continue
        vals = {p: 0 for p in cell.inputs}
        vals[data[0]] = 1
        state = eval_function(nxt, vals)
        names = {st.args[0]: state}
        if len(st.args) > 1:
            names[st.args[1]] = 1 - state
        return eval_function(cell.outputs.get(out, "") or st.args[0], names) == 0
    return False


# ---- results --------------------------------------------------------------------------------

@dataclass
class Power:
    """The power of one netlist over one activity annotation.

    Energies are per clock cycle (fJ); leakage in nW; at ``frequency_ghz`` the dynamic power
    in uW is the energy per cycle in fJ times the frequency in GHz.

    Attributes
    ----------
    internal_fj, switching_fj, clock_pins_fj : float
        Cell internal energy, net switching (1/2 C V^2 per toggle), flip-flop clock pins.
    dynamic_fj : float
        Their sum, per cycle.
    leakage_nw : float
        Sum of the cells' leakage (state-averaged).
    by_type : dict
        Cell type -> ``{"cells", "internal_fj", "switching_fj", "leakage_nw"}`` (a net's
        switching charged to its driver's type).
    registers, annotated : int
        Flip-flops, and register bits / ports / black-box outputs whose activity came from
        the annotation (the rest took ``default``).
    default : dict
        The activity given to sources the annotation does not name.
    mean_toggle : float
        Mean toggle rate over the nets.
    """

    internal_fj: float
    switching_fj: float
    clock_pins_fj: float
    dynamic_fj: float
    leakage_nw: float
    by_type: dict = field(default_factory=dict)
    registers: int = 0
    annotated: int = 0
    sources: int = 0
    default: dict = field(default_factory=dict)
    mean_toggle: float = 0.0
    voltage: float = 0.0

    def power_uw(self, frequency_ghz: float) -> float:
        """Total power (uW) at ``frequency_ghz``: dynamic + leakage."""
        return self.dynamic_fj * frequency_ghz + self.leakage_nw / 1000.0

    def to_json(self) -> dict:
        return asdict(self)


# ---- analysis -------------------------------------------------------------------------------

def _lag_one(table, ins):
    """(p, t) of a function with truth table ``table`` (inputs MSB first) of independent
    two-state Markov inputs ``ins`` [(p, t)]: P(y = 1) and P(y(prev) != y(now))."""
    n = len(ins)
    # per input: P(prev, now) for (0,0), (0,1), (1,0), (1,1)
    joint = []
    for p, t in ins:
        h = t / 2.0
        joint.append((max(1.0 - p - h, 0.0), h, h, max(p - h, 0.0)))
    p_y = 0.0
    t_y = 0.0
    for idx in range(4 ** n):
        w = 1.0
        prev = now = 0
        k = idx
        for j in range(n):
            s = k & 3
            k >>= 2
            w *= joint[j][s]
            if w == 0.0:
                break
            prev = (prev << 1) | (s >> 1)
            now = (now << 1) | (s & 1)
        if w == 0.0:
            continue
        a, b = table[prev], table[now]
        if b:
            p_y += w
        if a != b:
            t_y += w
    return p_y, t_y


def _sensitivity(table, ps, i):
    """P(dy/dx_i) = P(y(x_i = 0) != y(x_i = 1)) with the other inputs independent."""
    n = len(ps)
    total = 0.0
    bit = 1 << (n - 1 - i)
    for row in range(2 ** n):
        if row & bit:
            continue
        if table[row] == table[row | bit]:
            continue
        w = 1.0
        for j in range(n):
            if j == i:
                continue
            b = (row >> (n - 1 - j)) & 1
            w *= ps[j] if b else 1.0 - ps[j]
        total += w
    return total


def analyze_power(net: Netlist, plib: PowerLib, activity: dict | None = None, *,
                  stubs: dict | None = None, default: Activity = DEFAULT_ACTIVITY) -> Power:
    """The energy per cycle and the leakage of ``net`` (see the module docstring).

    ``activity``: source name -> :class:`Activity`, a source being a register (the signal a
    flip-flop holds, bit included: ``"acc[3]"``, as :func:`~elmoe3d.synth.sta.analyze` names
    them), an input port bit (its BLIF name, ``"i__payload[5]"``) or a black-box output
    (``"instance/port[3]"``); the rest take ``default``. A flip-flop's output pin (``QN``)
    carries its register's complement. ``stubs``: black-box module -> {port: direction}
    (:func:`~elmoe3d.synth.sta.stub_ports`)."""
    activity = activity or {}
    stubs = stubs or {}
    tlib = plib.tlib
    const = net.constants
    v2 = plib.voltage ** 2
    ef = plib.energy_fj
    try:
        driver, fanout, seq, comb, boxes, loads_r, loads_f, _ = net_graph(
            net, tlib, stubs, port_load=tlib.port_load)
    except TimingError as exc:
        raise PowerError(str(exc)) from None
    for gi in seq + comb:
        g = net.gates[gi]
        if g.type not in plib.cells:
            raise PowerError(f"netlist cell {g.name or '?'} of type {g.type}: in the timing "
                             f"view but without power data")
    # net -> mean(rise, fall) capacitance (fF)
    loads = defaultdict(float, {n: (loads_r[n] + loads_f[n]) / 2 for n in loads_r})

    act = {}                                 # net -> (p, t)
    slew = {}                                # net -> mean transition (ps)
    for n in const:
        act[n] = (1.0 if n.endswith("true") or n in ("$true", "1") else 0.0, 0.0)
    sources = annotated = 0

    def source(n, name, invert=False):
        nonlocal sources, annotated
        sources += 1
        a = activity.get(name)
        if a is None:
            a = default
        else:
            annotated += 1
        a = a.clamped()
        act[n] = ((1.0 - a.p) if invert else a.p, a.t)

    clock_nets = {n for gi in seq for p, n in net.gates[gi].pins.items()
                  if p == tlib.cell(net.gates[gi].type).clock}
    for n in net.inputs:
        if n not in const and n not in clock_nets:
            source(n, n)
            slew[n] = PORT_SLEW_PS
    for gi in boxes:
        g = net.gates[gi]
        for p, n in g.pins.items():
            if stubs[g.type].get(bus_of(p)) == "output" and n not in const:
                source(n, f"{g.name}/{p}")
                slew[n] = PORT_SLEW_PS
    flop_q = {}
    for gi in seq:
        g = net.gates[gi]
        ct, cp = tlib.cell(g.type), plib.cells[g.type]
        for out, arc in ct.clk_to_q.items():
            n = g.pins.get(out)
            if n is None or n in const:
                continue
            source(n, _reg_name(g), invert=cp.state_inverted)
            flop_q[gi] = n
            t = arc.tables
            ld = loads[n]
            slew[n] = (_tab(t, "rise_transition", CLOCK_SLEW_PS, ld) +
                       _tab(t, "fall_transition", CLOCK_SLEW_PS, ld)) / 2

    order = comb_order(net, tlib, comb, driver,
                       lambda n: (gj for gj, _ in fanout.get(n, ())))
    if len(order) != len(comb):
        raise PowerError(f"netlist: {len(comb) - len(order)} cells in combinational loops "
                         f"(no activity propagation through them)")

    by_type = defaultdict(lambda: {"cells": 0, "internal_fj": 0.0, "switching_fj": 0.0,
                                   "leakage_nw": 0.0})
    internal = switching = clock_pins = leak = 0.0
    memo = {}
    dflt = default.clamped()

    def of(n):
        a = act.get(n)
        if a is None:                         # undriven: a constant-like source
            return (dflt.p, 0.0)
        return a

    for gi in order:
        g = net.gates[gi]
        ct, cp = tlib.cell(g.type), plib.cells[g.type]
        pins = g.pins
        ins = [of(pins[p]) if p in pins else (0.0, 0.0) for p in cp.inputs]
        for out, table in cp.tables.items():
            on = pins.get(out)
            if on is None:
                continue
            key = (g.type, out, tuple(ins))
            r = memo.get(key)
            if r is None:
                r = memo[key] = _lag_one(table, ins)
            act[on] = r
            # slew: worst transition over the arcs, at the input slews (as the STA)
            sr = sf = 0.0
            ld = loads[on]
            for related, pos, neg, _, _, cr, cf, rt, ft in ct.fast.get(out, ()):
                inn = pins.get(related)
                if inn is None or inn in const:
                    continue
                s = slew.get(inn, PORT_SLEW_PS)
                sr = max(sr, rt(s, ld))
                sf = max(sf, ft(s, ld))
            slew[on] = (sr + sf) / 2 if (sr or sf) else PORT_SLEW_PS

    # energies
    ps_of = {}
    for gi in order + seq:
        g = net.gates[gi]
        cp = plib.cells[g.type]
        pins = g.pins
        probs = {p: of(pins[p])[0] for p in cp.inputs if p in pins}
        cache = ps_of.setdefault(g.type, {})
        bt = by_type[g.type]
        bt["cells"] += 1
        e_int = 0.0
        if cp.clock:
            q = flop_q.get(gi)
            pq, tq = of(q) if q is not None else (0.5, 0.0)
            probs[cp.state] = pq
            probs[cp.clock] = 0.5
            funcs = {}
            # output transitions (clock to Q) at the clock slew and the output load
            if q is not None:
                groups = cp.out_arcs[cp.state].get(cp.clock, [])
                e_int += tq * _mean_edge(groups, CLOCK_SLEW_PS, loads[q], probs, funcs, cache)
            # clock pin: one rising and one falling edge per cycle, weighted by its states
            for grp in cp.passive.get(cp.clock, []):
                w = _prob(grp.when, probs, funcs, cache)
                e_int += w * (grp.energy(CLOCK_SLEW_PS, 0.0, True) +
                              grp.energy(CLOCK_SLEW_PS, 0.0, False))
            clk_cap = sum(tlib.cell(g.type).caps.get(cp.clock, (0.0, 0.0))) / 2 if \
                cp.clock in tlib.cell(g.type).caps else \
                plib.lib.cells[g.type].pins[cp.clock].capacitance
            clock_pins += clk_cap * v2
            others = [p for p in cp.passive if p != cp.clock]
        else:
            funcs = cp.functions
            for out, arcs in cp.out_arcs.items():
                on = pins.get(out)
                if on is None or on not in act:
                    continue
                t_out = act[on][1]
                if t_out == 0.0:
                    continue
                ins = [of(pins[p]) if p in pins else (0.0, 0.0) for p in cp.inputs]
                ps = [a[0] for a in ins]
                weights = {}
                table = cp.tables.get(out)
                for i, p in enumerate(cp.inputs):
                    if p not in arcs or not arcs[p] or table is None:
                        continue
                    weights[p] = _sensitivity(table, ps, i) * ins[i][1]
                total_w = sum(weights.values())
                if total_w <= 0.0:
                    continue
                for p, w in weights.items():
                    if w == 0.0:
                        continue
                    e = _mean_edge(arcs[p], slew.get(pins[p], PORT_SLEW_PS), loads[on], probs,
                                   funcs, cache)
                    e_int += t_out * (w / total_w) * e
            others = list(cp.passive)
        for p in others:
            n = pins.get(p)
            if n is None:
                continue
            tn = of(n)[1]
            if tn == 0.0:
                continue
            s = slew.get(n, PORT_SLEW_PS)
            for grp in cp.passive[p]:
                w = _prob(grp.when, probs, funcs, cache)
                e_int += tn * w * (grp.energy(s, 0.0, True) + grp.energy(s, 0.0, False)) / 2
        e_int *= ef
        internal += e_int
        bt["internal_fj"] += e_int
        # leakage
        if cp.leakage:
            lk = 0.0
            wsum = 0.0
            for when, value in cp.leakage:
                w = _prob(when, probs, funcs, cache)
                lk += w * value
                wsum += w
            lk = lk / wsum if wsum > 0 else cp.leak_default
        else:
            lk = cp.leak_default
        lk *= plib.leak_nw
        leak += lk
        bt["leakage_nw"] += lk
    # net switching, charged to the driver
    toggles = []
    for n, ld in loads.items():
        a = act.get(n)
        if a is None or n in const:
            continue
        toggles.append(a[1])
        e = a[1] * 0.5 * ld * v2
        switching += e
        d = driver.get(n)
        label = net.gates[d[0]].type if d is not None and d[0] not in boxes else "(ports)"
        by_type[label]["switching_fj"] += e
    return Power(internal_fj=internal, switching_fj=switching, clock_pins_fj=clock_pins,
                 dynamic_fj=internal + switching + clock_pins, leakage_nw=leak,
                 by_type={k: dict(v) for k, v in sorted(by_type.items())},
                 registers=len(seq), annotated=annotated, sources=sources,
                 default=asdict(dflt), mean_toggle=sum(toggles) / max(len(toggles), 1),
                 voltage=plib.voltage)


def _mean_edge(groups, slew, load, probs, funcs, cache):
    """Mean of rise and fall energy of an output arc, its ``when`` states averaged by their
    probabilities (normalised: the arc switches in one of them)."""
    if not groups:
        return 0.0
    if len(groups) == 1 or all(not g.when for g in groups):
        return sum((g.energy(slew, load, True) + g.energy(slew, load, False)) / 2
                   for g in groups)
    num = den = 0.0
    for g in groups:
        w = _prob(g.when, probs, funcs, cache) if g.when else 1.0
        num += w * (g.energy(slew, load, True) + g.energy(slew, load, False)) / 2
        den += w
    return num / den if den > 0 else 0.0


def _tab(tables, kind, slew, load):
    from .sta import _delay
    return _delay(tables, kind, slew, load)

"""elmoe3d.synth.power: the energy of a tiny netlist computed by hand from the Liberty text
(activity propagation, internal energy, net switching, clock pins, leakage) and the one-line
errors for a library without the tables power needs."""

from __future__ import annotations

import re

import pytest

from elmoe3d.cli import main
from elmoe3d.synth import flow
from elmoe3d.synth.liberty import BUNDLED_LIBERTY, LibertyError, read_liberty, read_text
from elmoe3d.synth.power import Activity, PowerLib, analyze_power, check_power
from elmoe3d.synth.sta import CLOCK_SLEW_PS, PORT_SLEW_PS, read_blif


LIB = read_liberty(BUNDLED_LIBERTY)
TEXT = read_text(BUNDLED_LIBERTY)
DFF, NAND, INV = (f"{c}_ASAP7_75t_R" for c in ("DFFHQNx1", "NAND2xp33", "INVx1"))


def _block(text, start):
    depth, i = 0, text.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
        i += 1


def _cell(name):
    return _block(TEXT, TEXT.index(f"cell ({name})"))


def _pin(cell, pin):
    text = _cell(cell)
    return _block(text, text.index(f"pin ({pin})"))


def _groups(text, head):
    return [_block(text, m.start()) for m in re.finditer(re.escape(head) + r" \{", text)]


def _floats(s):
    return [float(v) for v in s.replace("\\", " ").split(",")]


def _table(group, kind):
    """(index_1, index_2 or None, rows) of table ``kind`` in a group's text."""
    m = re.search(rf"{kind} \((\w*)\)", group)
    body = _block(group, m.start())
    if m.group(1) == "scalar":
        return None, None, [[float(re.search(r'values \( ?\\?\s*"([^"]*)"', body).group(1))]]
    i1 = _floats(re.search(r'index_1 \("([^"]*)"\)', body).group(1))
    m2 = re.search(r'index_2 \("([^"]*)"\)', body)
    rows = [_floats(r) for r in re.findall(r'"([^"]*)"', body.split("values", 1)[1])]
    return i1, (_floats(m2.group(1)) if m2 else None), rows


def _seg(index, v):
    i = 0
    while i < len(index) - 2 and index[i + 1] <= v:
        i += 1
    return i, (v - index[i]) / (index[i + 1] - index[i])


def _look(table, x, y=None):
    """Bilinear (or linear along index_1), linear extrapolation: written out here."""
    i1, i2, rows = table
    if i1 is None:
        return rows[0][0]
    if i2 is None:
        i, f = _seg(i1, x)
        row = rows[0]
        return row[i] + f * (row[i + 1] - row[i])
    i, fx = _seg(i1, x)
    j, fy = _seg(i2, y)
    low = rows[i][j] + fy * (rows[i][j + 1] - rows[i][j])
    high = rows[i + 1][j] + fy * (rows[i + 1][j + 1] - rows[i + 1][j])
    return low + fx * (high - low)


def _cap(cell, pin):
    text = _pin(cell, pin)
    r = float(re.search(r"rise_capacitance : ([0-9.]+);", text).group(1))
    f = float(re.search(r"fall_capacitance : ([0-9.]+);", text).group(1))
    return (r + f) / 2


def _transition(cell, out, related, timing_type, slew, load):
    """Mean of the rise and fall transition of the timing group(s) of ``out`` from ``related``."""
    found = [g for g in _groups(_pin(cell, out), "timing ()")
             if f'related_pin : "{related}";' in g and f"timing_type : {timing_type};" in g]
    assert len(found) == 1
    return (_look(_table(found[0], "rise_transition"), slew, load),
            _look(_table(found[0], "fall_transition"), slew, load))


def _power_groups(cell, pin, related=None):
    """[(when, rise+fall summed over the power pins as functions)] of a pin's
    internal_power groups (``related``: its related_pin, None for input-pin groups)."""
    out = {}
    for g in _groups(_pin(cell, pin), "internal_power ()"):
        rel = re.search(r'related_pin : "(\w+)";', g)
        if (rel.group(1) if rel else None) != related:
            continue
        when = re.search(r'when : "([^"]*)";', g)
        key = when.group(1) if when else ""
        out.setdefault(key, []).append((_table(g, "rise_power"), _table(g, "fall_power")))
    return out


def _energy(tabs, slew, load=None):
    """(rise, fall) energy summed over the power pins."""
    return (sum(_look(r, slew, load) for r, _ in tabs),
            sum(_look(f, slew, load) for _, f in tabs))


def _leak(cell, prob):
    """Sum over ``when`` states of P(state) x (VDD + VSS values); ``prob(when)``."""
    total = 0.0
    for g in _groups(_cell(cell), "leakage_power ()"):
        when = re.search(r'when : "([^"]*)";', g)
        if when:
            total += prob(when.group(1)) * float(re.search(r"value : ([0-9.eE+-]+);",
                                                           g).group(1))
    return total


#: r1 -> NAND2 (A; B from the port x, which also feeds r1's D) -> INV -> r2 -> port q.
POWER_BLIF = """.model top
.inputs clk x
.outputs q
.gate DFFHQNx1_ASAP7_75t_R CLK=clk D=x QN=n0
.cname r1$_DFF_P_
.gate NAND2xp33_ASAP7_75t_R A=n0 B=x Y=n1
.cname g1
.gate INVx1_ASAP7_75t_R A=n1 Y=n2
.cname g2
.gate DFFHQNx1_ASAP7_75t_R CLK=clk D=n2 QN=q
.cname r2$_DFF_P_
.end
"""


@pytest.mark.parametrize("r1, t1_hand", [
    # P(AB now and before) = (0.5 - 0.25)(0.3 - 0.1) = 0.05, t = 2 (0.5 x 0.3 - 0.05) = 0.2
    (Activity(0.5, 0.5), 0.2),
    # QN = !r1: P(1) = 0.8; (0.8 - 0.15)(0.3 - 0.1) = 0.13, t = 2 (0.8 x 0.3 - 0.13) = 0.22
    (Activity(0.2, 0.3), 0.22)])
def test_power_of_a_tiny_netlist_computed_by_hand_from_the_liberty_text(r1, t1_hand):
    """Register r1 holds a signal with P(1) = ``r1.p`` toggling ``r1.t`` times a cycle (its
    flip-flop's QN, the net the logic reads, the complement: P(1) = 1 - ``r1.p``; with P = 0.5
    alone a QN read as the register itself would go unseen), port x has P(1) = 0.3 and 0.2
    toggles per cycle, r2 is not annotated (default activity, P = 0.5, t = 0.1). Every figure
    below is read from the Liberty text with regular expressions (not liberty.py) and
    combined as docs/synth.md "Power" says; the module must agree to 1e-9 fJ."""
    v = 0.7
    port_load = max(float(re.search(r"rise_capacitance : ([0-9.]+);", _pin(DFF, "D")).group(1)),
                    float(re.search(r"fall_capacitance : ([0-9.]+);", _pin(DFF, "D")).group(1)))
    load = {"n0": _cap(NAND, "A"), "x": _cap(NAND, "B") + _cap(DFF, "D"),
            "n1": _cap(INV, "A"), "n2": _cap(DFF, "D"), "q": port_load}
    # activity: (P(1), toggles per cycle)
    pa, ta = 1 - r1.p, r1.t                  # n0 = QN = !r1
    pb, tb = 0.3, 0.2                        # x
    # NAND: y = !(A B); A B changes when (prev, now) = (11, not 11) or back
    p_and_prev_now = (pa - ta / 2) * (pb - tb / 2)
    t1 = 2 * (pa * pb - p_and_prev_now)
    p1 = 1 - pa * pb
    act = {"n0": (pa, ta), "x": (pb, tb), "n1": (p1, t1), "n2": (1 - p1, t1), "q": (0.5, 0.1)}
    assert t1 == pytest.approx(t1_hand)
    # slews (mean of rise and fall), the worst over a cell's arcs as the STA
    s_n0 = sum(_transition(DFF, "QN", "CLK", "rising_edge", CLOCK_SLEW_PS, load["n0"])) / 2
    s_x = PORT_SLEW_PS
    nand_a = _transition(NAND, "Y", "A", "combinational", s_n0, load["n1"])
    nand_b = _transition(NAND, "Y", "B", "combinational", s_x, load["n1"])
    s_n1 = (max(nand_a[0], nand_b[0]) + max(nand_a[1], nand_b[1])) / 2
    s_n2 = sum(_transition(INV, "Y", "A", "combinational", s_n1, load["n2"])) / 2
    # internal energy (fJ per cycle)
    e = 0.0
    w_a, w_b = pb * ta, pa * tb               # P(dy/dA) t_A, P(dy/dB) t_B
    for related, slew, w in (("A", s_n0, w_a), ("B", s_x, w_b)):
        (tabs,) = _power_groups(NAND, "Y", related).values()
        e += t1 * w / (w_a + w_b) * sum(_energy(tabs, slew, load["n1"])) / 2
    (tabs,) = _power_groups(INV, "Y", "A").values()
    e += t1 * sum(_energy(tabs, s_n1, load["n2"])) / 2

    def p_when(expr, values):
        names = sorted(set(re.findall(r"[A-Z]+", expr)))
        total = 0.0
        import itertools
        for bits in itertools.product((0, 1), repeat=len(names)):
            env = dict(zip(names, bits))
            w = 1.0
            for n, b in env.items():
                w *= values[n] if b else 1 - values[n]
            py = expr.replace("!", " not ").replace("*", " and ").replace("+", " or ")
            if eval(py, {}, {k: bool(b) for k, b in env.items()}):
                total += w
        return total
    # input-pin (passive) groups of the NAND: per toggle of A or B, in their states
    nand_vals = {"A": pa, "B": pb}

    def nand_state(expr):                    # Y is !(A B): expand it
        return p_when(expr.replace("!Y", "(A * B)").replace("Y", "(!A + !B)"), nand_vals)
    for pin, t, slew in (("A", ta, s_n0), ("B", tb, s_x)):
        for when, tabs in _power_groups(NAND, pin).items():
            e += t * nand_state(when) * sum(_energy(tabs, slew)) / 2
    # flip-flops: clock to QN per QN toggle; clock pin per cycle (rise + fall) in its states;
    # D pin per D toggle in its states (CLK or !CLK, half the time each)
    ((_, qtabs),) = _power_groups(DFF, "QN", "CLK").items()
    for q_net, d_net, d_slew in (("n0", "x", s_x), ("q", "n2", s_n2)):
        pq = act[q_net][0]
        e += act[q_net][1] * sum(_energy(qtabs, CLOCK_SLEW_PS, load[q_net])) / 2
        vals = {"D": act[d_net][0], "QN": pq, "CLK": 0.5}
        for when, tabs in _power_groups(DFF, "CLK").items():
            e += p_when(when, vals) * sum(_energy(tabs, CLOCK_SLEW_PS))
        for when, tabs in _power_groups(DFF, "D").items():
            e += act[d_net][1] * p_when(when, vals) * sum(_energy(tabs, d_slew)) / 2
    switching = sum(act[n][1] * 0.5 * load[n] * v * v for n in load)
    clock_pins = 2 * _cap(DFF, "CLK") * v * v
    # leakage (pW -> nW)
    leak = _leak(NAND, nand_state) + _leak(INV, lambda w: p_when(w.replace("!Y", "A").replace(
        "Y", "!A"), {"A": p1}))
    for q_net, d_net in (("n0", "x"), ("q", "n2")):
        leak += _leak(DFF, lambda w: p_when(w, {"D": act[d_net][0], "QN": act[q_net][0],
                                                "CLK": 0.5}))
    leak /= 1000.0

    got = analyze_power(read_blif(POWER_BLIF), PowerLib(LIB),
                        {"r1": r1, "x": Activity(0.3, 0.2)})
    assert got.registers == 2 and got.annotated == 2 and got.sources == 3
    assert got.switching_fj == pytest.approx(switching, abs=1e-9)
    assert got.clock_pins_fj == pytest.approx(clock_pins, abs=1e-9)
    assert got.internal_fj == pytest.approx(e, abs=1e-9)
    assert got.leakage_nw == pytest.approx(leak, abs=1e-9)
    assert got.dynamic_fj == pytest.approx(e + switching + clock_pins, abs=1e-9)
    assert 1.0 < got.dynamic_fj < 10.0 and 0.1 < got.leakage_nw < 2.0      # fJ, nW: sane
    assert got.power_uw(1.0) == pytest.approx(got.dynamic_fj + got.leakage_nw / 1000)


#: Ports a1, a2, b -> AOI21xp33 -> port y.
AOI_BLIF = """.model top
.inputs a1 a2 b
.outputs y
.gate AOI21xp33_ASAP7_75t_R A1=a1 A2=a2 B=b Y=y
.cname g1
.end
"""


def test_internal_energy_of_an_arc_averages_its_when_states():
    """AOI21xp33's B -> Y energy comes in three ``when`` states, A1 !A2, !A1 A2 and !A1 !A2,
    whose probabilities do not add up to 1 (in the fourth, A1 A2, Y is 0 and B cannot switch
    it): a switching of Y from B happened in one of them, so their energies are averaged
    with the states' probabilities normalised by their sum. A1 and A2 are held (P(1) = 0.6
    and 0.3, no toggles), B has P(1) = 0.5 and 0.4 toggles a cycle; by hand from the Liberty
    text: Y toggles 0.4 x (1 - 0.6 x 0.3) = 0.328 times a cycle, each at the states' mean
    energy (slew PORT_SLEW_PS, Y loaded with one D pin); B's input-pin group (state A1 A2
    !Y, P = 0.6 x 0.3 = 0.18) adds 0.4 x 0.18 x its energy a toggle."""
    aoi = "AOI21xp33_ASAP7_75t_R"
    port_load = max(float(re.search(rf"{e}_capacitance : ([0-9.]+);", _pin(DFF, "D")).group(1))
                    for e in ("rise", "fall"))
    p1, p2, pb, tb = 0.6, 0.3, 0.5, 0.4
    t_y = tb * (1 - p1 * p2)
    states = {"(A1 * !A2)": p1 * (1 - p2), "(!A1 * A2)": (1 - p1) * p2,
              "(!A1 * !A2)": (1 - p1) * (1 - p2)}                     # 0.42, 0.12, 0.28
    assert sum(states.values()) == pytest.approx(0.82)
    groups = _power_groups(aoi, "Y", "B")
    assert set(groups) == set(states)
    mean = sum(states[w] * sum(_energy(tabs, PORT_SLEW_PS, port_load)) / 2
               for w, tabs in groups.items()) / 0.82
    (passive,) = _power_groups(aoi, "B").items()
    assert passive[0] == "(A1 * A2 * !Y)"                             # P = 0.6 x 0.3
    hand = t_y * mean + tb * p1 * p2 * sum(_energy(passive[1], PORT_SLEW_PS)) / 2

    got = analyze_power(read_blif(AOI_BLIF), PowerLib(LIB),
                        {"a1": Activity(p1, 0.0), "a2": Activity(p2, 0.0),
                         "b": Activity(pb, tb)})
    assert got.internal_fj == pytest.approx(hand, abs=1e-9)
    # nets y (one D pin) and b (the AOI's B pin); a1 and a2 do not toggle
    assert got.switching_fj == pytest.approx(
        (t_y * port_load + tb * _cap(aoi, "B")) * 0.5 * 0.7 ** 2, abs=1e-9)


def test_activity_propagation_is_bounded_and_exact_on_an_xor_chain():
    """Zero-delay toggles through XOR gates of independent inputs: t(a ^ b) = P(exactly one
    input toggles) = ta (1 - tb) + tb (1 - ta); never above one per cycle."""
    from elmoe3d.synth.power import _lag_one
    xor = (0, 1, 1, 0)
    p, t = _lag_one(xor, [(0.5, 0.5), (0.5, 0.3)])
    assert p == pytest.approx(0.5)
    assert t == pytest.approx(0.5 * 0.7 + 0.3 * 0.5)
    acc = (0.5, 0.9)
    for _ in range(40):
        acc = _lag_one(xor, [acc, (0.5, 0.9)])
        assert 0 <= acc[1] <= 1
    assert _lag_one((0, 1), [(0.2, 0.0)]) == (pytest.approx(0.2), 0.0)


_INV_AREA_ONLY = ('cell (INV) { area : 0.04; pin (A) { direction : input; capacitance : 0.5; }'
                  ' pin (Y) { direction : output; function : "!A"; } }')


def test_power_without_tables_is_one_line(tmp_path):
    lib = tmp_path / "area_only.lib"
    lib.write_text(f"library (x) {{\n  nom_voltage : 0.7;\n  {_INV_AREA_ONLY}\n}}\n")
    with pytest.raises(LibertyError) as exc:
        check_power(read_liberty(lib))
    assert str(exc.value) == f"{lib}:3: cell INV: no leakage_power (needed for power)"
    lib.write_text(f"library (x) {{\n  nom_voltage : 0.7;\n  "
                   f"{_INV_AREA_ONLY[:-2]} leakage_power () {{ value : 1.0; }} }}\n}}\n")
    with pytest.raises(LibertyError) as exc:
        check_power(read_liberty(lib))
    assert str(exc.value) == (f"{lib}:3: cell INV: no internal_power for output Y from input A "
                              f"(needed for power: rise_power, fall_power)")


def test_power_with_nan_is_one_line(tmp_path):
    """The bundled NAND2xp33 with its first leakage value, then one internal-power value,
    made NaN."""
    text = _cell(NAND)
    line = TEXT[:TEXT.index(text)].count("\n") + 1
    bad = re.sub(r"value : 33.6905;", "value : nan;", text, count=1)
    lib = tmp_path / "nan.lib"
    lib.write_text(TEXT.replace(text, bad))
    with pytest.raises(LibertyError) as exc:
        check_power(read_liberty(lib))
    assert str(exc.value) == (f"{lib}:{line}: cell {NAND}: leakage_power nan is not a finite "
                              f"number")
    bad = re.sub(r'(rise_power \(power_template_7x7_x1\) \{.*?values \( \\\s*")([0-9.]+)',
                 lambda m: m.group(1) + "nan", text, count=1, flags=re.S)
    assert bad != text
    lib.write_text(TEXT.replace(text, bad))
    with pytest.raises(LibertyError) as exc:
        PowerLib(read_liberty(lib))
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{lib}:{line}: cell {NAND}: pin Y: "
                                              f"internal_power rise_power (line ")
    assert msg.endswith("holds a NaN or infinite value")


def test_power_cli_bad_liberty_is_one_line(tmp_path, capsys):
    """``--power`` checks the library before any synthesis: a library with timing tables but a
    NaN leakage value is refused in one line naming the file and the cell."""
    text = _cell(NAND)
    line = TEXT[:TEXT.index(text)].count("\n") + 1
    lib = tmp_path / "nan.lib"
    lib.write_text(TEXT.replace(text, re.sub(r"value : 33.6905;", "value : nan;", text,
                                             count=1)))
    assert main(["synth", "--power", "--liberty", str(lib)]) == 2
    out, err = capsys.readouterr()
    assert "\n" not in err.strip() and "Traceback" not in err
    assert err.strip() == (f"elmoe3d synth: error: {lib}:{line}: cell {NAND}: leakage_power "
                           f"nan is not a finite number")
    assert out == ""


def test_vcd_activity_counts_toggles_and_time_at_one(tmp_path):
    """A 3-bit counter run for 16 cycles in Amaranth's simulator (1 ns clock, the count
    changing 0.5 ns after each rising edge, the dump ending at 16 ns): bit b of the count
    toggles 16 / 2^b times in the 16 cycles (exactly: 1, 1/2, 1/4 a cycle) and is 1 for 8 of
    the 16 ns; ``hi`` (count == 7) is 1 from 6.5 to 7.5 and 14.5 to 15.5 ns (2 of 16: 1/8)
    and toggles 4 times (1/4 a cycle). Names as the netlist gives them (``count[1]``)."""
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator

    from elmoe3d.synth.activity import vcd_activity
    m = Module()
    count = Signal(3, name="count")
    hi = Signal(name="hi")
    m.d.sync += count.eq(count + 1)
    m.d.comb += hi.eq(count == 7)
    sim = Simulator(m)
    sim.add_clock(1e-9)

    async def bench(ctx):
        await ctx.tick().repeat(16)
    sim.add_testbench(bench)
    vcd = tmp_path / "count.vcd"
    with sim.write_vcd(str(vcd)):
        sim.run()
    act, cycles = vcd_activity(vcd)
    assert cycles == 16
    for b in range(3):
        a = act[f"count[{b}]"]
        assert a.t == pytest.approx(1 / 2 ** b, abs=1e-12)
        assert a.p == pytest.approx(0.5, abs=1e-12)
    assert (act["hi"].p, act["hi"].t) == (pytest.approx(1 / 8, abs=1e-12),
                                          pytest.approx(1 / 4, abs=1e-12))
    # from 8 ns on: 8 rising edges (8.5 to 15.5 ns), bit 0 toggling at each
    act, cycles = vcd_activity(vcd, start=8_000_000)
    assert cycles == 8 and act["count[0]"].t == pytest.approx(1.0, abs=1e-12)
    assert act["hi"].p == pytest.approx(1 / 8, abs=1e-12)


@pytest.mark.parametrize("config, per, span", [("small", 2, 1), ("paper-4gb", 1, 4)])
def test_ring_station_run_on_flits_of_several_words_and_words_of_several_flits(
        tmp_path, config, per, span):
    """The ring's power run streams real MiniLM weight words through station 0: on the small
    die two 512-bit words a 128-byte flit (a new user's ``synth --power --config small``
    died on them after 8 minutes), on the paper die a 4096-bit word in four flits. The
    station's local PEs receive exactly the words sent to them (checked inside the run)."""
    from elmoe3d.config import preset
    from elmoe3d.hw.die import LogicDie
    from elmoe3d.hw.ring import StreamlineRing
    from elmoe3d.synth.activity import ring_station_run
    ring = LogicDie.ring_params(config=preset(config))
    st = StreamlineRing.station(0, **ring)
    assert (st.words_per_flit, st.flits_per_word) == (per, span)
    run = ring_station_run(st, tmp_path / "r.vcd", words=32)
    local = st.local_pes / st.pes
    assert run["flits"] == 32 // per * span and run["bytes"] == run["flits"] * st.flit_bytes
    assert run["local_flits"] == run["flits"] * local
    assert run["forwarded_flits"] == run["flits"] - run["local_flits"]
    assert (tmp_path / "r.vcd").stat().st_size > 0


def test_rtlil_aliases_join_connected_wires():
    from elmoe3d.synth.activity import rtlil_aliases
    il = ("module \\top\n  wire width 4 \\a\n  wire width 2 \\b\n  wire width 8 \\c\n"
          "  connect \\b \\a [3:2]\n  connect \\a \\c [7:4]\nend\n")
    al = rtlil_aliases(il)
    assert al["b[0]"] == {"a[2]", "c[6]"} and al["c[4]"] == {"a[0]"}


def test_leakage_roll_up_of_cell_counts():
    """Static power of a cell count: each cell at its unconditional leakage_power (pW in the
    subset, reported in nW)."""
    from elmoe3d.synth.energy import leakage_nw
    nand = float(re.findall(r"value : ([0-9.]+);\s*related_pg_pin : VDD;\s*\}",
                            _cell(NAND))[-1])
    assert leakage_nw({NAND: 1000}, LIB) == pytest.approx(1000 * nand / 1000)


def test_sram_access_energy_by_hand_from_the_bank_liberty():
    """An access of a ``width``-bit memory is one access of each 64-bit ASAP7 bank it spans
    (rounded up). Per bank, from srambank_256x4x64_6t122.lib's figures (pJ): the clock pin's
    internal power when !write (a read) 1.44236 + 2.11495 + 0.373495 + 0.360267 = 4.291072,
    when write 0.186927 + 0.132678 = 0.319605, plus 10 address and control pins toggling
    once, each (0.00471622 + 0.00620875 + 0.00490932 + 0.00604381) / 2 = 0.01093905: a read
    4.4004625 pJ, a write 0.4289955 pJ. 1035 bits (a ring station's output FIFO word) span
    17 banks (16 x 64 = 1024 < 1035)."""
    from elmoe3d.synth.energy import sram_access_pj, sram_pj_per_byte
    read, write = 4.4004625, 0.4289955
    assert sram_access_pj(1035) == pytest.approx(17 * read, rel=1e-12)        # 74.8078625
    assert sram_access_pj(1035, write=True) == pytest.approx(17 * write, rel=1e-12)
    assert sram_access_pj(1024) == pytest.approx(16 * read, rel=1e-12)
    assert sram_access_pj(1) == sram_access_pj(64) == pytest.approx(read, rel=1e-12)
    assert sram_access_pj(65) == pytest.approx(2 * read, rel=1e-12)
    assert sram_pj_per_byte() == pytest.approx(read / 8, rel=1e-12)             # 0.5500578
    assert sram_pj_per_byte(write=True) == pytest.approx(write / 8, rel=1e-12)  # 0.0536244


def _canned_energy_run(monkeypatch, srams):
    """Stand-ins for the heavy calls of :func:`~elmoe3d.synth.energy.ring_energy` and
    :func:`~elmoe3d.synth.energy.link_energy`: a hollowed block with ``srams`` and no logic,
    a synthesis writing an empty netlist, a 100-cycle VCD annotating nothing and a power
    analysis of 2,000 fJ a cycle and 1,000 nW of leakage."""
    from types import SimpleNamespace

    from elmoe3d.synth import activity, blocks, power
    from elmoe3d.synth.power import Power
    block = SimpleNamespace(rtlil="module \\top\nend\n", stubs="", srams=srams)

    def synthesize(name, text, *, keep, **kw):
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "block.il").write_text(text)
        (keep / "timing.blif").write_text(".model top\n.inputs clk\n.end\n")

    def run(block, vcd, **kw):
        vcd.write_text("")
        return {"flits": 10, "cycles": 100, "bytes": 1280, "local_flits": 4,
                "forwarded_flits": 6, "words": 10, "bytes_in": 1280, "bytes_out": 640}
    monkeypatch.setattr(blocks, "hollow", lambda *a, **kw: block)
    monkeypatch.setattr(flow, "synthesize", synthesize)
    monkeypatch.setattr(activity, "ring_station_run", run)
    monkeypatch.setattr(activity, "link_reduce_run", run)
    monkeypatch.setattr(activity, "vcd_activity", lambda vcd, **kw: ({}, 100))
    monkeypatch.setattr(power, "analyze_power", lambda *a, **kw: Power(
        internal_fj=1500.0, switching_fj=400.0, clock_pins_fj=100.0, dynamic_fj=2000.0,
        leakage_nw=1000.0, registers=3, annotated=0, sources=4))


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")   # stubbed synthesis
def test_ring_and_link_energy_per_byte_by_hand(tmp_path, monkeypatch):
    """The ring's and the link's pJ per byte from their parts (canned runs: 100 cycles at
    2,000 fJ a cycle and 1,000 nW; 1,280 bytes): logic 2,000 fJ x 100 = 200 pJ; leakage
    1,000 nW x 100 ns (1 GHz) = 1e-13 J = 0.1 pJ; the FIFOs an SRAM write and read of every
    flit or word they hold, per 64-bit bank 0.4289955 + 4.4004625 = 4.829458 pJ
    (test_sram_access_energy_by_hand_from_the_bank_liberty)."""
    from elmoe3d.config import preset
    from elmoe3d.synth.blocks import SramUse
    from elmoe3d.synth.energy import link_energy, ring_energy
    bank = 0.4289955 + 4.4004625

    def sram(width, depth):
        return SramUse(owner="x", name="fifo", width=width, depth=depth, read_ports=1,
                       write_ports=1)
    small = preset("small")
    # the small die's ring: 4 PEs in groups of 2, 8-flit station FIFOs. Station 0 keeps 4
    # flits in its 8-deep local FIFO (100 bits: 2 banks) and forwards 6 through its output
    # FIFO (200 bits: 4 banks): (4 x 2 + 6 x 4) x 4.829458 = 154.542656 pJ
    _canned_energy_run(monkeypatch, [sram(100, 8), sram(200, 2)])
    r = ring_energy(small, LIB, workdir=tmp_path)
    fifo = (4 * 2 + 6 * 4) * bank
    assert r["logic_pj_per_byte"] == pytest.approx(200.0 / 1280, rel=1e-12)
    assert r["leakage_pj_per_byte"] == pytest.approx(0.1 / 1280, rel=1e-12)
    assert r["fifo_pj_per_byte"] == pytest.approx(fifo / 1280, rel=1e-12)
    per = (200.0 + 0.1 + fifo) / 1280
    assert r["pj_per_byte"] == pytest.approx(per, rel=1e-12)
    # a byte passes (2 groups + 1) / 2 = 1.5 stations on the mean
    assert (r["hops_mean"], r["pj_per_byte_delivered"]) == (1.5, pytest.approx(1.5 * per))
    # the link: 10 reduced words of 512 bits (8 banks) into its destination FIFO;
    # 1,280 bytes sent, 640 delivered
    _canned_energy_run(monkeypatch, [sram(512, 64), sram(512, 64)])
    k = link_energy(small, LIB, workdir=tmp_path)
    fifo = 10 * 8 * bank
    assert (k["logic_pj"], k["leakage_pj"]) == (pytest.approx(200.0), pytest.approx(0.1))
    assert k["fifo_pj"] == pytest.approx(fifo, rel=1e-12)
    assert k["pj_per_byte_in"] == pytest.approx((200.1 + fifo) / 1280, rel=1e-12)
    assert k["pj_per_byte_out"] == pytest.approx((200.1 + fifo) / 640, rel=1e-12)


def test_power_print_names_the_drift_against_die_energy():
    """``elmoe3d synth --power`` prints each DIE_ENERGY figure beside the one it measured and
    flags a figure more than 5% apart (or one this run did not measure)."""
    from elmoe3d.cli.synth import _print_power
    from elmoe3d.synth.energy import DIE_ENERGY, energy_drift
    power = {"configs": {}, "published_mac": [], "ring": {}, "link": {}, "method": "m",
             "sram": {"read_pj_per_byte": 0.55, "write_pj_per_byte": 0.054},
             "tile": {"16x32": {m: {"pj_per_mac": 1.0, "pj_per_mac_dynamic": v,
                                    "fj_per_cycle": 1.0, "macs_per_cycle": 1,
                                    "leakage_nw": 1.0}
                                for m, v in (("DRAFT", DIE_ENERGY.mac(4)),
                                             ("FULL", 1.2 * DIE_ENERGY.mac(8)))}}}
    power["die_energy_drift"] = [{"figure": w, "measured": m, "recorded": r, "ratio": q}
                                 for w, m, r, q in energy_drift(power)]
    lines = []
    _print_power(lines.append, power)
    text = "\n".join(lines)
    assert "tile 16x32 DRAFT pJ/MAC (dynamic): 0.1356 measured, 0.1356 in DIE_ENERGY: 1.000x\n" \
        in text
    assert "tile 16x32 FULL pJ/MAC (dynamic): 0.3026 measured, 0.2522 in DIE_ENERGY: 1.200x  " \
           "<- more than 5% apart: update DIE_ENERGY" in text
    assert "paper-4gb ring pJ per delivered byte (dynamic): 1.936 in DIE_ENERGY, not measured " \
           "by this run" in text


def test_power_print_says_which_ring_and_link_figures_include_leakage():
    """A new user read the link's energy as 1.889 pJ/B reduced and, lines later, 1.888: the
    first with leakage, the drift check's without. Both lines say so now."""
    from elmoe3d.cli.synth import _print_power
    power = {"configs": {}, "published_mac": [], "tile": {}, "method": "m",
             "die_energy_drift": [],
             "sram": {"read_pj_per_byte": 0.55, "write_pj_per_byte": 0.054},
             "ring": {"paper-4gb": {"pj_per_byte": 0.7745, "logic_pj_per_byte": 0.133,
                                    "fifo_pj_per_byte": 0.641, "pj_per_byte_delivered": 1.936,
                                    "hops_mean": 2.5}},
             "link": {"paper-4gb": {"pj_per_byte_in": 0.4722, "logic_pj_per_byte_in": 0.321,
                                    "fifo_pj_per_byte_in": 0.151, "pj_per_byte_out": 1.889}}}
    lines = []
    _print_power(lines.append, power)
    assert ("paper-4gb: streamline ring 0.774 pJ/B per station hop, 1.936 pJ/B delivered (2.5 "
            "hops mean), both with leakage (dynamic: logic 0.133, flit FIFOs 0.641 a hop)") in lines
    assert ("paper-4gb: aggregation link (REDUCE_ADD) 0.472 pJ/B sent, 1.889 pJ/B reduced, both "
            "with leakage (dynamic: logic 0.321, destination FIFOs 0.151 a byte sent)") in lines


def test_tile_energy_per_mac_from_canned_fits_worked_by_hand(monkeypatch, tmp_path):
    """``tile_energy``'s arithmetic, its netlists, runs and power analysis canned: per fit
    tile (R, L) a dynamic energy a + b L + c R L fJ a cycle and a leakage la + lb L + lc R L
    nW. At the paper tile (16 x 32) the model must give back those polynomials, DRAFT must
    count 16 x 32 x 32 = 16,384 MACs a cycle and FULL half (two unit-PE products a MAC), and
    the leakage a cycle at 1 GHz is nW x 1 ns = 1e-3 fJ a nW. A test audit found the leakage
    added as nW / GHz straight to fJ (1,000 times too much: the README's 0.181 / 0.342 pJ/MAC
    "with leakage" against 0.136 / 0.252 dynamic) and FULL's MACs untested."""
    from elmoe3d.synth import activity, energy, power, sta
    a, b, c = 1000.0, 250.0, 4000.0                     # fJ a cycle
    la, lb, lc = 50.0, 20.0, 1400.0                     # nW
    cur = {}

    class Canned:
        def __init__(self, r, l):
            self.dynamic_fj = a + b * l + c * r * l
            self.leakage_nw = la + lb * l + lc * r * l
            self.internal_fj = self.switching_fj = self.clock_pins_fj = 0.0
            self.sources, self.annotated, self.mean_toggle = [], 0, 0.0

    def netlist(r, l, lib, workdir):
        return f"{r}x{l}", ""

    def run(cfg, mode, vcd):
        cur["rl"] = (cfg.rows, cfg.lanes)
        vcd.write_text("")                              # removed by tile_energy
        return {"beats": 1}

    monkeypatch.setattr(energy, "_netlist", netlist)
    monkeypatch.setattr(activity, "minilm_tile_run", run)
    monkeypatch.setattr(activity, "vcd_activity", lambda vcd: ({}, 100))
    monkeypatch.setattr(activity, "annotate", lambda net, act, aliases: (act, []))
    monkeypatch.setattr(activity, "rtlil_aliases", lambda il: {})
    monkeypatch.setattr(sta, "read_blif", lambda text: text)
    monkeypatch.setattr(power, "analyze_power", lambda net, plib, act: Canned(*cur["rl"]))
    monkeypatch.setattr(power, "PowerLib", lambda lib: None)
    out = energy.tile_energy(None, workdir=tmp_path, rows=16, lanes=32)
    fj = a + b * 32 + c * 16 * 32                       # 2,057,000 fJ a cycle
    nw = la + lb * 32 + lc * 16 * 32                    # 717,490 nW: 717.49 fJ a cycle
    for mode, macs in (("DRAFT", 16 * 32 * 32), ("FULL", 16 * 32 * 16)):
        e = out[mode]
        assert e.macs_per_cycle == macs
        assert e.fj_per_cycle == pytest.approx(fj, rel=1e-12)
        assert e.leakage_nw == pytest.approx(nw, rel=1e-12)
        assert e.pj_per_mac_dynamic == pytest.approx(fj / 1000 / macs, rel=1e-12)
        assert e.pj_per_mac == pytest.approx((fj + nw * 1e-3) / 1000 / macs, rel=1e-12)
    assert out["DRAFT"].pj_per_mac - out["DRAFT"].pj_per_mac_dynamic == \
        pytest.approx(717.49 / 1000 / 16384, rel=1e-9)
    # the fit through (1, 2), (2, 2), (1, 4) gives a, b, c back
    assert out["FULL"].model["a_fj"] == pytest.approx(a) and \
        out["FULL"].model["b_fj"] == pytest.approx(b) and \
        out["FULL"].model["c_fj"] == pytest.approx(c)
    assert energy.leakage_fj_per_cycle(740_000.0, 1.0) == pytest.approx(740.0)
    assert energy.leakage_fj_per_cycle(740_000.0, 2.0) == pytest.approx(370.0)

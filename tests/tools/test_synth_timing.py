"""elmoe3d.synth timing: the Liberty subset's tables, the NLDM lookup, the STA against a path
computed by hand from the tables and against ABC's own ``stime``, the hierarchical
composition and the one-line errors of ``--timing``. Every Yosys run here takes seconds."""

from __future__ import annotations

import json
import re

import pytest

from elmoe3d.cli import main
from elmoe3d.synth import flow
from elmoe3d.synth.blocks import MulLeaf, hollow
from elmoe3d.synth.flow import synthesize
from elmoe3d.synth.liberty import (BUNDLED_LIBERTY, LibertyError, Table, TIMING_ONLY_ATTR,
                                   read_liberty, read_text)
from elmoe3d.synth.liberty_subset import AREA_CELLS, LEF_AREAS, SUFFIX, default_pdk, generate
from elmoe3d.synth.sta import CLOCK_SLEW_PS, TimingLib, analyze, read_blif

from ..conftest import no_real_weights


LIB = read_liberty(BUNDLED_LIBERTY)
TEXT = read_text(BUNDLED_LIBERTY)


# ---- the bundled subset ---------------------------------------------------------------------

def test_subset_names_its_source_and_licence():
    head = TEXT[:TEXT.index("\nlibrary (")]
    for needle in ("BSD 3-Clause License", "Lawrence T. Clark", "asap7sc7p5t_28",
                   "LIB/NLDM", "f970bd3", "0.7 V, 25 C", "python -m elmoe3d.synth.liberty_subset"):
        assert needle in head, needle
    assert BUNDLED_LIBERTY.read_bytes()[:2] == b"\x1f\x8b"          # committed gzip-compressed


def test_subset_keeps_the_area_cells_and_their_areas():
    """The area cells keep the LEF footprints the area-only subset had (area estimates do not
    move); the drive strengths and buffers added for timing are marked timing-only."""
    area = {n[:-len(SUFFIX)]: c for n, c in LIB.cells.items() if not c.timing_only}
    assert set(area) == set(AREA_CELLS)
    for short, cell in area.items():
        assert cell.area == LEF_AREAS[short][0], short
    timing_only = [c for c in LIB.cells.values() if c.timing_only]
    assert timing_only and all(c.name.startswith(("INV", "BUF", "NAND", "NOR", "AND", "XOR",
                                                  "XNOR", "AOI")) for c in timing_only)
    assert TIMING_ONLY_ATTR in TEXT and f"define ({TIMING_ONLY_ATTR}, cell, boolean);" in TEXT
    view = LIB.area_view()
    assert "cell_rise" not in view and "BUFx2" not in view
    assert view.count("cell (") == len(AREA_CELLS)


def test_subset_carries_timing_and_power_tables():
    LIB.check_timing()                                   # every cell: delays, no NaN
    dff = LIB.cells["DFFHQNx1_ASAP7_75t_R"]
    kinds = {a.timing_type for p in dff.pins.values() for a in p.arcs}
    assert {"rising_edge", "setup_rising", "hold_rising"} <= kinds
    for cell in LIB.cells.values():
        assert any(lk.when == "" and lk.value > 0 for lk in cell.leakage), cell.name
        assert any(p.power for p in cell.pins.values()), cell.name
        for pin in cell.pins.values():
            for pw in pin.power:
                assert {"rise_power", "fall_power"} & set(pw.tables), (cell.name, pin.name)
    assert LIB.units["time_unit"] == "1ps" and LIB.units["leakage_power_unit"] == "1pW"


def test_subset_regenerates_from_the_pdk_files():
    """The bundled subset is what ``generate`` makes of the PDK's files (skipped without
    them, failed under ``$ELMOE3D_REQUIRE_REAL``: they are beside every checkout and CI run)."""
    if not default_pdk().is_dir():
        no_real_weights(f"no ASAP7 PDK at {default_pdk()} (../shared/pdk/asap7 beside the "
                        f"checkout)")
    assert generate() == TEXT


def test_liberty_reads_gzip_and_plain_alike(tmp_path):
    plain = tmp_path / "subset.lib"
    plain.write_text(TEXT)
    other = read_liberty(plain)
    assert other.cells.keys() == LIB.cells.keys()
    assert other.cells["NAND2xp33_ASAP7_75t_R"].pins["Y"].arcs == \
        LIB.cells["NAND2xp33_ASAP7_75t_R"].pins["Y"].arcs


def test_area_of_the_multiplier_is_unchanged():
    """The IA8xW5 multiplier's area and cells with the area-only subset (before the timing
    tables): the area run sees the same library (Liberty.area_view). With the tables given
    to ABC its area mapping picks other gates (+2.5 % on the requant unit)."""
    r = synthesize("mul", hollow(MulLeaf(), owner="mul").rtlil, liberty=LIB)
    assert r.cells == {"AOI21xp33_ASAP7_75t_R": 25, "INVx1_ASAP7_75t_R": 83,
                       "NAND2xp33_ASAP7_75t_R": 18, "NOR2xp33_ASAP7_75t_R": 23,
                       "XNOR2xp5_ASAP7_75t_R": 2, "XOR2xp5_ASAP7_75t_R": 24,
                       "FAx1_ASAP7_75t_R": 21, "HAxp5_ASAP7_75t_R": 24}
    assert r.area == pytest.approx(18.69156, abs=1e-9)


# ---- table lookup ---------------------------------------------------------------------------

def test_table_lookup_interpolates_and_extrapolates_linearly():
    t = Table(kind="cell_rise", template="t", variables=("input_net_transition",
                                                         "total_output_net_capacitance"),
              index=((10.0, 20.0, 40.0), (1.0, 2.0)),
              values=((1.0, 2.0), (3.0, 5.0), (7.0, 13.0)))

    def at(s, c):
        return t.lookup(input_net_transition=s, total_output_net_capacitance=c)
    assert at(10, 1) == 1.0 and at(40, 2) == 13.0                 # grid points
    assert at(15, 1.5) == pytest.approx((1 + 2 + 3 + 5) / 4)        # bilinear
    assert at(30, 1) == pytest.approx(5.0)
    assert at(5, 1) == pytest.approx(0.0)                           # below: first segment
    assert at(60, 2) == pytest.approx(13 + (13 - 5) / 20 * 20)      # above: last segment
    assert at(10, 3) == pytest.approx(3.0)                          # load beyond the index


def test_fast_table_lookup_uses_every_segment_and_extrapolates():
    """The STA's compiled lookup (``sta._T2``, what every delay, slew and setup figure goes
    through) on a 3 x 3 table, by hand: bilinear inside the last segment of both indices,
    linear extrapolation (a fraction above 1 or below 0) outside, the variables in either
    order. Index (10, 20, 40) x (1, 2, 4); rows (1, 2, 4), (3, 5, 9), (7, 13, 25)."""
    from elmoe3d.synth.sta import _T2
    slew, load = "input_net_transition", "total_output_net_capacitance"
    t = Table(kind="cell_rise", template="t", variables=(slew, load),
              index=((10.0, 20.0, 40.0), (1.0, 2.0, 4.0)),
              values=((1.0, 2.0, 4.0), (3.0, 5.0, 9.0), (7.0, 13.0, 25.0)))
    fast = _T2(t, slew, load)
    assert fast.i1 is not None                      # compiled, not the general lookup
    # (30, 3): halfway along [20, 40] and [2, 4]: row 20 gives 5 + (9 - 5) / 2 = 7, row 40
    # gives 13 + (25 - 13) / 2 = 19; halfway between them 13
    assert fast(30.0, 3.0) == pytest.approx(13.0)
    assert fast(40.0, 4.0) == pytest.approx(25.0)   # the last grid point
    assert fast(20.0, 2.0) == pytest.approx(5.0)    # an inner grid point
    # (60, 4): slew 60 is (60 - 20) / 20 = 2 segments along [20, 40] at load 4:
    # 9 + 2 * (25 - 9) = 41
    assert fast(60.0, 4.0) == pytest.approx(41.0)
    # (40, 8): load 8 is (8 - 2) / 2 = 3 along [2, 4] at slew 40: 13 + 3 * (25 - 13) = 49
    assert fast(40.0, 8.0) == pytest.approx(49.0)
    # (5, 0.5): below both indices, the first segments at fractions -1/2: row 10 gives
    # 1 - (2 - 1) / 2 = 0.5, row 20 gives 3 - (5 - 3) / 2 = 2; 0.5 - (2 - 0.5) / 2 = -0.25
    assert fast(5.0, 0.5) == pytest.approx(-0.25)
    # (15, 1.5): inside the first segments: (1 + 2 + 3 + 5) / 4
    assert fast(15.0, 1.5) == pytest.approx(2.75)
    # compiled with the variables the other way round: called (load, slew)
    swapped = _T2(t, load, slew)
    assert swapped(3.0, 30.0) == pytest.approx(13.0)
    assert swapped(4.0, 60.0) == pytest.approx(41.0)


# ---- the STA against a path computed by hand --------------------------------------------------

def _cell_text(name):
    start = TEXT.index(f"cell ({name})")
    depth, i = 0, TEXT.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(TEXT[i], 0)
        if depth == 0:
            return TEXT[start:i]
        i += 1


def _group(text, head):
    """The text of the group starting at ``head`` (e.g. ``pin (Y)``) inside ``text``."""
    start = text.index(head)
    depth, i = 0, text.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
        i += 1


def _hand_table(cell, pin, kind, timing_type, related):
    """(index_1, index_2, rows) of table ``kind`` in the one ``timing`` group of ``pin`` of
    ``timing_type`` from ``related``, read from the Liberty text with regular expressions
    (not liberty.py)."""
    pin_text = _group(_cell_text(cell), f"pin ({pin})")
    groups = [m.start() for m in re.finditer(r"timing \(\) \{", pin_text)]
    found = []
    for g in groups:
        body = _group(pin_text[g:], "timing ()")
        if f"timing_type : {timing_type};" in body and \
                f'related_pin : "{related}";' in body:
            found.append(body)
    assert len(found) == 1, (cell, pin, timing_type, len(found))
    table = _group(found[0], f"{kind} (")

    def floats(s):
        return [float(v) for v in s.replace("\\", " ").split(",")]
    idx1 = floats(re.search(r'index_1 \("([^"]*)"\)', table).group(1))
    idx2 = floats(re.search(r'index_2 \("([^"]*)"\)', table).group(1))
    rows = [floats(r) for r in re.findall(r'"([^"]*)"', table.split("values", 1)[1])]
    return idx1, idx2, rows


def _cap(cell, pin, edge):
    text = _group(_cell_text(cell), f"pin ({pin})")
    return float(re.search(rf"{edge}_capacitance : ([0-9.]+);", text).group(1))


def _bilinear(table, x, y):
    """The NLDM lookup written out: the segment of each index holding the point (the first or
    last one outside the range), then linear along the second and the first variable."""
    idx1, idx2, rows = table

    def seg(index, v):
        i = 0
        while i < len(index) - 2 and index[i + 1] <= v:
            i += 1
        return i, (v - index[i]) / (index[i + 1] - index[i])
    i, fx = seg(idx1, x)
    j, fy = seg(idx2, y)
    low = rows[i][j] + fy * (rows[i][j + 1] - rows[i][j])
    high = rows[i + 1][j] + fy * (rows[i + 1][j + 1] - rows[i + 1][j])
    return low + fx * (high - low)


#: reg1 -> NAND2 (A) -> INV -> NOR2 (A) -> reg2. NAND2's B is tied to 1 and NOR2's B to 0:
#: a live side input would add its own arc, and the STA (like ABC) takes the worst output
#: slew over a cell's arcs (0.34 ps more here with a port on each).
HAND_BLIF = """.model top
.inputs clk
.outputs q
.names $true
1
.names $false
.gate DFFHQNx1_ASAP7_75t_R CLK=clk D=q QN=n0
.cname r1$_DFF_P_
.gate NAND2xp33_ASAP7_75t_R A=n0 B=$true Y=n1
.cname g1
.gate INVx1_ASAP7_75t_R A=n1 Y=n2
.cname g2
.gate NOR2xp33_ASAP7_75t_R A=n2 B=$false Y=n3
.cname g3
.gate DFFHQNx1_ASAP7_75t_R CLK=clk D=n3 QN=q
.cname r2$_DFF_P_
.end
"""


def test_sta_matches_a_path_computed_by_hand_from_the_tables():
    """Clock-to-Q of r1, NAND2, INV and NOR2 (each negative unate, one timing group per
    input: no worst-case merging), setup of r2's D, rise and fall, computed here from the
    Liberty text alone. The STA must agree to 1e-6 ps: it reads the same tables and does
    the same arithmetic in double precision (only the order of additions can differ, 1e-12).
    A wrong load (rise vs fall capacitance: 0.5588 vs 0.5557 fF on D), unateness, slew or
    setup table moves the figure by 0.03 ps to tens of ps."""
    dff, nand, inv, nor = (f"{c}_ASAP7_75t_R" for c in ("DFFHQNx1", "NAND2xp33", "INVx1",
                                                        "NOR2xp33"))
    # loads (fF) of each net, per output edge: the one input pin it drives
    load = {"n0": (_cap(nand, "A", "rise"), _cap(nand, "A", "fall")),
            "n1": (_cap(inv, "A", "rise"), _cap(inv, "A", "fall")),
            "n2": (_cap(nor, "A", "rise"), _cap(nor, "A", "fall")),
            "n3": (_cap(dff, "D", "rise"), _cap(dff, "D", "fall"))}

    def arc(cell, out, tt, arr_in, slew_in, net):
        """Negative-unate stage: output rise from input fall and fall from input rise."""
        tabs = {k: _hand_table(cell, out, k, tt, "A") for k in
                ("cell_rise", "cell_fall", "rise_transition", "fall_transition")}
        lr, lf = load[net]
        arr = (arr_in[1] + _bilinear(tabs["cell_rise"], slew_in[1], lr),
               arr_in[0] + _bilinear(tabs["cell_fall"], slew_in[0], lf))
        slew = (_bilinear(tabs["rise_transition"], slew_in[1], lr),
                _bilinear(tabs["fall_transition"], slew_in[0], lf))
        return arr, slew

    clk = CLOCK_SLEW_PS
    q = {k: _hand_table(dff, "QN", k, "rising_edge", "CLK") for k in
         ("cell_rise", "cell_fall", "rise_transition", "fall_transition")}
    arr = (_bilinear(q["cell_rise"], clk, load["n0"][0]),
           _bilinear(q["cell_fall"], clk, load["n0"][1]))
    slew = (_bilinear(q["rise_transition"], clk, load["n0"][0]),
            _bilinear(q["fall_transition"], clk, load["n0"][1]))
    clk_to_q = max(arr)
    arr, slew = arc(nand, "Y", "combinational", arr, slew, "n1")
    arr, slew = arc(inv, "Y", "combinational", arr, slew, "n2")
    arr, slew = arc(nor, "Y", "combinational", arr, slew, "n3")
    setup = (_bilinear(_hand_table(dff, "D", "rise_constraint", "setup_rising", "CLK"),
                       slew[0], clk),
             _bilinear(_hand_table(dff, "D", "fall_constraint", "setup_rising", "CLK"),
                       slew[1], clk))
    hand = max(arr[0] + setup[0], arr[1] + setup[1])
    assert 60 < hand < 200 and clk_to_q > 20                  # a sane path of four cells

    t = analyze(read_blif(HAND_BLIF), TimingLib(LIB), period=1000.0)
    r = t.reg2reg
    assert r["ps"] == pytest.approx(hand, abs=1e-6)
    assert r["slack"] == pytest.approx(1000.0 - hand, abs=1e-6)
    assert (r["start"], r["end"], r["levels"]) == ("r1", "r2", 3)
    assert [s[0] for s in r["path"]] == [dff, nand, inv, nor]
    assert r["clk_to_q"] + r["logic"] + r["setup"] == pytest.approx(r["ps"])
    # r2 drives the output port q: a register -> output arc (clock-to-Q into one D load)
    assert t.in2reg == {} and set(t.reg2out) == {"q"} and t.reg2out["q"] > 0
    assert t.reg2out_from["q"] == "r2"


def test_sta_under_abc_conventions_matches_abc_on_a_mapped_block():
    """The flow's timing run on a small real block (the VPU row-max exponent: registers, a
    compare chain, a stream handshake): ABC's own stime delay of the network it mapped (an
    integer, truncated from single-precision floats) and this STA under ABC's conventions
    agree within 1.5 ps; the register-to-register path is reported with its end points."""
    from elmoe3d.hw.vpu import RowMaxExponent
    text = hollow(RowMaxExponent(), owner="rowmax").rtlil
    r = synthesize("rowmax", text, liberty=LIB, timing=1000.0)
    t = r.timing
    assert t["abc_ps"] is not None and t["abc_ps"] > 100
    assert abs(t["abc_ps"] - t["sta_abc_ps"]) < 1.5, (t["abc_ps"], t["sta_abc_ps"])
    rr = t["reg2reg"]
    assert rr and 0 < rr["ps"] < 1000 and rr["slack"] == pytest.approx(1000 - rr["ps"])
    assert rr["start"] and rr["end"] and not rr["start"].startswith("$")
    assert rr["path"][0][0] == "DFFHQNx1_ASAP7_75t_R" and rr["levels"] >= 2
    # the path adds up: clock-to-Q (the first step's arrival), the logic (to the last step's
    # arrival at the D pin, every cell later than the one before), the setup
    arrivals = [step[2] for step in rr["path"]]
    assert len(rr["path"]) == rr["levels"] + 1 <= 80
    assert arrivals[0] == pytest.approx(rr["clk_to_q"], abs=0.01)
    assert arrivals[-1] == pytest.approx(rr["clk_to_q"] + rr["logic"], abs=0.01)
    assert all(b > a for a, b in zip(arrivals, arrivals[1:]))
    assert rr["ps"] == pytest.approx(rr["clk_to_q"] + rr["logic"] + rr["setup"])
    assert 20 < rr["clk_to_q"] < 100 and -20 < rr["setup"] < 50
    # no register-to-output or input-to-register arc is longer than the period either
    assert all(0 < v < 1000 for d in ("in2reg", "reg2out") for v in t[d].values())
    assert t["in2reg"] and t["reg2out"] and t["cells"] > 100
    # the area part of the same run is the area-only result
    assert r.area == synthesize("rowmax", text, liberty=LIB).area


def _fanout_blif(pins):
    """r1 -> NAND2xp33 (B tied to 1) -> one net to ``pins`` input pins of a black box's bus
    ``we`` (an SRAM macro's write enables, say)."""
    conns = " ".join(f"we[{i}]=n1" for i in range(pins))
    return (".model top\n.inputs clk\n.outputs q\n.names $true\n1\n"
            ".gate DFFHQNx1_ASAP7_75t_R CLK=clk D=q QN=n0\n.cname r1$_DFF_P_\n"
            ".gate NAND2xp33_ASAP7_75t_R A=n0 B=$true Y=n1\n.cname g1\n"
            f".gate MACRO {conns} q=q\n.cname box\n.end\n")


def _fanout_stubs(pins):
    return {"MACRO": {"we": "input", "q": "output"}}


def test_sta_reaches_many_box_pins_through_a_buffer_tree():
    """A NAND2xp33 driving 2,048 pins of a black box's input bus: ABC sees those pins as
    one primary output and builds no tree, and 2,048 D-pin loads (1.1 pF) are 50 times the
    cell's ``max_capacitance``. The STA reaches them through the fastest balanced tree of the
    library's buffers (:meth:`TimingLib.buffer_tree`), the NAND2 loaded with its root: the
    arrival equals clock-to-Q, the NAND2 into the root's input and each stage of the tree
    computed here from the Liberty text. A net within its driver's ``max_capacitance``
    (two pins) is timed as before, loaded with every pin."""
    from elmoe3d.synth.sta import TREE_FANOUTS, tree_delay
    tlib = TimingLib(LIB)
    nand, dff = "NAND2xp33_ASAP7_75t_R", "DFFHQNx1_ASAP7_75t_R"
    assert {b[0] for b in tlib.buffers} == {f"BUFx{x}_ASAP7_75t_R" for x in
                                            ("2", "3", "4", "6f", "8", "12f", "16f")}
    pl = tlib.port_load
    assert 2048 * pl > 20 * tlib.cell(nand).max_cap["Y"]

    t = analyze(read_blif(_fanout_blif(2048)), tlib, period=1000.0,
                stubs=_fanout_stubs(2048))
    tree = tlib.buffer_tree(2048, pl)
    assert t.buffer_trees == {"nets": 1, "pins": 2048}
    buf = "BUFx6f_ASAP7_75t_R"                 # 16 x 16 x 8: three stages, the last half full
    cin = max(_cap(buf, "A", "rise"), _cap(buf, "A", "fall"))
    assert (tree["cell"], tree["fanout"], tree["stages"]) == (buf, 16, 3)
    assert tree["loads"] == pytest.approx([16 * cin, 16 * cin, 8 * pl])
    assert tree["fanout"] ** tree["stages"] >= 2048 > tree["fanout"] ** (tree["stages"] - 1)
    # no other buffer and fanout is faster (at the tree's reference input slew)
    best = max(tree_delay(tree, 20.0)[:2])
    for name, cin, arc, max_cap in tlib.buffers:
        for f in TREE_FANOUTS:
            stages = next(d for d in range(1, 12) if f ** d >= 2048)
            loads = [f * cin] * (stages - 1) + [-(-2048 // f ** (stages - 1)) * pl]
            if max(loads) <= max_cap:
                other = {"arc": arc, "loads": loads}
                assert max(tree_delay(other, 20.0)[:2]) >= best - 1e-9, (name, f)

    # by hand: r1's QN into NAND2.A; NAND2.Y into the root buffer's A; the buffer stages
    clk = CLOCK_SLEW_PS
    q = {k: _hand_table(dff, "QN", k, "rising_edge", "CLK") for k in
         ("cell_rise", "cell_fall", "rise_transition", "fall_transition")}
    ln = (_cap(nand, "A", "rise"), _cap(nand, "A", "fall"))
    arr = (_bilinear(q["cell_rise"], clk, ln[0]), _bilinear(q["cell_fall"], clk, ln[1]))
    slew = (_bilinear(q["rise_transition"], clk, ln[0]),
            _bilinear(q["fall_transition"], clk, ln[1]))
    buf = tree["cell"]
    root = max(_cap(buf, "A", "rise"), _cap(buf, "A", "fall"))
    assert tree["root_cap"] == pytest.approx(root)
    nt = {k: _hand_table(nand, "Y", k, "combinational", "A") for k in
          ("cell_rise", "cell_fall", "rise_transition", "fall_transition")}
    arr = (arr[1] + _bilinear(nt["cell_rise"], slew[1], root),      # negative unate
           arr[0] + _bilinear(nt["cell_fall"], slew[0], root))
    slew = (_bilinear(nt["rise_transition"], slew[1], root),
            _bilinear(nt["fall_transition"], slew[0], root))
    bt = {k: _hand_table(buf, "Y", k, "combinational", "A") for k in
          ("cell_rise", "cell_fall", "rise_transition", "fall_transition")}
    d = [0.0, 0.0]
    sr, sf = slew                            # a buffer: rise stays rise, fall stays fall
    for load in tree["loads"]:                                        # positive unate
        d = [d[0] + _bilinear(bt["cell_rise"], sr, load), d[1] + _bilinear(bt["cell_fall"], sf, load)]
        sr, sf = (_bilinear(bt["rise_transition"], sr, load),
                  _bilinear(bt["fall_transition"], sf, load))
    hand = max(arr[0] + d[0], arr[1] + d[1])
    assert t.reg2out["box/we"] == pytest.approx(hand, abs=1e-6)

    # without buffers in the library: the NAND2 drives all 2,048 pins, far slower
    direct = TimingLib(LIB)
    direct.buffers = []
    slow = analyze(read_blif(_fanout_blif(2048)), direct, period=1000.0,
                   stubs=_fanout_stubs(2048))
    assert slow.buffer_trees == {"nets": 0, "pins": 0}
    assert slow.reg2out["box/we"] > 5 * t.reg2out["box/we"]
    # a net overloaded by its own cell inputs (36 INVx1, which ABC sees) and two pins: no
    # tree (the pins are not what overloads it, and a tree's root would load it more)
    invs = "".join(f".gate INVx1_ASAP7_75t_R A=n1 Y=x{j}\n.cname i{j}\n" for j in range(36))
    text = _fanout_blif(2).replace(".gate MACRO", invs + ".gate MACRO")
    assert analyze(read_blif(text), tlib, period=1000.0,
                   stubs=_fanout_stubs(2)).buffer_trees == {"nets": 0, "pins": 0}
    # two pins: within max_capacitance, no tree, the same figure either way
    two = analyze(read_blif(_fanout_blif(2)), tlib, period=1000.0, stubs=_fanout_stubs(2))
    assert two.buffer_trees == {"nets": 0, "pins": 0}
    assert two.reg2out["box/we"] == pytest.approx(
        analyze(read_blif(_fanout_blif(2)), direct, period=1000.0,
                stubs=_fanout_stubs(2)).reg2out["box/we"])


def _hand_merged(cell, pin, kind, timing_type, related):
    """Like :func:`_hand_table`, for a pin with several ``timing`` groups from ``related``
    (``when`` conditions): their tables' element-wise worst case (as ABC reads them; the
    groups share their indices)."""
    pin_text = _group(_cell_text(cell), f"pin ({pin})")
    tables = []
    for m in re.finditer(r"timing \(\) \{", pin_text):
        body = _group(pin_text[m.start():], "timing ()")
        if f"timing_type : {timing_type};" in body and f'related_pin : "{related}";' in body:
            table = _group(body, f"{kind} (")

            def floats(s):
                return [float(v) for v in s.replace("\\", " ").split(",")]
            tables.append((floats(re.search(r'index_1 \("([^"]*)"\)', table).group(1)),
                           floats(re.search(r'index_2 \("([^"]*)"\)', table).group(1)),
                           [floats(r) for r in re.findall(r'"([^"]*)"',
                                                          table.split("values", 1)[1])]))
    assert tables and all(t[:2] == tables[0][:2] for t in tables), (cell, pin, kind)
    rows = [[max(t[2][i][j] for t in tables) for j in range(len(tables[0][2][0]))]
            for i in range(len(tables[0][2]))]
    return tables[0][0], tables[0][1], rows


_KINDS = ("cell_rise", "cell_fall", "rise_transition", "fall_transition")


def _hand_stage(cell, arr, slew, load, *, senses=("neg",), related="A"):
    """Arrival and transition (rise, fall) at the output Y of ``cell`` from input
    ``related`` with arrival ``arr`` and transition ``slew`` (rise, fall), its output loaded
    with ``load`` (rise, fall) fF. A negative-unate sense takes the output rise from the
    input fall (and fall from rise), a positive one rise from rise; a non-unate arc both
    (``senses=("pos", "neg")``), the later arrival and the larger transition of each edge."""
    t = {k: _hand_merged(cell, "Y", k, "combinational", related) for k in _KINDS}
    a_r = a_f = s_r = s_f = -1e300
    for sense in senses:
        src_r, src_f = (0, 1) if sense == "pos" else (1, 0)   # input edge making Y rise/fall
        a_r = max(a_r, arr[src_r] + _bilinear(t["cell_rise"], slew[src_r], load[0]))
        a_f = max(a_f, arr[src_f] + _bilinear(t["cell_fall"], slew[src_f], load[1]))
        s_r = max(s_r, _bilinear(t["rise_transition"], slew[src_r], load[0]))
        s_f = max(s_f, _bilinear(t["fall_transition"], slew[src_f], load[1]))
    return (a_r, a_f), (s_r, s_f)


def _hand_clock_to_q(load):
    """Arrival and transition (rise, fall) at a DFFHQNx1's QN loaded with ``load`` fF."""
    q = {k: _hand_table("DFFHQNx1_ASAP7_75t_R", "QN", k, "rising_edge", "CLK") for k in _KINDS}
    clk = CLOCK_SLEW_PS
    return ((_bilinear(q["cell_rise"], clk, load[0]), _bilinear(q["cell_fall"], clk, load[1])),
            (_bilinear(q["rise_transition"], clk, load[0]),
             _bilinear(q["fall_transition"], clk, load[1])))


def _hand_setup(slew):
    """Setup (rise, fall) of a DFFHQNx1's D at transition ``slew`` (rise, fall)."""
    dff = "DFFHQNx1_ASAP7_75t_R"
    return tuple(_bilinear(_hand_table(dff, "D", f"{e}_constraint", "setup_rising", "CLK"),
                           s, CLOCK_SLEW_PS) for e, s in zip(("rise", "fall"), slew))


#: Port a through one INV to r1 and to y[0], through three to r2 and to y[1]: one input bus
#: reaching two registers and one output bus over paths of different depth.
BOUNDARY_BLIF = """.model top
.inputs clk a
.outputs y[0] y[1]
.gate INVx1_ASAP7_75t_R A=a Y=n1
.gate DFFHQNx1_ASAP7_75t_R CLK=clk D=n1 QN=q1
.cname r1$_DFF_P_
.gate INVx1_ASAP7_75t_R A=a Y=m1
.gate INVx1_ASAP7_75t_R A=m1 Y=m2
.gate INVx1_ASAP7_75t_R A=m2 Y=m3
.gate DFFHQNx1_ASAP7_75t_R CLK=clk D=m3 QN=q2
.cname r2$_DFF_P_
.gate INVx1_ASAP7_75t_R A=a Y=y[0]
.gate INVx1_ASAP7_75t_R A=a Y=k1
.gate INVx1_ASAP7_75t_R A=k1 Y=k2
.gate INVx1_ASAP7_75t_R A=k2 Y=y[1]
.end
"""


def test_sta_boundary_arcs_are_the_longest_path_of_each_bus():
    """A block's boundary model (what the hierarchical composition adds across block
    boundaries) keeps, per bus, the worst path: ``in2reg`` of port ``a`` is its three-INV path
    into r2 with r2's setup, not the one-INV path into r1; ``in2out`` of ``a -> y`` is the
    three-INV path to ``y[1]``, not the one to ``y[0]``; rise and fall alike, the later one.
    Computed here from the Liberty text (ports: arrival 0, transition PORT_SLEW_PS; an
    output port loads its net with one D pin, the larger of its rise and fall capacitance)."""
    from elmoe3d.synth.sta import PORT_SLEW_PS
    inv, dff = "INVx1_ASAP7_75t_R", "DFFHQNx1_ASAP7_75t_R"
    inv_in = (_cap(inv, "A", "rise"), _cap(inv, "A", "fall"))
    d_in = (_cap(dff, "D", "rise"), _cap(dff, "D", "fall"))
    port = (max(d_in),) * 2
    start = ((0.0, 0.0), (PORT_SLEW_PS, PORT_SLEW_PS))

    def chain(stages, last_load):
        arr, slew = start
        for k in range(stages):
            arr, slew = _hand_stage(inv, arr, slew, last_load if k == stages - 1 else inv_in)
        return arr, slew

    def to_reg(stages):
        arr, slew = chain(stages, d_in)
        return max(a + s for a, s in zip(arr, _hand_setup(slew)))
    short_reg, long_reg = to_reg(1), to_reg(3)
    short_out, long_out = max(chain(1, port)[0]), max(chain(3, port)[0])
    assert long_reg > short_reg + 5 and long_out > short_out + 5      # two INVs apart

    t = analyze(read_blif(BOUNDARY_BLIF), TimingLib(LIB), period=1000.0)
    assert t.in2reg == {"a": pytest.approx(long_reg, abs=1e-6)}
    assert t.in2reg_to == {"a": "r2"}
    assert t.in2out == {"a -> y": pytest.approx(long_out, abs=1e-6)}
    assert t.reg2reg is None and t.reg2out == {}


#: r1 -> NAND2 (B tied to 1) -> INV -> XOR2xp5 (A; B tied to 0) -> r2 -> r1: a non-unate arc
#: between two registers, its input's fall 4.5 ps later than its rise.
XOR_BLIF = HAND_BLIF.replace("NOR2xp33_ASAP7_75t_R A=n2 B=$false",
                             "XOR2xp5_ASAP7_75t_R A=n2 B=$false")


def test_sta_times_a_non_unate_arc_in_both_senses():
    """XOR2xp5's A -> Y is two ``timing`` groups, positive unate ``when !B`` and negative
    unate ``when B``: merged (element-wise worst table) into one non-unate arc, whose output
    rise comes from the input's rise or its fall, whichever is later (and fall likewise).
    Clock-to-Q of r1, NAND2, INV (negative unate), the XOR and r2's setup by hand from the
    Liberty text; the STA must agree to 1e-6 ps. Taken as positive unate alone (the INV's
    later fall not reaching the XOR's rise), the path is 4.3 ps shorter."""
    xor, nand, inv, dff = (f"{c}_ASAP7_75t_R" for c in ("XOR2xp5", "NAND2xp33", "INVx1",
                                                        "DFFHQNx1"))
    senses = re.findall(r"timing_sense : (\w+);", _group(_cell_text(xor), "pin (Y)"))
    assert senses[:2] == ["positive_unate", "negative_unate"]

    def cap(cell, pin="A"):
        return _cap(cell, pin, "rise"), _cap(cell, pin, "fall")
    arr, slew = _hand_clock_to_q(cap(nand))
    arr, slew = _hand_stage(nand, arr, slew, cap(inv))
    arr, slew = _hand_stage(inv, arr, slew, cap(xor))
    assert arr[1] > arr[0] + 4                            # the XOR's input falls later
    both, slew_both = _hand_stage(xor, arr, slew, cap(dff, "D"), senses=("pos", "neg"))
    hand = max(a + s for a, s in zip(both, _hand_setup(slew_both)))
    pos, slew_pos = _hand_stage(xor, arr, slew, cap(dff, "D"), senses=("pos",))
    assert hand > max(a + s for a, s in zip(pos, _hand_setup(slew_pos))) + 4

    r = analyze(read_blif(XOR_BLIF), TimingLib(LIB), period=1000.0).reg2reg
    assert r["ps"] == pytest.approx(hand, abs=1e-6)
    assert (r["start"], r["end"], r["levels"]) == ("r1", "r2", 3)


# ---- hierarchical composition ----------------------------------------------------------------

class _R:
    def __init__(self, timing, name="job"):
        self.timing, self.name = timing, name


def _t(reg2reg=None, in2reg=None, reg2out=None, in2out=None, boxes=None):
    return {"reg2reg": reg2reg, "in2reg": in2reg or {}, "reg2out": reg2out or {},
            "in2out": in2out or {}, "blackboxes": boxes or {}}


def test_composition_adds_paths_across_sub_block_boundaries():
    """A parent whose register feeds a child's input through 300 ps of logic, the child
    reaching its register 400 ps later, and a comb chain parent -> child -> parent: the
    block's worst register-to-register path crosses the boundary, the segments say where."""
    from elmoe3d.synth.rollup import Node
    from elmoe3d.synth.timing import block_model, describe
    stub = "(* blackbox *)\nmodule CHILD (\n  input [3:0] a,\n  input [0:0] r,\n" \
           "  output [0:0] v\n);\nendmodule\n"
    child = Node(label="child", category="c", job="c")
    parent = Node(label="parent", category="p", job="p", boxes={"CHILD": child})
    results = {
        "p": _R(_t(reg2reg={"ps": 200.0, "start": "x", "end": "y"},
                   reg2out={"u.bb/a": 300.0, "u.bb/r": 50.0},
                   in2reg={"u.bb/v": 120.0}, in2out={"u.bb/v -> u.bb/r": 90.0},
                   boxes={"u.bb": "CHILD"})),
        "c": _R(_t(reg2reg={"ps": 150.0, "start": "c1", "end": "c2"},
                   in2reg={"a": 400.0, "r": 30.0}, in2out={"r -> v": 80.0})),
    }
    m = block_model(parent, results, {"p": stub})
    d = describe(m.r2r, 1000.0)
    assert d["ps"] == pytest.approx(700.0) and d["slack"] == pytest.approx(300.0)
    assert [s["block"] for s in d["segments"]] == ["parent", "u: child"]
    assert d["segments"][0]["to"] == "u.bb/a" and d["segments"][1]["from"] == "a"
    # the child's r -> v arc and the parent's v -> r arc form a bus-level loop: cut, reported
    assert any("u.bb/" in c for c in m.cut)


def test_tile_model_is_the_worst_of_its_fits_arc_by_arc():
    """The tensor tile is timed from its three fit tiles: each arc (register to register,
    input to register, register to output, input to output) is the largest of the fits'
    figures for it, which need not come from one fit; an arc one fit alone has is kept."""
    from elmoe3d.synth.blocks import TILE_FIT
    from elmoe3d.synth.rollup import TileNode
    from elmoe3d.synth.timing import block_model
    figures = [  # (reg2reg, in2reg of i, reg2out of o, in2out of i -> o)
        (300.0, 120.0, 90.0, 40.0), (250.0, 310.0, 60.0, 20.0), (280.0, 200.0, 95.0, 70.0)]
    results = {}
    for (r, lanes), (rr, ir, ro, io) in zip(TILE_FIT, figures):
        job = f"tile_r{r}_l{lanes}"
        results[job] = _R(_t(reg2reg={"ps": rr, "start": "a", "end": "b"}, in2reg={"i": ir},
                             reg2out={"o": ro}, in2out={"i -> o": io}), name=job)
    results["tile_r2_l2"].timing["in2reg"]["only"] = 5.0
    m = block_model(TileNode(label="tile", rows=16, lanes=32), results, {})
    assert m.r2r["ps"] == 300.0 and "tile_r1_l2" in m.r2r["segments"][0][0]
    assert {b: p["ps"] for b, p in m.i2r.items()} == {"i": 310.0, "only": 5.0}
    assert "tile_r2_l2" in m.i2r["i"]["segments"][0][0]
    assert {b: p["ps"] for b, p in m.r2o.items()} == {"o": 95.0}
    assert {k: p["ps"] for k, p in m.i2o.items()} == {("i", "o"): 70.0}


def test_sram_macro_paths_take_its_clock_to_data_and_its_setup():
    """A block whose register reaches an SRAM macro's address 300 ps later and whose
    register is reached 100 ps after the macro's read data: the worst register-to-register
    path is 300 ps + the macro's setup (ADDRESS ``setup_rising``, 50.1 ps in
    srambank_256x4x64_6t122.lib), not its hold (10.8 ps); the read path is its clock to
    ``dataout`` (149.8 ps) + 100 ps."""
    from elmoe3d.synth.rollup import Node
    from elmoe3d.synth.timing import block_model, describe
    stub = "(* blackbox *)\nmodule elmoe3d_sram_8x64 (\n  input [5:0] addr,\n" \
           "  output [7:0] rdata\n);\nendmodule\n"
    parent = Node(label="parent", category="p", job="p")
    results = {"p": _R(_t(reg2reg={"ps": 200.0, "start": "x", "end": "y"},
                          reg2out={"u.bb/addr": 300.0}, in2reg={"u.bb/rdata": 100.0},
                          boxes={"u.bb": "elmoe3d_sram_8x64"}))}
    m = block_model(parent, results, {"p": stub})
    d = describe(m.r2r, 1000.0)
    assert d["ps"] == pytest.approx(300.0 + 50.1) and d["slack"] == pytest.approx(649.9)
    assert [(s["block"], s["ps"]) for s in d["segments"]] == [
        ("parent", 300.0), ("u: SRAM macro", pytest.approx(50.1))]
    # without the address path, the read path: clock to data, then the parent's logic
    results["p"].timing["reg2out"] = {}
    m = block_model(parent, results, {"p": stub})
    assert m.r2r["ps"] == pytest.approx(149.8 + 100.0)
    assert [s[3] for s in m.r2r["segments"]] == [pytest.approx(149.8), 100.0]


# ---- bad input: one line naming the file and the cell ----------------------------------------

_INV_AREA_ONLY = ('cell (INV) { area : 0.04; pin (A) { direction : input; capacitance : 0.5; }'
                  ' pin (Y) { direction : output; function : "!A"; } }')


def test_timing_without_tables_is_one_line(tmp_path, capsys):
    lib = tmp_path / "area_only.lib"
    lib.write_text(f"library (x) {{\n  {_INV_AREA_ONLY}\n}}\n")
    assert main(["synth", "--timing", "--liberty", str(lib)]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == (f"elmoe3d synth: error: {lib}:2: cell INV: no timing tables for "
                           f"output Y from input A (needed for timing: cell_rise, cell_fall, "
                           f"rise_transition, fall_transition)")
    assert out == ""


def test_timing_with_nan_in_a_table_is_one_line(tmp_path, capsys):
    """The bundled NAND2xp33 with one value of its first cell_rise table made NaN."""
    text = _cell_text("NAND2xp33_ASAP7_75t_R")
    bad = re.sub(r'(cell_rise \(delay_template_7x7_x1\) \{.*?values \( \\\s*")([0-9.]+)',
                 lambda m: m.group(1) + "nan", text, count=1, flags=re.S)
    assert bad != text
    lib = tmp_path / "nan.lib"
    lib.write_text(TEXT.replace(text, bad))
    line = TEXT[:TEXT.index(text)].count("\n") + 1
    assert main(["synth", "--timing", "--liberty", str(lib)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith(f"elmoe3d synth: error: {lib}:{line}: cell NAND2xp33_ASAP7_75t_R: "
                          f"output Y from input A: cell_rise (line ")
    assert err.endswith("holds a NaN or infinite value")
    with pytest.raises(LibertyError):
        read_liberty(lib).check_timing()
    read_liberty(lib)                                  # area alone does not need the tables


@pytest.mark.parametrize("period", ["0", "-5", "fast", "nan"])
def test_bad_period_is_one_line(period, capsys):
    assert main(["synth", "--timing", "--period", period]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--period" in err


# ---- the whole command with --timing (stand-in Yosys) -----------------------------------------

STAT = """{
   "creator": "Yosys 0.70",
   "modules": {
      "\\\\top": {
         "num_wires": 4, "num_cells": 3, "area": 0.1,
         "num_cells_by_type": {"INVx1_ASAP7_75t_R": 2, "NAND2xp33_ASAP7_75t_R": 1}
      }
   }
}
"""


def test_cli_timing_prints_and_writes_the_report(tmp_path, monkeypatch, capsys):
    """Every block through a stand-in Yosys that writes the same small netlist: the timing
    tables are printed and the JSON has every die block's worst path and the leaves."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "stat.json").write_text(STAT)
    (src / "timing.blif").write_text(HAND_BLIF)
    fake = tmp_path / "fake-yosys.sh"
    fake.write_text('if [ "$1" = "-V" ]; then echo "Yosys 0.0 (fake)"; exit 0; fi\n'
                    f'cp "{src}/stat.json" stat.json\ncp "{src}/stat.json" timing_stat.json\n'
                    f'cp "{src}/timing.blif" timing.blif\n'
                    'echo "netlist 3 1 5 1 123" > stats.txt\n: > check.txt\n: > yosys.log\n')
    monkeypatch.setattr(flow, "yosys_command", lambda: ["sh", str(fake)])
    from elmoe3d.synth import blocks
    monkeypatch.setattr(blocks, "DIE_BLOCKS", [b for b in blocks.DIE_BLOCKS         # seconds
                                               if b.label in ("PE", "EXT controller")])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))  # caches
    out = tmp_path / "report.json"
    rc = main(["synth", "--config", "small", "--no-check", "--scaling", "", "--jobs", "1",
               "--timing", "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "worst register-to-register path per block" in captured.out
    lines = captured.out.strip().splitlines()
    assert lines[-1].startswith("elmoe3d synth: done in ")      # after the timing tables,
    assert sum("elmoe3d synth: done in" in line for line in lines) == 1    # not before them
    report = json.loads(out.read_text())
    timing = report["timing"]
    assert timing["period_ps"] == 1000.0 and "ABC" in timing["tool"]
    blocks = timing["configs"]["small"]["blocks"]
    assert set(blocks) == {"PE", "EXT controller"}
    assert all(b is None or b["ps"] > 0 for b in blocks.values())
    pe = blocks["PE"]
    assert pe["slack"] == pytest.approx(1000.0 - pe["ps"])
    leaves = timing["configs"]["small"]["leaves"]
    assert leaves and all(r["reg2reg"]["start"] == "r1" for r in leaves)
    assert timing["abc_check"]["jobs"] > 0

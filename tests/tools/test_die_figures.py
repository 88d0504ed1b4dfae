"""Figure 9 of ``elmoe3d bench`` without simulation: the verify-phase overlap computed from
canned per-cycle ``probe`` values of the die (:func:`elmoe3d.sim.bench_die.exchange_figures`)
and the table printed from a canned record (:func:`elmoe3d.sim.bench_die.print_die`)."""

import io

from rich.console import Console

from elmoe3d.config import preset
from elmoe3d.hw.die import die_probe_layout
from elmoe3d.sim.bench_die import exchange_figures, print_die, probe_fields
from elmoe3d.sw.golden.agg_link import LinkMode, LinkOp

SMALL = preset("small")


def _events(spec):
    """``{cycle: {field: bits}}`` -> the sorted ``(cycle, probe value)`` list of the bench."""
    layout = die_probe_layout(SMALL)
    out = []
    for cyc in sorted(spec):
        out.append((cyc, layout.const(spec[cyc]).as_bits()))
    return out


def test_probe_fields_match_the_layout():
    f = probe_fields(SMALL)
    assert f["ext_word"] == (0, SMALL.pes)
    assert sum(w for _, w in f.values()) == die_probe_layout(SMALL).size
    assert f["link_busy"][1] == SMALL.groups


def test_exchange_figures_on_canned_probes():
    """Group 0 (PEs 0, 1): EXT words at cycles 10, 13, 20 (window [10, 20]); a BYPASS taken
    at 5, first word at 12, done at 16 (span [11, 16], hidden); a REDUCE_MAX (not a psum)
    taken at 17; the layer-final REDUCE_ADD taken at 21, waiting for its sources until its
    first word at 25, done at 30 (span [24, 30], exposed). Group 1 idle (a stray link word on
    PE 2 belongs to no descriptor)."""
    spec = {5: {"link_op": 0b01}, 10: {"ext_word": 0b0001}, 12: {"link_o_word": 0b0001},
            13: {"ext_word": 0b0011, "link_i_word": 0b0010},
            16: {"link_done": 0b01, "link_o_word": 0b0100},
            17: {"link_op": 0b01}, 19: {"link_o_word": 0b0011}, 20: {"ext_word": 0b0010},
            21: {"link_done": 0b01, "link_op": 0b01}, 25: {"link_o_word": 0b0010},
            30: {"link_done": 0b01}, 50: {"ext_word": 0b0001}}
    ops = [LinkOp(LinkMode.BYPASS, 0b01, 0b10, 3), LinkOp(LinkMode.REDUCE_MAX, 0b11, 0b11, 1),
           LinkOp(LinkMode.REDUCE_ADD, 0b10, 0b01, 2)]
    ex = exchange_figures(_events(spec), probe_fields(SMALL), pes_per_group=2,
                          flits_per_word=2, link_ops=[ops, None], final_ops=[1, 0],
                          first=0, end=39, op_latency=1)
    assert (ex["psum_cycles"], ex["hidden_cycles"], ex["concurrent_cycles"]) == (13, 6, 1)
    assert ex["overlap"] == 6 / 13 and ex["concurrent"] == 1 / 13
    assert (ex["exposed_cycles"], ex["exposed_final_cycles"]) == (7, 7)
    assert ex["exposed_share"] == 7 / 40
    assert (ex["layer_psum_cycles"], ex["overlap_in_layer"]) == (6, 1.0)
    g0, g1 = ex["groups"]
    assert (g0["descriptors"], g0["descriptors_sent"], g0["ext_window"]) == (3, 3, [10, 20])
    assert (g1["descriptors"], g1["psum_cycles"], g1["ext_window"]) == (0, 0, None)
    # counts are per bit, inside [first, end] only (cycle 50 is outside)
    assert ex["counts"]["ext_word"] == [2, 2, 0, 0]
    assert ex["counts"]["link_op"] == [3, 0]
    # not the final reduction: the same cycles are exposed, none of them "final"
    ex = exchange_figures(_events(spec), probe_fields(SMALL), pes_per_group=2,
                          flits_per_word=2, link_ops=[ops, None], final_ops=[0, 0],
                          first=0, end=39, op_latency=1)
    assert (ex["exposed_cycles"], ex["exposed_final_cycles"]) == (7, 0)
    assert (ex["layer_psum_cycles"], ex["overlap_in_layer"]) == (13, 6 / 13)
    # no psum descriptor: no overlap figure
    ex = exchange_figures(_events({5: {"link_op": 1}, 7: {"link_o_word": 1},
                                   9: {"link_done": 1}}), probe_fields(SMALL),
                          pes_per_group=2, flits_per_word=2,
                          link_ops=[[ops[1]], None], final_ops=[0, 0], first=0, end=9)
    assert ex["psum_cycles"] == 0 and ex["overlap"] is None and ex["exposed_cycles"] == 0
    # the span starts op_latency cycles after the descriptor is taken (the link's default,
    # LINK_OP_LATENCY = 2: the flit buffer) and a cycle after a word's first flit entered it
    for kw, span in (({"op_latency": 1}, 4), ({}, 3)):
        ex = exchange_figures(_events({5: {"link_op": 1}, 7: {"link_o_word": 1},
                                       9: {"link_done": 1}}), probe_fields(SMALL),
                              pes_per_group=2, flits_per_word=2,
                              link_ops=[[ops[0]], None], final_ops=[0, 0], first=0, end=9, **kw)
        assert ex["psum_cycles"] == span
        ex = exchange_figures(_events({5: {"link_op": 1}, 12: {"link_o_word": 1},
                                       16: {"link_done": 1}}), probe_fields(SMALL),
                              pes_per_group=2, flits_per_word=2,
                              link_ops=[[ops[0]], None], final_ops=[0, 0], first=0, end=19, **kw)
        assert ex["psum_cycles"] == {4: 6, 3: 5}[span]          # [11 or 12, 16]


def _case(**kw):
    c = {"tokens": 16, "phase": "verify", "experts": [0, 1], "cycles": 9000, "perf_cycles": 8700.0,
         "hb_bytes_per_cycle": 7.0, "ext_bytes_per_cycle": 14.7, "link_bytes": 65536,
         "psum_cycles": 1200, "overlap": 0.875, "overlap_in_layer": 0.9375, "concurrent": 0.5, "exposed_cycles": 150,
         "exposed_final_cycles": 100, "exposed_share": 150 / 9000, "comparisons": 4242,
         "mismatches": 0, "violations": 0, "details": []}
    c.update(kw)
    return c


def _figs(cases, failures=()):
    return {"cases": cases, "failures": list(failures), "seed": 1, "log": "/x/sim.log",
            "pes": 4, "hb_peak_bytes_per_cycle": 204.8, "ext_peak_bytes_per_cycle": 25.6,
            "ext_channels": 2, "overlap_goal": 1.0}


def _print(figs):
    console = Console(file=io.StringIO(), width=250, highlight=False)
    missed = print_die(console, figs)
    return console.file.getvalue(), missed


def test_print_die_canned_record():
    draft = _case(phase="draft", cycles=1141, perf_cycles=1100.0, hb_bytes_per_cycle=60.6,
                  ext_bytes_per_cycle=0.0, psum_cycles=0, overlap=None, exposed_cycles=0)
    text, missed = _print(_figs([draft, _case()]))
    assert missed == []
    # the perf model beside each case and per step kind (within the 5% target here)
    assert "1,100 (-3.6%)" in text and "8,700 (-3.3%)" in text
    assert "draft 1,100 / 1,141 (-3.6%); verify 8,700 / 9,000 (-3.3%)" in text
    assert "overlap goal 1" in text and "0.875 (0.938)" in text
    assert "14.7 (57%)" in text and "60.6 (30%)" in text
    assert "150 (100) 1.7%" in text and "65,536" in text and "4,242" in text
    assert "9,000" in text and "1,141" in text and "met" in text
    # a mismatch and a DRAM timing violation are missed targets; a low overlap is not
    text, missed = _print(_figs([_case(mismatches=3), _case(tokens=4, violations=2,
                                                              overlap=0.1)]))
    assert "MISSED" in text
    assert missed == ["die T=16 verify: 3 mismatch(es) in 4,242 comparisons",
                      "die T=4 verify: 2 DRAM timing violation(s)"]
    # the perf model more than 5% off the die in a step kind is a missed target
    text, missed = _print(_figs([draft, _case(perf_cycles=8000.0)]))
    assert missed == ["die verify: the perf model's 8,000 cycles are -11.1% off the die's "
                      "9,000"]
    text, missed = _print(_figs([], ["test_phases/traffic=smooth: boom"]))
    assert missed == ["logic die: no case measured",
                      "die bench: test_phases/traffic=smooth: boom (log /x/sim.log)"]

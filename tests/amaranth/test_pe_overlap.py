# amaranth: UnusedElaboratable=no
"""What the PE's engines overlap (``docs/pe.md``, "Engines and synchronisation", OUTPUT,
REQUANT), in the Amaranth simulator against the functional simulator (plain equality of every
``o`` beat and ``link_o`` word, STATUS on its functional fields), with the overlap itself
asserted on the handshake cycles:

* the WMEM buffers' half flags: a LOAD writes a buffer's lower half while the GEMM releasing it
  still reads the upper half, and the upper half of a buffer whose GEMM reads only the lower
  one; a LOAD that signals waits for the GEMM's last read;
* LOADs behind ``CLEAR counters``, a BARRIER or a STATUS are decoded while it waits, their
  words taken from the cycle after it starts (STATUS counts exactly the words after the
  CLEAR and before it);
* OUTPUT starts while the COMBINE sink still writes OUT, each pair read waiting for the writes
  to its words (so the first beat can leave by the last write);
* a result the tile finishes while the result register still feeds the sink waits in the
  skid register, so the tile's ``o.ready`` is a register and the tile runs on;
* REQUANT ``pad_rows``: zero codes for the padding rows, written beside the last live row's,
  their ``e_h`` untouched.

The programs are ``tests/pe_cases.py``'s (the cycle model runs them too,
``tests/host/test_pe_cycles.py``). Seeds are fixed and printed."""

import pytest

from ..pe_cases import (barrier_program, early_output_program, half_flag_program,
                        requant_pad_program, sink_paced_program)
from .test_pe import ARCH, compare_with_fsim
from elmoe3d.config import FPGA_LEAN_PE, preset
from elmoe3d.hw.pe import PE
from elmoe3d.sim.traffic import ROUGH, SMOOTH
from elmoe3d.sw.golden import asm


#: A PE with four token rows (lanes 8, W = 1024): REQUANT with up to three padding rows.
WIDE = preset("mid")
#: ACT, TOK, HBUF and ROWMAX in quarter words (REQUANT writes the codes of a part).
NARROW_IOMEM = {"tile_passes": 4, "requant_units": 4, "narrow_iomem": True}


def test_half_flags_let_loads_overlap_the_releasing_gemm():
    """B's weight words go into buffer 0's lower half while GEMM A still reads the upper half,
    and D's into buffer 1's upper half while GEMM C (reading only the lower half) runs; the
    scale loads that signal wait for the releasing GEMM's last read. RTL == fsim."""
    seed = 11
    print(f"seed={seed}")
    prog, ld, marks = half_flag_program(ARCH, seed)
    got, _ = compare_with_fsim(prog, ld, seed=seed, watch=("tile_in",))
    beats, lds = got["tile_in"], got["ld"]
    a_last = beats[marks["A_beats"][1] - 1]
    c_first, c_last = beats[marks["C_beats"][0]], beats[marks["C_beats"][1] - 1]
    print(f"A's last beat {a_last}, B's first word {lds[marks['B']]}, B's scale "
          f"{lds[marks['B_scale']]}; C's beats {c_first}..{c_last}, D's first word "
          f"{lds[marks['D']]}, D's scale {lds[marks['D_scale']]}")
    assert lds[marks["B"]] < a_last < lds[marks["B_scale"]]
    assert c_first <= lds[marks["D"]] < c_last < lds[marks["D_scale"]]


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
@pytest.mark.parametrize("options", [{}, dict(FPGA_LEAN_PE)], ids=["default", "fpga-lean"])
def test_half_flags_equal_fsim(traffic, options):
    """The same program under idle cycles and backpressure, on the default and the FPGA-lean
    PE (both buffers in one memory, weights in quarter words): RTL == fsim, no word read and
    written in one cycle."""
    seed = 21
    print(f"seed={seed}")
    prog, ld, _ = half_flag_program(ARCH, seed)
    compare_with_fsim(prog, ld, traffic=traffic, seed=seed, pe_options=options)


def test_loads_queue_behind_clear_counters_barrier_and_status():
    """The LOAD after ``CLEAR counters`` is taken in the next cycle (not after the CLEAR ran)
    and its first word in the second cycle after the CLEAR starts (the load engine registers
    its hold); the LOAD after BARRIER, STATUS is taken while the BARRIER waits for the GEMM,
    its first word two cycles after the STATUS started (its snapshot); the first STATUS counts the words between the CLEAR and the BARRIER, the last
    all after the CLEAR (RTL == fsim on every functional field)."""
    seed = 12
    print(f"seed={seed}")
    prog, ld, marks = barrier_program(ARCH, seed)
    got, ref = compare_with_fsim(prog, ld, seed=seed, watch=("barrier", "tile_in"))
    cmd, lds, bar = got["cmd"], got["ld"], got["barrier"]
    clear_wait = [c for c in bar if c < cmd[marks["barrier"]]]
    barrier_wait = [c for c in bar if c >= cmd[marks["barrier"]]]
    status = [c for (k, _), c in zip(got["o"], got["o_cycles"]) if k == asm.OKind.STATUS]
    print(f"CLEAR taken {cmd[marks['clear']]}, drains {clear_wait}, next command "
          f"{cmd[marks['clear'] + 1]}, first word after it {lds[marks['after_clear']]}; "
          f"BARRIER taken {cmd[marks['barrier']]}, drains {barrier_wait[0]}.."
          f"{barrier_wait[-1]}, LOAD after the STATUS taken {cmd[marks['status'] + 1]}, its "
          f"first word {lds[marks['after_barrier']]}, the STATUS beat {status[0]}")
    assert cmd[marks["clear"] + 1] == cmd[marks["clear"]] + 1
    assert lds[marks["after_clear"]] == clear_wait[-1] + 2
    assert cmd[marks["status"] + 1] < barrier_wait[-1]
    assert lds[marks["after_barrier"]] == status[0] + 1      # 2 cycles after STATUS started
    counts = [asm.unpack_status(d)["words_loaded"] for k, d in got["o"]
              if k == asm.OKind.STATUS]
    assert counts == [marks["after_barrier"] - marks["after_clear"],
                      len(ld) - marks["after_clear"]]


@pytest.mark.parametrize("last_first", [False, True], ids=["last-pair", "first-pair"])
@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_output_overlaps_the_combine_drain(last_first, traffic):
    """OUTPUT starts while the last COMBINE GEMM's row is still in the sink: when that row
    writes the token's last channels, the first ``o`` beat (its first channels) is offered by
    the cycle of the last OUT write; when it writes the first channels, the first read waits
    for the write. RTL == fsim either way (a read before its word's write would differ)."""
    seed = 13 + last_first
    print(f"seed={seed}")
    prog, ld = early_output_program(ARCH, seed, last_first=last_first)
    got, _ = compare_with_fsim(prog, ld, traffic=traffic, seed=seed, watch=("out_write",))
    first_o, last_write = got["o_cycles"][0], got["out_write"][-1]
    print(f"last OUT write {last_write}, first o beat {first_o}")
    if traffic is SMOOTH:
        assert (first_o > last_write) == last_first


@pytest.mark.parametrize("options, traffic", [({}, SMOOTH), ({"combine_units": 1}, ROUGH)],
                         ids=["J4-smooth", "J1-rough"])
def test_skid_register_takes_results_while_the_sink_drains(options, traffic):
    """A COMBINE GEMM of one K-group a result (the tile offers a result a cycle, the sink
    takes ``rows * combine_row_cycles`` cycles each): the tile hands a result over while the
    result register is busy (the skid register holds it, one result at most), and stalls only
    while the skid register is full; RTL == fsim, and the RAW GEMM behind it too."""
    seed = 15
    print(f"seed={seed}")
    prog, ld = sink_paced_program(ARCH, seed)
    got, _ = compare_with_fsim(prog, ld, traffic=traffic, seed=seed, pe_options=options,
                               watch=("tile_out", "result_skid", "tile_in"))
    skid, taken = got["result_skid"], got["tile_out"]
    print(f"tile results handed over {taken}, skid register full {skid}")
    assert skid
    # a result is handed over in a cycle the skid register is empty, and fills it when it
    # lands there: every cycle the skid holds a result follows a hand-over or a held cycle
    assert all(c - 1 in taken or c - 1 in skid for c in skid)
    assert not set(taken) & set(skid)


@pytest.mark.parametrize("config, pad_rows, options", [
    (ARCH, 0, {}), (ARCH, 1, {}), (ARCH, 1, NARROW_IOMEM), (ARCH, 1, dict(FPGA_LEAN_PE)),
    (WIDE, 1, {}), (WIDE, 3, {}),
], ids=["small-0", "small-1", "small-1-narrow", "small-1-fpga-lean", "wide-1", "wide-3"])
def test_requant_pad_rows_equal_fsim(config, pad_rows, options):
    """REQUANT with padding rows over ACT and TOK words full of random bytes: the padding rows'
    codes read back zero (written beside the last live row's), their ``e_h`` bytes as they
    were; RTL == fsim on every ``link_o`` word, on the default, the quarter-word and the
    FPGA-lean PE and on a PE of four rows."""
    seed = 14 + pad_rows
    print(f"seed={seed}")
    prog, ld, link_i = requant_pad_program(config, seed, pad_rows=pad_rows)
    got, ref = compare_with_fsim(prog, ld, link_i, seed=seed, traffic=ROUGH,
                                 dut=PE(config=config, **options))
    pe = config.pe
    acts = asm.unpack_act(asm.ints_to_words(ref.link_o[:-1], pe), pe)     # [words, R, 32]
    last = acts[-(len(acts) // 2):]                   # the last row block's words
    if pad_rows:
        assert not last[:, pe.rows - pad_rows:].any()
        assert last[:, pe.rows - pad_rows - 1].any()

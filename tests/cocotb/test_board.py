"""The board top (hw.board.BoardTop) at the pin level under cocotb + Verilator (sim.bench_board):
the host driver (sw.host.fpga.FpgaBoard, run_host_fpga) runs the PE programs of a real-trace
layer-step through a bit-level UART model, every o beat and link_o word bit-exact against the
functional simulation and the root PE's FP32 output against ref_moe, after an abandoned
session left the PE stuck mid-LOAD (HELLO's soft reset recovers it); then the same with one
host->board bit flipped and one board->host byte dropped, recovered by retransmission. Also
BoardTop's and BoardPlatformTop's parameter checks and the platform wrapper's elaboration."""

import pytest

from elmoe3d.config import preset
from elmoe3d.hw.board import BoardPlatformTop, BoardTop, uart_divisor
from elmoe3d.hw.checked import inspection

SMALL = preset("small")


def _report(records):
    for wire in (r for r in records if r["kind"] == "wire"):
        print(f"session {wire['session']}: {wire['board_cycles']} board cycles, "
              f"{wire['bytes_to_board']} bytes to the board, {wire['bytes_from_board']} from "
              f"it, {wire['wall_seconds']:.1f} s wall, faults {wire['faults']}, flipped "
              f"{wire['flipped']}, dropped {wire['dropped']}, seed {wire['seed']}; driver "
              f"totals {wire['totals']}")
    for r in records:
        if r["kind"] == "pe_run":
            print(f"  {r['session']} {r['case']}: PE cycles {r['cycles']}, frames "
                  f"{r['frames']}, retransmissions {r['retransmissions']}, polls "
                  f"{r['polls']}, NAKs {r['naks']}, bytes {r['bytes_sent']} / "
                  f"{r['bytes_received']}")


@pytest.mark.cocotb
def test_board_runs_real_programs_bit_exact_through_line_errors():
    """Session "clean": the 1-token draft step of the real trace (HB + HOST loads, link words
    both ways), started after an abandoned session left the PE stuck mid-LOAD (part of a
    program: 4 commands, 1 of 2 HOST words, a junk LINK word); session "faults": the 1-token autoregressive step (EXT + HOST loads, link
    words out) with a flipped bit and a lost byte on the line."""
    from elmoe3d.sim.bench_board import run_board_bench
    records, result, built = run_board_bench(SMALL, seed=11)
    print(f"Verilator build of BoardTop: {built.seconds:.0f} s "
          f"({'built now' if built.built else 'reused'})")
    _report(records)
    wires = {r["session"]: r for r in records if r["kind"] == "wire"}
    assert result.failures == 0 and set(wires) == {"clean", "faults"}, \
        f"see {result.log_file}: {[w['details'] for w in wires.values()]}"
    # no memory word read and written in one cycle (undefined on the FPGA) since power-on
    assert [w["rw_collision"] for w in wires.values()] == [0, 0], \
        "a PE memory word was read and written in one cycle (undefined on the FPGA)"
    for session, n_runs in (("clean", 2), ("faults", 2)):
        layers = [r for r in records if r["kind"] == "layer" and r["session"] == session]
        runs = [r for r in records if r["kind"] == "pe_run" and r["session"] == session]
        assert layers and all(r["mismatches"] == 0 and r["comparisons"] > 0 for r in layers)
        assert len(runs) == n_runs and all(r["mismatches"] == 0 and r["cycles"] > 0
                                           for r in runs)
    clean, faults = wires["clean"]["totals"], wires["faults"]["totals"]
    # the clean session started on a board an abandoned session left waiting mid-LOAD with
    # stale CMD / HOST / LINK entries: its HELLO (a soft reset of the PE side) recovered it
    assert wires["clean"]["stuck"] == {"commands": 4, "host_words": 1, "link_words": 1,
                                       "hb_past_end": True}
    # its HB LOAD read past the stand-in: LED 6 lit, and sticky (HELLO does not clear it)
    assert not wires["clean"]["leds_before"] >> 6 & 1
    assert wires["clean"]["leds_after"] >> 6 & 1 and wires["faults"]["leds_after"] >> 6 & 1
    # a clean line: nothing NAKed (a retransmission could only come from a driver timeout,
    # which the board re-ACKs without applying the frame twice)
    assert not clean["naks"]
    # the HELLO / INFO of a session are outside the per-run byte counts
    for w in wires.values():
        assert w["bytes_to_board"] >= w["totals"]["bytes_sent"] > 0
        assert w["bytes_from_board"] >= w["totals"]["bytes_received"] > 0
    # the flipped byte is NAKed (CRC) and retransmitted; the damaged ACK is a corrupt frame
    # to the driver, which times out and retransmits: the board re-ACKs the duplicate
    # without applying it again (the outputs above are exact)
    assert len(wires["faults"]["flipped"]) == 1 and len(wires["faults"]["dropped"]) == 1
    assert faults["naks"].get("CRC", 0) + faults["naks"].get("LENGTH", 0) >= 1
    assert faults["retransmissions"] >= 2


# -- parameters ---------------------------------------------------------------------------


def test_uart_divisor():
    assert uart_divisor(25_000_000, 1_000_000) == 25
    assert uart_divisor(25_000_000, 115_200) == 217
    assert uart_divisor(25_000_000, 6_250_000) == 4
    with pytest.raises(ValueError, match="baud.*at least 4"):
        uart_divisor(25_000_000, 8_000_000)
    with pytest.raises(ValueError, match="baud.*% off"):
        uart_divisor(25_000_000, 2_700_000)          # divisor 9: 2.9 % off
    with pytest.raises(ValueError, match="clk_hz"):
        uart_divisor(0, 9600)


@pytest.mark.parametrize("kw,match", [
    ({"baud": 4_500_000}, "baud"), ({"hb_words": 100}, "hb_words"),
    ({"ext_words": 0}, "ext_words"), ({"frame_words": 0}, "frame_words"),
    ({"cmd_depth": 1}, "cmd_depth"),
])
def test_board_parameters_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        BoardTop(config=SMALL, clk_hz=25_000_000, **{"baud": 1_000_000, **kw})


def test_board_properties():
    with inspection():                      # the board and its blocks: only inspected
        top = BoardTop(config=SMALL, clk_hz=25_000_000, baud=1_000_000, hb_words=64)
        assert top.divisor == 25 and top.hb_words == 64
        assert top.bridge_params["hb_words"] == 64
        assert top.bridge.info.clk_hz == 25_000_000
        del top


def test_platform_top_on_ulx3s():
    """BoardPlatformTop elaborates on the ULX3S 85F: 25 MHz clock, divisor 25 at 1 Mbaud,
    uart 0 and the eight LEDs wired; with ``clk_hz`` through the PLL."""
    from amaranth_boards.ulx3s import ULX3S_85F_Platform
    top = BoardPlatformTop(config=SMALL, baud=1_000_000, hb_words=64, ext_words=64)
    plan = ULX3S_85F_Platform().prepare(top, name="board")
    lpf = plan.files["board.lpf"]
    assert top.top.clk_hz == 25_000_000 and top.top.divisor == 25
    assert "uart_0__rx" in lpf and "uart_0__tx" in lpf
    assert all(f"led_{i}__io" in lpf for i in range(8))
    with pytest.raises(ValueError, match="hb_words"):
        BoardPlatformTop(config=SMALL, hb_words=3)
    # from the PLL: 10 MHz, divisor 10 at 1 Mbaud, the EHXPLLL with its dividers
    top = BoardPlatformTop(config=SMALL, baud=1_000_000, hb_words=64, ext_words=64,
                           clk_hz=10_000_000)
    plan = ULX3S_85F_Platform().prepare(top, name="board")
    assert top.top.clk_hz == 10_000_000 and top.top.divisor == 10
    il = plan.files["board.il"]
    assert "EHXPLLL" in il and "CLKFB_DIV" in il
    with pytest.raises(ValueError, match="clk_hz: 12 MHz is not 25 MHz"):
        ULX3S_85F_Platform().prepare(BoardPlatformTop(config=SMALL, hb_words=64,
                                                      ext_words=64, clk_hz=12_000_000))
    with pytest.raises(ValueError, match="clk_hz: expected a positive integer"):
        BoardPlatformTop(config=SMALL, clk_hz=0)


def test_pipe_read_on_lockstep_clock():
    """PipeTransport with the bench's LockstepClock: a read's timeout runs on that clock only
    (no wall-clock wait): the reader blocks until the clock passes its end, then returns what
    arrived."""
    import threading

    from elmoe3d.sim.bench_board import LockstepClock
    from elmoe3d.sw.host.fpga import PipeTransport
    clock = LockstepClock()
    host, board = PipeTransport.pair(timeout=0.5, clock=clock)
    got = []
    th = threading.Thread(target=lambda: got.append(host.read(3)), daemon=True)
    th.start()
    clock.settle(th)
    board.write(b"ab")
    clock.advance(0.3)                       # 2 of 3 bytes, 0.3 < 0.5: still waiting
    clock.settle(th)
    assert th.is_alive() and not got
    clock.advance(0.6)
    clock.settle(th)                         # the reader returned (or, a bug, waits again)
    assert not th.is_alive() and got == [b"ab"]

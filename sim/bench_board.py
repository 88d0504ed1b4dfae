"""cocotb bench of the FPGA prototype's board top, :class:`elmoe3d.hw.board.BoardTop`, at the
pin level: a real expert program sent by the host driver through a bit-level UART model
(``docs/fpga.md``, "Board top"; issue 7).

Run through :mod:`elmoe3d.sim.runner` by :func:`run_board_bench` (never directly). The host
side is the real driver, :class:`elmoe3d.sw.host.fpga.FpgaBoard` with
:func:`elmoe3d.sw.host.fpga.run_host_fpga`, in a Python thread, talking over one end of a
:class:`elmoe3d.sw.host.fpga.PipeTransport` pair. The cocotb side serves the other end: it
serialises every byte the driver writes onto ``uart_rx`` (8N1, LSB first, ``divisor`` clock
cycles a bit, no gap between characters) and deserialises ``uart_tx`` (start bit found on the
falling edge, every bit sampled at mid-bit, a stop bit of 0 recorded as an error) into bytes
for the driver. The driver runs whole PE programs (HELLO, HB_WRITE / EXT_WRITE into the
stand-ins, CMD / HOST / LINK / EXT_STREAM frames by credits, OUT / LINK_O frames back) and
the host checks every ``o`` beat and ``link_o`` word against the functional simulation and
each group's root-PE FP32 output against ``ref_moe`` bit for bit
(:func:`elmoe3d.sw.host.pe_runs.compare_run`, :func:`~elmoe3d.sw.host.pe_runs.check_layers`).

``params.json``::

    {"arch": "small", "divisor": 4, "shape": [hidden, intermediate],
     "sessions": [{"name": "clean", "layers": [[step, layer, group], ...],
                   "faults": {"flip_rx_frame": N or null, "drop_tx_ack": K or null},
                   "timeout": driver seconds (optional),
                   "stuck": {"layers": [...], "commands": N, "host_words": H,
                             "link_words": L} (optional)}, ...],
     "timeout": driver seconds, "deadline": driver seconds}

Each session is a fresh driver (its own HELLO: the board is left in whatever state the
previous session left it, as a newly started host finds a board) on a fresh pipe. With
``stuck``, an abandoned session comes first on the same pipe (:func:`leave_stuck`: part of a
program, the PE left waiting mid-LOAD, stale entries in the FIFOs); the session's HELLO is a
soft reset of the board's PE side, so its programs must still come out bit-exact.

Simulated time only: the driver runs on a :class:`LockstepClock` (``FpgaBoard`` /
``PipeTransport`` ``clock=``): the simulator advances one character time (``STEP_BITS``
bits) at a time and only while the driver thread is blocked, then waits for it to look at
what arrived. The driver's clock counts one microsecond per UART bit (the simulated link
looks like the real board's 1 Mbaud, :data:`DRIVER_BAUD`), and ``timeout`` / ``deadline``
are in that clock's seconds (default 2 ms, i.e. 2,000 bit times, and 0.5 s). So reply
timeouts, retransmissions, POLL pauses and cycle counts depend only on the seed, not on the
machine's load (the faults session's timeout is simulated too).

The golden layer-steps are rebuilt inside the bench by :func:`golden_layers` (the real
Mixtral GSM8K routing trace, synthetic weights: the host's compiler as the RTL backend of
``elmoe3d run`` uses it), restricted to the named (step, layer, group) jobs.

Faults (per session): ``flip_rx_frame`` flips one bit of the third byte after the opening
flag (the first payload byte, unless an escape came first) of the N-th frame the host sends
in the session (counted from 1, the HELLO; a bit is chosen so that the byte does not become a
FLAG or ESC); ``drop_tx_ack`` drops the third byte of the K-th ACK frame the board sends in
the session. The driver must NAK-retransmit the first and
time out and retransmit the second (the board re-ACKs the duplicate without applying it),
and the run must still be bit-exact.

Figures in ``summary-test_board.json``: per PE run the driver's frames, retransmissions,
POLLs, NAKs per reason, wire bytes each way and the PE's STATUS cycles; per layer the
comparisons; per session the board clock cycles simulated, the bytes on the wire each way,
the wall time and the faults injected.
"""

from __future__ import annotations

import functools
import threading
import time

from ..config import FPGA_LEAN_PE, ArchConfig, preset


__all__ = ["BOARD_PARAMS", "SHAPE", "DEFAULT_SESSIONS", "build_board", "golden_layers",
           "run_board_bench", "UartLine", "bits_8n1", "leave_stuck"]

#: The BoardTop the bench builds: a 4-cycle bit (the UART's minimum) keeps the simulated wire
#: short; the stand-ins hold the largest program of the default layer-steps; the PE is the
#: FPGA-lean one the flow builds (:data:`elmoe3d.config.FPGA_LEAN_PE`: paired tile
#: products, one time-shared requant, FP32 and combine unit), so real programs check those
#: paths bit-exactly.
BOARD_PARAMS = {"clk_hz": 25_000_000, "baud": 6_250_000, "hb_words": 256, "ext_words": 512,
                "frame_words": 16, "pe_params": FPGA_LEAN_PE}
#: Synthetic expert shape (hidden, intermediate) of the bench's programs: half the host's
#: default (64, 128) in each dimension, so a program is a quarter of the wire bytes (the
#: Verilator model of the board runs about 15 k cycles/s, and every W-bit word costs
#: about 2,600 cycles on a 4-cycle-bit UART).
SHAPE = (32, 64)


def build_board(arch: ArchConfig | None = None, *, waves=None, **params):
    """Verilog + Verilator build of ``BoardTop(config=arch, **BOARD_PARAMS | params)``
    (reused when unchanged)."""
    from ..hw.board import BoardTop
    from .runner import build
    arch = arch or preset("small")
    kwargs = {**BOARD_PARAMS, **params}
    top = BoardTop(config=arch, **kwargs)
    return build(top, name=f"board_{arch.name.replace('-', '_')}", toplevel="board",
                 waves=waves, verilog_key={"BoardTop": repr(arch),
                                           "kwargs": repr(sorted(kwargs.items()))}), top


# -- the golden layer-steps ------------------------------------------------------------------

@functools.cache
def _all_golden(arch_json: str, tokens: int, layer: int, shape: tuple):
    import json
    from ..sw.host.backends.golden import trace_golden_layers
    return trace_golden_layers(ArchConfig.from_dict(json.loads(arch_json)), tokens=tokens,
                               layer=layer, shape=shape)


def golden_layers(arch: ArchConfig, jobs, *, tokens: int = 5, layer: int = 15,
                  shape=SHAPE) -> list:
    """The golden layer-steps (:class:`elmoe3d.sw.host.backends.GoldenLayer`, jobs kept) of the
    real Mixtral GSM8K routing trace (:func:`elmoe3d.sw.host.backends.golden.trace_golden_layers`:
    first ``tokens`` decode tokens of problem 0, layer ``layer``, Elastic-SD depth 2:
    autoregressive, draft and verify steps; synthetic experts of ``shape`` = (hidden,
    intermediate), weights seed 7; compiled by the host as the RTL backend of ``elmoe3d run``
    does), each restricted to the ``(step, layer, group)`` entries
    of ``jobs``. Raises ``ValueError`` naming a job that does not exist."""
    import copy
    import json
    _, layers = _all_golden(json.dumps(arch.to_dict(), sort_keys=True), tokens, layer,
                            tuple(int(v) for v in shape))
    out = []
    want = [tuple(int(v) for v in j) for j in jobs]
    for gl in layers:
        keep = [j for j in gl.jobs if (gl.step, gl.layer, j[0]) in want]
        if keep:
            part = copy.copy(gl)
            part.jobs = keep
            out.append(part)
    found = {(gl.step, gl.layer, j[0]) for gl in out for j in gl.jobs}
    for w in want:
        if w not in found:
            raise ValueError(f"jobs: no busy group {w[2]} in step {w[0]}, layer {w[1]} of the "
                             f"trace's first {tokens} tokens")
    return out


# -- cocotb side -----------------------------------------------------------------------------

try:
    import cocotb
    from cocotb.triggers import FallingEdge, Timer
except ImportError:                                      # host side without cocotb
    cocotb = None


#: The driver's time base in the bench: one UART bit (``divisor`` board cycles) is one
#: microsecond of the driver's clock, i.e. the driver sees the simulated link as a 1 Mbaud
#: one (the real board's rate), whatever the divisor, so its timeouts, pauses and deadlines
#: keep the proportions they have on the board.
DRIVER_BAUD = 1_000_000
#: Retransmissions of one frame before the driver gives up.
RETRIES = 5
#: Board cycles the simulator advances between two looks of the driver (one character).
STEP_BITS = 10


class LockstepClock:
    """A clock for the host driver (:class:`~elmoe3d.sw.host.fpga.FpgaBoard` and
    :class:`~elmoe3d.sw.host.fpga.PipeTransport`, ``clock=``) that runs on simulated time, the
    driver thread and the simulator taking turns: the simulator advances only while the
    driver is blocked (in a read or a pause, :meth:`wait`), by one step at a time
    (:meth:`advance`), and then waits until the driver has looked at what arrived and
    blocked again (:meth:`settle`). So every reply timeout, retransmission, POLL pause and
    deadline is measured in board cycles and the run depends only on its seed, not on the
    machine's load. ``clock()`` is the driver's time in seconds."""

    def __init__(self):
        self.t = 0.0
        self._cv = threading.Condition()
        self._epoch = 0
        self._blocked = -1

    def __call__(self) -> float:
        return self.t

    # driver thread
    def wait(self) -> None:
        """Block until the simulator has advanced the clock."""
        with self._cv:
            e = self._epoch
            self._blocked = e
            self._cv.notify_all()
            while self._epoch == e:
                self._cv.wait()

    def sleep(self, seconds: float) -> None:
        end = self.t + seconds
        while self.t < end:
            self.wait()

    # simulator side (blocks the simulator: that is the point)
    def settle(self, thread) -> None:
        """Return once the driver is blocked at the current time, or ``thread`` ended."""
        with self._cv:
            while self._blocked != self._epoch and thread.is_alive():
                self._cv.wait(0.01)

    def advance(self, t: float) -> None:
        with self._cv:
            self.t = t
            self._epoch += 1
            self._cv.notify_all()


def bits_8n1(byte, stop=1):
    """The line levels of one 8N1 character: start 0, eight data bits LSB first, ``stop``
    (1; 0 makes a framing error). Shared with ``tests/amaranth/test_uart.py``."""
    return [0] + [(byte >> i) & 1 for i in range(8)] + [stop]


class UartLine:
    """Bit-level UART of the bench: the host end of the board's serial pins.

    :meth:`send` drives ``uart_rx`` with the bytes the driver writes (read from ``pipe``, the
    board end of a :class:`~elmoe3d.sw.host.fpga.PipeTransport`), no gap between characters;
    :meth:`receive` decodes ``uart_tx`` and writes the bytes to ``pipe``. Faults: see the
    module docstring. Counters: ``to_board``, ``from_board`` (bytes on the wire), ``flipped``,
    ``dropped``, ``stop_errors``."""

    def __init__(self, dut, pipe, divisor, clock_ns, *, flip_rx_frame=None, drop_tx_ack=None):
        self.dut, self.pipe = dut, pipe
        self.bit_ns = divisor * clock_ns
        self.flip_rx_frame, self.drop_tx_ack = flip_rx_frame, drop_tx_ack
        self.to_board = self.from_board = 0
        self.flipped, self.dropped = [], []
        self.stop_errors = 0
        self.running = True

    async def send(self):
        from ..sw.golden.bridge import ESC, FLAG
        dut = self.dut
        dut.uart_rx.value = 1
        in_frame, frames, pos = False, 0, 0
        while self.running:
            data = self.pipe.read_nowait()
            if not data:
                await Timer(10 * self.bit_ns, "ns")
                continue
            for byte in data:
                if byte == FLAG:
                    if in_frame and pos > 0:
                        in_frame = False
                    else:
                        in_frame, pos = True, 0
                        frames += 1
                elif in_frame:
                    pos += 1
                    if frames == self.flip_rx_frame and pos == 3 and not self.flipped:
                        for bit in range(8):
                            if byte ^ (1 << bit) not in (FLAG, ESC):
                                self.flipped.append((self.to_board, byte, byte ^ (1 << bit)))
                                byte ^= 1 << bit
                                break
                self.to_board += 1
                for level in bits_8n1(byte):
                    dut.uart_rx.value = level
                    await Timer(self.bit_ns, "ns")

    async def receive(self):
        from ..sw.golden.bridge import FLAG, Type
        dut = self.dut
        half = self.bit_ns // 2
        in_frame, index, ftype, acks = False, 0, None, 0
        while True:
            await FallingEdge(dut.uart_tx)
            await Timer(half, "ns")
            if dut.uart_tx.value != 0:
                continue                                  # a glitch, not a start bit
            byte = 0
            for i in range(8):
                await Timer(self.bit_ns, "ns")
                byte |= int(dut.uart_tx.value) << i
            await Timer(self.bit_ns, "ns")
            if dut.uart_tx.value != 1:
                self.stop_errors += 1
            self.from_board += 1
            # frame tracking, for the drop fault
            if byte == FLAG:
                if in_frame and index > 0:
                    in_frame = False
                else:
                    in_frame, index, ftype = True, 0, None
            elif in_frame:
                index += 1
                if index == 1:
                    ftype = byte
                    if ftype == Type.ACK:
                        acks += 1
            if in_frame and ftype == Type.ACK and acks == self.drop_tx_ack and index == 3 \
                    and not self.dropped:
                self.dropped.append((self.from_board - 1, byte))
                continue
            self.pipe.write(bytes((byte,)))


def leave_stuck(board, arch, stuck, *, shape=SHAPE):
    """An abandoned session (a host stopped by Ctrl-C or an error mid-program): on ``board``
    (a fresh :class:`~elmoe3d.sw.host.fpga.FpgaBoard`), HELLO, then the first ``commands``
    commands of the first PE program of ``stuck["layers"]`` in one CMD frame, only
    ``host_words`` of its HOST words and ``link_words`` junk words on ``link_i``: the PE is
    left waiting in the middle of a LOAD with stale entries in the bridge's FIFOs. With
    ``hb_past_end``, the first HB LOAD among those commands is moved right after the first
    command and its ``hb_addr`` set so that it reads past the HB stand-in's end (the
    out-of-range LED, bit 6). Returns what was sent."""
    from ..sw.golden.bridge import CMD_BYTES, Type, pack_words
    from ..sw.host.fpga import split_program
    from ..sw.host.pe_runs import case_ints, pe_cases
    layers = golden_layers(arch, stuck["layers"], shape=shape)
    c = case_ints(pe_cases(layers)[0])
    info = board.hello()
    split = split_program(c["program"], c["ld"], hb_words=info.hb_words,
                          ext_words=info.ext_words)
    wb = info.word_bits
    cmds = list(split.commands[:int(stuck["commands"])])
    if stuck.get("hb_past_end"):
        from ..isa import Op, Source, decode, encode
        k = next(i for i, w in enumerate(cmds)
                 if decode(w)[0] == Op.LOAD and decode(w)[1]["src"] == Source.HB)
        op, fields = decode(cmds.pop(k))
        fields = {**fields, "hb_addr": info.hb_words - fields["words"] // 2}
        cmds.insert(1, encode(op, **fields))
    host = split.host[:int(stuck.get("host_words", 0))]
    link = [(0x5A << (wb - 8)) | k for k in range(int(stuck.get("link_words", 0)))]
    sent = {"commands": len(cmds), "host_words": len(host), "link_words": len(link),
            "hb_past_end": bool(stuck.get("hb_past_end"))}
    for type_, payload in ((Type.CMD, b"".join(int(x).to_bytes(CMD_BYTES, "little")
                                               for x in cmds)),
                           (Type.HOST, pack_words(host, wb)), (Type.LINK, pack_words(link, wb))):
        if payload and not board._send(type_, payload, f"stuck {type_.name}"):
            raise RuntimeError(f"stuck {type_.name}: NAKed BUSY")
    return sent


async def _session(dut, arch, session, *, divisor, timeout, deadline, shape):
    """One driver session (a fresh :class:`~elmoe3d.sw.host.fpga.FpgaBoard` on a fresh pipe, its
    own HELLO, the board left as the previous session left it): run the session's layer-steps
    with its faults; returns its records."""
    import traceback
    from ..sw.host.fpga import FpgaBoard, PipeTransport, run_host_fpga
    from . import cocotb_streams as streams
    name = session["name"]
    layers = golden_layers(arch, session["layers"], shape=shape)
    faults = session.get("faults") or {}
    clock = LockstepClock()
    host_end, board_end = PipeTransport.pair(clock=clock)
    line = UartLine(dut, board_end, divisor, streams.CLOCK_NS,
                    flip_rx_frame=faults.get("flip_rx_frame"),
                    drop_tx_ack=faults.get("drop_tx_ack"))
    # The driver runs on simulated time (LockstepClock): it waits for a reply ``timeout``
    # plus twice the frame's wire time at DRIVER_BAUD, in its clock's seconds
    timeout = float(session.get("timeout", timeout))
    boards = [FpgaBoard(host_end, config=arch, timeout=timeout, retries=RETRIES,
                        baud=DRIVER_BAUD, clock=clock)]
    board = boards[0]
    stuck = session.get("stuck")
    if stuck:
        boards.append(FpgaBoard(host_end, config=arch, timeout=timeout, retries=RETRIES,
                                baud=DRIVER_BAUD, clock=clock))
    result = {}

    def host():
        try:
            if stuck:
                # first an abandoned session on a driver of its own, then the session's
                # driver: its HELLO must give it a clean board
                result["stuck"] = leave_stuck(boards[1], arch, stuck, shape=shape)
            result["out"] = run_host_fpga(layers, arch, board, deadline_s=deadline)
        except Exception as exc:                         # reported in the summary
            result["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"

    dut._log.info("session %s: jobs %s, faults %s", name, session["layers"], faults)
    tasks = [cocotb.start_soon(line.send()), cocotb.start_soon(line.receive())]
    start = streams.cycle()
    leds_before = int(dut.leds.value)
    rw_before = int(dut.rw_collision.value)
    wall = time.perf_counter()
    th = threading.Thread(target=host, name=f"fpga-driver-{name}", daemon=True)
    th.start()
    step_ns = STEP_BITS * divisor * streams.CLOCK_NS
    seconds_per_cycle = 1.0 / (divisor * DRIVER_BAUD)
    while True:
        clock.settle(th)                                 # the driver looked and blocked
        if not th.is_alive():
            break
        await Timer(step_ns, "ns")
        clock.advance((streams.cycle() - start) * seconds_per_cycle)
    line.running = False
    for t in tasks:
        t.cancel()
    while line.pipe.read_nowait():                       # nothing left for the next session
        pass
    cycles = streams.cycle() - start
    wall = time.perf_counter() - wall
    records = []
    out = result.get("out")
    totals = {}
    errors = [result["error"]] if "error" in result else []
    if out is not None:
        for r in out.records:
            records.append({**r, "kind": "pe_run", "session": name})
        for lr in out.layers:
            records.append({"case": f"step {lr['step']} L{lr['layer']}", "kind": "layer",
                            "session": name, "comparisons": lr["compared"],
                            "mismatches": lr["mismatches"], "details": lr["details"],
                            "cycles": lr["cycles"]})
        totals = out.totals()
        if not out.compared:
            errors.append("nothing was compared")
    if line.stop_errors:
        errors.append(f"{line.stop_errors} characters from the board had a stop bit of 0")
    rw_collision = int(dut.rw_collision.value)
    if rw_collision and not rw_before:                   # (else an earlier session's error)
        errors.append("the PE read and wrote one word of a memory in the same cycle "
                      "(rw_collision, sticky since power-on): on the FPGA that read is "
                      "undefined")
    records.append({"case": f"wire {name}", "kind": "wire", "session": name,
                    "comparisons": 0, "mismatches": len(errors), "details": errors,
                    "board_cycles": cycles, "wall_seconds": wall,
                    "bytes_to_board": line.to_board, "bytes_from_board": line.from_board,
                    "flipped": line.flipped, "dropped": line.dropped, "totals": totals,
                    "faults": faults, "timeout": timeout,
                    "stuck": result.get("stuck"), "leds_before": leds_before,
                    "leds_after": int(dut.leds.value), "rw_collision": rw_collision})
    return records


if cocotb is not None:
    @cocotb.test()
    async def test_board(dut):
        """The driver runs the programs of each session's layer-steps through the UART
        model; every output is checked bit for bit (module docstring)."""
        from . import cocotb_streams as streams
        from .records import arch_from_params, write_summary
        from .runner import load_params, resolve_seed
        params = load_params()
        arch = arch_from_params(params)
        seed = resolve_seed()
        divisor = int(params["divisor"])
        dut._log.info("board bench: %s, divisor %d (cycles per bit), seed %d", arch.name,
                      divisor, seed)
        dut.uart_rx.value = 1                            # idle line through reset
        await streams.start(dut)
        records = []
        for session in params["sessions"]:
            records += await _session(dut, arch, session, divisor=divisor,
                                      timeout=float(params["timeout"]),
                                      deadline=float(params["deadline"]),
                                      shape=params.get("shape", SHAPE))
        for r in records:
            r.setdefault("seed", seed)
            r.setdefault("divisor", divisor)
        write_summary("test_board", records)
        bad = [r for r in records if r["mismatches"]]
        assert not bad, "; ".join(f"{r['case']}: {r['details'][:2]}" for r in bad)


# -- host side -------------------------------------------------------------------------------

#: Default sessions: "clean", the 1-token draft step 2 of layer 15, group 1 (both PEs: HB and
#: HOST loads, link words both ways), after an abandoned session (:func:`leave_stuck`: the
#: first 4 commands of its first program, CLEAR and three LOADs -- its HB LOAD moved second
#: and reading past the HB stand-in's end, which lights the sticky LED 6 -- with 1 of the 2
#: HOST words the two HOST LOADs need, and a junk LINK word: the PE waits mid-LOAD) that its
#: HELLO must clear; "faults", the 1-token autoregressive step 0, group 0
#: (its root PE: EXT and HOST loads, 102 EXT words; the other PE: psums on link_o) with one
#: bit flipped in the host's 9th frame (after the HELLO and the seven EXT_WRITEs: the first
#: command / data frame) and the board's 10th ACK damaged (its third byte dropped), both on
#: small frames, so the retransmissions cost little simulated time. No 1-token step has all three sources in one program
#: (a draft step reads HB only, an autoregressive one EXT only); together they use every
#: stand-in.
DEFAULT_SESSIONS = [
    {"name": "clean", "layers": [[2, 15, 1]], "faults": {},
      "stuck": {"layers": [[2, 15, 1]], "commands": 4, "host_words": 1, "link_words": 1,
               "hb_past_end": True}},
    {"name": "faults", "layers": [[0, 15, 0]],
     "faults": {"flip_rx_frame": 9, "drop_tx_ack": 10}},
]


def run_board_bench(arch: ArchConfig | None = None, *, sessions=None, seed=None,
                    shape=SHAPE, timeout: float = 0.002, deadline: float = 0.5, waves=None,
                    run_name="bench_board"):
    """Build (or reuse) the board and run :func:`test_board` with ``sessions`` (default
    :data:`DEFAULT_SESSIONS`: ``[{"name", "layers": [[step, layer, group]], "faults"}]``);
    returns ``(records, result, built)``: the summary records (``kind`` ``pe_run`` /
    ``layer`` / ``wire``, each with its ``session``), the runner's
    :class:`~elmoe3d.sim.runner.SimResult` (not checked: the caller judges the records) and
    the :class:`~elmoe3d.sim.runner.Build`."""
    from .records import arch_param, read_records
    from .runner import run
    arch = arch or preset("small")
    built, top = build_board(arch, waves=waves)
    params = {"arch": arch_param(arch), "divisor": top.divisor,
              "sessions": sessions or DEFAULT_SESSIONS, "shape": list(shape),
              "timeout": timeout, "deadline": deadline}
    result = run(built, test_module=__name__, testcase="test_board", params=params, seed=seed,
                 run_name=run_name, check=False)
    return read_records(result), result, built

"""The FPGA host driver (elmoe3d.sw.host.fpga) against the protocol's golden board (BridgeModel),
served over a real pty pair (the driver opens the slave by its path with pyserial) and over
PipeTransport. Behind the bridge, a Python board: a load-router model consuming the FIFOs at
random (HB / EXT words from the stand-ins, EXT descriptors in order) and the PE's functional
simulation (sw.golden.pe) executing each command as it arrives. Checked: every stream delivered
exactly (what the board applied vs the program's split, the ld stream the router rebuilt vs
the program's), retransmissions under injected faults, the output checks, the errors (no
board, no port, another configuration), and `elmoe3d run --backend fpga` end to end on real
compiled programs, bit-exact against the functional simulation and ref_moe.

No test depends on the machine's speed: the board is served in the driver's own thread, one
turn each time the driver waits (a StepClock), so every reply timeout, retransmission, pause
and deadline counts turns (1 ms of driver time each), never wall-clock seconds."""

import copy
import functools
import os
import random
import select
import tty

import pytest

from elmoe3d.cli import main
from elmoe3d.config import pe_config, preset
from elmoe3d.isa import Op, Source, Target, decode, encode
from elmoe3d.sw.golden import pe as fsim
from elmoe3d.sw.golden.asm import ProgramError
from elmoe3d.sw.golden.bridge import BridgeModel, Reason, Type
from elmoe3d.sw.host.fpga import (WIRE_MARGIN, BoardError, FpgaBoard, PipeTransport, StepClock,
                             run_host_fpga, split_program, wire_bytes)

SMALL = preset("small")
W = SMALL.pe.word_bits
SEED = 20250607


# -- the Python board ------------------------------------------------------------------------

class RouterPE:
    """The board behind the bridge: the load router (commands in order; each LOAD's words from
    its source: the HOST FIFO, the HB stand-in at ``hb_addr``, the EXT stand-in through the
    descriptors in order) and the PE (``execute``: sw.golden.pe, one command at a time, its outputs
    pushed as OUT / LINK_O frames). Takes at most a few entries per :meth:`step`, at random."""

    def __init__(self, m: BridgeModel, rng, *, execute=True, rate=0.6, tamper=None):
        self.m, self.rng, self.rate, self.execute = m, rng, rate, execute
        self.pe = pe_config(SMALL)
        self.state = fsim.PEState.reset(self.pe)
        self.cmds, self.ld, self.link = [], [], []
        self.link_pos = 0
        self.cur = None          # (word, op, fields, words gathered)
        self.ext_cur = None      # [addr, words left]
        self.tamper = tamper     # output filter (frame bytes -> frame bytes or None)
        self.drop_out = None     # index of an output frame to lose
        self.outs = 0

    def _out(self, frame):
        self.outs += 1
        if self.drop_out == self.outs - 1:
            return []
        return [frame]

    def step(self) -> list:
        m, rng = self.m, self.rng
        if m.link and rng.random() < self.rate:
            for _ in range(rng.randint(1, len(m.link))):
                self.link.append(m.link.popleft())
        if self.cur is None:
            if not m.cmd or rng.random() > self.rate:
                return []
            word = m.cmd.popleft()
            op, f = decode(word)
            self.cmds.append(word)
            self.cur = (word, op, f, [])
        word, op, f, got = self.cur
        if op == Op.LOAD:
            for _ in range(rng.randint(0, 4)):
                if len(got) == f["words"]:
                    break
                src = Source(f["src"])
                if src == Source.HOST:
                    if not m.host:
                        break
                    got.append(m.host.popleft())
                elif src == Source.HB:
                    got.append(m.hb_mem[f["hb_addr"] + len(got)])
                else:
                    if self.ext_cur is None:
                        if not m.ext:
                            break
                        self.ext_cur = list(m.ext.popleft())
                    got.append(m.ext_mem[self.ext_cur[0]])
                    self.ext_cur[0] += 1
                    self.ext_cur[1] -= 1
                    if not self.ext_cur[1]:
                        self.ext_cur = None
            if len(got) < f["words"]:
                return []
            self.ld += got
        if not self.execute:
            self.cur = None
            return []
        state = self.state
        if op == Op.RECV or (op == Op.GEMM and f["psum_in"]):
            state = copy.deepcopy(state)          # may need link words not yet here
        try:
            res = fsim.run([word], got, self.link[self.link_pos:], config=SMALL, state=state)
        except ProgramError as exc:
            if "link_i" in str(exc) and state is not self.state:
                return []
            raise
        self.state = res.state
        self.link_pos += res.link_i_used
        self.cur = None
        out = []
        for b in res.o:
            fr = m.push_o(int(b.kind), int(b.data))
            if self.tamper:
                fr = self.tamper(fr)
            out += self._out(fr)
        for w in res.link_o:
            out += self._out(m.push_link_o(int(w)))
        return out


class Server:
    """Serves ``model`` (+ ``pe``) on a byte channel, one turn per :meth:`serve` (the
    driver's StepClock calls it each time the driver waits): what arrived goes to the
    bridge, its replies out, then one step of the board behind it. ``flip``: stream offset
    of a host -> board byte whose bit 0 is flipped; ``drop_ack``: index of an ACK reply to
    lose."""

    def __init__(self, model, pe, read, write, *, flip=None, drop_ack=None):
        self.m, self.pe, self.read, self.write = model, pe, read, write
        self.flip, self.drop_ack = flip, drop_ack
        self.rx = self.acks = self.turns = 0

    def serve(self):
        self.turns += 1
        data = self.read()
        if data and self.flip is not None and self.rx <= self.flip < self.rx + len(data):
            b = bytearray(data)
            b[self.flip - self.rx] ^= 1
            data = bytes(b)
        self.rx += len(data)
        for r in self.m.receive(data):
            if r[1] == Type.ACK:
                self.acks += 1
                if self.acks - 1 == self.drop_ack:
                    continue
            self.write(r)
        for fr in (self.pe.step() if self.pe else []):
            self.write(fr)


def small_model(cls=BridgeModel, **kw):
    args = dict(word_bits=W, frame_words=8, hb_words=512, ext_words=1024, cmd_depth=4,
                host_depth=8, link_depth=8, ext_depth=2, rows=2, lanes=4)
    args.update(kw)
    return cls(**args)


def pipe_server(m, pe, **kw):
    """``(host end, server)``: a PipeTransport pair on a StepClock whose turns serve the
    board end."""
    clock = StepClock()
    host, board = PipeTransport.pair(timeout=0.05, clock=clock)
    server = Server(m, pe, board.read_nowait, board.write, **kw)
    clock.serve = server.serve
    return host, server


#: Seconds a pty read waits for data (:class:`Pty`).
PTY_WAIT = 0.001


class Pty:
    """A pty pair in raw mode: the driver opens ``path`` with pyserial; the server uses the
    master fd. A pty hands a write to the other end through a kernel worker, not at once
    (usually within a few polls, but up to about 10 ms seen on a loaded machine), so a read
    that finds nothing waits up to :data:`PTY_WAIT` seconds: a turn of the test's
    :class:`StepClock` with nothing arriving then stands for real time, and the driver's
    timeout of thousands of turns cannot run out while a frame is in the kernel."""

    def __init__(self):
        self.master, self.slave = os.openpty()
        tty.setraw(self.master)
        tty.setraw(self.slave)
        self.path = os.ttyname(self.slave)

    def read(self):
        r, _, _ = select.select([self.master], [], [], PTY_WAIT)
        return os.read(self.master, 65536) if r else b""

    def write(self, data):
        view = memoryview(data)
        while view:
            n = os.write(self.master, view)
            view = view[n:]

    def close(self):
        os.close(self.master)
        os.close(self.slave)


def random_program(rng, n=40):
    """LOADs of random sources and sizes (ACT target, in range) between BARRIERs."""
    cmds, ld = [], []
    for _ in range(n):
        if rng.random() < 0.75:
            k = rng.randint(1, 20)
            cmds.append(encode(Op.LOAD, target=Target.ACT, addr=0, words=k,
                               src=rng.choice(list(Source)), hb_addr=rng.randrange(1 << 20)))
            ld += [rng.getrandbits(W) for _ in range(k)]
        else:
            cmds.append(encode(Op.BARRIER))
    # a repeated HB load shares its stand-in words
    cmds.append(encode(Op.LOAD, target=Target.ACT, words=3, src=Source.HB, hb_addr=7))
    cmds.append(encode(Op.LOAD, target=Target.ACT, words=3, src=Source.HB, hb_addr=7))
    ld += [5, 6, 7] * 2
    return cmds, ld


def drained(server, turns=100_000):
    """Serve until the Python board has taken every entry (the program has no outputs to
    wait for); fails after ``turns`` turns."""
    m, pe = server.m, server.pe
    for _ in range(turns):
        if not (m.cmd or m.host or m.link or m.ext or pe.cur):
            return
        server.serve()
    pytest.fail(f"the board did not drain in {turns} turns")


def check_delivered(m, pe, cmds, ld, link):
    sp = split_program(cmds, ld)
    assert m.applied["cmd"] == sp.commands and pe.cmds == sp.commands
    assert m.applied["host"] == sp.host
    assert m.applied["ext"] == sp.ext_stream
    assert m.applied["link"] == link
    assert pe.ld == ld                        # what the router rebuilt from the three sources
    assert pe.link == link


# -- the splitter ----------------------------------------------------------------------------

def test_split_program():
    rng = random.Random(SEED)
    cmds, ld = random_program(rng)
    sp = split_program(cmds, ld)
    # rebuild ld from the split, LOAD by LOAD
    hb = {a + i: w for a, ws in sp.hb_writes for i, w in enumerate(ws)}
    ext = {a + i: w for a, ws in sp.ext_writes for i, w in enumerate(ws)}
    host, descs, out = iter(sp.host), iter(sp.ext_stream), []
    for orig, new in zip(cmds, sp.commands):
        op, f = decode(new)
        o_op, o_f = decode(orig)
        assert {k: v for k, v in f.items() if k != "hb_addr"} == \
            {k: v for k, v in o_f.items() if k != "hb_addr"}
        if op != Op.LOAD:
            continue
        if f["src"] == Source.HOST:
            assert f["hb_addr"] == o_f["hb_addr"]
            out += [next(host) for _ in range(f["words"])]
        elif f["src"] == Source.HB:
            out += [hb[f["hb_addr"] + i] for i in range(f["words"])]
        else:
            a, n = next(descs)
            assert n == f["words"]
            out += [ext[a + i] for i in range(n)]
    assert out == ld
    # the repeated HB load: both LOADs point at one place, its words written once
    (_, a), (_, b) = decode(sp.commands[-2]), decode(sp.commands[-1])
    assert a["hb_addr"] == b["hb_addr"]
    assert [ws for _, ws in sp.hb_writes].count([5, 6, 7]) == 1
    assert (a["hb_addr"], [5, 6, 7]) in sp.hb_writes
    assert sp.hb_used == sum(len(ws) for _, ws in sp.hb_writes)
    with pytest.raises(BoardError, match=r"expert X needs \d+ HB stand-in words; the board "
                                         r"has 10"):
        split_program(cmds, ld, hb_words=10, name="expert X")
    with pytest.raises(ValueError, match="the LOADs take"):
        split_program(cmds, ld + [1])
    with pytest.raises(ValueError, match=r"ld has 0 words, but command \d+ \(LOAD\) needs"):
        split_program(cmds, ld[:0])


@pytest.mark.parametrize("clock", ["wall", "step"])
def test_pipe_transport(clock):
    """Reads on the wall clock (real use; the bytes are there or never come, so the time a
    read takes changes no outcome) and on a StepClock: a read's timeout counts turns, and the
    other end's turn can bring the bytes."""
    step = StepClock() if clock == "step" else None
    a, b = PipeTransport.pair(timeout=0.01)
    if step:
        b = PipeTransport(b._rx, b._tx, timeout=0.01, clock=step)
    a.write(b"abc")
    assert b.in_waiting == 3
    assert b.read(5) == b"abc"                    # fewer bytes on timeout
    assert b.read(1) == b""
    if step:
        assert step.waits == 20                   # two timeouts of 10 turns
        step.serve = lambda: a.write(b"d") if step.waits == 23 else None
        assert b.read(1) == b"d" and step.waits == 24
        step.serve = None
        with pytest.raises(ValueError, match="tick: expected seconds > 0"):
            StepClock(tick=0)
    b.write(b"xyz")
    assert a.read_nowait(2) == b"xy" and a.read(1) == b"z"
    a.write(b"1")
    b.reset_input_buffer()
    assert b.in_waiting == 0
    a.close()
    with pytest.raises(OSError):
        b.write(b"q")


# -- streams, credits, faults ----------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_streams_exact_with_random_room(seed):
    rng = random.Random(SEED + seed)
    print(f"seed {SEED + seed}")
    cmds, ld = random_program(rng)
    link = [rng.getrandbits(W) for _ in range(30)]
    m = small_model(cmd_depth=rng.randint(1, 6), host_depth=rng.randint(1, 12),
                    link_depth=rng.randint(1, 12), ext_depth=rng.randint(1, 3),
                    frame_words=rng.choice([1, 3, 8]))
    pe = RouterPE(m, rng, execute=False, rate=rng.choice([0.1, 0.5, 1.0]))
    host, server = pipe_server(m, pe)
    board = FpgaBoard(host, timeout=5)      # nothing is lost: a long timeout costs nothing
    info = board.hello()
    assert info.frame_words == m.frame_words
    run = board.run_program(cmds, ld, link, n_o=0, n_link=0, deadline_s=30)
    drained(server)
    assert run.errors == [] and run.retransmissions == 0 and run.naks == {}
    check_delivered(m, pe, cmds, ld, link)
    assert run.bytes_sent > len(ld) * W // 8 and run.frames > 0


class BusyOnce(BridgeModel):
    """Answers the 3rd and 9th HOST frames that would be accepted with NAK BUSY."""

    busy = (3, 9)
    seen = 0

    def handle(self, frame):
        if frame.type == Type.HOST and frame.seq == self.expect and len(frame.payload):
            self.seen += 1
            if self.seen in self.busy:
                return self._nak(frame.seq, Reason.BUSY)
        return super().handle(frame)


class UnknownSeqOnce(BridgeModel):
    """Answers the 2nd HOST frame with a NAK LENGTH of seq 0xFF (a framing error before its
    seq), applying nothing."""

    seen = 0

    def handle(self, frame):
        if frame.type == Type.HOST and frame.seq == self.expect:
            self.seen += 1
            if self.seen == 2:
                return self._nak(0xFF, Reason.LENGTH)
        return super().handle(frame)


class LateBusy(BridgeModel):
    """NAKs the first HOST frame it would accept with BUSY (applying nothing) but holds that
    reply back until the next frame arrives: by then the host has timed out and retransmitted,
    and that copy is applied and ACKed. The BUSY the host then reads answers its first copy."""

    held = None
    done = False

    def handle(self, frame):
        late, self.held = self.held, None
        if frame.type == Type.HOST and frame.seq == self.expect and not self.done:
            self.done = True
            self.held = self._nak(frame.seq, Reason.BUSY)
            return late
        reply = super().handle(frame)
        return reply if late is None else late + reply

    def receive(self, data):
        return [r for r in super().receive(data) if r is not None]


def test_late_busy_after_a_retransmission_keeps_the_seq():
    """A BUSY that arrives after the frame was retransmitted may answer a copy the board then
    applied: the driver resends the same bytes (ACKed as a duplicate) instead of moving the
    seq to another stream, whose frame the stale ACK would otherwise seem to answer."""
    m = small_model(LateBusy)
    cmds = [encode(Op.LOAD, target=Target.ACT, addr=0, words=2, src=Source.HOST, hb_addr=0)]
    host, server = pipe_server(m, None)
    board = FpgaBoard(host, timeout=0.05)
    board.hello()
    run = board.run_program(cmds, [11, 22], [33, 44], n_o=0, n_link=0, deadline_s=30)
    assert m.done and m.held is None
    assert m.applied == {"cmd": cmds, "host": [11, 22], "link": [33, 44], "ext": []}
    assert run.retransmissions >= 2 and run.naks == {"BUSY": 1} and run.errors == []


@pytest.mark.parametrize("fault", ["flip", "lost_ack", "busy", "unknown_seq"])
def test_faults_retransmitted_and_still_exact(fault):
    rng = random.Random(SEED)
    cmds, ld = random_program(rng)
    link = [rng.getrandbits(W) for _ in range(20)]
    m = small_model({"busy": BusyOnce, "unknown_seq": UnknownSeqOnce}.get(fault, BridgeModel))
    pe = RouterPE(m, rng, execute=False)
    host, server = pipe_server(m, pe, flip=3000 if fault == "flip" else None,
                               drop_ack=6 if fault == "lost_ack" else None)
    # a flipped bit may hit a flag and a lost ACK is only noticed by its timeout: short;
    # BUSY and the unknown-seq NAK are answered at once: long (no spurious timeouts)
    board = FpgaBoard(host, timeout=0.1 if fault in ("flip", "lost_ack") else 5)
    board.hello()
    run = board.run_program(cmds, ld, link, n_o=0, n_link=0, deadline_s=30)
    drained(server)
    check_delivered(m, pe, cmds, ld, link)
    if fault == "flip":
        assert run.retransmissions == 1 and run.naks == {"CRC": 1} == \
            {k.name: v for k, v in m.naks.items() if v}
    elif fault == "lost_ack":            # noticed by its reply timeout alone
        assert run.retransmissions == 1 and run.naks == {}
    elif fault == "busy":
        assert run.naks == {"BUSY": 2} and run.retransmissions == 0
    else:       # taken as the reply to the frame in flight: retransmitted at once
        assert run.naks == {"LENGTH": 1} and run.retransmissions == 1


# -- real programs over a pty; outputs ---------------------------------------------------------

@functools.cache
def golden_layers():
    from elmoe3d.sw.host.backends.golden import trace_golden_layers
    return trace_golden_layers(SMALL, tokens=3)[1]


def test_real_programs_over_a_pty_bit_exact():
    """Every PE program of 4 layer-steps (HOST, HB and EXT loads, link words both ways) run
    on the Python board through a pty, checked like the RTL backend."""
    layers = golden_layers()
    rng = random.Random(SEED)
    m = small_model()
    pe = RouterPE(m, rng)
    p = Pty()
    try:
        clock = StepClock(Server(m, pe, p.read, p.write).serve)
        with FpgaBoard.open(p.path, baud=115200, config=SMALL, timeout=5,
                            clock=clock) as board:
            out = run_host_fpga(layers, SMALL, board)
    finally:
        p.close()
    assert out.compared > 0 and out.mismatches == 0, [r["details"] for r in out.layers]
    assert len(out.records) == sum(job.pes for gl in layers for _, job, _, _ in gl.jobs)
    assert all(r["mismatches"] == 0 and r["o_data"] for r in out.records
               if r["key"][3] == 0)
    tot = out.totals()
    assert tot["retransmissions"] == 0 and tot["bytes_sent"] > 0
    # the Python board is honest: a flipped DATA bit on the board is caught
    def flip_data(frame):
        from elmoe3d.sw.golden.bridge import Deframer, encode_frame
        (f,) = Deframer().feed(frame)
        if f.type != Type.OUT or f.payload[0] != 0:
            return frame
        return encode_frame(f.type, f.seq, f.payload[:5] + bytes((f.payload[5] ^ 4,))
                            + f.payload[6:])
    m = small_model()
    host, server = pipe_server(m, RouterPE(m, rng, tamper=flip_data))
    bad = run_host_fpga(layers[:1], SMALL, FpgaBoard(host, config=SMALL, timeout=5))
    assert bad.mismatches > 0


def test_stuck_board_stops_at_the_first_program():
    """A board that takes nothing (no PE behind the bridge): the first program misses its
    deadline and the run stops there, naming it, instead of waiting on every later one.

    The deadline counts the driver's turns, not seconds: a board slowed by 2 ms of
    wall-clock time per turn (a loaded machine) gives the very same run, turn for turn (this
    test once failed on a loaded machine: its wall-clock deadline passed before the board
    took one command)."""
    import re
    import time

    from elmoe3d.sw.host.pe_runs import pe_cases
    layers = golden_layers()[:1]
    first = pe_cases(layers)[0]["name"]

    def stuck(load):
        m = small_model()
        host, server = pipe_server(m, None)

        def loaded():
            time.sleep(load)                      # wall-clock time the driver must not see
            server.serve()
        host.clock.serve = loaded
        done = []
        board = FpgaBoard(host, config=SMALL, timeout=5)
        with pytest.raises(BoardError, match=rf"^pipe:host: {re.escape(first)}: deadline "
                                             rf"passed with .* within its 0.2 s; stopped "
                                             rf"there, [1-9]\d* later PE run\(s\) not "
                                             rf"tried") as e:
            run_host_fpga(layers, SMALL, board, deadline_s=0.2, progress=done.append)
        assert done == [] and len(m.applied["cmd"]) == m.depths["cmd"]
        return str(e.value), server.turns, board._stats.frames, board._stats.polls

    fast = stuck(0.0)
    assert fast[1] >= 200                         # the 0.2 s deadline: 200 turns of 1 ms
    assert stuck(0.002) == fast


def test_deadline_scales_with_the_wire_time():
    rng = random.Random(SEED)
    cmds, ld = random_program(rng)
    link = [rng.getrandbits(W) for _ in range(20)]
    m = small_model(cmd_depth=64, host_depth=64, link_depth=64, ext_depth=8)
    pe = RouterPE(m, rng, execute=False, rate=1.0)
    host, server = pipe_server(m, pe)
    board = FpgaBoard(host, timeout=5, baud=20_000)   # a slow line: seconds of wire time
    board.hello()
    est = wire_bytes(split_program(cmds, ld), len(link), 0, 0, word_bits=W,
                     frame_words=m.frame_words)
    assert board.deadline(est, 1.5) == 1.5 + WIRE_MARGIN * est * 10 / 20_000
    # a base of 0 s: the wire-time share alone carries the program through
    run = board.run_program(cmds, ld, link, n_o=0, n_link=0, deadline_s=0)
    drained(server)
    with pytest.raises(ValueError, match="deadline_s"):
        board.run_program(cmds, ld, link, n_o=0, n_link=0, deadline_s=-1)
    assert run.errors == [] and run.deadline_s == board.deadline(est, 0)
    check_delivered(m, pe, cmds, ld, link)
    # the estimate is the traffic of a run with room for most frames (+ stuffing, POLLs)
    assert 0.95 * est <= run.bytes_sent + run.bytes_received <= 1.25 * est
    assert FpgaBoard(host).deadline(est, 2.0) == 2.0              # baud unknown: the base


def test_lost_output_frame_raises():
    layers = golden_layers()
    m = small_model()
    pe = RouterPE(m, random.Random(SEED))
    pe.drop_out = 3
    host, server = pipe_server(m, pe)
    with pytest.raises(BoardError, match=r"output frame (OUT|LINK_O) carries output "
                                         r"number 4, expected 3: 1 output frame\(s\) lost"):
        run_host_fpga(layers[:1], SMALL, FpgaBoard(host, config=SMALL, timeout=5))


# -- errors ------------------------------------------------------------------------------------

def test_no_board_answers():
    p = Pty()
    clock = StepClock()
    try:
        board = FpgaBoard.open(p.path, baud=57600, timeout=0.05, retries=2, clock=clock)
        with pytest.raises(BoardError) as e:
            board.hello()
        board.close()
    finally:
        p.close()
    # three tries of 0.05 s plus twice the HELLO's wire time, in 1 ms turns
    assert 150 <= clock.waits <= 160
    assert str(e.value) == (f"no board answered on {p.path} within 0.15 s at 57600 baud (is "
                            f"the board programmed with `make fpga`, is {p.path} its UART, and "
                            f"was its bitstream built for 57600 baud (--baud)?)")
    host, _board = PipeTransport.pair(timeout=0.01, clock=StepClock())
    with pytest.raises(BoardError, match=r"^no board answered on pipe:host within 0.02 s \(is "
                                         r"the board programmed with `make fpga`, is pipe:host "
                                         r"its UART\?\)$"):
        FpgaBoard(host, timeout=0.02, retries=0).hello()
    # a URL (no exclusive lock there) opens too; its echo is no board (on the wall clock, as
    # in real use: there is no board to wait for, so no outcome depends on the time taken)
    with FpgaBoard.open("loop://", baud=9600, timeout=0.02, retries=0) as board:
        with pytest.raises(BoardError, match="no board answered on loop://"):
            board.hello()


class CrcAlways(BridgeModel):
    """Every HOST frame arrives with a bad CRC (a line that garbles long frames)."""

    def handle(self, frame):
        if frame.type == Type.HOST:
            return self._nak(frame.seq, Reason.CRC)
        return super().handle(frame)


def test_line_errors_named_after_the_retries():
    m = small_model(CrcAlways)
    cmds = [encode(Op.LOAD, target=Target.ACT, addr=0, words=2, src=Source.HOST, hb_addr=0)]
    host, server = pipe_server(m, None)
    board = FpgaBoard(host, timeout=5, retries=2)
    board.hello()
    with pytest.raises(BoardError, match=r"^pipe:host: the board NAKed HOST of P entries "
                                         r"0..1 \(seq 2\) with CRC 3 times in 3 tries: "
                                         r"line errors\? try a lower --baud"):
        board.run_program(cmds, [1, 2], n_o=0, n_link=0, name="P")
    assert m.naks[Reason.CRC] == 3 and m.applied["host"] == []


class Unplugged(PipeTransport):
    """A pipe end whose write (or read) fails like pyserial's when the USB adapter is pulled,
    after ``ok`` successful writes."""

    def __init__(self, end, *, ok, on):
        super().__init__(end._rx, end._tx, timeout=end.timeout, name="/dev/ttyUSB9",
                         clock=end.clock)
        self.ok, self.on = ok, on

    def _fail(self, what):
        if self.ok <= 0 and self.on == what:
            import serial
            raise serial.SerialException("device reports readiness to read but returned no "
                                         "data (device disconnected or multiple access on "
                                         "port?)")

    def write(self, data):
        self._fail("write")
        self.ok -= 1
        return super().write(data)

    def read(self, size=1):
        self._fail("read")
        return super().read(size)


@pytest.mark.parametrize("on", ["write", "read"])
def test_io_error_names_the_port(on):
    m = small_model()
    end, server = pipe_server(m, None)
    host = Unplugged(end, ok=2, on=on)           # HELLO and the first CMD frame go out
    cmds = [encode(Op.BARRIER)] * 40
    board = FpgaBoard(host, timeout=5)
    board.hello()
    with pytest.raises(BoardError, match=r"^/dev/ttyUSB9: serial I/O failed: device "
                                         r"reports .* \(was the board unplugged"):
        board.run_program(cmds, [], n_o=0, n_link=0)
    if on == "write":
        assert m.applied["cmd"] == cmds[:4]      # the first frame (4 free CMD entries) only


def test_device_path_opened_exclusively():
    p = Pty()
    try:
        with FpgaBoard.open(p.path, baud=115200, timeout=0.05):
            with pytest.raises(BoardError, match=f"^cannot open serial port {p.path}: .*lock"):
                FpgaBoard.open(p.path, baud=115200, timeout=0.05)
        FpgaBoard.open(p.path, baud=115200, timeout=0.05).close()   # free again
    finally:
        p.close()


def test_bad_port_and_other_config():
    with pytest.raises(BoardError, match=r"^cannot open serial port /nonexistent/tty0: .*") \
            as e:
        FpgaBoard.open("/nonexistent/tty0")
    assert "\n" not in str(e.value)
    assert str(e.value).count("[Errno") == 1          # pyserial's text has it twice
    m = small_model(lanes=2, word_bits=256)
    host, server = pipe_server(m, None)
    with pytest.raises(BoardError, match="has a 2x2 tile with 256-bit words; the programs "
                                         "are compiled for a 2x4 tile with 512-bit words"):
        FpgaBoard(host, config=SMALL, timeout=5).hello()
    with pytest.raises(ValueError, match="timeout"):
        FpgaBoard(host, timeout=0)


BASE = ("run", "--trace", "gsm8k", "--model", "mixtral-8x7b", "--config", "small",
        "--tokens", "3", "--layers", "15", "--depth", "2")


def test_cli_fpga_backend(capsys, tmp_path, monkeypatch):
    from elmoe3d.cli import run as run_cmd
    assert main([*BASE, "--backend", "fpga"]) == 2
    assert "--backend fpga: needs --port PORT" in capsys.readouterr().err
    assert main([*BASE, "--backend", "golden", "--port", "/dev/ttyUSB0"]) == 2
    assert "--port: only with --backend fpga (got --backend golden)" in \
        capsys.readouterr().err
    assert main([*BASE, "--backend", "perf", "--deadline", "5"]) == 2
    assert "--deadline: only with --backend fpga (got --backend perf)" in \
        capsys.readouterr().err
    assert main([*BASE, "--backend", "fpga", "--port", "/nonexistent/tty0", "--deadline",
                 "0"]) == 2
    assert "--deadline 0: expected seconds > 0" in capsys.readouterr().err
    assert main([*BASE, "--backend", "fpga", "--port", "/nonexistent/tty0"]) == 2
    err = capsys.readouterr().err
    assert "cannot open serial port /nonexistent/tty0" in err and "Traceback" not in err
    # end to end over a pty, on the Python board; the progress bars' ticks counted
    ticks = {}
    real_execute = run_cmd.execute

    def counted(args, *, progress_factory=None):
        def factory(total, description):
            tick = progress_factory(total, description)
            ticks[description] = [total, 0]

            def advance(x):
                ticks[description][1] += 1
                tick(x)
            return advance
        return real_execute(args, progress_factory=factory)
    monkeypatch.setattr(run_cmd, "execute", counted)
    m = small_model(baud=1_000_000)
    p = Pty()
    clock = StepClock(Server(m, RouterPE(m, random.Random(SEED)), p.read, p.write).serve)
    real_open = FpgaBoard.open.__func__
    monkeypatch.setattr(FpgaBoard, "open", classmethod(
        lambda cls, port, **kw: real_open(cls, port, clock=clock, **kw)))
    try:
        code = main([*BASE, "--backend", "fpga", "--port", p.path, "--deadline", "30",
                     "--json", str(tmp_path / "r.json")])
    finally:
        p.close()
    out = capsys.readouterr().out
    assert code == 0, out
    assert "0 mismatches" in out and "FPGA on" in out
    import json
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["board"]["word_bits"] == W and doc["board"]["info_baud"] == 1_000_000
    assert doc["board"]["baud"] == 1_000_000 and doc["board"]["deadline_base_s"] == 30
    assert ticks["fpga depth 2: PE runs"] == [14, 14]
    run = doc["runs"][0]
    assert run["fpga"]["pe_runs"] == 14 and run["summary"]["mismatches"] == 0
    assert run["summary"]["compared"] > 0


def test_cli_fpga_backend_gpt_oss(tmp_path, capsys, monkeypatch):
    """Another preset than the real traces' (GPT-OSS-20B, top-4 of 32, on a synthetic trace)
    runs on the FPGA backend end to end, on the Python board: bit-exact."""
    from elmoe3d.sw.host.tracegen import CALIBRATED, synthetic_trace
    trace = synthetic_trace("gpt-oss-20b", CALIBRATED["olmoe-1b-7b"], tokens=3, seed=1)
    path = trace.save(tmp_path / "gpt-oss.npz")
    m = small_model(baud=1_000_000)
    host, server = pipe_server(m, RouterPE(m, random.Random(SEED)))
    monkeypatch.setattr(FpgaBoard, "open", classmethod(
        lambda cls, port, **kw: cls(host, port=port, **kw)))
    code = main(["run", "--trace", str(path), "--config", "small", "--layers", "3",
                 "--depth", "2", "--backend", "fpga", "--port", "pipe"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gpt-oss-20b" in out and "0 mismatches" in out and "FPGA on pipe" in out

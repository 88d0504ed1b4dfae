"""hw.bridge.Bridge alone at the byte-stream level (Amaranth simulator) against the protocol's
golden model, :class:`elmoe3d.sw.golden.bridge.BridgeModel`: every reply byte for byte, every OUT /
LINK_O frame byte for byte, and the entries each target received (CMD / HOST / LINK FIFOs, the
EXT_STREAM queue, the HB / EXT stand-in writes) equal to what the model applied -- nothing from
a NAKed frame. Corner frames (every type, the largest payload, FLAG / ESC bytes in the
payload, bad CRC, too long, too short, a dangling escape, wrong length, unknown type,
duplicate and wrong seq, BUSY, ADDR, HELLO resetting seq) and random frame sequences
(hypothesis, derandomized), with idle cycles on rx and backpressure on tx; HELLO's soft reset
(FIFOs emptied, INFO credits full, the output counter restarted as the INFO leaves, under a
continuous output stream); the FIFO ports drained by StreamSinks while frames arrive (entries
exact, credits bounded by the model's and the depth); the HOST FIFO's word rate."""

from __future__ import annotations

import random
import struct
from collections import deque

import pytest
from amaranth.sim import Simulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmoe3d.config import preset
from elmoe3d.hw.bridge import Bridge
from elmoe3d.sim.amaranth_streams import StreamSink
from elmoe3d.sim.traffic import SMOOTH, STALLS
from elmoe3d.sw.golden.bridge import (CREDIT_BYTES, ESC, FLAG, BridgeModel, Credits, Deframer,
                               FrameError, Info, Reason, Type, crc16, encode_frame, pack_words,
                               stuff)

SMALL = preset("small")
W = SMALL.pe.word_bits
WB = W // 8
PARAMS = dict(frame_words=3, cmd_depth=6, host_depth=5, link_depth=4, ext_depth=2,
              hb_words=16, ext_words=8, clk_hz=25_000_000, baud=1_000_000)


def make(**over):
    p = {**PARAMS, **over}
    return Bridge(config=SMALL, rx_fifo_bytes=8, **p), make_model(**over)


def make_model(**over):
    p = {**PARAMS, **over}
    return BridgeModel(word_bits=W, frame_words=p["frame_words"], hb_words=p["hb_words"],
                        ext_words=p["ext_words"], cmd_depth=p["cmd_depth"],
                        host_depth=p["host_depth"], link_depth=p["link_depth"],
                        ext_depth=p["ext_depth"], rows=SMALL.pe.rows, lanes=SMALL.pe.lanes,
                        clk_hz=p["clk_hz"], baud=p["baud"])


def split_frames(raw: bytes, *, complete: bool = True) -> list:
    """Wire bytes -> one bytes object per frame (FLAG .. FLAG), as the bridge sends them.
    ``complete``: all the bridge sent (asserted: every frame opens with FLAG and the last one
    is closed); otherwise what it has sent so far (a frame still being sent is left out)."""
    frames, cur = [], None
    for b in raw:
        if cur is None:
            assert not complete or b == FLAG, f"byte 0x{b:02x} outside a frame"
            cur = bytearray((b,))
        else:
            cur.append(b)
            if b == FLAG:
                frames.append(bytes(cur))
                cur = None
    assert not complete or cur is None, "the bridge stopped in the middle of a frame"
    return frames


def frame_type(frame: bytes) -> int:
    return frame[1] ^ 0x20 if frame[1] == ESC else frame[1]


class Run:
    """Runs a scenario on a Bridge and the model side by side.

    Ops: ``("frame", wire_bytes)`` -- send, wait for the model's replies and for the bridge
    to go idle; ``("drain", target, k)`` -- pop ``k`` entries of ``target`` (cmd, host,
    link, ext) from both; ``("o", kind, data)`` / ``("link_o", word)`` -- queue a PE output
    (sent whenever the bridge takes it); ``("settle",)`` -- wait until every queued output was
    sent.

    HELLO's soft reset (``soft_reset``, one cycle as the INFO leaves): the queued outputs not
    yet taken are dropped (the PE is reset on the board), and the model's output counter is
    set to 0 when the INFO frame has left (the model restarts it as it answers the HELLO,
    which is earlier than the bridge: the output frame being sent then keeps the old
    numbering).

    ``drain_stall`` (None: entries leave only by ``drain`` ops): the CMD / HOST / LINK /
    EXT_STREAM ports are drained all the time by :class:`StreamSink` s (not ready with that
    probability; stream rule checked), also while frames are being received and copied; each
    entry taken is compared with the model's next one, which the model then pops too. The
    model then judges each frame with at most the room the bridge has (it pops later), so
    replies are compared with their credits cut off, and each reply's credits must satisfy
    model <= got <= depth. The scenario must not send a frame the model would NAK BUSY."""

    TARGETS = ("cmd", "host", "link", "ext")

    def __init__(self, bridge, model, *, seed=0, idle=0.0, stall=0.0, drain_stall=None):
        self.bridge, self.model = bridge, model
        self.rng = random.Random(seed)
        print(f"traffic seed {seed}")
        self.idle, self.stall = idle, stall
        self.drain_stall = drain_stall
        self.tx = bytearray()
        self.popped = {t: [] for t in self.TARGETS}
        self.model_popped = {t: [] for t in self.TARGETS}
        self.hb_writes, self.ext_writes = [], []
        self.want_replies = []
        self.want_outs = []                  # the model's OUT / LINK_O frames, in hw order
        self.dropped_outputs = 0             # queued outputs dropped by a soft reset
        self.soft_resets = []                # cycles of the soft-reset pulse
        self.pop_cycles = {t: [] for t in self.TARGETS}
        self.cycles = 0

    def port(self, target):
        b = self.bridge
        return {"cmd": b.cmd, "host": b.host, "link": b.link, "ext": b.ext_desc}[target]

    def run(self, ops, max_cycles=400_000):
        b = self.bridge
        rng = self.rng
        ops = list(ops)
        concurrent = self.drain_stall is not None
        sinks = {}
        if concurrent:
            srng = random.Random(rng.random())
            sinks = {t: StreamSink(self.port(t), srng, self.drain_stall, t)
                     for t in self.TARGETS}
        shadow = {t: deque() for t in self.TARGETS}   # entries the bridge still holds
        tx_sink = StreamSink(b.tx, rng, self.stall, "tx")

        def value_of(t, ctx):
            p = self.port(t)
            if t == "cmd":
                return ctx.get(p.payload.as_value())
            v = ctx.get(p.payload)
            if t == "ext":
                return (v["addr"], v["words"])
            return v

        async def bench(ctx):
            rxq = []
            oq, lq = [], []
            to_pop = {t: 0 for t in self.TARGETS}
            op_i = 0
            waiting = None
            rx_valid = False
            cycle = 0
            cur = None                               # the tx frame being received
            while True:
                # -- next op when the previous is done --
                if waiting is None and op_i < len(ops):
                    op = ops[op_i]
                    op_i += 1
                    if op[0] == "frame":
                        rxq.extend(op[1])
                        before = {t: len(self.model.applied[t]) for t in self.TARGETS}
                        out_seq = self.model.out_seq
                        resets = self.model.hello_resets
                        self.want_replies.extend(self.model.receive(op[1]))
                        if self.model.hello_resets != resets:
                            self.model.out_seq = out_seq   # restarted when the INFO leaves
                        for t in self.TARGETS:
                            shadow[t].extend(self.model.applied[t][before[t]:])
                        waiting = "frame"
                    elif op[0] == "drain":
                        assert not concurrent
                        _, target, k = op
                        fifo = self.model.fifo(target)
                        k = min(k, len(fifo))
                        self.model_popped[target].extend(fifo.popleft() for _ in range(k))
                        to_pop[target] = k
                        waiting = "drain"
                    elif op[0] == "o":
                        oq.append((op[1], op[2]))
                    elif op[0] == "link_o":
                        lq.append(op[1])
                    elif op[0] == "settle":
                        waiting = "settle"
                # -- drive inputs --
                if not rx_valid and rxq:
                    rx_valid = rng.random() >= self.idle
                ctx.set(b.rx.valid, rx_valid)
                if rx_valid:
                    ctx.set(b.rx.payload, rxq[0])
                tx_sink.drive(ctx)
                ctx.set(b.o.valid, bool(oq))
                if oq:
                    ctx.set(b.o.payload.kind, oq[0][0])
                    ctx.set(b.o.payload.data, oq[0][1])
                ctx.set(b.link_o.valid, bool(lq))
                if lq:
                    ctx.set(b.link_o.payload, lq[0])
                for t in self.TARGETS:
                    if concurrent:
                        sinks[t].drive(ctx)
                    else:
                        ctx.set(self.port(t).ready, to_pop[t] > 0)
                # -- sample --
                if rx_valid and ctx.get(b.rx.ready):
                    rxq.pop(0)
                    rx_valid = False
                n_tx = len(tx_sink.got)
                tx_sink.sample(ctx, cycle)
                if len(tx_sink.got) > n_tx:
                    byte = tx_sink.got[-1]
                    self.tx.append(byte)
                    if cur is None:
                        cur = bytearray((byte,))
                    else:
                        cur.append(byte)
                        if byte == FLAG:
                            if frame_type(bytes(cur)) == Type.INFO:
                                self.model.out_seq = 0
                            cur = None
                # the model numbers an output when the bridge takes it
                if oq and ctx.get(b.o.ready):
                    self.want_outs.append(self.model.push_o(*oq.pop(0)))
                if lq and ctx.get(b.link_o.ready):
                    self.want_outs.append(self.model.push_link_o(lq.pop(0)))
                for t in self.TARGETS:
                    p = self.port(t)
                    if concurrent:
                        n = len(sinks[t].got)
                        sinks[t].sample(ctx, cycle)
                        taken = len(sinks[t].got) > n
                        if taken:
                            v = value_of(t, ctx)
                    else:
                        taken = bool(to_pop[t] and ctx.get(p.valid))
                        if taken:
                            v = value_of(t, ctx)
                            to_pop[t] -= 1
                    if taken:
                        self.popped[t].append(v)
                        self.pop_cycles[t].append(cycle)
                        if concurrent:
                            assert shadow[t], f"cycle {cycle}: {t}: an entry never applied"
                            self.model_popped[t].append(shadow[t].popleft())
                            mf = self.model.fifo(t)
                            if len(mf) > len(shadow[t]):
                                mf.popleft()
                for wr, log in ((b.hb_write, self.hb_writes), (b.ext_write, self.ext_writes)):
                    if ctx.get(wr.en):
                        log.append((ctx.get(wr.addr), ctx.get(wr.lane), ctx.get(wr.data)))
                if ctx.get(b.soft_reset):
                    # the PE is reset with the queues: its outputs not yet taken are lost
                    self.soft_resets.append(cycle)
                    self.dropped_outputs += len(oq) + len(lq)
                    oq.clear()
                    lq.clear()
                    for t in self.TARGETS:
                        shadow[t].clear()
                        if concurrent:
                            sinks[t].held = None
                busy = ctx.get(b.busy)
                # -- op completion --
                if waiting == "frame":
                    n_rep = sum(1 for f in split_frames(self.tx, complete=False)
                                if frame_type(f) in (Type.ACK, Type.NAK, Type.INFO))
                    if not rxq and not rx_valid and n_rep >= len(self.want_replies) \
                            and not busy:
                        waiting = None
                elif waiting == "drain":
                    if not any(to_pop.values()):
                        waiting = None
                elif waiting == "settle":
                    if not oq and not lq and not busy:
                        waiting = None
                if waiting is None and op_i == len(ops) and not oq and not lq and not busy \
                        and not (concurrent and any(shadow.values())):
                    break
                await ctx.tick()
                cycle += 1
                assert cycle < max_cycles, f"timeout at op {op_i}: {ops[op_i - 1][0]}"
            for _ in range(20):                       # nothing more comes out
                ctx.set(b.tx.ready, 1)
                assert not ctx.get(b.tx.valid), "unexpected tx bytes after the scenario"
                await ctx.tick()
            self.cycles = cycle

        sim = Simulator(b)
        sim.add_clock(1e-8)
        sim.add_testbench(bench)
        sim.run()
        return self

    # -- comparisons --
    def check(self):
        frames = split_frames(bytes(self.tx))
        replies = [f for f in frames if frame_type(f) in (Type.ACK, Type.NAK, Type.INFO)]
        if self.drain_stall is None:
            assert replies == self.want_replies
        else:
            assert len(replies) == len(self.want_replies)
            for k, (got, want) in enumerate(zip(replies, self.want_replies)):
                got_f, want_f = unframe(got), unframe(want)
                n = len(want_f.payload) - CREDIT_BYTES
                assert (got_f.type, got_f.seq, got_f.payload[:n]) == \
                    (want_f.type, want_f.seq, want_f.payload[:n]), f"reply {k}"
                g = Credits.unpack(got_f.payload[n:])
                w = Credits.unpack(want_f.payload[n:])
                for t in self.TARGETS:
                    assert getattr(w, t) <= getattr(g, t) <= self.model.depths[t], \
                        f"reply {k}: {t} credits {getattr(g, t)}, model {getattr(w, t)}"
        outs = [f for f in frames if frame_type(f) in (Type.OUT, Type.LINK_O)]
        assert outs == self.want_outs
        assert len(frames) == len(replies) + len(outs)
        # everything applied, and only that: drain the rest of both
        for t in self.TARGETS:
            assert self.popped[t] == self.model_popped[t], t
        assert words_written(self.hb_writes) == self.model.hb_mem
        assert words_written(self.ext_writes) == self.model.ext_mem
        return frames


def unframe(frame: bytes):
    """One wire frame (FLAG .. FLAG) -> :class:`~elmoe3d.sw.golden.bridge.Frame`."""
    (item,) = Deframer().feed(frame)
    assert not isinstance(item, FrameError), item
    return item


def words_written(log) -> dict:
    """Stand-in byte writes ``(addr, lane, byte)`` -> ``{addr: word}``; every word must have
    been written lane 0 .. W/8 - 1 in consecutive writes."""
    assert len(log) % WB == 0, "a partial word was written"
    mem = {}
    for i in range(0, len(log), WB):
        part = log[i:i + WB]
        assert [lane for _, lane, _ in part] == list(range(WB)), "lanes out of order"
        assert len({a for a, _, _ in part}) == 1, "a word's bytes at two addresses"
        mem[part[0][0]] = int.from_bytes(bytes(d for _, _, d in part), "little")
    return mem


def drain_all():
    return [("drain", t, 1 << 16) for t in Run.TARGETS]


def words(rng, n):
    return [rng.getrandbits(W) for _ in range(n)]


def fr(type_, seq, payload=b""):
    return ("frame", encode_frame(type_, seq, payload))


def raw_body(body: bytes):
    """A frame from an explicit body (CRC as given)."""
    return ("frame", bytes((FLAG,)) + stuff(body) + bytes((FLAG,)))


def with_crc(type_, seq, payload=b""):
    body = bytes((type_, seq)) + payload
    return body + struct.pack("<H", crc16(body))


def cmd_bytes(rng, n):
    return b"".join(rng.getrandbits(128).to_bytes(16, "little") for _ in range(n))


def addr_words(addr, ws):
    return struct.pack("<I", addr) + pack_words(ws, W)


# ------------------------------------------------------------------------------------------


def test_every_type_and_corners():
    rng = random.Random(1)
    print("seed 1")
    bridge, model = make()
    fw = PARAMS["frame_words"]
    esc_word = int.from_bytes(bytes([FLAG, ESC] * (WB // 2)), "little")
    ops = [
        fr(Type.HELLO, 0),
        fr(Type.POLL, 77),
        fr(Type.CMD, 1, cmd_bytes(rng, 3)),
        fr(Type.HOST, 2, pack_words(words(rng, fw), W)),            # largest payload
        fr(Type.LINK, 3, pack_words([esc_word, FLAG, ESC << (W - 8)], W)),  # FLAG/ESC bytes
        fr(Type.HB_WRITE, 4, addr_words(13, words(rng, 3))),       # ends at the last word
        fr(Type.EXT_WRITE, 5, addr_words(0, [esc_word])),
        fr(Type.EXT_STREAM, 6, struct.pack("<II", 3, 5)),
        fr(Type.EXT_STREAM, 7, struct.pack("<II", 0, 8)),
        fr(Type.EXT_STREAM, 8, struct.pack("<II", 1, 1)),            # BUSY: queue of 2
        fr(Type.CMD, 8, cmd_bytes(rng, 4)),                          # BUSY: 3 of 6 used
        fr(Type.CMD, 8, cmd_bytes(rng, 3)),                          # fills it
        fr(Type.CMD, 8, cmd_bytes(rng, 1)),                          # duplicate: ACK, not applied
        fr(Type.CMD, 9, cmd_bytes(rng, 1)),                          # BUSY (full)
        ("drain", "cmd", 2), ("drain", "ext", 1),
        fr(Type.CMD, 9, cmd_bytes(rng, 2)),
        fr(Type.HB_WRITE, 10, addr_words(14, words(rng, 3))),      # ADDR
        fr(Type.EXT_WRITE, 10, addr_words(0xFFFFFFFF, words(rng, 1))),  # ADDR, no wrap
        fr(Type.EXT_STREAM, 10, struct.pack("<II", 2, 7)),          # ADDR
        fr(Type.EXT_STREAM, 10, struct.pack("<II", 2, 0)),          # LENGTH: words 0
        fr(Type.HOST, 10, b"\x01" * (WB + 1)),                      # LENGTH: not whole
        fr(Type.HOST, 10, b""),                                     # LENGTH: empty
        fr(Type.LINK, 10, pack_words(words(rng, fw + 1), W)),       # framing: too long
        fr(Type.CMD, 10, b"\x00" * 8),                               # LENGTH
        fr(Type.POLL, 3, b"\x00"),                                  # LENGTH (POLL not empty)
        fr(0x09, 10, b"abc"),                                       # TYPE
        fr(Type.ACK, 10),                                           # TYPE (board->host type)
        fr(Type.HOST, 12, pack_words(words(rng, 1), W)),            # SEQ
        fr(Type.HOST, 200, pack_words(words(rng, 1), W)),           # SEQ
        raw_body(with_crc(Type.HOST, 10, pack_words(words(rng, 1), W))[:-1] + b"\x00"),  # CRC
        raw_body(b"\x03\x0a\x01"),                                  # too short: LENGTH seq 10
        raw_body(b"\x03"),                                          # too short: seq 0xFF
        ("frame", bytes((FLAG, FLAG, FLAG))),                        # empty frames: ignored
        ("frame", bytes((FLAG, 0x03, 0x0A, ESC, FLAG))),              # dangling escape
        ("frame", bytes((FLAG, ESC, FLAG))),                          # dangling escape, seq ?
        fr(Type.HOST, 10, pack_words(words(rng, 2), W)),
        fr(Type.HELLO, 250),                                        # resets expect to 251
        fr(Type.LINK, 10, pack_words(words(rng, 1), W)),            # SEQ now
        fr(Type.LINK, 250, pack_words(words(rng, 1), W)),           # duplicate of HELLO's seq
        fr(Type.LINK, 251, pack_words(words(rng, 2), W)),
        fr(Type.HELLO, 255, b"x"),                                  # LENGTH: no reset
        fr(Type.LINK, 252, pack_words(words(rng, 1), W)),
        fr(Type.LINK, 253, pack_words(words(rng, 1), W)),           # BUSY (link depth 4)
        ("o", 0, rng.getrandbits(W)), ("o", 1, esc_word), ("link_o", rng.getrandbits(W)),
        ("settle",),
        fr(Type.HELLO, 255),                                        # expect wraps to 0
        fr(Type.HOST, 0, pack_words(words(rng, 1), W)),
        ("o", 0, rng.getrandbits(W)), ("settle",),                  # out seq restarted
        *drain_all(),
        fr(Type.POLL, 1),                                           # credits all free again
    ]
    run = Run(bridge, model, seed=1).run(ops)
    frames = run.check()
    naks = {r: n for r, n in model.naks.items() if n}
    # every reason exercised
    assert set(naks) == set(Reason), naks
    assert model.applied["cmd"] and model.applied["host"] and model.applied["link"]
    assert model.applied["ext"] == [(3, 5), (0, 8)]
    assert len(model.hb_mem) == 3 and len(model.ext_mem) == 1
    assert any(frame_type(f) == Type.INFO for f in frames)


@pytest.mark.parametrize("idle,stall", [(0.0, 0.0), (0.5, 0.6)])
def test_outputs_interleave_with_replies(idle, stall):
    """OUT and LINK_O frames queued while frames arrive: replies and outputs share tx at
    frame boundaries, outputs numbered in the order sent, every reply still as the model
    says."""
    rng = random.Random(2)
    print("seed 2")
    bridge, model = make()
    ops = [fr(Type.HELLO, 0)]
    for k in range(5):
        ops.append(("o", k & 1, rng.getrandbits(W)))
        ops.append(("link_o", rng.getrandbits(W)))
    ops += [fr(Type.POLL, 0), fr(Type.HOST, 1, pack_words(words(rng, 2), W)),
            ("o", 0, rng.getrandbits(W)), fr(Type.CMD, 2, cmd_bytes(rng, 2)), ("settle",),
            *drain_all()]
    run = Run(bridge, model, seed=3, idle=idle, stall=stall).run(ops)
    frames = run.check()
    kinds = [frame_type(f) for f in frames]
    assert kinds.count(Type.OUT) == 6 and kinds.count(Type.LINK_O) == 5
    # the two output streams alternate while both wait
    first = [k for k in kinds if k in (Type.OUT, Type.LINK_O)][:4]
    assert first in ([Type.OUT, Type.LINK_O] * 2, [Type.LINK_O, Type.OUT] * 2)


def test_largest_frame_config_and_status():
    """frame_words = 16 (the default): a full HB_WRITE and a full CMD frame; nak_seen sticks
    after a NAK."""
    rng = random.Random(4)
    print("seed 4")
    bridge, model = make(frame_words=16, hb_words=16, cmd_depth=64)
    ops = [fr(Type.HELLO, 9), fr(Type.HB_WRITE, 10, addr_words(0, words(rng, 16))),
           fr(Type.CMD, 11, cmd_bytes(rng, 64)),
           fr(Type.HB_WRITE, 12, addr_words(1, words(rng, 16))), *drain_all()]
    run = Run(bridge, model, seed=4).run(ops)
    run.check()
    assert model.naks[Reason.ADDR] == 1 and len(model.applied["cmd"]) == 64


@pytest.mark.parametrize("seed,stall", [(6, 0.0), (7, 0.5), (8, 0.3)])
def test_hello_soft_reset_with_output_stream(seed, stall):
    """HELLO while the FIFOs hold entries and a continuous ``o`` / ``link_o`` stream is being
    sent: the INFO's credits are the full depths, nothing queued before the HELLO comes out
    of the FIFOs afterwards, one soft-reset pulse, the outputs not yet taken are dropped (the
    PE is reset), and the output counter restarts with the INFO: every output frame before
    it keeps the old numbering, the first after it is number 0 (the model's counter is reset
    when the INFO leaves, so an output numbered 0 ahead of the INFO would not match)."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    bridge, model = make()
    ops = [fr(Type.HELLO, 0), fr(Type.CMD, 1, cmd_bytes(rng, 2)),
           fr(Type.HOST, 2, pack_words(words(rng, 3), W)),
           fr(Type.LINK, 3, pack_words(words(rng, 2), W)),
           fr(Type.EXT_STREAM, 4, struct.pack("<II", 1, 2)),
           ("o", 0, rng.getrandbits(W)), ("o", 1, rng.getrandbits(W)),
           ("link_o", rng.getrandbits(W))]
    ops += [("o", k & 1, rng.getrandbits(W)) for k in range(12)]
    ops += [("link_o", rng.getrandbits(W)) for _ in range(4)]
    ops += [fr(Type.HELLO, 40),                                  # while outputs stream out
            ("o", 1, rng.getrandbits(W)), ("link_o", rng.getrandbits(W)), ("settle",),
            fr(Type.HOST, 41, pack_words(words(rng, 1), W)), *drain_all(), fr(Type.POLL, 0)]
    run = Run(bridge, model, seed=seed, stall=stall).run(ops)
    frames = run.check()
    infos = [k for k, f in enumerate(frames) if frame_type(f) == Type.INFO]
    assert len(infos) == 2 and len(run.soft_resets) == 2
    info = Info.unpack(unframe(frames[infos[1]]).payload)
    assert info.credits == bridge.info.credits                   # full although not drained
    # nothing applied before the second HELLO came out; the HOST word after it did
    assert run.popped["cmd"] == [] and run.popped["link"] == [] and run.popped["ext"] == []
    assert run.popped["host"] == model.applied["host"][-1:]
    outs = [(k, unframe(f)) for k, f in enumerate(frames) if frame_type(f) in
            (Type.OUT, Type.LINK_O)]
    before = [f.seq for k, f in outs if k < infos[1]]
    after = [f.seq for k, f in outs if k > infos[1]]
    assert before == list(range(len(before))) and after == [0, 1]
    assert before and run.dropped_outputs > 0                    # the stream was cut


@pytest.mark.parametrize("seed,stall,drain", [(9, 0.0, 0.0), (10, 0.4, 0.5), (11, 0.2, 0.8)])
def test_entries_drained_while_frames_arrive(seed, stall, drain):
    """The CMD / HOST / LINK / EXT_STREAM ports drained all the time (random stalls, stream
    rule checked), also while frames are received, checked and copied: every entry equal to
    the model's, in order; each reply's credits between the model's (which pops no earlier
    than the bridge) and the depth. The frames are sized by the model's credits, as the
    driver does, plus one HELLO in the middle (its INFO credits full)."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    bridge, model = make()
    scratch = make_model()
    ops = []

    def add(op):                     # the scratch model drains after every frame
        ops.append(op)
        scratch.receive(op[1])
        for t in Run.TARGETS:
            scratch.fifo(t).clear()

    add(fr(Type.HELLO, 0))
    for k in range(24):
        if k == 12:
            add(fr(Type.HELLO, 99))
            continue
        seq = scratch.expect
        t = rng.choice([Type.CMD, Type.HOST, Type.LINK, Type.EXT_STREAM, Type.HB_WRITE])
        if t == Type.CMD:
            payload = cmd_bytes(rng, rng.randint(1, 2))
        elif t in (Type.HOST, Type.LINK):
            payload = pack_words(words(rng, rng.randint(1, 2)), W)
        elif t == Type.HB_WRITE:
            payload = addr_words(rng.randint(0, 10), words(rng, 2))
        else:
            payload = struct.pack("<II", rng.randint(0, 4), rng.randint(1, 4))
        add(fr(t, seq, payload))
    # at most 2 entries a frame against depths of 2 (EXT queue: 1 a frame) and more: with the
    # sinks draining, no frame meets a full FIFO (asserted: no BUSY, so the seqs hold)
    run = Run(bridge, model, seed=seed, stall=stall, drain_stall=drain).run(ops)
    run.check()
    assert not model.naks[Reason.BUSY]
    for t in Run.TARGETS:
        assert run.popped[t], t
    assert len(run.soft_resets) == 2


def test_word_fifo_rate():
    """A HOST / LINK FIFO drained with ``ready`` high delivers one word every W/8 + 2 cycles
    (the next fetch starts as the word on offer is taken)."""
    rng = random.Random(12)
    print("seed 12")
    bridge, model = make(host_depth=5)
    ops = [fr(Type.HELLO, 0), fr(Type.HOST, 1, pack_words(words(rng, 3), W)),
           fr(Type.HOST, 2, pack_words(words(rng, 2), W)), ("drain", "host", 5)]
    run = Run(bridge, model, seed=12).run(ops)
    run.check()
    c = run.pop_cycles["host"]
    assert [b - a for a, b in zip(c, c[1:])] == [WB + 2] * 4


# -- random sequences ----------------------------------------------------------------------

@settings(max_examples=12, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["good", "good", "good", "good", "bad_crc",
                                           "bad_seq", "dup", "wrong_len", "type", "hello",
                                           "poll", "drain", "out", "junk"]),
                          st.integers(1, 7), st.integers(0, 2 ** 32 - 1)),
                min_size=4, max_size=14),
       st.booleans())
def test_random_sequences(script, traffic):
    """Random frame sequences; a scratch model run while the script is written supplies the
    seq the board expects, so good frames keep being accepted after a NAK (the run's own
    model judges every frame)."""
    bridge, model = make()
    scratch = make_model()
    ops = []

    def add(op):
        ops.append(op)
        if op[0] == "frame":
            scratch.receive(op[1])
        elif op[0] == "drain":
            fifo = scratch.fifo(op[1])
            for _ in range(min(op[2], len(fifo))):
                fifo.popleft()

    add(fr(Type.HELLO, 255))
    for what, t, r in script:
        rng = random.Random(r)
        print(f"seed {r}")
        seq = scratch.expect
        n = rng.randint(1, PARAMS["frame_words"])
        if t == Type.CMD:
            payload = cmd_bytes(rng, rng.randint(1, 4))
        elif t in (Type.HOST, Type.LINK):
            payload = pack_words(words(rng, n), W)
        elif t in (Type.HB_WRITE, Type.EXT_WRITE):
            depth = PARAMS["hb_words"] if t == Type.HB_WRITE else PARAMS["ext_words"]
            payload = addr_words(rng.randint(0, depth), words(rng, n))
        elif t == Type.EXT_STREAM:
            payload = struct.pack("<II", rng.randint(0, 8), rng.randint(0, 9))
        else:
            payload = b""
        if what == "good":
            add(fr(t, seq, payload))
        elif what == "bad_crc":
            body = bytearray(with_crc(t, seq, payload))
            body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
            add(raw_body(bytes(body)))
        elif what == "bad_seq":
            add(fr(t, (seq + rng.randint(1, 254)) % 256, payload))
        elif what == "dup":
            add(fr(t, (seq - 1) % 256, payload))
        elif what == "wrong_len":
            add(fr(t, seq, payload + b"\x5a"))
        elif what == "type":
            add(fr(rng.choice([0, 9, 0x7E, 0x7D, 0x84, 0xFF]), seq, payload))
        elif what == "hello":
            add(fr(Type.HELLO, rng.randrange(256)))
        elif what == "poll":
            add(fr(Type.POLL, rng.randrange(256)))
        elif what == "drain":
            add(("drain", Run.TARGETS[t % 4], rng.randint(1, 4)))
        elif what == "out":
            ops.extend([("o", r & 1, rng.getrandbits(W)), ("link_o", rng.getrandbits(W)),
                        ("settle",)])
        else:
            add(("frame", bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 9)))
                 + bytes((FLAG,))))
    ops += drain_all()
    flow = STALLS if traffic else SMOOTH
    run = Run(bridge, model, seed=5, idle=flow.idle, stall=flow.backpressure).run(ops)
    run.check()
    assert model.replies == scratch.replies


@pytest.mark.parametrize("kw,match", [
    ({"frame_words": 0}, "frame_words"), ({"cmd_depth": 1}, "cmd_depth"),
    ({"host_depth": 70000}, "host_depth"), ({"ext_depth": 0}, "ext_depth"),
    ({"rx_fifo_bytes": 1}, "rx_fifo_bytes"), ({"hb_words": 0}, "hb_words"),
    ({"baud": 0}, "baud"), ({"clk_hz": 2 ** 32}, "clk_hz"), ({"ext_words": 1.5}, "ext_words"),
])
def test_parameters_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        Bridge(config=SMALL, **kw)


def test_config_type_checked():
    with pytest.raises(TypeError):
        Bridge(config="small")

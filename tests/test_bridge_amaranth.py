"""hw.bridge.Bridge alone at the byte-stream level (Amaranth simulator) against the protocol's
golden model, :class:`elmoe3d.sw.bridge.BridgeModel`: every reply byte for byte, every OUT /
LINK_O frame byte for byte, and the entries each target received (CMD / HOST / LINK FIFOs, the
EXT_STREAM queue, the HB / EXT stand-in writes) equal to what the model applied -- nothing from
a NAKed frame. Corner frames (every type, the largest payload, FLAG / ESC bytes in the
payload, bad CRC, too long, too short, a dangling escape, wrong length, unknown type,
duplicate and wrong seq, BUSY, ADDR, HELLO resetting seq) and random frame sequences
(hypothesis, derandomized), with idle cycles on rx and backpressure on tx."""

from __future__ import annotations

import random
import struct

import pytest
from amaranth.sim import Simulator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmoe3d.config import preset
from elmoe3d.hw.bridge import Bridge
from elmoe3d.sw.bridge import (ESC, FLAG, BridgeModel, Reason, Type, crc16, encode_frame,
                               pack_words, stuff)

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


def split_frames(raw: bytes) -> list:
    """Wire bytes -> one bytes object per frame (FLAG .. FLAG), as the bridge sends them."""
    frames, cur = [], None
    for b in raw:
        if cur is None:
            assert b == FLAG, f"byte 0x{b:02x} outside a frame"
            cur = bytearray((b,))
        else:
            cur.append(b)
            if b == FLAG:
                frames.append(bytes(cur))
                cur = None
    assert cur is None, "the bridge stopped in the middle of a frame"
    return frames


def frame_type(frame: bytes) -> int:
    return frame[1] ^ 0x20 if frame[1] == ESC else frame[1]


class Run:
    """Runs a scenario on a Bridge and the model side by side.

    Ops: ``("frame", wire_bytes)`` -- send, wait for the model's replies and for the bridge
    to go idle; ``("drain", target, k)`` -- pop ``k`` entries of ``target`` (cmd, host,
    link, ext) from both; ``("o", kind, data)`` / ``("link_o", word)`` -- queue a PE output
    (sent whenever the bridge takes it); ``("settle",)`` -- wait until every queued output was
    sent."""

    TARGETS = ("cmd", "host", "link", "ext")

    def __init__(self, bridge, model, *, seed=0, idle=0.0, stall=0.0):
        self.bridge, self.model = bridge, model
        self.rng = random.Random(seed)
        self.idle, self.stall = idle, stall
        self.tx = bytearray()
        self.popped = {t: [] for t in self.TARGETS}
        self.model_popped = {t: [] for t in self.TARGETS}
        self.hb_writes, self.ext_writes = [], []
        self.want_replies = []
        self.want_outs = []                  # the model's OUT / LINK_O frames, in hw order
        self.cycles = 0

    def port(self, target):
        b = self.bridge
        return {"cmd": b.cmd, "host": b.host, "link": b.link, "ext": b.ext_desc}[target]

    def run(self, ops, max_cycles=400_000):
        b = self.bridge
        rng = self.rng
        ops = list(ops)

        async def bench(ctx):
            rxq = []
            oq, lq = [], []
            to_pop = {t: 0 for t in self.TARGETS}
            op_i = 0
            waiting = None
            rx_valid = False
            cycle = 0
            while True:
                # -- next op when the previous is done --
                if waiting is None and op_i < len(ops):
                    op = ops[op_i]
                    op_i += 1
                    if op[0] == "frame":
                        rxq.extend(op[1])
                        self.want_replies.extend(self.model.receive(op[1]))
                        waiting = "frame"
                    elif op[0] == "drain":
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
                tx_ready = rng.random() >= self.stall
                ctx.set(b.tx.ready, tx_ready)
                ctx.set(b.o.valid, bool(oq))
                if oq:
                    ctx.set(b.o.payload.kind, oq[0][0])
                    ctx.set(b.o.payload.data, oq[0][1])
                ctx.set(b.link_o.valid, bool(lq))
                if lq:
                    ctx.set(b.link_o.payload, lq[0])
                for t in self.TARGETS:
                    ctx.set(self.port(t).ready, to_pop[t] > 0)
                # -- sample --
                if rx_valid and ctx.get(b.rx.ready):
                    rxq.pop(0)
                    rx_valid = False
                if tx_ready and ctx.get(b.tx.valid):
                    self.tx.append(ctx.get(b.tx.payload))
                # the model numbers an output when the bridge takes it (after the frames
                # fed so far: the scenarios settle outputs before a HELLO)
                if oq and ctx.get(b.o.ready):
                    self.want_outs.append(self.model.push_o(*oq.pop(0)))
                if lq and ctx.get(b.link_o.ready):
                    self.want_outs.append(self.model.push_link_o(lq.pop(0)))
                for t in self.TARGETS:
                    p = self.port(t)
                    if to_pop[t] and ctx.get(p.valid):
                        v = ctx.get(p.payload)
                        if t == "cmd":
                            v = ctx.get(p.payload.as_value())
                        elif t == "ext":
                            v = (v["addr"], v["words"])
                        self.popped[t].append(v)
                        to_pop[t] -= 1
                for wr, log in ((b.hb_write, self.hb_writes), (b.ext_write, self.ext_writes)):
                    if ctx.get(wr.en):
                        log.append((ctx.get(wr.addr), ctx.get(wr.lane), ctx.get(wr.data)))
                busy = ctx.get(b.busy)
                # -- op completion --
                if waiting == "frame":
                    n_rep = sum(1 for f in split_frames_partial(self.tx)
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
                if waiting is None and op_i == len(ops) and not oq and not lq and not busy:
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
        assert replies == self.want_replies
        outs = [f for f in frames if frame_type(f) in (Type.OUT, Type.LINK_O)]
        assert outs == self.want_outs
        assert len(frames) == len(replies) + len(outs)
        # everything applied, and only that: drain the rest of both
        for t in self.TARGETS:
            assert self.popped[t] == self.model_popped[t], t
        assert words_written(self.hb_writes) == self.model.hb_mem
        assert words_written(self.ext_writes) == self.model.ext_mem
        return frames


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


def split_frames_partial(raw):
    frames, cur = [], None
    for b in raw:
        if cur is None:
            cur = bytearray((b,))
        else:
            cur.append(b)
            if b == FLAG:
                frames.append(bytes(cur))
                cur = None
    return frames


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
    assert model.applied["ext"] == [(3, 5), (0, 8), (0, 8)][:len(model.applied["ext"])]
    assert len(model.hb_mem) == 3 and len(model.ext_mem) == 1
    assert any(frame_type(f) == Type.INFO for f in frames)


@pytest.mark.parametrize("idle,stall", [(0.0, 0.0), (0.5, 0.6)])
def test_outputs_interleave_with_replies(idle, stall):
    """OUT and LINK_O frames queued while frames arrive: replies and outputs share tx at
    frame boundaries, outputs numbered in the order sent, every reply still as the model
    says."""
    rng = random.Random(2)
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
    bridge, model = make(frame_words=16, hb_words=16, cmd_depth=64)
    ops = [fr(Type.HELLO, 9), fr(Type.HB_WRITE, 10, addr_words(0, words(rng, 16))),
           fr(Type.CMD, 11, cmd_bytes(rng, 64)),
           fr(Type.HB_WRITE, 12, addr_words(1, words(rng, 16))), *drain_all()]
    run = Run(bridge, model, seed=4).run(ops)
    run.check()
    assert model.naks[Reason.ADDR] == 1 and len(model.applied["cmd"]) == 64


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
    run = Run(bridge, model, seed=5, idle=0.3 if traffic else 0.0,
              stall=0.4 if traffic else 0.0).run(ops)
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

"""The FPGA wire protocol's golden model (elmoe3d.sw.golden.bridge): CRC, framing, and the board side
(BridgeModel): every NAK reason, the check order, sequence numbers, atomicity, credits and the
output counter. Pure Python, no simulator."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elmoe3d.sw.golden.bridge import (CREDIT_BYTES, ESC, FLAG, BridgeModel, Credits, Deframer, Frame,
                               FrameError, Info, Reason, Type, crc16, decode_body,
                               encode_frame, max_body_bytes, pack_words, stuff, unpack_words)

W = 512
WB = W // 8


def model(**kw):
    args = dict(word_bits=W, frame_words=4, hb_words=32, ext_words=16, cmd_depth=4,
                host_depth=6, link_depth=5, ext_depth=2, rows=2, lanes=4, clk_hz=25_000_000,
                baud=115_200)
    args.update(kw)
    return BridgeModel(**args)


def replies(m, *wire):
    """Decoded replies to the frames ``wire``, one list entry per reply."""
    d = Deframer()
    out = []
    for frame in wire:
        for r in m.receive(frame):
            got = d.feed(r)
            assert len(got) == 1 and isinstance(got[0], Frame)
            out.append(got[0])
    return out


def one(m, type_, seq, payload=b""):
    (r,) = replies(m, encode_frame(type_, seq, payload))
    return r


def nak_reason(r):
    assert r.type == Type.NAK and len(r.payload) == 1 + CREDIT_BYTES
    return Reason(r.payload[0])


def words(n, base=0):
    return [(base + i) * 0x0123456789ABCDEF % (1 << W) for i in range(n)]


def test_crc_check_value_and_known_frame():
    assert crc16(b"123456789") == 0x29B1
    assert crc16(b"") == 0xFFFF
    # a POLL, seq 5: body 08 05 + CRC LE
    body = bytes((0x08, 0x05))
    assert encode_frame(Type.POLL, 5) == bytes((FLAG,)) + stuff(
        body + struct.pack("<H", crc16(body))) + bytes((FLAG,))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 255), st.integers(0, 255), st.binary(max_size=300),
       st.lists(st.integers(0, 400), max_size=6))
def test_stuff_deframe_round_trip(type_, seq, payload, cuts):
    wire = encode_frame(type_, seq, payload)
    body = wire[1:-1]
    assert FLAG not in body                       # stuffing removes every flag from the body
    assert len(body) - body.count(ESC) == 4 + len(payload)
    d = Deframer()
    got = []
    pos = 0
    for c in sorted(min(c, len(wire)) for c in cuts) + [len(wire)]:
        got += d.feed(wire[pos:c])
        pos = c
    assert got == [Frame(type_, seq, payload)]
    # back to back with extra flags in between: empty frames are ignored
    assert Deframer().feed(bytes((FLAG, FLAG)) + wire + wire) == [Frame(type_, seq, payload)] * 2


def test_decode_body_errors():
    with pytest.raises(FrameError) as e:
        decode_body(b"\x01\x02\x03")
    assert e.value.reason == Reason.LENGTH and e.value.seq == 2
    body = b"\x03\x07abc"
    good = body + struct.pack("<H", crc16(body))
    assert decode_body(good) == Frame(3, 7, b"abc")
    with pytest.raises(FrameError) as e:
        decode_body(good[:-1] + bytes((good[-1] ^ 1,)))
    assert e.value.reason == Reason.CRC and e.value.seq == 7


def test_words_pack_round_trip_and_errors():
    ws = words(3)
    assert unpack_words(pack_words(ws, W), W) == ws
    with pytest.raises(ValueError, match="word 1"):
        pack_words([0, 1 << W], W)
    with pytest.raises(ValueError, match="whole number"):
        unpack_words(b"\0" * (WB + 1), W)


def test_hello_info_and_seq_reset():
    m = model()
    r = one(m, Type.HELLO, 0)
    assert r.type == Type.INFO and r.seq == 0
    info = Info.unpack(r.payload)
    assert (info.version, info.rows, info.lanes, info.word_bits, info.hb_words, info.ext_words,
            info.frame_words, info.clk_hz, info.baud) == (1, 2, 4, W, 32, 16, 4, 25_000_000,
                                                          115_200)
    assert info.credits == Credits(4, 6, 5, 2)
    assert m.expect == 1
    # a board left in any state: HELLO with seq s resets expect to s + 1
    assert one(m, Type.HOST, 1, pack_words(words(1), W)).type == Type.ACK
    assert m.expect == 2
    assert one(m, Type.HELLO, 200).seq == 200 and m.expect == 201
    assert one(m, Type.HOST, 201, pack_words(words(1), W)).type == Type.ACK
    # POLL is answered whatever its seq and does not advance expect
    r = one(m, Type.POLL, 77)
    assert r.type == Type.ACK and r.seq == 77 and m.expect == 202


def test_every_nak_reason_applies_nothing():
    m = model()
    one(m, Type.HELLO, 0)
    host1 = pack_words(words(1), W)
    # CRC: the carried seq is echoed
    frame = bytearray(encode_frame(Type.HOST, 1, host1))
    frame[5] ^= 0x01 if frame[5] not in (FLAG ^ 1, ESC ^ 1) else 0x02
    assert nak_reason(r := replies(m, bytes(frame))[0]) == Reason.CRC and r.seq == 1
    # LENGTH: framing (too short, escape + flag, too long) and payload sizes
    assert [(nak_reason(r), r.seq) for r in replies(m, bytes((FLAG, 0x03, FLAG)))] == \
        [(Reason.LENGTH, 0xFF)]
    assert [(nak_reason(r), r.seq) for r in replies(
        m, bytes((FLAG, 0x03, 0x01, 0x05, ESC, FLAG)))] == [(Reason.LENGTH, 1)]
    too_long = encode_frame(Type.HOST, 1, pack_words(words(m.frame_words + 1), W))
    assert len(too_long) - 2 > m.max_body
    assert [nak_reason(r) for r in replies(m, too_long)] == [Reason.LENGTH]
    for type_, payload in ((Type.HOST, b""), (Type.HOST, host1[:-1]),
                           (Type.LINK, b"\0" * (WB + 3)), (Type.CMD, b""),
                           (Type.CMD, b"\0" * 17), (Type.CMD, b"\0" * (16 * 17)),
                           (Type.HB_WRITE, b"\0\0\0\0"), (Type.HB_WRITE, b"\0\0\0" + host1),
                           (Type.EXT_STREAM, struct.pack("<II", 0, 0)),
                           (Type.EXT_STREAM, struct.pack("<III", 0, 1, 0)),
                           (Type.HELLO, b"\0"), (Type.POLL, b"\0")):
        r = one(m, type_, 1, payload)
        assert nak_reason(r) == Reason.LENGTH, (type_, len(payload))
        assert r.seq == 1
    # TYPE: unknown, and a board -> host type sent to the board
    for t in (0x00, 0x09, Type.ACK, Type.OUT, 0xFF):
        assert nak_reason(one(m, t, 1)) == Reason.TYPE
    # SEQ
    assert nak_reason(one(m, Type.HOST, 5, host1)) == Reason.SEQ
    # ADDR
    assert nak_reason(one(m, Type.HB_WRITE, 1, struct.pack("<I", 31)
                          + pack_words(words(2), W))) == Reason.ADDR
    assert nak_reason(one(m, Type.EXT_WRITE, 1, struct.pack("<I", 16) + host1)) == Reason.ADDR
    assert nak_reason(one(m, Type.EXT_STREAM, 1, struct.pack("<II", 10, 7))) == Reason.ADDR
    # BUSY: 7 words do not fit 6 free HOST entries (the frame holds 4 at most: send 4 + 3)
    assert one(m, Type.HOST, 1, pack_words(words(4), W)).type == Type.ACK
    r = one(m, Type.HOST, 2, pack_words(words(3, 4), W))
    assert nak_reason(r) == Reason.BUSY and Credits.unpack(r.payload[1:]).host == 2
    assert m.expect == 2
    assert m.applied == {"cmd": [], "host": words(4), "link": [], "ext": []}
    assert m.hb_mem == {} and m.ext_mem == {}
    assert m.naks[Reason.CRC] == 1 and m.naks[Reason.SEQ] == 1 and m.naks[Reason.BUSY] == 1
    assert m.naks[Reason.TYPE] == 5 and m.naks[Reason.ADDR] == 3 and m.naks[Reason.LENGTH] == 15


def test_check_order():
    m = model()
    one(m, Type.HELLO, 0)
    # type before seq, seq before length, length before address, address before room
    assert nak_reason(one(m, 0x20, 9, b"\0")) == Reason.TYPE
    assert nak_reason(one(m, Type.HOST, 9, b"\0")) == Reason.SEQ
    assert nak_reason(one(m, Type.EXT_WRITE, 1, struct.pack("<I", 99) + b"\0")) == \
        Reason.LENGTH
    m.ext.extend([(0, 1), (0, 1)])                       # the descriptor queue is full
    assert nak_reason(one(m, Type.EXT_STREAM, 1, struct.pack("<II", 16, 1))) == Reason.ADDR
    assert nak_reason(one(m, Type.EXT_STREAM, 1, struct.pack("<II", 0, 1))) == Reason.BUSY
    # a duplicate is re-ACKed before any payload check, and not applied
    assert one(m, Type.LINK, 1, pack_words(words(1), W)).type == Type.ACK
    r = one(m, Type.LINK, 1, b"bogus")
    assert r.type == Type.ACK and r.seq == 1
    assert m.applied["link"] == words(1)


def test_duplicates_wrap_and_credits():
    m = model(link_depth=300)
    one(m, Type.HELLO, 0)
    sent = []
    for i in range(300):                 # seq wraps through 255 -> 0
        seq = (1 + i) % 256
        w = words(1, i)
        r = one(m, Type.LINK, seq, pack_words(w, W))
        assert r.type == Type.ACK and r.seq == seq
        assert Credits.unpack(r.payload).link == 300 - (i + 1)   # after applying the frame
        sent += w
        if i % 50 == 7:                  # the ACK was lost: the host sends it again
            r = one(m, Type.LINK, seq, pack_words(w, W))
            assert r.type == Type.ACK and r.seq == seq
    assert m.applied["link"] == sent and list(m.link) == sent
    # consuming frees room; credits follow
    for _ in range(10):
        m.link.popleft()
    assert Credits.unpack(one(m, Type.POLL, 0).payload).link == 10


def test_duplicates_at_the_wrap():
    """seq 255 and seq 0 retransmitted right after being accepted: ACKed, not applied."""
    m = model(link_depth=300)
    one(m, Type.HELLO, 253)                          # expect = 254
    sent = []
    for seq in (254, 255, 0, 1):
        w = pack_words(words(1, seq), W)
        assert (r := one(m, Type.LINK, seq, w)).type == Type.ACK and r.seq == seq
        sent += words(1, seq)
        if seq in (255, 0):                          # its ACK lost: sent again
            assert (r := one(m, Type.LINK, seq, w)).type == Type.ACK and r.seq == seq
            assert m.applied["link"] == sent
    assert m.expect == 2 and list(m.link) == sent
    # the frame before the duplicate window: NAK SEQ (255 is two behind expect = 1 + 0)
    one(m, Type.HELLO, 0)
    assert nak_reason(one(m, Type.LINK, 255, pack_words(words(1), W))) == Reason.SEQ


def test_data_seq_0_after_hello_0_is_a_duplicate():
    """The documented trap: HELLO seq 0 sets expect = 1, so a data frame with seq 0 is taken
    for a retransmission of the frame before it: ACKed and NOT applied. The host's first data
    frame after HELLO seq 0 carries seq 1."""
    m = model()
    one(m, Type.HELLO, 0)
    r = one(m, Type.HOST, 0, pack_words(words(1), W))
    assert r.type == Type.ACK and r.seq == 0
    assert m.applied["host"] == [] and m.expect == 1
    assert one(m, Type.HOST, 1, pack_words(words(1), W)).type == Type.ACK
    assert m.applied["host"] == words(1)


def test_body_of_max_body_and_one_more():
    m = model()
    one(m, Type.HELLO, 0)
    n = m.max_body - 4                               # type, seq, payload, CRC = max_body
    # an unknown type is judged on its type: the body itself passes framing ...
    assert len(encode_frame(0x40, 1, b"\x11" * n)) - 2 == m.max_body     # nothing stuffed
    assert nak_reason(one(m, 0x40, 1, b"\x11" * n)) == Reason.TYPE
    # ... one byte more is a framing error (LENGTH), the next frame decodes again
    assert nak_reason(one(m, 0x40, 1, b"\x11" * (n + 1))) == Reason.LENGTH
    assert one(m, Type.POLL, 3).type == Type.ACK
    # a duplicate of max_body bytes is re-ACKed (no payload check); max_body + 1 is not
    assert one(m, Type.HOST, 1, pack_words(words(1), W)).type == Type.ACK
    assert one(m, Type.HOST, 1, b"\x11" * n).type == Type.ACK
    assert nak_reason(one(m, Type.HOST, 1, b"\x11" * (n + 1))) == Reason.LENGTH
    # the Deframer alone: a body of exactly max_body is a frame, one more an error
    d = Deframer(max_body=m.max_body)
    (f,) = d.feed(encode_frame(0x40, 9, b"\x11" * n))
    assert isinstance(f, Frame) and len(f.payload) == n
    (e,) = d.feed(encode_frame(0x40, 9, b"\x11" * (n + 1)))
    assert isinstance(e, FrameError) and e.reason == Reason.LENGTH and e.seq == 9
    # the largest legal frames are within it: HB_WRITE of frame_words words
    hb = struct.pack("<I", 0) + pack_words(words(m.frame_words), W)
    assert one(m, Type.HB_WRITE, 2, hb).type == Type.ACK


def test_addr_and_words_at_u32_max():
    """addr + n is compared without wrapping at 32 bits (the RTL needs 33)."""
    m = model()
    one(m, Type.HELLO, 0)
    host1 = pack_words(words(1), W)
    big = 0xFFFFFFFF
    for type_, payload in ((Type.EXT_STREAM, struct.pack("<II", big, 1)),
                           (Type.EXT_STREAM, struct.pack("<II", 0, big)),
                           (Type.EXT_STREAM, struct.pack("<II", big, big)),
                           (Type.EXT_STREAM, struct.pack("<II", 1, big)),
                           (Type.HB_WRITE, struct.pack("<I", big) + host1),
                           (Type.EXT_WRITE, struct.pack("<I", big) + host1)):
        assert nak_reason(one(m, type_, 1, payload)) == Reason.ADDR, (type_, payload[:8])
    assert m.expect == 1 and m.hb_mem == {} and m.ext_mem == {} and not m.ext
    # the last word of each stand-in is in range
    assert one(m, Type.EXT_STREAM, 1, struct.pack("<II", 15, 1)).type == Type.ACK
    assert one(m, Type.HB_WRITE, 2, struct.pack("<I", 31) + host1).type == Type.ACK


def test_atomic_apply_and_targets():
    m = model()
    one(m, Type.HELLO, 0)
    cmds = [(1 << 127) | i for i in range(4)]
    payload = b"".join(c.to_bytes(16, "little") for c in cmds)
    assert one(m, Type.CMD, 1, payload).type == Type.ACK
    assert list(m.cmd) == cmds
    assert nak_reason(one(m, Type.CMD, 2, payload[:16])) == Reason.BUSY
    m.cmd.popleft()
    assert one(m, Type.CMD, 2, payload[:16]).type == Type.ACK
    # HB / EXT writes land at their addresses; EXT_STREAM queues a descriptor
    assert one(m, Type.HB_WRITE, 3, struct.pack("<I", 28) + pack_words(words(4), W)).type \
        == Type.ACK
    assert m.hb_mem == dict(zip(range(28, 32), words(4)))
    assert one(m, Type.EXT_WRITE, 4, struct.pack("<I", 0) + pack_words(words(2, 9), W)).type \
        == Type.ACK
    assert m.ext_mem == {0: words(1, 9)[0], 1: words(1, 10)[0]}
    assert one(m, Type.EXT_STREAM, 5, struct.pack("<II", 0, 2)).type == Type.ACK
    assert list(m.ext) == [(0, 2)] and m.applied["ext"] == [(0, 2)]
    assert m.applied["cmd"] == cmds + cmds[:1]


def test_output_frames_numbered_and_reset_by_hello():
    m = model()
    d = Deframer()
    got = [d.feed(m.push_o(1, 5))[0], d.feed(m.push_link_o(7))[0]]
    assert [(f.type, f.seq) for f in got] == [(Type.OUT, 0), (Type.LINK_O, 1)]
    assert got[0].payload == b"\x01" + pack_words([5], W)
    assert got[1].payload == pack_words([7], W)
    for _ in range(300):
        m.push_link_o(0)
    assert m.out_seq == 302 % 256
    one(m, Type.HELLO, 0)
    assert d.feed(m.push_o(0, 1))[0].seq == 0


def test_max_body_and_constructor_errors():
    m = model()
    assert m.max_body == max_body_bytes(4, W) == 4 + 8 + 4 * WB
    for name, bad in (("word_bits", 100), ("frame_words", 0), ("hb_words", -1),
                      ("cmd_depth", 0x10000), ("ext_depth", 1.5), ("rows", 0)):
        with pytest.raises(ValueError, match=name):
            model(**{name: bad})
    # the widths INFO packs them into: u16 word_bits / frame_words, u32 the rest
    for name, top in (("word_bits", 0xFFF8), ("frame_words", 0xFFFF), ("hb_words", 2**32 - 1),
                      ("ext_words", 2**32 - 1), ("clk_hz", 2**32 - 1), ("baud", 2**32 - 1)):
        assert getattr(Info.unpack(model(**{name: top}).info().pack()), name) == top
        over = top + 8 if name == "word_bits" else top + 1
        hi = 0xFFFF if name in ("word_bits", "frame_words") else 0xFFFFFFFF
        with pytest.raises(ValueError, match=rf"^{name}: expected an integer in \d+\.\.{hi}, "
                                             rf"got {over}$"):
            model(**{name: over})

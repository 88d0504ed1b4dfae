"""The host-bridge wire protocol (version 1) of the FPGA prototype: framing, CRC and payloads.

This is the protocol's golden model, plain Python (no Amaranth, no NumPy): the board's bridge
(:mod:`elmoe3d.hw.bridge`) is checked against it byte for byte in simulation, and the host
driver (:mod:`elmoe3d.sw.host.fpga`) speaks it over pyserial. The contract is ``docs/fpga.md``,
"Wire protocol".

Framing (HDLC-like)
-------------------
Every frame is ``FLAG`` + stuffed(body) + ``FLAG``. Stuffing sends a body byte ``FLAG`` (0x7E)
or ``ESC`` (0x7D) as ``ESC, byte ^ 0x20``. Empty frames (consecutive flags) are ignored. The
body is ``type (u8) | seq (u8) | payload | crc (u16, little-endian)``, the CRC being
CRC-16/CCITT-FALSE (polynomial 0x1021, initial value 0xFFFF, no reflection, no final XOR) over
``type | seq | payload``. Multi-byte integers are little-endian; a W-bit PE word is W/8 bytes,
least significant byte first; a command is the 16-byte :mod:`elmoe3d.isa` encoding, least
significant byte first.

Sequence numbers, atomicity and flow control are the board's (``docs/fpga.md``): a frame is
applied whole or not at all, every frame with a good CRC gets exactly one reply (ACK, NAK or
INFO; an unknown type gets NAK TYPE, and framing and CRC errors get a NAK too), and the host
sends a frame only when the last credits it saw say it fits.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from dataclasses import dataclass

from ...checks import check_int


__all__ = ["VERSION", "FLAG", "ESC", "Type", "Reason", "Frame", "FrameError", "Credits",
           "Info", "crc16", "stuff", "encode_frame", "decode_body", "Deframer",
           "pack_words", "unpack_words", "max_body_bytes", "CREDIT_BYTES", "INFO_BYTES",
           "BridgeModel", "ADDR_BYTES", "EXT_STREAM_BYTES", "CMD_BYTES"]

#: Protocol version carried by INFO.
VERSION = 1
#: Frame delimiter.
FLAG = 0x7E
#: Escape byte: the next byte is XORed with 0x20.
ESC = 0x7D
_XOR = 0x20


class Type(enum.IntEnum):
    """Frame types: host -> board below 0x80, board -> host from 0x80."""

    HELLO = 0x01       #: empty -> INFO; resets the board's sequence numbers
    CMD = 0x02         #: n x 16 B commands -> the load router's ``cmd_i``
    HOST = 0x03        #: n x W/8 B words -> the load router's ``host`` (LOAD src=HOST)
    LINK = 0x04        #: n x W/8 B words -> the PE's ``link_i``
    HB_WRITE = 0x05    #: u32 addr + n x W/8 B -> HB stand-in words addr..
    EXT_WRITE = 0x06   #: u32 addr + n x W/8 B -> EXT stand-in words addr..
    EXT_STREAM = 0x07  #: u32 addr + u32 words -> stream EXT stand-in words to ``ext``
    POLL = 0x08        #: empty -> ACK with the credits
    ACK = 0x81         #: credits
    NAK = 0x82         #: u8 reason + credits
    INFO = 0x83        #: see :class:`Info`
    OUT = 0x84         #: u8 kind + W/8 B: one PE ``o`` beat
    LINK_O = 0x85      #: W/8 B: one PE ``link_o`` word


class Reason(enum.IntEnum):
    """Why the board NAKed a frame (nothing of it was applied)."""

    CRC = 1       #: the CRC does not match
    LENGTH = 2    #: framing error, or a payload of the wrong size for its type
    TYPE = 3      #: unknown frame type
    BUSY = 4      #: the target FIFO / queue has no room for all of the frame's entries
    ADDR = 5      #: addr + words exceeds the stand-in memory
    SEQ = 6       #: unexpected sequence number


class FrameError(ValueError):
    """A received frame is malformed: bad CRC, too short, a dangling escape. ``reason`` is the
    :class:`Reason` the board would NAK it with; ``seq`` the sequence number it carried, or
    ``None`` if it was too short to tell."""

    def __init__(self, message, *, reason: Reason, seq=None):
        super().__init__(message)
        self.reason = reason
        self.seq = seq


def crc16(data: bytes, crc: int = 0xFFFF) -> int:
    """CRC-16/CCITT-FALSE of ``data`` (check value: ``crc16(b"123456789") == 0x29B1``)."""
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def stuff(body: bytes) -> bytes:
    """``body`` with every FLAG and ESC byte escaped (no flags added)."""
    out = bytearray()
    for byte in body:
        if byte in (FLAG, ESC):
            out += bytes((ESC, byte ^ _XOR))
        else:
            out.append(byte)
    return bytes(out)


def encode_frame(type_, seq: int, payload: bytes = b"") -> bytes:
    """The bytes on the wire for one frame: FLAG, stuffed body with its CRC, FLAG.

    Raises ``ValueError`` naming ``seq`` or ``type`` if either is not a byte."""
    if not 0 <= int(type_) <= 0xFF:
        raise ValueError(f"type: expected a byte, got {type_!r}")
    if not 0 <= int(seq) <= 0xFF:
        raise ValueError(f"seq: expected 0..255, got {seq!r}")
    body = bytes((int(type_), int(seq))) + bytes(payload)
    body += struct.pack("<H", crc16(body))
    return bytes((FLAG,)) + stuff(body) + bytes((FLAG,))


@dataclass(frozen=True)
class Frame:
    """One decoded frame: ``type`` (int; a :class:`Type` where known), ``seq``, ``payload``."""

    type: int
    seq: int
    payload: bytes

    @property
    def kind(self):
        """The :class:`Type`, or ``None`` for an unknown type byte."""
        try:
            return Type(self.type)
        except ValueError:
            return None


def decode_body(body: bytes) -> Frame:
    """Check and split an unstuffed body. Raises :class:`FrameError` (reason LENGTH if shorter
    than 4 bytes, CRC if the CRC does not match)."""
    if len(body) < 4:
        raise FrameError(f"frame of {len(body)} bytes: a frame has at least 4 (type, seq, "
                         f"CRC)", reason=Reason.LENGTH, seq=body[1] if len(body) > 1 else None)
    want = crc16(body[:-2])
    got = struct.unpack("<H", body[-2:])[0]
    if want != got:
        raise FrameError(f"frame type 0x{body[0]:02x} seq {body[1]}: CRC 0x{got:04x}, "
                         f"expected 0x{want:04x}", reason=Reason.CRC, seq=body[1])
    return Frame(type=body[0], seq=body[1], payload=bytes(body[2:-2]))


class Deframer:
    """Byte-at-a-time frame decoder (what the board's bridge does in hardware).

    :meth:`feed` takes received bytes and returns a list of :class:`Frame` or
    :class:`FrameError` items, in order. A body longer than ``max_body`` bytes (if given) is a
    LENGTH error; the rest of it is discarded up to the next flag. An ESC followed by a FLAG is
    a LENGTH error (the flag still starts the next frame).
    """

    def __init__(self, *, max_body=None):
        self.max_body = max_body
        self._body = bytearray()
        self._esc = False
        self._overflow = False

    def feed(self, data: bytes) -> list:
        """Take the received bytes ``data`` (any split of the stream: state is kept between
        calls) and return what they complete, in order: a :class:`Frame` per good body, a
        :class:`FrameError` per bad one (reason LENGTH: shorter than 4 bytes, an ESC then a
        FLAG, longer than ``max_body``; reason CRC: the CRC does not match), nothing for an
        empty frame (consecutive flags). Bytes before the first flag are a body like any
        other (a stream joined mid-frame gives one error, then frames). Bytes after the last
        flag wait for the next call. Never raises on bad input."""
        out = []
        for byte in data:
            if byte == FLAG:
                if self._esc:
                    out.append(FrameError("escape byte followed by a flag",
                                          reason=Reason.LENGTH,
                                          seq=self._body[1] if len(self._body) > 1 else None))
                elif self._overflow:
                    out.append(FrameError(f"frame longer than {self.max_body} bytes",
                                          reason=Reason.LENGTH,
                                          seq=self._body[1] if len(self._body) > 1 else None))
                elif self._body:
                    try:
                        out.append(decode_body(bytes(self._body)))
                    except FrameError as exc:
                        out.append(exc)
                self._body.clear()
                self._esc = self._overflow = False
                continue
            if self._esc:
                byte ^= _XOR
                self._esc = False
            elif byte == ESC:
                self._esc = True
                continue
            if self.max_body is not None and len(self._body) >= self.max_body:
                self._overflow = True
                continue
            self._body.append(byte)
        return out


def max_body_bytes(frame_words: int, word_bits: int) -> int:
    """The longest body the board takes: type, seq, an 8-byte address header, ``frame_words``
    W-bit words and the CRC."""
    return 2 + 8 + frame_words * (word_bits // 8) + 2


def pack_words(words, bits: int) -> bytes:
    """Concatenate ``bits``-wide unsigned integers, least significant byte first. Raises
    ``ValueError`` naming the index of a word that does not fit."""
    nbytes = bits // 8
    out = bytearray()
    for i, w in enumerate(words):
        w = int(w)
        if not 0 <= w < (1 << bits):
            raise ValueError(f"word {i}: 0x{w:x} does not fit in {bits} bits")
        out += w.to_bytes(nbytes, "little")
    return bytes(out)


def unpack_words(data: bytes, bits: int) -> list:
    """Inverse of :func:`pack_words`. Raises ``ValueError`` if ``len(data)`` is not a whole
    number of words."""
    nbytes = bits // 8
    if len(data) % nbytes:
        raise ValueError(f"{len(data)} bytes is not a whole number of {bits}-bit words")
    return [int.from_bytes(data[i:i + nbytes], "little") for i in range(0, len(data), nbytes)]


#: Bytes of the credit block closing ACK, NAK and INFO.
CREDIT_BYTES = 8


@dataclass(frozen=True)
class Credits:
    """Free entries on the board when it formed the reply: commands in the CMD FIFO, words in
    the HOST and LINK FIFOs, descriptors in the EXT_STREAM queue."""

    cmd: int
    host: int
    link: int
    ext: int

    def pack(self) -> bytes:
        return struct.pack("<HHHH", self.cmd, self.host, self.link, self.ext)

    @classmethod
    def unpack(cls, data: bytes) -> "Credits":
        """From the :data:`CREDIT_BYTES` bytes closing an ACK, NAK or INFO payload. Raises
        ``ValueError`` if ``data`` is not exactly :data:`CREDIT_BYTES` long."""
        if len(data) != CREDIT_BYTES:
            raise ValueError(f"credits: expected {CREDIT_BYTES} bytes, got {len(data)}")
        return cls(*struct.unpack("<HHHH", data))


_INFO = struct.Struct("<BBBHIIHII")
#: Bytes of an INFO payload (the fields of :class:`Info`, then the credits).
INFO_BYTES = _INFO.size + CREDIT_BYTES


@dataclass(frozen=True)
class Info:
    """What the board is (INFO payload): protocol ``version``, tile ``rows`` and ``lanes``,
    PE ``word_bits``, stand-in depths ``hb_words`` and ``ext_words`` (W-bit words), the
    staging buffer ``frame_words``, ``clk_hz``, ``baud``, and the ``credits``."""

    version: int
    rows: int
    lanes: int
    word_bits: int
    hb_words: int
    ext_words: int
    frame_words: int
    clk_hz: int
    baud: int
    credits: Credits

    def pack(self) -> bytes:
        return _INFO.pack(self.version, self.rows, self.lanes, self.word_bits, self.hb_words,
                          self.ext_words, self.frame_words, self.clk_hz, self.baud) + \
            self.credits.pack()

    @classmethod
    def unpack(cls, data: bytes) -> "Info":
        """From an INFO payload. Raises ``ValueError`` if ``data`` is not exactly
        :data:`INFO_BYTES` long (fields are not range-checked: the host compares them)."""
        if len(data) != INFO_BYTES:
            raise ValueError(f"INFO: expected {INFO_BYTES} bytes, got {len(data)}")
        fields = _INFO.unpack(data[:_INFO.size])
        return cls(*fields, credits=Credits.unpack(data[_INFO.size:]))


# -- the board side ----------------------------------------------------------------------------

#: Frame types the board accepts from the host, with the target their payload goes to.
_TARGET = {Type.CMD: "cmd", Type.HOST: "host", Type.LINK: "link", Type.EXT_STREAM: "ext"}
#: Bytes of the address header of HB_WRITE / EXT_WRITE, and of an EXT_STREAM payload.
ADDR_BYTES = 4
EXT_STREAM_BYTES = 8
#: Bytes of one command in a CMD payload.
CMD_BYTES = 16


_U16, _U32 = 0xFFFF, 0xFFFFFFFF


class BridgeModel:
    """The board side of the protocol as a pure-Python state machine: the reference the RTL
    bridge (:mod:`elmoe3d.hw.bridge`) is compared with byte for byte, and the stand-in board
    the host driver (:mod:`elmoe3d.sw.host.fpga`) is tested against.

    Parameters (keyword-only)
    -------------------------
    word_bits : int
        W, the PE word (a multiple of 8, at most 65535: INFO's u16).
    frame_words : int
        The staging buffer in W-bit words (1..65535, INFO's u16): the largest HOST / LINK /
        HB_WRITE / EXT_WRITE payload (and ``frame_words * W/8`` bytes of CMD payload). Bodies
        longer than :func:`max_body_bytes` are framing errors.
    hb_words, ext_words : int
        Depths of the HB and EXT stand-in memories (W-bit words; at most 2**32 - 1, INFO's
        u32).
    cmd_depth, host_depth, link_depth, ext_depth : int
        Entries of the CMD FIFO (commands), the HOST and LINK FIFOs (words) and the
        EXT_STREAM descriptor queue (at most 65535: credits are u16).
    rows, lanes : int
        Reported by INFO (u8 each).
    clk_hz, baud : int
        Reported by INFO (u32 each).

    Raises ``ValueError`` naming the parameter if one is not an integer in its range (or
    ``word_bits`` not a multiple of 8).

    :meth:`receive` takes wire bytes (any split) and returns the wire bytes of the replies, one
    frame per item, in order. Every frame is checked in this order (the first failing check
    names the NAK reason; the RTL bridge implements the same order):

    1. framing: a body shorter than 4 bytes, an ESC followed by a FLAG, a body longer than
       :func:`max_body_bytes` -> NAK LENGTH (seq = the carried seq, 0xFF if unknown);
    2. CRC -> NAK CRC (the carried seq);
    3. type: not a host -> board type -> NAK TYPE;
    4. seq (not for HELLO / POLL, which are answered whatever their seq): ``seq == expect``
       goes on; ``seq == expect - 1`` (mod 256) is a retransmission whose ACK was lost: ACKed
       again, NOT applied, no further checks; anything else -> NAK SEQ;
    5. payload length for the type -> NAK LENGTH: HELLO and POLL empty; CMD a whole number
       >= 1 of 16-byte commands, at most ``frame_words * W/8`` bytes; HOST / LINK a whole
       number >= 1 of W/8-byte words, at most ``frame_words``; HB_WRITE / EXT_WRITE a u32
       address and a whole number >= 1 of words, at most ``frame_words``; EXT_STREAM exactly
       8 bytes with ``words >= 1``;
    6. address range (HB_WRITE / EXT_WRITE / EXT_STREAM: ``addr + n > depth``) -> NAK ADDR;
    7. room (CMD / HOST / LINK: n entries; EXT_STREAM: one descriptor) -> NAK BUSY.

    An accepted frame is applied whole, ``expect`` advances (mod 256) and the ACK carries
    its seq. HELLO (empty) is a soft reset of the board's PE side: it empties the CMD, HOST
    and LINK FIFOs and the EXT_STREAM queue (the board also resets its PE, load router and
    stand-in readers; the stand-in memories keep their contents), sets ``expect = seq + 1``
    and the output counter to 0 (:attr:`hello_resets` counts them), and is answered by INFO
    with full credits; POLL by ACK; neither is "applied". Credits in every reply are the free
    entries when the reply is formed (after applying the frame). The board restarts its
    output counter when its transmitter takes the INFO: an output frame already being sent
    then keeps the old numbering, the first one after the INFO is number 0 (a bench that
    numbers outputs with :meth:`push_o` while a HELLO is in flight sets :attr:`out_seq` to 0
    when the INFO leaves).

    State a test (the fake PE) uses: the FIFOs :attr:`cmd`, :attr:`host`, :attr:`link` (deques
    of ints) and :attr:`ext` (deque of ``(addr, words)``): pop entries to free room; the
    stand-in memories :attr:`hb_mem` and :attr:`ext_mem` (dicts ``addr -> word``);
    :attr:`applied` (per target ``"cmd" / "host" / "link" / "ext"``, every entry ever
    applied, in order); :attr:`naks` (count per :class:`Reason`); :attr:`replies`.
    Outputs: :meth:`push_o` / :meth:`push_link_o` return the OUT / LINK_O frame of one PE
    output, numbered by the output sequence counter (one counter for both, mod 256).
    """

    def __init__(self, *, word_bits, frame_words, hb_words, ext_words, cmd_depth=16,
                 host_depth=64, link_depth=64, ext_depth=8, rows=2, lanes=4,
                 clk_hz=25_000_000, baud=115_200):
        # upper bounds: the INFO fields they are reported in (u16 / u32)
        word_bits = check_int("word_bits", word_bits, 8, _U16)
        if word_bits % 8:
            raise ValueError(f"word_bits: expected a multiple of 8, got {word_bits}")
        self.word_bits = word_bits
        self.word_bytes = word_bits // 8
        self.frame_words = check_int("frame_words", frame_words, 1, _U16)
        self.hb_words = check_int("hb_words", hb_words, 1, _U32)
        self.ext_words = check_int("ext_words", ext_words, 1, _U32)
        self.depths = {"cmd": check_int("cmd_depth", cmd_depth, 1, _U16),
                       "host": check_int("host_depth", host_depth, 1, _U16),
                       "link": check_int("link_depth", link_depth, 1, _U16),
                       "ext": check_int("ext_depth", ext_depth, 1, _U16)}
        self.rows = check_int("rows", rows, 1, 0xFF)
        self.lanes = check_int("lanes", lanes, 1, 0xFF)
        self.clk_hz = check_int("clk_hz", clk_hz, 1, _U32)
        self.baud = check_int("baud", baud, 1, _U32)
        self.cmd, self.host, self.link, self.ext = deque(), deque(), deque(), deque()
        self.hb_mem, self.ext_mem = {}, {}
        self.applied = {"cmd": [], "host": [], "link": [], "ext": []}
        self.naks = {r: 0 for r in Reason}
        self.replies = 0
        self.expect = 0
        self.out_seq = 0
        self.hello_resets = 0
        self.deframer = Deframer(max_body=self.max_body)

    @property
    def max_body(self) -> int:
        """The longest body accepted (:func:`max_body_bytes`)."""
        return max_body_bytes(self.frame_words, self.word_bits)

    def fifo(self, target: str):
        """The deque of ``target``: ``"cmd"`` (commands, ints), ``"host"`` / ``"link"``
        (words, ints), ``"ext"`` (``(addr, words)`` descriptors). The fake PE pops from it;
        ``KeyError`` for another name."""
        return {"cmd": self.cmd, "host": self.host, "link": self.link, "ext": self.ext}[target]

    def free(self, target: str) -> int:
        """Free entries of ``target`` (``"cmd"``, ``"host"``, ``"link"``, ``"ext"``)."""
        return self.depths[target] - len(self.fifo(target))

    def credits(self) -> Credits:
        return Credits(self.free("cmd"), self.free("host"), self.free("link"), self.free("ext"))

    def info(self) -> Info:
        return Info(VERSION, self.rows, self.lanes, self.word_bits, self.hb_words,
                    self.ext_words, self.frame_words, self.clk_hz, self.baud, self.credits())

    # replies
    def _ack(self, seq):
        self.replies += 1
        return encode_frame(Type.ACK, seq, self.credits().pack())

    def _nak(self, seq, reason):
        self.replies += 1
        self.naks[Reason(reason)] += 1
        return encode_frame(Type.NAK, seq, bytes((int(reason),)) + self.credits().pack())

    def receive(self, data: bytes) -> list:
        """Feed wire bytes; returns the reply frames (wire bytes, one per item) in order."""
        out = []
        for item in self.deframer.feed(data):
            if isinstance(item, FrameError):
                seq = 0xFF if item.seq is None else item.seq
                out.append(self._nak(seq, item.reason))
            else:
                out.append(self.handle(item))
        return out

    def _length_ok(self, kind, p) -> bool:
        wb, n = self.word_bytes, len(p)
        if kind in (Type.HELLO, Type.POLL):
            return n == 0
        if kind == Type.CMD:
            return n >= CMD_BYTES and n % CMD_BYTES == 0 and n <= self.frame_words * wb
        if kind in (Type.HOST, Type.LINK):
            return n >= wb and n % wb == 0 and n // wb <= self.frame_words
        if kind in (Type.HB_WRITE, Type.EXT_WRITE):
            n -= ADDR_BYTES
            return n >= wb and n % wb == 0 and n // wb <= self.frame_words
        if kind == Type.EXT_STREAM:
            return n == EXT_STREAM_BYTES and struct.unpack("<I", p[4:])[0] >= 1
        return False

    def handle(self, frame: Frame) -> bytes:
        """The reply to one decoded (good-CRC) frame, applying it if accepted."""
        kind = frame.kind
        seq, p = frame.seq, frame.payload
        if kind is None or kind >= 0x80:
            return self._nak(seq, Reason.TYPE)
        if kind not in (Type.HELLO, Type.POLL):
            if seq == (self.expect - 1) % 256:
                return self._ack(seq)
            if seq != self.expect:
                return self._nak(seq, Reason.SEQ)
        if not self._length_ok(kind, p):
            return self._nak(seq, Reason.LENGTH)
        if kind == Type.HELLO:
            # a soft reset of the board's PE side: the queues emptied (the INFO's credits
            # are the full depths), the output counter restarted; the stand-ins kept
            for q in (self.cmd, self.host, self.link, self.ext):
                q.clear()
            self.hello_resets += 1
            self.expect = (seq + 1) % 256
            self.out_seq = 0
            self.replies += 1
            return encode_frame(Type.INFO, seq, self.info().pack())
        if kind == Type.POLL:
            return self._ack(seq)
        wb = self.word_bytes
        if kind in (Type.HB_WRITE, Type.EXT_WRITE, Type.EXT_STREAM):
            addr = struct.unpack("<I", p[:ADDR_BYTES])[0]
            if kind == Type.EXT_STREAM:
                n = struct.unpack("<I", p[4:])[0]
            else:
                n = (len(p) - ADDR_BYTES) // wb
            depth = self.hb_words if kind == Type.HB_WRITE else self.ext_words
            if addr + n > depth:
                return self._nak(seq, Reason.ADDR)
        if kind in _TARGET:
            target = _TARGET[kind]
            need = 1 if kind == Type.EXT_STREAM else \
                len(p) // (CMD_BYTES if kind == Type.CMD else wb)
            if need > self.free(target):
                return self._nak(seq, Reason.BUSY)
        # accepted: apply all of it
        if kind == Type.CMD:
            entries = [int.from_bytes(p[i:i + CMD_BYTES], "little")
                       for i in range(0, len(p), CMD_BYTES)]
        elif kind in (Type.HOST, Type.LINK):
            entries = unpack_words(p, self.word_bits)
        elif kind == Type.EXT_STREAM:
            entries = [(addr, n)]
        else:
            mem = self.hb_mem if kind == Type.HB_WRITE else self.ext_mem
            for i, w in enumerate(unpack_words(p[ADDR_BYTES:], self.word_bits)):
                mem[addr + i] = w
            entries = None
        if entries is not None:
            self.fifo(_TARGET[kind]).extend(entries)
            self.applied[_TARGET[kind]].extend(entries)
        self.expect = (self.expect + 1) % 256
        return self._ack(seq)

    # outputs
    def _output(self, type_, payload) -> bytes:
        frame = encode_frame(type_, self.out_seq, payload)
        self.out_seq = (self.out_seq + 1) % 256
        return frame

    def push_o(self, kind: int, data: int) -> bytes:
        """The OUT frame of one PE ``o`` beat (``kind``: an :class:`~elmoe3d.sw.golden.asm.OKind`)."""
        return self._output(Type.OUT, bytes((int(kind),)) + pack_words([data], self.word_bits))

    def push_link_o(self, word: int) -> bytes:
        """The LINK_O frame of one PE ``link_o`` word."""
        return self._output(Type.LINK_O, pack_words([word], self.word_bits))

"""The host-bridge wire protocol (version 1) of the FPGA prototype: framing, CRC and payloads.

This is the protocol's golden model, plain Python (no Amaranth, no NumPy): the board's bridge
(:mod:`elmoe3d.hw.bridge`) is checked against it byte for byte in simulation, and the host
driver (:mod:`elmoe3d.sw.fpga`) speaks it over pyserial. The contract is ``docs/fpga.md``,
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
applied whole or not at all, every good frame of a known type gets exactly one reply (ACK, NAK
or INFO), and the host sends a frame only when the last credits it saw say it fits.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass


__all__ = ["VERSION", "FLAG", "ESC", "Type", "Reason", "Frame", "FrameError", "Credits",
           "Info", "crc16", "stuff", "encode_frame", "decode_body", "Deframer",
           "pack_words", "unpack_words", "max_body_bytes", "CREDIT_BYTES", "INFO_BYTES"]

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
        if len(data) != INFO_BYTES:
            raise ValueError(f"INFO: expected {INFO_BYTES} bytes, got {len(data)}")
        fields = _INFO.unpack(data[:_INFO.size])
        return cls(*fields, credits=Credits.unpack(data[_INFO.size:]))

"""The host bridge's deframer (receive path, ``docs/fpga.md``, "Bridge hardware"; the
golden model's :class:`elmoe3d.sw.golden.bridge.Deframer`): HDLC flags and escapes removed,
the body written byte by byte into the staging buffer while its CRC, type, seq and header
are taken as they pass. Part of :class:`elmoe3d.hw.bridge.Bridge`, which checks and applies
the frame.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..sw.golden.bridge import ESC, FLAG
from .bridge_bytes import crc16_byte
from .checked import CheckedComponent, check_param


__all__ = ["HEADER_BYTES", "staging_write_signature", "Deframer"]


#: Body bytes after type and seq that the deframer latches: the 32-bit address and the
#: 32-bit word count of HB_WRITE / EXT_WRITE / EXT_STREAM payloads (little-endian).
HEADER_BYTES = 8


def staging_write_signature(max_body: int) -> wiring.Signature:
    """The deframer's write port into the staging buffer (``max_body`` bytes): ``en`` (1 =
    write this cycle), ``addr`` (byte), ``data`` (8 bits)."""
    return wiring.Signature({"en": Out(1), "addr": Out(range(max_body)), "data": Out(8)})


class Deframer(CheckedComponent):
    """Bytes of the wire in, frame bodies into the staging buffer (module docstring).

    Ports
    -----
    i : In, ``stream.Signature(8)``
        Wire bytes. Always ready (one byte per cycle); the bridge offers bytes only while
        it is receiving.
    stage : Out, :func:`staging_write_signature`
        Body byte ``k`` (unstuffed) is written at address ``k`` in the cycle it is taken;
        bytes beyond :attr:`max_body` are not written (:attr:`overflow`).
    closed : Out(1)
        This cycle's byte is a flag that ends something (stored bytes, a dangling escape or
        an overflow); flags between frames are skipped. The frame's fields below are
        valid from the next cycle until ``clear``.
    clear : In(1)
        Starts a new frame in the next cycle (length, escape, overflow and CRC reset).
    length : Out(range(max_body + 1))
        Body bytes stored.
    esc, overflow : Out(1)
        An escape byte waits for its byte; the body had more than :attr:`max_body` bytes.
    type, seq : Out(8)
        Body bytes 0 and 1.
    header : Out(8 * :data:`HEADER_BYTES`)
        Body bytes 2 .. 9 (byte 2 least significant).
    crc_ok : Out(1)
        The CRC-16/CCITT-FALSE of the body but its last two bytes equals those two bytes
        (little-endian), as :func:`elmoe3d.sw.golden.bridge.crc16` (meaningful for
        ``length >= 2``).

    Latency: the fields are registers updated as each byte is taken (1 cycle).

    Parameters
    ----------
    max_body : int
        Staging buffer bytes (>= 4: type, seq and the CRC).

    Raises
    ------
    ValueError
        ``max_body`` out of range.
    """

    @classmethod
    def check(cls, *, max_body):
        """The constructor's checks (:class:`~elmoe3d.hw.checked.CheckedComponent`)."""
        check_param("max_body", max_body, 4)

    def __init__(self, *, max_body: int):
        self._max_body = max_body
        super().__init__({
            "i": In(stream.Signature(8)),
            "stage": Out(staging_write_signature(max_body)),
            "closed": Out(1),
            "clear": In(1),
            "length": Out(range(max_body + 1)),
            "esc": Out(1),
            "overflow": Out(1),
            "type": Out(8),
            "seq": Out(8),
            "header": Out(8 * HEADER_BYTES),
            "crc_ok": Out(1),
        })

    @property
    def max_body(self) -> int:
        return self._max_body

    @property
    def latency(self) -> int:
        """Cycles from a byte taken on ``i`` to the fields showing it."""
        return 1

    def elaborate(self, platform):
        m = Module()
        max_body = self._max_body
        count, esc, overflow = self.length, self.esc, self.overflow
        crc = Signal(16, init=0xFFFF)
        b1 = Signal(8)                                   # the last body byte
        b2 = Signal(8)                                   # the one before
        byte = self.i.payload
        m.d.comb += [self.i.ready.eq(1), self.crc_ok.eq(crc == Cat(b2, b1))]

        store = Signal()
        value = Signal(8)
        with m.If(self.i.valid):
            with m.If(byte == FLAG):
                m.d.comb += self.closed.eq(esc | overflow | (count != 0))
            with m.Elif(esc):
                m.d.comb += [store.eq(1), value.eq(byte ^ 0x20)]
                m.d.sync += esc.eq(0)
            with m.Elif(byte == ESC):
                m.d.sync += esc.eq(1)
            with m.Else():
                m.d.comb += [store.eq(1), value.eq(byte)]
        with m.If(store):
            with m.If(count == max_body):
                m.d.sync += overflow.eq(1)
            with m.Else():
                m.d.comb += [self.stage.addr.eq(count), self.stage.data.eq(value),
                             self.stage.en.eq(1)]
                m.d.sync += [count.eq(count + 1), b1.eq(value), b2.eq(b1)]
                with m.If(count >= 2):
                    m.d.sync += crc.eq(crc16_byte(crc, b2))
                with m.Switch(count):
                    with m.Case(0):
                        m.d.sync += self.type.eq(value)
                    with m.Case(1):
                        m.d.sync += self.seq.eq(value)
                    for k in range(HEADER_BYTES):
                        with m.Case(2 + k):
                            m.d.sync += self.header[8 * k:8 * k + 8].eq(value)
        with m.If(self.clear):
            m.d.sync += [count.eq(0), esc.eq(0), overflow.eq(0), crc.eq(0xFFFF)]
        return m

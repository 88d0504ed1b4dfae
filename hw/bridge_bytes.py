"""Byte-level parts of the host bridge (:mod:`elmoe3d.hw.bridge`): the CRC-16 update of one
byte, the byte multiplexer of the transmit side, the byte-wide word fetch shared with the
board's stand-in readers, and the HOST / LINK word FIFO stored as bytes (``docs/fpga.md``,
"Bridge hardware").

Why bytes: yosys wraps a W-wide two-port block RAM in about 530 LUT4 and 510-1030 FF of
read-during-write logic; a byte-wide one costs a few. Words are assembled in W-bit shift
registers (flip-flops with enable, no multiplexer).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import stream
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..sw.golden.bridge import crc16
from .checked import CheckedComponent, check_param
from .layouts import address_bits


__all__ = ["crc16_byte", "byte_mux", "byte_word_fetch", "ByteWordFIFO"]


def crc16_byte(crc, byte):
    """CRC-16/CCITT-FALSE register after one byte (combinational): the golden bitwise update
    (:func:`elmoe3d.sw.golden.bridge.crc16`, MSB first) is linear over GF(2), so each of the 16
    result bits is the XOR of fixed register and data bits, found by running the golden
    update on unit vectors. ``crc``: 16 bits, ``byte``: 8 bits; returns 16 bits."""
    def golden(c, d):
        return crc16(bytes((d,)), c)
    terms = [[] for _ in range(16)]
    for k in range(16):
        out = golden(1 << k, 0)
        for i in range(16):
            if out >> i & 1:
                terms[i].append(crc[k])
    for k in range(8):
        out = golden(0, 1 << k)
        for i in range(16):
            if out >> i & 1:
                terms[i].append(byte[k])
    bits = []
    for t in terms:
        v = t[0]
        for x in t[1:]:
            v = v ^ x
        bits.append(v)
    return Cat(*bits)


def byte_mux(value, index, nbytes: int):
    """Byte ``index`` of ``value`` (``nbytes`` bytes) as a binary tree of 2:1 multiplexers
    (what LUT4 + PFUMX / L6MUX map well; a variable ``word_select`` becomes a barrel
    shifter)."""
    level = [value[8 * k:8 * k + 8] for k in range(nbytes)]
    bit = 0
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        level = [Mux(index[bit], level[2 * k + 1], level[2 * k])
                 for k in range(len(level) // 2)]
        bit += 1
    return level[0]


def byte_word_fetch(m, name: str, rd, word_bytes: int, out, clear=None):
    """Logic that reads one W-bit word (``word_bytes`` bytes) out of a byte-wide memory
    through its synchronous read port ``rd`` (byte address = word address * W/8 + lane), one
    byte a cycle, into a W-bit shift register (flip-flops with enable: no multiplexer), and
    offers it on the stream ``out`` until taken.

    Returns ``(start, addr, idle)``: the caller drives ``start`` (1 cycle) with the word
    address ``addr`` when ``idle`` (no fetch in flight, and nothing on offer or the word on
    offer taken this cycle). A word takes ``W/8 + 2`` cycles from ``start`` to
    ``out.valid``; with ``out.ready`` high, back-to-back fetches deliver one word every
    ``W/8 + 2`` cycles. ``clear`` (optional 1-bit signal): drops the fetch in flight and the
    word on offer (the soft reset of a HELLO). Shared by the bridge's HOST / LINK
    FIFOs (:class:`ByteWordFIFO`) and the board's stand-in readers (module docstring: why
    byte-wide)."""
    lane_bits = address_bits(word_bytes)
    word_bits_ = len(rd.addr) - lane_bits
    start = Signal(name=f"{name}_start")
    addr = Signal(max(1, word_bits_), name=f"{name}_addr")
    word = Signal(max(1, word_bits_), name=f"{name}_word")
    lane = Signal(lane_bits, name=f"{name}_lane")
    issuing = Signal(name=f"{name}_issuing")
    dv = Signal(name=f"{name}_dv")
    dlast = Signal(name=f"{name}_dlast")
    obuf = Signal(8 * word_bytes, name=f"{name}_obuf")
    ovalid = Signal(name=f"{name}_ovalid")
    idle = Signal(name=f"{name}_idle")
    m.d.comb += [idle.eq(~issuing & ~dv & (~ovalid | out.ready)), rd.en.eq(issuing),
                 rd.addr.eq(Cat(lane, word) if word_bits_ > 0 else lane),
                 out.valid.eq(ovalid), out.payload.eq(obuf)]
    with m.If(start):
        m.d.sync += [word.eq(addr), lane.eq(0), issuing.eq(1)]
    with m.If(issuing):
        m.d.sync += lane.eq(lane + 1)
        with m.If(lane == word_bytes - 1):
            m.d.sync += issuing.eq(0)
    m.d.sync += [dv.eq(issuing), dlast.eq(issuing & (lane == word_bytes - 1))]
    with m.If(dv):
        m.d.sync += obuf.eq(Cat(obuf[8:], rd.data))
    with m.If(out.valid & out.ready):
        m.d.sync += ovalid.eq(0)
    with m.If(dv & dlast):
        m.d.sync += ovalid.eq(1)
    if clear is not None:
        with m.If(clear):
            m.d.sync += [issuing.eq(0), dv.eq(0), dlast.eq(0), ovalid.eq(0)]
    return start, addr, idle


class ByteWordFIFO(CheckedComponent):
    """A FIFO of W-bit words stored as bytes in a byte-wide block RAM (module docstring):
    written a byte a cycle, read a word at a time through :func:`byte_word_fetch`. The
    bridge's HOST and LINK FIFOs.

    Ports
    -----
    w_en, w_data : In(1), In(8)
        A byte write: the bytes of a word lane 0 (least significant) to ``word_bytes - 1``
        in consecutive writes (not necessarily adjacent cycles). The writer keeps to
        :attr:`free` (a write into a full FIFO is not checked).
    r : Out, ``stream.Signature(8 * word_bytes)``
        The words, in order: :attr:`latency` cycles from the cycle a word's last byte is
        written (nothing else queued) to ``r.valid``; one word every ``word_bytes + 2``
        cycles when ``r.ready`` stays high.
    free : Out(16)
        Words not taken: ``depth`` minus the words completed and not yet taken through
        ``r`` (combinational from registers).
    clear : In(1)
        Empties the FIFO in the next cycle (the word on offer and the fetch in flight
        included). The memory's contents are left as they are.

    Parameters
    ----------
    depth : int
        Words (2..65535; :attr:`free` is 16 bits).
    word_bytes : int
        W/8, a power of two >= 1.

    Raises
    ------
    ValueError
        A parameter out of range (named).
    """

    @classmethod
    def check(cls, *, depth, word_bytes):
        """The constructor's checks (:class:`~elmoe3d.hw.checked.CheckedComponent`)."""
        check_param("depth", depth, 2, 0xFFFF)
        check_param("word_bytes", word_bytes)
        if word_bytes & (word_bytes - 1):
            raise ValueError(f"word_bytes: expected a power of two, got {word_bytes}")

    def __init__(self, *, depth: int, word_bytes: int):
        self._depth, self._word_bytes = depth, word_bytes
        super().__init__({
            "w_en": In(1),
            "w_data": In(8),
            "r": Out(stream.Signature(unsigned(8 * word_bytes))),
            "free": Out(16),
            "clear": In(1),
        })

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def word_bytes(self) -> int:
        return self._word_bytes

    @property
    def latency(self) -> int:
        """Cycles from the cycle a word's last byte is written (into an empty FIFO) to the
        first cycle of ``r.valid``: 1 (the word counts as stored) + the fetch's
        ``word_bytes + 2`` (:func:`byte_word_fetch`)."""
        return self._word_bytes + 3

    def elaborate(self, platform):
        m = Module()
        depth, wb = self._depth, self._word_bytes
        wb_log = wb.bit_length() - 1
        flush = self.clear
        m.submodules.mem = mem = Memory(shape=8, depth=depth * wb, init=[])
        w, r = mem.write_port(), mem.read_port()
        start, addr, idle = byte_word_fetch(m, "fetch", r, wb, self.r, clear=flush)
        wptr = Signal(range(depth))
        rptr = Signal(range(depth))
        wlane = Signal(max(1, wb_log))
        stored = Signal(range(depth + 1))                # not yet fetched
        level = Signal(range(depth + 1))                 # not yet taken
        we = self.w_en
        m.d.comb += [w.addr.eq(Cat(wlane, wptr)), w.en.eq(we), w.data.eq(self.w_data)]
        done = we & (wlane == wb - 1)                    # a word complete
        with m.If(we):
            m.d.sync += wlane.eq(wlane + 1)
            with m.If(done):
                m.d.sync += wptr.eq(Mux(wptr == depth - 1, 0, wptr + 1))
        fetch = idle & (stored != 0)
        m.d.comb += [start.eq(fetch), addr.eq(rptr)]
        with m.If(fetch):
            m.d.sync += rptr.eq(Mux(rptr == depth - 1, 0, rptr + 1))
        m.d.sync += [stored.eq(stored + done - fetch),
                     level.eq(level + done - (self.r.valid & self.r.ready))]
        m.d.comb += self.free.eq(depth - level)
        with m.If(flush):
            m.d.sync += [wptr.eq(0), rptr.eq(0), wlane.eq(0), stored.eq(0), level.eq(0)]
        return m

"""EXT read streamer of the logic die: external-memory read descriptors -> word reads of the
LPDDR5 controller -> streamline-ring flits, unicast or multicast (paper Section 4.1, Fig. 6
right: "a memory controller orchestrates data flow from both tiers ... streamline data
circulates across PE groups and is written to WMEM"; Section 5.1: EXT weights shared across PEs
for data parallelism).

A descriptor (:func:`ext_read_layout`) names ``words`` W-bit PE words at EXT word address
``addr`` and the PEs that receive them (``dst_mask``, one bit per PE of the die). The streamer
issues one word read per descriptor as soon as it is taken (descriptors are pipelined: the
next read is issued while the previous one's data still streams, up to :attr:`inflight`
descriptors) and cuts the returned words into flits of the ring
(:func:`elmoe3d.hw.ring.ring_flit_layout`; the golden cut is
:func:`elmoe3d.sw.golden.ring.ring_flits`): ``words_per_flit`` words per flit when a flit holds
several (the transfer's last flit partly filled), or ``flits_per_word`` flits per word; the
transfer's last flit has ``last`` set; ``stream`` numbers the descriptors (modulo
``2^stream_bits``).
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..sw.golden.ring import ring_geometry
from .checked import CheckedComponent, check_param
from .dram_port import word_beat_layout
from .load_router import ADDR_BITS, WORDS_BITS, hb_read_layout
from .ring import ring_flit_layout


__all__ = ["ExtStreamer", "ext_read_layout"]


def ext_read_layout(pes: int) -> data.StructLayout:
    """One EXT read descriptor of a die with ``pes`` PEs: ``addr`` (:data:`ADDR_BITS`, EXT
    address in W-bit PE words), ``words`` (:data:`WORDS_BITS`, >= 1), ``dst_mask`` (``pes``
    bits, bit p = PE p; several = multicast)."""
    check_param("pes", pes)
    return data.StructLayout({"addr": unsigned(ADDR_BITS), "words": unsigned(WORDS_BITS),
                              "dst_mask": unsigned(pes)})


class ExtStreamer(CheckedComponent):
    """Descriptors -> word reads -> ring flits (module docstring).

    Ports
    -----
    desc : In, :func:`ext_read_layout`
        EXT read descriptors, served in order.
    rd_req : Out, :func:`elmoe3d.hw.load_router.hb_read_layout`
        One word read per descriptor (to :class:`elmoe3d.hw.dram_port.DramWordPort` of the
        LPDDR5 controller).
    rd_data : In, W bits (``lanes`` = 1) or :func:`elmoe3d.hw.dram_port.word_beat_layout`
        The words read, in order: one a beat, or up to ``lanes`` a beat cut as
        :func:`elmoe3d.sw.golden.ring.word_beats` (a beat never crosses a multiple of
        ``lanes`` words from the descriptor's first word, so it never straddles a flit).
    inject : Out, :func:`elmoe3d.hw.ring.ring_flit_layout`
        Flits into the streamline ring.

    Throughput: one flit per cycle (a flit of ``k`` words takes ``k / lanes`` beats to fill
    when a flit holds several words, ``k`` cycles at one word a beat; one word per
    ``flits_per_word`` cycles otherwise). Latency:
    :attr:`latency` = 1 cycle from the last word of a flit on ``rd_data`` to the flit on
    ``inject``.

    Parameters
    ----------
    pes, word_bits, flit_bytes, stream_bits : int
        As :class:`elmoe3d.hw.ring.StreamlineRing`.
    inflight : int
        Descriptors read and not yet streamed out (>= 1).
    lanes : int
        Words per ``rd_data`` beat at most: 1, or a power of two dividing
        ``words_per_flit`` (the small die at 8 EXT channels: 2, a flit a cycle).

    Raises
    ------
    ValueError
        A parameter out of range (named), or W and the flit not dividing one another.
    """

    @classmethod
    def check(cls, *, pes, word_bits, flit_bytes, stream_bits, inflight, lanes=1):
        """The constructor's checks (:class:`~elmoe3d.hw.checked.CheckedComponent`):
        raises before the object exists."""
        for name, value, lo in (("pes", pes, 1), ("stream_bits", stream_bits, 1),
                                ("inflight", inflight, 1), ("lanes", lanes, 1)):
            check_param(name, value, lo)
        per, _ = ring_geometry(word_bits=word_bits, flit_bytes=flit_bytes)
        if lanes & (lanes - 1) or per % lanes:
            raise ValueError(f"lanes: expected a power of two dividing the {per} words of a "
                             f"flit, got {lanes}")

    def __init__(self, *, pes: int, word_bits: int, flit_bytes: int, stream_bits: int,
                 inflight: int = 4, lanes: int = 1):
        self._per, self._span = ring_geometry(word_bits=word_bits, flit_bytes=flit_bytes)
        self._pes, self._w, self._fb, self._sb = pes, word_bits, flit_bytes, stream_bits
        self._inflight, self._lanes = inflight, lanes
        beat = unsigned(word_bits) if lanes == 1 else word_beat_layout(word_bits, lanes)
        self._flit = ring_flit_layout(pes=pes, word_bits=word_bits, flit_bytes=flit_bytes,
                                      stream_bits=stream_bits)
        super().__init__({
            "desc": In(stream.Signature(ext_read_layout(pes))),
            "rd_req": Out(stream.Signature(hb_read_layout())),
            "rd_data": In(stream.Signature(beat)),
            "inject": Out(stream.Signature(self._flit)),
        })

    pes = property(lambda self: self._pes)
    word_bits = property(lambda self: self._w)
    flit_bytes = property(lambda self: self._fb)
    stream_bits = property(lambda self: self._sb)
    inflight = property(lambda self: self._inflight)
    lanes = property(lambda self: self._lanes, doc="Words per ``rd_data`` beat at most.")
    words_per_flit = property(lambda self: self._per)
    flits_per_word = property(lambda self: self._span)
    latency = property(lambda self: 1, doc="Cycles from a flit's last word to the flit.")

    def elaborate(self, platform):
        m = Module()
        W, FB = self._w, self._fb * 8
        per, span = self._per, self._span
        info = data.StructLayout({"words": unsigned(WORDS_BITS), "dst_mask": unsigned(self._pes),
                                  "stream": unsigned(self._sb)})
        m.submodules.q = q = SyncFIFO(width=info.size, depth=self._inflight)
        sid = Signal(self._sb)
        w_info = data.View(info, q.w_data)
        d = self.desc.payload
        m.d.comb += [
            self.rd_req.payload.addr.eq(d.addr),
            self.rd_req.payload.words.eq(d.words),
            self.rd_req.valid.eq(self.desc.valid & q.w_rdy & (d.words != 0)),
            self.desc.ready.eq(q.w_rdy & ((d.words == 0) | self.rd_req.ready)),
            w_info.words.eq(d.words), w_info.dst_mask.eq(d.dst_mask), w_info.stream.eq(sid),
            q.w_en.eq(self.desc.valid & self.desc.ready & (d.words != 0)),
        ]
        with m.If(q.w_en):
            m.d.sync += sid.eq(sid + 1)

        head = data.View(info, q.r_data)
        cnt = Signal(WORDS_BITS)                     # words of the head transfer taken
        o_valid = Signal()
        o_flit = Signal(self._flit)
        o_free = ~o_valid | self.inject.ready
        m.d.comb += [self.inject.valid.eq(o_valid), self.inject.payload.eq(o_flit)]
        with m.If(self.inject.valid & self.inject.ready):
            m.d.sync += o_valid.eq(0)
        L = self._lanes
        if L == 1:
            n_in, beat = 1, self.rd_data.payload
        else:
            n_in, beat = self.rd_data.payload.words, self.rd_data.payload.data
        last_word = cnt + n_in == head.words
        if span == 1:
            buf = Signal(FB)
            fill = Signal(range(per + 1))            # words in buf
            take = Signal()
            full = (fill + n_in == per) | last_word  # this beat completes a flit
            m.d.comb += [take.eq(self.rd_data.valid & q.r_rdy & (~full | o_free)),
                         self.rd_data.ready.eq(take)]
            word_in = Signal(FB)
            m.d.comb += word_in.eq(buf)
            if per > 1 and L == 1:
                m.d.comb += word_in.word_select(fill, W).eq(beat)
            elif per > 1:
                for i in range(L):                   # beat slot i -> flit slot fill + i
                    with m.If(i < n_in):
                        m.d.comb += word_in.word_select(fill + i, W).eq(
                            beat.word_select(i, W))
            else:
                m.d.comb += word_in.eq(beat)
            with m.If(take):
                with m.If(full):
                    m.d.sync += [o_valid.eq(1), o_flit.data.eq(word_in),
                                 o_flit.dst_mask.eq(head.dst_mask), o_flit.stream.eq(head.stream),
                                 o_flit.last.eq(last_word), o_flit.words.eq(fill + n_in),
                                 fill.eq(0), buf.eq(0)]
                with m.Else():
                    m.d.sync += [buf.eq(word_in), fill.eq(fill + n_in)]
        else:
            part = Signal(range(span))
            take = Signal()
            m.d.comb += [take.eq(self.rd_data.valid & q.r_rdy & o_free),
                         self.rd_data.ready.eq(take & (part == span - 1))]
            with m.If(take):
                m.d.sync += [o_valid.eq(1),
                             o_flit.data.eq(self.rd_data.payload.word_select(part, FB)),
                             o_flit.dst_mask.eq(head.dst_mask), o_flit.stream.eq(head.stream),
                             o_flit.last.eq(last_word & (part == span - 1)), o_flit.words.eq(1),
                             part.eq(Mux(part == span - 1, 0, part + 1))]
        word_taken = self.rd_data.valid & self.rd_data.ready
        with m.If(word_taken):
            with m.If(last_word):
                m.d.comb += q.r_en.eq(1)
                m.d.sync += cnt.eq(0)
            with m.Else():
                m.d.sync += cnt.eq(cnt + n_in)
        return m

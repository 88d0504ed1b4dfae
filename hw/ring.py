"""Streamline ring: external weight data to the PEs' ``ext`` ports, unicast and multicast
(paper Section 4.1, Fig. 6: "streamline data circulates across PE groups and is written to
WMEM"; Table 1: 128 GB/s).

:class:`RingStation` is one stop of the ring (one per PE group); :class:`StreamlineRing` chains
the stations behind the injection port of the external-memory controller. Golden model:
:func:`elmoe3d.sw.golden.ring.ref_ring` (flits :class:`elmoe3d.sw.golden.ring.RingFlit`, cut from word
transfers by :func:`elmoe3d.sw.golden.ring.ring_flits`); flit payloads :func:`ring_flit_layout`,
packed by :func:`pack_flit`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..sw.golden.ring import RingFlit, ring_geometry
from .checked import check_param


__all__ = ["ring_flit_layout", "pack_flit", "RingStation", "StreamlineRing",
           "DEFAULT_BUFFER_FLITS", "DEFAULT_STREAM_BITS"]

#: Per-PE flit FIFO depth of :meth:`StreamlineRing.from_arch` unless given.
DEFAULT_BUFFER_FLITS = 8
#: Stream-id bits of :meth:`StreamlineRing.from_arch` unless given.
DEFAULT_STREAM_BITS = 4


def _geometry(word_bits, flit_bytes):
    check_param("word_bits", word_bits, 8)
    check_param("flit_bytes", flit_bytes)
    return ring_geometry(word_bits=word_bits, flit_bytes=flit_bytes)


def ring_flit_layout(*, pes: int, word_bits: int, flit_bytes: int,
                     stream_bits: int) -> data.StructLayout:
    """One streamline flit: ``flit_bytes`` of data plus the header.

    Fields
    ------
    data : unsigned(8 flit_bytes)
        Payload (see :class:`~elmoe3d.sw.golden.ring.RingFlit`: word slot j at bits ``[j W,
        (j+1) W)`` when a flit holds several words; part t of a word when a word spans flits).
    dst_mask : unsigned(pes)
        One bit per PE of the die; multicast when several.
    stream : unsigned(stream_bits)
        Stream id (carried, never reordered).
    last : unsigned(1)
        Last flit of its stream's transfer (carried).
    words : unsigned(bit_length(words_per_flit))
        Valid word slots (1..words_per_flit); 1 when a word spans flits.
    """
    check_param("pes", pes)
    check_param("stream_bits", stream_bits)
    per, _ = _geometry(word_bits, flit_bytes)
    return data.StructLayout({
        "data": unsigned(8 * flit_bytes),
        "dst_mask": unsigned(pes),
        "stream": unsigned(stream_bits),
        "last": unsigned(1),
        "words": unsigned(per.bit_length()),
    })


def pack_flit(flit: RingFlit, *, pes: int, word_bits: int, flit_bytes: int,
              stream_bits: int) -> int:
    """:class:`~elmoe3d.sw.golden.ring.RingFlit` -> :func:`ring_flit_layout` payload integer (checked
    with :meth:`RingFlit.check <elmoe3d.sw.golden.ring.RingFlit.check>`: ValueError naming the
    field)."""
    if not isinstance(flit, RingFlit):
        raise ValueError(f"flit: expected a RingFlit, got {type(flit).__name__}")
    flit.check(pes=pes, word_bits=word_bits, flit_bytes=flit_bytes, stream_bits=stream_bits)
    layout = ring_flit_layout(pes=pes, word_bits=word_bits, flit_bytes=flit_bytes,
                              stream_bits=stream_bits)
    return layout.const({"data": flit.data, "dst_mask": flit.dst_mask, "stream": flit.stream,
                         "last": int(bool(flit.last)), "words": flit.words}).as_bits()


class RingStation(wiring.Component):
    """One streamline-ring station, serving PEs ``first_pe .. first_pe + local_pes - 1``.

    Parameters (keyword-only, read-only properties)
    ----------
    pes : int
        PEs of the die (width of ``dst_mask``).
    first_pe, local_pes : int
        The PEs of this station's group.
    word_bits : int
        W, bits of an ``ext`` word.
    flit_bytes : int
        Flit payload bytes (``ArchConfig.streamline_bytes_per_cycle``: 128 B at 1 GHz =
        128 GB/s). One of W and ``8 flit_bytes`` divides the other
        (:func:`~elmoe3d.sw.golden.ring.ring_geometry`).
    stream_bits : int
        Bits of the stream id.
    buffer_flits : int
        Depth of every local PE's flit FIFO (>= 1).

    Ports
    -----
    ring_i : In stream of :func:`ring_flit_layout`
        From the previous station (or the injection port).
    ring_o : Out stream of :func:`ring_flit_layout`
        To the next station: the flits that still name PEs after this group, with this
        group's bits cleared (from a two-flit output FIFO: ``ring_i.ready`` does not depend on
        ``ring_o.ready`` in the same cycle, so no combinational ready path runs along the
        ring).
    ext[i] : Out stream, unsigned(W)
        To PE ``first_pe + i``: the words of the flits naming it, in arrival order.

    Behaviour
    ---------
    A flit is taken from ``ring_i`` when every local PE it names has room in its FIFO and,
    if it names PEs after this group, the output FIFO has room (bits of PEs before the group
    are ignored: the stations before it cleared them; the last station, with no PE after its
    group, never forwards and builds no output); it is
    then written into those FIFOs and forwarded in the same cycle (multicast costs no extra
    cycles). Flits are never reordered, dropped or duplicated; a flit naming no PE is taken
    and dropped. Behind each FIFO a width converter emits words: a flit holding several words
    gives its ``words`` valid slots, one per cycle, lowest first; a word spanning S flits is
    assembled from S consecutive flits (lowest bits first) and emitted in one cycle.

    Throughput: one flit per cycle through the station; per PE, ``min(flit, W)`` bits per
    cycle. Latency: :attr:`latency` = 1 cycle from ``ring_i`` taking a flit to it on
    ``ring_o`` and, for a local PE, to its (last) word offered on ``ext``.
    """

    def __init__(self, *, pes, first_pe, local_pes, word_bits, flit_bytes, stream_bits,
                 buffer_flits):
        check_param("pes", pes)
        check_param("first_pe", first_pe, 0)
        check_param("local_pes", local_pes)
        if first_pe + local_pes > pes:
            raise ValueError(f"first_pe: PEs {first_pe}..{first_pe + local_pes - 1} are "
                             f"beyond the die's {pes}")
        check_param("stream_bits", stream_bits)
        check_param("buffer_flits", buffer_flits)
        self._per, self._span = _geometry(word_bits, flit_bytes)
        self._pes, self._first, self._local = pes, first_pe, local_pes
        self._w, self._fb, self._sb, self._depth = word_bits, flit_bytes, stream_bits, buffer_flits
        layout = ring_flit_layout(pes=pes, word_bits=word_bits, flit_bytes=flit_bytes,
                                  stream_bits=stream_bits)
        super().__init__({
            "ring_i": In(stream.Signature(layout)),
            "ring_o": Out(stream.Signature(layout)),
            "ext": Out(stream.Signature(unsigned(word_bits))).array(local_pes),
        })

    pes = property(lambda self: self._pes, doc="PEs of the die.")
    first_pe = property(lambda self: self._first, doc="First PE of this station.")
    local_pes = property(lambda self: self._local, doc="PEs of this station.")
    word_bits = property(lambda self: self._w, doc="W, bits per ``ext`` word.")
    flit_bytes = property(lambda self: self._fb, doc="Flit payload bytes.")
    stream_bits = property(lambda self: self._sb, doc="Stream-id bits.")
    buffer_flits = property(lambda self: self._depth, doc="Per-PE FIFO depth in flits.")
    words_per_flit = property(lambda self: self._per,
                              doc="Words a flit holds (1 when a word spans flits).")
    flits_per_word = property(lambda self: self._span,
                              doc="Flits a word spans (1 when a flit holds whole words).")

    @property
    def latency(self) -> int:
        """Cycles from a flit taken on ``ring_i`` to it on ``ring_o`` / its word on ``ext``."""
        return 1

    def elaborate(self, platform):
        m = Module()
        W, FB, L, f0 = self._w, 8 * self._fb, self._local, self._first
        per, span = self._per, self._span
        nwb = per.bit_length()
        flit = self.ring_i.payload
        local = flit.dst_mask[f0:f0 + L]
        # Bits of the PEs after this group (those before it were cleared upstream).
        rest = Signal(self._pes)
        m.d.comb += rest.eq(flit.dst_mask & ~((1 << (f0 + L)) - 1))

        fifos = []
        for p in range(L):
            fifo = SyncFIFO(width=FB + nwb, depth=self._depth)
            m.submodules[f"fifo{p}"] = fifo
            fifos.append(fifo)
        room = Cat(f.w_rdy | ~local[p] for p, f in enumerate(fifos)).all()

        # Output: a two-flit FIFO, so ring_i.ready never waits on ring_o.ready combinationally
        # (no ready path along the ring) and a flit a cycle still passes.
        # The last station (no PE after its group) forwards nothing and builds no output.
        if f0 + L < self._pes:
            layout = self.ring_o.payload.shape()
            out = m.submodules.out = SyncFIFO(width=layout.size, depth=2)
            fwd = Signal(layout)
            m.d.comb += [fwd.eq(flit), fwd.dst_mask.eq(rest)]
            m.d.comb += [self.ring_o.valid.eq(out.r_rdy), self.ring_o.payload.eq(out.r_data),
                         out.r_en.eq(self.ring_o.ready), out.w_data.eq(fwd),
                         self.ring_i.ready.eq(room & ((rest == 0) | out.w_rdy))]
            take = self.ring_i.valid & self.ring_i.ready
            m.d.comb += out.w_en.eq(take & (rest != 0))
        else:
            m.d.comb += self.ring_i.ready.eq(room)
            take = self.ring_i.valid & self.ring_i.ready

        for p, fifo in enumerate(fifos):
            ext = self.ext[p]
            m.d.comb += [fifo.w_en.eq(take & local[p]), fifo.w_data.eq(Cat(flit.data, flit.words))]
            head = fifo.r_data[:FB]
            nwords = fifo.r_data[FB:]
            if span == 1:
                m.d.comb += ext.valid.eq(fifo.r_rdy)
                if per == 1:
                    m.d.comb += [ext.payload.eq(head), fifo.r_en.eq(ext.ready)]
                else:
                    slot = Signal(range(per), name=f"slot{p}")
                    end = slot + 1 >= nwords
                    m.d.comb += [ext.payload.eq(head.word_select(slot, W)),
                                 fifo.r_en.eq(ext.ready & end)]
                    with m.If(ext.valid & ext.ready):
                        m.d.sync += slot.eq(Mux(end, 0, slot + 1))
            else:
                part = Signal(range(span), name=f"part{p}")
                regs = [Signal(FB, name=f"part{p}_{t}") for t in range(span - 1)]
                whole = part == span - 1
                m.d.comb += [ext.valid.eq(fifo.r_rdy & whole),
                             ext.payload.eq(Cat(*regs, head)),
                             fifo.r_en.eq(Mux(whole, ext.ready, 1))]
                with m.If(fifo.r_rdy & fifo.r_en):
                    m.d.sync += part.eq(Mux(whole, 0, part + 1))
                    for t in range(span - 1):
                        with m.If(part == t):
                            m.d.sync += regs[t].eq(head)
        return m


class StreamlineRing(wiring.Component):
    """The streamline ring of the die: one :class:`RingStation` per PE group behind the
    external-memory controller's injection port (paper Section 4.1; 128 GB/s).

    Parameters (keyword-only, read-only properties)
    ----------
    pes, pes_per_group : int
        PEs of the die and of a group (``ArchConfig.pes``, ``pes_per_group``); groups =
        stations = ``pes / pes_per_group``.
    word_bits, flit_bytes, stream_bits, buffer_flits : int
        As in :class:`RingStation`.

    Ports
    -----
    inject : In stream of :func:`ring_flit_layout`
        Flits from the external-memory controller, entering before station 0.
    ext[p] : Out stream, unsigned(W)
        To PE p (the ``ext`` port of station ``p // pes_per_group``).

    Topology and deadlock rule: flits travel station 0 -> 1 -> ... -> groups-1, each station
    clearing its PEs' bits, so a flit has left the ring once its last named group has taken it:
    every flit is delivered within one lap and never passes the injection point again. The
    segment that would close the loop (last station back to the injection point) therefore
    never carries a flit and is not built; with no cyclic channel dependency there is no
    deadlock, and the injection port simply holds (``inject.ready`` low) while the ring is
    full. A PE that stops reading its ``ext`` port holds up the flits behind the one waiting
    for its FIFO (head-of-line blocking); the external controller must only send a PE the
    data of LOADs that PE has issued or will issue without waiting on another PE's EXT data
    (``docs/memory.md``).

    Guarantees (checked against :func:`~elmoe3d.sw.golden.ring.ref_ring`): every PE receives the
    words of the flits naming it exactly once, intact, in injection order (so in order
    within every stream). Throughput: one flit (``flit_bytes``) per cycle at the injection
    port while the PEs named drain their words (each PE port takes ``min(flit, W)`` bits per
    cycle). Latency: :attr:`latency` ``[g]`` = g + 1 cycles from a flit taken on ``inject``
    to its (last) word offered to a PE of group g.
    """

    def __init__(self, *, pes, pes_per_group, word_bits, flit_bytes,
                 stream_bits=DEFAULT_STREAM_BITS, buffer_flits=DEFAULT_BUFFER_FLITS):
        check_param("pes", pes)
        check_param("pes_per_group", pes_per_group)
        if pes % pes_per_group:
            raise ValueError(f"pes: {pes} is not a multiple of pes_per_group ({pes_per_group})")
        check_param("stream_bits", stream_bits)
        check_param("buffer_flits", buffer_flits)
        self._per, self._span = _geometry(word_bits, flit_bytes)
        self._pes, self._ppg = pes, pes_per_group
        self._w, self._fb, self._sb, self._depth = word_bits, flit_bytes, stream_bits, buffer_flits
        super().__init__({
            "inject": In(stream.Signature(self.flit_layout)),
            "ext": Out(stream.Signature(unsigned(word_bits))).array(pes),
        })

    @staticmethod
    def arch_params(arch, *, stream_bits=DEFAULT_STREAM_BITS,
                    buffer_flits=DEFAULT_BUFFER_FLITS) -> dict:
        """The constructor keywords of the ring of ``arch``
        (:class:`~elmoe3d.config.ArchConfig`): its PEs and groups, W = ``pe.word_bits``, flits
        of ``streamline_bytes_per_cycle``; ``ValueError`` if that is not whole bytes."""
        fb = arch.streamline_bytes_per_cycle
        if fb != int(fb):
            raise ValueError(f"streamline_gbps: {arch.streamline_gbps} GB/s at "
                             f"{arch.clock_ghz} GHz is not a whole number of bytes per cycle")
        return dict(pes=arch.pes, pes_per_group=arch.pes_per_group, word_bits=arch.pe.word_bits,
                    flit_bytes=int(fb), stream_bits=stream_bits, buffer_flits=buffer_flits)

    @classmethod
    def from_arch(cls, arch, **kwargs) -> "StreamlineRing":
        """The ring of ``arch``: :meth:`arch_params` (``stream_bits``, ``buffer_flits``)."""
        return cls(**cls.arch_params(arch, **kwargs))

    @staticmethod
    def station(g, *, pes, pes_per_group, word_bits, flit_bytes, stream_bits,
                buffer_flits) -> RingStation:
        """Station ``g`` of the ring of these constructor keywords (:meth:`arch_params`)."""
        return RingStation(pes=pes, first_pe=g * pes_per_group, local_pes=pes_per_group,
                           word_bits=word_bits, flit_bytes=flit_bytes, stream_bits=stream_bits,
                           buffer_flits=buffer_flits)

    pes = property(lambda self: self._pes, doc="PEs of the die.")
    pes_per_group = property(lambda self: self._ppg, doc="PEs per group (per station).")
    groups = property(lambda self: self._pes // self._ppg, doc="Stations.")
    word_bits = property(lambda self: self._w, doc="W, bits per ``ext`` word.")
    flit_bytes = property(lambda self: self._fb, doc="Flit payload bytes.")
    stream_bits = property(lambda self: self._sb, doc="Stream-id bits.")
    buffer_flits = property(lambda self: self._depth, doc="Per-PE FIFO depth in flits.")
    words_per_flit = property(lambda self: self._per, doc="Words a flit holds.")
    flits_per_word = property(lambda self: self._span, doc="Flits a word spans.")

    @property
    def flit_layout(self) -> data.StructLayout:
        """:func:`ring_flit_layout` of this ring."""
        return ring_flit_layout(pes=self._pes, word_bits=self._w, flit_bytes=self._fb,
                                stream_bits=self._sb)

    @property
    def latency(self) -> tuple:
        """Per group g: cycles from ``inject`` taking a flit to its (last) word offered on the
        ``ext`` port of a PE of group g (g + 1: one per station)."""
        return tuple(g + 1 for g in range(self.groups))

    def elaborate(self, platform):
        m = Module()
        prev = self.inject
        for g in range(self.groups):
            st = self.station(g, pes=self._pes, pes_per_group=self._ppg, word_bits=self._w,
                              flit_bytes=self._fb, stream_bits=self._sb,
                              buffer_flits=self._depth)
            m.submodules[f"station{g}"] = st
            if prev is self.inject:
                wiring.connect(m, wiring.flipped(self.inject), st.ring_i)
            else:
                wiring.connect(m, prev, st.ring_i)
            for i in range(self._ppg):
                wiring.connect(m, st.ext[i], wiring.flipped(self.ext[g * self._ppg + i]))
            prev = st.ring_o
        # The last station's ring_o never carries a flit (every bit is cleared by then).
        m.d.comb += prev.ready.eq(1)
        return m

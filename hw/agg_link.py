"""Aggregation link of one PE group: bypass, all-to-all, reduce-add, reduce-max (paper
Section 4.1, Fig. 6 right: "control logic with buffering, bypass, and accumulation support";
Section 5.2: psum-level synchronisation of the MSB/LSB split).

Golden model: :func:`elmoe3d.sw.golden.agg_link.ref_link` (descriptor :class:`elmoe3d.sw.golden.agg_link.LinkOp`).
Descriptor payload: :func:`link_op_layout`, packed from a ``LinkOp`` by :func:`pack_link_op`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..config import LINK_OP_LATENCY, link_latency, link_reduce_stages
from ..sw.golden.agg_link import LinkMode, LinkOp
from ..sw.golden.datapath import INT64_MAX, INT64_MIN
from .checked import check_param
from .layouts import STICKY_LATENCY, sticky_flags


__all__ = ["LinkModeRTL", "link_op_layout", "link_errors_layout", "pack_link_op",
           "AggregationLink", "FlitBuffer", "ReduceTree", "DEFAULT_BUFFER_WORDS"]

#: Destination FIFO depth (W-bit words) of :meth:`AggregationLink.from_arch` unless given.
DEFAULT_BUFFER_WORDS = 32


class LinkModeRTL(enum.Enum, shape=2):
    """RTL encoding of :class:`elmoe3d.sw.golden.agg_link.LinkMode` (the same integer values)."""

    BYPASS = LinkMode.BYPASS.value
    ALL_TO_ALL = LinkMode.ALL_TO_ALL.value
    REDUCE_ADD = LinkMode.REDUCE_ADD.value
    REDUCE_MAX = LinkMode.REDUCE_MAX.value


def link_op_layout(pes: int) -> data.StructLayout:
    """One aggregation-link descriptor for a group of ``pes`` PEs.

    Fields
    ------
    mode : LinkModeRTL
    src_mask, dst_mask : unsigned(pes)
        Bit i = PE i of the group.
    words : unsigned(16)
        W-bit words each source sends.
    chunk : unsigned(16)
        ALL_TO_ALL chunk (words); ignored by the other modes.
    """
    check_param("pes", pes)
    return data.StructLayout({
        "mode": LinkModeRTL,
        "src_mask": unsigned(pes),
        "dst_mask": unsigned(pes),
        "words": unsigned(16),
        "chunk": unsigned(16),
    })


def link_errors_layout() -> data.StructLayout:
    """The aggregation link's sticky error flags (``errors``; ``errors_clear`` has the same
    layout, a write-1-to-clear strobe per bit). The golden classification of a descriptor is
    :func:`elmoe3d.sw.golden.agg_link.link_op_fault`.

    Fields
    ------
    bad_desc : 1
        A descriptor was rejected when taken: ``chunk`` = 0, ``src_mask`` = 0, ``dst_mask`` =
        0, or BYPASS with more than one source. It was dropped; no word moved.
    bad_length : 1
        An ALL_TO_ALL's ``words`` was not a multiple of ``chunk`` x destinations. Detected when
        a source's last word moves (the first word that would leave a chunk or a round of
        destinations unfinished); the descriptor then drains: every source's remaining words
        are taken and dropped, so it finishes.
    """
    return data.StructLayout({"bad_desc": 1, "bad_length": 1})


def pack_link_op(op: LinkOp, pes: int) -> int:
    """:class:`~elmoe3d.sw.golden.agg_link.LinkOp` -> :func:`link_op_layout` payload integer (the masks
    checked against ``pes``; ValueError naming the field)."""
    if not isinstance(op, LinkOp):
        raise ValueError(f"op: expected a LinkOp, got {type(op).__name__}")
    op.check(pes)
    return link_op_layout(pes).const({
        "mode": LinkModeRTL(op.mode.value), "src_mask": op.src_mask, "dst_mask": op.dst_mask,
        "words": op.words, "chunk": op.chunk}).as_bits()


def _lowest(x, width):
    """One-hot lowest set bit of ``x`` (0 if none)."""
    return (x & (~x + 1))[:width]


def _next_bit(cur, mask, width):
    """The lowest bit of ``mask`` above one-hot ``cur``, else (wrapping) the lowest of ``mask``."""
    above = mask & ~(cur | (cur - 1)[:width])
    return Mux(above.any(), _lowest(above, width), _lowest(mask, width))


def _onehot_mux(sel, values):
    """OR of ``values[i]`` where one-hot ``sel[i]`` (``sel`` a Signal)."""
    out = 0
    for i, v in enumerate(values):
        out = out | Mux(sel[i], v, 0)
    return out


class FlitBuffer(wiring.Component):
    """Two-entry FIFO of one source's flits, the aggregation link's input side: ``w_rdy``,
    ``r_rdy`` and ``r_data`` come from registers only, so the ``ready`` the link gives a PE
    depends on no combinational input (a skid buffer between the PE's result path and the
    link's arbitration).

    Parameters
    ----------
    width : int
        Bits of a flit.

    Ports
    -----
    w_data : In(width); w_en : In(1); w_rdy : Out(1)
        A flit is written when ``w_en & w_rdy`` (``w_rdy``: fewer than 2 flits held).
    r_data : Out(width); r_rdy : Out(1); r_en : In(1)
        The oldest flit; it is read (dropped) when ``r_en & r_rdy``.

    Latency 1 (a flit written is readable the next cycle); one flit per cycle in and out at
    once (with 2 flits held the write waits a cycle, the 2 held flits cover it).
    """

    def __init__(self, width):
        check_param("width", width)
        self._width = width
        super().__init__({"w_data": In(width), "w_en": In(1), "w_rdy": Out(1),
                          "r_data": Out(width), "r_rdy": Out(1), "r_en": In(1)})

    @property
    def width(self) -> int:
        """Bits of a flit."""
        return self._width

    def elaborate(self, platform):
        m = Module()
        head = Signal(self._width)
        tail = Signal(self._width)
        n = Signal(range(3))
        push = Signal()
        pop = Signal()
        m.d.comb += [self.w_rdy.eq(n != 2), self.r_rdy.eq(n != 0), self.r_data.eq(head),
                     push.eq(self.w_en & self.w_rdy), pop.eq(self.r_en & self.r_rdy)]
        m.d.sync += n.eq(n + push - pop)
        with m.If(pop & (n == 2)):
            m.d.sync += head.eq(tail)
        with m.Elif(push & ((n == 0) | pop)):
            m.d.sync += head.eq(self.w_data)
        with m.If(push & (n == 1) & ~pop):
            m.d.sync += tail.eq(self.w_data)
        return m


def _clamp(v, lo, hi):
    """``min(max(v, lo), hi)`` for signed values with ``lo <= hi``."""
    return Mux(v < lo, lo, Mux(v > hi, hi, v))


class ReduceTree(wiring.Component):
    """The aggregation link's reduction of one flit of every source (REDUCE_ADD: lane-wise
    saturating signed 64-bit sum in ascending source order; REDUCE_MAX: lane-wise unsigned
    32-bit max), a registered tree of ``stages`` levels.

    The golden sum saturates at every step of the ascending chain
    (:func:`elmoe3d.sw.golden.agg_link.reduce_add_words`), which is not associative; the tree
    is exact anyway because it combines *functions*, not values: source s's step is
    ``f_s(a) = clamp(a + x_s, INT64_MIN, INT64_MAX)``, and a composition of such steps is again
    ``f(a) = clamp(a + S, L, H)`` with ``g o f = (S_f + S_g, clamp(L_f + S_g, L_g, H_g),
    clamp(H_f + S_g, L_g, H_g))`` (``S`` exact, 64 + level bits; ``L <= H`` 64-bit). A tree
    node composes its left (lower sources) and right halves; the result is ``clamp(S, L, H)``
    of the root, the chain applied to 0. A source outside ``mask`` is the identity (x = 0).

    Parameters
    ----------
    pes : int
        G, sources (>= 1).
    flit_bits : int
        Bits of a flit, a multiple of 64.

    Ports
    -----
    i[s] : In(flit_bits)
        Source s's flit.
    mask : In(G)
        Sources that take part (the others count as 0).
    add : In(1)
        1: REDUCE_ADD, 0: REDUCE_MAX (held while the tree holds flits).
    i_valid : In(1); en : In(1)
        Every level register advances when ``en`` (a stall holds the whole tree); ``i_valid``
        marks the flits entering in that cycle.
    o : Out(flit_bits); o_valid : Out(1)
        The reduced flit of the last level (``o_valid``), :attr:`stages` advances after it
        entered.
    pending : Out(1)
        Some level holds a flit.
    """

    def __init__(self, *, pes, flit_bits):
        check_param("pes", pes)
        check_param("flit_bits", flit_bits, 64)
        if flit_bits % 64:
            raise ValueError(f"flit_bits: expected a multiple of 64, got {flit_bits}")
        self._pes, self._fb = pes, flit_bits
        super().__init__({"i": In(flit_bits).array(pes), "mask": In(pes), "add": In(1),
                          "i_valid": In(1), "en": In(1), "o": Out(flit_bits),
                          "o_valid": Out(1), "pending": Out(1)})

    @property
    def pes(self) -> int:
        """G, sources."""
        return self._pes

    @property
    def stages(self) -> int:
        """Register levels: :func:`elmoe3d.config.link_reduce_stages` (G)."""
        return link_reduce_stages(self._pes)

    def elaborate(self, platform):
        m = Module()
        G, lanes = self._pes, self._fb // 64
        lo, hi = Const(INT64_MIN, signed(64)), Const(INT64_MAX, signed(64))
        # a node per lane: (S, L, H); S signed (its low 64 bits hold the REDUCE_MAX lanes)
        nodes = []
        for s in range(G):
            x = Mux(self.mask[s], self.i[s], 0)
            nodes.append([(x[64 * j:64 * (j + 1)].as_signed(), lo, hi) for j in range(lanes)])

        def compose(f, g):                  # g after f: f the lower sources
            out = []
            for (s1, l1, h1), (s2, l2, h2) in zip(f, g):
                mx = Cat(*(Mux(s2[32 * k:32 * (k + 1)] > s1[32 * k:32 * (k + 1)],
                               s2[32 * k:32 * (k + 1)], s1[32 * k:32 * (k + 1)])
                           for k in range(2)))
                out.append((Mux(self.add, s1 + s2, mx), _clamp(l1 + s2, l2, h2),
                            _clamp(h1 + s2, l2, h2)))
            return out

        valid, level = self.i_valid, 0
        valids = []
        while True:
            level += 1
            nxt = [compose(nodes[k], nodes[k + 1]) if k + 1 < len(nodes) else nodes[k]
                   for k in range(0, len(nodes), 2)]
            regs = []
            for t, node in enumerate(nxt):
                rnode = []
                for j, (sv, lv, hv) in enumerate(node):
                    rs = Signal(signed(64 + level), name=f"s{level}_{t}_{j}")
                    rl = Signal(signed(64), name=f"l{level}_{t}_{j}")
                    rh = Signal(signed(64), name=f"h{level}_{t}_{j}")
                    with m.If(self.en):
                        m.d.sync += [rs.eq(sv), rl.eq(lv), rh.eq(hv)]
                    rnode.append((rs, rl, rh))
                regs.append(rnode)
            v = Signal(name=f"v{level}")
            with m.If(self.en):
                m.d.sync += v.eq(valid)
            valids.append(v)
            nodes, valid = regs, v
            if len(nodes) == 1:
                break
        assert level == self.stages
        root = nodes[0]
        m.d.comb += [
            self.o.eq(Cat(*(Mux(self.add, _clamp(sv, lv, hv)[:64], sv[:64])
                            for sv, lv, hv in root))),
            self.o_valid.eq(valid),
            self.pending.eq(Cat(*valids).any()),
        ]
        return m


class AggregationLink(wiring.Component):
    """The aggregation link of a group of G PEs (paper Section 4.1; 32 GB/s per port).

    Parameters (keyword-only, read-only properties)
    ----------
    pes : int
        G, PEs in the group (``ArchConfig.pes_per_group``), >= 1.
    word_bits : int
        W, bits of a PE link word (``ArchConfig.pe.word_bits``); a multiple of ``flit_bytes*8``.
    flit_bytes : int
        Bytes every port moves per cycle (``ArchConfig.aggregation_bytes_per_cycle``: 32 B at
        1 GHz = 32 GB/s); ``flit_bytes * 8`` must be a multiple of 64 and divide W. A word
        crosses the link as ``W / (8 flit_bytes)`` flits, one per cycle per port.
    buffer_words : int
        Depth of every destination FIFO in W-bit words (>= 1).

    Ports
    -----
    op : In stream of :func:`link_op_layout` (G)
        Descriptors, run one at a time in order; taken when the link is idle (or in the cycle
        the running one finishes).
    pe_i[i] : In stream, unsigned(W)
        From PE i's ``link_o``.
    pe_o[i] : Out stream, unsigned(W)
        To PE i's ``link_i``, from PE i's destination FIFO.
    busy : Out(1)
        A descriptor is running (taken and not all its words in the destination FIFOs).
    done : Out(1)
        One-cycle pulse: the running descriptor's last word entered its destination FIFOs
        (a draining descriptor: its last source word was taken). A rejected descriptor never
        runs: no ``busy``, no ``done``.
    errors : Out :func:`link_errors_layout`
        Sticky error flags (``bad_desc``, ``bad_length``), set in the cycle after the event
        (:attr:`errors_latency`; both events last one cycle) and held until cleared by
        ``errors_clear`` (or reset).
    errors_clear : In :func:`link_errors_layout`
        Write-1-to-clear: a 1 clears that flag in the next cycle, unless the same cycle sets
        it again (setting wins).

    Behaviour (bit-exact to :func:`elmoe3d.sw.golden.agg_link.ref_link`)
    ---------
    Each source's words are taken from ``pe_i`` flit by flit into the source's
    :class:`FlitBuffer` (two flits; the word stays presented until its last flit is taken:
    ``pe_i.ready`` pulses with the last flit and comes from registers only, so no path runs
    from the arbitration below back into a PE), flits *move* from the buffers' heads, and each
    destination assembles flits back into words written into its FIFO. A flit moves only when
    every destination FIFO it goes to has room (``w_rdy``), so destinations are decoupled from
    their PEs by ``buffer_words`` words. A source's words are taken only while its descriptor
    runs and until ``words`` are in. Per mode:

    * BYPASS: the source's flit goes to every destination at once (multicast).
    * ALL_TO_ALL: source s points at the destination of its current chunk (dst_mask bits in
      ascending order, advancing every ``chunk`` words), destination d at the source whose chunk
      it takes next (src_mask bits ascending, advancing every ``chunk`` words); a flit moves
      from s to d when they point at each other, so up to min(ns, nd) flits move per cycle and
      every destination receives its chunks in the order of the golden model. Sources skew
      into a wavefront (source s starts s chunks late) and then all ports run at one flit per
      cycle. No deadlock: a source waits on a destination that is taking an earlier (chunk,
      source) in the order, so waits never form a cycle.
    * REDUCE_ADD / REDUCE_MAX: flit k of every source moves in the same cycle into the
      :class:`ReduceTree` (:attr:`reduce_stages` register levels; lane-wise saturating signed
      64-bit sums, bit-exact to the chain in ascending source order, or unsigned 32-bit max),
      whose last level's flit goes to every destination; the tree stalls as a whole while
      that flit cannot go, and a reduce descriptor finishes when the tree has emptied.

    A source's word is therefore accepted only when its destinations can take it: in
    ALL_TO_ALL when the destination has reached that source's chunk, in the reduce modes when
    every source offers its word. The compiler keeps every destination within ``buffer_words``
    unread words (``docs/memory.md``).

    Bad descriptors (those :class:`~elmoe3d.sw.golden.agg_link.LinkOp` refuses; the golden
    classification is :func:`elmoe3d.sw.golden.agg_link.link_op_fault`) never hang the link:

    * ``chunk`` = 0 (any mode), an empty ``src_mask`` or ``dst_mask``, BYPASS with more than
      one source: rejected when taken (in the same cycle as a good descriptor would be): no
      word moves, the sources' words stay for the next descriptor (a corrected descriptor
      sent next moves them as if nothing happened), and ``errors.bad_desc`` is set. (Without
      the check an ALL_TO_ALL with ``chunk`` = 0 or no destination deadlocked.)
    * ALL_TO_ALL with ``words`` not a multiple of ``chunk * nd`` (an unfinished last chunk
      deadlocked a destination waiting for a source that had no words left): the words move
      as for the next multiple until a source's last word moves; that word completes no
      round of destinations, which sets ``errors.bad_length`` and turns the descriptor into a
      drain: every source's remaining words are taken at one flit per cycle and dropped, and
      the descriptor finishes (``done``) with every source at exactly ``words`` words, so
      the next descriptor starts on the right words. Each destination has received a prefix
      of what it receives from the next multiple (the cut depends on timing).

    No descriptor field can hang the link otherwise: ``words`` = 0 finishes at once, every
    ``mode`` value is a mode and the masks are G bits wide.

    Throughput: ``flit_bytes`` per cycle on every port (BYPASS and the reduce modes: one flit
    per cycle; ALL_TO_ALL: one flit per cycle per port after a skew of up to ns - 1 chunks);
    one idle cycle between descriptors (a reduce descriptor: after its tree has emptied).

    Latency (formulas in :mod:`elmoe3d.config`): :attr:`latency` = ``W / (8 flit_bytes)``
    cycles (BYPASS, ALL_TO_ALL) and :attr:`reduce_latency` = that + :attr:`reduce_stages`
    (REDUCE_ADD, REDUCE_MAX; :meth:`word_latency` by mode) from the cycle a word's first flit
    moves to the cycle the word is offered on ``pe_o`` (no stall); a descriptor's first flit
    moves :attr:`op_latency` = 2 cycles after it is taken (sources valid); a rejected
    descriptor holds the ``op`` port :attr:`reject_cycles` = 1 cycle; ``errors`` shows an
    event or a clear :attr:`errors_latency` = 1 cycle later.

    Timing (``docs/synth.md``): the flit buffers cut the PEs' ready chain and take the word's
    flit select off the arbitration's paths; the tree has one adder level per register.
    """

    def __init__(self, *, pes, word_bits, flit_bytes, buffer_words):
        check_param("pes", pes)
        check_param("word_bits", word_bits, 64)
        check_param("flit_bytes", flit_bytes, 8)
        check_param("buffer_words", buffer_words)
        if (flit_bytes * 8) % 64:
            raise ValueError(f"flit_bytes: expected a multiple of 8 bytes (whole 64-bit lanes), "
                             f"got {flit_bytes}")
        if word_bits % (flit_bytes * 8):
            raise ValueError(f"word_bits: {word_bits} is not a whole number of {flit_bytes} B "
                             f"flits (flit_bytes)")
        self._pes, self._w, self._fb, self._depth = pes, word_bits, flit_bytes, buffer_words
        super().__init__({
            "op": In(stream.Signature(link_op_layout(pes))),
            "pe_i": In(stream.Signature(unsigned(word_bits))).array(pes),
            "pe_o": Out(stream.Signature(unsigned(word_bits))).array(pes),
            "busy": Out(1),
            "done": Out(1),
            "errors": Out(link_errors_layout()),
            "errors_clear": In(link_errors_layout()),
        })

    @classmethod
    def from_arch(cls, arch, *, buffer_words=DEFAULT_BUFFER_WORDS) -> "AggregationLink":
        """The link of a group of ``arch`` (:class:`~elmoe3d.config.ArchConfig`):
        G = ``pes_per_group``, W = ``pe.word_bits``, flit = ``aggregation_bytes_per_cycle``."""
        fb = arch.aggregation_bytes_per_cycle
        if fb != int(fb):
            raise ValueError(f"aggregation_gbps: {arch.aggregation_gbps} GB/s at "
                             f"{arch.clock_ghz} GHz is not a whole number of bytes per cycle")
        return cls(pes=arch.pes_per_group, word_bits=arch.pe.word_bits, flit_bytes=int(fb),
                   buffer_words=buffer_words)

    @property
    def pes(self) -> int:
        """G, PEs of the group."""
        return self._pes

    @property
    def word_bits(self) -> int:
        """W, bits per link word."""
        return self._w

    @property
    def flit_bytes(self) -> int:
        """Bytes per port per cycle."""
        return self._fb

    @property
    def buffer_words(self) -> int:
        """Destination FIFO depth in words."""
        return self._depth

    @property
    def flits_per_word(self) -> int:
        """Cycles a word occupies a port: ``W / (8 flit_bytes)``."""
        return self._w // (8 * self._fb)

    @property
    def latency(self) -> int:
        """BYPASS and ALL_TO_ALL: cycles from a word's first flit moving (leaving its source's
        flit buffer) to the word offered on ``pe_o`` (no stall):
        :func:`elmoe3d.config.link_latency` = :attr:`flits_per_word`."""
        return link_latency(self._pes, self.flits_per_word, reduce=False)

    @property
    def reduce_stages(self) -> int:
        """Register levels of the reduction tree (:class:`ReduceTree`):
        :func:`elmoe3d.config.link_reduce_stages` (G) = ``max(1, ceil(log2 G))``."""
        return link_reduce_stages(self._pes)

    @property
    def reduce_latency(self) -> int:
        """REDUCE_ADD and REDUCE_MAX: as :attr:`latency`, plus :attr:`reduce_stages`."""
        return link_latency(self._pes, self.flits_per_word, reduce=True)

    def word_latency(self, mode) -> int:
        """:attr:`latency` or :attr:`reduce_latency`, by ``mode`` (a
        :class:`~elmoe3d.sw.golden.agg_link.LinkMode` or :class:`LinkModeRTL`)."""
        mode = LinkMode(mode.value if isinstance(mode, LinkModeRTL) else mode)
        return self.reduce_latency if mode in (LinkMode.REDUCE_ADD, LinkMode.REDUCE_MAX) \
            else self.latency

    @property
    def op_latency(self) -> int:
        """Cycles from a descriptor taken to its first flit moving (sources valid):
        :data:`elmoe3d.config.LINK_OP_LATENCY` (the descriptor register, then the flit
        buffer)."""
        return LINK_OP_LATENCY

    @property
    def reject_cycles(self) -> int:
        """Cycles a rejected descriptor (``errors.bad_desc``) holds the ``op`` port: it is
        taken in the cycle it is offered to an idle link and the next descriptor can be taken
        in the next cycle; the link never goes ``busy`` for it."""
        return 1

    @property
    def errors_latency(self) -> int:
        """Cycles from an error event (a descriptor rejected when taken, a bad length's last
        word moving) or an ``errors_clear`` strobe to ``errors`` showing it."""
        return STICKY_LATENCY

    def elaborate(self, platform):
        m = Module()
        G, W, S = self._pes, self._w, self.flits_per_word
        FB = self._fb * 8

        act = Signal()
        mode = Signal(LinkModeRTL)
        src = Signal(G)
        dst = Signal(G)
        chunk = Signal(16)
        left = [Signal(16, name=f"left{s}") for s in range(G)]
        fidx = [Signal(range(S), name=f"fidx{s}") for s in range(G)]
        ileft = [Signal(16, name=f"ileft{s}") for s in range(G)]   # words still to pull in
        ifidx = [Signal(range(S), name=f"ifidx{s}") for s in range(G)]
        cw = [Signal(16, name=f"cw{s}") for s in range(G)]        # words into the chunk
        cdst = [Signal(G, name=f"cdst{s}") for s in range(G)]     # one-hot chunk destination
        dw = [Signal(16, name=f"dw{d}") for d in range(G)]
        csrc = [Signal(G, name=f"csrc{d}") for d in range(G)]     # one-hot expected source
        didx = [Signal(range(S), name=f"didx{d}") for d in range(G)]

        fifos = []
        for d in range(G):
            fifo = SyncFIFO(width=W, depth=self._depth)
            m.submodules[f"fifo{d}"] = fifo
            fifos.append(fifo)
            m.d.comb += [self.pe_o[d].valid.eq(fifo.r_rdy),
                         self.pe_o[d].payload.eq(fifo.r_data),
                         fifo.r_en.eq(self.pe_o[d].ready)]

        # ---- sources: the presented word, flit by flit, into a flit buffer ----------------
        # (``pe_i.ready`` from registers only; the arbitration reads the buffers' heads)
        bufs = []
        flit = [Signal(FB, name=f"flit{s}") for s in range(G)]
        for s in range(G):
            buf = FlitBuffer(FB)
            m.submodules[f"ibuf{s}"] = buf
            bufs.append(buf)
            pull = Signal(name=f"pull{s}")
            word_end = ifidx[s] == S - 1
            m.d.comb += [pull.eq(act & (ileft[s] != 0) & buf.w_rdy),
                         buf.w_data.eq(self.pe_i[s].payload.word_select(ifidx[s], FB)),
                         buf.w_en.eq(pull & self.pe_i[s].valid),
                         self.pe_i[s].ready.eq(pull & word_end),
                         flit[s].eq(buf.r_data)]
            with m.If(buf.w_en):
                m.d.sync += ifidx[s].eq(Mux(word_end, 0, ifidx[s] + 1))
                with m.If(word_end):
                    m.d.sync += ileft[s].eq(ileft[s] - 1)
        has = Signal(G)
        m.d.comb += has.eq(Cat(act & bufs[s].r_rdy & (left[s] != 0) for s in range(G)))
        dok = Signal(G)
        m.d.comb += dok.eq(Cat(f.w_rdy for f in fifos))
        dst_ok = Signal()
        m.d.comb += dst_ok.eq((dok | ~dst) == (1 << G) - 1)
        all_src = Signal()
        m.d.comb += all_src.eq(src.any() & ((has | ~src) == (1 << G) - 1))

        is_a2a = mode == LinkModeRTL.ALL_TO_ALL
        is_red = (mode == LinkModeRTL.REDUCE_ADD) | (mode == LinkModeRTL.REDUCE_MAX)
        # BYPASS: the source's flit to every destination at once.
        together = Signal()
        m.d.comb += together.eq(act & (mode == LinkModeRTL.BYPASS) & all_src & dst_ok)
        # REDUCE_*: flit k of every source into the reduction tree, which stalls as a whole
        # while its last level's flit cannot go to every destination.
        tree = ReduceTree(pes=G, flit_bits=FB)
        m.submodules.tree = tree
        red_in = Signal()
        red_out = Signal()
        m.d.comb += [tree.i[s].eq(flit[s]) for s in range(G)]
        m.d.comb += [
            tree.mask.eq(src),
            tree.add.eq(mode == LinkModeRTL.REDUCE_ADD),
            tree.en.eq(~tree.o_valid | dst_ok),
            red_in.eq(act & is_red & all_src & tree.en),
            tree.i_valid.eq(red_in),
            red_out.eq(tree.o_valid & dst_ok),
        ]
        # ALL_TO_ALL: pairs pointing at each other.
        pair = [[Signal(name=f"pair{s}_{d}") for d in range(G)] for s in range(G)]
        for s in range(G):
            for d in range(G):
                m.d.comb += pair[s][d].eq(act & is_a2a & has[s] & cdst[s][d] & csrc[d][s]
                                          & dok[d])
        # drain: a bad ALL_TO_ALL length was found; take every source's words, deliver none
        drain = Signal()
        take = Signal(G)
        to = Signal(G)
        m.d.comb += [
            take.eq(Cat(Mux(drain, has[s], Mux(is_a2a, Cat(pair[s]).any(),
                                               (together | red_in) & src[s]))
                        for s in range(G))),
            to.eq(Cat(~drain & Mux(is_a2a, Cat(pair[s][d] for s in range(G)).any(),
                                   (together | red_out) & dst[d])
                      for d in range(G))),
        ]
        m.d.comb += [bufs[s].r_en.eq(take[s]) for s in range(G)]

        # ---- destinations: flits -> words -> FIFO ------------------------------------------
        for d in range(G):
            sel = Signal(G, name=f"sel{d}")
            m.d.comb += sel.eq(Mux(is_a2a, csrc[d], src))
            dflit = Signal(FB, name=f"dflit{d}")
            m.d.comb += dflit.eq(Mux(is_red, tree.o, _onehot_mux(sel, flit)))
            regs = [Signal(FB, name=f"dreg{d}_{t}") for t in range(S - 1)]
            word_end = didx[d] == S - 1
            m.d.comb += [fifos[d].w_data.eq(Cat(*regs, dflit)),
                         fifos[d].w_en.eq(to[d] & word_end)]
            with m.If(to[d]):
                m.d.sync += didx[d].eq(Mux(word_end, 0, didx[d] + 1))
                for t in range(S - 1):
                    with m.If(didx[d] == t):
                        m.d.sync += regs[t].eq(dflit)
                with m.If(word_end):
                    with m.If(dw[d] + 1 == chunk):
                        m.d.sync += [dw[d].eq(0), csrc[d].eq(_next_bit(csrc[d], src, G))]
                    with m.Else():
                        m.d.sync += dw[d].eq(dw[d] + 1)

        # A source's last word must end a chunk sent to the last destination (a whole round);
        # otherwise ``words`` is not a multiple of chunk x destinations.
        bad_end = Signal(G)
        for s in range(G):
            later_dst = dst & ~(cdst[s] | (cdst[s] - 1)[:G])
            round_end = (cw[s] + 1 == chunk) & ~later_dst.any()
            m.d.comb += bad_end[s].eq(is_a2a & ~drain & take[s] & (fidx[s] == S - 1)
                                      & (left[s] == 1) & ~round_end)
        with m.If(bad_end.any()):
            m.d.sync += drain.eq(1)

        for s in range(G):
            word_end = fidx[s] == S - 1
            with m.If(take[s]):
                m.d.sync += fidx[s].eq(Mux(word_end, 0, fidx[s] + 1))
                with m.If(word_end):
                    m.d.sync += left[s].eq(left[s] - 1)
                    with m.If(cw[s] + 1 == chunk):
                        m.d.sync += [cw[s].eq(0), cdst[s].eq(_next_bit(cdst[s], dst, G))]
                    with m.Else():
                        m.d.sync += cw[s].eq(cw[s] + 1)

        # ---- descriptors -------------------------------------------------------------------
        finish = Signal()
        m.d.comb += [
            finish.eq(act & Cat(l == 0 for l in left).all() & ~tree.pending),
            self.done.eq(finish),
            self.busy.eq(act),
            self.op.ready.eq(~act | finish),
        ]
        with m.If(finish):
            m.d.sync += act.eq(0)
        p = self.op.payload
        # descriptors LinkOp refuses, found in the cycle they are taken
        rejected = Signal()
        m.d.comb += rejected.eq((p.chunk == 0) | ~p.src_mask.any() | ~p.dst_mask.any()
                                | ((p.mode == LinkModeRTL.BYPASS)
                                   & (p.src_mask & (p.src_mask - 1)[:G]).any()))
        taken = self.op.valid & self.op.ready
        with m.If(taken & ~rejected):      # a BYPASS taken here has exactly one source
            m.d.sync += [act.eq(1), mode.eq(p.mode), src.eq(p.src_mask), dst.eq(p.dst_mask),
                         chunk.eq(p.chunk), drain.eq(0)]
            for s in range(G):
                m.d.sync += [left[s].eq(Mux(p.src_mask[s], p.words, 0)), fidx[s].eq(0),
                             ileft[s].eq(Mux(p.src_mask[s], p.words, 0)), ifidx[s].eq(0),
                             cw[s].eq(0), cdst[s].eq(_lowest(p.dst_mask, G))]
            for d in range(G):
                m.d.sync += [dw[d].eq(0), csrc[d].eq(_lowest(p.src_mask, G)), didx[d].eq(0)]

        # ---- sticky error flags (setting wins over a clear in the same cycle) --------------
        sticky_flags(m, self.errors, set_={"bad_desc": taken & rejected,
                                           "bad_length": bad_end.any()},
                     clear=self.errors_clear)
        return m

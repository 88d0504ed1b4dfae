"""The per-PE load router of the logic die: picks the source of every LOAD's words and
prefetches HB data (paper Section 4.1, Fig. 6 right: "a memory controller orchestrates data
flow from both tiers; HB data is routed to IOMEM and WMEM, streamline data ... is written to
WMEM"; Section 5.1: HB and EXT feed the same PE concurrently).

The router sits on the PE's command stream. Every command passes through unchanged; for every
``LOAD`` it queues a *fetch* ``(src, hb_addr, words)`` (fields ``src`` and ``hb_addr`` of
:mod:`elmoe3d.isa`, which the PE itself ignores) and then forwards exactly ``words`` words of
that source into the PE's ``ld`` stream, LOADs in program order:

* ``Source.HB``: the router issues read requests to the PE's HB bank controller *ahead of
  time*: up to :attr:`hb_burst_words` words per request, as soon as the HB data FIFO
  (:attr:`hb_fifo_words` words) has room for every word requested and not yet forwarded, even
  while earlier LOADs (from any source) are still streaming. So HB reads of the next LOADs
  overlap the current one and the bank never stalls on the PE unless the FIFO is full. With
  ``hb_fifo_words = 1`` (the board top's) one HB word is in flight at a time, and a one-word
  FIFO of any source passes a word every other cycle (it takes no word while full, even in a
  cycle that reads).
* ``Source.EXT``: words of the streamline ring's ``ext`` port of this PE, through a FIFO of
  :attr:`ext_fifo_words` words that accepts ring words whenever it has room (the ring is not
  blocked by a PE busy with other loads, within that depth).
* ``Source.HOST``: words of the host DMA stream for this PE, through a FIFO of
  :attr:`host_fifo_words` words.

Words of one source are consumed in order: the k-th EXT word the router receives belongs to
the k-th EXT LOAD word in program order (likewise HOST and HB). The compiler
(``elmoe3d.sw.host.parallel``) emits the EXT and HOST streams in that order.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..config import PEConfig, pe_config
from ..isa import OPS, Op, Source
from .checked import CheckedComponent, check_param
from .isa import OpCode, command_layout


__all__ = ["LoadRouter", "hb_read_layout", "ADDR_BITS", "WORDS_BITS"]


def _field_width(op, name) -> int:
    for f in OPS[op]:
        if f.name == name:
            return f.width
    raise KeyError(f"{op.name}.{name}")


#: Width of an HB address in PE words (the LOAD ``hb_addr`` field).
ADDR_BITS = _field_width(Op.LOAD, "hb_addr")
#: Width of a word count (the LOAD ``words`` field).
WORDS_BITS = _field_width(Op.LOAD, "words")
_SRC_BITS = _field_width(Op.LOAD, "src")


def hb_read_layout() -> data.StructLayout:
    """One HB read request of the router: ``addr`` (:data:`ADDR_BITS` bits, HB address in W-bit
    PE words) and ``words`` (:data:`WORDS_BITS` bits, >= 1): read words ``addr .. addr +
    words - 1`` and return them in order."""
    return data.StructLayout({"addr": unsigned(ADDR_BITS), "words": unsigned(WORDS_BITS)})


def _fetch_layout() -> data.StructLayout:
    return data.StructLayout({"src": unsigned(_SRC_BITS), "words": unsigned(WORDS_BITS)})


class LoadRouter(CheckedComponent):
    """Per-PE load router (module docstring; ``docs/memory.md``, "Logic die").

    Ports (W = ``lanes * 128`` bits, the PE word; ``amaranth.lib.stream``)
    ----------------------------------------------------------------------
    cmd_i : In, :func:`elmoe3d.hw.isa.command_layout`
        The PE's commands, in program order (from the die's host command queue).
    cmd_o : Out, :func:`elmoe3d.hw.isa.command_layout`
        The same commands to the PE's ``cmd`` (combinational pass-through: 0 cycles). A LOAD
        passes only when the fetch queue has room (:attr:`queue_depth` LOADs).
    ld : Out, W bits
        To the PE's ``ld``: exactly ``words`` words per LOAD, from its source, in LOAD order.
    hb_req : Out, :func:`hb_read_layout`
        Read requests to the PE's HB bank controller (at most :attr:`hb_burst_words` words).
    hb_data : In, W bits
        The HB controller's read data, in request order (always accepted: a request is issued
        only when the HB FIFO has room for all its words).
    ext : In, W bits
        This PE's words from the streamline ring (EXT loads).
    host : In, W bits
        This PE's words from the host DMA stream (HOST loads).
    ext_pop : Out, 1 bit
        An EXT word left the EXT FIFO for ``ld`` in this cycle (the die's EXT scheduler takes
        it as one credit back, :class:`elmoe3d.hw.ext_sched.ExtScheduler`).

    Latency
    -------
    :attr:`cmd_latency` = 0 cycles (``cmd_i`` to ``cmd_o``); :attr:`latency` = 1 cycle from a
    source word accepted (``hb_data``, ``ext``, ``host``) to it being offered on ``ld`` when its
    LOAD is the current one; consecutive LOADs follow each other with no idle cycle (with
    FIFOs of at least two words; one-word FIFOs pass a word every other cycle).

    Parameters
    ----------
    config : ArchConfig or PEConfig
        The PE word width W.
    queue_depth : int
        LOADs queued between the command stream and the ``ld`` stream (>= 1).
    hb_fifo_words : int
        HB data FIFO depth in words: the bound on HB words requested and not yet forwarded
        (>= 1, and >= ``hb_burst_words``).
    hb_burst_words : int
        Largest HB read request in words (>= 1).
    ext_fifo_words, host_fifo_words : int
        EXT and HOST input FIFO depths in words (>= 1).

    Raises
    ------
    TypeError
        ``config`` is neither an ArchConfig nor a PEConfig.
    ValueError
        A depth is not a positive integer, or ``hb_burst_words > hb_fifo_words``.
    """

    @classmethod
    def check(cls, *, config, queue_depth, hb_fifo_words, hb_burst_words, ext_fifo_words,
              host_fifo_words):
        """The constructor's checks (:class:`~elmoe3d.hw.checked.CheckedComponent`):
        raises before the object exists."""
        pe_config(config)
        check_param("queue_depth", queue_depth)
        check_param("hb_fifo_words", hb_fifo_words)
        check_param("hb_burst_words", hb_burst_words)
        check_param("ext_fifo_words", ext_fifo_words)
        check_param("host_fifo_words", host_fifo_words)
        if hb_burst_words > hb_fifo_words:
            raise ValueError(f"hb_burst_words: {hb_burst_words} exceeds hb_fifo_words "
                             f"({hb_fifo_words}); a request must fit the HB data FIFO")
        if hb_burst_words >= 1 << WORDS_BITS:
            raise ValueError(f"hb_burst_words: {hb_burst_words} does not fit the "
                             f"{WORDS_BITS}-bit request length")

    def __init__(self, *, config, queue_depth: int = 8, hb_fifo_words: int = 32,
                 hb_burst_words: int = 8, ext_fifo_words: int = 8, host_fifo_words: int = 4):
        self._pe = pe_config(config)
        self._queue_depth = queue_depth
        self._hb_fifo_words = hb_fifo_words
        self._hb_burst_words = hb_burst_words
        self._ext_fifo_words = ext_fifo_words
        self._host_fifo_words = host_fifo_words
        W = self._pe.word_bits
        super().__init__({
            "cmd_i": In(stream.Signature(command_layout())),
            "cmd_o": Out(stream.Signature(command_layout())),
            "ld": Out(stream.Signature(unsigned(W))),
            "hb_req": Out(stream.Signature(hb_read_layout())),
            "hb_data": In(stream.Signature(unsigned(W))),
            "ext": In(stream.Signature(unsigned(W))),
            "host": In(stream.Signature(unsigned(W))),
            "ext_pop": Out(1),
        })

    # ---- parameters -------------------------------------------------------------------------

    @property
    def config(self) -> PEConfig:
        return self._pe

    @property
    def queue_depth(self) -> int:
        return self._queue_depth

    @property
    def hb_fifo_words(self) -> int:
        return self._hb_fifo_words

    @property
    def hb_burst_words(self) -> int:
        return self._hb_burst_words

    @property
    def ext_fifo_words(self) -> int:
        return self._ext_fifo_words

    @property
    def host_fifo_words(self) -> int:
        return self._host_fifo_words

    @property
    def cmd_latency(self) -> int:
        """Cycles from ``cmd_i`` to ``cmd_o`` (combinational pass-through)."""
        return 0

    @property
    def latency(self) -> int:
        """Cycles from a source word accepted to it being offered on ``ld`` (its LOAD
        current)."""
        return 1

    # ---- logic ------------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        W = self._pe.word_bits
        fetch = _fetch_layout()
        hbreq = hb_read_layout()

        m.submodules.order_q = order_q = SyncFIFO(width=fetch.size, depth=self._queue_depth)
        m.submodules.hb_q = hb_q = SyncFIFO(width=hbreq.size, depth=self._queue_depth)
        m.submodules.hb_fifo = hb_fifo = SyncFIFO(width=W, depth=self._hb_fifo_words)
        m.submodules.ext_fifo = ext_fifo = SyncFIFO(width=W, depth=self._ext_fifo_words)
        m.submodules.host_fifo = host_fifo = SyncFIFO(width=W, depth=self._host_fifo_words)

        # -- commands: pass through; a LOAD also enters the fetch queue (and the HB queue) --
        cmd = self.cmd_i.payload
        load = cmd.args.load
        is_load = cmd.op == OpCode.LOAD
        is_hb = is_load & (load.src.as_value() == Source.HB)
        room = order_q.w_rdy & hb_q.w_rdy
        m.d.comb += [
            self.cmd_o.payload.eq(cmd),
            self.cmd_o.valid.eq(self.cmd_i.valid & (~is_load | room)),
            self.cmd_i.ready.eq(self.cmd_o.ready & (~is_load | room)),
        ]
        take = self.cmd_i.valid & self.cmd_i.ready
        m.d.comb += [
            order_q.w_en.eq(take & is_load),
            hb_q.w_en.eq(take & is_hb & (load.words != 0)),
        ]
        w_fetch = data.View(fetch, order_q.w_data)
        w_hb = data.View(hbreq, hb_q.w_data)
        m.d.comb += [
            w_fetch.src.eq(load.src.as_value()),
            w_fetch.words.eq(load.words),
            w_hb.addr.eq(load.hb_addr),
            w_hb.words.eq(load.words),
        ]

        # -- HB prefetch: requests while the data FIFO has room for every outstanding word --
        head = data.View(hbreq, hb_q.r_data)
        issued = Signal(WORDS_BITS)                      # words of the head already requested
        reserved = Signal(range(self._hb_fifo_words + 1))  # requested, not yet forwarded
        remaining = Signal(WORDS_BITS)
        size = Signal(WORDS_BITS)
        m.d.comb += [
            remaining.eq(head.words - issued),
            size.eq(Mux(remaining > self._hb_burst_words, self._hb_burst_words, remaining)),
            self.hb_req.payload.addr.eq(head.addr + issued),
            self.hb_req.payload.words.eq(size),
            self.hb_req.valid.eq(hb_q.r_rdy & (reserved + size <= self._hb_fifo_words)),
        ]
        req = self.hb_req.valid & self.hb_req.ready
        with m.If(req):
            with m.If(size == remaining):
                m.d.comb += hb_q.r_en.eq(1)
                m.d.sync += issued.eq(0)
            with m.Else():
                m.d.sync += issued.eq(issued + size)

        m.d.comb += [
            hb_fifo.w_data.eq(self.hb_data.payload),
            hb_fifo.w_en.eq(self.hb_data.valid),
            self.hb_data.ready.eq(hb_fifo.w_rdy),
            ext_fifo.w_data.eq(self.ext.payload),
            ext_fifo.w_en.eq(self.ext.valid),
            self.ext.ready.eq(ext_fifo.w_rdy),
            host_fifo.w_data.eq(self.host.payload),
            host_fifo.w_en.eq(self.host.valid),
            self.host.ready.eq(host_fifo.w_rdy),
        ]

        # -- ld: the head fetch's words from its source, LOADs back to back --
        cur = data.View(fetch, order_q.r_data)
        count = Signal(WORDS_BITS)                       # words of the head fetch forwarded
        last = count == cur.words - 1
        # (a ``src`` outside HOST/HB/EXT -- the assembler rejects it -- reads as HOST)
        with m.If(order_q.r_rdy & (cur.words != 0)):
            with m.Switch(cur.src):
                for src, fifo in ((Source.HB, hb_fifo), (Source.EXT, ext_fifo),
                                  ("--", host_fifo)):
                    with m.Case(src):
                        m.d.comb += [
                            self.ld.valid.eq(fifo.r_rdy),
                            self.ld.payload.eq(fifo.r_data),
                            fifo.r_en.eq(self.ld.ready),
                        ]
        xfer = self.ld.valid & self.ld.ready
        with m.If(xfer):
            with m.If(last):
                m.d.comb += order_q.r_en.eq(1)
                m.d.sync += count.eq(0)
            with m.Else():
                m.d.sync += count.eq(count + 1)
        with m.If(order_q.r_rdy & (cur.words == 0)):     # nothing to forward
            m.d.comb += order_q.r_en.eq(1)

        hb_pop = hb_fifo.r_en & hb_fifo.r_rdy
        m.d.comb += self.ext_pop.eq(ext_fifo.r_en & ext_fifo.r_rdy)
        m.d.sync += reserved.eq(reserved + Mux(req, size, 0) - hb_pop)
        return m

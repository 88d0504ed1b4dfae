"""PE-word port of a DRAM controller: reads and writes in W-bit PE words on one side, the
controller's burst requests on the other (paper Section 4.1, Fig. 6 centre: "each PE fetches
data from its HB bank via an HB controller").

The PE, its load router and the host address HB in W-bit PE words (``LOAD.hb_addr``); the DRAM
controller (:class:`elmoe3d.hw.dram.DramController`) works in bursts of ``burst_bytes``
(128 B for the HB bank: 1024 pins x BL1). One of the two divides the other:

* burst >= word (the ``small`` preset: 64 B words, ``kb`` = 2 words per burst): a read of words
  ``a .. a+n-1`` reads bursts ``a // kb .. (a+n-1) // kb`` and drops the words outside the
  range; a write assembles ``kb`` words ``kb j .. kb j + kb - 1`` (sent in that order) into burst
  ``j`` (the DRAM has no write mask: HB writes are whole bursts).
* word > burst (the paper's PE: 512 B words, ``kw`` = 4 bursts per word): word ``a`` is bursts
  ``kw a .. kw a + kw - 1``, lowest bits first.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from .checked import CheckedComponent, check_param
from .dram import request_layout
from .load_router import ADDR_BITS, WORDS_BITS, hb_read_layout


__all__ = ["DramWordPort", "word_write_layout", "word_beat_layout"]


def word_write_layout(word_bits: int) -> data.StructLayout:
    """One word write: ``addr`` (:data:`~elmoe3d.hw.load_router.ADDR_BITS`, PE words) and
    ``data`` (``word_bits``)."""
    return data.StructLayout({"addr": unsigned(ADDR_BITS), "data": unsigned(word_bits)})


def word_beat_layout(word_bits: int, lanes: int) -> data.StructLayout:
    """One read beat of a port with ``lanes`` > 1 words per beat: ``data`` (``lanes`` W-bit
    word slots, slot i at bits ``[i W, (i + 1) W)``) and ``words`` (the valid slots
    ``[0, words)``, 1..``lanes``; slots above are undefined)."""
    for name, v in (("word_bits", word_bits), ("lanes", lanes)):
        check_param(name, v)
    return data.StructLayout({"data": unsigned(lanes * word_bits),
                              "words": unsigned(lanes.bit_length())})


def _log2(n):
    return n.bit_length() - 1


class DramWordPort(CheckedComponent):
    """Word requests <-> burst requests of one DRAM controller (module docstring).

    Ports
    -----
    rd_req : In, :func:`elmoe3d.hw.load_router.hb_read_layout`
        Read ``words`` (>= 1) PE words from word address ``addr``.
    rd_data : Out, ``word_bits`` (``lanes`` = 1) or :func:`word_beat_layout` (``lanes`` > 1)
        The words read, in request order: one a beat, or up to ``lanes`` a beat, cut as the
        golden :func:`elmoe3d.sw.golden.ring.word_beats` (consecutive words of one burst, never
        across a multiple of ``lanes`` words from the request's first word).
    wr : In, :func:`word_write_layout`
        Word writes. With burst >= word, the words of a burst come ``kb`` at a time, in
        address order from a multiple of ``kb`` (a burst is written when its last word
        arrives); other sequences write undefined data.
    req : Out, :func:`elmoe3d.hw.dram.request_layout` (``addr_bits``, ``length_bits``)
    wdata : Out, ``burst_bits``
    rdata : In, ``burst_bits``
        To / from the controller. Writes have priority over reads at the request port (a
        request offered is held until taken); the controller serves requests in order, so a
        read after a write returns the written data.

    Latency: 0 cycles from ``rd_req`` to ``req`` (combinational); :attr:`latency` cycles from a
    burst on ``rdata`` to its first word on ``rd_data`` (0 for burst >= word, ``kw`` bursts
    then 1 cycle for word > burst).

    Parameters
    ----------
    word_bits, burst_bits : int
        W and the burst width; powers of two (one divides the other), >= 8.
    addr_bits, length_bits : int
        The controller's request fields (burst address, burst count).
    inflight : int
        Read requests between ``req`` and their last word on ``rd_data`` (>= 1).
    lanes : int
        Words per ``rd_data`` beat at most (a power of two, >= 1; > 1 only when a burst holds
        at least ``lanes`` words). Throughput: ``lanes`` words a cycle from a burst (the LPDDR5
        port of the small die at 8 channels: 2 x 64 B a cycle, 128 B/cycle, over the EXT's
        102.4).

    Raises
    ------
    ValueError
        A parameter out of range (named).
    """

    @classmethod
    def check(cls, *, word_bits, burst_bits, addr_bits, length_bits, inflight, lanes=1):
        """The constructor's checks (:class:`~elmoe3d.hw.checked.CheckedComponent`):
        raises before the object exists."""
        for name, value, lo in (("word_bits", word_bits, 8), ("burst_bits", burst_bits, 8),
                                ("addr_bits", addr_bits, 1), ("length_bits", length_bits, 1),
                                ("inflight", inflight, 1), ("lanes", lanes, 1)):
            check_param(name, value, lo)
        for name, value in (("word_bits", word_bits), ("burst_bits", burst_bits),
                            ("lanes", lanes)):
            if value & (value - 1):
                raise ValueError(f"{name}: expected a power of two, got {value}")
        if lanes > max(1, burst_bits // word_bits):
            raise ValueError(f"lanes: {lanes} words a beat, but a {burst_bits}-bit burst holds "
                             f"{burst_bits // word_bits} {word_bits}-bit words")

    def __init__(self, *, word_bits: int, burst_bits: int, addr_bits: int, length_bits: int,
                 inflight: int = 8, lanes: int = 1):
        self._w, self._b = word_bits, burst_bits
        self._addr_bits, self._length_bits, self._inflight = addr_bits, length_bits, inflight
        self._lanes = lanes
        beat = unsigned(word_bits) if lanes == 1 else word_beat_layout(word_bits, lanes)
        super().__init__({
            "rd_req": In(stream.Signature(hb_read_layout())),
            "rd_data": Out(stream.Signature(beat)),
            "wr": In(stream.Signature(word_write_layout(word_bits))),
            "req": Out(stream.Signature(request_layout(addr_bits, length_bits))),
            "wdata": Out(stream.Signature(unsigned(burst_bits))),
            "rdata": In(stream.Signature(unsigned(burst_bits))),
        })

    @property
    def word_bits(self) -> int:
        return self._w

    @property
    def burst_bits(self) -> int:
        return self._b

    @property
    def lanes(self) -> int:
        """Words per ``rd_data`` beat at most."""
        return self._lanes

    @property
    def words_per_burst(self) -> int:
        """kb (1 when a word spans bursts)."""
        return max(1, self._b // self._w)

    @property
    def bursts_per_word(self) -> int:
        """kw (1 when a burst holds whole words)."""
        return max(1, self._w // self._b)

    @property
    def latency(self) -> int:
        return 0 if self._b >= self._w else self.bursts_per_word

    def elaborate(self, platform):
        m = Module()
        W, B = self._w, self._b
        kb, kw = self.words_per_burst, self.bursts_per_word
        lkb, lkw = _log2(kb), _log2(kw)
        req_layout = request_layout(self._addr_bits, self._length_bits)

        # -- the two request sources, arbitrated with the choice held while not taken --
        rd_req = Signal(req_layout)
        rd_valid = Signal()
        wr_req = Signal(req_layout)
        wr_valid = Signal()
        locked = Signal()
        locked_wr = Signal()
        pick_wr = Signal()
        m.d.comb += pick_wr.eq(Mux(locked, locked_wr, wr_valid))
        m.d.comb += [
            self.req.valid.eq(Mux(pick_wr, wr_valid, rd_valid)),
            self.req.payload.eq(Mux(pick_wr, wr_req, rd_req)),
        ]
        taken = self.req.valid & self.req.ready
        rd_taken = taken & ~pick_wr
        wr_taken = taken & pick_wr
        with m.If(self.req.valid & ~self.req.ready):
            m.d.sync += [locked.eq(1), locked_wr.eq(pick_wr)]
        with m.Elif(taken):
            m.d.sync += locked.eq(0)

        # -- reads --
        a, n = self.rd_req.payload.addr, self.rd_req.payload.words
        if kb > 1:
            info = data.StructLayout({"skip": unsigned(max(1, lkb)), "words": unsigned(WORDS_BITS)})
            m.submodules.inflight = inflight = SyncFIFO(width=info.size, depth=self._inflight)
            w_info = data.View(info, inflight.w_data)
            m.d.comb += [
                rd_req.write.eq(0),
                rd_req.addr.eq(a >> lkb),
                rd_req.length.eq(((a + n - 1) >> lkb) - (a >> lkb) + 1),
                w_info.skip.eq(a[:lkb]),
                w_info.words.eq(n),
                rd_valid.eq(self.rd_req.valid & inflight.w_rdy),
                self.rd_req.ready.eq(rd_taken),
                inflight.w_en.eq(rd_taken),
            ]
            head = data.View(info, inflight.r_data)
            j = Signal(max(1, lkb))
            cnt = Signal(WORDS_BITS)
            jeff = Mux(cnt == 0, head.skip, j)
            m.d.comb += self.rd_data.valid.eq(self.rdata.valid & inflight.r_rdy)
            L = self._lanes
            if L == 1:
                n_out = 1
                m.d.comb += self.rd_data.payload.eq(self.rdata.payload.word_select(jeff, W))
            else:
                # golden word_beats: min(lanes - cnt % lanes, kb - jeff, words - cnt)
                n_out = Signal(range(L + 1))
                to_lane = L - cnt[:_log2(L)]
                to_burst = kb - jeff
                left = head.words - cnt
                lb = Mux(to_burst < to_lane, to_burst, to_lane)
                m.d.comb += n_out.eq(Mux(left < lb, left, lb))
                m.d.comb += self.rd_data.payload.words.eq(n_out)
                for i in range(L):
                    m.d.comb += self.rd_data.payload.data.word_select(i, W).eq(
                        self.rdata.payload.word_select(jeff + i, W))
            with m.If(self.rd_data.valid & self.rd_data.ready):
                with m.If(cnt + n_out == head.words):
                    m.d.comb += [inflight.r_en.eq(1), self.rdata.ready.eq(1)]
                    m.d.sync += [cnt.eq(0), j.eq(0)]
                with m.Else():
                    m.d.sync += cnt.eq(cnt + n_out)
                    with m.If(jeff + n_out == kb):
                        m.d.comb += self.rdata.ready.eq(1)
                        m.d.sync += j.eq(0)
                    with m.Else():
                        m.d.sync += j.eq(jeff + n_out)
        else:
            m.d.comb += [
                rd_req.write.eq(0),
                rd_req.addr.eq(a << lkw),
                rd_req.length.eq(n << lkw),
                rd_valid.eq(self.rd_req.valid),
                self.rd_req.ready.eq(rd_taken),
            ]
            if kw == 1:
                m.d.comb += [
                    self.rd_data.valid.eq(self.rdata.valid),
                    self.rd_data.payload.eq(self.rdata.payload),
                    self.rdata.ready.eq(self.rd_data.ready),
                ]
            else:
                buf = Signal(W)
                have = Signal(range(kw + 1))
                full = have == kw
                m.d.comb += [
                    self.rd_data.valid.eq(full),
                    self.rd_data.payload.eq(buf),
                ]
                out = full & self.rd_data.ready
                m.d.comb += self.rdata.ready.eq(~full | out)
                take = self.rdata.valid & self.rdata.ready
                base = Mux(out, 0, have)
                with m.If(take):
                    m.d.sync += [buf.word_select(base, B).eq(self.rdata.payload),
                                 have.eq(base + 1)]
                with m.Elif(out):
                    m.d.sync += have.eq(0)

        # -- writes --
        m.submodules.wfifo = wfifo = SyncFIFO(width=B, depth=max(2, kw))
        m.d.comb += [
            self.wdata.valid.eq(wfifo.r_rdy),
            self.wdata.payload.eq(wfifo.r_data),
            wfifo.r_en.eq(self.wdata.ready),
        ]
        wa, wd = self.wr.payload.addr, self.wr.payload.data
        if B >= W:
            burst = Signal(B)
            baddr = Signal(self._addr_bits)
            wfull = Signal()
            m.d.comb += [
                wr_req.write.eq(1), wr_req.addr.eq(baddr), wr_req.length.eq(1),
                wr_valid.eq(wfull & wfifo.w_rdy),
                self.wr.ready.eq(~wfull),
                wfifo.w_data.eq(burst),
                wfifo.w_en.eq(wr_taken),
            ]
            with m.If(wr_taken):
                m.d.sync += wfull.eq(0)
            with m.If(self.wr.valid & self.wr.ready):
                if kb > 1:
                    m.d.sync += burst.word_select(wa[:lkb], W).eq(wd)
                    with m.If(wa[:lkb] == kb - 1):
                        m.d.sync += [wfull.eq(1), baddr.eq(wa >> lkb)]
                else:
                    m.d.sync += [burst.eq(wd), wfull.eq(1), baddr.eq(wa)]
        else:
            word = Signal(W)
            waddr = Signal(self._addr_bits)
            state = Signal(2)                  # 0 idle, 1 request, 2 pushing bursts
            k = Signal(range(kw))
            m.d.comb += [
                wr_req.write.eq(1), wr_req.addr.eq(waddr << lkw), wr_req.length.eq(kw),
                wr_valid.eq(state == 1),
                self.wr.ready.eq(state == 0),
                wfifo.w_data.eq(word.word_select(k, B)),
                wfifo.w_en.eq((state == 2) & wfifo.w_rdy),
            ]
            with m.If(self.wr.valid & self.wr.ready):
                m.d.sync += [word.eq(wd), waddr.eq(wa), state.eq(1), k.eq(0)]
            with m.If(wr_taken):
                m.d.sync += state.eq(2)
            with m.If((state == 2) & wfifo.w_rdy):
                m.d.sync += k.eq(k + 1)
                with m.If(k == kw - 1):
                    m.d.sync += state.eq(0)
        return m

"""The PE's memories (``amaranth.lib.memory``, one write and one synchronous read port each) and
the prioritised requests onto their ports (paper Section 4.1, Fig. 6 centre; ``docs/pe.md``,
"Memories").

Every part of the PE that reads or writes a memory makes a request (an enable, an address, data
and granule mask) with :meth:`Writes.request` / :meth:`Reads.request`; the PE builds each port's
multiplexer once every request is in (:meth:`Writes.build`, :meth:`Reads.build`), in the order
the requests were made (the first has the highest priority; the load engine writes last).
:func:`memory` makes one memory with its request objects.
"""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Mux, Signal, unsigned
from amaranth.lib.memory import Memory

from ...isa import Target
from .common import log2, parts_of
from .link import LINK_TARGETS


__all__ = ["Writes", "Reads", "BankedWrites", "BankedReads", "memory", "PEMemories"]


def memory(m, collisions, name, depth, *, width, granularity=None, transparent=False,
           valid_bits=False, read_ports=1, collision_free=False):
    """Add memory ``name`` (``depth`` words of ``width`` bits, write granules of
    ``granularity`` bits) to ``m`` and return its :class:`Reads` (``read_ports`` of them) and
    its :class:`Writes`. ``transparent``: the read ports see the write port's word of the same
    cycle. ``valid_bits``: a valid bit per word (see :class:`Writes`). ``collision_free``: a
    program that keeps to the buffer flags, fences and REQUANT waits never reads and writes one
    word in one cycle; the memory carries Yosys's ``no_rw_check`` attribute (applied by
    :func:`elmoe3d.synth.fpga.apply_no_rw_check`: no read-first emulation) and
    ``collisions[name]`` is set to the signal that flags such a cycle."""
    mem = Memory(shape=unsigned(width), depth=depth, init=[],
                 attrs={"no_rw_check": 1} if collision_free else None)
    m.submodules[name] = mem
    wp = mem.write_port(granularity=granularity)
    valid = Signal(depth, name=f"{name}_valid") if valid_bits else None
    writes = Writes(wp, name=name, valid=valid, depth=depth)
    reads = [Reads(mem.read_port(transparent_for=(wp,) if transparent else ()), writes)
             for _ in range(read_ports)]
    if collision_free:
        assert not transparent and read_ports == 1
        rp = reads[0].port
        collisions[name] = wp.en.any() & rp.en & (wp.addr == rp.addr)
    return (*reads, writes)


class Writes:
    """Prioritised write requests onto one memory write port. Requests are served in the order
    they were made; the load engine comes last and sees :attr:`busy` when an execute-engine
    request takes the port in this cycle.

    With ``valid`` (a Signal of one bit per word) the memory has valid bits: a word whose bit is
    clear reads as zero, a write sets it (writing zeros into the granules the request does not
    enable), and ``clear`` resets every bit in one cycle (CLEAR)."""

    def __init__(self, port, *, name, valid=None, depth=None):
        self.port = port
        self.name = name
        self.depth = depth
        self.valid = valid
        self.clear = Signal(name=f"{name}_vclear") if valid is not None else None
        self.requests = []
        self.busy = Signal(name=f"{name}_wbusy")
        gran = len(port.data) // len(port.en)
        self.addr = Signal.like(port.addr, name=f"{name}_waddr")
        self.data = Signal.like(port.data, name=f"{name}_wdata")
        self.mask = Signal(len(port.en), name=f"{name}_wmask")
        self._gran = gran

    def request(self, en, addr, data, mask=None):
        self.requests.append((en, addr, data, mask))

    def build(self, m, low=None):
        port = self.port
        full_mask = (1 << len(port.en)) - 1
        reqs = list(self.requests)
        m.d.comb += self.busy.eq(Cat(r[0] for r in reqs).any() if reqs else 0)
        if low is not None:
            reqs.append(low)
        if reqs:
            # without a request the enables are clear and the address and data don't matter:
            # the last request's are the default (one W-bit multiplexer fewer per memory, and
            # none for a memory with a single writer)
            m.d.comb += [self.addr.eq(reqs[-1][1]), self.data.eq(reqs[-1][2])]
        first = True
        for en, addr, value, mask in reqs:
            ctx = m.If(en) if first else m.Elif(en)
            first = False
            with ctx:
                m.d.comb += [
                    self.addr.eq(addr),
                    self.data.eq(value),
                    self.mask.eq(full_mask if mask is None else mask),
                ]
        m.d.comb += port.addr.eq(self.addr)
        if self.valid is None:
            m.d.comb += [port.data.eq(self.data), port.en.eq(self.mask)]
            return
        was_valid = self.valid.bit_select(self.addr, 1)
        any_en = self.mask.any()
        keep = Cat(bit.replicate(self._gran) for bit in self.mask)
        m.d.comb += [
            port.en.eq(Mux(was_valid, self.mask, Mux(any_en, full_mask, 0))),
            port.data.eq(Mux(was_valid, self.data, self.data & keep)),
        ]
        with m.If(self.clear):
            m.d.sync += self.valid.eq(0)
        with m.Elif(any_en):
            m.d.sync += self.valid.bit_select(self.addr, 1).eq(1)


class Reads:
    """Prioritised users of one synchronous read port (``en`` low holds the data). With the
    memory's :class:`Writes` having valid bits, :attr:`data` reads zero for a word whose bit
    was clear (a write to it in the same cycle counts, as the port is transparent)."""

    def __init__(self, port, writes=None):
        self.port = port
        self.writes = writes
        self.requests = []
        if writes is not None and writes.valid is not None:
            self.ok = Signal(name=f"{writes.name}_rok")
            self._data = Signal.like(port.data, name=f"{writes.name}_rdata")
        else:
            self.ok = None

    @property
    def data(self):
        return self.port.data if self.ok is None else self._data

    def request(self, cond, addr, en=1):
        self.requests.append((cond, addr, en))

    def build(self, m):
        m.d.comb += self.port.en.eq(0)
        if self.requests:                    # the address of no read: the last request's
            m.d.comb += self.port.addr.eq(self.requests[-1][1])
        first = True
        for cond, addr, en in self.requests:
            ctx = m.If(cond) if first else m.Elif(cond)
            first = False
            with ctx:
                m.d.comb += [self.port.addr.eq(addr), self.port.en.eq(en)]
        if self.ok is not None:
            wr = self.writes
            with m.If(self.port.en):
                m.d.sync += self.ok.eq(wr.valid.bit_select(self.port.addr, 1)
                                       | (wr.mask.any() & (wr.addr == self.port.addr)))
            m.d.comb += self._data.eq(Mux(self.ok, self.port.data, 0))


class BankedWrites:
    """The write side of a memory split into two banks by the lowest word-address bit (OUT),
    with the interface of :class:`Writes`; each bank keeps its own priorities."""

    def __init__(self, banks):
        self.banks = banks
        self.clear = Signal(name=f"{banks[0].name}_bclear")

    def request(self, en, addr, data, mask=None):
        for b, wr in enumerate(self.banks):
            wr.request(en & (addr[0] == b), addr >> 1, data, mask)

    def free(self, addr):
        """The load engine may write word ``addr`` in this cycle."""
        return ~Mux(addr[0], self.banks[1].busy, self.banks[0].busy)

    def build(self, m, low=None):
        for b, wr in enumerate(self.banks):
            lo = None
            if low is not None:
                en, addr, data, mask = low
                lo = (en & (addr[0] == b), addr >> 1, data, mask)
            wr.build(m, low=lo)
            if wr.clear is not None:
                m.d.comb += wr.clear.eq(self.clear)


class BankedReads:
    """The read side of a two-bank memory: prioritised users of one word (the bank of the
    winning request answers; :attr:`data` follows the bank last read) or of a pair of words
    ``2 row`` and ``2 row + 1`` at once (:attr:`pair_data`, for OUTPUT)."""

    def __init__(self, banks):
        self.banks = banks
        self.requests = []
        self.sel = Signal()

    def request(self, cond, addr, en=1, *, pair=False):
        """``addr``: a word address, or with ``pair`` a row (both banks at that address)."""
        self.requests.append((cond, addr, en, pair))

    @property
    def data(self):
        return Mux(self.sel, self.banks[1].data, self.banks[0].data)

    @property
    def pair_data(self):
        return Cat(self.banks[0].data, self.banks[1].data)

    def build(self, m):
        act, en, pair, bank = Signal(), Signal(), Signal(), Signal()
        row = Signal(16)
        first = True
        for cond, addr, e, p in self.requests:
            ctx = m.If(cond) if first else m.Elif(cond)
            first = False
            with ctx:
                m.d.comb += [act.eq(1), en.eq(e), pair.eq(p),
                             row.eq(addr if p else addr >> 1), bank.eq(0 if p else addr[0])]
        for b, rd in enumerate(self.banks):
            rd.request(act & (pair | (bank == b)), row, en)
            rd.build(m)
        with m.If(act & en & ~pair):
            m.d.sync += self.sel.eq(bank)


class PEMemories:
    """The PE's memories, each a direct child of the PE's module named as
    :mod:`elmoe3d.synth.blocks` expects (``wmsb0`` .. ``wscale1`` or ``wmsb`` .. ``wscale``,
    ``act``, ``tok``, ``hbuf``, ``out0`` / ``out1`` or ``out``, ``rowmax``), with their
    request objects (a plain helper, not a component: the ports' multiplexers are built once
    every part of the PE has made its requests, :meth:`build`).

    WMEM: per plane (``wmsb``, ``wlsb``, ``wscl``) a memory per buffer (``wbuf_memories`` 2:
    lists of ``(Reads, Writes)``) or one of twice the depth addressed by ``Cat(word, buffer)``
    (a ``(Reads, Writes)`` pair), W/``weight_parts`` bits wide, ``weight_parts`` times as deep.
    IOMEM: ``act``, ``tok``, ``hbuf`` (``(Reads, Writes)``), ``out`` (``(Reads, Writes)``, the
    banked kinds with two banks) and ``rowmax`` (``(Reads, Reads, Writes)``: the sinks' and
    SEND / RECV's port, REQUANT's port), ACT, TOK, HBUF and ROWMAX W/``io_parts`` bits wide,
    OUT W/``out_parts``. ``collisions`` maps each ``no_rw_check`` memory's name to its
    read-write collision signal.

    Words in P parts (``streamed_weights``, ``narrow_iomem``, ``narrow_out``): part p of word w
    at address ``w P + p`` (with both WMEM buffers in one memory, ``(b wmem_words + w) P + p``
    for buffer b). A WMSB or WLSB part p holds depths ``p G/P .. (p+1) G/P - 1`` of every lane
    (lane n's bits ``128 n + 128 p/P ..`` of the loaded word, lane after lane); a WSCALE part
    p the scale entries ``8 p/P ..``; an ACT part p depths ``p G/P .. (p+1) G/P - 1`` of every
    row (bytes ``r G + p G/P ..`` of the word, row after row); the others' part p bits ``p
    W/P ..`` (HBUF values and row-max registers ``p W/32/P ..``, TOK entries and OUT values
    ``p W/64/P ..``).
    """

    def __init__(self, m, *, config, weight_parts=1, io_parts=1, out_parts=1,
                 wbuf_memories=2, out_banks=2, valid_bits=True):
        cfg, W = config, config.word_bits
        Q = W // 32
        self.collisions = {}
        self.split = wbuf_memories == 2
        self.word_bits, self.weight_parts, self.io_parts = W, weight_parts, io_parts
        self.valid_bits = valid_bits

        def mem(name, depth, *, width=W, **kw):
            return memory(m, self.collisions, name, depth, width=width, **kw)

        def wmem_plane(name, depth, parts):
            if self.split:
                return [mem(f"{name}{b}", depth * parts, width=W // parts, collision_free=True)
                        for b in range(2)]
            return mem(name, 2 * depth * parts, width=W // parts, collision_free=True)

        self.wmsb = wmem_plane("wmsb", cfg.wmem_words, weight_parts)
        self.wlsb = wmem_plane("wlsb", cfg.wmem_words, weight_parts)
        self.wscl = wmem_plane("wscale", cfg.wscale_words, weight_parts)  # (8/P entries a part)
        self.wmem_depths = {Target.WMSB: cfg.wmem_words, Target.WLSB: cfg.wmem_words,
                            Target.WSCALE: cfg.wscale_words}
        self.act = mem("act", cfg.act_words * io_parts, width=W // io_parts, granularity=8,
                       collision_free=True)
        self.tok = mem("tok", cfg.tok_words * io_parts, width=W // io_parts, granularity=8)
        self.hbuf = mem("hbuf", cfg.hbuf_words * io_parts, width=W // io_parts, granularity=32,
                        collision_free=True)
        # OUT and the row-max registers have valid bits (valid_bits): CLEAR takes one cycle
        # OUT in two banks (even and odd words): OUTPUT reads two words, one o beat, a cycle
        if out_banks == 2:
            banks = [mem(f"out{b}", (cfg.out_words + 1 - b) // 2, granularity=64,
                         transparent=True, valid_bits=valid_bits) for b in range(2)]
            self.out = (BankedReads([rp for rp, _ in banks]),
                        BankedWrites([wr for _, wr in banks]))
            #: the write side of every OUT memory (CLEAR without valid bits writes each)
            self.out_w_banks = self.out[1].banks
        else:                         # one memory (out_banks=1): OUTPUT reads word by word
            self.out = mem("out", cfg.out_words * out_parts, width=W // out_parts,
                           granularity=64, transparent=True, valid_bits=valid_bits)
            self.out_w_banks = [self.out[1]]
        # the row maxima, W/32 registers of 32 bits per word (the ROWMAX word of SEND / RECV):
        # one read port for the SWIGLU sink's updates (and SEND / RECV), one for REQUANT
        rmax_words = -(-cfg.tok_entries // Q)
        self.rowmax = mem("rowmax", rmax_words * io_parts, width=W // io_parts,
                          granularity=32, transparent=True, valid_bits=valid_bits,
                          read_ports=2)

    def wmem_reads(self) -> list:
        """The WMEM read sides: per plane (MSB, LSB, scales) one per buffer memory."""
        if self.split:
            return [[pair[0] for pair in plane] for plane in (self.wmsb, self.wlsb, self.wscl)]
        return [[plane[0]] for plane in (self.wmsb, self.wlsb, self.wscl)]

    def load_targets(self) -> dict:
        """The write sides a LOAD writes, by target (one per WMEM buffer memory)."""
        return {
            **{t: [plane[0][1], plane[1][1]] if self.split else [plane[1]]
               for t, plane in ((Target.WMSB, self.wmsb), (Target.WLSB, self.wlsb),
                                (Target.WSCALE, self.wscl))},
            Target.ACT: [self.act[1]],
            Target.TOK: [self.tok[1]],
            Target.HBUF: [self.hbuf[1]],
            Target.OUT: [self.out[1]],
        }


    def connect(self, m, *, gemm, next_pass, result, swiglu, combine, clear, link, requant,
                output, sending, outputting):
        """The reads and writes of the PE's parts (:mod:`elmoe3d.hw.pe`) and their read data,
        in each port's priority order (the first request wins; the load engine's writes come
        last, :meth:`build`): WMSB, WLSB, WSCALE the GEMM issue's (``next_pass``: the tile's,
        the next weight part); ACT SEND, the GEMM issue; TOK SEND, the result stage's row
        (``sending``: the execute engine is in SEND); HBUF write the SWIGLU sink, RECV,
        REQUANT; HBUF read SEND, REQUANT; OUT write COMBINE, CLEAR, RECV (plain, accumulate);
        OUT read COMBINE, SEND, RECV, OUTPUT (``outputting``); ROWMAX write SWIGLU, CLEAR,
        RECV; ROWMAX read SWIGLU, SEND, RECV, and its second port REQUANT; ACT and TOK writes
        RECV, REQUANT."""
        act_rp, act_w = self.act
        tok_rp, tok_w = self.tok
        hbuf_rp, hbuf_w = self.hbuf
        out_rp, out_w = self.out
        rmax_rp, rmax_rq, rmax_w = self.rowmax
        m.d.comb += [result.tok_data.eq(tok_rp.data), swiglu.rmax_data.eq(rmax_rp.data),
                     combine.rd_data.eq(out_rp.data), requant.rmax_data.eq(rmax_rq.data),
                     requant.hbuf_data.eq(hbuf_rp.data)]
        # the GEMM's weight and scale reads (read by parts: the first part with the beat, the
        # next ones on the tile's next_pass)
        for plane, en, pass_en in zip(self.wmem_reads(),
                                      (gemm.msb_en, gemm.lsb_en, gemm.scl_en),
                                      (gemm.msb_pass_en, gemm.lsb_pass_en, None)):
            for b, rp in enumerate(plane):
                if pass_en is None:
                    rp.request(1, gemm.scl_addr, en[b])
                    continue
                rp.request(gemm.w_cond, gemm.w_addr, en[b])
                if self.weight_parts > 1:
                    rp.request(next_pass, gemm.w_pass_addr, pass_en[b])
        # the sinks: SWIGLU (HBUF, the row-max read-modify-write), COMBINE (OUT)
        hbuf_w.request(swiglu.hbuf_w_en, swiglu.hbuf_w_addr, swiglu.hbuf_w_data,
                       swiglu.hbuf_w_mask)
        rmax_rp.request(swiglu.rmax_rd, swiglu.rmax_addr, 1)
        rmax_w.request(swiglu.rmax_w_en, swiglu.rmax_w_addr, swiglu.rmax_w_data,
                       swiglu.rmax_w_mask)
        out_rp.request(combine.rd_issue, combine.rd_addr, 1)
        if len(combine.rd_next_addr):
            out_rp.request(combine.rd_next, combine.rd_next_addr, 1)
        out_w.request(combine.w_en, combine.w_addr, combine.w_data, combine.w_mask)
        # CLEAR: valid bits cleared, or zeros written a row a cycle
        if self.valid_bits:
            m.d.comb += [out_w.clear.eq(clear.clear_out), rmax_w.clear.eq(clear.clear_rowmax)]
        else:
            for wr, en in (*((bank, clear.clear_out) for bank in self.out_w_banks),
                           (rmax_w, clear.clear_rowmax)):
                wr.request(en & (clear.row < wr.depth), clear.row, 0)
        # SEND's reads, RECV's writes and its accumulating reads and writes
        link_mems = {Target.ACT: self.act, Target.TOK: self.tok, Target.HBUF: self.hbuf,
                     Target.OUT: self.out, Target.ROWMAX: (rmax_rp, rmax_w)}
        for target, name in LINK_TARGETS.items():
            rp = link_mems[target][0]
            rp.request(getattr(link, f"{name}_rd"), getattr(link, f"{name}_rd_addr"),
                       getattr(link, f"{name}_rd_en"))
            m.d.comb += getattr(link, f"{name}_data").eq(rp.data)
        for target, name in LINK_TARGETS.items():
            link_mems[target][-1].request(getattr(link, f"{name}_w_en"),
                                          getattr(link, f"{name}_w_addr"),
                                          getattr(link, f"{name}_w_data"))
        out_rp.request(link.acc_out_rd, link.acc_out_addr, 1)
        rmax_rp.request(link.acc_rowmax_rd, link.acc_rowmax_addr, 1)
        out_w.request(link.acc_out_w_en, link.acc_w_addr, link.acc_out_w_data)
        rmax_w.request(link.acc_rowmax_w_en, link.acc_w_addr, link.acc_rowmax_w_data)
        # REQUANT: the row maxima (its own port), e_h into TOK, HBUF in, codes into ACT
        rmax_rq.request(requant.rmax_rd, requant.rmax_addr, 1)
        tok_w.request(requant.tok_w_en, requant.tok_w_addr, requant.tok_w_data,
                      requant.tok_w_mask)
        act_w.request(requant.act_w_en, requant.act_w_addr, requant.act_w_data,
                      requant.act_w_mask)
        hbuf_rp.request(requant.hbuf_rd, requant.hbuf_addr, requant.hbuf_en)
        # OUTPUT: a pair of OUT words (both banks), or a word (part) at a time
        if isinstance(out_rp, BankedReads):
            out_rp.request(outputting, output.rd_addr, output.rd_en, pair=True)
            m.d.comb += output.rd_data.eq(out_rp.pair_data)
        else:
            out_rp.request(outputting, output.rd_addr, output.rd_en)
            m.d.comb += output.rd_data.eq(out_rp.data)
        # the ACT read port: the GEMM's unless SEND holds it; TOK: the sink's unless SEND
        if self.io_parts > 1:
            act_rp.request(gemm.step, gemm.act_addr)
            act_rp.request(next_pass, gemm.act_pass_addr)
        else:
            act_rp.request(~sending, gemm.act_addr, gemm.step)
        m.d.comb += gemm.act_data.eq(act_rp.data)
        for plane, port in zip(self.wmem_reads(), (gemm.msb_data, gemm.lsb_data, gemm.scl_data)):
            m.d.comb += [port[b].eq(rp.data) for b, rp in enumerate(plane)]
        log_tk = log2(self.word_bits // 64) - log2(self.io_parts)
        tok_rp.request(~sending, result.row_t >> log_tk)     # read a cycle ahead of stage A

    def build(self, m, *, payload, target, buf, addr, xfer, part, part_write, parted,
              act_elems, lanes):
        """Build every port's multiplexer, the load engine's writes last (lowest priority):
        word ``payload`` (W bits) of a LOAD into ``target`` (buffer ``buf``) at ``addr`` when
        ``xfer``, or with a ``parted`` target its part ``part`` when ``part_write`` (WMSB and
        WLSB lane by lane with ``weight_parts`` > 1, ACT by ``act_elems``, the others by bit
        ranges). Returns the load's grant: the target's write port is free in this cycle."""
        parts = self.weight_parts
        if parts > 1:                 # the parts of the loaded word (streamed_weights)
            lane_bits, part_lane = 128, 128 // parts
            ld_parts = Array(Cat(payload[lane_bits * n + part_lane * p:][:part_lane]
                                 for n in range(lanes)) for p in range(parts))
        grants = []
        for t, writes in self.load_targets().items():
            for b, wr in enumerate(writes):
                sel = target == t
                waddr = addr
                if len(writes) == 2:
                    sel = sel & (buf == b)
                elif t in self.wmem_depths:           # both buffers in one memory
                    waddr = Cat(addr[:log2(self.wmem_depths[t])], buf)
                if parts > 1 and t in (Target.WMSB, Target.WLSB):
                    wr.build(m, low=(part_write & sel, Cat(part, waddr), ld_parts[part], None))
                elif t in parted:  # (WSCALE with streamed_weights, narrow IOMEM)
                    pieces = parts_of(payload, t == Target.ACT, word_bits=len(payload),
                                      act_elems=act_elems)
                    wr.build(m, low=(part_write & sel, Cat(part, waddr), Array(pieces)[part],
                                     None))
                else:
                    wr.build(m, low=(xfer & sel, waddr, payload, None))
                grants.append((sel, wr.free(addr) if isinstance(wr, BankedWrites)
                               else ~wr.busy))
        grant = Const(1, 1)
        for sel, ok in grants:
            grant = Mux(sel, ok, grant)
        self.rowmax[2].build(m)
        for reads in (*(r for plane in self.wmem_reads() for r in plane), self.act[0],
                      self.tok[0], self.hbuf[0], self.out[0], self.rowmax[0], self.rowmax[1]):
            reads.build(m)
        return grant

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

from amaranth.hdl import Cat, Mux, Signal, unsigned
from amaranth.lib.memory import Memory


__all__ = ["Writes", "Reads", "BankedWrites", "BankedReads", "memory"]


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

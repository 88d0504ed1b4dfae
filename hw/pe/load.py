"""The PE's load engine and the WMEM buffer flags (paper Sections 4.1 and 5.2, Fig. 10b;
``docs/pe.md``, "Engines and synchronisation")."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, Value, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ...checks import is_int, python_int_hint
from ...isa import Target
from .common import SEQ, check_choice, check_word_bits, log2
from .decoder import load_entry_layout


__all__ = ["LoadEngine"]


class LoadEngine(wiring.Component):
    """Runs the queued LOADs in order, one ``ld`` beat per cycle into the target memory (the
    write itself is the PE's: :attr:`xfer` / :attr:`part_write` at :attr:`addr`, with the
    lowest priority on the port, ``grant`` low while another writer has it), the next LOAD
    from the cycle after the previous one's last word. The WMEM buffer flags: a buffer is
    :attr:`full` ``[b]`` from the completion of a LOAD with ``signal`` into it (a GEMM with
    ``wait`` waits for that) until the GEMM that releases it lets go of it. With
    ``low_words`` > 0 each half of a buffer has a flag of its own, :attr:`low` and
    :attr:`high` (weight words below / from ``low_words``, scale words below / from
    ``low_words / 8``): both are set by ``signal``, and the releasing GEMM clears each half's
    flag once it has read that half for the last time (``release_low``, ``release_high``,
    ``release``: the GEMM's last read). A LOAD into a WMEM plane waits, word by word, for the
    flag of the half it writes; a LOAD with ``signal`` waits for both. ``fence`` waits until
    every execute command before the LOAD has completed (``fence_ok``, which the PE evaluates
    a cycle ahead and the engine registers; :attr:`fence_wait` is the wait); every LOAD waits
    while ``hold`` (a BARRIER, ``CLEAR counters`` or STATUS before it in the program has not
    started). A word into a memory in P parts (``parted`` targets) is written part by part,
    ``ld.ready`` with the last.

    Ports
    -----
    ld : In, stream of W bits
        Load data (the PE writes ``ld.payload``; this engine drives ``ld.ready``).
    queue : In, stream of :func:`~elmoe3d.hw.pe.decoder.load_entry_layout`
        The decoder's LOAD queue.
    fence_ok : In(1)
        Every execute command taken before the ``need`` of the LOAD run in the next cycle (the
        queue's head if the engine takes it in this cycle, else :attr:`need`) has completed.
        Registered here: a fenced LOAD takes no word before the cycle after its fence
        clears, and the PE's sequence compares do not lie in front of the memories' write
        ports (docs/synth.md "Timing").
    hold : In(1)
        A BARRIER, ``CLEAR counters`` or STATUS taken before that ``need`` has not started:
        the LOAD takes no word (the counters it clears or sends count exactly the LOADs
        before it). Registered like ``fence_ok``.
    grant : In(1)
        The target memory's write port is free for the load in this cycle.
    release, release_buf : In(1), In(1)
        Clear both flags of buffer ``release_buf`` (a GEMM has read its buffer's last weight
        word; wins over a load's ``signal`` setting them in the same cycle).
    release_low, release_high : In(1)
        Clear ``low[release_buf]`` / ``high[release_buf]`` (the releasing GEMM reads that half
        no more).
    full : Out(2)
        Per buffer: both halves' flags set (what a GEMM's ``wait`` waits for).
    low, high : Out(2)
        The flags of the buffers' lower and upper halves (one flag, ``high``, without
        ``low_words``: ``low`` equals it).
    active, target, buf, addr, left, need, fence : Out
        The LOAD being run (``left`` words still to come; ``addr`` the next word's).
    blocked : Out(1)
        It waits for a buffer flag, its fence or ``hold``.
    fence_wait : Out(1)
        It waits for its fence (the registered ``fence_ok``: the cycles it takes no word for
        it).
    xfer : Out(1)
        A ``ld`` word is taken (written, or its last part) in this cycle.
    part, part_write : Out
        The part written in this cycle (``parted`` targets only).

    Parameters
    ----------
    word_bits : int
        W.
    parted : tuple of Target
        Targets whose memories hold a word in ``passes`` parts.
    passes : int
        P, the parts of a word of a ``parted`` target.
    low_words : int
        Weight words of a buffer's lower half, a multiple of 8
        (:attr:`~elmoe3d.config.PEConfig.wmem_low_words`); 0: one flag per buffer.

    Raises
    ------
    ValueError
        A parameter out of range (the message names it).
    """

    def __init__(self, *, word_bits, parted=(), passes=1, low_words=0):
        check_word_bits(word_bits)
        check_choice("passes", passes, (1, 2, 4))
        if any(not isinstance(t, Target) for t in parted) or (parted and passes == 1):
            raise ValueError(f"parted: expected Targets stored in passes > 1 parts, got "
                             f"{parted!r} with passes={passes!r}")
        if not is_int(low_words, numpy=False) or low_words < 0 \
                or low_words % 8:
            raise ValueError(f"low_words: expected 0 or a positive multiple of 8"
                             f"{python_int_hint(low_words)}, got {low_words!r}")
        self._parted, self._passes, self._low = tuple(parted), passes, low_words
        super().__init__({
            "ld": In(stream.Signature(unsigned(word_bits))),
            "queue": In(stream.Signature(load_entry_layout())),
            "fence_ok": In(1),
            "hold": In(1),
            "grant": In(1),
            "release": In(1),
            "release_buf": In(1),
            "release_low": In(1),
            "release_high": In(1),
            "full": Out(2),
            "low": Out(2),
            "high": Out(2),
            "active": Out(1),
            "target": Out(3),
            "buf": Out(1),
            "addr": Out(16),
            "left": Out(16),
            "need": Out(SEQ),
            "fence": Out(1),
            "blocked": Out(1),
            "fence_wait": Out(1),
            "xfer": Out(1),
            "part": Out(log2(passes) if self._parted else 0),
            "part_write": Out(1),
        })

    @property
    def latency(self) -> int:
        """Cycles from a LOAD at the queue's head (the engine idle) to its first word taken."""
        return 1

    def elaborate(self, platform):
        m = Module()
        P, parted = self._passes, self._parted
        low, high = self.low, self.high
        ld_target, ld_buf, ld_addr, ld_left = self.target, self.buf, self.addr, self.left
        ld_active, ld_fence = self.active, self.fence
        ld_signal = Signal()

        def set_flag(flags, b, value):
            with m.If(b):
                m.d.sync += flags[1].eq(value)
            with m.Else():
                m.d.sync += flags[0].eq(value)

        if self._low:
            m.d.comb += self.full.eq(low & high)
            # a WMEM word waits for its half's flag (docs/pe.md), a signalling LOAD for both
            in_low = Mux(ld_target == Target.WSCALE, ld_addr < self._low // 8,
                         ld_addr < self._low)
            busy = low | high
            ld_flag = Mux(ld_signal, Mux(ld_buf, busy[1], busy[0]),
                          Mux(in_low, Mux(ld_buf, low[1], low[0]),
                              Mux(ld_buf, high[1], high[0])))
        else:
            m.d.comb += [self.full.eq(high), low.eq(high)]
            ld_flag = Mux(ld_buf, high[1], high[0])
        # fence and hold of the LOAD run in this cycle, evaluated by the PE a cycle ahead
        fence_ok, hold = Signal(), Signal()
        m.d.sync += [fence_ok.eq(self.fence_ok), hold.eq(self.hold)]
        m.d.comb += [
            self.fence_wait.eq(ld_active & ld_fence & ~fence_ok),
            self.blocked.eq(((ld_target <= Target.WSCALE) & ld_flag) | (ld_fence & ~fence_ok)
                            | hold),
        ]
        ld_open = ld_active & (ld_left != 0) & ~self.blocked & self.grant
        if parted:
            # a word into a memory in P parts (streamed_weights, narrow_iomem): part by part,
            # the word taken with its last
            ld_part = self.part
            ld_parted = Cat(ld_target == t for t in parted).any()
            m.d.comb += self.part_write.eq(self.ld.valid & ld_open & ld_parted)
            with m.If(self.part_write):
                m.d.sync += ld_part.eq(ld_part + 1)
            m.d.comb += self.ld.ready.eq(ld_open & (~ld_parted | (ld_part == P - 1)))
        else:
            m.d.comb += self.ld.ready.eq(ld_open)
        m.d.comb += self.xfer.eq(self.ld.valid & self.ld.ready)
        with m.If(self.xfer):
            m.d.sync += [ld_addr.eq(ld_addr + 1), ld_left.eq(ld_left - 1)]
        # a load ends with its last word (the next one starts in the following cycle)
        ld_finish = (self.xfer & (ld_left == 1)) | (ld_active & (ld_left == 0) & ~self.blocked)
        with m.If(ld_finish):
            m.d.sync += ld_active.eq(0)
            with m.If(ld_signal):
                set_flag(high, ld_buf, 1)
                if self._low:
                    set_flag(low, ld_buf, 1)
        if self._low:
            with m.If(self.release | self.release_low):
                set_flag(low, self.release_buf, 0)
        with m.If(self.release | self.release_high):
            set_flag(high, self.release_buf, 0)
        ld_next = self.queue.payload
        m.d.comb += self.queue.ready.eq(~ld_active | ld_finish)
        with m.If(self.queue.valid & self.queue.ready):
            m.d.sync += [
                ld_active.eq(1),
                ld_target.eq(Value.cast(ld_next.cmd.target)),
                ld_buf.eq(ld_next.cmd.buf),
                ld_addr.eq(ld_next.cmd.addr),
                ld_left.eq(ld_next.cmd.words),
                ld_signal.eq(ld_next.cmd.signal),
                ld_fence.eq(ld_next.cmd.fence),
                self.need.eq(ld_next.need),
            ]
        return m

"""EXT admission scheduler of the logic die: credit-based, per-destination admission of EXT
read descriptors, so that words on the streamline ring never wait for a PE (paper Section
4.1, Fig. 6: "streamline data circulates across PE groups and is written to WMEM").

It sits between the host's EXT descriptor queue and the :class:`~elmoe3d.hw.ext_stream.
ExtStreamer`, and cuts descriptors into *chunks* (descriptors of the same layout) that the
streamer reads and injects in order. The rule is :mod:`elmoe3d.sw.golden.ext_sched` (golden
:func:`~elmoe3d.sw.golden.ext_sched.ext_pick`, cycle model
:class:`~elmoe3d.sw.golden.ext_sched.ExtSchedModel`): a window of the oldest ``window``
descriptors; one credit counter per PE (the free words of its load router's EXT FIFO, returned
one per word the router pops); the oldest entry that shares no destination with an older one
and whose destinations all have credit for its next chunk (``min(words left, chunk_words)``)
issues that chunk.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream
from amaranth.lib.wiring import In, Out

from .checked import CheckedComponent, check_param
from .ext_stream import ext_read_layout
from .layouts import sticky_flags
from .load_router import WORDS_BITS


__all__ = ["ExtScheduler", "ExtGroupMerge", "ext_sched_errors_layout"]


def ext_sched_errors_layout() -> data.StructLayout:
    """The EXT scheduler's sticky error flags (``errors``; ``errors_clear`` has the same
    layout, a write-1-to-clear strobe per bit).

    Fields
    ------
    bad_credit : 1
        A credit came back for a PE whose counter was already full (a word popped that the
        scheduler never admitted: the golden :class:`~elmoe3d.sw.golden.ext_sched.
        ExtSchedModel` raises). The counter stays at ``credits`` (saturates, no wrap).
    """
    return data.StructLayout({"bad_credit": unsigned(1)})


class ExtScheduler(CheckedComponent):
    """Credit-based EXT descriptor admission (module docstring).

    Ports
    -----
    desc : In, :func:`elmoe3d.hw.ext_stream.ext_read_layout` (``pes``)
        EXT read descriptors in host order. Taken when the window has a free entry
        (``desc.ready`` depends on registers only); a descriptor of 0 words is taken and
        dropped.
    chunk : Out, :func:`elmoe3d.hw.ext_stream.ext_read_layout` (``pes``)
        Chunks of at most ``chunk_words`` words (``addr``, ``words`` >= 1, the descriptor's
        ``dst_mask``), registered; to the streamer's ``desc``.
    credit : In, ``pes`` bits
        Bit p: PE p's load router popped one EXT word in this cycle (one credit back). A
        credit for a PE with no outstanding credit (its counter full at the start of the
        cycle, whether or not a chunk for it is admitted in this cycle: those words cannot
        be popped yet) is refused: the counter keeps its value and ``errors.bad_credit`` is
        set.
    errors : Out :func:`ext_sched_errors_layout`
        Sticky error flags, shown :attr:`errors_latency` = 1 cycle after the event, held until
        cleared by ``errors_clear`` (or reset).
    errors_clear : In :func:`ext_sched_errors_layout`
        Write-1-to-clear strobes (setting wins in the same cycle).

    Latency: a descriptor taken in cycle c can issue its first chunk on ``chunk`` in cycle
    c + 2 (into the window, then the output register). Throughput: one chunk per cycle. A
    chunk's words are taken from its PEs' credits in the cycle it enters the output register;
    a credit returned in cycle c can be used in cycle c + 1.

    Parameters
    ----------
    pes : int
        The PEs it serves (the width of ``dst_mask`` and ``credit``): on the die, one group's
        PEs (``LogicDie`` builds one scheduler per group with ``pes_per_group``, the group's
        bits of a descriptor's ``dst_mask``).
    window : int
        Descriptors held (>= 1). On the die, one scheduler per group (``LogicDie``), replayed
        with the same window by :func:`elmoe3d.sw.host.parallel.check_link_schedule`.
    credits : int
        Words of every PE's EXT FIFO (>= ``chunk_words``), the credits at reset.
    chunk_words : int
        Largest chunk in words (>= 1).

    Raises
    ------
    ValueError
        A parameter out of range (named), or ``credits < chunk_words`` (a full chunk would
        never be admitted).
    """

    @classmethod
    def check(cls, *, pes, window, credits, chunk_words):
        """The constructor's checks: raises before the object exists."""
        for name, value in (("pes", pes), ("window", window), ("credits", credits),
                            ("chunk_words", chunk_words)):
            check_param(name, value)
        if credits < chunk_words:
            raise ValueError(f"credits: {credits} words is less than chunk_words "
                             f"({chunk_words}); a full chunk would never be admitted")
        if chunk_words >= 1 << WORDS_BITS:
            raise ValueError(f"chunk_words: {chunk_words} does not fit the {WORDS_BITS}-bit "
                             f"word count (at most {(1 << WORDS_BITS) - 1})")

    def __init__(self, *, pes: int, window: int, credits: int, chunk_words: int):
        self._pes, self._window, self._credits, self._chunk = pes, window, credits, chunk_words
        layout = ext_read_layout(pes)
        super().__init__({
            "desc": In(stream.Signature(layout)),
            "chunk": Out(stream.Signature(layout)),
            "credit": In(pes),
            "errors": Out(ext_sched_errors_layout()),
            "errors_clear": In(ext_sched_errors_layout()),
        })

    pes = property(lambda self: self._pes)
    window = property(lambda self: self._window)
    credits = property(lambda self: self._credits)
    chunk_words = property(lambda self: self._chunk)
    latency = property(lambda self: 2, doc="Cycles from a descriptor taken to its first "
                                           "chunk offered (credits permitting).")
    errors_latency = property(lambda self: 1, doc="Cycles from a bad credit or an "
                                                  "``errors_clear`` strobe to ``errors``.")

    def elaborate(self, platform):
        m = Module()
        P, N, C, CW = self._pes, self._window, self._credits, self._chunk
        layout = ext_read_layout(P)
        ent = [Signal(layout, name=f"ent{i}") for i in range(N)]
        cnt = Signal(range(N + 1))
        cred = [Signal(range(C + 1), init=C, name=f"cred{p}") for p in range(P)]
        o_valid = Signal()
        o_data = Signal(layout)
        m.d.comb += [self.chunk.valid.eq(o_valid), self.chunk.payload.eq(o_data),
                     self.desc.ready.eq(cnt < N)]
        o_free = ~o_valid | self.chunk.ready

        # -- the pick: the oldest entry with no older entry sharing a PE and credit for all --
        need = [Signal(WORDS_BITS, name=f"need{i}") for i in range(N)]
        ok = [Signal(name=f"ok{i}") for i in range(N)]
        blocked = Signal(P)
        for i, e in enumerate(ent):
            m.d.comb += need[i].eq(Mux(e.words < CW, e.words, CW))
            enough = Cat(*[~e.dst_mask[p] | (cred[p] >= need[i]) for p in range(P)]).all()
            m.d.comb += ok[i].eq((i < cnt) & ((e.dst_mask & blocked) == 0) & enough)
            nb = Signal(P, name=f"blocked{i + 1}")
            m.d.comb += nb.eq(blocked | Mux(i < cnt, e.dst_mask, 0))
            blocked = nb
        sel = Signal(range(N))
        any_ok = Signal()
        for i in reversed(range(N)):
            with m.If(ok[i]):
                m.d.comb += [sel.eq(i), any_ok.eq(1)]
        fire = o_free & any_ok
        n = Signal(WORDS_BITS)
        mask = Signal(P)
        done = Signal()                          # the picked entry's last chunk
        m.d.comb += [n.eq(need[0]), mask.eq(ent[0].dst_mask), done.eq(need[0] == ent[0].words)]
        for i in range(1, N):
            with m.If(sel == i):
                m.d.comb += [n.eq(need[i]), mask.eq(ent[i].dst_mask),
                             done.eq(need[i] == ent[i].words)]
        with m.If(self.chunk.valid & self.chunk.ready):
            m.d.sync += o_valid.eq(0)
        with m.If(fire):
            m.d.sync += [o_valid.eq(1), o_data.dst_mask.eq(mask), o_data.words.eq(n)]
            for i in range(N):
                with m.If(sel == i):
                    m.d.sync += o_data.addr.eq(ent[i].addr)

        # -- credits: the chunk's words out, one back per popped word; a credit for a full
        #    counter is refused (errors.bad_credit) --
        over = Signal(P)
        for p in range(P):
            taken = fire & mask[p]
            out = Mux(taken, n, 0)
            # a full counter has no word out for this PE: its credit is bogus, even in the
            # cycle a chunk is admitted (those words cannot be popped yet)
            m.d.comb += over[p].eq(self.credit[p] & (cred[p] == C))
            m.d.sync += cred[p].eq(cred[p] - out + (self.credit[p] & ~over[p]))
        sticky_flags(m, self.errors, set_={"bad_credit": over.any()}, clear=self.errors_clear)

        # -- window: the picked entry advanced or removed (younger ones move up), the new one
        #    appended --
        remove = fire & done
        upd = []
        for i, e in enumerate(ent):
            u = Signal(layout, name=f"upd{i}")
            m.d.comb += u.eq(e)
            with m.If(fire & (sel == i)):
                m.d.comb += [u.addr.eq(e.addr + n), u.words.eq(e.words - n)]
            upd.append(u)
        take = self.desc.valid & self.desc.ready & (self.desc.payload.words != 0)
        after = Signal(range(N + 1))
        m.d.comb += after.eq(cnt - remove)
        for i in range(N):
            shifted = upd[i + 1] if i + 1 < N else upd[i]
            nxt = Mux(remove & (i >= sel), shifted, upd[i])
            with m.If(take & (after == i)):
                m.d.sync += ent[i].eq(self.desc.payload)
            with m.Else():
                m.d.sync += ent[i].eq(nxt)
        m.d.sync += cnt.eq(after + take)
        return m


class ExtGroupMerge(CheckedComponent):
    """The die's wiring between its per-group EXT queues, the groups' schedulers and the one
    EXT streamer (combinational but for the round-robin pointer and the held pick).

    Ports
    -----
    queue : In array of ``groups`` streams, :func:`elmoe3d.hw.ext_stream.ext_read_layout`
        (``groups x pes_per_group``)
        Group ``g``'s EXT queue (die-wide ``dst_mask``; the die has dropped a mask that is
        empty or leaves the group).
    desc : Out array of ``groups`` streams, ``ext_read_layout(pes_per_group)``
        To group ``g``'s scheduler: the queue's beat with the group's bits of ``dst_mask``
        (bits ``g x pes_per_group`` up).
    chunk : In array of ``groups`` streams, ``ext_read_layout(pes_per_group)``
        Group ``g``'s scheduler's chunks.
    out : Out stream, ``ext_read_layout(groups x pes_per_group)``
        To the streamer: one group's chunk with its mask shifted back to the die's PEs. The
        groups take turns round robin: from the group after the last one served, the first
        with a chunk (so ``k`` groups that always have one are served in rotation); a chunk
        offered and not taken stays on offer, unchanged, until taken.

    Parameters
    ----------
    groups, pes_per_group : int
        >= 1.
    """

    @classmethod
    def check(cls, *, groups, pes_per_group):
        """The constructor's checks: raises before the object exists."""
        check_param("groups", groups)
        check_param("pes_per_group", pes_per_group)

    def __init__(self, *, groups: int, pes_per_group: int):
        self._groups, self._g = groups, pes_per_group
        die, grp = ext_read_layout(groups * pes_per_group), ext_read_layout(pes_per_group)
        super().__init__({
            "queue": In(stream.Signature(die)).array(groups),
            "desc": Out(stream.Signature(grp)).array(groups),
            "chunk": In(stream.Signature(grp)).array(groups),
            "out": Out(stream.Signature(die)),
        })

    groups = property(lambda self: self._groups)
    pes_per_group = property(lambda self: self._g)

    def elaborate(self, platform):
        m = Module()
        NG, G = self._groups, self._g
        for g in range(NG):
            q, d = self.queue[g], self.desc[g]
            m.d.comb += [d.valid.eq(q.valid), d.payload.addr.eq(q.payload.addr),
                         d.payload.words.eq(q.payload.words),
                         d.payload.dst_mask.eq(q.payload.dst_mask[g * G:(g + 1) * G]),
                         q.ready.eq(d.ready)]
        rr = Signal(range(NG) if NG > 1 else 1)
        pick = Signal(range(NG) if NG > 1 else 1)
        any_c = Signal()
        # a chunk offered and not taken stays on offer unchanged (the stream rule): its
        # group is held until the streamer takes it
        held = Signal()
        held_g = Signal.like(pick)
        with m.If(held):
            m.d.comb += pick.eq(held_g)
            for g in range(NG):
                with m.If(held_g == g):
                    m.d.comb += any_c.eq(self.chunk[g].valid)
        with m.Else():
            for k in reversed(range(NG)):   # the first group with a chunk from rr on
                for g in range(NG):
                    with m.If((rr == g) & self.chunk[(g + k) % NG].valid):
                        m.d.comb += [pick.eq((g + k) % NG), any_c.eq(1)]
        m.d.sync += [held.eq(self.out.valid & ~self.out.ready), held_g.eq(pick)]
        for g in range(NG):
            c = self.chunk[g]
            with m.If(pick == g):
                m.d.comb += [self.out.payload.addr.eq(c.payload.addr),
                             self.out.payload.words.eq(c.payload.words),
                             self.out.payload.dst_mask.eq(c.payload.dst_mask << (g * G)),
                             c.ready.eq(self.out.ready)]
        m.d.comb += self.out.valid.eq(any_c)
        with m.If(self.out.valid & self.out.ready):
            m.d.sync += rr.eq(Mux(pick == NG - 1, 0, pick + 1))
        return m

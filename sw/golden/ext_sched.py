"""Golden model of the die's EXT admission scheduler: credit-based, per-destination admission
of EXT read descriptors onto the streamline ring (paper Section 4.1, Fig. 6: "a memory
controller orchestrates data flow ... streamline data circulates across PE groups"; the
ring's flow control is ours).

The rule (one definition, used by the RTL's unit tests through :class:`ExtSchedModel` and by
the compiler's schedule model :func:`elmoe3d.sw.host.parallel.check_link_schedule` through
:func:`ext_pick`):

* The scheduler holds a *window* of the oldest ``window`` descriptors not yet fully issued,
  in host order, each ``(addr, words left, dst_mask)``.
* It keeps one *credit* count per PE: the free words of that PE's EXT FIFO (the load
  router's ``ext_fifo_words``) minus the words issued to it and not yet popped by its load
  router. A credit comes back when the router pops an EXT word.
* A descriptor's next *chunk* is ``min(words left, chunk_words)`` words from its current
  address. Entry i may issue its chunk when (a) no older entry of the window shares a
  destination with it (so every PE receives its words in host order) and (b) every PE of its
  ``dst_mask`` has at least the chunk's words of credit. The oldest such entry issues; its
  destinations' credits fall by the chunk's words, and it leaves the window with its last
  chunk.

Issued words always have room in their PEs' FIFOs, so a flit on the ring never waits for a PE
(no head-of-line blocking); a PE that computes slowly only holds back its own descriptors (and
younger ones naming it). Plain Python; never imports Amaranth or cocotb.
"""

from __future__ import annotations

from dataclasses import dataclass, field


__all__ = ["ext_chunk", "ext_pick", "ext_chunk_order", "round_robin",
           "ExtSchedModel"]


def _bits(mask: int):
    p = 0
    while mask:
        if mask & 1:
            yield p
        mask >>= 1
        p += 1


def ext_chunk(words_left: int, chunk_words: int) -> int:
    """Words of a descriptor's next chunk: ``min(words_left, chunk_words)``."""
    return min(words_left, chunk_words)


def ext_pick(window, credits, chunk_words: int):
    """The entry the scheduler issues from, and its chunk's words: ``(index, words)``, or
    ``None`` when no entry may issue.

    ``window``: sequence of ``(addr, words_left, dst_mask)`` (``words_left`` >= 1), oldest
    first; ``credits``: per PE, the words it can still take. Rule: the module docstring."""
    blocked = 0
    for i, (_, left, mask) in enumerate(window):
        need = ext_chunk(left, chunk_words)
        if not mask & blocked and all(credits[p] >= need for p in _bits(mask)):
            return i, need
        blocked |= mask
    return None


def round_robin(queues) -> list:
    """The items of ``queues`` (lists) taken in turn, one from each non-empty list, from the
    first: ``[[a0, a1], [b0], [c0, c1]] -> [a0, b0, c0, a1, c1]``, as the die's
    :class:`elmoe3d.hw.ext_sched.ExtGroupMerge` serves groups that always have a chunk."""
    queues = [list(q) for q in queues]
    order = []
    for k in range(max(map(len, queues), default=0)):
        order += [q[k] for q in queues if k < len(q)]
    return order


def ext_chunk_order(queues, pes_per_group: int, chunk_words: int) -> list:
    """The chunks the die sends its EXT streamer while credits never run short (every PE's
    FIFO always has room: its load router drains), in order: ``[(group, addr, words,
    dst_mask)]``, ``dst_mask`` the die's (group ``g``'s PE ``j`` is bit
    ``g x pes_per_group + j``).

    ``queues``: ``[(g, descriptors)]``, group ``g``'s EXT read descriptors in host order, each
    ``(addr, words, dst_mask)`` (``words`` the list of the words the descriptor reads from
    ``addr``, at least one; ``dst_mask`` non-zero, within the group: bits below
    ``pes_per_group``), the groups ascending. Each group's scheduler issues by :func:`ext_pick`
    (with full credits: its oldest descriptor, chunk after chunk, as :class:`ExtSchedModel`
    does), and the groups' chunks take turns (:func:`round_robin`). Short of credits, a
    younger descriptor to other PEs may go first and the turns shift: :class:`ExtSchedModel`
    steps that per cycle. Raises :class:`ValueError` naming the group for a descriptor of no
    words or a mask that is empty or leaves the group (the die drops those)."""
    issued = []
    for g, descs in queues:
        window = [[addr, len(words), mask, list(words)] for addr, words, mask in descs]
        for _, left, mask, _ in window:
            if left < 1:
                raise ValueError(f"group {g}: a descriptor of no words")
            if not 0 < mask < 1 << pes_per_group:
                raise ValueError(f"group {g}: dst_mask {mask:#x} is empty or leaves the group "
                                 f"of {pes_per_group} PEs")
        out, credits = [], [chunk_words] * pes_per_group
        while window:
            i, n = ext_pick([(a, left, mask) for a, left, mask, _ in window], credits,
                            chunk_words)
            addr, left, mask, words = window[i]
            out.append((g, addr, words[:n], mask << g * pes_per_group))
            window[i] = [addr + n, left - n, mask, words[n:]]
            if left == n:
                window.pop(i)
        issued.append(out)
    return round_robin(issued)


@dataclass
class ExtSchedModel:
    """Cycle model of :class:`elmoe3d.hw.ext_sched.ExtScheduler`, stepped once per clock with
    the inputs the RTL samples in that clock.

    Outputs of the current cycle (read before :meth:`step`): :attr:`desc_ready` (the window has
    a free entry), :attr:`out` (``None`` or the chunk ``(addr, words, dst_mask)`` offered).
    """

    pes: int
    window: int
    credits_max: int
    chunk_words: int
    entries: list = field(default_factory=list)     # [addr, left, mask], oldest first
    credits: list = None
    out: tuple | None = None

    def __post_init__(self):
        if self.credits is None:
            self.credits = [self.credits_max] * self.pes

    @property
    def desc_ready(self) -> bool:
        return len(self.entries) < self.window

    def step(self, desc=None, out_ready: bool = False, credit_mask: int = 0) -> None:
        """One clock: ``desc`` = ``(addr, words, dst_mask)`` offered on ``desc`` (or None),
        ``out_ready`` the sink's ready, ``credit_mask`` bit p = PE p popped one EXT word."""
        take = desc is not None and self.desc_ready
        for p in _bits(credit_mask):        # a full counter has no word out: a bogus credit,
            if self.credits[p] >= self.credits_max:     # even in a cycle that admits a chunk
                raise AssertionError(f"PE {p}: a credit returned that was never taken")
        if self.out is not None and out_ready:
            self.out = None
        if self.out is None:
            pick = ext_pick([tuple(e) for e in self.entries], self.credits, self.chunk_words)
            if pick is not None:
                i, n = pick
                addr, left, mask = self.entries[i]
                self.out = (addr, n, mask)
                for p in _bits(mask):
                    self.credits[p] -= n
                if n == left:
                    del self.entries[i]
                else:
                    self.entries[i] = [addr + n, left - n, mask]
        for p in _bits(credit_mask):
            self.credits[p] += 1
        if take and desc[1] != 0:
            self.entries.append(list(desc))

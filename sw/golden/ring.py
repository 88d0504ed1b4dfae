"""Golden model of the streamline ring (paper Section 4.1, Fig. 6: "streamline data circulates
across PE groups and is written to WMEM"; Table 1: 128 GB/s).

The ring carries external (LPDDR5) weight data to the PEs (one 128 B flit per cycle at 1 GHz),
unicast or multicast by a per-PE destination mask. :class:`RingFlit` is one flit,
:func:`ref_ring` the word sequence every PE's ``ext`` port delivers, :func:`ring_flits` cuts a
word transfer into flits, :func:`ring_geometry` says how words and flits fit. RTL:
:class:`elmoe3d.hw.ring.StreamlineRing`.

Words are W-bit Python integers (W = ``ArchConfig.pe.word_bits``).

Plain Python and NumPy; never imports Amaranth or cocotb.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...checks import check_int, is_int, python_int_hint


__all__ = ["RingFlit", "ring_geometry", "ring_flits", "word_beats", "ref_ring", "ref_ring_streams"]


def ring_geometry(*, word_bits: int, flit_bytes: int) -> tuple[int, int]:
    """``(words_per_flit, flits_per_word)`` of a ring carrying W-bit words in flits of
    ``flit_bytes``: a flit holds ``F*8 / W`` whole words when ``F*8 >= W``, otherwise a word
    spans ``W / (F*8)`` consecutive flits to the same PEs. One of the two is 1. ValueError
    naming ``word_bits`` or ``flit_bytes`` when neither divides the other."""
    if not is_int(word_bits, numpy=False) or word_bits <= 0 or word_bits % 8:
        raise ValueError(f"word_bits: expected a positive multiple of 8"
                         f"{python_int_hint(word_bits)}, got {word_bits!r}")
    check_int("flit_bytes", flit_bytes, 1, numpy=False)
    fb = flit_bytes * 8
    if fb >= word_bits:
        if fb % word_bits:
            raise ValueError(f"flit_bytes: {flit_bytes} B is not a whole number of (word_bits) "
                             f"{word_bits}-bit words")
        return fb // word_bits, 1
    if word_bits % fb:
        raise ValueError(f"word_bits: {word_bits} is not a whole number of {flit_bytes} B flits")
    return 1, word_bits // fb


@dataclass(frozen=True)
class RingFlit:
    """One streamline flit (RTL layout :func:`elmoe3d.hw.ring.ring_flit_layout`).

    Attributes
    ----------
    data : int
        ``flit_bytes * 8`` bits of payload, little-endian: word slot j (when a flit holds
        several words) is bits ``[j W, (j + 1) W)``; when a word spans several flits, flit t of
        the word is its bits ``[t F*8, (t + 1) F*8)``.
    dst_mask : int
        One bit per PE of the die (bit p = PE p): every PE named receives the flit (multicast).
        0 delivers nowhere (the first station drops it).
    stream : int
        Stream id (e.g. one per weight transfer of the external controller). The ring never
        reorders flits, so streams only label traffic for sources and monitors.
    last : bool
        Last flit of its stream's transfer (carried, not interpreted by the ring).
    words : int
        Valid word slots (1..words_per_flit) when a flit holds several words: slots
        ``[0, words)`` are delivered. 1 when a word spans flits.
    """

    data: int
    dst_mask: int
    stream: int = 0
    last: bool = False
    words: int = 1

    def check(self, *, pes: int, word_bits: int, flit_bytes: int, stream_bits: int):
        """ValueError naming the field unless the flit fits the ring's geometry."""
        per, _ = ring_geometry(word_bits=word_bits, flit_bytes=flit_bytes)
        for name, v, hi in (("data", self.data, 1 << (8 * flit_bytes)),
                            ("dst_mask", self.dst_mask, 1 << pes),
                            ("stream", self.stream, 1 << stream_bits)):
            if not is_int(v) or not 0 <= v < hi:
                raise ValueError(f"{name}: expected an integer in 0..{hi - 1}, got {v!r}")
        if not is_int(self.words) or not 1 <= self.words <= per:
            raise ValueError(f"words: expected 1..{per} valid word slots, got {self.words!r}")
        return self


def ring_flits(words, dst_mask: int, *, word_bits: int, flit_bytes: int, stream: int = 0):
    """Cut a transfer of W-bit ``words`` to the PEs of ``dst_mask`` into :class:`RingFlit` s
    (the last one partly filled when a flit holds several words; ``last`` set on the final
    flit). The inverse of :func:`ref_ring` for one transfer."""
    per, span = ring_geometry(word_bits=word_bits, flit_bytes=flit_bytes)
    words = [int(w) for w in words]
    flits = []
    if span == 1:
        for i in range(0, len(words), per):
            group = words[i:i + per]
            data = sum(w << (j * word_bits) for j, w in enumerate(group))
            flits.append(RingFlit(data, dst_mask, stream, False, len(group)))
    else:
        fb = flit_bytes * 8
        for w in words:
            for t in range(span):
                flits.append(RingFlit((w >> (t * fb)) & ((1 << fb) - 1), dst_mask, stream,
                                      False, 1))
    if flits:
        f = flits[-1]
        flits[-1] = RingFlit(f.data, f.dst_mask, f.stream, True, f.words)
    return flits


def word_beats(addr: int, words: int, *, words_per_burst: int, lanes: int) -> list[int]:
    """How a DRAM word port with ``lanes`` words per beat (:class:`elmoe3d.hw.dram_port.
    DramWordPort`, ``lanes``) hands over a read of ``words`` words from word address ``addr``
    out of bursts of ``words_per_burst`` words: the word counts of its beats, in order. A beat
    holds consecutive words of one burst and never crosses a multiple of ``lanes`` words
    counted from the read's first word, so a flit of ``words_per_flit`` words (a multiple of
    ``lanes``, :func:`ring_flits`) is filled by whole beats: beat k holds ``min(lanes - c %
    lanes, words_per_burst - (addr + c) % words_per_burst, words - c)`` words, ``c`` the
    words before it. ``lanes = 1``: a word per beat. ValueError naming the argument for a
    count below 1 (``words`` below 0) or ``lanes`` not a power of two."""
    for name, v, lo in (("addr", addr, 0), ("words", words, 0),
                        ("words_per_burst", words_per_burst, 1), ("lanes", lanes, 1)):
        if not is_int(v) or v < lo:
            raise ValueError(f"{name}: expected an integer >= {lo}, got {v!r}")
    if lanes & (lanes - 1):
        raise ValueError(f"lanes: expected a power of two, got {lanes}")
    beats, c = [], 0
    while c < words:
        n = min(lanes - c % lanes, words_per_burst - (addr + c) % words_per_burst, words - c)
        beats.append(n)
        c += n
    return beats


def _deliver(flits, *, pes, word_bits, flit_bytes):
    per, span = ring_geometry(word_bits=word_bits, flit_bytes=flit_bytes)
    if not is_int(pes) or pes < 1:
        raise ValueError(f"pes: expected a positive integer, got {pes!r}")
    fb = flit_bytes * 8
    out = [[] for _ in range(pes)]            # (stream, word)
    partial = [[] for _ in range(pes)]        # flits of an incomplete spanning word
    for n, f in enumerate(flits):
        if not isinstance(f, RingFlit):
            raise ValueError(f"flits: item {n} is not a RingFlit")
        if f.dst_mask >> pes:
            raise ValueError(f"flits: item {n} dst_mask {f.dst_mask:#b} names a PE beyond {pes}")
        if not 1 <= f.words <= per:
            raise ValueError(f"flits: item {n} words={f.words}, expected 1..{per}")
        for p in (q for q in range(pes) if f.dst_mask >> q & 1):
            if span == 1:
                for j in range(f.words):
                    out[p].append((f.stream, (f.data >> (j * word_bits)) & ((1 << word_bits) - 1)))
            else:
                partial[p].append(f)
                if len(partial[p]) == span:
                    word = sum(g.data << (t * fb) for t, g in enumerate(partial[p]))
                    out[p].append((partial[p][-1].stream, word))
                    partial[p] = []
    for p in range(pes):
        if partial[p]:
            raise ValueError(f"flits: PE {p} is left with {len(partial[p])} flit(s) of an "
                             f"incomplete {span}-flit word")
    return out


def ref_ring(flits, *, pes: int, word_bits: int, flit_bytes: int) -> list[list[int]]:
    """Word sequence each PE's ``ext`` port delivers for the flits injected in order.

    The ring delivers flits in injection order (no overtaking, no loss, no duplication), so
    PE p receives the valid word slots of every flit naming p, in injection order; when a word
    spans ``span`` flits, consecutive flits naming p form one word (lowest bits first).
    Returns one list of W-bit ints per PE. ValueError naming ``flits`` or the geometry."""
    return [[w for _, w in seq] for seq in
            _deliver(flits, pes=pes, word_bits=word_bits, flit_bytes=flit_bytes)]


def ref_ring_streams(flits, *, pes: int, word_bits: int, flit_bytes: int) -> list[dict]:
    """:func:`ref_ring` per stream: for each PE a dict ``stream -> [words]`` (a word spanning
    flits is labelled with its last flit's stream)."""
    out = []
    for seq in _deliver(flits, pes=pes, word_bits=word_bits, flit_bytes=flit_bytes):
        d = {}
        for s, w in seq:
            d.setdefault(s, []).append(w)
        out.append(d)
    return out

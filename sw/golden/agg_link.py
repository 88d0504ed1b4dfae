"""Golden model of the aggregation link of a PE group (paper Section 4.1, Fig. 6 right; Section
5.2: psum-level synchronisation).

The link joins the G = ``pes_per_group`` PEs of a group (32 GB/s, 32 B per cycle per port at
1 GHz): bypass (unicast or multicast), all-to-all, and the all-reduces of psum-level
synchronisation (saturating signed 64-bit add, unsigned 32-bit max). :class:`LinkOp` is one
descriptor, :func:`ref_link` what every destination PE receives, :func:`link_op_fault` how the
RTL treats a raw (possibly bad) descriptor. RTL: :class:`elmoe3d.hw.agg_link.AggregationLink`.

Words are W-bit Python integers (W = ``ArchConfig.pe.word_bits``), little-endian lanes: 64-bit
lane j of a word is bits ``[64 j, 64 j + 64)`` (the RAW psum / Q.24 layout of
:func:`elmoe3d.sw.golden.asm.pack_q24`), 32-bit lane j is bits ``[32 j, 32 j + 32)`` (the row-max layout).

Plain Python and NumPy; never imports Amaranth or cocotb.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ...checks import is_int, python_int_hint
from .datapath import saturating_add


__all__ = [
    "LinkMode", "LinkOp", "ref_link", "link_op_fault", "link_dsts", "link_srcs",
    "reduce_add_words", "reduce_max_words", "OP_WORDS_MAX",
]

#: ``words`` and ``chunk`` are 16-bit descriptor fields.
OP_WORDS_MAX = (1 << 16) - 1


class LinkMode(enum.IntEnum):
    """Aggregation-link mode; the integer values are the RTL encoding (2 bits)."""

    #: One source; its words, in order, to every destination (multicast when several).
    BYPASS = 0
    #: Every source sends ``words`` = n chunks of ``chunk`` words; chunk j goes to
    #: ``dsts[j % nd]``; destination ``dsts[i]`` receives, for k = 0, 1, ..., chunk
    #: ``k * nd + i`` of every source in ascending source order.
    ALL_TO_ALL = 1
    #: Word k to every destination = lane-wise saturating signed 64-bit sum of word k of every
    #: source, added in ascending source order (all-reduce of psums).
    REDUCE_ADD = 2
    #: Word k to every destination = lane-wise unsigned 32-bit max of word k of every source
    #: (all-reduce of per-token |h| maxima).
    REDUCE_MAX = 3


def _bits(mask):
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def link_srcs(op: "LinkOp") -> list[int]:
    """Source PEs of ``op`` (indices within the group), ascending."""
    return _bits(op.src_mask)


def link_dsts(op: "LinkOp") -> list[int]:
    """Destination PEs of ``op`` (indices within the group), ascending."""
    return _bits(op.dst_mask)


@dataclass(frozen=True)
class LinkOp:
    """One aggregation-link descriptor (RTL layout :func:`elmoe3d.hw.agg_link.link_op_layout`).

    Attributes
    ----------
    mode : LinkMode (or its integer value)
    src_mask, dst_mask : int
        One bit per PE of the group (bit i = PE i); neither may be 0. BYPASS needs exactly one
        source bit.
    words : int
        W-bit words each source sends, 0..65535. ALL_TO_ALL: a multiple of ``chunk * nd``
        (nd = destinations).
    chunk : int
        ALL_TO_ALL chunk in words, 1..65535 (carried but unused by the other modes).

    Raises ``ValueError`` naming the field on any invalid value; :meth:`check` also checks the
    masks against a group size.
    """

    mode: LinkMode
    src_mask: int
    dst_mask: int
    words: int
    chunk: int = 1

    def __post_init__(self):
        try:
            object.__setattr__(self, "mode", LinkMode(self.mode))
        except ValueError:
            raise ValueError(f"mode: expected a LinkMode (0..3), got {self.mode!r}") from None
        for name, lo, hi in (("src_mask", 1, None), ("dst_mask", 1, None),
                             ("words", 0, OP_WORDS_MAX), ("chunk", 1, OP_WORDS_MAX)):
            v = getattr(self, name)
            if not is_int(v):
                raise ValueError(f"{name}: expected an integer, got {v!r}")
            object.__setattr__(self, name, int(v))
            if v < lo or (hi is not None and v > hi):
                raise ValueError(f"{name}: expected an integer in {lo}.."
                                 f"{hi if hi is not None else 'inf'}, got {v}")
        if self.mode == LinkMode.BYPASS and bin(self.src_mask).count("1") != 1:
            raise ValueError(f"src_mask: BYPASS takes exactly one source, got "
                             f"{self.src_mask:#b}")
        if self.mode == LinkMode.ALL_TO_ALL:
            nd = bin(self.dst_mask).count("1")
            if self.words % (self.chunk * nd):
                raise ValueError(f"words: ALL_TO_ALL needs a multiple of chunk * destinations "
                                 f"= {self.chunk} * {nd}, got {self.words}")

    def check(self, pes: int) -> "LinkOp":
        """Check the masks fit a group of ``pes`` PEs; returns self. ValueError naming the
        mask otherwise."""
        for name in ("src_mask", "dst_mask"):
            if getattr(self, name) >> pes:
                raise ValueError(f"{name}: {getattr(self, name):#b} names a PE beyond the "
                                 f"group of {pes}")
        return self

    @property
    def srcs(self) -> list[int]:
        return link_srcs(self)

    @property
    def dsts(self) -> list[int]:
        return link_dsts(self)

    def delivered_words(self) -> int:
        """Words every destination receives."""
        if self.mode == LinkMode.ALL_TO_ALL:
            return len(self.srcs) * self.words // len(self.dsts)
        return self.words


def _check_word_bits(word_bits, lane):
    if not is_int(word_bits, numpy=False) or word_bits <= 0 or word_bits % lane:
        raise ValueError(f"word_bits: expected a positive multiple of {lane}"
                         f"{python_int_hint(word_bits)}, got {word_bits!r}")


def _lanes(words, word_bits, lane_bits, dtype):
    """W-bit ints -> ``[n, W/lane_bits]`` array of ``dtype`` (little-endian lanes)."""
    nb = word_bits // 8
    raw = b"".join(int(w).to_bytes(nb, "little") for w in words)
    return np.frombuffer(raw, dtype).reshape(len(words), word_bits // lane_bits)


def _words(lanes, word_bits):
    nb = word_bits // 8
    raw = np.ascontiguousarray(lanes).tobytes()
    return [int.from_bytes(raw[i * nb:(i + 1) * nb], "little") for i in range(len(lanes))]


def reduce_add_words(sources, *, word_bits) -> tuple[list[int], bool]:
    """Lane-wise saturating signed 64-bit sum of equal-length word lists, added in the given
    (ascending source) order with the accumulator's rule (:mod:`elmoe3d.sw.golden.datapath`: saturate
    at the int64 bounds at every step). Returns ``(words, saturated)``."""
    _check_word_bits(word_bits, 64)
    acc = _lanes(sources[0], word_bits, 64, "<i8").astype(np.int64)
    sat = False
    for src in sources[1:]:
        acc, ovf = saturating_add(acc, _lanes(src, word_bits, 64, "<i8").astype(np.int64))
        sat |= bool(ovf.any())
    return _words(acc.astype("<i8"), word_bits), sat


def reduce_max_words(sources, *, word_bits) -> list[int]:
    """Lane-wise unsigned 32-bit max of equal-length word lists."""
    _check_word_bits(word_bits, 32)
    acc = _lanes(sources[0], word_bits, 32, "<u4").copy()
    for src in sources[1:]:
        acc = np.maximum(acc, _lanes(src, word_bits, 32, "<u4"))
    return _words(acc.astype("<u4"), word_bits)


def link_op_fault(mode: int, src_mask: int, dst_mask: int, words: int, chunk: int, *,
                  pes: int) -> str | None:
    """How the aggregation link treats a raw descriptor (the fields of
    :func:`elmoe3d.hw.agg_link.link_op_layout` for a group of ``pes``; the RTL flags of
    :func:`elmoe3d.hw.agg_link.link_errors_layout`).

    Returns ``None`` for a descriptor :class:`LinkOp` accepts (it runs as :func:`ref_link`
    says); ``"bad_desc"`` for one rejected when taken, moving no word (``chunk`` = 0, no
    source, no destination, BYPASS with several sources); ``"bad_length"`` for an ALL_TO_ALL
    whose ``words`` is not a multiple of ``chunk`` x destinations (the link moves words until
    a source's last word, then drains every source's remaining words; each destination gets
    a prefix of what it would get from the next multiple). ``None`` exactly when
    ``LinkOp(mode, src_mask, dst_mask, words, chunk)`` raises no ValueError. Raises
    ValueError naming a field the layout cannot hold.
    """
    if not is_int(pes) or pes < 1:
        raise ValueError(f"pes: expected a positive integer, got {pes!r}")
    for name, v, hi in (("mode", mode, len(LinkMode) - 1), ("src_mask", src_mask, (1 << pes) - 1),
                        ("dst_mask", dst_mask, (1 << pes) - 1), ("words", words, OP_WORDS_MAX),
                        ("chunk", chunk, OP_WORDS_MAX)):
        if not is_int(v) or not 0 <= v <= hi:
            raise ValueError(f"{name}: expected an integer in 0..{hi}, got {v!r}")
    if chunk == 0 or src_mask == 0 or dst_mask == 0 or \
            (mode == LinkMode.BYPASS and bin(src_mask).count("1") > 1):
        return "bad_desc"
    if mode == LinkMode.ALL_TO_ALL and words % (chunk * bin(dst_mask).count("1")):
        return "bad_length"
    return None


def ref_link(op: LinkOp, inputs, *, word_bits: int) -> list[list[int]]:
    """What every PE of the group receives on its ``link_i`` for descriptor ``op``.

    Parameters
    ----------
    op : LinkOp
    inputs : list (one per PE of the group) of lists of W-bit ints
        Each source's ``link_o`` words from the descriptor's start; a source needs at least
        ``op.words`` of them (the rest are left for later descriptors and ignored here);
        non-sources' lists are ignored.
    word_bits : int
        W (a multiple of 64).

    Returns one list of W-bit ints per PE (empty for PEs not in ``dst_mask``). Raises
    ``ValueError`` naming ``inputs``, ``word_bits`` or a mask field.
    """
    if not isinstance(op, LinkOp):
        raise ValueError(f"op: expected a LinkOp, got {type(op).__name__}")
    _check_word_bits(word_bits, 64)
    pes = len(inputs)
    op.check(pes)
    srcs, dsts = op.srcs, op.dsts
    data = {}
    for s in srcs:
        words = [int(w) for w in inputs[s][:op.words]]
        if len(words) < op.words:
            raise ValueError(f"inputs: PE {s} offers {len(words)} words, the descriptor takes "
                             f"{op.words}")
        for k, w in enumerate(words):
            if not 0 <= w < (1 << word_bits):
                raise ValueError(f"inputs: PE {s} word {k} does not fit {word_bits} bits")
        data[s] = words
    out = [[] for _ in range(pes)]
    if op.mode == LinkMode.BYPASS:
        result = {d: list(data[srcs[0]]) for d in dsts}
    elif op.mode == LinkMode.ALL_TO_ALL:
        nd, c = len(dsts), op.chunk
        n = op.words // c
        result = {d: [] for d in dsts}
        for k in range(n // nd):
            for i, d in enumerate(dsts):
                for s in srcs:
                    j = k * nd + i
                    result[d].extend(data[s][j * c:(j + 1) * c])
    elif op.mode == LinkMode.REDUCE_ADD:
        words = reduce_add_words([data[s] for s in srcs], word_bits=word_bits)[0] \
            if op.words else []
        result = {d: list(words) for d in dsts}
    else:
        words = reduce_max_words([data[s] for s in srcs], word_bits=word_bits) \
            if op.words else []
        result = {d: list(words) for d in dsts}
    for d in dsts:
        out[d] = result[d]
    return out

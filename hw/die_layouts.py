"""The logic die's host-side payloads and flag layouts (:class:`elmoe3d.hw.die.LogicDie`;
paper Section 4.1): the host command and DMA beats, the output beat, the probe and error
flags, and the queue / DMA room bit numbering. Defined here once and shared with the benches
(``sim/bench_die.py``, through ``layout.const(...)``) and the die; :mod:`elmoe3d.hw.die`
re-exports every name. ``docs/memory.md`` ("Logic die") describes the rules a host keeps.
"""

from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from ..checks import is_int, python_int_hint
from ..config import ArchConfig
from .agg_link import link_errors_layout, link_op_layout
from .ext_stream import ext_read_layout
from .isa import command_layout, o_beat_layout
from .layouts import address_bits
from .load_router import ADDR_BITS


__all__ = ["HostQueue", "DmaKind", "host_cmd_layout", "host_dma_layout", "die_o_layout",
           "die_probe_layout", "die_errors_layout", "queue_bit", "dma_bit"]


class HostQueue(enum.Enum, shape=2):
    """The queue a host command beat goes to (:func:`host_cmd_layout` ``queue``)."""

    PE = 0      #: PE ``index``'s command stream (``body.cmd``)
    LINK = 1    #: group ``index``'s aggregation-link descriptors (``body.link``)
    EXT = 2     #: the external-memory read descriptors (``body.ext``)


class DmaKind(enum.Enum, shape=1):
    """What a host DMA beat carries (:func:`host_dma_layout` ``kind``)."""

    LD = 0         #: a word of PE ``pe``'s HOST loads
    HB_WRITE = 1   #: a word written into PE ``pe``'s HB bank at word ``addr``


def _index_bits(arch: ArchConfig) -> int:
    return address_bits(max(arch.pes, arch.groups))


def _pe_bits(arch: ArchConfig) -> int:
    return address_bits(arch.pes)


def host_cmd_layout(arch: ArchConfig) -> data.StructLayout:
    """One beat of the host command stream.

    Fields
    ------
    queue : HostQueue
    index : unsigned
        PE index (``PE``) or group index (``LINK``, ``EXT``: the group's EXT queue).
    body : union
        ``cmd``: :func:`elmoe3d.hw.isa.command_layout` (a PE command, 128 bits); ``link``:
        :func:`elmoe3d.hw.agg_link.link_op_layout` (``pes_per_group``); ``ext``:
        :func:`elmoe3d.hw.ext_stream.ext_read_layout` (``pes``).
    """
    return data.StructLayout({
        "queue": HostQueue,
        "index": unsigned(_index_bits(arch)),
        "body": data.UnionLayout({"cmd": command_layout(),
                                  "link": link_op_layout(arch.pes_per_group),
                                  "ext": ext_read_layout(arch.pes)}),
    })


def host_dma_layout(arch: ArchConfig) -> data.StructLayout:
    """One beat of the host DMA write stream: ``kind`` (:class:`DmaKind`), ``pe``, ``addr``
    (:data:`~elmoe3d.hw.load_router.ADDR_BITS`, HB word address of an ``HB_WRITE``; ignored
    for ``LD``), ``data`` (one W-bit PE word)."""
    return data.StructLayout({"kind": DmaKind, "pe": unsigned(_pe_bits(arch)),
                              "addr": unsigned(ADDR_BITS),
                              "data": unsigned(arch.pe.word_bits)})


def die_o_layout(arch: ArchConfig) -> data.StructLayout:
    """One beat of the die's output stream: ``pe`` (the PE that emitted it) and ``beat``
    (:func:`elmoe3d.hw.isa.o_beat_layout`: kind DATA or STATUS and W data bits)."""
    return data.StructLayout({"pe": unsigned(_pe_bits(arch)), "beat": o_beat_layout(arch)})


def die_probe_layout(arch: ArchConfig) -> data.StructLayout:
    """The die's read-only ``probe`` output: per-cycle handshake and stall bits of its internal
    streams, for benches (``sim/bench_die.py`` measures the verify-phase overlap from them).
    Every bit is combinational from the cycle's ``valid`` / ``ready`` (a handshake bit is 1 in
    the cycle a word moves); bit ``p`` of a P-bit field is die PE ``p``, bit ``g`` of a
    G-bit field is group ``g``.

    Fields
    ------
    ext_word : unsigned(pes)
        The streamline ring delivered a W-bit EXT word into PE ``p``'s load-router FIFO.
    ext_full : unsigned(pes)
        The ring offered PE ``p`` a word its load router's EXT FIFO had no room for.
    ld_word : unsigned(pes)
        PE ``p`` took a load word (any source).
    ld_wait : unsigned(pes)
        PE ``p`` was ready for a load word and its router had none.
    ld_held : unsigned(pes)
        The router offered PE ``p`` a load word and the PE was not ready.
    hb_word : unsigned(pes)
        PE ``p``'s HB word port delivered a word to its router.
    link_o_word, link_i_word : unsigned(pes)
        A word went from PE ``p``'s ``link_o`` into its group's link / from the link into
        its ``link_i``.
    link_busy, link_op, link_done : unsigned(groups)
        Group ``g``'s aggregation link is running a descriptor / took one / finished one
        (:class:`~elmoe3d.hw.agg_link.AggregationLink` ``busy``, ``op`` handshake, ``done``).
    inject, inject_full : unsigned(1)
        A ring flit entered the ring from the EXT streamer / the streamer offered one the ring
        had no room for.
    ext_rd_word : unsigned(1)
        A beat came from the LPDDR5 controller's word port into the EXT streamer: a W-bit
        word, or up to ``ext_lanes`` of them (:attr:`~elmoe3d.hw.die.LogicDie.ext_lanes`).
    """
    P, NG = arch.pes, arch.groups
    return data.StructLayout({
        "ext_word": unsigned(P), "ext_full": unsigned(P), "ld_word": unsigned(P),
        "ld_wait": unsigned(P), "ld_held": unsigned(P), "hb_word": unsigned(P),
        "link_o_word": unsigned(P), "link_i_word": unsigned(P),
        "link_busy": unsigned(NG), "link_op": unsigned(NG), "link_done": unsigned(NG),
        "inject": unsigned(1), "inject_full": unsigned(1), "ext_rd_word": unsigned(1),
    })


def die_errors_layout(arch: ArchConfig, ext_channels: int | None = None) -> data.StructLayout:
    """The die's sticky error flags (``errors``; ``errors_clear`` has the same layout, a
    write-1-to-clear strobe per bit). Bit ``g`` of a G-bit field is group ``g``, bit ``p`` of
    a P-bit field die PE ``p``, bit ``c`` of ``ext_refresh`` LPDDR5 channel ``c``
    (``ext_channels``, default ``arch.ext_channels``). Bits 0 to 2 are the die's own.

    Fields
    ------
    cmd_index : 1
        A ``host_cmd`` beat named a PE or group that does not exist (taken and dropped).
    dma_pe : 1
        A ``host_dma`` beat named a PE that does not exist (taken and dropped).
    ext_bad_mask : 1
        An EXT ``host_cmd`` beat for group ``g`` whose ``dst_mask`` is empty or names a PE
        outside group ``g`` (EXT multicast is within a group): taken and dropped, nothing read.
    link_bad_desc : unsigned(groups)
        Group ``g``'s aggregation link rejected a descriptor (``chunk`` = 0, an empty mask,
        BYPASS with several sources: dropped, no word moved;
        :func:`elmoe3d.hw.agg_link.link_errors_layout` ``bad_desc``).
    link_bad_length : unsigned(groups)
        Group ``g``'s link drained an ALL_TO_ALL whose ``words`` was not a multiple of
        ``chunk`` x destinations (``bad_length``).
    hb_refresh : unsigned(pes)
        PE ``p``'s HB controller reached the refresh postponing limit and forced a refresh
        (:func:`elmoe3d.hw.dram.dram_errors_layout` ``refresh_overflow``).
    ext_refresh : unsigned(ext_channels)
        The same for LPDDR5 channel ``c``. Through the host interface it cannot be reached:
        the EXT schedulers admit only words their PEs have room for, so the ring and the
        LPDDR5 read buffers never back up (a poke or a fault).
    ext_bad_credit : unsigned(groups)
        Group ``g``'s EXT scheduler got a credit back for a PE with no outstanding credit
        (:func:`elmoe3d.hw.ext_sched.ext_sched_errors_layout` ``bad_credit``; refused).
    """
    if not isinstance(arch, ArchConfig):
        raise TypeError(f"arch: expected an ArchConfig, got {type(arch).__name__}")
    channels = arch.ext_channels if ext_channels is None else ext_channels
    if not is_int(channels, numpy=False) or channels < 1:
        raise ValueError(f"ext_channels: expected a positive integer (an ext_refresh bit per "
                         f"LPDDR5 channel){python_int_hint(channels)}, got {channels!r}")
    width = {"link": arch.groups, "hb": arch.pes, "ext": channels, "ext_sched": arch.groups}
    return data.StructLayout({
        **{name: f.shape for name, f in _own_errors_layout()},
        **{outer: unsigned(width[kind]) for kind, fields in _BLOCK_ERRORS
           for outer in fields},
    })


def _own_errors_layout() -> data.StructLayout:
    """The die's own flags, bits 0 to 2 of :func:`die_errors_layout`."""
    return data.StructLayout({"cmd_index": unsigned(1), "dma_pe": unsigned(1),
                              "ext_bad_mask": unsigned(1)})


#: The blocks' flags in :func:`die_errors_layout`, in bit order: per kind of block (links per
#: group, HB controllers per PE, the LPDDR5 controller, EXT schedulers per group) die field ->
#: the block's field, from
#: the blocks' layouts (``link_<name>`` for each link flag).
_BLOCK_ERRORS = (
    ("link", {f"link_{name}": name for name, _ in link_errors_layout()}),
    ("hb", {"hb_refresh": "refresh_overflow"}),
    ("ext", {"ext_refresh": "refresh_overflow"}),
    ("ext_sched", {"ext_bad_credit": "bad_credit"}),
)


def queue_bit(arch: ArchConfig, queue, index: int = 0) -> int:
    """Bit of ``cmd_room`` for a queue: PE ``i`` -> ``i``, LINK ``g`` -> ``pes + g``, EXT
    ``g`` -> ``pes + groups + g``."""
    queue = HostQueue(queue)
    if queue is HostQueue.PE:
        return index
    if queue is HostQueue.LINK:
        return arch.pes + index
    return arch.pes + arch.groups + index


def dma_bit(arch: ArchConfig, kind, pe: int) -> int:
    """Bit of ``dma_room`` for a DMA kind and PE: LD -> ``pe``, HB_WRITE -> ``pes + pe``."""
    return pe if DmaKind(kind) is DmaKind.LD else arch.pes + pe

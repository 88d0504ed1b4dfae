"""The ELMoE-3D logic die: groups of PEs with their HB banks, aggregation links, the
streamline ring fed by the external-memory controller, and the host interface (paper Section
4.1, Fig. 6; Sections 5.1 and 5.2; Table 1).

Host-side payloads are defined once in :mod:`elmoe3d.hw.die_layouts` (:func:`host_cmd_layout`,
:func:`host_dma_layout`, :func:`die_o_layout`, the probe and error flags, the room bits; all
importable from here) and :func:`elmoe3d.hw.ext_stream.ext_read_layout`, and shared with the
benches (``sim/bench_die.py``) through ``layout.const(...)``; ``docs/memory.md`` ("Logic die")
describes the die and the rules a host keeps.
"""

from __future__ import annotations

import math

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..checks import is_int
from ..config import EXT_CHUNK_WORDS, ArchConfig
from .agg_link import AggregationLink, link_op_layout
from .checked import constructor_params, inspection, check_param
from .die_layouts import (_BLOCK_ERRORS, DmaKind, HostQueue, _own_errors_layout, die_errors_layout,
                          die_o_layout, die_probe_layout, dma_bit, host_cmd_layout,
                          host_dma_layout, queue_bit)
from .dram import dram_bus_signature
from .dram_port import DramWordPort
from .ext_ctrl import ExtController
from .ext_sched import ExtGroupMerge, ExtScheduler
from .ext_stream import ExtStreamer, ext_read_layout
from .hb_ctrl import HBController
from .isa import command_layout, o_beat_layout
from .layouts import STICKY_LATENCY, address_bits, forward_flags, sticky_flags
from .load_router import WORDS_BITS, LoadRouter
from .pe import PE
from .ring import StreamlineRing


__all__ = ["HostQueue", "DmaKind", "host_cmd_layout", "host_dma_layout", "die_o_layout",
           "die_probe_layout", "die_errors_layout", "LogicDie", "queue_bit", "dma_bit"]


#: Cycles from a ``host_cmd`` beat taken to it offered by its (empty) queue
#: (:attr:`LogicDie.queue_latency`).
_QUEUE_LATENCY = 1


class LogicDie(wiring.Component):
    """The logic die (paper Fig. 6): ``groups`` x ``pes_per_group`` PEs.

    Per PE ``p``: a :class:`~elmoe3d.hw.pe.PE`, its :class:`~elmoe3d.hw.load_router.LoadRouter`
    (each LOAD's words from HOST, HB or EXT, HB reads prefetched), its
    :class:`~elmoe3d.hw.hb_ctrl.HBController` behind a
    :class:`~elmoe3d.hw.dram_port.DramWordPort` (PE words <-> 128 B bursts), the bank's command
    bus on the top-level port ``hb[p]``. Per group ``g``: an
    :class:`~elmoe3d.hw.agg_link.AggregationLink` joining the PEs' ``link_o`` / ``link_i``
    (group-local PE ``j`` = die PE ``g * pes_per_group + j``) with a descriptor queue. One
    :class:`~elmoe3d.hw.ring.StreamlineRing` (a station per group) into the PEs' load routers'
    ``ext`` inputs, fed by an :class:`~elmoe3d.hw.ext_stream.ExtStreamer` reading the
    :class:`~elmoe3d.hw.ext_ctrl.ExtController` (LPDDR5 channels on the top-level ports
    ``ext[c]``) through another :class:`~elmoe3d.hw.dram_port.DramWordPort`; the streamer
    takes, round robin, the chunks of one :class:`~elmoe3d.hw.ext_sched.ExtScheduler` per
    group, which admit a chunk only when its PEs' EXT FIFOs have room for it (credits), so
    no flit on the ring waits for a PE (``docs/memory.md``, "EXT schedulers").

    Host interface
    --------------
    host_cmd : In stream, :func:`host_cmd_layout`
        PE commands (to PE ``index``'s command queue, :attr:`cmd_queue_depth` commands),
        link descriptors (to group ``index``'s queue, :attr:`link_queue_depth`) and EXT read
        descriptors (to group ``index``'s EXT queue, :attr:`ext_queue_depth`; EXT multicast is
        within a group: a ``dst_mask`` that is empty or names a PE of another group is taken
        and dropped, nothing read, and sets ``errors.ext_bad_mask``). A beat is taken in a
        cycle where its queue's ``cmd_room`` bit is 1 (``host_cmd.ready`` is that bit), so a
        host that offers only
        beats of queues with room never blocks one queue behind another. A room bit falls only
        when a beat enters its queue.
    cmd_room : Out(pes + 2 groups)
        One bit per queue (:func:`queue_bit`).
    host_dma : In stream, :func:`host_dma_layout`
        LD words to PE ``pe``'s HOST loads; HB_WRITE words into PE ``pe``'s HB bank (whole
        128 B bursts: the words of a burst in address order, see
        :class:`~elmoe3d.hw.dram_port.DramWordPort`; ordered with the PE's HB reads by request
        order at the controller). Taken when its ``dma_room`` bit is 1, as for ``host_cmd``.
    dma_room : Out(2 pes)
        :func:`dma_bit`.
    o : Out stream, :func:`die_o_layout`
        Every PE's ``o`` beats, tagged with the PE index, merged round robin (a register:
        :attr:`o_latency` = 1 cycle); a PE's beats keep their order.
    errors : Out :func:`die_errors_layout`
        Sticky error flags the host reads: bit 0 (``cmd_index``) a ``host_cmd`` beat named a
        PE or group that does not exist; bit 1 (``dma_pe``) a ``host_dma`` beat did; bit 2
        (``ext_bad_mask``) an EXT beat's ``dst_mask`` was empty or left its group (the beat is
        taken and dropped); then per group the aggregation links' ``bad_desc`` and
        ``bad_length``, per PE its HB controller's and per channel the LPDDR5 controller's
        ``refresh_overflow``, per group its EXT scheduler's ``bad_credit`` (the blocks' own
        flags, wired through). Each bit stays set until
        the host clears it (or a reset); a ``*_refresh`` bit is set again in every cycle its
        controller's debt is still at the limit (a level), so a clear meanwhile is lost.
    errors_clear : In :func:`die_errors_layout`
        Write-1-to-clear strobes, one per ``errors`` bit (held 0 when unused): a 1 clears the
        bit in the next cycle, unless the same cycle sets it again (setting wins).
    probe : Out :func:`die_probe_layout`
        Read-only observation bits (handshakes and stalls of the internal streams, link
        descriptor state) for benches; they drive nothing inside the die.
    hb[p] : Out :func:`elmoe3d.hw.dram.dram_bus_signature` (``config.hb``)
    ext[c] : Out :func:`elmoe3d.hw.dram.dram_bus_signature` (``config.ext``), per
        LPDDR5 channel
        DRAM command and data buses, for the behavioural models of ``sw/golden/dram.py``.

    Parameters
    ----------
    config : ArchConfig
    cmd_queue_depth, link_queue_depth, ext_queue_depth : int
        Host queue depths (commands, descriptors), >= 1.
    router : dict
        Keyword arguments of every :class:`~elmoe3d.hw.load_router.LoadRouter`
        (``queue_depth``, ``hb_fifo_words``, ``hb_burst_words``, ``ext_fifo_words``,
        ``host_fifo_words``).
    link_buffer_words : int
        The aggregation link's per-destination FIFO (the compiler's ``buffer_words``).
    ring_buffer_flits, ring_stream_bits : int
        The streamline ring's per-PE flit FIFO depth and stream-id bits.
    hb_queue_depth, hb_read_buffer : int
        :class:`~elmoe3d.hw.hb_ctrl.HBController` burst queue and read buffer.
    ext_channels, ext_queue_depth_bursts, ext_read_buffer : int or None
        :class:`~elmoe3d.hw.ext_ctrl.ExtController` channels (default ``config.ext_channels``),
        per-channel burst queue and read buffer.
    ext_window, ext_chunk_words : int
        Each group's :class:`~elmoe3d.hw.ext_sched.ExtScheduler`: its descriptor window and
        largest chunk (<= the router's ``ext_fifo_words``, its credits per PE).
    ext_inflight : int
        EXT chunks read and not yet injected into the ring (the streamer's and the LPDDR5
        word port's ``inflight``).
    ext_lanes : int or None
        Words a cycle the LPDDR5 word port hands the streamer (their ``lanes``): a power of
        two dividing both a flit's and a stripe's words. Default: as many as both hold
        (:meth:`ext_lanes_of`), a flit a cycle when a stripe holds one -- the small die at 8
        channels: 2 words (128 B) a cycle, above the EXT's 102.4 B; at 2 channels (a stripe
        of one word) and on the paper dies (a word spans flits) 1.
    ext_fifo_cycles : int
        Unless ``router`` gives ``ext_fifo_words``, the routers' EXT FIFOs (the scheduler's
        credits) hold this many cycles of one PE's EXT stream, ``ceil(ext_fifo_cycles x
        min(1, EXT bytes per cycle / W bytes))`` words (at least ``ext_chunk_words``): the
        round trip from a chunk admitted to its words popped (LPDDR5 first read, about 47
        cycles, plus the port, streamer, ring and router), so that one PE alone can take the
        EXT stream at its rate. Small die: 64 words at 8 channels, 26 at 2; paper dies
        (512 B words): 13 at 8 channels (a full chunk needs ``ext_chunk_words`` credits, so
        the last 2 of 26 = 6 x 4 + 2, and 1 of 13, serve only a transfer's shorter last
        chunk). A ``router`` ``ext_fifo_words`` is kept as given; one below
        ``ext_chunk_words`` raises ``ValueError``.
    mul_stages : int
        The PEs' VPU multiplier stages.

    Raises
    ------
    TypeError
        ``config`` is not an ArchConfig.
    ValueError
        A parameter out of range (named; the blocks' own checks name theirs).
    """

    def __new__(cls, *args, **kwargs):
        # The sub-blocks are built before the die exists: when one refuses its parameters,
        # nothing half-built is left, and the ones built before it are dropped unused.
        params = constructor_params(cls, *args, **kwargs)
        blocks = {}
        try:
            cls._build(blocks, **params)
        except (TypeError, ValueError):
            with inspection():
                blocks.clear()
            raise
        self = super().__new__(cls, src_loc_at=1)
        self._blocks = blocks
        return self

    @staticmethod
    def _build(blocks, *, config, cmd_queue_depth, link_queue_depth, ext_queue_depth, router,
               link_buffer_words, ring_buffer_flits, ring_stream_bits, hb_queue_depth,
               hb_read_buffer, ext_channels, ext_queue_depth_bursts, ext_read_buffer,
               ext_window, ext_chunk_words, ext_inflight, ext_lanes, ext_fifo_cycles,
               mul_stages):
        """The die's parameter checks (:meth:`_check`), then its sub-blocks (their
        constructors check their own parameters) into ``blocks``."""
        LogicDie._check(config=config, cmd_queue_depth=cmd_queue_depth,
                        link_queue_depth=link_queue_depth, ext_queue_depth=ext_queue_depth,
                        router=router, ext_inflight=ext_inflight,
                        ext_fifo_cycles=ext_fifo_cycles, ext_window=ext_window,
                        ext_chunk_words=ext_chunk_words, ext_lanes=ext_lanes)
        arch = config
        router = LogicDie._router(arch, router, ext_channels, ext_fifo_cycles, ext_chunk_words)
        blocks["pes"] = [LogicDie._pe(arch, mul_stages) for _ in range(arch.pes)]
        blocks["routers"] = [LogicDie._load_router(arch, router) for _ in range(arch.pes)]
        blocks["hb"] = [LogicDie._hb(arch, hb_queue_depth, hb_read_buffer)
                        for _ in range(arch.pes)]
        blocks["hb_ports"] = [LogicDie._hb_port(arch, router) for _ in blocks["hb"]]
        blocks["links"] = [LogicDie._link(arch, link_buffer_words) for _ in range(arch.groups)]
        blocks["ring"] = LogicDie._ring(arch, ring_stream_bits, ring_buffer_flits)
        blocks["ext"] = LogicDie._ext(arch, ext_channels, ext_queue_depth_bursts,
                                      ext_read_buffer)
        lanes = LogicDie._ext_lanes(arch, ext_channels, ext_lanes)
        blocks["ext_port"] = LogicDie._ext_port(arch, ext_channels, ext_inflight, lanes)
        blocks["streamer"] = LogicDie._streamer(arch, ring_stream_bits, ext_inflight, lanes)
        blocks["ext_sched"] = [LogicDie._ext_sched(arch, router, ext_window, ext_chunk_words)
                               for _ in range(arch.groups)]

    @staticmethod
    def _check(*, config, cmd_queue_depth, link_queue_depth, ext_queue_depth, router,
               ext_inflight, ext_fifo_cycles, ext_window, ext_chunk_words, ext_lanes):
        """The die's own parameter checks, before any block is built (the die and
        :meth:`part` alike): ``TypeError`` for a ``config`` that is no ArchConfig,
        ``ValueError`` naming the parameter otherwise."""
        if not isinstance(config, ArchConfig):
            raise TypeError(f"config: expected an ArchConfig, got {type(config).__name__}")
        check_param("cmd_queue_depth", cmd_queue_depth)
        check_param("link_queue_depth", link_queue_depth)
        check_param("ext_queue_depth", ext_queue_depth)
        check_param("ext_inflight", ext_inflight)
        if router is not None and not isinstance(router, dict):
            raise ValueError(f"router: expected a dict of LoadRouter parameters, got "
                             f"{type(router).__name__}")
        check_param("ext_fifo_cycles", ext_fifo_cycles)
        check_param("ext_window", ext_window)
        check_param("ext_chunk_words", ext_chunk_words)
        if ext_chunk_words >= 1 << WORDS_BITS:
            raise ValueError(f"ext_chunk_words: {ext_chunk_words} does not fit the "
                             f"{WORDS_BITS}-bit word count (at most {(1 << WORDS_BITS) - 1})")
        fifo = (router or {}).get("ext_fifo_words")
        if is_int(fifo, numpy=False) and 1 <= fifo < ext_chunk_words:
            raise ValueError(f"router: ext_fifo_words {fifo} is less than ext_chunk_words "
                             f"({ext_chunk_words}); a full chunk would never be admitted")
        if ext_lanes is not None:
            check_param("ext_lanes", ext_lanes)

    # The parts of the die that depend only on its parameters, built alike by the die and,
    # without a die, by :meth:`part` (the synthesis roll-up).

    @staticmethod
    def _router_params(arch, router) -> dict:
        """The load routers' constructor keywords with their defaults; a keyword LoadRouter
        does not take is ``ValueError`` naming ``router``, as the routers' own build says."""
        try:
            return constructor_params(LoadRouter, config=arch, **(router or {}))
        except TypeError as e:
            raise ValueError(f"router: {e}") from None

    @staticmethod
    def _pe(arch, mul_stages):
        return PE(config=arch, mul_stages=mul_stages)

    @staticmethod
    def _load_router(arch, router):
        try:
            return LoadRouter(config=arch, **router)
        except (TypeError, ValueError) as e:
            # a LoadRouter keyword's own message, named as the die's parameter
            raise ValueError(f"router: {e}") from None

    @staticmethod
    def _hb(arch, hb_queue_depth, hb_read_buffer):
        return HBController(config=arch, queue_depth=hb_queue_depth, read_buffer=hb_read_buffer)

    @staticmethod
    def _link(arch, link_buffer_words):
        return AggregationLink.from_arch(arch, buffer_words=link_buffer_words)

    @staticmethod
    def _ring(arch, ring_stream_bits, ring_buffer_flits):
        return StreamlineRing.from_arch(arch, stream_bits=ring_stream_bits,
                                        buffer_flits=ring_buffer_flits)

    @classmethod
    def ring_params(cls, **params) -> dict:
        """The constructor keywords of the ring a die built with ``params`` has
        (:meth:`~elmoe3d.hw.ring.StreamlineRing.arch_params` with the die's
        ``ring_stream_bits`` and ``ring_buffer_flits``): what the power model builds one
        station from. ``TypeError`` for a keyword the die does not take."""
        p = constructor_params(cls, **params)
        return StreamlineRing.arch_params(p["config"], stream_bits=p["ring_stream_bits"],
                                          buffer_flits=p["ring_buffer_flits"])

    @staticmethod
    def _ext(arch, ext_channels, ext_queue_depth_bursts, ext_read_buffer):
        return ExtController(config=arch, channels=LogicDie._ext_channels(arch, ext_channels),
                             queue_depth=ext_queue_depth_bursts, read_buffer=ext_read_buffer)

    @staticmethod
    def _hb_port(arch, router):
        hb_fifo_words = LogicDie._router_params(arch, router)[
            "hb_fifo_words"]
        return DramWordPort(word_bits=arch.pe.word_bits, burst_bits=arch.hb.burst_bytes * 8,
                            addr_bits=address_bits(arch.hb.bursts), length_bits=16,
                            inflight=max(2, hb_fifo_words))

    @staticmethod
    def _ext_port(arch, ext_channels, ext_queue_depth, lanes):
        return DramWordPort(word_bits=arch.pe.word_bits,
                            burst_bits=LogicDie._ext_stripe_bytes(arch, ext_channels) * 8,
                            addr_bits=address_bits(arch.ext.bursts), length_bits=16,
                            inflight=ext_queue_depth, lanes=lanes)

    @staticmethod
    def _streamer(arch, ring_stream_bits, ext_queue_depth, lanes):
        return ExtStreamer(pes=arch.pes, word_bits=arch.pe.word_bits,
                           flit_bytes=int(arch.streamline_bytes_per_cycle),
                           stream_bits=ring_stream_bits, inflight=ext_queue_depth, lanes=lanes)

    @staticmethod
    def _ext_lanes(arch, ext_channels, ext_lanes):
        if ext_lanes is None:
            return LogicDie.ext_lanes_of(arch, ext_channels)
        check_param("ext_lanes", ext_lanes)
        return ext_lanes

    @staticmethod
    def ext_lanes_of(arch, ext_channels=None) -> int:
        """The default ``ext_lanes`` of a die of ``arch`` with ``ext_channels`` (default
        ``arch.ext_channels``): ``min(words per flit, words per stripe)``, at least 1."""
        W = arch.pe.word_bits
        per = max(1, int(arch.streamline_bytes_per_cycle) * 8 // W)
        kb = max(1, LogicDie._ext_stripe_bytes(arch, ext_channels) * 8 // W)
        return min(per, kb)

    @staticmethod
    def _router(arch, router, ext_channels, ext_fifo_cycles, ext_chunk_words) -> dict:
        """The routers' keywords: ``router`` with ``ext_fifo_words`` (the EXT scheduler's
        credits per PE), unless given, sized to cover ``ext_fifo_cycles`` cycles of the EXT
        stream for one PE: ``ceil(ext_fifo_cycles x min(1, EXT bytes per cycle / W bytes))``
        words (a PE takes at most a word per cycle), at least ``ext_chunk_words`` (not rounded
        to whole chunks: 28 instead of 26 at 2 channels made the die bench's verify steps 92
        cycles slower, past the perf model's 5%). A given ``ext_fifo_words`` is kept as it
        is."""
        router = dict(router or {})
        if "ext_fifo_words" not in router:
            bpc = arch.ext.peak_gbps * LogicDie._ext_channels(arch, ext_channels) \
                / arch.clock_ghz
            rate = min(1.0, bpc / arch.pe.word_bytes)
            router["ext_fifo_words"] = max(ext_chunk_words, math.ceil(ext_fifo_cycles * rate))
        return router

    @staticmethod
    def _router_of(p) -> dict:
        return LogicDie._router(p["config"], p["router"], p["ext_channels"],
                                p["ext_fifo_cycles"], p["ext_chunk_words"])

    @staticmethod
    def _ext_sched(arch, router, ext_window, ext_chunk_words):
        ext_fifo_words = LogicDie._router_params(arch, router)[
            "ext_fifo_words"]
        return ExtScheduler(pes=arch.pes_per_group, window=ext_window, credits=ext_fifo_words,
                            chunk_words=ext_chunk_words)

    @staticmethod
    def _ext_channels(arch, ext_channels):
        return arch.ext_channels if ext_channels is None else ext_channels

    @staticmethod
    def _ext_stripe_bytes(arch, ext_channels):
        return LogicDie._ext_channels(arch, ext_channels) * arch.ext.burst_bytes

    #: The names :meth:`part` builds.
    PARTS = ("pe", "router", "hb", "hb_port", "link", "ring", "ext", "ext_port", "streamer",
             "ext_sched")

    @classmethod
    def part(cls, name: str, **params):
        """The die's part ``name`` (one of :data:`PARTS`: ``"pe"``, ``"router"``, ``"hb"``,
        ``"hb_port"``, ``"link"`` -- PE 0's or group 0's, all are alike -- ``"ring"``,
        ``"ext"``, ``"ext_port"``, ``"streamer"`` or ``"ext_sched"``) as a die built with
        ``params`` (the constructor's keywords) has it, built alone by the same code: neither
        the die nor its other blocks are built (the synthesis roll-up, which so synthesises
        each block with the die's parameters, not the block's defaults).

        Raises ``ValueError`` for another ``name``; ``TypeError`` for a keyword the
        constructor does not take."""
        if name not in cls.PARTS:
            raise ValueError(f"name: expected one of {', '.join(map(repr, cls.PARTS))}, got "
                             f"{name!r}")
        p = constructor_params(cls, **params)
        cls._check(**{k: p[k] for k in (
            "config", "cmd_queue_depth", "link_queue_depth", "ext_queue_depth", "router",
            "ext_inflight", "ext_fifo_cycles", "ext_window", "ext_chunk_words", "ext_lanes")})
        arch = p["config"]
        if name == "pe":
            return cls._pe(arch, p["mul_stages"])
        if name == "router":
            return cls._load_router(arch, cls._router_of(p))
        if name == "hb":
            return cls._hb(arch, p["hb_queue_depth"], p["hb_read_buffer"])
        if name == "hb_port":
            return cls._hb_port(arch, cls._router_of(p))
        if name == "link":
            return cls._link(arch, p["link_buffer_words"])
        if name == "ring":
            return cls._ring(arch, p["ring_stream_bits"], p["ring_buffer_flits"])
        if name == "ext":
            return cls._ext(arch, p["ext_channels"], p["ext_queue_depth_bursts"],
                            p["ext_read_buffer"])
        lanes = cls._ext_lanes(arch, p["ext_channels"], p["ext_lanes"])
        if name == "ext_port":
            return cls._ext_port(arch, p["ext_channels"], p["ext_inflight"], lanes)
        if name == "streamer":
            return cls._streamer(arch, p["ring_stream_bits"], p["ext_inflight"], lanes)
        return cls._ext_sched(arch, cls._router_of(p), p["ext_window"], p["ext_chunk_words"])

    @classmethod
    def host_figures(cls, **params) -> dict:
        """The figures a host or bench plans with, of a die built with ``params`` (the
        constructor's keywords, unchecked), computed without building it: ``ext_channels``,
        ``ext_stripe_bytes`` (bytes), the EXT scheduler's ``ext_fifo_words`` (credits per PE),
        ``ext_chunk_words`` and ``ext_window`` (the host's schedule check,
        :func:`elmoe3d.sw.host.parallel.check_link_schedule`), ``link_buffer_words`` (words) and
        ``link_error_latency`` (cycles), equal to the built die's properties of those names.
        ``TypeError`` for a keyword the constructor does not take."""
        p = constructor_params(cls, **params)
        arch = p["config"]
        ext_fifo_words = cls._router_of(p)["ext_fifo_words"]
        return {"ext_channels": cls._ext_channels(arch, p["ext_channels"]),
                "ext_stripe_bytes": cls._ext_stripe_bytes(arch, p["ext_channels"]),
                "ext_fifo_words": ext_fifo_words, "ext_chunk_words": p["ext_chunk_words"],
                "ext_window": p["ext_window"],
                "link_buffer_words": p["link_buffer_words"],
                "link_error_latency": _QUEUE_LATENCY + STICKY_LATENCY}

    def __init__(self, *, config, cmd_queue_depth: int = 16, link_queue_depth: int = 8,
                 ext_queue_depth: int = 8, router: dict | None = None,
                 link_buffer_words: int = 64, ring_buffer_flits: int = 8,
                 ring_stream_bits: int = 4, hb_queue_depth: int = 32, hb_read_buffer: int = 16,
                 ext_channels: int | None = None, ext_queue_depth_bursts: int = 32,
                 ext_read_buffer: int = 32, ext_window: int = 8,
                 ext_chunk_words: int = EXT_CHUNK_WORDS,
                 ext_inflight: int = 32, ext_lanes: int | None = None,
                 ext_fifo_cycles: int = 64, mul_stages: int = 1):
        arch = self._arch = config
        self._cmd_depth, self._link_depth, self._ext_depth = \
            cmd_queue_depth, link_queue_depth, ext_queue_depth
        b = self._blocks                                 # built by __new__
        del self._blocks
        self._pes, self._routers, self._hb, self._hb_ports = \
            b["pes"], b["routers"], b["hb"], b["hb_ports"]
        self._links, self._ring, self._ext, self._ext_port, self._streamer = \
            b["links"], b["ring"], b["ext"], b["ext_port"], b["streamer"]
        self._ext_sched = b["ext_sched"]
        self._link_buffer_words = link_buffer_words
        super().__init__({
            "host_cmd": In(stream.Signature(host_cmd_layout(arch))),
            "cmd_room": Out(arch.pes + 2 * arch.groups),
            "host_dma": In(stream.Signature(host_dma_layout(arch))),
            "dma_room": Out(2 * arch.pes),
            "o": Out(stream.Signature(die_o_layout(arch))),
            "errors": Out(die_errors_layout(arch, self._ext.channels)),
            "errors_clear": In(die_errors_layout(arch, self._ext.channels)),
            "probe": Out(die_probe_layout(arch)),
            "hb": Out(dram_bus_signature(arch.hb)).array(arch.pes),
            "ext": Out(dram_bus_signature(arch.ext)).array(self._ext.channels),
        })

    # ---- parameters -------------------------------------------------------------------------

    @property
    def config(self) -> ArchConfig:
        return self._arch

    @property
    def cmd_queue_depth(self) -> int:
        return self._cmd_depth

    @property
    def link_queue_depth(self) -> int:
        return self._link_depth

    @property
    def ext_queue_depth(self) -> int:
        return self._ext_depth

    @property
    def link_buffer_words(self) -> int:
        """Words of every aggregation-link destination FIFO (compile with this
        ``buffer_words``)."""
        return self._link_buffer_words

    @property
    def ext_channels(self) -> int:
        return self._ext.channels

    @property
    def ext_stripe_bytes(self) -> int:
        """Bytes of one EXT request unit (a burst in every channel)."""
        return self._ext.stripe_bytes

    @property
    def router(self) -> LoadRouter:
        """PE 0's load router (all are alike): its parameters."""
        return self._routers[0]

    @property
    def pe(self) -> PE:
        """PE 0 (all are alike): its latencies."""
        return self._pes[0]

    @property
    def hb_port(self) -> DramWordPort:
        """PE 0's HB word port (all are alike): its parameters (synthesis roll-up)."""
        return self._hb_ports[0]

    @property
    def ext_port(self) -> DramWordPort:
        """The LPDDR5 controller's word port."""
        return self._ext_port

    @property
    def ext_lanes(self) -> int:
        """Words a cycle from the LPDDR5 word port to the streamer (their ``lanes``)."""
        return self._streamer.lanes

    @property
    def streamer(self) -> ExtStreamer:
        """The EXT streamer (EXT read descriptors -> ring flits)."""
        return self._streamer

    @property
    def ext_fifo_words(self) -> int:
        """Words of every load router's EXT FIFO: the EXT schedulers' credits per PE."""
        return self._ext_sched[0].credits

    @property
    def ext_chunk_words(self) -> int:
        """Largest chunk in words the EXT schedulers issue to the streamer (a PE needs that
        many credits, ``ext_fifo_words``, for a full chunk)."""
        return self._ext_sched[0].chunk_words

    @property
    def ext_window(self) -> int:
        """Descriptors in each group's EXT scheduler window."""
        return self._ext_sched[0].window

    @property
    def ext_sched(self) -> ExtScheduler:
        """Group 0's EXT admission scheduler (all are alike): descriptors -> credit-admitted
        chunks."""
        return self._ext_sched[0]

    @property
    def o_latency(self) -> int:
        """Cycles from a PE's ``o`` beat taken to it offered on the die's ``o``."""
        return 1

    @property
    def queue_latency(self) -> int:
        """Cycles from a ``host_cmd`` beat taken to it offered by its (empty) queue to the
        PE's router, the group's link or the EXT streamer."""
        return _QUEUE_LATENCY

    @property
    def errors_latency(self) -> int:
        """Cycles from an ``errors_clear`` strobe, or from one of the die's own events (bits
        0 and 1: the bad beat offered), to ``errors`` showing it; the blocks' flags are wired
        through without a register (their own latency: the same)."""
        return STICKY_LATENCY

    @property
    def link_error_latency(self) -> int:
        """Cycles from a ``host_cmd`` LINK beat taken (the group's queue empty, its link
        idle) to ``errors.link_bad_desc`` set when the link rejects the descriptor:
        :attr:`queue_latency` + the link's ``errors_latency`` (the link takes it in the cycle
        the queue offers it)."""
        return self.queue_latency + self._links[0].errors_latency

    # ---- logic ------------------------------------------------------------------------------

    def elaborate(self, platform):
        m = Module()
        arch = self._arch
        P, G, NG = arch.pes, arch.pes_per_group, arch.groups

        for p in range(P):
            m.submodules[f"pe{p}"] = self._pes[p]
            m.submodules[f"router{p}"] = self._routers[p]
            m.submodules[f"hb_ctrl{p}"] = self._hb[p]
            m.submodules[f"hb_port{p}"] = self._hb_ports[p]
        for g in range(NG):
            m.submodules[f"link{g}"] = self._links[g]
        m.submodules.ring = ring = self._ring
        m.submodules.ext_ctrl = ext = self._ext
        m.submodules.ext_port = xport = self._ext_port
        m.submodules.ext_stream = streamer = self._streamer
        for g in range(NG):
            m.submodules[f"ext_sched{g}"] = self._ext_sched[g]

        # -- host command queues --
        hc = self.host_cmd.payload
        cmd_q = [SyncFIFO(width=command_layout().size, depth=self._cmd_depth) for _ in range(P)]
        link_q = [SyncFIFO(width=link_op_layout(G).size, depth=self._link_depth)
                  for _ in range(NG)]
        ext_q = [SyncFIFO(width=ext_read_layout(P).size, depth=self._ext_depth)
                 for _ in range(NG)]
        for p, q in enumerate(cmd_q):
            m.submodules[f"cmd_q{p}"] = q
        for g, q in enumerate(link_q):
            m.submodules[f"link_q{g}"] = q
        for g, q in enumerate(ext_q):
            m.submodules[f"ext_q{g}"] = q
        room = Cat(*[q.w_rdy for q in cmd_q], *[q.w_rdy for q in link_q],
                   *[q.w_rdy for q in ext_q])
        m.d.comb += self.cmd_room.eq(room)
        is_pe = hc.queue == HostQueue.PE
        is_link = hc.queue == HostQueue.LINK
        is_ext = hc.queue == HostQueue.EXT
        in_range = Mux(is_pe, hc.index < P, Mux(is_link | is_ext, hc.index < NG, 0))
        # an EXT beat's mask: non-empty and within its group (EXT multicast is group-local)
        ext_mask = hc.body.ext.dst_mask
        mask_ok = Signal()
        for g in range(NG):
            with m.If(hc.index == g):
                own_bits = ((1 << G) - 1) << (g * G)
                m.d.comb += mask_ok.eq(((ext_mask & own_bits) != 0)
                                       & ((ext_mask & ~Const(own_bits, P)) == 0))
        bad_mask = is_ext & in_range & ~mask_ok
        accept = in_range & ~bad_mask
        qbit = Mux(is_pe, hc.index, Mux(is_link, P + hc.index, P + NG + hc.index))
        m.d.comb += self.host_cmd.ready.eq(Mux(accept, room.bit_select(qbit, 1), 1))
        put = self.host_cmd.valid & self.host_cmd.ready & accept
        for p, q in enumerate(cmd_q):
            m.d.comb += [q.w_data.eq(hc.body.cmd.as_value()),
                         q.w_en.eq(put & is_pe & (hc.index == p))]
        for g, q in enumerate(link_q):
            m.d.comb += [q.w_data.eq(hc.body.link.as_value()),
                         q.w_en.eq(put & is_link & (hc.index == g))]
        for g, q in enumerate(ext_q):
            m.d.comb += [q.w_data.eq(hc.body.ext.as_value()),
                         q.w_en.eq(put & is_ext & (hc.index == g))]

        # -- host DMA --
        hd = self.host_dma.payload
        is_ld = hd.kind == DmaKind.LD
        dma_room = Cat(*[r.host.ready for r in self._routers],
                       *[hp.wr.ready for hp in self._hb_ports])
        m.d.comb += self.dma_room.eq(dma_room)
        d_in_range = hd.pe < P
        m.d.comb += self.host_dma.ready.eq(
            Mux(d_in_range, dma_room.bit_select(Mux(is_ld, hd.pe, P + hd.pe), 1), 1))

        # -- errors: the die's own sticky flags, then the blocks' own, wired through (each
        # block keeps and clears its own; the field names follow the blocks' layouts) --
        err, clr = self.errors, self.errors_clear
        own = Signal(_own_errors_layout())
        sticky_flags(m, own, set_={"cmd_index": self.host_cmd.valid & ~in_range,
                                   "dma_pe": self.host_dma.valid & ~d_in_range,
                                   "ext_bad_mask": self.host_cmd.valid & bad_mask},
                     clear={name: clr[name] for name, _ in _own_errors_layout()})
        m.d.comb += [err[name].eq(own[name]) for name, _ in _own_errors_layout()]
        blocks = {"link": self._links, "hb": self._hb, "ext": [self._ext],
                  "ext_sched": self._ext_sched}
        for kind, fields in _BLOCK_ERRORS:
            forward_flags(m, err, clr, blocks[kind], fields)
        for p in range(P):
            r, hp = self._routers[p], self._hb_ports[p]
            mine = self.host_dma.valid & (hd.pe == p)
            m.d.comb += [
                r.host.valid.eq(mine & is_ld), r.host.payload.eq(hd.data),
                hp.wr.valid.eq(mine & ~is_ld), hp.wr.payload.addr.eq(hd.addr),
                hp.wr.payload.data.eq(hd.data),
            ]

        # -- per PE: command queue -> router -> PE; router <-> HB port <-> HB controller --
        for p in range(P):
            pe, r, hp, hb, q = self._pes[p], self._routers[p], self._hb_ports[p], self._hb[p], \
                cmd_q[p]
            m.d.comb += [
                r.cmd_i.valid.eq(q.r_rdy), r.cmd_i.payload.as_value().eq(q.r_data),
                q.r_en.eq(r.cmd_i.ready),
            ]
            wiring.connect(m, r.cmd_o, pe.cmd)
            wiring.connect(m, r.ld, pe.ld)
            wiring.connect(m, r.hb_req, hp.rd_req)
            wiring.connect(m, hp.rd_data, r.hb_data)
            wiring.connect(m, hp.req, hb.req)
            wiring.connect(m, hp.wdata, hb.wdata)
            wiring.connect(m, hb.rdata, hp.rdata)
            wiring.connect(m, wiring.flipped(self.hb[p]), hb.dram)
            wiring.connect(m, ring.ext[p], r.ext)

        # -- aggregation links --
        for g in range(NG):
            link, q = self._links[g], link_q[g]
            m.d.comb += [link.op.valid.eq(q.r_rdy), link.op.payload.as_value().eq(q.r_data),
                         q.r_en.eq(link.op.ready)]
            for j in range(G):
                pe = self._pes[g * G + j]
                wiring.connect(m, pe.link_o, link.pe_i[j])
                wiring.connect(m, link.pe_o[j], pe.link_i)

        # -- EXT: descriptors -> streamer -> word port -> LPDDR5 controller; flits -> ring --
        #    (the scheduler admits chunks for which every destination's EXT FIFO has room,
        #    counted by credits the routers return as they pop EXT words)
        #    per group: its EXT queue -> its scheduler (group-local masks and credits); the
        #    groups' chunks to the streamer round robin (ExtGroupMerge)
        m.submodules.ext_merge = merge = ExtGroupMerge(groups=NG, pes_per_group=G)
        for g in range(NG):
            sched, q = self._ext_sched[g], ext_q[g]
            m.d.comb += [merge.queue[g].valid.eq(q.r_rdy),
                         merge.queue[g].payload.as_value().eq(q.r_data),
                         q.r_en.eq(merge.queue[g].ready),
                         sched.credit.eq(Cat(self._routers[g * G + j].ext_pop
                                             for j in range(G)))]
            wiring.connect(m, merge.desc[g], sched.desc)
            wiring.connect(m, sched.chunk, merge.chunk[g])
        wiring.connect(m, merge.out, streamer.desc)
        wiring.connect(m, streamer.rd_req, xport.rd_req)
        wiring.connect(m, xport.rd_data, streamer.rd_data)
        wiring.connect(m, xport.req, ext.req)
        wiring.connect(m, xport.wdata, ext.wdata)
        wiring.connect(m, ext.rdata, xport.rdata)
        m.d.comb += xport.wr.valid.eq(0)
        wiring.connect(m, streamer.inject, ring.inject)
        for c in range(ext.channels):
            wiring.connect(m, wiring.flipped(self.ext[c]), ext.dram[c])

        # -- read-only probes (die_probe_layout) --
        pr = self.probe
        ext_o = [ring.ext[p] for p in range(P)]
        m.d.comb += [
            pr.ext_word.eq(Cat(e.valid & e.ready for e in ext_o)),
            pr.ext_full.eq(Cat(e.valid & ~e.ready for e in ext_o)),
            pr.ld_word.eq(Cat(pe.ld.valid & pe.ld.ready for pe in self._pes)),
            pr.ld_wait.eq(Cat(pe.ld.ready & ~pe.ld.valid for pe in self._pes)),
            pr.ld_held.eq(Cat(pe.ld.valid & ~pe.ld.ready for pe in self._pes)),
            pr.hb_word.eq(Cat(r.hb_data.valid & r.hb_data.ready for r in self._routers)),
            pr.link_o_word.eq(Cat(pe.link_o.valid & pe.link_o.ready for pe in self._pes)),
            pr.link_i_word.eq(Cat(pe.link_i.valid & pe.link_i.ready for pe in self._pes)),
            pr.link_busy.eq(Cat(link.busy for link in self._links)),
            pr.link_op.eq(Cat(link.op.valid & link.op.ready for link in self._links)),
            pr.link_done.eq(Cat(link.done for link in self._links)),
            pr.inject.eq(ring.inject.valid & ring.inject.ready),
            pr.inject_full.eq(ring.inject.valid & ~ring.inject.ready),
            pr.ext_rd_word.eq(streamer.rd_data.valid & streamer.rd_data.ready),
        ]

        # -- output merge: round robin over the PEs' o streams into one register --
        o_valid = Signal()
        o_pe = Signal(range(P) if P > 1 else 1)
        o_beat = Signal(o_beat_layout(arch))
        last = Signal(range(P) if P > 1 else 1)
        m.d.comb += [self.o.valid.eq(o_valid), self.o.payload.pe.eq(o_pe),
                     self.o.payload.beat.eq(o_beat)]
        free = ~o_valid | self.o.ready
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += o_valid.eq(0)
        valids = Cat(*[pe.o.valid for pe in self._pes])
        above = Signal(P)
        m.d.comb += above.eq(valids & ~((Const(1, P + 2) << (last + 1)) - 1)[:P])
        grant = Signal(range(P) if P > 1 else 1)
        any_valid = valids.any()
        # lowest valid PE above the last granted one, else the lowest valid PE
        for p in reversed(range(P)):
            with m.If(valids[p]):
                m.d.comb += grant.eq(p)
        for p in reversed(range(P)):
            with m.If(above.any() & above[p]):
                m.d.comb += grant.eq(p)
        with m.If(free & any_valid):
            for p in range(P):
                with m.If(grant == p):
                    m.d.comb += self._pes[p].o.ready.eq(1)
                    m.d.sync += o_beat.eq(self._pes[p].o.payload)
            m.d.sync += [o_valid.eq(1), o_pe.eq(grant), last.eq(grant)]
        return m

"""External-memory controller: ``ext_channels`` LPDDR5 channels behind one request stream
(issue 4; paper Section 6, Table 1: LPDDR5-6400, 8 channels x16, 102.4 GB/s)."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import ArchConfig
from .checked import CheckedComponent, check_param
from .dram import DramController, dram_bus_signature, dram_errors_layout, request_layout
from .layouts import forward_flags


__all__ = ["ExtController"]


class ExtController(CheckedComponent):
    """``channels`` :class:`~elmoe3d.hw.dram.DramController` s of ``config.ext``, with
    requests striped over them burst by burst.

    The unit of a request is a *stripe*: one burst (32 B for LPDDR5 x16 BL16) in every
    channel, ``channels * burst_bytes`` bytes (256 B for 8 channels). Stripe ``s`` holds bytes
    ``[s * S, (s + 1) * S)`` of the external address space, channel ``c`` storing bytes
    ``[s * S + c * 32, s * S + (c + 1) * 32)`` at its own burst address ``s``. Every channel
    therefore receives the same ``(write, addr, length)`` request and sees a sequential stream
    for a sequential request; the channels' read bursts are joined, channel 0 in the low bits,
    into one ``rdata`` beat per stripe, in request order. Write data: one ``wdata`` beat per
    stripe, split the same way.

    Ports
    -----
    req : In stream, :func:`~elmoe3d.hw.dram.request_layout` (``addr``, ``length`` in
        stripes)
    wdata, rdata : In / Out stream, ``channels * burst_bytes * 8`` bits
    dram : Out :func:`~elmoe3d.hw.dram.dram_bus_signature` array of ``channels`` (one
        command bus per channel, ``dram[c]``)
    errors, errors_clear : Out / In :func:`~elmoe3d.hw.dram.dram_errors_layout`
        (``channels``)
        Bit c of ``refresh_overflow`` is channel c's sticky flag (a channel's refresh forced
        at the postponing limit; a level, see :func:`~elmoe3d.hw.dram.dram_errors_layout`);
        a 1 in ``errors_clear`` clears it (write-1-to-clear).

    A request is handed to all channels (each channel takes it when it can; the next request
    waits until all have); a joined ``rdata`` beat is offered when every channel has its
    burst, so the channels run from their own queues and FIFOs and stall together only when
    one falls behind (refresh is per channel, per bank, hidden by each channel's look-ahead).

    Parameters
    ----------
    config : ArchConfig
    channels : int or None
        Channels to build (default ``config.ext_channels``); a smaller count builds a scaled
        controller with the same per-channel behaviour (benches).
    queue_depth, read_buffer, length_bits : int
        Per channel, as :class:`~elmoe3d.hw.dram.DramController`.

    Raises
    ------
    TypeError
        ``config`` is not an ArchConfig.
    ValueError
        ``channels`` is not a positive integer.
    """

    @classmethod
    def check(cls, *, config, channels, queue_depth, read_buffer, length_bits):
        """The constructor's checks (:class:`~elmoe3d.hw.checked.CheckedComponent`), the
        channel controllers' included: raises before any object exists."""
        if not isinstance(config, ArchConfig):
            raise TypeError(f"config: expected an ArchConfig, got {type(config).__name__}")
        channels = config.ext_channels if channels is None else channels
        check_param("channels", channels)
        DramController.check(dram=config.ext, clock_ghz=config.clock_ghz,
                             queue_depth=queue_depth, read_buffer=read_buffer,
                             length_bits=length_bits)

    def __init__(self, *, config: ArchConfig, channels: int | None = None,
                 queue_depth: int = 128, read_buffer: int = 32, length_bits: int = 16):
        channels = config.ext_channels if channels is None else channels
        self._arch, self._channels = config, channels
        # kept for the block's identity (synth.blocks.instance_key): its channel controllers
        # are built from them
        self._queue_depth, self._read_buffer, self._length_bits = \
            queue_depth, read_buffer, length_bits
        self._ctrl = [DramController(dram=config.ext, clock_ghz=config.clock_ghz,
                                     queue_depth=queue_depth, read_buffer=read_buffer,
                                     length_bits=length_bits) for _ in range(channels)]
        c0 = self._ctrl[0]
        width = channels * config.ext.burst_bytes * 8
        super().__init__({
            "req": In(stream.Signature(request_layout(c0.addr_bits, length_bits))),
            "wdata": In(stream.Signature(width)),
            "rdata": Out(stream.Signature(width)),
            "dram": Out(dram_bus_signature(config.ext)).array(channels),
            "errors": Out(dram_errors_layout(channels)),
            "errors_clear": In(dram_errors_layout(channels)),
        })

    @property
    def arch(self) -> ArchConfig:
        return self._arch

    @property
    def channels(self) -> int:
        return self._channels

    @property
    def channel(self) -> DramController:
        """The controller of channel 0 (all are alike): its properties."""
        return self._ctrl[0]

    @property
    def stripe_bytes(self) -> int:
        """Bytes per request unit and per ``rdata``/``wdata`` beat."""
        return self._channels * self._arch.ext.burst_bytes

    @property
    def peak_bytes_per_cycle(self) -> float:
        """Peak bytes per logic cycle of the built channels (102.4 at 8 channels, 1 GHz)."""
        return self._channels * self._ctrl[0].peak_bytes_per_cycle

    def elaborate(self, platform):
        m = Module()
        C = self._channels
        bw = self._arch.ext.burst_bytes * 8
        for c, ctrl in enumerate(self._ctrl):
            m.submodules[f"ch{c}"] = ctrl
            wiring.connect(m, wiring.flipped(self.dram[c]), ctrl.dram)
        # bit c of refresh_overflow is channel c's own sticky flag (it clears its own)
        forward_flags(m, self.errors, self.errors_clear, self._ctrl,
                      {name: name for name, _ in dram_errors_layout()})
        # requests and write beats: broadcast, each channel taking its copy once
        for port, part in ((self.req, None), (self.wdata, bw)):
            took = Signal(C, name="took_req" if part is None else "took_wdata")
            subs = [ctrl.req if part is None else ctrl.wdata for ctrl in self._ctrl]
            done = Signal(C)
            for c, sub in enumerate(subs):
                m.d.comb += [sub.valid.eq(port.valid & ~took[c]),
                             done[c].eq(took[c] | sub.ready)]
                m.d.comb += sub.payload.eq(port.payload if part is None
                                           else port.payload[c * part:(c + 1) * part])
            m.d.comb += port.ready.eq(done.all())
            with m.If(port.valid):
                with m.If(done.all()):
                    m.d.sync += took.eq(0)
                with m.Else():
                    m.d.sync += took.eq(took | Cat(*[s.ready for s in subs]))
        # read bursts: joined when every channel has one
        m.d.comb += [self.rdata.valid.eq(Cat(*[c.rdata.valid for c in self._ctrl]).all()),
                     self.rdata.payload.eq(Cat(*[c.rdata.payload for c in self._ctrl]))]
        for ctrl in self._ctrl:
            m.d.comb += ctrl.rdata.ready.eq(self.rdata.valid & self.rdata.ready)
        return m

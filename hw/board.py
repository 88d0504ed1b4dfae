"""The FPGA prototype's board top (``docs/fpga.md``, "Board top"): one PE with its load router,
block-RAM stand-ins for its HB bank and the EXT memory, and the host bridge over a UART
(issue 7; the PE is paper Section 4.1's, the HB / EXT sources of its LOADs Section 5.1's).

::

    uart_rx -> UartRx -> Bridge --cmd--> LoadRouter --cmd_o/ld--> PE --o/link_o--> Bridge
                                 --host-->  (host)                                  -> UartTx
                                 --link-----------------------------> link_i          -> uart_tx
                                 --hb_write--> HB stand-in  <--hb_req/hb_data-- LoadRouter
                                 --ext_write-> EXT stand-in <-- EXT streamer --ext--> LoadRouter
                                 --ext_desc--> EXT streamer

* :class:`BoardTop` -- platform independent (pins ``uart_rx``, ``uart_tx``, ``leds``, and
  ``rw_collision`` for the simulation benches); the
  cocotb bench (:mod:`elmoe3d.sim.bench_board`) drives it at the pin level.
* :class:`BoardPlatformTop` -- the same for an amaranth-boards platform: the platform's
  default clock, ``uart`` 0, the LEDs it has. The FPGA flow (:mod:`elmoe3d.synth.fpga`)
  builds it.

Stand-ins. HB: an ``amaranth.lib.memory.Memory`` of ``hb_words * W/8`` bytes (block RAM: one
synchronous read port, one write port, no reset; word ``a`` is bytes ``a * W/8 ..``, least
significant first) written by HB_WRITE frames byte by byte; each read request ``(addr,
words)`` of the router is answered with words ``addr .. addr + words - 1`` (addresses modulo
``hb_words``), in order, one every ``W/8 + 2`` cycles (assembled from bytes in a W-bit shift
register: :func:`~elmoe3d.hw.bridge.byte_word_fetch`). EXT: ``ext_words * W/8`` bytes written
by EXT_WRITE frames, and the EXT streamer: per EXT_STREAM descriptor ``(addr, words)``, in
order, words ``addr .. addr + words - 1`` into the router's ``ext`` port, at the same rate,
each held until the router takes it. Byte-wide memories, not W-wide ones: yosys wraps a
W-wide two-port block RAM in about 530 LUT4 and 510-1030 FF of read-during-write logic, and
the UART (64 bytes a word at 10 bits a byte) is 10 * divisor / 1.03 times slower than this
read rate anyway.
"""

from __future__ import annotations

from collections.abc import Mapping

from amaranth.hdl import Cat, ClockDomain, Elaboratable, Module, ResetInserter, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..checks import is_int, python_int_hint
from ..config import PEOptions, pe_config
from .bridge import Bridge, byte_word_fetch
from .checked import CheckedComponent, constructor_params, check_param
from .layouts import address_bits
from .load_router import LoadRouter
from .pe import PE
from .pll import Ecp5Pll, ecp5_pll_dividers
from .uart import UartRx, UartTx


__all__ = ["BoardTop", "BoardPlatformTop", "uart_divisor", "MAX_BAUD_ERROR", "LED_BITS",
           "ROUTER_FIFO_WORDS"]

#: The largest relative baud-rate error accepted (the receiver samples at mid-bit; a
#: standard host UART is within 1-2 %).
MAX_BAUD_ERROR = 0.02

#: The load router's FIFOs on the board (HB data, EXT and HOST input; words) and its HB read
#: burst: one word each, a W-bit register instead of a 16-deep LUT-RAM bank (``synth_ecp5``
#: of the router: 1,396 LUT4 positions against 3,793 with the 16/8/4-word FIFOs, 2026-11-30).
#: The cost: one HB word in flight at a time, about 3 cycles more per HB word than the
#: stand-in's W/8 + 2 (the board bench: 1.9 % more PE cycles, 0.24 % more board cycles; the
#: UART dominates).
ROUTER_FIFO_WORDS = 1

#: Meaning of the ``leds`` bits.
LED_BITS = {
    0: "heartbeat (toggles every 2**k cycles, k the bit length of clk_hz // 3 minus 1: 0.17-0.33 s)",
    1: "a frame was NAKed since reset (sticky)",
    2: "traffic: a command, load word, stand-in request or output is offered (moving or "
       "waiting) between bridge, stand-ins, router and PE (lit and still: the PE waits for "
       "entries the host has not sent, or the host for outputs)",
    3: "UART framing error seen since reset (sticky)",
    4: "UART receive overrun seen since reset (sticky)",
    5: "bridge busy: receiving, checking, copying or sending a frame",
    6: "an HB read past the stand-in (addr + words > hb_words; the reader wraps the "
       "address) seen since reset (sticky; the driver allocates HB addresses, so a program "
       "that was not split by it)",
    7: "receive line low (a character is arriving)",
}


def uart_divisor(clk_hz: int, baud: int) -> int:
    """Clock cycles per bit, ``round(clk_hz / baud)``. Raises ``ValueError`` naming ``baud``
    if the divisor is below 4 or the resulting rate is more than :data:`MAX_BAUD_ERROR` off."""
    for name, v in (("clk_hz", clk_hz), ("baud", baud)):
        check_param(name, v)
    divisor = round(clk_hz / baud)
    if divisor < 4:
        raise ValueError(f"baud: {baud} is too fast for clk_hz = {clk_hz}: {clk_hz / baud:.2f} "
                         f"clock cycles per bit, the UART needs at least 4")
    error = abs(clk_hz / divisor - baud) / baud
    if error > MAX_BAUD_ERROR:
        raise ValueError(f"baud: {baud} is {100 * error:.1f} % off with clk_hz = {clk_hz} "
                         f"(divisor {divisor}); at most {100 * MAX_BAUD_ERROR:.0f} % works")
    return divisor


def _check_pe_params(pe_params) -> dict:
    """``pe_params`` as a dict (``None``: empty) if a mapping of PE keyword arguments (the
    fields of :class:`~elmoe3d.config.PEOptions` but ``config``), else ``TypeError`` naming
    it."""
    if pe_params is not None and not isinstance(pe_params, Mapping):
        raise TypeError(f"pe_params: expected a dict of PE keyword arguments or None, "
                        f"got {type(pe_params).__name__}")
    names = [name for name in PEOptions.__dataclass_fields__ if name != "config"]
    unknown = sorted(set(pe_params or {}) - set(names))
    if unknown:
        raise TypeError(f"pe_params: unknown PE keyword argument(s) {', '.join(unknown)} "
                        f"(expected PE keyword arguments: {', '.join(names)})")
    return dict(pe_params or {})


def _check_pow2(name, value):
    if not is_int(value, numpy=False) or value < 1 or \
            value & (value - 1):
        raise ValueError(f"{name}: expected a power of two (W-bit words)"
                         f"{python_int_hint(value)}, got {value!r}")


def _stand_in_reader(m, name, rd, req, req_addr, req_words, out, word_bytes, addr_bits,
                     clear):
    """Requests ``(addr, words)`` on stream ``req`` -> the words ``addr .. addr + words - 1``
    (modulo the memory) of a byte-wide stand-in memory on stream ``out``, in order, through
    :func:`~elmoe3d.hw.bridge.byte_word_fetch` (``W/8 + 2`` cycles a word). The next request
    is taken once the current one's last word fetch has started. ``clear`` (HELLO's soft
    reset) drops the request being served and the word in flight."""
    start, addr, idle = byte_word_fetch(m, name, rd, word_bytes, out, clear=clear)
    cur = Signal(addr_bits, name=f"{name}_next")
    left = Signal(len(req_words), name=f"{name}_left")
    m.d.comb += req.ready.eq(left == 0)
    go = idle & (left != 0)
    m.d.comb += [start.eq(go), addr.eq(cur)]
    with m.If(go):
        m.d.sync += [cur.eq(cur + 1), left.eq(left - 1)]
    with m.If(req.valid & req.ready):
        m.d.sync += [cur.eq(req_addr), left.eq(req_words)]
    with m.If(clear):
        m.d.sync += [cur.eq(0), left.eq(0)]


class BoardTop(CheckedComponent):
    """UART bridge + load router + PE + stand-ins (module docstring).

    Ports
    -----
    uart_rx : In(1)
        Serial line from the host (idle high; asynchronous, synchronised inside).
    uart_tx : Out(1)
        Serial line to the host (idle high).
    leds : Out(8)
        Status, :data:`LED_BITS`.
    rw_collision : Out(1)
        Sticky (power-on reset only): the PE read and wrote one word of a memory synthesised
        without read-first emulation in the same cycle (:attr:`PE.rw_collision
        <elmoe3d.hw.pe.PE.rw_collision>`; on an FPGA that read is undefined). For the simulation benches,
        which assert it stays low; :class:`BoardPlatformTop` leaves it unconnected, so the
        FPGA build drops it.

    Parameters
    ----------
    config : ArchConfig or PEConfig
        The PE (and router) configuration.
    clk_hz : int
        The clock frequency (Hz): the UART divisor and INFO.
    baud : int
        UART rate; ``round(clk_hz / baud)`` >= 4 and within :data:`MAX_BAUD_ERROR`.
    hb_words, ext_words : int
        HB and EXT stand-in depths in W-bit words (powers of two).
    frame_words : int
        The bridge's staging buffer in W-bit words (:class:`~elmoe3d.hw.bridge.Bridge`).
    cmd_depth, host_depth, link_depth, ext_depth, rx_fifo_bytes : int
        The bridge's queues (:class:`~elmoe3d.hw.bridge.Bridge`; ``rx_fifo_bytes`` assumes
        a stop-and-wait host, as :class:`elmoe3d.sw.host.fpga.FpgaBoard` is).
    pe_params : mapping or None
        Keyword arguments of the :class:`~elmoe3d.hw.pe.PE` (the fields of
        :class:`~elmoe3d.config.PEOptions` but ``config``;
        :data:`~elmoe3d.config.FPGA_LEAN_PE`, each option in ``docs/fpga.md``, "What fits"): the
        FPGA-lean datapath options, which change cycle counts or memory organisation but
        never a result. ``None``: the PE's defaults.

    HELLO is a soft reset of the PE side: the bridge's ``soft_reset`` pulse (as its INFO
    reply leaves) resets the load router and the PE (``ResetInserter``) and the HB reader
    and EXT streamer, while the bridge empties its FIFOs and queue; the stand-in memories
    keep their contents. The LEDs' sticky bits and ``rw_collision`` are kept (power-on reset
    only).

    Attributes: :attr:`divisor`, :attr:`bridge_params` (the bridge's keyword arguments, for a
    host model of this board), the sub-blocks after construction (``uart_rx_block``,
    ``uart_tx_block``, ``bridge``, ``router``, ``pe``: their latencies and parameters).

    Raises (before the block or any of its parts exists)
    ------
    TypeError
        ``config`` is neither an ArchConfig nor a PEConfig; ``pe_params`` is not a mapping of
        PE keyword arguments.
    ValueError
        A parameter out of range (named; the PE options' by
        :class:`~elmoe3d.config.PEOptions`), the baud rate unreachable (:func:`uart_divisor`).
    """

    @classmethod
    def check(cls, *, config, clk_hz, baud, hb_words, ext_words, frame_words, cmd_depth,
              host_depth, link_depth, ext_depth, rx_fifo_bytes, pe_params):
        """The constructor's checks (:class:`~elmoe3d.hw.checked.CheckedComponent`), the
        parts' included: raises before the object exists."""
        pe_params = _check_pe_params(pe_params)
        pe = pe_config(config)
        uart_divisor(clk_hz, baud)
        _check_pow2("hb_words", hb_words)
        _check_pow2("ext_words", ext_words)
        Bridge.check(**constructor_params(Bridge, config=pe, **_bridge_params(
            clk_hz=clk_hz, baud=baud, hb_words=hb_words, ext_words=ext_words,
            frame_words=frame_words, cmd_depth=cmd_depth, host_depth=host_depth,
            link_depth=link_depth, ext_depth=ext_depth, rx_fifo_bytes=rx_fifo_bytes)))
        PEOptions(config=pe, **pe_params)         # the PE's options (its ValueErrors)

    def __init__(self, *, config, clk_hz: int, baud: int = 1_000_000, hb_words: int = 512,
                 ext_words: int = 512, frame_words: int = 16, cmd_depth: int = 16,
                 host_depth: int = 64, link_depth: int = 64, ext_depth: int = 8,
                 rx_fifo_bytes: int = 32, pe_params: Mapping | None = None):
        pe = pe_config(config)
        self._divisor = uart_divisor(clk_hz, baud)
        self._bridge_params = _bridge_params(
            clk_hz=clk_hz, baud=baud, hb_words=hb_words, ext_words=ext_words,
            frame_words=frame_words, cmd_depth=cmd_depth, host_depth=host_depth,
            link_depth=link_depth, ext_depth=ext_depth, rx_fifo_bytes=rx_fifo_bytes)
        self.bridge = Bridge(config=pe, **self._bridge_params)
        self.uart_rx_block = UartRx(divisor=self._divisor)
        self.uart_tx_block = UartTx(divisor=self._divisor)
        # one-word data FIFOs (registers, not LUT RAM) and HB reads of one word: about 3
        # cycles more per HB word than the stand-in's W/8 + 2 (ROUTER_FIFO_WORDS)
        w = ROUTER_FIFO_WORDS
        self.router = LoadRouter(config=pe, hb_fifo_words=w, hb_burst_words=w,
                                 ext_fifo_words=w, host_fifo_words=w)
        self.pe = PE(config=pe, **(pe_params or {}))
        self._pe = pe
        self._config = config
        self._clk_hz = clk_hz
        self._baud = baud
        self._hb_words = hb_words
        self._ext_words = ext_words
        super().__init__({
            "uart_rx": In(1, init=1),
            "uart_tx": Out(1, init=1),
            "leds": Out(8),
            "rw_collision": Out(1),
        })

    @property
    def config(self):
        return self._pe

    @property
    def clk_hz(self) -> int:
        return self._clk_hz

    @property
    def baud(self) -> int:
        return self._baud

    @property
    def divisor(self) -> int:
        """UART clock cycles per bit."""
        return self._divisor

    @property
    def hb_words(self) -> int:
        return self._hb_words

    @property
    def ext_words(self) -> int:
        return self._ext_words

    @property
    def bridge_params(self) -> dict:
        """The bridge's parameters (a copy): what a host model of this board needs."""
        return dict(self._bridge_params)

    def elaborate(self, platform):
        m = Module()
        W = self._pe.word_bits
        m.submodules.uart_rx = urx = self.uart_rx_block
        m.submodules.uart_tx = utx = self.uart_tx_block
        m.submodules.bridge = br = self.bridge
        rt, pe = self.router, self.pe
        # HELLO's soft reset (the bridge's one-cycle pulse when its INFO reply leaves): the
        # router and the PE start over like after power-on; the stand-in memories keep
        # their contents
        soft = br.soft_reset
        m.submodules.router = ResetInserter(soft)(rt)
        m.submodules.pe = ResetInserter(soft)(pe)

        m.d.comb += [urx.rx.eq(self.uart_rx), self.uart_tx.eq(utx.tx)]
        wiring.connect(m, urx.o, br.rx)
        wiring.connect(m, br.tx, utx.i)
        wiring.connect(m, br.cmd, rt.cmd_i)
        wiring.connect(m, br.host, rt.host)
        wiring.connect(m, br.link, pe.link_i)
        wiring.connect(m, rt.cmd_o, pe.cmd)
        wiring.connect(m, rt.ld, pe.ld)
        wiring.connect(m, pe.o, br.o)
        wiring.connect(m, pe.link_o, br.link_o)

        # -- HB and EXT stand-ins: byte-wide block RAM (byte address = word * W/8 + lane),
        #    written by the bridge byte by byte, read a word at a time --
        wb = W // 8
        for name, depth, wr, req, req_addr, req_words, out in (
                ("hb", self._hb_words, br.hb_write, rt.hb_req, rt.hb_req.payload.addr,
                 rt.hb_req.payload.words, rt.hb_data),
                ("ext", self._ext_words, br.ext_write, br.ext_desc, br.ext_desc.payload.addr,
                 br.ext_desc.payload.words, rt.ext)):
            mem = Memory(shape=8, depth=depth * wb, init=[])
            m.submodules[f"{name}_mem"] = mem
            w, r = mem.write_port(), mem.read_port()
            m.d.comb += [w.en.eq(wr.en), w.addr.eq(Cat(wr.lane, wr.addr)), w.data.eq(wr.data)]
            abits = address_bits(depth)
            _stand_in_reader(m, name, r, req, req_addr[:abits], req_words, out, wb, abits,
                             soft)

        # HB requests past the stand-in (the reader wraps the address): sticky flag
        hb_range = Signal()
        hb_top = Signal(len(rt.hb_req.payload.addr) + 1)
        m.d.comb += hb_top.eq(rt.hb_req.payload.addr + rt.hb_req.payload.words)
        with m.If(rt.hb_req.valid & rt.hb_req.ready & (hb_top > self._hb_words)):
            m.d.sync += hb_range.eq(1)

        # (not in HELLO's cycle: the PE's ports then still show the state being reset)
        with m.If(pe.rw_collision & ~soft):
            m.d.sync += self.rw_collision.eq(1)

        # -- status LEDs --
        beat = Signal(max(2, (self._clk_hz // 3).bit_length()))
        m.d.sync += beat.eq(beat + 1)
        framing = Signal()
        overrun = Signal()
        with m.If(urx.framing_errors != 0):
            m.d.sync += framing.eq(1)
        with m.If(urx.overruns != 0):
            m.d.sync += overrun.eq(1)
        traffic = (br.cmd.valid | br.host.valid | br.link.valid | br.ext_desc.valid
                   | rt.hb_req.valid | rt.hb_data.valid | rt.ext.valid | rt.cmd_o.valid
                   | rt.ld.valid | pe.o.valid | pe.link_o.valid)
        m.d.comb += self.leds.eq(Cat(
            beat[-1], br.nak_seen, traffic, framing, overrun, br.busy, hb_range,
            ~self.uart_rx))
        return m


def _bridge_params(*, clk_hz, baud, hb_words, ext_words, frame_words, cmd_depth, host_depth,
                   link_depth, ext_depth, rx_fifo_bytes) -> dict:
    """The board top's :class:`~elmoe3d.hw.bridge.Bridge` keyword arguments (but ``config``)."""
    return dict(frame_words=frame_words, cmd_depth=cmd_depth, host_depth=host_depth,
                link_depth=link_depth, ext_depth=ext_depth, rx_fifo_bytes=rx_fifo_bytes,
                hb_words=hb_words, ext_words=ext_words, clk_hz=clk_hz, baud=baud)


class BoardPlatformTop(Elaboratable):
    """:class:`BoardTop` on an amaranth-boards platform (for the FPGA flow).

    ``elaborate(platform)`` runs the ``sync`` domain from the platform's default clock (e.g.
    the ULX3S's 25 MHz ``clk25``) or, with ``clk_hz``, from an ECP5 PLL output of that
    frequency (:class:`~elmoe3d.hw.pll.Ecp5Pll`: ``sync`` held in reset until it locks),
    requests ``uart`` 0 (``rx``, ``tx``) and as many of the 8 ``led`` resources
    as the platform has, and instantiates :class:`BoardTop` with the other parameters.

    Parameters (keyword-only)
    -------------------------
    config : ArchConfig or PEConfig
    baud : int
        UART rate (checked against the board clock at elaboration).
    clk_hz : int or None
        The board top's clock (Hz) from a PLL (ECP5 platforms); ``None``: the platform's
        default clock itself.
    hb_words, ext_words, frame_words : int
        As :class:`BoardTop`.
    **board : further :class:`BoardTop` parameters (queue depths).

    Checked at construction (``TypeError`` / ``ValueError`` naming the parameter):
    ``config`` (an ArchConfig or PEConfig), ``hb_words`` and ``ext_words`` (powers of two),
    ``baud`` (a positive integer). Checked at elaboration, when the platform's clock is
    known (``ValueError`` from :class:`BoardTop`): ``baud`` against the clock
    (:func:`uart_divisor`), ``frame_words`` and the ``**board`` queue depths (the bridge's
    ranges), and a ``platform`` of None. The construction checks run before the object
    exists (:meth:`check`).
    """

    def __new__(cls, *args, **kwargs):
        cls.check(**constructor_params(cls, *args, **kwargs))
        return super().__new__(cls, src_loc_at=1)

    @classmethod
    def check(cls, *, config, baud, hb_words, ext_words, frame_words, clk_hz, board):
        """The construction checks (above); raises before the object exists."""
        pe_config(config)
        if clk_hz is not None and (not is_int(clk_hz, numpy=False)
                                   or clk_hz < 1):
            raise ValueError(f"clk_hz: expected a positive integer (Hz) or None"
                             f"{python_int_hint(clk_hz)}, got {clk_hz!r}")
        _check_pow2("hb_words", hb_words)
        _check_pow2("ext_words", ext_words)
        check_param("baud", baud)

    def __init__(self, *, config, baud: int = 1_000_000, hb_words: int = 512,
                 ext_words: int = 512, frame_words: int = 16, clk_hz: int | None = None,
                 **board):
        self.config = config
        self.baud = baud
        self.hb_words = hb_words
        self.ext_words = ext_words
        self.frame_words = frame_words
        self.clk_hz = clk_hz
        self.board = dict(board)
        self.top = None                     # the BoardTop, after elaboration

    def elaborate(self, platform):
        from amaranth.build import ResourceError
        from amaranth.lib import io
        if platform is None:
            raise ValueError("platform: BoardPlatformTop needs an amaranth-boards platform "
                             "(use BoardTop for simulation)")
        clk_hz = int(round(platform.default_clk_frequency))
        if self.clk_hz is not None:                 # a clk_hz out of reach fails first
            if getattr(platform, "family", None) != "ecp5":
                raise ValueError(f"clk_hz: a PLL clock is built for ECP5 platforms only, not "
                                 f"{type(platform).__name__}")
            ecp5_pll_dividers(clk_hz, self.clk_hz)
        m = Module()
        if self.clk_hz is not None:
            clk = platform.request(platform.default_clk, dir="-")
            m.submodules.clk_buf = clk_buf = io.Buffer("i", clk)
            m.domains.sync = ClockDomain("sync")
            m.submodules.pll = Ecp5Pll(clk_in=clk_buf.i, clk_in_hz=clk_hz, clk_hz=self.clk_hz)
            clk_hz = self.clk_hz
        top = BoardTop(config=self.config, clk_hz=clk_hz, baud=self.baud,
                       hb_words=self.hb_words, ext_words=self.ext_words,
                       frame_words=self.frame_words, **self.board)
        self.top = top
        m.submodules.board = top
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx_buf = rx_buf = io.Buffer("i", uart.rx)
        m.submodules.uart_tx_buf = tx_buf = io.Buffer("o", uart.tx)
        m.d.comb += [top.uart_rx.eq(rx_buf.i), tx_buf.o.eq(top.uart_tx)]
        for i in range(8):
            try:
                led = platform.request("led", i, dir="-")
            except ResourceError:
                break
            m.submodules[f"led_buf_{i}"] = buf = io.Buffer("o", led)
            m.d.comb += buf.o.eq(top.leds[i])
        return m

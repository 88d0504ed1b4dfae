"""UART receiver and transmitter of the FPGA prototype's host bridge (8N1, LSB first;
``docs/fpga.md``, "Board top"): the byte streams under :class:`elmoe3d.hw.bridge.Bridge`.

Both are clocked by the board clock and divide it by ``divisor`` clock cycles per bit
(``divisor = round(clk_hz / baud)``, at least 4; :class:`elmoe3d.hw.board.BoardTop` computes
it and checks the baud-rate error). A character is a start bit (0), eight data bits, least
significant first, and a stop bit (1); the idle line is high.

* :class:`UartRx`: two-flip-flop synchroniser, start bit confirmed at mid-bit, every data bit
  and the stop bit sampled at mid-bit. A character whose stop bit reads 0 is dropped and
  counted (``framing_errors``); the receiver then waits for the line to return high and
  resynchronises on the next falling edge. A received byte not taken by the time the next one
  completes is an overrun: the new byte is dropped and counted (``overruns``); the byte on
  offer stays valid and unchanged (the stream rule).
* :class:`UartTx`: takes a byte when idle and shifts out its ten bits, ``divisor`` cycles
  each; the next byte may follow the stop bit with no idle time.

The receiver samples ``divisor // 2`` cycles after the first clock edge that sees the start
bit's falling edge (through the synchroniser, which delays every sample alike), then every
``divisor`` cycles: the stop bit at ``s + d//2 + 9 d``, ``s`` in (0, 1] cycle after the
edge, ``d`` the divisor. For a sender whose bit lasts ``d (1 + e)`` cycles, sending
characters back to back (the worst case: the next start bit right after the stop bit), that
sample lies in the stop bit iff ``9 d (1 + e) <= s + d//2 + 9 d < 10 d (1 + e)`` for every
``s``: ``-(d - d//2 - 1) / (10 d) < e <= (d//2) / (9 d)``, asymmetric: -3.75 / +5.56 % at
divisor 8, -4.8 / +5.33 % at divisor 25, -2.5 / +5.56 % at divisor 4 (``tests/amaranth/test_uart.py``
checks just inside and beyond at 8 and 25). The board keeps its own rate error at or below
2 % (:func:`elmoe3d.hw.board.uart_divisor`). A low pulse on the idle line shorter than about
``d//2`` cycles is a glitch: START finds the line high at mid-bit and returns to IDLE, no
byte and no error.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream
from amaranth.lib.wiring import In, Out

from ..checks import is_int, python_int_hint
from .checked import CheckedComponent


__all__ = ["UartRx", "UartTx", "COUNTER_BITS", "MIN_DIVISOR"]

#: Width of the error counters (saturating).
COUNTER_BITS = 16
#: Smallest divisor (clock cycles per bit) the receiver supports: the start-bit check at
#: mid-bit and the two synchroniser stages need at least four samples per bit.
MIN_DIVISOR = 4


def _check_divisor(divisor):
    if not is_int(divisor, numpy=False) or divisor < MIN_DIVISOR:
        raise ValueError(f"divisor: expected an integer >= {MIN_DIVISOR} (clock cycles per "
                         f"bit){python_int_hint(divisor)}, got {divisor!r}")


class UartRx(CheckedComponent):
    """UART receiver, 8N1 (module docstring).

    Ports
    -----
    rx : In(1)
        The serial line (asynchronous to the clock; idle high). Synchronised by two flip-flops.
    o : Out, ``stream.Signature(8)``
        Received bytes, in order.
    framing_errors : Out(:data:`COUNTER_BITS`)
        Characters dropped because their stop bit was 0 (saturating counter, reset 0).
    overruns : Out(:data:`COUNTER_BITS`)
        Bytes dropped because ``o`` still held the previous byte (saturating, reset 0).

    Latency
    -------
    :attr:`latency` cycles from the falling edge of the start bit on ``rx`` to the byte being
    offered on ``o``: 2 (synchroniser) + ``divisor // 2`` (to mid start bit) + 9 * ``divisor``
    (eight data bits and the stop bit, each sampled at mid-bit) + 1 (output register).

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (>= :data:`MIN_DIVISOR`).

    Raises
    ------
    ValueError
        ``divisor`` is not an integer >= 4.
    """

    @classmethod
    def check(cls, *, divisor):
        _check_divisor(divisor)

    def __init__(self, *, divisor: int):
        self._divisor = divisor
        super().__init__({
            "rx": In(1, init=1),
            "o": Out(stream.Signature(8)),
            "framing_errors": Out(COUNTER_BITS),
            "overruns": Out(COUNTER_BITS),
        })

    @property
    def divisor(self) -> int:
        """Clock cycles per bit."""
        return self._divisor

    @property
    def latency(self) -> int:
        """Cycles from the start bit's falling edge to the byte offered on ``o``."""
        return 2 + self._divisor // 2 + 9 * self._divisor + 1

    def elaborate(self, platform):
        m = Module()
        d = self._divisor
        sync1 = Signal(init=1)
        line = Signal(init=1)                            # synchronised rx
        m.d.sync += [sync1.eq(self.rx), line.eq(sync1)]

        timer = Signal(range(d))                         # cycles to the next sample
        bit = Signal(range(9))                           # data bits sampled so far
        shreg = Signal(8)
        armed = Signal(init=1)                           # line seen high since the last error
        valid = Signal()
        byte = Signal(8)
        m.d.comb += [self.o.valid.eq(valid), self.o.payload.eq(byte)]
        with m.If(self.o.ready):
            m.d.sync += valid.eq(0)

        def bump(counter):
            with m.If(counter != (1 << COUNTER_BITS) - 1):
                m.d.sync += counter.eq(counter + 1)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(line):
                    m.d.sync += armed.eq(1)
                with m.Elif(armed):                      # falling edge: a start bit?
                    m.d.sync += timer.eq(d // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(line):                       # a glitch, not a start bit
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [timer.eq(d - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [timer.eq(d - 1), shreg.eq(Cat(shreg[1:], line)),
                                 bit.eq(bit + 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    with m.If(~line):                    # stop bit 0: framing error
                        bump(self.framing_errors)
                        m.d.sync += armed.eq(0)
                    with m.Elif(valid & ~self.o.ready):  # previous byte not taken
                        bump(self.overruns)
                    with m.Else():
                        m.d.sync += [valid.eq(1), byte.eq(shreg)]
                    m.next = "IDLE"
        return m


class UartTx(CheckedComponent):
    """UART transmitter, 8N1 (module docstring).

    Ports
    -----
    i : In, ``stream.Signature(8)``
        Bytes to send; a byte is taken only when the transmitter is idle (``ready``).
    tx : Out(1)
        The serial line, high when idle (also during reset).

    Latency
    -------
    :attr:`latency` = 1 cycle from a byte taken to its start bit on ``tx``; a character takes
    10 * ``divisor`` cycles and the next byte is taken in the last cycle of the stop bit, so
    back-to-back bytes leave no idle time.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (>= :data:`MIN_DIVISOR`).

    Raises
    ------
    ValueError
        ``divisor`` is not an integer >= 4.
    """

    @classmethod
    def check(cls, *, divisor):
        _check_divisor(divisor)

    def __init__(self, *, divisor: int):
        self._divisor = divisor
        super().__init__({
            "i": In(stream.Signature(8)),
            "tx": Out(1, init=1),
        })

    @property
    def divisor(self) -> int:
        """Clock cycles per bit."""
        return self._divisor

    @property
    def latency(self) -> int:
        """Cycles from a byte taken to the start of its start bit on ``tx``."""
        return 1

    def elaborate(self, platform):
        m = Module()
        d = self._divisor
        shreg = Signal(10, init=0x3FF)                   # stop, data (LSB first), start
        timer = Signal(range(d))
        left = Signal(range(11))                         # bits still to send
        m.d.comb += self.tx.eq(shreg[0])
        last = (left == 0) | ((left == 1) & (timer == 0))
        m.d.comb += self.i.ready.eq(last)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [shreg.eq(Cat(0, self.i.payload, 1)), left.eq(10), timer.eq(d - 1)]
        with m.Elif(left != 0):
            with m.If(timer != 0):
                m.d.sync += timer.eq(timer - 1)
            with m.Else():
                m.d.sync += [shreg.eq(Cat(shreg[1:], 1)), left.eq(left - 1), timer.eq(d - 1)]
        return m

"""The host driver of the FPGA prototype: runs PE programs on a board through its UART bridge.

The board (``elmoe3d.hw.board``: UART -> bridge -> load router + PE, with block-RAM stand-ins
for the HB bank and the EXT memory) speaks the wire protocol of :mod:`elmoe3d.sw.golden.bridge`
(``docs/fpga.md``, "Wire protocol" and "Host driver"). This module is plain Python; pyserial is
imported only by :meth:`FpgaBoard.open`.

* :func:`split_program` -- a program's encoded commands and its merged ``ld`` words (all
  sources, in LOAD order: what the die's load router forwards to the PE) split by each LOAD's
  ``src``: HOST words (HOST frames), HB words (written once into the HB stand-in at addresses
  the driver allocates, the LOAD's ``hb_addr`` rewritten to them), EXT words (written into the
  EXT stand-in, then streamed by one EXT_STREAM descriptor per LOAD, in LOAD order).
* :class:`FpgaBoard` -- the driver: ``hello()`` (INFO, checked against the configuration),
  ``run_program()`` (the stand-ins written first, then CMD / HOST / LINK / EXT_STREAM frames
  interleaved by the board's credits, stop-and-wait, POLL when nothing fits; OUT / LINK_O
  frames collected whenever they arrive).
* :class:`PipeTransport` -- an in-process byte pipe pair with the part of pyserial's ``Serial``
  API the driver uses, for tests and for the cocotb bench that serves the RTL board.
* :class:`StepClock` -- a logical clock for the driver (``clock=``): time advances only while
  the driver waits, one step at a time, the other end of the link taking its turn at each
  step; so timeouts, retransmissions and deadlines count steps, not the machine's seconds.

Errors: :class:`BoardError` (a :class:`~elmoe3d.errors.UserError`: the CLI prints one line)
when no board answers, the port cannot be opened or fails mid-run (I/O errors), the board is
another configuration, a frame's retries are all NAKed as line errors, a program does not fit
the stand-ins, :func:`run_host_fpga`'s program misses its deadline, or the protocol breaks (a
NAK SEQ / TYPE / ADDR, which are driver bugs; a lost or corrupt output frame, which is not
retransmitted).
"""

from __future__ import annotations

import re
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ...checks import is_int, is_real
from ...errors import UserError
from ...isa import Op, Source, decode, encode
from .pe_runs import PERunsResult
from ..golden.bridge import (ADDR_BYTES, CMD_BYTES, CREDIT_BYTES, EXT_STREAM_BYTES, VERSION,
                     Credits, Deframer, Frame, FrameError, Info, Reason, Type, encode_frame,
                     pack_words, unpack_words)


__all__ = ["BoardError", "PipeTransport", "StepClock", "ProgramSplit", "split_program",
           "FpgaBoard", "FpgaRun", "DEFAULT_BAUD", "DEFAULT_DEADLINE_S", "WIRE_MARGIN",
           "wire_bytes", "HostFPGAResult", "run_host_fpga"]

#: The UART rate of ``make fpga``'s bitstream unless told otherwise.
DEFAULT_BAUD = 1_000_000
#: Seconds a PE program may take on the board beyond :data:`WIRE_MARGIN` times its bytes' wire
#: time (:meth:`FpgaBoard.deadline`; ``elmoe3d run --deadline``).
DEFAULT_DEADLINE_S = 10.0
#: The wire time of a program's bytes is multiplied by this in its deadline: round trips,
#: POLLs and the PE's own time come on top of the bytes.
WIRE_MARGIN = 20
#: Bytes of a frame beside its payload: two flags, type, seq, CRC (stuffing not counted).
_FRAME_BYTES = 6


class BoardError(UserError):
    """The board cannot run the request: it does not answer, is another configuration, the
    program does not fit its stand-ins, the port failed, or the protocol broke. The message
    names the port and the frame or program."""


class _NoReply(BoardError):
    """No reply at all to a frame after the retries."""


# -- clocks and transport ----------------------------------------------------------------------

class StepClock:
    """A logical clock for :class:`FpgaBoard` and :class:`PipeTransport` (``clock=``): it
    reads ``waits x tick`` seconds and advances only when the driver waits (:meth:`wait`,
    :meth:`sleep`), one ``tick`` per wait, after calling ``serve()``: the other end of the
    link taking its turn (e.g. a model of the board reading what arrived and answering). The
    driver, the link and the board then run in one thread, and every reply timeout,
    retransmission, POLL pause and deadline of the driver is a count of turns: a run depends
    only on its inputs, never on the machine's speed or load (what the tests use; real use
    keeps ``time.monotonic``). ``tick``: seconds per wait (> 0)."""

    def __init__(self, serve=None, *, tick=0.001):
        if not (is_real(tick) and tick > 0):
            raise ValueError(f"tick: expected seconds > 0, got {tick!r}")
        self.serve = serve
        self.tick = float(tick)
        self.waits = 0

    def __call__(self) -> float:
        return self.waits * self.tick

    def wait(self) -> None:
        """One turn: ``serve()``, then the clock advances one tick."""
        if self.serve is not None:
            self.serve()
        self.waits += 1

    def sleep(self, seconds: float) -> None:
        """Wait until ``seconds`` have passed on this clock (at least one turn)."""
        end = self() + seconds
        self.wait()
        while self() < end:
            self.wait()


class _Pipe:
    """One direction: a byte buffer with a condition variable."""

    def __init__(self):
        self.buf = bytearray()
        self.cond = threading.Condition()
        self.closed = False


class PipeTransport:
    """One end of an in-process, thread-safe byte pipe pair, with the subset of pyserial's
    ``Serial`` the driver uses: :meth:`write`, :meth:`read` (blocks up to :attr:`timeout`
    seconds, returns fewer bytes on timeout), :attr:`in_waiting`, :meth:`reset_input_buffer`,
    :meth:`close`; and :meth:`read_nowait` (never blocks: for a cocotb coroutine serving the
    board end). Make a pair with :meth:`pair`.

    ``clock``: the time :meth:`read`'s timeout is measured in (``None``: ``time.monotonic``,
    wall-clock seconds). A clock with a ``wait()`` method is a *lockstep* clock (a
    simulator's, :class:`elmoe3d.sim.bench_board.LockstepClock`, or a :class:`StepClock`):
    :meth:`read` then never waits in wall-clock time but calls ``clock.wait()``, which
    returns once the clock has advanced, until the bytes are there or the timeout has passed
    on that clock. Another callable is polled every 5 ms of wall-clock time."""

    def __init__(self, rx: _Pipe, tx: _Pipe, *, timeout=None, name="pipe", clock=None):
        self._rx, self._tx = rx, tx
        self.timeout = timeout
        self.port = name
        self.is_open = True
        self.clock = clock

    @classmethod
    def pair(cls, timeout=None, clock=None) -> tuple:
        """``(host_end, board_end)``: bytes written to one are read from the other; ``clock``
        is the host end's (the board end is only read with :meth:`read_nowait` by a
        bench)."""
        a, b = _Pipe(), _Pipe()
        return (cls(a, b, timeout=timeout, name="pipe:host", clock=clock),
                cls(b, a, timeout=timeout, name="pipe:board"))

    def write(self, data) -> int:
        data = bytes(data)
        with self._tx.cond:
            if self._tx.closed or not self.is_open:
                raise OSError(f"{self.port}: write on a closed pipe")
            self._tx.buf += data
            self._tx.cond.notify_all()
        return len(data)

    def read(self, size=1) -> bytes:
        """Up to ``size`` bytes: returns when ``size`` bytes are there, or after
        :attr:`timeout` seconds (``None``: wait for ever) with what arrived."""
        clock = self.clock or time.monotonic
        end = None if self.timeout is None else clock() + self.timeout
        lockstep = hasattr(clock, "wait")
        while True:
            with self._rx.cond:
                if len(self._rx.buf) >= size or self._rx.closed:
                    break
                left = None if end is None else end - clock()
                if left is not None and left <= 0:
                    break
                if not lockstep:
                    self._rx.cond.wait(left if self.clock is None else
                                       (0.005 if left is None else min(left, 0.005)))
                    continue
            clock.wait()                 # outside the lock: the other end writes meanwhile
        with self._rx.cond:
            out = bytes(self._rx.buf[:size])
            del self._rx.buf[:size]
        return out

    def read_nowait(self, max_bytes=4096) -> bytes:
        """Whatever has arrived, at most ``max_bytes``; never blocks."""
        with self._rx.cond:
            out = bytes(self._rx.buf[:max_bytes])
            del self._rx.buf[:max_bytes]
        return out

    @property
    def in_waiting(self) -> int:
        with self._rx.cond:
            return len(self._rx.buf)

    def reset_input_buffer(self) -> None:
        with self._rx.cond:
            self._rx.buf.clear()

    def close(self) -> None:
        self.is_open = False
        for p in (self._rx, self._tx):
            with p.cond:
                p.closed = True
                p.cond.notify_all()


# -- program splitting -------------------------------------------------------------------------

@dataclass
class ProgramSplit:
    """A program split by LOAD source (:func:`split_program`).

    ``commands``: the encoded commands to send (HB LOADs' ``hb_addr`` rewritten to the
    stand-in); ``host``: HOST words in LOAD order; ``hb_writes`` / ``ext_writes``: ``[(addr,
    [words])]`` to write into the stand-ins first; ``ext_stream``: ``[(addr, words)]``
    descriptors in LOAD order; ``hb_used`` / ``ext_used``: stand-in words needed."""

    commands: list
    host: list
    hb_writes: list
    ext_writes: list
    ext_stream: list
    hb_used: int
    ext_used: int


def split_program(commands, ld, *, hb_words=None, ext_words=None, name="program") -> \
        ProgramSplit:
    """Split ``ld`` (all LOADs' words merged in LOAD order) by each LOAD's ``src``.

    HB and EXT words are placed in the stand-ins one LOAD after the other, a LOAD whose words
    equal an earlier one's (of the same source) sharing its place. Raises :class:`BoardError`
    naming ``name`` if the HB or EXT words needed exceed ``hb_words`` / ``ext_words`` (when
    given), ``ValueError`` if ``ld`` does not hold exactly the LOADs' words or a LOAD has an
    unknown ``src``."""
    ld = [int(w) for w in ld]
    out, host, ext_stream = [], [], []
    places = {Source.HB: {}, Source.EXT: {}}
    writes = {Source.HB: [], Source.EXT: []}
    used = {Source.HB: 0, Source.EXT: 0}
    pos = 0
    for i, word in enumerate(commands):
        op, f = decode(word)
        if op != Op.LOAD or f["words"] == 0:
            out.append(int(word))
            continue
        n = f["words"]
        chunk = ld[pos:pos + n]
        if len(chunk) < n:
            raise ValueError(f"{name}: ld has {len(ld)} words, but command {i} (LOAD) needs "
                             f"words {pos}..{pos + n - 1}")
        pos += n
        try:
            src = Source(f["src"])
        except ValueError:
            raise ValueError(f"{name}: command {i} (LOAD) has unknown src {f['src']}") from None
        if src == Source.HOST:
            host += chunk
            out.append(int(word))
            continue
        key = tuple(chunk)
        addr = places[src].get(key)
        if addr is None:
            addr = places[src][key] = used[src]
            used[src] += n
            writes[src].append((addr, chunk))
        if src == Source.HB:
            out.append(encode(Op.LOAD, **{**f, "hb_addr": addr}))
        else:
            out.append(int(word))
            ext_stream.append((addr, n))
    if pos != len(ld):
        raise ValueError(f"{name}: ld has {len(ld)} words, the LOADs take {pos}")
    for src, depth, what in ((Source.HB, hb_words, "HB"), (Source.EXT, ext_words, "EXT")):
        if depth is not None and used[src] > depth:
            raise BoardError(f"{name} needs {used[src]} {what} stand-in words; the board has "
                             f"{depth} (build it with a deeper {what.lower()}_words)")
    return ProgramSplit(commands=out, host=host, hb_writes=writes[Source.HB],
                        ext_writes=writes[Source.EXT], ext_stream=ext_stream,
                        hb_used=used[Source.HB], ext_used=used[Source.EXT])


def wire_bytes(split: ProgramSplit, n_link_i: int, n_o: int, n_link: int, *, word_bits: int,
               frame_words: int) -> int:
    """The bytes a program puts on the wire, both ways: the stand-in writes, CMD / HOST / LINK
    / EXT_STREAM frames at their largest (``frame_words`` words, as many commands as fit the
    staging buffer), one reply per frame, and the OUT / LINK_O frames of ``n_o`` beats and
    ``n_link`` words. POLLs, retransmissions and stuffing are not counted (the deadline's
    margin covers them)."""
    wb = word_bits // 8
    reply = _FRAME_BYTES + CREDIT_BYTES

    def frames(n, cap, entry, head=0):
        k = -(-n // cap) if n else 0
        return n * entry + k * (head + _FRAME_BYTES + reply)

    cmd_cap = max(1, frame_words * wb // CMD_BYTES)
    total = sum(frames(len(ws), frame_words, wb, ADDR_BYTES)
                for _, ws in split.hb_writes + split.ext_writes)
    total += frames(len(split.commands), cmd_cap, CMD_BYTES)
    total += frames(len(split.host), frame_words, wb) + frames(n_link_i, frame_words, wb)
    total += frames(len(split.ext_stream), 1, EXT_STREAM_BYTES)
    total += n_o * (1 + wb + _FRAME_BYTES) + n_link * (wb + _FRAME_BYTES)
    return total


# -- the driver --------------------------------------------------------------------------------

@dataclass
class FpgaRun:
    """One :meth:`FpgaBoard.run_program`: ``o`` beats ``[(kind, data)]`` and ``link_o`` words
    as received; ``frames`` sent (retransmissions and POLLs included), ``retransmissions``,
    ``polls``, ``naks`` (count per reason name), ``bytes_sent`` / ``bytes_received`` (wire
    bytes), ``seconds`` (on the driver's clock: wall-clock seconds in real use),
    ``deadline_s`` (the time the program was given:
    :meth:`FpgaBoard.deadline`), ``errors`` (e.g. the deadline passed before every output
    arrived)."""

    o: list
    link_o: list
    frames: int = 0
    retransmissions: int = 0
    polls: int = 0
    naks: dict = field(default_factory=dict)
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    deadline_s: float = 0.0
    errors: list = field(default_factory=list)


_NAMES = {t: t.name for t in Type}
#: Offset of a POLL's seq from the next data frame's, so that a late reply to a POLL is never
#: taken for the reply to a data frame.
_POLL_SEQ = 128


class FpgaBoard:
    """The driver of one board (module docstring; ``docs/fpga.md``, "Host driver").

    ``transport``: a pyserial ``Serial`` (or anything with its ``write`` / ``read`` /
    ``in_waiting`` / ``reset_input_buffer`` / ``close`` / ``timeout``, e.g.
    :class:`PipeTransport`). ``config``: the :class:`~elmoe3d.config.ArchConfig` or
    :class:`~elmoe3d.config.PEConfig` the programs were compiled for (checked against INFO;
    ``None``: not checked). ``timeout``: seconds to wait for each reply before retransmitting
    (plus twice the frame's time on the wire at ``baud``); ``retries``: retransmissions of one
    frame before :class:`BoardError`. ``port`` / ``baud``
    name the link in error messages. ``clock``: the time every timeout, pause and deadline is
    measured in (``None``: the transport's ``clock`` if it has one, e.g. a
    :class:`PipeTransport` made with one, else ``time.monotonic``, wall-clock seconds); a
    clock with ``wait()`` and ``sleep(seconds)`` methods (a lockstep clock: the bench's
    :class:`~elmoe3d.sim.bench_board.LockstepClock`, a :class:`StepClock`) is also what the
    driver pauses on, so a bench or a test runs it on simulated or counted time: then its
    timeouts, retransmissions and deadlines depend only on the simulation, not on the
    machine's load. A transport that does not wait on that clock itself (a serial port, not a
    :class:`PipeTransport` made with it) is never read while empty: the driver waits on the
    clock instead (the other end's turn) and reads what that brought.
    """

    def __init__(self, transport, *, config=None, timeout=0.5, retries=5, port=None,
                 baud=None, clock=None):
        if not (is_real(timeout) and timeout > 0):
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        if not is_int(retries, numpy=False) or retries < 0:
            raise ValueError(f"retries: expected an integer >= 0, got {retries!r}")
        self._t = transport
        clock = clock or getattr(transport, "clock", None)
        self._clock = clock or time.monotonic
        self._sleep = getattr(clock, "sleep", None) or time.sleep
        # a lockstep clock the transport does not wait on (a serial port): the driver does
        self._turn = clock.wait if hasattr(clock, "wait") and \
            getattr(transport, "clock", None) is not clock else None
        self.config = config
        self.timeout = float(timeout)
        self.retries = retries
        self.port = port or getattr(transport, "port", None) or "the serial port"
        self.baud = baud or getattr(transport, "baudrate", None)
        self._t.timeout = min(self.timeout, 0.02)
        self._deframer = Deframer()
        self._replies = deque()
        self._seq = 0
        self._out_seq = 0
        self._o, self._link_o = [], []
        self._corrupt = []
        self._accept_out = False
        self._wb = None
        self.info = None
        self.credits = None
        self._stats = FpgaRun(o=[], link_o=[])

    @classmethod
    def open(cls, port, *, baud=DEFAULT_BAUD, config=None, timeout=0.5, retries=5,
             clock=None) -> "FpgaBoard":
        """Open ``port`` with pyserial (``serial.serial_for_url``: a device path, a pty,
        ``loop://``, ``socket://host:port``...); a device path is opened exclusively (an
        advisory lock: a second ``elmoe3d run`` or driver on the same port fails here instead
        of interleaving frames). ``clock``: as :class:`FpgaBoard`'s. Raises
        :class:`BoardError` naming the port if it cannot be opened."""
        import serial
        kw = {} if "://" in str(port) else {"exclusive": True}
        try:
            ser = serial.serial_for_url(str(port), baudrate=int(baud), timeout=timeout, **kw)
        except (serial.SerialException, ValueError, OSError) as exc:
            # pyserial's message repeats the errno its text already has ("[Errno 2] could
            # not open port X: [Errno 2] No such file ..."): once is enough
            text = re.sub(r"^\[Errno \d+\] ", "", str(exc))
            raise BoardError(f"cannot open serial port {port}: {text}") from None
        return cls(ser, config=config, timeout=timeout, retries=retries, port=str(port),
                   baud=int(baud), clock=clock)

    def close(self) -> None:
        self._t.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- bytes in and out --
    def _io_error(self, exc) -> BoardError:
        return BoardError(f"{self.port}: serial I/O failed: {exc} (was the board unplugged or "
                          f"the port taken by another program?)")

    def _write(self, data: bytes) -> None:
        try:
            self._t.write(data)
        except OSError as exc:       # pyserial's SerialException is an OSError
            raise self._io_error(exc) from None
        self._stats.bytes_sent += len(data)

    def _pump(self, wait: float) -> None:
        """Read what arrives within ``wait`` seconds (at least one read slice) and dispatch
        it: outputs to the output lists, replies to the reply queue."""
        end = self._clock() + wait
        while True:
            try:
                n = self._t.in_waiting
                if not n and self._turn is not None:
                    self._turn()             # the other end's turn, the clock advances
                    n = self._t.in_waiting
                data = b""
                if n or self._turn is None:
                    data = self._t.read(n if n else 1)
                if data and not n:
                    more = self._t.in_waiting
                    if more:
                        data += self._t.read(more)
            except OSError as exc:   # pyserial's SerialException is an OSError
                raise self._io_error(exc) from None
            if data:
                self._stats.bytes_received += len(data)
                for item in self._deframer.feed(data):
                    self._dispatch(item)
                return
            if self._clock() >= end:
                return

    def _dispatch(self, item) -> None:
        if isinstance(item, FrameError):
            self._corrupt.append(f"a corrupt frame from the board ({item})")
            return
        if item.type in (Type.OUT, Type.LINK_O):
            if not self._accept_out:
                return      # left over from before this session's HELLO
            name = _NAMES[Type(item.type)]
            if item.seq != self._out_seq:
                raise BoardError(
                    f"{self.port}: output frame {name} carries output number {item.seq}, "
                    f"expected {self._out_seq}: "
                    f"{(item.seq - self._out_seq) % 256} output frame(s) lost"
                    + (f" ({self._corrupt[-1]})" if self._corrupt else "")
                    + "; outputs are not retransmitted")
            self._out_seq = (self._out_seq + 1) % 256
            wb = self._wb
            if item.type == Type.OUT:
                if len(item.payload) != 1 + wb:
                    raise BoardError(f"{self.port}: OUT frame {item.seq} has "
                                     f"{len(item.payload)} payload bytes, expected {1 + wb}")
                self._o.append((item.payload[0], unpack_words(item.payload[1:], wb * 8)[0]))
            else:
                if len(item.payload) != wb:
                    raise BoardError(f"{self.port}: LINK_O frame {item.seq} has "
                                     f"{len(item.payload)} payload bytes, expected {wb}")
                self._link_o.append(unpack_words(item.payload, wb * 8)[0])
            return
        if item.type == Type.INFO and not self._accept_out and item.seq == 0:
            # the reply to our HELLO: outputs from here on are numbered from 0
            try:
                self._wb = Info.unpack(item.payload).word_bits // 8
            except ValueError:
                pass
            else:
                self._accept_out = True
                self._out_seq = 0
        if item.type in (Type.ACK, Type.NAK, Type.INFO):
            self._replies.append(item)
        else:
            self._corrupt.append(f"a frame of unknown type 0x{item.type:02x} from the board")

    def _await_reply(self, seq, types, wait) -> Frame | None:
        end = self._clock() + wait
        while True:
            while self._replies:
                r = self._replies.popleft()
                if r.seq == seq and r.type in types:
                    return r
                if r.type == Type.NAK and Type.NAK in types and r.seq == 0xFF:
                    return r    # a framing error too early in a frame to know its seq: ours
                # else a late reply to an earlier frame (its ACK came after we retransmitted)
            left = end - self._clock()
            if left <= 0:
                return None
            self._pump(left)

    def _wait(self, nbytes) -> float:
        """Seconds to wait for the reply to a frame of ``nbytes`` wire bytes: the timeout plus
        twice the frame's time on the wire (10 bits a byte) when the baud rate is known."""
        return self.timeout + (20.0 * nbytes / self.baud if self.baud else 0.0)

    def _transact(self, type_, seq, payload, what, *, resend=False) -> tuple:
        """Send one frame and return ``(reply, copies)``: its reply (ACK, NAK BUSY or INFO)
        and how many times the frame went out. Retransmits the same bytes on a timeout or a
        NAK CRC / LENGTH; ``resend``: the first transmission is itself a retransmission (a
        frame sent before). Raises :class:`BoardError` after :attr:`retries`
        retransmissions (saying so if the board NAKed them as line errors), or on a NAK SEQ /
        TYPE / ADDR (a driver bug)."""
        frame = encode_frame(type_, seq, payload)
        want = (Type.INFO,) if type_ == Type.HELLO else (Type.ACK, Type.NAK)
        line_naks = {}
        for attempt in range(self.retries + 1):
            if attempt or resend:
                self._stats.retransmissions += 1
            self._write(frame)
            self._stats.frames += 1
            reply = self._await_reply(seq, want, self._wait(len(frame)))
            if reply is None:
                continue
            if reply.type == Type.INFO:
                return reply, attempt + 1
            if reply.type == Type.NAK:
                if len(reply.payload) != 9:
                    raise BoardError(f"{self.port}: NAK of {what} with {len(reply.payload)} "
                                     f"payload bytes, expected 9")
                reason = reply.payload[0]
                try:
                    rname = Reason(reason).name
                except ValueError:
                    rname = f"reason {reason}"
                self._stats.naks[rname] = self._stats.naks.get(rname, 0) + 1
                self.credits = Credits.unpack(reply.payload[1:])
                if reason in (Reason.CRC, Reason.LENGTH):
                    line_naks[rname] = line_naks.get(rname, 0) + 1
                    continue
                if reason == Reason.BUSY:
                    return reply, attempt + 1
                raise BoardError(f"{self.port}: the board NAKed {what} (seq {seq}) with "
                                 f"{rname}: a driver bug")
            if len(reply.payload) != 8:
                raise BoardError(f"{self.port}: ACK of {what} with {len(reply.payload)} "
                                 f"payload bytes, expected 8")
            self.credits = Credits.unpack(reply.payload)
            return reply, attempt + 1
        tries = self.retries + 1
        if line_naks:
            naks = " and ".join(f"{k} {v} times" for k, v in line_naks.items())
            raise BoardError(f"{self.port}: the board NAKed {what} (seq {seq}) with {naks} "
                             f"in {tries} tries: line errors? try a lower --baud (and a "
                             f"bitstream built for it)")
        raise _NoReply(f"{self.port}: no reply to {what} (seq {seq}) after {tries} tries of "
                       f"{self.timeout:g} s")

    # -- session --
    def hello(self) -> Info:
        """Start a session (HELLO seq 0: resets the board's sequence numbers and output
        counter, and is a soft reset of its PE side -- FIFOs emptied, PE, load router and
        stand-in readers reset, stand-in memories kept -- so a board a previous host left
        mid-program recovers) and return the board's :class:`~elmoe3d.sw.golden.bridge.Info`. Raises
        :class:`BoardError` if no board answers, if it speaks another protocol version, or if
        its rows / lanes / word_bits differ from :attr:`config`'s."""
        try:
            self._t.reset_input_buffer()
        except OSError as exc:
            raise self._io_error(exc) from None
        self._deframer = Deframer()
        self._replies.clear()
        self._accept_out = False
        try:
            reply, _ = self._transact(Type.HELLO, 0, b"", "HELLO")
        except _NoReply:
            total = self.timeout * (self.retries + 1)
            baud = f" at {self.baud} baud" if self.baud else ""
            built = f", and was its bitstream built for {self.baud} baud (--baud)" \
                if self.baud else ""
            raise BoardError(f"no board answered on {self.port} within {total:g} s{baud} (is "
                             f"the board programmed with `make fpga`, is {self.port} its "
                             f"UART{built}?)") from None
        try:
            info = Info.unpack(reply.payload)
        except ValueError as exc:
            raise BoardError(f"{self.port}: bad INFO from the board: {exc}") from None
        if info.version != VERSION:
            raise BoardError(f"{self.port}: the board speaks protocol version {info.version}; "
                             f"this driver speaks {VERSION}")
        if self.config is not None:
            from ...config import pe_config
            pe = pe_config(self.config)
            if (info.rows, info.lanes, info.word_bits) != (pe.rows, pe.lanes, pe.word_bits):
                raise BoardError(
                    f"the board on {self.port} has a {info.rows}x{info.lanes} tile with "
                    f"{info.word_bits}-bit words; the programs are compiled for a "
                    f"{pe.rows}x{pe.lanes} tile with {pe.word_bits}-bit words (build the "
                    f"board with the same --config)")
        self.info = info
        self.credits = info.credits
        self._seq = 1
        self._corrupt.clear()
        return info

    def _send(self, type_, payload, what, deadline=None) -> bool:
        """Send one data frame with the next seq; True if ACKed (seq advanced), False if
        NAKed BUSY (nothing applied).

        A BUSY is taken at its word only when the frame went out exactly once. Once it was
        retransmitted, the BUSY may answer an earlier copy while a later one was applied (its
        ACK still on the way): moving the seq to another stream's frame would let that stale
        ACK answer it. So the same bytes are resent (with a growing pause) until ACKed: the
        board ACKs a duplicate without applying it, or applies the frame once there is room.
        Raises :class:`BoardError` if ``deadline`` (on the driver's clock) passes meanwhile."""
        reply, copies = self._transact(type_, self._seq, payload, what)
        idle = 0.0005
        while reply.type == Type.NAK and copies > 1:
            if deadline is not None and self._clock() > deadline:
                raise BoardError(f"{self.port}: the board still answers BUSY to the "
                                 f"retransmitted {what} (seq {self._seq}) at the deadline "
                                 f"(the PE stopped taking its entries)")
            self._pump(idle)
            idle = min(idle * 2, 0.02)
            reply, more = self._transact(type_, self._seq, payload, what, resend=True)
            copies += more
        if reply.type == Type.NAK:
            return False
        self._seq = (self._seq + 1) % 256
        return True

    def poll(self) -> Credits:
        """POLL: the board's credits now (outputs that arrive meanwhile are collected)."""
        self._stats.polls += 1
        self._transact(Type.POLL, (self._seq + _POLL_SEQ) % 256, b"", "POLL")
        return self.credits

    def deadline(self, nbytes: int, base_s: float = DEFAULT_DEADLINE_S) -> float:
        """Seconds a program of ``nbytes`` wire bytes (:func:`wire_bytes`) is given:
        ``base_s + WIRE_MARGIN * nbytes * 10 / baud`` (10 bits a byte, 8N1), just ``base_s``
        when the baud rate is unknown (an in-process pipe)."""
        return base_s + (WIRE_MARGIN * nbytes * 10 / self.baud if self.baud else 0.0)

    def run_program(self, program_words, ld, link_i=(), *, n_o, n_link,
                    deadline_s=DEFAULT_DEADLINE_S, name="program") -> FpgaRun:
        """Run one PE program on the board (module docstring) and collect its outputs.

        ``program_words``: encoded commands (ints, :mod:`elmoe3d.isa`); ``ld``: every LOAD's
        words merged in LOAD order; ``link_i``: the words the PE's ``link_i`` receives;
        ``n_o`` / ``n_link``: the ``o`` beats and ``link_o`` words to wait for. Returns an
        :class:`FpgaRun`; if its deadline (:meth:`deadline` of the program's
        :func:`wire_bytes`, ``deadline_s`` the base) passes first, its ``errors`` say what
        was missing. Raises :class:`BoardError` (module docstring), ``ValueError`` naming
        ``deadline_s`` if it is negative."""
        if not (is_real(deadline_s) and deadline_s >= 0):
            raise ValueError(f"deadline_s: expected seconds >= 0, got {deadline_s!r}")
        start = self._clock()
        if self.info is None:
            self.hello()
        info = self.info
        wb = info.word_bits
        split = split_program(program_words, ld, hb_words=info.hb_words,
                              ext_words=info.ext_words, name=name)
        link_i = [int(w) for w in link_i]
        budget = self.deadline(wire_bytes(split, len(link_i), n_o, n_link, word_bits=wb,
                                          frame_words=info.frame_words), deadline_s)
        deadline = start + budget
        self._stats = FpgaRun(o=[], link_o=[], deadline_s=budget)
        self._o, self._link_o = [], []
        self._corrupt.clear()
        fw = info.frame_words
        for type_, writes in ((Type.HB_WRITE, split.hb_writes),
                              (Type.EXT_WRITE, split.ext_writes)):
            for addr, words in writes:
                for k in range(0, len(words), fw):
                    part = words[k:k + fw]
                    payload = struct.pack("<I", addr + k) + pack_words(part, wb)
                    if not self._send(type_, payload, f"{_NAMES[type_]} of {name} words "
                                      f"{addr + k}..{addr + k + len(part) - 1}", deadline):
                        raise BoardError(f"{self.port}: the board NAKed a "
                                         f"{_NAMES[type_]} with BUSY")
        cmd_cap = max(1, fw * (wb // 8) // CMD_BYTES)
        streams = [  # (type, items, frame cap, credit field, packer)
            (Type.CMD, split.commands, cmd_cap, "cmd",
             lambda xs: b"".join(int(c).to_bytes(CMD_BYTES, "little") for c in xs)),
            (Type.HOST, split.host, fw, "host", lambda xs: pack_words(xs, wb)),
            (Type.LINK, link_i, fw, "link", lambda xs: pack_words(xs, wb)),
            (Type.EXT_STREAM, split.ext_stream, 1, "ext",
             lambda xs: struct.pack("<II", *xs[0])),
        ]
        sent = [0] * len(streams)
        turn = 0
        idle = 0.0005
        errors = []
        while any(s < len(st[1]) for s, st in zip(sent, streams)):
            if self._clock() > deadline:
                errors.append("deadline passed with " + ", ".join(
                    f"{len(st[1]) - s} {_NAMES[st[0]]} entries unsent"
                    for s, st in zip(sent, streams) if s < len(st[1]))
                    + " (the PE stopped taking them)")
                break
            for k in range(len(streams)):
                i = (turn + k) % len(streams)
                type_, items, cap, credit, pack = streams[i]
                room = getattr(self.credits, credit)
                if sent[i] < len(items) and room > 0:
                    n = min(len(items) - sent[i], room, cap)
                    part = items[sent[i]:sent[i] + n]
                    if self._send(type_, pack(part), f"{_NAMES[type_]} of {name} entries "
                                  f"{sent[i]}..{sent[i] + n - 1}", deadline):
                        sent[i] += n
                    turn = i + 1
                    idle = 0.0005
                    break
            else:
                before = self.credits
                self.poll()
                if self.credits == before:
                    self._sleep(idle)
                    idle = min(idle * 2, 0.02)
        while not errors and (len(self._o) < n_o or len(self._link_o) < n_link):
            left = deadline - self._clock()
            if left <= 0:
                errors.append(f"deadline passed with {len(self._o)} of {n_o} o beats and "
                              f"{len(self._link_o)} of {n_link} link_o words")
                break
            self._pump(min(left, self.timeout))
        if not errors:
            self.poll()   # outputs the board sent before this reply are in
        if self._corrupt and (len(self._o) != n_o or len(self._link_o) != n_link):
            raise BoardError(f"{self.port}: {name}: {self._corrupt[-1]}; "
                             f"{len(self._o)} of {n_o} o beats and {len(self._link_o)} of "
                             f"{n_link} link_o words arrived (outputs are not retransmitted)")
        run = self._stats
        run.o, run.link_o = list(self._o), list(self._link_o)
        run.errors = errors
        run.seconds = self._clock() - start
        return run


# -- the PE runs of `elmoe3d run --backend fpga` (elmoe3d.sw.host.backends.fpga) ---------------

@dataclass
class HostFPGAResult(PERunsResult):
    """``records``: one per PE run (case name and key, the comparison with the functional
    simulation, the STATUS beat's ``cycles`` (board clock cycles, the PE waiting on the UART
    included), the link figures of :class:`FpgaRun`); ``layers``: per layer-step ``{"step",
    "layer", "cycles", "compared", "mismatches", "details"}`` with the FP32 comparison with
    ref_moe (:func:`elmoe3d.sw.host.pe_runs.check_layers`); ``info``: the board's INFO.
    ``mismatches`` / ``compared``: :class:`~elmoe3d.sw.host.pe_runs.PERunsResult`."""

    info: Info

    def totals(self) -> dict:
        """Link figures over every run: frames, retransmissions, polls, NAKs per reason,
        bytes each way, seconds, PE cycles."""
        naks = {}
        for r in self.records:
            for k, v in r["naks"].items():
                naks[k] = naks.get(k, 0) + v
        tot = {k: sum(r[k] for r in self.records) for k in
               ("frames", "retransmissions", "polls", "bytes_sent", "bytes_received",
                "seconds", "cycles")}
        tot["naks"] = naks
        tot["pe_runs"] = len(self.records)
        return tot


def run_host_fpga(golden_layers, arch, board: FpgaBoard, *, deadline_s=DEFAULT_DEADLINE_S,
                  progress=None) -> HostFPGAResult:
    """Run every PE program of ``golden_layers`` (:func:`~elmoe3d.sw.host.backends.run_golden`
    with ``keep=True``) on ``board``, one after the other, each with its ``ld`` and
    ``link_i`` words (:func:`~elmoe3d.sw.host.pe_runs.pe_cases`), and check them like the RTL
    backend: every ``o`` beat and ``link_o`` word against the functional simulation, then
    every group's FP32 output and flags against ref_moe, bit for bit. ``deadline_s``: the
    base of each program's deadline (:meth:`FpgaBoard.deadline`). ``progress(case)`` is
    called after each run.

    Raises :class:`BoardError` (see :class:`FpgaBoard`), and at the first run that misses its
    deadline (the board stopped taking entries or sending outputs: every later run would
    wait out its deadline too), naming the case."""
    from ..golden.asm import OKind
    from .pe_runs import case_ints, check_layers, compare_run, hex_str, pe_cases
    if board.info is None:
        board.hello()
    records = []
    cases = pe_cases(golden_layers)
    for done, case in enumerate(cases):
        c = case_ints(case)
        run = board.run_program(c["program"], c["ld"], c["link_i"], n_o=len(c["o"]),
                                n_link=len(c["link_o"]), deadline_s=deadline_s,
                                name=case["name"])
        if run.errors:
            raise BoardError(
                f"{board.port}: {case['name']}: {'; '.join(run.errors)} within its "
                f"{run.deadline_s:.1f} s; stopped there, {len(cases) - done - 1} later PE "
                f"run(s) not tried (reset the board, or allow more with --deadline)")
        cmp_ = compare_run(run.o, run.link_o, c["o"], c["link_o"])
        status = cmp_["status"]
        records.append({
            "case": case["name"], "key": case["key"], "cycles": int(status.get("cycles", 0)),
            "acc_overflow": bool(status.get("acc_overflow")),
            "vpu_saturation": bool(status.get("vpu_saturation")),
            "comparisons": cmp_["comparisons"], "mismatches": cmp_["mismatches"],
            "details": cmp_["details"][:8],
            "o_data": [hex_str(d) for k, d in run.o if k == OKind.DATA],
            "frames": run.frames, "retransmissions": run.retransmissions, "polls": run.polls,
            "naks": dict(run.naks), "bytes_sent": run.bytes_sent,
            "bytes_received": run.bytes_received, "seconds": run.seconds})
        if progress:
            progress(case)
    by_key = {tuple(r["key"]): r for r in records}
    return HostFPGAResult(records=records, layers=check_layers(golden_layers, by_key, arch.pe),
                          info=board.info)

"""Cycle model of PE programs: the three engines of ``docs/pe.md`` ("Engines and
synchronisation") at command granularity, for the performance model (issue 24 item 5: per
GEMM, per expert, fill and drain included).

:func:`program_cycles` runs an :class:`~elmoe3d.sw.golden.asm.Program` through a model of the
PE's command decoder, load engine, execute engine (with the tensor tile and the result stage
behind it) and requantization engine, in program order, and returns a
:class:`CycleEstimate`: the cycles from the first command taken to the last ``o`` beat taken
(both counted, as the benches measure them), the busy cycles of each engine and a
:class:`CommandCycles` per command. Every constant is a property of
:class:`~elmoe3d.config.PEOptions` derived from the RTL's structure (``tile_latency``,
``result_cycles`` and the row cycles of the sinks, ``completion_cycles``, the decoder and
start latencies, REQUANT's row preparation, OUTPUT's converters ...); nothing here is a cycle
count of its own. The ``ld`` stream is paced at ``ld_rate`` words per cycle by the token bucket
of the benches (:func:`elmoe3d.sim.cocotb_streams.offer`: it gains ``ld_rate`` words a cycle and
holds at most two), so a PE that stalls its loads cannot bank bandwidth.

What is modelled, per command (``docs/pe.md`` for the rules):

* the decoder takes a command a cycle, in order: a LOAD into a queue of ``load_queue_depth``
  (also while a BARRIER, ``CLEAR counters`` or STATUS waits: the LOAD takes no word before
  the second cycle after it starts, the load engine registering its hold), a REQUANT when
  the requantization engine is free, any other command into the one-command register in
  front of the execute engine (free once the engine took the one before, which it does in
  the cycle the command before finishes);
* the load engine runs the LOADs in order, a word a cycle at most (P cycles a word into a
  memory stored in P parts), each word when the bucket offers it; a word of a WMEM LOAD
  waits while the flag of its buffer half is set (``PEConfig.wmem_low_words``: until the
  cycle after the releasing GEMM's last read of that half), a signalling LOAD for both
  halves, a fenced LOAD until the cycle after every earlier execute command (REQUANT
  included) has completed (the engine registers its fence); ``signal`` sets the flags the
  cycle after the last word;
* the execute engine: a GEMM waits for ``full[wbuf]`` (``wait``), for an earlier REQUANT
  (``rq_wait``) and for a free sink descriptor slot (not with ``acc_hold``), then issues a
  beat every ``beat_cycles``; the next GEMM, if decoded and ready in the cycle of the last
  read, follows with no idle cycle (``gemm_gap``), else it is taken in that cycle and starts
  when ready, its first beat two cycles later; each result leaves
  the tile ``tile_latency`` cycles after its last beat, straight into the result register if
  that is free, else into the skid register, which hands it on in the cycle the result
  register frees, and the sink
  (:class:`_ResultStage`: SWIGLU rows held in stage A for their sub-steps, COMBINE rows
  through stage C, RAW its link words as the link takes them, ``psum_in`` rows behind their
  link words); a sink slower than the tile stalls the tile and the issue once the skid
  register holds a result (the tile takes the next from the cycle after the skid register
  emptied), its whole pipeline, the next GEMM's beats included (a result offered after its
  GEMM's last beat delays the next GEMM's beats); a GEMM is complete ``sink_done_cycles``
  after its last row left stage A (a held GEMM of a K chain once its last beat entered the
  tile); OUTPUT, CLEAR, SEND, RECV, BARRIER and STATUS wait until
  every earlier GEMM has left the tile and the sinks (``sink_idle_cycles``) and every
  earlier REQUANT is done, then run at their beat rates; OUTPUT with
  ``PEOptions.output_early`` (two OUT banks) only until the tile, the result stage and the
  SWIGLU sink are idle, each of its pair reads waiting for the COMBINE writes to its words
  (:attr:`_ResultStage.writes`) and for stage C's last sub-step;
* the requantization engine starts a REQUANT the cycle after every earlier execute command
  has completed and streams its rows, ``channels / requant_units`` cycles a row, at least
  ``requant_row_cycles`` (the next row's exponent is prepared meanwhile), its ``pad_rows``
  none.

The link (``link_rate``: ``L = ceil(1 / link_rate)`` flits a word, one a cycle): a SEND's or
a RAW result's words stay on ``link_o`` until the link has taken their last flit (``L``
cycles a word at the earliest; a SEND reads its next word only then, a RAW result's next word
goes on the cycle after); the ``link_i`` words (RECV and ``psum_in`` alike, in order) are
taken as the PE asks for them (a RECV a word a cycle, a ``psum_in`` result's word ``w`` from
``w + 1`` cycles after the register took the result), at most one a cycle, each no earlier than
``L`` cycles after the one before (the first at once): a PE alone on a link that delivers a
word every ``L`` cycles, which the live tests give the RTL PE. In a group the link's own timing
replaces that rule: :func:`group_cycles` runs every PE of a group with the cycles its
``link_i`` words arrive (``link_i_at``) and its ``link_o`` words' flits are taken
(``link_o_held``) from a flit-level model of the aggregation link's descriptors, equal to the
RTL group's cycles on the live tests.

What is not modelled: idle cycles on ``cmd``, backpressure on ``o``, memory write-port
conflicts (REQUANT's ACT writes yield to a LOAD into ACT; the model lets both run) and the
COMBINE sink's read-after-write stall (two rows into the same OUT granules within the combine
pipeline). The COMBINE sink's zero-gate skip (a padding row, gate
weight 0, skips stage C and the units, so a result whose last rows are padding drains sooner)
is modelled when the program's ``ld`` words are given (:func:`program_cycles` ``ld=``: the model
mirrors what the LOADs put in TOK); a TOK word it does not know (never loaded, or written by a
RECV) counts as live, as does every row without them. ``docs/pe.md`` "Cycle model" has the
error against the RTL per bench case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from ...config import LINK_OP_LATENCY, PEOptions, link_reduce_stages
from ...isa import Op, Sink, Target
from ..golden.agg_link import LinkMode
from ..golden.asm import TOK_DTYPE
from ..golden.datapath import Mode


__all__ = ["CommandCycles", "CycleEstimate", "program_cycles", "group_cycles", "LdBucket"]


#: Targets of a LOAD that live in the WMEM buffers (``full[buf]`` applies).
WMEM_TARGETS = (Target.WMSB, Target.WLSB, Target.WSCALE)
#: Ops the execute engine runs after draining (every earlier GEMM and REQUANT done).
DRAIN_OPS = (Op.OUTPUT, Op.CLEAR, Op.STATUS, Op.SEND, Op.RECV, Op.BARRIER)


@dataclass(frozen=True)
class CommandCycles:
    """Timing of one command in the model (cycles from the first command taken, cycle 0).

    Attributes
    ----------
    index : int
        Position in the program.
    op : str
        The op's name.
    engine : str
        ``"load"``, ``"execute"``, ``"requant"`` or ``"decoder"`` (NOP).
    decoded : int
        The cycle the decoder takes it.
    start, end : int
        First and last cycle of its work: LOAD its first and last ``ld`` word, GEMM its first
        and last tile beat, REQUANT from its start (every earlier execute command complete)
        to its last cycle busy, OUTPUT / STATUS their first and last ``o`` beat, the others
        their state in the execute engine. A command without work (a LOAD of no words, an
        empty GEMM) has ``end = start - 1``.
    done : int
        The first cycle the PE counts it as complete (a fence, a REQUANT or a drain waiting
        for it may go on): a LOAD's last word + 1, a GEMM's last result written, REQUANT busy
        low, the others back in the execute engine's IDLE.
    waited : int
        Cycles it waited for its inputs once its engine could take it (a buffer flag, a fence,
        REQUANT, a descriptor slot, the drain): where the time of a program goes.
    """

    index: int
    op: str
    engine: str
    decoded: int
    start: int
    end: int
    done: int
    waited: int = 0


@dataclass
class CycleEstimate:
    """What :func:`program_cycles` found.

    Attributes
    ----------
    cycles : int
        From the cycle the first command is taken to the cycle the last ``o`` beat is taken,
        both counted (the benches' figure); without ``o`` beats, to the last cycle any engine
        works.
    busy : dict
        Busy cycles per engine: ``load`` (cycles an ``ld`` word is taken), ``execute`` (tile
        beats plus the cycles of the execute engine's other commands), ``requant`` (REQUANT
        from start to done), ``tile`` (tile beats).
    commands : list of CommandCycles
        One per command, in program order.
    ld_words, beats, o_beats : int
        ``ld`` words, tile beats and ``o`` beats of the program.
    options : PEOptions
    ld_rate : float
    link_o_offered, link_o_at : tuple of int
        Per ``link_o`` word (SEND and RAW words, in order), the cycle it is first offered and
        the cycle the link takes it (its last flit).
    link_i_taken : tuple of int
        Per ``link_i`` word (RECV and ``psum_in``, in order), the cycle the PE takes it.
    """

    cycles: int
    busy: dict
    commands: list
    ld_words: int
    beats: int
    o_beats: int
    options: PEOptions = field(repr=False)
    ld_rate: float = 1.0
    link_o_offered: tuple = field(default=(), repr=False)
    link_o_at: tuple = field(default=(), repr=False)
    link_i_taken: tuple = field(default=(), repr=False)

    @property
    def memory_cycles(self) -> float:
        """``ld_words / ld_rate``: the program's cycles if the ``ld`` stream were the only
        limit."""
        return self.ld_words / self.ld_rate

    @property
    def bound(self) -> str:
        """``"memory"`` if the ``ld`` words take longer at ``ld_rate`` than the tile beats,
        else ``"compute"``."""
        return "memory" if self.memory_cycles >= self.beats else "compute"

    def _beats_span(self):
        gemms = [c for c in self.commands if c.op == "GEMM" and c.end >= c.start]
        if not gemms:
            return None
        return min(c.start for c in gemms), max(c.end for c in gemms)

    @property
    def fill_cycles(self) -> int:
        """Cycles before the first tile beat (the pipeline fill: the first buffer-full's
        loads and the GEMM's start); :attr:`cycles` if the program has no beats."""
        span = self._beats_span()
        return self.cycles if span is None else span[0]

    @property
    def drain_cycles(self) -> int:
        """Cycles after the last tile beat (the drain: the last results through the sinks,
        OUTPUT, STATUS); 0 if the program has no beats."""
        span = self._beats_span()
        return 0 if span is None else self.cycles - 1 - span[1]

    @property
    def tail_cycles(self) -> int:
        """Cycles after the last ``ld`` word (the work that follows the program's last
        weight or activation word: the last GEMMs' beats, the drain, the reductions,
        OUTPUT, STATUS); what a PE whose ``ld`` stream is the bound adds after the stream
        (run at a low ``ld_rate`` for that). :attr:`cycles` if the program loads nothing."""
        ends = [c.end for c in self.commands if c.op == "LOAD" and c.end >= c.start]
        return self.cycles if not ends else self.cycles - 1 - max(ends)

    def by_op(self) -> dict:
        """``{op: (commands, work cycles, waited cycles)}`` summed over the commands."""
        out = {}
        for c in self.commands:
            n, work, waited = out.get(c.op, (0, 0, 0))
            out[c.op] = (n + 1, work + max(0, c.end - c.start + 1), waited + c.waited)
        return out


class LdBucket:
    """The ``ld`` stream of the benches: a token bucket that gains ``rate`` words a cycle and
    holds at most two (:func:`elmoe3d.sim.cocotb_streams.offer`); a word is offered once the
    bucket holds one and stays offered until taken. Exact (rational) arithmetic.

    ``take(n, ready, per_word)`` takes the next ``n`` words with the PE ready from cycle
    ``ready`` on (a word every ``per_word`` cycles at most); returns ``(first, last)``."""

    CAP = 2

    def __init__(self, rate):
        rate = Fraction(rate).limit_denominator(1 << 20)
        if not 0 < rate:
            raise ValueError(f"ld_rate: expected a positive number of words per cycle, got "
                             f"{float(rate)!r}")
        self.rate = min(rate, Fraction(1))
        self.last = -1               # the cycle the last word was taken
        self.credit = Fraction(1)    # credit after it (word 0 is offered in cycle 0)

    def _credit_at(self, t):
        """Credit at the start of cycle ``t`` > ``last`` (before a take in ``t``)."""
        return min(Fraction(self.CAP), self.credit + self.rate * (t - self.last - 1))

    def _offered(self):
        """The first cycle the next word is offered."""
        need = 1 - self.credit
        wait = 0 if need <= 0 else math.ceil(need / self.rate)
        return self.last + 1 + wait

    def take(self, n, ready, per_word=1):
        if n <= 0:
            return ready, ready - 1
        r = self.rate
        if per_word > 1:
            # a word into a memory in P parts: offered, then P cycles of writes (the word
            # taken with its last part); word by word
            first = None
            t = ready
            for _ in range(n):
                t0 = max(t, self._offered())
                t_take = t0 + per_word - 1
                c = self._credit_at(t0) + r * (t_take - t0)
                self.credit = min(Fraction(self.CAP), c + r - 1)
                self.last = t_take
                first = t_take if first is None else first
                t = t_take + 1
            return first, self.last
        t0 = max(ready, self._offered())
        c0 = min(Fraction(self.CAP), self._credit_at(t0) + r - 1)      # after the first take
        if n == 1:
            self.last, self.credit = t0, c0
            return t0, t0
        j = n - 1
        t_last = t0 + max(j, 1 + math.ceil((j - c0) / r))
        self.credit = c0 + r * (t_last - t0) - j
        self.last = t_last
        return t0, t_last


def _stalled(cycle, stalls):
    """The cycle an issue event ``cycle`` cycles into an unstalled GEMM happens with the tile
    stalls ``stalls`` (``(offered, cycles)`` in order: the tile frozen ``cycles`` cycles from
    ``offered``, a result it could not hand over)."""
    for offered, cycles in stalls:
        if offered <= cycle:
            cycle += cycles
    return cycle


class _LinkIn:
    """The PE's ``link_i`` words in order (RECV and ``psum_in`` alike): each taken in the
    first cycle the PE asks for it (``earliest``), at most one a cycle, and no earlier than
    its arrival: ``at[j]`` for word ``j`` where the arrivals are given (:func:`group_cycles`),
    else ``cycles`` after the previous one was taken (the link delivering a word every ``L``
    cycles, the first at once)."""

    def __init__(self, cycles, at=None):
        self.cycles, self.at = cycles, at
        self.taken = []          # the cycle each word was taken
        self.next = 0            # the next word may be taken from

    def take(self, earliest) -> int:
        t = max(earliest, self.next)
        if self.at is not None:
            if len(self.taken) >= len(self.at):
                raise ValueError(f"link_i_at: {len(self.at)} arrival cycles, but the program "
                                 f"takes more link_i words")
            t = max(t, self.at[len(self.taken)])
            self.next = t + 1
        else:
            self.next = t + self.cycles
        self.taken.append(t)
        return t


class _LinkOut:
    """The PE's ``link_o`` words in order (SEND and RAW alike): a word offered in cycle
    ``offer`` is taken with its last flit, ``cycles - 1`` cycles later at the earliest (the
    link pulls a flit a cycle) and no earlier than ``held[j]`` for word ``j`` where the link's
    takes are given (:func:`group_cycles`: the link pulls a source's flits only while its
    descriptor runs and its flit buffer has room)."""

    def __init__(self, cycles, held=None):
        self.cycles, self.held = cycles, held
        self.offered, self.taken = [], []

    def put(self, offer) -> int:
        t = offer + self.cycles - 1
        if self.held is not None and len(self.taken) < len(self.held):
            t = max(t, self.held[len(self.taken)])
        self.offered.append(offer)
        self.taken.append(t)
        return t


class _ResultStage:
    """The result register and the sinks behind it (``hw/pe/result.py``, ``swiglu.py``,
    ``combine.py``), a result at a time: the register takes a tile result in cycle ``T`` (the
    cycle its previous result's last row or word leaves: ``free``) and feeds its rows, a
    cycle each, into stage A; the SWIGLU sink keeps a row in stage A for its ``n`` sub-steps;
    the COMBINE sink passes it on to stage C, which keeps it ``n`` sub-steps (so A holds the
    next row meanwhile); RAW sends its link words as the link takes them; with ``psum_in`` a
    row (a word) waits for the ``link_i`` word it needs."""

    def __init__(self, options: PEOptions):
        self.o = options
        self.free = 0            # the register takes the next result from
        self.accept = 0          # the skid register takes the next tile result from
        self.a_free = 0          # stage A takes the next row from
        self.c_free = 0          # stage C (COMBINE) issues the next row from
        self.x = 0               # the last row left stage A (last link word sent, RAW)
        self.tail = 0            # COMBINE: the sink (stage A, stage C, the units) idle from
        self.last_dead = False   # COMBINE: the last row (leaving stage A at x) was skipped
        self.c_port = 0          # COMBINE: stage C needs the OUT read port's data until
        self.writes = {}         # COMBINE: OUT word -> the cycle of its last write
        self.any_write = -1      # COMBINE: the last write of a row whose OUT word is unknown
        self.link_in = None      # link_i words (psum_in, RECV): the model's _LinkIn
        self.link_out = None     # link_o words (RAW, SEND): the model's _LinkOut

    def take(self, O, sink, psum_in, full, live=None, words=None):
        """The tile offers a result in cycle ``O``; returns ``(A, T)``: the cycle the tile
        hands it over (``O``, or the cycle after the skid register emptied) and the cycle
        the result register takes it (``A``, or when its previous result has left).
        Afterwards :attr:`x` is the cycle its last row leaves stage A (RAW: its last link
        word) and :attr:`free` the cycle the register can take the next result. ``live``
        (COMBINE): per row, whether its gate weight is nonzero (a zero-gate row adds exactly 0
        and the sink skips it: it leaves stage A without entering stage C); default all.
        ``words`` (COMBINE): per row, the OUT word it writes (None: not known), for
        :attr:`writes` (OUTPUT's reads wait for the writes to their words)."""
        o = self.o
        hop = o.sink_feed_cycles
        R = o.rows
        A = max(O, self.accept)
        T = max(A, self.free)
        self.accept = T + 1
        if sink is Sink.RAW:
            words = o.sink_result_cycles(Sink.RAW, False)
            # each word stays on link_o until the link has taken its last flit; with psum_in
            # it goes out once its link_i word (taken from T + hop + w) has been added
            last = T                   # (the previous word's last flit)
            for w in range(words):
                offer = max(T + hop, last + 1)
                if psum_in:
                    offer = max(offer, self.link_in.take(T + hop + w) + hop)
                last = self.link_out.put(offer)
            self.free = self.x = last
            return A, T
        n = o.sink_row_cycles(sink, full)
        per_word = o.psum_rows_per_word
        if psum_in:        # word w taken from T + hop + w, as the link brings it
            takes = [self.link_in.take(T + hop + w) for w in range(-(-R // per_word))]

        def avail(k):                               # row k may enter stage A from
            a = T + hop
            if psum_in:                             # its link_i word added
                a = max(a, takes[k // per_word] + hop)
            return a
        if sink is Sink.SWIGLU:
            u = max(avail(0), self.a_free)
            for k in range(1, R):
                u = max(u + n, avail(k))
            self.free = u                           # the last row taken into A
            self.x = self.a_free = u + n            # leaves A with its last sub-step
            return A, T
        # COMBINE: row k into A at u_k, issued into C at c_k (C busy n cycles per row); a
        # zero-gate row leaves A when it could have issued, C untouched
        c_free = self.c_free
        idle = o.sink_idle_cycles(Sink.COMBINE, full)
        u = leave = None
        tail = self.tail
        for k in range(R):
            u = max(avail(k), self.a_free if k == 0 else leave)
            self.last_dead = not (live is None or live[k])
            if live is None or live[k]:
                leave = max(u + hop, c_free)
                c_free = leave + n
                tail = max(tail, leave + idle)          # through stage C and the units
                # stage C holds it n cycles from leave + 1, its sub-steps taking their OUT
                # values from the read port's data (another read may come in the last); the
                # last sub-step's write
                self.c_port = max(self.c_port, leave + n)
                written = leave + n + o.combine_latency
                word = None if words is None else words[k]
                if word is None:
                    self.any_write = max(self.any_write, written)
                else:
                    self.writes[word] = max(self.writes.get(word, -1), written)
            else:
                leave = u + hop
                tail = max(tail, leave + 1)             # stage A empties behind it
        self.tail = tail
        self.free = u
        self.x = self.a_free = leave
        self.c_free = c_free
        return A, T

    def period(self, sink, psum_in, full):
        """Cycles a result holds the sink in a steady stream (its throughput), or None where
        the link's words pace it (RAW, ``psum_in``): those results are followed one by one
        (each link word's cycle is kept, and the link may bring or take them below a word
        a cycle)."""
        if Sink(sink) is Sink.RAW or psum_in:
            return None
        return self.o.sink_result_cycles(sink, psum_in, full)


class _Model:
    def __init__(self, options: PEOptions, ld_rate, link_rate, ld=None, link_i_at=None,
                 link_o_held=None):
        self.o = options
        # the ld words, to mirror TOK (the COMBINE sink's zero-gate skip); None: not modelled
        self.ld, self.ld_pos, self.tok = ld, 0, {}
        self.bucket = LdBucket(ld_rate)
        self.link_rate = None if link_rate is None else float(link_rate)
        self.cmds = []
        # decoder
        self.t_dec = -1                 # the last command's decode cycle
        self.load_accepts = []          # cycle each LOAD left the decoder's queue
        self.load_hold = 0              # LOADs take no word before (a BARRIER started)
        self.x_take_prev = 0            # the previous execute command left the register
        # load engine
        self.ld_finish = -1             # cycle of the last LOAD's finish (its last word)
        # per buffer: ("set", cycle) or ("clear", cycle, cycle its lower half is free, cycle
        # its upper half is free)
        self.flag = [None, None]
        # execute engine
        self.ex_idle = 0                # first cycle the engine can take the next command
        self.run = None                 # the GEMM issuing: dict(F (last read), wbuf, release)
        self.tile_next = 0              # first cycle the next beat can enter the tile
        self.tile_stalls = []           # results of earlier GEMMs that freeze the tile after
        #                                 their last beat: (offered, cycles)
        self.results = _ResultStage(options)
        self.results.link_in = _LinkIn(self._link_cycles(), link_i_at)
        self.results.link_out = _LinkOut(self._link_cycles(), link_o_held)
        self.dq_free = 0                # the sink's pending descriptor slot is free from
        self.last_result = None         # the cycle the last GEMM's last result left the tile
        self.gemm_quiet = 0             # every GEMM so far has left the tile and the sinks
        self.out_quiet = 0              # ... the tile, the result stage and the SWIGLU sink
        self.exec_done = 0              # every execute command so far is complete
        self.rq_done = 0                # the last REQUANT is done (busy low)
        self.o_last = -1                # the last o beat
        self.link_last = -1
        self.work_end = 0
        self.busy = {"load": 0, "execute": 0, "requant": 0, "tile": 0}
        self.beats = self.ld_words = self.o_beats = 0

    # -- helpers --------------------------------------------------------------------------

    def _decode(self, earliest):
        d = max(self.t_dec + 1, earliest)
        self.t_dec = d
        return d

    def _link_cycles(self) -> int:
        return _flits(self.link_rate)

    def _record(self, i, op, engine, decoded, start, end, done, waited=0):
        self.cmds.append(CommandCycles(i, op.name, engine, decoded, start, end, done, waited))
        self.work_end = max(self.work_end, end, done - 1)

    # -- LOAD -----------------------------------------------------------------------------

    def load(self, i, f):
        o = self.o
        depth = o.load_queue_depth
        q = self.load_accepts
        earliest = q[-depth] if len(q) >= depth else 0
        d = self._decode(earliest)
        # the queue's head from d + decode_cycles; the engine takes it in the cycle the one
        # before finishes (or any cycle when idle) and works from the cycle after
        accept = max(d + o.decode_cycles, self.ld_finish)
        q.append(accept + 1)
        active = accept + 1
        target, buf, words = Target(f["target"]), f["buf"], f["words"]
        # a BARRIER before it has started; the load engine registers its hold and fence
        # (hw/pe/load.py): a word from the cycle after either clears
        ready = max(active, self.load_hold + 1)
        ready_low = ready                          # of the words in a buffer's lower half
        n_low = 0
        if target in WMEM_TARGETS and self.flag[buf] is not None:
            state, t, *halves = self.flag[buf]
            if state == "set":
                raise ValueError(f"command {i}: LOAD into WMEM buffer {buf} while full[{buf}] "
                                 f"is set and no GEMM before it releases the buffer")
            # a word waits for its half's flag, a signalling LOAD for both
            lw = o.config.wmem_low_words // (8 if target is Target.WSCALE else 1)
            if not f["signal"]:
                n_low = min(words, max(0, lw - f["addr"]))
                ready_low, ready = max(ready, halves[0]), max(ready, halves[1])
            else:
                ready = max(ready, t)
        if f["fence"]:
            ready = max(ready, self.exec_done + 1)
            ready_low = max(ready_low, self.exec_done + 1)
        if self.ld is not None:
            if target is Target.TOK:
                for j in range(words):
                    self.tok[f["addr"] + j] = self.ld[self.ld_pos + j]
            self.ld_pos += words
        parts = o.load_word_cycles(target)
        if n_low:
            first, last = self.bucket.take(n_low, ready_low, parts)
            if words > n_low:
                last = self.bucket.take(words - n_low, ready, parts)[1]
            ready = ready_low
        else:
            first, last = self.bucket.take(words, ready, parts)
        finish = last if words else ready
        self.ld_finish = finish
        if f["signal"]:
            self.flag[buf] = ("set", finish + 1)
        self.ld_words += words
        self.busy["load"] += words * parts
        self._record(i, Op.LOAD, "load", d, first, last, finish + 1, ready - active)

    def _live_rows(self, f):
        """Per row block of a COMBINE GEMM, per row: its TOK entry's gate weight is nonzero
        (entry ``tok_base + row_block x rows + row``, as ``hw/pe/combine.py`` reads it; a TOK
        word the model does not know, never loaded or written by a RECV, counts as live: the
        model may be slow there, never fast). ``None`` when the ld words are not known."""
        if self.ld is None:
            return None
        R, per_word = self.o.rows, self.o.config.word_bits // 64
        out = []
        for b in range(f["row_blocks"]):
            rows = []
            for r in range(R):
                e = f["tok_base"] + b * R + r
                word = self.tok.get(e // per_word)
                rows.append(word is None or
                            int(word.view(TOK_DTYPE)[e % per_word]["gate"]) & 0x7FFF != 0)
            out.append(rows)
        return out

    def _row_words(self, f, r):
        """Per row of result ``r`` of a COMBINE GEMM, the OUT word it writes (``slot x
        stride + ch / (W/64)``, the slot from the row's TOK entry, as ``hw/pe/combine.py``
        addresses it); None where the TOK word is not known."""
        o = self.o
        R, L, per_word = o.rows, o.lanes, o.config.word_bits // 64
        rbn = f["row_blocks"]
        blk, rb = divmod(r, rbn)
        ch = f["out_base"] + blk * (L // 2 if f["mode"] == Mode.FULL else L)
        out = []
        for row in range(R):
            e = f["tok_base"] + rb * R + row
            word = self.tok.get(e // per_word) if self.ld is not None else None
            if word is None:
                out.append(None)
                continue
            slot = int(word.view(TOK_DTYPE)[e % per_word]["slot"])
            out.append(slot * f["stride"] + ch // per_word)
        return out

    # -- execute engine -------------------------------------------------------------------

    def _take(self, d):
        """The execute engine takes the command decoded in ``d`` from its register (IDLE)."""
        k = max(d + self.o.decode_cycles, self.ex_idle)
        self.x_take_prev = k
        return k

    def gemm(self, i, f):
        o = self.o
        d = self._decode(self.x_take_prev)
        full = f["mode"] == Mode.FULL
        held = bool(f["acc_hold"])
        halves = 2 if full else 1
        g = f["groups"]
        n_res = f["col_blocks"] * halves * f["row_blocks"]
        beats = n_res * g
        empty = beats == 0
        # readiness: the buffer flag, REQUANT, a descriptor slot
        ready = 0
        if f["wait"]:
            state = self.flag[f["wbuf"]]
            if state is None or state[0] != "set":
                raise ValueError(f"command {i}: GEMM waits on WMEM buffer {f['wbuf']} with no "
                                 f"signalling LOAD since its last release")
            ready = state[1]
        if f["rq_wait"]:
            ready = max(ready, self.rq_done)
        slot = 0 if (held or empty) else self.dq_free
        run = self.run
        b2b = False
        if run is not None and not empty:
            F = run["F"]
            releasing = run["release"] and run["wbuf"] == f["wbuf"] and f["wait"]
            b2b = (d + o.decode_cycles <= F and ready <= F and slot <= F and not releasing)
        if b2b:
            k = s = run["F"]
            self.x_take_prev = k
            waited = 0
        else:
            if run is not None:
                self.ex_idle = max(self.ex_idle, run["F"])
            k = self._take(d)
            s = max(k + 1, ready, slot)            # start_cur in GEMM_START
            waited = s - (k + 1)
        self.run = None
        if empty:
            # only releases its buffer
            if f["release"]:
                self.flag[f["wbuf"]] = ("clear", s + 1, s + 1, s + 1)
            self.ex_idle = s
            self.exec_done = max(self.exec_done, s + 1)
            self._record(i, Op.GEMM, "execute", d, s + 1, s, s + 1, waited)
            return
        P = o.beat_cycles
        # b0: the first beat offered to the tile; beat k is taken in the last of its P passes
        b0 = max(s + o.gemm_start_cycles, self.tile_next)
        last_unstalled = b0 + beats * P - 1        # the last beat taken, without stalls
        lat = o.tile_latency
        # (offered, cycles) of the results that freeze the tile (its whole pipeline, this
        # GEMM's beats included), in order: earlier GEMMs' after their last beat, then this
        # GEMM's own
        stalls = []
        for t, c in self.tile_stalls:
            if t <= b0:                # frozen when this GEMM's first beat comes: it waits
                b0 = max(b0, t + c)
            else:                      # frozen with this GEMM's beats in the tile
                stalls.append((t, c))
        last_unstalled = b0 + beats * P - 1
        if n_res and not held:
            sink, psum_in = Sink(f["sink"]), bool(f["psum_in"])
            rs = self.results
            per = g * P                                # tile cycles of one result
            frozen = [0, 0]            # stalls applied so far, their cycles (Or grows)

            live = self._live_rows(f) if sink is Sink.COMBINE else None
            rbn = f["row_blocks"]

            def result(r):
                """Result ``r`` offered at ``Or``, handed over at ``Ar``, in the result
                register at ``Tr``; the tile stalls ``Ar - Or`` cycles. Returns whether it
                went straight through (offered, handed over and taken in one cycle)."""
                nonlocal A_last
                Or = b0 + (r + 1) * per - 1 + lat + frozen[1]
                while frozen[0] < len(stalls) and stalls[frozen[0]][0] <= Or:
                    Or += stalls[frozen[0]][1]
                    frozen[1] += stalls[frozen[0]][1]
                    frozen[0] += 1
                A_last, Tr = rs.take(Or, sink, psum_in, full,
                                     None if live is None else live[r % rbn],
                                     self._row_words(f, r) if sink is Sink.COMBINE else None)
                if A_last > Or:
                    stalls.append((Or, A_last - Or))
                return Tr == Or
            A_last = None
            period = rs.period(sink, psum_in, full)
            keeps_up = period is not None and per >= period
            r = 0
            while r < n_res:
                straight = result(r)
                r += 1
                if keeps_up and straight and r < n_res - 1:
                    # the sink keeps up and this result found the skid and the result
                    # register free: the later ones wait for nothing (the ones between need
                    # not be followed)
                    r = n_res - 1
            # the descriptor moves to the active slot once the previous result GEMM's last
            # result has left the tile
            prev_A = self.last_result if self.last_result is not None else -1
            self.dq_free = max(s + 1, prev_A) + 1
            self.last_result = A_last
            if sink is Sink.RAW:
                done = quiet = out_quiet = rs.x + o.sink_done_cycles[sink]
            else:
                done = rs.x + o.sink_done_cycles[sink]
                quiet = rs.tail if sink is Sink.COMBINE else \
                    rs.x + o.sink_idle_cycles(sink, full)
                # OUTPUT (two OUT banks) leaves its drain with stage A empty behind COMBINE, or
                # holding a row the sink skips (gate 0), the result register empty
                out_quiet = rs.x + (0 if rs.last_dead else 1) if sink is Sink.COMBINE \
                    else quiet
        last_beat = _stalled(last_unstalled, stalls)
        # the last beat's reads (final step): the cycle the beat before it was taken (a stall
        # after them holds the read data, not the reads)
        F = _stalled(last_unstalled - P, stalls)
        self.tile_next = last_beat + 1
        self.tile_stalls = [(t, c) for t, c in stalls if t > last_beat]
        if held or not n_res:
            done = quiet = out_quiet = last_beat + 1
        if f["release"]:
            self.flag[f["wbuf"]] = ("clear", F + 1, *self._half_release(f, b0, F, stalls))
        self.run = dict(F=F, wbuf=f["wbuf"], release=bool(f["release"]))
        self.ex_idle = F               # the next command taken with the last read (unless a
        #                                GEMM follows back to back)
        self.gemm_quiet = max(self.gemm_quiet, quiet)
        self.out_quiet = max(self.out_quiet, out_quiet)
        self.exec_done = max(self.exec_done, done)
        self.beats += beats
        self.busy["tile"] += beats * P
        self.busy["execute"] += last_beat - b0 + 1
        self._record(i, Op.GEMM, "execute", d, b0 + P - 1, last_beat, done, waited)

    def _half_release(self, f, b0, F, stalls):
        """The first cycles a LOAD may write the lower and the upper half of a releasing GEMM's
        buffer (a flag each, :attr:`~elmoe3d.config.PEConfig.wmem_low_words`): the cycle after
        the read of the first beat whose column block starts in the upper half (every later
        read is there too), resp. of its first beat if all its words lie in the lower half;
        else after the last read (``F + 1``). ``stalls``: the results that held the tile,
        (cycle offered, cycles), in order."""
        low, g = self.o.config.wmem_low_words, f["groups"]
        if not low:
            return F + 1, F + 1
        P = self.o.beat_cycles
        per_cb = (2 if f["mode"] == Mode.FULL else 1) * f["row_blocks"] * g

        def after(cb):                 # the cycle after the read of column block cb's first beat
            # its reads: the previous beat taken
            return min(F + 1, _stalled(b0 + cb * per_cb * P - 1, stalls) + 1)
        cbn, w = f["col_blocks"], f["w_base"]
        cb = 0 if w >= low else -(-(low - w) // g)
        t_low = after(cb) if cb < cbn else F + 1
        t_high = after(0) if w + cbn * g <= low else F + 1
        return t_low, t_high

    def _drain_start(self, k, *, barrier=False):
        c = max(k + 1, self.gemm_quiet, self.rq_done)
        if barrier:
            c = max(c, self.ld_finish + 1)
        return c

    def drain_op(self, i, op, f):
        o = self.o
        d = self._decode(self.x_take_prev)
        if self.run is not None:
            self.ex_idle = max(self.ex_idle, self.run["F"])
            self.run = None
        k = self._take(d)
        barrier = op is Op.BARRIER or (op is Op.CLEAR and f["counters"])
        if op is Op.OUTPUT and o.output_early:
            c = max(k + 1, self.out_quiet, self.rq_done)
        else:
            c = self._drain_start(k, barrier=barrier)
        waited = c - (k + 1)
        if barrier or op is Op.STATUS:             # later LOADs: no word before it started
            self.load_hold = c + 1
        if op is Op.OUTPUT and o.output_early:
            first, last, n = self._output_early(c, f)
            idle = last + o.output_done_cycles if n else c + 2
            start, end = first, last if n else first - 1
            self.o_beats += n
            if n:
                self.o_last = max(self.o_last, last)
        elif op is Op.OUTPUT:
            if f.get("raw"):
                # OUT words themselves, no converters (OUTPUT raw)
                n = f["row_blocks"] * o.rows * f["channels"] // (o.word_bits // 64)
                S = o.output_raw_beat_cycles
                first = c + o.output_raw_latency
            else:
                n = f["row_blocks"] * o.rows * f["channels"] // (o.word_bits // 32)
                S = o.output_beat_cycles
                first = c + o.output_latency
            last = first + (n - 1) * S if n else c
            idle = last + o.output_done_cycles if n else c + 2
            start, end = first, last if n else first - 1
            self.o_beats += n
            if n:
                self.o_last = max(self.o_last, last)
        elif op is Op.STATUS:
            start = end = c + 1
            idle = c + 2
            self.o_beats += 1
            self.o_last = max(self.o_last, end)
        elif op is Op.CLEAR:
            n = o.clear_cycles if (f["out"] or f["rowmax"]) else 1
            start, end = c + 1, c + n
            idle = end + 1
        elif op is Op.BARRIER:
            start = end = c + 1
            idle = c + 2
        elif op is Op.SEND:
            # a word a cycle (read, then offered); a memory in P parts: the parts read a cycle
            # each into a register, the word offered once complete (P + 1 cycles a word)
            n = f["words"]
            per = o.send_word_cycles(f["target"])
            narrow = per > 1
            start = c + 1 + per
            # each word stays on link_o until the link takes its last flit (L flits, one a
            # cycle); the next word is read (per - 1 cycles) only then
            end, offer = c, start
            for _ in range(n):
                end = self.results.link_out.put(offer)
                offer = end + per
            idle = (end + (2 if narrow else 1)) if n else c + 2
            self.link_last = max(self.link_last, end)
        else:                                  # RECV
            # a word a cycle (P cycles into a memory in P parts); accumulate: its write a
            # cycle after the last read
            n = f["words"]
            if Target(f["target"]) is Target.TOK:      # link data: gate weights unknown
                for j in range(n):
                    self.tok.pop(f["addr"] + j, None)
            per = o.load_word_cycles(f["target"])
            takes, t = [], c
            for _ in range(n):           # each word `per` cycles after the last at least
                t = self.results.link_in.take(t + per)
                takes.append(t)
            start, end = (takes[0], takes[-1]) if n else (c + per, c)
            idle = end + 1 + (1 if f["accumulate"] else 0) + 1
        # `idle`: the first cycle the command counts as complete; the engine takes the next
        # command in the cycle before (its last)
        self.ex_idle = idle - 1
        self.exec_done = max(self.exec_done, idle)
        self.busy["execute"] += idle - (c + 1)
        self._record(i, op, "execute", d, start, end, idle, waited)

    def _output_early(self, c, f):
        """OUTPUT with :attr:`~elmoe3d.config.PEOptions.output_early` leaving its drain in
        cycle ``c``: its pair reads (OUT words ``2 j``, ``2 j + 1``), the first in cycle
        ``c``, each once the COMBINE writes to its words are made (a read in the cycle of the
        write sees it) and stage C's row is in its last sub-step (the earlier ones use the
        read port's data), the next a beat's sub-steps later (FP32) or as its second word
        moves on (raw: two beats a pair). Returns (first beat, last beat, beats)."""
        o, rs = self.o, self.results
        if f.get("raw"):
            n = f["row_blocks"] * o.rows * f["channels"] // (o.word_bits // 64)
            per_read, spacing, lat = 2, o.output_raw_beat_cycles, o.output_raw_latency
        else:
            n = f["row_blocks"] * o.rows * f["channels"] // (o.word_bits // 32)
            per_read, spacing, lat = 1, o.output_beat_cycles, o.output_latency
        gap = 2 if f.get("raw") else spacing          # cycles from one pair read to the next
        first = last = None
        r = c
        for j in range(-(-n // per_read)):
            r = max(r, rs.c_port, rs.any_write, rs.writes.get(2 * j, -1),
                    rs.writes.get(2 * j + 1, -1))
            for b in range(min(per_read, n - j * per_read)):
                beat = r + lat + b * spacing
                last = beat if last is None else max(beat, last + spacing)
                first = last if first is None else first
            r += gap
        return (first, last, n) if n else (c + lat, c, 0)

    def nop(self, i):
        d = self._decode(self.x_take_prev)
        if self.run is not None:
            self.ex_idle = max(self.ex_idle, self.run["F"])
            self.run = None
        k = self._take(d)
        self.ex_idle = k + 1
        self._record(i, Op.NOP, "decoder", d, k, k - 1, k + 1)

    # -- REQUANT --------------------------------------------------------------------------

    def requant(self, i, f):
        o = self.o
        d = self._decode(self.rq_done)
        older = self.exec_done
        r0 = max(d + 1, older) + 1                 # rq_run
        rows = f["row_blocks"] * o.rows - f.get("pad_rows", 0)     # padding rows: no cycles
        n = -(-f["channels"] // o.requant_units)   # cycles a row
        per_row = max(n, o.requant_row_cycles)
        if rows:
            first = r0 + o.requant_row_cycles
            last_step = first + (rows - 1) * per_row + n - 1
            done = last_step + o.requant_done_cycles
        else:
            done = r0 + 2
        self.rq_done = done
        self.exec_done = max(self.exec_done, done)
        self.busy["requant"] += done - r0
        self._record(i, Op.REQUANT, "requant", d, r0, done - 1, done, r0 - (d + 2))

    # -- run ------------------------------------------------------------------------------

    def step(self, i, cmd):
        op, f = cmd.op, cmd.fields
        if op is Op.LOAD:
            self.load(i, f)
        elif op is Op.GEMM:
            self.gemm(i, f)
        elif op is Op.REQUANT:
            self.requant(i, f)
        elif op in DRAIN_OPS:
            self.drain_op(i, op, f)
        else:
            self.nop(i)

    def estimate(self, ld_rate) -> CycleEstimate:
        if self.o_last >= 0:
            total = self.o_last + 1
        else:
            total = max(self.work_end, self.link_last) + 1
        return CycleEstimate(cycles=total, busy=dict(self.busy), commands=list(self.cmds),
                             ld_words=self.ld_words, beats=self.beats, o_beats=self.o_beats,
                             options=self.o, ld_rate=float(ld_rate),
                             link_o_offered=tuple(self.results.link_out.offered),
                             link_o_at=tuple(self.results.link_out.taken),
                             link_i_taken=tuple(self.results.link_in.taken))


def program_cycles(program, *, options=None, ld_rate=1.0, link_rate=None,
                   ld=None, link_i_at=None, link_o_held=None) -> CycleEstimate:
    """Cycles of ``program`` on one PE, from the first command taken to the last ``o`` beat
    taken (module docstring for the model).

    Parameters
    ----------
    program : :class:`~elmoe3d.sw.golden.asm.Program`
    options : :class:`~elmoe3d.config.PEOptions`, optional
        The PE (default ``PEOptions(config=program.pe)``: the default build options).
    ld_rate : float
        ``ld`` words per cycle (the HB bank rate: ``arch.hb_bytes_per_cycle /
        pe.word_bytes``; 1 or more: a word every cycle).
    link_rate : float, optional
        ``link_i`` / ``link_o`` words per cycle for SEND, RECV and ``psum_in`` (default: a
        word every cycle): ``L = ceil(1 / link_rate)`` flits a word, one a cycle. A
        ``link_o`` word stays offered for its L flits; a ``link_i`` word comes L cycles after
        the previous one was taken (the first at once), unless ``link_i_at`` is given.
    link_i_at : sequence of int, optional
        Per ``link_i`` word in the order the program takes them (RECV and ``psum_in``), the
        first cycle it is there (:func:`group_cycles`: the link's delivery of the group's
        words); the PE takes each no earlier, one a cycle at most.
    link_o_held : sequence of int, optional
        Per ``link_o`` word in order (SEND and RAW), the first cycle the link can take its
        last flit (:func:`group_cycles`); the word stays offered until then.
    ld : sequence of int (W bits each) or ``uint8 [n, W/8]``, optional
        The program's ``ld`` words (``job.ld``): with them the model reads the gate weights the
        LOADs put in TOK and follows the COMBINE sink's zero-gate skip (a padding row of a
        token tile, gate 0, leaves the sink without its sub-steps). Without them every row is
        taken as live: up to ``rows - 1`` cycles a COMBINE result slow where the sink, not the
        tile, is the bottleneck.

    Raises
    ------
    ValueError
        ``ld_rate`` is not positive, ``link_i_at`` holds fewer cycles than the program takes
        ``link_i`` words, or the program breaks a buffer-flag rule the RTL would
        hang on (a WMEM LOAD into a full buffer with no release before it, a ``wait`` GEMM
        with no signalling LOAD).
    ~elmoe3d.sw.golden.asm.ProgramError
        ``ld`` holds fewer words than the program's LOADs take.
    """
    if options is None:
        options = PEOptions(config=program.pe)
    elif options.config != program.pe:
        raise ValueError("options: the PE geometry differs from the program's")
    if ld is not None:
        from ..golden.pe import _words_in
        n = sum(c.fields["words"] for c in program if c.op is Op.LOAD)
        ld = _words_in(ld, 0, n, program.pe, "program", "ld")
    model = _Model(options, ld_rate, link_rate, ld,
                   None if link_i_at is None else [int(t) for t in link_i_at],
                   None if link_o_held is None else [int(t) for t in link_o_held])
    for i, cmd in enumerate(program):
        model.step(i, cmd)
    return model.estimate(ld_rate)


def _flits(link_rate) -> int:
    """L: cycles a link word takes at ``link_rate`` words a cycle (None: one), its flits moving
    one a cycle: ``ceil(1 / link_rate)``."""
    return 1 if link_rate is None else max(1, math.ceil(1 / float(link_rate)))


def _link_schedule(job, offered, taken, flits):
    """The aggregation link's timing for ``job``'s group (:func:`group_cycles`), flit by
    flit as :class:`~elmoe3d.hw.agg_link.AggregationLink` moves them, from every PE's
    ``link_o`` words' offer cycles (``offered``) and its ``link_i`` words' take cycles
    (``taken``). Returns ``(held, at)``: per PE, the cycle the link takes each of its
    ``link_o`` words' last flit, and the cycle each of its ``link_i`` words is offered.

    The descriptors run one at a time, each taken in the cycle the previous one finishes
    (the first in cycle 0; one of no words finishes the cycle after). A source's flits enter
    its two-flit buffer one a cycle from the cycle after its descriptor was taken, while the
    buffer holds fewer than two (``pe_i.ready`` with the last flit of a word); flit ``i`` of
    every source moves together, a cycle after the last source's flit came in and at most a
    flit a cycle, the first ``LINK_OP_LATENCY`` cycles after the descriptor was taken:

    * BYPASS and one source's ALL_TO_ALL (``chunk`` words to each destination in turn): to the
      destinations, once each destination FIFO (``job.buffer_words``) has room (a FIFO is
      written with a word's last flit and has room the cycle after the PE took its word
      ``buffer_words`` earlier);
    * REDUCE_ADD / REDUCE_MAX: into the reduction tree, ``reduce_stages`` register levels
      that move together: a flit leaves the last level ``reduce_stages`` cycles after it
      went in, unless the FIFO has no room for its word, and while a flit waits there the
      whole tree stands still (no level moves, no flit goes in).

    A word's last flit out reaches the FIFO, the word offered on ``pe_o`` the cycle after
    (:func:`~elmoe3d.config.link_latency`); the descriptor finishes then."""
    G, depth = job.pes, job.buffer_words
    stages = link_reduce_stages(G)
    pos = [0] * G                       # each source's next link_o word
    moves = [[] for _ in range(G)]      # per source, the cycle each of its flits moved
    held = [[] for _ in range(G)]
    at = [[] for _ in range(G)]
    t_op = 0                            # the descriptor is taken in
    for d, op in enumerate(job.link_ops):
        mode = LinkMode(op.mode)
        srcs, dsts = op.srcs, op.dsts
        a2a = mode is LinkMode.ALL_TO_ALL           # one source (group_cycles checks)
        tree = stages if mode in (LinkMode.REDUCE_ADD, LinkMode.REDUCE_MAX) else 0
        for s in srcs:
            if pos[s] + op.words > len(offered[s]):
                raise ValueError(f"link_ops[{d}]: PE {s} sends {len(offered[s])} link words, "
                                 f"the descriptors take more")
        if op.words == 0:
            t_op += 1
            continue
        mv = t_op + LINK_OP_LATENCY - 1     # the last flit moved
        out = mv + tree                     # ... and left the link (the tree)
        still = []                          # [a, b): the tree stands still in cycles a .. b-1
        last_in = {s: t_op for s in srcs}
        for k in range(op.words):
            to = [dsts[(k // op.chunk) % len(dsts)]] if a2a else dsts
            room = -1                       # the FIFOs' room for the word from
            for q in to:
                j = len(at[q]) - depth
                if 0 <= j < len(taken[q]):
                    room = max(room, taken[q][j] + 1)
            for i in range(flits):
                ready = -1
                for s in srcs:
                    n = len(moves[s])
                    t = max(last_in[s] + 1, offered[s][pos[s] + k] if i == 0 else -1)
                    if n >= 2:
                        t = max(t, moves[s][n - 2] + 1)     # the buffer's room
                    last_in[s] = t
                    ready = max(ready, t + 1)
                mv = max(mv + 1, ready)
                if not tree:                # BYPASS / ALL_TO_ALL: straight to the FIFOs
                    mv = out = max(mv, room)
                else:
                    for a, b in still:      # no flit goes in while the tree stands still
                        if a <= mv < b:
                            mv = b
                    out = mv + tree         # its last level, later by every stand-still
                    for a, b in still:
                        if a >= out:
                            break
                        if a > mv:
                            out += b - a
                    if room > out:          # waits there for the FIFO: the tree stands still
                        still.append((out, room))
                        out = room
                for s in srcs:
                    moves[s].append(mv)
            for s in srcs:
                held[s].append(last_in[s])
            for q in to:
                at[q].append(out + 1)
        for s in srcs:
            pos[s] += op.words
        t_op = out + 1
    return held, at


def group_cycles(job, *, ld_rate=1.0, link_rate=None, options=None, max_rounds=None):
    """Cycles of every PE of a PE group's programs (a
    :class:`~elmoe3d.sw.host.parallel.GroupJob`: ``programs``, ``ld``, ``link_ops``,
    ``buffer_words``) joined by the aggregation link: each PE's ``link_o`` words taken and its
    ``link_i`` words brought as the link moves them (:func:`_link_schedule`: its descriptors
    in order, ``L = ceil(1 / link_rate)`` flits a word, one a cycle), every PE's first command
    and the first descriptor in cycle 0 (:func:`program_cycles` with ``link_i_at`` and
    ``link_o_held``). Solved by rounds, from every link word free, until nothing moves (each
    round's cycles are no earlier than the last's), at most ``max_rounds`` (default: twice the
    group's link words + 8): 3-5 on the paper PE's expert groups; a FIFO that the PEs on both
    sides take turns to wait for takes more, up to a round a word (measured: 64 rounds for 64
    words through a one-word FIFO; ``tests/host/test_pe_cycles.py``).

    Not modelled: an ALL_TO_ALL of several sources (the link's wavefront).

    Returns a list of :class:`CycleEstimate`, one per PE (the group's cycles: the largest).
    Raises ``ValueError`` where :func:`program_cycles` does, for an ALL_TO_ALL descriptor of
    several sources, for a program that sends fewer or more words than its descriptors take
    or takes fewer or more than they deliver (the RTL group would hang, or leave words in a
    FIFO), or for no fixed point within ``max_rounds`` (a schedule that deadlocks).
    """
    G = job.pes
    flits = _flits(link_rate)
    need, sent = [0] * G, [0] * G
    for d, op in enumerate(job.link_ops):
        if op.mode == LinkMode.ALL_TO_ALL and len(op.srcs) > 1:
            raise ValueError(f"link_ops[{d}]: an ALL_TO_ALL of {len(op.srcs)} sources is not "
                             f"in the group cycle model (one source's is, BYPASS, REDUCE_ADD "
                             f"and REDUCE_MAX are)")
        for q in op.dsts:
            need[q] += op.delivered_words()
        for s in op.srcs:
            sent[s] += op.words
    if max_rounds is None:
        max_rounds = 2 * sum(sent) + 8

    def run(p, at, held):
        try:
            est = program_cycles(job.programs[p], options=options, ld_rate=ld_rate,
                                 link_rate=link_rate, ld=job.ld[p], link_i_at=at,
                                 link_o_held=held)
        except ValueError as e:
            if str(e).startswith("link_i_at"):
                raise ValueError(f"link_ops: PE {p} is sent {need[p]} link words, its program "
                                 f"takes more") from None
            raise
        if len(est.link_i_taken) != need[p] or len(est.link_o_offered) != sent[p]:
            raise ValueError(
                f"link_ops: PE {p} is sent {need[p]} link words and its program takes "
                f"{len(est.link_i_taken)}; the descriptors take {sent[p]} of its words and "
                f"it sends {len(est.link_o_offered)}")
        return est
    at, held = [[0] * n for n in need], [None] * G
    for _ in range(max_rounds):
        est = [run(p, at[p], held[p]) for p in range(G)]
        new_held, new_at = _link_schedule(job, [e.link_o_offered for e in est],
                                          [e.link_i_taken for e in est], flits)
        if new_at == at and new_held == held:
            return est
        at, held = new_at, new_held
    raise ValueError(f"group_cycles: the link's timing still moves after {max_rounds} rounds "
                     f"(a link schedule that deadlocks?)")

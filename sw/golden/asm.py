"""Assembler for the PE command ISA and packers for the PE's memory words (plain NumPy).

The host-side twin of :mod:`elmoe3d.hw.isa` (``docs/pe.md``; paper Sections 4.1, 5.2):

* :class:`Program` builds a command list with one helper per op (:meth:`Program.load`,
  :meth:`Program.gemm`, ...), checks every field against the ISA widths and the PE's memory
  sizes as it goes (a :class:`ProgramError` names the command index, the op and the field) and
  encodes it with :meth:`Program.encode` (128-bit integers, :func:`elmoe3d.isa.encode`).
* :class:`SyncChecker` is the buffer-flag and engine-ordering protocol of the two engines
  (load engine, execute engine). The functional simulator runs it on every command; a program
  it accepts behaves the same however the engines interleave.
* Packers turn arrays into memory words and back, bit for bit the Amaranth layouts of
  :mod:`elmoe3d.hw.isa` (``tests/golden/test_isa.py`` compares them): a word is W = lanes * 128
  bits, least significant bit first. In NumPy a word is ``W/8`` little-endian bytes (``uint8``
  ``[n, W/8]``); :func:`words_to_ints` / :func:`ints_to_words` convert to the Python integers
  a stream carries. The formats themselves (:data:`~elmoe3d.isa.TOK_FIELDS`,
  :data:`~elmoe3d.isa.STATUS_FIELDS`, :class:`~elmoe3d.isa.OKind`, ...) are defined in
  :mod:`elmoe3d.isa`; this module re-exports them under their old names.

Word layouts (element ``[i][j]`` of an array field sits at the lowest bits first)::

    WMSB / WLSB   [lanes][32] x u4      nibble (n, k) at bit 4 * (32 n + k)   (tile ``wgt``)
    WSCALE        [8][lanes] x u16      FP16 bits of (slot, n) at bit 16 * (lanes slot + n)
    ACT           [rows][32] x s8       code (r, k) at bit 8 * (32 r + k)     (tile ``act``)
    TOK           [W/64] x entry        entry j at bit 64 j: e_x s8, e_h s8, gate FP16 u16,
                                        slot u8, pad u24 (:data:`~elmoe3d.isa.TOK_FIELDS`)
    HBUF          [W/32] x s32          Q16.16
    OUT           [W/64] x s64          Q.24 (also a RAW / psum_in link word)
    ROWMAX        [W/32] x u32          row max |h| (Q16.16) of TOK entry a * W/32 + j
    o DATA        [W/32] x u32          FP32 bits
    o STATUS      :data:`~elmoe3d.isa.STATUS_FIELDS`, zero-padded to W
    o beat        kind (:data:`~elmoe3d.isa.OKIND_BITS`, :class:`~elmoe3d.isa.OKind`) then
                  the W data bits

This module never imports Amaranth.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ...config import PEConfig, pe_config
from ...isa import (FUNCTIONAL_STATUS_FIELDS, OKIND_BITS, OPS, SCALES_PER_WORD, STATUS_FIELDS,
                   TIMING_STATUS_FIELDS, TOK_ENTRY_BITS, TOK_FIELDS, W_TARGETS, IsaError, OKind,
                   Op, Sink, Source, Target, decode, encode)
from .datapath import UINT32_MAX, Mode
from .quant import GROUP, QuantizationError, as_int8_codes


__all__ = [
    "ProgramError", "OKind", "TOK_FIELDS", "STATUS_FIELDS", "TIMING_STATUS_FIELDS",
    "FUNCTIONAL_STATUS_FIELDS", "W_TARGETS", "pe_config", "target_words",
    "Command", "Program", "SyncChecker", "command_ranges",
    "words_to_ints", "ints_to_words",
    "pack_wgt", "unpack_wgt", "pack_scales", "unpack_scales", "pack_act", "unpack_act",
    "TOK_DTYPE", "pack_tok", "unpack_tok", "pack_q16", "unpack_q16", "pack_q24", "unpack_q24",
    "pack_rowmax", "unpack_rowmax", "pack_weight_matrix", "pack_act_matrix", "pack_fp32",
    "unpack_fp32", "pack_status", "unpack_status", "OBeat",
]


class ProgramError(ValueError):
    """A PE program is wrong: a field out of range, an address beyond a memory, a broken
    buffer-flag protocol, an ``ld`` stream too short. The message names the command index."""


def target_words(pe: PEConfig, target) -> int:
    """Words of the memory ``target`` (WMEM targets: one buffer; ROWMAX: words of W/32 row-max
    registers, ``tok_entries // (W/32)``, so entries beyond the last whole word, if any, are
    not addressable by SEND / RECV)."""
    return {Target.WMSB: pe.wmem_words, Target.WLSB: pe.wmem_words,
            Target.WSCALE: pe.wscale_words, Target.ACT: pe.act_words,
            Target.TOK: pe.tok_words, Target.HBUF: pe.hbuf_words,
            Target.OUT: pe.out_words,
            Target.ROWMAX: pe.tok_entries // pe.q16_per_word}[Target(target)]


# ---- commands and programs --------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    """One command: ``op`` and all of its fields (missing ones are 0)."""

    op: Op
    fields: dict

    def encode(self) -> int:
        return encode(self.op, **self.fields)

    def __str__(self):
        parts = []
        for f in OPS[self.op]:
            v = self.fields[f.name]
            if f.name == "target":
                v = Target(v).name
            elif f.name == "src":
                v = Source(v).name if v in Source._value2member_map_ else v
            elif f.name == "sink":
                v = Sink(v).name if v in Sink._value2member_map_ else v
            elif f.name == "mode":
                v = Mode(v).name
            parts.append(f"{f.name}={v}")
        return f"{self.op.name:<8}" + " ".join(parts)


def _cdiv(a, b):
    return -(-a // b)


class Program:
    """A PE command program for one configuration.

    Every helper appends one command and checks it at once (the ISA field widths and the PE's
    memory sizes); it returns the command's index. Addresses and counts are in words of the
    addressed memory (``docs/pe.md``).

    Parameters
    ----------
    config : ArchConfig or PEConfig

    Raises
    ------
    ProgramError
        From every helper: the message names the command index, the op and the field.
    """

    def __init__(self, config):
        self._pe = pe_config(config)
        self._commands: list[Command] = []

    @property
    def pe(self) -> PEConfig:
        return self._pe

    @property
    def commands(self) -> tuple:
        return tuple(self._commands)

    def __len__(self):
        return len(self._commands)

    def __iter__(self):
        return iter(self._commands)

    def __getitem__(self, i):
        return self._commands[i]

    def counts(self) -> dict:
        """Number of commands per op name (and per LOAD target / GEMM sink)."""
        c = Counter()
        for cmd in self._commands:
            c[cmd.op.name] += 1
            if cmd.op is Op.LOAD:
                c[f"LOAD {Target(cmd.fields['target']).name}"] += 1
            if cmd.op is Op.GEMM:
                c[f"GEMM {Sink(cmd.fields['sink']).name}"] += 1
                if cmd.fields["psum_in"]:
                    c["GEMM psum_in"] += 1
        return dict(c)

    def listing(self) -> str:
        return "\n".join(f"{i:5d}  {cmd}" for i, cmd in enumerate(self._commands))

    def encode(self) -> list[int]:
        """The commands as :data:`~elmoe3d.isa.COMMAND_BITS`-bit integers, in order."""
        return [cmd.encode() for cmd in self._commands]

    @classmethod
    def decode(cls, words, config) -> "Program":
        """A program from encoded commands (checked like a built one)."""
        prog = cls(config)
        for i, w in enumerate(words):
            try:
                op, fields = decode(w)
            except IsaError as exc:
                raise ProgramError(f"command {i}: {exc}") from None
            prog.append(op, **fields)
        return prog

    # -- building ---------------------------------------------------------------------------

    def append(self, op, **fields) -> int:
        """Append a command (fields by name, missing ones 0) after checking it."""
        i = len(self._commands)
        try:
            op = Op(op)
        except ValueError:
            raise ProgramError(f"command {i}: unknown opcode {op!r}") from None
        try:
            encode(op, **fields)
        except IsaError as exc:
            raise ProgramError(f"command {i}: {exc}") from None
        full = {f.name: int(fields.get(f.name, 0)) for f in OPS[op]}
        check_command(self._pe, i, op, full)
        self._commands.append(Command(op, full))
        return i

    def nop(self) -> int:
        return self.append(Op.NOP)

    def load(self, target, addr: int, words: int, *, buf: int = 0, signal: bool = False,
             fence: bool = False, src=Source.HOST, hb_addr: int = 0) -> int:
        """LOAD ``words`` beats of the ``ld`` stream into ``target`` at ``addr`` (WMEM targets:
        of buffer ``buf``; ``signal`` sets the buffer's full flag when the load completes;
        ``fence``: the load waits until every earlier execute command has completed).
        ``src`` (:class:`~elmoe3d.isa.Source`) and ``hb_addr`` (HB address in W-bit words,
        for ``src = HB``) are for the die's load router; the PE ignores them."""
        return self.append(Op.LOAD, target=_enum(Target, target, len(self), "LOAD", "target"),
                           buf=buf, addr=addr, words=words, signal=int(bool(signal)),
                           fence=int(bool(fence)),
                           src=_enum(Source, src, len(self), "LOAD", "src"), hb_addr=hb_addr)

    def gemm(self, *, mode, wbuf: int, act_base: int, w_base: int, row_blocks: int,
             col_blocks: int, groups: int, sink, out_base: int = 0, tok_base: int = 0,
             stride: int = 0, wait: bool = False, release: bool = False,
             rq_wait: bool = False, psum_in: bool = False, acc_cont: bool = False,
             acc_hold: bool = False, max_keep: bool = False) -> int:
        """GEMM of ACT row blocks against WMEM column blocks of buffer ``wbuf`` (``docs/pe.md``
        address generation); results go to ``sink``. ``rq_wait``: start only when every
        earlier REQUANT has completed. ``psum_in``: add ``rows * lanes / (W/64)`` ``link_i``
        words (RAW layout, saturating) into every result before the sink. ``acc_cont`` /
        ``acc_hold`` (K-chained GEMMs of one result): start from the accumulators the previous
        GEMM held / hold them instead of emitting the result. ``max_keep`` (SWIGLU): never
        start a row's max, only raise it."""
        return self.append(Op.GEMM, mode=_enum(Mode, mode, len(self), "GEMM", "mode"),
                           wbuf=wbuf, act_base=act_base, w_base=w_base, row_blocks=row_blocks,
                           col_blocks=col_blocks, groups=groups,
                           sink=_enum(Sink, sink, len(self), "GEMM", "sink"),
                           out_base=out_base, tok_base=tok_base, stride=stride,
                           wait=int(bool(wait)), release=int(bool(release)),
                           rq_wait=int(bool(rq_wait)), psum_in=int(bool(psum_in)),
                           acc_cont=int(bool(acc_cont)), acc_hold=int(bool(acc_hold)),
                           max_keep=int(bool(max_keep)))

    def requant(self, *, row_blocks: int, channels: int, act_base: int, tok_base: int,
                pad_rows: int = 0) -> int:
        """REQUANT HBUF rows ``tok_base + rb*rows + r`` (``channels`` = I) into ACT and e_h;
        the last ``pad_rows`` rows (of the last row block) are padding: zero codes, no e_h."""
        return self.append(Op.REQUANT, row_blocks=row_blocks, channels=channels,
                           act_base=act_base, tok_base=tok_base, pad_rows=pad_rows)

    def output(self, *, row_blocks: int, channels: int, raw: bool = False) -> int:
        """OUTPUT OUT rows ``0 .. row_blocks*rows - 1`` (``channels`` = H) as FP32 beats, or
        with ``raw`` as their Q.24 OUT words (one word, W/64 values, per beat)."""
        return self.append(Op.OUTPUT, row_blocks=row_blocks, channels=channels,
                           raw=int(bool(raw)))

    def clear(self, *, out=False, rowmax=False, flags=False, counters=False) -> int:
        return self.append(Op.CLEAR, out=int(bool(out)), rowmax=int(bool(rowmax)),
                           flags=int(bool(flags)), counters=int(bool(counters)))

    def send(self, target, addr: int, words: int) -> int:
        return self.append(Op.SEND, target=_enum(Target, target, len(self), "SEND", "target"),
                           addr=addr, words=words)

    def recv(self, target, addr: int, words: int, *, accumulate: bool = False) -> int:
        """RECV ``words`` ``link_i`` words into ``target`` at ``addr``; ``accumulate``: OUT
        saturating s64 add, ROWMAX unsigned max."""
        return self.append(Op.RECV, target=_enum(Target, target, len(self), "RECV", "target"),
                           addr=addr, words=words, accumulate=int(bool(accumulate)))

    def barrier(self) -> int:
        return self.append(Op.BARRIER)

    def status(self) -> int:
        return self.append(Op.STATUS)

    def check_sync(self) -> None:
        """Run the :class:`SyncChecker` over the whole program."""
        sync = SyncChecker(self._pe)
        for i, cmd in enumerate(self._commands):
            sync.step(i, cmd.op, cmd.fields)

    def ld_words(self) -> int:
        """Beats of the ``ld`` stream the program consumes."""
        return sum(c.fields["words"] for c in self._commands if c.op is Op.LOAD)


def _enum(cls, value, i, op, field):
    try:
        return cls(value if not isinstance(value, str) else cls[value.upper()])
    except (ValueError, KeyError):
        raise ProgramError(f"command {i}: {op}.{field} = {value!r} is not one of "
                           f"{', '.join(m.name for m in cls)}") from None


def check_command(pe: PEConfig, i: int, op: Op, f: dict) -> None:
    """Static checks of one command against the PE's sizes (raises :class:`ProgramError`)."""
    def fail(field, msg):
        raise ProgramError(f"command {i}: {op.name}.{field} = {f[field]}: {msg}")

    def at_least_one(*names):
        for n in names:
            if f[n] < 1:
                fail(n, "must be at least 1")

    def span(field, end, size, what):
        if end > size:
            fail(field, f"{what} reaches word {end - 1}, beyond the {size} words of the memory")

    L, R = pe.lanes, pe.rows
    if op in (Op.LOAD, Op.SEND, Op.RECV):
        try:
            target = Target(f["target"])
        except ValueError:
            fail("target", f"unknown target; targets are {', '.join(t.name for t in Target)}")
        at_least_one("words")
        size = target_words(pe, target)
        span("addr", f["addr"] + f["words"], size, f"{target.name} addr + words")
        if op is Op.LOAD and target is Target.ROWMAX:
            fail("target", "LOAD does not address the row-max registers (SEND / RECV do)")
        if op is Op.LOAD and f["src"] not in Source._value2member_map_:
            fail("src", f"unknown source; sources are {', '.join(s.name for s in Source)}")
        if op is Op.LOAD and target not in W_TARGETS:
            if f["buf"]:
                fail("buf", f"only WMEM targets have buffers, not {target.name}")
            if f["signal"]:
                fail("signal", f"only WMEM loads signal a buffer, not {target.name}")
        if op in (Op.SEND, Op.RECV) and target in W_TARGETS:
            fail("target", f"{op.name} addresses IOMEM (ACT, TOK, HBUF, OUT) or ROWMAX, not "
                           f"WMEM")
        if (op is Op.RECV and f["accumulate"]
                and target not in (Target.OUT, Target.ROWMAX)):
            fail("accumulate", f"RECV accumulates into OUT (add) or ROWMAX (max) only, not "
                               f"{target.name}")
    elif op is Op.GEMM:
        try:
            mode = Mode(f["mode"])
        except ValueError:                                # pragma: no cover - 2 bits, 4 modes
            fail("mode", "unknown mode")
        try:
            sink = Sink(f["sink"])
        except ValueError:
            fail("sink", f"unknown sink; sinks are {', '.join(s.name for s in Sink)}")
        at_least_one("row_blocks", "col_blocks", "groups")
        span("act_base", f["act_base"] + f["row_blocks"] * f["groups"], pe.act_words,
             "act_base + row_blocks * groups")
        span("w_base", f["w_base"] + f["col_blocks"] * f["groups"], pe.wmem_words,
             "w_base + col_blocks * groups")
        rows_end = f["tok_base"] + f["row_blocks"] * R
        if sink is not Sink.RAW and rows_end > pe.tok_entries:
            fail("row_blocks", f"token rows reach entry {rows_end - 1}, beyond the "
                               f"{pe.tok_entries} TOK entries")
        halves = 2 if mode is Mode.FULL else 1
        nblk = f["col_blocks"] * halves
        chained = [n for n in ("acc_cont", "acc_hold") if f.get(n)]
        if chained and (nblk * f["row_blocks"] != 1):
            fail(chained[0], f"a K-chained GEMM has one result (row_blocks = col_blocks = 1, "
                             f"mode not FULL: use LSB_ONLY + MSB_ONLY), got "
                             f"{nblk * f['row_blocks']}")
        if f.get("acc_hold") and f.get("psum_in"):
            fail("psum_in", "a GEMM that holds its accumulators (acc_hold) emits no result to "
                            "add link psums into")

        def row_channels(per_block, per_word, memory):
            # the blocks' channels, from out_base, fit one row of ``stride`` words
            at_least_one("stride")
            per_row = f["stride"] * per_word
            if f["out_base"] % per_block:
                fail("out_base", f"must be a multiple of the {per_block} channels a block "
                                 f"writes")
            if f["out_base"] + nblk * per_block > per_row:
                fail("out_base", f"channels out_base + {nblk} blocks x {per_block} = "
                                 f"{f['out_base'] + nblk * per_block} exceed the {memory} row "
                                 f"of stride {f['stride']} words ({per_row} channels)")

        if sink is Sink.SWIGLU:
            row_channels(L // 4 if mode is Mode.FULL else L // 2, pe.q16_per_word, "HBUF")
            span("stride", rows_end * f["stride"], pe.hbuf_words,
                 f"HBUF rows up to {rows_end - 1} x stride")
        elif sink is Sink.COMBINE:
            row_channels(L // 2 if mode is Mode.FULL else L, pe.q24_per_word, "OUT")
            span("stride", f["stride"], pe.out_words, "one OUT row")
    elif op is Op.REQUANT:
        at_least_one("row_blocks")
        ch = f["channels"]
        if ch < 1 or ch % GROUP or ch % pe.q16_per_word:
            fail("channels", f"must be a positive multiple of {GROUP} and of W/32 = "
                             f"{pe.q16_per_word}")
        span("act_base", f["act_base"] + f["row_blocks"] * (ch // GROUP), pe.act_words,
             f"act_base + row_blocks * channels/{GROUP}")
        rows_end = f["tok_base"] + f["row_blocks"] * R
        if rows_end > pe.tok_entries:
            fail("row_blocks", f"token rows reach entry {rows_end - 1}, beyond the "
                               f"{pe.tok_entries} TOK entries")
        span("channels", rows_end * (ch // pe.q16_per_word), pe.hbuf_words,
             f"HBUF rows up to {rows_end - 1}")
        if f.get("pad_rows", 0) >= R:
            fail("pad_rows", f"the padding rows lie in the last row block, after at least one "
                             f"live row: at most rows - 1 = {R - 1}")
    elif op is Op.OUTPUT:
        at_least_one("row_blocks")
        ch = f["channels"]
        if f.get("raw"):
            if ch < 1 or ch % pe.q24_per_word:
                fail("channels", f"must be a positive multiple of W/64 = {pe.q24_per_word} "
                                 f"(OUTPUT raw: whole OUT words)")
        elif ch < 1 or ch % pe.fp32_per_beat:
            fail("channels", f"must be a positive multiple of W/32 = {pe.fp32_per_beat}")
        span("row_blocks", f["row_blocks"] * R * (ch // pe.q24_per_word), pe.out_words,
             "OUT rows x channels")


# ---- the engines' synchronisation protocol ------------------------------------------------------

def command_ranges(pe: PEConfig, op, f: dict) -> dict:
    """The memory words an execute command reads or writes: ``{memory: (lo, hi)}`` (word
    ranges; ``W0``/``W1`` are whole WMEM buffers of one unit, ``ROWMAX`` counts TOK entries).
    Data-dependent addresses (COMBINE's OUT slots) cover the whole memory."""
    op = Op(op)
    R, OV, Q = pe.rows, pe.q24_per_word, pe.q16_per_word
    out = {}

    def rows(t0, t1):
        out["TOK"] = (t0 // OV, _cdiv(t1, OV))

    if op is Op.GEMM:
        out[f"W{f['wbuf']}"] = (0, 1)
        out["ACT"] = (f["act_base"], f["act_base"] + f["row_blocks"] * f["groups"])
        t0, t1 = f["tok_base"], f["tok_base"] + f["row_blocks"] * R
        try:
            sink = Sink(f["sink"])
        except ValueError:
            sink = Sink.RAW
        if sink is Sink.SWIGLU:
            rows(t0, t1)
            out["HBUF"] = (t0 * f["stride"], t1 * f["stride"])
            out["ROWMAX"] = (t0, t1)
        elif sink is Sink.COMBINE:
            rows(t0, t1)
            out["OUT"] = (0, pe.out_words)
    elif op is Op.REQUANT:
        t0, t1 = f["tok_base"], f["tok_base"] + f["row_blocks"] * R
        ch = f["channels"]
        rows(t0, t1)
        out["HBUF"] = (t0 * (ch // Q), t1 * (ch // Q))
        out["ACT"] = (f["act_base"], f["act_base"] + f["row_blocks"] * (ch // GROUP))
        out["ROWMAX"] = (t0, t1)
    elif op is Op.OUTPUT:
        out["OUT"] = (0, f["row_blocks"] * R * (f["channels"] // OV))
    elif op is Op.CLEAR:
        if f["out"]:
            out["OUT"] = (0, pe.out_words)
        if f["rowmax"]:
            out["ROWMAX"] = (0, pe.tok_entries)
    elif op in (Op.SEND, Op.RECV):
        if Target(f["target"]) is Target.ROWMAX:
            out["ROWMAX"] = (f["addr"] * Q, (f["addr"] + f["words"]) * Q)
        else:
            out[Target(f["target"]).name] = (f["addr"], f["addr"] + f["words"])
    return out


class SyncChecker:
    """The protocol that makes a program's result independent of how the load engine, the
    execute engine and the requantization engine interleave (``docs/pe.md``,
    ``elmoe3d.isa``).

    The load engine runs LOADs in order; the execute engine runs everything else in order but
    hands each REQUANT to the requantization engine (which starts it when every earlier
    execute command has completed and runs it beside later GEMMs). They meet at the WMEM
    buffer flags (``LOAD.signal`` sets ``full[b]``, ``GEMM.wait`` waits for it,
    ``GEMM.release`` clears it), at ``LOAD.fence`` (the load waits until every earlier execute
    command has completed), at ``GEMM.rq_wait`` and at BARRIER. Rules, checked command by
    command in program order on word ranges (:func:`command_ranges`; :meth:`step` raises
    :class:`ProgramError` naming the command):

    1. A GEMM with ``wait`` on buffer ``b`` needs ``full[b]`` (a LOAD with ``signal`` since the
       last release); otherwise it would wait forever. ``release`` needs ``full[b]`` too.
    2. A LOAD into a WMEM plane of buffer ``b`` needs ``full[b]`` clear (the releasing GEMM comes
       first in the program) and no unreleased GEMM read of ``b`` that is not ordered before
       the load (by a BARRIER or a fence at or after it).
    3. An execute command that uses words last written by a LOAD needs that LOAD ordered before
       it: by a ``GEMM.wait`` (at or before the command) on a buffer whose signalling LOAD came
       after that LOAD (the load engine is in order), or by a BARRIER.
    4. A LOAD into words an execute command used needs that command ordered before the load: a
       BARRIER, or a LOAD with ``fence`` (the load itself or an earlier one), after the
       command.
    5. While a REQUANT is open (no BARRIER, no GEMM with ``rq_wait``, no other execute command
       since), a GEMM must not touch the ACT, TOK, HBUF or row-max words the REQUANT uses.
    6. A GEMM reads only WMEM words loaded since its buffer's last release: the weight words
       ``w_base .. w_base + col_blocks * groups - 1`` of the planes its mode reads (WMSB unless
       LSB_ONLY, WLSB in FULL and LSB_ONLY) and the scale words holding their entries
       (``w_addr >> 3``). A word loaded before the release belongs to an earlier buffer-full.

    The RTL keeps a flag per WMEM buffer half and lets a LOAD write a half as soon as the
    releasing GEMM has read it for the last time (``docs/pe.md``): that is timing, the rules
    are the same (rule 2 orders the LOAD after its releasing GEMM in the program).
    """

    REGIONS = ("W0", "W1", "ACT", "TOK", "HBUF", "OUT", "ROWMAX")

    def __init__(self, pe: PEConfig):
        self.pe = pe = pe_config(pe)
        size = {"W0": 1, "W1": 1, "ACT": pe.act_words, "TOK": pe.tok_words,
                "HBUF": pe.hbuf_words, "OUT": pe.out_words, "ROWMAX": pe.tok_entries}
        self.full = [False, False]
        self.signal_at = [-1, -1]
        self.last_load = {r: np.full(size[r], -1, np.int64) for r in self.REGIONS}
        self.exec_used = {r: np.full(size[r], -1, np.int64) for r in self.REGIONS}
        self.exec_known = -1          # every LOAD up to here completed before exec commands
        self.load_known = -1          # every exec command before here completed before LOADs
        self.rq_open = None           # (index, ranges) of a REQUANT later GEMMs may overlap
        self.held = None              # index of the GEMM whose accumulators the tile holds
        # rule 6: the WMEM words loaded since each buffer's last release, per plane
        self.filled = {(b, t): np.zeros(pe.wscale_words if t is Target.WSCALE
                                        else pe.wmem_words, bool)
                       for b in (0, 1) for t in W_TARGETS}

    def _use(self, i, op, ranges):
        for r, (lo, hi) in ranges.items():
            if hi <= lo:
                continue
            j = int(self.last_load[r][lo:hi].max())
            if j > self.exec_known:
                raise ProgramError(
                    f"command {i}: {op.name} uses {_region_name(r)} words {lo}..{hi - 1}, "
                    f"loaded by command {j} without ordering: the execute engine may run "
                    f"before that load completes (add a BARRIER, or a GEMM wait on a buffer "
                    f"signalled after command {j})")
        for r, (lo, hi) in ranges.items():
            self.exec_used[r][lo:hi] = i

    def _load(self, i, target, r, lo, hi):
        j = int(self.exec_used[r][lo:hi].max()) if hi > lo else -1
        if j >= 0 and j >= self.load_known:
            raise ProgramError(
                f"command {i}: LOAD {target.name} into {_region_name(r)} words {lo}..{hi - 1} "
                f"while command {j} on the execute engine may still use them: add a BARRIER, "
                f"or fence this load (or an earlier one after command {j})")
        self.last_load[r][lo:hi] = i

    def step(self, i: int, op, f: dict) -> None:
        op = Op(op)
        if op is Op.LOAD:
            target = Target(f["target"])
            if f.get("fence"):
                self.load_known = i
            if target in W_TARGETS:
                b = f["buf"]
                if self.full[b]:
                    raise ProgramError(
                        f"command {i}: LOAD {target.name} into WMEM buffer {b}, which is full "
                        f"(signalled by command {self.signal_at[b]}) and not yet released by a "
                        f"GEMM: the load engine would wait forever")
                j = int(self.exec_used[f"W{b}"][0])
                if j >= 0 and j >= self.load_known:
                    raise ProgramError(
                        f"command {i}: LOAD {target.name} into WMEM buffer {b} while GEMM "
                        f"command {j} may still read it (it did not release the buffer; add "
                        f"release, a BARRIER or a fence)")
                self.last_load[f"W{b}"][0] = i
                self.filled[b, target][f["addr"]:f["addr"] + f["words"]] = True
                if f["signal"]:
                    self.full[b] = True
                    self.signal_at[b] = i
            else:
                self._load(i, target, target.name, f["addr"], f["addr"] + f["words"])
            return
        if op is Op.BARRIER:
            self.exec_known = self.load_known = i
            self.rq_open = None
            return
        if op is Op.NOP:
            return
        ranges = command_ranges(self.pe, op, f)
        if op is Op.GEMM:
            b = f["wbuf"]
            if f.get("acc_cont") and self.held is None:
                raise ProgramError(f"command {i}: GEMM continues held accumulators (acc_cont), "
                                   f"but no earlier GEMM holds any (acc_hold)")
            if self.held is not None and not f.get("acc_cont"):
                raise ProgramError(f"command {i}: GEMM starts a new result while the tile holds "
                                   f"the accumulators of GEMM {self.held} (acc_hold): set "
                                   f"acc_cont, or do not hold them")
            self.held = i if f.get("acc_hold") else None
            if f["wait"]:
                if not self.full[b]:
                    raise ProgramError(
                        f"command {i}: GEMM waits on WMEM buffer {b}, which is empty (no LOAD "
                        f"with signal into it since its last release): it would wait forever")
                self.exec_known = max(self.exec_known, self.signal_at[b])
            if f.get("rq_wait"):
                self.rq_open = None
            elif self.rq_open is not None:
                q, q_ranges = self.rq_open
                for r in ("ACT", "TOK", "HBUF", "ROWMAX"):
                    if r in ranges and r in q_ranges:
                        (a0, a1), (b0, b1) = ranges[r], q_ranges[r]
                        if max(a0, b0) < min(a1, b1):
                            raise ProgramError(
                                f"command {i}: GEMM uses {_region_name(r)} words "
                                f"{max(a0, b0)}..{min(a1, b1) - 1}, which REQUANT command {q} "
                                f"may still use: set rq_wait")
            self._use(i, op, ranges)
            self._weights_filled(i, f)
            if f["release"]:
                if not self.full[b]:
                    raise ProgramError(f"command {i}: GEMM releases WMEM buffer {b}, which is "
                                       f"not full")
                self.full[b] = False
                self.exec_used[f"W{b}"][0] = -1
                for t in W_TARGETS:
                    self.filled[b, t][:] = False
            return
        self.rq_open = None                  # every other execute command waits for REQUANT
        self._use(i, op, ranges)
        if op is Op.REQUANT:
            self.rq_open = (i, ranges)


    def _weights_filled(self, i, f):
        """Rule 6: the GEMM's weight and scale words were loaded since its buffer's release."""
        n = f["col_blocks"] * f["groups"]
        if not n or not f["row_blocks"]:
            return
        b, lo = f["wbuf"], f["w_base"]
        mode = Mode(f["mode"])
        reads = [(Target.WSCALE, lo // SCALES_PER_WORD, _cdiv(lo + n, SCALES_PER_WORD))]
        if mode is not Mode.LSB_ONLY:
            reads.append((Target.WMSB, lo, lo + n))
        if mode in (Mode.FULL, Mode.LSB_ONLY):
            reads.append((Target.WLSB, lo, lo + n))
        for target, a, z in reads:
            have = self.filled[b, target][a:z]
            if len(have) < z - a or not have.all():
                w = a + (int(np.argmin(have)) if len(have) and not have.all() else len(have))
                raise ProgramError(
                    f"command {i}: GEMM reads {target.name} word {w} of WMEM buffer {b} "
                    f"(words {a}..{z - 1} for w_base {lo}), which no LOAD wrote since the "
                    f"buffer's last release: it holds an earlier buffer-full's data")


def _region_name(r):
    if r in ("W0", "W1"):
        return f"WMEM buffer {r[1]}"
    return "row max" if r == "ROWMAX" else r




# ---- memory words --------------------------------------------------------------------------------

def _word_bytes(pe):
    return pe.word_bits // 8


def words_to_ints(words) -> list[int]:
    """``uint8 [n, W/8]`` little-endian words -> Python integers."""
    words = np.ascontiguousarray(words, np.uint8)
    return [int.from_bytes(w.tobytes(), "little") for w in words]


def ints_to_words(ints, config) -> np.ndarray:
    """Python integers (each ``0 <= v < 2^W``) -> ``uint8 [n, W/8]``."""
    nb = _word_bytes(pe_config(config))
    out = np.zeros((len(ints), nb), np.uint8)
    for i, v in enumerate(ints):
        v = int(v)
        if not 0 <= v < (1 << (8 * nb)):
            raise ValueError(f"word {i}: {v:#x} does not fit {8 * nb} bits")
        out[i] = np.frombuffer(v.to_bytes(nb, "little"), np.uint8)
    return out


def _check_shape(name, arr, shape, kinds):
    arr = np.asarray(arr)
    if arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != tuple(shape):
        raise ValueError(f"{name}: expected shape [n, {', '.join(map(str, shape))}], got "
                         f"{tuple(arr.shape)}")
    if arr.dtype.kind not in kinds:
        raise ValueError(f"{name}: expected an integer array, got dtype {arr.dtype}")
    return arr


def pack_wgt(nibbles, config) -> np.ndarray:
    """WMEM plane words from nibbles ``[n, lanes, 32]`` (0..15; an MSB nibble is the
    two's-complement slice ``msb & 15``) -> ``uint8 [n, W/8]``."""
    pe = pe_config(config)
    nib = _check_shape("wgt nibbles", nibbles, (pe.lanes, GROUP), "iu")
    if nib.size and (nib.min() < 0 or nib.max() > 15):
        raise ValueError("wgt nibbles: values must lie in 0..15")
    flat = nib.astype(np.uint8).reshape(len(nib), -1)
    return (flat[:, 0::2] | (flat[:, 1::2] << 4)).astype(np.uint8)


def unpack_wgt(words, config) -> np.ndarray:
    """``uint8 [n, W/8]`` -> nibbles ``uint8 [n, lanes, 32]``."""
    pe = pe_config(config)
    w = np.asarray(words, np.uint8)
    out = np.empty((len(w), w.shape[1] * 2), np.uint8)
    out[:, 0::2] = w & 15
    out[:, 1::2] = w >> 4
    return out.reshape(len(w), pe.lanes, GROUP)


def pack_scales(bits, config) -> np.ndarray:
    """WSCALE words from FP16 bits ``[n, 8, lanes]`` (uint16, or float16 values)."""
    pe = pe_config(config)
    bits = np.asarray(bits)
    if bits.dtype == np.float16:
        bits = bits.view(np.uint16)
    bits = _check_shape("scales", bits, (SCALES_PER_WORD, pe.lanes), "iu")
    return np.ascontiguousarray(bits.astype("<u2")).view(np.uint8).reshape(len(bits), -1)


def unpack_scales(words, config) -> np.ndarray:
    """``uint8 [n, W/8]`` -> FP16 bits ``uint16 [n, 8, lanes]``."""
    pe = pe_config(config)
    w = np.ascontiguousarray(words, np.uint8)
    return w.view("<u2").astype(np.uint16).reshape(len(w), SCALES_PER_WORD, pe.lanes)


def pack_act(codes, config) -> np.ndarray:
    """ACT words from INT8 codes ``[n, rows, 32]``."""
    pe = pe_config(config)
    codes = _check_shape("act codes", codes, (pe.rows, GROUP), "i")
    try:
        as_int8_codes(codes, "act codes")
    except QuantizationError:
        raise ValueError("act codes: values must lie in -128..127") from None
    return np.ascontiguousarray(codes.astype(np.int8)).view(np.uint8).reshape(len(codes), -1)


def unpack_act(words, config) -> np.ndarray:
    """``uint8 [n, W/8]`` -> INT8 codes ``[n, rows, 32]``."""
    pe = pe_config(config)
    w = np.ascontiguousarray(words, np.uint8)
    return w.view(np.int8).reshape(len(w), pe.rows, GROUP).copy()


#: NumPy twin of one token-table entry (:data:`~elmoe3d.isa.TOK_FIELDS`, 8 bytes,
#: little-endian): ``e_x`` i1, ``e_h`` i1, ``gate`` <u2, ``slot`` u1, ``pad`` V3.
TOK_DTYPE = np.dtype([(name, f"V{bits // 8}" if name == "pad"
                       else f"<{'i' if signed else 'u'}{bits // 8}")
                      for name, bits, signed in TOK_FIELDS])
assert TOK_DTYPE.itemsize * 8 == TOK_ENTRY_BITS


def pack_tok(entries, config) -> np.ndarray:
    """TOK words from entries: a structured array of :data:`TOK_DTYPE`, or a dict of arrays
    ``e_x``, ``e_h``, ``gate`` (FP16 bits or float16 values), ``slot`` (one value per entry).
    The last word is padded with zero entries. Returns ``uint8 [ceil(n / (W/64)), W/8]``."""
    pe = pe_config(config)
    if isinstance(entries, dict):
        n = len(np.asarray(entries["slot"]))
        arr = np.zeros(n, TOK_DTYPE)
        for name, bits, signed in TOK_FIELDS[:-1]:
            v = np.asarray(entries.get(name, np.zeros(n, np.int64)))
            if v.dtype == np.float16:
                v = v.view(np.uint16)
            v = v.astype(np.int64)
            lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
            if v.shape != (n,) or (v.size and (v.min() < lo or v.max() > hi)):
                raise ValueError(f"TOK entries: {name} must be {n} values in {lo}..{hi}")
            arr[name] = v
    else:
        arr = np.asarray(entries)
        if arr.dtype != TOK_DTYPE:
            raise ValueError(f"TOK entries: expected a dict or dtype {TOK_DTYPE}")
    per = pe.tok_per_word
    nwords = _cdiv(len(arr), per)
    padded = np.zeros(nwords * per, TOK_DTYPE)
    padded[:len(arr)] = arr
    return padded.view(np.uint8).reshape(nwords, -1).copy()


def unpack_tok(words, config) -> np.ndarray:
    """``uint8 [n, W/8]`` -> entries, structured ``TOK_DTYPE [n * W/64]``."""
    w = np.ascontiguousarray(words, np.uint8)
    return w.reshape(-1).view(TOK_DTYPE).copy()


def _pack_values(name, values, config, per, dtype):
    pe = pe_config(config)
    v = _check_shape(name, values, (per(pe),), "iuf" if dtype == "<f4" else "iu")
    return np.ascontiguousarray(v.astype(dtype)).view(np.uint8).reshape(len(v), -1)


def pack_q16(values, config) -> np.ndarray:
    """HBUF words from Q16.16 values ``int32 [n, W/32]``."""
    return _pack_values("HBUF values", values, config, lambda pe: pe.q16_per_word, "<i4")


def unpack_q16(words, config) -> np.ndarray:
    return np.ascontiguousarray(words, np.uint8).view("<i4").astype(np.int32).reshape(
        len(words), -1)


def pack_q24(values, config) -> np.ndarray:
    """OUT (and RAW link) words from Q.24 values ``int64 [n, W/64]``."""
    return _pack_values("OUT values", values, config, lambda pe: pe.q24_per_word, "<i8")


def unpack_q24(words, config) -> np.ndarray:
    return np.ascontiguousarray(words, np.uint8).view("<i8").astype(np.int64).reshape(
        len(words), -1)


def pack_weight_matrix(q, scale, config):
    """WMEM words of an INT8 weight matrix for a GEMM with ``w_base = 0`` (``docs/pe.md``):
    ``q`` int8 ``[N, K]`` (K a multiple of 32), ``scale`` FP16 ``[N, K/32]`` (float16 values
    or uint16 bits). Column block ``cb`` holds channels ``cb*L .. cb*L + L-1`` (zero-padded to
    whole blocks), group ``g`` at word ``cb*G + g``; MSB nibble ``(q >> 4) & 15``, LSB nibble
    ``q & 15`` (numerics 2); scale entry ``cb*G + g``, 8 per word.

    Returns ``(msb, lsb, scales)``, ``uint8 [cbn*G, W/8]`` twice and ``[ceil(cbn*G/8), W/8]``.
    ValueError naming ``q`` (not integer codes in -128..127 of shape [N, K]) or ``scale``
    (neither float16 nor uint16, or not of shape [N, K/32]).
    """
    pe = pe_config(config)
    q = np.asarray(q)
    scale = np.asarray(scale)
    if scale.dtype == np.float16:
        scale = scale.view(np.uint16)
    elif scale.dtype != np.uint16:
        raise ValueError(f"scale: expected FP16 values (float16) or their bits (uint16), got "
                         f"dtype {scale.dtype}")
    if q.ndim != 2 or q.shape[1] % GROUP or q.dtype.kind != "i":
        raise ValueError(f"q: expected int8 codes [N, K] with K a multiple of {GROUP}, got "
                         f"{q.dtype} {tuple(q.shape)}")
    try:
        as_int8_codes(q, "q")
    except QuantizationError:
        raise ValueError(f"q: INT8 codes must lie in -128..127, got {q.min()}..{q.max()}") \
            from None
    n, k = q.shape
    L, G = pe.lanes, k // GROUP
    if scale.shape != (n, G):
        raise ValueError(f"scale: expected shape {(n, G)}, got {tuple(scale.shape)}")
    cbn = _cdiv(n, L)
    qp = np.zeros((cbn * L, k), np.int16)
    qp[:n] = q
    sp = np.zeros((cbn * L, G), np.uint16)
    sp[:n] = scale

    def planes(nib):                                    # [cbn*L, K] -> [cbn*G, L, 32]
        return nib.reshape(cbn, L, G, GROUP).transpose(0, 2, 1, 3).reshape(-1, L, GROUP)

    ent = sp.reshape(cbn, L, G).transpose(0, 2, 1).reshape(cbn * G, L)
    ent = np.concatenate([ent, np.zeros((-len(ent) % SCALES_PER_WORD, L), np.uint16)])
    ent = ent.reshape(-1, SCALES_PER_WORD, L)
    return (pack_wgt(planes((qp >> 4) & 15), pe), pack_wgt(planes(qp & 15), pe),
            pack_scales(ent, pe))


def pack_act_matrix(a_q, config) -> np.ndarray:
    """ACT words of INT8 activations ``[M, K]`` for a GEMM with ``act_base = 0``: row block
    ``rb`` (token rows ``rb*rows ..``, zero-padded to whole blocks), group ``g`` at word
    ``rb*G + g``. Returns ``uint8 [row_blocks*G, W/8]``. ValueError naming ``a_q`` (not
    integer codes in -128..127 of shape [M, K], K a multiple of 32)."""
    pe = pe_config(config)
    a = np.asarray(a_q)
    if a.ndim != 2 or a.shape[1] % GROUP or a.dtype.kind not in "iu":
        raise ValueError(f"a_q: expected integer codes [M, K] with K a multiple of {GROUP}, "
                         f"got {a.dtype} {tuple(a.shape)}")
    m, k = a.shape
    R, G = pe.rows, k // GROUP
    rbn = _cdiv(m, R)
    ap = np.zeros((rbn * R, k), np.int64)
    ap[:m] = a
    return pack_act(ap.reshape(rbn, R, G, GROUP).transpose(0, 2, 1, 3).reshape(-1, R, GROUP),
                    pe)


def pack_rowmax(values, config) -> np.ndarray:
    """ROWMAX (SEND / RECV) words from row maxima ``[n, W/32]`` (unsigned 32-bit values)."""
    pe = pe_config(config)
    v = _check_shape("ROWMAX values", values, (pe.q16_per_word,), "iu")
    if v.size and (v.min() < 0 or v.max() > UINT32_MAX):
        raise ValueError("ROWMAX values: must lie in 0..2^32-1")
    return np.ascontiguousarray(v.astype("<u4")).view(np.uint8).reshape(len(v), -1)


def unpack_rowmax(words, config) -> np.ndarray:
    """``uint8 [n, W/8]`` -> row maxima ``int64 [n, W/32]`` (0..2^32-1)."""
    return np.ascontiguousarray(words, np.uint8).view("<u4").astype(np.int64).reshape(
        len(words), -1)


def pack_fp32(values, config) -> np.ndarray:
    """``o`` DATA words from FP32 values ``float32 [n, W/32]``."""
    return _pack_values("FP32 values", np.asarray(values, np.float32), config,
                        lambda pe: pe.fp32_per_beat, "<f4")


def unpack_fp32(words, config) -> np.ndarray:
    return np.ascontiguousarray(words, np.uint8).view("<f4").astype(np.float32).reshape(
        len(words), -1)


def pack_status(values: dict, config) -> int:
    """STATUS beat data (an integer of W bits) from field values (missing ones 0)."""
    pe = pe_config(config)
    unknown = sorted(set(values) - {n for n, _ in STATUS_FIELDS})
    if unknown:
        raise ValueError(f"STATUS: unknown field(s) {', '.join(unknown)}")
    word, pos = 0, 0
    for name, bits in STATUS_FIELDS:
        v = int(values.get(name, 0))
        if not 0 <= v < (1 << bits):
            raise ValueError(f"STATUS.{name} = {v} does not fit {bits} bits")
        word |= v << pos
        pos += bits
    assert pos <= pe.word_bits
    return word


def unpack_status(word: int) -> dict:
    """STATUS beat data -> ``{field: int}``."""
    out, pos = {}, 0
    for name, bits in STATUS_FIELDS:
        out[name] = (int(word) >> pos) & ((1 << bits) - 1)
        pos += bits
    return out


@dataclass(frozen=True)
class OBeat:
    """One ``o`` beat: ``kind`` and the W data bits as an integer."""

    kind: OKind
    data: int

    def as_int(self) -> int:
        """The beat as the ``o`` payload layout's bits: kind in bit 0, data above."""
        return int(self.kind) | (int(self.data) << OKIND_BITS)

    @classmethod
    def from_int(cls, value: int) -> "OBeat":
        return cls(OKind(value & ((1 << OKIND_BITS) - 1)), int(value) >> OKIND_BITS)

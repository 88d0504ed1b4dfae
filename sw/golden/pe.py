"""Functional (ISA-level) simulator of one PE in NumPy: the reference the RTL is checked against.

The ``fsim`` beside the RTL's ``tsim`` (as in VTA): it executes an encoded command program
(``docs/pe.md``, :mod:`elmoe3d.isa`) on the golden numerics -- the tensor tile's exact lane
semantics (:mod:`.tile`, :mod:`.datapath`) and the VPU (:mod:`.vpu`) -- and returns what the PE
emits: the ``o`` beats (FP32 results, STATUS) and the ``link_o`` words.

Commands run one after the other in program order. The PE's two engines (load, execute) run
concurrently in the RTL, but a program that passes the :class:`~.asm.SyncChecker` (run here on
every command) gives the same results under any interleaving, so the order does not matter for
results. Counters are functional (beats, words); the timing counters of the STATUS beat
(:data:`~.asm.TIMING_STATUS_FIELDS`) are 0.

State (:class:`PEState`): every memory as raw little-endian words (``uint8 [words, W/8]``, the
bits the RTL holds), the per-row max registers, the sticky flags and the counters.

Phases: :func:`run` may be called any number of times on one :class:`PEState` (pass
``state=``); the calls behave as one program made of all their commands, run in turn, each
call with its own ``ld`` and ``link_i`` words (a multi-PE simulation runs every PE up to a link
exchange, moves the words, then runs the next phase). The synchronisation checker and the
command numbering carry over from call to call: command indices in errors count every command
run on the state.

Multi-PE features (``docs/pe.md``): ``GEMM.psum_in`` takes ``rows * lanes / (W/64)`` ``link_i``
words per result (the RAW layout) and adds them, saturating, into the result before its sink;
SEND / RECV of ``ROWMAX`` move the row-max registers (RECV ``accumulate``: unsigned max).

Errors: :class:`~.asm.ProgramError` naming the command index (bad field, address beyond a
memory, broken buffer-flag protocol, ``ld`` or ``link_i`` stream too short, a token slot beyond
OUT).

This module never imports Amaranth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...config import PEConfig
from ...isa import IsaError, Op, Sink, Target, decode
from . import asm
from .asm import OBeat, OKind, ProgramError, SyncChecker
from .datapath import Accumulator, Mode, accumulate, saturating_add
from .tile import lane_fields
from .vpu import combine, q24_to_fp32, requant_exponent, requant_shift, swiglu_q16


__all__ = ["PEState", "FsimResult", "run", "gemm_beats", "gemm_results"]


@dataclass
class PEState:
    """Architectural state of one PE.

    Attributes
    ----------
    pe : PEConfig
    wmsb, wlsb : uint8 ``[2, wmem_words, W/8]``
        WMEM nibble planes per buffer.
    wscale : uint8 ``[2, wscale_words, W/8]``
    act, tok, hbuf, out : uint8 ``[words, W/8]``
        IOMEM regions.
    rowmax : int64 ``[tok_entries]``
        Per token-row max |h| (Q16.16), updated by SWIGLU.
    acc_overflow, vpu_saturation : bool
        Sticky flags.
    counters : dict
        Functional counters (``gemm_beats``, ``words_loaded``, ``words_sent``,
        ``words_received``).
    full : list of bool
        WMEM buffer flags.
    sync : SyncChecker or None
        The synchronisation checker of the commands run so far (``None`` before the first
        :func:`run`), carried over between phases.
    commands_run : int
        Commands run on this state so far (the index of the next one).
    """

    pe: PEConfig
    wmsb: np.ndarray
    wlsb: np.ndarray
    wscale: np.ndarray
    act: np.ndarray
    tok: np.ndarray
    hbuf: np.ndarray
    out: np.ndarray
    rowmax: np.ndarray
    acc_overflow: bool = False
    vpu_saturation: bool = False
    counters: dict = field(default_factory=dict)
    full: list = field(default_factory=lambda: [False, False])
    #: the tile's accumulators a GEMM with ``acc_hold`` left for the next (``acc_cont``), or None
    held: Accumulator | None = None
    sync: SyncChecker | None = None
    commands_run: int = 0

    @classmethod
    def reset(cls, config) -> "PEState":
        pe = asm.pe_config(config)
        nb = pe.word_bytes

        def mem(words, *lead):
            return np.zeros((*lead, words, nb), np.uint8)

        state = cls(pe=pe, wmsb=mem(pe.wmem_words, 2), wlsb=mem(pe.wmem_words, 2),
                    wscale=mem(pe.wscale_words, 2), act=mem(pe.act_words),
                    tok=mem(pe.tok_words), hbuf=mem(pe.hbuf_words), out=mem(pe.out_words),
                    rowmax=np.zeros(pe.tok_entries, np.int64))
        state.clear_counters()
        return state

    def clear_counters(self):
        self.counters = {name: 0 for name in asm.FUNCTIONAL_STATUS_FIELDS
                         if name not in ("acc_overflow", "vpu_saturation")}

    def memory(self, target, buf: int = 0) -> np.ndarray:
        """The raw words of ``target`` (WMEM targets: of buffer ``buf``), a writable view
        (ROWMAX: a packed copy, :meth:`rowmax_words`)."""
        target = Target(target)
        if target is Target.ROWMAX:
            return self.rowmax_words()
        if target is Target.WMSB:
            return self.wmsb[buf]
        if target is Target.WLSB:
            return self.wlsb[buf]
        if target is Target.WSCALE:
            return self.wscale[buf]
        return {Target.ACT: self.act, Target.TOK: self.tok, Target.HBUF: self.hbuf,
                Target.OUT: self.out}[target]

    def rowmax_words(self) -> np.ndarray:
        """The row-max registers as ROWMAX words (``uint8 [tok_entries // (W/32), W/8]``, a
        copy): entry ``j`` of word ``a`` is the register of TOK entry ``a * W/32 + j``."""
        q = self.pe.q16_per_word
        n = len(self.rowmax) // q
        return asm.pack_rowmax(self.rowmax[:n * q].reshape(n, q), self.pe)

    # typed views
    def tok_entries(self) -> np.ndarray:
        """The token table as a structured ``TOK_DTYPE`` view (writable)."""
        return self.tok.reshape(-1).view(asm.TOK_DTYPE)

    def hbuf_values(self) -> np.ndarray:
        """HBUF as a flat int32 view (writable): ``h[t, i]`` at ``t * stride * W/32 + i``."""
        return self.hbuf.reshape(-1).view("<i4")

    def out_values(self) -> np.ndarray:
        """OUT as a flat int64 view (writable): ``out[s, c]`` at ``s * stride * W/64 + c``."""
        return self.out.reshape(-1).view("<i8")

    def status(self) -> dict:
        values = dict(self.counters)
        values.update(acc_overflow=int(self.acc_overflow),
                      vpu_saturation=int(self.vpu_saturation))
        return values


@dataclass
class FsimResult:
    """What a run emitted, and the final state.

    Attributes
    ----------
    o : list of OBeat
        ``o`` beats in order (DATA: W/32 FP32 values; STATUS: :data:`~.asm.STATUS_FIELDS`).
    link_o : list of int
        ``link_o`` words (W bits each).
    state : PEState
    ld_used, link_i_used : int
        Beats consumed from the ``ld`` and ``link_i`` streams.
    """

    o: list
    link_o: list
    state: PEState
    ld_used: int = 0
    link_i_used: int = 0

    def data(self) -> np.ndarray:
        """FP32 values of all DATA beats, ``float32 [beats, W/32]``."""
        words = [b.data for b in self.o if b.kind is OKind.DATA]
        pe = self.state.pe
        if not words:
            return np.zeros((0, pe.fp32_per_beat), np.float32)
        return asm.unpack_fp32(asm.ints_to_words(words, pe), pe)

    def statuses(self) -> list:
        """Fields of every STATUS beat (``dict`` each)."""
        return [asm.unpack_status(b.data) for b in self.o if b.kind is OKind.STATUS]


def _words_in(stream, pos, n, pe, i, what):
    if pos + n > len(stream):
        raise ProgramError(f"command {i}: needs {n} {what} words from position {pos}, but the "
                           f"stream has only {len(stream)}")
    chunk = stream[pos:pos + n]
    if isinstance(chunk, np.ndarray):
        return np.ascontiguousarray(chunk, np.uint8).reshape(n, pe.word_bytes)
    return asm.ints_to_words(chunk, pe)


def run(program, ld=(), link_i=(), *, config=None, state: PEState | None = None) -> FsimResult:
    """Execute a PE program.

    Parameters
    ----------
    program : asm.Program, or a sequence of encoded commands (ints; then pass ``config``)
    ld : sequence of int (W bits each) or ``uint8 [n, W/8]``
        The ``ld`` stream: LOADs consume it in program order.
    link_i : sequence of int or ``uint8 [n, W/8]``
        Words RECV and ``psum_in`` GEMMs take from the link port, in program order.
    config : ArchConfig or PEConfig, optional
        Needed for encoded programs; defaults to the program's.
    state : PEState, optional
        Initial state (reset if omitted); modified in place. Running on the state of an
        earlier run continues that program (phases; the module docstring).

    Returns
    -------
    FsimResult

    Raises
    ------
    ProgramError
        Naming the command index (counted from the first command run on the state).
    """
    if isinstance(program, asm.Program):
        pe = program.pe if config is None else asm.pe_config(config)
        commands = [(c.op, c.fields) for c in program]
    else:
        if config is None:
            raise TypeError("run: pass config= with an encoded program")
        pe = asm.pe_config(config)
        commands = []
        for i, w in enumerate(program):
            try:
                op, fields = decode(w)
            except IsaError as exc:
                raise ProgramError(f"command {i}: {exc}") from None
            asm.check_command(pe, i, op, fields)
            commands.append((op, fields))
    if state is None:
        state = PEState.reset(pe)
    elif state.pe != pe:
        raise ValueError(f"state: a state of a PE with word_bits={state.pe.word_bits}, "
                         f"rows={state.pe.rows}, lanes={state.pe.lanes} does not match the "
                         f"program's configuration")
    sim = _Sim(state, ld, link_i)
    base = state.commands_run
    for i, (op, fields) in enumerate(commands):
        sim.step(base + i, op, fields)
        state.commands_run = base + i + 1
    return FsimResult(o=sim.o, link_o=sim.link_o, state=state, ld_used=sim.ld_pos,
                      link_i_used=sim.link_pos)


class _Sim:
    def __init__(self, state: PEState, ld, link_i):
        self.s = state
        self.pe = state.pe
        self.ld = ld
        self.link_i = link_i
        self.ld_pos = 0
        self.link_pos = 0
        self.o: list = []
        self.link_o: list = []
        if state.sync is None:
            state.sync = SyncChecker(state.pe)
        self.sync = state.sync
        self.sync.full = list(state.full)

    def step(self, i, op, f):
        op = Op(op)
        self.sync.step(i, op, f)
        getattr(self, f"_{op.name.lower()}")(i, f)
        self.s.full = list(self.sync.full)

    # -- simple ops -------------------------------------------------------------------------------

    def _nop(self, i, f):
        pass

    def _barrier(self, i, f):
        pass

    def _load(self, i, f):
        words = _words_in(self.ld, self.ld_pos, f["words"], self.pe, i, "ld")
        self.ld_pos += f["words"]
        mem = self.s.memory(f["target"], f["buf"])
        mem[f["addr"]:f["addr"] + f["words"]] = words
        self.s.counters["words_loaded"] += f["words"]

    def _clear(self, i, f):
        if f["out"]:
            self.s.out[:] = 0
        if f["rowmax"]:
            self.s.rowmax[:] = 0
        if f["flags"]:
            self.s.acc_overflow = False
            self.s.vpu_saturation = False
        if f["counters"]:
            self.s.clear_counters()

    def _status(self, i, f):
        self.o.append(OBeat(OKind.STATUS, asm.pack_status(self.s.status(), self.pe)))

    def _link_in(self, i, n):
        words = _words_in(self.link_i, self.link_pos, n, self.pe, i, "link_i")
        self.link_pos += n
        self.s.counters["words_received"] += n
        return words

    def _send(self, i, f):
        mem = self.s.memory(f["target"])
        words = mem[f["addr"]:f["addr"] + f["words"]]
        self.link_o.extend(asm.words_to_ints(words))
        self.s.counters["words_sent"] += f["words"]

    def _recv(self, i, f):
        words = self._link_in(i, f["words"])
        if Target(f["target"]) is Target.ROWMAX:
            q = self.pe.q16_per_word
            sl = slice(f["addr"] * q, (f["addr"] + f["words"]) * q)
            new = asm.unpack_rowmax(words, self.pe).reshape(-1)
            self.s.rowmax[sl] = np.maximum(self.s.rowmax[sl], new) if f["accumulate"] else new
            return
        mem = self.s.memory(f["target"])
        sl = slice(f["addr"], f["addr"] + f["words"])
        if f["accumulate"]:
            total, flag = saturating_add(asm.unpack_q24(mem[sl], self.pe),
                                          asm.unpack_q24(words, self.pe))
            self.s.vpu_saturation |= bool(flag.any())
            mem[sl] = asm.pack_q24(total, self.pe)
        else:
            mem[sl] = words

    # -- GEMM --------------------------------------------------------------------------------------

    def _gemm(self, i, f):
        pe, s = self.pe, self.s
        mode, sink = Mode(f["mode"]), Sink(f["sink"])
        init, s.held = (s.held if f.get("acc_cont") else None), None
        acc, ovf = gemm_results(s, f, init)                 # [nblk, rbn, R, L]
        nblk, rbn = acc.shape[:2]
        s.counters["gemm_beats"] += nblk * rbn * f["groups"]
        if f.get("acc_hold"):                               # K-chained: no result yet
            s.held = Accumulator(acc.reshape(-1, pe.lanes), ovf.reshape(-1, pe.lanes))
            return
        s.acc_overflow |= bool(ovf.any())
        if f.get("psum_in"):
            # every result, in sink order, adds its RAW-layout link words: tile result first
            per_result = pe.rows * pe.lanes // pe.q24_per_word
            words = self._link_in(i, nblk * rbn * per_result)
            psum = asm.unpack_q24(words, pe).reshape(acc.shape)
            acc, pin_ovf = saturating_add(acc, psum)
            s.acc_overflow |= bool(pin_ovf.any())
        R, L = pe.rows, pe.lanes
        M = rbn * R
        t = f["tok_base"] + np.arange(M)
        # token-major results: [M, nblk, L]
        res = acc.transpose(1, 2, 0, 3).reshape(M, nblk, L)
        if sink is Sink.RAW:
            per = pe.q24_per_word
            for blk in range(nblk):
                for rb in range(rbn):
                    vals = acc[blk, rb].reshape(-1, per)
                    self.link_o.extend(asm.words_to_ints(asm.pack_q24(vals, pe)))
                    s.counters["words_sent"] += len(vals)
            return
        tok = s.tok_entries()[t]
        lanes = res[:, :, 0::2] if mode is Mode.FULL else res     # one lane per channel
        if sink is Sink.SWIGLU:
            # each half of a weight word (L/2 lanes) is [up c..c+L/4-1, gate c..c+L/4-1]:
            # DRAFT blocks hold two halves, FULL blocks one (docs/pe.md)
            p = lanes.shape[2] // 2
            q = L // 4
            pairs = lanes.reshape(M, nblk, p // q, 2, q)
            up = pairs[:, :, :, 0].reshape(M, nblk * p)
            gate = pairs[:, :, :, 1].reshape(M, nblk * p)
            h, satd = swiglu_q16(up, gate, tok["e_x"].astype(np.int64)[:, None])
            s.vpu_saturation |= bool(satd.any())
            row = f["stride"] * pe.q16_per_word
            idx = t[:, None] * row + f["out_base"] + np.arange(nblk * p)[None, :]
            s.hbuf_values()[idx] = h
            m = np.abs(h.astype(np.int64)).max(axis=1)
            # the block that writes channel 0 of a row starts its max (docs/pe.md)
            start = f["out_base"] == 0 and not f.get("max_keep")
            s.rowmax[t] = m if start else np.maximum(s.rowmax[t], m)
            return
        # COMBINE
        c = lanes.shape[2]
        y = lanes.reshape(M, nblk * c)
        row = f["stride"] * pe.q24_per_word
        slots = tok["slot"].astype(np.int64)
        bad = slots * f["stride"] + f["stride"] > pe.out_words
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise ProgramError(f"command {i}: GEMM COMBINE: TOK entry {t[r]} has slot "
                               f"{slots[r]}, whose OUT row (stride {f['stride']}) lies beyond "
                               f"the {pe.out_words} OUT words")
        outv = s.out_values()
        cols = f["out_base"] + np.arange(nblk * c)
        for m in range(M):                                   # rows in order (saturation order)
            idx = slots[m] * row + cols
            new, flag = combine(outv[idx][None, :], np.zeros((1, len(cols)), bool),
                                y[m][None, :], tok["e_h"][m:m + 1].astype(np.int64),
                                tok["gate"][m:m + 1].astype(np.uint16))
            outv[idx] = new[0]
            s.vpu_saturation |= bool(flag.any())

    # -- VPU ops -----------------------------------------------------------------------------------

    def _requant(self, i, f):
        pe, s = self.pe, self.s
        R = pe.rows
        ch = f["channels"]
        groups = ch // 32
        M = f["row_blocks"] * R
        live = M - f.get("pad_rows", 0)            # the rows after are padding: zero codes
        t = f["tok_base"] + np.arange(live)
        row = ch                                            # stride * W/32 == channels
        h = s.hbuf_values()[t[:, None] * row + np.arange(ch)[None, :]]
        e_prime = requant_exponent(s.rowmax[t])
        h_q = np.zeros((M, ch), np.int64)
        h_q[:live], clipped = requant_shift(h, e_prime[:, None])
        s.vpu_saturation |= bool(clipped.any())
        codes = h_q.reshape(f["row_blocks"], R, groups, 32).transpose(0, 2, 1, 3)
        words = asm.pack_act(codes.reshape(-1, R, 32), pe)
        s.act[f["act_base"]:f["act_base"] + len(words)] = words
        tok = s.tok_entries()
        tok["e_h"][t] = (e_prime - 16).astype(np.int8)

    def _output(self, i, f):
        pe, s = self.pe, self.s
        ch = f["channels"]
        M = f["row_blocks"] * pe.rows
        if f.get("raw"):                                    # the OUT words themselves
            for w in asm.words_to_ints(s.out[:M * ch // pe.q24_per_word]):
                self.o.append(OBeat(OKind.DATA, w))
            return
        vals = s.out_values()[:M * ch].reshape(M, ch)        # stride * W/64 == channels
        fp = q24_to_fp32(vals).reshape(-1, pe.fp32_per_beat)
        for w in asm.words_to_ints(asm.pack_fp32(fp, pe)):
            self.o.append(OBeat(OKind.DATA, w))


def _gemm_operands(state: PEState, f: dict):
    """Activation codes ``int8 [rbn, G, R, 32]``, weight nibbles ``[cbn, G, L, 32]`` of the MSB
    and LSB planes and FP16 scale bits ``[cbn, G, L]`` a GEMM reads."""
    pe = state.pe
    G, rbn, cbn = f["groups"], f["row_blocks"], f["col_blocks"]
    a_idx = f["act_base"] + np.arange(rbn)[:, None] * G + np.arange(G)[None, :]
    act = asm.unpack_act(state.act[a_idx.reshape(-1)], pe).reshape(rbn, G, pe.rows, 32)
    w_idx = (f["w_base"] + np.arange(cbn)[:, None] * G + np.arange(G)[None, :]).reshape(-1)
    b = f["wbuf"]
    msb = asm.unpack_wgt(state.wmsb[b][w_idx], pe).reshape(cbn, G, pe.lanes, 32)
    lsb = asm.unpack_wgt(state.wlsb[b][w_idx], pe).reshape(cbn, G, pe.lanes, 32)
    scl_all = asm.unpack_scales(state.wscale[b], pe).reshape(-1, pe.lanes)   # entries
    scl = scl_all[w_idx].reshape(cbn, G, pe.lanes)
    return act, msb, lsb, scl


def _lane_operands(mode, msb, lsb, scl):
    """Per result block (cb, half): lane nibbles ``[nblk, G, L, 32]`` and lane scales
    ``[nblk, G, L]`` as the address generation feeds the tile (``docs/pe.md``)."""
    mode = Mode(mode)
    if mode is not Mode.FULL:
        return (lsb if mode is Mode.LSB_ONLY else msb), scl
    cbn, G, L, K = msb.shape
    h = L // 2
    nib = np.empty((cbn, 2, G, L, K), np.uint8)
    sc = np.empty((cbn, 2, G, L), np.uint16)
    for half in range(2):
        nib[:, half, :, 0::2] = msb[:, :, half * h:(half + 1) * h]
        nib[:, half, :, 1::2] = lsb[:, :, half * h:(half + 1) * h]
        sc[:, half, :, 0::2] = scl[:, :, half * h:(half + 1) * h]
        sc[:, half, :, 1::2] = scl[:, :, half * h:(half + 1) * h]
    return nib.reshape(cbn * 2, G, L, K), sc.reshape(cbn * 2, G, L)


def gemm_beats(state: PEState, f: dict) -> dict:
    """The tile beats a GEMM command issues, in the order of ``docs/pe.md`` (cb, half, rb, g),
    as a beat dict of :mod:`.tile` (``act``, ``wgt``, ``scale``, ``mode``, ``first``,
    ``last``). For checking the address generation against :func:`.tile.ref_tile`."""
    act, msb, lsb, scl = _gemm_operands(state, f)
    nib, sc = _lane_operands(f["mode"], msb, lsb, scl)
    nblk, G = nib.shape[:2]
    rbn = act.shape[0]
    shape = (nblk, rbn, G)
    n = nblk * rbn * G
    g = np.broadcast_to(np.arange(G), shape).reshape(n)
    return {
        "act": np.ascontiguousarray(np.broadcast_to(act[None], shape + act.shape[2:])
                                    .reshape(n, *act.shape[2:])),
        "wgt": np.ascontiguousarray(np.broadcast_to(nib[:, None], shape + nib.shape[2:])
                                    .reshape(n, *nib.shape[2:])),
        "scale": np.ascontiguousarray(np.broadcast_to(sc[:, None], shape + sc.shape[2:])
                                      .reshape(n, sc.shape[2])),
        "mode": np.full(n, int(f["mode"]), np.int64),
        "first": (g == 0) & (not f.get("acc_cont")),
        "last": (g == G - 1) & (not f.get("acc_hold")),
    }


def gemm_results(state: PEState, f: dict, init: Accumulator | None = None):
    """Tile results of a GEMM command, computed block-parallel with the tile's exact lane
    semantics (equal to :func:`.tile.ref_tile` of :func:`gemm_beats`). ``init``: the
    accumulators (``[rows, lanes]``) a K-chained GEMM (``acc_cont``, one result) starts from.

    Returns
    -------
    (acc, overflow) : int64 and bool arrays ``[nblk, row_blocks, rows, lanes]``, blocks in
    (cb, half) order.
    """
    mode = Mode(f["mode"])
    act, msb, lsb, scl = _gemm_operands(state, f)
    nib, sc = _lane_operands(mode, msb, lsb, scl)
    nblk, G, L, K = nib.shape
    rbn, _, R, _ = act.shape
    field_ = lane_fields(nib, mode, lane_axis=2)
    # adder trees: tree[m, blk, l, g] = sum_k a[m, g, k] * field[blk, g, l, k]; |tree| <= 2^16,
    # exact in float32 in any summation order.
    a = act.transpose(0, 2, 1, 3).reshape(rbn * R, G, K).astype(np.float32)   # [M, G, K]
    w = field_.astype(np.float32).transpose(1, 3, 0, 2).reshape(G, K, nblk * L)  # [G, K, N]
    tree = np.matmul(a.transpose(1, 0, 2), w).astype(np.int64)                  # [G, M, N]
    tree = tree.transpose(1, 2, 0)                                               # [M, N, G]
    if mode is Mode.FULL:
        psum = np.zeros_like(tree)
        psum[:, 0::2] = (tree[:, 0::2] << 3) + tree[:, 1::2]
    elif mode is Mode.LSB_ONLY:
        psum = tree
    else:
        psum = tree << 3
    scale = sc.transpose(0, 2, 1).reshape(nblk * L, G).view(np.float16)
    state_acc = accumulate(psum, scale, init)
    acc = state_acc.acc.reshape(rbn, R, nblk, L).transpose(2, 0, 1, 3)
    ovf = state_acc.overflow.reshape(rbn, R, nblk, L).transpose(2, 0, 1, 3)
    return np.ascontiguousarray(acc), np.ascontiguousarray(ovf)


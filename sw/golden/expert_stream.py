"""Real expert shapes on one PE: the streamed expert program (paper Sections 4.1 and 5.2;
``docs/pe.md`` "Real expert shapes").

:func:`build_moe_program` (``expert.py``) keeps a whole expert's weights of one column block,
its activations and its outputs in the PE's memories; real experts (H = 2048 ... 4096,
I = 768 ... 14336) do not fit that way in the paper's 32 KB WMEM and 32 KB IOMEM. This builder
runs one expert of any shape the PE's memories can stage, over any number of tokens:

* **token tiles** of one row block (``rows`` tokens): TOK entries, x (INT8 codes, all of K)
  and h (Q16.16, then its INT8 codes) of the tile stay in IOMEM; the weights stream through
  WMEM once per tile;
* **K tiling**: a column block whose K does not fit a WMEM buffer is cut into buffer-fulls of
  groups, summed in the tile's Q.24 accumulators by K-chained GEMMs (``acc_hold`` /
  ``acc_cont``: exact and order-independent, numerics 5);
* **FULL as LSB_ONLY + MSB_ONLY**: each column block's LSB_ONLY GEMMs, then its MSB_ONLY
  GEMMs continuing the same accumulators (``MSB_ONLY + LSB_ONLY == FULL``, numerics 3), so
  every weight word is read once per beat and fully used; the result has the DRAFT block
  layout, so DRAFT and FULL write the same channels at the same places;
* **output-channel tiling**: the down projection's outputs are produced ``out_chunk``
  channels at a time into OUT, emitted by OUTPUT (FP32) and cleared, so OUT holds one chunk
  of the tile's rows.

The loop nest (``docs/pe.md``)::

    for tile of rows tokens:                       # LOAD TOK, LOAD ACT x (fenced)
        for cb in up/gate column blocks:           # 2I/L blocks, interleaved up|gate
            for k-chunk in H/32 groups:            # WMEM buffer-fulls, double-buffered
                GEMM SWIGLU (DRAFT) | LSB_ONLY then MSB_ONLY (FULL), chained over k
        REQUANT                                    # HBUF -> ACT h codes, e_h -> TOK
        for chunk of out_chunk output channels:
            for cb in the chunk's down column blocks:
                for k-chunk in I/32 groups:
                    GEMM COMBINE, chained over k
            OUTPUT chunk; CLEAR out

Stationary: the tile's x and h in IOMEM; streamed: every weight byte, once per tile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...isa import Sink, Source, Target
from .asm import Program, ProgramError, pack_act, pack_scales, pack_tok, pack_wgt, pe_config
from .asm import words_to_ints
from .datapath import Mode
from .vpu import q24_to_fp32
from .expert import PEJob, _gate_bits, _mode, as_expert, check_x, nibbles, updown_order
from .quant import QuantizedWeight, quantize_activations


__all__ = ["StreamedJob", "StreamPlan", "plan_expert_stream", "build_streamed_expert_program",
           "place_chunks", "WeightImage", "Placement",
           "stream_pe_program", "ROLES", "padded_matrix", "tile_head"]


@dataclass(frozen=True)
class StreamPlan:
    """Where one expert of shape H x I sits in a PE (:func:`plan_expert_stream`). Memory
    figures are words of the named memory.

    Attributes
    ----------
    hidden, intermediate : int
    tile_tokens : int
        Tokens per token tile (the PE's ``rows``: one row block).
    x_stream : bool
        False: the tile's x (H/32 ACT words) stays in ACT at its top, loaded once per tile.
        True: x does not fit beside the h codes written while up/gate runs; each up/gate
        buffer-full brings its K chunk of x into one of two ACT slots (fenced LOADs,
        :meth:`x_slots`), so x streams once per column block (per pass).
    x_base, x_chunk : int
        ACT word of x (resident); groups per x slot (streamed: the smallest, in the last chunk).
    h_base, h_act : int
        ACT word (0) and words (I/32) of the tile's h codes (REQUANT's output, the down GEMMs'
        K).
    i_chunk : int
        Intermediate channels per HBUF pass (``rows * i_chunk / (W/32)`` HBUF words). Equal to
        I: one pass. Smaller: two passes over up/gate (the first only for the row max |h|, the
        second chunk by chunk with ``max_keep``, each chunk requantized with the full row's
        exponent).
    passes : int
        1 or 2 (up/gate weights stream once or twice per tile).
    out_chunk : int
        Output channels per OUT chunk (a multiple of ``lanes`` and of W/32).
    hidden_out : int
        H rounded up to whole OUT chunks' steps (lcm(lanes, W/32)): the down projection's
        output rows beyond H are zero weights, their outputs dropped by ``decode``.
    """

    hidden: int
    intermediate: int
    tile_tokens: int
    x_stream: bool
    x_base: int
    x_chunk: int
    h_base: int
    h_act: int
    i_chunk: int
    passes: int
    out_chunk: int
    hidden_out: int
    act_words: int = 0
    wmem_words: int = 0

    def x_slots(self, written: int) -> tuple:
        """Streamed x: ``(ACT word, groups)`` of the two x slots while ``written`` words of h
        codes are in ACT (0 in a single pass and the first of two; the codes of the chunks
        done in the second): the slots sit right above the codes, as large as ACT allows (at
        most a WMEM buffer of groups)."""
        return written, min(self.wmem_words, (self.act_words - written) // 2)


def plan_expert_stream(hidden: int, intermediate: int, config, *,
                       raw_output: bool = False) -> StreamPlan:
    """Check that an expert of shape ``hidden`` x ``intermediate`` can stream through the PE of
    ``config`` (ArchConfig or PEConfig) and place it (``docs/pe.md`` "Real expert shapes").
    ``raw_output``: the outputs leave as Q.24 OUT words (OUTPUT raw), so an OUT chunk is whole
    OUT words (W/64 channels) rather than whole FP32 beats (W/32).

    Raises :class:`~.asm.ProgramError` (one line naming the tensor, the dimension and the
    memory that overflows, with the figures) otherwise."""
    pe = pe_config(config)
    R, L, W = pe.rows, pe.lanes, pe.word_bits
    H, I = int(hidden), int(intermediate)
    q16, q24, fp = pe.q16_per_word, pe.q24_per_word, pe.fp32_per_beat
    where = f"expert H={H} x I={I}"
    for dim, v, need, why in (
            ("H", H, 32, "weight groups of 32 along K of up/gate"),
            ("I", I, 32, "weight groups of 32 along K of down"),
            ("I", I, q16, f"whole HBUF words of W/32 = {q16} Q16.16 values (REQUANT)"),
            ("I", I, L // 2, f"whole up/gate column blocks of {L // 2} channels")):
        if v % need:
            raise ProgramError(f"{where}: {dim} = {v} is not a multiple of {need} ({why}); pad "
                               f"the weights with zero groups")
    words = f"({W // 8} B each)"
    x_act, h_act = H // 32, I // 32
    if R > pe.tok_entries:
        raise ProgramError(f"{where}: TOK overflows: a row block's {R} entries exceed the "
                           f"{pe.tok_entries} TOK entries")
    # HBUF: R rows of i_chunk Q16.16 values; a chunk is whole HBUF words, whole REQUANT groups
    # and whole up/gate column blocks (L/2 channels)
    step = int(np.lcm.reduce([q16, 32, L // 2]))
    i_chunk = min(I, pe.hbuf_words // R * q16 // step * step)
    if i_chunk < step:
        raise ProgramError(
            f"{where}: HBUF overflows: a row block's h ({R} rows of at least {step} Q16.16 "
            f"channels) needs {R * step // q16} of the {pe.hbuf_words} HBUF words {words}")
    while I % i_chunk:                              # equal chunks: every pass the same shape
        i_chunk -= step
    # ACT: the h codes from word 0 (written by REQUANT: at the end of a single pass, chunk by
    # chunk in the second of two); x resident at the top while up/gate runs, if it fits beside
    # the codes written meanwhile, else streamed through two slots above them
    act = pe.act_words
    written = (I // i_chunk - 1) * (i_chunk // 32)
    if h_act > act:
        raise ProgramError(
            f"{where}: ACT overflows: a row block's h codes (I/32 = {h_act} words) exceed the "
            f"{act} ACT words {words}; split I across PEs (tensor parallelism) or give ACT more "
            f"of IOMEM (ArchConfig.iomem_split)")
    x_stream = x_act + written > act
    if not x_stream:
        x_base, x_chunk = act - x_act, x_act
    else:
        x_base, x_chunk = 0, min(pe.wmem_words, (act - written) // 2)
        if x_chunk < 1:
            raise ProgramError(
                f"{where}: ACT overflows: the h codes written during the second pass "
                f"({written} words) and two x slots of at least one group need {written + 2} of "
                f"the {act} ACT words {words}; split I across PEs (tensor parallelism)")
    h_base = 0
    # OUT: R rows of out_chunk Q.24 values, a multiple of lanes (a COMBINE block) and of W/32
    # (an FP32 OUTPUT beat) or W/64 (a raw one)
    step = int(np.lcm(L, q24 if raw_output else fp))
    hidden_out = -(-H // step) * step
    out_chunk = min(hidden_out, (pe.out_words // R * q24) // step * step)
    if out_chunk < step:
        raise ProgramError(
            f"{where}: OUT overflows: a row block's {R} rows of {step} Q.24 channels (one "
            f"{'raw' if raw_output else 'FP32'} OUTPUT beat, one COMBINE block) need "
            f"{R * step // q24} of the {pe.out_words} OUT words {words}"
            f"{'' if raw_output else '; OUTPUT raw needs ' + str(R * int(np.lcm(L, q24)) // q24)}")
    return StreamPlan(hidden=H, intermediate=I, tile_tokens=R, x_stream=x_stream,
                      x_base=x_base, x_chunk=x_chunk, h_base=h_base, h_act=h_act,
                      i_chunk=i_chunk, passes=1 if i_chunk == I else 2, out_chunk=out_chunk,
                      hidden_out=hidden_out, act_words=act, wmem_words=pe.wmem_words)


def place_chunks(chunks, vals, tokens: int, hidden: int, dtype) -> np.ndarray:
    """The ``[tokens, hidden]`` outputs from the values of a streamed program's OUTPUTs in
    order (``chunks``: ``(token0, rows, channel0, channels)`` per OUTPUT; rows beyond
    ``tokens`` and channels beyond ``hidden``, the padding, are dropped). Raises ProgramError
    when the count of values differs from what the OUTPUTs emit."""
    out = np.zeros((tokens, hidden), dtype)
    pos = 0
    for t0, rows, c0, ch in chunks:
        block = vals[pos:pos + rows * ch].reshape(rows, ch)
        pos += rows * ch
        n, c1 = min(rows, tokens - t0), min(c0 + ch, hidden)
        out[t0:t0 + n, c0:c1] = block[:n, :c1 - c0]
    if pos != vals.size:
        raise ProgramError(f"decode: {vals.size} output values, the program's OUTPUTs emit "
                           f"{pos}")
    return out


@dataclass(eq=False)
class StreamedJob(PEJob):
    """A :class:`~.expert.PEJob` of the streamed expert program; its OUTPUT beats come per
    token tile and OUT chunk (:meth:`decode` puts them in place)."""

    plan: StreamPlan | None = None
    chunks: list = field(default_factory=list)        # (token0, rows, ch0, channels) per OUTPUT
    raw_output: bool = False

    def decode(self, result) -> np.ndarray:
        """``float32 [T, H]`` from the DATA beats of a run (anything with ``.data()``); with
        ``raw_output`` the beats' bits are Q.24 values, converted here (``q24_to_fp32``, the
        golden model of the PE's FP32 conversion).

        Raises ``TypeError`` naming ``result`` for anything without a ``data()`` method (None,
        the job itself), and :class:`~.asm.ProgramError` when the count of values differs from
        what the program's OUTPUTs emit (the result of another program)."""
        if not callable(getattr(result, "data", None)):
            raise TypeError(f"decode: result: expected the result of a run (job.run_fsim(), "
                            f"or anything with .data()), got {type(result).__name__}")
        if self.raw_output:
            q = np.ascontiguousarray(result.data()).view(np.int64).reshape(-1)
            return q24_to_fp32(self._place(q, np.int64))
        return self._place(result.data().reshape(-1), np.float32)

    def _place(self, vals, dtype):
        return place_chunks(self.chunks, vals, self.tokens, self.hidden, dtype)

class _Matrix:
    """A weight matrix (rows ``order`` of ``qw``) in column blocks of L rows and K chunks of at
    most ``wmem_words`` groups: the buffer-fulls of the stream."""

    def __init__(self, qw: QuantizedWeight, order, pe, name: str):
        L = pe.lanes
        self.name = name
        q = qw.q[order]
        scale = np.asarray(qw.scale, np.float16).view(np.uint16)[order]
        n, k = q.shape
        self.groups, self.n_cb = k // 32, n // L
        msb, lsb = nibbles(q)
        self.msb = msb.reshape(self.n_cb, L, self.groups, 32).transpose(0, 2, 1, 3)
        self.lsb = lsb.reshape(self.n_cb, L, self.groups, 32).transpose(0, 2, 1, 3)
        self.scl = scale.reshape(self.n_cb, L, self.groups).transpose(0, 2, 1)   # [cb, g, L]
        self.pe = pe

    def fulls(self, cbs, per=None):
        """Buffer-fulls over column blocks ``cbs``: ``(cb0, n_cb, g0, g1)`` each. Whole column
        blocks share a buffer when K fits ``per`` groups (default a WMEM buffer; DRAFT: one
        GEMM of n blocks; FULL: a chain per block); otherwise one block's K is cut into chunks
        of at most ``per`` groups."""
        per, G = per or self.pe.wmem_words, self.groups
        if G <= per:
            n = per // G
            return [(c, min(n, cbs.stop - c), 0, G) for c in range(cbs.start, cbs.stop, n)]
        return [(c, 1, g0, min(g0 + per, G)) for c in cbs for g0 in range(0, G, per)]

    def words(self, cb0, n, g0, g1, full):
        """The buffer-full's LOADs: ``[(target, uint8 words, key)]`` (w_base 0; ``key`` names
        the words for a :class:`WeightImage`: the matrix, the plane and the cut)."""
        pe, L = self.pe, self.pe.lanes
        sl = (slice(cb0, cb0 + n), slice(g0, g1))
        cut = (self.name, cb0, n, g0, g1)
        loads = []
        if full:
            loads.append((Target.WLSB, pack_wgt(self.lsb[sl].reshape(-1, L, 32), pe),
                          cut + ("LSB",)))
        loads.append((Target.WMSB, pack_wgt(self.msb[sl].reshape(-1, L, 32), pe),
                      cut + ("MSB",)))
        ent = self.scl[sl].reshape(-1, L)
        padded = np.zeros((-(-len(ent) // 8) * 8, L), np.uint16)
        padded[:len(ent)] = ent
        loads.append((Target.WSCALE, pack_scales(padded.reshape(-1, 8, L), pe),
                      cut + ("scales",)))
        return loads


class WeightImage:
    """The weight words of one memory (a PE's HB bank, or external memory) from word 0, as the
    streamed programs read them: every distinct buffer-full LOAD (matrix, plane, column blocks,
    K groups: the ``key`` of :meth:`_Matrix.words`) is placed once, in the order first asked;
    the same LOAD again (the next token tile, the second pass) reads the same addresses.

    Attributes
    ----------
    words : list of int
        W-bit words from address 0.
    """

    def __init__(self):
        self.words: list = []
        self._addr: dict = {}

    def place(self, key, words) -> int:
        """Address of ``words`` (uint8 ``[n, W/8]``) under ``key``, placed at the end on first
        use."""
        if key not in self._addr:
            self._addr[key] = len(self.words)
            self.words.extend(words_to_ints(words))
        return self._addr[key]


@dataclass
class Placement:
    """Where a streamed program's weight LOADs read from (paper Section 5.2, "MSB-LSB weight
    asynchronous processing"): the MSB planes and scales from the PE's HB bank (``hb``); the
    LSB planes of a FULL program from the HB bank too, or, with ``ext``, from external memory
    over the streamline ring (the placement of an HB-cached expert: its MSB slice in HB, its
    LSB slice in EXT; ``tag`` keeps the PEs' slices apart in the shared EXT image).

    ``ext_reads`` collects the program's EXT LOADs in order: ``(ext address, words, what)``."""

    hb: WeightImage = field(default_factory=WeightImage)
    ext: WeightImage | None = None
    tag: object = None
    ext_reads: list = field(default_factory=list)

    def source(self, target, key, words) -> tuple:
        """``(Source, hb_addr)`` of a LOAD of ``words`` into ``target``; an EXT read is recorded
        in ``ext_reads``."""
        if target is Target.WLSB and self.ext is not None:
            addr = self.ext.place((self.tag,) + key, words)
            self.ext_reads.append((addr, len(words), f"{key[0]} LSB"))
            return Source.EXT, 0
        return Source.HB, self.hb.place(key, words)


def build_streamed_expert_program(x, expert, gate_weights=None, mode=Mode.FULL, config=None,
                                  *, name: str = "expert",
                                  raw_output: bool = False) -> StreamedJob:
    """PE program and ``ld`` stream of one expert of a real shape over the tokens of ``x``
    (module docstring: token tiles, K-chained GEMMs, FULL as LSB_ONLY + MSB_ONLY, OUT chunks).
    Equal bit for bit to :func:`~.expert.ref_expert` with the same arguments.

    Parameters
    ----------
    x : float ``[T, H]``
    expert : :class:`~.expert.Expert` or ``(w_up, w_gate, w_down)`` float matrices
        (``[I, H]``, ``[I, H]``, ``[H, I]``).
    gate_weights : float ``[T]``, optional (default 1)
    mode : Mode.FULL or Mode.DRAFT (DRAFT loads only the MSB planes)
    config : ArchConfig or PEConfig (required)

    Returns a :class:`StreamedJob`; ``info`` holds ``tiles``, ``gemm_beats``, ``ld_words``,
    ``weight_words``, ``act_words`` (the ld words of each kind), ``commands``.

    Raises
    ------
    ProgramError
        The shape does not fit the PE (:func:`plan_expert_stream`), or an exponent does not
        fit its TOK field.
    """
    if config is None:
        raise TypeError("build_streamed_expert_program: pass config= (an ArchConfig or "
                        "PEConfig)")
    pe = pe_config(config)
    mode = _mode(mode)
    if mode not in (Mode.FULL, Mode.DRAFT):
        raise ValueError(f"mode: expected FULL or DRAFT, got {mode.name}")
    ex = as_expert(expert, name)
    x = np.asarray(x)
    T = check_x(x, ex)
    gw = _gate_bits(np.ones(T) if gate_weights is None else gate_weights, T)
    plan = plan_expert_stream(ex.hidden, ex.intermediate, pe, raw_output=raw_output)
    xq = quantize_activations(x, name="x")
    e_x = np.asarray(xq.exp, np.int64)
    if e_x.size and (e_x.min() < -128 or e_x.max() > 127):
        raise ProgramError(f"x: activation exponents {e_x.min()}..{e_x.max()} do not fit the "
                           f"TOK entry's signed 8-bit e_x (scale the input)")
    prog, ld, info, chunks = stream_pe_program(pe, plan, ex, xq.q, e_x, gw, mode,
                                               raw_output=raw_output)
    return StreamedJob(program=prog, ld=ld, tokens=T, hidden=ex.hidden, info=info, plan=plan,
                       chunks=chunks, raw_output=raw_output)


def padded_matrix(qw: QuantizedWeight, rows: int, pe, name: str) -> "_Matrix":
    """A weight matrix ``[N, K]`` padded with zero rows (zero codes and scales) to ``rows``
    output channels, as a :class:`_Matrix` of the stream (the padding's outputs are dropped by
    ``decode``)."""
    n, k = qw.q.shape
    q = np.zeros((rows, k), qw.q.dtype)
    q[:n] = qw.q
    s = np.zeros((rows, k // 32), np.asarray(qw.scale).dtype)
    s[:n] = qw.scale
    return _Matrix(QuantizedWeight(q=q, scale=s, name=qw.name), np.arange(rows), pe, name)


def tile_head(pe, x_q, e_x, gw_bits, t0: int, x_base: int | None, e_h=None) -> tuple:
    """The IOMEM LOADs that open the token tile from token ``t0`` (``pe.rows`` rows; those
    past the tokens are padding: zero x, gate 0, which the COMBINE sink skips): its TOK words
    (``e_x``, ``e_h`` if given, else 0 for REQUANT to write, the gate-weight FP16 bits
    ``gw_bits``, slot = row) and, with ``x_base``, its x resident in ACT from that word.
    Returns ``(head, x_rows)``: the ``(Target, addr, words)`` LOADs and the tile's x as
    ``[K/32, R, 32]`` INT8 (what a streamed x's slots take)."""
    R, T = pe.rows, len(x_q)
    rows = min(R, T - t0)
    tok = {"e_x": np.zeros(R, np.int64), "e_h": np.zeros(R, np.int64),
           "gate": np.zeros(R, np.uint16), "slot": np.arange(R, dtype=np.int64)}
    tok["e_x"][:rows] = e_x[t0:t0 + rows]
    if e_h is not None:
        tok["e_h"][:rows] = e_h[t0:t0 + rows]
    tok["gate"][:rows] = gw_bits[t0:t0 + rows]
    K = x_q.shape[1]
    xp = np.zeros((R, K), np.int8)
    xp[:rows] = x_q[t0:t0 + rows]
    x_rows = xp.reshape(R, K // 32, 32).transpose(1, 0, 2)                 # [g, R, 32]
    head = [(Target.TOK, 0, pack_tok(tok, pe))]
    if x_base is not None:
        head.append((Target.ACT, x_base, pack_act(x_rows, pe)))
    return head, x_rows


class _FullStream:
    """The buffer-fulls of a streamed program in program order, then their emission (one
    place for the expert program, :func:`stream_pe_program`, and the plain GEMM's,
    :func:`stream_linear_program`). A buffer-full is a dict: ``loads`` (its weight LOADs),
    ``gemms`` (GEMM fields), ``head`` (IOMEM LOADs before the weights: a tile's TOK and x, or
    a streamed x chunk; the first fenced), ``before`` / ``after`` (execute commands around
    the GEMMs), ``late`` (its x slot overlaps the previous full's: its loads wait for that
    full's GEMMs)."""

    def __init__(self, pe, full: bool, placement: Placement):
        self.pe, self.full, self.placement = pe, full, placement
        self.fulls: list = []
        self._x_prev: list = []                   # ACT words of the last x slot used

    def __len__(self):
        return len(self.fulls)

    def matrix(self, mat, cbs, gemm_of, before=(), per=None, x_rows=None, x_base=0):
        """Append the buffer-fulls of ``mat``'s column blocks ``cbs`` (:meth:`_Matrix.fulls`
        at ``per`` groups); ``gemm_of(cb)`` gives a block's GEMM fields (``psum_in`` on its
        last GEMM); ``before`` runs ahead of the first full's GEMMs; ``x_rows`` (``[g, R,
        32]`` INT8): x streams, each full's K chunk into the free one of two ``per``-group
        ACT slots from ``x_base``."""
        full, fulls, x_prev = self.full, self.fulls, self._x_prev
        first = True
        for cb0, n, g0, g1 in mat.fulls(cbs, per):
            G = mat.groups
            gemms = []
            head = []
            act_base = None
            late = False
            if x_rows is not None:                 # streamed x: this chunk into a slot
                # the slot the previous buffer-full (maybe still running) does not use; where
                # the slots moved (the next chunk of the second pass) and both overlap it, the
                # loads wait for that full's GEMMs (emitted after them, fenced)
                free = [x_base + i * per for i in (0, 1)
                        if not (x_prev and x_base + i * per < x_prev[1]
                                and x_prev[0] < x_base + (i + 1) * per)]
                late = not free
                slot = free[0] if free else x_base
                x_prev[:] = [slot, slot + (g1 - g0)]
                head = [(Target.ACT, slot, pack_act(x_rows[g0:g1], self.pe))]
                act_base = slot
            for j in range(n):
                cb = cb0 + j
                base = dict(wbuf=0, act_base=0, w_base=j * (g1 - g0), row_blocks=1,
                            col_blocks=1, groups=g1 - g0, tok_base=0)
                base.update(gemm_of(cb))
                base["act_base"] = act_base if act_base is not None else base["act_base"] + g0
                pin = base.pop("psum_in", False)
                if full:
                    gemms.append(dict(base, mode=Mode.LSB_ONLY, acc_cont=g0 > 0,
                                      acc_hold=True))
                    gemms.append(dict(base, mode=Mode.MSB_ONLY, acc_cont=True,
                                      acc_hold=g1 < G, psum_in=pin and g1 == G))
                elif n > 1 and g1 - g0 == G:
                    if j == 0:                             # one DRAFT GEMM of n blocks
                        gemms.append(dict(base, mode=Mode.DRAFT, col_blocks=n, psum_in=pin))
                else:
                    gemms.append(dict(base, mode=Mode.DRAFT, acc_cont=g0 > 0, acc_hold=g1 < G,
                                      psum_in=pin and g1 == G))
            fulls.append(dict(loads=mat.words(cb0, n, g0, g1, full), gemms=gemms,
                              before=list(before) if first else [], head=head, late=late))
            first = False

    def emit(self, prog, ld: list, counts: dict) -> int:
        """Emit the program after its first CLEAR: the loads of buffer-full m follow the GEMMs
        of full m - 2 (its buffer's last user, which releases it); a tile's TOK and x (fenced:
        every execute command before them, the previous tile's down GEMMs and OUTPUT,
        completes first) follow the previous tile's last execute command, and the loads after
        them keep program order. Appends the ``ld`` words, counts them by kind (``weight``,
        ``act``, ``tok``) and returns the GEMM beats."""
        fulls, placement = self.fulls, self.placement
        pos = []
        for m, f in enumerate(fulls):
            opens_tile = any(t is Target.TOK for t, _, _ in f["head"])
            p = m - 1 if ((opens_tile or f.get("late")) and m > 0) else m - 2
            pos.append(max(p, pos[-1] if pos else -1))
        prog.clear(out=True, rowmax=True, flags=True, counters=True)

        def emit_loads(k):
            f = fulls[k]
            b = k % 2
            for n, (target, addr, words) in enumerate(f["head"]):
                prog.load(target, addr=addr, words=len(words), fence=n == 0 and k > 0)
                ld.extend(words_to_ints(words))
                counts["tok" if target is Target.TOK else "act"] += len(words)
            for n, (target, words, key) in enumerate(f["loads"]):
                src, hb_addr = placement.source(target, key, words)
                prog.load(target, buf=b, addr=0, words=len(words),
                          signal=n == len(f["loads"]) - 1, src=src, hb_addr=hb_addr)
                ld.extend(words_to_ints(words))
                counts["weight"] += len(words)

        for m in range(len(fulls)):
            if pos[m] == -1:
                emit_loads(m)
        beats = 0
        for k, f in enumerate(fulls):
            for kind, args in f["before"]:
                getattr(prog, kind)(**args)
            b = k % 2
            for n, g in enumerate(f["gemms"]):
                prog.gemm(**dict(g, wbuf=b, wait=n == 0, release=n == len(f["gemms"]) - 1))
                beats += g["groups"] * g["col_blocks"]
            for kind, args in f.get("after", ()):
                getattr(prog, kind)(**args)
            for m in range(k + 1, min(k + 3, len(fulls))):
                if pos[m] == k:
                    emit_loads(m)
        prog.status()
        return beats


#: Roles of a PE in :func:`stream_pe_program`: ``single`` (one PE: COMBINE, OUTPUT), ``root``
#: (a group's K-split down: each column block's last GEMM adds the other PEs' psums from
#: ``link_i``, COMBINE, OUTPUT), ``member`` (each column block's psums out on ``link_o``, RAW).
ROLES = ("single", "root", "member")


def stream_pe_program(pe, plan: StreamPlan, ex, x_q, e_x, gw_bits, mode, *, role="single",
                      rowmax_exchange=False, raw_output=False,
                      placement: Placement | None = None):
    """One PE's streamed program of the expert (slice) ``ex`` (shape ``plan``) over the tokens
    ``x_q`` (INT8 ``[T, H]``, exponents ``e_x``, gate-weight FP16 bits ``gw_bits``).

    ``role`` (:data:`ROLES`) chooses the down projection's sink; ``rowmax_exchange`` puts the
    row maxima of the max pass on the link (``SEND ROWMAX``) and takes back their all-reduced
    maximum (``RECV ROWMAX accumulate``) before the h codes are made (a group's channel slices,
    ``elmoe3d.sw.host.stream_group``). ``raw_output``: OUTPUT raw (the Q.24 OUT words, for
    partial outputs summed elsewhere) instead of FP32. ``placement`` (:class:`Placement`,
    default: a fresh HB image) gives every weight LOAD its source and HB address and collects
    the images.

    Returns ``(program, ld words, info, OUTPUT chunks)``."""
    if role not in ROLES:
        raise ValueError(f"role: expected one of {ROLES}, got {role!r}")
    full = Mode(mode) is Mode.FULL
    I, R, L = ex.intermediate, pe.rows, pe.lanes
    T = len(x_q)
    gw = gw_bits
    both = QuantizedWeight(q=np.concatenate([ex.up.q, ex.gate.q]),
                           scale=np.concatenate([ex.up.scale, ex.gate.scale]),
                           name=f"{ex.up.name}+gate")
    up = _Matrix(both, updown_order(I, L), pe, "up/gate")
    placement = Placement() if placement is None else placement
    Ho = plan.hidden_out
    down = padded_matrix(ex.down, Ho, pe, "down")
    prog = Program(pe)
    ld: list = []
    counts = {"weight": 0, "act": 0, "tok": 0}
    chunks = []
    stream = _FullStream(pe, full, placement)
    fulls = stream.fulls
    matrix_fulls = stream.matrix

    n_ic = I // plan.i_chunk
    cb_per_ic = plan.i_chunk // (L // 2)
    exchange = [("send", dict(target=Target.ROWMAX, addr=0, words=1)),
                ("recv", dict(target=Target.ROWMAX, addr=0, words=1, accumulate=True))]
    for tile in range((T + R - 1) // R):
        t0 = tile * R
        head, x_rows = tile_head(pe, x_q, e_x, gw, t0,
                                 None if plan.x_stream else plan.x_base)
        k0 = len(fulls)
        for pas in range(plan.passes):
            for ic in range(n_ic):
                # pass 1 of 2: the row max only (chunk 0 starts it); the last pass: chunk by
                # chunk into HBUF and REQUANT with the full row's exponent
                keep = ic > 0 or pas > 0
                last = pas == plan.passes - 1
                before = []
                if last and plan.passes == 2 and ic == 0 and rowmax_exchange:
                    before = list(exchange)
                if last and plan.passes == 2 and ic > 0:
                    before = [("requant", dict(row_blocks=1, channels=plan.i_chunk,
                                               act_base=plan.h_base + (ic - 1) * plan.i_chunk // 32,
                                               tok_base=0))]
                k1 = len(fulls)
                written = ic * plan.i_chunk // 32 if last and plan.passes == 2 else 0
                xs_base, xs_chunk = plan.x_slots(written)
                matrix_fulls(up, range(ic * cb_per_ic, (ic + 1) * cb_per_ic),
                             lambda cb, ic=ic, keep=keep: dict(
                                 sink=Sink.SWIGLU, out_base=(cb - ic * cb_per_ic) * (L // 2),
                                 stride=plan.i_chunk // pe.q16_per_word, max_keep=keep,
                                 act_base=plan.x_base),
                             before=before,
                             per=xs_chunk if plan.x_stream else None,
                             x_rows=x_rows if plan.x_stream else None, x_base=xs_base)
                if before:                            # it rewrites HBUF rows REQUANT reads
                    fulls[k1]["gemms"][0]["rq_wait"] = True
        fulls[k0]["head"] = head + fulls[k0]["head"]
        requant = ("requant", dict(row_blocks=1, channels=plan.i_chunk,
                                   act_base=plan.h_base + (n_ic - 1) * plan.i_chunk // 32,
                                   tok_base=0))
        pre = list(exchange) if rowmax_exchange and plan.passes == 1 else []
        if role == "member":                      # psums out on the link, no OUT
            k1 = len(fulls)
            matrix_fulls(down, range(Ho // L), lambda cb: dict(
                sink=Sink.RAW, out_base=0, stride=0, act_base=plan.h_base),
                before=pre + [requant])
            fulls[k1]["gemms"][0]["rq_wait"] = True
            continue
        for c0 in range(0, Ho, plan.out_chunk):
            ch = min(plan.out_chunk, Ho - c0)
            before = [("clear", dict(out=True))] if c0 or tile else []
            before += pre + [requant] if c0 == 0 else []
            k1 = len(fulls)
            matrix_fulls(down, range(c0 // L, (c0 + ch) // L), lambda cb, c0=c0, ch=ch: dict(
                sink=Sink.COMBINE, out_base=cb * L - c0, stride=ch // pe.q24_per_word,
                act_base=plan.h_base, psum_in=role == "root"), before=before)
            fulls[k1]["gemms"][0]["rq_wait"] = c0 == 0
            fulls[-1]["after"] = [("output", dict(row_blocks=1, channels=ch,
                                                  raw=raw_output))]
            chunks.append((t0, R, c0, ch))

    beats = stream.emit(prog, ld, counts)
    info = {"tiles": (T + R - 1) // R, "passes": plan.passes, "x_stream": plan.x_stream,
            "gemm_beats": beats, "ld_words": len(ld), "weight_words": counts["weight"],
            "act_words": counts["act"] + counts["tok"], "commands": prog.counts(),
            "buffer_fulls": len(fulls)}
    return prog, ld, info, chunks

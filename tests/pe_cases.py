"""PE build-option cases shared by the PE's tests (``tests/amaranth/test_pe.py``: the PE refuses
them) and by the build-options object's (``tests/golden/test_config.py``: ``PEOptions`` refuses
them), so both tiers check the same rule on the same table; and PE programs shared by the RTL
tests and the cycle model's (plain NumPy and :mod:`elmoe3d.sw.golden.asm`)."""

from elmoe3d.isa import Sink, Target
from elmoe3d.sw.golden.datapath import Mode

#: Options under which ``narrow_out=True`` is accepted (small preset, W = 512: W/64/P = 2).
NARROW_OUT_OK = {"tile_passes": 4, "out_banks": 1, "out_valid_bits": False, "combine_units": 2,
                 "fp32_units": 2}

#: (change to NARROW_OUT_OK, the end of the refusal) for ``narrow_out=True``; every message
#: starts "narrow_out: OUT in W/P-bit parts ".
NARROW_OUT_NEEDS = (
    ({"tile_passes": 1}, "needs tile_passes 2 or 4, got tile_passes=1"),
    ({"out_banks": 2}, "needs out_banks 1, got out_banks=2"),
    ({"out_valid_bits": True}, "needs out_valid_bits False, got out_valid_bits=True"),
    ({"combine_units": 4}, "needs combine_units at most W/64/P = 2, got combine_units=4"),
    ({"fp32_units": 4}, "needs fp32_units at most W/64/P = 2, got fp32_units=4"),
)


# ---- programs of the engines' overlap (tests/amaranth/test_pe_overlap.py runs them on the RTL
# against the functional simulator, tests/host/test_pe_cycles.py against the cycle model) --------

def _overlap_setup(seed, config):
    import numpy as np
    from elmoe3d.config import pe_config
    from elmoe3d.sw.golden import asm
    pe = pe_config(config)
    return np, asm, pe, np.random.default_rng(seed)


def _weights(np, asm, pe, rng, words):
    """``words`` random MSB plane words and their scale words (every entry 2^-10)."""
    msb = asm.pack_wgt(rng.integers(0, 16, (words, pe.lanes, 32)), pe)
    scl = asm.pack_scales(np.full((-(-words // 8), 8, pe.lanes), 0x1400, np.uint16), pe)
    return msb, scl


def half_flag_program(config, seed=11):
    """RAW GEMMs whose loads use the WMEM buffers' half flags (``docs/pe.md``, "Engines and
    synchronisation"; a buffer of W = ``wmem_words`` words, lower half ``wmem_low_words``):

    * A reads the whole of buffer 0; B's weight words go into its lower half while A still
      reads the upper one, B's scale load (it signals) waits for A's last read;
    * C reads only the lower half of buffer 1, so D's weight words go into its upper half
      from C's first read on; D's scale load waits for C's last read.

    Groups: ``wmem_words / 4``, so a buffer holds 4 column blocks. Returns ``(program, ld,
    marks)``: ``marks`` maps ``"B"`` / ``"D"`` to the ld index of the job's first weight
    word and ``"B_scale"`` / ``"D_scale"`` to its first scale word, ``"A_beats"`` /
    ``"C_beats"`` to the beats before and of GEMMs A and C (beat indices in tile order)."""
    np, asm, pe, rng = _overlap_setup(seed, config)
    W, low = pe.wmem_words, pe.wmem_low_words
    assert low and W % 4 == 0
    G = W // 4
    p, ld, marks = asm.Program(pe), [], {}

    def load(target, addr, words, **kw):
        p.load(target, addr, len(words), **kw)
        ld.extend(asm.words_to_ints(words))

    p.clear(flags=True, counters=True)
    load(Target.ACT, 0, asm.pack_act(rng.integers(-128, 128, (G, pe.rows, 32)), pe))
    jobs = {"A": (0, 0, 4), "C": (1, 0, 2), "B": (0, 0, 2), "D": (1, low, 2)}

    def job(name):
        buf, base, cbn = jobs[name]
        msb, scl = _weights(np, asm, pe, rng, cbn * G)
        marks[name] = len(ld)
        load(Target.WMSB, base, msb, buf=buf)
        marks[f"{name}_scale"] = len(ld)
        load(Target.WSCALE, base // 8, scl, buf=buf, signal=True)

    def gemm(name):
        buf, base, cbn = jobs[name]
        p.gemm(mode=Mode.DRAFT, wbuf=buf, act_base=0, w_base=base, row_blocks=1,
               col_blocks=cbn, groups=G, sink=Sink.RAW, wait=True, release=True)
    job("A")
    job("C")
    gemm("A")
    job("B")
    gemm("C")
    job("D")
    gemm("B")
    gemm("D")
    p.status()
    marks["A_beats"] = (0, 4 * G)
    marks["C_beats"] = (4 * G, 6 * G)
    return p, ld, marks


def barrier_program(config, seed=12):
    """LOADs behind a ``CLEAR counters``, a BARRIER and a STATUS, queued while it waits (the
    counters count exactly the words of the LOADs between the CLEAR and the STATUS): a LOAD,
    ``CLEAR counters``, two LOADs and a RAW GEMM, a BARRIER and a STATUS behind it, a LOAD
    and a GEMM after, STATUS. Returns ``(program, ld, marks)``: ``marks`` the command indices
    of the CLEAR, the BARRIER and the first STATUS, and the ld indices of the first words
    after the CLEAR and after the STATUS."""
    np, asm, pe, rng = _overlap_setup(seed, config)
    G = pe.wmem_words // 4
    p, ld, marks = asm.Program(pe), [], {}

    def load(target, addr, words, **kw):
        p.load(target, addr, len(words), **kw)
        ld.extend(asm.words_to_ints(words))

    load(Target.ACT, G, asm.pack_act(rng.integers(-128, 128, (2, pe.rows, 32)), pe))
    marks["clear"] = p.clear(out=True, rowmax=True, flags=True, counters=True)
    marks["after_clear"] = len(ld)
    load(Target.ACT, 0, asm.pack_act(rng.integers(-128, 128, (G, pe.rows, 32)), pe))
    msb, scl = _weights(np, asm, pe, rng, 4 * G)
    load(Target.WMSB, 0, msb, buf=0)
    load(Target.WSCALE, 0, scl, buf=0, signal=True)
    p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=4,
           groups=G, sink=Sink.RAW, wait=True, release=True)
    marks["barrier"] = p.barrier()
    marks["status"] = p.status()
    marks["after_barrier"] = len(ld)
    msb, scl = _weights(np, asm, pe, rng, G)
    load(Target.WMSB, 0, msb, buf=1)
    load(Target.WSCALE, 0, scl, buf=1, signal=True)
    p.gemm(mode=Mode.DRAFT, wbuf=1, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=G, sink=Sink.RAW, wait=True, release=True)
    p.status()
    return p, ld, marks


def early_output_program(config, seed=13, *, last_first=False):
    """COMBINE GEMMs into one token's OUT row and OUTPUT right behind them (OUTPUT starts while
    the COMBINE sink still writes; each pair read waits for the writes to its words): one
    live token and a padding row (gate 0) in a row block, H = 8 column blocks of ``lanes``
    channels, the last GEMM one column block. ``last_first``: the last GEMM writes the row's
    first channels (OUTPUT's first read waits for it), else its last ones. Returns
    ``(program, ld)``."""
    np, asm, pe, rng = _overlap_setup(seed, config)
    R, L, OV = pe.rows, pe.lanes, pe.q24_per_word
    H, G = 8 * L, pe.wmem_words // 8
    p, ld = asm.Program(pe), []

    def load(target, addr, words, **kw):
        p.load(target, addr, len(words), **kw)
        ld.extend(asm.words_to_ints(words))

    p.clear(out=True, rowmax=True, flags=True, counters=True)
    gate = np.zeros(R, np.uint16)
    gate[0] = 0x3C00
    tok = {"e_x": np.zeros(R), "e_h": np.full(R, -12), "gate": gate, "slot": np.arange(R)}
    load(Target.TOK, 0, asm.pack_tok(tok, pe))
    load(Target.ACT, 0, asm.pack_act(rng.integers(-128, 128, (G, R, 32)), pe))
    order = [(1, 7), (0, 1)] if last_first else [(0, 7), (7, 1)]
    for k, (cb0, cbn) in enumerate(order):
        msb, scl = _weights(np, asm, pe, rng, cbn * G)
        load(Target.WMSB, 0, msb, buf=k)
        load(Target.WSCALE, 0, scl, buf=k, signal=True)
    for k, (cb0, cbn) in enumerate(order):
        p.gemm(mode=Mode.DRAFT, wbuf=k, act_base=0, w_base=0, row_blocks=1, col_blocks=cbn,
               groups=G, sink=Sink.COMBINE, out_base=cb0 * L, tok_base=0, stride=H // OV,
               wait=True, release=True)
    # one token row of H values (the padding row is not sent: H / (W/32) beats)
    p.output(row_blocks=1, channels=H // R)
    p.status()
    return p, ld


#: Column blocks of the paced COMBINE GEMM (one K-group each: a result a cycle from the tile).
PACED_COL_BLOCKS = 8


def _paced_start(config, seed, parts):
    """The start shared by the programs of a COMBINE GEMM of one K-group a result: ``CLEAR``,
    TOK (every row live, gate 1.0), G = ``wmem_words / parts`` ACT words. Returns ``(np, asm,
    pe, rng, program, ld, load, combine, G)``: ``load(target, addr, words, **kw)`` appends a
    LOAD and its words, ``combine(**kw)`` the GEMM (:data:`PACED_COL_BLOCKS` column blocks,
    buffer 0, into OUT)."""
    np, asm, pe, rng = _overlap_setup(seed, config)
    G = pe.wmem_words // parts
    R, L, OV = pe.rows, pe.lanes, pe.q24_per_word
    p, ld = asm.Program(pe), []

    def load(target, addr, words, **kw):
        p.load(target, addr, len(words), **kw)
        ld.extend(asm.words_to_ints(words))

    def combine(**kw):
        p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1,
               col_blocks=PACED_COL_BLOCKS, groups=1, sink=Sink.COMBINE, out_base=0,
               tok_base=0, stride=PACED_COL_BLOCKS * L // OV, wait=True, **kw)

    p.clear(out=True, rowmax=True, flags=True, counters=True)
    tok = {"e_x": np.zeros(R), "e_h": np.full(R, -12), "gate": np.full(R, 0x3C00, np.uint16),
           "slot": np.arange(R)}
    load(Target.TOK, 0, asm.pack_tok(tok, pe))
    load(Target.ACT, 0, asm.pack_act(rng.integers(-128, 128, (G, R, 32)), pe))
    return np, asm, pe, rng, p, ld, load, combine, G


def sink_paced_program(config, seed=15):
    """A COMBINE GEMM the sink paces (one K-group a result, so the tile offers a result a
    cycle while the sink holds each for ``rows * combine_row_cycles`` cycles) that releases
    its WMEM buffer, then the next job's LOADs into that buffer and a RAW GEMM on it, OUTPUT
    and STATUS. The tile hands results over into the result stage's skid register while the
    result register still feeds the one before, so the releasing GEMM's last read, and the
    LOADs behind it, come a result earlier than with the result register alone. Returns
    ``(program, ld)``."""
    np, asm, pe, rng, p, ld, load, combine, G = _paced_start(config, seed, 4)
    msb, scl = _weights(np, asm, pe, rng, PACED_COL_BLOCKS)
    load(Target.WMSB, 0, msb, buf=0)
    load(Target.WSCALE, 0, scl, buf=0, signal=True)
    combine(release=True)
    msb, scl = _weights(np, asm, pe, rng, 2 * G)
    load(Target.WMSB, 0, msb, buf=0)
    load(Target.WSCALE, 0, scl, buf=0, signal=True)
    p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=2,
           groups=G, sink=Sink.RAW, wait=True, release=True)
    p.output(row_blocks=1, channels=PACED_COL_BLOCKS * pe.lanes)
    p.status()
    return p, ld


def tail_freeze_program(config, seed=16):
    """A COMBINE GEMM of one K-group a result (its results freeze the tile after its last
    beat while the sink drains them), a RAW GEMM on the other buffer that releases it (its
    beats wait out the freeze), LOADs into that buffer behind the release, STATUS. Returns
    ``(program, ld)``."""
    np, asm, pe, rng, p, ld, load, combine, G = _paced_start(config, seed, 2)
    for buf, words in ((0, PACED_COL_BLOCKS), (1, G)):
        msb, scl = _weights(np, asm, pe, rng, words)
        load(Target.WMSB, 0, msb, buf=buf)
        load(Target.WSCALE, 0, scl, buf=buf, signal=True)
    combine()
    p.gemm(mode=Mode.DRAFT, wbuf=1, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=G, sink=Sink.RAW, wait=True, release=True)
    msb, scl = _weights(np, asm, pe, rng, 8)
    load(Target.WMSB, 0, msb, buf=1)
    load(Target.WSCALE, 0, scl, buf=1, signal=True)
    p.status()
    return p, ld


def requant_pad_program(config, seed=14, *, pad_rows=1, row_blocks=2, channels=2,
                        load_beside=0):
    """REQUANT with ``pad_rows`` padding rows (the last row block's last rows) over
    ``channels * max(32, Q)`` channels: HBUF rows and their row maxima from ``ld`` /
    ``link_i``, ACT and TOK filled with random bytes first (so the zero codes and the untouched
    ``e_h`` of the padding rows show), the codes and the token table sent back on ``link_o``.
    ``load_beside``: that many random ACT words loaded after the codes' words while REQUANT
    runs (no fence: the load engine takes the ACT write port first, REQUANT's codes wait) and
    sent back after the codes. Returns ``(program, ld, link_i)``."""
    np, asm, pe, rng = _overlap_setup(seed, config)
    R, Q, OV = pe.rows, pe.q16_per_word, pe.q24_per_word
    rows, I = row_blocks * R, channels * max(32, Q)
    p, ld, link_i = asm.Program(pe), [], []

    def load(target, addr, words, **kw):
        p.load(target, addr, len(words), **kw)
        ld.extend(asm.words_to_ints(words))

    tok_words = -(-rows // OV)
    act_words = row_blocks * I // 32
    load(Target.TOK, 0, rng.integers(0, 256, (tok_words, pe.word_bytes), dtype=np.uint8))
    load(Target.ACT, 0, rng.integers(0, 256, (act_words, pe.word_bytes), dtype=np.uint8))
    h = rng.integers(-(1 << 20), 1 << 20, (rows, I)).astype(np.int32)
    load(Target.HBUF, 0, np.ascontiguousarray(h).view(np.uint8).reshape(-1, pe.word_bytes))
    rmax = np.zeros((1, Q), np.int64)
    rmax[0, :rows] = np.abs(h.astype(np.int64)).max(axis=1)
    p.barrier()
    p.recv(Target.ROWMAX, 0, 1)
    link_i += asm.words_to_ints(asm.pack_rowmax(rmax, pe))
    p.requant(row_blocks=row_blocks, channels=I, act_base=0, tok_base=0, pad_rows=pad_rows)
    if load_beside:
        assert act_words + load_beside <= pe.act_words
        load(Target.ACT, act_words,
             rng.integers(0, 256, (load_beside, pe.word_bytes), dtype=np.uint8))
    p.barrier()
    p.send(Target.ACT, 0, act_words + load_beside)
    p.send(Target.TOK, 0, tok_words)
    p.status()
    return p, ld, link_i

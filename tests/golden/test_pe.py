"""Functional PE simulator: the GEMM address generation and lane semantics against the tile's
golden model, the sinks, link ports, counters and the program errors it must raise."""

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.isa import Op, Sink, Target, encode
from elmoe3d.sw.golden import asm, pe as fsim
from elmoe3d.sw.golden.asm import Program, ProgramError
from elmoe3d.sw.golden.datapath import Mode
from elmoe3d.sw.golden.tile import ref_tile
from elmoe3d.sw.golden.vpu import q24_to_fp32, swiglu_q16

SEED = 7411
CFG = preset("small")
PE = CFG.pe


def _rng(tag):
    seed = SEED + sum(map(ord, tag))
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def _random_state(rng, *, big_scales=False):
    """A PE state with random memories (scales: random positive/negative FP16, some
    subnormal; big_scales: near the FP16 maximum so accumulators can saturate)."""
    st = fsim.PEState.reset(CFG)
    st.wmsb[:] = rng.integers(0, 256, st.wmsb.shape, dtype=np.uint8)
    st.wlsb[:] = rng.integers(0, 256, st.wlsb.shape, dtype=np.uint8)
    st.act[:] = rng.integers(0, 256, st.act.shape, dtype=np.uint8)
    if big_scales:
        # a = -127, msb = -8, lsb = 15 in most places: group psums near the maximum
        st.act[:] = np.where(rng.random(st.act.shape) < 0.9, 0x81, st.act)
        st.wmsb[:] = np.where(rng.random(st.wmsb.shape) < 0.9, 0x88, st.wmsb)
        st.wlsb[:] = 0xFF
        bits = rng.choice(np.array([0x7BFF, 0x7BF0], np.uint16), st.wscale.size // 2)
    else:
        bits = rng.integers(0, 0x7C00, st.wscale.size // 2).astype(np.uint16)
        bits |= (rng.random(bits.shape) < 0.3).astype(np.uint16) << 15
    st.wscale[:] = bits.view(np.uint8).reshape(st.wscale.shape)
    return st


def _gemm_fields(mode, rbn, cbn, groups, act_base=0, w_base=0, wbuf=0, sink=Sink.RAW):
    return dict(mode=int(mode), wbuf=wbuf, act_base=act_base, w_base=w_base, row_blocks=rbn,
                col_blocks=cbn, groups=groups, sink=int(sink), out_base=0, tok_base=0,
                wait=0, release=0, stride=0)


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.name)
@pytest.mark.parametrize("big", [False, True], ids=["scales", "saturating"])
def test_gemm_results_equal_ref_tile_of_the_contract_beats(mode, big):
    rng = _rng(f"gemm{mode.name}{big}")
    st = _random_state(rng, big_scales=big)
    for _ in range(4):
        groups = int(rng.integers(1, 9)) if not big else 24
        rbn = int(rng.integers(1, PE.act_words // groups + 1))
        cbn = int(rng.integers(1, PE.wmem_words // groups + 1))
        f = _gemm_fields(mode, rbn, cbn, groups,
                         act_base=int(rng.integers(0, PE.act_words - rbn * groups + 1)),
                         w_base=int(rng.integers(0, PE.wmem_words - cbn * groups + 1)),
                         wbuf=int(rng.integers(0, 2)))
        acc, ovf = fsim.gemm_results(st, f)
        ref = ref_tile(fsim.gemm_beats(st, f))
        halves = 2 if mode is Mode.FULL else 1
        assert acc.shape == (cbn * halves, rbn, PE.rows, PE.lanes)
        assert np.array_equal(acc.reshape(-1, PE.rows, PE.lanes), ref["acc"])
        assert np.array_equal(ovf.reshape(-1, PE.rows, PE.lanes), ref["overflow"])
    if big and mode is not Mode.LSB_ONLY:
        assert ovf.any()


def test_gemm_beats_follow_the_address_generation():
    rng = _rng("beats")
    st = _random_state(rng)
    f = _gemm_fields(Mode.FULL, 2, 2, 3, act_base=5, w_base=7, wbuf=1)
    beats = fsim.gemm_beats(st, f)
    L = PE.lanes
    msb = asm.unpack_wgt(st.wmsb[1], PE)
    lsb = asm.unpack_wgt(st.wlsb[1], PE)
    scl = asm.unpack_scales(st.wscale[1], PE).reshape(-1, L)
    act = asm.unpack_act(st.act, PE)
    b = 0
    for cb in range(2):
        for half in range(2):
            for rb in range(2):
                for g in range(3):
                    addr = 7 + cb * 3 + g
                    assert np.array_equal(beats["act"][b], act[5 + rb * 3 + g])
                    for i in range(L // 2):
                        assert np.array_equal(beats["wgt"][b][2 * i], msb[addr][half * L // 2 + i])
                        assert np.array_equal(beats["wgt"][b][2 * i + 1],
                                              lsb[addr][half * L // 2 + i])
                        assert beats["scale"][b][2 * i] == scl[addr][half * L // 2 + i]
                        assert beats["scale"][b][2 * i + 1] == scl[addr][half * L // 2 + i]
                    assert beats["first"][b] == (g == 0) and beats["last"][b] == (g == 2)
                    b += 1
    assert b == len(beats["first"])


def _load(p, ld, target, words, *, addr=0, buf=0, signal=False):
    p.load(target, addr, len(words), buf=buf, signal=signal)
    ld.extend(asm.words_to_ints(words))


def test_raw_sink_sends_the_tile_results_on_link_o():
    rng = _rng("raw")
    p, ld = Program(CFG), []
    nib = rng.integers(0, 16, (4, PE.lanes, 32))
    _load(p, ld, Target.ACT, asm.pack_act(rng.integers(-127, 128, (2, PE.rows, 32)), PE))
    _load(p, ld, Target.WMSB, asm.pack_wgt(nib, PE), buf=1)
    _load(p, ld, Target.WLSB, asm.pack_wgt(nib[::-1], PE), buf=1)
    scales = rng.integers(0x2000, 0x4000, (1, 8, PE.lanes)).astype(np.uint16)
    _load(p, ld, Target.WSCALE, asm.pack_scales(scales, PE), buf=1, signal=True)
    p.gemm(mode=Mode.FULL, wbuf=1, act_base=0, w_base=0, row_blocks=1, col_blocks=2,
           groups=2, sink=Sink.RAW, wait=True, release=True)
    res = fsim.run(p, ld)
    ref = ref_tile(fsim.gemm_beats(res.state, dict(p[-1].fields)))
    words = asm.unpack_q24(asm.ints_to_words(res.link_o, PE), PE)
    assert np.array_equal(words.reshape(ref["acc"].shape), ref["acc"])
    assert res.statuses() == [] and res.state.acc_overflow == bool(ref["overflow"].any())
    assert res.state.counters["words_sent"] == len(res.link_o) == 4 * PE.lanes // 4


def test_swiglu_sink_writes_hbuf_rows_and_row_max():
    rng = _rng("swiglu")
    for mode in (Mode.DRAFT, Mode.FULL):
        p, ld = Program(CFG), []
        tok = {"e_x": np.array([0, -3, 2, 1]), "gate": np.zeros(4, np.uint16),
               "slot": np.arange(4)}
        _load(p, ld, Target.TOK, asm.pack_tok(tok, PE))
        _load(p, ld, Target.ACT, asm.pack_act(rng.integers(-127, 128, (4, PE.rows, 32)), PE))
        _load(p, ld, Target.WMSB, asm.pack_wgt(rng.integers(0, 16, (6, PE.lanes, 32)), PE))
        _load(p, ld, Target.WLSB, asm.pack_wgt(rng.integers(0, 16, (6, PE.lanes, 32)), PE))
        scales = rng.integers(0x1000, 0x3000, (1, 8, PE.lanes)).astype(np.uint16)
        _load(p, ld, Target.WSCALE, asm.pack_scales(scales, PE), signal=True)
        p.gemm(mode=mode, wbuf=0, act_base=0, w_base=0, row_blocks=2, col_blocks=3, groups=2,
               sink=Sink.SWIGLU, out_base=16, tok_base=0, stride=3, wait=True, release=True)
        res = fsim.run(p, ld)
        st = res.state
        acc, _ = fsim.gemm_results(st, dict(p[-1].fields))     # [nblk, rb, R, L]
        nblk = acc.shape[0]
        res_t = acc.transpose(1, 2, 0, 3).reshape(4, nblk, PE.lanes)
        # every half of a weight word is [up L/4, gate L/4]; FULL results: even lanes
        halves = (res_t[:, :, 0::2] if mode is Mode.FULL else res_t).reshape(4, -1,
                                                                              PE.lanes // 2)
        q = PE.lanes // 4
        P = q if mode is Mode.FULL else 2 * q           # channels per block
        h, _ = swiglu_q16(halves[:, :, :q].reshape(4, -1), halves[:, :, q:].reshape(4, -1),
                          tok["e_x"][:, None])
        hv = st.hbuf_values()
        row = 3 * PE.q16_per_word
        for t in range(4):
            assert np.array_equal(hv[t * row + 16:t * row + 16 + nblk * P], h[t])
            assert not hv[t * row:t * row + 16].any()
            assert st.rowmax[t] == np.abs(h[t].astype(np.int64)).max()


def test_clear_output_status_and_link_ports():
    rng = _rng("io")
    p, ld = Program(CFG), []
    q24 = rng.integers(-(1 << 40), 1 << 40, (4, PE.q24_per_word))
    _load(p, ld, Target.OUT, asm.pack_q24(q24, PE))
    p.barrier()
    p.output(row_blocks=1, channels=PE.fp32_per_beat)
    p.send(Target.OUT, 0, 4)
    p.recv(Target.OUT, 0, 2, accumulate=True)
    p.recv(Target.HBUF, 5, 1)
    p.output(row_blocks=1, channels=PE.fp32_per_beat)
    p.barrier()
    p.status()
    p.clear(out=True, counters=True, flags=True)
    p.status()
    link_in = np.concatenate([asm.pack_q24(q24[:2], PE),
                              asm.pack_q16(np.arange(PE.q16_per_word)[None], PE)])
    res = fsim.run(p, ld, link_i=link_in)
    data = res.data()
    assert np.array_equal(data[:2].reshape(-1).view(np.uint32),
                          q24_to_fp32(q24.reshape(-1)).view(np.uint32))
    doubled = q24.copy()
    doubled[:2] *= 2
    assert np.array_equal(data[2:].reshape(-1), q24_to_fp32(doubled.reshape(-1)))
    assert res.link_o == asm.words_to_ints(asm.pack_q24(q24, PE))
    assert np.array_equal(res.state.hbuf_values()[5 * PE.q16_per_word:6 * PE.q16_per_word],
                          np.arange(PE.q16_per_word))
    s1, s2 = res.statuses()
    assert (s1["words_loaded"], s1["words_sent"], s1["words_received"]) == (4, 4, 3)
    assert all(s2[k] == 0 for k in s2)
    assert not res.state.out.any()
    assert res.ld_used == 4 and res.link_i_used == 3


def test_recv_accumulate_saturates_and_flags():
    p, ld = Program(CFG), []
    big = np.full((1, PE.q24_per_word), (1 << 62) + 5, np.int64)
    _load(p, ld, Target.OUT, asm.pack_q24(big, PE))
    p.barrier()
    p.recv(Target.OUT, 0, 1, accumulate=True)
    p.status()
    res = fsim.run(p, ld, link_i=asm.words_to_ints(asm.pack_q24(big, PE)))
    assert (res.state.out_values()[:PE.q24_per_word] == np.iinfo(np.int64).max).all()
    assert res.statuses()[0]["vpu_saturation"] == 1


def test_encoded_program_and_byte_streams_run_the_same():
    rng = _rng("enc")
    p, ld = Program(CFG), []
    _load(p, ld, Target.ACT, asm.pack_act(rng.integers(-127, 128, (2, PE.rows, 32)), PE))
    _load(p, ld, Target.WMSB, asm.pack_wgt(rng.integers(0, 16, (2, PE.lanes, 32)), PE))
    _load(p, ld, Target.WSCALE, asm.pack_scales(
        rng.integers(0, 0x3C00, (1, 8, PE.lanes)).astype(np.uint16), PE), signal=True)
    p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=2, sink=Sink.RAW, wait=True, release=True)
    a = fsim.run(p, ld)
    b = fsim.run(p.encode(), asm.ints_to_words(ld, PE), config=CFG)
    assert a.link_o == b.link_o
    with pytest.raises(TypeError, match="config"):
        fsim.run(p.encode(), ld)


# ---- program errors ------------------------------------------------------------------------------

def _expect(p, ld, match, **kw):
    with pytest.raises(ProgramError, match=match):
        fsim.run(p, ld, **kw)


def test_gemm_waiting_on_an_empty_buffer_is_an_error():
    p, ld = Program(CFG), []
    _load(p, ld, Target.WMSB, np.zeros((1, PE.word_bytes), np.uint8), buf=0)
    p.gemm(mode=Mode.DRAFT, wbuf=1, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=1, sink=Sink.RAW, wait=True)
    _expect(p, ld, r"command 1: GEMM waits on WMEM buffer 1, which is empty")


def test_loading_a_full_buffer_is_an_error():
    p, ld = Program(CFG), []
    zero = np.zeros((1, PE.word_bytes), np.uint8)
    _load(p, ld, Target.WSCALE, zero, buf=0, signal=True)
    _load(p, ld, Target.WMSB, zero, buf=0)
    _expect(p, ld, r"command 1: LOAD WMSB into WMEM buffer 0, which is full "
                   r"\(signalled by command 0\)")


def test_unordered_activation_load_is_an_error():
    p, ld = Program(CFG), []
    zero = np.zeros((1, PE.word_bytes), np.uint8)
    _load(p, ld, Target.WSCALE, zero, buf=0, signal=True)
    _load(p, ld, Target.ACT, zero)
    p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=1, sink=Sink.RAW, wait=True, release=True)
    _expect(p, ld, r"command 2: GEMM uses ACT words 0..0, loaded by command 1 "
                   r"without ordering")


def test_load_over_memory_in_use_needs_a_barrier():
    p, ld = Program(CFG), []
    zero = np.zeros((1, PE.word_bytes), np.uint8)
    _load(p, ld, Target.ACT, zero)
    _load(p, ld, Target.WMSB, zero, buf=0)
    _load(p, ld, Target.WSCALE, zero, buf=0, signal=True)
    p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=1, sink=Sink.RAW, wait=True, release=True)
    _load(p, ld, Target.ACT, zero)
    _expect(p, ld, r"command 4: LOAD ACT into ACT words 0..0 while command 3 on the execute "
                   r"engine may still use them")
    # with a barrier, or a fence on this load or an earlier one, it runs; words the GEMM
    # did not use need neither
    for order in ("barrier", "fence", "earlier fence", "other words"):
        q, ld2 = Program(CFG), []
        _load(q, ld2, Target.ACT, zero)
        _load(q, ld2, Target.WMSB, zero, buf=0)
        _load(q, ld2, Target.WSCALE, zero, buf=0, signal=True)
        q.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
               groups=1, sink=Sink.RAW, wait=True, release=True)
        if order == "barrier":
            q.barrier()
        if order == "earlier fence":
            q.load(Target.TOK, 0, 1, fence=True)
            ld2.append(0)
        addr = 1 if order == "other words" else 0
        q.load(Target.ACT, addr, 1, fence=order == "fence")
        ld2.append(0)
        fsim.run(q, ld2)


def test_requant_overlaps_only_gemms_on_other_words():
    """REQUANT runs beside later GEMMs: a GEMM touching its ACT, TOK, HBUF or row-max words
    needs rq_wait (rule 5); one on other words does not; OUTPUT always waits."""
    zero = np.zeros((1, PE.word_bytes), np.uint8)

    def program(act_base, tok_base, rq_wait, sink=Sink.SWIGLU):
        p, ld = Program(CFG), []
        _load(p, ld, Target.TOK, np.zeros((2, PE.word_bytes), np.uint8))
        _load(p, ld, Target.ACT, np.zeros((8, PE.word_bytes), np.uint8))
        p.barrier()
        _load(p, ld, Target.WMSB, zero, buf=0)
        _load(p, ld, Target.WSCALE, zero, buf=0, signal=True)
        p.requant(row_blocks=1, channels=32, act_base=0, tok_base=0)
        p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=act_base, w_base=0, row_blocks=1,
               col_blocks=1, groups=1, sink=sink, out_base=0, tok_base=tok_base, stride=2,
               wait=True, release=True, rq_wait=rq_wait)
        return p, ld

    fsim.run(*program(4, 8, False))
    fsim.run(*program(0, 0, True))
    _expect(*program(0, 8, False), r"command 6: GEMM uses ACT words 0..0, which REQUANT "
                                   r"command 5 may still use: set rq_wait")
    _expect(*program(4, 2, False), r"command 6: GEMM uses TOK words 0..0, which REQUANT")
    p, ld = program(4, 8, False)
    p.output(row_blocks=1, channels=16)
    _load(p, ld, Target.WMSB, zero, buf=1)
    _load(p, ld, Target.WSCALE, zero, buf=1, signal=True)
    p.gemm(mode=Mode.DRAFT, wbuf=1, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=1, sink=Sink.RAW, wait=True, release=True)
    fsim.run(p, ld)


def test_gemm_reading_words_not_loaded_since_the_release_is_an_error():
    """Sync rule 6: a GEMM reads only WMEM words loaded since its buffer's last release, in
    every plane its mode reads (the builder bug it would have caught: a K-chained FULL part's
    MSB_ONLY GEMM at w_base 0 while its words were loaded into the upper half)."""
    zero = np.zeros((1, PE.word_bytes), np.uint8)
    low = PE.wmem_low_words

    def program(mode, msb_at, lsb_at, scale_at, w_base):
        p, ld = Program(CFG), []
        _load(p, ld, Target.ACT, zero)
        _load(p, ld, Target.WMSB, zero, addr=msb_at)
        _load(p, ld, Target.WLSB, zero, addr=lsb_at)
        _load(p, ld, Target.WSCALE, zero, addr=scale_at, signal=True)
        p.gemm(mode=mode, wbuf=0, act_base=0, w_base=w_base, row_blocks=1, col_blocks=1,
               groups=1, sink=Sink.RAW, wait=True, release=True)
        return p, ld

    fsim.run(*program(Mode.FULL, low, low, low // 8, low))
    fsim.run(*program(Mode.DRAFT, low, 0, low // 8, low))     # DRAFT reads no LSB word
    _expect(*program(Mode.FULL, low, low, low // 8, 0),
            r"command 4: GEMM reads WSCALE word 0 of WMEM buffer 0 .*since the buffer's last "
            r"release")
    _expect(*program(Mode.FULL, low, 0, low // 8, low), r"command 4: GEMM reads WLSB word "
                                                         rf"{low} of WMEM buffer 0")
    # a buffer-full's words do not survive its release
    p, ld = program(Mode.DRAFT, 0, 0, 0, 0)
    p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=1, sink=Sink.RAW)
    _expect(p, ld, r"command 5: GEMM reads WSCALE word 0 of WMEM buffer 0")


def test_short_streams_and_bad_slots_are_errors():
    p, ld = Program(CFG), []
    _load(p, ld, Target.ACT, np.zeros((3, PE.word_bytes), np.uint8))
    _expect(p, ld[:2], r"command 0: needs 3 ld words from position 0, but the stream has "
                       r"only 2")
    q = Program(CFG)
    q.recv(Target.OUT, 0, 2)
    _expect(q, [], r"command 0: needs 2 link_i words")
    r, ld3 = Program(CFG), []
    tok = {"slot": np.array([200, 0])}
    _load(r, ld3, Target.TOK, asm.pack_tok(tok, PE))
    _load(r, ld3, Target.WMSB, np.zeros((1, PE.word_bytes), np.uint8))
    _load(r, ld3, Target.WSCALE, np.zeros((1, PE.word_bytes), np.uint8), signal=True)
    r.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
           groups=1, sink=Sink.COMBINE, stride=1, wait=True, release=True)
    _expect(r, ld3, r"command 3: GEMM COMBINE: TOK entry 0 has slot 200")


def test_address_out_of_range_in_an_encoded_program():
    words = [encode(Op.LOAD, target=int(Target.HBUF), addr=PE.hbuf_words, words=1)]
    with pytest.raises(ProgramError, match=r"command 0: LOAD.addr = 256: HBUF addr \+ words"):
        fsim.run(words, [0], config=CFG)
    with pytest.raises(ProgramError, match="command 0: unknown opcode"):
        fsim.run([14], [], config=CFG)


@pytest.mark.parametrize("pad_rows", [1, 3])
def test_requant_pad_rows_zero_the_padding_rows(pad_rows):
    """REQUANT ``pad_rows``: on a PE of four rows (``mid``), the last ``pad_rows`` rows of the
    last row block get zero codes and keep their ``e_h``, row max and HBUF values; the live rows'
    codes and ``e_h`` are those of the REQUANT without padding rows; ``pad_rows`` of ``rows`` or
    more is refused."""
    from tests.pe_cases import requant_pad_program
    mid = preset("mid")
    R = mid.pe.rows
    prog, ld, link_i = requant_pad_program(mid, 31, pad_rows=pad_rows)
    full, _, _ = requant_pad_program(mid, 31, pad_rows=0)
    got, ref = fsim.run(prog, ld, link_i), fsim.run(full, ld, link_i)
    tok_words = 1
    acts = [asm.unpack_act(asm.ints_to_words(r.link_o[:-tok_words], mid.pe), mid.pe)
            for r in (got, ref)]
    rbn = 2
    a, b = (x.reshape(rbn, -1, R, 32) for x in acts)              # [rb, g, row, 32]
    live = rbn * R - pad_rows
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1, :, :R - pad_rows],
                                                         b[1, :, :R - pad_rows])
    assert not a[1, :, R - pad_rows:].any() and b[1, :, R - pad_rows:].any()
    tok = [asm.ints_to_words(r.link_o[-tok_words:], mid.pe).reshape(-1).view(asm.TOK_DTYPE)
           for r in (got, ref)]
    assert np.array_equal(tok[0]["e_h"][:live], tok[1]["e_h"][:live])
    loaded = asm.ints_to_words(ld[:tok_words], mid.pe).reshape(-1).view(asm.TOK_DTYPE)
    assert np.array_equal(tok[0]["e_h"][live:], loaded["e_h"][live:])
    assert not np.array_equal(tok[1]["e_h"][live:rbn * R], loaded["e_h"][live:rbn * R])
    bad = Program(mid)
    with pytest.raises(ProgramError, match="pad_rows"):
        bad.requant(row_blocks=1, channels=64, act_base=0, tok_base=0, pad_rows=R)
        bad.check_sync()

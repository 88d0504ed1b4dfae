"""Functional simulator, multi-PE features (docs/pe.md, INTERFACES section 1): GEMM psum_in,
SWIGLU/COMBINE in MSB_ONLY/LSB_ONLY, SEND/RECV ROWMAX, phased runs. Every split is checked
bit for bit against the unsplit single-PE run (the accumulators are exact, numerics 5)."""

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.isa import Sink, Target
from elmoe3d.sw.golden import asm, pe as fsim
from elmoe3d.sw.golden.asm import Program, ProgramError
from elmoe3d.sw.golden.datapath import INT64_MAX, INT64_MIN, Mode

SEED = 5209
CFG = preset("small")
PE = CFG.pe
R, L, OV, Q = PE.rows, PE.lanes, PE.q24_per_word, PE.q16_per_word


def _rng(tag):
    seed = SEED + sum(map(ord, tag))
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def _operands(rng, *, rbn, cbn, groups, corner=False):
    """ACT codes ``[rbn, G, R, 32]``, MSB / LSB nibbles ``[cbn, G, L, 32]``, FP16 scale bits
    ``[cbn, G, L]``. corner: the extreme codes (-128, -8/15 nibbles), the largest, smallest
    subnormal, zero and negative zero scales. With G <= 8 nothing saturates (|term| < 2^59)."""
    if corner:
        act = rng.choice(np.array([-128, 127, 0, -1]), (rbn, groups, R, 32))
        msb = rng.choice(np.array([8, 7, 0, 15]), (cbn, groups, L, 32))
        lsb = rng.choice(np.array([15, 0, 1]), (cbn, groups, L, 32))
        scl = rng.choice(np.array([0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0000, 0x8000, 0x3C00],
                                  np.uint16), (cbn, groups, L))
    else:
        act = rng.integers(-128, 128, (rbn, groups, R, 32))
        msb = rng.integers(0, 16, (cbn, groups, L, 32))
        lsb = rng.integers(0, 16, (cbn, groups, L, 32))
        scl = rng.integers(0, 0x7C00, (cbn, groups, L)).astype(np.uint16)
        scl |= (rng.random(scl.shape) < 0.3).astype(np.uint16) << 15
    return act, msb, lsb, scl.astype(np.uint16)


def _tok(rng, n):
    gate = rng.integers(0x2000, 0x3C00, n).astype(np.uint16) | (
        (rng.random(n) < 0.3).astype(np.uint16) << 15)
    return {"e_x": rng.integers(-6, 7, n), "e_h": rng.integers(-20, -8, n), "gate": gate,
            "slot": rng.permutation(n)}


def _load(p, ld, target, words, *, addr=0, buf=0, signal=False):
    p.load(target, addr, len(words), buf=buf, signal=signal)
    ld.extend(asm.words_to_ints(words))


def _load_operands(p, ld, act, msb, lsb, scl, tok, *, buf=0, load_tok=True):
    G = act.shape[1]
    if load_tok:
        _load(p, ld, Target.TOK, asm.pack_tok(tok, PE))
        _load(p, ld, Target.ACT, asm.pack_act(act.reshape(-1, R, 32), PE))
    _load(p, ld, Target.WMSB, asm.pack_wgt(msb.reshape(-1, L, 32), PE), buf=buf)
    _load(p, ld, Target.WLSB, asm.pack_wgt(lsb.reshape(-1, L, 32), PE), buf=buf)
    entries = scl.reshape(-1, L)
    pad = np.zeros((-len(entries) % 8, L), np.uint16)
    _load(p, ld, Target.WSCALE,
          asm.pack_scales(np.concatenate([entries, pad]).reshape(-1, 8, L), PE), buf=buf,
          signal=True)
    return G


def _sink_fields(sink, cbn):
    """out_base / stride for a GEMM over cbn column blocks (cbn * L weight rows)."""
    if sink is Sink.SWIGLU:
        return {"stride": -(-cbn * L // 2 // Q)}
    if sink is Sink.COMBINE:
        return {"stride": -(-cbn * L // OV)}
    return {}


def _run_gemm(mode, sink, operands, tok, *, psum_in=False, link_i=()):
    """One PE: load the operands, one GEMM, BARRIER, STATUS."""
    act, msb, lsb, scl = operands
    rbn, G = act.shape[:2]
    cbn = msb.shape[0]
    p, ld = Program(CFG), []
    _load_operands(p, ld, act, msb, lsb, scl, tok)
    p.gemm(mode=mode, wbuf=0, act_base=0, w_base=0, row_blocks=rbn, col_blocks=cbn, groups=G,
           sink=sink, wait=True, release=True, psum_in=psum_in, **_sink_fields(sink, cbn))
    p.barrier()
    p.status()
    return fsim.run(p, ld, link_i)


def _raw_channels(res, mode, rbn, cbn):
    """RAW link words of a GEMM as accumulators ``[rbn*R, cbn*L]`` by weight row (channel)."""
    acc = asm.unpack_q24(asm.ints_to_words(res.link_o, PE), PE).reshape(-1, rbn, R, L)
    if mode is Mode.FULL:                      # block (cb, half), lane 2i: row half*L/2 + i
        acc = acc.reshape(cbn, 2, rbn, R, L)[..., 0::2]
        acc = acc.transpose(0, 1, 4, 2, 3).reshape(cbn * L, rbn * R)
    else:
        acc = acc.transpose(0, 3, 1, 2).reshape(cbn * L, rbn * R)
    return acc.T


def _outputs(res, sink):
    """What a sink left behind: RAW link words, HBUF + row maxima, or OUT values; and the
    sticky flags."""
    st = res.state
    if sink is Sink.SWIGLU:
        data = (st.hbuf.copy(), st.rowmax.copy())
    elif sink is Sink.COMBINE:
        data = (st.out.copy(),)
    else:
        data = ()
    return data, res.statuses()[0]


@pytest.mark.parametrize("sink", list(Sink), ids=lambda s: s.name)
@pytest.mark.parametrize("corner", [False, True], ids=["random", "corner"])
def test_msb_only_plus_lsb_psums_equals_full(sink, corner):
    """MSB_ONLY with psum_in fed the LSB_ONLY RAW psums of the same operands == FULL (the
    verify phase's MSB-from-HB / LSB-from-EXT split, paper 5.2)."""
    rng = _rng(f"msblsb{sink.name}{corner}")
    for rbn, cbn, G in ((2, 3, 4), (1, 4, 8), (4, 2, 1)):
        ops = _operands(rng, rbn=rbn, cbn=cbn, groups=G, corner=corner)
        tok = _tok(rng, rbn * R)
        full = _run_gemm(Mode.FULL, sink, ops, tok)
        lsb = _run_gemm(Mode.LSB_ONLY, Sink.RAW, ops, tok)
        assert len(lsb.link_o) == rbn * cbn * R * L // OV
        split = _run_gemm(Mode.MSB_ONLY, sink, ops, tok, psum_in=True, link_i=lsb.link_o)
        assert split.link_i_used == len(lsb.link_o)
        assert split.statuses()[0]["words_received"] == len(lsb.link_o)
        assert full.statuses()[0]["words_received"] == 0
        assert any(lsb.link_o)                 # the LSB psums matter
        if sink is Sink.RAW:
            assert np.array_equal(_raw_channels(split, Mode.MSB_ONLY, rbn, cbn),
                                  _raw_channels(full, Mode.FULL, rbn, cbn))
        else:
            (d_full, st_full), (d_split, st_split) = _outputs(full, sink), _outputs(split, sink)
            for a, b in zip(d_full, d_split):
                assert np.array_equal(a, b)
            assert st_full["vpu_saturation"] == st_split["vpu_saturation"]
            assert any(x.any() for x in d_full)
        assert not full.state.acc_overflow and not split.state.acc_overflow


@pytest.mark.parametrize("sink", list(Sink), ids=lambda s: s.name)
@pytest.mark.parametrize("mode", [Mode.FULL, Mode.DRAFT, Mode.LSB_ONLY], ids=lambda m: m.name)
def test_k_split_across_two_pes_equals_the_unsplit_gemm(sink, mode):
    """K split: PE 0 runs groups 0..G0-1 to RAW, PE 1 groups G0..G-1 with psum_in (tensor
    parallelism of the down projection, psum-level synchronisation)."""
    rng = _rng(f"ksplit{sink.name}{mode.name}")
    for rbn, cbn, G, G0 in ((2, 2, 6, 2), (1, 3, 5, 4)):
        act, msb, lsb, scl = _operands(rng, rbn=rbn, cbn=cbn, groups=G)
        tok = _tok(rng, rbn * R)
        whole = _run_gemm(mode, sink, (act, msb, lsb, scl), tok)
        first = _run_gemm(mode, Sink.RAW,
                          (act[:, :G0], msb[:, :G0], lsb[:, :G0], scl[:, :G0]), tok)
        second = _run_gemm(mode, sink, (act[:, G0:], msb[:, G0:], lsb[:, G0:], scl[:, G0:]),
                           tok, psum_in=True, link_i=first.link_o)
        if sink is Sink.RAW:
            assert second.link_o == whole.link_o
        else:
            for a, b in zip(_outputs(whole, sink)[0], _outputs(second, sink)[0]):
                assert np.array_equal(a, b)
        st_w, st_s = whole.statuses()[0], second.statuses()[0]
        assert st_w["vpu_saturation"] == st_s["vpu_saturation"]
        assert st_w["gemm_beats"] == first.statuses()[0]["gemm_beats"] + st_s["gemm_beats"]


def test_psum_in_saturates_sets_acc_overflow_and_needs_its_words():
    rng = _rng("pinsat")
    ops = _operands(rng, rbn=1, cbn=2, groups=1)
    tok = _tok(rng, R)
    base = _run_gemm(Mode.DRAFT, Sink.RAW, ops, tok)
    acc = asm.unpack_q24(asm.ints_to_words(base.link_o, PE), PE)
    psum = np.where(acc >= 0, INT64_MAX, INT64_MIN)
    psum[0, 0] = 5                                     # one value that does not saturate
    words = asm.words_to_ints(asm.pack_q24(psum, PE))
    res = _run_gemm(Mode.DRAFT, Sink.RAW, ops, tok, psum_in=True, link_i=words)
    got = asm.unpack_q24(asm.ints_to_words(res.link_o, PE), PE)
    sat = (acc != 0) & (psum != 5)
    assert np.array_equal(got[sat], psum[sat])
    assert got[0, 0] == acc[0, 0] + 5
    assert res.state.acc_overflow and res.statuses()[0]["acc_overflow"] == 1
    assert not base.state.acc_overflow
    with pytest.raises(ProgramError, match=r"command 5: needs 2 link_i words from position 0"):
        _run_gemm(Mode.DRAFT, Sink.RAW, ops, tok, psum_in=True, link_i=words[:1])


def test_rowmax_send_recv_and_unsigned_max():
    rng = _rng("rowmax")
    words_n = asm.target_words(PE, Target.ROWMAX)
    assert words_n == PE.tok_entries // Q
    a = rng.integers(0, 1 << 32, (words_n, Q))
    b = rng.integers(0, 1 << 32, (words_n, Q))
    a[0, :3] = [0x8000_0000, 5, 0xFFFF_FFFF]
    b[0, :3] = [7, 0x8000_0001, 0]
    p = Program(CFG)
    p.recv(Target.ROWMAX, 0, words_n)
    p.send(Target.ROWMAX, 1, 2)
    p.recv(Target.ROWMAX, 0, words_n, accumulate=True)
    p.send(Target.ROWMAX, 0, words_n)
    p.barrier()
    p.status()
    link = asm.words_to_ints(asm.pack_rowmax(a, PE)) + asm.words_to_ints(asm.pack_rowmax(b, PE))
    res = fsim.run(p, link_i=link)
    assert res.link_o[:2] == link[1:3]
    both = asm.unpack_rowmax(asm.ints_to_words(res.link_o[2:], PE), PE)
    assert np.array_equal(both, np.maximum(a, b))
    assert list(both[0, :3]) == [0x8000_0000, 0x8000_0001, 0xFFFF_FFFF]
    assert np.array_equal(res.state.rowmax, np.maximum(a, b).reshape(-1))
    s = res.statuses()[0]
    assert (s["words_received"], s["words_sent"]) == (2 * words_n, 2 + words_n)
    assert asm.command_ranges(PE, p[1].op, p[1].fields) == {"ROWMAX": (Q, 3 * Q)}


def _tp_swiglu(p, ld, act, msb, lsb, scl, tok, *, mode, channels, rbn, buf=0, out_base=0,
               load_tok=True):
    """Load and run one SWIGLU GEMM writing `channels`-wide HBUF rows."""
    G = _load_operands(p, ld, act, msb, lsb, scl, tok, buf=buf, load_tok=load_tok)
    p.gemm(mode=mode, wbuf=buf, act_base=0, w_base=0, row_blocks=rbn, col_blocks=msb.shape[0],
           groups=G, sink=Sink.SWIGLU, out_base=out_base, stride=channels // Q, wait=True,
           release=True)


@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.FULL], ids=lambda m: m.name)
def test_tensor_parallel_swiglu_with_rowmax_all_reduce_equals_one_pe(mode):
    """The intermediate dimension I split across two PEs: each runs SWIGLU on its half,
    SENDs its row maxima, RECVs the other's with accumulate (max all-reduce), then REQUANTs
    its half: codes and e_h equal the single PE's. Run in two phases per PE."""
    rng = _rng(f"tp{mode.name}")
    rbn, G = 2, 2
    P = L // 2 if mode is Mode.DRAFT else L // 4          # channels per block
    halves = 2 if mode is Mode.FULL else 1
    I2 = 32                                               # channels per PE
    cbn = I2 // (P * halves)                              # column blocks per PE
    act, msb, lsb, scl = _operands(rng, rbn=rbn, cbn=2 * cbn, groups=G)
    lsb[:] = 0
    tok = _tok(rng, rbn * R)
    tok["e_x"] = rng.integers(-12, -6, rbn * R)
    # the first half's scales are larger: its row maxima dominate the second half's
    scl[cbn:] = (scl[cbn:] & 0x8000) | rng.integers(0x0400, 0x2000, scl[cbn:].shape)
    scl[:cbn] = (scl[:cbn] & 0x8000) | rng.integers(0x1C00, 0x2C00, scl[:cbn].shape)
    rq = {"row_blocks": rbn, "act_base": 0, "tok_base": 0}
    # one PE: both halves, the second GEMM raises the row max
    p, ld = Program(CFG), []
    _tp_swiglu(p, ld, act, msb[:cbn], lsb[:cbn], scl[:cbn], tok, mode=mode, channels=2 * I2,
               rbn=rbn)
    _tp_swiglu(p, ld, act, msb[cbn:], lsb[cbn:], scl[cbn:], tok, mode=mode, channels=2 * I2,
               rbn=rbn, buf=1, out_base=I2, load_tok=False)
    p.requant(channels=2 * I2, **rq)
    p.barrier()
    one = fsim.run(p, ld).state
    codes_one = asm.unpack_act(one.act[:rbn * 2 * I2 // 32], PE).reshape(rbn, 2, I2 // 32, R, 32)
    # two PEs, two phases each: SWIGLU + SEND ROWMAX, then RECV ROWMAX (max) + REQUANT
    states, sent, local = [], [], []
    rm_words = -(-rbn * R // Q)
    for k in range(2):
        sl = slice(k * cbn, (k + 1) * cbn)
        p, ld = Program(CFG), []
        _tp_swiglu(p, ld, act, msb[sl], lsb[sl], scl[sl], tok, mode=mode, channels=I2, rbn=rbn)
        p.send(Target.ROWMAX, 0, rm_words)
        res = fsim.run(p, ld)
        states.append(res.state)
        sent.append(res.link_o)
        local.append(res.state.rowmax[:rbn * R].copy())
    assert (local[0] != local[1]).any()                   # the all-reduce matters
    for k in range(2):
        p = Program(CFG)
        p.recv(Target.ROWMAX, 0, rm_words, accumulate=True)
        p.requant(channels=I2, **rq)
        p.barrier()
        res = fsim.run(p, link_i=sent[1 - k], state=states[k])
        st = res.state
        assert st.commands_run == 7 + 3
        assert np.array_equal(st.rowmax[:rbn * R], one.rowmax[:rbn * R])
        codes = asm.unpack_act(st.act[:rbn * I2 // 32], PE).reshape(rbn, I2 // 32, R, 32)
        assert np.array_equal(codes, codes_one[:, k])
        assert np.array_equal(st.tok_entries()["e_h"][:rbn * R],
                              one.tok_entries()["e_h"][:rbn * R])
        assert np.array_equal(st.hbuf_values().reshape(-1, I2)[:rbn * R],
                              one.hbuf_values().reshape(-1, 2 * I2)[:rbn * R, k * I2:(k + 1) * I2])


def test_phased_runs_equal_one_run_and_keep_the_sync_state():
    rng = _rng("phases")
    ops = _operands(rng, rbn=2, cbn=2, groups=3)
    tok = _tok(rng, 2 * R)
    lsb = _run_gemm(Mode.LSB_ONLY, Sink.RAW, ops, tok)
    act, msb, lsb_n, scl = ops
    p1, ld = Program(CFG), []
    _load_operands(p1, ld, act, msb, lsb_n, scl, tok)
    p2 = Program(CFG)
    p2.gemm(mode=Mode.MSB_ONLY, wbuf=0, act_base=0, w_base=0, row_blocks=2, col_blocks=2,
            groups=3, sink=Sink.COMBINE, stride=2, wait=True, release=True, psum_in=True)
    p2.output(row_blocks=2, channels=Q)
    p2.status()
    whole = Program(CFG)
    for c in list(p1) + list(p2):
        whole.append(c.op, **c.fields)
    one = fsim.run(whole, ld, lsb.link_o)
    st = fsim.PEState.reset(CFG)
    a = fsim.run(p1, ld, state=st)
    b = fsim.run(p2, link_i=lsb.link_o, state=st)
    assert a.state is b.state is st and st.commands_run == len(whole)
    assert [o.as_int() for o in b.o] == [o.as_int() for o in one.o]
    assert np.array_equal(st.out, one.state.out)
    # the checker carries over: phase 2's GEMM waited on the buffer phase 1 signalled, so a
    # third phase reusing the released buffer's words is fine, but a GEMM waiting again is not
    p3 = Program(CFG)
    p3.gemm(mode=Mode.MSB_ONLY, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
            groups=1, sink=Sink.RAW, wait=True)
    with pytest.raises(ProgramError, match=rf"command {len(whole)}: GEMM waits on WMEM buffer 0"):
        fsim.run(p3, state=st)
    # a LOAD over ACT words the phase-2 GEMM used needs ordering, across phases too
    p4, ld4 = Program(CFG), []
    _load(p4, ld4, Target.ACT, asm.pack_act(act.reshape(-1, R, 32)[:1], PE))
    with pytest.raises(ProgramError, match="LOAD ACT into ACT words 0..0 while command"):
        fsim.run(p4, ld4, state=fsim.run(p2, link_i=lsb.link_o,
                                         state=fsim.run(p1, ld).state).state)
    with pytest.raises(ValueError, match="state"):
        fsim.run(Program(preset("paper-4gb")), state=fsim.PEState.reset(CFG))


def test_matrix_packers_give_the_golden_gemm():
    """asm.pack_weight_matrix / pack_act_matrix lay a matrix out as docs/pe.md says: the RAW
    results of FULL and of MSB_ONLY + LSB_ONLY psums equal the golden GEMM."""
    from elmoe3d.sw.golden.datapath import gemm
    from elmoe3d.sw.golden.quant import quantize_weights
    rng = _rng("packers")
    a_q = rng.integers(-128, 128, (5, 96)).astype(np.int8)
    qw = quantize_weights(rng.standard_normal((10, 96)).astype(np.float32))
    msb, lsb, scl = asm.pack_weight_matrix(qw.q, qw.scale, PE)
    acts = asm.pack_act_matrix(a_q, PE)
    G, rbn, cbn = 3, 3, 3
    assert (len(msb), len(lsb), len(scl), len(acts)) == (cbn * G, cbn * G, 2, rbn * G)

    def run(mode, link_i=()):
        p, ld = Program(CFG), []
        _load(p, ld, Target.ACT, acts)
        for target, words in ((Target.WMSB, msb), (Target.WLSB, lsb)):
            _load(p, ld, target, words)
        _load(p, ld, Target.WSCALE, scl, signal=True)
        p.gemm(mode=mode, wbuf=0, act_base=0, w_base=0, row_blocks=rbn, col_blocks=cbn,
               groups=G, sink=Sink.RAW, wait=True, release=True, psum_in=bool(link_i))
        return fsim.run(p, ld, link_i)

    want = gemm(a_q, qw, Mode.FULL).acc
    assert np.array_equal(_raw_channels(run(Mode.FULL), Mode.FULL, rbn, cbn)[:5, :10], want)
    split = run(Mode.MSB_ONLY, run(Mode.LSB_ONLY).link_o)
    assert np.array_equal(_raw_channels(split, Mode.MSB_ONLY, rbn, cbn)[:5, :10], want)
    with pytest.raises(ValueError, match="scale"):
        asm.pack_weight_matrix(qw.q, qw.scale[:, :1], PE)


def test_matrix_packers_reject_what_they_would_garble():
    """Scales that are neither FP16 values nor FP16 bits (float32 0.01 would become bits 0),
    codes outside INT8 (200 would wrap to another nibble pair) and non-integer activations
    (1.7 would truncate) are ValueErrors naming the argument, not silently different words."""
    q = np.zeros((PE.lanes, 64), np.int8)
    s16 = np.ones((PE.lanes, 2), np.float16)
    with pytest.raises(ValueError, match="^scale: expected FP16"):
        asm.pack_weight_matrix(q, s16.astype(np.float32), PE)
    with pytest.raises(ValueError, match="^scale: expected FP16"):
        asm.pack_weight_matrix(q, s16.view(np.uint16).astype(np.int64), PE)
    with pytest.raises(ValueError, match=r"^q: .*-128\.\.127"):
        asm.pack_weight_matrix(np.full((PE.lanes, 64), 200), s16, PE)
    with pytest.raises(ValueError, match="^q: expected"):
        asm.pack_weight_matrix(q.astype(np.float32), s16, PE)
    with pytest.raises(ValueError, match="^a_q: expected"):
        asm.pack_act_matrix(np.full((2, 32), 1.7), PE)
    # what they accept: FP16 values or their uint16 bits (the same words), any int dtype
    a = asm.pack_weight_matrix(q.astype(np.int64), s16, PE)
    b = asm.pack_weight_matrix(q, s16.view(np.uint16), PE)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


# ---- K-chained GEMMs: acc_hold, acc_cont --------------------------------------------------------

def _chunks(rng, G, n):
    """``n`` random K chunks ``(g0, g1)`` covering groups ``0..G-1`` in order."""
    cuts = np.sort(rng.choice(np.arange(1, G), n - 1, replace=False))
    edges = [0, *map(int, cuts), G]
    return list(zip(edges[:-1], edges[1:]))


def _run_chain(steps, sink, operands, tok, *, psum_in=False, link_i=()):
    """One PE: load the operands (one row block, one column block; buffer 0), then one GEMM per
    step ``(mode, g0, g1)`` over groups ``g0..g1-1``, each but the first with acc_cont, each but
    the last with acc_hold (the last releases the buffer and takes psum_in); BARRIER,
    STATUS."""
    act, msb, lsb, scl = operands
    p, ld = Program(CFG), []
    _load_operands(p, ld, act, msb, lsb, scl, tok)
    for k, (mode, g0, g1) in enumerate(steps):
        last = k == len(steps) - 1
        p.gemm(mode=mode, wbuf=0, act_base=g0, w_base=g0, row_blocks=1, col_blocks=1,
               groups=g1 - g0, sink=sink, wait=True, release=last, acc_cont=k > 0,
               acc_hold=not last, psum_in=psum_in and last, **_sink_fields(sink, 1))
    p.barrier()
    p.status()
    return fsim.run(p, ld, link_i)


@pytest.mark.parametrize("sink", list(Sink), ids=lambda s: s.name)
@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.MSB_ONLY, Mode.LSB_ONLY],
                         ids=lambda m: m.name)
def test_k_chain_equals_one_gemm_over_the_whole_k(sink, mode):
    """GEMMs over K chunks chained with acc_hold / acc_cont == one GEMM over the whole K: the
    tile results (gemm_results, folding the held accumulators), the sink's outputs and every
    functional STATUS field (gemm_beats counts the held GEMMs' beats); with psum_in on the
    last GEMM too."""
    rng = _rng(f"kchain{sink.name}{mode.name}")
    for G, n, corner, psum_in in ((6, 2, False, False), (8, 4, True, False),
                                  (5, 3, False, True), (12, 3, True, True)):
        ops = _operands(rng, rbn=1, cbn=1, groups=G, corner=corner)
        tok = _tok(rng, R)
        link_i = asm.words_to_ints(asm.pack_q24(rng.integers(-2**40, 2**40, (1, OV)), PE)) \
            if psum_in else []
        chunks = _chunks(rng, G, n)
        whole = _run_gemm(mode, sink, ops, tok, psum_in=psum_in, link_i=link_i)
        chain = _run_chain([(mode, g0, g1) for g0, g1 in chunks], sink, ops, tok,
                           psum_in=psum_in, link_i=link_i)
        # the tile results, chunk after chunk from the held accumulators
        st = chain.state
        f = dict(mode=int(mode), wbuf=0, row_blocks=1, col_blocks=1, sink=int(sink),
                 out_base=0, tok_base=0, wait=0, release=0, stride=0)
        held = None
        for g0, g1 in chunks:
            acc, ovf = fsim.gemm_results(st, {**f, "act_base": g0, "w_base": g0,
                                              "groups": g1 - g0}, held)
            held = fsim.Accumulator(acc.reshape(R, L), ovf.reshape(R, L))
        acc_w, ovf_w = fsim.gemm_results(st, {**f, "act_base": 0, "w_base": 0, "groups": G})
        assert np.array_equal(held.acc, acc_w.reshape(R, L)) and not ovf_w.any()
        assert chain.link_o == whole.link_o
        for a, b in zip(_outputs(whole, sink)[0], _outputs(chain, sink)[0]):
            assert np.array_equal(a, b)
        assert chain.statuses() == whole.statuses()
        assert chain.statuses()[0]["gemm_beats"] == G and chain.state.held is None
        if sink is Sink.RAW:
            assert any(chain.link_o)


@pytest.mark.parametrize("sink", list(Sink), ids=lambda s: s.name)
@pytest.mark.parametrize("order", ["lsb_then_msb", "per_chunk"])
def test_lsb_only_plus_msb_only_chain_equals_full(sink, order):
    """A chain of LSB_ONLY and MSB_ONLY GEMMs over K chunks (every LSB_ONLY chunk, then every
    MSB_ONLY chunk; or both of each chunk in turn, reading each loaded weight word once) ==
    FULL over the whole K, on FULL's channels (MSB_ONLY + LSB_ONLY == FULL, numerics 3): RAW
    accumulators by weight row, HBUF and row maxima, OUT; the same beats (FULL: two halves)
    and loads in STATUS (RAW: FULL sends its two results, the chain one)."""
    rng = _rng(f"lsbmsbchain{sink.name}{order}")
    for G, n, corner in ((4, 2, False), (7, 3, True), (3, 1, False)):
        ops = _operands(rng, rbn=1, cbn=1, groups=G, corner=corner)
        tok = _tok(rng, R)
        chunks = _chunks(rng, G, n)
        if order == "lsb_then_msb":
            steps = ([(Mode.LSB_ONLY, *c) for c in chunks]
                     + [(Mode.MSB_ONLY, *c) for c in chunks])
        else:
            steps = [(m, *c) for c in chunks for m in (Mode.LSB_ONLY, Mode.MSB_ONLY)]
        full = _run_gemm(Mode.FULL, sink, ops, tok)
        chain = _run_chain(steps, sink, ops, tok)
        if sink is Sink.RAW:
            assert np.array_equal(_raw_channels(chain, Mode.MSB_ONLY, 1, 1),
                                  _raw_channels(full, Mode.FULL, 1, 1))
        else:
            for a, b in zip(_outputs(full, sink)[0], _outputs(chain, sink)[0]):
                assert np.array_equal(a, b)
            assert any(x.any() for x in _outputs(full, sink)[0])
        (st_c,), (st_f,) = chain.statuses(), full.statuses()
        if sink is Sink.RAW:                  # FULL's two results, the chain's one
            assert (st_f["words_sent"], st_c["words_sent"]) == (2, 1)
            st_f["words_sent"] = st_c["words_sent"]
        assert st_c == st_f and st_f["gemm_beats"] == 2 * G


def test_k_chain_carries_saturation_and_needs_its_pairing():
    """The sticky overflow flags travel with the held accumulators: a held GEMM that saturates
    sets acc_overflow only when the chain's result is emitted (a CLEAR flags in between does
    not lose it), and the result keeps the chain order (saturated, then the later terms). A
    GEMM that continues nothing, a new result while accumulators are held, a chained GEMM of
    more than one result and psum_in on a held GEMM are errors."""
    rng = _rng("kchainsat")
    G = 24
    act = np.full((1, G, R, 32), -128)
    msb = np.full((1, G, L, 32), 8)
    lsb = np.zeros((1, G, L, 32), np.int64)
    scl = np.full((1, G, L), 0x7BFF, np.uint16)
    scl[:, 20:] |= 0x8000                             # groups 20..23 negative
    tok = _tok(rng, R)
    p, ld = Program(CFG), []
    _load_operands(p, ld, act, msb, lsb, scl, tok)
    geo = dict(wbuf=0, row_blocks=1, col_blocks=1, sink=Sink.RAW, wait=True)
    p.gemm(mode=Mode.MSB_ONLY, act_base=0, w_base=0, groups=20, acc_hold=True, **geo)
    p.barrier()
    p.status()
    p.clear(flags=True)
    p.gemm(mode=Mode.MSB_ONLY, act_base=20, w_base=20, groups=4, acc_cont=True, release=True,
           **geo)
    p.status()
    res = fsim.run(p, ld)
    term = 2047 << 48                                 # psum 2^19 x scale 0x7BFF
    acc = asm.unpack_q24(asm.ints_to_words(res.link_o, PE), PE)
    assert (acc == INT64_MAX - 4 * term).all() and 16 * term < INT64_MAX < 20 * term
    assert [s["acc_overflow"] for s in res.statuses()] == [0, 1]
    for bad, match in (([dict(acc_cont=True)], "no earlier GEMM holds any"),
                       ([dict(acc_hold=True), dict()], "starts a new result while the tile")):
        q, ld = Program(CFG), []
        _load_operands(q, ld, act, msb, lsb, scl, tok)
        for kw in bad:
            q.gemm(mode=Mode.MSB_ONLY, act_base=0, w_base=0, groups=1, **geo, **kw)
        with pytest.raises(ProgramError, match=match):
            fsim.run(q, ld)
    # one result only (FULL has two: LSB_ONLY + MSB_ONLY instead), and no psum_in to hold
    for kw, match in ((dict(mode=Mode.FULL, row_blocks=1, acc_hold=True), "one result"),
                      (dict(mode=Mode.DRAFT, row_blocks=2, acc_cont=True), "one result"),
                      (dict(mode=Mode.DRAFT, row_blocks=1, acc_hold=True, psum_in=True),
                       "emits no result")):
        with pytest.raises(ProgramError, match=match):
            Program(CFG).gemm(wbuf=0, act_base=0, w_base=0, col_blocks=1, groups=1,
                              sink=Sink.RAW, **kw)

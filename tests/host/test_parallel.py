"""Phase-wise parallelism on a PE group (sw.host.parallel, paper Sections 5.1-5.2): the per-PE
programs of draft HB-only TP, the verify MSB-TP / LSB-DP split (psum-level synchronisation) and
uncached experts streamed from EXT, run on one functional-simulator state per PE joined by the
golden aggregation link, equal the single-PE golden result (ref_moe) and the single-PE fsim
program bit for bit. Routing: the real Mixtral-8x7B trace (../shared/traces, gsm8k); expert
weights and activations: synthetic (seeded Gaussians, sim.bench_pe's generator)."""

import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from elmoe3d.config import preset
from elmoe3d.isa import Op, Sink, Source, Target
from elmoe3d.sim.bench_pe import default_routing, read_routing
from elmoe3d.sw.golden import expert as ex
from elmoe3d.sw.host import parallel as par
from elmoe3d.sw.golden.asm import Program, ProgramError
from elmoe3d.sw.golden.datapath import Mode
from elmoe3d.sw.host.compiler import synthetic_experts
from elmoe3d.sw.golden.agg_link import LinkMode, LinkOp

SEED = 4242
CFG = preset("small")
PE = CFG.pe
H, I = 64, 128          # small preset: up/gate 64 column blocks (4 buffer-fulls), down 16
N_EXPERTS = 8
#: the layers the real trace is read at, per batch size (as sim/bench_pe.py does)
LAYERS = {1: 0, 4: 15, 16: 31}


def _rng(tag):
    seed = SEED + sum(map(ord, tag))
    print(f"seed {seed} ({tag})")
    return np.random.default_rng(seed)


@functools.cache
def _experts():
    """Eight synthetic experts (labelled synthetic: seeded Gaussians with per-group magnitudes
    over two decades), quantized once."""
    return tuple(ex.Expert.quantize(*w, name=f"synthetic{i}")
                 for i, w in enumerate(synthetic_experts(_rng("experts"), N_EXPERTS, H, I)))


@pytest.fixture(scope="module")
def experts():
    return list(_experts())


def _trace(tokens):
    ids, wts, _ = read_routing(default_routing(), problem=0, layer=LAYERS[tokens],
                               tokens=tokens)
    return ids, wts


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _check(job, experts, x, *, single_pe=False):
    """The group's result equals ref_moe (FP32 bits, Q.24 sums, flags) and, if asked, the
    single-PE program on fsim; returns the GroupResult."""
    res = par.run_group(job)
    ref = ex.ref_moe(x, experts, job.info["routing"], job.mode)
    assert np.array_equal(_bits(res.y), _bits(ref.y))
    assert np.array_equal(res.out, ref.out)
    assert res.acc_overflow == ref.acc_overflow
    assert res.vpu_saturation == ref.vpu_saturation
    # every PE's STATUS counts what its program moved
    for p, s in enumerate(res.statuses):
        assert s["words_loaded"] == len(job.ld[p])
        sent = sum(n for k, n, _ in par.link_actions(PE, job.programs[p]) if k == "out")
        got = sum(n for k, n, _ in par.link_actions(PE, job.programs[p]) if k == "in")
        assert (s["words_sent"], s["words_received"]) == (sent, got)
    if single_pe and (np.asarray(job.info["routing"][0]) >= 0).any():
        one = ex.build_moe_program(x, experts, job.info["routing"], job.mode, CFG)
        y1 = one.decode(one.run_fsim())
        assert np.array_equal(_bits(res.y), _bits(y1))
    return res, ref


CACHED = [0, 2, 3, 5, 6]     # HB-resident experts of the verify runs (1, 4 and 7 are not)


@pytest.mark.parametrize("tokens", [1, 4, 16])
@pytest.mark.parametrize("pes", [2, 4])
@pytest.mark.parametrize("phase", ["draft", "verify"])
def test_trace_layer_equals_single_pe(experts, phase, pes, tokens):
    """A layer routed by the real Mixtral trace on a group of 2 or 4 PEs: draft (all routed
    experts HB-resident) and verify (cached and uncached experts in the same layer)."""
    ids, wts = _trace(tokens)
    x = _rng(f"x{tokens}").standard_normal((tokens, H)) * 2.0
    cached = None if phase == "draft" else CACHED
    job = par.compile_group(x, experts, (ids, wts), phase=phase, config=CFG, pes=pes,
                            cached=cached)
    res, ref = _check(job, experts, x, single_pe=True)
    assert not ref.acc_overflow and np.abs(ref.y).max() > 0
    routed = sorted(set(ids[ids >= 0].tolist()))
    assert sorted(job.info["experts"]) == routed
    if phase == "verify":
        assert any(e in CACHED for e in routed)
        kinds = {op.mode for op in job.link_ops}
        assert LinkMode.REDUCE_ADD in kinds and LinkMode.ALL_TO_ALL in kinds
        if tokens > 1:
            assert LinkMode.BYPASS in kinds
    else:
        assert {op.mode for op in job.link_ops} == {LinkMode.REDUCE_MAX, LinkMode.REDUCE_ADD}
    # the word-level link model and the functional run moved every descriptor's words
    assert res.link_words == job.traffic()["link_words_sent"] == res.schedule["link_words"]


def test_draft_programs_use_the_split(experts):
    """Draft TP: every PE loads only its HB slices (MSB planes and scales, no LSB), SWIGLU in
    DRAFT into an HBUF slice of I/G channels, the row max all-reduced before REQUANT of I/G
    channels, K-split down GEMMs: RAW on the other PEs, COMBINE with psum_in on the root."""
    ids, wts = _trace(4)
    x = _rng("draftsplit").standard_normal((4, H))
    G = 4
    job = par.compile_group(x, experts, (ids, wts), phase="draft", config=CFG, pes=G)
    for p, prog in enumerate(job.programs):
        loads = [c for c in prog if c.op is Op.LOAD]
        assert {Source(c.fields["src"]) for c in loads} == {Source.HOST, Source.HB}
        assert not any(c.fields["target"] == Target.WLSB for c in loads)
        gemms = [c for c in prog if c.op is Op.GEMM]
        assert {Mode(g.fields["mode"]) for g in gemms} == {Mode.DRAFT}
        sinks = {Sink(g.fields["sink"]) for g in gemms}
        assert sinks == ({Sink.SWIGLU, Sink.COMBINE} if p == job.root
                         else {Sink.SWIGLU, Sink.RAW})
        rq = [c for c in prog if c.op is Op.REQUANT]
        assert {c.fields["channels"] for c in rq} == {I // G}
        sends = [c for c in prog if c.op is Op.SEND]
        assert {Target(c.fields["target"]) for c in sends} == {Target.ROWMAX}
        # the row-max RECV precedes every REQUANT of the same expert
        idx = [i for i, c in enumerate(prog) if c.op in (Op.RECV, Op.REQUANT)]
        assert [prog[i].op for i in idx] == [Op.RECV, Op.REQUANT] * len(rq)
        assert all(g.fields["psum_in"] == (p == job.root and g.fields["sink"] == Sink.COMBINE)
                   for g in gemms)
    t = job.traffic()
    assert not t["ext_ring_bytes"] and not any(t["ext_pe_bytes"])
    # each PE streams 1/G of the routed experts' MSB planes and scales
    assert len({sum(h.values()) for h in t["hb_bytes"]}) == 1


def test_verify_programs_use_the_split(experts):
    """Verify of a cached expert: the owner's MSB_ONLY RAW GEMMs and FULL SWIGLU, the others'
    LSB_ONLY SWIGLU with psum_in; h scattered with ALL_TO_ALL; MSB_ONLY RAW and LSB_ONLY
    COMBINE with psum_in in the down projection; the LSB planes multicast on the ring."""
    x = _rng("verifysplit").standard_normal((16, H))
    routing = (np.full((16, 1), 2), np.ones((16, 1)))
    G = 4
    job = par.compile_group(x, experts, routing, phase="verify", config=CFG, pes=G,
                            cached=[2])
    _check(job, experts, x)
    for prog in job.programs:
        kinds = {(Mode(g.fields["mode"]), Sink(g.fields["sink"]), g.fields["psum_in"])
                 for g in prog if g.op is Op.GEMM}
        assert kinds == {(Mode.MSB_ONLY, Sink.RAW, 0), (Mode.FULL, Sink.SWIGLU, 0),
                         (Mode.LSB_ONLY, Sink.SWIGLU, 1), (Mode.LSB_ONLY, Sink.COMBINE, 1)}
    t = job.traffic()
    nb = PE.word_bytes
    # LSB planes of up/gate (2I x H nibbles) and down (H x I) cross the ring once each, and
    # reach all four PEs (multicast); the HB banks hold the MSB planes split four ways
    lsb_ring = t["ext_ring_bytes"]["up/gate LSB"] + t["ext_ring_bytes"]["down LSB"]
    assert lsb_ring == (2 * I * H + H * I) // 2
    assert all(b > lsb_ring for b in t["ext_pe_bytes"])
    assert sum(h["WMSB"] for h in t["hb_bytes"]) == (2 * I * H + H * I) // 2
    assert all(h["WMSB"] == (2 * I * H + H * I) // 2 // G for h in t["hb_bytes"])
    assert all(tr.dst_mask == 0b1111 for tr in job.ext_transfers if "LSB" in tr.what)
    assert t["link_words_sent"] > 0 and nb == 64


def test_draft_tp_runs_an_expert_one_pe_cannot_hold():
    """Tensor parallelism splits the intermediate dimension: with I = 512 and 16 tokens the h
    rows (ACT) and HBUF rows of one PE overflow (the single-PE builder refuses), a quarter of
    them fits each of 4 PEs; the draft still equals ref_moe bit for bit."""
    rng = _rng("wide")
    big = [ex.Expert.quantize(*w, name=f"synthetic_wide{i}")
           for i, w in enumerate(synthetic_experts(rng, 2, H, 512))]
    x = rng.standard_normal((16, H))
    routing = (np.tile([0, 1], (16, 1)), rng.uniform(0.2, 1.0, (16, 2)))
    with pytest.raises(ProgramError, match="ACT words|HBUF"):
        ex.build_moe_program(x, big, routing, Mode.DRAFT, CFG)
    with pytest.raises(ProgramError, match="HBUF rows"):
        par.compile_group(x, big, routing, phase="verify", config=CFG, pes=4)
    job = par.compile_group(x, big, routing, phase="draft", config=CFG, pes=4)
    _check(job, big, x)


def test_streams_images_and_transfers_agree(experts):
    """What the die's load router and memory models need: per-PE ld words split by source
    (HB words = the PE's HB image at the LOADs' hb_addr, EXT words = the ring transfers naming
    the PE in order, HOST the rest), EXT transfers = words of the EXT image; the HB images of
    draft and verify are the same bytes (one copy of the MSB slices serves both phases)."""
    ids, wts = _trace(16)
    ids = np.where(np.isin(ids, CACHED), ids, -1)     # draft: HB experts only
    x = _rng("streams").standard_normal((16, H))
    jobs = {ph: par.compile_group(x, experts, (ids, wts), phase=ph, config=CFG, pes=2,
                                  cached=CACHED) for ph in par.PHASES}
    assert jobs["draft"].hb_images == jobs["verify"].hb_images
    assert jobs["draft"].ext_image == jobs["verify"].ext_image
    for job in jobs.values():
        for p in range(job.pes):
            streams = job.streams(p)
            assert sum(map(len, streams.values())) == len(job.ld[p])
            hb = [w for a, n in job.hb_reads(p) for w in job.hb_images[p][a:a + n]]
            assert hb == streams[Source.HB]
            ext = [w for tr in job.ext_transfers if tr.dst_mask >> p & 1 for w in tr.words]
            assert ext == streams[Source.EXT]
            assert all(job.programs[p][i].fields["src"] == s
                       for i, s, _, _ in job.load_src[p])
        for tr in job.ext_transfers:
            assert list(tr.words) == job.ext_image[tr.addr:tr.addr + len(tr.words)]


@pytest.mark.parametrize("pes", [2, 4])
def test_hb_slices_are_the_single_pe_msb_words(experts, pes):
    """The HB banks hold exactly the single-PE program's MSB plane words, split by channel
    (up/gate: whole column blocks) and by K (down: whole groups): one copy of the MSB slices,
    the same layout as sw/golden/expert.py's builder."""
    e = 3
    x = _rng("hbwords").standard_normal((2, H))
    routing = (np.full((2, 1), e), np.ones((2, 1)))
    job = par.compile_group(x, experts, routing, phase="draft", config=CFG, pes=pes,
                            cached=[e])
    one = ex.build_moe_program(x, experts, routing, Mode.DRAFT, CFG)
    Gu, Ga = H // 32, I // 32
    ncp, Gp = 2 * I // PE.lanes // pes, Ga // pes
    up_words = ncp * Gu
    up_scales = -(-up_words // 8)
    up = [w for p in range(pes) for w in job.hb_images[p][:up_words]]
    assert up == one.weight_words(e, "up", Target.WMSB)
    down = one.weight_words(e, "down", Target.WMSB)
    for p in range(pes):
        base = up_words + up_scales
        for cb in range(H // PE.lanes):
            for g in range(Gp):
                assert job.hb_images[p][base + cb * Gp + g] == down[cb * Ga + p * Gp + g]


def test_corner_cases(experts):
    """A token routed to no expert of the group (its row is 0), uneven token counts across the
    PEs (expert 2's six tokens = 3 row blocks on 2 and 4 PEs: one PE without tokens), one
    token, a group that gets no token at all."""
    rng = _rng("corners")
    x = rng.standard_normal((7, H))
    ids = np.array([[1, 2], [5, 6], [2, 1], [2, 6], [2, 5], [2, 1], [6, 2]])
    wts = rng.uniform(0.1, 0.9, (7, 2))
    for pes in (2, 4):
        for phase in par.PHASES:
            job = par.compile_group(x, experts, (ids, wts), phase=phase, config=CFG, pes=pes,
                                    group_experts=[1, 2], cached=[1, 2] if phase == "draft"
                                    else [2])
            res, ref = _check(job, experts, x, single_pe=True)
            assert np.all(res.y[1] == 0) and np.any(res.y[0] != 0)
            if phase == "verify":
                sl = job.info["experts"][2]["token_slices"]
                assert sorted(b - a for a, b in sl) == ([1, 2] if pes == 2 else [0, 1, 1, 1])
                assert all(a1 == b0 for (_, a1), (b0, _) in zip(sl, sl[1:]))
    one = x[:1]
    for phase in par.PHASES:
        job = par.compile_group(one, experts, (np.array([[3]]), np.array([[0.7]])),
                                phase=phase, config=CFG, pes=4)
        _check(job, experts, one, single_pe=True)
    job = par.compile_group(x, experts, (ids, wts), phase="verify", config=CFG, pes=2,
                            group_experts=[0, 7])
    res, _ = _check(job, experts, x)
    assert not res.y.any() and not job.info["experts"]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_layers_equal_ref_moe(data):
    """Random groups, batches, routings (top-1 or top-2, empty slots), cached sets, FIFO
    depths and root PEs: bit-exact every time."""
    pes = data.draw(st.sampled_from([2, 4]), "pes")
    tokens = data.draw(st.integers(1, 16), "tokens")
    phase = data.draw(st.sampled_from(par.PHASES), "phase")
    k = data.draw(st.integers(1, 2), "k")
    seed = data.draw(st.integers(0, 2**16), "seed")
    rng = np.random.default_rng(seed)
    pool = [0, 1, 2, 3]
    cached = sorted(data.draw(st.sets(st.sampled_from(pool), min_size=1), "cached"))
    choose = cached if phase == "draft" else pool
    k = min(k, len(choose))
    ids = np.array([rng.choice(choose, size=k, replace=False) for _ in range(tokens)])
    ids[rng.random(ids.shape) < 0.15] = -1
    wts = rng.uniform(0.05, 1.0, ids.shape)
    buffer_words = data.draw(st.sampled_from([16, 32, 64]), "buffer_words")
    root = data.draw(st.integers(0, pes - 1), "root")
    x = rng.standard_normal((tokens, H)) * rng.uniform(0.2, 3.0, (tokens, 1))
    experts = list(_experts()[:4])
    job = par.compile_group(x, experts, (ids, wts), phase=phase, config=CFG, pes=pes,
                            cached=cached, buffer_words=buffer_words, root=root)
    res, _ = _check(job, experts, x)
    assert [bool(res.o[p]) and res.o[p][0].kind.name == "DATA" for p in range(pes)] == \
        [p == root for p in range(pes)]
    assert res.schedule["link_words"] == job.traffic()["link_words_sent"]


def test_schedule_check_finds_deadlocks(experts):
    """The schedule model (engines, link FIFOs, ring) fails on a schedule that needs more FIFO
    than it has: two PEs that each send before receiving deadlock when the first transfer
    exceeds the link FIFO; a multicast EXT transfer waiting for a PE whose loads wait for the
    other PE deadlocks on a too small EXT FIFO; a verify program cut for 32-word link FIFOs
    deadlocks on 4-word ones (a token owner's ALL_TO_ALL scatter sends its own chunks back to
    itself before its RECV); words no descriptor takes and words nobody reads are errors."""
    progs = []
    for _ in range(2):
        prog = Program(CFG)
        prog.send(Target.OUT, 0, 8)
        prog.recv(Target.OUT, 0, 8)
        progs.append(prog)
    ops = [LinkOp(LinkMode.BYPASS, 0b01, 0b10, 8), LinkOp(LinkMode.BYPASS, 0b10, 0b01, 8)]
    assert par.check_link_schedule(progs, ops, buffer_words=8)["max_fifo_words"] == [8, 8]
    with pytest.raises(par.LinkScheduleError, match="deadlock.*buffer_words = 4"):
        par.check_link_schedule(progs, ops, buffer_words=4)
    with pytest.raises(par.LinkScheduleError, match="sources never send"):
        par.check_link_schedule(progs, ops + [LinkOp(LinkMode.BYPASS, 1, 2, 1)],
                                buffer_words=8)
    with pytest.raises(par.LinkScheduleError, match="never read"):
        par.check_link_schedule(progs, ops[:1] + [LinkOp(LinkMode.BYPASS, 0b10, 0b11, 8)],
                                buffer_words=16)
    with pytest.raises(par.LinkScheduleError):      # PE 1's words: no descriptor takes them
        par.check_link_schedule(progs, ops[:1], buffer_words=8)
    # the ring: a multicast transfer both PEs load from; PE 0 drains its EXT FIFO only after
    # a GEMM that waits for PE 1's words, and PE 1 sends them only after its EXT load: a
    # one-word EXT FIFO deadlocks, a two-word one does not
    gemm = dict(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=1, col_blocks=1,
                groups=1, sink=Sink.COMBINE, stride=1, wait=True, release=True)

    def pair(words0):
        # PE 0 waits for PE 1's OUT word, then loads words0 EXT words; PE 1 loads 2 first
        a, b = Program(CFG), Program(CFG)
        a.load(Target.WSCALE, 0, 1, signal=True, src=Source.HB)
        a.recv(Target.OUT, 0, 1)
        a.gemm(**gemm)
        a.load(Target.WMSB, 0, words0, src=Source.EXT)
        b.load(Target.WMSB, 0, 2, signal=True, src=Source.EXT)
        b.gemm(**gemm)
        b.send(Target.OUT, 0, 1)
        return a, b

    p0, p1 = pair(2)
    ring = [par.ExtTransfer(0, (1, 2), 0b11)]
    one = [LinkOp(LinkMode.BYPASS, 0b10, 0b01, 1)]
    got = par.check_link_schedule([p0, p1], one, buffer_words=1, ext_transfers=ring,
                                  ext_fifo_words=2, ext_chunk_words=2)
    assert got["max_ext_fifo_words"] == [2, 2]
    with pytest.raises(par.LinkScheduleError, match="ring: 1 transfers not sent"):
        par.check_link_schedule([p0, p1], one, buffer_words=1, ext_transfers=ring,
                                ext_fifo_words=1, ext_chunk_words=1)
    with pytest.raises(ValueError, match="ext_chunk_words: 2 exceeds ext_fifo_words"):
        par.check_link_schedule([p0, p1], one, buffer_words=1, ext_transfers=ring,
                                ext_fifo_words=1, ext_chunk_words=2)
    # the admission window: PE 0's transfer comes first but PE 0 drains its FIFO only after
    # PE 1's words, which need PE 1's transfer behind it: in order (window 1) it deadlocks
    # (head-of-line blocking), with a window of 2 PE 1's transfer passes
    q0, q1 = pair(4)
    two = [par.ExtTransfer(0, (1, 2, 3, 4), 0b01), par.ExtTransfer(4, (5, 6), 0b10)]
    with pytest.raises(par.LinkScheduleError, match="deadlock"):
        par.check_link_schedule([q0, q1], one, buffer_words=1, ext_transfers=two,
                                ext_fifo_words=2, ext_chunk_words=2)
    got = par.check_link_schedule([q0, q1], one, buffer_words=1, ext_transfers=two,
                                  ext_fifo_words=2, ext_chunk_words=2, ext_window=2)
    assert got["max_ext_fifo_words"] == [2, 2]
    x = _rng("dead").standard_normal((16, H))
    job = par.compile_group(x, experts, (np.full((16, 1), 0), np.ones((16, 1))),
                            phase="verify", config=CFG, pes=2)
    # the compiled schedule holds with the router's EXT FIFO down to one word (the strictest
    # ring: a multicast word moves to all its PEs at once)
    assert par.check_link_schedule(job, ext_fifo_words=1, ext_chunk_words=1)[
        "max_ext_fifo_words"] == [1, 1]
    with pytest.raises(par.LinkScheduleError, match="deadlock"):
        par.check_link_schedule(job, buffer_words=4)
    job.buffer_words = 4
    with pytest.raises(par.LinkScheduleError):
        par.run_group(job)


def test_bad_inputs(experts):
    x = np.zeros((4, H))
    rt = (np.zeros((4, 1), np.int64), np.ones((4, 1)))

    def fails(match, **kw):
        args = dict(x=x, experts=experts, routing=rt, phase="draft", config=CFG, pes=2)
        args.update(kw)
        with pytest.raises(ValueError, match=match):
            par.compile_group(args.pop("x"), args.pop("experts"), args.pop("routing"), **args)

    fails("^pes: 3 PEs must divide the 64 up/gate column blocks", pes=3)
    fails("^pes: 8 PEs must divide", pes=8)            # I/8 = 16 channels: not 32
    fails("^pes: expected an integer >= 2", pes=1)
    fails("^phase:", phase="prefill")
    fails("^buffer_words: expected a positive integer", buffer_words=0)
    fails("^buffer_words: 1 words cannot hold", buffer_words=1)
    fails("^root:", root=2)
    fails("^cached: expert", cached=[1], group_experts=[0])
    fails("^routing: the draft routes token 0 to expert", cached=[1])
    fails("^routing: expected ids and weights", routing=(np.zeros((4, 2), np.int64),
                                                         np.ones((4, 1))))
    fails("^x: expected", x=np.zeros((4, H + 32)))
    w = synthetic_experts(_rng("bad"), 1, H, I)[0]
    fails("^expert: expected up/gate", experts=[(w[0], w[1], w[2][:, :96])])   # down K != I
    small = synthetic_experts(_rng("bad2"), 1, H, 256)[0]
    fails("^experts: expert 1 has H=64, I=256", experts=[experts[0], small])


def test_defaults_match_the_rtl():
    import inspect

    from elmoe3d.hw.agg_link import DEFAULT_BUFFER_WORDS
    from elmoe3d.hw.load_router import LoadRouter
    assert par.DEFAULT_BUFFER_WORDS == DEFAULT_BUFFER_WORDS
    from elmoe3d.hw.die import LogicDie
    ext = inspect.signature(LoadRouter).parameters["ext_fifo_words"].default
    assert par.DEFAULT_EXT_FIFO_WORDS == ext
    chunk = inspect.signature(LogicDie.__init__).parameters["ext_chunk_words"].default
    assert par.DEFAULT_EXT_CHUNK_WORDS == chunk


def test_ext_load_order_keeps_every_pes_order(experts):
    """:func:`ext_load_order`: a compiled verify job's transfers in the order the load engines
    start their EXT LOADs: a permutation keeping every PE's transfers in their order (a
    multicast and its PEs' unicasts around it), and the order passes the schedule check
    under the die's admission rule in order (a window of one) and with a window of 4."""
    x = _rng("load-order").standard_normal((4, H))
    ids = np.array([[0, 1], [1, 2], [2, 0], [1, 2]])
    job = par.compile_group(x, experts, (ids, np.full((4, 2), 0.5)), phase="verify",
                            config=CFG, pes=2, cached=[0, 2])
    got = par.ext_load_order(job)
    assert sorted(map(id, got)) == sorted(map(id, job.ext_transfers))
    for p in range(2):
        assert [t for t in got if t.dst_mask >> p & 1] == \
            [t for t in job.ext_transfers if t.dst_mask >> p & 1]
    for window in (1, 4):
        par.check_link_schedule(job, ext_transfers=got, ext_window=window)

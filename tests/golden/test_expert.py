"""Whole experts on the functional PE simulator: the program built by sw.golden.expert equals
the golden expert (ref_expert / ref_moe) bit for bit, FP32 bits and sticky flags, in DRAFT and
FULL, at batch sizes 1, 4 and 16, with the intermediate dimension tiled over several WMEM buffers."""

import numpy as np
import pytest

from elmoe3d.config import preset
from elmoe3d.isa import Op, Sink, Target
from elmoe3d.sw.golden import expert as ex
from elmoe3d.sw.golden import pe as fsim
from elmoe3d.sw.golden.asm import ProgramError
from elmoe3d.sw.golden.datapath import Mode, gemm_reference
from elmoe3d.sw.golden.quant import quantize_activations
from elmoe3d.sw.golden.vpu import SILU_LIMIT, to_q16

SEED = 90210
CFG = preset("small")
PE = CFG.pe
H, I = 64, 256          # up/gate: 8 buffer-fulls of 32 channels; down: 4 buffer-fulls


def _rng(tag):
    seed = SEED + sum(map(ord, tag))
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def _weights(rng, h=H, i=I, scale=0.1):
    return (rng.standard_normal((i, h)) * scale, rng.standard_normal((i, h)) * scale,
            rng.standard_normal((h, i)) * scale)


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def _run(job):
    res = job.run_fsim()
    assert res.ld_used == len(job.ld)
    return job.decode(res), res.statuses()[-1], res


def _check_equal(job, ref):
    y, status, res = _run(job)
    assert np.array_equal(_bits(y), _bits(ref.y))
    t, h = job.tokens, job.hidden
    assert np.array_equal(res.state.out_values()[:t * h].reshape(t, h), ref.out)
    assert status["acc_overflow"] == int(ref.acc_overflow)
    assert status["vpu_saturation"] == int(ref.vpu_saturation)
    assert status["words_loaded"] == len(job.ld)
    assert status["gemm_beats"] == job.info["gemm_beats"]
    return y, status


@pytest.mark.parametrize("mode", [Mode.FULL, Mode.DRAFT], ids=lambda m: m.name)
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_expert_program_equals_ref_expert(mode, tokens):
    rng = _rng(f"expert{mode.name}{tokens}")
    w = _weights(rng)
    x = rng.standard_normal((tokens, H)) * rng.uniform(0.1, 4.0, (tokens, 1))
    gw = rng.uniform(0.05, 1.0, tokens)
    job = ex.build_expert_program(x, *w, gw, mode=mode, config=CFG)
    ref = ex.ref_expert(x, *w, gw, mode)
    y, _ = _check_equal(job, ref)
    assert not ref.acc_overflow and not ref.vpu_saturation
    # up/gate: 128 column blocks of 2 groups, 16 per buffer, ramped up at the start
    # (4, 12, 16 x 7); down: 16 of 8 groups, 4 per buffer, ramped down at the end
    # (4, 3, 3, 2, 1, 1, 1, 1). One token (memory-bound, nothing runs beside its REQUANT): the
    # up/gate jobs ramped down before the REQUANT too (4, 8, 16 x 5, 12, 8, 8, 4, 4), and the
    # last down column block in two K-chained buffer-fulls (5 + 3 groups; one row block).
    # 16 tokens: two sub-batches of 8 tokens, the first one's REQUANT beside the second one's
    # up/gate GEMMs (9 + 4 whole buffer-fulls, then 8 + 8 ramped down)
    expect = {1: (12 + 9, 1), 4: (9 + 8, 1), 16: (9 + 4 + 8 + 8, 2)}[tokens]
    assert (job.info["experts"][0]["buffer_fulls"], job.info["experts"][0]["batches"]) == expect
    flt = ex.float_expert(x, *w, gw)
    m = ex.error_metrics(flt, y)
    assert m["cosine"] > (0.999 if mode is Mode.FULL else 0.97), m


def test_program_shape_of_one_expert():
    rng = _rng("shape")
    w = _weights(rng)
    x = rng.standard_normal((4, H))
    for mode in (Mode.FULL, Mode.DRAFT):
        job = ex.build_expert_program(x, *w, mode=mode, config=CFG)
        c = job.program.counts()
        n_up, n_down = 9, 8                    # ramped buffer-fulls (see above)
        assert c["GEMM SWIGLU"] == n_up and c["GEMM COMBINE"] == n_down
        assert "BARRIER" not in c and "CLEAR" in c
        assert c["LOAD WSCALE"] == n_up + n_down == c["LOAD WMSB"]
        assert c.get("LOAD WLSB", 0) == (n_up + n_down if mode is Mode.FULL else 0)
        assert c["REQUANT"] == c["OUTPUT"] == c["STATUS"] == 1
        gemms = [cmd for cmd in job.program if cmd.op is Op.GEMM]
        assert all(g.fields["wait"] and g.fields["release"] for g in gemms)
        assert [g.fields["wbuf"] for g in gemms] == [k % 2 for k in range(len(gemms))]
        # double buffering: the first GEMM comes after the loads of two buffer-fulls
        first = next(i for i, cmd in enumerate(job.program) if cmd.op is Op.GEMM)
        signals = [cmd for cmd in job.program.commands[:first]
                   if cmd.op is Op.LOAD and cmd.fields["signal"]]
        assert len(signals) == 2
        # REQUANT sits between the last SWIGLU and the first COMBINE GEMM
        ops = [(cmd.op, cmd.fields.get("sink")) for cmd in job.program]
        rq = ops.index((Op.REQUANT, None))
        assert ops[rq - 1] != (Op.GEMM, int(Sink.COMBINE))
        assert (Op.GEMM, int(Sink.SWIGLU)) not in ops[rq:]
        # the first COMBINE GEMM waits for the REQUANT, no other GEMM does
        assert [g.fields["rq_wait"] for g in gemms] == [0] * n_up + [1] + [0] * (n_down - 1)
        job.program.check_sync()


@pytest.mark.parametrize("tokens", [1, 5])
def test_draft_and_full_share_the_msb_plane_and_scale_words(tokens):
    """One copy of the MSB slices serves the draft and the verify (paper Sections 4.3, 5.2):
    the MSB plane and scale words a DRAFT program loads are the very words the FULL program of
    the same expert loads, in the same order and into the same buffers and addresses."""
    rng = _rng(f"shared{tokens}")
    w = _weights(rng)
    x = rng.standard_normal((tokens, H))
    jobs = {m: ex.build_expert_program(x, *w, mode=m, config=CFG) for m in (Mode.DRAFT,
                                                                             Mode.FULL)}
    def loads(job, target):
        return [(job.program[i].fields["addr"], buf, words)
                for i, _, buf, words in job.loads(target)]

    # one token: up/gate ramped down before the REQUANT, the last down column block in two
    # K-chained buffer-fulls
    fulls = {1: 21, 5: 17}[tokens]
    for target in (Target.WMSB, Target.WSCALE):
        d, f = loads(jobs[Mode.DRAFT], target), loads(jobs[Mode.FULL], target)
        assert d == f and len(d) == fulls
    assert not jobs[Mode.DRAFT].loads(Target.WLSB)
    assert len(jobs[Mode.FULL].loads(Target.WLSB)) == fulls
    for m, job in jobs.items():
        _check_equal(job, ex.ref_expert(x, *w, None, m))


@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.FULL], ids=lambda m: m.name)
def test_last_column_block_split_in_k(mode):
    """One row block: the program's last down column block runs as two buffer-fulls of K
    (groups - RAMP_DOWN_K_TAIL, then RAMP_DOWN_K_TAIL), their GEMMs chaining the tile's
    accumulators (FULL: an LSB_ONLY + MSB_ONLY pair each), the first GEMM of a buffer-full
    waiting for it and the last releasing it; two row blocks: no split. Bit-exact both ways."""
    rng = _rng(f"ksplit{mode.name}")
    w = _weights(rng)
    G, kt = I // 32, ex.RAMP_DOWN_K_TAIL
    for tokens, split in ((2, True), (3, False)):
        x = rng.standard_normal((tokens, H))
        job = ex.build_expert_program(x, *w, mode=mode, config=CFG)
        _check_equal(job, ex.ref_expert(x, *w, None, mode))
        down = [c.fields for c in job.program
                if c.op is Op.GEMM and c.fields["sink"] == int(Sink.COMBINE)]
        chained = [f for f in down if f["acc_hold"] or f["acc_cont"]]
        if not split:
            assert not chained and down[-1]["groups"] == G
            continue
        per = 2 if mode is Mode.FULL else 1
        assert chained == down[-2 * per:]
        modes = ([Mode.LSB_ONLY, Mode.MSB_ONLY] * 2 if mode is Mode.FULL else [Mode.DRAFT] * 2)
        assert [Mode(f["mode"]) for f in chained] == modes
        assert [f["groups"] for f in chained] == [G - kt] * per + [kt] * per
        assert [f["act_base"] - down[0]["act_base"] for f in chained] == [0] * per + [G - kt] * per
        assert len({f["out_base"] for f in chained}) == 1
        assert [(f["acc_cont"], f["acc_hold"]) for f in chained] == (
            [(0, 1), (1, 1), (1, 1), (1, 0)] if mode is Mode.FULL else [(0, 1), (1, 0)])
        flags = [(1, 0), (0, 1)] * 2 if mode is Mode.FULL else [(1, 1), (1, 1)]
        assert [(f["wait"], f["release"]) for f in chained] == flags
        assert len({f["wbuf"] for f in chained[:per]} | {f["wbuf"] for f in chained[per:]}) == 2
        job.program.check_sync()


@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.FULL], ids=lambda m: m.name)
def test_k_split_parts_in_the_upper_half(mode):
    """H = 32: the K parts of the last column block go into upper halves of their buffers
    (w_base = wmem_low_words, ``_place``); every GEMM of a part reads its words there (FULL's
    LSB_ONLY and MSB_ONLY alike), and the result is bit-exact."""
    rng = _rng(f"ksplit-high{mode.name}")
    h = 32
    w = _weights(rng, h=h)
    x = rng.standard_normal((1, h))
    job = ex.build_expert_program(x, *w, mode=mode, config=CFG)
    _check_equal(job, ex.ref_expert(x, *w, None, mode))
    chained = [c.fields for c in job.program
               if c.op is Op.GEMM and (c.fields["acc_hold"] or c.fields["acc_cont"])]
    per = 2 if mode is Mode.FULL else 1
    parts = [chained[:per], chained[per:]]
    assert len(chained) == 2 * per
    assert all(len({(f["wbuf"], f["w_base"]) for f in part}) == 1 for part in parts)
    assert PE.wmem_low_words in {part[0]["w_base"] for part in parts}


def test_no_k_split_where_an_accumulator_could_saturate():
    """A column block whose scaled slice psums could reach the int64 accumulator's bounds
    (32 groups of the largest codes and FP16 scales, on a PE with room for them) is not split:
    FULL's chain would add its LSB and MSB terms in another order than ref_expert, which only
    an accumulator that never saturates makes equal. DRAFT and FULL cut alike, bit-exact."""
    import dataclasses
    pe = dataclasses.replace(PE, wmem_words=64, act_words=128, tok_words=16, hbuf_words=1024,
                             out_words=176)
    h, i = 32, 1024
    big = 127.0 * 65504
    w_down = np.full((h, i), big)
    for g in (30, 31):
        w_down[:, g * 32:(g + 1) * 32] = -113 * 65504.0
        w_down[:, g * 32] = big
    w = (np.ones((i, h)), np.ones((i, h)), w_down)
    x = np.ones((1, h))
    for mode in (Mode.DRAFT, Mode.FULL):
        job = ex.build_expert_program(x, *w, mode=mode, config=pe)
        assert not any(c.fields["acc_hold"] or c.fields["acc_cont"] for c in job.program
                       if c.op is Op.GEMM)
        _check_equal(job, ex.ref_expert(x, *w, None, mode))
    # the same PE with a column block that cannot saturate splits
    w_small = (np.ones((i, h)), np.ones((i, h)), np.full((h, i), 0.5))
    job = ex.build_expert_program(x, *w_small, mode=Mode.FULL, config=pe)
    assert any(c.fields["acc_cont"] for c in job.program if c.op is Op.GEMM)
    _check_equal(job, ex.ref_expert(x, *w_small, None, Mode.FULL))


@pytest.mark.parametrize("tokens", [4, 16])
def test_moe_draft_and_full_stream_the_same_msb_and_scale_words(tokens):
    """In MoE programs the builder cuts buffer-fulls by mode (a FULL one carries twice the
    words), but only at whole scale words: every expert's MSB plane words and scale words
    stream in the same order with the same bytes in DRAFT and FULL, so one copy in HB serves
    both."""
    rng = _rng(f"moeshare{tokens}")
    n_exp = 8
    experts = [ex.Expert.quantize(*_weights(rng), name=f"e{e}") for e in range(n_exp)]
    x = rng.standard_normal((tokens, H))
    ids = np.stack([rng.permutation(n_exp)[:2] for _ in range(tokens)])
    ids[: tokens // 2, 1] = -1
    wts = rng.uniform(0.1, 0.9, ids.shape)
    jobs = {m: ex.build_moe_program(x, experts, (ids, wts), m, CFG)
            for m in (Mode.DRAFT, Mode.FULL)}
    cuts = []
    for e in jobs[Mode.FULL].info["experts"]:
        for matrix in ("up", "down"):
            for target in (Target.WMSB, Target.WSCALE):
                d, f = (jobs[m].weight_words(e, matrix, target) for m in (Mode.DRAFT, Mode.FULL))
                assert d == f and d
            cuts.append(tuple(len(w) for i, _, _, w in jobs[Mode.DRAFT].loads(Target.WMSB)
                           if jobs[Mode.DRAFT].info["weight_loads"][i] == (e, matrix))
                     != tuple(len(w) for i, _, _, w in jobs[Mode.FULL].loads(Target.WMSB)
                              if jobs[Mode.FULL].info["weight_loads"][i] == (e, matrix)))
    for m, job in jobs.items():
        _check_equal(job, ex.ref_moe(x, experts, (ids, wts), m))
    print(f"{sum(cuts)} of {len(cuts)} matrices cut differently in DRAFT and FULL")


def test_moe_several_experts_per_token():
    rng = _rng("moe")
    n_exp, t, k = 4, 12, 2
    experts = [ex.Expert.quantize(*_weights(rng, i=128), name=f"e{e}") for e in range(n_exp)]
    x = rng.standard_normal((t, H))
    logits = rng.standard_normal((t, n_exp))
    ids = np.argsort(-logits, axis=1)[:, :k]
    top = np.take_along_axis(logits, ids, axis=1)
    weights = np.exp(top - top.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)            # softmax over the top-k
    ids[3, 1] = -1                                            # an empty slot
    ids[ids == 2] = -1                                        # expert 2 gets no token
    for mode in (Mode.FULL, Mode.DRAFT):
        job = ex.build_moe_program(x, experts, (ids, weights), mode, CFG)
        ref = ex.ref_moe(x, experts, (ids, weights), mode)
        y, _ = _check_equal(job, ref)
        assert 2 not in job.info["experts"]
        assert "BARRIER" not in job.program.counts()      # experts are software-pipelined
        flt = ex.float_moe(x, experts, (ids, weights))
        assert ex.error_metrics(flt, y)["cosine"] > 0.97


def _pipelined(job):
    """(REQUANT index, index of the next GEMM waiting for it, SWIGLU GEMMs in between)."""
    cmds = list(job.program)
    out = []
    for i, cmd in enumerate(cmds):
        if cmd.op is Op.REQUANT:
            j = next(k for k in range(i + 1, len(cmds))
                     if cmds[k].op is Op.GEMM and cmds[k].fields["rq_wait"])
            out.append((i, j, sum(1 for c in cmds[i:j] if c.op is Op.GEMM
                                  and c.fields["sink"] == Sink.SWIGLU)))
    return out


@pytest.mark.parametrize("tokens, inter, expect", [
    (16, 128, "ring"),          # 6 experts in IOMEM regions that wrap around: fenced loads
    (20, 256, "sequential"),    # two experts' regions do not fit at once
])
def test_moe_program_regions_fences_and_pipelining(tokens, inter, expect):
    """A MoE layer as one software-pipelined program: each expert's REQUANT runs beside the
    next expert's up/gate GEMMs (no BARRIER between experts); IOMEM regions rotate, and a
    region is reloaded only by a fenced LOAD after the last GEMM that used it. Bit-exact
    against ref_moe in both modes."""
    rng = _rng(f"regions{tokens}{inter}")
    n_exp = 6
    experts = [ex.Expert.quantize(*_weights(rng, i=inter), name=f"e{e}") for e in range(n_exp)]
    x = rng.standard_normal((tokens, H))
    if expect == "ring":
        ids = np.stack([np.arange(tokens) % n_exp, (np.arange(tokens) + 1) % n_exp], axis=1)
    else:
        ids = np.stack([np.arange(tokens) % 2, np.full(tokens, -1)], axis=1)   # 10 each
    wts = rng.uniform(0.1, 0.9, ids.shape)
    for mode in (Mode.DRAFT, Mode.FULL):
        job = ex.build_moe_program(x, experts, (ids, wts), mode, CFG)
        _check_equal(job, ex.ref_moe(x, experts, (ids, wts), mode))
        c = job.program.counts()
        assert "BARRIER" not in c
        fences = [cmd for cmd in job.program if cmd.op is Op.LOAD and cmd.fields["fence"]]
        piped = _pipelined(job)
        bases = [(v["tok_base"], v["act_base"]) for v in job.info["experts"].values()]
        if expect == "ring":
            assert len(set(bases)) > 2 and fences
            assert all(n > 0 for _, _, n in piped[:-1])      # REQUANT beside up/gate GEMMs
        else:
            assert set(bases) == {(0, 0)} and len(fences) == 1
            assert [n for _, _, n in piped] == [0, 0]


def test_moe_sums_equal_separate_experts_when_exact():
    """Q.24 sums: a token's MoE output is the sum of its experts' Q.24 outputs."""
    rng = _rng("moesum")
    experts = [ex.Expert.quantize(*_weights(rng, i=64)) for _ in range(2)]
    x = rng.standard_normal((5, H))
    ids = np.array([[0, 1]] * 5)
    gw = rng.uniform(0.2, 0.8, (5, 2))
    both = ex.ref_moe(x, experts, (ids, gw))
    one = [ex.ref_moe(x, experts, (ids[:, [j]], gw[:, [j]])) for j in range(2)]
    assert np.array_equal(both.out, one[0].out + one[1].out)


def test_all_zero_token():
    rng = _rng("zero")
    w = _weights(rng)
    x = rng.standard_normal((4, H))
    x[2] = 0.0
    for mode in (Mode.FULL, Mode.DRAFT):
        job = ex.build_expert_program(x, *w, np.full(4, 0.5), mode=mode, config=CFG)
        ref = ex.ref_expert(x, *w, np.full(4, 0.5), mode)
        y, _ = _check_equal(job, ref)
        assert not y[2].any() and y[[0, 1, 3]].any()


def test_gate_preactivations_beyond_the_silu_table():
    rng = _rng("silu")
    w_up, w_gate, w_down = _weights(rng)
    x = rng.standard_normal((4, H))
    x[1] *= 60.0                     # gate pre-activations well beyond +-16
    for mode in (Mode.FULL, Mode.DRAFT):
        job = ex.build_expert_program(x, w_up, w_gate, w_down, mode=mode, config=CFG)
        ref = ex.ref_expert(x, w_up, w_gate, w_down, None, mode)
        _check_equal(job, ref)
        d = ref.detail["experts"][0]
        g, _ = to_q16(d["acc_gate"], ref.detail["e_x"][:, None])
        assert (g[1] >= SILU_LIMIT).any() and (g[1] < -SILU_LIMIT).any()
        assert not ref.vpu_saturation


def test_accumulator_saturation_sets_the_sticky_flag():
    """H = 640 (20 groups) at the largest codes and FP16 scale: the Q.24 accumulators of up
    and gate saturate; the STATUS beat reports it and the result still equals the golden
    expert (saturation in ascending K, as the tile adds)."""
    rng = _rng("sat")
    h, i = 640, 32
    w_up = np.full((i, h), 127.0 * 65504)
    w_gate = np.full((i, h), 127.0 * 65504)
    w_down = rng.standard_normal((h, i)) * 0.01
    x = np.full((1, h), 127.0)
    for mode in (Mode.FULL, Mode.DRAFT):
        job = ex.build_expert_program(x, w_up, w_gate, w_down, mode=mode, config=CFG)
        ref = ex.ref_expert(x, w_up, w_gate, w_down, None, mode)
        y, status, res = _run(job)
        assert np.array_equal(_bits(y), _bits(ref.y))
        assert ref.acc_overflow and status["acc_overflow"] == 1
        assert status["vpu_saturation"] == 1 == int(ref.vpu_saturation)
        acc = ref.detail["experts"][0]["acc_up"]
        assert (acc == np.iinfo(np.int64).max).all()


def test_ref_expert_gemms_match_the_slow_datapath():
    rng = _rng("slow")
    w = _weights(rng, i=64)
    x = rng.standard_normal((3, H))
    e = ex.Expert.quantize(*w)
    ref = ex.ref_expert(x, e.up, e.gate, e.down, None, Mode.DRAFT)
    xq = quantize_activations(x)
    d = ref.detail["experts"][0]
    assert np.array_equal(d["acc_up"], gemm_reference(xq.q, e.up, Mode.DRAFT).acc)
    assert np.array_equal(d["acc_y"], gemm_reference(d["h_q"], e.down, Mode.DRAFT).acc)


@pytest.mark.parametrize("tokens, beats", [(1, 4), (3, 12), (4, 16)])
def test_output_sends_whole_token_rows_only(tokens, beats):
    """OUTPUT reads OUT in address order, so the builder emits the fewest whole token rows that
    factor into whole beats and rows: one token of H = 64 on the small PE (2 rows, 16 FP32 a
    beat) in 4 beats instead of its padded row block's 8, three tokens in 12 instead of 16;
    an even batch as before. Bit-exact against ref_expert."""
    rng = _rng(f"output{tokens}")
    w = _weights(rng)
    x = rng.standard_normal((tokens, H))
    job = ex.build_expert_program(x, *w, mode=Mode.DRAFT, config=CFG)
    (out,) = [cmd.fields for cmd in job.program if cmd.op is Op.OUTPUT]
    assert out["row_blocks"] * PE.rows * out["channels"] == beats * PE.fp32_per_beat
    _, _, res = _run(job)
    assert len(res.data()) == beats
    _check_equal(job, ex.ref_expert(x, *w, None, Mode.DRAFT))


@pytest.mark.parametrize("tokens, batches", [(16, 2), (8, 2), (5, 1)])
def test_last_expert_in_two_sub_batches(tokens, batches):
    """The program's last expert runs as two sub-batches of its row blocks when nothing would
    run beside its REQUANT and each sub-batch's weights stream within its own tile beats
    (``docs/pe.md``, "Program of an MoE layer"): two REQUANTs, the first beside the second
    sub-batch's up/gate GEMMs, the weights streamed twice, the same MSB plane and scale words
    in DRAFT and FULL. Five tokens (three row blocks: a sub-batch of one would be memory-bound)
    stay one batch. Bit-exact against ref_expert in both modes."""
    rng = _rng(f"batches{tokens}")
    w = _weights(rng)
    x = rng.standard_normal((tokens, H))
    gw = rng.uniform(0.1, 1.0, tokens)
    jobs = {m: ex.build_expert_program(x, *w, gw, mode=m, config=CFG)
            for m in (Mode.DRAFT, Mode.FULL)}
    for m, job in jobs.items():
        assert job.info["experts"][0]["batches"] == batches
        c = job.program.counts()
        assert c["REQUANT"] == batches and "BARRIER" not in c
        if batches == 2:
            piped = _pipelined(job)
            assert piped[0][2] > 0              # the first REQUANT beside up/gate GEMMs
        _check_equal(job, ex.ref_expert(x, *w, gw, m))
    one = ex.build_expert_program(x[:1], *w, mode=Mode.DRAFT, config=CFG)
    for target in (Target.WMSB, Target.WSCALE):
        d, f = (jobs[m].weight_words(0, "up", target) for m in (Mode.DRAFT, Mode.FULL))
        assert d == f == one.weight_words(0, "up", target) * batches


def test_builder_errors():
    rng = _rng("errors")
    with pytest.raises(ProgramError, match=r"K = 1056 \(33 groups of 32\) does not fit one "
                                           r"WMEM buffer of 32 words"):
        ex.build_expert_program(rng.standard_normal((1, 1056)),
                                *_weights(rng, h=1056, i=32), config=CFG)
    with pytest.raises(ProgramError,
                       match=r"32 tokens needs 256 ACT words \(h rows\); the PE has 64"):
        ex.build_expert_program(rng.standard_normal((32, H)), *_weights(rng, i=512),
                                config=CFG)
    with pytest.raises(ValueError, match="FULL or DRAFT"):
        ex.build_expert_program(rng.standard_normal((1, H)), *_weights(rng),
                                mode=Mode.LSB_ONLY, config=CFG)
    with pytest.raises(ValueError, match="token 0, slot 1: expert id 5"):
        ex.ref_moe(rng.standard_normal((1, H)), [_weights(rng)], ([[0, 5]], [[0.5, 0.5]]))
    with pytest.raises(ValueError, match="token 0 names expert"):
        ex.ref_moe(rng.standard_normal((1, H)), [_weights(rng)], ([[0, 0]], [[0.5, 0.5]]))


def test_moe_inputs_that_crashed_or_passed_are_named():
    """A review of the public API (2026-12-05): raw gate bits of Inf or NaN multiplied the
    output by 65536 unflagged, big-endian bits were read as values, bool gate weights passed,
    and no experts, 0-d routing or 3-D weights crashed in Python or NumPy."""
    from elmoe3d.sw.golden.linear_stream import ref_linear
    from elmoe3d.sw.golden.quant import QuantizationError, QuantizationTypeError
    rng = _rng("bad moe inputs")
    x, w = rng.standard_normal((2, H)), _weights(rng)
    ids = np.zeros(2, np.int64)
    for bits in (0x7C00, 0xFC00, 0x7E00):
        with pytest.raises(QuantizationError, match=rf"routing weights: token 0, slot 0: FP16 "
                                                    rf"bits 0x{bits:04X} is not a finite"):
            ex.ref_moe(x, [w], (ids, np.full(2, bits, np.uint16)))
    with pytest.raises(QuantizationError, match=r"gate_weights: entry 1: 100000.0 is not a "
                                                r"finite FP16"):
        ex.ref_expert(x, *w, gate_weights=np.array([1.0, 1e5]))
    with pytest.raises(QuantizationTypeError, match="got dtype bool"):
        ex.ref_expert(x, *w, gate_weights=np.array([True, True]))
    native = ex.ref_moe(x, [w], (ids, np.full(2, 0x3800, np.uint16)))        # 0.5
    swapped = ex.ref_moe(x, [w], (ids, np.full(2, 0x3800, ">u2")))
    assert np.array_equal(native.out, swapped.out)
    assert np.array_equal(native.out, ex.ref_moe(x, [w], (ids, np.full(2, 0.5))).out)
    for build in (ex.ref_moe, lambda *a: ex.build_moe_program(*a, "FULL", CFG)):
        with pytest.raises(QuantizationError, match="experts: expected at least one expert"):
            build(x, [], (ids, np.ones(2)))
        with pytest.raises(QuantizationError, match=r"expert 1: shape H=64, I=128 differs from "
                                                    r"expert 0's H=64, I=256"):
            build(x, [w, _weights(rng, i=128)], (ids, np.ones(2)))
    with pytest.raises(QuantizationError, match=r"routing weights: token 1, slot 1: inf is not"):
        ex.ref_moe(x, [w, w], (np.array([[0, 1], [1, 0]]), np.array([[1.0, 1], [1, np.inf]])))
    with pytest.raises(QuantizationTypeError, match=r"expert: gate: expected a QuantizedWeight, "
                                                    r"got ndarray"):
        ex.Expert(ex.as_expert(w).up, w[1], ex.as_expert(w).down).check()
    with pytest.raises(QuantizationError, match=r"routing: expected ids and weights of shape "
                                                r"\[T=2, k\]"):
        ex.ref_moe(x, [w], (0, 1.0))
    with pytest.raises(QuantizationTypeError, match=r"routing: expected \(ids, weights\), got "
                                                    r"ndarray"):
        ex.ref_moe(x, [w], np.zeros((2, 2)))
    with pytest.raises(QuantizationError, match=r"expert: expected up/gate \[I, H\] and down "
                                                r"\[H, I\], got \(1, 256, 64\)"):
        ex.Expert.quantize(w[0][None], w[1], w[2])
    with pytest.raises(QuantizationError, match=r"w: expected a 2-D weight \[N, K\], got "
                                                r"shape \(1, 256, 64\)"):
        ref_linear(x, w[0][None])


def test_expert_accuracy_report():
    rng = _rng("acc")
    w = _weights(rng, i=128)
    x = rng.standard_normal((8, H))
    acc = ex.expert_accuracy(x, *w)
    assert acc["full"]["sqnr_db"] > acc["draft"]["sqnr_db"] > 5
    assert acc["full"]["cosine"] > 0.999


def test_program_runs_from_encoded_words():
    rng = _rng("enc")
    w = _weights(rng)
    x = rng.standard_normal((2, H))
    job = ex.build_expert_program(x, *w, mode=Mode.DRAFT, config=CFG)
    res = fsim.run(job.program.encode(), job.ld, config=CFG)
    ref = ex.ref_expert(x, *w, None, Mode.DRAFT)
    assert np.array_equal(_bits(job.decode(res)), _bits(ref.y))
    assert all(cmd.fields["target"] != int(Target.WLSB)
               for cmd in job.program if cmd.op is Op.LOAD)


@pytest.mark.parametrize("mode", [Mode.FULL, Mode.DRAFT], ids=lambda m: m.name)
def test_program_for_a_tile_without_an_rtl_pe(mode):
    """The builder takes any PEConfig, as before PEOptions existed: a 6x12 tile (12 lanes, not
    a power of two, so no RTL PE: PEOptions refuses it) gets a program whose fsim results equal
    ref_expert bit for bit (its timing figures come from config's formulas, not PEOptions)."""
    from elmoe3d.config import ArchConfig, PEOptions, TileConfig
    cfg = ArchConfig(tile=TileConfig(rows=6, lanes=12), wmem_bytes=24576, iomem_bytes=24576)
    with pytest.raises(ValueError, match="power-of-two number of lanes"):
        PEOptions(config=cfg)
    rng = _rng(f"6x12{mode.name}")
    w = _weights(rng, 96, 96)
    x = rng.standard_normal((3, 96))
    job = ex.build_expert_program(x, *w, mode=mode, config=cfg)
    ref = ex.ref_expert(x, *w, mode=mode)
    y, _, _ = _run(job)
    assert np.array_equal(_bits(y), _bits(ref.y))

# amaranth: UnusedElaboratable=no
"""The PE (:class:`elmoe3d.hw.pe.PE`) in the Amaranth simulator against the functional simulator
(:mod:`elmoe3d.sw.golden.pe`) running the same encoded program and ``ld`` data, plus direct checks
against the golden GEMM (:func:`elmoe3d.sw.golden.datapath.gemm`) and the golden VPU.

Every comparison is plain equality: both outputs (``o`` beats, ``link_o`` words) word for word;
STATUS beats on their functional fields (the timing counters are RTL-only). Streams run with
and without idle cycles on ``cmd``/``ld``/``link_i`` and backpressure on ``o``/``link_o``.
Seeds are fixed and printed. Whole experts run in the cocotb bench (``sim/bench_pe.py``).
"""

import dataclasses
import gc
import random
import time

import numpy as np
import pytest
from amaranth.hdl import Fragment, Value
from amaranth.sim import Simulator

from ..pe_cases import NARROW_OUT_NEEDS, NARROW_OUT_OK, requant_pad_program
from ..pe_sim import shared_pe
from ..real_inputs import MINILM_HIDDEN, MINILM_LAYER, MOE_EXPERTS, MOE_INTER, minilm_moe
from elmoe3d.config import FPGA_LEAN_PE, preset
from elmoe3d.hw.pe import PE
from elmoe3d.isa import Sink, Target
from elmoe3d.sim.traffic import ROUGH, SMOOTH, TRAFFIC, Traffic
from elmoe3d.sw.golden import asm, pe as fsim
from elmoe3d.sw.golden.asm import OKind
from elmoe3d.sw.golden.datapath import Mode, gemm
from elmoe3d.sw.golden.quant import lsb_slice, msb_slice, quantize_weights


ARCH = preset("small")
PE_CFG = ARCH.pe
R, L = PE_CFG.rows, PE_CFG.lanes


# ---- harness ------------------------------------------------------------------------------------

#: ``o`` not ready half the cycles, nothing else stalled.
O_STALLS = Traffic("o stalls", ports={"o": 0.5})

def run_pe(program, ld=(), link_i=(), *, n_o, n_link, traffic=SMOOTH, seed=0, drain=40,
           max_cycles=20000, dut=None, pe_options=None, watch=()):
    """Run an encoded program on the RTL PE until ``n_o`` beats and ``n_link`` link words came
    out, then ``drain`` more cycles (nothing more may come out), under ``traffic`` (a
    :class:`~elmoe3d.sim.traffic.Traffic`; ports ``cmd``, ``ld``, ``link_i``, ``o``, ``link_o``).

    Checks the stream rule on ``o`` and ``link_o`` (an offered beat stays valid and unchanged
    until taken) and that :attr:`PE.probes` ``rw_collision`` never fires (no word of a
    ``no_rw_check`` memory read and written in one cycle). Returns a dict: ``o`` (list of
    (kind, data)), ``link_o`` (ints), ``cycles``
    (to the last output or the last command), handshake cycles ``cmd``, ``ld``, ``link_o``,
    and for every name in ``watch`` the cycles in which that :attr:`PE.probes` bit was set.
    Without ``dut``, the PE is ``PE(config=ARCH, **pe_options)``; runs on one PE share a simulation
    (:func:`tests.pe_sim.shared_pe`).
    """
    program, ld, link_i = list(program), list(ld), list(link_i)
    traffic = traffic.for_ports("cmd", "ld", "link_i", "o", "link_o")
    dut, run = shared_pe(config=ARCH, pe_options=pe_options, dut=dut)
    rng = random.Random(seed)
    log = {"o": [], "link_o": [], "cmd": [], "ld": [], "link_o_cycles": [], "o_cycles": []}
    log.update({name: [] for name in watch})

    async def bench(ctx):
        srcs = [
            (dut.cmd, program, traffic.idle_at("cmd"), "cmd"),
            (dut.ld, ld, traffic.idle_at("ld"), "ld"),
            (dut.link_i, link_i, traffic.idle_at("link_i"), None),
        ]
        pos = [0, 0, 0]
        shown = [False, False, False]
        held = {"o": None, "link_o": None}
        cycle = quiet = 0
        while True:
            for k, (port, items, idle, _) in enumerate(srcs):
                if not shown[k] and pos[k] < len(items):
                    shown[k] = rng.random() >= idle
                ctx.set(port.valid, shown[k])
                if shown[k]:
                    ctx.set(Value.cast(port.payload), items[pos[k]])
            o_ready = rng.random() >= traffic.backpressure_at("o")
            l_ready = rng.random() >= traffic.backpressure_at("link_o")
            ctx.set(dut.o.ready, o_ready)
            ctx.set(dut.link_o.ready, l_ready)
            for k, (port, items, _, name) in enumerate(srcs):
                if shown[k] and ctx.get(port.ready):
                    if name:
                        log[name].append(cycle)
                    pos[k] += 1
                    shown[k] = False
            for name, port, ready in (("o", dut.o, o_ready), ("link_o", dut.link_o, l_ready)):
                if ctx.get(port.valid):
                    if name == "o":
                        beat = (int(ctx.get(port.payload.kind).value),
                                ctx.get(port.payload.data))
                    else:
                        beat = ctx.get(port.payload)
                    if held[name] is not None:
                        assert beat == held[name], f"cycle {cycle}: offered {name} beat changed"
                    if ready:
                        log[name].append(beat)
                        log[f"{name}_cycles"].append(cycle)
                        held[name] = None
                    else:
                        held[name] = beat
                else:
                    assert held[name] is None, f"cycle {cycle}: {name}.valid dropped"
            for name in watch:
                if ctx.get(dut.probes[name]):
                    log[name].append(cycle)
            if ctx.get(dut.probes["rw_collision"]):
                hit = [k[len("rw_collision_"):] for k, v in dut.probes.items()
                       if k.startswith("rw_collision_") and ctx.get(v)]
                raise AssertionError(f"cycle {cycle}: a word of {', '.join(hit)} read and "
                                     f"written in one cycle (no_rw_check memories)")
            assert len(log["o"]) <= n_o, f"cycle {cycle}: unexpected extra o beat"
            assert len(log["link_o"]) <= n_link, f"cycle {cycle}: unexpected extra link word"
            if (pos[0] == len(program) and len(log["o"]) == n_o
                    and len(log["link_o"]) == n_link):
                quiet += 1
                if quiet > drain:
                    return
            await ctx.tick()
            cycle += 1
            assert cycle < max_cycles, (f"timeout: {pos[0]}/{len(program)} commands, "
                                        f"{pos[1]}/{len(ld)} ld, {len(log['o'])}/{n_o} o, "
                                        f"{len(log['link_o'])}/{n_link} link_o")

    run(bench)
    ends = log["o_cycles"][-1:] + log["link_o_cycles"][-1:] + log["cmd"][-1:]
    log["cycles"] = max(ends) + 1 if ends else 0
    return log


def compare_with_fsim(prog, ld=(), link_i=(), *, traffic=SMOOTH, seed=0, **kw):
    """Run ``prog`` (an :class:`~elmoe3d.sw.golden.asm.Program`) on fsim and on the RTL; assert equal
    ``link_o`` words, DATA beats, and STATUS beats on the functional fields. Returns
    ``(rtl_log, fsim_result)``."""
    ref = fsim.run(prog, ld, link_i)
    t0 = time.perf_counter()
    got = run_pe(prog.encode(), ld, link_i, n_o=len(ref.o), n_link=len(ref.link_o),
                 traffic=traffic, seed=seed, **kw)
    print(f"  RTL: {got['cycles']} cycles, {time.perf_counter() - t0:.1f} s wall")
    assert got["link_o"] == ref.link_o
    assert [k for k, _ in got["o"]] == [int(b.kind) for b in ref.o]
    for (kind, data), want in zip(got["o"], ref.o):
        if kind == OKind.STATUS:
            g, w = asm.unpack_status(data), asm.unpack_status(want.data)
            for name in asm.FUNCTIONAL_STATUS_FIELDS:
                assert g[name] == w[name], f"STATUS.{name}: RTL {g[name]} fsim {w[name]}"
        else:
            assert data == want.data
    return got, ref


# ---- stimulus -----------------------------------------------------------------------------------

def weight_words(qw, mode=Mode.FULL):
    """WMSB, WLSB and WSCALE words (uint8 [n, W/8]) of a quantized weight [N, K]: block cb,
    group g at word cb*G + g; channel cb*L + n on lane n (docs/pe.md)."""
    q = qw.q
    n, k = q.shape
    G, cbn = k // 32, -(-n // L)
    qp = np.zeros((cbn * L, k), np.int8)
    qp[:n] = q
    sp = np.zeros((cbn * L, G), np.uint16)
    sp[:n] = np.asarray(qw.scale, np.float16).view(np.uint16)
    msb = (msb_slice(qp).view(np.uint8) & 15).reshape(cbn, L, G, 32).transpose(0, 2, 1, 3)
    lsb = lsb_slice(qp).reshape(cbn, L, G, 32).transpose(0, 2, 1, 3)
    ent = sp.reshape(cbn, L, G).transpose(0, 2, 1).reshape(cbn * G, L)
    ent = np.concatenate([ent, np.zeros((-len(ent) % 8, L), np.uint16)]).reshape(-1, 8, L)
    return (asm.pack_wgt(msb.reshape(-1, L, 32), PE_CFG),
            asm.pack_wgt(lsb.reshape(-1, L, 32), PE_CFG),
            asm.pack_scales(ent, PE_CFG))


def act_words(a_q):
    """ACT words of INT8 activations [M, K] (zero-padded to whole row blocks): (rb, g)."""
    m, k = a_q.shape
    rbn, G = -(-m // R), k // 32
    ap = np.zeros((rbn * R, k), np.int8)
    ap[:m] = a_q
    return asm.pack_act(ap.reshape(rbn, R, G, 32).transpose(0, 2, 1, 3).reshape(-1, R, 32),
                        PE_CFG)


def random_weight(rng, n, k, *, spread=1.0):
    w = rng.normal(size=(n, k)) * np.exp(rng.normal(size=(n, k // 32, 1)) * spread
                                         ).repeat(32, axis=2).reshape(n, k)
    return quantize_weights(w.astype(np.float32))


def raw_gemm_program(a_q, qw, mode, *, wbuf=0, w_base=0, act_base=0, prog=None, load_act=True):
    """LOAD ACT + weights into buffer ``wbuf``, GEMM to RAW; returns (program, ld words).
    Appends to ``prog`` if given; ``load_act=False`` expects the activations at ``act_base``."""
    msb, lsb, scl = weight_words(qw)
    acts = act_words(a_q)
    G = a_q.shape[1] // 32
    cbn = len(msb) // G
    prog = asm.Program(PE_CFG) if prog is None else prog
    ld = []
    if load_act:
        prog.load(Target.ACT, act_base, len(acts))
        ld.append(acts)
    prog.load(Target.WMSB, w_base, len(msb), buf=wbuf)
    ld.append(msb)
    if mode in (Mode.FULL, Mode.LSB_ONLY):
        prog.load(Target.WLSB, w_base, len(lsb), buf=wbuf)
        ld.append(lsb)
    # scale entries w_base + e: a whole-word load needs w_base % 8 == 0
    assert w_base % 8 == 0
    prog.load(Target.WSCALE, w_base // 8, len(scl), buf=wbuf, signal=True)
    ld.append(scl)
    prog.gemm(mode=mode, wbuf=wbuf, act_base=act_base, w_base=w_base,
              row_blocks=len(acts) // G, col_blocks=cbn, groups=G, sink=Sink.RAW,
              wait=True, release=True)
    return prog, asm.words_to_ints(np.concatenate(ld))


def raw_to_acc(words, m, n, mode, rbn):
    """RAW link words of one GEMM back to the [m, n] accumulator matrix."""
    vals = asm.unpack_q24(asm.ints_to_words(words, PE_CFG), PE_CFG).reshape(-1, R, L)
    if mode is Mode.FULL:
        vals = vals[:, :, 0::2]
    c = vals.shape[2]
    nblk = len(vals) // rbn
    acc = vals.reshape(nblk, rbn, R, c).transpose(1, 2, 0, 3).reshape(rbn * R, nblk * c)
    return acc[:m, :n]


# ---- tests ------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_parameters_and_errors():
    dut = PE(config=ARCH)
    assert dut.word_bits == 128 * L and dut.rows == R and dut.lanes == L
    assert dut.tile_latency == 5
    assert dut.sink_latency[Sink.RAW] == 1
    assert PE(config=PE_CFG).config == PE_CFG
    with pytest.raises(TypeError, match="ArchConfig"):
        PE(config="small")
    with pytest.raises(ValueError, match="mul_stages"):
        PE(config=ARCH, mul_stages=0)
    from elmoe3d.config import ArchConfig, TileConfig
    with pytest.raises(ValueError, match="power-of-two"):
        PE(config=ArchConfig(tile=TileConfig(rows=6, lanes=12), wmem_bytes=4 * 192 * 8,
                             iomem_bytes=32 * 192))
    gc.collect()      # the half-built PEs warn here, where it is ignored


def test_status_counters_count_like_plain_counters():
    """StatusCounters (registered increments, issue 25) against a plain counter that adds
    ``inc`` in its own cycle: random ``inc``, ``clear``, ``snap`` and flag inputs; every
    snapshot equal (seed fixed, printed)."""
    from elmoe3d.hw.pe.common import COUNTER_BITS
    from elmoe3d.hw.pe.status import COUNTERS, StatusCounters
    seed = 25
    print(f"seed {seed}")
    rng = random.Random(seed)
    dut = StatusCounters(config=ARCH)
    mask = (1 << COUNTER_BITS) - 1
    snaps = []

    async def bench(ctx):
        ref = dict.fromkeys(COUNTERS, 0)
        acc = vpu = 0
        for cycle in range(600):
            inc = {n: rng.random() < 0.7 for n in COUNTERS}
            clear = rng.random() < 0.03
            snap = rng.random() < 0.2
            acc_set, vpu_set, fclear = (rng.random() < 0.05 for _ in range(3))
            for n in COUNTERS:
                ctx.set(getattr(dut.inc, n), inc[n])
            ctx.set(dut.clear, clear)
            ctx.set(dut.snap, snap)
            ctx.set(dut.acc_set, acc_set)
            ctx.set(dut.vpu_set, vpu_set)
            ctx.set(dut.flags_clear, fclear)
            await ctx.tick()
            if snap:                  # the values before this cycle's counts, a cycle later
                expect = (dict(ref), acc, vpu)
                got = {n: ctx.get(getattr(dut.beat, n)) for n in COUNTERS}
                assert (got, ctx.get(dut.beat.acc_overflow),
                        ctx.get(dut.beat.vpu_saturation)) == expect, cycle
                snaps.append(expect)
            for n in COUNTERS:
                ref[n] = 0 if clear else (ref[n] + inc[n]) & mask
            acc = 0 if fclear else acc | acc_set
            vpu = 1 if vpu_set else (0 if fclear else vpu)

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    assert len(snaps) > 50


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_vpu_unit_parameters_and_errors():
    q = 128 * L // 32                       # W/32
    dut = PE(config=ARCH)
    assert (dut.requant_units, dut.fp32_units) == (min(q, 32), q)
    assert (dut.output_beat_cycles, dut.requant_word_cycles, dut.tile_dsp_pairs) == (1, 1, False)
    dut = PE(config=ARCH, requant_units=2, fp32_units=4)
    assert (dut.requant_units, dut.fp32_units) == (2, 4)
    assert (dut.output_beat_cycles, dut.requant_word_cycles) == (q // 4, q // 2)
    for bad in (0, 3, 2 * q, -1, True, 1.0, "2"):
        with pytest.raises(ValueError, match="requant_units"):
            PE(config=ARCH, requant_units=bad)
        with pytest.raises(ValueError, match="fp32_units"):
            PE(config=ARCH, fp32_units=bad)
    for bad in (1, None, "yes"):
        with pytest.raises(ValueError, match="tile_dsp_pairs"):
            PE(config=ARCH, tile_dsp_pairs=bad)
        with pytest.raises(ValueError, match="out_valid_bits: expected a bool"):
            PE(config=ARCH, out_valid_bits=bad)
    for bad in (0, 3, True, 2.0, "1"):
        with pytest.raises(ValueError, match="wbuf_memories: expected 1 or 2"):
            PE(config=ARCH, wbuf_memories=bad)
    odd = dataclasses.replace(ARCH, wmem_bytes=3 * ARCH.wmem_bytes)
    with pytest.raises(ValueError, match="wbuf_memories: .*power-of-two wmem_words"):
        PE(config=odd, wbuf_memories=1)
    PE(config=odd)                            # a memory per buffer: any multiple of 8 words
    for bad in (0, 3, True, None):
        with pytest.raises(ValueError, match="out_banks: expected 1 or 2"):
            PE(config=ARCH, out_banks=bad)
    with pytest.raises(ValueError, match="out_banks: one OUT memory needs fewer than W/32"):
        PE(config=ARCH, out_banks=1)                 # fp32_units defaults to W/32
    # the small PE: 176 OUT words, 128 TOK entries = 8 ROWMAX rows of W/32 = 16
    assert (PE_CFG.out_words, PE_CFG.tok_entries, PE_CFG.word_bits) == (176, 128, 512)
    for banks, fp32, cycles in ((2, None, 88), (1, 1, 176), (1, 8, 176)):
        dut = PE(config=ARCH, out_banks=banks, fp32_units=fp32, out_valid_bits=False)
        assert dut.out_banks == banks and dut.clear_cycles == cycles
    for n, names in ((2, {"wmsb0", "wmsb1", "wlsb0", "wlsb1", "wscale0", "wscale1"}),
                     (1, {"wmsb", "wlsb", "wscale"})):
        dut = PE(config=ARCH, wbuf_memories=n)
        Fragment.get(dut, None)
        assert dut.wbuf_memories == n
        probes = {k[len("rw_collision_"):] for k in dut.probes if k.startswith("rw_collision_")}
        assert probes == names | {"act", "hbuf"}
    dut = PE(config=ARCH)
    assert dut.out_valid_bits and dut.clear_cycles == 1
    dut = PE(config=ARCH, out_valid_bits=False)
    cfg = dut.config
    assert not dut.out_valid_bits and dut.clear_cycles == max(
        -(-cfg.out_words // 2), -(-cfg.tok_entries // (cfg.word_bits // 32))) > 1
    dut = PE(config=ARCH)
    assert dut.combine_units == L and dut.combine_row_cycles == {True: 1, False: 1}
    dut = PE(config=ARCH, combine_units=1)
    assert dut.combine_units == 1 and dut.combine_row_cycles == {True: L // 2, False: L}
    assert dut.result_cycles[(Sink.COMBINE, False)] == R * L
    for bad in (0, 3, 2 * L, -1, True, 1.0, "2"):
        with pytest.raises(ValueError, match="combine_units"):
            PE(config=ARCH, combine_units=bad)
    dut = PE(config=ARCH)
    assert dut.swiglu_units == L // 2 and dut.swiglu_row_cycles == {True: 1, False: 1}
    assert dut.result_cycles[(Sink.SWIGLU, False)] == R
    dut = PE(config=ARCH, swiglu_units=1)
    assert dut.swiglu_units == 1 and dut.swiglu_row_cycles == {True: max(L // 4, 1),
                                                                False: L // 2}
    assert dut.result_cycles[(Sink.SWIGLU, False)] == R * L // 2
    assert dut.result_cycles[(Sink.SWIGLU, True)] == R * L // 2     # psum word hidden
    for bad in (0, 3, L, -1, True, 1.0, "1"):
        with pytest.raises(ValueError, match="swiglu_units"):
            PE(config=ARCH, swiglu_units=bad)
    gc.collect()


def test_verilog_size():
    """The small PE converts to Verilog (figures printed for the report)."""
    from amaranth.back import verilog
    t0 = time.perf_counter()
    text = verilog.convert(PE(config=ARCH), name="pe", emit_src=False)
    print(f"small PE: {len(text)} bytes, {text.count(chr(10))} lines of Verilog in "
          f"{time.perf_counter() - t0:.1f} s")
    assert "module pe(" in text
    shared = verilog.convert(PE(config=ARCH, requant_units=2, fp32_units=2, combine_units=1),
                             name="pe", emit_src=False)
    print(f"small PE, requant_units=2, fp32_units=2, combine_units=1: {len(shared)} bytes")
    assert "module pe(" in shared and len(shared) < len(text)


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.name)
def test_raw_gemm_equals_golden_gemm(mode):
    """A GEMM through the RAW sink equals sw.golden.datapath.gemm (and fsim) bit for bit."""
    seed = 100 + int(mode)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    m, k, n = 3, 96, 12
    a_q = rng.integers(-128, 128, (m, k)).astype(np.int8)
    qw = random_weight(rng, n, k)
    prog, ld = raw_gemm_program(a_q, qw, mode)
    got, ref = compare_with_fsim(prog, ld, seed=seed)
    rbn = -(-m // R)
    acc = raw_to_acc(got["link_o"], m, n, mode, rbn)
    assert np.array_equal(acc, gemm(a_q, qw, mode).acc)


def interleave_up_gate(up, gate, mode):
    """Rows of the fused up/gate weight in SWIGLU block order: per half of a weight block of L
    channels ``[up c..c+P-1, gate c..c+P-1]``, P = L/4, in every mode (docs/pe.md)."""
    i = up.shape[0]
    p = L // 4
    assert i % p == 0
    rows = []
    for c in range(0, i, p):
        rows.append(up[c:c + p])
        rows.append(gate[c:c + p])
    return np.concatenate(rows)


def expert_program(x_q, e_x, w_up, w_gate, w_down, gw, slots, mode, *, buf_words=None,
                   clear=True, output=True, tok_base=0, x_base=0, h_base=None, buf0=0):
    """A whole SwiGLU expert as a PE program (the shape of ``docs/pe.md`` "Program of an MoE
    layer"), built here independently of ``sw/golden/expert.py``. Returns (program, ld
    words)."""
    t, h = x_q.shape
    i = w_up.q.shape[0]
    G, Gi = h // 32, i // 32
    rbn = -(-t // R)
    buf_words = buf_words or PE_CFG.wmem_words
    prog = asm.Program(PE_CFG)
    ld = []
    if clear:
        prog.clear(out=True, rowmax=True, flags=True, counters=True)
    ent = {"e_x": np.zeros(rbn * R, np.int64), "gate": np.zeros(rbn * R, np.uint16),
           "slot": np.zeros(rbn * R, np.int64)}
    ent["e_x"][:t] = e_x
    ent["gate"][:t] = np.asarray(gw, np.float16).view(np.uint16)
    ent["slot"][:t] = slots
    ent["slot"][t:] = slots[0]
    tok = asm.pack_tok(ent, PE_CFG)
    assert tok_base % PE_CFG.tok_per_word == 0
    prog.load(Target.TOK, tok_base // PE_CFG.tok_per_word, len(tok))
    acts = act_words(x_q)
    prog.load(Target.ACT, x_base, len(acts))
    ld += [tok, acts]
    if h_base is None:
        h_base = x_base + len(acts)
    ug = quantize_like(w_up, w_gate, mode)
    buf = buf0

    def gemm_chunks(qw, groups, sink, stride, act_base, ch_per_block, rq_wait=False):
        nonlocal buf
        msb, lsb, scl = weight_words(qw)
        cbn = len(msb) // groups
        per = buf_words // groups
        for cb0 in range(0, cbn, per):
            cbs = min(per, cbn - cb0)
            sl = slice(cb0 * groups, (cb0 + cbs) * groups)
            prog.load(Target.WMSB, 0, cbs * groups, buf=buf)
            ld.append(msb[sl])
            if mode is Mode.FULL:
                prog.load(Target.WLSB, 0, cbs * groups, buf=buf)
                ld.append(lsb[sl])
            ent = unpack_entries(scl)[sl]
            ent = np.concatenate([ent, np.zeros((-len(ent) % 8, L), np.uint16)])
            sw = asm.pack_scales(ent.reshape(-1, 8, L), PE_CFG)
            prog.load(Target.WSCALE, 0, len(sw), buf=buf, signal=True)
            ld.append(sw)
            prog.gemm(mode=mode, wbuf=buf, act_base=act_base, w_base=0, row_blocks=rbn,
                      col_blocks=cbs, groups=groups, sink=sink, tok_base=tok_base,
                      out_base=cb0 * ch_per_block, stride=stride, wait=True, release=True,
                      rq_wait=rq_wait and cb0 == 0)
            buf ^= 1

    gemm_chunks(ug, G, Sink.SWIGLU, i // PE_CFG.q16_per_word, x_base, L // 2)
    prog.requant(row_blocks=rbn, channels=i, act_base=h_base, tok_base=tok_base)
    gemm_chunks(w_down, Gi, Sink.COMBINE, h // PE_CFG.q24_per_word, h_base, L, rq_wait=True)
    if output:
        prog.output(row_blocks=-(-(int(np.max(slots)) + 1) // R), channels=h)
        prog.barrier()
        prog.status()
    return prog, asm.words_to_ints(np.concatenate(ld))


def unpack_entries(scl_words):
    return asm.unpack_scales(scl_words, PE_CFG).reshape(-1, L)


def quantize_like(w_up, w_gate, mode):
    """The fused up/gate QuantizedWeight in SWIGLU block order."""
    from elmoe3d.sw.golden.quant import QuantizedWeight
    q = interleave_up_gate(w_up.q, w_gate.q, mode)
    s = interleave_up_gate(np.asarray(w_up.scale, np.float16), np.asarray(w_gate.scale,
                                                                        np.float16), mode)
    return QuantizedWeight(q=q, scale=s)


def random_expert(rng, t, h, i, *, gate_scale=1.0):
    """Synthetic expert weights and a token batch: (x_q, e_x, up, gate, down, gw, slots)."""
    from elmoe3d.sw.golden.quant import quantize_activations
    x = rng.normal(size=(t, h))
    xa = quantize_activations(x)
    x_q, e_x = xa.q, xa.exp
    up = random_weight(rng, i, h, spread=0.3)
    gate = quantize_weights((rng.normal(size=(i, h)) * gate_scale).astype(np.float32))
    down = random_weight(rng, h, i, spread=0.3)
    gw = rng.uniform(0.1, 1.0, t).astype(np.float16)
    slots = rng.permutation(t)
    return x_q, e_x, up, gate, down, gw, slots


@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.FULL], ids=lambda m: m.name)
def test_small_expert_equals_fsim(mode):
    """One expert (T=3, H=64, I=64: the up/gate weights span two WMEM buffers) against fsim."""
    seed = 200 + int(mode)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    x_q, e_x, up, gate, down, gw, slots = random_expert(rng, 3, 64, 64)
    prog, ld = expert_program(x_q, e_x, up, gate, down, gw, slots, mode)
    got, ref = compare_with_fsim(prog, ld, seed=seed)


def test_shared_simulation_runs_like_a_new_one():
    """The shared simulation (:func:`tests.pe_sim.shared_pe`) reset between runs behaves as a
    new one: an expert without its CLEAR (so it adds onto whatever OUT holds and counts on
    from whatever the counters hold) after a different program that left OUT, the flags, the
    counters and STATUS behind gives the same beats, the same STATUS words (timing counters
    included) and the same cycles as on a PE simulated for the first time, and equals fsim
    started from zero; a failed run's simulation is not reused."""
    from ..pe_sim import _SIMS
    rng = np.random.default_rng(204)
    print("seed=204")
    x_q, e_x, up, gate, down, gw, slots = random_expert(rng, 3, 64, 64)
    prog, ld = expert_program(x_q, e_x, up, gate, down, gw, slots, Mode.FULL, clear=False)
    other, other_ld = expert_program(*random_expert(rng, 2, 64, 64), Mode.DRAFT)
    ref = fsim.run(prog, ld)
    kw = dict(n_o=len(ref.o), n_link=0, seed=204, traffic=ROUGH)
    fresh = run_pe(prog.encode(), ld, dut=PE(config=ARCH), **kw)
    ref2 = fsim.run(other, other_ld)
    run_pe(other.encode(), other_ld, n_o=len(ref2.o), n_link=0, seed=5)
    again = run_pe(prog.encode(), ld, **kw)
    assert again["o"] == fresh["o"] and again["cycles"] == fresh["cycles"]
    assert again["ld"] == fresh["ld"] and again["cmd"] == fresh["cmd"]
    assert [d for _, d in fresh["o"] if _ != OKind.STATUS] == \
        [b.data for b in ref.o if b.kind != OKind.STATUS]
    assert fresh["cycles"] > 100
    (key, (_, sim, _)), = [(k, v) for k, v in _SIMS.items() if k[2] == "[]"]
    with pytest.raises(AssertionError, match="unexpected extra o beat"):
        run_pe(prog.encode(), ld, n_o=len(ref.o) - 1, n_link=0, seed=204)
    assert key not in _SIMS
    run_pe(other.encode(), other_ld, n_o=len(ref2.o), n_link=0, seed=5)
    assert _SIMS[key][1] is not sim                       # built again


@pytest.mark.parametrize("requant_units, fp32_units, mode, traffic, out_banks", [
    (1, 1, Mode.DRAFT, SMOOTH, 2),
    (2, 2, Mode.FULL, ROUGH, 2),
    (2, 1, Mode.DRAFT, O_STALLS, 2),
    (1, 1, Mode.DRAFT, SMOOTH, 1),
    (2, 8, Mode.FULL, SMOOTH, 1),
    (2, 2, Mode.FULL, ROUGH, 1),
    (2, 8, Mode.DRAFT, O_STALLS, 1),
], ids=["C1-K1-smooth", "C2-K2-rough", "C2-K1-stall_o", "C1-K1-smooth-out1", "C2-K8-smooth-out1",
        "C2-K2-rough-out1", "C2-K8-stall_o-out1"])
def test_time_shared_vpu_units_equal_fsim(requant_units, fp32_units, mode, traffic, out_banks):
    """Fewer RequantUnits / Fp32Converters than W/32 (``requant_units``, ``fp32_units``): the
    same expert program gives the same ``o`` beats as fsim (so as the full PE), with and
    without backpressure on ``o``; with a ready ``o`` the DATA beats of OUTPUT come every
    ``output_beat_cycles`` cycles, and REQUANT is busy at least ``channels / C`` cycles a row.
    Also with OUT in one memory (``out_banks=1``: an o beat's two words read one after the
    other, down to one sub-step per word with K = W/64): the same beats at the same rate."""
    seed = 1300 + 10 * requant_units + fp32_units + 100 * (out_banks == 1)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    t, h, i = 3, 64, 64
    x_q, e_x, up, gate, down, gw, slots = random_expert(rng, t, h, i)
    prog, ld = expert_program(x_q, e_x, up, gate, down, gw, slots, mode)
    dut = PE(config=ARCH, requant_units=requant_units, fp32_units=fp32_units,
             out_banks=out_banks)
    assert dut.output_beat_cycles == (128 * L // 32) // fp32_units
    assert dut.requant_word_cycles == (128 * L // 32) // requant_units
    got, ref = compare_with_fsim(prog, ld, traffic=traffic, seed=seed, dut=dut,
                                 watch=("rq_busy",))
    data_cycles = [c for (k, _), c in zip(got["o"], got["o_cycles"]) if k == OKind.DATA]
    assert len(data_cycles) == -(-t // R) * R * h // (128 * L // 32)
    assert np.abs(ref.data()).max() > 0
    if traffic is SMOOTH:
        assert set(np.diff(data_cycles)) == {dut.output_beat_cycles}
    assert len(got["rq_busy"]) >= -(-t // R) * R * i // requant_units


def test_tile_dsp_pairs_expert_equals_fsim():
    """``tile_dsp_pairs=True`` (the tile's FPGA datapath, two products per multiplier) gives
    the same results: a FULL expert (MSB and LSB slices) against fsim."""
    seed = 1350
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    x_q, e_x, up, gate, down, gw, slots = random_expert(rng, 3, 64, 64)
    prog, ld = expert_program(x_q, e_x, up, gate, down, gw, slots, Mode.FULL)
    dut = PE(config=ARCH, tile_dsp_pairs=True, requant_units=4, fp32_units=4)
    assert dut.tile_dsp_pairs
    got, ref = compare_with_fsim(prog, ld, traffic=Traffic("o stalls", ports={"o": 0.3}),
                                 seed=seed, dut=dut)
    assert np.abs(ref.data()).max() > 0


@pytest.mark.parametrize("mode, options, seed", [
    (Mode.DRAFT, None, 300), (Mode.FULL, None, 301), (Mode.DRAFT, {"combine_units": 1}, 310),
    (Mode.FULL, {"combine_units": 1}, 311), (Mode.DRAFT, {"combine_units": 2}, 320),
    (Mode.FULL, {"combine_units": 2}, 321), (Mode.DRAFT, {"swiglu_units": 1}, 330),
    (Mode.FULL, {"swiglu_units": 1}, 331), (Mode.DRAFT, FPGA_LEAN_PE, 340),
    (Mode.FULL, FPGA_LEAN_PE, 341),
], ids=["DRAFT", "FULL", "DRAFT-J1", "FULL-J1", "DRAFT-J2", "FULL-J2", "DRAFT-S1", "FULL-S1",
        "DRAFT-lean", "FULL-lean"])
def test_expert_with_stalls_and_shared_slots(mode, options, seed):
    """Idle cycles on cmd/ld, backpressure on o; two token rows share an OUT slot (the COMBINE
    read-modify-write must see the first row's write), padding rows add zero; nonzero TOK,
    x and h bases (token rows from TOK entry 8, activations from ACT word 5, h from 20).
    Also with time-shared combine units (``combine_units`` J < lanes: a row in L/J sub-steps,
    each writing its own OUT granules, the shared-slot hazard across sub-steps), one SwiGLU
    unit (``swiglu_units`` 1: a DRAFT row in L/2 sub-steps, each writing its own HBUF value
    and updating the row max back to back) and the FPGA board's lean PE (every VPU unit
    time-shared, two IA8xW5 products per DSP multiplier)."""
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    x_q, e_x, up, gate, down, gw, slots = random_expert(rng, 5, 64, 32)
    slots = np.array([1, 0, 1, 2, 0])
    prog, ld = expert_program(x_q, e_x, up, gate, down, gw, slots, mode, tok_base=8, x_base=5,
                              h_base=20)
    got, ref = compare_with_fsim(prog, ld, traffic=ROUGH, seed=seed, pe_options=options)
    assert np.abs(ref.data()).max() > 0


@pytest.mark.parametrize("mode", [Mode.FULL, Mode.LSB_ONLY], ids=lambda m: m.name)
def test_raw_gemm_with_link_backpressure(mode):
    """RAW results under link_o backpressure and idle cycles on cmd/ld, two GEMMs on the two
    buffers back to back (the second overlaps the first one's drain)."""
    seed = 400 + int(mode)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    a_q = rng.integers(-128, 128, (4, 64)).astype(np.int8)
    qw0, qw1 = random_weight(rng, 8, 64), random_weight(rng, 8, 64)
    prog, ld = raw_gemm_program(a_q, qw0, mode, wbuf=0)
    _, ld1 = raw_gemm_program(a_q, qw1, mode, wbuf=1, prog=prog, load_act=False)
    got, ref = compare_with_fsim(prog, ld + ld1, traffic=ROUGH, seed=seed)
    n0 = len(got["link_o"]) // 2
    for words, qw in ((got["link_o"][:n0], qw0), (got["link_o"][n0:], qw1)):
        assert np.array_equal(raw_to_acc(words, 4, 8, mode, 2), gemm(a_q, qw, mode).acc)


def test_load_overlaps_gemm():
    """Double buffering: while a long GEMM reads buffer 0 (its RAW results stream out), the load
    engine fills buffer 1; the overlapped program is faster than the same work serialized by
    BARRIERs."""
    seed = 500
    rng = np.random.default_rng(seed)
    a_q = rng.integers(-128, 128, (32, 64)).astype(np.int8)     # 16 row blocks
    qw0, qw1 = random_weight(rng, 32, 64), random_weight(rng, 32, 64)

    def program(serial):
        prog, ld = raw_gemm_program(a_q, qw0, Mode.DRAFT, wbuf=0)
        if serial:
            prog.barrier()
        _, ld1 = raw_gemm_program(a_q[:2], qw1, Mode.DRAFT, wbuf=1, prog=prog, load_act=False)
        return prog, ld + ld1, len(ld)

    prog, ld, n_first = program(serial=False)
    got, ref = compare_with_fsim(prog, ld, seed=seed)
    n_raw0 = 16 * 8                                     # GEMM 0: 16 x 8 results of one word
    first_out, last_out = got["link_o_cycles"][0], got["link_o_cycles"][n_raw0 - 1]
    loads1 = got["ld"][n_first:]
    print(f"  GEMM 0 results in cycles {first_out}..{last_out}; buffer 1 loaded in cycles "
          f"{loads1[0]}..{loads1[-1]}")
    assert loads1[-1] < last_out                      # buffer 1 filled while GEMM 0 runs
    prog_s, ld_s, _ = program(serial=True)
    got_s, _ = compare_with_fsim(prog_s, ld_s, seed=seed)
    loads1_s = got_s["ld"][n_first:]
    assert loads1_s[0] > got_s["link_o_cycles"][n_raw0 - 1]
    print(f"  overlapped {got['cycles']} cycles, serialized {got_s['cycles']} cycles")
    assert got["cycles"] < got_s["cycles"]


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_gemm_waits_for_the_reload_of_the_buffer_it_follows(traffic):
    """GEMM A releases buffer 0; GEMM B, decoded behind it, waits for buffer 0 again (its
    weights are loaded after A's release, into the same words). A's one column block straddles
    the buffer's lower half (words low - 8 .. low + 7), so neither half flag may drop before
    A's last read: B's loads may not overwrite a word A still reads, and B may not start back
    to back on the flag still set in A's last cycle. Both GEMMs' results are those of their
    own weights: RTL == fsim == golden GEMM (and no word read and written in one cycle)."""
    seed = 730
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    low = PE_CFG.wmem_low_words
    assert low >= 8 and PE_CFG.wmem_words >= low + 8
    m, k, n = 8, 16 * 32, L                           # one column block of 16 groups
    a_q = rng.integers(-128, 128, (m, k)).astype(np.int8)
    qa, qb = random_weight(rng, n, k), random_weight(rng, n, k)
    prog, ld_a = raw_gemm_program(a_q, qa, Mode.DRAFT, wbuf=0, w_base=low - 8)
    _, ld_b = raw_gemm_program(a_q, qb, Mode.DRAFT, wbuf=0, w_base=low - 8, prog=prog,
                               load_act=False)
    got, _ = compare_with_fsim(prog, ld_a + ld_b, traffic=traffic, seed=seed)
    rbn = -(-m // R)
    half = len(got["link_o"]) // 2
    for words, qw in ((got["link_o"][:half], qa), (got["link_o"][half:], qb)):
        acc = raw_to_acc(words, m, n, Mode.DRAFT, rbn)
        assert np.array_equal(acc, gemm(a_q, qw, Mode.DRAFT).acc)


def test_one_memory_per_wmem_plane_same_cycles():
    """``wbuf_memories=1`` (both buffers of a WMEM plane in one memory, as on the FPGA): a
    FULL GEMM from buffer 0 (both planes and the scales) while the load engine fills buffer 1,
    then a GEMM from buffer 1. RTL == fsim, and every ``ld`` and ``link_o`` handshake falls in
    the same cycle as with a memory per buffer (only the memory organisation differs)."""
    seed = 505
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    a_q = rng.integers(-128, 128, (16, 64)).astype(np.int8)     # 8 row blocks
    qw0, qw1 = random_weight(rng, 32, 64), random_weight(rng, 32, 64)
    prog, ld = raw_gemm_program(a_q, qw0, Mode.FULL, wbuf=0)
    _, ld1 = raw_gemm_program(a_q[:2], qw1, Mode.FULL, wbuf=1, prog=prog, load_act=False)
    runs = {n: compare_with_fsim(prog, ld + ld1, traffic=ROUGH, seed=seed,
                                 pe_options={"wbuf_memories": n},
                                 watch=("ld_xfer", "tile_in"))[0] for n in (2, 1)}
    # buffer 1 is written while GEMM 0 reads buffer 0: in one memory, its two ports at once
    n0 = len(ld)
    both = set(runs[1]["ld_xfer"]) & set(runs[1]["tile_in"])
    assert len(both) > 0 and min(runs[1]["ld"][n0:]) < max(runs[1]["tile_in"])
    assert runs[1]["link_o"] == runs[2]["link_o"]
    for key in ("ld", "link_o_cycles", "cycles"):
        assert runs[1][key] == runs[2][key], key
    print(f"  {runs[1]['cycles']} cycles with one memory per plane and with one per buffer")


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_scale_load_into_the_upper_half_waits_for_its_half(traffic):
    """GEMM A reads only buffer 0's upper half (weight words low .., scale words low / 8 ..),
    so its lower-half flag drops at its first read and its upper-half flag at its last. B's
    first scale word (upper half, a LOAD without ``signal``) is queued ahead of B's other
    loads: it must wait for the upper-half flag (A still reads that scale word; a scale word
    is in the upper half from ``low / 8``, not ``low``). RTL == fsim == golden GEMM for both
    (and no word read and written in one cycle)."""
    seed = 731
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    low = PE_CFG.wmem_low_words
    G = PE_CFG.wmem_words - low                       # A and B fill the upper half
    assert low % 8 == 0 and G >= 16 and low // 8 < low
    m, k, n = 8, G * 32, L
    a_q = rng.integers(-128, 128, (m, k)).astype(np.int8)
    qa, qb = random_weight(rng, n, k), random_weight(rng, n, k)
    acts = act_words(a_q)
    prog, ld = asm.Program(PE_CFG), []

    def load(target, addr, words, **kw):
        prog.load(target, addr, len(words), **kw)
        ld.extend(asm.words_to_ints(words))

    def run_gemm():
        prog.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=low, row_blocks=len(acts) // G,
                  col_blocks=1, groups=G, sink=Sink.RAW, wait=True, release=True)
    load(Target.ACT, 0, acts)
    msb, _, scl = weight_words(qa)
    load(Target.WMSB, low, msb, buf=0)
    load(Target.WSCALE, low // 8, scl, buf=0, signal=True)
    run_gemm()
    msb, _, scl = weight_words(qb)
    load(Target.WSCALE, low // 8, scl[:1], buf=0)     # no signal: waits for its half's flag
    load(Target.WMSB, low, msb, buf=0)
    load(Target.WSCALE, low // 8 + 1, scl[1:], buf=0, signal=True)
    run_gemm()
    got, _ = compare_with_fsim(prog, ld, traffic=traffic, seed=seed)
    rbn = -(-m // R)
    half = len(got["link_o"]) // 2
    for words, qw in ((got["link_o"][:half], qa), (got["link_o"][half:], qb)):
        acc = raw_to_acc(words, m, n, Mode.DRAFT, rbn)
        assert np.array_equal(acc, gemm(a_q, qw, Mode.DRAFT).acc)


def test_streamed_weights_parameters():
    """``streamed_weights`` needs a tile in passes and elaborates with one memory per plane
    and per buffer (the planes' geometry in the RTLIL: ``tests/tools/test_fpga_flow.py``)."""
    for bad in (1, None, "yes"):
        with pytest.raises(ValueError, match="streamed_weights: expected a bool"):
            PE(config=ARCH, tile_passes=4, streamed_weights=bad)
    with pytest.raises(ValueError, match="streamed_weights: .* needs tile_passes 2 or 4"):
        PE(config=ARCH, streamed_weights=True)
    assert not PE(config=ARCH).streamed_weights
    for passes, split in ((4, 1), (2, 2)):
        dut = PE(config=ARCH, tile_passes=passes, streamed_weights=True, wbuf_memories=split)
        Fragment.get(dut, None)
        assert dut.streamed_weights and dut.tile_passes == passes
    gc.collect()


@pytest.mark.parametrize("mode, wbuf_memories, passes", [
    (Mode.FULL, 1, 4), (Mode.LSB_ONLY, 2, 4), (Mode.DRAFT, 1, 2)],
    ids=["FULL-one-memory-P4", "LSB_ONLY-per-buffer-P4", "DRAFT-one-memory-P2"])
def test_streamed_weights_gemms_equal_fsim(mode, wbuf_memories, passes):
    """``streamed_weights``: two GEMMs on the two buffers, buffer 1 loaded while GEMM 0 reads
    buffer 0, idle cycles on cmd/ld and backpressure on link_o: RTL == fsim and == the
    bit-exact GEMM, no read-write collision (the bench checks), and every word into WMSB or
    WLSB taken at least P cycles after the one before (a part a cycle)."""
    seed = 520 + 10 * int(mode) + wbuf_memories + passes
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    a_q = rng.integers(-128, 128, (8, 64)).astype(np.int8)
    qw0, qw1 = random_weight(rng, 16, 64, spread=2.0), random_weight(rng, 8, 64)
    prog, ld = raw_gemm_program(a_q, qw0, mode, wbuf=0)
    _, ld1 = raw_gemm_program(a_q, qw1, mode, wbuf=1, prog=prog, load_act=False)
    # ROUGH traffic with link_o mostly stalled: the RAW words back up into the tile
    jammed = ROUGH.but("jammed", link_o=0.9)
    got, ref = compare_with_fsim(prog, ld + ld1, traffic=jammed, seed=seed,
                                 watch=("tile_held_mid_beat",),
                                 pe_options={"tile_passes": passes, "streamed_weights": True,
                                             "wbuf_memories": wbuf_memories})
    # the backpressure reached the tile while a beat was between passes (the plane's read
    # port must then hold the next part's data)
    assert got["tile_held_mid_beat"], "no beat held mid-pass: the traffic does not test it"
    n0 = len(got["link_o"]) - len(got["link_o"]) // 3      # GEMM 0 has twice the columns
    for words, qw in ((got["link_o"][:n0], qw0), (got["link_o"][n0:], qw1)):
        m, n = 8, qw.q.shape[0]
        assert np.array_equal(raw_to_acc(words, m, n, mode, 4), gemm(a_q, qw, mode).acc)
    msb0 = len(act_words(a_q))                 # GEMM 0's ld: ACT, then WMSB (and WLSB) words
    n_w = len(weight_words(qw0)[0]) * (2 if mode in (Mode.FULL, Mode.LSB_ONLY) else 1)
    steps = np.diff(got["ld"][msb0:msb0 + n_w])
    assert steps.min() >= passes, steps


def synthetic_moe(rng, t, h, i, n):
    """Tokens ``x`` [t, h] and ``n`` synthetic experts (up [i, h], gate [i, h], down [h, i]),
    normal with sd 1 and 0.2."""
    x = rng.normal(size=(t, h))
    return x, [tuple(rng.normal(size=s) * 0.2 for s in ((i, h), (i, h), (h, i)))
               for _ in range(n)]


def gemm_with_and_without(flag, options, seed, rows):
    """A FULL RAW GEMM after its loads, nothing else waiting, on ``PE(**options)`` with
    ``flag`` False and True: ``(runs by flag, a_q, qw)``. The results are equal, and the tile
    takes its beats in the same cycles relative to the first (a beat every 4 cycles)."""
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    a_q = rng.integers(-128, 128, (rows, 128)).astype(np.int8)
    qw = random_weight(rng, 16, 128)
    prog, ld = raw_gemm_program(a_q, qw, Mode.FULL)
    runs = {on: compare_with_fsim(prog, ld, seed=seed, watch=("tile_in",),
                                  pe_options={**options, flag: on})[0] for on in (False, True)}
    assert runs[True]["link_o"] == runs[False]["link_o"]
    rel = {on: np.array(r["tile_in"]) - r["tile_in"][0] for on, r in runs.items()}
    assert np.array_equal(rel[True], rel[False]) and set(np.diff(rel[True])) == {4}
    print(f"  {runs[True]['cycles']} cycles with {flag}, {runs[False]['cycles']} without")
    return runs, a_q, qw


def test_streamed_weights_same_gemm_cycles():
    """A FULL GEMM after its loads, nothing else waiting: with ``streamed_weights`` the tile
    takes its beats in the same cycles relative to the first (a beat every 4 cycles), the
    weight and scale words are taken exactly 4 cycles apart (1 without), and the results are
    equal."""
    runs, a_q, qw = gemm_with_and_without("streamed_weights", {"tile_passes": 4}, 560, 4)
    n_act, n_msb = len(act_words(a_q)), len(weight_words(qw)[0])
    for st, step in ((False, 1), (True, 4)):
        w_ld = runs[st]["ld"][n_act:n_act + 2 * n_msb]    # WMSB then WLSB
        assert set(np.diff(w_ld[:n_msb])) == {step} and set(np.diff(w_ld[n_msb:])) == {step}
        # WSCALE words (8 scale entries, 2 a part) too; ACT words (not parted here) still go
        # in a word a cycle
        scl_ld = runs[st]["ld"][n_act + 2 * n_msb:]
        assert n_act > 1 and set(np.diff(runs[st]["ld"][:n_act])) == {1}
        assert len(scl_ld) > 1 and set(np.diff(scl_ld)) == {step}, scl_ld


#: ACT, HBUF and OUT W/4 bits wide, with as many REQUANT units as an HBUF part has values
#: (W/32/4), as many combine units and FP32 converters as an OUT part has (W/64/4), two
#: SwiGLU units
NARROW = {"tile_passes": 4, "narrow_iomem": True, "requant_units": 4, "swiglu_units": 2,
          "narrow_out": True, "combine_units": 2, "fp32_units": 2, "out_banks": 1,
          "out_valid_bits": False}
#: ACT, TOK, HBUF and ROWMAX in halves, with ROWMAX's valid bits (OUT W bits, two banks)
NARROW_P2 = {"tile_passes": 2, "narrow_iomem": True, "requant_units": 8}


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_narrow_iomem_parameters():
    """``narrow_iomem`` needs a tile in passes and REQUANT units whose values of a cycle lie in
    one HBUF part (W/32/P values); it elaborates with P = 2 and 4."""
    for bad in (1, None, "yes"):
        with pytest.raises(ValueError, match="narrow_iomem: expected a bool"):
            PE(config=ARCH, tile_passes=4, narrow_iomem=bad)
    with pytest.raises(ValueError, match="narrow_iomem: .* needs tile_passes 2 or 4"):
        PE(config=ARCH, narrow_iomem=True)
    with pytest.raises(ValueError, match=r"narrow_iomem: the requant_units values .* "
                                         r"min\(W/32, 32\)/P = 4 values, got requant_units=8"):
        PE(config=ARCH, tile_passes=4, narrow_iomem=True, requant_units=8, swiglu_units=1)
    # a wide PE (W = 2048): an ACT row part of 32/P depths, not the HBUF part's 64/P values,
    # limits REQUANT's units (the default 32 would write across two parts)
    from elmoe3d.config import ArchConfig, TileConfig
    wide = ArchConfig(name="wide", tile=TileConfig(rows=8, lanes=16), wmem_bytes=16384,
                      iomem_bytes=65536)
    for passes, units, limit in ((2, None, 16), (4, 16, 8)):
        with pytest.raises(ValueError, match=rf"min\(W/32, 32\)/P = {limit} values, got "
                                             rf"requant_units={16 if units else 32}"):
            PE(config=wide, tile_passes=passes, narrow_iomem=True, requant_units=units)
    assert PE(config=wide, tile_passes=2, narrow_iomem=True, requant_units=16).narrow_iomem
    assert not PE(config=ARCH).narrow_iomem
    for opts in (NARROW, {"tile_passes": 2, "narrow_iomem": True, "requant_units": 8},
                 FPGA_LEAN_PE):
        dut = PE(config=ARCH, **opts)
        Fragment.get(dut, None)
        assert dut.narrow_iomem and dut._tile_params()["streamed_acts"]
    gc.collect()


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_narrow_out_parameters():
    """``narrow_out`` needs a tile in passes, one OUT memory without valid bits, and combine
    units and FP32 converters whose values of a cycle lie in one OUT part (W/64/P); CLEAR
    then writes a part a cycle."""
    ok = NARROW_OUT_OK
    for bad in (1, None):
        with pytest.raises(ValueError, match="narrow_out: expected a bool"):
            PE(config=ARCH, **ok, narrow_out=bad)
    for change, match in NARROW_OUT_NEEDS:
        with pytest.raises(ValueError, match="narrow_out: OUT in W/P-bit parts " + match):
            PE(config=ARCH, **{**ok, **change}, narrow_out=True)
    wide = PE(config=ARCH, **ok)
    narrow = PE(config=ARCH, **ok, narrow_out=True)
    assert not wide.narrow_out and narrow.narrow_out
    assert narrow.clear_cycles == 4 * PE_CFG.out_words == 4 * wide.clear_cycles
    Fragment.get(PE(config=ARCH, **ok, narrow_out=True), None)
    gc.collect()


@pytest.mark.parametrize("options", [NARROW, FPGA_LEAN_PE, NARROW_P2],
                         ids=["narrow", "lean", "narrow-P2-valid-bits"])
def test_narrow_iomem_transfers(options):
    """``narrow_iomem`` and ``narrow_out``: LOAD, RECV (OUT and ROWMAX also accumulating, OUT
    with int64 saturation) and SEND of ACT, TOK, HBUF, ROWMAX and OUT under idle ``ld`` /
    ``link_i`` cycles and
    backpressure: RTL == fsim word for word, every word into them taken at least P cycles
    after the one before (a part a cycle), every SEND word at least P + 1 cycles after the
    one before."""
    seed = 570 + (options is FPGA_LEAN_PE) + 2 * (options is NARROW_P2)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    P = options["tile_passes"]
    acts = rng.integers(-128, 128, (5, R, 32))
    hb = rng.integers(-2**31, 2**31, (6, PE_CFG.q16_per_word))
    OV = PE_CFG.q24_per_word
    base = rng.integers(-2**40, 2**40, (3, OV))
    base[1, 3] = 2**63 - 7                                  # saturates on accumulation
    add = rng.integers(-2**40, 2**40, (3, OV))
    add[1, 3] = 10
    prog = asm.Program(PE_CFG)
    prog.clear(out=True)
    prog.barrier()
    prog.load(Target.ACT, 3, 5)
    prog.load(Target.HBUF, 1, 3)
    prog.load(Target.OUT, 4, 3)
    prog.load(Target.TOK, 0, 2)
    prog.barrier()
    prog.recv(Target.HBUF, 4, 3)
    prog.recv(Target.ACT, 0, 3)
    prog.recv(Target.OUT, 5, 2, accumulate=True)
    prog.recv(Target.OUT, 7, 1)
    prog.recv(Target.ROWMAX, 0, 1)
    prog.recv(Target.ROWMAX, 0, 1, accumulate=True)
    prog.send(Target.ACT, 0, 8)              # received, then loaded words
    prog.send(Target.HBUF, 1, 6)
    prog.send(Target.OUT, 4, 4)
    prog.send(Target.TOK, 0, 2)
    prog.send(Target.ROWMAX, 0, 1)
    maxima = rng.integers(0, 2**32, (2, PE_CFG.q16_per_word))
    ld = asm.words_to_ints(np.concatenate([asm.pack_act(acts, PE_CFG),
                                           asm.pack_q16(hb[:3], PE_CFG),
                                           asm.pack_q24(base, PE_CFG)]))
    ld += [int(w) for w in rng.integers(0, 2**63, 2)]      # TOK words: any bits
    link_i = asm.words_to_ints(np.concatenate([asm.pack_q16(hb[3:], PE_CFG),
                                               asm.pack_act(acts[:3][::-1], PE_CFG),
                                               asm.pack_q24(add, PE_CFG),
                                               asm.pack_rowmax(maxima, PE_CFG)]))
    got, ref = compare_with_fsim(prog, ld, link_i, traffic=ROUGH, seed=seed,
                                 pe_options=options)
    assert len(ref.link_o) == 21 and all(ref.link_o)
    out_parted = options.get("narrow_out", False)      # (ACT, HBUF and TOK always here)
    for a, b, parted in ((0, 5, True), (5, 8, True), (8, 11, out_parted), (11, 13, True)):
        assert np.diff(got["ld"][a:b]).min() >= (P if parted else 1)
    sent = got["link_o_cycles"]
    for a, b, parted in ((0, 8, True), (8, 14, True), (14, 18, out_parted), (18, 20, True)):
        assert np.diff(sent[a:b]).min() >= (P + 1 if parted else 1)
    # with nothing in the way: a word a part a cycle, SEND one word in P + 1 cycles
    smooth, _ = compare_with_fsim(prog, ld, link_i, seed=seed, pe_options=options)
    assert set(np.diff(smooth["ld"][:5])) == {P}
    assert set(np.diff(smooth["link_o_cycles"][:8])) == {P + 1}


def test_narrow_iomem_same_gemm_cycles():
    """A FULL GEMM after its loads, nothing else waiting: with ``narrow_iomem`` the tile takes
    its beats in the same cycles relative to the first as with W-bit ACT (a beat every 4
    cycles, the activations read a pass at a time), and the results are equal."""
    gemm_with_and_without("narrow_iomem", NARROW, 575, 6)


def test_narrow_out_same_sink_cycles():
    """A MoE layer on the FPGA-lean PE with and without ``narrow_out``: the COMBINE sink and
    OUTPUT re-read the OUT part they need a cycle ahead, so the tile takes its beats and
    ``o`` its DATA beats in the same cycles relative to the first (only CLEAR, a part a
    cycle, starts the program later), and the results are equal."""
    from elmoe3d.sw.golden.expert import build_moe_program
    seed = 578
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    t, h, i = 4, 64, 64
    x, experts = synthetic_moe(rng, t, h, i, 2)
    ids, wts = np.array([[0, 1], [1, 0], [0, 1], [1, 0]]), rng.uniform(0.2, 0.8, (t, 2))
    job = build_moe_program(x, experts, (ids, wts), Mode.FULL, PE_CFG)
    runs = {no: compare_with_fsim(job.program, job.ld, seed=seed, watch=("tile_in",),
                                  pe_options={**FPGA_LEAN_PE, "narrow_out": no})[0]
            for no in (False, True)}
    data = {no: [d for k, d in r["o"] if k == OKind.DATA] for no, r in runs.items()}
    assert data[True] == data[False] and len(data[True]) > 10
    for key in ("tile_in", "o_cycles"):
        rel = {no: np.array(r[key]) - r[key][0] for no, r in runs.items()}
        assert len(rel[True]) > 10 and np.array_equal(rel[True], rel[False]), key
    print(f"  {runs[True]['cycles']} cycles with narrow_out, {runs[False]['cycles']} without")


#: the OUT organisations OUTPUT raw is tested on: two banks (a pair a read), one bank (a word
#: a read), OUT in quarter words (a part a read) with the most FP32 converters it allows, and
#: the FPGA lean PE (quarter words, one converter)
RAW_OUT_PES = {"default": None, "out1": {"fp32_units": 2, "out_banks": 1}, "narrow": NARROW,
               "lean": FPGA_LEAN_PE}


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=lambda t: t.name)
@pytest.mark.parametrize("pe", list(RAW_OUT_PES))
def test_output_raw_after_combine(pe, traffic):
    """OUTPUT ``raw`` after an expert's COMBINE GEMMs filled OUT (two tokens share a slot),
    with an FP32 OUTPUT of the same rows between two raw ones (the second raw OUTPUT of
    ``channels`` = 3 W/64, not a multiple of W/32: words 0 .. 3 R - 1): the ``o`` beats ==
    fsim bit for bit under idle cycles and backpressure, on two OUT banks, one bank, OUT in
    quarter words and the FPGA lean PE; the raw words' values converted to FP32 are the FP32
    beats. With a ready ``o`` (smooth traffic): a raw beat every ``output_raw_beat_cycles``
    cycles (1, and P = 4 with ``narrow_out``), its first ``output_raw_latency`` after the
    drain (which starts the cycle after the OUTPUT before it took its last beat), and FP32
    OUTPUT's beats and latency as without raw."""
    from elmoe3d.config import FP32_LATENCY
    from elmoe3d.hw.pe.output import OutputEngine
    from elmoe3d.sw.golden.vpu import q24_to_fp32
    options = RAW_OUT_PES[pe]
    seed = 1380 + list(RAW_OUT_PES).index(pe) + 10 * (traffic is ROUGH)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    OV = PE_CFG.q24_per_word
    t, h, i = 5, 64, 32
    x_q, e_x, up, gate, down, gw, slots = random_expert(rng, t, h, i)
    slots = np.array([2, 0, 1, 2, 3])
    mode = Mode.DRAFT if traffic is SMOOTH else Mode.FULL
    prog, ld = expert_program(x_q, e_x, up, gate, down, gw, slots, mode, output=False)
    rbo = -(-(int(slots.max()) + 1) // R)
    n_raw, n_fp, n_raw2 = rbo * R * h // OV, rbo * R * h // (2 * OV), R * 3
    prog.output(row_blocks=rbo, channels=h, raw=True)
    prog.output(row_blocks=rbo, channels=h)
    prog.output(row_blocks=1, channels=3 * OV, raw=True)
    prog.barrier()
    prog.status()
    dut = PE(config=ARCH, **(options or {}))
    got, ref = compare_with_fsim(prog, ld, traffic=traffic, seed=seed, dut=dut)
    assert [k for k, _ in got["o"]] == [OKind.DATA] * (n_raw + n_fp + n_raw2) + [OKind.STATUS]
    data = [d for _, d in got["o"][:-1]]
    raw, fp, raw2 = data[:n_raw], data[n_raw:n_raw + n_fp], data[n_raw + n_fp:]
    vals = asm.unpack_q24(asm.ints_to_words(raw, PE_CFG), PE_CFG)
    assert np.count_nonzero(vals.reshape(-1, h).any(axis=1)) == 4    # slots 0 .. 3 combined
    assert raw2 == raw[:n_raw2]
    conv = q24_to_fp32(vals.reshape(-1)).view(np.uint32)
    fp_vals = asm.unpack_fp32(asm.ints_to_words(fp, PE_CFG), PE_CFG).reshape(-1)
    assert np.array_equal(conv, fp_vals.view(np.uint32))
    opts = dut.options
    r = opts.output_raw_beat_cycles
    assert r == (4 if pe in ("narrow", "lean") else 1)
    engine = OutputEngine(rows=R, word_bits=PE_CFG.word_bits, fp32_units=opts.fp32_units,
                          out_banks=opts.out_banks, out_parts=4 if opts.narrow_out else 1)
    assert engine.raw_beat_cycles == r and engine.beat_cycles == opts.output_beat_cycles
    del engine
    gc.collect()
    if traffic is SMOOTH:
        cyc = got["o_cycles"]
        c_raw, c_fp = cyc[:n_raw], cyc[n_raw:n_raw + n_fp]
        c_raw2 = cyc[n_raw + n_fp:n_raw + n_fp + n_raw2]
        assert set(np.diff(c_raw)) == set(np.diff(c_raw2)) == {r}
        assert set(np.diff(c_fp)) == {opts.output_beat_cycles}
        # last beat taken (OUTPUT done, the next one taken), its drain the cycle after, then
        # its read (with two OUT banks in that cycle) and sub-steps (raw: r cycles into the
        # beat register; FP32: through the converters, and their beat register unless one
        # sub-step)
        S = opts.output_beat_cycles
        read = 0 if opts.out_banks == 2 else 1
        assert opts.output_raw_latency == read + 1 + r
        assert opts.output_latency == read + 1 + FP32_LATENCY + S - (S == 1)
        assert c_raw2[0] - c_fp[-1] == opts.output_done_cycles + opts.output_raw_latency
        assert c_fp[0] - c_raw[-1] == opts.output_done_cycles + opts.output_latency
        print(f"  raw: a beat every {r} cycles ({n_raw} beats in {c_raw[-1] - c_raw[0] + 1}), "
              f"FP32: every {opts.output_beat_cycles}")


def test_rw_collision_probe_fires_for_a_racing_load():
    """The bench's ``rw_collision`` check can fail: LOADs into an ACT word without a fence,
    one a cycle while a GEMM re-reads that word every 32 cycles, write it in a cycle the GEMM
    reads it (a program the host never emits; the FPGA's no_rw_check ACT may then return
    anything)."""
    seed = 501
    rng = np.random.default_rng(seed)
    a_q = rng.integers(-128, 128, (32, 64)).astype(np.int8)     # 16 row blocks x 2 groups
    prog, ld = raw_gemm_program(a_q, random_weight(rng, 32, 64), Mode.DRAFT, wbuf=0)
    word = int(rng.integers(0, 1 << 62))
    for _ in range(64):
        prog.load(Target.ACT, 5, 1)
    ld = ld + [word] * 64
    with pytest.raises(AssertionError, match=r"a word of act read and written in one cycle"):
        run_pe(prog.encode(), ld, n_o=0, n_link=16 * 8, seed=seed)


@pytest.mark.parametrize("pe_options", [None, "lean"])
def test_send_recv_accumulate_status(pe_options):
    """RECV (plain and accumulating, with int64 saturation), SEND, OUTPUT, CLEAR and the STATUS
    counters and flags, under idle link_i cycles and link_o/o backpressure; also on the
    FPGA-lean PE (ACT, HBUF and OUT in quarter words: the accumulation a part a cycle)."""
    pe_options = FPGA_LEAN_PE if pe_options == "lean" else None
    seed = 600
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    OV = PE_CFG.q24_per_word
    base = rng.integers(-2**40, 2**40, (8, OV))
    base[0, 0] = 2**63 - 5                                   # saturates on accumulation
    add = rng.integers(-2**40, 2**40, (8, OV))
    add[0, 0] = 100
    acts = rng.integers(-128, 128, (3, R, 32))
    prog = asm.Program(PE_CFG)
    prog.clear(out=True, flags=True, counters=True)
    prog.barrier()
    prog.load(Target.OUT, 0, 8)
    prog.load(Target.ACT, 2, 3)
    prog.barrier()
    prog.recv(Target.OUT, 0, 8, accumulate=True)
    prog.recv(Target.HBUF, 5, 2)
    prog.send(Target.OUT, 0, 8)
    prog.send(Target.HBUF, 5, 2)
    prog.send(Target.ACT, 2, 3)
    prog.output(row_blocks=1, channels=4 * OV)
    prog.status()
    prog.clear(flags=True)
    prog.status()
    ld = asm.words_to_ints(np.concatenate([asm.pack_q24(base, PE_CFG),
                                           asm.pack_act(acts, PE_CFG)]))
    hb = rng.integers(-2**31, 2**31, (2, PE_CFG.q16_per_word))
    link_i = asm.words_to_ints(np.concatenate([asm.pack_q24(add, PE_CFG),
                                               asm.pack_q16(hb, PE_CFG)]))
    got, ref = compare_with_fsim(prog, ld, link_i, traffic=ROUGH, seed=seed,
                                 pe_options=pe_options)
    st = ref.statuses()
    assert st[0]["vpu_saturation"] == 1 and st[1]["vpu_saturation"] == 0
    assert st[0]["words_received"] == 10 and st[0]["words_sent"] == 13


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
@pytest.mark.parametrize("pe_options", [None, {"out_banks": 1, "fp32_units": 1}],
                         ids=["out2", "out1"])
def test_load_into_out_beside_recv_into_out(traffic, pe_options):
    """A LOAD into OUT words 0 .. n-1 runs beside a RECV into OUT words n .. 2n-1 (no BARRIER
    between them: the load engine and the execute engine write OUT in the same cycles, the
    RECV first, the load when the bank of its word is free), then every word is sent back:
    RTL == fsim, no word of either lost."""
    seed = 732
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    OV, n = PE_CFG.q24_per_word, 24
    base = rng.integers(-2**40, 2**40, (n, OV))
    add = rng.integers(-2**40, 2**40, (n, OV))
    prog = asm.Program(PE_CFG)
    prog.load(Target.OUT, 0, n)
    prog.recv(Target.OUT, n, n)
    prog.barrier()
    prog.send(Target.OUT, 0, 2 * n)
    ld = asm.words_to_ints(asm.pack_q24(base, PE_CFG))
    link_i = asm.words_to_ints(asm.pack_q24(add, PE_CFG))
    got, _ = compare_with_fsim(prog, ld, link_i, traffic=traffic, seed=seed,
                               pe_options=pe_options)
    assert got["link_o"] == ld + link_i


@pytest.mark.parametrize("out_valid_bits, out_banks, narrow_out",
                         [(True, 2, False), (False, 2, False), (False, 1, False),
                          (False, 1, True)],
                         ids=["valid-bits", "writes", "writes-out1", "writes-narrow-out"])
def test_clear_zeroes_out_and_rowmax(out_valid_bits, out_banks, narrow_out):
    """CLEAR out rowmax zeroes every OUT word and row-max register (all of them written
    before it), through the valid bits or (``out_valid_bits=False``) by writing zeros a row a
    cycle (both OUT banks at once, or with ``out_banks=1`` a word a cycle, with
    ``narrow_out`` a part a cycle); a RECV accumulating after it starts from zero; RTL ==
    fsim."""
    seed = 610
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    OV, Q = PE_CFG.q24_per_word, PE_CFG.q16_per_word
    n_out, n_rm = PE_CFG.out_words, -(-PE_CFG.tok_entries // Q)
    base = rng.integers(-2**40, 2**40, (n_out, OV))
    add = rng.integers(-2**40, 2**40, (n_out, OV))
    maxima = rng.integers(1, 2**31, (n_rm, Q))
    prog = asm.Program(PE_CFG)
    prog.load(Target.OUT, 0, n_out)
    prog.recv(Target.ROWMAX, 0, n_rm)
    prog.barrier()
    prog.send(Target.OUT, 0, n_out)
    prog.send(Target.ROWMAX, 0, n_rm)
    prog.clear(out=True, rowmax=True)
    prog.send(Target.OUT, 0, n_out)
    prog.send(Target.ROWMAX, 0, n_rm)
    prog.recv(Target.OUT, 0, n_out, accumulate=True)
    prog.send(Target.OUT, 0, n_out)
    ld = asm.words_to_ints(asm.pack_q24(base, PE_CFG))
    link_i = asm.words_to_ints(np.concatenate([asm.pack_q16(maxima, PE_CFG),
                                               asm.pack_q24(add, PE_CFG)]))
    got, ref = compare_with_fsim(prog, ld, link_i, traffic=ROUGH, seed=seed,
                                 pe_options={"out_valid_bits": out_valid_bits,
                                             "out_banks": out_banks,
                                             "fp32_units": 1 if out_banks == 1 else None,
                                             **({"narrow_out": True, "tile_passes": 4,
                                                 "combine_units": 2} if narrow_out else {})})
    words = got["link_o"]
    before, after = words[:n_out + n_rm], words[n_out + n_rm:2 * (n_out + n_rm)]
    assert any(before) and not any(after)
    assert words[-n_out:] == asm.words_to_ints(asm.pack_q24(add, PE_CFG))


@pytest.mark.parametrize("mode, pe_options", [
    (Mode.DRAFT, None), (Mode.FULL, None),
    (Mode.DRAFT, {"requant_units": 1, "fp32_units": 2}),
    (Mode.FULL, FPGA_LEAN_PE), (Mode.DRAFT, FPGA_LEAN_PE),
    (Mode.FULL, NARROW), (Mode.DRAFT, NARROW), (Mode.DRAFT, NARROW_P2),
], ids=["DRAFT", "FULL", "DRAFT-C1-K2", "FULL-fpga-lean", "DRAFT-fpga-lean", "FULL-narrow",
        "DRAFT-narrow", "DRAFT-narrow-P2"])
def test_moe_program_from_builder(mode, pe_options):
    """A small MoE layer built by sw.golden.expert (3 synthetic experts, top-2 routing of 4
    tokens):
    RTL == fsim, and the decoded FP32 output == ref_moe bit for bit (flags included); also on
    a PE with time-shared REQUANT / FP32 units (each REQUANT runs beside the next expert's
    GEMMs for longer than the builder's schedule assumes), on the board's FPGA-lean PE
    (paired tile products, one requant, FP32, combine and SwiGLU unit, every memory in
    quarter words), and on the quarter-word PE with the most units it allows (REQUANT's 4
    values, the combine units' and FP32 converters' 2, all in one part) under idle cycles and
    backpressure."""
    from elmoe3d.sw.golden.expert import build_moe_program, ref_moe
    seed = 700 + int(mode)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    t, h, i = 4, 64, 64
    x, experts = synthetic_moe(rng, t, h, i, 3)
    ids = np.array([[0, 2], [1, 0], [2, 1], [0, 1]])
    wts = np.array([[0.7, 0.3], [0.6, 0.4], [0.55, 0.45], [0.9, 0.1]])
    job = build_moe_program(x, experts, (ids, wts), mode, PE_CFG)
    got, ref = compare_with_fsim(job.program, job.ld, seed=seed, pe_options=pe_options,
                                 traffic=ROUGH if pe_options in (NARROW, NARROW_P2) else SMOOTH)
    data = np.array([d for k, d in got["o"] if k == OKind.DATA], dtype=object)
    vals = asm.unpack_fp32(asm.ints_to_words(list(data), PE_CFG), PE_CFG)
    y = vals.reshape(-1, h)[:t]
    want = ref_moe(x, experts, (ids, wts), mode)
    assert np.array_equal(y.view(np.uint32), want.y.view(np.uint32))
    st = asm.unpack_status([d for k, d in got["o"] if k == OKind.STATUS][-1])
    assert (st["acc_overflow"], st["vpu_saturation"]) == (want.acc_overflow,
                                                          want.vpu_saturation)


@pytest.mark.parametrize("traffic", [SMOOTH, ROUGH], ids=["smooth", "rough"])
def test_load_into_act_beside_requant(traffic):
    """A LOAD into ACT (words after REQUANT's, no fence) runs beside REQUANT: the load engine
    has the ACT write port first, REQUANT's codes are held meanwhile and none is lost. The
    codes, the TOK entries and the loaded words sent back: RTL == fsim."""
    seed = 733
    print(f"seed={seed}")
    prog, ld, link_i = requant_pad_program(PE_CFG, seed, pad_rows=0, channels=4,
                                           load_beside=16)
    got, ref = compare_with_fsim(prog, ld, link_i, traffic=traffic, seed=seed)
    assert any(ref.link_o[:8 * max(32, PE_CFG.q16_per_word) // 32])


@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.FULL], ids=lambda m: m.name)
def test_k_split_last_column_block(mode):
    """One token of a 32 x 256 expert through the builder: the last down column block runs as
    two K-chained buffer-fulls (5 + 3 groups) in the upper halves of their buffers (FULL:
    LSB_ONLY + MSB_ONLY on each), under idle cycles and backpressure: RTL == fsim, and the
    decoded FP32 output == ref_expert bit for bit."""
    from elmoe3d.sw.golden.expert import build_expert_program, ref_expert
    seed = 720 + int(mode)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    h, i = 32, 256
    w = tuple(rng.standard_normal(s) * 0.1 for s in ((i, h), (i, h), (h, i)))
    x = rng.standard_normal((1, h))
    job = build_expert_program(x, *w, mode=mode, config=PE_CFG)
    assert sum(1 for c in job.program if c.op.name == "GEMM" and c.fields["acc_cont"]) == (
        3 if mode is Mode.FULL else 1)
    got, _ = compare_with_fsim(job.program, job.ld, seed=seed, traffic=ROUGH)
    data = [d for k, d in got["o"] if k == OKind.DATA]
    y = asm.unpack_fp32(asm.ints_to_words(data, PE_CFG), PE_CFG).reshape(-1, h)[:1]
    want = ref_expert(x, *w, None, mode)
    assert np.array_equal(np.float32(y).view(np.uint32), np.float32(want.y).view(np.uint32))


def test_back_to_back_gemms_gap():
    """Two RAW GEMMs with both buffers full before the first starts: the tile takes one beat
    per cycle inside a GEMM and idles exactly ``gemm_gap`` cycles between them."""
    seed = 800
    rng = np.random.default_rng(seed)
    a_q = rng.integers(-128, 128, (2, 128)).astype(np.int8)      # 4 groups: a result per 4
    qw0, qw1 = random_weight(rng, 16, 128), random_weight(rng, 16, 128)
    prog = asm.Program(PE_CFG)
    acts = act_words(a_q)
    prog.load(Target.ACT, 0, len(acts))
    ld = [acts]
    gemms = []
    for buf, qw in enumerate((qw0, qw1)):
        msb, _, scl = weight_words(qw)
        prog.load(Target.WMSB, 0, len(msb), buf=buf)
        prog.load(Target.WSCALE, 0, len(scl), buf=buf, signal=True)
        ld += [msb, scl]
        gemms.append(dict(mode=Mode.DRAFT, wbuf=buf, act_base=0, w_base=0, row_blocks=1,
                          col_blocks=4, groups=4, sink=Sink.RAW, wait=True, release=True))
    prog.barrier()
    for g in gemms:
        prog.gemm(**g)
    dut = PE(config=ARCH)
    ref = fsim.run(prog, asm.words_to_ints(np.concatenate(ld)))
    got = run_pe(prog.encode(), asm.words_to_ints(np.concatenate(ld)), n_o=0,
                 n_link=len(ref.link_o), dut=dut, watch=("tile_in",))
    assert got["link_o"] == ref.link_o
    beats = got["tile_in"]
    assert len(beats) == 32
    first, second = beats[:16], beats[16:]
    assert first == list(range(first[0], first[0] + 16))
    assert second == list(range(second[0], second[0] + 16))
    assert second[0] - first[-1] - 1 == dut.gemm_gap


@pytest.mark.parametrize("mode, options, seed", [
    (Mode.DRAFT, None, 900), (Mode.FULL, {"swiglu_units": 2}, 901),
    (Mode.DRAFT, {"swiglu_units": 4}, 902), (Mode.FULL, {"swiglu_units": 1}, 903),
], ids=["DRAFT", "FULL-S2", "DRAFT-S4", "FULL-S1"])
def test_wider_pe_moe_and_raw(mode, options, seed):
    """A wider PE (8 x 16 x 32, W = 2048: 64 HBUF values per word, so REQUANT takes 32-value
    chunks of a word; 4 link words per RAW result): a 2-expert MoE program from
    sw.golden.expert, then
    a RAW GEMM appended; RTL == fsim, FP32 == ref_moe, RAW == gemm. Also with time-shared
    SwiGLU units: FULL with 2 (a FULL row's 4 channels in 2 sub-steps) and 1 (in 4), DRAFT
    with 4 (= lanes / 4: a DRAFT row's 8 channels in 2 sub-steps, a FULL one's in 1)."""
    from elmoe3d.config import ArchConfig, TileConfig
    from elmoe3d.sw.golden.expert import build_moe_program, ref_moe
    arch = ArchConfig(name="wide", tile=TileConfig(rows=8, lanes=16), wmem_bytes=16384,
                      iomem_bytes=65536)
    pe = arch.pe
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    t, h, i = 10, 128, 128
    x, experts = synthetic_moe(rng, t, h, i, 2)
    ids = np.array([[0, 1]] * 5 + [[1, 0]] * 5)
    wts = rng.uniform(0.2, 0.8, (t, 2))
    job = build_moe_program(x, experts, (ids, wts), mode, arch)
    prog, ld = job.program, list(job.ld)
    # a RAW GEMM after the expert program: 10 x 64 activations against 32 channels, FULL
    a_q = rng.integers(-128, 128, (10, 64)).astype(np.int8)
    qw = random_weight(rng, 32, 64)
    q = np.zeros((32, 64), np.int8)
    q[:] = qw.q
    G, cbn, rbn = 2, 2, 2
    msb = (msb_slice(q).view(np.uint8) & 15).reshape(cbn, 16, G, 32).transpose(0, 2, 1, 3)
    lsb = lsb_slice(q).reshape(cbn, 16, G, 32).transpose(0, 2, 1, 3)
    sc = np.asarray(qw.scale, np.float16).view(np.uint16).reshape(cbn, 16, G).transpose(0, 2, 1)
    ent = np.zeros((8, 16), np.uint16)
    ent[:cbn * G] = sc.reshape(-1, 16)
    ap = np.zeros((rbn * 8, 64), np.int8)
    ap[:10] = a_q
    acts = asm.pack_act(ap.reshape(rbn, 8, G, 32).transpose(0, 2, 1, 3).reshape(-1, 8, 32), pe)
    words = [acts, asm.pack_wgt(msb.reshape(-1, 16, 32), pe),
             asm.pack_wgt(lsb.reshape(-1, 16, 32), pe), asm.pack_scales(ent[None], pe)]
    prog.barrier()                          # the MoE program's ACT words are reloaded
    prog.load(Target.ACT, 0, len(acts))
    prog.load(Target.WMSB, 0, cbn * G, buf=0)
    prog.load(Target.WLSB, 0, cbn * G, buf=0)
    prog.load(Target.WSCALE, 0, 1, buf=0, signal=True)
    prog.gemm(mode=Mode.FULL, wbuf=0, act_base=0, w_base=0, row_blocks=rbn, col_blocks=cbn,
              groups=G, sink=Sink.RAW, wait=True, release=True)
    ld += asm.words_to_ints(np.concatenate(words))
    ref = fsim.run(prog, ld)
    got = run_pe(prog.encode(), ld, n_o=len(ref.o), n_link=len(ref.link_o),
                 dut=PE(config=arch, **(options or {})),
                 traffic=Traffic("ld idle, o stalls", ports={"ld": 0.2, "o": 0.3}), seed=seed)
    assert got["link_o"] == ref.link_o
    assert [(k, d) for k, d in got["o"] if k == OKind.DATA] == \
        [(int(b.kind), b.data) for b in ref.o if b.kind == OKind.DATA]
    data = [d for k, d in got["o"] if k == OKind.DATA]
    y = asm.unpack_fp32(asm.ints_to_words(data, pe), pe).reshape(-1, h)[:t]
    assert np.array_equal(y.view(np.uint32), ref_moe(x, experts, (ids, wts), mode)
                          .y.view(np.uint32))
    vals = asm.unpack_q24(asm.ints_to_words(got["link_o"], pe), pe).reshape(-1, 8, 16)
    acc = vals[:, :, 0::2].reshape(cbn * 2, rbn, 8, 8).transpose(1, 2, 0, 3).reshape(16, 32)
    assert np.array_equal(acc[:10], gemm(a_q, qw, Mode.FULL).acc)


def test_sink_latencies():
    """``tile_latency`` and ``sink_latency`` as documented: the first RAW link word, the first
    HBUF write (SWIGLU) and the first OUT write (COMBINE) come exactly that many cycles after
    the sink took the result (always-ready outputs, no idle input)."""
    seed = 1000
    rng = np.random.default_rng(seed)
    dut = PE(config=ARCH)
    x_q, e_x, up, gate, down, gw, slots = random_expert(rng, 2, 64, 32)
    prog, ld = expert_program(x_q, e_x, up, gate, down, gw, slots, Mode.DRAFT)
    ref = fsim.run(prog, ld)
    got = run_pe(prog.encode(), ld, n_o=len(ref.o), n_link=0, dut=dut,
                 watch=("tile_in", "tile_out", "hbuf_write", "out_write"))
    lat = dut.sink_latency
    assert got["hbuf_write"][0] - got["tile_out"][0] == lat[Sink.SWIGLU]
    first_out = got["out_write"][0]
    taken = min(c for c in got["tile_out"] if c > got["hbuf_write"][-1])   # first COMBINE
    assert first_out - taken == lat[Sink.COMBINE]
    assert got["tile_out"][0] - got["tile_in"][1] == dut.tile_latency    # 2 groups: beat 1
    a_q = rng.integers(-128, 128, (2, 32)).astype(np.int8)
    prog, ld = raw_gemm_program(a_q, random_weight(rng, 4, 32), Mode.DRAFT)
    dut = PE(config=ARCH)
    ref = fsim.run(prog, ld)
    got = run_pe(prog.encode(), ld, n_o=0, n_link=len(ref.link_o), dut=dut,
                 watch=("tile_in", "tile_out"))
    assert got["tile_out"][0] - got["tile_in"][0] == dut.tile_latency
    assert got["link_o_cycles"][0] - got["tile_out"][0] == dut.sink_latency[Sink.RAW]


# ---- multi-PE features: psum_in, MSB_ONLY / LSB_ONLY sinks, ROWMAX ------------------------------

def _multipe_operands(rng, rbn, cbn, G, pe=PE_CFG):
    R, L = pe.rows, pe.lanes
    act = rng.integers(-128, 128, (rbn * G, R, 32))
    msb = rng.integers(0, 16, (cbn * G, L, 32))
    lsb = rng.integers(0, 16, (cbn * G, L, 32))
    scl = rng.integers(0x1800, 0x2C00, (cbn * G, L)).astype(np.uint16)
    scl |= (rng.random(scl.shape) < 0.3).astype(np.uint16) << 15
    scl = np.concatenate([scl, np.zeros((-len(scl) % 8, L), np.uint16)]).reshape(-1, 8, L)
    n = rbn * R
    tok = {"e_x": rng.integers(-10, -4, n), "e_h": rng.integers(-20, -12, n),
           "gate": rng.integers(0x3000, 0x3C00, n).astype(np.uint16), "slot": rng.permutation(n)}
    return [asm.pack_tok(tok, pe), asm.pack_act(act, pe), asm.pack_wgt(msb, pe),
            asm.pack_wgt(lsb, pe), asm.pack_scales(scl, pe)]


def _load_multipe(prog, words):
    """LOAD TOK, ACT and buffer 0's planes and scales (signalled); returns the ld words."""
    for target, w in zip((Target.TOK, Target.ACT, Target.WMSB, Target.WLSB, Target.WSCALE),
                         words):
        prog.load(target, 0, len(w), signal=target is Target.WSCALE)
    return list(words)


def multipe_program(rng, rbn=2, cbn=2, G=3, pe=PE_CFG):
    """Every new feature in one program: MSB_ONLY GEMMs with psum_in into RAW, SWIGLU and
    COMBINE (fed the LSB_ONLY psums of the same operands, as on a second PE), an LSB_ONLY
    COMBINE, a FULL RAW GEMM with psum_in values that saturate, SEND / RECV ROWMAX (plain and
    max), REQUANT from the received maxima, OUTPUT, STATUS. Returns (program, ld, link_i)."""
    R, L, OV, Q = pe.rows, pe.lanes, pe.q24_per_word, pe.q16_per_word
    words = _multipe_operands(rng, rbn, cbn, G, pe)
    prog, ld = asm.Program(pe), []
    prog.clear(out=True, rowmax=True, flags=True, counters=True)
    ld += _load_multipe(prog, words)
    geo = dict(wbuf=0, act_base=0, w_base=0, row_blocks=rbn, col_blocks=cbn, groups=G)
    # the LSB psums a second PE would send
    lsb_prog = asm.Program(pe)
    lsb_ld = _load_multipe(lsb_prog, words)
    lsb_prog.gemm(mode=Mode.LSB_ONLY, sink=Sink.RAW, wait=True, **geo)
    psums = fsim.run(lsb_prog, asm.words_to_ints(np.concatenate(lsb_ld))).link_o
    n = len(psums)
    assert n == rbn * cbn * R * L // OV
    stride_h = max(32 // Q, 1)                              # REQUANT: >= 32 channels
    assert cbn * L // 2 <= stride_h * Q
    prog.gemm(mode=Mode.MSB_ONLY, sink=Sink.RAW, wait=True, psum_in=True, **geo)
    prog.gemm(mode=Mode.MSB_ONLY, sink=Sink.SWIGLU, stride=stride_h, psum_in=True, **geo)
    stride_o = -(-cbn * L // Q) * Q // OV                   # OUTPUT: whole FP32 beats
    prog.gemm(mode=Mode.MSB_ONLY, sink=Sink.COMBINE, stride=stride_o, psum_in=True, **geo)
    prog.gemm(mode=Mode.LSB_ONLY, sink=Sink.COMBINE, stride=stride_o, **geo)
    prog.gemm(mode=Mode.FULL, sink=Sink.RAW, psum_in=True, release=True, **geo)
    extreme = rng.integers(-2**62, 2**62, (2 * n, OV))
    extreme[::3] = np.where(rng.random((len(extreme[::3]), OV)) < 0.5, 2**63 - 1, -2**63)
    rm_words = -(-rbn * R // Q)
    peer = rng.integers(0, 2**24, (rm_words + 1, Q))
    peer[0, 0] = 2**32 - 1
    peer_words = asm.words_to_ints(asm.pack_rowmax(peer, pe))
    prog.send(Target.ROWMAX, 0, rm_words)
    prog.recv(Target.ROWMAX, 0, rm_words, accumulate=True)
    prog.recv(Target.ROWMAX, rm_words, 1)
    prog.send(Target.ROWMAX, 0, rm_words + 1)
    peer[0, 0] = 0                                           # keep REQUANT's e' in range
    prog.recv(Target.ROWMAX, 0, rm_words)
    prog.recv(Target.ROWMAX, 0, rm_words, accumulate=True)
    prog.requant(row_blocks=rbn, channels=stride_h * Q, act_base=rbn * G, tok_base=0)
    prog.send(Target.ACT, rbn * G, rbn * stride_h * Q // 32)
    prog.output(row_blocks=rbn, channels=stride_o * OV)
    prog.barrier()
    prog.status()
    own = rng.integers(0, 2**20, (rm_words, Q))
    link_i = (psums * 3 + asm.words_to_ints(asm.pack_q24(extreme, pe))
              + peer_words + asm.words_to_ints(asm.pack_rowmax(own, pe))
              + asm.words_to_ints(asm.pack_rowmax(peer[:rm_words], pe)))
    return prog, asm.words_to_ints(np.concatenate(ld)), link_i


@pytest.mark.parametrize("traffic, pe", [("smooth", None), ("rough", None), ("rough", "lean")])
def test_multipe_features_equal_fsim(traffic, pe):
    """psum_in with every sink and mode, ROWMAX SEND / RECV, REQUANT from received maxima:
    RTL == fsim, with link_i always valid and with idle link_i cycles and backpressure; and on
    the FPGA-lean PE (every IOMEM in quarter words: ROWMAX's max-accumulation a part a
    cycle, TOK's e_h written into its part)."""
    seed = 1100 + (traffic == "rough") + 2 * (pe == "lean")
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    prog, ld, link_i = multipe_program(rng)
    got, ref = compare_with_fsim(prog, ld, link_i, seed=seed,
                                 traffic=TRAFFIC[traffic],
                                 pe_options=FPGA_LEAN_PE if pe == "lean" else None)
    st = ref.statuses()[0]
    assert st["acc_overflow"] == 1 and st["words_received"] == len(link_i)
    assert ref.link_i_used == len(link_i)
    assert np.abs(ref.data()).max() > 0


@pytest.mark.parametrize("traffic", ["smooth", "rough"])
def test_recv_and_psum_in_take_link_i_in_program_order(traffic):
    """RECV and psum_in GEMMs share link_i: back-to-back RECV OUT, an MSB_ONLY RAW GEMM with
    psum_in, RECV OUT accumulate, an MSB_ONLY COMBINE GEMM with psum_in over the received OUT
    rows, RECV ROWMAX accumulate and a second RAW psum_in GEMM take their words strictly in
    program order (a word taken by the wrong one changes the link_o words, OUT or the row
    maxima): RTL == fsim with link_i always valid and with idle cycles and backpressure."""
    seed = 1300 + (traffic == "rough")
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    rbn, cbn, G = 2, 2, 3
    OV, Q = PE_CFG.q24_per_word, PE_CFG.q16_per_word
    words = _multipe_operands(rng, rbn, cbn, G)
    prog = asm.Program(PE_CFG)
    prog.clear(out=True, rowmax=True, flags=True, counters=True)
    ld = _load_multipe(prog, words)
    geo = dict(wbuf=0, act_base=0, w_base=0, row_blocks=rbn, col_blocks=cbn, groups=G)
    stride_o = -(-cbn * L // Q) * Q // OV
    out_words = rbn * R * stride_o
    per_gemm = rbn * cbn * R * L // OV
    rm_words = -(-rbn * R // Q)
    prog.recv(Target.OUT, 0, out_words)
    prog.gemm(mode=Mode.MSB_ONLY, sink=Sink.RAW, wait=True, psum_in=True, **geo)
    prog.recv(Target.OUT, 0, out_words, accumulate=True)
    prog.gemm(mode=Mode.MSB_ONLY, sink=Sink.COMBINE, stride=stride_o, psum_in=True, **geo)
    prog.recv(Target.ROWMAX, 0, rm_words, accumulate=True)
    prog.gemm(mode=Mode.LSB_ONLY, sink=Sink.RAW, psum_in=True, release=True, **geo)
    prog.send(Target.ROWMAX, 0, rm_words)
    prog.output(row_blocks=rbn, channels=stride_o * OV)
    prog.barrier()
    prog.status()
    n = 2 * out_words + 3 * per_gemm
    q24 = asm.words_to_ints(asm.pack_q24(rng.integers(-2**40, 2**40, (n, OV)), PE_CFG))
    rmax = asm.words_to_ints(asm.pack_rowmax(rng.integers(0, 2**24, (rm_words, Q)), PE_CFG))
    a, b = out_words, out_words + per_gemm
    link_i = (q24[:a] + q24[a:b] + q24[b:b + out_words] + q24[b + out_words:b + out_words
              + per_gemm] + rmax + q24[b + out_words + per_gemm:])
    got, ref = compare_with_fsim(prog, asm.words_to_ints(np.concatenate(ld)), link_i,
                                 seed=seed, traffic=TRAFFIC[traffic])
    assert ref.link_i_used == len(link_i)
    assert ref.statuses()[0]["words_received"] == len(link_i)
    assert np.abs(ref.data()).max() > 0


def test_multipe_features_wider_pe():
    """The same on a wider PE (8 x 16 x 32, W = 2048): psum_in takes 4 link words per result
    (rows 2k, 2k+1 from word k) and a ROWMAX word holds 64 registers; idle link_i cycles."""
    from elmoe3d.config import ArchConfig, TileConfig
    arch = ArchConfig(name="wide", tile=TileConfig(rows=8, lanes=16), wmem_bytes=16384,
                      iomem_bytes=65536)
    seed = 1150
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    prog, ld, link_i = multipe_program(rng, rbn=2, cbn=2, G=2, pe=arch.pe)
    ref = fsim.run(prog, ld, link_i)
    got = run_pe(prog.encode(), ld, link_i, n_o=len(ref.o), n_link=len(ref.link_o),
                 dut=PE(config=arch), seed=seed,
                 traffic=Traffic("link", ports={"link_i": 0.4, "link_o": 0.3}))
    assert got["link_o"] == ref.link_o
    assert [d for k, d in got["o"] if k == OKind.DATA] == \
        [b.data for b in ref.o if b.kind == OKind.DATA]
    g = asm.unpack_status([d for k, d in got["o"] if k == OKind.STATUS][0])
    w = ref.statuses()[0]
    assert all(g[n] == w[n] for n in asm.FUNCTIONAL_STATUS_FIELDS)
    assert w["acc_overflow"] == 1


@pytest.mark.parametrize("sink, options", [
    (Sink.RAW, None), (Sink.SWIGLU, None), (Sink.SWIGLU, {"swiglu_units": 1}),
    (Sink.COMBINE, {"combine_units": 1}),
], ids=["RAW", "SWIGLU", "SWIGLU-S1", "COMBINE-J1"])
def test_psum_in_throughput(sink, options):
    """With link_i always valid, a psum_in GEMM whose results are ``PE.result_cycles`` beats
    apart (groups) takes one tile beat per cycle, each result straight into the result
    register; with one group fewer the sink falls behind the tile (with one SwiGLU unit a
    DRAFT row takes L/2 sub-steps, with one combine unit L; the psum addition hides behind
    them): results wait in the skid register (eight results: the lag, a cycle a result, may
    stay within the skid register's slack, so the tile need not stall). The results
    (link_o: RAW, or HBUF and the row maxima, or OUT, sent after the GEMM) equal fsim."""
    seed = 1200
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    dut = PE(config=ARCH, **(options or {}))
    for G, behind in ((dut.result_cycles[(sink, True)], False),
                      (dut.result_cycles[(sink, True)] - 1, True)):
        words = _multipe_operands(rng, 2, 4, G)
        prog, ld = asm.Program(PE_CFG), []
        ld += _load_multipe(prog, words)
        prog.barrier()
        prog.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0, row_blocks=2, col_blocks=4,
                  groups=G, sink=sink, stride=2 if sink == Sink.COMBINE else 1, psum_in=True)
        prog.barrier()
        if sink == Sink.SWIGLU:             # the h values and row maxima, checked on link_o
            prog.send(Target.HBUF, 0, 2 * R)
            prog.send(Target.ROWMAX, 0, 1)
        elif sink == Sink.COMBINE:          # the OUT sums
            prog.send(Target.OUT, 0, 2 * 2 * R)
        prog.status()
        n = 2 * 4 * R * L // PE_CFG.q24_per_word
        link_i = asm.words_to_ints(asm.pack_q24(
            rng.integers(-2**40, 2**40, (n, PE_CFG.q24_per_word)), PE_CFG))
        got, ref = compare_with_fsim(prog, asm.words_to_ints(np.concatenate(ld)), link_i,
                                     seed=seed, watch=("tile_in", "result_skid"),
                                     pe_options=options)
        assert len(ref.link_o) == {Sink.RAW: n, Sink.SWIGLU: 2 * R + 1, Sink.COMBINE: 4 * R}[sink]
        assert any(ref.link_o)
        beats = got["tile_in"]
        assert len(beats) == 2 * 4 * G
        busy = beats[-1] - beats[0] + 1
        print(f"  {sink.name} psum_in {options}, groups {G}: {len(beats)} beats in {busy} "
              f"cycles, a result in the skid register in {len(got['result_skid'])} cycles")
        assert bool(got["result_skid"]) == behind
        if not behind:
            assert busy == len(beats)


@pytest.mark.parametrize("mode", [Mode.DRAFT, Mode.FULL], ids=lambda m: m.name)
def test_combine_units_throughput(mode):
    """With ``combine_units=1`` the COMBINE sink holds a result for ``rows *
    combine_row_cycles[FULL]`` cycles: a GEMM with that many groups takes one tile beat per
    cycle, one group fewer stalls the tile (FULL rows take L/2 sub-steps, others L); the
    results equal fsim."""
    seed = 1210 + int(mode)
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    dut = PE(config=ARCH, combine_units=1)
    per_result = R * dut.combine_row_cycles[mode is Mode.FULL]
    if mode is not Mode.FULL:
        assert dut.result_cycles[(Sink.COMBINE, False)] == per_result
    rbn, cbn = 4, 4                         # 16 results: more than the pipeline's slack
    for G, stalls in ((per_result, False), (per_result - 1, True)):
        words = _multipe_operands(rng, rbn, cbn, G)
        prog, ld = asm.Program(PE_CFG), []
        prog.clear(out=True, rowmax=True, flags=True, counters=True)
        ld += _load_multipe(prog, words)
        prog.barrier()
        prog.gemm(mode=mode, wbuf=0, act_base=0, w_base=0, row_blocks=rbn, col_blocks=cbn,
                  groups=G, sink=Sink.COMBINE, stride=cbn * L // PE_CFG.q24_per_word)
        prog.barrier()
        prog.output(row_blocks=rbn, channels=cbn * L)
        prog.barrier()
        prog.status()
        got, ref = compare_with_fsim(prog, asm.words_to_ints(np.concatenate(ld)), seed=seed,
                                     pe_options={"combine_units": 1}, watch=("tile_in",))
        assert np.abs(ref.data()).max() > 0
        beats = got["tile_in"]
        assert len(beats) % (rbn * cbn * G) == 0
        busy = beats[-1] - beats[0] + 1
        print(f"  COMBINE {mode.name}, combine_units 1, groups {G}: {len(beats)} beats in "
              f"{busy} cycles")
        assert (busy > len(beats)) == stalls


# ---- K-chained GEMMs: acc_cont, acc_hold --------------------------------------------------------

#: The Q.24 term of a ``big`` group in MSB_ONLY: psum 2^19 times the scale 0x7BFF (2047 << 29).
BIG_TERM = 2047 << 48


def _chain_operands(rng, groups, *, big=0):
    """One result's operands over ``groups`` K-groups: ACT codes ``[G, R, 32]``, MSB / LSB
    nibbles ``[G, L, 32]`` and FP16 scale bits ``[G, L]``. ``big`` > 0: the largest MSB_ONLY
    psums (2^19) and scales (mantissa 2047, shift 29), every term :data:`BIG_TERM` (17 groups
    saturate an accumulator); ``big`` < 0: the same with negative scales."""
    if big:
        act = np.full((groups, R, 32), -128)
        msb = np.full((groups, L, 32), 8)                       # -8: a * 16 msb = 2^14
        lsb = np.full((groups, L, 32), 15)
        scl = np.full((groups, L), 0x7BFF if big > 0 else 0xFBFF, np.uint16)
    else:
        act = rng.integers(-128, 128, (groups, R, 32))
        msb = rng.integers(0, 16, (groups, L, 32))
        lsb = rng.integers(0, 16, (groups, L, 32))
        scl = rng.integers(0x1800, 0x2C00, (groups, L)).astype(np.uint16)
        scl |= (rng.random(scl.shape) < 0.3).astype(np.uint16) << 15
    return act, msb, lsb, scl


class ChainProgram:
    """A program of K-chained GEMMs (each chain one result: one row block, one column block)
    with the loads of their weights in between, on ``n_tok`` TOK entries (random e_x, e_h,
    gate weights, a permutation of slots). Collects the ``ld`` and ``link_i`` words. Every
    WMEM load picks the next buffer (alternating) and a random ``w_base`` (a multiple of 8,
    whole scale words)."""

    STRIDE_H, STRIDE_O = 1, 2               # HBUF / OUT words per token row

    def __init__(self, rng, n_tok=8):
        self.rng, self.n_tok = rng, n_tok
        self.prog, self.ld, self.link_i = asm.Program(PE_CFG), [], []
        self.act_next, self.buf, self.gemm_beats = 0, 0, 0
        self.act_words = PE_CFG.act_words     # ACT words _act_words hands out (from 0)
        self.prog.clear(out=True, rowmax=True, flags=True, counters=True)
        tok = {"e_x": rng.integers(-10, -4, n_tok), "e_h": rng.integers(-20, -12, n_tok),
               "gate": rng.integers(0x3000, 0x3C00, n_tok).astype(np.uint16),
               "slot": rng.permutation(n_tok)}
        self._load(Target.TOK, 0, asm.pack_tok(tok, PE_CFG))

    def _load(self, target, addr, words, **kw):
        self.prog.load(target, addr, len(words), **kw)
        self.ld.extend(asm.words_to_ints(words))

    def _act_words(self, n):
        """``n`` free ACT words: (address, whether their LOAD needs a fence: ACT used up, they
        start from word 0 again)."""
        fence = self.act_next + n > self.act_words
        if fence:
            self.act_next = 0
        self.act_next += n
        return self.act_next - n, fence

    def _load_act(self, act):
        """LOAD ACT of ``act`` at the next free words; returns the address."""
        addr, fence = self._act_words(len(act))
        self._load(Target.ACT, addr, asm.pack_act(act, PE_CFG), fence=fence)
        return addr

    def chain(self, steps, *, sink, tok_base=0, psum_in=False, pause=None, big=None,
              groups=None, act_reuse=False, out_base=None, max_keep=None):
        """One result from ``steps``, each ``(chunk, modes)``: load the K chunk ``chunk`` of the
        chain's weights (the planes ``modes`` need) into the next buffer, then one GEMM per
        mode on those words (the last releases the buffer). ``groups``: the chunks' group
        counts (random 1..4 each, as many as ``steps`` has chunks by default); ``big``: per
        chunk, ``big`` operands of :func:`_chain_operands`. ``act_reuse``: every chunk's
        activations at the same words, each loaded (with a fence) after the GEMMs of the
        chunk before, which hold their accumulators (chunks in order). ``pause`` (commands
        after the chain's first GEMM): "status" (BARRIER, STATUS), "flags" (BARRIER, STATUS,
        CLEAR flags), "send" (SEND of an ACT word). ``out_base``: the sink's first channel
        (random by default); ``max_keep`` (SWIGLU): the last GEMM's flag, the held GEMMs' at
        random (the last GEMM's decides). Returns the chain's GEMM fields."""
        rng = self.rng
        if groups is None:
            groups = [int(g) for g in rng.integers(1, 5, 1 + max(c for c, _ in steps))]
        big = big or [0] * len(groups)
        ops = [_chain_operands(rng, g, big=b) for g, b in zip(groups, big)]
        if act_reuse:
            assert [c for c, _ in steps] == list(range(len(ops)))
            act_at = [None] * len(ops)
            base, fence0 = self._act_words(max(groups))
        else:                                # the chain's activations, chunk after chunk
            act_at = [self._load_act(act) for act, *_ in ops]
        n = sum(len(modes) for _, modes in steps)
        fields, k = [], 0
        for chunk, modes in steps:
            act, msb, lsb, scl = ops[chunk]
            if act_reuse:                    # over the words the previous GEMM just read
                self._load(Target.ACT, base, asm.pack_act(act, PE_CFG),
                           fence=fence0 or chunk > 0)
                act_at[chunk] = base
            g, b = len(act), self.buf
            self.buf ^= 1
            w_base = 8 * int(rng.integers(0, (PE_CFG.wmem_words - g) // 8 + 1))
            if any(m != Mode.LSB_ONLY for m in modes):
                self._load(Target.WMSB, w_base, asm.pack_wgt(msb, PE_CFG), buf=b)
            if Mode.LSB_ONLY in modes:
                self._load(Target.WLSB, w_base, asm.pack_wgt(lsb, PE_CFG), buf=b)
            ent = np.concatenate([scl, np.zeros((-g % 8, L), np.uint16)]).reshape(-1, 8, L)
            self._load(Target.WSCALE, w_base // 8, asm.pack_scales(ent, PE_CFG), buf=b,
                       signal=True)
            for j, mode in enumerate(modes):
                last = k == n - 1
                f = dict(mode=mode, wbuf=b, act_base=act_at[chunk], w_base=w_base,
                         row_blocks=1, col_blocks=1, groups=g, sink=sink, tok_base=tok_base,
                         wait=True, release=j == len(modes) - 1, acc_cont=k > 0,
                         acc_hold=not last, psum_in=psum_in and last)
                if sink is Sink.SWIGLU:
                    f.update(stride=self.STRIDE_H,
                             out_base=out_base if out_base is not None
                             else 2 * int(rng.integers(0, 16 * self.STRIDE_H // 2)))
                    if max_keep is not None:
                        f["max_keep"] = bool(max_keep) if last else bool(rng.random() < 0.5)
                elif sink is Sink.COMBINE:
                    f.update(stride=self.STRIDE_O,
                             out_base=out_base if out_base is not None
                             else 4 * int(rng.integers(0, 8 * self.STRIDE_O // 4)))
                self.prog.gemm(**f)
                fields.append(f)
                if f["psum_in"]:
                    vals = rng.integers(-2**50, 2**50, (1, PE_CFG.q24_per_word))
                    self.link_i += asm.words_to_ints(asm.pack_q24(vals, PE_CFG))
                if k == 0 and pause in ("status", "flags"):
                    self.prog.barrier()
                    self.prog.status()
                    if pause == "flags":
                        self.prog.clear(flags=True)
                elif k == 0 and pause == "send":
                    self.prog.send(Target.ACT, act_at[0], 1)
                self.gemm_beats += g
                k += 1
        return fields

    def plain_gemm(self, mode=Mode.DRAFT, rbn=2, cbn=2, G=2, *, sink=Sink.RAW, act_base=None,
                   shrink=0, **fields):
        """An ordinary GEMM of ``rbn x cbn`` results to RAW between the chains (or to ``sink``
        with the sink ``fields``: ``out_base``, ``tok_base``, ``max_keep``, ...; the stride of
        the sink's rows by default). ``act_base``: its activations are there already (not
        loaded). ``shrink``: the scales divided by 2^shrink."""
        ops = [_chain_operands(self.rng, G) for _ in range(max(rbn, cbn))]
        if act_base is None:
            act_base = self._load_act(np.concatenate([o[0] for o in ops[:rbn]]))
        b = self.buf
        self.buf ^= 1
        for target, part in ((Target.WMSB, 1), (Target.WLSB, 2)):
            self._load(target, 0, asm.pack_wgt(np.concatenate([o[part] for o in ops[:cbn]]),
                                               PE_CFG), buf=b)
        scl = np.concatenate([o[3] for o in ops[:cbn]]) - np.uint16(shrink << 10)
        ent = np.concatenate([scl, np.zeros((-len(scl) % 8, L), np.uint16)]).reshape(-1, 8, L)
        self._load(Target.WSCALE, 0, asm.pack_scales(ent, PE_CFG), buf=b, signal=True)
        if sink is not Sink.RAW:
            fields.setdefault("stride", self.STRIDE_H if sink is Sink.SWIGLU else self.STRIDE_O)
        self.prog.gemm(mode=mode, wbuf=b, act_base=act_base, w_base=0, row_blocks=rbn,
                       col_blocks=cbn, groups=G, sink=sink, wait=True, release=True, **fields)
        self.gemm_beats += rbn * cbn * G * (2 if mode is Mode.FULL else 1)

    def finish(self):
        """BARRIER, the sinks' memories on link_o (HBUF rows, row maxima), OUTPUT, STATUS;
        returns (program, ld, link_i)."""
        p, n, Q = self.prog, self.n_tok, PE_CFG.q16_per_word
        p.barrier()
        p.send(Target.HBUF, 0, n * self.STRIDE_H)
        p.send(Target.ROWMAX, 0, -(-n // Q))
        p.output(row_blocks=n // R, channels=self.STRIDE_O * PE_CFG.q24_per_word)
        p.barrier()
        p.status()
        return p, self.ld, self.link_i


def random_chain_program(rng):
    """K-chained GEMMs of random sizes (2-4 GEMMs each, a K chunk of 1-4 groups a WMEM
    buffer-full, the buffers alternating, each chunk loaded between the GEMMs) on random token
    rows, sink places and pauses: a DRAFT chain (its chunks' activations in the same words,
    each loaded with a fence after the held GEMM before), LSB_ONLY GEMMs then MSB_ONLY GEMMs
    into SWIGLU (each chunk loaded twice), LSB_ONLY + MSB_ONLY of each chunk into COMBINE
    (one load of both planes: FULL reading each weight word once), a chain of mixed modes
    into RAW, each ending with psum_in or not at random; an ordinary GEMM between them.
    Returns (program, ld, link_i, gemm beats)."""
    cp = ChainProgram(rng)

    def opts():
        return dict(tok_base=R * int(rng.integers(0, cp.n_tok // R)),
                    pause=[None, "status", "flags", "send"][int(rng.integers(0, 4))],
                    psum_in=bool(rng.random() < 0.5))

    n = int(rng.integers(2, 5))
    cp.chain([(c, [Mode.DRAFT]) for c in range(n)], act_reuse=True,
             sink=[Sink.SWIGLU, Sink.COMBINE, Sink.RAW][int(rng.integers(0, 3))], **opts())
    cp.plain_gemm(Mode.FULL if rng.random() < 0.5 else Mode.DRAFT)
    n = int(rng.integers(1, 3))
    cp.chain([(c, [Mode.LSB_ONLY]) for c in range(n)] + [(c, [Mode.MSB_ONLY]) for c in range(n)],
             sink=Sink.SWIGLU, **opts())
    cp.chain([(c, [Mode.LSB_ONLY, Mode.MSB_ONLY]) for c in range(n)], act_reuse=True,
             sink=Sink.COMBINE, **opts())
    modes = (Mode.DRAFT, Mode.MSB_ONLY, Mode.LSB_ONLY)
    cp.chain([(c, [modes[int(rng.integers(0, 3))]]) for c in range(int(rng.integers(2, 5)))],
             sink=Sink.RAW, **opts())
    return (*cp.finish(), cp.gemm_beats)


@pytest.mark.parametrize("traffic, pe, seed", [
    ("smooth", None, 1400), ("rough", None, 1401), ("rough", "lean", 1402),
])
def test_k_chained_gemms_equal_fsim(traffic, pe, seed):
    """Random programs of K-chained GEMMs (``acc_hold`` / ``acc_cont``; random_chain_program):
    RTL == fsim (link_o, o DATA beats, STATUS beats on the functional fields, also between
    the GEMMs of a chain: gemm_beats counts the held GEMMs' beats), with and without idle
    cycles and backpressure, and on the FPGA-lean PE (tile passes; weights and activations
    read a part a pass, a held GEMM's activations overwritten behind a fence)."""
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    for _ in range(2):
        prog, ld, link_i, beats = random_chain_program(rng)
        got, ref = compare_with_fsim(prog, ld, link_i, seed=seed, traffic=TRAFFIC[traffic],
                                     pe_options=FPGA_LEAN_PE if pe == "lean" else None)
        assert ref.link_i_used == len(link_i) and ref.ld_used == len(ld)
        assert ref.statuses()[-1]["gemm_beats"] == beats
        assert any(ref.link_o) and np.abs(ref.data()).max() > 0


@pytest.mark.parametrize("pe", [None, "lean"])
def test_k_chain_carries_saturation(pe):
    """A held GEMM saturates the accumulators (17 MSB_ONLY groups of BIG_TERM), the GEMM that
    continues them adds 4 negative groups: the result is INT64_MAX - 4 BIG_TERM (the groups
    in chain order, not the exact 13 BIG_TERM), and acc_overflow is set when it is emitted,
    not by the held GEMM (a STATUS between them, and a CLEAR flags, which the held flags
    survive). RTL == fsim, on the default and the FPGA-lean PE (the tile's sub-steps)."""
    seed = 1410 + (pe == "lean")
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    cp = ChainProgram(rng)
    cp.chain([(0, [Mode.MSB_ONLY]), (1, [Mode.MSB_ONLY])], groups=[17, 4], big=[1, -1],
             sink=Sink.RAW, pause="flags")
    # the same into COMBINE: the Q.24 results saturate the gate-weighted sum too
    cp.chain([(0, [Mode.MSB_ONLY]), (1, [Mode.MSB_ONLY])], groups=[17, 2], big=[1, -1],
             sink=Sink.COMBINE, tok_base=2)
    prog, ld, link_i = cp.finish()
    got, ref = compare_with_fsim(prog, ld, link_i, seed=seed,
                                 pe_options=FPGA_LEAN_PE if pe == "lean" else None)
    acc = asm.unpack_q24(asm.ints_to_words(ref.link_o[:1], PE_CFG), PE_CFG)
    assert (acc == (2**63 - 1) - 4 * BIG_TERM).all() and 13 * BIG_TERM < 2**63 - 1
    mid, end = ref.statuses()
    assert mid["acc_overflow"] == 0 and end["acc_overflow"] == 1
    assert mid["gemm_beats"] == 17 and end["gemm_beats"] == 17 + 4 + 17 + 2


def _chain_operand_words(rng, groups):
    """Operands of one result over ``groups`` (``_chain_operands``) as ACT, MSB, LSB and scale
    words (the scale entries from entry 0)."""
    act, msb, lsb, scl = _chain_operands(rng, groups)
    ent = np.concatenate([scl, np.zeros((-groups % 8, L), np.uint16)]).reshape(-1, 8, L)
    return (asm.pack_act(act, PE_CFG), asm.pack_wgt(msb, PE_CFG), asm.pack_wgt(lsb, PE_CFG),
            asm.pack_scales(ent, PE_CFG))


def test_k_chained_gemms_issue_back_to_back():
    """With both buffers loaded before: an ordinary GEMM, a chain LSB_ONLY (buffer 0),
    LSB_ONLY (buffer 1), MSB_ONLY (buffer 0), MSB_ONLY (buffer 1) of 4 groups each (the
    planes of each buffer read once) and another ordinary GEMM take one tile beat per cycle
    from the first beat to the last (no bubble: a held GEMM waits for no result and takes no
    sink descriptor slot). A DRAFT chain over 4 chunks takes the cycles of one DRAFT GEMM
    over the whole K, from its first beat to its RAW word, with the same result. RTL ==
    fsim."""
    seed = 1420
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    G = 4
    act, msb, lsb, scl = (np.concatenate(w) for w in
                          zip(*[_chain_operand_words(rng, G) for _ in range(4)]))
    # chunks 0, 1 (buffer 0 words 0.., 4..), chunks 2, 3 (buffer 1); scale words: 8 entries
    ent = asm.unpack_scales(scl, PE_CFG).reshape(4, 8, L)[:, :G]
    bufs = [np.concatenate([ent[2 * b], ent[2 * b + 1]])[None] for b in range(2)]
    prog, ld = asm.Program(PE_CFG), [act]
    prog.load(Target.ACT, 0, len(act))
    for b in range(2):
        for target, w in ((Target.WMSB, msb), (Target.WLSB, lsb)):
            prog.load(target, 0, 2 * G, buf=b)
            ld.append(w[2 * b * G:2 * (b + 1) * G])
        prog.load(Target.WSCALE, 0, 1, buf=b, signal=True)
        ld.append(asm.pack_scales(bufs[b], PE_CFG))
    prog.barrier()
    one = dict(row_blocks=1, col_blocks=1, groups=G, sink=Sink.RAW, wait=True)
    prog.gemm(mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=G, **one)
    for k, (mode, b) in enumerate(((Mode.LSB_ONLY, 0), (Mode.LSB_ONLY, 1),
                                   (Mode.MSB_ONLY, 0), (Mode.MSB_ONLY, 1))):
        prog.gemm(mode=mode, wbuf=b, act_base=2 * b * G, w_base=0, acc_cont=k > 0,
                  acc_hold=k < 3, release=b == 0 and k == 2, **one)
    prog.gemm(mode=Mode.FULL, wbuf=1, act_base=G, w_base=G, release=True, **one)
    ld = asm.words_to_ints(np.concatenate(ld))
    got, ref = compare_with_fsim(prog, ld, seed=seed, watch=("tile_in",))
    beats = got["tile_in"]
    assert len(beats) == 4 * G + G + 2 * G == len(set(beats))
    assert beats == list(range(beats[0], beats[0] + len(beats)))
    assert len(ref.link_o) == 1 + 1 + 2                 # the chain's one result

    scl_k = asm.pack_scales(ent.reshape(-1, 8, L), PE_CFG)   # entry k G + g: chunk k's

    def draft_k(chain):
        p = asm.Program(PE_CFG)
        p.load(Target.ACT, 0, len(act))
        p.load(Target.WMSB, 0, 4 * G)
        p.load(Target.WSCALE, 0, len(scl_k), signal=True)
        p.barrier()
        if chain:
            for k in range(4):
                p.gemm(mode=Mode.DRAFT, wbuf=0, act_base=k * G, w_base=k * G, acc_cont=k > 0,
                       acc_hold=k < 3, release=k == 3, **one)
        else:
            p.gemm(**{**one, "groups": 4 * G}, mode=Mode.DRAFT, wbuf=0, act_base=0, w_base=0,
                   release=True)
        words = asm.words_to_ints(np.concatenate([act, msb, scl_k]))
        got, _ = compare_with_fsim(p, words, seed=seed, watch=("tile_in",))
        beats = got["tile_in"]
        assert beats == list(range(beats[0], beats[0] + 4 * G))
        return got["link_o"], got["link_o_cycles"][0] - beats[0]

    (chained, t_chain), (whole, t_whole) = draft_k(True), draft_k(False)
    print(f"  DRAFT K = {4 * G} groups: {t_chain} cycles chained, {t_whole} as one GEMM")
    assert chained == whole and t_chain == t_whole


def test_held_gemm_completes_without_a_result():
    """Held GEMMs complete once their last beat is in the tile (no result to wait for): a
    fenced LOAD over the activations of a GEMM with acc_hold writes its first word only after
    that GEMM's last beat, as early as the second cycle after (the load engine registers its
    fence); after the next held GEMM the GEMM
    issue, result stage and sinks are idle the cycle after its last beat, so a BARRIER and a
    STATUS run before the GEMM that continues (and ends) the chain; STATUS counts the held
    beats. RTL == fsim."""
    seed = 1430
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    G = 3
    ops = [_chain_operand_words(rng, G) for _ in range(3)]
    prog, ld = asm.Program(PE_CFG), []
    one = dict(mode=Mode.DRAFT, act_base=0, w_base=0, row_blocks=1, col_blocks=1, groups=G,
               sink=Sink.RAW, wait=True, release=True)
    for k, (act, msb, _, scl) in enumerate(ops):
        prog.load(Target.ACT, 0, G, fence=k == 1)
        prog.load(Target.WMSB, 0, G, buf=k % 2)
        prog.load(Target.WSCALE, 0, 1, buf=k % 2, signal=True)
        ld += [act, msb, scl]
        prog.gemm(wbuf=k % 2, acc_cont=k > 0, acc_hold=k < 2, **one)
        if k == 1:
            prog.barrier()
            prog.status()
    prog.barrier()
    prog.status()
    got, ref = compare_with_fsim(prog, asm.words_to_ints(np.concatenate(ld)), seed=seed,
                                 watch=("tile_in", "gemm_busy"))
    beats, busy = got["tile_in"], set(got["gemm_busy"])
    assert len(beats) == 3 * G
    fenced = got["ld"][2 * G + 1]                          # the fenced LOAD's first word
    print(f"  held GEMM's last beat in cycle {beats[G - 1]}, fenced LOAD from {fenced}")
    assert fenced == beats[G - 1] + 2
    held_last = beats[2 * G - 1]
    assert held_last in busy and held_last + 1 not in busy
    assert got["o_cycles"][0] < beats[2 * G]              # the STATUS before the last GEMM
    assert [s["gemm_beats"] for s in ref.statuses()] == [2 * G, 3 * G]
    assert len(ref.link_o) == 1


# ---- GEMM max_keep (SWIGLU: channel 0 raises the row max instead of starting it) ---------------

def without_max_keep(prog):
    """``prog`` with every GEMM's ``max_keep`` cleared."""
    p = asm.Program(prog.pe)
    for c in prog:
        p.append(c.op, **(dict(c.fields, max_keep=0) if "max_keep" in c.fields else c.fields))
    return p


class KeepProgram(ChainProgram):
    """A :class:`ChainProgram` of SWIGLU GEMMs on rows of 32 channels (two HBUF words: one
    REQUANT group), the last ``n_tok / rows`` ACT words kept for REQUANT's h codes."""

    STRIDE_H = 2

    def __init__(self, rng, n_tok=8):
        super().__init__(rng, n_tok)
        self.h_base = PE_CFG.act_words - n_tok // R
        self.act_words = self.h_base


def random_max_keep_program(rng):
    """Rounds of SWIGLU GEMMs on random row blocks, each: a GEMM at channel 0 (random mode,
    blocks and groups; ``max_keep`` at random), a GEMM at channel 0 with ``max_keep`` over the
    same rows (the second pass: it only raises their maxima), a chain at channel 0 (DRAFT
    chunks, or LSB_ONLY + MSB_ONLY of each chunk; the last GEMM's ``max_keep`` at random, the
    held GEMMs' at random too), a GEMM at a later channel; a GEMM at channel 0 of a row block
    and a second pass over it with max_keep and 16 times smaller scales (max_keep matters
    there); then REQUANT of every row (the h
    codes from the maxima), SEND of the codes, a COMBINE GEMM on them (its o beats through
    OUTPUT), and :meth:`ChainProgram.finish` (HBUF and the row maxima on link_o, STATUS).
    Returns (program, ld, link_i)."""
    cp = KeepProgram(rng)
    n_rb = cp.n_tok // R
    modes = (Mode.DRAFT, Mode.FULL, Mode.MSB_ONLY, Mode.LSB_ONLY)

    def mode():
        return modes[int(rng.integers(0, 4))]

    for _ in range(3):
        rb0 = int(rng.integers(0, n_rb))
        rbn = int(rng.integers(1, n_rb - rb0 + 1))
        tb = rb0 * R
        for keep in (bool(rng.random() < 0.3), True):
            cp.plain_gemm(mode(), rbn, int(rng.integers(1, 5)), int(rng.integers(1, 3)),
                          sink=Sink.SWIGLU, tok_base=tb, out_base=0, max_keep=keep)
        n = int(rng.integers(1, 3))
        steps = ([(c, [Mode.DRAFT]) for c in range(n + 1)] if rng.random() < 0.5
                 else [(c, [Mode.LSB_ONLY, Mode.MSB_ONLY]) for c in range(n)])
        cp.chain(steps, act_reuse=True, sink=Sink.SWIGLU, out_base=0,
                 tok_base=R * int(rng.integers(rb0, rb0 + rbn)),
                 max_keep=bool(rng.random() < 0.5))
        cbn = int(rng.integers(1, 5))
        cp.plain_gemm(mode(), rbn, cbn, 1, sink=Sink.SWIGLU, tok_base=tb,
                      out_base=2 * int(rng.integers(1, 16 - cbn + 1)),
                      max_keep=bool(rng.random() < 0.5))
    # a second pass whose channel-0 block has a smaller max (scales / 16) than the first's
    tb = R * int(rng.integers(0, n_rb))
    cp.plain_gemm(Mode.DRAFT, 1, 4, 2, sink=Sink.SWIGLU, tok_base=tb, out_base=0)
    cp.plain_gemm(Mode.DRAFT, 1, 1, 2, sink=Sink.SWIGLU, tok_base=tb, out_base=0,
                  max_keep=True, shrink=4)
    cp.prog.requant(row_blocks=n_rb, channels=32, act_base=cp.h_base, tok_base=0)
    cp.prog.barrier()
    cp.prog.send(Target.ACT, cp.h_base, n_rb)
    m = mode()
    cp.plain_gemm(m, n_rb, int(rng.integers(1, 5)), 1, sink=Sink.COMBINE, act_base=cp.h_base, tok_base=0, out_base=0)
    return cp.finish()


@pytest.mark.parametrize("traffic, pe, seed", [
    ("smooth", None, 1500), ("rough", None, 1501), ("rough", "lean", 1502),
    ("smooth", "S1", 1503),
], ids=["smooth", "rough", "rough-lean", "smooth-swiglu_units1"])
def test_max_keep_equals_fsim(traffic, pe, seed):
    """Random programs of SWIGLU GEMMs at channel 0 with and without ``max_keep``
    (random_max_keep_program: a later GEMM over the same rows with max_keep, K chains whose
    last GEMM's max_keep decides), REQUANT and a COMBINE GEMM on the h codes: RTL == fsim
    (the HBUF rows, row maxima and h codes on link_o, the o DATA beats of OUTPUT, STATUS on
    the functional fields), with and without idle cycles and backpressure, on the FPGA-lean
    PE (one SwiGLU unit: channel 0 in sub-step 0; quarter-word ROWMAX) and with one SwiGLU
    unit on the default PE. The programs' max_keep flags matter: fsim without them differs."""
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    options = {None: None, "lean": FPGA_LEAN_PE, "S1": {"swiglu_units": 1}}[pe]
    for _ in range(2):
        prog, ld, link_i = random_max_keep_program(rng)
        got, ref = compare_with_fsim(prog, ld, link_i, seed=seed, traffic=TRAFFIC[traffic],
                                     pe_options=options)
        assert ref.ld_used == len(ld)
        assert any(c.fields.get("max_keep") for c in prog)
        plain = fsim.run(without_max_keep(prog), ld, link_i)
        assert plain.link_o != ref.link_o            # row maxima and h codes differ


#: The small PE with 4 HBUF words (a row block's h of 32 channels: I = 64 takes two passes)
#: and 8 ACT words (x of H = 256 does not fit beside the h codes: x streams in 3-group slots).
TWO_PASS_ARCH = dataclasses.replace(ARCH, name="small-2pass", iomem_bytes=8192,
                                    iomem_split=(2, 1, 1, 28))


@pytest.mark.parametrize("mode, hidden, tokens, pe, seed", [
    (Mode.DRAFT, 64, 3, None, 1510), (Mode.FULL, 64, 3, "lean", 1511),
    (Mode.FULL, 256, 2, None, 1512),
], ids=["DRAFT", "FULL-lean", "FULL-x_stream"])
def test_two_pass_expert_equals_fsim(mode, hidden, tokens, pe, seed):
    """The streamed expert program (sw/golden/expert_stream.py) with two passes over up/gate
    (I = 64 in two HBUF chunks of 32 channels; pass 1 for the row max, pass 2 chunk by chunk
    with max_keep, each chunk requantized with the full row's exponent), x resident or
    streamed (H = 256), on a small PE with 4 HBUF words: RTL == fsim (o beats, STATUS) and
    the decoded FP32 == ref_expert bit for bit; 3 tokens (two token tiles) under idle cycles
    and backpressure, and on the FPGA-lean PE. Chunk 1's up weights are 4x larger, so a row's
    max lies in chunk 1, above pass 2's channel-0 block's: the program without max_keep gives
    other h codes and outputs (fsim), and the RTL follows it there too (DRAFT)."""
    from elmoe3d.sw.golden.expert import ref_expert
    from elmoe3d.sw.golden.expert_stream import build_streamed_expert_program
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    i = 64
    x = rng.normal(size=(tokens, hidden))
    up, gate = (rng.normal(size=(i, hidden)) * 0.2 for _ in range(2))
    up[32:] *= 4
    down = rng.normal(size=(hidden, i)) * 0.2
    gw = rng.uniform(0.2, 1.0, tokens)
    job = build_streamed_expert_program(x, (up, gate, down), gw, mode, TWO_PASS_ARCH)
    assert (job.info["passes"], job.info["x_stream"]) == (2, hidden == 256)
    assert any(c.fields.get("max_keep") for c in job.program)
    plain = without_max_keep(job.program)
    options = FPGA_LEAN_PE if pe == "lean" else {}
    traffic = ROUGH if pe is None and hidden == 64 else SMOOTH
    _, ref = compare_with_fsim(job.program, job.ld, seed=seed, traffic=traffic,
                               dut=PE(config=TWO_PASS_ARCH, **options))
    want = ref_expert(x, up, gate, down, gw, mode)
    y = job.decode(ref)                              # == the RTL's o beats (compared)
    assert np.array_equal(y.view(np.uint32), want.y.view(np.uint32))
    if mode is Mode.DRAFT:
        _, ref = compare_with_fsim(plain, job.ld, seed=seed, traffic=traffic,
                                   dut=PE(config=TWO_PASS_ARCH, **options))
    else:
        ref = fsim.run(plain, job.ld)
    assert not np.array_equal(job.decode(ref).view(np.uint32), want.y.view(np.uint32))


#: The small PE with 4 ACT words (x of K = 256, 8 groups, streams in 2-group slots), 112 HBUF
#: words and 8 OUT words (a row block's OUT chunk of 32 Q.24 channels: N = 40 takes two
#: chunks, an OUTPUT and a CLEAR between them).
LINEAR_ARCH = dataclasses.replace(ARCH, name="small-linear", iomem_bytes=8192,
                                  iomem_split=(1, 1, 28, 2))


class _Beats:
    """The DATA beats of an RTL run (``run_pe``'s ``o``) as ``StreamedJob.decode`` takes them."""

    def __init__(self, o, pe):
        self.words = [data for kind, data in o if kind != OKind.STATUS]
        self.pe = pe

    def data(self):
        return asm.unpack_fp32(asm.ints_to_words(self.words, self.pe), self.pe)


@pytest.mark.parametrize("mode, arch, k, n, rows, raw, traffic, seed", [
    (Mode.DRAFT, "small", 64, 24, "normal", None, "rough", 1520),
    (Mode.FULL, "small", 96, 20, "normal", True, "smooth", 1521),
    (Mode.DRAFT, "linear", 256, 40, "normal", None, "rough", 1522),
    (Mode.FULL, "linear", 256, 44, "normal", True, "smooth", 1523),
    (Mode.FULL, "small", 96, 20, "zero-1e4", None, "rough", 1524),
    (Mode.DRAFT, "small", 64, 20, "saturate", True, "smooth", 1525),
], ids=["DRAFT-resident-fp32", "FULL-resident-raw", "DRAFT-stream-fp32", "FULL-stream-raw",
        "FULL-zero-1e4", "DRAFT-saturate-raw"])
def test_linear_program_equals_fsim(mode, arch, k, n, rows, raw, traffic, seed):
    """The streamed linear-layer program (sw/golden/linear_stream.py: y = x W^T, x in place of
    the down projection's h codes, gate 1.0) on the small PE, x resident in ACT, and on a PE of
    4 ACT words where x (K = 256) streams in two-group slots and N = 40 or 44 takes two OUT
    chunks; DRAFT and FULL, OUTPUT as FP32 and raw (Q.24, converted by ``decode``); N not a
    multiple of the OUTPUT step (zero weight rows, their outputs dropped by ``decode``); 3 or 5
    tokens on 2 rows (a last token tile half padding: gate 0). RTL == fsim (o beats, STATUS)
    under idle cycles and backpressure, the RTL's decoded output == ref_linear bit for bit,
    and its last STATUS beat's sticky flags == ref_linear's. Corner cases: an all-zero token
    row and a row scaled by 1e4 beside normal rows; a row scaled by 1e12 in the last (partial)
    tile, whose outputs saturate Q.24 (vpu_saturation set)."""
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    cfg = {"small": ARCH, "linear": LINEAR_ARCH}[arch]
    tokens = 5 if rows == "zero-1e4" else 3
    x = rng.normal(size=(tokens, k))
    if rows == "zero-1e4":
        x[1] = 0.0
        x[2] *= 1e4
    elif rows == "saturate":
        x[2] *= 1e12
    w = rng.normal(size=(n, k)) * 0.2
    job, got, want, y = _linear_on_rtl(x, w, mode, arch, traffic, seed, raw=raw)
    assert job.plan.raw_output == bool(raw)
    assert tokens % cfg.pe.rows and job.info["tiles"] == -(-tokens // cfg.pe.rows)
    assert job.plan.out_padded > n
    if arch == "linear":
        assert job.plan.out_padded > job.plan.out_chunk            # two OUT chunks
    status = asm.unpack_status([data for kind, data in got["o"] if kind == OKind.STATUS][-1])
    assert (status["acc_overflow"], status["vpu_saturation"]) == \
        (int(want.acc_overflow), int(want.vpu_saturation))
    assert want.vpu_saturation == (rows == "saturate")
    if rows == "zero-1e4":
        assert not y[1].any() and np.abs(y[2]).max() > 1e3 * np.abs(y[[0, 3, 4]]).max()


@pytest.mark.minilm
@pytest.mark.parametrize("mode, arch, k, n, proj, traffic, seed", [
    (Mode.FULL, "small", 96, 20, "up", "rough", 1530),
    (Mode.DRAFT, "linear", 256, 44, "down", "smooth", 1531),
], ids=["FULL-resident-up", "DRAFT-stream-down"])
def test_linear_program_on_minilm_equals_fsim(mode, arch, k, n, proj, traffic, seed,
                                              minilm_file, gsm8k_prompts):
    """Real trained weights and their real inputs on the RTL PE: all-MiniLM-L6-v2's layer-2 up
    projection (its first K = 96 input channels, 20 output channels) on the FFN input of three
    GSM8K-prompt tokens, x resident in ACT, and its down projection (K = 256, 44 channels) on
    the GELU output, x streamed, quantized to G32 INT8 by the program builder as any weight
    is. RTL == fsim (o beats, STATUS) under idle cycles and backpressure, and the decoded
    output == ref_linear bit for bit."""
    from elmoe3d.sw.host import minilm
    print(f"seed={seed} (traffic only: the data are MiniLM's)")
    up, down = minilm.ffn_weights(2)
    ffn_in, ffn_mid = minilm.ffn_activations(gsm8k_prompts[:1], 2)
    w, acts = (up, ffn_in) if proj == "up" else (down, ffn_mid)
    _, _, _, y = _linear_on_rtl(acts[:3, :k], w[:n, :k], mode, arch, traffic, seed)
    assert np.count_nonzero(y) > 0


#: The real MoE layers on the small PE (OUT: 176 words of 8 Q.24 values; T x H values padded
#: to whole 2-row blocks): 16 tokens of MiniLM's first 64 of 384 hidden channels (128 OUT
#: words; 16 x 384 would need 768) with all 8 experts routed, and 2 tokens of all 384 channels
#: (96 OUT words) with 4 experts. Name -> (tokens, hidden).
REAL_MOE_CUTS = {"16tok-h64": (16, 64), "2tok-h384": (2, MINILM_HIDDEN)}


@pytest.fixture(scope="module")
def real_moe_cuts(minilm_file, gsm8k_prompts, gsm8k_routing):
    """:func:`tests.real_inputs.minilm_moe` of a cut of :data:`REAL_MOE_CUTS`, built the
    first time a test asks for it (``make test`` runs one cut, ``make test-slow`` the
    other)."""
    built = {}

    def cut(name):
        if name not in built:
            t, h = REAL_MOE_CUTS[name]
            built[name] = minilm_moe(gsm8k_prompts, gsm8k_routing, tokens=t, hidden=h)
        return built[name]
    return cut


@pytest.mark.minilm
@pytest.mark.parametrize("mode, cut, traffic, seed", [
    (Mode.FULL, "16tok-h64", SMOOTH, 1540), (Mode.DRAFT, "16tok-h64", ROUGH, 1541),
    (Mode.FULL, "2tok-h384", SMOOTH, 1542), (Mode.DRAFT, "2tok-h384", ROUGH, 1543),
], ids=["FULL-16tok-h64", "DRAFT-16tok-h64", "FULL-2tok-h384", "DRAFT-2tok-h384"])
def test_moe_program_on_minilm_equals_fsim(mode, cut, traffic, seed, real_moe_cuts):
    """The PE's MoE-layer program (``build_moe_program``) on REAL weights, real activations
    and real gate weights, on the small PE: RTL == fsim (every ``o`` beat, STATUS on its
    functional fields) and the RTL's FP32 output == ``ref_moe`` bit for bit (the sticky
    flags equal too: on these data neither rises, printed), FULL and DRAFT (MSB planes
    only), under :data:`REAL_MOE_CUTS`'s two cuts:

    * experts: 8 slices of all-MiniLM-L6-v2's trained layer-2 FFN (its up projection split
      into up and gate halves of 96 channels, its down projection's matching 96 columns;
      :func:`tests.real_inputs.minilm_moe`), G32-quantized by the builder as any weight;
    * activations: MiniLM's real layer-2 FFN inputs of the first GSM8K prompt's first 16
      (or 2) tokens;
    * routing: the real top-2 expert ids and gate weights of the Mixtral-8x7B GSM8K trace
      (request 0, layer 0, positions 0..15 or 0..1), paired with MiniLM's tokens by position.

    What is cut: "16tok-h64" keeps MiniLM's first 64 of 384 hidden channels (x's first 64
    features, the up/gate weights' first 64 input columns, the down weights' first 64 output
    rows: the whole experts' first two G32 groups and first 64 rows, code for code, as
    asserted here) so that 16 tokens fit the PE's OUT; "2tok-h384" keeps the whole hidden
    dimension for 2 tokens (4 experts routed; in ``make test-slow``, ``tests/conftest.py``).
    Nothing is invented or rescaled. The traffic (idle cycles, backpressure) is the only
    random part: its seed is fixed and printed."""
    from elmoe3d.sw.golden.expert import Expert, build_moe_program, ref_moe
    from elmoe3d.sw.host import minilm
    print(f"seed={seed} (traffic only: the data are MiniLM's and the trace's)")
    moe = real_moe_cuts(cut)
    tokens, hidden = REAL_MOE_CUTS[cut]
    x, routing = moe.x, (moe.ids, moe.bits)
    job = build_moe_program(x, moe.experts, routing, mode, PE_CFG)
    got, ref = compare_with_fsim(job.program, job.ld, seed=seed, traffic=traffic)
    assert ref.ld_used == len(job.ld)
    data = [d for k, d in got["o"] if k == OKind.DATA]
    y = asm.unpack_fp32(asm.ints_to_words(data, PE_CFG), PE_CFG).reshape(-1, hidden)[:tokens]
    want = ref_moe(x, moe.experts, routing, mode)
    assert np.array_equal(y.view(np.uint32), want.y.view(np.uint32))
    st = asm.unpack_status([d for k, d in got["o"] if k == OKind.STATUS][-1])
    assert (st["acc_overflow"], st["vpu_saturation"]) == (want.acc_overflow,
                                                          want.vpu_saturation)
    # the data are what the docstring says: real, cut as stated, and far from trivial
    assert x.shape == (tokens, hidden) and len(moe.experts) == MOE_EXPERTS
    if hidden < MINILM_HIDDEN:              # the cut experts: the whole ones' codes, cut
        w_up, w_down = minilm.ffn_weights(MINILM_LAYER)
        g, step = hidden // 32, 2 * MOE_INTER
        for e, ex in enumerate(moe.experts):
            whole = Expert.quantize(w_up[step * e:step * e + MOE_INTER],
                                    w_up[step * e + MOE_INTER:step * (e + 1)],
                                    w_down[:, step * e:step * e + MOE_INTER])
            for cut_w, q, scale in ((ex.up, whole.up.q[:, :hidden], whole.up.scale[:, :g]),
                                    (ex.gate, whole.gate.q[:, :hidden],
                                     whole.gate.scale[:, :g]),
                                    (ex.down, whole.down.q[:hidden], whole.down.scale[:hidden])):
                assert np.array_equal(cut_w.q, q)
                assert np.array_equal(cut_w.scale.view(np.uint16), scale.view(np.uint16))
    counts = {e: len(rows) for e, rows, _, _ in moe.routed}
    gw = moe.bits.reshape(-1).view(np.float16).astype(np.float64)
    x_q = np.asarray(moe.result.detail["x_q"])
    other = ref_moe(x, moe.experts, routing, Mode.DRAFT if mode is Mode.FULL else Mode.FULL)
    differ = np.count_nonzero(y.view(np.uint32) != other.y.view(np.uint32))
    print(f"{tokens} tokens x H={hidden}, experts {counts}, {job.info['gemm_beats']} tile "
          f"beats, {len(job.ld)} ld words; x_q in [{x_q.min()}, {x_q.max()}], e_x "
          f"{sorted(set(moe.e_x.tolist()))}; gate weights in [{gw.min():.3f}, {gw.max():.3f}] "
          f"({len(np.unique(moe.bits))} distinct); y in [{y.min():.4g}, {y.max():.4g}] "
          f"({len(np.unique(y))} distinct, {differ} of {y.size} differ from "
          f"{'DRAFT' if mode is Mode.FULL else 'FULL'}); flags "
          f"{(want.acc_overflow, want.vpu_saturation)}")
    assert len(counts) == (MOE_EXPERTS if tokens == 16 else 4)
    assert sum(counts.values()) == 2 * tokens and set(job.info["experts"]) == set(counts)
    if tokens == 16:
        assert sum(n >= 3 for n in counts.values()) >= 5         # several multi-token experts
    assert len(np.unique(moe.bits)) == 2 * tokens and gw.min() < 0.25 and gw.max() > 0.75
    assert x_q.min() < -64 and x_q.max() > 64 and len(np.unique(x_q)) >= 50
    assert len(set(moe.e_x.tolist())) >= 2
    assert np.count_nonzero(y) == y.size and (y < 0).any() and (y > 0).any()
    assert len(np.unique(y)) > 0.95 * y.size and np.abs(y).max() > 64 * np.abs(y).min()
    assert differ > 0.9 * y.size                  # DRAFT really drops the LSB slices


def _linear_on_rtl(x, w, mode, arch, traffic, seed, *, raw=None):
    """The streamed linear-layer program of ``y = x w^T`` on the RTL PE of ``arch`` (small:
    x resident; linear: x streamed) against fsim, under ``traffic``; its decoded output
    checked against ref_linear bit for bit. Returns ``(job, rtl log, ref_linear, y)``."""
    from elmoe3d.sw.golden.linear_stream import build_streamed_linear_program, ref_linear
    cfg = {"small": ARCH, "linear": LINEAR_ARCH}[arch]
    job = build_streamed_linear_program(x, w, mode, cfg, raw_output=raw)
    assert job.plan.x_stream == (arch == "linear")
    dut = PE(config=cfg) if cfg is not ARCH else None
    got, ref = compare_with_fsim(job.program, job.ld, seed=seed, traffic=TRAFFIC[traffic],
                                 dut=dut)
    assert ref.ld_used == len(job.ld)
    want = ref_linear(x, w, mode)
    y = job.decode(_Beats(got["o"], cfg.pe))
    assert y.shape == (len(x), len(w))
    assert np.array_equal(y.view(np.uint32), want.y.view(np.uint32))
    return job, got, want, y

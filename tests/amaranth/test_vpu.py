"""VPU units (:mod:`elmoe3d.hw.vpu`) in the Amaranth simulator against the golden model
(:mod:`elmoe3d.sw.golden.vpu`): random values, corner cases, real inputs, and random idle /
backpressure cycles. The real inputs (``real_moe``) are the intermediate values of a golden MoE
layer built from all-MiniLM-L6-v2's real FFN weights on real GSM8K prompt tokens, routed with the
real gate weights of the GSM8K Mixtral-8x7B trace.

Every comparison is plain equality. Seeds are fixed and printed (``pytest -s`` shows them; a
failing assertion shows them too).
"""

import time

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Fragment

from elmoe3d.hw import vpu as hw
from elmoe3d.hw.checked import inspection
from elmoe3d.sim.amaranth_streams import drive_pipeline
from elmoe3d.sim.traffic import FLOW_IDS, FLOW_PAIRS, LIGHT
from elmoe3d.sw.golden import vpu as sw
from elmoe3d.sw.golden.vpu import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

from ..real_inputs import (MOE_EXPERTS as REAL_EXPERTS, MOE_INTER as REAL_INTER,
                           MOE_TOKENS as REAL_TOKENS, minilm_moe)


FLOWS = FLOW_PAIRS           # (idle, stall) of the shared flow-control sweep


# ---- bench --------------------------------------------------------------------------------------

def run_unit(dut, inputs, *, seed, idle=0.0, stall=0.0, drain=None):
    """Drive ``inputs`` (a list of field dicts of ``dut.i.payload``) through ``dut`` with a
    random source (idle probability ``idle``) and a random sink (not-ready probability
    ``stall``).

    Checks on every cycle: ``i.ready == ~o.valid | o.ready``; a result offered and not taken
    stays valid and unchanged; no more results than inputs, and none after the last one for
    ``drain`` cycles (nothing duplicated). Returns ``(outputs, log)``: outputs as field dicts
    in arrival order, log with the accept and emit cycles and the DUT's latency.
    """
    in_layout = dut.i.payload.shape()
    fields = list(dut.o.payload.shape().members)
    return drive_pipeline(dut, [in_layout.const(x) for x in inputs], n_results=len(inputs),
                          seed=seed, idle=idle, stall=stall,
                          drain=dut.latency + 4 if drain is None else drain,
                          read=lambda p: {f: int(getattr(p, f)) for f in fields})


def check(dut, inputs, want, *, seed, idle=0.0, stall=0.0):
    """Run and compare with ``want`` (a dict of equal-length arrays, one per output field)."""
    got, log = run_unit(dut, inputs, seed=seed, idle=idle, stall=stall)
    assert len(got) == len(inputs)
    for f, col in want.items():
        g = [x[f] for x in got]
        w = [int(v) for v in col]
        bad = [k for k in range(len(w)) if g[k] != w[k]]
        assert not bad, (f"seed={seed} field {f}: {len(bad)} mismatches; first at {bad[0]}: "
                         f"input {inputs[bad[0]]} got {g[bad[0]]} want {w[bad[0]]}")
    if stall == 0.0:      # always-ready sink: every result exactly `latency` after its input
        assert log["emit"] == [c + log["latency"] for c in log["accept"]]
    if idle == 0.0 and stall == 0.0:
        assert log["accept"] == list(range(len(inputs)))          # II = 1
    return got


def _tags(n, width, rng):
    return rng.integers(0, 1 << width, n) if width else np.zeros(n, np.int64)


def _signed_mix(rng, n, bits, *, edges=()):
    """Random signed integers of up to ``bits`` bits with random magnitudes (log-uniform), plus
    the given edge values."""
    mag = rng.integers(0, bits, n)
    v = rng.integers(-(1 << 62), 1 << 62, n, dtype=np.int64, endpoint=True)
    v = np.where(mag < 63, v >> (62 - np.minimum(mag, 62)), v)
    v = np.clip(v, -(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return np.concatenate([np.asarray(edges, np.int64), v]).astype(np.int64)


# ---- parameters and elaboration ---------------------------------------------------------------

UNITS = [hw.SwiGLUUnit, hw.RowMaxExponent, hw.RequantUnit, hw.CombineUnit, hw.Fp32Converter]


@pytest.mark.parametrize("cls", UNITS, ids=lambda c: c.__name__)
def test_parameters(cls):
    dut = cls(tag_width=3)
    assert dut.tag_width == 3 and isinstance(dut.latency, int) and dut.latency >= 1
    for name in ("tag_width", "latency"):
        with pytest.raises(AttributeError):
            setattr(dut, name, 1)
    for bad in (-1, 65, 1.5, True, "3"):
        with pytest.raises(ValueError):
            cls(tag_width=bad)
    with pytest.raises(TypeError):
        cls(3)                                   # keyword-only
    assert dut.i.payload.shape().members["tag"].width == 3
    assert dut.o.payload.shape().members["tag"].width == 3
    Fragment.get(dut, None)
    if cls in (hw.SwiGLUUnit, hw.CombineUnit):
        deep = cls(mul_stages=3)
        assert deep.latency == dut.latency + (3 - 1) * (2 if cls is hw.SwiGLUUnit else 1)
        Fragment.get(deep, None)
        for bad in (0, 5, 1.0, True):
            with pytest.raises(ValueError):
                cls(mul_stages=bad)
        with pytest.raises(AttributeError):
            dut.mul_stages = 2


def test_latencies_and_verilog():
    want = {hw.SwiGLUUnit: 11, hw.RowMaxExponent: 1, hw.RequantUnit: 1, hw.CombineUnit: 6,
            hw.Fp32Converter: 2}
    for cls, lat in want.items():
        t0 = time.perf_counter()
        dut = cls()
        assert dut.latency == lat
        text = verilog.convert(dut, name=cls.__name__.lower())
        print(f"{cls.__name__}: latency {dut.latency}, {len(text.splitlines())} Verilog lines, "
              f"{time.perf_counter() - t0:.2f} s")
        assert f"module {cls.__name__.lower()}" in text


def test_sigmoid_rom_init():
    init = hw.sigmoid_rom_init()
    t = sw.sigmoid_table()
    assert len(init) == 512
    assert [w["base"] for w in init] == t[:-1].tolist()
    assert [w["base"] + w["diff"] for w in init] == t[1:].tolist()
    assert max(w["diff"] for w in init) < 1 << 11


# ---- SwiGLU -------------------------------------------------------------------------------------

def swiglu_inputs_corners():
    """(acc_up, acc_gate, e_x) corner triples. With e_x = 8 the shift is 0: acc = Q16.16 value."""
    lim = 16 << 16
    rows = []
    # g at table points, midpoints (frac = 2048, the interpolation tie) and their neighbours,
    # over the whole table and at the +-16 boundaries and beyond (SiLU saturation range).
    pts = list(range(-lim, lim + 1, 4096 * 37)) + [-lim, -lim + 4096, lim - 4096, 0, 4096]
    for p in pts:
        for d in (0, 2048, 1, -1, 2047, 2049):
            rows.append((3 << 16, p + d, 8))
    for g in (-lim - 1, -lim, -lim + 1, lim - 1, lim, lim + 1, INT32_MIN, INT32_MAX, 20 << 16,
              -(20 << 16), -(83756)):
        for u in (1 << 16, -(1 << 16), INT32_MAX, INT32_MIN, 0, 12345):
            rows.append((u, g, 8))
    # to_q16 saturation: large accumulators, e_x that shifts left, ties of the rounding.
    for e_x in (-128, -20, 0, 7, 8, 9, 30, 127):
        for acc in (INT64_MAX, INT64_MIN, 1, -1, 1 << 40, -(1 << 40), (1 << 39) - 128,
                    (1 << 39) - 64, 3 << 7, -(3 << 7), 5 << 7, 384, 640):
            rows.append((acc, acc, e_x))
            rows.append((acc, 1 << 24, e_x))
    # h saturation (u and g in range), both signs; h ties (silu * u with a half in bit 15).
    for u in (INT32_MAX, INT32_MIN, 1 << 30, -(1 << 30), 3 << 15, 1 << 15, -(1 << 15)):
        for g in (lim, lim + 12345, INT32_MAX, 1 << 16, -(1 << 16), 1):
            rows.append((u, g, 8))
    return rows


def _acc_for(target, shift, rng):
    """An int64 accumulator that to_q16 maps near ``target`` for ``shift = 8 - e_x``: the target
    shifted back, with random bits below (rounding, ties included), clipped to int64."""
    if shift <= 0:
        return target >> -shift
    low = int(rng.integers(0, 1 << min(shift, 62)))
    if rng.random() < 0.1:
        low = 1 << (shift - 1)                      # an exact tie
    return min(max((target << shift) + low, INT64_MIN), INT64_MAX)


def swiglu_inputs_random(rng, n):
    """80% realistic elements (u log-uniform in Q16.16, g in [-20, 20] for most), 20% anything
    (saturating accumulators, extreme exponents)."""
    rows = []
    for _ in range(n):
        if rng.random() < 0.2:
            e_x = int(rng.integers(-128, 128))
            up, gate = (int(x) for x in _signed_mix(rng, 2, 64))
        else:
            e_x = int(rng.integers(-12, 12))
            u = int(rng.integers(INT32_MIN, INT32_MAX, endpoint=True)) >> int(rng.integers(0, 22))
            if rng.random() < 0.7:
                g = int(rng.integers(-(20 << 16), 20 << 16))
            else:
                g = int(_signed_mix(rng, 1, 32)[0])
            up, gate = _acc_for(u, 8 - e_x, rng), _acc_for(g, 8 - e_x, rng)
        rows.append((up, gate, e_x))
    return rows


def run_swiglu(rows, *, seed, idle=0.0, stall=0.0, tag_width=0, mul_stages=1,
               always_ready=False):
    rng = np.random.default_rng(seed)
    up = np.array([r[0] for r in rows], np.int64)
    gate = np.array([r[1] for r in rows], np.int64)
    e_x = np.array([r[2] for r in rows], np.int64)
    tags = _tags(len(rows), tag_width, rng)
    h, s = sw.swiglu_q16(up, gate, e_x)
    inputs = [{"acc_up": int(a), "acc_gate": int(b), "e_x": int(c), "tag": int(t)}
              for a, b, c, t in zip(up, gate, e_x, tags)]
    dut = hw.SwiGLUUnit(tag_width=tag_width, mul_stages=mul_stages, always_ready=always_ready)
    check(dut, inputs, {"h": h, "sat": s, "tag": tags}, seed=seed, idle=idle, stall=stall)
    return h, s


def _swiglu_ties(rows):
    """How many corner elements hit a rounding tie in each rounding step (coverage check)."""
    up = np.array([r[0] for r in rows], np.int64)
    acc_g = np.array([r[1] for r in rows], np.int64)
    e_x = np.array([r[2] for r in rows], np.int64)
    g, _ = sw.to_q16(acc_g, e_x)
    u, _ = sw.to_q16(up, e_x)
    lim = sw.SILU_LIMIT
    inside = (g >= -lim) & (g < lim)
    t = sw.sigmoid_table()
    x = np.clip(g, -lim, lim - 1) + lim
    interp = (t[(x >> 12) + 1] - t[x >> 12]) * (x & 4095)
    sig = sw.sigmoid_q16(g)
    sh = 8 - e_x
    k = np.clip(sh, 1, 62)
    return {
        "to_q16": int(np.sum((sh > 0) & (sh < 63) & ((acc_g & ((1 << k) - 1)) == 1 << (k - 1)))),
        "interpolation": int(np.sum(inside & ((interp & 4095) == 2048))),
        "g*sig": int(np.sum(inside & (((g * sig) & 65535) == 32768))),
        "silu*u": int(np.sum(((sw.silu_q16(g) * u) & 65535) == 32768)),
    }


def test_swiglu_corners():
    seed = 5000
    print(f"seed={seed}")
    rows = swiglu_inputs_corners()
    ties = _swiglu_ties(rows)
    print(f"rounding ties covered: {ties}")
    assert min(ties.values()) >= 5
    h, s = run_swiglu(rows, seed=seed)
    assert s.any() and not s.all()
    assert h.max() == INT32_MAX and h.min() == INT32_MIN


@pytest.mark.parametrize("idle,stall", FLOWS, ids=FLOW_IDS)
def test_swiglu_random_flow(idle, stall):
    seed = 5100 + FLOWS.index((idle, stall))
    print(f"seed={seed} idle={idle} stall={stall}")
    rng = np.random.default_rng(seed)
    run_swiglu(swiglu_inputs_random(rng, 300), seed=seed, idle=idle, stall=stall, tag_width=5)


def test_swiglu_mul_stages():
    seed = 5200
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    rows = swiglu_inputs_random(rng, 120) + swiglu_inputs_corners()[:60]
    run_swiglu(rows, seed=seed, mul_stages=3, tag_width=1)
    run_swiglu(rows, seed=seed + 1, mul_stages=2, idle=LIGHT.idle, stall=LIGHT.backpressure)


# ---- row max exponent and requantization --------------------------------------------------------

def test_rowmax_exponent():
    seed = 5300
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    thr = [(127 << e) if e >= 0 else (127 >> -e) for e in range(-6, 26)]
    vals = [0, 1, 2, 1 << 31, (1 << 32) - 1] + [t + d for t in thr for d in (-1, 0, 1)]
    vals += rng.integers(0, 1 << 32, 100, dtype=np.int64).tolist()
    vals += (rng.integers(0, 1 << 31, 100, dtype=np.int64) >> rng.integers(0, 31, 100)).tolist()
    vals = np.array([v for v in vals if 0 <= v < 1 << 32], np.int64)
    e = sw.requant_exponent(vals)
    tags = _tags(len(vals), 4, rng)
    inputs = [{"max": int(v), "tag": int(t)} for v, t in zip(vals, tags)]
    for k, (idle, stall) in enumerate(FLOWS[::3]):
        check(hw.RowMaxExponent(tag_width=4), inputs, {"e": e, "e_h": e - 16, "tag": tags},
              seed=seed + k, idle=idle, stall=stall)
    assert e.min() == -6 and e.max() == 26


def requant_inputs(rng, n):
    h = _signed_mix(rng, n, 32, edges=[INT32_MIN, INT32_MAX, 0, -1, 1])
    e = rng.integers(-128, 128, len(h))
    e = np.where(rng.random(len(h)) < 0.7, rng.integers(-8, 34, len(h)), e)
    # Mostly the e' a row max of about |h| gives (the clip never bites), sometimes one less.
    fit = sw.requant_exponent(np.abs(h)) + rng.integers(-1, 3, len(h))
    e = np.where(rng.random(len(h)) < 0.5, fit, e)
    # ties: h = (2q + 1) * 2^(e-1) for small q, both signs; and the +-127.5 clip ties
    q = rng.integers(-130, 130, 60)
    et = rng.integers(1, 26, 60)
    ht = (2 * q + 1) << (et - 1)
    ok = (ht >= INT32_MIN) & (ht <= INT32_MAX)
    h = np.concatenate([h, ht[ok], [255 << 5, -(255 << 5), 253 << 5, INT32_MIN, INT32_MIN, 1, -1,
                                    -2, 2]])
    e = np.concatenate([e, et[ok], [6, 6, 6, 32, 31, -6, -7, -6, -7]])
    return h.astype(np.int64), e.astype(np.int64)


@pytest.mark.parametrize("idle,stall", FLOWS[::3], ids=FLOW_IDS[::3])
def test_requant(idle, stall):
    seed = 5400 + FLOWS.index((idle, stall))
    print(f"seed={seed} idle={idle} stall={stall}")
    rng = np.random.default_rng(seed)
    h, e = requant_inputs(rng, 300)
    hq, clip = sw.requant_shift(h, e)
    tags = _tags(len(h), 2, rng)
    inputs = [{"h": int(a), "e": int(b), "tag": int(t)} for a, b, t in zip(h, e, tags)]
    check(hw.RequantUnit(tag_width=2), inputs, {"h_q": hq, "clip": clip, "tag": tags},
          seed=seed, idle=idle, stall=stall)
    assert clip.any() and not clip.all()


def test_requant_rows_end_to_end():
    """Whole rows (all-zero rows, e' at its extremes): RowMaxExponent then RequantUnit equal
    row_requant."""
    seed = 5500
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    rows = rng.integers(INT32_MIN, INT32_MAX, (6, 24), endpoint=True)
    rows = rows >> rng.integers(0, 32, (6, 1))
    rows[1] = 0
    rows[2, :] = 0
    rows[2, 5] = 1                                  # e' = -6
    rows[3, 7] = INT32_MIN                          # e' = 25
    want_q, want_eh = sw.row_requant(rows.astype(np.int32))
    mx = sw.row_max(rows)
    got_e, _ = run_unit(hw.RowMaxExponent(), [{"max": int(v), "tag": 0} for v in mx], seed=seed)
    e = np.array([x["e"] for x in got_e])
    assert [x["e_h"] for x in got_e] == want_eh.tolist()
    assert e.min() == -6 and e.max() == 25 and e[1] == 0
    inputs = [{"h": int(rows[t, i]), "e": int(e[t]), "tag": 0}
              for t in range(rows.shape[0]) for i in range(rows.shape[1])]
    got = check(hw.RequantUnit(), inputs, {"h_q": want_q.reshape(-1),
                                           "clip": np.zeros(want_q.size, bool)}, seed=seed)
    assert len(got) == rows.size


# ---- combination ---------------------------------------------------------------------------------

GW_SPECIAL = [0x0000, 0x8000, 0x0001, 0x03FF, 0x8001, 0x83FF, 0x0400, 0x3C00, 0xBC00, 0x3800,
              0x7BFF, 0xFBFF, 0x7C00, 0xFFFF, 0x3555, 0x2E66, 0x0200]


def combine_inputs(rng, n):
    acc = _signed_mix(rng, n, 64, edges=[INT64_MAX, INT64_MIN, 0, 1, -1, 3, -3, 5, -5])
    k = len(acc)
    e_h = np.where(rng.random(k) < 0.7, rng.integers(-22, 10, k), rng.integers(-128, 128, k))
    gw = np.where(rng.random(k) < 0.3, rng.choice(GW_SPECIAL, k),
                  np.where(rng.random(k) < 0.5, rng.integers(0x1000, 0x3C01, k),
                           rng.integers(0, 1 << 16, k)))
    out = np.where(rng.random(k) < 0.2,
                   rng.choice(np.array([INT64_MAX, INT64_MIN, INT64_MAX - 5, INT64_MIN + 5,
                                        0]), k), _signed_mix(rng, k, 64)[:k])
    flag = rng.random(k) < 0.2
    # Ties of the single rounding: acc * m odd at one bit below 2^-24, subnormal and normal w.
    t_acc = np.array([3, 5, -3, -5, 7, -7, 3 << 20, 1 << 52, -(1 << 52)], np.int64)
    t_eh = np.array([23, 23, 23, 23, 23, 23, 3, -20, -20])
    t_gw = np.array([0x0001, 0x0001, 0x0001, 0x0001, 0x0001, 0x0001, 0x3C00, 0x3C01, 0xBC01])
    # Sticky: a flagged sum that a term pulls back stays flagged; saturating terms and sums.
    s_acc = np.array([-(1 << 20), INT64_MAX, INT64_MIN, 1 << 40, -(1 << 40), 1], np.int64)
    s_eh = np.array([0, 9, 9, 20, 20, -128])
    s_gw = np.array([0x3C00, 0x7BFF, 0x7BFF, 0x3C00, 0x3C00, 0x0001])
    s_out = np.array([INT64_MAX, 0, 0, INT64_MAX - 1, INT64_MIN + 1, INT64_MIN], np.int64)
    s_flag = np.array([1, 0, 0, 0, 0, 1], bool)
    acc = np.concatenate([acc, t_acc, s_acc])
    e_h = np.concatenate([e_h, t_eh, s_eh])
    gw = np.concatenate([gw, t_gw, s_gw]).astype(np.uint16)
    out = np.concatenate([out, np.zeros(len(t_acc), np.int64), s_out])
    flag = np.concatenate([flag, np.zeros(len(t_acc), bool), s_flag])
    return acc, e_h, gw, out, flag


def run_combine(acc, e_h, gw, out, flag, *, seed, idle=0.0, stall=0.0, tag_width=0,
                mul_stages=1, always_ready=False):
    rng = np.random.default_rng(seed)
    new, nflag = sw.combine(out[:, None], flag[:, None], acc[:, None], e_h, gw)
    tags = _tags(len(acc), tag_width, rng)
    inputs = [{"acc_y": int(a), "e_h": int(b), "gw": int(c), "out": int(d), "flag": int(f),
               "tag": int(t)} for a, b, c, d, f, t in zip(acc, e_h, gw, out, flag, tags)]
    dut = hw.CombineUnit(tag_width=tag_width, mul_stages=mul_stages, always_ready=always_ready)
    check(dut, inputs, {"out": new[:, 0], "flag": nflag[:, 0], "tag": tags}, seed=seed,
          idle=idle, stall=stall)
    return new[:, 0], nflag[:, 0]


@pytest.mark.parametrize("idle,stall", FLOWS, ids=FLOW_IDS)
def test_combine(idle, stall):
    seed = 5600 + FLOWS.index((idle, stall))
    print(f"seed={seed} idle={idle} stall={stall}")
    rng = np.random.default_rng(seed)
    new, nflag = run_combine(*combine_inputs(rng, 250), seed=seed, idle=idle, stall=stall,
                             tag_width=3)
    assert nflag[-6] and new[-6] == INT64_MAX - (1 << 20)       # sticky after pulling back
    assert nflag[-5] and new[-5] == INT64_MAX                   # saturating term
    assert nflag[-4] and new[-4] == INT64_MIN
    assert nflag[-3] and new[-3] == INT64_MAX                   # saturating sum
    assert nflag[-2] and new[-2] == INT64_MIN


def test_combine_mul_stages_and_expert_chain():
    """mul_stages = 2, and a chain of experts whose outputs are fed back as ``out`` (the
    read-modify-write of one OUT row), equal to sw.combine applied expert by expert."""
    seed = 5700
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    run_combine(*combine_inputs(rng, 80), seed=seed, mul_stages=2, stall=0.3)
    hdim, experts = 16, 5
    out = np.zeros((1, hdim), np.int64)
    flags = np.zeros((1, hdim), bool)
    hw_out, hw_flag = out[0].copy(), flags[0].copy()
    dut = hw.CombineUnit()
    for x in range(experts):
        acc = rng.integers(INT64_MIN, INT64_MAX, (1, hdim), endpoint=True) >> int(
            rng.integers(0, 30))
        e_h = rng.integers(-22, 10, 1)
        gw = rng.choice(np.array(GW_SPECIAL[:12], np.uint16), 1)
        out, flags = sw.combine(out, flags, acc, e_h, gw)
        inputs = [{"acc_y": int(acc[0, c]), "e_h": int(e_h[0]), "gw": int(gw[0]),
                   "out": int(hw_out[c]), "flag": int(hw_flag[c]), "tag": 0}
                  for c in range(hdim)]
        got, _ = run_unit(dut, inputs, seed=seed + x, idle=0.2, stall=0.2)
        hw_out = np.array([g["out"] for g in got], np.int64)
        hw_flag = np.array([g["flag"] for g in got], bool)
    assert hw_out.tolist() == out[0].tolist() and hw_flag.tolist() == flags[0].tolist()


# ---- FP32 ---------------------------------------------------------------------------------------

def fp32_inputs(rng, n):
    vals = [0, 1, -1, INT64_MAX, INT64_MIN, INT64_MIN + 1, INT64_MAX - 1, (1 << 24) - 1, 1 << 24,
            (1 << 24) + 1, (1 << 25) + 1, (1 << 25) + 2, (1 << 25) + 3, (1 << 25) + 6,
            (1 << 63) - (1 << 39), (1 << 63) - (1 << 38), (1 << 63) - (1 << 38) - 1,
            (1 << 62) + (1 << 38) + 1]
    for sh in (1, 2, 15, 39):
        for q in ((1 << 23) + 1, (1 << 23) + 2, (1 << 24) - 1, (1 << 24) - 2):
            v = (q << sh) + (1 << (sh - 1))
            vals += [v, -v, v + 1, v - 1]
    rand = _signed_mix(rng, n, 64)
    return np.concatenate([np.array(vals, np.int64), rand])


@pytest.mark.parametrize("idle,stall", FLOWS[::3], ids=FLOW_IDS[::3])
def test_fp32(idle, stall):
    seed = 5800 + FLOWS.index((idle, stall))
    print(f"seed={seed} idle={idle} stall={stall}")
    rng = np.random.default_rng(seed)
    v = fp32_inputs(rng, 250)
    bits = sw.q24_to_fp32(v).view(np.uint32)
    tags = _tags(len(v), 6, rng)
    inputs = [{"value": int(a), "tag": int(t)} for a, t in zip(v, tags)]
    check(hw.Fp32Converter(tag_width=6), inputs, {"bits": bits, "tag": tags}, seed=seed,
          idle=idle, stall=stall)
    assert bits[3] == np.float32(2.0 ** 39).view(np.uint32)


# ---- always-ready units (the PE's SWIGLU and COMBINE sinks, its row-max exponent) ----------------

@pytest.mark.parametrize("mul_stages", [1, 2])
def test_always_ready_units_match_golden(mul_stages):
    """``always_ready=True``: ``i.ready`` and ``o.ready`` are the constant 1 and the results
    equal the golden model, each exactly ``latency`` cycles after its input, with an idle
    source (the units the PE's sinks instantiate; the roll-up synthesises these)."""
    seed = 5900 + mul_stages
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    rows = swiglu_inputs_random(rng, 150) + swiglu_inputs_corners()[:60]
    run_swiglu(rows, seed=seed, idle=0.3, tag_width=2, mul_stages=mul_stages,
               always_ready=True)
    run_combine(*combine_inputs(rng, 150), seed=seed, idle=0.3, tag_width=3,
                mul_stages=mul_stages, always_ready=True)
    vals = rng.integers(0, 1 << 32, 120, dtype=np.int64)
    e = sw.requant_exponent(vals)
    check(hw.RowMaxExponent(always_ready=True), [{"max": int(v), "tag": 0} for v in vals],
          {"e": e, "e_h": e - 16}, seed=seed, idle=0.3)


def test_always_ready_signature_and_errors():
    with inspection():                  # built only to read their signatures
        for unit in (hw.SwiGLUUnit(always_ready=True), hw.CombineUnit(always_ready=True),
                     hw.RowMaxExponent(always_ready=True), hw.RequantUnit(always_ready=True),
                     hw.Fp32Converter(always_ready=True)):
            assert unit.always_ready
            assert unit.signature.members["o"].signature.always_ready
            assert unit.signature.members["i"].signature.always_ready
        assert not hw.CombineUnit().signature.members["o"].signature.always_ready
        del unit
        with pytest.raises(TypeError, match="always_ready: expected a bool, got 1"):
            hw.CombineUnit(always_ready=1)
        with pytest.raises(ValueError, match="always-ready stream cannot stall"):
            run_combine(*combine_inputs(np.random.default_rng(0), 4), seed=0, stall=0.5,
                        always_ready=True)


# ---- real inputs: MiniLM's weights and activations, the Mixtral trace's gate weights ------------

@pytest.fixture(scope="module")
def real_moe(minilm_file, gsm8k_prompts, gsm8k_routing):
    """A real MoE layer run by the golden model (:func:`tests.real_inputs.minilm_moe`, the
    whole hidden dimension of 384, 16 tokens, FULL): its intermediate values are the VPU
    units' real inputs. Activations: the layer-2 FFN inputs of all-MiniLM-L6-v2 on the first
    GSM8K prompt's first 16 tokens; experts: the 8 slices of MiniLM's layer-2 FFN described at
    :data:`~tests.real_inputs.MOE_EXPERTS` (its up projection split into up and gate halves,
    96 channels each), G32-quantized; routing: the ids and gate weights of the Mixtral-8x7B
    GSM8K trace, request 0, layer 0, positions 0..15 (paired with MiniLM's tokens by position).

    Returns a namespace: ``result`` (the :class:`ExpertResult`, ``detail`` with the ``acc_up``,
    ``acc_gate``, ``h``, ``h_q``, ``e_h``, ``acc_y`` of every expert), ``e_x`` ``[T]``,
    ``bits`` uint16 ``[T, 2]`` and ``experts``: ``(e, rows, gw bits, detail)`` per routed
    expert, in ascending id (the order ``ref_moe`` and a PE program combine them)."""
    from types import SimpleNamespace
    moe = minilm_moe(gsm8k_prompts, gsm8k_routing)
    assert len(moe.routed) == REAL_EXPERTS              # every expert has tokens
    return SimpleNamespace(result=moe.result, e_x=moe.e_x, bits=moe.bits, experts=moe.routed)


def _real_swiglu_rows(real):
    """(acc_up, acc_gate, e_x) of every routed (token, expert, channel), experts ascending."""
    return [(int(u), int(g), int(real.e_x[t]))
            for _, rows, _, d in real.experts
            for r, t in enumerate(rows)
            for u, g in zip(d["acc_up"][r], d["acc_gate"][r])]


@pytest.mark.minilm
def test_swiglu_real_minilm(real_moe):
    """:class:`SwiGLUUnit` on real pre-activations, bit for bit: the Q.24 up and gate
    accumulators of MiniLM's layer-2 up projection (split into up and gate halves, 8 experts
    of 96 channels) on the layer-2 FFN inputs of GSM8K tokens (their real ``e_x``), for the
    tokens the GSM8K Mixtral trace routes to each expert (16 tokens x top-2 x 96 = 3,072
    elements), under light idle cycles and backpressure. Equal to ``swiglu_q16`` and to the
    ``h`` of the golden MoE layer."""
    seed = 6000
    print(f"seed={seed} (traffic only: the data are MiniLM's and the trace's)")
    rows = _real_swiglu_rows(real_moe)
    h, s = run_swiglu(rows, seed=seed, idle=LIGHT.idle, stall=LIGHT.backpressure, tag_width=4)
    # the RTL equals swiglu_q16 inside run_swiglu (check); that equals the MoE layer's h
    want = np.concatenate([d["h"].reshape(-1) for *_, d in real_moe.experts])
    assert h.tolist() == want.tolist()
    # non-trivial: g over the interpolated SiLU range on both sides, h of both signs
    g, _ = sw.to_q16(np.array([r[1] for r in rows]), np.array([r[2] for r in rows]))
    segments = np.unique((g + sw.SILU_LIMIT) >> sw.SIG_STEP_BITS)
    print(f"{len(rows)} elements, g in [{g.min() / 65536:.2f}, {g.max() / 65536:.2f}], "
          f"{len(segments)} table segments, h in [{h.min()}, {h.max()}], sat {int(s.sum())}")
    assert len(rows) == REAL_TOKENS * 2 * REAL_INTER
    assert g.min() < -(2 << 16) and g.max() > 2 << 16 and len(segments) >= 60
    assert (h < 0).sum() > len(h) // 10 and (h > 0).sum() > len(h) // 10
    assert np.count_nonzero(h) > 0.95 * len(h) and len(np.unique(h)) > 0.9 * len(h)


@pytest.mark.minilm
def test_rowmax_requant_real_minilm(real_moe):
    """:class:`RowMaxExponent` then :class:`RequantUnit` on real SwiGLU rows, bit for bit: the
    Q16.16 ``h`` of MiniLM's layer-2 up projection split into up and gate halves (8 experts of
    96 channels) on GSM8K tokens, one row per (token, expert) the GSM8K Mixtral trace routes
    (32 row maxima, 3,072 elements). The exponents equal ``requant_exponent`` of the row max
    and ``row_requant``'s ``e_h``; the codes equal ``requant_shift`` and ``row_requant``."""
    seed = 6100
    print(f"seed={seed} (traffic only: the data are MiniLM's and the trace's)")
    h = [d["h"][r] for *_, d in real_moe.experts for r in range(len(d["h"]))]
    want_eh = np.concatenate([d["e_h"] for *_, d in real_moe.experts])
    want_q = np.concatenate([d["h_q"].reshape(-1) for *_, d in real_moe.experts])
    mx = sw.row_max(np.array(h))
    e = sw.requant_exponent(mx)
    assert (e - sw.Q16_FRAC_BITS).tolist() == want_eh.tolist()
    tags = np.arange(len(mx)) % 16
    check(hw.RowMaxExponent(tag_width=4), [{"max": int(v), "tag": int(t)} for v, t in
                                           zip(mx, tags)],
          {"e": e, "e_h": want_eh, "tag": tags}, seed=seed, idle=0.4, stall=0.5)
    hv = np.concatenate(h).astype(np.int64)
    ev = np.repeat(e, [len(r) for r in h])
    hq, clip = sw.requant_shift(hv, ev)
    assert hq.tolist() == want_q.tolist() and not clip.any()
    inputs = [{"h": int(a), "e": int(b), "tag": k % 4} for k, (a, b) in enumerate(zip(hv, ev))]
    check(hw.RequantUnit(tag_width=2), inputs,
          {"h_q": hq, "clip": clip, "tag": np.arange(len(hv)) % 4},
          seed=seed + 1, idle=LIGHT.idle, stall=LIGHT.backpressure)
    # non-trivial: several exponents; every row uses its range (max |h_q| >= 64); all codes
    peak = np.abs(hq.reshape(len(h), -1)).max(axis=1)
    print(f"{len(mx)} rows, e' in {sorted(set(e.tolist()))}, h_q in [{hq.min()}, {hq.max()}], "
          f"{len(np.unique(hq))} distinct codes")
    assert len(set(e.tolist())) >= 2 and (peak >= 64).all()
    assert hq.min() <= -100 and hq.max() >= 100 and len(np.unique(hq)) >= 150


@pytest.mark.minilm
def test_combine_real_mixtral_gates(real_moe):
    """:class:`CombineUnit` on real expert outputs and real gate weights, bit for bit: the Q.24
    down-projection accumulators of 8 experts cut from MiniLM's layer-2 FFN on GSM8K tokens
    (their real ``e_h``), weighted by the gate weights of the GSM8K Mixtral-8x7B trace
    (request 0, layer 0, top-2, as FP16 bits from ``parse_routing``). The OUT rows are
    read-modify-written expert by expert, in ascending id, as a PE program does (16 tokens x
    top-2 x 384 = 12,288 elements; each expert under another of the four flow patterns).
    Every pass equals ``combine``; the final sums equal ``ref_moe``'s ``out``."""
    base = 6200
    print(f"seeds={base}..{base + REAL_EXPERTS - 1} (traffic only: the data are MiniLM's "
          f"and the trace's)")
    res = real_moe.result
    out = np.zeros(res.out.shape, np.int64)
    flags = np.zeros(res.out.shape, bool)
    hdim = out.shape[1]
    for e, rows, gw, d in real_moe.experts:
        acc, e_h = d["acc_y"], d["e_h"]
        want, wflag = sw.combine(out[rows], flags[rows], acc, e_h, gw)
        inputs = [{"acc_y": int(acc[r, c]), "e_h": int(e_h[r]), "gw": int(gw[r]),
                   "out": int(out[t, c]), "flag": int(flags[t, c]), "tag": c % 8}
                  for r, t in enumerate(rows) for c in range(hdim)]
        idle, stall = FLOWS[e % len(FLOWS)]
        got = check(hw.CombineUnit(tag_width=3), inputs,
                    {"out": want.reshape(-1), "flag": wflag.reshape(-1),
                     "tag": np.arange(len(inputs)) % 8}, seed=base + e, idle=idle, stall=stall)
        out[rows] = np.array([g["out"] for g in got], np.int64).reshape(len(rows), hdim)
        flags[rows] = np.array([g["flag"] for g in got], bool).reshape(len(rows), hdim)
    assert out.tolist() == res.out.tolist() and not flags.any()
    # non-trivial: many distinct gate weights, outputs of both signs over a wide range
    gws = np.concatenate([gw for _, _, gw, _ in real_moe.experts])
    w = gws.view(np.float16).astype(np.float64)
    print(f"{len(gws)} gate weights in [{w.min():.4f}, {w.max():.4f}] "
          f"({len(np.unique(gws))} distinct); out in [{out.min()}, {out.max()}]")
    assert len(gws) == 2 * REAL_TOKENS and len(np.unique(gws)) >= 24
    assert w.min() < 0.25 and w.max() > 0.75
    assert np.count_nonzero(out) > 0.99 * out.size and (out < 0).any() and (out > 0).any()
    assert np.abs(out).max() > 1 << 24 and len(np.unique(out)) > 0.9 * out.size


@pytest.mark.minilm
def test_combine_every_trace_gate_weight(real_moe, gsm8k_routing):
    """:class:`CombineUnit` on every distinct gate weight of the GSM8K Mixtral-8x7B trace (all
    rows: both requests, 32 layers, top-2; FP16 bits from ``parse_routing``, about 2,200
    values), each applied to a real expert output: the Q.24 down-projection accumulators (and
    ``e_h``) of the 8 experts cut from MiniLM's layer-2 FFN on GSM8K tokens, taken in turn, added
    into the real output sums of the MoE layer. Equal to ``combine``, bit for bit."""
    from elmoe3d.sw.golden.expert import parse_routing
    seed = 6250
    print(f"seed={seed} (traffic only: the data are MiniLM's and the trace's)")
    tr = gsm8k_routing
    _, bits = parse_routing((tr.expert_ids, tr.gate_weights), len(tr.expert_ids),
                            tr.num_experts)
    gw = np.unique(bits)
    acc = np.concatenate([d["acc_y"].reshape(-1) for *_, d in real_moe.experts])
    e_h = np.concatenate([np.repeat(d["e_h"], d["acc_y"].shape[1])
                          for *_, d in real_moe.experts])
    out = real_moe.result.out.reshape(-1)
    k = np.arange(len(gw)) * 7 % len(acc)               # spread over experts and tokens
    j = np.arange(len(gw)) % len(out)
    new, flag = run_combine(acc[k], e_h[k], gw, out[j], np.zeros(len(gw), bool), seed=seed,
                            idle=LIGHT.idle, stall=LIGHT.backpressure, tag_width=2)
    # non-trivial: the whole range of real gate weights; terms that change the sums
    w = gw.view(np.float16).astype(np.float64)
    print(f"{len(gw)} distinct gate weights in [{w.min():.5f}, {w.max():.5f}]")
    assert len(gw) >= 2000 and w.min() < 0.01 and w.max() > 0.99 and not flag.any()
    assert np.count_nonzero(new - out[j]) > 0.99 * len(gw)


def _real_fp32_values(real, tokens=4):
    """The Q.24 output rows of the ``tokens`` tokens with the largest max |out| (the FP32
    converter simulates at about 800 values per second), flat, and ``ref_moe``'s FP32 ``y``
    of them."""
    pick = np.sort(np.argsort(-np.abs(real.result.out).max(axis=1), kind="stable")[:tokens])
    return real.result.out[pick].reshape(-1), real.result.y[pick].reshape(-1)


@pytest.mark.minilm
def test_fp32_real_moe_output(real_moe):
    """:class:`Fp32Converter` on real Q.24 sums, bit for bit: the output of the MoE layer of
    8 experts cut from MiniLM's layer-2 FFN on GSM8K tokens, combined with the GSM8K
    Mixtral trace's gate weights: the rows of the 4 tokens with the largest outputs (4 x 384 =
    1,536 values; the others are smaller still). Equal to ``q24_to_fp32`` and to the FP32
    ``y`` of ``ref_moe``."""
    seed = 6300
    print(f"seed={seed} (traffic only: the data are MiniLM's and the trace's)")
    v, y = _real_fp32_values(real_moe)
    bits = sw.q24_to_fp32(v).view(np.uint32)
    assert bits.tolist() == y.view(np.uint32).tolist()
    tags = np.arange(len(v)) % 64
    check(hw.Fp32Converter(tag_width=6), [{"value": int(a), "tag": int(t)}
                                          for a, t in zip(v, tags)],
          {"bits": bits, "tag": tags}, seed=seed, idle=LIGHT.idle, stall=LIGHT.backpressure)
    # non-trivial: both signs, many binary exponents, values that round (|v| >= 2^24 has
    # more than 24 significant bits; real FFN outputs are mostly below 1.0, so they are few)
    exps = np.unique((bits >> 23) & 0xFF)
    rounded = int((np.abs(v) >= 1 << 24).sum())
    print(f"{len(v)} values, {rounded} rounded, {len(exps)} binary exponents")
    assert rounded >= 3 and len(exps) >= 12 and np.count_nonzero(v) == len(v)
    assert (bits >> 31).any() and not (bits >> 31).all()


@pytest.mark.minilm
@pytest.mark.parametrize("mul_stages", [1, 2])
def test_always_ready_units_real(real_moe, mul_stages):
    """The ``always_ready=True`` units (the PE's SWIGLU and COMBINE sinks, its row-max
    exponent; requant and FP32 too) on the real inputs of the tests above, bit for bit, with
    an idle source: SwiGLU on MiniLM's layer-2 up/gate accumulators of GSM8K tokens, the row
    max and requantization of their real ``h``, the combine of the first two routed experts'
    real outputs with the GSM8K Mixtral trace's gate weights, FP32 of the layer's output."""
    seed = 6400 + mul_stages
    print(f"seed={seed} (traffic only: the data are MiniLM's and the trace's)")
    rows = _real_swiglu_rows(real_moe)
    h, _ = run_swiglu(rows, seed=seed, idle=0.3, tag_width=2, mul_stages=mul_stages,
                      always_ready=True)            # the RTL checked inside; then golden h:
    assert h.tolist() == np.concatenate([d["h"].reshape(-1)
                                         for *_, d in real_moe.experts]).tolist()
    hs = np.concatenate([d["h"] for *_, d in real_moe.experts]).astype(np.int64)
    mx = sw.row_max(hs)
    e = sw.requant_exponent(mx)
    check(hw.RowMaxExponent(always_ready=True), [{"max": int(v), "tag": 0} for v in mx],
          {"e": e, "e_h": e - 16}, seed=seed, idle=0.3)
    hq, clip = sw.requant_shift(hs, e[:, None])
    check(hw.RequantUnit(always_ready=True),
          [{"h": int(a), "e": int(b), "tag": 0} for a, b in zip(hs.reshape(-1),
                                                               np.repeat(e, hs.shape[1]))],
          {"h_q": hq.reshape(-1), "clip": clip.reshape(-1)}, seed=seed, idle=0.3)
    out = np.zeros(real_moe.result.out.shape, np.int64)
    flags = np.zeros(out.shape, bool)
    for e_id, rows_e, gw, d in real_moe.experts[:2]:
        want, wflag = sw.combine(out[rows_e], flags[rows_e], d["acc_y"], d["e_h"], gw)
        acc = d["acc_y"]
        new, nflag = run_combine(acc.reshape(-1), np.repeat(d["e_h"], acc.shape[1]),
                                 np.repeat(gw, acc.shape[1]), out[rows_e].reshape(-1),
                                 flags[rows_e].reshape(-1), seed=seed + e_id, idle=0.3,
                                 tag_width=3, mul_stages=mul_stages, always_ready=True)
        assert new.tolist() == want.reshape(-1).tolist()    # (the RTL checked in run_combine)
        out[rows_e], flags[rows_e] = new.reshape(want.shape), nflag.reshape(want.shape)
    assert np.count_nonzero(out) > 0 and (out < 0).any() and (out > 0).any()
    v, y = _real_fp32_values(real_moe, tokens=2)
    bits = sw.q24_to_fp32(v).view(np.uint32)
    check(hw.Fp32Converter(always_ready=True), [{"value": int(a), "tag": 0} for a in v],
          {"bits": bits}, seed=seed, idle=0.3)
    assert bits.tolist() == y.view(np.uint32).tolist()

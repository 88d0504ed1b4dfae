"""Tensor tile in the Amaranth simulator against its golden model (:mod:`elmoe3d.sw.golden.tile`) and the
bit-exact GEMM (:func:`elmoe3d.sw.golden.datapath.gemm`), plus the golden-only tiling property.

Every comparison is plain equality. Seeds are fixed and printed (``pytest -s`` shows them; a
failing assertion shows them too).
"""

import gc
import time

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.hdl import Fragment
from hypothesis import given, settings
from hypothesis import strategies as st

from elmoe3d.config import ConfigError, TileConfig
from elmoe3d.hw.layouts import TileMode, pack_beats, tile_beat_layout, tile_result_layout, \
    unpack_results
from elmoe3d.hw.tile import TensorTile
from elmoe3d.sim.amaranth_streams import drive_pipeline
from elmoe3d.sim.traffic import FLOW_PAIRS, IDLE_STALL, LIGHT
from elmoe3d.sw.golden.datapath import INT64_MAX, INT64_MIN, Mode, gemm
from elmoe3d.sw.golden.quant import QuantizedWeight, quantize_weights
from elmoe3d.sw.golden.tile import ref_tile, tile_assemble, tile_schedule


FP16_MAX_BITS = 0x7BFF      # 65504


# ---- bench --------------------------------------------------------------------------------------

def _expected_results(beats):
    return int(np.count_nonzero(beats["last"]))


def run_tile(cfg, beats, *, seed=0, idle=0.0, stall=0.0, drain=12, dsp_pairs=False, passes=1,
             streamed_weights=False, streamed_acts=False):
    """Drive ``beats`` through a :class:`TensorTile` with a random source (idle probability
    ``idle``) and a random sink (not-ready probability ``stall``).

    Checks the stream protocol on every cycle: ``i.ready == ~(o.valid & ~o.ready)``; a result
    offered and not taken stays valid and unchanged; after the expected results and ``drain``
    more cycles no further result appears (nothing duplicated).

    Returns ``(results, log)``: results in :func:`ref_tile`'s format; log with the cycle of every
    accepted beat (``accept``) and every taken result (``emit``) and the DUT's ``latency``.

    ``streamed_weights`` / ``streamed_acts``: the source offers the weights / activations a
    pass at a time (the pass's nibbles first in every lane, its bytes first in every row, the
    others random, different in every pass: the tile must ignore them), following the tile's
    ``phase``.
    """
    dut = TensorTile(config=cfg, dsp_pairs=dsp_pairs, passes=passes,
                     streamed_weights=streamed_weights, streamed_acts=streamed_acts)
    words = pack_beats(cfg, beats)
    in_pass = None
    if streamed_weights or streamed_acts:
        in_pass = _streamed_in_pass(cfg, passes, np.random.default_rng(seed + 1),
                                    weights=streamed_weights, acts=streamed_acts)
    got, log = drive_pipeline(dut, [int(w) for w in words], n_results=_expected_results(beats),
                              seed=seed, idle=idle, stall=stall, drain=drain, passes=passes,
                              in_pass=in_pass)
    return unpack_results(cfg, got), log


def _streamed_in_pass(cfg, passes, rng, *, weights, acts):
    """``in_pass(word, p)`` for :func:`drive_pipeline`: the beat word with (``weights``) every
    lane's weight nibbles ``p d .. p d + d - 1`` (d = group / passes) moved to nibbles
    ``0 .. d - 1`` and (``acts``) every row's activation bytes ``p d ..`` moved to bytes
    ``0 .. d - 1``, random bits after them."""
    layout = tile_beat_layout(cfg)
    d = cfg.group // passes
    fields = []                  # (offset, count, bits per element)
    if weights:
        fields += [(layout["wgt"].offset + n * 4 * cfg.group, cfg.group, 4)
                   for n in range(cfg.lanes)]
    if acts:
        fields += [(layout["act"].offset + r * 8 * cfg.group, cfg.group, 8)
                   for r in range(cfg.rows)]

    def in_pass(word, p):
        for at, count, bits in fields:
            width, keep = count * bits, (1 << bits * d) - 1
            mask = (1 << width) - 1
            part = (word >> at) & mask
            noise = int.from_bytes(rng.bytes(width // 8), "little")
            new = ((part >> bits * d * p) & keep) | ((noise << bits * d) & mask)
            word = word & ~(mask << at) | new << at
        return word
    return in_pass


def assert_results_equal(got, want):
    assert got["acc"].shape == want["acc"].shape
    assert np.array_equal(got["mode"], want["mode"])
    assert np.array_equal(got["overflow"], want["overflow"])
    assert np.array_equal(got["acc"], want["acc"])


def assert_latency(beats, log):
    """Every result leaves exactly ``latency`` cycles after its ``last`` beat was accepted
    (valid only with an always-ready sink)."""
    last_idx = np.flatnonzero(beats["last"])
    want = [log["accept"][i] + log["latency"] for i in last_idx]
    assert log["emit"] == want


# ---- stimulus -----------------------------------------------------------------------------------

def random_scale_bits(rng, shape):
    """FP16 scale bits: mostly moderate normals, some zeros, subnormals, negatives, the FP16
    maximum and exponent-31 patterns (which extend the normal rule, shift 30)."""
    kind = rng.integers(0, 8, shape)
    exp = rng.integers(1, 16, shape)
    frac = rng.integers(0, 1024, shape)
    bits = (exp << 10) | frac
    bits = np.where(kind == 0, 0, bits)
    bits = np.where(kind == 1, rng.integers(1, 1024, shape), bits)          # subnormal
    bits = np.where(kind == 2, bits | 0x8000, bits)                         # negative
    bits = np.where(kind == 3, rng.integers(0, 1 << 16, shape), bits)       # anything at all
    bits = np.where(kind == 4, FP16_MAX_BITS, bits)
    return bits.astype(np.uint16)


def random_beats(rng, cfg, nbeats, *, p_first=0.3, p_last=0.3):
    """Fully random beats: random codes, nibbles, scale bits, modes, first and last flags (mixed
    modes inside accumulations, accumulations without ``first``)."""
    last = rng.random(nbeats) < p_last
    last[-1] = True
    return {
        "act": rng.integers(-128, 128, (nbeats, cfg.rows, 32)).astype(np.int8),
        "wgt": rng.integers(0, 16, (nbeats, cfg.lanes, 32)).astype(np.uint8),
        "scale": random_scale_bits(rng, (nbeats, cfg.lanes)),
        "mode": rng.integers(0, 4, nbeats).astype(np.int64),
        "first": rng.random(nbeats) < p_first,
        "last": last,
    }


def random_weights(rng, n, k, *, zero_groups=0.15, name="w"):
    """Quantized weights with group magnitudes from 1e-7 (subnormal scales) to 1e3, and some
    all-zero groups (scale 0)."""
    g = k // 32
    mag = 10.0 ** rng.uniform(-7, 3, (n, g, 1))
    w = rng.standard_normal((n, g, 32)) * mag
    w[rng.random((n, g)) < zero_groups] = 0.0
    return quantize_weights(w.reshape(n, k).astype(np.float32), name=name)


CONFIGS = [TileConfig(rows=1, lanes=2), TileConfig(rows=2, lanes=4), TileConfig(rows=2, lanes=2),
           TileConfig(rows=1, lanes=4)]


# ---- component --------------------------------------------------------------------------------

# A constructor that raises still leaves an object behind: Amaranth warns that it went unused.
@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_tile_parameters():
    cfg = TileConfig(rows=2, lanes=4)
    dut = TensorTile(config=cfg)
    assert (dut.rows, dut.lanes, dut.group, dut.config) == (2, 4, 32, cfg)
    assert dut.latency == 5
    for name in ("rows", "lanes", "group", "latency", "config"):
        with pytest.raises(AttributeError):
            setattr(dut, name, 1)
    with pytest.raises(TypeError):
        TensorTile(config=(2, 4))
    with pytest.raises(TypeError):
        TensorTile(TileConfig())            # keyword-only
    with pytest.raises(ConfigError):
        TileConfig(rows=2, lanes=3)
    assert dut.i.payload.shape() == tile_beat_layout(cfg)
    assert dut.o.payload.shape() == tile_result_layout(cfg)
    Fragment.get(dut, None)                 # elaborates


def test_pack_beats_and_unpack_results_through_the_layouts():
    """pack_beats puts every field where the layout says (read back field by field);
    unpack_results reads integers and simulator Const views alike, extremes included."""
    cfg = TileConfig(rows=2, lanes=4)
    rng = np.random.default_rng(3)
    beats = random_beats(rng, cfg, 5)
    beats["act"][0] = -128
    beats["wgt"][1] = 15
    beats["scale"][2] = 0xFFFF
    words = pack_beats(cfg, beats)
    layout = tile_beat_layout(cfg)
    assert len(words) == 5 and all(0 <= w < 1 << layout.size for w in words)
    for b, word in enumerate(words):
        view = layout.from_bits(word)
        assert [[int(view.act[r][k]) for k in range(32)] for r in range(cfg.rows)] == \
            beats["act"][b].tolist()
        assert [[int(view.wgt[n][k]) for k in range(32)] for n in range(cfg.lanes)] == \
            beats["wgt"][b].tolist()
        assert [int(view.scale[n]) for n in range(cfg.lanes)] == beats["scale"][b].tolist()
        assert view.mode.value == int(beats["mode"][b])
        assert (int(view.first), int(view.last)) == (int(beats["first"][b]),
                                                      int(beats["last"][b]))

    rlayout = tile_result_layout(cfg)
    acc = rng.integers(INT64_MIN, INT64_MAX, (3, cfg.rows, cfg.lanes), dtype=np.int64,
                       endpoint=True)
    acc[0, 0, 0], acc[0, 0, 1] = INT64_MIN, INT64_MAX
    ovf = rng.random((3, cfg.rows, cfg.lanes)) < 0.5
    modes = [Mode.FULL, Mode.LSB_ONLY, Mode.DRAFT]
    consts = [rlayout.const({"acc": acc[i].tolist(), "overflow": ovf[i].astype(int).tolist(),
                             "mode": TileMode(modes[i].value)}) for i in range(3)]
    want = {"acc": acc, "overflow": ovf, "mode": np.array([m.value for m in modes])}
    for raws in (consts, [c.as_bits() for c in consts]):
        got = unpack_results(cfg, raws)
        assert got["acc"].dtype == np.int64 and got["overflow"].dtype == bool
        assert_results_equal(got, want)
    empty = unpack_results(cfg, [])
    assert empty["acc"].shape == (0, cfg.rows, cfg.lanes)
    with pytest.raises(ValueError, match="not the tile result layout"):
        unpack_results(TileConfig(rows=1, lanes=2), consts)


def test_verilog_converts():
    t0 = time.perf_counter()
    text = verilog.convert(TensorTile(config=TileConfig(rows=2, lanes=4)), name="tensor_tile")
    lines = len(text.splitlines())
    print(f"tensor_tile 2x4x32: {lines} Verilog lines, {len(text)} bytes, "
          f"{time.perf_counter() - t0:.2f} s")
    assert "module tensor_tile" in text
    assert lines < 20000


# ---- RTL vs golden ----------------------------------------------------------------------------

@pytest.mark.parametrize("dsp_pairs", [False, True], ids=["unit", "pairs"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.rows}x{c.lanes}")
@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.name)
def test_random_gemm(cfg, mode, dsp_pairs):
    """tile_schedule -> TensorTile -> tile_assemble == ref_tile == gemm, ragged shapes; also
    the paired tile (``dsp_pairs``: two products per multiplier)."""
    seed = 1000 + 10 * int(mode) + CONFIGS.index(cfg) + 4000 * dsp_pairs
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    m_total = int(rng.integers(1, 2 * cfg.rows + 2))
    n_total = int(rng.integers(1, 2 * cfg.lanes + 2))
    k = 32 * int(rng.integers(1, 4))
    a_q = rng.integers(-128, 128, (m_total, k)).astype(np.int8)
    qw = random_weights(rng, n_total, k)
    beats = tile_schedule(a_q, qw, mode, cfg.rows, cfg.lanes)
    got, log = run_tile(cfg, beats, seed=seed, dsp_pairs=dsp_pairs)
    assert_results_equal(got, ref_tile(beats))
    assert_latency(beats, log)
    assert tile_assemble(got, m_total, n_total, mode, cfg.rows, cfg.lanes) == gemm(a_q, qw, mode)


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=lambda c: f"{c.rows}x{c.lanes}")
@pytest.mark.parametrize("idle,stall", FLOW_PAIRS)
def test_random_beats_flow_control(cfg, idle, stall):
    """Fully random beat streams (mixed modes, random first/last, any scale bits) with random
    idle cycles on the input and random backpressure on the output."""
    seed = 2000 + int(100 * idle) + int(10 * stall) + CONFIGS.index(cfg)
    print(f"seed={seed} idle={idle} stall={stall}")
    rng = np.random.default_rng(seed)
    beats = random_beats(rng, cfg, 60)
    got, log = run_tile(cfg, beats, seed=seed, idle=idle, stall=stall)
    assert_results_equal(got, ref_tile(beats))
    if stall == 0.0:
        assert_latency(beats, log)


def test_throughput_one_beat_per_cycle():
    """Always-valid source, always-ready sink: one beat per cycle (II = 1), and every result
    exactly ``latency`` cycles after its last beat, including back-to-back first+last beats."""
    cfg = TileConfig(rows=2, lanes=4)
    rng = np.random.default_rng(3000)
    print("seed=3000")
    beats = random_beats(rng, cfg, 48, p_first=0.5, p_last=0.5)
    beats["first"][:8] = beats["last"][:8] = True            # eight results back to back
    got, log = run_tile(cfg, beats, seed=3000)
    assert log["accept"] == list(range(48))
    assert_latency(beats, log)
    assert_results_equal(got, ref_tile(beats))


def _const_beats(cfg, nbeats, *, act, nib, scale, mode, first=None, last=None):
    beats = {
        "act": np.full((nbeats, cfg.rows, 32), act, np.int8),
        "wgt": np.broadcast_to(np.asarray(nib, np.uint8), (nbeats, cfg.lanes, 32)).copy(),
        "scale": np.broadcast_to(np.asarray(scale, np.uint16), (nbeats, cfg.lanes)).copy(),
        "mode": np.broadcast_to(np.asarray(mode, np.int64), (nbeats,)).copy(),
        "first": np.zeros(nbeats, bool) if first is None else np.asarray(first, bool),
        "last": np.ones(nbeats, bool) if last is None else np.asarray(last, bool),
    }
    if first is None:
        beats["first"][0] = True
    return beats


def _wgt_nibbles(q, mode, lanes):
    """Per-lane nibble vector [lanes, 1] for a weight code ``q`` on every channel."""
    q = np.int8(q)
    msb, lsb = (int(q) >> 4) & 15, int(q) & 15
    if mode is Mode.FULL:
        return np.array([[msb], [lsb]] * (lanes // 2), np.uint8)
    return np.full((lanes, 1), lsb if mode is Mode.LSB_ONLY else msb, np.uint8)


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.name)
def test_corner_extremes(mode):
    """Activations -128 / 127 against weights -128 / 127 / -1 / 0 in every combination, with
    first+last on one beat: the psum extremes (+-2^19 region) through every width."""
    cfg = TileConfig(rows=2, lanes=4)
    beats_list = []
    for act in (-128, 127, -1, 0):
        for q in (-128, 127, -1, 0, 1, -121):
            b = _const_beats(cfg, 1, act=act, nib=_wgt_nibbles(q, mode, cfg.lanes),
                             scale=0x3C00, mode=int(mode))                # scale 1.0
            beats_list.append(b)
    beats = {k: np.concatenate([b[k] for b in beats_list]) for k in beats_list[0]}
    beats["act"][:, 1, ::2] = np.where(beats["act"][:, 0, ::2] == -128, 127, -128)  # row mix
    got, log = run_tile(cfg, beats, seed=4000 + int(mode))
    want = ref_tile(beats)
    assert_results_equal(got, want)
    assert_latency(beats, log)
    if mode is Mode.FULL:      # the extreme psum 32 * (-128) * (-128) = 2^19 at scale 1.0
        assert want["acc"].max() == (1 << 19) << 24


def test_corner_zero_groups_and_subnormals():
    """All-zero groups with scale 0 (a DRAFT nibble 0 is a nonzero field 1, but scale 0 keeps
    it 0), every subnormal scale magnitude class, negative zero and negative scales."""
    cfg = TileConfig(rows=2, lanes=4)
    rng = np.random.default_rng(4100)
    print("seed=4100")
    nb = 40
    beats = random_beats(rng, cfg, nb, p_first=0.3, p_last=0.4)
    beats["scale"][:10] = 0                                   # zero groups
    beats["wgt"][:10] = 0
    beats["scale"][10:20] = rng.integers(1, 1024, (10, cfg.lanes))          # subnormal
    beats["scale"][20:25] = [[0x0001, 0x03FF, 0x8001, 0x83FF]] * 5          # extremes, signed
    beats["scale"][25:30] = [[0x8000, 0x0400, 0x8400, 0x3C00]] * 5          # -0, min normal
    got, _ = run_tile(cfg, beats, seed=4100)
    want = ref_tile(beats)
    assert_results_equal(got, want)
    # Zero groups in DRAFT: scale 0 must give exactly zero, never a stand-in scale of 1.
    draft0 = _const_beats(cfg, 3, act=-128, nib=0, scale=0, mode=int(Mode.DRAFT),
                          first=[1, 1, 1], last=[1, 1, 1])
    got0, _ = run_tile(cfg, draft0, seed=4101)
    assert not got0["acc"].any() and not got0["overflow"].any()


def test_corner_saturation_sticky():
    """The largest FP16 scale (65504) with extreme psums saturates the int64 accumulators: the
    sticky flag stays set across later beats that pull the value back, ``first`` clears it, and
    both bounds are reached."""
    cfg = TileConfig(rows=2, lanes=4)
    mode = Mode.FULL
    plus = _wgt_nibbles(-128, mode, cfg.lanes)
    n = 24
    # Accumulation 1: 20 beats of +2^19 * 65504 * 2^24 (saturates after 16), then 4 beats of a
    # negative scale that would pull an unsaturated value back.
    b1 = _const_beats(cfg, n, act=-128, nib=plus, scale=FP16_MAX_BITS, mode=int(mode),
                      last=[0] * (n - 1) + [1])
    b1["scale"][20:] = FP16_MAX_BITS | 0x8000
    # Accumulation 2: towards INT64_MIN with exponent-31 scale bits 0xFFFF (m = -2047,
    # shift 30): 8 terms of -2^19 * 2047 * 2^30 stay just inside int64, the 9th saturates.
    b2 = _const_beats(cfg, 10, act=-128, nib=plus, scale=0xFFFF, mode=int(mode),
                      last=[0] * 9 + [1])
    # Accumulation 3: first clears the flag; one small beat.
    b3 = _const_beats(cfg, 1, act=1, nib=plus, scale=0x3C00, mode=int(mode))
    beats = {k: np.concatenate([b1[k], b2[k], b3[k]]) for k in b1}
    got, _ = run_tile(cfg, beats, seed=4200, idle=LIGHT.idle, stall=LIGHT.backpressure)
    want = ref_tile(beats)
    assert_results_equal(got, want)
    assert want["overflow"][0][:, 0::2].all() and want["overflow"][1][:, 0::2].all()
    assert not want["overflow"][0][:, 1::2].any()                 # FULL odd lanes add nothing
    assert (want["acc"][0][:, 0::2] < INT64_MAX).all()            # pulled back after saturating
    assert (want["acc"][1][:, 0::2] == INT64_MIN).all()
    assert not want["overflow"][2].any()


def test_mixed_modes_in_one_accumulation():
    """One accumulation whose beats cycle through all four modes, FULL odd lanes included."""
    cfg = TileConfig(rows=2, lanes=4)
    rng = np.random.default_rng(4300)
    print("seed=4300")
    beats = random_beats(rng, cfg, 16, p_first=0.0, p_last=0.0)
    beats["scale"] = rng.integers(0x2000, 0x4000, (16, cfg.lanes)).astype(np.uint16)
    beats["mode"] = np.arange(16) % 4
    beats["first"][0] = beats["first"][8] = True
    beats["last"][7] = beats["last"][15] = True
    got, log = run_tile(cfg, beats, seed=4300)
    assert_results_equal(got, ref_tile(beats))
    assert_latency(beats, log)


def test_saturating_gemm_through_tile():
    """A GEMM that saturates (scales near 65504, activations -128): gemm's slow path, ref_tile
    and the RTL agree, flags included."""
    cfg = TileConfig(rows=1, lanes=2)
    print("seed=4400")
    k = 32 * 20
    q = np.full((2, k), -128, np.int8)
    q[1, ::3] = 127
    qw = QuantizedWeight(q=q, scale=np.full((2, k // 32), 65504, np.float16), name="big")
    a_q = np.full((1, k), -128, np.int8)
    want = gemm(a_q, qw, Mode.FULL)
    assert want.overflow[0, 0]
    for mode in (Mode.FULL, Mode.MSB_ONLY):
        beats = tile_schedule(a_q, qw, mode, cfg.rows, cfg.lanes)
        got, _ = run_tile(cfg, beats, seed=4400, stall=0.25)
        assert_results_equal(got, ref_tile(beats))
        assert tile_assemble(got, 1, 2, mode, cfg.rows, cfg.lanes) == gemm(a_q, qw, mode)


# ---- golden-only property ---------------------------------------------------------------------

@settings(max_examples=150, deadline=None, derandomize=True)
@given(rows=st.integers(1, 4), pairs=st.integers(1, 4), m_total=st.integers(1, 9),
       n_total=st.integers(1, 11), groups=st.integers(1, 4), mode=st.sampled_from(list(Mode)),
       seed=st.integers(0, 2**31 - 1), big=st.booleans())
def test_schedule_ref_assemble_equals_gemm(rows, pairs, m_total, n_total, groups, mode, seed,
                                           big):
    """tile_assemble(ref_tile(tile_schedule(a, w))) == gemm(a, w) bit for bit, every mode,
    ragged edges, zero groups, subnormal scales, and (``big``) saturating accumulations."""
    rng = np.random.default_rng(seed)
    k = 32 * groups
    a_q = rng.integers(-128, 128, (m_total, k)).astype(np.int8)
    if big:
        q = rng.integers(-128, 128, (n_total, k)).astype(np.int8)
        scale = np.where(rng.random((n_total, groups)) < 0.7, 65504,
                         rng.uniform(0, 65504, (n_total, groups))).astype(np.float16)
        qw = QuantizedWeight(q=q, scale=scale, name="big")
    else:
        qw = random_weights(rng, n_total, k)
    lanes = 2 * pairs
    beats = tile_schedule(a_q, qw, mode, rows, lanes)
    acc = tile_assemble(ref_tile(beats), m_total, n_total, mode, rows, lanes)
    assert acc == gemm(a_q, qw, mode)


def test_golden_rejects_bad_input():
    cfg = TileConfig(rows=1, lanes=2)
    beats = random_beats(np.random.default_rng(0), cfg, 2)
    bad = dict(beats, wgt=beats["wgt"] + 16)
    with pytest.raises(ValueError):
        ref_tile(bad)
    with pytest.raises(ValueError):
        ref_tile(dict(beats, scale=beats["scale"].astype(np.int32)))
    with pytest.raises(ValueError):
        ref_tile({k: v for k, v in beats.items() if k != "last"})
    with pytest.raises(ValueError):
        ref_tile(dict(beats, mode=np.array([0, 7])))
    with pytest.raises(ConfigError):
        tile_schedule(np.zeros((1, 32), np.int8), random_weights(np.random.default_rng(0), 1, 32),
                      Mode.FULL, 1, 3)
    res = ref_tile(beats)
    with pytest.raises(ValueError):
        tile_assemble(res, 5, 5, Mode.FULL, 1, 2)


# ---- DSP pairs (two IA8xW5 products per multiplier, FPGA) -------------------------------------

@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_dsp_pairs_parameter():
    cfg = TileConfig(rows=2, lanes=4)
    plain = TensorTile(config=cfg)
    assert plain.multipliers == 256 and not plain.dsp_pairs
    Fragment.get(plain, None)
    paired = TensorTile(config=cfg, dsp_pairs=True)
    assert paired.dsp_pairs and paired.multipliers == 128
    with pytest.raises(AttributeError):
        paired.dsp_pairs = False
    Fragment.get(paired, None)              # elaborates
    with pytest.raises(TypeError, match="dsp_pairs"):
        TensorTile(config=cfg, dsp_pairs=1)
    gc.collect()                            # the half-built object warns here (filtered)


def test_dsp_pairs_flow_control():
    """Random beats (mixed modes, any scale bits) with idle cycles and backpressure."""
    cfg = TileConfig(rows=2, lanes=4)
    print("seed=5100")
    beats = random_beats(np.random.default_rng(5100), cfg, 60)
    got, _ = run_tile(cfg, beats, seed=5100, idle=IDLE_STALL.idle, stall=IDLE_STALL.backpressure,
                      dsp_pairs=True)
    assert_results_equal(got, ref_tile(beats))


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.name)
def test_dsp_pairs_every_operand_combination(mode):
    """Every (activation, even-lane nibble, odd-lane nibble) triple against the golden model.

    In one beat column k the two rows' activations meet both lane pairs' nibbles: 2 x 2
    triples. 128 activation pairs x 128 nibble-pair pairs fill 16,384 columns, 512 beats of
    32, each its own result at scale 1.0: every weight field of the mode against every INT8
    activation on both halves of a multiplier, including the low product's borrow and the
    extremes (-128 x -16)."""
    cfg = TileConfig(rows=2, lanes=4)
    slot = np.arange(128 * 128)
    u, v = slot // 128, slot % 128                  # activation pair, nibble-pair pair
    nb = slot.size // 32
    act = np.stack([2 * u - 128, 2 * u + 1 - 128]).T.reshape(nb, 32, 2).transpose(0, 2, 1)
    combo = np.stack([2 * v, 2 * v + 1]).T.reshape(nb, 32, 2)     # (lo, hi) = divmod(c, 16)
    wgt = np.zeros((nb, cfg.lanes, 32), np.uint8)
    for j in range(2):
        wgt[:, 2 * j] = combo[:, :, j] // 16
        wgt[:, 2 * j + 1] = combo[:, :, j] % 16
    beats = {
        "act": act.astype(np.int8),
        "wgt": wgt,
        "scale": np.full((nb, cfg.lanes), 0x3C00, np.uint16),
        "mode": np.full(nb, int(mode), np.int64),
        "first": np.ones(nb, bool),
        "last": np.ones(nb, bool),
    }
    seen = {(int(a), int(w[2 * j, k]), int(w[2 * j + 1, k]))
            for acts, w in zip(beats["act"], wgt) for r in range(2) for k in range(32)
            for j in range(2) for a in [acts[r, k]]}
    assert len(seen) == 256 * 16 * 16
    got, _ = run_tile(cfg, beats, seed=5200 + int(mode), dsp_pairs=True)
    assert_results_equal(got, ref_tile(beats))


# ---- passes (the group's depths in P passes, FPGA) --------------------------------------------

@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_passes_parameter():
    cfg = TileConfig(rows=2, lanes=4)
    tile = TensorTile(config=cfg, dsp_pairs=True, passes=2)
    assert tile.passes == 2 and tile.multipliers == 64 and tile.latency == 6
    assert TensorTile(config=cfg, passes=4).multipliers == 64
    Fragment.get(tile, None)                 # elaborates
    for bad in (0, 3, 8, True, 2.0, "2"):
        with pytest.raises(TypeError, match="passes: expected 1, 2 or 4"):
            TensorTile(config=cfg, passes=bad)
    with pytest.raises(TypeError, match="passes: .* and the 6 accumulators, got 4"):
        TensorTile(config=TileConfig(rows=1, lanes=6), passes=4)
    streamed = TensorTile(config=cfg, passes=4, streamed_weights=True)
    assert streamed.streamed_weights and streamed.multipliers == 64
    assert not TensorTile(config=cfg, streamed_weights=True).streamed_weights   # one pass
    Fragment.get(streamed, None)
    with pytest.raises(TypeError, match="streamed_weights: expected a bool, got 1"):
        TensorTile(config=cfg, passes=4, streamed_weights=1)
    both = TensorTile(config=cfg, passes=4, streamed_weights=True, streamed_acts=True)
    assert both.streamed_acts and not TensorTile(config=cfg, streamed_acts=True).streamed_acts
    Fragment.get(both, None)
    with pytest.raises(TypeError, match="streamed_acts: expected a bool, got 'yes'"):
        TensorTile(config=cfg, passes=4, streamed_acts="yes")
    gc.collect()


@pytest.mark.parametrize("passes, dsp_pairs", [(2, True), (2, False), (4, True), (4, False)],
                         ids=["P2-pairs", "P2-unit", "P4-pairs", "P4-unit"])
@pytest.mark.parametrize("idle,stall", FLOW_PAIRS[::3])
def test_passes_random_beats(passes, dsp_pairs, idle, stall):
    """Random beats (mixed modes, random first/last, any scale bits) through a tile that takes
    the group in ``passes`` passes: the golden results, one beat every P cycles when nothing
    waits, every result ``latency`` cycles after its last beat was taken."""
    cfg = TileConfig(rows=2, lanes=4)
    seed = 5200 + 10 * passes + dsp_pairs + int(10 * idle)
    print(f"seed={seed}")
    beats = random_beats(np.random.default_rng(seed), cfg, 40)
    got, log = run_tile(cfg, beats, seed=seed, idle=idle, stall=stall, dsp_pairs=dsp_pairs,
                        passes=passes)
    assert_results_equal(got, ref_tile(beats))
    if idle == stall == 0.0:
        assert log["accept"] == [passes * (i + 1) - 1 for i in range(40)]
        assert_latency(beats, log)


STREAMED = {"weights": {"streamed_weights": True}, "acts": {"streamed_acts": True},
            "both": {"streamed_weights": True, "streamed_acts": True}}


@pytest.mark.parametrize("streamed", ["weights", "acts", "both"])
@pytest.mark.parametrize("passes, dsp_pairs", [(2, False), (4, True)], ids=["P2-unit", "P4-pairs"])
@pytest.mark.parametrize("idle,stall", FLOW_PAIRS[::3])
def test_streamed_random_beats(passes, dsp_pairs, idle, stall, streamed):
    """``streamed_weights`` / ``streamed_acts``: the source offers each pass's weight nibbles
    first in every lane and / or its activation bytes first in every row (the rest random
    noise, new in every pass), following ``phase``; the golden results, the same acceptance
    cycles as the tile that holds the whole beat, ``phase`` and ``next_pass`` checked every
    cycle by the bench."""
    cfg = TileConfig(rows=2, lanes=4)
    seed = 5300 + 10 * passes + dsp_pairs + int(10 * idle) + 100 * list(STREAMED).index(streamed)
    print(f"seed={seed}")
    beats = random_beats(np.random.default_rng(seed), cfg, 40)
    got, log = run_tile(cfg, beats, seed=seed, idle=idle, stall=stall, dsp_pairs=dsp_pairs,
                        passes=passes, **STREAMED[streamed])
    assert_results_equal(got, ref_tile(beats))
    if idle == stall == 0.0:
        assert log["accept"] == [passes * (i + 1) - 1 for i in range(40)]
        assert_latency(beats, log)


@pytest.mark.parametrize("mode", [Mode.FULL, Mode.DRAFT], ids=lambda m: m.name)
def test_streamed_weights_corner_extremes(mode):
    """The extreme group psum with the weights and activations streamed in four passes of
    DSP pairs."""
    cfg = TileConfig(rows=2, lanes=4)
    q = -128 if mode is Mode.FULL else -120
    beats = _const_beats(cfg, 3, act=-128, nib=_wgt_nibbles(q, mode, cfg.lanes), scale=0x3C00,
                         mode=int(mode))
    got, _ = run_tile(cfg, beats, dsp_pairs=True, passes=4, **STREAMED["both"])
    assert_results_equal(got, ref_tile(beats))


@pytest.mark.parametrize("mode", [Mode.FULL, Mode.DRAFT], ids=lambda m: m.name)
def test_passes_corner_extremes(mode):
    """-128 activations against the most negative weight fields on every depth, two passes
    of DSP pairs: the partial trees add up to the extreme group psum exactly."""
    cfg = TileConfig(rows=2, lanes=4)
    q = -128 if mode is Mode.FULL else -120
    beats = _const_beats(cfg, 3, act=-128, nib=_wgt_nibbles(q, mode, cfg.lanes), scale=0x3C00,
                         mode=int(mode))
    got, _ = run_tile(cfg, beats, dsp_pairs=True, passes=2)
    assert_results_equal(got, ref_tile(beats))

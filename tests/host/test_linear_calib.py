"""The plain-GEMM compute calibration (``sw/host/linear_calib.py``): the shipped table against
the PE cycle model on the streamed linear-layer program, the calibration's form against direct
runs, the linear layers the whole-decoder model splits a decoder into, and that
``elmoe3d paper`` reads every plain GEMM from the shipped table."""

import dataclasses

import pytest

from elmoe3d.config import preset
from elmoe3d.errors import UserError
from elmoe3d.sw.host import linear_calib as lc
from elmoe3d.sw.host import paper_eval as pe
from elmoe3d.sw.host.decoder import DECODER_SHAPES
from elmoe3d.sw.host.linear_calib_table import TABLE

PAPER = preset("paper-4gb")


@pytest.mark.parametrize("k,bits", [(64, 4), (576, 8), (2048, 4), (2048, 8)])
def test_shipped_entries_recomputed(k, bits):
    """A shipped entry equals a fresh calibration with the cycle model (the check points
    included: fit error 0)."""
    got = lc.calibrate_linear(PAPER, k, bits)
    want = TABLE[lc.table_key(PAPER, k, bits)]
    assert {f: getattr(got, f) for f in want} == want
    assert got.fit_error == 0


def test_every_shipped_entry_fits_exactly():
    assert len(TABLE) == 2 * len(lc.table_in_features())
    assert all(e["fit_error"] == 0 for e in TABLE.values())
    assert {k[1] for k in TABLE} == set(lc.table_in_features())


@pytest.mark.parametrize("k,bits,n,rows", [
    (128, 4, 96, 1), (128, 8, 200, 20), (2048, 4, 1000, 40), (2048, 8, 32, 5),
    (576, 8, 64 * 3, 16), (1024, 4, 17.5, 3)])
def test_cycles_equal_the_cycle_model(k, bits, n, rows):
    """On the paper PE (an OUT-chunk step is the whole 64-channel chunk) the calibration's
    cycles are the cycle model's on the program itself, at any output channels (padded to
    whole chunks; a fractional share rounded up) and rows (more token tiles)."""
    import math
    c = lc.linear_calibration(PAPER, k, bits)
    assert c.cycles(n, rows) == lc.linear_cycles(PAPER, k, math.ceil(n), bits, rows)


def test_fractional_rows_lie_linearly_between_their_neighbours():
    """``cycles`` at fractional rows is linear between the integer neighbours, as its
    docstring says (a test audit's mutation rounded 16.5 rows up to 17's cycles unseen: no
    test gave a fraction); fewer than 1 row count as 1."""
    c = lc.linear_calibration(PAPER, 2048, 8)
    lo, hi = c.cycles(256, 16), c.cycles(256, 17)
    assert lo < hi                          # a 17th row is a second token tile
    assert c.cycles(256, 16.5) == pytest.approx((lo + hi) / 2)
    assert c.cycles(256, 16.25) == pytest.approx(lo + (hi - lo) / 4)
    assert c.cycles(256, 0.5) == c.cycles(256, 1)


@pytest.mark.parametrize("arch,k,bits", [("mid", 96, 4), ("mid", 1056, 8), ("small", 64, 8)])
def test_partial_chunks_equal_the_cycle_model_on_other_pes(arch, k, bits):
    """Where an OUT chunk holds several OUTPUT steps (mid: 3, small: 44; the paper PE's holds
    one) a narrower last chunk packs its column blocks into other buffer-fulls: the
    calibration times each partial chunk size alone and after a whole chunk, and equals the
    cycle model on the program at any channels and rows (review finding 1: up to 22% off when
    it scaled a whole chunk)."""
    import math
    cfg = preset(arch)
    c = lc.calibrate_linear(cfg, k, bits)
    assert c.out_chunk > c.step and len(c.partial) == c.out_chunk // c.step - 1
    assert c.fit_error == 0
    for n, rows in ((33, 40), (16, 3), (705, 33), (1, 1), (c.out_chunk * 2 + c.step, 5)):
        want = lc.linear_cycles(cfg, k, math.ceil(n / c.step) * c.step, bits, rows)
        assert c.cycles(n, rows) == want, (n, rows)


def test_bad_channels_and_rows_name_the_parameter():
    c = lc.linear_calibration(PAPER, 2048, 8)
    for name, args in (("out_features", (0, 16)), ("out_features", (float("nan"), 16)),
                       ("rows", (256, -5)), ("rows", (256, float("inf"))),
                       ("out_features", ("many", 16))):
        with pytest.raises(ValueError, match=f"^{name}: expected a"):
            c.utilisation(*args)
    with pytest.raises(ValueError, match="in_features: expected a positive integer, got -5"):
        pe.linear_utilisation(pe.platform("ours", "4gb"), -5, 256, 16, 8)


def test_a_k_the_pe_cannot_stage_is_a_user_error():
    """A PE whose OUT holds no chunk: one line naming K and the PE, not the probe's N."""
    cfg = dataclasses.replace(PAPER, iomem_split=(14, 1, 16, 1))
    with pytest.raises(UserError, match=r"a linear layer of K = 2048 does not fit one PE of "
                                        r"this configuration \(tile 16x32x32.*OUT overflows"):
        lc.linear_calibration(cfg, 2048, 8)


def test_utilisation_grows_with_rows_and_k():
    c8 = lc.linear_calibration(PAPER, 2048, 8)
    u = [c8.utilisation(256, r) for r in (1, 4, 16)]
    print("K=2048 W8A8 at 256 channels a PE:", [f"{v:.1%}" for v in u])
    assert u[0] < u[1] < u[2] < 1
    assert lc.linear_calibration(PAPER, 128, 8).utilisation(256, 16) < u[2]
    # W4A8's peak is twice W8A8's: the same cycles are half the fraction, and DRAFT's beats
    # are half FULL's
    assert lc.linear_calibration(PAPER, 2048, 4).utilisation(256, 16) < u[2]


def test_another_pe_is_computed_on_first_use(monkeypatch, tmp_path, caplog):
    """A PE the table does not hold (a design-space point: twice the ACT words, so a streamed
    x chunk fills 14 groups of a WMEM buffer's 16, not 7) is calibrated on first use, saying
    so (a first run is not hung), and kept; its figures differ from the paper PE's."""
    from elmoe3d.sw.host import compute_calib as cc
    monkeypatch.setattr(cc, "calib_root", lambda: tmp_path)
    monkeypatch.setattr(lc, "_CACHE", {})
    cfg = dataclasses.replace(PAPER, iomem_split=(14, 1, 9, 8))
    assert lc.table_key(cfg, 2048, 8) not in TABLE
    with caplog.at_level("WARNING", logger="elmoe3d.calib"):
        a = lc.linear_calibration(cfg, 2048, 8)
    assert caplog.messages == [f"elmoe3d: computing the compute calibration of a linear layer "
                               f"of K = 2048 at W8A8 on the PE cycle model (seconds, once: "
                               f"kept in {tmp_path})"]
    assert lc.linear_calibration(cfg, 2048, 8) is a
    assert len(list(tmp_path.glob("linear-*.json"))) == 1
    assert a.cycles(256, 16) < lc.linear_calibration(PAPER, 2048, 8).cycles(256, 16)


@pytest.mark.parametrize("k, takes", [(2048, "seconds"), (lc.SECONDS_K, "seconds"),
                                      (lc.SECONDS_K + 32, "a minute or more: it grows with K")])
def test_the_notice_says_how_long_by_k(monkeypatch, k, takes):
    """A new user's K = 200,000 took 152 s under a notice that said "seconds" (2026-12-06):
    above :data:`SECONDS_K` the notice says a minute or more."""
    said = []
    monkeypatch.setattr(lc, "_CACHE", {})
    monkeypatch.setattr(lc, "memo_calibration",
                        lambda *a, plan=None: said.append(a[-2:]) or "made")
    cfg = dataclasses.replace(PAPER, iomem_split=(14, 1, 9, 8))
    assert lc.linear_calibration(cfg, k, 4) == "made"
    assert said == [(f"a linear layer of K = {k} at W4A8", takes)]


def test_bad_bits():
    with pytest.raises(ValueError, match="bits: expected 4 or 8, got 16"):
        lc.linear_calibration(PAPER, 2048, 16)
    with pytest.raises(ValueError, match=r"bits: expected 4 \(DRAFT\) or 8 \(FULL\), got 2"):
        lc.linear_cycles(PAPER, 2048, 64, 2, 1)


@pytest.mark.parametrize("name", sorted(DECODER_SHAPES))
def test_decoder_linear_layers_sum_to_its_weights_and_macs(name):
    sh = DECODER_SHAPES[name]
    assert sum(k * n for _, k, n in sh.attention_linears) == sh.attention_weights
    for ctx in (1, 576, 1024):
        assert sum(r * k * n * c for _, k, n, r, c in sh.attention_gemms(ctx)) == \
            sh.attention_macs(ctx)


def test_draft_linear_layers_sum_to_its_weights():
    for d in [pe.eagle_head(s) for s in DECODER_SHAPES.values()] + list(pe.DRAFT_MODELS.values()):
        assert sum(k * n * c for _, k, n, c in d.linears) == d.weights, d.name
        assert sum(r * k * n * c for _, k, n, r, c in d.attention_gemms(1024)) == \
            d.layers * 2 * d.q_heads * d.head_dim * 1024
    with pytest.raises(ValueError, match="extra: expected a multiple of hidden"):
        dataclasses.replace(pe.QWEN25_1P5B, extra=7)


def test_paper_reads_every_plain_gemm_from_the_table():
    """Table 3, Fig. 14 and Fig. 15 at both capacities ask for no linear calibration the table
    lacks (the CLI stays well under a second)."""
    lc._CACHE.clear()
    pe.table3("4gb")
    pe.table3("8gb")
    pe.fig14("8gb")
    asked = {k for k in lc._CACHE}
    assert asked and asked <= set(TABLE)


def test_stage_compute_uses_the_linear_figure():
    """The attention stage's utilisation is its parts' (the projections, the router and the
    attention GEMMs at their own shapes), not the routed expert's."""
    em = pe.EvalModel("qwen3-30b-a3b", pe.platform("ours", "4gb"), "elastic", batch=16)
    sh = em.shape
    parts = em._linears(16, tuple((n, k, o, 1) for n, k, o in sh.attention_linears))
    assert [w for _, w, _ in parts] == [("linear", 2048, 4096 / 16), ("linear", 2048, 512 / 16),
                                        ("linear", 2048, 512 / 16), ("linear", 4096, 2048 / 16)]
    assert em._util(8, parts) > em._util(8, ((1.0, em.m.expert_intermediate, 16),))
    # a sequence's attention: 16 sequences x 4 KV heads = 64 GEMMs over 16 PEs, each whole, of
    # the 8 query heads a KV head serves
    att = em._attention(16, sh.attention_gemms(1024))
    assert [(w, r) for _, w, r in att] == [(("kv", 128, 1024), 8.0), (("kv", 1024, 128), 8.0)]
    # the KV cache is not bit-sliced: in a 4-bit (draft) step its GEMMs run W8A8, half the
    # fraction of the W4A8 peak that the same cycles would be at W4A8
    kv, lin = ((1.0, (kind, 128, 1024), 16.0) for kind in ("kv", "linear"))
    assert em._util(4, (kv,)) == pytest.approx(
        pe.linear_utilisation(em.plat, 128, 1024, 16, 8) / 2)
    assert em._util(4, (lin,)) == pe.linear_utilisation(em.plat, 128, 1024, 16, 4)
    assert em._util(8, (kv,)) == em._util(8, (lin,))


def test_linear_utilisation_needs_an_arch():
    plat = dataclasses.replace(pe.platform("xpu", "4gb"), arch=None)
    with pytest.raises(UserError, match="has no ArchConfig"):
        pe.linear_utilisation(plat, 2048, 256, 16, 8)

"""The compute calibration of the whole-decoder model (sw/host/compute_calib.py; issue 26 item
6): the shipped table of the paper PE equals the PE cycle model (group_cycles: the group's PEs
joined by the aggregation link) on the compiler's programs for real expert shapes, a shape outside the table is computed with the
cycle model (never a constant), and the model reads it."""

import itertools

import pytest

from elmoe3d.config import preset
from elmoe3d.sw.host import compute_calib as cc
from elmoe3d.sw.host import paper_eval as pe
from elmoe3d.sw.host.compute_calib_table import TABLE

PAPER = preset("paper-4gb")


@pytest.mark.parametrize("hidden, inter, bits, rows, feed", [
    (2048, 768, 4, (1, 16, 17), "die"),     # Qwen3-30B-A3B's expert, DRAFT: a second tile
    (2048, 768, 8, (5,), "die"),            # FULL
    (2048, 768, 4, (16,), "ideal"),         # link words a word a cycle
    (2048, 1024, 4, (16,), "die"),          # OLMoE-1B-7B's expert
    (2048, 1024, 8, (1,), "ideal"),
])
def test_shipped_calibration_equals_group_cycles(hidden, inter, bits, rows, feed):
    """The table's cycles are the slowest PE's (the root's) group_cycles of the 4-PE group's
    programs (compile_expert_group, ld at a word a cycle, fill and drain included; link words
    at the aggregation link's 1/16 word a cycle on the die feed, a word a cycle on the ideal
    one),
    whatever the row count, and its MACs a cycle are the useful MACs over them."""
    assert cc.table_key(PAPER, hidden, inter, bits, feed) in TABLE
    cal = cc.ffn_calibration(PAPER, hidden, inter, bits, feed)
    assert cal.chunks == 1 and cal.pes == 4 and cal.peak == PAPER.tile.peak_macs_per_cycle(bits)
    assert cal.link_rate == (1 / 16 if feed == "die" else None)
    for r in rows:
        got = cc.program_root_cycles(PAPER, hidden, inter, bits, r, link_rate=cal.link_rate)
        assert cal.cycles(r) == got
        assert cal.macs_per_cycle(r) == pytest.approx(3 * hidden * inter * r / (4 * got))
        # the fraction of the PE's peak MACs a cycle: at W4A8 16,384, at W8A8 8,192 (Table 1's
        # 16x32x32 PE), not the calibration's own peak figure
        assert cal.utilisation(r) == pytest.approx(
            3 * hidden * inter * r / (4 * got) / {4: 16384, 8: 8192}[bits])


def test_table_covers_every_paper_model_shape_exactly():
    """Every FFN shape Table 3's models ask for is in the table at both widths, the 8 GB die
    shares the 4 GB die's PE, and the tile form reproduced group_cycles at the checked row
    counts (fit error 0 cycles)."""
    assert cc.table_key(preset("paper-8gb"), 2048, 768, 4) == cc.table_key(PAPER, 2048, 768, 4)
    assert len(TABLE) == 2 * 2 * len(cc.table_shapes())
    for h, i in cc.table_shapes():
        for bits, feed in itertools.product((4, 8), cc.FEEDS):
            e = TABLE[cc.table_key(PAPER, h, i, bits, feed)]
            assert e["fit_error"] == 0
            assert len(e["tile"]) == PAPER.tile.rows
            assert (e["chunks"], e["chunk_intermediate"]) == cc.ffn_chunks(h, i, PAPER)


def test_not_a_constant():
    """The utilisation follows the rows (one token tile's weights serve 1 row or 16), the
    width and the shape; fractional rows lie between their integer neighbours. (Rows 1-15 of
    a tile take the same cycles: padding rows skip the COMBINE sink.)"""
    a = cc.ffn_calibration(PAPER, 2048, 768, 4)
    b = cc.ffn_calibration(PAPER, 2048, 1408, 4)
    f = cc.ffn_calibration(PAPER, 2048, 768, 8)
    assert a.utilisation(1) < a.utilisation(8) < a.utilisation(16)
    assert a.utilisation(17) < a.utilisation(16)
    assert len({a.utilisation(16), b.utilisation(16), f.utilisation(16)}) == 3
    assert a.cycles(15) < a.cycles(15.5) < a.cycles(16)
    assert a.cycles(16) < a.cycles(16.5) < a.cycles(17)
    assert a.cycles(16.5) == pytest.approx((a.cycles(16) + a.cycles(17)) / 2)


def test_a_shape_outside_the_table_is_computed_with_the_cycle_model(monkeypatch, tmp_path,
                                                                    caplog):
    """A (PE, shape, bits) the table lacks is computed on first use from group_cycles
    (here the small preset's 2x4x32 PE: rows 1, 2 and 4), kept, and equal to it; kept on disk
    too, so that another process (a new in-process cache here) reads it instead of computing,
    and a damaged file is computed again."""
    monkeypatch.setattr(cc, "calib_root", lambda: tmp_path)
    small = preset("small")
    key = cc.table_key(small, 64, 128, 4)
    assert key not in TABLE
    calls = []
    real = cc.program_root_cycles

    def counting(*a, **kw):
        calls.append(a[1:])
        return real(*a, **kw)

    monkeypatch.setattr(cc, "program_root_cycles", counting)
    monkeypatch.setattr(cc, "_CACHE", {})
    with caplog.at_level("WARNING", logger="elmoe3d.calib"):
        cal = cc.ffn_calibration(small, 64, 128, 4)
    assert caplog.messages == [f"elmoe3d: computing the compute calibration of a 64 x 128 FFN "
                               f"at W4A8 on the PE cycle model (about a minute or more, once: "
                               f"kept in {tmp_path})"]                 # a first run is not hung
    assert sorted(c[-1] for c in calls) == [1, 2, 4]
    assert cal.link_rate == small.link_words_per_cycle == 0.5
    for r in (1, 2, 3, 5):
        assert cal.cycles(r) == real(small, 64, 128, 4, r, link_rate=0.5)
    n = len(calls)
    assert cc.ffn_calibration(small, 64, 128, 4) is cal and len(calls) == n
    (kept,) = tmp_path.glob("ffn-*.json")
    monkeypatch.setattr(cc, "_CACHE", {})                    # another process
    again = cc.ffn_calibration(small, 64, 128, 4)
    assert again == cal and again is not cal and len(calls) == n
    for damage in (b'{"key": ', b"\xff\xfe", b"[]", b'{"tile": 3}'):    # made again
        kept.write_bytes(damage)
        monkeypatch.setattr(cc, "_CACHE", {})
        assert cc.ffn_calibration(small, 64, 128, 4) == cal
        monkeypatch.setattr(cc, "_CACHE", {})
        assert cc.ffn_calibration(small, 64, 128, 4) == cal      # and read back
    assert len(calls) == 5 * n


def test_each_thread_keeps_its_own_calibration_folder(tmp_path):
    """calib_root_at is per thread (a Dask worker's threads each run a point): two threads
    that enter and leave in crossed order each see their own folder, a third the default."""
    import threading
    seen, steps = {}, [threading.Event() for _ in range(3)]

    def a():
        with cc.calib_root_at(tmp_path / "A"):
            steps[0].set()
            steps[1].wait()
            seen["A"] = cc.calib_root()
        steps[2].set()

    def b():
        steps[0].wait()
        with cc.calib_root_at(tmp_path / "B"):
            steps[1].set()
            steps[2].wait()
            seen["B"] = cc.calib_root()
        seen["B after"] = cc.calib_root()
    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outside = cc.calib_root()
    assert (seen["A"], seen["B"]) == (tmp_path / "A", tmp_path / "B")
    assert seen["B after"] not in (tmp_path / "A", tmp_path / "B")
    assert outside not in (tmp_path / "A", tmp_path / "B")


def test_the_model_has_no_constant_utilisation():
    """The placeholder is gone: the model's compute follows the calibration (a halved tile
    period and tile cycles double a compute-bound stage's speed)."""
    assert not hasattr(pe, "COMPUTE_UTILISATION")
    em = pe.EvalModel("qwen3-30b-a3b", pe.platform("ours"))
    c1 = pe.StepCost()
    em._stage(c1, "x", 0, 0, 1e12, 8, parts=((1e12, 768, 40),))
    cal = cc.ffn_calibration(em.plat.arch, 2048, 768, 8)
    fast = cc.FFNCalibration(**{**cal.__dict__, "tile": tuple(t / 2 for t in cal.tile),
                                "period": cal.period / 2})
    key = cc.table_key(em.plat.arch, 2048, 768, 8)
    old = cc._CACHE[key]
    cc._CACHE[key] = fast
    try:
        c2 = pe.StepCost()
        em = pe.EvalModel("qwen3-30b-a3b", pe.platform("ours"))
        em._stage(c2, "x", 0, 0, 1e12, 8, parts=((1e12, 768, 40),))
    finally:
        cc._CACHE[key] = old
    assert c2.seconds == pytest.approx(c1.seconds / 2)


def test_the_die_feed_waits_on_the_aggregation_link():
    """On the paper PE a 512 B word crosses the 32 B-a-cycle aggregation link in 16 cycles:
    the die feed's group program (row-max all-reduce, psum REDUCE_ADD) is slower than the
    ideal feed's at every row count of a tile, by more than the ideal feed's own cycles on
    Qwen3-30B-A3B's expert (the link, not the tile, is the bound there), and the model uses
    the die feed."""
    die = cc.ffn_calibration(PAPER, 2048, 768, 4, "die")
    ideal = cc.ffn_calibration(PAPER, 2048, 768, 4, "ideal")
    for r in range(1, PAPER.tile.rows + 1):
        assert die.cycles(r) > 2 * ideal.cycles(r)
    assert die.period > 2 * ideal.period
    em = pe.EvalModel("qwen3-30b-a3b", pe.platform("ours"))
    assert em._calibration(768, 4) is die
    with pytest.raises(ValueError, match="feed"):
        cc.ffn_calibration(PAPER, 2048, 768, 4, "fast")

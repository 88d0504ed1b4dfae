"""cocotb + Verilator benches of the TensorTile, run through the one runner.

Two tile shapes (the small 2x4 configuration and 1x2); the build of each shape is shared by
every test here (and across pytest-xdist workers: the runner keys build folders by the Verilog
and builds under a lock). Every accumulator value is compared with plain equality against
``ref_tile`` and ``gemm`` inside the bench; these tests also check that the comparisons really
happened, as many as each case's shape gives (:func:`values_compared`).
"""

import pytest

from elmoe3d.config import TileConfig
from elmoe3d.sim.bench_tile import run_tile_bench
from elmoe3d.sw.golden.datapath import Mode
from elmoe3d.sw.golden.quant import GROUP
from elmoe3d.sw.golden.tile import channels_per_block

pytestmark = pytest.mark.cocotb

SHAPES = {
    "2x4": (TileConfig(rows=2, lanes=4),
            {"minilm": {"tokens": 8, "up_channels": 16, "down_tokens": 4, "down_channels": 8}}),
    "1x2": (TileConfig(rows=1, lanes=2),
            {"minilm": {"tokens": 4, "up_channels": 8, "down_tokens": 2, "down_channels": 4},
             "random_beats": 120}),
}


def values_compared(rec, config):
    """The accumulator values a case of the tile bench (``sim/bench_tile.py``) compares when
    every result came: a GEMM ``[M, K] x [N, K]^T`` (``shape`` [M, K, N]) gives one result of
    ``rows x lanes`` values per row block and output-channel block (``channels_per_block`` of
    its mode: ``lanes // 2`` in FULL), each after ``K / 32`` beats, all against ``ref_tile``,
    and its ``M x N`` values against ``gemm``; the split check (MSB_ONLY + LSB_ONLY against
    FULL) the ``M x N`` only; a raw beat sequence (no shape) one result per ``last`` beat."""
    per_result = config.rows * config.lanes
    if rec["shape"] is None:
        assert 0 < rec["results"] <= rec["beats"], rec
        return rec["results"] * per_result
    m, k, n = rec["shape"]
    if rec["mode"] == "MSB+LSB":
        return m * n
    results = -(-m // config.rows) * -(-n // channels_per_block(Mode[rec["mode"]],
                                                                   config.lanes))
    assert (rec["results"], rec["beats"]) == (results, results * k // GROUP), rec
    return results * per_result + m * n


def _check(result, config, *, tests, sources):
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0
    ran = {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"}
    assert ran == set(tests), sim.testcases
    assert result.records, "the bench wrote no case records"
    assert {r["source"] for r in result.records} == set(sources)
    assert result.comparisons > 0
    assert result.mismatches == 0
    for rec in result.records:
        assert rec["mismatches"] == 0, rec
        assert rec["comparisons"] == values_compared(rec, config) > 0, rec
    return result


@pytest.mark.minilm
@pytest.mark.parametrize("shape", SHAPES)
def test_minilm_weights_and_activations(shape, minilm_file):
    config, params = SHAPES[shape]
    result = _check(run_tile_bench(config, tests="test_minilm", params=params), config,
                    tests=["test_minilm"], sources=["minilm"])
    modes = {(r["case"], r["mode"], r["traffic"]) for r in result.records}
    for traffic in ("smooth", "stalls"):
        for mode in ("FULL", "DRAFT", "MSB_ONLY", "LSB_ONLY"):
            assert ("minilm L0 up", mode, traffic) in modes
        assert ("minilm L0 up split", "MSB+LSB", traffic) in modes
        for mode in ("FULL", "DRAFT"):
            assert ("minilm L0 down", mode, traffic) in modes


@pytest.mark.parametrize("shape", SHAPES)
def test_random_and_corners(shape):
    config, params = SHAPES[shape]
    result = _check(run_tile_bench(config, tests=("test_random", "test_corners"),
                                   params=params), config,
                    tests=["test_random", "test_corners"], sources=["random", "corner"])
    assert {r["traffic"] for r in result.records} == {"smooth", "stalls"}
    saturating = [r for r in result.records if r["case"] == "corner int64 saturation"]
    assert saturating and all(r["overflowed"] for r in saturating)


@pytest.mark.parametrize("shape", SHAPES)
def test_throughput_one_beat_per_cycle(shape):
    config, params = SHAPES[shape]
    result = _check(run_tile_bench(config, tests="test_throughput",
                                   params={**params, "throughput_beats": 1024}), config,
                    tests=["test_throughput"], sources=["random"])
    (rec,) = result.records
    assert rec["beats"] >= 1024
    # Cycle counts, not wall time: with an always-ready sink the tile takes a beat every
    # cycle and each result comes tile.latency cycles after its last beat (both checked in
    # the bench); the figure follows.
    assert rec["fraction"] >= 0.99


def test_a_mismatch_names_its_time_on_o_and_what_each_value_is():
    """A new user debugging a planted tile bug (2026-12-07): a mismatch named no simulation
    time, so finding it in a waveform meant counting handshakes; the split check called the
    RTL's FULL result "expected"; and the GEMM check's ``[m, n]`` did not say which index is
    the token. Each detail now says so (no simulator needed: the comparisons are NumPy)."""
    import numpy as np
    from elmoe3d.sim.bench_tile import TileBench
    from elmoe3d.sim.cocotb_streams import CLOCK_NS
    from elmoe3d.sw.golden.datapath import Accumulator
    from elmoe3d.sim.cocotb_streams import handshake_at
    assert handshake_at(0) == "valid and ready from 5 ns, taken at the 15 ns edge"
    zeros = np.zeros((2, 1, 2), np.int64)
    rtl = {"acc": zeros.copy(), "overflow": zeros.astype(bool), "mode": np.zeros(2, np.int64)}
    ref = {"acc": zeros.copy(), "overflow": zeros.astype(bool), "mode": np.zeros(2, np.int64)}
    ref["acc"][1, 0, 1] = 5
    details = []
    assert TileBench.compare_results(rtl, ref, details, [30, 35]) == (4, 1)
    # the monitor logs a handshake at cycle 35 when it reads valid and ready after the rising
    # edge at 355 ns (the clock starts low: edges at 5, 15, ... ns); the beat is taken at the
    # next edge, 365 ns (a review: "at 350 ns" named a time before valid rose)
    assert CLOCK_NS == 10
    assert details == ["result 1 (on o: valid and ready from 355 ns, taken at the 365 ns edge) "
                       "row 0 lane 1: RTL acc 0 ovf False, ref_tile acc 5 ovf False"]
    got = Accumulator(np.array([[1, 2]], np.int64), np.zeros((1, 2), bool))
    want = Accumulator(np.array([[1, 7]], np.int64), np.array([[False, True]]))
    details = []
    assert TileBench.compare_acc(got, want, ("MSB_ONLY + LSB_ONLY", "RTL FULL"), details) == \
        (2, 2)
    assert details == ["MSB_ONLY + LSB_ONLY vs RTL FULL [token 0, channel 1]: MSB_ONLY + "
                       "LSB_ONLY acc 2 ovf False, RTL FULL acc 7 ovf True"]

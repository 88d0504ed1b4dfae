"""cocotb + Verilator benches of the DRAM controllers (``sim/bench_dram.py``) through the one
runner: the HB controller and a two-channel external (LPDDR5) controller against the
timing-checking device models. Every read beat is compared bit for bit with the golden memory
inside the bench; any timing violation fails the bench. These tests check the benches ran what
they should and report zero violations."""

import pytest

from elmoe3d.config import preset
from elmoe3d.sim.bench_dram import run_dram_bench

pytestmark = pytest.mark.cocotb

ARCH = preset("small")
PARAMS = {"stream_bursts": 2000, "random_requests": 120, "row_requests": 60,
          "long_refresh_trefi": 10}


def _records(result, tests):
    sim = result.sim
    assert sim.failures == 0 and sim.skipped == 0, sim.testcases
    ran = {c.name.split("/")[0] for c in sim.testcases if c.status == "passed"}
    assert ran == set(tests)
    by_case = {}
    for rec in result.records:
        assert rec["violations"] == [] and rec["mismatches"] == 0 and rec["errors"] == [], rec
        by_case.setdefault(rec["case"].split("-")[0], []).append(rec)
    return by_case


def test_hb_controller_bench():
    tests = ["test_random_rw", "test_stream", "test_random_rows", "test_long_refresh",
             "test_replay_violation"]
    result = run_dram_bench(ARCH, target="hb", tests=tests, params=PARAMS)
    recs = _records(result, tests)
    rw = {r["traffic"]: r for r in recs["random"] if r["case"].startswith("random-rw")}
    assert set(rw) == {"smooth", "stalls"}
    for r in rw.values():
        assert r["comparisons"] > 200 and r["stats"]["wr"] > 100 and r["stats"]["rd"] > 200
    stream = recs["stream"][0]
    assert stream["comparisons"] == PARAMS["stream_bursts"]
    assert stream["stats"]["rd"] == PARAMS["stream_bursts"] and stream["stats"]["refpb"] > 0
    rows = [r for r in recs["random"] if r["case"].startswith("random-rows")][0]
    assert rows["stats"]["row_conflicts"] > 0 and rows["comparisons"] == 60 * 16
    long = [r for r in recs["long"] if r["case"] == "long-refresh"][0]
    assert long["cycles"] >= 10 * long["trefi_cycles"]
    assert long["refreshes"] >= 0.9 * long["refreshes_nominal"] - 8
    replay = recs["replay"]
    caught = [r for r in replay if r["case"] == "replay"][0]
    assert caught["clean_commands"] > 50 and caught["caught"]["constraint"] == "tRCD"


def test_ext_controller_bench_two_channels():
    tests = ["test_random_rw", "test_stream", "test_long_refresh"]
    result = run_dram_bench(ARCH, target="ext", channels=2, tests=tests,
                            params={**PARAMS, "long_refresh_trefi": 10})
    recs = _records(result, tests)
    rw = [r for r in recs["random"]]
    assert {r["traffic"] for r in rw} == {"smooth", "stalls"}
    assert all(r["channels"] == 2 and r["comparisons"] > 200 for r in rw)
    stream = recs["stream"][0]
    assert stream["stats"]["rd"] == 2 * PARAMS["stream_bursts"]
    long = [r for r in recs["long"] if r["case"] == "long-refresh"][0]
    assert long["cycles"] >= 10 * long["trefi_cycles"] and long["refreshes"] > 0

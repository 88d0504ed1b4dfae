"""The DRAM timing checker and device model (sw/golden/dram.py) on crafted command sequences,
and the DRAM section of the configuration: every rule fires at its scope with its name, and
legal sequences at the exact minimum spacing pass."""

import dataclasses
import json

import pytest

from elmoe3d.config import HB_BANK, LPDDR5_6400_X16, ArchConfig, ConfigError, preset
from elmoe3d.sw.golden.dram import (DramDevice, RowCmd, TimingChecker, TimingViolation,
                                    dram_pattern)

HB = preset("small").hb             # 4 bank groups x 4 banks, tCK 2.5 ns
LP = preset("small").ext            # LPDDR5 channel, tCK 1.25 ns


def violation(fn, constraint):
    with pytest.raises(TimingViolation) as info:
        fn()
    assert info.value.constraint == constraint, str(info.value)
    assert constraint in str(info.value) and "DRAM cycle" in str(info.value)
    return info.value


# -- configuration ---------------------------------------------------------------------------

def test_cycles_are_ceil_of_ns_with_the_standards_minimum():
    assert [HB.ck(n) for n in ("tCCD_S", "tCCD_L", "tRCD", "tRRD_S", "tRRD_L", "tFAW")] == \
        [1, 2, 6, 2, 3, 12]                     # 2.5/2.5, 5/2.5, 14/2.5 -> 6, 4/2.5 -> 2 ...
    assert LP.ck("tRCD") == 15 and LP.ck("tRTP") == 6      # 18/1.25 = 14.4 -> 15; 7.5/1.25
    assert LP.ck("tPPD") == 2                               # 0 ns, JEDEC minimum 2 nCK
    lp = dataclasses.replace(LP, tRRD_S=1.0)
    assert lp.ck("tRRD_S") == 2                             # 1 ns -> 1 clock, minimum 2 nCK
    assert HB.logic_cycles("tRCD", 1.0) == 15               # 6 clocks x 2.5 ns
    with pytest.raises(ConfigError, match="timing: unknown parameter 'tXYZ'"):
        HB.ck("tXYZ")


def test_table_1_bandwidths_and_capacities():
    for name in ("paper-4gb", "paper-8gb"):
        arch = preset(name)
        assert arch.hb.peak_gbps == pytest.approx(ArchConfig.hb_bank_gbps)      # Table 1
        assert arch.hb.capacity_bytes == 256 << 20 and arch.hb.burst_bytes == 128
        assert arch.ext.peak_gbps * arch.ext_channels == pytest.approx(102.4)
        assert arch.ext.capacity_bytes * arch.ext_channels == 64 << 30
    assert "DRAMsim3" in HB_BANK.source and "Ramulator2" in LPDDR5_6400_X16.source


#: Paper Table 1 ("ELMoE-3D system specification"), typed here as the paper states it: per
#: paper preset (PEs = HB banks, HB capacity in GB, HB bandwidth in GB/s) ...
TABLE_1 = {"paper-4gb": (16, 4, 819.2), "paper-8gb": (32, 8, 1638.4)}
#: ... and the figures both share (51.2 GB/s per HB bank: 819.2 / 16, and the text by it).
TABLE_1_SHARED = {"clock_ghz": 1.0, "aggregation_gbps": 32.0, "streamline_gbps": 128.0,
                  "hb_bank_gbps": 51.2, "hb_pj_per_bit": 0.43, "ext_gbps": 102.4,
                  "ext_pj_per_bit": 3.88}


@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_paper_presets_hold_table_1(name):
    """The paper presets hold Table 1's literal figures (the class defaults are not the
    reference: a changed default must fail here)."""
    banks, gb, gbps = TABLE_1[name]
    arch = preset(name)
    assert {key: getattr(arch, key) for key in TABLE_1_SHARED} == TABLE_1_SHARED
    assert arch.pes == banks
    assert arch.hb_bytes == arch.pes * arch.hb_bank_bytes == gb << 30
    assert arch.pes * arch.hb.peak_gbps == pytest.approx(gbps)
    assert arch.hb.peak_gbps == pytest.approx(51.2)
    # LPDDR5-6400, 64 GB in 8 GB x16 channels, 102.4 GB/s
    assert (arch.ext_bytes, arch.ext_channels) == (64 << 30, 8)
    assert arch.ext.capacity_bytes == 8 << 30
    assert arch.ext.peak_gbps * arch.ext_channels == pytest.approx(102.4)


def test_address_mapping_interleaves_bank_groups_then_columns_then_banks():
    assert [HB.decode(a) for a in range(5)] == [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0),
                                                (0, 0, 1)]
    per_set = HB.bank_groups * HB.columns
    assert HB.decode(per_set) == (4, 0, 0)                  # next bank of each group
    assert HB.decode(per_set * HB.banks_per_group) == (0, 1, 0)
    for a in (0, 1, 77, HB.bursts - 1):
        assert HB.encode(*HB.decode(a)) == a
    assert HB.decode(HB.bursts + 3) == HB.decode(3)


def test_dram_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="unknown configuration key\\(s\\) in hb: tRCDX"):
        ArchConfig.from_dict({"hb": {"tRCDX": 1}})
    with pytest.raises(ConfigError, match="tRCD: expected a non-negative number"):
        ArchConfig.from_dict({"hb": {"tRCD": -1}})
    with pytest.raises(ConfigError, match="hb_bank_gbps: 40"):
        ArchConfig.from_dict({"hb_bank_gbps": 40})
    with pytest.raises(ConfigError, match="hb.rows: 8 rows"):
        ArchConfig.from_dict({"hb": {"rows": 8}})
    with pytest.raises(ConfigError, match="ext_channels: expected an integer >= 1"):
        ArchConfig.from_dict({"ext_channels": 0})
    with pytest.raises(ConfigError, match="min_ck: unknown timing 'tFOO'"):
        dataclasses.replace(LPDDR5_6400_X16, min_ck={"tFOO": 2})
    with pytest.raises(ConfigError, match="tCCD_S: 1 clocks is shorter than a burst"):
        dataclasses.replace(LPDDR5_6400_X16, tCCD_S=1.0)


def test_dram_fields_override_and_round_trip_through_json():
    arch = ArchConfig.from_dict({"hb": {"tRCD": 15.0, "per_bank_refresh": False}})
    assert arch.hb.tRCD == 15.0 and not arch.hb.per_bank_refresh and arch.hb.rows == 32
    for name in ("small", "paper-4gb"):
        arch = preset(name)
        assert ArchConfig.from_dict(json.loads(json.dumps(arch.to_dict()))) == arch


# -- the checker -----------------------------------------------------------------------------

def test_trrd_short_and_long_at_channel_scope():
    c = TimingChecker(HB)
    c.issue(0, "ACT", 0, row=0)
    violation(lambda: c.issue(1, "ACT", 1, row=0), "tRRD_S")    # other group, 1 < 2
    violation(lambda: c.issue(2, "ACT", 4, row=0), "tRRD_L")    # bank 4 is group 0: 2 < 3
    c.issue(2, "ACT", 1, row=0)                                 # other group at exactly tRRD_S
    c.issue(4, "ACT", 4, row=0)                                 # tRRD_L after bank 0's ACT


def test_tfaw_over_four_acts_in_the_channel():
    c = TimingChecker(HB)
    for i, b in enumerate((0, 1, 2, 3)):
        c.issue(2 * i, "ACT", b, row=0)                         # 0, 2, 4, 6: tRRD_S only
    violation(lambda: c.issue(11, "ACT", 5, row=0), "tFAW")     # 11 - 0 < 12
    c.issue(12, "ACT", 5, row=0)                                # exactly tFAW after the first
    c.issue(14, "ACT", 6, row=0)                                # exactly tFAW after cycle 2
    # the window is the channel's, whatever the banks and groups
    d = TimingChecker(HB)
    for i, b in enumerate((0, 5, 10, 15)):
        d.issue(3 * i, "ACT", b, row=i)
    violation(lambda: d.issue(11, "ACT", 4, row=0), "tFAW")


def test_tccd_short_vs_long_by_bank_group():
    c = TimingChecker(HB)
    for i, b in enumerate((0, 1, 4, 2)):
        c.issue(3 * i, "ACT", b, row=0)
    c.issue(20, "RD", 0, col=0)
    c.issue(21, "RD", 1, col=0)                                 # group 1: tCCD_S = 1
    violation(lambda: c.issue(21, "RD", 2, col=0), "tCCD_S")   # group 2, 0 clocks after
    c2 = TimingChecker(HB)
    for i, b in enumerate((0, 4)):
        c2.issue(3 * i, "ACT", b, row=0)
    c2.issue(20, "RD", 0, col=0)
    violation(lambda: c2.issue(21, "RD", 4, col=0), "tCCD_L")   # same group 0: 1 < 2
    c2.issue(22, "RD", 4, col=0)
    lp = TimingChecker(LP)
    lp.issue(0, "ACT", 0, row=0)
    lp.issue(4, "ACT", 1, row=0)
    lp.issue(19, "RD", 0, col=0)
    violation(lambda: lp.issue(20, "RD", 1, col=0), "tCCD_S")   # LPDDR5: burst of 2 clocks
    lp.issue(21, "RD", 1, col=0)


def test_tppd_between_precharges_of_the_channel():
    """LPDDR5's tPPD (2 clocks between any two PREs of the channel; 0 on the HB, which has no
    such rule): no test fired it before (a test audit: only a controller bench exercised
    it)."""
    assert (LP.ck("tPPD"), HB.ck("tPPD")) == (2, 0)
    lp = TimingChecker(LP)
    lp.issue(0, "ACT", 0, row=0)
    lp.issue(4, "ACT", 1, row=0)
    t0 = 4 + LP.ck("tRAS")                                     # both banks past tRAS
    lp.issue(t0, "PRE", 0)
    violation(lambda: lp.issue(t0 + 1, "PRE", 1), "tPPD")      # 1 < 2 after bank 0's PRE
    lp.issue(t0 + 2, "PRE", 1)                                  # exactly tPPD
    hb = TimingChecker(HB)
    hb.issue(0, "ACT", 0, row=0)
    hb.issue(2, "ACT", 1, row=0)
    t0 = 2 + HB.ck("tRAS")
    hb.issue(t0, "PRE", 0)
    hb.issue(t0 + 1, "PRE", 1)                                  # the HB: no tPPD


def test_bank_rules_trcd_tras_trtp_twr_trp_trc():
    c = TimingChecker(HB)
    c.issue(0, "ACT", 0, row=3)
    violation(lambda: c.issue(5, "RD", 0, col=0), "tRCD")
    c.issue(6, "RD", 0, col=0)
    violation(lambda: c.issue(13, "PRE", 0), "tRAS")
    c.issue(14, "PRE", 0)
    violation(lambda: c.issue(19, "ACT", 0, row=4), "tRP")
    c.issue(20, "ACT", 0, row=4)                                # tRP 6 and tRC 20 both met
    c.issue(26, "WR", 0, col=1)
    wr2pre = HB.ck("WL") + HB.burst_ck + HB.ck("tWR")
    violation(lambda: c.issue(26 + wr2pre - 1, "PRE", 0), "tWR")
    c.issue(26 + wr2pre, "PRE", 0)
    d = TimingChecker(HB)
    d.issue(0, "ACT", 0, row=0)
    d.issue(6, "RD", 0, col=0)
    d.issue(14, "PRE", 0)
    violation(lambda: d.issue(19, "ACT", 0, row=1), "tRP")
    d2 = TimingChecker(HB)
    d2.issue(0, "ACT", 1, row=0)
    d2.issue(14, "RD", 1, col=0)
    violation(lambda: d2.issue(16, "PRE", 1), "tRTP")           # 2 < 3 after the RD


def test_read_write_turnarounds():
    c = TimingChecker(HB)
    c.issue(0, "ACT", 0, row=0)
    c.issue(3, "ACT", 4, row=0)
    c.issue(5, "ACT", 1, row=0)
    c.issue(10, "RD", 0, col=0)
    violation(lambda: c.issue(10 + HB.rtw_ck - 1, "WR", 1, col=0), "tRTW")
    c.issue(10 + HB.rtw_ck, "WR", 1, col=0)
    w = 10 + HB.rtw_ck
    violation(lambda: c.issue(w + HB.wtr_ck(False) - 1, "RD", 0, col=1), "tWTR_S")
    violation(lambda: c.issue(w + HB.wtr_ck(True) - 1, "RD", 1, col=1), "tWTR_L")
    c.issue(w + HB.wtr_ck(True), "RD", 1, col=1)


def test_refresh_rules_trfc_per_bank_and_all_bank():
    c = TimingChecker(HB)
    c.issue(0, "REFPB", 5)
    violation(lambda: c.issue(HB.ck("tPBR2PBR") - 1, "REFPB", 6), "tPBR2PBR")
    violation(lambda: c.issue(HB.ck("tPBR2ACT") - 1, "ACT", 6, row=0), "tPBR2ACT")
    violation(lambda: c.issue(HB.ck("tRFCpb") - 1, "ACT", 5, row=0), "tRFCpb")
    c.issue(HB.ck("tRFCpb"), "ACT", 5, row=0)
    violation(lambda: c.issue(HB.ck("tRFCpb") + 20, "REFPB", 5), "REFPB with a bank open")
    ab = dataclasses.replace(HB, per_bank_refresh=False)
    a = TimingChecker(ab)
    violation(lambda: a.issue(0, "REFPB", 0), "REFPB in all-bank refresh mode")
    a.issue(0, "ACT", 2, row=0)
    violation(lambda: a.issue(30, "REFAB"), "REFAB with a bank open")
    a.issue(30, "PRE", 2)
    violation(lambda: a.issue(35, "REFAB"), "tRP")
    a.issue(36, "REFAB")
    violation(lambda: a.issue(36 + ab.ck("tRFCab") - 1, "ACT", 9, row=0), "tRFCab")
    a.issue(36 + ab.ck("tRFCab"), "ACT", 9, row=0)
    # LPDDR5 per-bank refresh covers the bank pair (u, u + 8)
    lp = TimingChecker(LP)
    lp.issue(0, "REFPB", 3)
    violation(lambda: lp.issue(LP.ck("tRFCpb") - 1, "ACT", 11, row=0), "tRFCpb")


def test_protocol_rules_and_refresh_rate():
    c = TimingChecker(HB)
    violation(lambda: c.issue(0, "RD", 0, col=0), "RD to a closed bank")
    violation(lambda: c.issue(0, "PRE", 0), "PRE to a closed bank")
    c.issue(0, "ACT", 0, row=1)
    violation(lambda: c.issue(30, "ACT", 0, row=2), "ACT to an open bank")
    violation(lambda: c.issue(30, "ACT", 16, row=2), "address")
    window = (HB.max_postponed + 1) * HB.ck("tREFI")
    r = TimingChecker(HB)
    for u in range(HB.refresh_units):
        r.issue(window - 100 + 4 * u, "REFPB", u)
    r.check_refresh(2 * window - 100)
    violation(lambda: r.check_refresh(2 * window - 99), "refresh rate")


def test_counters_hits_misses_conflicts():
    c = TimingChecker(HB)
    c.issue(0, "ACT", 0, row=1)
    for i in range(3):
        c.issue(6 + 2 * i, "RD", 0, col=i)
    c.issue(20, "PRE", 0)
    c.issue(26, "ACT", 0, row=2)
    c.issue(32, "WR", 0, col=0)
    st = c.stats
    assert (st["act"], st["pre"], st["rd"], st["wr"]) == (2, 1, 3, 1)
    assert (st["row_hits"], st["row_misses"], st["row_conflicts"]) == (2, 1, 1)
    assert st["bytes_read"] == 3 * 128 and st["bytes_written"] == 128


# -- the device ------------------------------------------------------------------------------

def test_device_clock_edges_bus_and_read_return():
    dev = DramDevice(HB, clock_ghz=1.0)
    ticks = [c for c in range(10) if dev.tick(c)]
    assert ticks == [2, 4, 7, 9]                           # 2.5 logic cycles per DRAM clock
    assert [dev.dram_cycle(c) for c in ticks] == [0, 1, 2, 3]
    assert [dev.logic_cycle(k) for k in range(4)] == ticks
    dev.clock()
    with pytest.raises(TimingViolation, match="command clock"):
        dev.clock(row=(RowCmd.ACT, 0, 0))                  # cycle 1: no edge
    lp = DramDevice(LP, clock_ghz=1.0)
    lp.clock()
    with pytest.raises(TimingViolation, match="command bus"):
        lp.clock(row=(RowCmd.ACT, 1, 0), col=(0, 0, 0, 0))
    d = DramDevice(HB, clock_ghz=1.0)
    out = {}
    plan = {2: ((RowCmd.ACT, 3, 5), None)}
    k_wr = 6
    k_rd = k_wr + HB.wtr_ck(True)
    plan[d.logic_cycle(k_wr)] = (None, (1, 3, 2, 0xABC))
    plan[d.logic_cycle(k_rd)] = (None, (0, 3, 2, 0))
    for c in range(80):
        got = d.clock(*plan.get(c, (None, None)))
        if got is not None:
            out[c + 1] = got
    ready = d.logic_cycle(k_rd + HB.ck("RL") + HB.burst_ck)
    assert out == {ready: 0xABC}
    assert d.memory == {(3, 5, 2): 0xABC}


def test_paper_size_memory_is_sparse_and_patterned():
    cfg = preset("paper-4gb").hb
    dev = DramDevice(cfg, clock_ghz=1.0)
    assert dev.memory == {} and cfg.capacity_bytes == 256 << 20
    a = dev.read_burst(15, cfg.rows - 1, cfg.columns - 1)
    assert a == dram_pattern(cfg, 15, cfg.rows - 1, cfg.columns - 1)
    assert a != dev.read_burst(15, cfg.rows - 1, 0) and a.bit_length() <= 1024

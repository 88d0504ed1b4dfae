"""The one configuration object (elmoe3d.config): unknown keys and bad values are refused with
the field named, the presets round-trip, and the paper presets give Table 1's peak TOPS."""

import dataclasses

import pytest

from ..pe_cases import NARROW_OUT_NEEDS, NARROW_OUT_OK
from elmoe3d.config import (FPGA_LEAN_PE, PRESETS, ArchConfig, ConfigError, PEOptions,
                            TileConfig, check_mul_stages, combine_latency, drain_cycles,
                            max_requant_units, preset, preset_key, swiglu_latency,
                            tile_latency)
from elmoe3d.isa import Sink


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_from_dict_rejects_unknown_top_level_keys_naming_them():
    with pytest.raises(ConfigError, match=r"unknown configuration key\(s\): clock_mhz, pe_count;"
                                          r" known keys: .*clock_ghz.*pes"):
        ArchConfig.from_dict({"pes": 4, "pe_count": 4, "clock_mhz": 1000})


def test_from_dict_rejects_unknown_tile_keys_naming_them():
    with pytest.raises(ConfigError, match=r"unknown configuration key\(s\) in tile: cols, depth;"
                                          r" known keys: group, lanes, rows"):
        ArchConfig.from_dict({"tile": {"rows": 2, "cols": 4, "depth": 32}})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_dicts(name):
    arch = preset(name)
    assert ArchConfig.from_dict(arch.to_dict()) == arch
    assert ArchConfig.from_dict({}) == ArchConfig()


def test_from_dict_builds_the_tile():
    arch = ArchConfig.from_dict({"name": "x", "tile": {"rows": 4, "lanes": 8}, "pes": 8})
    assert arch.tile == TileConfig(rows=4, lanes=8, group=32)
    assert (arch.name, arch.pes, arch.groups) == ("x", 8, 4)


@pytest.mark.parametrize("values, field", [
    ({"pes": 0}, "pes"),
    ({"pes": 2.0}, "pes"),
    ({"pes": True}, "pes"),
    ({"pes_per_group": 0}, "pes_per_group"),
    ({"pes": 6, "pes_per_group": 4}, "pes"),
    ({"wmem_bytes": "4096"}, "wmem_bytes"),
    ({"iomem_bytes": -1}, "iomem_bytes"),
    ({"hb_bank_bytes": 0}, "hb_bank_bytes"),
    ({"ext_bytes": 1.5}, "ext_bytes"),
    ({"clock_ghz": 0}, "clock_ghz"),
    ({"clock_ghz": -1.0}, "clock_ghz"),
    ({"clock_ghz": "1"}, "clock_ghz"),
    ({"clock_ghz": True}, "clock_ghz"),
    ({"hb_bank_gbps": 0.0}, "hb_bank_gbps"),
    ({"ext_gbps": None}, "ext_gbps"),
    ({"streamline_gbps": -128.0}, "streamline_gbps"),
    ({"aggregation_gbps": 0}, "aggregation_gbps"),
    ({"hb_pj_per_bit": 0}, "hb_pj_per_bit"),
    ({"ext_pj_per_bit": "3.88"}, "ext_pj_per_bit"),
    ({"tile": [2, 4]}, "tile"),
    ({"tile": {"rows": 0}}, "tile.rows"),
    ({"tile": {"rows": "2"}}, "tile.rows"),
    ({"tile": {"lanes": 3}}, "tile.lanes"),
    ({"tile": {"lanes": 0}}, "tile.lanes"),
    ({"tile": {"group": 16}}, "tile.group"),
    ({"tile": {"group": 0}}, "tile.group"),
])
def test_bad_values_raise_config_error_naming_the_field(values, field):
    with pytest.raises(ConfigError) as excinfo:
        ArchConfig.from_dict(values)
    assert str(excinfo.value).startswith(f"{field}: "), str(excinfo.value)


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset("small").pes = 8


#: Paper Table 1: peak TOPS at 1 GHz for (W8A8, W4A8) with 16 PEs (4 GB) and 32 PEs (8 GB).
TABLE1_PEAK_TOPS = {"paper-4gb": (16, 262, 524), "paper-8gb": (32, 524, 1048)}


@pytest.mark.parametrize("name", sorted(TABLE1_PEAK_TOPS))
def test_peak_tops_match_table_1(name):
    pes, w8, w4 = TABLE1_PEAK_TOPS[name]
    arch = preset(name)
    assert (arch.pes, arch.clock_ghz) == (pes, 1.0)
    assert (arch.tile.rows, arch.tile.lanes, arch.tile.group) == (16, 32, 32)
    # The paper rounds down to the TOPS (262.1 -> 262, 1048.6 -> 1048).
    assert int(arch.peak_tops(8)) == w8 and abs(arch.peak_tops(8) - w8) < 1
    assert int(arch.peak_tops(4)) == w4 and abs(arch.peak_tops(4) - w4) < 1
    assert arch.peak_tops(4) == 2 * arch.peak_tops(8)


def test_peak_tops_scales_with_the_clock_and_rejects_other_widths():
    arch = dataclasses.replace(preset("paper-4gb"), clock_ghz=0.5)
    assert arch.peak_tops(8) == preset("paper-4gb").peak_tops(8) / 2
    with pytest.raises(ConfigError, match="weight_bits: expected 4 or 8, got 6"):
        arch.peak_tops(6)


def test_preset_unknown_name():
    with pytest.raises(ConfigError, match=r"unknown configuration 'paper-16gb'; expected one of ")\
            as excinfo:
        preset("paper-16gb")
    listed = str(excinfo.value).rsplit("expected one of ", 1)[1].split(", ")
    assert listed == list(PRESETS) and {"small", "paper-4gb", "paper-8gb"} <= set(listed)
    assert preset("small") is PRESETS["small"]


def test_preset_names_are_case_blind():
    """``paper-8GB`` names paper-8gb, as ``paper --hb 8GB`` takes 8gb; a name that is no preset
    in any case is returned unchanged by :func:`preset_key` and refused by :func:`preset` as
    written."""
    assert preset("Paper-8GB") is PRESETS["paper-8gb"] and preset("SMALL") is PRESETS["small"]
    assert preset_key("Paper-4GB") == "paper-4gb" and preset_key("Arty") == "Arty"
    assert preset_key(" paper-8gb ") == "paper-8gb" and preset(" Small") is PRESETS["small"]
    assert preset_key(None) is None
    with pytest.raises(ConfigError, match=r"unknown configuration 'Paper-16GB'"):
        preset("Paper-16GB")


# ---- PEOptions: the PE's build options and the timing they imply ---------------------------------

SMALL = preset("small")
SMALL_PE = SMALL.pe                                # W = 512: W/32 = 16, W/64 = 8, lanes 4
WIDE = ArchConfig(name="wide", tile=TileConfig(rows=8, lanes=16), wmem_bytes=16384,
                  iomem_bytes=65536)               # W = 2048


def test_pe_options_defaults_resolve_the_unit_counts():
    opts = PEOptions(config=SMALL)
    assert opts.config == SMALL_PE                 # an ArchConfig is reduced to its PEConfig
    assert PEOptions(config=SMALL_PE) == opts
    assert opts.params == {
        "mul_stages": 1, "requant_units": 16, "fp32_units": 16, "combine_units": 4,
        "swiglu_units": 2, "tile_dsp_pairs": False, "tile_passes": 1, "out_valid_bits": True,
        "wbuf_memories": 2, "out_banks": 2, "streamed_weights": False, "narrow_iomem": False,
        "narrow_out": False}
    assert PEOptions(config=SMALL, requant_units=16, fp32_units=16, combine_units=4,
                     swiglu_units=2) == opts
    assert PEOptions(config=WIDE).requant_units == 32         # min(W/32, 32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.tile_passes = 2


def test_pe_options_default_timing():
    opts = PEOptions(config=SMALL)
    assert (opts.tile_latency, opts.swiglu_latency, opts.combine_latency) == (5, 11, 6)
    assert opts.sink_latency == {Sink.RAW: 1, Sink.SWIGLU: 13, Sink.COMBINE: 9}
    assert opts.result_cycles == {(Sink.RAW, False): 1, (Sink.RAW, True): 2,
                                  (Sink.SWIGLU, False): 2, (Sink.SWIGLU, True): 3,
                                  (Sink.COMBINE, False): 2, (Sink.COMBINE, True): 3}
    assert (opts.requant_word_cycles, opts.output_beat_cycles, opts.clear_cycles) == (1, 1, 1)
    assert opts.combine_row_cycles == opts.swiglu_row_cycles == {True: 1, False: 1}
    assert (opts.completion_cycles, opts.gemm_gap, opts.load_queue_depth) == (12, 0, 16)


def test_pe_options_drain_cycles_as_measured():
    """Last SWIGLU beat to the first ROWMAX read of the REQUANT behind it, as measured on the
    RTL PE (2x4 small PE, an expert program of 2 tokens in DRAFT, 2026-12-03: the tile's 5
    cycles and the SwiGLU unit's 11 of issue 25's 1 GHz pipeline, its input register
    included)."""
    for options, cycles in (({}, 22), ({"tile_passes": 2}, 23), ({"mul_stages": 2}, 24),
                            (dict(FPGA_LEAN_PE), 27)):
        assert PEOptions(config=SMALL, **options).drain_cycles == cycles, options
    assert PEOptions(config=WIDE).drain_cycles == 5 + 8 - 1 + 13 + 3      # 8 rows


def test_drain_cycles_and_requant_units_without_a_pe():
    """The expert builder's figures for the default PE of any tile shape (no PEOptions, so no
    check of the options): the measured 22 cycles of the small PE, and rows - 1 more per row."""
    assert drain_cycles(2) == PEOptions(config=SMALL).drain_cycles == 22
    assert drain_cycles(8) == PEOptions(config=WIDE).drain_cycles == 22 + 6
    assert drain_cycles(6) == 22 + 4                       # a 6x12 tile: no PE (lanes 12)
    assert drain_cycles(2, row_cycles=2, tile_passes=4) == \
           PEOptions(config=SMALL, **FPGA_LEAN_PE).drain_cycles == 27
    assert [max_requant_units(w) for w in (512, 1536, 2048, 4096)] == [16, 32, 32, 32]


def test_fpga_lean_pe_timing():
    lean = PEOptions(config=SMALL, **FPGA_LEAN_PE)
    assert lean.params == dict(FPGA_LEAN_PE, mul_stages=1)
    assert (lean.tile_latency, lean.requant_word_cycles, lean.output_beat_cycles) == (8, 16, 16)
    assert lean.combine_row_cycles == {True: 2, False: 4}
    assert lean.swiglu_row_cycles == {True: 1, False: 2}
    assert lean.result_cycles[(Sink.COMBINE, False)] == 8
    assert lean.result_cycles[(Sink.SWIGLU, True)] == 4         # the psum word hidden
    assert lean.clear_cycles == 176 * 4                         # OUT words x P parts, one bank
    assert lean.completion_cycles == max(11, 4 + 6) + 1
    with pytest.raises(TypeError):
        FPGA_LEAN_PE["tile_passes"] = 2                         # read-only


def test_block_latency_formulas():
    assert [tile_latency(p) for p in (1, 2, 4)] == [5, 6, 8]
    assert [swiglu_latency(s) for s in (1, 2, 3, 4)] == [11, 13, 15, 17]
    assert [combine_latency(s) for s in (1, 2, 3, 4)] == [6, 7, 8, 9]
    for bad in (0, 5, True, 1.0):
        with pytest.raises(ValueError, match=r"mul_stages: expected an integer in 1\.\.4, "
                                             rf"got {bad!r}"):
            check_mul_stages(bad)


def test_pe_options_config_errors():
    with pytest.raises(TypeError, match="config: expected an ArchConfig or a PEConfig, got str"):
        PEOptions(config="small")
    # the tile shape is PEConfig's to check, for a geometry built directly too
    with pytest.raises(ConfigError, match=r"tile.lanes: the PE needs lanes == 2 \* rows so that "
                                          r".* got rows=3, lanes=4"):
        PEOptions(config=dataclasses.replace(SMALL_PE, rows=3))
    with pytest.raises(ConfigError, match=r"tile.lanes: the PE needs lanes % 4 == 0 \(FULL-mode "
                                          r"SwiGLU blocks of lanes/4 channels\), got 6"):
        ArchConfig(tile=TileConfig(rows=3, lanes=6)).pe
    with pytest.raises(ValueError, match=r"config: the PE needs a power-of-two number of lanes "
                                         r"\(word addressing by shifts\), got 12"):
        PEOptions(config=ArchConfig(tile=TileConfig(rows=6, lanes=12), wmem_bytes=4 * 192 * 8,
                                    iomem_bytes=32 * 192))


@pytest.mark.parametrize("name, bad, message", [
    ("mul_stages", 0, r"mul_stages: expected an integer in 1\.\.4, got 0"),
    ("mul_stages", True, r"mul_stages: expected an integer in 1\.\.4, got True"),
    ("requant_units", 3, r"requant_units: expected a power of two in 1\.\.min\(W/32, 32\) = "
                         r"1\.\.16, got 3"),
    ("requant_units", 32, r"requant_units: .* got 32"),
    ("requant_units", 1.0, r"requant_units: .* got 1\.0"),
    ("fp32_units", 0, r"fp32_units: expected a power of two dividing W/32 = 16 \(1\.\.16\), "
                      r"got 0"),
    ("fp32_units", "2", r"fp32_units: .* got '2'"),
    ("combine_units", 8, r"combine_units: expected a power of two dividing lanes = 4 "
                         r"\(1\.\.4\), got 8"),
    ("combine_units", True, r"combine_units: .* got True"),
    ("swiglu_units", 4, r"swiglu_units: expected a power of two dividing lanes / 2 = 2 "
                        r"\(1\.\.2\), got 4"),
    ("swiglu_units", -1, r"swiglu_units: .* got -1"),
    ("tile_dsp_pairs", 1, r"tile_dsp_pairs: expected a bool, got 1"),
    ("tile_passes", 3, r"tile_passes: expected 1, 2 or 4, got 3"),
    ("tile_passes", True, r"tile_passes: expected 1, 2 or 4, got True"),
    ("out_valid_bits", None, r"out_valid_bits: expected a bool, got None"),
    ("wbuf_memories", 3, r"wbuf_memories: expected 1 or 2, got 3"),
    ("wbuf_memories", 2.0, r"wbuf_memories: expected 1 or 2, got 2\.0"),
    ("out_banks", 0, r"out_banks: expected 1 or 2, got 0"),
    ("out_banks", 1, r"out_banks: one OUT memory needs fewer than W/32 = 16 fp32_units \(an o "
                     r"beat's two OUT words are read one after the other, one per half of its "
                     r"sub-steps\), got fp32_units=16"),
    ("streamed_weights", "yes", r"streamed_weights: expected a bool, got 'yes'"),
    ("streamed_weights", True, r"streamed_weights: the weights come a pass at a time, so it "
                               r"needs tile_passes 2 or 4, got tile_passes=1"),
    ("narrow_iomem", 1, r"narrow_iomem: expected a bool, got 1"),
    ("narrow_iomem", True, r"narrow_iomem: ACT comes a tile pass at a time, so it needs "
                           r"tile_passes 2 or 4, got tile_passes=1"),
    ("narrow_out", None, r"narrow_out: expected a bool, got None"),
])
def test_pe_options_errors_name_the_option(name, bad, message):
    with pytest.raises(ValueError, match=message):
        PEOptions(config=SMALL, **{name: bad})


def test_pe_options_wbuf_memories_needs_power_of_two_wmem_words():
    odd = dataclasses.replace(SMALL, wmem_bytes=3 * SMALL.wmem_bytes)
    with pytest.raises(ValueError, match=r"wbuf_memories: one memory for both buffers needs a "
                                         r"power-of-two wmem_words \(the buffer is the top "
                                         r"address bit\), got 96"):
        PEOptions(config=odd, wbuf_memories=1)
    assert PEOptions(config=odd).wbuf_memories == 2


def test_pe_options_narrow_iomem_requant_units():
    with pytest.raises(ValueError, match=r"narrow_iomem: the requant_units values of a cycle "
                                         r"must lie in one HBUF part and one ACT row part, "
                                         r"min\(W/32, 32\)/P = 4 values, got requant_units=8"):
        PEOptions(config=SMALL, tile_passes=4, narrow_iomem=True, requant_units=8)
    for passes, units, limit in ((2, None, 16), (4, 16, 8)):
        with pytest.raises(ValueError, match=rf"min\(W/32, 32\)/P = {limit} values, got "
                                             rf"requant_units={16 if units else 32}"):
            PEOptions(config=WIDE, tile_passes=passes, narrow_iomem=True, requant_units=units)
    assert PEOptions(config=WIDE, tile_passes=2, narrow_iomem=True, requant_units=16).narrow_iomem


def test_pe_options_narrow_out_needs():
    ok = NARROW_OUT_OK
    assert PEOptions(config=SMALL, **ok, narrow_out=True).narrow_out
    for change, match in NARROW_OUT_NEEDS:
        with pytest.raises(ValueError, match="narrow_out: OUT in W/P-bit parts " + match):
            PEOptions(config=SMALL, **{**ok, **change}, narrow_out=True)

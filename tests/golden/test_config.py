"""The one configuration object (elmoe3d.config): unknown keys and bad values are refused with
the field named, the presets round-trip, and the paper presets give Table 1's peak TOPS."""

import dataclasses

import pytest

from elmoe3d.config import PRESETS, ArchConfig, ConfigError, TileConfig, preset


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

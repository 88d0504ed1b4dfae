"""A configuration of your own: ``--config FILE`` (a base preset and the fields it changes,
``sweep_spec.load_config``) for ``elmoe3d verilog``, ``synth`` and ``paper-pe``, and its
every mistake named."""

from __future__ import annotations

import dataclasses

import pytest

import elmoe3d.cli as cli
from elmoe3d.blocks import ROOT
from elmoe3d.config import TileConfig, preset
from elmoe3d.errors import UserError
from elmoe3d.sim.paper_pe import paper_arch
from elmoe3d.sw.host.sweep_spec import load_config

EXAMPLE = ROOT / "examples" / "config_8pe_t8x16.yaml"


def _write(tmp_path, text, name="mine.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_example_is_the_base_with_its_fields_replaced():
    arch = load_config(EXAMPLE)
    base = preset("paper-4gb")
    assert arch.name == "paper-4gb-8pe-t8x16"
    assert (arch.pes, arch.tile, arch.wmem_bytes) == (8, TileConfig(8, 16, 32), 65536)
    # every other field is the base's; the HB shrinks with the PEs (8 x 256 MiB)
    changed = {f.name for f in dataclasses.fields(arch)
               if getattr(arch, f.name) != getattr(base, f.name)}
    assert changed == {"name", "pes", "tile", "wmem_bytes"}
    assert arch.hb_bytes == 8 * 256 * 2**20 == base.hb_bytes // 2
    assert (arch.pe.rows, arch.pe.lanes, arch.pe.word_bits) == (8, 16, 16 * 32 * 4)


def test_toml_dotted_fields_and_the_stem_as_name(tmp_path):
    path = _write(tmp_path, 'base = "small"\n[config]\n"tile.rows" = 4\n"tile.lanes" = 8\n'
                            'iomem_bytes = 16384\n', "tiny-die.toml")
    arch = load_config(path)
    assert (arch.name, arch.tile.rows, arch.tile.lanes, arch.iomem_bytes) == \
        ("tiny-die", 4, 8, 16384)
    assert arch.pes == preset("small").pes


def test_every_mistake_is_a_line_naming_the_file(tmp_path):
    path = _write(tmp_path, "base: paper-4gb\nname: small\nworkload: {model: [x]}\n"
                            "config:\n  pez: 8\n  tile: {rows: [8, 16]}\n  wmem_bytes: 64KiB\n"
                            "  clock_ghz: true\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"{path}: unknown key 'workload'; known: base, name, config "
                               f"(a configuration file; a sweep's workload and tasks go in a "
                               f"spec: elmoe3d sweep)")
    assert f"{path}: name: 'small' is a preset's; name the configuration otherwise" in lines
    assert any(line.startswith(f"{path}: config: unknown field 'pez' (did you mean 'pes'?)")
               for line in lines)
    assert f"{path}: config.tile.rows: expected one value, got [8, 16] (a list or range is " \
           f"a sweep's axis: elmoe3d sweep)" in lines
    assert f"{path}: config.wmem_bytes: expected an integer, got '64KiB'" in lines
    assert f"{path}: config.clock_ghz: expected a number, got True" in lines
    assert len(lines) == 6


@pytest.mark.parametrize("text, message", [
    ("config: {pes: 8}\n", "base: missing; the preset the fields override, one of small, "
                           "mid, paper-4gb, paper-8gb"),
    ("base: paper-16gb\n", "base: unknown configuration 'paper-16gb'; expected one of small, "
                           "mid, paper-4gb, paper-8gb"),
    ("base: small\nname: my die\n", "name: expected letters, digits, - and _ (it names build "
                                    "folders and Verilog modules), got 'my die'"),
    ("base: small\nconfig: [pes]\n", "config: expected a table of fields"),
    # a false, zero, empty text or empty list is no table either (it was taken as none)
    ("base: small\nconfig: false\n", "config: expected a table of fields"),
    ("base: small\nconfig: 0\n", "config: expected a table of fields"),
    ("base: small\nconfig: []\n", "config: expected a table of fields"),
    ("- base\n", "expected a table of base, name, config"),
    # a configuration ArchConfig refuses, and one whose PE cannot be built
    ("base: paper-4gb\nconfig: {pes: 10}\n", "pes: 10 is not a multiple of pes_per_group (4)"),
    ("base: paper-4gb\nconfig: {tile.lanes: 24}\n", "lanes"),
])
def test_one_mistake(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


@pytest.mark.parametrize("name, twin", [("paper-4gb", None), ("PAPER-8GB", None),
                                        ("paper_4gb", "paper-4gb"), ("Paper_8GB", "paper-8gb")])
def test_a_name_that_is_a_presets_in_module_form_is_refused(tmp_path, name, twin):
    """A name that is a preset's once ``-`` is ``_`` names the preset's Verilog modules
    (``elmoe3d_tensor_tile_paper_4gb``) and build folders (``pe_paper_4gb-...``): refused as
    the preset's own name is."""
    with pytest.raises(UserError) as err:
        load_config(_write(tmp_path, f"base: small\nname: {name}\n"))
    said = f" ({twin}: build folders and Verilog modules write - as _)" if twin else ""
    assert str(err.value).endswith(f"name: {name!r} is a preset's{said}; name the "
                                   f"configuration otherwise")


@pytest.mark.parametrize("text", [
    "base: paper-4gb\nconfig:\n  tile: {rows: 8}\n  tile.rows: 16\n",
    "base: paper-4gb\nconfig:\n  tile.rows: 16\n  tile: {rows: 8, lanes: 16}\n",
    'base = "paper-4gb"\n[config]\n"tile.rows" = 8\n[config.tile]\nrows = 16\n'])
def test_a_tile_field_given_in_both_forms_is_refused(tmp_path, text):
    """``tile: {rows: 8}`` beside ``tile.rows: 16`` names one field twice: refused, not the
    later value taken (the file's parser refuses a key twice in one table only)."""
    path = _write(tmp_path, text, "mine.toml" if "=" in text else "mine.yaml")
    with pytest.raises(UserError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: config.tile.rows: given twice (tile: {{rows: ...}} and " \
                             f"tile.rows); give it once"


def test_a_sweep_spec_refuses_a_tile_field_given_in_both_forms():
    from elmoe3d.sw.host.sweep_spec import parse_spec
    with pytest.raises(UserError) as err:
        parse_spec({"workload": {"model": ["qwen3-30b-a3b"]},
                    "config": {"tile": {"rows": [8]}, "tile.rows": [16]}}, path="s.yaml")
    assert "s.yaml: config.tile.rows: given twice (tile: {rows: ...} and tile.rows); give " \
           "it once" in str(err.value).splitlines()


def test_config_alone_or_empty_changes_nothing(tmp_path):
    for text in ("base: small\nname: mine\nconfig:\n", "base: small\nname: mine\nconfig: {}\n"):
        assert load_config(_write(tmp_path, text)) == \
            dataclasses.replace(preset("small"), name="mine")


def test_a_stem_that_cannot_be_a_name_asks_for_one(tmp_path):
    with pytest.raises(UserError, match=r"got 'my die' \(the file's stem; give a name:\)"):
        load_config(_write(tmp_path, "base: small\n", "my die.yaml"))


@pytest.mark.parametrize("value, message", [
    ("smal", "--config smal: unknown configuration (did you mean 'small'?); expected one "
             "of small, mid, paper-4gb, paper-8gb, or a configuration file (.yaml, .yml, "
             ".toml)"),
    ("Paper-8GB", None),
])
def test_config_arch_takes_presets_in_any_case_and_names_a_typo(value, message):
    if message is None:
        assert cli.config_arch(value) is preset("paper-8gb")
    else:
        with pytest.raises(UserError) as err:
            cli.config_arch(value)
        assert str(err.value) == message


def test_config_arch_prefixes_each_line_of_the_file_with_the_option(tmp_path):
    path = _write(tmp_path, "config: {pez: 1}\n")
    with pytest.raises(UserError) as err:
        cli.config_arch(str(path), "--config")
    lines = str(err.value).splitlines()
    assert len(lines) == 2 and all(line.startswith(f"--config {path}: ") for line in lines)
    with pytest.raises(UserError, match=r"--config .*nothere.yaml: cannot read the "
                                        r"configuration \(No such file"):
        cli.config_arch(str(tmp_path / "nothere.yaml"))


def test_verilog_lists_and_exports_at_a_configuration_file(tmp_path, capsys):
    assert cli.main(["verilog", "--list", "--config", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "Block instances of the logic die at paper-4gb-8pe-t8x16" in " ".join(out.split())
    # the die's eight PEs, each with its tile
    rows = {line.split("│")[2].strip(): line.split("│")[4].strip()
            for line in out.splitlines() if line.count("│") > 5}
    assert rows["PE"] == "8" and rows["TensorTile"] == "8"
    assert cli.main(["verilog", "--list", "--config", str(EXAMPLE) + ",small"]) == 2
    assert "unknown configuration" in capsys.readouterr().err


def test_synth_refuses_a_configuration_twice_and_a_bad_file(tmp_path, capsys):
    assert cli.main(["synth", "--config", f"{EXAMPLE},{EXAMPLE}"]) == 2
    assert capsys.readouterr().err.strip() == \
        f"elmoe3d synth: error: --config: '{EXAMPLE},{EXAMPLE}' names a configuration twice " \
        f"(paper-4gb-8pe-t8x16)"
    bad = _write(tmp_path, "base: small\nconfig: {tile.rows: 0}\n")
    assert cli.main(["synth", "--config", f"small,{bad}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"elmoe3d synth: error: --config {bad}: ") and "rows" in err


def test_synth_names_two_files_of_one_name(tmp_path, capsys):
    """Two different files that share a ``name:`` are not "a configuration twice": the
    error says which name, and that the files need names of their own."""
    a = _write(tmp_path, "base: small\nname: mine\n", "a.yaml")
    b = _write(tmp_path, "base: small\nname: mine\nconfig: {wmem_bytes: 16384}\n", "b.yaml")
    assert cli.main(["synth", "--config", f"{a},{b}"]) == 2
    assert capsys.readouterr().err.strip() == \
        f"elmoe3d synth: error: --config: '{a},{b}' names a configuration twice (mine, the " \
        f"name of two files: give each its own name:)"
    assert cli.main(["synth", "--config", "paper-4gb,PAPER-4GB"]) == 2
    assert capsys.readouterr().err.strip() == \
        "elmoe3d synth: error: --config: 'paper-4gb,PAPER-4GB' names a configuration twice " \
        "(paper-4gb)"


def test_synth_takes_a_configuration_file_whose_path_holds_a_comma(tmp_path, monkeypatch):
    """A file ``my,die.yaml`` is one configuration (it was split into ``my`` and
    ``die.yaml``: "--config .../my: unknown configuration")."""
    import elmoe3d.cli.synth as synth
    path = _write(tmp_path, "base: small\nname: mine\n", "my,die.yaml")
    assert [a.name for a in synth._configs(str(path))] == ["mine"]
    assert [a.name for a in synth._configs(f"small,{EXAMPLE}")] == \
        ["small", "paper-4gb-8pe-t8x16"]


def test_paper_pe_takes_the_file_and_replaces_its_tile(tmp_path, capsys):
    arch = paper_arch(load_config(EXAMPLE), "4x8x32")
    assert (arch.name, arch.pes, arch.wmem_bytes, arch.tile) == \
        ("paper-4gb-8pe-t8x16-t4x8x32", 8, 65536, TileConfig(4, 8, 32))
    bad = _write(tmp_path, "base: paper-4gb\nconfig: {tile.group: 16}\n")
    assert cli.main(["paper-pe", "--config", str(bad), "--build-only"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"elmoe3d paper-pe: error: --config {bad}: ") and "32" in err

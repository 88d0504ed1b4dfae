"""The block registry (:mod:`elmoe3d.blocks`) against the tree: every Component in ``hw/`` is
some block's, every path the registry names exists, every departure from the one-name
convention carries a note (and no note stands without one), and ``elmoe3d blocks`` prints
every block.

Shared modules (:data:`elmoe3d.blocks.SHARED`: the ISA's layouts, stream layouts, the checked
Component base) belong to no block; a Component defined in one is accepted only as a base
class of another ``hw/`` Component (it is never built on its own).
"""

import importlib
import inspect
import json
import re
import subprocess
import sys

import pytest
from amaranth.lib import wiring

from elmoe3d import blocks as registry
from elmoe3d.blocks import (BLOCKS, ROOT, SHARED, area_categories, block_of_module, module_file,
                            timing_categories)


def _hw_modules():
    """Every module under hw/ (packages' modules included), as (dotted name, path)."""
    hw = module_file("elmoe3d.hw")
    out = []
    for path in sorted(hw.rglob("*.py")):
        rel = path.relative_to(hw).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if parts:
            out.append((".".join(["elmoe3d.hw", *parts]), path))
    return out


def _components():
    """Every wiring.Component subclass defined in a hw/ module: [(class, module, path)]."""
    found = []
    for mod_name, path in _hw_modules():
        mod = importlib.import_module(mod_name)
        for obj in vars(mod).values():
            if inspect.isclass(obj) and obj.__module__ == mod_name \
                    and issubclass(obj, wiring.Component):
                found.append((obj, mod_name, path))
    return found


def _unregistered(components):
    """Lines naming each Component no block covers (shared modules: unless it is a base)."""
    shared = {s.module for s in SHARED}
    classes = [c for c, _, _ in components]
    bad = []
    for cls, mod, path in components:
        if block_of_module(mod) is not None:
            continue
        if mod in shared and any(o is not cls and issubclass(o, cls) for o in classes):
            continue
        bad.append(f"{cls.__qualname__} ({mod}, {path.relative_to(ROOT)}): a wiring.Component "
                   f"no block of elmoe3d.blocks covers")
    return bad


def test_every_hw_component_is_registered():
    components = _components()
    assert len(components) >= 20               # the walk found the tree's blocks
    bad = _unregistered(components)
    assert not bad, "\n".join(bad)


def test_an_unregistered_component_is_named(monkeypatch):
    """The check above fails, naming the class and its module, when a block is left out."""
    monkeypatch.setattr(registry, "BLOCKS", tuple(b for b in BLOCKS if b.name != "ring"))
    bad = [line for line in _unregistered(_components()) if "elmoe3d.hw.ring" in line]
    assert any(line.startswith("StreamlineRing (elmoe3d.hw.ring, hw/ring.py)") for line in bad)
    assert any(line.startswith("RingStation (elmoe3d.hw.ring, ") for line in bad)
    assert len(bad) == 2


def test_a_module_named_like_a_block_is_not_its():
    """A module belongs to the block that lists it, whatever its name: a Component in a new
    ``hw/ring_buffer.py`` (or ``hw/pe_cluster.py``, ``hw/dram_scheduler.py``) is named as no
    block's until an entry lists it."""
    class Buffer(wiring.Component):
        pass

    for mod in ("elmoe3d.hw.ring_buffer", "elmoe3d.hw.pe_cluster", "elmoe3d.hw.dram_scheduler"):
        assert block_of_module(mod) is None, mod
        path = ROOT / "hw" / (mod.rpartition(".")[2] + ".py")
        assert _unregistered([(Buffer, mod, path)]) == [
            f"test_a_module_named_like_a_block_is_not_its.<locals>.Buffer ({mod}, "
            f"{path.relative_to(ROOT)}): a wiring.Component no block of elmoe3d.blocks covers"]


def test_every_hw_module_is_a_block_or_shared():
    shared = {s.module for s in SHARED}
    for mod, path in _hw_modules():
        owner = block_of_module(mod)
        assert (owner is None) == (mod in shared), \
            f"{path.relative_to(ROOT)} ({mod}): " + \
            (f"both block {owner.name}'s and shared" if owner else "no block's and not shared")


def test_shared_modules_exist():
    for s in SHARED:
        assert module_file(s.module) is not None, f"SHARED: module {s.module} has no source"
        assert s.module.startswith("elmoe3d.hw.") and s.what, s


def test_a_shared_component_must_be_a_base():
    """A Component defined in a shared module passes only as a base of another Component."""
    class Base(wiring.Component):
        pass

    class Derived(Base):
        pass

    where = ("elmoe3d.hw.layouts", ROOT / "hw" / "layouts.py")
    assert _unregistered([(Base, *where)]) == [
        "test_a_shared_component_must_be_a_base.<locals>.Base (elmoe3d.hw.layouts, "
        "hw/layouts.py): a wiring.Component no block of elmoe3d.blocks covers"]
    assert _unregistered([(Base, *where), (Derived, "elmoe3d.hw.tile", ROOT / "hw/tile.py")]) \
        == []


def test_names_are_unique_and_modules_of_hw():
    names = [b.name for b in BLOCKS]
    assert len(names) == len(set(names))
    for b in BLOCKS:
        assert b.rtl and all(m.startswith("elmoe3d.hw.") for m in b.rtl), b.name
        assert b.rtl[0] == f"elmoe3d.hw.{b.name}", \
            f"{b.name}: its first RTL module is {b.rtl[0]}, expected elmoe3d.hw.{b.name}"
    assert registry.block("ring").name == "ring"
    listed = [m for b in BLOCKS for m in b.rtl]
    assert len(listed) == len(set(listed)), "a module listed by two blocks"
    # a package's modules, the modules a block lists
    for mod, name in (("elmoe3d.hw.pe.memories", "pe"), ("elmoe3d.hw.bridge_rx", "bridge"),
                      ("elmoe3d.hw.dram_port", "dram_port"), ("elmoe3d.hw.hb_ctrl", "dram"),
                      ("elmoe3d.hw.dram_layouts", "dram"), ("elmoe3d.hw.die_layouts", "die"),
                      ("elmoe3d.hw.dram", "dram"), ("elmoe3d.hw.unit_pe", "unit_pe")):
        assert block_of_module(mod).name == name, mod
    assert block_of_module("elmoe3d.hw.layouts") is None
    assert block_of_module("elmoe3d.hw.pel") is None
    with pytest.raises(ValueError, match="no block or top Component class 'nope'; blocks: unit_pe"):
        registry.block("nope")
    # a block by its top Component class or in another letter case
    for name, want in (("TensorTile", "tile"), ("tensortile", "tile"), ("PE", "pe"),
                       ("AggregationLink", "agg_link"), ("DRAM", "dram")):
        assert registry.block(name).name == want, name


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path):
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#+\s+(.*)", line)):
            out.add(_slug(m.group(1)))
    return out


@pytest.mark.parametrize("b", BLOCKS, ids=lambda b: b.name)
def test_every_path_exists(b):
    for mod in b.rtl + b.golden + ((b.bench,) if b.bench else ()):
        assert module_file(mod) is not None, f"{b.name}: module {mod} has no source"
    for top in b.tops:
        mod, _, name = top.partition(":")
        assert b.owns(mod), f"{b.name}: top {top} is outside its modules"
        cls = getattr(importlib.import_module(mod), name, None)
        assert inspect.isclass(cls) and hasattr(cls, "elaborate"), \
            f"{b.name}: top {top} is not an elaboratable class"
    for t in b.tests_extra:
        assert (ROOT / t).is_file(), f"{b.name}: test file {t} does not exist"
    doc, _, anchor = b.doc.partition("#")
    assert (ROOT / doc).is_file(), f"{b.name}: {doc} does not exist"
    assert anchor in _anchors(ROOT / doc), f"{b.name}: {doc} has no heading #{anchor}"


@pytest.mark.parametrize("b", BLOCKS, ids=lambda b: b.name)
def test_names_follow_the_convention_or_say_why(b):
    """golden sw/golden/<name>.py, bench sim/bench_<name>.py, tests tests/*/test_<name>*.py;
    a block that departs carries a note, and a note stands only for a departure."""
    golden_file = module_file(b.conventional_golden)
    assert golden_file is None or b.conventional_golden in b.golden, \
        f"{b.name}: sw/golden/{b.name}.py exists but is not its golden model"
    departs = b.golden != (b.conventional_golden,)
    assert bool(b.golden_note) == departs, \
        f"{b.name}: golden {b.golden}: {'a departure needs' if departs else 'no departure, no'} " \
        f"golden_note"
    bench_file = module_file(b.conventional_bench)
    assert bench_file is None or b.bench == b.conventional_bench, \
        f"{b.name}: sim/bench_{b.name}.py exists but is not its bench"
    departs = b.bench != b.conventional_bench
    assert bool(b.bench_note) == departs, \
        f"{b.name}: bench {b.bench}: {'a departure needs' if departs else 'no departure, no'} " \
        f"bench_note"
    assert b.tests(), f"{b.name}: no test file"
    departs = bool(b.tests_extra) or not b.conventional_tests()
    assert bool(b.tests_note) == departs, \
        f"{b.name}: tests {b.tests()}: {'a departure needs' if departs else 'no departure, no'} " \
        f"tests_note"
    assert not b.timing_note or b.timing, f"{b.name}: a timing_note without a timing category"
    assert bool(area_categories(b)) != bool(b.area_note), \
        f"{b.name}: exactly one of an elmoe3d synth area category ({area_categories(b)}) or " \
        f"an area_note"


def test_departures_are_the_known_ones():
    """The blocks off the convention, as the registry documents them (a new departure is a
    decision: add it here too)."""
    assert {b.name for b in BLOCKS if b.golden_note} == {
        "unit_pe", "fixed", "load_router", "dram_port", "ext_stream", "die", "uart", "pll",
        "board"}
    assert {b.name for b in BLOCKS if b.bench_note} == {
        "unit_pe", "fixed", "vpu", "load_router", "dram_port", "ext_stream", "ext_sched",
        "bridge", "uart", "pll"}
    assert {b.name for b in BLOCKS if b.tests_note} == {"pe", "dram_port", "ext_stream", "pll"}


def test_every_bench_and_synth_type_belongs_to_a_block():
    named = {b.bench for b in BLOCKS if b.bench}
    notes = " ".join(b.golden_note + b.bench_note + b.tests_note for b in BLOCKS)
    for path in sorted(module_file("elmoe3d.sim").glob("bench_*.py")):
        mod = f"elmoe3d.sim.{path.stem}"
        assert mod in named or f"sim/{path.name}" in notes, \
            f"sim/{path.name}: no block's bench and named in no note"
    from elmoe3d.synth.blocks import BLOCK_TYPES
    for bt in BLOCK_TYPES:
        assert block_of_module(bt.path.partition(":")[0]), f"synth {bt.path}: no block"


def test_the_registry_imports_no_amaranth():
    code = ("import sys, elmoe3d.blocks as b; [b.module_file(m) for x in b.BLOCKS for m in x.rtl]; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'amaranth' "
            "or m.startswith('elmoe3d.hw')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]", done.stdout


def _table_rows(text):
    """The rows of a printed rich table: {first cell: [each cell's lines joined by spaces]}."""
    rows, cells = {}, None
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        parts = [p.strip() for p in line.strip().strip("│").split("│")]
        if parts[0]:
            cells = rows.setdefault(parts[0], [[] for _ in parts])
        for cell, part in zip(cells, parts):
            if part:
                cell.append(part)
    return {name: [" ".join(c) for c in cells] for name, cells in rows.items()}


def test_cli_prints_every_block(capsys):
    from elmoe3d.cli import main
    assert main(["blocks"]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 160
    header = " ".join(line for line in text.splitlines() if line.startswith("┃"))
    for col in ("block", "RTL", "top class", "golden", "bench", "tests", "area", "timing",
                "doc"):
        assert col in header, col
    rows = _table_rows(text)
    assert list(rows) == [b.name for b in BLOCKS]
    for b in BLOCKS:
        _, rtl, tops, _, _, tests, area, timing, _ = rows[b.name]
        assert rtl.startswith(f"{b.name}.py" if b.name != "pe" else "pe/"), (b.name, rtl)
        assert tops == (", ".join(t.rpartition(":")[2] for t in b.tops) or "-"), (b.name, tops)
        assert timing == (", ".join(timing_categories(b)) or "-"), (b.name, timing)
        assert tests.rstrip("*") == str(len(b.tests())), (b.name, tests)
        assert area.rstrip("*") == (", ".join(area_categories(b)) or "-"), (b.name, area)
    assert rows["tile"][2] == "TensorTile" and rows["board"][7] == "FPGA fmax"
    for name in ("tile", "pe", "ring", "agg_link", "load_router", "vpu", "ext_sched"):
        assert rows[name][7] == "ASAP7 STA", (name, rows[name][7])
    assert rows["dram"][2] == "DramController, HBController, ExtController"
    assert main(["blocks", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [b.name for b in BLOCKS]
    ring = {r["name"]: r for r in rows}["ring"]
    assert ring["rtl"] == ["hw/ring.py"] and ring["golden"] == ["sw/golden/ring.py"]
    assert ring["bench"] == "sim/bench_ring.py" and ring["area"] == ["streamline ring"]
    assert ring["tests"] == ["tests/amaranth/test_ring.py", "tests/cocotb/test_ring.py"]
    assert ring["tops"] == ["elmoe3d.hw.ring:StreamlineRing"]
    assert ring["timing"] == ["ASAP7 STA"] and "synth --timing" in ring["timing_note"]
    dram = {r["name"]: r for r in rows}["dram"]
    assert dram["timing"] == ["DRAM device timing", "ASAP7 STA"]
    assert "elmoe3d.sw.golden.dram" in dram["timing_note"] and "NLDM" in dram["timing_note"]
    assert set(dram) == {"name", "summary", "rtl", "tops", "golden", "golden_note", "bench",
                         "bench_note", "tests", "tests_note", "area", "area_note", "timing",
                         "timing_note", "doc"}
    assert main(["blocks", "agg_link"]) == 0
    text = capsys.readouterr().out
    for path in ("hw/agg_link.py", "sw/golden/agg_link.py", "sim/bench_agg_link.py",
                 "tests/amaranth/test_agg_link.py", "tests/cocotb/test_agg_link.py",
                 "docs/memory.md#aggregation-link", "aggregation links",
                 "elmoe3d.hw.agg_link:AggregationLink"):
        assert path in text, path
    assert main(["blocks", "board"]) == 0
    text = capsys.readouterr().out
    for what in ("elmoe3d.hw.board:BoardPlatformTop", "FPGA fmax",
                 "the board top's clock frequency (synth.fpga.parse_report)"):
        assert what in text, what
    assert main(["blocks", "nope"]) == 2
    assert "no block or top Component class 'nope'" in capsys.readouterr().err

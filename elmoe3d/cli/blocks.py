"""``elmoe3d blocks``: the block registry (:mod:`elmoe3d.blocks`) -- per block its RTL and top
class, golden model, cocotb bench, tests, area and timing categories and documentation, one
name in every folder.

Usage::

    elmoe3d blocks              # one table row per block (160 columns when not a terminal)
    elmoe3d blocks NAME         # one block: every path, notes where it departs from the names
    elmoe3d blocks [NAME] --json    # the same as JSON on standard output

Paths are repository-relative (``hw/agg_link.py``, ``sw/golden/agg_link.py``,
``sim/bench_agg_link.py``, ``tests/*/test_agg_link*.py``); the table gives them without the
folder its column header names (``agg_link.py`` under ``RTL hw/``), the top classes without
their module and the number of test files. The area categories are the ones ``elmoe3d synth``
reports (:func:`elmoe3d.blocks.area_categories`). An unknown ``NAME`` is a one-line error
(exit code 2).
"""

from __future__ import annotations

import json
import sys

from ..errors import UserError


def configure(parser) -> None:
    parser.add_argument("name", nargs="?", default=None, metavar="NAME",
                        help="one block, by name or by its top Component class (e.g. tile or "
                             "TensorTile; default: the table of every block)")
    parser.add_argument("--json", action="store_true",
                        help="print the registry as JSON instead of tables")


def _rel(path) -> str:
    from ..blocks import ROOT
    if path is None:
        return "-"
    try:
        return str(path.relative_to(ROOT)) + ("/" if path.is_dir() else "")
    except ValueError:
        return str(path)


def _module(mod) -> str:
    from ..blocks import module_file
    return _rel(module_file(mod)) if mod else "-"


def describe(b) -> dict:
    """Block ``b`` (a :class:`~elmoe3d.blocks.Block`) as plain data with its paths resolved."""
    from ..blocks import area_categories, timing_categories, timing_notes
    return {
        "name": b.name, "summary": b.summary,
        "rtl": [_module(m) for m in b.rtl],
        "tops": list(b.tops),
        "golden": [_module(m) for m in b.golden], "golden_note": b.golden_note,
        "bench": _module(b.bench) if b.bench else None, "bench_note": b.bench_note,
        "tests": b.tests(), "tests_note": b.tests_note,
        "area": area_categories(b), "area_note": b.area_note,
        "timing": timing_categories(b), "timing_note": timing_notes(b), "doc": b.doc,
    }


def run(args) -> int:
    from ..blocks import BLOCKS, block
    from .outputs import report_console
    if args.name is not None:
        try:
            chosen = [block(args.name)]
        except ValueError as exc:
            raise UserError(str(exc)) from None
    else:
        chosen = list(BLOCKS)
    rows = [describe(b) for b in chosen]
    if args.json:
        json.dump(rows[0] if args.name is not None else rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    console = report_console(min_width=160)
    if args.name is not None:
        _print_one(console, rows[0])
    else:
        _print_table(console, rows)
    return 0


def _mark(note) -> str:
    return "*" if note else ""


def _in(folder, paths) -> str:
    """``paths`` joined by ", ", each without the leading ``folder`` its column names (a path
    elsewhere stays whole); "-" for none."""
    return ", ".join(p[len(folder):] if p.startswith(folder) else p for p in paths) or "-"


def _print_table(console, rows) -> None:
    from rich.markup import escape
    from rich.table import Table
    table = Table(title="Blocks (elmoe3d.blocks): one name in hw/, sw/golden/, sim/, tests/",
                  title_justify="left",
                  caption="* a note (elmoe3d blocks NAME): departs from the naming convention, "
                          "or its area is not an elmoe3d synth category; tests: how many files; "
                          "timing: the category, what it checks in elmoe3d blocks NAME",
                  caption_justify="left")
    # (header, widest): lists wrap at ", " within their width; the doc anchor takes the rest
    for col, widest in (("block", None), ("RTL hw/", 16), ("top class", 16),
                        ("golden sw/golden/", 13), ("bench sim/", None), ("tests", None),
                        ("area", 17), ("timing", 11), ("doc docs/", None)):
        table.add_column(col, overflow="fold", max_width=widest,
                         justify="right" if col == "tests" else "left")
    for r in rows:
        table.add_row(
            r["name"], escape(_in("hw/", r["rtl"])),
            escape(", ".join(top.rpartition(":")[2] for top in r["tops"]) or "-"),
            escape(_in("sw/golden/", r["golden"])) + _mark(r["golden_note"]),
            escape(_in("sim/", [r["bench"]] if r["bench"] else [])) + _mark(r["bench_note"]),
            f"{len(r['tests'])}" + _mark(r["tests_note"]),
            escape(", ".join(r["area"]) or "-") + _mark(r["area_note"]),
            escape(", ".join(r["timing"]) or "-"),
            escape(_in("docs/", [r["doc"]])))
    console.print(table)


def _print_one(console, r) -> None:
    from rich.markup import escape
    from rich.table import Table
    table = Table(title=f"{r['name']}: {r['summary']}", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("where")

    def row(what, value, note=""):
        text = escape(value)
        if note:
            text += f"\n[italic]{escape(note)}[/]"
        table.add_row(what, text)

    row("RTL", "\n".join(r["rtl"]))
    row("top", "\n".join(r["tops"]) or "-")
    row("golden model", "\n".join(r["golden"]) or "-", r["golden_note"])
    row("bench", r["bench"] or "-", r["bench_note"])
    row("tests", "\n".join(r["tests"]) or "-", r["tests_note"])
    row("area", ", ".join(r["area"]) or "-", r["area_note"])
    row("timing", ", ".join(r["timing"]) or "-", r["timing_note"])
    row("doc", r["doc"])
    console.print(table)

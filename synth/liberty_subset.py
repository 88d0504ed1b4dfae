"""Generate the bundled Liberty subset (``synth/liberty/asap7_subset.lib.gz``) from the ASAP7
RVT TT NLDM Liberty files.

::

    python -m elmoe3d.synth.liberty_subset [--pdk DIR] [--out PATH] [--check]

``--pdk`` is the folder with the five ``asap7sc7p5t_*_RVT_TT_nldm_*.lib.gz`` files
(:data:`SOURCE_FILES`; default ``../shared/pdk/asap7`` beside the repository); ``--out`` the
file written (default: the bundled one, :data:`~elmoe3d.synth.liberty.BUNDLED_LIBERTY`);
``--check`` writes nothing and exits 1 when the bundled file differs from what the sources
give (the text, not the gzip bytes).

What it does, deterministically (the same sources give the same text, and the ``.gz`` is
written with no name and a zero time stamp):

* every cell of :data:`AREA_CELLS` (the cells the area flow maps to) and of
  :data:`TIMING_CELLS` (the drive strengths and buffers ABC's timing-driven mapping may also
  use, ``abc -D``: :mod:`elmoe3d.synth.flow`) is copied from its source file as it stands:
  pins and capacitances, every ``timing`` group (``cell_rise``, ``cell_fall``,
  ``rise_transition``, ``fall_transition``, the flip-flop's ``rising_edge`` clock-to-Q and
  ``setup_rising`` / ``hold_rising`` constraints), every ``internal_power`` group and every
  ``leakage_power`` value (in the source's unit, 1 pW);
* the ``area`` of each cell is the project's figure, the footprint of the published LEF
  (:data:`LEF_AREAS`, the same as before this file carried timing): the generator checks that
  the Liberty file states the same value and stops if it does not, so area estimates do not
  change;
* the library header (units, thresholds, operating conditions) is the sources' own, checked
  equal in all five files, and only the table templates the copied cells use are kept;
* the sources' BSD 3-Clause licence text and copyright, their origin and the SHA-256 of each
  decompressed source file head the output.

Raises :class:`SubsetError` (a :class:`~elmoe3d.errors.UserError`) naming the file and the cell
when a source is missing, a cell is not found or an area differs.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import re
import sys
from pathlib import Path

from ..errors import UserError
from .liberty import TIMING_ONLY_ATTR


__all__ = ["SOURCE_FILES", "AREA_CELLS", "TIMING_CELLS", "LEF_AREAS", "SubsetError",
           "generate", "write", "default_pdk"]


#: The source files (``../shared/pdk/asap7/``; README there) and the cells taken from each.
SOURCE_FILES = {
    "asap7sc7p5t_INVBUF_RVT_TT_nldm_220122.lib.gz": (
        "INVx1", "INVx2", "INVx3", "INVx4", "INVx6", "INVx8",
        "BUFx2", "BUFx3", "BUFx4", "BUFx6f", "BUFx8", "BUFx12f", "BUFx16f"),
    "asap7sc7p5t_SIMPLE_RVT_TT_nldm_211120.lib.gz": (
        "NAND2xp33", "NAND2xp5", "NAND2xp67", "NAND2x1", "NAND2x2",
        "NOR2xp33", "NOR2xp67", "NOR2x1", "NOR2x2",
        "AND2x2", "AND2x4",
        "NAND3xp33", "NAND3x1",
        "XOR2xp5", "XOR2x1", "XNOR2xp5", "XNOR2x1",
        "FAx1", "HAxp5"),
    "asap7sc7p5t_AO_RVT_TT_nldm_211120.lib.gz": ("AOI21xp33", "AOI21xp5", "AOI21x1"),
    "asap7sc7p5t_SEQ_RVT_TT_nldm_220123.lib.gz": ("DFFHQNx1",),
}

#: Suffix of every ASAP7 7.5-track regular-Vt cell name.
SUFFIX = "_ASAP7_75t_R"

#: The cells the area flow maps to (unchanged since the area-only subset), short names.
AREA_CELLS = ("INVx1", "NAND2xp33", "NOR2xp33", "AND2x2", "NAND3xp33", "XOR2xp5", "XNOR2xp5",
              "AOI21xp33", "FAx1", "HAxp5", "DFFHQNx1")

#: The other cells: larger drive strengths of the same functions and buffers, for ABC's
#: timing-driven mapping, buffering and sizing only (the area run does not use them).
TIMING_CELLS = tuple(c for cells in SOURCE_FILES.values() for c in cells
                     if c not in AREA_CELLS)

#: Cell footprints W x 0.27 um (um^2) of the published rev-28 LEF, with their sources, for the
#: cells of :data:`AREA_CELLS` (the figures of the area-only subset; ``docs/synth.md``).
LEF_AREAS = {
    "INVx1": (0.04374, "[LEF] MACRO INVx1_ASAP7_75t_R: SIZE 0.162 BY 0.27 (3 sites of 0.054 "
                       "um); the ASAP7 oa2area example output \"INVx1_ASAP7_75t_R 0.04374\" "
                       "agrees"),
    "NAND2xp33": (0.05832, "0.216 x 0.27, as quoted for ASAP7's smallest two-input NAND (the "
                           "gate-equivalent reference) in public ASAP7 flow documentation; the "
                           "same 4-site footprint as NOR2xp33 in [LEF]"),
    "NOR2xp33": (0.05832, "[LEF] MACRO NOR2xp33_ASAP7_75t_R: SIZE 0.216 BY 0.27"),
    "AND2x2": (0.08748, "[LEF] MACRO AND2x2_ASAP7_75t_R: SIZE 0.324 BY 0.27"),
    "NAND3xp33": (0.0729, "[LEF] MACRO NAND3xp33_ASAP7_75t_R: SIZE 0.27 BY 0.27"),
    "XOR2xp5": (0.13122, "[LEF] MACRO XOR2xp5_ASAP7_75t_R: SIZE 0.486 BY 0.27"),
    "XNOR2xp5": (0.13122, "[LEF] MACRO XNOR2xp5_ASAP7_75t_R: SIZE 0.486 BY 0.27"),
    "AOI21xp33": (0.0729, "[LEF] MACRO AOI21xp33_ASAP7_75t_R: SIZE 0.27 BY 0.27"),
    "FAx1": (0.20412, "[LEF] MACRO FAx1_ASAP7_75t_R: 0.756 BY 0.27 (its VDD/VSS rails span "
                      "0 .. 0.756)"),
    "HAxp5": (0.13122, "[LEF] MACRO HAxp5_ASAP7_75t_R: SIZE 0.486 BY 0.27"),
    "DFFHQNx1": (0.2916, "[LEF] MACRO DFFHQNx1_ASAP7_75t_R: SIZE 1.08 BY 0.27"),
}

#: Library-level attributes copied from the sources (checked equal in every file).
_HEADER_ATTRS = (
    "delay_model", "capacitive_load_unit", "current_unit", "leakage_power_unit",
    "pulling_resistance_unit", "time_unit", "voltage_unit", "voltage_map",
    "default_cell_leakage_power", "default_fanout_load", "default_output_pin_cap",
    "input_threshold_pct_fall", "input_threshold_pct_rise", "nom_process", "nom_temperature",
    "nom_voltage", "output_threshold_pct_fall", "output_threshold_pct_rise",
    "slew_derate_from_library", "slew_lower_threshold_pct_fall",
    "slew_lower_threshold_pct_rise", "slew_upper_threshold_pct_fall",
    "slew_upper_threshold_pct_rise", "default_operating_conditions")
#: Header groups copied whole (checked equal in every file).
_HEADER_GROUPS = ("operating_conditions", "input_voltage", "output_voltage")
#: The largest input transition of every table (ps): ``default_max_transition`` of the subset
#: (the sources say 320 or 4000; 320 is the tables' last index).
MAX_TRANSITION = 320

_LIBRARY_NAME = "elmoe3d_asap7sc7p5t_rvt_tt_subset"
_ORIGIN = ("The-OpenROAD-Project/asap7sc7p5t_28, folder LIB/NLDM, commit f970bd3 (7z archives "
           "there; the same files gzip-compressed in ../shared/pdk/asap7/, README.md)")


class SubsetError(UserError):
    """A source file or cell is missing, or an area differs; the message names them."""


def default_pdk() -> Path:
    """``../shared/pdk/asap7`` beside the repository holding this package."""
    return Path(__file__).resolve().parent.parent.parent / "shared" / "pdk" / "asap7"


# ---- raw text access ------------------------------------------------------------------------

def _group_end(text: str, brace: int, where: str) -> int:
    """Index just past the ``}`` closing the ``{`` at ``brace`` (comments and strings of the
    Liberty files hold no braces; checked by the balanced count at the end)."""
    depth = 0
    for m in re.compile(r"[{}]").finditer(text, brace):
        depth += 1 if m.group() == "{" else -1
        if depth == 0:
            return m.end()
    raise SubsetError(f"{where}: unbalanced braces")


def _top_groups(text: str, kind: str, where: str) -> dict:
    """``name -> text`` of the library-level groups ``kind (name) { ... }``."""
    out = {}
    for m in re.finditer(rf"^  {kind} \(([^)]*)\) \{{", text, re.M):
        out[m.group(1).strip()] = text[m.start():_group_end(text, m.end() - 1, where)]
    return out


def _header_attr(text: str, name: str, where: str) -> str:
    """Every line of library attribute ``name`` (a complex one such as ``voltage_map`` may
    repeat), as ``  name : value;`` or ``  name (args);``."""
    found = re.findall(rf"^  {name}\s*(:\s*[^;\n]*;|\([^)]*\)\s*;)", text, re.M)
    if not found:
        raise SubsetError(f"{where}: no library attribute {name}")
    return "\n".join(f"  {name} {v}" for v in found)


_COPYRIGHT = re.compile(r"^Copyright .*?University$", re.M | re.S)


def _licence(text: str, where: str) -> str:
    m = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    if not m or "BSD 3-Clause" not in m.group(1):
        raise SubsetError(f"{where}: no BSD 3-Clause licence comment at the top")
    return m.group(1).strip("\n")


def _read(pdk: Path, name: str) -> str:
    path = pdk / name
    if not path.is_file():
        raise SubsetError(f"{path}: no such file (--pdk names the folder of the ASAP7 "
                          f"NLDM Liberty files)")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise SubsetError(f"{path}: cannot read it ({exc})") from None


# ---- the subset -----------------------------------------------------------------------------

_AREA_LINE = re.compile(r"^([ \t]*)area\s*:\s*([^;\n]+);?[ \t]*$", re.M)
_TEMPLATE_USE = re.compile(r"^\s*\w+ \((\w+)\) \{", re.M)


def generate(pdk: Path | None = None) -> str:
    """The subset's text from the source files in ``pdk`` (default :func:`default_pdk`)."""
    pdk = Path(pdk) if pdk is not None else default_pdk()
    texts = {name: _read(pdk, name) for name in SOURCE_FILES}
    first_name = next(iter(texts))
    first = texts[first_name]
    # header: attributes, groups and licence equal in every source
    header = [_header_attr(first, a, pdk / first_name) for a in _HEADER_ATTRS]
    groups = {}
    for kind in _HEADER_GROUPS:
        for name, body in _top_groups(first, kind, pdk / first_name).items():
            groups[(kind, name)] = body
    licence = _licence(first, pdk / first_name)
    copyrights = []
    digests = {}
    for name, text in texts.items():
        where = pdk / name
        digests[name] = hashlib.sha256(text.encode()).hexdigest()
        for a, line in zip(_HEADER_ATTRS, header):
            if _header_attr(text, a, where) != line:
                raise SubsetError(f"{where}: library attribute {a} differs from "
                                  f"{first_name}: {_header_attr(text, a, where).strip()!r}")
        for (kind, gname), body in groups.items():
            if _top_groups(text, kind, where).get(gname) != body:
                raise SubsetError(f"{where}: {kind} ({gname}) differs from {first_name}")
        own = _licence(text, where)
        if _COPYRIGHT.sub("", own).split() != _COPYRIGHT.sub("", licence).split():
            raise SubsetError(f"{where}: licence text differs from {first_name}")
        line = " ".join(_COPYRIGHT.search(own).group(0).split())
        if line not in copyrights:
            copyrights.append(line)
    licence = _COPYRIGHT.sub("\n".join(copyrights), licence, count=1)
    # cells, verbatim but for the area line; the templates they use
    cells, templates = [], {}
    for name, wanted in SOURCE_FILES.items():
        text, where = texts[name], pdk / name
        file_templates = {}
        for kind in ("lu_table_template", "power_lut_template"):
            file_templates.update({n: b for n, b in _top_groups(text, kind, where).items()})
        found = _top_groups(text, "cell", where)
        for short in wanted:
            full = short + SUFFIX
            body = found.get(full)
            if body is None:
                raise SubsetError(f"{where}: cell {full} not found")
            body, note = _set_area(body, short, where)
            for t in sorted(set(_TEMPLATE_USE.findall(body))):
                if t not in file_templates:
                    continue                      # a group name, not a table template
                if t in templates and templates[t][1] != file_templates[t]:
                    raise SubsetError(f"{where}: template {t} differs from {templates[t][0]}")
                templates.setdefault(t, (name, file_templates[t]))
            role = "area and timing" if short in AREA_CELLS else "timing only"
            cells.append(f"  /* {full} ({role}), from {name}. {note} */\n{body}")
    out = io.StringIO()
    out.write(_preamble(licence, digests))
    out.write(f"library ({_LIBRARY_NAME}) {{\n")
    out.write("\n".join(header) + "\n")
    out.write(f"  default_max_transition : {MAX_TRANSITION};\n")
    out.write(f"  define ({TIMING_ONLY_ATTR}, cell, boolean);\n")
    for (kind, gname), body in groups.items():
        out.write(body + "\n")
    for t in sorted(templates):
        out.write(templates[t][1] + "\n")
    out.write("\n".join(cells) + "\n}\n")
    return out.getvalue()


def _set_area(body: str, short: str, where) -> tuple:
    """``body`` with its area line written as ``area : X;`` (the project's LEF figure for the
    area cells; the Liberty figure otherwise) and the note saying where X comes from."""
    m = _AREA_LINE.search(body)
    if not m:
        raise SubsetError(f"{where}: cell {short + SUFFIX}: no area")
    stated = float(m.group(2))
    if short in LEF_AREAS:
        area, source = LEF_AREAS[short]
        if abs(stated - area) > 1e-9:
            raise SubsetError(f"{where}: cell {short + SUFFIX}: area {stated} differs from the "
                              f"LEF footprint {area} used for area estimates")
        note = f"Area: {source}; the Liberty file states the same."
        text = f"{area:g}"
    else:
        note = "Area: as the Liberty file states it (the LEF footprint)."
        text = m.group(2).strip()
    line = f"    area : {text};"                 # (INVBUF's cells have it unindented, no ';')
    if short not in AREA_CELLS:
        line += f"\n    {TIMING_ONLY_ATTR} : true;"
    return body[:m.start()] + line + body[m.end():], note


def _preamble(licence: str, digests: dict) -> str:
    lines = [
        "/*",
        " * elmoe3d: the project's ASAP7 Liberty subset, for area, timing and power estimates.",
        " * Generated by `python -m elmoe3d.synth.liberty_subset` (synth/liberty_subset.py);",
        " * do not edit: regenerate it.",
        " *",
        " * Source: the ASAP7 7.5-track standard-cell library (asap7sc7p5t, regular-Vt \"R\"",
        " * cells; Clark et al., \"ASAP7: A 7-nm finFET predictive process design kit\",",
        " * Microelectronics Journal 53, 2016), its NLDM Liberty files at the typical corner,",
        " * 0.7 V, 25 C (time 1 ps, capacitance 1 fF, leakage 1 pW):",
        f" *   {_ORIGIN}.",
        " * Decompressed source files and their SHA-256:",
    ]
    for name, digest in digests.items():
        lines.append(f" *   {name[:-3]}  {digest}")
    lines += [
        " *",
        " * Every cell below is copied from its source file unchanged (pins, capacitances,",
        " * timing, internal power and leakage tables), but for its `area` line: the area cells",
        " * keep the footprint of the published rev-28 LEF the area-only subset used, checked",
        " * equal to the Liberty figure ([LEF] asap7sc7p5t_28_R_1x_220121a.lef, GitHub",
        " * LeeJaKang/asap7sc7p5t_28, LEF/IO_cell/asap7sc7p5t_28_R_1x_220121a_with_ANTENNA.lef,",
        " * commit 5a0651ae4049db5407424511e862ffabe08c880a). Cells marked \"timing only\" are",
        " * drive strengths and buffers for ABC's timing-driven mapping; area estimates do not",
        " * use them.",
        " *",
        " * FAx1 and HAxp5 have two outputs each, both inverted (CON = carry out inverted,",
        " * SN = sum inverted). ABC does not map multi-output cells: the area flow finds full and",
        " * half adders with Yosys `extract_fa` and maps them onto these cells with a generated",
        " * techmap (elmoe3d.synth.liberty.adder_techmap) before ABC runs.",
        " *",
        " * Licence of the source files, which applies to this file:",
        " *",
    ]
    lines += [(" * " + ln).rstrip() for ln in licence.splitlines()]
    lines += [" */", ""]
    return "\n".join(lines)


def write(text: str, out: Path) -> None:
    """``text`` to ``out``, gzip-compressed if the name ends in ``.gz`` (no name, time 0)."""
    out = Path(out)
    data = text.encode("utf-8")
    if out.suffix == ".gz":
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
            f.write(data)
        data = buf.getvalue()
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)


def main(argv=None) -> int:
    from .liberty import BUNDLED_LIBERTY, read_text
    parser = argparse.ArgumentParser(prog="python -m elmoe3d.synth.liberty_subset",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--pdk", type=Path, default=None,
                        help="folder of the ASAP7 NLDM .lib.gz files (default: "
                             "../shared/pdk/asap7 beside the repository)")
    parser.add_argument("--out", type=Path, default=BUNDLED_LIBERTY,
                        help="file to write (default: the bundled subset)")
    parser.add_argument("--check", action="store_true",
                        help="compare with --out instead of writing it (exit 1 if different)")
    args = parser.parse_args(argv)
    try:
        text = generate(args.pdk)
        if args.check:
            same = args.out.is_file() and read_text(args.out) == text
            print(f"{args.out}: {'up to date' if same else 'DIFFERS from the sources'}")
            return 0 if same else 1
        write(text, args.out)
    except UserError as exc:
        print(f"liberty_subset: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({len(text):,} characters, "
          f"{len(AREA_CELLS)} area cells + {len(TIMING_CELLS)} timing-only cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

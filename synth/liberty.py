"""A small reader for Liberty (``.lib``) cell libraries: cells, areas, pins and functions.

Enough of the format for area estimates and for checking a library before Yosys uses it:
groups ``name (args) { ... }``, simple attributes ``name : value ;``, complex attributes
``name (args) ;``, ``/* */`` and ``//`` comments, quoted strings and ``\\`` line continuations.
Timing, power and other groups are skipped.

:func:`read_liberty` raises :class:`LibertyError` (a :class:`~elmoe3d.errors.UserError`, so
the CLI prints it as one line) naming the file and what is wrong.

Boolean functions (``function : "..."``) are evaluated by :func:`eval_function` with the
Liberty operators ``!`` and postfix ``'`` (not), ``&``, ``*`` and juxtaposition (and), ``|``
and ``+`` (or), ``^`` (xor), parentheses and the constants 0 and 1. :func:`adder_techmap`
uses that to find full- and half-adder cells (two outputs: carry and sum, either polarity) by
their truth tables and writes the Yosys techmap that maps ``extract_fa``'s ``$fa`` cells onto
them.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError


__all__ = ["LibertyError", "Cell", "Liberty", "read_liberty", "eval_function",
           "truth_table", "adder_techmap", "BUNDLED_LIBERTY"]


#: The project's ASAP7 subset (areas from the published ASAP7 7.5-track LEF; sources in the
#: file).
BUNDLED_LIBERTY = Path(__file__).with_name("liberty") / "asap7_subset.lib"


class LibertyError(UserError):
    """The Liberty file cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Cell:
    """One library cell.

    Attributes
    ----------
    name : str
    area : float
        um^2 (the library's area unit).
    inputs : tuple of str
        Input pin names, in file order.
    outputs : dict
        Output pin name -> function string (``""`` if the pin has none).
    sequential : bool
        The cell has an ``ff`` or ``latch`` group.
    """

    name: str
    area: float
    inputs: tuple
    outputs: dict = field(default_factory=dict)
    sequential: bool = False


@dataclass(frozen=True)
class Liberty:
    """A parsed library: ``path``, ``name`` and ``cells`` (name -> :class:`Cell`)."""

    path: Path
    name: str
    cells: dict

    def area(self, cell_name: str) -> float:
        return self.cells[cell_name].area


# ---- tokenizer and group parser ---------------------------------------------------------------

_TOKEN = re.compile(r'''
    (?P<ws>[ \t\r\n]+|\\\n)
  | (?P<comment>/\*.*?\*/|//[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<punct>[(){}:;,])
  | (?P<word>[^ \t\r\n(){}:;,"]+)
''', re.VERBOSE | re.DOTALL)


def _tokens(text, path):
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise LibertyError(f"{path}:{line}: cannot read {text[pos:pos + 20]!r}")
        kind = m.lastgroup
        if kind not in ("ws", "comment"):
            value = m.group(kind)
            if kind == "string":
                value = value[1:-1].replace("\\\n", "")
            yield kind, value, line
        line += m.group(0).count("\n")
        pos = m.end()


class _Group:
    __slots__ = ("kind", "args", "attrs", "groups", "line")

    def __init__(self, kind, args, line):
        self.kind, self.args, self.line = kind, args, line
        self.attrs, self.groups = {}, []


def _parse(text, path):
    toks = list(_tokens(text, path))
    i = 0

    def expect(value):
        nonlocal i
        if i >= len(toks) or toks[i][1] != value:
            got = toks[i][1] if i < len(toks) else "end of file"
            line = toks[min(i, len(toks) - 1)][2] if toks else 1
            raise LibertyError(f"{path}:{line}: expected {value!r}, got {got!r}")
        i += 1

    def statement(parent):
        nonlocal i
        kind, name, line = toks[i]
        if kind not in ("word", "string"):
            raise LibertyError(f"{path}:{line}: expected a name, got {name!r}")
        i += 1
        if i < len(toks) and toks[i][1] == ":":
            i += 1
            parts = []
            while i < len(toks) and toks[i][1] not in (";", "}"):
                parts.append(toks[i][1])
                i += 1
            if i < len(toks) and toks[i][1] == ";":
                i += 1
            parent.attrs[name] = " ".join(parts)
            return
        expect("(")
        args = []
        while i < len(toks) and toks[i][1] != ")":
            if toks[i][1] != ",":
                args.append(toks[i][1])
            i += 1
        expect(")")
        if i < len(toks) and toks[i][1] == "{":
            i += 1
            group = _Group(name, args, line)
            while i < len(toks) and toks[i][1] != "}":
                statement(group)
            expect("}")
            parent.groups.append(group)
        else:
            if i < len(toks) and toks[i][1] == ";":
                i += 1
            parent.attrs.setdefault(name, " ".join(args))

    root = _Group("<root>", [], 1)
    while i < len(toks):
        statement(root)
    return root


def read_liberty(path) -> Liberty:
    """Parse ``path``; raises :class:`LibertyError` if it is missing, unreadable, has no
    ``library`` group or no cell, or if a cell has no area or one that is not a finite
    non-negative number (the message names the file, the line and the cell)."""
    path = Path(path)
    if not path.is_file():
        raise LibertyError(f"--liberty {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise LibertyError(f"--liberty {path}: cannot read it ({exc.strerror})") from None
    root = _parse(text, path)
    libs = [g for g in root.groups if g.kind == "library"]
    if not libs:
        raise LibertyError(f"--liberty {path}: not a Liberty file (no 'library (...) {{ }}' "
                           f"group)")
    lib = libs[0]
    cells = {}
    for g in lib.groups:
        if g.kind != "cell" or not g.args:
            continue
        name = g.args[0]
        if "area" not in g.attrs:
            raise LibertyError(f"{path}:{g.line}: cell {name}: no area (every cell needs one "
                               f"for the area estimate)")
        text = g.attrs["area"]
        try:
            area = float(text)
        except ValueError:
            raise LibertyError(f"{path}:{g.line}: cell {name}: area {text!r} is not a "
                               f"number") from None
        if not math.isfinite(area) or area < 0:
            raise LibertyError(f"{path}:{g.line}: cell {name}: area {text!r} is not a finite "
                               f"non-negative number")
        inputs, outputs = [], {}
        for pin in g.groups:
            if pin.kind != "pin" or not pin.args:
                continue
            direction = pin.attrs.get("direction", "")
            if direction == "input":
                inputs.append(pin.args[0])
            elif direction == "output":
                outputs[pin.args[0]] = pin.attrs.get("function", "")
        seq = any(sub.kind in ("ff", "latch", "ff_bank", "latch_bank") for sub in g.groups)
        cells[name] = Cell(name=name, area=area, inputs=tuple(inputs), outputs=outputs,
                           sequential=seq)
    if not cells:
        raise LibertyError(f"--liberty {path}: no cell in the library")
    return Liberty(path=path, name=lib.args[0] if lib.args else path.stem, cells=cells)


# ---- boolean functions ----------------------------------------------------------------------

_FTOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_\[\]\.]*)|(?P<const>[01])|"
                     r"(?P<op>[!'&*|+^()]))")


def eval_function(expr: str, values: dict) -> int:
    """Value (0 or 1) of the Liberty function ``expr`` with pin values ``values``.

    Precedence, highest first: ``!``/``'``, and (``&``, ``*``, juxtaposition), ``^``, or
    (``|``, ``+``). Raises :class:`LibertyError` for an unknown pin or a syntax error."""
    toks = []
    pos = 0
    expr = expr.strip()
    while pos < len(expr):
        m = _FTOKEN.match(expr, pos)
        if not m or m.end() == pos:
            if expr[pos:].strip() == "":
                break
            raise LibertyError(f"function {expr!r}: cannot read {expr[pos:]!r}")
        toks.append((m.lastgroup, m.group(m.lastgroup)))
        pos = m.end()
    i = 0

    def peek():
        return toks[i] if i < len(toks) else (None, None)

    def primary():
        nonlocal i
        kind, tok = peek()
        if tok == "!":
            i += 1
            return 1 - primary()
        if tok == "(":
            i += 1
            v = or_expr()
            if peek()[1] != ")":
                raise LibertyError(f"function {expr!r}: missing ')'")
            i += 1
        elif kind == "const":
            i += 1
            v = int(tok)
        elif kind == "name":
            i += 1
            if tok not in values:
                raise LibertyError(f"function {expr!r}: unknown pin {tok!r}")
            v = int(values[tok])
        else:
            raise LibertyError(f"function {expr!r}: unexpected {tok!r}")
        while peek()[1] == "'":
            i += 1
            v = 1 - v
        return v

    def and_expr():
        nonlocal i
        v = primary()
        while True:
            kind, tok = peek()
            if tok in ("&", "*"):
                i += 1
                v &= primary()
            elif kind in ("name", "const") or tok in ("!", "("):
                v &= primary()
            else:
                return v

    def xor_expr():
        nonlocal i
        v = and_expr()
        while peek()[1] == "^":
            i += 1
            v ^= and_expr()
        return v

    def or_expr():
        nonlocal i
        v = xor_expr()
        while peek()[1] in ("|", "+"):
            i += 1
            v |= xor_expr()
        return v

    v = or_expr()
    if i != len(toks):
        raise LibertyError(f"function {expr!r}: unexpected {toks[i][1]!r}")
    return v


def truth_table(cell: Cell, output: str) -> tuple:
    """Values of ``output`` for every input combination (inputs in pin order, the first pin
    the most significant bit of the row index)."""
    rows = []
    for bits in itertools.product((0, 1), repeat=len(cell.inputs)):
        rows.append(eval_function(cell.outputs[output], dict(zip(cell.inputs, bits))))
    return tuple(rows)


def _reference(fn, n):
    return tuple(fn(*bits) for bits in itertools.product((0, 1), repeat=n))


_MAJ3 = _reference(lambda a, b, c: int(a + b + c >= 2), 3)
_XOR3 = _reference(lambda a, b, c: a ^ b ^ c, 3)
_AND2 = _reference(lambda a, b: a & b, 2)
_XOR2 = _reference(lambda a, b: a ^ b, 2)


def _inv(table):
    return tuple(1 - v for v in table)


def _adder_roles(cell: Cell, n: int, carry, total):
    """``(carry_pin, carry_inverted, sum_pin, sum_inverted)`` if ``cell`` is an n-input adder."""
    if len(cell.inputs) != n or len(cell.outputs) != 2 or cell.sequential:
        return None
    roles = {}
    try:
        for pin in cell.outputs:
            table = truth_table(cell, pin)
            for role, ref in (("carry", carry), ("sum", total)):
                if table == ref:
                    roles[role] = (pin, False)
                elif table == _inv(ref):
                    roles[role] = (pin, True)
    except LibertyError:
        return None
    if set(roles) != {"carry", "sum"}:
        return None
    return (*roles["carry"], *roles["sum"])


def adder_techmap(lib: Liberty):
    """Yosys techmap (Verilog text) mapping ``$fa`` cells (from ``extract_fa``) onto the
    library's smallest full-adder cell and, for a constant-0 carry in, its smallest half adder
    (inverted outputs get an inverter); ``None`` if the library has no full adder. Cells that
    cannot be mapped are left to Yosys' generic techmap (``_TECHMAP_FAIL_``)."""
    def smallest(n, carry, total):
        found = [(c.area, c.name, r) for c in lib.cells.values()
                 if c.area == c.area and (r := _adder_roles(c, n, carry, total))]
        return min(found) if found else None

    fa = smallest(3, _MAJ3, _XOR3)
    if fa is None:
        return None
    ha = smallest(2, _AND2, _XOR2)

    def inst(entry, ins):
        _, name, (cpin, cinv, spin, sinv) = entry
        cell = lib.cells[name]
        conns = [f".{p}({s})" for p, s in zip(cell.inputs, ins)]
        conns += [f".{cpin}(c_raw)", f".{spin}(s_raw)"]
        return (f"    \\{name} cell ({', '.join(conns)});\n"
                f"    assign X = {'~' if cinv else ''}c_raw;\n"
                f"    assign Y = {'~' if sinv else ''}s_raw;\n")

    ha_branch = "  if (1) "
    if ha is not None:
        ha_branch = ("  if (_TECHMAP_CONSTMSK_C_ == 1 && _TECHMAP_CONSTVAL_C_ == 0) begin\n"
                     + inst(ha, ["A", "B"]) + "  end else ")
    return ("// generated by elmoe3d.synth.liberty.adder_techmap from "
            f"{lib.path.name}\n"
            "(* techmap_celltype = \"$fa\" *)\n"
            "module _elmoe3d_fa (A, B, C, X, Y);\n"
            "  parameter WIDTH = 1;\n"
            "  parameter _TECHMAP_CONSTMSK_C_ = 0;\n"
            "  parameter _TECHMAP_CONSTVAL_C_ = 0;\n"
            "  input [WIDTH-1:0] A, B, C;\n"
            "  output [WIDTH-1:0] X, Y;\n"
            "  wire c_raw, s_raw;\n"
            "  wire _TECHMAP_FAIL_ = WIDTH != 1 || (_TECHMAP_CONSTMSK_C_ == 1 && "
            "_TECHMAP_CONSTVAL_C_ == 1);\n"
            "  generate\n"
            + ha_branch + "begin\n" + inst(fa, ["A", "B", "C"]) + "  end\n"
            "  endgenerate\n"
            "endmodule\n")

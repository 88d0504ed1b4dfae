"""The spec of a design-space sweep (``elmoe3d sweep SPEC``, ``docs/sweep.md``): axes, sampling,
constraints and tasks, read from YAML or TOML and expanded into validated points.

A spec (YAML shown; TOML has the same keys)::

    name: pes-and-hb               # for reports and out/sweep-<name> (default: the file's
                                   # stem): any text without / \\ or NUL
    seed: 7                        # random / lhs sampling (default 0); printed
    base: paper-4gb                # the ArchConfig preset the config axes override
                                   # (default: paper-<hb> of the point's hb axis)
    sampling: grid                 # grid | random | lhs (Latin hypercube) over the config axes
    samples: 16                    # random / lhs: how many config points
    config:                        # ArchConfig / TileConfig fields (tile.rows, tile.lanes)
      pes: [16, 32]                #   a list: grid values, or choices when sampled
      wmem_bytes: {min: 16384, max: 65536}     # a range: random / lhs only (log: true)
    workload:                      # always a full grid, crossed with every config point
      model: [qwen3-30b-a3b, gpt-oss-20b]
      batch: [1, 16]
      scheme: [ar, elastic]        # ar, eagle, slm, quant, elastic
      depth: [8]                   # SD tree (default 7 x 8 verifying 34 nodes, TREE)
      width: [6]
      verify: [all]                # nodes verified a sequence: 1 .. depth x width, or all
                                   # (the default when depth or width is given, else 34)
      hb: [4gb, 8gb]               # the base preset paper-<hb> when `base` is not given
                                   # (any case, as elmoe3d paper --hb: 8GB is 8gb)
      zipf: [1.2]                  # expert-popularity Zipf exponent (default: paper_eval.ZIPF,
                                   # fitted for Table 3's models; others need one)
    models:                        # models beside the presets: name -> a Hugging Face
      my-moe: models/config.json   # config.json (relative to the spec), hf_config.py
    constraints:                   # expressions over the point's fields (the base preset's
                                   # overlaid with the point's), before ArchConfig; false drops it
      - "pes % pes_per_group == 0 and hb_bank_bytes * pes <= 8 * 2**30"
    tasks:
      perf: true                   # the whole-decoder perf model (default true)
      area: false                  # die area roll-up (Yosys): true, false or an expression
      timing: false                # the roll-up's worst register-to-register path (needs area)
      rtl: "pes == 16"             # the tensor tile's cocotb + Verilator bench on these points
      rtl_beats: 256               # length of the RTL throughput GEMM (beats)
                                   # (at least one of perf, area, timing, rtl must be on)

A spec file is UTF-8 text. Every point is validated before anything runs (:func:`expand`): an
unknown field or section, a value of the wrong type or a number that is not finite (checked
before the constraints see it), a configuration :class:`~elmoe3d.config.ArchConfig` rejects
(or, for points with a perf or area task, whose PE geometry it rejects), an unknown model or
scheme, a constraint that does not parse or names an unknown field: each is a line of a :class:`~elmoe3d.errors.UserError` naming the spec file, the field
and the point (the points' distinct mistakes each a line, the first point of each named). The
spec's own mistakes (an unknown key at any level, with the closest known names; a value of the
wrong form; a constraint that does not compile) are all found first, a line each
(:func:`parse_spec`); its points are checked once the spec itself has none.

Constraints and task expressions are a small expression language checked with :mod:`ast`
(:func:`compile_expr`), never ``eval``: numbers, strings, booleans, field names (``tile.rows``
included), ``+ - * / // % **`` (exponents at most 64, integer powers at most 4096 bits; ``*`` and
``**`` of numbers only), comparisons (chained, ``in``, ``not
in`` a list), ``and``, ``or``, ``not``, ``min``, ``max``, ``abs``.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import itertools
import json
import math
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...checks import close_names, did_you_mean, is_int
from ...config import PRESETS, ArchConfig, ConfigError, PEOptions, TileConfig, preset
from ...errors import UserError
from ...paths import read_utf8
from .paper_eval import HB_SIZES, TREE, ZIPF, ZIPF_MAX


__all__ = ["need", "SweepSpec", "Point", "load_spec", "parse_spec", "expand", "build_arch",
           "load_config", "read_table", "config_items", "CONFIG_FILE_KEYS", "TABLE_SUFFIXES",
           "dropped_text",
           "compile_expr", "TASKS",
           "CONFIG_FIELDS", "WORKLOAD_FIELDS", "SAMPLINGS", "SPEC_VERSION"]

#: Bumped when a point's results change meaning or its id its form (part of every point's id;
#: 3: the die by its fields, hb left out).
SPEC_VERSION = 3
#: Sampling methods of the config axes.
SAMPLINGS = ("grid", "random", "lhs")
#: Config fields a spec may sweep: every scalar ArchConfig field and the tile's shape.
CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(ArchConfig)
                      if f.name not in ("name", "tile", "hb", "ext", "iomem_split")) \
    + tuple(f"tile.{f.name}" for f in dataclasses.fields(TileConfig))
#: Workload axes and their defaults (``None``: derived per point, see :func:`expand`); the SD
#: tree's are :data:`~.paper_eval.TREE`'s; ``verify`` is a node count or ``"all"`` (every node
#: of the tree: the default when a spec gives ``depth`` or ``width`` but not ``verify``).
WORKLOAD_FIELDS = {"model": None, "batch": 1, "scheme": "elastic",
                   **dict(zip(("depth", "width", "verify"), TREE)), "hb": "4gb", "alpha": None,
                   "context": 1024, "zipf": None}
#: Config fields that make the HB capacity (:attr:`~elmoe3d.config.ArchConfig.hb_bytes`): a
#: point whose values change it has an empty ``hb`` (the ``hb_gb`` column has the capacity),
#: as does every point of a ``base:`` preset.
HB_FIELDS = ("pes", "hb_bank_bytes")
_TOP_KEYS = ("name", "seed", "base", "sampling", "samples", "config", "workload",
             "constraints", "tasks", "models")
_TASK_KEYS = {"perf": True, "area": False, "timing": False, "rtl": False, "rtl_beats": 256}
#: The tasks a point can run (the keys of ``tasks`` that are switches or expressions).
TASKS = ("perf", "area", "timing", "rtl")


@dataclass(frozen=True)
class Point:
    """One point of a sweep: ``index`` (its place in the spec's expansion), ``id`` (a hash of
    its fields and tasks: what a rerun finds finished), ``config`` (the swept config fields),
    ``workload``, ``tasks`` (``perf``, ``area``, ``timing``, ``rtl``: bools; ``rtl_beats``),
    ``base`` (the preset the config overrides), ``seed`` (the RTL bench's) and ``figures``
    (for a model of the spec's ``models:`` section, its :func:`~.hf_config.model_figures`:
    what a worker registers, the file being the client's; None for a preset)."""

    index: int
    id: str
    base: str
    config: dict
    workload: dict
    tasks: dict
    seed: int
    figures: dict | None = None

    def arch(self) -> ArchConfig:
        """The point's :class:`ArchConfig` (``base`` with the config fields replaced); raises
        :class:`~elmoe3d.config.ConfigError` naming the field."""
        return build_arch(self.base, self.config)

    def fields(self) -> dict:
        """Every named field of the point (config and workload), as constraints see them."""
        return {**self.config, **self.workload}

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.fields().items())


@dataclass
class SweepSpec:
    """A parsed spec (module docstring); ``path`` is the file it came from, for errors."""

    path: str
    name: str
    seed: int
    base: str | None
    sampling: str
    samples: int | None
    config: dict
    workload: dict
    constraints: list
    tasks: dict
    text_hash: str = ""
    raw: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)


def build_arch(base: str, config: dict) -> ArchConfig:
    """``preset(base)`` with the dotted ``config`` fields replaced (``tile.rows`` in the
    tile); raises :class:`~elmoe3d.config.ConfigError` naming the field (an unknown one among
    :data:`CONFIG_FIELDS`, or a value the configuration refuses)."""
    arch = preset(base)
    if not isinstance(config, dict):
        raise ConfigError(f"config: expected a table of fields, got {config!r}")
    for k in config:
        if k not in CONFIG_FIELDS:
            raise ConfigError(_unknown("config field", k, CONFIG_FIELDS))
    tile = {k.split(".", 1)[1]: v for k, v in config.items() if k.startswith("tile.")}
    top = {k: v for k, v in config.items() if not k.startswith("tile.")}
    if tile:
        top["tile"] = dataclasses.replace(arch.tile, **tile)
    # the DRAM rows are derived from the capacities again (a preset's are already set)
    top["hb"] = dataclasses.replace(arch.hb, rows=None)
    top["ext"] = dataclasses.replace(arch.ext, rows=None)
    # keep the preset's name: results name the base they came from
    return dataclasses.replace(arch, **top)


#: The keys of a configuration file (:func:`load_config`).
CONFIG_FILE_KEYS = ("base", "name", "config")
#: What a configuration's own name may hold: it names build folders (``build/pe_<name>-...``)
#: and the exported Verilog's modules (``elmoe3d_<class>_<name>``, ``-`` as ``_``).
_CONFIG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def _module_form(name: str) -> str:
    """``name`` as build folders and Verilog module names hold it (``-`` as ``_``), any case."""
    return name.replace("-", "_").lower()


def load_config(path) -> ArchConfig:
    """The configuration a file describes: a sweep spec's ``base`` preset with its ``config``
    fields replaced, one value each (``docs/sweep.md``; ``elmoe3d verilog``, ``synth`` and
    ``paper-pe`` take it as ``--config FILE``)::

        base: paper-4gb            # the preset the fields override (required)
        name: my-8x16              # the configuration's name (default: the file's stem)
        config:                    # CONFIG_FIELDS, one value each
          pes: 8
          tile: {rows: 8, lanes: 16}    # or tile.rows: 8
          wmem_bytes: 65536

    ``path``: a ``.yaml``, ``.yml`` or ``.toml`` file of UTF-8 text. Returns the
    :class:`~elmoe3d.config.ArchConfig` under the name, its PE checked buildable (the
    lanes and group rules of :attr:`~elmoe3d.config.ArchConfig.pe`). Raises
    :class:`UserError` naming the file and, a line each, every key, field or value it
    refuses (an unknown one with the closest known names; a list, as a sweep would take;
    a value of the wrong type; a name that is a preset's or no file-name-safe identifier),
    then a configuration :class:`~elmoe3d.config.ArchConfig` refuses."""
    raw, _ = read_table(path, "configuration")
    where = str(path)
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a table of {', '.join(CONFIG_FILE_KEYS)}")
    problems = [_unknown("key", k, CONFIG_FILE_KEYS, raw) + " (a configuration file; a "
                "sweep's workload and tasks go in a spec: elmoe3d sweep)"
                for k in raw if k not in CONFIG_FILE_KEYS]
    base = raw.get("base")
    if base is None:
        problems.append(f"base: missing; the preset the fields override, one of "
                        f"{', '.join(PRESETS)}")
    else:
        try:
            base = preset(base).name
        except ConfigError as exc:
            problems.append(f"base: {exc}")
            base = None
    name = raw.get("name", Path(path).stem)
    if not isinstance(name, str) or not _CONFIG_NAME.fullmatch(name):
        problems.append(f"name: expected letters, digits, - and _ (it names build folders "
                        f"and Verilog modules), got {name!r}"
                        + ("" if "name" in raw else " (the file's stem; give a name:)"))
    elif (twin := next((p for p in PRESETS if _module_form(p) == _module_form(name)),
                       None)) is not None:
        # build folders and module names write - as _ (pe_paper_4gb, elmoe3d_pe_paper_4gb)
        problems.append(f"name: {name!r} is a preset's"
                        + ("" if name.lower() == twin else
                           f" ({twin}: build folders and Verilog modules write - as _)")
                        + "; name the configuration otherwise")
    body = raw.get("config")
    body = {} if body is None else body             # "config:" alone: no field changed
    config = {}
    if not isinstance(body, dict):
        problems.append("config: expected a table of fields")
        body = {}
    for k, v, _ in config_items(body, problems.append):
        if k not in CONFIG_FIELDS:
            problems.append(f"config: {_unknown('field', k, CONFIG_FIELDS, body)}")
        elif isinstance(v, (list, dict)):
            problems.append(f"config.{k}: expected one value, got {v!r} (a list or range "
                            f"is a sweep's axis: elmoe3d sweep)")
        elif base is not None and (why := _type_problem(v, _field(_preset(base), k))):
            problems.append(f"config.{k}: {why}")
        else:
            config[k] = v
    if problems:
        raise UserError("\n".join(f"{where}: {p}" for p in problems))
    try:
        arch = dataclasses.replace(build_arch(base, config), name=name)
        arch.pe                                 # ConfigError if its PE cannot be built
    except ConfigError as exc:
        raise UserError(f"{where}: {exc}") from None
    return arch


# == the expression language ======================================================================

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
           ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_FUNCS = {"min": min, "max": max, "abs": abs}
_MAX_EXPONENT = 64
_MAX_POWER_BITS = 4096
#: How deep an expression's operators may nest or chain (``not not ... x``, ``-(-(...))``,
#: ``a + b + ...``): what the checker and the evaluator recurse through.
_MAX_DEPTH = 400
#: Points a spec may expand to (config points x the workload grid): above, a mistake (a
#: ``samples`` or grid that no machine finishes), refused before anything is built.
MAX_COMBINATIONS = 1_000_000


class ExprError(ValueError):
    """An expression does not parse, uses what the language has not, or names an unknown
    field; the message says which."""


def _name_of(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def compile_expr(text: str, names) -> "callable":
    """Check ``text`` against the expression language (module docstring) and the field
    ``names`` it may use; return ``fn(fields: dict) -> value``. Raises :class:`ExprError`."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"expected an expression (a string), got {text!r}")
    short = text if len(text) <= 60 else text[:57] + "..."
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"{short!r} does not parse ({exc.msg})") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"{short!r}: operators nested or chained more than {_MAX_DEPTH} "
                        f"deep") from None
    todo, deepest = [(tree, 0)], 0
    while todo:                                  # the depth, without recursing
        node, d = todo.pop()
        deepest = max(deepest, d)
        if deepest > _MAX_DEPTH:
            raise ExprError(f"{short!r}: operators nested or chained more than {_MAX_DEPTH} "
                            f"deep")
        todo.extend((c, d + 1) for c in ast.iter_child_nodes(node))
    names = set(names)

    def check(node):
        if isinstance(node, ast.Expression):
            return check(node.body)
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool)):
                raise ExprError(f"{text!r}: constant {node.value!r} is not allowed")
            return
        name = _name_of(node)
        if name is not None:
            if name in ("true", "false", "True", "False"):
                return
            if name not in names:
                raise ExprError(f"{text!r}: {_unknown('field', name, sorted(names))}")
            return
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                check(v)
            return
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
            return check(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            check(node.left)
            check(node.right)
            return
        if isinstance(node, ast.Compare) and all(type(o) in _CMPOPS for o in node.ops):
            check(node.left)
            for c in node.comparators:
                check(c)
            return
        if isinstance(node, (ast.List, ast.Tuple)):
            for e in node.elts:
                check(e)
            return
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _FUNCS and not node.keywords):
            for a in node.args:
                check(a)
            return
        raise ExprError(f"{text!r}: {type(node).__name__} is not allowed (only numbers, "
                        f"fields, arithmetic, comparisons, and/or/not, min/max/abs)")

    check(tree)

    def ev(node, env):
        if isinstance(node, ast.Expression):
            return ev(node.body, env)
        if isinstance(node, ast.Constant):
            return node.value
        name = _name_of(node)
        if name is not None:
            if name in ("true", "True"):
                return True
            if name in ("false", "False"):
                return False
            return env.get(name)
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                out = True
                for v in node.values:
                    out = ev(v, env)
                    if not out:
                        return out
                return out
            out = False
            for v in node.values:
                out = ev(v, env)
                if out:
                    return out
            return out
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand, env)
            return (not v) if isinstance(node.op, ast.Not) else (-v if isinstance(
                node.op, ast.USub) else +v)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left, env), ev(node.right, env)
            if isinstance(node.op, (ast.Mult, ast.Pow)) and (
                    isinstance(a, (str, list)) or isinstance(b, (str, list))):
                raise ExprError(f"{text!r}: {type(node.op).__name__.lower()} of a string or "
                                f"list is not allowed")
            if isinstance(node.op, ast.Pow) and isinstance(b, (int, float)) \
                    and abs(b) > _MAX_EXPONENT:
                raise ExprError(f"{text!r}: exponent {b} is larger than {_MAX_EXPONENT}")
            if isinstance(node.op, ast.Pow) and isinstance(a, int) and isinstance(b, int) \
                    and a.bit_length() * abs(b) > _MAX_POWER_BITS:
                raise ExprError(f"{text!r}: the power has more than {_MAX_POWER_BITS} bits")
            return _BINOPS[type(node.op)](a, b)
        if isinstance(node, ast.Compare):
            left = ev(node.left, env)
            for op, c in zip(node.ops, node.comparators):
                right = ev(c, env)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e, env) for e in node.elts]
        if isinstance(node, ast.Call):
            return _FUNCS[node.func.id](*[ev(a, env) for a in node.args])
        raise ExprError(f"{text!r}: cannot evaluate {type(node).__name__}")   # pragma: no cover

    def fn(fields: dict):
        try:
            return ev(tree, fields)
        except ExprError:
            raise
        except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
            raise ExprError(f"{text!r}: {exc}") from None
        except (MemoryError, RecursionError):
            raise ExprError(f"{text!r}: the value is too large to compute") from None
    fn.text = text
    return fn


def need(module: str):
    """Import ``module`` of the ``sweep`` extra, or raise :class:`UserError` saying how to
    install it."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"elmoe3d sweep needs {module.split('.')[0]}: pip install -e "
                        f"'.[sweep]' (make venv installs it)") from None


# == reading a spec ================================================================================

def load_spec(path) -> SweepSpec:
    """Read and check a spec file (``.yaml``, ``.yml`` or ``.toml``, UTF-8 text); raises
    :class:`UserError` naming the file (and the line, for a file that does not parse; the
    byte offset, for a file that is not UTF-8)."""
    raw, text = read_table(path, "spec")
    return parse_spec(raw, path=str(path), text=text)


#: The suffixes of a spec or configuration file (:func:`read_table`).
TABLE_SUFFIXES = (".yaml", ".yml", ".toml")


def read_table(path, what: str) -> tuple:
    """``(raw, text)`` of a YAML (``.yaml``, ``.yml``) or TOML file of UTF-8 text: what it
    parses to and its text. ``what`` names it in the errors ("spec", "configuration"), each a
    :class:`UserError` naming the file (and the line, for a file that does not parse; the byte
    offset, for a file that is not UTF-8); a key given twice in one table is refused."""
    path = Path(path)
    text = read_utf8(path, what)
    suffix = path.suffix.lower()
    if suffix == ".toml":
        import tomllib
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: not TOML ({exc})") from None
    elif suffix in (".yaml", ".yml"):
        yaml = need("yaml")
        try:
            raw = yaml.load(text, Loader=_unique_key_loader(yaml))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f", line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or exc
            if "given twice" in str(problem):
                raise UserError(f"{path}{where}: {problem}") from None
            raise UserError(f"{path}{where}: not YAML ({problem})") from None
    else:
        raise UserError(f"{path}: expected a .yaml, .yml or .toml {what}, got "
                        f"{suffix or 'no suffix'!r}")
    return raw, text


def _unique_key_loader(yaml):
    """PyYAML's SafeLoader refusing a key given twice in one mapping (PyYAML keeps the last:
    a second ``models:`` entry or ``workload:`` section would silently replace the first;
    TOML refuses them itself)."""
    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            keys = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if key in keys:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice in one table",
                        key_node.start_mark)
                keys.add(key)
            return super().construct_mapping(node, deep)
    return Loader


def _axis(spec_path, section, name, value, sampling):
    """An axis: a non-empty list, or a ``{min, max[, log]}`` range (sampled only)."""
    where = f"{spec_path}: {section}.{name}"
    if isinstance(value, list):
        if not value:
            raise UserError(f"{where}: expected a non-empty list of values")
        for v in value:
            if isinstance(v, (dict, list)):
                raise UserError(f"{where}: expected plain values, got {v!r}")
        return {"values": list(value)}
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"min", "max", "log"})
        if unknown or "min" not in value or "max" not in value:
            raise UserError(f"{where}: a range is {{min, max}} with an optional log: true, "
                            f"got {value!r}")
        lo, hi = value["min"], value["max"]
        for bound in (lo, hi):
            if not isinstance(bound, (int, float)) or isinstance(bound, bool) \
                    or not math.isfinite(bound):
                raise UserError(f"{where}: range bounds must be finite numbers, got {bound!r}")
        if lo > hi:
            raise UserError(f"{where}: min {lo} is larger than max {hi}")
        log = value.get("log", False)
        if not isinstance(log, bool) or (log and lo <= 0):
            raise UserError(f"{where}: log must be true or false, and needs min > 0")
        if section == "workload" or sampling == "grid":
            raise UserError(f"{where}: a range needs sampling random or lhs over the config "
                            f"axes (workload axes and grids take lists)")
        return {"min": lo, "max": hi, "log": log,
                "int": isinstance(lo, int) and isinstance(hi, int)}
    return {"values": [value]}                      # a single value


def parse_spec(raw, *, path: str = "<spec>", text: str = "") -> SweepSpec:
    """Check the structure of a spec already read into ``raw`` (a dict): sections, field
    names, axis forms, sampling, ``name``, ``workload.hb`` (any case), tasks (at least one
    selected), the expressions' syntax and names.

    Every independent mistake is found, each a line of one error as :func:`expand`'s points'
    (:func:`_note`, at most :data:`MAX_MISTAKES`): each unknown section, field or task (with
    the closest known names, :func:`_unknown`), each value of the wrong form, each constraint
    that does not compile. A check that would only repeat another mistake is left out:
    ``samples`` after a bad ``sampling``; a missing ``workload.model`` when the workload
    section is not a table, its ``model`` has a mistake or an unknown key is close to it (the
    likely typo); "no task selected" when a task has a mistake or an unknown task key is close
    to a task. Raises :class:`UserError` naming ``path`` and the key of each mistake."""
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a table of sections ({', '.join(_TOP_KEYS)})")
    problems = {}

    def note(message):
        _note(problems, UserError(f"{path}: {message}"), path)
    meant = set()                  # the known names an unknown key is close to: likely typos
    for key in raw:
        if key not in _TOP_KEYS:
            note(_unknown("section", key, _TOP_KEYS, raw))
            meant.update(close_names(key, _TOP_KEYS, raw))
    sampling = raw.get("sampling", "grid")
    if sampling not in SAMPLINGS:
        note(f"sampling: expected one of {', '.join(SAMPLINGS)}, got {sampling!r}")
        sampling = None                             # samples are not checked against it
    samples = raw.get("samples")
    if sampling == "grid":
        if samples is not None:
            note("samples: only with sampling random or lhs")
    elif sampling is None:
        pass
    elif samples is None:
        note(f"samples: missing; sampling {sampling} needs it (how many config points, a "
             f"positive integer)")
    elif not is_int(samples, numpy=False) or not 1 <= samples <= MAX_COMBINATIONS:
        note(f"samples: sampling {sampling} needs a positive integer up to "
             f"{MAX_COMBINATIONS:,}, got {samples!r}")
    seed = raw.get("seed", 0)
    if not is_int(seed, numpy=False) or seed < 0:
        note(f"seed: expected a non-negative integer, got {seed!r}")
    base = raw.get("base")
    if base is not None:
        try:
            preset(base)
        except ConfigError as exc:
            note(f"base: {exc}")
    name = Path(path).stem
    if "name" in raw:
        try:
            name = _name(raw["name"], path)
        except UserError as exc:
            _note(problems, exc, path)
    config, workload = {}, {}
    bodies = {}
    for section, known, out in (("config", CONFIG_FIELDS, config),
                                ("workload", tuple(WORKLOAD_FIELDS), workload)):
        body = bodies[section] = raw.get(section, {}) or {}
        if not isinstance(body, dict):
            note(f"{section}: expected a table of fields")
            continue
        for k, v, items in config_items(body, note, nested=section == "config"):
            if k not in known:
                given = [g for g, _ in items] + list(body)
                note(f"{section}: {_unknown('field', k, known, given)}")
                meant.update(f"{section}.{c}" for c in close_names(k, known, given))
                continue
            try:
                out[k] = _axis(path, section, k, v, sampling)
            except UserError as exc:
                _note(problems, exc, path)
    if "hb" in workload:
        hbs = []
        for v in workload["hb"]["values"]:
            try:
                hbs.append(_hb(v, path))
            except UserError as exc:
                _note(problems, exc, path)
        workload["hb"] = {"values": hbs}
    models = _models(raw.get("models"), path, problems)
    wbody = bodies["workload"]
    if isinstance(wbody, dict) and "model" not in wbody \
            and not meant & {"workload", "workload.model"}:
        note("workload.model: expected at least one model (a preset or a name of models:)")
    if base is not None and isinstance(wbody, dict) and "hb" in wbody:
        note("workload.hb: picks the base preset paper-<hb>; give it or base, not both")
    names = list(config) + list(WORKLOAD_FIELDS) + [f for f in CONFIG_FIELDS if f not in config]
    constraints = raw.get("constraints", []) or []
    if isinstance(constraints, str):
        constraints = [constraints]
    compiled = []
    if not isinstance(constraints, list):
        note("constraints: expected a list of expressions")
        constraints = []
    for i, c in enumerate(constraints):
        try:
            compiled.append(compile_expr(c, names))
        except ExprError as exc:
            note(f"constraints[{i}]: {exc}")
    tasks_raw = raw.get("tasks", {}) or {}
    tasks_sound = True                      # every task key known and its value of its form
    if not isinstance(tasks_raw, dict):
        note(f"tasks: expected a table ({', '.join(_TASK_KEYS)})")
        tasks_raw, tasks_sound = {}, False
    for key in tasks_raw:
        if key not in _TASK_KEYS:
            note(f"tasks: {_unknown('task', key, _TASK_KEYS, tasks_raw)}")
            tasks_sound = tasks_sound and \
                not set(close_names(key, _TASK_KEYS, tasks_raw)) & set(TASKS)
    tasks = {}
    for key, default in _TASK_KEYS.items():
        v = tasks_raw.get(key, default)
        if key == "rtl_beats":
            if not is_int(v, numpy=False) or v < 1:
                note(f"tasks.rtl_beats: expected a positive integer, got {v!r}")
            tasks[key] = v
        elif key == "perf":
            if not isinstance(v, bool):
                note(f"tasks.perf: expected true or false, got {v!r}")
                tasks_sound = False
            tasks[key] = v
        elif isinstance(v, bool):
            tasks[key] = v
        else:
            try:
                tasks[key] = compile_expr(v, names)
            except ExprError as exc:
                note(f"tasks.{key}: {exc}")
                tasks_sound = False
    if tasks_sound and not any(tasks[k] for k in TASKS):
        note("tasks: no task selected (perf is false and area, timing and rtl are not given "
             "or false); a point would compute nothing")
    if problems:
        raise UserError(_problems_text(problems))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16] if text else ""
    return SweepSpec(path=path, name=str(name), seed=seed, base=base, sampling=sampling,
                     samples=samples, config=config, workload=workload,
                     constraints=compiled, tasks=tasks, text_hash=digest, raw=raw,
                     models=models)


def config_items(body: dict, note, *, nested: bool = True):
    """``(field, value, items)`` of a spec's or configuration file's ``config`` table, a
    ``tile: {rows: 8}`` table as ``tile.rows`` (``nested``; ``items``: the pairs the key gave,
    for the did-you-mean of an unknown one). A field given in both forms (YAML and TOML refuse
    a key twice in one table, not across the two) is a mistake, ``note(message)``, and left
    out."""
    seen = set()
    for key, value in body.items():
        items = [(f"tile.{k}", v) for k, v in value.items()] \
            if nested and key == "tile" and isinstance(value, dict) else [(key, value)]
        for k, v in items:
            if k in seen:
                note(f"config.{k}: given twice (tile: {{{k.split('.', 1)[1]}: ...}} and {k}); "
                     f"give it once")
                continue
            seen.add(k)
            yield k, v, items


def _unknown(what: str, key, known, given=()) -> str:
    """``unknown <what> 'key'`` with the closest names of ``known`` the section does not
    already give when any is close (:func:`~elmoe3d.checks.close_names`: ``(did you mean
    'pes'?)``) and every known one: a spec's mistake."""
    return f"unknown {what} {key!r}{did_you_mean(key, known, given)}; known: " \
        f"{', '.join(map(str, known))}"


#: Characters a spec's ``name`` may not hold: it names the folder ``out/sweep-<name>``, and
#: these would put it elsewhere (path separators) or cannot be in a file name (NUL).
_NAME_FORBIDDEN = ("/", "\\", "\0")


def _name(name, path: str) -> str:
    """The spec's ``name``: text (YAML may read a bare date as one: taken as its text)
    without a path separator or NUL; it names the default out folder ``out/sweep-<name>``.
    Raises :class:`UserError` naming ``path``; a number or boolean asks to be quoted (YAML
    reads ``1.10`` as 1.1 and ``on`` as true)."""
    import datetime
    if isinstance(name, (datetime.date, datetime.datetime)):
        name = name.isoformat()
    if not isinstance(name, str):
        kind = {bool: "a boolean", int: "an integer", float: "a number", list: "a list",
                dict: "a mapping", type(None): "nothing"}.get(type(name),
                                                                      f"a {type(name).__name__}")
        raise UserError(f"{path}: name: expected text, got {json.dumps(name, default=str)} "
                        f"(YAML read it as {kind}: quote it)")
    bad = [c for c in _NAME_FORBIDDEN if c in name]
    if not name.strip() or bad:
        raise UserError(f"{path}: name: expected text without / \\ or NUL (it names the "
                        f"folder out/sweep-<name>), got {name!r}")
    return name


def _hb(value, path: str) -> str:
    """A ``workload.hb`` value as ``elmoe3d paper --hb`` takes it: one of its choices
    (:data:`elmoe3d.cli.paper.CHOICES`), in any case (``8GB`` is ``8gb``). Raises
    :class:`UserError` naming ``path``, the value and the choices."""
    from ...cli.paper import CHOICES
    text = value.lower() if isinstance(value, str) else value
    if text not in CHOICES["hb"]:
        raise UserError(f"{path}: workload.hb: expected one of {', '.join(CHOICES['hb'])} "
                        f"(any case), got {value!r}")
    return text


def _models(body, path: str, problems: dict) -> dict:
    """The ``models:`` section: name -> ``config.json`` path (relative to the spec's folder),
    each read by :func:`~.hf_config.model_from_config` and registered in this process;
    ``{name: figures}`` (:func:`~.hf_config.model_figures`) of the entries without a mistake.
    Each mistake (the section not a table, an entry's path, file or name) is recorded in
    ``problems`` (:func:`_note`, naming ``path`` and the entry), the other entries read on."""
    from .hf_config import load_model, model_figures
    if body is None:
        return {}
    if not isinstance(body, dict):
        _note(problems, UserError(f"{path}: models: expected a table of name: config.json "
                                  f"path"), path)
        return {}
    folder = Path(path).parent if path != "<spec>" else Path.cwd()
    out = {}
    for name, file in body.items():
        try:
            if not isinstance(file, str) or not file:
                raise UserError(f"{path}: models.{name}: expected the path of a config.json, "
                                f"got {file!r}")
            where = folder / Path(file).expanduser()
            later = list(body)[list(body).index(name) + 1:]     # a pair is one mistake
            other = next((n for n in later if str(n).strip().lower()
                          == str(name).strip().lower()), None)
            if other is not None:
                raise UserError(f"{path}: models.{name}: the same name as models.{other} "
                                f"(names are kept lower case)")
            try:
                key = load_model(where, name=str(name))
            except UserError as exc:
                raise UserError(f"{path}: models.{name}: {exc}") from None
            out[key] = model_figures(key)
        except UserError as exc:
            _note(problems, exc, path)
    return out


# == expansion =====================================================================================

def _sample(axis, u):
    """The value of ``axis`` at the unit-interval coordinate ``u``."""
    if "values" in axis:
        vals = axis["values"]
        return vals[min(int(u * len(vals)), len(vals) - 1)]
    lo, hi = axis["min"], axis["max"]
    if axis["log"]:
        x = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
    else:
        x = lo + u * (hi - lo)
    if axis["int"]:
        return int(min(max(round(x), lo), hi))
    return float(x)


def _config_points(spec: SweepSpec) -> list:
    names = list(spec.config)
    if not names:
        return [{}]
    if spec.sampling == "grid":
        return [dict(zip(names, combo))
                for combo in itertools.product(*(spec.config[n]["values"] for n in names))]
    rng = np.random.default_rng(spec.seed)
    n = spec.samples
    if spec.sampling == "random":
        u = rng.random((n, len(names)))
    else:                                           # Latin hypercube: one sample a stratum
        u = np.empty((n, len(names)))
        for j in range(len(names)):
            u[:, j] = (rng.permutation(n) + rng.random(n)) / n
    return [{name: _native(_sample(spec.config[name], u[i, j]))
             for j, name in enumerate(names)} for i in range(n)]


def _native(v):
    return v.item() if isinstance(v, np.generic) else v


def point_id(base, config, workload, tasks, seed, figures=None) -> str:
    """A point's id: SHA-256 (16 hex digits) of everything its results depend on (the caller
    leaves out what they do not: :func:`expand`); ``base`` the die's fields (a dict; a
    preset's name in the ids of earlier versions); a model's ``figures`` when it is one of
    the spec's ``models:``."""
    body = {"v": SPEC_VERSION, "base": base, "config": config, "workload": workload,
            "tasks": tasks, "seed": seed}
    if figures is not None:
        body["figures"] = figures
    body = json.dumps(body, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


class _WorkloadError(ValueError):
    """A workload value a point cannot run; ``field`` names it."""

    def __init__(self, field_name, message):
        super().__init__(message)
        self.field = field_name


def _workload_problems(w) -> list:
    """The mistakes of one point's workload values, each value on its own (a known model and
    scheme, positive integers, an exponent, a rate, an HB size): :class:`_WorkloadError` for
    each, none left out for another (a spec's every mistake is named)."""
    from .decoder import DECODER_SHAPES
    from .paper_eval import MAX_TREE, SCHEMES
    out = []
    if w["model"] not in DECODER_SHAPES:
        out.append(_WorkloadError("model", f"expected one of {', '.join(DECODER_SHAPES)} or a "
                                  f"model of the spec's models: section, got {w['model']!r}"
                                  f"{did_you_mean(w['model'], DECODER_SHAPES)}"))
    z = w["zipf"]
    if z is not None and (not isinstance(z, (int, float)) or isinstance(z, bool)
                          or not 0 <= z <= ZIPF_MAX):
        out.append(_WorkloadError("zipf", f"expected an exponent in [0, {ZIPF_MAX:g}], got "
                                  f"{z!r}"))
    if w["scheme"] not in ("ar",) + SCHEMES:
        out.append(_WorkloadError("scheme", f"expected one of ar, {', '.join(SCHEMES)}, got "
                                  f"{w['scheme']!r}"
                                  f"{did_you_mean(w['scheme'], ('ar',) + SCHEMES)}"))
    for k in ("batch", "depth", "width", "context"):
        v = w[k]
        if not is_int(v, numpy=False) or v < 1:
            out.append(_WorkloadError(k, f"expected a positive integer, got {v!r}"))
        elif k in ("depth", "width") and v > MAX_TREE:
            out.append(_WorkloadError(k, f"expected 1 .. {MAX_TREE} (paper_eval.MAX_TREE), "
                                      f"got {v!r}"))
    v, d, wd = w["verify"], w["depth"], w["width"]
    if w["scheme"] != "ar" and v != "all" and (not is_int(v, numpy=False) or v < 1):
        nodes = (f"1 .. depth x width = {d * wd}" if is_int(d, numpy=False)
                 and is_int(wd, numpy=False) and d >= 1 and wd >= 1 else "a positive number of")
        out.append(_WorkloadError("verify", f"expected all or {nodes} nodes, got {v!r}"))
    if w["hb"] not in HB_SIZES + (None,):
        out.append(_WorkloadError("hb", f"expected {' or '.join(HB_SIZES)}, got {w['hb']!r}"))
    a = w["alpha"]
    if a is not None and (not isinstance(a, (int, float)) or isinstance(a, bool)
                          or not 0 <= a < 1):
        out.append(_WorkloadError("alpha", f"expected a rate in [0, 1), got {a!r}"))
    return out


def _check_workload(w):
    """Check one point's workload values together, once each is right
    (:func:`_workload_problems`: the figures the model has for its model and scheme, a verify
    size within its tree); raise :class:`_WorkloadError`."""
    from .paper_eval import ALPHA_MODEL, TABLE3_4GB
    if w["zipf"] is None and w["model"] not in ZIPF:
        raise _WorkloadError("zipf", f"{w['model']} has no fitted Zipf exponent (paper_eval.ZIPF "
                             f"has Table 3's models): give workload.zipf")
    v, nodes = w["verify"], w["depth"] * w["width"]
    if w["scheme"] != "ar" and v != "all" and v > nodes:
        raise _WorkloadError("verify", f"expected all or 1 .. depth x width = {nodes} nodes, "
                             f"got {v!r}")
    if w["alpha"] is None and w["scheme"] not in ("ar", "elastic") \
            and w["model"] not in TABLE3_4GB:
        raise _WorkloadError("alpha", f"{w['model']} has no Table 3 alpha for {w['scheme']}: "
                             f"give workload.alpha")
    if w["alpha"] is None and w["scheme"] == "elastic" and w["model"] not in ALPHA_MODEL:
        raise _WorkloadError("alpha", f"{w['model']} has no fitted Elastic-SD alpha model "
                             f"(paper_eval.ALPHA_MODEL has Table 3's models): give "
                             f"workload.alpha")


def expand(spec: SweepSpec, counts: dict | None = None) -> list:
    """Every point of ``spec`` (config points x the workload grid), constraints applied,
    duplicates dropped (points equal in everything their results depend on: an AR point's
    alpha and SD tree, a perf point's bench seed and length do not count), each validated;
    a list of :class:`Point`. A combination whose task expressions are all false (``perf:
    false`` and ``rtl: "pes == 8"`` at 16 PEs) is no point: it would give a row without a
    figure. ``counts``, when given, gets ``constrained`` (combinations a constraint dropped),
    ``no_task`` (those with no task) and ``duplicates`` (combinations equal to an earlier
    point); :func:`dropped_text` words them. Raises
    :class:`UserError` with a line for each distinct mistake of the invalid points (the spec,
    the first point with it and the field; how many more points share it; at most
    :data:`MAX_MISTAKES` lines), or when no point is left or none has a task: nothing
    runs."""
    from .hf_config import loaded_models, model_figures
    counts = {} if counts is None else counts
    counts.update(constrained=0, no_task=0, duplicates=0)
    wnames = list(spec.workload)
    n_config = (spec.samples if spec.config and spec.sampling != "grid"
                else math.prod(len(a["values"]) for a in spec.config.values()))
    n = n_config * math.prod(len(a["values"]) for a in spec.workload.values())
    if n > MAX_COMBINATIONS:
        raise UserError(f"{spec.path}: {n:,} combinations (config points x the workload "
                        f"grid), more than {MAX_COMBINATIONS:,}: sample the config axes "
                        f"(sampling: random or lhs) or give fewer values")
    wgrid = [dict(zip(wnames, combo)) for combo in
             itertools.product(*(spec.workload[n]["values"] for n in wnames))]
    points, seen, problems = [], {}, {}
    combos = itertools.count()                  # a combination's place, for the mistakes' lines
    for cfg in _config_points(spec):
        for wl in wgrid:
            where, combo = spec.path, next(combos)
            try:
                workload = {**WORKLOAD_FIELDS, **wl}
                workload["model"] = str(workload["model"]).strip().lower()   # as names are kept
                for name in ("scheme", "verify"):           # AR is ar, All is all
                    if isinstance(workload[name], str):
                        workload[name] = workload[name].strip().lower()
                if "verify" not in wl and ("depth" in wl or "width" in wl):
                    workload["verify"] = "all"          # TREE's verify size is for its own tree
                base = spec.base or f"paper-{workload['hb']}"
                if spec.base:
                    workload["hb"] = None               # not paper-<hb>'s capacity: see hb_gb
                label = ", ".join(f"{k}={v}" for k, v in {**cfg, **wl}.items())
                where = f"{spec.path}: point {combo} ({label})"
                # the constraints see the preset's fields overlaid with the point's, before the
                # configuration is built: a constraint may drop a value ArchConfig would reject
                # (out of range, an impossible combination), but not one of the wrong type: that
                # is a mistake in the spec, named even where a constraint would drop its point
                # and each value's own mistakes (its type, a known name, a range) are all named,
                # none hidden by another of the point's
                fields = {f: _field(_preset(base), f) for f in CONFIG_FIELDS}
                mistakes = [f"{k}: {problem}" for k, v in cfg.items()
                            if (problem := _type_problem(v, fields[k]))]
                mistakes += [f"{exc.field}: {exc}" for exc in _workload_problems(workload)]
                if mistakes:
                    for m in mistakes:
                        _note(problems, UserError(f"{where}: {m}"), where, point=True,
                              ranged=_ranged_values(spec, cfg))
                    continue
                fields.update(cfg)
                fields.update(workload)
                keep = True
                for c in spec.constraints:
                    try:
                        keep = bool(c(fields))
                    except ExprError as exc:
                        raise UserError(f"{where}: constraint {exc}") from None
                    if not keep:
                        break
                if not keep:
                    counts["constrained"] += 1
                    continue
                try:
                    arch = build_arch(base, cfg)
                except ConfigError as exc:
                    raise UserError(f"{where}: {exc}{_bandwidth_hint(exc, base)}"
                                    f"{_range_hint(spec, base, cfg, exc)}") from None
                except TypeError as exc:                # dataclasses.replace on a bad name
                    raise UserError(f"{where}: {exc}") from None
                fields.update({f: _field(arch, f) for f in CONFIG_FIELDS})
                try:
                    _check_workload(workload)
                except _WorkloadError as exc:
                    raise UserError(f"{where}: {exc.field}: {exc}") from None
                tasks = {}
                for k, v in spec.tasks.items():
                    if callable(v):
                        try:
                            tasks[k] = bool(v(fields))
                        except ExprError as exc:
                            raise UserError(f"{where}: tasks.{k}: {exc}") from None
                    else:
                        tasks[k] = v
                if not any(tasks[k] for k in TASKS):
                    counts["no_task"] += 1
                    continue
                if tasks["timing"]:
                    tasks["area"] = True
                if tasks["area"] or tasks["perf"]:
                    try:        # the die's PE must exist to synthesise it and to calibrate
                        PEOptions(config=arch)          # the perf model's compute on it: the
                    except ValueError as exc:           # RTL PE's own checks (ConfigError too)
                        which = " and ".join(k for k in ("perf", "area") if tasks[k])
                        alone = "" if tasks["area"] else \
                            "; a sweep of the tile alone: tasks.perf false, tasks.rtl true"
                        raise UserError(f"{where}: {exc} (the PE of a {which} task{alone})") \
                            from None
                if workload["hb"] is not None and arch.hb_bytes != _preset(base).hb_bytes:
                    # the die's HB is not paper-<hb>'s (see hb_gb); the constraints and the
                    # tasks saw the spec's value
                    workload = {**workload, "hb": None}
                # what the results do not depend on is left out of the id, so that equal points
                # are one: an AR point has no SD tree or alpha, a point without the RTL task no
                # bench seed or length
                if workload["scheme"] == "ar":
                    workload = {**workload, "alpha": None, "depth": None, "width": None,
                                "verify": None}
                elif workload["verify"] == "all":       # one id for a tree's every node
                    workload = {**workload, "verify": workload["depth"] * workload["width"]}
                id_tasks = dict(tasks)
                seed = spec.seed
                if not tasks["rtl"]:
                    id_tasks.pop("rtl_beats", None)
                    seed = None
                if workload["zipf"] is None:              # the exponent the model runs with
                    workload = {**workload, "zipf": ZIPF[workload["model"]]}
                figures = spec.models.get(workload["model"])
                if figures is None and workload["model"] in loaded_models():
                    figures = model_figures(workload["model"])   # loaded before, this process
                # the die by its fields, not by the preset's name, and hb (a label) left out:
                # paper-8gb cut to 16 PEs is paper-4gb's die, one point
                die = {k: v for k, v in arch.to_dict().items() if k != "name"}
                pid = point_id(die, cfg, {k: v for k, v in workload.items() if k != "hb"},
                               id_tasks, seed, figures)
                if pid in seen:
                    counts["duplicates"] += 1
                    kept = points[seen[pid]]
                    if kept.workload["hb"] is None and workload["hb"] is not None:
                        # the die is a preset's: the point keeps its name (and base)
                        points[seen[pid]] = dataclasses.replace(
                            kept, base=base, workload={**kept.workload, "hb": workload["hb"]})
                    continue
                seen[pid] = len(points)
                points.append(Point(index=len(points), id=pid, base=base, config=dict(cfg),
                                    workload=workload, tasks=tasks, seed=spec.seed,
                                    figures=figures))
            except UserError as exc:             # named; the other points checked too
                _note(problems, exc, where, point=True, ranged=_ranged_values(spec, cfg))
    if problems:
        raise UserError(_problems_text(problems))
    if not points and counts["no_task"]:
        raise UserError(f"{spec.path}: tasks: no point has a task (perf is false and the "
                        f"expressions of area, timing and rtl are false at every point the "
                        f"constraints keep{dropped_text(counts)})")
    if not points:
        raise UserError(f"{spec.path}: no point left after the constraints"
                        f"{dropped_text(counts)}")
    return points


def dropped_text(counts: dict) -> str:
    """``counts`` of :func:`expand` in words, each with a leading comma, the zero ones left
    out: ``", 6 dropped by the constraints, 2 with no task"``."""
    return "".join(f", {n} {what}" for n, what in (
        (counts["constrained"], "dropped by the constraints"),
        (counts["no_task"], "with no task"),
        (counts["duplicates"], "equal to another point")) if n)


#: At most this many distinct mistakes are listed (:func:`expand`).
MAX_MISTAKES = 10


def _note(problems: dict, exc: UserError, where: str, *, point: bool = False,
          ranged: tuple = ()):
    """Record a mistake under its message without the point (one line a mistake, however
    many points, or places of the spec, share it): ``{message: [first line, count, point,
    other values]}``; ``point``: a point's mistake, else one of the spec itself; ``ranged``:
    the point's values drawn from a range (:func:`_ranged_values`), which are arbitrary, so
    the mistake is keyed with them left out (six sampled HB capacities that are not a
    power-of-two number of rows are one mistake, not six lines differing in a number); a
    listed value, or a number of the spec's own text, stays in the key."""
    text = str(exc)
    key = text[len(where):] if text.startswith(where) else text
    exact = key
    for v in sorted({str(v) for v in ranged}, key=len, reverse=True):
        key = re.sub(rf"(?<![\w.]){re.escape(v)}(?![\w.])", "#", key)
    if key in problems:
        problems[key][1] += 1
        problems[key][3] |= problems[key][4] != exact
    else:
        problems[key] = [text, 1, point, False, exact]


def _ranged_values(spec, cfg) -> tuple:
    """The values of the point ``cfg`` whose fields ``spec`` draws from a range."""
    return tuple(cfg[f] for f in _ranged_fields(spec, cfg))


def _ranged_fields(spec, cfg) -> list:
    """The fields of the point ``cfg`` that ``spec`` draws from a range (``{min:, max:}``)."""
    return [f for f in cfg if "min" in spec.config.get(f, {})]


def _problems_text(problems: dict) -> str:
    """One line a distinct mistake (its first point named; ``and N more points`` sharing it,
    or ``N times`` for a mistake the spec itself makes in several places), at most
    :data:`MAX_MISTAKES` of them."""
    def shared(n, point, other):
        if n == 1:
            return ""
        if not point:
            return f" ({n} times)"
        return (f" (and {n - 1} more point{'s' if n > 2 else ''}"
                f"{', other values of the range' if other else ''})")
    lines = [first + shared(n, point, other)
             for first, n, point, other, _ in list(problems.values())[:MAX_MISTAKES]]
    if len(problems) > MAX_MISTAKES:
        more = len(problems) - MAX_MISTAKES
        lines.append(f"... and {more} more distinct mistake{'s' if more > 1 else ''}")
    return "\n".join(lines)


def _range_hint(spec, base: str, cfg, exc) -> str:
    """What to do when a configuration refuses (``exc``) a point with a field drawn from a
    range: a range draws any value in it, and some fields take only some (the HB capacity a
    power-of-two number of rows, a tile shape that divides the width); ``""`` when no field of
    the point is a range, or when the point without its ranged values (the base preset's in
    their place) is refused for the same reason: then a listed value is wrong, not the range
    (``pes: 10`` beside a ranged clock). Decided by building the point so, not by the
    message's words (a per-channel capacity quotes neither the swept ``ext_bytes`` nor its
    name); a different refusal there (``pes: 6`` against the base's ``pes_per_group``, where
    the range drew 5) still gets the hint."""
    ranged = _ranged_fields(spec, cfg)
    if not ranged:
        return ""
    try:
        build_arch(base, {k: v for k, v in cfg.items() if k not in ranged})
    except Exception as other:          # advice only: never an error of its own
        if str(other) == str(exc):
            return ""
    return (f" ({', '.join(ranged)} drawn from a range, which takes any value in it: give "
            f"the values the configuration allows as a list, or drop the others with a "
            f"constraint)")


def _bandwidth_hint(exc, base) -> str:
    """What a sweep can do about ``ArchConfig``'s bandwidth check (``exc``): the HB bank's
    bandwidth is its DRAM timing's, which no sweep field changes; the EXT bandwidth is the
    channel count times the channel's peak (``docs/sweep.md``, Memory bandwidth). ``""`` for
    any other error."""
    text = str(exc)
    if text.startswith("hb_bank_gbps:"):
        return ("; a sweep cannot change the HB bandwidth: it is the bank's DRAM timing (hb), "
                "not a sweep field (docs/sweep.md, Memory bandwidth)")
    if text.startswith("ext_gbps:"):
        peak = _preset(base).ext.peak_gbps
        return (f"; to sweep the EXT bandwidth, list ext_gbps beside ext_channels and keep the "
                f"pairs that match with the constraint 'abs(ext_gbps - {peak:g} * "
                f"ext_channels) < 0.01' (docs/sweep.md, Memory bandwidth)")
    return ""


def _type_problem(value, default):
    """Why ``value`` cannot stand for a config field whose preset value is ``default`` (an
    integer field takes an integer, a number field an int or float; booleans neither; a
    finite one, as every such field is a positive number), in
    :class:`~elmoe3d.config.ArchConfig`'s words; ``None`` if it can."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "an integer" if isinstance(default, int) else "a number"
        return f"expected {kind}, got {value!r}"
    if isinstance(default, int) and not isinstance(value, int):
        return f"expected an integer, got {value!r}"
    if not math.isfinite(value):                # ArchConfig takes inf for a positive number
        return f"expected a finite number, got {value!r}"
    return None


def _preset(name, _cache={}):
    if name not in _cache:
        _cache[name] = preset(name)
    return _cache[name]


def _field(arch, name):
    if name.startswith("tile."):
        return getattr(arch.tile, name.split(".", 1)[1])
    return getattr(arch, name)

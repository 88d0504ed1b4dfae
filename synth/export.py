"""RTL export: the Verilog of the logic die, or of any block in it, at a configuration
(``elmoe3d verilog``, README "RTL export").

**The die's blocks** (:func:`die_blocks`). The die (:class:`~elmoe3d.hw.die.LogicDie`) is
built for an :class:`~elmoe3d.config.ArchConfig` and walked down: each block's direct children
that are registered blocks (a top class of :data:`elmoe3d.blocks.BLOCKS`) are found from its
elaboration alone (:func:`elmoe3d.synth.blocks.inventory`), one representative per distinct
instance (:func:`~elmoe3d.synth.blocks.instance_key`: its class and parameters), with how many
the die holds. A block whose area comes from a model (the tensor tile, 16,384 unit PEs at the
paper's size: :data:`~elmoe3d.synth.blocks.BLOCK_TYPES`) is not walked into; it has no
registered children. So every instance listed is one the die at that configuration builds,
with the parameters it builds it with.

**Flat** (:func:`flat_verilog`): one block and everything under it converted whole by Amaranth,
identical modules merged (:func:`elmoe3d.sim.runner.dedup_modules`), as ``make sim`` builds it.
Amaranth elaborates every instance: the small die is 7.1 MB in about 1 minute, the paper PE
10.8 MB in about 2.5 minutes and 2.4 GB, so the paper dies (16 and 32 of those PEs) are out of
reach flat.

**Hierarchical** (:func:`hierarchical_verilog`): one Verilog module per distinct block
instance, converted once, its registered children instantiated by module name
(``elmoe3d_<Class>_<10 hex digits of its key>``; the root takes the name asked for). Each
child's clock and reset ports (``clk``/``rst``, ``<domain>_clk``/``<domain>_rst``) are
connected to the parent's domain of that name. A child with 2^16 output bits or more (the
paper dies' streamline ring) is converted inside its parent's module, as Amaranth's
``Instance`` cannot drive that many (:data:`INSTANCE_OUTPUT_BITS`). A block that defines a
clock domain of its own and has children is refused (:class:`ExportError`: a child converted
alone would lose the domain's clock edge and reset kind); no block of the die defines one (the
FPGA board top does). Memories stay Amaranth's behavioural Verilog in both forms (no macros);
the module names of Amaranth's internal submodules are made plain identifiers in both
(:func:`plain_module_names`).
The paper-4gb die is then 64 modules, 13.0 MB in about 2.5 minutes and 1.25 GB. The two forms
are one design:
``tests/cocotb/test_export.py`` runs both of a block side by side in Verilator on random
inputs (:mod:`elmoe3d.sim.export_equivalence`).

Call both inside :func:`elmoe3d.hw.checked.inspection` (the walk elaborates blocks it does not
convert), as ``elmoe3d verilog`` (:mod:`elmoe3d.cli.verilog`) does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from amaranth.hdl import ClockSignal, Instance, Module, ResetSignal
from amaranth.lib.memory import Memory

from ..sim.runner import dedup_modules, module_ports
from .amaranth_internals import (module_domains, no_comb_cycle_check, replace_submodules,
                                 submodules)
from .blocks import (BLOCK_TYPES, component_ports, convert_ports, instance_key, instance_params,
                     inventory, short_key)


__all__ = ["ExportError", "DieBlock", "die_blocks", "block_classes", "module_name",
           "flat_verilog", "hierarchical_verilog", "plain_module_names", "INSTANCE_OUTPUT_BITS",
           "output_bits"]


class ExportError(ValueError):
    """A block the hierarchical form cannot export (it defines a clock domain and has
    children): export it flat."""


@dataclass
class DieBlock:
    """One distinct block instance of a die: ``obj`` its representative (a
    ``wiring.Component``), ``block`` its registry name (:data:`elmoe3d.blocks.BLOCKS`),
    ``count`` how many the die holds, ``params`` :func:`~elmoe3d.synth.blocks.instance_params`
    (attribute names without their leading underscore), ``children`` the keys of its distinct
    registered children with how many of each one instance holds, ``depth`` 0 for the die."""

    key: str
    obj: object
    block: str
    count: int
    depth: int
    params: dict
    children: dict = field(default_factory=dict)

    @property
    def cls(self) -> str:
        return type(self.obj).__name__


def block_classes() -> tuple:
    """Every registered class that imports: the blocks' top classes
    (:data:`elmoe3d.blocks.BLOCKS`) and the synthesis registry's
    (:data:`~elmoe3d.synth.blocks.BLOCK_TYPES`: the ring's stations too)."""
    from ..blocks import BLOCKS
    from .blocks import resolve
    paths = [top for b in BLOCKS for top in b.tops] + [bt.path for bt in BLOCK_TYPES]
    out = []
    for path in dict.fromkeys(paths):
        cls = resolve(path, optional=True)
        if cls is not None and cls not in out:
            out.append(cls)
    return tuple(out)


def _modelled() -> tuple:
    """The classes whose area is a model and which are not walked into (the tensor tile)."""
    return tuple(c for c in (bt.load() for bt in BLOCK_TYPES if bt.model) if c is not None)


def die_blocks(die) -> dict:
    """The distinct block instances of ``die`` (a built :class:`~elmoe3d.hw.die.LogicDie`, or
    any block), ``key -> DieBlock``, depth first in the order the RTL adds them (a block's
    children right after it), each with how many the die holds. Elaborates each distinct
    instance once (no conversion); call it inside :func:`~elmoe3d.hw.checked.inspection`."""
    from ..blocks import block_of_module
    classes, modelled = block_classes(), _modelled()
    found = {}

    def visit(obj, depth):
        key = instance_key(obj)
        if key in found:
            return
        b = block_of_module(type(obj).__module__)
        params = {k.lstrip("_"): v for k, v in instance_params(obj).items()}
        node = found[key] = DieBlock(key=key, obj=obj, block=b.name if b else "-", count=0,
                                     depth=depth, params=params)
        if isinstance(obj, modelled):
            return
        subs, _srams, _unelaborated = inventory(obj, owner=node.block, leaf_classes=classes)
        for sub_key, (rep, n) in subs.items():
            node.children[sub_key] = n
            visit(rep, depth + 1)

    visit(die, 0)
    counts = {}

    def count(key):                 # the sum over its parents: a block may sit under several
        if key not in counts:
            parents = [(p, n) for p in found.values() for k, n in p.children.items() if k == key]
            counts[key] = sum(count(p.key) * n for p, n in parents) if parents else 1
        return counts[key]

    for key, node in found.items():
        node.count = count(key)
    return found


def module_name(obj) -> str:
    """The Verilog module name of a child block in the hierarchical form:
    ``elmoe3d_<Class>_<short key>``, one per distinct instance."""
    return f"elmoe3d_{type(obj).__name__}_{short_key(instance_key(obj))}"


_ESCAPED_MODULE = re.compile(r"^module (\\\S+)\s", re.M)
_PLAIN_MODULE = re.compile(r"^module ([A-Za-z_][\w$]*)", re.M)


def plain_module_names(text: str) -> str:
    """``text`` with every escaped module name Amaranth gives an internal submodule
    (``\\elmoe3d_PE_1211f8f157.clear$2792``) made a plain identifier, each character outside
    ``[A-Za-z0-9_]`` an underscore (``elmoe3d_PE_1211f8f157_clear_2792``; a suffix ``_2``,
    ``_3``, ... where that name is taken), in its header and in every instantiation. Signal
    names are left as they are. Many ASIC tools and SDC scripts handle escaped module names
    poorly."""
    escaped = _ESCAPED_MODULE.findall(text)
    if not escaped:
        return text
    taken = set(_PLAIN_MODULE.findall(text))
    mapping = {}
    for name in escaped:
        base = re.sub(r"\W", "_", name[1:])
        new, n = base, 1
        while new in taken:
            n += 1
            new = f"{base}_{n}"
        taken.add(new)
        mapping[name] = new
    # an escaped name ends at the whitespace after it: whole names only
    pattern = re.compile("|".join(re.escape(e) + r"(?=\s)"
                                  for e in sorted(mapping, key=len, reverse=True)))
    return pattern.sub(lambda m: mapping[m.group(0)], text)


def flat_verilog(obj, *, name: str) -> str:
    """Verilog of block ``obj`` whole, top module ``name``, identical modules merged. Its ports
    are the block's signature members less the constant ones (an always-ready ``ready``), with
    ``clk`` and ``rst`` for its ``sync`` domain."""
    from amaranth.back import verilog
    return plain_module_names(dedup_modules(verilog.convert(obj, name=name, emit_src=False,
                                                            ports=convert_ports(obj))))


_DOMAIN_PORT = re.compile(r"^(?:(\w+)_)?(clk|rst)$")

#: Amaranth's netlist numbers a cell's output bits in 16 bits, so an ``Instance`` drives fewer
#: than this many (amaranth 0.5.10: an assertion fails beyond). A child block with more
#: output bits (the paper dies' streamline ring: 65,553 at paper-4gb, 131,105 at paper-8gb)
#: is converted inside its parent's module instead of as a module of its own.
INSTANCE_OUTPUT_BITS = 1 << 16


def output_bits(obj) -> int:
    """The output bits of block ``obj``'s module (its non-constant ``Out`` members)."""
    return sum(len(v) for d, _n, v in component_ports(obj) if d == "o")


def _own_module(sub, classes) -> bool:
    """Child ``sub`` becomes a module of its own in the hierarchical form."""
    return (isinstance(sub, classes) and not isinstance(sub, Memory)
            and output_bits(sub) < INSTANCE_OUTPUT_BITS)


def _child(module: str, obj, module_ports) -> Instance:
    """An ``Instance`` of a converted child block's module (put in the child's place, so it
    keeps the child's instance name): its signature's ports by name, and each clock or reset
    port of its module connected to the parent's domain of that name."""
    kwargs = {f"{d}_{n}": v for d, n, v in component_ports(obj)}
    for port in module_ports:
        hit = _DOMAIN_PORT.match(port)
        if f"i_{port}" in kwargs or f"o_{port}" in kwargs or hit is None:
            continue
        domain = hit.group(1) or "sync"
        kwargs[f"i_{port}"] = ClockSignal(domain) if hit.group(2) == "clk" \
            else ResetSignal(domain)
    zero = {n for n, (v, _d) in convert_ports(obj).items() if len(v) == 0}   # no wire
    missing = set(module_ports) - {k[2:] for k in kwargs} - zero
    if missing:
        raise ValueError(f"{module}: ports {sorted(missing)} are neither signature members "
                         f"nor clock or reset ports")
    return Instance(module, **kwargs)


def hierarchical_verilog(obj, *, name: str, progress=None) -> str:
    """Verilog of block ``obj`` as one module per distinct block instance (module
    docstring), top module ``name``; each module converted once, children before parents.
    ``progress(label)`` is called before each conversion. Raises :class:`ExportError` for
    a block that defines a clock domain and has children."""
    from amaranth.back import verilog
    classes = block_classes()
    done = {}                                     # key -> (module name, ports, text)

    def emit(block, module):
        key = instance_key(block)
        m = block.elaborate(None)
        while not isinstance(m, Module):
            m = m.elaborate(None)
        children = {}
        for _name, sub in submodules(m):
            if _own_module(sub, classes):
                children.setdefault(instance_key(sub), sub)
        domains = [cd.name for cd in module_domains(m)]
        if domains and children:
            raise ExportError(f"{type(block).__name__} ({module}) defines the clock "
                              f"domain(s) {', '.join(domains)}: its children, converted "
                              f"alone, would lose the clock edge and reset kind; export it "
                              f"flat")
        for sub_key, sub in children.items():
            if sub_key not in done:
                emit(sub, module_name(sub))

        def replace(_name, sub):
            if _own_module(sub, classes):
                child_module, ports, _text = done[instance_key(sub)]
                return _child(child_module, sub, ports)
            return None

        replace_submodules(m, replace)
        if progress is not None:
            progress(f"{type(block).__name__} ({module})")
        # Amaranth reads a block only through its elaborate(): the edited module is handed
        # back that way for this one conversion
        block.elaborate = lambda platform: m
        try:
            # the combinational-loop check takes minutes on a paper-size PE; Verilator's
            # and Yosys' own checks report loops in the exported text
            with no_comb_cycle_check():
                text = verilog.convert(block, name=module, emit_src=False,
                                       ports=convert_ports(block))
        finally:
            del block.elaborate
        text = dedup_modules(text)
        done[key] = (module, module_ports(text, module), text)

    emit(obj, name)
    return plain_module_names("".join(text for _module, _ports, text in done.values()))

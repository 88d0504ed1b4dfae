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
FPGA board top does). The module names of Amaranth's internal submodules are made plain
identifiers in both forms (:func:`plain_module_names`).

**SRAM macros** (``srams=``, ``elmoe3d verilog --sram macro``). Memories are Amaranth's
behavioural Verilog by default. In the macro form each RAM that the area roll-up calls an SRAM
macro (:func:`~elmoe3d.synth.blocks.is_sram_macro`) becomes an ``Instance`` of a module of its
kind (:class:`SramMacro`: geometry, ports, write granules, read-during-write), caught through
Amaranth's ``platform.get_memory`` hook in either form; :func:`sram_models` gives each kind's
behavioural model (:class:`SramModel`, an Amaranth memory with the macro's ports, so the
macro form simulates as the RTL does) and :func:`memory_list` the macros with every
instance's path, read back from the Verilog (:func:`instance_tree`). :func:`sdc` gives the top
module's clock constraint.
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

from amaranth.hdl import (ClockDomain, ClockSignal, Const, Instance, Module, ResetSignal, Shape,
                          ShapeCastable, unsigned)
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ..checks import is_real
from ..sim.runner import dedup_modules, module_ports
from .amaranth_internals import (module_domains, no_comb_cycle_check, port_direction,
                                 replace_submodules, submodules)
from .blocks import (BLOCK_TYPES, component_ports, convert_ports, instance_key, instance_params,
                     inventory, is_sram_macro, memory_ports, short_key)


__all__ = ["ExportError", "DieBlock", "die_blocks", "block_classes", "module_name",
           "flat_verilog", "hierarchical_verilog", "plain_module_names", "INSTANCE_OUTPUT_BITS",
           "output_bits", "SramMacro", "SramModel", "sram_models", "instance_tree",
           "sram_instances", "memory_list", "sdc", "one_top", "sram_liberty", "SDC_TIME_UNITS"]


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


# ---- SRAM macros (``sram=``) ---------------------------------------------------------------

@dataclass(frozen=True)
class SramMacro:
    """One kind of SRAM macro of the export's macro form: what a RAM of the design
    (:func:`~elmoe3d.synth.blocks.is_sram_macro`) needs from the macro that replaces it.

    ``width`` and ``depth`` in bits and words; ``read_ports``: ``(domain, transparent_for)``
    of each read port, ``transparent_for`` the indices of the write ports whose write of the
    same cycle and word it returns (new data; otherwise the old word), ``domain`` ``"comb"``
    for an asynchronous read (data in the same cycle, no enable: a register-file macro, as
    the die's FIFOs read); ``write_ports``: ``(domain, granularity)`` of each,
    ``granularity`` the bits a write-enable bit covers (``None``: the whole word, one enable
    bit; a granule of the whole word is ``None`` too); ``collision_free``: the design never
    reads and writes one word in one cycle (the memory's ``no_rw_check`` attribute,
    :func:`elmoe3d.hw.pe.memories.memory`), so read-during-write behaviour is free.

    Clocks are rising-edge: a macro in a domain a block defines on the falling edge would be
    clocked wrongly (no block of the die defines a domain; the hierarchical form refuses one
    with children)."""

    width: int
    depth: int
    read_ports: tuple
    write_ports: tuple
    collision_free: bool

    @classmethod
    def of(cls, mem) -> "SramMacro":
        """The macro kind of RAM ``mem`` (an ``amaranth.lib.memory.Memory``)."""
        writes = list(mem.write_ports)
        index = {id(w): j for j, w in enumerate(writes)}
        return cls(width=Shape.cast(mem.shape).width, depth=mem.depth,
                   read_ports=tuple((p.domain, tuple(sorted(index[id(w)]
                                                            for w in p.transparent_for)))
                                    for p in mem.read_ports),
                   write_ports=tuple((p.domain, None if p.signature.granularity in
                                      (None, Shape.cast(mem.shape).width)
                                      else p.signature.granularity) for p in writes),
                   collision_free=bool((mem.attrs or {}).get("no_rw_check")))

    @property
    def addr_width(self) -> int:
        return ceil_log2(self.depth)

    def data_ports(self) -> list:
        """``(direction, name, width)`` of each port but the clocks, ``"i"`` or ``"o"``:
        ``rd<i>_addr``, ``rd<i>_data``, ``rd<i>_en`` (not for an asynchronous read),
        ``wr<j>_addr``, ``wr<j>_en``, ``wr<j>_data``; none of zero width (a 1-word RAM's
        address)."""
        a, out = self.addr_width, []
        for i, (d, _t) in enumerate(self.read_ports):
            out += [("i", f"rd{i}_addr", a), ("o", f"rd{i}_data", self.width)]
            if d != "comb":
                out.append(("i", f"rd{i}_en", 1))
        for j in range(len(self.write_ports)):
            out += [("i", f"wr{j}_addr", a), ("i", f"wr{j}_en", self.enable_width(j)),
                    ("i", f"wr{j}_data", self.width)]
        return [p for p in out if p[2]]

    def enable_width(self, j: int) -> int:
        """Write-enable bits of write port ``j`` (one a granule)."""
        granularity = self.write_ports[j][1]
        return self.width // granularity if granularity else 1

    @property
    def clock_ports(self) -> tuple:
        """``(domain, port)`` of each clock the macro takes: ``clk`` for ``sync``,
        ``<domain>_clk`` for another, in port order (an asynchronous read takes none)."""
        domains = dict.fromkeys(d for d, _ in self.read_ports + self.write_ports
                                if d != "comb")
        return tuple((d, "clk" if d == "sync" else f"{d}_clk") for d in domains)

    @property
    def base_name(self) -> str:
        """``elmoe3d_sram_<width>x<depth>_<r>r<w>w`` then ``_g<granularity>`` (per write
        port, the width for whole words) when a write port has granules, ``_wt`` when a read
        port returns same-cycle writes (write-through), ``_ar`` when a read port is
        asynchronous, ``_nrw`` when collision free, and each clock domain other than
        ``sync``."""
        parts = [f"elmoe3d_sram_{self.width}x{self.depth}",
                 f"{len(self.read_ports)}r{len(self.write_ports)}w"]
        if any(g for _d, g in self.write_ports):
            parts.append("g" + "_".join(str(g or self.width) for _d, g in self.write_ports))
        if any(t for _d, t in self.read_ports):
            parts.append("wt")
        if any(d == "comb" for d, _t in self.read_ports):
            parts.append("ar")
        if self.collision_free:
            parts.append("nrw")
        parts += [d for d, _p in self.clock_ports if d != "sync"]
        return "_".join(parts)

    @property
    def read_during_write(self) -> str:
        """What a read of the word being written returns: ``"new data"`` (every read port
        transparent for every write port), ``"old data"`` (none), ``"never happens"``
        (collision free), else ``"per port"``."""
        if self.collision_free:
            return "never happens"
        every = tuple(range(len(self.write_ports)))
        if all(t == every for _d, t in self.read_ports):
            return "new data"
        if not any(t for _d, t in self.read_ports):
            return "old data"
        return "per port"

    def to_dict(self) -> dict:
        """The macro's fields for the memory list (:func:`memory_list`)."""
        clocks = dict(self.clock_ports)
        return {
            "width": self.width, "depth": self.depth, "bits": self.width * self.depth,
            "address_bits": self.addr_width,
            "read_ports": [{"name": f"rd{i}", "clock": clocks.get(d),
                            "enable": None if d == "comb" else f"rd{i}_en",
                            "read_latency_cycles": 0 if d == "comb" else 1,
                            "transparent_for": [f"wr{j}" for j in t]}
                           for i, (d, t) in enumerate(self.read_ports)],
            "write_ports": [{"name": f"wr{j}", "clock": clocks[d],
                             "granularity": g or self.width,
                             "enable_bits": self.enable_width(j)}
                            for j, (d, g) in enumerate(self.write_ports)],
            "read_during_write": self.read_during_write,
        }


class _MacroPlatform:
    """The ``platform`` of a conversion in the macro form: each RAM that
    :func:`~elmoe3d.synth.blocks.is_sram_macro` calls a macro becomes an ``Instance`` of its
    kind's module (``kinds``: :class:`SramMacro` -> module name, shared by the conversions of
    one export); other memories stay Amaranth's."""

    def __init__(self, kinds: dict):
        self.kinds = kinds

    def module(self, macro) -> str:
        """``macro``'s module name: :attr:`SramMacro.base_name`, with ``_2``, ``_3``, ... for
        another kind of the same base name in this export (in the order they are met)."""
        module = self.kinds.get(macro)
        if module is None:
            base, n, module = macro.base_name, 1, macro.base_name
            while module in self.kinds.values():
                n += 1
                module = f"{base}_{n}"
            self.kinds[macro] = module
        return module

    def get_memory(self, mem):
        if not is_sram_macro(mem):
            return Memory.elaborate(mem, None)
        macro = SramMacro.of(mem)
        if _has_init(mem):
            file, line = mem.src_loc
            raise ExportError(f"the {macro.depth} x {macro.width}-bit RAM made at {file}:{line} "
                              f"has initial contents, which an SRAM macro has not: export "
                              f"with --sram rtl")
        wired = {n for _d, n, _w in macro.data_ports()}      # the model's ports, no others
        kwargs = {f"i_{port}": ClockSignal(d) for d, port in macro.clock_ports}
        kwargs.update({f"{d}_{n}": v for d, n, v in memory_ports(mem) if n in wired})
        return Instance(self.module(macro), **kwargs)


def _has_init(mem) -> bool:
    """RAM ``mem`` has a non-zero word in its initial contents."""
    shape = mem.shape
    if isinstance(shape, ShapeCastable):
        return any(Const.cast(shape.const(e)).value for e in mem.init)
    return any(mem.init)


class SramModel(wiring.Component):
    """Behavioural model of an :class:`SramMacro`: an Amaranth ``Memory`` with the macro's
    ports (``rd<i>_addr``, ``rd<i>_en``, ``rd<i>_data``, ``wr<j>_addr``, ``wr<j>_en``,
    ``wr<j>_data``; clocks ``clk`` / ``<domain>_clk``), so that it behaves as the RAM it
    replaces, cycle for cycle: one cycle of read latency (none for an asynchronous read port,
    which has no enable), the same transparency and write granules. ``power_up``: ``None`` for
    all-zero contents (the RTL's RAMs are declared with zeros), else a seed for pseudo-random
    contents, one random word each (a real macro's power-up contents are undefined: a design
    that runs the same on them does not depend on them)."""

    def __init__(self, macro: SramMacro, *, power_up=None):
        self.macro, self.power_up = macro, power_up
        super().__init__({n: In(w, init=int(n.startswith("rd") and n.endswith("_en")))
                          if d == "i" else Out(w) for d, n, w in macro.data_ports()})
        self.clock_domains = [ClockDomain(d, reset_less=True) for d, _p in macro.clock_ports]

    def convert_ports(self) -> dict:
        """The ``ports=`` of its conversion: the signature's and a clock input a domain
        (Amaranth makes no port of a domain the module defines)."""
        return {**convert_ports(self), **{port: (cd.clk, port_direction(In)) for cd, (_d, port)
                                          in zip(self.clock_domains, self.macro.clock_ports)}}

    def elaborate(self, platform):
        import random
        macro, m = self.macro, Module()
        m.domains += self.clock_domains               # a clock and no reset: a macro's ports
        rng = random.Random(f"{self.power_up}/{macro}")
        init = [] if self.power_up is None else \
            [rng.getrandbits(macro.width) for _ in range(macro.depth)]
        m.submodules.mem = mem = Memory(shape=unsigned(macro.width), depth=macro.depth,
                                        init=init, attrs={"no_rw_check": 1}
                                        if macro.collision_free else None)
        writes = [mem.write_port(domain=d, granularity=g) for d, g in macro.write_ports]
        for j, port in enumerate(writes):
            for field_ in ("addr", "en", "data"):
                if hasattr(self, f"wr{j}_{field_}"):
                    m.d.comb += getattr(port, field_).eq(getattr(self, f"wr{j}_{field_}"))
        for i, (d, t) in enumerate(macro.read_ports):
            port = mem.read_port(domain=d, transparent_for=[writes[j] for j in t])
            if hasattr(self, f"rd{i}_addr"):
                m.d.comb += port.addr.eq(getattr(self, f"rd{i}_addr"))
            if d != "comb":
                m.d.comb += port.en.eq(getattr(self, f"rd{i}_en"))
            m.d.comb += getattr(self, f"rd{i}_data").eq(port.data)
        return m


def sram_models(kinds: dict, *, power_up=None) -> str:
    """Verilog of the behavioural model (:class:`SramModel`) of each macro kind of ``kinds``
    (:class:`SramMacro` -> module name, as an export filled it), one module each."""
    from amaranth.back import verilog
    models = [(SramModel(macro, power_up=power_up), module) for macro, module in kinds.items()]
    return one_top("".join(verilog.convert(model, name=module, emit_src=False,
                                           ports=model.convert_ports())
                           for model, module in models), None)


def sram_liberty(kinds: dict, *, library: str = "elmoe3d_srams", comment: str = "") -> str:
    """A Liberty view (``.lib``) of each macro kind of ``kinds`` (:class:`SramMacro` -> module
    name, as an export filled it), one cell each, named as the module, for a flow to time the
    design around the macros before a memory compiler's own views replace these: the cell's
    ``area`` (um^2, :func:`~elmoe3d.synth.sram.sram_area`, the memory list's
    ``area_um2_each``), ``dont_use``, its pins with their directions and bus widths as
    :meth:`SramMacro.data_ports` and :attr:`SramMacro.clock_ports` name them, and the timing
    arcs a synchronous SRAM has: every input a ``setup_rising`` and a ``hold_rising`` against
    its port's clock, every synchronous read's data a ``rising_edge`` arc from its clock. An
    asynchronous read (``_ar``) has a ``combinational`` arc from its address to its data
    (``related_bus_pins``: every address bit to every data bit) and a ``rising_edge`` arc
    from each write port's clock (a write changes the word read), its address no constraint.
    Every figure is one published ASAP7 SRAM bank's
    (:mod:`elmoe3d.synth.sram`: ``srambank_256x4x64_6t122``) at 20 ps transitions and its
    smallest load, scalar (no table): the same for every kind, whatever its size, as the
    area roll-up's timing takes them. TT corner, 0.7 V, 25 C; units ps, fF, nW.

    Power (``internal_power``, fJ, the energy a power analysis charges an event): the
    access energies of the area roll-up's power model, :func:`~elmoe3d.synth.energy.
    sram_access_pj` (the same bank's clock-pin internal power, ``!write`` for a read,
    ``write`` for a write, one bank access per 64 bits of the word). Each clock pin carries
    a group for every combination of the synchronous ports it clocks (``when`` their enables:
    ``rd<i>_en``, any bit of ``wr<j>_en``: a whole word's write energy for any granule, an
    upper bound), a cycle costing the sum of the active ports' energies, half on each clock
    edge; a cycle with no port enabled costs nothing (a clock-gated macro).
    An asynchronous read (``_ar``) has no clock to charge: half its read energy is charged on
    each transition of an address bit (a binary read pointer toggles two bits an increment on
    average, so a FIFO read costs one read). No leakage: the published bank gives
    ``cell_leakage_power : 0``. No LEF. ``comment`` goes into the file's opening comment."""
    from . import sram
    from .energy import sram_access_pj

    def number(v):
        return f"{v:g}"

    def scalar(group, value):
        return f"{group} (scalar) {{ values (\"{number(value)}\"); }}"

    def constraints(clock):
        return [f"timing () {{ related_pin : \"{clock}\"; timing_type : {kind}; "
                f"{scalar('rise_constraint', v)} {scalar('fall_constraint', v)} }}"
                for kind, v in (("setup_rising", sram.SETUP_PS), ("hold_rising", sram.HOLD_PS))]

    def read_arc(related, kind, bus=False):
        rise_t, fall_t = sram.READ_TRANSITION_PS
        sense = "" if kind == "rising_edge" else "timing_sense : non_unate; "
        # a bus to a bus, every bit to every bit: related_bus_pins (related_pin would pair
        # bits one to one, or drop the arc where the widths differ)
        rel = "related_bus_pins" if bus else "related_pin"
        return (f"timing () {{ {rel} : \"{related}\"; timing_type : {kind}; {sense}"
                f"{scalar('cell_rise', sram.READ_CLK_TO_Q_RISE_PS)} "
                f"{scalar('cell_fall', sram.READ_CLK_TO_Q_PS)} "
                f"{scalar('rise_transition', rise_t)} {scalar('fall_transition', fall_t)} }}")

    def energy_group(when, fj):
        """An ``internal_power`` group of ``fj`` a transition, rising or falling."""
        cond = f"when : \"{when}\"; " if when else ""
        return (f"internal_power () {{ {cond}{scalar('rise_power', round(fj, 3))} "
                f"{scalar('fall_power', round(fj, 3))} }}")

    def clock_power(macro, clock):
        """The ``internal_power`` groups of clock pin ``clock``: one for each non-empty set
        of the synchronous ports it clocks, each port's enable in its ``when``."""
        ports = []                  # (enable expression, fJ) of each port on this clock
        for i, (domain, _t) in enumerate(macro.read_ports):
            if domain != "comb" and dict(macro.clock_ports)[domain] == clock:
                ports.append((f"rd{i}_en", 1e3 * sram_access_pj(macro.width)))
        for j, (domain, _g) in enumerate(macro.write_ports):
            if dict(macro.clock_ports)[domain] == clock:
                bits = macro.enable_width(j)
                en = f"wr{j}_en" if bits == 1 else \
                    "(" + " | ".join(f"wr{j}_en[{b}]" for b in range(bits)) + ")"
                ports.append((en, 1e3 * sram_access_pj(macro.width, write=True)))
        groups = []
        for mask in range(1, 1 << len(ports)):
            on = [k for k in range(len(ports)) if mask >> k & 1]
            when = " & ".join(en if k in on else f"!{en}" for k, (en, _e) in enumerate(ports))
            # a cycle's energy, half on each edge of the clock (tools charge each transition
            # or average the two: either way a cycle costs the sum)
            groups.append(energy_group(when, sum(ports[k][1] for k in on) / 2))
        return groups

    widths = sorted({w for macro in kinds for _d, _n, w in macro.data_ports() if w > 1})
    lines = ["/*"] + [f" * {line}" for line in comment.splitlines()] + [
        " * Liberty view of the SRAM macro kinds of an elmoe3d export (elmoe3d.synth.export."
        "sram_liberty):",
        " * every figure one published ASAP7 bank's, " + sram.TIMING_SOURCE.split(", from ")[1]
        + ",", " * scalar at 20 ps transitions; the area elmoe3d.synth.sram's model. A "
        "placeholder for a memory compiler's views.", " */",
        f"library ({library}) {{",
        "  delay_model : table_lookup;", "  time_unit : \"1ps\";", "  voltage_unit : \"1V\";",
        "  current_unit : \"1mA\";", "  leakage_power_unit : \"1nW\";",
        "  pulling_resistance_unit : \"1kohm\";", "  capacitive_load_unit (1, ff);",
        "  nom_process : 1;", "  nom_voltage : 0.7;", "  nom_temperature : 25;",
        "  operating_conditions (tt_0p7v_25c) { process : 1; voltage : 0.7; "
        "temperature : 25; }", "  default_operating_conditions : tt_0p7v_25c;",
        "  input_threshold_pct_rise : 50;", "  input_threshold_pct_fall : 50;",
        "  output_threshold_pct_rise : 50;", "  output_threshold_pct_fall : 50;",
        "  slew_lower_threshold_pct_rise : 30;", "  slew_lower_threshold_pct_fall : 30;",
        "  slew_upper_threshold_pct_rise : 70;", "  slew_upper_threshold_pct_fall : 70;",
        "  bus_naming_style : \"%s[%d]\";"]
    lines += [f"  type (elmoe3d_bus_{w}) {{ base_type : array; data_type : bit; bit_width : {w}; "
              f"bit_from : {w - 1}; bit_to : 0; downto : true; }}" for w in widths]
    for macro, module in kinds.items():
        clocks = dict(macro.clock_ports)
        area = sram.sram_area(macro.width, macro.depth, len(macro.read_ports)).area
        lines += [f"  cell ({module}) {{", f"    area : {area:.3f};", "    dont_use : true;",
                  "    dont_touch : true;", "    interface_timing : true;"]
        for _domain, port in macro.clock_ports:
            lines += [f"    pin ({port}) {{", f"      direction : input; clock : true; "
                      f"capacitance : {number(sram.CLOCK_CAP_FF)};"] + \
                [f"      {g}" for g in clock_power(macro, port)] + ["    }"]
        write_clocks = [clocks[d] for d, _g in macro.write_ports]
        for direction, name, width in macro.data_ports():
            side, index = name.split("_")[0][:2], int(name.split("_")[0][2:])
            domain = (macro.read_ports if side == "rd" else macro.write_ports)[index][0]
            if direction == "i":
                body = [f"direction : input; capacitance : {number(sram.INPUT_CAP_FF)};"]
                if domain != "comb":
                    body += constraints(clocks[domain])
                elif name.endswith("_addr"):    # an asynchronous read's: see the docstring
                    body.append(energy_group("", 1e3 * sram_access_pj(macro.width) / 2))
            elif domain != "comb":
                body = [f"direction : output; max_capacitance : "
                        f"{number(sram.MAX_LOAD_FF)};", read_arc(clocks[domain], "rising_edge")]
            else:
                body = [f"direction : output; max_capacitance : {number(sram.MAX_LOAD_FF)};"]
                if macro.addr_width:
                    body.append(read_arc(f"rd{index}_addr", "combinational",
                                         bus=macro.addr_width > 1))
                body += [read_arc(c, "rising_edge") for c in dict.fromkeys(write_clocks)]
            group = f"bus ({name}) {{ bus_type : elmoe3d_bus_{width};" if width > 1 else \
                f"pin ({name}) {{"
            lines += [f"    {group}"] + [f"      {b}" for b in body] + ["    }"]
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


_MODULE_TEXT = re.compile(r"^module (\\?\S+?)\s*\((.*?)^endmodule", re.M | re.S)
_INSTANTIATION = re.compile(r"^  ([A-Za-z_][\w$]*)\s+(\\\S+|[A-Za-z_][\w$]*)\s*\($", re.M)


def instance_tree(text: str) -> dict:
    """The instantiations in each module of Verilog ``text`` as Amaranth writes it (one
    ``  <module> <instance> (`` line each, no parameters) after :func:`plain_module_names`
    (plain module names): ``module -> [(module instantiated, instance name), ...]``, escaped
    instance names without their backslash; instantiated modules need not be defined in
    ``text`` (macros)."""
    return {m.group(1): [(a, b.lstrip("\\")) for a, b in _INSTANTIATION.findall(m.group(2))]
            for m in _MODULE_TEXT.finditer(text)}


def sram_instances(text: str, top: str, modules) -> dict:
    """``module -> [instance path, ...]`` of each macro module of ``modules`` under ``top``
    in ``text`` (paths of instance names from ``top`` down, ``/``-joined), in text order."""
    tree, found, modules = instance_tree(text), {}, set(modules)

    def walk(module, path):
        for child, name in tree.get(module, ()):
            if child in modules:
                found.setdefault(child, []).append(path + name)
            else:
                walk(child, f"{path}{name}/")

    walk(top, "")
    return found


def memory_list(text: str, top: str, kinds: dict) -> dict:
    """The SRAM macros of an export in the macro form: for each kind (``kinds``, as the export
    filled it) its module, fields (:meth:`SramMacro.to_dict`), its ports (name -> direction,
    width), an area estimate (``area_um2_each``: :func:`elmoe3d.synth.sram.sram_area`, um^2 a
    macro) and every instance path under
    ``top``; with their totals (``total_instances``, ``total_bits``, ``total_area_um2``).
    Raises ``ValueError`` when a kind has no instance in ``text``."""
    from .sram import sram_area
    paths = sram_instances(text, top, kinds.values())
    macros = []
    for macro, module in kinds.items():
        where = paths.get(module)
        if not where:
            raise ValueError(f"{module}: no instance under {top}")
        area = sram_area(macro.width, macro.depth, len(macro.read_ports)).area
        macros.append({"module": module, **macro.to_dict(), "ports": _macro_ports(macro),
                       "area_um2_each": round(area, 3), "count": len(where),
                       "instances": where})
    return {"top": top, "macros": macros,
            "total_instances": sum(m["count"] for m in macros),
            "total_bits": sum(m["bits"] * m["count"] for m in macros),
            "total_area_um2": round(sum(m["area_um2_each"] * m["count"] for m in macros), 3)}


def _macro_ports(macro) -> dict:
    """``port -> [direction, width]`` of a macro kind's module: its clocks, then
    :meth:`SramMacro.data_ports`."""
    ports = {port: ["input", 1] for _d, port in macro.clock_ports}
    ports.update({n: ["input" if d == "i" else "output", w] for d, n, w in macro.data_ports()})
    return ports


#: The time units :func:`sdc` writes in, and a nanosecond's worth of each.
SDC_TIME_UNITS = {"ps": 1000.0, "ns": 1.0}


def sdc(*, top: str, ports, clock_ghz: float, comment: str = "",
        io_delay: float | None = None, unit: str = "ps") -> str:
    """Timing constraints (SDC) of an exported top module ``top`` whose ports are ``ports``
    (names, or :func:`~elmoe3d.sim.runner.port_directions`' ``name -> (direction, width)``):
    ``set_units -time <unit>`` (``"ps"``, the ASAP7 libraries' and :func:`sram_liberty`'s
    unit, or ``"ns"``: :data:`SDC_TIME_UNITS`; SDC takes its units from the libraries, and
    a tool that checks this line, as OpenSTA does, warns of a library of another unit, which
    would read 1,000 ps as 1,000 ns), then one ``create_clock`` a clock port
    (``clk``, ``<domain>_clk``) at ``clock_ghz`` (the configuration's logic clock; every
    domain of the die runs on it), named as the port. ``io_delay`` (a fraction of the period
    in [0, 1); ``ports`` with directions): a ``set_input_delay`` on every other input (the
    reset too) and a ``set_output_delay`` on every output, that fraction of the period
    against the one clock: what the logic outside the block takes of a cycle (a port as
    ``{name}``, a bus as ``{name[*]}``: braced, no Tcl substitution). ``inout`` ports get
    none (the die has none). None (the default): no I/O delays (a block's budget is its
    flow's). No uncertainty, load or driving cell is set; ``comment`` lines (``#``-prefixed
    here) open the file. Raises ValueError naming ``top`` when it has no clock port, or,
    with ``io_delay``, more than one (the ports' domains are not known here), an
    ``io_delay`` out of range, ``ports`` without directions, or another ``unit``."""
    if unit not in SDC_TIME_UNITS:
        raise ValueError(f"unit: expected one of {', '.join(SDC_TIME_UNITS)}, got {unit!r}")
    clocks = [p for p in ports if (hit := _DOMAIN_PORT.match(p)) and hit.group(2) == "clk"]
    if not clocks:
        raise ValueError(f"{top}: no clock port")
    period = SDC_TIME_UNITS[unit] / clock_ghz
    digits = 1 if unit == "ps" else 4
    lines = [f"# {line}" for line in comment.splitlines()]
    if io_delay is None:
        lines.append(f"# logic clock {clock_ghz:g} GHz; times in {unit}; no input/output delays "
                     f"or uncertainty set")
    else:
        if not (is_real(io_delay) and 0 <= io_delay < 1):
            raise ValueError(f"io_delay: expected a fraction of the clock period in [0, 1), "
                             f"got {io_delay!r}")
        if len(clocks) > 1:
            raise ValueError(f"{top}: {len(clocks)} clock ports ({', '.join(clocks)}): the "
                             f"I/O delays need one clock (the ports' domains are not known "
                             f"here)")
        if not isinstance(ports, dict):
            raise ValueError("ports: the I/O delays need each port's direction (name -> "
                             "(direction, width), sim.runner.port_directions)")
        io_delay = io_delay + 0.0                   # -0 as 0
        lines.append(f"# logic clock {clock_ghz:g} GHz; times in {unit}; inputs arrive and "
                     f"outputs are required {io_delay:g} x the period "
                     f"({io_delay * period:.{digits}f} {unit}) after and before its edge; no "
                     f"uncertainty, load or driving cell set")
    lines.append(f"set_units -time {unit}")
    lines += [f"create_clock -name {c} -period {period:.{digits}f} [get_ports {{{c}}}]"
              for c in clocks]
    if io_delay is not None:
        for name, (direction, width) in ports.items():
            if name in clocks or direction not in ("input", "output"):
                continue
            what = f"{{{name}[*]}}" if width > 1 else f"{{{name}}}"
            lines.append(f"set_{direction}_delay -clock {clocks[0]} "
                         f"{io_delay * period:.{digits}f} [get_ports {what}]")
    return "\n".join(lines) + "\n"


def flat_verilog(obj, *, name: str, srams: dict | None = None) -> str:
    """Verilog of block ``obj`` whole, top module ``name``, identical modules merged. Its ports
    are the block's signature members less the constant ones (an always-ready ``ready``), with
    ``clk`` and ``rst`` for its ``sync`` domain. ``srams``: a dict to fill with the
    :class:`SramMacro` kinds (-> module name) of the RAMs made macro instances; ``None``
    keeps every memory Amaranth's behavioural Verilog."""
    from amaranth.back import verilog
    platform = None if srams is None else _MacroPlatform(srams)
    return one_top(plain_module_names(dedup_modules(verilog.convert(
        obj, name=name, emit_src=False, ports=convert_ports(obj), platform=platform))), name)


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


def hierarchical_verilog(obj, *, name: str, progress=None, srams: dict | None = None) -> str:
    """Verilog of block ``obj`` as one module per distinct block instance (module
    docstring), top module ``name``; each module converted once, children before parents.
    ``progress(label)`` is called before each conversion; ``srams`` as for
    :func:`flat_verilog`. Raises :class:`ExportError` for a block that defines a clock domain
    and has children."""
    from amaranth.back import verilog
    classes = block_classes()
    platform = None if srams is None else _MacroPlatform(srams)
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
                                       ports=convert_ports(block), platform=platform)
        finally:
            del block.elaborate
        text = dedup_modules(text)
        done[key] = (module, module_ports(text, module), text)

    emit(obj, name)
    return one_top(plain_module_names("".join(text for _module, _ports, text in done.values())),
                   name)


_TOP_ATTRIBUTE = re.compile(
    r"^\(\* top =\s*1\s*\*\)\n(?=(?:\(\*[^\n]*\*\)\n)*module (\S+?)\s*\()", re.M)


def one_top(text: str, top: str | None) -> str:
    """``text`` with Amaranth's ``(* top = 1 *)`` kept on module ``top`` only (each conversion
    marks its own top: left on every child module, Yosys's ``hierarchy -auto-top`` picks one
    of them and drops the real top); ``top`` None: on none (the macro models)."""
    return _TOP_ATTRIBUTE.sub(lambda m: m.group(0) if m.group(1) == top else "", text)

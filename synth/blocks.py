"""What gets synthesised: the block registry, hollowing (sub-blocks and SRAMs as black boxes)
and the leaves that attribute the tensor tile's area.

**Registry.** :data:`BLOCK_TYPES` lists the RTL classes the roll-up knows, one line each: the
class (``"module:Class"``, imported lazily, so a block that has not landed in ``hw/`` is only
skipped), its report label and category. :data:`DIE_BLOCKS` lists the logic die's blocks with
their instance counts, each a function of the :class:`~elmoe3d.config.ArchConfig` (no figure is
typed): one line per block as well.

**Hollowing** (:func:`hollow`). A block is synthesised with every direct sub-block whose class
is registered replaced by a black box (an ``Instance`` of a port-compatible empty module), and
every RAM (``amaranth.lib.memory.Memory`` with a write port) of at least
:data:`SRAM_MIN_BITS` bits (:func:`is_sram_macro`) replaced by a black-box SRAM macro whose
area comes from :mod:`elmoe3d.synth.sram`. ROMs and smaller RAMs (FIFOs of a few entries)
are synthesised as logic. The sub-block instances found are returned with their parameters, so
instance counts come from the RTL as elaborated for the configuration. Memories are caught
through Amaranth's ``platform.get_memory`` hook; sub-blocks by replacing them in the elaborated
``Module`` (:mod:`elmoe3d.synth.amaranth_internals`, the one place private Amaranth names are
used).

**Tile leaves.** A 16x32x32 tile (16,384 unit PEs) is too large to synthesise whole here. The
tile's area is ``a + b*L + c*R*L`` (``TensorTile`` builds per-tile control, per-lane weight
fields and scale decode, and per (row, lane) multipliers, adder tree, slice combining and
dequantisation; the weight-field mux of a (lane, k) is shared by the rows). ``a, b, c`` are
solved exactly from three small real tiles, (R, L) = (1, 2), (2, 2), (1, 4)
(:data:`TILE_FIT`). The split of ``b`` and ``c`` into MAC, adder tree, bit-slice support and
dequantisation comes from leaves built from the tile's own helpers
(:func:`~elmoe3d.hw.unit_pe.weight_field`, :func:`~elmoe3d.hw.unit_pe.lane_controls`,
:class:`~elmoe3d.hw.unit_pe.SliceCombiner`, the tile's adder tree): :class:`MulLeaf` (one
IA8xW5 multiplier), :class:`DotRowLeaf` (32 multipliers + adder tree + its register, one row
of one lane), :class:`LaneFieldsLeaf` (the LSB-augmentation mux and slice select of a lane's 32
fields) and ``SliceCombiner(width=18)``; dequantisation is what remains of ``b`` and ``c``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import importlib
import re
from dataclasses import dataclass, field

from amaranth.back import rtlil
from amaranth.hdl import Const, Elaboratable, Instance, Module, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .amaranth_internals import (no_comb_cycle_check, port_direction, replace_submodules,
                                 submodules)


__all__ = ["SRAM_MIN_BITS", "BlockType", "DieBlock", "BLOCK_TYPES", "DIE_BLOCKS", "TILE_FIT",
           "SramUse", "Hollow", "hollow", "inventory", "instance_key", "instance_params",
           "resolve", "is_sram_macro", "memory_ports", "MulLeaf", "DotRowLeaf", "LaneFieldsLeaf",
           "memory_role", "component_ports"]


#: RAMs of at least this many bits are SRAM macros; smaller ones are synthesised as flops.
SRAM_MIN_BITS = 2048

#: The small tiles (rows, lanes) whose synthesis gives the tile's area model exactly.
TILE_FIT = ((1, 2), (2, 2), (1, 4))

#: PEs with more lanes than this are not synthesised whole: their own (control) logic comes
#: from hollow PEs of these lane counts (rows = lanes / 2, the target's memory depths), fitted
#: with ``a + b L + c L^2`` (:func:`elmoe3d.synth.rollup.pe_control_model`).
PE_DIRECT_MAX_LANES = 8
PE_FIT_LANES = (4, 8, 16)


@dataclass(frozen=True)
class BlockType:
    """A registered RTL class: ``path`` (``"module:Class"``), report ``label`` and
    ``category``. ``model`` names an area model used instead of synthesis (``"tile"``)."""

    path: str
    label: str
    category: str
    model: str = ""

    def load(self):
        """The class, or ``None`` if its module is not importable (not landed yet)."""
        return resolve(self.path, optional=True)


@dataclass(frozen=True)
class DieBlock:
    """A block of the logic die: ``build(arch)`` returns one instance, ``count(arch)`` how many
    the die has. ``path`` is imported lazily (``None`` result: the block is skipped)."""

    label: str
    path: str
    build: object
    count: object


def resolve(path: str, *, optional: bool = False):
    module, _, attr = path.partition(":")
    try:
        obj = importlib.import_module(module)
    except ImportError:
        if optional:
            return None
        raise
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            if optional:
                return None
            raise ImportError(f"{path}: no {part}")
    return obj


# ---- the registry: one line per block --------------------------------------------------------

BLOCK_TYPES = [
    BlockType("elmoe3d.hw.pe:PE", "PE", "PE"),
    BlockType("elmoe3d.hw.tile:TensorTile", "tensor tile", "tile", model="tile"),
    BlockType("elmoe3d.hw.vpu:SwiGLUUnit", "VPU SwiGLU unit", "VPU"),
    BlockType("elmoe3d.hw.vpu:CombineUnit", "VPU combine unit", "VPU"),
    BlockType("elmoe3d.hw.vpu:RequantUnit", "VPU requant unit", "VPU"),
    BlockType("elmoe3d.hw.vpu:RowMaxExponent", "VPU row-max exponent", "VPU"),
    BlockType("elmoe3d.hw.vpu:Fp32Converter", "VPU FP32 converter", "VPU"),
    BlockType("elmoe3d.hw.load_router:LoadRouter", "load router", "load routers"),
    BlockType("elmoe3d.hw.agg_link:AggregationLink", "aggregation link", "aggregation links"),
    BlockType("elmoe3d.hw.ring:StreamlineRing", "streamline ring", "streamline ring"),
    BlockType("elmoe3d.hw.ring:RingStation", "ring station", "streamline ring"),
    BlockType("elmoe3d.hw.hb_ctrl:HBController", "HB controller", "HB controllers"),
    BlockType("elmoe3d.hw.ext_ctrl:ExtController", "EXT controller", "EXT controller"),
    BlockType("elmoe3d.hw.dram:DramController", "DRAM channel controller", "DRAM ctrl"),
]


def _part(name: str):
    """A :class:`DieBlock` builder of the die's part ``name`` as the die builds it
    (:meth:`elmoe3d.hw.die.LogicDie.part`: the die's parameters, not the block's defaults)."""
    def build(arch, _cls):
        from ..hw.die import LogicDie
        return LogicDie.part(name, config=arch)
    return build


DIE_BLOCKS = [
    DieBlock("PE", "elmoe3d.hw.pe:PE", _part("pe"), lambda a: a.pes),
    DieBlock("load router", "elmoe3d.hw.load_router:LoadRouter", _part("router"),
             lambda a: a.pes),
    DieBlock("HB controller", "elmoe3d.hw.hb_ctrl:HBController", _part("hb"),
             lambda a: a.pes),
    DieBlock("aggregation link", "elmoe3d.hw.agg_link:AggregationLink", _part("link"),
             lambda a: a.groups),
    DieBlock("streamline ring", "elmoe3d.hw.ring:StreamlineRing", _part("ring"),
             lambda a: 1),
    DieBlock("EXT controller", "elmoe3d.hw.ext_ctrl:ExtController", _part("ext"),
             lambda a: 1),
    DieBlock("HB word ports", "elmoe3d.hw.die:LogicDie",
             lambda a, c: c.part("hb_port", config=a), lambda a: a.pes),
    DieBlock("EXT word port", "elmoe3d.hw.die:LogicDie",
             lambda a, c: c.part("ext_port", config=a), lambda a: 1),
    DieBlock("EXT streamer", "elmoe3d.hw.die:LogicDie",
             lambda a, c: c.part("streamer", config=a), lambda a: 1),
    DieBlock("EXT schedulers", "elmoe3d.hw.die:LogicDie",
             lambda a, c: c.part("ext_sched", config=a), lambda a: a.groups),
]


def memory_role(owner_label: str, name: str) -> str:
    """Report line of an SRAM: the PE's weight memory (WMEM: both nibble planes and scales of
    both buffers) and input/output memory (IOMEM: ACT, TOK, HBUF, OUT, row maxima); other
    blocks' buffers under the block's label."""
    if owner_label == "PE":
        if re.match(r"(wmsb|wlsb|wscale)\d*$", name):
            return "WMEM"
        return "IOMEM"
    return f"{owner_label} buffers"


# ---- instance identity -------------------------------------------------------------------------

_PRIMITIVES = (int, float, str, bool, type(None), tuple, frozenset, enum.Enum)


def _foreign_private(cls) -> tuple:
    """Prefixes of the name-mangled attributes (``_Class__name``) of the classes of ``cls``'s
    MRO defined outside elmoe3d (Amaranth's own bookkeeping on every component)."""
    return tuple(f"_{c.__name__}__" for c in cls.__mro__
                 if not c.__module__.startswith("elmoe3d."))


def instance_params(obj) -> dict:
    """The parameters ``__init__`` stored on a block instance, by attribute name (sorted):
    plain values and frozen dataclasses such as configurations (ports, other objects and the
    private attributes of base classes outside elmoe3d are left out)."""
    params = {}
    foreign = _foreign_private(type(obj))
    for name, value in sorted(vars(obj).items()):
        if name.startswith(foreign):
            continue
        if isinstance(value, _PRIMITIVES) or (dataclasses.is_dataclass(value)
                                              and not isinstance(value, type)):
            params[name] = value
    return params


def instance_key(obj) -> str:
    """A stable key of a block instance: its class and :func:`instance_params`. Instances
    with equal keys elaborate to the same logic."""
    params = ", ".join(f"{k}={v!r}" for k, v in instance_params(obj).items())
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}({params})"


def short_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:10]


# ---- hollowing --------------------------------------------------------------------------------

@dataclass
class SramUse:
    """One RAM taken out of gate synthesis: ``owner`` block label, ``name`` (the submodule name,
    or ``<n>`` for memories inside unregistered sub-blocks), geometry and port counts."""

    owner: str
    name: str
    width: int
    depth: int
    read_ports: int
    write_ports: int

    @property
    def bits(self) -> int:
        return self.width * self.depth

    @property
    def role(self) -> str:
        return memory_role(self.owner, self.name)


@dataclass
class Hollow:
    """A block ready for Yosys: ``rtlil`` (module ``top``), black-box ``stubs`` (Verilog),
    the registered sub-block instances it contains (``subs``: key -> (representative,
    count)) and its SRAM macros (``srams``)."""

    rtlil: str
    stubs: str
    subs: dict = field(default_factory=dict)
    srams: list = field(default_factory=list)
    #: The sub-blocks replaced by black boxes, not elaborated here (a caller that keeps them
    #: until they are planned, or drops them in an ``inspection`` scope, hears no
    #: ``UnusedElaboratable`` warning).
    unelaborated: list = field(default_factory=list)


def _port_name(path) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", "__".join(str(p) for p in path))


class _BlackBox(Elaboratable):
    """An ``Instance`` of the empty module ``module`` wired to ``ports`` ((dir, name, Value))."""

    def __init__(self, module: str, ports):
        self.module = module
        self.ports = ports

    def elaborate(self, platform):
        m = Module()
        m.submodules.bb = Instance(self.module, **{f"{d}_{n}": v for d, n, v in self.ports})
        return m


def _stub(module: str, ports) -> str:
    decl = [f"  {'input' if d == 'i' else 'output'} [{len(v) - 1}:0] {n}" for d, n, v in ports]
    return f"(* blackbox *)\nmodule {module} (\n" + ",\n".join(decl) + "\n);\nendmodule\n"


def convert_ports(component) -> dict:
    """The ``ports=`` of ``rtlil.convert`` for ``component``: what Amaranth derives from its
    signature when given none (``path__joined`` -> (value, declared direction)) less the
    constant members (an always-ready stream's ``ready``), which Amaranth 0.5 refuses as
    ports. A component without constant members converts to the same text either way."""
    ports = {}
    for path, member, value in component.signature.flatten(component):
        value = Value.cast(value)
        if not isinstance(value, Const):
            ports["__".join(map(str, path))] = (value, port_direction(member.flow))
    return ports


def component_ports(component) -> list:
    """``(direction, name, value)`` of each wire of ``component``'s signature: ``"i"`` or
    ``"o"``, the member's path joined by ``__`` (as Amaranth names the converted module's
    ports) and its value; zero-width and constant members (an always-ready stream's
    ``ready``), which make no wire, are left out."""
    ports = []
    for path, member, value in component.signature.flatten(component):
        value = Value.cast(value)
        if len(value) == 0 or isinstance(value, Const):
            continue                    # e.g. an always-ready stream's ready: no wire
        ports.append(("i" if member.flow == In else "o", _port_name(path), value))
    return ports


def memory_ports(mem) -> list:
    """``(direction, name, value)`` of each data port of RAM ``mem`` as a macro has them:
    ``rd<i>_addr``, ``rd<i>_en``, ``rd<i>_data`` of read port i, ``wr<j>_addr``, ``wr<j>_en``
    (one bit a write granule), ``wr<j>_data`` of write port j; zero-width ones left out, no
    clocks."""
    ports = []
    for i, rp in enumerate(mem.read_ports):
        ports += [("i", f"rd{i}_addr", rp.addr), ("i", f"rd{i}_en", rp.en),
                  ("o", f"rd{i}_data", Value.cast(rp.data))]
    for j, wp in enumerate(mem.write_ports):
        ports += [("i", f"wr{j}_addr", wp.addr), ("i", f"wr{j}_en", wp.en),
                  ("i", f"wr{j}_data", Value.cast(wp.data))]
    return [(d, n, v) for d, n, v in ports if len(v)]


def is_sram_macro(mem) -> bool:
    """RAM ``mem`` (an ``amaranth.lib.memory.Memory``) is a memory macro, not flops: it has a
    write port and at least :data:`SRAM_MIN_BITS` bits (read ports synchronous, or
    combinational as the FIFOs' are: a register-file macro). The one rule of the area roll-up
    (:func:`hollow`, :func:`inventory`) and the RTL export's ``--sram macro``
    (:mod:`elmoe3d.synth.export`)."""
    width = len(Value.cast(Signal(mem.shape)))
    return bool(mem.write_ports) and width * mem.depth >= SRAM_MIN_BITS


class _Platform:
    """Catches memories inside unregistered sub-blocks (``platform.get_memory``)."""

    def __init__(self, owner, names, stubs, srams):
        self.owner, self.names, self.stubs, self.srams = owner, names, stubs, srams
        self.count = 0

    def get_memory(self, mem):
        if not is_sram_macro(mem):
            return Memory.elaborate(mem, None)
        name = self.names.get(id(mem))
        if name is None:
            name = f"<{self.count}>"
            self.count += 1
        width = len(Value.cast(Signal(mem.shape)))
        self.srams.append(SramUse(owner=self.owner, name=name, width=width, depth=mem.depth,
                                  read_ports=len(mem.read_ports),
                                  write_ports=len(mem.write_ports)))
        ports = memory_ports(mem)
        module = f"elmoe3d_sram_{_port_name([name])}_{width}x{mem.depth}"
        module = module.replace("<", "").replace(">", "")
        if module not in self.stubs:
            self.stubs[module] = _stub(module, ports)
        return _BlackBox(module, ports)


def hollow(top, *, owner: str, leaf_classes=()) -> Hollow:
    """Elaborate ``top`` (a ``wiring.Component``) with its registered sub-blocks
    (``leaf_classes``) and its RAMs as black boxes; see the module docstring."""
    leaf_classes = tuple(c for c in leaf_classes if c is not None and not isinstance(top, c))
    m = top.elaborate(None)
    stubs, srams, subs, names, unelaborated = {}, [], {}, {}, []

    def black_box(name, sub):
        if isinstance(sub, Memory) and name is not None:
            names[id(sub)] = name
        elif leaf_classes and isinstance(sub, leaf_classes):
            unelaborated.append(sub)
            return _replace(sub, stubs, subs)
        return None

    if isinstance(m, Module):
        replace_submodules(m, black_box)
    platform = _Platform(owner, names, stubs, srams)
    top.elaborate = lambda platform: m        # the Module built above, once
    # Amaranth's combinational-loop check takes minutes on a paper-size hollow PE; Yosys
    # ``check`` reports loops instead.
    try:
        with no_comb_cycle_check():
            text = rtlil.convert(top, name="top", platform=platform, emit_src=False,
                                 ports=convert_ports(top))
    finally:
        del top.elaborate
    return Hollow(rtlil=text, stubs="".join(stubs.values()), subs=subs, srams=srams,
                  unelaborated=unelaborated)


def inventory(top, *, owner: str, leaf_classes=()):
    """The registered sub-block instances (key -> (representative, count)) and the SRAM
    macros among the direct children of ``top``, from its elaboration alone (no RTLIL): for
    blocks whose own logic comes from a model rather than from synthesising them. Returns
    ``(subs, srams, unelaborated)``: the last lists ``top``, its elaborated module and its
    sub-blocks, none of which is elaborated here (see :attr:`Hollow.unelaborated`)."""
    leaf_classes = tuple(c for c in leaf_classes if c is not None and not isinstance(top, c))
    m = top.elaborate(None)
    subs, srams, unelaborated = {}, [], [top, m]
    for name, sub in submodules(m):
        if isinstance(sub, Memory):
            if is_sram_macro(sub):
                width = len(Value.cast(Signal(sub.shape)))
                srams.append(SramUse(owner=owner, name=name or "<anon>", width=width,
                                     depth=sub.depth, read_ports=len(sub.read_ports),
                                     write_ports=len(sub.write_ports)))
        elif leaf_classes and isinstance(sub, leaf_classes):
            key = instance_key(sub)
            rep, n = subs.get(key, (sub, 0))
            subs[key] = (rep, n + 1)
            unelaborated.append(sub)
    return subs, srams, unelaborated


def _replace(sub, stubs, subs):
    key = instance_key(sub)
    module = f"elmoe3d_bb_{type(sub).__name__}_{short_key(key)}"
    ports = component_ports(sub)
    if module not in stubs:
        stubs[module] = _stub(module, ports)
    rep, n = subs.get(key, (sub, 0))
    subs[key] = (rep, n + 1)
    return _BlackBox(module, ports)


# ---- tile attribution leaves ----------------------------------------------------------------

class MulLeaf(wiring.Component):
    """One IA8xW5 multiplier of the tile: ``product = a * field`` (signed 8 x signed 5 ->
    signed 13), the field already formed (the tile shares the field mux across rows)."""

    def __init__(self):
        from ..hw.unit_pe import FIELD_SHAPE, PRODUCT_SHAPE
        super().__init__({"a": In(signed(8)), "field": In(FIELD_SHAPE),
                          "product": Out(PRODUCT_SHAPE)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.product.eq(self.a * self.field)
        return m


class DotRowLeaf(wiring.Component):
    """One row of one lane of the tile: 32 multipliers ``a[k] * field[k]``, the 32-way adder
    tree of :mod:`elmoe3d.hw.tile` with its stage-1a registers after
    :data:`~elmoe3d.hw.tile.TREE_SPLIT` levels, and the rest of the tree into a stage-1b
    register (:data:`~elmoe3d.hw.tile.TREE_SHAPE`), enabled like the tile's pipeline."""

    def __init__(self, *, group: int = 32):
        from ..hw.tile import TREE_SHAPE
        from ..hw.unit_pe import FIELD_SHAPE
        self._group = group
        super().__init__({"act": In(signed(8)).array(group), "field": In(FIELD_SHAPE).array(group),
                          "advance": In(1), "tree": Out(TREE_SHAPE)})

    def elaborate(self, platform):
        from ..hw.tile import TREE_SPLIT, _adder_tree, _tree_levels
        m = Module()
        parts = []
        for i, part in enumerate(_tree_levels([self.act[k] * self.field[k]
                                               for k in range(self._group)], TREE_SPLIT)):
            reg = Signal(part.shape(), name=f"part_{i}")
            with m.If(self.advance):
                m.d.sync += reg.eq(part)
            parts.append(reg)
        with m.If(self.advance):
            m.d.sync += self.tree.eq(_adder_tree(parts))
        return m


class LaneFieldsLeaf(wiring.Component):
    """The bit-slice support of one lane: the LSB-augmentation mux and slice select
    (:func:`~elmoe3d.hw.unit_pe.lane_controls` of the lane's parity) and the 32 weight fields
    (:func:`~elmoe3d.hw.unit_pe.weight_field`) built from the beat's nibbles."""

    def __init__(self, *, parity: int, group: int = 32):
        from ..hw.layouts import TileMode
        from ..hw.unit_pe import FIELD_SHAPE
        from amaranth.hdl import unsigned
        self._parity, self._group = parity, group
        super().__init__({"mode": In(TileMode), "nibble": In(unsigned(4)).array(group),
                          "field": Out(FIELD_SHAPE).array(group)})

    def elaborate(self, platform):
        from ..hw.unit_pe import lane_controls, weight_field
        m = Module()
        is_msb, aug = lane_controls(self.mode, self._parity)
        for k in range(self._group):
            m.d.comb += self.field[k].eq(weight_field(self.nibble[k], is_msb, aug))
        return m

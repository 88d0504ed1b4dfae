"""The block registry: for every block of the design, under one name, its RTL, golden model,
cocotb bench, tests, area and timing figures and documentation (``elmoe3d blocks`` prints it).

One name per block in every folder (BRIEF section 8): ``hw/<name>.py`` (or a package
``hw/<name>/``), the golden model ``sw/golden/<name>.py``, the bench ``sim/bench_<name>.py``
and the tests ``tests/<tier>/test_<name>.py`` / ``test_<name>_<aspect>.py``. Where a block
departs from that, its entry says how in a note (``golden_note``, ``bench_note``,
``tests_note``); ``tests/tools/test_blocks.py`` fails on a departure without a note, on a note
without a departure, on a path that does not exist, on a module of ``hw/`` that no block lists
and :data:`SHARED` does not, and on a :class:`amaranth.lib.wiring.Component` subclass defined
in ``hw/`` that no block covers.

A block owns the modules in :attr:`Block.rtl`, each listed by name: a module, or a package
(every module under it belongs to the block too, e.g. the PE's sub-components in ``hw/pe/``).
A block of several files lists each (the bridge: ``hw/bridge.py``, ``hw/bridge_rx.py``,
``hw/bridge_tx.py``, ``hw/bridge_bytes.py``); a name alone decides nothing, so a new
``hw/ring_buffer.py`` is no block's until an entry lists it.
Modules of ``hw/`` that are no block's -- shared definitions such as the ISA's layouts -- are
listed in :data:`SHARED`; they may define a Component only as a base class of blocks'
Components.

Area categories are not written here: :func:`area_categories` reads them from the synthesis
registry (:data:`elmoe3d.synth.blocks.BLOCK_TYPES`) for the classes a block's modules define.

Plain data: this module imports no Amaranth (the paths are found through the import system
without importing the modules).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path


__all__ = ["Block", "Shared", "BLOCKS", "SHARED", "ROOT", "block", "block_of_module",
           "module_file", "area_categories"]

#: The repository checkout this package lives in (tests and docs are looked up under it).
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Block:
    """One block of the design.

    Attributes
    ----------
    name : str
        The block's name in every folder (``hw/<name>``, ``sw/golden/<name>.py``, ...).
    summary : str
        What it is, in a line, with the paper section.
    rtl : tuple of str
        Modules or packages the block owns, every one listed (``"elmoe3d.hw.pe"``: the package
        and every module under it); the first is ``elmoe3d.hw.<name>``.
    tops : tuple of str
        Its top class(es), ``"module:Class"`` (a Component, or an ``Elaboratable`` for the
        FPGA primitives); several when the block is a family used side by side (the VPU's
        units); empty when it defines no hardware of its own (shared arithmetic).
    golden : tuple of str
        Golden-model modules (``elmoe3d.sw.golden.<name>`` by convention).
    bench : str or None
        The cocotb bench module (``elmoe3d.sim.bench_<name>`` by convention).
    tests_extra : tuple of str
        Test files outside the convention (repository-relative paths).
    timing : str or None
        The timing category that covers the block today besides :data:`STA_TIMING`, in a few
        words (``"DRAM device timing"``, ``"FPGA fmax"``), if any.
    sta : bool or None
        Timed by ``elmoe3d synth --timing`` (:data:`STA_TIMING`): by default when it has an
        area category (:func:`area_categories`); True for a block the die roll-up synthesises
        as a part of the die (its area under ``area_note``).
    doc : str
        Documentation section, ``docs/<file>.md#<heading anchor>``.
    golden_note, bench_note, tests_note, area_note : str
        Why the block departs from the convention (golden model, bench, tests), or where its
        area comes from when synthesis has no category for it; empty when it does not.
    timing_note : str
        What the :attr:`timing` category checks and where; empty without one.
    """

    name: str
    summary: str
    rtl: tuple
    tops: tuple
    doc: str
    golden: tuple = ()
    bench: str | None = None
    tests_extra: tuple = ()
    timing: str | None = None
    sta: bool | None = None
    golden_note: str = ""
    bench_note: str = ""
    tests_note: str = ""
    area_note: str = ""
    timing_note: str = ""

    @property
    def conventional_golden(self) -> str:
        return f"elmoe3d.sw.golden.{self.name}"

    @property
    def conventional_bench(self) -> str:
        return f"elmoe3d.sim.bench_{self.name}"

    @property
    def test_patterns(self) -> tuple:
        """Repository-relative globs of the block's conventionally named tests."""
        return (f"tests/*/test_{self.name}.py", f"tests/*/test_{self.name}_*.py")

    def conventional_tests(self, root: Path = ROOT) -> list:
        """The conventionally named test files that exist, repository-relative, sorted."""
        return sorted({str(p.relative_to(root)) for pat in self.test_patterns
                       for p in root.glob(pat)})

    def tests(self, root: Path = ROOT) -> list:
        """Every test file of the block: the conventional ones, then :attr:`tests_extra`."""
        return self.conventional_tests(root) + [t for t in self.tests_extra]

    def match(self, module: str) -> str | None:
        """The entry of :attr:`rtl` that ``module`` falls under, the longest if several: the
        module itself or a package it lies in (``elmoe3d.hw.pe`` for
        ``elmoe3d.hw.pe.memories``); ``None`` if none (``elmoe3d.hw.bridge_rx`` is the
        bridge's because the bridge lists it, not by its name)."""
        hits = [m for m in self.rtl if module == m or module.startswith(m + ".")]
        return max(hits, key=len) if hits else None

    def owns(self, module: str) -> bool:
        """``module`` belongs to this block: :func:`block_of_module` picks it."""
        return block_of_module(module) is self


@dataclass(frozen=True)
class Shared:
    """A module of ``hw/`` that is no block: ``module`` and what it holds."""

    module: str
    what: str


#: Timing category and note of the DRAM controllers' blocks.
_DRAM_TIMING = dict(timing="DRAM device timing",
                    timing_note="the device models check every constraint of "
                                "elmoe3d.sw.golden.dram (HB, LPDDR5)")
#: Area note of the FPGA prototype's blocks.
_FPGA_AREA = "FPGA utilization of the board top (synth.fpga)"


def _covered_by(block: str) -> str:
    """Bench note of a block with no bench of its own, covered by ``block``'s bench."""
    return f"no bench of its own: covered by the {block}'s (sim/bench_{block}.py)"


#: The blocks, leaves first.
BLOCKS = (
    Block("unit_pe", "IA8xW5 unit PE and the MSB/LSB slice combiner (Section 4.2, Fig. 7)",
          rtl=("elmoe3d.hw.unit_pe",), tops=("elmoe3d.hw.unit_pe:UnitPE",),
          golden=("elmoe3d.sw.golden.datapath",),
          golden_note="the unit PE's arithmetic is the IA8xW5 datapath, "
                      "sw/golden/datapath.py",
          bench_note=_covered_by("tile"),
          area_note="in the tensor tile's area model (synth.blocks TILE_FIT, MulLeaf, DotRowLeaf)",
          sta=True,
          doc="docs/numerics.md#3-unit-pe-ia8xw5-and-modes-swgoldendatapathpy"),
    Block("fixed", "shared fixed-point RTL: saturating int64 add, round-half-even shifts",
          rtl=("elmoe3d.hw.fixed",), tops=(),
          golden=("elmoe3d.sw.golden.datapath", "elmoe3d.sw.golden.vpu"),
          golden_note="functions, not a block of its own: saturating_add in "
                      "sw/golden/datapath.py, the rounding shifts in sw/golden/vpu.py",
          bench_note="no bench: functions inside the tile's, the VPU's and the link's logic",
          area_note="inside the blocks that use it (tile, VPU, aggregation link)",
          doc="docs/numerics.md#5-fused-dequantization-into-a-q24-accumulator"),
    Block("tile", "tensor tile: rows x lanes unit PEs, group psums, fused dequantization "
                  "(Section 4.2)",
          rtl=("elmoe3d.hw.tile",), tops=("elmoe3d.hw.tile:TensorTile",),
          golden=("elmoe3d.sw.golden.tile",), bench="elmoe3d.sim.bench_tile",
          doc="docs/numerics.md#4-group-psums"),
    Block("vpu", "vector processing unit: SwiGLU, combine, requant, row max, FP32 out "
                 "(Section 4.2)",
          rtl=("elmoe3d.hw.vpu",),
          tops=("elmoe3d.hw.vpu:SwiGLUUnit", "elmoe3d.hw.vpu:CombineUnit",
                "elmoe3d.hw.vpu:RequantUnit", "elmoe3d.hw.vpu:RowMaxExponent",
                "elmoe3d.hw.vpu:Fp32Converter"),
          golden=("elmoe3d.sw.golden.vpu",),
          bench_note="no bench of its own: its cocotb coverage is the PE's (sim/bench_pe.py)",
          doc="docs/numerics.md#7-vpu-swiglu-requantization-swgoldenvpupy-hwvpupy"),
    Block("pe", "processing element: memories, decoder, load, GEMM, VPU sinks, link port "
                "(Section 4.1-4.2)",
          rtl=("elmoe3d.hw.pe",), tops=("elmoe3d.hw.pe:PE",),
          golden=("elmoe3d.sw.golden.pe",), bench="elmoe3d.sim.bench_pe",
          tests_extra=("tests/cocotb/test_host_rtl.py",),
          tests_note="the host's RTL backend runs the PE's Verilog: "
                     "tests/cocotb/test_host_rtl.py (bench sim/bench_host.py)",
          doc="docs/pe.md#the-processing-element-pe"),
    Block("load_router", "per-PE command and load router: HB/EXT words to the PE's ld stream "
                         "(Section 4.1)",
          rtl=("elmoe3d.hw.load_router",), tops=("elmoe3d.hw.load_router:LoadRouter",),
          golden_note="no golden module: it moves words unchanged; checked against the words "
                      "sent in tests/amaranth/test_load_router.py",
          bench_note=_covered_by("die"),
          doc="docs/memory.md#logic-die"),
    Block("agg_link", "aggregation link of a PE group: bypass, all-to-all, reduce-add, "
                      "reduce-max (Section 4.1, 5.2)",
          rtl=("elmoe3d.hw.agg_link",), tops=("elmoe3d.hw.agg_link:AggregationLink",),
          golden=("elmoe3d.sw.golden.agg_link",), bench="elmoe3d.sim.bench_agg_link",
          doc="docs/memory.md#aggregation-link"),
    Block("ring", "streamline ring: external weight data to the PEs, unicast and multicast "
                  "(Section 4.1)",
          rtl=("elmoe3d.hw.ring",), tops=("elmoe3d.hw.ring:StreamlineRing",),
          golden=("elmoe3d.sw.golden.ring",), bench="elmoe3d.sim.bench_ring",
          doc="docs/memory.md#streamline-ring"),
    Block("dram", "DRAM channel controllers: HB bank and LPDDR5 (Section 4.1, Table 1)",
          rtl=("elmoe3d.hw.dram", "elmoe3d.hw.dram_layouts", "elmoe3d.hw.hb_ctrl",
               "elmoe3d.hw.ext_ctrl"),
          tops=("elmoe3d.hw.dram:DramController", "elmoe3d.hw.hb_ctrl:HBController",
                "elmoe3d.hw.ext_ctrl:ExtController"),
          golden=("elmoe3d.sw.golden.dram",), bench="elmoe3d.sim.bench_dram",
          **_DRAM_TIMING, doc="docs/memory.md#dram"),
    Block("dram_port", "word port: PE words to DRAM bursts and back (Section 4.1)",
          rtl=("elmoe3d.hw.dram_port",), tops=("elmoe3d.hw.dram_port:DramWordPort",),
          golden_note="no golden module of its own: words go through unchanged, cut into "
                      "beats by elmoe3d.sw.golden.ring.word_beats; checked against the DRAM "
                      "device models",
          bench_note=_covered_by("die"),
          tests_extra=("tests/amaranth/test_die_dram_port.py",),
          tests_note="tested as a part of the die: tests/amaranth/test_die_dram_port.py",
          area_note="in the die roll-up (synth.blocks.DIE_BLOCKS, HB and EXT word ports)",
          sta=True,
          **_DRAM_TIMING, doc="docs/memory.md#logic-die"),
    Block("ext_stream", "EXT read streamer: descriptors to LPDDR5 word reads to ring flits "
                        "(Section 4.1, 5.1)",
          rtl=("elmoe3d.hw.ext_stream",), tops=("elmoe3d.hw.ext_stream:ExtStreamer",),
          golden=("elmoe3d.sw.golden.ring",),
          golden_note="the golden cut of a transfer into flits is the ring's: "
                      "elmoe3d.sw.golden.ring.ring_flits",
          bench_note=_covered_by("die"),
          tests_extra=("tests/amaranth/test_die_ext_stream.py",),
          tests_note="tested as a part of the die: tests/amaranth/test_die_ext_stream.py",
          area_note="in the die roll-up (synth.blocks.DIE_BLOCKS, EXT streamer)",
          sta=True,
          doc="docs/memory.md#logic-die"),
    Block("ext_sched", "EXT admission scheduler: credit-based per-PE admission of EXT read "
                       "descriptors onto the ring, one per group (Section 4.1)",
          rtl=("elmoe3d.hw.ext_sched",), tops=("elmoe3d.hw.ext_sched:ExtScheduler",),
          golden=("elmoe3d.sw.golden.ext_sched",),
          bench_note=_covered_by("die"),
          area_note="in the die roll-up (synth.blocks.DIE_BLOCKS, EXT schedulers)",
          sta=True,
          doc="docs/memory.md#logic-die"),
    Block("die", "logic die: PE groups, HB banks, links, ring, EXT controller, host queues "
                 "(Section 4.1, Fig. 6)",
          rtl=("elmoe3d.hw.die", "elmoe3d.hw.die_layouts"), tops=("elmoe3d.hw.die:LogicDie",),
          golden_note="the host's group run is the die's golden model: "
                      "elmoe3d.sw.host.parallel.run_group (outputs against "
                      "elmoe3d.sw.golden.expert.ref_moe)",
          bench="elmoe3d.sim.bench_die",
          area_note="the die roll-up of its blocks (synth.blocks.DIE_BLOCKS)",
          doc="docs/memory.md#logic-die"),
    Block("bridge", "FPGA bridge: UART frames to the PE's command and load streams and back",
          rtl=("elmoe3d.hw.bridge", "elmoe3d.hw.bridge_rx", "elmoe3d.hw.bridge_tx",
               "elmoe3d.hw.bridge_bytes"),
          tops=("elmoe3d.hw.bridge:Bridge",),
          golden=("elmoe3d.sw.golden.bridge",),
          bench_note=_covered_by("board"),
          area_note=_FPGA_AREA,
          doc="docs/fpga.md#bridge-hardware"),
    Block("uart", "UART receiver and transmitter of the FPGA prototype",
          rtl=("elmoe3d.hw.uart",), tops=("elmoe3d.hw.uart:UartRx", "elmoe3d.hw.uart:UartTx"),
          golden_note="no golden module: 8N1 framing, checked bit by bit in "
                      "tests/amaranth/test_uart.py",
          bench_note=_covered_by("board"),
          area_note=_FPGA_AREA,
          doc="docs/fpga.md#the-uart-hwuartpy"),
    Block("pll", "ECP5 PLL of the FPGA prototype (EHXPLLL)",
          rtl=("elmoe3d.hw.pll",), tops=("elmoe3d.hw.pll:Ecp5Pll",),
          golden_note="no golden module: a vendor primitive; its dividers are checked in "
                      "tests/tools/test_fpga_flow.py",
          bench_note="no bench: a vendor primitive (the board bench runs without it)",
          tests_extra=("tests/tools/test_fpga_flow.py",),
          tests_note="tested with the FPGA flow: tests/tools/test_fpga_flow.py",
          area_note=_FPGA_AREA,
          doc="docs/fpga.md#board-top"),
    Block("board", "FPGA board top: PLL, UART, bridge, load router, PE in its FPGA-lean form",
          rtl=("elmoe3d.hw.board",),
          tops=("elmoe3d.hw.board:BoardTop", "elmoe3d.hw.board:BoardPlatformTop"),
          golden_note="no golden module of its own: the bridge protocol "
                      "(sw/golden/bridge.py) and the PE's golden model",
          bench="elmoe3d.sim.bench_board",
          area_note=_FPGA_AREA,
          timing="FPGA fmax",
          timing_note="the board top's clock frequency (synth.fpga.parse_report)",
          doc="docs/fpga.md#board-top"),
)

#: Modules of ``hw/`` that are no block: definitions several blocks share.
SHARED = (
    Shared("elmoe3d.hw.isa", "the PE's command and load layouts, built from elmoe3d.isa"),
    Shared("elmoe3d.hw.layouts", "stream payload layouts and sticky-flag helpers shared by "
                                 "blocks"),
    Shared("elmoe3d.hw.checked", "CheckedComponent (parameters checked before the object "
                                 "exists), a base class of blocks' Components"),
)


def block(name: str) -> Block:
    """The block called ``name``, or whose top Component class is ``name`` (``"TensorTile"`` ->
    the ``tile`` block); either in any letter case. ``ValueError`` naming ``name`` and the known
    blocks otherwise."""
    key = name.lower()
    for b in BLOCKS:
        if b.name == key or any(top.rpartition(":")[2].lower() == key for top in b.tops):
            return b
    raise ValueError(f"no block or top Component class {name!r}; blocks: "
                     f"{', '.join(b.name for b in BLOCKS)}")


def block_of_module(module: str) -> Block | None:
    """The block that owns ``module`` (``"elmoe3d.hw.pe.memories"`` -> the ``pe`` block): the
    one with the longest matching :attr:`Block.rtl` entry (:meth:`Block.match`); ``None`` for
    a shared module or one no block lists."""
    best, length = None, -1
    for b in BLOCKS:
        hit = b.match(module)
        if hit is not None and len(hit) > length:
            best, length = b, len(hit)
    return best


def module_file(module: str) -> Path | None:
    """The source of ``module`` (``elmoe3d.<package>.<...>``): its ``.py`` file, or its folder
    for a package; ``None`` if there is none. Only the top-level package is looked up
    through the import system (``elmoe3d.hw`` maps to the checkout's ``hw/``); nothing under
    it is imported."""
    parts = module.split(".")
    if parts[0] != "elmoe3d":
        raise ValueError(f"module: expected a module of elmoe3d, got {module!r}")
    top = ".".join(parts[:2])
    spec = importlib.util.find_spec(top) if len(parts) > 1 else None
    if spec is None or spec.submodule_search_locations is None:
        base, rest = Path(importlib.util.find_spec("elmoe3d").origin).parent, parts[1:]
    else:
        base, rest = Path(list(spec.submodule_search_locations)[0]), parts[2:]
    path = base.joinpath(*rest) if rest else base
    if rest and path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path
    return None


#: The timing category of every block with an area category of ``elmoe3d synth``
#: (:func:`timing_categories`), and what it checks.
STA_TIMING = "ASAP7 STA"
STA_TIMING_NOTE = ("elmoe3d synth --timing: each of the block's synthesis jobs, its worst "
                   "register-to-register path against the clock (the paper's 1 GHz by "
                   "default) from the ASAP7 NLDM tables (synth.timing; README \"Area and "
                   "timing\")")


def timing_categories(b: Block) -> list:
    """The timing categories covering block ``b``: its own :attr:`~Block.timing`, then
    :data:`STA_TIMING` if ``elmoe3d synth`` synthesises it (:func:`area_categories`)."""
    return ([b.timing] if b.timing else []) + ([STA_TIMING] if _sta(b) else [])


def timing_notes(b: Block) -> str:
    """What each of :func:`timing_categories` checks, in their order."""
    notes = [b.timing_note] if b.timing_note else []
    return "; ".join(notes + ([STA_TIMING_NOTE] if _sta(b) else []))


def _sta(b: Block) -> bool:
    return b.sta if b.sta is not None else bool(area_categories(b))


def area_categories(b: Block) -> list:
    """The area categories of ``elmoe3d synth`` for block ``b``: those of the synthesis
    registry's classes (:data:`elmoe3d.synth.blocks.BLOCK_TYPES`) in the block's modules, in
    registry order. Imports the synthesis package (and so Amaranth)."""
    from .synth.blocks import BLOCK_TYPES
    out = []
    for bt in BLOCK_TYPES:
        if block_of_module(bt.path.partition(":")[0]) is b and bt.category not in out:
            out.append(bt.category)
    return out

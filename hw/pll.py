"""The board clock from an ECP5 PLL (``EHXPLLL``) for the FPGA prototype (issue 7).

The board top's longest path is longer than the period of a board's oscillator (the ULX3S's
25 MHz), so :class:`~elmoe3d.hw.board.BoardPlatformTop` can run its ``sync`` domain from a
PLL output instead: :func:`ecp5_pll_dividers` finds the dividers that give the wanted
frequency exactly, :class:`Ecp5Pll` instantiates the primitive and holds ``sync`` in reset
until the PLL locks. nextpnr-ecp5 derives the output's timing constraint from the input's
(the LPF ``FREQUENCY PORT`` of the board clock) and the dividers.

Ranges (Lattice, *ECP5 and ECP5-5G Family Data Sheet*, FPGA-DS-02012, sysCLOCK PLL timing;
the same as nextpnr's ``ecppll``): input 8-400 MHz, phase-detector input (``f_in /
CLKI_DIV``) 3.125-400 MHz, VCO (``f_out * CLKOP_DIV``, feedback from CLKOP) 400-800 MHz,
output 3.125-400 MHz; ``CLKI_DIV`` and ``CLKOP_DIV`` 1..128, ``CLKFB_DIV`` 1..80.
"""

from __future__ import annotations

from fractions import Fraction

from amaranth.hdl import ClockSignal, Elaboratable, Instance, Module, Signal
from amaranth.lib.cdc import ResetSynchronizer

from .checked import check_param


__all__ = ["ecp5_pll_dividers", "Ecp5Pll"]


def ecp5_pll_dividers(clk_in_hz: int, clk_out_hz: int) -> dict:
    """``{"CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV"}`` for ``f_out = f_in * CLKFB_DIV / CLKI_DIV``
    exactly, within the ranges of the module docstring (the largest phase-detector
    frequency, then the VCO nearest 600 MHz).

    Raises
    ------
    ValueError
        ``clk_in_hz`` or ``clk_out_hz`` out of range, or no dividers give ``clk_out_hz``
        exactly (the message names ``clk_hz`` and the nearest reachable frequencies' rule).
    """
    for name, v in (("clk_in_hz", clk_in_hz), ("clk_hz", clk_out_hz)):
        check_param(name, v)
    if not 8_000_000 <= clk_in_hz <= 400_000_000:
        raise ValueError(f"clk_in_hz: the ECP5 PLL takes 8-400 MHz, got {clk_in_hz / 1e6:g} MHz")
    if not 3_125_000 <= clk_out_hz <= 400_000_000:
        raise ValueError(f"clk_hz: the ECP5 PLL gives 3.125-400 MHz, got "
                         f"{clk_out_hz / 1e6:g} MHz")
    ratio = Fraction(clk_out_hz, clk_in_hz)
    best = None
    for clki in range(1, 129):
        pfd = Fraction(clk_in_hz, clki)
        if not 3_125_000 <= pfd <= 400_000_000:
            continue
        clkfb = ratio * clki
        if clkfb.denominator != 1 or not 1 <= clkfb <= 80:
            continue
        for clkop in range(1, 129):
            vco = clk_out_hz * clkop
            if 400_000_000 <= vco <= 800_000_000:
                key = (-pfd, abs(vco - 600_000_000))
                if best is None or key < best[0]:
                    best = (key, {"CLKI_DIV": clki, "CLKFB_DIV": int(clkfb),
                                  "CLKOP_DIV": clkop})
    if best is None:
        raise ValueError(f"clk_hz: {clk_out_hz / 1e6:g} MHz is not {clk_in_hz / 1e6:g} MHz x "
                         f"CLKFB_DIV / CLKI_DIV for any dividers in range (1..80 / 1..128, the "
                         f"phase detector at 3.125 MHz or more)")
    return best[1]


class Ecp5Pll(Elaboratable):
    """``EHXPLLL`` from ``clk_in`` (``clk_in_hz``) driving the clock of ``domain`` (defined
    by the caller, e.g. ``m.domains.sync = ClockDomain()``) at ``clk_hz``, its reset held
    (synchronously released, :class:`~amaranth.lib.cdc.ResetSynchronizer`) until the PLL
    reports lock.

    Parameters (keyword-only): ``clk_in`` (a 1-bit signal: the board clock's input buffer),
    ``clk_in_hz``, ``clk_hz`` (both Hz), ``domain`` (default ``"sync"``). Raises
    ``ValueError`` as :func:`ecp5_pll_dividers`. Attribute :attr:`dividers`; ``locked`` is
    the PLL's LOCK.
    """

    def __init__(self, *, clk_in, clk_in_hz: int, clk_hz: int, domain: str = "sync"):
        self.dividers = ecp5_pll_dividers(clk_in_hz, clk_hz)
        self.domain = domain
        self.clk_in = clk_in
        self.clk_in_hz = clk_in_hz
        self.clk_hz = clk_hz
        self.locked = Signal()

    def elaborate(self, platform):
        m = Module()
        d = self.dividers
        clkop = Signal()
        m.submodules.pll = Instance(
            "EHXPLLL",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=d["CLKI_DIV"], p_CLKFB_DIV=d["CLKFB_DIV"],
            p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=d["CLKOP_DIV"],
            p_CLKOP_CPHASE=d["CLKOP_DIV"] - 1, p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
            a_FREQUENCY_PIN_CLKI=f"{self.clk_in_hz / 1e6:g}",
            a_FREQUENCY_PIN_CLKOP=f"{self.clk_hz / 1e6:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            i_CLKI=self.clk_in, i_CLKFB=clkop, o_CLKOP=clkop, o_LOCK=self.locked,
            i_RST=0, i_STDBY=0, i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1, i_PHASESTEP=1,
            i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0)
        m.d.comb += ClockSignal(self.domain).eq(clkop)
        m.submodules.reset_sync = ResetSynchronizer(~self.locked, domain=self.domain)
        return m

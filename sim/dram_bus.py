"""cocotb driver of the behavioural DRAM devices (:class:`~elmoe3d.sw.golden.dram.DramDevice`)
on a DUT's DRAM command buses: the one loop the DRAM controller bench
(:mod:`elmoe3d.sim.bench_dram`) and the die bench use.

A bus is the signal group ``<prefix>__<name>`` for the names in :data:`BUS_SIGNALS` (the
controller's ``dram`` port, :mod:`elmoe3d.hw.dram`): a row command (``row_kind``: ACT,
PRE, REFPB, REFAB; ``row_bank``, ``row_addr``), a column command (``col_write``, ``col_bank``,
``col_addr``, ``col_wdata``) and the read data the device returns (``rd_valid``,
``rd_data``).
"""

from __future__ import annotations

from cocotb.triggers import ReadOnly, RisingEdge

from ..sw.golden.dram import TimingViolation


__all__ = ["BUS_SIGNALS", "dram_bus", "sample_bus", "drive_devices"]

#: Signals of one DRAM command bus, below its prefix.
BUS_SIGNALS = ("row_valid", "row_kind", "row_bank", "row_addr", "col_valid", "col_write",
               "col_bank", "col_addr", "col_wdata", "rd_valid", "rd_data")


def dram_bus(dut, prefix: str) -> dict:
    """The handles ``{name: dut.<prefix>__<name>}`` of one bus (``prefix`` e.g. ``"dram"``,
    ``"dram__0"``, ``"hb__3"``)."""
    return {n: getattr(dut, f"{prefix}__{n}") for n in BUS_SIGNALS}


def sample_bus(bus: dict) -> tuple:
    """``(row, col)`` commands on ``bus`` this cycle (read in the read-only phase): ``row`` =
    ``(kind, bank, addr)`` or None, ``col`` = ``(write, bank, addr, wdata or 0)`` or None."""
    row = col = None
    if bus["row_valid"].value == 1:
        row = (int(bus["row_kind"].value), int(bus["row_bank"].value),
               int(bus["row_addr"].value))
    if bus["col_valid"].value == 1:
        write = int(bus["col_write"].value)
        col = (write, int(bus["col_bank"].value), int(bus["col_addr"].value),
               int(bus["col_wdata"].value) if write else 0)
    return row, col


async def drive_devices(dut, devices, violations: list, *, trace: list | None = None):
    """Clock every device of ``devices`` (``[(DramDevice, bus)]``, buses from :func:`dram_bus`)
    once per logic cycle of ``dut.clk`` with the commands it sampled on its bus; its read data
    goes back (``rd_valid``, ``rd_data``) during the next cycle. Runs until cancelled.

    A :class:`~elmoe3d.sw.golden.dram.TimingViolation` is appended (as text) to ``violations``
    and logged, and that device stops (its ``rd_valid`` low from then on); the others go on.
    ``trace`` (optional) collects ``(device cycle, row, col)`` of every cycle with a command."""
    rd = [None] * len(devices)
    shown = [False] * len(devices)
    live = [True] * len(devices)
    while True:
        for i, (_, bus) in enumerate(devices):
            if rd[i] is not None:
                bus["rd_data"].value = rd[i]
            if shown[i] != (rd[i] is not None):
                shown[i] = rd[i] is not None
                bus["rd_valid"].value = int(shown[i])
        await ReadOnly()
        for i, (dev, bus) in enumerate(devices):
            if not live[i]:
                continue
            row, col = sample_bus(bus)
            if trace is not None and (row or col):
                trace.append((dev.cycle, row, col))
            try:
                rd[i] = dev.clock(row, col)
            except TimingViolation as exc:
                violations.append(str(exc))
                dut._log.error("%s", exc)
                live[i] = False
                rd[i] = None
        await RisingEdge(dut.clk)

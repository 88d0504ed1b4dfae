"""The DRAM controller's interface definitions (:class:`elmoe3d.hw.dram.DramController`;
paper Section 4.1, Table 1): the request payload, the sticky error flags, and the command and
data bus to the DRAM channel with its row-command kinds. Shared by the controller, the word
port, the EXT controller, the die and the benches; :mod:`elmoe3d.hw.dram` re-exports every
name.
"""

from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from ..config import DramConfig
from .checked import check_param
from .layouts import address_bits


__all__ = ["RowKind", "request_layout", "dram_bus_signature", "dram_errors_layout"]


class RowKind(enum.Enum, shape=2):
    """Row-command kind on :func:`dram_bus_signature`'s ``row_kind`` (same values as
    :class:`elmoe3d.sw.golden.dram.RowCmd`)."""
    ACT = 0
    PRE = 1
    REFPB = 2
    REFAB = 3


def request_layout(addr_bits: int, length_bits: int) -> data.StructLayout:
    """One request of a DRAM controller.

    Fields
    ------
    write : 1
        1 = write (``length`` bursts of write data follow on ``wdata``), 0 = read.
    addr : addr_bits
        First burst (the controller's unit of ``burst_bytes``; wraps at the capacity).
    length : length_bits
        Bursts, consecutive from ``addr``. A request of length 0 is accepted and does nothing.
    """
    return data.StructLayout({"write": unsigned(1), "addr": unsigned(addr_bits),
                              "length": unsigned(length_bits)})


def dram_errors_layout(channels: int = 1) -> data.StructLayout:
    """The sticky error flags of a DRAM controller (``errors``; ``errors_clear`` has the same
    layout, a write-1-to-clear strobe per bit).

    Fields
    ------
    refresh_overflow : unsigned(channels)
        Bit c: channel c's refresh debt reached ``max_postponed`` owed refresh commands (the
        JEDEC limit: 8), so the controller forced the refresh (it closed rows its queued
        requests had prepared, refreshed, and reopened them). A client that holds the column
        pipeline (a write request whose ``wdata`` beats do not come, ``rdata`` not taken
        while the read buffer is full) for about ``max_postponed / 2`` refresh intervals
        after the refresh became urgent causes it; the data stay correct.

        The event is a *level*, unlike the aggregation link's one-cycle events: the flag is
        set in every cycle the debt is at ``max_postponed`` or more, i.e. from the cycle
        after the debt reaches the limit until the cycle after the forced REF brings it
        below (a few DRAM clocks: PRE, tRP, REF). A host clear strobe in that time is
        ignored (setting wins); once the debt is below the limit a clear takes effect.
    """
    check_param("channels", channels)
    return data.StructLayout({"refresh_overflow": unsigned(channels)})


def dram_bus_signature(cfg: DramConfig) -> wiring.Signature:
    """The command and data bus between a controller and one DRAM channel (device side is the
    behavioural model :class:`elmoe3d.sw.golden.dram.DramDevice`).

    Out (controller -> device), valid for one logic cycle, only on a DRAM clock edge:
    ``tick`` (this logic cycle carries a DRAM command-clock edge), ``row_valid``,
    ``row_kind`` (:class:`RowKind`), ``row_bank`` (bank; for REFPB the refresh unit),
    ``row_addr`` (row of an ACT); ``col_valid``, ``col_write``, ``col_bank``, ``col_addr``
    (column, in bursts), ``col_wdata`` (the burst of a WR, ``burst_bytes * 8`` bits).
    In (device -> controller): ``rd_valid``, ``rd_data`` -- one read burst, in RD order.
    """
    bank, row, col = address_bits(cfg.banks), address_bits(cfg.rows), address_bits(cfg.columns)
    return wiring.Signature({
        "tick": Out(1),
        "row_valid": Out(1), "row_kind": Out(RowKind), "row_bank": Out(bank),
        "row_addr": Out(row),
        "col_valid": Out(1), "col_write": Out(1), "col_bank": Out(bank), "col_addr": Out(col),
        "col_wdata": Out(cfg.burst_bytes * 8),
        "rd_valid": In(1), "rd_data": In(cfg.burst_bytes * 8),
    })

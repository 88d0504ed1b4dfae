"""Area of the SRAM macros (WMEM, IOMEM, block buffers) from published 7 nm SRAM layouts.

WMEM and IOMEM are macros, not gates: :func:`~elmoe3d.synth.blocks.hollow` takes every RAM
of at least :data:`~elmoe3d.synth.blocks.SRAM_MIN_BITS` bits out of gate synthesis and this
module gives its area from its geometry.

Model
-----
A macro of ``rows x cols`` bit cells (one physical column per word bit, a column multiplexer
of ``m = ceil(depth / MAX_ROWS)`` when the memory is deeper than :data:`MAX_ROWS`)::

    area = rows * cols * CELL_ROW_UM2 + cols * COLUMN_UM2            (um^2)

times the number of read ports (a k-read-port memory is k copies of a 1R1W macro, the usual
way to build extra read ports from single-port arrays).

``CELL_ROW_UM2`` (a bit cell with its share of the row periphery, per column) and
``COLUMN_UM2`` (per-column periphery: precharge, sense amplifier, write driver, multiplexer and
control) are solved exactly from two published ASAP7 SRAM macros with the same 256 physical
columns and 64 and 256 rows (The-OpenROAD-Project/asap7_sram_0p0, ASAP7 7 nm, bit cell
``6t122``; LEF files ``generated/LEF/srambank_64x4x64_6t122.lef`` and
``generated/LEF/srambank_256x4x64_6t122.lef``, commit
b5c90cbbf2c3a962501040f81234bb84c877cba3)::

    srambank_64x4x64_6t122   SIZE  9.612 BY 77.76  =  747.429 um^2   (16,384 bits)
    srambank_256x4x64_6t122  SIZE 30.348 BY 77.76  = 2359.860 um^2   (65,536 bits)

    CELL_ROW_UM2 = (2359.860 - 747.429) / (256*256 - 64*256) = 0.032805 um^2
    COLUMN_UM2   = (747.429 - 64*256*CELL_ROW_UM2) / 256     = 0.820125 um^2

Timing (``make synth --timing``, :mod:`elmoe3d.synth.timing`): a macro's read data arrives
:data:`READ_CLK_TO_Q_PS` after the clock edge and its inputs (address, enables, write data)
must settle :data:`SETUP_PS` before it: the clock-to-``dataout`` and the largest
``setup_rising`` constraint of the largest published bank's Liberty file
(``generated/LIB/srambank_256x4x64_6t122.lib`` of the same repository, commit
9f5af0939e8dd3cc1a9693a50b23441691dd7d25, BSD 3-Clause, Copyright (c) 2023 The OpenROAD
Project), at a 20 ps clock and data transition and the table's smallest load (5.76 fF):
``cell_fall`` 149.8 ps (``cell_rise`` 147.5), ``ADDRESS`` setup 50.1 ps (fall; ``banksel``
49.8, ``read`` 41.2, ``write`` 17.3, ``wd`` below 0).

Cross-check: TSMC's N7 high-density 6T bit cell is 0.027 um^2 (S.-Y. Wu et al., "A 7nm CMOS
platform technology featuring 4th generation FinFET transistors with a 0.027um^2 high density
6-T SRAM cell for mobile SoC applications", IEDM 2016): the ASAP7 array spends 0.0328 um^2 per
bit with its row periphery, an array efficiency of 0.027 / 0.0328 = 82 % against the N7 cell;
the 64-row macro as a whole reaches 0.0456 um^2 per bit (59 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..checks import check_int


__all__ = ["CELL_ROW_UM2", "COLUMN_UM2", "MAX_ROWS", "N7_HD_BITCELL_UM2", "sram_area",
           "SOURCES", "READ_CLK_TO_Q_PS", "SETUP_PS", "TIMING_SOURCE", "READ_CLK_TO_Q_RISE_PS",
           "READ_TRANSITION_PS", "HOLD_PS", "INPUT_CAP_FF", "CLOCK_CAP_FF", "MAX_LOAD_FF"]


_SMALL = (9.612 * 77.76, 64 * 256)         # (um^2, bits), 256 columns x 64 rows
_LARGE = (30.348 * 77.76, 256 * 256)       # 256 columns x 256 rows

#: Bit cell plus its share of the row periphery, per column (um^2).
CELL_ROW_UM2 = (_LARGE[0] - _SMALL[0]) / (_LARGE[1] - _SMALL[1])
#: Column periphery per physical column (um^2).
COLUMN_UM2 = (_SMALL[0] - _SMALL[1] * CELL_ROW_UM2) / 256
#: Rows of the largest published macro used; deeper memories fold with a column multiplexer.
MAX_ROWS = 256
#: TSMC N7 HD 6T bit cell (IEDM 2016), for the array-efficiency cross-check only.
N7_HD_BITCELL_UM2 = 0.027

#: Clock to read data of a macro (ps): srambank_256x4x64_6t122's ``dataout`` ``cell_fall``
#: at a 20 ps clock transition and 5.76 fF.
READ_CLK_TO_Q_PS = 149.8
#: Setup of a macro's inputs before the clock (ps): the bank's largest ``setup_rising``
#: (``ADDRESS``, falling, 20 ps transitions).
SETUP_PS = 50.1
#: The rest of the bank's figures the export's Liberty view of a macro kind takes
#: (:func:`elmoe3d.synth.export.sram_liberty`), from the same file, in ps and fF: ``dataout``'s
#: ``cell_rise`` at the same point (the clock-to-data arc's rise; the fall is
#: :data:`READ_CLK_TO_Q_PS`), its ``rise_transition`` and ``fall_transition`` there, the
#: ``ADDRESS`` ``hold_rising`` (the larger of rise and fall, 20 ps transitions, interpolated in
#: the related pin's), an input pin's ``capacitance`` (``ADDRESS``, ``wd``, ``write``, ``read``,
#: ``banksel`` alike), ``clk``'s, and the delay tables' largest load (``max_capacitance``
#: reads 368.64 there, in the file's pF: the table's last index, 0.36864 pF, is meant).
READ_CLK_TO_Q_RISE_PS = 147.5
READ_TRANSITION_PS = (20.0, 17.1)
HOLD_PS = 10.8
INPUT_CAP_FF = 0.319
CLOCK_CAP_FF = 5.66
MAX_LOAD_FF = 368.64
TIMING_SOURCE = ("SRAM macro timing: clock-to-dataout 149.8 ps, setup 50.1 ps, from "
                 "The-OpenROAD-Project/asap7_sram_0p0 generated/LIB/"
                 "srambank_256x4x64_6t122.lib, commit 9f5af0939e8dd3cc1a9693a50b23441691dd7d25")

SOURCES = [
    "SRAM macro model: ASAP7 SRAM banks srambank_64x4x64_6t122 (9.612 x 77.76 um) and "
    "srambank_256x4x64_6t122 (30.348 x 77.76 um), The-OpenROAD-Project/asap7_sram_0p0 "
    "generated/LEF, commit b5c90cbbf2c3a962501040f81234bb84c877cba3",
    "SRAM bit-cell cross-check: TSMC N7 HD 6T 0.027 um^2 (S.-Y. Wu et al., IEDM 2016)",
]


@dataclass(frozen=True)
class SramArea:
    """Area of one memory: ``area`` (um^2), its ``rows``, ``cols``, column ``mux`` and
    ``copies`` (read ports)."""

    area: float
    rows: int
    cols: int
    mux: int
    copies: int


def sram_area(width: int, depth: int, read_ports: int = 1) -> SramArea:
    """Area of a ``depth`` x ``width``-bit RAM with ``read_ports`` read ports (see the module
    docstring). Raises ``ValueError`` for a non-positive geometry."""
    for name, value in (("width", width), ("depth", depth), ("read_ports", read_ports)):
        check_int(name, value, 1, numpy=False)
    mux = math.ceil(depth / MAX_ROWS)
    rows = math.ceil(depth / mux)
    cols = width * mux
    one = rows * cols * CELL_ROW_UM2 + cols * COLUMN_UM2
    return SramArea(area=one * read_ports, rows=rows, cols=cols, mux=mux, copies=read_ports)

"""Stream payload layouts shared by the RTL, the benches and the host.

Nobody packs bits by hand: benches build payloads with ``layout.const({...}).as_bits()`` and read
results with ``layout.from_bits(raw)``.
"""

from __future__ import annotations

from amaranth.hdl import signed, unsigned
from amaranth.lib import data, enum

from ..config import TileConfig
from ..sw.datapath import Mode


__all__ = ["TileMode", "tile_beat_layout", "tile_result_layout"]


class TileMode(enum.Enum, shape=2):
    """RTL encoding of :class:`elmoe3d.sw.datapath.Mode` (the same integer values)."""

    FULL = Mode.FULL.value
    DRAFT = Mode.DRAFT.value
    MSB_ONLY = Mode.MSB_ONLY.value
    LSB_ONLY = Mode.LSB_ONLY.value


def tile_beat_layout(config: TileConfig) -> data.StructLayout:
    """One input beat of the tensor tile: one K-group (32 deep) for all rows and lanes.

    Fields
    ------
    act : [rows][32] x signed(8)
        Activation codes a[m][k] of this group.
    wgt : [lanes][32] x unsigned(4)
        One weight nibble per unit PE. MSB nibbles are the two's-complement 4-bit MSB slice,
        LSB nibbles the unsigned LSB slice. FULL: lane 2j holds channel j's MSB slice and lane
        2j+1 its LSB slice. DRAFT, MSB_ONLY: lane n holds channel n's MSB slice. LSB_ONLY: lane
        n holds channel n's LSB slice.
    scale : [lanes] x unsigned(16)
        FP16 group scale (raw bits) per lane. FULL uses lane 2j's scale for channel j.
    mode : TileMode
    first : 1
        Start a new accumulation (the accumulators are cleared before this beat's terms).
    last : 1
        This beat completes the accumulation: the tile emits one result.
    """
    return data.StructLayout({
        "act": data.ArrayLayout(data.ArrayLayout(signed(8), config.group), config.rows),
        "wgt": data.ArrayLayout(data.ArrayLayout(unsigned(4), config.group), config.lanes),
        "scale": data.ArrayLayout(unsigned(16), config.lanes),
        "mode": TileMode,
        "first": unsigned(1),
        "last": unsigned(1),
    })


def tile_result_layout(config: TileConfig) -> data.StructLayout:
    """One output beat of the tensor tile: the Q.24 accumulators after a ``last`` beat.

    Fields
    ------
    acc : [rows][lanes] x signed(64)
        Q.24 accumulators (value * 2^24). In FULL mode channel j is at lane 2j and lane 2j+1
        adds nothing (it keeps its value from earlier beats of the accumulation, 0 if none).
    overflow : [rows][lanes] x unsigned(1)
        Sticky saturation flags.
    mode : TileMode
        Mode of the ``last`` beat.
    """
    return data.StructLayout({
        "acc": data.ArrayLayout(data.ArrayLayout(signed(64), config.lanes), config.rows),
        "overflow": data.ArrayLayout(data.ArrayLayout(unsigned(1), config.lanes), config.rows),
        "mode": TileMode,
    })

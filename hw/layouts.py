"""Stream payload layouts shared by the RTL, the benches and the host.

Nobody packs bits by hand: benches build payloads with ``layout.const({...}).as_bits()`` and read
results with ``layout.from_bits(raw)`` -- for the tensor tile through :func:`pack_beats` and
:func:`unpack_results`, which convert between those payloads and the beat and result
dictionaries of the golden model (:mod:`elmoe3d.sw.golden.tile`).

Sticky error-flag words (a block's ``errors`` / ``errors_clear`` ports, one layout each:
:func:`elmoe3d.hw.agg_link.link_errors_layout`, :func:`elmoe3d.hw.dram.dram_errors_layout`,
:func:`elmoe3d.hw.die.die_errors_layout`) share their register rule, :func:`sticky_flags`, and
the wiring of a block's flags into an enclosing block's word, :func:`forward_flags`.

:func:`address_bits` is the one rule for the width of an address or index field.
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import Signal, Value, signed, unsigned
from amaranth.lib import data, enum

from ..config import TileConfig
from ..sw.golden.datapath import Mode


__all__ = ["TileMode", "tile_beat_layout", "tile_result_layout", "pack_beats", "unpack_results",
           "STICKY_LATENCY", "sticky_flags", "forward_flags", "address_bits"]

#: Cycles from a sticky flag's event, or from its ``errors_clear`` strobe, to the flag showing
#: it (:func:`sticky_flags` is a register).
STICKY_LATENCY = 1


def address_bits(n: int) -> int:
    """Bits of an address (or index) into ``n`` entries: ``max(1, (n - 1).bit_length())``, at
    least 1 so a one-entry memory still has an address port (``n`` = 1 or 2: 1 bit; 1024:
    10 bits). Used for every address and index field sized by a count (bridge write ports
    and EXT descriptors, DRAM bank / row / column fields, the die's PE and group indices)."""
    return max(1, (n - 1).bit_length())


class TileMode(enum.Enum, shape=2):
    """RTL encoding of :class:`elmoe3d.sw.golden.datapath.Mode` (the same integer values)."""

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


def pack_beats(config: TileConfig, beats) -> list[int]:
    """Beat dictionary of :func:`elmoe3d.sw.golden.tile.tile_schedule` (``act`` int8 [B, rows, 32],
    ``wgt`` nibbles [B, lanes, 32], ``scale`` FP16 bits [B, lanes], ``mode`` [B], ``first``
    and ``last`` [B]) -> one :func:`tile_beat_layout` payload integer per beat."""
    layout = tile_beat_layout(config)
    return [layout.const({
        "act": np.asarray(beats["act"][b]).tolist(),
        "wgt": np.asarray(beats["wgt"][b]).tolist(),
        "scale": np.asarray(beats["scale"][b]).tolist(),
        "mode": TileMode(int(beats["mode"][b])),
        "first": int(bool(beats["first"][b])),
        "last": int(bool(beats["last"][b])),
    }).as_bits() for b in range(len(beats["mode"]))]


def unpack_results(config: TileConfig, raws) -> dict:
    """:func:`tile_result_layout` payloads (integers, or the ``data.Const`` views a simulator
    returns) -> the result dictionary of :func:`elmoe3d.sw.golden.tile.ref_tile`: ``acc`` int64
    [R, rows, lanes], ``overflow`` bool [R, rows, lanes], ``mode`` int64 [R]."""
    layout = tile_result_layout(config)
    rows, lanes = config.rows, config.lanes
    acc = np.zeros((len(raws), rows, lanes), np.int64)
    overflow = np.zeros((len(raws), rows, lanes), bool)
    mode = np.zeros(len(raws), np.int64)
    for i, raw in enumerate(raws):
        view = raw if isinstance(raw, data.Const) else layout.from_bits(int(raw))
        if isinstance(raw, data.Const) and data.Layout.cast(raw.shape()) != layout:
            raise ValueError(f"result {i}: layout {raw.shape()!r} is not the tile result "
                             f"layout of {config}")
        for r in range(rows):
            for n in range(lanes):
                acc[i, r, n] = int(view.acc[r][n])
                overflow[i, r, n] = bool(view.overflow[r][n])
        mode[i] = TileMode(view.mode).value
    return {"acc": acc, "overflow": overflow, "mode": mode}


def _flag_layout(flags) -> data.StructLayout:
    if not isinstance(flags, data.View) or not isinstance(data.Layout.cast(flags.shape()),
                                                          data.StructLayout):
        raise TypeError(f"flags: expected a data.View of a StructLayout, got {flags!r}")
    return data.Layout.cast(flags.shape())


def _flag_value(m, layout, what, value):
    """``value`` (a View of ``layout``, or a dict field -> bit vector, missing fields 0) as a
    View of ``layout``."""
    if isinstance(value, data.View):
        if data.Layout.cast(value.shape()) != layout:
            raise ValueError(f"{what}: layout {value.shape()!r} is not the flags' {layout!r}")
        return value
    if not isinstance(value, dict):
        raise TypeError(f"{what}: expected a data.View or a dict of fields, got {value!r}")
    names = {name for name, _ in layout}
    unknown = sorted(set(value) - names)
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {', '.join(unknown)}; the flags have "
                         f"{', '.join(sorted(names))}")
    sig = Signal(layout, name=what.rstrip("_"))
    m.d.comb += [sig[name].eq(v) for name, v in value.items()]
    return sig


def sticky_flags(m, flags, *, set_, clear):
    """Sticky error flags with write-1-to-clear, on a whole flags word.

    In the next cycle (:data:`STICKY_LATENCY`) each bit of ``flags`` is 1 where ``set_`` is 1,
    0 where ``clear`` is 1 and ``set_`` is 0 (setting wins over a clear in the same cycle),
    and unchanged otherwise; reset clears it. A flag whose ``set_`` stays 1 (a level, not a
    one-cycle event) cannot be cleared until it falls.

    Parameters
    ----------
    m : Module
        The flags are driven from its ``sync`` domain (``set_`` / ``clear`` dicts through
        ``comb``).
    flags : data.View of a StructLayout
        The flag register (a component's ``errors`` port, or a ``Signal(layout)``).
    set_, clear : data.View of the same layout, or dict
        The events / the clear strobes: a View (``errors_clear``), or a dict field name ->
        value (cast to the field's width; fields not named are 0).

    Raises TypeError / ValueError naming the argument on a wrong type, layout or field.
    """
    layout = _flag_layout(flags)
    s = _flag_value(m, layout, "set_", set_).as_value()
    c = _flag_value(m, layout, "clear", clear).as_value()
    f = flags.as_value()
    m.d.sync += f.eq(s | (f & ~c))


def forward_flags(m, flags, clear, blocks, fields):
    """Wire sub-blocks' sticky flags into an enclosing flags word, and its clear strobes back
    (each block keeps and clears its own flags; this is wiring only, no latency).

    For each ``outer: inner`` of ``fields``, the ``outer`` field of ``flags`` is the ``inner``
    fields of ``blocks[0].errors``, ``blocks[1].errors``, ... concatenated (LSB first), and
    ``blocks[i].errors_clear.<inner>`` is the same slice of ``clear.<outer>``.

    Raises ValueError when an outer field is not ``len(blocks)`` inner fields wide.
    """
    for outer, inner in fields.items():
        out, out_clr = Value.cast(flags[outer]), Value.cast(clear[outer])
        w = len(Value.cast(getattr(blocks[0].errors, inner))) if blocks else 0
        if len(out) != w * len(blocks):
            raise ValueError(f"{outer}: {len(out)} bits, expected {len(blocks)} x {w} "
                             f"({inner} of each block)")
        for i, block in enumerate(blocks):
            m.d.comb += [out[i * w:(i + 1) * w].eq(getattr(block.errors, inner)),
                         getattr(block.errors_clear, inner).eq(out_clr[i * w:(i + 1) * w])]

"""Golden model of the tensor tile's stream behaviour and its host mapping (plain NumPy).

* :func:`ref_tile`      -- what :class:`elmoe3d.hw.tile.TensorTile` emits for a beat sequence.
* :func:`tile_schedule` -- a GEMM ``a_q[M, K] x qw[N, K]^T`` as tile beats.
* :func:`tile_assemble` -- the tile results back into an :class:`~.datapath.Accumulator`
  ``[M, N]``.

``tile_assemble(ref_tile(tile_schedule(a_q, qw, mode, rows, lanes)), ...)`` equals
``gemm(a_q, qw, mode)`` bit for bit (numerics §5: results do not depend on tiling).

Beats are a dict of NumPy arrays, the host-side twin of
:func:`elmoe3d.hw.layouts.tile_beat_layout` (B beats, M = rows, N = lanes)::

    act   int8   [B, M, 32]   activation codes
    wgt   uint8  [B, N, 32]   weight nibbles 0..15 (MSB nibble = two's-complement msb & 15)
    scale uint16 [B, N]       FP16 group scales, raw bits
    mode  int64  [B]          Mode values
    first bool   [B]          clear the accumulators before this beat
    last  bool   [B]          emit a result after this beat

Results (R = number of ``last`` beats), the twin of ``tile_result_layout``::

    acc      int64 [R, M, N]  Q.24 accumulators
    overflow bool  [R, M, N]  sticky saturation flags
    mode     int64 [R]        mode of the ``last`` beat

This module never imports Amaranth.
"""

from __future__ import annotations

import numpy as np

from ...config import TileConfig
from .datapath import (Accumulator, Mode, check_gemm_operands, accumulate, _lsb_field,
                       _msb_field, _unit_pe)
from .quant import GROUP, QuantizedWeight, lsb_slice, msb_slice


__all__ = ["BEAT_FIELDS", "RESULT_FIELDS", "beat_psums", "ref_tile", "tile_schedule",
           "tile_assemble", "channels_per_block"]

BEAT_FIELDS = ("act", "wgt", "scale", "mode", "first", "last")
RESULT_FIELDS = ("acc", "overflow", "mode")


def channels_per_block(mode, lanes: int) -> int:
    """Output channels one tile beat covers: ``lanes // 2`` in FULL (two slices per weight),
    ``lanes`` otherwise."""
    return lanes // 2 if Mode(mode) is Mode.FULL else lanes


def _signed_nibble(nib):
    """Two's-complement reading of a 4-bit MSB slice: 0..15 -> -8..7 (int16)."""
    nib = np.asarray(nib, np.int16)
    return np.where(nib >= 8, nib - 16, nib).astype(np.int16)


def lane_fields(nibbles, mode, lane_axis: int = 0) -> np.ndarray:
    """The unit PEs' 5-bit weight fields (int16) of weight nibbles laid out along lanes.

    ``nibbles``: uint 0..15, lanes on axis ``lane_axis``. FULL: even lanes are MSB slices
    (aug 0), odd lanes LSB slices; DRAFT: MSB with aug 1; MSB_ONLY: MSB with aug 0; LSB_ONLY:
    LSB (numerics §3). One definition for :func:`beat_psums` and the PE's functional
    simulator."""
    mode = Mode(mode)
    nib = np.moveaxis(np.asarray(nibbles), lane_axis, 0)
    if mode is Mode.FULL:
        field = np.empty(nib.shape, np.int16)
        field[0::2] = _msb_field(_signed_nibble(nib[0::2]), 0)
        field[1::2] = _lsb_field(nib[1::2] & 15)
    elif mode is Mode.DRAFT:
        field = _msb_field(_signed_nibble(nib), 1)
    elif mode is Mode.MSB_ONLY:
        field = _msb_field(_signed_nibble(nib), 0)
    else:
        field = _lsb_field(nib & 15)
    return np.moveaxis(field, 0, lane_axis)


def beat_psums(act, wgt, mode) -> np.ndarray:
    """Group psums of one beat as the tile forms them, after slice combining (int64 [M, N]).

    ``act`` int8 ``[M, 32]``, ``wgt`` nibbles ``[N, 32]``. Per lane n, tree[m, n] is the sum of
    the 32 unit-PE products ``unit_pe(a, field)``; FULL: psum at lane 2j is
    ``(tree[2j] << 3) + tree[2j+1]`` (MSB field with aug 0 on lane 2j, LSB field on 2j+1) and 0
    at lane 2j+1; DRAFT: ``tree << 3`` with aug 1; MSB_ONLY: ``tree << 3`` with aug 0;
    LSB_ONLY: ``tree`` with the LSB field.
    """
    mode = Mode(mode)
    act = np.asarray(act, np.int8)
    field = lane_fields(wgt, mode, lane_axis=0)
    tree = _unit_pe(act[:, None, :], field[None, :, :]).sum(axis=-1, dtype=np.int64)  # [M, N]
    if mode is Mode.FULL:
        psum = np.zeros_like(tree)
        psum[:, 0::2] = (tree[:, 0::2] << 3) + tree[:, 1::2]
        return psum
    if mode is Mode.LSB_ONLY:
        return tree
    return tree << 3


def _check_beats(beats):
    if not isinstance(beats, dict):
        raise TypeError(f"beats: expected a dict of arrays, got {type(beats).__name__}")
    missing = [k for k in BEAT_FIELDS if k not in beats]
    unknown = sorted(set(beats) - set(BEAT_FIELDS))
    if missing or unknown:
        raise ValueError(f"beats: missing field(s) {missing}, unknown field(s) {unknown}")
    act = np.asarray(beats["act"])
    wgt = np.asarray(beats["wgt"])
    scale = np.asarray(beats["scale"])
    mode = np.asarray(beats["mode"])
    first = np.asarray(beats["first"])
    last = np.asarray(beats["last"])
    if act.dtype != np.int8 or act.ndim != 3 or act.shape[2] != GROUP:
        raise ValueError(f"beats['act']: expected int8 [B, M, {GROUP}], got {act.dtype} "
                         f"{tuple(act.shape)}")
    nbeats, rows, _ = act.shape
    if wgt.ndim != 3 or wgt.shape[0] != nbeats or wgt.shape[2] != GROUP:
        raise ValueError(f"beats['wgt']: expected [B={nbeats}, N, {GROUP}], got "
                         f"{tuple(wgt.shape)}")
    if not np.issubdtype(wgt.dtype, np.integer) or wgt.size and (wgt.min() < 0 or wgt.max() > 15):
        raise ValueError("beats['wgt']: expected integer nibbles in 0..15")
    lanes = wgt.shape[1]
    if lanes % 2:
        raise ValueError(f"beats['wgt']: the number of lanes must be even, got {lanes}")
    if scale.dtype != np.uint16 or scale.shape != (nbeats, lanes):
        raise ValueError(f"beats['scale']: expected uint16 FP16 bits [B={nbeats}, N={lanes}], "
                         f"got {scale.dtype} {tuple(scale.shape)}")
    for name, arr in (("mode", mode), ("first", first), ("last", last)):
        if arr.shape != (nbeats,):
            raise ValueError(f"beats[{name!r}]: expected shape ({nbeats},), got {arr.shape}")
    if mode.size and not np.isin(mode, [int(x) for x in Mode]).all():
        raise ValueError(f"beats['mode']: expected values in {[int(x) for x in Mode]}")
    return act, wgt, scale, mode, first.astype(bool), last.astype(bool)


def ref_tile(beats) -> dict:
    """Golden model of :class:`elmoe3d.hw.tile.TensorTile`: the results its output stream
    carries for a sequence of input beats (independent of stalls and idle cycles).

    The accumulators start at zero (reset). Per beat: ``first`` clears accumulators and flags;
    the beat's psums (:func:`beat_psums`) are scaled by the lane scales and added with
    saturation (:func:`elmoe3d.sw.golden.datapath.accumulate`, one group); ``last`` emits a result.
    Beats after the final ``last`` change the state but emit nothing.

    Parameters
    ----------
    beats : dict of ndarray
        See the module docstring.

    Returns
    -------
    dict with ``acc`` int64 ``[R, M, N]``, ``overflow`` bool ``[R, M, N]``, ``mode`` int64 ``[R]``.

    Raises
    ------
    ValueError, TypeError
        A field is missing, unknown, or has the wrong shape, dtype or range.
    """
    act, wgt, scale, mode, first, last = _check_beats(beats)
    nbeats, rows, _ = act.shape
    lanes = wgt.shape[1]
    scale16 = scale.view(np.float16)
    state = Accumulator.zeros(rows, lanes)
    accs, flags, modes = [], [], []
    for b in range(nbeats):
        if first[b]:
            state = Accumulator.zeros(rows, lanes)
        psum = beat_psums(act[b], wgt[b], int(mode[b]))
        state = accumulate(psum[:, :, None], scale16[b][:, None], init=state)
        if last[b]:
            accs.append(state.acc.copy())
            flags.append(state.overflow.copy())
            modes.append(int(mode[b]))
    return {
        "acc": np.array(accs, np.int64).reshape(len(accs), rows, lanes),
        "overflow": np.array(flags, bool).reshape(len(flags), rows, lanes),
        "mode": np.array(modes, np.int64),
    }


def _blocks(total, size):
    return -(-total // size)


def tile_schedule(a_q, qw: QuantizedWeight, mode, rows: int, lanes: int) -> dict:
    """Map the GEMM ``a_q[M, K] x qw[N, K]^T`` in ``mode`` onto tile beats.

    Rows are tiled in blocks of ``rows`` and output channels in blocks of
    :func:`channels_per_block` (FULL: ``lanes // 2`` channels, channel j's MSB nibble on lane 2j
    and its LSB nibble on lane 2j+1, the channel's scale on both lanes; DRAFT and MSB_ONLY: the
    MSB nibble, LSB_ONLY: the LSB nibble, one channel per lane). Blocks are visited row block
    major, channel block minor; within a block the K groups go in ascending order, ``first`` on
    group 0 and ``last`` on the final group, so there is one result per block. Ragged edges are
    padded with zero activations, zero weights and zero scales.

    Parameters
    ----------
    a_q : ndarray of int8, shape ``[M, K]``
    qw : QuantizedWeight, shape ``[N, K]``
    mode : Mode
    rows, lanes : int
        Tile shape (validated as a :class:`~elmoe3d.config.TileConfig`).

    Returns
    -------
    dict of beat arrays (module docstring), ``B = ceil(M/rows) * ceil(N/channels) * K/32``.

    Raises
    ------
    ValueError
        Bad tile shape, operand shapes or K == 0 (a tile accumulation needs at least one beat).
    TypeError
        ``a_q`` is not int8 (a :class:`~.quant.QuantizationTypeError`, which is both).
    """
    cfg = TileConfig(rows=rows, lanes=lanes)
    a_q = check_gemm_operands(a_q, qw, mode, caller="tile_schedule")
    mode = Mode(mode)
    mdim, k = a_q.shape
    ndim = qw.q.shape[0]
    if k == 0:
        raise ValueError("tile_schedule: K = 0 leaves no beat to carry first/last")
    ngroups = k // GROUP
    chans = channels_per_block(mode, cfg.lanes)
    mb, nb = _blocks(mdim, cfg.rows), _blocks(ndim, chans)

    a_pad = np.zeros((mb * cfg.rows, k), np.int8)
    a_pad[:mdim] = a_q
    q_pad = np.zeros((nb * chans, k), np.int8)
    q_pad[:ndim] = qw.q
    s_pad = np.zeros((nb * chans, ngroups), np.uint16)
    s_pad[:ndim] = np.asarray(qw.scale, np.float16).view(np.uint16)

    msb_nib = (msb_slice(q_pad).view(np.uint8) & 15).astype(np.uint8)
    lsb_nib = lsb_slice(q_pad)
    if mode is Mode.FULL:
        w_lane = np.empty((nb * cfg.lanes, k), np.uint8)
        w_lane[0::2], w_lane[1::2] = msb_nib, lsb_nib
        s_lane = np.repeat(s_pad, 2, axis=0)
    else:
        w_lane = lsb_nib if mode is Mode.LSB_ONLY else msb_nib
        s_lane = s_pad

    act = a_pad.reshape(mb, cfg.rows, ngroups, GROUP).transpose(0, 2, 1, 3)   # [mb, G, M, 32]
    wgt = w_lane.reshape(nb, cfg.lanes, ngroups, GROUP).transpose(0, 2, 1, 3)  # [nb, G, N, 32]
    scl = s_lane.reshape(nb, cfg.lanes, ngroups).transpose(0, 2, 1)            # [nb, G, N]
    shape = (mb, nb, ngroups)
    nbeats = mb * nb * ngroups
    g = np.broadcast_to(np.arange(ngroups), shape).reshape(nbeats)
    return {
        "act": np.ascontiguousarray(np.broadcast_to(act[:, None], shape + act.shape[2:])
                                    .reshape(nbeats, cfg.rows, GROUP)),
        "wgt": np.ascontiguousarray(np.broadcast_to(wgt[None], shape + wgt.shape[2:])
                                    .reshape(nbeats, cfg.lanes, GROUP)),
        "scale": np.ascontiguousarray(np.broadcast_to(scl[None], shape + scl.shape[2:])
                                      .reshape(nbeats, cfg.lanes)),
        "mode": np.full(nbeats, int(mode), np.int64),
        "first": g == 0,
        "last": g == ngroups - 1,
    }


def tile_assemble(results, m_total: int, n_total: int, mode, rows: int,
                  lanes: int) -> Accumulator:
    """Put the per-block results of :func:`tile_schedule` back into ``[M, N]``.

    Parameters
    ----------
    results : dict
        ``acc`` int64 ``[R, rows, lanes]``, ``overflow`` bool ``[R, rows, lanes]``, ``mode``
        ``[R]`` with ``R = ceil(M/rows) * ceil(N/channels)`` in :func:`tile_schedule`'s order.
    m_total, n_total : int
        GEMM shape; padding is cropped.
    mode : Mode
        The scheduled mode (FULL reads channel j from lane 2j).

    Raises
    ------
    ValueError
        Wrong number or shape of results, or a result carries another mode.
    """
    cfg = TileConfig(rows=rows, lanes=lanes)
    mode = Mode(mode)
    chans = channels_per_block(mode, cfg.lanes)
    mb, nb = _blocks(m_total, cfg.rows), _blocks(n_total, chans)
    acc = np.asarray(results["acc"])
    ovf = np.asarray(results["overflow"])
    rmode = np.asarray(results["mode"])
    want = (mb * nb, cfg.rows, cfg.lanes)
    if acc.shape != want or ovf.shape != want or rmode.shape != (mb * nb,):
        raise ValueError(f"tile_assemble: expected {mb * nb} results of [{cfg.rows}, "
                         f"{cfg.lanes}], got acc {acc.shape}, overflow {ovf.shape}, "
                         f"mode {rmode.shape}")
    if (rmode != int(mode)).any():
        raise ValueError(f"tile_assemble: results carry modes {sorted(set(rmode.tolist()))}, "
                         f"expected {int(mode)} ({mode.name})")
    sel = slice(0, None, 2) if mode is Mode.FULL else slice(None)

    def place(x):
        x = x[:, :, sel].reshape(mb, nb, cfg.rows, chans).transpose(0, 2, 1, 3)
        return np.ascontiguousarray(x.reshape(mb * cfg.rows, nb * chans)[:m_total, :n_total])

    return Accumulator(place(acc).astype(np.int64), place(ovf).astype(bool))

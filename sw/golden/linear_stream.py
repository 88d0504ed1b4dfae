"""A plain GEMM on one PE: the streamed linear-layer program (paper Section 4.1: the PE array
runs every GEMM of the decoder, not only the experts; ``docs/pe.md`` "Plain GEMMs").

The attention projections, the router, the LM head and the dense draft models are linear
layers ``y = x W^T`` (``W`` ``[N, K]``, PyTorch ``Linear`` layout) without an expert's SwiGLU.
On the PE a linear layer is the expert program's down projection with x in place of the h
codes:

* TOK holds each row's activation exponent twice, as ``e_x`` and as ``e_h`` (the exponent the
  COMBINE sink scales the accumulators by), and a gate weight of 1.0 (FP16 ``0x3C00``; 0 on
  the padding rows of a last token tile, which the sink skips);
* x (INT8 codes, all of K) stays in ACT for the token tile when its K / 32 words fit, else it
  streams: each buffer-full's K chunk into one of two ACT slots, once per column block;
* the weights stream through WMEM once per token tile, K-chained over buffer-fulls (FULL as
  LSB_ONLY + MSB_ONLY GEMMs), into OUT chunks that OUTPUT emits as FP32 and CLEAR empties.

The loop nest::

    for tile of rows tokens:                        # LOAD TOK (and x when resident)
        for chunk of out_chunk output channels:
            for cb in the chunk's column blocks:
                for k-chunk in K/32 groups:         # WMEM buffer-fulls, double-buffered
                    (LOAD x chunk)                  # streamed x
                    GEMM COMBINE, chained over k
            OUTPUT chunk; CLEAR out

Numerics: :func:`ref_linear` (``quantize_activations`` -> ``gemm`` -> ``combine`` with gate
1.0 into a zero Q.24 output -> ``q24_to_fp32``): the result is the routed expert's down
projection's arithmetic on x, bit for bit. A layer wider than one PE splits its output
channels over PEs (each runs this program on its rows of ``W``; nothing to reduce); the
whole-decoder model's compute calibration (:mod:`elmoe3d.sw.host.linear_calib`) times it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...checks import is_int
from ...isa import Sink
from .asm import Program, ProgramError, pe_config
from .datapath import Mode, gemm
from .expert import ExpertResult, _mode
from .expert_stream import Placement, StreamedJob, _FullStream, padded_matrix, tile_head
from .quant import (QuantizationError, QuantizedWeight, _to_array, quantize_activations,
                    quantize_weights)
from .vpu import combine, q24_to_fp32


__all__ = ["LinearPlan", "plan_linear_stream", "ref_linear", "build_streamed_linear_program",
           "stream_linear_program", "GATE_ONE"]

#: FP16 bits of the gate weight 1.0 every live row of a linear layer carries.
GATE_ONE = 0x3C00


@dataclass(frozen=True)
class LinearPlan:
    """Where a linear layer of ``in_features`` (K) -> ``out_features`` (N) sits in a PE
    (:func:`plan_linear_stream`). Memory figures are words of the named memory.

    Attributes
    ----------
    in_features, out_features : int
    tile_tokens : int
        Tokens per token tile (the PE's ``rows``: one row block).
    x_stream : bool
        False: the tile's x (K/32 ACT words) stays in ACT from word ``x_base``. True: each
        buffer-full brings its K chunk of x (``x_chunk`` groups at most) into one of two ACT
        slots from word 0.
    x_base, x_chunk : int
    out_chunk : int
        Output channels per OUT chunk (a multiple of ``lanes`` and of W/32, or of W/64 with
        ``raw_output``).
    out_padded : int
        N rounded up to whole OUT-chunk steps (lcm(lanes, W/32), or lcm(lanes, W/64) raw); the
        weight rows beyond N are zero, their outputs dropped by ``decode``.
    raw_output : bool
        OUTPUT emits the Q.24 OUT words (converted to FP32 by ``decode`` as the PE would)
        rather than FP32.
    """

    in_features: int
    out_features: int
    tile_tokens: int
    x_stream: bool
    x_base: int
    x_chunk: int
    out_chunk: int
    out_padded: int
    raw_output: bool = False


def plan_linear_stream(in_features: int, out_features: int, config,
                       raw_output: bool | None = None) -> LinearPlan:
    """Check that a linear layer ``[out_features, in_features]`` can stream through the PE of
    ``config`` (ArchConfig or PEConfig) and place it. ``raw_output``: the OUT chunks leave as
    Q.24 words (OUTPUT raw, converted to FP32 by ``decode`` as the PE would) rather than FP32;
    default: raw only where OUT holds no FP32 chunk (the paper PE: 16 rows of 128 channels
    would need 32 OUT words of its 16).

    Raises :class:`~.asm.ProgramError` (one line naming the dimension or the memory that
    overflows, with the figures) otherwise; ``TypeError`` naming ``config`` for anything but
    an ArchConfig or PEConfig, or ``raw_output`` for anything but None or a bool (``"yes"``
    is not taken as True)."""
    _check_raw_output(raw_output, "plan_linear_stream")
    pe = pe_config(config)
    R, L, W = pe.rows, pe.lanes, pe.word_bits
    for name, v in (("in_features", in_features), ("out_features", out_features)):
        if not is_int(v):
            raise ProgramError(f"linear layer: {name}: expected an integer, got {v!r}")
    K, N = int(in_features), int(out_features)
    where = f"linear K={K} -> N={N}"
    if K < 32 or K % 32:
        raise ProgramError(f"{where}: K = {K} is not a positive multiple of 32 (weight groups "
                           f"of 32 along K); pad the weights with zero groups")
    if N < 1:
        raise ProgramError(f"{where}: N = {N}: expected at least one output channel")
    if R > pe.tok_entries:
        raise ProgramError(f"{where}: TOK overflows: a row block's {R} entries exceed the "
                           f"{pe.tok_entries} TOK entries")
    words = f"({W // 8} B each)"
    act, x_act = pe.act_words, K // 32
    x_stream = x_act > act
    if not x_stream:
        x_base, x_chunk = act - x_act, x_act
    else:
        x_base, x_chunk = 0, min(pe.wmem_words, act // 2)
        if x_chunk < 1:
            raise ProgramError(f"{where}: ACT overflows: two x slots of one group need 2 of "
                               f"the {act} ACT words {words}")
    if raw_output is None:
        fp_step = int(np.lcm(L, pe.fp32_per_beat))
        raw_output = pe.out_words // R * pe.q24_per_word < fp_step
    step = int(np.lcm(L, pe.q24_per_word if raw_output else pe.fp32_per_beat))
    out_padded = -(-N // step) * step
    out_chunk = min(out_padded, (pe.out_words // R * pe.q24_per_word) // step * step)
    if out_chunk < step:
        raise ProgramError(
            f"{where}: OUT overflows: a row block's {R} rows of {step} Q.24 channels (one "
            f"{'raw' if raw_output else 'FP32'} OUTPUT beat, one COMBINE block) need "
            f"{R * step // pe.q24_per_word} of the "
            f"{pe.out_words} OUT words {words}")
    return LinearPlan(in_features=K, out_features=N, tile_tokens=R, x_stream=x_stream,
                      x_base=x_base, x_chunk=x_chunk, out_chunk=out_chunk,
                      out_padded=out_padded, raw_output=bool(raw_output))


def _check_raw_output(raw_output, caller):
    """A ``TypeError`` naming ``caller`` for a ``raw_output`` other than None or a bool: a
    truthy string or 1 would pick the OUTPUT format by accident."""
    if raw_output is not None and not isinstance(raw_output, (bool, np.bool_)):
        raise TypeError(f"{caller}: raw_output: expected None (the PE's default) or a bool, "
                        f"got {raw_output!r}")


def _activations(x):
    """``x`` as an array; a :class:`~.quant.QuantizationTypeError` naming it for ragged rows."""
    return _to_array(x, "x", "activations [T, K] (a float array)")


def _weight(w, name) -> QuantizedWeight:
    """``w`` (float ``[N, K]`` or a 2-D QuantizedWeight) quantized; a
    :class:`~.quant.QuantizationError` naming ``name`` for another rank."""
    qw = w if isinstance(w, QuantizedWeight) else quantize_weights(w, name=name)
    if qw.q.ndim != 2:
        raise QuantizationError(f"{name}: expected a 2-D weight [N, K], got shape "
                                f"{qw.q.shape}")
    return qw


def _check_x(x, qw: QuantizedWeight):
    N, K = qw.q.shape
    if x.ndim != 2 or x.shape[1] != K:
        raise QuantizationError(f"x: expected [T, K={K}] (w is [N={N}, K={K}], PyTorch Linear "
                                f"layout), got {x.shape}")


def ref_linear(x, w, mode=Mode.FULL) -> ExpertResult:
    """The golden linear layer ``y = x W^T`` in the contract's numerics, with no program
    involved: ``quantize_activations(x)`` -> ``gemm`` (``mode``) -> ``combine`` with gate
    weight 1.0 and ``e_h = e_x`` into a zero Q.24 output -> ``q24_to_fp32``.

    Parameters
    ----------
    x : float ``[T, K]``
    w : float ``[N, K]`` or QuantizedWeight (G32 INT8, FP16 group scales)
    mode : Mode.FULL or Mode.DRAFT (MSB slices with LSB augmentation), or its name

    Returns
    -------
    ExpertResult (:class:`~.expert.ExpertResult`)
        ``y`` float32 ``[T, N]``, ``out`` the Q.24 sums (int64 ``[T, N]``), and the sticky
        flags ``acc_overflow`` (a GEMM accumulator saturated) and ``vpu_saturation`` (an
        output saturated).

    Output range and resolution: the outputs are the PE's fixed point, Q.24 (int64 ``out``,
    real value ``out * 2^-24``): a resolution of ``2^-24`` (about 5.96e-8) and a range of
    ``[-2^39, 2^39 - 2^-24]`` (about +-5.5e11), as the hardware computes them. An output
    beyond that range saturates to ``+-2^39`` and sets ``vpu_saturation``. Every output is
    rounded to a multiple of ``2^-24`` (round to nearest, ties to even), so one of magnitude
    at most ``2^-25`` (about 2.98e-8) flushes to 0 and small ones lose relative precision
    (with weights of about 0.05, ``x * 1e-8`` gives ``y`` all 0) *with no flag*. A caller
    must check ``vpu_saturation`` (an output saturated) and ``acc_overflow`` (a GEMM
    accumulator saturated) before using ``y``, and scale inputs whose outputs would be tiny.
    ``y`` is ``out`` rounded to float32.

    Raises
    ------
    QuantizationError
        (a ``ValueError``) naming ``x`` or ``w``: a shape mismatch, a weight the quantizer
        refuses, ``x`` not finite; a ``mode`` other than FULL and DRAFT.
    QuantizationTypeError
        (a ``QuantizationError`` and a ``TypeError``) ``x`` or ``w`` not a float array
        (ragged nested lists, strings).
    """
    mode = _mode(mode, "a linear layer")
    qw = _weight(w, "w")
    x = _activations(x)
    _check_x(x, qw)
    xq = quantize_activations(x, name="x")
    acc = gemm(xq.q, qw, mode)
    t = x.shape[0]
    out, flags = combine(np.zeros(acc.acc.shape, np.int64), np.zeros(acc.acc.shape, bool),
                         acc.acc, xq.exp, np.full(t, GATE_ONE, np.uint16))
    return ExpertResult(y=q24_to_fp32(out), out=out, acc_overflow=bool(acc.overflow.any()),
                        vpu_saturation=bool(flags.any()),
                        detail={"x_q": xq.q, "e_x": xq.exp, "acc_y": acc.acc})


def build_streamed_linear_program(x, w, mode=Mode.FULL, config=None, *,
                                  raw_output: bool | None = None) -> StreamedJob:
    """PE program and ``ld`` stream of the linear layer ``w`` (``[N, K]``) over the tokens of
    ``x`` (``[T, K]``): module docstring. Equal bit for bit to :func:`ref_linear` with the same
    arguments. ``x``, ``w`` and ``mode`` as :func:`ref_linear`; ``config`` (required): the
    ArchConfig or PEConfig of the PE; ``raw_output``: None or a bool, as
    :func:`plan_linear_stream`.

    Returns a :class:`~.expert_stream.StreamedJob` (``decode`` gives float32 ``[T, N]``);
    ``info`` holds ``tiles``, ``gemm_beats``, ``ld_words``, ``weight_words``, ``act_words``,
    ``commands``, ``buffer_fulls``, ``x_stream``.

    The outputs have :func:`ref_linear`'s range and resolution (Q.24: steps of ``2^-24``,
    saturating at ``+-2^39``; tiny outputs flush to 0 without a flag). A saturated output is
    reported only by the run's STATUS beat: check ``vpu_saturation`` (and ``acc_overflow``)
    of its last STATUS (``result.statuses()[-1]`` of :meth:`~.expert.PEJob.run_fsim`) before
    using what ``decode`` gives.

    Raises
    ------
    ProgramError
        The shape does not fit the PE (:func:`plan_linear_stream`), or an exponent does not fit
        its TOK field.
    TypeError
        ``config`` missing (None) or not an ArchConfig or PEConfig; ``raw_output`` neither
        None nor a bool.
    ValueError
        (:class:`~.quant.QuantizationError`) ``x`` and ``w`` disagree on K, ``x`` or ``w`` is
        not a finite float array (a ``QuantizationTypeError``, also a ``TypeError``, for
        ragged lists or strings), or ``mode`` is not FULL or DRAFT.
    """
    if config is None:
        raise TypeError("build_streamed_linear_program: pass config= (an ArchConfig or "
                        "PEConfig)")
    _check_raw_output(raw_output, "build_streamed_linear_program")
    pe = pe_config(config)
    mode = _mode(mode, "a linear layer")
    qw = _weight(w, "w")
    x = _activations(x)
    N, K = qw.q.shape
    _check_x(x, qw)
    plan = plan_linear_stream(K, N, pe, raw_output)
    xq = quantize_activations(x, name="x")
    e_x = np.asarray(xq.exp, np.int64)
    if e_x.size and (e_x.min() < -128 or e_x.max() > 127):
        raise ProgramError(f"x: activation exponents {e_x.min()}..{e_x.max()} do not fit the "
                           f"TOK entry's signed 8-bit e_x (scale the input)")
    prog, ld, info, chunks = stream_linear_program(pe, plan, qw, xq.q, e_x, mode)
    return StreamedJob(program=prog, ld=ld, tokens=len(x), hidden=N, info=info, plan=plan,
                       chunks=chunks, raw_output=plan.raw_output)


def stream_linear_program(pe, plan: LinearPlan, w: QuantizedWeight, x_q, e_x, mode, *,
                          placement: Placement | None = None):
    """One PE's streamed program of the linear layer ``w`` (``[N, K]``, shape ``plan``) over
    the tokens ``x_q`` (INT8 ``[T, K]``, exponents ``e_x``). ``placement``
    (:class:`~.expert_stream.Placement`, default a fresh HB image) gives every weight LOAD its
    source and HB address.

    Returns ``(program, ld words, info, OUTPUT chunks)`` as
    :func:`~.expert_stream.stream_pe_program` does."""
    full = Mode(mode) is Mode.FULL
    R, L = pe.rows, pe.lanes
    No = plan.out_padded
    mat = padded_matrix(w, No, pe, "linear")
    stream = _FullStream(pe, full, Placement() if placement is None else placement)
    prog = Program(pe)
    ld: list = []
    counts = {"weight": 0, "act": 0, "tok": 0}
    chunks = []
    T = len(x_q)
    gate = np.full(T, GATE_ONE, np.uint16)
    for tile in range((T + R - 1) // R):
        t0 = tile * R
        head, x_rows = tile_head(pe, x_q, e_x, gate, t0, None if plan.x_stream else plan.x_base,
                                 e_h=e_x)
        k0 = len(stream)
        for c0 in range(0, No, plan.out_chunk):
            ch = min(plan.out_chunk, No - c0)
            before = [("clear", dict(out=True))] if c0 or tile else []
            stream.matrix(mat, range(c0 // L, (c0 + ch) // L), lambda cb, c0=c0, ch=ch: dict(
                sink=Sink.COMBINE, out_base=cb * L - c0, stride=ch // pe.q24_per_word,
                act_base=plan.x_base), before=before,
                per=plan.x_chunk if plan.x_stream else None,
                x_rows=x_rows if plan.x_stream else None, x_base=plan.x_base)
            stream.fulls[-1]["after"] = [("output", dict(row_blocks=1, channels=ch,
                                                              raw=plan.raw_output))]
            chunks.append((t0, R, c0, ch))
        stream.fulls[k0]["head"] = head + stream.fulls[k0]["head"]
    beats = stream.emit(prog, ld, counts)
    info = {"tiles": (T + R - 1) // R, "x_stream": plan.x_stream, "gemm_beats": beats,
            "ld_words": len(ld), "weight_words": counts["weight"],
            "act_words": counts["act"] + counts["tok"], "commands": prog.counts(),
            "buffer_fulls": len(stream)}
    return prog, ld, info, chunks

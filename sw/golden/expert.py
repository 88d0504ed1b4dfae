"""SwiGLU expert FFN: the golden expert, the float64 reference and the PE-program builder.

Paper Sections 4.1, 5.2 and Fig. 10b: one PE runs a fused expert (up, gate, down). This module
gives three views of the same computation (plain NumPy, never Amaranth):

* :func:`ref_expert` / :func:`ref_moe` -- the contract's numerics computed directly, with no
  program (BRIEF 3.1-3.8, ``docs/numerics.md``): per-token INT8 activations, bit-exact GEMMs
  (FULL or DRAFT), SwiGLU in Q16.16, per-token requantization, the down GEMM, gate-weighted
  combination in Q.24 (several experts per token summed there) and one FP32 conversion.
* :func:`float_expert` / :func:`float_moe` -- float64 references for accuracy figures
  (:func:`expert_accuracy`: SQNR, cosine, max abs error via :func:`.metrics.error_metrics`).
* :func:`build_expert_program` / :func:`build_moe_program` -- quantize, lay the weights out
  (up and gate rows interleaved per block, the intermediate dimension tiled over WMEM
  buffer-fulls, double buffering with signal / wait / release) and emit the PE program and its
  ``ld`` stream (``docs/pe.md``, "Program of an MoE layer"). :meth:`PEJob.run_fsim` executes it
  on the functional simulator; :meth:`PEJob.decode` turns the ``o`` beats back into ``[T, H]``.

The program's results equal :func:`ref_expert` / :func:`ref_moe` bit for bit (FP32 bits, Q.24
sums and the sticky flags); ``tests/golden/test_expert.py`` checks it.

Layout (lanes L, rows R, W = 128 L bits)
---------------------------------------
* Up/gate: intermediate channels in blocks of P = L/4, in DRAFT and FULL alike; block b is
  the weight rows ``[up bP .. bP+P-1, gate bP .. bP+P-1]``, one per half of a column block
  (L weight rows), so every column block covers L/2 intermediate channels and the MSB plane
  and scale words of an expert are the same bytes in DRAFT and FULL (one copy of the MSB
  slices serves the draft and the verify). K = H, ``groups = H/32``.
* Down: output channels in natural order, L per column block. K = I, ``groups = I/32``.
* A WMEM buffer-full holds ``wmem_words // groups`` column blocks at ``w_base = 0``. The
  contract has no K tiling (a GEMM accumulates all of K in the tile), so ``groups`` must fit
  one buffer: a larger K is a :class:`~.asm.ProgramError`.
* IOMEM: TOK entries 0.. (the expert's tokens, padded to R), ACT at word 0 (x rows, then the
  requantized h rows over them), HBUF rows = TOK entries (stride I/(4L)), OUT rows = token
  positions in the batch (stride H/(2L)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...config import ArchConfig, drain_cycles, max_requant_units
from ...isa import Op, Sink, Target
from .asm import Program, ProgramError, pack_act, pack_scales, pack_tok, pack_wgt, pe_config
from .datapath import INT64_MAX, Mode, gemm, parse_mode, scale_term
from .metrics import error_metrics
from .quant import (QuantizationError, QuantizationTypeError, QuantizedWeight, lsb_slice,
                    msb_slice, quantize_activations, quantize_weights)
from .vpu import combine, q24_to_fp32, row_requant, swiglu_q16


__all__ = ["Expert", "ExpertResult", "ref_expert", "ref_moe", "float_expert", "float_moe",
           "expert_accuracy", "PEJob", "build_expert_program", "build_moe_program",
           "EXPERT_MODES", "updown_order", "as_expert", "as_experts", "check_x",
           "parse_routing", "expert_tokens", "nibbles"]

#: Modes an expert runs in (the split MSB_ONLY / LSB_ONLY halves need a psum exchange).
EXPERT_MODES = (Mode.FULL, Mode.DRAFT)


def _mode(mode, what: str = "an expert") -> Mode:
    """``mode`` (a :class:`Mode`, its integer or its name) as FULL or DRAFT; a
    :class:`~.quant.QuantizationError` (a ``ValueError``) naming ``what`` otherwise."""
    try:
        mode = parse_mode(mode, "mode")
    except QuantizationError:
        raise QuantizationError(f"mode: expected one of {[m.name for m in EXPERT_MODES]}, "
                                f"got {mode!r}") from None
    if mode not in EXPERT_MODES:
        raise QuantizationError(f"mode: {what} runs in FULL or DRAFT, not {mode.name}")
    return mode


@dataclass(frozen=True, eq=False)
class Expert:
    """The INT8 group-quantized weights of one SwiGLU expert.

    Attributes
    ----------
    up, gate : QuantizedWeight ``[I, H]``
    down : QuantizedWeight ``[H, I]``
    """

    up: QuantizedWeight
    gate: QuantizedWeight
    down: QuantizedWeight

    @classmethod
    def quantize(cls, w_up, w_gate, w_down, *, name: str = "expert") -> "Expert":
        """Quantize float weights (PyTorch ``Linear`` layout: up/gate ``[I, H]``, down
        ``[H, I]``). Raises :class:`~.quant.QuantizationError` (a ``ValueError``) on a weight
        the quantizer refuses and on shapes that do not fit together (:meth:`check`)."""
        up = quantize_weights(w_up, name=f"{name}.up")
        gate = quantize_weights(w_gate, name=f"{name}.gate")
        down = quantize_weights(w_down, name=f"{name}.down")
        e = cls(up, gate, down)
        e.check()
        return e

    def check(self):
        """Raises :class:`~.quant.QuantizationTypeError` unless all three are
        :class:`~.quant.QuantizedWeight`, :class:`~.quant.QuantizationError` unless up and
        gate are ``[I, H]`` and down ``[H, I]`` (2-D each)."""
        for part in ("up", "gate", "down"):
            if not isinstance(getattr(self, part), QuantizedWeight):
                raise QuantizationTypeError(f"expert: {part}: expected a QuantizedWeight, got "
                                            f"{type(getattr(self, part)).__name__}")
        shapes = (self.up.shape, self.gate.shape, self.down.shape)
        if any(len(sh) != 2 for sh in shapes) or self.gate.shape != self.up.shape \
                or self.down.shape != self.up.shape[::-1]:
            raise QuantizationError(f"expert: expected up/gate [I, H] and down [H, I], got "
                                    f"{shapes[0]}, {shapes[1]}, {shapes[2]}")

    @property
    def hidden(self) -> int:
        """H, the model's hidden size (the up projection's K)."""
        return self.up.shape[1]

    @property
    def intermediate(self) -> int:
        """I, the expert's intermediate size (the up projection's N)."""
        return self.up.shape[0]


def as_expert(e, name="expert") -> Expert:
    """``e`` as a checked :class:`Expert`: an Expert, a ``(w_up, w_gate, w_down)`` tuple of
    float weights or of :class:`~.quant.QuantizedWeight`, or a dict with ``up``, ``gate`` and
    ``down``. Raises :class:`~.quant.QuantizationTypeError` (named ``name``) for anything else,
    and as :meth:`Expert.quantize` / :meth:`Expert.check`."""
    if isinstance(e, Expert):
        e.check()
        return e
    if isinstance(e, dict):
        return Expert.quantize(e["up"], e["gate"], e["down"], name=name)
    if isinstance(e, (tuple, list)) and len(e) == 3:
        if all(isinstance(w, QuantizedWeight) for w in e):
            ex = Expert(*e)
            ex.check()
            return ex
        return Expert.quantize(*e, name=name)
    raise QuantizationTypeError(f"{name}: expected an Expert, a (w_up, w_gate, w_down) tuple "
                                f"or a dict with up/gate/down, got {type(e).__name__}")


def as_experts(experts) -> list:
    """A MoE layer's experts (a non-empty sequence of what :func:`as_expert` takes) as checked
    :class:`Expert` objects of one shape. Raises :class:`~.quant.QuantizationError` for no
    experts or an expert whose H or I differs from expert 0's, and as :func:`as_expert`."""
    exs = [as_expert(e, f"expert {i}") for i, e in enumerate(experts)]
    if not exs:
        raise QuantizationError("experts: expected at least one expert, got none")
    for e, ex in enumerate(exs):
        if ex.hidden != exs[0].hidden or ex.intermediate != exs[0].intermediate:
            raise QuantizationError(f"expert {e}: shape H={ex.hidden}, I={ex.intermediate} "
                                    f"differs from expert 0's H={exs[0].hidden}, "
                                    f"I={exs[0].intermediate}")
    return exs


def _gate_bits(gw, n, what="gate_weights", slots: int = 0) -> np.ndarray:
    """Gate weights ``[n]`` as native uint16 FP16 bits: uint16 arrays (either byte order) are
    bits, floats and integers are values rounded to FP16. Raises
    :class:`~.quant.QuantizationError` for another shape or a weight that is (or rounds to)
    Inf or NaN, bits included, named by its entry (by token and slot for a routing's
    flattened ``[T, slots]`` weights); :class:`~.quant.QuantizationTypeError` for bool or
    non-numeric weights."""
    gw = np.asarray(gw)
    if gw.shape != (n,):
        raise QuantizationError(f"{what}: expected shape ({n},), got {gw.shape}")
    is_bits = gw.dtype.kind == "u" and gw.dtype.itemsize == 2
    if is_bits:
        bits = gw.astype(np.uint16)                       # native byte order
    elif gw.dtype.kind in "fiu":
        with np.errstate(over="ignore"):
            bits = gw.astype(np.float16).view(np.uint16)
    else:
        raise QuantizationTypeError(f"{what}: expected float gate weights or uint16 FP16 bits, "
                                    f"got dtype {gw.dtype}")
    bad = (bits & 0x7C00) == 0x7C00                       # exponent 31: Inf or NaN
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        got = f"FP16 bits 0x{int(bits[i]):04X}" if is_bits else f"{float(gw[i])}"
        where = f"token {i // slots}, slot {i % slots}" if slots else f"entry {i}"
        raise QuantizationError(f"{what}: {where}: {got} is not a finite FP16 gate weight")
    return bits


@dataclass(eq=False)
class ExpertResult:
    """Output of the golden expert / MoE layer.

    Attributes
    ----------
    y : float32 ``[T, H]``
        ``q24_to_fp32(out)``: what the PE's OUTPUT emits.
    out : int64 ``[T, H]``
        The Q.24 sums (BRIEF 3.8).
    acc_overflow, vpu_saturation : bool
        The sticky flags the PE's STATUS beat reports.
    """

    y: np.ndarray
    out: np.ndarray
    acc_overflow: bool = False
    vpu_saturation: bool = False
    detail: dict = field(default_factory=dict)


def _expert_terms(x_q, e_x, ex: Expert, mode):
    """Down-GEMM accumulators of one expert for INT8 rows ``x_q`` (``[T, H]``) with exponents
    ``e_x``: returns (acc_y, e_h, acc_overflow, vpu_saturation, detail)."""
    up = gemm(x_q, ex.up, mode)
    gt = gemm(x_q, ex.gate, mode)
    h, sat_h = swiglu_q16(up.acc, gt.acc, np.asarray(e_x, np.int64)[:, None])
    h_q, e_h = row_requant(h)
    y = gemm(h_q, ex.down, mode)
    ovf = bool(up.overflow.any() or gt.overflow.any() or y.overflow.any())
    detail = {"acc_up": up.acc, "acc_gate": gt.acc, "h": h, "h_q": h_q, "e_h": e_h,
              "acc_y": y.acc}
    return y.acc, e_h, ovf, bool(sat_h.any()), detail


def ref_expert(x, w_up, w_gate, w_down, gate_weights=None, mode=Mode.FULL) -> ExpertResult:
    """The golden expert: ``gate_weight * down(silu(gate(x)) * up(x))`` in the contract's
    numerics, with no program involved.

    ``quantize_activations(x)`` -> GEMM up and gate (``mode``) -> ``swiglu_q16`` ->
    ``row_requant`` -> GEMM down -> ``combine`` with the FP16 gate weights into a zero Q.24
    output -> ``q24_to_fp32``.

    Parameters
    ----------
    x : float array ``[T, H]``
    w_up, w_gate : float ``[I, H]`` or QuantizedWeight
    w_down : float ``[H, I]`` or QuantizedWeight
    gate_weights : ``[T]`` floats (rounded to FP16), float16 values or uint16 FP16 bits;
        default 1.0
    mode : Mode.FULL or Mode.DRAFT (MSB slices with LSB augmentation)

    Returns
    -------
    ExpertResult

    Raises
    ------
    QuantizationError
        (a ``ValueError``) weights the quantizer refuses or of shapes that do not fit; ``x``
        not ``[T, H]`` or not finite; gate weights not ``[T]`` finite FP16 values; a mode
        other than FULL and DRAFT.
    """
    ex = as_expert((w_up, w_gate, w_down))
    x = np.asarray(x)
    t = check_x(x, ex)
    gw = _gate_bits(np.ones(t) if gate_weights is None else gate_weights, t)
    return ref_moe(x, [ex], (np.zeros((t, 1), np.int64), gw.view(np.float16)[:, None]),
                   mode=mode)


def check_x(x, ex: Expert) -> int:
    """T, the token count of activations ``x`` ``[T, H]`` for expert ``ex``; a
    :class:`~.quant.QuantizationError` for another shape."""
    if x.ndim != 2 or x.shape[1] != ex.hidden:
        raise QuantizationError(f"x: expected [T, H={ex.hidden}], got {x.shape}")
    return x.shape[0]


def parse_routing(routing, t, n_experts):
    """(ids int64 [T, k], gate bits uint16 [T, k]) from ``(ids, weights)``; -1 ids are empty
    slots. Raises :class:`~.quant.QuantizationError` (a ``ValueError``) on shapes, out-of-range
    or repeated ids and gate weights that are not finite FP16 values."""
    if hasattr(routing, "ids") and hasattr(routing, "weights"):
        ids, weights = routing.ids, routing.weights
    elif isinstance(routing, (tuple, list)) and len(routing) == 2:
        ids, weights = routing
    else:
        raise QuantizationTypeError(f"routing: expected (ids, weights), got "
                                    f"{type(routing).__name__}")
    ids = np.asarray(ids)
    weights = np.asarray(weights)
    if ids.ndim not in (1, 2) or weights.shape != ids.shape or ids.shape[0] != t:
        raise QuantizationError(f"routing: expected ids and weights of shape [T={t}, k] (or "
                                f"[T] for k = 1), got {ids.shape} and {weights.shape}")
    if ids.ndim == 1:
        ids, weights = ids[:, None], weights[:, None]
    if not np.issubdtype(ids.dtype, np.integer):
        raise QuantizationTypeError(f"routing: expert ids must be integers, got dtype "
                                    f"{ids.dtype}")
    ids = ids.astype(np.int64)
    bad = (ids < -1) | (ids >= n_experts)
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise QuantizationError(f"routing: token {r}, slot {c}: expert id {ids[r, c]} is not "
                                f"in 0..{n_experts - 1} (-1 marks an empty slot)")
    for r in range(t):
        live = ids[r][ids[r] >= 0]
        if len(set(live.tolist())) != len(live):
            raise QuantizationError(f"routing: token {r} names expert(s) more than once: "
                                    f"{ids[r].tolist()}")
    bits = _gate_bits(weights.reshape(-1), weights.size, "routing weights",
                      slots=ids.shape[1]).reshape(ids.shape)
    return ids, bits


def expert_tokens(ids, bits, e):
    """Tokens routed to expert ``e`` in ascending order and their gate-weight bits."""
    rows, cols = np.nonzero(ids == e)
    order = np.argsort(rows, kind="stable")
    return rows[order], bits[rows[order], cols[order]]


def ref_moe(x, experts, routing, mode=Mode.FULL) -> ExpertResult:
    """Golden MoE layer: each token runs through its routed experts; the gate-weighted outputs
    are summed in Q.24 (experts in ascending id, the order a PE program uses) and converted to
    FP32 once.

    Parameters
    ----------
    x : float ``[T, H]``
    experts : sequence of Expert, ``(w_up, w_gate, w_down)`` tuples or dicts
    routing : ``(ids, weights)``, both ``[T, k]`` (``[T]`` for k = 1): expert ids (-1 for an
        empty slot, never used as an index) and gate weights (rounded to FP16; the router's
        softmax / top-k / renormalisation is the caller's)
    mode : Mode.FULL or Mode.DRAFT

    Returns
    -------
    ExpertResult

    Raises
    ------
    QuantizationError
        (a ``ValueError``) no experts; an expert, ``x`` or the routing of the wrong shape;
        expert ids out of range or repeated in a token; a gate weight that is not a finite
        FP16 value; a mode other than FULL and DRAFT; ``x`` not finite.
    QuantizationTypeError
        an expert or the routing of the wrong type.
    """
    mode = _mode(mode)
    exs = as_experts(experts)
    x = np.asarray(x)
    t = check_x(x, exs[0])
    ids, bits = parse_routing(routing, t, len(exs))
    xq = quantize_activations(x, name="x")
    out = np.zeros((t, exs[0].hidden), np.int64)
    flags = np.zeros(out.shape, bool)
    ovf = satd = False
    detail = {"x_q": xq.q, "e_x": xq.exp, "experts": {}}
    for e in range(len(exs)):
        rows, gw = expert_tokens(ids, bits, e)
        if len(rows) == 0:
            continue
        acc_y, e_h, o, s, d = _expert_terms(xq.q[rows], xq.exp[rows], exs[e], mode)
        new, fl = combine(out[rows], np.zeros((len(rows), out.shape[1]), bool), acc_y, e_h, gw)
        out[rows] = new
        flags[rows] |= fl
        ovf |= o
        satd |= s
        detail["experts"][e] = dict(d, tokens=rows)
    return ExpertResult(y=q24_to_fp32(out), out=out, acc_overflow=ovf,
                        vpu_saturation=bool(satd or flags.any()), detail=detail)


# ---- float64 references --------------------------------------------------------------------------

def _float(w):
    return w.dequantize() if isinstance(w, QuantizedWeight) else np.asarray(w, np.float64)


def float_expert(x, w_up, w_gate, w_down, gate_weights=None) -> np.ndarray:
    """float64 ``gate_weight * (silu(x W_gate^T) * (x W_up^T)) W_down^T`` ``[T, H]``."""
    x = np.asarray(x, np.float64)
    up = x @ _float(w_up).T
    g = x @ _float(w_gate).T
    with np.errstate(over="ignore"):
        h = g / (1.0 + np.exp(-g)) * up
    y = h @ _float(w_down).T
    if gate_weights is not None:
        y = y * np.asarray(gate_weights, np.float64)[:, None]
    return y


def float_moe(x, experts, routing) -> np.ndarray:
    """float64 MoE layer (float gate weights as given, not rounded to FP16)."""
    x = np.asarray(x, np.float64)
    ids, weights = routing if not hasattr(routing, "ids") else (routing.ids, routing.weights)
    ids = np.asarray(ids)
    weights = np.asarray(weights, np.float64)
    if ids.ndim == 1:
        ids, weights = ids[:, None], weights[:, None]
    y = np.zeros(x.shape)
    for e, ex in enumerate(experts):
        if isinstance(ex, Expert):
            ws = (ex.up, ex.gate, ex.down)
        elif isinstance(ex, dict):
            ws = (ex["up"], ex["gate"], ex["down"])
        else:
            ws = tuple(ex)
        rows, cols = np.nonzero(ids == e)
        if len(rows):
            y[rows] += float_expert(x[rows], *ws, weights[rows, cols])
    return y


def expert_accuracy(x, w_up, w_gate, w_down, gate_weights=None) -> dict:
    """Error metrics (:func:`.metrics.error_metrics`: mse, sqnr_db, cosine, max_abs) of the
    DRAFT and FULL golden expert against the float64 reference on the float weights."""
    ref = float_expert(x, w_up, w_gate, w_down, gate_weights)
    ex = Expert.quantize(w_up, w_gate, w_down)
    return {mode.name.lower(): error_metrics(ref, ref_expert(x, ex.up, ex.gate, ex.down,
                                                             gate_weights, mode).y)
            for mode in (Mode.DRAFT, Mode.FULL)}


# ---- the PE program ------------------------------------------------------------------------------

@dataclass(eq=False)
class PEJob:
    """A PE program with its ``ld`` stream.

    Attributes
    ----------
    program : Program
    ld : list of int
        ``ld`` beats (W bits each) in the order the LOADs consume them.
    tokens, hidden : int
        Shape of the result the OUTPUT command emits (rows beyond ``tokens`` are cropped).
    info : dict
        Builder figures (buffer-fulls per expert, tile beats, weight words).
    """

    program: Program
    ld: list
    tokens: int
    hidden: int
    info: dict = field(default_factory=dict)

    def run_fsim(self):
        """Run on the functional simulator; returns its :class:`~.pe.FsimResult`."""
        from .pe import run
        return run(self.program, self.ld)

    def weight_words(self, expert, matrix, target) -> list:
        """The ``ld`` words (ints) of one weight matrix (``"up"``: up/gate, ``"down"``) of
        expert ``expert`` that LOADs into ``target`` (WMSB, WLSB, WSCALE), in stream order."""
        owners = self.info.get("weight_loads", {})
        return [w for i, _, _, words in self.loads(target)
                if owners.get(i) == (expert, matrix) for w in words]

    def loads(self, target=None) -> list:
        """The LOAD commands with their ``ld`` words, in stream order: a list of ``(command
        index, Target, buf, words)`` (``words``: the slice of :attr:`ld` the LOAD consumes);
        only those into ``target`` if given."""
        out, pos = [], 0
        for i, cmd in enumerate(self.program):
            if cmd.op is not Op.LOAD:
                continue
            n = cmd.fields["words"]
            t = Target(cmd.fields["target"])
            if target is None or t is Target(target):
                out.append((i, t, cmd.fields["buf"], self.ld[pos:pos + n]))
            pos += n
        return out

    def decode(self, result) -> np.ndarray:
        """``float32 [T, H]`` from an :class:`~.pe.FsimResult` (or anything with ``.data()``
        returning the DATA beats' FP32 values ``[beats, W/32]``)."""
        vals = result.data()
        rows = vals.size // self.hidden
        return vals.reshape(rows, self.hidden)[:self.tokens]


#: Buffer-fulls at the start of the program and at its end, in words of a weight plane
#: (rounded to whole column blocks): a small first buffer-full lets the first GEMM start early
#: (compute-bound batches), a small last one shortens what runs after the last weight word
#: arrives (memory-bound batches). Multiples of 8 words fill whole scale words.
RAMP_UP_WORDS = (8, 16)
RAMP_DOWN_WORDS = (24, 24, 16, 8, 8, 8, 8)
#: Groups of the second of the two K-chained buffer-fulls the program's last column block is
#: cut into (one row block only: a K-chained GEMM has one result): the tile beats left after
#: the last weight word arrives, the program's drain behind the ``ld`` stream.
RAMP_DOWN_K_TAIL = 3
#: The last up/gate buffer-fulls of an expert whose REQUANT nothing runs beside (a lone
#: memory-bound expert): a short last up/gate GEMM starts the REQUANT sooner, so the two
#: buffer-fulls of down weights the load engine streams meanwhile (it can fill no more until
#: the first down GEMM releases one) cover the REQUANT, and the ``ld`` stream does not wait.
RAMP_UP_TAIL_WORDS = (24, 16, 16, 8, 8)
#: HB bank bytes per PE clock cycle assumed when the builder gets a PEConfig: the default
#: :class:`~elmoe3d.config.ArchConfig`'s ``hb_bytes_per_cycle`` (``hb_bank_gbps / clock_ghz``,
#: the paper's 51.2 GB/s at 1 GHz); with an ArchConfig it uses that one's.
DEFAULT_HB_BYTES_PER_CYCLE = ArchConfig().hb_bytes_per_cycle


@dataclass
class _Job:
    """One WMEM buffer-full: its plane loads, its scale load (signals) and its GEMM."""

    planes: list                  # [(target, words uint8 [n, W/8])]
    scales: np.ndarray
    gemm: dict
    beats: int = 0                # tile beats of its GEMMs
    chain: list = field(default_factory=list)   # GEMMs after ``gemm`` on the same buffer-full
    words: int = 0                # ld words of its loads
    expert: int = -1
    prologue: list | None = None  # the expert's TOK / ACT loads, before this scale load
    fence: bool = False           # the prologue's first load fences
    after: int = -1               # the prologue follows GEMM job `after` in the program


@dataclass
class _Plan:
    """One expert of the program: its IOMEM region, loads, REQUANT and buffer-full jobs."""

    index: int
    t0: int                       # first TOK entry (= HBUF row) of the region
    tok_entries: int
    a0: int                       # first ACT word of the region
    act_words: int
    prologue: list
    requant: dict
    requant_cycles: int           # estimate: rows x chunks per row + pipeline
    drain_cycles: int             # last up/gate beat -> the REQUANT's start (config.drain_cycles)
    up_w: _Weights
    down_w: _Weights
    first: bool                   # the program's first expert (ramped up)
    last: bool                    # the program's last expert (ramped down)
    tokens: int = 0
    up: list = None               # jobs, once the scheduler has cut them
    down: list = None
    pairing: tuple = None         # (head up jobs, paired jobs) of its block (_cut_pair)

    def cut_up(self, sizes=None, *, alone=False, ld_cycles=0.0):
        """Cut the up/gate matrix into jobs (``sizes`` column blocks each, or the default
        cut: whole buffer-fulls, ramped up in the program's first expert; ramped down
        (:data:`RAMP_UP_TAIL_WORDS`) when ``alone``, nothing runs beside this expert's REQUANT,
        and the matrix is memory-heavy at ``ld_cycles`` per word)."""
        if sizes is None:
            w = self.up_w
            sizes = _chunks(w.n_cb, w.groups, w.per_buf,
                            head=RAMP_UP_WORDS if self.first else (),
                            tail=RAMP_UP_TAIL_WORDS if alone and w.heavy(ld_cycles) else ())
        self.up = self.up_w.jobs(sizes)
        self.up[0].prologue = self.prologue
        for job in self.up:
            job.expert = self.index
        return self.up

    def cut_down(self, sizes=None):
        """Cut the down matrix into jobs (``sizes`` column blocks each, or the default cut:
        whole buffer-fulls, ramped down (:data:`RAMP_DOWN_WORDS`, the last column block in two
        K-chained parts, :data:`RAMP_DOWN_K_TAIL`, when it can be) in the program's last
        expert)."""
        w, k_tail = self.down_w, 0
        if sizes is None:
            sizes = _chunks(w.n_cb, w.groups, w.per_buf,
                            tail=RAMP_DOWN_WORDS if self.last else ())
            if self.last and sizes[-1] == 1 and w.k_split(RAMP_DOWN_K_TAIL):
                k_tail = RAMP_DOWN_K_TAIL
        self.down = w.jobs(sizes, k_tail=k_tail)
        self.down[0].gemm["rq_wait"] = True
        for job in self.down:
            job.expert = self.index
        return self.down

    def overlaps(self, other) -> bool:
        return (max(self.t0, other.t0) < min(self.t0 + self.tok_entries,
                                             other.t0 + other.tok_entries)
                or max(self.a0, other.a0) < min(self.a0 + self.act_words,
                                                other.a0 + other.act_words))


def nibbles(codes) -> tuple:
    """MSB nibbles (two's complement) and LSB nibbles of INT8 codes."""
    return (msb_slice(codes).view(np.uint8) & 15).astype(np.uint8), lsb_slice(codes)


def _align(groups, per_buf) -> int:
    """Column blocks that fill whole scale words (8 entries of ``groups`` per column block):
    buffer-fulls cut at multiples of it load the matrix's scale words unchanged, whatever the
    cut (so DRAFT and FULL programs stream the same scale words)."""
    a = 8 // math.gcd(groups, 8)
    return a if a <= per_buf else 1


def _chunks(n_cb, groups, per_buf, *, head=(), tail=()) -> list:
    """Column blocks per buffer-full: ``per_buf`` each, the first ones ``head`` and the last
    ones ``tail`` words of a weight plane (rounded up to whole column blocks), every one but
    the matrix's last a multiple of :func:`_align`."""
    a = _align(groups, per_buf)
    per = per_buf // a                     # in units of a column blocks
    units, extra = divmod(n_cb, a)

    def unit(words):
        return max(1, min(per, -(-words // (groups * a))))
    rest, front, back = units, [], []
    for c in map(unit, head):
        c = min(c, rest)
        if c:
            front.append(c)
            rest -= c
    for c in map(unit, reversed(tail)):
        c = min(c, rest)
        if c:
            back.insert(0, c)
            rest -= c
    mid = [per] * (rest // per)
    rest -= per * len(mid)
    if rest:                 # the remainder joins a ramp buffer-full (not the first) if it fits
        if back and back[0] + rest <= per:
            back[0] += rest
        elif len(front) > 1 and front[-1] + rest <= per:
            front[-1] += rest
        else:
            mid.insert(0, rest)
    sizes = [c * a for c in front + mid + back]
    if extra:                                # column blocks short of a whole scale word: last
        if sizes and sizes[-1] + extra <= per_buf:
            sizes[-1] += extra
        else:
            sizes.append(extra)
    return sizes


class _Weights:
    """One weight matrix of an expert (the rows ``qw[rows_order]``) in column blocks of L rows,
    cut into buffer-full jobs by :meth:`jobs` (the scheduler chooses the cut)."""

    def __init__(self, qw: QuantizedWeight, rows_order, mode, pe, *, sink, out_base_of, stride,
                 tok_base, act_base, row_blocks):
        L = pe.lanes
        q = qw.q[rows_order]
        scale = np.asarray(qw.scale, np.float16).view(np.uint16)[rows_order]
        n_rows, k = q.shape
        self.groups = groups = k // 32
        self.n_cb = n_cb = n_rows // L
        self.per_buf = pe.wmem_words // groups
        self.align = _align(groups, max(self.per_buf, 1))
        if self.per_buf < 1:
            raise ProgramError(
                f"{qw.name}: K = {k} ({groups} groups of 32) does not fit one WMEM buffer of "
                f"{pe.wmem_words} words: the PE contract accumulates the whole of K in one "
                f"GEMM (no K tiling); use K <= {32 * pe.wmem_words} or a larger wmem_bytes")
        msb, lsb = nibbles(q)

        def blocks(a):                            # [cb, g, L, 32]
            return a.reshape(n_cb, L, groups, 32).transpose(0, 2, 1, 3)
        self.msb_b, self.lsb_b = blocks(msb), blocks(lsb)
        self.last_codes = q[-L:]                                     # the last column block
        self.scl_b = scale.reshape(n_cb, L, groups).transpose(0, 2, 1)     # [cb, g, L]
        self.mode, self.pe, self.row_blocks = mode, pe, row_blocks
        self.planes = self.halves = 2 if mode is Mode.FULL else 1
        self.gemm = dict(mode=mode, act_base=act_base, w_base=0, row_blocks=row_blocks,
                         groups=groups, sink=sink, tok_base=tok_base, stride=stride,
                         wait=True, release=True)
        self.out_base_of = out_base_of

    def words(self, n, groups=None) -> int:
        """ld words of a job of ``n`` column blocks (planes and scale words) of ``groups``
        groups each (default: all of K)."""
        g = self.groups if groups is None else groups
        return n * g * self.planes + -(-n * g // 8)

    def beats(self, n, groups=None) -> int:
        """Tile beats of a job of ``n`` column blocks of ``groups`` groups (default: K)."""
        return n * (self.groups if groups is None else groups) * self.row_blocks * self.halves

    def heavy(self, ld_cycles) -> bool:
        """Whether a whole buffer-full takes longer to load at ``ld_cycles`` per word than its
        GEMM's tile beats, on DRAFT's figures in either mode (FULL doubles both), so that a
        cut decided on it is the same in DRAFT and FULL."""
        n = self.per_buf
        return n * self.groups * self.row_blocks < ld_cycles * (n * self.groups
                                                                + -(-n * self.groups // 8))

    def k_split(self, tail) -> bool:
        """Whether the matrix's last column block can run as two K-chained buffer-fulls, the
        second of ``tail`` groups (:meth:`jobs`): one row block (a K-chained GEMM has one
        result), ``0 < tail < groups``, and no accumulator of that column block able to
        saturate whatever the activations (:attr:`last_block_exact`): FULL's chain adds each
        group's LSB and MSB terms separately and in another order than one FULL GEMM, which
        only an accumulator that never saturates makes equal (numerics 5). Decided on the
        weights alone, so DRAFT and FULL cut alike."""
        return self.row_blocks == 1 and 0 < tail < self.groups and self.last_block_exact

    @property
    def last_block_exact(self) -> bool:
        """The last column block's accumulations cannot saturate in any order: per lane,
        the sum over its groups of ``|scale term|`` of ``128 x sum (16 |msb| + lsb)`` (the
        largest slice psums any int8 activations give) stays below 2^63."""
        L, G = self.pe.lanes, self.groups
        codes = self.last_codes                                     # [L, K]
        mag = 16 * np.abs(msb_slice(codes).astype(np.int64)) + lsb_slice(codes)
        psum = 128 * mag.reshape(L, G, 32).sum(axis=-1)             # [L, g]
        scale = self.scl_b[-1].T.view(np.float16)                  # [L, g]
        bound = [sum(abs(int(t)) for t in scale_term(psum[n], scale[n])) for n in range(L)]
        return max(bound) < INT64_MAX

    def _job(self, j0, n, g0, g1, gemms) -> _Job:
        """The buffer-full of column blocks ``j0 .. j0+n-1``, groups ``g0 .. g1-1``, run by
        ``gemms`` (the first waits for it, the last releases it)."""
        pe, L, g = self.pe, self.pe.lanes, g1 - g0
        planes = [(Target.WMSB, pack_wgt(self.msb_b[j0:j0 + n, g0:g1].reshape(-1, L, 32), pe))]
        if self.mode is Mode.FULL:
            planes.append((Target.WLSB,
                           pack_wgt(self.lsb_b[j0:j0 + n, g0:g1].reshape(-1, L, 32), pe)))
        entries = self.scl_b[j0:j0 + n, g0:g1].reshape(-1, L)
        padded = np.zeros((-(-len(entries) // 8) * 8, L), np.uint16)
        padded[:len(entries)] = entries
        scales = pack_scales(padded.reshape(-1, 8, L), pe)
        for k, f in enumerate(gemms):
            f["wait"], f["release"] = k == 0, k == len(gemms) - 1
        return _Job(planes=planes, scales=scales, gemm=gemms[0], chain=gemms[1:],
                    beats=self.beats(n, g), words=self.words(n, g))

    def jobs(self, sizes, *, k_tail=0) -> list:
        """Jobs of ``sizes`` column blocks each, in order (they must cover the matrix). With
        ``k_tail`` > 0 (:meth:`k_split`; the last size 1) the last column block becomes two
        buffer-fulls, of ``groups - k_tail`` and ``k_tail`` groups, whose GEMMs chain their
        accumulators (``acc_hold`` / ``acc_cont``; FULL as LSB_ONLY + MSB_ONLY pairs): the
        tile beats left after the matrix's last weight word are ``k_tail`` (per half), at the
        cost of a scale word (``docs/pe.md``, "Program of an MoE layer")."""
        assert sum(sizes) == self.n_cb and all(0 < n <= self.per_buf for n in sizes), sizes
        # whole scale words: the cut does not change the matrix's scale words
        assert all(n % self.align == 0 for n in sizes[:-1]), (sizes, self.align)
        assert not k_tail or (self.k_split(k_tail) and sizes[-1] == 1), (sizes, k_tail)
        jobs, j0, G = [], 0, self.groups
        for k, n in enumerate(sizes):
            base = dict(self.gemm, col_blocks=n, out_base=self.out_base_of(j0))
            if k < len(sizes) - 1 or not k_tail:
                jobs.append(self._job(j0, n, 0, G, [base]))
            else:
                for g0, g1 in ((0, G - k_tail), (G - k_tail, G)):
                    part = dict(base, groups=g1 - g0, act_base=base["act_base"] + g0)
                    if self.mode is Mode.FULL:
                        gemms = [dict(part, mode=Mode.LSB_ONLY, acc_cont=g0 > 0, acc_hold=True),
                                 dict(part, mode=Mode.MSB_ONLY, acc_cont=True, acc_hold=g1 < G)]
                    else:
                        gemms = [dict(part, acc_cont=g0 > 0, acc_hold=g1 < G)]
                    jobs.append(self._job(j0, 1, g0, g1, gemms))
            j0 += n
        return jobs


def _expert_needs(ex: Expert, te: int, pe) -> tuple:
    """(TOK entries, ACT words) of an expert's IOMEM region for ``te`` tokens; raises
    ProgramError when the expert does not fit the PE at all."""
    R, OV = pe.rows, pe.q24_per_word
    h_dim, i_dim = ex.hidden, ex.intermediate
    rbn = -(-te // R)
    t_pad = rbn * R
    need = {
        "H % 32 and H % (W/32)": h_dim % 32 == 0 and h_dim % pe.q16_per_word == 0,
        "I % 32 and I % (W/32)": i_dim % 32 == 0 and i_dim % pe.q16_per_word == 0,
    }
    for what, ok in need.items():
        if not ok:
            raise ProgramError(f"expert H={h_dim}, I={i_dim}: needs {what} == 0 "
                               f"(W/32 = {pe.q16_per_word})")
    checks = [
        ("TOK entries", t_pad, pe.tok_entries),
        ("ACT words (x rows)", rbn * h_dim // 32, pe.act_words),
        ("ACT words (h rows)", rbn * i_dim // 32, pe.act_words),
        ("HBUF words", t_pad * i_dim // pe.q16_per_word, pe.hbuf_words),
    ]
    for what, used, size in checks:
        if used > size:
            raise ProgramError(f"expert H={h_dim}, I={i_dim} with {te} tokens needs {used} "
                               f"{what}; the PE has {size}")
    return -(-t_pad // OV) * OV, rbn * max(h_dim, i_dim) // 32


def _tok_capacity(pe, i_dim) -> int:
    """TOK entries usable as regions: HBUF rows (stride I/(W/32)) and the 8-bit tok_base."""
    return min(pe.tok_entries, pe.hbuf_words // (i_dim // pe.q16_per_word), 256)


def updown_order(intermediate: int, lanes: int) -> np.ndarray:
    """Row order of the interleaved up/gate weight matrix (rows of ``concat(up, gate)``): blocks
    of ``lanes / 4`` up channels then the same ``lanes / 4`` gate channels, one block per half
    of a weight word, so the MSB plane and scale words of an expert are byte-identical in DRAFT
    and FULL (``docs/pe.md``, SWIGLU sink). Returns int64 ``[2 * intermediate]``."""
    p = lanes // 4
    return np.concatenate([np.concatenate([np.arange(b * p, b * p + p),
                                           intermediate + np.arange(b * p, b * p + p)])
                           for b in range(intermediate // p)])


def _expert_plan(index, ex: Expert, x_q, e_x, gw_bits, slots, mode, pe, *, t0, a0, first,
                 last) -> _Plan:
    """Loads, REQUANT and jobs of one expert over its tokens (rows of ``x_q``) in the IOMEM
    region starting at TOK entry ``t0`` and ACT word ``a0``."""
    L, R = pe.lanes, pe.rows
    h_dim, i_dim = ex.hidden, ex.intermediate
    te = len(x_q)
    tok_n, act_n = _expert_needs(ex, te, pe)
    rbn = -(-te // R)
    t_pad = rbn * R
    tok = {"e_x": np.zeros(t_pad, np.int64), "e_h": np.zeros(t_pad, np.int64),
           "gate": np.zeros(t_pad, np.uint16), "slot": np.zeros(t_pad, np.int64)}
    e_x = np.asarray(e_x, np.int64)
    if e_x.size and (e_x.min() < -128 or e_x.max() > 127):
        raise ProgramError(f"activation exponents {e_x.min()}..{e_x.max()} do not fit the "
                           f"TOK entry's signed 8-bit e_x (scale the input)")
    tok["e_x"][:te] = e_x
    tok["gate"][:te] = gw_bits
    tok["slot"][:te] = slots
    xp = np.zeros((t_pad, h_dim), np.int8)
    xp[:te] = x_q
    act = xp.reshape(rbn, R, h_dim // 32, 32).transpose(0, 2, 1, 3).reshape(-1, R, 32)
    prologue = [(Target.TOK, t0 // pe.q24_per_word, pack_tok(tok, pe)),
                (Target.ACT, a0, pack_act(act, pe))]
    # up/gate interleaved in blocks of L/4 channels (one per half of a weight word), the same
    # layout in DRAFT and FULL: the MSB plane and scale words of an expert are byte-identical
    order = updown_order(i_dim, L)
    both = QuantizedWeight(q=np.concatenate([ex.up.q, ex.gate.q]),
                           scale=np.concatenate([ex.up.scale, ex.gate.scale]),
                           name=f"{ex.up.name}+gate")
    up_w = _Weights(both, order, mode, pe, sink=Sink.SWIGLU,
                    out_base_of=lambda j0: j0 * (L // 2), stride=i_dim // pe.q16_per_word,
                    tok_base=t0, act_base=a0, row_blocks=rbn)
    down_w = _Weights(ex.down, np.arange(h_dim), mode, pe, sink=Sink.COMBINE,
                      out_base_of=lambda j0: j0 * L, stride=h_dim // pe.q24_per_word,
                      tok_base=t0, act_base=a0, row_blocks=rbn)
    # the PE the program is built for: the default options (their timing by config's formulas,
    # without PEOptions' checks of the options: the builder takes any PEConfig)
    c = max_requant_units(pe.word_bits)            # REQUANT values per cycle
    return _Plan(index=index, t0=t0, tok_entries=tok_n, a0=a0, act_words=act_n,
                 prologue=prologue,
                 requant=dict(row_blocks=rbn, channels=i_dim, act_base=a0, tok_base=t0,
                              pad_rows=t_pad - te),
                 requant_cycles=te * max(i_dim // c, 3) + 8,
                 drain_cycles=drain_cycles(pe.rows),
                 up_w=up_w, down_w=down_w, first=first, last=last, tokens=te)


class _Timeline:
    """The builder's model of the two engines over the buffer-fulls, for choosing the order of
    jobs (a heuristic, not the contract): the load engine streams a job's words at
    ``ld_cycles`` per word into the buffer the GEMM two jobs earlier released; a GEMM starts
    when its words are in and the previous GEMM is done, and issues one beat per cycle."""

    def __init__(self, ld_cycles):
        self.ld_cycles = ld_cycles
        self.load_end = 0.0
        self.gemm_end = [0.0, 0.0]            # of the last two GEMMs

    def trial(self, job, not_before=0.0):
        words = job.words + sum(len(w) for _, _, w in job.prologue or ())
        start = max(self.load_end, self.gemm_end[-2])
        load_end = start + words * self.ld_cycles
        begin = max(load_end, self.gemm_end[-1], not_before)
        return load_end, begin, begin + job.beats

    def push(self, job, not_before=0.0):
        self.load_end, begin, end = self.trial(job, not_before)
        self.gemm_end = [self.gemm_end[-1], end]
        return begin, end


def _whole(n_cb, per_buf, *, rest_first=False) -> list:
    """``n_cb`` column blocks in whole buffer-fulls, the remainder last (or first)."""
    if n_cb <= 0:
        return []
    out = [per_buf] * (n_cb // per_buf)
    rest = [n_cb % per_buf] if n_cb % per_buf else []
    return rest + out if rest_first else out + rest


def _even(n_cb, per_buf, align) -> list:
    """``n_cb`` column blocks in the fewest buffer-fulls of at most ``per_buf`` (a multiple of
    ``align``), as even as whole ``align`` units allow, the smaller ones first: no job much
    smaller than the others, whose tile beats could not hide the next one's load."""
    if n_cb <= 0:
        return []
    units, extra = divmod(n_cb, align)
    k = -(-n_cb // per_buf)
    while True:
        sizes = [(units // k + (1 if i >= k - units % k else 0)) * align for i in range(k)]
        sizes[-1] += extra
        if sizes[-1] <= per_buf:
            return [s for s in sizes if s]
        k += 1


def _cut_pair(plan, prev, ld_cycles):
    """Cut ``plan``'s up/gate jobs and ``prev``'s down jobs, which share a block of the
    schedule. When one matrix is memory-heavy (its beats fall short of its load time) and the
    other compute-heavy, they are cut for pairing: after the up/gate jobs that run while
    ``prev``'s REQUANT finishes (the first down job waits for it), alternating jobs of ``n_m``
    and ``n_c`` column blocks hide each one's load under the other one's beats (the load engine
    is at most a buffer-full ahead); ``n_m``, ``n_c`` are chosen to leave the least idle on
    the model over ``min(mem / n_m, cmp / n_c)`` pairs, and the rest is cut in whole
    buffer-fulls. Sets ``plan.pairing = (head jobs, pairs)`` for :func:`_schedule`."""
    up, down = plan.up_w, prev.down_w
    plan.pairing = None

    def load(w, n):
        return ld_cycles * w.words(n)

    def heavy(w):
        return w.beats(w.per_buf) < load(w, w.per_buf)

    def deficit(w, n_cb):                  # idle of a memory-heavy list in whole buffer-fulls
        return (n_cb / w.per_buf) * max(0.0, load(w, w.per_buf) - w.beats(w.per_buf))

    if (heavy(up) == heavy(down) or up.n_cb < 3 or up.n_cb % up.align
            or down.n_cb % down.align):
        plan.cut_up()
        prev.cut_down()
        return
    a_u = up.align
    skip = -(-(prev.requant_cycles + prev.drain_cycles) // up.beats(a_u)) * a_u
    skip = min(skip, max(0, up.n_cb - 2 * a_u))
    # two buffer-fulls of up/gate jobs stay last (the next expert's loads go under them)
    avail = {id(up): max(0, up.n_cb - skip - 2 * up.per_buf), id(down): down.n_cb}
    mem, cmp = (up, down) if heavy(up) else (down, up)
    base = deficit(mem, avail[id(mem)])
    best = None
    for n_m in range(mem.align, mem.per_buf + 1, mem.align):
        for n_c in range(cmp.align, cmp.per_buf + 1, cmp.align):
            pairs = min(avail[id(mem)] // n_m, avail[id(cmp)] // n_c)
            if not pairs:
                continue
            idle = pairs * (max(0.0, load(cmp, n_c) - mem.beats(n_m))
                            + max(0.0, load(mem, n_m) - cmp.beats(n_c)))
            cost = idle + deficit(mem, avail[id(mem)] - pairs * n_m) + 0.5 * pairs
            if best is None or cost < best[0]:
                best = (cost, n_m, n_c, pairs)
    if best is None or best[0] >= base:
        plan.cut_up()
        prev.cut_down()
        return
    _, n_m, n_c, pairs = best
    n_up, n_down = (n_m, n_c) if mem is up else (n_c, n_m)
    up_per = up.per_buf // up.align * up.align
    head = _whole(skip, up_per)
    plan.cut_up(head + [n_up] * pairs
                + _even(up.n_cb - skip - pairs * n_up, up_per, up.align))
    prev.cut_down([n_down] * pairs
                  + _whole(down.n_cb - pairs * n_down, down.per_buf // down.align * down.align))
    plan.pairing = (len(head), pairs)


def _schedule(plans, ld_cycles) -> list:
    """Execute order of the experts' jobs and REQUANTs, as ``("gemm", job)`` and
    ``("requant", fields)`` items: a software pipeline over the experts (``docs/pe.md``,
    "Program of an MoE layer"). Block e is expert e's up/gate jobs but the last, interleaved
    with expert e-1's down jobs, then expert e's last up/gate job and its REQUANT, which runs
    beside block e+1 (the first down job of e waits for it)::

        U0 Q0 | U1[:-1] + D0 (interleaved), U1[-1], Q1 | U2[:-1] + D1, U2[-1], Q2 | ... | Dn-1

    So a REQUANT does not idle the tile, and expert e+1's IOMEM region may reuse expert e-1's:
    its first loads wait only for D(e-1), which ends at least a job earlier. Within a block
    the two lists keep their order and are interleaved greedily on a :class:`_Timeline`: the
    job that leaves the tile idle least, and among those the more memory-heavy one (spending
    the load engine's lead when it has one; a memory-bound expert beside a compute-bound one
    keeps the tile busy). The last expert's REQUANT has no next block: the previous expert's
    last down jobs follow it instead. When two consecutive experts' regions overlap (the IOMEM
    is too small for both), the earlier one's down jobs all come first.
    """
    tl = _Timeline(ld_cycles)
    items, prev, q_end = [], None, 0.0
    for n, plan in enumerate(plans):
        # the last expert's REQUANT with no down jobs of an earlier one beside it
        alone = n == len(plans) - 1 and (n == 0 or plans[n - 1].overlaps(plan))
        if n == 0:
            plan.cut_up(alone=alone, ld_cycles=ld_cycles)
        elif plans[n - 1].overlaps(plan) or n == len(plans) - 1:
            # (the last block keeps whole buffer-fulls: its down jobs run beside the REQUANT)
            plan.cut_up(alone=alone, ld_cycles=ld_cycles)
            plans[n - 1].cut_down()
        else:
            _cut_pair(plan, plans[n - 1], ld_cycles)
    plans[-1].cut_down()

    def place(job, not_before=0.0):
        items.append(("gemm", job))
        return tl.push(job, not_before)

    def heavy(job):                          # load cycles per beat
        return job.words * ld_cycles / max(job.beats, 1)

    for n, plan in enumerate(plans):
        downs = list(prev.down) if prev is not None else []
        if prev is not None and prev.overlaps(plan):
            for k, job in enumerate(downs):
                place(job, q_end if k == 0 else 0.0)
            downs = []
        late = []
        paired = plan.pairing[1] if plan.pairing else 0
        if n == len(plans) - 1 and len(downs) > 1:
            # the previous expert's last down jobs run beside this (last) expert's REQUANT
            need = plan.requant_cycles + plan.drain_cycles
            while len(downs) > max(1, paired) and need > 0:
                job = downs.pop()
                late.insert(0, job)
                need -= max(job.beats, job.words * ld_cycles)
        keep = 2 if len(plan.up) > 2 else 1      # up/gate jobs after the last down job
        ups = list(plan.up[:-keep])
        if plan.pairing and downs:
            head, pairs = plan.pairing
            pairs = min(pairs, len(downs))
            for job in ups[:head]:
                place(job)
            for d, u in zip(downs[:pairs], ups[head:head + pairs]):
                place(d, q_end if d is prev.down[0] else 0.0)
                place(u)
            ups, downs = ups[head + pairs:], downs[pairs:]
        up_beats = 0
        while ups or downs:
            cands = []
            if ups:
                cands.append((ups, 0.0))
            first_down = bool(downs) and downs[0] is prev.down[0]
            # the first down job waits for prev's REQUANT: up/gate jobs go first meanwhile
            if downs and (not first_down or not ups
                          or up_beats >= prev.requant_cycles + prev.drain_cycles):
                cands.append((downs, q_end if first_down else 0.0))
            best = None
            for lst, nb in cands:
                _, begin, _ = tl.trial(lst[0], nb)
                key = (round(begin - tl.gemm_end[-1], 6), -heavy(lst[0]))
                if best is None or key < best[0]:
                    best = (key, lst, nb)
            _, lst, nb = best
            if lst is ups:
                up_beats += ups[0].beats
            place(lst.pop(0), nb)
        for job in plan.up[len(plan.up) - keep:]:
            _, end = place(job)
        items.append(("requant", plan.requant))
        q_end = end + plan.drain_cycles + plan.requant_cycles
        for job in late:
            place(job)
        prev = plan
    for k, job in enumerate(prev.down):
        place(job, q_end if k == 0 else 0.0)
    return items


def _emit(pe, plans, tokens, hidden, ld_cycles) -> tuple:
    """Schedule the experts into one program: loads of buffer-full k+2 follow GEMM k (double
    buffering); an expert's TOK and ACT loads precede its first scale load (which signals) and
    follow the last GEMM of every earlier expert whose region they overwrite (then the first
    of them fences)."""
    items = _schedule(plans, ld_cycles)
    jobs = [job for kind, job in items if kind == "gemm"]
    pos = {id(job): k for k, job in enumerate(jobs)}
    for e, plan in enumerate(plans):
        olds = [q for q in plans[:e] if q.overlaps(plan)]
        plan.up[0].fence = bool(olds)
        plan.up[0].after = max((pos[id(q.down[-1])] for q in olds), default=-1)
    _place(pe, jobs)
    prog = Program(pe)
    ld = []
    prog.clear(out=True, rowmax=True, flags=True, counters=True)
    n = len(jobs)
    state = {"next": 0, "planes": set(), "last_gemm": -1}

    owners = {}

    def load(target, addr, words, buf=0, signal=False, fence=False, job=None):
        i = prog.load(target, addr, len(words), buf=buf, signal=signal, fence=fence)
        ld.append(words)
        if job is not None:
            owners[i] = (job.expert, "up" if job.gemm["sink"] == Sink.SWIGLU else "down")

    def prologue(job):
        for i, (target, addr, words) in enumerate(job.prologue):
            load(target, addr, words, fence=job.fence and i == 0)
        job.prologue = None

    def emit_loads(limit):
        while state["next"] < min(limit, n):
            k = state["next"]
            job, buf = jobs[k], k % 2
            if job.prologue is not None:
                if state["last_gemm"] < job.after:          # its region is still in use
                    if k not in state["planes"]:
                        for target, words in job.planes:
                            load(target, job.gemm["w_base"], words, buf, job=job)
                        state["planes"].add(k)
                    return
                prologue(job)
            base = job.gemm["w_base"]
            if k not in state["planes"]:
                for target, words in job.planes:
                    load(target, base, words, buf, job=job)
                state["planes"].add(k)
            load(Target.WSCALE, base // 8, job.scales, buf, signal=True, job=job)
            state["next"] = k + 1
            # the next expert's tokens go in as early as their region allows (a buffer-full
            # before they are needed, so that their fence finds the region's GEMMs done)
            nxt = jobs[k + 1] if k + 1 < n else None
            if nxt is not None and nxt.prologue is not None \
                    and state["last_gemm"] >= nxt.after:
                prologue(nxt)

    emit_loads(2)
    for kind, item in items:
        if kind == "requant":
            prog.requant(**item)
            continue
        k = pos[id(item)]
        emit_loads(k + 2)
        assert state["next"] > k
        for f in [item.gemm, *item.chain]:
            prog.gemm(wbuf=k % 2, **f)
        state["last_gemm"] = k
        emit_loads(k + 3)
    t_pad = -(-tokens // pe.rows) * pe.rows
    if t_pad * hidden // pe.q24_per_word > pe.out_words:
        raise ProgramError(f"{tokens} tokens x H={hidden} need "
                           f"{t_pad * hidden // pe.q24_per_word} OUT words; the PE has "
                           f"{pe.out_words}")
    prog.output(**_output_shape(pe, tokens, hidden))
    # no BARRIER before STATUS: every LOAD precedes the last GEMM's wait (the load engine is in
    # order), and STATUS waits for every execute command, so its counters do not depend on
    # timing either
    prog.status()
    prog.check_sync()
    words = [w for chunk in ld for w in _ints(chunk)]
    return prog, words, jobs, owners


def _place(pe, jobs):
    """Where each job's words go in its WMEM buffer (``w_base``): a job that fits half a buffer
    goes into the upper half when the previous job in the same buffer used only the lower half,
    else at word 0. Each half has a flag of its own (``docs/pe.md``, "Engines and
    synchronisation"): the GEMM reading the previous job releases the half it does not read
    when it starts its last column block, so the next job's loads need not wait for it."""
    low = pe.wmem_low_words
    for k, job in enumerate(jobs):
        base = 0
        if low and k >= 2:
            prev = jobs[k - 2]
            words = job.gemm["col_blocks"] * job.gemm["groups"]
            prev_words = prev.gemm["col_blocks"] * prev.gemm["groups"]
            if prev.gemm["w_base"] == 0 and prev_words <= low and words <= pe.wmem_words - low:
                base = low
        for f in [job.gemm, *job.chain]:      # every GEMM of the buffer-full reads it there
            f["w_base"] = base


def _output_shape(pe, tokens, hidden) -> dict:
    """``row_blocks`` and ``channels`` of the OUTPUT of ``tokens`` rows of ``hidden`` channels.

    OUTPUT reads OUT in address order (``row_blocks * rows * channels`` values, ``docs/pe.md``,
    OUTPUT) and OUT row ``s`` holds channels ``s * hidden ..``, so any factorisation of the
    value count gives the same values in the same order. The builder emits the fewest whole
    token rows ``t >= tokens`` that factor into ``row_blocks * rows * channels`` (``channels`` a
    multiple of W/32 below 2^16, ``row_blocks`` below 2^8): the padding rows of the last row
    block are not sent when they need not be (one token on the small PE: 4 beats instead of
    8). Falls back to whole row blocks of ``hidden`` channels. :meth:`PEJob.decode` drops the
    rows beyond ``tokens`` either way."""
    R, fp = pe.rows, pe.fp32_per_beat
    t_pad = -(-tokens // R) * R
    for t in range(tokens, t_pad):
        n = t * hidden
        for rb in range(1, 256):
            if n % (rb * R * fp) == 0 and n // (rb * R) < 1 << 16:
                return {"row_blocks": rb, "channels": n // (rb * R)}
    return {"row_blocks": t_pad // R, "channels": hidden}


def _ints(chunk):
    from .asm import words_to_ints
    return words_to_ints(chunk)


def _split_last(routed, ex: Expert, pe, ld_cycles) -> list:
    """``routed`` (``[(expert, token rows, gate bits)]`` in program order) with its last expert
    run as two sub-batches of its row blocks (the first ``floor(n/2)``, then the rest) when
    that pays: the program's last REQUANT has no next expert's up/gate GEMMs beside it, only
    the previous expert's down GEMMs, so with too few of them (none for a lone expert) the
    tile idles for the whole REQUANT, a large one with many tokens. As two sub-batches the
    first one's REQUANT runs beside the second one's up/gate GEMMs and the second one's
    (half as long) beside the first one's down GEMMs (``docs/pe.md``, "Program of an MoE
    layer"). The cost is the expert's weights streamed twice: done only when each sub-batch's
    stream fits under its own tile beats at ``ld_cycles`` per word. The figures are DRAFT's
    whatever the mode (FULL doubles both beats and plane words), so DRAFT and FULL programs
    split alike and stream the same MSB plane and scale words. Returns a new list."""
    R = pe.rows
    e, rows, gw = routed[-1]
    rbn = -(-len(rows) // R)
    _expert_needs(ex, len(rows), pe)        # the whole expert fits, or the error names it
    if rbn < 2:
        return list(routed)
    h_dim, i_dim = ex.hidden, ex.intermediate
    up_w, down_w = 2 * i_dim * (h_dim // 32) // pe.lanes, h_dim * (i_dim // 32) // pe.lanes
    words = up_w + -(-up_w // 8) + down_w + -(-down_w // 8)         # DRAFT: planes, scales
    beats_rb = up_w + down_w                                        # DRAFT, per row block
    c = max_requant_units(pe.word_bits)
    requant = len(rows) * max(i_dim // c, 3) + 8 + drain_cycles(R)   # padding rows: none
    cover = 0                               # the previous expert's down beats beside it
    if len(routed) > 1:
        cover = down_w * -(-len(routed[-2][1]) // R)
    if cover >= requant or words * ld_cycles > rbn // 2 * beats_rb:
        return list(routed)
    k = rbn // 2 * R
    return list(routed[:-1]) + [(e, rows[:k], gw[:k]), (e, rows[k:], gw[k:])]


def build_moe_program(x, experts, routing, mode, config) -> PEJob:
    """PE program and ``ld`` stream of an MoE layer on one PE: every expert with at least one
    routed token, in ascending id, over its tokens (ascending; the last expert in two
    sub-batches of its row blocks when that hides its REQUANT, :func:`_split_last`); outputs
    summed in OUT (Q.24) at the tokens' batch positions; then OUTPUT (FP32 ``[T, H]``, the
    token rows only where whole beats allow, :func:`_output_shape`) and STATUS. ``info``:
    ``experts`` (per expert id: tokens, buffer-fulls and sub-batches summed, the first
    sub-batch's IOMEM region), ``gemm_beats``, ``ld_words``, ``commands``, ``weight_loads``.

    Parameters
    ----------
    x : float ``[T, H]`` (T <= 256)
    experts, routing : as for :func:`ref_moe`
    mode : Mode.FULL or Mode.DRAFT (DRAFT loads only the MSB planes)
    config : ArchConfig or PEConfig

    Raises
    ------
    ProgramError
        The shapes do not fit the PE (the message names the memory and the figures).
    """
    pe = pe_config(config)
    mode = _mode(mode)
    exs = as_experts(experts)
    x = np.asarray(x)
    t = check_x(x, exs[0])
    if t > 256:
        raise ProgramError(f"{t} tokens: the TOK slot field addresses at most 256 OUT rows")
    ids, bits = parse_routing(routing, t, len(exs))
    xq = quantize_activations(x, name="x")
    routed = []
    for e in range(len(exs)):
        rows, gw = expert_tokens(ids, bits, e)
        if len(rows):
            routed.append((e, rows, gw))
    if not routed:
        raise ProgramError("routing sends no token to any expert")
    hb = (config.hb_bytes_per_cycle if isinstance(config, ArchConfig)
          else DEFAULT_HB_BYTES_PER_CYCLE)
    ld_cycles = pe.word_bytes / hb
    routed = _split_last(routed, exs[routed[-1][0]], pe, ld_cycles)
    # IOMEM regions: each expert's TOK entries (= HBUF rows) and ACT words placed right after
    # the previous expert's, wrapping to 0 (a ring), so consecutive experts use separate
    # regions whenever the memories hold both
    cap_t, cap_a = _tok_capacity(pe, exs[0].intermediate), pe.act_words
    plans, per_expert, cur_t, cur_a = [], {}, 0, 0
    for n, (e, rows, gw) in enumerate(routed):
        tok_n, act_n = _expert_needs(exs[e], len(rows), pe)
        t0 = cur_t if cur_t + tok_n <= cap_t else 0
        a0 = cur_a if cur_a + act_n <= cap_a else 0
        if t0 + tok_n > cap_t:
            raise ProgramError(f"expert {e}: {len(rows)} tokens need {tok_n} TOK entries; "
                               f"with I={exs[e].intermediate} the HBUF holds {cap_t} rows")
        plan = _expert_plan(e, exs[e], xq.q[rows], xq.exp[rows], gw, rows, mode, pe, t0=t0,
                            a0=a0, first=n == 0, last=n == len(routed) - 1)
        plans.append(plan)
        cur_t, cur_a = t0 + tok_n, a0 + act_n
    prog, words, jobs, owners = _emit(pe, plans, t, exs[0].hidden, ld_cycles)
    for plan in plans:
        rec = per_expert.setdefault(plan.index, {"tokens": 0, "buffer_fulls": 0,
                                                 "tok_base": plan.t0, "act_base": plan.a0,
                                                 "batches": 0})
        rec["tokens"] += plan.tokens
        rec["buffer_fulls"] += len(plan.up) + len(plan.down)
        rec["batches"] += 1
    beats = sum(j.beats for j in jobs)
    info = {"experts": per_expert, "gemm_beats": beats, "ld_words": len(words),
            "commands": prog.counts(), "weight_loads": owners}
    return PEJob(program=prog, ld=words, tokens=t, hidden=exs[0].hidden, info=info)


def build_expert_program(x, w_up, w_gate, w_down, gate_weights=None, mode=Mode.FULL,
                         config=None) -> PEJob:
    """PE program and ``ld`` stream of one expert over all tokens of ``x`` (see
    :func:`build_moe_program`); equal bit for bit to :func:`ref_expert` with the same
    arguments. ``config`` is an ArchConfig or PEConfig (required)."""
    if config is None:
        raise TypeError("build_expert_program: pass config= (an ArchConfig or PEConfig)")
    ex = as_expert((w_up, w_gate, w_down))
    x = np.asarray(x)
    t = check_x(x, ex)
    gw = _gate_bits(np.ones(t) if gate_weights is None else gate_weights, t)
    return build_moe_program(x, [ex], (np.zeros((t, 1), np.int64), gw.view(np.float16)[:, None]),
                             mode, config)

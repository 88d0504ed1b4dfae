"""Float64 reference and error metrics: how far the quantized datapath is from real arithmetic.

docs/numerics.md: a float64 reference runs beside the golden model to *report* accuracy (SQNR dB,
cosine, max abs error); it is never what the RTL is checked against (that is plain equality
with :mod:`elmoe3d.sw.golden.datapath`). Plain NumPy, float64 throughout.

* :func:`error_metrics` -- MSE, SQNR, cosine and max abs error of one approximation.
* :class:`ErrorSums` -- the same metrics from running sums, so that errors over many tensors
  (or over row chunks of one large tensor) pool exactly: the pooled figures are those of all
  elements concatenated, not averages of per-tensor ratios.
* :func:`reference_linear` -- ``x @ w.T`` in float64 (a PyTorch ``Linear`` without bias).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


__all__ = ["error_metrics", "ErrorSums", "reference_linear"]


def _pair(ref, approx):
    ref = np.asarray(ref, dtype=np.float64)
    approx = np.asarray(approx, dtype=np.float64)
    if ref.shape != approx.shape:
        raise ValueError(f"error_metrics: shapes differ: reference {tuple(ref.shape)} vs "
                         f"approximation {tuple(approx.shape)}")
    for what, arr in (("ref", ref), ("approx", approx)):
        bad = ~np.isfinite(arr)
        if bad.any():
            idx = np.unravel_index(int(np.flatnonzero(bad)[0]), arr.shape)
            where = f" at index {tuple(int(i) for i in idx)}" if arr.ndim else ""
            raise ValueError(f"error_metrics: {what}: non-finite value {arr[idx]}{where} (the "
                             f"metrics are of finite values)")
    return ref, approx


@dataclass
class ErrorSums:
    """Running sums from which the error metrics follow; ``+`` / ``+=`` pool two sets.

    Attributes
    ----------
    n : int
        Number of elements.
    ref_sq, approx_sq, err_sq : float
        ``sum ref^2``, ``sum approx^2``, ``sum (approx - ref)^2``.
    dot : float
        ``sum ref * approx``.
    max_abs : float
        ``max |approx - ref|`` (0 for no elements).
    """

    n: int = 0
    ref_sq: float = 0.0
    approx_sq: float = 0.0
    err_sq: float = 0.0
    dot: float = 0.0
    max_abs: float = 0.0

    @classmethod
    def of(cls, ref, approx) -> "ErrorSums":
        """Sums of one pair of same-shaped arrays (any shape; converted to float64).

        Raises
        ------
        ValueError
            The shapes differ, a value is NaN or Inf (named ``ref`` or ``approx``, with its
            index), or the sums of squares overflow float64 (values beyond about 1e154).
        """
        ref, approx = _pair(ref, approx)
        r = ref.reshape(-1)
        a = approx.reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            e = a - r
            sums = cls(n=int(r.size), ref_sq=float(r @ r), approx_sq=float(a @ a),
                       err_sq=float(e @ e), dot=float(r @ a),
                       max_abs=float(max(e.max(), -e.min())) if e.size else 0.0)
        if not all(math.isfinite(v) for v in (sums.ref_sq, sums.approx_sq, sums.err_sq,
                                              sums.dot, sums.max_abs)):
            raise ValueError(f"error_metrics: the sums of squares overflow float64 (values up "
                             f"to {max(np.abs(r).max(), np.abs(a).max()):.3g}): scale ref and "
                             f"approx alike first")
        return sums

    def __add__(self, other: "ErrorSums") -> "ErrorSums":
        if not isinstance(other, ErrorSums):
            return NotImplemented
        return ErrorSums(self.n + other.n, self.ref_sq + other.ref_sq,
                         self.approx_sq + other.approx_sq, self.err_sq + other.err_sq,
                         self.dot + other.dot, max(self.max_abs, other.max_abs))

    def metrics(self) -> dict:
        """``{"mse", "sqnr_db", "cosine", "max_abs"}`` (floats) as in :func:`error_metrics`.
        Raises ``ValueError`` if pooling overflowed a sum past float64."""
        if not all(math.isfinite(v) for v in (self.ref_sq, self.approx_sq, self.err_sq,
                                              self.dot)):
            raise ValueError("error_metrics: the pooled sums of squares overflow float64: "
                             "scale ref and approx alike first")
        mse = self.err_sq / self.n if self.n else 0.0
        if self.err_sq == 0.0:
            sqnr = math.inf
        elif self.ref_sq == 0.0:
            sqnr = -math.inf
        else:
            sqnr = 10.0 * math.log10(self.ref_sq / self.err_sq)
        if self.ref_sq == 0.0 and self.approx_sq == 0.0:
            cosine = 1.0
        elif self.ref_sq == 0.0 or self.approx_sq == 0.0:
            cosine = 0.0
        else:
            cosine = self.dot / (math.sqrt(self.ref_sq) * math.sqrt(self.approx_sq))
            cosine = min(1.0, max(-1.0, cosine))        # rounding must not leave [-1, 1]
        return {"mse": mse, "sqnr_db": sqnr, "cosine": cosine, "max_abs": self.max_abs}


def error_metrics(ref, approx) -> dict:
    """Error of ``approx`` against the reference ``ref``, over all elements, in float64.

    Parameters
    ----------
    ref, approx : array_like of float, same shape (any number of dimensions)

    Returns
    -------
    dict with float values:

    ``mse``
        ``mean((approx - ref)^2)`` (0 for empty arrays).
    ``sqnr_db``
        ``10 * log10(sum ref^2 / sum (approx - ref)^2)``: ``+inf`` when the error is exactly
        zero, ``-inf`` when ``ref`` is all zero but the error is not.
    ``cosine``
        Cosine similarity of the flattened arrays: 1.0 when both are zero vectors, 0.0 when
        exactly one is.
    ``max_abs``
        ``max |approx - ref|``.

    Raises
    ------
    ValueError
        The shapes differ (the message gives both), a value is NaN or Inf (named ``ref`` or
        ``approx``, with its index), or the sums of squares overflow float64 (values beyond
        about 1e154).
    """
    return ErrorSums.of(ref, approx).metrics()


def reference_linear(x, w) -> np.ndarray:
    """Float64 reference of a bias-free linear layer: ``x @ w.T``.

    Parameters
    ----------
    x : array_like of float, shape ``[..., K]``
    w : array_like of float, shape ``[N, K]`` (PyTorch ``Linear.weight`` layout)

    Returns
    -------
    ndarray of float64, shape ``[..., N]``

    Raises
    ------
    ValueError
        ``w`` is not 2-D or K differs.
    """
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2:
        raise ValueError(f"reference_linear: weight must be [N, K], got shape {tuple(w.shape)}")
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"reference_linear: x has shape {tuple(x.shape)} but the weight has "
                         f"K = {w.shape[1]} (shape {tuple(w.shape)})")
    return x @ w.T

"""Routing traces: the canonical format, its reader and writer, and importers (BRIEF section 5).

The format (``docs/traces.md`` is its specification; version :data:`TRACE_VERSION`) holds one
row per (token, MoE layer): ``request``, ``position``, ``layer`` (decoder-layer index), ``phase``
(``prefill``, ``decode``, ``draft``, ``verify``), the top-k ``expert_ids`` best first, their
``gate_weights`` and, when known, the full router ``scores`` over all routed experts. On disk
it is a NumPy ``.npz`` of plain columns (no pickles) plus a JSON ``meta`` column.

* :class:`RoutingTrace` -- the columns, validated on construction; :meth:`RoutingTrace.save`
  and :meth:`RoutingTrace.load`; :meth:`RoutingTrace.requests` gives per-request dense arrays
  ``[tokens, layers, k]`` for the cache and Elastic-SD simulators.
* :func:`import_vllm_jsonl` -- the vLLM-style JSONL routing logs of ``../shared/traces`` and the
  common variants of that schema (see its docstring). Returns the trace and an
  :class:`ImportReport` that counts every dropped, repaired or missing record and names the
  file and line of each problem: nothing is dropped silently.
* :func:`trace_from_router_logits` -- router logits per layer (NumPy) to a trace, routed exactly
  as the model does (:meth:`~elmoe3d.sw.host.models.ModelPreset.route`), full scores kept.
* :func:`capture_hf` -- run a Hugging Face MoE model with ``output_router_logits=True`` and
  convert its router logits with :func:`trace_from_router_logits`. Imports ``torch`` lazily.

Errors: bad user input raises :class:`~elmoe3d.errors.UserError` naming the file and line (or
the column and row for in-memory traces, where a ``ValueError`` subclass is raised).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...checks import check_int, is_int
from ...errors import UserError
from .models import MODEL_PRESETS, model_preset, preset_for_model_id
from .routelog import (WARMUP_MIN_ROWS, DialectError, forward_passes, layer_by_layer,
                       router_norm_mismatch, usage_counts, warmup_blocks)
from .weights import npy_member_header


__all__ = ["TRACE_FORMAT", "TRACE_VERSION", "PHASES", "TraceError", "MODEL_LINE_KINDS",
           "MAX_LAYERS", "RoutingTrace", "RequestRouting", "ImportReport", "import_vllm_jsonl",
           "describe_json", "trace_from_router_logits", "capture_hf"]

#: Value of the ``format`` key of a trace file's metadata.
TRACE_FORMAT = "elmoe3d-routing-trace"
#: Version of the on-disk format this module writes and reads.
TRACE_VERSION = 1
#: Phase codes: the ``phase`` column holds the index into this tuple.
PHASES = ("prefill", "decode", "draft", "verify")

_COLUMNS = {"request": np.int32, "position": np.int32, "layer": np.int16, "phase": np.uint8,
            "expert_ids": np.int16, "gate_weights": np.float32, "scores": np.float32}
_META_KEYS = {"format", "version", "num_experts", "top_k", "layer_ids", "model",
              "weights_renormalised", "source", "notes"}
#: Tolerance on "the k weights sum to 1".
NORM_TOL = 1e-3
#: Largest value of a layer index and of an expert id: the ``layer`` and ``expert_ids``
#: columns are int16.
_LAYER_MAX = int(np.iinfo(_COLUMNS["layer"]).max)
_EXPERT_MAX = int(np.iinfo(_COLUMNS["expert_ids"]).max)
#: Largest request id and position (int32 columns).
_REQUEST_MAX = int(np.iinfo(_COLUMNS["request"]).max)
_POSITION_MAX = int(np.iinfo(_COLUMNS["position"]).max)
#: Layers a JSONL log may imply when nothing names them (no ``model``, no meta ``layer_ids`` or
#: ``num_layers``): the importer then takes the layers as 0..largest index logged, and refuses
#: an index >= this (or a meta ``num_layers`` / ``layers_logged`` beyond it) as no model's.
#: The largest MoE models have about 100 decoder layers.
MAX_LAYERS = 1024


class TraceError(UserError, ValueError):
    """A routing trace (in memory or on disk) breaks the format; the message names the column,
    row, file or line. ``kind``: for one malformed line of a JSONL log, its kind (a key of
    :attr:`ImportReport.malformed`: ``on_error="warn"`` would have skipped it), else ``None``.
    ``stray``: for such a line, whether skipping it is a remedy (False for a top-k that most
    lines do not have: the whole trace is then another model's, and skipping every line is
    not one)."""

    def __init__(self, message, kind=None, stray=True):
        super().__init__(message)
        self.kind = kind
        self.stray = stray


#: Kinds of malformed JSONL line whose check depends on the model's sizes (top-k, number of
#: experts, MoE layers, router): the same line may be fine under another model.
MODEL_LINE_KINDS = frozenset({"wrong-k", "unknown-expert", "bad-layer", "bad-scores"})


def _phase_code(phase) -> int:
    if isinstance(phase, str) and phase in PHASES:
        return PHASES.index(phase)
    raise TraceError(f"phase: expected one of {', '.join(PHASES)}, got {phase!r}")


def _sequence(value, name, what) -> list:
    """``value`` (a list, tuple, range or 1-D array; never a string or a mapping) as a list,
    else a :class:`TraceError` naming ``name`` and ``what`` was expected."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.tolist()
    if not isinstance(value, (list, tuple, range)):
        raise TraceError(f"{name}: expected {what}, got {value!r}")
    return list(value)


def _layer_ids_of(value, name="layer_ids") -> tuple:
    """``layer_ids`` checked: a non-empty sorted list of distinct integer layer indices in
    0..32767 (the ``layer`` column is int16), as a tuple of ints. Raises :class:`TraceError`
    naming ``name`` (and the entry)."""
    what = f"a sorted list of distinct layer indices in 0..{_LAYER_MAX}"
    items = _sequence(value, name, what)
    for i, x in enumerate(items):
        check_int(f"{name}[{i}]", x, 0, _LAYER_MAX, error=TraceError)
    ids = tuple(int(x) for x in items)
    if not ids or list(ids) != sorted(set(ids)):
        raise TraceError(f"{name}: expected {what}, got {value!r}")
    return ids


def _notes_of(value, name="notes") -> tuple:
    """``notes`` checked: a list of strings (one string is refused, not split into its
    characters), as a tuple. Raises :class:`TraceError` naming ``name`` (and the entry)."""
    items = _sequence(value, name, "a list of strings")
    for i, x in enumerate(items):
        if not isinstance(x, str):
            raise TraceError(f"{name}[{i}]: expected a string, got {x!r}")
    return tuple(items)


@dataclass(frozen=True)
class RequestRouting:
    """Dense routing of one request in one phase, tokens in position order.

    Attributes
    ----------
    request : int
    positions : ndarray int32 [T]
    layer_ids : tuple of int
        Decoder-layer index of each column of the layer axis.
    ids : ndarray int16 [T, L, k]
        Expert ids best first. A missing (token, layer) record holds ``num_experts`` in every
        slot: out of range on purpose, so using it as an index raises instead of silently
        meaning the last expert (as -1 would).
    weights : ndarray float32 [T, L, k]
        Gate weights (0 where missing).
    present : ndarray bool [T, L]
    scores : ndarray float32 [T, L, E] or None
        Full router scores when the trace has them (NaN where missing).
    """

    request: int
    positions: np.ndarray
    layer_ids: tuple
    ids: np.ndarray
    weights: np.ndarray
    present: np.ndarray
    scores: np.ndarray | None

    @property
    def tokens(self) -> int:
        return len(self.positions)


@dataclass(frozen=True, eq=False)
class RoutingTrace:
    """A routing trace in the canonical format (version :data:`TRACE_VERSION`).

    Columns (R rows, one per token and MoE layer):

    ============== ================ ======================================================
    request        int32 [R]        request (sequence) id, >= 0
    position       int32 [R]        token position within the request, >= 0
    layer          int16 [R]        decoder-layer index; one of ``layer_ids``
    phase          uint8 [R]        index into :data:`PHASES`
    expert_ids     int16 [R, k]     top-k routed experts, best first, distinct, in [0, E)
    gate_weights   float32 [R, k]   their gate weights: finite, >= 0, non-increasing
    scores         float32 [R, E]   optional: router scores (softmax/sigmoid) of all experts
    ============== ================ ======================================================

    Metadata: ``num_experts`` (E), ``top_k`` (k), ``layer_ids`` (the MoE layers every token is
    expected to have: a sorted list of distinct integers in 0..32767), ``model`` (preset name
    or None), ``weights_renormalised`` (True if every row's weights sum to 1 within
    :data:`NORM_TOL`; computed), ``source`` (a string) and ``notes`` (a list of strings). A
    (request, position, layer) appears at most once per phase, except in ``draft`` rows (a
    position may be drafted again after a rejection).

    Raises
    ------
    TraceError
        Naming the column and first offending row (a ragged column included), or the
        metadata field and entry: ``layer_ids`` not a list of integers (``0.7``, ``True``,
        ``"0"`` refused, not converted), ``notes`` not a list of strings (one string is not
        split into characters), ``model`` not a string or None, ``source`` not a string.
    """

    request: np.ndarray
    position: np.ndarray
    layer: np.ndarray
    phase: np.ndarray
    expert_ids: np.ndarray
    gate_weights: np.ndarray
    num_experts: int
    layer_ids: tuple
    scores: np.ndarray | None = None
    model: str | None = None
    source: str = ""
    notes: tuple = ()

    def __post_init__(self):
        def col(name, value, ndim):
            try:
                a = np.asarray(value)
            except (ValueError, TypeError):
                raise TraceError(f"{name}: expected a {ndim}-D array, got a ragged sequence "
                                 f"(rows of different lengths)") from None
            dt = np.dtype(_COLUMNS[name])
            if a.ndim != ndim:
                raise TraceError(f"{name}: expected {ndim} dimension(s), got shape {a.shape}")
            if dt.kind in "iu":
                if a.size and a.dtype.kind not in "iu":
                    raise TraceError(f"{name}: expected integers, got {a.dtype}")
                info = np.iinfo(dt)
                if a.size and (a.min() < info.min or a.max() > info.max):
                    raise TraceError(f"{name}: values outside {dt} range")
            elif a.size and a.dtype.kind not in "fiu":
                raise TraceError(f"{name}: expected numbers, got {a.dtype}")
            a = np.ascontiguousarray(a, dtype=dt)
            if isinstance(value, np.ndarray) and np.may_share_memory(a, value):
                a = a.copy()            # the caller's array stays theirs: requests() is cached
            a.setflags(write=False)
            object.__setattr__(self, name, a)
            return a

        n_exp = self.num_experts
        if not is_int(n_exp) or n_exp < 1:
            raise TraceError(f"num_experts: expected a positive integer, got {n_exp!r}")
        object.__setattr__(self, "num_experts", int(n_exp))
        req = col("request", self.request, 1)
        rows = len(req)
        for name in ("position", "layer", "phase"):
            if len(col(name, getattr(self, name), 1)) != rows:
                raise TraceError(f"{name}: {len(getattr(self, name))} rows, request has {rows}")
        ids = col("expert_ids", self.expert_ids, 2)
        w = col("gate_weights", self.gate_weights, 2)
        if ids.shape[0] != rows or w.shape != ids.shape:
            raise TraceError(f"expert_ids {ids.shape} / gate_weights {w.shape}: expected "
                             f"[{rows}, k] both")
        k = ids.shape[1]
        if not 1 <= k <= self.num_experts:
            raise TraceError(f"expert_ids: k = {k} must be in 1..num_experts "
                             f"({self.num_experts})")
        if self.scores is not None:
            s = col("scores", self.scores, 2)
            if s.shape != (rows, self.num_experts):
                raise TraceError(f"scores: expected [{rows}, {self.num_experts}], got {s.shape}")
            self._first_bad("scores", ~np.isfinite(s).all(axis=1), "NaN or Inf score")
            self._first_bad("scores", (s < 0).any(axis=1), "negative score")
        lids = _layer_ids_of(self.layer_ids)
        object.__setattr__(self, "layer_ids", lids)
        object.__setattr__(self, "notes", _notes_of(self.notes))
        if self.model is not None and not isinstance(self.model, str):
            raise TraceError(f"model: expected a preset name (a string) or None, got "
                             f"{self.model!r}")
        if not isinstance(self.source, str):
            raise TraceError(f"source: expected a string, got {self.source!r}")
        self._first_bad("request", req < 0, "negative request id")
        self._first_bad("position", self.position < 0, "negative position")
        self._first_bad("layer", ~np.isin(self.layer, lids),
                        f"layer not in layer_ids {list(lids)}")
        self._first_bad("phase", self.phase >= len(PHASES),
                        f"phase code outside 0..{len(PHASES) - 1}")
        self._first_bad("expert_ids", (ids < 0).any(axis=1),
                        "negative expert id (-1 is not an expert)")
        self._first_bad("expert_ids", (ids >= self.num_experts).any(axis=1),
                        f"expert id >= num_experts ({self.num_experts})")
        if k > 1:
            srt = np.sort(ids, axis=1)
            self._first_bad("expert_ids", (srt[:, 1:] == srt[:, :-1]).any(axis=1),
                            "repeated expert id")
        self._first_bad("gate_weights", ~np.isfinite(w).all(axis=1), "NaN or Inf gate weight")
        self._first_bad("gate_weights", (w < 0).any(axis=1),
                        "negative gate weight (raw logits used as weights?)")
        if k > 1:
            self._first_bad("gate_weights", (np.diff(w, axis=1) > 0).any(axis=1),
                            "weights not best first (must be non-increasing)")
        if rows:
            key = np.stack([req.astype(np.int64), self.position, self.layer, self.phase], 1)
            keep = self.phase != PHASES.index("draft")
            if keep.any():
                u, first, cnt = np.unique(key[keep], axis=0, return_index=True,
                                          return_counts=True)
                if (cnt > 1).any():
                    i = np.argmax(cnt > 1)
                    r, p, lay, ph = u[i]
                    raise TraceError(f"rows: (request {r}, position {p}, layer {lay}, phase "
                                     f"{PHASES[ph]}) appears {cnt[i]} times")

    def _first_bad(self, column, bad, what):
        bad = np.asarray(bad)
        if bad.any():
            row = int(np.argmax(bad))
            raise TraceError(f"{column}: row {row}: {what} ({int(bad.sum())} row(s) in all)")

    # -- shape ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.request)

    @property
    def top_k(self) -> int:
        return self.expert_ids.shape[1]

    @property
    def has_scores(self) -> bool:
        return self.scores is not None

    @property
    def weights_renormalised(self) -> bool:
        """True if every row's gate weights sum to 1 within :data:`NORM_TOL`."""
        if not len(self):
            return True
        return bool(np.all(np.abs(self.gate_weights.astype(np.float64).sum(1) - 1) <= NORM_TOL))

    def phase_mask(self, phase) -> np.ndarray:
        return self.phase == _phase_code(phase)

    def token_count(self, phase="decode") -> int:
        """Distinct (request, position) tokens in ``phase``."""
        m = self.phase_mask(phase)
        return len(np.unique(np.stack([self.request[m], self.position[m]], 1), axis=0))

    def missing_records(self, phase="decode") -> dict:
        """(token, layer) records absent in ``phase``: ``{layer: count}`` over the tokens that
        have at least one record (layers with none missing are left out)."""
        out = {}
        for rr in self.requests(phase):
            for j, lay in enumerate(rr.layer_ids):
                n = int((~rr.present[:, j]).sum())
                if n:
                    out[lay] = out.get(lay, 0) + n
        return out

    def select(self, mask) -> "RoutingTrace":
        """A new trace of the rows where ``mask`` (bool [R]) is true; metadata kept."""
        m = np.asarray(mask, bool)
        if m.shape != (len(self),):
            raise TraceError(f"mask: expected bool [{len(self)}], got shape {m.shape}")
        return RoutingTrace(
            request=self.request[m], position=self.position[m], layer=self.layer[m],
            phase=self.phase[m], expert_ids=self.expert_ids[m],
            gate_weights=self.gate_weights[m], num_experts=self.num_experts,
            layer_ids=self.layer_ids, scores=None if self.scores is None else self.scores[m],
            model=self.model, source=self.source, notes=self.notes)

    def requests(self, phase="decode") -> list:
        """Per-request dense routing of ``phase`` (:class:`RequestRouting`), requests in
        increasing id, tokens in increasing position. A token is any position with at least
        one record; its missing layers are marked in ``present``. Built once per phase (the
        records' arrays are read-only); each call returns a new list of them."""
        code = _phase_code(phase)
        if code == PHASES.index("draft"):
            raise TraceError("requests(): draft rows may repeat positions; select them first")
        # the trace and the records are read-only: built once per phase
        cache = self.__dict__.setdefault("_requests", {})
        if code not in cache:
            cache[code] = self._requests_of(code)
        return list(cache[code])

    def __getstate__(self) -> dict:
        # pickled without the requests() built from it
        return {k: v for k, v in self.__dict__.items() if k != "_requests"}

    def _requests_of(self, code) -> list:
        m = self.phase == code
        L, k, E = len(self.layer_ids), self.top_k, self.num_experts
        out = []
        req_all = self.request[m]
        rows_all = np.nonzero(m)[0]
        lids = np.array(self.layer_ids, np.int64)               # sorted (checked)
        for r in np.unique(req_all):
            sel = rows_all[req_all == r]
            pos = np.unique(self.position[sel])
            t_of = np.searchsorted(pos, self.position[sel])
            l_of = np.searchsorted(lids, self.layer[sel])            # layers in layer_ids
            ids = np.full((len(pos), L, k), E, np.int16)
            w = np.zeros((len(pos), L, k), np.float32)
            present = np.zeros((len(pos), L), bool)
            ids[t_of, l_of] = self.expert_ids[sel]
            w[t_of, l_of] = self.gate_weights[sel]
            present[t_of, l_of] = True
            sc = None
            if self.scores is not None:
                sc = np.full((len(pos), L, E), np.nan, np.float32)
                sc[t_of, l_of] = self.scores[sel]
            pos = pos.astype(np.int32)
            for a in (pos, ids, w, present) + ((sc,) if sc is not None else ()):
                a.setflags(write=False)
            out.append(RequestRouting(int(r), pos, self.layer_ids, ids, w, present, sc))
        return out

    # -- disk -----------------------------------------------------------------------------------
    def meta(self) -> dict:
        return {"format": TRACE_FORMAT, "version": TRACE_VERSION,
                "num_experts": self.num_experts, "top_k": self.top_k,
                "layer_ids": list(self.layer_ids), "model": self.model,
                "weights_renormalised": self.weights_renormalised,
                "source": self.source, "notes": list(self.notes)}

    def save(self, path) -> Path:
        """Write the trace as an ``.npz`` of its columns plus a JSON ``meta`` (uint8) column.
        The suffix ``.npz`` is added if missing. The file is written beside its destination
        and renamed into place when complete (:func:`elmoe3d.cli.outputs.atomic_outputs`), so
        a failed write leaves no partial file and an existing trace stays whole. Returns the
        path written.

        Raises
        ------
        UserError
            Naming the path: not a path, a directory, a missing or read-only folder, a
            path inside the shared traces folder, or a write that failed (disk full).
        """
        from ...cli.outputs import atomic_outputs, check_output
        if not file_path("path", path).name:
            raise UserError(f"path: expected a file name, got {path!r}")
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        check_output(path, "path")
        cols = {name: getattr(self, name) for name in _COLUMNS
                if getattr(self, name) is not None}
        meta = np.frombuffer(json.dumps(self.meta(), sort_keys=True).encode(), np.uint8)
        with atomic_outputs(lambda exc: f"path {path}: cannot write the trace ({exc})") as out:
            with open(out.temp_for(path), "wb") as f:
                np.savez_compressed(f, meta=meta, **cols)
        return path

    @classmethod
    def load(cls, path) -> "RoutingTrace":
        """Read a trace written by :meth:`save`.

        Raises
        ------
        TraceError
            Naming the file: a missing or corrupt file, a Git LFS pointer, another format or
            version, an unknown or missing column or metadata key, a metadata field of the
            wrong type (named ``meta.FIELD``: ``layer_ids`` not a list of integer layer
            indices, ``notes`` not a list of strings, ...), or any violation of the format.
        """
        path = file_path("path", path)
        if path.is_dir():
            raise TraceError(f"{path}: a directory, not a trace file")
        if not path.is_file():
            raise TraceError(f"{path}: no such trace file")
        with open(path, "rb") as f:
            head = f.read(64)
        if head.startswith(b"version https://git-lfs"):
            raise TraceError(f"{path}: a Git LFS pointer, not the trace (run git lfs pull)")
        expected = (f"expected an {TRACE_FORMAT} .npz (a zip of plain NumPy arrays "
                    f"{', '.join(c for c in _COLUMNS if c != 'scores')}, optional scores, "
                    f"and meta; docs/traces.md)")
        # a zip's first bytes (a local file header, or an empty archive's end record), as
        # np.load tests them: zipfile.is_zipfile also takes any file with an end record in
        # its last 64 KB (a .npy whose data holds those bytes), which np.load reads as .npy
        if not head.startswith((b"PK\x03\x04", b"PK\x05\x06")) or not zipfile.is_zipfile(path):
            raise TraceError(f"{path}: not a readable .npz trace: not a zip archive (another "
                             f"kind of file, or truncated); {expected}")
        arrays = {}
        try:
            with zipfile.ZipFile(path) as zf:       # each member's size before np.load
                for member in zf.namelist():
                    try:
                        npy_member_header(zf, member)
                    except ValueError as exc:
                        raise TraceError(f"{path}: not a readable .npz trace: array "
                                         f"{member.removesuffix('.npy')!r}: {exc}; "
                                         f"{expected}") from None
            with np.load(path, allow_pickle=False) as z:
                for name in z.files:
                    try:
                        arrays[name] = z[name]
                    except ValueError as exc:
                        if "pickle" not in str(exc):
                            raise
                        # never loaded: unpickling runs code from the file
                        raise TraceError(f"{path}: not a readable .npz trace: array {name!r} "
                                         f"holds pickled Python objects; {expected}") from None
        except TraceError:
            raise
        except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError,
                zlib.error) as exc:
            why = "corrupt" if "pickle" in str(exc) else f"corrupt ({exc})"
            raise TraceError(f"{path}: not a readable .npz trace: {why}; {expected}") from None
        if "meta" not in arrays:
            raise TraceError(f"{path}: no 'meta' column: not an {TRACE_FORMAT} file")
        try:
            meta = json.loads(arrays.pop("meta").astype(np.uint8).tobytes().decode())
        except (ValueError, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}: meta is not JSON ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != TRACE_FORMAT:
            raise TraceError(f"{path}: meta.format is not {TRACE_FORMAT!r}")
        if meta.get("version") != TRACE_VERSION:
            raise TraceError(f"{path}: format version {meta.get('version')!r} is not supported "
                             f"(this reader: {TRACE_VERSION})")
        unknown = sorted(set(meta) - _META_KEYS)
        missing = sorted(_META_KEYS - set(meta))
        if unknown or missing:
            raise TraceError(f"{path}: meta keys: unknown {unknown}, missing {missing}")
        unknown = sorted(set(arrays) - set(_COLUMNS))
        missing = sorted(set(_COLUMNS) - {"scores"} - set(arrays))
        if unknown or missing:
            raise TraceError(f"{path}: columns: unknown {unknown}, missing {missing}")
        try:
            # the metadata fields first, named as such (not as the constructor's arguments)
            check_int("meta.num_experts", meta["num_experts"], 1, error=TraceError)
            check_int("meta.top_k", meta["top_k"], 1, error=TraceError)
            lids = _layer_ids_of(meta["layer_ids"], "meta.layer_ids")
            notes = _notes_of(meta["notes"], "meta.notes")
            for key, want in (("model", (str, type(None))), ("source", str),
                              ("weights_renormalised", bool)):
                if not isinstance(meta[key], want):
                    what = {"model": "a preset name (a string) or null", "source": "a string",
                            "weights_renormalised": "true or false"}[key]
                    raise TraceError(f"meta.{key}: expected {what}, got {meta[key]!r}")
            tr = cls(request=arrays["request"], position=arrays["position"],
                     layer=arrays["layer"], phase=arrays["phase"],
                     expert_ids=arrays["expert_ids"], gate_weights=arrays["gate_weights"],
                     scores=arrays.get("scores"), num_experts=meta["num_experts"],
                     layer_ids=lids, model=meta["model"], source=meta["source"],
                     notes=notes)
        except TraceError as exc:
            raise TraceError(f"{path}: {exc}") from None
        if tr.top_k != meta["top_k"]:
            raise TraceError(f"{path}: meta.top_k {meta['top_k']} but expert_ids has "
                             f"{tr.top_k} columns")
        if meta["weights_renormalised"] != tr.weights_renormalised:
            raise TraceError(f"{path}: meta.weights_renormalised does not match the weights")
        return tr


# ---------------------------------------------------------------------------------------------
# JSONL importer
# ---------------------------------------------------------------------------------------------

_ALIASES = {
    "expert_ids": ("experts", "topk_ids", "expert_ids", "selected_experts"),
    "gate_weights": ("gating_probs", "topk_weights", "gate_weights", "weights",
                     "routing_weights"),
    "position": ("token_idx", "token_pos", "position"),
    "request": ("problem_id", "request_id", "req_id", "seq_id"),
    "layer": ("layer", "layer_id", "layer_idx"),
    "scores": ("router_scores", "scores"),
}
_OPTIONAL_ROW_KEYS = {"phase", "warmup", "padding", "dataset", "router_logits", "type"}
_META_ALIASES = {
    "model": "model", "model_id": "model", "model_name": "model",
    "num_experts": "num_experts", "n_experts": "num_experts",
    "top_k": "top_k", "topk": "top_k", "renormalized": "renormalised",
    "renormalised": "renormalised", "normalized": "renormalised",
    "warmup_tokens": "warmup_tokens", "dataset": "dataset", "num_layers": "num_layers",
    "layer_ids": "layer_ids", "layers_logged": "layers_logged", "phase": "phase",
    "source": "source",
}
#: ``type`` values that mark a routing record in logs that tag every line with a ``type``.
ROUTE_TYPES = ("route", "routing", "router")


@dataclass
class ImportReport:
    """What an import read, dropped, repaired or found missing. Nothing is dropped silently:
    every dropped or repaired row is counted here, and each problem is listed with its line.

    Attributes
    ----------
    path : Path
    lines : int
        Non-empty lines read (the meta line included).
    meta : dict
        The meta line's content (empty if the file has none).
    records : int
        Records read: every non-empty line but the meta line and lines of another record type
        (malformed lines included), so ``records = rows + dropped + malformed``.
    rows : int
        Rows kept in the trace.
    tokens, requests : int
    malformed : Counter
        Malformed lines skipped, by kind (only with ``on_error="warn"``; otherwise the first
        one raised). Kind ``"duplicate"``: a record repeated (the copy skipped, the first
        kept); ``"conflict"``: a record logged again with another routing in a log whose
        index does not restart at each forward pass (every line of it skipped: which routing
        is right cannot be told); ``"unplaceable"``: a request whose forward passes cannot be
        placed (all its rows).
    issues : list of (line, kind, message)
        Every malformed line and every warning that belongs to one line.
    other_records : Counter
        Lines of another ``type`` than a routing record (``{"type": "step", ...}``), skipped.
    dropped_warmup, dropped_padding : int
        Rows dropped as warm-up (in a detected warm-up block, ``"warmup": true``, or position
        below the warm-up tokens) or as padding.
    warmup_blocks : list of (first line, last line, rows, reason)
        The warm-up (profiling dummy pass) blocks detected and dropped
        (:func:`~elmoe3d.sw.host.routelog.warmup_blocks`).
    renormalised_rows : int
        Rows whose weights were renormalised over their top-k by the importer.
    unnormalised_rows : int
        Rows kept whose weights do not sum to 1 (within :data:`NORM_TOL`).
    router_mismatch : int
        Rows whose weights, as logged, disagree with the model's router about renormalisation
        (:func:`~elmoe3d.sw.host.routelog.router_norm_mismatch`; the message is in ``notes``).
    scores_disagree : int
        Rows with full router scores (``scores`` or ``router_logits``) whose expert ids are
        not the top-k of those scores (kept and noted, with the first line: a group-limited
        or biased router, DeepSeek-V3's, may route so; a log's ids and logits out of step
        would too, and Elastic-SD ranks experts by the scores).
    sorted_rows : int
        Rows whose (ids, weights) were reordered best first.
    phase_rows : Counter
        Rows kept per phase name.
    reconstructed : dict
        ``{request: description}`` of requests whose index restarts at each forward pass and
        whose positions and phases were rebuilt (:func:`~elmoe3d.sw.host.routelog.forward_passes`).
    request_names : dict
        ``{id as logged: request number}`` when the log names requests by string.
    layers_logged : tuple or None
        The meta line's ``layers_logged``.
    layers_absent : tuple
        Expected MoE layers with no record at all (not counted in ``missing_by_layer``).
    missing_by_layer : dict
        ``{layer: count}`` of (token, layer) records absent from the file, over the layers that
        have records.
    position_gaps : int
        Positions missing inside a request's range (whole tokens absent).
    unknown_fields : Counter
        Row fields the importer does not know (ignored, counted by name).
    notes : list of str
        File-level warnings (inferred sizes, unknown meta keys, router mismatch).
    """

    path: Path
    lines: int = 0
    meta: dict = field(default_factory=dict)
    records: int = 0
    rows: int = 0
    tokens: int = 0
    requests: int = 0
    malformed: Counter = field(default_factory=Counter)
    issues: list = field(default_factory=list)
    other_records: Counter = field(default_factory=Counter)
    dropped_warmup: int = 0
    dropped_padding: int = 0
    warmup_blocks: list = field(default_factory=list)
    renormalised_rows: int = 0
    unnormalised_rows: int = 0
    router_mismatch: int = 0
    scores_disagree: int = 0
    sorted_rows: int = 0
    phase_rows: Counter = field(default_factory=Counter)
    reconstructed: dict = field(default_factory=dict)
    request_names: dict = field(default_factory=dict)
    layers_logged: tuple | None = None
    layers_absent: tuple = ()
    missing_by_layer: dict = field(default_factory=dict)
    position_gaps: int = 0
    unknown_fields: Counter = field(default_factory=Counter)
    notes: list = field(default_factory=list)

    @property
    def missing_records(self) -> int:
        return sum(self.missing_by_layer.values())

    @property
    def duplicates(self) -> int:
        return self.malformed["duplicate"]

    @property
    def warning_count(self) -> int:
        """Everything that was not read as given: malformed lines, missing records, dropped
        and repaired rows, gaps, unknown fields and file-level notes."""
        return (sum(self.malformed.values()) + self.missing_records + self.dropped_warmup
                + self.dropped_padding + self.renormalised_rows + self.unnormalised_rows
                + self.scores_disagree + self.sorted_rows + self.position_gaps
                + sum(self.unknown_fields.values()) + len(self.notes))

    def counts(self) -> dict:
        """The import's counts by name: ``records`` read, ``kept``, ``warmup`` and ``padding``
        rows dropped, ``duplicates`` and other ``malformed`` records, rows per phase
        (``prefill``, ``decode``, ``draft``, ``verify``), ``missing`` (token, layer) records
        and ``layers_absent``."""
        out = {"records": self.records, "kept": self.rows, "warmup": self.dropped_warmup,
               "padding": self.dropped_padding, "duplicates": self.duplicates,
               "malformed": sum(self.malformed.values()) - self.duplicates}
        out.update({ph: self.phase_rows.get(ph, 0) for ph in PHASES})
        out["missing"] = self.missing_records
        out["layers_absent"] = len(self.layers_absent)
        return out

    def counts_line(self) -> str:
        """The counts as one line of text (what ``elmoe3d run`` prints for every import)."""
        c = self.counts()
        phases = ", ".join(f"{c[ph]} {ph}" for ph in PHASES if c[ph] or ph in ("prefill",
                                                                               "decode"))
        text = (f"{c['records']} records read, {c['kept']} kept ({phases}); dropped: "
                f"{c['warmup']} warm-up, {c['padding']} padding, {c['duplicates']} duplicate, "
                f"{c['malformed']} malformed; {c['missing']} (token, layer) records missing")
        if self.layers_absent:
            text += f"; {len(self.layers_absent)} layer(s) absent"
        if self.other_records:
            text += f"; {sum(self.other_records.values())} line(s) of other record types skipped"
        return text

    def summary(self) -> list:
        """One line of text per kind of event, each naming the file (and the first lines)."""
        p = self.path
        out = [f"{p}: {self.rows} rows, {self.tokens} tokens, {self.requests} requests "
               f"from {self.lines} lines", f"{p}: {self.counts_line()}"]

        def lines_of(kind):
            ls = [ln for ln, kd, _ in self.issues if kd == kind]
            more = f" (+{len(ls) - 5} more)" if len(ls) > 5 else ""
            return ", ".join(str(x) for x in ls[:5]) + more

        for kind, n in sorted(self.malformed.items()):
            what = ("duplicate line(s) (the first kept)" if kind == "duplicate" else
                    f"malformed line(s) [{kind}]")      # as counts_line counts them
            out.append(f"{p}: skipped {n} {what}: line {lines_of(kind)}")
        for first, last, rows, why in self.warmup_blocks:
            out.append(f"{p}: lines {first}-{last}: {rows} records dropped as a warm-up "
                       f"(profiling dummy) block: {why} (--keep-warmup keeps them)")
        for kind, n in sorted(self.other_records.items()):
            out.append(f"{p}: {n} record(s) of type {kind!r} skipped (not routing)")
        if self.missing_records:
            per = ", ".join(f"layer {k}: {v}" for k, v in sorted(self.missing_by_layer.items()))
            # the count is on the counts line already: this line says where they are
            out.append(f"{p}: the missing (token, layer) records by layer: {per}")
        if self.layers_absent:
            out.append(f"{p}: {len(self.layers_absent)} MoE layer(s) have no record at all: "
                       f"{_span_text(self.layers_absent)}")
        for req, what in self.reconstructed.items():
            out.append(f"{p}: request {req}: {what}")
        for name, n in (("dropped as warm-up", self.dropped_warmup),
                        ("dropped as padding", self.dropped_padding),
                        ("renormalised over their top-k", self.renormalised_rows),
                        ("kept with weights not summing to 1", self.unnormalised_rows),
                        ("reordered best first", self.sorted_rows),
                        ):
            if n:
                out.append(f"{p}: {n} row(s) {name}")
        if self.position_gaps:
            out.append(f"{p}: {self.position_gaps} position(s) absent inside requests (whole "
                       f"tokens with no record in any layer)")
        for name, n in sorted(self.unknown_fields.items()):
            out.append(f"{p}: unknown field {name!r} ignored on {n} line(s)")
        out.extend(f"{p}: {n}" for n in self.notes)
        return out


def _span_text(ids) -> str:
    """``1..31`` for a run, ``0, 4, 9`` otherwise (at most 8 listed)."""
    ids = sorted(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}"
    more = f" (+{len(ids) - 8} more)" if len(ids) > 8 else ""
    return ", ".join(str(x) for x in ids[:8]) + more


def _meta_of(obj):
    """The meta content of a line, or None: ``{"meta": {...}}`` or a flat
    ``{"type": "meta", ...}``."""
    if "meta" in obj:
        return obj["meta"] if len(obj) == 1 and isinstance(obj["meta"], dict) else False
    if obj.get("type") == "meta":
        return {k: v for k, v in obj.items() if k != "type"}
    return None


def import_vllm_jsonl(path, *, model=None, num_experts=None, top_k=None,
                      renormalise="keep", warmup_tokens=None, keep_warmup=False,
                      warmup_min_rows=WARMUP_MIN_ROWS, on_error="raise",
                      phase="decode") -> tuple:
    """Import a vLLM-style JSONL routing log (``docs/traces.md`` section 3).

    One JSON object a line, one line per (request, layer, token)::

        {"problem_id": 0, "layer": 0, "experts": [7, 0], "gating_probs": [0.8, 0.2],
         "token_idx": 0, "dataset": "gsm8k"}

    Dialects read:

    * field aliases (ids ``experts`` / ``topk_ids`` / ``expert_ids``; weights ``gating_probs`` /
      ``topk_weights`` / ``gate_weights`` / ``weights``; position ``token_idx`` / ``token_pos``
      / ``position``; request ``problem_id`` / ``request_id`` / ``req_id`` / ``seq_id``, an
      integer or a string id (numbered in order of first appearance); layer ``layer`` /
      ``layer_id`` / ``layer_idx``);
    * a first line ``{"meta": {...}}`` or a flat ``{"type": "meta", ...}``: ``model`` (or
      ``model_id``: a preset name or its Hugging Face repository), ``num_experts``, ``top_k``,
      ``renormalized``, ``warmup_tokens``, ``dataset``, ``num_layers``/``layer_ids``,
      ``layers_logged`` (the layers the logger hooked: a record of another layer is
      malformed, and the others are reported absent), ``phase``, ``source``;
    * lines tagged ``"type": "route"`` (or ``routing``/``router``); lines of any other type are
      skipped and counted by type;
    * an optional per-row ``phase``; full ``router_scores``/``scores`` (probabilities) or
      ``router_logits`` (scored through the model's router; needs ``model``);
    * warm-up: profiling dummy blocks detected and dropped
      (:func:`~elmoe3d.sw.host.routelog.warmup_blocks`: at least ``warmup_min_rows`` consecutive
      records with uniform weights or a layer's routing repeated exactly), ``"warmup": true``
      rows and positions below ``warmup_tokens``; padding rows (``"padding": true``);
    * an index that is the row inside a forward pass (restarting at each pass: prefill rows
      0..P-1, then every decode step at 0): positions and phases rebuilt per request
      (:func:`~elmoe3d.sw.host.routelog.forward_passes`), or the request refused with the reason.

    Repeated records. A (request, index, layer) logged twice with the same routing is a line
    logged twice (the copy is a ``duplicate``). Logged again with another routing, it is read
    as a log whose index restarts at each forward pass only when the index restarts (falls
    back to that layer's lowest index, the start of a pass, with another routing) in at least
    2 layers (1 if the request logs one layer) and in more than half of the layers logged
    from its first restart on (a pass routes every layer it logs, so such a log restarts in
    all of them; a record missing from a step may hide a restart in its layer, not in most;
    decode passes may log fewer layers than the prefill). Otherwise, as
    for one record of a real log written again with other experts, it is a conflicting
    duplicate (``conflict``): an error naming the lines of both records, or with
    ``on_error="warn"`` every line of that record skipped and counted (which routing is right
    cannot be told; the (token, layer) is then counted missing). With one layer logged, a
    conflicting record cannot be told from a restart.

    Layers. Without ``model`` or a meta ``layer_ids`` / ``num_layers``, the layers are taken as
    0..largest index logged, and a layer index >= :data:`MAX_LAYERS` (1024; no MoE model has
    near that many layers) is a malformed line (``bad-layer``), as is an expert id beyond the
    format's int16 ids or a position or request id beyond its int32 columns.

    Parameters
    ----------
    model : str or ModelPreset, optional
        Fixes ``num_experts``, ``top_k`` and the expected MoE layers (``moe_layer_ids``), is
        what ``renormalise="model"`` follows and what the weights' normalisation is checked
        against (a mismatch is counted in ``router_mismatch`` and noted). Must agree with the
        meta line and the arguments.
    num_experts, top_k : int, optional
        When neither these, ``model`` nor the meta line give them, they are inferred from the
        data (a counted note): ``num_experts`` = largest id + 1, ``top_k`` = the expert count
        of most lines that reach its check (refused when no count has a majority).
    renormalise : {"keep", "topk", "model"}
        ``"keep"``: weights as stored (rows not summing to 1 are counted,
        ``weights_renormalised`` is False). ``"topk"``: divide each row's weights by their sum.
        ``"model"``: renormalise only if the model renormalises (``norm_topk_prob``).
    warmup_tokens : int, optional
        Drop positions below this in every request (overrides the meta line's).
    keep_warmup : bool
        Keep every row that would be dropped as warm-up (detected blocks, ``"warmup": true``,
        ``warmup_tokens``) as real routing.
    warmup_min_rows : int
        Fewest consecutive alike records read as a warm-up block.
    on_error : {"raise", "warn"}
        A malformed line (bad JSON, nested too deeply included; missing or ambiguous field;
        wrong type; unknown expert id, -1 included; wrong k; ids and weights of different
        lengths; repeated id; negative, NaN or > 1 weight; layer not a MoE layer; repeated
        record; a record repeated with another routing; a request whose forward passes
        cannot be placed) raises :class:`TraceError` naming the file and line, or with
        ``"warn"`` is skipped and counted in the report with its line.
    phase : str
        Phase of rows that carry none and are not rebuilt (``"decode"`` for these logs).

    Missing (token, layer) records and whole-token position gaps are never errors: they are
    counted per layer in the report (the real logs miss 0-3 records a layer).

    Returns ``(RoutingTrace, ImportReport)``.

    Raises
    ------
    TraceError
        Naming the file: a missing file or a directory, an unreadable or Git LFS pointer
        file, a meta line field of the wrong type or range (``model``/``source`` not a
        string, ``layer_ids`` not a sorted list of integer layer indices, ``num_layers`` or
        ``layers_logged`` beyond :data:`MAX_LAYERS`), a log with no routing record left
        (empty, only meta or other record types, or every line dropped or skipped: the
        message carries the counts), and (``on_error="raise"``) a malformed line, named with
        its line (a conflicting duplicate with the lines of both records).
    UserError
        A bad argument.
    """
    path = file_path("path", path)
    if on_error not in ("raise", "warn"):
        raise UserError(f"on_error: expected 'raise' or 'warn', got {on_error!r}")
    if renormalise not in ("keep", "topk", "model"):
        raise UserError(f"renormalise: expected 'keep', 'topk' or 'model', got {renormalise!r}")
    if not is_int(warmup_min_rows, numpy=False) or warmup_min_rows < 2:
        raise UserError(f"warmup_min_rows: expected an integer >= 2, got {warmup_min_rows!r}")
    preset = model_preset(model) if model is not None else None
    if path.is_dir():
        raise TraceError(f"{path}: a directory, not a routing log")
    if not path.is_file():
        raise TraceError(f"{path}: no such routing log")
    rep = ImportReport(path=path)

    def bad(lineno, kind, msg, stray=True):
        if on_error == "raise":
            raise TraceError(f"{path}:{lineno}: {msg}", kind, stray)
        rep.malformed[kind] += 1
        rep.issues.append((lineno, kind, msg))

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc})") from None
    if raw[:2] == b"\x1f\x8b":               # gzip, by its magic bytes whatever the name
        import zlib
        if path.suffix.lower() != ".gz":
            rep.notes.append("gzip data in a file not named .gz: decompressed")
        parts, rest, ended = [], raw, True
        while rest:                            # every member (a logger appending with "ab")
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                parts.append(inflate.decompress(rest) + inflate.flush())
            except zlib.error as exc:
                raise TraceError(f"{path}: cannot read (corrupt gzip data: {exc})") from None
            ended, rest = inflate.eof, inflate.unused_data
            if not ended:
                break
        raw = b"".join(parts)
        if not ended:                          # a logger killed mid-write
            if on_error == "raise":
                raise TraceError(f"{path}: cannot read (the gzip data ends early: a truncated "
                                 f"file; --on-error warn reads the lines it holds)", None, True)
            # its lines up to the last whole one (a cut may split a character)
            raw = raw[:raw.rfind(b"\n") + 1]
            rep.notes.append("the gzip data ends early (a truncated file): its whole lines "
                             "read, the last one, cut short, left out")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: cannot read ({exc})") from None
    del raw
    if text.startswith("version https://git-lfs"):
        raise TraceError(f"{path}: a Git LFS pointer, not the routing log (run git lfs pull)")
    if path.suffix.lower() == ".json" or text.lstrip()[:1] == "[":
        what = describe_json(text, path)
        if what is not None:
            raise TraceError(f"{path}: {what}")

    # -- first pass: JSON, the meta line, record types --------------------------------------
    records = []
    meta = {}
    comments = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith(("#", "//")):
            comments += 1
            continue
        rep.lines += 1
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            rep.records += 1
            bad(lineno, "bad-json", f"not JSON ({exc.msg.removesuffix(' at')} at column "
                                    f"{exc.colno})")     # "Unterminated string starting at"
            continue
        except ValueError as exc:             # an integer of more than 4300 digits
            rep.records += 1
            bad(lineno, "bad-json", f"not readable JSON ({exc})")
            continue
        except RecursionError:
            rep.records += 1
            bad(lineno, "bad-json", "not readable JSON (arrays or objects nested too deeply)")
            continue
        if not isinstance(obj, dict):
            rep.records += 1
            bad(lineno, "not-object", f"expected a JSON object, got {type(obj).__name__}")
            continue
        m = _meta_of(obj)
        if m is not None and not records and not meta and not rep.records:
            if m is False:
                raise TraceError(f"{path}:{lineno}: meta line must be {{\"meta\": {{...}}}} or "
                                 f"a flat {{\"type\": \"meta\", ...}}")
            for key, value in m.items():
                if key in _META_ALIASES:
                    meta[_META_ALIASES[key]] = value
                else:
                    rep.notes.append(f"line {lineno}: unknown meta key {key!r} ignored")
            rep.meta = dict(m)
            continue
        if m is not None:
            rep.records += 1
            bad(lineno, "late-meta", "a meta line is only allowed as the first line")
            continue
        kind = obj.get("type", "route")
        if not isinstance(kind, str):
            rep.records += 1
            bad(lineno, "bad-type", f"type must be a string, got {kind!r}")
            continue
        if kind not in ROUTE_TYPES:
            rep.other_records[kind] += 1
            continue
        rep.records += 1
        records.append((lineno, obj))

    if comments:
        rep.notes.append(f"{comments} comment line(s) (# or //) skipped")

    # -- sizes: arguments, model, meta, must agree ------------------------------------------
    def agree(name, *sources):
        vals = [(src, v) for src, v in sources if v is not None]
        for src, v in vals:
            if not is_int(v, numpy=False) or v < 1:
                raise TraceError(f"{path}: {name} from {src}: expected a positive integer, "
                                 f"got {v!r}")
        if len({v for _, v in vals}) > 1:
            raise TraceError(f"{path}: {name} disagrees: " +
                             ", ".join(f"{src} says {v}" for src, v in vals))
        return vals[0][1] if vals else None

    meta_preset = None
    for key in ("model", "source"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise TraceError(f"{path}: meta {key}: expected a string, got {meta[key]!r}")
    if meta.get("model") is not None:
        meta_preset = preset_for_model_id(meta["model"])
        if meta_preset is None:
            rep.notes.append(f"meta model {meta['model']!r} is not a known preset")
        elif preset is not None and meta_preset.name != preset.name:
            raise TraceError(f"{path}: meta model {meta['model']!r} is not {preset.name} "
                             f"(it is {meta_preset.name}'s)")
        elif preset is None:
            preset = meta_preset
            rep.notes.append(f"model {preset.name} from the meta line ({meta['model']!r})")
    if renormalise == "model" and preset is None:
        raise UserError("renormalise='model' needs model= (or a meta line naming the model)")
    n_exp = agree("num_experts", ("argument", num_experts),
                  ("model", preset.routed_experts if preset else None),
                  ("meta line", meta.get("num_experts")))
    k = agree("top_k", ("argument", top_k), ("model", preset.top_k if preset else None),
              ("meta line", meta.get("top_k")))
    warm = warmup_tokens if warmup_tokens is not None else meta.get("warmup_tokens", 0)
    if not is_int(warm, numpy=False) or warm < 0:
        raise TraceError(f"{path}: warmup_tokens: expected an integer >= 0, got {warm!r}")
    if keep_warmup:
        warm = 0
    default_phase = meta.get("phase", phase)
    _phase_code(default_phase)
    layer_ids = None
    if preset is not None:
        layer_ids = tuple(preset.moe_layer_ids)
    if meta.get("layer_ids") is not None:
        try:
            lids = _layer_ids_of(meta["layer_ids"], "meta layer_ids")
        except TraceError as exc:
            raise TraceError(f"{path}: {exc}") from None
        if layer_ids is not None and lids != layer_ids:
            raise TraceError(f"{path}: meta layer_ids disagree with {preset.name}'s MoE layers")
        layer_ids = lids
    elif meta.get("num_layers") is not None:
        nl = check_int(f"{path}: meta num_layers", meta["num_layers"], 1, MAX_LAYERS,
                       error=TraceError)
        if layer_ids is not None and len(layer_ids) != nl:
            raise TraceError(f"{path}: meta num_layers {nl} but {preset.name} has "
                             f"{len(layer_ids)} MoE layers")
        layer_ids = layer_ids or tuple(range(nl))
    logged = meta.get("layers_logged")
    if logged is not None:
        if (not isinstance(logged, list) or not logged
                or not all(is_int(x, numpy=False) and 0 <= x < MAX_LAYERS for x in logged)):
            raise TraceError(f"{path}: meta layers_logged: expected a non-empty list of layer "
                             f"indices in 0..{MAX_LAYERS - 1}, got {logged!r}")
        if layer_ids is not None and not set(logged) <= set(layer_ids):
            raise TraceError(f"{path}: meta layers_logged {logged} names layers that are not "
                             f"MoE layers of {preset.name if preset else 'the log'}")
        rep.layers_logged = tuple(sorted(set(logged)))

    # -- second pass: each record on its own ------------------------------------------------
    known = {a for al in _ALIASES.values() for a in al} | _OPTIONAL_ROW_KEYS
    rows = []                      # (line, request as logged, position, layer, phase or None,
    #                                 ids, weights, scores)

    def has_scores(o):
        return any(key in o for key in ("router_scores", "scores", "router_logits"))

    # all rows carry full scores or none do: the first data row decides
    any_scores = bool(records) and has_scores(records[0][1])
    first_line = records[0][0] if records else 0

    def early_checks(obj):
        """A record's checks before the top-k one, in the order lines are judged: ``(vals,
        None)`` for a line that reaches the top-k check (``vals``: its columns in the order
        of ``_ALIASES``), ``(None, "warmup" | "padding")``
        for a dropped one, ``(None, (kind, message))`` for a malformed one."""
        vals, field = {}, {}             # field: the name the line gives a column by
        for col, aliases in _ALIASES.items():
            got = [a for a in aliases if a in obj]
            if len(got) > 1:
                return None, ("ambiguous-field", f"both {got[0]!r} and {got[1]!r} given")
            vals[col] = obj[got[0]] if got else None
            field[col] = got[0] if got else col
            if not got and col not in ("scores", "request"):
                return None, ("missing-field", f"no {col} field (expected one of "
                                               f"{', '.join(aliases)})")
        if obj.get("warmup") is True and not keep_warmup:
            return None, "warmup"
        if obj.get("padding") is True:
            return None, "padding"
        for col in ("position", "layer"):
            if not is_int(vals[col], numpy=False) or vals[col] < 0:
                return None, ("bad-type", f"{field[col]} must be an integer >= 0, got "
                                          f"{vals[col]!r}")
        if vals["position"] > _POSITION_MAX:
            return None, ("bad-type", f"{field['position']} {vals['position']} is beyond "
                                      f"the trace format's positions (0..{_POSITION_MAX})")
        if layer_ids is None and vals["layer"] >= MAX_LAYERS:
            # the layers are then taken as 0..largest index: one stray index must not imply
            # millions of absent layers (or exhaust the memory)
            return None, ("bad-layer", f"layer {vals['layer']} is beyond any MoE model's "
                                       f"layers (0..{MAX_LAYERS - 1} read without model= or "
                                       f"the meta line's layer_ids / num_layers)")
        req = vals["request"]
        if req is not None and not (is_int(req, numpy=False) and 0 <= req <= _REQUEST_MAX) \
                and not (isinstance(req, str) and req.strip()):
            return None, ("bad-type", f"{field['request']} must be an integer in "
                                      f"0..{_REQUEST_MAX} or a string id, got {req!r}")
        ph = obj.get("phase")
        if ph is not None and ph not in PHASES:
            return None, ("bad-phase", f"phase must be one of {', '.join(PHASES)}, got {ph!r}")
        ids, w = vals["expert_ids"], vals["gate_weights"]
        if not isinstance(ids, list) or not all(is_int(x, numpy=False) for x in ids) or not ids:
            return None, ("bad-type", f"expert ids must be a non-empty list of integers, "
                                      f"got {ids!r}")
        if not isinstance(w, list) or not all(isinstance(x, (int, float)) and
                                              not isinstance(x, bool) for x in w):
            return None, ("bad-type", f"gate weights must be a list of numbers, got {w!r}")
        if len(ids) != len(w):
            return None, ("length-mismatch", f"{len(ids)} expert ids but {len(w)} weights")
        # a tuple in _ALIASES' order: the lines' checks are all held for the top-k vote, and a
        # dict each took 175 MB more than a tuple on a 500k-line log
        return tuple(vals.values()), None

    outcomes = [early_checks(obj) for _, obj in records]        # (vals, problem) a record
    # the top-k most lines log, counted over the lines that reach the top-k check: where
    # top_k is not given it is theirs (not the first line's, which may be the stray one), and
    # a line of another count is stray (skipping it is a remedy) only where most lines have
    # the top-k it is checked against
    at_ids = tuple(_ALIASES).index("expert_ids")
    lengths = Counter(len(vals[at_ids]) for vals, _ in outcomes if vals is not None)
    voters = sum(lengths.values())
    if k is None and lengths:
        k, most = lengths.most_common(1)[0]
        if 2 * most <= voters:
            if on_error == "raise":             # the file's first mistake, not the vote's
                for (lineno, _), (_, problem) in zip(records, outcomes):
                    if problem not in (None, "warmup", "padding"):
                        bad(lineno, *problem)
            counts = ", ".join(f"{n} line(s) of {c}" for c, n in sorted(lengths.items()))
            left = len(outcomes) - voters
            raise TraceError(f"{path}: top_k not given and no expert count is most lines' "
                             f"({counts}"
                             + (f"; {left} malformed, warm-up or padding line(s) not counted"
                                if left else "")
                             + "); give the model (model=, --model) or top_k")
        rep.notes.append(f"top_k not given: {k}, the expert count of {most} of {voters} lines")
    most_k = k is not None and 2 * lengths.get(k, 0) > voters
    for (lineno, obj), (vals, problem) in zip(records, outcomes):
        for key in obj:
            if key not in known:
                rep.unknown_fields[key] += 1
        if problem == "warmup":
            rep.dropped_warmup += 1
            continue
        if problem == "padding":
            rep.dropped_padding += 1
            continue
        if problem:
            bad(lineno, *problem)
            continue
        vals = dict(zip(_ALIASES, vals))
        req, ph = vals["request"], obj.get("phase")
        ids, w = vals["expert_ids"], vals["gate_weights"]
        if len(ids) != k:
            fits = [n for n, m in MODEL_PRESETS.items() if m.top_k == len(ids)]
            bad(lineno, "wrong-k", f"{len(ids)} expert{'s' * (len(ids) != 1)}, expected top_k = {k}" + (
                f" (the presets with top_k = {len(ids)}: {', '.join(fits)})"
                if preset is not None and fits else ""), stray=most_k)
            continue
        if min(ids) < 0:
            bad(lineno, "unknown-expert", f"expert id {min(ids)} is not an expert "
                                          f"(ids are 0..num_experts-1; -1 is padding, not "
                                          f"the last expert)")
            continue
        if n_exp is not None and max(ids) >= n_exp:
            bad(lineno, "unknown-expert", f"expert id {max(ids)} >= num_experts ({n_exp})")
            continue
        if max(ids) > _EXPERT_MAX:
            bad(lineno, "unknown-expert", f"expert id {max(ids)} is beyond any model's experts "
                                          f"(the trace format's ids are 0..{_EXPERT_MAX})")
            continue
        if len(set(ids)) != len(ids):
            bad(lineno, "repeated-expert", f"expert ids repeat: {ids}")
            continue
        wa = np.asarray(w, np.float64)
        if not np.isfinite(wa).all():
            bad(lineno, "bad-weight", f"NaN or Inf gate weight: {w}")
            continue
        if (wa < 0).any():
            bad(lineno, "negative-weight", f"negative gate weight {wa.min()} (raw router "
                                           f"logits used as weights?)")
            continue
        if (wa > 1 + NORM_TOL).any():
            bad(lineno, "bad-weight", f"gate weight {wa.max()} > 1: not a probability (raw "
                                      f"logits, or a routed scaling factor applied?)")
            continue
        if layer_ids is not None and vals["layer"] not in layer_ids:
            lay = vals["layer"]
            why = ("; layers numbered from 1? The index is the decoder layer's, from 0"
                   if lay == layer_ids[-1] + 1 else
                   "; a dense layer, or MoE layers numbered from 0? The index is the decoder "
                   "layer's" if lay < layer_ids[0] else "")
            bad(lineno, "bad-layer", f"layer {lay} is not a MoE layer (expected one of "
                                     f"{_span_text(layer_ids)}){why}")
            continue
        if rep.layers_logged is not None and vals["layer"] not in rep.layers_logged:
            bad(lineno, "bad-layer", f"layer {vals['layer']} is not in the meta line's "
                                     f"layers_logged {list(rep.layers_logged)}")
            continue
        sc = None
        if vals["scores"] is not None and "router_logits" in obj:
            bad(lineno, "ambiguous-field", "both scores and router_logits given")
            continue
        try:
            if vals["scores"] is not None:
                sc = np.asarray(vals["scores"], np.float64)
                if sc.ndim != 1 or (n_exp is not None and len(sc) != n_exp):
                    raise ValueError(f"scores must list all {n_exp} experts")
                if not np.isfinite(sc).all() or (sc < 0).any():
                    raise ValueError("scores must be finite and >= 0")
            elif "router_logits" in obj:
                if preset is None:
                    raise ValueError("router_logits need model= to be scored")
                sc = preset.scores(np.asarray(obj["router_logits"], np.float64)[None])[0]
        except (ValueError, TypeError) as exc:
            bad(lineno, "bad-scores", str(exc))
            continue
        if any_scores != (sc is not None):
            bad(lineno, "bad-scores", f"full scores {'missing' if any_scores else 'given'} "
                                      f"here but {'given' if any_scores else 'not'} on the "
                                      f"first row (line {first_line}): all rows or none")
            continue
        rows.append((lineno, req, vals["position"], vals["layer"], ph, np.asarray(ids), wa,
                     sc))

    # -- warm-up blocks (profiling dummy passes) --------------------------------------------
    if not keep_warmup and rows:
        blocks = warmup_blocks([r[3] for r in rows], [r[5] for r in rows],
                               [r[6] for r in rows], min_rows=warmup_min_rows,
                               keys=[(type(r[1]).__name__, r[1], r[2], r[4]) for r in rows])
        drop = np.zeros(len(rows), bool)
        for b in blocks:
            drop[b.start:b.stop] = True
            rep.warmup_blocks.append((rows[b.start][0], rows[b.stop - 1][0], b.rows,
                                      b.reason()))
            rep.dropped_warmup += b.rows
        rows = [r for r, d in zip(rows, drop) if not d]

    # -- requests: integers as logged, or string ids numbered in order of appearance --------
    named = [r for r in rows if r[1] is None]
    for r in named:
        bad(r[0], "missing-field", f"no request id (the field is absent or null; expected "
                                   f"an integer or a string id in one of "
                                   f"{', '.join(_ALIASES['request'])})")
    rows = [r for r in rows if r[1] is not None]
    if any(isinstance(r[1], str) for r in rows):
        names = {}
        for r in rows:
            names.setdefault((type(r[1]).__name__, r[1]), len(names))
        rep.request_names = {v: i for (_, v), i in names.items()}
        rows = [(r[0], names[(type(r[1]).__name__, r[1])]) + r[2:] for r in rows]
        shown = ", ".join(f"{n!r} -> {i}" for n, i in list(rep.request_names.items())[:4])
        rep.notes.append(f"request ids are strings: numbered in order of first appearance "
                         f"({shown}{', ...' if len(names) > 4 else ''})")
        ints = {v for kind, v in names if kind != "str"}
        clash = sorted(v for v in ints if ("str", str(v)) in names)
        if ints:
            rep.notes.append(f"request ids mix integers and strings ({len(ints)} integer "
                             f"id(s)): each kind its own requests"
                             + (f", so {clash[0]} and '{clash[0]}' are two" if clash else ""))

    # -- positions: as logged, or rebuilt where the index restarts at each forward pass -----
    placed = []
    unmarked = []           # (request, rows, first and last position) of a prefill read as decode
    by_req = {}
    for r in rows:
        by_req.setdefault(r[1], []).append(r)
    for req, rr in by_req.items():
        # the index restarts at each forward pass when it falls back to a pass start with
        # another routing in most of the layers logged from there on (_restart_layers); a
        # repeat with the same routing is then a step like any other (two decode steps may
        # route alike), and otherwise a duplicated line. Any other repeat with another
        # routing is a conflicting record: refused, or (warn) every line of it skipped
        first, conflicts = {}, []
        for r in rr:
            if r[4] == "draft":
                continue
            prev = first.setdefault((r[2], r[3], r[4]), r)
            if prev is not r and not _same_routing(prev, r):
                conflicts.append((prev, r))
        if conflicts:
            restarting, layers, logged = _restart_layers(rr)
            if 2 * restarting <= layers or restarting < min(2, logged):
                name = _request_name(rep, req)
                why = ("the index never falls back to the start of a forward pass, as it "
                       "would in every layer of a log whose index restarts at each pass"
                       if not restarting else
                       f"the index falls back to the start of a forward pass in {restarting} "
                       f"of the {layers} layer(s) logged from there on; a log whose index "
                       f"restarts at each pass does so in most of them (and in at least 2)")

                def record(r):
                    return (f"record (request {name}, position {r[2]}, layer {r[3]}, "
                            f"{r[4] or default_phase})")

                if on_error == "raise":
                    prev, r = conflicts[0]
                    bad(r[0], "conflict", f"{record(r)} already on line {prev[0]} with another "
                                          f"routing ({_routing_text(prev)} there, "
                                          f"{_routing_text(r)} here): {why}")
                keys = {(r[2], r[3], r[4]) for _, r in conflicts}
                lines = {}
                for r in rr:
                    if r[4] != "draft" and (r[2], r[3], r[4]) in keys:
                        lines.setdefault((r[2], r[3], r[4]), []).append(r[0])
                for r in rr:
                    if r[4] != "draft" and (r[2], r[3], r[4]) in keys:
                        others = ", ".join(str(x) for x in lines[(r[2], r[3], r[4])]
                                           if x != r[0])
                        bad(r[0], "conflict", f"{record(r)} also on line(s) {others} with "
                                              f"another routing: none of them kept ({why})")
                rr = [r for r in rr if r[4] == "draft" or (r[2], r[3], r[4]) not in keys]
                conflicts = []
        if not conflicts:
            placed.extend((r, r[2], r[4] or default_phase) for r in rr)
            if meta.get("phase") is None and default_phase == "decode" and \
                    (first := _unmarked_prefill(rr)) is not None:
                unmarked.append((req, *first))
            continue
        if not layer_by_layer([r[3] for r in rr]):
            # pass by pass, a genuine step of a layer has the other layers' records between
            # it and that layer's previous one: a record right after its twin is a line
            # logged twice
            kept = [rr[0]]
            for r in rr[1:]:
                p = kept[-1]
                if (p[3] == r[3] and p[2] == r[2] and p[4] == r[4]
                        and np.array_equal(p[5], r[5]) and np.array_equal(p[6], r[6])):
                    bad(r[0], "duplicate", f"record (request {_request_name(rep, req)}, layer "
                                           f"{r[3]}, index {r[2]}) already on line {p[0]} "
                                           f"(the line before, the same routing)")
                    continue
                kept.append(r)
            rr = kept

        def passes(rows):
            return forward_passes([r[3] for r in rows], [r[2] for r in rows],
                                  [r[4] for r in rows])

        try:
            try:
                lay = passes(rr)
            except DialectError:
                # a line logged twice (same index and routing as its layer's previous record)
                # adds a pass to its layer only: without such lines in the layers that restart
                # more often than most, do the passes match?
                restarts, last = Counter(), {}
                for r in rr:
                    if r[3] in last and r[2] <= last[r[3]][2]:
                        restarts[r[3]] += 1
                    last[r[3]] = r
                usual = Counter(restarts[lay] for lay in last).most_common(1)[0][0]
                excess = {lay: restarts[lay] - usual for lay in last if restarts[lay] > usual}
                last, kept, dups = {}, [], []
                for r in rr:
                    prev = last.get(r[3])
                    if (excess.get(r[3], 0) > 0 and prev is not None and prev[2] == r[2]
                            and np.array_equal(prev[5], r[5]) and np.array_equal(prev[6], r[6])):
                        dups.append((r, prev))
                        excess[r[3]] -= 1
                        continue
                    last[r[3]] = r
                    kept.append(r)
                if not dups:
                    raise
                lay = passes(kept)
                for r, prev in dups:
                    bad(r[0], "duplicate", f"record (request {_request_name(rep, req)}, layer "
                                           f"{r[3]}, index {r[2]}) repeats line {prev[0]} "
                                           f"(already on line {prev[0]}, the same routing)")
                rr = kept
        except DialectError as exc:
            name = _request_name(rep, req)
            msg = (f"request {name}: the token index repeats (it restarts at each forward "
                   f"pass?) but {exc}")
            if on_error == "raise":
                raise TraceError(f"{path}:{rr[exc.index][0]}: {msg}") from None
            rep.malformed["unplaceable"] += len(rr)
            rep.issues.append((rr[exc.index][0], "unplaceable", msg + f" ({len(rr)} rows "
                                                                     f"skipped)"))
            continue
        rep.reconstructed[_request_name(rep, req)] = (
            f"token index restarts at each forward pass (first at line "
            f"{rr[lay.first_restart][0]}): positions rebuilt from {lay.passes('prefill')} "
            f"prefill pass(es) of {lay.tokens('prefill')} token(s) and "
            f"{lay.passes('decode')} decode step(s)")
        placed.extend((r, p, ph) for r, p, ph in zip(rr, lay.position, lay.phase))
    if unmarked:
        req, n, lo, hi = unmarked[0]
        rep.notes.append(
            f"{len(unmarked)} request(s) start with a forward pass of several positions a "
            f"layer, then one a pass (request {_request_name(rep, req)}: positions {lo}..{hi}, "
            f"{n} rows): a prefill the log marks no phase of, read as decode steps; give those "
            f"rows \"phase\": \"prefill\" to read them as prefill")

    # -- warm-up positions, repeated records ------------------------------------------------
    cols = {c: [] for c in ("request", "position", "layer", "phase", "ids", "w", "scores",
                            "line")}
    seen = {}
    for r, pos, ph in placed:
        if pos < warm:
            rep.dropped_warmup += 1
            continue
        key = (r[1], pos, r[3], ph)
        if ph != "draft" and key in seen:
            bad(r[0], "duplicate", f"record (request {_request_name(rep, r[1])}, position "
                                   f"{pos}, layer {r[3]}, {ph}) already on line {seen[key]}")
            continue
        seen[key] = r[0]
        order = np.argsort(-r[6], kind="stable")
        if (order != np.arange(len(order))).any():
            rep.sorted_rows += 1
            rep.issues.append((r[0], "reordered", "ids reordered best first"))
        cols["request"].append(r[1])
        cols["position"].append(pos)
        cols["layer"].append(r[3])
        cols["phase"].append(PHASES.index(ph))
        cols["ids"].append(r[5][order])
        cols["w"].append(r[6][order])
        cols["scores"].append(r[7])
        cols["line"].append(r[0])

    nrows = len(cols["request"])
    if not nrows:
        rep.rows = 0
        raise TraceError(f"{path}: no routing records ({rep.counts_line()})")
    if k is None:
        k = 1
    ids = np.asarray(cols["ids"], np.int64).reshape(nrows, k)
    w = np.asarray(cols["w"], np.float64).reshape(nrows, k)
    if n_exp is None:
        n_exp = int(ids.max()) + 1 if nrows else 1
        rep.notes.append(f"num_experts not given: {n_exp} inferred from the largest id "
                         f"(pass model= or num_experts= to check ids)")
    scores = None
    if any_scores and nrows:
        lens = {len(s) for s in cols["scores"]}
        if lens != {n_exp}:
            raise TraceError(f"{path}: scores have {sorted(lens)} entries, expected {n_exp}")
        scores = np.stack(cols["scores"])
        if k < n_exp:
            # the kept rows' experts should score at least as high as every other (ties
            # allowed): else counted and noted (a grouped or biased router routes so)
            chosen = np.zeros(scores.shape, bool)
            np.put_along_axis(chosen, ids, True, axis=1)
            low = np.where(chosen, scores, np.inf).min(axis=1)
            high = np.where(chosen, -np.inf, scores).max(axis=1)
            disagree = low < high
            rep.scores_disagree = int(disagree.sum())
            if rep.scores_disagree:
                i = int(np.argmax(disagree))
                top = np.argsort(-scores[i], kind="stable")[:k].tolist()
                rep.notes.append(f"line {cols['line'][i]}: expert ids {ids[i].tolist()} are "
                                 f"not the top-{k} of the line's router scores ({top}); "
                                 f"{rep.scores_disagree} such row(s) in all (scores_disagree: "
                                 f"a grouped or biased router routes so; ids and scores out "
                                 f"of step would too, and Elastic-SD ranks experts by the "
                                 f"scores)")
    sums = w.sum(axis=1)
    off = np.abs(sums - 1) > NORM_TOL
    do_norm = renormalise == "topk" or (renormalise == "model" and preset.norm_topk_prob)
    if preset is not None:
        rep.router_mismatch, msg = router_norm_mismatch(sums, preset, NORM_TOL)
        if msg:             # of the weights as logged: say so where the import changed them
            rep.notes.append(msg + (f"; as logged: this import renormalised the "
                                    f"{int(off.sum())} row(s) not summing to 1 over their top-k"
                                    if do_norm and off.any() else ""))
    if renormalise == "topk" and preset is not None and not preset.norm_topk_prob and off.any():
        rep.notes.append(f"renormalised over the top-k as asked, though {preset.name}'s router "
                         f"does not renormalise (norm_topk_prob false): its gate weights sum "
                         f"below 1, and these now differ from them (renormalise='model' "
                         f"keeps them)")
    if do_norm:
        zero = sums <= 0
        if zero.any():
            ln = cols["line"][int(np.argmax(zero))]
            raise TraceError(f"{path}:{ln}: all gate weights zero: cannot renormalise")
        rep.renormalised_rows = int(off.sum())
        w = w / sums[:, None]
    else:
        rep.unnormalised_rows = int(off.sum())
    if layer_ids is None:
        top = max(cols["layer"] + list(rep.layers_logged or ()), default=0)
        layer_ids = tuple(range(int(top) + 1))
        if nrows:
            rep.notes.append(f"layers not given: {len(layer_ids)} layers 0..{layer_ids[-1]} "
                             f"assumed from the data (pass model= to check them)")
    notes = [f"imported from {path.name}"]
    if do_norm:
        notes.append(f"gate weights renormalised over the top-{k} ({renormalise})")
    if rep.reconstructed:
        notes.append(f"positions rebuilt from forward passes for {len(rep.reconstructed)} "
                     f"request(s)")
    if rep.request_names:
        notes.append("request ids numbered from string ids: " + ", ".join(
            f"{n!r}={i}" for n, i in list(rep.request_names.items())[:16]))
    model_name = preset.name if preset else (meta_preset.name if meta_preset else
                                             meta.get("model"))
    try:
        trace = RoutingTrace(
            request=np.asarray(cols["request"], np.int64),
            position=np.asarray(cols["position"], np.int64),
            layer=np.asarray(cols["layer"], np.int64), phase=np.asarray(cols["phase"], np.int64),
            expert_ids=ids, gate_weights=w, scores=scores, num_experts=n_exp,
            layer_ids=layer_ids, model=model_name,
            source=meta["source"] if meta.get("source") is not None else path.name,
            notes=notes)
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from None
    rep.rows = nrows
    present_layers = set(int(x) for x in np.unique(trace.layer))
    rep.layers_absent = tuple(l for l in layer_ids if l not in present_layers) if nrows else ()
    for ph in PHASES:
        n_ph = int((trace.phase == PHASES.index(ph)).sum())
        if n_ph:
            rep.phase_rows[ph] = n_ph
        if not n_ph or ph == "draft":
            continue
        rep.tokens += trace.token_count(ph)
        for lay, n in trace.missing_records(ph).items():
            if lay in present_layers:
                rep.missing_by_layer[lay] = rep.missing_by_layer.get(lay, 0) + n
        for rr in trace.requests(ph):
            span = int(rr.positions[-1]) - int(rr.positions[0]) + 1
            rep.position_gaps += span - rr.tokens
    rep.requests = len(np.unique(trace.request)) if nrows else 0
    return trace, rep


def _same_routing(a, b) -> bool:
    """Whether two parsed rows route alike (the same ids and weights, in order)."""
    return np.array_equal(a[5], b[5]) and np.array_equal(a[6], b[6])


def _routing_text(r) -> str:
    """A parsed row's routing as ``experts [7, 0], weights [0.8, 0.2]``."""
    return (f"experts {r[5].tolist()}, weights "
            f"[{', '.join(f'{x:.4g}' for x in r[6].tolist())}]")


def _unmarked_prefill(rows):
    """``(rows, first position, last position)`` of a request's first forward pass when it logs
    several positions a layer (``layer 0: positions 0..5, layer 1: 0..5, ...``) and is followed
    by passes of one position a layer (decode steps: at least as many one-position runs as
    the first pass has layers), the rows giving no phase: a prefill pass a log without phases
    reads as decode steps. None otherwise: a log sorted by layer (its one-position runs are
    at most a few missing records), a repeated line (one position twice)."""
    rows = [r for r in rows if r[4] is None]
    runs, start = [], 0                         # runs of consecutive rows of one layer
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][3] != rows[start][3]:
            runs.append({r[2] for r in rows[start:i]})
            start = i
    lead = 0
    while lead < len(runs) and len(runs[lead]) > 1 and runs[lead] == runs[0]:
        lead += 1
    if lead < 2 or sum(len(r) == 1 for r in runs[lead:]) < lead:
        return None
    return sum(len(r) for r in runs[:lead]), min(runs[0]), max(runs[0])


def _restart_layers(rows) -> tuple:
    """``(restarting, layers, logged)`` of one request's parsed rows (file order, draft rows
    left out). ``restarting``: how many of its layers have a record whose index falls back to
    that layer's lowest index (the start of a forward pass) with another routing than the
    record it repeats; ``layers``: how many layers have a record from the first such fall-back
    on (the layers the later passes log, which may be fewer than the prefill's); ``logged``:
    how many layers the request has at all. A log whose index restarts at each forward pass
    restarts in every layer its passes log; a record logged again with another routing falls
    back in its own layer only, and mostly not to a pass start."""
    rows = [r for r in rows if r[4] != "draft"]
    lowest = {}
    for r in rows:
        lowest[r[3]] = min(r[2], lowest.get(r[3], r[2]))
    last, first, restarting, after = {}, {}, set(), None
    for r in rows:
        prev = last.get(r[3])
        twin = first.setdefault((r[2], r[3]), r)
        if prev is not None and r[2] == lowest[r[3]] and r[2] <= prev[2] \
                and not _same_routing(twin, r):
            restarting.add(r[3])
            if after is None:
                after = set()
        if after is not None:
            after.add(r[3])
        last[r[3]] = r
    return len(restarting), len(after or ()), len(last)


def file_path(name, path) -> Path:
    """``path`` (a ``str`` or ``os.PathLike``) as a :class:`Path`; :class:`UserError` naming
    ``name`` otherwise (``"path: expected a file name, got 5"``)."""
    if not isinstance(path, (str, os.PathLike)):
        raise UserError(f"{name}: expected a file name, got {path!r}")
    return Path(path)


def _request_name(rep, req) -> str:
    """A request as the log names it (its string id when it had one)."""
    for name, i in rep.request_names.items():
        if i == req:
            return repr(name) if isinstance(name, str) else str(name)
    return str(req)


def describe_json(text, path="FILE") -> str | None:
    """What a JSON document (not JSON lines) offered as a routing log is, and what to do with it;
    None if it is not one document, or is a single routing record (a one-line log). Expert-usage
    statistics (per-layer selection counts) are named as such
    (:func:`~elmoe3d.sw.host.routelog.usage_counts`)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):     # the line-by-line reading names the line
        return None
    if isinstance(doc, dict) and any(a in doc for a in _ALIASES["expert_ids"]):
        return None
    try:
        layers = usage_counts(doc)
    except UserError:
        layers = None
    if layers:
        e = {len(c) for c in layers.values()}
        return (f"expert-usage statistics (selection counts of {len(layers)} layer(s) x "
                f"{'/'.join(str(x) for x in sorted(e))} experts), not a routing log: it holds "
                f"no per-token routing. Use it to calibrate the synthetic generator: "
                f"elmoe3d run --trace synthetic:{path} --model PRESET "
                f"(elmoe3d.sw.host.tracegen.calibrate_from_usage)")
    kind = type(doc).__name__
    return (f"one JSON {'object' if kind == 'dict' else kind} spanning the file, not a "
            f"routing log: a routing log has one JSON object a line (docs/traces.md, "
            f"section 3)")


# ---------------------------------------------------------------------------------------------
# Router logits -> trace; Hugging Face capture
# ---------------------------------------------------------------------------------------------

def trace_from_router_logits(logits, model, *, request=None, position=None, phase="prefill",
                             layer_ids=None, source="router logits", notes=()) -> RoutingTrace:
    """Route per-layer router logits exactly as ``model`` does and keep the full scores.

    Parameters
    ----------
    logits : sequence of array [T, E]
        One array per MoE layer (as ``outputs.router_logits`` of a Hugging Face MoE model with
        ``output_router_logits=True``, flattened over batch and sequence), float.
    model : str or ModelPreset
        Gives E, k, scoring (softmax/sigmoid), ``norm_topk_prob`` and the scaling factor.
        Gate weights are stored *without* the routed scaling factor (so they stay
        probabilities); the preset re-applies it.
    request, position : array [T], optional
        Request id and position of each of the T tokens (default: one request, 0..T-1); a
        single ``request`` is every token's.
    layer_ids : sequence of int, optional
        Decoder-layer index of each array (default: the preset's ``moe_layer_ids``).
    source, notes : str, sequence of str
        Provenance kept in the trace's metadata.

    Raises
    ------
    TraceError
        ``logits`` not a sequence of arrays, empty (no layer), ragged or not numbers, or of
        the wrong shape; ``layer_ids`` not a sorted list of distinct integer layer indices,
        or not one per array; ``request``/``position`` of the wrong shape or values;
        ``notes`` not a list of strings; NaN or Inf logits.
    UserError
        An unknown ``model``.
    """
    preset = model_preset(model)
    if isinstance(logits, (str, bytes, dict)) or not hasattr(logits, "__iter__"):
        raise TraceError(f"logits: expected a sequence of [T, E] arrays (one per MoE layer), "
                         f"got {type(logits).__name__}")
    layers = list(logits)
    if not layers:
        raise TraceError("logits: no layer given (expected one [T, E] array per MoE layer)")
    lids = _layer_ids_of(layer_ids) if layer_ids is not None else tuple(preset.moe_layer_ids)
    if len(layers) != len(lids):
        raise TraceError(f"logits: {len(layers)} layers given, {len(lids)} layer ids "
                         f"({preset.name} has {preset.moe_layers} MoE layers; pass layer_ids)")
    arrays = []
    for j, x in enumerate(layers):
        try:
            arrays.append(np.asarray(x, np.float64))
        except (ValueError, TypeError):
            raise TraceError(f"logits[{j}]: expected a [T, {preset.routed_experts}] array of "
                             f"numbers, got ragged rows or values that are not numbers") from None
    T = arrays[0].shape[0] if arrays and arrays[0].ndim == 2 else -1
    for j, a in enumerate(arrays):
        if a.ndim != 2 or a.shape != (T, preset.routed_experts):
            raise TraceError(f"logits[{j}]: expected [{max(T, 0)}, {preset.routed_experts}], "
                             f"got {a.shape}")
    req = np.zeros(T, np.int64) if request is None else np.asarray(request)
    pos = np.arange(T) if position is None else np.asarray(position)
    if req.ndim == 0:                           # one request for every token (request=0)
        req = np.full(T, req)
    if req.shape != (T,) or pos.shape != (T,):
        raise TraceError(f"request/position: expected [{T}] each, got {req.shape}/{pos.shape}")
    ids, ws, ss = [], [], []
    for a in arrays:
        try:
            i, w, s = preset.route(a)
        except ValueError as exc:
            raise TraceError(f"logits: {exc}") from None
        ids.append(i)
        ws.append(w / preset.routed_scaling_factor)
        ss.append(s)
    L = len(lids)
    return RoutingTrace(
        request=np.tile(req, L), position=np.tile(pos, L), layer=np.repeat(lids, T),
        phase=np.full(T * L, _phase_code(phase)), expert_ids=np.concatenate(ids),
        gate_weights=np.concatenate(ws), scores=np.concatenate(ss),
        num_experts=preset.routed_experts, layer_ids=lids, model=preset.name, source=source,
        notes=notes)


#: Hugging Face config fields checked against the preset by :func:`capture_hf` (first present).
_HF_ROUTER_FIELDS = (("routed_experts", ("num_local_experts", "num_experts", "n_routed_experts")),
                     ("top_k", ("num_experts_per_tok",)),
                     ("norm_topk_prob", ("norm_topk_prob",)))


def _hf_config_mismatches(config, preset) -> list:
    """``field = value`` of the Hugging Face config that disagree with the preset's router."""
    out = []
    for attr, fields in _HF_ROUTER_FIELDS:
        for name in fields:
            value = getattr(config, name, None)
            if value is None:
                continue
            want = getattr(preset, attr)
            if (bool(value) != want) if isinstance(want, bool) else (int(value) != want):
                out.append(f"config.{name} = {value!r} (preset {attr} = {want!r})")
            break
    return out


def capture_hf(hf_model, input_ids, model, *, attention_mask=None, phase="prefill",
               layer_ids=None, notes=()) -> RoutingTrace:
    """Run a Hugging Face MoE causal LM once with ``output_router_logits=True`` and return the
    routing of every (non-padding) token of every batch row as a trace (request = batch row).

    ``hf_model`` is any ``transformers`` MoE model whose forward accepts
    ``output_router_logits`` and ``position_ids`` (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE, ...);
    ``input_ids`` a ``[B, S]`` integer tensor or array; ``attention_mask`` ``[B, S]`` of 0/1
    (left or right padding); ``model`` the preset whose router the logits go through
    (:func:`trace_from_router_logits`).

    * The model runs in eval mode under ``torch.no_grad()`` (no router jitter, no dropout);
      its training flag is restored afterwards.
    * Positions count the row's non-padding tokens (``cumsum(mask) - 1``), so a left-padded
      row has the positions of the same row unpadded; they are also passed to the model as
      ``position_ids``, as ``generate()`` does. Padding positions are dropped from the trace,
      not routed.
    * ``layer_ids`` defaults to every decoder layer (0..L-1) when the model returned router
      logits for all ``config.num_hidden_layers`` layers, else to the preset's MoE layers.
    * The trace's notes record the model class, the torch and transformers versions and the
      checkpoint (``config._name_or_path``); a model with no checkpoint name (built from a
      config, not ``from_pretrained``) is labelled ``pretrained: no``. ``notes`` are appended.

    Raises :class:`~elmoe3d.errors.UserError` when torch is missing (with the install
    command), on input_ids/attention_mask of the wrong shape or values, when the model's config
    disagrees with the preset's router (expert count, top-k, ``norm_topk_prob``), when the
    model returns no router logits, or (:class:`TraceError`) when ``notes`` is not a list of
    strings.
    """
    try:
        import torch
    except ImportError:
        raise UserError("capture_hf needs PyTorch and transformers (pip install torch "
                        "transformers, or pip install 'elmoe3d[hf]'); trace_from_router_logits "
                        "converts logits you already have without them") from None
    preset = model_preset(model)
    notes = _notes_of(notes)
    ids = torch.as_tensor(input_ids)
    if ids.ndim != 2 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise UserError(f"input_ids: expected an integer [batch, seq] tensor, got "
                        f"{ids.dtype} of shape {tuple(ids.shape)}")
    B, S = ids.shape
    if attention_mask is None:
        mask = torch.ones_like(ids)
    else:
        mask = torch.as_tensor(attention_mask)
        if tuple(mask.shape) != (B, S):
            raise UserError(f"attention_mask: expected shape {(B, S)} like input_ids, got "
                            f"{tuple(mask.shape)}")
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise UserError("attention_mask: expected 0 (padding) or 1 (token) only")
        mask = mask.to(ids.dtype)
    config = getattr(hf_model, "config", None)
    bad = _hf_config_mismatches(config, preset) if config is not None else []
    if bad:
        raise UserError(f"model: {preset.name}'s router does not match the Hugging Face "
                        f"model: {'; '.join(bad)}")
    position_ids = (mask.long().cumsum(-1) - 1).clamp(min=0)
    was_training = bool(getattr(hf_model, "training", False))
    hf_model.eval()
    try:
        with torch.no_grad():
            out = hf_model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                           output_router_logits=True)
    finally:
        hf_model.train(was_training)
    logits = getattr(out, "router_logits", None)
    if not logits:
        raise UserError("the model returned no router_logits: is it a MoE model that supports "
                        "output_router_logits?")
    logits = list(logits)
    if layer_ids is None and len(logits) == getattr(config, "num_hidden_layers", None):
        layer_ids = range(len(logits))
    keep = mask.reshape(-1).cpu().numpy().astype(bool)
    req = np.repeat(np.arange(B), S)[keep]
    pos = position_ids.reshape(-1).cpu().numpy()[keep]
    arrays = []
    for j, x in enumerate(logits):
        if x.ndim < 2 or x.numel() != B * S * x.shape[-1]:
            raise UserError(f"router_logits[{j}]: expected {B * S} token rows, got shape "
                            f"{tuple(x.shape)}")
        arrays.append(x.detach().float().cpu().numpy().reshape(B * S, -1)[keep])
    try:
        import transformers
        tf_version = transformers.__version__
    except ImportError:
        tf_version = "not installed"
    checkpoint = getattr(config, "_name_or_path", "") or getattr(hf_model, "name_or_path", "")
    provenance = (f"hf model: {type(hf_model).__name__}, transformers {tf_version}, "
                  f"torch {torch.__version__}",
                  f"checkpoint: {checkpoint}" if checkpoint else
                  "pretrained: no (no checkpoint name: built from a config, not from_pretrained;"
                  " random weights unless loaded by hand)")
    return trace_from_router_logits(arrays, preset, request=req, position=pos, phase=phase,
                                    layer_ids=layer_ids, source="hf output_router_logits",
                                    notes=provenance + notes)

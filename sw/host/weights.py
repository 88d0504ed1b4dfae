"""Reading real weight files (``.safetensors``, ``.npz``) into NumPy, with the failure kinds
designed out (design brief section 5: "a weight file that is a Git LFS pointer, truncated, or in
BF16 loaded as garbage").

* :func:`open_tensors` reads and checks a file's index (names, dtypes, shapes) without loading
  any tensor data; :meth:`TensorFile.load` then loads one tensor at a time.
* :func:`load_tensors` loads the tensors selected by a glob pattern into an ordered dict.

Dtypes: ``F16``, ``F32`` and ``F64`` are returned as stored; ``BF16`` (which NumPy lacks) is
decoded exactly to float32 (``uint16 << 16`` reinterpreted as IEEE binary32: every bfloat16 is
a float32); integer and bool tensors are returned as stored and flagged ``is_float = False``.
FP8/FP4 and other dtypes without a NumPy equivalent are listed but refuse to load (their real
values need per-block scale tensors that this reader does not interpret).

Every problem is an :class:`~elmoe3d.errors.UserError` whose message names the file (and the
tensor where there is one): a missing file; a Git LFS pointer instead of the weights; a
truncated or corrupt safetensors file (a header length beyond the file, a header that is not
strict JSON, a shape or data offset that is not an integer >= 0, data offsets past the end, a
size that does not match dtype and shape, a hole or an overlap between tensors' data or bytes
after the last one, ``__metadata__`` that is not an object of strings: the safetensors
library's rules, checked for every file before any tensor is read, BF16 included); a corrupt
``.npz``; an unsupported format or dtype; a pattern that matches no tensor (the message lists
available names).

Plain NumPy plus the ``safetensors`` library (used for everything NumPy can represent).
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import math
import os
import reprlib
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...checks import expected_int, is_int
from ...errors import UserError


__all__ = ["TensorInfo", "TensorFile", "TensorDict", "open_tensors", "load_tensors",
           "select_names", "decode_bf16", "SUPPORTED_SUFFIXES", "LFS_POINTER_PREFIX"]

SUPPORTED_SUFFIXES = (".safetensors", ".npz")

#: First bytes of a Git LFS pointer file (what a clone without ``git lfs`` leaves behind).
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec"

# safetensors dtype -> (numpy dtype or None, itemsize in bytes, is_float)
_ST_DTYPES = {
    "BOOL": (np.dtype(np.bool_), 1, False),
    "U8": (np.dtype("<u1"), 1, False), "I8": (np.dtype("<i1"), 1, False),
    "U16": (np.dtype("<u2"), 2, False), "I16": (np.dtype("<i2"), 2, False),
    "U32": (np.dtype("<u4"), 4, False), "I32": (np.dtype("<i4"), 4, False),
    "U64": (np.dtype("<u8"), 8, False), "I64": (np.dtype("<i8"), 8, False),
    "F16": (np.dtype("<f2"), 2, True), "F32": (np.dtype("<f4"), 4, True),
    "F64": (np.dtype("<f8"), 8, True),
    "BF16": (None, 2, True),                     # decoded by decode_bf16
    # Listed so that sizes can be checked, but not loadable (no NumPy dtype, and their real
    # value needs the checkpoint's block scales).
    "F8_E4M3": (None, 1, False), "F8_E5M2": (None, 1, False), "F8_E8M0": (None, 1, False),
    "C64": (None, 8, False),
}
_LOADABLE_ST = {k for k, (dt, _, _) in _ST_DTYPES.items() if dt is not None} | {"BF16"}
_MAX_HEADER = 100 * 1024 * 1024          # the safetensors library's own limit

_NP_CODES = {np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
             np.dtype(np.uint16): "U16", np.dtype(np.int16): "I16",
             np.dtype(np.uint32): "U32", np.dtype(np.int32): "I32",
             np.dtype(np.uint64): "U64", np.dtype(np.int64): "I64",
             np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
             np.dtype(np.float64): "F64"}


_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}


class _Object(dict):
    """A header's JSON object; ``twice``: the keys it gave more than once (their last value
    kept, as the safetensors library's parser keeps it for tensor names and metadata keys;
    a tensor entry's own field given twice the library refuses, and so does this reader)."""

    twice = frozenset()


def _object(pairs) -> dict:
    """``json.loads`` object hook: a dict, or an :class:`_Object` noting the keys given
    twice."""
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    keys = [k for k, _ in pairs]
    out = _Object(out)
    out.twice = frozenset(k for k in out if keys.count(k) > 1)
    return out


def _refuse_json_constant(name):
    raise ValueError(f"{name} is not a JSON number")


#: The most digits a header's integer may have (Python's own limit on ``int()`` of a string;
#: a shape entry or an offset that large fails its own check later, an integer in an unknown
#: field is taken, as the safetensors library takes it).
MAX_INT_DIGITS = 4300


def _parse_json_int(text) -> int:
    """``json.loads`` integer hook: an integer of at most :data:`MAX_INT_DIGITS` digits, else
    a ValueError saying so (Python's own error would name ``sys.set_int_max_str_digits``)."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer {text[:12]}... ({len(text)} digits) is out of range")
    return int(text)


def _brief(value, limit=60) -> str:
    """A short repr of a header value (any JSON: it may be huge or deeply nested)."""
    text = reprlib.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _nbytes(shape, itemsize, cap):
    """``prod(shape) * itemsize``; None once a shape of more than 64 dimensions exceeds
    ``cap`` (a header can hold millions of them: the exact product would take minutes)."""
    if 0 in shape:
        return 0
    n = itemsize
    for s in shape:
        n *= s
        if n > cap and len(shape) > 64:
            return None
    return n


def _header_int(where, field, value, lo) -> int:
    """A header's shape entry or data offset: an integer (not a bool, not a float) >= lo."""
    if not is_int(value) or value < lo:
        raise UserError(f"{where}: {field}: expected {expected_int(lo)}, got {_brief(value)}")
    return value


def decode_bf16(raw) -> np.ndarray:
    """Decode little-endian bfloat16 bit patterns to float32, exactly.

    Parameters
    ----------
    raw : bytes-like (2 bytes per value) or array_like of uint16 bit patterns

    Returns
    -------
    ndarray of float32, flat: ``(uint32(bits) << 16)`` viewed as IEEE binary32 (bfloat16 is the
    top half of a float32, so this is exact, including subnormals, infinities and NaN).
    """
    if isinstance(raw, (bytes, bytearray, memoryview)):
        bits = np.frombuffer(raw, dtype="<u2")
    else:
        bits = np.asarray(raw, dtype=np.uint16)
    return (bits.astype("<u4") << 16).view("<f4").astype(np.float32)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a weight file, as its index describes it (no data loaded).

    Attributes
    ----------
    name : str
    dtype : str
        Stored dtype in safetensors spelling (``"F32"``, ``"BF16"``, ``"I64"``, ...); for an
        ``.npz`` member with no such spelling, NumPy's ``dtype.str``.
    shape : tuple of int
    is_float : bool
        A floating tensor (F16, BF16, F32, F64); integer, bool, FP8 etc. are not.
    loadable : bool
        False for dtypes this reader refuses to load (FP8, object arrays, ...).
    """

    name: str
    dtype: str
    shape: tuple
    is_float: bool
    loadable: bool = True

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class TensorDict(dict):
    """``dict[name, ndarray]`` in file order, plus the index of what was loaded.

    Attributes
    ----------
    path : Path
    info : dict[str, TensorInfo]
    non_float : tuple of str
        Names of loaded tensors that are not floating point (returned as stored).
    """

    def __init__(self, path, items, info):
        super().__init__(items)
        self.path = Path(path)
        self.info = dict(info)

    @property
    def non_float(self) -> tuple:
        return tuple(n for n in self if not self.info[n].is_float)


def _split_pattern(pattern) -> list:
    if pattern is None:
        return []
    if isinstance(pattern, str):
        parts = pattern.split(",")
    else:
        parts = list(pattern)
    return [p.strip() for p in parts if p and p.strip()]


def select_names(names, pattern, *, source="the file") -> list:
    """Names (in their given order) matching ``pattern``.

    Parameters
    ----------
    names : iterable of str
    pattern : str, list of str or None
        ``fnmatch`` globs on the full tensor name (case-sensitive; ``*`` also matches ``.``),
        comma-separated in a string. ``None`` or empty selects everything.
    source : str
        What the names come from, for the error message (the file path).

    Raises
    ------
    UserError
        A glob matches no name (checked one by one, so a typo among several globs is caught);
        the message lists close or, failing that, the first few available names.
    """
    names = list(names)
    globs = _split_pattern(pattern)
    if not globs:
        return names
    chosen = set()
    for glob in globs:
        hits = [n for n in names if fnmatch.fnmatchcase(n, glob)]
        if not hits:
            raise UserError(f"{source}: no tensor matches {glob!r} ({_names_hint(glob, names)})")
        chosen.update(hits)
    return [n for n in names if n in chosen]


def _names_hint(wanted: str, names: list) -> str:
    """What to say beside a tensor name or glob ``wanted`` that ``names`` lack: the close
    names, else the first few."""
    close = difflib.get_close_matches(wanted, names, n=3, cutoff=0.5)
    if close:
        return "did you mean " + ", ".join(close)
    if names:
        shown = names[:5]
        return "available: " + ", ".join(shown) + (
            f", ... ({len(names)} tensors)" if len(names) > len(shown) else "")
    return "the file holds no tensors"


def _check_path(path: Path) -> int:
    """Existence, type and LFS-pointer checks; returns the file size."""
    if not path.exists():
        raise UserError(f"{path}: no such file; expected a weight file "
                        f"({', '.join(SUPPORTED_SUFFIXES)})")
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in SUPPORTED_SUFFIXES)
        hint = (": give one of its weight files (" + ", ".join(inside[:5]) + ")") if inside \
            else ""
        raise UserError(f"{path}: is a directory{hint}")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if head.startswith(LFS_POINTER_PREFIX):
        detail = ""
        for line in head.decode("ascii", "replace").splitlines():
            if line.startswith("size "):
                detail = f" to a {line[5:].strip()}-byte object"
        raise UserError(f"{path}: is a Git LFS pointer file{detail} ({size} bytes), not the "
                        f"weights: fetch the real file (git lfs pull, or download it directly)")
    if size == 0:
        raise UserError(f"{path}: is empty (0 bytes)")
    return size


def npy_member_header(zf: zipfile.ZipFile, member: str) -> tuple:
    """The ``(shape, dtype)`` an ``.npz`` archive's ``.npy`` member declares, read from its
    header alone (no data), checked against the member's size: a header that declares more
    data than the member holds (a corrupt or crafted file) would otherwise make NumPy
    allocate the declared array (149 GiB for a 200,000 x 200,000 float32) before it finds the
    data short.

    Raises
    ------
    ValueError
        Not an ``.npy`` header, or the data it declares (bytes) exceeds the member's size.
    OSError, EOFError, zipfile.BadZipFile, zlib.error
        The archive itself is unreadable.
    """
    with zf.open(member) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        header = f.tell()
    info = zf.getinfo(member)
    if dtype.hasobject:                 # pickled objects: their size is not the shape's
        return tuple(shape), dtype
    need = math.prod(shape) * dtype.itemsize
    # the member's size as the archive states it, and what the archive's bytes can hold: a
    # crafted entry may state any size (a stored member holds at most the archive's bytes, a
    # deflated one at most 1032 times them, DEFLATE's largest ratio)
    archive = _archive_bytes(zf)
    bound = {zipfile.ZIP_STORED: archive, zipfile.ZIP_DEFLATED: 1032 * archive}.get(
        info.compress_type, info.file_size)
    size = min(info.file_size, bound)
    if header + need > size:
        raise ValueError(f"its header declares shape {tuple(shape)} of {dtype} ({need:,} B of "
                         f"data) but the member holds at most {max(size - header, 0):,} B "
                         f"after it")
    return tuple(shape), dtype


def _archive_bytes(zf: zipfile.ZipFile) -> int:
    """The size in bytes of the file ``zf`` reads (its stream's end)."""
    fp = zf.fp
    here = fp.tell()
    try:
        return fp.seek(0, 2)
    finally:
        fp.seek(here)


class TensorFile:
    """A checked weight file: its index in file order, and tensors loaded on demand.

    Use :func:`open_tensors` to create one.

    Attributes
    ----------
    path : Path
    format : str
        ``"safetensors"`` or ``"npz"``.
    size : int
        File size in bytes.
    infos : dict[str, TensorInfo]
        Every tensor in the file, in file order.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.size = _check_path(self.path)
        suffix = self.path.suffix.lower()
        if suffix == ".safetensors":
            self.format = "safetensors"
            self._offsets = {}
            self.infos = self._index_safetensors()
        elif suffix == ".npz":
            self.format = "npz"
            self.infos = self._index_npz()
        else:
            hint = " (PyTorch pickles are not read: convert them to .safetensors)" \
                if suffix in (".bin", ".pt", ".pth", ".ckpt") else ""
            raise UserError(f"{self.path}: unsupported format {suffix or '(no suffix)'!r}; "
                            f"expected one of {', '.join(SUPPORTED_SUFFIXES)}{hint}")

    # -- safetensors ------------------------------------------------------------------------

    def _corrupt(self, what):
        return UserError(f"{self.path}: {what}")

    def _index_safetensors(self) -> dict:
        size = self.size
        if size < 8:
            raise self._corrupt(f"{size} bytes is too short for a safetensors header "
                                f"(truncated, or not a safetensors file)")
        with open(self.path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            if hlen > size - 8 or hlen > _MAX_HEADER:
                raise self._corrupt(f"header length {hlen} bytes runs past the end of the "
                                    f"file ({size} bytes): truncated or not a safetensors file")
            raw = f.read(hlen)
        header = self._parse_header(raw)
        data_start = 8 + hlen
        entries = self._check_header(header, size - data_start)
        infos = {}
        for begin, end, info in entries:
            infos[info.name] = info
            self._offsets[info.name] = (data_start + begin, data_start + end)
        return infos

    def _parse_header(self, raw: bytes) -> dict:
        """The header's JSON object, parsed as the safetensors library parses it (no
        NaN/Infinity; a key given twice keeps its last value, as the library's parser does
        for tensor names and metadata keys: :class:`_Object`)."""
        detail = None
        try:
            header = json.loads(raw.decode("utf-8"), parse_constant=_refuse_json_constant,
                                parse_int=_parse_json_int, object_pairs_hook=_object)
        except UnicodeDecodeError:
            detail = "not UTF-8 text"
        except RecursionError:
            detail = "nested too deeply"
        except ValueError as exc:              # JSONDecodeError, and the hooks' refusals
            detail = str(exc)
        if detail is not None:
            raise self._corrupt(f"header is not valid JSON: {detail} (corrupt, or not a "
                                f"safetensors file)")
        if not isinstance(header, dict):
            raise self._corrupt("header is not a JSON object (corrupt safetensors file)")
        return header

    def _check_header(self, header: dict, data_len: int) -> list:
        """Check a parsed header against a data section of ``data_len`` bytes, with the
        safetensors library's rules whatever the dtype: ``__metadata__`` maps names to
        strings; shapes and data offsets are integers >= 0; a tensor of a known dtype holds
        exactly ``prod(shape) * itemsize`` bytes; the tensors, in offset order, cover the data
        section exactly (no hole, no overlap, nothing after the last one).

        Returns ``[(begin, end, TensorInfo)]`` in file order (offsets within the data
        section); raises :class:`UserError` naming the file and the tensor.
        """
        meta = header.get("__metadata__")
        if meta is not None and not (isinstance(meta, dict)
                                     and all(isinstance(v, str) for v in meta.values())):
            raise self._corrupt(f"header: __metadata__: expected an object of strings, got "
                                f"{_brief(meta)} (corrupt safetensors file)")
        entries = []
        for order, (name, entry) in enumerate(header.items()):
            if name == "__metadata__":
                continue
            where = f"{self.path}: tensor {name!r}"
            if not isinstance(entry, dict) or not _ENTRY_KEYS <= entry.keys():
                raise UserError(f"{where}: malformed header entry {_brief(entry)}: expected "
                                f"an object with dtype, shape and data_offsets")
            twice = sorted(_ENTRY_KEYS & getattr(entry, "twice", frozenset()))
            if twice:
                raise UserError(f"{where}: {twice[0]} given twice in its header entry "
                                f"(corrupt safetensors file)")
            dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
            if not isinstance(dtype, str):
                raise UserError(f"{where}: dtype: expected a string such as 'F32', got "
                                f"{_brief(dtype)}")
            if not isinstance(shape, list):
                raise UserError(f"{where}: shape: expected a list of integers >= 0, got "
                                f"{_brief(shape)}")
            shape = tuple(_header_int(where, f"shape[{i}]", s, 0) for i, s in enumerate(shape))
            if not isinstance(offsets, list) or len(offsets) != 2:
                raise UserError(f"{where}: data_offsets: expected [begin, end], got "
                                f"{_brief(offsets)}")
            begin = _header_int(where, "data_offsets[0]", offsets[0], 0)
            end = _header_int(where, "data_offsets[1]", offsets[1], begin)
            if dtype in _ST_DTYPES:
                need = _nbytes(shape, _ST_DTYPES[dtype][1], end - begin)
                if end - begin != need:
                    words = f"{need}" if need is not None else f"more than {end - begin}"
                    raise UserError(f"{where}: data_offsets [{begin}, {end}] hold "
                                    f"{end - begin} bytes but {dtype} {_brief(list(shape))} "
                                    f"needs {words}: corrupt header")
            is_float = dtype in _ST_DTYPES and _ST_DTYPES[dtype][2]
            info = TensorInfo(name, dtype, shape, bool(is_float), dtype in _LOADABLE_ST)
            entries.append((begin, end, order, info))
        # Contiguity, in the library's order (by offsets), then file order (by start).
        entries.sort(key=lambda e: (e[0], e[1]))
        pos, prev, start = 0, None, self.size - data_len
        for begin, end, _, info in entries:
            where = f"{self.path}: tensor {info.name!r}"
            if begin > pos:
                after = f"the end of tensor {prev!r}" if prev is not None else \
                    "the start of the data"
                raise UserError(f"{where}: data_offsets [{begin}, {end}]: a hole of "
                                f"{begin - pos} bytes between {after} (offset {pos}) and this "
                                f"tensor (corrupt header)")
            if begin < pos:
                raise UserError(f"{where}: data_offsets [{begin}, {end}] overlap the data of "
                                f"tensor {prev!r}, which ends at {pos} (corrupt header)")
            if end > data_len:
                raise UserError(f"{where}: data ends at byte {start + end} but the file has "
                                f"only {self.size} bytes: truncated (incomplete download?)")
            pos, prev = end, info.name
        if pos != data_len:
            extra = f"{data_len - pos} bytes follow it (corrupt, or not a safetensors file)"
            if prev is None:
                raise self._corrupt(f"the header lists no tensor but {extra}")
            raise UserError(f"{self.path}: tensor {prev!r}: the last tensor's data ends at byte "
                            f"{start + pos} but the file has {self.size} bytes: {extra}")
        entries.sort(key=lambda e: (e[0], e[2]))          # file order
        return [(begin, end, info) for begin, end, _, info in entries]

    def _load_safetensors(self, info: TensorInfo) -> np.ndarray:
        begin, end = self._offsets[info.name]
        if info.dtype == "BF16":
            try:
                with open(self.path, "rb") as f:
                    f.seek(begin)
                    raw = f.read(end - begin)
            except OSError as exc:
                raise UserError(f"{self.path}: tensor {info.name!r}: cannot read: "
                                f"{exc.strerror or exc}") from None
            if len(raw) != end - begin:
                raise self._corrupt(f"tensor {info.name!r}: truncated while reading")
            return decode_bf16(raw).reshape(info.shape)
        from safetensors import SafetensorError, safe_open
        try:
            with safe_open(str(self.path), framework="numpy") as f:
                array = f.get_tensor(info.name)
        except (SafetensorError, OSError, TypeError, ValueError) as exc:
            raise UserError(f"{self.path}: tensor {info.name!r}: the safetensors library "
                            f"could not read it: {exc}") from None
        return np.asarray(array).reshape(info.shape)

    # -- npz --------------------------------------------------------------------------------

    def _open_zip(self):
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic not in (b"PK\x03\x04", b"PK\x05\x06"):
            raise self._corrupt("is not a zip archive, so not an .npz file (corrupt, or "
                                "another format with an .npz name)")
        try:
            return zipfile.ZipFile(self.path)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise self._corrupt(f"corrupt or truncated .npz archive ({exc})") from None

    def _index_npz(self) -> dict:
        infos = {}
        self._members = {}
        with self._open_zip() as zf:
            for member in zf.namelist():
                name = member[:-4] if member.endswith(".npy") else member
                try:
                    shape, dtype = npy_member_header(zf, member)
                except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
                    raise UserError(f"{self.path}: tensor {name!r}: corrupt .npy member "
                                    f"({exc})") from None
                code = _NP_CODES.get(dtype.newbyteorder("=") if dtype.byteorder in "<>"
                                     else dtype)
                is_float = dtype.kind == "f"
                loadable = not dtype.hasobject and dtype.kind in "biuf"
                infos[name] = TensorInfo(name, code or dtype.str, tuple(shape), is_float,
                                         loadable)
                self._members[name] = member
        return infos

    def _load_npz(self, info: TensorInfo) -> np.ndarray:
        try:
            with self._open_zip() as zf, zf.open(self._members[info.name]) as f:
                array = np.lib.format.read_array(f, allow_pickle=False)
        except MemoryError:
            raise UserError(f"{self.path}: tensor {info.name!r}: shape {info.shape} does not fit "
                            f"in this machine's memory") from None
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise UserError(f"{self.path}: tensor {info.name!r}: corrupt or truncated data "
                            f"({exc})") from None
        if array.shape != info.shape:
            raise UserError(f"{self.path}: tensor {info.name!r}: read shape {array.shape}, "
                            f"header says {info.shape}")
        return array

    # -- public -----------------------------------------------------------------------------

    @property
    def names(self) -> list:
        return list(self.infos)

    def select(self, pattern=None) -> list:
        """:class:`TensorInfo` of the tensors matching ``pattern`` (see :func:`select_names`),
        in file order."""
        return [self.infos[n] for n in select_names(self.infos, pattern, source=str(self.path))]

    def load(self, name) -> np.ndarray:
        """Load one tensor (BF16 decoded to float32, everything else as stored).

        Raises
        ------
        UserError
            No such tensor (lists close names); a dtype this reader does not load; corrupt data.
        """
        info = self.infos.get(name)
        if info is None:                # a name, not a glob: ``*.weight`` is looked up as is
            raise UserError(f"{self.path}: no tensor named {name!r} "
                            f"({_names_hint(name, list(self.infos))})")
        if not info.loadable:
            raise UserError(f"{self.path}: tensor {name!r}: dtype {info.dtype} is not "
                            f"supported (F16, BF16, F32, F64 and integer tensors are)")
        if self.format == "safetensors":
            return self._load_safetensors(info)
        return self._load_npz(info)


def open_tensors(path) -> TensorFile:
    """Check a ``.safetensors`` or ``.npz`` file and read its index (no tensor data).

    Raises
    ------
    UserError
        Missing file, directory, Git LFS pointer, empty, unsupported suffix, truncated or
        corrupt file; the message names the file (and the tensor where there is one). A
        safetensors header is checked whole, whatever the dtypes: JSON as the library reads
        it (no NaN or Infinity, integers of at most :data:`MAX_INT_DIGITS` digits, not nested
        too deeply; a tensor name or metadata key given twice keeps its last value, a
        tensor entry's dtype, shape or data_offsets given twice is refused); shapes and
        data offsets integers >= 0 (not bools, floats or strings); each tensor's bytes equal
        to ``prod(shape)`` times its dtype's size; the tensors' data contiguous (no hole, no
        overlap) and covering the rest of the file exactly; ``__metadata__`` an object of
        strings.
    """
    return TensorFile(path)


#: The index Hugging Face writes beside a sharded checkpoint's ``.safetensors`` shards
#: (``model.safetensors.index.json``: ``{"metadata": {...}, "weight_map": {tensor: shard}}``).
INDEX_SUFFIX = ".safetensors.index.json"


class Checkpoint:
    """The tensors of one or more weight files read as one model: a sharded checkpoint (its
    folder, its ``*.safetensors.index.json`` or its shards), or a single file. Use
    :func:`open_checkpoint` to create one; every file's index is checked as
    :func:`open_tensors` checks it, and no tensor data is read until :meth:`load`.

    Attributes
    ----------
    files : list[TensorFile]
        The weight files, in the order given (a folder's and an index's: by file name).
    label : str
        How reports name the whole (the one file's path, the folder's or index's, or the
        count of files).
    infos : dict[str, TensorInfo]
        Every tensor, file by file in file order.
    file_of : dict[str, TensorFile]
        The file holding each tensor.
    indexes : list[Path]
        The ``*.safetensors.index.json`` files read (given, or found in a given folder).
    passed_over : list[Path]
        Weight files in a given folder that are not read (:func:`passed_over`: its ``.npz``
        files beside ``.safetensors`` ones), for the caller to report.
    """

    def __init__(self, files, label: str):
        self.files = list(files)
        self.label = label
        self.indexes = []               # the checkpoint indexes read (open_checkpoint)
        self.passed_over = []           # a given folder's files not read (open_checkpoint)
        self.infos, self.file_of = {}, {}
        for tf in self.files:
            for name, info in tf.infos.items():
                other = self.file_of.get(name)
                if other is not None:
                    raise UserError(f"tensor {name!r} is in both {other.path} and {tf.path}: "
                                    f"expected each tensor in one file of the checkpoint")
                self.infos[name] = info
                self.file_of[name] = tf

    @property
    def format(self) -> str:
        """The files' format (``"safetensors"``, ``"npz"``; both, ``"npz+safetensors"``)."""
        return "+".join(sorted({tf.format for tf in self.files}))

    def select(self, pattern=None) -> list:
        """:class:`TensorInfo` of the tensors matching ``pattern`` over every file (see
        :func:`select_names`: a glob matching no tensor of any file is an error)."""
        return [self.infos[n] for n in select_names(self.infos, pattern, source=self.label)]

    def load(self, name) -> np.ndarray:
        """One tensor, as :meth:`TensorFile.load` loads it from the file holding it."""
        tf = self.file_of.get(name)
        if tf is None:
            raise UserError(f"{self.label}: no tensor named {name!r} "
                            f"({_names_hint(name, list(self.infos))})")
        return tf.load(name)


def _index_of(arg):
    """The checkpoint index ``arg`` stands for (itself, or a folder's one), or None.
    Raises :class:`UserError` for a folder holding several."""
    path = Path(arg)
    if path.is_dir():
        indexes = sorted(path.glob(f"*{INDEX_SUFFIX}"))
        if len(indexes) > 1:
            raise UserError(f"{path}: holds {len(indexes)} checkpoint indexes "
                            f"({', '.join(p.name for p in indexes[:3])}): give one of them")
        return indexes[0] if indexes else None
    return path if path.name.endswith(INDEX_SUFFIX) else None


def _index_map(index: Path) -> dict:
    """A checkpoint index's ``weight_map`` (tensor name -> shard file name), checked: JSON
    (strict, as a safetensors header), an object of non-empty strings."""
    from ...paths import read_utf8
    text = read_utf8(index, "checkpoint index")
    try:
        doc = json.loads(text, parse_constant=_refuse_json_constant,
                         parse_int=_parse_json_int, object_pairs_hook=_object)
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{index}: not a checkpoint index (not JSON: {exc})") from None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict) or not wmap \
            or not all(isinstance(v, str) and v for v in wmap.values()):
        raise UserError(f"{index}: expected a checkpoint index, an object with \"weight_map\": "
                        f"{{tensor name: shard file name}} (as Hugging Face writes "
                        f"model{INDEX_SUFFIX})")
    out = {}
    for name, shard in wmap.items():        # one spelling a shard, beside the index
        norm = os.path.normpath(shard)
        if os.path.isabs(norm) or norm.split(os.sep)[0] == os.pardir:
            raise UserError(f"{index}: maps tensor {name!r} to {shard}, outside the index's "
                            f"folder (expected a shard file beside it)")
        out[name] = norm
    return out


def checkpoint_paths(arg) -> list:
    """The weight files ``arg`` stands for: a file itself; a folder's
    ``*.safetensors.index.json`` (exactly one), else its ``.safetensors`` files, else its
    ``.npz`` files, by name (not its subfolders); an index file's shards (its ``weight_map``'s
    files, relative to the index, by name). Raises :class:`UserError` naming the folder or
    index: no weight file in the folder, several indexes, an index that is not JSON, has no
    ``weight_map`` object of names -> file names, or names a shard that is not there."""
    path = Path(arg)
    index = _index_of(path)
    if index is None and path.is_dir():
        for files in _folder_files(path):
            if files:
                return files
        raise UserError(f"{path}: no weight file in this folder (expected .safetensors or "
                        f".npz files, or a sharded checkpoint's *{INDEX_SUFFIX})")
    if index is None:
        return [path]
    shards = sorted(set(_index_map(index).values()))
    missing = [s for s in shards if not (index.parent / s).is_file()]
    if missing:
        raise UserError(f"{index}: names {len(missing)} shard(s) not beside it: "
                        f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    return [index.parent / s for s in shards]


def _folder_files(folder: Path) -> list:
    """A folder's weight files (not its subfolders'), a list by name for each suffix of
    :data:`SUPPORTED_SUFFIXES` in its order."""
    return [sorted(p for p in folder.glob(f"*{suffix}") if p.is_file())
            for suffix in SUPPORTED_SUFFIXES]


def passed_over(folder) -> list:
    """The weight files of ``folder`` that :func:`checkpoint_paths` does not read because files
    of an earlier suffix of :data:`SUPPORTED_SUFFIXES` are there (its ``.npz`` beside
    ``.safetensors``), by name; ``[]`` for anything but a folder without an index."""
    path = Path(folder)
    if not path.is_dir() or _index_of(path) is not None:
        return []
    found = _folder_files(path)
    first = next((i for i, files in enumerate(found) if files), len(found))
    return [p for files in found[first + 1:] for p in files]


def open_checkpoint(args) -> Checkpoint:
    """Check every weight file ``args`` (paths, or one path) stand for
    (:func:`checkpoint_paths`: files, folders, ``*.safetensors.index.json``) and read their
    indexes as one :class:`Checkpoint`. An index's ``weight_map`` is checked against its
    shards: each tensor it maps must be in the shard it names.

    Raises
    ------
    UserError
        As :func:`checkpoint_paths` and :func:`open_tensors`; a file given twice (also
        through a folder or an index); a tensor in two files; an index whose tensor is not
        in its shard.
    """
    args = [args] if isinstance(args, (str, Path)) else list(args)
    files, seen = [], {}
    for arg in args:
        for p in checkpoint_paths(arg):
            key = p.resolve()
            if key in seen:
                raise UserError(f"{p}: given twice (as {seen[key]} and {arg})")
            seen[key] = arg
            files.append(open_tensors(p))
    if len(args) == 1 and len(files) == 1:
        label = str(files[0].path)
    elif len(args) == 1:
        label = str(args[0])
    else:
        label = f"{len(files)} files"
    ckpt = Checkpoint(files, label)
    ckpt.passed_over = [p for arg in args for p in passed_over(arg)   # unless named as well
                        if p.resolve() not in seen]
    for arg in args:                    # an index's map against its shards, both ways
        index = _index_of(arg)
        if index is None:
            continue
        ckpt.indexes.append(index)
        wmap = _index_map(index)
        for name, shard in wmap.items():
            tf = ckpt.file_of.get(name)
            if tf is None or tf.path.resolve() != (index.parent / shard).resolve():
                where = f"but it is in {tf.path.name}" if tf is not None else \
                    "which does not hold it"
                raise UserError(f"{index}: maps tensor {name!r} to {shard}, {where}")
        mapped = {(index.parent / s).resolve() for s in wmap.values()}
        for name, tf in ckpt.file_of.items():
            if tf.path.resolve() in mapped and name not in wmap:
                raise UserError(f"{index}: does not list tensor {name!r}, which its shard "
                                f"{tf.path.name} holds (an index and shards of two "
                                f"checkpoints?)")
    return ckpt


def load_tensors(path, pattern=None) -> TensorDict:
    """Load the tensors of a weight file whose names match ``pattern``.

    Parameters
    ----------
    path : str or Path
        A ``.safetensors`` or ``.npz`` file.
    pattern : str, list of str or None
        ``fnmatch`` globs on tensor names, comma-separated; ``None`` loads every tensor.
        Tensors not selected are never read.

    Returns
    -------
    TensorDict
        ``{name: ndarray}`` in file order; F16/F32/F64 as stored, BF16 decoded to float32,
        integer/bool tensors as stored and listed in ``.non_float``; ``.info`` has the
        stored dtype and shape of each.

    Raises
    ------
    UserError
        See :func:`open_tensors`; also a glob that matches no tensor, and a selected tensor of
        an unsupported dtype (FP8, object arrays).
    """
    tf = open_tensors(path)
    infos = tf.select(pattern)
    return TensorDict(tf.path, [(i.name, tf.load(i.name)) for i in infos],
                      [(i.name, i) for i in infos])

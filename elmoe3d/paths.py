"""Where generated build output goes: the simulator's Verilog (``verilog/``) and Verilator
models (``<name>-<digest>/``), the compute calibrations of shapes the shipped tables lack
(``calib/``), the synthesis cache (``synth/``) and the FPGA flow's builds and estimates
(``fpga/``) share one build root, so a command finds the same caches from any working folder
(``make synth``'s warm cache from ``/tmp`` too). :func:`memo_text` is how a file of such a
cache is made once, whatever number of processes want it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
from pathlib import Path

__all__ = ["BUILD_ROOT_ENV", "build_root", "build_error", "ensure_build_root", "memo_text",
           "read_utf8"]

#: Environment variable overriding the build root (default ``<repo>/build``).
BUILD_ROOT_ENV = "ELMOE3D_BUILD_DIR"


def build_root() -> Path:
    """``$ELMOE3D_BUILD_DIR`` (resolved), else ``build/`` in the repository (or in the
    current folder when the package is installed elsewhere). Read at each call, so a test or
    a script may set the variable after import."""
    env = os.environ.get(BUILD_ROOT_ENV)
    if env:
        return Path(env).resolve()
    repo = Path(__file__).resolve().parent.parent
    if (repo / "pyproject.toml").is_file():
        return repo / "build"
    return Path.cwd() / "build"


#: The errors of writing into a folder that cannot take it (read-only, not a folder, full):
#: what :func:`build_error` reports; a missing file there is a bug's, not the folder's.
_WRITE_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                           errno.ENOTDIR, errno.EEXIST})


def build_error(exc: BaseException):
    """A :class:`~elmoe3d.errors.UserError` for ``exc`` when it is an :class:`OSError` of
    writing (:data:`_WRITE_ERRNOS`) on an absolute path in the build root
    (``$ELMOE3D_BUILD_DIR`` set to a read-only folder or to a file, a full disk): one line
    naming the folder, where it comes from and the reason; ``None`` for any other exception
    (a bug keeps its traceback)."""
    from .errors import UserError
    if not isinstance(exc, OSError) or exc.errno not in _WRITE_ERRNOS:
        return None
    root = build_root()
    for name in (exc.filename, exc.filename2):
        if not isinstance(name, (str, bytes)) or not os.path.isabs(os.fsdecode(name)):
            continue                    # a descriptor, or relative: not the build root's
        path = Path(os.path.normpath(os.fsdecode(name)))
        if path == root or root in path.parents:
            return UserError(_cannot_write(root, path, exc))
    return None


def _cannot_write(root: Path, path, exc: OSError) -> str:
    """The one line of a build root that cannot be written: where the root comes from, the
    path and the reason."""
    source = f"${BUILD_ROOT_ENV}" if os.environ.get(BUILD_ROOT_ENV) else \
        f"the build folder (set another with ${BUILD_ROOT_ENV})"
    return f"{source} {root}: cannot write {path} ({exc.strerror or type(exc).__name__})"


def ensure_build_root() -> Path:
    """The build root, created if missing and checked writable (a probe file made and
    removed), before a command builds anything. Raises the
    :class:`~elmoe3d.errors.UserError` (one line, as :func:`build_error`'s) when it cannot
    be written."""
    root = build_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".elmoe3d-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        from .errors import UserError
        raise UserError(_cannot_write(root, exc.filename or root, exc)) from None
    return root


def memo_text(path, produce, check=None) -> tuple:
    """``(text, made)``: the text of the file ``path``, made once by ``produce()`` (a str).
    Under an exclusive lock on ``.<name>.lock`` beside it (pytest-xdist workers, sweep workers
    and later runs that want the same file wait for one maker and read its file), the file is
    read when present and whole (``check(text)``, when given, raises ValueError or returns
    false for a damaged one; a file that is not UTF-8 is damaged too): ``made`` False. Else
    ``produce()`` is written to a temporary file in the same folder and renamed into place
    (``made`` True): never half a file, readable by the other users of a shared cache (mode
    0644). A folder where no lock can be made is read without one when the file is there.
    Raises OSError when the folder or the lock cannot be made and the file is not there
    (before ``produce`` runs), or when the write fails (after); an exception of ``produce``
    passes through, the lock released and nothing written."""
    path = Path(path)

    def whole():
        try:
            text = path.read_text(encoding="utf-8")
            return text if check is None or check(text) else None
        except (UnicodeDecodeError, ValueError, TypeError):
            return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_file = open(path.parent / f".{path.name}.lock", "a")
    except OSError:
        text = whole() if path.is_file() else None          # a read-only cache
        if text is None:
            raise
        return text, False
    with lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if path.is_file():
                text = whole()
                if text is not None:
                    return text, False
            text = produce()
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.chmod(tmp, 0o644)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return text, True
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def read_utf8(path, what: str = "") -> str:
    """The text of the user's file ``path`` (UTF-8, a byte-order mark dropped), the one way
    the project's readers of specs and tables read one. Raises
    :class:`~elmoe3d.errors.UserError` naming the file: ``"PATH: cannot read the WHAT
    (reason)"``, or ``"PATH:LINE: not UTF-8 text (byte 0xff at offset N: reason)"``."""
    from .errors import UserError
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read{' the ' + what if what else ''} "
                        f"({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at "
                        f"offset {exc.start}: {exc.reason})") from None

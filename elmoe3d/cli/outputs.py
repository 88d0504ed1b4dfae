"""Output files of the command-line tools: checked before the work starts, written
atomically after it succeeded.

``--json``, ``--plot`` and similar options name a file the command writes only at the end of a
possibly long run. :func:`check_output` rejects an unusable path up front (a directory, a
missing or read-only folder) as a one-line :class:`~elmoe3d.errors.UserError`;
:func:`check_output_dir` does so for an output folder (``--plot DIR``), which may not exist yet;
:func:`check_distinct` refuses two outputs that are one file, and an output that is one of the
command's input files (which the output would overwrite).
:class:`AtomicOutputs` writes each file aside in its destination folder and renames it into
place only when every output is complete, so a failed run leaves no partial or stale-looking
file; :func:`atomic_outputs` is the block that does so. New files get the usual permissions (``0o666`` less the umask), like ``open(path, "w")``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from ..errors import UserError


__all__ = ["output_path", "output_dir", "check_output", "check_output_dir", "check_distinct",
           "same_file", "AtomicOutputs", "atomic_outputs", "write_json", "report_console",
           "plot_format"]


#: The errors of writing to an open file, which carry no file name
#: (:meth:`AtomicOutputs.for_user`).
_WRITE_ERRNOS = frozenset(getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EFBIG", "EIO")
                          if hasattr(errno, name))


def output_dir(text: str) -> Path:
    """The ``type=`` of an output folder option (``--plot DIR``, ``--out DIR``, ``--cache``,
    ``--split``): an empty path (a shell variable that was not set) is refused, where
    :class:`~pathlib.Path` would read it as the current folder and a truthiness test as no
    option given. Raises :class:`argparse.ArgumentTypeError`: argparse prints its usage and
    the error, exit status 2."""
    import argparse
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; expected a folder name")
    _not_stdout(text, "a folder")
    return Path(text)


def _not_stdout(text, what):
    """``-`` names standard output only where an option says so (``verilog -o -``); elsewhere
    it made a file or folder named ``-`` (``paper table3 --json -``, a new user's)."""
    import argparse
    if text == "-":
        raise argparse.ArgumentTypeError(f"'-': expected {what} name (only verilog -o writes "
                                         f"to standard output; ./- names a {what[2:]} '-')")


def output_path(text: str) -> Path:
    """The ``type=`` of an output file option (``--json``, ``--plot OUT.png``, ``--csv``,
    ``-o``): an empty path is refused (:func:`output_dir`), and so is one ending in a path
    separator or in ``.`` or ``..``, a folder's name: :class:`~pathlib.Path` drops the
    separator and the ``.``, so ``--json notes.txt/`` wrote the report over ``notes.txt``
    (the shell refuses ``> notes.txt/``).
    ``-`` is refused too (:func:`stdout_or_path` takes it as standard output).
    Raises :class:`argparse.ArgumentTypeError`, exit status 2."""
    import argparse
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; expected a file name")
    _not_stdout(text, "a file")
    seps = tuple(sep for sep in (os.sep, os.altsep) if sep)
    if text.endswith(seps):
        raise argparse.ArgumentTypeError(f"{text!r} ends in {text[-1]!r}, a folder's name; "
                                         f"expected a file name")
    last = text
    for sep in seps:
        last = last.rsplit(sep, 1)[-1]
    if last in (".", ".."):             # notes.txt/. is notes.txt to Path, a folder to a shell
        raise argparse.ArgumentTypeError(f"{text!r} ends in {last!r}, a folder; expected a "
                                         f"file name")
    return Path(text)


def stdout_or_path(text: str):
    """The ``type=`` of an output file option that writes to standard output when given
    ``-`` (``verilog -o``): ``"-"``, or :func:`output_path`'s path."""
    return "-" if text == "-" else output_path(text)


def report_console(min_width=120):
    """A ``rich`` console for a command's report on standard output: when the output is not a
    terminal (a pipe, a file, a CI log), at least ``min_width`` columns wide so that tables and
    long names are not cut to a guessed 80."""
    from rich.console import Console
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, min_width))
    return console


def plain_printer(console, **options):
    """``console.print`` for text that is not rich markup (paths, tools' lines, a user's
    names: rich would read ``[x]`` as a tag and drop it), with ``options`` (``soft_wrap``,
    ...); a function of the text."""
    def say(text):
        console.print(text, markup=False, **options)
    return say


def check_output(path, option: str) -> Path:
    """Raise :class:`UserError` (naming ``option``) unless ``path`` can be written: not a
    directory nor another existing non-regular file (a device such as ``/dev/null``, a FIFO,
    a socket: renaming a file over it would replace it), in an existing writable folder.
    Returns ``path`` as a :class:`Path`."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    _refuse_traces_folder(path, option)
    if path.is_dir():
        raise UserError(f"{option} {path}: is a directory")
    _refuse_special(path, option)
    if not parent.is_dir():
        if parent.exists():
            raise UserError(f"{option} {path}: {parent} is not a directory")
        raise UserError(f"{option} {path}: directory {parent} does not exist")
    if not _writable(parent):
        raise UserError(f"{option} {path}: directory {parent} is not writable")
    return path


def plot_format(path, option: str, default: str = "png") -> str:
    """The matplotlib format of a chart file ``path`` from its suffix (case-insensitive;
    ``default`` without one), checked before the work starts: a :class:`UserError` naming
    ``option``, the file and the formats matplotlib writes for a suffix it does not (or .pgf
    without its TeX program)."""
    suffix = Path(path).suffix
    fmt = suffix.lower().lstrip(".") or default
    formats = _image_formats()
    if fmt not in formats:
        raise UserError(f"{option} {path}: unsupported suffix {suffix!r} (matplotlib writes "
                        f"{', '.join('.' + f for f in sorted(formats))})")
    if fmt == "pgf":                       # the one format that needs an outside program
        import matplotlib
        tex = matplotlib.rcParams["pgf.texsystem"]
        if shutil.which(tex) is None:
            raise UserError(f"{option} {path}: matplotlib writes .pgf with {tex}, which is not "
                            f"installed (use .pdf or .svg)")
    return fmt


def check_output_dir(folder, option: str, names, *, image_names: bool = False) -> list:
    """Raise :class:`UserError` (naming ``option``) unless the files ``names`` can be written
    into the folder ``folder``: an existing folder (each file checked by :func:`check_output`)
    or a path that does not exist yet, whose nearest existing ancestor is a writable folder
    (:meth:`AtomicOutputs.make_dir` creates the missing folders when the outputs are written).
    A path that exists and is not a folder is refused, and so is a new one whose suffix is an
    image format (``--plot fig.png``: a file name given for a folder) unless ``image_names``
    (a folder named by its user, whose name is anything: a sweep's). Returns the files'
    paths."""
    folder = Path(folder)
    _refuse_traces_folder(folder, option)
    if folder.is_dir():
        return [check_output(folder / name, option) for name in names]
    if folder.exists() or folder.is_symlink():
        raise UserError(f"{option} {folder}: not a directory")
    if not image_names and folder.suffix.lower().lstrip(".") in _image_formats():
        raise UserError(f"{option} {folder}: names a folder to write {', '.join(names)} "
                        f"into, not a file; give a folder (e.g. {folder.with_suffix('')})")
    ancestor = folder.parent
    while not ancestor.exists() and not ancestor.is_symlink() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():                   # a file, or a dangling symbolic link
        raise UserError(f"{option} {folder}: {ancestor} is not a directory")
    if not _writable(ancestor):
        raise UserError(f"{option} {folder}: directory {ancestor} is not writable")
    return [folder / name for name in names]


def _refuse_traces_folder(path: Path, option: str) -> None:
    """:class:`UserError` naming ``option`` for a ``path`` inside the traces folder
    (:func:`~elmoe3d.sw.host.corpus.traces_dir`: the real routing the commands read, shared
    beside the checkout; its permissions do not stop root)."""
    from ..sw.host.corpus import traces_dir
    tdir = traces_dir()
    if not tdir.is_dir():
        return
    if path.resolve().is_relative_to(tdir.resolve()):
        raise UserError(f"{option} {path}: inside the traces folder {tdir}, the real routing "
                        f"the commands read (write elsewhere)")


def _image_formats() -> set:
    """The file formats (suffixes without the dot) matplotlib writes."""
    from matplotlib.backend_bases import FigureCanvasBase
    return set(FigureCanvasBase.get_supported_filetypes())


def same_file(a, b) -> bool:
    """Whether the paths ``a`` and ``b`` name one file: :func:`os.path.samefile` when both
    exist (hard links, symbolic links), else the same path once symbolic links are resolved
    (:func:`os.path.realpath`: a new output under a linked folder)."""
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def check_distinct(outputs, inputs=()) -> None:
    """Raise :class:`UserError` naming both options when two of ``outputs`` (``(option,
    path)`` pairs; a path may be None: no such output) are one file, or when an output is one
    of ``inputs`` (``(option, path)`` pairs: files the command reads, which the output would
    overwrite). One file: :func:`same_file`."""
    outputs = [(opt, Path(p)) for opt, p in outputs if p is not None]
    inputs = [(opt, Path(p)) for opt, p in inputs if p is not None]
    for i, (opt, path) in enumerate(outputs):
        for in_opt, src in inputs:
            if same_file(path, src):
                raise UserError(f"{opt} and {in_opt} name the same file {path}: the output "
                                f"would overwrite the input")
        for other, other_path in outputs[:i]:
            if same_file(path, other_path):
                raise UserError(f"{other} and {opt} name the same file {path}")


def _writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder``: its permission bits, then a probe file
    created and removed there (root passes every permission check, yet cannot create files
    in ``/proc`` or on a read-only mount)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".elmoe3d-probe-")
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return True


def _refuse_special(path: Path, option: str) -> None:
    if path.exists() and not path.is_file():
        raise UserError(f"{option} {path}: not a regular file")


#: Every destination :meth:`AtomicOutputs.commit` renamed into place in this process, in
#: order (cleared by :func:`elmoe3d.cli.main` as a command starts): a Ctrl-C or SIGTERM that
#: ends a command after a commit names them as complete.
COMMITTED = []


class AtomicOutputs:
    """Temporary files in the destination folders, renamed into place by :meth:`commit`,
    removed by :meth:`discard` (safe to call after :meth:`commit`); output folders created by
    :meth:`make_dir` are kept by :meth:`commit` and removed again by :meth:`discard`."""

    def __init__(self):
        self._pending = []
        self._made = []
        self._stale = []
        self._dest_of = {}              # every temporary file's destination, even a failed one
        self._writing = None            # the destination of the newest temporary file

    def remove_on_commit(self, path) -> None:
        """Remove ``path`` (an earlier run's output this one replaces with nothing, such as a
        plot of a model no longer swept) once :meth:`commit` has renamed every new file into
        place; kept if the commit fails or never runs. Missing by then, or not removable (a
        folder by that name, a read-only folder): left as it is, the commit done."""
        self._stale.append(Path(path))

    def for_user(self, exc: OSError) -> OSError:
        """``exc`` with the destination in place of a temporary file of this object's (the
        user named the destination, never saw the temporary file); a write error that names no
        file (a full disk or quota, a file too large, an I/O error: ``write`` and ``close``
        give no name) names the destination being written: the newest temporary file's, as a
        caller makes each just before writing it (:meth:`temp_for`), or the one whose backup
        :meth:`commit` is copying; ``exc`` itself otherwise."""
        if exc.filename is not None:
            dest = self._dest_of.get(str(exc.filename))
        elif exc.errno in _WRITE_ERRNOS:
            dest = self._writing
        else:
            dest = None
        if dest is None or exc.errno is None:
            return exc
        return OSError(exc.errno, exc.strerror, str(dest))

    def make_dir(self, folder) -> Path:
        """Create ``folder`` and any missing parents (an output folder such as ``--plot DIR``,
        checked by :func:`check_output_dir`); the folders created here are removed by
        :meth:`discard` unless :meth:`commit` ran first. Returns ``folder`` as a :class:`Path`."""
        folder = Path(folder)
        missing = []
        p = folder
        while not p.exists() and p != p.parent:
            missing.append(p)
            p = p.parent
        for p in reversed(missing):
            if p.exists():              # a ``..`` resolved through a folder just made
                continue
            p.mkdir()
            self._made.append(p)
        return folder

    def temp_for(self, dest) -> str:
        """A new empty file beside ``dest`` (created ``0o666`` less the umask) to write the
        output into; returns its path. Make it just before writing it: a write error that
        names no file is put on the newest one's destination (:meth:`for_user`)."""
        dest = Path(dest)
        folder = dest.parent if str(dest.parent) else Path(".")
        while True:
            tmp = folder / f".{dest.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
            self._dest_of[str(tmp)] = dest
            self._writing = dest
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue
            os.close(fd)
            break
        self._pending.append((str(tmp), dest))
        return str(tmp)

    def add_json(self, dest, doc, **dump_args) -> None:
        """Write ``doc`` as JSON (indent 1, trailing newline; ``dump_args`` to
        :func:`json.dump`) into a new temporary file for ``dest`` (:meth:`temp_for`)."""
        with open(self.temp_for(dest), "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, **dump_args)
            f.write("\n")

    def commit(self):
        """Rename every temporary file onto its destination, all or nothing: each existing
        destination is first kept aside as a hard link (a copy where the filesystem has no
        hard links); if a rename fails, the destinations already renamed are put back (the
        old file restored, a new one removed) and the :class:`OSError` is raised. Raises
        :class:`UserError` before renaming anything if a destination exists and is not a
        regular file. Limits: each rename is atomic but the set is not: a crash or kill
        between two renames, or another process writing the same paths meanwhile, can still
        leave a mix of old and new files (and a ``.bak`` file beside them)."""
        for _, dest in self._pending:
            _refuse_special(Path(dest), "output")
        backups, done = [], []
        try:
            for tmp, dest in self._pending:
                self._writing = dest            # a backup copy on a full disk names it
                bak = None
                if os.path.lexists(dest):
                    bak = f"{tmp}.bak"
                    self._dest_of[bak] = dest
                    try:
                        os.link(dest, bak)
                    except OSError:
                        shutil.copy2(dest, bak)
                backups.append(bak)
                os.replace(tmp, dest)
                done.append((dest, bak))
        except BaseException:           # an OSError, or Ctrl-C / SIGTERM between two renames
            for dest, bak in reversed(done):
                try:
                    if bak is None:
                        os.unlink(dest)
                    else:
                        os.replace(bak, dest)
                except OSError:
                    pass
            raise
        finally:
            for bak in backups:
                if bak is not None:
                    try:
                        os.unlink(bak)
                    except OSError:
                        pass
        COMMITTED.extend(Path(dest) for _, dest in self._pending)
        written = {os.path.abspath(dest) for _, dest in self._pending}
        self._pending = []
        self._made = []
        stale, self._stale = self._stale, []
        for path in stale:              # best effort: the new outputs are in place already
            if os.path.abspath(path) not in written:
                try:
                    path.unlink(missing_ok=True)
                except OSError:         # a folder of the user's by that name, a read-only one
                    pass

    def discard(self):
        self._stale = []
        for tmp, _ in self._pending:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        self._pending = []
        for folder in reversed(self._made):         # deepest first; only if still empty
            try:
                folder.rmdir()
            except OSError:
                pass
        self._made = []


@contextlib.contextmanager
def atomic_outputs(error):
    """A block that writes output files: yields an :class:`AtomicOutputs`, commits its files
    when the block completes and discards them in any case (so after a failure none is left).
    An :class:`OSError` in the block or the commit becomes a :class:`UserError` with the
    message ``error(exc)``, ``exc`` naming the destination rather than its temporary file
    (:meth:`AtomicOutputs.for_user`); with ``error`` None, that :class:`OSError` itself."""
    outputs = AtomicOutputs()
    try:
        yield outputs
        outputs.commit()
    except OSError as exc:
        if error is None:
            raise outputs.for_user(exc) from None
        raise UserError(error(outputs.for_user(exc))) from None
    finally:
        outputs.discard()


def write_json(path, doc, *, option: str = "--json", **dump_args) -> None:
    """Write ``doc`` as JSON to ``path`` atomically (indent 1, trailing newline). An
    :class:`OSError` becomes a :class:`UserError` naming ``option`` and the file."""
    with atomic_outputs(lambda exc: f"{option} {path}: cannot write ({exc})") as outputs:
        outputs.add_json(path, doc, **dump_args)

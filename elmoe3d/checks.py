"""What counts as an integer or a real number where a user gives one, written once; and the
names a misspelt one likely meant (:func:`did_you_mean`).

Python's ``bool`` is an ``int`` (``True + True == 2``) and NumPy's ``np.True_`` compares as
1, so a flag passed where a count belongs would run as 1 (one batch, one bit, one PE) instead
of being refused. Every check of a user's number (the golden model, the host layer, the
hardware blocks' parameters, the CLI's files) goes through :func:`is_int` / :func:`is_real`,
and a range through :func:`check_int`, so they agree on what they take and on what the error
says.

Hardware parameters take Python ints only (``numpy=False``): Amaranth's shapes refuse a NumPy
integer (``unsigned(np.int64(4))`` raises ``TypeError``), so a block checks for it up front
and names the parameter (:func:`elmoe3d.hw.checked.check_param`).
"""

from __future__ import annotations

import difflib

import numpy as np


__all__ = ["is_int", "is_real", "expected_int", "python_int_hint", "check_int", "parse_int",
           "parse_bytes", "BYTE_UNITS", "close_names", "did_you_mean"]


def is_int(value, *, numpy: bool = True) -> bool:
    """``True`` for an integer: a Python ``int`` or (with ``numpy``) a NumPy integer scalar;
    never a bool (Python's or NumPy's)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (int, np.integer) if numpy else int)


def is_real(value) -> bool:
    """``True`` for a real number: a Python or NumPy integer or float (NaN and the infinities
    included: a caller that needs a finite value checks that itself); never a bool."""
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (int, float, np.integer, np.floating))


def expected_int(lo: int | None = None, hi: int | None = None) -> str:
    """The words for an integer in ``[lo, hi]`` (either bound may be open): "a positive
    integer" for ``lo = 1``, "an integer >= 0", "an integer in 0..15"."""
    if hi is not None:
        return f"an integer in {lo}..{hi}" if lo is not None else f"an integer <= {hi}"
    if lo == 1:
        return "a positive integer"
    return f"an integer >= {lo}" if lo is not None else "an integer"


def python_int_hint(value) -> str:
    """The words ``" (a Python int)"`` for a NumPy integer, else ``""``: what an error of a
    check that takes Python ints only (``numpy=False``) adds after its "expected ...", so
    that a NumPy count refused there does not read as a wrong value."""
    return " (a Python int)" if is_int(value) and not isinstance(value, int) else ""


def check_int(name: str, value, lo: int | None = None, hi: int | None = None, *,
              numpy: bool = True, error: type[Exception] = ValueError) -> int:
    """``value`` as a Python ``int`` if it is an integer (:func:`is_int`) in ``[lo, hi]``.

    Raises
    ------
    error (``ValueError`` unless given)
        ``"{name}: expected a positive integer, got 0"`` (the words from
        :func:`expected_int`); a NumPy integer where ``numpy=False`` is named as such.
    """
    if not is_int(value, numpy=numpy) or (lo is not None and value < lo) \
            or (hi is not None and value > hi):
        hint = "" if numpy else python_int_hint(value)
        raise error(f"{name}: expected {expected_int(lo, hi)}{hint}, got {value!r}")
    return int(value)


def parse_int(name: str, text, lo: int | None = None, hi: int | None = None, *,
              error: type[Exception] = ValueError) -> int:
    """``text`` (a command line's string) as an integer in ``[lo, hi]``: :func:`check_int`'s
    check and words, with text that is no integer named as given (``got 'abc'``).

    Raises
    ------
    error (``ValueError`` unless given)
        ``"{name}: expected a positive integer, got 'abc'"``.
    """
    try:
        value = int(str(text))                      # (int() takes surrounding spaces)
    except ValueError:
        value = text                                # not a number: named as given
    return check_int(name, value, lo, hi, error=error)


#: The unit suffixes :func:`parse_bytes` takes (case-blind), in bytes: SI (kB = 1000) and IEC
#: (KiB = 1024).
BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(name: str, text, *, error: type[Exception] = ValueError) -> int:
    """``text`` (a command line's string) as a whole number of bytes >= 0: an integer
    (``4000000``, ``4_000_000``), a number in e-notation that is whole (``1e9``, ``1.5e9``), or
    either with a unit of :data:`BYTE_UNITS` (``512MiB``, ``1.5 GB``).

    Raises
    ------
    error (``ValueError`` unless given)
        ``"{name}: expected a whole number of bytes >= 0 (4000000, 1e9, 512MiB or 1.5GB), got
        '1.5'"`` (without ``name``, from "expected"), for a fraction of a byte, a negative, a
        non-finite or no number.
    """
    from decimal import Decimal, InvalidOperation
    import re
    match = re.fullmatch(r"\s*([^a-zA-Z\s]+(?:[eE][-+]?\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match[2].lower() if match else ""
    value = None
    if match and (unit in BYTE_UNITS or not unit):
        try:
            number = Decimal(match[1].replace("_", "")) * BYTE_UNITS.get(unit or "b")
        except InvalidOperation:
            number = None
        if number is not None and number.is_finite() and number >= 0 \
                and number == number.to_integral_value():
            value = int(number)
    if value is None:
        raise error(f"{name + ': ' if name else ''}expected a whole number of bytes >= 0 "
                    f"(4000000, 1e9, 512MiB or 1.5GB), got {str(text)!r}")
    return value


def close_names(key, known, given=()) -> list:
    """The names of ``known`` close to ``key`` (:func:`difflib.get_close_matches`, at most 3,
    best first) that the section does not already give (``given``): what a misspelt key
    likely meant. A dotted key (``tile.rowz``) is matched on its last part against the known
    names of the same prefix only, so the shared prefix does not make every one look close."""
    key = str(key)
    given = {str(g) for g in given}
    prefix, dot, last = key.rpartition(".")
    pool = {}
    for k in map(str, known):
        k_prefix, k_dot, k_last = k.rpartition(".")
        if k not in given and k_prefix == prefix and bool(k_dot) == bool(dot):
            pool.setdefault(k_last, k)
    # a name of 3 letters or fewer is close to too much at difflib's 0.6 ('warp' to 'ar'):
    # such a name only for a key of about its length ('pez' to 'pes')
    return [pool[m] for m in difflib.get_close_matches(last, list(pool), n=3)
            if len(m) > 3 or abs(len(last) - len(m)) <= 1]


def did_you_mean(key, known, given=(), *, only_one: bool = False) -> str:
    """`` (did you mean 'pes'?)`` with the names of ``known`` close to ``key``
    (:func:`close_names`), or nothing when none is; ``only_one``: nothing either when
    several are (``16gb`` is as close to ``4gb`` as to ``8gb``: no guess)."""
    close = close_names(key, known, given)
    if not close or only_one and len(close) > 1:
        return ""
    return f" (did you mean {' or '.join(map(repr, close))}?)"

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
           "parse_bytes", "BYTE_UNITS", "BYTES_MAX", "close_names", "did_you_mean", "meant"]


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


#: The unit suffixes :func:`parse_bytes` takes, in bytes: SI (kB = 1000) and IEC (KiB =
#: 1024). The prefix is taken in any case, the ``B`` only as a capital: ``Gb`` is a gigabit.
BYTE_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}

#: The largest byte count :func:`parse_bytes` takes: 2^63 - 1 (what an int64 holds).
BYTES_MAX = 2**63 - 1


def parse_bytes(name: str | None, text, *, error: type[Exception] = ValueError) -> int:
    """``text`` (a command line's string) as a whole number of bytes in 0..2^63 - 1: an
    integer (``4000000``, ``4_000_000``), a decimal number in e-notation that is whole
    (``1e9``, ``1.5e9``, ``1.e3``), or either with a unit of :data:`BYTE_UNITS` (``512MiB``,
    ``1.5 GB``), worked exactly (no rounding of long numbers; at most 100 characters).

    Raises
    ------
    error (``ValueError`` unless given)
        ``"{name}: expected a whole number of bytes >= 0 (4000000, 1e9, 512MiB or 1.5GB), got
        '1.5'"`` (without ``name``, from "expected"), for a fraction of a byte, a negative or
        no number; a unit in bits (``Gb``; all lowercase, ``4gb`` or ``4gib``, with both byte
        units of its prefix: the paper writes 4 GiB of HB as 4gb), the ambiguous ``KB`` and a
        count beyond 2^63 - 1 are named as such.
    """
    from fractions import Fraction
    import re
    given = str(text)
    shown = repr(given.strip()[:40]) + ("..." if len(given.strip()) > 40 else "")
    where = f"{name}: " if name else ""
    expected = (f"{where}expected a whole number of bytes >= 0 (4000000, 1e9, 512MiB or "
                f"1.5GB), got {shown}")
    beyond = f"{where}{shown}: beyond {BYTES_MAX:,} bytes"
    match = re.fullmatch(r"\s*((?:[0-9]+(?:_[0-9]+)*)?(?:\.(?:[0-9]+(?:_[0-9]+)*)?)?)"
                         r"(?:[eE]([-+]?[0-9]+))?\s*([A-Za-z]*)\s*", given, re.ASCII)
    if len(given) > 100 or match is None or not re.search(r"[0-9]", match[1]):
        raise error(expected)
    digits, unit = match[1].replace("_", ""), match[3]
    scale = 1
    if unit:
        key = next((u for u in BYTE_UNITS if u.lower() == unit.lower()), None)
        if key is None:
            raise error(expected)
        if unit.islower() and len(unit) > 1:
            # "4gb", "4gib": bits by the letter, but the paper's "4gb" (paper --hb 4gb) is
            # bytes: name both byte units of the prefix, as for KB
            dec, bin_ = (next(u for u in BYTE_UNITS if u.lower() == unit[0] + tail)
                         for tail in ("b", "ib"))
            raise error(f"{where}{shown}: a lowercase b is a bit; for bytes write {dec} "
                        f"(10^{len(str(BYTE_UNITS[dec])) - 1}) or {bin_} "
                        f"(2^{BYTE_UNITS[bin_].bit_length() - 1})")
        if unit[-1] != "B":
            raise error(f"{where}{shown}: {unit} is a unit of bits; bytes are {key}")
        if unit == "KB":
            raise error(f"{where}{shown}: KB is 1,000 or 1,024 bytes; write kB (1,000) or "
                        f"KiB (1,024)")
        scale = BYTE_UNITS[key]
    whole, _, frac = digits.partition(".")
    whole, frac = whole.lstrip("0"), frac.rstrip("0")
    if not whole + frac:
        return 0                                # 0, 0.000e30, 0e99999
    exponent = int(match[2] or 0)               # at most 100 characters: a small number
    # numbers are not built before their size is known (1e90 x 1 TiB would be): the leading
    # digit's place beyond 10^25 is beyond 2^63 whatever the unit, and below 10^-13 is below
    # one byte whatever the unit (1 TiB is 1.1 x 10^12 bytes)
    lead = (len(whole) or -(len(frac) - len(frac.lstrip("0")))) + exponent
    if lead > 25:
        raise error(beyond)
    if lead < -13:
        raise error(expected)
    value = Fraction(int(whole + frac), 10 ** len(frac)) * Fraction(10) ** exponent * scale
    if value.denominator != 1:
        raise error(expected)
    if value > BYTES_MAX:
        raise error(beyond)
    return int(value)


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
    if only_one and len(close) > 1:
        return ""
    return meant(close)


def meant(names) -> str:
    """`` (did you mean 'a' or 'b'?)`` for ``names`` (found by the caller's own matching), or
    nothing when there are none: :func:`did_you_mean`'s words, written once."""
    names = list(names)
    return f" (did you mean {' or '.join(map(repr, names))}?)" if names else ""

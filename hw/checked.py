"""Blocks whose parameters are checked before they exist, and blocks only inspected.

Amaranth warns (:class:`amaranth.hdl.UnusedElaboratable`, "created but never used") about
every elaboratable that is garbage-collected without having been elaborated. Two kinds of
object would trip it without being a mistake, and this module gives both a public way out:

* a block whose constructor rejects its parameters: :class:`CheckedComponent` runs the
  block's :meth:`~CheckedComponent.check` before the object is created, so a bad parameter
  raises and nothing half-built is left to collect;
* a block built only to read its properties (a latency, a width, a parameter) and never
  elaborated: construct it, read it and drop it inside :func:`inspection`. A file whose
  blocks are all of that kind can instead start with Amaranth's linter comment
  ``# amaranth: UnusedElaboratable=no`` (it applies to objects created in that file).
"""

from __future__ import annotations

import gc
import inspect
import warnings
from contextlib import contextmanager

from amaranth.hdl import UnusedElaboratable
from amaranth.lib import wiring

from ..checks import check_int


__all__ = ["constructor_params", "CheckedComponent", "inspection", "check_param"]


def check_param(name: str, value, lo: int | None = 1, hi: int | None = None) -> int:
    """``value`` if it is an elaboration parameter in ``[lo, hi]``: a Python ``int``, not a
    bool and not a NumPy integer (Amaranth's shapes refuse one); ``ValueError`` naming
    ``name`` otherwise (:func:`elmoe3d.checks.check_int`)."""
    return check_int(name, value, lo, hi, numpy=False)


def constructor_params(cls, *args, **kwargs) -> dict:
    """The parameters of ``cls.__init__`` for a call ``cls(*args, **kwargs)``, by name, the
    defaults filled in (``TypeError`` for arguments it does not take, as the call would)."""
    bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)
    bound.apply_defaults()
    params = dict(bound.arguments)
    params.pop("self")
    return params


class CheckedComponent(wiring.Component):
    """A :class:`amaranth.lib.wiring.Component` whose constructor arguments are validated by
    the classmethod :meth:`check` before the object exists.

    ``check`` receives every parameter of the subclass's ``__init__`` by keyword, defaults
    filled in (the defaults are written once, in ``__init__``), and raises the block's
    documented ``TypeError`` / ``ValueError``; ``__init__`` then only stores and derives.
    Amaranth's "created but never used" bookkeeping records the caller of the constructor
    (as for any component), not this class.
    """

    def __new__(cls, *args, **kwargs):
        cls.check(**constructor_params(cls, *args, **kwargs))
        return super().__new__(cls, src_loc_at=1)

    @classmethod
    def check(cls, **params) -> None:
        """Raise ``TypeError`` / ``ValueError`` (naming the parameter) if ``params`` (the
        ``__init__`` keywords) are not valid. Subclasses override it."""


@contextmanager
def inspection():
    """Scope in which blocks are built only to be inspected, never elaborated.

    Blocks constructed and dropped inside the ``with`` body raise no
    :class:`~amaranth.hdl.UnusedElaboratable` warning. Amaranth emits that warning when the
    garbage collector frees the block (its bookkeeping holds a reference cycle), so the scope
    ends with a collection; drop every reference to the inspected blocks before it ends (a
    block that outlives the scope is not covered). Error paths included: the collection runs
    when the body raises too. Keep the scope small: unrelated garbage that the collection
    happens to free is not warned about either.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UnusedElaboratable)
        try:
            yield
        finally:
            gc.collect()

"""The private Amaranth names the synthesis flow uses, in one place (issue 23: no private
Amaranth API elsewhere).

Tested with amaranth 0.5.10 (``constraints.txt``; ``pyproject.toml`` allows ``>=0.5.10,<0.6``).
:data:`PRIVATE_NAMES` lists every one; :func:`check` (run by ``tests/tools/test_synth.py``)
raises naming the first one a newer Amaranth lacks.

* ``Module._named_submodules`` / ``Module._anon_submodules`` (:func:`submodules`,
  :func:`replace_submodules`): hollowing (:func:`elmoe3d.synth.blocks.hollow`) must see a
  block's direct children *before* they are elaborated, to put a black box in the place of a
  registered sub-block (a paper-size tensor tile is never elaborated). Amaranth's public API
  reads children only through ``Fragment.get``, which elaborates every child (and is itself
  undocumented in 0.5); ``m.submodules[name]`` reads a named child but cannot list them, nor
  reach anonymous ones, nor replace one.
* ``Module._domains`` (:func:`module_domains`): the clock domains a module defines
  (``m.domains.x = ClockDomain(...)``), which the RTL export's hierarchical form refuses
  (:mod:`elmoe3d.synth.export`: a child converted alone would lose the domain's clock edge
  and reset kind); Amaranth reads them only through its private fragment API.
* ``amaranth.hdl._nir.Netlist.check_comb_cycles`` (:func:`no_comb_cycle_check`): the
  combinational-loop check ``rtlil.convert`` runs cannot be switched off publicly; on the
  hollow PEs of the paper-size control fit it dominates conversion (measured with 0.5.10: the
  8-lane PE 6 s without it, 31 s with it; the 16-lane PE not done after 5 minutes). The loop
  check is not lost: Yosys ``check`` in :mod:`elmoe3d.synth.flow` reports loops.
* ``amaranth.hdl._ir.PortDirection`` (:func:`port_direction`): ``rtlil.convert``'s ``ports=``
  dict takes a port's direction only as this enum. Needed for a block with constant signature
  members (an always-ready stream's ``ready``), which ``convert`` refuses as ports when it
  derives them itself: :func:`elmoe3d.synth.blocks.convert_ports` passes the rest with their
  declared directions (a bare list would let Amaranth infer them, and an output nothing
  drives would become an input).
"""

from __future__ import annotations

import contextlib

from amaranth.hdl import Module
from amaranth.hdl import _ir, _nir
from amaranth.lib import wiring

from ..hw.checked import inspection


__all__ = ["PRIVATE_NAMES", "check", "submodules", "replace_submodules", "no_comb_cycle_check",
           "port_direction", "module_domains"]


#: Every private Amaranth name used here: (owner, attribute, what it is).
PRIVATE_NAMES = (
    ("amaranth.hdl.Module", "_named_submodules", "instance dict: name -> (submodule, src_loc)"),
    ("amaranth.hdl.Module", "_anon_submodules", "instance list of (submodule, src_loc)"),
    ("amaranth.hdl.Module", "_domains", "instance dict: name -> ClockDomain it defines"),
    ("amaranth.hdl._nir.Netlist", "check_comb_cycles", "method run by rtlil.convert"),
    ("amaranth.hdl._ir", "PortDirection", "enum of rtlil.convert's port directions"),
)


def check() -> None:
    """Raise ``RuntimeError`` naming the first of :data:`PRIVATE_NAMES` this Amaranth lacks
    (or has in another form)."""
    with inspection():                      # an empty module, only looked at
        m = Module()
        found = {"_named_submodules": isinstance(getattr(m, "_named_submodules", None), dict),
                 "_anon_submodules": isinstance(getattr(m, "_anon_submodules", None), list),
                 "_domains": isinstance(getattr(m, "_domains", None), dict),
                 "check_comb_cycles": callable(getattr(_nir.Netlist, "check_comb_cycles",
                                                       None)),
                 "PortDirection": all(hasattr(getattr(_ir, "PortDirection", None), d)
                                      for d in ("Input", "Output"))}
        del m
    for owner, name, what in PRIVATE_NAMES:
        if not found[name]:
            raise RuntimeError(f"this Amaranth has no {owner}.{name} ({what}), which "
                               f"elmoe3d.synth.amaranth_internals uses (tested with 0.5.10)")


def submodules(m: Module) -> list:
    """The direct children of the elaborated, not yet converted ``m``: ``(name, submodule)``,
    the named ones first in the order added, then the anonymous ones (name ``None``)."""
    return ([(name, sub) for name, (sub, _src) in m._named_submodules.items()]
            + [(None, sub) for sub, _src in m._anon_submodules])


def module_domains(m: Module) -> list:
    """The clock domains (``ClockDomain``) the elaborated ``m`` defines itself."""
    return list(m._domains.values())


def replace_submodules(m: Module, replace) -> None:
    """Put ``replace(name, submodule)`` in the place of each direct child of ``m`` (order of
    :func:`submodules`; a result ``None`` keeps the child). ``m`` must not be converted yet."""
    named = m._named_submodules
    for name, (sub, src_loc) in list(named.items()):
        new = replace(name, sub)
        if new is not None:
            named[name] = (new, src_loc)
    anon = m._anon_submodules
    for i, (sub, src_loc) in enumerate(anon):
        new = replace(None, sub)
        if new is not None:
            anon[i] = (new, src_loc)


@contextlib.contextmanager
def no_comb_cycle_check():
    """Within the block, ``rtlil.convert`` skips Amaranth's combinational-loop check (see the
    module docstring); restored on exit, also on an error."""
    saved = _nir.Netlist.check_comb_cycles
    _nir.Netlist.check_comb_cycles = lambda self: None
    try:
        yield
    finally:
        _nir.Netlist.check_comb_cycles = saved


def port_direction(flow):
    """The ``rtlil.convert`` port direction of a signature member of ``flow``
    (``wiring.In`` -> input, ``wiring.Out`` -> output)."""
    return _ir.PortDirection.Input if flow == wiring.In else _ir.PortDirection.Output

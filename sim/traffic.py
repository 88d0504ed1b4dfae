"""Stream traffic patterns: the one definition every bench and test draws its idle source cycles
and backpressure from.

A :class:`Traffic` is two probabilities per cycle (or per item):

* ``idle``: a source offers nothing (``valid`` low) before an item, in a cycle;
* ``backpressure``: a sink is not ready (``ready`` low) in a cycle;

and optional per-port values that replace them for the named ports (a source's port takes
``idle``, a sink's ``backpressure``), e.g. the PE's ``ld`` source idling more often than ``cmd``.
A driver states its ports with :meth:`Traffic.for_ports` before it reads the probabilities, so
a misspelt port name is a ``ValueError``, never a value silently ignored.
The patterns only hold numbers: the random draws belong to the drivers
(:mod:`elmoe3d.sim.cocotb_streams`, :mod:`elmoe3d.sim.amaranth_streams` and the benches' own),
so a pattern gives the same draws, and the same cycle counts, wherever it is used.

Named patterns (:data:`TRAFFIC`, by name; the cocotb benches parametrize over
:data:`BENCH_TRAFFIC` and ``elmoe3d run --traffic`` takes the same names):

* :data:`SMOOTH` (``smooth``): every source always valid, every sink always ready;
* :data:`STALLS` (``stalls``): idle 0.3, backpressure 0.4 on every port (the benches);
* :data:`ROUGH` (``rough``): the PE's Amaranth-simulator tests, idle 0.3 on ``cmd``, 0.4 on
  ``ld`` and ``link_i``, backpressure 0.5 on ``o`` and ``link_o``.

:data:`FLOWS` is the sweep of the single-stream pipeline tests (tensor tile, VPU units): free,
idle only, backpressure only, both (:data:`IDLE_STALL`; :data:`FLOW_PAIRS`, :data:`FLOW_IDS`).
:data:`LIGHT` (idle 0.2, backpressure 0.3) is the lighter pattern of their single corner runs
(the tile's saturating accumulations, the SwiGLU unit's two-stage multiplier).

Section 8 of the design brief: stream benches run with and without idle cycles and
backpressure.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


__all__ = ["Traffic", "SMOOTH", "STALLS", "ROUGH", "TRAFFIC", "BENCH_TRAFFIC", "IDLE_STALL",
           "FLOWS", "FLOW_PAIRS", "FLOW_IDS", "LIGHT", "traffic"]


@dataclass(frozen=True)
class Traffic:
    """A stream traffic pattern.

    Parameters
    ----------
    name : str
        The name recorded with the results (``smooth``, ``stalls``, ...).
    idle : float
        Probability, in [0, 1), that a source offers nothing before an item (in a cycle).
    backpressure : float
        Probability, in [0, 1), that a sink is not ready in a cycle.
    ports : mapping of str to float
        Per-port probabilities replacing ``idle`` (a source's port) or ``backpressure`` (a
        sink's port) for the ports named, each in [0, 1).

    known : tuple of str
        The ports of the driver using the pattern (:meth:`for_ports`; empty: not stated yet).
        Not part of the pattern: ignored by ``==`` and ``hash``.

    Raises ``ValueError`` on a probability outside [0, 1) (1 would never move an item), an
    empty name, or, once ``known`` is given, a name in ``ports`` that is not one of them.
    """

    name: str
    idle: float = 0.0
    backpressure: float = 0.0
    ports: Mapping[str, float] = field(default_factory=dict)
    known: tuple = field(default=(), compare=False, repr=False)

    def __post_init__(self):
        if not self.name:
            raise ValueError("Traffic: the name must not be empty")
        object.__setattr__(self, "ports", MappingProxyType(dict(self.ports)))
        object.__setattr__(self, "known", tuple(self.known))
        checks = [("idle", self.idle), ("backpressure", self.backpressure)]
        checks += [(f"ports[{port!r}]", p) for port, p in self.ports.items()]
        for what, p in checks:
            if not 0.0 <= p < 1.0:
                raise ValueError(f"Traffic {self.name!r}: {what} = {p} is not a probability "
                                 f"in [0, 1)")
        for port in self.ports:
            self._check_port(port)

    def __hash__(self):
        return hash((self.name, self.idle, self.backpressure, tuple(sorted(self.ports.items()))))

    def _check_port(self, port: str):
        if self.known and port not in self.known:
            raise ValueError(f"Traffic {self.name!r}: unknown port {port!r}; the ports are "
                             f"{', '.join(self.known)}")

    def for_ports(self, *ports: str) -> "Traffic":
        """This pattern for a driver whose stream ports are ``ports`` (sources and sinks): the
        per-port values must name only those, and :meth:`idle_at` / :meth:`backpressure_at`
        then answer only for those. Raises ``ValueError`` naming an unknown port and the
        known ones, or on no port given."""
        if not ports:
            raise ValueError(f"Traffic {self.name!r}: for_ports needs at least one port")
        return dataclasses.replace(self, known=ports)

    def idle_at(self, port: str) -> float:
        """Probability that source ``port`` offers nothing before an item; ``ValueError`` for a
        port not among :meth:`for_ports`' ports (once stated)."""
        self._check_port(port)
        return self.ports.get(port, self.idle)

    def backpressure_at(self, port: str) -> float:
        """Probability that sink ``port`` is not ready in a cycle; ``ValueError`` for a port not
        among :meth:`for_ports`' ports (once stated)."""
        self._check_port(port)
        return self.ports.get(port, self.backpressure)

    @property
    def rate(self) -> float:
        """Fraction of cycles an item can move on a source-to-sink path with no per-port
        values, ``(1 - idle) * (1 - backpressure)``: the benches scale their cycle budgets by
        its inverse."""
        return (1 - self.idle) * (1 - self.backpressure)

    def but(self, name: str, **changes) -> "Traffic":
        """This pattern named ``name`` with ``changes`` (``idle``, ``backpressure``, or port
        names, which are added to :attr:`ports`)."""
        fields = {k: changes.pop(k) for k in ("idle", "backpressure") if k in changes}
        return dataclasses.replace(self, name=name, ports={**self.ports, **changes}, **fields)


#: Every source always valid, every sink always ready.
SMOOTH = Traffic("smooth")
#: Idle source cycles and backpressure on every port (the cocotb benches' ``stalls``).
STALLS = Traffic("stalls", idle=0.3, backpressure=0.4)
#: The PE's Amaranth-simulator tests: ``cmd`` idles 0.3, ``ld`` and ``link_i`` 0.4; ``o`` and
#: ``link_o`` not ready 0.5.
ROUGH = Traffic("rough", idle=0.3, backpressure=0.5, ports={"ld": 0.4, "link_i": 0.4})

#: The named patterns, by name.
TRAFFIC = MappingProxyType({t.name: t for t in (SMOOTH, STALLS, ROUGH)})
#: The names a cocotb bench runs its streaming tests with (``smooth``, ``stalls``).
BENCH_TRAFFIC = (SMOOTH.name, STALLS.name)

#: Idle source cycles and heavy backpressure together: the last of :data:`FLOWS`.
IDLE_STALL = Traffic("idle+stall", idle=0.3, backpressure=0.6)
#: The flow-control sweep of the single-stream pipeline tests (tensor tile, VPU units): no
#: idle and no backpressure, idle only, backpressure only, both (:data:`FLOW_PAIRS`,
#: :data:`FLOW_IDS`).
FLOWS = (SMOOTH.but("free"), Traffic("idle", idle=0.4), Traffic("stall", backpressure=0.5),
         IDLE_STALL)
#: :data:`FLOWS` as ``(idle, backpressure)`` pairs (``pytest.mark.parametrize("idle,stall", ...)``
#: of :func:`elmoe3d.sim.amaranth_streams.drive_pipeline`), and their names.
FLOW_PAIRS = tuple((t.idle, t.backpressure) for t in FLOWS)
FLOW_IDS = tuple(t.name for t in FLOWS)
#: Light idle cycles and backpressure: the single corner runs of the pipeline tests (the tensor
#: tile's saturating accumulations, the SwiGLU unit with a two-stage multiplier).
LIGHT = Traffic("light", idle=0.2, backpressure=0.3)


def traffic(name: str) -> Traffic:
    """The named pattern ``name`` of :data:`TRAFFIC`; ``ValueError`` naming the known ones."""
    try:
        return TRAFFIC[name]
    except KeyError:
        raise ValueError(f"unknown traffic {name!r}: one of {', '.join(TRAFFIC)}") from None

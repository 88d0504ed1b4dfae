"""The run backends of ``elmoe3d run``: one interface, one module per backend, chosen from a
registry (``docs/host.md``).

Each backend runs the host's compiled steps (:mod:`..compiler`: a routing trace scheduled,
placed on the die's PE groups and compiled) and returns one record per step
(:func:`.records.step_record`, a plain dict, JSON-ready); :func:`.records.summarise` totals
them.

* ``golden`` (:mod:`.golden`) -- the per-PE programs on the multi-PE functional simulation,
  every group checked bit for bit against ``ref_moe``;
* ``rtl`` (:mod:`.rtl`) -- the golden run, then every PE program on the PE's Verilog
  (``elmoe3d.sim.bench_host``: cocotb + Verilator);
* ``fpga`` (:mod:`.fpga`) -- the golden run, then every PE program on an FPGA board over its
  UART (the driver :mod:`elmoe3d.sw.host.fpga`);
* ``perf`` (:mod:`.perf`) -- the analytical performance model (:mod:`elmoe3d.sw.host.perf`).

:class:`Backend` is the interface: what a backend declares (configurations, options, whether
the golden run keeps its jobs, what it compares with) and does (:meth:`~Backend.session`,
:meth:`~Backend.run`, :meth:`~Backend.report`). :data:`BACKENDS` maps each name to its
backend; :func:`check_request` refuses what a backend cannot serve, one line naming the option.

Importing this package imports NumPy, the golden model and the host layer only: the RTL
backend imports cocotb and Amaranth (``elmoe3d.sim.bench_host``) when it runs, the FPGA
driver imports pyserial when it opens a port.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, ClassVar

from ....errors import UserError


__all__ = ["Backend", "Option", "RunContext", "BackendRun", "Session", "BACKENDS",
           "SMALL_CONFIG", "backend_options", "check_request",
           "GoldenLayer", "step_record", "summarise", "traffic_bytes", "merge_layers",
           "run_golden", "run_perf"]

#: The configuration the golden model's synthetic shapes run on: the only one of the
#: backends with :attr:`Backend.small_only`.
SMALL_CONFIG = "small"


@dataclass(frozen=True)
class Option:
    """A command-line option of one backend, ``--NAME METAVAR`` (``help`` without the
    backend's name; ``type`` parses the value). Not given: None. Given with another backend:
    refused (:func:`check_request`). ``needed``: the backend cannot run without it, and its
    refusal says what the value is."""

    name: str
    metavar: str
    help: str
    type: Callable = str
    needed: str | None = None


@dataclass(frozen=True)
class RunContext:
    """What a backend's :meth:`~Backend.run` gets beside the steps: ``arch`` (the
    :class:`~elmoe3d.config.ArchConfig`), ``model`` (the preset whose shapes run: synthetic
    ones on the small configuration), ``seed`` (of the synthetic weights and activations),
    ``label`` (the run's, e.g. ``"depth 4"``), ``options`` (``{name: value}``: every
    backend's :class:`Option` values, None when not given, and the run's ``"traffic"``, the
    RTL bench's stream pattern), ``session`` (what :meth:`~Backend.session` yielded),
    ``progress`` (advanced once per step) and ``progress_factory(total, description)`` (a
    backend's own progress bars)."""

    arch: object
    model: object
    seed: int | None = None
    label: str = ""
    options: dict = field(default_factory=dict)
    session: object = None
    progress: Callable | None = None
    progress_factory: Callable | None = None


@dataclass
class BackendRun:
    """A backend's run: ``records`` (one per step, :func:`.records.step_record`),
    ``figures`` (its own figures, JSON-ready, filed under its name in the run's document;
    None: none) and ``lost_mismatches`` (mismatches of no step: a bench that lost cases,
    added to the summary's)."""

    records: list
    figures: dict | None = None
    lost_mismatches: int = 0


@dataclass(frozen=True)
class Session:
    """What a backend holds open over every run of one command: ``handle`` (the FPGA board)
    and ``doc`` (entries for the command's document, e.g. ``{"board": {...}}``)."""

    handle: object
    doc: dict


class Backend(abc.ABC):
    """A run backend (module docstring). Subclasses set the class attributes and
    :meth:`run`; the registry holds one instance of each."""

    #: The registry name (``elmoe3d run --backend NAME``).
    name: ClassVar[str]
    #: One line: what it runs and reports.
    description: ClassVar[str]
    #: True: runs :data:`SMALL_CONFIG` only (the synthetic shapes of the golden model).
    small_only: ClassVar[bool] = False
    #: True: the golden run keeps its jobs (:class:`.records.GoldenLayer`), to run them again.
    keeps_golden: ClassVar[bool] = False
    #: What its results are compared with, bit for bit (None: no comparison; then no
    #: ``compared`` / ``mismatches`` figures and no mismatch exit status).
    reference: ClassVar[str | None] = None
    #: True: the performance model's cycles of the same steps are reported beside its figures.
    perf_beside: ClassVar[bool] = True
    #: How its PE programs get their ``ld`` words (:data:`~elmoe3d.sw.host.perf_calib.FEEDS`);
    #: the perf model beside it runs at the same feed, so the two figures compare: the
    #: golden, RTL and FPGA backends run each PE program alone, a word a cycle.
    perf_feed: ClassVar[str] = "ideal"
    #: The command-line options only this backend takes.
    options: ClassVar[tuple] = ()

    @property
    def compares(self) -> bool:
        """Whether it compares its results with :attr:`reference` (counting mismatches)."""
        return self.reference is not None

    def check_options(self, options: dict) -> None:
        """Refuse a bad value of one of its :attr:`options` (:class:`UserError`, one line);
        ``options``: ``{name: value or None}``."""

    @contextlib.contextmanager
    def session(self, arch, options: dict):
        """Open what every run of one command shares, before the first run (so a missing
        device fails before any work); yields a :class:`Session` or None, closed on exit."""
        yield None

    @abc.abstractmethod
    def run(self, steps, ctx: RunContext) -> BackendRun:
        """Run ``steps`` (:class:`~..compiler.Step` list) and return their records."""

    def report(self, label: str, figures: dict) -> list:
        """Lines (Rich markup) that say its own ``figures`` (:attr:`BackendRun.figures`) of
        the run ``label``."""
        return []

    def __repr__(self):
        return f"<backend {self.name}>"


def backend_options() -> list:
    """Every backend's :class:`Option`, in registry order: ``[(backend, option)]``."""
    return [(b, opt) for b in BACKENDS.values() for opt in b.options]


def check_request(name: str, *, config: str, options: dict) -> Backend:
    """The backend ``name``, after refusing what it cannot serve, one :class:`UserError` line
    each, in this order: an option it needs missing; another backend's option given; a bad
    value of its own options (:meth:`Backend.check_options`); a configuration other than
    :data:`SMALL_CONFIG` for a :attr:`~Backend.small_only` backend. ``options``: ``{name:
    value or None}`` of :func:`backend_options`. Raises ``KeyError`` for an unknown name."""
    be = BACKENDS[name]
    for opt in be.options:
        if opt.needed and not options.get(opt.name):
            raise UserError(f"--backend {be.name}: needs --{opt.name} {opt.metavar}, "
                            f"{opt.needed}")
    own = {opt.name for opt in be.options}
    for other, opt in backend_options():
        if opt.name not in own and options.get(opt.name) is not None:
            raise UserError(f"--{opt.name}: only with --backend {other.name} (got --backend "
                            f"{be.name})")
    be.check_options(options)
    if be.small_only and config != SMALL_CONFIG:
        anywhere = " and ".join(b.name for b in BACKENDS.values() if not b.small_only)
        raise UserError(f"--backend {be.name}: runs the {SMALL_CONFIG} configuration only (the "
                        f"paper configurations are for the {anywhere} backend)")
    return be


from .records import GoldenLayer, merge_layers, step_record, summarise, traffic_bytes  # noqa: E402
from .golden import GoldenBackend, run_golden  # noqa: E402
from .rtl import RTLBackend  # noqa: E402
from .fpga import FPGABackend  # noqa: E402
from .perf import PerfBackend, run_perf  # noqa: E402

#: The run backends by name, in the order ``elmoe3d run --help`` lists them.
BACKENDS = MappingProxyType({b.name: b for b in (GoldenBackend(), RTLBackend(), FPGABackend(),
                                                 PerfBackend())})

"""Case records of the cocotb benches: written by the bench, read back by the host.

Every bench (``sim/bench_*.py``) keeps a list of case records (JSON-serialisable dicts, each
with at least ``case``, ``comparisons`` and ``mismatches``) per cocotb test and writes it to
``summary-<label>.json`` in the run folder, where ``<label>`` is the test name, with the value
of its one ``cocotb.parametrize`` argument appended for a parametrized variant
(``test_random/traffic=stalls`` writes ``summary-test_random-stalls.json``).

cocotb side: :func:`write_summary` and :class:`CaseRecorder` (the ``summary()`` context of a
test body). Host side: :func:`run_bench` (run the named tests of a bench module on a build,
read the records back into a :class:`BenchResult`) and :func:`read_records`. Also the
``arch`` entry of a bench's ``params.json``: :func:`arch_param` / :func:`arch_from_params`.

This module imports neither cocotb nor Amaranth.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..config import ArchConfig, preset
from . import runner
from .runner import SimulationError, load_params


__all__ = ["BenchResult", "CaseRecorder", "PRESETS", "arch_from_params", "arch_param",
           "failed_cases", "figure_prefix", "read_records", "run_bench", "summary_label",
           "write_summary"]

#: Preset names a bench's ``params["arch"]`` may hold instead of a full ArchConfig dict.
PRESETS = ("small", "mid", "paper-4gb", "paper-8gb")


def figure_prefix(number: int | None) -> str:
    """``"8. "`` before a bench table's title when ``elmoe3d bench`` prints it as its figure
    ``number``; ``""`` when the bench runs alone."""
    return "" if number is None else f"{number}. "


# -- params.json: the architecture -----------------------------------------------------------

def arch_param(arch: ArchConfig):
    """``params["arch"]`` for ``arch``: the preset name when ``arch`` is that preset
    unchanged, else ``arch.to_dict()``."""
    if arch.name in PRESETS and preset(arch.name) == arch:
        return arch.name
    return arch.to_dict()


def arch_from_params(params: dict, default: str = "small") -> ArchConfig:
    """The ArchConfig of ``params["arch"]`` (a preset name or an ArchConfig dict; ``default``
    when absent)."""
    arch = params.get("arch", default)
    return preset(arch) if isinstance(arch, str) else ArchConfig.from_dict(arch)


# -- cocotb side ------------------------------------------------------------------------------

def write_summary(test: str, records: list) -> Path:
    """Write ``records`` to ``summary-<test>.json`` in the run folder (``params["out_dir"]``,
    else the current folder, which cocotb makes the run folder); returns the path."""
    out = Path(load_params().get("out_dir") or os.getcwd())
    path = out / f"summary-{test}.json"
    path.write_text(json.dumps(records, indent=1))
    return path


def failed_cases(bad: list, field: str = "mode") -> str:
    """One line naming each failing record: ``<case> <field> (<traffic>): <error>`` or
    ``... : N mismatches, first: [details]``, joined by ``"; "``."""
    return "; ".join(f"{r['case']} {r.get(field) or ''} ({r['traffic']}): "
                     + (r.get("error") or f"{r['mismatches']} mismatches, first: "
                        f"{r['details'][:2]}") for r in bad)


class CaseRecorder:
    """Base of a cocotb bench object that records cases.

    Subclasses set ``dut``, ``test`` (the summary label) and ``records`` (a list), and define
    ``fail(case, message)`` (record a failed case that compares no values) and ``finish()``
    (write the summary, then fail the test if a case failed)."""

    def write_summary(self) -> Path:
        """Write the case records to ``summary-<test>.json`` in the run folder."""
        return write_summary(self.test, self.records)

    @contextlib.contextmanager
    def summary(self):
        """Context for a test body: an exception in it becomes a failed case ("test aborted",
        naming the exception) and the summary is written either way; on leaving,
        :meth:`finish` fails the test if any case failed."""
        try:
            yield self
        except Exception as exc:                       # noqa: BLE001 - recorded, then failed
            self.dut._log.error("%s aborted", self.test, exc_info=True)
            self.fail("test aborted", f"{type(exc).__name__}: {exc}")
        except BaseException:
            self.write_summary()
            raise
        self.finish()


# -- host side --------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchResult:
    """A host-side run of a bench: the runner's :class:`~elmoe3d.sim.runner.SimResult` and
    the case records of every test that ran, in run order."""

    sim: object
    records: list

    @property
    def comparisons(self) -> int:
        return sum(r["comparisons"] for r in self.records)

    @property
    def mismatches(self) -> int:
        return sum(r["mismatches"] for r in self.records)


def summary_label(testcase_name: str) -> str:
    """The summary label of a cocotb test result name: ``test_x/traffic=smooth`` ->
    ``test_x-smooth``; ``test_y`` -> ``test_y``."""
    base, _, param = testcase_name.partition("/")
    return f"{base}-{param.partition('=')[2]}" if param else base


def read_records(result) -> list:
    """The case records of every test of ``result`` (a SimResult), in run order; a test that
    wrote no summary adds none. Raises :class:`~elmoe3d.sim.runner.SimulationError` naming a
    summary file that cannot be read."""
    records = []
    for case in result.testcases:
        path = result.test_dir / f"summary-{summary_label(case.name)}.json"
        if path.is_file():
            try:
                records.extend(json.loads(path.read_text()))
            except (OSError, ValueError) as exc:
                raise SimulationError(f"{path}: cannot read the bench summary ({exc}); log "
                                      f"{result.log_file}") from None
    return records


def run_bench(built, *, test_module: str, tests, default_tests, params: dict, prefix: str,
              seed=None, check: bool = True) -> BenchResult:
    """Run the named ``tests`` (a name, a list, or None for ``default_tests``) of the cocotb
    module ``test_module`` on ``built`` with ``params``, in a run folder named
    ``<prefix>-<tests without "test_">`` (``/`` and ``=`` of a parametrized variant as ``_``:
    ``test_x/traffic=smooth`` -> ``x_traffic_smooth``); return the result and its records.
    With ``check=True`` a failing test raises :class:`~elmoe3d.sim.runner.SimulationFailure`."""
    tests = [tests] if isinstance(tests, str) else list(tests or default_tests)
    name = "-".join(t.removeprefix("test_").replace("/", "_").replace("=", "_")
                    for t in tests)
    result = runner.run(built, test_module=test_module, testcase=tests, params=params,
                        seed=seed, run_name=f"{prefix}-{name}", check=check)
    return BenchResult(sim=result, records=read_records(result))

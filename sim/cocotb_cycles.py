"""The per-cycle stream harness of the aggregation-link and streamline-ring cocotb benches
(:mod:`elmoe3d.sim.bench_agg_link`, :mod:`elmoe3d.sim.bench_ring`), and the failure lines of
their figures (``elmoe3d bench`` figure 8).

Every port of the DUT is driven from one per-cycle loop (:func:`run_cycles`): a
:class:`Source` presents its items with random idle cycles (garbage payloads while not valid),
a :class:`Sink` drops ``ready`` at random and checks the stream rule on what it takes (an
offered item stays valid and unchanged until taken). Streams are the Verilog ports Amaranth
emits for ``amaranth.lib.stream`` interfaces (``<port>__valid``, ``__payload``, ``__ready``);
cycles are :func:`elmoe3d.sim.cocotb_streams.cycle`. :class:`CaseRecords` collects a test's case
records, writes ``summary-<test>.json`` and fails the test if a case mismatched
(:meth:`CaseRecords.open` also gives the test its seeded random generator);
:func:`port_details`, :func:`word_mismatches` and :func:`words_compared` check the words of
every output port against the golden model. :func:`throughput_figures` is the figure dict of a
throughput run.
"""

from __future__ import annotations

import random

from cocotb.triggers import ReadOnly, RisingEdge

from . import cocotb_streams as streams
from .records import write_summary
from .runner import case_rng, resolve_seed


__all__ = ["Source", "Sink", "run_cycles", "mismatch_details", "port_details",
           "word_mismatches", "words_compared", "CaseRecords", "figure_failures",
           "throughput_figures", "join_figures", "failure_lines"]


class Source:
    """Presents ``items`` on stream ``prefix`` in order, idling with probability ``idle``."""

    def __init__(self, dut, prefix, items, rng, idle, bits):
        self.valid_sig = getattr(dut, f"{prefix}__valid")
        self.payload_sig = getattr(dut, f"{prefix}__payload")
        self.ready_sig = getattr(dut, f"{prefix}__ready")
        self.items, self.rng, self.idle, self.bits = list(items), rng, idle, bits
        self.pos, self.valid, self.taken = 0, False, []

    def drive(self):
        if not self.valid and self.pos < len(self.items):
            self.valid = not (self.idle and self.rng.random() < self.idle)
        self.valid_sig.value = int(self.valid)
        self.payload_sig.value = self.items[self.pos] if self.valid else \
            self.rng.getrandbits(self.bits)

    def sample(self, cycle):
        if self.valid and self.ready_sig.value == 1:
            self.taken.append(cycle)
            self.pos += 1
            self.valid = False

    @property
    def finished(self):
        return self.pos == len(self.items)


class Sink:
    """Drives ``ready`` of stream ``prefix`` (not ready with probability ``stall``), collects
    the items taken and checks the stream rule."""

    def __init__(self, dut, prefix, rng, stall, name):
        self.valid_sig = getattr(dut, f"{prefix}__valid")
        self.payload_sig = getattr(dut, f"{prefix}__payload")
        self.ready_sig = getattr(dut, f"{prefix}__ready")
        self.rng, self.stall, self.name = rng, stall, name
        self.ready, self.held, self.got, self.cycles, self.first = True, None, [], [], None
        self.errors = []

    def drive(self):
        self.ready = not (self.stall and self.rng.random() < self.stall)
        self.ready_sig.value = int(self.ready)

    def sample(self, cycle):
        if self.valid_sig.value == 1:
            item = self.payload_sig.value.to_unsigned()
            if self.first is None:
                self.first = cycle
            if self.held is not None and item != self.held[0]:
                self.errors.append(f"cycle {cycle}: {self.name} item offered at cycle "
                                   f"{self.held[1]} changed before it was taken")
            if self.ready:
                self.got.append(item)
                self.cycles.append(cycle)
                self.held = None
            elif self.held is None:
                self.held = (item, cycle)
        elif self.held is not None:
            self.errors.append(f"cycle {cycle}: {self.name} item offered at cycle "
                               f"{self.held[1]} withdrawn before it was taken")
            self.held = None


async def run_cycles(dut, sources, sinks, *, expected, deadline, drain, extra=None):
    """Run the per-cycle loop until every source is finished, ``expected`` items were taken
    from the sinks and ``drain`` more cycles passed (to catch extra items), or ``deadline``
    cycles. ``extra(cycle)`` is called in the read-only phase of each cycle."""
    start = streams.cycle()
    quiet = 0
    while True:
        for s in sources:
            s.drive()
        for k in sinks:
            k.drive()
        await ReadOnly()
        cycle = streams.cycle()
        for s in sources:
            s.sample(cycle)
        for k in sinks:
            k.sample(cycle)
        if extra:
            extra(cycle)
        await RisingEdge(dut.clk)
        done = all(s.finished for s in sources) and sum(len(k.got) for k in sinks) >= expected
        quiet = quiet + 1 if done else 0
        if quiet > drain or cycle - start > deadline:
            return cycle - start


def mismatch_details(name, got, want, limit=4):
    out = []
    if len(got) != len(want):
        out.append(f"{name}: {len(got)} words, expected {len(want)}")
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            out.append(f"{name} word {i}: {a:#x} != {b:#x}")
            if len(out) >= limit:
                break
    return out


def port_details(port, got, want) -> list:
    """:func:`mismatch_details` of every output port ``port[i]`` (``got[i]`` against
    ``want[i]``), port after port."""
    return [line for i, (g, w) in enumerate(zip(got, want))
            for line in mismatch_details(f"{port}[{i}]", g, w)]


def word_mismatches(got, want) -> int:
    """Words that differ, plus words missing or extra, over every port (``got[i]`` against
    ``want[i]``)."""
    return (sum(a != b for g, w in zip(got, want) for a, b in zip(g, w))
            + sum(abs(len(g) - len(w)) for g, w in zip(got, want)))


def words_compared(got, want) -> int:
    """Words compared over every port: the shorter of ``got[i]`` and ``want[i]``."""
    return sum(min(len(g), len(w)) for g, w in zip(got, want))


class CaseRecords:
    """The case records of one cocotb test ``test`` (seed ``seed``)."""

    def __init__(self, dut, test, seed):
        self.dut, self.test, self.seed, self.records = dut, test, seed, []

    @classmethod
    def open(cls, dut, test) -> tuple:
        """``(records, rng)`` of test ``test``: the run's seed
        (:func:`~elmoe3d.sim.runner.resolve_seed`) and a :class:`random.Random` drawn from
        :func:`~elmoe3d.sim.runner.case_rng` for the test's name."""
        seed = resolve_seed()
        return cls(dut, test, seed), random.Random(int(case_rng(seed, test).integers(1 << 62)))

    def add(self, **rec):
        self.records.append(rec)
        self.dut._log.info("%s: %s", self.test,
                           {k: v for k, v in rec.items() if k != "details"})
        return rec

    def finish(self):
        write_summary(self.test, self.records)
        bad = [r for r in self.records if r["mismatches"]]
        assert self.records, f"{self.test}: no case ran"
        assert not bad, (f"{len(bad)} case(s) failed (seed {self.seed}): "
                         + "; ".join(f"{r['case']} ({r['traffic']}): {r['mismatches']} "
                                     f"mismatches, {r['details'][:3]}" for r in bad))


# ---- figures (host side) ----------------------------------------------------------------------

def figure_failures(res, what) -> list:
    """Failure lines of a figure run ``res`` (a :class:`~elmoe3d.sim.records.BenchResult` of the
    test named ``what``): each mismatching case, each failed cocotb test when no case
    mismatched, and ``"<what> did not run"``."""
    failures = []
    for r in res.records:
        if r["mismatches"]:
            failures.append(f"{r['case']}: {r['mismatches']} mismatch(es): "
                            f"{'; '.join(r['details'][:2])}")
    for tc in res.sim.testcases:
        if tc.status == "failed" and not any(r["mismatches"] for r in res.records):
            failures.append(f"{tc.name}: {tc.message.splitlines()[0] if tc.message else 'failed'}")
    if not res.sim.tests:
        failures.append(f"{what} did not run")
    return failures


def throughput_figures(key, res, what, **extra) -> dict:
    """The figure dict of a throughput run ``res`` of the test named ``what``:
    ``{key: records, "failures": figure_failures(res, what), "seed", "logs", **extra}``."""
    return {key: res.records, "failures": figure_failures(res, what), "seed": res.sim.seed,
            "logs": [str(res.sim.log_file)], **extra}


def join_figures(*figs) -> dict:
    """One figure dict from several benches' (later keys win; ``failures`` and ``logs``
    concatenated in order; ``seed`` from the first)."""
    out = {}
    for f in figs:
        out.update(f)
    out["failures"] = [line for f in figs for line in f["failures"]]
    out["logs"] = [log for f in figs for log in f["logs"]]
    out["seed"] = figs[0]["seed"]
    return out


def failure_lines(figs, bench: str) -> list:
    """Missed-target lines for the failures of ``figs``: ``"<bench> bench: <failure> (logs
    ...)"``."""
    return [f"{bench} bench: {line} (logs {', '.join(figs['logs'])})" for line in figs["failures"]]

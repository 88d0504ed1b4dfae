"""cocotb bench of the DRAM controllers against the behavioural devices, and the DRAM bench
figures (issue 4, items 7 and 8; paper Section 6, Table 1).

DUTs: :class:`elmoe3d.hw.hb_ctrl.HBController` (``target = "hb"``, one HB bank) and
:class:`elmoe3d.hw.ext_ctrl.ExtController` (``target = "ext"``, ``channels`` LPDDR5 channels).
Every command bus is watched every logic cycle by a :class:`~elmoe3d.sw.golden.dram.DramDevice`
(the timing checker: any violation fails the test with the constraint, bank and cycle), which
also returns the read data from its sparse memory. Run through :mod:`elmoe3d.sim.runner`; the
runner writes ``params.json``::

    {"arch": "small", "target": "hb", "channels": 2,
     "stream_bursts": 4000, "random_requests": 300, "long_refresh_trefi": 10, ...}

Tests (each writes ``summary-<test>.json`` records into the run folder, then fails on any
violation or mismatch, or when a case ends with the controller's sticky ``errors`` set: none of
this traffic may push the refresh to the postponing limit):

* ``test_random_rw`` (``traffic`` = ``smooth`` / ``stalls``): random reads and writes
  (random addresses, 1-8 units), every read beat compared with plain equality against a
  golden memory (the writes in request order over :func:`~elmoe3d.sw.golden.dram.dram_pattern`
  through :meth:`~elmoe3d.config.DramConfig.decode`); ``stalls`` adds idle cycles on ``req``
  and ``wdata`` and backpressure on ``rdata`` (:mod:`elmoe3d.sim.traffic`).
* ``test_stream``: one long sequential read, ``rdata`` always ready: efficiency = bytes
  delivered / (peak bytes per logic cycle x cycles from the first request accepted to the
  last beat); ``steady`` counts from the first beat instead (no start-up latency).
* ``test_random_rows``: reads of ``row_request_bursts`` units (an int or a list of sizes, one
  case each) at random aligned addresses (a new random row almost every request): the
  row-conflict loss is its efficiency against ``test_stream``'s.
* ``test_long_refresh``: streaming reads with backpressure and idle gaps for
  ``long_refresh_trefi`` x tREFI; the devices check every bank was refreshed at least every
  ``(max_postponed + 1) x tREFI`` and the refresh count is reported.
* ``test_replay_violation``: the checker is shown to catch a violation: the command trace of
  a real run replays cleanly into a fresh device, and with one RD moved one DRAM clock
  earlier it must raise :class:`~elmoe3d.sw.golden.dram.TimingViolation`.

Host side: :func:`run_dram_bench`, and :func:`dram_figures` / :func:`print_dram` for
``elmoe3d bench``.
"""

from __future__ import annotations


import cocotb
from cocotb.triggers import ReadOnly, RisingEdge

from ..config import ArchConfig, preset
from ..sw.golden.dram import DramDevice, TimingViolation, dram_pattern
from . import cocotb_streams as streams
from .dram_bus import dram_bus, drive_devices
from .records import (BenchResult, arch_from_params, arch_param, figure_prefix, run_bench,
                      write_summary)
from .runner import case_rng, load_params, resolve_seed
from .traffic import BENCH_TRAFFIC, traffic as pattern


__all__ = ["run_dram_bench", "dram_figures", "print_dram", "HB_TARGET", "EXT_TARGET",
           "TESTS", "DEFAULTS"]

#: Figure targets (BRIEF section 6).
HB_TARGET = 0.97
EXT_TARGET = 0.99
DEFAULTS = {"arch": "small", "target": "hb", "channels": None, "stream_bursts": 3000,
            "random_requests": 200, "row_requests": 150, "row_request_bursts": 16,
            "long_refresh_trefi": 10, "max_length": 8}
TESTS = ("test_random_rw", "test_stream", "test_random_rows", "test_long_refresh",
         "test_replay_violation")


class DramBench:
    """Clock, reset, one device model per command bus, stream drivers and the golden memory
    for one controller DUT (HB or external)."""

    def __init__(self, dut, params: dict, test: str):
        self.dut, self.test = dut, test
        self.params = {**DEFAULTS, **params}
        self.arch = arch_from_params(self.params, DEFAULTS["arch"])
        self.target = self.params["target"]
        if self.target not in ("hb", "ext"):
            raise ValueError(f"target: expected 'hb' or 'ext', got {self.target!r}")
        self.cfg = self.arch.hb if self.target == "hb" else self.arch.ext
        self.channels = 1 if self.target == "hb" else \
            (self.params["channels"] or self.arch.ext_channels)
        self.seed = resolve_seed()
        self.bw = self.cfg.burst_bytes * 8
        self.unit_bytes = self.cfg.burst_bytes * self.channels
        self.peak = self.cfg.peak_gbps * self.channels / self.arch.clock_ghz
        self.records = []
        self.devices = []
        self.violations = []
        self.golden = {}

    cycle = staticmethod(streams.cycle)

    def rng(self, case):
        return case_rng(self.seed, f"{self.test}/{case}")

    # -- devices --

    def _prefix(self, c):
        return "dram" if self.target == "hb" else f"dram__{c}"

    async def start(self, trace=None):
        dut = self.dut
        await streams.start(dut, ["req__valid", "wdata__valid", "rdata__ready", "errors_clear"]
                            + [self._prefix(c) + "__rd_valid" for c in range(self.channels)],
                            settle=0)
        self.devices = [DramDevice(self.cfg, clock_ghz=self.arch.clock_ghz, name=f"ch{c}",
                                   seed=c) for c in range(self.channels)]
        self.start_cycle = self.cycle()
        cocotb.start_soon(drive_devices(
            dut, [(dev, dram_bus(dut, self._prefix(c))) for c, dev in enumerate(self.devices)],
            self.violations, trace=trace))
        dut._log.info("DRAM bench %s: %s, %d channel(s), %s (%d B bursts, %g GB/s each); "
                      "seed %d", self.test, self.target, self.channels, self.cfg.standard,
                      self.cfg.burst_bytes, self.cfg.peak_gbps, self.seed)

    # -- golden memory (one unit = one burst per channel) --

    def expected(self, unit: int) -> int:
        got = self.golden.get(unit)
        if got is not None:
            return got
        value = 0
        for c in range(self.channels):
            value |= dram_pattern(self.cfg, *self.cfg.decode(unit), seed=c) << (c * self.bw)
        return value

    def units(self) -> int:
        return self.cfg.bursts

    # -- streams --

    async def _sink(self, out, cycles, rng, backpressure, errors):
        dut = self.dut
        held = None
        while True:
            ready = 0 if backpressure and rng.random() < backpressure else 1
            dut.rdata__ready.value = ready
            await ReadOnly()
            v = dut.rdata__valid.value == 1
            raw = int(dut.rdata__payload.value) if v else None
            if held is not None and (not v or raw != held):
                errors.append(f"cycle {self.cycle()}: an rdata beat was withdrawn or changed "
                              f"before it was taken")
            held = None
            if v:
                if ready:
                    out.append(raw)
                    cycles.append(self.cycle())
                else:
                    held = raw
            await RisingEdge(dut.clk)

    async def run(self, case, requests, *, traffic="smooth", idle_gap=None):
        """Drive ``requests`` (``(write, addr, length)`` in units) with random write data;
        collect every read beat; compare with the golden memory; record the case."""
        from ..hw.dram import request_layout
        rng = self.rng(case)
        flow = pattern(traffic).for_ports("req", "wdata", "rdata")
        addr_bits = (self.units() - 1).bit_length()
        layout = request_layout(addr_bits, 16)
        reqs, wbeats, expect = [], [], []
        nbytes = self.unit_bytes
        for write, addr, length in requests:
            reqs.append(layout.const({"write": write, "addr": addr, "length": length}).as_bits())
            for i in range(length):
                unit = (addr + i) % self.units()
                if write:
                    value = int.from_bytes(rng.bytes(nbytes), "little")
                    self.golden[unit] = value
                    wbeats.append(value)
                else:
                    expect.append(self.expected(unit))
        out, out_cycles, errors, req_log = [], [], [], []
        before = self.device_stats()
        sink = cocotb.start_soon(self._sink(out, out_cycles, rng, flow.backpressure_at("rdata"),
                                            errors))
        srcs = [cocotb.start_soon(streams.offer(self.dut, "req", reqs, rng, flow.idle_at("req"),
                                                log=req_log)),
                cocotb.start_soon(streams.offer(self.dut, "wdata", wbeats, rng,
                                                flow.idle_at("wdata")))]
        start = self.cycle()
        total = sum(length for _, _, length in requests)
        budget = int((400 + 40 * total * self.cfg.burst_ck * 3) / (1 - flow.idle)
                     / (1 - flow.backpressure))
        while (not all(s.done() for s in srcs) or len(out) < len(expect)) \
                and self.cycle() < start + budget and not self.violations:
            await RisingEdge(self.dut.clk)
        if len(out) < len(expect) and not self.violations:
            errors.append(f"deadline: {len(out)}/{len(expect)} read beats after "
                          f"{self.cycle() - start} cycles")
        for s in srcs:
            s.cancel()
        for _ in range(100):
            await RisingEdge(self.dut.clk)
        sink.cancel()
        self.dut.rdata__ready.value = 0
        if len(out) > len(expect):
            errors.append(f"extra read beats: {len(out)} for {len(expect)} expected")
        flags = int(self.dut.errors.value)
        if flags:
            errors.append(f"errors = {flags:#b}: a refresh reached the postponing limit "
                          f"(dram_errors_layout refresh_overflow)")
        mismatches = sum(1 for a, b in zip(out, expect) if a != b)
        first = next((i for i, (a, b) in enumerate(zip(out, expect)) if a != b), None)
        if first is not None:
            errors.append(f"read beat {first} differs from the golden memory")
        rec = {"case": case, "target": self.target, "channels": self.channels,
               "traffic": traffic, "requests": len(requests), "units": total,
               "read_beats": len(out), "comparisons": min(len(out), len(expect)),
               "mismatches": mismatches + abs(len(out) - len(expect)), "errors": errors,
               "violations": list(self.violations), "seed": self.seed}
        if out_cycles and req_log:
            cycles = out_cycles[-1] - req_log[0] + 1
            steady = out_cycles[-1] - out_cycles[0] + 1
            nbeats = len(out)
            rec.update(first_request=req_log[0], first_beat=out_cycles[0],
                       last_beat=out_cycles[-1], cycles=cycles, bytes=nbeats * nbytes,
                       peak_bytes_per_cycle=self.peak,
                       efficiency=nbeats * nbytes / (self.peak * cycles),
                       steady_efficiency=(nbeats - 1) * nbytes / (self.peak * (steady - 1))
                       if steady > 1 else None,
                       first_latency=out_cycles[0] - req_log[0])
        after = self.device_stats()
        rec["stats"] = {k: v - before.get(k, 0) for k, v in after.items()}
        self.records.append(rec)
        return rec

    def device_stats(self) -> dict:
        """The devices' counters, summed over the channels."""
        stats = {}
        for dev in self.devices:
            for k, v in dev.stats.items():
                if k not in ("first_cycle", "last_cycle", "cycles"):
                    stats[k] = stats.get(k, 0) + v
        return stats

    def finish(self):
        for dev in self.devices:
            if not self.violations:
                try:
                    dev.finish()
                except TimingViolation as exc:
                    self.violations.append(str(exc))
        for rec in self.records:
            rec["violations"] = list(self.violations)
        write_summary(self.test, self.records)
        bad = [r for r in self.records if r["mismatches"] or r["errors"]]
        assert not self.violations, "DRAM timing violation: " + "; ".join(self.violations[:3])
        assert not bad, "; ".join(f"{r['case']}: {r['mismatches']} mismatches, {r['errors'][:3]}"
                                  for r in bad)


def _random_requests(rng, n, units, max_length, *, writes=True):
    reqs = []
    for _ in range(n):
        length = int(rng.integers(1, max_length + 1))
        addr = int(rng.integers(0, units))
        reqs.append((int(writes and rng.random() < 0.5), addr, length))
    return reqs


def _stream_requests(start, total, chunk=1 << 15):
    reqs, addr = [], start
    while total > 0:
        n = min(chunk, total)
        reqs.append((0, addr, n))
        addr, total = addr + n, total - n
    return reqs


# -- tests --

@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_random_rw(dut, traffic):
    bench = DramBench(dut, load_params(), f"test_random_rw-{traffic}")
    await bench.start()
    rng = bench.rng("requests")
    p = bench.params
    # a hot window so that reads see earlier writes, plus addresses across the whole device
    hot = min(bench.units(), 512)
    reqs = _random_requests(rng, p["random_requests"] // 2, hot, p["max_length"])
    reqs += _random_requests(rng, p["random_requests"] - len(reqs), bench.units(),
                             p["max_length"])
    reqs += [(0, a, n) for _, a, n in reqs[: len(reqs) // 4]]      # read back what was written
    await bench.run(f"random-rw-{traffic}", reqs, traffic=traffic)
    bench.finish()


@cocotb.test()
async def test_stream(dut):
    bench = DramBench(dut, load_params(), "test_stream")
    await bench.start()
    await bench.run("stream", _stream_requests(0, bench.params["stream_bursts"]))
    bench.finish()


@cocotb.test()
async def test_random_rows(dut):
    bench = DramBench(dut, load_params(), "test_random_rows")
    await bench.start()
    sizes = bench.params["row_request_bursts"]
    for n in ([sizes] if isinstance(sizes, int) else sizes):
        rng = bench.rng(f"rows-{n}")
        slots = bench.units() // n
        reqs = [(0, int(rng.integers(0, slots)) * n, n)
                for _ in range(bench.params["row_requests"])]
        rec = await bench.run(f"random-rows-{n}", reqs)
        rec["request_bytes"] = n * bench.unit_bytes
    bench.finish()


@cocotb.test()
async def test_long_refresh(dut):
    bench = DramBench(dut, load_params(), "test_long_refresh")
    await bench.start()
    cfg = bench.cfg
    trefi = cfg.ck("tREFI") * cfg.tck_ns * bench.arch.clock_ghz      # logic cycles
    target = int(bench.params["long_refresh_trefi"] * trefi)
    rng = bench.rng("long")
    start, addr = bench.cycle(), 0
    while bench.cycle() - start < target and not bench.violations:
        n = int(rng.integers(64, 512))
        await bench.run(f"long-{len(bench.records)}", [(0, addr, n)], traffic="stalls")
        addr = (addr + n) % bench.units()
        for _ in range(int(rng.integers(0, 400))):              # idle: refresh still runs
            await RisingEdge(dut.clk)
    refs = sum(d.stats["refpb"] + d.stats["refab"] for d in bench.devices)
    elapsed = bench.cycle() - start
    expected = elapsed / trefi * cfg.refresh_units * bench.channels
    # the devices enforce the per-bank rule; this checks the total against the nominal rate
    enough = refs >= 0.9 * expected - cfg.max_postponed * bench.channels
    bench.records.append({"case": "long-refresh", "target": bench.target,
                          "channels": bench.channels, "cycles": elapsed,
                          "trefi_cycles": trefi, "refreshes": refs,
                          "refreshes_nominal": expected, "comparisons": 0, "mismatches": 0,
                          "errors": [] if enough else [f"only {refs} refreshes in {elapsed} "
                                                       f"cycles (nominal {expected:.0f})"],
                          "stats": {}})
    bench.finish()


def _replay(cfg, clock_ghz, events):
    """A fresh device fed the command trace ``{logic cycle: (row, col)}``; raises
    :class:`TimingViolation` as the bench's devices would."""
    dev = DramDevice(cfg, clock_ghz=clock_ghz, name="replay")
    for c in range(max(events) + 1):
        dev.clock(*events.get(c, (None, None)))
    return dev


@cocotb.test()
async def test_replay_violation(dut):
    bench = DramBench(dut, load_params(), "test_replay_violation")
    trace = []
    await bench.start(trace=trace)
    rec = {"case": "replay", "target": bench.target, "channels": bench.channels,
           "comparisons": 0, "mismatches": 0, "errors": [], "stats": {}}
    if bench.channels != 1:
        rec["errors"].append("test_replay_violation needs one command bus (target hb)")
    else:
        await bench.run("replay-source", _random_requests(bench.rng("replay"), 40,
                                                          min(bench.units(), 256), 4))
        cfg, ghz = bench.cfg, bench.arch.clock_ghz
        events = {c: (row, col) for c, row, col in trace}
        rec["clean_commands"] = _replay(cfg, ghz, events).stats["commands"]
        # a RD issued exactly tRCD after the ACT of its bank, moved one DRAM clock earlier
        probe = DramDevice(cfg, clock_ghz=ghz)
        trcd = cfg.ck("tRCD")
        acts = {(probe.dram_cycle(c), row[1]) for c, (row, col) in events.items()
                if row is not None and row[0] == 0}
        moved = None
        for c, (row, col) in sorted(events.items()):
            if col is None or col[0]:
                continue
            k = probe.dram_cycle(c)
            earlier = probe.logic_cycle(k - 1)
            if (k - trcd, col[1]) in acts and events.get(earlier, (None, None))[1] is None:
                moved = (c, earlier)
                break
        if moved is None:
            rec["errors"].append("no RD issued exactly tRCD after its ACT in the trace")
        else:
            c, earlier = moved
            bad = dict(events)
            row, col = bad.pop(c)
            if row is not None:
                bad[c] = (row, None)
            bad[earlier] = (bad.get(earlier, (None, None))[0], col)
            try:
                _replay(cfg, ghz, bad)
                rec["errors"].append("a RD moved one DRAM clock earlier was not caught")
            except TimingViolation as exc:
                rec["caught"] = {"constraint": exc.constraint, "bank": exc.bank,
                                 "cycle": exc.cycle, "message": str(exc)}
                if exc.constraint != "tRCD":
                    rec["errors"].append(f"expected a tRCD violation, got {exc}")
    bench.records.append(rec)
    bench.finish()


# -- host side ---------------------------------------------------------------------------------

#: A host-side run of this bench: the runner's result and the case records.
DramBenchResult = BenchResult


def build_dram(arch: ArchConfig, target: str, channels=None, *, waves=None):
    """Verilog + Verilator build of the HB controller or the external controller."""
    from .runner import build
    from ..hw.ext_ctrl import ExtController
    from ..hw.hb_ctrl import HBController
    tag = arch.name.replace("-", "_")
    if target == "hb":
        return build(HBController(config=arch), name=f"hb_ctrl_{tag}", toplevel="hb_ctrl",
                     waves=waves)
    if target == "ext":
        ch = channels or arch.ext_channels
        return build(ExtController(config=arch, channels=ch), name=f"ext_ctrl_{tag}_{ch}ch",
                     toplevel="ext_ctrl", waves=waves)
    raise ValueError(f"target: expected 'hb' or 'ext', got {target!r}")


def run_dram_bench(arch: ArchConfig | None = None, *, target="hb", channels=None, tests=None,
                   seed=None, waves=None, params=None, check=True) -> DramBenchResult:
    """Build (or reuse) the controller and run the named tests (default: all). With
    ``check=True`` a failing test raises :class:`~elmoe3d.sim.runner.SimulationFailure`."""
    arch = arch or preset("small")
    built = build_dram(arch, target, channels, waves=waves)
    merged = {"arch": arch_param(arch), "target": target, "channels": channels,
              **(params or {})}
    return run_bench(built, test_module=__name__, tests=tests, default_tests=TESTS,
                     params=merged, prefix=f"bench_dram-{target}", seed=seed, check=check)


def dram_figures(arch: ArchConfig, seed, *, ext_channels: int | None = None) -> dict:
    """HB streaming-read efficiency and random-row runs (the row-conflict loss) on one HB
    bank; LPDDR5 streaming-read efficiency on ``ext_channels`` channels (default
    ``arch.ext_channels``; a smaller count is a scaled run of identical channels).

    Returns ``{"hb": {...}, "ext": {...}, "failures": [...], "seed"}``; a tier holds the
    ``stream`` record and (HB) ``random_rows`` (a list, one record per request size): each
    with efficiency, steady efficiency, bytes, cycles and the devices' counters; plus the
    configuration's ``timing`` table and ``source``."""
    failures = []
    out = {"seed": seed, "failures": failures}
    hb_params = {"stream_bursts": 20000, "row_requests": 300, "row_request_bursts": [16, 64]}
    ext_params = {"stream_bursts": 8000}
    channels = ext_channels or arch.ext_channels
    for target, params, tests in (("hb", hb_params, ["test_stream", "test_random_rows"]),
                                  ("ext", ext_params, ["test_stream"])):
        res = run_dram_bench(arch, target=target, tests=tests, seed=seed, params=params,
                             check=False, channels=None if target == "hb" else channels)
        cfg = arch.hb if target == "hb" else arch.ext
        tier = {"source": cfg.source, "standard": cfg.standard, "timing": cfg.timing_table(),
                "channels": 1 if target == "hb" else channels,
                "channels_paper": 1 if target == "hb" else arch.ext_channels,
                "random_rows": [], "log": str(res.sim.log_file)}
        for rec in res.records:
            if rec["case"] == "stream":
                tier["stream"] = rec
            else:
                tier["random_rows"].append(rec)
            for line in rec.get("errors", []) + rec.get("violations", [])[:1]:
                failures.append(f"{target} {rec['case']}: {line}")
            if rec.get("mismatches"):
                failures.append(f"{target} {rec['case']}: {rec['mismatches']} mismatching "
                                f"read beat(s)")
        for tc in res.sim.testcases:
            if tc.status == "failed" and not failures:
                failures.append(f"{target} {tc.name}: "
                                f"{tc.message.splitlines()[0] if tc.message else 'failed'}")
        if "stream" not in tier:
            failures.append(f"{target}: the streaming run did not complete (log {tier['log']})")
        out[target] = tier
    return out


def print_dram(console, figs, number: int | None = None) -> list:
    """Print the DRAM figures; return the missed-target lines."""
    from rich.markup import escape
    from rich.table import Table
    missed = []
    table = Table(title=figure_prefix(number) + "DRAM controllers vs the timing-checked device "
                        "models (efficiency = "
                        "bytes delivered / (peak bytes per cycle x cycles from the first "
                        "request to the last beat); steady = from the first beat)",
                  title_justify="left")
    for col in ("tier", "run", "bytes", "cycles", "peak B/cycle", "efficiency", "steady",
                "ACT", "PRE", "REF", "row hits", "conflicts", "target"):
        table.add_column(col, justify="left" if col in ("tier", "run", "target") else "right")
    for target, goal in (("hb", HB_TARGET), ("ext", EXT_TARGET)):
        tier = figs.get(target) or {}
        rows = [("stream", tier.get("stream"))] + [("rows", r) for r in
                                                   tier.get("random_rows", [])]
        for key, rec in rows:
            if not rec or "efficiency" not in rec:
                continue
            st = rec.get("stats", {})
            is_target = key == "stream"
            ok = rec["efficiency"] >= goal
            if is_target and not ok:
                missed.append(f"DRAM {target} streaming efficiency {rec['efficiency']:.2%} < "
                              f"target {goal:.0%}")
            label = "HB bank" if target == "hb" else \
                f"LPDDR5 {rec['channels']} of {tier.get('channels_paper')} ch"
            run = "stream" if is_target else \
                f"random rows, {rec.get('request_bytes', 0):,} B requests"
            table.add_row(label, run, f"{rec['bytes']:,}", f"{rec['cycles']:,}",
                          f"{rec['peak_bytes_per_cycle']:g}", f"{rec['efficiency']:.2%}",
                          f"{rec['steady_efficiency']:.2%}", f"{st.get('act', 0):,}",
                          f"{st.get('pre', 0):,}",
                          f"{st.get('refpb', 0) + st.get('refab', 0):,}",
                          f"{st.get('row_hits', 0):,}", f"{st.get('row_conflicts', 0):,}",
                          (f">= {goal:.0%}: " + ("[green]met[/]" if ok else "[red]MISSED[/]"))
                          if is_target else "-")
    console.print(table)
    hb = figs.get("hb") or {}
    for rec in hb.get("random_rows", []) if hb.get("stream") else []:
        loss = hb["stream"]["efficiency"] - rec["efficiency"]
        console.print(f"   HB row-conflict loss, random rows with {rec['request_bytes']:,} B "
                      f"requests: {loss:.2%} of peak below streaming")
    for target in ("hb", "ext"):
        tier = figs.get(target) or {}
        if tier.get("source"):
            console.print(f"   {target} timing: {escape(tier['source'])}")
    for line in figs.get("failures", []):
        missed.append(f"DRAM bench: {line}")
    return missed

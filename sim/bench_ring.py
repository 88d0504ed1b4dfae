# amaranth: UnusedElaboratable=no
"""cocotb bench of the streamline ring, and its bench figures (``elmoe3d bench`` figure 8, with
:mod:`elmoe3d.sim.bench_agg_link`).

Run through :mod:`elmoe3d.sim.runner` (never directly), with :func:`run_ring_bench`; the runner
writes ``params.json`` (read with :func:`~elmoe3d.sim.runner.load_params`)::

    {"ring": {"pes": 4, "pes_per_group": 2, "word_bits": 512, "flit_bytes": 128,
              "stream_bits": 4, "buffer_flits": 8},
     "transfers": 60,              # random transfers per ring stress test
     "stream_flits": 1024}         # ring throughput: flits per pattern

DUT: :class:`~elmoe3d.hw.ring.StreamlineRing` (top ``streamline_ring``, tests
``test_ring_*``). Every port is driven from one per-cycle loop
(:mod:`elmoe3d.sim.cocotb_cycles`): the injection port presents its flits with random idle
cycles (garbage payloads while not valid), the PE ports drop ``ready`` at random (the patterns
of :mod:`elmoe3d.sim.traffic`), and every output is checked against the stream rule (an
offered item stays valid and unchanged until taken). Flits are packed only through the
Amaranth layout (:func:`~elmoe3d.hw.ring.pack_flit`).

Checks: every PE's word sequence equals the golden model (:func:`elmoe3d.sw.golden.ring.ref_ring`)
with plain equality -- so every flit arrived once, intact and in order -- and no word arrives
after the expected ones. Each test writes ``summary-<test>.json`` (case records) into the run
folder and then fails if a case mismatched.

Figures (:func:`ring_figures`, :func:`print_ring`): streaming traffic through the ring in three
patterns (flits accepted per cycle as a fraction of one ``streamline_bytes_per_cycle`` flit,
and of the bound the PEs' ``ext`` ports set). Target :data:`RING_TARGET`.

The first line turns off Amaranth's unused-elaboratable warning for this file: the tests build
a :class:`~elmoe3d.hw.ring.StreamlineRing` only to read its properties.
"""

from __future__ import annotations

import random

import cocotb

from ..sw.golden.ring import RingFlit, ref_ring, ring_flits, ring_geometry
from . import cocotb_streams as streams
from .cocotb_cycles import (CaseRecords, Sink, Source, port_details, run_cycles,
                            throughput_figures, word_mismatches, words_compared)
from .records import BenchResult, figure_prefix, run_bench
from .runner import load_params
from .traffic import BENCH_TRAFFIC, SMOOTH, traffic as traffic_pattern


__all__ = ["RING_TARGET", "RING_PATTERNS", "random_ring_flits", "ring_params", "run_ring_bench",
           "ring_figures", "print_ring", "RingBenchResult"]

#: Figures: streaming fraction of the PE ports' bound, every ring pattern.
RING_TARGET = 0.99
RING_TESTS = ("test_ring_stress", "test_ring_throughput")

#: Ring throughput patterns: name -> description.
RING_PATTERNS = {
    "unicast round-robin": "full flits to PE 0, 1, 2, ... in turn (EXT streaming LSB slices "
                           "to the DP PEs)",
    "unicast random": "full flits to a random PE each",
    "multicast all": "full flits to every PE (weights shared by data-parallel PEs)",
}


# ---- traffic ---------------------------------------------------------------------------------

def random_ring_flits(rng: random.Random, *, pes: int, word_bits: int, flit_bytes: int,
                      transfers: int, stream_bits: int, max_words: int = 8,
                      p_multicast: float = 0.4) -> list:
    """Flits of ``transfers`` random word transfers (unicast or random multicast masks, 1 to
    ``max_words`` words, stream ids), interleaved flit by flit between up to three open
    transfers (a word spanning flits keeps its flits together), plus a flit naming no PE."""
    _, span = ring_geometry(word_bits=word_bits, flit_bytes=flit_bytes)
    pending = []
    for t in range(transfers):
        mask = rng.randrange(1, 1 << pes) if rng.random() < p_multicast else 1 << rng.randrange(pes)
        data = [rng.getrandbits(word_bits) for _ in range(rng.randrange(1, max_words + 1))]
        fl = ring_flits(data, mask, word_bits=word_bits, flit_bytes=flit_bytes,
                        stream=t % (1 << stream_bits))
        pending.append([fl[i:i + span] for i in range(0, len(fl), span)])
    out, live = [], []
    while pending or live:
        while pending and len(live) < 3:
            live.append(pending.pop(0))
        k = rng.randrange(len(live))
        out.extend(live[k].pop(0))
        if not live[k]:
            live.pop(k)
    out.insert(len(out) // 2, RingFlit(rng.getrandbits(8 * flit_bytes), 0))
    return out


# ---- the bench ------------------------------------------------------------------------------

def _ring_params():
    p = load_params()
    return p["ring"], p


def _ring_dut_info(rp):
    from ..hw.ring import StreamlineRing
    return StreamlineRing(**rp)              # only its properties are read


async def _ring_case(dut, ring, flits, *, rng, flow):
    """Inject ``flits`` under traffic ``flow`` (ports ``inject``, ``ext``); returns ``(got per
    PE, want per PE, source, sinks, cycles, errors)``."""
    from ..hw.ring import pack_flit
    flow = flow.for_ports("inject", "ext")
    P = ring.pes
    kw = dict(pes=P, word_bits=ring.word_bits, flit_bytes=ring.flit_bytes,
              stream_bits=ring.stream_bits)
    want = ref_ring(flits, pes=P, word_bits=ring.word_bits, flit_bytes=ring.flit_bytes)
    src = Source(dut, "inject", [pack_flit(f, **kw) for f in flits], rng,
                 flow.idle_at("inject"), ring.flit_layout.size)
    sinks = [Sink(dut, f"ext__{p}", rng, flow.backpressure_at("ext"), f"ext[{p}]")
             for p in range(P)]
    total = sum(map(len, want))
    deadline = int((len(flits) + total + 100) / max(0.05, flow.rate) * 4)
    cycles = await run_cycles(dut, [src], sinks, expected=total, deadline=deadline,
                              drain=ring.groups + ring.words_per_flit + 8)
    errors = [e for k in sinks for e in k.errors]
    if not src.finished:
        errors.append(f"inject: {src.pos} of {len(flits)} flits taken")
    return [k.got for k in sinks], want, src, sinks, cycles, errors


async def _ring_reset(dut, ring):
    await streams.start(dut, ["inject__valid"] + [f"ext__{p}__ready" for p in range(ring.pes)])


@cocotb.test()
@cocotb.parametrize(traffic=list(BENCH_TRAFFIC))
async def test_ring_stress(dut, traffic):
    """Random unicast and multicast transfers of several streams interleaved flit by flit,
    a flit naming no PE, random idle injection cycles and backpressure on every PE port
    (``stalls``) or none (``smooth``)."""
    rp, p = _ring_params()
    ring = _ring_dut_info(rp)
    rec, rng = CaseRecords.open(dut, f"test_ring_stress-{traffic}")
    await _ring_reset(dut, ring)
    dut._log.info("StreamlineRing %d PEs in %d groups, W=%d, flit %d B, %d flits per PE "
                  "FIFO, latency %s; seed %d", ring.pes, ring.groups, ring.word_bits,
                  ring.flit_bytes, ring.buffer_flits, ring.latency, rec.seed)
    flits = random_ring_flits(rng, pes=ring.pes, word_bits=ring.word_bits,
                              flit_bytes=ring.flit_bytes, transfers=int(p.get("transfers", 60)),
                              stream_bits=ring.stream_bits)
    got, want, _, _, cycles, errors = await _ring_case(dut, ring, flits, rng=rng,
                                                       flow=traffic_pattern(traffic))
    details = errors + port_details("ext", got, want)
    mism = word_mismatches(got, want) + len(errors)
    rec.add(case="ring stress", traffic=traffic, flits=len(flits),
            streams=len({f.stream for f in flits}),
            multicast_flits=sum(bin(f.dst_mask).count("1") > 1 for f in flits),
            words=sum(map(len, want)), cycles=cycles,
            comparisons=words_compared(got, want),
            mismatches=mism, details=details[:8])
    rec.finish()


def _pattern_flits(pattern, rng, ring, n):
    per = ring.words_per_flit
    masks = {"unicast round-robin": lambda i: 1 << (i % ring.pes),
             "unicast random": lambda i: 1 << rng.randrange(ring.pes),
             "multicast all": lambda i: (1 << ring.pes) - 1}[pattern]
    return [RingFlit(rng.getrandbits(8 * ring.flit_bytes), masks(i), i % 2, i == n - 1, per)
            for i in range(n)]


@cocotb.test()
async def test_ring_throughput(dut):
    """Each pattern of :data:`RING_PATTERNS` on ``stream_flits`` full flits, always-valid
    injection, always-ready PEs: flits per cycle from the first flit taken to the last word
    delivered (less the last group's latency), against one
    flit per cycle and against the bound of the PE ports (the busiest PE takes one word per
    cycle), and every word checked."""
    rp, p = _ring_params()
    ring = _ring_dut_info(rp)
    rec, rng = CaseRecords.open(dut, "test_ring_throughput")
    await _ring_reset(dut, ring)
    n = int(p.get("stream_flits", 1024))
    for pattern in RING_PATTERNS:
        flits = _pattern_flits(pattern, rng, ring, n)
        got, want, src, sinks, _, errors = await _ring_case(dut, ring, flits, rng=rng,
                                                            flow=SMOOTH)
        details = errors + port_details("ext", got, want)
        # First flit taken to last word delivered, less the last group's latency.
        last = max(k.cycles[-1] for k in sinks if k.cycles)
        cycles = last - src.taken[0] + 1 - ring.latency[-1]
        busiest = max(map(len, want)) * ring.flits_per_word      # cycles the busiest port needs
        bound = min(1.0, n / busiest)
        rec.add(case=f"ring {pattern}", traffic="streaming", pattern=pattern,
                description=RING_PATTERNS[pattern], flits=n, cycles=cycles,
                flit_bytes=ring.flit_bytes, bytes_per_cycle=n * ring.flit_bytes / cycles,
                fraction=n / cycles, bound=bound, fraction_of_bound=n / cycles / bound,
                latency=list(ring.latency), comparisons=sum(map(len, want)),
                mismatches=len(details), details=details[:8])
    rec.finish()


# ---- host side -------------------------------------------------------------------------------

#: A run of this bench: the runner's result and the case records.
RingBenchResult = BenchResult


def ring_params(arch, *, buffer_flits=None, stream_bits=None) -> dict:
    """``params["ring"]`` for ``arch``."""
    from ..hw.ring import DEFAULT_BUFFER_FLITS, DEFAULT_STREAM_BITS
    return {"pes": arch.pes, "pes_per_group": arch.pes_per_group,
            "word_bits": arch.pe.word_bits, "flit_bytes": int(arch.streamline_bytes_per_cycle),
            "stream_bits": stream_bits or DEFAULT_STREAM_BITS,
            "buffer_flits": buffer_flits or DEFAULT_BUFFER_FLITS}


def run_ring_bench(ring: dict, *, tests=None, seed=None, params=None, waves=None,
                   check=True) -> RingBenchResult:
    """Build (or reuse) a :class:`~elmoe3d.hw.ring.StreamlineRing` with parameters ``ring``
    and run the named ``test_ring_*`` tests (default both)."""
    from ..hw.ring import StreamlineRing
    from .runner import build
    dut = StreamlineRing(**ring)
    name = ("ring_p{pes}_g{pes_per_group}_w{word_bits}_f{flit_bytes}_s{stream_bits}"
            "_b{buffer_flits}").format(**ring)
    built = build(dut, name=name, toplevel="streamline_ring", waves=waves)
    return run_bench(built, test_module=__name__, tests=tests, default_tests=RING_TESTS,
                     params={"ring": ring, **(params or {})}, prefix="bench_ring", seed=seed,
                     check=check)


def ring_figures(arch, seed=None, *, stream_flits=1024) -> dict:
    """Streamline-ring throughput on streaming traffic for ``arch``
    (:class:`~elmoe3d.config.ArchConfig`): the ``test_ring_throughput`` records (each word also
    checked against the golden model).

    Returns ``{"ring": [...], "failures": [...], "seed", "logs", "streamline_bytes_per_cycle",
    "pes", "pes_per_group"}``; failures are mismatching cases and failed cocotb tests, one line
    each (:func:`~elmoe3d.sim.cocotb_cycles.figure_failures`)."""
    ring = run_ring_bench(ring_params(arch), tests="test_ring_throughput", seed=seed,
                          params={"stream_flits": stream_flits}, check=False)
    return throughput_figures("ring", ring, "test_ring_throughput",
                              streamline_bytes_per_cycle=arch.streamline_bytes_per_cycle,
                              pes=arch.pes, pes_per_group=arch.pes_per_group)


#: Definition printed under the table.
RING_DEFINITION = (
    "fraction = flits / cycles from the first flit injected to the last word delivered, less "
    "the last group's latency (the last flit's further words count against it); bound = "
    "the PE ports' limit (the busiest PE takes one word per cycle); every word checked "
    "against ref_ring.")


def print_ring(console, figs, number: int | None = None) -> list:
    """Print the ring throughput table of :func:`ring_figures`; return the missed-target lines
    (not the failures: :func:`~elmoe3d.sim.cocotb_cycles.failure_lines`)."""
    from rich.markup import escape
    from rich.table import Table
    missed = []
    sl = figs["streamline_bytes_per_cycle"]
    table = Table(title=figure_prefix(number) + f"Streamline ring throughput ({figs['pes']} PEs, "
                        f"{figs['pes'] // figs['pes_per_group']} stations, flits of {sl:g} B)",
                  title_justify="left", caption=RING_DEFINITION, caption_justify="left")
    for col in ("pattern", "flits", "cycles", "B/cycle", "fraction", "bound",
                "of bound", "target"):
        table.add_column(col, justify="left" if col in ("pattern", "target") else "right")
    for r in figs["ring"]:
        ok = r["fraction_of_bound"] >= RING_TARGET
        if not ok:
            missed.append(f"streamline ring {r['pattern']}: {r['fraction_of_bound']:.2%} of "
                          f"the bound < target {RING_TARGET:.0%}")
        table.add_row(escape(r["pattern"]), f"{r['flits']:,}", f"{r['cycles']:,}",
                      f"{r['bytes_per_cycle']:.1f}", f"{r['fraction']:.2%}",
                      f"{r['bound']:.2f}", f"{r['fraction_of_bound']:.2%}",
                      "[green]met[/]" if ok else "[red]MISSED[/]")
    console.print(table)
    if not figs["ring"]:
        missed.append("streamline ring throughput: no case measured")
    return missed

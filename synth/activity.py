"""Switching activity of registers and ports from a simulation's VCD dump, for
:func:`elmoe3d.synth.power.analyze_power`.

:func:`vcd_activity` reads a VCD file (Amaranth's ``Simulator.write_vcd``, or Verilator's
``--trace``) and gives every bit of every variable its signal probability (the fraction of
the run it is 1) and its toggle rate (value changes per clock cycle, the cycles counted as
the clock variable's rising edges), named as the mapped netlist names registers and ports
(:func:`~elmoe3d.synth.sta.analyze`: the signal a flip-flop holds, ``name[bit]``; Yosys
flattens a sub-block's signal ``x`` of instance ``u`` to ``u.x``): the scope path below the
clock's scope joined with ``.``, then the variable name, then ``[bit]`` for a vector.
Amaranth's views of a structure's fields (escaped names, ``\\i__payload.act[0]``) are
skipped: their bits are the structure's own.

Raises :class:`ActivityError` (a :class:`~elmoe3d.errors.UserError`) for a file that cannot
be read or has no clock edge, naming the file.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UserError
from .power import Activity


__all__ = ["ActivityError", "vcd_activity", "rtlil_aliases", "annotate", "minilm_tile_run",
           "ring_station_run", "link_reduce_run"]


class ActivityError(UserError):
    """The VCD file cannot be read; the message names it."""


def vcd_activity(path, *, clock: str = "clk", start: int = 0) -> tuple[dict, int]:
    """``({name: Activity}, cycles)`` from the VCD file ``path`` (module docstring); only
    the part of the run from time ``start`` on is counted."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ActivityError(f"{path}: cannot read it ({exc.strerror})") from None
    scopes, vars_ = [], {}                  # id -> [(name, width)]
    lines = iter(text.splitlines())
    for line in lines:
        tok = line.split()
        if not tok:
            continue
        if tok[0] == "$scope":
            scopes.append(tok[2])
        elif tok[0] == "$upscope":
            scopes.pop()
        elif tok[0] == "$var":
            width, ident, name = int(tok[2]), tok[3], tok[4]
            if width > 0 and not name.startswith("\\"):     # not a struct field's view
                vars_.setdefault(ident, []).append((tuple(scopes), name, width))
        elif tok[0] == "$enddefinitions":
            break
    clocks = sorted((len(sc), i, sc) for i, vs in vars_.items() for sc, n, _ in vs
                    if n == clock)
    if not clocks:
        raise ActivityError(f"{path}: no clock variable {clock!r}")
    _, clk, top = clocks[0]                  # names are relative to the clock's scope
    vars_ = {i: [(".".join(sc[len(top):] + (n,)), w) for sc, n, w in vs
                 if sc[:len(top)] == top] for i, vs in vars_.items()}
    vars_ = {i: vs for i, vs in vars_.items() if vs}
    value = {}                               # id -> int
    width = {i: vs[0][1] for i, vs in vars_.items()}
    toggles = {i: [0] * w for i, w in width.items()}
    ones = {i: [0] * w for i, w in width.items()}
    since = {}                               # id -> time of its last change
    now = 0
    end = 0
    cycles = 0

    def add_time(i, until):
        v = value.get(i, 0)
        t0 = max(since.get(i, start), start)
        if until > t0 and v:
            acc = ones[i]
            for b in range(width[i]):
                if v >> b & 1:
                    acc[b] += until - t0

    def change(i, v):
        nonlocal cycles
        old = value.get(i)
        if now >= start:
            add_time(i, now)
            if old is not None:
                diff = old ^ v
                if i == clk and v and not old:
                    cycles += 1
                if i != clk and diff:
                    acc = toggles[i]
                    b = 0
                    while diff:
                        if diff & 1:
                            acc[b] += 1
                        diff >>= 1
                        b += 1
        value[i] = v
        since[i] = now

    for line in lines:
        if not line:
            continue
        c = line[0]
        if c == "#":
            now = int(line[1:])
            end = max(end, now)
        elif c in "01xXzZ" and len(line) > 1 and line[1] != " ":
            i = line[1:]
            if i in width:
                change(i, 1 if c == "1" else 0)
        elif c in "bB":
            bits, i = line[1:].split()
            if i in width:
                change(i, int(bits.replace("x", "0").replace("z", "0").replace("X", "0")
                              .replace("Z", "0"), 2))
        elif c in "rR":
            continue
    if cycles == 0:
        raise ActivityError(f"{path}: the clock {clock!r} has no rising edge after time "
                            f"{start}")
    total = end - start
    for i in width:
        add_time(i, end)
    out = {}
    for i, vs in vars_.items():
        for name, w in vs:
            for b in range(w):
                key = f"{name}[{b}]" if w > 1 else name
                p = ones[i][b] / total if total > 0 else 0.0
                out[key] = Activity(p, toggles[i][b] / cycles).clamped()
    return out, cycles


# ---- a real program on the tensor tile -----------------------------------------------------

def minilm_tile_run(config, mode, vcd_path, *, layer: int = 0, tokens: int = 8,
                    channels: int = 16) -> dict:
    """Run the up-projection GEMM of all-MiniLM-L6-v2 FFN layer ``layer`` (real weights,
    real activations of ``tokens`` GSM8K prompt tokens, ``channels`` output channels, K =
    384; the tile bench's ``test_minilm`` case, :mod:`elmoe3d.sim.bench_tile`) in ``mode``
    (``Mode.DRAFT`` or ``Mode.FULL``) on ``TensorTile(config)`` in Amaranth's simulator, one
    beat a cycle into an always-ready sink, writing the VCD to ``vcd_path``. Every result is
    compared with :func:`~elmoe3d.sw.golden.tile.ref_tile` (plain equality; a mismatch raises
    ``AssertionError``).

    Returns ``{"beats", "cycles", "macs", "unit_products", "results"}``: ``macs`` are the
    GEMM's INT8 multiply-accumulates (``tokens x channels x 384``, padding excluded),
    ``unit_products`` the IA8xW5 unit-PE products the tile computed (``beats x rows x lanes
    x 32``; FULL: two per INT8 MAC, an MSB and an LSB slice; DRAFT: one)."""
    import numpy as np
    from amaranth.sim import Simulator

    from ..hw.layouts import pack_beats, unpack_results
    from ..hw.tile import TensorTile
    from ..sw.golden.datapath import Mode
    from ..sw.golden.quant import quantize_activations, quantize_weights
    from ..sw.golden.tile import ref_tile, tile_schedule
    from ..sw.host.corpus import gsm8k_prompts
    from ..sw.host.minilm import ffn_activations, ffn_weights

    mode = Mode(mode)
    ffn_in, _ = ffn_activations(gsm8k_prompts(), layer)
    up, _ = ffn_weights(layer)

    def evenly(total, count):
        count = min(count, total)
        return np.unique(np.linspace(0, total - 1, count).round().astype(int))
    a_q = quantize_activations(ffn_in[evenly(ffn_in.shape[0], tokens)],
                               name=f"layer{layer}.ffn_in").q
    qw = quantize_weights(up[evenly(up.shape[0], channels)],
                          name=f"encoder.layer.{layer}.intermediate.dense.weight")
    beats = tile_schedule(a_q, qw, mode, config.rows, config.lanes)
    payloads = pack_beats(config, beats)
    want = ref_tile(beats)
    dut = TensorTile(config=config)
    got, counts = [], {"cycles": 0}

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        for p in payloads:
            ctx.set(dut.i.valid, 1)
            ctx.set(dut.i.payload.as_value(), p)
            assert ctx.get(dut.i.ready), "the tile did not take a beat with a ready sink"
            await ctx.tick()
            counts["cycles"] += 1
            if ctx.get(dut.o.valid):
                got.append(ctx.get(dut.o.payload))
        ctx.set(dut.i.valid, 0)
        for _ in range(dut.latency + 2):
            await ctx.tick()
            counts["cycles"] += 1
            if ctx.get(dut.o.valid):
                got.append(ctx.get(dut.o.payload))

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    with sim.write_vcd(str(vcd_path)):
        sim.run()
    res = unpack_results(config, got)
    assert len(got) == len(want["mode"]), (len(got), len(want["mode"]))
    assert np.array_equal(res["acc"], want["acc"]) and \
        np.array_equal(res["overflow"], want["overflow"]), "tile results differ from ref_tile"
    return {"beats": len(payloads), "cycles": counts["cycles"],
            "macs": int(a_q.shape[0] * qw.q.shape[0] * a_q.shape[1]),
            "unit_products": len(payloads) * config.rows * config.lanes * 32,
            "results": len(got)}


_SIG = re.compile(r"^\\(\S+)(?:\s+\[(\d+)(?::(\d+))?\])?$")


def _sigspec(text):
    """``(name, lo, hi)`` of a simple RTLIL sigspec (``\\x``, ``\\x [3]``, ``\\x [7:0]``;
    ``hi`` None for a whole wire), else ``None`` (constants, concatenations)."""
    m = _SIG.match(text.strip())
    if not m:
        return None
    name, a, b = m.groups()
    if a is None:
        return name, 0, None
    return (name, int(b), int(a)) if b is not None else (name, int(a), int(a))


def rtlil_aliases(text: str, module: str = "top") -> dict:
    """Bit aliases of module ``module`` of an RTLIL text: ``{"x[3]": {"y[11]", ...}}`` from
    its module-level ``connect`` statements between wires (``connect \\x \\y [15:8]``), closed
    over chains. Yosys keeps one name for each such net (a flip-flop is named after any of
    them: ``even$195``, an alias of ``s1_tree_0_2``), the simulator's dump may show another."""
    widths, pairs = {}, []
    inside = False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("module "):
            inside = s.split()[1].lstrip("\\") == module
            continue
        if not inside:
            continue
        if s == "end" and not line.startswith(" "):
            inside = False
            continue
        if s.startswith("wire "):
            tok = s.split()
            w = int(tok[tok.index("width") + 1]) if "width" in tok else 1
            widths[tok[-1].lstrip("\\")] = w
        elif s.startswith("connect ") and not line.startswith("    "):
            body = s[len("connect "):]
            parts = re.match(r"(\\\S+(?:\s+\[[\d:]+\])?)\s+(\\\S+(?:\s+\[[\d:]+\])?)$", body)
            if parts:
                pairs.append((_sigspec(parts.group(1)), _sigspec(parts.group(2))))

    def bits(spec):
        name, lo, hi = spec
        w = widths.get(name, 1)
        hi = w - 1 if hi is None else hi
        return [f"{name}[{b}]" if w > 1 else name for b in range(lo, hi + 1)]
    parent = {}

    def find(x):
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x
    for a, b in pairs:
        if a is None or b is None:
            continue
        ba, bb = bits(a), bits(b)
        for x, y in zip(ba, bb):
            rx, ry = find(x), find(y)
            if rx != ry:
                parent[rx] = ry
    groups = {}
    for x in list(parent):
        groups.setdefault(find(x), set()).add(x)
    out = {}
    for g in groups.values():
        g = g | {find(next(iter(g)))}
        for x in g:
            out[x] = g - {x}
    return out


def annotate(net, activity: dict, aliases: dict | None = None) -> tuple[dict, list]:
    """``(activity by the netlist's source names, unmatched names)``: every register
    (:func:`~elmoe3d.synth.sta._reg_name`) and input port bit of ``net`` looked up in
    ``activity`` (:func:`vcd_activity`) under its own name or, failing that, under one of its
    RTLIL ``aliases`` (:func:`rtlil_aliases`)."""
    from .sta import _reg_name
    aliases = aliases or {}
    names = [_reg_name(g) for g in net.gates if g.type.startswith("DFF")] + list(net.inputs)
    out, missing = {}, []
    for n in names:
        a = activity.get(n)
        if a is None:
            for other in sorted(aliases.get(n, ())):
                a = activity.get(other)
                if a is not None:
                    break
        if a is None:
            missing.append(n)
        else:
            out[n] = a
    return out, missing


# ---- a weight stream through a streamline-ring station ---------------------------------------

def ring_station_run(station, vcd_path, *, words: int = 64, layer: int = 0) -> dict:
    """Stream the INT8 codes of all-MiniLM-L6-v2 FFN layer ``layer``'s up-projection weights
    (real weights, quantised as the PE stores them) through ``station``
    (:class:`~elmoe3d.hw.ring.RingStation`) in Amaranth's simulator: ``words`` W-bit words
    (rounded up to whole flits), unicast in flit-sized runs, run c (one flit of
    ``words_per_flit`` words, or the flits one word spans) to PE ``c mod pes`` of the die (so
    the station keeps ``local_pes / pes`` of them and forwards the rest), one flit offered
    every cycle, every sink always ready,
    writing the VCD to ``vcd_path``. Activity only: the words each PE receives are checked
    against the words sent to it (the ring's function is checked bit-exactly by
    ``tests/cocotb/test_ring.py``).

    Returns ``{"flits", "cycles", "bytes", "local_flits", "forwarded_flits"}``."""
    import numpy as np
    from amaranth.sim import Simulator

    from ..hw.ring import RingStation, pack_flit
    from ..sw.golden.quant import quantize_weights
    from ..sw.golden.ring import RingFlit
    from ..sw.host.minilm import ffn_weights

    assert isinstance(station, RingStation)
    up, _ = ffn_weights(layer)
    codes = quantize_weights(up, name=f"encoder.layer.{layer}.intermediate.dense.weight").q
    raw = np.ascontiguousarray(codes).view(np.uint8).reshape(-1)
    W, fb = station.word_bits, station.flit_bytes
    per, span = station.words_per_flit, station.flits_per_word
    wbytes = W // 8
    flits, expect, local = [], {}, 0
    for c in range(-(-words // per)):               # a run: one flit, or one word's flits
        run = [int.from_bytes(raw[i * wbytes:(i + 1) * wbytes].tobytes(), "little")
               for i in range(c * per, c * per + per)]
        pe = c % station.pes
        mine = station.first_pe <= pe < station.first_pe + station.local_pes
        if mine:
            expect.setdefault(pe - station.first_pe, []).extend(run)
        data = sum(w << (j * W) for j, w in enumerate(run))      # slot j: bits [jW, (j+1)W)
        for t in range(span):
            part = (data >> (t * fb * 8)) & ((1 << (fb * 8)) - 1)
            flits.append(pack_flit(RingFlit(data=part, dst_mask=1 << pe, stream=c % 2,
                                            last=t == span - 1, words=per), pes=station.pes,
                                   word_bits=W, flit_bytes=fb, stream_bits=station.stream_bits))
            local += mine
    got = {p: [] for p in range(station.local_pes)}
    counts = {"cycles": 0, "taken": 0}

    async def bench(ctx):
        if hasattr(station, "ring_o"):
            ctx.set(station.ring_o.ready, 1)
        for p in range(station.local_pes):
            ctx.set(station.ext[p].ready, 1)
        k = 0
        idle = 0
        while (k < len(flits) or idle < 8) and counts["cycles"] < 8 * len(flits) + 64:
            if k < len(flits):
                ctx.set(station.ring_i.valid, 1)
                ctx.set(station.ring_i.payload.as_value(), flits[k])
            else:
                ctx.set(station.ring_i.valid, 0)
                idle += 1
            taken = k < len(flits) and ctx.get(station.ring_i.ready)
            seen = [(p, ctx.get(station.ext[p].payload)) for p in range(station.local_pes)
                    if ctx.get(station.ext[p].valid)]
            await ctx.tick()
            counts["cycles"] += 1
            for p, v in seen:
                got[p].append(int(v))
            if taken:
                k += 1
                counts["taken"] += 1

    sim = Simulator(station)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    with sim.write_vcd(str(vcd_path)):
        sim.run()
    for p, words_p in expect.items():
        assert got[p] == words_p, f"ring station: PE {p} received other words than sent"
    return {"flits": len(flits), "cycles": counts["cycles"], "bytes": len(flits) * fb,
            "local_flits": local, "forwarded_flits": len(flits) - local}


# ---- a partial-sum reduction on the aggregation link ---------------------------------------

def link_reduce_run(link, vcd_path, *, tokens: int = 16, channels: int = 128,
                    layer: int = 0) -> dict:
    """REDUCE_ADD of real Q.24 partial sums on ``link``
    (:class:`~elmoe3d.hw.agg_link.AggregationLink`) in Amaranth's simulator, writing the VCD to
    ``vcd_path``: the all-MiniLM-L6-v2 FFN layer ``layer`` up-projection (real weights and
    activations of ``tokens`` GSM8K tokens, ``channels`` channels, FULL) split along K over the
    link's G PEs as tensor parallelism splits it, PE p's accumulators (:func:`~elmoe3d.sw.
    golden.datapath.gemm` of its K slice) packed W / 64 channels a word, every source offering
    its words at once, destination PE 0 always ready. The words PE 0 receives are compared with
    the sum of the partial sums (plain equality; none saturates here).

    Returns ``{"words", "cycles", "bytes_in", "bytes_out"}`` (``bytes_in``: every source's
    words; ``bytes_out``: the reduced words)."""
    import numpy as np
    from amaranth.sim import Simulator

    from ..hw.agg_link import AggregationLink, pack_link_op
    from ..sw.golden.agg_link import LinkMode, LinkOp
    from ..sw.golden.datapath import Mode, gemm
    from ..sw.golden.quant import GROUP, QuantizedWeight, quantize_activations, quantize_weights
    from ..sw.host.corpus import gsm8k_prompts
    from ..sw.host.minilm import ffn_activations, ffn_weights

    assert isinstance(link, AggregationLink)
    G, W = link.pes, link.word_bits
    lanes = W // 64
    ffn_in, _ = ffn_activations(gsm8k_prompts(), layer)
    up, _ = ffn_weights(layer)
    pick = np.unique(np.linspace(0, ffn_in.shape[0] - 1, tokens).round().astype(int))
    a_q = quantize_activations(ffn_in[pick], name=f"layer{layer}.ffn_in").q
    qw = quantize_weights(up[:channels], name=f"encoder.layer.{layer}.intermediate.dense.weight")
    k = a_q.shape[1]
    groups = k // GROUP
    if groups % G:
        raise ValueError(f"link_reduce_run: {groups} K-groups do not split over {G} PEs")
    per = groups // G
    parts = []
    for p in range(G):
        ks = slice(p * per * GROUP, (p + 1) * per * GROUP)
        sub = QuantizedWeight(q=qw.q[:, ks], scale=qw.scale[:, p * per:(p + 1) * per],
                              bits=qw.bits, name=qw.name)
        parts.append(gemm(a_q[:, ks], sub, Mode.FULL).acc)            # [tokens, channels]
    mask = (1 << 64) - 1

    def words_of(acc):
        flat = acc.reshape(-1)
        out = []
        for i in range(0, flat.size, lanes):
            v = 0
            for j, x in enumerate(flat[i:i + lanes].tolist()):
                v |= (int(x) & mask) << (64 * j)
            out.append(v)
        return out
    src = [words_of(a) for a in parts]
    want = words_of(sum(p.astype(np.int64) for p in parts))
    n = len(want)
    op = pack_link_op(LinkOp(mode=LinkMode.REDUCE_ADD, src_mask=(1 << G) - 1, dst_mask=1,
                             words=n), G)
    got, counts = [], {"cycles": 0}

    async def bench(ctx):
        for p in range(G):
            ctx.set(link.pe_o[p].ready, 1)
        ctx.set(link.op.valid, 1)
        ctx.set(link.op.payload.as_value(), op)
        nxt = [0] * G
        while len(got) < n and counts["cycles"] < 64 * n + 64:
            for p in range(G):
                if nxt[p] < n:
                    ctx.set(link.pe_i[p].valid, 1)
                    ctx.set(link.pe_i[p].payload, src[p][nxt[p]])
                else:
                    ctx.set(link.pe_i[p].valid, 0)
            op_taken = ctx.get(link.op.ready)
            taken = [ctx.get(link.pe_i[p].ready) and nxt[p] < n for p in range(G)]
            out = ctx.get(link.pe_o[0].payload) if ctx.get(link.pe_o[0].valid) else None
            await ctx.tick()
            counts["cycles"] += 1
            if op_taken:
                ctx.set(link.op.valid, 0)
            for p in range(G):
                if taken[p]:
                    nxt[p] += 1
            if out is not None:
                got.append(int(out))

    sim = Simulator(link)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    with sim.write_vcd(str(vcd_path)):
        sim.run()
    assert got == want, "aggregation link: the reduced words differ from the sum of the psums"
    return {"words": n, "cycles": counts["cycles"], "bytes_in": G * n * W // 8,
            "bytes_out": n * W // 8}

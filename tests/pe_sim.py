"""The small PE's Amaranth simulation, compiled once per build and shared by the tests that run
programs on it (``tests/amaranth/test_pe*.py``, ``tests/host/test_pe_cycles.py``).

Building Amaranth's simulator for the small PE (elaborate, then compile to Python) takes
longer than most programs run on it, so each pytest worker keeps the last :data:`KEPT`
simulations and :meth:`~amaranth.sim.Simulator.reset` s one between runs: every signal and
memory back to its initial value and the testbench restarted, the state a new simulator
starts from. A run that raises drops its simulation.
"""

import collections

from amaranth.sim import Simulator

from elmoe3d.hw.pe import PE

#: Simulations kept per worker (least recently used dropped first).
KEPT = 4

_SIMS = collections.OrderedDict()      # key -> (dut, sim, slot), newest last


def shared_pe(*, config, pe_options=None, dut=None):
    """The kept simulation of ``PE(config=config, **pe_options)``, built on first use; a given
    ``dut`` (a PE a test built for itself) gets a new simulation, not kept. Returns ``(dut,
    run)``: ``run(bench)`` runs the async testbench ``bench(ctx)`` from reset until it returns
    (a clock of 1 ns on ``sync``)."""
    assert dut is None or pe_options is None, "pe_options: give them to the dut instead"
    key = None if dut is not None else \
        ("options", repr(config), repr(sorted((pe_options or {}).items())))
    hit = _SIMS.pop(key, None) if key else None
    if hit is None:
        if dut is None:
            dut = PE(config=config, **(pe_options or {}))
        sim = Simulator(dut)                   # elaborates: dut.probes exists from here
        sim.add_clock(1e-9)
        slot = {"used": False}

        async def dispatch(ctx):
            await slot["bench"](ctx)
        sim.add_testbench(dispatch)
        hit = (dut, sim, slot)
    if key:
        _SIMS[key] = hit
        while len(_SIMS) > KEPT:
            _SIMS.popitem(last=False)
    dut, sim, slot = hit

    def run(bench):
        if slot["used"]:
            sim.reset()
        slot["bench"], slot["used"] = bench, True
        try:
            sim.run()
        except BaseException:
            if key:
                _SIMS.pop(key, None)
            raise
    return dut, run


def run_group_rtl(job, arch, *, link_flits=1, check=True, max_cycles=200000):
    """Cycles of every PE of ``job`` (a :class:`~elmoe3d.sw.host.parallel.GroupJob`, or any
    object with its ``pes``, ``programs``, ``ld``, ``link_ops`` and ``buffer_words``) on the
    RTL: ``job.pes`` PEs of ``arch`` joined by an
    :class:`~elmoe3d.hw.agg_link.AggregationLink` of ``job.buffer_words`` FIFO words whose
    flits make a word in ``link_flits`` cycles (Amaranth simulator, built per call). Every
    PE's ``cmd`` and ``ld`` offered every cycle, ``o`` always ready, the descriptors
    ``job.link_ops`` offered from cycle 0 in order. Returns ``(cycles, link_o, link_i)``:
    per PE the cycles from its first command taken to its last ``o`` beat, both counted
    (``CycleEstimate.cycles``), and the cycles (from its first command) each of its
    ``link_o`` words left it and each ``link_i`` word was taken (``CycleEstimate.link_o_at``,
    ``link_i_taken``). ``check``: every PE's ``o`` beats equal the functional group run's
    (:func:`~elmoe3d.sw.host.parallel.run_group`; STATUS beats on the
    :data:`~elmoe3d.isa.FUNCTIONAL_STATUS_FIELDS`); without it the run stops once each PE gave
    as many ``o`` beats as its program does alone (the functional simulator with zero
    ``link_i`` words)."""
    from amaranth.hdl import Elaboratable, Module, Value
    from amaranth.lib import wiring
    from elmoe3d.hw.agg_link import AggregationLink, pack_link_op
    from elmoe3d.sw.host.parallel import run_group

    W = arch.pe.word_bits
    if link_flits < 1 or W % (64 * link_flits):
        raise ValueError(f"link_flits: {link_flits} does not cut a {W}-bit word into whole "
                         f"64-bit flits")

    class Group(Elaboratable):
        def __init__(self):
            self.pes = [PE(config=arch) for _ in range(job.pes)]
            self.link = AggregationLink(pes=job.pes, word_bits=W, flit_bytes=W // 8 // link_flits,
                                        buffer_words=job.buffer_words)

        def elaborate(self, platform):
            m = Module()
            m.submodules.link = self.link
            for i, pe in enumerate(self.pes):
                m.submodules[f"pe{i}"] = pe
                wiring.connect(m, pe.link_o, self.link.pe_i[i])
                wiring.connect(m, self.link.pe_o[i], pe.link_i)
            return m

    top = Group()
    G = job.pes
    cmds = [p.encode() for p in job.programs]
    lds = [list(words) for words in job.ld]
    from elmoe3d.isa import FUNCTIONAL_STATUS_FIELDS, OKind
    from elmoe3d.sw.golden.asm import unpack_status

    def functional(kind, word):        # a STATUS beat's timing counters are the RTL's own
        kind = OKind(getattr(kind, "value", kind))
        if kind is not OKind.STATUS:
            return kind, word
        st = unpack_status(word)
        return kind, {f: st[f] for f in FUNCTIONAL_STATUS_FIELDS}
    if check:
        beats = [[functional(b.kind, b.data) for b in o] for o in run_group(job).o]
        n_o = [len(b) for b in beats]
    else:
        from elmoe3d.sw.golden import pe as fsim
        from elmoe3d.sw.host.parallel import _link_in_words
        n_o = [len(fsim.run(prog, job.ld[p], [0] * sum(_link_in_words(arch.pe, prog))).o)
               for p, prog in enumerate(job.programs)]
    ops = [pack_link_op(op, G) for op in job.link_ops]
    got = [[] for _ in range(G)]
    first, last = [None] * G, [None] * G
    link_o, link_i = [[] for _ in range(G)], [[] for _ in range(G)]

    async def bench(ctx):
        pc, pl = [0] * G, [0] * G
        opi = cycle = 0
        for pe in top.pes:
            ctx.set(pe.o.ready, 1)
        while opi < len(ops) or any(pc[p] < len(cmds[p]) or len(got[p]) < n_o[p]
                                    for p in range(G)):
            for p, pe in enumerate(top.pes):
                ctx.set(pe.cmd.valid, pc[p] < len(cmds[p]))
                if pc[p] < len(cmds[p]):
                    ctx.set(Value.cast(pe.cmd.payload), cmds[p][pc[p]])
                ctx.set(pe.ld.valid, pl[p] < len(lds[p]))
                if pl[p] < len(lds[p]):
                    ctx.set(pe.ld.payload, lds[p][pl[p]])
            ctx.set(top.link.op.valid, opi < len(ops))
            if opi < len(ops):
                ctx.set(top.link.op.payload.as_value(), ops[opi])
            for p, pe in enumerate(top.pes):
                if pc[p] < len(cmds[p]) and ctx.get(pe.cmd.ready):
                    first[p] = cycle if first[p] is None else first[p]
                    pc[p] += 1
                if pl[p] < len(lds[p]) and ctx.get(pe.ld.ready):
                    pl[p] += 1
                if ctx.get(pe.o.valid):
                    got[p].append(functional(ctx.get(pe.o.payload.kind),
                                             ctx.get(pe.o.payload.data)))
                    last[p] = cycle
                if ctx.get(pe.link_o.valid) and ctx.get(pe.link_o.ready):
                    link_o[p].append(cycle)
                if ctx.get(pe.link_i.valid) and ctx.get(pe.link_i.ready):
                    link_i[p].append(cycle)
            if opi < len(ops) and ctx.get(top.link.op.ready):
                opi += 1
            await ctx.tick()
            cycle += 1
            assert cycle < max_cycles, "timeout"

    sim = Simulator(top)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    for p in range(G):
        if check:
            bad = [i for i, (a, b) in enumerate(zip(got[p], beats[p])) if a != b]
            assert len(got[p]) == len(beats[p]) and not bad, \
                f"PE {p}: o beats {bad[:4]} of {len(beats[p])} differ from the group run"
    return ([last[p] - first[p] + 1 for p in range(G)],
            [[c - first[p] for c in link_o[p]] for p in range(G)],
            [[c - first[p] for c in link_i[p]] for p in range(G)])

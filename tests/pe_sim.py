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

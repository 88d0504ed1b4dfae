"""Real-routing schedules shared by the block tests (``tests/amaranth/test_ring.py``,
``tests/amaranth/test_agg_link.py``): the host's own layer-steps of the real Mixtral-8x7B
GSM8K trace (the ``gsm8k_routing`` fixture of ``tests/conftest.py``), so every block sees the
traffic the same schedule gives."""

from elmoe3d.sw.host.backends.golden import TRACE_WEIGHTS_SEED, trace_steps

#: The MoE layers of ``make sim``'s trace run (``--layers 0:32:8``).
REAL_LAYERS = (0, 8, 16, 24)
#: Decode positions 0 .. REAL_POSITIONS - 1 of each of the trace's two requests.
REAL_POSITIONS = 8


def mixtral_steps(trace, arch):
    """``(steps, weights)`` of :func:`~elmoe3d.sw.host.backends.golden.trace_steps` on the
    real Mixtral-8x7B GSM8K routing ``trace``: positions ``0 .. REAL_POSITIONS - 1`` of both
    requests decoded in lockstep (batch 2) by Elastic-SD at depth 4 (coverage acceptance 0.5,
    an HB cache of 32 experts' MSB slices; the pool and the throttled draft routing come from
    the trace) at :data:`REAL_LAYERS`, the experts placed on the groups of ``arch``; the
    synthetic experts and activations of seed ``TRACE_WEIGHTS_SEED`` (printed)."""
    print(f"seed: synthetic weights {TRACE_WEIGHTS_SEED}")
    return trace_steps(trace.select(trace.position < REAL_POSITIONS), arch,
                       layers=REAL_LAYERS, depth=4, batch=2)

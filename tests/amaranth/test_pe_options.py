"""PEOptions (:class:`elmoe3d.config.PEOptions`) against the RTL PE it describes: the timing
figures it derives (tile and sink latencies, SWIGLU / COMBINE row cycles, drain cycles) equal
the cycles measured on the PE in the Amaranth simulator for a few build options, and so do the
sinks' ``latency`` and ``row_cycles`` properties. (The other measured figures: result cycles
in ``test_pe.py::test_psum_in_throughput`` and ``test_combine_units_throughput``.)"""

import numpy as np
import pytest

from elmoe3d.config import FPGA_LEAN_PE, PEOptions
from elmoe3d.hw.checked import inspection
from elmoe3d.hw.pe.combine import CombineSink
from elmoe3d.hw.pe.swiglu import SwiGLUSink
from elmoe3d.isa import Sink
from elmoe3d.sw.golden import pe as fsim
from elmoe3d.sw.golden.datapath import Mode

from .test_pe import ARCH, expert_program, random_expert, run_pe


#: Build options whose timing differs (the small 2x4 PE of ``ARCH``).
TIMED_OPTIONS = {
    "default": {},
    "mul_stages-2": {"mul_stages": 2},
    "tile_passes-2": {"tile_passes": 2},
    "units-1": {"swiglu_units": 1, "combine_units": 1},
    "lean": dict(FPGA_LEAN_PE),
}


@pytest.mark.parametrize("options", TIMED_OPTIONS.values(), ids=TIMED_OPTIONS.keys())
def test_pe_options_timing_measured_on_the_pe(options):
    """One DRAFT expert of 2 tokens (one row block; up/gate: 16 results of 4 groups into
    SWIGLU, enough beats that the sink never stalls the tile; REQUANT; down: 16 results of 1
    group into COMBINE) on the RTL PE built with ``options``, its probes' cycles against
    PEOptions' figures (which the PE reads; none is typed here): the tile from the first
    result's last beat in to the result out (:attr:`~PEOptions.tile_latency`); the SWIGLU sink
    from the first result taken to the first HBUF write (``sink_latency[SWIGLU]``, also
    :attr:`SwiGLUSink.latency`) and its HBUF writes per row, one per sub-step
    (``swiglu_row_cycles[False]``); the COMBINE sink from the first COMBINE result taken to
    the first OUT write (``sink_latency[COMBINE]``, :attr:`CombineSink.latency`) and its OUT
    writes per row (``combine_row_cycles[False]``); the last SWIGLU beat to REQUANT's first
    ROWMAX read (:attr:`~PEOptions.drain_cycles`, the expert builder's scheduling figure)."""
    seed = 1300
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    opts = PEOptions(config=ARCH, **options)
    R, L, W = opts.rows, opts.lanes, opts.word_bits
    t, h, i = 2, 128, 32
    x_q, e_x, up, gate, down, gw, slots = random_expert(rng, t, h, i)
    prog, ld = expert_program(x_q, e_x, up, gate, down, gw, slots, Mode.DRAFT)
    ref = fsim.run(prog, ld)
    got = run_pe(prog.encode(), ld, n_o=len(ref.o), n_link=0, pe_options=options,
                 watch=("tile_in", "tile_out", "hbuf_write", "out_write", "rq_rowmax_read"))
    tile_in, tile_out = got["tile_in"], got["tile_out"]
    hbuf, out, first_requant = got["hbuf_write"], got["out_write"], got["rq_rowmax_read"][0]
    up_results, down_results, groups = 2 * i // L, h // L, h // 32   # DRAFT: L per block
    up_beats = [c for c in tile_in if c < first_requant]
    up_out = [c for c in tile_out if c < first_requant]
    down_out = [c for c in tile_out if c > first_requant]
    assert (len(up_beats), len(up_out), len(down_out)) == \
           (up_results * groups, up_results, down_results)
    measured = {
        "tile_latency": up_out[0] - up_beats[groups - 1],
        "swiglu sink latency": hbuf[0] - up_out[0],
        "swiglu_row_cycles": divmod(len(hbuf), up_results * R),
        "combine sink latency": out[0] - down_out[0],
        "combine_row_cycles": divmod(len(out), down_results * R),
        "drain_cycles": first_requant - up_beats[-1],
    }
    print(f"  measured {measured}")
    assert measured == {
        "tile_latency": opts.tile_latency,
        "swiglu sink latency": opts.sink_latency[Sink.SWIGLU],
        "swiglu_row_cycles": (opts.swiglu_row_cycles[False], 0),
        "combine sink latency": opts.sink_latency[Sink.COMBINE],
        "combine_row_cycles": (opts.combine_row_cycles[False], 0),
        "drain_cycles": opts.drain_cycles,
    }
    # the sinks' own figures (the PE builds them from the same options); inspected only
    with inspection():
        swiglu = SwiGLUSink(lanes=L, word_bits=W, swiglu_units=opts.swiglu_units,
                            mul_stages=opts.mul_stages)
        combine = CombineSink(lanes=L, word_bits=W, combine_units=opts.combine_units,
                              mul_stages=opts.mul_stages)
        figures = {"swiglu": (swiglu.latency, swiglu.row_cycles[False]),
                   "combine": (combine.latency, combine.row_cycles[False])}
        del swiglu, combine
    assert figures == {
        "swiglu": (measured["swiglu sink latency"], measured["swiglu_row_cycles"][0]),
        "combine": (measured["combine sink latency"], measured["combine_row_cycles"][0])}

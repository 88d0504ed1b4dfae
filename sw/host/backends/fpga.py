"""The FPGA backend: the golden run (:mod:`.golden`), then every PE program on an FPGA board
over its UART (the driver :mod:`elmoe3d.sw.host.fpga`, ``docs/fpga.md``), checked exactly as
the RTL backend's (:mod:`..pe_runs`). Small configuration only; the board must be built for
the same configuration (its INFO is checked when the session opens).

Options: ``--port`` (needed), ``--baud`` (default :data:`~..fpga.DEFAULT_BAUD`),
``--deadline`` (each PE program's base, :data:`~..fpga.DEFAULT_DEADLINE_S`, plus
:data:`~..fpga.WIRE_MARGIN` times its bytes' wire time; the first program that misses it
stops the run with a :class:`~..fpga.BoardError`).
"""

from __future__ import annotations

import contextlib

from ....errors import UserError
from .. import fpga as driver
from . import BackendRun, Option, RunContext, Session
from .golden import GoldenBackend
from .records import format_bytes, merge_layers


__all__ = ["FPGABackend", "CYCLES_NOTE", "INFO_FIELDS"]

#: What the FPGA backend's cycles are (the run's ``fpga.cycles_note``).
CYCLES_NOTE = "STATUS cycles of the board's PE (its clock), waiting on the UART included: not " \
              "the die's"
#: The board's INFO fields the run's document keeps (``board``).
INFO_FIELDS = ("version", "rows", "lanes", "word_bits", "hb_words", "ext_words", "frame_words",
               "clk_hz")


class FPGABackend(GoldenBackend):
    """``fpga``: the session opens the board at ``--port`` and says hello (document entry
    ``board``: port, baud, the INFO's baud as ``info_baud``, ``deadline_base_s`` and
    :data:`INFO_FIELDS`); each run is :meth:`~.golden.GoldenBackend.golden` with the jobs
    kept, then :func:`~..fpga.run_host_fpga` (its own progress bar, one tick per PE run).
    Records: the golden ones with the board's comparisons merged (untimed). Figures: the
    link totals (:meth:`~..fpga.HostFPGAResult.totals`), port, baud, ``cycles_note``."""

    name = "fpga"
    description = ("the golden run, then every PE program on the FPGA board at --port (its "
                   "UART), checked as rtl's")
    keeps_golden = True
    reference = "the functional simulation and ref_moe"
    options = (
        Option("port", "PORT", "the board's serial port (e.g. /dev/ttyUSB0; any pyserial URL)",
               needed="the board's serial port (e.g. /dev/ttyUSB0)"),
        Option("baud", "B", f"the UART rate of the board's bitstream (default "
                            f"{driver.DEFAULT_BAUD}, the rate `make fpga` builds)", type=int),
        Option("deadline", "S", f"seconds each PE program may take beyond "
                                f"{driver.WIRE_MARGIN} times its bytes' wire time at --baud "
                                f"(default {driver.DEFAULT_DEADLINE_S:g})", type=float),
    )

    def check_options(self, options: dict) -> None:
        baud, deadline = options.get("baud"), options.get("deadline")
        if baud is not None and baud < 1:
            raise UserError(f"--baud {baud}: expected a positive integer")
        if deadline is not None and not deadline > 0:
            raise UserError(f"--deadline {deadline:g}: expected seconds > 0")

    @contextlib.contextmanager
    def session(self, arch, options: dict):
        port = options["port"]
        baud = options.get("baud") or driver.DEFAULT_BAUD
        # open the board first: no board fails in seconds, not after the golden run
        board = driver.FpgaBoard.open(port, baud=baud, config=arch)
        try:
            info = board.hello()
            # info_baud: the rate the board's INFO reports (its bitstream's)
            doc = {"port": port, "baud": baud, "info_baud": info.baud,
                   "deadline_base_s": options.get("deadline") or driver.DEFAULT_DEADLINE_S,
                   **{k: getattr(info, k) for k in INFO_FIELDS}}
            yield Session(handle=board, doc={"board": doc})
        finally:
            board.close()

    def run(self, steps, ctx: RunContext) -> BackendRun:
        records, glayers = self.golden(steps, ctx)
        board = ctx.session.handle
        n_runs = sum(job.pes for gl in glayers for _, job, _, _ in gl.jobs)
        tick = ctx.progress_factory(n_runs, f"{self.name} {ctx.label}: PE runs") \
            if ctx.progress_factory else None
        fp = driver.run_host_fpga(glayers, ctx.arch, board,
                                  deadline_s=ctx.session.doc["board"]["deadline_base_s"],
                                  progress=tick)
        merge_layers(records, fp.layers, ctx.arch, timed=False)
        figures = {**fp.totals(), "port": board.port, "baud": board.baud,
                   "cycles_note": CYCLES_NOTE}
        return BackendRun(records=records, figures=figures)

    def report(self, label: str, figures: dict) -> list:
        from rich.markup import escape          # the lines are rich markup; a port is not
        x = figures
        naks = ", ".join(f"{k} {v}" for k, v in sorted(x["naks"].items())) or "none"
        return [f"{label}: FPGA on {escape(str(x['port']))} at {x['baud']} baud: "
                f"{x['pe_runs']} PE program runs in {x['seconds']:.1f} s, {x['frames']:,} frames "
                f"({x['retransmissions']} retransmitted, {x['polls']} polls; NAKs: {naks}), "
                f"{format_bytes(x['bytes_sent'])} sent, {format_bytes(x['bytes_received'])} "
                f"received; {x['cycles']:,} PE cycles ({x['cycles_note']})"]

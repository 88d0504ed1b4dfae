"""HB bank controller: the DRAM controller of one PE's hybrid-bonded bank (issue 4; paper
Sections 4.1 and 6, Table 1: 1024 pins at 0.4 GHz, tCCD_S = 2.5 ns, 51.2 GB/s per bank)."""

from __future__ import annotations

from ..config import ArchConfig
from .dram import DramController


__all__ = ["HBController"]


class HBController(DramController):
    """:class:`~elmoe3d.hw.dram.DramController` configured for ``config.hb`` at the
    logic-die clock ``config.clock_ghz`` (one per PE).

    Requests address 128-byte bursts (``config.hb.burst_bytes``; the PE's LOAD ``hb_addr``
    counts W-bit words, the die's load router converts); ``rdata`` beats are 1024-bit bursts,
    one per 2.5 ns DRAM clock at most (51.2 B per logic cycle at 1 GHz). Separate row and
    column command buses (HBM style), per-bank refresh (tRFCpb 160 ns). Ports, pipeline,
    address mapping and timing: :class:`~elmoe3d.hw.dram.DramController` and
    ``docs/memory.md``.

    Parameters
    ----------
    config : ArchConfig
    queue_depth, read_buffer, length_bits : int
        As :class:`~elmoe3d.hw.dram.DramController`.

    Raises
    ------
    TypeError
        ``config`` is not an ArchConfig.
    """

    @classmethod
    def check(cls, *, config, queue_depth, read_buffer, length_bits):
        """The constructor's checks (:class:`~elmoe3d.hw.checked.CheckedComponent`):
        raises before the object exists."""
        if not isinstance(config, ArchConfig):
            raise TypeError(f"config: expected an ArchConfig, got {type(config).__name__}")
        DramController.check(dram=config.hb, clock_ghz=config.clock_ghz,
                             queue_depth=queue_depth, read_buffer=read_buffer,
                             length_bits=length_bits)

    def __init__(self, *, config: ArchConfig, queue_depth: int = 128, read_buffer: int = 16,
                 length_bits: int = 16):
        self._arch = config
        super().__init__(dram=config.hb, clock_ghz=config.clock_ghz, queue_depth=queue_depth,
                         read_buffer=read_buffer, length_bits=length_bits)

    @property
    def arch(self) -> ArchConfig:
        return self._arch

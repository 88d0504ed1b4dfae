"""The one configuration object of ELMoE-3D.

The RTL generator, the golden model, the benches, the area roll-up and the performance model all
read their figures from an :class:`ArchConfig`; no figure is typed twice. Presets:

* ``small``     -- what the cocotb benches simulate (2x4x32 tensor tile).
* ``mid``       -- the paper PE's memories (32 KB WMEM, 32 KB IOMEM) with a 4x8x32 tile: real
  expert shapes in cocotb + Verilator within ``make test`` (issue 24).
* ``paper-4gb`` -- the paper's 16-PE die with 4 GB of HB DRAM (Table 1).
* ``paper-8gb`` -- the paper's 32-PE die with 8 GB of HB DRAM (Table 1).

Unknown keys in a dictionary or file are rejected, never silently defaulted.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType

from .checks import is_int, python_int_hint
from .isa import Sink


__all__ = ["TileConfig", "ArchConfig", "PEConfig", "PRESETS", "preset", "preset_key",
           "ConfigError", "DramConfig", "HB_BANK", "LPDDR5_6400_X16", "PEOptions", "FPGA_LEAN_PE",
           "UNIT_PE_LATENCY", "ROWMAX_LATENCY", "REQUANT_LATENCY", "FP32_LATENCY",
           "RAW_SINK_LATENCY", "tile_latency", "swiglu_latency", "combine_latency",
           "swiglu_sink_latency", "combine_sink_latency", "max_requant_units",
           "swiglu_row_cycles", "combine_row_cycles", "drain_cycles", "check_mul_stages",
           "unit_count", "LINK_OP_LATENCY", "link_reduce_stages", "link_latency",
           "EXT_CHUNK_WORDS", "DRAM_BACKGROUND", "DRAM_DIE_GBIT", "DRAM_PROXY_IDD",
           "DRAM_PROXY_VOLTS", "DRAM_PROXY_GBIT", "DRAM_ENERGY_FIELDS",
           "DRAM_BACKGROUND_DEFAULT"]


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names the field."""


def _check_int(name, value, *, lo=1, power_of_two=False, even=False):
    if not is_int(value, numpy=False):
        raise ConfigError(f"{name}: expected an integer{python_int_hint(value)}, got {value!r}")
    if value < lo:
        raise ConfigError(f"{name}: expected an integer >= {lo}, got {value}")
    if power_of_two and value & (value - 1):
        raise ConfigError(f"{name}: expected a power of two, got {value}")
    if even and value % 2:
        raise ConfigError(f"{name}: expected an even number, got {value}")


@dataclass(frozen=True)
class TileConfig:
    """Shape of the bit-sliced tensor tile (paper Section 4.1: 16x32x32 per PE).

    Attributes
    ----------
    rows : int
        M, activation rows (tokens) processed per cycle.
    lanes : int
        N, unit-PE lanes (one 32-way adder tree and one dequantization unit each). In FULL mode
        two lanes (MSB and LSB slice) make one output channel, so N/2 channels per cycle; in
        DRAFT, MSB_ONLY and LSB_ONLY each lane is a channel. Must be even.
    group : int
        G, depth of one adder tree = weight-quantization group size along K. Fixed at 32 by the
        numerics contract (numerics §1).
    """

    rows: int = 2
    lanes: int = 4
    group: int = 32

    def __post_init__(self):
        _check_int("tile.rows", self.rows)
        _check_int("tile.lanes", self.lanes, lo=2, even=True)
        _check_int("tile.group", self.group)
        if self.group != 32:
            raise ConfigError(f"tile.group: the numerics contract fixes G = 32, got {self.group}")

    @property
    def unit_pes(self) -> int:
        """Number of IA8xW5 unit PEs: rows x lanes x group."""
        return self.rows * self.lanes * self.group

    def peak_macs_per_cycle(self, weight_bits: int) -> int:
        """Multiply-accumulates per cycle at steady state for 8-bit (two unit PEs per weight)
        or 4-bit (one unit PE per weight) weights."""
        if weight_bits == 8:
            return self.unit_pes // 2
        if weight_bits == 4:
            return self.unit_pes
        raise ConfigError(f"weight_bits: expected 4 or 8, got {weight_bits}")


# == DRAM devices: geometry and timing (issue 4; owner: the DRAM controllers) =====================
#
# One frozen :class:`DramConfig` per DRAM tier. The RTL controllers (hw/dram.py), the
# behavioural device models that enforce the timing (sw/golden/dram.py), the benches and the
# performance model all read these figures; values are in ns as published, converted to clock
# cycles by :meth:`DramConfig.ck` (ceil, never below the standard's stated minimum in nCK).

#: Timing parameters of a :class:`DramConfig`, all in ns (0 = no such constraint).
DRAM_TIMINGS = ("RL", "WL", "tRCD", "tRP", "tRAS", "tRC", "tCCD_S", "tCCD_L", "tRRD_S",
                "tRRD_L", "tFAW", "tWR", "tRTP", "tWTR_S", "tWTR_L", "tPPD", "tREFI", "tRFCab",
                "tRFCpb", "tPBR2PBR", "tPBR2ACT")


def _ilog2(name, value):
    _check_int(name, value, power_of_two=True)
    return value.bit_length() - 1


@dataclass(frozen=True)
class DramConfig:
    """Geometry and timing of one DRAM channel (an HB bank, or one LPDDR5 x16 channel).

    The controller issues commands on the DRAM command clock (period ``tck_ns``); a column
    command (RD/WR) moves one burst of ``burst_bytes`` = ``data_bits / 8 * burst_length`` bytes
    over ``burst_ck`` = ``burst_length / data_rate`` command clocks. Peak bandwidth
    :attr:`peak_gbps` = ``burst_bytes / (burst_ck * tck_ns)`` GB/s.

    Organisation: ``bank_groups`` x ``banks_per_group`` banks of ``rows`` rows of
    ``page_bytes`` (one row = :attr:`columns` bursts). ``rows=None`` inside an
    :class:`ArchConfig` means "derived from the tier's capacity". Bank ``b`` is in bank group
    ``b % bank_groups`` (:meth:`decode` gives the address mapping).

    Timing (ns, as published; :data:`DRAM_TIMINGS`): ``RL``/``WL`` read/write latency (CL/CWL),
    ``tRCD`` ACT->RD/WR, ``tRP`` PRE->ACT (per bank), ``tRAS`` ACT->PRE, ``tRC`` ACT->ACT same
    bank, ``tCCD_S``/``tCCD_L`` column->column in different / the same bank group, ``tRRD_S``/
    ``tRRD_L`` ACT->ACT in different / the same bank group (channel scope), ``tFAW`` window of
    four ACTs (channel scope), ``tWR`` write recovery (end of write data -> PRE), ``tRTP``
    RD->PRE, ``tWTR_S``/``tWTR_L`` end of write data -> RD, ``tPPD`` PRE->PRE, ``tREFI`` average
    refresh interval (every bank once per tREFI), ``tRFCab``/``tRFCpb`` all-bank / per-bank
    refresh cycle, ``tPBR2PBR`` per-bank REF -> per-bank REF, ``tPBR2ACT`` per-bank REF -> ACT
    of another bank. ``min_ck`` holds the standard's minimum in command clocks for a parameter
    (``((name, nCK), ...)``): :meth:`ck` never returns less.

    Refresh: ``per_bank_refresh`` selects per-bank refresh (one REFpb refreshes the
    ``refpb_banks`` banks ``u, u + U, ...`` of unit ``u``, ``U = banks / refpb_banks``, each
    unit once per tREFI, in any order within a round) or all-bank refresh (REFab once per
    tREFI). ``max_postponed`` refreshes may be owed at once (JEDEC: 8), so every bank is
    refreshed at least once every ``(max_postponed + 1) * tREFI``.

    ``dual_command_bus``: separate row (ACT/PRE/REF) and column (RD/WR) command buses, as in
    HBM; otherwise one command per command clock (LPDDR5).

    Raises :class:`ConfigError` naming the field on a bad value.
    """

    standard: str
    source: str
    tck_ns: float
    data_bits: int
    data_rate: int
    burst_length: int
    bank_groups: int
    banks_per_group: int
    page_bytes: int
    rows: int | None
    RL: float
    WL: float
    tRCD: float
    tRP: float
    tRAS: float
    tRC: float
    tCCD_S: float
    tCCD_L: float
    tRRD_S: float
    tRRD_L: float
    tFAW: float
    tWR: float
    tRTP: float
    tWTR_S: float
    tWTR_L: float
    tPPD: float
    tREFI: float
    tRFCab: float
    tRFCpb: float
    tPBR2PBR: float
    tPBR2ACT: float
    min_ck: tuple = ()
    per_bank_refresh: bool = True
    refpb_banks: int = 1
    max_postponed: int = 8
    dual_command_bus: bool = False

    def __post_init__(self):
        for name in ("standard", "source"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"{name}: expected a non-empty string, got "
                                  f"{getattr(self, name)!r}")
        if not isinstance(self.tck_ns, (int, float)) or isinstance(self.tck_ns, bool) \
                or not self.tck_ns > 0:
            raise ConfigError(f"tck_ns: expected a positive number of ns, got {self.tck_ns!r}")
        for name in ("data_bits", "data_rate", "burst_length", "bank_groups", "banks_per_group",
                     "page_bytes", "refpb_banks"):
            _ilog2(name, getattr(self, name))
        _check_int("max_postponed", self.max_postponed)
        if self.rows is not None:
            _ilog2("rows", self.rows)
        for name in DRAM_TIMINGS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name}: expected a non-negative number of ns, got {value!r}")
        for name in ("per_bank_refresh", "dual_command_bus"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: expected true or false, got {getattr(self, name)!r}")
        if self.burst_length % self.data_rate:
            raise ConfigError(f"burst_length: {self.burst_length} is not a multiple of "
                              f"data_rate ({self.data_rate})")
        if self.page_bytes % self.burst_bytes:
            raise ConfigError(f"page_bytes: {self.page_bytes} is not a multiple of the burst "
                              f"({self.burst_bytes} B)")
        if self.refpb_banks > self.banks:
            raise ConfigError(f"refpb_banks: {self.refpb_banks} exceeds the {self.banks} banks")
        try:
            pairs = tuple(sorted((str(k), v) for k, v in
                                 (self.min_ck.items() if isinstance(self.min_ck, dict)
                                  else self.min_ck)))
        except (TypeError, ValueError):
            raise ConfigError(f"min_ck: expected (name, cycles) pairs, got {self.min_ck!r}") \
                from None
        for k, v in pairs:
            if k not in DRAM_TIMINGS:
                raise ConfigError(f"min_ck: unknown timing {k!r}; expected one of "
                                  f"{', '.join(DRAM_TIMINGS)}")
            _check_int(f"min_ck.{k}", v, lo=0)
        object.__setattr__(self, "min_ck", pairs)
        if self.ck("tCCD_S") < self.burst_ck:
            raise ConfigError(f"tCCD_S: {self.ck('tCCD_S')} clocks is shorter than a burst "
                              f"({self.burst_ck} clocks)")
        if self.ck("tREFI") < self.refresh_units:
            raise ConfigError(f"tREFI: {self.tREFI} ns leaves less than one clock per refresh")

    @classmethod
    def from_dict(cls, values: dict, *, where: str = "dram") -> "DramConfig":
        """Build from a plain dictionary; raises :class:`ConfigError` naming unknown keys."""
        if isinstance(values, cls):
            return values
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: expected a table of DRAM fields, got {values!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown configuration key(s) in {where}: {', '.join(unknown)}; "
                              f"known keys: {', '.join(sorted(known))}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.name not in values and f.default is dataclasses.MISSING)
        if missing:
            raise ConfigError(f"missing configuration key(s) in {where}: {', '.join(missing)}")
        return cls(**values)

    # -- geometry --

    @property
    def banks(self) -> int:
        return self.bank_groups * self.banks_per_group

    @property
    def burst_bytes(self) -> int:
        """Bytes moved by one RD or WR (one burst)."""
        return self.data_bits // 8 * self.burst_length

    @property
    def burst_ck(self) -> int:
        """Command clocks the data bus is busy with one burst."""
        return self.burst_length // self.data_rate

    @property
    def columns(self) -> int:
        """Bursts per row (page)."""
        return self.page_bytes // self.burst_bytes

    @property
    def capacity_bytes(self) -> int:
        if self.rows is None:
            raise ConfigError("rows: not set (derived from the capacity inside an ArchConfig)")
        return self.banks * self.rows * self.page_bytes

    @property
    def bursts(self) -> int:
        """Capacity in bursts (the address space of the controller's requests)."""
        return self.capacity_bytes // self.burst_bytes

    @property
    def peak_gbps(self) -> float:
        """Peak data-bus bandwidth, GB/s (one burst every ``burst_ck`` clocks)."""
        return self.burst_bytes / (self.burst_ck * self.tck_ns)

    @property
    def refresh_units(self) -> int:
        """Refresh commands per tREFI: banks / refpb_banks (per-bank) or 1 (all-bank)."""
        return self.banks // self.refpb_banks if self.per_bank_refresh else 1

    def with_capacity(self, capacity_bytes: int, *, where: str = "dram") -> "DramConfig":
        """This configuration with ``rows`` derived from ``capacity_bytes`` (or checked
        against it when set). Raises :class:`ConfigError` when it does not divide."""
        per_row = self.banks * self.page_bytes
        rows = capacity_bytes // per_row
        if capacity_bytes % per_row or rows < 1 or rows & (rows - 1):
            raise ConfigError(f"{where}: capacity {capacity_bytes} B is not a power-of-two "
                              f"number of rows of {self.banks} banks x {self.page_bytes} B")
        if self.rows is not None and self.rows != rows:
            raise ConfigError(f"{where}.rows: {self.rows} rows x {self.banks} banks x "
                              f"{self.page_bytes} B = {self.rows * per_row} B differs from the "
                              f"capacity {capacity_bytes} B")
        return dataclasses.replace(self, rows=rows)

    def decode(self, addr: int) -> tuple:
        """Address mapping of a burst address (the controllers' request unit) ->
        ``(bank, row, column)``. Bits from LSB: bank group, column, bank within the group,
        row (``row : ba : col : bg``): consecutive bursts alternate bank groups (tCCD_S, not
        tCCD_L, between them), then walk the columns of one row in every group, then move to
        the next bank of each group, so a streaming read keeps ``bank_groups`` rows open and
        opens the next ones while the current ones are read. Addresses wrap modulo
        :attr:`bursts`."""
        addr %= self.bursts
        bg = addr % self.bank_groups
        addr //= self.bank_groups
        col = addr % self.columns
        addr //= self.columns
        ba = addr % self.banks_per_group
        row = addr // self.banks_per_group
        return ba * self.bank_groups + bg, row, col

    def encode(self, bank: int, row: int, col: int) -> int:
        """Inverse of :meth:`decode`."""
        bg, ba = bank % self.bank_groups, bank // self.bank_groups
        return ((row * self.banks_per_group + ba) * self.columns + col) * self.bank_groups + bg

    # -- timing in clock cycles --

    def ck(self, name: str) -> int:
        """Parameter ``name`` in DRAM command clocks: ``ceil(ns / tck_ns)``, at least the
        standard's minimum (``min_ck``). Raises :class:`ConfigError` on an unknown name."""
        if name not in DRAM_TIMINGS:
            raise ConfigError(f"timing: unknown parameter {name!r}; expected one of "
                              f"{', '.join(DRAM_TIMINGS)}")
        cycles = -(-round(getattr(self, name) * 1000) // round(self.tck_ns * 1000))
        return max(cycles, dict(self.min_ck).get(name, 0))

    def logic_cycles(self, name: str, clock_ghz: float) -> int:
        """Parameter ``name`` (after :meth:`ck`) in cycles of a ``clock_ghz`` logic clock
        (ceil), for performance models that count logic cycles."""
        ns = self.ck(name) * self.tck_ns
        return -(-round(ns * clock_ghz * 1000) // 1000)

    @property
    def first_read_ck(self) -> int:
        """DRAM clocks from the ACT of a closed bank to its first read burst complete:
        tRCD + RL + the burst (:attr:`burst_ck`)."""
        return self.ck("tRCD") + self.ck("RL") + self.burst_ck

    def first_read_cycles(self, clock_ghz: float) -> int:
        """:attr:`first_read_ck` in cycles of a ``clock_ghz`` logic clock (ceil): the DRAM's
        share of the time from a read request to its first word (the controller's queue and
        clock-edge phase add 3 cycles, the die's command port more: ``docs/host.md``
        section 7). 33 for the HB bank, 47 for LPDDR5-6400 at 1 GHz."""
        ns = self.first_read_ck * self.tck_ns
        return -(-round(ns * clock_ghz * 1000) // 1000)

    def timing_table(self) -> list:
        """``[(name, ns, clocks), ...]`` for every timing parameter (docs and reports)."""
        return [(n, getattr(self, n), self.ck(n)) for n in DRAM_TIMINGS]

    # -- derived spacings (command clocks) used by the controller and the checker --

    @property
    def rtw_ck(self) -> int:
        """RD -> WR (any bank): RL + burst + 2 - WL (bus turnaround with a one-clock write
        preamble, as Ramulator2's HBM2/LPDDR5 models)."""
        return max(1, self.ck("RL") + self.burst_ck + 2 - self.ck("WL"))

    def wtr_ck(self, same_group: bool) -> int:
        """WR -> RD: WL + burst + tWTR_L (same bank group) or tWTR_S."""
        return self.ck("WL") + self.burst_ck + self.ck("tWTR_L" if same_group else "tWTR_S")

    @property
    def wr_to_pre_ck(self) -> int:
        """WR -> PRE (same bank): WL + burst + tWR."""
        return self.ck("WL") + self.burst_ck + self.ck("tWR")

    @property
    def refresh_ck(self) -> int:
        """tRFCpb or tRFCab, whichever the refresh mode uses."""
        return self.ck("tRFCpb" if self.per_bank_refresh else "tRFCab")

    @property
    def refresh_interval_ck(self) -> int:
        """Command clocks between two refresh commands: floor(tREFI / refresh_units)."""
        return self.ck("tREFI") // self.refresh_units


#: The HB bank of one PE (paper Section 6 and Table 1): 1024 data pins at 0.4 GHz (one
#: 1024-bit = 128 B transfer per 2.5 ns clock), limited by tCCD_S = 2.5 ns (Han et al., 2025, as
#: cited by the paper): 51.2 GB/s. 4 bank groups x 4 banks, 2 KB rows (our choice; the paper
#: gives none), rows derived from the capacity (256 MB per bank in the paper presets). Separate
#: row and column command buses as in HBM. The paper gives no other timing: the array timings
#: are HBM2's (JESD235) as published in DRAMsim3 ``configs/HBM2_8Gb_x128.ini`` (tCK = 1 ns, so
#: its cycle counts are ns): CL 14, CWL 4, tRCD 14, tRP 14, tRAS 34, tRRD_S/L 4/6, tFAW 30,
#: tWR 16, tRTP_L 6, tWTR_S/L 6/8, tREFI 3900, tRFC 260; tRFCSB 160 ns and tRREFD 8 ns (per-bank
#: refresh spacing) from Ramulator2 ``src/dram/impl/HBM2.cpp``; tRC = tRAS + tRP. tCCD_L =
#: 2 x tCCD_S = 5 ns, HBM2's ratio of tCCD_L to tCCD_S (DRAMsim3: 2 and 1 tCK).
HB_BANK = DramConfig(
    standard="HB (hybrid-bonded DRAM bank, HBM2 array timing)",
    source="paper Table 1/Sec. 6 (1024 pins, 0.4 GHz, tCCD_S 2.5 ns); HBM2 JESD235 timings as "
           "in DRAMsim3 configs/HBM2_8Gb_x128.ini and Ramulator2 src/dram/impl/HBM2.cpp "
           "(tRFCSB, tRREFD)",
    tck_ns=2.5, data_bits=1024, data_rate=1, burst_length=1, bank_groups=4, banks_per_group=4,
    page_bytes=2048, rows=None,
    RL=14, WL=4, tRCD=14, tRP=14, tRAS=34, tRC=48, tCCD_S=2.5, tCCD_L=5.0, tRRD_S=4, tRRD_L=6,
    tFAW=30, tWR=16, tRTP=6, tWTR_S=6, tWTR_L=8, tPPD=0, tREFI=3900, tRFCab=260, tRFCpb=160,
    tPBR2PBR=8, tPBR2ACT=8, per_bank_refresh=True, refpb_banks=1, max_postponed=8,
    dual_command_bus=True)

#: One LPDDR5-6400 x16 channel (JEDEC JESD209-5, bank-group mode: 4 bank groups x 4 banks,
#: 2 KB page; CK = 800 MHz, WCK:CK = 4:1, 16 bits x 8 transfers per CK = 12.8 GB/s; eight of
#: them give the paper's 102.4 GB/s). BL16 = 32 B over 2 CK; tCCD_S = 2 CK and tCCD_L = 4 CK
#: (BG mode, BL16). Array timings as published in Ramulator2 ``src/dram/impl/LPDDR5.cpp``
#: (preset LPDDR5_6400 and its 16 Gb refresh tables): RL 20 CK, WL 11 CK, tRCD 18, tRPpb 18,
#: tRAS 42, tWR 34, tRTP 7.5 (min 4 nCK), tRRD 5 (min 2 nCK), tWTR_S/L
#: 6.25/12, tFAW 20, tPPD 2 CK, tREFI 3906, tRFCab 280, tRFCpb 140, tPBR2PBR 90, tPBR2ACT 8 ns;
#: tRC = tRAS + tRPpb = 60 ns. Per-bank refresh refreshes a bank pair (b, b + 8) in 16-bank mode.
#: Rows are derived from the capacity (8 GB per channel in the paper presets: one rank of
#: 2 KB x 16 banks x 256 Ki rows, a simplification of the multi-die channel).
LPDDR5_6400_X16 = DramConfig(
    standard="LPDDR5-6400 x16 (BG mode)",
    source="JEDEC JESD209-5 LPDDR5-6400 as published in Ramulator2 src/dram/impl/LPDDR5.cpp "
           "(LPDDR5_6400 preset, 16 Gb refresh tables)",
    tck_ns=1.25, data_bits=16, data_rate=8, burst_length=16, bank_groups=4, banks_per_group=4,
    page_bytes=2048, rows=None,
    RL=25, WL=13.75, tRCD=18, tRP=18, tRAS=42, tRC=60, tCCD_S=2.5, tCCD_L=5.0, tRRD_S=5,
    tRRD_L=5, tFAW=20, tWR=34, tRTP=7.5, tWTR_S=6.25, tWTR_L=12, tPPD=0, tREFI=3906,
    tRFCab=280, tRFCpb=140, tPBR2PBR=90, tPBR2ACT=8,
    min_ck=(("tPPD", 2), ("tRRD_S", 2), ("tRRD_L", 2), ("tRTP", 4)),
    per_bank_refresh=True, refpb_banks=2, max_postponed=8, dual_command_bus=False)

#: The currents of the DRAM whose background power :data:`DRAM_BACKGROUND` counts, mA on
#: (VDD1, VDD2, VDDQ), by IDD state. No LPDDR5 IDD table is in our copy (the paper cites
#: Micron's LPDDR5-6400 data sheet, not in it): these are one x16 channel of a Micron LPDDR4-3200
#: part, 6 Gb a channel (a 12 Gb die has two), as the DRAMSys memspec
#: ``configs/memspec/MICRON_6Gb_LPDDR4-3200_32bit_A.json`` (tukl-msd/DRAMSys at 3ff9a99, also
#: in DRAMPower) gives them: IDD2N precharge standby, IDD2P precharge power-down, IDD5AB the
#: all-bank refresh's average current at tREFI (standby included), IDD6 self-refresh.
DRAM_PROXY_IDD = MappingProxyType({
    "IDD2N": (2.0, 27.0, 0.75), "IDD2P": (1.2, 3.0, 0.75), "IDD5AB": (2.5, 30.0, 0.75),
    "IDD6": (0.3, 0.5, 0.1)})
#: The proxy channel's rail voltages (VDD1, VDD2, VDDQ), V.
DRAM_PROXY_VOLTS = (1.8, 1.1, 1.1)
#: The proxy channel's capacity, Gb.
DRAM_PROXY_GBIT = 6
#: The capacity of one x16 channel's die whose standby :data:`DRAM_BACKGROUND` counts once:
#: 16 Gb, an LPDDR5 die (a single x16 channel, Micron's LPDDR5 data sheet) of
#: :data:`LPDDR5_6400_X16`'s refresh tables; 64 GiB is then 32 dies.
DRAM_DIE_GBIT = 16


def _proxy_mw(state: str) -> float:
    """The proxy channel's power in ``state`` (:data:`DRAM_PROXY_IDD`), mW: sum of mA x V."""
    return sum(ma * v for ma, v in zip(DRAM_PROXY_IDD[state], DRAM_PROXY_VOLTS))


#: Refresh at tREFI, mW a GiB: IDD5AB - IDD2N of the proxy, taken per bit (every row is
#: refreshed): 4.2 mW a 6 Gb channel, 5.6 a GiB.
_REFRESH_MW_PER_GIB = 8 * (_proxy_mw("IDD5AB") - _proxy_mw("IDD2N")) / DRAM_PROXY_GBIT
#: DRAM background power (what a DRAM draws with no access: its periphery and its refresh), mW a
#: GiB of capacity, by the state its dies idle in for the whole run (docs/paper.md section 7):
#:
#: * ``"standby"``: precharge standby (IDD2N) a die of :data:`DRAM_DIE_GBIT` (a die's periphery
#:   does not grow with its capacity) and refresh per bit: 22.66. No die is ever powered down:
#:   the upper end;
#: * ``"power-down"``: precharge power-down (IDD2P) and refresh the same way: 8.74. Every die
#:   sits powered down between its accesses (LPDDR5's power-down exits in tXP, 7 ns), and the
#:   die being read draws its active standby inside the read energy (``ext_pj_per_bit``): the
#:   default of :attr:`ArchConfig.hb_background_mw_per_gb` and ``ext_background_mw_per_gb``;
#: * ``"self-refresh"``: self-refresh (IDD6, its refresh included) per bit: 1.60. Every die idle
#:   in self-refresh, no exit cost: the lower end;
#: * ``"none"``: not counted (the logic die's leakage alone, as before 2026-12-06).
#:
#: The proxy's figures stand for LPDDR5's (its VDD2H is 1.05 V against LPDDR4's 1.1 V, its clock
#: faster) and for the HB's dies (the paper scales their read energy to LPDDR5's low-voltage
#: condition, Section 6; their 1,024-pin banks' periphery is in no figure we have).
DRAM_BACKGROUND = MappingProxyType({
    "standby": _proxy_mw("IDD2N") * 8 / DRAM_DIE_GBIT + _REFRESH_MW_PER_GIB,
    "power-down": _proxy_mw("IDD2P") * 8 / DRAM_DIE_GBIT + _REFRESH_MW_PER_GIB,
    "self-refresh": _proxy_mw("IDD6") * 8 / DRAM_PROXY_GBIT,
    "none": 0.0})
#: The state :class:`ArchConfig`'s background figures default to.
DRAM_BACKGROUND_DEFAULT = "power-down"

#: The :class:`ArchConfig` fields that price the DRAM, not the logic die: a configuration that
#: changes only these keeps its preset's measured die static power
#: (:meth:`~elmoe3d.synth.energy.DieEnergy.static_of`).
DRAM_ENERGY_FIELDS = ("hb_pj_per_bit", "ext_pj_per_bit", "hb_background_mw_per_gb",
                      "ext_background_mw_per_gb")

# == end of the DRAM section =======================================================================


@dataclass(frozen=True)
class ArchConfig:
    """Architecture of one ELMoE-3D logic die and its memories (paper Table 1).

    Attributes
    ----------
    name : str
        Preset name, for reports.
    tile : TileConfig
        Tensor tile inside each PE.
    pes : int
        Number of PEs on the logic die (16 with 4 GB HB, 32 with 8 GB).
    pes_per_group : int
        PEs joined by one aggregation link. The paper does not give it; 4 is our default.
    clock_ghz : float
        Logic-die clock (1.0 GHz, ASAP7).
    wmem_bytes, iomem_bytes : int
        Per-PE weight and input/output SRAM (32 KB each in the paper).
    hb_bank_gbps : float
        HB bandwidth per bank, GB/s (51.2: 1024 pins at 0.4 GHz, tCCD_S = 2.5 ns).
    hb_bank_bytes : int
        HB capacity per bank (256 MB).
    hb_pj_per_bit, ext_pj_per_bit : float
        Access energy (0.43 and 3.88 pJ/bit).
    ext_gbps : float
        LPDDR5-6400, 8 channels x16: 102.4 GB/s.
    ext_bytes : int
        External capacity (64 GB).
    hb_background_mw_per_gb, ext_background_mw_per_gb : float
        DRAM background power (idle periphery and refresh), mW a GiB of HB and of EXT (8.74,
        the :data:`DRAM_BACKGROUND` ``"power-down"`` figure; 0 counts none): Fig. 15's
        static energy beside the logic die's leakage (:attr:`dram_background_mw`).
    streamline_gbps, aggregation_gbps : float
        Streamline ring (128 GB/s) and aggregation link (32 GB/s).
    hb : DramConfig
        Geometry and timing of one HB bank (:data:`HB_BANK`); ``rows`` is derived from
        ``hb_bank_bytes`` (or checked against it) and its peak bandwidth must equal
        ``hb_bank_gbps``. A dictionary is merged over :data:`HB_BANK`.
    ext : DramConfig
        One external-memory channel (:data:`LPDDR5_6400_X16`); rows derived from
        ``ext_bytes / ext_channels``; ``ext_channels`` x its peak must equal ``ext_gbps``.
    ext_channels : int
        External-memory channels (8 x16 LPDDR5 channels in the paper).
    iomem_split : tuple of 4 int
        IOMEM words of ACT, TOK, HBUF and OUT in 32nds of ``iomem_bytes`` (sum 32); default
        (4, 1, 16, 11). The ``mid`` preset gives ACT more (a row block's x and h of a real
        expert, ``docs/pe.md`` "Real expert shapes").
    """

    name: str = "small"
    tile: TileConfig = field(default_factory=TileConfig)
    pes: int = 4
    pes_per_group: int = 2
    clock_ghz: float = 1.0
    wmem_bytes: int = 8192
    iomem_bytes: int = 32768
    hb_bank_gbps: float = 51.2
    hb_bank_bytes: int = 1 << 20
    hb_pj_per_bit: float = 0.43
    ext_gbps: float = 102.4
    ext_bytes: int = 64 << 20
    ext_pj_per_bit: float = 3.88
    hb_background_mw_per_gb: float = DRAM_BACKGROUND[DRAM_BACKGROUND_DEFAULT]
    ext_background_mw_per_gb: float = DRAM_BACKGROUND[DRAM_BACKGROUND_DEFAULT]
    streamline_gbps: float = 128.0
    aggregation_gbps: float = 32.0
    hb: DramConfig = HB_BANK
    ext: DramConfig = LPDDR5_6400_X16
    ext_channels: int = 8
    iomem_split: tuple = (4, 1, 16, 11)

    def __post_init__(self):
        object.__setattr__(self, "iomem_split", tuple(self.iomem_split))
        split = self.iomem_split
        if (len(split) != 4 or any(not is_int(v, numpy=False) or v < 1
                                   for v in split) or sum(split) != 32):
            raise ConfigError(f"iomem_split: expected four positive integers (ACT, TOK, HBUF, "
                              f"OUT in 32nds of IOMEM) summing to 32, got {self.iomem_split!r}")
        if not isinstance(self.tile, TileConfig):
            raise ConfigError(f"tile: expected a TileConfig, got {type(self.tile).__name__}")
        _check_int("pes", self.pes)
        _check_int("pes_per_group", self.pes_per_group)
        if self.pes % self.pes_per_group:
            raise ConfigError(f"pes: {self.pes} is not a multiple of pes_per_group "
                              f"({self.pes_per_group})")
        for name in ("wmem_bytes", "iomem_bytes", "hb_bank_bytes", "ext_bytes"):
            _check_int(name, getattr(self, name))
        for name in ("clock_ghz", "hb_bank_gbps", "ext_gbps", "streamline_gbps",
                     "aggregation_gbps", "hb_pj_per_bit", "ext_pj_per_bit"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"{name}: expected a positive number, got {value!r}")
        for name in ("hb_background_mw_per_gb", "ext_background_mw_per_gb"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value) or value < 0):
                raise ConfigError(f"{name}: expected a non-negative number of mW a GiB, got "
                                  f"{value!r}")
        self._check_dram()

    def _check_dram(self):
        """DRAM section (issue 4): derive rows from the capacities, check the bandwidths."""
        for name in ("hb", "ext"):
            if not isinstance(getattr(self, name), DramConfig):
                raise ConfigError(f"{name}: expected a DramConfig, got "
                                  f"{type(getattr(self, name)).__name__}")
        _check_int("ext_channels", self.ext_channels)
        if self.ext_bytes % self.ext_channels:
            raise ConfigError(f"ext_bytes: {self.ext_bytes} is not a multiple of ext_channels "
                              f"({self.ext_channels})")
        object.__setattr__(self, "hb", self.hb.with_capacity(self.hb_bank_bytes, where="hb"))
        object.__setattr__(self, "ext", self.ext.with_capacity(
            self.ext_bytes // self.ext_channels, where="ext"))
        if abs(self.hb.peak_gbps - self.hb_bank_gbps) > 1e-9 * self.hb_bank_gbps:
            raise ConfigError(f"hb_bank_gbps: {self.hb_bank_gbps} differs from the HB bank's "
                              f"peak {self.hb.peak_gbps:g} GB/s ({self.hb.burst_bytes} B per "
                              f"{self.hb.burst_ck} x {self.hb.tck_ns} ns)")
        ext_peak = self.ext.peak_gbps * self.ext_channels
        if abs(ext_peak - self.ext_gbps) > 1e-9 * self.ext_gbps:
            raise ConfigError(f"ext_gbps: {self.ext_gbps} differs from ext_channels x the "
                              f"channel's peak = {ext_peak:g} GB/s")

    @property
    def groups(self) -> int:
        """Number of PE groups (aggregation-link domains)."""
        return self.pes // self.pes_per_group

    @property
    def hb_bytes(self) -> int:
        """The die's HB capacity in bytes: ``pes x hb_bank_bytes`` (a bank per PE, Section
        4.1; 4 GiB on paper-4gb, 8 GiB on paper-8gb)."""
        return self.pes * self.hb_bank_bytes

    @property
    def hb_bytes_per_cycle(self) -> float:
        """HB bytes delivered per logic-die cycle per bank (51.2 at 1 GHz)."""
        return self.hb_bank_gbps / self.clock_ghz

    @property
    def hb_ld_words_per_cycle(self) -> float:
        """PE words a bank delivers per logic cycle (:attr:`hb_bytes_per_cycle` / the PE
        word: 0.8 on the small PE, 0.4 on mid, 0.1 on the paper PE): the ``ld`` pacing of an
        HB-fed program."""
        return self.hb_bytes_per_cycle / self.pe.word_bytes

    @property
    def link_words_per_cycle(self) -> float:
        """PE words the aggregation link moves per logic cycle (:attr:`aggregation_bytes_per_cycle`
        / the PE word: 0.5 on the small PE, a word in two 32-byte flits): the ``link_i`` /
        ``link_o`` pacing of a group program's SEND, RECV and psum exchange on the die."""
        return self.aggregation_bytes_per_cycle / self.pe.word_bytes

    def cycles_to_us(self, cycles) -> float:
        """Logic-die ``cycles`` in microseconds at ``clock_ghz``."""
        return cycles / (self.clock_ghz * 1e3)

    def access_energy_pj(self, hb_bytes, ext_bytes) -> tuple:
        """``(HB pJ, EXT pJ)`` of moving ``hb_bytes`` through the HB banks and ``ext_bytes``
        through external memory: bits x ``hb_pj_per_bit`` and bits x ``ext_pj_per_bit`` (the
        paper's figures; link and compute energy have no figure here and are not counted).
        The one energy rule of the perf model and the golden backend."""
        return hb_bytes * 8 * self.hb_pj_per_bit, ext_bytes * 8 * self.ext_pj_per_bit

    @property
    def dram_background_mw(self) -> dict:
        """DRAM background power, mW: ``{"hb": ..., "ext": ...}``, each capacity in GiB (HB:
        ``pes x hb_bank_bytes``; EXT: ``ext_bytes``) x its ``*_background_mw_per_gb``
        (:data:`DRAM_BACKGROUND`). paper-8gb: HB 70 mW, EXT 560 mW at the default."""
        return {"hb": self.hb_bytes / 2**30 * self.hb_background_mw_per_gb,
                "ext": self.ext_bytes / 2**30 * self.ext_background_mw_per_gb}

    @property
    def streamline_bytes_per_cycle(self) -> float:
        """Streamline-ring bytes per logic-die cycle (128 at 1 GHz): the ring's flit width."""
        return self.streamline_gbps / self.clock_ghz

    @property
    def aggregation_bytes_per_cycle(self) -> float:
        """Aggregation-link bytes per logic-die cycle (32 at 1 GHz): the link's flit width."""
        return self.aggregation_gbps / self.clock_ghz

    @property
    def pe(self) -> "PEConfig":
        """Memory geometry of one PE (``docs/pe.md``), derived from this configuration.

        Raises :class:`ConfigError` if the tile shape or memory sizes do not suit the PE."""
        return PEConfig.from_arch(self)

    def peak_tops(self, weight_bits: int) -> float:
        """Peak tera-operations per second of the die (2 ops per MAC)."""
        return 2 * self.pes * self.tile.peak_macs_per_cycle(weight_bits) * self.clock_ghz / 1e3

    @classmethod
    def from_dict(cls, values: dict) -> "ArchConfig":
        """Build from a plain dictionary (as read from TOML/YAML/JSON).

        Raises :class:`ConfigError` naming any unknown key.
        """
        values = dict(values)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown configuration key(s): {', '.join(unknown)}; "
                              f"known keys: {', '.join(sorted(known))}")
        tile = values.get("tile", {})
        if isinstance(tile, dict):
            tile_known = {f.name for f in dataclasses.fields(TileConfig)}
            tile_unknown = sorted(set(tile) - tile_known)
            if tile_unknown:
                raise ConfigError(f"unknown configuration key(s) in tile: "
                                  f"{', '.join(tile_unknown)}; known keys: "
                                  f"{', '.join(sorted(tile_known))}")
            values["tile"] = TileConfig(**tile)
        for name, default in (("hb", HB_BANK), ("ext", LPDDR5_6400_X16)):
            dram = values.get(name)
            if isinstance(dram, dict):
                DramConfig.from_dict({**dataclasses.asdict(default), **dram}, where=name)
                values[name] = dataclasses.replace(default, **dram)
        return cls(**values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PEConfig:
    """Memory geometry of one PE (``docs/pe.md``), derived from an :class:`ArchConfig`.

    Build it with :meth:`from_arch` (or ``ArchConfig.pe``); every figure is computed from the
    architecture, never typed here. Units are memory words of ``word_bits`` bits.

    Attributes
    ----------
    rows, lanes : int
        Tensor-tile shape (M, N); the PE needs ``lanes % 4 == 0`` and ``lanes == 2 * rows``
        (checked on construction, :class:`ConfigError` naming ``tile.lanes``).
    word_bits : int
        W = lanes * 128: one weight nibble plane of one K-group for all lanes; also one
        activation word (rows x 32 INT8) and one ``ld`` / ``o`` / link beat.
    wmem_words : int
        Words of one WMEM nibble plane of one buffer:
        ``wmem_bytes / 2 buffers / 2 planes / (W/8)``; a multiple of 8.
    wscale_words : int
        Words of one buffer's scale memory (8 entries of ``lanes`` FP16 per word):
        ``wmem_words / 8``.
    act_words, tok_words, hbuf_words, out_words : int
        IOMEM split (``iomem_words = iomem_bytes / (W/8)``, a multiple of 32) by
        ``ArchConfig.iomem_split`` (default ACT 1/8, TOK 1/32, HBUF 1/2 and OUT the remaining
        11/32).
    tok_entries : int
        64-bit token-table entries: ``tok_words * W / 64`` (at most 256 are addressable by the
        8-bit ``tok_base`` plus a GEMM's rows).
    """

    rows: int
    lanes: int
    word_bits: int
    wmem_words: int
    act_words: int
    tok_words: int
    hbuf_words: int
    out_words: int

    def __post_init__(self):
        # the one check of the PE's tile shape (from_arch's, and a PEConfig built directly)
        rows, lanes = self.rows, self.lanes
        if lanes % 4:
            raise ConfigError(f"tile.lanes: the PE needs lanes % 4 == 0 (FULL-mode SwiGLU "
                              f"blocks of lanes/4 channels), got {lanes}")
        if lanes != 2 * rows:
            raise ConfigError(f"tile.lanes: the PE needs lanes == 2 * rows so that an "
                              f"activation word (rows x 32 INT8) is as wide as a weight word "
                              f"(lanes x 32 nibbles); got rows={rows}, lanes={lanes}")

    @classmethod
    def from_arch(cls, arch: "ArchConfig") -> "PEConfig":
        """The geometry of ``arch``'s PE; :class:`ConfigError` naming the field if the tile
        shape (checked first) or the memory sizes do not suit the PE."""
        rows, lanes = arch.tile.rows, arch.tile.lanes
        word_bits = lanes * 128
        word_bytes = word_bits // 8
        iomem_words = arch.iomem_bytes // word_bytes
        act, tok, hbuf = (iomem_words * part // 32 for part in arch.iomem_split[:3])
        geometry = cls(rows=rows, lanes=lanes, word_bits=word_bits,
                       wmem_words=arch.wmem_bytes // (4 * word_bytes),
                       act_words=act, tok_words=tok, hbuf_words=hbuf,
                       out_words=iomem_words - act - tok - hbuf)
        if arch.wmem_bytes % (4 * word_bytes * 8):
            raise ConfigError(f"wmem_bytes: {arch.wmem_bytes} is not a multiple of 2 buffers x "
                              f"2 planes x {word_bytes} B words x 8 (scale entries per word)")
        if arch.iomem_bytes % (32 * word_bytes):
            raise ConfigError(f"iomem_bytes: {arch.iomem_bytes} is not a multiple of "
                              f"32 words of {word_bytes} B")
        return geometry

    @property
    def word_bytes(self) -> int:
        return self.word_bits // 8

    @property
    def wscale_words(self) -> int:
        return self.wmem_words // 8

    @property
    def wmem_low_words(self) -> int:
        """Words of a WMEM buffer's lower half, which has a flag of its own (``docs/pe.md``,
        "Engines and synchronisation"): a LOAD may write it again once the GEMM releasing the
        buffer reads only the upper half. ``wmem_words / 2`` when that is a whole number of
        scale words (``wmem_words % 16 == 0``: the lower half's weight words and scale words
        are the same entries), else 0 (one flag for the whole buffer)."""
        return self.wmem_words // 2 if self.wmem_words % 16 == 0 else 0

    @property
    def tok_entries(self) -> int:
        return self.tok_words * (self.word_bits // 64)

    @property
    def q16_per_word(self) -> int:
        """Q16.16 values per HBUF word (W/32)."""
        return self.word_bits // 32

    @property
    def q24_per_word(self) -> int:
        """Q.24 values per OUT word (W/64)."""
        return self.word_bits // 64

    @property
    def fp32_per_beat(self) -> int:
        """FP32 values per ``o`` DATA beat (W/32)."""
        return self.word_bits // 32

    @property
    def tok_per_word(self) -> int:
        """Token-table entries per TOK word / LOAD beat (W/64)."""
        return self.word_bits // 64


# == Latencies of the datapath blocks (one formula each; the blocks' ``latency`` properties and
# == the PE read them) =============================================================================

#: :class:`~elmoe3d.hw.unit_pe.UnitPE` and :class:`~elmoe3d.hw.unit_pe.SliceCombiner`: cycles
#: from inputs to outputs (combinational).
UNIT_PE_LATENCY = 0
#: :class:`~elmoe3d.hw.vpu.RowMaxExponent`: cycles from accepting a row maximum to its exponent.
ROWMAX_LATENCY = 1
#: :class:`~elmoe3d.hw.vpu.RequantUnit`: cycles from accepting a value to its INT8 code.
REQUANT_LATENCY = 1
#: :class:`~elmoe3d.hw.vpu.Fp32Converter`: cycles from accepting a Q.24 value to its FP32 word.
FP32_LATENCY = 2


def check_mul_stages(mul_stages) -> int:
    """``mul_stages`` (registers after a VPU multiplier) if an integer in 1..4, else
    ``ValueError`` naming it."""
    if not is_int(mul_stages, numpy=False) or not 1 <= mul_stages <= 4:
        raise ValueError(f"mul_stages: expected an integer in 1..4, got {mul_stages!r}")
    return mul_stages


def tile_latency(passes: int = 1) -> int:
    """:class:`~elmoe3d.hw.tile.TensorTile`: cycles from accepting a ``last`` beat to
    ``o.valid`` with an always-ready sink: the input register, stage 1a (unit PEs and the
    first adder-tree levels), stage 1b (the rest of the trees, slice combine, scale decode),
    then the dequantization multiply in ``passes`` sub-steps, then the result register:
    ``4 + passes`` (5 for the ASIC tile; the input register and the split of stage 1 add 2
    cycles so that every stage fits the paper's 1 GHz clock, docs/synth.md "Timing")."""
    return 4 + passes


def swiglu_latency(mul_stages: int = 1) -> int:
    """:class:`~elmoe3d.hw.vpu.SwiGLUUnit`: cycles from accepting an element to ``o.valid``:
    ``11 + 2 (mul_stages - 1)`` (the input register, the input rounding in two cycles, then
    two multipliers in series, each its partial products and their sum)."""
    return 11 + 2 * (mul_stages - 1)


def combine_latency(mul_stages: int = 1) -> int:
    """:class:`~elmoe3d.hw.vpu.CombineUnit`: cycles from accepting an element to ``o.valid``:
    ``6 + (mul_stages - 1)`` (the input register, partial products, their sum, the rounding
    shift in two cycles, the saturating add)."""
    return 6 + (mul_stages - 1)


def swiglu_sink_latency(mul_stages: int = 1) -> int:
    """:class:`~elmoe3d.hw.pe.swiglu.SwiGLUSink`: cycles from the sink taking a tile result to
    its first HBUF write (no stall): ``2 +`` :func:`swiglu_latency` (the row-max update
    follows a cycle later)."""
    return 2 + swiglu_latency(mul_stages)


def combine_sink_latency(mul_stages: int = 1) -> int:
    """:class:`~elmoe3d.hw.pe.combine.CombineSink`: cycles from the sink taking a tile result
    to its first OUT write (no stall): ``3 +`` :func:`combine_latency` (TOK read, OUT read and
    the unit in between)."""
    return 3 + combine_latency(mul_stages)


#: The RAW sink (:class:`~elmoe3d.hw.pe.result.ResultStage`): cycles from taking a tile result
#: to offering its first link word.
RAW_SINK_LATENCY = 1

#: :class:`~elmoe3d.hw.agg_link.AggregationLink`: cycles from a descriptor taken to its first
#: flit moving (the descriptor register, then a cycle in the sources' flit buffers, which give
#: the PEs a registered ``ready``).
LINK_OP_LATENCY = 2

#: Largest EXT chunk (words) the logic die's EXT schedulers admit at once by default
#: (:class:`~elmoe3d.hw.die.LogicDie` ``ext_chunk_words``; the host's schedule check,
#: :func:`elmoe3d.sw.host.parallel.check_link_schedule`): the credits a PE needs for it.
EXT_CHUNK_WORDS = 4


def link_reduce_stages(pes: int) -> int:
    """Register stages of the aggregation link's reduction tree (REDUCE_ADD / REDUCE_MAX,
    :class:`~elmoe3d.hw.agg_link.ReduceTree`) for a group of ``pes`` PEs: one per tree level,
    ``max(1, ceil(log2 pes))``."""
    _check_int("pes", pes)
    return max(1, (pes - 1).bit_length())


def link_latency(pes: int, flits_per_word: int, *, reduce: bool) -> int:
    """:class:`~elmoe3d.hw.agg_link.AggregationLink`: cycles from a word's first flit moving
    (leaving the sources' flit buffers) to the word offered on ``pe_o`` with no stall:
    ``flits_per_word`` (the word assembled flit by flit in the destination), plus
    :func:`link_reduce_stages` in the reduce modes (``reduce``)."""
    _check_int("flits_per_word", flits_per_word)
    return flits_per_word + (link_reduce_stages(pes) if reduce else 0)


def max_requant_units(word_bits: int) -> int:
    """C's largest (and default) value, REQUANT's INT8 codes per cycle: ``min(W/32, 32)``."""
    return min(word_bits // 32, 32)


def swiglu_row_cycles(lanes: int, swiglu_units: int) -> dict:
    """Cycles the SWIGLU sink spends on one result row, by mode FULL (``True``: L/4 channels)
    and not FULL (``False``: L/2 channels): ``ceil(channels / swiglu_units)``."""
    return {True: max(lanes // 4 // swiglu_units, 1), False: lanes // 2 // swiglu_units}


def combine_row_cycles(lanes: int, combine_units: int) -> dict:
    """Cycles the COMBINE sink spends on one result row, by mode FULL (``True``: L/2 values)
    and not FULL (``False``: L values): ``ceil(values / combine_units)``."""
    return {True: max(lanes // 2 // combine_units, 1), False: lanes // combine_units}


def drain_cycles(rows: int, *, row_cycles: int = 1, tile_passes: int = 1,
                 mul_stages: int = 1) -> int:
    """Cycles from the last tile beat of a GEMM into the SWIGLU sink to the first cycle of a
    REQUANT waiting behind it (its first ROWMAX read), with no stall and rows not FULL
    (``row_cycles``: :func:`swiglu_row_cycles` ``[False]``, 1 with the default units): the
    tile (:func:`tile_latency`), the sink's ``rows * row_cycles`` cycles of the last result
    (the last row entering its pipeline ``rows * row_cycles - 1`` cycles after the first),
    the sink's pipeline to the last HBUF write (:func:`swiglu_sink_latency`), then the
    row-max update a cycle later, the GEMM's completion seen by the REQUANT engine and its
    first ROWMAX read (3 cycles). :attr:`PEOptions.drain_cycles` is this for a PE's options;
    the expert builder reads it for the default options of any tile shape."""
    return tile_latency(tile_passes) + rows * row_cycles - 1 + swiglu_sink_latency(mul_stages) + 3


def unit_count(name, value, top, what) -> int:
    """A time-shared unit count: ``None`` -> ``top``, else a power of two in 1..``top``
    (``ValueError`` naming ``name``, ``what`` saying the range)."""
    if value is None:
        return top
    if (not is_int(value, numpy=False) or not 1 <= value <= top
            or value & (value - 1)):
        raise ValueError(f"{name}: expected a power of two {what}, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class PEOptions:
    """The build options of one PE (:class:`~elmoe3d.hw.pe.PE`; ``docs/pe.md``), validated once
    against its memory geometry, and the timing they imply (paper Sections 4.1 and 5.2).

    Every option changes cycle counts or the resources of the PE, never a result. The unit
    counts given as ``None`` are resolved to their defaults here, so an instance always holds
    the counts the PE builds (two instances that build the same PE are equal).

    Parameters
    ----------
    config : ArchConfig or PEConfig
        The PE's memory geometry (an ArchConfig is reduced to its :attr:`ArchConfig.pe`); the
        PE needs ``lanes % 4 == 0``, ``lanes == 2 * rows`` and a power-of-two ``lanes``.
    mul_stages : int
        Registers after each VPU multiplier (``SwiGLUUnit`` / ``CombineUnit``), 1..4.
    requant_units : int or None
        C, :class:`~elmoe3d.hw.vpu.RequantUnit` s (INT8 codes per cycle): a power of two in
        1..min(W/32, 32); ``None``: min(W/32, 32).
    fp32_units : int or None
        K, :class:`~elmoe3d.hw.vpu.Fp32Converter` s: a power of two dividing W/32; ``None``:
        W/32.
    combine_units : int or None
        J, :class:`~elmoe3d.hw.vpu.CombineUnit` s: a power of two dividing ``lanes``;
        ``None``: ``lanes``.
    swiglu_units : int or None
        S, :class:`~elmoe3d.hw.vpu.SwiGLUUnit` s: a power of two dividing ``lanes / 2``;
        ``None``: ``lanes / 2``.
    tile_dsp_pairs : bool
        The tile's ``dsp_pairs`` (two IA8xW5 products per FPGA DSP multiplier).
    tile_passes : int
        P, the tile's ``passes`` (1, 2 or 4: a GEMM beat every P cycles).
    out_valid_bits : bool
        OUT and ROWMAX have valid bits (one-cycle CLEAR); False: CLEAR writes zeros.
    wbuf_memories : int
        Memories per WMEM plane: 2 (one per buffer) or 1 (both buffers in one; needs a
        power-of-two ``wmem_words``).
    out_banks : int
        OUT memories: 2 (even and odd words) or 1 (needs ``fp32_units`` < W/32).
    streamed_weights : bool
        WMSB, WLSB and WSCALE W/P bits wide, the planes read a tile pass at a time (needs
        P > 1).
    narrow_iomem : bool
        ACT, TOK, HBUF and ROWMAX W/P bits wide, ACT read a tile pass at a time (needs P > 1
        and ``requant_units`` <= min(W/32, 32)/P).
    narrow_out : bool
        OUT W/P bits wide (needs P > 1, one OUT bank, no valid bits, and ``combine_units``,
        ``fp32_units`` <= W/64/P).

    Raises
    ------
    TypeError
        ``config`` is neither an ArchConfig nor a PEConfig.
    ValueError
        ``lanes`` not a power of two, or an option out of range (the message names it); the
        other tile-shape rules are :class:`PEConfig`'s (a :class:`ConfigError`).
    """

    config: "PEConfig"
    mul_stages: int = 1
    requant_units: int | None = None
    fp32_units: int | None = None
    combine_units: int | None = None
    swiglu_units: int | None = None
    tile_dsp_pairs: bool = False
    tile_passes: int = 1
    out_valid_bits: bool = True
    wbuf_memories: int = 2
    out_banks: int = 2
    streamed_weights: bool = False
    narrow_iomem: bool = False
    narrow_out: bool = False

    def __post_init__(self):
        geometry = pe_config(self.config)
        object.__setattr__(self, "config", geometry)
        lanes = geometry.lanes          # lanes % 4 == 0 and lanes == 2 * rows: PEConfig's
        if lanes & (lanes - 1):
            raise ValueError(f"config: the PE needs a power-of-two number of lanes (word "
                             f"addressing by shifts), got {lanes}")
        check_mul_stages(self.mul_stages)
        W = geometry.word_bits
        Q = W // 32
        top = max_requant_units(W)
        requant_units = unit_count("requant_units", self.requant_units, top,
                                    f"in 1..min(W/32, 32) = 1..{top}")
        fp32_units = unit_count("fp32_units", self.fp32_units, Q,
                                f"dividing W/32 = {Q} (1..{Q})")
        combine_units = unit_count("combine_units", self.combine_units, lanes,
                                    f"dividing lanes = {lanes} (1..{lanes})")
        swiglu_units = unit_count("swiglu_units", self.swiglu_units, lanes // 2,
                                   f"dividing lanes / 2 = {lanes // 2} (1..{lanes // 2})")
        for name, value in (("requant_units", requant_units), ("fp32_units", fp32_units),
                            ("combine_units", combine_units), ("swiglu_units", swiglu_units)):
            object.__setattr__(self, name, value)
        if not isinstance(self.tile_dsp_pairs, bool):
            raise ValueError(f"tile_dsp_pairs: expected a bool, got {self.tile_dsp_pairs!r}")
        tile_passes = self.tile_passes
        if not is_int(tile_passes, numpy=False) or tile_passes not in (1, 2, 4):
            raise ValueError(f"tile_passes: expected 1, 2 or 4, got {tile_passes!r}")
        if not isinstance(self.out_valid_bits, bool):
            raise ValueError(f"out_valid_bits: expected a bool, got {self.out_valid_bits!r}")
        wbuf_memories = self.wbuf_memories
        if not is_int(wbuf_memories, numpy=False) or wbuf_memories not in (1, 2):
            raise ValueError(f"wbuf_memories: expected 1 or 2, got {wbuf_memories!r}")
        w_words = geometry.wmem_words
        if wbuf_memories == 1 and w_words & (w_words - 1):
            raise ValueError(f"wbuf_memories: one memory for both buffers needs a power-of-two "
                             f"wmem_words (the buffer is the top address bit), got {w_words}")
        out_banks = self.out_banks
        if not is_int(out_banks, numpy=False) or out_banks not in (1, 2):
            raise ValueError(f"out_banks: expected 1 or 2, got {out_banks!r}")
        if out_banks == 1 and fp32_units == W // 32:
            raise ValueError(f"out_banks: one OUT memory needs fewer than W/32 = {W // 32} "
                             f"fp32_units (an o beat's two OUT words are read one after the "
                             f"other, one per half of its sub-steps), got fp32_units="
                             f"{fp32_units}")
        if not isinstance(self.streamed_weights, bool):
            raise ValueError(f"streamed_weights: expected a bool, got "
                             f"{self.streamed_weights!r}")
        if self.streamed_weights and tile_passes == 1:
            raise ValueError("streamed_weights: the weights come a pass at a time, so it needs "
                             "tile_passes 2 or 4, got tile_passes=1")
        if not isinstance(self.narrow_iomem, bool):
            raise ValueError(f"narrow_iomem: expected a bool, got {self.narrow_iomem!r}")
        if self.narrow_iomem:
            if tile_passes == 1:
                raise ValueError("narrow_iomem: ACT comes a tile pass at a time, so it needs "
                                 "tile_passes 2 or 4, got tile_passes=1")
            # REQUANT's C codes of a cycle go into one ACT part (32/P depths of a row) from one
            # HBUF part (W/32/P values); the SWIGLU sink's S <= lanes / 2 values always fit
            # (W/32/P = 4 lanes / P)
            per_part = max_requant_units(W) // tile_passes
            if requant_units > per_part:
                raise ValueError(f"narrow_iomem: the requant_units values of a cycle must lie "
                                 f"in one HBUF part and one ACT row part, min(W/32, 32)/P = "
                                 f"{per_part} values, got requant_units={requant_units}")
        if not isinstance(self.narrow_out, bool):
            raise ValueError(f"narrow_out: expected a bool, got {self.narrow_out!r}")
        if self.narrow_out:
            per_part = W // 64 // tile_passes
            needs = (("tile_passes", tile_passes > 1, "2 or 4"),
                     ("out_banks", out_banks == 1, "1"),
                     ("out_valid_bits", not self.out_valid_bits, "False"),
                     ("combine_units", combine_units <= per_part, f"at most W/64/P = {per_part}"),
                     ("fp32_units", fp32_units <= per_part, f"at most W/64/P = {per_part}"))
            for name, ok, want in needs:
                if not ok:
                    raise ValueError(f"narrow_out: OUT in W/P-bit parts needs {name} {want}, "
                                     f"got {name}={getattr(self, name)}")

    # ---- the options as keyword arguments --------------------------------------------------------

    @property
    def params(self) -> dict:
        """The options (every field but ``config``, unit counts resolved) as keyword
        arguments of the PE."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "config"}

    # ---- geometry ------------------------------------------------------------------------------

    @property
    def rows(self) -> int:
        """M: token rows per tile beat."""
        return self.config.rows

    @property
    def lanes(self) -> int:
        """N: unit-PE lanes per row."""
        return self.config.lanes

    @property
    def word_bits(self) -> int:
        """W: bits of every memory word and of every ``ld``, ``o`` and link beat."""
        return self.config.word_bits

    @property
    def tile_config(self) -> TileConfig:
        """The tensor tile's shape (``rows`` x ``lanes`` x 32)."""
        return TileConfig(rows=self.rows, lanes=self.lanes)

    @property
    def tile_params(self) -> dict:
        """The :class:`~elmoe3d.hw.tile.TensorTile` keyword arguments of the PE's tile."""
        return {"config": self.tile_config, "dsp_pairs": self.tile_dsp_pairs,
                "passes": self.tile_passes, "streamed_weights": self.streamed_weights,
                "streamed_acts": self.narrow_iomem}

    # ---- derived timing (cycles) ---------------------------------------------------------------

    @property
    def combine_row_cycles(self) -> dict:
        """Cycles the COMBINE sink spends on one result row, by mode FULL (``True``: L/2
        values) and not FULL (``False``: L values): ``ceil(values / combine_units)``."""
        return combine_row_cycles(self.lanes, self.combine_units)

    @property
    def swiglu_row_cycles(self) -> dict:
        """Cycles the SWIGLU sink spends on one result row, by mode FULL (``True``: L/4
        channels) and not FULL (``False``: L/2 channels): ``ceil(channels / swiglu_units)``."""
        return swiglu_row_cycles(self.lanes, self.swiglu_units)

    @property
    def clear_cycles(self) -> int:
        """Cycles of ``CLEAR`` with ``out`` or ``rowmax`` set, from its start to its last
        write: 1 with :attr:`out_valid_bits`, otherwise one per row of the larger of the OUT
        banks (``ceil(out_words / out_banks)``; ``out_words * P`` parts with
        :attr:`narrow_out`) and ROWMAX (``ceil(tok_entries / (W/32))``, times P with
        :attr:`narrow_iomem`)."""
        if self.out_valid_bits:
            return 1
        cfg = self.config
        parts = self.tile_passes if self.narrow_out else 1
        rm_parts = self.tile_passes if self.narrow_iomem else 1
        return max(-(-cfg.out_words * parts // self.out_banks),
                   -(-cfg.tok_entries // (cfg.word_bits // 32)) * rm_parts)

    @property
    def output_beat_cycles(self) -> int:
        """Cycles per ``o`` DATA beat of OUTPUT with a ready ``o``: ``W/32 / fp32_units``."""
        return self.word_bits // 32 // self.fp32_units

    @property
    def output_raw_beat_cycles(self) -> int:
        """Cycles per ``o`` DATA beat of OUTPUT ``raw`` (one OUT word a beat) with a ready
        ``o``: 1 (two OUT banks: a read of both gives two beats; one bank: a word a read), or
        P = :attr:`tile_passes` with :attr:`narrow_out` (a word from its P parts, a part read
        a cycle). Its first beat comes ``2 + output_raw_beat_cycles`` cycles after OUTPUT
        leaves its drain (the state change, the OUT read; no Fp32Converters)."""
        return self.tile_passes if self.narrow_out else 1

    @property
    def requant_word_cycles(self) -> int:
        """Cycles per HBUF word (W/32 Q16.16 values) of REQUANT: ``W/32 / requant_units``."""
        return self.word_bits // 32 // self.requant_units

    @property
    def load_queue_depth(self) -> int:
        """LOAD commands the decoder can queue for the load engine."""
        return 16

    @property
    def tile_latency(self) -> int:
        """Cycles from the tile accepting a ``last`` beat to its result
        (:func:`tile_latency` of :attr:`tile_passes`)."""
        return tile_latency(self.tile_passes)

    @property
    def swiglu_latency(self) -> int:
        """Cycles of the SwiGLU unit (:func:`swiglu_latency` of :attr:`mul_stages`)."""
        return swiglu_latency(self.mul_stages)

    @property
    def combine_latency(self) -> int:
        """Cycles of the combine unit (:func:`combine_latency` of :attr:`mul_stages`)."""
        return combine_latency(self.mul_stages)

    @property
    def sink_latency(self) -> dict:
        """Cycles from the sink taking a tile result to the first effect of its first row, per
        sink (no stall): RAW 1 (first link word offered), SWIGLU 2 + the SwiGLU unit (HBUF
        write; the row-max update follows a cycle later), COMBINE 3 + the combine unit (OUT
        write; TOK read, OUT read and the unit in between)."""
        return {Sink.RAW: RAW_SINK_LATENCY,
                Sink.SWIGLU: swiglu_sink_latency(self.mul_stages),
                Sink.COMBINE: combine_sink_latency(self.mul_stages)}

    @property
    def result_cycles(self) -> dict:
        """Cycles the sink holds one tile result (``rows x lanes`` accumulators), by
        ``(sink, psum_in)``, with ready outputs and, for ``psum_in``, a ``link_i`` word offered
        in every cycle: RAW ``rows * lanes / (W/64)`` (one link word a cycle), SWIGLU ``rows *
        swiglu_row_cycles[False]``, COMBINE ``rows * combine_row_cycles[False]``; ``psum_in``
        adds one cycle per result, except where a row takes several cycles (time-shared units:
        the addition hides behind the previous result's last row)."""
        raw = self.rows * self.lanes // (self.word_bits // 64)
        out = {(Sink.RAW, False): raw, (Sink.RAW, True): raw + 1}
        for sink, row in ((Sink.SWIGLU, self.swiglu_row_cycles[False]),
                          (Sink.COMBINE, self.combine_row_cycles[False])):
            out[(sink, False)], out[(sink, True)] = self.rows * row, self.rows * row + (row == 1)
        return out

    @property
    def completion_cycles(self) -> int:
        """Length of the PE's GEMM-completion delay line: cycles from a result row leaving
        the sink's stage A to the cycle its last write is made, the longer of the SWIGLU and
        COMBINE pipelines plus one: ``max(swiglu_latency, combine_row_cycles[False] +
        combine_latency) + 1``."""
        return max(self.swiglu_latency, self.combine_row_cycles[False] + self.combine_latency) + 1

    @property
    def drain_cycles(self) -> int:
        """Cycles from the last tile beat of a GEMM into the SWIGLU sink to the first cycle of
        a REQUANT waiting behind it (its first ROWMAX read), with no stall and rows not FULL:
        the tile (:attr:`tile_latency`), the sink's rows of the last result
        (``result_cycles[(SWIGLU, False)]``, the last one entering its pipeline
        ``result_cycles - 1`` cycles after the first), the sink's pipeline to the last HBUF
        write (``sink_latency[SWIGLU]``), then the row-max update a cycle later, the GEMM's
        completion seen by the REQUANT engine and its first ROWMAX read (3 cycles). A REQUANT
        cannot read HBUF rows before this; FULL rows (``swiglu_row_cycles[True]``) can only
        be as fast. Measured on the RTL PE (2x4 small PE, 2026-12-03, the 1 GHz pipeline of
        issue 25: tile 5 cycles, SwiGLU unit 11 with its input register): 22 cycles with the
        defaults, 23 with ``tile_passes`` 2, 24 with ``mul_stages`` 2, 27 for the FPGA-lean
        PE (21, 22, 23, 26 before the input register; 16, 17, 18, 21 before issue 25)."""
        return drain_cycles(self.rows, row_cycles=self.swiglu_row_cycles[False],
                            tile_passes=self.tile_passes, mul_stages=self.mul_stages)

    @property
    def gemm_gap(self) -> int:
        """Idle tile cycles between the last beat of a GEMM and the first beat of the next
        GEMM waiting behind it: none."""
        return 0

    # ---- command-level timing (the cycle model, elmoe3d.sw.host.pe_cycles) ------------------

    @property
    def decode_cycles(self) -> int:
        """Cycles from the decoder taking a command to the command being in the execute
        engine's register or at the head of the LOAD queue (the decoder's register): 1."""
        return 1

    @property
    def beat_cycles(self) -> int:
        """Cycles of one tile beat: :attr:`tile_passes` (the tile takes a beat in the last of
        its passes)."""
        return self.tile_passes

    @property
    def gemm_start_cycles(self) -> int:
        """Cycles from a GEMM starting (ready in GEMM_START, or back to back in the cycle of
        the previous GEMM's last read) to its first beat offered to the tile (taken in its
        last pass): the address generator's read cycle, then the beat register: 2."""
        return 2

    def load_word_cycles(self, target) -> int:
        """Cycles a LOAD takes per word into ``target`` (an :class:`~elmoe3d.isa.Target`):
        P = :attr:`tile_passes` for a memory stored in P parts (WMSB, WLSB, WSCALE with
        :attr:`streamed_weights`; ACT, TOK, HBUF, ROWMAX with :attr:`narrow_iomem`; OUT with
        :attr:`narrow_out`: a part a cycle), else 1."""
        from .isa import Target
        t = Target(target)
        parted = ((Target.WMSB, Target.WLSB, Target.WSCALE) if self.streamed_weights else ()) \
            + ((Target.ACT, Target.TOK, Target.HBUF, Target.ROWMAX) if self.narrow_iomem
               else ()) + ((Target.OUT,) if self.narrow_out else ())
        return self.tile_passes if t in parted else 1

    def send_word_cycles(self, target) -> int:
        """Cycles per word of SEND from ``target`` with a ready ``link_o``, and from SEND
        starting to its first word offered, less one: 1 (a read a cycle, the word offered the
        cycle after), or for a memory in P parts (:meth:`load_word_cycles` P > 1) P + 1 (the
        parts read a cycle each into a register, the word offered once complete)."""
        p = self.load_word_cycles(target)
        return p + 1 if p > 1 else 1

    def sink_result_cycles(self, sink, psum_in: bool = False, full: bool = False) -> int:
        """Cycles the sink holds one tile result of a GEMM in mode FULL (``full``) or not:
        :attr:`result_cycles` with the row cycles of the mode (``swiglu_row_cycles[full]``,
        ``combine_row_cycles[full]``; RAW does not depend on it)."""
        sink = Sink(sink)
        if sink is Sink.RAW:
            return self.result_cycles[(sink, bool(psum_in))]
        row = (self.swiglu_row_cycles if sink is Sink.SWIGLU else self.combine_row_cycles)[
            bool(full)]
        return self.rows * row + (1 if psum_in and row == 1 else 0)

    @property
    def sink_feed_cycles(self) -> int:
        """Cycles of one register stage of the result path: from the result register taking
        a tile result to its first row offered to stage A (RAW: its first link word), and
        from a row in stage A to stage C (COMBINE), or a ``psum_in`` word to its rows: 1."""
        return 1

    def sink_row_cycles(self, sink, full: bool = False) -> int:
        """Cycles one result row takes in the SWIGLU sink's stage A or the COMBINE sink's
        stage C in mode FULL (``full``) or not: ``swiglu_row_cycles[full]`` /
        ``combine_row_cycles[full]``."""
        rows = self.swiglu_row_cycles if Sink(sink) is Sink.SWIGLU else self.combine_row_cycles
        return rows[bool(full)]

    @property
    def psum_rows_per_word(self) -> int:
        """Result rows in one ``psum_in`` link word: ``(W/64) / lanes`` = 2."""
        return self.word_bits // 64 // self.lanes

    @property
    def sink_done_cycles(self) -> dict:
        """Per sink, cycles from a GEMM's last row leaving stage A (RAW: its last link word) to
        the first cycle the PE counts the GEMM complete (a fence, a REQUANT waiting on it go
        on): SWIGLU and COMBINE ``1 +`` :attr:`completion_cycles` (the completion delay line,
        seen the cycle after its last entry), RAW 1 (the result register empties)."""
        vpu = 1 + self.completion_cycles
        return {Sink.SWIGLU: vpu, Sink.COMBINE: vpu, Sink.RAW: 1}

    def sink_idle_cycles(self, sink, full: bool = False) -> int:
        """Cycles from a GEMM's last row leaving stage A (RAW: its last link word) to the
        first cycle the tile, the result stage and the sink are all idle (an OUTPUT, CLEAR,
        SEND, RECV, BARRIER or STATUS waiting behind the GEMM leaves its drain then), for a
        GEMM in mode FULL (``full``) or not: SWIGLU :attr:`swiglu_latency` ``+ 2`` (the
        units, the row-max update), COMBINE :meth:`sink_row_cycles` ``+``
        :attr:`combine_latency` ``+ 1`` (stage C's sub-steps, the units; a row whose gate
        weight is zero, a padding row, skips stage C and the units, so a result whose last
        rows are padding drains sooner), RAW 1."""
        sink = Sink(sink)
        if sink is Sink.SWIGLU:
            return self.swiglu_latency + 2
        if sink is Sink.COMBINE:
            return self.sink_row_cycles(sink, full) + self.combine_latency + 1
        return 1

    @property
    def requant_row_cycles(self) -> int:
        """Cycles from a REQUANT starting (every earlier execute command complete) to its
        first HBUF read, and the fewest cycles of one token row (a row takes ``channels /
        requant_units`` cycles, the next row's e' being prepared meanwhile): the ROWMAX read,
        :data:`ROWMAX_LATENCY` of the RowMaxExponent, the e' register and the row's start:
        ``3 + ROWMAX_LATENCY``."""
        return 3 + ROWMAX_LATENCY

    @property
    def requant_done_cycles(self) -> int:
        """Cycles from REQUANT's last HBUF read to the first cycle it is done (no longer
        busy: a GEMM with ``rq_wait`` or a drain waiting on it goes on): the HBUF read data,
        :data:`REQUANT_LATENCY` of the RequantUnits, the done test and the busy register:
        ``3 + REQUANT_LATENCY``."""
        return 3 + REQUANT_LATENCY

    @property
    def output_early(self) -> bool:
        """OUTPUT leaves its drain while the COMBINE sink still writes OUT, each of its reads
        waiting for the writes still to come to its words, and reads its first word in the
        cycle it starts: with two OUT banks (:attr:`out_banks`), whose pair reads the COMBINE
        sink's in-flight writes are checked against (``docs/pe.md``, OUTPUT)."""
        return self.out_banks == 2

    @property
    def output_read_cycles(self) -> int:
        """Cycles from OUTPUT leaving its drain to its first OUT read: 0 with
        :attr:`output_early` (the read in the cycle it starts), else 1 (the state change)."""
        return 0 if self.output_early else 1

    @property
    def output_latency(self) -> int:
        """Cycles from OUTPUT leaving its drain to its first ``o`` DATA beat offered (no read
        waiting for a COMBINE write): :attr:`output_read_cycles` to the OUT read, the read,
        the beat's :attr:`output_beat_cycles` sub-steps into the Fp32Converters
        (:data:`FP32_LATENCY`), then the beat register (not with one sub-step: the beat goes
        to ``o`` from the converters): ``output_read_cycles + 1 + FP32_LATENCY +
        output_beat_cycles``, less one with one sub-step."""
        S = self.output_beat_cycles
        return self.output_read_cycles + 1 + FP32_LATENCY + S - (1 if S == 1 else 0)

    @property
    def output_raw_latency(self) -> int:
        """Cycles from OUTPUT ``raw`` leaving its drain to its first ``o`` beat offered:
        :attr:`output_read_cycles` to the OUT read, the read (no converters),
        ``output_read_cycles + 1 + output_raw_beat_cycles``."""
        return self.output_read_cycles + 1 + self.output_raw_beat_cycles

    @property
    def output_done_cycles(self) -> int:
        """Cycles from OUTPUT's last ``o`` beat taken to the first cycle OUTPUT counts as
        complete: 1 (``done`` with the last beat taken; the execute engine takes the next
        command in that cycle)."""
        return 1


#: The FPGA-lean PE (``BoardTop(pe_params=...)``, the FPGA flow's defaults) as PE keyword
#: arguments (``PEOptions(config=..., **FPGA_LEAN_PE)``): two IA8xW5 products per MULT18X18D
#: in a tile of four passes, one RequantUnit, Fp32Converter, CombineUnit and SwiGLUUnit,
#: time-shared, CLEAR by writes, both weight buffers in one memory per plane, OUT in one
#: memory, and every PE memory a quarter word wide (streamed weights, narrow IOMEM and OUT).
#: Results are bit-identical to the ASIC PE's.
FPGA_LEAN_PE = MappingProxyType({
    "tile_dsp_pairs": True, "tile_passes": 4, "requant_units": 1, "fp32_units": 1,
    "combine_units": 1, "swiglu_units": 1, "out_valid_bits": False, "wbuf_memories": 1,
    "out_banks": 1, "streamed_weights": True, "narrow_iomem": True, "narrow_out": True})


#: The paper PE's IOMEM split (ACT, TOK, HBUF, OUT in 32nds of 32 KB = 64 words of 512 B):
#: ACT 14 (a slice's h codes and two streamed x slots), TOK 2, HBUF 32 (16 token rows of 256
#: Q16.16 values: a 256-channel slice in one pass), OUT 16 (16 rows of 64 Q.24 channels: one
#: raw OUTPUT chunk). A real expert runs split over a PE group, its partials leave as Q.24
#: (``docs/pe.md`` "Real expert shapes"); the default split (4, 1, 16, 11) holds no h codes
#: of a real expert beside x at this size.
PAPER_IOMEM_SPLIT = (7, 1, 16, 8)

PRESETS = {
    "small": ArchConfig(),
    "mid": ArchConfig(
        name="mid", tile=TileConfig(rows=4, lanes=8, group=32), pes=4, pes_per_group=2,
        wmem_bytes=32 << 10, iomem_bytes=32 << 10, iomem_split=(12, 1, 16, 3)),
    "paper-4gb": ArchConfig(
        name="paper-4gb", tile=TileConfig(rows=16, lanes=32, group=32), pes=16,
        pes_per_group=4, wmem_bytes=32 << 10, iomem_bytes=32 << 10,
        hb_bank_bytes=256 << 20, ext_bytes=64 << 30, iomem_split=PAPER_IOMEM_SPLIT),
    "paper-8gb": ArchConfig(
        name="paper-8gb", tile=TileConfig(rows=16, lanes=32, group=32), pes=32,
        pes_per_group=4, wmem_bytes=32 << 10, iomem_bytes=32 << 10,
        hb_bank_bytes=256 << 20, ext_bytes=64 << 30, iomem_split=PAPER_IOMEM_SPLIT),
}


def pe_config(config) -> PEConfig:
    """The :class:`PEConfig` of an :class:`ArchConfig` or a ``PEConfig``; raises ``TypeError``
    naming ``config`` for anything else."""
    if isinstance(config, PEConfig):
        return config
    if isinstance(config, ArchConfig):
        return config.pe
    raise TypeError(f"config: expected an ArchConfig or a PEConfig, got {type(config).__name__}")


def arch_config(arch, what: str = "arch") -> ArchConfig:
    """``arch`` as an :class:`ArchConfig`: one, or a preset's name (:func:`preset`). Raises
    :class:`ConfigError` naming ``what`` for an unknown name or anything else."""
    if isinstance(arch, ArchConfig):
        return arch
    if isinstance(arch, str):
        try:
            return preset(arch)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    raise ConfigError(f"{what}: expected an ArchConfig or a preset name, got {arch!r}")


def preset_key(name):
    """The key of :data:`PRESETS` that ``name`` names, case and surrounding blanks aside
    (``paper-8GB`` is ``paper-8gb``, as ``paper --hb 8GB`` is ``8gb`` and
    :func:`~elmoe3d.sw.host.models.model_preset` takes a model's name); anything else is
    returned unchanged, for its caller to refuse or to look up elsewhere. Usable as an
    argparse ``type``."""
    if isinstance(name, str) and name.strip().lower() in PRESETS:
        return name.strip().lower()
    return name


def preset(name: str) -> ArchConfig:
    """Return the named preset (:func:`preset_key`: case aside); raises :class:`ConfigError`
    listing the known names (for a name of another type too)."""
    key = preset_key(name)
    if not isinstance(key, str) or key not in PRESETS:
        raise ConfigError(f"unknown configuration {name!r}; expected one of "
                          f"{', '.join(PRESETS)}")
    return PRESETS[key]

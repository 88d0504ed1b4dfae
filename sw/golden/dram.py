"""Behavioural DRAM devices that enforce the timing (HB banks, LPDDR5 channels; issue 4).

Plain Python (no cocotb, no Amaranth): the cocotb benches (:mod:`elmoe3d.sim.bench_dram`) and
the Amaranth-simulator unit tests both drive a :class:`DramDevice` once per logic cycle with the
command bus they sampled, and drive its returned read data back into the controller.

* :class:`TimingChecker` -- the JEDEC-style rule book of one channel, on DRAM command-clock
  cycles: every constraint of :class:`elmoe3d.config.DramConfig` at its scope -- bank (tRCD,
  tRP, tRAS, tRC, tRTP, write recovery, tRFCpb), bank group (tCCD_L, tRRD_L, tWTR_L), channel
  (tCCD_S, tRRD_S, tFAW over the last four ACTs, tWTR_S, RD->WR turnaround, tPPD, tPBR2PBR,
  tPBR2ACT, tRFCab, one command per clock on a single command bus), protocol (ACT to an open
  bank, RD/WR/PRE to a closed one, REF with a bank open) and the refresh rate (every bank
  refreshed at least once every ``(max_postponed + 1) * tREFI``). The first violation raises
  :class:`TimingViolation` naming the constraint, the bank and the cycle. It also counts ACT,
  PRE, REF, RD, WR, bytes, row hits (a column command after the first since its ACT), cold
  misses (ACT to a bank never opened, or closed only by a refresh), conflicts (ACT of a row
  other than the one the bank had open before its PRE) and reopens (the same row again).
* :class:`DramDevice` -- one channel's device: the checker, the DRAM clock on the logic clock
  (command clock edges at the logic cycles ``c`` where ``floor((c + 1) q / p)`` increments,
  ``p / q`` = tCK in logic cycles; a command on any other cycle is a violation), read data
  returned ``RL + burst`` command clocks after the RD, and a sparse memory (a dict of written
  bursts, so 256 MB banks cost nothing; a never-written burst reads as the deterministic
  :func:`dram_pattern` of its bank, row and column).

Command encodings shared with the RTL (:mod:`elmoe3d.hw.dram`): row command kinds
:class:`RowCmd` (ACT = 0, PRE = 1, REFPB = 2, REFAB = 3); a REFPB names its refresh unit ``u``
in the bank field (banks ``u, u + U, ...``, ``U = refresh_units``).
"""

from __future__ import annotations

import enum
import hashlib
from collections import deque
from fractions import Fraction

from ...checks import is_int
from ...config import DramConfig


__all__ = ["RowCmd", "TimingViolation", "TimingChecker", "DramDevice", "dram_pattern",
           "clock_ratio", "pack_units", "backdoor_write"]


class RowCmd(enum.IntEnum):
    """Row-command kinds on the command bus (same encoding as the RTL)."""
    ACT = 0
    PRE = 1
    REFPB = 2
    REFAB = 3


class TimingViolation(AssertionError):
    """A command broke a timing or protocol rule. ``constraint``, ``bank`` (or None for a
    channel-scope rule without one) and ``cycle`` (DRAM command clock) name it."""

    def __init__(self, message, *, constraint, bank, cycle):
        super().__init__(message)
        self.constraint, self.bank, self.cycle = constraint, bank, cycle


def clock_ratio(cfg: DramConfig, clock_ghz: float) -> Fraction:
    """tCK in logic cycles as an exact fraction (2.5 ns at 1 GHz -> 5/2)."""
    return Fraction(str(cfg.tck_ns)) * Fraction(str(clock_ghz))


def dram_pattern(cfg: DramConfig, bank: int, row: int, col: int, seed: int = 0) -> int:
    """Deterministic content of a never-written burst: ``burst_bytes`` bytes of SHAKE-128 of
    ``(seed, bank, row, col)``, little-endian."""
    key = f"{seed}:{bank}:{row}:{col}".encode()
    return int.from_bytes(hashlib.shake_128(key).digest(cfg.burst_bytes), "little")


_NEVER = -(1 << 60)


def pack_units(words, word_bytes: int, unit_bytes: int) -> list:
    """``words`` (ints of ``word_bytes`` bytes each, little-endian, from byte 0) as ints of
    ``unit_bytes`` bytes (a burst, or a stripe of one burst per channel), the last one
    zero-padded: the controllers' request units of a memory image. Raises
    :class:`OverflowError` for a word that is negative or does not fit ``word_bytes``."""
    raw = b"".join(int(w).to_bytes(word_bytes, "little") for w in words)
    raw += bytes(-len(raw) % unit_bytes)
    return [int.from_bytes(raw[i:i + unit_bytes], "little")
            for i in range(0, len(raw), unit_bytes)]


def backdoor_write(devs, base: int, words, word_bytes: int) -> None:
    """Backdoor (no command, no timing): the memories of ``devs`` (the :class:`DramDevice` of
    one controller's channels, channel 0 lowest; one device for an HB bank) hold ``words``
    (ints of ``word_bytes`` bytes) from word ``base`` on, striped as
    :class:`elmoe3d.hw.ext_ctrl.ExtController` reads them: stripe ``s`` (``burst_bytes x
    len(devs)`` bytes, :func:`pack_units`) is burst address ``s`` of every channel, channel
    ``c`` holding its bytes ``[c B, (c + 1) B)``. Raises :class:`ValueError` for no device,
    devices of different bursts or a ``base`` that does not start a stripe, and
    :class:`OverflowError` as :func:`pack_units` does."""
    if not devs or len({d.cfg.burst_bytes for d in devs}) != 1:
        raise ValueError(f"backdoor_write: expected one or more devices of one burst size, got "
                         f"{[d.cfg.burst_bytes for d in devs]} B bursts")
    bb = devs[0].cfg.burst_bytes
    stripe = bb * len(devs)
    start = base * word_bytes
    if start % stripe:
        raise ValueError(f"base word {base}: {start} B is not a multiple of the {stripe} B "
                         f"stripe")
    for s, unit in enumerate(pack_units(words, word_bytes, stripe)):
        for c, dev in enumerate(devs):
            dev.memory[dev.cfg.decode(start // stripe + s)] = \
                unit >> (c * bb * 8) & ((1 << (bb * 8)) - 1)


class TimingChecker:
    """Timing and protocol rules of one DRAM channel, checked command by command.

    ``issue(k, kind, bank, row=..., col=...)`` with ``k`` the command's DRAM clock cycle
    (non-decreasing), ``kind`` one of ``"ACT", "PRE", "REFPB", "REFAB", "RD", "WR"``. Raises
    :class:`TimingViolation` on the first broken rule (the command is then not applied).
    ``stats`` holds the counters."""

    def __init__(self, cfg: DramConfig, *, name: str = "dram"):
        if cfg.rows is None:
            raise ValueError("cfg: rows is not set; take the DramConfig from an ArchConfig "
                             "(arch.hb, arch.ext) or call with_capacity()")
        self.cfg, self.name = cfg, name
        ck = cfg.ck
        self.t = {n: ck(n) for n in ("RL", "WL", "tRCD", "tRP", "tRAS", "tRC", "tCCD_S",
                                     "tCCD_L", "tRRD_S", "tRRD_L", "tFAW", "tRTP", "tPPD",
                                     "tPBR2PBR", "tPBR2ACT", "tRFCab", "tRFCpb", "tREFI")}
        self.t["WR2PRE"] = cfg.wr_to_pre_ck
        self.t["WTR_S"], self.t["WTR_L"] = cfg.wtr_ck(False), cfg.wtr_ck(True)
        self.t["RTW"] = cfg.rtw_ck
        self.t["REFWINDOW"] = (cfg.max_postponed + 1) * self.t["tREFI"]
        nb = cfg.banks
        self.open_row = [None] * nb          # open row per bank, None = precharged
        self.prev_row = [None] * nb          # row open before the last PRE
        self.closed_by_ref = [True] * nb     # no row opened since start or the last refresh
        self.cols_since_act = [0] * nb
        self.last = {key: [_NEVER] * nb for key in ("ACT", "PRE", "RD", "WR")}
        self.ref_end = [0] * nb              # bank busy refreshing until this cycle
        self.last_ref = [0] * nb             # last refresh covering the bank (0 = start)
        self.ref_kind = ["tRFCpb"] * nb
        self.bg_act = [_NEVER] * cfg.bank_groups
        self.bg_col = [_NEVER] * cfg.bank_groups
        self.bg_wr = [_NEVER] * cfg.bank_groups
        self.acts = deque(maxlen=4)
        self.any = {key: _NEVER for key in ("ACT", "PRE", "RD", "WR", "COL", "REFPB", "REFAB")}
        self.last_k = _NEVER
        self.stats = {k: 0 for k in ("act", "pre", "refpb", "refab", "rd", "wr", "bytes_read",
                                     "bytes_written", "row_hits", "row_misses", "row_conflicts",
                                     "row_reopens", "commands")}

    # -- helpers --

    def _fail(self, constraint, bank, k, text):
        where = f"bank {bank}" if bank is not None else "channel"
        raise TimingViolation(f"{self.name}: {constraint} violated at DRAM cycle {k} ({where}): "
                              f"{text}", constraint=constraint, bank=bank, cycle=k)

    def _need(self, constraint, bank, k, since, needed, what):
        if since != _NEVER and k - since < needed:
            self._fail(constraint, bank, k, f"{k - since} clock(s) after {what} at cycle {since}; "
                                            f"needs {needed}")

    def unit_banks(self, unit: int) -> list:
        """Banks refreshed by a REFPB of refresh unit ``unit``."""
        units = self.cfg.refresh_units
        return list(range(unit, self.cfg.banks, units))

    def _bank(self, kind, bank, k):
        if not is_int(bank) or not 0 <= bank < self.cfg.banks:
            self._fail("address", None, k, f"{kind} to bank {bank!r}, the channel has "
                                            f"{self.cfg.banks}")

    # -- the rules --

    def issue(self, k: int, kind: str, bank: int | None = None, *, row: int | None = None,
              col: int | None = None) -> None:
        if k < self.last_k:
            raise ValueError(f"commands out of order: cycle {k} after {self.last_k}")
        self.last_k = k
        self.check_refresh(k)
        getattr(self, f"_{kind.lower()}")(k, bank, row, col)
        self.stats["commands"] += 1

    def _act(self, k, b, row, col):
        cfg, t = self.cfg, self.t
        self._bank("ACT", b, k)
        if row is None or not 0 <= row < cfg.rows:
            self._fail("address", b, k, f"ACT of row {row!r}, the bank has {cfg.rows} rows")
        if self.open_row[b] is not None:
            self._fail("ACT to an open bank", b, k, f"row {self.open_row[b]} is open")
        if k < self.ref_end[b]:
            self._fail(self.ref_kind[b], b, k, f"bank refreshing until cycle {self.ref_end[b]}")
        self._need("tRP", b, k, self.last["PRE"][b], t["tRP"], "PRE")
        self._need("tRC", b, k, self.last["ACT"][b], t["tRC"], "ACT")
        g = b % cfg.bank_groups
        self._need("tRRD_L", b, k, self.bg_act[g], t["tRRD_L"], f"ACT in bank group {g}")
        self._need("tRRD_S", b, k, self.any["ACT"], t["tRRD_S"], "ACT")
        if len(self.acts) == 4:
            self._need("tFAW", b, k, self.acts[0], t["tFAW"], "the fourth-last ACT")
        self._need("tPBR2ACT", b, k, self.any["REFPB"], t["tPBR2ACT"], "REFPB")
        # -- apply --
        st = self.stats
        st["act"] += 1
        if self.closed_by_ref[b] or self.prev_row[b] is None:
            st["row_misses"] += 1
        elif self.prev_row[b] == row:
            st["row_reopens"] += 1
        else:
            st["row_conflicts"] += 1
        self.open_row[b], self.closed_by_ref[b], self.cols_since_act[b] = row, False, 0
        self.last["ACT"][b] = self.bg_act[g] = self.any["ACT"] = k
        self.acts.append(k)

    def _pre(self, k, b, row, col):
        t = self.t
        self._bank("PRE", b, k)
        if self.open_row[b] is None:
            self._fail("PRE to a closed bank", b, k, "no row is open")
        self._need("tRAS", b, k, self.last["ACT"][b], t["tRAS"], "ACT")
        self._need("tRTP", b, k, self.last["RD"][b], t["tRTP"], "RD")
        self._need("tWR", b, k, self.last["WR"][b], t["WR2PRE"], "WR (WL + burst + tWR)")
        self._need("tPPD", b, k, self.any["PRE"], t["tPPD"], "PRE")
        self.stats["pre"] += 1
        self.prev_row[b], self.open_row[b] = self.open_row[b], None
        self.last["PRE"][b] = self.any["PRE"] = k

    def _col(self, k, b, col, write):
        cfg, t = self.cfg, self.t
        kind = "WR" if write else "RD"
        self._bank(kind, b, k)
        if col is None or not 0 <= col < cfg.columns:
            self._fail("address", b, k, f"{kind} of column {col!r}, a row has {cfg.columns}")
        if self.open_row[b] is None:
            self._fail(f"{kind} to a closed bank", b, k, "no row is open")
        self._need("tRCD", b, k, self.last["ACT"][b], t["tRCD"], "ACT")
        g = b % cfg.bank_groups
        self._need("tCCD_L", b, k, self.bg_col[g], t["tCCD_L"], f"RD/WR in bank group {g}")
        self._need("tCCD_S", b, k, self.any["COL"], max(t["tCCD_S"], cfg.burst_ck), "RD/WR")
        if write:
            self._need("tRTW", b, k, self.any["RD"], t["RTW"], "RD (RL + burst + 2 - WL)")
        else:
            self._need("tWTR_L", b, k, self.bg_wr[g], t["WTR_L"],
                       f"WR in bank group {g} (WL + burst + tWTR_L)")
            self._need("tWTR_S", b, k, self.any["WR"], t["WTR_S"], "WR (WL + burst + tWTR_S)")
        st = self.stats
        st["wr" if write else "rd"] += 1
        st["bytes_written" if write else "bytes_read"] += cfg.burst_bytes
        if self.cols_since_act[b]:
            st["row_hits"] += 1
        self.cols_since_act[b] += 1
        self.last[kind][b] = self.any[kind] = self.any["COL"] = self.bg_col[g] = k
        if write:
            self.bg_wr[g] = k

    def _rd(self, k, b, row, col):
        self._col(k, b, col, False)

    def _wr(self, k, b, row, col):
        self._col(k, b, col, True)

    def _ref_banks(self, k, banks, kind, duration):
        t = self.t
        for b in banks:
            if self.open_row[b] is not None:
                self._fail(f"{kind} with a bank open", b, k, f"row {self.open_row[b]} is open")
            if k < self.ref_end[b]:
                self._fail(self.ref_kind[b], b, k, f"bank still refreshing until cycle "
                                               f"{self.ref_end[b]}")
            self._need("tRP", b, k, self.last["PRE"][b], t["tRP"], "PRE")
            self._need("tRC", b, k, self.last["ACT"][b], t["tRC"], "ACT")
        for b in banks:
            self.ref_end[b] = k + duration
            self.last_ref[b] = k
            self.closed_by_ref[b] = True
            self.ref_kind[b] = "tRFCpb" if kind == "REFPB" else "tRFCab"

    def _refpb(self, k, unit, row, col):
        cfg, t = self.cfg, self.t
        if not cfg.per_bank_refresh:
            self._fail("REFPB in all-bank refresh mode", None, k, "the configuration refreshes "
                                                                   "all banks at once")
        if not is_int(unit) or not 0 <= unit < cfg.refresh_units:
            self._fail("address", None, k, f"REFPB of unit {unit!r}, there are "
                                            f"{cfg.refresh_units}")
        self._need("tRRD_S", unit, k, self.any["ACT"], t["tRRD_S"], "ACT (ACT -> REFPB)")
        self._need("tPBR2PBR", unit, k, self.any["REFPB"], t["tPBR2PBR"], "REFPB")
        self._ref_banks(k, self.unit_banks(unit), "REFPB", t["tRFCpb"])
        self.stats["refpb"] += 1
        self.any["REFPB"] = k

    def _refab(self, k, bank, row, col):
        t = self.t
        self._ref_banks(k, range(self.cfg.banks), "REFAB", t["tRFCab"])
        self.stats["refab"] += 1
        self.any["REFAB"] = k

    def check_refresh(self, k: int) -> None:
        """Every bank refreshed at least once in the last ``(max_postponed + 1) * tREFI``."""
        window = self.t["REFWINDOW"]
        oldest = min(self.last_ref)
        if k - oldest > window:
            b = self.last_ref.index(oldest)
            self._fail("refresh rate", b, k, f"last refreshed at cycle {oldest}, more than "
                                             f"(max_postponed + 1) x tREFI = {window} clocks ago")


class DramDevice:
    """One DRAM channel as the controller sees it, stepped once per logic cycle.

    ``clock(row=None, col=None)`` takes the command bus sampled during the current logic cycle
    -- ``row = (kind, bank, row)`` with ``kind`` a :class:`RowCmd`, ``col = (write, bank, col,
    wdata)`` -- checks and applies it, and returns the read burst (an int of ``burst_bytes``
    bytes) to present on the read-data input during the next logic cycle, or None.

    Raises :class:`TimingViolation` on any violation, including a command on a logic cycle
    without a DRAM clock edge and two commands in one clock on a single command bus.
    ``stats`` (the checker's counters plus ``first_cycle``/``last_cycle`` of the commands and
    ``cycles``) and ``memory`` (dict ``(bank, row, col) -> int`` of written bursts) are
    readable. ``clock_ghz``: the logic clock the controller runs in."""

    def __init__(self, cfg: DramConfig, *, clock_ghz: float, name: str = "dram", seed: int = 0):
        self.cfg, self.name, self.seed = cfg, name, seed
        self.checker = TimingChecker(cfg, name=name)
        ratio = clock_ratio(cfg, clock_ghz)
        if ratio < 1:
            raise ValueError(f"clock_ghz: the DRAM command clock ({1 / cfg.tck_ns:g} GHz) is "
                             f"faster than the logic clock ({clock_ghz:g} GHz)")
        self.p, self.q = ratio.numerator, ratio.denominator
        self.cycle = 0
        self.memory = {}
        self.returns = deque()
        self.read_ck = cfg.ck("RL") + cfg.burst_ck

    @property
    def stats(self) -> dict:
        return self.checker.stats

    def tick(self, c: int) -> bool:
        """True when logic cycle ``c`` carries a DRAM command-clock edge."""
        return (c + 1) * self.q // self.p > c * self.q // self.p

    def dram_cycle(self, c: int) -> int:
        """DRAM clock index of the edge in logic cycle ``c`` (the number of edges before)."""
        return (c + 1) * self.q // self.p - 1

    def logic_cycle(self, k: int) -> int:
        """Logic cycle carrying DRAM clock edge ``k``."""
        return -(-(k + 1) * self.p // self.q) - 1

    def read_burst(self, bank: int, row: int, col: int) -> int:
        got = self.memory.get((bank, row, col))
        return dram_pattern(self.cfg, bank, row, col, self.seed) if got is None else got

    def clock(self, row=None, col=None):
        c = self.cycle
        self.cycle += 1
        if row is not None or col is not None:
            k = self.dram_cycle(c)
            if not self.tick(c):
                self.checker._fail("command clock", None, k, f"command on logic cycle {c}, "
                                   f"which has no DRAM clock edge (tCK = {self.p}/{self.q} "
                                   f"logic cycles)")
            if row is not None and col is not None and not self.cfg.dual_command_bus:
                self.checker._fail("command bus", None, k, "a row and a column command in one "
                                   "clock on a single command bus")
            if row is not None:
                kind, bank, addr = row
                kind = RowCmd(int(kind))
                self.checker.issue(k, kind.name, int(bank), row=int(addr))
            if col is not None:
                write, bank, cidx, wdata = col
                bank, cidx = int(bank), int(cidx)
                self.checker.issue(k, "WR" if write else "RD", bank, col=cidx)
                r = self.checker.open_row[bank]
                if write:
                    self.memory[(bank, r, cidx)] = int(wdata)
                else:
                    self.returns.append((self.logic_cycle(k + self.read_ck),
                                         self.read_burst(bank, r, cidx)))
            st = self.stats
            st.setdefault("first_cycle", c)
            st["last_cycle"] = c
        self.stats["cycles"] = self.cycle
        if self.returns and self.returns[0][0] <= c + 1:
            due, data = self.returns.popleft()
            assert due == c + 1, "read returns are in order, one per clock at most"
            return data
        return None

    def finish(self) -> dict:
        """End of a run: the refresh-rate rule up to the current cycle; returns ``stats``."""
        self.checker.check_refresh(self.dram_cycle(self.cycle))
        return self.stats

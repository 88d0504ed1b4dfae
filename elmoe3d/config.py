"""The one configuration object of ELMoE-3D.

The RTL generator, the golden model, the benches, the area roll-up and the performance model all
read their figures from an :class:`ArchConfig`; no figure is typed twice. Presets:

* ``small``     -- what the cocotb benches simulate (2x4x32 tensor tile).
* ``paper-4gb`` -- the paper's 16-PE die with 4 GB of HB DRAM (Table 1).
* ``paper-8gb`` -- the paper's 32-PE die with 8 GB of HB DRAM (Table 1).

Unknown keys in a dictionary or file are rejected, never silently defaulted.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


__all__ = ["TileConfig", "ArchConfig", "PEConfig", "PRESETS", "preset", "ConfigError"]


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names the field."""


def _check_int(name, value, *, lo=1, power_of_two=False, even=False):
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
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
    streamline_gbps, aggregation_gbps : float
        Streamline ring (128 GB/s) and aggregation link (32 GB/s).
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
    streamline_gbps: float = 128.0
    aggregation_gbps: float = 32.0

    def __post_init__(self):
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

    @property
    def groups(self) -> int:
        """Number of PE groups (aggregation-link domains)."""
        return self.pes // self.pes_per_group

    @property
    def hb_bytes_per_cycle(self) -> float:
        """HB bytes delivered per logic-die cycle per bank (51.2 at 1 GHz)."""
        return self.hb_bank_gbps / self.clock_ghz

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
        Tensor-tile shape (M, N); the PE needs ``lanes % 4 == 0`` and ``lanes == 2 * rows``.
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
        IOMEM split (``iomem_words = iomem_bytes / (W/8)``, a multiple of 32): ACT 1/8,
        TOK 1/32, HBUF 1/2 and OUT the remaining 11/32.
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

    @classmethod
    def from_arch(cls, arch: "ArchConfig") -> "PEConfig":
        rows, lanes = arch.tile.rows, arch.tile.lanes
        if lanes % 4:
            raise ConfigError(f"tile.lanes: the PE needs lanes % 4 == 0 (FULL-mode SwiGLU "
                              f"blocks of lanes/4 channels), got {lanes}")
        if lanes != 2 * rows:
            raise ConfigError(f"tile.lanes: the PE needs lanes == 2 * rows so that an "
                              f"activation word (rows x 32 INT8) is as wide as a weight word "
                              f"(lanes x 32 nibbles); got rows={rows}, lanes={lanes}")
        word_bits = lanes * 128
        word_bytes = word_bits // 8
        if arch.wmem_bytes % (4 * word_bytes * 8):
            raise ConfigError(f"wmem_bytes: {arch.wmem_bytes} is not a multiple of 2 buffers x "
                              f"2 planes x {word_bytes} B words x 8 (scale entries per word)")
        if arch.iomem_bytes % (32 * word_bytes):
            raise ConfigError(f"iomem_bytes: {arch.iomem_bytes} is not a multiple of "
                              f"32 words of {word_bytes} B")
        iomem_words = arch.iomem_bytes // word_bytes
        act, tok, hbuf = iomem_words // 8, iomem_words // 32, iomem_words // 2
        return cls(rows=rows, lanes=lanes, word_bits=word_bits,
                   wmem_words=arch.wmem_bytes // (4 * word_bytes),
                   act_words=act, tok_words=tok, hbuf_words=hbuf,
                   out_words=iomem_words - act - tok - hbuf)

    @property
    def word_bytes(self) -> int:
        return self.word_bits // 8

    @property
    def wscale_words(self) -> int:
        return self.wmem_words // 8

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


PRESETS = {
    "small": ArchConfig(),
    "paper-4gb": ArchConfig(
        name="paper-4gb", tile=TileConfig(rows=16, lanes=32, group=32), pes=16,
        pes_per_group=4, wmem_bytes=32 << 10, iomem_bytes=32 << 10,
        hb_bank_bytes=256 << 20, ext_bytes=64 << 30),
    "paper-8gb": ArchConfig(
        name="paper-8gb", tile=TileConfig(rows=16, lanes=32, group=32), pes=32,
        pes_per_group=4, wmem_bytes=32 << 10, iomem_bytes=32 << 10,
        hb_bank_bytes=256 << 20, ext_bytes=64 << 30),
}


def preset(name: str) -> ArchConfig:
    """Return the named preset; raises :class:`ConfigError` listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown configuration {name!r}; expected one of "
                          f"{', '.join(PRESETS)}") from None

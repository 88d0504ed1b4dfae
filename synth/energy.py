"""Energy per operation of the logic die: pJ per MAC of the tensor tile in DRAFT and FULL from a
real program, the SRAM macros' energy per byte, and the static power of every block.

**pJ per MAC** (:func:`tile_energy`). The three fit tiles of the area model
(:data:`~elmoe3d.synth.blocks.TILE_FIT`: (R, L) = (1, 2), (2, 2), (1, 4)) are mapped for delay
as the timing run maps them (:func:`~elmoe3d.synth.flow.synthesize` with timing; the netlist
is kept in ``build/synth/power/``), and each runs the up-projection GEMM of all-MiniLM-L6-v2
FFN layer 0 (real weights, real activations of 8 GSM8K prompt tokens, 16 output channels,
K = 384; :func:`~elmoe3d.synth.activity.minilm_tile_run`) in DRAFT and in FULL in Amaranth's
simulator, one beat a cycle, every result checked against ``ref_tile``. The VCD gives every
register and input-port bit its probability and toggle rate (:mod:`elmoe3d.synth.activity`),
:func:`~elmoe3d.synth.power.analyze_power` the energy per cycle of the fit's netlist. The
energy per cycle is then fitted like the area, ``E(R, L) = a + b L + c R L`` (exact through
the three fits: ``a`` the tile's own control, ``b`` per lane, ``c`` per row and lane: the
unit PEs, adder tree, slice combining and dequantisation of one (row, lane)), and evaluated at
the paper tile (16 x 32 x 32). A row of the paper tile is another token and a lane another
channel of the same kind of data, so the per-(row, lane) activity of the fits carries over;
the broadcast nets (activations to all lanes, the ``advance`` enable) have larger fanout in
the paper tile than in the fits (their buffer trees are not in the fits). Per MAC:

* DRAFT: one unit-PE product (INT8 activation x 5-bit augmented MSB weight) per MAC:
  ``R L 32`` MACs a cycle;
* FULL: an INT8 x INT8 MAC is two unit-PE products (MSB and LSB slice on lanes 2j, 2j+1):
  ``R L/2 32`` MACs a cycle.

The tile runs one beat a cycle here (no stalls), so the energy per cycle is the energy per
beat; leakage is added at the paper's 1 GHz (``leakage_nw`` x 1 ns per cycle).

**SRAM** (:data:`SRAM_READ_PJ`, :data:`SRAM_WRITE_PJ`): the ASAP7 SRAM bank Liberty files of
The-OpenROAD-Project/asap7_sram_0p0 (``generated/LIB/srambank_256x4x64_6t122.lib``, commit
9f5af0939e8dd3cc1a9693a50b23441691dd7d25; every bank size there carries the same power tables,
characterised for an 8 KB bank, ``bus_srambank_8kB_6t122_ltc1``): the clock pin's
``internal_power`` (VDD + VSS, rise + fall) when ``!write`` (a read) 1.44236 + 2.11495 +
0.373495 + 0.360267 = 4.291 pJ, when ``write`` 0 + 0 + 0.186927 + 0.132678 = 0.320 pJ, per
64-bit (8-byte) access; the address, ``read``, ``write``, ``banksel`` and data pins add < 0.04
pJ (counted below with every bit toggling once). Its ``cell_leakage_power`` is 0: SRAM leakage
is not modelled.

**Streamline ring** (:func:`ring_energy`): one station's delay-mapped netlist under a real
weight stream (MiniLM weight codes, one 128-byte flit a cycle), its flit FIFOs at the SRAM
figures; pJ per byte per station hop and per byte delivered.

**Aggregation link** (:func:`link_energy`): the link's delay-mapped netlist under a REDUCE_ADD
of real Q.24 partial sums (the tensor-parallel reduction), its destination FIFOs at the SRAM
figures; pJ per byte sent by the sources and per reduced byte delivered.

**Static power** (:func:`leakage_nw`): every cell of a block's area netlist at its
``leakage_power`` without ``when`` (ASAP7 gives it as the average over the input states),
rolled up over the instances like the area (:func:`elmoe3d.synth.rollup.evaluate` with this
metric).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from .liberty import Liberty


__all__ = ["SRAM_READ_PJ", "SRAM_WRITE_PJ", "SRAM_WORD_BYTES", "SRAM_SOURCE",
           "sram_access_pj", "leakage_nw", "tile_energy", "TileEnergy", "PUBLISHED_MAC",
           "ring_energy", "link_energy", "DieEnergy", "DIE_ENERGY", "energy_drift", "sram_pj_per_byte"]


#: Energy of one 64-bit read of an ASAP7 SRAM bank (pJ): clock-pin internal power when !write
#: (VDD rise 1.44236 + VSS rise 2.11495 + VDD fall 0.373495 + VSS fall 0.360267), plus the
#: input pins (ADDRESS 8 bits, read, banksel: 0.0176 + 0.0166 per pin toggle pair, at most).
SRAM_READ_PJ = 1.44236 + 2.11495 + 0.373495 + 0.360267
#: Energy of one 64-bit write (pJ): clock-pin internal power when write (0.186927 + 0.132678).
SRAM_WRITE_PJ = 0.186927 + 0.132678
#: Bytes per access of the characterised bank (64-bit data).
SRAM_WORD_BYTES = 8
#: Input-pin energy per toggle pair of an address / control pin (pJ): ADDRESS VDD + VSS rise and
#: fall (0.00471622 + 0.00620875 + 0.00490932 + 0.00604381) / 2.
SRAM_PIN_PJ = (0.00471622 + 0.00620875 + 0.00490932 + 0.00604381) / 2
SRAM_SOURCE = ("SRAM access energy: clock-pin internal_power of srambank_256x4x64_6t122 "
               "(read: when !write, write: when write; VDD + VSS, rise + fall), "
               "The-OpenROAD-Project/asap7_sram_0p0 generated/LIB, commit "
               "9f5af0939e8dd3cc1a9693a50b23441691dd7d25 (BSD 3-Clause); its "
               "cell_leakage_power is 0 (SRAM leakage not modelled)")

#: Published INT8 MAC energies for comparison (pJ per MAC = 2 / (TOPS/W), one MAC = two ops),
#: whole accelerators (their SRAM, control and clock tree included).
PUBLISHED_MAC = [
    {"what": "MediaTek APU, 7 nm, INT8 peak 13.3 TOPS/W (C.-H. Lin et al., ISSCC 2020, 7.1, "
             "'A 3.4-to-13.3TOPS/W 3.6TOPS dual-core deep-learning accelerator for versatile "
             "AI applications in 7nm 5G smartphone SoC')", "pj_per_mac": 2 / 13.3},
    {"what": "Samsung NPU, 8 nm, INT8 11.5 TOPS/W (J. Song et al., ISSCC 2019, 7.1, 'An "
             "11.5TOPS/W 1024-MAC butterfly structure dual-core sparsity-aware neural "
             "processing unit in 8nm flagship mobile SoC')", "pj_per_mac": 2 / 11.5},
    {"what": "Samsung NPU, 4 nm, INT8 11.59 TOPS/W on MobileNetEdgeTPU (J.-W. Jang et al., "
             "JSSC 58(1), 2023, 'A multi-mode 8k-MAC HW-utilization-aware neural processing "
             "unit with a unified multi-precision datapath in 4-nm flagship mobile SoC')",
     "pj_per_mac": 2 / 11.59},
]


@dataclass(frozen=True)
class DieEnergy:
    """The logic die's energy per operation as ``elmoe3d synth --timing --power`` measured it
    (TT, 0.7 V, 25 C, 1 GHz; README, "Power and energy per operation"): the figures the
    performance model's energy uses (:mod:`elmoe3d.sw.host.paper_eval`, Fig. 15). A power run
    prints each figure it measures beside these (:func:`energy_drift`), so a change of the RTL
    or of the library that moves one shows there.

    Dynamic figures (leakage is in ``static_mw`` alone): ``mac_pj`` pJ per MAC of the
    ``tile`` (``"RxL"``) by weight bits (4: DRAFT, W4A8, one unit-PE product a MAC; 8: FULL,
    W8A8, two products a MAC); ``ring_pj_per_byte``: the streamline ring of ``config``, pJ per
    delivered byte (its station hops and flit FIFOs); ``link_pj_per_byte``: the aggregation
    link's REDUCE_ADD of ``config``, pJ per reduced byte delivered (its sources' words and
    destination FIFOs). ``static_mw``: leakage of the logic (SRAM leakage is 0 in the ASAP7
    SRAM library) by configuration preset, mW. ``measured``: when and with what."""

    mac_pj: tuple            # ((4, pJ), (8, pJ))
    ring_pj_per_byte: float
    link_pj_per_byte: float
    static_mw: tuple         # ((preset, mW), ...)
    tile: str
    config: str
    measured: str

    def mac(self, bits: int) -> float:
        """pJ per MAC at ``bits``-bit weights (4 or 8)."""
        return dict(self.mac_pj)[bits]

    def static_of(self, arch) -> float:
        """Static power (mW) of the logic die of ``arch`` (an ArchConfig): the measured
        figure when ``arch`` is that preset, or that preset with only its DRAM's energy
        figures changed (:data:`~elmoe3d.config.DRAM_ENERGY_FIELDS`, not the die's), else
        ``arch.pes`` x the mean static power a PE with its share of the die has in the
        measured presets."""
        from ..config import DRAM_ENERGY_FIELDS, preset
        measured = dict(self.static_mw)
        if arch.name in measured:
            ref = preset(arch.name)
            if replace(arch, **{f: getattr(ref, f) for f in DRAM_ENERGY_FIELDS}) == ref:
                return measured[arch.name]
        per_pe = sum(mw / preset(name).pes for name, mw in measured.items()) / len(measured)
        return arch.pes * per_pe


#: The figures of the last ``make synth`` (``elmoe3d synth --timing --power``, 2026-12-07,
#: once the roll-up built the die's blocks with the die's own parameters: the link's 64-deep
#: flit FIFOs, the controllers' 32-deep queues; README table "Power and energy per
#: operation"): tile 0.1356 / 0.2522 pJ per MAC dynamic, ring 1.936 pJ per delivered byte, link
#: 1.884 pJ per reduced byte (dynamic: their leakage is under 0.1% of either), die 10.81 mW
#: (4 GB) and 21.61 mW (8 GB). The runs before gave the same tile and ring figures, a link of
#: 1.888 pJ and an 8 GB die of 21.60 mW (2026-12-03 at d0e2234, the link with 32-deep
#: FIFOs), a 4 GB die of 10.85 mW (784663f, before the always-ready units: their stage
#: enables) and 10.51 mW (dcaff16, before the skid register and the units' input registers);
#: another die is scaled per PE (:meth:`DieEnergy.static_of`).
DIE_ENERGY = DieEnergy(mac_pj=((4, 0.1356), (8, 0.2522)), ring_pj_per_byte=1.936,
                       link_pj_per_byte=1.884,
                       static_mw=(("paper-4gb", 10.81), ("paper-8gb", 21.61)),
                       tile="16x32", config="paper-4gb",
                       measured="elmoe3d synth --timing --power --config paper-4gb,paper-8gb, "
                                "2026-12-07")


def sram_pj_per_byte(*, write: bool = False) -> float:
    """pJ per byte of an SRAM read (or write) through the ASAP7 64-bit banks
    (:func:`sram_access_pj` of one bank word over its bytes)."""
    return sram_access_pj(SRAM_WORD_BYTES * 8, write=write) / SRAM_WORD_BYTES


def energy_drift(power: dict, recorded: DieEnergy = DIE_ENERGY) -> list:
    """``(figure, measured, recorded, measured / recorded)`` for every :class:`DieEnergy`
    figure, from a ``power`` report (``elmoe3d synth --power``'s JSON ``power`` part); a figure
    the report does not have gets ``None`` for measured and ratio (another ``--config``)."""
    tile = power.get("tile", {}).get(recorded.tile, {})
    ring = power.get("ring", {}).get(recorded.config)
    link = power.get("link", {}).get(recorded.config)
    got = [(f"tile {recorded.tile} {mode} pJ/MAC (dynamic)",
            tile[mode]["pj_per_mac_dynamic"] if mode in tile else None, recorded.mac(bits))
           for mode, bits in (("DRAFT", 4), ("FULL", 8))]
    got.append((f"{recorded.config} ring pJ per delivered byte (dynamic)",
                None if ring is None else
                (ring["logic_pj_per_byte"] + ring["fifo_pj_per_byte"]) * ring["hops_mean"],
                recorded.ring_pj_per_byte))
    got.append((f"{recorded.config} link pJ per reduced byte (dynamic)",
                None if link is None else
                (link["logic_pj"] + link["fifo_pj"]) / link["bytes_out"],
                recorded.link_pj_per_byte))
    configs = power.get("configs", {})
    got += [(f"{name} die static mW", configs[name]["die_static_mw"] if name in configs
             else None, mw) for name, mw in recorded.static_mw]
    return [(what, m, r, None if m is None else m / r) for what, m, r in got]


def sram_access_pj(width: int, *, write: bool = False) -> float:
    """Energy (pJ) of one access of a ``width``-bit memory built from 64-bit banks (one bank
    access per 64 bits, rounded up; the bank's address and control pins toggling once each)."""
    banks = -(-width // (SRAM_WORD_BYTES * 8))
    per = (SRAM_WRITE_PJ if write else SRAM_READ_PJ) + 10 * SRAM_PIN_PJ
    return banks * per


def leakage_nw(cells: dict, lib: Liberty) -> float:
    """Leakage (nW) of ``cells`` (type -> count) at each cell's unconditional
    ``leakage_power`` (the state average in ASAP7; the mean of its ``when`` values if it has
    none). Raises ``KeyError`` naming a type the library does not have."""
    from .power import leakage_unit_nw
    unit = leakage_unit_nw(lib)
    total = 0.0
    for t, n in cells.items():
        cell = lib.cells[t]
        plain = [lk.value for lk in cell.leakage if not lk.when]
        if plain:
            value = sum(plain)
        else:
            by_when = {}
            for lk in cell.leakage:
                by_when[lk.when] = by_when.get(lk.when, 0.0) + lk.value
            value = sum(by_when.values()) / max(len(by_when), 1)
        total += n * value * unit
    return total


@dataclass
class TileEnergy:
    """Energy of the tensor tile in one mode.

    ``fits``: per fit tile ``"RxL"`` its run (beats, cycles, MACs), its energy per cycle (fJ:
    internal, switching, clock pins) and leakage (nW); ``model``: ``a, b, c`` of ``E(R, L)``
    (fJ per cycle); ``rows``, ``lanes``: the tile evaluated; ``fj_per_cycle``,
    ``leakage_nw``, ``macs_per_cycle``, ``pj_per_mac`` (dynamic + leakage at
    ``frequency_ghz``), ``pj_per_mac_dynamic``."""

    mode: str
    rows: int
    lanes: int
    fits: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    fj_per_cycle: float = 0.0
    leakage_nw: float = 0.0
    macs_per_cycle: int = 0
    pj_per_mac: float = 0.0
    pj_per_mac_dynamic: float = 0.0
    frequency_ghz: float = 1.0


def leakage_fj_per_cycle(leakage_nw: float, frequency_ghz: float) -> float:
    """The energy ``leakage_nw`` (nW) leaks in one cycle at ``frequency_ghz`` (GHz), in fJ:
    1 nW over 1 ns is 1e-18 J, 1e-3 fJ (a tile's 740 uW at 1 GHz: 740 fJ, 0.74 pJ, a cycle).
    Until 2026-12-07 ``tile_energy`` added nW / GHz to fJ unconverted, 1,000 times the
    leakage (a test audit's finding)."""
    return leakage_nw / frequency_ghz / 1000.0


def _fit(values):
    """``a, b, c`` of ``a + b L + c R L`` through the fits (1, 2), (2, 2), (1, 4)."""
    t12, t22, t14 = values[(1, 2)], values[(2, 2)], values[(1, 4)]
    c = (t22 - t12) / 2
    b = (t14 - t12) / 2 - c
    a = t12 - 2 * b - 2 * c
    return a, b, c


def _netlist(r, lanes, lib, workdir: Path):
    """The fit tile's delay-mapped netlist (BLIF text) and RTLIL, re-synthesised only when the
    RTL changed (the RTLIL kept beside it)."""
    from amaranth.back import rtlil

    from ..config import TileConfig
    from ..hw.tile import TensorTile
    from .flow import synthesize
    text = rtlil.convert(TensorTile(config=TileConfig(rows=r, lanes=lanes)), name="top",
                         emit_src=False)
    folder = workdir / f"tile_r{r}_l{lanes}"
    il, blif = folder / "block.il", folder / "timing.blif"
    if not (il.is_file() and blif.is_file() and il.read_text() == text):
        synthesize(f"tile {r}x{lanes}x32 (power)", text, liberty=lib, keep=folder,
                   timing=1000.0)
    return blif.read_text(), text


def tile_energy(lib: Liberty, *, workdir: Path, rows: int = 16, lanes: int = 32,
                modes=("DRAFT", "FULL"), frequency_ghz: float = 1.0, progress=None) -> dict:
    """``{mode: TileEnergy}`` of a ``rows x lanes x 32`` tile (module docstring); the fits'
    netlists and VCDs live in ``workdir``. ``progress(message)`` is called per step."""
    from ..config import TileConfig
    from ..sw.golden.datapath import Mode
    from .activity import annotate, minilm_tile_run, rtlil_aliases, vcd_activity
    from .blocks import TILE_FIT
    from .power import PowerLib, analyze_power
    from .sta import read_blif
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    plib = PowerLib(lib)
    say = progress or (lambda msg: None)
    nets = {}
    for r, l in TILE_FIT:
        say(f"tile {r}x{l}x32: delay mapping")
        blif, il = _netlist(r, l, lib, workdir)
        nets[(r, l)] = (read_blif(blif), rtlil_aliases(il))
    out = {}
    for mode in modes:
        e = TileEnergy(mode=mode, rows=rows, lanes=lanes, frequency_ghz=frequency_ghz)
        dyn, leak = {}, {}
        for (r, l), (net, aliases) in nets.items():
            say(f"tile {r}x{l}x32: MiniLM L0 up-projection, {mode}")
            vcd = workdir / f"tile_r{r}_l{l}_{mode}.vcd"
            run = minilm_tile_run(TileConfig(rows=r, lanes=l), Mode[mode], vcd)
            act, cycles = vcd_activity(vcd)
            act, missing = annotate(net, act, aliases)
            p = analyze_power(net, plib, act)
            vcd.unlink()
            dyn[(r, l)] = p.dynamic_fj
            leak[(r, l)] = p.leakage_nw
            e.fits[f"{r}x{l}"] = {**run, "vcd_cycles": cycles, "internal_fj": p.internal_fj,
                                  "switching_fj": p.switching_fj,
                                  "clock_pins_fj": p.clock_pins_fj,
                                  "dynamic_fj": p.dynamic_fj, "leakage_nw": p.leakage_nw,
                                  "sources": p.sources, "annotated": p.annotated,
                                  "not_annotated": missing, "mean_toggle": p.mean_toggle}
        a, b, c = _fit(dyn)
        la, lb, lc = _fit(leak)
        e.model = {"a_fj": a, "b_fj": b, "c_fj": c, "leak_a_nw": la, "leak_b_nw": lb,
                   "leak_c_nw": lc}
        e.fj_per_cycle = a + b * lanes + c * rows * lanes
        e.leakage_nw = la + lb * lanes + lc * rows * lanes
        per_rl = 32 if mode != "FULL" else 16
        e.macs_per_cycle = rows * lanes * per_rl
        e.pj_per_mac_dynamic = e.fj_per_cycle / 1000.0 / e.macs_per_cycle
        e.pj_per_mac = (e.fj_per_cycle + leakage_fj_per_cycle(e.leakage_nw, frequency_ghz)) \
            / 1000.0 / e.macs_per_cycle
        out[mode] = e
    return out


def ring_energy(arch, lib: Liberty, *, workdir: Path, words: int = 256) -> dict:
    """Energy per byte of one streamline-ring station hop of ``arch`` (station 0; every
    station but the last is the same logic): the station's delay-mapped netlist (kept in
    ``workdir/ring_station0``) under the activity of a stream of ``words`` real MiniLM weight
    words through it (:func:`~elmoe3d.synth.activity.ring_station_run`: one flit a cycle,
    words unicast round-robin to the die's PEs, so the station keeps ``local_pes / pes`` of
    them), plus its flit FIFOs (SRAM macros, black boxes in the netlist) at
    :func:`sram_access_pj` per write and read of every flit they hold, plus leakage at 1 GHz.
    The FIFO figures are the 8 KB bank's (:data:`SRAM_SOURCE`): an 8-flit FIFO built as a
    register file would cost less.

    Returns ``{"bytes", "cycles", "flits", "local_flits", "logic_pj_per_byte",
    "fifo_pj_per_byte", "leakage_pj_per_byte", "pj_per_byte", "hops_mean",
    "pj_per_byte_delivered", ...}``: ``pj_per_byte`` per station a byte passes,
    ``pj_per_byte_delivered`` times the mean number of stations a byte passes to reach a
    uniformly chosen PE, ``(groups + 1) / 2``."""
    from ..hw.die import LogicDie
    from ..hw.ring import StreamlineRing
    from .activity import annotate, ring_station_run, rtlil_aliases, vcd_activity
    from .blocks import hollow
    from .flow import synthesize
    from .power import PowerLib, analyze_power
    from .sta import read_blif, stub_ports
    ring = LogicDie.ring_params(config=arch)      # station 0 of the die's ring
    st = StreamlineRing.station(0, **ring)
    workdir = Path(workdir)
    folder = workdir / "ring_station0"
    h = hollow(st, owner="ring station")
    il, blif, stubs = folder / "block.il", folder / "timing.blif", folder / "stubs.txt"
    if not (il.is_file() and blif.is_file() and stubs.is_file() and il.read_text() == h.rtlil
            and stubs.read_text() == h.stubs):
        folder.mkdir(parents=True, exist_ok=True)
        synthesize("ring station (power)", h.rtlil, liberty=lib, stubs=h.stubs, keep=folder,
                   timing=1000.0)
        stubs.write_text(h.stubs)
    st = StreamlineRing.station(0, **ring)
    vcd = workdir / "ring_station0.vcd"
    run = ring_station_run(st, vcd, words=words)
    act, cycles = vcd_activity(vcd)
    vcd.unlink()
    net = read_blif(blif.read_text())
    act, missing = annotate(net, act, rtlil_aliases(il.read_text()))
    p = analyze_power(net, PowerLib(lib), act, stubs=stub_ports(stubs.read_text()))
    fifo_local = [s.width for s in h.srams if s.depth == ring["buffer_flits"]]
    fifo_out = [s.width for s in h.srams if s.depth != ring["buffer_flits"]]
    w_local = fifo_local[0] if fifo_local else 0
    w_out = fifo_out[0] if fifo_out else 0
    fifo_pj = run["local_flits"] * (sram_access_pj(w_local) + sram_access_pj(w_local, write=True))
    if w_out:
        fifo_pj += run["forwarded_flits"] * (sram_access_pj(w_out) +
                                             sram_access_pj(w_out, write=True))
    b = run["bytes"]
    logic = p.dynamic_fj * cycles / 1000.0 / b
    leak = leakage_fj_per_cycle(p.leakage_nw, 1.0) * cycles / 1000.0 / b      # at 1 GHz
    per = logic + fifo_pj / b + leak
    hops = (ring["pes"] // ring["pes_per_group"] + 1) / 2
    return {**run, "vcd_cycles": cycles, "logic_pj_per_byte": logic,
            "fifo_pj_per_byte": fifo_pj / b, "leakage_pj_per_byte": leak, "pj_per_byte": per,
            "hops_mean": hops, "pj_per_byte_delivered": per * hops,
            "logic_fj_per_cycle": p.dynamic_fj, "internal_fj": p.internal_fj,
            "switching_fj": p.switching_fj, "clock_pins_fj": p.clock_pins_fj,
            "leakage_nw": p.leakage_nw, "sources": p.sources, "annotated": p.annotated,
            "registers": p.registers, "not_annotated": len(missing)}


def _big_stack(fn):
    """Run ``fn()`` in a thread with a large stack and recursion limit (Amaranth's Python
    simulator compiles the link's reduction chain into deeply nested expressions)."""
    import sys
    import threading
    result, error = [], []

    def run():
        try:
            result.append(fn())
        except BaseException as exc:          # re-raised in the caller
            error.append(exc)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 200000))
    size = threading.stack_size(512 * 1024 * 1024)
    try:
        t = threading.Thread(target=run)
        t.start()
        t.join()
    finally:
        threading.stack_size(size)
        sys.setrecursionlimit(old)
    if error:
        raise error[0]
    return result[0]


def link_energy(arch, lib: Liberty, *, workdir: Path) -> dict:
    """Energy per byte of the aggregation link of ``arch`` reducing real Q.24 partial sums
    (:func:`~elmoe3d.synth.activity.link_reduce_run`: REDUCE_ADD of the MiniLM L0
    up-projection split along K over the group's PEs, every source at full rate): the link's
    delay-mapped netlist (kept in ``workdir/agg_link``) under that activity, plus its
    destination FIFOs (SRAM macros) at :func:`sram_access_pj` per reduced word written and
    read, plus leakage at 1 GHz. Returns ``{"pj_per_byte_in", "pj_per_byte_out", ...}``: per
    byte the sources send, per reduced byte delivered."""
    from ..hw.die import LogicDie
    from .activity import annotate, link_reduce_run, rtlil_aliases, vcd_activity
    from .blocks import hollow
    from .flow import synthesize
    from .power import PowerLib, analyze_power
    from .sta import read_blif, stub_ports
    workdir = Path(workdir)
    folder = workdir / "agg_link"
    h = hollow(LogicDie.part("link", config=arch), owner="aggregation link")  # the die's
    il, blif, stubs = folder / "block.il", folder / "timing.blif", folder / "stubs.txt"
    if not (il.is_file() and blif.is_file() and stubs.is_file() and il.read_text() == h.rtlil
            and stubs.read_text() == h.stubs):
        folder.mkdir(parents=True, exist_ok=True)
        synthesize("aggregation link (power)", h.rtlil, liberty=lib, stubs=h.stubs,
                   keep=folder, timing=1000.0)
        stubs.write_text(h.stubs)
    vcd = workdir / "agg_link.vcd"
    run = _big_stack(lambda: link_reduce_run(LogicDie.part("link", config=arch), vcd))
    act, cycles = vcd_activity(vcd)
    vcd.unlink()
    net = read_blif(blif.read_text())
    act, missing = annotate(net, act, rtlil_aliases(il.read_text()))
    p = analyze_power(net, PowerLib(lib), act, stubs=stub_ports(stubs.read_text()))
    width = max((s.width for s in h.srams), default=0)
    fifo_pj = run["words"] * (sram_access_pj(width) + sram_access_pj(width, write=True)) \
        if width else 0.0
    logic_pj = p.dynamic_fj * cycles / 1000.0
    leak_pj = leakage_fj_per_cycle(p.leakage_nw, 1.0) * cycles / 1000.0      # at 1 GHz
    total = logic_pj + fifo_pj + leak_pj
    return {**run, "vcd_cycles": cycles, "logic_pj": logic_pj, "fifo_pj": fifo_pj,
            "leakage_pj": leak_pj, "pj_per_byte_in": total / run["bytes_in"],
            "pj_per_byte_out": total / run["bytes_out"],
            "logic_pj_per_byte_in": logic_pj / run["bytes_in"],
            "fifo_pj_per_byte_in": fifo_pj / run["bytes_in"],
            "logic_fj_per_cycle": p.dynamic_fj, "internal_fj": p.internal_fj,
            "switching_fj": p.switching_fj, "clock_pins_fj": p.clock_pins_fj,
            "leakage_nw": p.leakage_nw, "registers": p.registers, "sources": p.sources,
            "annotated": p.annotated, "not_annotated": len(missing)}

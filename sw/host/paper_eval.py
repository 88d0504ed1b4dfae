"""The paper's evaluation (Section 7, Table 3, Figs. 12, 14, 15): a whole-decoder latency and
energy model of ELMoE-3D and of the xPU baseline, its SD schemes and the best of AR and SD per
point (issue 26).

Platforms (:func:`platform`, from the ``paper-4gb`` / ``paper-8gb``
:class:`~elmoe3d.config.ArchConfig`; Section 7, "Accelerator Baselines"):

* ``xpu``: the same TOPS at INT8 as the logic die (262 / 524), LPDDR5 only (``ext_gbps``);
  4-bit weights run at the INT8 rate (no bit-sliced MACs);
* ``ours``: ``pes`` HB banks of ``hb_bank_bytes`` at ``hb_bank_gbps`` each (4 GB at 819.2
  GB/s, 8 GB at 1638.4 GB/s) beside the same LPDDR5, W4A8 at twice the W8A8 rate;
* ``hb-xpu`` (ours without bit-sliced MACs: whole INT8 experts cached) and the near-memory
  baselines ``xpu-pim``, ``xpu-logicpim``, ``xpu-nmp`` (:data:`NEAR_MEMORY`) for Fig. 14.

HB delivers :data:`HB_EFFICIENCY` of its peak, EXT :data:`EXT_EFFICIENCY` (Section 7: ~3% below
the roofline from row conflicts; EXT within 1%).

Step time (:meth:`EvalModel.step`): a step runs ``rows`` token rows of ``seqs`` sequences
through every layer; a layer is two dependent stages, attention (its weights, the router's and
the KV cache of every sequence over ``context`` tokens) and the FFN (a dense layer's, or the
shared experts plus the routed experts), then the LM head once. A stage takes the largest of
its HB time, EXT time and compute time (weights stream double-buffered beside compute); the
stages of a layer and the layers run in sequence (routing decides a layer's experts, so
nothing is fetched ahead). Where each byte lives follows Fig. 12: HB holds the static weights
first (attention, router, dense FFN, shared experts, LM head), then the KV cache, then the
scheme's draft data, and what is left holds the expert cache; what does not fit is read from
EXT.

Routed experts: a step's distinct experts per layer and how many of them hit the HB expert
cache come from :class:`ExpertPopularity`, Che's approximation of an LRU cache (Fricker et al.
2012) under a Zipf popularity law with a per-model exponent (:data:`ZIPF`, calibrated on the
Elastic-SD Phi_AR cells of Table 3's 4 GB rows by :func:`calibrate_zipf`; the routing traces
of ``../shared/traces/`` hold none of the paper's four models). A step's hits are capped at
``min(distinct, slots)``. On ``ours`` a cached expert in SD reads its MSB slice from HB and
its LSB slice from EXT at once (Algorithm 1); in AR ours caches MSB slices or whole INT8
experts, whichever is faster at the point (``ar_cache="best"``); a miss streams the whole
expert from EXT. GPT-OSS-20B's MXFP4 experts have no LSB slice.

Compute (:func:`compute_utilisation`, issue 26 item 6): a stage's compute time is its MACs at the
fraction of the die's peak TOPS that the PE cycle model (:func:`~.pe_cycles.group_cycles`,
equal to the RTL's cycles on the live tests) gives a PE group of the platform's
:class:`~elmoe3d.config.ArchConfig` on the compiler's SwiGLU FFN programs of that shape and row
count (:mod:`.compute_calib`: fill and drain included, the group's link words, the row-max
all-reduce and the psum REDUCE_ADD, at the aggregation link's 32 B a cycle, sixteen cycles a
512 B word on the paper PE, and ``ld`` at a word a cycle, i.e. the compute-bound figure; the
HB and EXT times are the stage's other bounds). Routed experts at the
step's mean rows an expert (``rows x k / distinct experts``, k the top-k, or Elastic-SD's
draft pool where it holds fewer), shared experts and dense FFNs
at the step's rows, each at its own shape (cut into the intermediate chunks a group holds).
The plain GEMMs (:func:`linear_utilisation`, :mod:`.linear_calib`, since 2026-12-05: the
routed expert's figure before, a proxy) run the streamed linear-layer program
(:mod:`elmoe3d.sw.golden.linear_stream`) on each PE, a layer's output channels split over the
die's PEs (nothing to reduce on the link): the attention projections, the router and the LM
head at the step's rows (:attr:`~.decoder.DecoderShape.attention_linears`), the scores and
weighted sums over the KV cache as each sequence's GEMMs (its query rows times the heads that
share a KV, against its own cache: :meth:`~.decoder.DecoderShape.attention_gemms`; spread
over the PEs whole, or split where there are fewer than PEs), the dense draft models as their
linear layers (:meth:`DraftModel.step_linears`; their SwiGLU as three plain GEMMs; an
EAGLE-3 head's fc on an iteration's first draft step only). Every platform,
the xPU and the near-memory ones included, has this logic die and pays the same. Bits: W4A8
(DRAFT programs) only on the bit-sliced die's 4-bit steps, W8A8 (FULL programs) otherwise,
the xPU's 4-bit draft included (the same logic die). The near-memory units keep their stated TOPS.

SD (:meth:`EvalModel.sd`): a tree of ``depth`` levels and ``width`` candidates a level, of which
the verify takes ``verify`` nodes a sequence (Section 2.2: "candidate paths are scored, and a
subset of top-scoring nodes is selected as verify tokens", EAGLE-2's dynamic tree). With the
acceptance rate alpha of one drafted token, a level verified with ``k`` of its candidates is
accepted with ``1 - (1 - alpha) ** k``; the verify's nodes are spread over the levels so as to
yield the most tokens an iteration (:func:`accepted_tokens`: ``1 + sum(prod(beta_j, j <= i))``,
the accepted prefix and the bonus token; every node verified gives ``1 + sum(beta ** i, i =
1..depth)``). The draft runs ``depth`` steps (the first on ``seqs`` rows, the others on ``seqs
x width``), the verify one step on ``seqs x (1 + verify)``
rows. :meth:`EvalModel.best_sd` searches :data:`TREE_DEPTHS` x :data:`TREE_WIDTHS` x every
verify size from ``depth`` to ``depth x width``. Schemes
(:data:`SCHEMES`): Elastic-SD (the draft is the MSB slices of the static weights and of the
cached experts, routing throttled to the cache: no EXT access but the token rows'
embeddings), EAGLE-SD (an EAGLE-3 head in
HB), SLM-SD (Qwen2.5-1.5B-Instruct in HB), Quant-SD (a separate 4-bit copy; no INT8 expert
cache: the HB after the static weights and the KV holds the hottest experts' 4-bit copies, as
many as Elastic-SD's MSB slices, which only its draft reads, then its static 4-bit copy, in EXT
at Table 3's points; GPT-OSS-20B's MXFP4 experts are their own 4-bit copy and keep an expert
cache, Elastic-SD's: the paper's four GPT-OSS-20B Quant-SD Phi_AR equal Elastic-SD's).

Speedup: Phi_AR = xPU AR step time / the scheme's AR step time at the same batch; Phi_SD =
xPU AR time a token / the scheme's SD time a token (Table 3; its "best mode" is the larger).
Energy (:meth:`StepCost.energy`, Fig. 15): computation (MACs and the logic die's SRAM at the
ASAP7 figures of :data:`~elmoe3d.synth.energy.DIE_ENERGY`), HB and EXT access
(``hb_pj_per_bit``, ``ext_pj_per_bit``: Table 1), communication (the streamline ring's EXT
bytes, the aggregation link's activations and partial sums; near-memory units' traffic over
LPDDR5) and static power x time (the logic die's leakage
and the DRAM's background power, idle periphery and refresh: ``config.DRAM_BACKGROUND``,
its dies in power-down by default);
:meth:`StepCost.energy_pj` is the HB and EXT access energy alone (Fig. 14's rows).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from ...checks import check_int, is_int, is_real
from ...config import DRAM_BACKGROUND, ConfigError, arch_config, preset as arch_preset
from ...errors import UserError
from ...synth.energy import DIE_ENERGY, sram_pj_per_byte
from .compute_calib import FEEDS, ffn_calibration
from .linear_calib import linear_calibration
from .decoder import (CONTEXT, DRAFT_MODELS, EAGLE3_HEADS, QWEN25_1P5B,
                      DraftModel, decoder_shape, eagle_head, weight_bytes)
from .models import TABLE3_MODELS


__all__ = ["Platform", "platform", "ExpertPopularity", "EvalModel", "CapacityError",
           "EXT_RUNTIME",
           "StepCost", "SDResult",
           "DraftModel", "DRAFT_MODELS", "EAGLE3_HEADS", "QWEN25_1P5B", "eagle_head",
           "linear_utilisation", "SCHEMES", "ZIPF", "TABLE3_4GB", "TABLE3_MODELS",
           "TABLE3_BATCHES", "table3", "summary", "calibrate_zipf", "calibrate_tree", "TREE",
           "FIG12_UNITS", "TABLE3_UNITS", "FIG14_UNITS", "SUMMARY_UNITS",
           "PAPER_BEST_MODE_MEAN", "HB_EFFICIENCY", "EXT_EFFICIENCY", "CONTEXT", "PLATFORMS",
           "NEAR_MEMORY", "PLATFORM_SCHEME", "fig12", "fig13", "fig13_summary", "HB_SIZES", "fig14",
           "fig14_summary", "PAPER_FIG14",
           "PAPER_FIG15", "fig15_summary", "ENERGY_PARTS", "NEAR_MEMORY_READ",
           "NEAR_MEMORY_MAC_BITS", "NEAR_MEMORY_MAC_SCALE", "DRAM_READ_PATH",
           "PRIOR_PLATFORMS", "ABLATION_PLATFORM", "PAPER_STRONGEST_PRIOR", "by_point",
           "best_prior",
           "cache_check", "che_global", "trace_popularity", "fit_zipf", "cross_validate",
           "cross_validation_fold", "routing_exponents",
           "ZIPF_MAX", "ALPHA_MODEL", "pool_coverage", "elastic_alpha", "calibrate_alpha",
           "model_alphas", "pool_slots_at", "check_pool_hb",
           "model_speed", "SPEED_TARGET", "AR_CACHES", "PLACEMENTS", "compute_utilisation",
           "TREE_DEPTHS", "TREE_WIDTHS", "INTRA_REQUEST", "calibrate_intra", "accepted_tokens",
           "tree_grid"]


def _count(name: str, v) -> float:
    """``v`` as a float: a finite real number >= 0 (rows, tokens, slots); :class:`UserError`
    naming ``name`` otherwise."""
    if not is_real(v) or not math.isfinite(v) or v < 0:
        raise UserError(f"{name}: expected a finite number >= 0, got {v!r}")
    return float(v)


def _rows(rows) -> int:
    """``rows`` of a step as an int: a positive integer; :class:`UserError` otherwise."""
    if not is_int(rows) or rows < 1:
        raise UserError(f"rows: expected a positive integer (token rows), got {rows!r}")
    return int(rows)


def _int_seq(name: str, values, low: int) -> tuple:
    """``values`` as a tuple of ints: a non-empty sequence of integers >= ``low``;
    :class:`UserError` naming ``name`` otherwise."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise UserError(f"{name}: expected a non-empty sequence of integers >= {low}, "
                        f"got {values!r}")
    values = tuple(values)
    if not values or any(not is_int(v) or v < low for v in values):
        raise UserError(f"{name}: expected a non-empty sequence of integers >= {low}, "
                        f"got {values!r}")
    return tuple(int(v) for v in values)


#: Fraction of the HB peak the paper's simulator delivered (Section 7: ~3% below the roofline).
HB_EFFICIENCY = 0.97
#: Fraction of the LPDDR5 peak (Section 7: within 1%).
EXT_EFFICIENCY = 0.99
#: What ours caches in AR mode (:class:`EvalModel`): MSB slices, whole INT8 experts, or per
#: point the faster of the two (the default since the review of issue 26's first landing).
AR_CACHES = ("best", "msb", "whole")
#: HB placement policies (:class:`EvalModel`): ``"paper"``, Fig. 12's (the static weights and
#: the KV cache first, then the scheme's draft data, then the expert cache; Quant-SD's experts'
#: 4-bit copies, or GPT-OSS-20B's MXFP4 expert cache, before its static 4-bit copy) in both modes;
#: ``"reads"``, by the reads of the mode run: in SD the scheme's draft data (a dense draft's
#: weights and KV, Quant-SD's static 4-bit copy) first, read once a draft step, ``depth``
#: times an iteration, against once for the target's static weights and KV, then the rest in
#: Fig. 12's order; in AR, which never reads the draft, Fig. 12's order. A what-if beside the
#: paper's mapping (docs/paper.md section 4, driver 7). The near-memory units' LPDDR5 keeps
#: its own order.
PLACEMENTS = ("paper", "reads")

#: SD schemes of Table 3.
SCHEMES = ("eagle", "slm", "quant", "elastic")
#: Expert-cache forms of :meth:`ExpertPopularity.step` (``form`` of :class:`EvalModel`).
CACHE_FORMS = ("token", "step")
#: Phases of :meth:`EvalModel.step`.
STEP_PHASES = ("ar", "verify", "draft")
#: Table 3's batch sizes (its models: :data:`~.models.TABLE3_MODELS`).
TABLE3_BATCHES = (1, 4, 8, 16)

#: Table 3, Hybrid-Bonded Memory = 4 GB, MT-Bench: model -> scheme -> per batch (1, 4, 8, 16)
#: ``(alpha, Phi_AR, Phi_SD)``. (The 8 GB rows are withheld from this copy of the paper.)
TABLE3_4GB = {
    "qwen3-30b-a3b": {
        "eagle": ((0.33, 2.83, 2.66), (0.33, 2.24, 1.89), (0.33, 2.06, 2.07), (0.33, 1.83, 2.28)),
        "slm": ((0.33, 2.21, 1.70), (0.33, 1.23, 1.53), (0.33, 1.17, 1.76), (0.33, 1.16, 1.96)),
        "quant": ((0.95, 1.56, 1.48), (0.95, 1.23, 1.02), (0.95, 1.17, 1.04), (0.95, 1.16, 1.15)),
        "elastic": ((0.66, 3.08, 2.64), (0.57, 2.48, 2.52), (0.48, 2.31, 2.42),
                    (0.36, 2.13, 2.05))},
    "glm-4.7-flash": {
        "eagle": ((0.25, 2.50, 1.52), (0.25, 1.83, 1.29), (0.25, 1.60, 1.67), (0.25, 1.55, 2.17)),
        "slm": ((0.14, 1.79, 0.60), (0.14, 1.27, 0.74), (0.14, 1.18, 1.00), (0.14, 1.13, 1.27)),
        "quant": ((0.83, 1.79, 0.87), (0.83, 1.27, 0.65), (0.83, 1.18, 0.80), (0.83, 1.13, 1.03)),
        "elastic": ((0.61, 2.61, 2.02), (0.55, 1.93, 2.10), (0.50, 1.71, 2.58),
                    (0.47, 1.64, 3.13))},
    "deepseek-v2-lite": {
        "eagle": ((0.42, 2.45, 2.63), (0.42, 1.87, 2.80), (0.42, 1.71, 3.65), (0.42, 1.62, 4.21)),
        "slm": ((0.38, 1.98, 1.42), (0.38, 1.48, 1.86), (0.38, 1.34, 2.45), (0.38, 1.24, 2.78)),
        "quant": ((0.84, 1.65, 0.97), (0.84, 1.22, 0.94), (0.84, 1.15, 1.26), (0.84, 1.12, 1.53)),
        "elastic": ((0.72, 2.51, 2.02), (0.72, 1.92, 3.23), (0.70, 1.82, 4.34),
                    (0.70, 1.72, 5.16))},
    "gpt-oss-20b": {
        "eagle": ((0.23, 4.14, 2.98), (0.23, 2.90, 1.98), (0.23, 2.78, 2.13), (0.23, 1.22, 2.13)),
        "slm": ((0.24, 1.81, 1.29), (0.24, 1.33, 1.54), (0.24, 1.25, 1.71), (0.24, 1.22, 1.74)),
        "quant": ((0.60, 5.54, 1.65), (0.60, 4.85, 0.74), (0.60, 4.36, 0.69), (0.60, 3.94, 0.74)),
        "elastic": ((0.44, 5.54, 3.08), (0.39, 4.85, 2.86), (0.36, 4.36, 2.78),
                    (0.33, 3.94, 2.56))},
}


# == platforms =====================================================================================

@dataclass(frozen=True)
class Platform:
    """One evaluated system (Section 7, "Accelerator Baselines"). Bandwidths in GB/s (the
    delivered fraction applied), capacities in bytes, throughput in TOPS (2 ops a MAC).

    ``bit_sliced``: MSB slices cached alone (the LSB streamed beside them) and W4A8 at twice
    the W8A8 rate (ours); without it (HB-xPU) the cache holds whole INT8 experts. A
    near-memory unit (``nm_*``: PIM, LogicPIM, NMP) computes on the ``nm_bytes`` of LPDDR5 it
    sits in at ``nm_gbps`` and ``nm_tops``; ``nm_ext_gbps`` is the xPU's own LPDDR5 bandwidth
    beside it (NMP takes 2 of the 8 channels). ``ext_bytes``: the LPDDR5's capacity (64 GiB on
    the paper's configurations), which :class:`EvalModel` checks its EXT footprint against.
    ``static_mw``: the logic die's static power (:data:`~elmoe3d.synth.energy.DIE_ENERGY`;
    every platform has the same logic die);
    ``dram_static_mw``: its DRAM's background power, mW (idle periphery and refresh in the
    configuration's state, power-down by default:
    :attr:`~elmoe3d.config.ArchConfig.dram_background_mw`: every platform's 64 GiB of LPDDR5,
    the near-memory units' inside it, and the HB of HB-xPU and ours);
    ``tile_rows``: token rows a weight word serves in one tile pass (its SRAM reads);
    ``nm_pj_per_bit``: a near-memory unit's read inside the memory it sits in, pJ/bit
    (:data:`NEAR_MEMORY_READ`; 0 on a platform without one); ``nm_mac_pj``: its pJ per MAC
    (:data:`NEAR_MEMORY_MAC_SCALE` x the logic die's W8A8 figure; 0 without one). ``arch``: the
    :class:`~elmoe3d.config.ArchConfig` whose logic die it has (its PE and group size set
    :func:`compute_utilisation`); ``link``: how its compute calibration takes the group
    programs' link words (``"die"``: at the aggregation link's rate; ``"ideal"``: a word a
    cycle; :data:`.compute_calib.FEEDS`)."""

    name: str
    tops8: float
    tops4: float
    ext_gbps: float
    hb_gbps: float
    hb_bytes: int
    ext_bytes: int
    hb_pj_per_bit: float
    ext_pj_per_bit: float
    bit_sliced: bool = False
    nm_gbps: float = 0.0
    nm_tops: float = 0.0
    nm_bytes: int = 0
    nm_ext_gbps: float = 0.0
    static_mw: float = 0.0
    dram_static_mw: float = 0.0
    tile_rows: int = 16
    nm_pj_per_bit: float = 0.0
    nm_mac_pj: float = 0.0
    arch: Any = field(default=None, compare=False, repr=False)
    link: str = "die"


#: The platforms of Section 7 (Fig. 14's order).
PLATFORMS = ("xpu", "xpu-pim", "xpu-logicpim", "xpu-nmp", "hb-xpu", "ours")

#: Section 7's near-memory baselines: internal bandwidth as a multiple of the LPDDR5 it sits in,
#: TOPS, and the LPDDR5 channels it takes (None: all of it). xPU-PIM: bank-level analog PIM, 8x
#: internal bandwidth, 1.64 TOPS; xPU-LogicPIM: 4x, 4 x 1.64 TOPS; xPU-NMP (H2LLM-like): two of
#: the 8 channels (16 GB) at 13.1 TOPS. The NMP's internal bandwidth multiple is not given:
#: 8x is an assumption, one point of H2-LLM's published design space (Li et al., ISCA 2025,
#: its DSE code: 6.4 GB/s a bank, 16 banks a channel, 102.4 GB/s against an LPDDR5-6400 x16
#: channel's 12.8; the space also holds 12.8-51.2 GB/s a bank, 16-64x).
NEAR_MEMORY = {"xpu-pim": (8, 1.64, None), "xpu-logicpim": (4, 4 * 1.64, None),
               "xpu-nmp": (8, 13.1, 2)}

#: Read energy of an HBM-class DRAM by where the data leaves it, pJ/bit (FGDRAM: O'Connor et
#: al., MICRO 2017, as AttAcc's simulator tabulates it, Park et al., ASPLOS 2024,
#: ``scale-snu/attacc_simulator`` ``src/config.py``): the cell's ACT/PRE and its read, the
#: column decoder to the bank-group mux, that mux to the global I/O, the TSVs to the logic
#: die, the interposer I/O to the processor.
DRAM_READ_PATH = (("cell ACT/PRE", 0.11), ("cell read", 0.44),
                  ("column decoder to bank-group mux", 1.01),
                  ("bank-group mux to global I/O", 1.23), ("TSV", 0.5), ("interposer I/O", 0.3))


def _read_path_pj(stop: str) -> float:
    """pJ/bit of a read of :data:`DRAM_READ_PATH` that ends after the hop ``stop``."""
    hops = [name for name, _ in DRAM_READ_PATH]
    return sum(e for _, e in DRAM_READ_PATH[:hops.index(stop) + 1])


#: A near-memory unit's read inside the memory it sits in, pJ/bit (Fig. 15;
#: :attr:`Platform.nm_pj_per_bit`): ``("ext", k)``, ``k`` x the configuration's LPDDR5 read
#: (``ext_pj_per_bit``), or ``("pj", e)``, ``e`` pJ/bit. Section 7 gives none; each is a
#: published figure for the kind of unit it cites:
#:
#: * xPU-PIM, bank-level PIM inside LPDDR5 (Kim et al., 2023, also the source of Table 1's
#:   3.88 pJ/bit): Samsung's LPDDR-PIM (Hot Chips 2023) is reported at 102.4 GB/s with "72%
#:   less power consumption compared to conventional DRAMs", read here as a read energy 0.28
#:   x the LPDDR5's, 1.09 pJ/bit. A device power figure: if it includes the PIM's MAC units,
#:   their MACs (:data:`NEAR_MEMORY_MAC_BITS`) are counted twice, overstating PIM's energy
#:   (FGDRAM's bank-level read, the cell alone, is 0.55 pJ/bit);
#: * xPU-LogicPIM, a digital unit on the memory's logic die (AttAcc, Park et al., 2024a, and
#:   Duplex's Logic-PIM, Yun et al., 2024, whose simulator the paper's is built on): AttAcc's
#:   own figure for a PIM on the buffer (logic) die, all of FGDRAM's path but the interposer,
#:   3.29 pJ/bit. An HBM's figure: LPDDR5 has no logic die, and its off-package I/O is likely a
#:   larger share of its 3.88 than HBM's interposer is of its 3.59, so a logic unit beside
#:   LPDDR5 may read for less, which would favour LogicPIM over ours;
#: * xPU-NMP, H2-LLM (Li et al., ISCA 2025), whose NMP logic is hybrid-bonded to its DRAM:
#:   Table 1's hybrid-bonded read, 0.43 pJ/bit (scaled by the paper from Niu et al., 2022, the
#:   same hybrid-bonded DRAM), fixed (not the configuration's ``hb_pj_per_bit``, which a sweep
#:   may vary for ours).
#:
#: The units' MACs cost :data:`NEAR_MEMORY_MAC_SCALE` x the logic die's W8A8 pJ per MAC
#: (:data:`NEAR_MEMORY_MAC_BITS`).
NEAR_MEMORY_READ = {"xpu-pim": ("ext", 1 - 0.72),
                    "xpu-logicpim": ("pj", _read_path_pj("TSV")),
                    "xpu-nmp": ("pj", 0.43)}
#: The weight bits whose logic-die pJ per MAC a near-memory unit's MAC costs.
NEAR_MEMORY_MAC_BITS = 8
#: A near-memory unit's pJ per MAC as a multiple of the logic die's W8A8 figure
#: (:attr:`Platform.nm_mac_pj`; ``platform(nm_mac_scale=)``, ``elmoe3d paper fig15
#: --nm-mac-scale``). Section 7 gives no figure for any unit. 1 follows AttAcc's simulator
#: (Park et al., 2024a, which the paper cites for LogicPIM; ``scale-snu/attacc_simulator``
#: ``src/config.py``), which prices the ALU of a PIM in the bank, in the bank group and on the
#: buffer die at the GPU's own ALU figure (``ENERGY_TABLE[...]['alu'] = 0.32`` for all four).
#: A unit built in a DRAM process (PIM's, in the bank) is likely costlier per MAC; the
#: sensitivity is in docs/paper.md section 7 (0-8x).
NEAR_MEMORY_MAC_SCALE = 1.0


#: The HB sizes of the paper's configurations (presets ``paper-<hb>``; Table 3's 4 GB and 8 GB).
HB_SIZES = ("4gb", "8gb")


def platform(name: str, hb: str = "4gb", *, arch=None, link: str = "die",
             dram_background: str | None = None,
             nm_mac_scale: float = NEAR_MEMORY_MAC_SCALE) -> Platform:
    """One of :data:`PLATFORMS` with the ``paper-<hb>`` configuration's figures (module
    docstring, :data:`NEAR_MEMORY`), or with those of ``arch`` (an
    :class:`~elmoe3d.config.ArchConfig`: its PE count, tile, clock, HB banks and LPDDR5; ``hb``
    is then ignored; or a preset's name, e.g. ``"paper-8gb"``), as a design-space sweep asks;
    ``link`` as :attr:`Platform.link`; ``dram_background``, one of
    :data:`~elmoe3d.config.DRAM_BACKGROUND`'s states, sets the HB's and the EXT's background
    power a GiB (None: the configuration's); ``nm_mac_scale``, a near-memory unit's pJ per MAC
    as a multiple of the logic die's W8A8 figure (:data:`NEAR_MEMORY_MAC_SCALE`; a finite
    number >= 0). Raises :class:`UserError` on an unknown name, HB size, link, background
    state, ``nm_mac_scale`` or ``arch``."""
    if not isinstance(name, str):
        raise UserError(f"platform name: expected one of {', '.join(PLATFORMS)}, got {name!r}")
    if not isinstance(link, str) or link not in FEEDS:
        raise UserError(f"link: expected {' or '.join(FEEDS)}, got {link!r}")
    if not is_real(nm_mac_scale) or not 0 <= nm_mac_scale < math.inf:
        raise UserError(f"nm_mac_scale: expected a finite number >= 0 (times the logic die's "
                        f"W8A8 pJ per MAC), got {nm_mac_scale!r}")
    if arch is None:
        if not isinstance(hb, str) or hb not in HB_SIZES:
            raise UserError(f"hb: expected {' or '.join(HB_SIZES)}, got {hb!r}")
        arch = arch_preset(f"paper-{hb}")
    else:
        try:
            arch = arch_config(arch)
        except ConfigError as exc:
            raise UserError(str(exc)) from None
    if dram_background is not None:
        if not isinstance(dram_background, str) or dram_background not in DRAM_BACKGROUND:
            raise UserError(f"dram_background: expected one of {', '.join(DRAM_BACKGROUND)}, "
                            f"got {dram_background!r}")
        mw = DRAM_BACKGROUND[dram_background]
        arch = replace(arch, hb_background_mw_per_gb=mw, ext_background_mw_per_gb=mw)
    a = arch
    ext = a.ext_gbps * EXT_EFFICIENCY
    background = a.dram_background_mw
    base = Platform(name, a.peak_tops(8), a.peak_tops(8), ext, 0.0, 0, a.ext_bytes,
                    a.hb_pj_per_bit, a.ext_pj_per_bit, static_mw=DIE_ENERGY.static_of(a),
                    dram_static_mw=background["ext"], tile_rows=a.tile.rows, arch=a, link=link)
    if name == "xpu":
        return base
    if name in ("ours", "hb-xpu"):
        hb_gbps = a.pes * a.hb_bank_gbps * HB_EFFICIENCY
        ours = name == "ours"
        return replace(base, tops4=a.peak_tops(4) if ours else base.tops8, hb_gbps=hb_gbps,
                       hb_bytes=a.hb_bytes, bit_sliced=ours,
                       dram_static_mw=background["ext"] + background["hb"])
    if name in NEAR_MEMORY:
        mult, tops, channels = NEAR_MEMORY[name]
        ch = channels or a.ext_channels
        nm_bytes = a.ext_bytes * ch // a.ext_channels
        kind, figure = NEAR_MEMORY_READ[name]
        read = figure * a.ext_pj_per_bit if kind == "ext" else figure
        return replace(base, nm_gbps=mult * ext * ch / a.ext_channels, nm_tops=tops,
                       nm_bytes=nm_bytes, nm_pj_per_bit=read,
                       nm_mac_pj=nm_mac_scale * DIE_ENERGY.mac(NEAR_MEMORY_MAC_BITS),
                       nm_ext_gbps=ext * (a.ext_channels - (channels or 0)) / a.ext_channels)
    raise UserError(f"unknown platform {name!r}; known: {', '.join(PLATFORMS)}")


# == the expert cache ==============================================================================

#: The largest Zipf exponent :class:`ExpertPopularity` takes: far steeper than any fitted (at
#: most 2.8, the step form's), and below the exponents whose probabilities underflow to zero.
ZIPF_MAX = 10.0

#: Zipf exponent of each model's expert popularity: fitted by :func:`calibrate_zipf` (token
#: form, hits capped at the slots; AR cache "best") on the Elastic-SD Phi_AR cells of Table
#: 3's 4 GB rows, the only figures used (so those cells are a fit residual, not a check).
ZIPF = {"qwen3-30b-a3b": 1.55, "glm-4.7-flash": 1.1, "deepseek-v2-lite": 0.7,
        "gpt-oss-20b": 1.65}

#: The SD tree (depth, width, verify) of every scheme and point: ``depth`` draft steps of
#: ``width`` candidates a level, ``verify`` of the nodes verified a sequence (the top-scoring
#: subset, Section 2.2). Fitted by :func:`calibrate_tree` on the Phi_SD cells of Table 3's 4 GB
#: rows (the paper names EAGLE-2's dynamic tree, Li et al. 2024b, but not its size; EAGLE-3's
#: published default is depth 7, top-k 10, 60 tokens). ``"best"`` in :func:`table3` searches
#: per point instead. History: (7, 6) -> (8, 6) with the cycle-model compute calibration (issue
#: 26 item 6), -> (6, 8) jointly with :data:`INTRA_REQUEST`, every node verified (the least
#: mean error); since 2026-12-05 the verify size fitted too, and the most cells within 15%
#: first ((7, 8, 39); the least mean error alone gave (7, 12, 37): 42 of the 64 cells within 15%
#: against 43, Elastic-SD's 6 of 16 against 11); -> (7, 12, 36) when the plain GEMMs got their
#: own program's cycles instead of the routed expert's (2026-12-05, ``linear_calib``): 46 of the
#: 64 within 15% (the old tree 43), :data:`INTRA_REQUEST` refitted unchanged; -> (7, 8, 34)
#: when :data:`INTRA_REQUEST` became the real traces' measured 0.88 instead of a fit (third
#: session of 2026-12-05): 44 of the 64 within 15%, Elastic-SD's 15 of 16.
TREE = (7, 8, 34)
#: The deepest and widest SD tree the model takes (``elmoe3d paper --tree``, a sweep's
#: ``depth`` and ``width``): far beyond a useful tree (EAGLE-3's default is 7 deep, 10 wide),
#: a bound against a typo's millions of rows.
MAX_TREE = 64
#: Intra-request routing correlation: the tokens one request brings to a step (an SD tree's
#: draft and verify rows) share context and route alike (Section 7, "Inference Framework": the
#: paper's LRU approximation captures "inter/intra-request routing correlation"; Section 7.3,
#: Fig. 16(b): "for the same token count, intra-request (SD) execution activates far fewer unique
#: experts than inter-request (AR)"). A step of ``rows`` rows over ``batch`` requests touches
#: the experts of ``batch x (rows / batch) ** INTRA_REQUEST`` independent tokens
#: (:meth:`EvalModel.routed_tokens`; 1: independent, the first landing; an AR step, one token a
#: request, is unchanged). The paper gives no figure: **measured** on the real Mixtral-8x7B
#: routing traces (:func:`routing_exponents` on ``gsm8k_2_routing.jsonl`` and
#: ``humaneval_2_routing.jsonl``: 2-16 consecutive decode tokens of one request touch the
#: distinct experts of ``n ** 0.880`` independent ones of the pooled popularity, 0.869-0.882
#: per window; one token of each of 2-4 requests those of ``n ** 0.998``, so requests route
#: independently, as the model assumes), rounded to 2 places. The pooled baseline, the two
#: tasks' mixture, stands for MT-Bench's mixture of eight categories; against each trace's own
#: popularity (a workload of one task) it is 0.906 (GSM8K alone 0.933, HumanEval 0.887), where
#: the refitted tree gives 98 / 0.124 at 0.90 and 96 / 0.124 at 0.91 (docs/paper.md section
#: 4). Until the third session of 2026-12-05 it was fitted on Table 3's Phi_SD cells
#: (:func:`calibrate_intra`, 0.8; at today's :data:`TREE` the fit gives 0.85).
INTRA_REQUEST = 0.88
#: The tree sizes :func:`calibrate_tree` and :meth:`EvalModel.best_sd` search.
TREE_DEPTHS = tuple(range(1, 9))
TREE_WIDTHS = (1, 2, 3, 4, 6, 8, 10, 12, 16)


@functools.lru_cache(maxsize=4096)
def _tokens_by_verify(alpha: float, depth: int, width: int) -> tuple:
    """:func:`accepted_tokens` for every verify size 0 .. ``depth x width`` (a tuple)."""
    budget = depth * width
    beta = 1 - (1 - alpha) ** np.arange(1, width + 1)
    f = np.zeros(budget + 1)                  # tokens past level i, by the nodes left for them
    for _ in range(depth):
        g = np.zeros(budget + 1)
        for k in range(1, width + 1):          # k candidates verified at this level
            g[k:] = np.maximum(g[k:], beta[k - 1] * (1 + f[:budget + 1 - k]))
        f = g
    return tuple(1 + f)


def accepted_tokens(alpha: float, depth: int, width: int, verify: int | None = None) -> float:
    """Tokens an SD iteration yields a sequence (the accepted prefix and the bonus token) when
    ``verify`` nodes (default every one, ``depth x width``) of a ``depth`` x ``width`` tree are
    verified, spread over the levels to yield the most: level ``i`` verified with ``k_i``
    candidates is accepted with ``beta_i = 1 - (1 - alpha) ** k_i`` (independent candidates),
    and the iteration yields ``1 + sum(prod(beta_j, j <= i))`` (the optimum over ``k_i <=
    width``, ``sum(k_i) <= verify``; a level with no node ends the path). What the paper's
    "subset of top-scoring nodes selected as verify tokens" (Section 2.2; EAGLE-2's tree picks
    the nodes of highest path probability) yields under this acceptance. Raises
    :class:`UserError` for an alpha outside [0, 1), a depth or width below 1, or a verify size
    outside 1 .. ``depth x width``."""
    if not is_real(alpha) or not 0 <= alpha < 1:
        raise UserError(f"alpha: expected a rate in [0, 1), got {alpha!r}")
    for name, v in (("depth", depth), ("width", width)):
        if not is_int(v) or v < 1:
            raise UserError(f"SD tree {name}: expected a positive integer, got {v!r}")
    budget = int(depth) * int(width)
    if verify is None:
        verify = budget
    if not is_int(verify) or not 1 <= verify <= budget:
        raise UserError(f"SD tree verify: expected 1 .. depth x width = {budget} nodes, "
                        f"got {verify!r}")
    return float(_tokens_by_verify(float(alpha), int(depth), int(width))[int(verify)])


def pick_probabilities(weights, top_k: int) -> np.ndarray:
    """Per-token pick probabilities of experts of relative popularity ``weights`` (float
    array, shape (E,), E >= ``top_k``) when a token picks ``top_k`` distinct ones: ``weights``
    scaled to sum ``top_k``, each capped at 1 with the excess spread over the uncapped in
    proportion (repeated until none exceeds 1), so the result still sums to ``top_k``. Raises
    ``ValueError`` for fewer than ``top_k`` weights, a negative one or a zero sum."""
    w = np.asarray(weights, float)
    if w.ndim != 1 or w.size < top_k or not (np.all(w >= 0) and w.sum() > 0):
        raise ValueError(f"weights: expected at least top_k = {top_k} popularities >= 0 with "
                         f"a positive sum, got shape {w.shape}, sum {w.sum():g}")
    p = top_k * w / w.sum()
    capped = np.zeros(p.shape, bool)
    for _ in range(p.size):
        capped |= p > 1
        if not (p > 1).any():
            break
        p[capped] = 1.0
        p[~capped] *= (top_k - capped.sum()) / p[~capped].sum()
    return p


class ExpertPopularity:
    """Per-token pick probabilities of a layer's ``experts`` under a Zipf law of exponent
    ``s`` (``p_i`` proportional to ``(i + 1) ** -s``, scaled to sum ``top_k`` and capped at 1:
    a token picks ``top_k`` distinct experts), and an LRU cache of ``slots`` experts under
    Che's approximation: the characteristic time ``t`` (in tokens) solves ``sum(1 - exp(-p_i
    t)) = slots``, expert ``i`` is cached with ``h_i = 1 - exp(-p_i t)``.

    :meth:`step` gives, for ``n`` token rows, the expected distinct experts ``sum(1 - (1 -
    p_i) ** n)`` and their hits (two forms, see there). Section 7, "Inference Framework" (the
    paper's LRU approximation of the expert cache).

    Units: ``n`` in token rows (fractional: an expected count), ``slots`` in experts a layer
    (fractional: an HB share); both finite and >= 0. Raises :class:`UserError` naming the
    parameter for ``experts`` or ``top_k`` not an integer with ``1 <= top_k <= experts``, an
    ``s`` outside [0, :data:`ZIPF_MAX`], and (every method) a negative or non-finite ``n`` or
    ``slots``."""

    def __init__(self, experts: int, top_k: int, s: float):
        if not is_int(experts) or experts < 1:
            raise UserError(f"experts: expected a positive integer, got {experts!r}")
        if not is_real(s) or not 0 <= s <= ZIPF_MAX:
            raise UserError(f"zipf exponent: expected a number in [0, {ZIPF_MAX}], got {s!r}")
        if not is_int(top_k) or not 1 <= top_k <= experts:
            raise UserError(f"top_k: expected 1..experts = {experts}, got {top_k!r}")
        experts, top_k = int(experts), int(top_k)
        self.experts, self.top_k, self.s = experts, top_k, s
        self.p = pick_probabilities((np.arange(experts) + 1.0) ** -s, top_k)
        self._che = {}

    def che(self, slots: float, rates=None) -> np.ndarray:
        """``h_i`` for an LRU of ``slots`` experts whose items are requested at ``rates``
        (default the per-token picks ``p``; all cached when ``slots >= experts``; Che's
        approximation, Section 7's LRU model; an LRU at least as large as the experts
        requested at all holds each of them). ``rates``: ``experts`` finite numbers >= 0
        (requests a unit of time). Raises :class:`UserError` for ``slots`` negative or not
        finite, or ``rates`` of another length or with a negative or non-finite value."""
        slots = min(_count("slots", slots), float(self.experts))
        if rates is not None:
            given = rates
            try:
                rates = np.asarray(rates, dtype=np.float64)
            except (TypeError, ValueError):
                raise UserError(f"rates: expected {self.experts} finite numbers >= 0 (one an "
                                f"expert), got {given!r:.60}") from None
            if rates.shape != (self.experts,) or not np.all(np.isfinite(rates)) \
                    or np.any(rates < 0):
                raise UserError(f"rates: expected {self.experts} finite numbers >= 0 (one an "
                                f"expert), got an array of shape {rates.shape}"
                                + ("" if rates.shape != (self.experts,) else
                                   " with a negative or non-finite value"))
        key = (round(slots, 6), None if rates is None else rates.tobytes())
        if key not in self._che:
            r = self.p if rates is None else rates
            if slots >= self.experts:
                h = np.ones(self.experts)
            elif slots <= 0 or not r.any():         # nothing cached, or nothing requested
                h = np.zeros(self.experts)
            elif slots >= np.count_nonzero(r):      # every requested expert fits
                h = (r > 0).astype(np.float64)
            else:
                lo, hi = 0.0, 1.0
                while np.sum(1 - np.exp(-r * hi)) < slots:
                    hi *= 2
                for _ in range(60):
                    mid = (lo + hi) / 2
                    if np.sum(1 - np.exp(-r * mid)) < slots:
                        lo = mid
                    else:
                        hi = mid
                h = 1 - np.exp(-r * hi)
            self._che[key] = h
        return self._che[key]

    def step(self, n: int, slots: float, form: str = "token") -> tuple:
        """``(distinct experts, hits)`` of a step of ``n`` token rows at one layer; expert
        ``i`` is in the step with ``a_i = 1 - (1 - p_i) ** n``.

        ``form="step"``: the LRU sees a step's distinct experts (one access each), so Che's
        approximation runs on the rates ``a_i`` (characteristic time in steps) and the hits
        are ``sum(a_i h_i)``: never more than the slots. ``form="token"``: the distinct experts
        times the per-token hit rate ``sum(p_i h_i) / top_k`` of an LRU that sees every
        token's picks (``h_i`` from the rates ``p_i``): what a per-access LRU hit rate
        applied to a step's expert loads gives, capped at ``min(distinct, slots)``: an LRU
        cannot hit on more distinct experts in a step than it holds (review of issue 26: the
        uncapped form counted up to 61.7 hits a layer on 10.8 slots).

        ``n`` in token rows, ``slots`` in experts (both may be fractional); Section 7,
        "Inference Framework". Raises
        :class:`UserError` for ``n`` or ``slots`` negative or not finite, or another
        ``form``."""
        n = _count("n (token rows)", n)
        _count("slots", slots)
        a = 1 - (1 - self.p) ** n
        if form == "token":
            h = self.che(slots)
            uniq = float(a.sum())
            hits = uniq * float((self.p * h).sum()) / self.top_k
            return uniq, min(hits, uniq, max(float(slots), 0.0))
        if form != "step":
            raise UserError(f"cache form: expected step or token, got {form!r}")
        return float(a.sum()), float((a * self.che(slots, a)).sum())

    def top_share(self, n: int, slots: float) -> float:
        """Share of a step's distinct experts (``n`` rows) among the ``slots`` hottest (a
        static placement, the near-memory units' of Section 7; fractional slots interpolate).
        Raises :class:`UserError` for ``n``
        or ``slots`` negative or not finite."""
        a = 1 - (1 - self.p) ** _count("n (token rows)", n)
        c = np.concatenate(([0.0], np.cumsum(a)))
        k = min(_count("slots", slots), float(self.experts))
        i = int(k)
        part = c[i] + (a[i] * (k - i) if i < self.experts else 0.0)
        return float(part / c[-1]) if c[-1] > 0 else 0.0       # no rows: no experts

    def pool_size(self, slots: float) -> int:
        """Experts in Elastic-SD's draft pool at ``slots`` cached a layer: the whole experts
        the cache holds (``floor(slots)``, at most the layer's), fewer than top-k on a small
        HB, as the functional model's :func:`~.elastic_sd.throttle` keeps "fewer if the pool
        holds fewer" (Algorithm 1's pool). Raises :class:`UserError` for ``slots`` negative or
        not finite."""
        return int(min(math.floor(_count("slots", slots)), self.experts))

    def pool_step(self, n: int, slots: float) -> float:
        """Distinct experts of ``n`` rows routed only within the :meth:`pool_size` hottest
        experts (Elastic-SD's throttled draft: top-k kept inside the pool, the pool's
        probabilities renormalised by :func:`pick_probabilities`, so one token takes exactly
        top-k of them; a token takes every pool expert when the pool holds k or fewer;
        Algorithm 1). Raises
        :class:`UserError` for ``n`` or ``slots`` negative or not finite."""
        n = _count("n (token rows)", n)
        c = self.pool_size(slots)
        if c <= self.top_k:                 # every token takes every pool expert
            return float(c) if n >= 1 else 0.0
        q = pick_probabilities(self.p[:c], self.top_k)
        return float((1 - (1 - q) ** n).sum())


# == compute ======================================================================================

def compute_utilisation(plat: Platform, hidden: int, intermediate: int, rows: float,
                        bits: int) -> float:
    """Fraction of ``plat``'s peak TOPS at ``bits`` (4: W4A8, the bit-sliced die's 4-bit
    steps; 8: W8A8, everything else) a SwiGLU FFN of ``hidden`` x ``intermediate`` reaches on
    ``rows`` token rows (fractional: a routed expert's mean): useful MACs a cycle of a PE over
    its peak, from the PE cycle model on the compiler's programs for a group of
    ``plat.arch`` (:meth:`.compute_calib.FFNCalibration.utilisation`: fill and drain
    included, link words at :attr:`Platform.link`'s rate, ``ld`` at a word a cycle). Raises
    :class:`UserError` for a platform without an :class:`~elmoe3d.config.ArchConfig`
    (``plat.arch``), ``hidden`` or ``intermediate`` not a positive integer, ``rows`` not a
    finite number > 0 (below 1: costed as one row, the fewest a PE computes) and ``bits`` not
    4 or 8, each before any calibration is computed."""
    arch = _die(plat)
    hidden, intermediate = (check_int(name, v, lo=1, error=UserError)
                            for name, v in (("hidden", hidden), ("intermediate", intermediate)))
    if not is_real(rows) or not 0 < rows < math.inf:
        raise UserError(f"rows: expected a finite number > 0 (token rows an expert), got "
                        f"{rows!r}")
    if bits not in (4, 8) or isinstance(bits, bool):
        raise UserError(f"bits: expected 4 (W4A8) or 8 (W8A8), got {bits!r}")
    return ffn_calibration(arch, hidden, intermediate, bits, plat.link).utilisation(rows)


def _die(plat: Platform):
    """``plat``'s :class:`~elmoe3d.config.ArchConfig`; :class:`UserError` when it has none."""
    if not isinstance(plat, Platform):
        hint = (f" (platform({plat!r}, hb) builds one)" if isinstance(plat, str) else "")
        raise UserError(f"plat: expected a Platform{hint}, got {plat!r}")
    if plat.arch is None:
        raise UserError(f"platform {plat.name!r} has no ArchConfig (arch=): the compute "
                        f"calibration needs its PE")
    return plat.arch


def linear_utilisation(plat: Platform, in_features: int, out_features: float, rows: float,
                       bits: int) -> float:
    """Fraction of ``plat``'s peak TOPS at ``bits`` a plain GEMM of ``in_features`` (K) and
    ``out_features`` output channels on one PE (``N_p``: a layer's share of the die's PEs)
    reaches on ``rows`` token rows: useful MACs (``K N_p rows``) a cycle of the PE over its
    peak, from the PE cycle model on the streamed linear-layer program
    (:meth:`.linear_calib.LinearCalibration.utilisation`; K padded to whole groups of 32,
    the padding waste). Raises :class:`UserError` for a platform without an ArchConfig or a K
    its PE cannot stage, ValueError naming ``in_features``, ``out_features`` or ``rows`` when
    one is not positive."""
    arch = _die(plat)
    if not is_int(in_features) or in_features < 1:
        raise ValueError(f"in_features: expected a positive integer, got {in_features!r}")
    k = -(-int(in_features) // 32) * 32
    return linear_calibration(arch, k, bits).utilisation(out_features, rows) \
        * in_features / k


# == the model =====================================================================================

#: Fig. 15's energy components, in its order.
ENERGY_PARTS = ("computation", "external memory", "HB memory", "communication", "static")

@dataclass
class StepCost:
    """One step: seconds and bytes (HB, EXT), by stage kind, and the work its energy counts
    (:meth:`energy`): MACs on the logic die by weight bits (``macs``: 4 for W4A8 on the
    bit-sliced tile, 8 otherwise) and on a near-memory unit (``nm_macs``), the EXT bytes a
    near-memory unit reads inside its LPDDR5 (``nm_bytes``, part of ``ext_bytes``), the logic
    die's SRAM bytes written and read, the EXT bytes the streamline ring delivers to the PEs
    (``ring_bytes``), activation bytes scattered and partial sums reduced on the aggregation
    link (``link_bytes``), and activation bytes to and from near-memory units over LPDDR5
    (``nm_io_bytes``). ``hb_fill_bytes``: the expert cache's fills, the bytes its misses write
    into HB (part of ``hb_bytes``, which counts reads and writes alike); ``hb_write_bytes`` and
    ``ext_write_bytes``: every byte written into HB (the fills and the KV cache's new rows)
    and into EXT (its new rows there), parts of ``hb_bytes`` and ``ext_bytes``."""

    seconds: float = 0.0
    hb_bytes: float = 0.0
    ext_bytes: float = 0.0
    parts: dict = field(default_factory=dict)       # stage -> seconds
    macs: dict = field(default_factory=dict)        # weight bits -> MACs on the logic die
    nm_macs: float = 0.0
    nm_bytes: float = 0.0
    sram_write_bytes: float = 0.0
    sram_read_bytes: float = 0.0
    ring_bytes: float = 0.0
    link_bytes: float = 0.0
    nm_io_bytes: float = 0.0
    hb_fill_bytes: float = 0.0
    hb_write_bytes: float = 0.0
    ext_write_bytes: float = 0.0


    def add(self, kind, seconds, hb, ext):
        self.seconds += seconds
        self.hb_bytes += hb
        self.ext_bytes += ext
        self.parts[kind] = self.parts.get(kind, 0.0) + seconds

    def merge(self, other: "StepCost", count: float = 1.0):
        """Add ``count`` times ``other`` (a layer's cost repeated over the layers)."""
        self.seconds += other.seconds * count
        self.hb_bytes += other.hb_bytes * count
        self.ext_bytes += other.ext_bytes * count
        for k, v in other.parts.items():
            self.parts[k] = self.parts.get(k, 0.0) + v * count
        for k, v in other.macs.items():
            self.macs[k] = self.macs.get(k, 0.0) + v * count
        for f in fields(self):
            if f.name not in ("seconds", "hb_bytes", "ext_bytes", "parts", "macs"):
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name) * count)

    def energy_pj(self, plat: Platform) -> float:
        """HB and EXT access energy (pJ): bits x ``hb_pj_per_bit`` / ``ext_pj_per_bit``, every
        EXT byte at the LPDDR5 figure (Fig. 14's "access energy"; :meth:`energy` has all of
        it)."""
        return 8 * (self.hb_bytes * plat.hb_pj_per_bit + self.ext_bytes * plat.ext_pj_per_bit)

    def energy(self, plat: Platform) -> dict:
        """Energy of the step by Fig. 15's components (:data:`ENERGY_PARTS`), pJ:

        * computation: MACs at :data:`~elmoe3d.synth.energy.DIE_ENERGY` ``mac_pj`` (W4A8 on
          the bit-sliced tile, W8A8 otherwise), near-memory MACs at :attr:`Platform.nm_mac_pj`,
          the logic die's SRAM writes and reads (ASAP7 SRAM banks, ``synth.energy``);
        * external memory: EXT bytes at ``ext_pj_per_bit``, those a near-memory unit reads in
          place at :attr:`Platform.nm_pj_per_bit` (:data:`NEAR_MEMORY_READ`);
        * HB memory: HB bytes at ``hb_pj_per_bit``;
        * communication: ring and link bytes at ``DIE_ENERGY``'s figures, activations to and
          from near-memory units at ``ext_pj_per_bit``;
        * static: the logic die's static power and the DRAM's background power (idle
          periphery and refresh, :attr:`Platform.dram_static_mw`) x the step's seconds."""
        e = DIE_ENERGY
        compute = (sum(n * e.mac(b) for b, n in self.macs.items())
                   + self.nm_macs * plat.nm_mac_pj
                   + self.sram_write_bytes * sram_pj_per_byte(write=True)
                   + self.sram_read_bytes * sram_pj_per_byte())
        return {"computation": compute,
                "external memory": 8 * ((self.ext_bytes - self.nm_bytes) * plat.ext_pj_per_bit
                                        + self.nm_bytes * plat.nm_pj_per_bit),
                "HB memory": 8 * self.hb_bytes * plat.hb_pj_per_bit,
                "communication": (self.ring_bytes * e.ring_pj_per_byte
                                  + self.link_bytes * e.link_pj_per_byte
                                  + 8 * self.nm_io_bytes * plat.ext_pj_per_bit),
                "static": (plat.static_mw + plat.dram_static_mw) * 1e-3 * self.seconds * 1e12}


@dataclass
class SDResult:
    """The SD configuration of a point: tree ``depth`` x ``width`` with ``verify`` nodes
    verified a sequence, tokens an iteration a sequence, draft and verify seconds of an
    iteration, seconds and access energy (pJ) a token (all sequences), the energy a token by
    :data:`ENERGY_PARTS`."""

    depth: int
    width: int
    tokens: float
    draft_s: float
    verify_s: float
    per_token_s: float
    energy_pj_per_token: float
    energy_per_token: dict = field(default_factory=dict)   # ENERGY_PARTS -> pJ a token
    verify: int = 0                 # nodes verified a sequence
    verify_form: str = "msb"        # the verify's expert cache: "msb", "whole" or "none"


#: :meth:`EvalModel.ext_footprint`'s part that the batch and the context move.
EXT_RUNTIME = "KV beyond HB"


class CapacityError(UserError):
    """A point whose EXT footprint (:meth:`EvalModel.ext_footprint`) exceeds its platform's
    LPDDR5 (:attr:`Platform.ext_bytes`): the model, scheme, batch and context do not fit. The
    message names them, the GiB needed by part and the capacity."""


class EvalModel:
    """The whole-decoder model of ``model`` (a preset with a :class:`~.decoder.DecoderShape`)
    on ``plat`` running ``scheme`` (``"ar"`` for plain AR, or one of :data:`SCHEMES`) at
    ``batch`` sequences of ``context`` tokens. ``zipf`` overrides :data:`ZIPF`.

    ``ar_cache``: ``"best"`` (default: per point the faster of the two below, :meth:`ar`),
    ``"msb"`` (AR hits read the MSB slice from HB and stream the LSB
    slice from EXT, as verify does, Algorithm 1) or ``"whole"`` (AR mode caches whole INT8
    experts, half as many: what the paper's 8 GB Phi_AR quoted in issue 26, up to 4.77 on a
    non-GPT-OSS model, needs, since streaming the LSB caps it at 3.35-3.99).

    HB placement (Fig. 12; ``placement``, one of :data:`PLACEMENTS`) is fixed at
    construction: :attr:`hb_static` (fraction of the static weights in HB), :attr:`hb_kv` (of
    the KV cache), :attr:`draft_in_hb` (of :attr:`draft_bytes`, the scheme's draft data in
    bytes: a draft model's weights and KV, or Quant-SD's 4-bit copy of the static weights),
    :attr:`slots` (expert cache slots a MoE layer, MSB slices on the bit-sliced die;
    :attr:`whole_slots`: whole INT8 experts in the same HB). :attr:`verify_forms` records the
    cache form each verify step ran with (:meth:`_verify_step`), :attr:`ar_form` the AR
    step's (:meth:`ar`). :meth:`sd` keeps each draft and verify step it costs: change none
    of these (nor ``draft_slots``, ``form``, ``intra``) after the first :meth:`sd`.

    ``pool_slots``: Elastic-SD's draft pool (Algorithm 1: the experts whose MSB slices HB
    holds, :attr:`pool_slots`) as expert-cache slots a MoE layer, at most :attr:`slots`; None
    (default): the whole cache, :attr:`slots`. A smaller pool is another HB's
    (:func:`pool_slots_at`): that HB configuration's pool beside that HB's alpha, used at a
    larger HB (docs/paper.md section 3, "The draft pool at a fixed alpha").

    ``plat`` is a :class:`Platform` (:func:`platform`; a name alone does not say its HB size);
    ``batch`` and ``context`` (tokens) positive integers; ``zipf`` a number in [0,
    :data:`ZIPF_MAX`]; ``intra`` in (0, 1]; ``form`` one of :data:`CACHE_FORMS`. Raises
    :class:`UserError` naming the parameter on any other value, an unknown model (or one
    without a calibrated popularity and no ``zipf``) or scheme, Elastic-SD on a platform
    without the bit-sliced die, ``pool_slots`` for another scheme, negative or above
    :attr:`slots`; :class:`CapacityError` (a :class:`UserError`) when the point's
    EXT footprint (:meth:`ext_footprint`: every weight, the target's with its input embedding,
    Quant-SD's 4-bit copies and a draft's, and the KV cache HB does not hold) exceeds the
    platform's LPDDR5 (``plat.ext_bytes``), in this placement or, with ``placement="reads"``,
    in the Fig. 12 placement its AR mode runs in, naming the model, scheme, batch, context,
    platform and its HB, the GiB needed by part against those there and what would help."""

    def __init__(self, model, plat: Platform, scheme: str = "ar", *, batch: int = 1,
                 context: int = CONTEXT, zipf: float | None = None, form: str = "token",
                 ar_cache: str = "best", intra: float | None = None,
                 placement: str = "paper", pool_slots: float | None = None):
        if not isinstance(plat, Platform):
            hint = (f" (platform({plat!r}, hb) builds one)" if isinstance(plat, str) else "")
            raise UserError(f"plat: expected a Platform{hint}, got {plat!r}")
        if not isinstance(scheme, str) or scheme not in ("ar",) + SCHEMES:
            raise UserError(f"unknown scheme {scheme!r}; known: ar, {', '.join(SCHEMES)}")
        if scheme == "elastic" and not plat.bit_sliced:
            raise UserError(f"Elastic-SD needs the bit-sliced die (ours), not {plat.name}")
        if not is_int(batch) or batch < 1:
            raise UserError(f"batch: expected a positive integer, got {batch!r}")
        if not is_int(context) or context < 1:
            raise UserError(f"context: expected a positive integer (tokens), got {context!r}")
        batch, context = int(batch), int(context)
        if zipf is not None and (not is_real(zipf) or not 0 <= zipf <= ZIPF_MAX):
            raise UserError(f"zipf: expected a Zipf exponent in [0, {ZIPF_MAX}], got {zipf!r}")
        if intra is not None and (not is_real(intra) or not 0 < intra <= 1):
            raise UserError(f"intra: expected an exponent in (0, 1], got {intra!r}")
        if not isinstance(form, str) or form not in CACHE_FORMS:
            raise UserError(f"form: expected {' or '.join(CACHE_FORMS)}, got {form!r}")
        self.shape = decoder_shape(model)
        self.m = m = self.shape.model
        self.plat, self.scheme, self.batch, self.context = plat, scheme, batch, context
        self.form = form
        # what an AR twin in Fig. 12's placement needs (placement "reads", :meth:`ar`)
        self._args = dict(model=model, plat=plat, scheme=scheme, batch=batch, context=context,
                          zipf=zipf, form=form, ar_cache=ar_cache, intra=intra)
        self.intra = INTRA_REQUEST if intra is None else intra
        if not (0 < self.intra <= 1):
            raise UserError(f"intra: expected an exponent in (0, 1], got {self.intra!r}")
        if not isinstance(ar_cache, str) or ar_cache not in AR_CACHES:
            raise UserError(f"ar_cache: expected {', '.join(AR_CACHES)}, got {ar_cache!r}")
        self.ar_cache = ar_cache
        if not isinstance(placement, str) or placement not in PLACEMENTS:
            raise UserError(f"placement: expected {' or '.join(PLACEMENTS)}, got {placement!r}")
        self.placement = placement
        self.sizes = self.shape.sizes()
        if zipf is None and m.name not in ZIPF:
            raise UserError(f"model {m.name!r} has no calibrated expert popularity; known: "
                            f"{', '.join(ZIPF)} (or pass zipf=)")
        s = ZIPF[m.name] if zipf is None else zipf
        self.pop = ExpertPopularity(m.routed_experts, m.top_k, s)
        self.mxfp4 = m.expert_format == "mxfp4"
        self._cals = {}
        self._sd_steps = {}
        self._verify_whole = False          # a verify step costed on whole INT8 experts
        self.verify_forms = {}              # verify rows -> its cache form ("msb", "whole")
        # draft model
        self.draft = (eagle_head(self.shape) if scheme == "eagle"
                      else DRAFT_MODELS.get(scheme))
        self._place()
        if pool_slots is not None:
            if scheme != "elastic":
                raise UserError(f"pool_slots: Elastic-SD's draft pool; the {scheme} scheme has "
                                f"none")
            if not is_real(pool_slots) or not 0 <= pool_slots < math.inf:
                raise UserError(f"pool_slots: expected a number of slots >= 0, got "
                                f"{pool_slots!r}")
            if pool_slots > self.slots * (1 + 1e-12):
                raise UserError(f"pool_slots: the draft pool ({pool_slots:.6g} slots a layer) "
                                f"cannot hold more than the expert cache ({self.slots:.6g} "
                                f"slots a layer of {m.name} on {plat.name}, "
                                f"{plat.hb_bytes / 2**30:g} GiB HB, batch {batch})")
        #: Elastic-SD's draft pool in slots a MoE layer (``pool_slots``, else :attr:`slots`)
        self.pool_slots = self.slots if pool_slots is None else min(float(pool_slots),
                                                                   self.slots)
        # placement "reads": AR mode runs in Fig. 12's placement (:meth:`ar`), whose LPDDR5
        # footprint is checked too
        self._ar_twin = None
        if placement == "reads":
            try:
                self._ar_twin = EvalModel(placement="paper", **self._args)
            except CapacityError as exc:
                raise CapacityError(f"{exc} (in AR mode, which runs in Fig. 12's placement: "
                                    f"placement 'reads' changes SD's alone)") from None

    # -- placement (Fig. 12) ----------------------------------------------------------------------
    def _place(self):
        m, z, cap = self.m, self.sizes, float(self.plat.hb_bytes)
        self.static_bytes = weight_bytes(z.static)
        self.kv_bytes = self.batch * self.shape.kv_tokens(self.context) \
            * self.shape.kv_bytes_per_token
        # the scheme's draft data: the draft model's weights and KV, or Quant-SD's 4-bit copy of
        # the static weights
        self.draft_weight_bytes = self.draft_kv_bytes = 0.0
        if self.draft is not None:
            self.draft_weight_bytes = self.draft.weight_bytes
            self.draft_kv_bytes = self.batch * self.context * self.draft.kv_per_token
        elif self.scheme == "quant":            # the static weights' 4-bit copy
            self.draft_weight_bytes = weight_bytes(z.static, 4)
        self.draft_bytes = draft = self.draft_weight_bytes + self.draft_kv_bytes
        # each part takes what HB it can, in the placement's order (Fig. 12's: static, KV,
        # draft, Quant-SD's experts before its draft data, below; "reads": the draft first)
        order = (("draft", draft), ("static", self.static_bytes), ("kv", self.kv_bytes))
        if self.placement == "paper":
            order = order[1:] + order[:1]
        # Quant-SD's scheme data in the paper placement: its experts (the hottest experts' 4-bit
        # draft copies; MXFP4 experts, their own 4-bit copy: the expert cache), up to every
        # expert, then its static 4-bit copy. Fig. 12's text orders only the static weights and
        # the KV before the scheme's data; this order is inferred from the paper's four
        # GPT-OSS-20B Quant-SD Phi_AR, equal to Elastic-SD's, which a copy taking the cache's
        # HB could not give, and kept for the INT8 models as one rule (their AR step reads no
        # expert from HB; their Phi_SD cells decide it: docs/paper.md section 4, "(e)")
        quant_experts = (self.placement == "paper" and self.scheme == "quant")
        if quant_experts:
            all_experts = m.routed_expert_count * m.expert_msb_bytes
            order = order[:2] + (("experts", all_experts),) + order[2:]
        left, share = cap, {}
        for part, size in order:
            share[part] = min(1.0, left / size) if size else 1.0
            left = max(0.0, left - size)
        self.hb_static, self.hb_kv, self.draft_in_hb = share["static"], share["kv"], share["draft"]
        if quant_experts:           # the experts' HB (what the copy left is unused)
            left = share["experts"] * all_experts
        # Quant-SD keeps no INT8 expert cache: its two copies of every expert (4-bit draft,
        # 8-bit target) halve what a slot holds and its unthrottled draft touches every expert
        # (Section 7.1, "the worst case"); the paper's Quant-SD Phi_AR equal the no-cache ones
        # (Qwen3 batch 4-16, GLM every batch: SLM-SD's). MXFP4 experts are their own 4-bit copy
        # (GPT-OSS-20B, where the paper's Quant-SD Phi_AR equal Elastic-SD's), so those keep
        # the cache, Elastic-SD's (its static 4-bit copy placed after it, above).
        # The HB left holds the hottest experts' 4-bit draft copies instead (Fig. 12: "Quant-SD
        # maintains independent 4-bit draft and 8-bit target weight copies across both tiers",
        # its HB full of copies): an LRU of 4-bit copies (an MSB slice's size) that only the
        # draft reads (:attr:`draft_slots`); AR and verify stream INT8 experts from EXT.
        self.draft_slots = None
        if self.scheme == "quant" and not self.mxfp4:
            self.draft_slots = left / m.expert_msb_bytes / m.moe_layers
            self.draft_cache_bytes = left
            left = 0.0
        self.cache_bytes = left
        # a slot holds an MSB slice on the bit-sliced die, a whole expert on HB-xPU
        self.slot_bytes = m.expert_msb_bytes if self.plat.bit_sliced else m.expert_bytes
        self.slots = left / self.slot_bytes / m.moe_layers
        # ar_cache="whole": AR mode fills the cache with whole INT8 experts instead (a hit
        # streams nothing from EXT; half the slots)
        # (ar_cache="best": :meth:`ar` takes the faster of the two caches at this point)
        self.whole_slots = left / m.expert_bytes / m.moe_layers
        self.ar_slots = (self.whole_slots
                         if self.ar_cache == "whole" and self.plat.bit_sliced else None)
        # near-memory platforms: the unit's LPDDR5 holds the static weights, the KV cache, the
        # draft, then the hottest experts (placed once; NMP's 16 GB, PIM's all 64 GB)
        left = float(self.plat.nm_bytes)
        fr = []
        for nbytes in (self.static_bytes, self.kv_bytes, draft):
            fr.append(min(1.0, left / nbytes) if nbytes else 1.0)
            left = max(0.0, left - nbytes)
        self.nm_static, self.nm_kv, self.nm_draft = fr
        self.nm_slots = left / m.expert_bytes / m.moe_layers
        self._check_ext()

    def _check_ext(self):
        """Raise :class:`CapacityError` when :meth:`ext_footprint` exceeds the LPDDR5."""
        ext, cap = self.ext_footprint(), self.plat.ext_bytes
        need = sum(ext.values())
        if need <= cap:
            return
        parts = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in ext.items()
                          if v >= 0.05 * 2**30)          # the parts that show at 0.1 GiB
        hb = f" ({self.plat.hb_bytes / 2**30:g} GiB HB)" if self.plat.hb_bytes else ""
        hint = ("its weights alone do not fit: raise ext_bytes"
                if need - ext[EXT_RUNTIME] > cap else "lower the batch or the context")
        raise CapacityError(
            f"{self.m.name} ({self.scheme}) at batch {self.batch} and context {self.context} on "
            f"{self.plat.name}{hb}: needs {need / 2**30:.1f} GiB of LPDDR5 ({parts}), the "
            f"platform has {cap / 2**30:g} GiB (ext_bytes); {hint}")

    def ext_footprint(self) -> dict:
        """Bytes that live in EXT (LPDDR5) by part, as Fig. 12 maps them; every weight is
        there (the backing store of what HB holds and caches, placed or not), the runtime
        data only where HB does not hold it:

        * ``"target weights"``: the static weights, the input embedding (``vocab x hidden``,
          in G32 INT8; none when it is the LM head's, ``DecoderShape.tied_embeddings``) and
          every routed expert (MXFP4 experts as they are);
        * ``"4-bit expert copy"``: Quant-SD's draft copy of every INT8 expert (0 otherwise);
        * ``"draft weights"``: a draft model's (EAGLE-3 head, SLM) or Quant-SD's 4-bit copy of
          the static weights;
        * :data:`EXT_RUNTIME`: the KV cache (the target's and a draft model's) HB does not
          hold, the only part the batch and the context move.

        The near-memory units' LPDDR5 is part of it. Checked against
        :attr:`Platform.ext_bytes` at construction (:class:`CapacityError`)."""
        m = self.m
        copy = (m.routed_expert_count * m.expert_msb_bytes
                if self.scheme == "quant" and not self.mxfp4 else 0.0)
        embedding = 0.0 if self.shape.tied_embeddings else weight_bytes(
            self.shape.vocab * m.hidden)
        return {"target weights": self.static_bytes + embedding
                + m.routed_expert_count * m.expert_bytes,
                "4-bit expert copy": float(copy),
                "draft weights": self.draft_weight_bytes,
                EXT_RUNTIME: self.kv_bytes * (1 - self.hb_kv)
                + self.draft_kv_bytes * (1 - self.draft_in_hb)}

    # -- one stage --------------------------------------------------------------------------------
    def _util(self, bits, parts) -> float:
        """The stage's fraction of peak at ``bits`` (as :meth:`_stage` runs them) over its
        ``parts``, ``(macs, what, rows)``: ``what`` an intermediate size (an FFN of this
        model's hidden size, :func:`compute_utilisation`) or ``("linear", K, N_p)`` (a plain
        GEMM of K in-features and ``N_p`` output channels a PE, :func:`linear_utilisation`;
        ``"kv"`` for a GEMM over the KV cache, W8A8 even in a 4-bit step).
        MACs over the sum of each part's MACs / its own utilisation (the parts run one after
        the other on the whole die)."""
        p = self.plat
        b = 4 if bits == 4 and p.tops4 > p.tops8 else 8
        tot = sum(m for m, _, _ in parts)
        if not tot:
            return 1.0
        return tot / sum(m / self._part_util(w, b, r) for m, w, r in parts if m)

    def _part_util(self, what, bits, rows) -> float:
        if isinstance(what, tuple):
            kind, k, n = what
            if kind == "kv" and bits == 4:
                # the KV cache is not bit-sliced: its GEMMs run W8A8 in a 4-bit step too, a
                # fraction of the W4A8 peak the stage's rate is counted against
                return linear_utilisation(self.plat, k, n, rows, 8) * self.plat.tops8 \
                    / self.plat.tops4
            return linear_utilisation(self.plat, k, n, rows, bits)
        return self._calibration(what, bits).utilisation(rows)

    def _calibration(self, intermediate, bits):
        """:func:`~.compute_calib.ffn_calibration` of this model's hidden size on the
        platform's die, kept per model (what :func:`compute_utilisation` reads)."""
        c = self._cals.get((intermediate, bits))
        if c is None:
            c = self._cals[intermediate, bits] = ffn_calibration(
                _die(self.plat), self.m.hidden, intermediate, bits, self.plat.link)
        return c

    def _linears(self, rows, linears):
        """The parts of plain GEMMs ``(name, K, N, count)`` on ``rows`` token rows: each
        layer's output channels split over the die's PEs (``N / pes`` a PE; nothing to
        reduce)."""
        P = self._pes()
        return tuple((rows * k * n * c, ("linear", k, n / P), rows) for _, k, n, c in linears)

    def _attention(self, rows, gemms):
        """The parts of the attention GEMMs ``(name, K, N, rows a token, count)`` of the
        batch's sequences (:meth:`~.decoder.DecoderShape.attention_gemms`) on ``rows`` token
        rows: each sequence's GEMM takes its own query rows (``rows / batch`` tokens times the
        heads sharing a KV) against its own KV (W8A8 always: ``"kv"`` parts); the ``batch x
        count`` GEMMs spread over the PEs, whole where there are as many as PEs, else each
        split by output channels."""
        P = self._pes()
        n_gemms = self.batch
        out = []
        for _, k, n, g, c in gemms:
            inst = n_gemms * c
            n_p = n if inst >= P else n * inst / P
            out.append((rows * g * k * n * c, ("kv", k, n_p), rows / self.batch * g))
        return tuple(out)

    def _pes(self) -> int:
        return _die(self.plat).pes

    def _stage(self, cost, kind, hb, ext, macs, bits=8, res=0.0, *, parts=None, reads=None,
               rows_in=0.0, link=0.0, fill=0.0, writes=(0.0, 0.0)):
        """Add a stage: the largest of its HB, EXT and compute times; compute at the
        :meth:`_util` of ``parts`` (required when ``macs``: ``(macs, what, rows)`` triples,
        :meth:`_util`). On a near-memory
        platform the ``res`` fraction of its EXT bytes (and MACs) sits with the unit, which
        computes it at ``nm_gbps`` / ``nm_tops`` while the xPU streams the rest through its
        own channels; the faster of that and the xPU alone is taken (Section 7.2: the unit
        runs small batches, larger ones go back to the xPU).

        The work for its energy (:meth:`StepCost.energy`): the MACs where they run; every
        byte the logic die receives written into its SRAM once and read once, except the
        ``reads`` parts (``(bytes, rows)`` pairs: weights serving ``rows`` token rows), read
        once per tile pass, ``ceil(rows / tile_rows)`` times (a mean rows figure, as a routed
        expert's, undercounts skewed traffic); the EXT bytes the die reads delivered on the
        streamline ring (Section 6: it "delivers external weight data directly into each PE's
        WMEM"; the RTL's ring carries EXT words only, ``docs/memory.md``), ``rows_in`` bytes
        (the stage's input rows) scattered to the PEs and ``link`` bytes (its output partial
        sums) reduced on the aggregation link (Section 6: "activation and PSUM transfer").
        With a near-memory unit taking the ``res`` share, its bytes and MACs move to the unit
        (its EXT bytes stay off the ring), the input rows also travel to it (and still to the
        die's PEs unless it takes the whole stage: a routed expert's rows are not split by
        where its expert sits, a small overcount) and its share of
        the outputs (``res x link / 8`` bytes, 8 B partial sums as 1 B values) comes back over
        LPDDR5, and the link reduces the rest (``(1 - res) x link``). In a 4-bit step the
        ``"kv"`` parts' MACs (the KV cache is not bit-sliced) count as W8A8 MACs, as
        :meth:`_part_util` times them. ``fill``: HB bytes the
        expert cache writes (its misses' slices, taken from the EXT stream as they pass: HB
        time and energy, no SRAM). ``writes``: the bytes the stage's results write into
        ``(HB, EXT)`` (the KV cache's new rows: memory time and energy, through the xPU's own
        channels on a near-memory platform, written into and read from the die's SRAM
        once; a simplification there, where the unit may hold that KV and compute its share:
        the writes are at most 0.35% of a step's bytes)."""
        p = self.plat
        w4 = bits == 4 and p.tops4 > p.tops8
        if macs and not parts:
            raise ValueError(f"stage {kind!r}: MACs without their parts (the calibration)")
        tops = (p.tops4 if w4 else p.tops8) * (self._util(bits, parts) if macs else 1.0)
        w_hb, w_ext = writes
        t = max((hb + fill + w_hb) / p.hb_gbps / 1e9 if hb + fill + w_hb else 0.0,
                (ext + w_ext) / p.ext_gbps / 1e9, 2 * macs / tops / 1e12)
        nm = 0.0
        if p.nm_tops and res > 0:
            t_nm = max(ext * res / p.nm_gbps / 1e9, 2 * macs * res / p.nm_tops / 1e12,
                       (ext * (1 - res) + w_ext) / p.nm_ext_gbps / 1e9,
                       2 * macs * (1 - res) / tops / 1e12)
            if t_nm < t:
                t, nm = t_nm, res
        cost.add(kind, t, hb + fill + w_hb, ext + w_ext)
        cost.hb_fill_bytes += fill
        cost.hb_write_bytes += fill + w_hb
        cost.ext_write_bytes += w_ext
        kv_macs = (min(macs, sum(n for n, what, _ in parts if isinstance(what, tuple)
                                 and what[0] == "kv")) if w4 and parts else 0.0)
        for key, n in ((4, macs - kv_macs), (8, kv_macs)) if w4 else ((8, macs),):
            if n:
                cost.macs[key] = cost.macs.get(key, 0.0) + n * (1 - nm)
        on_die = hb + ext * (1 - nm)
        share = on_die / (hb + ext) if hb + ext else 0.0
        cost.sram_write_bytes += on_die + w_hb + w_ext
        cost.sram_read_bytes += on_die + w_hb + w_ext + share * sum(
            b * (math.ceil(r / p.tile_rows) - 1) for b, r in (reads or ()))
        cost.ring_bytes += ext * (1 - nm)
        # the die's PEs take every input row unless the unit computes the whole stage
        cost.link_bytes += (rows_in if nm < 1 else 0.0) + link * (1 - nm)
        if nm:
            cost.nm_macs += macs * nm
            cost.nm_bytes += ext * nm
            cost.nm_io_bytes += rows_in + nm * link / 8

    @staticmethod
    def _res(*parts):
        """EXT-byte-weighted resident fraction of ``(bytes, fraction)`` parts."""
        tot = sum(b for b, _ in parts)
        return sum(b * f for b, f in parts) / tot if tot else 0.0

    def _split(self, nbytes, frac):
        return nbytes * frac, nbytes * (1 - frac)

    # -- a target step ----------------------------------------------------------------------------
    def step(self, rows: int, *, phase: str = "ar") -> StepCost:
        """One target step of ``rows`` token rows over the batch (``phase``: ``"ar"``,
        ``"verify"`` or ``"draft"``: Elastic-SD's and Quant-SD's 4-bit draft of the target);
        :class:`StepCost` in seconds and bytes (Section 7's step; module docstring). ``rows``
        is a positive integer (every caller
        here passes whole rows: ``batch``, ``batch x width``, ``batch x (1 + verify)``).
        Raises :class:`UserError` for another ``rows`` or ``phase``."""
        rows = _rows(rows)
        if not isinstance(phase, str) or phase not in STEP_PHASES:
            raise UserError(f"phase: expected {', '.join(STEP_PHASES)}, got {phase!r}")
        if phase == "draft" and self.scheme not in ("elastic", "quant"):
            raise UserError(f"phase 'draft': the target's 4-bit draft step of Elastic-SD or "
                            f"Quant-SD; scheme {self.scheme!r} "
                            + ("has no draft" if self.scheme == "ar"
                               else "drafts with its own model (draft_step)"))
        m, sh, z = self.m, self.shape, self.sizes
        H, L = m.hidden, m.layers
        draft = phase == "draft"
        bits = 4 if draft else 8
        cost = StepCost()
        # static weights of the draft: Elastic reads the nested MSB slices in place; Quant-SD its
        # 4-bit copy (HB first, as placed)
        fs = self.hb_static if not (draft and self.scheme == "quant") else self.draft_in_hb
        ctx_tokens = sh.kv_tokens(self.context)
        kv_layer = self.batch * ctx_tokens * sh.kv_bytes_per_token / L
        # each row's K and V written into the layer's cache (placed as the KV is)
        kv_writes = self._split(rows * sh.kv_bytes_per_token, self.hb_kv)
        att_macs = rows * sh.attention_weights + rows * sh.attention_macs(ctx_tokens // L)
        dense_layers = L - m.moe_layers
        for layer_kind, count in (("dense", dense_layers), ("moe", m.moe_layers)):
            if not count:
                continue
            c = StepCost()
            w = weight_bytes(sh.attention_weights + (m.routed_experts * H if layer_kind == "moe"
                                                     else 0), bits)
            hb, ext = self._split(w, fs)
            kh, ke = self._split(kv_layer, self.hb_kv)
            router = rows * m.routed_experts * H if layer_kind == "moe" else 0
            # a token row in (INT8 on the link), its output row out on the link (H Q.24 values
            # of 8 B, the o projection's channels gathered from the PEs that computed them;
            # the gathers between its own GEMMs, q/k/v heads to the PEs of the attention
            # GEMMs and their output to o's, are not counted: docs/paper.md section 2)
            self._stage(c, "attention", hb + kh, ext + ke, att_macs + router, bits,
                        self._res((ext, self.nm_static), (ke, self.nm_kv)),
                        parts=self._linears(rows, tuple(
                            (n, k, o, 1) for n, k, o in sh.attention_linears + (
                                (("router", H, m.routed_experts),) if router else ())))
                        + self._attention(rows, sh.attention_gemms(ctx_tokens // L)),
                        reads=((w, rows),), writes=kv_writes,
                        rows_in=rows * H, link=rows * H * 8)
            if layer_kind == "dense":
                w = weight_bytes(3 * H * sh.dense_intermediate, bits)
                hb, ext = self._split(w, fs)
                dm = rows * 3 * H * sh.dense_intermediate
                self._stage(c, "dense", hb, ext, dm, bits, self.nm_static,
                            parts=((dm, sh.dense_intermediate, rows),),
                            reads=((w, rows),), rows_in=rows * H,
                            link=rows * H * 8)
            else:
                self._moe(c, rows, phase, fs)
            cost.merge(c, count)
        w = weight_bytes(z.lm_head, bits)
        hb, ext = self._split(w, fs)
        # the LM head splits its output channels over the PEs: nothing to reduce
        self._stage(cost, "lm_head", hb, ext + rows * H * 2, rows * z.lm_head, bits,
                    self.nm_static, parts=self._linears(rows, (("lm_head", H, sh.vocab, 1),)),
                    reads=((w, rows),), rows_in=rows * H)
        return cost

    def routed_tokens(self, rows: float) -> float:
        """Independent tokens whose routing a step of ``rows`` rows over the batch amounts to:
        ``batch x (rows / batch) ** intra`` (:data:`INTRA_REQUEST`): the rows of one request
        (its tree's candidates) route alike; one row a request (AR) is ``rows`` itself."""
        rows = _count("rows", rows)
        per = max(rows / self.batch, 1.0)
        return self.batch * per ** self.intra if per > 1 else float(rows)

    def _moe(self, c, rows, phase, fs):
        m = self.m
        H = m.hidden
        bits = 4 if phase == "draft" else 8
        shared = m.ffn_matrices * H * m.shared_intermediate
        shared_bytes = weight_bytes(shared, bits)
        hb, ext = self._split(shared_bytes, fs)
        msb, lsb, whole = m.expert_msb_bytes, m.expert_lsb_bytes, m.expert_bytes
        k = m.top_k                                       # routed experts a row computes
        if phase == "draft" and self.scheme == "elastic":
            # the throttled draft keeps top-k inside the pool: fewer on a pool of fewer
            k = min(k, self.pop.pool_size(self.pool_slots))
        macs = rows * (shared + k * m.expert_weights)
        on_hb = self.plat.hb_bytes > 0
        n = self.routed_tokens(rows)                      # what the expert popularity sees
        # an LRU cache (Che's approximation assumes one) writes each miss's slice into HB as
        # the EXT stream passes (Algorithm 1's UpdateCache in the verify): ``fill``
        fill = 0.0
        if phase == "draft" and self.scheme == "elastic":
            uniq = self.pop.pool_step(n, self.pool_slots)
            hb += uniq * msb                      # the pool is cached: HB only
        elif phase == "draft":                            # Quant-SD: 4-bit copies, all experts
            slots = self.slots if self.draft_slots is None else self.draft_slots
            uniq, hits = self.pop.step(n, slots, self.form)
            hb += hits * msb
            ext += (uniq - hits) * msb
            fill = (uniq - hits) * msb if slots > 0 else 0.0
        elif (phase == "ar" and self.ar_slots is not None) or (phase == "verify"
                                                              and self._verify_whole):
            slots = self.ar_slots if phase == "ar" else self.whole_slots
            uniq, hits = self.pop.step(n, slots, self.form)
            hb += hits * whole
            ext += (uniq - hits) * whole
            fill = (uniq - hits) * whole if slots > 0 else 0.0
        elif self.plat.bit_sliced or not on_hb:
            uniq, hits = self.pop.step(n, self.slots if on_hb else 0, self.form)
            hb += hits * msb
            ext += hits * lsb + (uniq - hits) * whole
            fill = (uniq - hits) * msb if on_hb and self.slots > 0 else 0.0
        else:                                             # HB-xPU: whole INT8 experts cached
            uniq, hits = self.pop.step(n, self.slots, self.form)
            hb += hits * whole
            ext += (uniq - hits) * whole
            fill = (uniq - hits) * whole if self.slots > 0 else 0.0
        res = 0.0
        if self.plat.nm_tops:
            shared_ext = ext - (uniq - hits if on_hb else uniq) * whole
            res = self._res((shared_ext, self.nm_static),
                            (ext - shared_ext, self.pop.top_share(n, self.nm_slots)))
        # each (row, routed expert) pair and each row of the shared experts: the row in and the
        # expert's output reduced on the link; the shared experts' weights serve
        # every row, a routed expert's the rows routed to it (rows x k over the step's
        # distinct experts, on average)
        pairs = rows * (k + (1 if shared else 0))
        routed = hb + ext - shared_bytes
        per_expert = rows * k / max(uniq, 1.0)
        parts = ((rows * shared, m.shared_intermediate, rows),
                 (rows * k * m.expert_weights, m.expert_intermediate, per_expert))
        self._stage(c, "experts", hb, ext, macs, bits, res, parts=parts,
                    reads=((shared_bytes, rows), (routed, per_expert)),
                    rows_in=pairs * H, link=pairs * H * 8, fill=fill)

    # -- draft models ------------------------------------------------------------------------------
    def draft_step(self, rows: int, first: bool = True) -> StepCost:
        """One step of the scheme's draft on ``rows`` token rows (a positive integer; Section
        7's SD schemes: Elastic-SD's and Quant-SD's 4-bit target, else the draft model), an
        iteration's ``first`` or a later one (an EAGLE-3 head's fc runs on the first only:
        :meth:`~.decoder.DraftModel.step_weights`); :class:`StepCost` in seconds and bytes.
        Raises :class:`UserError` for another ``rows`` and on scheme ``"ar"`` (no draft)."""
        rows = _rows(rows)
        self._check_sd()
        if self.scheme in ("elastic", "quant"):
            return self.step(rows, phase="draft")
        d = self.draft
        cost = StepCost()
        w = d.step_bytes(first)
        kv = self.batch * self.context * d.kv_per_token
        hb, ext = self._split(w + kv, self.draft_in_hb)
        macs = (rows * d.step_weights(first)
                + rows * d.layers * 2 * d.q_heads * d.head_dim * self.context)
        self._stage(cost, "draft", hb, ext, macs, res=self.nm_draft,
                    parts=self._linears(rows, d.step_linears(first))
                    + self._attention(rows, d.attention_gemms(self.context)),
                    reads=((w, rows),),
                    writes=self._split(rows * d.kv_per_token, self.draft_in_hb),
                    rows_in=rows * d.layers * 2 * d.hidden,
                    link=rows * d.layers * 2 * d.hidden * 8)
        return cost

    # -- AR and SD ---------------------------------------------------------------------------------
    def ar(self) -> StepCost:
        """One AR step: one token of every sequence. With ``ar_cache="best"`` on the
        bit-sliced die, the faster of an MSB-slice cache (the LSB streamed on a hit) and a
        whole-INT8-expert cache (half the slots); :attr:`ar_form` says which ("msb" or
        "whole"; "none" with no expert cache, "whole" on HB-xPU and for MXFP4 experts:
        :meth:`_cache_form`). With ``placement="reads"`` the AR step runs in Fig. 12's
        placement (AR mode never reads the draft data, :data:`PLACEMENTS`)."""
        if self.placement == "reads":
            twin = self._ar_twin
            step = twin.ar()
            self.ar_form = twin.ar_form
            return step
        form = self._cache_form()
        if self.ar_cache != "best" or form != "msb":
            self.ar_form = "whole" if form == "msb" and self.ar_slots is not None else form
            return self.step(self.batch, phase="ar")
        msb = self.step(self.batch, phase="ar")
        self.ar_slots = self.whole_slots
        try:
            whole = self.step(self.batch, phase="ar")
        finally:
            self.ar_slots = None
        self.ar_form = self._faster(msb, whole)
        return whole if self.ar_form == "whole" else msb

    def _cache_form(self) -> str:
        """The expert cache's form where there is no choice, else ``"msb"`` (the choice is
        :meth:`ar`'s and :meth:`_verify_step`'s): ``"none"`` with no expert cache (no HB, or
        none left after the static weights, KV and draft data: Quant-SD's INT8 cache),
        ``"whole"`` for experts with no LSB slice (:attr:`one_form`) or a die without the
        bit-sliced tile (HB-xPU)."""
        if self.cache_bytes <= 0 or not self.plat.hb_bytes:
            return "none"
        return "whole" if self.one_form or not self.plat.bit_sliced else "msb"

    def _check_sd(self):
        if self.scheme == "ar":
            raise UserError(f"scheme 'ar' has no draft: SD needs one of {', '.join(SCHEMES)}")

    @property
    def one_form(self) -> bool:
        """Whether the two cache forms are one: experts with no LSB slice (GPT-OSS-20B's
        MXFP4), whose MSB slice is the whole expert."""
        return self.m.expert_lsb_bytes == 0

    @staticmethod
    def _faster(msb: StepCost, whole: StepCost) -> str:
        """The cache form of the faster step, ``"whole"`` only when the whole-INT8-expert
        step beats the MSB-slice one by more than float noise (a tie keeps the MSB slices:
        their bytes and energy), as :meth:`ar` and :meth:`_verify_step` pick."""
        return "whole" if whole.seconds < msb.seconds * (1 - 1e-9) else "msb"

    def sd(self, alpha: float, depth: int, width: int = 1, verify: int | None = None
           ) -> SDResult:
        """One SD iteration of a ``depth`` x ``width`` tree at acceptance ``alpha``, the verify
        taking ``verify`` nodes a sequence (default every one, ``depth x width``; the tokens
        an iteration: :func:`accepted_tokens`). Raises :class:`UserError` as
        :func:`accepted_tokens` does, and on scheme ``"ar"`` (no draft)."""
        self._check_sd()
        tokens = accepted_tokens(alpha, depth, width, verify)
        depth, width = int(depth), int(width)
        verify = depth * width if verify is None else int(verify)
        B = self.batch
        d1, dn, v, draft_s = self._iteration(depth, width, verify)
        per_token = (draft_s + v.seconds) / (B * tokens)
        e = (d1.energy_pj(self.plat) + (depth - 1) * dn.energy_pj(self.plat)
             + v.energy_pj(self.plat)) / (B * tokens)
        it = StepCost()
        for c, n in ((d1, 1), (dn, depth - 1), (v, 1)):
            it.merge(c, n)
        parts = {k: x / (B * tokens) for k, x in it.energy(self.plat).items()}
        return SDResult(depth, width, tokens, draft_s, v.seconds, per_token, e, parts, verify,
                        self.verify_forms[B * (1 + verify)])

    def _iteration(self, depth: int, width: int, verify: int) -> tuple:
        """One SD iteration's steps and its draft seconds, ``(first draft, later draft,
        verify, draft seconds)``: the batch's rows once, ``batch x width`` rows ``depth - 1``
        times (an empty :class:`StepCost` at depth 1), ``batch x (1 + verify)`` rows; what
        :meth:`sd` and :meth:`best_sd` cost a tree with."""
        B = self.batch
        d1 = self._sd_step("draft", B)
        dn = self._sd_step("draft_next", B * width) if depth > 1 else StepCost()
        return (d1, dn, self._sd_step("verify", B * (1 + verify)),
                d1.seconds + (depth - 1) * dn.seconds)

    def _sd_step(self, kind: str, rows: int) -> StepCost:
        """An iteration's first draft step (``kind`` ``"draft"``), a later one
        (``"draft_next"``) or its verify step (``"verify"``) of ``rows`` rows, computed once
        per model (none depends on the AR cache form). Not to be modified."""
        if kind not in ("draft", "draft_next", "verify"):
            raise ValueError(f"_sd_step: kind {kind!r}")
        c = self._sd_steps.get((kind, rows))
        if c is None:
            c = self._sd_steps[kind, rows] = (
                self._verify_step(rows) if kind == "verify"
                else self.draft_step(rows, first=kind == "draft"))
        return c

    def _verify_step(self, rows: int) -> StepCost:
        """A verify step of ``rows`` rows in its cache form (:attr:`verify_forms`): on the
        bit-sliced die a scheme whose draft does not read the target's MSB slices (EAGLE-,
        SLM-, Quant-SD) caches what verifies faster at this point, MSB slices (the LSB
        streamed on a hit, twice the slots) or whole INT8 experts (conventional caching: a hit
        streams nothing; Section 7.1, Fig. 13: "bit-sliced caching can become less effective,
        as reflected by the lower verify cost of EAGLE-SD in the 8GB configuration"), as
        :meth:`ar` picks for AR; Elastic-SD keeps MSB slices (its draft pool); HB-xPU and the
        other platforms cache whole experts or none. ``"none"``: no expert cache (no HB, or
        none left after the static weights, KV and draft data, Quant-SD's INT8 cache);
        ``"whole"`` also for experts with no LSB slice (:attr:`one_form`). A tie keeps the
        MSB slices (:meth:`_faster`): where a step touches more distinct experts than either
        cache holds, every slot hits (the token form's cap) and each hit saves the bytes it
        holds, so the two forms, of one HB size, save the same EXT bytes."""
        msb = self.step(rows, phase="verify")
        self.verify_forms[rows] = self._cache_form()
        if self.scheme == "elastic" or self.verify_forms[rows] != "msb":
            return msb
        whole = self.verify_whole(rows)
        self.verify_forms[rows] = self._faster(msb, whole)
        return whole if self.verify_forms[rows] == "whole" else msb

    def verify_whole(self, rows: int) -> StepCost:
        """A verify step of ``rows`` rows (a positive integer) with the HB's expert cache
        holding whole INT8 experts (conventional caching, half the slots of MSB slices on the
        bit-sliced die), whatever :meth:`_verify_step` chose: Fig. 13's comparison. Raises
        :class:`UserError` for another ``rows``."""
        self._verify_whole = True
        try:
            return self.step(rows, phase="verify")
        finally:
            self._verify_whole = False

    def best_sd(self, alpha: float, depths=None, widths=None) -> SDResult:
        """The fastest tree of ``depths`` x ``widths`` x every verify size from ``depth`` to
        ``depth x width`` at ``alpha`` (default :data:`TREE_DEPTHS` x :data:`TREE_WIDTHS`, the
        grid :func:`calibrate_tree` fits :data:`TREE` on; Section 2.2's dynamic tree). Raises
        :class:`UserError` for an alpha outside [0, 1) or ``depths`` / ``widths`` not a
        non-empty sequence of positive integers, and on scheme ``"ar"`` (no draft)."""
        self._check_sd()
        accepted_tokens(alpha, 1, 1)                      # checks alpha
        B, best = self.batch, None
        for d, w, v in tree_grid(depths, widths):
            _, _, vs, draft_s = self._iteration(d, w, v)
            t = (draft_s + vs.seconds) / (B * _tokens_by_verify(float(alpha), d, w)[v])
            if best is None or t < best[0]:
                best = (t, (d, w, v))
        return self.sd(alpha, *best[1])


def tree_grid(depths=None, widths=None):
    """The SD trees :func:`calibrate_tree` and :meth:`EvalModel.best_sd` search: ``(depth,
    width, verify)`` over ``depths`` x ``widths`` (default :data:`TREE_DEPTHS` x
    :data:`TREE_WIDTHS`) and verify sizes ``depth .. depth x width`` (fewer than ``depth``
    nodes cannot reach the deepest level: a shallower tree yields as much for less draft).
    Raises :class:`UserError` for a depth or width below 1 or an empty grid."""
    grid = []
    for name, values, default in (("depth", depths, TREE_DEPTHS), ("width", widths, TREE_WIDTHS)):
        values = default if values is None else values
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
            raise UserError(f"SD tree {name}s: expected positive integers, got {values!r}")
        values = list(values)
        if not values or any(not is_int(v)
                             or v < 1 for v in values):
            raise UserError(f"SD tree {name}s: expected positive integers, got {values!r}")
        grid.append([int(v) for v in values])
    return [(d, w, v) for d in grid[0] for w in grid[1] for v in range(d, d * w + 1)]


# == Table 3 =======================================================================================

def _check_tree(tree):
    """``tree`` of :func:`table3`, :func:`fig12` and :func:`fig14`: ``"best"``, or
    ``(depth, width)`` / ``(depth, width, verify)`` of positive integers (verify at most
    ``depth x width``), as a tuple of ints; :class:`UserError` naming ``tree`` otherwise."""
    if isinstance(tree, str) and tree == "best":
        return tree
    if (not isinstance(tree, (tuple, list)) or len(tree) not in (2, 3)
            or not all(is_int(v) and v >= 1 for v in tree)
            or (len(tree) == 3 and tree[2] > tree[0] * tree[1])):
        raise UserError(f"tree: expected 'best', (depth, width) or (depth, width, verify) of "
                        f"positive integers (verify <= depth x width), got {tree!r}")
    return tuple(int(v) for v in tree)


def _zipf_map(zipf, models) -> dict:
    """:data:`ZIPF` with the overrides ``zipf`` (``{model: exponent}``, the models among
    ``models``); :class:`UserError` naming ``zipf`` for another key or value."""
    if zipf is None:
        return dict(ZIPF)
    if not isinstance(zipf, dict):
        raise UserError(f"zipf: expected {{model: Zipf exponent}}, got {type(zipf).__name__}")
    _check_keys("zipf", zipf, "models", (), models)
    for k, v in zipf.items():
        if not is_real(v) or not 0 <= v <= ZIPF_MAX:
            raise UserError(f"zipf[{k!r}]: expected a Zipf exponent in [0, {ZIPF_MAX}], "
                            f"got {v!r}")
    return {**ZIPF, **zipf}


def _check_keys(what, got: dict, kind: str, required, allowed) -> None:
    """:class:`UserError` naming ``what`` unless ``got`` has every key of ``required`` and no
    key outside ``allowed`` (both named ``kind``, e.g. "models"; ``required`` may be empty)."""
    unknown = [k for k in got if k not in allowed]
    missing = [k for k in required if k not in got]
    if not (unknown or missing):
        return
    if not required:
        raise UserError(f"{what}: unknown {kind[:-1]}(s) {', '.join(map(repr, unknown))}; "
                        f"expected some of {', '.join(allowed)}")
    extra = "" if list(allowed) == list(required) else f" (of {', '.join(allowed)})"
    raise UserError(f"{what}: expected the {kind} {', '.join(required)}{extra}; "
                    + "; ".join(f"{how} {', '.join(map(repr, v))}" for how, v in
                                (("unknown", unknown), ("missing", missing)) if v))


def _check_alphas(alphas, schemes) -> None:
    """``alphas`` of :func:`table3` / :func:`fig14`: None or ``{model: {scheme: [alpha per
    batch]}}`` for every model of :data:`TABLE3_MODELS` and every scheme of ``schemes`` (others
    of :data:`SCHEMES` allowed), an alpha a batch of :data:`TABLE3_BATCHES`; the alphas
    themselves are checked where they are used (:func:`accepted_tokens`). :class:`UserError`
    naming what is missing or unknown."""
    if alphas is None:
        return
    if not isinstance(alphas, dict):
        raise UserError(f"alphas: expected {{model: {{scheme: [alpha per batch]}}}}, got "
                        f"{type(alphas).__name__}")
    _check_keys("alphas", alphas, "models", TABLE3_MODELS, TABLE3_MODELS)
    for model, by_scheme in alphas.items():
        if not isinstance(by_scheme, dict):
            raise UserError(f"alphas[{model!r}]: expected {{scheme: [alpha per batch]}}, got "
                            f"{type(by_scheme).__name__}")
        _check_keys(f"alphas[{model!r}]", by_scheme, "schemes", schemes, SCHEMES)
        for scheme in schemes:
            v = by_scheme[scheme]
            if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") \
                    or len(v) != len(TABLE3_BATCHES):
                raise UserError(f"alphas[{model!r}][{scheme!r}]: expected an alpha a batch of "
                                f"{TABLE3_BATCHES}, got {v!r}")


def pool_slots_at(pool_hb: str | None, model: str, *, batch: int, link: str = "die",
                  **kw) -> float | None:
    """Elastic-SD's draft pool on ours at ``pool_hb`` (one of :data:`HB_SIZES`): the expert
    cache's slots a MoE layer of ``model`` at ``batch`` there, ``kw`` (``zipf``, ``form``,
    ``context``, ``intra``, ``placement``) as :class:`EvalModel`'s; None for ``pool_hb``
    None (the pool is the point's own cache). What :class:`EvalModel`'s ``pool_slots`` takes
    to run a point at a larger HB with the pool of the HB its alpha is from (the paper's 4 GB
    alphas at 8 GB: ``pool_hb="4gb"``). Raises :class:`UserError` for an unknown HB size, and
    for a point the ``pool_hb`` configuration cannot hold (its LPDDR5 check, naming the
    point)."""
    if pool_hb is None:
        return None
    if not isinstance(pool_hb, str) or pool_hb not in HB_SIZES:
        raise UserError(f"pool_hb: expected one of {', '.join(HB_SIZES)}, got {pool_hb!r}")
    try:
        return EvalModel(model, platform("ours", pool_hb, link=link), "elastic", batch=batch,
                         **kw).slots
    except CapacityError as exc:
        raise UserError(f"pool_hb {pool_hb}: no draft pool of that configuration for this "
                        f"point, which it cannot hold: {exc}") from None


def check_pool_hb(pool_hb, hb, *, name: str = "pool_hb", hb_name: str = "hb") -> None:
    """The one rule of a draft pool at another HB (:func:`pool_slots_at`): ``pool_hb`` is None
    or one of :data:`HB_SIZES` up to ``hb`` (a pool at most the expert cache, which grows with
    the HB). Raises :class:`UserError` naming ``name`` (and ``hb_name``), the parameters as the
    caller calls them (``--draft-pool`` and ``--hb`` on the command line)."""
    if pool_hb is None:
        return
    if not isinstance(pool_hb, str) or pool_hb not in HB_SIZES:
        raise UserError(f"{name} {pool_hb!r}: expected one of {', '.join(HB_SIZES)}")
    if hb in HB_SIZES and HB_SIZES.index(pool_hb) > HB_SIZES.index(hb):
        raise UserError(f"{name} {pool_hb}: Elastic-SD's draft pool would hold more than the "
                        f"expert cache at {hb_name} {hb}; expected an HB size up to {hb}")


def table3(hb: str = "4gb", *, zipf: dict | None = None, alphas: dict | None = None,
           form: str = "token", tree=TREE, ar_cache: str = "best", link: str = "die",
           intra: float | None = None, placement: str = "paper",
           pool_hb: str | None = None) -> list:
    """Our Table 3 at ``hb``: a row (dict) per (model, scheme, batch) with alpha
    (``alphas[model][scheme][i]``, default the paper's 4 GB alpha: the 8 GB alphas are not in
    this copy of the paper), Phi_AR, Phi_SD, the tree, milliseconds and access energy a token
    (xPU, AR, SD), expert-cache slots a layer (``slots``: MSB slices, ``whole_slots``: whole
    INT8 experts in the same HB), the cache form the AR and the verify steps ran with
    (``ar_form``, ``verify_form``: :meth:`EvalModel.ar`, :meth:`EvalModel._verify_step`), and
    the paper's figures where this copy has them
    (``paper_alpha``, ``paper_phi_ar``, ``paper_phi_sd``: 4 GB). ``zipf`` overrides
    :data:`ZIPF`; ``form`` is the cache form (:meth:`ExpertPopularity.step`); ``tree`` a
    ``(depth, width)`` (every node verified), a ``(depth, width, verify)`` or ``"best"``
    (:meth:`EvalModel.best_sd` per point);
    ``ar_cache`` what ours caches in AR mode (:class:`EvalModel`); ``link`` every platform's
    :attr:`Platform.link`; ``intra`` the intra-request exponent (default
    :data:`INTRA_REQUEST`); ``placement`` the HB placement (:data:`PLACEMENTS`); ``pool_hb``
    Elastic-SD's draft pool at that HB (:func:`pool_slots_at`; default ``hb``'s own). Raises
    :class:`UserError` naming the parameter for an unknown HB size, link, form, placement or
    AR cache, a ``tree`` of another shape, a ``zipf`` or ``alphas`` naming an unknown model or
    scheme (or, ``alphas``, lacking one), an alpha outside [0, 1), and a ``pool_hb`` larger
    than ``hb``."""
    tree = _check_tree(tree)
    _check_alphas(alphas, SCHEMES)
    check_pool_hb(pool_hb, hb)
    xpu, ours = platform("xpu", hb, link=link), platform("ours", hb, link=link)
    zipf = _zipf_map(zipf, TABLE3_MODELS)
    rows = []
    for model in TABLE3_MODELS:
        s = zipf[model]
        for scheme in SCHEMES:
            for i, b in enumerate(TABLE3_BATCHES):
                paper = TABLE3_4GB[model][scheme][i]
                alpha = alphas[model][scheme][i] if alphas else paper[0]
                base = EvalModel(model, xpu, "ar", batch=b, zipf=s, form=form).ar()
                pool = (pool_slots_at(pool_hb, model, batch=b, zipf=s, form=form, intra=intra,
                                      placement=placement, link=link)
                        if scheme == "elastic" else None)
                em = EvalModel(model, ours, scheme, batch=b, zipf=s, form=form,
                               ar_cache=ar_cache, intra=intra, placement=placement,
                               pool_slots=pool)
                ar = em.ar()
                sd = em.best_sd(alpha) if tree == "best" else em.sd(alpha, *tree)
                phi_ar = base.seconds / ar.seconds
                phi_sd = base.seconds / b / sd.per_token_s
                row = {"model": model, "scheme": scheme, "batch": b, "alpha": alpha,
                       "phi_ar": phi_ar, "phi_sd": phi_sd, "best": max(phi_ar, phi_sd),
                       "mode": "sd" if phi_sd > phi_ar else "ar",
                       "depth": sd.depth, "width": sd.width, "verify": sd.verify,
                       "tokens": sd.tokens,
                       "slots": em.slots, "whole_slots": em.whole_slots,
                       "pool_slots": em.pool_slots if scheme == "elastic" else None,
                       "ar_form": em.ar_form, "verify_form": sd.verify_form,
                       "xpu_ms_token": base.seconds / b * 1e3,
                       "ar_ms_token": ar.seconds / b * 1e3,
                       "sd_ms_token": sd.per_token_s * 1e3,
                       "xpu_pj_token": base.energy_pj(xpu) / b,
                       "ar_pj_token": ar.energy_pj(ours) / b,
                       "sd_pj_token": sd.energy_pj_per_token}
                if hb == "4gb":
                    row.update(paper_alpha=paper[0], paper_phi_ar=paper[1],
                               paper_phi_sd=paper[2])
                rows.append(row)
    return rows


#: What a :func:`table3` row (``elmoe3d paper table3 --json``'s ``rows``) holds, field by field.
TABLE3_UNITS = {
    "alpha": "acceptance rate the SD step ran with (the paper's 4 GB alpha, or --alpha model's)",
    "phi_ar": "AR-mode tokens/s over the xPU's AR at the same batch (times)",
    "phi_sd": "SD-mode tokens/s over the xPU's AR at the same batch (times)",
    "best": "max(phi_ar, phi_sd)", "mode": "the faster mode: ar or sd",
    "depth": "SD tree depth (draft levels)", "width": "SD tree width (candidates a level)",
    "verify": "tree nodes verified a sequence an iteration",
    "tokens": "tokens a sequence an SD iteration yields (expected: the accepted prefix and "
              "the bonus token, accepted_tokens)",
    "slots": "expert-cache slots a MoE layer, in MSB slices (the HB left after the static "
             "weights, the KV and the scheme's own data)",
    "whole_slots": "the same HB in whole INT8 experts",
    "pool_slots": "Elastic-SD's draft pool, slots a MoE layer (null for the other schemes)",
    "ar_form": "what the AR step's expert cache holds: msb, whole or none",
    "verify_form": "what the verify step's expert cache holds: msb, whole or none",
    "xpu_ms_token": "ms a token (a step's time over the batch), the xPU in AR",
    "ar_ms_token": "ms a token, ours in AR", "sd_ms_token": "ms a token, ours in SD",
    "xpu_pj_token": "pJ a token, HB and EXT access energy only, the xPU in AR",
    "ar_pj_token": "pJ a token, access energy only, ours in AR",
    "sd_pj_token": "pJ a token, access energy only, ours in SD",
    "paper_alpha": "the paper's Table 3 alpha (4 GB rows only: its 8 GB rows are withheld "
                   "from this copy)",
    "paper_phi_ar": "the paper's Phi_AR (4 GB rows only)",
    "paper_phi_sd": "the paper's Phi_SD (4 GB rows only)",
}

#: What a :func:`fig14` row (``elmoe3d paper fig14 | fig15 --json``'s ``rows``) holds.
FIG14_UNITS = {
    "platform": "one of PLATFORMS (xpu, xpu-pim, xpu-logicpim, xpu-nmp, hb-xpu, ours)",
    "scheme": "the SD scheme the platform runs (PLATFORM_SCHEME)",
    "phi_ar": "AR-mode tokens/s over the xPU's AR at the same batch (times)",
    "phi_sd": "SD-mode tokens/s over the xPU's AR at the same batch (times)",
    "best": "max(phi_ar, phi_sd)", "mode": "the faster mode: ar or sd",
    "pj_token": "pJ a token in the best mode: HB and EXT access energy only, every EXT byte "
                "at the LPDDR5 read figure",
    "energy": "pJ a token in the best mode by component (ENERGY_PARTS): the whole energy",
    "xpu_pj_token": "pJ a token of the xPU in AR, access energy only",
    "xpu_energy": "pJ a token of the xPU in AR by component",
}


#: The paper's best-mode speedups of Elastic-SD over xPU averaged over Table 3's models and
#: batches (Section 7.1): 3.4x at 4 GB, 7.0x at 8 GB.
PAPER_BEST_MODE_MEAN = {"4gb": 3.4, "8gb": 7.0}


#: What :func:`summary` (``table3 --json``'s and ``cross-validate --json``'s ``summary``,
#: ``held_out``, ``in_sample``) holds, field by field.
SUMMARY_UNITS = {
    "cells": "Table 3 cells compared (Phi_AR and Phi_SD of each 4 GB row)",
    "within_15": "cells whose ratio ours / paper is within 15% of 1",
    "mean_abs_error": "mean |ours / paper - 1| over the cells",
    "worst": "the cell of the largest |ratio - 1|: model, scheme, batch, figure, ratio",
    "by_scheme": "mean |ratio - 1| of each scheme's cells",
    "by_figure": "mean |ratio - 1| of the Phi_AR and of the Phi_SD cells",
    "elastic_best_mode_mean": "Elastic-SD's best-mode speedup over the xPU, mean over the "
                              "models and batches (times; paper: PAPER_BEST_MODE_MEAN)",
}


def summary(rows) -> dict:
    """Errors of :func:`table3` rows against the paper (``ratio`` = ours / paper per cell):
    ``cells``, ``within_15``, ``mean_abs_error`` (of the ratio from 1), ``worst`` (the cell,
    with its ratio), per-scheme and per-figure mean errors, and the Elastic-SD best-mode mean
    beside :data:`PAPER_BEST_MODE_MEAN`. Raises :class:`UserError` for a row that is not one
    of table3's (a dict with model, scheme, batch, Phi_AR, Phi_SD and best) or a paper figure
    that is not positive."""
    need = ("model", "scheme", "batch", "phi_ar", "phi_sd", "best")
    cells = []
    for r in rows:
        if not isinstance(r, dict) or any(k not in r for k in need):
            raise UserError(f"Table 3 rows: expected table3's rows (dicts with "
                            f"{', '.join(map(repr, need))}), got {r!r:.80}")
        for k in ("phi_ar", "phi_sd"):
            if f"paper_{k}" in r and not (is_real(r[f"paper_{k}"]) and r[f"paper_{k}"] > 0):
                raise UserError(f"Table 3 rows: {r['model']} {r['scheme']} batch {r['batch']}: "
                                f"paper_{k} expected a positive number, got "
                                f"{r[f'paper_{k}']!r}")
        for k in ("phi_ar", "phi_sd"):
            if f"paper_{k}" in r:
                cells.append((r[k] / r[f"paper_{k}"], r["model"], r["scheme"], r["batch"], k))
    el = [r["best"] for r in rows if r["scheme"] == "elastic"]
    out = {"elastic_best_mode_mean": float(np.mean(el)) if el else None}
    if not cells:
        return out
    err = np.array([abs(c[0] - 1) for c in cells])
    w = max(cells, key=lambda c: abs(c[0] - 1))
    out.update(cells=len(cells), within_15=int((err <= 0.15).sum()),
               mean_abs_error=float(err.mean()),
               worst={"model": w[1], "scheme": w[2], "batch": w[3], "figure": w[4],
                      "ratio": w[0]})
    for key, pick in (("by_scheme", 2), ("by_figure", 4)):
        groups = {}
        for c in cells:
            groups.setdefault(c[pick], []).append(abs(c[0] - 1))
        out[key] = {g: float(np.mean(v)) for g, v in groups.items()}
    return out


def _batch_indices(batches, name: str = "batches") -> tuple:
    """Indices into :data:`TABLE3_BATCHES` of ``batches`` (batch sizes; None: all of them);
    :class:`UserError` naming the parameter ``name`` for a batch size Table 3 does not
    have."""
    if batches is None:
        return tuple(range(len(TABLE3_BATCHES)))
    bad = [b for b in batches if b not in TABLE3_BATCHES]
    if bad or not batches:
        got = batches[0] if name == "batch" and len(batches) == 1 else tuple(batches)
        raise UserError(f"{name}: expected {'one' if name == 'batch' else 'some'} of Table "
                        f"3's {TABLE3_BATCHES}, got {got!r}")
    return tuple(i for i, b in enumerate(TABLE3_BATCHES) if b in batches)


def calibrate_zipf(grid=np.round(np.arange(0.0, 4.01, 0.05), 2), form: str = "token",
                   ar_cache: str = "best", link: str = "die", *, batches=None) -> dict:
    """Per model, the Zipf exponent of ``grid`` that minimises the squared log error of the
    Elastic-SD Phi_AR cells of Table 3's 4 GB rows (the only cells used; ``batches``: of
    those batch sizes only, default all); ``link`` the platforms' :attr:`Platform.link`."""
    xpu, ours = platform("xpu", "4gb", link=link), platform("ours", "4gb", link=link)
    idx = _batch_indices(batches)
    out = {}
    for model in TABLE3_MODELS:
        best = None
        for s in grid:
            err = 0.0
            for i, b in ((i, TABLE3_BATCHES[i]) for i in idx):
                base = EvalModel(model, xpu, "ar", batch=b, zipf=s, form=form).ar().seconds
                ar = EvalModel(model, ours, "elastic", batch=b, zipf=s, form=form,
                               ar_cache=ar_cache).ar().seconds
                err += math.log(base / ar / TABLE3_4GB[model]["elastic"][i][1]) ** 2
            if best is None or err < best[0]:
                best = (err, float(s))
        out[model] = best[1]
    return out


def _sd_cells(intra: float | None = None, *, zipf: dict | None = None, batches=None) -> tuple:
    """The xPU's AR step seconds per (model, batch) and our :class:`EvalModel` per (model,
    scheme, batch index) of Table 3's 4 GB rows (``zipf`` or :data:`ZIPF`, ``intra`` or
    :data:`INTRA_REQUEST`; ``batches``: those batch sizes only, default all): what
    :func:`calibrate_tree` and :func:`calibrate_intra` fit on."""
    xpu, ours = platform("xpu", "4gb"), platform("ours", "4gb")
    zipf = {**ZIPF, **(zipf or {})}
    base, models = {}, {}
    for model in TABLE3_MODELS:
        for i in _batch_indices(batches):
            b = TABLE3_BATCHES[i]
            base[model, b] = EvalModel(model, xpu, "ar", batch=b, zipf=zipf[model]).ar().seconds
            for scheme in SCHEMES:
                models[model, scheme, i] = EvalModel(model, ours, scheme, batch=b, intra=intra,
                                                     zipf=zipf[model])
    return base, models


def _sd_fit(cells, tree) -> tuple:
    """How well ``tree`` ``(depth, width, verify)`` fits every Phi_SD cell of Table 3's 4 GB
    rows (the paper's alpha) of ``cells`` (:func:`_sd_cells`), smaller is better: minus the
    cells within 15% of the paper's (issue 26's target), then the mean absolute error of the
    ratio from 1."""
    base, models = cells
    err = []
    for (model, scheme, i), em in models.items():
        b = TABLE3_BATCHES[i]
        alpha, _, paper = TABLE3_4GB[model][scheme][i]
        err.append(abs(base[model, b] / b / em.sd(alpha, *tree).per_token_s / paper - 1))
    err = np.array(err)
    return -int((err <= 0.15).sum()), float(err.mean())


def calibrate_intra(grid=np.round(np.arange(0.5, 1.001, 0.05), 2), tree=None, *,
                    zipf: dict | None = None, batches=None) -> float:
    """The intra-request exponent of ``grid`` that puts the most Phi_SD cells of Table 3's
    4 GB rows within 15% of the paper's, then the least mean absolute error (all schemes, the
    paper's alpha, ``zipf`` or :data:`ZIPF`; ``batches``: those batch sizes' cells only), at
    ``tree`` (default :data:`TREE`). What a fit to the paper would take: :data:`INTRA_REQUEST`
    is measured on the real traces instead (:func:`routing_exponents`; until the third session
    of 2026-12-05 it was this fit, refitted in turn with :func:`calibrate_tree`). AR steps do
    not depend on it."""
    tree = TREE if tree is None else tree
    return min((_sd_fit(_sd_cells(float(g), zipf=zipf, batches=batches), tree), float(g))
               for g in grid)[1]


def calibrate_tree(depths=None, widths=None, *, zipf: dict | None = None,
                   intra: float | None = None, batches=None) -> tuple:
    """The ``(depth, width, verify)`` of :func:`tree_grid` (``depths`` x ``widths``, default
    :data:`TREE_DEPTHS` x :data:`TREE_WIDTHS`, with every verify size from the depth to
    every node) that puts the most Phi_SD cells of Table 3's 4 GB rows within 15% of the
    paper's, then the least mean absolute error (all schemes, the paper's alpha, ``zipf`` or
    :data:`ZIPF`, ``intra`` or :data:`INTRA_REQUEST`; ``batches``: those batch sizes' cells
    only; :func:`_sd_fit`); the first of the grid's order on a tie. A few seconds."""
    cells = _sd_cells(intra, zipf=zipf, batches=batches)
    return min(tree_grid(depths, widths), key=lambda t: _sd_fit(cells, t))


def cross_validation_fold(batch: int, alpha: str = "paper") -> dict:
    """One fold of :func:`cross_validate`: the fit refitted without Table 3's ``batch`` cells
    (Zipf exponents, then the SD tree; :data:`INTRA_REQUEST` is measured on the real traces,
    not fitted, so it stays; with ``alpha`` ``"model"`` also the alpha model,
    :func:`calibrate_alpha`, whose Elastic-SD alphas then replace the paper's as the
    prediction's input) and that batch's rows predicted with it.
    Returns ``{"batch", "zipf", "tree", "intra", "alpha_model", "summary", "rows"}``
    (``alpha_model``: the refitted ``(alpha_max, beta)`` per model, or None);
    :class:`UserError` for a batch Table 3 does not have or another ``alpha``."""
    _batch_indices((batch,), "batch")
    if alpha not in ("paper", "model"):
        raise UserError(f"alpha: expected paper or model, got {alpha!r}")
    train = tuple(x for x in TABLE3_BATCHES if x != batch)
    zipf = calibrate_zipf(batches=train)
    intra = INTRA_REQUEST
    tree = calibrate_tree(zipf=zipf, intra=intra, batches=train)
    params, alphas = None, None
    if alpha == "model":
        params = calibrate_alpha(zipf=zipf, batches=train)
        alphas = model_alphas("4gb", zipf=zipf, params=params)
    rows = [r for r in table3("4gb", zipf=zipf, tree=tree, intra=intra, alphas=alphas)
            if r["batch"] == batch]
    return {"batch": batch, "zipf": zipf, "tree": tree, "intra": intra, "alpha_model": params,
            "summary": summary(rows), "rows": rows}


def cross_validate(say=None, alpha: str = "paper") -> dict:
    """Leave-one-batch-out cross-validation of Table 3's 4 GB fit: for each batch size ``b``
    of :data:`TABLE3_BATCHES`, every fitted number is refitted on the other three batch
    sizes' cells alone (the Zipf exponents per model on their Elastic-SD Phi_AR cells,
    :func:`calibrate_zipf`; then the SD tree on every scheme's Phi_SD cells,
    :func:`calibrate_tree`; :data:`INTRA_REQUEST` is measured on the real traces, not fitted),
    and batch ``b``'s 32 cells (4 models x 4 schemes, Phi_AR and Phi_SD, the paper's alpha) are
    predicted with them: out-of-sample cells, where :func:`summary` of :func:`table3` is a
    fit residual. ``alpha="model"``: the alpha model is refitted per fold too and predicts the
    held-out Elastic-SD alphas (``alpha_error``: their mean absolute error against the paper's; the
    other schemes' alphas stay the paper's, as in ``table3 --alpha model``). What stays in-sample:
    the model's structure (which rules, which caches), chosen while reading every cell
    (docs/paper.md section 4).

    Returns ``{"alpha", "folds": [...], "held_out": summary, "in_sample": summary}``: per fold
    the held-out batch, the fitted ``zipf`` and ``tree``, ``intra`` (the measured one) and
    ``alpha_model`` (None with the paper's alpha) and the :func:`summary` of its held-out rows;
    ``held_out`` the :func:`summary` of all 128 held-out cells together (its Elastic-SD
    best-mode mean over the held-out points); ``in_sample`` the shipped fit's (with
    :func:`model_alphas` for ``alpha="model"``), then with ``alpha="model"`` also
    ``alpha_error`` and ``alpha_error_in_sample``, the Elastic-SD alphas' mean absolute error
    against the paper's. ``say``: a callable given a line of progress per fold. About 25 s of
    CPU."""
    folds, rows_out = [], []
    for b in TABLE3_BATCHES:
        fold = cross_validation_fold(b, alpha)
        rows_out += fold.pop("rows")
        folds.append(fold)
        if say:
            zipf, tree, intra = fold["zipf"], fold["tree"], fold["intra"]
            s = folds[-1]["summary"]
            say(f"held-out batch {b}: {s['within_15']} of {s['cells']} cells within 15%, "
                f"mean |ratio - 1| {s['mean_abs_error']:.3f} (tree {tree}, intra {intra}, "
                f"Zipf {zipf})")
    out = {"alpha": alpha, "folds": folds, "held_out": summary(rows_out),
           "in_sample": summary(table3("4gb", alphas=model_alphas("4gb") if alpha == "model"
                                       else None))}
    if alpha == "model":
        el = [r for r in rows_out if r["scheme"] == "elastic"]
        out["alpha_error"] = float(np.mean([abs(r["alpha"] - r["paper_alpha"]) for r in el]))
        out["alpha_error_in_sample"] = float(np.mean(
            [abs(r["alpha"] - r["paper_alpha"])
             for r in table3("4gb", alphas=model_alphas("4gb")) if r["scheme"] == "elastic"]))
    return out


# == the cache model against an exact LRU on a real trace ==========================================

def _pick_counts(requests, layers: int, experts: int) -> tuple:
    """``(counts [layers, experts], tokens [layers])``: each expert's picks and the tokens
    present at each layer over ``requests`` (:class:`~.trace.RequestRouting`-like: ``ids``
    ``[T, layers, k]``, ``present`` ``[T, layers]``)."""
    counts, tokens = np.zeros((layers, experts)), np.zeros(layers)
    for r in requests:
        for j in range(layers):
            ids = r.ids[:, j][r.present[:, j]]
            tokens[j] += len(ids)
            np.add.at(counts[j], ids.ravel().astype(np.int64), 1)
    return counts, tokens


def _as_trace(trace, model=None, name: str = "trace"):
    """``trace`` as a :class:`~.trace.RoutingTrace`: one already, or a path read by the trace
    module's readers (``.npz``: :meth:`~.trace.RoutingTrace.load`; else a vLLM-style JSONL
    log, :func:`~.trace.import_vllm_jsonl` with ``model``). :class:`UserError` (a
    :class:`~.trace.TraceError` for a bad file) otherwise."""
    import os
    from pathlib import Path
    from .trace import RoutingTrace, import_vllm_jsonl
    if isinstance(trace, RoutingTrace) or (callable(getattr(trace, "requests", None))
                                            and hasattr(trace, "num_experts")):
        return trace                            # a RoutingTrace, or one alike (its requests)
    if isinstance(trace, (str, os.PathLike)):
        path = Path(trace)
        if path.suffix.lower() == ".npz":
            return RoutingTrace.load(path)
        return import_vllm_jsonl(path, model=model)[0]
    raise UserError(f"{name}: expected a RoutingTrace or the path of a routing log (.jsonl) "
                    f"or trace (.npz), got {type(trace).__name__}")


def _pick_matrix(p, name: str = "p") -> np.ndarray:
    """``p`` as a float ``[layers, experts]`` array of pick probabilities: 2-D, at least one
    layer and expert, finite, in [0, 1], every layer's sum positive; :class:`UserError`
    naming ``name`` otherwise."""
    try:
        a = np.asarray(p, dtype=float)
    except (ValueError, TypeError):
        raise UserError(f"{name}: expected a [layers, experts] array of pick probabilities, "
                        f"got {type(p).__name__}") from None
    if a.ndim != 2 or 0 in a.shape:
        raise UserError(f"{name}: expected a [layers, experts] array of pick probabilities, "
                        f"got shape {a.shape}")
    if not np.isfinite(a).all() or a.min() < 0 or a.max() > 1:
        raise UserError(f"{name}: expected finite pick probabilities in [0, 1], got values in "
                        f"[{np.nanmin(a):g}, {np.nanmax(a):g}]" if np.isfinite(a).any() else
                        f"{name}: expected finite pick probabilities in [0, 1]")
    if not (a.sum(axis=1) > 0).all():
        raise UserError(f"{name}: layer {int(np.argmin(a.sum(axis=1) > 0))} has no pick "
                        f"(expected a positive sum per layer)")
    return a


def trace_popularity(trace, phase: str = "decode") -> np.ndarray:
    """Per-token pick probabilities ``[layers, experts]`` of a routing trace: picks of each
    expert over the tokens present at each layer (a row sums to ``top_k``; the measured
    counterpart of Section 7's Zipf popularity). ``trace``: a
    :class:`~.trace.RoutingTrace` or the path of one (``.npz``) or of a routing log
    (``.jsonl``, imported with no model: experts and layers from the data). Raises
    :class:`UserError` for anything else, a layer with no routed token of ``phase`` and an
    unknown ``phase``; :class:`~.trace.TraceError` for a bad file."""
    trace = _as_trace(trace)
    counts, tokens = _pick_counts(trace.requests(phase), len(trace.layer_ids),
                                  trace.num_experts)
    if not tokens.all():
        raise UserError("trace: a layer has no routed token")
    return counts / tokens[:, None]


def che_global(p: np.ndarray, slots: int, batch: int) -> float:
    """Hit rate of one LRU over every (layer, expert) MSB slice of ``slots`` slots under Che's
    approximation, a step of ``batch`` tokens accessing each layer's distinct experts once:
    expert ``(l, i)`` is accessed in a step with ``a = 1 - (1 - p)^batch``, cached with ``h =
    1 - exp(-a T)``, ``T`` (in steps) solving ``sum h = slots``; hit rate ``sum(a h) / sum(a)``
    (the step form of :meth:`ExpertPopularity.step`, over all layers at once as
    :class:`~.hbcache.HBExpertCache` is one LRU; Section 7, "Inference Framework"). 1.0 when
    the slots hold every expert a step can access.

    ``p``: a ``[layers, experts]`` array of pick probabilities in [0, 1] (finite, a positive
    sum per layer: :func:`trace_popularity`); ``slots``: MSB slices, a finite number >= 0;
    ``batch``: tokens a step, an integer >= 1. Raises :class:`UserError` naming the
    parameter otherwise."""
    p = _pick_matrix(p, "p")
    if not is_int(batch) or batch < 1:
        raise UserError(f"batch: expected an integer >= 1 (tokens a step), got {batch!r}")
    slots = _count("slots", slots)
    a = (1 - (1 - p) ** int(batch)).ravel()
    if slots >= np.count_nonzero(a):            # every expert a step can access fits
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(2100):                        # 2 ** 2100: past any float's reach
        if np.sum(1 - np.exp(-a * hi)) >= slots:
            break
        hi *= 2
    else:
        raise UserError("p: pick probabilities too small for Che's characteristic time")
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.sum(1 - np.exp(-a * mid)) < slots else (lo, mid)
    h = 1 - np.exp(-a * hi)
    return float((a * h).sum() / a.sum())


def fit_zipf(p: np.ndarray, grid=np.round(np.arange(0.0, 4.01, 0.01), 2)) -> float:
    """The Zipf exponent whose :class:`ExpertPopularity` best matches (least squares) the
    layers' pick probabilities ``p [layers, experts]`` sorted hottest first, averaged (top-k:
    the rows' mean sum, rounded; the Zipf law of Section 7's cache model, :data:`ZIPF`).
    Raises :class:`UserError` naming ``p`` unless it is a 2-D
    array of finite probabilities in [0, 1] with a positive sum per layer and a mean sum of
    1 .. experts, and naming ``grid`` unless it holds exponents in [0, :data:`ZIPF_MAX`]."""
    p = _pick_matrix(p, "p")
    L, E = p.shape
    k = int(round(p.sum(axis=1).mean()))
    if not 1 <= k <= E:
        raise UserError(f"p: the layers' picks sum to {p.sum(axis=1).mean():g} on average: "
                        f"expected a top-k of 1 .. {E} (the experts)")
    grid = np.asarray(grid, dtype=float).ravel() if not isinstance(grid, str) else None
    if grid is None or not grid.size or not np.isfinite(grid).all() \
            or grid.min() < 0 or grid.max() > ZIPF_MAX:
        raise UserError(f"grid: expected Zipf exponents in [0, {ZIPF_MAX}]")
    target = np.sort(p, axis=1)[:, ::-1].mean(axis=0)
    return float(min(grid, key=lambda s: np.sum((ExpertPopularity(E, k, s).p - target) ** 2)))


def cache_check(trace, model, slots_per_layer=(1, 2, 3, 4, 5, 6), batches=(1, 2)) -> list:
    """Che's approximation against the exact trace-driven LRU (:func:`~.hbcache.replay` through
    an :class:`~.hbcache.HBExpertCache` of ``slots_per_layer x layers`` MSB slices, demand
    admission) on ``trace``'s decode routing: a row per (batch, slots) with the exact hit rate
    (``exact``: one LRU over all layers; ``exact_layer``: one LRU of ``slots_per_layer`` a
    layer, :func:`~.hbcache.replay_per_layer`, the structure of :class:`EvalModel`'s cache),
    Che's from the trace's own per-layer popularity (``che_trace``) and from a Zipf law fitted
    to it (``che_zipf``: a popularity of the form Table 3's models have, in Che's step form
    over all layers, :func:`che_global`), and the Zipf exponent. Hit rates.

    ``trace``: a :class:`~.trace.RoutingTrace` or a path (as :func:`trace_popularity`; a log
    imported with ``model``); ``slots_per_layer``: integers >= 0; ``batches``: integers >= 1.
    Raises :class:`UserError` naming the parameter otherwise, for an unknown model, or a
    trace whose layers or experts are not the model's (:func:`~.hbcache.replay`)."""
    from .hbcache import HBExpertCache, replay, replay_per_layer
    from .models import model_preset
    slots_per_layer = _int_seq("slots_per_layer", slots_per_layer, 0)
    batches = _int_seq("batches", batches, 1)
    m = model_preset(model)
    trace = _as_trace(trace, m)
    p = trace_popularity(trace)
    s = fit_zipf(p)
    pz = np.tile(ExpertPopularity(m.routed_experts, m.top_k, s).p, (p.shape[0], 1))
    rows = []
    for b in batches:
        for n in slots_per_layer:
            slots = n * p.shape[0]
            cache = HBExpertCache(capacity_bytes=slots * m.expert_msb_bytes, model=m)
            exact = replay(trace, cache, batch=b).hit_rate
            rows.append({"batch": b, "slots_per_layer": n, "exact": exact,
                         "exact_layer": replay_per_layer(trace, m, n, batch=b).hit_rate,
                         "che_trace": che_global(p, slots, b),
                         "che_zipf": che_global(pz, slots, b), "zipf": s})
    return rows


def routing_exponents(traces, windows=(2, 4, 8, 16), batches=(2, 3, 4), *,
                      baseline: str = "pooled") -> dict:
    """How alike the tokens of one request, and of different requests, route in real routing
    ``traces`` (a list of :class:`~.trace.RoutingTrace` of one model, or their paths;
    decode tokens): the measured
    counterpart of :data:`INTRA_REQUEST` (``routed_tokens``: a step's ``n`` rows of one request
    touch the distinct experts of ``n ** intra`` independent tokens) and of the model's
    assumption that different requests route independently.

    Independent tokens are drawn from a per-layer popularity ``p`` (pick probabilities,
    :func:`trace_popularity`): ``baseline="pooled"``, every trace's requests together (a
    workload mixing the traces' tasks, as MT-Bench mixes eight categories: the model's one
    Zipf law a workload), or ``"trace"``, each request's own trace (each trace a workload of
    one task). A group of ``n`` such tokens touches ``sum_e 1 - prod_i (1 - p_ie)`` distinct
    experts a layer on average; ``n_eff`` is the number ``m`` of independent tokens of the
    group's mixture (``prod_i`` taken to the power ``m / n``) that touch as many as measured.
    ``intra``: each request's decode tokens in non-overlapping windows of ``n`` consecutive
    positions (``windows``); ``inter``: one token of each of ``n`` requests (every combination
    of ``batches`` requests) at the same decode position. Each row gives the mean distinct
    experts a layer, the independent expectation, ``n_eff`` and ``log n_eff / log n``;
    ``intra_exponent`` and ``inter_exponent`` are the least-squares slopes of ``log n_eff`` on
    ``log n`` (through the origin) over the rows. A layer is counted where every token of the
    group is present. ``windows`` and ``batches``: non-empty sequences of integers >= 2
    (tokens a group). :class:`UserError` naming the parameter for another ``traces``,
    ``windows``, ``batches`` or ``baseline``, fewer than two requests or no complete group."""
    import itertools
    if not isinstance(baseline, str) or baseline not in ("pooled", "trace"):
        raise UserError(f"baseline: expected pooled or trace, got {baseline!r}")
    windows = _int_seq("windows", windows, 2)
    batches = _int_seq("batches", batches, 2)
    if not isinstance(traces, (list, tuple)):
        raise UserError(f"traces: expected a list of RoutingTrace (or paths), got "
                        f"{type(traces).__name__}")
    traces = [_as_trace(t, name="traces") for t in traces]
    reqs, src = [], []
    for k, t in enumerate(traces):
        for r in t.requests("decode"):
            reqs.append(r)
            src.append(k if baseline == "trace" else 0)
    if len(reqs) < 2:
        raise UserError(f"routing_exponents: expected decode tokens of at least 2 requests, "
                        f"got {len(reqs)}")
    L = reqs[0].ids.shape[1]
    E = traces[0].num_experts
    logq = {}
    for s in set(src):
        counts, tokens = _pick_counts([r for r, rs in zip(reqs, src) if rs == s], L, E)
        p = counts / np.maximum(tokens, 1)[:, None]
        logq[s] = np.log1p(-np.minimum(p, 1 - 1e-12))

    def measure(groups):
        """Mean distinct experts a layer over ``groups`` (lists of (request, position)) and
        the count of each (baselines, layer) the groups' layers drew from."""
        got, keys = [], {}
        for g in groups:
            ok = np.logical_and.reduce([reqs[i].present[t] for i, t in g])
            ids = np.stack([reqs[i].ids[t] for i, t in g])            # [n, L, k]
            key = tuple(sorted(src[i] for i, _ in g))
            for j in np.flatnonzero(ok):
                got.append(len(np.unique(ids[:, j])))
                keys[key, j] = keys.get((key, j), 0) + 1
        return (float(np.mean(got)), keys) if got else (None, keys)

    def expected(m, n, keys):
        tot = sum(c * np.sum(-np.expm1(m / n * sum(logq[s][j] for s in key)))
                  for (key, j), c in keys.items())
        return float(tot / sum(keys.values()))

    def n_eff(d, n, keys):
        lo, hi = 0.0, 1.0
        while expected(hi, n, keys) < d and hi < 1e6:
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if expected(mid, n, keys) < d else (lo, mid)
        return (lo + hi) / 2

    out = {"intra": [], "inter": []}
    for n in windows:
        out["intra"].append((n, measure([[(i, t) for t in range(t0, t0 + n)]
                                         for i, r in enumerate(reqs)
                                         for t0 in range(0, len(r.positions) - n + 1, n)])))
    for n in batches:
        groups = []
        for combo in itertools.combinations(range(len(reqs)), n):
            T = min(len(reqs[i].positions) for i in combo)
            groups += [[(i, t) for i in combo] for t in range(T)]
        out["inter"].append((n, measure(groups)))
    res = {"baseline": baseline}
    for kind in ("intra", "inter"):
        rows = []
        for n, (d, keys) in out[kind]:
            if d is None:
                continue
            ne = n_eff(d, n, keys)
            rows.append({"n": n, "distinct": d, "independent": expected(n, n, keys),
                         "n_eff": ne, "exponent": math.log(ne) / math.log(n)})
        if not rows:
            raise UserError(f"routing_exponents: no complete {kind}-request group of "
                            f"{out[kind][0][0]} or more tokens in the traces")
        x = np.log([r["n"] for r in rows])
        y = np.log([r["n_eff"] for r in rows])
        res[kind] = rows
        res[f"{kind}_exponent"] = float(x @ y / (x @ x))
    res["requests"] = len(reqs)
    return res


# == Fig. 12: memory mapping and time breakdown per SD scheme ======================================

#: The units of :func:`fig12`'s row fields (its ``--json`` carries them).
FIG12_UNITS = {"hb": "GB (10^9 bytes; the table prints GiB)", "ext": "GB (10^9 bytes)",
               "draft_ms": "ms an iteration", "verify_ms": "ms an iteration",
               "verify_msb_ms": "ms an iteration", "verify_whole_ms": "ms an iteration",
               "ms_token": "ms a token (all sequences)",
               "alpha": "acceptance rate the SD step ran with",
               "depth": "SD tree depth (draft levels)",
               "width": "SD tree width (candidates a level)",
               "verify": "tree nodes verified a sequence an iteration",
               "verify_form": "what the verify step's expert cache holds: msb, whole or none",
               "accept": "tokens a sequence an SD iteration yields (expected: the accepted "
                         "prefix and the bonus token, accepted_tokens)",
               "phi_sd": "SD-mode tokens/s over the xPU's AR at the same batch (times)",
               "hb_size": "fig13: the HB capacity of the row (4gb or 8gb)"}


def fig12(hb: str = "8gb", model: str = "qwen3-30b-a3b", batch: int = 16, *,
          tree=TREE, alphas: dict | None = None, zipf: dict | None = None,
          form: str = "token", link: str = "die", placement: str = "paper",
          pool_hb: str | None = None) -> list:
    """Fig. 12 (Qwen3-30B-A3B, MT-Bench, batch 16, 8 GB in the paper): per SD scheme, where the
    bytes live and what an SD iteration costs. A dict per scheme: ``hb`` (decimal GB, 10^9
    bytes, in HB by kind:
    static weights, KV cache, draft model or copy, expert cache), ``ext`` (GB in EXT by
    :meth:`EvalModel.ext_footprint`'s parts: every weight and the KV HB does not hold),
    ``alpha`` (the paper's 4 GB alpha at this batch unless ``alphas[scheme]``), ``accept``
    (tokens an iteration a sequence), ``draft_ms``
    and ``verify_ms`` (an iteration), ``verify_form`` (the verify's expert cache,
    :meth:`EvalModel._verify_step`: ``"msb"``, ``"whole"`` or ``"none"``), ``verify_msb_ms``
    and ``verify_whole_ms`` (the verify with MSB slices cached and with whole INT8 experts:
    bit-sliced against conventional caching, Fig. 13), ``ms_token`` and ``phi_sd``. ``zipf``,
    ``form``,
    ``tree``, ``link``, ``placement`` and ``pool_hb`` as in :func:`table3` (``zipf`` may also
    name ``model``). Raises :class:`UserError` naming the parameter for a ``batch`` not a positive
    integer, an ``alphas`` key not a scheme of :data:`SCHEMES`, a scheme without an alpha
    (``model`` and ``batch`` not in Table 3), a ``zipf`` key not a model, and as
    :func:`table3`."""
    if not is_int(batch) or batch < 1:
        raise UserError(f"batch: expected a positive integer, got {batch!r}")
    batch = int(batch)
    tree = _check_tree(tree)
    if alphas is not None:
        if not isinstance(alphas, dict):
            raise UserError(f"alphas: expected {{scheme: alpha}}, got {type(alphas).__name__}")
        _check_keys("alphas", alphas, "schemes", (), SCHEMES)
    check_pool_hb(pool_hb, hb)
    i = TABLE3_BATCHES.index(batch) if batch in TABLE3_BATCHES else None
    s = _zipf_map(zipf, tuple(ZIPF) + (() if model in ZIPF else (model,))).get(model)
    xpu, ours = platform("xpu", hb, link=link), platform("ours", hb, link=link)
    base = EvalModel(model, xpu, batch=batch, zipf=s, form=form).ar().seconds
    out = []
    for scheme in SCHEMES:
        if alphas and scheme in alphas:
            alpha = alphas[scheme]
        elif i is not None and model in TABLE3_4GB:
            alpha = TABLE3_4GB[model][scheme][i][0]
        else:
            raise UserError(f"fig12: no alpha for {model} {scheme} at batch {batch}; pass alphas")
        pool = (pool_slots_at(pool_hb, model, batch=batch, zipf=s, form=form,
                              placement=placement, link=link) if scheme == "elastic" else None)
        em = EvalModel(model, ours, scheme, batch=batch, zipf=s, form=form,
                       placement=placement, pool_slots=pool)
        sd = em.best_sd(alpha) if tree == "best" else em.sd(alpha, *tree)
        m = em.m
        draft_bytes = em.draft_bytes
        hb_map = {"static": em.static_bytes * em.hb_static, "kv": em.kv_bytes * em.hb_kv,
                  # (Quant-SD's: its static 4-bit copy and its hottest experts' 4-bit copies)
                  "draft": draft_bytes * em.draft_in_hb
                  + (em.draft_cache_bytes if em.draft_slots is not None else 0.0),
                  "expert cache": em.slots * m.moe_layers * em.slot_bytes}
        ext_map = em.ext_footprint()
        rows_v = batch * (1 + sd.verify)
        out.append({"scheme": scheme, "alpha": alpha, "depth": sd.depth, "width": sd.width,
                    "verify": sd.verify, "verify_form": sd.verify_form,
                    "verify_msb_ms": em.step(rows_v, phase="verify").seconds * 1e3,
                    "verify_whole_ms": em.verify_whole(rows_v).seconds * 1e3,
                    "hb": {k: v / 1e9 for k, v in hb_map.items()},
                    "ext": {k: v / 1e9 for k, v in ext_map.items()},
                    "accept": sd.tokens, "draft_ms": sd.draft_s * 1e3,
                    "verify_ms": sd.verify_s * 1e3, "ms_token": sd.per_token_s * 1e3,
                    "phi_sd": base / batch / sd.per_token_s})
    return out


# == Fig. 13: draft and verify latency by batch and HB capacity =================================

def fig13(model: str = "qwen3-30b-a3b", hbs=HB_SIZES, batches=TABLE3_BATCHES, *,
          tree=TREE, zipf: dict | None = None, form: str = "token", link: str = "die",
          placement: str = "paper") -> list:
    """Fig. 13 (Qwen3-30B-A3B, MT-Bench; Section 7.1): each SD scheme's draft and verify
    latency an iteration by batch and HB capacity, and the verify with bit-sliced (MSB
    slices) against conventional (whole INT8 experts) caching. One :func:`fig12` row (ms an
    iteration, the paper's 4 GB alphas) per ``hbs`` x ``batches`` x scheme, with ``hb_size``
    (the HB's, ``"4gb"`` or ``"8gb"``; ``hb`` is the row's bytes in HB) and ``batch``
    added. ``hbs``: HB sizes of :func:`platform`; ``batches``: Table 3's batch sizes (the
    alphas); the rest as :func:`fig12`. Raises :class:`UserError` naming the
    parameter for an empty or unknown ``hbs`` or ``batches`` and as :func:`fig12`."""
    if (isinstance(hbs, str) or not hasattr(hbs, "__iter__") or not tuple(hbs)
            or not all(isinstance(h, str) and h in HB_SIZES for h in hbs)
            or len(set(hbs)) != len(tuple(hbs))):
        raise UserError(f"hbs: expected a non-empty sequence of HB sizes "
                        f"({', '.join(HB_SIZES)}), each once, got {hbs!r}")
    batches = _int_seq("batches", batches, 1)
    if not set(batches) <= set(TABLE3_BATCHES):
        raise UserError(f"batches: expected Table 3's batch sizes "
                        f"({', '.join(map(str, TABLE3_BATCHES))}: the paper's alphas), got "
                        f"{batches!r}")
    out = []
    for hb in hbs:
        for b in batches:
            out += [{**r, "hb_size": hb, "batch": b}
                    for r in fig12(hb, model, b, tree=tree, zipf=zipf, form=form, link=link,
                                   placement=placement)]
    return out


def fig13_summary(rows) -> dict:
    """The paper's Fig. 13 claims checked on :func:`fig13`'s rows, per (hb_size, batch):
    ``elastic_over_eagle`` (Elastic-SD's verify over EAGLE-SD's in the form it chose: the
    schemes, whose caches differ by EAGLE-SD's draft head; above 1 at 8 GB and small
    batches, "the lower verify cost of EAGLE-SD in the 8GB configuration"),
    ``eagle_msb_over_whole`` (EAGLE-SD's verify with MSB slices cached over with whole
    experts, one HB size: below 1, bit-sliced caching verifies faster, the paper's "when HB
    capacity is limited"; above 1, conventional caching does), and ``eagle_form`` (what
    EAGLE-SD caches there). A dict ``{hb_size: {batch: {...}}}``. Raises :class:`UserError`
    for rows without both schemes at a point."""
    by = {}
    for r in rows:
        by.setdefault((r["hb_size"], r["batch"]), {})[r["scheme"]] = r
    out = {}
    for (hb, b), d in by.items():
        if "eagle" not in d or "elastic" not in d:
            raise UserError(f"fig13_summary: no EAGLE-SD and Elastic-SD rows at {hb}, batch {b}")
        e = d["eagle"]
        out.setdefault(hb, {})[b] = {
            "elastic_over_eagle": d["elastic"]["verify_ms"] / e["verify_ms"],
            "eagle_msb_over_whole": e["verify_msb_ms"] / e["verify_whole_ms"],
            "eagle_form": e["verify_form"]}
    return out


# == Fig. 14: speedup over xPU across platforms ===================================================

#: The SD scheme each platform runs in SD mode (Section 7: HB-xPU and the prior accelerators
#: with EAGLE-based SD, ours with Elastic-SD).
PLATFORM_SCHEME = {"xpu": "eagle", "xpu-pim": "eagle", "xpu-logicpim": "eagle",
                   "xpu-nmp": "eagle", "hb-xpu": "eagle", "ours": "elastic"}
#: Section 7.2 at 8 GB, over four models, four datasets and batch 1-16: ours over xPU 6.6x
#: (speedup, up to 12.0x); over the strongest prior baseline 2.2x (up to 9.9x). Fig. 15
#: (MT-Bench, 8 GB): energy a token 4.4x (up to 7.2x) less than xPU, 1.4x (up to 4.9x) less
#: than the best performing prior.
PAPER_FIG14 = {"over_xpu": 6.6, "over_xpu_max": 12.0, "over_best_prior": 2.2,
               "over_best_prior_max": 9.9}
#: Section 7.2: "xPU-PIM performs well for Qwen3 and GLM, while xPU-NMP is strongest for DS2
#: and GPT-OSS" (the strongest prior platform per model, :func:`fig14_summary`).
PAPER_STRONGEST_PRIOR = {"qwen3-30b-a3b": "xpu-pim", "glm-4.7-flash": "xpu-pim",
                         "deepseek-v2-lite": "xpu-nmp", "gpt-oss-20b": "xpu-nmp"}
PAPER_FIG15 = {"over_xpu": 4.4, "over_xpu_max": 7.2, "over_best_prior": 1.4,
               "over_best_prior_max": 4.9}


def fig14(hb: str = "8gb", *, tree=TREE, zipf: dict | None = None,
          ar_cache: str = "best", form: str = "token", alphas: dict | None = None,
          link: str = "die", placement: str = "paper",
          dram_background: str | None = None,
          nm_mac_scale: float = NEAR_MEMORY_MAC_SCALE, pool_hb: str | None = None) -> list:
    """Fig. 14 (MT-Bench alphas only: the other datasets' are not in this copy of the paper):
    a row per (model, platform, batch) with its AR and SD speedups over xPU AR at the same
    batch, the best of the two (``mode``), the HB + EXT access energy a token of that mode
    (``pj_token``, pJ) and its whole energy a token by Fig. 15's components (``energy``:
    :data:`ENERGY_PARTS` -> pJ, :meth:`StepCost.energy`), and the xPU AR baseline's
    (``xpu_pj_token``, ``xpu_energy``). ``zipf``, ``ar_cache``, ``form``, ``tree``, ``link``,
    ``placement``, ``pool_hb`` and ``alphas`` (default the paper's 4 GB ones) as in
    :func:`table3`;
    ``dram_background`` and ``nm_mac_scale`` as in :func:`platform` (the static energy's DRAM
    part; the near-memory units' MAC energy). :func:`fig15_summary` reads the same rows.
    Raises :class:`UserError` as :func:`table3` (``alphas`` needs the schemes of
    :data:`PLATFORM_SCHEME` only)."""
    tree = _check_tree(tree)
    _check_alphas(alphas, tuple(dict.fromkeys(PLATFORM_SCHEME.values())))
    check_pool_hb(pool_hb, hb)
    base_plat = platform("xpu", hb, link=link, dram_background=dram_background,
                         nm_mac_scale=nm_mac_scale)
    zipf = _zipf_map(zipf, TABLE3_MODELS)
    out = []
    for model in TABLE3_MODELS:
        for i, b in enumerate(TABLE3_BATCHES):
            base = EvalModel(model, base_plat, batch=b, zipf=zipf[model], form=form).ar()
            t0 = base.seconds / b
            base_e = {k: v / b for k, v in base.energy(base_plat).items()}
            for name in PLATFORMS:
                plat = platform(name, hb, link=link, dram_background=dram_background,
                                nm_mac_scale=nm_mac_scale)
                scheme = PLATFORM_SCHEME[name]
                pool = (pool_slots_at(pool_hb, model, batch=b, zipf=zipf[model], form=form,
                                      placement=placement, link=link)
                        if scheme == "elastic" else None)
                em = EvalModel(model, plat, scheme, batch=b, zipf=zipf[model],
                               ar_cache=ar_cache, form=form, placement=placement,
                               pool_slots=pool)
                ar = em.ar()
                alpha = (alphas[model][scheme][i] if alphas
                         else TABLE3_4GB[model][scheme][i][0])
                sd = em.best_sd(alpha) if tree == "best" else em.sd(alpha, *tree)
                phi_ar, phi_sd = t0 / (ar.seconds / b), t0 / sd.per_token_s
                e_ar = ar.energy_pj(plat) / b
                sd_mode = phi_sd > phi_ar
                out.append({"model": model, "platform": name, "batch": b, "scheme": scheme,
                            "phi_ar": phi_ar, "phi_sd": phi_sd,
                            "best": max(phi_ar, phi_sd),
                            "mode": "sd" if sd_mode else "ar",
                            "pj_token": sd.energy_pj_per_token if sd_mode else e_ar,
                            "energy": (dict(sd.energy_per_token) if sd_mode else
                                       {k: v / b for k, v in ar.energy(plat).items()}),
                            "xpu_pj_token": base.energy_pj(base_plat) / b,
                            "xpu_energy": base_e})
    return out


def fig14_summary(rows) -> dict:
    """Over (model, batch): ours against xPU and against the strongest prior platform of each
    point (:func:`best_prior`; speedup of the best mode, mean and max), the access energy (HB
    and EXT) a token of ours' best mode against xPU AR's (mean; a near-memory unit's reads
    inside its LPDDR5 are counted in :func:`fig15_summary`, not here), ours against HB-xPU
    (:data:`ABLATION_PLATFORM`, mean and min of the best-mode ratio), each platform's mean
    best-mode speedup, and the strongest prior platform per model (``strongest_prior``: the
    one strongest at most of its batches, ties to the larger mean best mode) beside the
    paper's (:data:`PAPER_STRONGEST_PRIOR`), and ours over the platform the paper names
    strongest for each model (``speedup_over_paper_prior``, mean and max over the points of
    the models it names; None without one). Raises :class:`UserError` as :func:`by_point`."""
    pts = by_point(rows)
    sp_x, sp_p, en_x, sp_h, sp_n = [], [], [], [], []
    wins = {}
    for (model, _), d in pts.items():
        o, bestp = d["ours"], best_prior(d)
        wins.setdefault(model, []).append(bestp)
        sp_x.append(o["best"])
        sp_p.append(o["best"] / d[bestp]["best"])
        if model in PAPER_STRONGEST_PRIOR:
            sp_n.append(o["best"] / d[PAPER_STRONGEST_PRIOR[model]]["best"])
        sp_h.append(o["best"] / d[ABLATION_PLATFORM]["best"])
        en_x.append(o["xpu_pj_token"] / o["pj_token"])
    mean_best = {p: float(np.mean([d[p]["best"] for d in pts.values()])) for p in PLATFORMS}
    by_model = {m: {p: float(np.mean([d[p]["best"] for (mm, _), d in pts.items() if mm == m]))
                    for p in PRIOR_PLATFORMS} for m in wins}
    strongest = {m: max(PRIOR_PLATFORMS, key=lambda p: (w.count(p), by_model[m][p]))
                 for m, w in wins.items()}
    return {"speedup_over_xpu": float(np.mean(sp_x)),
            "speedup_over_xpu_max": float(np.max(sp_x)),
            "speedup_over_best_prior": float(np.mean(sp_p)),
            "speedup_over_best_prior_max": float(np.max(sp_p)),
            "speedup_over_paper_prior": float(np.mean(sp_n)) if sp_n else None,
            "speedup_over_paper_prior_max": float(np.max(sp_n)) if sp_n else None,
            "speedup_over_hb_xpu": float(np.mean(sp_h)),
            "speedup_over_hb_xpu_min": float(np.min(sp_h)),
            "energy_over_xpu": float(np.mean(en_x)),
            "mean_best": mean_best, "strongest_prior": strongest,
            "paper_strongest_prior": {m: PAPER_STRONGEST_PRIOR.get(m) for m in strongest}}


#: The prior platforms of Figs. 14 and 15, the "prior memory-centric accelerators" of Section
#: 7.2 (PIM, LogicPIM, NMP): the paper names the strongest of them per model (xPU-PIM for Qwen3
#: and GLM, xPU-NMP for DS2 and GPT-OSS, :data:`PAPER_STRONGEST_PRIOR`), never HB-xPU, and its
#: "2.2x over the strongest prior baseline (up to 9.9x)" is implausible over HB-xPU, which has
#: the same HB and logic die as ours (docs/paper.md section 6 gives the sentences for and
#: against this reading). HB-xPU is ours without bit-sliced MACs and Elastic-SD
#: (Section 7: "Ours extends HB-xPU with bit-sliced MACs and Elastic-SD"), reported apart
#: (:data:`ABLATION_PLATFORM`). Until 2026-12-03 it counted as a prior platform, and the
#: comparison read 0.91x (docs/paper.md section 6).
PRIOR_PLATFORMS = ("xpu-pim", "xpu-logicpim", "xpu-nmp")
#: The platform ours extends (Section 7): ours against it is the gain of the bit-sliced MACs
#: and Elastic-SD alone.
ABLATION_PLATFORM = "hb-xpu"


def by_point(rows) -> dict:
    """:func:`fig14` rows as ``{(model, batch): {platform: row}}``; raises :class:`UserError`
    on no rows, a row that is not one of fig14's or a point without every platform."""
    pts = {}
    for r in rows:
        if not isinstance(r, dict) or any(k not in r for k in ("model", "batch", "platform")):
            raise UserError("Fig. 14 rows: expected fig14's rows (dicts with 'model', 'batch' "
                            "and 'platform')")
        pts.setdefault((r["model"], r["batch"]), {})[r["platform"]] = r
    if not pts:
        raise UserError("no Fig. 14 rows to summarise")
    for key, d in pts.items():
        missing = [p for p in PLATFORMS if p not in d]
        if missing:
            raise UserError(f"Fig. 14 rows: {key[0]} batch {key[1]} lacks platform(s) "
                            f"{', '.join(missing)}")
    return pts


def best_prior(point: dict) -> str:
    """The prior platform (:data:`PRIOR_PLATFORMS`) with the best best-mode speedup at a
    point of :func:`by_point` (the paper's "best performing prior accelerator"). Raises
    :class:`UserError` for a point that lacks one of them."""
    if not isinstance(point, dict) or any(not isinstance(point.get(p), dict)
                                          or "best" not in point[p] for p in PRIOR_PLATFORMS):
        raise UserError(f"point: expected a point of by_point (a row with 'best' for each of "
                        f"{', '.join(PRIOR_PLATFORMS)})")
    return max(PRIOR_PLATFORMS, key=lambda p: point[p]["best"])


def fig15_summary(rows) -> dict:
    """Fig. 15 from :func:`fig14`'s rows: per (model, batch) every platform's whole energy a
    token in its best mode, ours against xPU AR (``over_xpu``) and against the prior
    platform with the best speedup at that point (``over_best_prior``, the paper's "best
    performing prior accelerator"): mean and max over the points (the paper: 4.4x, up to
    7.2x; 1.4x, up to 4.9x, MT-Bench at 8 GB), which platform that was per point
    (``best_prior``), ours against the platform the paper names strongest for each model
    (``over_paper_prior``, :data:`PAPER_STRONGEST_PRIOR`, mean and max over the points of the
    models it names; None without one), ours against HB-xPU
    (``over_hb_xpu``, mean and max: the energy of the bit-sliced MACs and Elastic-SD alone) and
    each platform's mean energy a token by component (mJ). Raises :class:`UserError` on rows
    without every platform of a point or without ``energy``."""
    pts = by_point(rows)
    if any("energy" not in r for r in rows):
        raise UserError("Fig. 15 needs fig14 rows with their 'energy' (this version's fig14)")
    over_x, over_p, over_h, over_n, which = [], [], [], [], {}
    for key, d in pts.items():
        o = sum(d["ours"]["energy"].values())
        over_x.append(sum(d["ours"]["xpu_energy"].values()) / o)
        bestp = which[f"{key[0]} batch {key[1]}"] = best_prior(d)
        over_p.append(sum(d[bestp]["energy"].values()) / o)
        if key[0] in PAPER_STRONGEST_PRIOR:
            over_n.append(sum(d[PAPER_STRONGEST_PRIOR[key[0]]]["energy"].values()) / o)
        over_h.append(sum(d[ABLATION_PLATFORM]["energy"].values()) / o)
    parts = {p: {k: float(np.mean([d[p]["energy"][k] for d in pts.values()])) / 1e9
                 for k in ENERGY_PARTS} for p in PLATFORMS}
    return {"over_xpu": float(np.mean(over_x)), "over_xpu_max": float(np.max(over_x)),
            "over_best_prior": float(np.mean(over_p)),
            "over_best_prior_max": float(np.max(over_p)), "best_prior": which,
            "over_paper_prior": float(np.mean(over_n)) if over_n else None,
            "over_paper_prior_max": float(np.max(over_n)) if over_n else None,
            "over_hb_xpu": float(np.mean(over_h)), "over_hb_xpu_max": float(np.max(over_h)),
            "mean_mj_token": parts, "paper": PAPER_FIG15}


# == speed of the model (make bench figure 12) ====================================================

#: Simulated tokens per second per core the model must reach for every preset (issue 26).
SPEED_TARGET = 1000


def model_speed(hb: str = "8gb", models=TABLE3_MODELS, batches=TABLE3_BATCHES,
                min_seconds: float = 0.2) -> dict:
    """Simulated tokens per second of the model, per model at ``hb``: each round builds the
    xPU and ours at every batch and runs an xPU AR step, our AR step and an Elastic-SD
    iteration of the :data:`TREE` (tokens: ours only, ``batch`` for the AR step + ``batch x
    accepted`` for the iteration; the xPU step is timed but its tokens are not counted);
    rounds repeat until ``min_seconds`` have passed on one core (``time.process_time``).
    Returns ``{model: {"tokens_per_s", "rounds", "seconds"}}``. Raises :class:`UserError` for
    ``models`` not a sequence of Table 3's models (whose alphas it reads), ``batches`` not a
    sequence of Table 3's batch sizes, or ``min_seconds`` not a finite number >= 0."""
    import time
    checked = []
    for name, values, known in (("models", models, TABLE3_MODELS),
                                ("batches", batches, TABLE3_BATCHES)):
        given = values
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
            values = None
        else:
            values = tuple(values)                      # a generator is read once, here
        if not values or any(v not in known for v in values):
            raise UserError(f"{name}: expected a non-empty sequence of Table 3's "
                            f"{', '.join(map(str, known))}, got {given!r}")
        checked.append(values)
    models, batches = checked
    _count("min_seconds", min_seconds)
    out = {}
    x, o = platform("xpu", hb), platform("ours", hb)
    for model in models:
        tokens, rounds = 0.0, 0
        t0 = time.process_time()
        while True:
            for b in batches:
                alpha = TABLE3_4GB[model]["elastic"][TABLE3_BATCHES.index(b)][0]
                EvalModel(model, x, batch=b).ar()
                em = EvalModel(model, o, "elastic", batch=b)
                em.ar()
                tokens += b + b * em.sd(alpha, *TREE).tokens     # ours only: not the xPU's
            rounds += 1
            dt = time.process_time() - t0
            if dt >= min_seconds:
                break
        out[model] = {"tokens_per_s": tokens / dt, "rounds": rounds, "seconds": dt}
    return out


# == the acceptance model (issue 26 item 4) =======================================================

#: Elastic-SD's alpha model per model: ``(alpha_max, beta)`` of :func:`elastic_alpha`, fitted by
#: :func:`calibrate_alpha` on the four Elastic-SD alphas of Table 3's 4 GB rows (nothing else).
ALPHA_MODEL = {"qwen3-30b-a3b": (0.762, 0.35), "glm-4.7-flash": (0.919, 0.15),
               "deepseek-v2-lite": (0.99, 0.0), "gpt-oss-20b": (0.505, 0.3)}


def pool_coverage(pop: ExpertPopularity, slots: float) -> float:
    """Share of a token's top-k picks that fall in the ``slots`` hottest experts (fractional
    slots interpolate): the pool's coverage of the routing, a proxy for the share of the gate
    weight the throttled draft keeps. Raises :class:`UserError` for ``slots`` negative or not
    finite, or ``pop`` not an :class:`ExpertPopularity`."""
    if not isinstance(pop, ExpertPopularity):
        raise UserError(f"pop: expected an ExpertPopularity, got {pop!r}")
    c = np.concatenate(([0.0], np.cumsum(pop.p))) / pop.top_k
    x = min(_count("slots", slots), float(pop.experts))
    i = int(x)
    return float(c[i] + (pop.p[i] / pop.top_k * (x - i) if i < pop.experts else 0.0))


def elastic_alpha(em: EvalModel, params=None) -> float:
    """Elastic-SD's acceptance rate at ``em``'s HB and batch: ``alpha_max x coverage(slots /
    batch ** beta)``: the pool (:attr:`EvalModel.pool_slots`, by default the expert cache's
    slots a layer) covers each request's routing
    less as more requests share it (``beta``), and a draft whose pool covered every pick would
    be accepted at ``alpha_max`` (the MSB slices' own error). Capped at 0.99. ``params``:
    ``(alpha_max, beta)``, default :data:`ALPHA_MODEL`'s for the model. Raises
    :class:`UserError` for a model :data:`ALPHA_MODEL` has no fit for (a loaded one) without
    ``params``, ``params`` not two finite numbers >= 0, or ``em`` not an Elastic-SD
    :class:`EvalModel`."""
    if not isinstance(em, EvalModel) or em.scheme != "elastic":
        raise UserError(f"em: expected an Elastic-SD EvalModel (scheme 'elastic'), got "
                        f"{getattr(em, 'scheme', em)!r}")
    if params is None:
        if em.m.name not in ALPHA_MODEL:
            raise UserError(f"elastic_alpha: model {em.m.name!r} has no fitted alpha model "
                            f"(ALPHA_MODEL: {', '.join(ALPHA_MODEL)}); pass params=(alpha_max, "
                            f"beta)")
        params = ALPHA_MODEL[em.m.name]
    if (isinstance(params, (str, bytes)) or not hasattr(params, "__len__") or len(params) != 2
            or not all(is_real(v) and math.isfinite(v) and v >= 0 for v in params)):
        raise UserError(f"params: expected (alpha_max, beta), two finite numbers >= 0, got "
                        f"{params!r}")
    a_max, beta = params
    return min(0.99, a_max * pool_coverage(em.pop, em.pool_slots / em.batch ** beta))


def calibrate_alpha(betas=np.round(np.arange(0.0, 2.01, 0.05), 2), *, zipf: dict | None = None,
                    batches=None) -> dict:
    """Per model, the ``(alpha_max, beta)`` minimising the squared error of the Elastic-SD
    alphas of Table 3's 4 GB rows (``batches``: of those batch sizes only, default all;
    ``zipf`` or :data:`ZIPF`; alpha_max by least squares at each beta of the grid, capped
    at 0.99 as :func:`elastic_alpha` caps alpha; rounded to 3 and 2 places)."""
    ours = platform("ours", "4gb")
    zipf = {**ZIPF, **(zipf or {})}
    idx = _batch_indices(batches)
    out = {}
    for model in TABLE3_MODELS:
        ems = [EvalModel(model, ours, "elastic", batch=TABLE3_BATCHES[i], zipf=zipf[model])
               for i in idx]
        al = np.array([TABLE3_4GB[model]["elastic"][i][0] for i in idx])
        best = None
        for beta in betas:
            c = np.array([pool_coverage(em.pop, em.pool_slots / em.batch ** beta)
                          for em in ems])
            a_max = min(0.99, float(c @ al / (c @ c)))       # an acceptance rate: <= 0.99
            err = float(np.sum((a_max * c - al) ** 2))
            if best is None or err < best[0] - 1e-15:
                best = (err, (round(a_max, 3), float(beta)))
        out[model] = best[1]
    return out


def model_alphas(hb: str, *, zipf: dict | None = None, params: dict | None = None,
                 pool_hb: str | None = None) -> dict:
    """Table 3's alphas with Elastic-SD's from :func:`elastic_alpha` at ``hb`` (the other
    schemes' draft does not depend on HB: the paper's value), shaped as :data:`TABLE3_4GB`'s
    alpha column: ``{model: {scheme: [alpha per batch]}}``. ``zipf`` overrides :data:`ZIPF`,
    ``params`` :data:`ALPHA_MODEL` (``{model: (alpha_max, beta)}``; a cross-validation fold's
    refit); ``pool_hb`` the draft pool's HB (:func:`pool_slots_at`; default ``hb``; at most
    ``hb``, :func:`check_pool_hb`)."""
    check_pool_hb(pool_hb, hb)
    ours = platform("ours", hb)
    zipf = {**ZIPF, **(zipf or {})}
    out = {}
    for model in TABLE3_MODELS:
        out[model] = {s: [TABLE3_4GB[model][s][i][0] for i in range(len(TABLE3_BATCHES))]
                      for s in SCHEMES}
        out[model]["elastic"] = [
            elastic_alpha(EvalModel(model, ours, "elastic", batch=b, zipf=zipf[model],
                                    pool_slots=pool_slots_at(pool_hb, model, batch=b,
                                                             zipf=zipf[model])),
                          params[model] if params else None)
            for b in TABLE3_BATCHES]
    return out

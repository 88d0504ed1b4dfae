"""ELMoE-3D: an RTL-generating design framework for a hybrid-bonded MoE inference accelerator.

Subpackages (each a top-level folder of the repository):

* :mod:`elmoe3d.sw`    -- the NumPy golden model (bit-nested quantization, exact GEMM numerics);
  never imports Amaranth or cocotb.
* :mod:`elmoe3d.hw`    -- Amaranth RTL components.
* :mod:`elmoe3d.sim`   -- the cocotb + Verilator runner and benches.
* :mod:`elmoe3d.synth` -- Yosys synthesis and area roll-up.

:mod:`elmoe3d.config` holds the one configuration object that feeds all of them.
"""

__version__ = "0.1.0"

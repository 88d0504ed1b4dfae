"""elmoe3d.sw: the software side of ELMoE-3D, in two subpackages.

* :mod:`.golden` -- the hardware's executable definition in plain NumPy: bit-nested quantization,
  the IA8xW5 datapath, the tile, VPU, aggregation link and streamline ring, DRAM timing, the
  PE's assembler packers and functional simulator, the expert FFN programs. Imports NumPy and
  the package root only (``elmoe3d.config``, ``elmoe3d.isa``, ``elmoe3d.errors``); every RTL
  block is checked against it.
* :mod:`.host` -- the host layer: model presets, routing traces, the HB expert cache,
  Elastic-SD, placement and the compilers, the performance model, the run backends and the FPGA
  board driver.

The quantization and GEMM API is re-exported here for quantization experiments
(``from elmoe3d.sw import quantize_weights, gemm``), with the plain-GEMM golden layer and its
PE program (``ref_linear``, ``build_streamed_linear_program``).
"""

from .golden.quant import *      # noqa: F401,F403
from .golden.datapath import *   # noqa: F401,F403
from .golden.linear_stream import ref_linear, build_streamed_linear_program   # noqa: F401

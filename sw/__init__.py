"""Golden model of ELMoE-3D in plain NumPy (never imports Amaranth or cocotb).

* :mod:`.quant`    -- bit-nested INT8 weight quantization, MSB/LSB slices, k-bit drafts,
  per-token power-of-two activation quantization.
* :mod:`.datapath` -- the IA8xW5 bit-sliced datapath, group psums, the Q.24 fused-dequantization
  accumulator and the bit-exact GEMM.
* :mod:`.metrics`  -- float64 reference and error metrics.
"""

from .quant import *      # noqa: F401,F403
from .datapath import *   # noqa: F401,F403

"""The golden model: ELMoE-3D's hardware as executable NumPy (BRIEF section 3).

One module per block or format; each names the RTL it defines. Never imports Amaranth, cocotb,
serial or torch, nor :mod:`elmoe3d.sw.host` (``tests/tools/test_import_contract.py``):

* :mod:`.quant` (bit-nested INT8, MSB/LSB slices, drafts), :mod:`.datapath` (IA8xW5 GEMM, group
  psums, Q.24), :mod:`.metrics`;
* :mod:`.tile`, :mod:`.vpu`, :mod:`.agg_link` (aggregation link), :mod:`.ring` (streamline
  ring), :mod:`.dram` (HB and LPDDR5 timing), :mod:`.bridge` (the FPGA bridge protocol);
* :mod:`.asm` (PE program packers), :mod:`.pe` (PE functional simulator), :mod:`.expert`
  (expert FFN programs and ``ref_moe``).
"""

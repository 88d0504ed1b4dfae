"""The host layer: drives the design from real MoE routing traces (BRIEF section 5).

* model presets (:mod:`.models`), weights (:mod:`.weights`, :mod:`.minilm`), traces
  (:mod:`.trace`, :mod:`.routelog`, :mod:`.tracegen`, :mod:`.corpus`);
* the HB expert cache (:mod:`.hbcache`), Elastic-SD (:mod:`.elastic_sd`), the host compiler
  (:mod:`.compiler`) and the parallel GEMM compiler (:mod:`.parallel`);
* the run backends (:mod:`.backends`, :mod:`.pe_runs`), the performance model (:mod:`.perf`)
  and the FPGA board driver (:mod:`.fpga`).

Imports :mod:`elmoe3d.sw.golden` and the package root; never Amaranth or cocotb.
"""

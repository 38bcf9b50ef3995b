# Two commands for a new machine: `make demo` (the main job) and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_HOME := $(CURDIR)/.demo
# pip's own noise is dropped; pip's exit status stays the pipeline's (pipefail), so a failed install stops make.
PIP_QUIET := { grep -v '^WARNING: Location' || true; }
# Debian's chromium for the browser test of the Airflow UI (Playwright drives it; no browser download).
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help venv demo test pictures test-unit test-integration test-live test-composer lint docs generate bench clean \
	deploy-composer deploy-composer-usage browser postgres lock images-check

# `make` alone says what each target does: the text after `##` on a target's line.
help: ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

venv: $(STAMP) ## the virtual environment in .venv, with the exact pins (a few minutes the first time)

# gpuflow and what it runs on (requirements.txt): enough for the gpuflow command, deploy-composer included.
RUNTIME_STAMP := $(VENV)/.runtime-installed
$(RUNTIME_STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -r requirements.txt 2>&1 | $(PIP_QUIET)
	$(BIN)/pip install -q --no-deps -e . 2>&1 | $(PIP_QUIET)
	$(BIN)/python -c "import airflow, gpuflow"
	touch $@

# Then the development tools (requirements-dev.txt: pytest, ruff, mypy, uv, playwright, mkdocs).
$(STAMP): $(RUNTIME_STAMP) requirements-dev.txt
	$(BIN)/pip install -q -r requirements-dev.txt 2>&1 | $(PIP_QUIET)
	$(BIN)/python -c "import airflow, apache_beam, torch, transformers, gpuflow"
	touch $(STAMP)

# The streaming LLM DAG on the local profile, with `airflow dags test` on a fresh SQLite Airflow home. It runs the
# triggers in line, with no scheduler to race, so nothing holds an event (GPUFLOW_TRIGGER_SETTLE_S=0:
# gpuflow.triggers.settle).
# The demo is the local profile's, always: its DAG folder holds the repository's own DAG files and no site folder
# (dags/<site>/, written by `gpuflow site-dags`), which would replace them.
demo: venv ## the streaming LLM DAG on the local profile: prompts, answers and latency
	rm -rf $(DEMO_HOME) && mkdir -p $(DEMO_HOME)/airflow $(DEMO_HOME)/dags
	ln -s $(CURDIR)/dags/*.py $(DEMO_HOME)/dags/
	export AIRFLOW_HOME=$(DEMO_HOME)/airflow AIRFLOW__CORE__DAGS_FOLDER=$(DEMO_HOME)/dags \
	  AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins AIRFLOW__CORE__LOAD_EXAMPLES=False GPUFLOW_TRIGGER_SETTLE_S=0 \
	  AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE=True; \
	$(BIN)/airflow db migrate > $(DEMO_HOME)/db-migrate.log 2>&1; \
	echo "running llm_streaming_inference on the local profile (a few minutes; full log: $(DEMO_HOME)/dags-test.log)"; \
	$(BIN)/gpuflow emulators run -- $(BIN)/airflow dags test llm_streaming_inference > $(DEMO_HOME)/dags-test.log 2>&1; \
	$(BIN)/python -m gpuflow.tools.demo_report $(DEMO_HOME)/dags-test.log

# Resolve docker/locks/*.in into locks for each image's platform and Python (uv; reaches only PyPI).
# PYTHON_VERSION=3.12 BEAM_VERSION=2.78.0 resolve the workers' locks for other versions.
lock: venv ## resolve docker/locks/*.in into each image's lock (uv; reaches only PyPI)
	$(BIN)/gpuflow images lock $(if $(PYTHON_VERSION),--set python_version=$(PYTHON_VERSION)) \
	  $(if $(BEAM_VERSION),--set beam_version=$(BEAM_VERSION))

# Install each lock as pip would inside its image, dry-run, offline from Docker; check it against its recipe.
images-check: venv ## install each image lock dry-run, as pip would inside the image
	$(BIN)/gpuflow images check

lint: venv ## ruff, and mypy (strict) on every package of gpuflow and the DAG files
	$(BIN)/ruff check .
	$(BIN)/mypy

docs: venv ## the pages in docs/ as a site in build/docs-site/ (MkDocs, Material); a broken link or page is an error
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	@echo "docs: build/docs-site/index.html"

# The configuration reference, the trigger form's schema, and the generated blocks of docs/gcp.md and docs/gpus.md
# (gpuflow.tools.generated). A test fails when one is stale.
generate: venv ## rewrite what is generated from the configuration model, the catalog and the image locks
	$(BIN)/python dev/generate.py

test-unit: venv ## the fast tests alone (no emulator, no Airflow service; about a minute)
	$(BIN)/python -m pytest -n 2 --dist worksteal -m "not integration"

test-integration: venv ## the tests on emulators, Beam runners and dag.test(), without the live Airflow services
	$(BIN)/python -m pytest -n 2 --dist worksteal -m "integration and not live"

test-live: venv browser postgres ## the real Airflow services (api-server, scheduler, dag-processor, triggerer) and the browser
	$(BIN)/python -m pytest -n 2 --dist worksteal -m live

browser: $(CHROMIUM) ## Debian's chromium for the browser test (apt-get, through sudo when not root)

$(CHROMIUM):
	@echo "installing Debian's chromium for the browser test: apt-get install chromium$(if $(SUDO), through sudo)"
	export DEBIAN_FRONTEND=noninteractive; \
	$(SUDO) apt-get install -y -q chromium > /dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q > /dev/null && $(SUDO) apt-get install -y -q chromium > /dev/null; }

# Debian's PostgreSQL server for the tests that start Airflow's services (tests/postgres.py starts one per session,
# as the postgres user; Debian puts its programs in /usr/lib/postgresql/NN/bin, off PATH).
postgres: ## Debian's PostgreSQL server for the live Airflow tests (apt-get, through sudo when not root)
	@ls /usr/lib/postgresql/*/bin/initdb > /dev/null 2>&1 || { \
	  echo "installing Debian's postgresql for the live Airflow tests$(if $(SUDO), through sudo)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $(SUDO) apt-get install -y -q postgresql > /dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q > /dev/null && $(SUDO) apt-get install -y -q postgresql > /dev/null; }; }

test: venv lint docs browser postgres ## everything: lint, the docs site, then every test (unit, integration, live); about 20 minutes here
	@mkdir -p tests/artifacts && rm -f tests/artifacts/git-status-before && \
	  if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then \
	  git status --porcelain > tests/artifacts/git-status-before; fi
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=25
	@if [ -f tests/artifacts/git-status-before ]; then git status --porcelain | \
	  diff -u tests/artifacts/git-status-before - || { echo "make test changed the tree (above): a test must write \
	  under tests/artifacts/ or a temporary folder"; exit 1; }; fi

pictures: venv browser ## refresh the trigger form's pictures in docs/ (the browser test, writing there)
	GPUFLOW_DOCS_PICTURES=docs $(BIN)/python -m pytest -p no:cacheprovider \
	  "tests/integration/test_airflow_live.py::test_the_trigger_form_in_a_browser_starts_a_deployment_that_rolls_out_new_weights"

# Cloud Composer's lines that gpuflow runs on (plugins/gpuflow/catalog/composer.yaml, tested_lines; a test keeps the
# pins below equal to it): LINE=3.3.1 (the newest; default) or LINE=3.1.8 (the floor). Each gets a venv of its own:
# its Airflow and providers, the lines of Composer's own package list that could be read (composer/, copied from what Google publishes; none
# for 3.1.8), and gpuflow's own pins for the rest (requirements.txt less the three). The tests that matter on
# Composer then run from a tree laid out as deploy-composer copies it (tests/composer_tree.py), with only dags/,
# plugins/ and the tests on sys.path.
LINE ?= 3.3.1
COMPOSER_PINS_3.3.1 := apache-airflow==3.3.1 apache-airflow-providers-google==22.2.2 apache-airflow-providers-apache-beam==6.2.3
COMPOSER_CONSTRAINTS_3.3.1 := composer/constraints-composer-3-airflow-3.3.1-build.0.txt
COMPOSER_PINS_3.1.8 := apache-airflow==3.1.8 apache-airflow-providers-google==22.2.0 apache-airflow-providers-apache-beam==6.2.2
COMPOSER_CONSTRAINTS_3.1.8 :=
COMPOSER_PINS = $(COMPOSER_PINS_$(LINE))
COMPOSER_CONSTRAINTS = $(COMPOSER_CONSTRAINTS_$(LINE))
COMPOSER_VENV = .venv-composer-$(LINE)
COMPOSER_TREE = .composer-tree-$(LINE)
COMPOSER_TESTS := tests/unit/test_dag_parse.py tests/unit/test_triggers.py tests/unit/test_provider_gaps.py tests/integration/test_dag_local.py \
	tests/integration/test_dag_batch_local.py tests/integration/test_janitor_local.py \
	tests/integration/test_dag_quota_report.py tests/integration/test_dag_dataproc.py \
	tests/integration/test_deployment_local.py tests/integration/test_airflow_live.py

$(COMPOSER_VENV)/.installed: requirements.txt requirements-dev.txt $(COMPOSER_CONSTRAINTS)
	@test -n "$(COMPOSER_PINS)" || { echo "make test-composer: LINE is 3.3.1 or 3.1.8, not $(LINE)"; exit 2; }
	test -x $(COMPOSER_VENV)/bin/python || $(PYTHON) -m venv $(COMPOSER_VENV)
	grep -v -E '^(apache-airflow|apache-airflow-providers-google|apache-airflow-providers-apache-beam)==' \
	  requirements.txt > $(COMPOSER_VENV)/requirements-rest.txt
	grep -E '^(pytest|pytest-timeout|pytest-xdist|playwright|psycopg2-binary|asyncpg)==' requirements-dev.txt > $(COMPOSER_VENV)/requirements-test.txt
	$(COMPOSER_VENV)/bin/pip install -q $(if $(COMPOSER_CONSTRAINTS),-c $(COMPOSER_CONSTRAINTS)) $(COMPOSER_PINS) \
	  -r $(COMPOSER_VENV)/requirements-rest.txt -r $(COMPOSER_VENV)/requirements-test.txt 2>&1 | $(PIP_QUIET)
	touch $@

# The line's own venv lays out the tree too, so the floor runs without .venv (.ci/run removes the one it made).
test-composer: browser postgres $(COMPOSER_VENV)/.installed ## the DAGs on a Composer line (LINE=3.3.1 default, or 3.1.8, the floor), from Composer's bucket layout
	PYTHONPATH=plugins:. $(COMPOSER_VENV)/bin/python -m tests.composer_tree $(COMPOSER_TREE)
	cd $(COMPOSER_TREE) && PYTHONPATH=dags:plugins:. ../$(COMPOSER_VENV)/bin/python -c \
	  "from importlib.metadata import version as v; print('test-composer at', *(f'{p} {v(p)}' for p in \
	  ('apache-airflow', 'apache-airflow-providers-google', 'apache-airflow-providers-apache-beam', 'apache-beam')))"
	cd $(COMPOSER_TREE) && PYTHONPATH=dags:plugins:. ../$(COMPOSER_VENV)/bin/python -m pytest -n 2 --dist worksteal \
	  -p no:cacheprovider $(COMPOSER_TESTS)

bench: venv postgres ## the benchmarks, run by hand: ratios measured side by side
	$(BIN)/gpuflow emulators run -- $(BIN)/python benchmarks/inference_throughput.py
	$(BIN)/python benchmarks/model_load.py
	$(BIN)/python benchmarks/dag_parse.py
	$(BIN)/python benchmarks/defer_race.py
	$(BIN)/python benchmarks/rollout_gate.py

# Copy dags/, plugins/ and data/ (beam_jobs, configs, docker, spark_jobs) into a Cloud Composer environment, add
# the PyPI packages it lacks (keeping every one it has), create the gpuflow_gpu pool, and (CONFIG=) install your
# configuration as the DAGs' default. DRY_RUN=1 reads the environment and prints what would change.
deploy-composer: deploy-composer-usage $(RUNTIME_STAMP) ## deploy into a Cloud Composer environment (ENV=… LOCATION=… [PROJECT=…] [CONFIG=…] [DRY_RUN=1])
	$(BIN)/gpuflow deploy-composer --environment "$(ENV)" --location "$(LOCATION)" $(if $(PROJECT),--project "$(PROJECT)") $(if $(CONFIG),--config "$(CONFIG)") $(if $(DRY_RUN),--dry-run)

# The arguments are checked before anything is installed.
deploy-composer-usage:
	@test -n "$(ENV)" -a -n "$(LOCATION)" || { echo "usage: make deploy-composer ENV=environment LOCATION=region [PROJECT=project] [CONFIG=my-gcp.yaml] [DRY_RUN=1]"; exit 2; }

clean: ## remove the demo's Airflow home, the docs site and the tool caches
	rm -rf $(DEMO_HOME) build/docs-site .pytest_cache .ruff_cache .mypy_cache

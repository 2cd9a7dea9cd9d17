# Two commands: `make demo` runs the main pipeline locally, `make test` runs the test suite.
# Both create .venv when missing, install the pinned requirements and prepare a local
# Airflow home inside the repository (var/airflow, ignored by git). Nothing else needed.

PY ?= python3
VENV := $(CURDIR)/.venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt constraints.txt pyproject.toml | cksum | cut -d' ' -f1)

# The local Airflow: SQLite, examples off, this repo's dags/ and plugins/. Exported for
# every recipe, so AIRFLOW_HOME is set before anything imports airflow.
export AIRFLOW_HOME := $(CURDIR)/var/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(CURDIR)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(CURDIR)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN := sqlite:///$(AIRFLOW_HOME)/airflow.db
export AIRFLOW__CORE__PARALLELISM := 4
export AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT := 18793
export AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT := 18794
export HOUSE_RUNNER ?= local
export HOUSE_STORAGE_ROOT ?= $(CURDIR)/var/storage

# make demo TRACE=path-or-url  (a real sacct/SWF log); default: the ls6-fitted synthetic trace.
# The demo is the pipeline's run size "demo" (mirage_tasks/run/runconf.py): 30 training samples
# 12 h apart, 6 validation samples, nodes 1 and 8, quick preset, short policy training, every
# step of the pipeline. With a TRACE it validates the first 6 samples of the month before
# DEMO_DATE; on the synthetic trace (Jan-Mar 2023, seed 0) the 6 samples from 2023-02-11,
# whose load levels mix low, medium and heavy on both node sizes, so the models differ.
TRACE ?=
TRACE_TZ ?= America/Chicago
DEMO_DATE ?= 2023-03-01

.PHONY: testing-figures demo test lint test-fast test-tier venv airflow-home system-deps bench ls6-results clean help \
	airflow airflow-stop airflow-status airflow-check bench-monthly functions bench-faasm demo-faasm \
	slurm slurm-stop slurm-status

help:
	@echo "make demo [TRACE=path-or-url]   run the mirage_pipeline DAG locally and print where the outputs are"
	@echo "make demo-faasm                 run faasm_benchmarks on the local target (wasm vs native) and print its trend page"
	@echo "make test                       make lint, then the whole test suite (unit, dag, e2e and lab tiers)"
	@echo "make lint                       the import contracts (lint-imports), ruff check and ruff format --check"
	@echo "make test-fast                  run the unit tier only (about a minute on 2 cores)"
	@echo "make testing-figures [NOTE=...]  write docs/testing.md's suite figures from the last make test's report"
	@echo "make test-tier TIER=dag         run one tier: unit, dag, e2e or lab (lab/: the results pages' campaigns)"
	@echo "make bench                      run the benchmarks in bench/"
	@echo "make airflow                    a real local Airflow (PostgreSQL, scheduler, dag-processor, triggerer, api-server on 127.0.0.1)"
	@echo "make airflow-stop               stop exactly what make airflow started"
	@echo "make airflow-check              opt-in: backfill 3 trace days of the ls6 log through a real Airflow, then an overlapping range"
	@echo "make slurm [SLURM_CLUSTER=ls6 SLURM_NODES=N SLURM_FACTOR=F SLURM_ACCOUNTING=1 SLURM_USERS=U]  a real local Slurm (munge, slurmctld, N slurmd on 127.0.0.1, slurmdbd + MariaDB with accounting; as root)"
	@echo "make slurm-stop                 cancel every job and stop exactly what make slurm started"
	@echo "make slurm-status               check each daemon of make slurm's cluster; exit 1 naming the dead ones"
	@echo "make bench-monthly              sampling CPU seconds of a monthly backfill's months 2 and 3 vs month 1"

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	@$(PY) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ needed, found " + sys.version.split()[0]'
	@test -x $(PYTHON) || $(PY) -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt -r requirements-dev.txt -c constraints.txt
	$(PYTHON) -m pip install --quiet --no-deps -e .
	@rm -f $(VENV)/.installed-*
	@touch $@

# apt-get that waits (at most APT_LOCK_WAIT seconds, saying so) while another apt or dpkg holds the
# package lock, instead of failing at once on a shared machine: devtools/apt_wait.sh.
APT_LOCK_WAIT ?= 600
APT := devtools/apt_wait.sh $(APT_LOCK_WAIT)

# $(call apt-install,CHECK,PACKAGES,WHAT): when the shell test CHECK fails, install Debian's
# PACKAGES (as root on Debian only); elsewhere say what will skip. Packages never start their
# system services here (a policy-rc.d that denies them, present only while installing, unless
# the machine has its own): the project starts each daemon itself, on its own ports.
define apt-install
	@{ $(1); } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $(2) (Debian) for $(3)"; \
	    own=; [ -e /usr/sbin/policy-rc.d ] || { own=1; printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; \
	      chmod 755 /usr/sbin/policy-rc.d; }; \
	    $(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq $(2) >/dev/null; rc=$$?; \
	    [ -z "$$own" ] || rm -f /usr/sbin/policy-rc.d; exit $$rc; \
	  else echo "note: $(2) not found and cannot be installed here: $(3) will skip"; fi; }
endef

# Debian's redis-server backs the Faasm local target; chromium + chromium-driver the
# results-view browser test (tests/ui); nginx and wrk serve bench/load.py; postgresql the real
# local Airflow (make airflow; SQLite breaks backfills under a real scheduler).
system-deps:
	$(call apt-install,command -v redis-server,redis-server,the Faasm local target and its tests)
	$(call apt-install,command -v chromium && command -v chromedriver,chromium chromium-driver,the results-view browser test)
	$(call apt-install,command -v wrk && { command -v nginx || test -x /usr/sbin/nginx; },nginx wrk,bench/load.py)
	$(call apt-install,ls /usr/lib/postgresql/*/bin/pg_ctl,postgresql,make airflow)
	$(call apt-install,command -v clang && command -v wasm-ld && test -f /usr/lib/wasm32-wasi/libc.a && ls /usr/lib/llvm-14/lib/clang/14*/lib/wasi/libclang_rt.builtins-wasm32.a,clang lld wasi-libc libclang-rt-14-dev-wasm32,the Faasm functions' wasm32-wasi build (make functions))
	$(call apt-install,command -v runc,runc,the Faasm local target's native system)
	$(call apt-install,command -v slurmctld && command -v slurmd && command -v sbatch && command -v munged,slurmctld slurmd slurm-client munge,make slurm and the Slurm e2e tests)
	$(call apt-install,command -v slurmdbd && command -v sacctmgr && command -v mariadbd && command -v mariadb-install-db,slurmdbd mariadb-server,make slurm SLURM_ACCOUNTING=1 and the accounting e2e tests)

# The Faasm functions (faasm_tasks/functions): each C source built to wasm32-wasi (clang,
# wasi-libc) and native static (gcc), for the local target's wasm and native systems.
functions: system-deps
	$(MAKE) -C faasm_tasks/functions

# One faasm_benchmarks run on the local target (every experiment, wasm and native), then the
# path of its trend page (which sets wasm beside native). Log: var/demo-faasm.log.
FAASM_DEMO_DATE ?= $(shell date -u +%Y-%m-%d)
demo-faasm: airflow-home system-deps functions
	@echo "running faasm_benchmarks for $(FAASM_DEMO_DATE) on the local target; log: var/demo-faasm.log"
	@HOUSE_DEADLINE_FAASM_BENCHMARKS=off $(VENV)/bin/airflow dags test faasm_benchmarks $(FAASM_DEMO_DATE) -c '{"target": "local"}' >var/demo-faasm.log 2>&1 \
	  || { tail -n 60 var/demo-faasm.log; echo "faasm_benchmarks failed; full log: var/demo-faasm.log"; exit 1; }
	@ls -d $(HOUSE_STORAGE_ROOT)/faasm_benchmarks/$(FAASM_DEMO_DATE)/*/trends/trends.md

# docs/results/faasm-local.md: wasm vs native on this machine (SMOKE=1: the test's size).
bench-faasm: $(STAMP) functions
	nice -n 10 $(PYTHON) bench/faasm_local.py $(if $(SMOKE),--smoke)

# A real local Airflow: PostgreSQL in var/pg (run as the postgres user, 127.0.0.1 only), then
# scheduler, dag-processor, triggerer and api-server on free 127.0.0.1 ports (execution API
# URL and log-server ports set to match); prints the UI's address and login. Settings for
# the airflow CLI: source var/airflow-live/env.sh. make airflow-stop stops what it started.
# functions: faasm_benchmarks on the local target needs the built functions; without them every
# experiment group of a triggered run fails at deploy with "run `make functions` first".
airflow: $(STAMP) system-deps functions
	@devtools/airflow_local.sh start

# A real local Slurm (Debian's Slurm 22.05 and munge, as root), configured from the simulator's
# cluster config: SLURM_CLUSTER (preset or JSON, default 4 nodes), SLURM_NODES, SLURM_FACTOR (time
# compression); SLURM_ACCOUNTING=1 adds slurmdbd on a local MariaDB (age factor, fair share and
# limits enforced) with accounts u0..u<SLURM_USERS-1> and service. State, logs and the munge key
# in var/slurm; clients: source var/slurm/env.sh.
slurm: system-deps
	@devtools/slurm_local.sh start

slurm-stop:
	@devtools/slurm_local.sh stop

slurm-status:
	@devtools/slurm_local.sh status

airflow-stop:
	@devtools/airflow_local.sh stop

airflow-status:
	@devtools/airflow_local.sh status

# Opt-in (not in make test): backfills three trace days of the ls6 log through a real
# Airflow on PostgreSQL, checks three committed partitions and three asset events, then an
# overlapping range computes only its new days. Uses its own database and storage.
airflow-check: $(STAMP) system-deps
	$(PYTHON) bench/backfill.py --trace $(LS6_TRACE)

bench-monthly: $(STAMP)
	$(PYTHON) bench/backfill.py --trace $(LS6_TRACE) --monthly-only

airflow-home: $(STAMP)
	@mkdir -p $(AIRFLOW_HOME) $(HOUSE_STORAGE_ROOT)
	@test -f $(AIRFLOW_HOME)/airflow.db || $(VENV)/bin/airflow db migrate >$(AIRFLOW_HOME)/db-migrate.log 2>&1 \
	  || { cat $(AIRFLOW_HOME)/db-migrate.log; exit 1; }

# $(call run-summary,LOG): the summary (with the metrics table) of the mirage_pipeline run whose
# plan task printed "run prefix: ..." into LOG. Read in the shell when the line runs: make
# expands a whole recipe before its first line, so a $(shell ls ...) here would look for the
# run's folder before the run has made it (empty on a fresh clone).
define run-summary
	@run=$$(sed -n 's/^.*run prefix: \([^ "]*\).*$$/\1/p' $(1) | tail -n 1); \
	  test -n "$$run" || { echo "no 'run prefix:' line in $(1): cannot tell which run to summarise"; exit 1; }; \
	  $(PYTHON) -m lab summary --run "$$run" --show-md metrics.md
endef
# A local trace path is made absolute (steps run from the repository root); URLs pass as is.
DEMO_TRACE := $(if $(findstring ://,$(TRACE)),$(TRACE),$(if $(TRACE),$(abspath $(TRACE))))
comma := ,
DEMO_CONF := {"size": "demo"$(if $(TRACE),$(comma) "trace": "$(DEMO_TRACE)"$(comma) "trace_timezone": "$(TRACE_TZ)")}

# The demo runs Python steps only: it installs no system package (make test and the lab do).
demo: airflow-home
	@echo "running mirage_pipeline for $(DEMO_DATE) ($(if $(TRACE),trace $(DEMO_TRACE),synthetic ls6-like trace)); log: var/demo.log"
	@$(VENV)/bin/airflow dags test mirage_pipeline $(DEMO_DATE) -c '$(DEMO_CONF)' >var/demo.log 2>&1 \
	  || { tail -n 60 var/demo.log; echo "mirage_pipeline failed; full log: var/demo.log"; exit 1; }
	$(call run-summary,var/demo.log)

# The import contracts of pyproject.toml ([tool.importlinter]: Mirage's layers, no Airflow in
# the task packages, the wings independent, no cycles, no lab wing in the product), with
# plugins/ on the path as Airflow puts it; then ruff's lint rules and its formatting.
lint: $(STAMP)
	PYTHONPATH=$(CURDIR):$(CURDIR)/plugins $(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Tests run side by side in TEST_WORKERS processes (pytest-xdist): most of the suite waits on
# processes (Slurm jobs, Airflow, servers), not on the CPU. Each worker has its own Airflow home
# and database (tests/conftest.py); TEST_WORKERS=0 runs them one after another.
TEST_WORKERS ?= 4
test: lint airflow-home system-deps functions
	@mkdir -p var
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist worksteal --junitxml=var/test-report.xml

# docs/testing.md's figures (tests, outcomes and time per tier, the wall time) from the last
# make test's report, not typed by hand; NOTE="..." says how the run was made.
testing-figures:
	$(PYTHON) devtools/suite_figures.py var/test-report.xml --workers $(TEST_WORKERS) --write docs/testing.md --note "$(NOTE)"

# The unit tier only (no Airflow database, no DAG runs): seconds, for the edit-test loop.
test-fast: $(STAMP)
	$(PYTHON) -m pytest -m unit -q

# One tier: make test-tier TIER=dag (unit, dag, e2e or lab).
test-tier: airflow-home system-deps functions
	$(PYTHON) -m pytest -m $(TIER) -n $(TEST_WORKERS) --dist worksteal

# The Mirage seed's configuration on the real ls6 log (docs/results/ls6.md): train from
# 2022-11-01 (684 samples), validate from 2023-03-01 (156 samples), nodes 1 and 8, quick preset.
LS6_TRACE ?= $(abspath ../shared/traces/ls6-a100.log.gz)
LS6_CONF := {"trace": "$(LS6_TRACE)", "trace_timezone": "America/Chicago", "train_start": "2022-11-01T00:00:00+00:00", "train_count": 684, "val_start": "2023-03-01T00:00:00+00:00", "val_count": 156, "node_sizes": [1, 8], "shards": 2}

ls6-results: airflow-home
	@echo "running mirage_pipeline on $(LS6_TRACE) with the seed's configuration; log: var/ls6-results.log"
	@$(VENV)/bin/airflow dags test mirage_pipeline 2023-04-01 -c '$(LS6_CONF)' >var/ls6-results.log 2>&1 \
	  || { tail -n 60 var/ls6-results.log; echo "mirage_pipeline failed; full log: var/ls6-results.log"; exit 1; }
	$(call run-summary,var/ls6-results.log)

bench: $(STAMP)
	$(PYTHON) bench/ingest.py
	nice -n 10 $(PYTHON) bench/sampling.py --log $(LS6_TRACE)

clean:
	rm -rf var .pytest_cache

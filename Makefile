# lodestream — run `make help` for the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
STATE_DIR ?= .lode
PYTEST_ARGS ?=
# `make test` runs the suite on this many processes, then the tests marked `alone` one by one.
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "lodestream needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,demo,mpi,analytics]'
	@touch $(STAMP)

.PHONY: venv
venv: $(STAMP) ## Create the virtualenv and install lodestream with dev, demo, mpi and analytics extras

SLURM_PACKAGES := slurmctld slurmd slurm-client

.PHONY: slurm-deps
slurm-deps: ## Install Debian's Slurm daemons and clients for the real-Slurm tests (as root)
	@if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null; then \
	  echo "Slurm is installed: $$(slurmctld -V)"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "run as root (the tests start slurmctld/slurmd as root): sudo make slurm-deps" >&2; exit 1; \
	else \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES); \
	fi

XFER_PACKAGES := rsync openssh-server openssh-client

.PHONY: xfer-deps
xfer-deps: ## Install rsync and OpenSSH for the transfer tests (rsync over a loopback sshd, as root)
	@if command -v rsync >/dev/null && command -v ssh >/dev/null && [ -x /usr/sbin/sshd ]; then \
	  echo "rsync and OpenSSH are installed: $$(rsync --version | head -n 1)"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "run as root (the tests start sshd and log in as root): sudo make xfer-deps" >&2; exit 1; \
	else \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(XFER_PACKAGES); \
	fi

DOCKER_PACKAGES := docker.io iptables

.PHONY: docker-deps
docker-deps: ## Install Debian's Docker engine for the container tests (cluster node loss; as root)
	@if command -v dockerd >/dev/null && command -v docker >/dev/null && command -v iptables >/dev/null; then \
	  echo "Docker is installed: $$(dockerd --version)"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "run as root (the tests start a private dockerd): sudo make docker-deps" >&2; exit 1; \
	else \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DOCKER_PACKAGES); \
	fi

.PHONY: images
images: $(STAMP) ## Build the nats-server and Postgres images offline from the installed wheels
	$(BIN)/python -m lodestream.infra.images

.PHONY: ui-deps
ui-deps: ## Install Debian's Chromium for the dashboard's headless browser test (as root)
	@if command -v chromium >/dev/null; then \
	  echo "Chromium is installed: $$(chromium --version)"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "run as root: sudo make ui-deps" >&2; exit 1; \
	else \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	fi

.PHONY: lint
lint: $(STAMP) ## ruff (lint + format check) and mypy --strict
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .

.PHONY: fmt
fmt: $(STAMP) ## Format and auto-fix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

.PHONY: test
test: $(STAMP) ## Lint, then the whole test suite against real nats-server and Postgres
	$(MAKE) lint
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not alone" $(PYTEST_ARGS)
	$(BIN)/pytest -q -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]  # 5: PYTEST_ARGS left none

.PHONY: test-fast
test-fast: $(STAMP) ## Tests without the slow end-to-end and fault-injection ones
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

.PHONY: schemas
schemas: $(STAMP) ## Regenerate schemas/json from the pydantic models
	$(BIN)/python tools/export_json_schema.py

.PHONY: docs
docs: $(STAMP) ## Regenerate docs/lifecycle.md and docs/permissions.md from the tables
	$(BIN)/python tools/lifecycle_diagram.py
	$(BIN)/python tools/permissions_doc.py

.PHONY: run
run: $(STAMP) ## Start the embedded stack and run the demo workload (Ctrl-C stops it)
	$(BIN)/lode up --state-dir $(STATE_DIR) --demo

.PHONY: up
up: $(STAMP) ## Start the embedded stack only
	$(BIN)/lode up --state-dir $(STATE_DIR)

BENCHES := bench-spine bench-lifecycle bench-staging bench-diffusion bench-watch bench-sse bench-sse-slow \
	bench-analytics bench-simulate bench-decode bench-acks bench-cluster bench-routing bench-peers

.PHONY: bench $(BENCHES)
bench: $(BENCHES) ## Run all benchmarks (writes bench/out/, see bench/RESULTS.md)

BENCH_SITE := .venv-bench/site
BENCH_PEERS := $(shell sed -n '/^bench = \[/s/^bench = \[\(.*\)\]/\1/p' pyproject.toml | tr -d '",')

$(BENCH_SITE)/.installed: pyproject.toml $(STAMP)
	$(BIN)/pip install --quiet --upgrade --target $(BENCH_SITE) $(BENCH_PEERS)
	@touch $@

bench-peers: $(BENCH_SITE)/.installed ## Lodestream vs Parsl HTEX, alternately, in one sitting (PEERS_ARGS=--jobs 2000 --rounds 3)
	PATH=$(CURDIR)/$(BENCH_SITE)/bin:$$PATH $(BIN)/python -m bench.peers $(PEERS_ARGS)

bench-spine: $(STAMP) ## Event spine: submit, projector, rebuild, queries (BENCH_ARGS=--scale 0.1)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

bench-lifecycle: $(STAMP) ## Whole job lifecycle on a local site and pilot (LIFECYCLE_ARGS=--jobs 2000)
	$(BIN)/python -m bench.lifecycle $(LIFECYCLE_ARGS)

bench-staging: $(STAMP) ## Stage-in arrival rate per transfer batch size (STAGING_ARGS=--jobs 400)
	$(BIN)/python -m bench.staging $(STAGING_ARGS)

bench-diffusion: $(STAMP) ## Node caches on vs off, repeated inputs (DIFFUSION_ARGS=--jobs 2000 --size-mb 4)
	$(BIN)/python -m bench.data_diffusion $(DIFFUSION_ARGS)

bench-watch: $(STAMP) ## Live watch: appended → delivered at 1,000/s, replay from since=1 (WATCH_ARGS=--replay 100000)
	$(BIN)/python -m bench.watch $(WATCH_ARGS)

bench-sse: $(STAMP) ## 50 SSE clients on the push feed vs none: the projector's rate (SSE_ARGS=--clients 50)
	$(BIN)/python -m bench.sse $(SSE_ARGS)

bench-sse-slow: $(STAMP) ## 500 since=0 SSE readers that never read: the api's RSS (SSE_SLOW_ARGS=--readers 500)
	$(BIN)/python -m bench.sse_slow $(SSE_SLOW_ARGS)

bench-analytics: $(STAMP) ## Analytics replayed from a stream of 1,000,000 events (ANALYTICS_ARGS=--events 100000)
	$(BIN)/python -m bench.analytics $(ANALYTICS_ARGS)

bench-simulate: $(STAMP) ## The what-if model: 100,000 jobs per scenario (SIMULATE_ARGS=--repeat 3)
	$(BIN)/python -m bench.simulate $(SIMULATE_ARGS)

bench-decode: $(STAMP) ## µs per event: the shared rule, the union and per-class decodes (DECODE_ARGS=--rounds 1000)
	$(BIN)/python -m bench.decode $(DECODE_ARGS)

bench-acks: $(STAMP) ## What an ack costs: per message against once per batch
	$(BIN)/python -m bench.acks $(ACKS_ARGS)

bench-routing: $(STAMP) ## One auto request of 60 jobs over sites of 0.3/1/3 s per job (ROUTING_ARGS=--jobs 30)
	$(BIN)/python -m bench.routing $(ROUTING_ARGS)

bench-cluster: $(STAMP) ## No-op jobs on a 3-node cluster in containers vs one server (root and Docker; skipped without)
	LODE_CLUSTER_BENCH=1 $(BIN)/pytest -q -s -p no:cacheprovider tests/containers/test_cluster_bench.py $(PYTEST_ARGS)

CHAOS_JOBS ?= 500
CHAOS_ROUNDS ?= 3
LEAF_CUT_S ?= 60

.PHONY: chaos
chaos: $(STAMP) ## Chaos under load: every component SIGKILLed in turn (CHAOS_JOBS=500 CHAOS_ROUNDS=3)
	LODE_CHAOS_JOBS=$(CHAOS_JOBS) LODE_CHAOS_ROUNDS=$(CHAOS_ROUNDS) $(BIN)/pytest -q -s tests/chaos $(PYTEST_ARGS)

.PHONY: cluster-faults
cluster-faults: $(STAMP) ## Only the container tests (also in make test): a node killed, a node partitioned, Postgres restarted (root)
	$(BIN)/pytest -q -s tests/containers $(PYTEST_ARGS)

.PHONY: cluster-test
cluster-test: $(STAMP) ## The long versions: container faults at 2,000 jobs (root), a leaf site through a 60 s WAN cut
	LODE_CLUSTER_JOBS=2000 $(BIN)/pytest -q -s tests/containers $(PYTEST_ARGS)
	LODE_LEAF_CUT_S=$(LEAF_CUT_S) $(BIN)/pytest -q -s tests/integration/test_leaf_site.py $(PYTEST_ARGS)

.PHONY: leaf-cut
leaf-cut: $(STAMP) ## A leaf-node site rides out a 60 s WAN cut (LEAF_CUT_S=60; prints heal -> caught-up)
	LODE_LEAF_CUT_S=$(LEAF_CUT_S) $(BIN)/pytest -q -s tests/integration/test_leaf_site.py $(PYTEST_ARGS)

.PHONY: clean
clean: ## Remove caches (keeps the venv and the state dir)
	rm -rf .mypy_cache .ruff_cache .pytest_cache build *.egg-info

# bksim: every target installs what it needs when missing, and is quick when it is already there.
SHELL := /bin/bash
PY_VERSION ?= python3
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
# What a bookie needs at run time (and grpcio-tools for `make proto`); the container image installs only these
# (`make venv proto PIP_PKGS='$(PIP_RUNTIME)'`). Development and test packages come on top.
PIP_RUNTIME = grpcio==1.85.1 grpcio-tools==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 \
  protobuf==7.36.2 kazoo==2.11.0 rocksdict==0.3.29 crc32c==2.9.post0 google-crc32c==1.9.0 \
  cryptography==50.0.2 PyJWT==2.15.1 aiohttp==3.14.5 prometheus-client==0.26.0
PIP_DEV = pyspark==4.3.0 pytest==9.2.0 pytest-timeout==2.4.0 pytest-xdist==3.8.0 docker==7.1.0 matplotlib==3.11.2 hypothesis==6.170.17 \
  kubernetes-validate==1.37.0
PIP_PKGS = $(PIP_RUNTIME) $(PIP_DEV)
ZK_JAR := /usr/share/java/zookeeper.jar
STAMP := $(VENV)/.bksim-installed

.PHONY: deps venv zookeeper proto interop-deps ruby-grpc up down status init monitor prometheus browser-deps test test-perf test-chaos test-unit test-integration test-abuse fuzz clean

# The `bksim` command from the venv. The configuration is deploy/bksim.toml, or $BKSIM_CONFIG, with
# BKSIM_<SECTION>_<OPTION> environment overrides (e.g. `BKSIM_CLUSTER_BOOKIES=0 make up`).
BKSIM := $(PY) -m bksim.cli.main
# Per-test time limit (pytest-timeout): a hung test fails with a traceback instead of hanging CI.
TEST_TIMEOUT_S ?= 300
PYTEST := $(PY) -m pytest -q --timeout=$(TEST_TIMEOUT_S)
RUN_DIR ?= .run

deps: zookeeper venv proto

zookeeper: $(ZK_JAR)
$(ZK_JAR):
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends zookeeper

venv: $(STAMP)
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PY_VERSION) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(PIP_PKGS)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

GEN_DIR := services/bksim/gen
PROTOS := $(wildcard proto/*.proto)
proto: $(GEN_DIR)/.stamp
$(GEN_DIR)/.stamp: $(PROTOS) $(STAMP)
	mkdir -p $(GEN_DIR)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=$(GEN_DIR) --pyi_out=$(GEN_DIR) --grpc_python_out=$(GEN_DIR) $(PROTOS)
	sed -i 's/^import \(.*_pb2\) as/from bksim.gen import \1 as/' $(GEN_DIR)/*_pb2_grpc.py
	touch $(GEN_DIR)/__init__.py $@

# interop-deps: Debian's Ruby gRPC (ruby-grpc, ruby-grpc-tools) and Ruby stubs of proto/*.proto in $(RUBY_GEN_DIR),
# for tests/interop (a client in another language through the protos; docs/clients.md).
RUBY_GEN_DIR := build/ruby
interop-deps: $(RUBY_GEN_DIR)/.stamp
ruby-grpc:
	ruby -e 'require "grpc"' 2>/dev/null && command -v grpc_tools_ruby_protoc >/dev/null || { apt-get update && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ruby-grpc ruby-grpc-tools; }
$(RUBY_GEN_DIR)/.stamp: $(PROTOS) | ruby-grpc
	mkdir -p $(RUBY_GEN_DIR)
	grpc_tools_ruby_protoc -Iproto --ruby_out=$(RUBY_GEN_DIR) --grpc_out=$(RUBY_GEN_DIR) $(PROTOS)
	touch $@

# ---- cluster -------------------------------------------------------------------------------------------
# BKSIM_TLS=1 make up: every gRPC link over TLS, certificates made under <run_dir>/tls (bksim cluster up --tls);
# BKSIM_SECURE=1 make up: TLS, tokens, authorization and ZooKeeper digest ACLs (bksim cluster up --secure)
up: deps
	$(BKSIM) cluster up $(if $(filter 1 true yes,$(BKSIM_TLS)),--tls) $(if $(filter 1 true yes,$(BKSIM_SECURE)),--secure)

down: venv proto
	$(BKSIM) cluster down

status: venv proto
	$(BKSIM) cluster status

init: venv proto
	$(BKSIM) cluster init

# `make monitor`: Debian's Prometheus on $(MONITOR_HOST):$(MONITOR_PORT) (loopback only) scraping the running cluster's
# /metrics, with bksim's recording and alerting rules (bksim monitor up: files and data under $(RUN_DIR)/monitor,
# pid file $(RUN_DIR)/pids/prometheus.pid; `make down` stops it). MONITOR_ARGS passes more flags (--retention 1h).
MONITOR_HOST ?= 127.0.0.1
MONITOR_PORT ?= 9090
MONITOR_ARGS ?=
PROMETHEUS_BIN := /usr/bin/prometheus
prometheus: $(PROMETHEUS_BIN)
$(PROMETHEUS_BIN):
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus

monitor: venv proto prometheus
	$(BKSIM) monitor up --host $(MONITOR_HOST) --port $(MONITOR_PORT) $(MONITOR_ARGS)

# browser-deps: Debian's Chromium, the headless browser tests/integration/test_dashboard.py drives (--dump-dom,
# --screenshot) to check the broker's /dashboard.
CHROMIUM_BIN := /usr/bin/chromium
browser-deps: $(CHROMIUM_BIN)
$(CHROMIUM_BIN):
	apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium

# ---- tests ---------------------------------------------------------------------------------------------
# make test leaves out the smoke runs of the long benchmarks (marker benchmark_run: rereplication, soak, the
# security and metrics cost pairs, perf audit, perf scale, every row of perf targets), which make test-perf runs with
# every smoke test of `bksim perf`, and six of the nine short chaos scenario runs (marker chaos_run), which make
# test-chaos runs.
# The suite runs in TEST_WORKERS pytest-xdist workers (a test file stays on one worker; each worker hands out ports
# from its own slice, tests/conftest.py): most tests wait on processes, so two workers use the two cores.
TEST_WORKERS ?= 2
test: deps compose-tools interop-deps prometheus browser-deps
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile -m "not benchmark_run and not chaos_run" tests

test-chaos: deps
	$(PYTEST) tests/chaos

test-perf: deps
	$(PYTEST) tests/perf

test-unit: deps
	$(PYTEST) $(wildcard tests/unit tests/architecture)

test-integration: deps compose-tools prometheus browser-deps
	$(PYTEST) tests/integration

# The gRPC abuse suite (tests/abuse/, about 35 s; `make test` runs it too): hostile clients against a real bookie
# and broker, each process still serving and bounded afterwards (docs/tests.md).
test-abuse: deps
	$(PYTEST) tests/abuse

# The simulator's long sweeps (BKSIM_LONG_SWEEPS=1, about 5 minutes): the gc world over 3,000 seeds and the
# search for the first seed that catches each rare broken variant (`make test` runs their known seeds)
test-sweeps: deps
	BKSIM_LONG_SWEEPS=1 $(PYTEST) --timeout=1800 tests/sim

# The fuzz tests (tests/fuzz/) with the `long` hypothesis profile: random seeds, FUZZ_EXAMPLES examples per
# test (`make test` runs them with the fixed-seed `ci` profile). FUZZ_EXAMPLES=20000 takes about 20 minutes.
FUZZ_EXAMPLES ?= 20000
fuzz: deps
	BKSIM_FUZZ_PROFILE=long FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q --timeout=0 tests/fuzz

# Stop everything `make up` started (by pid files), then remove the run directory.
clean:
	if [ -x $(PY) ]; then $(BKSIM) cluster down; fi
	rm -rf $(RUN_DIR)

# ---- benchmarks (perf targets go here) -----------------------------------------------------------------
# `make perf` runs every benchmark, then `bksim perf targets` (the table of every target); see docs/benchmarks.md.
PERF_SECONDS ?= 5
PERF_REPEAT ?= 3
PERF_RSS_SECONDS ?= 60
.PHONY: perf
perf: deps  ## every benchmark with its same-run ratio, then the targets' table (prints figures; not a pass/fail test)
	$(BKSIM) perf fsync-baseline --record-bytes 1024 --group 16 --seconds $(PERF_SECONDS)
	$(BKSIM) perf journal-append --record-bytes 1024 --group 16 --seconds $(PERF_SECONDS) --repeat $(PERF_REPEAT)
	$(BKSIM) perf grpc-baseline --batch 100 --record-bytes 1024 --seconds $(PERF_SECONDS)
	$(BKSIM) perf bookie-add --batch 100 --record-bytes 1024 --seconds $(PERF_SECONDS) --repeat $(PERF_REPEAT)
	$(BKSIM) perf bookie-add --batch 100 --record-bytes 1024 --seconds $(PERF_RSS_SECONDS)
	$(BKSIM) perf ledger-write --both --entry-size 1024 --batch 100 --duration $(PERF_SECONDS) --repeat $(PERF_REPEAT)
	$(BKSIM) perf recovery --entries 10000 --entry-size 1024
	$(BKSIM) perf cursor-holes --entries 10000000
	$(BKSIM) perf produce --repeat $(PERF_REPEAT)
	$(BKSIM) perf consume --repeat $(PERF_REPEAT)
	$(BKSIM) perf failover --session-timeout-ms 4000
	$(BKSIM) perf audit --size $(AUDIT_SIZE)
	$(BKSIM) perf rereplication --size $(PERF_REREPLICATION_SIZE) --seconds $(PERF_SECONDS)
	$(BKSIM) perf compaction --log-mb $(COMPACTION_LOG_MB) --live $(COMPACTION_LIVE) --seconds $(PERF_SECONDS)
	$(BKSIM) perf replay --size $(REPLAY_SIZE) --repeat $(PERF_REPEAT)
	$(BKSIM) perf soak --minutes $(PERF_SOAK_MINUTES) --png $(SOAK_PNG)
	$(BKSIM) perf scale --axis all --png-dir $(SCALE_PNG_DIR) --seconds $(PERF_SECONDS)
	$(BKSIM) perf targets --seconds $(PERF_SECONDS) --rss-seconds $(PERF_RSS_SECONDS) --replay-size $(REPLAY_SIZE) \
	  $(if $(TARGETS_ROWS),--rows $(TARGETS_ROWS))

# `make perf-targets`: every performance target in one table (bksim perf targets): each row measured in the run, one
# benchmark at a time, with its value, verdict and the command that measures it alone; `make perf` ends with it.
# PERF_SECONDS for the short runs, PERF_RSS_SECONDS (60) for the bookie-rss row, REPLAY_SIZE for the replay row;
# TARGETS_ROWS=replay,bookie-rss picks rows.
TARGETS_ROWS ?=
.PHONY: perf-targets
perf-targets: deps
	$(BKSIM) perf targets --seconds $(PERF_SECONDS) --rss-seconds $(PERF_RSS_SECONDS) --replay-size $(REPLAY_SIZE) \
	  $(if $(TARGETS_ROWS),--rows $(TARGETS_ROWS))

# `make perf-compaction` (COMPACTION_LOG_MB=64, COMPACTION_LIVE=0.25): compaction's live MB/s against a raw scan of
# the same entry log, and a writer's add p99 without and during compaction, in one in-process engine.
COMPACTION_LOG_MB ?= 64
COMPACTION_LIVE ?= 0.25
.PHONY: perf-compaction
perf-compaction: deps
	$(BKSIM) perf compaction --log-mb $(COMPACTION_LOG_MB) --live $(COMPACTION_LIVE) --seconds $(PERF_SECONDS)

# `make perf-replay` (REPLAY_SIZE=256MB): the bookie's journal replay on start-up (an in-process engine crashed after a
# fill without checkpoints) against a bare parse of the same journal files.
REPLAY_SIZE ?= 256MB
.PHONY: perf-replay
perf-replay: deps
	$(BKSIM) perf replay --size $(REPLAY_SIZE) --repeat $(PERF_REPEAT)

# `make perf-soak` (SOAK_MINUTES=3): the bookies' disk usage under produce+consume on a retention-0 topic, as a
# table and a chart in $(SOAK_PNG); `make perf` runs it for PERF_SOAK_MINUTES (1).
SOAK_MINUTES ?= 3
PERF_SOAK_MINUTES ?= 1
SOAK_PNG ?= $(RUN_DIR)/perf/soak.png
.PHONY: perf-soak
perf-soak: deps
	$(BKSIM) perf soak --minutes $(SOAK_MINUTES) --png $(SOAK_PNG)

# `make perf-scale` (SCALE_AXIS=all, about 5-6 minutes on 2 cores): how cost grows with topics per broker,
# subscriptions per topic, ledgers per bookie and entry size, each axis on a fresh cluster; a table and a verdict per
# axis, and charts $(SCALE_PNG_DIR)/scale-<axis>.png. SCALE_ARGS passes more flags
# (SCALE_AXIS=topics SCALE_ARGS="--points 1,10,100").
SCALE_AXIS ?= all
SCALE_ARGS ?=
SCALE_PNG_DIR ?= $(RUN_DIR)/perf
.PHONY: perf-scale
perf-scale: deps
	$(BKSIM) perf scale --axis $(SCALE_AXIS) --png-dir $(SCALE_PNG_DIR) --seconds $(PERF_SECONDS) $(SCALE_ARGS)

# `make perf-rereplication` (REREPLICATION_SIZE=1GB): a bookie lost for good and autorecovery's copy alone; `make perf`
# runs it at PERF_REREPLICATION_SIZE (256MB, under 2 minutes).
REREPLICATION_SIZE ?= 1GB
PERF_REREPLICATION_SIZE ?= 256MB
.PHONY: perf-rereplication
perf-rereplication: deps
	$(BKSIM) perf rereplication --size $(REREPLICATION_SIZE) --seconds $(PERF_SECONDS)

# `make perf-audit` (AUDIT_SIZE=1GB): the journal audit alone: Spark local[2] and --local against a bare parse.
AUDIT_SIZE ?= 1GB
.PHONY: perf-audit
perf-audit: deps
	$(BKSIM) perf audit --size $(AUDIT_SIZE)

# ---- journal audit (see docs/audit.md) ---------------------------------------------------------------------
# `make audit`: the local cluster of `make up` (every bookie's journals and entry logs under $(RUN_DIR)) against
# a metadata snapshot taken now; report in $(AUDIT_OUT). AUDIT_ARGS passes more flags (AUDIT_ARGS=--local).
AUDIT_OUT ?= $(RUN_DIR)/audit
AUDIT_ARGS ?=
.PHONY: audit
audit: deps
	$(BKSIM) metadata export --out $(AUDIT_OUT)/snapshot.json
	$(BKSIM) audit --journals $(wildcard $(RUN_DIR)/bookie-*) --entrylogs $(wildcard $(RUN_DIR)/bookie-*) \
	  --metadata $(AUDIT_OUT)/snapshot.json --out $(AUDIT_OUT) $(AUDIT_ARGS)

# `make audit-cluster`: a Spark standalone master (spark://127.0.0.1:$(SPARK_PORT), web UI and JSON status on
# $(SPARK_UI_PORT)) and $(SPARK_WORKERS) workers on loopback, from the PySpark installation's jars, pid files and logs in
# $(SPARK_RUN_DIR); then `make audit AUDIT_ARGS=--master=spark://127.0.0.1:$(SPARK_PORT)`. `make audit-cluster-down`
# (or `bksim audit cluster down --run-dir $(SPARK_RUN_DIR)`) stops it by pid; `bksim audit cluster status` shows it.
SPARK_RUN_DIR ?= $(RUN_DIR)/spark
SPARK_PORT ?= 7077
SPARK_UI_PORT ?= 8090
SPARK_WORKERS ?= 2
.PHONY: audit-cluster audit-cluster-down
audit-cluster: deps
	$(BKSIM) audit cluster up --run-dir $(SPARK_RUN_DIR) --port $(SPARK_PORT) --ui-port $(SPARK_UI_PORT) \
	  --workers $(SPARK_WORKERS)
audit-cluster-down: deps
	$(BKSIM) audit cluster down --run-dir $(SPARK_RUN_DIR)

# ---- deterministic simulation (see docs/simulation.md) --------------------------------------------------
# `make sim SEED=N` runs one seed of the ledger world (prints its plan, PASS or the violated invariant with the
# trace tail); `make sim-sweep SEEDS=N` runs seeds 1..N with a progress line and a summary. SIM_ARGS passes
# more flags (SIM_ARGS=--trace; SIM_ARGS='--world bookie' for the bookie world, where STEPS=K sets the
# workload length and SIM_ARGS=--tolerate-known tolerates its known issues).
SEED ?= 1
SEEDS ?= 1000
STEPS ?=
SIM_ARGS ?=
.PHONY: sim sim-sweep test-sweeps
sim: venv proto
	$(BKSIM) sim --seed $(SEED) $(if $(STEPS),--steps $(STEPS)) $(SIM_ARGS)

sim-sweep: venv proto
	$(BKSIM) sim --sweep $(SEEDS) $(if $(STEPS),--steps $(STEPS)) $(SIM_ARGS)

# ---- containers (see docs/containers.md) ----------------------------------------------------------------
# compose-tools: Debian's docker-compose (v1), which tests/integration/test_compose_config.py runs
# (`docker-compose config` needs no engine). compose-check: the whole deployment end to end on a private
# dockerd (bksim compose check: build, up on host networking, write/read, kill a bookie, no loss, down).
.PHONY: compose-tools compose-check
compose-tools:
	command -v docker-compose >/dev/null || { apt-get update && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker-compose; }

# COMPOSE_CHECK_ARGS: --audit (default) also builds the audit image and runs the audit service (Spark) over the
# bookies' volumes before down; its verdict must be clean. COMPOSE_CHECK_ARGS= skips it.
COMPOSE_CHECK_ARGS ?= --audit
compose-check: deps compose-tools
	$(BKSIM) compose check $(COMPOSE_CHECK_ARGS)

# ---- chaos (see docs/chaos.md) --------------------------------------------------------------------------
# `make chaos` runs a campaign: CHAOS_RUNS runs of random scenarios and seeds, each on a fresh cluster under
# .run/chaos/, with a progress line and a summary table (also written to .run/chaos/campaign-<time>.md).
# CHAOS_ARGS passes more flags (e.g. CHAOS_ARGS='--scenarios broker-kill,bookie-kill --seed 7').
CHAOS_RUNS ?= 20
CHAOS_DURATION ?= 10
CHAOS_ARGS ?=
.PHONY: chaos
chaos: deps
	$(BKSIM) chaos campaign --runs $(CHAOS_RUNS) --duration $(CHAOS_DURATION) $(CHAOS_ARGS)

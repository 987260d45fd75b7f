# The two commands: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
ARGS   ?=
# apt-get needs root: sudo where we are not root and sudo exists.
SUDO   := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)

.PHONY: run test venv dev browser clean loadtest bench bench-cores bench-tls bench-tls-c10k crash-test failover-test bench-spark bench-cluster bench-replication bench-failover docs
.DEFAULT_GOAL := venv

# Stamps in the venv. MADE is written last when the venv is made, so a
# .venv without it (a make that failed or was interrupted half-way) is
# removed and made again. INSTALLED and DEV_INSTALLED say that the package
# (with the dev extras) is installed as the build files now describe: the
# install is editable, so a change of code needs none, and only a change of
# these files (or a new venv) installs again.
MADE          := $(VENV)/.made
INSTALLED     := $(VENV)/.installed
DEV_INSTALLED := $(VENV)/.installed-dev
BUILD_FILES   := setup.cfg setup.py pyproject.toml

# Before a venv is made, one line if $(PYTHON) cannot make it: not found,
# older than 3.11 (written so that old Pythons can run it), or without venv.
ifeq ($(wildcard $(MADE)),)
ifneq ($(filter-out clean,$(or $(MAKECMDGOALS),$(.DEFAULT_GOAL))),)
PYTHON_CHECK := $(shell $(PYTHON) -c 'import sys; v = sys.version_info; \
    print(v >= (3, 11) and ("ok" if __import__("importlib.util").util.find_spec("ensurepip") else "noensurepip") \
          or "old %d.%d.%d" % tuple(v[:3]))' 2>/dev/null || echo missing)
ifeq ($(PYTHON_CHECK),missing)
$(error $(PYTHON) cannot be run: queueserver needs Python 3.11 or newer (Debian: apt-get install python3 python3-venv), or name one with PYTHON=/path/to/python3.11)
else ifeq ($(word 1,$(PYTHON_CHECK)),old)
$(error $(PYTHON) is Python $(word 2,$(PYTHON_CHECK)): queueserver needs Python 3.11 or newer; install one and name it, e.g. make run PYTHON=python3.11)
else ifeq ($(PYTHON_CHECK),noensurepip)
$(error $(PYTHON) cannot make a virtual environment (no ensurepip); on Debian: apt-get install python3-venv)
else ifneq ($(PYTHON_CHECK),ok)
$(error $(PYTHON) did not answer the version check as a Python should (it said "$(PYTHON_CHECK)"); name Python 3.11 or newer with PYTHON=...)
endif
endif
endif

# A .venv made before these stamps is kept if it works (Python >= 3.11 and
# pip); anything else there is a venv made half-way, and goes. The pip of
# any Python >= 3.11 installs editable packages through pyproject.toml (PEP
# 660), so it is not upgraded (which would need the network for nothing).
$(MADE):
	@if [ -d $(VENV) ] && $(BIN)/python -c 'import sys, pip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then \
	    echo "keeping $(VENV): it works (Python >= 3.11, pip)"; \
	else \
	    rm -rf $(VENV) && echo "$(PYTHON) -m venv $(VENV)" && $(PYTHON) -m venv $(VENV) \
	    || { rm -rf $(VENV); echo "could not make $(VENV) with $(PYTHON) (see above); nothing is left of it" >&2; exit 1; }; \
	fi
	@touch $@

# The install compiles the hot path with mypyc (setup.py names the modules;
# about 2 minutes on 2 cores); BUILT says the compiled modules are as new as
# their sources. When one of them changes, the package is built again: a
# stale build would run plain Python (queueserver/__init__.py).
BUILT            := $(VENV)/.built
COMPILED_SOURCES := $(wildcard $(subst ",,$(shell grep -o '"queueserver/[a-z_/]*\.py"' setup.py)))

$(INSTALLED): $(MADE) $(BUILD_FILES)
	$(BIN)/pip install --quiet -e .
	@touch $@ $(BUILT)

# The dev extras include the package itself: INSTALLED is then true too.
$(DEV_INSTALLED): $(MADE) $(BUILD_FILES)
	$(BIN)/pip install --quiet -e '.[dev,spark]'
	@touch $@ $(INSTALLED) $(BUILT)

$(BUILT): $(COMPILED_SOURCES) | $(INSTALLED)
	$(BIN)/pip install --quiet --no-deps -e .
	@touch $@

venv: $(INSTALLED) $(BUILT)

dev: $(DEV_INSTALLED) $(BUILT)

# Jobs are kept in ./data (a log per shard); ARGS="--in-memory" keeps them in memory only.
run: venv
	$(BIN)/queueserver serve --data-dir ./data $(ARGS)

# Tests that drive real servers run twice: compiled with the direct path
# (the default), then as plain Python (QS_PURE_PYTHON=1: what a machine
# without a C compiler runs) with every request forwarded through the router.
SERVER_TESTS := tests/test_workq_server.py tests/test_text_protocols_server.py \
                tests/test_binary_protocols_server.py tests/test_protocol_limits_server.py \
                tests/test_router_limits.py tests/test_fuzz_server.py tests/test_client.py \
                tests/test_half_close.py tests/test_tls_server.py

# mypy --strict first (what mypyc compiles trusts the annotations); the
# bench smoke test's peers (beanstalkd, redis-server: Debian packages
# unpacked under loadtests/.peers, nothing installed) where apt can fetch them.
# Test processes side by side (pytest-xdist): most tests wait on real
# servers, so two share 2 cores well (16.8 -> 12.0 min here); more than the
# cores would make the timing of the fault tests' processes noisier.
TEST_WORKERS ?= 2

# Debian's Chromium for the tests of every page we serve (Playwright drives
# the system browser; nothing is downloaded at test time).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	    echo "installing Debian's chromium for the browser tests"; \
	    $(SUDO) apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
	    || { $(SUDO) apt-get update >/dev/null 2>&1 && $(SUDO) apt-get install -y --no-install-recommends chromium >/dev/null; }; }

test: dev browser
	$(BIN)/mypy
	@bash loadtests/install-peers.sh >/dev/null 2>&1 || echo "beanstalkd, redis-server, etcd, promtool and stunnel could not be fetched: the peers' bench smoke test is skipped, the etcd, promtool and stunnel tests fail"
	$(BIN)/python -c 'import queueserver as q; print("queueserver:", q.BUILD)'
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not long" --durations=15 $(ARGS)
	QS_PURE_PYTHON=1 QS_DIRECT_PATH=0 $(BIN)/python -m pytest -n $(TEST_WORKERS) $(SERVER_TESTS) $(ARGS)

# The long form of the kill -9 test: many SIGKILL cycles of shards and the
# router under load, then the history check (QS_CRASH_CYCLES, QS_CRASH_SEED).
crash-test: dev
	QS_CRASH_CYCLES=$${QS_CRASH_CYCLES:-40} $(BIN)/python -m pytest -s --timeout 1800 tests/test_durability_crash.py $(ARGS)

# The failover tests' long form (pytest -m long; make test runs the short
# kills): the faults (kill -9 of a primary's node, its return, kill -9 of a
# follower, a wiped node rejoining) under load QS_FAILOVER_REPEAT times
# (default 20), and a primary cut off from etcd and the other nodes; each run
# drained and checked (about 30 min).
failover-test: dev
	QS_FAILOVER_REPEAT=$${QS_FAILOVER_REPEAT:-20} $(BIN)/python -m pytest -s --timeout 3600 -m long tests/test_failover.py $(ARGS)

# A bounded headless locust run against a server it starts on loopback.
loadtest: dev
	$(BIN)/python loadtests/loadtest.py $(ARGS)

# Our server (1 and N shards) against beanstalkd and Redis on loopback, one
# table. The peers' Debian packages are downloaded and unpacked under
# loadtests/.peers/ (git-ignored) and run from there; nothing is installed.
# e.g. make bench ARGS="--quick" or ARGS="--only ours --json bench.json"
bench: venv
	$(BIN)/python loadtests/bench.py $(ARGS)

# Does a job cost the same at 1, 2, 4 and 8 shards? CPU per cycle, frames between shards and requests per loop turn
# (random ids, 64 queues), beanstalkd and Redis in the same run (about 1.5 min; ARGS="--quick", "--repeat 3", "--profile DIR").
bench-cores: venv
	$(BIN)/python loadtests/bench_cores.py $(ARGS)

# Server CPU per job cycle with workq over TLS beside plain, at 1 and 2 shards, each shard count with the
# direct path (shards terminate TLS) and forwarded (--no-direct-path: the router does); about 2 min.
bench-tls: venv
	PYTHONPATH=$(CURDIR) $(BIN)/python loadtests/cycle_cpu.py --shards 1 2 --tls --both-paths --repeat 2 --duration 5 $(ARGS)

# 10,000 idle TLS connections held while the cycle load runs over TLS and plain: memory per idle connection,
# p99 with and without them, nothing refused (about 2 min; ARGS="--idle 2000", "--shards 2", "--client-ca").
bench-tls-c10k: venv
	$(BIN)/python loadtests/tls_c10k.py $(ARGS)

# queueserver history (10M events, full and incremental) and the DataFrame writer on local[*]; ARGS="--quick" for 200k.
bench-spark: dev
	$(BIN)/python loadtests/history_bench.py $(ARGS)

# The cost of a cross-node hop and cycles/s for 1, 2, 3 nodes, all on loopback (about 3 min;
# ARGS="--quick" for ~20 s); the figures also go to loadtests/results/cluster-<time>.json.
bench-cluster: venv
	$(BIN)/python loadtests/cluster_bench.py $(ARGS)

# Durable cycles/s and p99 with and without a follower (replicas = 1), two nodes on loopback (about 1 min).
bench-replication: venv
	$(BIN)/python loadtests/replication_bench.py $(ARGS)

# Failover time (median and max over 10 kills -9 of shard 0's primary node) with etcd, and no acknowledged add lost (about 2 min).
bench-failover: dev
	$(BIN)/python loadtests/failover_bench.py $(ARGS)

# The reference in docs/ as a site in site/ (MkDocs, Material); --strict fails on a broken link or anchor.
docs: dev
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache loadtests/.peers

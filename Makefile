# The two commands: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: run test venv dev clean loadtest bench crash-test bench-spark bench-cluster

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip

# pyproject.toml declares the build backend, so pip installs through it
# (PEP 660 editable wheel), never through the deprecated `setup.py develop`.
venv: $(BIN)/python
	$(BIN)/pip install --quiet -e .

dev: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev,spark]'

# Jobs are kept in ./data (a log per shard); ARGS="--in-memory" keeps them in memory only.
run: venv
	$(BIN)/queueserver serve --data-dir ./data $(ARGS)

# Tests that drive real servers run twice: with the direct path (the
# default) and with every request forwarded through the router.
SERVER_TESTS := tests/test_workq_server.py tests/test_text_protocols_server.py \
                tests/test_binary_protocols_server.py tests/test_protocol_limits_server.py \
                tests/test_router_limits.py tests/test_fuzz_server.py tests/test_client.py

test: dev
	$(BIN)/python -m pytest $(ARGS)
	QS_DIRECT_PATH=0 $(BIN)/python -m pytest $(SERVER_TESTS) $(ARGS)

# The long form of the kill -9 test: many SIGKILL cycles of shards and the
# router under load, then the history check (QS_CRASH_CYCLES, QS_CRASH_SEED).
crash-test: dev
	QS_CRASH_CYCLES=$${QS_CRASH_CYCLES:-40} $(BIN)/python -m pytest -s --timeout 1800 tests/test_durability_crash.py $(ARGS)

# A bounded headless locust run against a server it starts on loopback.
loadtest: dev
	$(BIN)/python loadtests/loadtest.py $(ARGS)

# Our server (1 and N shards) against beanstalkd and Redis on loopback, one
# table. The peers' Debian packages are downloaded and unpacked under
# loadtests/.peers/ (git-ignored) and run from there; nothing is installed.
# e.g. make bench ARGS="--quick" or ARGS="--only ours --json bench.json"
bench: venv
	$(BIN)/python loadtests/bench.py $(ARGS)

# queueserver history (10M events, full and incremental) and the DataFrame writer on local[*]; ARGS="--quick" for 200k.
bench-spark: dev
	$(BIN)/python loadtests/history_bench.py $(ARGS)

# The cost of a cross-node hop and cycles/s for 1, 2, 3 nodes, all on loopback (about 3 min;
# ARGS="--quick" for ~20 s); the figures also go to loadtests/results/cluster-<time>.json.
bench-cluster: venv
	$(BIN)/python loadtests/cluster_bench.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache loadtests/.peers

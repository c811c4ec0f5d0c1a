# Every target installs what it needs first (scripts/bootstrap.sh): OS packages, .venv, jars.
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help bootstrap demo verify soak test full unit lint stack-up stack-down stack-status bench \
	bench-connectors bench-test spark-matrix

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

bootstrap: ## install OS packages, the .venv and the package (idempotent)
	@bash scripts/bootstrap.sh

demo: bootstrap ## the main job: word count into Kafka, PostgreSQL, Redis; crashed at every point of every sink; counted
	$(BIN)/eos demo $(DEMO_ARGS)

verify: bootstrap ## the harness: every fault point, random kills, all three sinks (eos verify)
	$(BIN)/eos verify

SOAK_ARGS ?= --records 1000000 --cells running-count,aggregate,event-time,records,batch-commit,changelog --fault-rounds 3 \
	--full-crashes all --kills 3 --restart kafka --restart postgres --restart redis
SOAK_CLUSTER_ARGS ?= --records 100000 --cells running-count,records --fault-rounds 3 --kills 2
SOAK_REPLICATED_ARGS ?= --records 1000000 --cells running-count,records,changelog --kills 2 \
	--kill-broker input-leader --kill-broker output-leader --kill-broker coordinator \
	--kill-broker input-leader --kill-broker coordinator --kill-broker min-isr \
	--network-fault postgres:reset --network-fault postgres:cut --network-fault postgres:latency \
	--network-fault redis:reset --network-fault redis:cut --network-fault redis:latency \
	--network-fault kafka:reset --network-fault kafka:cut --network-fault kafka:latency \
	--step-fault coordinator --step-fault postgres --step-fault redis --step-fault postgres-partition
soak: bootstrap ## the depth CI leaves out: soak tests, 1M records through every cell (every point a full crash), 3 rounds on a 2-worker cluster, then 1M records on a 3-broker Kafka with broker kills, step faults and network faults, checkpoints on HDFS
	$(BIN)/python -m pytest -v -m soak $(PYTEST_ARGS)
	$(HIGHEST_PYTHON) -m pytest -v -m 'newer_spark and soak' $(PYTEST_ARGS) tests/spark
	$(BIN)/eos verify $(SOAK_ARGS) --report soak-report.json
	$(BIN)/eos stack up --spark-workers 2
	$(BIN)/eos verify $(SOAK_CLUSTER_ARGS) --report soak-cluster-report.json \
		--master "$$($(BIN)/eos stack env | sed -n 's/^export EOS_SPARK_MASTER=//p')"
	$(BIN)/eos stack down
	$(BIN)/eos stack up --kafka-brokers 3 --spark-workers 2 --hdfs
	eval "$$($(BIN)/eos stack env)" && $(BIN)/eos verify $(SOAK_REPLICATED_ARGS) \
		--report soak-replicated-report.json --master "$$EOS_SPARK_MASTER" \
		--checkpoint-root "$$EOS_HDFS_URL/soak"
	$(BIN)/eos stack down

test: bootstrap ## lint, then the CI tier against real Kafka, PostgreSQL, Redis and Spark (~14 min)
	bash scripts/test.sh $(PYTEST_ARGS)

full: bootstrap ## the CI tier and the second tier (wheel, parity, stack lifecycle, bench probes)
	bash scripts/test.sh -m 'not soak and not bench' $(PYTEST_ARGS)

unit: bootstrap ## the tests that need no server
	$(BIN)/python -m pytest -v tests/unit $(PYTEST_ARGS)

lint: bootstrap ## ruff, mypy and the layer contracts (import-linter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

spark-matrix: bootstrap ## the quickstart, eos state get and the whole conformance suite on every supported PySpark minor, each in a virtualenv of its own (~20 min)
	bash scripts/spark_matrix.sh

# The benchmark runs on the highest supported PySpark (its targets are that release's; the
# .venv holds the lowest, for CI): a virtualenv of just that PySpark beside the .venv's.
HIGHEST_PYTHON = $$($(BIN)/python -m eos_connectors.dev.release_venv)

bench-test: bootstrap ## the benchmark smoke tests (each pipeline of make bench runs and counts right)
	$(HIGHEST_PYTHON) -m pytest -v -m bench $(PYTEST_ARGS)

bench: bootstrap ## the keyed count here vs Spark's JVM connector, Quix Streams, a raw loop, on the highest PySpark; rounds in ABBA order until each ratio is known to +-3% (~30-50 min)
	$(HIGHEST_PYTHON) -m eos_connectors.cli bench compare

bench-connectors: bootstrap ## each connector vs its own baseline (source, postgres, kafka, redis), on the highest PySpark
	$(HIGHEST_PYTHON) -m eos_connectors.cli bench source
	$(HIGHEST_PYTHON) -m eos_connectors.cli bench postgres
	$(HIGHEST_PYTHON) -m eos_connectors.cli bench kafka
	$(HIGHEST_PYTHON) -m eos_connectors.cli bench redis

stack-up: bootstrap ## start the local Kafka/PostgreSQL/Redis stack
	$(BIN)/eos stack up

stack-down: bootstrap ## stop the local stack
	$(BIN)/eos stack down

stack-status: bootstrap ## show the local stack
	$(BIN)/eos stack status

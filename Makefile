# Every target installs what it needs first (scripts/bootstrap.sh): OS packages, .venv, jars.
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help bootstrap demo test unit lint stack-up stack-down stack-status bench

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

bootstrap: ## install OS packages, the .venv and the package (idempotent)
	@bash scripts/bootstrap.sh

demo: bootstrap ## the main job: start the stack and run the demo pipeline end to end
	$(BIN)/eos demo

test: bootstrap lint ## lint, then every test against real Kafka, PostgreSQL and Redis
	$(BIN)/python -m pytest -v $(PYTEST_ARGS)

unit: bootstrap ## the tests that need no server
	$(BIN)/python -m pytest -v tests/unit $(PYTEST_ARGS)

lint: bootstrap ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: bootstrap ## throughput vs baselines, ratios from one run (source, postgres, kafka, redis)
	$(BIN)/eos bench source
	$(BIN)/eos bench postgres
	$(BIN)/eos bench kafka
	$(BIN)/eos bench redis

stack-up: bootstrap ## start the local Kafka/PostgreSQL/Redis stack
	$(BIN)/eos stack up

stack-down: bootstrap ## stop the local stack
	$(BIN)/eos stack down

stack-status: bootstrap ## show the local stack
	$(BIN)/eos stack status

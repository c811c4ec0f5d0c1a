#!/usr/bin/env bash
# `make test`: lint, then the CI tier of the tests against real services.
#
# The services start (and what the tests fetch or build once is prepared) while ruff,
# mypy and the layer contracts run, so a fresh machine's downloads and start-ups overlap
# the lint. The services are the local stack (Kafka, PostgreSQL, Redis, a 2-worker Spark
# cluster, HDFS), unless EOS_KAFKA_BOOTSTRAP names services already; what this script
# started, it stops. pytest leaves its JUnit XML and a table of the slowest tests in
# test-results/ (junit-unit.xml and durations-unit.md for the tests that need no
# server). Arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
results=test-results
mkdir -p "$results"

stack_pid=""
ours=0
if [ -z "${EOS_KAFKA_BOOTSTRAP:-}" ]; then
  "$bin/eos" stack status >/dev/null 2>&1 || ours=1
  "$bin/eos" stack up --spark-workers 2 --hdfs >"$results/stack-up.log" 2>&1 &
  stack_pid=$!
fi
"$bin/python" -m eos_connectors.dev.prefetch >"$results/prefetch.log" 2>&1 &
prefetch_pid=$!

stop_ours() {
  if [ "$ours" = 1 ]; then "$bin/eos" stack down >>"$results/stack-up.log" 2>&1 || true; fi
}
trap stop_ours EXIT

began=$(date +%s)
status=0
"$bin/ruff" check . && "$bin/ruff" format --check . && "$bin/mypy" && "$bin/lint-imports" \
  || status=$?
echo "test.sh: lint took $(( $(date +%s) - began )) s"
[ "$status" = 0 ] || exit "$status"

# Without arguments, the tests that need no server run while the services finish
# starting, then the rest; with arguments (a selection, a marker), pytest gets them alone.
if [ "$#" = 0 ]; then
  "$bin/python" -m pytest -q --junitxml="$results/junit-unit.xml" tests/unit examples \
    || status=$?
  set -- tests/services tests/spark tests/system
fi
wait "$prefetch_pid" || { echo "test.sh: prefetch failed:"; cat "$results/prefetch.log"; }
if [ -n "$stack_pid" ] && ! wait "$stack_pid"; then
  echo "test.sh: eos stack up failed:"; cat "$results/stack-up.log"; exit 1
fi
echo "test.sh: services up after $(( $(date +%s) - began )) s"
"$bin/python" -m pytest -v --junitxml="$results/junit.xml" "$@" || status=$?
exit "$status"

#!/usr/bin/env bash
# `make test`: lint, then the CI tier of the tests against real services.
#
# The services start (and what the tests fetch or build once is prepared) while ruff,
# mypy and the layer contracts run, and the unit tier beside them, so a fresh machine's
# downloads and start-ups overlap them. The services are the local stack (Kafka,
# PostgreSQL, Redis; then a 2-worker Spark cluster and HDFS, see start_late) and a
# Kafka, PostgreSQL and Redis more for each other pytest worker, unless
# EOS_KAFKA_BOOTSTRAP names services already; what this script started, it stops.
#
# Without arguments: the lint and the unit tier (and examples/) in the background, and
# once the services are up the services and Spark tiers on two pytest workers
# (pytest-xdist, EOS_TEST_WORKERS; they wait on brokers and timeouts about half the
# time, and each worker has services of its own: tests/conftest.py) with the system
# tier's lighter tests, then the rest of the system tier, one test at a time (its
# whole-pipeline runs keep both cores busy, and one of them restarts a service). With
# arguments, the lint, then one pytest run gets them. Each run leaves its JUnit XML and
# a table of its slowest tests in test-results/ (and the system tier's harness runs,
# each whole-pipeline run's end and seconds, in harness-runs.md).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
# The run's JVMs (each test's and each pipeline's Spark driver, the executors, HDFS, the
# Spark cluster, Kafka's tools) compile with C1 alone: they run small batches for
# seconds to minutes, where C2's compiling costs more CPU than it wins back, and the CI
# machine's two cores are busy the whole run. Four Spark test files took 130
# core-seconds instead of 184 (-29%), 115 s instead of 132. The brokers too
# (EOS_KAFKA_JIT, connectors/dev/stack/kafka.py): one broker's share of the services tier
# fell from 48 to 27 core-seconds, its start from 11 to 6. The launcher says "Picked up
# JDK_JAVA_OPTIONS" on each JVM's stderr. Not for `make bench`: its JVMs run as users'.
export JDK_JAVA_OPTIONS="${JDK_JAVA_OPTIONS:-} -XX:TieredStopAtLevel=1"
export EOS_KAFKA_JIT=c1
results=test-results
mkdir -p "$results"

declare -a stack_pids=()
declare -a our_roots=()
default_root=$("$bin/python" -c 'from eos_connectors.dev.stack import default_root; print(default_root())')
# The services and Spark tiers' pytest workers (pytest-xdist), each with services of its
# own: gw0 the default stack, gwN <default>-gwN.
workers=${EOS_TEST_WORKERS:-2}
extra_roots=()
for ((n = 1; n < workers; n++)); do extra_roots+=("$default_root-gw$n"); done

start_stack() {  # root, eos stack up arguments...
  local root=$1
  shift
  if ! EOS_STACK_DIR=$root "$bin/eos" stack status >/dev/null 2>&1; then our_roots+=("$root"); fi
  EOS_STACK_DIR=$root "$bin/eos" stack up "$@" >>"$results/stack-up.log" 2>&1 &
  stack_pids+=($!)
}

stop_ours() {
  for root in "${our_roots[@]}"; do
    EOS_STACK_DIR=$root "$bin/eos" stack down >>"$results/stack-up.log" 2>&1 || true
  done
}
trap stop_ours EXIT

: >"$results/stack-up.log"
if [ -z "${EOS_KAFKA_BOOTSTRAP:-}" ]; then
  if [ "$#" = 0 ]; then  # the Spark cluster and HDFS follow once these are up: start_late
    start_stack "$default_root"
    for root in "${extra_roots[@]}"; do start_stack "$root"; done
  else
    start_stack "$default_root" --spark-workers 2 --hdfs
  fi
fi
"$bin/python" -m eos_connectors.dev.prefetch early >"$results/prefetch.log" 2>&1 &
prefetch_pid=$!
"$bin/python" -m eos_connectors.dev.prefetch archive >"$results/prefetch-archive.log" 2>&1 &
prefetch_archive_pid=$!
"$bin/python" -m eos_connectors.dev.prefetch proxy >"$results/prefetch-proxy.log" 2>&1 &
prefetch_proxy_pid=$!
"$bin/python" -m eos_connectors.dev.prefetch late >"$results/prefetch-late.log" 2>&1 &
prefetch_late_pid=$!

began=$(date +%s)
status=0
lint() {
  nice -n 5 "$bin/ruff" check . && nice -n 5 "$bin/ruff" format --check . \
    && nice -n 5 "$bin/mypy" && nice -n 5 "$bin/lint-imports"
}
# With arguments: the lint, then the tests; a lint failure stops the run.
#
# The whole CI tier: the lint and the unit tier (and examples/) run in the background,
# each keeping about one core busy (mypy, one pytest process), at a lower CPU priority
# than the services' start and the early prefetch, and the services and Spark tiers
# start as soon as the services are up, not after the lint: on a fresh 2-core clone the
# lint took 131 s beside the services' start, the prefetch and the unit tier, while the
# services were up after ~80 s; the services tier's workers wait on brokers and timeouts
# about half the time, which the lint fills. A lint or unit failure fails the run at
# the end. (Each pytest session prints its selection's expected cost; a collection of
# the whole suite up front, for one total, held the lint and the unit tier ~7 s.)
lint_pid=""
unit_pid=""
if [ "$#" = 0 ]; then
  { lint; echo "test.sh: lint ended ($?) after $(( $(date +%s) - began )) s"; } \
    >"$results/lint.log" 2>&1 &
  lint_pid=$!
  { nice -n 5 "$bin/python" -m pytest -q --junitxml="$results/junit-unit.xml" tests/unit \
      examples; } >"$results/unit.log" 2>&1 &
  unit_pid=$!
else
  lint || status=$?
  echo "test.sh: lint took $(( $(date +%s) - began )) s"
  [ "$status" = 0 ] || exit "$status"
fi

# The background lint and unit tier: their output, and the run fails if either did.
lint_and_unit_ended() {
  local ok=0
  if ! wait "$lint_pid"; then ok=1; fi
  cat "$results/lint.log"
  grep -q "test.sh: lint ended (0)" "$results/lint.log" || ok=1
  wait "$unit_pid" || ok=1
  cat "$results/unit.log"
  echo "test.sh: the lint and the unit tier ended after $(( $(date +%s) - began )) s"
  return "$ok"
}

services_up() {
  wait "$prefetch_pid" || { echo "test.sh: prefetch failed:"; cat "$results/prefetch.log"; }
  for pid in "${stack_pids[@]}"; do
    if ! wait "$pid"; then
      echo "test.sh: eos stack up failed:"; cat "$results/stack-up.log"; exit 1
    fi
  done
  echo "test.sh: services up after $(( $(date +%s) - began )) s"
  if [ -z "${EOS_KAFKA_BOOTSTRAP:-}" ]; then  # both workers use the first stack's HDFS
    export_hdfs
  fi
}

export_hdfs() {
  eval "$(EOS_STACK_DIR=$default_root "$bin/eos" stack env | grep -E '^export EOS_(WEB)?HDFS_URL=')"
}

# The Spark cluster (three JVMs) and HDFS (two), which only the hdfs- and cluster-marked
# tests need, start once Kafka, PostgreSQL and Redis are up, beside the first tests
# rather than beside the lint and the unit tier (whose end they delayed by ~10 s). An
# HDFS test that comes first waits for them: EOS_HDFS_STACK_DIR names the stack that
# starts them (tests/conftest.py's hdfs_url takes its lock).
late_pid=""
start_late() {
  [ -z "${EOS_KAFKA_BOOTSTRAP:-}" ] || return 0
  EOS_STACK_DIR=$default_root "$bin/eos" stack up --spark-workers 2 --hdfs \
    >>"$results/stack-up.log" 2>&1 &
  late_pid=$!
  export EOS_HDFS_STACK_DIR=$default_root
}

prefetched_rest() {  # what the system tier needs: Toxiproxy, Hadoop's jars, the class archive
  wait "$prefetch_archive_pid" || { echo "test.sh: prefetch failed:"; cat "$results/prefetch-archive.log"; }
  wait "$prefetch_proxy_pid" || { echo "test.sh: prefetch failed:"; cat "$results/prefetch-proxy.log"; }
  wait "$prefetch_late_pid" || { echo "test.sh: prefetch failed:"; cat "$results/prefetch-late.log"; }
}

late_up() {
  prefetched_rest
  [ -n "$late_pid" ] || return 0
  if ! wait "$late_pid"; then
    echo "test.sh: the Spark cluster and HDFS did not start:"; cat "$results/stack-up.log"; exit 1
  fi
  echo "test.sh: the Spark cluster and HDFS up after $(( $(date +%s) - began )) s"
  export_hdfs
}

if [ "$#" != 0 ]; then
  services_up
  prefetched_rest
  "$bin/python" -m pytest -v --junitxml="$results/junit.xml" "$@" || status=$?
  exit "$status"
fi

services_up
start_late
if [ -n "${EOS_KAFKA_BOOTSTRAP:-}" ]; then workers=0; fi  # services of one's own: not shared
# Two workers on two cores (EOS_TEST_WORKERS): the tests wait on brokers, timeouts and
# Spark's scheduling much of the time. With two, the tier took 448 s for 851 s of
# tests; with three, 424-426 s for ~1,190 s: each test slower, the cores near their
# limit (load average 8-10), ~20 s won, and two timing races lost (ci99).
# The system tier's lighter tests run with them rather than alone after them: a batch
# job's processes one after another (68 s at ~1.15 cores), a Spark process failing on
# wrong passwords (22 s), the reference cell on the highest PySpark (one query, ~40 s),
# the harness refusing bad plans (7 s). The whole-pipeline runs that keep both cores
# busy (conformance, the cluster) stay in the system tier, one at a time: run beside
# other tests, the conformance run took 493 s, not 200.
light=(tests/system/test_batch_job_crashes.py tests/system/test_secrets_in_spark.py
  tests/system/test_spark_range.py tests/system/test_verify.py)
"$bin/python" -m pytest -v -n "$workers" --junitxml="$results/junit-services.xml" \
  tests/services tests/spark "${light[@]}" || status=$?
lint_and_unit_ended || status=1
# The other workers' services are idle from here on (an idle broker alone keeps ~5% of
# a core busy): stop them before the system tier, if this script started them.
for root in "${our_roots[@]}"; do
  if [ "$root" != "$default_root" ]; then
    EOS_STACK_DIR=$root "$bin/eos" stack down >>"$results/stack-up.log" 2>&1 || true
  fi
done
late_up
"$bin/python" -m pytest -v --junitxml="$results/junit-system.xml" tests/system \
  "${light[@]/#/--ignore=}" || status=$?
echo "test.sh: tests took $(( $(date +%s) - began )) s after lint began"
exit "$status"

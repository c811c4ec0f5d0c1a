#!/usr/bin/env bash
# `make spark-matrix`: every supported PySpark minor, each in a virtualenv of its own
# (.venvs/spark-<release>) with the wheel built from this checkout: the README's
# quickstart (examples/quickstart.py, run twice: the second run counts only the new
# words), the task identity the sinks need (eos_connectors.dev.release_check), `eos
# state get` on a transformWithState query's checkpoint (tests/spark/test_savepoints.py,
# its local variant) and the whole conformance suite (every cell, each fault point
# crossed), exact.
#
#   SPARK_RELEASES="4.0.5 4.1.4 4.2.1 4.3.0"   the releases (latest patch of each minor)
#   MATRIX_CELLS=...                            the cells (default: all of them)
#   MATRIX_PYTHON=python3.12                    the interpreter of the virtualenvs
#
# Uses the services named by EOS_KAFKA_BOOTSTRAP etc. when set, else starts the local
# stack and stops it at the end. Writes test-results/spark-matrix.md. ~4 min a release.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
releases=${SPARK_RELEASES:-"4.0.5 4.1.4 4.2.1 4.3.0"}
cells=${MATRIX_CELLS:-running-count,aggregate,event-time,records,batch-commit,changelog}
results=test-results
mkdir -p "$results" .venvs

# The virtualenvs' interpreter, checked before anything is built: a pyenv shim (say
# python3.13 outside a version pyenv selects) fails every release's row otherwise.
interpreter=${MATRIX_PYTHON:-python3}
if ! "$interpreter" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
  echo "spark_matrix.sh: MATRIX_PYTHON=$interpreter does not run a Python 3.11 or later;" \
    "give the interpreter's path (for pyenv: \$(pyenv root)/versions/<version>/bin/python3)" >&2
  exit 2
fi

rm -rf .venvs/dist && "$bin/python" -m build -q --wheel -o .venvs/dist . >/dev/null || exit 1
wheel=$(ls .venvs/dist/*.whl)

started=""
if [ -z "${EOS_KAFKA_BOOTSTRAP:-}" ]; then
  "$bin/eos" stack up >"$results/spark-matrix-stack.log" 2>&1 || { cat "$results/spark-matrix-stack.log"; exit 1; }
  started=yes
  eval "$("$bin/eos" stack env)"
fi
trap '[ -n "$started" ] && "$bin/eos" stack down >/dev/null 2>&1' EXIT

table="$results/spark-matrix.md"
printf '| PySpark | Python | task identity, update mode | quickstart | state get | conformance (%s) | seconds |\n|---|---|---|---|---|---|--:|\n' \
  "$cells" >"$table"
status=0
for release in $releases; do
  venv=$PWD/.venvs/spark-$release-$("$interpreter" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')
  began=$(date +%s)
  [ -x "$venv/bin/python" ] || "$interpreter" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "pyspark[connect]==$release" "$wheel" pytest pytest-timeout \
    pyyaml >"$results/spark-$release-install.log" 2>&1 \
    && "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel" >>"$results/spark-$release-install.log" 2>&1
  installed=$("$venv/bin/python" -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null)
  python=$("$venv/bin/python" -c 'import platform; print(platform.python_version())')
  export PYSPARK_PYTHON="$venv/bin/python"
  quick=failed
  work=$(mktemp -d)
  log="$results/spark-$release-quickstart"
  if [ "$installed" = "$release" ] \
    && TMPDIR=$work "$venv/bin/python" examples/quickstart.py >"$log-1.log" 2>&1 \
    && TMPDIR=$work "$venv/bin/python" examples/quickstart.py >"$log-2.log" 2>&1; then
    # The topic keeps every run's words: the second run adds one "end" and three "the"
    # to what the first counted, and "the" stays three times "end".
    first=$(awk '$1 == "the" || $1 == "end" {print $1 "=" $2}' "$log-1.log" | sort | tr '\n' ' ')
    second=$(awk '$1 == "the" || $1 == "end" {print $1 "=" $2}' "$log-2.log" | sort | tr '\n' ' ')
    end1=$(echo "$first" | sed -n 's/.*end=\([0-9]*\).*/\1/p')
    the2=$(echo "$second" | sed -n 's/.*the=\([0-9]*\).*/\1/p')
    end2=$(echo "$second" | sed -n 's/.*end=\([0-9]*\).*/\1/p')
    if [ -n "$end1" ] && [ "$end2" = $((end1 + 1)) ] && [ "$the2" = $((3 * end2)) ]; then
      quick=exact
    fi
  fi
  identity=failed
  if (cd "$work" && "$venv/bin/python" -m eos_connectors.dev.release_check) >"$results/spark-$release-identity.log" 2>&1; then
    identity=ok
  fi
  state=failed  # the repository's test, against the wheel installed in the virtualenv
  if PYTHONPATH=$PWD "$venv/bin/python" -m pytest -q -p no:cacheprovider -m soak \
    -k 'state_get and local' tests/spark/test_savepoints.py >"$results/spark-$release-state.log" 2>&1; then
    state=exact
  fi
  conformance=failed
  if "$venv/bin/eos" verify --cells "$cells" --coverage pairs --work-dir "$work/verify" \
    --report "$results/spark-$release-verify.json" >"$results/spark-$release-verify.log" 2>&1; then
    conformance=exact
  fi
  rm -rf "$work"
  printf '| %s | %s | %s | %s | %s | %s | %d |\n' "${installed:-not installed}" "$python" "$identity" "$quick" \
    "$state" "$conformance" \
    $(( $(date +%s) - began )) >>"$table"
  [ "$identity" = ok ] && [ "$quick" = exact ] && [ "$state" = exact ] && [ "$conformance" = exact ] \
    || status=1
done
cat "$table"
exit "$status"

#!/usr/bin/env bash
# Install what the project needs on a fresh Debian/Ubuntu machine, then nothing on later runs:
# OS packages (Java, Maven, PostgreSQL, PgBouncer, Redis, Go), the .venv with the package and its test extra.
# The Kafka broker's jars are resolved from Maven Central by `eos stack up` on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1 \
  || missing+=(postgresql)
command -v runuser >/dev/null 2>&1 || missing+=(util-linux)
# PgBouncer: a test checks that a pooler sharing sessions is refused, session mode passes
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
# Go builds Toxiproxy (the network-fault tests' TCP proxy) from its module, once
command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || missing+=(golang-go)

if ((${#missing[@]})); then
  echo "bootstrap: installing OS packages: ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then sudo=(); elif command -v sudo >/dev/null; then sudo=(sudo); else
    echo "bootstrap: need root or sudo to install: ${missing[*]}" >&2; exit 1
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python=$candidate; break; fi
  done
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "bootstrap: Python >= 3.11 is needed (found $("$python" --version))" >&2; exit 1; }

# The .venv is made without pip, and the newest pip put in it by the interpreter's own pip
# (`pip --python`, pip 22.3+): venv's ensurepip installs a bundled pip that the next
# step upgraded anyway (7.0 s against 3.1 s here). Without a pip of its own, ensurepip.
[ -x .venv/bin/python ] || "$python" -m venv --without-pip .venv
# The package installs as eos_connectors from the folders connectors/, sources/ and
# sinks/ (pyproject.toml's package-dir): an editable install in setuptools' strict mode
# links each module into build/__editable__.*, which mypy can follow too. A module
# added or removed needs a new install: the stamp covers the list of modules.
modules=$(find connectors sources sinks -name '*.py' | sort)
stamp=".venv/.installed-$( (cat pyproject.toml; echo "$modules") | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "bootstrap: installing the package and its development dependencies into .venv"
  # pip 25.1+ (`--group`): from the interpreter's pip, else from ensurepip, upgraded
  if ! .venv/bin/python -c 'import pip, sys
sys.exit(tuple(int(n) for n in pip.__version__.split(".")[:2]) < (25, 1))' 2>/dev/null; then
    "$python" -m pip --python .venv/bin/python install -q --upgrade pip 2>/dev/null \
      || { .venv/bin/python -m ensurepip >/dev/null && .venv/bin/python -m pip install -q --upgrade pip; }
  fi
  # pip compiles every module it installs on one core (52 s in all here); installed as
  # is and compiled on every core, less the test suites of the dependencies that no
  # process imports, it took 24 s + 15 s. The bytecode is needed ahead: a machine may
  # set PYTHONDONTWRITEBYTECODE, and every Spark worker would then compile its imports.
  # Left out too: the development tools no Spark process imports (mypy is compiled
  # already; pip, matplotlib and their kin), about 45% of the source.
  .venv/bin/python -m pip install -q --no-compile -e . --group dev \
    --config-settings editable_mode=strict
  skip='tests?|testing|mypyc?|matplotlib|mpl_toolkits|fontTools|PIL|pip|setuptools'
  skip+='|pkg_resources|pygments|rich|pyparsing'
  .venv/bin/python -m compileall -q -j 0 -x "/($skip)/" \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" build \
    >/dev/null || echo "bootstrap: some modules did not compile (they compile when imported)"
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# Commit messages: "area: what changed", at most 72 characters (scripts/hooks/commit-msg).
if git rev-parse --git-dir >/dev/null 2>&1 \
    && [ "$(git config core.hooksPath || true)" != scripts/hooks ]; then
  git config core.hooksPath scripts/hooks
fi

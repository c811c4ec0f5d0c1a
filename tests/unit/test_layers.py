"""The layers of docs/architecture.md, as `make lint` checks them (import-linter's
contracts in pyproject.toml), and what that tool cannot see: modules named as strings.

Spark imports the worker daemon by the name in ``spark.python.daemon.module``, the
daemon imports its preload list by name, and a few tools start ``python -m <module>``.
None of these is an import statement, so each string that names a module of this
package is checked here against the same layers. Cost: under 1 s.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "connectors": "eos_connectors",
    "sources": "eos_connectors.sources",
    "sinks": "eos_connectors.sinks",
}
NAMED = re.compile(r"^(eos_connectors(?:\.\w+)+)(?::\w+)?$")


def _layers() -> list[set[str]]:
    """The layer contract's layers, top first, each a set of packages."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["id"] == "layers")
    return [{part.strip() for part in re.split(r"[|:]", layer)} for layer in contract["layers"]]


def _layer_of(module: str, layers: list[set[str]]) -> int | None:
    for index, layer in enumerate(layers):
        if any(module == name or module.startswith(f"{name}.") for name in layer):
            return index
    return None


def _module_name(path: Path) -> str:
    relative = path.relative_to(ROOT)
    base = FOLDERS[relative.parts[0]]
    parts = [p for p in relative.with_suffix("").parts[1:] if p != "__init__"]
    return ".".join([base, *parts])


def _named_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) for each string constant in ``path`` that names a module of this
    package (``eos_connectors.x.y`` or ``eos_connectors.x.y:attr``)."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    loggers = {  # logging.getLogger("eos_connectors.x.librdkafka") names a logger
        id(call.args[0])
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute | ast.Name)
        and getattr(call.func, "attr", getattr(call.func, "id", "")) == "getLogger"
        and call.args
    }
    for node in ast.walk(tree):
        if id(node) in loggers:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            matched = NAMED.match(node.value.strip())
            if matched:
                found.append((node.lineno, matched.group(1)))
    return found


def _package_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_a_module_named_as_a_string_is_in_a_layer_its_namer_may_use() -> None:
    """The preload list names connector modules from beside the registry (allowed: they
    are below it); the old daemon path names the new daemon from the ground floor, which
    runs it by name only (runpy, see core/worker_daemon.py): allowed as a string, and the
    one such name from below that this test lists on purpose."""
    layers = _layers()
    allowed_upward = {("eos_connectors.core.worker_daemon", "eos_connectors.worker_daemon")}
    wrong = []
    for path in _package_files():
        namer = _module_name(path)
        for line, named in _named_modules(path):
            own, other = _layer_of(namer, layers), _layer_of(named, layers)
            if own is None or other is None or other >= own or (namer, named) in allowed_upward:
                continue
            wrong.append(f"{path.relative_to(ROOT)}:{line} names {named}")
    assert wrong == [], wrong


def test_every_module_named_as_a_string_exists() -> None:
    """A renamed module leaves no string behind that names its old path (the preload list
    would skip it silently: a missing module there is taken for an optional one)."""
    missing = []
    known = {_module_name(p) for p in _package_files()}
    for path in _package_files():
        for line, named in _named_modules(path):
            if named not in known and not any(k.startswith(f"{named}.") for k in known):
                missing.append(f"{path.relative_to(ROOT)}:{line} names {named}")
    assert missing == [], missing


def test_the_old_daemon_path_runs_the_daemon_with_the_task_modules_preloaded() -> None:
    """``spark.python.daemon.module=eos_connectors.core.worker_daemon`` (the name before
    the daemon moved) still preloads every task module, then hands over to PySpark's
    daemon: run here as Spark runs it, with PySpark's daemon loop replaced by a probe."""
    probe = (
        "import sys, runpy, pyspark.daemon\n"
        "from eos_connectors.worker_daemon import PRELOAD\n"
        "pyspark.daemon.manager = lambda: print('preloaded', all(n in sys.modules for n in "
        "PRELOAD if n.startswith('eos_connectors')))\n"
        "runpy.run_module('eos_connectors.core.worker_daemon', run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["preloaded", "True"], done.stderr[-2000:]


def test_every_layer_of_the_contract_exists() -> None:
    """A package renamed or removed would leave a layer that checks nothing."""
    known = {_module_name(p) for p in _package_files()}
    for layer in _layers():
        for name in layer:
            assert any(k == name or k.startswith(f"{name}.") for k in known), name

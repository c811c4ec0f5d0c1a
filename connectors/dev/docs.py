"""The options tables of the connectors' docs pages, generated from the declarations.

Each connector declares its options once (:class:`eos_connectors.core.options.OptionTable`).
Its docs page holds the generated table between two markers::

    <!-- options: eos_postgres -->
    | option | default | applies to | meaning |
    ...
    <!-- /options -->

``python -m eos_connectors.dev.docs`` rewrites every such block from the declarations;
``python -m eos_connectors.dev.docs --check`` exits 1 naming each page whose block
differs (``tests/unit/test_option_docs.py`` runs the same check).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from eos_connectors.core.options import OptionTable

#: (docs page, marker name) -> the module whose OPTIONS it shows.
PAGES = {
    ("kafka-source.md", "eos_kafka source"): "eos_connectors.sources.kafka.options",
    ("kafka-sink.md", "eos_kafka sink"): "eos_connectors.sinks.kafka.options",
    ("postgres-sink.md", "eos_postgres"): "eos_connectors.sinks.postgres.options",
    ("redis-sink.md", "eos_redis"): "eos_connectors.sinks.redis.options",
}
_BLOCK = re.compile(
    r"(<!-- options: (?P<name>[^>]+?) -->\n)(?P<table>.*?)(<!-- /options -->)", re.S
)


def table_of(module: str) -> OptionTable:
    import importlib

    table = importlib.import_module(module).OPTIONS
    assert isinstance(table, OptionTable), module
    return table


def rendered(page: str, docs: Path) -> tuple[str, str]:
    """(the page now, the page with its options block generated)."""
    text = (docs / page).read_text()
    modules = {name: module for (file, name), module in PAGES.items() if file == page}

    def generate(found: re.Match[str]) -> str:
        module = modules[found.group("name")]
        return f"{found.group(1)}{table_of(module).markdown()}\n{found.group(4)}"

    return text, _BLOCK.sub(generate, text)


def stale(docs: Path) -> list[str]:
    """The pages whose options block is missing or differs from the declarations."""
    found = []
    for page, name in PAGES:
        text, generated = rendered(page, docs)
        if f"<!-- options: {name} -->" not in text or text != generated:
            found.append(page)
    return sorted(set(found))


def main(argv: list[str]) -> int:
    docs = Path(argv[argv.index("--docs") + 1]) if "--docs" in argv else Path("docs")
    if "--check" in argv:
        pages = stale(docs)
        for page in pages:
            print(
                f"{docs / page}: its options table differs from the declared options",
                file=sys.stderr,
            )
        return 1 if pages else 0
    for page in sorted({page for page, _ in PAGES}):
        text, generated = rendered(page, docs)
        if generated != text:
            (docs / page).write_text(generated)
            print(f"rewrote {docs / page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

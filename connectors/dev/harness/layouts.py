"""How a query's rows reach its sink's tasks, start after start: the crossing layouts.

A query with ``layouts`` (``QuerySpec.layouts``) starts in the first; each time the sink
refuses a batch because one key's rows reached two of its tasks
(:class:`~eos_connectors.core.changes.KeyAcrossTasksError`), the pipeline prints a
``refused`` event with what the sink held at that moment and restarts the query in the
next layout, as an operator applying the refusal's fix would. A crash keeps the layout:
the replay meets the same refusal. The layouts:

* ``split``: the source's own split (``minPartitions`` above the topic's partitions
  cuts each partition into pieces, each a task): a key's changes reach several tasks;
* ``round-robin``: ``repartition(n)`` before the sink: each key over every task;
* ``by-key``: ``repartition(n, key)``: the fix the refusal names; exact from there on.

Nothing overrides the split a batch recorded: the refused batch is replayed with the
source split it was planned with, whatever the layout after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eos_connectors.dev.harness.spec import PipelineSpec, QuerySpec
from eos_connectors.ops.locations import Location, location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

LAYOUTS = ("split", "round-robin", "by-key")
CROSSING = ("split", "round-robin")
#: The refusal a crossing layout must meet: the error's class, as Spark passes it on in
#: the query's failure (the task's Python traceback).
REFUSAL = "KeyAcrossTasksError"
SHUFFLE_PARTITIONS = 3


def current(spec: PipelineSpec, query: QuerySpec) -> str | None:
    """The layout of this start of ``query`` (None: it has none): the refusals so far
    are counted in a file beside its checkpoint, so a new pipeline process goes on."""
    if not query.layouts:
        return None
    refused = _counter(spec, query)
    index = int(refused.read_text()) if refused.exists() else 0
    return query.layouts[min(index, len(query.layouts) - 1)]


def advance(spec: PipelineSpec, query: QuerySpec) -> None:
    """The sink refused a batch of ``query``: its next start takes the next layout."""
    refused = _counter(spec, query)
    index = int(refused.read_text()) if refused.exists() else 0
    refused.parent.mkdir(parents=True, exist_ok=True)
    refused.write_text(str(index + 1))


def _counter(spec: PipelineSpec, query: QuerySpec) -> Location:
    return location(spec.checkpoint) / f".{query.name}.refusals"


def apply(frame: DataFrame, layout: str | None, key: str) -> DataFrame:
    """``frame`` (the sink's input) in ``layout``: ``split`` is the source's own."""
    if layout == "round-robin":
        return frame.repartition(SHUFFLE_PARTITIONS)
    if layout == "by-key":
        return frame.repartition(SHUFFLE_PARTITIONS, key)
    return frame


def key_column(query: QuerySpec) -> str:
    """The sink's key column, from its options (PostgreSQL ``keyColumns``, Redis
    ``keyColumn``)."""
    named = query.options.get("keyColumns") or query.options.get("keyColumn") or ""
    return named.split(",")[0].strip()


def held(query: QuerySpec) -> int | None:
    """Rows (PostgreSQL) or keys (Redis) the query's sink holds now; None when the store
    did not answer (the harness may be restarting it)."""
    try:
        return _held(query)
    except Exception:  # a store restarted mid-run: unknown, not a finding
        return None


def _held(query: QuerySpec) -> int:
    options = query.options
    if query.format == "eos_postgres":
        import psycopg
        from psycopg import sql

        with psycopg.connect(options["dsn"], autocommit=True) as conn:
            (found,) = conn.execute("SELECT to_regclass(%s)", (options["table"],)).fetchone() or (
                None,
            )
            if found is None:
                return 0
            query_text = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(options["table"]))
            (count,) = conn.execute(query_text).fetchone() or (0,)
            return int(count)
    if query.format == "eos_redis":
        import redis

        client = redis.Redis.from_url(options["url"])
        try:
            return sum(1 for _ in client.scan_iter(f"{options['keyPrefix']}*", count=1000))
        finally:
            client.close()
    raise ValueError(f"query {query.name}: no layouts for {query.format}")


def refusal_problems(queries: list[QuerySpec], refusals: list[dict[str, object]]) -> list[str]:
    """What the ``refused`` events of a whole harness run show wrong: a query with layouts
    never refused in one of its crossing layouts, a refusal that does not name a key, two
    tasks and the fix, or a refused first batch that left rows in the sink (a refusal
    writes nothing). A refusal in the fixed layout is wrong too."""
    problems = []
    for query in (q for q in queries if q.layouts):
        mine = [r for r in refusals if r.get("query") == query.name]
        for layout in (layout for layout in query.layouts if layout in CROSSING):
            if not any(r.get("layout") == layout for r in mine):
                problems.append(f"Query {query.name} was never refused in layout {layout!r}.")
        for refusal in mine:
            message = str(refusal.get("message", ""))
            if refusal.get("layout") not in CROSSING:
                problems.append(f"Query {query.name} was refused in its fixed layout: {message}")
            if not ("Key " in message and "partitions " in message and ".repartition(" in message):
                problems.append(
                    f"Query {query.name}'s refusal names no key, tasks or fix: {message}"
                )
            if refusal.get("committed") == 0 and refusal.get("held") not in (0, None):
                problems.append(
                    f"Query {query.name}'s first batch was refused and the sink held "
                    f"{refusal.get('held')} rows or keys: a refusal must write nothing."
                )
    return problems

"""Change streams into PostgreSQL and Redis against the real servers: deletes, updates,
several changes of one key in one task applied in ``orderColumns`` order, and bad changes
refused with nothing written. Batch writes (one task each), so the order Spark hands
the rows over in is not the order they apply in."""

from __future__ import annotations

import random

import psycopg
import pyarrow as pa
import pytest
import redis
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import lit

from eos_connectors.core.changes import ChangeRules
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres.changes import Target
from eos_connectors.sinks.postgres.changes import apply as apply_changes
from eos_connectors.sinks.redis import scripts

pytestmark = [pytest.mark.services, pytest.mark.spark]

SCHEMA = "id string, v string, op string, partition int, offset long"


def _changes(seed: int, keys: int = 30, count: int = 400) -> list[tuple[object, ...]]:
    """Inserts, updates, deletes and re-inserts of ``keys`` keys, as a change stream orders
    them (offset), and the state they leave."""
    rng = random.Random(seed)
    live: set[str] = set()
    rows: list[tuple[object, ...]] = []
    for offset in range(count):
        key = f"k{rng.randrange(keys)}"
        op = ("d" if rng.random() < 0.3 else "u") if key in live else "c"
        (live.discard if op == "d" else live.add)(key)
        rows.append((key, None if op == "d" else f"{key}@{offset}", op, 0, offset))
    return rows


def _final(rows: list[tuple[object, ...]]) -> dict[str, str]:
    state: dict[str, str] = {}
    for key, value, op, _p, _o in sorted(rows, key=lambda r: int(str(r[4]))):
        if op == "d":
            state.pop(str(key), None)
        else:
            state[str(key)] = str(value)
    return state


def _frame(spark: SparkSession, rows: list[tuple[object, ...]]) -> DataFrame:
    shuffled = list(rows)
    random.Random(1).shuffle(shuffled)  # out of order: only orderColumns can tell
    return spark.createDataFrame(shuffled, SCHEMA).coalesce(1)


def _write(df: DataFrame, fmt: str, unique: str, options: dict[str, str], version: int = 1) -> None:
    job = {"sinkId": f"chg-{unique}-{fmt}", "txnVersion": str(version)}
    df.write.format(fmt).options(**options, **job).mode("append").save()


def _table(dsn: str, table: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        return {str(k): str(v) for k, v in conn.execute(f'SELECT id, v FROM "{table}"')}


def test_postgres_applies_deletes_and_updates_in_source_order(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    rows = _changes(seed=3)
    table = f"chg_{unique}"
    pg = {"dsn": endpoints.postgres_dsn, "table": table, "keyColumns": "id", "createTable": "true"}
    changes = {"deleteColumn": "op", "deleteValue": "d", "orderColumns": "partition,offset"}
    _write(_frame(spark, rows), "eos_postgres", unique, {"mode": "upsert", **pg, **changes})
    expected = _final(rows)
    assert _table(endpoints.postgres_dsn, table) == expected
    assert 0 < len(expected) < 30, "some keys must end deleted"
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,)
            )
        ]
    assert sorted(columns) == ["id", "v"], "control columns are not written"

    # mode=update: existing keys only; a tombstone-like row (all values null) deletes;
    # a delete of a key that is not there changes nothing.
    live = sorted(expected)
    more = [
        (live[0], "updated", "u", 0, 1000),
        ("brand-new", "never", "c", 0, 1001),
        (live[1], None, "u", 0, 1002),
        ("not-there", None, "d", 0, 1003),
    ]
    update = {"deleteWhenValuesNull": "true", "orderColumns": "offset"}
    _write(
        spark.createDataFrame(more, SCHEMA).drop("op", "partition"),
        "eos_postgres",
        unique,
        {"mode": "update", **pg, **update},
        version=2,
    )
    after = {**expected, live[0]: "updated"}
    del after[live[1]]
    assert _table(endpoints.postgres_dsn, table) == after


def test_postgres_refuses_changes_whose_order_or_key_is_unknown_and_writes_nothing(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    table = f"chgbad_{unique}"
    pg = {"dsn": endpoints.postgres_dsn, "table": table, "keyColumns": "id", "createTable": "true"}
    changes = {"deleteColumn": "op", "deleteValue": "d", "mode": "upsert"}
    twice = [("a", "1", "c", 0, 1), ("a", "2", "u", 0, 2), ("b", "1", "c", 0, 3)]
    with pytest.raises(Exception, match=r"Several changes of key id='a'.*no orderColumns"):
        frame = spark.createDataFrame(twice, SCHEMA).coalesce(1)
        _write(frame, "eos_postgres", unique, {**pg, **changes})
    keyless = [("a", "1", "c", 0, 1), (None, "2", "u", 1, 7)]
    frame = spark.createDataFrame(keyless, SCHEMA).withColumn("topic", lit("orders"))
    with pytest.raises(Exception, match=r"has no key.*topic orders, partition 1, offset 7"):
        options = {**pg, "table": f"{table}_k", **changes}
        _write(frame.coalesce(1), "eos_postgres", unique, options, version=2)
    assert _table(endpoints.postgres_dsn, table) == {}


def test_redis_applies_deletes_in_source_order_for_strings_and_hashes(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    rows = _changes(seed=5)
    expected = _final(rows)
    changes = {"deleteColumn": "op", "deleteValue": "d", "orderColumns": "partition,offset"}
    for target in ("s", "h"):  # a string per key, a hash per key
        prefix = f"chg:{unique}:{target}:"
        options = {"url": endpoints.redis_url, "keyColumn": "id", "keyPrefix": prefix}
        frame = _frame(spark, rows).withColumn("source", lit("db"))
        values = "v" if target == "s" else "v,source"
        options = {**options, **changes, "valueColumns": values}
        _write(frame, "eos_redis", f"{unique}-{target}", options)
        client = redis.Redis.from_url(endpoints.redis_url)
        try:
            found = {}
            for key in client.scan_iter(f"{prefix}*", count=1000):
                name = key.decode().removeprefix(prefix)
                value = client.get(key) if target == "s" else client.hget(key, "v")
                found[name] = value.decode() if isinstance(value, bytes) else str(value)
        finally:
            client.close()
        assert found == expected, target


def test_a_delete_of_a_key_that_is_not_there_changes_nothing_and_is_counted(
    endpoints: Endpoints, unique: str
) -> None:
    """Both stores say how many deletes found no key (the sinks log that figure)."""
    table = f"chgabsent_{unique}"
    rules = ChangeRules(delete_column="op", delete_value="d", order_columns=("offset",))
    target = Target(
        table=(table,),
        stage_schema="eos",
        columns=("id", "v", "op", "offset"),
        keys=("id",),
        rules=rules,
        control_types=(("op", "text"), ("offset", "bigint")),
        update_only=False,
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "id": ["kept", "gone", "never", "gone", "later"],
            "v": ["1", None, None, None, "2"],
            "op": ["u", "d", "d", "d", "c"],
            "offset": [1, 2, 3, 4, 5],
        }
    )
    with psycopg.connect(endpoints.postgres_dsn) as conn, conn.cursor() as cur:
        cur.execute(f'CREATE TABLE "{table}" (id text PRIMARY KEY, v text)')
        cur.execute(f"INSERT INTO \"{table}\" VALUES ('kept', '0'), ('gone', '0')")
        applied = apply_changes(cur, target, f"absent-{unique}", iter([batch]))
    assert (applied.rows, applied.deletes, applied.deleted, applied.absent) == (5, 2, 1, 1)
    assert _table(endpoints.postgres_dsn, table) == {"kept": "1", "later": "2"}

    client = redis.Redis.from_url(endpoints.redis_url)
    try:
        prefix = f"chgabsent:{unique}:"
        client.set(prefix + "gone", "0")
        apply = client.register_script(scripts.APPLY_ENTRIES)
        entries = ["d", prefix + "gone", "", "d", prefix + "never", "", "u", prefix + "new", "1"]
        applied_n, failed, absent = apply(args=["changes", "", "0", "0", *entries])
        assert (applied_n, failed, absent) == (3, 0, 1)
        assert sorted(k.decode() for k in client.scan_iter(prefix + "*")) == [prefix + "new"]
    finally:
        client.close()

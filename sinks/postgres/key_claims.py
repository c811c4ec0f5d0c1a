"""One key, one task of a batch: each exactly-once task claims its keys before it writes
(task side), and a key another task of the batch claimed refuses the batch.

Two tasks of one batch that write one key cannot apply its changes in their order:
neither sees the other's prepared transaction, so a delete in one task misses the
other's insert (the row comes back), and an update waits on the other's prepared row
lock until ``lock_timeout`` and fails every replay alike. A task therefore claims the
keys it staged before it takes any row lock: it copies their digests, with its
partition, into ``<bookkeepingSchema>.batch_keys`` on a second connection that commits
at once, so every other task of the batch sees the claims whether or not its own
transaction is prepared yet. A digest another partition claimed first refuses this
task within seconds, naming the key, both partitions and the fix; the batch is then
never decided and the driver rolls every unit back.

A claim is one ``COPY`` from the stage into the claims table: the table's primary key
is (sink, batch, run, key), so a key another task of the batch claimed first fails the
copy; only then does the task take the slow path that tells another partition's claim
(a refusal) from its own earlier attempt's (a retry): a batch whose keys stay in their
tasks pays one copy a task, no temporary table, no join.

Claims are kept per query run: a replay after a restart (with the fix, a
``repartition`` by the key, applied) is never refused by the claims of the run that
failed. The driver forgets a batch's claims once it is committed or aborted, on a thread
of its own (:func:`forget_later`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg import sql

from eos_connectors.core.changes import KeyAcrossTasksError
from eos_connectors.core.protocol import UnitId
from eos_connectors.sinks.postgres.connection import first_line, give_back, take
from eos_connectors.sinks.postgres.options import PostgresSinkOptions

Cursor = psycopg.Cursor[tuple[Any, ...]]
Connection = psycopg.Connection[tuple[Any, ...]]

TABLE = "batch_keys"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claimant:
    """Who claims: one partition of one batch of one query run of one sink."""

    sink_id: str
    batch_id: int
    run: str
    partition: int

    @classmethod
    def of(cls, unit: UnitId) -> Claimant:
        return cls(unit.sink_id, unit.batch_id, unit.run, unit.partition)


def create_table(conn: Connection, schema: str) -> None:
    """Driver, at query start: the claims table (no lock any prepared transaction holds)."""
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ("
            " sink_id text NOT NULL, batch_id bigint NOT NULL, run text NOT NULL,"
            " key uuid NOT NULL, partition int NOT NULL,"
            " PRIMARY KEY (sink_id, batch_id, run, key))"
        ).format(sql.Identifier(schema, TABLE))
    )


def claim(
    cur: Cursor,
    side: Connection,
    schema: str,
    stage: sql.Identifier,
    keys: Sequence[str],
    unit: UnitId,
) -> None:
    """Task, before any row lock on the target: claim the keys staged in ``stage`` (inside
    the task's transaction, on ``cur``) for the unit's partition, committed on ``side``;
    raise :class:`KeyAcrossTasksError` when another partition of the batch holds one."""
    who = Claimant.of(unit)
    if _copied(cur, side, schema, stage, keys, who):
        return
    _claim_each(cur, side, schema, stage, keys, who)


def _copied(
    cur: Cursor,
    side: Connection,
    schema: str,
    stage: sql.Identifier,
    keys: Sequence[str],
    who: Claimant,
) -> bool:
    """Task: every key's claim in one copy, committed; False when some key of the batch
    was claimed already (by another partition, or by an earlier attempt of this one)."""
    claims = sql.SQL(
        "COPY (SELECT DISTINCT {sink_id}, {batch_id}::bigint, {run}, {digest}, {partition}::int"
        " FROM {stage}) TO STDOUT (FORMAT binary)"
    ).format(
        sink_id=sql.Literal(who.sink_id),
        batch_id=sql.Literal(who.batch_id),
        run=sql.Literal(who.run),
        digest=_digest(keys),
        partition=sql.Literal(who.partition),
        stage=stage,
    )
    into = sql.SQL(
        "COPY {} (sink_id, batch_id, run, key, partition) FROM STDIN (FORMAT binary)"
    ).format(sql.Identifier(schema, TABLE))
    try:
        with (
            side.transaction(),
            cur.copy(claims) as out,
            side.cursor().copy(into) as claimed,
        ):
            for data in out:
                claimed.write(data)
    except psycopg.errors.UniqueViolation:
        return False
    return True


def _claim_each(
    cur: Cursor,
    side: Connection,
    schema: str,
    stage: sql.Identifier,
    keys: Sequence[str],
    who: Claimant,
) -> None:
    """Task: the claims that are not there yet, then the first key another partition of
    the batch holds, if any (a refusal)."""
    digests = sql.SQL(
        "COPY (SELECT DISTINCT {digest} FROM {stage}) TO STDOUT (FORMAT binary)"
    ).format(digest=_digest(keys), stage=stage)
    with side.transaction():
        side.execute(sql.SQL("CREATE TEMP TABLE eos_claim (key uuid NOT NULL) ON COMMIT DROP"))
        with (
            cur.copy(digests) as out,
            side.cursor().copy("COPY eos_claim (key) FROM STDIN (FORMAT binary)") as into,
        ):
            for data in out:
                into.write(data)
        table = sql.Identifier(schema, TABLE)
        side.execute(
            sql.SQL(
                "INSERT INTO {} (sink_id, batch_id, run, key, partition)"
                " SELECT %(sink_id)s, %(batch_id)s, %(run)s, key, %(partition)s FROM eos_claim"
                " ON CONFLICT DO NOTHING"
            ).format(table),
            asdict(who),
        )
        # A statement of its own: its snapshot sees the claims the insert waited for.
        other = side.execute(
            sql.SQL(
                "SELECT b.key, b.partition FROM eos_claim c JOIN {} b ON b.key = c.key"
                " WHERE b.sink_id = %(sink_id)s AND b.batch_id = %(batch_id)s AND b.run = %(run)s"
                " AND b.partition <> %(partition)s LIMIT 1"
            ).format(table),
            asdict(who),
        ).fetchone()
    if other is not None:
        raise _refusal(cur, stage, keys, who, other[0], int(other[1]))


def forget(conn: Connection, schema: str, sink_id: str, up_to_batch: int) -> None:
    """Driver: the claims of ``up_to_batch`` and older batches go (``eos sinks reset``;
    a query's commits use :func:`forget_later`)."""
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE sink_id = %s AND batch_id <= %s").format(
            sql.Identifier(schema, TABLE)
        ),
        (sink_id, up_to_batch),
    )


def forgotten(timeout: float) -> bool:
    """Whether every forget :func:`forget_later` was given has run within ``timeout``."""
    return _FORGETTER.idle(timeout)


def forget_later(options: PostgresSinkOptions, sink_id: str, up_to_batch: int) -> None:
    """Driver, once a batch is committed or aborted: its claims (and older ones) go, on a
    thread of the driver's own, off the commit's path. Nothing reads a claim of a decided
    batch again (a claim is checked against its own batch and run), so a forget that is
    late, or lost with the driver, costs only rows that the next forget of the sink (or
    ``eos sinks reset``) deletes; the DELETE of a batch's claims (a row a key) took
    ~60 ms of each PostgreSQL commit in ``make bench`` when it ran on the path."""
    _FORGETTER.add(options, sink_id, up_to_batch)


class _Forgetter:
    """The driver's pending forgets, newest batch per (sink options, sink id), and the one
    thread that runs them."""

    def __init__(self) -> None:
        self._pending: dict[tuple[PostgresSinkOptions, str], int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._busy = False

    def add(self, options: PostgresSinkOptions, sink_id: str, up_to_batch: int) -> None:
        with self._lock:
            key = (options, sink_id)
            self._pending[key] = max(up_to_batch, self._pending.get(key, up_to_batch))
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="eos-forget", daemon=True)
                self._thread.start()
        self._wake.set()

    def idle(self, timeout: float) -> bool:
        """Whether every pending forget ran within ``timeout`` seconds (for tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending and not self._busy:
                    return True
            time.sleep(0.01)
        return False

    def _run(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                self._wake.clear()
                pending, self._pending = self._pending, {}
                self._busy = bool(pending)
            for (options, sink_id), batch in pending.items():
                self._forget(options, sink_id, batch)
            with self._lock:
                self._busy = False

    @staticmethod
    def _forget(options: PostgresSinkOptions, sink_id: str, up_to_batch: int) -> None:
        try:
            conn = take(options, "forget")
        except Exception as exc:  # a later forget deletes these claims too
            log.debug("claims of %s not forgotten: %s", sink_id, first_line(exc, options))
            return
        try:
            forget(conn, options.bookkeeping_schema, sink_id, up_to_batch)
        except Exception as exc:
            log.debug("claims of %s not forgotten: %s", sink_id, first_line(exc, options))
        finally:
            give_back(options, conn, "forget")


_FORGETTER = _Forgetter()


def _digest(keys: Sequence[str]) -> sql.Composable:
    """A key's digest: md5 of its columns' row text, as a uuid (16 bytes)."""
    columns = sql.SQL(", ").join(map(sql.Identifier, keys))
    return sql.SQL("md5(ROW({})::text)::uuid").format(columns)


def _refusal(
    cur: Cursor,
    stage: sql.Identifier,
    keys: Sequence[str],
    who: Claimant,
    digest: object,
    partition: int,
) -> KeyAcrossTasksError:
    row = cur.execute(
        sql.SQL("SELECT {} FROM {} WHERE {} = %s LIMIT 1").format(
            sql.SQL(", ").join(map(sql.Identifier, keys)), stage, _digest(keys)
        ),
        (digest,),
    ).fetchone()
    shown = ", ".join(f"{k}={v!r}" for k, v in zip(keys, row or (), strict=False))
    by_key = ", ".join(repr(k) for k in keys)
    return KeyAcrossTasksError(
        shown or "(unknown)", who.sink_id, who.batch_id, (partition, who.partition), by_key
    )

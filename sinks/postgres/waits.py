"""Task, exactly once: a wait for a prepared unit of the task's own batch, found and ended.

A task whose statement needs a row lock another task of the same batch holds waits for
that task's prepared transaction: a key of a unique constraint both insert (append mode
with duplicate keys in two tasks), a row both update, a row whose foreign key names a
row the other inserts. The driver commits that
transaction only once this task has reported, so the wait ends only at the sink's
``lock_timeout`` (60 s), on every retry of the task, and then says only "lock timeout".
While a task's statements run, :class:`PreparedWait` looks from a second connection,
after :data:`FIRST_LOOK_S` and then every :data:`LOOK_EVERY_S`, whether the task's
backend waits for a transaction prepared under a unit of its sink's batch and query run
from another task partition; found, it cancels the task's statement, and the task fails
naming both task partitions. Tasks that end before the first look open no connection.
"""

from __future__ import annotations

import threading
from types import TracebackType

import psycopg

from eos_connectors.core.errors import BadRecordError
from eos_connectors.core.protocol import UnitId
from eos_connectors.sinks.postgres.connection import Connection, connect
from eos_connectors.sinks.postgres.options import PostgresSinkOptions

#: Seconds before the first look: most tasks are done by then.
FIRST_LOOK_S = 2.0
#: Seconds between looks after it.
LOOK_EVERY_S = 2.0

#: The prepared transactions (their gids) whose transaction id a backend waits to lock.
_HOLDERS = (
    "SELECT p.gid FROM pg_locks w "
    "JOIN pg_locks h ON h.locktype = 'transactionid' AND h.transactionid = w.transactionid "
    "AND h.granted "
    "JOIN pg_prepared_xacts p ON p.transaction = h.transactionid "
    "WHERE w.pid = %s AND w.locktype = 'transactionid' AND NOT w.granted"
)


class PreparedWaitError(BadRecordError):
    """A task waited for a prepared unit of another task partition of its own batch."""

    def __init__(self, options: PostgresSinkOptions, unit: UnitId, holder: int) -> None:
        super().__init__(
            f"Task partition {unit.partition} of batch {unit.batch_id} of sink "
            f"{unit.sink_id!r} waited, writing into {options.table_name} (option table), for "
            f"a row that task partition {holder} of the same batch holds until the batch "
            "commits, which waits for this task: two tasks of the batch write the same key "
            "of a unique constraint, or the same row (or one references a row the other "
            "inserts). Nothing of the batch is written. In append mode each key must reach "
            "one task: drop the duplicates, or "
            "write with mode=upsert and keyColumns (the last row of a key wins), or "
            ".repartition(<key columns>) just before the sink."
        )


class PreparedWait:
    """Task: watches the backend ``pid`` while ``unit``'s statements run (a context)."""

    def __init__(self, options: PostgresSinkOptions, unit: UnitId, pid: int) -> None:
        self.options, self.unit, self.pid = options, unit, pid
        #: The task partition whose prepared unit the task waited for, once found.
        self.holder: int | None = None
        self._done = threading.Event()
        #: Held while the task's statement is cancelled, and taken by :meth:`__exit__`: a
        #: cancel never reaches the connection's next statement (its next task's).
        self._cancelling = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="eos-pg-wait", daemon=True)

    def __enter__(self) -> PreparedWait:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._cancelling:  # not joined: a look at a frozen server ends on its own
            self._done.set()

    def _watch(self) -> None:
        conn: Connection | None = None
        try:
            wait = FIRST_LOOK_S
            while not self._done.wait(wait):
                wait = LOOK_EVERY_S
                conn = conn if conn is not None else connect(self.options)
                holder = self._holder(conn)
                if holder is not None:
                    with self._cancelling:
                        if not self._done.is_set():
                            self.holder = holder
                            conn.execute("SELECT pg_cancel_backend(%s)", (self.pid,))
                    return
        except (psycopg.Error, OSError):
            return  # a look that fails changes nothing: the lock timeout still ends the wait
        finally:
            if conn is not None:
                conn.close()

    def _holder(self, conn: Connection) -> int | None:
        """The other task partition of this batch and run whose prepared unit the task
        waits for (a stray of an earlier run is left to the lock timeout, as before: its
        run's abort or the next commit's recovery ends it)."""
        mine = self.unit
        for (gid,) in conn.execute(_HOLDERS, (self.pid,)).fetchall():
            held = UnitId.parse(str(gid))
            if (
                held is not None
                and (held.sink_id, held.batch_id, held.run)
                == (mine.sink_id, mine.batch_id, mine.run)
                and held.partition != mine.partition
            ):
                return held.partition
        return None

"""Driver: a stream's checkpoint that is behind its sink's decisions.

Spark numbers a query's batches in its checkpoint, and every exactly-once sink of this
package writes nothing for a batch number it already decided for the query: a replay,
whose records it wrote. That holds while the checkpoint only moves forward. A checkpoint
restored from an older copy (a backup, a snapshot of its volume) or one whose last
``offsets/`` files were deleted by hand has Spark plan those numbers again, over
records that need not be the ones the sink wrote under them (more input since, another
trigger, another ``maxOffsetsPerTrigger``): the sink would skip them as written, losing
what they hold beyond the first run's batches, and the batches after would start where
the new ones end, writing again what the first run wrote past it. So the sink refuses:

- at a stream's start (:func:`refuse_at_start`), when its last decided batch for the
  query is past the last batch the checkpoint planned, or is that batch but was decided
  over other source positions (PostgreSQL and Redis from their decisions; the Kafka
  sink, at a start that replays the batch, from its decision record or, in
  ``commitMode=task``, its task partitions' markers);
- at a batch's commit (:func:`refuse_at_commit`), when a batch whose tasks found it
  decided is below a later decision of the query: this covers a checkpoint the start
  cannot read (``s3a:``, or one set by ``spark.sql.streaming.checkpointLocation`` only);
- at a batch's commit (:func:`refuse_replanned`), when a batch whose tasks found it
  decided (or marked) is the query's last decided one but its decision (or markers)
  recorded other source positions than the checkpoint's ``offsets/N`` plans now
  (:func:`planned_offsets`): a checkpoint put back by exactly one batch, in a driver
  whose start checks ran before (they run once per driver). A replay reads the very
  file the first attempt planned, so its positions are the decided ones.

A stream's batch found decided is otherwise always its last decided one (Spark plans
batch N+1 only once N is in ``commits/``), so no refusal can meet a healthy query;
the commit of a driver of an earlier run, paused while a later run decided past its
batch and woken, is refused too, which ends that stale run before it does anything.
A batch job's versions are not a stream's batches (a rerun of an older version writes
nothing, by design): its commits skip :func:`refuse_at_commit`. A batch write from a
stream's ``foreachBatch`` whose ``txnVersion`` is the stream's batch id is both: its
tasks see the stream's batch id in Spark's local properties, and refuse a version below
the job's highest (:func:`refuse_in_foreach_batch`).
"""

from __future__ import annotations

import hashlib

from eos_connectors.core.errors import EosError


class CheckpointBehindSinkError(EosError):
    """The stream's checkpoint planned fewer batches than its sink decided: it was restored
    from an older copy, or its last offsets were deleted."""


#: The sinks whose units ``eos sinks settle`` commits (a Kafka sink's open transactions
#: end at their timeout instead; another store's tool is its own).
SETTLED_BY_EOS_SINKS = ("eos_postgres", "eos_redis")


def _what_to_do(connector: str, sink_id: str) -> str:
    settle = (
        f"run `eos sinks settle {sink_id}` (it commits what the sink's decisions name, so "
        "nothing of a batch decided but not finished stays prepared, holding locks), then "
        if connector in SETTLED_BY_EOS_SINKS
        else ""
    )
    return (
        "Restore the checkpoint as it was when the sink decided that batch (its offsets/ and "
        "commits/ files up to it) and restart. To reprocess from this checkpoint on purpose, "
        f"{settle}give the query another sinkId than {sink_id!r}: the target then gets the "
        "records of the batches replanned a second time. Nothing was written."
    )


def refuse_at_start(
    connector: str,
    sink_id: str,
    query_id: str,
    decided: int | None,
    checkpoint: str,
    planned: int,
    over: tuple[str, str] = ("", ""),
) -> None:
    """Driver, at a stream's start: refuse when sink ``sink_id`` decided batch ``decided``
    (its last, for query ``query_id``) past ``planned``, the last batch the checkpoint
    planned (-1: none); or decided that very batch over other source positions than the
    checkpoint plans for it now (``over``: the decision's digest and the checkpoint's,
    :func:`refuse_replanned`), as a checkpoint put back by one batch and restarted once
    already holds."""
    if decided is not None and decided == planned:
        refuse_replanned(connector, sink_id, decided, *over)
    if decided is None or decided <= planned:
        return
    shown = f"batch {planned}" if planned >= 0 else "no batch"
    again = f"batch {decided}" if decided == planned + 1 else f"batches {planned + 1}-{decided}"
    raise CheckpointBehindSinkError(
        f"{connector}: sink {sink_id!r} of this query ({query_id}) decided batch {decided}, "
        f"but checkpoint {checkpoint} has planned only up to {shown}: the checkpoint is older "
        "than the sink (restored from a copy, or its last offsets files deleted). Spark would "
        f"plan {again} again over records that need not be the ones the sink wrote under "
        "the same numbers, and the sink would skip them as written: records would be lost "
        f"or written twice. {_what_to_do(connector, sink_id)}"
    )


def refuse_at_commit(connector: str, sink_id: str, batch: int, later: int) -> None:
    """Driver, at a stream's commit of ``batch``, whose tasks found it decided or applied:
    refuse when the sink decided ``later`` (its highest for the query) past it."""
    if later <= batch:
        return
    raise CheckpointBehindSinkError(
        f"{connector}: batch {batch} of this query was found decided, but sink {sink_id!r} "
        f"has decided up to batch {later}: the query's checkpoint is older than the sink "
        "(restored from a copy, or its last offsets files deleted), and Spark planned batch "
        f"{batch} again, over records that need not be the ones the sink wrote under that "
        "number. The batch is refused before it is recorded, so nothing is skipped. (A "
        "driver of an earlier run, paused while a later run went on, is refused the same "
        "way: its run is over.) " + _what_to_do(connector, sink_id)
    )


def planned_offsets(offsets_file: str | None) -> str:
    """Driver: a digest of the source positions an ``offsets/N`` file plans (its lines
    after the version and the batch's metadata, whose batch time differs in every
    planning); "" when the file could not be read (an ``s3a:`` checkpoint)."""
    if offsets_file is None:
        return ""
    positions = offsets_file.split("\n")[2:]
    return hashlib.sha256("\n".join(positions).strip().encode()).hexdigest()[:24]


def refuse_replanned(
    connector: str, sink_id: str, batch: int, decided_over: str, planned: str
) -> None:
    """Driver, at a stream's commit of ``batch``, whose tasks found it decided (or at its
    start, :func:`refuse_at_start`): refuse when its decision recorded other source
    positions (``decided_over``, a digest of :func:`planned_offsets`) than the checkpoint
    plans for it now (``planned``). Either unknown ("": a decision written before digests
    were kept, a checkpoint the driver cannot read) passes."""
    if not replanned_over(decided_over, planned):
        return
    raise CheckpointBehindSinkError(
        f"{connector}: batch {batch} of this query was found decided by sink {sink_id!r}, "
        f"but over other source positions than offsets/{batch} of the query's checkpoint "
        "plans now: the checkpoint was put back (its last offsets files deleted, or "
        f"restored from an older copy) and Spark planned batch {batch} again, over records "
        "that need not be the ones the sink wrote under that number. The batch is refused "
        "before it is recorded, so nothing is skipped. " + _what_to_do(connector, sink_id)
    )


def refuse_replanned_write(
    connector: str, sink_id: str, version: int, decided_over: str, planned: str
) -> None:
    """Driver, planning (or committing) a batch write from a stream's ``foreachBatch`` with
    ``streamCheckpoint``: :func:`refuse_replanned`, in a batch write's terms."""
    if not replanned_over(decided_over, planned):
        return
    raise CheckpointBehindSinkError(
        f"{connector}: this write runs for batch {version} of a stream (txnVersion "
        f"{version}), but job {sink_id!r} decided that version over other source positions "
        f"than offsets/{version} of the stream's checkpoint (option 'streamCheckpoint') "
        "plans now: the checkpoint was put back (its last offsets files deleted, or "
        f"restored from an older copy) and Spark planned batch {version} again over records "
        "that need not be the ones written under that number; as a rerun the write would "
        "write nothing of them. Restore the checkpoint as it was and restart, or give the "
        "writes new sinkIds to reprocess from it (the targets then get those records a "
        "second time). Nothing was written."
    )


def replanned_over(decided_over: str, planned: str) -> bool:
    """Whether a decision's digest and the checkpoint's are both known and differ (either
    "" is unknown: it passes)."""
    return bool(decided_over and planned) and decided_over != planned


#: The local property Spark sets on a micro-batch's jobs, ``foreachBatch``'s included.
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def refuse_in_foreach_batch(connector: str, sink_id: str, version: int, highest: int) -> None:
    """Task of a batch write: when it runs inside a stream's ``foreachBatch`` whose batch id
    is the write's ``version`` (``txnVersion=batch_id``, the documented recipe), refuse a
    version below ``highest``, the job's highest decided or committed one: the stream's
    checkpoint is behind the sink, and the write would take the replanned batch for a
    rerun and write nothing. A batch write outside a stream, or with other versions,
    passes."""
    if version >= highest or not in_foreach_batch(version):
        return
    raise CheckpointBehindSinkError(
        f"{connector}: this write runs in foreachBatch for batch {version} of a stream, but "
        f"job {sink_id!r} has written up to txnVersion {highest}: the stream's checkpoint is "
        "older than the sink (restored from a copy, or its last offsets files deleted), and "
        f"Spark planned batch {version} again over records that need not be the ones "
        "written under that number; as a rerun it would write nothing of them. "
        "Restore the checkpoint as it was and restart, or give the writes new sinkIds to "
        "reprocess from it (the targets then get those records a second time). Nothing "
        "was written."
    )


def in_foreach_batch(version: int) -> bool:
    """Task of a batch write: whether it runs inside a stream's ``foreachBatch`` whose
    batch id is the write's ``version`` (``txnVersion=batch_id``, the documented recipe;
    Spark sets the batch id as a local property of the batch's jobs)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    return batch is not None and batch == str(version)

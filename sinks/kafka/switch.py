"""Driver, at a stream's start: a Kafka sink's sink id or bookkeeping switched mid-batch.

When a query restarts through another sink id (the ``sinkId`` option, or the ``topic``
that derives it, changed after a failure) while the old one decided or marked a batch
the checkpoint has not recorded as complete, Spark replays that batch through the new
id, which writes it again: all of it when the old driver committed it before Spark
recorded the batch, the task partitions that committed in ``commitMode=task``, and
everything once the old sink id's next start finishes a decision it had not. What the
old sink id did is read from the marker log (the same log and transactional id prefix:
a switch of those is not seen): its last decision (``commitMode=batch``) and its task
partitions' committed markers (``commitMode=task``). The same for the sink id under the
``transactionalIdPrefix`` or ``markerLogTopic`` the checkpoint recorded at the earlier
start. See :mod:`eos_connectors.core.sink_switch`. And a switch to ``commitMode=task`` while
the sink id's decision of that batch (``commitMode=batch``) is not committed in full: a
task-mode run has no driver to commit it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from confluent_kafka import KafkaException

from eos_connectors.core.checkpoint_behind import refuse_at_start
from eos_connectors.core.errors import EosError
from eos_connectors.core.sink_switch import (
    SinkSwitchedMidBatchError,
    StartingSink,
    earlier_names,
    refuse_a_switch_mid_batch,
    refuse_moved_bookkeeping,
    starting_sink,
)
from eos_connectors.core.topics import Record, read_to_end
from eos_connectors.sinks.kafka.decisions import (
    DECISION_SUFFIX,
    decided_by_query,
    decided_over,
    decision_group,
    read_decision,
    read_marker,
    read_pointer,
    uncommitted,
)
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.marker_log import decode, read_for, refuse_replanned_markers
from eos_connectors.sinks.kafka.options import KafkaSinkOptions

log = logging.getLogger(__name__)

#: Marker log keys that are no task partition's marker: a sink's claim, decision, job.
_NOT_MARKERS = ("-claim", DECISION_SUFFIX, "-job")


def check_at_start(options: KafkaSinkOptions, raw: Mapping[str, str]) -> None:
    """Driver, at a stream's start that will replay a batch, before the checkpoint records
    the start: another sink id of the query, or this one under its earlier
    ``transactionalIdPrefix`` or ``markerLogTopic``, that decided or marked that batch
    refuses it (:mod:`eos_connectors.core.sink_switch`)."""
    starting = starting_sink(raw, options.sink_id_for, "eos_kafka")
    if starting is None:
        return
    if options.commit_mode == "batch":
        _refuse_a_checkpoint_behind(options, starting)
    if starting.incomplete is None:
        return  # a clean restart: nothing to replay, and the marker log is not read
    if options.commit_mode == "task":  # the batch it replays is the last planned one
        planned = starting.planned
        refuse_replanned_markers(
            options, starting.sink_id, planned.last, planned.offsets, query=starting.query_id
        )
    _refuse_a_switch(options, starting)
    _refuse_moved_bookkeeping(options, starting)
    _refuse_over_an_uncommitted_decision(options, starting)


def _refuse_a_checkpoint_behind(options: KafkaSinkOptions, starting: StartingSink) -> None:
    """The sink id's last decision (its decision pointer: one committed offset read), when
    it is this query's, past the last batch the checkpoint planned, or that very batch,
    which the checkpoint replays, planned over other source positions than the decision
    recorded (:mod:`eos_connectors.core.checkpoint_behind`). The log is read for the
    latter only, at a start that replays the decided batch (which reads it anyway). A
    pointer whose offset expired, and a ``commitMode=task`` start (its markers are per
    task partition), leave it to the commits, which refuse the same."""
    pointed = read_marker(options, decision_group(options, starting.sink_id))
    if pointed is None or pointed[1] != starting.query_id:
        return
    decided, over = pointed[0] - 1, ""
    if starting.replays(decided) and starting.planned.offsets:
        over = decided_over(options, starting.sink_id, decided)
    refuse_at_start(
        "eos_kafka",
        starting.sink_id,
        starting.query_id,
        decided,
        starting.checkpoint,
        starting.planned.last,
        (over, starting.planned.offsets),
    )


def _refuse_a_switch(options: KafkaSinkOptions, starting: StartingSink) -> None:
    """Every other sink id of the query on the marker log, at the last batch it decided
    or marked."""
    last = _last_by_sink(options, starting.query_id)
    for other, batch in sorted(last.items()):
        refuse_a_switch_mid_batch(starting, other, batch, options.topic or "")


def _refuse_moved_bookkeeping(options: KafkaSinkOptions, starting: StartingSink) -> None:
    """The sink id's last batch under the names the checkpoint recorded at the earlier
    start, when ``transactionalIdPrefix`` or ``markerLogTopic`` changed since."""
    names = earlier_names(starting, "kafka")
    prefix = names.get("transactionalIdPrefix", options.transactional_id_prefix)
    marker_log = names.get("markerLogTopic", options.marker_log)
    old = replace(options, transactional_id_prefix=prefix, marker_log=marker_log)
    for option, was, now in (
        ("transactionalIdPrefix", prefix, options.transactional_id_prefix),
        ("markerLogTopic", marker_log, options.marker_log),
    ):
        if was != now:
            batch = _last_batch(old, starting.sink_id, starting.query_id)
            refuse_moved_bookkeeping(starting, option, was, now, batch)


def check_at_least_once_start(options: KafkaSinkOptions, raw: Mapping[str, str]) -> None:
    """Driver, at an at-least-once stream's start that will replay a batch: refused when
    the sink id decided that batch in ``commitMode=batch`` and did not commit it all
    (:func:`_refuse_over_an_uncommitted_decision`). Best effort: a user of at least once
    may not read the marker log, which it does not need (logged, and the start goes on)."""
    starting = starting_sink(raw, options.sink_id_for, "eos_kafka")
    if starting is None or starting.incomplete is None:
        return
    try:
        _refuse_over_an_uncommitted_decision(options, starting)
    except (KafkaException, KafkaSinkError) as exc:
        log.info("eos_kafka: the decisions of sink %s are not readable: %s", starting.sink_id, exc)


def _refuse_over_an_uncommitted_decision(options: KafkaSinkOptions, starting: StartingSink) -> None:
    """A start in a mode that commits no decision (``commitMode=task``, or at least once)
    where this sink id decided the batch the checkpoint replays in ``commitMode=batch``
    and its driver died before committing every one of the decision's transactions:
    those are a batch-commit driver's to commit. A task-mode run's tasks would wait on
    them, an at-least-once run's output would be held back from read_committed readers
    by them, until the coordinators abort them at ``kafka.transaction.timeout.ms`` (15
    minutes by default). A decision whose transactions all committed (every task
    partition's marker past the batch) lets the start go on."""
    if options.exactly_once and options.commit_mode == "batch":
        return
    sid = starting.sink_id
    pointed = read_pointer(options, sid)
    if pointed is None or pointed[1] != starting.query_id or not starting.replays(pointed[0] - 1):
        return
    decision = read_decision(options, sid, pointed[0] - 1)
    open_ = uncommitted(options, decision)
    if not open_:
        return
    if options.exactly_once:
        now, stalls = "commitMode is 'task'", "its tasks would wait on them"
        restart = "commitMode=batch"
    else:
        now = "deliveryGuarantee is 'at-least-once'"
        stalls = "they would hold read_committed readers of its output back"
        restart = "deliveryGuarantee=exactly-once and commitMode=batch"
    raise SinkSwitchedMidBatchError(
        f"eos_kafka: {now}, but sink {sid!r} decided batch {decision.batch} in "
        f"commitMode=batch and its driver stopped before committing the transactions of "
        f"task partitions {open_}, and the checkpoint has not recorded the batch as "
        "complete. Those transactions are a batch-commit driver's to commit, which this "
        f"start never does: {stalls} until the coordinators abort them "
        f"(kafka.transaction.timeout.ms). Restart the query with {restart} until that "
        "batch completes, then change it. Nothing was written."
    )


def _last_batch(options: KafkaSinkOptions, sid: str, query_id: str) -> int | None:
    """The last batch ``sid`` decided or marked for ``query_id`` under ``options``' names;
    None when there is none, or the old marker log cannot be read (logged)."""
    try:
        return _last_by_sink(options, query_id).get(sid)
    except (KafkaException, EosError) as exc:
        log.warning("could not read the sink's earlier marker log %s: %s", options.marker_log, exc)
        return None


def _last_by_sink(options: KafkaSinkOptions, query_id: str) -> dict[str, int]:
    """Sink id -> the last batch it decided or marked for ``query_id``, for every sink on
    the marker log, the log read once (uncommitted) for both."""
    records = read_to_end(options.client_config(), options.marker_log, "read_uncommitted")
    last = marked_by_query(options, query_id, records)
    for sid, batch in decided_by_query(options, query_id, records).items():
        last[sid] = max(last.get(sid, -1), batch)
    return last


def marked_by_query(
    options: KafkaSinkOptions, query_id: str, records: list[Record]
) -> dict[str, int]:
    """Sink id -> the last batch one of its task partitions marked, for every sink on the
    marker log whose marker names ``query_id``. The log's ``records``, read uncommitted,
    name the candidates: a marker committed behind another client's transaction still
    open on the log (past its last stable offset) is seen too. Each candidate's marker group, as
    the group applied it (committed transactions only: an attempt's aborted marker marks
    nothing), decides; when the group holds no offset (expired), its committed record in
    the log does (:func:`~.marker_log.read_for`)."""
    prefix = f"{options.transactional_id_prefix}-"
    candidates: set[str] = set()
    for record in records:
        key = (record.key or b"").decode(errors="replace")
        if key.startswith(prefix) and not key.endswith(_NOT_MARKERS) and record.value:
            marker = decode(record.value)
            if marker is not None and marker.query == query_id:
                candidates.add(key)
    marks = {key: read_marker(options, key) for key in sorted(candidates)}
    unkept = {key.encode() for key, marked in marks.items() if marked is None}
    if unkept:
        for record in read_for(options, unkept.__contains__, "the sinks' markers"):
            marker = decode(record.value) if record.value else None
            if record.key in unkept and marker is not None:
                marks[record.key.decode()] = (marker.next_batch, marker.query)
    found: dict[str, int] = {}
    for key, marked in marks.items():
        sid, _, partition = key[len(prefix) :].rpartition("-")
        if marked is None or marked[1] != query_id or not partition.isdigit():
            continue
        found[sid] = max(found.get(sid, -1), marked[0] - 1)
    return found

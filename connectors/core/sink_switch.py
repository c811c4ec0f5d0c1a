"""Driver, at a stream's start: a sink's identity or bookkeeping changed mid-batch.

A query may change its sink's identity (the ``sinkId`` option, or the table, key
prefix or topic that derives it) and its bookkeeping names between runs, but not
between a failed batch and its replay. Spark records a batch as complete only after
its sink's commit applied all of it, so when the checkpoint will replay a batch that
another sink id of the same query decided (or that the sink decided under other
bookkeeping names), the replay through the new one would write it again: all of it
when the old one applied it before Spark recorded the batch, and once more when the
old one's next start applies a decision it had not finished. The start is refused
instead, naming the batch and what to do. Each store finds what its old sink did
(:func:`eos_connectors.core.sinks_admin.warn_about_orphans` for PostgreSQL and Redis,
:mod:`eos_connectors.sinks.kafka.switch` for Kafka). A switch to at least once settles
what the sink id left in doubt first (:func:`settle_before_at_least_once`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from eos_connectors.core.checkpoint_sinks import (
    Planned,
    checkpoint_location,
    checkpoint_query_id,
    planned_batches,
    recorded_entry,
    sink_of_checkpoint,
)
from eos_connectors.core.errors import ConfigError

if TYPE_CHECKING:
    from eos_connectors.core.sinks_admin import SinkAdmin

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartingSink:
    """The sink a stream starts with: its id, its query's id, its checkpoint, and where
    that checkpoint stands (:func:`~eos_connectors.core.checkpoint_sinks.planned_batches`)."""

    sink_id: str
    query_id: str
    connector: str
    checkpoint: str
    planned: Planned

    @property
    def incomplete(self) -> int | None:
        """The batch the checkpoint will replay; None on a clean restart."""
        return self.planned.incomplete

    def replays(self, batch: int) -> bool:
        """Whether the checkpoint will replay ``batch``."""
        return batch == self.incomplete


def starting_sink(
    raw: Mapping[str, str], sink_id_for: Callable[[str], str], connector: str
) -> StartingSink | None:
    """Driver, at a stream's start: the sink it starts with, when its checkpoint (Spark's
    ``raw`` options name it) is one whose query id and offsets can be read; None
    otherwise (a batch write, a first start before Spark wrote the metadata, an ``s3a:``
    checkpoint), and the checks that need it are skipped. The checks of a switch
    mid-batch run only when :attr:`StartingSink.incomplete` names a batch to replay."""
    location = checkpoint_location(raw)
    query_id = checkpoint_query_id(location)
    if location is None or query_id is None:
        return None
    planned = planned_batches(location)
    if planned is None:
        return None
    return StartingSink(sink_id_for(query_id), query_id, connector, location, planned)


class SinkSwitchedMidBatchError(ConfigError):
    """A stream restarted through another sink id while its old one decided a batch the
    checkpoint has not completed: the replay would write that batch a second time."""


def refuse_a_switch_mid_batch(starting: StartingSink, old: str, batch: int, target: str) -> None:
    """Driver, at a stream's start: refuse when sink id ``old`` of the same query decided
    ``batch`` (its last) and the checkpoint will replay it: the sinkId, or the target that
    derives it, changed after the batch failed. The replay through ``starting`` would
    write the batch a second time: all of it when the old sink applied it before Spark
    recorded the batch (its driver died in between), and again when the old sink id's
    next start applies a decision it had not finished."""
    if old == starting.sink_id or not starting.replays(batch):
        return
    wrote = f", writing to {target!r}," if target else ""
    raise SinkSwitchedMidBatchError(
        f"{starting.connector}: sink {old!r} of this query ({starting.query_id}){wrote} "
        f"decided batch {batch}, which the checkpoint has not recorded as complete, but the "
        f"query now writes through sink {starting.sink_id!r}: the sinkId option, or the "
        "table, key prefix or topic that derives it, changed after that batch failed. Spark "
        "would replay the batch through the new sink id and write it a second time. Restart "
        "the query with the old options until that batch completes, then change them. "
        "Nothing was written."
    )


def earlier_names(starting: StartingSink, store: str) -> Mapping[str, str]:
    """Driver: the bookkeeping names (by option) ``starting``'s sink id used at the
    query's earlier start, as its checkpoint recorded them; empty when unrecorded."""
    entry = recorded_entry(starting.checkpoint, store, starting.sink_id)
    return entry.names if entry is not None else {}


def check_moved_bookkeeping(
    starting: StartingSink,
    store: str,
    option: str,
    new: str,
    admin_for: Callable[[str], SinkAdmin],
) -> None:
    """Driver, at a stream's start, before the checkpoint records this start: when the
    checkpoint will replay a batch and the bookkeeping ``option`` named another place at
    the earlier start, the sink id's last decision there (``admin_for(old)``) is checked
    by :func:`refuse_moved_bookkeeping`. A clean restart reads nothing."""
    if starting.incomplete is None:
        return
    old = earlier_names(starting, store).get(option)
    if old is None or old == new:
        return
    admin = admin_for(old)
    try:
        record = admin.find(starting.sink_id)
    finally:
        admin.close()
    batch = record.last_decided if record is not None else None
    refuse_moved_bookkeeping(starting, option, old, new, batch)


def refuse_moved_bookkeeping(
    starting: StartingSink, option: str, old: str, new: str, batch: int | None
) -> None:
    """Driver, at a stream's start: refuse when the bookkeeping ``option`` changed from
    ``old`` to ``new`` while the sink, under ``old``, decided ``batch`` and the checkpoint
    will replay it: under ``new`` the sink finds no decision and writes it again."""
    if batch is None or old == new or not starting.replays(batch):
        return
    raise SinkSwitchedMidBatchError(
        f"{starting.connector}: option {option!r} changed from {old!r} to {new!r} after "
        f"batch {batch} failed. Sink {starting.sink_id!r} decided that batch with its "
        f"bookkeeping under {old!r}, where this start does not look, and the checkpoint has "
        f"not recorded the batch as complete: Spark would replay it and the sink write it a "
        f"second time. Restart the query with {option}={old!r} until that batch completes, "
        "then change it. Nothing was written."
    )


def at_least_once_sink(
    raw: Mapping[str, str], explicit: str | None, sink_id_for: Callable[[str], str]
) -> str | None:
    """Driver: the sink id an at-least-once start writes under: the ``sinkId`` option, else
    the one derived for the query its checkpoint names; None when neither is known."""
    return explicit or sink_of_checkpoint(checkpoint_location(raw), sink_id_for)


def settle_before_at_least_once(admin: SinkAdmin, sink_id: str | None, connector: str) -> None:
    """Driver, at an at-least-once start: what the sink id left in doubt when it last ran
    exactly once settled first, as its own next commit would have (``SinkAdmin.settle``:
    units a decision names applied, the rest rolled back). Left alone, a decided batch
    the switch's replay writes again stayed staged: applied by a later exactly-once start
    over what the at-least-once run wrote since (a stale value in upsert mode), while its
    prepared transactions' row locks stopped the at-least-once tasks' upserts of the same
    keys until their lock timeout. Closes ``admin``."""
    try:
        record = None if sink_id is None else admin.find(sink_id)
        if sink_id is None or record is None or not record.in_doubt:
            return
        settled = admin.settle(sink_id)
    finally:
        admin.close()
    log.warning(
        "%s: sink %r starts with deliveryGuarantee=at-least-once; its exactly-once run had "
        "left %d decided units unapplied, applied now, and %d undecided ones, rolled back",
        connector,
        sink_id,
        len(settled.committed),
        len(settled.rolled_back),
    )

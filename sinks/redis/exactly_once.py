"""The exactly-once Redis sink: tasks stage their entries per unit, the driver records the
batch's decision and applies each stage with one Lua script that moves the sink's
watermark; a Redis unit store of :mod:`eos_connectors.core.protocol`."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import redis

from eos_connectors.core.changes import KeyAcrossTasksError
from eos_connectors.core.errors import ServiceUnavailableError
from eos_connectors.core.protocol import (
    Decision,
    Lineage,
    Outcome,
    Siblings,
    SinkResetError,
    TwoPhaseCommitWriter,
    UnitId,
    UnitMissingError,
)
from eos_connectors.core.secrets import redact
from eos_connectors.sinks.redis import layout, scripts
from eos_connectors.sinks.redis.connection import as_text, pooled
from eos_connectors.sinks.redis.options import RedisSinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


#: Entries per RPUSH (tasks) or per script call (at-least-once writes).
ENTRIES_PER_COMMAND = 5000


class SinkKeys:
    """A sink's bookkeeping keys, all with the hash tag ``{sink id}``."""

    def __init__(self, prefix: str, sink_id: str) -> None:
        self.base = f"{prefix}:{{{sink_id}}}"

    def stage(self, unit: UnitId) -> str:
        return f"{self.base}:stage:{unit}"

    @property
    def units(self) -> str:
        return f"{self.base}:units"

    @property
    def owner(self) -> str:
        """Hash: the query that owns the sink id (query, origin) and its target."""
        return f"{self.base}:owner"

    @property
    def decisions(self) -> str:
        return f"{self.base}:decisions"

    def watermark(self, query_id: str) -> str:
        return f"{self.base}:watermark:{query_id}"

    def claims(self, batch_id: int) -> str:
        """Hash: key -> ``<run>:<partition>`` that claimed it in the batch."""
        return f"{self.base}:claims:{batch_id}"

    @property
    def rejected(self) -> str:
        return f"{self.base}:rejected"

    @property
    def applied(self) -> str:
        """Hash: unit name -> batch, written by the script that applies the unit."""
        return f"{self.base}:applied"

    @property
    def layouts(self) -> str:
        """Hash: unit name -> the layout its stage was written in (the apply script's
        leading arguments, as JSON), written with the stage."""
        return f"{self.base}:layouts"

    @property
    def aborted(self) -> str:
        """Hash: ``<batch>:<run>`` -> "1" for each run of a batch the driver aborted."""
        return f"{self.base}:aborted"


def script_args(spec: layout.Layout, ttl: int | None) -> list[str]:
    """The leading ARGV both scripts take: mode, number kind, ttl, fields."""
    return [spec.script_mode, spec.number or "", str(ttl or 0), str(len(spec.fields)), *spec.fields]


class RedisExactlyOnceWriter(TwoPhaseCommitWriter):
    """Exactly-once: tasks stage their entries; the driver applies each staged unit atomically.

    Guarantee: a batch's writes land when the driver commits the batch (each
    task's entries atomically), and exactly once through any crash and replay:
    a unit's stage is deleted in the same script that applies it, so applying
    it again finds nothing to do. In increment mode each counter moves once.
    """

    #: A stage list locks nothing, so other attempts' units stay until the driver's
    #: recovery rolls back those the decision does not name.
    siblings = Siblings.LEAVE
    connector = "eos_redis"

    def __init__(
        self, options: RedisSinkOptions, spec: layout.Layout, checkpoint: str | None = None
    ) -> None:
        self.options = options
        self.checkpoint_location = checkpoint
        self.spec = spec
        self._client: redis.Redis | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "spec": self.spec, "_client": None}

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = pooled(self.options)
        return self._client

    def keys(self, sink_id: str) -> SinkKeys:
        return SinkKeys(self.options.bookkeeping_prefix, sink_id)

    # -- UnitStore hooks -----------------------------------------------------------

    def sink_id(self, query_id: str) -> str:
        return self.options.sink_id_for(query_id)

    def applied_watermark(self, sink_id: str, query_id: str) -> int:
        value = self.client.get(self.keys(sink_id).watermark(query_id))
        return int(value) if value is not None else -1

    def owner(self, sink_id: str) -> Lineage | None:
        query, origin = self.client.hmget(self.keys(sink_id).owner, ["query", "origin"])
        return None if query is None else Lineage(as_text(query), as_text(origin or b""))

    def claim(self, sink_id: str, lineage: Lineage) -> Lineage:
        script = self.client.register_script(scripts.CLAIM)
        target = self.options.key_prefix + "*"
        writes = layout.dump_writes(self.spec, self.options.ttl_seconds)
        query, origin = script(
            keys=[self.keys(sink_id).owner],
            args=[lineage.query_id, lineage.origin, target, writes],
        )
        return Lineage(as_text(query), as_text(origin or b""))

    def find_decision(self, sink_id: str, batch_id: int) -> Decision | None:
        raw = self.client.hget(self.keys(sink_id).decisions, str(batch_id))
        return None if raw is None else stored_decision(sink_id, batch_id, as_text(raw))

    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        """Task: register the unit, then push its entries to its stage list."""
        from eos_connectors.sinks.redis.values import entries  # pyarrow: tasks only

        flat, count = entries(self.spec, rows)
        if not flat:
            return 0
        keys = self.keys(unit.sink_id)
        stage = keys.stage(unit)
        chunk = ENTRIES_PER_COMMAND * self.spec.stride
        # One MULTI/EXEC: a stage is pushed whole or not at all, and a copy sent twice
        # (a late first one and a retry) replaces the stage instead of adding to it.
        layout_args = json.dumps(script_args(self.spec, self.options.ttl_seconds))
        with self.client.pipeline(transaction=True) as pipe:
            pipe.sadd(keys.units, str(unit))
            pipe.hset(keys.layouts, str(unit), layout_args)
            pipe.delete(stage)
            for start in range(0, len(flat), chunk):
                pipe.rpush(stage, *flat[start : start + chunk])
            pipe.execute()
        if self.spec.mode != "increment":  # increments commute: any layout is exact
            self._claim_keys(unit, keys)
        return count

    def _claim_keys(self, unit: UnitId, keys: SinkKeys) -> None:
        """Task: claim the stage's keys for this partition of the batch, or drop the unit
        and refuse the batch when another partition claimed one
        (:class:`KeyAcrossTasksError`)."""
        script = self.client.register_script(scripts.CLAIM_KEYS)
        lead = 1 if self.spec.deletes else 0
        found = script(
            keys=[keys.stage(unit), keys.claims(unit.batch_id), keys.units],
            args=[unit.run, str(unit.partition), str(self.spec.stride), str(lead), str(unit)],
        )
        if found:
            key, other = as_text(found[0]), int(as_text(found[1]))
            raise KeyAcrossTasksError(
                repr(key),
                unit.sink_id,
                unit.batch_id,
                (other, unit.partition),
                repr(self.spec.key_column),
            )

    def decide(self, decision: Decision) -> Decision:
        keys = self.keys(decision.sink_id)
        names = [str(u) for u in decision.units]
        text = _decision_text(decision)
        script = self.client.register_script(scripts.DECIDE)
        stages = [keys.stage(u) for u in decision.units]
        result = script(
            keys=[keys.decisions, keys.units, keys.owner, *stages],
            args=[str(decision.batch_id), text, decision.query_id, *names],
        )
        status, *rest = result
        if int(status) == -2:
            raise SinkResetError(decision.sink_id, decision.batch_id, decision.query_id)
        if int(status) < 0:
            missing = [u for u in decision.units if str(u) in {as_text(r) for r in rest}]
            raise UnitMissingError(decision.batch_id, missing)
        return stored_decision(decision.sink_id, decision.batch_id, as_text(rest[0]))

    def commit_unit(self, unit: UnitId) -> Outcome:
        """Driver: the unit's stage applied in the layout it was written in (the options
        may have changed since: ``mode`` from increment to upsert between a batch's
        decision and its replay applied the decided increments as values); the script
        drops its layout record."""
        keys = self.keys(unit.sink_id)
        try:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.hget(keys.decisions, str(unit.batch_id))  # decided units only
                pipe.hget(keys.layouts, str(unit))
                raw, written = pipe.execute()
            decision = (
                None if raw is None else stored_decision(unit.sink_id, unit.batch_id, as_text(raw))
            )
            watermark = keys.watermark(decision.query_id if decision else "")
            leading = self._layout_args(written)
            apply = self.client.register_script(scripts.APPLY_STAGE)
            stage = [keys.stage(unit), keys.units, watermark, keys.rejected, keys.applied]
            applied, failed, absent = apply(
                keys=[*stage, keys.layouts], args=[*leading, str(unit), str(unit.batch_id)]
            )
        except (redis.ConnectionError, redis.TimeoutError, ServiceUnavailableError) as exc:
            log.warning("applying %s: %s; retrying", unit, redact(str(exc)))
            self._client = None
            return Outcome.RETRY
        if failed:
            log.error(
                "Redis refused %d of the writes of %s (e.g. INCRBY on a key that holds text); "
                "they are listed in %s",
                failed,
                unit,
                keys.rejected,
            )
        log_absent(int(absent), str(unit))
        return {-1: Outcome.ALREADY_COMMITTED, -2: Outcome.MISSING}.get(
            int(applied), Outcome.COMMITTED
        )

    def _layout_args(self, written: bytes | None) -> list[str]:
        """Driver: the apply script's leading arguments as the unit's stage was written
        (the sink's own layout for a stage written before layouts were recorded)."""
        if written is None:
            return script_args(self.spec, self.options.ttl_seconds)
        return [str(arg) for arg in json.loads(written)]

    def rollback_unit(self, unit: UnitId) -> None:
        keys = self.keys(unit.sink_id)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(keys.stage(unit))
            pipe.srem(keys.units, str(unit))
            pipe.hdel(keys.layouts, str(unit))
            pipe.execute()

    def rollback_undecided(self, sink_id: str, batch_id: int, units: Sequence[UnitId]) -> bool:
        keys = self.keys(sink_id)
        script = self.client.register_script(scripts.ROLLBACK_UNDECIDED)
        done = script(
            keys=[keys.decisions, keys.units, *(keys.stage(u) for u in units)],
            args=[str(batch_id), *map(str, units)],
        )
        if int(done) and units:
            self.client.hdel(keys.layouts, *map(str, units))
        return bool(int(done))

    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        names = self.client.smembers(self.keys(sink_id).units)
        units = (UnitId.parse(as_text(n)) for n in names)
        return sorted(u for u in units if u is not None and u.sink_id == sink_id)

    def close(self) -> None:
        self._client = None  # the client stays in the worker's pool

    def forget_key_claims(self, sink_id: str, up_to_batch: int) -> None:
        self.client.delete(self.keys(sink_id).claims(up_to_batch))

    def record_abort(self, sink_id: str, batch_id: int, run: str) -> None:
        self.client.hset(self.keys(sink_id).aborted, f"{batch_id}:{run}", "1")

    def aborted(self, sink_id: str, batch_id: int, run: str) -> bool:
        return bool(self.client.hexists(self.keys(sink_id).aborted, f"{batch_id}:{run}"))

    def prune_decisions(self, sink_id: str, below_batch: int) -> None:
        keys = self.keys(sink_id)
        old = [b for b in self.client.hkeys(keys.decisions) if int(b) < below_batch]
        if old:
            self.client.hdel(keys.decisions, *old)
        aborted = self.client.hkeys(keys.aborted)
        old_aborts = [a for a in aborted if int(as_text(a).partition(":")[0]) < below_batch]
        if old_aborts:
            self.client.hdel(keys.aborted, *old_aborts)
        applied = self.client.hgetall(keys.applied)
        old_units = [u for u, b in applied.items() if int(b) < below_batch]
        if old_units:
            self.client.hdel(keys.applied, *old_units)


#: The line of a decision's text that holds its source positions' digest.
OFFSETS_LINE = "offsets "


def _decision_text(decision: Decision) -> str:
    """A decision as stored: the query id, one unit name per line, then (a stream's) the
    digest of its source positions."""
    offsets = [OFFSETS_LINE + decision.offsets] if decision.offsets else []
    return "\n".join([decision.query_id, *(str(u) for u in decision.units), *offsets])


def stored_decision(sink_id: str, batch_id: int, text: str) -> Decision:
    """A decision from its stored text (:func:`_decision_text`)."""
    query_id, *lines = text.split("\n")
    units = tuple(u for u in map(UnitId.parse, lines) if u is not None)
    offsets = [line.removeprefix(OFFSETS_LINE) for line in lines if line.startswith(OFFSETS_LINE)]
    return Decision(sink_id, batch_id, query_id, units, offsets[0] if offsets else "")


def log_absent(absent: int, where: str) -> None:
    """Deletes of keys that were not there changed nothing; say how many."""
    if absent:
        log.info("%d deletes of %s were of keys not in Redis: nothing to delete", absent, where)

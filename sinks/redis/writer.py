"""The Redis unit store: staged entries per unit, a decision hash, one Lua apply per unit."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import redis
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from connectors.errors import ServiceUnavailableError
from connectors.protocol import Decision, Outcome, TwoPhaseCommitWriter, UnitId
from connectors.secrets import redact_url
from sinks.redis import scripts, values
from sinks.redis.options import RedisSinkOptions

log = logging.getLogger(__name__)

#: Entries per RPUSH (tasks) or per script call (at-least-once writes).
ENTRIES_PER_COMMAND = 5000
SOCKET_TIMEOUT = 300.0


def connect(options: RedisSinkOptions) -> redis.Redis:
    """A client that has answered PING, or a ServiceUnavailableError without the password."""
    client = redis.Redis.from_url(
        options.url, socket_connect_timeout=10, socket_timeout=SOCKET_TIMEOUT
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise ServiceUnavailableError(
            f"Redis at {redact_url(options.url)} (option 'url') is unreachable: "
            f"{redact_url(str(exc))}"
        ) from None
    return client


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Keys:
    """A sink's bookkeeping keys, all with the hash tag ``{sink id}``."""

    def __init__(self, prefix: str, sink_id: str) -> None:
        self.base = f"{prefix}:{{{sink_id}}}"

    def stage(self, unit: UnitId) -> str:
        return f"{self.base}:stage:{unit}"

    @property
    def units(self) -> str:
        return f"{self.base}:units"

    @property
    def decisions(self) -> str:
        return f"{self.base}:decisions"

    def watermark(self, query_id: str) -> str:
        return f"{self.base}:watermark:{query_id}"

    @property
    def rejected(self) -> str:
        return f"{self.base}:rejected"


def _script_args(spec: values.Layout, ttl: int | None) -> list[str]:
    """The leading ARGV both scripts take: mode, number kind, ttl, fields."""
    return [spec.mode, spec.number or "", str(ttl or 0), str(len(spec.fields)), *spec.fields]


class RedisStagedWriter(TwoPhaseCommitWriter):
    """Exactly-once: tasks stage their entries; the driver applies each staged unit atomically.

    Guarantee: a batch's writes land when the driver commits the batch (each
    task's entries atomically), and exactly once through any crash and replay:
    a unit's stage is deleted in the same script that applies it, so applying
    it again finds nothing to do. In increment mode each counter moves once.
    """

    def __init__(self, options: RedisSinkOptions, spec: values.Layout) -> None:
        self.options = options
        self.spec = spec
        self._client: redis.Redis | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "spec": self.spec, "_client": None}

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = connect(self.options)
        return self._client

    def keys(self, sink_id: str) -> _Keys:
        return _Keys(self.options.bookkeeping_prefix, sink_id)

    # -- UnitStore hooks -----------------------------------------------------------

    def sink_id(self, query_id: str) -> str:
        if self.options.sink_id:
            return self.options.sink_id
        target = f"{self.options.key_prefix}|{self.options.key_column}"
        digest = hashlib.sha256(f"{query_id}|{target}".encode()).hexdigest()
        return f"rd-{digest[:16]}"

    def applied_watermark(self, sink_id: str, query_id: str) -> int:
        value = self.client.get(self.keys(sink_id).watermark(query_id))
        return int(value) if value is not None else -1

    def discard_attempts(self, sink_id: str, batch_id: int, partition: int) -> None:
        prefix = UnitId.prefix(sink_id, batch_id, partition)
        for unit in self._units(sink_id):
            if str(unit).startswith(prefix):
                log.info("deleting the stage of %s left by an earlier attempt", unit)
                self.rollback_unit(unit)

    def find_decision(self, sink_id: str, batch_id: int) -> Decision | None:
        raw = self.client.hget(self.keys(sink_id).decisions, str(batch_id))
        if raw is None:
            return None
        query_id, *names = _text(raw).split("\n")
        units = tuple(u for u in map(UnitId.parse, names) if u is not None)
        return Decision(sink_id, batch_id, query_id, units)

    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        flat, count = values.entries(self.spec, rows)
        if not flat:
            return 0
        keys = self.keys(unit.sink_id)
        stage = keys.stage(unit)
        chunk = ENTRIES_PER_COMMAND * self.spec.stride
        with self.client.pipeline(transaction=False) as pipe:
            pipe.sadd(keys.units, str(unit))  # registered first: a torn stage is found
            pipe.delete(stage)
            for start in range(0, len(flat), chunk):
                pipe.rpush(stage, *flat[start : start + chunk])
            pipe.execute()
        return count

    def record_decision(self, decision: Decision) -> Decision:
        text = "\n".join([decision.query_id, *map(str, decision.units)])
        decisions = self.keys(decision.sink_id).decisions
        self.client.hsetnx(decisions, str(decision.batch_id), text)
        recorded = self.find_decision(decision.sink_id, decision.batch_id)
        assert recorded is not None
        return recorded

    def commit_unit(self, unit: UnitId) -> Outcome:
        keys = self.keys(unit.sink_id)
        args = [*_script_args(self.spec, self.options.ttl_seconds), str(unit), str(unit.batch_id)]
        try:
            decision = self.find_decision(unit.sink_id, unit.batch_id)  # decided units only
            watermark = keys.watermark(decision.query_id if decision else "")
            apply = self.client.register_script(scripts.APPLY_STAGE)
            applied, failed = apply(
                keys=[keys.stage(unit), keys.units, watermark, keys.rejected], args=args
            )
        except (redis.ConnectionError, redis.TimeoutError, ServiceUnavailableError) as exc:
            log.warning("applying %s: %s; retrying", unit, redact_url(str(exc)))
            self._client = None
            return Outcome.RETRY
        if failed:
            log.error(
                "Redis refused %d of the writes of %s (e.g. INCRBY on a key that holds text); "
                "they are listed in %s", failed, unit, keys.rejected,
            )  # fmt: skip
        return Outcome.ALREADY_COMMITTED if applied < 0 else Outcome.COMMITTED

    def rollback_unit(self, unit: UnitId) -> None:
        keys = self.keys(unit.sink_id)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(keys.stage(unit))
            pipe.srem(keys.units, str(unit))
            pipe.execute()

    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        return self._units(sink_id)

    def prune_decisions(self, sink_id: str, below_batch: int) -> None:
        decisions = self.keys(sink_id).decisions
        old = [b for b in self.client.hkeys(decisions) if int(b) < below_batch]
        if old:
            self.client.hdel(decisions, *old)

    def _units(self, sink_id: str) -> list[UnitId]:
        names = self.client.smembers(self.keys(sink_id).units)
        units = (UnitId.parse(_text(n)) for n in names)
        return sorted(u for u in units if u is not None and u.sink_id == sink_id)


class RedisDirectWriter(DataSourceStreamArrowWriter):
    """At-least-once: each task writes its entries straight to their keys.

    A replayed batch writes again: harmless in upsert mode, counted twice in
    increment mode. For benchmarks and for data that tolerates it.
    """

    def __init__(self, options: RedisSinkOptions, spec: values.Layout) -> None:
        self.options = options
        self.spec = spec

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        flat, _ = values.entries(self.spec, iterator)
        client = connect(self.options)
        try:
            apply = client.register_script(scripts.APPLY_ENTRIES)
            head = _script_args(self.spec, self.options.ttl_seconds)
            chunk = ENTRIES_PER_COMMAND * self.spec.stride
            with client.pipeline(transaction=False) as pipe:
                for start in range(0, len(flat), chunk):
                    apply(args=[*head, *flat[start : start + chunk]], client=pipe)
                results = pipe.execute()
        finally:
            client.close()
        failed = sum(int(r[1]) for r in results)
        if failed:
            log.error("Redis refused %d writes of this task (wrong type at the key)", failed)
        return WriterCommitMessage()

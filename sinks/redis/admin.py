"""``eos sinks`` over Redis: sink ids from the bookkeeping keys under ``<bookkeepingPrefix>``
(driver-side tooling)."""

from __future__ import annotations

import redis

from eos_connectors.core.protocol import Lineage, TwoPhaseCommitWriter, UnitId
from eos_connectors.core.sinks_admin import (
    ResetGuard,
    SinkAdmin,
    SinkAdminError,
    SinkRecord,
    UnitInDoubt,
    refuse,
)
from eos_connectors.sinks.redis import scripts
from eos_connectors.sinks.redis.connection import as_text, connect
from eos_connectors.sinks.redis.exactly_once import (
    RedisExactlyOnceWriter,
    SinkKeys,
    stored_decision,
)
from eos_connectors.sinks.redis.layout import Layout, load_writes
from eos_connectors.sinks.redis.options import RedisSinkOptions


class RedisSinkAdmin(SinkAdmin):
    store = "redis"

    def __init__(self, url: str, bookkeeping_prefix: str = "eos") -> None:
        self.options = RedisSinkOptions(
            url, "-", ("-",), "", "upsert", None, None, bookkeeping_prefix, True
        )
        self._client: redis.Redis | None = None

    @property
    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = connect(self.options)
        return self._client

    def _sink_ids(self) -> set[str]:
        start = self.options.bookkeeping_keys
        found = set()
        for suffix in ("owner", "decisions", "units"):
            for key in self.client.scan_iter(match=f"{start}*}}:{suffix}", count=1000):
                found.add(as_text(key)[len(start) : -len(suffix) - 2])
        return found

    def records(self) -> list[SinkRecord]:
        return [self._record(sink_id) for sink_id in sorted(self._sink_ids())]

    def find(self, sink_id: str) -> SinkRecord | None:
        keys = SinkKeys(self.options.bookkeeping_prefix, sink_id)
        if not self.client.exists(keys.owner, keys.decisions, keys.units):
            return None
        return self._record(sink_id)

    def _record(self, sink_id: str) -> SinkRecord:
        keys = SinkKeys(self.options.bookkeeping_prefix, sink_id)
        query, origin, target, active = self.client.hmget(
            keys.owner, ["query", "origin", "target", "active_at"]
        )
        owner = None if query is None else Lineage(as_text(query), as_text(origin or b""))
        idle = None if active is None else self._now() - float(active)
        decided = {int(b): as_text(text) for b, text in self.client.hgetall(keys.decisions).items()}
        doubt = []
        for name in self.client.smembers(keys.units):
            unit = UnitId.parse(as_text(name))
            if unit is not None:
                age = self.client.object("idletime", keys.stage(unit))
                doubt.append(UnitInDoubt(unit, None if age is None else float(age)))
        in_doubt = tuple(sorted(doubt, key=lambda u: u.unit))
        last = max(decided, default=None)
        offsets = "" if last is None else stored_decision(sink_id, last, decided[last]).offsets
        target_text = as_text(target or b"")
        return SinkRecord(self.store, sink_id, owner, target_text, last, in_doubt, idle, offsets)

    def _now(self) -> float:
        seconds, _micro = self.client.time()
        return float(seconds)

    def writer(self, record: SinkRecord) -> TwoPhaseCommitWriter:
        keys = SinkKeys(self.options.bookkeeping_prefix, record.sink_id)
        writes = self.client.hget(keys.owner, "writes")
        if writes is None and record.last_decided is not None:
            raise SinkAdminError(
                f"Sink {record.sink_id!r} has decisions but no record of how it writes (an "
                "older version of the sink made it): restart its query once to settle it."
            )
        spec, ttl = load_writes(as_text(writes)) if writes else (_NO_WRITES, None)
        prefix = self.options.bookkeeping_prefix
        options = RedisSinkOptions(
            self.options.url, "-", ("-",), "", spec.mode, ttl, record.sink_id, prefix, True
        )
        return RedisExactlyOnceWriter(options, spec)

    def forget(self, sink_id: str, guard: ResetGuard) -> None:
        """One script checks ``guard`` and deletes, atomically with the sink's decisions."""
        keys = SinkKeys(self.options.bookkeeping_prefix, sink_id)
        names = [keys.owner, keys.decisions, keys.units, keys.applied, keys.aborted, keys.layouts]
        names += [as_text(k) for k in self.client.scan_iter(match=keys.watermark("*"))]
        last = "" if guard.last_committed is None else str(guard.last_committed)
        args = [guard.query_id or "", last, str(guard.quiet_seconds)]
        result = self.client.register_script(scripts.RESET)(keys=names, args=args)
        if int(result[0]) == 0:
            return
        query, decided, doubt, idle = (
            as_text(v) if isinstance(v, bytes) else v for v in result[1:]
        )
        now = SinkRecord(
            self.store,
            sink_id,
            Lineage(str(query)) if query else None,
            "",
            int(decided) if decided != "" else None,
            tuple(UnitInDoubt(UnitId(sink_id, -1, 0, "?"), None) for _ in range(int(doubt))),
            float(idle) if idle != "" else None,
        )
        refuse(self.store, sink_id, guard.problems(now))
        raise SinkAdminError(f"Redis refused to reset sink {sink_id!r}: {result!r}")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


#: A sink that never decided a batch only rolls back: how it writes does not matter.
_NO_WRITES = Layout("-", "", ("-",), (), "upsert", None)

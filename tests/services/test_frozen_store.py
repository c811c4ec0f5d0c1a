"""Issue 52, item 6: a store that stops answering without closing (SIGSTOP of the stack's
PostgreSQL, with its backends, or of its Redis: the kernel still acknowledges, nothing
answers, nothing is closed) fails a task's write and the driver's commit within their
bounds instead of blocking them, and nothing is lost: the batch replayed once the
store answers again is exact.

On 0.2 both sinks waited the whole freeze out (a query's write, 120 s by hand):
PostgreSQL connections had only ``connect_timeout``, Redis waited 300 s a call and
redis-py retried a timed-out call. The sinks' timeouts are shrunk here
(``statementTimeoutMs`` / ``socketTimeoutMs`` = 2 s, the driver's patience 2 s) so the
test costs seconds; docs/deploy.md gives the bounds with the defaults. A Redis out of
memory refuses a decided unit's apply whole, never in part.
Cost: ~9 s per store, and ~1 s.
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pyarrow as pa
import pytest
import redis

from eos_connectors.core import faults, protocol
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.protocol import PreparedUnit, TwoPhaseCommitWriter
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.testing import CONTRACT_SCHEMA
from tests.upsert_util import STORES, upsert_source, upserted

pytestmark = pytest.mark.services

_ARROW = pa.schema([pa.field("word", pa.string()), pa.field("n", pa.int64())])
#: What a frozen store may cost a call here: the 2 s timeout, a reconnection's 2 s and
#: the driver's 2 s of patience, with room for a loaded machine.
BOUND_SECONDS = 15.0


@pytest.fixture
def frozen(endpoints: Endpoints) -> Callable[[str], AbstractContextManager[None]]:
    from eos_connectors.dev.stack import Stack

    stack = Stack()
    if not stack.is_up() or stack.endpoints() != endpoints:
        pytest.fail("This test freezes a service of the package's own stack (`eos stack up`).")
    return stack.frozen


class Sink:
    def __init__(self, store: str, endpoints: Endpoints, name: str) -> None:
        self.store, self.endpoints, self.name = store, endpoints, name
        self.run = uuid.uuid4().hex
        self.attempts = iter(range(1, 1000))

    def writer(self) -> TwoPhaseCommitWriter:
        timeout = "statementTimeoutMs" if self.store == "postgres" else "socketTimeoutMs"
        source = upsert_source(self.store, self.endpoints, self.name, **{timeout: "2000"})
        writer = source.streamWriter(CONTRACT_SCHEMA, False)
        assert isinstance(writer, TwoPhaseCommitWriter)
        return writer

    def task(self, writer: TwoPhaseCommitWriter, partition: int) -> PreparedUnit:
        """A task of batch 0 writing ``w<partition>`` = ``partition + 1``."""
        identity = TaskIdentity(
            "frozen-query", self.name, self.run, 0, partition, next(self.attempts)
        )
        rows = pa.RecordBatch.from_pydict(
            {"word": [f"w{partition}"], "n": [partition + 1]}, schema=_ARROW
        )
        shipped: TwoPhaseCommitWriter = pickle.loads(pickle.dumps(writer))
        return shipped.prepare_task(identity, iter([rows]))

    def visible(self) -> dict[str, int]:
        return upserted(self.store, self.endpoints, self.name)


def _fails_within(seconds: float, call: Callable[[], object]) -> str:
    began = time.monotonic()
    with pytest.raises(BaseException) as failed:
        call()
    took = time.monotonic() - began
    assert took < seconds, f"a call to the frozen store waited {took:.0f} s"
    assert not isinstance(failed.value, KeyboardInterrupt)
    return str(failed.value)


@pytest.fixture
def short_patience(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(protocol, "COMMIT_RETRY_SECONDS", 2.0)
    yield


@pytest.mark.cost(9)
@pytest.mark.parametrize("store", STORES)
@pytest.mark.usefixtures("short_patience")
def test_a_frozen_store_fails_tasks_and_the_driver_in_bounds_and_loses_nothing(
    endpoints: Endpoints,
    unique: str,
    store: str,
    frozen: Callable[[str], AbstractContextManager[None]],
) -> None:
    sink = Sink(store, endpoints, f"frozen_{unique}_{store}")
    writer = sink.writer()
    first = sink.task(writer, 0)
    with frozen(store):
        _fails_within(BOUND_SECONDS, lambda: sink.task(writer, 1))  # a task's connection
        _fails_within(BOUND_SECONDS, lambda: writer.commit([first], 0))  # the driver's
    assert sink.visible() == {}, "nothing of the batch may be visible"
    writer.close()

    replay = sink.writer()  # Spark replays the batch once the store answers again
    units = [sink.task(replay, 0), sink.task(replay, 1)]
    replay.commit(units, 0)
    assert sink.visible() == {"w0": 1, "w1": 2}
    assert replay.units_in_doubt(sink.name) == []


@contextmanager
def _out_of_memory(url: str) -> Iterator[redis.Redis]:
    """Redis past its ``maxmemory`` with ``noeviction``: every write that may grow it is
    refused ("OOM command not allowed"), as in a store that filled up."""
    client = redis.Redis.from_url(url)
    policy = str(client.config_get("maxmemory-policy")["maxmemory-policy"])
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(max(1, used // 2)))
    try:
        yield client
    finally:
        client.config_set("maxmemory", "0")
        client.config_set("maxmemory-policy", policy)
        client.close()


@pytest.mark.cost(1)
def test_a_redis_out_of_memory_applies_a_decided_unit_whole_or_not_at_all(
    endpoints: Endpoints, unique: str
) -> None:
    """Redis never rolls back a script's writes, and the apply script writes each entry
    through ``pcall`` so that one entry Redis refuses for itself (INCRBY on text) does
    not stop it. Out of memory, Redis refuses a script's writes until its first write
    succeeds: the first entry's OOM refusal stops the script before it wrote anything.
    The decided unit stays staged and its replay applies it whole. (Counted as rejected,
    every entry would have been listed so, the stage deleted and the unit counted as
    applied: lost.)"""
    sink = Sink("redis", endpoints, f"oom_{unique}")
    writer = sink.writer()
    units = [sink.task(writer, 0), sink.task(writer, 1)]
    with faults.simulate("after-decision"), pytest.raises(faults.SimulatedCrash):
        writer.commit(units, 0)  # decided; nothing applied
    with _out_of_memory(endpoints.redis_url):
        for message in units:
            assert message.unit is not None
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                writer.commit_unit(message.unit)
        assert sink.visible() == {}
        assert len(writer.units_in_doubt(sink.name)) == 2, "both stay staged"
    writer.commit(units, 0)  # the replay finds the decision and applies it
    assert sink.visible() == {"w0": 1, "w1": 2}
    assert writer.units_in_doubt(sink.name) == []
    writer.close()


@pytest.mark.cost(1)
def test_a_redis_out_of_memory_fails_an_at_least_once_task_instead_of_dropping_it(
    endpoints: Endpoints, unique: str
) -> None:
    """At-least-once writes each entry through ``pcall`` too, with no rejected list to
    record into: out of memory, every entry was refused and counted as "wrong type at
    the key", and the task succeeded with nothing written, so its rows were lost. Only a
    refusal of the entry itself (WRONGTYPE, ERR: a value that is no number) is passed
    over; any other (OOM, READONLY) fails the script, and the task, whole."""
    name = f"oom_alo_{unique}"
    source = upsert_source("redis", endpoints, name, deliveryGuarantee="at-least-once")
    writer = source.streamWriter(CONTRACT_SCHEMA, False)
    rows = pa.RecordBatch.from_pydict({"word": ["a", "b"], "n": [1, 2]}, schema=_ARROW)
    with _out_of_memory(endpoints.redis_url), pytest.raises(redis.exceptions.OutOfMemoryError):
        writer.write(iter([rows]))
    writer.write(iter([rows]))  # Spark's retry, once memory is freed
    assert upserted("redis", endpoints, name) == {"a": 1, "b": 2}

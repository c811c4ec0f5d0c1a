"""``eos sinks`` against the real stores: a sink id whose query died with units in doubt
is listed, warned about at the next query start on its target, settled, reset, and
then claimed by a new query (no Spark: the protocol's steps are driven directly)."""

from __future__ import annotations

import itertools
import uuid

import pytest

from eos_connectors.cli import main
from eos_connectors.core import faults
from eos_connectors.core.protocol import SinkClaimedError, TwoPhaseCommitWriter
from eos_connectors.core.sinks_admin import ResetGuard, SinkAdminError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.ops.stores import admins
from eos_connectors.sinks.kafka.checks import check_broker
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.options import parse_options as kafka_options
from eos_connectors.sinks.kafka.options import transactional_id
from eos_connectors.sinks.postgres import format as pg_format
from eos_connectors.sinks.redis import format as redis_format
from eos_connectors.testing import SinkContract
from tests.kafka_sink_util import a_task as _task
from tests.kafka_sink_util import rows_of as _rows
from tests.services import test_contract as contract

pytestmark = pytest.mark.services


def _suite(kind: type[SinkContract], endpoints: Endpoints, unique: str) -> SinkContract:
    suite = kind()
    if isinstance(suite, contract.TestPostgresAppend):
        suite.dsn, suite.table = endpoints.postgres_dsn, f"admin_{unique}"
    elif isinstance(suite, contract.TestRedisIncrement):
        suite.url, suite.prefix = endpoints.redis_url, f"admin:{unique}:"
    suite._task_ids, suite._run = itertools.count(1), uuid.uuid4().hex
    return suite


def _eos(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["sinks", *args]) == 0
    return capsys.readouterr().out


def _orphans(suite: SinkContract, writer: TwoPhaseCommitWriter) -> list[str]:
    """What the next query start on the same target warns about (any age)."""
    options = writer.options  # type: ignore[attr-defined]
    module = pg_format if isinstance(suite, contract.TestPostgresAppend) else redis_format
    with pytest.warns(UserWarning, match="eos sinks settle"):
        found = module.warn_about_orphans(options, older_than=0)
    return [r.sink_id for r in found]


@pytest.mark.parametrize("kind", [contract.TestPostgresAppend, contract.TestRedisIncrement])
def test_an_abandoned_sink_id_is_listed_settled_reset_and_claimed_again(
    kind: type[SinkContract],
    endpoints: Endpoints,
    unique: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in endpoints.as_env().items():
        monkeypatch.setenv(name, value)
    suite, sink_id = _suite(kind, endpoints, unique), f"admin-{unique}"
    writer = suite.new_writer(sink_id)
    suite.run_batch(writer, 0)
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@1"):
        suite.run_batch(writer, 1)  # decided, not committed: its query died here
    suite.prepare(writer, 2, 0)  # prepared, never decided
    writer.close()

    listed = next(line for line in _eos(capsys, "list").splitlines() if sink_id in line)
    query, last, in_doubt = listed.split()[2:5]
    assert (query, last, in_doubt) == (suite.query_id, "1", str(suite.partitions + 1)), listed
    assert sink_id in _orphans(suite, writer)
    shown = _eos(capsys, "show", sink_id)
    assert shown.count(f"eos|{sink_id}|") == suite.partitions + 1
    with pytest.raises(SinkAdminError, match=r"settle .* first"):
        _reset(suite, sink_id, ResetGuard(None, None, 0))

    settled = _eos(capsys, "settle", sink_id)
    assert f"committed {suite.partitions} unit(s), rolled back 1" in settled
    assert dict(suite.visible()) == dict(suite.expected(range(2))), "lost or duplicated rows"
    with pytest.raises(SinkClaimedError):
        suite.prepare(suite.new_writer(sink_id), 0, 0, query_id="new-query")
    assert "bookkeeping forgotten" in _eos(
        capsys, "reset", sink_id, "--checkpoint-deleted", "--quiet-seconds", "0", "--yes"
    )
    assert sink_id not in _eos(capsys, "list")
    fresh = suite.new_writer(sink_id)
    suite.run_batch(fresh, 0, query_id="new-query")  # the new query claims the sink id
    owner = fresh.owner(sink_id)
    assert owner is not None and owner.query_id == "new-query"


def _reset(suite: SinkContract, sink_id: str, guard: ResetGuard) -> None:
    store = "postgres" if isinstance(suite, contract.TestPostgresAppend) else "redis"
    with admins() as stores:
        next(a for a in stores if a.store == store).reset(sink_id, guard)


@pytest.mark.cost(4)
def test_a_kafka_sink_id_is_listed_with_its_query_and_reset(
    endpoints: Endpoints,
    unique: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Listed from its marker groups, and from the marker log once the groups are gone
    (what offset retention does); reset forgets both, so a new query may claim it."""
    from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

    from eos_connectors.core.topics import create_topic

    for name, value in endpoints.as_env().items():
        monkeypatch.setenv(name, value)
    topic, sink_id = f"admin-{unique}", f"admin-{unique}"
    create_topic(endpoints.kafka, topic, 1)
    options = kafka_options(
        {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": topic, "sinkId": sink_id}
    )
    check_broker(options)
    writer = KafkaExactlyOnceWriter(options)
    for partition in range(2):
        writer.write_task(_task(4, partition=partition), iter(_rows(4)))
    listed = next(line for line in _eos(capsys, "list").splitlines() if sink_id in line)
    assert listed.split()[:4] == ["kafka", sink_id, "kafka-query", "4"], listed
    groups = [transactional_id(options, sink_id, partition) for partition in range(2)]
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
        future.result()
    listed = next(line for line in _eos(capsys, "list").splitlines() if sink_id in line)
    assert listed.split()[:4] == ["kafka", sink_id, "kafka-query", "4"], listed
    with pytest.raises(SinkClaimedError):
        writer.write_task(_task(0, query="new-query"), iter(_rows(0)))
    assert "bookkeeping forgotten" in _eos(
        capsys, "reset", sink_id, "--checkpoint-deleted", "--quiet-seconds", "0", "--yes"
    )
    assert sink_id not in _eos(capsys, "list")
    # The new query claims it and writes, also through this worker's pooled producers,
    # whose last marker was the old query's (they once skipped the batch as marked).
    report = writer.write_task(_task(0, query="new-query"), iter(_rows(0)))
    assert (report.skipped, report.records) == (False, 50), report
    report = writer.write_task(_task(0, query="new-query", partition=1), iter(_rows(0)))
    assert (report.skipped, report.records) == (False, 50), report


def test_a_decision_racing_a_reset_waits_for_it_and_then_fails(
    endpoints: Endpoints, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: reset checks and deletes under the sink's lock, exclusively, and a
    decision takes it shared. A live query's batch that prepares, claims and decides
    while a reset has checked but not yet deleted waits for the reset, then finds the
    owner gone and fails: it never records a decision the reset then deletes (whose
    replay would write the batch twice)."""
    import threading
    import time

    from eos_connectors.core.protocol import SinkResetError
    from eos_connectors.core.sinks_admin import refuse

    for name, value in endpoints.as_env().items():
        monkeypatch.setenv(name, value)
    suite = _suite(contract.TestPostgresAppend, endpoints, unique)
    sink_id = f"admin-{unique}"
    writer = suite.new_writer(sink_id)
    suite.run_batch(writer, 0)
    outcome: list[BaseException | None] = []

    def live_batch() -> None:
        try:
            suite.run_batch(suite.new_writer(sink_id), 1)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    racer = threading.Thread(target=live_batch)

    def check_then_race(store: str, sink: str, problems: list[str]) -> None:
        refuse(store, sink, problems)
        if not racer.is_alive() and not outcome:
            racer.start()  # the live query's batch, between the reset's check and delete
            time.sleep(3)

    monkeypatch.setattr("eos_connectors.sinks.postgres.admin.refuse", check_then_race)
    _reset(suite, sink_id, ResetGuard(None, None, 0))
    racer.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], SinkResetError), outcome
    assert dict(suite.visible()) == dict(suite.expected(range(1))), "batch 1 became visible"
    # The failed batch's units wait for their query's restart; gone for good, they are
    # orphans to settle (rolled back: nothing decided them).
    with admins() as stores:
        postgres = next(a for a in stores if a.store == "postgres")
        settled = postgres.settle(sink_id)
    assert (len(settled.committed), len(settled.rolled_back)) == (0, suite.partitions)


@pytest.mark.cost(1)
def test_a_redis_sink_is_as_idle_as_its_last_batch_not_its_newest_stage(
    endpoints: Endpoints, unique: str
) -> None:
    """A unit in doubt's stage, touched a moment ago, does not make a sink whose query
    went quiet an hour ago look alive to ``eos sinks reset`` (the record took the idle
    time of its last stage, before). Cost: <0.1 s."""
    from eos_connectors.sinks.redis.admin import RedisSinkAdmin
    from eos_connectors.sinks.redis.exactly_once import SinkKeys

    suite, sink_id = _suite(contract.TestRedisIncrement, endpoints, unique), f"idle-{unique}"
    writer = suite.new_writer(sink_id)
    suite.run_batch(writer, 0)
    suite.prepare(writer, 1, 0)  # a unit in doubt, its stage new
    writer.close()
    admin = RedisSinkAdmin(endpoints.redis_url)
    try:
        keys = SinkKeys(admin.options.bookkeeping_prefix, sink_id)
        admin.client.hset(keys.owner, "active_at", admin._now() - 3600)  # quiet an hour
        record = admin.record(sink_id)
        admin.settle(sink_id)
    finally:
        admin.close()
    assert record.in_doubt and record.idle_seconds is not None
    assert record.idle_seconds >= 3599, record.idle_seconds
    assert not any("looks alive" in p for p in ResetGuard(None, None).problems(record))

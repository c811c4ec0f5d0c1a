"""The exactly-once contract of a two-phase sink, as a pytest base class (no Spark needed).

Subclass :class:`SinkContract` in a test module and give it two methods:
``new_writer(sink_id=None)`` (a fresh writer for this test's target, built the way
Spark's driver builds it, e.g. ``MyDataSource(options).streamWriter(CONTRACT_SCHEMA,
False)``, with your sink's ``sinkId`` option set when ``sink_id`` is given) and
``visible()`` (per word, the sum of ``n`` your store shows readers now). pytest then
runs every ``test_*`` method below against your store::

    class TestMySink(SinkContract):
        def new_writer(self, sink_id: str | None = None) -> TwoPhaseCommitWriter: ...
        def visible(self) -> Mapping[str, int]: ...

Each test drives the protocol's steps itself: tasks are the writer shipped by
pickle, as Spark ships it, calling :meth:`TwoPhaseCommitWriter.prepare_task` with
a task identity; the driver calls ``commit`` and ``abort``. A crash is a fault
point armed with :func:`eos_connectors.core.faults.simulate`: it unwinds from the point
like a crash, the writer is abandoned (``close()``), and a fresh writer replays
the batch as a restarted query would, with new task attempts. The interleavings
a cluster adds (two live attempts of one task, a zombie that wakes after its
batch was decided, an abort racing a late decision) are replayed step by step, and so
are the ways a sink id gets reused (a new checkpoint, two queries at once).
After each test every row must be visible exactly once and nothing left in doubt.

Rows are ``(word string, n long)``: configure your sink so a row adds ``n`` to
``word``'s total (an append table summed by word, an increment counter), where a
duplicate or a loss shows.
"""

from __future__ import annotations

import itertools
import pickle
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from eos_connectors.core import faults
from eos_connectors.core.checkpoint_behind import CheckpointBehindSinkError
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.continuous import ContinuousProcessingError
from eos_connectors.core.protocol import (
    BatchAbortedError,
    Outcome,
    PreparedUnit,
    ProtocolError,
    Siblings,
    SinkClaimedError,
    TwoPhaseCommitWriter,
    UnitId,
    UnitMissingError,
    UnitStore,
)

CONTRACT_SCHEMA = StructType([StructField("word", StringType()), StructField("n", LongType())])
_ARROW_SCHEMA = pa.schema([pa.field("word", pa.string()), pa.field("n", pa.int64())])

#: Where a crash can happen during one batch, in protocol order: every fault point of a
#: sink (``mid-prepare`` is a crash while a task's rows are half written).
CRASH_POINTS = tuple(p for p in faults.POINTS if p != "source-read")


def rows_of(pairs: list[tuple[str, int]]) -> pa.RecordBatch:
    """``(word, n)`` pairs as one Arrow record batch of the contract's schema."""
    words, counts = zip(*pairs, strict=True) if pairs else ((), ())
    return pa.RecordBatch.from_arrays(
        [pa.array(words, pa.string()), pa.array(counts, pa.int64())], schema=_ARROW_SCHEMA
    )


def batch_rows(batch: int, partition: int) -> list[pa.RecordBatch]:
    """Two Arrow batches for one task: 40 rows over 8 words, different in every batch."""
    pairs = [
        (f"w{(batch + partition + i) % 8}", batch * 100 + partition * 10 + i % 3 + 1)
        for i in range(40)
    ]
    return [rows_of(pairs[:20]), rows_of(pairs[20:])]


def _difference(visible: Mapping[str, int], expected: Mapping[str, int]) -> str:
    lost = sum(max(0, n - visible.get(w, 0)) for w, n in expected.items())
    twice = sum(max(0, visible.get(w, 0) - n) for w, n in expected.items())
    wrong = sorted(w for w in visible if w not in expected)
    return f"lost or duplicated rows: {lost} lost, {twice} written twice, wrong words {wrong}"


class SinkContract:
    """Every test a two-phase sink must pass; see the module docstring."""

    partitions = 2
    query_id = "eos-contract-query"

    # -- what a subclass provides ----------------------------------------------------

    def new_writer(self, sink_id: str | None = None) -> TwoPhaseCommitWriter:
        """A fresh writer for this test's target; the same target on every call. With
        ``sink_id``, the sink's explicit sink id option set to it."""
        raise NotImplementedError

    def visible(self) -> Mapping[str, int]:
        """Per word, the sum of ``n`` readers of the store see now."""
        raise NotImplementedError

    # -- the harness of the suite ----------------------------------------------------

    @pytest.fixture(autouse=True)
    def _runs(self) -> None:
        self._task_ids = itertools.count(1)
        self._run = uuid.uuid4().hex

    def new_run(self) -> None:
        """A restarted query: a new run id, so new attempts get new unit names."""
        self._run = uuid.uuid4().hex

    def ship(self, writer: TwoPhaseCommitWriter) -> TwoPhaseCommitWriter:
        """The writer as a task gets it: pickled on the driver, unpickled in a worker."""
        shipped: TwoPhaseCommitWriter = pickle.loads(pickle.dumps(writer))  # noqa: S301
        return shipped

    def task(self, batch: int, partition: int, query_id: str | None = None) -> TaskIdentity:
        """A new task attempt of ``batch``/``partition`` in the current run (of this test's
        query, or of the query ``query_id``)."""
        return TaskIdentity(
            query_id or self.query_id, "contract", self._run, batch, partition, next(self._task_ids)
        )

    def prepare(
        self, writer: TwoPhaseCommitWriter, batch: int, partition: int, query_id: str | None = None
    ) -> PreparedUnit:
        rows = iter(batch_rows(batch, partition))
        return self.ship(writer).prepare_task(self.task(batch, partition, query_id), rows)

    def run_batch(
        self, writer: TwoPhaseCommitWriter, batch: int, query_id: str | None = None
    ) -> list[PreparedUnit]:
        """Every task of ``batch``, then the driver's commit: one micro-batch."""
        messages = [self.prepare(writer, batch, p, query_id) for p in range(self.partitions)]
        writer.commit(messages, batch)
        return messages

    def expected(self, batches: range | list[int]) -> Counter[str]:
        total: Counter[str] = Counter()
        for batch in batches:
            for partition in range(self.partitions):
                for record in batch_rows(batch, partition):
                    for word, n in zip(
                        record.column("word").to_pylist(),
                        record.column("n").to_pylist(),
                        strict=True,
                    ):
                        total[word] += n
        return total

    def abandon(self, writer: TwoPhaseCommitWriter) -> None:
        """What a crash does to a writer: its connections are gone."""
        writer.close()

    def assert_exactly_once(self, writer: TwoPhaseCommitWriter, batches: range) -> None:
        """Every row visible once, and nothing of the sink left in doubt; a failure says
        how many rows were lost, how many written twice, which words are wrong."""
        visible, expected = dict(self.visible()), dict(self.expected(batches))
        assert visible == expected, _difference(visible, expected)
        in_doubt = writer.units_in_doubt(self.sink(writer))
        assert in_doubt == [], f"units left in doubt: {', '.join(map(str, in_doubt))}"

    def sink(self, writer: TwoPhaseCommitWriter) -> str:
        return writer.sink_id(self.query_id)

    # -- the contract ----------------------------------------------------------------

    def test_batches_commit_exactly_once_and_a_repeated_commit_changes_nothing(self) -> None:
        writer = self.new_writer()
        for batch in range(3):
            messages = self.run_batch(writer, batch)
        writer.commit(messages, 2)  # Spark replays a commit whose commits/N it did not write
        self.assert_exactly_once(writer, range(3))
        unit = next(m.unit for m in messages if m.unit is not None)
        assert writer.commit_unit(unit) is Outcome.ALREADY_COMMITTED

    @pytest.mark.parametrize("point", CRASH_POINTS)
    def test_a_crash_at_each_step_then_a_replay_writes_each_row_once(self, point: str) -> None:
        writer = self.new_writer()
        self.run_batch(writer, 0)
        with pytest.raises(faults.SimulatedCrash), faults.simulate(f"{point}@1"):
            self.run_batch(writer, 1)
        self.abandon(writer)
        self.new_run()
        fresh = self.new_writer()
        self.run_batch(fresh, 1)  # Spark replays batch 1 from its checkpointed offsets
        self.run_batch(fresh, 2)
        self.assert_exactly_once(fresh, range(3))

    def test_a_retried_task_deals_with_the_failed_attempts_unit_as_its_store_says(
        self,
    ) -> None:
        writer = self.new_writer()
        failed = self.prepare(writer, 0, 0)  # its worker died; Spark retries the task
        messages = [self.prepare(writer, 0, p) for p in range(self.partitions)]
        in_doubt = writer.units_in_doubt(self.sink(writer))
        assert failed.unit is not None
        if writer.siblings is Siblings.ROLL_BACK:
            assert failed.unit not in in_doubt, "the retry must roll back the failed attempt's unit"
        elif writer.siblings is Siblings.ADOPT:
            assert messages[0].unit == failed.unit, "the retry must report the whole unit it found"
        else:
            assert failed.unit in in_doubt and messages[0].unit != failed.unit
        writer.commit(messages, 0)
        self.assert_exactly_once(writer, range(1))

    def test_two_live_attempts_of_one_task_never_share_a_unit(self) -> None:
        """Attempt numbers repeat across stage attempts; task attempt ids never do. (A store
        that adopts has the second attempt report the first one's unit, preparing none.)"""
        writer = self.new_writer()
        first, second = self.task(0, 0), self.task(0, 0)
        units = [
            self.ship(writer).prepare_task(task, iter(batch_rows(0, 0))).unit
            for task in (first, second)
        ]
        if writer.siblings is Siblings.ADOPT:
            assert units[0] == units[1] and units[0] is not None
            assert units[0].attempt == first.attempt, "the second attempt prepared a unit"
        else:
            assert len(set(units)) == 2, "two attempts of one task got the same unit name"
        messages = [self.prepare(writer, 0, p) for p in range(1, self.partitions)]
        retry = self.ship(writer).prepare_task(self.task(0, 0), iter(batch_rows(0, 0)))
        writer.commit([retry, *messages], 0)
        self.assert_exactly_once(writer, range(1))

    def test_a_second_live_attempt_of_a_task_loses_and_duplicates_nothing(self) -> None:
        """A resubmitted stage re-runs a task whose first attempt already prepared, and Spark
        keeps the first attempt's result. A store that rolls back other attempts' units
        fails that batch (a restart replays it); one that adopts or leaves them commits it."""
        writer = self.new_writer()
        messages = [self.prepare(writer, 0, p) for p in range(self.partitions)]
        self.prepare(writer, 0, 0)  # the second attempt of task 0, whose result Spark drops
        if writer.siblings is not Siblings.ROLL_BACK:
            writer.commit(messages, 0)
            self.assert_exactly_once(writer, range(1))
            return
        with pytest.raises(UnitMissingError):
            writer.commit(messages, 0)
        writer.abort(messages, 0)  # Spark aborts the batch whose commit failed
        assert dict(self.visible()) == {}, "a batch that failed to decide showed rows"
        self.abandon(writer)
        self.new_run()
        fresh = self.new_writer()
        self.run_batch(fresh, 0)
        self.assert_exactly_once(fresh, range(1))

    def test_a_decided_unit_is_never_rolled_back(self) -> None:
        writer = self.new_writer()
        messages = [self.prepare(writer, 0, p) for p in range(self.partitions)]
        with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@0"):
            writer.commit(messages, 0)
        decision = writer.find_decision(self.sink(writer), 0)
        assert decision is not None and decision.units
        zombie = self.prepare(writer, 0, 0)
        assert zombie.unit is None and zombie.skipped_decided, "a zombie wrote a decided batch"
        assert not writer.rollback_undecided(self.sink(writer), 0, list(decision.units))
        writer.abort(messages, 0)
        assert set(decision.units) <= set(writer.units_in_doubt(self.sink(writer)))
        self.abandon(writer)
        fresh = self.new_writer()
        self.new_run()
        self.run_batch(fresh, 0)
        self.assert_exactly_once(fresh, range(1))

    def test_a_zombie_that_prepares_after_its_batch_was_decided_leaves_nothing(self) -> None:
        writer = self.new_writer()
        self.run_batch(writer, 0)
        # It passed its "is the batch decided?" check before the decision, then slept.
        late = UnitId(self.sink(writer), 0, 0, f"{next(self._task_ids)}-zombie")
        self.ship(writer).prepare(late, iter(batch_rows(0, 0)))
        self.run_batch(writer, 1)  # the next batch's tasks release it, its commit settles it
        self.assert_exactly_once(writer, range(2))

    def test_a_decision_arriving_after_an_abort_is_refused(self) -> None:
        writer = self.new_writer()
        messages = [self.prepare(writer, 0, p) for p in range(self.partitions)]
        writer.abort(messages, 0)
        with pytest.raises(UnitMissingError):
            writer.commit(messages, 0)  # the commit's decision was still in flight
        assert dict(self.visible()) == {}
        self.new_run()
        self.run_batch(writer, 0)
        self.assert_exactly_once(writer, range(1))

    def test_an_epoch_of_continuous_processing_is_never_committed(self) -> None:
        """Under ``trigger(continuous=...)`` Spark hands a Python sink no rows and its
        commit ``None`` for every task (protocol.md, rule 35): the commit refuses it,
        decides nothing, and the sink goes on as before."""
        writer = self.new_writer()
        with pytest.raises(ContinuousProcessingError):
            writer.commit([None] * self.partitions, 0)
        assert writer.find_decision(self.sink(writer), 0) is None
        self.run_batch(writer, 0)
        self.assert_exactly_once(writer, range(1))

    def test_an_abort_rolls_back_the_units_of_tasks_that_never_reported(self) -> None:
        """A cancelled batch (``query.stop()``): Spark's abort gets the finished tasks'
        messages only; the unit of a task that prepared and was not waited for is found
        by its name and rolled back too, so nothing is left in doubt holding locks."""
        writer = self.new_writer()
        messages = [self.prepare(writer, 0, p) for p in range(self.partitions)]
        writer.abort([messages[0], *([None] * (self.partitions - 1))], 0)
        assert writer.units_in_doubt(self.sink(writer)) == [], "an unreported unit was left"
        assert dict(self.visible()) == {}
        self.new_run()
        self.run_batch(writer, 0)
        self.assert_exactly_once(writer, range(1))

    def test_a_task_that_prepares_after_the_abort_rolls_its_unit_back(self) -> None:
        """A task Spark stopped waiting for (a cancelled batch, ``query.stop()``) goes on
        after the driver's abort and prepares: it finds its run's abort recorded, rolls
        its own unit back and fails, so nothing is left in doubt holding locks until the
        next start. Optional for a store (``UnitStore.record_abort``): skipped for one that
        records no aborts."""
        writer = self.new_writer()
        if type(writer).record_abort is UnitStore.record_abort:
            pytest.skip("the store records no aborts (optional: UnitStore.record_abort)")
        finished = self.prepare(writer, 0, 0)
        writer.abort([finished, *([None] * (self.partitions - 1))], 0)
        with pytest.raises(BatchAbortedError, match="aborted by the driver"):
            self.prepare(writer, 0, 1)
        assert writer.units_in_doubt(self.sink(writer)) == [], "a late unit was left"
        assert dict(self.visible()) == {}
        self.new_run()
        self.run_batch(writer, 0)
        self.assert_exactly_once(writer, range(1))

    def test_a_decided_unit_that_vanished_is_an_error_never_already_committed(self) -> None:
        writer = self.new_writer()
        with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@0"):
            self.run_batch(writer, 0)
        decision = writer.find_decision(self.sink(writer), 0)
        assert decision is not None
        writer.rollback_unit(decision.units[0])  # someone outside the protocol removed it
        self.abandon(writer)
        fresh = self.new_writer()
        with pytest.raises(ProtocolError, match="neither prepared nor recorded"):
            self.run_batch(fresh, 0)
        for unit in decision.units[1:]:  # what an operator settles once told of the loss
            fresh.commit_unit(unit)
        assert fresh.units_in_doubt(self.sink(fresh)) == [], "units left in doubt"

    def test_a_new_checkpoint_that_reuses_the_sink_id_fails_instead_of_skipping(self) -> None:
        """Its batch numbers start again at 0: without the owner check its tasks would
        skip every batch the old query decided, writing nothing and saying nothing."""
        sink_id = f"reused-{uuid.uuid4().hex[:8]}"
        writer = self.new_writer(sink_id)
        for batch in range(2):
            self.run_batch(writer, batch)
        self.new_run()
        fresh = self.new_writer(sink_id)
        with pytest.raises(SinkClaimedError, match=f"{sink_id}.*{self.query_id}.*new-query"):
            self.prepare(fresh, 0, 0, query_id="new-query")
        assert fresh.owner(sink_id) == writer.owner(sink_id) != None  # noqa: E711
        assert dict(self.visible()) == dict(self.expected(range(2)))
        assert fresh.units_in_doubt(sink_id) == []

    def test_of_two_queries_sharing_a_sink_id_one_commits_and_the_other_fails(self) -> None:
        """Both prepared batch 0 before either claimed the sink id: the first commit owns
        it; the second rolls back its own units and fails, writing nothing."""
        sink_id = f"shared-{uuid.uuid4().hex[:8]}"
        writer, other = self.new_writer(sink_id), self.new_writer(sink_id)
        mine = [self.prepare(writer, 0, p) for p in range(self.partitions)]
        theirs = [self.prepare(other, 0, p, query_id="other-query") for p in range(self.partitions)]
        writer.commit(mine, 0)
        with pytest.raises(SinkClaimedError, match="other-query"):
            other.commit(theirs, 0)
        other.abort(theirs, 0)  # Spark aborts the failed batch
        self.run_batch(writer, 1)
        assert dict(self.visible()) == dict(self.expected(range(2)))
        assert writer.units_in_doubt(sink_id) == []

    def test_a_batch_planned_again_below_a_later_decision_is_refused(self) -> None:
        """A checkpoint restored from an older copy has Spark plan batch numbers the sink
        decided again, over other records: the tasks skip such a batch as decided, and
        its commit is refused (the store's ``applied_watermark``) instead of recorded as
        written, which would lose its records."""
        writer = self.new_writer()
        for batch in range(3):
            self.run_batch(writer, batch)
        self.new_run()
        with pytest.raises(CheckpointBehindSinkError, match=r"batch 1 .* up to batch 2"):
            self.run_batch(self.new_writer(), 1)
        assert dict(self.visible()) == dict(self.expected(range(3)))

    def test_a_batch_planned_again_over_other_positions_is_refused(self, tmp_path: Path) -> None:
        """A checkpoint put back by one batch (its last ``offsets/`` and ``commits/`` files
        deleted) has Spark plan the sink's last decided batch again, over more records:
        its commit is refused, since the decision recorded other source positions
        (``Decision.offsets``), while the replay of the batch as decided commits. A store
        that keeps no ``offsets`` is skipped: it cannot tell the two apart."""
        offsets = tmp_path / "offsets"
        offsets.mkdir()
        planned = 'v1\n{{"batchTimestampMs":{0}}}\n{{"source":{{"0":{1}}}}}\n'.format
        for batch in range(2):
            (offsets / str(batch)).write_text(planned(batch, 100 * (batch + 1)))
        writer = self.new_writer()
        writer.checkpoint_location = str(tmp_path)
        for batch in range(2):
            self.run_batch(writer, batch)
        decided = writer.find_decision(self.sink(writer), 1)
        if decided is None or not decided.offsets:
            pytest.skip("the store keeps no Decision.offsets")
        kept = (offsets / "1").read_text()
        (offsets / "1").write_text(planned(9, 900))
        self.new_run()
        again = self.new_writer()
        again.checkpoint_location = str(tmp_path)
        with pytest.raises(CheckpointBehindSinkError, match=r"batch 1 .* other source positions"):
            self.run_batch(again, 1)
        (offsets / "1").write_text(kept)
        self.run_batch(again, 1)
        self.assert_exactly_once(again, range(2))

    def test_unit_names_fit_the_store(self) -> None:
        """The longest name the protocol makes: a 64-character sink id, huge ids."""
        writer = self.new_writer()
        unit = UnitId("s" * 64, 2**62, 2**31 - 1, f"{2**62}-{'f' * 12}-{'e' * 12}")
        assert UnitId.parse(str(unit)) == unit
        count = self.ship(writer).prepare(unit, iter(batch_rows(0, 0)))
        assert count == 40
        writer.rollback_unit(unit)
        assert unit not in writer.units_in_doubt(unit.sink_id)

"""The Kafka sink's change-stream keys per task and the driver's look for a key in two
tasks (sinks/kafka/task_keys.py). Cost: well under a second."""

from __future__ import annotations

import pyarrow as pa

from eos_connectors.sinks.kafka.task_keys import TaskKeys, shared_key


def _batch(keys: list[bytes | None]) -> pa.RecordBatch:
    return pa.record_batch({"key": pa.array(keys, pa.binary()), "value": [b"v"] * len(keys)})


def test_a_task_notes_each_non_null_key_once_and_passes_its_rows_unchanged() -> None:
    noted = TaskKeys()
    batches = [_batch([b"a", b"b", b"a"]), _batch([None, b"b", b"c"])]
    assert list(noted.passing(iter(batches))) == batches
    distinct = noted.distinct()
    assert distinct is not None and sorted(distinct.to_pylist()) == [b"a", b"b", b"c"]


def test_rows_without_a_key_column_note_nothing() -> None:
    noted = TaskKeys()
    list(noted.passing(iter([pa.record_batch({"value": [b"v"]})])))
    assert noted.distinct() is None


def test_a_key_in_two_tasks_is_found_with_both_partitions() -> None:
    reports = [
        (3, pa.array([b"x", b"shared"], pa.binary())),
        (0, pa.array([b"y"], pa.binary())),
        (1, pa.array([b"shared", b"z"], pa.binary())),
    ]
    assert shared_key(reports) == (b"shared", 1, 3)


def test_keys_each_in_one_task_or_a_single_task_pass() -> None:
    assert (
        shared_key([(0, pa.array(["a"])), (1, pa.array(["b"])), (2, pa.array([], pa.string()))])
        is None
    )
    assert shared_key([(0, pa.array(["a", "b"]))]) is None
    assert shared_key([]) is None

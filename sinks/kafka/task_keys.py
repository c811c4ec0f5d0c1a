"""A change stream's keys per task, and the driver's check that no key reached two tasks
of a batch (``commitMode=batch`` with ``deleteColumn`` or ``orderColumns``).

Two tasks of one batch that write one key's changes cannot keep their order: each sorts
its own rows, and both transactions are committed together, so a compacted topic may keep
the older value, or a tombstone written by one task may come before the insert the other
wrote. With the driver committing, the batch can be refused before anything of it is
visible: each task reports the distinct keys it wrote (an Arrow array, computed column-wise
as the rows pass), and the driver looks for a key two reports share before it decides.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class TaskKeys:
    """Task: the distinct non-null keys of the rows that pass through :meth:`passing`."""

    def __init__(self) -> None:
        self._seen: list[pa.Array] = []

    def passing(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` unchanged, each one's keys noted."""
        for batch in batches:
            if "key" in batch.schema.names:
                self._seen.append(pc.unique(batch.column("key").drop_null()))
            yield batch

    def distinct(self) -> pa.Array | None:
        """The keys seen, each once (None when the rows had no ``key`` column)."""
        if not self._seen:
            return None
        return pc.unique(pa.concat_arrays(self._seen))


def shared_key(keys: Sequence[tuple[int, pa.Array]]) -> tuple[object, int, int] | None:
    """Driver: a key that two task partitions' distinct keys share, with the two
    partitions (lowest first), or None. Column-wise: one group-by over every report."""
    held = [(p, k) for p, k in keys if len(k)]
    if len(held) < 2:
        return None
    table = pa.table(
        {
            "key": pa.concat_arrays([k for _, k in held]),
            "partition": pa.array(
                np.concatenate([np.full(len(k), p, dtype=np.int32) for p, k in held])
            ),
        }
    )
    spread = table.group_by("key").aggregate([("partition", "min"), ("partition", "max")])
    crossing = spread.filter(pc.not_equal(spread["partition_min"], spread["partition_max"]))
    if not crossing.num_rows:
        return None
    first = crossing.slice(0, 1).to_pylist()[0]
    return first["key"], int(first["partition_min"]), int(first["partition_max"])

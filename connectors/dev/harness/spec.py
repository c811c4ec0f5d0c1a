"""What a pipeline process runs: its queries, as a JSON file the harness or bench writes.

The file, not the command line, carries sink options: a password in a DSN never
shows in ``ps``. It is written readable by its owner only.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: What each stage emits, from the keyed input (``key`` = a word):
#: ``processor``: (word, count, delta), transformWithStateInPandas, append mode;
#: ``count``: (word, count), groupBy().count(), complete mode;
#: ``records``: (word, partition, offset), every record, append mode;
#: ``window``: (word, count) per 10-second event-time window of the record's Kafka
#: timestamp, with a 5-second watermark, append mode; ``word`` is ``<word>@<window
#: start, epoch seconds>``;
#: ``changes``: (id, op, version, partition, offset), a change stream's records as they
#: are (value ``<op>:<version>``, see ``data.produce_changes``), append mode.
STAGES = ("processor", "count", "records", "window", "changes")
WINDOW_SECONDS = 10
WATERMARK_SECONDS = 5


@dataclass(frozen=True)
class QuerySpec:
    """One streaming query: a source topic, a stage, a sink with its columns and options."""

    name: str
    topic: str
    stage: str
    format: str
    columns: tuple[str, ...]  # select expressions over the stage's output
    options: dict[str, str] = field(default_factory=dict, repr=False)  # may hold passwords
    source: str = "eos_kafka"  # or Spark's own "kafka"
    source_options: dict[str, str] = field(default_factory=dict)  # more source options
    #: minPartitions on the query's first, second, ... start (in any pipeline process),
    #: cycling: what an operator retuning the source between restarts does.
    vary_min_partitions: tuple[int, ...] = ()
    #: How the sink's input reaches its tasks, advancing at each refusal of a key in two
    #: tasks (see ``layouts.py``): ``split``, ``round-robin``, ``by-key``.
    layouts: tuple[str, ...] = ()
    max_offsets: int | None = None  # maxOffsetsPerTrigger; None: the pipeline's

    @property
    def output_mode(self) -> str:
        """PySpark's Python sinks take append and complete, not update."""
        return "complete" if self.stage == "count" else "append"


@dataclass(frozen=True)
class PipelineSpec:
    bootstrap: str
    checkpoint: str  # each query checkpoints in <checkpoint>/<query name>
    queries: tuple[QuerySpec, ...]
    max_offsets: int = 500
    trigger: str = "available-now"  # or "continuous": every ``every``
    every: str = "500 milliseconds"
    register: tuple[str, ...] = ()  # module:Class of DataSources to register
    conf: dict[str, str] = field(default_factory=dict)
    master: str | None = None
    cores: int = 2  # local[cores]: task slots (tasks wait on I/O as much as on CPU)
    events: bool = False  # a JSON line per committed batch
    restart_failed: int = 0  # in-process restarts of a failed query (see pipeline.py)
    app: str = "eos-pipeline"

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(self), out, indent=2)
        return path

    @classmethod
    def read(cls, path: Path) -> PipelineSpec:
        raw = json.loads(path.read_text())
        queries = tuple(
            QuerySpec(
                **{
                    **q,
                    "columns": tuple(q["columns"]),
                    "vary_min_partitions": tuple(q.get("vary_min_partitions", ())),
                    "layouts": tuple(q.get("layouts", ())),
                }
            )
            for q in raw.pop("queries")
        )
        return cls(queries=queries, **{**raw, "register": tuple(raw.get("register", ()))})

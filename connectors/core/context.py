"""Who a Spark task is: query, run, micro-batch, partition and attempt, from its task context.

Structured Streaming puts the query id and batch id into every task's local
properties, and the job description reads ``<query name>\\nid = <query id>\\nrunId
= <run id>\\nbatch = <batch id>``. PySpark hands all of them to Python workers.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from typing import Any

from eos_connectors.core.errors import EosError

_RUN_ID = re.compile(r"^runId = ([0-9a-f-]+)$", re.MULTILINE)


class NotInStreamingTaskError(EosError):
    """Code that needs a streaming task's identity ran outside one."""


@dataclass(frozen=True)
class TaskIdentity:
    """One task attempt of one micro-batch of one run of a streaming query.

    ``task_attempt_id`` is unique within a Spark application (unlike the attempt
    number, which restarts with every stage attempt); ``run_id`` changes every time
    the query starts. Together they name an attempt uniquely for good.
    """

    query_id: str
    query_name: str | None
    run_id: str
    batch_id: int
    partition: int
    task_attempt_id: int

    @property
    def run(self) -> str:
        """The first 12 hex digits of the run id, as unit names carry them."""
        return self.run_id.replace("-", "")[:12]

    @property
    def attempt(self) -> str:
        """``<task attempt id>-<first 12 hex digits of the run id>-<query tag>``: unique per
        attempt, and telling which query made it."""
        return f"{self.task_attempt_id}-{self.run}-{query_tag(self.query_id)}"

    @classmethod
    def current(cls) -> TaskIdentity:
        """The running task's identity; NotInStreamingTaskError outside a streaming task."""
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        if context is None or batch is None or query is None:
            raise NotInStreamingTaskError(
                "This sink runs only inside a Spark Structured Streaming query "
                "(no streaming batch id in the task context)."
            )
        description = context.getLocalProperty("spark.job.description") or ""
        return cls(
            query_id=query,
            query_name=_query_name(description),
            run_id=_run_id(description, context.getLocalProperty("spark.jobGroup.id")),
            batch_id=int(batch),
            partition=context.partitionId(),
            task_attempt_id=context.taskAttemptId(),
        )


def query_tag(query_id: str) -> str:
    """12 hex digits that stand for a query id inside unit names (a gid has 200 bytes)."""
    return hashlib.sha256(query_id.encode()).hexdigest()[:12]


def current_batch() -> int | None:
    """The micro-batch id of the running Spark task, when called inside one."""
    context = _context()
    value = context.getLocalProperty("streaming.sql.batchId") if context else None
    return int(value) if value is not None else None


def current_partition() -> int | None:
    """The partition id of the running Spark task, when called inside one."""
    context = _context()
    return int(context.partitionId()) if context else None


def current_query_name() -> str | None:
    """The name of the streaming query the running task belongs to (``.queryName``)."""
    context = _context()
    return _query_name(context.getLocalProperty("spark.job.description") or "") if context else None


def _context() -> Any:
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return None
    return TaskContext.get()


def _query_name(description: str) -> str | None:
    """The first line of a streaming job's description, when the query has a name."""
    if "\nid = " not in description:
        return None
    first = description.split("\n", 1)[0].strip()
    return first or None


def _run_id(description: str, job_group: str | None) -> str:
    found = _RUN_ID.search(description)
    if found:
        return found.group(1)
    return job_group or uuid.uuid4().hex  # never shared: still unique per attempt

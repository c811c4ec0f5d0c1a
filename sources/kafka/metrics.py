"""How far a query's ``eos_kafka`` source is behind the topics' latest offsets.

Spark's own Kafka source reports ``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``
and ``avgOffsetsBehindLatest`` in each progress's ``sources[].metrics``. PySpark's
Python source API has no call that returns metrics (a Python source is asked for
offsets and partitions only), so they cannot appear there. They can be computed
from what the progress does carry: the source's ``endOffset`` (where the batch
ended) and ``latestOffset`` (the end of the topics when the batch was planned,
which this source reports). :func:`offsets_behind_latest` does it from a progress,
and :class:`OffsetsBehindLatest` is a listener that hands them to a callback, for
a metrics system to export.
"""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryListener

from eos_connectors.sources.kafka.offsets import from_spark

log = logging.getLogger(__name__)

Metrics = dict[str, float]


def offsets_behind_latest(source: Mapping[str, Any]) -> Metrics | None:
    """Spark's three lag metrics from one ``sources[]`` entry of a query's progress (a
    dict, as ``query.lastProgress["sources"][0]``, or the listener's SourceProgress):
    per partition of the batch, the latest offset minus its end offset. None when the
    entry has no ``latestOffset`` or ``endOffset`` (another source, or no batch yet)."""
    try:
        ends = from_spark(_json(_get(source, "endOffset")))
        latests = from_spark(_json(_get(source, "latestOffset")))
    except (AttributeError, TypeError, ValueError):  # no batch yet, or not Kafka offsets
        return None
    behind = [max(0, latests[tp] - ends[tp]) for tp in latests if tp in ends]
    if not behind:
        return None
    return {
        "minOffsetsBehindLatest": float(min(behind)),
        "maxOffsetsBehindLatest": float(max(behind)),
        "avgOffsetsBehindLatest": sum(behind) / len(behind),
    }


def _get(source: Any, name: str) -> Any:
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def _json(value: Any) -> Any:
    """An offset as the progress gives it: JSON, a parsed dict, or (PySpark 4.0's progress
    objects, whose ``endOffset`` is ``str()`` of the parsed JSON) a Python literal."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)  # literals only: a repr of str/int dicts, never code
    except (SyntaxError, MemoryError, RecursionError) as error:
        raise ValueError(f"not an offset: {value[:80]!r}") from error


def _log(query: str, metrics: Metrics) -> None:
    log.info("eos_kafka: query %s is behind latest by %s", query, metrics)


class OffsetsBehindLatest(StreamingQueryListener):  # type: ignore[misc]
    """Driver: after each batch, ``report(query name, metrics)`` for every Kafka source
    of the query (``eos_kafka``, or Spark's own; logged at INFO by default).
    ``spark.streams.addListener(OffsetsBehindLatest(gauge_callback))``."""

    def __init__(self, report: Callable[[str, Metrics], None] = _log) -> None:
        self.report = report

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        for source in progress.sources:
            metrics = offsets_behind_latest(source)
            if metrics is not None:
                self.report(progress.name or str(progress.id), metrics)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass

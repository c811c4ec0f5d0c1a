"""Driver side: Spark's Python processes that plan and commit each batch keep their
long-lived objects out of the garbage collector's walk.

Spark calls a Python sink's ``streamWriter`` twice a batch, in two processes of the
driver it forks from its own daemon and keeps for the query: one for the batch's writer
factory, one for its commit (:mod:`.startup`). After every call PySpark's daemon runs a
full ``gc.collect()`` in the process, which walks every tracked object: PySpark's own
modules, the connector's, the clients the commit keeps (43,000-68,000 objects, 16-36 ms
of CPU a collection, measured in both processes of a Kafka sink: two a batch, on the
cores the batch's tasks run on). The package's worker daemon freezes its imports before
it forks the task workers (:mod:`eos_connectors.worker_daemon`); these processes come
from Spark's daemon, so :func:`settle` freezes them from inside, at the second call of a
process: the first call's imports and kept clients are alive then, and its garbage was
collected after it. A collection then walks only what a batch leaves.

A frozen object is never collected; one that becomes cyclic garbage later (a kept
client replaced after an error) would stay. So every :data:`REFREEZE` calls the process
thaws everything for one call (the collection after it walks and frees all), and
freezes again at the next. Outside a process Spark started (a test, a script calling a
writer) nothing is frozen.
"""

from __future__ import annotations

import gc

from eos_connectors.core.startup import started_by_spark

#: Calls between two full walks (a thaw, then a freeze at the next call).
REFREEZE = 256

_calls = 0


def settle() -> None:
    """Driver, at the start of each Spark call that plans or commits a write: from a
    process's second call, what is alive is frozen out of the collector (see the module's
    docstring); every :data:`REFREEZE` calls it is thawed for one call."""
    global _calls
    if not started_by_spark():
        return
    _calls += 1
    if _calls % REFREEZE == 0:
        gc.unfreeze()  # the collection after this call walks, and frees, everything
    elif _calls == 2 or (_calls > REFREEZE and _calls % REFREEZE == 1):
        gc.freeze()

"""The services a harness run uses, and crashing one of them when they are the stack's."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from eos_connectors.core.errors import StackError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.cells import Target
from eos_connectors.dev.harness.plan import CrashService, Names, step_target

#: How long the brokers of an outage (the ``min-isr`` role) stay down together.
OUTAGE_SECONDS = 15.0
#: How long a service crashed at a protocol step stays down after the step went on.
STEP_OUTAGE_SECONDS = 4.0


def endpoints_and_crash() -> tuple[Endpoints, CrashService | None]:
    """Endpoints from ``EOS_*`` variables, else the package's stack (started when down).

    The second value SIGKILLs a service and starts it again on its port; it is None
    when the endpoints are not the stack's, because then the harness cannot restart them.
    """
    from eos_connectors.dev.stack import Stack

    from_env = Endpoints.from_env()
    if from_env is None:
        print("Starting the local stack (Kafka, PostgreSQL, Redis)...", file=sys.stderr)
        started = Stack().up()
        return started, crash_function(started)
    return from_env, crash_function(from_env)


def crash_function(endpoints: Endpoints) -> CrashService | None:
    """A function that crashes and restarts a service of the running stack, if
    ``endpoints`` are that stack's."""
    from eos_connectors.dev.stack import Stack

    stack = Stack()
    if not stack.is_up() or stack.endpoints() != endpoints:
        return None

    def crash_and_restart(name: str, meanwhile: Callable[[], None] | None = None) -> None:
        """SIGKILL ``name`` and start it again; several names (``kafka-1,kafka-2``) are
        killed together and kept down for ``OUTAGE_SECONDS`` first. ``meanwhile`` runs
        once they are dead (a held step goes on), ``STEP_OUTAGE_SECONDS`` before the
        restart."""
        names = name.split(",")
        for each in names:
            stack.kill(each)
        if meanwhile is not None:
            meanwhile()
            time.sleep(STEP_OUTAGE_SECONDS)
        if len(names) > 1:
            time.sleep(OUTAGE_SECONDS)
        try:
            stack.up()
        except StackError as exc:  # one more try: a crashed server may need a moment
            print(f"restarting {name} failed once ({exc}); trying again", file=sys.stderr)
            time.sleep(3)
            stack.up()
        if stack.endpoints() != endpoints:
            raise StackError(
                f"{name} came back on another port ({stack.endpoints().describe()}), so the "
                "pipeline under test cannot reach it: the run cannot go on."
            )

    return crash_and_restart


def broker_nodes(chosen: list[Target], names: Names, role: str) -> list[str]:
    """The nodes (``kafka-<n>``) of the stack's replicated Kafka that have ``role`` for this
    run now (see ``plan.BROKER_ROLES``; ``min-isr``: the output leader and one more); the
    input leader stands in for a role no query has."""
    from eos_connectors.dev.stack import Stack

    cluster = Stack().cluster
    if cluster is None:
        raise StackError(
            "Killing a broker needs a replicated Kafka: `eos stack up --kafka-brokers 3`."
        )
    to_kafka = [t for t in chosen if t.family == "kafka"]
    if role == "min-isr":  # one replica of three left
        leader = broker_nodes(chosen, names, "output-leader")[0]
        other = next(n for n in map(cluster.name, cluster.node_ids()) if n != leader)
        return [leader, other]
    if role == "output-leader" and to_kafka:
        node = cluster.leader(to_kafka[0].output, 0)
    elif role == "coordinator" and to_kafka:  # the sink's default transactionalIdPrefix
        node = cluster.coordinator(f"eos-{step_target('coordinator', chosen).sink_id}-0")
    else:
        node = cluster.leader(names.topic(chosen[0].cell), 0)
    return [cluster.name(node)]

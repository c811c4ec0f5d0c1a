"""Task side: one Python worker's Kafka clients, kept across tasks and batches (Spark
reuses its workers): the exactly-once writer's producers and marker consumers, the
batch commit's marker groups, and the at-least-once writer's producers."""

from __future__ import annotations

from collections import OrderedDict
from contextlib import AbstractContextManager

from confluent_kafka import Producer

from eos_connectors.core.kept import Kept
from eos_connectors.core.secrets import settings_digest
from eos_connectors.sinks.kafka.clients import (
    LIBRDKAFKA_LOG,
    DeliveryFailures,
    TransactionalProducer,
    fenced_producer,
)
from eos_connectors.sinks.kafka.marker import MarkerGroup
from eos_connectors.sinks.kafka.options import KafkaSinkOptions


class ClientPool:
    """Task side: one Python worker's idle transactional producers and marker consumers,
    by transactional id and client settings, kept across tasks and batches.

    A task takes its pair out (so two tasks never share one), and gives it back only
    after a committed or skipped transaction; after any error both are dropped. At most
    ``size`` pairs stay idle, the least recently used closed first.
    """

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._idle: OrderedDict[tuple[str, str], tuple[TransactionalProducer, MarkerGroup]] = (
            OrderedDict()
        )
        self.created = 0  # producers made (and fenced in): for tests and the profile

    def take(
        self, options: KafkaSinkOptions, name: str
    ) -> tuple[TransactionalProducer | None, MarkerGroup]:
        """``name``'s idle producer and marker consumer, taken out of the pool, or no
        producer (the task fences one in once it has read the marker) and a new consumer."""
        idle = self._idle.pop(_pool_key(options, name), None)
        if idle is not None:
            return idle
        return None, MarkerGroup(options, name)

    def new_producer(self, options: KafkaSinkOptions, name: str) -> TransactionalProducer:
        """A new producer of ``name``, fenced in (it fences every other one)."""
        self.created += 1
        return fenced_producer(options, name)

    def give_back(
        self,
        options: KafkaSinkOptions,
        name: str,
        producer: TransactionalProducer,
        marker: MarkerGroup,
    ) -> None:
        """Keep the pair for the task partition's next batch, unless the producer lost a
        broker connection meanwhile (:class:`BrokerLoss`): then both are dropped."""
        if producer.loss.seen:
            marker.close()
            return
        self._idle[_pool_key(options, name)] = (producer, marker)  # taken out: goes last
        while len(self._idle) > self.size:
            _, (_, oldest) = self._idle.popitem(last=False)
            oldest.close()

    def discard(self, marker: MarkerGroup) -> None:
        """Drop a task's pair after an error (the producer may be fenced or mid-transaction:
        it is never given back, and goes with its last reference)."""
        marker.close()


def _pool_key(options: KafkaSinkOptions, name: str) -> tuple[str, str]:
    """The transactional id and a digest of the settings (which may hold credentials)."""
    return name, settings_digest(options.producer_config())


#: This Python worker's pool (module state lives as long as Spark reuses the worker).
CLIENTS = ClientPool()


class PlainProducers:
    """Task side: one Python worker's idle at-least-once producers, by client settings.

    A task takes one out and gives it back after every record was delivered; after
    anything else it is purged and dropped, so a failed task's queued records are not
    sent by the next task's flush. At most ``size`` stay idle.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._idle: OrderedDict[str, tuple[Producer, DeliveryFailures]] = OrderedDict()
        self.created = 0  # for tests

    def take(self, options: KafkaSinkOptions) -> tuple[Producer, DeliveryFailures]:
        idle = self._idle.pop(settings_digest(options.producer_config()), None)
        if idle is not None:
            idle[1].clear()
            return idle
        self.created += 1
        delivery = DeliveryFailures()
        config = {**options.producer_config(), "delivery.report.only.error": True}
        return Producer({**config, "on_delivery": delivery, "logger": LIBRDKAFKA_LOG}), delivery

    def give_back(
        self, options: KafkaSinkOptions, producer: Producer, delivery: DeliveryFailures
    ) -> None:
        self._idle[settings_digest(options.producer_config())] = (producer, delivery)
        while len(self._idle) > self.size:  # the least recently used goes (all delivered)
            self._idle.popitem(last=False)

    def discard(self, producer: Producer) -> None:
        """Drop a failed task's producer with whatever it still holds."""
        producer.purge()


#: This Python worker's at-least-once producers.
PLAIN_PRODUCERS = PlainProducers()


class MarkerGroups:
    """Task side, the batch commit: one Python worker's idle marker groups (a task
    partition's, a sink's decision pointer's), by group and client settings, kept across
    tasks and batches (:class:`~eos_connectors.core.kept.Kept`). Each is two consumers
    that never subscribe; reading a committed offset always asks the broker, so a kept
    one reads what a new one would, without its connections and coordinator look-up."""

    def __init__(self, size: int = 64) -> None:
        self._kept: Kept[MarkerGroup] = Kept(MarkerGroup.close, size)

    @property
    def created(self) -> int:
        return self._kept.created

    def lent(self, options: KafkaSinkOptions, group: str) -> AbstractContextManager[MarkerGroup]:
        """``group``'s marker group for a task: kept again when the task is done with it,
        closed when the task failed."""
        key = f"{group}:{settings_digest(options.producer_config())}"
        return self._kept.lent(key, lambda: MarkerGroup(options, group))


#: This Python worker's batch-commit marker groups.
MARKER_GROUPS = MarkerGroups()

"""Sources: the replayable Kafka source ``eos_kafka``."""

__all__: list[str] = []

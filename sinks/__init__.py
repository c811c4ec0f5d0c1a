"""Sinks that commit when the batch completes (PostgreSQL, Kafka, Redis)."""

__all__: list[str] = []

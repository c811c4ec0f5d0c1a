"""Sources: the replayable Kafka source ``eos_kafka`` (its reading half, ``kafka``)."""

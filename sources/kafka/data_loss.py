"""What the source does when records it should read are gone (retention, a recreated
topic): fail naming them, or warn and go on past them (``failOnDataLoss``). Driver (the
offsets a batch plans) or task (a range whose start was deleted while it waited)."""

from __future__ import annotations

import logging

from eos_connectors.core.errors import DataLossError
from eos_connectors.sources.kafka.options import KafkaSourceOptions

log = logging.getLogger(__name__)


def report_data_loss(options: KafkaSourceOptions, what: str, resume: int) -> int:
    """Driver or task. Fail naming ``what`` (failOnDataLoss), or warn and go on at ``resume``."""
    if options.fail_on_data_loss:
        raise DataLossError(
            f"{what}. Records may have been lost (retention, or the topic was recreated). "
            "Set failOnDataLoss=false to skip them with a warning instead."
        )
    log.warning("eos_kafka: %s; skipping them (failOnDataLoss=false).", what)
    return resume

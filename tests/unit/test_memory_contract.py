"""The contract suite against the in-memory reference store: the protocol's logic alone."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from eos_connectors.core.protocol import Siblings, TwoPhaseCommitWriter
from eos_connectors.testing import MemorySink, SinkContract, memory_server


class TestMemorySink(SinkContract):
    def setup_method(self) -> None:
        self.server = f"contract-{uuid.uuid4().hex}"

    def new_writer(self, sink_id: str | None = None) -> TwoPhaseCommitWriter:
        return MemorySink(self.server, sink_id)

    def visible(self) -> Mapping[str, int]:
        return memory_server(self.server).data


class _AdoptingMemorySink(MemorySink):
    siblings = Siblings.ADOPT  # its prepare is one assignment: every unit it lists is whole


class _LeavingMemorySink(MemorySink):
    siblings = Siblings.LEAVE


class TestMemorySinkThatAdopts(TestMemorySink):
    """The contract with the policy PostgreSQL uses for other attempts' units."""

    def new_writer(self, sink_id: str | None = None) -> TwoPhaseCommitWriter:
        return _AdoptingMemorySink(self.server, sink_id)


class TestMemorySinkThatLeaves(TestMemorySink):
    """The contract with the policy Redis uses for other attempts' units."""

    def new_writer(self, sink_id: str | None = None) -> TwoPhaseCommitWriter:
        return _LeavingMemorySink(self.server, sink_id)

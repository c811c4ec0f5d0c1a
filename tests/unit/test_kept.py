"""The clients a process keeps (connectors/core/kept.py): at most ``size`` idle, the
least recently used closed first, one that failed closed, and every pool's idle ones
closed on demand (the test suite's modules, so their sockets never add up). Cost: under
0.1 s."""

from __future__ import annotations

import pytest

from eos_connectors.core.kept import Kept, close_idle


def test_idle_clients_are_kept_up_to_size_and_closed_on_failure_or_on_demand() -> None:
    closed: list[str] = []
    pool: Kept[str] = Kept(closed.append, size=2)
    for key in ("a", "b", "c"):
        with pool.lent(key, f"client-{key}".strip):
            pass
    assert closed == ["client-a"], "the least recently used one goes first"
    with pytest.raises(ValueError), pool.lent("b", lambda: "client-b2"):
        raise ValueError("a call failed")
    assert closed == ["client-a", "client-b"], "a client whose use failed is not kept"
    other: Kept[str] = Kept(closed.append, size=4)
    with other.lent("x", lambda: "client-x"):
        pass
    close_idle()
    assert sorted(closed[2:]) == ["client-c", "client-x"], "every pool's idle clients"
    with pool.lent("c", lambda: "client-c2") as again:
        assert again == "client-c2", "a closed client was lent again"

"""New ports for the stack's servers: below the kernel's ephemeral range (which every
outgoing connection draws from: once a pip download took a broker's port between its
choice and its bind) and never handed out twice while a server may still be starting,
by any process (`make test` starts two stacks at once). Cost: ~0.5 s."""

from __future__ import annotations

import multiprocessing

from eos_connectors.dev.stack import process
from eos_connectors.dev.stack.process import free_port, port_is_free


def _pick(count: int) -> list[int]:
    return [free_port() for _ in range(count)]


def test_new_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        picked = [p for ports in pool.map(_pick, [40, 40, 40]) for p in ports]
    assert len(set(picked)) == len(picked), "a port was handed out twice"
    floor = process._ephemeral_floor()
    assert all(process.LISTEN_FLOOR <= p < floor for p in picked), picked
    assert all(port_is_free(p) for p in picked[:10])
    assert all((process.RESERVED / str(p)).exists() for p in picked)

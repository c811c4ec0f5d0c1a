"""eos_redis's start checks against real Redis servers configured the ways it must
refuse (Cluster) or warn about (no AOF): each started here on a free port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from eos_connectors.core.errors import ConfigError
from eos_connectors.dev.stack.process import free_port
from eos_connectors.sinks.redis.format import check_server
from tests.redis_util import redis_server

pytestmark = pytest.mark.services


@pytest.fixture
def cluster_node(tmp_path: Path) -> Iterator[redis.Redis]:
    # The cluster bus listens on port + 10000 unless told otherwise: past 55535 it
    # cannot, so it gets a free port of its own.
    bus = str(free_port())
    yield from redis_server(
        tmp_path, "--cluster-enabled", "yes", "--cluster-port", bus, "--appendonly", "yes"
    )


@pytest.fixture
def no_aof(tmp_path: Path) -> Iterator[redis.Redis]:
    yield from redis_server(tmp_path, "--appendonly", "no")


def test_redis_cluster_is_refused(cluster_node: redis.Redis) -> None:
    with pytest.raises(ConfigError, match="does not support Redis Cluster"):
        check_server(cluster_node)


def test_a_server_without_aof_gets_a_warning(no_aof: redis.Redis) -> None:
    with pytest.warns(UserWarning, match="appendonly no"):
        check_server(no_aof)


def test_the_stack_server_passes_quietly(
    endpoints: object, recwarn: pytest.WarningsRecorder
) -> None:
    from eos_connectors.dev.endpoints import Endpoints

    assert isinstance(endpoints, Endpoints)
    check_server(redis.Redis.from_url(endpoints.redis_url))
    assert not [w for w in recwarn if "appendonly" in str(w.message)]


@pytest.fixture
def evicting(tmp_path: Path) -> Iterator[redis.Redis]:
    yield from redis_server(tmp_path, "--appendonly", "yes", "--maxmemory-policy", "allkeys-lru")


def test_an_eviction_policy_that_can_evict_bookkeeping_is_refused(evicting: redis.Redis) -> None:
    """allkeys-* may evict a stage (a lost batch) or a decision (a batch written twice)."""
    with pytest.raises(ConfigError, match=r"maxmemory-policy allkeys-lru.*noeviction"):
        check_server(evicting)
    check_server(evicting, exactly_once=False)  # at-least-once keeps no bookkeeping
    evicting.config_set("maxmemory-policy", "volatile-lru")  # evicts only keys with a TTL
    check_server(evicting)


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[redis.Redis]:
    # Its primary need not answer: the server is a replica from the moment it starts.
    yield from redis_server(tmp_path, "--replicaof", "127.0.0.1", str(free_port()))


def test_a_replica_is_refused_even_when_writable(replica: redis.Redis) -> None:
    """A writable replica (replica-read-only no) took a batch write that its primary
    never saw, and the write "succeeded"; a read-only one failed every task with a bare
    READONLY. ~0.2 s."""
    for exactly_once in (True, False):
        with pytest.raises(ConfigError, match=r"'url' points at a Redis replica.*primary"):
            check_server(replica, exactly_once)
    replica.config_set("replica-read-only", "no")
    with pytest.raises(ConfigError, match="replica-read-only no"):
        check_server(replica)

"""eos_redis's start checks against real Redis servers configured the ways it must
refuse (Cluster, a replica) or warn about (no AOF), each started here on a free port,
and against the stack's server with an ACL user that lacks what the sink needs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from eos_connectors.core.errors import ConfigError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.stack.process import free_port
from eos_connectors.sinks.redis.format import RedisDataSource, check_server
from eos_connectors.testing import CONTRACT_SCHEMA
from tests.redis_util import redis_server
from tests.upsert_util import ONE_BATCH, upserted, write_one_batch

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


def test_a_server_whose_log_the_os_flushes_gets_a_warning(tmp_path: Path) -> None:
    """appendfsync no: a machine's crash can lose ~30 s of acknowledged writes. ~0.1 s."""
    for server in redis_server(tmp_path, "--appendonly", "yes", "--appendfsync", "no"):
        with pytest.warns(UserWarning, match="appendfsync no"):
            check_server(server)


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


@pytest.fixture
def acl_user(endpoints: Endpoints, unique: str) -> Iterator[tuple[redis.Redis, str, str]]:
    """An ACL user that may run every command on its data keys only: the stack's admin
    client, the user's name and its URL."""
    admin = redis.Redis.from_url(endpoints.redis_url)
    name = f"user-{unique}"
    admin.acl_setuser(
        name, enabled=True, passwords=["+pw"], keys=[f"{unique}:*"], commands=["+@all"]
    )
    try:
        yield admin, name, endpoints.redis_url.replace("redis://", f"redis://{name}:pw@")
    finally:
        admin.acl_deluser(name)
        admin.close()


def test_a_user_without_the_acl_is_told_the_rule_then_writes_exactly_once(
    endpoints: Endpoints, acl_user: tuple[redis.Redis, str, str], unique: str
) -> None:
    """A user that may not touch the sink's bookkeeping keys, or run scripts, was a
    task's bare NOPERM (or a batch staged and never decided). The refusal's rule, given
    as is, is all the user needs: a batch then prepares and commits. ~0.3 s."""
    admin, name, url = acl_user
    options = {"url": url, "keyPrefix": f"{unique}:", "keyColumn": "word", "valueColumns": "n"}
    source = RedisDataSource({**options, "sinkId": unique})
    with pytest.raises(ConfigError, match=r"Redis user of option 'url'.*keys used") as refused:
        source.streamWriter(CONTRACT_SCHEMA, False)
    rule = re.search(r"ACL SETUSER <user> \.\.\.\): (.+?) \(see", str(refused.value))
    assert rule, str(refused.value)
    given = rule[1].split()
    keys = [r.removeprefix("~") for r in given if r.startswith("~")]
    commands = ["-@all", *(r for r in given if not r.startswith("~"))]
    admin.acl_setuser(name, enabled=True, reset_keys=True, keys=keys, commands=commands)
    write_one_batch(source, "acl")
    assert upserted("redis", endpoints, unique) == ONE_BATCH

    admin.acl_setuser(name, enabled=True, commands=["-@scripting"])
    at_least_once = RedisDataSource({**options, "deliveryGuarantee": "at-least-once"})
    with pytest.raises(ConfigError, match=r"no permissions to run the 'script.*\+@scripting"):
        at_least_once.streamWriter(CONTRACT_SCHEMA, False)

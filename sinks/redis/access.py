"""What the sink's Redis user must be allowed (Redis ACLs), checked by the driver at a
query's start, so that a user without it fails there, naming the ACL rule to add, and
never as a task's bare ``NOPERM`` mid-batch.

The sink runs commands of the ``@read``, ``@write``, ``@scripting`` and
``@transaction`` categories and ``INFO``, ``PING`` and ``TIME``, on the keys
``<keyPrefix>*`` and, exactly once, its bookkeeping keys ``<bookkeepingPrefix>:{*``.
``CONFIG GET`` is read when allowed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from eos_connectors.core.errors import ConfigError
from eos_connectors.sinks.redis.options import RedisSinkOptions

#: Reads and deletes each key given: a key no one uses (a fresh uuid under each pattern
#: the sink writes), so that Redis checks the user's read and write permission on it
#: through the scripting commands the sink runs, and changes nothing.
PROBE = """
for _, key in ipairs(KEYS) do
  redis.call('EXISTS', key)
  redis.call('DEL', key)
end
return 0
"""


def probe_keys(options: RedisSinkOptions) -> list[str]:
    """One unused key under each key pattern the sink writes."""
    probe = f"eos-acl-probe-{uuid.uuid4().hex}"
    keys = [options.key_prefix + probe]
    if options.exactly_once:
        keys.append(f"{options.bookkeeping_keys}{probe}}}:probe")
    return keys


def check(client: redis.Redis, options: RedisSinkOptions) -> None:
    """Driver, at start (inside :func:`explained`): the user may run the sink's scripts
    on its keys, in a transaction (``MULTI``/``EXEC``) as tasks stage theirs."""
    script = client.register_script(PROBE)
    with client.pipeline(transaction=True) as pipe:
        script(keys=probe_keys(options), client=pipe)
        pipe.execute()


@contextmanager
def explained(options: RedisSinkOptions) -> Iterator[None]:
    """Driver, at start: Redis's ``NOPERM`` becomes a ConfigError naming option 'url'
    and the ACL rule the sink needs."""
    try:
        yield
    except redis.exceptions.NoPermissionError as exc:
        raise ConfigError(
            f"The Redis user of option 'url' may not do what the sink needs ({exc}). Give it "
            f"(ACL SETUSER <user> ...): {acl_rule(options)} (see docs/redis-sink.md, ACL)."
        ) from exc


def acl_rule(options: RedisSinkOptions) -> str:
    keys = [f"~{options.key_prefix}*"]
    if options.exactly_once:
        keys.append(f"~{options.bookkeeping_keys}*")
    return " ".join(
        [*keys, "+@read", "+@write", "+@scripting", "+@transaction", "+info", "+ping", "+time"]
    )

"""Where the three services listen, as the environment and the stack name them."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from connectors.errors import ConfigError
from connectors.secrets import redact_url

ENV_NAMES = ("EOS_KAFKA_BOOTSTRAP", "EOS_POSTGRES_DSN", "EOS_REDIS_URL")


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str
    postgres_dsn: str
    redis_url: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Endpoints | None:
        """Endpoints named by the environment: None when none is set, an error when some are."""
        env = os.environ if env is None else env
        values = [env.get(name, "") for name in ENV_NAMES]
        if not any(values):
            return None
        missing = [name for name, value in zip(ENV_NAMES, values, strict=True) if not value]
        if missing:
            raise ConfigError(
                f"{', '.join(missing)} not set while the other service variables are: "
                "set all three (see `eos stack env`) or none."
            )
        return cls(*values)

    def as_env(self) -> dict[str, str]:
        values = (self.kafka_bootstrap, self.postgres_dsn, self.redis_url)
        return dict(zip(ENV_NAMES, values, strict=True))

    def exports(self) -> str:
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.as_env().items())

    def describe(self) -> str:
        """A human summary that never shows a password."""
        return (
            f"Kafka      {self.kafka_bootstrap}\n"
            f"PostgreSQL {redact_url(self.postgres_dsn)}\n"
            f"Redis      {redact_url(self.redis_url)}\n"
        )

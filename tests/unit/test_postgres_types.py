"""A Spark type the PostgreSQL sink cannot write: the error names the column, its type
and the types it writes (it pointed at a README table that does not exist). Cost: none."""

from __future__ import annotations

import pytest
from pyspark.sql.types import ArrayType, StringType

from eos_connectors.core.errors import ConfigError
from eos_connectors.sinks.postgres.schema import pg_type


def test_an_unwritable_type_names_the_column_and_what_to_cast_to() -> None:
    with pytest.raises(ConfigError) as refused:
        pg_type("tags", ArrayType(StringType()))
    text = str(refused.value)
    assert "'tags' has Spark type array<string>" in text
    assert "string, long, integer" in text and "timestamp_ntz, binary" in text
    assert "README" not in text and "docs/postgres-sink.md" in text

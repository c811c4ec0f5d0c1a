"""The linked SPARK_HOME: Spark's files, without the zips that made every Python
process Spark starts compile PySpark again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eos_connectors.ops.spark_home import (
    SWITCH,
    installed_spark_home,
    linked_spark_home,
    starting_spark,
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EOS_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("SPARK_HOME", SWITCH, "PYSPARK_PYTHON"):
        monkeypatch.delenv(name, raising=False)


def test_links_everything_but_the_python_zips() -> None:
    installed = installed_spark_home()
    home = linked_spark_home()
    assert home is not None and home != installed
    assert (home / "bin" / "spark-class").resolve() == installed / "bin" / "spark-class"
    assert (home / "jars").resolve() == installed / "jars"
    assert (installed / "python" / "lib" / "pyspark.zip").is_file()
    assert not (home / "python" / "lib").exists()
    assert {p.name for p in (home / "python").iterdir()} == {
        p.name for p in (installed / "python").iterdir() if p.name != "lib"
    }
    assert linked_spark_home() == home  # built once
    assert [p.name for p in home.parent.iterdir()] == [home.name]  # nothing left aside


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SPARK_HOME", "/opt/another-spark"),  # the user's own Spark
        (SWITCH, "0"),
        ("PYSPARK_PYTHON", "/usr/bin/false"),  # workers run another Python
    ],
)
def test_does_not_apply(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    assert linked_spark_home() is None


def test_applies_when_spark_home_is_the_installed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_HOME", str(installed_spark_home()))
    assert linked_spark_home() is not None


def test_set_while_spark_starts_then_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    home = linked_spark_home()
    with starting_spark():
        assert os.environ["SPARK_HOME"] == str(home)
        assert linked_spark_home() == home  # a process started meanwhile uses it too
    assert "SPARK_HOME" not in os.environ
    monkeypatch.setenv(SWITCH, "0")
    with starting_spark():
        assert "SPARK_HOME" not in os.environ

"""The jars a service resolves from Maven are resolved again when its POM changes (a
dependency added for Hadoop 3.4's WebHDFS on Java 17 never reached a machine that had
resolved the old POM). Cost: ~0 s (Maven is replaced by a stand-in)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eos_connectors.dev.stack import kafka


def test_a_changed_pom_is_resolved_again_from_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def maven(command: list[str], **_: Any) -> None:
        libs = Path(next(a for a in command if a.startswith("-DoutputDirectory=")).split("=")[1])
        libs.mkdir(parents=True, exist_ok=True)
        (libs / f"jar-{len(calls)}.jar").touch()
        calls.append((tmp_path / "pom.xml").read_text())

    monkeypatch.setattr(kafka, "run", maven)
    monkeypatch.setattr(kafka, "require_binary", lambda *_: "mvn")
    libs = kafka.maven_jars(tmp_path, "<pom a/>", "x")
    assert kafka.maven_jars(tmp_path, "<pom a/>", "x") == libs and calls == ["<pom a/>"]
    kafka.maven_jars(tmp_path, "<pom b/>", "x")
    assert calls == ["<pom a/>", "<pom b/>"]
    assert [p.name for p in libs.iterdir()] == ["jar-1.jar"], "the old POM's jars stayed"

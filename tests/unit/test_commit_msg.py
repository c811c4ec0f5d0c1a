"""The commit-msg hook (scripts/hooks/commit-msg) takes "area: what changed" in at most 72
characters with a blank second line, and refuses the rest. Cost: under 0.5 s."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / "scripts" / "hooks" / "commit-msg"


def _hook(message: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message)
    return subprocess.run(
        ["bash", str(HOOK), str(path)], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    "message",
    [
        "kafka sink: fence a zombie before its marker check\n\nWhy, with figures.\n",
        "tests: tiers by what a test needs\n",
        "# a comment git strips\nci: start the services while lint runs\n\nbody\n",
    ],
)
def test_a_short_area_subject_passes(message: str, tmp_path: Path) -> None:
    assert _hook(message, tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ("docs: " + "x" * 70 + "\n", "has 76 characters"),
        ("Fixed the thing\n", "area: what changed"),
        ("ci: faster\nno blank line\n", "second line blank"),
    ],
)
def test_a_long_or_shapeless_subject_is_refused(message: str, said: str, tmp_path: Path) -> None:
    done = _hook(message, tmp_path)
    assert done.returncode == 1 and said in done.stderr, done.stderr

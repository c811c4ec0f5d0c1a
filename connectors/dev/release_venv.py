"""A virtualenv that runs this checkout on another PySpark release, cheaply (CI's second release).

The ``.venv`` holds the lowest supported release (the dev group's pin), on which CI runs
every test. The highest runs from here: the conformance reference cell in CI
(tests/system/test_spark_range.py), parity with Spark's JVM connector and the benchmark
(``make bench``: its targets are the highest release's). ``python -m
eos_connectors.dev.release_venv [RELEASE]`` makes the virtualenv (the highest by default)
and prints its python.

``make spark-matrix`` builds full virtualenvs from the wheel, as a user would. CI needs
only a second release beside the one its ``.venv`` has, so this one holds just that
PySpark (no dependencies: the ``.venv``'s serve, through a ``.pth`` line that adds its
site-packages after the new one's), about 25 s of download and unpacking instead of a
full install. The package is the checkout's own (the ``.venv``'s editable install).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pyspark

from eos_connectors.ops.cache import building

#: The lowest and the highest release of the supported range (pyproject.toml).
LOWEST = "4.0.5"
HIGHEST = "4.3.0"


#: Where the checkout keeps them (git ignores it); run from the checkout's root.
VENVS = Path(".venvs")


def other_end() -> str:
    """The end of the supported range this process does not run."""
    return LOWEST if pyspark.__version__ == HIGHEST else HIGHEST


def python_of(release: str, root: Path = VENVS) -> str:
    """A python that runs ``release``: this one when it does, else its virtualenv's."""
    if pyspark.__version__ == release:
        return sys.executable
    return str(release_venv(release, root.resolve()))


def runs_on(python: str) -> dict[str, str]:
    """The environment a Spark application started from ``python`` needs besides its own:
    every Python process Spark starts is that python, the driver-side ones too (a process
    that started a Spark session before has ``PYSPARK_DRIVER_PYTHON`` set to its own, and
    a 4.3 JVM waited for ever on a 4.0 planner process)."""
    return {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python}


def release_venv(release: str, root: Path) -> Path:
    """``root``/spark-``release``'s python, made when missing; its PySpark is ``release``."""
    venv = root / f"spark-{release}"
    python = venv / "bin" / "python"
    root.mkdir(parents=True, exist_ok=True)
    # One build at a time: a test that needs it waits for the prefetch's (two pip installs
    # into one directory left a release whose Spark never started).
    with building(root / f"spark-{release}.lock"):
        if not _runs(python, release):
            _build(venv, python, release)
            if not _runs(python, release):
                raise RuntimeError(f"{venv}: PySpark {release} does not import")
    return python


def _build(venv: Path, python: Path, release: str) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(_purelib(python))
    site.mkdir(parents=True, exist_ok=True)
    ours = sysconfig.get_paths()["purelib"]
    (site / "eos-base.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--upgrade",  # over what a build cut short left
            "--target",
            str(site),
            f"pyspark=={release}",
        ],
        check=True,
    )


def _purelib(python: Path) -> str:
    run = [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    return subprocess.run(run, check=True, capture_output=True, text=True).stdout.strip()


def _runs(python: Path, release: str) -> bool:
    if not python.exists():
        return False
    run = [str(python), "-c", "import pyspark, eos_connectors; print(pyspark.__version__)"]
    done = subprocess.run(run, capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == release


def main(argv: list[str]) -> int:
    release = argv[0] if argv else HIGHEST
    print(python_of(release))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""A virtualenv that runs this checkout on another PySpark release, cheaply (CI's second release).

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

#: The lowest and the highest release of the supported range (pyproject.toml).
LOWEST = "4.0.5"
HIGHEST = "4.3.0"


def release_venv(release: str, root: Path) -> Path:
    """``root``/spark-``release``'s python, made when missing; its PySpark is ``release``."""
    venv = root / f"spark-{release}"
    python = venv / "bin" / "python"
    if not _runs(python, release):
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
                "--target",
                str(site),
                f"pyspark=={release}",
            ],
            check=True,
        )
    if not _runs(python, release):
        raise RuntimeError(f"{venv}: PySpark {release} does not import")
    return python


def _purelib(python: Path) -> str:
    run = [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    return subprocess.run(run, check=True, capture_output=True, text=True).stdout.strip()


def _runs(python: Path, release: str) -> bool:
    if not python.exists():
        return False
    run = [str(python), "-c", "import pyspark, eos_connectors; print(pyspark.__version__)"]
    done = subprocess.run(run, capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == release

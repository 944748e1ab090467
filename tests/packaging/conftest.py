"""The built distributions, made offline from a copy of the repository.

The build runs without isolation (``python -m build --no-isolation``: this
environment's setuptools, no download) on a copy of the repository's files, so
that it writes nothing into the working tree and parallel test workers do not
share a build directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What the build ignores of a working tree: venvs, caches, outputs.
IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv*",
    ".flwr-home",
    ".flwr-deploy",
    "outputs",
    "work",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
)


def run_checked(
    command: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run ``command``; its output, or an assertion error quoting the output."""
    completed = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"{' '.join(map(str, command))}\n{output[-4000:]}"
    return output


@dataclass(frozen=True)
class Distributions:
    """The sdist and the wheel built from it."""

    sdist: Path
    wheel: Path


def build(outdir: Path, source_copy: Path, *only: str) -> list[Path]:
    """Build the repository's distributions into ``outdir``; return their paths.

    ``only`` restricts the build (``"--wheel"``); without it ``build`` makes
    the sdist, then the wheel from the unpacked sdist.
    """
    shutil.copytree(ROOT, source_copy, ignore=IGNORED)
    run_checked(
        [
            *(sys.executable, "-m", "build", "--no-isolation", *only),
            *("--outdir", outdir, source_copy),
        ]
    )
    return sorted(outdir.iterdir())


@pytest.fixture(scope="session")
def distributions(tmp_path_factory: pytest.TempPathFactory) -> Distributions:
    """The sdist and wheel that ``python -m build`` makes."""
    work = tmp_path_factory.mktemp("build")
    built = build(work / "dist", work / "source")
    (sdist,) = (path for path in built if path.name.endswith(".tar.gz"))
    (wheel,) = (path for path in built if path.suffix == ".whl")
    return Distributions(sdist=sdist, wheel=wheel)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel alone, built straight from the repository's files."""
    work = tmp_path_factory.mktemp("wheel")
    (built,) = build(work / "dist", work / "source", "--wheel")
    return built

"""docs/deployment.md's note on several runs of one app at once.

Flower installs a run's app (its FAB) in every ServerApp and ClientApp
process with ``flwr.cli.install.install_from_fab``: it creates the app's
folder under ``$FLWR_HOME/apps/``, then copies the files into it, and an
install that finds the folder returns it as installed. Here two installs of
one FAB run in threads, the first held at its first file copy: the second
returns the folder without its ``pyproject.toml``, and loading it fails with
the error the page quotes; once the first has finished, a third finds the app
complete.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from flwr.cli import install
from flwr.cli.build import build_fab_from_disk
from flwr.common.config import get_project_config

# Flower's `flwr build` reads .gitignore-style patterns through pathspec's
# deprecated pattern class, once per file.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:pathspec")

DOCS = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
#: Seconds a thread may wait for the other.
WAIT_SECONDS = 30

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "racyapp"
version = "1.0.0"

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "tests"

[tool.flwr.app.components]
serverapp = "racyapp:server"
clientapp = "racyapp:client"
"""


def small_app(folder: Path) -> Path:
    """A Flower app folder that ``flwr build`` accepts."""
    folder.mkdir()
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (folder / "racyapp.py").write_text("server = client = None\n")
    return folder


def test_an_install_during_another_returns_the_app_without_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fab = build_fab_from_disk(small_app(tmp_path / "app"))
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    first_copies = threading.Event()
    second_checked = threading.Event()
    copy_file = shutil.copy2

    def held_copy(source: Any, destination: Any, **options: Any) -> Any:
        """The first install's file copy, once the second's app has been read."""
        if threading.current_thread().name == "first":
            first_copies.set()
            assert second_checked.wait(WAIT_SECONDS)
        return copy_file(source, destination, **options)

    monkeypatch.setattr(install.shutil, "copy2", held_copy)
    installed: dict[str, Path] = {}

    def install_as(name: str) -> None:
        installed[name] = install.install_from_fab(fab, skip_prompt=True)

    first = threading.Thread(target=install_as, args=("first",), name="first")
    first.start()
    assert first_copies.wait(WAIT_SECONDS)
    install_as("second")
    try:
        with pytest.raises(FileNotFoundError, match=r"Cannot find pyproject\.toml in"):
            get_project_config(installed["second"])
    finally:
        second_checked.set()
    first.join(WAIT_SECONDS)
    assert not first.is_alive()

    install_as("third")
    assert installed["first"] == installed["second"] == installed["third"]
    assert get_project_config(installed["third"])["project"]["name"] == "racyapp"


def test_the_page_states_the_race_and_its_remedy() -> None:
    text = " ".join(DOCS.read_text().split())
    assert "Cannot find pyproject.toml in <FLWR_HOME>/apps/<app>" in text
    assert "Submit such a run again" in text
    assert "tests/docs/test_deployment.py" in text

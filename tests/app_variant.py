"""A copy of the Flower App with some components swapped for test-only ones.

Test apps (a ServerApp that records what it receives, a load app running every
strategy in turn) live under ``tests/``; ``flwr run`` needs them inside an app
folder whose ``pyproject.toml`` names them, so they get a copy of the app.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
STOCK_COMPONENTS = {
    "serverapp": "simulations.server_app:app",
    "clientapp": "simulations.client_app:app",
}


def app_variant(
    destination: Path, test_module: Path, components: Mapping[str, str]
) -> Path:
    """Copy the app into ``destination`` with ``test_module`` and ``components``.

    Parameters
    ----------
    destination : Path
        The new app folder.
    test_module : Path
        A module under ``tests/`` the new components live in; it is copied with
        its package ``__init__`` files and packaged into the FAB.
    components : mapping
        ``"serverapp"``/``"clientapp"`` -> ``"module:attribute"``.
    """
    for package in ("flwr_importance", "simulations"):
        shutil.copytree(
            REPO_ROOT / package,
            destination / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    relative = test_module.resolve().relative_to(REPO_ROOT)
    (destination / relative.parent).mkdir(parents=True, exist_ok=True)
    for folder in reversed(relative.parents[:-1]):
        shutil.copy(REPO_ROOT / folder / "__init__.py", destination / folder)
    shutil.copy(REPO_ROOT / relative, destination / relative)
    # Test apps may import this module: the copy needs it too.
    shutil.copy(Path(__file__), destination / "tests")
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    replacements = {
        f'{name} = "{STOCK_COMPONENTS[name]}"': f'{name} = "{component}"'
        for name, component in components.items()
    }
    replacements['"simulations/**/*.py"]'] = '"simulations/**/*.py", "tests/**/*.py"]'
    for stock, replacement in replacements.items():
        if stock not in pyproject:
            raise RuntimeError(f"pyproject.toml no longer holds {stock!r}")
        pyproject = pyproject.replace(stock, replacement)
    (destination / "pyproject.toml").write_text(pyproject)
    return destination

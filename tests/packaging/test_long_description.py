"""The distribution's long description: the README with links that work off it.

The package index renders the long description away from the repository, where
the README's relative links (``docs/methods.md``) lead nowhere; ``setup.py``
points them at the repository that ``pyproject.toml`` names.
"""

from __future__ import annotations

import doctest
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def load_setup_script() -> ModuleType:
    """``setup.py`` as a module, without running ``setup()``."""
    spec = importlib.util.spec_from_file_location("setup_script", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_script_doctests_pass() -> None:
    failures, tried = doctest.testmod(load_setup_script())
    assert (failures, tried > 0) == (0, True)


def test_long_description_links_are_absolute_and_name_the_repository() -> None:
    setup_script = load_setup_script()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    repository = project["project"]["urls"]["Repository"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    description = setup_script.long_description(ROOT)

    targets = re.findall(r"\]\(([^)\s]+)\)", description)
    relative_in_readme = [
        target
        for target in re.findall(r"\]\(([^)\s]+)\)", readme)
        if not re.match(r"[a-z]+:|#", target)
    ]
    assert relative_in_readme, "the README links to repository files"
    assert all(re.match(r"https?://|#", target) for target in targets)
    for target in relative_in_readme:
        assert f"]({repository}/blob/main/{target})" in description
        # Each link names a file of the repository, so the absolute one works
        # once the repository is published.
        assert (ROOT / target.split("#")[0]).exists(), target


def test_every_project_url_is_in_the_repository() -> None:
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"
    ]["urls"]
    repository = urls["Repository"]
    for url in urls.values():
        assert url.startswith(repository)
        path = url.removeprefix(repository).removeprefix("/blob/main/")
        if path and not path.startswith("/"):
            assert (ROOT / path).is_file(), url

"""``python -m build`` makes a complete distribution.

The wheel carries the license and ``py.typed``; the sdist carries the tests
and everything they read, rebuilds the wheel (``build`` makes the wheel from
the unpacked sdist) and runs the fast tests from where it is unpacked; both
pass ``twine check --strict``.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.packaging.conftest import Distributions, run_checked

#: What the sdist's tests read besides the package (tests/, docs/, ...).
SDIST_TREE = [
    "LICENSE",
    "README.md",
    "CHANGELOG.md",
    "CONTRIBUTING.md",
    "pyproject.toml",
    "setup.py",
    "constraints.txt",
    "constraints-flwr1.42.txt",
    "tests/conftest.py",
    "tests/packaging/test_distribution.py",
    "docs/methods.md",
    "examples/quickstart-pytorch/pyproject.toml",
    "simulations/server_app.py",
    "benchmarks/report.py",
    "scripts/docs_snippets.py",
    "flwr_importance/py.typed",
]

#: A fast subset that reads the docs, examples, presets and benchmarks: the
#: doctests, the registry against every layer, the generated docs.
SDIST_TESTS = [
    "flwr_importance",
    "tests/test_doctests.py",
    "tests/test_registry.py",
    "tests/docs/test_snippets.py",
    "tests/packaging/test_long_description.py",
    "tests/packaging/test_static_names.py",
]


@pytest.mark.slow
def test_wheel_holds_the_license_and_py_typed(distributions: Distributions) -> None:
    names = zipfile.ZipFile(distributions.wheel).namelist()
    assert "flwr_importance/py.typed" in names
    (license_file,) = (name for name in names if name.endswith("licenses/LICENSE"))
    text = zipfile.ZipFile(distributions.wheel).read(license_file).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert not any(name.startswith(("tests/", "simulations/")) for name in names)


@pytest.mark.slow
def test_twine_check_strict_passes(distributions: Distributions) -> None:
    run_checked(
        [
            *(sys.executable, "-m", "twine", "check", "--strict"),
            *(distributions.sdist, distributions.wheel),
        ]
    )


@pytest.mark.slow
def test_sdist_holds_the_tests_and_runs_them(
    distributions: Distributions, tmp_path: Path
) -> None:
    with tarfile.open(distributions.sdist) as sdist:
        sdist.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    missing = [name for name in SDIST_TREE if not (unpacked / name).is_file()]
    assert missing == []
    assert not list(unpacked.rglob("__pycache__"))
    # A test of the unpacked tree's own: the package it imports is the sdist's,
    # not this checkout's editable install.
    (unpacked / "tests" / "test_imports_the_sdist.py").write_text(
        "from pathlib import Path\n"
        "import flwr_importance\n"
        "def test_package_is_the_sdists():\n"
        "    root = Path(__file__).resolve().parents[1]\n"
        "    assert Path(flwr_importance.__file__).resolve().is_relative_to(root)\n",
        encoding="utf-8",
    )
    output = run_checked(
        [
            *(sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "not slow"),
            *("-p", "no:cacheprovider", *SDIST_TESTS),
            "tests/test_imports_the_sdist.py",
        ],
        cwd=unpacked,
    )
    assert " passed" in output and "failed" not in output

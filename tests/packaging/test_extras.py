"""Each extra, installed alone from the built wheel, gives what the README says.

A fresh venv per extra, installed offline (``--no-index``) from the wheelhouse
``scripts/setup-env.sh`` downloads into ``.venv/wheelhouse`` (the pinned wheels
of every dependency), without the machine's pip configuration; then, from a
directory outside the repository, the imports the README's Install section
promises for that extra, and the absence of what only a larger extra brings
(so that a dependency installed by accident cannot hide a missing one). The
base install also runs the maths' tests with the test runner alone, so that
they cannot come to need torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.packaging.conftest import ROOT, run_checked

#: setup-env.sh's wheelhouse in the venv running the tests.
WHEELHOUSE = Path(sys.prefix) / "wheelhouse"

#: Imports every module of the named subpackages, as installed.
IMPORT_ALL = """
import importlib, pkgutil, sys
for package_name in sys.argv[1:]:
    package = importlib.import_module(package_name)
    for module in pkgutil.walk_packages(
        getattr(package, "__path__", []), package_name + "."
    ):
        importlib.import_module(module.name)
"""

#: Per extra: the subpackages whose every module imports, a check that runs,
#: and the distributions it must not install.
PROMISES: dict[str, tuple[list[str], str, list[str]]] = {
    # The strategies, the legacy API's server side, the maths: no ML framework.
    "": (
        [
            "flwr_importance.strategies",
            "flwr_importance.sampling",
            "flwr_importance.aggregation",
            "flwr_importance.protocol",
            "flwr_importance.registry",
            "flwr_importance.legacy_wire",
            "flwr_importance.compat.adapter",
            "flwr_importance.clientapps.numpy_client",
        ],
        "from flwr_importance.compat import MDSampling;"
        "from flwr_importance.strategies import OptimalClientSampling;"
        "OptimalClientSampling(clients_per_round=2); MDSampling(clients_per_round=2)",
        ["torch", "dp-accounting", "scikit-learn", "matplotlib", "ray"],
    ),
    # Every client helper and ready-made handler, models and local training.
    "torch": (
        ["flwr_importance.clientapps", "flwr_importance.tasks"],
        "from flwr_importance.compat import HandlerClient, handler_client_fn",
        ["dp-accounting", "scikit-learn", "matplotlib", "ray", "flwr-datasets"],
    ),
    # Central DP's accounting.
    "dp": (
        ["flwr_importance.strategies.wrappers"],
        "from flwr_importance.strategies import OptimalClientSampling;"
        "from flwr_importance.strategies.wrappers import CentralDP;"
        "import dp_accounting",
        ["torch", "scikit-learn", "matplotlib", "ray"],
    ),
    # A clone's simulation app and benchmarks: the data sets, the launcher,
    # the plots, Flower's simulation engine.
    "sim": (
        ["flwr_importance"],
        "import flwr.simulation, ray, matplotlib.figure;"
        "from flwr_importance.tasks import load_dataset;"
        "assert len(load_dataset('digits', 3).partitions) == 3",
        ["dp-accounting"],
    ),
}


#: The tests of the maths (:mod:`flwr_importance.sampling`), which the base
#: install runs with the test runner alone: no torch.
TORCH_FREE_TESTS = ["tests/sampling"]
#: The test runner, the plugin the repository's pytest settings name, and what
#: the shared test modules import.
TEST_RUNNER = ["pytest", "pytest-timeout", "hypothesis", "filelock"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", list(PROMISES))
def test_extra_alone_gives_what_the_readme_says(
    extra: str, wheel: Path, tmp_path: Path
) -> None:
    assert WHEELHOUSE.is_dir(), f"{WHEELHOUSE} is missing: run scripts/setup-env.sh"
    subpackages, check, absent = PROMISES[extra]
    venv = tmp_path / "venv"
    run_checked([sys.executable, "-m", "venv", venv])
    python = venv / "bin" / "python"
    requirement = f"{wheel}[{extra}]" if extra else str(wheel)
    # Nothing of the test's own environment: no pip configuration (indexes,
    # find-links, constraints) and no PYTHONPATH.
    offline = {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1", "PYTHONPATH": ""}
    run_checked(
        [
            *(python, "-m", "pip", "install", "--no-index", "--no-compile"),
            *("--quiet", "--find-links", WHEELHOUSE, requirement),
        ],
        env=offline,
    )
    run_checked([python, "-m", "pip", "check"], env=offline)
    installed = run_checked(
        [python, "-m", "pip", "list", "--format=freeze"], env=offline
    ).lower()
    for name in absent:
        assert f"\n{name}==" not in f"\n{installed}", f"{extra or 'base'}: {name}"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run_checked([python, "-c", IMPORT_ALL, *subpackages], cwd=outside, env=offline)
    run_checked([python, "-c", check], cwd=outside, env=offline)
    if not extra:
        install = [python, "-m", "pip", "install", "--no-index", "--quiet"]
        run_checked([*install, "--find-links", WHEELHOUSE, *TEST_RUNNER], env=offline)
        run_checked(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TORCH_FREE_TESTS],
            cwd=ROOT,
            env=offline,
        )

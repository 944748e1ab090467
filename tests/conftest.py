"""Fixtures shared across the test suite."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import settings

from flwr_importance.tooling.launcher import flwr_run, processes_mentioning
from tests.heavy import heavy_run_slot

# Every property test draws the same examples on every run, CI's included: a
# failure reproduces, and a pass does not depend on the draw.
settings.register_profile("derandomized", derandomize=True)
settings.load_profile("derandomized")

APP_DIR = Path(__file__).resolve().parent.parent

# --doctest-modules imports every module it collects; the apps and helpers
# here hold no doctests and import only as parts of their apps and tests.
collect_ignore = [
    str(path.relative_to(Path(__file__).parent))
    for path in Path(__file__).parent.rglob("*.py")
    if not path.name.startswith(("test_", "conftest", "__init__"))
]

FlwrSimulation = Callable[..., list[dict[str, float]]]


@pytest.fixture
def flwr_simulation(tmp_path: Path) -> FlwrSimulation:
    """Run the simulation app through a real ``flwr run``; return its history.

    The returned function takes run-config overrides and the number of virtual
    SuperNodes, checks that the run succeeded, wrote its history and plot, and
    left no process running, and returns the ``history.json`` rows; the run's
    output is kept in ``flwr-run.log`` of the test's ``tmp_path``.
    """

    def run(
        run_config: Mapping[str, bool | int | float | str],
        num_supernodes: int,
        timeout: float = 400,
    ) -> list[dict[str, float]]:
        output_dir = tmp_path / "out"
        flwr_home = tmp_path / "flwr-home"
        completed = flwr_run(
            APP_DIR,
            num_supernodes=num_supernodes,
            run_config={**run_config, "output-dir": str(output_dir)},
            flwr_home=flwr_home,
            capture=True,
            timeout=timeout,
        )
        (tmp_path / "flwr-run.log").write_text(completed.stdout + completed.stderr)
        log = completed.stdout[-4000:] + completed.stderr[-4000:]
        assert completed.returncode == 0, log
        assert processes_mentioning(str(flwr_home.resolve())) == []
        assert (output_dir / "convergence.png").stat().st_size > 0
        rows: list[dict[str, float]] = json.loads(
            (output_dir / "history.json").read_text()
        )
        return rows

    return run


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread() -> Iterator[None]:
    """Run torch on one thread in tests.

    The models are tiny: extra intra-op threads only oversubscribe the two
    cores and make each small op many times slower. The library never sets
    this; the tests do, and restore it afterwards. Without torch installed
    (the maths' tests run on the base install) there is nothing to set.
    """
    try:
        import torch
    except ImportError:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def heavy_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run the test while no other heavy run does (:mod:`tests.heavy`)."""
    with heavy_run_slot(tmp_path_factory):
        yield


def is_heavy(item: pytest.Item) -> bool:
    """The test takes a heavy-run slot, by the fixture or in its module."""
    module = getattr(item, "module", None)
    return "heavy_run" in getattr(item, "fixturenames", ()) or (
        getattr(module, "heavy_run_slot", None) is heavy_run_slot
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the heavy runs ``heavy``; time their test body only.

    ``scripts/test.sh`` gives the heavy runs, which take turns anyway, a
    pytest of their own beside the rest of the suite.

    Waiting behind two or three other heavy runs on a loaded machine took
    longer than a test's whole limit (a deployment fixture timed out after
    1,200 s holding no slot yet): the limit is the body's
    (``func_only``, pytest-timeout), with the same number of seconds.
    """
    for item in items:
        if not is_heavy(item):
            continue
        item.add_marker(pytest.mark.heavy)
        if "heavy_run" not in getattr(item, "fixturenames", ()):
            continue
        marker = item.get_closest_marker("timeout")
        seconds = float(
            marker.args[0] if marker and marker.args else item.config.getini("timeout")
        )
        body_only = pytest.mark.timeout(seconds, func_only=True)
        item.add_marker(body_only, append=False)

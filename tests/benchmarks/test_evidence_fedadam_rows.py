"""The FedAdam rows of the OCS and clustered-sampling claims.

Each is a comparison inside its claim (the claim's main row unchanged): the
method and its own baseline, both under the same FedAdam server step.
"""

from __future__ import annotations

import pytest

from benchmarks import clustered, variance_reduced
from benchmarks.evidence import Comparison, PaperComparison


def fedadam_row(description: PaperComparison) -> Comparison:
    """The claim's one FedAdam comparison."""
    (row,) = (item for item in description.comparisons if "FedAdam" in item.name)
    return row


def claims(full: bool) -> dict[str, tuple[PaperComparison, str, str, str]]:
    """Claim -> (description, baseline, method, main row's comparison)."""
    single = variance_reduced.descriptions(full)[0]
    one_class = clustered.descriptions(full)[0]
    return {
        "ocs": (single, "uniform", "ocs", "OCS, same local step"),
        "clustered": (
            one_class,
            clustered.BASELINE,
            clustered.MAIN_METHOD,
            "one class per client, same step",
        ),
    }


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("claim", ["ocs", "clustered"])
def test_the_fedadam_row_compares_the_method_with_its_baseline(
    claim: str, full: bool
) -> None:
    description, baseline, method, main = claims(full)[claim]
    row = fedadam_row(description)
    assert row.baseline == baseline and row.claimed == (method,)
    assert set(row.methods) == {baseline, method}
    # The claim's main row is the plain-step one, as before.
    assert description.main_row == (main, method)
    plain = description.comparisons[0]
    for name, overrides in row.methods.items():
        assert overrides == plain.methods[name]
        assert not any(key.startswith("server-optimizer") for key in overrides)
    # Same setting as the plain row, plus one shared FedAdam step.
    assert dict(row.shared) == {**plain.shared, **variance_reduced.FEDADAM}
    assert row.shared["server-optimizer"] == "adam"


@pytest.mark.parametrize("claim", ["ocs", "clustered"])
def test_only_full_mode_tunes_the_server_learning_rate(claim: str) -> None:
    quick, full = (claims(mode)[claim][0] for mode in (False, True))
    assert not fedadam_row(quick).tuned and fedadam_row(full).tuned
    for description in (quick, full):
        assert description.learning_rate_key == "server-optimizer-eta"
        assert description.learning_rates == variance_reduced.FEDADAM_ETAS
        # No other comparison of the claim is tuned: the grid is the row's.
        assert [item.tuned for item in description.comparisons].count(True) <= 1
    eta = variance_reduced.FEDADAM["server-optimizer-eta"]
    assert f"`server-optimizer-eta` {eta:g}" in fedadam_row(quick).note

"""The SecAgg+ benchmark on a tiny federation: its rows, its table, the masking.

Timings are not checked (they are the benchmark's output); what is checked is
that each row pairs the same setting plain and under SecAgg+, and that the
secure runs really ran SecAgg+: masked vectors and not one array in the clear
reached the server. About 10 s.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from benchmarks.report import TIMING_BENCHMARKS, discover_benchmarks, section_title
from benchmarks.secure_aggregation import (
    FULL_REPETITIONS,
    METHODS,
    MODELS,
    NODE_COUNTS,
    QUICK_REPETITIONS,
    TITLE,
    RoundClock,
    Setting,
    measure,
    overhead_table,
    row,
    summary_text,
)

#: Enough nodes for AOCS's two participants a round, few enough to be quick.
NUM_NODES = 6
ROUNDS = 2


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    """Both methods on the small model, one plain and one secure run each."""
    settings = [Setting(method, "logreg", NUM_NODES) for method in METHODS]
    records = measure(settings, repetitions=1, rounds=ROUNDS)
    return [row(setting, records[setting]) for setting in settings]


def test_each_row_pairs_one_setting_plain_and_secure(
    rows: list[dict[str, Any]],
) -> None:
    assert [item["method"] for item in rows] == list(METHODS)
    for item in rows:
        assert item["num_nodes"] == NUM_NODES
        assert item["repetitions"] == 1
        assert item["plain_seconds_per_round"] > 0
        assert item["secure_seconds_per_round"] > 0
        assert math.isclose(
            item["ratio"],
            item["secure_seconds_per_round"] / item["plain_seconds_per_round"],
        )
        assert item["paired_ratio_range"] == [item["ratio"], item["ratio"]]
        assert item["cpu_ratio"] > 0


def test_the_secure_runs_masked_and_the_plain_runs_did_not(
    rows: list[dict[str, Any]],
) -> None:
    """SecAgg+'s replies carry masked vectors and no array in the clear."""
    for item in rows:
        assert item["secure_plaintext_replies"] == 0
        assert item["secure_masked_replies"] > 0
        assert item["plain_plaintext_replies"] > 0
        assert item["plain_masked_replies"] == 0
        # Four SecAgg+ stages per secure sum, against one round trip.
        assert item["secure_messages_per_round"] > item["plain_messages_per_round"]
    fedsampling = rows[METHODS.index("fedsampling")]
    # Every FedSampling node joins the one secure sum of each round.
    assert fedsampling["secure_masked_replies"] == NUM_NODES * ROUNDS


def test_the_table_has_a_line_per_row_and_the_summary_states_the_setting(
    rows: list[dict[str, Any]],
) -> None:
    lines = overhead_table(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    assert {line.count("|") for line in lines} == {12}
    text = summary_text(rows, timed_rounds=ROUNDS - 1, parameters={"logreg": 650})
    assert overhead_table(rows) in text
    assert "num_shares = 3, reconstruction_threshold = 2" in text
    assert "Not included: network latency" in text


def test_a_run_time_is_the_mean_of_its_rounds_after_the_warm_up() -> None:
    clock = RoundClock()
    clock.wall = [0.0, 1.0, 3.0, 6.0]
    clock.cpu = [0.0, 1.0, 2.0, 3.0]
    assert clock.seconds_per_round(1) == 2.5
    assert clock.seconds_per_round(1, cpu=True) == 1.0


def test_every_model_runs_at_every_node_count_in_both_modes() -> None:
    settings = set(itertools.product(MODELS, NODE_COUNTS))
    assert set(QUICK_REPETITIONS) == set(FULL_REPETITIONS) == settings


def test_the_report_runs_it_with_the_timings() -> None:
    assert "secure_aggregation" in discover_benchmarks()
    assert "secure_aggregation" in TIMING_BENCHMARKS
    assert section_title("secure_aggregation") == TITLE

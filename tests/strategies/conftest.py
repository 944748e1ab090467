"""Prints how many hypothesis cases the bad-input tests tried."""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Sum the ``record_property`` counts of the bad-input tests (xdist too)."""
    totals: Counter[str] = Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name in ("hypothesis_cases", "spoiled_replies"):
                    totals[name] += int(value)
    if totals:
        terminalreporter.write_line(
            f"bad input: {totals['hypothesis_cases']} hypothesis cases tried, "
            f"{totals['spoiled_replies']} with a spoiled reply"
        )

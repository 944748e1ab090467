"""The Power-of-Choice benchmark's description follows the evidence rules."""

from __future__ import annotations

from benchmarks.evidence import MIN_REPORTED_SEEDS, MIN_REPORTED_SEEDS_FULL
from benchmarks.power_of_choice import description


def test_quick_and_full_comparisons_share_seeds_and_claim_every_variant() -> None:
    for full, minimum in ((False, MIN_REPORTED_SEEDS), (True, MIN_REPORTED_SEEDS_FULL)):
        paper = description(full)
        assert len(paper.reported_seeds) >= minimum
        assert not set(paper.tuning_seeds) & set(paper.reported_seeds)
        baselines = [comparison.baseline for comparison in paper.comparisons]
        assert baselines[:2] == ["uniform", "md"]
        for comparison in paper.comparisons:
            assert comparison.methods[comparison.baseline]["strategy"] in {
                "fedavg",
                "md",
                "power-of-choice",
            }
            claimed = set(comparison.claimed)
            assert {"pow-d (d = 6)", "rpow-d (d = 6)"} <= claimed
            assert all(
                comparison.methods[name]["strategy"] == "power-of-choice"
                for name in claimed
            )
    assert "d = m, no ranking (biased)" in [
        c.baseline for c in description(True).comparisons
    ]

"""Which strategy-vs-baseline pair ``make run`` shows: the candidates, measured.

``make run`` compares one library strategy with its uniform baseline through
two real ``flwr run``s on one seed, on the default experiment's 30 SuperNodes.
The pair it runs should show its effect at that size. This script measures
the candidates in process (``simulations.inprocess.run_inprocess``: the real
strategies and ClientApps on the in-process grid) through
:mod:`benchmarks.evidence` (same seeds for both methods, target fixed on
tuning seeds as 90% of the baseline's final median accuracy, ratios of median
rounds to target with paired bootstrap 95% intervals):

- clustered sampling (Algorithm 2, arccos) against MD sampling, one class per
  client, logistic regression, 30 rounds: ``simulations/presets/main.toml``;
- the same pair on the default experiment (two classes per client, MLP, 15
  rounds);
- OCS against FedAvg (uniform), log-normal client sizes (sigma 1.8),
  logistic regression, 15 rounds.

The pair ``make run`` shows is the one this measurement recommends, by
:data:`RULE` (:func:`recommended_pair`); the report prints the rule and the
pair it picked beside the tables.

Usage: ``python -m benchmarks.main_pair [--output-dir DIR]`` (a few minutes
on 2 cores).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from benchmarks.evidence import (
    ClaimRow,
    Comparison,
    Overrides,
    PaperComparison,
    RunFunction,
    SeedRun,
    TargetRule,
    run_comparisons,
    write_outputs,
)
from benchmarks.harness import benchmark_parser, start_benchmark
from simulations.inprocess import load_preset, run_inprocess

#: The main job's preset without its ``strategy`` (each method sets its own).
MAIN_PRESET = {
    key: value for key, value in load_preset("main").items() if key != "strategy"
}
#: Targets come from these seeds, numbers from the reported ones.
TUNING_SEEDS = (100, 101)
REPORTED_SEEDS = tuple(range(8))
TARGET = TargetRule(fraction=0.9)


def run_function(output_dir: Path) -> RunFunction:
    """``(overrides, seed) -> SeedRun``: the test accuracy per round."""

    def run(overrides: Overrides, seed: int) -> SeedRun:
        rows, _ = run_inprocess(
            {**overrides, "seed": seed, "output-dir": str(output_dir / "runs")}
        )
        return SeedRun(curve=[row["accuracy"] for row in rows])

    return run


def descriptions() -> tuple[PaperComparison, PaperComparison]:
    """The candidates: clustered vs MD in two settings, OCS vs FedAvg."""
    clustered = {"md": {"strategy": "md"}, "clustered": {"strategy": "clustered"}}
    return (
        PaperComparison(
            title="Clustered sampling (Algorithm 2) vs MD sampling, 30 nodes",
            paper="Fraboni et al. (ICML 2021), Clustered sampling",
            claim="clustered sampling reaches a target accuracy in fewer rounds "
            "than MD sampling",
            direction="below",
            metric="test accuracy",
            higher_is_better=True,
            target=TARGET,
            tuning_seeds=TUNING_SEEDS,
            reported_seeds=REPORTED_SEEDS,
            data="scikit-learn's digits on 30 clients, 10 drawn per round",
            comparisons=(
                Comparison(
                    name="one class per client (main preset)",
                    methods=clustered,
                    baseline="md",
                    claimed=("clustered",),
                    shared=MAIN_PRESET,
                    note="logistic regression, 30 rounds: "
                    "simulations/presets/main.toml",
                ),
                Comparison(
                    name="two classes per client (default experiment)",
                    methods=clustered,
                    baseline="md",
                    claimed=("clustered",),
                    note="the default [tool.flwr.app.config]: MLP, 15 rounds",
                ),
            ),
        ),
        PaperComparison(
            title="OCS vs uniform sampling (FedAvg), 30 nodes",
            paper="Chen, Horváth, Richtárik (TMLR 2022), Optimal client sampling",
            claim="OCS reaches a target accuracy in fewer rounds than uniform sampling",
            direction="below",
            metric="test accuracy",
            higher_is_better=True,
            target=TARGET,
            tuning_seeds=TUNING_SEEDS,
            reported_seeds=REPORTED_SEEDS,
            data="scikit-learn's digits on 30 clients with log-normal sizes "
            "(sigma 1.8), 10 expected per round",
            comparisons=(
                Comparison(
                    name="log-normal sizes",
                    methods={
                        "fedavg": {"strategy": "fedavg"},
                        "ocs": {"strategy": "ocs"},
                    },
                    baseline="fedavg",
                    claimed=("ocs",),
                    shared={
                        "partitioning": "lognormal",
                        "lognormal-sigma": 1.8,
                        "model": "logreg",
                        "local-lr": 0.1,
                        "local-steps": 10,
                        "batch-size": 16,
                    },
                    note="logistic regression, 15 rounds, the OCS preset's step",
                ),
            ),
        ),
    )


#: How the pair ``make run`` shows is chosen from the candidates' rows.
RULE = (
    "`make run` shows the candidate pair whose ratio of rounds to target has "
    "its 95% interval furthest below 1 (the smallest upper end) among the "
    "pairs whose verdict is *as the paper*; when no pair has that verdict, no "
    "pair is recommended and `make run` keeps its pair, which this section "
    "then says is not supported by the evidence."
)


def recommended_pair(rows: Sequence[ClaimRow]) -> ClaimRow | None:
    """The candidate row :data:`RULE` picks, or None when none qualifies.

    Examples
    --------
    >>> from benchmarks.evidence import RatioInterval
    >>> def row(name, low, high):
    ...     interval = RatioInterval(ratio=(low + high) / 2, low=low, high=high)
    ...     return ClaimRow(paper="", claim="", comparison=name, method="m",
    ...                     baseline="b", statistic="rounds to target",
    ...                     direction="below", interval=interval, data="")
    >>> recommended_pair([row("a", 0.6, 0.9), row("b", 0.5, 0.8)]).comparison
    'b'
    >>> recommended_pair([row("a", 0.6, 1.1)]) is None
    True
    """
    supported = [row for row in rows if row.verdict == "as the paper"]
    return min(supported, key=lambda row: row.interval.high, default=None)


def recommendation(rows: Sequence[ClaimRow]) -> str:
    """The rule and what it picks from ``rows``, as the report prints it."""
    picked = recommended_pair(rows)
    if picked is None:
        outcome = "No candidate qualifies: `make run`'s pair is not supported here."
    else:
        outcome = (
            f"It picks {picked.method} / {picked.baseline}, *{picked.comparison}*."
        )
    return f"{RULE} {outcome}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the candidates; print and write their tables and the recommendation."""
    _, out = start_benchmark(benchmark_parser("main_pair", __doc__), argv)
    run = run_function(out)
    evaluations = [
        run_comparisons(description, run, full=False) for description in descriptions()
    ]
    rows = [row for evaluation in evaluations for row in evaluation.claim_rows()]
    summary = "\n\n".join(
        [recommendation(rows)]
        + [evaluation.markdown(level=2) for evaluation in evaluations]
    )
    write_outputs(out, summary, evaluations, claims=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

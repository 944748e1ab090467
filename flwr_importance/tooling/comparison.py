"""Compare strategies' runs: rounds to a target, final quality, one plot.

The launcher's ``--compare`` runs one ``flwr run`` per strategy and hands the
``history.json`` rows of each (one row per round, round 0 the initial model,
with ``loss`` and ``accuracy`` or ``msd``) to :func:`compare_histories`. The
first strategy is the baseline, and the target is fixed from the baseline alone
before any other run is looked at: :data:`TARGET_FRACTION` of its final
accuracy (or its final MSD divided by :data:`TARGET_FRACTION`, for MSD, where
lower is better). Every strategy's rounds to target are counted against it.

matplotlib is imported only by :func:`plot_comparison`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

#: History rows as ``history.json`` holds them: ``round``, ``loss``, and
#: ``accuracy`` or ``msd``, plus the strategy's round metrics.
History = Sequence[Mapping[str, float]]

#: The target is this fraction of the baseline's final accuracy: a level the
#: baseline reaches by construction, so a miss is the compared method's own.
TARGET_FRACTION = 0.9

#: Quality metrics a history may carry, each with whether lower is better.
QUALITY_METRICS = {"accuracy": False, "msd": True}


@dataclass(frozen=True)
class StrategyResult:
    """One strategy's row of the comparison table.

    Attributes
    ----------
    strategy : str
        The ``strategy`` run-config value.
    rounds : int
        Server rounds run (the last row's ``round``).
    rounds_to_target : int or None
        First round whose quality reaches the target; ``None`` if none does.
    final_quality : float
        The quality metric after the last round.
    final_loss : float
        The central test loss after the last round.
    """

    strategy: str
    rounds: int
    rounds_to_target: int | None
    final_quality: float
    final_loss: float


@dataclass(frozen=True)
class Comparison:
    """Strategies' results against the first (the baseline).

    Built by :func:`compare_histories`; :func:`format_table` prints it and
    :func:`write_comparison` saves it.

    Attributes
    ----------
    metric : str
        The quality metric compared (``accuracy`` or ``msd``).
    target : float
        The quality every strategy's rounds to target are counted against,
        reached at ``>=`` for accuracy and ``<=`` for MSD.
    target_rule : str
        How ``target`` was fixed from the baseline, in words, e.g.
        ``accuracy >= 0.54: 90% of md's final accuracy 0.6``.
    results : tuple of StrategyResult
        One per strategy, the baseline (:attr:`baseline`) first.
    """

    metric: str
    target: float
    target_rule: str
    results: tuple[StrategyResult, ...]

    @property
    def baseline(self) -> StrategyResult:
        """The first strategy's result, the one the target comes from."""
        return self.results[0]


def quality_metric(history: History) -> str:
    """The quality metric a history reports: ``accuracy`` or ``msd``.

    Raises
    ------
    ValueError
        The history is empty or its first row has neither metric.
    """
    if not history:
        raise ValueError("empty history: the run evaluated no round")
    for metric in QUALITY_METRICS:
        if metric in history[0]:
            return metric
    raise ValueError(
        f"history rows have none of {sorted(QUALITY_METRICS)}: {sorted(history[0])}"
    )


def rounds_to_target(history: History, metric: str, target: float) -> int | None:
    """The first round whose ``metric`` reaches ``target``; ``None`` if none does.

    Reaching is ``>=`` for accuracy and ``<=`` for MSD (lower is better).

    Examples
    --------
    >>> rows = [{"round": 0, "accuracy": 0.1}, {"round": 1, "accuracy": 0.6},
    ...         {"round": 2, "accuracy": 0.8}]
    >>> rounds_to_target(rows, "accuracy", 0.7)
    2
    >>> rounds_to_target(rows, "accuracy", 0.9) is None
    True
    """
    lower_is_better = QUALITY_METRICS[metric]
    for row in history:
        value = row[metric]
        if value <= target if lower_is_better else value >= target:
            return int(row["round"])
    return None


def compare_histories(
    histories: Mapping[str, History], *, target_fraction: float = TARGET_FRACTION
) -> Comparison:
    """Rounds to target and final quality of each strategy, the first the baseline.

    Parameters
    ----------
    histories : mapping
        Strategy name -> its history rows, in order; the first is the baseline.
    target_fraction : float (default: ``TARGET_FRACTION``)
        The target is this fraction of the baseline's final accuracy (its final
        MSD divided by it for MSD).

    Returns
    -------
    Comparison
        The target, how it was fixed, and one result per strategy.

    Raises
    ------
    ValueError
        No histories, a ``target_fraction`` outside (0, 1], or histories
        reporting different quality metrics.

    Examples
    --------
    >>> md = [{"round": 0, "accuracy": 0.1, "loss": 2.3},
    ...       {"round": 1, "accuracy": 0.5, "loss": 1.9},
    ...       {"round": 2, "accuracy": 0.6, "loss": 1.7}]
    >>> clustered = [{"round": 0, "accuracy": 0.1, "loss": 2.3},
    ...              {"round": 1, "accuracy": 0.7, "loss": 1.5},
    ...              {"round": 2, "accuracy": 0.8, "loss": 1.2}]
    >>> comparison = compare_histories({"md": md, "clustered": clustered})
    >>> round(comparison.target, 2)
    0.54
    >>> [result.rounds_to_target for result in comparison.results]
    [2, 1]
    """
    if not histories:
        raise ValueError("no histories to compare")
    if not 0 < target_fraction <= 1:
        raise ValueError(f"target_fraction must be in (0, 1], got {target_fraction}")
    metrics = {name: quality_metric(history) for name, history in histories.items()}
    if len(set(metrics.values())) > 1:
        raise ValueError(f"the runs report different quality metrics: {metrics}")
    baseline_name, baseline_history = next(iter(histories.items()))
    metric = metrics[baseline_name]
    baseline_final = baseline_history[-1][metric]
    if QUALITY_METRICS[metric]:
        target = baseline_final / target_fraction
        target_rule = (
            f"{metric} <= {target:.4g}: {baseline_name}'s final {metric} "
            f"{baseline_final:.4g} / {target_fraction:g}"
        )
    else:
        target = target_fraction * baseline_final
        target_rule = (
            f"{metric} >= {target:.4g}: {target_fraction:.0%} of {baseline_name}'s "
            f"final {metric} {baseline_final:.4g}"
        )
    results = tuple(
        StrategyResult(
            strategy=name,
            rounds=int(history[-1]["round"]),
            rounds_to_target=rounds_to_target(history, metric, target),
            final_quality=history[-1][metric],
            final_loss=history[-1]["loss"],
        )
        for name, history in histories.items()
    )
    return Comparison(
        metric=metric, target=target, target_rule=target_rule, results=results
    )


def _rounds_cell(result: StrategyResult) -> str:
    """Rounds to target, or ``> R`` (not reached in R rounds)."""
    if result.rounds_to_target is None:
        return f"> {result.rounds} (missed)"
    return str(result.rounds_to_target)


def _ratio_cell(result: StrategyResult, baseline: StrategyResult) -> str:
    """Rounds to target over the baseline's, or ``n/a`` where either is 0/missed."""
    if not result.rounds_to_target or not baseline.rounds_to_target:
        return "n/a"
    return f"x{result.rounds_to_target / baseline.rounds_to_target:.2f}"


def format_table(comparison: Comparison) -> str:
    """The comparison as a Markdown table, preceded by the target rule.

    Examples
    --------
    >>> result = StrategyResult("md", 2, 2, 0.6, 1.7)
    >>> print(format_table(Comparison("accuracy", 0.54, "rule", (result,))))
    target: rule
    <BLANKLINE>
    | strategy | rounds to target | vs md | final accuracy | final loss |
    |---|---|---|---|---|
    | md (baseline) | 2 | x1.00 | 0.6000 | 1.7000 |
    """
    baseline = comparison.baseline
    lines = [
        f"target: {comparison.target_rule}",
        "",
        f"| strategy | rounds to target | vs {baseline.strategy} "
        f"| final {comparison.metric} | final loss |",
        "|---|---|---|---|---|",
    ]
    for index, result in enumerate(comparison.results):
        name = f"{result.strategy} (baseline)" if index == 0 else result.strategy
        lines.append(
            f"| {name} | {_rounds_cell(result)} | {_ratio_cell(result, baseline)} "
            f"| {result.final_quality:.4f} | {result.final_loss:.4f} |"
        )
    return "\n".join(lines)


def write_comparison(
    comparison: Comparison,
    path: Path,
    *,
    run_config: Mapping[str, object],
    output_dirs: Mapping[str, Path],
) -> Path:
    """Write ``comparison`` as JSON, with the shared run config and each run's folder.

    Returns
    -------
    Path
        ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "metric": comparison.metric,
        "target": comparison.target,
        "target_rule": comparison.target_rule,
        "baseline": comparison.baseline.strategy,
        "run_config": dict(run_config),
        "results": [
            {**asdict(result), "output_dir": str(output_dirs[result.strategy])}
            for result in comparison.results
        ],
    }
    path.write_text(json.dumps(document, indent=1))
    return path


def plot_comparison(
    histories: Mapping[str, History], comparison: Comparison, path: Path, title: str
) -> Path:
    """One figure: every strategy's quality (with the target) and loss per round.

    Returns
    -------
    Path
        ``path`` (a PNG).
    """
    # The object-oriented API renders without pyplot's global backend state.
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4), layout="constrained")
    quality_axes, loss_axes = figure.subplots(1, 2)
    for name, history in histories.items():
        rounds = [row["round"] for row in history]
        quality_axes.plot(
            rounds, [row[comparison.metric] for row in history], marker=".", label=name
        )
        loss_axes.plot(rounds, [row["loss"] for row in history], marker=".", label=name)
    quality_axes.axhline(
        comparison.target, color="gray", linestyle="--", linewidth=1, label="target"
    )
    quality_axes.set(xlabel="round", ylabel=f"central test {comparison.metric}")
    loss_axes.set(xlabel="round", ylabel="central test loss")
    if QUALITY_METRICS[comparison.metric]:
        quality_axes.set_yscale("log")
    quality_axes.legend()
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path

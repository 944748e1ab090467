"""Server-side cost of the samplers, measured in one run.

- ``systematic_sample`` (Hartley–Rao pi-ps) and ``optimal_client_probs`` (OCS)
  for a million clients;
- Algorithm 2 of clustered sampling (``clustered_distributions_by_similarity``)
  with 50,000-dimensional representative gradients: the loop-free version
  against the authors' approach, a Python loop over client pairs computing one
  arccos distance at a time with NumPy, followed by the same linkage and fill;
  then the loop-free version alone at 2,000 clients;
- Algorithm 2's two-level clustering (used above ``EXACT_WARD_LIMIT``
  clients, docs/methods.md §4) against exact Ward where Ward still runs
  (1,000 and 2,000 clients of a Gaussian mixture of ``--classes`` classes):
  class coverage (fraction of the classes in a round's sample, averaged over
  draws) and the aggregation-weight variance (mean over clients, against MD
  sampling's); then its time at 10,000 and 20,000 clients (d = 1,024, every
  gradient non-zero: the worst case for level 1).

Run ``python -m benchmarks.sampling_overhead`` (``--help`` for the sizes).
Every time is the best of ``--repeats`` runs, except the pair loop, run once:
quick mode times it on 20,000 random pairs and extrapolates (the output says
so), ``--full`` on all pairs (about 15 s at 500 clients on two cores).

The header gives the one-minute load average when the run started: the
loop-free version runs on every core and BLAS threads that wait for each
other, so other processes slow it down more than the single-threaded pair
loop, and the speed-up drops on a busy machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy
from numpy.typing import NDArray

from benchmarks.harness import benchmark_parser, markdown_table
from flwr_importance.sampling.clustered import (
    aggregation_weight_variance,
    clustered_distributions_by_similarity,
    clustered_distributions_from_distances,
    md_aggregation_weight_variance,
    sample_from_distributions,
)
from flwr_importance.sampling.distances import pairwise_distances
from flwr_importance.sampling.pips import capped_inclusion_probs, systematic_sample
from flwr_importance.sampling.variance_reduced import optimal_client_probs

#: The section title of this benchmark in docs/results.md.
TITLE = "Samplers at scale"

MIN_SPEEDUP = 50.0
MAX_SECONDS_LARGE = 10.0
#: Quick mode times this many random pairs of the Python loop and extrapolates.
QUICK_LOOP_PAIRS = 20_000
#: The two-level clustering's class coverage may trail exact Ward's by this much.
MAX_COVERAGE_LOSS = 0.05
#: Draws over which the class coverage is averaged.
COVERAGE_DRAWS = 2_000


@dataclass(frozen=True)
class Row:
    """One line of the results table."""

    operation: str
    clients: int
    measured: str
    target: str = ""
    passed: bool | None = None


def best_time(run: Callable[[], object], repeats: int) -> float:
    """Shortest wall-clock time of ``repeats`` calls of ``run``, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def grouped_gradients(
    clients: int, dim: int, rng: np.random.Generator, groups: int = 10
) -> NDArray[np.float64]:
    """Gradients around ``groups`` random directions, like non-IID clients."""
    centres = rng.standard_normal((groups, dim))
    labels = rng.integers(0, groups, clients)
    return centres[labels] + rng.standard_normal((clients, dim))


def arccos_pair(a: NDArray[np.float64], b: NDArray[np.float64]) -> float:
    """The reference's per-pair distance: three reductions, then arccos.

    Like the authors' code, a zero vector is at distance 0 from everything.
    """
    inner, norm_a, norm_b = np.sum(a * b), np.sum(a**2), np.sum(b**2)
    if norm_a == 0.0 or norm_b == 0.0:
        return 0.0
    return float(np.arccos(np.clip(inner / np.sqrt(norm_a * norm_b), -1.0, 1.0)))


def time_pair_loop(
    grads: NDArray[np.float64], pairs: int, rng: np.random.Generator
) -> tuple[float, float]:
    """Time the Python pair loop on ``pairs`` random pairs ``i < j``.

    Returns
    -------
    tuple[float, float]
        Seconds per pair, and the largest difference between the loop's
        distances and the loop-free ones on those pairs (a correctness check).
    """
    first, second = np.triu_indices(grads.shape[0], k=1)
    chosen = rng.choice(first.size, size=pairs, replace=False)
    start = time.perf_counter()
    looped = [
        arccos_pair(grads[i], grads[j])
        for i, j in zip(first[chosen], second[chosen], strict=True)
    ]
    per_pair = (time.perf_counter() - start) / chosen.size
    vectorized = pairwise_distances(grads)[first[chosen], second[chosen]]
    return per_pair, float(np.max(np.abs(np.array(looped) - vectorized)))


def pips_rows(
    clients: int, m: int, repeats: int, rng: np.random.Generator
) -> list[Row]:
    """Hartley–Rao sampling and OCS probabilities for ``clients`` clients."""
    weights = rng.lognormal(0.0, 1.0, clients)
    inclusion = capped_inclusion_probs(weights, m)
    systematic = best_time(lambda: systematic_sample(inclusion, rng), repeats)
    optimal = best_time(lambda: optimal_client_probs(weights, m), repeats)
    return [
        Row(f"systematic_sample (m={m})", clients, f"{systematic * 1e3:.1f} ms"),
        Row(f"optimal_client_probs (m={m})", clients, f"{optimal * 1e3:.1f} ms"),
    ]


def loop_comparison_rows(
    args: argparse.Namespace, rng: np.random.Generator
) -> list[Row]:
    """Algorithm 2, loop-free against the Python pair loop."""
    clients, dim, m = args.similarity_clients, args.dim, args.m_clustered
    grads = grouped_gradients(clients, dim, rng)
    sizes = rng.integers(50, 500, clients)
    loop_free = best_time(
        lambda: clustered_distributions_by_similarity(sizes, grads, m), args.repeats
    )
    # The reference's linkage and fill are the same code as ours: timed once on
    # the distance matrix and added to the pair loop's time.
    distances = pairwise_distances(grads)
    linkage_and_fill = best_time(
        lambda: clustered_distributions_from_distances(sizes, distances, m),
        args.repeats,
    )
    all_pairs = clients * (clients - 1) // 2
    timed_pairs = min(args.loop_pairs, all_pairs) if args.loop_pairs else all_pairs
    per_pair, max_difference = time_pair_loop(grads, timed_pairs, rng)
    looped = per_pair * all_pairs + linkage_and_fill
    speedup = looped / loop_free
    coverage = (
        f"all {all_pairs} pairs timed"
        if timed_pairs == all_pairs
        else f"{timed_pairs} of {all_pairs} pairs timed, extrapolated"
    )
    return [
        Row(
            f"Alg. 2 loop-free (arccos, d={dim}, m={m})", clients, f"{loop_free:.3f} s"
        ),
        Row(
            f"Alg. 2 Python pair loop ({coverage}; {per_pair * 1e6:.0f} us/pair)",
            clients,
            f"{looped:.1f} s",
        ),
        Row(
            f"  speed-up (max |loop - loop-free| = {max_difference:.1e} rad)",
            clients,
            f"{speedup:.0f}x",
            f">= {MIN_SPEEDUP:.0f}x",
            speedup >= MIN_SPEEDUP,
        ),
    ]


def at_scale_row(args: argparse.Namespace, rng: np.random.Generator) -> Row:
    """Algorithm 2, loop-free, at ``--large-clients`` clients."""
    clients, dim, m = args.large_clients, args.dim, args.m_clustered
    grads = grouped_gradients(clients, dim, rng)
    sizes = rng.integers(50, 500, clients)
    seconds = best_time(
        lambda: clustered_distributions_by_similarity(sizes, grads, m), args.repeats
    )
    return Row(
        f"Alg. 2 loop-free (arccos, d={dim}, m={m})",
        clients,
        f"{seconds:.3f} s",
        f"< {MAX_SECONDS_LARGE:.0f} s",
        seconds < MAX_SECONDS_LARGE,
    )


def class_coverage(
    distributions: NDArray[np.float64],
    labels: NDArray[np.intp],
    rng: np.random.Generator,
) -> float:
    """Fraction of the classes in a round's sample, mean of ``COVERAGE_DRAWS``."""
    classes = np.unique(labels).size
    return float(
        np.mean(
            [
                np.unique(labels[sample_from_distributions(distributions, rng)]).size
                / classes
                for _ in range(COVERAGE_DRAWS)
            ]
        )
    )


def two_level_quality_rows(
    args: argparse.Namespace, rng: np.random.Generator
) -> list[Row]:
    """Two-level clustering against exact Ward: class coverage, weight variance."""
    rows = []
    m = args.m_two_level
    for clients in (1_000, 2_000):
        grads, labels = mixture_gradients(clients, args.classes, args.noise, rng)
        sizes = rng.integers(50, 500, clients)
        md = md_aggregation_weight_variance(sizes / sizes.sum(), m).mean()
        # Common random numbers: both clusterings' coverage draws come from
        # generators of one seed, so they see the same uniforms.
        draw_seed = int(rng.integers(2**32))
        results = {}
        for name, limit in (("exact Ward", clients), ("two-level", 0)):
            start = time.perf_counter()
            distributions = clustered_distributions_by_similarity(
                sizes, grads, m, exact_ward_limit=limit
            )
            seconds = time.perf_counter() - start
            coverage = class_coverage(
                distributions, labels, np.random.default_rng(draw_seed)
            )
            variance = aggregation_weight_variance(distributions).mean() / md
            results[name] = coverage
            passed = None
            target = ""
            if name == "two-level":
                target = f">= Ward - {MAX_COVERAGE_LOSS}"
                passed = coverage >= results["exact Ward"] - MAX_COVERAGE_LOSS
            rows.append(
                Row(
                    f"Alg. 2 {name} (K={args.classes}, m={m}): class coverage "
                    f"(weight variance / MD's = {variance:.3f}; {seconds:.2f} s)",
                    clients,
                    f"{coverage:.3f}",
                    target,
                    passed,
                )
            )
    return rows


def mixture_gradients(
    clients: int, classes: int, noise: float, rng: np.random.Generator
) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    """Gradients of a Gaussian mixture (d = 1,024) and each client's class.

    Class centres are standard normal; a client's gradient is its class's
    centre plus ``noise`` times standard normal noise.
    """
    centres = rng.standard_normal((classes, 1024))
    labels = rng.integers(0, classes, clients)
    return centres[labels] + noise * rng.standard_normal((clients, 1024)), labels


def two_level_time_rows(
    args: argparse.Namespace, rng: np.random.Generator
) -> list[Row]:
    """The two-level clustering's time where exact Ward cannot run."""
    rows = []
    m = 100
    for clients in (10_000, 20_000):
        grads = grouped_gradients(clients, 1024, rng, groups=args.classes).astype(
            np.float32
        )
        sizes = rng.integers(50, 500, clients)
        seconds = best_time(
            functools.partial(clustered_distributions_by_similarity, sizes, grads, m),
            args.repeats,
        )
        rows.append(
            Row(
                f"Alg. 2 two-level (arccos, d=1024, m={m}; N x N float64 would be "
                f"{clients**2 * 8 / 1e9:.1f} GB)",
                clients,
                f"{seconds:.3f} s",
            )
        )
    return rows


def print_table(rows: list[Row], args: argparse.Namespace, load: float) -> None:
    """The results as a fixed-width table with a one-line environment header.

    ``load`` is the one-minute load average when the run started.
    """
    print(
        f"Sampling overhead: best of {args.repeats} runs, numpy {np.__version__}, "
        f"scipy {scipy.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {load:.1f}, seed {args.seed}"
    )
    width = max(len(row.operation) for row in rows)
    header = (
        f"{'operation':<{width}} {'clients':>9} {'measured':>10} {'target':>8}  status"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        status = "" if row.passed is None else ("PASS" if row.passed else "FAIL")
        print(
            f"{row.operation:<{width}} {row.clients:>9} {row.measured:>10} "
            f"{row.target:>8}  {status}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Problem sizes from the command line; the defaults are the targets' sizes."""
    parser = benchmark_parser("sampling_overhead", __doc__)
    parser.add_argument(
        "--clients", type=int, default=1_000_000, help="clients for pi-ps and OCS"
    )
    parser.add_argument(
        "--m", type=int, default=100, help="clients per round for pi-ps and OCS"
    )
    parser.add_argument("--similarity-clients", type=int, default=500)
    parser.add_argument("--large-clients", type=int, default=2000)
    parser.add_argument("--dim", type=int, default=50_000, help="gradient dimension")
    parser.add_argument(
        "--m-clustered", type=int, default=10, help="clients per round, Alg. 2"
    )
    parser.add_argument(
        "--loop-pairs",
        type=int,
        default=None,
        help="pairs timed in the Python loop, extrapolated to all (0: all pairs; "
        f"default {QUICK_LOOP_PAIRS}, or all with --full)",
    )
    parser.add_argument(
        "--classes", type=int, default=20, help="mixture classes, two-level rows"
    )
    parser.add_argument(
        "--noise", type=float, default=3.0, help="mixture noise, two-level rows"
    )
    parser.add_argument(
        "--m-two-level", type=int, default=20, help="clients per round, two-level"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.loop_pairs is None:
        args.loop_pairs = 0 if args.full else QUICK_LOOP_PAIRS
    return args


def results_table(rows: list[Row]) -> str:
    """The results as a markdown table."""
    columns = ["operation", "clients", "measured", "target", "status"]
    cells = [
        [
            # A "|" inside a cell would end it.
            row.operation.strip().replace("|", "&#124;"),
            f"{row.clients:,}",
            row.measured,
            row.target,
            "" if row.passed is None else ("pass" if row.passed else "FAIL"),
        ]
        for row in rows
    ]
    return markdown_table(columns, cells)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every measurement, print and write the table; 1 if a target fails."""
    args = parse_args(argv)
    load = os.getloadavg()[0]
    rng = np.random.default_rng(args.seed)
    rows = pips_rows(args.clients, args.m, args.repeats, rng)
    rows += loop_comparison_rows(args, rng)
    rows.append(at_scale_row(args, rng))
    rows += two_level_quality_rows(args, rng)
    rows += two_level_time_rows(args, rng)
    print_table(rows, args, load)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "summary.md").write_text(
        f"# Sampler overhead\n\nBest of {args.repeats} runs, seed {args.seed}, "
        f"{os.cpu_count()} CPUs, load average {load:.1f} at the start.\n\n"
        f"{results_table(rows)}\n"
    )
    (args.output_dir / "results.json").write_text(
        json.dumps([dataclasses.asdict(row) for row in rows], indent=1)
    )
    return 0 if all(row.passed is not False for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

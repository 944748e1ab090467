"""Server-side cost of the samplers, measured in one run.

- ``systematic_sample`` (Hartley–Rao pi-ps) and ``optimal_client_probs`` (OCS)
  for a million clients;
- Algorithm 2 of clustered sampling (``clustered_distributions_by_similarity``)
  with 50,000-dimensional representative gradients: the loop-free version
  against the authors' approach, a Python loop over client pairs computing one
  arccos distance at a time with NumPy, followed by the same linkage and fill;
  then the loop-free version alone at 2,000 clients.

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
    clustered_distributions_by_similarity,
    clustered_distributions_from_distances,
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

"""Cost of a local step with per-sample gradient norms, against a plain SGD step.

ISFedAvg's client needs every sample's gradient norm at each step (eq. 29) on top
of the importance-weighted step itself (eq. 8). This benchmark times, in the same
process and interleaved so that machine load hits all variants alike:

* ``plain``: one ``train_local`` step (mini-batch SGD, one backward pass);
* ``weighted``: one ``weighted_sgd_step``, the step the library's ISFedAvg client
  takes: importance-weighted gradient and per-sample norms from one backward
  pass, layer by layer;
* ``vmap``: the same step from per-sample gradients materialized with
  ``torch.func.vmap(grad(...))`` (the generic fallback), for reference.

It reports medians after warm-up and the ratios to ``plain``; the target is a
``weighted``/``plain`` ratio of at most 2.5 for the MLP at batch 64 on
digits-shaped input (1x8x8, 10 classes).

Run: ``python -m benchmarks.per_sample_grads [--full] [--batch-size 64]
[--repeats 200] [--threads 1]``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from benchmarks.harness import benchmark_parser, markdown_table
from flwr_importance.tasks import (
    MODEL_NAMES,
    Objective,
    build_model,
    train_local,
    weighted_sgd_step,
)

#: The section title of this benchmark in docs/results.md.
TITLE = "Per-sample gradient norms (ISFedAvg's client)"

TARGET_MODEL = "mlp"
TARGET_RATIO = 2.5
DIGITS_SHAPE = (1, 8, 8)
NUM_CLASSES = 10
LEARNING_RATE = 0.01


def vmap_step(
    model: nn.Module, x: Tensor, y: Tensor, objective: Objective, weights: Tensor
) -> Tensor:
    """A weighted step from materialized per-sample gradients; returns the norms."""
    per_sample, norms = objective.per_sample_grads_and_norms(model, x, y)
    with torch.no_grad():
        for parameter, sample_grads in zip(
            model.parameters(), per_sample.values(), strict=True
        ):
            parameter.sub_(
                LEARNING_RATE * torch.tensordot(weights, sample_grads, dims=1)
            )
    return norms


def median_seconds(
    variants: dict[str, Callable[[], object]], repeats: int, warmup: int
) -> dict[str, float]:
    """Median wall time of each variant, calls interleaved round-robin."""
    for _ in range(warmup):
        for run in variants.values():
            run()
    timings: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            start = time.perf_counter()
            run()
            timings[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in timings.items()}


def benchmark_model(
    model_name: str, batch_size: int, repeats: int, warmup: int
) -> dict[str, float]:
    """Median seconds of the three step variants for one model."""
    data_generator = torch.Generator().manual_seed(0)
    x = torch.rand((batch_size, *DIGITS_SHAPE), generator=data_generator)
    if model_name == "linear":
        # The linear model is the ISFedAvg regression model: one output, squared loss.
        objective = Objective("regression", l2=0.001)
        num_outputs = 1
        y = torch.randn(batch_size, generator=data_generator)
    else:
        objective = Objective("classification")
        num_outputs = NUM_CLASSES
        y = torch.randint(0, NUM_CLASSES, (batch_size,), generator=data_generator)
    model = build_model(model_name, DIGITS_SHAPE, num_outputs, seed=0)
    weights = torch.full((batch_size,), 1.0 / batch_size)
    batch_generator = torch.Generator().manual_seed(1)
    variants: dict[str, Callable[[], object]] = {
        "plain": lambda: train_local(
            model,
            x,
            y,
            objective,
            lr=LEARNING_RATE,
            batch_size=batch_size,
            local_steps=1,
            generator=batch_generator,
        ),
        "weighted": lambda: weighted_sgd_step(
            model, x, y, objective, lr=LEARNING_RATE, sample_weights=weights
        ),
        "vmap": lambda: vmap_step(model, x, y, objective, weights),
    }
    return median_seconds(variants, repeats, warmup)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark for every model; print and write the table and verdict."""
    parser = benchmark_parser("per_sample_grads", __doc__)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed steps (200; 1000 with --full)"
    )
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; 1 (default) is what a simulated client on "
        "one core gets and keeps timings stable on a shared machine; 0 leaves "
        "torch's own choice",
    )
    parser.add_argument("--models", nargs="+", choices=MODEL_NAMES, default=MODEL_NAMES)
    args = parser.parse_args(argv)
    repeats = args.repeats or (1000 if args.full else 200)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    intro = (
        f"Per-sample gradient norms vs a plain SGD step: batch {args.batch_size}, "
        f"input {DIGITS_SHAPE}, median of {repeats} after {args.warmup} "
        f"warm-up, {torch.get_num_threads()} torch threads, torch {torch.__version__}."
    )
    columns = ["model", "plain (us)", "weighted (us)", "ratio", "vmap (us)", "ratio"]
    cells = []
    results: dict[str, dict[str, float]] = {}
    target_ratio = None
    for model_name in args.models:
        seconds = benchmark_model(model_name, args.batch_size, repeats, args.warmup)
        results[model_name] = seconds
        weighted_ratio = seconds["weighted"] / seconds["plain"]
        vmap_ratio = seconds["vmap"] / seconds["plain"]
        if model_name == TARGET_MODEL:
            target_ratio = weighted_ratio
        cells.append(
            [
                model_name,
                f"{seconds['plain'] * 1e6:.0f}",
                f"{seconds['weighted'] * 1e6:.0f}",
                f"{weighted_ratio:.2f}x",
                f"{seconds['vmap'] * 1e6:.0f}",
                f"{vmap_ratio:.2f}x",
            ]
        )
    verdict = ""
    if target_ratio is not None:
        met = "met" if target_ratio <= TARGET_RATIO else "MISSED"
        verdict = (
            f"Target: {TARGET_MODEL} weighted/plain <= {TARGET_RATIO}x at batch 64: "
            f"{target_ratio:.2f}x, {met}."
        )
    table = markdown_table(columns, cells)
    text = f"# Per-sample gradient norms\n\n{intro}\n\n{table}\n\n{verdict}\n"
    print(text)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "summary.md").write_text(text)
    (args.output_dir / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost of a local step with per-sample gradient norms, against a plain SGD step.

ISFedAvg's client needs every sample's gradient norm at each step (eq. 29) on
top of the importance-weighted step itself (eq. 8). This benchmark times, in
the same process and interleaved so that machine load hits all variants alike,
on the models users train (Flower's quickstart CNN and a GroupNorm ResNet-18
on CIFAR-shaped images, a character LSTM and a 4-layer transformer encoder on
LEAF Shakespeare's 80-character sequences) and on the library's own models
(digits-shaped input):

* ``plain``: one ``train_local`` step (mini-batch SGD, one backward pass);
* ``library``: one ``weighted_sgd_step``, the step the library's ISFedAvg
  client takes: importance-weighted gradient and per-sample norms from one
  backward pass, layer by layer (:mod:`flwr_importance.per_sample`);
* ``opacus``: the same step from Opacus's ``GradSampleModule`` (its per-sample
  gradients, their norms, the weighted sum, the update), on the model
  Opacus's ``ModuleValidator.fix`` makes of it (``DPLSTM`` for ``nn.LSTM``,
  ``DPMultiheadAttention`` for attention), where Opacus is installed and
  runs the model; the table says why where it does not (its backward hooks
  refuse ResNet's in-place ``out += identity`` and ReLUs, as in torchvision).

It reports medians after warm-up and the median, over the rounds, of each
step's ratio to ``plain`` in the same round; the targets: a
``library``/``plain`` ratio of at most 2.5 on every model, and ``library`` no
slower than ``opacus`` where Opacus runs.

Run: ``python -m benchmarks.per_sample_grads [--device {cpu,cuda}] [--small]
[--repeats N] [--threads 1] [--models ...]``. ``--small`` shrinks the models
and data (CI runs it in seconds); the default sizes are the papers'.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from benchmarks.harness import benchmark_parser, markdown_table
from flwr_importance.tasks import (
    Objective,
    build_model,
    train_local,
    weighted_sgd_step,
)
from flwr_importance.tasks.architectures import (
    SHAKESPEARE_LENGTH,
    SHAKESPEARE_VOCAB,
    CharLSTM,
    CharTransformer,
    QuickstartCNN,
    resnet18,
)

#: The section title of this benchmark in docs/results.md.
TITLE = "Per-sample gradient norms (ISFedAvg's client)"

TARGET_RATIO = 2.5
DIGITS_SHAPE = (1, 8, 8)
CIFAR_SHAPE = (3, 32, 32)
NUM_CLASSES = 10
LEARNING_RATE = 0.01


CLASSIFICATION = Objective("classification")


@dataclass(frozen=True)
class Case:
    """One benchmarked model: how to build it and a batch for it."""

    build: Callable[[bool], nn.Module]
    #: ``(batch size, small, generator) -> (x, y)``.
    batch: Callable[[int, bool, torch.Generator], tuple[Tensor, Tensor]]
    batch_size: int
    objective: Objective = CLASSIFICATION


def images(
    shape: tuple[int, ...], small_shape: tuple[int, ...]
) -> Callable[[int, bool, torch.Generator], tuple[Tensor, Tensor]]:
    """Random images of ``shape`` (``small_shape`` with ``--small``), 10 classes."""

    def batch(
        size: int, small: bool, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        x = torch.rand((size, *(small_shape if small else shape)), generator=generator)
        return x, torch.randint(0, NUM_CLASSES, (size,), generator=generator)

    return batch


def characters(
    size: int, small: bool, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Random character sequences and next characters (Shakespeare's shape)."""
    length = 12 if small else SHAKESPEARE_LENGTH
    x = torch.randint(0, SHAKESPEARE_VOCAB, (size, length), generator=generator)
    return x, torch.randint(0, SHAKESPEARE_VOCAB, (size,), generator=generator)


def regression_digits(
    size: int, small: bool, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Digits-shaped inputs and one real target each (the ISFedAvg regression)."""
    return torch.rand((size, *DIGITS_SHAPE), generator=generator), torch.randn(
        size, generator=generator
    )


def library_model(name: str, num_outputs: int) -> Callable[[bool], nn.Module]:
    """A model of :func:`flwr_importance.tasks.build_model` at digits shape."""
    return lambda small: build_model(name, DIGITS_SHAPE, num_outputs, seed=0)


CASES = {
    "quickstart-cnn": Case(
        lambda small: QuickstartCNN(), images(CIFAR_SHAPE, CIFAR_SHAPE), 32
    ),
    "resnet18-groupnorm": Case(
        lambda small: resnet18(width=8 if small else 64),
        images(CIFAR_SHAPE, (3, 16, 16)),
        32,
    ),
    "char-lstm": Case(
        lambda small: CharLSTM(hidden_size=16 if small else 128), characters, 32
    ),
    "transformer-4-layer": Case(
        lambda small: CharTransformer(d_model=16 if small else 64), characters, 32
    ),
    "linear": Case(
        library_model("linear", 1),
        regression_digits,
        64,
        Objective("regression", l2=0.001),
    ),
    "logreg": Case(
        library_model("logreg", NUM_CLASSES), images(DIGITS_SHAPE, DIGITS_SHAPE), 64
    ),
    "mlp": Case(
        library_model("mlp", NUM_CLASSES), images(DIGITS_SHAPE, DIGITS_SHAPE), 64
    ),
    "cnn": Case(
        library_model("cnn", NUM_CLASSES), images(DIGITS_SHAPE, DIGITS_SHAPE), 64
    ),
}


def opacus_step(
    model: nn.Module, x: Tensor, y: Tensor, objective: Objective, weights: Tensor
) -> Callable[[], object]:
    """The weighted step from Opacus's per-sample gradients, on a fixed copy.

    Raises what Opacus raises (absent, or refusing the model) when the step is
    first built and run.
    """
    from opacus import GradSampleModule
    from opacus.validators import ModuleValidator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed = ModuleValidator.fix(copy.deepcopy(model))
        wrapped = GradSampleModule(fixed)
    parameters = list(wrapped.parameters())

    def step() -> Tensor:
        losses = objective.sample_losses(wrapped(x), y)
        if objective.l2 > 0:
            losses = losses + objective.penalty(parameters)
        losses.sum().backward()
        with torch.no_grad():
            squared = torch.zeros_like(weights)
            for parameter in parameters:
                sample_grads = parameter.grad_sample
                squared += sample_grads.flatten(start_dim=1).square().sum(dim=1)
                parameter.sub_(
                    LEARNING_RATE * torch.tensordot(weights, sample_grads, dims=1)
                )
                parameter.grad_sample = None
                parameter.grad = None
        return squared.sqrt()

    step()
    return step


def interleaved_medians(
    variants: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int,
    synchronize: Callable[[], None],
) -> dict[str, float]:
    """Median seconds of each variant, and its median ratio to ``plain``.

    The variants run round-robin; a ratio is taken within each round (the
    variant's time over ``plain``'s in the same round) and its median
    reported as ``<variant>-ratio``, so that load that changes between
    rounds on a shared machine cancels out.
    """
    for _ in range(warmup):
        for run in variants.values():
            run()
    timings: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, run in variants.items():
            synchronize()
            start = time.perf_counter()
            run()
            synchronize()
            timings[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(times) for name, times in timings.items()}
    for name, times in timings.items():
        if name != "plain":
            medians[f"{name}-ratio"] = statistics.median(
                time_taken / plain
                for time_taken, plain in zip(times, timings["plain"], strict=True)
            )
    return medians


def benchmark_model(
    name: str,
    *,
    small: bool,
    device: torch.device,
    repeats: int,
    warmup: int,
    batch_size: int | None = None,
) -> tuple[dict[str, float], str]:
    """Median seconds of the step variants for one model, and Opacus's status.

    The status is empty when Opacus ran, else why it did not.
    """
    case = CASES[name]
    size = batch_size or case.batch_size
    x, y = case.batch(size, small, torch.Generator().manual_seed(0))
    x, y = x.to(device), y.to(device)
    torch.manual_seed(0)
    model = case.build(small).to(device)
    objective = case.objective
    weights = torch.full((size,), 1.0 / size, device=device)
    batch_generator = torch.Generator().manual_seed(1)
    variants: dict[str, Callable[[], object]] = {
        "plain": lambda: train_local(
            model,
            x,
            y,
            objective,
            lr=LEARNING_RATE,
            batch_size=size,
            local_steps=1,
            generator=batch_generator,
        ),
        "library": lambda: weighted_sgd_step(
            model, x, y, objective, lr=LEARNING_RATE, sample_weights=weights
        ),
    }
    status = ""
    try:
        variants["opacus"] = opacus_step(model, x, y, objective, weights)
    except ImportError:
        status = "not installed"
    except Exception as error:  # any refusal is a result
        status = f"fails: {type(error).__name__}: {str(error).splitlines()[0][:60]}..."

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return interleaved_medians(variants, repeats, warmup, synchronize), status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark for every model; print and write the table and verdict."""
    parser = benchmark_parser("per_sample_grads", __doc__)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--small", action="store_true", help="small models and data (CI, seconds)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed steps (30; 100 with --full)"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads; 1 (default) is what a simulated client on "
        "one core gets and keeps timings stable on a shared machine; 0 leaves "
        "torch's own choice",
    )
    parser.add_argument("--models", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args(argv)
    repeats = args.repeats or (100 if args.full else 30)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":
        # Full float32 on both paths: TF32 would round the two differently.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        hardware = torch.cuda.get_device_name(device)
    else:
        hardware = f"CPU, {torch.get_num_threads()} torch threads"
    sizes = (
        "small test sizes (3x16x16 images for a ResNet-18 of width 8; 12 "
        "characters for a 16-unit LSTM and a 16-wide transformer)"
        if args.small
        else "CIFAR and Shakespeare sizes (3x32x32 images; 80 characters)"
    )
    gpu_note = ""
    if device.type == "cpu":
        gpu_note = (
            " The CUDA table comes from the same command with `--device cuda` on a "
            "GPU"
            + ("" if torch.cuda.is_available() else " (this machine has none)")
            + "."
        )
    intro = (
        f"Per-sample gradient norms and the weighted step vs a plain SGD step, "
        f"{hardware}, {sizes}: median of {repeats} interleaved steps after "
        f"{args.warmup} warm-up (ratios: median of each round's ratio to the "
        f"plain step), torch {torch.__version__}. Batches: 32 for the "
        f"users' models, 64 for the library's (digits, {DIGITS_SHAPE}).{gpu_note}"
    )
    columns = ["model", "plain (ms)", "library (ms)", "ratio", "Opacus (ms)", "ratio"]
    cells = []
    results: dict[str, dict[str, float | str]] = {}
    failures = []
    for name in args.models:
        seconds, status = benchmark_model(
            name, small=args.small, device=device, repeats=repeats, warmup=args.warmup
        )
        ratio = seconds["library-ratio"]
        results[name] = {**seconds, "opacus-status": status}
        if ratio > TARGET_RATIO:
            failures.append(f"{name} {ratio:.2f}x")
        opacus_cells = [status or "", ""]
        if "opacus" in seconds:
            opacus_cells = [
                f"{seconds['opacus'] * 1e3:.1f}",
                f"{seconds['opacus-ratio']:.2f}x",
            ]
            if seconds["library"] > seconds["opacus"]:
                failures.append(f"{name} slower than Opacus")
        cells.append(
            [
                name,
                f"{seconds['plain'] * 1e3:.1f}",
                f"{seconds['library'] * 1e3:.1f}",
                f"{ratio:.2f}x",
                *opacus_cells,
            ]
        )
    met = "met" if not failures else "MISSED (" + "; ".join(failures) + ")"
    verdict = (
        f"Target: library/plain <= {TARGET_RATIO}x on every model, and no slower "
        f"than Opacus where it runs: {met}."
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

"""Import time of the server side against Flower's own strategies.

A Flower project in any ML framework imports our strategies in its ServerApp;
the server side must cost about what Flower's own strategies cost and load no
ML framework. Each repeat starts one fresh interpreter per module, in turn
(interleaved, so that machine load hits all modules alike), and times the
``import`` statement alone (interpreter start-up excluded):

* ``flwr_importance.strategies`` (Message API) and ``flwr_importance.compat``
  (legacy Strategy API), the library's server side;
* ``flwr.serverapp.strategy``, Flower's Message-API strategies, the baseline
  of both ratios; ``flwr.server.strategy``, Flower's legacy strategies, shown
  for reference (``flwr_importance.compat`` subclasses its ``FedAvg``).

It reports the median over the repeats, the ratio to the baseline (target:
at most 1.5x) and which ML frameworks each import loaded (target: none).

Run: ``python -m benchmarks.import_time [--full] [--repeats 9]``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Sequence

from benchmarks.harness import benchmark_parser, markdown_table

#: The section title of this benchmark in docs/results.md.
TITLE = "Server-side import time vs Flower's strategies"

#: Flower's Message-API strategies: what both ratios are taken against.
BASELINE = "flwr.serverapp.strategy"
#: The library's server side, then Flower's legacy strategies for reference.
MODULES = (
    "flwr_importance.strategies",
    "flwr_importance.compat",
    BASELINE,
    "flwr.server.strategy",
)
#: The library's modules the target applies to.
SERVER_SIDE = ("flwr_importance.strategies", "flwr_importance.compat")
TARGET_RATIO = 1.5
#: What the server side must not load: ML frameworks, data and plotting libraries.
HEAVY_MODULES = (
    "torch",
    "datasets",
    "flwr_datasets",
    "sklearn",
    "matplotlib",
    "ray",
    "tensorflow",
    "jax",
)
#: Run in a fresh interpreter: time the import, list the heavy modules it loaded.
PROBE = """
import json, sys, time
start = time.perf_counter()
import {module}
seconds = time.perf_counter() - start
heavy = [name for name in {heavy!r} if name in sys.modules]
print(json.dumps({{"seconds": seconds, "heavy": heavy}}))
"""


def probe_import(module: str) -> tuple[float, list[str]]:
    """Seconds to import ``module`` in a fresh interpreter, and the heavy modules.

    Raises
    ------
    RuntimeError
        If the import fails (its stderr is in the message).
    """
    completed = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module, heavy=HEAVY_MODULES)],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"import {module} failed:\n{completed.stderr}")
    result = json.loads(completed.stdout.splitlines()[-1])
    return float(result["seconds"]), list(result["heavy"])


def main(argv: Sequence[str] | None = None) -> int:
    """Time every import; print and write the table and the verdict."""
    parser = benchmark_parser("import_time", __doc__)
    parser.add_argument(
        "--repeats", type=int, default=None, help="fresh interpreters (9; 31 --full)"
    )
    args = parser.parse_args(argv)
    repeats = args.repeats or (31 if args.full else 9)
    seconds: dict[str, list[float]] = {module: [] for module in MODULES}
    heavy: dict[str, set[str]] = {module: set() for module in MODULES}
    for _ in range(repeats):
        for module in MODULES:
            elapsed, loaded = probe_import(module)
            seconds[module].append(elapsed)
            heavy[module].update(loaded)
    medians = {module: statistics.median(seconds[module]) for module in MODULES}
    ratios = {module: medians[module] / medians[BASELINE] for module in MODULES}
    rows = [
        [
            f"`{module}`",
            f"{medians[module]:.3f}",
            f"{ratios[module]:.2f}x",
            ", ".join(sorted(heavy[module])) or "none",
        ]
        for module in MODULES
    ]
    table = markdown_table(
        ["module", "import (s, median)", f"ratio to `{BASELINE}`", "heavy modules"],
        rows,
    )
    worst = max(SERVER_SIDE, key=lambda module: ratios[module])
    heavy_loaded = sorted(set().union(*(heavy[module] for module in SERVER_SIDE)))
    met = ratios[worst] <= TARGET_RATIO and not heavy_loaded
    verdict = (
        f"Target: the server side within {TARGET_RATIO}x of `{BASELINE}` and no "
        f"heavy module: worst {ratios[worst]:.2f}x (`{worst}`), heavy modules: "
        f"{', '.join(heavy_loaded) or 'none'}; {'met' if met else 'MISSED'}."
    )
    intro = (
        f"Import time of the server side in a fresh interpreter, median of "
        f"{repeats} interleaved repeats (interpreter start-up excluded), "
        f"Python {sys.version.split()[0]}."
    )
    text = f"# Server-side import time\n\n{intro}\n\n{table}\n\n{verdict}\n"
    print(text)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "summary.md").write_text(text)
    results = {
        "repeats": repeats,
        "baseline": BASELINE,
        "target_ratio": TARGET_RATIO,
        "modules": {
            module: {
                "seconds": seconds[module],
                "median_seconds": medians[module],
                "ratio": ratios[module],
                "heavy_modules": sorted(heavy[module]),
            }
            for module in MODULES
        },
        "met": met,
    }
    (args.output_dir / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

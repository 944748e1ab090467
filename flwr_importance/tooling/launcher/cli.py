"""Run ``flwr run`` on a project-local, self-contained Flower simulation.

The command line of :mod:`flwr_importance.tooling.launcher`: one
:func:`~.simulation.flwr_run`, or ``--compare`` strategies
(:func:`~.compare.compare_strategies`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from flwr_importance.tooling.launcher.compare import (
    COMPARISON_JSON,
    COMPARISON_PLOT,
    compare_strategies,
)
from flwr_importance.tooling.launcher.processes import RunFailedError
from flwr_importance.tooling.launcher.simulation import (
    ONE_CPU_PER_CLIENTAPP,
    flwr_run,
    server_app_error,
)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    """Turn SIGTERM into ``SystemExit``, so ``finally`` blocks stop what was started."""
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: one ``flwr run``, or ``--compare`` strategies."""
    parser = argparse.ArgumentParser(
        prog="python -m flwr_importance.tooling.launcher",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--app", type=Path, default=Path.cwd())
    parser.add_argument(
        "--num-supernodes",
        type=int,
        help="default: the run config's num-supernodes, else Flower's default",
    )
    parser.add_argument(
        "--run-config", type=Path, help="TOML file of run-config overrides"
    )
    parser.add_argument("--flwr-home", type=Path)
    parser.add_argument(
        "--client-cpus",
        # Flower's federation config takes a whole number of CPUs.
        type=int,
        default=ONE_CPU_PER_CLIENTAPP["client-resources-num-cpus"],
        help="CPUs Ray reserves per ClientApp (Flower's own default is 2)",
    )
    parser.add_argument(
        "--compare",
        metavar="BASELINE,STRATEGY[,...]",
        help="run each strategy (comma-separated, the baseline first) through its "
        "own flwr run with the same run config, then print a table and write "
        f"{COMPARISON_JSON} and {COMPARISON_PLOT} into the output dir",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        help="--compare's base output dir (default: the run config's output-dir)",
    )
    args = parser.parse_args(argv)
    federation_config = {"client-resources-num-cpus": args.client_cpus}
    # `kill` and `timeout` send SIGTERM: unwind like Ctrl-C, stopping the SuperLink.
    previous_sigterm_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if args.compare is None:
            completed = flwr_run(
                args.app,
                num_supernodes=args.num_supernodes,
                run_config=args.run_config,
                flwr_home=args.flwr_home,
                federation_config=federation_config,
            )
            error = server_app_error(completed.stdout + completed.stderr)
            if completed.returncode != 0 and error:
                print(f"error: the run failed: {error}", file=sys.stderr)
            return completed.returncode
        result = compare_strategies(
            args.app,
            [name.strip() for name in args.compare.split(",") if name.strip()],
            run_config=args.run_config,
            output_dir=args.output_dir,
            num_supernodes=args.num_supernodes,
            flwr_home=args.flwr_home,
            federation_config=federation_config,
        )
    except KeyboardInterrupt:
        print(
            "Interrupted; every process this run started is stopped.", file=sys.stderr
        )
        return 130
    except (RunFailedError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm_handler)
    print(f"\n{result.table}\n")
    print(f"Plot written to {result.plot_path}")
    print(f"Table written to {result.json_path}")
    return 0

"""Short seeded runs along every convergence benchmark's code path, as JSON.

``python -m tests.benchmarks.seeded_runs OUT.json`` writes one JSON object: the history
of each method's headline preset run in process on 30 nodes (the path of the isfedavg,
fedsampling, variance_reduced and failures benchmarks and of the report's
in-process column), FOLB's, clustered sampling's, ISFedAvg's and FedSampling's
own run loops and a run with injected faults, each for two rounds.
``test_benchmarks_reproducible.py`` runs it in two processes with different
hash seeds and requires the same output: the report's promise that the same
seeds give the same tables.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import clustered, failures, fedsampling, folb, isfedavg
from benchmarks.harness import prepare_run
from benchmarks.report import HEADLINE_PRESETS
from simulations.inprocess import load_preset, run_inprocess

ROUNDS = 2
#: SuperNodes of each headline preset's run (the presets have 30 to 120). Which
#: clients are drawn, how data is split and how replies are combined take the
#: same code path on 30 nodes as on 120; a hash-seed dependence (set or dict
#: order, ``hash()``) shows on either, and 30 nodes take less than half the time.
HEADLINE_SUPERNODES = 30
#: FedSampling's quick setting on fewer clients, two rounds.
FEDSAMPLING_SETTING = replace(
    fedsampling.setting(full=False, clamp="k"),
    num_clients=300,
    mean_size=20,
    rounds=ROUNDS,
)


def seeded_runs(work_dir: Path) -> dict[str, Any]:
    """Every run's numbers, keyed by what ran."""
    numbers: dict[str, Any] = {}
    for preset in HEADLINE_PRESETS.values():
        rows, _ = run_inprocess(
            {
                **load_preset(preset),
                "num-server-rounds": ROUNDS,
                "output-dir": str(work_dir / preset),
            },
            num_clients=HEADLINE_SUPERNODES,
        )
        numbers[f"in-process {preset}"] = rows
    folb_run = folb.run_once(
        {**load_preset("folb-digits"), "num-server-rounds": ROUNDS, "seed": 0}
    )
    numbers["folb run_once"] = [folb_run.accuracy, folb_run.train_loss]
    numbers["clustered run_once"] = clustered.run_once(
        {
            **load_preset("clustered-digits"),
            "num-server-rounds": ROUNDS,
            "output-dir": str(work_dir / "clustered"),
        }
    ).accuracy
    numbers["failures run_once"] = failures.run_once(
        "ocs", 0.3, 0, replace(failures.QUICK, rounds=ROUNDS), work_dir / "failures"
    )
    numbers["fedsampling run_seed"] = fedsampling.run_seed(
        FEDSAMPLING_SETTING,
        {
            "method": "fedsampling",
            "epsilon": 3.0,
            "matched": True,
            "learning-rate": 0.1,
        },
        0,
    ).curve
    logistic = replace(isfedavg.problems(full=False)[1], rounds=ROUNDS)
    for method in ("fedavg-matched", "isfedavg-true"):
        numbers[f"isfedavg run_seed {method}"] = isfedavg.run_seed(
            logistic, isfedavg.METHODS[method], 0
        ).curve
    return numbers


def main() -> None:
    """Write :func:`seeded_runs` as JSON to the file named on the command line."""
    prepare_run()
    with tempfile.TemporaryDirectory() as work_dir:
        numbers = seeded_runs(Path(work_dir))
    Path(sys.argv[1]).write_text(json.dumps(numbers, sort_keys=True))


if __name__ == "__main__":
    main()

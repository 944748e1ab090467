"""``--compare``: strategies run one after another through ``flwr run``, then compared.

:func:`compare_strategies` runs each strategy through its own
:func:`~flwr_importance.tooling.launcher.simulation.flwr_run` with the same run
config and seed, the first the baseline, and writes the table
(:mod:`flwr_importance.tooling.comparison`) and one plot of every strategy's
curves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flwr_importance.tooling.comparison import (
    Comparison,
    compare_histories,
    format_table,
    plot_comparison,
    write_comparison,
)
from flwr_importance.tooling.launcher.processes import RunFailedError
from flwr_importance.tooling.launcher.simulation import (
    app_default_config,
    flwr_run,
    load_run_config,
    server_app_error,
    supernodes_for_run,
)

#: The file ``--compare`` writes its table into, in the base output folder.
COMPARISON_JSON = "comparison.json"
#: The file ``--compare`` draws every strategy's curves into, beside the table.
COMPARISON_PLOT = "comparison.png"


@dataclass(frozen=True)
class ComparisonRun:
    """What :func:`compare_strategies` produced.

    Both files are written by the time it is returned; :func:`~.cli.main` prints
    ``table`` and the two paths.

    Attributes
    ----------
    comparison : Comparison
        The numbers behind the table: the target, how it was fixed, and one
        result per strategy, the baseline first.
    table : str
        A title line (the strategies, the run config's source, the number of
        SuperNodes and the seed), then the target rule and the Markdown table
        of :func:`~flwr_importance.tooling.comparison.format_table`.
    json_path : Path
        :data:`COMPARISON_JSON` in the base output folder: the table, the
        shared run config, each run's folder.
    plot_path : Path
        :data:`COMPARISON_PLOT` in the base output folder: every strategy's
        curves in one figure.
    output_dirs : dict[str, Path]
        Strategy -> the ``output-dir`` its run wrote ``history.json`` into.
    """

    comparison: Comparison
    table: str
    json_path: Path
    plot_path: Path
    output_dirs: dict[str, Path]


def compare_strategies(
    app_dir: Path,
    strategies: Sequence[str],
    *,
    run_config: Path | Mapping[str, object] | None = None,
    output_dir: Path | None = None,
    num_supernodes: int | None = None,
    flwr_home: Path | None = None,
    timeout: float | None = None,
    capture: bool = False,
    federation_config: Mapping[str, object] | None = None,
) -> ComparisonRun:
    """Run each strategy through its own ``flwr run``; compare them with the first.

    Every run gets the same run config (hence the same ``seed``: same data
    partition, same initial model) except ``strategy`` and ``output-dir``
    (``<output_dir>/<strategy>``), on the same number of SuperNodes, one after
    the other; each stops everything it started before the next begins
    (:func:`flwr_run`). The app must honour the ``strategy`` and
    ``output-dir`` run-config keys and write ``history.json`` there, as this
    project's simulation app does.

    Parameters
    ----------
    app_dir : Path
        The Flower App.
    strategies : sequence of str
        Two or more distinct ``strategy`` values; the first is the baseline
        the target is fixed from
        (:func:`~flwr_importance.tooling.comparison.compare_histories`).
    run_config : Path or mapping, optional
        Run-config overrides shared by every run (a preset TOML file or a mapping).
    output_dir : Path, optional
        Base output folder; by default the run config's ``output-dir`` (the
        preset's, else the app's). ``comparison.json`` and ``comparison.png``
        go there.
    num_supernodes, flwr_home, timeout, capture, federation_config
        As in :func:`flwr_run` (``timeout`` per run).

    Returns
    -------
    ComparisonRun
        The comparison, its table and the files written.

    Raises
    ------
    ValueError
        Fewer than two strategies, or one listed twice.
    RunFailedError
        A run failed or wrote no ``history.json``; the runs after it are not
        started.
    """
    if len(strategies) < 2 or len(set(strategies)) != len(strategies):
        raise ValueError(
            f"--compare needs two or more distinct strategies, got {list(strategies)}"
        )
    app_dir = app_dir.resolve()
    shared = load_run_config(run_config)
    app_defaults = app_default_config(app_dir)
    base_dir = (
        output_dir
        or Path(
            str(shared.get("output-dir", app_defaults.get("output-dir", "outputs")))
        )
    ).resolve()
    # Resolved once: one warning, and every run on the same federation.
    num_supernodes = supernodes_for_run(app_dir, shared, num_supernodes)
    output_dirs = {strategy: base_dir / strategy for strategy in strategies}
    histories: dict[str, list[dict[str, float]]] = {}
    for index, strategy in enumerate(strategies, start=1):
        history_path = output_dirs[strategy] / "history.json"
        # A history left by an earlier run must not pass for this run's.
        history_path.unlink(missing_ok=True)
        print(
            f"=== [{index}/{len(strategies)}] flwr run: strategy={strategy}, "
            f"{num_supernodes} SuperNodes, output in {output_dirs[strategy]}",
            flush=True,
        )
        started = time.monotonic()
        completed = flwr_run(
            app_dir,
            num_supernodes=num_supernodes,
            run_config={
                **shared,
                "strategy": strategy,
                "output-dir": str(output_dirs[strategy]),
            },
            flwr_home=flwr_home,
            timeout=timeout,
            capture=capture,
            federation_config=federation_config,
        )
        if completed.returncode != 0:
            output = (completed.stdout or "")[-3000:] + (completed.stderr or "")[-3000:]
            error = server_app_error(completed.stdout + completed.stderr)
            raise RunFailedError(
                f"flwr run of strategy={strategy} exited with "
                f"{completed.returncode}{f': {error}' if error else ''}\n{output}"
            )
        if not history_path.is_file():
            raise RunFailedError(
                f"flwr run of strategy={strategy} wrote no {history_path}: the "
                "run failed (its log is above) or the app does not write "
                "history.json into its output-dir run-config value"
            )
        histories[strategy] = json.loads(history_path.read_text())
        print(
            f"=== strategy={strategy} done in {time.monotonic() - started:.0f} s",
            flush=True,
        )
    comparison = compare_histories(histories)
    seed = shared.get("seed", app_defaults.get("seed", "?"))
    source = run_config.name if isinstance(run_config, Path) else "run config"
    title = (
        f"{' vs '.join(strategies)}: {source}, {num_supernodes} SuperNodes, seed {seed}"
    )
    return ComparisonRun(
        comparison=comparison,
        table=f"{title}\n{format_table(comparison)}",
        json_path=write_comparison(
            comparison,
            base_dir / COMPARISON_JSON,
            run_config={**app_defaults, **shared, "num-supernodes": num_supernodes},
            output_dirs=output_dirs,
        ),
        plot_path=plot_comparison(
            histories, comparison, base_dir / COMPARISON_PLOT, title
        ),
        output_dirs=output_dirs,
    )

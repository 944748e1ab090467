"""``strategy = "mmfl"``: several models trained at once (MultiModelSampling).

Options: ``mmfl-variant`` (``gradnorm``, ``loss``, ``random``, ``round-robin``),
``mmfl-server-lr`` and ``mmfl-tasks``, the ``S`` learning tasks as a
comma-separated list, one entry per model::

    dataset[:partitioning[:parameter[:model]]]

``parameter`` is ``classes-per-client`` for ``pathological``,
``dirichlet-alpha`` for ``dirichlet`` and ``lognormal-sigma`` for ``lognormal``
(empty for the others); omitted fields take the run config's ``partitioning``,
its partitioning option and ``model``. Example, five models:
``"digits:pathological:2,digits:pathological:4,digits:dirichlet:0.3,
digits:lognormal:1.8,synthetic-1-1"``. Every other setting (clients, local
steps, learning rate, seed) is shared. Each model is evaluated centrally on its
own test set; ``history.json`` holds ``loss-<s>``, ``accuracy-<s>`` and their
means over the models as ``loss`` and ``accuracy``.
"""

from __future__ import annotations

import dataclasses
import statistics

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from flwr_importance.clientapps import ClientHandler, LocalTask, TaskFactory
from flwr_importance.clientapps.variance_reduced import make_mmfl_handlers
from flwr_importance.strategies.mmfl import (
    VARIANTS,
    MultiModelSampling,
    Variant,
    pack_models,
    unpack_models,
)
from flwr_importance.tasks import Objective, evaluate
from flwr_importance.tooling.declarations import (
    CannedVariant,
    MethodTooling,
    sampling_arguments,
)
from simulations.config import ExperimentConfig, RunConfig
from simulations.task import federated_data, global_model

#: The run-config key each partitioning's ``parameter`` field sets.
PARTITIONING_PARAMETERS = {
    "pathological": "classes-per-client",
    "dirichlet": "dirichlet-alpha",
    "lognormal": "lognormal-sigma",
}


def parse_tasks(spec: str) -> list[dict[str, bool | int | float | str]]:
    """The run-config overrides of each model's task, from ``mmfl-tasks``.

    Raises
    ------
    ValueError
        For an empty list, too many fields, or a parameter given to a
        partitioning that takes none.
    """
    tasks: list[dict[str, bool | int | float | str]] = []
    for entry in spec.split(","):
        fields = entry.strip().split(":")
        if not fields[0] or len(fields) > 4:
            raise ValueError(
                f"mmfl-tasks entry {entry!r} is not "
                "dataset[:partitioning[:parameter[:model]]]"
            )
        fields += [""] * (4 - len(fields))
        dataset, partitioning, parameter, model = fields
        overrides: dict[str, bool | int | float | str] = {"dataset": dataset}
        if partitioning:
            overrides["partitioning"] = partitioning
        if parameter:
            if partitioning not in PARTITIONING_PARAMETERS:
                raise ValueError(
                    f"mmfl-tasks entry {entry!r}: partitioning {partitioning!r} "
                    "takes no parameter"
                )
            key = PARTITIONING_PARAMETERS[partitioning]
            overrides[key] = (
                int(parameter) if key == "classes-per-client" else float(parameter)
            )
        if model:
            overrides["model"] = model
        tasks.append(overrides)
    return tasks


def model_run_configs(
    run_config: RunConfig,
) -> list[dict[str, bool | int | float | str]]:
    """The run config of each model: the shared one with its task's overrides."""
    return [
        {**run_config, **overrides}
        for overrides in parse_tasks(str(run_config["mmfl-tasks"]))
    ]


def build_strategy(config: ExperimentConfig, num_clients: int) -> MultiModelSampling:
    """MMFL over the ``mmfl-tasks`` models with ``m = clients-per-round``."""
    variant = str(config.option("mmfl-variant"))
    return MultiModelSampling(
        num_models=len(parse_tasks(str(config.option("mmfl-tasks")))),
        clients_per_round=min(config.clients_per_round, num_clients),
        variant=_variant(variant),
        server_lr=float(config.option("mmfl-server-lr")),
        seed=config.seed,
        server_optimizer=config.server_optimizer(),
    )


def _variant(name: str) -> Variant:
    """``name`` as a :data:`Variant`, or a ValueError listing the valid ones."""
    for variant in VARIANTS:
        if variant == name:
            return variant
    raise ValueError(f"mmfl-variant must be one of {VARIANTS}, got {name!r}")


def client_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """The multi-model handlers; model ``s`` uses ``task_factory`` on its config."""

    def model_task(context: Context, model_index: int) -> LocalTask:
        run_config = model_run_configs(context.run_config)[model_index]
        return task_factory(dataclasses.replace(context, run_config=run_config))

    return make_mmfl_handlers(model_task)


def start_strategy(grid: Grid, config: ExperimentConfig, num_clients: int) -> Result:
    """Run MMFL with the ``S`` packed models; evaluate each on its test set.

    The strategy is the app's (:func:`simulations.server_app.build_strategy`):
    this module's, in ``CentralDP`` where the run config's ``central-dp-*``
    keys ask, built first so that a refused setting fails before any data
    is loaded.
    """
    # Imported here: the ServerApp loads this module through load_method.
    from simulations.server_app import build_strategy as build_app_strategy

    strategy = build_app_strategy(config, num_clients)
    model_configs = [
        ExperimentConfig.from_run_config(run_config)
        for run_config in model_run_configs(config.run_config)
    ]
    datasets = [federated_data(each, num_clients) for each in model_configs]
    models = [
        global_model(each, data)
        for each, data in zip(model_configs, datasets, strict=True)
    ]
    objectives = [Objective(data.task, l2=config.l2) for data in datasets]

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        metrics: dict[str, float] = {}
        for index, record in enumerate(unpack_models(arrays)):
            model, data = models[index], datasets[index]
            model.load_state_dict(record.to_torch_state_dict())
            result = evaluate(
                model, data.test.x, data.test.y, objectives[index], optimum=data.optimum
            )
            metrics.update({f"{key}-{index}": value for key, value in result.items()})
        for key in ("loss", "accuracy", "msd"):
            values = [
                metrics[f"{key}-{s}"]
                for s in range(len(models))
                if f"{key}-{s}" in metrics
            ]
            if len(values) == len(models):
                metrics[key] = statistics.fmean(values)
        return MetricRecord(dict(metrics))

    return strategy.start(
        grid=grid,
        initial_arrays=pack_models(
            [ArrayRecord(model.state_dict()) for model in models]
        ),
        num_rounds=config.num_server_rounds,
        evaluate_fn=central_evaluate,
    )


#: How the tests and benchmarks run the method (simulations/tooling.py).
TOOLING = MethodTooling(
    headline_preset="mmfl-digits",
    canned=(
        CannedVariant(
            label="MultiModelSampling (S=1, gradnorm)",
            arguments=sampling_arguments(num_models=1, variant="gradnorm"),
            replies={"query.norm": "norm", "train": "kept-update"},
            packed_models=True,
        ),
    ),
    equal_work=lambda work: {"mmfl-tasks": "digits", "mmfl-variant": "gradnorm"},
    smoke={"mmfl-tasks": "digits:iid,digits:iid", "clients-per-round": 4},
    benchmark="variance_reduced",
)

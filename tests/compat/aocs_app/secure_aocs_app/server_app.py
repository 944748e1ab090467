"""The ServerApp: AOCS under SecAgg+, then in the clear, on the same nodes.

Both runs use the same seed, so the strategy draws the same pools and uniforms;
the plain run sees the nodes in the same order only on the same federation
(node ids are new in every ``flwr run``), hence both in one ServerApp. Each
round's global model of each run, and the secure run's round metrics, go to
``<output-dir>/models.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Context
from flwr.common import NDArrays, Scalar, ndarrays_to_parameters
from flwr.server import Grid, LegacyContext, ServerApp, ServerConfig
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from flwr_importance import compat
from flwr_importance.compat.secure_aocs import SecureAOCSWorkflow
from secure_aocs_app.task import initial_model


def run_aocs(grid: Grid, context: Context, *, secure: bool) -> dict[str, object]:
    """One AOCS run of the run config's rounds: each round's model and metrics."""
    run_config = context.run_config
    models: list[list[list[float]]] = []

    def keep_model(
        server_round: int, weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        models.append([array.tolist() for array in weights])

    strategy = compat.OptimalClientSampling(
        clients_per_round=int(run_config["clients-per-round"]),
        approximate=True,
        aocs_iterations=int(run_config["aocs-iterations"]),
        seed=int(run_config["seed"]),
        initial_parameters=ndarrays_to_parameters(initial_model()),
        evaluate_fn=keep_model,
    )
    legacy_context = LegacyContext(
        context=context,
        config=ServerConfig(num_rounds=int(run_config["num-server-rounds"])),
        strategy=strategy,
    )
    secure_aggregation = SecAggPlusWorkflow(
        num_shares=1.0, reconstruction_threshold=0.6, max_weight=1
    )
    fit_workflow = (
        # The secure run is compared with the plain one on the same draws.
        SecureAOCSWorkflow(
            secure_aggregation=secure_aggregation, unsafe_public_draws=True
        )
        if secure
        else None
    )
    DefaultWorkflow(fit_workflow=fit_workflow)(grid, legacy_context)
    return {
        "models": models,
        "metrics": legacy_context.history.metrics_distributed_fit,
    }


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Secure AOCS, then plain AOCS; both runs' models to ``models.json``."""
    runs = {
        name: run_aocs(grid, context, secure=name == "secure")
        for name in ("secure", "plain")
    }
    output_dir = str(context.run_config["output-dir"])
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "models.json").write_text(json.dumps(runs))

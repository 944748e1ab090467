"""Seconds per round under Flower's SecAgg+ against the same strategy in the clear.

The two methods the library runs under SecAgg+ (legacy API), each at 10 and 50
nodes, once with SecAgg+ and once without, on the same nodes, seeds, model
and data:

- FedSampling: ``compat.FedSampling(secure_aggregation=workflow)`` under
  ``DefaultWorkflow(fit_workflow=workflow)``, its nodes
  ``handler_client_fn(local_task, make_fedsampling_handlers)`` inside
  ``importance_secaggplus_mod`` (the ``examples/secaggplus`` app); every node
  trains, so every node joins the secure sum;
- AOCS: ``compat.OptimalClientSampling(approximate=True)`` under
  ``DefaultWorkflow(fit_workflow=SecureAOCSWorkflow(secure_aggregation=
  workflow))``, its nodes the OCS handlers inside ``importance_secaggplus_mod``
  and ``secure_aocs_mod``; :data:`AOCS_FRACTION` of the nodes are sampled a
  round, and every node joins the secure sums of the totals and of the
  probability mass.

The plain runs are the same strategies under Flower's plain fit workflow
(``DefaultWorkflow()``; AOCS's norms, sizes and updates then travel in the
clear). Everything runs in this process on the in-process grid
(:class:`~flwr_importance.tooling.testing.InProcessGrid`): Flower's real
``DefaultWorkflow`` and ``SecAggPlusWorkflow`` (its four stages: key
agreement, Shamir shares of each node's keys, masked and quantized vectors,
unmasking), the real ClientApps and mods, and every message round-tripped
through Flower's protobuf serialization as on the wire. The time of a round
is the wall time of the whole round, server and clients together: from one
round's central evaluation to the next (the evaluation only reads the clock).
Round 1 is a warm-up (each node's first message builds its partition); the
timed rounds follow, and a run's time is their mean.

The model is small on purpose (multinomial logistic regression on the 8x8
digits, :data:`MODELS`), so the ratio shows what SecAgg+ itself costs; the
simulation app's MLP (two hidden layers of 200) shows how that cost moves
with the number of parameters (quantizing, masking and unmasking are linear
in it; the key agreement and shares are not). Each node trains
``local-steps`` SGD steps of ``batch-size`` samples on its IID share of the
digits.

Repetitions alternate plain and secure runs (plain, secure, plain, secure
...), so both see the same load over time; each side's time is the median
over repetitions, and the ratio is SecAgg+ over plain. The spread of the
per-repetition ratios goes with it, and the same ratio of this process's CPU
seconds (server and clients run in it), which other processes' load does not
inflate.

SecAgg+ runs with Flower's defaults (``max_weight``, ``clipping_range``,
``quantization_range``, ``modulus_range``) except the shares, which are the
example's (:data:`NUM_SHARES` shares of each key, :data:`RECONSTRUCTION_THRESHOLD`
of them rebuild it), and no ``timeout``. A node's key agreement and shares
then involve its ``NUM_SHARES`` neighbours, whatever the number of nodes; a
``num_shares`` given as a share of the nodes (``1.0``, every node) makes
them grow with the square of the nodes. Not included: network latency (one
process, no SuperLink), SecAgg+'s waiting for late replies (its ``timeout``:
none is set and no node drops out), and process start-up (see
``deployment_overhead``). Times vary between runs and machines.

    python -m benchmarks.secure_aggregation          # quick: 1 timed round, 2-5 runs
    python -m benchmarks.secure_aggregation --full   # 3 timed rounds, 5-10 runs
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from flwr.app import Message
from flwr.client import ClientApp
from flwr.common import NDArrays, Scalar, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    Key,
)
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow

from benchmarks.harness import (
    benchmark_parser,
    format_ratio,
    markdown_table,
    prepare_run,
)
from flwr_importance import compat
from flwr_importance.clientapps.fedsampling import make_fedsampling_handlers
from flwr_importance.clientapps.secure_aggregation import importance_secaggplus_mod
from flwr_importance.clientapps.secure_aocs import secure_aocs_mod
from flwr_importance.clientapps.variance_reduced import make_ocs_handlers
from flwr_importance.compat.secure_aocs import SecureAOCSWorkflow
from flwr_importance.tasks import FederatedSplit, get_weights
from flwr_importance.tooling.testing import InProcessGrid
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.task import federated_data, global_model, local_task

#: The section title of this benchmark in docs/results.md.
TITLE = "SecAgg+ seconds per round vs the same strategy in the clear"

METHODS = ("fedsampling", "aocs")
LABELS = {"fedsampling": "FedSampling", "aocs": "AOCS"}
#: The simulation app's models, smallest first: the first shows SecAgg+'s own
#: cost, the second how it moves with the number of parameters.
MODELS = ("logreg", "mlp")
NODE_COUNTS = (10, 50)
#: Repetitions (plain and secure runs each) per model and node count. At 50
#: nodes a secure round takes seconds: quick mode keeps the benchmark near a
#: minute, most of its repetitions on the small model's rows.
QUICK_REPETITIONS = {
    ("logreg", 10): 5,
    ("logreg", 50): 3,
    ("mlp", 10): 3,
    ("mlp", 50): 2,
}
FULL_REPETITIONS = {
    ("logreg", 10): 10,
    ("logreg", 50): 5,
    ("mlp", 10): 10,
    ("mlp", 50): 5,
}
#: Round 1 of every run is not timed (see the module docstring).
WARM_UP_ROUNDS = 1
QUICK_TIMED_ROUNDS = 1
FULL_TIMED_ROUNDS = 3
#: SecAgg+'s shares, as in ``examples/secaggplus`` (Flower's
#: flower-secure-aggregation example uses the same): the rest is Flower's
#: defaults.
NUM_SHARES = 3
RECONSTRUCTION_THRESHOLD = 2
#: What the notes and ``results.json`` say of the workflow.
SECAGGPLUS_SETTINGS = (
    "num_shares",
    "reconstruction_threshold",
    "max_weight",
    "clipping_range",
    "quantization_range",
    "modulus_range",
    "timeout",
)
#: AOCS samples this share of the nodes a round (at least 2).
AOCS_FRACTION = 0.2
#: FedSampling: samples a round, as in ``examples/secaggplus``; its size
#: bound is this multiple of the largest partition (the bound must exceed
#: every size; a loose one adds noise to the estimate).
FEDSAMPLING_SAMPLES = 64
FEDSAMPLING_EPSILON = 8.0
FEDSAMPLING_SIZE_MARGIN = 2
#: The simulation app's run config every run shares (its ``local_task``).
COMMON: dict[str, bool | int | float | str] = {
    "dataset": "digits",
    "partitioning": "iid",
    "local-lr": 0.2,
    "local-steps": 5,
    "local-epochs": 0,
    "batch-size": 16,
    "heterogeneous-steps": False,
    "seed": 0,
}
PLAIN, SECURE = "plain", "secure"
#: ``DefaultWorkflow``'s fit: SecAgg+'s, secure AOCS's, or None (in the clear).
#: Any: secure AOCS takes the ``LegacyContext`` that ``DefaultWorkflow`` hands
#: every fit workflow, where Flower's annotation says ``Context``.
FitWorkflow = Any


@dataclass(frozen=True)
class Setting:
    """One row: a method, a model and a number of nodes."""

    method: str
    model: str
    num_nodes: int

    @property
    def run_config(self) -> dict[str, bool | int | float | str]:
        """The simulation app's run config of this setting's nodes."""
        # The nodes' epsilon cap is the app's epsilon: the strategy's.
        return resolve_run_config(
            {
                **COMMON,
                "model": self.model,
                "num-supernodes": self.num_nodes,
                "fedsampling-epsilon": FEDSAMPLING_EPSILON,
            }
        )

    @property
    def split(self) -> FederatedSplit:
        """The digits over this setting's nodes (the loader memoizes it)."""
        config = ExperimentConfig.from_run_config(self.run_config)
        return federated_data(config, self.num_nodes)

    @property
    def initial_weights(self) -> NDArrays:
        """The simulation app's initial model."""
        config = ExperimentConfig.from_run_config(self.run_config)
        return get_weights(global_model(config, self.split))


@dataclass(frozen=True)
class RunRecord:
    """One run's time per round and what its replies carried.

    Attributes
    ----------
    seconds_per_round : float
        Mean wall seconds of the timed rounds.
    cpu_seconds_per_round : float
        Mean CPU seconds of this process in the timed rounds.
    messages_per_round : float
        Messages that crossed the wire a round, both ways, over all rounds.
    plaintext_replies : int
        Replies to the server with an array holding data (an update in the
        clear); 0 in a secure run.
    masked_replies : int
        Replies to the server with SecAgg+'s masked vectors; 0 in a plain run.
    """

    seconds_per_round: float
    cpu_seconds_per_round: float
    messages_per_round: float
    plaintext_replies: int
    masked_replies: int


class RoundClock:
    """The strategies' ``evaluate_fn``: the times each round's evaluation starts.

    ``DefaultWorkflow`` evaluates the initial model, then the model after each
    round, so consecutive times bound whole rounds. Wall time, and this
    process's CPU time: the server and every client run in it, so on an idle
    machine the two agree, and other processes' load inflates only the first.
    """

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __call__(
        self, server_round: int, weights: NDArrays, config: dict[str, Scalar]
    ) -> None:
        """Note the times; evaluate nothing."""
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def seconds_per_round(self, warm_up: int, *, cpu: bool = False) -> float:
        """Mean wall (or CPU) seconds of the rounds after the first ``warm_up``."""
        timed = (self.cpu if cpu else self.wall)[warm_up:]
        return (timed[-1] - timed[0]) / (len(timed) - 1)


def secaggplus_workflow() -> SecAggPlusWorkflow:
    """Flower's SecAgg+ with its defaults and the example's shares."""
    return SecAggPlusWorkflow(
        num_shares=NUM_SHARES, reconstruction_threshold=RECONSTRUCTION_THRESHOLD
    )


def secaggplus_settings() -> dict[str, Any]:
    """The settings of :func:`secaggplus_workflow`, read from it."""
    workflow = secaggplus_workflow()
    return {name: getattr(workflow, name) for name in SECAGGPLUS_SETTINGS}


def num_parameters(model: str) -> int:
    """Parameters of ``model`` on the digits."""
    weights = Setting(METHODS[0], model, NODE_COUNTS[0]).initial_weights
    return sum(array.size for array in weights)


def fedsampling_run(
    setting: Setting, workflow: SecAggPlusWorkflow | None, clock: RoundClock
) -> tuple[ClientApp, Strategy, FitWorkflow]:
    """FedSampling's ClientApp, strategy and fit workflow (as the example's)."""
    largest = max(setting.split.partition_sizes)
    app = ClientApp(
        client_fn=compat.handler_client_fn(local_task, make_fedsampling_handlers),
        mods=[importance_secaggplus_mod],
    )
    strategy = compat.FedSampling(
        samples_per_round=FEDSAMPLING_SAMPLES,
        max_size=FEDSAMPLING_SIZE_MARGIN * int(largest),
        epsilon=FEDSAMPLING_EPSILON,
        secure_aggregation=workflow,
        min_available_nodes=setting.num_nodes,
        initial_parameters=ndarrays_to_parameters(setting.initial_weights),
        evaluate_fn=clock,
    )
    return app, strategy, workflow


def aocs_run(
    setting: Setting, workflow: SecAggPlusWorkflow | None, clock: RoundClock
) -> tuple[ClientApp, Strategy, FitWorkflow]:
    """AOCS's ClientApp, strategy and fit workflow (``SecureAOCSWorkflow``)."""
    app = ClientApp(
        client_fn=compat.handler_client_fn(local_task, make_ocs_handlers),
        mods=[importance_secaggplus_mod, secure_aocs_mod],
    )
    strategy = compat.OptimalClientSampling(
        clients_per_round=max(2, round(AOCS_FRACTION * setting.num_nodes)),
        approximate=True,
        seed=int(COMMON["seed"]),
        min_available_nodes=setting.num_nodes,
        fraction_evaluate=0.0,
        initial_parameters=ndarrays_to_parameters(setting.initial_weights),
        evaluate_fn=clock,
    )
    fit_workflow = (
        None if workflow is None else SecureAOCSWorkflow(secure_aggregation=workflow)
    )
    return app, strategy, fit_workflow


#: Per method, ``(setting, SecAgg+ workflow or None, clock) -> (ClientApp,
#: strategy, fit workflow)``.
RUNS: dict[
    str,
    Callable[
        [Setting, SecAggPlusWorkflow | None, RoundClock],
        tuple[ClientApp, Strategy, FitWorkflow],
    ],
] = {"fedsampling": fedsampling_run, "aocs": aocs_run}


def timed_run(setting: Setting, *, secure: bool, rounds: int) -> RunRecord:
    """Run ``setting`` for ``rounds`` rounds, with SecAgg+ or in the clear."""
    clock = RoundClock()
    workflow = secaggplus_workflow() if secure else None
    app, strategy, fit_workflow = RUNS[setting.method](setting, workflow, clock)
    run_config = setting.run_config
    grid = InProcessGrid(app, setting.num_nodes, run_config, seed=0)
    grid.run_legacy(strategy, num_rounds=rounds, fit_workflow=fit_workflow)
    replies = [
        record.message() for record in grid.wire_log if record.direction == "to-server"
    ]
    return RunRecord(
        seconds_per_round=clock.seconds_per_round(WARM_UP_ROUNDS),
        cpu_seconds_per_round=clock.seconds_per_round(WARM_UP_ROUNDS, cpu=True),
        messages_per_round=len(grid.wire_log) / rounds,
        plaintext_replies=sum(carries_plain_arrays(reply) for reply in replies),
        masked_replies=sum(carries_masked_vectors(reply) for reply in replies),
    )


def carries_plain_arrays(message: Message) -> bool:
    """Whether ``message`` holds an array with data.

    Flower's legacy replies without parameters carry one data-less
    placeholder array; an error reply has no content at all.
    """
    return message.has_content() and any(
        array.data
        for record in message.content.array_records.values()
        for array in record.values()
    )


def carries_masked_vectors(message: Message) -> bool:
    """Whether ``message`` is a node's SecAgg+ reply with its masked vectors."""
    if not message.has_content():
        return False
    configs = message.content.config_records.get(RECORD_KEY_CONFIGS)
    return configs is not None and Key.MASKED_PARAMETERS in configs


def measure(
    settings: Sequence[Setting], *, repetitions: int, rounds: int
) -> dict[Setting, dict[str, list[RunRecord]]]:
    """Each setting's plain and secure runs, alternating, ``repetitions`` times.

    Returns, per setting, the records of its plain and of its secure runs,
    in repetition order.
    """
    records: dict[Setting, dict[str, list[RunRecord]]] = {
        setting: {PLAIN: [], SECURE: []} for setting in settings
    }
    for _ in range(repetitions):
        for setting in settings:
            for side in (PLAIN, SECURE):
                record = timed_run(setting, secure=side == SECURE, rounds=rounds)
                records[setting][side].append(record)
    return records


def row(setting: Setting, runs: Mapping[str, Sequence[RunRecord]]) -> dict[str, Any]:
    """A setting's medians, their ratios and the spread of the paired ratios.

    The wall seconds give the ratio; the CPU seconds' ratio goes with it.
    """
    paired = [
        secure.seconds_per_round / plain.seconds_per_round
        for plain, secure in zip(runs[PLAIN], runs[SECURE], strict=True)
    ]
    wall = median_seconds(runs, "seconds_per_round")
    cpu = median_seconds(runs, "cpu_seconds_per_round")
    return {
        **asdict(setting),
        "repetitions": len(paired),
        "plain_seconds_per_round": wall[PLAIN],
        "secure_seconds_per_round": wall[SECURE],
        "ratio": wall[SECURE] / wall[PLAIN],
        "paired_ratio_range": [min(paired), max(paired)],
        "plain_cpu_seconds_per_round": cpu[PLAIN],
        "secure_cpu_seconds_per_round": cpu[SECURE],
        "cpu_ratio": cpu[SECURE] / cpu[PLAIN],
        **{
            f"{side}_{key}": statistics.fmean(
                getattr(record, key) for record in runs[side]
            )
            for side in (PLAIN, SECURE)
            for key in ("messages_per_round", "plaintext_replies", "masked_replies")
        },
    }


def median_seconds(
    runs: Mapping[str, Sequence[RunRecord]], key: str
) -> dict[str, float]:
    """Per side (plain, secure), the median of the runs' ``key``."""
    return {
        side: statistics.median(getattr(record, key) for record in runs[side])
        for side in (PLAIN, SECURE)
    }


def overhead_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a markdown table."""
    columns = [
        "method",
        "model",
        "nodes",
        "repetitions",
        "plain s per round",
        "SecAgg+ s per round",
        "ratio (per-repetition range)",
        "CPU-time ratio",
        "messages per round, plain / SecAgg+",
        "replies with arrays in the clear, plain / SecAgg+",
        "masked replies, SecAgg+",
    ]
    cells = [
        [
            LABELS[item["method"]],
            item["model"],
            item["num_nodes"],
            item["repetitions"],
            f"{item['plain_seconds_per_round']:.3f}",
            f"{item['secure_seconds_per_round']:.3f}",
            f"{format_ratio(item['ratio'])} "
            f"({item['paired_ratio_range'][0]:.2f}-"
            f"{item['paired_ratio_range'][1]:.2f})",
            format_ratio(item["cpu_ratio"]),
            f"{item['plain_messages_per_round']:.0f} / "
            f"{item['secure_messages_per_round']:.0f}",
            f"{item['plain_plaintext_replies']:.0f} / "
            f"{item['secure_plaintext_replies']:.0f}",
            f"{item['secure_masked_replies']:.0f}",
        ]
        for item in rows
    ]
    return markdown_table(columns, cells)


def summary_text(
    rows: Sequence[Mapping[str, Any]],
    *,
    timed_rounds: int,
    parameters: Mapping[str, int],
) -> str:
    """``summary.md``: the setting, the table and what it leaves out."""
    models = ", ".join(
        f"`{model}` ({count:,} parameters)" for model, count in parameters.items()
    )
    secaggplus = ", ".join(
        f"{name} = {value}" for name, value in secaggplus_settings().items()
    )
    return (
        "# SecAgg+ seconds per round\n\n"
        "Wall seconds of a whole round (server and in-process clients: Flower's "
        "real `DefaultWorkflow` and `SecAggPlusWorkflow` on the in-process grid, "
        "every message serialized as on the wire) of each method with SecAgg+ "
        "and in the clear, on the same nodes, seeds, model and data: digits, "
        f"IID, {COMMON['local-steps']} local SGD steps of {COMMON['batch-size']} "
        f"samples, models {models}; the small one shows SecAgg+'s own cost. "
        f"FedSampling trains every node ({FEDSAMPLING_SAMPLES} samples a round) "
        "and sums every node's update securely; AOCS samples "
        f"{AOCS_FRACTION:.0%} of the nodes, and every node joins its secure sums "
        "of totals and probability mass (`SecureAOCSWorkflow`). Round 1 is a "
        f"warm-up, then {timed_rounds} timed "
        f"round{'s' if timed_rounds > 1 else ''} a run; repetitions alternate "
        "plain and SecAgg+ runs, each side's time is the median over them, the "
        "ratio SecAgg+ / plain (in brackets: the lowest and highest ratio of "
        "one repetition's pair). The CPU-time ratio is the same of this "
        "process's CPU seconds (server and clients run in it), which other "
        "processes' load does not inflate. SecAgg+: Flower's defaults but the "
        f"shares, as in `examples/secaggplus`: {secaggplus}. Each node's key "
        "agreement and Shamir shares grow with its num_shares neighbours, not "
        "with the nodes; a num_shares given as a share of the nodes (1.0: every "
        "node) makes the round's grow with the square of the nodes. Not included: "
        "network latency (one process, no SuperLink), SecAgg+'s timeout (none "
        "set, no node drops out), process start-up (`deployment_overhead`). The "
        "reply columns check the masking: in a SecAgg+ run no reply reaches "
        "the server with an array in the clear. Times vary between runs and "
        "machines.\n\n"
        f"{overhead_table(rows)}\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Time every method plain and under SecAgg+; write the table and JSON."""
    args = benchmark_parser("secure_aggregation", __doc__).parse_args(argv)
    prepare_run()
    repetitions = FULL_REPETITIONS if args.full else QUICK_REPETITIONS
    timed_rounds = FULL_TIMED_ROUNDS if args.full else QUICK_TIMED_ROUNDS
    rounds = WARM_UP_ROUNDS + timed_rounds
    args.output_dir.mkdir(parents=True, exist_ok=True)
    # Imports, the digits split and first calls happen here, untimed.
    warm_up = [Setting(method, MODELS[0], NODE_COUNTS[0]) for method in METHODS]
    measure(warm_up, repetitions=1, rounds=rounds)
    rows = []
    for model, num_nodes in repetitions:
        settings = [Setting(method, model, num_nodes) for method in METHODS]
        records = measure(
            settings, repetitions=repetitions[model, num_nodes], rounds=rounds
        )
        for setting in settings:
            rows.append(row(setting, records[setting]))
            print(json.dumps(rows[-1]), flush=True)
    parameters = {model: num_parameters(model) for model in MODELS}
    results = {
        "mode": "full" if args.full else "quick",
        "timed_rounds": timed_rounds,
        "warm_up_rounds": WARM_UP_ROUNDS,
        "settings": {**COMMON},
        "parameters": parameters,
        "secaggplus": secaggplus_settings(),
        "rows": rows,
    }
    (args.output_dir / "results.json").write_text(json.dumps(results, indent=1))
    text = summary_text(rows, timed_rounds=timed_rounds, parameters=parameters)
    (args.output_dir / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""Server time per round of every strategy against Flower's ``FedAvg``.

Times ``configure_train`` + ``aggregate_train`` of each strategy of the library
at 100, 1,000 and 10,000 nodes with a 1M-parameter model, without clients: a
fake grid (:class:`~flwr_importance.tooling.testing.CannedReplyGrid`) answers every
message at once with a pre-built reply of the shape the strategy's client
contract asks for (the model-shaped arrays, the metrics, the query answers,
:func:`~flwr_importance.tooling.testing.canned_responders`), so only server work is
timed. The grid's own time (building reply messages) is measured and
subtracted.

Memory: the replies carry one of ``REPLY_POOL`` distinct model-shaped
``ArrayRecord`` objects, by node (10,000 distinct replies x 1M float32 would
be 40 GB). The pool (128 MB) is larger than any CPU cache, so each reply's
bytes are read from memory as a real one's would be; each strategy reads,
checks and adds every reply's arrays as it would real ones.

Each strategy trains ``m`` nodes per round: ``m = 10%`` of the nodes, at most
``MAX_TRAINED``. Its baseline is Flower's ``FedAvg``
aggregating as many replies, timed in the same run; FedSampling trains every
node, so its baseline is ``FedAvg`` over all nodes. A FOLB reply carries two
model-sized ArrayRecords (the update and the gradient eq. 13 needs), so its
baseline is ``FedAvg`` over ``2m`` nodes: as many model-sized arrays received
(its ratio to ``FedAvg`` over ``m`` nodes is reported too). MMFL runs one model
(``S = 1``, variant ``gradnorm``) so it handles the same 1M parameters.
Clustered sampling with similarity (Algorithm 2) keeps one representative
gradient per node: it runs with ``projection_dim = 1024`` (full rows would be
N x 4 MB) and its clustering time (distances, Ward linkage, distributions and
storing the gradients) is reported in its own column.

The projection is a CountSketch drawn once from the seed (a blocked hash:
one shift per block of ``PROJECTION_DIM`` parameters, one sign per parameter)
and applied to each returned update in ``O(d)``.

Round 1 is a warm-up (MD and clustered sampling query sizes
once); the time is that of the fastest of the next ``repeats`` rounds. The
methods of one size run their rounds in turn (round 2 of every method, then
round 3, ...), so each strategy and its baseline are timed in the same
stretch of the run, with BLAS on one thread: every step is one core's work.

    python -m benchmarks.server_overhead          # quick: 5 timed rounds, 2 at 10,000
    python -m benchmarks.server_overhead --full   # 5 timed rounds at every size
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from matplotlib.ticker import NullFormatter, ScalarFormatter
from threadpoolctl import threadpool_limits

from benchmarks.harness import (
    benchmark_parser,
    markdown_table,
    prepare_run,
    save_figure,
)
from flwr_importance.aggregation import weighted_sum
from flwr_importance.sampling.clustered import EXACT_WARD_LIMIT
from flwr_importance.strategies.arrays import all_finite, array_values, combine_arrays
from flwr_importance.strategies.clustered import ClusteredSampling
from flwr_importance.strategies.mmfl import pack_models
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.tooling.testing.canned import (
    FEDAVG_REPLIES,
    CannedReplyGrid,
    Fleet,
    canned_responders,
    canned_strategy,
)
from simulations.tooling import canned_variants

#: The section title of this benchmark in docs/results.md.
TITLE = "Server time per round vs Flower's FedAvg"

#: Layer shapes of the benchmark model: 1,000,656 parameters.
MODEL_SHAPES = {
    "hidden.weight": (1024, 768),
    "hidden.bias": (1024,),
    "output.weight": (208, 1024),
    "output.bias": (208,),
}
MAX_TRAINED = 100
TARGET_OVERHEAD = 0.10
TARGET_NODES = 1_000
PROJECTION_DIM = 1024

REPLY_POOL = 32

NODE_COUNTS = (100, 1_000, 10_000)
#: The available pool of the pooled OCS/AOCS rows, in multiples of ``m``.
POOL_FACTOR = 4
#: Timed rounds per size in quick mode: at 10,000 nodes one round of FedAvg over
#: all nodes (FedSampling's baseline) alone takes about 20 s.
QUICK_REPEATS = {100: 5, 1_000: 5, 10_000: 2}
FULL_REPEATS = 5
SCALING_NOTE = (
    "At 10,000 nodes OCS and MMFL ask every node for its update norm each round, "
    "so their configure_train grows with the node count while FedAvg's, which "
    "samples without asking, stays flat; with an available pool "
    f"(pool_size = {POOL_FACTOR}m, the cross-device setting) OCS and AOCS ask "
    "only the "
    "pool, and their rows compare with FedAvg over m nodes; Algorithm 2's "
    "hierarchical clustering "
    "grows with the square of the number of clients it clusters (the clustering "
    f"column). Above {EXACT_WARD_LIMIT:,} clients its k-means level grows with "
    "the number of "
    "clients that have returned an update, and the fastest timed round is an "
    "early one (round 2: only round 1's m clients have one), so the 10,000-node "
    "row is Algorithm 2 before most clients have been sampled; once every "
    "client has returned an update its clustering costs several times more."
)
COST_NOTE = (
    "Sampling itself is cheap (the configure_train column, queries included). "
    "Per reply, Flower's FedAvg copies each array out of the message "
    "(Array.numpy), scales the copy and adds it to a float32 sum. The library's "
    "strategies read each array in place (array_values: a view of the message's "
    "bytes), check it for NaN/inf (all_finite: one BLAS sum of squares) and add "
    "it, scaled, to a sum in the model's dtype (combine_arrays), so checking "
    "costs less than FedAvg's copy. FOLB also receives a model-sized gradient "
    "per reply and computes its inner product with the mean gradient and its "
    "norm in float64, streamed in blocks (eq. 13): two model-sized arrays per "
    "reply where FedAvg reads one."
)


def benchmark_model(seed: int = 0) -> ArrayRecord:
    """A float32 model with the layer shapes of :data:`MODEL_SHAPES`."""
    rng = np.random.default_rng(seed)
    return ArrayRecord.from_array_dict(
        {
            name: Array(rng.standard_normal(shape).astype(np.float32) * 0.01)
            for name, shape in MODEL_SHAPES.items()
        }
    )


def trained_per_round(num_nodes: int) -> int:
    """``m``: 10% of the nodes, at most :data:`MAX_TRAINED`."""
    return max(1, min(MAX_TRAINED, num_nodes // 10))


def benchmark_fleet(num_nodes: int, seed: int = 0) -> Fleet:
    """Skewed sizes and norms, :data:`REPLY_POOL` distinct 1M-parameter replies."""
    return Fleet.skewed(
        num_nodes=num_nodes,
        model=benchmark_model(seed),
        reply_models=[benchmark_model(seed + 1 + index) for index in range(REPLY_POOL)],
        seed=seed,
    )


def build_strategy(method: str, num_nodes: int, fleet: Fleet) -> Strategy:
    """The strategy ``method`` training ``m`` nodes per round (all: FedSampling)."""
    m = trained_per_round(num_nodes)
    if method == "fedavg":
        return FedAvg(
            fraction_train=m / num_nodes,
            min_train_nodes=m,
            fraction_evaluate=0.0,
            min_available_nodes=1,
        )
    if method == "fedavg-2m":
        return FedAvg(
            fraction_train=2 * m / num_nodes,
            min_train_nodes=2 * m,
            fraction_evaluate=0.0,
            min_available_nodes=1,
        )
    if method == "fedavg-all":
        return FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=1)
    if method in POOLED:
        return OptimalClientSampling(
            clients_per_round=m,
            pool_size=POOL_FACTOR * m,
            fraction_evaluate=0.0,
            approximate=POOLED[method],
        )
    if method not in VARIANTS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    return canned_strategy(
        *VARIANTS[method],
        clients_per_round=m,
        fleet=fleet,
        projection_dim=PROJECTION_DIM,
    )


#: OCS and AOCS over an available pool of ``POOL_FACTOR * m`` nodes (the
#: cross-device setting, ``pool_size``): only the pool is queried and trains,
#: so their baseline is FedAvg over ``m`` nodes; their replies are OCS's. The
#: value: whether the row is AOCS.
POOLED: dict[str, bool] = {"ocs-pool": False, "aocs-pool": True}
#: Every canned variant of every registry method, by variant name.
VARIANTS = canned_variants()
#: Compared methods: every canned variant of every registry method, each with
#: the Flower FedAvg that does the same client work, and the pooled OCS/AOCS.
METHODS: dict[str, str] = {
    **{name: variant.baseline for name, (_, variant) in VARIANTS.items()},
    **dict.fromkeys(POOLED, "fedavg"),
}
#: Flower's FedAvg over m nodes, over all nodes, over 2m nodes.
BASELINES = ("fedavg", "fedavg-all", "fedavg-2m")
LABELS = {
    "fedavg": "Flower FedAvg (m nodes)",
    "fedavg-all": "Flower FedAvg (all nodes)",
    "fedavg-2m": "Flower FedAvg (2m nodes)",
    **{name: variant.label for name, (_, variant) in VARIANTS.items()},
    "ocs-pool": f"OptimalClientSampling (pool n = {POOL_FACTOR}m)",
    "aocs-pool": f"OptimalClientSampling (AOCS, pool n = {POOL_FACTOR}m)",
}


@dataclass
class ClusteringClock:
    """Time a ClusteredSampling spends on Algorithm 2's clustering work.

    Wraps, on one strategy instance, the storing of representative gradients
    and the computation of the distributions from their distances.
    """

    seconds: float = 0.0

    def attach(self, strategy: ClusteredSampling) -> None:
        """Wrap the strategy's clustering steps with this clock."""
        for name in ("record_updates", "distributions"):
            setattr(strategy, name, self._timed(getattr(strategy, name)))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


@dataclass(frozen=True)
class Timing:
    """Mean seconds per round of one strategy at one size."""

    method: str
    num_nodes: int
    trained: float
    configure: float
    aggregate: float
    clustering: float | None

    @property
    def total(self) -> float:
        """``configure_train`` + ``aggregate_train``."""
        return self.configure + self.aggregate


class RoundClock:
    """One strategy on its own canned grid, run and timed one round at a time.

    The grid answers with replies from ``fleet``, which every clock of a size
    shares (the same replies, built once).
    """

    def __init__(self, method: str, num_nodes: int, fleet: Fleet) -> None:
        self.method = method
        self.num_nodes = num_nodes
        self.grid = CannedReplyGrid(num_nodes, {})
        replies = (
            FEDAVG_REPLIES
            if method in BASELINES
            else VARIANTS["ocs" if method in POOLED else method][1].replies
        )
        self.grid.responders = canned_responders(
            replies, fleet=fleet, node_index=self.grid.node_index
        )
        self.strategy = build_strategy(method, num_nodes, fleet)
        self.clustering = ClusteringClock()
        if method == "clustered-similarity":
            assert isinstance(self.strategy, ClusteredSampling)
            self.clustering.attach(self.strategy)
        packed = method in VARIANTS and VARIANTS[method][1].packed_models
        self.arrays = pack_models([fleet.model]) if packed else fleet.model
        self.fleet = fleet
        self.server_round = 0

    def prefill(self) -> None:
        """Algorithm 2 in its steady state: every node holds a representative gradient.

        Two untimed rounds around every node's reply stored as its update
        (as if each had been drawn once): the first queries the sizes, the
        second clusters all ``N`` gradients from scratch (the two-level
        clustering's cold path), so the next round is a warm one.
        """
        assert isinstance(self.strategy, ClusteredSampling)
        self.next_round()
        self.strategy.record_updates(
            {
                node_id: self.fleet.reply_model(self.grid.node_index(node_id))
                for node_id in self.grid.get_node_ids()
            },
            self.fleet.model,
        )
        self.next_round()

    def next_round(self) -> Timing:
        """Run the next round; its server time, the grid's own time subtracted."""
        self.server_round += 1
        self.grid.reset_clock()
        self.clustering.seconds = 0.0
        start = time.perf_counter()
        messages = list(
            self.strategy.configure_train(
                self.server_round, self.arrays, ConfigRecord(), self.grid
            )
        )
        configured = time.perf_counter()
        query_seconds = self.grid.seconds
        replies = list(self.grid.send_and_receive(messages))
        aggregate_start = time.perf_counter()
        new_arrays, _ = self.strategy.aggregate_train(self.server_round, replies)
        end = time.perf_counter()
        if new_arrays is None:
            raise RuntimeError(
                f"{self.method} aggregated nothing in round {self.server_round}"
            )
        return Timing(
            self.method,
            self.num_nodes,
            len(replies),
            configured - start - query_seconds,
            end - aggregate_start,
            self.clustering.seconds if self.method == "clustered-similarity" else None,
        )


def time_interleaved(
    methods: Sequence[str], num_nodes: int, repeats: int
) -> list[Timing]:
    """Each method's fastest of rounds ``2..repeats+1``, the methods in turn.

    Round after round, every method runs its next round before any runs the
    one after, so a strategy and its baseline are timed in the same stretch
    of the run, under the same load from whatever else the machine runs
    (timed one method after the other, a baseline could meet a busier or a
    quieter machine than the strategies compared with it).  Round 1 is a
    warm-up (one-time size queries).  Algorithm 2 first runs its untimed
    :meth:`RoundClock.prefill`, so every round of it timed is a steady-state
    round (every node holds a representative gradient; its round 1 here is
    the first warm one).
    """
    fleet = benchmark_fleet(num_nodes)
    clocks = [RoundClock(method, num_nodes, fleet) for method in methods]
    for clock in clocks:
        if clock.method == "clustered-similarity":
            clock.prefill()
    timed: list[list[Timing]] = [[] for _ in methods]
    # BLAS on one thread, as every other step runs (Flower's FedAvg calls no
    # BLAS): on a machine shared with other work, OpenBLAS's second thread
    # made one and the same matrix-vector product take from 0.02 to 14 ms.
    with threadpool_limits(limits=1, user_api="blas"):
        for server_round in range(1, repeats + 2):
            for clock, rounds in zip(clocks, timed, strict=True):
                timing = clock.next_round()
                if server_round > 1:
                    rounds.append(timing)
    return [fastest_round(rounds) for rounds in timed]


def fastest_round(rounds: Sequence[Timing]) -> Timing:
    """The timed round with the shortest total time.

    As ``timeit`` advises: a slower round measures what else the machine was
    doing (one round in a run took 10x the others), not the strategy; every
    strategy and its baseline are measured the same way.
    """
    return min(rounds, key=lambda timing: timing.total)


def ratio_rows(timings: Sequence[Timing]) -> list[dict[str, Any]]:
    """Per strategy and size: its time, its baseline's and the overhead."""
    by_key = {(t.method, t.num_nodes): t for t in timings}
    rows = []
    for timing in timings:
        baseline_method = METHODS.get(timing.method)
        if baseline_method is None:
            continue
        baseline = by_key[(baseline_method, timing.num_nodes)]
        without_clustering = timing.total - (timing.clustering or 0.0)
        rows.append(
            {
                "method": timing.method,
                "label": LABELS[timing.method],
                "num_nodes": timing.num_nodes,
                "trained": timing.trained,
                "configure_s": timing.configure,
                "aggregate_s": timing.aggregate,
                "total_s": timing.total,
                "clustering_s": timing.clustering,
                "baseline": baseline_method,
                "baseline_label": LABELS[baseline_method],
                "baseline_s": baseline.total,
                "ratio": timing.total / baseline.total,
                "ratio_without_clustering": without_clustering / baseline.total,
                "ratio_to_m_nodes": timing.total
                / by_key[("fedavg", timing.num_nodes)].total,
            }
        )
    return rows


def meets_target(row: Mapping[str, Any]) -> bool | None:
    """Whether the row meets the 10% target (None: not a target row)."""
    if row["num_nodes"] != TARGET_NODES:
        return None
    return bool(row["ratio_without_clustering"] <= 1.0 + TARGET_OVERHEAD)


def overhead_table(timings: Sequence[Timing], rows: Sequence[dict[str, Any]]) -> str:
    """Baselines, then every strategy with its ratio, per number of nodes."""
    columns = [
        "nodes",
        "strategy",
        "trained/round",
        "configure_train (ms)",
        "aggregate_train (ms)",
        "total (ms)",
        "clustering (ms)",
        "vs FedAvg",
        f"target (<= {1 + TARGET_OVERHEAD:.2f} at {TARGET_NODES:,})",
    ]
    # A baseline is its own reference: no clustering, ratio 1, no target.
    cells = [
        [
            f"{timing.num_nodes:,}",
            LABELS[timing.method],
            f"{timing.trained:.0f}",
            f"{timing.configure * 1e3:.1f}",
            f"{timing.aggregate * 1e3:.1f}",
            f"{timing.total * 1e3:.1f}",
            "",
            "1.00",
            "",
        ]
        for timing in timings
        if timing.method not in METHODS
    ]
    for row in rows:
        verdict = meets_target(row)
        clustering = (
            f"{row['clustering_s'] * 1e3:.1f}"
            if row["clustering_s"] is not None
            else ""
        )
        ratio = f"{row['ratio']:.2f}"
        if row["clustering_s"] is not None:
            ratio += f" ({row['ratio_without_clustering']:.2f} without clustering)"
        if row["baseline"] == "fedavg-2m":
            ratio += f" ({row['ratio_to_m_nodes']:.2f} vs FedAvg over m nodes)"
        cells.append(
            [
                f"{row['num_nodes']:,}",
                LABELS[row["method"]],
                f"{row['trained']:.0f}",
                f"{row['configure_s'] * 1e3:.1f}",
                f"{row['aggregate_s'] * 1e3:.1f}",
                f"{row['total_s'] * 1e3:.1f}",
                clustering,
                ratio,
                "" if verdict is None else ("yes" if verdict else "NO"),
            ]
        )
    return markdown_table(columns, cells)


#: Candidate ticks of the plot's log-scale ratio axis.
RATIO_TICKS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0)


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Ratio to FedAvg against the number of nodes, one line per strategy."""
    figure, axes = plt.subplots(figsize=(9, 4))
    for method in METHODS:
        points = [row for row in rows if row["method"] == method]
        axes.plot(
            [row["num_nodes"] for row in points],
            [row["ratio_without_clustering"] for row in points],
            "o-",
            label=LABELS[method],
        )
    axes.axhline(
        1.0 + TARGET_OVERHEAD,
        color="grey",
        linestyle=":",
        label=f"target at {TARGET_NODES:,} nodes",
    )
    axes.set(
        xscale="log",
        yscale="log",
        xlabel="nodes",
        ylabel="server time / FedAvg's (clustering excluded)",
        title="Server time per round, 1M-parameter model",
    )
    # Ratios span 0.5 to 20 or so: log scale, but ticks written as plain numbers.
    axes.yaxis.set_major_formatter(ScalarFormatter())
    axes.yaxis.set_minor_formatter(NullFormatter())
    ratios = [row["ratio_without_clustering"] for row in rows]
    axes.set_yticks(
        [tick for tick in RATIO_TICKS if min(ratios) / 1.3 <= tick <= max(ratios) * 1.3]
    )
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(figure, path, dpi=110)


def best_seconds(step: Callable[[], object], repeats: int = 20) -> float:
    """Shortest of ``repeats`` timed calls of ``step``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times)


def per_reply_costs(model: ArrayRecord) -> dict[str, float]:
    """Seconds per model-sized reply of the steps the aggregations are made of.

    Sums are timed over :data:`REPLY_POOL` replies of the same record and
    divided by their number.
    """
    replies = [model] * REPLY_POOL
    weights = np.full(REPLY_POOL, 1.0 / REPLY_POOL)
    fedavg_records = [
        RecordDict({"arrays": model, "metrics": MetricRecord({"num-examples": 1})})
    ] * REPLY_POOL

    def per_reply(step: Callable[[], object]) -> float:
        return best_seconds(step) / REPLY_POOL

    return {
        "FedAvg: copy out, scale, add (aggregate_arrayrecords)": per_reply(
            lambda: aggregate_arrayrecords(fedavg_records, "num-examples")
        ),
        "copy out (Array.numpy)": best_seconds(model.to_numpy_ndarrays),
        "read in place (array_values)": best_seconds(
            lambda: [array_values(array) for array in model.values()]
        ),
        "NaN/inf check (all_finite)": best_seconds(
            lambda: [all_finite(array_values(array)) for array in model.values()]
        ),
        "scaled add in the model's dtype (combine_arrays)": per_reply(
            lambda: combine_arrays(
                replies, lambda vectors: weighted_sum(vectors, weights), model
            )
        ),
    }


def costs_table(costs: Mapping[str, float]) -> str:
    """The per-reply costs as a markdown table, relative to FedAvg's."""
    fedavg = costs["FedAvg: copy out, scale, add (aggregate_arrayrecords)"]
    return markdown_table(
        ["step, one 1M-parameter reply", "ms", "/ FedAvg's"],
        [
            [step, f"{seconds * 1e3:.2f}", f"{seconds / fedavg:.2f}"]
            for step, seconds in costs.items()
        ],
    )


def repeats_text(repeats: Mapping[int, int]) -> str:
    """``5 at 100, 5 at 1,000, 2 at 10,000 nodes``: timed rounds per size."""
    per_size = ", ".join(
        f"{count} at {num_nodes:,}" for num_nodes, count in repeats.items()
    )
    return f"{per_size} nodes"


def main(argv: Sequence[str] | None = None) -> None:
    """Time every strategy and its baseline; write the table, JSON and plot."""
    parser = benchmark_parser("server_overhead", __doc__)
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds")
    args = parser.parse_args(argv)
    prepare_run()
    repeats = {
        num_nodes: args.repeats
        or (FULL_REPEATS if args.full else QUICK_REPEATS[num_nodes])
        for num_nodes in NODE_COUNTS
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    timings = []
    for num_nodes in NODE_COUNTS:
        for timing in time_interleaved(
            (*BASELINES, *METHODS), num_nodes, repeats[num_nodes]
        ):
            print(f"{num_nodes:>6} {timing.method:<22} {timing.total * 1e3:9.1f} ms")
            timings.append(timing)
    rows = ratio_rows(timings)
    table = overhead_table(timings, rows)
    plot(rows, args.output_dir / "server_overhead.png")
    results = {
        "mode": "full" if args.full else "quick",
        "parameters": sum(int(np.prod(shape)) for shape in MODEL_SHAPES.values()),
        "repeats": {str(num_nodes): count for num_nodes, count in repeats.items()},
        "node_counts": list(NODE_COUNTS),
        "baselines": [t.__dict__ for t in timings if t.method not in METHODS],
        "rows": rows,
    }
    (args.output_dir / "results.json").write_text(json.dumps(results, indent=1))
    costs = per_reply_costs(benchmark_model())
    results["per_reply_seconds"] = costs
    text = (
        "# Server overhead per round\n\n"
        f"Model: {results['parameters']:,} float32 parameters; the fastest of the "
        f"timed rounds after a warm-up round ({repeats_text(repeats)}); times vary "
        "between runs and machines.\n\n"
        f"{table}\n\n{SCALING_NOTE}\n\n![server overhead](server_overhead.png)\n\n"
        "Where the time goes (best of 20):\n\n"
        f"{costs_table(costs)}\n\n{COST_NOTE}\n"
    )
    (args.output_dir / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()

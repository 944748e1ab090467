"""Seeded uniform client sets: the same sets per seed and round for every method.

A comparison of aggregation rules (FOLB against FedProx and FedAvg) is fair
only if, within a seed, every method trains the same clients each round; the
aggregation is then the only difference (common random numbers). FedProx's own
code does this by reseeding NumPy with the round before each draw ("make sure
for each comparison, we are selecting the same clients each round", Li et al.,
"Federated optimization in heterogeneous networks", MLSys 2020, reference
code). Here each round's generator is derived from ``(seed, round, stream)``
alone, so the draw depends on nothing a method did before it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from flwr_importance.validation import nonnegative_integer


def uniform_client_set(
    node_ids: Iterable[int],
    k: int,
    *,
    seed: int,
    server_round: int,
    replace: bool,
    stream: int = 0,
) -> list[int]:
    """``k`` uniform draws of node ids, a pure function of its arguments.

    The ids are sorted first, so the result does not depend on the order a
    grid lists them in, and the generator is
    ``numpy.random.default_rng([seed, server_round, stream])``: two strategies
    given the same nodes, seed and round draw the same clients.

    Parameters
    ----------
    node_ids : Iterable[int]
        The connected nodes (distinct ids).
    k : int
        Number of draws (>= 0); without replacement at most the number of nodes.
    seed : int
        The run's seed (>= 0).
    server_round : int
        The round (>= 0).
    replace : bool
        With replacement: ``k`` independent uniform draws, a multiset (a node
        may appear several times). Without: ``k`` distinct nodes, each set of
        ``k`` equally likely.
    stream : int
        Which independent draw of the round (>= 0): 0 for the set every method
        of a comparison shares; another value for a further, independent set
        (FOLB's second set ``S2``).

    Returns
    -------
    list[int]
        The drawn ids in draw order (repeats possible with ``replace``).

    Raises
    ------
    ValueError
        For duplicate ids, a negative ``k``, seed, round or stream, or ``k``
        larger than the number of nodes without replacement.

    Examples
    --------
    >>> nodes = [42, 7, 19, 3, 88]
    >>> first = uniform_client_set(nodes, 3, seed=0, server_round=1, replace=False)
    >>> first == uniform_client_set(
    ...     reversed(nodes), 3, seed=0, server_round=1, replace=False
    ... )
    True
    >>> len(set(first)), set(first) <= set(nodes)
    (3, True)
    >>> len(uniform_client_set(nodes, 8, seed=0, server_round=1, replace=True))
    8
    """
    population = sorted(node_ids)
    if len(set(population)) != len(population):
        raise ValueError("node_ids must be distinct")
    for name, value in (
        ("k", k),
        ("seed", seed),
        ("server_round", server_round),
        ("stream", stream),
    ):
        nonnegative_integer(name, value)
    if not replace and k > len(population):
        raise ValueError(
            f"cannot draw {k} distinct nodes out of {len(population)} without "
            "replacement"
        )
    if k > 0 and not population:
        raise ValueError(f"cannot draw {k} nodes out of none")
    rng = np.random.default_rng([seed, server_round, stream])
    picks = rng.choice(len(population), size=k, replace=replace)
    return [population[int(index)] for index in picks]

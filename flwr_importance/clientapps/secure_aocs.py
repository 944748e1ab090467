"""AOCS under SecAgg+, client side: each secure sum answered from the node's state.

:class:`~flwr_importance.compat.secure_aocs.SecureAOCSWorkflow` runs AOCS with
every private number behind Flower's SecAgg+ (docs/privacy.md). The
server's messages name their step in ``secure-aocs-step``; :func:`secure_aocs_mod`
serves them, from the update the node kept at the round's training query:

``aocs-train`` (a plain ``fit``, the norm query)
    Passed to the app, which trains and keeps ``U_i`` (as for OCS); the mod
    keeps ``v_i = n_i ||U_i||`` and ``n_i`` and strips every number from the
    reply, which reaches the server in the clear.
``aocs-totals`` (secure sum)
    ``[v_i, n_i]`` over the public bounds, and a flag per value above its
    bound (the server grows the bound and asks again).
``aocs-mass`` (secure sum)
    AOCS's ``(p_i, 1)`` if ``p_i < 1``, else ``(0, 0)``, with ``p_i`` from
    ``v_i`` and the broadcast factors (:func:`aocs_client_probs`).
``aocs-participation`` (a plain ``get_properties``)
    ``participates = 1`` iff the server's public draw ``r_i < p_i``.
``aocs-update`` (secure sum, participants only)
    ``(n_i / p_i) U_i`` over the public ``update-bound``.

Each secure vector is scaled into SecAgg+'s ``[-clipping_range,
clipping_range]`` (``clipping-range`` in the config) and sent with the public
weight ``secure-sum-weight`` (the workflow's ``max_weight``), so SecAgg+'s
weighted mean is the plain mean and the server only rescales the sum.
Put the mod after ``importance_secaggplus_mod``
(:mod:`flwr_importance.clientapps.secure_aggregation`), on a ``client_fn`` app
that answers OCS's norm query::

    app = ClientApp(
        client_fn=compat.importance_client_fn(client_fn),
        mods=[importance_secaggplus_mod, secure_aocs_mod],
    )

Torch-free: the update is read from the node state as arrays.
"""

from __future__ import annotations

import json

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import (
    Code,
    FitRes,
    GetPropertiesRes,
    Status,
    ndarrays_to_parameters,
)
from flwr.compat.common.recorddict_compat import (
    fitres_to_recorddict,
    getpropertiesres_to_recorddict,
    recorddict_to_fitres,
)
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.clientapps.variance_reduced import kept_update
from flwr_importance.sampling.variance_reduced import (
    AOCS_MAX_TOTALS_SUMS,
    aocs_client_probs,
    aocs_mass_terms,
)

__all__ = ["secure_aocs_mod"]

#: ``context.state`` key of the node's ``v_i``, ``n_i`` and their round.
KEPT_SCORE_KEY = "secure-aocs-kept"
#: ``context.state`` key of the round's answered steps and public values.
ANSWERED_KEY = "secure-aocs-answered"

_OK = Status(code=Code.OK, message="Success")


def _step_config(message: Message) -> ConfigRecord | None:
    """The config record naming a secure-AOCS step, or None."""
    for record in message.content.config_records.values():
        if protocol.SECURE_AOCS_STEP in record:
            return record
    return None


def _number(config: ConfigRecord, key: str) -> float:
    """A numeric config value (a missing one raises ``KeyError``)."""
    return float(config[key])  # type: ignore[arg-type]


def _kept_score(context: Context, server_round: int) -> tuple[float, float]:
    """``(v_i, n_i)`` kept at this round's training query.

    Raises
    ------
    ValueError
        If the node has none for this round (it restarted, or missed the query).
    """
    kept = context.state.get(KEPT_SCORE_KEY)
    if (
        not isinstance(kept, ConfigRecord)
        or kept[protocol.SERVER_ROUND] != server_round
    ):
        raise ValueError(f"no kept AOCS score for round {server_round}")
    return _number(kept, protocol.UPDATE_NORM), _number(kept, protocol.NUM_EXAMPLES)


def _public_factors(config: ConfigRecord) -> tuple[float, list[float]]:
    """The broadcast start factor and rescalings, checked as AOCS makes them.

    Raises
    ------
    ValueError
        A start factor that is not finite and >= 0, or a rescaling that is
        not finite and > 1 (:func:`aocs_next_scale` makes no other).
    """
    start = _number(config, protocol.AOCS_START_FACTOR)
    scales = [float(scale) for scale in json.loads(str(config[protocol.AOCS_SCALES]))]
    if not (np.isfinite(start) and start >= 0):
        raise ValueError(f"AOCS start factor {start!r} is not finite and >= 0")
    if not all(np.isfinite(scale) and scale > 1 for scale in scales):
        raise ValueError(f"AOCS rescalings {scales!r} are not all finite and > 1")
    return start, scales


def _probability(config: ConfigRecord, score: float) -> float:
    """``p_i`` from the broadcast start factor and rescalings."""
    start, scales = _public_factors(config)
    return float(aocs_client_probs(score, start, scales))


def _positive_bound(config: ConfigRecord, key: str) -> float:
    """A public bound from the config, checked finite and > 0."""
    bound = _number(config, key)
    if not (np.isfinite(bound) and bound > 0):
        raise ValueError(f"public bound {key}={bound!r} is not finite and > 0")
    return bound


def _answer_once(context: Context, config: ConfigRecord, server_round: int) -> None:
    """Record this step of the round as answered; refuse a repeat or a change.

    A server that could ask for the same sum twice, over two sets of nodes,
    would learn one node's value from the difference; one that changed the
    round's public values between messages could single a node out. So a
    node answers each step of a round once (``aocs-mass`` once per
    iteration, ``aocs-totals`` at most
    :data:`~flwr_importance.sampling.variance_reduced.AOCS_MAX_TOTALS_SUMS` times,
    each over other bounds), and every message of the round must carry the
    start factor it first saw and extend the rescalings it saw before.

    Raises
    ------
    ValueError
        A repeated step, too many totals, or changed public values.
    """
    record = context.state.get(ANSWERED_KEY)
    fresh = (
        not isinstance(record, ConfigRecord)
        or record[protocol.SERVER_ROUND] != server_round
    )
    answered: list[str] = [] if fresh else list(record["steps"])  # type: ignore[index, arg-type]
    seen = {} if fresh else json.loads(str(record["public"]))  # type: ignore[index]
    step = str(config[protocol.SECURE_AOCS_STEP])
    if step == protocol.AOCS_TOTALS_STEP:
        bounds = [
            _positive_bound(config, protocol.SCORE_BOUND),
            _positive_bound(config, protocol.SIZE_BOUND),
        ]
        key = f"{step}:{json.dumps(bounds)}"
        if sum(a.startswith(step) for a in answered) >= (AOCS_MAX_TOTALS_SUMS):
            raise ValueError(f"round {server_round}'s totals were asked too often")
    else:
        start, scales = _public_factors(config)
        if (
            seen.get("start", start) != start
            or seen.get("scales", [])[: len(scales)]
            != scales[: len(seen.get("scales", []))]
        ):
            raise ValueError(
                f"round {server_round}'s public AOCS factors changed between "
                f"messages: {seen} then start {start}, scales {scales}"
            )
        seen = {"start": start, "scales": max(seen.get("scales", []), scales, key=len)}
        key = f"{step}:{len(scales)}" if step == protocol.AOCS_MASS_STEP else step
    if key in answered:
        raise ValueError(
            f"step {key} of round {server_round} was already answered: a second "
            "answer would let the server difference two sums"
        )
    context.state[ANSWERED_KEY] = ConfigRecord(
        {
            protocol.SERVER_ROUND: server_round,
            "steps": [*answered, key],
            "public": json.dumps(seen),
        }
    )


def _secure_vector(
    message: Message, config: ConfigRecord, context: Context
) -> list[NDArray[np.float64]]:
    """The node's vector of a secure-sum step, scaled into the clipping range."""
    server_round = int(_number(config, protocol.SERVER_ROUND))
    score, size = _kept_score(context, server_round)
    reach = _number(config, protocol.CLIPPING_RANGE)
    step = config[protocol.SECURE_AOCS_STEP]
    if step == protocol.AOCS_TOTALS_STEP:
        values = np.array([score, size])
        bounds = np.array(
            [
                _positive_bound(config, protocol.SCORE_BOUND),
                _positive_bound(config, protocol.SIZE_BOUND),
            ]
        )
        # A value above its bound is sent clipped and flagged: the server
        # sees only how many, and asks again with a larger bound.
        return [
            reach
            * np.concatenate([np.minimum(values, bounds) / bounds, values > bounds])
        ]
    probability = _probability(config, score)
    if step == protocol.AOCS_MASS_STEP:
        mass, below_one = aocs_mass_terms([probability])
        return [reach * np.concatenate([mass, below_one])]
    if step == protocol.AOCS_UPDATE_STEP:
        update, _ = kept_update(context, server_round, 0)
        bound = _positive_bound(config, protocol.UPDATE_BOUND)
        weight = size / probability * reach / bound
        return [weight * array.numpy() for array in update.values()]
    raise ValueError(f"unknown {protocol.SECURE_AOCS_STEP} {step!r}")


def _stripped_training_reply(
    reply: Message, context: Context, server_round: int
) -> RecordDict:
    """The norm query's reply content with no number left; ``v_i``, ``n_i`` kept."""
    fit_res = recorddict_to_fitres(reply.content, keep_input=True)
    norm = float(fit_res.metrics[protocol.per_model_key(protocol.UPDATE_NORM, 0)])
    size = float(fit_res.metrics[protocol.per_model_key(protocol.NUM_EXAMPLES, 0)])
    context.state[KEPT_SCORE_KEY] = ConfigRecord(
        {
            protocol.SERVER_ROUND: server_round,
            protocol.UPDATE_NORM: size * norm,
            protocol.NUM_EXAMPLES: size,
        }
    )
    layout = {
        key: value
        for key, value in fit_res.metrics.items()
        if key == protocol.COMPAT_ARRAY_LAYOUT
    }
    stripped = FitRes(_OK, fit_res.parameters, num_examples=0, metrics=layout)
    return fitres_to_recorddict(stripped, keep_input=False)


def _participation_coin(config: ConfigRecord, context: Context) -> float:
    """The node's own uniform coin ``r_i``: OS entropy, nobody else's draw.

    A server that chose ``r_i`` would read ``v_i > r_i / g`` exactly from the
    answer. Only a run config that sets
    :data:`~flwr_importance.protocol.SECURE_AOCS_UNSAFE_PUBLIC_DRAWS` (tests
    that compare a secure run with a plain one) takes the server's draw.
    """
    if context.run_config.get(protocol.SECURE_AOCS_UNSAFE_PUBLIC_DRAWS, False):
        return _number(config, protocol.PARTICIPATION_DRAW)
    return float(np.random.default_rng().random())


def secure_aocs_mod(
    msg: Message, ctxt: Context, call_next: ClientAppCallable
) -> Message:
    """Serve the steps of AOCS under SecAgg+; pass every other message on.

    Parameters
    ----------
    msg : Message
        The incoming message; a step carries ``secure-aocs-step`` in its
        config (legacy ``fit`` or ``get_properties`` records).
    ctxt : Context
        The node's context: the kept update and score live in its state.
    call_next : ClientAppCallable
        The rest of the app (it trains at the ``train`` step).

    Returns
    -------
    Message
        The step's reply, as a legacy ``FitRes`` or ``GetPropertiesRes``.
    """
    config = _step_config(msg)
    if config is None:
        return call_next(msg, ctxt)
    step = config[protocol.SECURE_AOCS_STEP]
    server_round = int(_number(config, protocol.SERVER_ROUND))
    if step == protocol.AOCS_TRAIN_STEP:
        reply = call_next(msg, ctxt)
        if reply.has_error():
            return reply
        return Message(
            _stripped_training_reply(reply, ctxt, server_round), reply_to=msg
        )
    _answer_once(ctxt, config, server_round)
    if step == protocol.AOCS_PARTICIPATION_STEP:
        score, _ = _kept_score(ctxt, server_round)
        participates = int(
            _participation_coin(config, ctxt) < _probability(config, score)
        )
        properties = GetPropertiesRes(_OK, {protocol.PARTICIPATES: participates})
        return Message(getpropertiesres_to_recorddict(properties), reply_to=msg)
    vector = _secure_vector(msg, config, ctxt)
    weight = int(_number(config, protocol.SECURE_SUM_WEIGHT))
    fit_res = FitRes(_OK, ndarrays_to_parameters(vector), weight, {})
    return Message(fitres_to_recorddict(fit_res, keep_input=False), reply_to=msg)

"""The wire protocol's names: message types, record names, config and metric keys.

The strategies (server side) and the client helpers both read their keys from
here, and the module imports nothing but the standard library, so a ClientApp
in any ML framework can use them. What each key means, per method, is on
docs/protocol.md ("The wire protocol"); each method's client contract is in
its strategy class's docstring (:mod:`flwr_importance.strategies`).
"""

from __future__ import annotations

# --- Shared by every method ---------------------------------------------------
#: Name of the ArrayRecord holding the model, by default (Flower's
#: ``arrayrecord_key``); the helpers name the model they reply with so.
ARRAY_RECORD = "arrays"
#: Name of the ConfigRecord of a message, by default (Flower's
#: ``configrecord_key``); the client helpers read a message's only
#: ConfigRecord, whatever its name, and hand the user's functions the config
#: under this one.
CONFIG_RECORD = "config"
#: Name the helpers give the one MetricRecord of a reply (any name is accepted).
METRIC_RECORD = "metrics"
#: The round a message belongs to (in every message's config).
SERVER_ROUND = "server-round"
#: How the client helpers begin an error that is the project's wiring, not a
#: fault (the user's function replied without a key the helper needs): it is
#: the same on every node, so when every node answers a message with it the
#: strategy stops the run with ``ClientSideMissingError`` and the helper's text.
CLIENT_SIDE_MISCONFIGURED = "client side misconfigured"
#: The node's number of local training samples (train and size-query replies).
NUM_EXAMPLES = "num-examples"
#: Mean local training loss of the round (train replies, optional).
TRAIN_LOSS = "train-loss"
#: Local steps a node took this round (train replies of the helpers, optional).
NUM_STEPS = "num-steps"
#: FedProx's proximal weight ``mu`` (as Flower's ``FedProx`` sends it).
PROXIMAL_MU = "proximal-mu"
#: Local SGD steps the server asks for, where a method decides them.
LOCAL_STEPS = "local-steps"
#: Category of the extra round trips; the action follows the dot.
QUERY_CATEGORY = "query"
#: ``query.sizes``: report the local sample count.
SIZES_QUERY = "sizes"


# --- ISFedAvg -----------------------------------------------------------------
#: ``p_k``: the client's realized normalized inclusion probability ``P(k in S)/L``.
ISFEDAVG_CLIENT_PROB = "isfedavg-client-prob"
#: ``K``: the number of clients the probabilities are spread over.
ISFEDAVG_NUM_CLIENTS = "isfedavg-num-clients"
#: ``E_k``: local SGD steps ("epochs" in the paper).
ISFEDAVG_LOCAL_STEPS = "isfedavg-local-steps"
#: ``B_k``: mini-batch size.
ISFEDAVG_BATCH_SIZE = "isfedavg-batch-size"
#: Whether to apply eq. 29 to the ``p_n``; False keeps them (uniform mode).
ISFEDAVG_ADAPT_SAMPLE_PROBS = "isfedavg-adapt-sample-probs"
#: Whether each local step divides eq. 8's loss by ``E_k`` (absent: True).
ISFEDAVG_DIVIDE_BY_LOCAL_STEPS = "isfedavg-divide-by-local-steps"
#: Floor on every ``p_n`` as a fraction of ``1/N_k``, in ``(0, 1]``.
ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB = "isfedavg-min-relative-sample-prob"
#: ``sigma2_k`` of eq. 22 (train reply).
ISFEDAVG_SIGMA2 = "isfedavg-sigma2"
#: ``||grad P_k_hat||^2``, eq. 14 accumulated over the round's steps (train reply).
ISFEDAVG_GRADIENT_SQ_NORM = "isfedavg-g2"

# --- FOLB ---------------------------------------------------------------------
#: ArrayRecord of the local update ``w_k - w`` (train reply).
FOLB_UPDATE = "update"
#: ArrayRecord of the full local gradient at the received model.
FOLB_GRADIENT = "gradient"
#: The inexactness ``gamma_k`` of the local solve (train reply).
FOLB_GAMMA = "gamma"
#: ``query.gradient``: the second set of two-set FOLB returns its gradient only.
FOLB_GRADIENT_QUERY = "gradient"
#: Round metric: 1 where the round fell back to the sample-weighted mean.
FOLB_FALLBACK = "folb-fallback"
#: Round metric: how many updates were subtracted (negative weight).
FOLB_NEGATIVE_WEIGHTS = "folb-negative-weights"

# --- FedSampling --------------------------------------------------------------
#: The randomized-response size (``query.sizes`` reply); never the true size.
FEDSAMPLING_SIZE_RESPONSE = "size-response"
#: ``M``: the size bound of the randomized response (``query.sizes`` config).
FEDSAMPLING_MAX_SIZE = "max-size"
#: ``epsilon`` of the local differential privacy (``query.sizes`` config).
FEDSAMPLING_EPSILON = "epsilon"
#: The node's ledger in its size reply: the size replies it has sent so far.
FEDSAMPLING_NODE_ANSWERS = "node-size-answers"
#: The node's ledger in its size reply: their epsilon (basic composition).
FEDSAMPLING_NODE_EPSILON = "node-epsilon-spent"
#: The node's ledger in its size reply: 1 if its coins were the unsafe seeded ones.
FEDSAMPLING_NODE_REPRODUCIBLE_COINS = "node-reproducible-coins"
#: Node config: the node's epsilon cap per size reply.
FEDSAMPLING_MAX_EPSILON_NODE_KEY = "fedsampling-max-epsilon"
#: Node config: the node's epsilon cap for the whole run.
FEDSAMPLING_EPSILON_BUDGET_NODE_KEY = "fedsampling-epsilon-budget"
#: ``K``: the number of samples the round aims for (train config).
FEDSAMPLING_SAMPLES_PER_ROUND = "samples-per-round"
#: ``N_tilde``: the server's estimate of the total number of samples.
FEDSAMPLING_ESTIMATED_TOTAL_SIZE = "estimated-total-size"
#: The public weight a train reply sends as ``num-examples`` under SecAgg+
#: (train config; present only when the reply goes through SecAgg+).
SECURE_SUM_WEIGHT = "secure-sum-weight"

# --- OCS, AOCS, MMFL ----------------------------------------------------------
#: ``query.norm``: train, keep the update, report its norm.
NORM_QUERY = "norm"
#: ``query.loss``: report the loss of every model at the received models (MMFL).
LOSS_QUERY = "loss"
#: The norm of the kept update (``query.norm`` reply).
UPDATE_NORM = "update-norm"
#: The mean local loss of the received model: ``query.loss`` replies carry it per
#: model (``loss-<s>``), evaluate replies as ``loss``.
LOSS = "loss"
#: Which model a message is about (MMFL; 0 for OCS).
MODEL_INDEX = "model-index"
#: The number of models trained at once (MMFL's ``query.sizes`` config).
NUM_MODELS = "num-models"
#: True when the train message asks for the update kept at ``query.norm``.
KEPT_UPDATE = "kept-update"
#: ArrayRecord carrying the update in OCS/MMFL train replies.
UPDATE_RECORD = "update"
#: Prefix of the ArrayRecords carrying model ``s`` in MMFL's server messages.
MODEL_RECORD_PREFIX = "model-"

# --- AOCS under SecAgg+ -------------------------------------------------------
#: Config key naming the secure-AOCS step a message belongs to.
SECURE_AOCS_STEP = "secure-aocs-step"
#: Step: the training query, its reply stripped of every number.
AOCS_TRAIN_STEP = "aocs-train"
#: Step: the secure sum of ``v_i`` and ``n_i`` (and their overflow flags).
AOCS_TOTALS_STEP = "aocs-totals"
#: Step: the secure sum of ``P`` and ``I``, AOCS's mass and count below 1.
AOCS_MASS_STEP = "aocs-mass"
#: Step: the participation decision against the public draw.
AOCS_PARTICIPATION_STEP = "aocs-participation"
#: Step: the participants' secure sum of ``(n_i / p_i) U_i``.
AOCS_UPDATE_STEP = "aocs-update"
#: ``query.participation``: the participation decision's message type.
PARTICIPATION_QUERY = "participation"
#: SecAgg+'s ``clipping_range``: a secure vector's entries lie within it.
CLIPPING_RANGE = "clipping-range"
#: Public bound on ``v_i = n_i ||U_i||`` in the totals step.
SCORE_BOUND = "score-bound"
#: Public bound on ``n_i`` in the totals step.
SIZE_BOUND = "size-bound"
#: ``m / sum_j v_j``: a client's ``p_i`` starts at ``min(1, factor v_i)``.
AOCS_START_FACTOR = "aocs-start-factor"
#: JSON list of the AOCS rescalings ``C`` broadcast so far.
AOCS_SCALES = "aocs-scales"
#: Public bound on the norm of ``(n_i / p_i) U_i`` in the update step.
UPDATE_BOUND = "update-bound"
#: The server's uniform draw ``r_i``, sent only with the workflow's
#: ``unsafe_public_draws``.
PARTICIPATION_DRAW = "participation-draw"
#: Run config, unsafe (tests): the node takes the server's ``r_i`` as its coin.
SECURE_AOCS_UNSAFE_PUBLIC_DRAWS = "secure-aocs-unsafe-public-draws"
#: Reply: 1 if the node participates (``r_i < p_i``), else 0.
PARTICIPATES = "participates"

# --- Legacy API transport -----------------------------------------------------
#: Config key of a legacy ``fit``/``get_properties`` call: the message type.
COMPAT_MESSAGE_TYPE = "compat-message-type"
#: Config (server to client) or metric (client to server) key of a legacy
#: ``fit``: the JSON list of ``[record name, number of arrays]`` pairs.
COMPAT_ARRAY_LAYOUT = "compat-array-layout"


# --- Names built from the constants -------------------------------------------
def query_message_type(action: str) -> str:
    """The message type of the query ``action``.

    Flower routes a message of type ``query.<action>`` to the ClientApp
    function registered with ``@app.query("<action>")``; a ClientApp without
    one answers with an error reply, which the strategies log and leave out.

    Examples
    --------
    >>> query_message_type(SIZES_QUERY)
    'query.sizes'
    """
    return f"{QUERY_CATEGORY}.{action}"


def model_record_name(model_index: int) -> str:
    """``model-<s>``: the ArrayRecord name of model ``s`` in server messages.

    Examples
    --------
    >>> model_record_name(2)
    'model-2'
    """
    return f"{MODEL_RECORD_PREFIX}{model_index}"


def per_model_key(key: str, model_index: int) -> str:
    """``<key>-<s>``: the metric ``key`` of model ``s`` in a query reply.

    Examples
    --------
    >>> per_model_key(UPDATE_NORM, 0)
    'update-norm-0'
    """
    return f"{key}-{model_index}"


__all__ = [
    "AOCS_MASS_STEP",
    "AOCS_PARTICIPATION_STEP",
    "AOCS_SCALES",
    "AOCS_START_FACTOR",
    "AOCS_TOTALS_STEP",
    "AOCS_TRAIN_STEP",
    "AOCS_UPDATE_STEP",
    "ARRAY_RECORD",
    "CLIENT_SIDE_MISCONFIGURED",
    "CLIPPING_RANGE",
    "COMPAT_ARRAY_LAYOUT",
    "COMPAT_MESSAGE_TYPE",
    "CONFIG_RECORD",
    "FEDSAMPLING_EPSILON",
    "FEDSAMPLING_EPSILON_BUDGET_NODE_KEY",
    "FEDSAMPLING_ESTIMATED_TOTAL_SIZE",
    "FEDSAMPLING_MAX_EPSILON_NODE_KEY",
    "FEDSAMPLING_MAX_SIZE",
    "FEDSAMPLING_NODE_ANSWERS",
    "FEDSAMPLING_NODE_EPSILON",
    "FEDSAMPLING_NODE_REPRODUCIBLE_COINS",
    "FEDSAMPLING_SAMPLES_PER_ROUND",
    "FEDSAMPLING_SIZE_RESPONSE",
    "FOLB_FALLBACK",
    "FOLB_GAMMA",
    "FOLB_GRADIENT",
    "FOLB_GRADIENT_QUERY",
    "FOLB_NEGATIVE_WEIGHTS",
    "FOLB_UPDATE",
    "ISFEDAVG_ADAPT_SAMPLE_PROBS",
    "ISFEDAVG_BATCH_SIZE",
    "ISFEDAVG_CLIENT_PROB",
    "ISFEDAVG_DIVIDE_BY_LOCAL_STEPS",
    "ISFEDAVG_GRADIENT_SQ_NORM",
    "ISFEDAVG_LOCAL_STEPS",
    "ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB",
    "ISFEDAVG_NUM_CLIENTS",
    "ISFEDAVG_SIGMA2",
    "KEPT_UPDATE",
    "LOCAL_STEPS",
    "LOSS",
    "LOSS_QUERY",
    "METRIC_RECORD",
    "MODEL_INDEX",
    "MODEL_RECORD_PREFIX",
    "NORM_QUERY",
    "NUM_EXAMPLES",
    "NUM_MODELS",
    "NUM_STEPS",
    "PARTICIPATES",
    "PARTICIPATION_DRAW",
    "PARTICIPATION_QUERY",
    "PROXIMAL_MU",
    "QUERY_CATEGORY",
    "SCORE_BOUND",
    "SECURE_AOCS_STEP",
    "SECURE_AOCS_UNSAFE_PUBLIC_DRAWS",
    "SECURE_SUM_WEIGHT",
    "SERVER_ROUND",
    "SIZES_QUERY",
    "SIZE_BOUND",
    "TRAIN_LOSS",
    "UPDATE_BOUND",
    "UPDATE_NORM",
    "UPDATE_RECORD",
    "model_record_name",
    "per_model_key",
    "query_message_type",
]

"""The wire protocol: every message type, config key, metric key and record name.

The strategies (server side) and the client helpers both read their keys from
here, and only from here. This module imports nothing but the standard library,
so a Flower project in any ML framework can meet a strategy's contract from
its own ClientApp: this page is the whole contract.

Conventions shared by every method
----------------------------------
- Keys are hyphenated, Flower style. A train or evaluate message carries the
  model as one ArrayRecord and the settings as one ConfigRecord (named as
  Flower's ``arrayrecord_key``/``configrecord_key``, ``"arrays"``/``"config"``
  by default); replies carry one MetricRecord with ``num-examples``
  (:data:`NUM_EXAMPLES`), as Flower's ``FedAvg`` expects.
- Every message a strategy sends carries ``server-round`` (:data:`SERVER_ROUND`).
- Extra round trips are ``query.<action>`` messages
  (:func:`query_message_type`); a ClientApp answers them with
  ``@app.query("<action>")``.

ISFedAvg (two-level importance sampling)
----------------------------------------
train config: :data:`ISFEDAVG_CLIENT_PROB` (``p_k``), :data:`ISFEDAVG_NUM_CLIENTS`
(``K``), :data:`ISFEDAVG_LOCAL_STEPS` (``E_k``), :data:`ISFEDAVG_BATCH_SIZE`
(``B_k``), :data:`ISFEDAVG_ADAPT_SAMPLE_PROBS`,
:data:`ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB`. The client takes ``E_k`` steps of
batches of ``B_k`` samples drawn by importance, each step scaled as in eq. 8 of
the paper. Train reply metrics: :data:`ISFEDAVG_SIGMA2` (``sigma2_k``, eq. 22),
:data:`ISFEDAVG_GRADIENT_SQ_NORM` (``||grad P_k||^2``, eq. 14) and
``num-examples``; arrays: the local model.

FOLB (gradient-aligned reweighting of FedProx updates)
------------------------------------------------------
train config: :data:`PROXIMAL_MU`. Train reply: ArrayRecords
:data:`FOLB_UPDATE` (``w_k - w``) and :data:`FOLB_GRADIENT` (the full local
gradient at the *received* model, before training), metrics :data:`FOLB_GAMMA`
(the inexactness ``gamma_k``) and ``num-examples``. Two-set mode also sends
``query.gradient`` (:data:`FOLB_GRADIENT_QUERY`) with the model; the reply is
the :data:`FOLB_GRADIENT` ArrayRecord and ``num-examples``.

FedSampling (uniform data sampling with private sizes)
------------------------------------------------------
``query.sizes`` config: :data:`FEDSAMPLING_MAX_SIZE`, :data:`FEDSAMPLING_EPSILON`;
reply metric :data:`FEDSAMPLING_SIZE_RESPONSE` (the randomized-response size,
never the true one). train config: :data:`FEDSAMPLING_SAMPLES_PER_ROUND`
(``K``), :data:`FEDSAMPLING_ESTIMATED_TOTAL_SIZE` (``N_tilde``),
:data:`LOCAL_STEPS`. The client keeps each sample with probability
``K / N_tilde`` and replies with ``G_c``, the kept samples' gradients at the
received model summed and divided by ``K``, as one ArrayRecord with the
model's keys; the reply has no MetricRecord (no size, no count).

Clustered, MD and size-weighted sampling
----------------------------------------
``query.sizes`` (:data:`SIZES_QUERY`) with an empty config; reply metric
``num-examples``. train and evaluate as Flower's FedAvg.

Optimal client sampling (OCS, AOCS) and multi-model sampling (MMFL)
-------------------------------------------------------------------
Models are numbered ``0..S-1`` (``S = 1`` for OCS) and travel as the
ArrayRecords ``model-<s>`` (:func:`model_record_name`); per-model metric keys
end in ``-<s>`` (:func:`per_model_key`). ``query.norm`` (:data:`NORM_QUERY`):
the client trains every model it received, keeps each update in its node state
and replies ``update-norm-<s>`` (:data:`UPDATE_NORM`), ``num-examples-<s>`` and
``train-loss-<s>``. ``query.loss`` (:data:`LOSS_QUERY`, MMFL's loss variant):
replies ``loss-<s>`` (:data:`LOSS`, the received model's mean local loss) and
``num-examples-<s>``. ``query.sizes`` with config :data:`NUM_MODELS`: replies
``num-examples-<s>``. train: config :data:`MODEL_INDEX` and
:data:`KEPT_UPDATE`; with ``kept-update = true`` no model travels and the
client replies the update it kept at this round's ``query.norm``, else it
trains the attached ``model-<s>`` now. The reply holds the ArrayRecord
:data:`UPDATE_RECORD` (``w_local - w_global``) and metrics ``num-examples``,
``train-loss`` and ``model-index``.
"""

from __future__ import annotations

# --- Shared by every method ---------------------------------------------------
#: The round a message belongs to (every message a strategy sends).
SERVER_ROUND = "server-round"
#: The node's number of local training samples (train and size-query replies).
NUM_EXAMPLES = "num-examples"
#: Mean local training loss of the round (train replies, optional).
TRAIN_LOSS = "train-loss"
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
#: Whether to apply eq. 29 to the sample probabilities; False leaves them as
#: they are (uniform, as stored on a node's first round, in uniform mode).
ISFEDAVG_ADAPT_SAMPLE_PROBS = "isfedavg-adapt-sample-probs"
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
#: ``K``: the number of samples the round aims for (train config).
FEDSAMPLING_SAMPLES_PER_ROUND = "samples-per-round"
#: ``N_tilde``: the server's estimate of the total number of samples.
FEDSAMPLING_ESTIMATED_TOTAL_SIZE = "estimated-total-size"

# --- OCS, AOCS, MMFL ----------------------------------------------------------
#: ``query.norm``: train, keep the update, report its norm.
NORM_QUERY = "norm"
#: ``query.loss``: report the loss of every model at the received models (MMFL).
LOSS_QUERY = "loss"
#: The norm of the kept update (``query.norm`` reply).
UPDATE_NORM = "update-norm"
#: The mean local loss at the received model (``query.loss`` reply, per model).
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

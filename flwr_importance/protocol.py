"""The wire protocol: every message type, config key, metric key and record name.

The strategies (server side) and the client helpers both read their keys from
here. This module imports nothing but the standard library, so a Flower
project in any ML framework (scikit-learn, JAX, TensorFlow) can meet a
strategy's contract from its own ClientApp: this page is the whole contract,
read off the strategies (``flwr_importance/strategies``), the client helpers
(``flwr_importance/clientapps``) and the legacy mapping
(``flwr_importance/legacy_wire.py``). Each method's section says what the
server sends, what it expects back, what every number means and who
multiplies by which weight.

Conventions shared by every method
----------------------------------
- **Record names.** A message from a strategy holds one ConfigRecord under
  the strategy's ``configrecord_key`` (default ``config``,
  :data:`CONFIG_RECORD`) and the model as one ArrayRecord under its
  ``arrayrecord_key`` (default ``arrays``, :data:`ARRAY_RECORD`), as Flower's
  ``FedAvg`` does. Exceptions, named in their sections: the messages of OCS
  and MMFL and Power-of-Choice's ``query.loss`` carry models as
  ``model-<s>`` (:func:`model_record_name`), whatever ``arrayrecord_key``
  says, and some messages carry no model. The library's client helpers
  read the message's single ConfigRecord, whatever ``configrecord_key``
  names it.
- **Config.** ``server-round`` (:data:`SERVER_ROUND`, the round the message
  belongs to) is in the config of every message. A ``train`` message's
  config also holds the ``train_config`` given to ``strategy.start``
  (``lr`` and the like), an ``evaluate`` message's the ``evaluate_config``;
  the queries that carry it too are named in their sections.
- **Replies.** At most one MetricRecord, under any name (the strategies read
  the only one; a reply with two is dropped). The helpers, like Flower's
  quickstarts, name it ``metrics`` (:data:`METRIC_RECORD`) and the model they
  send back ``arrays``. Every metric a section requires must be a finite
  number of magnitude at most ``1e150``, and ``>= 0`` where it says so. An
  ArrayRecord the server reads must have the received model's array keys, in
  the same order, and shapes, and finite values; the server combines arrays
  in the model's dtype. A second reply from the same node is dropped, and
  so is a train reply from a node that was not sent a train message.
- **num-examples** (:data:`NUM_EXAMPLES`) is the node's number of local
  training samples, an integer ``n_i >= 0``. Unless a section says more, it
  only weights the average of the reply's other metrics into the round's
  metrics, as Flower's ``FedAvg`` does (``weighted_by_key``); send the same
  metric keys from every node, since a key some replies lack is averaged
  over the others with the wrong weights.
- The ready-made train handlers (local SGD from the received model, which
  every method but FedSampling trains with) also reply ``train-loss``
  (:data:`TRAIN_LOSS`, the mean mini-batch loss over the round's local
  steps, each taken before its step) and ``num-steps`` (:data:`NUM_STEPS`,
  the local steps taken); they are averaged like any reply metric unless a
  section reads them.
- **Errors.** A client helper that finds the project's own function
  replying without a key it was told to read raises an error whose text
  begins ``client side misconfigured`` (:data:`CLIENT_SIDE_MISCONFIGURED`);
  a strategy whose every answering node sends it for a message type stops
  the run with ``ClientSideMissingError`` quoting the text, as for a
  missing handler. Other errors are faults: the reply is dropped.
- **Size weights.** Wherever a method weights nodes by their data share
  ``d_i = n_i / sum_j n_j``, the *server* computes it from the reported
  ``num-examples`` (over the nodes whose reply it could use) and multiplies;
  a client never sends a weighted quantity. The only normalization done on
  the client is FedSampling's ``1/K``.
- **Message types.** ``train``, ``evaluate`` and ``query.<action>``
  (:func:`query_message_type`); a ClientApp answers a query with
  ``@app.query("<action>")``. The same action may carry different configs
  and expect different replies under different strategies (``query.sizes``
  of MD sampling, FedSampling and MMFL): register the handler of the
  strategy you run.
- **evaluate**, where a method has federated evaluation: Flower's
  ``FedAvg`` message to a uniform sample of nodes (model under
  ``arrayrecord_key``, ``evaluate_config`` plus ``server-round``); reply one
  MetricRecord with ``num-examples`` (the weight, ``>= 0``) and metrics of
  your choice, averaged weighted by it. The ready-made handler replies
  ``loss`` (:data:`LOSS`, the mean local loss of the received model),
  ``accuracy`` (classification) and ``num-examples``.

Writing a client in another framework
-------------------------------------
Register a handler for every message type the method's section lists
(``@app.train()``, ``@app.evaluate()``, ``@app.query("<action>")``). Read the
model from the message's single ArrayRecord (or ``model-<s>`` where the
section says so) and the settings from its ConfigRecord. Reply with
``Message(RecordDict({...}), reply_to=msg)`` holding the section's
ArrayRecords and one MetricRecord, conventionally ``metrics``, with
``num-examples`` wherever the section asks for it (never for FedSampling).
A node that cannot answer (no data, a missing kept update, an invalid
config) should raise: Flower turns the exception into an error reply, which
the strategy logs with the node id and leaves out of the round (a query: the
node is not sampled or ranked this round; a train reply: its term is
missing, with no compensation unless the section says otherwise). Never
answer with made-up numbers: NaN or infinite values are caught, a plausible
wrong value is not. A ClientApp without a handler for a message type also
answers with an error reply.

ISFedAvg (``isfedavg``)
-----------------------
Two-level importance sampling (Rizk et al., ICASSP 2021): the server selects
``L`` nodes by their probabilities ``p_k``, each selected node draws its
batches by its per-sample probabilities ``p_n`` and scales its own steps.

- ``train`` to each selected node: the model under ``arrayrecord_key``;
  config ``server-round``, the ``train_config`` and

  * ``isfedavg-client-prob`` (:data:`ISFEDAVG_CLIENT_PROB`, float in
    ``(0, 1]``): ``p_k``, the node's *realized* normalized inclusion
    probability ``P(k in S) / L`` (capped where ``L p_k > 1``);
  * ``isfedavg-num-clients`` (:data:`ISFEDAVG_NUM_CLIENTS`, int): ``K``, the
    number of connected nodes;
  * ``isfedavg-local-steps`` (:data:`ISFEDAVG_LOCAL_STEPS`, int): ``E_k``,
    the number of local SGD steps (replaces your epochs);
  * ``isfedavg-batch-size`` (:data:`ISFEDAVG_BATCH_SIZE`, int): ``B_k``, the
    distinct samples per batch (a node with fewer samples uses them all);
  * ``isfedavg-divide-by-local-steps`` (:data:`ISFEDAVG_DIVIDE_BY_LOCAL_STEPS`,
    bool): eq. 8's ``1/E_k`` in each step (False: the app's own step size);
  * ``isfedavg-adapt-sample-probs`` (:data:`ISFEDAVG_ADAPT_SAMPLE_PROBS`,
    bool): update ``p_n`` by eq. 29 (False in the strategy's uniform mode:
    keep ``p_n = 1/N_k``);
  * ``isfedavg-min-relative-sample-prob``
    (:data:`ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB`, float in ``(0, 1]``): floor
    on every ``p_n`` as a fraction of ``1/N_k``.

  The node draws each batch of distinct samples with ``P(n in B) = pi_n``,
  ``B_k p_n`` capped at 1 with the excess spread over the others, and steps
  with the eq. 8 gradient ``sum_{b in B} grad Q_b / (K p_k E_k N_k pi_b)``
  (without ``E_k`` when not dividing): the weights are applied on the client.
- ``train`` reply: one ArrayRecord, the trained local model (not an update);
  one MetricRecord with ``isfedavg-sigma2`` (:data:`ISFEDAVG_SIGMA2`,
  ``sigma2_k`` of eq. 22 from the per-sample gradient norms seen this round,
  ``>= 0``), ``isfedavg-g2`` (:data:`ISFEDAVG_GRADIENT_SQ_NORM`,
  ``||grad P_k||^2`` of eq. 14: the squared norm of the mean over the
  ``E_k`` steps of the importance-weighted local mean-loss gradient, at the
  iterates visited, ``>= 0``) and ``num-examples`` (``N_k``, ``>= 0``; with a
  custom ``weighted_by_key``, that key). The ready-made handler adds
  ``train-loss`` (:data:`TRAIN_LOSS`, mean unweighted batch loss before each
  step) and ``num-steps`` (:data:`NUM_STEPS`, ``E_k``), averaged.
- Server: the new model is the plain mean of the returned models (eq. 5),
  no size weights; ``sigma2_k`` and ``G2_k`` update the participants'
  ``p_k`` (eq. 28). A node's ``E_k`` and ``B_k`` are drawn once and kept.
- ``evaluate``: as in the shared conventions.

FOLB (``folb``)
---------------
Gradient-aligned reweighting of FedProx updates (Nguyen et al., JSAC 2021).

- ``train`` to each distinct device of the set ``S`` (``S1``): the model
  under ``arrayrecord_key``; config ``server-round``, the ``train_config``
  and ``proximal-mu`` (:data:`PROXIMAL_MU`, FedProx's ``mu >= 0``, as
  Flower's ``FedProx`` sends it: add ``(mu/2) ||w - w^t||^2`` to the loss).
- ``train`` reply: ArrayRecords ``update`` (:data:`FOLB_UPDATE`,
  ``dw_k = w_k - w^t``, trained minus received) and ``gradient``
  (:data:`FOLB_GRADIENT`, ``g_k = grad F_k(w^t)``: the gradient of the mean
  local loss over all local data at the *received* model, before training),
  both keyed and shaped like the model (zeros for buffers); one MetricRecord
  with ``gamma`` (:data:`FOLB_GAMMA`, the inexactness
  ``||grad F_k(w_k) + mu (w_k - w^t)|| / ||g_k||``, 0 when ``g_k = 0``,
  ``>= 0``; values above 1 are clipped to 1 by both ends) and
  ``num-examples`` (``n_k >= 0``, always required); other metrics are
  averaged weighted by ``num-examples``. Neither array is scaled by
  ``n_k``: the server weighs device ``k`` by ``n_k c_k / sum_i n_i |c_i|``
  with ``c_k = <g_k, gS>`` and ``gS = sum_j n_j g_j / sum_j n_j``
  (``weighting="uniform"``: every ``n_k`` taken as 1), then adds
  ``server_lr`` times the weighted sum of updates to ``w^t``.
- Two-set mode (``mode="two-set"``): before the train messages,
  ``query.gradient`` (:data:`FOLB_GRADIENT_QUERY`) to each device of the
  second set ``S2`` that is not in ``S1``, with the same model and config
  as ``train``; no training. Reply: the ArrayRecord ``gradient`` (``g_j``,
  as above) and, with ``weighting="samples"``, ``num-examples``. A device
  in both sets gets only the train message; its train reply's gradient
  serves ``S2``. The server's ``gS`` is then ``S2``'s.
- Round metrics (what ``aggregate_train`` returns, not on the wire): the
  averaged reply metrics, ``folb-fallback`` (:data:`FOLB_FALLBACK`, 1 when
  the round fell back to the sample-weighted mean) and
  ``folb-negative-weights`` (:data:`FOLB_NEGATIVE_WEIGHTS`, updates
  subtracted).
- ``evaluate``: as in the shared conventions.

FedSampling (``fedsampling``)
-----------------------------
Uniform data sampling with locally private sizes (Qi et al., IJCAI 2023).
The node's true size and the number of samples it keeps never leave it.

- ``query.sizes`` (:data:`SIZES_QUERY`) every round to every connected node;
  no model; config ``max-size`` (:data:`FEDSAMPLING_MAX_SIZE`, int ``M``),
  ``epsilon`` (:data:`FEDSAMPLING_EPSILON`, float, the local differential
  privacy budget of this reply) and ``server-round`` (no ``train_config``).
  Reply: one MetricRecord with ``size-response``
  (:data:`FEDSAMPLING_SIZE_RESPONSE`): the randomized response of eq. 1, an
  integer in ``{1..M-1}``: the true size clipped to ``M - 1`` with
  probability ``alpha = (e^eps - 1) / (e^eps + M - 2)``, else uniform on
  ``{1..M-1}``. Never ``num-examples``. The helpers add the node's ledger,
  ``node-size-answers``, ``node-epsilon-spent``, ``node-reproducible-coins``
  (:data:`FEDSAMPLING_NODE_ANSWERS`, :data:`FEDSAMPLING_NODE_EPSILON`,
  :data:`FEDSAMPLING_NODE_REPRODUCIBLE_COINS`), and refuse a query above the
  node config's ``fedsampling-max-epsilon`` or ``fedsampling-epsilon-budget``
  (:data:`FEDSAMPLING_MAX_EPSILON_NODE_KEY`,
  :data:`FEDSAMPLING_EPSILON_BUDGET_NODE_KEY`).
- ``train`` to the nodes whose size reply was usable: the model under
  ``arrayrecord_key``; config ``server-round``, the ``train_config``,
  ``samples-per-round`` (:data:`FEDSAMPLING_SAMPLES_PER_ROUND`, int ``K``),
  ``estimated-total-size`` (:data:`FEDSAMPLING_ESTIMATED_TOTAL_SIZE`, float
  ``N_tilde >= K``, the server's estimate of the total number of samples)
  and ``local-steps`` (:data:`LOCAL_STEPS`, int ``E >= 1``). The node keeps
  each of its samples independently with probability ``K / N_tilde``.
- ``train`` reply: one ArrayRecord (any name; the helper reuses the
  received one's) with the model's keys and shapes holding
  ``G_c = (1/K) sum_{s in S_c} g_s``: the per-sample loss gradients ``g_s``
  at the received model, summed over the kept samples and divided by the
  public ``K``, never by the number kept (zeros if none was kept). With
  ``E > 1`` (an extension) the node takes ``E - 1`` steps
  ``w <- w - lr G_c(w)`` with its own ``lr`` and sends the mean of the ``E``
  normalized gradients. No MetricRecord is needed, and the reply must carry
  no ``num-examples`` or count of kept samples.
- Server: ``w <- w - server_lr * sum_c G_c`` (descent; no weights, the
  ``1/K`` is already in ``G_c``).
- ``server_lr`` (default 1.0): the server takes the gradient step itself,
  and ``sum_c G_c`` estimates the mean gradient of the loss over the round's
  about ``K`` samples, so ``server_lr`` is a centralized SGD learning rate:
  1.0 diverges on unscaled features (raw scikit-learn data) or any loss
  whose curvature exceeds 2: standardize the features or lower it. The
  step also grows by the factor (samples kept) / ``K`` whenever ``N_tilde``
  underestimates the total: a noisy estimate (few nodes, a small epsilon),
  a ``max_size`` below the largest partition, or an estimate below a large
  ``K``, clamped to ``K`` (every sample is then kept, ``N / K`` times the
  target): lower ``server_lr`` there too.
- No ``evaluate`` message (its ``num-examples`` would reveal the sizes):
  evaluate on the server. Round metrics: ``estimated-total-size``,
  ``raw-size-estimate``, ``ldp-alpha``, ``num-size-replies``,
  ``num-updates``.
- Under SecAgg+ (legacy API only, ``compat.FedSampling(secure_aggregation=
  SecAggPlusWorkflow(...))``): the train config also holds
  ``secure-sum-weight`` (:data:`SECURE_SUM_WEIGHT`, int, the workflow's
  ``max_weight``), and the train reply carries ``num-examples`` equal to it,
  the same public number on every node (SecAgg+ multiplies each masked
  reply by ``num-examples / max_weight``, so every ``G_c`` enters the sum
  with weight 1, and ``num-examples`` travels in the clear). Only then may
  the reply carry ``num-examples``. The server unmasks only
  ``mean_c G_c`` over the ``n`` replies and steps with ``n`` times it
  (docs/privacy.md).

Clustered sampling, Alg. 1 and 2 (``clustered``), and MD sampling (``md``)
--------------------------------------------------------------------------
Fraboni et al., ICML 2021; MD sampling is also FedSampling's size-weighted
baseline (app name ``sizeweighted``). The same contract for Algorithm 1
(``method="size"``), Algorithm 2 (``method="similarity"``) and MD.

- ``query.sizes`` (:data:`SIZES_QUERY`) the first round a node is seen (the
  first round, and whenever nodes join); no model; config ``server-round``
  only. Reply: ``num-examples`` (``n_i``, a whole number ``>= 0``; a node
  without a usable reply is not drawn and is asked again next round).
- ``train``, once per distinct drawn node (``m`` draws with repeats): the
  model under ``arrayrecord_key``; config ``server-round`` and the
  ``train_config``, as Flower's ``FedAvg``. Reply: one ArrayRecord, the
  trained local model (Algorithm 2 computes each node's representative
  gradient on the server as the returned model minus the global one, so
  send the model, not an update), and ``num-examples`` (``>= 0``; a whole
  number refreshes the node's size).
- Server: the sizes weight the *draws* (MD: ``p_i = n_i / sum_j n_j``;
  clustered: each node keeps that share over the ``m`` distributions); the
  new model is the plain mean of the returned models, a node drawn twice
  counting twice. The metrics every reply shares (``num-examples``,
  ``train-loss``...) are averaged with the draw multiplicities, not the
  sizes. Round metrics: those, ``distinct-clients`` and ``aggregated-draws``.
- ``evaluate``: as in the shared conventions.

Optimal sampling: OCS and AOCS (``ocs``), MMFL (``mmfl``)
---------------------------------------------------------
OCS (Chen et al., TMLR 2022) samples for one model, ``S = 1``; AOCS
(``approximate=True``) only computes the probabilities differently, with the
same messages; MMFL (Zhang et al., ICDCS 2024) trains ``S`` models at once.
Models are numbered ``0..S-1`` and travel as ArrayRecords ``model-<s>``
(:data:`MODEL_RECORD_PREFIX`, :func:`model_record_name`), never under
``arrayrecord_key``; a per-model metric key ends in ``-<s>``
(:func:`per_model_key`). ``U = w_local - w_global`` is a node's update: its
local model after training from the received global model, minus that
model, never scaled by ``d_i`` or ``1/p_i``.

- ``query.norm`` (:data:`NORM_QUERY`; OCS, AOCS and MMFL ``"gradnorm"``)
  every round to every connected node: every model (``model-0`` for OCS);
  config ``server-round`` and the ``train_config``. The node trains each
  model it received on that model's task data, exactly as for a train
  message, keeps each update ``U_s`` in its node state tagged with this
  round's ``server-round`` (dropping older ones) and replies
  ``update-norm-<s>`` (:data:`UPDATE_NORM`, ``||U_s||``: the plain Euclidean
  norm over all arrays, ``>= 0``), ``num-examples-<s>`` (``n_is >= 0``, its
  samples of task ``s``) and, from the helpers where the train reports one,
  ``train-loss-<s>`` (unused).
  **Send ``||U_s||``, not ``||d_is U_s||``**: the server computes
  ``d_is = n_is / sum_j n_js`` over the nodes whose reply was usable and
  the score ``u_is = d_is ||U_s||``.
- ``query.loss`` (:data:`LOSS_QUERY`; MMFL ``"loss"``) every round to every
  connected node: every model; config ``server-round`` and the
  ``train_config``. No training: reply ``loss-<s>`` (:data:`LOSS`, the mean
  loss of received model ``s`` on the node's data of task ``s``, ``>= 0``)
  and ``num-examples-<s>``; the server scores ``u_is = d_is loss_s``.
- ``query.sizes`` (:data:`SIZES_QUERY`; MMFL ``"random"`` and
  ``"round-robin"``) once per node, when first seen; no model; config
  ``server-round`` and ``num-models`` (:data:`NUM_MODELS`, ``S``).
  Reply ``num-examples-<s>`` for every ``s`` in ``0..S-1``.
- Sampling: OCS draws each node independently with ``p_i`` from the
  ``u_i`` (``m`` expected); MMFL gives each node at most one model, ``s``
  with ``p_{s|i}`` (gradnorm and loss), or ``m`` nodes a random
  (``"random"``) or rotating (``"round-robin"``: ``(node_id + round) mod
  S``) model each, with ``p = m / (N S)``.
- ``train`` to each sampled node: config ``server-round`` (the round of
  this round's query), the ``train_config``, ``model-index``
  (:data:`MODEL_INDEX`, the model ``s`` it trains, 0 for OCS) and
  ``kept-update`` (:data:`KEPT_UPDATE`). With ``kept-update = true`` (OCS,
  AOCS, MMFL gradnorm) the message carries no ArrayRecord and the node
  sends the update it kept at *this round's* ``query.norm``: the kept
  update belongs to the round of the ``query.norm`` that stored it and is
  sent in that same round's train message only; a missing or stale one
  (another round's ``server-round``, e.g. after a restart) must raise,
  never be sent. With ``kept-update = false`` (MMFL loss, random,
  round-robin) the message carries the one ArrayRecord ``model-<s>`` and
  the node trains it now.
- ``train`` reply: the ArrayRecord ``update`` (:data:`UPDATE_RECORD`,
  ``U_s``, keyed and shaped like model ``s``) and one MetricRecord with
  ``model-index`` (must be the message's, else the reply is dropped),
  ``train-loss`` (:data:`TRAIN_LOSS`, the mean training loss: optional,
  finite where given, averaged into the round's metrics only) and
  ``num-examples`` (``>= 0``; checked, the step's ``d_is`` come from the
  query or size replies).
- Server: ``w_s <- w_s + server_lr * sum_{i in A_s} (d_is / p_is) U_is``
  over the usable replies (``d_is`` and ``p_is`` are the server's; a
  missing reply's term is missing, not made up). Round metrics:
  ``num-sampled``, ``num-received`` (``num-received-<s>`` for MMFL),
  ``train-loss`` (mean of those reported), ``expected-participants`` and, with exact
  update norms, ``variance`` and ``uniform-variance`` (OCS) or
  ``random-variance`` (MMFL gradnorm).
- ``evaluate``: OCS as in the shared conventions; MMFL has none (evaluate
  each model on the server).
- AOCS under SecAgg+ (legacy API only,
  ``DefaultWorkflow(fit_workflow=compat.SecureAOCSWorkflow(...))``,
  docs/privacy.md): every message's config names its step in
  ``secure-aocs-step`` (:data:`SECURE_AOCS_STEP`) and holds ``server-round``;
  the client's :func:`~flwr_importance.clientapps.secure_aocs.secure_aocs_mod`
  answers. ``aocs-train`` (:data:`AOCS_TRAIN_STEP`): OCS's ``query.norm``
  ``fit``, whose reply reaches the server with no number in it (the node keeps
  ``v_i = n_i ||U_i||`` and ``n_i``). Secure sums (SecAgg+ ``fit``s; each
  vector scaled into ``[-C, C]`` with ``C`` in ``clipping-range``,
  :data:`CLIPPING_RANGE`, sent with ``num-examples`` equal to
  ``secure-sum-weight``): ``aocs-totals`` (:data:`AOCS_TOTALS_STEP`):
  ``C [v_i / b_v, n_i / b_n, 1 if v_i > b_v, 1 if n_i > b_n]``, each value
  clipped to its public bound ``score-bound`` (:data:`SCORE_BOUND`, ``b_v``) or
  ``size-bound`` (:data:`SIZE_BOUND`, ``b_n``); ``aocs-mass``
  (:data:`AOCS_MASS_STEP`): ``C [p_i, 1]`` if ``p_i < 1``, else zeros, with
  ``p_i`` from ``v_i``, ``aocs-start-factor`` (:data:`AOCS_START_FACTOR`,
  ``m / sum_j v_j``) and ``aocs-scales`` (:data:`AOCS_SCALES`, a JSON list of
  the rescalings so far) by ``aocs_client_probs``; ``aocs-update``
  (:data:`AOCS_UPDATE_STEP`, participants only): every array of
  ``C (n_i / p_i) U_i / b_u``, ``b_u`` in ``update-bound``
  (:data:`UPDATE_BOUND`). ``aocs-participation``
  (:data:`AOCS_PARTICIPATION_STEP`, a ``get_properties`` of type
  ``query.participation``, :data:`PARTICIPATION_QUERY`) with the start factor
  and the scales: reply ``participates`` (:data:`PARTICIPATES`, 1 iff
  ``r_i < p_i``, else 0), ``r_i`` the node's own uniform coin (only with the
  run config's ``secure-aocs-unsafe-public-draws``,
  :data:`SECURE_AOCS_UNSAFE_PUBLIC_DRAWS`, the server's ``participation-draw``,
  :data:`PARTICIPATION_DRAW`). A node answers each step of a round once and
  refuses public values that change within a round.

Power-of-Choice, pow-d and rpow-d (``power-of-choice``)
-------------------------------------------------------
Cho et al., AISTATS 2022: ``d`` candidates drawn without replacement with
probability proportional to their sizes, the ``m`` with the highest local
loss train; biased on purpose.

- ``query.sizes`` (:data:`SIZES_QUERY`) the first round a node is seen, as
  for MD sampling: config ``server-round``; reply ``num-examples``.
- ``query.loss`` (:data:`LOSS_QUERY`; ``pow-d`` only) every round to the
  ``d`` candidates: the current model as the ArrayRecord ``model-0`` (not
  under ``arrayrecord_key``); config ``server-round`` only. No training:
  reply ``loss-0`` (:data:`LOSS`, the mean loss of that model on the node's
  training data, ``>= 0``, higher ranks first; ``cpow-d`` is this reply
  computed on a mini-batch) and ``num-examples-0`` (``>= 0``). A candidate
  without a usable reply is not selected.
- ``train`` to the ``m`` selected: as Flower's ``FedAvg`` (model under
  ``arrayrecord_key``, config ``server-round`` and the ``train_config``).
  Reply: one ArrayRecord, the trained local model; ``num-examples``
  (``>= 0``, refreshes the size) and, for ``rpow-d``, ``train-loss``
  (:data:`TRAIN_LOSS`, the mean training loss of this round's local steps):
  ``rpow-d`` sends no query and ranks a candidate by the ``train-loss`` of
  its latest train reply (a node never heard from ranks first; a reply
  without a finite one keeps the previous value).
- Server: the plain mean of the returned models (the sizes entered through
  the draw). Round metrics: ``candidates``, ``ranked-candidates``,
  ``selected``, ``selected-loss`` and those of MD sampling.
- ``evaluate``: as in the shared conventions.

Legacy API (``flwr_importance.compat``)
---------------------------------------
The legacy strategies run the same Message-API strategies and carry their
messages over ``fit`` and ``get_properties``. A message with arrays goes by
``fit``: its ArrayRecords as one flat list of arrays, its ConfigRecord as
the ``FitIns`` config plus ``compat-message-type``
(:data:`COMPAT_MESSAGE_TYPE`: ``train`` or ``query.<action>``) and
``compat-array-layout`` (:data:`COMPAT_ARRAY_LAYOUT`: a JSON list of
``[record name, number of arrays]`` pairs, in order). A query without arrays
goes by ``get_properties``, with the config and ``compat-message-type``;
OCS's train message, which carries no arrays, still goes by ``fit``. A fit
reply packs its ArrayRecords the same way, with its layout in the metrics
(without one, all arrays form one record ``arrays``); its numeric metrics,
or the reply properties, become the reply's MetricRecord ``metrics``, and
``FitRes.num_examples`` is ignored (send ``num-examples`` as a metric).
``HandlerClient`` does all of this for the library's handlers: it rebuilds
the message with the config under ``config`` and each record's arrays keyed
by the model's state-dict keys, and its ``evaluate`` returns the handler's
``loss`` metric as the legacy loss. MMFL has no legacy class (the legacy API
carries one model per round trip).
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
#: The node's own ledger in its size reply: its replies so far, their epsilon
#: (basic composition), and 1 if its coins were the unsafe seeded ones.
FEDSAMPLING_NODE_ANSWERS = "node-size-answers"
FEDSAMPLING_NODE_EPSILON = "node-epsilon-spent"
FEDSAMPLING_NODE_REPRODUCIBLE_COINS = "node-reproducible-coins"
#: Node config: the node's epsilon cap per size reply, and for the whole run.
FEDSAMPLING_MAX_EPSILON_NODE_KEY = "fedsampling-max-epsilon"
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
#: Public bounds on ``v_i = n_i ||U_i||`` and on ``n_i`` in the totals step.
SCORE_BOUND = "score-bound"
SIZE_BOUND = "size-bound"
#: ``m / sum_j v_j``: a client's ``p_i`` starts at ``min(1, factor v_i)``.
AOCS_START_FACTOR = "aocs-start-factor"
#: JSON list of the AOCS rescalings ``C`` broadcast so far.
AOCS_SCALES = "aocs-scales"
#: Public bound on the norm of ``(n_i / p_i) U_i`` in the update step.
UPDATE_BOUND = "update-bound"
#: The server's uniform draw ``r_i``, taken only with (run config, unsafe):
PARTICIPATION_DRAW = "participation-draw"
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

"""The maths of client and data sampling: pure NumPy/SciPy, no Flower, no torch.

Every random function takes an explicit ``numpy.random.Generator``; every
function rejects invalid input with a ``ValueError`` that says what is wrong.

This package exports what a user calls: each method's sampling functions, the
privacy of FedSampling's size replies and the ledger that counts them. The
rest (clustered sampling's distances and representative gradients, its scale
path in :mod:`.scale`, the bounds on reports) is imported from the module that
defines it, as the strategies do; each such module lists its public names in
its own ``__all__``.
"""

from flwr_importance.sampling.clustered import (
    aggregation_weight_variance,
    clustered_distributions_by_similarity,
    clustered_distributions_by_size,
    clustered_distributions_from_distances,
    md_aggregation_weight_variance,
    sample_from_distributions,
)
from flwr_importance.sampling.distances import Distance, pairwise_distances
from flwr_importance.sampling.fedsampling import (
    bernoulli_keep,
    epsilon_for_usable_estimate,
    keep_probability,
    nodes_for_usable_estimate,
    size_estimate_noise,
)
from flwr_importance.sampling.importance import importance_batch, update_sample_probs
from flwr_importance.sampling.ledger import (
    DEFAULT_DELTA_PRIME,
    NodeReport,
    PrivacyLedger,
    PrivacySpend,
)
from flwr_importance.sampling.pips import (
    capped_inclusion_probs,
    md_sample,
    poisson_sample,
    systematic_sample,
)
from flwr_importance.sampling.power_of_choice import draw_candidates, select_highest
from flwr_importance.sampling.privacy import (
    advanced_composition_crossover,
    advanced_composition_epsilon,
    basic_composition_epsilon,
    estimate_total_size,
    ldp_alpha,
    privatize_size,
    size_reply_probabilities,
)
from flwr_importance.sampling.schedule import uniform_client_set
from flwr_importance.sampling.variance_reduced import (
    aocs_probs,
    assign_models,
    available_pool,
    estimator_variance,
    mmfl_probs,
    optimal_client_probs,
)

__all__ = [
    "DEFAULT_DELTA_PRIME",
    "Distance",
    "NodeReport",
    "PrivacyLedger",
    "PrivacySpend",
    "advanced_composition_crossover",
    "advanced_composition_epsilon",
    "aggregation_weight_variance",
    "aocs_probs",
    "assign_models",
    "available_pool",
    "basic_composition_epsilon",
    "bernoulli_keep",
    "capped_inclusion_probs",
    "clustered_distributions_by_similarity",
    "clustered_distributions_by_size",
    "clustered_distributions_from_distances",
    "draw_candidates",
    "epsilon_for_usable_estimate",
    "estimate_total_size",
    "estimator_variance",
    "importance_batch",
    "keep_probability",
    "ldp_alpha",
    "md_aggregation_weight_variance",
    "md_sample",
    "mmfl_probs",
    "nodes_for_usable_estimate",
    "optimal_client_probs",
    "pairwise_distances",
    "poisson_sample",
    "privatize_size",
    "sample_from_distributions",
    "select_highest",
    "size_estimate_noise",
    "size_reply_probabilities",
    "systematic_sample",
    "uniform_client_set",
    "update_sample_probs",
]

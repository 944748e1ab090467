"""Algorithm 2 of clustered sampling past exact Ward: many clients, big models.

Exact Ward (:mod:`flwr_importance.sampling.clustered`) needs every pairwise
distance between the clients' representative gradients. Above
:data:`~flwr_importance.sampling.clustered.EXACT_WARD_LIMIT` clients the
clustering runs in two levels instead (:mod:`.two_level`), its level 1 kept
from one round to the next (:mod:`.incremental`); a sketch of each gradient
(:mod:`.sketch`) keeps their distances in fewer floats than the model has.

Each name is imported from the module that defines it; this package exports
none.
"""

"""``strategy = "sizeweighted"``: FedSampling's client-level baseline, MD sampling.

Clients drawn with probability proportional to their TRUE size (Qi et al.,
IJCAI 2023, Section 4.3), which is MD sampling: the same strategy and client
handlers as ``strategy = "md"``, kept under the name FedSampling's comparisons
use. It reveals every node's size to the server.
"""

from __future__ import annotations

from simulations.methods.md import build_strategy, client_handlers

__all__ = ["build_strategy", "client_handlers"]

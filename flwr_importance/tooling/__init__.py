"""The repository's tooling: running experiments and testing, not the library.

What a user imports in their own Flower app (strategies, protocol, maths,
client helpers, the legacy API) is the rest of :mod:`flwr_importance`, which
never imports this subpackage (``tests/test_package_shape.py`` checks it).
Here are the launcher (:mod:`.launcher`: ``flwr run`` with its own
``FLWR_HOME``, ``--compare``, a loopback deployment), the comparison of runs
(:mod:`.comparison`) and the test doubles (:mod:`.testing`: the in-process
grid, canned replies, fault injection). Their heavier dependencies
(matplotlib, Flower's simulation engine) come with the ``sim`` and ``dev``
extras.
"""

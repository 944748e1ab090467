"""Markers shared by test modules."""

import pytest

#: The runs that start many processes at once (a deployment, a two-node Ray
#: cluster, 1,000 virtual SuperNodes): pytest-xdist gives them one worker
#: (``--dist loadgroup`` in ``scripts/test.sh``), so on two cores they never
#: start beside each other, and a module-scoped deployment is built once.
HEAVY = pytest.mark.xdist_group("heavy")

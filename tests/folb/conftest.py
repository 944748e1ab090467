"""FOLB tests run torch on one thread.

On a shared machine torch's default intra-op threads oversubscribe the cores and
make each small op ~10x slower; the library never sets this, so the tests do,
and restore the previous value afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

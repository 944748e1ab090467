"""The README's strategy snippets run as written (both APIs, every method)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flwr.clientapp import ClientApp
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg

README = Path(__file__).resolve().parent.parent / "README.md"
SNIPPET = re.compile(r"```python\n(# (?:Message|Legacy) API.*?)```", re.S)
SNIPPETS = SNIPPET.findall(README.read_text())


def test_every_strategy_section_has_both_snippets() -> None:
    message = [code for code in SNIPPETS if code.startswith("# Message API")]
    legacy = [code for code in SNIPPETS if code.startswith("# Legacy API")]
    assert len(message) == len(legacy) == 5


@pytest.mark.parametrize(
    "code", SNIPPETS, ids=[code.splitlines()[3] for code in SNIPPETS]
)
def test_snippet_builds_a_strategy_and_a_client_app(code: str) -> None:
    # `my_task` is the README's user-supplied TaskFactory; building the
    # handlers must not call it (it runs per message, on the node).
    namespace: dict[str, object] = {"ClientApp": ClientApp, "my_task": print}
    exec(code, namespace)
    expected = FedAvg if code.startswith("# Message API") else LegacyFedAvg
    assert isinstance(namespace["strategy"], expected)
    assert isinstance(namespace["app"], ClientApp)

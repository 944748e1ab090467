"""Every strategy class's docstring follows one template, Flower's own.

Flower's ``FedAvg``, ``FedProx`` and ``FedAdam`` open with a one-line summary,
a blank line and ``Implementation based on <paper url>``, then ``Parameters``
with ``name : type (default: x)`` entries. The library's strategy classes do
the same, with one ``Client contract`` section where the method needs a
client side, and cite docs/methods.md for the decisions taken where the paper
is ambiguous instead of repeating them.

The classes are found, not listed: the registry's strategies and the strategy
classes of ``flwr_importance.strategies.__all__`` with their bases up to
:class:`ImportanceStrategy`, and the legacy-API class of every method
(``compat.legacy_class``) with the strategy classes of ``compat.__all__``.

Shared options are documented once, on :class:`ImportanceStrategy`: its
``Parameters`` cover every keyword of :class:`StrategyOptions`. Any other
class's ``Parameters`` document exactly its ``__init__``'s named keyword
parameters, and its ``**options`` (or ``**unknown``) go under ``Other
Parameters``.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp.strategy import Strategy

from flwr_importance import compat, strategies
from flwr_importance.compat import legacy_class
from flwr_importance.registry import MethodSpec, methods
from flwr_importance.strategies.base import ImportanceStrategy, StrategyOptions
from tests.docstrings import entries, section, sections

METHODS_DOC = Path(__file__).resolve().parents[2] / "docs" / "methods.md"

IMPLEMENTATION = re.compile(r"^Implementation based on (https?://\S+)$")
#: ``name : type (default: x)``, a parameter with a default.
WITH_DEFAULT = re.compile(r"^(\w+) : .+ \(default: (.+)\)$")
#: ``name : type``, a required parameter.
REQUIRED = re.compile(r"^(\w+) : [^(]+$")
CLIENT_CONTRACT = "Client contract"


@dataclass(frozen=True)
class Case:
    """A strategy class, the method it implements (None: a base) and its API."""

    cls: type
    spec: MethodSpec | None
    api: str

    @property
    def id(self) -> str:
        return f"{self.api}.{self.cls.__name__}"


def message_cases() -> list[Case]:
    """The Message-API strategies: registry, exports, and their library bases."""
    found: dict[type, MethodSpec | None] = {spec.strategy: spec for spec in methods()}
    for name in strategies.__all__:
        value = getattr(strategies, name)
        if isinstance(value, type) and issubclass(value, Strategy):
            found.setdefault(value, None)
    for cls in list(found):
        for base in cls.__mro__[1:]:
            if isinstance(base, type) and issubclass(base, ImportanceStrategy):
                found.setdefault(base, None)
    return [Case(cls, spec, "strategies") for cls, spec in found.items()]


def legacy_cases() -> list[Case]:
    """The legacy-API classes: one per method, and those ``compat`` exports."""
    by_strategy = {spec.strategy: spec for spec in methods()}
    found: dict[type, MethodSpec | None] = {
        legacy_class(spec.name): spec for spec in methods() if spec.legacy_api
    }
    # Names compat loads on first use (client side, generated classes) are
    # not in its namespace yet; the generated ones are the registry's above.
    for name in compat.__all__:
        value = vars(compat).get(name)
        if isinstance(value, type) and issubclass(value, LegacyStrategy):
            strategy = getattr(value, "message_strategy_class", None)
            found.setdefault(value, by_strategy.get(strategy))
    return [Case(cls, spec, "compat") for cls, spec in found.items()]


CASES = message_cases() + legacy_cases()


def own_docstring(cls: type) -> list[str]:
    """The class's own docstring (never a base's), dedented, as lines."""
    return inspect.cleandoc(cls.__dict__.get("__doc__") or "").splitlines()


def same_default(text: str, value: object) -> bool:
    """Whether a documented default is the signature's (as a literal, or repr)."""
    try:
        literal = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text in (repr(value), str(value))
    return type(literal) is type(value) and literal == value


def implementation_url(cls: type) -> str | None:
    """The URL of the class's ``Implementation based on`` line (third line)."""
    lines = own_docstring(cls)
    match = IMPLEMENTATION.match(lines[2]) if len(lines) > 2 else None
    return match.group(1) if match else None


def method_headings() -> dict[str, str]:
    """docs/methods.md's method headings (``## <n>. <title>``) by anchor."""
    headings = re.findall(r"^## (\d+\..*)$", METHODS_DOC.read_text(), re.M)
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"): heading
        for heading in headings
    }


def method_anchors() -> dict[str, str]:
    """The section anchor of each strategy's row in the table atop docs/methods.md."""
    rows = re.findall(
        r"^\|[^|]*\|[^|]*\| `(\w+)` \|.*\]\(#([\w-]+)\) \|$",
        METHODS_DOC.read_text(),
        re.M,
    )
    return dict(rows)


def parameter_problems(cls: type, lines: list[str]) -> list[str]:
    """How the Parameters and Other Parameters sections miss ``__init__``."""
    signature = inspect.signature(cls.__init__)
    named = {
        name: parameter
        for name, parameter in signature.parameters.items()
        if name != "self"
        and parameter.kind
        in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    var_keyword = [
        f"**{name}"
        for name, parameter in signature.parameters.items()
        if parameter.kind is inspect.Parameter.VAR_KEYWORD
    ]
    problems = []
    body = section(lines, "Parameters")
    if named and body is None:
        return [f"no single 'Parameters' section for {sorted(named)}"]
    documented: dict[str, str | None] = {}
    for entry in entries(body or []):
        if match := WITH_DEFAULT.match(entry):
            documented[match.group(1)] = match.group(2)
        elif match := REQUIRED.match(entry):
            documented[match.group(1)] = None
        else:
            problems.append(
                f"Parameters entry {entry!r} is neither 'name : type (default: x)' "
                "nor 'name : type'"
            )
    for name in sorted(named.keys() - documented.keys()):
        problems.append(f"parameter {name!r} of __init__ is not documented")
    for name in sorted(documented.keys() - named.keys()):
        problems.append(f"documented parameter {name!r} is not in __init__")
    for name in sorted(named.keys() & documented.keys()):
        default, text = named[name].default, documented[name]
        if default is inspect.Parameter.empty and text is not None:
            problems.append(f"{name!r} is required but documented with a default")
        elif default is not inspect.Parameter.empty and text is None:
            problems.append(f"{name!r} lacks '(default: {default!r})'")
        elif text is not None and not same_default(text, default):
            problems.append(
                f"{name!r} documents default {text}, the signature has {default!r}"
            )
    other = section(lines, "Other Parameters")
    if var_keyword and entries(other or []) != var_keyword:
        problems.append(
            f"{var_keyword[0]} is not the one entry of an 'Other Parameters' section"
        )
    return problems


def template_problems(case: Case) -> list[str]:
    """Every way the class's docstring departs from the template."""
    lines = own_docstring(case.cls)
    if not lines:
        return ["no docstring of its own"]
    problems = []
    if not lines[0].endswith(".") or (len(lines) > 1 and lines[1]):
        problems.append("the first line is not a one-line summary and a blank line")
    url = implementation_url(case.cls)
    if case.spec is not None:
        if url is None:
            problems.append(
                "the third line is not 'Implementation based on <paper url>'"
            )
        if case.api == "compat" and url != implementation_url(case.spec.strategy):
            problems.append("its paper URL is not its Message-API class's")
    elif issubclass(case.cls, ImportanceStrategy) and any(
        line.startswith("Implementation based on") for line in lines
    ):
        # A wrapper (CentralDP) has a paper of its own; a method's base has none.
        problems.append("a base class names a paper ('Implementation based on')")
    problems += parameter_problems(case.cls, lines)
    contracts = [name for name, _ in sections(lines) if name == CLIENT_CONTRACT]
    needs_client_side = case.spec is not None and bool(
        case.spec.client_handlers or case.spec.client_queries
    )
    if len(contracts) != int(needs_client_side):
        problems.append(
            f"{len(contracts)} '{CLIENT_CONTRACT}' sections, expected "
            f"{int(needs_client_side)}"
        )
    stray = [
        line
        for line in lines
        if line.strip().startswith(CLIENT_CONTRACT) and line != CLIENT_CONTRACT
    ]
    if stray:
        problems.append(f"a client contract outside its section: {stray[0]!r}")
    if "Decision" in "\n".join(lines):
        problems.append("a decision in the docstring: it belongs in docs/methods.md")
    if case.spec is not None and case.api == "strategies":
        anchor = method_anchors().get(case.spec.strategy.__name__)
        heading = method_headings().get(anchor or "")
        text = " ".join(" ".join(lines).split())
        if heading is None or f'See docs/methods.md, section "{heading}"' not in text:
            problems.append(
                f"no 'See docs/methods.md, section \"{heading}\"' (#{anchor})"
            )
    return problems


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_the_docstring_follows_the_template(case: Case) -> None:
    problems = template_problems(case)
    assert not problems, f"{case.id}'s docstring:\n- " + "\n- ".join(problems)


def test_every_method_and_export_is_checked() -> None:
    checked = {case.cls for case in CASES}
    assert {spec.strategy for spec in methods()} <= checked
    assert {legacy_class(spec.name) for spec in methods() if spec.legacy_api} <= (
        checked
    )
    assert ImportanceStrategy in checked
    assert compat.LegacyStrategyAdapter in checked


def test_the_shared_options_are_documented_once_on_the_base() -> None:
    body = section(own_docstring(ImportanceStrategy), "Parameters")
    assert body is not None
    documented = {entry.split(" : ")[0] for entry in entries(body)}
    missing = sorted(set(StrategyOptions.__annotations__) - documented)
    assert not missing, f"ImportanceStrategy does not document {missing}"


def test_a_broken_docstring_is_reported() -> None:
    class Broken(ImportanceStrategy):
        """Broken

        Parameters
        ----------
        seed : int, default 0
            Not the template's form.

        Notes
        -----
        Client contract (:mod:`somewhere`): **Decision:** repeated here.
        """

    spec = next(iter(methods()))
    problems = template_problems(Case(Broken, spec, "strategies"))
    for expected in (
        "one-line summary",
        "Implementation based on",
        "'seed' lacks '(default: 0)'",
        "'query_timeout' of __init__ is not documented",
        "**unknown",
        "0 'Client contract' sections, expected 1",
        "a client contract outside its section",
        "a decision in the docstring",
        "See docs/methods.md",
    ):
        assert any(expected in problem for problem in problems), (expected, problems)

"""docs/protocol.md documents every key the code puts on the wire.

The keys the strategies, the client helpers and the legacy transport use are
found by reading their source (``protocol.NAME`` and ``from
flwr_importance.protocol import NAME``); a key counts as documented in a text
when one of its code spans names it (a span ``update-norm-<s>`` names
``update-norm``, a span ``query.norm`` names ``norm``). Each registry method's
section of the page must name the keys of its strategy's modules and of its
client handlers; every constant of ``protocol.__all__`` must be documented
and used, and every constant the page names must exist. A one-round run of
each method in process then checks the messages themselves: every record
name, config key and metric key that crossed the wire is named in the
method's section or in the shared conventions, literal keys included. The
module's doctests run under pytest's ``--doctest-modules``.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from pathlib import Path

import pytest
from flwr.app import Message

import flwr_importance
from flwr_importance import protocol, registry
from simulations.inprocess import run_inprocess

PACKAGE_DIR = Path(flwr_importance.__file__).parent
#: The page that documents the wire protocol, method by method.
PROTOCOL_DOC = PACKAGE_DIR.parent / "docs" / "protocol.md"
#: The packages whose modules put keys on the wire.
SCANNED_PACKAGES = ("strategies", "clientapps", "compat")
#: The top-level modules that do too: the legacy transport's format, which
#: both of its ends (in ``clientapps`` and ``compat``) read its keys from.
SCANNED_MODULES = ("legacy_wire",)
#: The strategy plumbing every method shares: its keys belong to the
#: conventions section, not to a method's.
SHARED_STRATEGY_MODULES = ("base", "messages", "replies")
CONVENTIONS_HEADING = "Conventions shared by every method"
#: The section of the queries a method may send without a section of its own.
STANDARD_QUERIES_HEADING = "The standard queries"
STANDARD_QUERIES = frozenset({protocol.SIZES_QUERY, protocol.LOSS_QUERY})
#: The default record names and the helpers' error marker: every method's
#: messages and replies use them, and the conventions section documents them
#: once for all.
RECORD_NAMES = frozenset(
    {"ARRAY_RECORD", "CONFIG_RECORD", "METRIC_RECORD", "CLIENT_SIDE_MISCONFIGURED"}
)
LEGACY_HEADING = "Legacy API"

#: The runs whose messages are checked: each registry method as the app runs
#: it, and the variants that send other messages, with the message type
#: each run must show. Small and short: one round on four nodes.
WIRE_RUNS = [
    *((spec.name, {}, "train") for spec in registry.methods()),
    ("folb", {"folb-mode": "two-set"}, "query.gradient"),
    ("mmfl", {"mmfl-variant": "loss"}, "query.loss"),
    ("mmfl", {"mmfl-variant": "random"}, "query.sizes"),
]
WIRE_RUN_CONFIG = {
    "partitioning": "iid",
    "num-server-rounds": 1,
    "clients-per-round": 2,
    "local-steps": 1,
    "mmfl-tasks": "digits:iid,digits:iid",
}

#: A constant's name, as the page writes it in a code span.
CONSTANT = re.compile(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+")

#: What may follow a key in a literal that names it: a model index, the
#: placeholder of one, or an action after ``query``; then ``= value``.
_KEY_SUFFIX = r"(-<s>|-0|<s>|0|\.<action>)?( = .+)?"


def protocol_constants() -> dict[str, str]:
    """The public string constants of ``protocol.py`` (its ``__all__``), by name."""
    return {
        name: value
        for name in protocol.__all__
        if isinstance(value := getattr(protocol, name), str)
    }


@functools.cache
def protocol_doc() -> str:
    """The text of docs/protocol.md."""
    return PROTOCOL_DOC.read_text(encoding="utf-8")


@functools.cache
def module_tree(path: Path) -> ast.Module:
    """The parsed source of ``path``."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def scanned_modules() -> list[Path]:
    """Every module of the scanned packages, and the scanned modules, on disk."""
    return sorted(
        [
            *(
                path
                for package in SCANNED_PACKAGES
                for path in (PACKAGE_DIR / package).glob("*.py")
            ),
            *(PACKAGE_DIR / f"{name}.py" for name in SCANNED_MODULES),
        ]
    )


def referenced_constants(tree: ast.AST) -> set[str]:
    """The protocol constants a module reads: ``protocol.NAME`` or imported."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "protocol"
        ):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == protocol.__name__:
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.isupper()}


def module_path(dotted: str) -> Path:
    """The source file of the package module ``dotted``, without importing it."""
    return PACKAGE_DIR.parent.joinpath(*dotted.split(".")).with_suffix(".py")


def sections(markdown: str) -> dict[str, str]:
    """The page's ``## `` sections (heading, then text up to the next) by heading."""
    lines = markdown.splitlines()
    starts = [index for index, line in enumerate(lines) if line.startswith("## ")]
    return {
        lines[start].removeprefix("## ").strip(): "\n".join(lines[start + 1 : end])
        for start, end in zip(starts, [*starts[1:], len(lines)], strict=True)
    }


def code_spans(text: str) -> list[str]:
    """The markdown code spans of ``text`` (one backquote each side)."""
    return re.findall(r"`([^`]+)`", text)


def names_key(text: str, value: str) -> bool:
    """Whether a code span of ``text`` names the key ``value``."""
    pattern = rf"(query\.)?{re.escape(value)}{_KEY_SUFFIX}"
    return any(
        re.fullmatch(pattern, " ".join(literal.split())) for literal in code_spans(text)
    )


def undocumented(text: str, names: set[str]) -> list[str]:
    """Those of the constants ``names`` whose value ``text`` does not name."""
    constants = protocol_constants()
    return sorted(name for name in names if not names_key(text, constants[name]))


def section_of(heading_part: str) -> str:
    """The one section whose heading holds ``heading_part``."""
    matches = [
        text
        for heading, text in sections(protocol_doc()).items()
        if heading_part in heading
    ]
    assert len(matches) == 1, f"{len(matches)} sections headed with {heading_part!r}"
    return matches[0]


def method_modules(spec: registry.MethodSpec) -> list[Path]:
    """The modules that speak a method's wire contract.

    Its strategy's own modules (the classes of its MRO in
    ``flwr_importance.strategies``, but the shared plumbing) and its client
    handlers' module, if it declares one (a method with standard
    ``client_queries`` only has those: :func:`test_each_method_section_names_its_keys`
    checks them by action).
    """
    shared = {f"flwr_importance.strategies.{name}" for name in SHARED_STRATEGY_MODULES}
    modules = {
        cls.__module__
        for cls in spec.strategy.__mro__
        if cls.__module__.startswith("flwr_importance.strategies.")
        and cls.__module__ not in shared
    }
    if spec.client_handlers:
        modules.add(spec.client_handlers.partition(":")[0])
    return [module_path(name) for name in sorted(modules)]


def test_every_key_the_code_uses_is_a_documented_constant() -> None:
    constants = protocol_constants()
    for path in scanned_modules():
        used = referenced_constants(module_tree(path))
        unknown = sorted(used - constants.keys())
        assert not unknown, f"{path.name} reads protocol.{unknown}, which do not exist"
        missing = undocumented(protocol_doc(), used)
        assert not missing, f"{path.name} uses {missing}, not named in docs/protocol.md"


def test_every_constant_is_documented() -> None:
    missing = undocumented(protocol_doc(), set(protocol_constants()))
    assert not missing, f"constants not named in docs/protocol.md: {missing}"


def test_all_lists_every_public_name() -> None:
    public = {
        name
        for name, value in vars(protocol).items()
        if not name.startswith("_")
        and (isinstance(value, str) or inspect.isfunction(value))
    }
    assert sorted(protocol.__all__) == sorted(public)


def test_every_constant_the_page_names_exists() -> None:
    named = {span for span in code_spans(protocol_doc()) if CONSTANT.fullmatch(span)}
    unknown = sorted(named - set(protocol.__all__))
    assert not unknown, f"docs/protocol.md names constants protocol lacks: {unknown}"
    functions = {
        span.removesuffix("()")
        for span in code_spans(protocol_doc())
        if re.fullmatch(r"[a-z_]+\(\)", span)
    }
    assert functions <= set(protocol.__all__), functions - set(protocol.__all__)


def has_section(name: str) -> bool:
    """Whether a section heading of the page names the method ``name``."""
    return any(f"`{name}`" in heading for heading in sections(protocol_doc()))


def method_text(name: str) -> str:
    """The section documenting method ``name``'s messages.

    Its own, else the standard queries' section (:func:`check_standard_only`).
    """
    if has_section(name):
        return section_of(f"`{name}`")
    check_standard_only(registry.method(name))
    return section_of(STANDARD_QUERIES_HEADING)


def check_standard_only(spec: registry.MethodSpec) -> None:
    """A method without a section sends only standard queries, needs no client code."""
    assert not spec.client_handlers and set(spec.client_queries) <= STANDARD_QUERIES, (
        f"{spec.name} sends more than the standard queries: it needs a section"
    )


def test_a_method_of_other_queries_needs_a_section() -> None:
    check_standard_only(registry.method("power-of-choice"))
    with pytest.raises(AssertionError, match="ocs sends more"):
        check_standard_only(registry.method("ocs"))


@pytest.mark.parametrize("name", [spec.name for spec in registry.methods()])
def test_each_method_section_names_its_keys(name: str) -> None:
    section = method_text(name)
    for path in method_modules(registry.method(name)):
        used = referenced_constants(module_tree(path)) - RECORD_NAMES
        missing = undocumented(section, used)
        assert not missing, (
            f"the {name} section of docs/protocol.md does not name {missing}, "
            f"used in {path.relative_to(PACKAGE_DIR.parent)}"
        )
    for action in registry.method(name).client_queries:
        assert names_key(section, protocol.query_message_type(action)), action


def test_shared_and_legacy_keys_are_in_their_sections() -> None:
    shared = set().union(
        *(
            referenced_constants(module_tree(PACKAGE_DIR / "strategies" / f"{name}.py"))
            for name in SHARED_STRATEGY_MODULES
        )
    )
    assert not undocumented(section_of(CONVENTIONS_HEADING), shared | RECORD_NAMES)
    legacy = set().union(
        *(referenced_constants(module_tree(path)) for path in scanned_modules())
    )
    legacy = {name for name in legacy if name.startswith("COMPAT_")}
    assert not undocumented(section_of(LEGACY_HEADING), legacy)


def test_every_constant_is_used() -> None:
    trees = [module_tree(path) for path in scanned_modules()]
    referenced = set().union(*(referenced_constants(tree) for tree in trees))
    # The protocol's own functions build names from constants
    # (query_message_type from QUERY_CATEGORY).
    referenced |= {
        node.id
        for function in module_tree(module_path(protocol.__name__)).body
        if isinstance(function, ast.FunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and node.id.isupper()
    }
    unused = sorted(set(protocol_constants()) - referenced)
    assert not unused, (
        f"protocol constants nothing in {SCANNED_PACKAGES + SCANNED_MODULES} "
        f"uses: {unused}"
    )


def test_the_checks_catch_an_undocumented_key() -> None:
    tree = ast.parse(
        "from flwr_importance.protocol import SIZES_QUERY\n"
        "config[protocol.BRAND_NEW_KEY] = protocol.query_message_type('x')\n"
    )
    assert referenced_constants(tree) == {"SIZES_QUERY", "BRAND_NEW_KEY"}
    assert not names_key(protocol_doc(), "brand-new-key")
    assert names_key("reply `update-norm-<s>`", protocol.UPDATE_NORM)
    assert names_key("`query.norm`", protocol.NORM_QUERY)
    assert names_key("`kept-update = true`", protocol.KEPT_UPDATE)
    # A longer key is not its prefix: ``update-norm`` does not name ``update``.
    assert not names_key("reply `update-norm-<s>`", protocol.UPDATE_RECORD)
    assert undocumented("only `num-examples`", {"NUM_EXAMPLES", "TRAIN_LOSS"}) == [
        "TRAIN_LOSS"
    ]
    assert list(sections("intro\n## A (`a`)\ntext\n## B\nmore")) == ["A (`a`)", "B"]


def wire_names(message: Message) -> set[str]:
    """The record names and the config and metric keys of a message."""
    content = message.content
    names = {
        *content.array_records,
        *content.config_records,
        *content.metric_records,
    }
    for records in (content.config_records, content.metric_records):
        for record in records.values():
            names.update(record)
    return names


def documented_on_wire(text: str, name: str) -> bool:
    """Whether ``text`` names a key seen on the wire (``loss-1`` as ``loss-<s>``)."""
    per_model = re.fullmatch(r"(.+)-\d+", name)
    return names_key(text, name) or (
        per_model is not None and names_key(text, per_model.group(1))
    )


@pytest.mark.parametrize(
    ("name", "overrides", "message_type"),
    WIRE_RUNS,
    ids=[f"{name}-{message_type}" for name, _, message_type in WIRE_RUNS],
)
def test_every_name_on_the_wire_is_documented(
    name: str,
    overrides: dict[str, str],
    message_type: str,
    tmp_path: Path,
) -> None:
    _, grid = run_inprocess(
        {
            **WIRE_RUN_CONFIG,
            **overrides,
            "strategy": name,
            "output-dir": str(tmp_path),
        },
        num_clients=4,
    )
    assert message_type in {record.message_type for record in grid.wire_log}
    text = method_text(name) + section_of(CONVENTIONS_HEADING)
    missing = sorted(
        {
            f"{record.message_type} {record.direction}: {key}"
            for record in grid.wire_log
            for key in wire_names(record.message())
            if not documented_on_wire(text, key)
        }
    )
    assert not missing, f"sent but not named in the {name} section: {missing}"

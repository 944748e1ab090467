"""CONTRIBUTING.md's "Adding a method" states the files a method changes, truly.

The section says in how many files outside ``tests/`` a method whose clients
only answer the standard queries is written, how many more commands rewrite
from them, and lists them, one numbered item per file, each opening with its
path (``<module>``: the method's name with ``_`` for ``-``; ``<name>``: its
name; ``<setting>``: any), the rewritten ones last, each saying "not by hand".
The counts must be the list's, and every listed path, for Power-of-Choice
(such a method), must exist and name the method: a path that moved, or a file
the method no longer needs, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
#: The method the list is checked on, and how its files name it.
EXAMPLE = {"<module>": "power_of_choice", "<name>": "power-of-choice"}
MENTIONS = ("power-of-choice", "power_of_choice", "PowerOfChoice")

COUNTS = re.compile(
    r"is written in (?P<written>\d+) files outside `tests/` \(items 1-(?P=written)\),"
    r" from which two commands rewrite (?P<rewritten>\d+) more \(items"
    r" (?P<first>\d+)-(?P<last>\d+), not by hand\), so its commit changes"
    r" (?P<changed>\d+)".replace(" ", r"\s+")
)
ITEM = re.compile(r"^(\d+)\. `([^`]+)`", re.M)
#: An item: its number, its path, and its text up to the next item.
ITEM_TEXT = re.compile(r"^(\d+)\. `([^`]+)`(.*?)(?=^\d+\. `|\n\n)", re.M | re.S)


def section() -> str:
    """The text of the "## Adding a method" section."""
    text = CONTRIBUTING.read_text()
    start = text.index("\n## Adding a method\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def listed() -> list[tuple[int, str]]:
    """The numbered items of the section: each number and its path pattern."""
    return [(int(number), path) for number, path in ITEM.findall(section())]


def instances(pattern: str) -> list[Path]:
    """The repository's files a path pattern names for Power-of-Choice."""
    for placeholder, value in EXAMPLE.items():
        pattern = pattern.replace(placeholder, value)
    return sorted(ROOT.glob(pattern.replace("<setting>", "*")))


def test_the_stated_counts_are_those_of_the_listed_files() -> None:
    counts = [match.groupdict() for match in COUNTS.finditer(section())]
    assert len(counts) == 1, "the section states no single count of its files"
    count = {key: int(value) for key, value in counts[0].items()}
    items = listed()
    assert [number for number, _ in items] == list(range(1, len(items) + 1))
    assert count["changed"] == len(items)
    assert count["written"] + count["rewritten"] == len(items)
    assert (count["first"], count["last"]) == (count["written"] + 1, len(items))
    by_hand = {
        int(number): "not by hand" not in " ".join(text.split())
        for number, _, text in ITEM_TEXT.findall(section())
    }
    assert sorted(by_hand) == [number for number, _ in items]
    assert [number for number, hand in by_hand.items() if hand] == list(
        range(1, count["written"] + 1)
    ), "the items written by hand come first, the rewritten ones say 'not by hand'"
    paths = [path for _, path in items]
    assert len(set(paths)) == len(paths), paths
    assert all(not path.startswith("tests/") for path in paths)


def test_the_pattern_check_instantiates_and_globs() -> None:
    assert instances("benchmarks/<module>.py") == [
        ROOT / "benchmarks" / "power_of_choice.py"
    ]
    assert instances("no/such/<name>.py") == []


@pytest.mark.parametrize("pattern", [path for _, path in listed()])
def test_every_listed_file_exists_and_names_the_method(pattern: str) -> None:
    found = instances(pattern)
    assert found, f"{pattern} names no file for power-of-choice"
    for path in found:
        text = path.read_text()
        assert any(mention in text for mention in MENTIONS), (
            f"{path.relative_to(ROOT)} never names power-of-choice"
        )

"""Reading numpydoc docstrings in tests: their sections and entries."""

from __future__ import annotations


def sections(lines: list[str]) -> list[tuple[str, list[str]]]:
    """Each numpydoc section as (heading, body lines), in order, repeats kept."""
    starts = [
        index
        for index in range(len(lines) - 1)
        if lines[index].strip()
        and set(lines[index + 1]) == {"-"}
        and len(lines[index + 1]) == len(lines[index])
    ]
    ends = [*starts[1:], len(lines)] if starts else []
    return [
        (lines[start], lines[start + 2 : end])
        for start, end in zip(starts, ends, strict=True)
    ]


def entries(body: list[str]) -> list[str]:
    """A section's entries: its unindented lines (descriptions are indented)."""
    return [line for line in body if line and not line[0].isspace()]


def section(lines: list[str], heading: str) -> list[str] | None:
    """The body of the one section named ``heading``, or None."""
    bodies = [body for name, body in sections(lines) if name == heading]
    return bodies[0] if len(bodies) == 1 else None

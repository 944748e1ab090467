"""The long description: README.md with its repository links made absolute.

The README links to files of the repository (``docs/methods.md``, ...) by
relative paths, which work on the repository's own pages and nowhere else; the
package index renders the long description away from the repository, so the
distribution's copy points them at the ``Repository`` URL of ``pyproject.toml``.
Everything else is in ``pyproject.toml``.
"""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pyproject's build requirements add tomli
    import tomli as tomllib

#: A Markdown link's or image's target: ``](target)``.
_LINK_TARGET = re.compile(r"\]\((?P<target>[^)\s]+)\)")

#: Targets that are already absolute (a scheme or ``//``) or within the page.
_ABSOLUTE_OR_ANCHOR = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//|#)")


def absolute_links(markdown: str, *, repository: str, ref: str = "main") -> str:
    """The Markdown with every relative link pointed at the repository's files.

    Parameters
    ----------
    markdown : str
        The text, e.g. the README.
    repository : str
        The repository's URL, e.g. ``https://github.com/owner/name``.
    ref : str (default: "main")
        The branch or tag the links name.

    Returns
    -------
    str
        The same text with each relative target ``path`` replaced by
        ``<repository>/blob/<ref>/path``; absolute URLs and in-page anchors
        are left as they are.

    Examples
    --------
    >>> absolute_links(
    ...     "[methods](docs/methods.md#ocs) and [Flower](https://flower.ai)",
    ...     repository="https://github.com/o/r",
    ... )
    '[methods](https://github.com/o/r/blob/main/docs/methods.md#ocs) and [Flower](https://flower.ai)'
    """
    base = f"{repository.rstrip('/')}/blob/{ref}/"

    def absolute(match: re.Match[str]) -> str:
        target = match["target"]
        if _ABSOLUTE_OR_ANCHOR.match(target):
            return match[0]
        return f"]({base}{target.removeprefix('./')})"

    return _LINK_TARGET.sub(absolute, markdown)


def long_description(root: Path) -> str:
    """The README of the project at ``root``, its links made absolute."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return absolute_links(
        (root / "README.md").read_text(encoding="utf-8"),
        repository=project["project"]["urls"]["Repository"],
    )


if __name__ == "__main__":
    from setuptools import setup

    setup(
        long_description=long_description(Path(__file__).parent),
        long_description_content_type="text/markdown",
    )

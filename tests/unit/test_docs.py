"""The documentation a user reads without the contract file: every link resolves inside
the repository (a clone has nothing beside it), and the reference names every public
name of `printery` with its real signature."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import printery
import printery.ext

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves_inside_the_repository(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not a file of the repository
        path_part, _, anchor = target.partition("#")
        resolved = (doc.parent / path_part).resolve() if path_part else doc
        inside = resolved.is_relative_to(ROOT) and resolved.exists()
        anchored = not anchor or resolved.suffix != ".md" or anchor in anchors(resolved)
        if not (inside and anchored):
            broken.append(target)
    assert not broken, f"{doc.name}: links that do not resolve in a clone: {broken}"


def render(obj: object) -> str:
    """A signature as the reference writes it: names, kinds and simple defaults."""
    parts: list[str] = []
    star = False
    for p in inspect.signature(obj).parameters.values():  # type: ignore[arg-type]
        if p.kind is p.VAR_POSITIONAL:
            parts.append("*" + p.name)
            star = True
            continue
        if p.kind is p.VAR_KEYWORD:
            parts.append("**" + p.name)
            continue
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.default is p.empty:
            parts.append(p.name)
        else:
            simple = isinstance(p.default, str | int | float | bool | tuple | type(None))
            factory = type(p.default).__name__ == "_HAS_DEFAULT_FACTORY_CLASS"
            parts.append(f"{p.name}={repr(p.default) if simple and not factory else '...'}")
    return f"{obj.__name__}({', '.join(parts)})"  # type: ignore[attr-defined]


def test_reference_names_every_public_name_with_its_signature() -> None:
    text = REFERENCE.read_text()
    names = [*printery.__all__, *printery.ext.__all__]  # both faces and the extension surface
    missing = [name for name in names if f"`{name}`" not in text and f"\n{name}(" not in text]
    assert not missing, f"docs/reference.md does not mention {missing}"
    wrong = []
    for name in names:
        obj = getattr(printery, name)
        if name == "WorkerState" or getattr(obj, "_is_protocol", False) or not callable(obj) or (
                isinstance(obj, type) and issubclass(obj, BaseException) and "__init__" not in vars(obj)):
            continue  # a protocol, an enum, exceptions without arguments of their own
        try:
            signature = render(obj)
        except (TypeError, ValueError):
            continue  # a type alias (Handler, MergePolicy)
        if f"\n{signature}\n" not in text:
            wrong.append(signature)
    assert not wrong, "signatures missing from docs/reference.md (or changed):\n" + "\n".join(wrong)


#: How a citation of the external contract file looked: the word in capitals followed by
#: a section sign or a version, or a bare section sign and a number (built from parts, so
#: that this file does not match itself).
CITATION = re.compile("contract".upper() + r"(\s+v\d|\s*\u00a7)|\u00a7\s*\d")
#: Where a user or a contributor reads: the contract of this project is docs/reference.md.
READ = ("src", "docs", "examples", "tests", "README.md", "pyproject.toml", "Makefile")
TEXT = {".py", ".md", ".lua", ".toml", ".html", ".js", ".css", ".txt", ".cfg", ""}


def test_nothing_cites_a_document_outside_the_repository() -> None:
    """Code, help text and docs cite sections of docs/reference.md, never the contract
    file the project was specified with (users do not have it)."""
    found = []
    for top in READ:
        root = ROOT / top
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if (not path.is_file() or path.suffix not in TEXT or "__pycache__" in path.parts
                    or any(part.endswith(".egg-info") for part in path.parts)):
                continue  # (an install's metadata copies the README as it was then)
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if CITATION.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "citations of the contract file:\n" + "\n".join(found)

"""The console's rooms: console/ is what inbox/ and insights/ build on, so it imports neither."""

from __future__ import annotations

import ast

from tests.conftest import ROOT


def imported_modules(path: str) -> set[str]:
    names: set[str] = set()
    for file in (ROOT / path).rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    return names


def test_the_console_imports_neither_the_inbox_nor_insights() -> None:
    imported = imported_modules("console")
    assert not {m for m in imported if m.split(".")[0] in ("inbox", "insights")}, imported


def test_the_inbox_and_insights_take_the_console_helpers_from_the_console() -> None:
    for app in ("inbox", "insights"):
        assert "runs.views" not in imported_modules(app), app


def test_only_pages_import_the_console() -> None:
    """The holds API imported the console (its selection and bulk repair lived there): the holds
    selection and bulk repair are now services in runs/ (holds.py, repair.py) that the API and
    the console both call. Outside console/, only page modules (views) may use the console."""
    offenders = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith((".venv/", "console/", "tests/")) or relative.endswith("/views.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            modules += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if any(module == "console" or module.startswith("console.") for module in modules):
                offenders.append(relative)
    assert not offenders, offenders

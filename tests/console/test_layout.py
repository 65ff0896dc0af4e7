"""The console's rooms: the console is the top of the apps (its pages import runs, the inbox and
insights; no app imports the console), and its shared helpers import none of its pages."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT


def imported_modules_of(file: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_consoles_shared_helpers_import_none_of_its_pages() -> None:
    pages = ("console.run_pages", "console.inbox_pages", "console.insights_pages", "console.holds")
    assert not imported_modules_of(ROOT / "console" / "views.py") & set(pages)


def test_no_app_imports_the_console() -> None:
    """The holds API imported the console (its selection and bulk repair lived there): the holds
    selection and bulk repair are now services in runs/ (holds.py, repair.py) that the API and
    the console both call. The pages of runs, the inbox and insights lived in those apps and
    imported the console's helpers; they are the console's now. Nothing outside console/ imports it."""
    offenders = []
    for path in sorted(ROOT.glob("*/**/*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith((".venv/", "console/", "tests/")):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            modules += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if any(module == "console" or module.startswith("console.") for module in modules):
                offenders.append(relative)
    assert not offenders, offenders

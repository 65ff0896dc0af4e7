"""oz0's apps by job (issue 28): tenancy (workspaces, membership, tokens, roles) is the bottom,
and `runs` no longer holds it.

tenancy imports no other oz0 package, so every app may import it and it imports none of them
back; runs/models.py neither defines nor re-exports its models, and no module reaches for them,
or for the membership stamps, the tokens or the roles, through `runs`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TENANCY = ROOT / "tenancy"
MOVED_MODELS = frozenset({"Role", "Workspace", "Membership", "ApiToken"})
# What left runs for tenancy: whole modules, and names of runs modules that stayed.
MOVED_MODULES = frozenset({"runs.membership", "runs.tokens"})
MOVED_NAMES = {
    "runs.models": MOVED_MODELS,
    "runs.permissions": frozenset({"role_of", "is_member", "has_write_standing", "ROLE_RANK"}),
}


def oz0_packages() -> set[str]:
    """oz0's own top-level packages: the apps, the site, the command line, the bench, the tests."""
    return {path.parent.name for path in ROOT.glob("*/__init__.py") if not path.parent.name.startswith(".")}


def imports_of(source: str) -> list[tuple[int, str, list[str]]]:
    """(line, module, imported names) of every absolute import, at any depth (a function's too)."""
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def foreign_imports(source: str, packages: set[str]) -> list[str]:
    """Imports of a module of another oz0 package (`packages` names them)."""
    return [f"{line}: {module}" for line, module, _ in imports_of(source) if module.split(".")[0] in packages]


def moved_imports(source: str) -> list[str]:
    """Imports that still look for tenancy's code in runs."""
    offenders = []
    for line, module, names in imports_of(source):
        if module in MOVED_MODULES:
            offenders.append(f"{line}: {module}")
        elif module == "runs":
            offenders.extend(f"{line}: runs.{name}" for name in names if f"runs.{name}" in MOVED_MODULES)
        offenders.extend(f"{line}: {module}.{name}" for name in names if name in MOVED_NAMES.get(module, ()))
    return offenders


def classes_and_names_bound(source: str) -> set[str]:
    """Names a module binds at its top level: classes, imports and assignments."""
    bound: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return bound


def python_files() -> list[Path]:
    return [path for package in sorted(oz0_packages()) for path in sorted((ROOT / package).rglob("*.py"))]


def test_tenancy_imports_no_other_oz0_package() -> None:
    others = oz0_packages() - {"tenancy"}
    assert {"runs", "oz0agents", "console", "oz0site"} <= others
    offenders = [
        f"{path.relative_to(ROOT)}:{found}"
        for path in sorted(TENANCY.rglob("*.py"))
        for found in foreign_imports(path.read_text(), others)
    ]
    assert not offenders, "tenancy is the bottom of oz0's apps: it imports none of them\n" + "\n".join(offenders)


def test_runs_models_neither_defines_nor_re_exports_tenancy_s_models() -> None:
    held = classes_and_names_bound((ROOT / "runs" / "models.py").read_text()) & MOVED_MODELS
    assert not held, f"runs/models.py still holds {sorted(held)}: they are tenancy's (tenancy/models.py)"
    assert not (ROOT / "runs" / "membership.py").exists() and not (ROOT / "runs" / "tokens.py").exists()


def test_no_module_looks_for_tenancy_s_code_in_runs() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{found}"
        for path in python_files()
        if "migrations" not in path.parts
        for found in moved_imports(path.read_text())
    ]
    assert not offenders, "import workspaces, membership, tokens and roles from tenancy:\n" + "\n".join(offenders)


def test_the_checks_would_catch_an_import_past_the_bottom() -> None:
    assert foreign_imports("from runs.kernel import Conflict\n", {"runs"}) == ["1: runs.kernel"]
    assert foreign_imports("def f():\n    import console.views\n", {"console"}) == ["2: console.views"]
    assert foreign_imports("from django.db import models\nfrom tenancy.models import Role\n", {"runs"}) == []
    assert classes_and_names_bound("from tenancy.models import Workspace\nclass Run: ...\n") == {"Workspace", "Run"}
    assert moved_imports("from runs.models import Run, Membership\n") == ["1: runs.models.Membership"]
    assert moved_imports("def f():\n    from runs import kernel, tokens\n") == ["2: runs.tokens"]
    assert moved_imports("from runs.permissions import can_read_content, role_of\n") == ["1: runs.permissions.role_of"]
    assert moved_imports("from runs.permissions import can_read_content\nfrom tenancy.tokens import issue\n") == []

"""The agents app's boundary: what it takes from `runs`, and what others take from it.

agents/ reads from runs only the kernel's public surface (its errors), the platform's vocabulary
a manifest is checked against (failure kinds, the tool registry, the timeout cap) and the API's
error shape; workspaces, roles and standing are tenancy's. runs/ reaches into agents only for the
data it runs on (models, registry, lint), never its HTTP or access layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Every runs module agents/ may import, with why.
AGENTS_MAY_IMPORT_FROM_RUNS = {
    "runs.kernel": "the kernel's public surface: its errors, and MAX_TIMEOUT_SECONDS, the one cap a `timeout_s` is checked against",
    "runs.failures": "PLATFORM_KINDS, which an agent may never declare",
    "runs.tools": "the tool registry, which says whether a listed tool is served here",
    "runs.schemas": "ErrorOut, the API's error shape",
    "runs.worker.harness.bridges": "lint asks a confined bridge whether an import target loads (never this process)",
}
# The layers of agents/ nothing in runs/ may import.
RUNS_MAY_NOT_IMPORT = ("oz0agents.api", "oz0agents.access", "oz0agents.management")


def _modules(folder: str) -> list[Path]:
    return [p for p in sorted((ROOT / folder).rglob("*.py")) if "migrations" not in p.parts]


def _imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, module, at module level) of every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "oz0agents" else [f"oz0agents.{a.name}" for a in node.names]
            found.extend((node.lineno, name, id(node) in top) for name in names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, id(node) in top) for alias in node.names)
    return found


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_agents_imports_from_runs_only_what_it_names() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in _modules("oz0agents")
        for line, module, _ in _imports(path)
        if _in(module, "runs") and module not in AGENTS_MAY_IMPORT_FROM_RUNS
    ]
    assert not offenders, "agents/ imports from runs beyond its boundary:\n" + "\n".join(offenders)


def test_runs_does_not_reach_into_the_agents_api_or_access_rules() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in _modules("runs")
        for line, module, _ in _imports(path)
        if any(_in(module, layer) for layer in RUNS_MAY_NOT_IMPORT)
    ]
    assert not offenders, "runs/ imports the agents app's outer layers:\n" + "\n".join(offenders)


def test_agents_imports_at_module_level_only() -> None:
    """A function-level import hides a cycle; the app has none to hide."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in _modules("oz0agents")
        for line, module, top in _imports(path)
        if not top and module != "__future__"
    ]
    assert not offenders, "function-level imports in agents/:\n" + "\n".join(offenders)


def test_nothing_is_left_of_the_agent_modules_in_runs() -> None:
    for old in ("runs/manifests.py", "runs/agents.py", "runs/agents_api.py", "runs/management/commands/plugin_lint.py"):
        assert not (ROOT / old).exists(), f"{old} moved to agents/"
    assert not list((ROOT / "oz0agents").glob("*.yaml")), "the example manifests live in oz0agents/examples/"
    assert len(list((ROOT / "oz0agents" / "examples").glob("*.yaml"))) >= 2


def test_the_checks_would_catch_an_import_past_the_boundary(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from runs.views import x\n\ndef f():\n    from runs.models import Run\n")
    found = _imports(module)
    assert (1, "runs.views", True) in found and (4, "runs.models", False) in found
    assert "runs.views" not in AGENTS_MAY_IMPORT_FROM_RUNS


def test_no_app_of_oz0_shadows_a_top_level_package_of_its_dependencies() -> None:
    """The agents app was a package named `agents`, the OpenAI Agents SDK's own top-level name:
    importing the SDK from oz0's tree found oz0's app, and its bridge had to rewrite sys.path."""
    from importlib.metadata import packages_distributions

    installed = set(packages_distributions())
    ours = {path.parent.name for path in ROOT.glob("*/__init__.py") if not path.parent.name.startswith(".")}
    assert "agents" in installed  # the SDK is installed, so the check below means something
    assert not ours & installed, ours & installed

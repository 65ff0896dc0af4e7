"""The kernel owns run state, and side effects wait for commit (STYLE.md 1 and 3)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.db import transaction

ROOT = Path(__file__).resolve().parents[2]


RUN_OR_TASK_STATUS = re.compile(r"\b(run|task|\w+_run|\w+_task)\.status\s*=(?!=)")
QUERYSET_STATUS = re.compile(
    r"\b(Run|Task)\.objects\b.*\.(update|create|bulk_update|get_or_create|update_or_create)\(.*\bstatus\s*="
)


def test_it_assigns_statuses_only_in_the_kernel() -> None:
    offenders = []
    for path in ROOT.glob("*/**/*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith((".venv/", "runs/kernel/", "tests/", "bench/")) or "/migrations/" in relative:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if RUN_OR_TASK_STATUS.search(code) or QUERYSET_STATUS.search(code):
                offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, "status written outside runs/kernel:\n" + "\n".join(offenders)


def test_it_would_catch_a_status_written_outside_the_kernel() -> None:
    assert RUN_OR_TASK_STATUS.search("    run.status = 'completed'")
    assert QUERYSET_STATUS.search("Task.objects.filter(pk=1).update(status='failed')")
    assert not RUN_OR_TASK_STATUS.search("    self.http_status = status")


@pytest.mark.django_db
def test_it_fails_a_send_inside_an_open_transaction() -> None:
    from runs.worker.tasks import noop

    with pytest.raises(AssertionError, match="inside an open transaction"), transaction.atomic():
        noop.delay()


@pytest.mark.django_db
def test_it_fails_a_broadcast_inside_an_open_transaction() -> None:
    from oz0site import realtime

    with pytest.raises(AssertionError, match="inside an open transaction"), transaction.atomic():
        realtime.publish(["run.x"], {"type": "run.changed"})


# ---- the kernel's shape: one surface, layers that import one way, no Celery ----

KERNEL = ROOT / "runs" / "kernel"
# Each kernel module imports only from modules of earlier layers (never its own layer, never later).
KERNEL_LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "numbers"}),  # typed refusals; what a JSON number is
    frozenset(
        {"graph", "access", "approvals", "guards", "output_schemas", "priorities"}
    ),  # pure rules, status groups, who acts, approvals, guards, output schemas, priorities
    frozenset({"templates", "request_shapes"}),  # flow templates (read with the guards' parser); the request contract
    frozenset({"compile", "candidates"}),  # a request compiled (no HTTP, no writes); repair candidates
    frozenset({"bulk"}),  # set-based writes of many rows in one statement (unnest), each a compare-and-set
    frozenset({"holder_sessions"}),  # a worker's database sessions: named after it, ended when it froze mid-transaction
    frozenset({"txn"}),  # Txn: a transaction's changes recorded (compare-and-set moves, the one completion path)
    frozenset({"children"}),  # a ready delegate task's child run opened (the parent's side)
    frozenset({"scheduling"}),  # evaluate, release, start, joins, a failure's policy
    frozenset({"settling", "failure"}),  # run quiescence, holds, cancels / auto-retry, replayability
    frozenset({"expansion", "delegation"}),  # tasks enter a run (add_tasks, expand); a child's end / a parent's stop
    frozenset({"commit"}),  # the unit of work: locked(), commit() in order, sends, cross-run messages
    frozenset({"intake", "verbs", "worker", "sweeps"}),  # create/append, verbs, the worker protocol, clocks and lost work
    frozenset(
        {"journal", "releases"}
    ),  # a harnessed round's journal of calls; a waiting session released and reattached (both through the worker protocol)
    frozenset({"leases", "rounds"}),  # runner leases; a model's answer (both report through the worker protocol)
)
FORBIDDEN_IN_KERNEL = ("celery", "runs.tasks", "runs.worker", "runs.execution")
# Tests that drive kernel internals directly: the property tests of the pure graph rules, and the
# test that swaps the unit of work's write order to prove the order matters.
KERNEL_INTERNALS_ALLOWED = frozenset({"tests/runs/test_properties.py", "tests/runs/test_kernel_txn.py"})


def imports_of(source: str) -> list[tuple[str, list[str], bool]]:
    """(module, imported names, at module level) for every import statement in `source`."""
    tree = ast.parse(source)
    top = {id(node) for node in tree.body}
    found: list[tuple[str, list[str], bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], id(node) in top) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, [alias.name for alias in node.names], id(node) in top))
    return found


def kernel_module_names() -> set[str]:
    return {path.stem for path in KERNEL.glob("*.py") if path.stem != "__init__"}


def submodule_imports(source: str) -> list[str]:
    """Imports of a kernel submodule (anything but the package `runs.kernel` and its exported names)."""
    submodules = kernel_module_names()
    offenders = []
    for module, names, _ in imports_of(source):
        if module.startswith("runs.kernel."):
            offenders.append(module)
        elif module == "runs.kernel":
            offenders.extend(f"runs.kernel.{name}" for name in names if name in submodules)
    return offenders


def private_imports(source: str) -> list[str]:
    return [
        f"{module}.{name}"
        for module, names, _ in imports_of(source)
        if module.startswith("runs.kernel")
        for name in names
        if name.startswith("_") and name != "__future__"
    ]


def forbidden_imports(source: str) -> list[str]:
    return [
        module
        for module, _, _ in imports_of(source)
        if any(module == name or module.startswith(f"{name}.") for name in FORBIDDEN_IN_KERNEL)
    ]


def function_level_imports(source: str) -> list[str]:
    return [module for module, _, at_top in imports_of(source) if not at_top]


def layer_of(name: str) -> int:
    for index, layer in enumerate(KERNEL_LAYERS):
        if name in layer:
            return index
    raise AssertionError(f"runs/kernel/{name}.py is in no layer of KERNEL_LAYERS: place it")


def upward_imports(name: str, source: str) -> list[str]:
    """Kernel modules `name` imports from its own layer or a later one."""
    own = layer_of(name)
    offenders = []
    for module, names, _ in imports_of(source):
        if module.startswith("runs.kernel."):
            targets = [module.removeprefix("runs.kernel.")]
        elif module == "runs.kernel":
            targets = [n for n in names if n in kernel_module_names()]
        else:
            continue
        offenders.extend(f"{name} -> {target}" for target in targets if layer_of(target) >= own)
    return offenders


def python_files_outside_the_kernel() -> list[Path]:
    return [
        path
        for path in ROOT.glob("*/**/*.py")
        if not path.relative_to(ROOT).as_posix().startswith((".venv/", "runs/kernel/"))
        and "/migrations/" not in path.relative_to(ROOT).as_posix()
    ]


def test_it_imports_the_kernel_only_through_its_package() -> None:
    offenders = []
    for path in python_files_outside_the_kernel():
        relative = path.relative_to(ROOT).as_posix()
        if relative in KERNEL_INTERNALS_ALLOWED:
            continue
        offenders.extend(f"{relative}: {module}" for module in submodule_imports(path.read_text()))
    assert not offenders, "import `runs.kernel` (its __init__ is the surface), not its modules:\n" + "\n".join(offenders)


def test_it_would_catch_a_kernel_submodule_imported_from_outside() -> None:
    assert submodule_imports("from runs.kernel.txn import locked\n") == ["runs.kernel.txn"]
    assert submodule_imports("from runs.kernel import scheduling\n") == ["runs.kernel.scheduling"]
    assert submodule_imports("def f():\n    import runs.kernel.verbs\n") == ["runs.kernel.verbs"]
    assert submodule_imports("from runs.kernel import Conflict, create_run\nfrom runs import kernel\n") == []


def test_no_kernel_module_imports_a_private_name_of_another() -> None:
    offenders = []
    for path in sorted(KERNEL.glob("*.py")):
        offenders.extend(f"{path.name}: {name}" for name in private_imports(path.read_text()))
    assert not offenders, "what kernel modules share is public:\n" + "\n".join(offenders)


def test_it_would_catch_a_private_kernel_name_imported() -> None:
    assert private_imports("from runs.kernel.scheduling import _release, evaluate\n") == ["runs.kernel.scheduling._release"]
    assert private_imports("from runs.kernel.scheduling import release\n") == []


def test_the_kernel_imports_no_celery_and_nothing_inside_functions() -> None:
    offenders = []
    for path in sorted(KERNEL.glob("*.py")):
        source = path.read_text()
        offenders.extend(f"{path.name}: imports {module}" for module in forbidden_imports(source))
        offenders.extend(f"{path.name}: imports {module} inside a function" for module in function_level_imports(source))
    assert not offenders, "the kernel sends through its installed Sender and imports at module level:\n" + "\n".join(offenders)


def test_it_would_catch_celery_or_a_hidden_import_in_the_kernel() -> None:
    assert forbidden_imports("from celery import shared_task\n") == ["celery"]
    assert forbidden_imports("from runs.tasks import execute_task\n") == ["runs.tasks"]
    assert forbidden_imports("from runs.worker.execution import x\n") == ["runs.worker.execution"]
    assert forbidden_imports("from runs.tools import get_tool\n") == []
    assert function_level_imports("import os\ndef f():\n    from runs.tools import get_tool\n") == ["runs.tools"]


def test_kernel_modules_import_only_from_earlier_layers() -> None:
    assert kernel_module_names() == set().union(*KERNEL_LAYERS), "KERNEL_LAYERS names exactly the kernel's modules"
    offenders = []
    for path in sorted(KERNEL.glob("*.py")):
        if path.stem != "__init__":
            offenders.extend(upward_imports(path.stem, path.read_text()))
    assert not offenders, "kernel imports point one way (see KERNEL_LAYERS):\n" + "\n".join(offenders)


def test_it_would_catch_an_import_against_the_layers() -> None:
    assert upward_imports("scheduling", "from runs.kernel.settling import release_hold\n") == ["scheduling -> settling"]
    assert upward_imports("settling", "from runs.kernel.failure import renewed\n") == ["settling -> failure"]
    assert upward_imports("txn", "from runs.kernel import verbs\n") == ["txn -> verbs"]
    assert upward_imports("txn", "from runs.kernel.settling import settle_run\n") == ["txn -> settling"]
    assert upward_imports("delegation", "from runs.kernel.commit import locked\n") == ["delegation -> commit"]
    assert upward_imports("verbs", "from runs.kernel.expansion import expand\nfrom runs.kernel.commit import locked\n") == []


# ---- the kernel layered when it runs too: no registries, one completion path (issue 28) ----

# The one thing the kernel has installed rather than imported: the port to the broker (the kernel
# never imports Celery; the runs app, the composition root, installs its adapter at start-up).
KERNEL_PORTS = frozenset({("commit.py", "install_sender")})
MUTABLE_CALLS = frozenset({"dict", "list", "set", "defaultdict", "OrderedDict", "WeakValueDictionary"})


def registries(name: str, source: str) -> list[str]:
    """What would let a lower layer call a higher one through state filled at import: an
    `install_*`/`register_*` function or a `global` statement (but the one port), a module-level
    container that starts empty or holds callables (a handler table), or a call made at import."""
    tree = ast.parse(source)
    offenders = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            port = (name, node.name) in KERNEL_PORTS
            if node.name.startswith(("install_", "register_")) and not port:
                offenders.append(f"{name}: def {node.name}")
            if not port:
                offenders.extend(f"{name}: global in {node.name}" for n in ast.walk(node) if isinstance(n, ast.Global))
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            offenders.append(f"{name}:{node.lineno}: a call at import ({ast.unparse(node)[:60]})")
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if value is None:
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in MUTABLE_CALLS:
            offenders.append(f"{name}:{node.lineno}: a mutable table ({ast.unparse(node)[:60]})")
        elif isinstance(value, ast.Dict | ast.List | ast.Set):
            items = [*value.values] if isinstance(value, ast.Dict) else [*value.elts]
            if not items or any(isinstance(i, ast.Name | ast.Attribute | ast.Lambda) for i in items):
                offenders.append(f"{name}:{node.lineno}: a handler table ({ast.unparse(node)[:60]})")
    return offenders


def test_the_kernel_keeps_no_registries() -> None:
    offenders = []
    for path in sorted(KERNEL.glob("*.py")):
        if path.stem != "__init__":
            offenders.extend(registries(path.name, path.read_text()))
    assert not offenders, "a kernel layer calls higher ones by importing them, never through a registry:\n" + "\n".join(offenders)


def test_it_would_catch_a_registry_in_the_kernel() -> None:
    assert registries("txn.py", "def install_run_step(name, step):\n    _steps[name] = step\n") == [
        "txn.py: def install_run_step"
    ]
    assert registries("txn.py", "_steps = {}\n") == ["txn.py:1: a handler table (_steps = {})"]
    assert registries("txn.py", "_starter: list = []\n") == ["txn.py:1: a handler table (_starter: list = [])"]
    assert registries("txn.py", "HANDLERS = {'settle': settle_parent}\n") == [
        "txn.py:1: a handler table (HANDLERS = {'settle': settle_parent})"
    ]
    assert registries("txn.py", "_steps = dict()\n") == ["txn.py:1: a mutable table (_steps = dict())"]
    assert registries("settling.py", "install_run_step('settle_run', settle_run)\n") == [
        "settling.py:1: a call at import (install_run_step('settle_run', settle_run))"
    ]
    assert registries("txn.py", "def put(s):\n    global _s\n    _s = s\n") == ["txn.py: global in put"]
    assert registries("commit.py", "def install_sender(s):\n    global _sender\n    _sender = s\n") == []
    assert registries("compile.py", "KINDS = ('tool', 'round')\nTOOLS = {'oz.delegate': 'delegate'}\n") == []


# Where a task's status attribute may be assigned: the module of the moves. Elsewhere in the
# kernel a `status` is assigned only where it is no move: the set-based insert brings the rows it
# wrote in line (waiting), the pure graph rules replay a trace over plain TraceTask records, and
# an error carries its HTTP status.
STATUS_ASSIGNED_IN = "txn.py"
STATUS_NOT_A_MOVE = frozenset({"bulk.py", "graph.py", "errors.py"})


def status_assignments(source: str) -> list[int]:
    """Lines that assign an attribute named `status` (also in a tuple, or by setattr)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "status"
        ):
            lines.append(node.lineno)
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and part.attr == "status" and isinstance(part.ctx, ast.Store):
                    lines.append(node.lineno)
    return lines


def completions_outside_the_path(source: str) -> list[int]:
    """Lines that complete a task other than through `Txn.complete`: a move to completed, or the
    set-based statement called directly."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if called == "complete_held":
            lines.append(node.lineno)
        elif called in ("move", "move_many", "_move") and len(node.args) >= 2:
            to = node.args[1]
            if (isinstance(to, ast.Attribute) and to.attr == "COMPLETED") or (
                isinstance(to, ast.Constant) and to.value == "completed"
            ):
                lines.append(node.lineno)
    return lines


def test_a_task_completes_by_one_path() -> None:
    offenders = []
    for path in sorted(KERNEL.glob("*.py")):
        source = path.read_text()
        if path.name not in (STATUS_ASSIGNED_IN, *STATUS_NOT_A_MOVE):
            offenders.extend(f"{path.name}:{line}: assigns .status" for line in status_assignments(source))
        if path.name not in (STATUS_ASSIGNED_IN, "bulk.py"):
            offenders.extend(
                f"{path.name}:{line}: completes outside Txn.complete" for line in completions_outside_the_path(source)
            )
    assert not offenders, "a task's status changes only in runs/kernel/txn.py, and completes through Txn.complete:\n" + "\n".join(
        offenders
    )


def test_it_would_catch_a_second_completion_path() -> None:
    assert status_assignments("task.status, task.claim = 'completed', None\n") == [1]
    assert status_assignments("task.status = TaskStatus.RUNNING\n") == [1]
    assert status_assignments("setattr(task, 'status', 'completed')\n") == [1]
    assert status_assignments("task.result = {}\nstatus = 'x'\n") == []
    assert completions_outside_the_path("txn.move(task, TaskStatus.COMPLETED, result=r)\n") == [1]
    assert completions_outside_the_path("by_id = complete_held(run, claim, values, now)\n") == [1]
    assert completions_outside_the_path("txn.move(task, TaskStatus.FAILED)\ntxn.complete([(task, 1)])\n") == []

"""One definition per contract (issue 28.2, STYLE.md "One definition per contract"): the cursor
page is defined once (`runs.schemas.Page`), and a view that declares a ninja body model reads it
(a model the view never reads is a second validator whose refusals hide the kernel's keys)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = (".venv/", "tests/", "bench/", "docs/")


def production_sources() -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(SKIP) or "/migrations/" in relative:
            continue
        found.append((relative, ast.parse(path.read_text())))
    return found


def page_classes(tree: ast.Module) -> list[str]:
    """Classes that declare a cursor page's fields (`items` and `next`) themselves."""
    named = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            if {"items", "next"} <= fields:
                named.append(node.name)
    return named


def test_it_defines_the_cursor_page_once() -> None:
    found = {f"{relative}:{name}" for relative, tree in production_sources() for name in page_classes(tree)}
    assert found == {"runs/schemas.py:Page"}, f"a cursor page redefined (use runs.schemas.Page[T]): {sorted(found)}"


def test_it_would_catch_a_page_redefined() -> None:
    tree = ast.parse("class WidgetPage(Schema):\n    items: list[int]\n    next: str | None = None\n")
    assert page_classes(tree) == ["WidgetPage"]


def _is_route(decorator: ast.expr) -> bool:
    return (
        isinstance(decorator, ast.Call)
        and isinstance(decorator.func, ast.Attribute)
        and decorator.func.attr in ("post", "put", "patch", "delete")
        and isinstance(decorator.func.value, ast.Name)
        and decorator.func.value.id in ("router", "api")
    )


def unread_body_models(tree: ast.Module) -> set[str]:
    """Routes with a parameter annotated `<Something>In` (a ninja body model) the view never reads."""
    offenders = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not any(map(_is_route, node.decorator_list)):
            continue
        read = {n.id for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        for arg in node.args.args:
            annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
            models = [part.strip() for part in annotation.split("|")]
            if any(m.endswith("In") for m in models) and arg.arg not in read:
                offenders.add(node.name)
    return offenders


def test_every_view_reads_the_body_model_it_declares() -> None:
    found = {relative: names for relative, tree in production_sources() if (names := unread_body_models(tree))}
    assert found == {}, (
        "a view declares a body model it does not read (a second validator): declare the body's schema "
        "with `runs.api.request_body` and let its one validator (the kernel) refuse it"
    )


def test_it_would_catch_an_unread_body_model() -> None:
    source = (
        "@router.post('/x')\n"
        "def create(request, payload: CreateIn) -> dict:\n"
        "    return body_of(request)\n"
        "@router.post('/y')\n"
        "def read(request, payload: CreateIn) -> dict:\n"
        "    return payload.dict()\n"
    )
    assert unread_body_models(ast.parse(source)) == {"create"}


def test_the_create_and_append_bodies_are_the_kernels_schema() -> None:
    from ninja import NinjaAPI

    from oz0site.api import api
    from runs.kernel import append_body_schema, create_body_schema

    paths = NinjaAPI.get_openapi_schema(api, path_prefix="/api/v1/")["paths"]
    create = paths["/api/v1/workspaces/{ws}/runs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    append = paths["/api/v1/runs/{run_id}/append"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert (create, append) == (create_body_schema(), append_body_schema())
    task = create["properties"]["tasks"]["anyOf"][0]["items"]
    assert task["properties"]["kind"] == {"enum": ["tool", "round", "await", "join", "delegate"]}


def test_the_verbs_bodies_are_the_kernels_shapes() -> None:
    """Each verb's body in the document is its kernel shape's schema, the one `read_fields` checks."""
    from ninja import NinjaAPI

    from oz0site.api import api
    from runs import kernel

    routes = [
        ("/api/v1/runs/{run_id}/tasks/{key}/retry", kernel.RETRY_BODY),
        ("/api/v1/runs/{run_id}/tasks/{key}/approve", kernel.APPROVE_BODY),
        ("/api/v1/runs/{run_id}/tasks/{key}/deny", kernel.REASON_BODY),
        ("/api/v1/runs/{run_id}/tasks/{key}/answer", kernel.ANSWER_BODY),
        ("/api/v1/awaits", kernel.RESOLVE_BODY),
        ("/api/v1/awaits/{token}", kernel.AWAIT_OUTCOME_BODY),
        ("/api/v1/runs/{run_id}/cancel", kernel.REASON_BODY),
        ("/api/v1/executors", kernel.REGISTER_BODY),
        ("/api/v1/executors/{executor_id}/calls/{call}/result", kernel.RESULT_BODY),
    ]
    paths = NinjaAPI.get_openapi_schema(api, path_prefix="/api/v1/")["paths"]
    for path, shape in routes:
        body = paths[path]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"] == kernel.body_schema(shape), path
        assert body["required"] is not shape.optional, path


MODEL_ROOTS = {"Schema", "BaseModel", "TypedDict"}


def model_classes(sources: list[tuple[str, ast.Module]]) -> list[tuple[str, str]]:
    """(file, class) of every pydantic/ninja model: a class whose base is a model root or a model."""
    classes = [
        (relative, node.name, {ast.unparse(b).split("[")[0].split(".")[-1] for b in node.bases})
        for relative, tree in sources
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]
    models = set(MODEL_ROOTS)
    while True:
        grown = models | {name for _, name, bases in classes if bases & models}
        if grown == models:
            break
        models = grown
    return [(relative, name) for relative, name, bases in classes if bases & models]


def test_no_two_models_share_a_name() -> None:
    """The OpenAPI document names a component by its class: two models of one name become one
    component, and one route's answer is described by the other's shape."""
    seen: dict[str, list[str]] = {}
    for relative, name in model_classes(production_sources()):
        seen.setdefault(name, []).append(relative)
    assert {name: files for name, files in seen.items() if len(files) > 1} == {}


def test_it_would_catch_two_models_of_one_name() -> None:
    first = ("a/api.py", ast.parse("class Base(Schema):\n    x: int\nclass RegisteredOut(Base):\n    y: int\n"))
    second = ("b/api.py", ast.parse("class RegisteredOut(Schema):\n    z: int\n"))
    assert [name for _, name in model_classes([first, second])].count("RegisteredOut") == 2

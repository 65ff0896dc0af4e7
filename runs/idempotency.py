"""`Idempotency-Key` on creates and appends: a client's retry after any error starts nothing twice.

A client that sent `POST /workspaces/{ws}/runs` or `POST /runs/{id}/append` and got no answer
(a timeout, a dropped connection, a 5xx) cannot know whether it took effect. Sent with an
`Idempotency-Key` header, the request runs in one transaction with the record of its key and its
answer: either both commit or neither does. So a retry with the same key

- finds the key: the same request (method, path and body) gets the first answer again (its
  status and body, as they were then); another request gets 409 `idempotency_key_reused`;
- finds none: nothing took effect the first time, and the request runs now. Two at once with one
  key: the second waits on the first's key (the unique index) and, once it commits, rolls its own
  work back and answers the first's answer.

Only answers that succeeded are kept: a refused request changed nothing, so running it again is
harmless. A key is scoped to the workspace and the caller (two people, or one person in two
workspaces, never share one), is 1 to 255 visible ASCII characters (400 `invalid_idempotency_key`
otherwise), and is kept OZ0_IDEMPOTENCY_SECONDS (24 h); after that it is forgotten (beat's sweep
deletes it) and the same key starts afresh.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils import timezone
from ninja.responses import NinjaJSONEncoder, Status

from runs.kernel import Conflict, InvalidRequest
from runs.models import IdempotencyKey, Run
from tenancy.models import Workspace

HEADER = "Idempotency-Key"
KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,255}")
SWEEP_BATCH = 5000

View = TypeVar("View", bound=Callable[..., Any])
Scope = Callable[[dict[str, Any]], "int | None"]

OPENAPI = {
    "parameters": [
        {
            "in": "header",
            "name": HEADER,
            "required": False,
            "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"^[\x21-\x7e]+$"},
            "description": "Makes a retry safe: the same key and request get the first answer again (for 24 h), "
            "another request with the key 409 idempotency_key_reused. Scoped to the workspace and the caller.",
        }
    ]
}


def workspace_named(kwargs: dict[str, Any]) -> int | None:
    """The scope of a create: the workspace in its path."""
    return Workspace.objects.filter(slug=str(kwargs.get("ws", ""))).values_list("pk", flat=True).first()


def workspace_of_run(kwargs: dict[str, Any]) -> int | None:
    """The scope of an append: its run's workspace."""
    try:
        return Run.objects.filter(pk=str(kwargs.get("run_id", ""))).values_list("workspace_id", flat=True).first()
    except (ValidationError, ValueError):
        return None


def fingerprint(request: HttpRequest) -> str:
    """What "the same request" is: method, path and body, the body as canonical JSON when it is
    JSON (key order and spacing do not make another request), else its bytes."""
    body: bytes = request.body
    try:
        body = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    except (ValueError, RecursionError, UnicodeDecodeError):
        pass
    digest = hashlib.sha256(f"{request.method} {request.path}\n".encode())
    digest.update(body)
    return digest.hexdigest()


def _key_of(request: HttpRequest) -> str | None:
    raw = request.headers.get(HEADER)
    if raw is None:
        return None
    if not KEY_PATTERN.fullmatch(raw):
        raise InvalidRequest("invalid_idempotency_key", "an Idempotency-Key is 1 to 255 visible ASCII characters")
    return raw


def _first_answer(workspace_id: int, user_id: int, key: str, print_: str) -> Status[Any] | None:
    """The answer kept for the key, if it is kept and was the same request's."""
    kept = IdempotencyKey.objects.filter(workspace_id=workspace_id, user_id=user_id, key=key).first()
    if kept is None:
        return None
    if kept.created_at < timezone.now() - timedelta(seconds=float(settings.OZ0_IDEMPOTENCY_SECONDS)):
        IdempotencyKey.objects.filter(pk=kept.pk).delete()  # forgotten: the key starts afresh
        return None
    if kept.fingerprint != print_:
        raise Conflict(
            "idempotency_key_reused",
            "this Idempotency-Key was already used for another request (another body, run or endpoint); use a new key",
        )
    return Status(kept.status, kept.answer)


def idempotent(scope: Scope) -> Callable[[View], View]:
    """Wrap a create or append view (runs/api.py): with an Idempotency-Key, the view's work and the
    key's record commit together, and a repeat answers the first answer."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def keyed(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            key = _key_of(request)
            user_id = getattr(request.user, "pk", None)
            workspace_id = scope(kwargs) if key is not None and user_id is not None else None
            if key is None or user_id is None or workspace_id is None:
                return view(request, *args, **kwargs)  # no key, or a caller the view itself refuses
            print_ = fingerprint(request)
            kept = _first_answer(workspace_id, user_id, key, print_)
            if kept is not None:
                return kept
            try:
                with transaction.atomic():
                    answer = view(request, *args, **kwargs)
                    status, body = (answer.status_code, answer.value) if isinstance(answer, Status) else (200, answer)
                    stored = json.loads(json.dumps(body, cls=NinjaJSONEncoder))
                    IdempotencyKey.objects.create(
                        workspace_id=workspace_id, user_id=user_id, key=key, fingerprint=print_, status=status, answer=stored
                    )
            except IntegrityError:
                # The same key committed meanwhile (a retry racing its first try): this one's work is
                # rolled back, and its answer is the first's.
                kept = _first_answer(workspace_id, user_id, key, print_)
                if kept is None:
                    raise
                return kept
            return answer

        # The view's own signature, its annotations evaluated where it was written: ninja reads the
        # parameters (path, body schema) from it, and would resolve names in this module otherwise.
        keyed.__signature__ = inspect.signature(view, eval_str=True)  # type: ignore[attr-defined]
        return keyed  # type: ignore[return-value]

    return decorate


def sweep_expired_keys() -> int:
    """Forget keys older than OZ0_IDEMPOTENCY_SECONDS (beat's sweep), a batch at a time."""
    cutoff = timezone.now() - timedelta(seconds=float(settings.OZ0_IDEMPOTENCY_SECONDS))
    old = list(IdempotencyKey.objects.filter(created_at__lt=cutoff).values_list("pk", flat=True)[:SWEEP_BATCH])
    if old:
        IdempotencyKey.objects.filter(pk__in=old).delete()
    return len(old)

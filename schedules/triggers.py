"""Signed triggers: an outside system (GitHub, Stripe, a ticketing tool) posts a body to
/api/v1/triggers/<public_id>; a valid signature starts one run of the trigger's stored body,
its input mapped from the posted body by the trigger's template.

The secret. A sender signs with it (`X-Oz0-Signature: sha256=<hex HMAC-SHA256 of the raw
body>`), so verifying needs the secret itself: a one-way hash of it, as for passwords, cannot
verify an HMAC. So it is never stored at all: it is derived, HMAC-SHA256(key, "oz0-trigger:" +
salt), where the key is derived from the install's SECRET_KEY and the salt (random, 32 bytes) is
the trigger's row. A copy of the database alone cannot sign for any trigger (as with an encrypted
secret, minus the cipher and its key management); rotating SECRET_KEY invalidates every trigger's
secret (its owners make new triggers). It is shown once, in the create's answer.

The order of a delivery's checks: the trigger exists (404), the trigger's rate (429, the
project's limiter keyed by trigger), the body's size (413, from Content-Length before it is read,
and again on the bytes), the signature (401, compared in constant time: nothing is parsed or
written before it passes), then the body (typed 400s), the idempotency key (400 if absent), and
the run. A delivery whose key was seen answers 200 with the first delivery's run and starts
nothing. A refused create (a quota) records nothing, so the sender's retry may still start it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from ninja import Status

from oz0site import ratelimit
from runs import kernel
from runs.kernel import Conflict, InvalidRequest, KernelError, NotFound
from runs.schemas import parse_body
from runs.settings_input import body_fields
from schedules.models import ScheduleEvent, Trigger, TriggerDelivery
from tenancy.models import Workspace

SIGNATURE_HEADER = "X-Oz0-Signature"
TEMPLATE_MAX = 50
POINTER_MAX = 200
KEY_MAX = 200
HEADER_NAME = re.compile(r"[A-Za-z0-9][-A-Za-z0-9]{0,63}")
NAME = re.compile(r"[-a-zA-Z0-9_]{1,64}")
PER_WORKSPACE_MAX = 100
TRIGGER_FIELDS = frozenset({"name", "run", "input_template", "idempotency"})


class BadSignature(KernelError):
    status = 401

    def __init__(self) -> None:
        super().__init__("bad_signature", f"the body's {SIGNATURE_HEADER} is missing or does not match the trigger's secret")


def body_max() -> int:
    return int(settings.OZ0_TRIGGER_BODY_MAX)


def _key() -> bytes:
    return hashlib.sha256(b"oz0-trigger-secrets:" + str(settings.SECRET_KEY).encode()).digest()


def secret_of(trigger: Trigger) -> str:
    return hmac.new(_key(), f"oz0-trigger:{trigger.secret_salt}".encode(), hashlib.sha256).hexdigest()


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


# --- the template: JSON pointers into the posted body, or constants; nothing is evaluated ---


def _check_pointer(pointer: Any, where: str) -> str:
    if not isinstance(pointer, str) or len(pointer) > POINTER_MAX or (pointer and not pointer.startswith("/")):
        raise InvalidRequest("invalid_template", f"{where}: a JSON pointer ('' or '/a/0/b', at most {POINTER_MAX} characters)")
    return pointer


def resolve(document: Any, pointer: str) -> Any:
    """RFC 6901: the value at `pointer`, or None when the document has none there."""
    if pointer == "":
        return document
    at = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(at, Mapping) and token in at:
            at = at[token]
        elif isinstance(at, list) and token.isdigit() and len(token) < 10 and int(token) < len(at):
            at = at[int(token)]
        else:
            return None
    return at


def check_template(template: Any) -> dict[str, Any]:
    if not isinstance(template, dict) or len(template) > TEMPLATE_MAX:
        raise InvalidRequest("invalid_template", f"input_template is an object of at most {TEMPLATE_MAX} fields")
    for field, source in template.items():
        if isinstance(source, dict):
            if set(source) != {"const"}:
                raise InvalidRequest("invalid_template", f'{field[:40]}: a JSON pointer string, or {{"const": value}}')
        else:
            _check_pointer(source, field[:40])
    return template


def apply_template(template: Mapping[str, Any], posted: Any) -> dict[str, Any]:
    return {field: source["const"] if isinstance(source, dict) else resolve(posted, source) for field, source in template.items()}


def check_idempotency(value: Any) -> dict[str, str]:
    if isinstance(value, dict) and len(value) == 1:
        if isinstance(value.get("header"), str) and HEADER_NAME.fullmatch(value["header"]):
            return {"header": value["header"]}
        if "field" in value:
            return {"field": _check_pointer(value["field"], "idempotency.field")}
    raise InvalidRequest("invalid_idempotency", 'idempotency is {"header": "X-Delivery-Id"} or {"field": "/json/pointer"}')


def idempotency_key(trigger: Trigger, request: HttpRequest, posted: Any) -> str:
    where = trigger.idempotency
    value: Any = request.headers.get(where["header"]) if "header" in where else resolve(posted, where.get("field", ""))
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip() or len(value) > KEY_MAX:
        raise InvalidRequest(
            "missing_idempotency_key",
            f"the delivery carries no idempotency key at {where} (a string of at most {KEY_MAX} characters)",
        )
    return value


# --- management ---


def create(*, workspace: Workspace, user: Any, body: Any) -> tuple[Trigger, str]:
    """A new trigger and its secret (returned once, never stored)."""
    kernel.require_write(user, workspace.pk)
    body = body_fields(body, allowed=TRIGGER_FIELDS)
    name = body.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequest("invalid_name", "a trigger's name is 1 to 64 letters, digits, - or _")
    run = body.get("run")
    if not isinstance(run, dict) or "input" in run:
        raise InvalidRequest("invalid_run", "`run` is a run-create body without `input` (the template makes the input)")
    template = check_template(body.get("input_template", {}))
    # Compiled as the kernel would compile a delivery (the template's fields, all null).
    kernel.compile_create({**run, "input": dict.fromkeys(template)}, workspace)
    trigger = Trigger(
        workspace=workspace,
        name=name,
        public_id=secrets.token_hex(16),
        owner=user,
        body=run,
        input_template=template,
        idempotency=check_idempotency(body.get("idempotency")),
        secret_salt=secrets.token_hex(32),
    )
    with transaction.atomic():
        if Trigger.objects.filter(workspace=workspace).count() >= PER_WORKSPACE_MAX:
            raise Conflict("too_many_triggers", f"a workspace holds at most {PER_WORKSPACE_MAX} triggers")
        try:
            with transaction.atomic():
                trigger.save()
        except IntegrityError:
            raise Conflict("name_taken", f"this workspace already has a trigger named {name!r}") from None
        _event(trigger, user, "created", {"agent": run.get("agent"), "idempotency": trigger.idempotency})
    return trigger, secret_of(trigger)


def _event(trigger: Trigger, user: Any, verb: str, changes: dict[str, Any] | None = None) -> None:
    ScheduleEvent.objects.create(
        workspace_id=trigger.workspace_id,
        subject="trigger",
        schedule_name=trigger.name,
        actor=str(getattr(user, "username", "") or "oz0"),
        verb=verb,
        changes=changes or {},
    )


def trigger_for(workspace: Workspace, trigger_id: Any) -> Trigger:
    try:
        pk = int(trigger_id)
        if not 0 < pk < 2**63:
            raise ValueError(pk)
        return Trigger.objects.select_related("owner").get(pk=pk, workspace=workspace)
    except (Trigger.DoesNotExist, ValueError, TypeError, OverflowError):
        raise NotFound("trigger") from None


def delete(*, workspace: Workspace, user: Any, trigger_id: Any) -> None:
    kernel.require_write(user, workspace.pk)
    with transaction.atomic():
        trigger = trigger_for(workspace, trigger_id)
        _event(trigger, user, "deleted")
        trigger.delete()


def document(trigger: Trigger, *, secret: str = "") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": trigger.pk,
        "name": trigger.name,
        "url": f"/api/v1/triggers/{trigger.public_id}",
        "owner": trigger.owner.username if trigger.owner else None,
        "agent": trigger.body.get("agent"),
        "input_template": trigger.input_template,
        "idempotency": trigger.idempotency,
        "signature_header": SIGNATURE_HEADER,
        "created_at": trigger.created_at.isoformat(),
    }
    if secret:
        doc["secret"] = secret
    return doc


def triggers_of(workspace: Workspace) -> list[Trigger]:
    return list(Trigger.objects.filter(workspace=workspace).select_related("owner").order_by("name")[:PER_WORKSPACE_MAX])


# --- a delivery ---


def _declared_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


def deliver(request: HttpRequest, public_id: str) -> Status[dict[str, Any]]:
    trigger = Trigger.objects.select_related("owner", "workspace").filter(public_id=str(public_id)[:32]).first()
    if trigger is None:
        raise NotFound("trigger")
    ratelimit.admit(f"trigger-{trigger.pk}", "write")
    cap = body_max()
    if _declared_length(request) > cap:
        raise KernelError("payload_too_large", f"a trigger's body is at most {cap} bytes", status=413)
    raw = request.body
    if len(raw) > cap:
        raise KernelError("payload_too_large", f"a trigger's body is at most {cap} bytes", status=413)
    given = request.headers.get(SIGNATURE_HEADER, "")
    if not hmac.compare_digest(given.encode(), signature(secret_of(trigger), raw).encode()):
        raise BadSignature()
    posted = parse_body(raw, cap=cap)
    key = idempotency_key(trigger, request, posted)
    seen = TriggerDelivery.objects.filter(trigger=trigger, key=key).first()
    if seen is not None:
        return Status(200, {"run": str(seen.run_id) if seen.run_id else None, "replayed": True})
    if trigger.owner is None:
        raise KernelError("owner_missing", "the trigger's owner was deleted", status=409)
    body = {**trigger.body, "input": apply_template(trigger.input_template, posted)}
    try:
        with transaction.atomic():
            # The key first: of two concurrent retries, one inserts it and the other waits, then fails.
            delivery = TriggerDelivery.objects.create(trigger=trigger, key=key)
            run, _ = kernel.create_run(workspace=trigger.workspace, user=trigger.owner, body=body)
            delivery.run = run
            delivery.save(update_fields=["run"])
    except IntegrityError:
        seen = TriggerDelivery.objects.filter(trigger=trigger, key=key).first()
        return Status(200, {"run": str(seen.run_id) if seen and seen.run_id else None, "replayed": True})
    return Status(201, {"run": str(run.pk), "replayed": False})

"""/api/v1/subscriptions: a person's own notification subscriptions (list, create, delete)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Query, Router, Schema, Status

from notify import subscriptions
from oz0site.auth import person_auth
from runs.api import body_of
from runs.schemas import SLUG_PATTERN, SLUG_QUERY, ErrorOut, Page

router = Router(tags=["notifications"])

ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 404: ErrorOut, 409: ErrorOut, 413: ErrorOut}


class SubscriptionOut(Schema):
    id: int
    workspace: str
    kinds: list[str]
    agent: str | None = None
    email: bool
    # The webhook's scheme and host only: an incoming-webhook URL is itself a credential.
    webhook: str | None = None
    interval_seconds: int
    created_at: str
    # "no digest yet", "ok" or "failing" (the last attempt failed; see last_error).
    status: str
    last_digest_at: str | None = None
    last_attempt_at: str | None = None
    last_error: str | None = None
    consecutive_failures: int
    digests_sent: int
    next_digest_after: str | None = None


class SubscriptionCreated(SubscriptionOut):
    # The webhook's signing secret, in this answer only (absent without a webhook).
    secret: str | None = None


# Every subscription of the caller (at most notify.subscriptions.PER_USER_MAX): one page, `next` null.
SubscriptionList = Page[SubscriptionOut]


@router.get("/subscriptions", response={200: SubscriptionList, **ERRORS}, summary="Your notification subscriptions")
def list_subscriptions(request: HttpRequest, workspace: str | None = Query(None, **SLUG_QUERY)) -> dict[str, Any]:
    rows = subscriptions.subscriptions_of(request.user, workspace)[: subscriptions.PER_USER_MAX]
    return {"items": [subscriptions.document(row) for row in rows]}


# The body is read and checked by notify.subscriptions.create (typed 400 keys per field); the
# schema here documents it.
CREATE_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "additionalProperties": False,
                "required": ["workspace", "kinds"],
                # A channel: e-mail (to the account's address), a webhook, or both.
                "anyOf": [
                    {"required": ["webhook_url"]},
                    {"required": ["email"], "properties": {"email": {"const": True}}},
                ],
                "properties": {
                    "workspace": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": SLUG_PATTERN},
                    "kinds": {
                        "type": "array",
                        "items": {"type": "string", "enum": ["approval", "question", "hold", "deadline"]},
                        "minItems": 1,
                        "uniqueItems": True,
                    },
                    "agent": {"type": "string", "maxLength": 100},
                    "email": {"type": "boolean", "description": "to the account's own address"},
                    "webhook_url": {"type": "string", "format": "uri", "maxLength": 2000},
                    "interval_seconds": {"type": "integer", "minimum": 300, "maximum": 604800, "default": 900},
                },
            }
        }
    },
}


@router.post(
    "/subscriptions",
    auth=person_auth("viewer", where="any", rate="write", missing="workspace"),
    response={201: SubscriptionCreated, **ERRORS},
    openapi_extra={"requestBody": CREATE_BODY},
    summary="Subscribe to approvals, questions or holds of a workspace (the webhook secret is shown once)",
)
def create_subscription(request: HttpRequest) -> Status[dict[str, Any]]:
    row, secret = subscriptions.create(request.user, body_of(request))
    return Status(201, subscriptions.document(row, secret=secret))


@router.delete(
    "/subscriptions/{subscription_id}",
    auth=person_auth(rate="write"),
    response={204: None, **ERRORS},
    summary="Delete one of your subscriptions",
)
def delete_subscription(request: HttpRequest, subscription_id: int) -> Status[None]:
    subscriptions.delete(request.user, subscription_id)
    return Status(204, None)

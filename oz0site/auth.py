"""Who a JSON API request speaks for: a person, by bearer token or by the console's session, and
the route's standing, checked before the body is read.

The tokens are tenancy's (`tenancy.tokens.token_user`); this module wires them into ninja.
Executors authenticate with tokens of their own (`runs.executor_api.router.ExecutorAuth`).

Each route declares what it needs (`person_auth(role, where=..., body_max=..., rate=...)`):
ninja runs the auth callbacks before it parses a body, so a caller without standing in the
workspace the path names (an outsider: 404; a viewer or reader at an operator's route: 403), or
past their rate or their workspace's (oz0site.workspace_rate), is refused before a byte of the
body is read, let alone parsed and validated.
The same declaration gives the body's cap (`OZ0_VERB_BODY_MAX` unless the route names another),
which the parser checks against Content-Length first.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from django.db import connection
from django.http import HttpRequest
from ninja.security import HttpBearer
from ninja.security import SessionAuth as NinjaSessionAuth

from oz0site import ratelimit, web_share, workspace_rate
from runs.kernel import Forbidden, NotFound
from runs.models import Run
from runs.schemas import refuse_declared_length, refuse_repeated_parameters
from tenancy.models import Membership, Role, Workspace
from tenancy.permissions import ROLE_RANK, remember_role
from tenancy.tokens import Beside, token_user_and

# Where a route's workspace is named: its `ws` path parameter (a slug), its `run_id` (the run's
# workspace), or nowhere but the caller must hold the role in some workspace (`any`).
Where = Literal["ws", "run_id", "any"]


@dataclass(frozen=True)
class Route:
    """What a route needs of its caller before its body is read."""

    role: str | None = None
    where: Where | None = None
    body_max: int | None = None
    rate: Literal["write", "read"] | None = None
    # `any` only: refuse a caller without the role anywhere as this thing's 404 (an await's token
    # names its workspace, so whether it exists is the kernel's answer), not 403.
    missing: str | None = None
    # Whether the request runs within its workspace's share of the web process (oz0site.web_share):
    # every route naming a workspace but a long wait, which holds no thread busy.
    shared: bool = True

    def admit(self, request: HttpRequest, user: Any, standing: tuple[Any, ...] | None = None) -> None:
        """`standing`: the workspace and role `standing_beside` had read with the token, if it was."""
        request._oz0_body_max = self.body_max  # type: ignore[attr-defined]
        if self.rate is not None:
            ratelimit.admit(user.pk, self.rate)
        workspace_id = None
        if self.role is not None and self.where is not None:
            workspace_id = self._require(request, user, self.role, self.where, standing)
        refuse_declared_length(request)
        refuse_repeated_parameters(request)
        if workspace_id is not None:
            # The workspace's own rate (all its members together): charged only once standing is
            # known and the body's declared length is within the route's cap.
            workspace_rate.admit(request, workspace_id)
            workspace_rate.start_clock(request, workspace_id)
            if self.shared:
                web_share.take(request, workspace_id)

    def standing_beside(self, request: HttpRequest) -> Beside | None:
        """The standing this route asks of every caller, as a read joined to a bearer token's own
        (`tenancy.tokens.token_user_and`): one statement where there were two, on the API's
        hottest path. None where the route names no workspace, or names none that could exist."""
        if self.role is None or self.where not in ("ws", "run_id"):
            return None
        named = _named(self.where, _path_value(request, self.where))
        if named is None:
            return None
        table, column, workspace_column, ident = named
        return Beside(
            columns=f"named.{workspace_column}, member.role",
            joins=f"LEFT JOIN {table} AS named ON named.{column} = %s {_member_join(workspace_column, 'token.user_id')}",
            params=[ident],
        )

    def _require(
        self, request: HttpRequest, user: Any, needs: str, where: Where, standing: tuple[Any, ...] | None = None
    ) -> int | None:
        """The caller's standing in the workspace the route names (its id), or a refusal."""
        needed = ROLE_RANK[Role(needs)]
        if where == "any":
            roles = Membership.objects.filter(user_id=user.pk).values_list("role", flat=True)
            if not any(ROLE_RANK[Role(r)] >= needed for r in roles):
                if self.missing is not None:
                    raise NotFound(self.missing)
                raise Forbidden(f"this needs the {needs} role in a workspace")
            return None
        what = "workspace" if where == "ws" else "run"
        if standing is not None:
            workspace_id, role = standing
            if workspace_id is not None:
                remember_role(user, workspace_id, role)
        else:
            workspace_id, role = _standing(user, where, _path_value(request, where))
        if role is None:
            raise NotFound(what)
        if ROLE_RANK[Role(role)] < needed:
            raise Forbidden() if needs == Role.OPERATOR else Forbidden(f"this needs the {needs} role")
        return workspace_id


def _path_value(request: HttpRequest, where: Where) -> Any:
    kwargs = request.resolver_match.kwargs if request.resolver_match is not None else {}
    return kwargs.get(where)


def _named(where: Where, value: Any) -> tuple[str, str, str, Any] | None:
    """Where the workspace a path names is read: (table, the column the path's value matches, the
    workspace's id column, the value as the column takes it); None for a value that names nothing."""
    if value is None:
        return None
    if where == "ws":
        return Workspace._meta.db_table, "slug", "id", str(value)[:64]
    try:
        ident = uuid.UUID(str(value))
    except ValueError:  # not a run id: no such run
        return None
    return Run._meta.db_table, "id", "workspace_id", ident


def _member_join(workspace_column: str, user: str) -> str:
    """The caller's membership of the workspace `named` is (or belongs to): `user` is the SQL
    that gives the caller's id."""
    return (
        f"LEFT JOIN {Membership._meta.db_table} AS member "
        f"ON member.workspace_id = named.{workspace_column} AND member.user_id = {user}"
    )


def _standing(user: Any, where: Where, value: Any) -> tuple[int | None, str | None]:
    """The workspace the path names (by slug, or as a run's) and the caller's role in it, read in
    one statement (every request naming a workspace asks both, and this is the API's hottest read:
    written out, it costs a fraction of the ORM's compiling of a subquery). The role is remembered
    for the request (`tenancy.permissions.remember_role`), as `role_of` would have. A bearer
    token's request reads it with its token instead (`Route.standing_beside`)."""
    named = _named(where, value)
    if named is None:
        return None, None
    table, column, workspace_column, ident = named
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT named.{workspace_column}, member.role FROM {table} AS named "
            f"{_member_join(workspace_column, '%s')} WHERE named.{column} = %s",
            [user.pk, ident],
        )
        row = cursor.fetchone()
    if row is None:
        return None, None
    workspace_id, role = row
    remember_role(user, workspace_id, role)
    return workspace_id, role


class BearerAuth(HttpBearer):
    def __init__(self, route: Route | None = None) -> None:
        super().__init__()
        self.route = route or Route()

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        beside = self.route.standing_beside(request)
        user, standing = token_user_and(token, beside)
        if user is not None:
            request.user = user
            self.route.admit(request, user, standing or None)
        return user


class SessionAuth(NinjaSessionAuth):
    """The console's session (the OpenAPI document's scheme keeps ninja's name)."""

    def __init__(self, route: Route | None = None, csrf: bool = True) -> None:
        super().__init__(csrf=csrf)
        self.route = route or Route()

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:
        user = super().authenticate(request, key)
        if user:
            self.route.admit(request, user)
        return user


def person_auth(
    role: str | None = None,
    *,
    where: Where | None = None,
    body_max: int | None = None,
    rate: Literal["write", "read"] | None = None,
    missing: str | None = None,
    shared: bool = True,
) -> list[Any]:
    """A person's bearer token, else their console session; then the route's standing, rate and
    body cap (see the module's docstring), all before ninja reads the body."""
    route = Route(role=role, where=where, body_max=body_max, rate=rate, missing=missing, shared=shared)
    return [BearerAuth(route), SessionAuth(route)]

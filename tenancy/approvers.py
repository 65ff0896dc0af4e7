"""Who owns what waits on a person in a workspace, and when a wait is due and overdue.

An approver group names tools by fnmatch patterns (`payments.*`, `db.?rop`); a call whose tool
matches one or more groups is theirs: a member of any group it matches may decide it, nobody else.
A call no group matches, a model's question and a held run belong to the workspace's operators.
Whether a person may decide anything at all is still their role's (write standing) and the run's
words' (F11) question: a group narrows who decides, never widens it.

A wait is *due* once it has waited the workspace's reminder time (its owners are reminded), and
*overdue* past its escalation time (the next role or group is told): `notify/deadlines.py` sends
both, once per stage; the inbox shows them.

The bottom app's part: rows and rules, no HTTP and no kernel (the kernel's approve reads
`call_owners`; `runs/approver_groups.py` writes groups and deadlines with typed refusals).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from tenancy.models import ApproverGroup, Workspace

# A pattern is a tool's name with `*` (any run of characters) and `?` (one character): no brackets,
# no spaces, so that every pattern means the same to fnmatch here and to the database's regex.
PATTERN_CHARS = re.compile(r"[A-Za-z0-9_.:/*?-]+")
PATTERN_MAX = 200
PATTERNS_MAX = 50
GROUP_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
GROUPS_MAX = 100
GROUP_MEMBERS_MAX = 500
# A day of a week's seconds is plenty for a reminder; a year bounds a typo.
DEADLINE_MAX_SECONDS = 365 * 24 * 3600

OPERATORS = "operators"
# Who the audit trail names for what the platform itself did to a wait (assigned, reminded, escalated).
PLATFORM_ACTOR = "oz0"


class DeadlinesRefused(ValueError):
    """Not a reminder or escalation time: the message says what is wanted."""


def pattern_problem(pattern: Any) -> str | None:
    """What is wrong with one tool pattern; None when it is sound."""
    if not isinstance(pattern, str) or not pattern:
        return "a tool pattern is a non-empty text such as `payments.*`"
    if len(pattern) > PATTERN_MAX:
        return f"a tool pattern has at most {PATTERN_MAX} characters"
    if not PATTERN_CHARS.fullmatch(pattern):
        return (
            f"{pattern[:40]!r} is not a tool pattern: a tool's name (letters, digits, `_.:/-`) "
            "with `*` for any run of characters and `?` for one"
        )
    return None


def tool_matches(pattern: str, tool: str) -> bool:
    return fnmatch.fnmatchcase(tool, pattern)


def pattern_regex(pattern: str) -> str:
    """The pattern as an anchored regular expression that PostgreSQL and Python read alike."""
    parts = [".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern]
    return "^" + "".join(parts) + "$"


def patterns_regex(patterns: Iterable[str]) -> str | None:
    """One regex matching any of the patterns; None for none."""
    wanted = sorted(set(patterns))
    return "|".join(f"({pattern_regex(p)})" for p in wanted) if wanted else None


def groups_of(workspace_id: int) -> list[ApproverGroup]:
    """A workspace's groups with their members (two queries), by name."""
    return list(
        ApproverGroup.objects.filter(workspace_id=workspace_id)
        .select_related("escalate_to")
        .prefetch_related("members")
        .order_by("name")
    )


@dataclass(frozen=True)
class Owners:
    """Whose a wait is: named groups (their members), or the workspace's operators (`groups` empty)."""

    groups: tuple[str, ...] = ()
    member_ids: frozenset[int] = frozenset()
    member_names: tuple[str, ...] = ()
    # A call that is not replayable needs two different approvers (some owning group says so).
    two_approvers: bool = False
    # Where its escalation goes: group names, and/or the operators.
    escalate_to: tuple[str, ...] = (OPERATORS,)

    @property
    def by_group(self) -> bool:
        return bool(self.groups)


OPERATORS_OWN = Owners()


def owners_of(groups: Sequence[ApproverGroup], tool: str | None) -> Owners:
    """The owners of a call of `tool` among a workspace's groups (`groups_of`); a question or hold
    (no tool) and a call no group matches belong to the operators."""
    if not tool:
        return OPERATORS_OWN
    owning = [g for g in groups if any(tool_matches(p, tool) for p in g.tools)]
    if not owning:
        return OPERATORS_OWN
    members = {m.pk: m.get_username() for g in owning for m in g.members.all()}
    escalate = sorted({g.escalate_to.name if g.escalate_to_id and g.escalate_to else OPERATORS for g in owning})
    return Owners(
        groups=tuple(g.name for g in owning),
        member_ids=frozenset(members),
        member_names=tuple(sorted(members.values())),
        two_approvers=any(g.two_approvers for g in owning),
        escalate_to=tuple(escalate),
    )


def call_owners(workspace_id: int, tool: str | None) -> Owners:
    return owners_of(groups_of(workspace_id), tool)


def may_decide(owners: Owners, user: Any) -> bool:
    """Whether the group rule lets this person decide (their role is checked apart)."""
    return not owners.by_group or getattr(user, "pk", None) in owners.member_ids


def patterns_outside(groups: Sequence[ApproverGroup], user_id: int) -> tuple[list[str], list[str]]:
    """(every group pattern of the workspace, the patterns of the groups this person is in): a call
    matching the first and not the second is not theirs to decide."""
    every = [p for g in groups for p in g.tools]
    mine = [p for g in groups if any(m.pk == user_id for m in g.members.all()) for p in g.tools]
    return every, mine


# ---- deadlines ----


def default_reminder_seconds() -> int:
    return int(getattr(settings, "OZ0_WAIT_REMINDER_SECONDS", 3600))


def default_escalation_seconds() -> int:
    return int(getattr(settings, "OZ0_WAIT_ESCALATION_SECONDS", 4 * 3600))


def deadlines_of(workspace: Workspace) -> tuple[int, int]:
    """(reminder, escalation) seconds in force for the workspace; 0: that stage is off."""
    reminder = workspace.reminder_seconds if workspace.reminder_seconds is not None else default_reminder_seconds()
    escalation = workspace.escalation_seconds if workspace.escalation_seconds is not None else default_escalation_seconds()
    return int(reminder), int(escalation)


def checked_seconds(name: str, value: Any) -> int | None:
    """A stage's seconds: null (the install's default), or 0 (off) to DEADLINE_MAX_SECONDS."""
    if value is None:
        return None
    # JSON has one number type: 60.0 is 60 seconds, as the document's `integer` says (tenancy is
    # below the kernel, so runs.kernel.whole_number's rule is written here).
    number = int(value) if isinstance(value, float) and value.is_integer() else value
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= DEADLINE_MAX_SECONDS:
        raise DeadlinesRefused(f"`{name}` is null (the install's default), 0 (off) or whole seconds up to {DEADLINE_MAX_SECONDS}")
    return number


def set_deadlines(
    workspace: Workspace, *, reminder: int | None, escalation: int | None, escalate_to: ApproverGroup | None
) -> None:
    """The one write of a workspace's deadlines; an escalation that would come before (or with)
    the reminder it follows is refused."""
    reminder = checked_seconds("reminder_seconds", reminder)
    escalation = checked_seconds("escalation_seconds", escalation)
    if escalate_to is not None and escalate_to.workspace_id != workspace.pk:
        raise DeadlinesRefused("`escalate_to` names a group of another workspace")
    trial = Workspace(reminder_seconds=reminder, escalation_seconds=escalation)
    effective_reminder, effective_escalation = deadlines_of(trial)
    if effective_reminder and effective_escalation and effective_escalation <= effective_reminder:
        raise DeadlinesRefused(
            f"the escalation ({effective_escalation} s) must come after the reminder ({effective_reminder} s), or be 0 (off)"
        )
    Workspace.objects.filter(pk=workspace.pk).update(
        reminder_seconds=reminder, escalation_seconds=escalation, escalate_to=escalate_to
    )
    workspace.reminder_seconds, workspace.escalation_seconds, workspace.escalate_to = reminder, escalation, escalate_to

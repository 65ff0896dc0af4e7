"""F11, F12: the one rule for reading a run's words, as a check on one run (`can_read_content`) and
as a filter on runs (`content_readable`, which free-text search uses): the two answer alike."""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Run
from runs.permissions import can_read_content, content_readable
from tests.factories import make_member

pytestmark = pytest.mark.django_db


@pytest.mark.spec("F11", "F12")
@pytest.mark.parametrize("role", ["outsider", "viewer", "reader", "operator"])
@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("own", [False, True])
def test_the_filter_and_the_check_agree(team: Any, role: str, private: bool, own: bool) -> None:
    user = team.users[role]
    creator = user if own else make_member(workspace=team.workspace, role="operator")
    run = Run.objects.create(workspace=team.workspace, created_by=creator, private=private)
    filtered = Run.objects.filter(content_readable(user), pk=run.pk).exists()
    assert filtered is can_read_content(user, run)
    expected = role in ("reader", "operator") and (not private or own)
    assert filtered is expected


@pytest.mark.spec("F11")
def test_the_anonymous_read_no_run(team: Any) -> None:
    from django.contrib.auth.models import AnonymousUser

    Run.objects.create(workspace=team.workspace)
    assert not Run.objects.filter(content_readable(AnonymousUser())).exists()
    assert not Run.objects.filter(content_readable(None)).exists()

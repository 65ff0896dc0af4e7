"""The findings search's workspace filters: every one must hold."""

from __future__ import annotations

from typing import Any

import pytest

from tenancy.models import Membership
from tests.conftest import Api
from tests.factories import make_member, make_token, make_workspace
from tests.insights.test_findings import finding, kinds_of

pytestmark = pytest.mark.django_db


@pytest.mark.spec("F18")
def test_it_finds_nothing_when_the_workspace_parameter_and_the_query_disagree(team: Any) -> None:
    """Before, `?workspace=b&q=workspace:a` emptied the wanted set and so searched every workspace."""
    other = make_workspace()
    finding(team, kind="limit")
    finding(team, kind="budget", workspace_id=other.pk)
    both = make_member(workspace=other, role="viewer")
    Membership.objects.create(workspace=team.workspace, user=both, role="viewer")
    api = Api(make_token(user=both))
    status, page = api.get(f"/findings?workspace={other.slug}&q=workspace:{team.slug}")
    assert status == 200 and page["items"] == []
    status, page = api.get(f"/findings?workspace={other.slug}&q=workspace:{other.slug}")
    assert kinds_of(page) == ["budget"]
    status, page = api.get(f"/findings?q=workspace:{other.slug}+workspace:{team.slug}")
    assert sorted(kinds_of(page)) == ["budget", "limit"]
    status, page = api.get(f"/findings?workspace={team.slug}&q=workspace:{other.slug}+workspace:{team.slug}")
    assert kinds_of(page) == ["limit"]

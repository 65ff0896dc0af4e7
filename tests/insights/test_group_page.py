"""The console's failure group page and its resolve form (issue 31), and the scorecard's top groups:
every member sees kinds and counts, only who may read the runs sees the shape (F11, F12), and only
an operator marks a group resolved."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from insights.models import FailureGroup
from tests.conftest import Team
from tests.insights.conftest import nothing_sent, team_of
from tests.insights.planting import make_agent
from tests.insights.test_failure_groups import DOWN, MISSING_A, fail

pytestmark = pytest.mark.django_db


team = team_of("group")


@pytest.fixture(scope="module")
def paged(shared_team: Team, module_transaction: Any) -> int:
    """Built once for the module's tests that read it (each leaves it as it found it)."""
    team = shared_team
    with module_transaction.unblock(), nothing_sent():
        make_agent("paged", workspace=team.workspace, kinds=("not_found",))
        fail(team, "paged", MISSING_A)
        fail(team, "paged", MISSING_A.replace("3", "5"))
        fail(team, "paged", DOWN)
        return FailureGroup.objects.get(agent_name="paged", failed=2).pk


@pytest.fixture
def group(paged: int, db: Any) -> FailureGroup:
    return FailureGroup.objects.get(pk=paged)


def console(team: Any, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


@pytest.mark.spec("F11", "F12", "F18")
@pytest.mark.parametrize(
    ("role", "status", "words"),
    [("outsider", 404, False), ("viewer", 200, False), ("reader", 200, True), ("operator", 200, True)],
)
def test_the_group_page_shows_counts_to_members_and_the_shape_to_readers(
    team: Any, group: FailureGroup, role: str, status: int, words: bool
) -> None:
    response = console(team, role).get(f"/w/{team.slug}/groups/{group.pk}/")
    assert response.status_code == status
    if status != 200:
        return
    body = response.content.decode()
    assert "not_found" in body and "failed runs" in body
    assert ("record &#x27;…&#x27; not found after &lt;n&gt; tries" in body) is words
    assert ("closed to you" in body) is not words
    assert "SECRET" not in body
    assert ('name="version"' in body) is (role == "operator")


@pytest.mark.spec("F18")
def test_the_group_page_is_not_reached_through_another_workspace(team: Any, group: FailureGroup) -> None:
    elsewhere = Team()
    from tenancy.models import Membership

    Membership.objects.create(user=team.users["operator"], workspace=elsewhere.workspace, role="operator")
    client = console(team, "operator")
    assert client.get(f"/w/{elsewhere.slug}/groups/{group.pk}/").status_code == 404
    assert client.post(f"/w/{elsewhere.slug}/groups/{group.pk}/resolve/", {"version": "1"}).status_code == 404
    assert client.get(f"/w/{team.slug}/groups/999999/").status_code == 404
    assert Client().get(f"/w/{team.slug}/groups/{group.pk}/").status_code == 302  # to the sign-in


@pytest.mark.spec("F18")
@pytest.mark.parametrize(("role", "status"), [("outsider", 404), ("viewer", 403), ("reader", 403), ("operator", 302)])
def test_only_an_operator_resolves_from_the_page(team: Any, group: FailureGroup, role: str, status: int) -> None:
    response = console(team, role).post(f"/w/{team.slug}/groups/{group.pk}/resolve/", {"version": "1"})
    assert response.status_code == status
    group.refresh_from_db()
    assert group.resolved_in_version == (1 if role == "operator" else None)


@pytest.mark.spec("F18")
def test_the_resolve_form_answers_htmx_with_its_status_and_refuses_bad_versions(team: Any, group: FailureGroup) -> None:
    client = console(team, "operator")
    url = f"/w/{team.slug}/groups/{group.pk}/resolve/"
    assert client.get(url).status_code == 405
    for bad in ("", "0", "-1", "two", "1.5", "99999999999"):
        response = client.post(url, {"version": bad}, HTTP_HX_REQUEST="true")
        assert response.status_code == 400, bad
        assert 'role="alert"' in response.content.decode()
    response = client.post(url, {"version": "1"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Resolved in v1" in response.content.decode()
    response = client.post(url, {"reopen": "1"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and "Unresolved" in response.content.decode()
    group.refresh_from_db()
    assert group.resolved_in_version is None


@pytest.mark.spec("F11", "F18")
@pytest.mark.parametrize("role", ["viewer", "reader"])
def test_the_scorecard_lists_top_groups_linking_to_their_pages(team: Any, group: FailureGroup, role: str) -> None:
    body = console(team, role).get(f"/w/{team.slug}/agents/paged/").content.decode()
    assert "Top failure groups" in body
    assert f'href="/w/{team.slug}/groups/{group.pk}/"' in body
    assert "SECRET" not in body and "not found after" not in body

"""Search that finds (issue 31): free text over failure messages (PostgreSQL full text), only over
runs whose words the searcher may read — for anyone else it matches nothing, whatever the words
say, so it is no oracle (F11, F12); kinds as the chips name them; a scorecard's box is its agent's."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection
from django.test import Client

from insights import search
from runs.models import Run
from tests.conftest import Team
from tests.factories import make_member
from tests.insights.conftest import nothing_sent, team_of
from tests.insights.planting import make_agent
from tests.insights.test_failure_groups import fail

pytestmark = pytest.mark.django_db

WORDS = "the ledger QUASIMODO refused record 42"


team = team_of("said")


@pytest.fixture(scope="module")
def spoken(shared_team: Team, module_transaction: Any) -> dict[str, Any]:
    """Built once for the module's tests that read it (each leaves it as it found it)."""
    team = shared_team
    with module_transaction.unblock(), nothing_sent():
        make_agent("speaker", workspace=team.workspace, kinds=("not_found",))
        make_agent("other", workspace=team.workspace, kinds=("not_found",))
        return {
            "public": fail(team, "speaker", WORDS).pk,
            "private": fail(team, "speaker", "a private note on ZANZIBAR", private=True).pk,
            "other": fail(team, "other", "the ledger of another agent").pk,
        }


@pytest.fixture
def said(spoken: dict[str, Any], db: Any) -> dict[str, Run]:
    return {name: Run.objects.get(pk=pk) for name, pk in spoken.items()}


def runs_found(team: Any, role: str, q: str, *, extra: str = "") -> set[str]:
    status, page = team.api(role).get(f"/findings?q={quote(q)}{extra}")
    assert status == 200, page
    return {item["run"] for item in page["items"]}


@pytest.mark.spec("F11", "F12", "F18")
@pytest.mark.parametrize(
    ("role", "public", "private"), [("viewer", False, False), ("reader", True, False), ("operator", True, True)]
)
def test_free_text_finds_only_the_runs_whose_words_the_searcher_may_read(
    team: Any, said: dict[str, Run], role: str, public: bool, private: bool
) -> None:
    assert (str(said["public"].pk) in runs_found(team, role, "quasimodo")) is public
    assert (str(said["private"].pk) in runs_found(team, role, "zanzibar")) is private


@pytest.mark.spec("F11", "F12", "F18")
@pytest.mark.parametrize("role", ["viewer", "reader"])
def test_a_search_for_hidden_words_answers_as_one_for_words_no_run_says(team: Any, said: dict[str, Run], role: str) -> None:
    """No oracle: whether the hidden run says the word or not, the answer is the same."""
    hidden = "zanzibar" if role == "reader" else "quasimodo"
    assert runs_found(team, role, hidden) == runs_found(team, role, "nowordlikethis") == set()
    assert runs_found(team, role, f"finding:not_found {hidden}") == set()


@pytest.mark.spec("F18")
def test_free_text_takes_phrases_exclusions_and_terms_together(team: Any, said: dict[str, Run]) -> None:
    public, other = str(said["public"].pk), str(said["other"].pk)
    assert runs_found(team, "reader", "ledger") == {public, other}
    assert runs_found(team, "reader", '"ledger quasimodo"') == {public}
    assert runs_found(team, "reader", '"quasimodo ledger"') == set()
    assert runs_found(team, "reader", "ledger -quasimodo") == {other}
    assert runs_found(team, "reader", "ledger agent:other") == {other}
    assert runs_found(team, "reader", "LEDGER Record") == {public}


@pytest.mark.spec("F18")
def test_a_kind_is_found_by_its_chip_name_and_by_its_failure_name(team: Any, said: dict[str, Run]) -> None:
    everything = runs_found(team, "viewer", "")
    assert runs_found(team, "viewer", "finding:not_found") == runs_found(team, "viewer", "finding:failure_not_found")
    assert runs_found(team, "viewer", "finding:not_found") == everything and len(everything) == 3
    assert runs_found(team, "viewer", "finding:timeout") == set()


@pytest.mark.spec("F18")
def test_the_agent_parameter_scopes_the_search_whatever_the_query_says(team: Any, said: dict[str, Run]) -> None:
    assert runs_found(team, "reader", "ledger", extra="&agent=speaker") == {str(said["public"].pk)}
    assert runs_found(team, "reader", "agent:other", extra="&agent=speaker") == set()


@pytest.mark.spec("F18")
def test_a_scorecards_search_box_searches_its_agents_findings_only(team: Any, said: dict[str, Run]) -> None:
    client = Client()
    client.force_login(team.users["reader"])
    page = client.get(f"/w/{team.slug}/agents/speaker/?q=ledger", HTTP_HX_REQUEST="true")
    assert page.status_code == 200
    body = page.content.decode()
    assert str(said["public"].pk)[:8] in body and str(said["other"].pk)[:8] not in body
    page = client.get(f"/w/{team.slug}/agents/speaker/?q=agent:other", HTTP_HX_REQUEST="true")
    assert str(said["other"].pk)[:8] not in page.content.decode()


@pytest.mark.spec("F18")
def test_free_text_is_capped_and_a_mistyped_term_is_refused(team: Any, said: dict[str, Run]) -> None:
    status, body = team.api("reader").get(f"/findings?q={'word ' * 60}")
    assert status == 400 and "free text" in body["error"]["detail"]
    status, body = team.api("reader").get("/findings?q=agnet:speaker")
    assert status == 400 and "agnet" in body["error"]["detail"]
    # A phrase that holds a colon is text, not a term.
    assert runs_found(team, "reader", '"error: ledger"') == set()


@pytest.mark.spec("F11", "F18")
def test_a_reader_of_one_workspace_and_viewer_of_another_matches_words_of_the_first_only(team: Any, said: dict[str, Run]) -> None:
    from tests.conftest import Team

    elsewhere = Team()
    make_agent("speaker", workspace=elsewhere.workspace, kinds=("not_found",))
    theirs = fail(elsewhere, "speaker", WORDS)
    both = make_member(workspace=elsewhere.workspace, role="viewer")
    make_member_in(team, both, "reader")
    page = search.search_findings(both, "quasimodo")
    assert {item["run"] for item in page["items"]} == {str(said["public"].pk)}
    assert str(theirs.pk) in {item["run"] for item in search.search_findings(both, "")["items"]}


def make_member_in(team: Any, user: Any, role: str) -> None:
    from tenancy.models import Membership

    Membership.objects.create(user=user, workspace=team.workspace, role=role)


@pytest.mark.spec("F18")
def test_free_text_matches_the_very_expression_the_full_text_index_holds(team: Any, said: dict[str, Run]) -> None:
    """The planner may use `run_failure_message_fts` only if the query repeats its expression; on
    a test's few rows it rightly prefers the workspace index, so compare the expressions as
    PostgreSQL itself prints them."""
    runs = search.runs_saying("quasimodo", team.users["reader"], [team.workspace.pk])
    sql, params = runs.values("id").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'run_failure_message_fts'")
        indexdef = cursor.fetchone()[0]
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    expression = indexdef.split("USING gin (", 1)[1].removesuffix(")")
    assert expression.startswith("to_tsvector('simple'"), indexdef
    assert f"{expression} @@ " in plan, (expression, plan)

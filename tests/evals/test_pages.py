"""The console's side of regression cases (issue 31 item 5): the failed run page's "Keep as a
regression case" button, and the Regression cases page with its last results per version and
its "Run against this version" form; every POST by role, plain and with htmx."""

from __future__ import annotations

import pytest
from django.test import Client

from evals import cases
from evals.models import Eval, RegressionCase
from runs.models import Run
from tests.conftest import Team
from tests.evals.cases import FAILS_ALWAYS, FIXED_BY_V2, drive_eval_runs, failed_run, register_version, scripted_agent

pytestmark = pytest.mark.usefixtures("no_dispatch")
HTMX = {"HTTP_HX_REQUEST": "true"}


def browser(team: Team, role: str) -> Client:
    client = Client()
    client.force_login(team.users[role])
    return client


def test_the_failed_run_page_offers_the_button_to_operators_only(team: Team) -> None:
    run = failed_run(team, scripted_agent(team), FAILS_ALWAYS)
    assert "Keep as a regression case" in browser(team, "operator").get(f"/runs/{run.pk}/").content.decode()
    for role in ("reader", "viewer"):
        assert "Keep as a regression case" not in browser(team, role).get(f"/runs/{run.pk}/").content.decode()


def test_the_button_is_not_offered_on_a_run_that_did_not_fail(team: Team) -> None:
    run = failed_run(team, scripted_agent(team), [{"text": "fine"}])
    assert run.status == "completed"
    assert "Keep as a regression case" not in browser(team, "operator").get(f"/runs/{run.pk}/").content.decode()


def test_keeping_with_htmx_toasts_and_again_says_it_was_kept(team: Team) -> None:
    run = failed_run(team, scripted_agent(team), FAILS_ALWAYS)
    client = browser(team, "operator")
    first = client.post(f"/runs/{run.pk}/regression-case/", **HTMX)
    case = RegressionCase.objects.get()
    assert first.status_code == 200 and f"Kept as regression case {case.pk}." in first.content.decode()
    again = client.post(f"/runs/{run.pk}/regression-case/", **HTMX)
    assert f"Already kept as regression case {case.pk}." in again.content.decode()
    assert RegressionCase.objects.count() == 1


def test_a_plain_keep_redirects_to_the_case_on_its_page(team: Team) -> None:
    run = failed_run(team, scripted_agent(team), FAILS_ALWAYS)
    answer = browser(team, "operator").post(f"/runs/{run.pk}/regression-case/")
    case = RegressionCase.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/w/{team.slug}/regression-cases/#case-{case.pk}"


@pytest.mark.parametrize(("role", "expected"), [("outsider", 404), ("viewer", 403), ("reader", 403)])
def test_no_one_but_an_operator_keeps_deletes_or_runs_cases(team: Team, role: str, expected: int) -> None:
    agent = scripted_agent(team)
    run = failed_run(team, agent, FAILS_ALWAYS)
    client = browser(team, role)
    assert client.post(f"/runs/{run.pk}/regression-case/").status_code == expected
    assert client.post(f"/runs/{run.pk}/regression-case/", **HTMX).status_code == expected
    assert not RegressionCase.objects.exists()
    case, _ = cases.keep(user=team.users["operator"], run_id=run.pk)
    assert client.post(f"/w/{team.slug}/regression-cases/{case.pk}/delete/").status_code == expected
    assert client.post(f"/w/{team.slug}/regression-cases/evals/", {"agent": agent, "version": "1"}).status_code == expected
    assert RegressionCase.objects.filter(pk=case.pk).exists() and not Eval.objects.exists()


def test_the_posts_refuse_get_and_send_the_anonymous_to_sign_in(team: Team) -> None:
    run = failed_run(team, scripted_agent(team), FAILS_ALWAYS)
    for path in (
        f"/runs/{run.pk}/regression-case/",
        f"/w/{team.slug}/regression-cases/evals/",
        f"/w/{team.slug}/regression-cases/1/delete/",
    ):
        assert browser(team, "operator").get(path).status_code == 405
        anonymous = Client().post(path)
        assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_the_page_by_role(team: Team) -> None:
    agent = scripted_agent(team)
    cases.keep(user=team.users["operator"], run_id=failed_run(team, agent, FAILS_ALWAYS).pk)
    path = f"/w/{team.slug}/regression-cases/"
    assert browser(team, "outsider").get(path).status_code == 404
    operator = browser(team, "operator").get(path).content.decode()
    assert "SECRET-INPUT" in operator and "Run against this version" in operator and "Delete" in operator
    reader = browser(team, "reader").get(path).content.decode()
    assert "SECRET-INPUT" in reader and "Run against this version" not in reader
    viewer = browser(team, "viewer").get(path).content.decode()
    assert "not_found" in viewer and "SECRET" not in viewer and "hidden from you" in viewer


def test_an_operator_runs_the_cases_and_the_page_shows_the_last_result_per_version(team: Team) -> None:
    agent = scripted_agent(team)
    fixed = cases.keep(user=team.users["operator"], run_id=failed_run(team, agent, FIXED_BY_V2).pk)[0]
    still = cases.keep(user=team.users["operator"], run_id=failed_run(team, agent, FAILS_ALWAYS).pk)[0]
    register_version(team, agent, "oz.fail, test.echo")
    client = browser(team, "operator")
    started = client.post(f"/w/{team.slug}/regression-cases/evals/", {"agent": agent, "version": "2"}, **HTMX)
    body = started.content.decode()
    assert started.status_code == 200 and "started" in body and 'data-going="true"' in body
    assert Run.objects.filter(rollout="eval", agent_version__version=2).count() == 2
    drive_eval_runs(Eval.objects.get())
    page = client.get(f"/w/{team.slug}/regression-cases/", **HTMX)
    text = page.content.decode()
    assert page.status_code == 200 and "HX-Request" in page["Vary"] and 'data-going="true"' not in text
    assert f'id="case-{fixed.pk}"' in text and f'id="case-{still.pk}"' in text
    assert text.count('data-version="2" data-verdict="passed"') == 1
    assert text.count('data-version="2" data-verdict="failed_again"') == 1


def test_a_refused_eval_form_answers_with_the_reason(team: Team) -> None:
    agent = scripted_agent(team)
    client = browser(team, "operator")
    refused = client.post(f"/w/{team.slug}/regression-cases/evals/", {"agent": agent, "version": "1"}, **HTMX)
    assert refused.status_code == 409 and "no_cases" in refused.content.decode()
    plain = client.post(f"/w/{team.slug}/regression-cases/evals/", {"agent": agent, "version": "x"})
    assert plain.status_code == 400 and "invalid_version" in plain.content.decode()

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from runs import selectors


@login_required
def home(request: HttpRequest) -> HttpResponse:
    memberships = selectors.workspaces_of(request.user)
    return render(request, "runs/home.html", {"memberships": memberships})

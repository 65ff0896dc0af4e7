"""Console pages of insights."""

from __future__ import annotations

from django.urls import path

from insights import views

urlpatterns = [
    path("w/<slug:slug>/agents/", views.agents, name="agents"),
    path("w/<slug:slug>/agents/<str:name>/", views.scorecard, name="scorecard"),
]

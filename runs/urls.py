from django.urls import path

from runs import views

urlpatterns = [
    path("", views.home, name="home"),
    path("w/<slug:slug>/", views.workspace_home, name="workspace"),
    path("w/<slug:slug>/runs/", views.runs_list, name="runs"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run"),
]

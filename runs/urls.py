from django.urls import path

from runs import token_views, views

urlpatterns = [
    path("", views.home, name="home"),
    path("tokens/", token_views.token_list, name="tokens"),
    path("tokens/<int:token_id>/revoke/", token_views.token_revoke, name="token_revoke"),
    path("w/<slug:slug>/", views.workspace_home, name="workspace"),
    path("w/<slug:slug>/runs/", views.runs_list, name="runs"),
    path("w/<slug:slug>/holds/", views.holds, name="holds"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run"),
    path("runs/<uuid:run_id>/append/", views.append, name="run_append"),
    path("runs/<uuid:run_id>/<str:verb>/", views.run_verb, name="run_verb"),
    path("runs/<uuid:run_id>/tasks/<path:key>/<str:verb>/", views.task_verb, name="task_verb"),
]

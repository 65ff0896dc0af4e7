from django.urls import path

from inbox import views

urlpatterns = [
    path("w/<slug:slug>/inbox/", views.inbox, name="inbox"),
]

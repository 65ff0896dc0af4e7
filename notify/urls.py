from django.urls import path

from notify import views

urlpatterns = [
    path("subscriptions/", views.subscription_list, name="subscriptions"),
    path("subscriptions/<int:subscription_id>/delete/", views.subscription_delete, name="subscription_delete"),
]

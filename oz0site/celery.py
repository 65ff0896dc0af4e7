import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oz0site.settings")

app = Celery("oz0")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

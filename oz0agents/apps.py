from django.apps import AppConfig


class AgentsConfig(AppConfig):
    # The package is `oz0agents` so that it shadows no dependency (the OpenAI Agents SDK's
    # top-level package is `agents`); the label stays `agents`, so its tables, migrations and
    # the foreign keys that name `agents.AgentVersion` are what they were.
    name = "oz0agents"
    label = "agents"
    default_auto_field = "django.db.models.BigAutoField"

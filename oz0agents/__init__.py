"""The agents app (package `oz0agents`, label `agents`): manifests (parsing, lint), the registry of agent versions, who may see and
register agents, and the agents part of the JSON API."""

"""The worker side: what runs inside a Celery worker process.

`tasks` (the Celery adapters, named `runs.tasks.*`) → `execution` (claim, heartbeat, run, report)
→ `round_driver` (model rounds through `providers`) or `tool_functions` (worker tools). `periodic`
is what beat runs. Status changes go through `runs.kernel`; the kernel never imports this package
for what it decides (tool metadata is the catalog's, `runs.tools`).
"""

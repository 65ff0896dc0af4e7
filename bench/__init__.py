"""`./oz0 bench`: oz0 measured against the physical limit and its peers, side by side in one run.

`python -m bench [--quick] [--only NAME]` (see bench/README.md). Each workload lives in a
module of its own (`fan`, `chain`, `propagate`, `inbox`, `live`; `scorecard` is called through
`bench.scorecard.run`), and so does each reference (`physical`, `celery_bare`, `peer`).
`bench.harness` holds the shared plumbing: the bench's own database and queue, the worker
processes, progress, statistics and the JSON result.
"""

"""The bench's plumbing on toy sizes: it runs every workload it owns end to end (its own
database, Celery workers, procrastinate workers, daphne, websocket clients) and writes a JSON
result with the expected shape. No timing is asserted: the figures of a toy run mean nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent.parent
WORKLOADS = ("propagate", "inbox", "fan", "chain", "live")


def _scratch_url() -> str:
    parts = urlsplit(settings.DATABASE_URL)
    name = f"{settings.DATABASES['default']['TEST']['NAME']}_harness"
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def _drop(url: str) -> None:
    import psycopg

    parts = urlsplit(url)
    admin = urlunsplit((parts.scheme, parts.netloc, "/postgres", parts.query, parts.fragment))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parts.path.strip("/")}" WITH (FORCE)')


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_it_writes_a_json_result_with_every_workload(tmp_path: Path) -> None:
    url = _scratch_url()
    env = {
        **os.environ,
        "DATABASE_URL": settings.DATABASE_URL,
        "REDIS_URL": settings.REDIS_URL,
        "OZ0_BENCH_DATABASE_URL": url,
        "OZ0_BENCH_RESULTS_DIR": str(tmp_path),
    }
    argv = [sys.executable, "-m", "bench", "--tiny", *(arg for name in WORKLOADS for arg in ("--only", name))]
    try:
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    finally:
        _drop(url)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert data["profile"] == "tiny"
    assert {"command", "date", "seconds", "machine", "database", "queue", "worker_processes", "workloads"} <= data.keys()
    assert data["database"].endswith("_harness")
    assert set(data["workloads"]) == set(WORKLOADS)
    for name, section in data["workloads"].items():
        assert section["skipped"] is None, f"{name}: {section['skipped']}\n{done.stderr[-5000:]}"
        assert section["figures"], name
        for figure, stat in section["figures"].items():
            assert {"median", "min", "max", "n", "unit"} <= stat.keys(), (name, figure)
            assert stat["n"] >= 1 and stat["min"] <= stat["median"] <= stat["max"], (name, figure, stat)
        assert section["goals"], name
    fan = data["workloads"]["fan"]["figures"]
    assert any(key.startswith("bare Celery") for key in fan)
    assert any(key.startswith("procrastinate") for key in fan)
    assert any(key.startswith("single-row UPDATE") for key in fan)
    assert "ratio: fan tasks/s / bare Celery" in fan
    propagate = data["workloads"]["propagate"]["figures"]
    assert propagate["chain of 40: WAL per descendant"]["min"] > 0  # a skip writes its row and its trace event
    assert "figures written to" in done.stdout

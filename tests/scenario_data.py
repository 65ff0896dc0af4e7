"""The conformance scenarios, as the project's own data (driven by tests.scenario)."""

from typing import Any

SCENARIOS: dict[str, dict[str, Any]] = {
    "chain-completes": {
        "spec": ["S3", "S29"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": []},
                        {"key": "b", "kind": "tool", "tool": "test.echo", "args": {"value": 2}, "after": ["a"]},
                    ],
                    "deliverable": "b",
                }
            },
            {"wait": {"run.status": "completed"}},
            {
                "expect": {
                    "task.a.status": "completed",
                    "task.b.status": "completed",
                    "run.output": 2,
                    "run.attention": None,
                    "run.failure": None,
                }
            },
        ],
    },
    "propagate-skips-descendants-transitively": {
        "spec": ["S11", "S18"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "a",
                            "kind": "tool",
                            "tool": "test.fail",
                            "args": {"error": "tool_failed", "detail": "boom"},
                            "after": [],
                            "on_failure": "propagate",
                        },
                        {"key": "b", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["a"]},
                        {"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 2}, "after": ["b"]},
                        {"key": "d", "kind": "tool", "tool": "test.echo", "args": {"value": 3}, "after": []},
                    ],
                    "deliverable": "c",
                }
            },
            {"wait": {"run.status": "needs_attention"}},
            {
                "expect": {
                    "task.a.status": "failed",
                    "task.a.error.key": "tool_failed",
                    "task.b.status": "skipped",
                    "task.c.status": "skipped",
                    "task.d.status": "completed",
                    "run.attention.reason": "deliverable_unresolved",
                    "run.output": None,
                }
            },
        ],
    },
    "absorb-satisfies-dependents": {
        "spec": ["S12", "S15"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "a",
                            "kind": "tool",
                            "tool": "test.fail",
                            "args": {"error": "tool_failed", "detail": "boom"},
                            "after": [],
                            "on_failure": "absorb",
                        },
                        {"key": "b", "kind": "tool", "tool": "test.echo", "args": {"value": 7}, "after": ["a"]},
                    ],
                    "deliverable": "b",
                }
            },
            {"wait": {"run.status": "completed"}},
            {
                "expect": {
                    "task.a.status": "failed",
                    "task.a.failure_resolution": "absorbed",
                    "task.b.status": "completed",
                    "run.output": 7,
                }
            },
            {"verb": "retry", "task": "a", "expect_http": 409},
            {"verb": "abandon", "task": "a", "expect_http": 409},
        ],
    },
    "halt-finishes-what-can-run-then-holds": {
        "spec": ["S13", "S21"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "a",
                            "kind": "tool",
                            "tool": "test.fail",
                            "args": {"error": "tool_failed", "detail": "boom"},
                            "after": [],
                            "on_failure": "halt",
                        },
                        {"key": "b", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 0.5}, "after": []},
                        {"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["a"]},
                    ],
                    "deliverable": "c",
                }
            },
            {"wait": {"run.status": "needs_attention"}},
            {
                "expect": {
                    "task.b.status": "completed",
                    "task.c.status": "waiting",
                    "run.attention.reason": "halt_failure",
                    "run.attention.blocked_task_keys": ["a"],
                }
            },
        ],
    },
    "halt-retry-repairs": {
        "spec": ["S13", "S14"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "a",
                            "kind": "tool",
                            "tool": "test.flaky",
                            "args": {"fail_times": 1, "id": "$uniq"},
                            "on_failure": "halt",
                        },
                        {"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 5}, "after": ["a"]},
                    ],
                    "deliverable": "c",
                }
            },
            {"wait": {"run.status": "needs_attention"}},
            {"verb": "retry", "task": "a", "expect_http": 200},
            {"wait": {"run.status": "completed"}},
            {"expect": {"task.a.status": "completed", "task.c.status": "completed", "run.output": 5, "run.attention": None}},
        ],
    },
    "halt-abandon-moves-past": {
        "spec": ["S14", "S19"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "a",
                            "kind": "tool",
                            "tool": "test.fail",
                            "args": {"error": "tool_failed", "detail": "boom"},
                            "after": [],
                            "on_failure": "halt",
                        },
                        {"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["a"]},
                        {"key": "d", "kind": "tool", "tool": "test.echo", "args": {"value": 9}, "after": []},
                    ],
                    "deliverable": "d",
                }
            },
            {"wait": {"run.status": "needs_attention"}},
            {"verb": "abandon", "task": "a", "expect_http": 200},
            {"wait": {"run.status": "completed"}},
            {"expect": {"task.a.failure_resolution": "abandoned", "task.c.status": "skipped", "run.output": 9}},
            {"verb": "retry", "task": "a", "expect_http": 409},
        ],
    },
    "append-releases-hold": {
        "spec": ["S17"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "a",
                            "kind": "tool",
                            "tool": "test.fail",
                            "args": {"error": "tool_failed", "detail": "boom"},
                            "after": [],
                            "on_failure": "propagate",
                        },
                        {"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["a"]},
                    ],
                    "deliverable": "c",
                }
            },
            {"wait": {"run.status": "needs_attention"}},
            {"expect": {"run.attention.reason": "deliverable_unresolved"}},
            {
                "append": {
                    "tasks": [{"key": "fix", "kind": "tool", "tool": "test.echo", "args": {"value": 42}, "after": []}],
                    "deliverable": "fix",
                }
            },
            {"wait": {"run.status": "completed"}},
            {"expect": {"run.output": 42}},
        ],
    },
    "join-any-cancels-losers": {
        "spec": ["S16"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {"key": "fast", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 0.1}, "after": []},
                        {"key": "slow", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 30}, "after": []},
                        {"key": "j", "kind": "join", "mode": "any", "after": ["fast", "slow"]},
                    ],
                    "deliverable": "j",
                }
            },
            {"wait": {"run.status": "completed"}, "timeout": 20},
            {
                "expect": {
                    "task.fast.status": "completed",
                    "task.slow.status": "canceled",
                    "task.slow.error.key": "join_loser_canceled",
                    "task.j.status": "completed",
                }
            },
        ],
    },
    "join-quorum-counts-skipped-as-non-success": {
        "spec": ["S11", "S16"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "a",
                            "kind": "tool",
                            "tool": "test.fail",
                            "args": {"error": "tool_failed", "detail": "boom"},
                            "after": [],
                            "on_failure": "propagate",
                        },
                        {"key": "b", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": []},
                        {"key": "c", "kind": "tool", "tool": "test.echo", "args": {"value": 2}, "after": []},
                        {"key": "j", "kind": "join", "mode": "quorum", "quorum": 2, "after": ["a", "b", "c"]},
                    ],
                    "deliverable": "j",
                }
            },
            {"wait": {"run.status": "completed"}},
            {"expect": {"task.j.status": "completed"}},
        ],
    },
    "join-all-with-skipped-source": {
        "spec": ["S11", "S18"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "a",
                            "kind": "tool",
                            "tool": "test.fail",
                            "args": {"error": "tool_failed", "detail": "boom"},
                            "after": [],
                            "on_failure": "propagate",
                        },
                        {"key": "b", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": []},
                        {"key": "j", "kind": "join", "mode": "all", "after": ["a", "b"]},
                    ],
                    "deliverable": "j",
                }
            },
            {"wait": {"run.status": "needs_attention"}},
            {"expect": {"task.j.status": "skipped", "run.attention.reason": "deliverable_unresolved"}},
        ],
    },
    "approval-ask-approve": {
        "spec": ["S4", "S5", "S6"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script",
                            "prompt": "go",
                            "script": [{"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]}, {"text": "done"}],
                            "after": [],
                        }
                    ],
                    "deliverable": "r1",
                    "approval": {"mode": "ask"},
                }
            },
            {"wait": {"task.r1.1.status": "needs_approval"}},
            {"expect": {"run.status": "running", "run.announcements": {"contains": "approval_required"}}},
            {"inbox_contains": {"kind": "approval", "task": "r1.1"}},
            {"verb": "approve", "task": "r1.1", "expect_http": 200},
            {"verb": "approve", "task": "r1.1", "expect_http": 409},
            {"wait": {"run.status": "completed"}},
            {"expect": {"run.output": "done"}},
        ],
    },
    "approval-deny-is-read-by-model": {
        "spec": ["S5", "S6"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script",
                            "prompt": "go",
                            "script": [{"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]}, {"text": "understood"}],
                            "after": [],
                        }
                    ],
                    "deliverable": "r1",
                    "approval": {"mode": "ask"},
                }
            },
            {"wait": {"task.r1.1.status": "needs_approval"}},
            {"verb": "deny", "task": "r1.1", "body": {"reason": "not today"}, "expect_http": 200},
            {"wait": {"run.status": "completed"}},
            {"expect": {"task.r1.1.status": "failed", "task.r1.1.error.key": "approval_denied", "run.output": "understood"}},
        ],
    },
    "approval-bypass-never-rests": {
        "spec": ["S5"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script",
                            "prompt": "go",
                            "script": [{"tool_calls": [{"tool": "test.echo", "args": {"value": 1}}]}, {"text": "done"}],
                            "after": [],
                        }
                    ],
                    "deliverable": "r1",
                    "approval": {"mode": "bypass"},
                }
            },
            {"wait": {"run.status": "completed"}},
            {"trace_has_no": {"to": "needs_approval"}},
        ],
    },
    "model-question-announces-awaiting-human": {
        "spec": ["S9", "S20", "S21"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script",
                            "prompt": "go",
                            "script": [{"ask": "which repo?"}, {"text": "thanks"}],
                            "after": [],
                        }
                    ],
                    "deliverable": "r1",
                }
            },
            {"wait": {"run.attention.reason": "awaiting_human"}},
            {"expect": {"run.status": "running", "run.attention.blocked_task_keys": {"len": 1}}},
            {"answer_blocked": {"value": "oz0"}},
            {"wait": {"run.status": "completed"}},
            {"expect": {"run.output": "thanks"}},
        ],
    },
    "client-await-with-token-is-dispatched-not-announced": {
        "spec": ["S8", "S20"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {"key": "q", "kind": "await", "question": "ok?"},
                        {"key": "b", "kind": "tool", "tool": "test.echo", "args": {"value": 3}, "after": ["q"]},
                    ],
                    "deliverable": "b",
                }
            },
            {"wait": {"task.q.status": "dispatched"}},
            {"expect": {"run.status": "running", "run.attention": None}},
            {"resolve_token": {"task": "q", "value": "yes"}},
            {"wait": {"run.status": "completed"}},
        ],
    },
    "cancel-cancels-unstarted-work": {
        "spec": ["S6", "S29", "F1"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {"key": "a", "kind": "tool", "tool": "test.sleep", "args": {"seconds": 30}, "after": []},
                        {"key": "b", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["a"]},
                    ],
                    "deliverable": "b",
                }
            },
            {"wait": {"task.a.status": "running"}},
            {"verb_run": "cancel", "body": {"reason": "wrong input"}, "expect_http": 200},
            {"wait": {"run.status": "canceled"}, "timeout": 20},
            {"expect": {"task.b.status": "canceled", "task.b.error.key": "run_canceled", "run.failure.kind": "cancelled"}},
        ],
    },
    "oz-fail-declared-kind": {
        "spec": ["F1", "F2", "F6", "F10"],
        "steps": [
            {
                "register_agent": "name: issue_reader\n"
                "model: script\n"
                "tools: [oz.fail]\n"
                "failures:\n"
                "  - kind: not_found\n"
                "    description: The issue does not exist\n"
                "    person: true\n"
            },
            {
                "create": {
                    "agent": "issue_reader",
                    "input": {"issue": 42},
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script",
                            "prompt": "go",
                            "script": [{"oz_fail": {"kind": "not_found", "message": "issue 42 is gone"}}],
                            "after": [],
                        }
                    ],
                    "deliverable": "r1",
                }
            },
            {"wait": {"run.status": "canceled"}},
            {
                "expect": {
                    "run.failure.kind": "not_found",
                    "run.failure.person": True,
                    "run.failure.retryable": False,
                    "run.failure.partial": False,
                    "run.failure.declared": True,
                    "run.failure.message": "issue 42 is gone",
                }
            },
        ],
    },
    "oz-fail-undeclared-kind": {
        "spec": ["F6", "F9"],
        "steps": [
            {
                "register_agent": "name: loose_reader\n"
                "model: script\n"
                "tools: [oz.fail]\n"
                "failures:\n"
                "  - kind: not_found\n"
                "    description: The issue does not exist\n"
            },
            {
                "create": {
                    "agent": "loose_reader",
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script",
                            "prompt": "go",
                            "script": [{"oz_fail": {"kind": "made_up", "message": "?"}}],
                            "after": [],
                        }
                    ],
                    "deliverable": "r1",
                }
            },
            {"wait": {"run.status": "canceled"}},
            {"expect": {"run.failure.kind": "undeclared", "run.failure.declared": False}},
        ],
    },
    "rate-limit-waits-and-is-not-overload": {
        "spec": ["S26"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script",
                            "prompt": "go",
                            "script": [{"http": 429, "retry_after": 0.2}, {"text": "ok"}],
                            "after": [],
                        }
                    ],
                    "deliverable": "r1",
                }
            },
            {"wait": {"run.status": "completed"}},
            {"expect": {"run.output": "ok"}},
        ],
    },
    "overload-advances-to-fallback": {
        "spec": ["S26"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script:main",
                            "prompt": "go",
                            "script": {
                                "script:main": [
                                    {"http": 529},
                                    {"http": 529},
                                    {"http": 529},
                                    {"http": 529},
                                    {"http": 529},
                                    {"http": 529},
                                ],
                                "script:backup": [{"text": "from backup"}],
                            },
                            "after": [],
                            "fallback_models": ["script:backup"],
                        }
                    ],
                    "deliverable": "r1",
                }
            },
            {"wait": {"run.status": "completed"}},
            {
                "expect": {
                    "run.output": "from backup",
                    "task.r1.result.model_change.reason": "provider_overloaded",
                    "task.r1.result.model_change.to": "script:backup",
                }
            },
        ],
    },
    "classifier-refusal-switches-route": {
        "spec": ["S25"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script:main",
                            "prompt": "go",
                            "script": {
                                "script:main": [{"refusal": "classifier", "category": "cyber"}],
                                "script:backup": [{"text": "answered"}],
                            },
                            "after": [],
                            "fallback_models": ["script:backup"],
                        }
                    ],
                    "deliverable": "r1",
                }
            },
            {"wait": {"run.status": "completed"}},
            {"expect": {"task.r1.result.model_change.reason": "model_refused", "task.r1.result.model_change.category": "cyber"}},
        ],
    },
    "content-protection-never-switches": {
        "spec": ["S25"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script:main",
                            "prompt": "go",
                            "script": {"script:main": [{"refusal": "blocked"}], "script:backup": [{"text": "should not run"}]},
                            "after": [],
                            "fallback_models": ["script:backup"],
                            "on_failure": "halt",
                        }
                    ],
                    "deliverable": "r1",
                }
            },
            {"wait": {"run.status": "needs_attention"}},
            {"expect": {"task.r1.status": "failed", "task.r1.error.key": "model_refused"}},
        ],
    },
    "provider-error-no-fallback": {
        "spec": ["S24"],
        "steps": [
            {
                "create": {
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script:main",
                            "prompt": "go",
                            "script": {
                                "script:main": [{"finish": "error", "word": "malformed"}],
                                "script:backup": [{"text": "no"}],
                            },
                            "after": [],
                            "fallback_models": ["script:backup"],
                            "on_failure": "halt",
                        }
                    ],
                    "deliverable": "r1",
                }
            },
            {"wait": {"run.status": "needs_attention"}},
            {"expect": {"task.r1.error.key": "provider_error", "task.r1.error.detail": {"contains": "malformed"}}},
        ],
    },
    "bad-input-is-refused-typed-and-writes-nothing": {
        "spec": ["S30", "S31"],
        "steps": [
            {"count_runs": "before"},
            {
                "create": {
                    "tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": "nul\x00byte"}, "after": []}],
                    "deliverable": "a",
                },
                "expect_http": 400,
            },
            {
                "create_raw": '{"tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": 1e5}}], '
                '"deliverable": "a"}',
                "expect_http": 400,
            },
            {
                "create": {
                    "tasks": [
                        {"key": "t0", "kind": "tool", "tool": "test.echo", "args": {"value": 0}, "after": []},
                        {"key": "t1", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": []},
                        {"key": "t2", "kind": "tool", "tool": "test.echo", "args": {"value": 2}, "after": []},
                        {"key": "t3", "kind": "tool", "tool": "test.echo", "args": {"value": 3}, "after": []},
                        {"key": "t4", "kind": "tool", "tool": "test.echo", "args": {"value": 4}, "after": []},
                        {"key": "t5", "kind": "tool", "tool": "test.echo", "args": {"value": 5}, "after": []},
                        {"key": "t6", "kind": "tool", "tool": "test.echo", "args": {"value": 6}, "after": []},
                        {"key": "t7", "kind": "tool", "tool": "test.echo", "args": {"value": 7}, "after": []},
                        {"key": "t8", "kind": "tool", "tool": "test.echo", "args": {"value": 8}, "after": []},
                        {"key": "t9", "kind": "tool", "tool": "test.echo", "args": {"value": 9}, "after": []},
                        {"key": "t10", "kind": "tool", "tool": "test.echo", "args": {"value": 10}, "after": []},
                        {"key": "t11", "kind": "tool", "tool": "test.echo", "args": {"value": 11}, "after": []},
                        {"key": "t12", "kind": "tool", "tool": "test.echo", "args": {"value": 12}, "after": []},
                        {"key": "t13", "kind": "tool", "tool": "test.echo", "args": {"value": 13}, "after": []},
                        {"key": "t14", "kind": "tool", "tool": "test.echo", "args": {"value": 14}, "after": []},
                        {"key": "t15", "kind": "tool", "tool": "test.echo", "args": {"value": 15}, "after": []},
                        {"key": "t16", "kind": "tool", "tool": "test.echo", "args": {"value": 16}, "after": []},
                        {"key": "t17", "kind": "tool", "tool": "test.echo", "args": {"value": 17}, "after": []},
                        {"key": "t18", "kind": "tool", "tool": "test.echo", "args": {"value": 18}, "after": []},
                        {"key": "t19", "kind": "tool", "tool": "test.echo", "args": {"value": 19}, "after": []},
                        {"key": "t20", "kind": "tool", "tool": "test.echo", "args": {"value": 20}, "after": []},
                        {"key": "t21", "kind": "tool", "tool": "test.echo", "args": {"value": 21}, "after": []},
                        {"key": "t22", "kind": "tool", "tool": "test.echo", "args": {"value": 22}, "after": []},
                        {"key": "t23", "kind": "tool", "tool": "test.echo", "args": {"value": 23}, "after": []},
                        {"key": "t24", "kind": "tool", "tool": "test.echo", "args": {"value": 24}, "after": []},
                        {"key": "t25", "kind": "tool", "tool": "test.echo", "args": {"value": 25}, "after": []},
                        {"key": "t26", "kind": "tool", "tool": "test.echo", "args": {"value": 26}, "after": []},
                        {"key": "t27", "kind": "tool", "tool": "test.echo", "args": {"value": 27}, "after": []},
                        {"key": "t28", "kind": "tool", "tool": "test.echo", "args": {"value": 28}, "after": []},
                        {"key": "t29", "kind": "tool", "tool": "test.echo", "args": {"value": 29}, "after": []},
                        {"key": "t30", "kind": "tool", "tool": "test.echo", "args": {"value": 30}, "after": []},
                        {"key": "t31", "kind": "tool", "tool": "test.echo", "args": {"value": 31}, "after": []},
                        {"key": "t32", "kind": "tool", "tool": "test.echo", "args": {"value": 32}, "after": []},
                        {"key": "t33", "kind": "tool", "tool": "test.echo", "args": {"value": 33}, "after": []},
                        {"key": "t34", "kind": "tool", "tool": "test.echo", "args": {"value": 34}, "after": []},
                        {"key": "t35", "kind": "tool", "tool": "test.echo", "args": {"value": 35}, "after": []},
                        {"key": "t36", "kind": "tool", "tool": "test.echo", "args": {"value": 36}, "after": []},
                        {"key": "t37", "kind": "tool", "tool": "test.echo", "args": {"value": 37}, "after": []},
                        {"key": "t38", "kind": "tool", "tool": "test.echo", "args": {"value": 38}, "after": []},
                        {"key": "t39", "kind": "tool", "tool": "test.echo", "args": {"value": 39}, "after": []},
                        {"key": "t40", "kind": "tool", "tool": "test.echo", "args": {"value": 40}, "after": []},
                        {"key": "t41", "kind": "tool", "tool": "test.echo", "args": {"value": 41}, "after": []},
                        {"key": "t42", "kind": "tool", "tool": "test.echo", "args": {"value": 42}, "after": []},
                        {"key": "t43", "kind": "tool", "tool": "test.echo", "args": {"value": 43}, "after": []},
                        {"key": "t44", "kind": "tool", "tool": "test.echo", "args": {"value": 44}, "after": []},
                        {"key": "t45", "kind": "tool", "tool": "test.echo", "args": {"value": 45}, "after": []},
                        {"key": "t46", "kind": "tool", "tool": "test.echo", "args": {"value": 46}, "after": []},
                        {"key": "t47", "kind": "tool", "tool": "test.echo", "args": {"value": 47}, "after": []},
                        {"key": "t48", "kind": "tool", "tool": "test.echo", "args": {"value": 48}, "after": []},
                        {"key": "t49", "kind": "tool", "tool": "test.echo", "args": {"value": 49}, "after": []},
                        {"key": "t50", "kind": "tool", "tool": "test.echo", "args": {"value": 50}, "after": []},
                        {"key": "t51", "kind": "tool", "tool": "test.echo", "args": {"value": 51}, "after": []},
                        {"key": "t52", "kind": "tool", "tool": "test.echo", "args": {"value": 52}, "after": []},
                        {"key": "t53", "kind": "tool", "tool": "test.echo", "args": {"value": 53}, "after": []},
                        {"key": "t54", "kind": "tool", "tool": "test.echo", "args": {"value": 54}, "after": []},
                        {"key": "t55", "kind": "tool", "tool": "test.echo", "args": {"value": 55}, "after": []},
                        {"key": "t56", "kind": "tool", "tool": "test.echo", "args": {"value": 56}, "after": []},
                        {"key": "t57", "kind": "tool", "tool": "test.echo", "args": {"value": 57}, "after": []},
                        {"key": "t58", "kind": "tool", "tool": "test.echo", "args": {"value": 58}, "after": []},
                        {"key": "t59", "kind": "tool", "tool": "test.echo", "args": {"value": 59}, "after": []},
                        {"key": "t60", "kind": "tool", "tool": "test.echo", "args": {"value": 60}, "after": []},
                        {"key": "t61", "kind": "tool", "tool": "test.echo", "args": {"value": 61}, "after": []},
                        {"key": "t62", "kind": "tool", "tool": "test.echo", "args": {"value": 62}, "after": []},
                        {"key": "t63", "kind": "tool", "tool": "test.echo", "args": {"value": 63}, "after": []},
                        {"key": "t64", "kind": "tool", "tool": "test.echo", "args": {"value": 64}, "after": []},
                    ],
                    "deliverable": "t0",
                },
                "expect_http": 400,
            },
            {
                "create": {
                    "tasks": [
                        {"key": "s0", "kind": "tool", "tool": "test.echo", "args": {"value": 0}, "after": []},
                        {"key": "s1", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": []},
                        {"key": "s2", "kind": "tool", "tool": "test.echo", "args": {"value": 2}, "after": []},
                        {"key": "s3", "kind": "tool", "tool": "test.echo", "args": {"value": 3}, "after": []},
                        {"key": "s4", "kind": "tool", "tool": "test.echo", "args": {"value": 4}, "after": []},
                        {"key": "s5", "kind": "tool", "tool": "test.echo", "args": {"value": 5}, "after": []},
                        {"key": "s6", "kind": "tool", "tool": "test.echo", "args": {"value": 6}, "after": []},
                        {"key": "s7", "kind": "tool", "tool": "test.echo", "args": {"value": 7}, "after": []},
                        {"key": "s8", "kind": "tool", "tool": "test.echo", "args": {"value": 8}, "after": []},
                        {"key": "s9", "kind": "tool", "tool": "test.echo", "args": {"value": 9}, "after": []},
                        {"key": "s10", "kind": "tool", "tool": "test.echo", "args": {"value": 10}, "after": []},
                        {"key": "s11", "kind": "tool", "tool": "test.echo", "args": {"value": 11}, "after": []},
                        {"key": "s12", "kind": "tool", "tool": "test.echo", "args": {"value": 12}, "after": []},
                        {"key": "s13", "kind": "tool", "tool": "test.echo", "args": {"value": 13}, "after": []},
                        {"key": "s14", "kind": "tool", "tool": "test.echo", "args": {"value": 14}, "after": []},
                        {"key": "s15", "kind": "tool", "tool": "test.echo", "args": {"value": 15}, "after": []},
                        {"key": "s16", "kind": "tool", "tool": "test.echo", "args": {"value": 16}, "after": []},
                        {"key": "s17", "kind": "tool", "tool": "test.echo", "args": {"value": 17}, "after": []},
                        {"key": "s18", "kind": "tool", "tool": "test.echo", "args": {"value": 18}, "after": []},
                        {"key": "s19", "kind": "tool", "tool": "test.echo", "args": {"value": 19}, "after": []},
                        {"key": "s20", "kind": "tool", "tool": "test.echo", "args": {"value": 20}, "after": []},
                        {"key": "s21", "kind": "tool", "tool": "test.echo", "args": {"value": 21}, "after": []},
                        {"key": "s22", "kind": "tool", "tool": "test.echo", "args": {"value": 22}, "after": []},
                        {"key": "s23", "kind": "tool", "tool": "test.echo", "args": {"value": 23}, "after": []},
                        {"key": "s24", "kind": "tool", "tool": "test.echo", "args": {"value": 24}, "after": []},
                        {"key": "s25", "kind": "tool", "tool": "test.echo", "args": {"value": 25}, "after": []},
                        {"key": "s26", "kind": "tool", "tool": "test.echo", "args": {"value": 26}, "after": []},
                        {"key": "s27", "kind": "tool", "tool": "test.echo", "args": {"value": 27}, "after": []},
                        {"key": "s28", "kind": "tool", "tool": "test.echo", "args": {"value": 28}, "after": []},
                        {"key": "s29", "kind": "tool", "tool": "test.echo", "args": {"value": 29}, "after": []},
                        {"key": "s30", "kind": "tool", "tool": "test.echo", "args": {"value": 30}, "after": []},
                        {"key": "s31", "kind": "tool", "tool": "test.echo", "args": {"value": 31}, "after": []},
                        {"key": "s32", "kind": "tool", "tool": "test.echo", "args": {"value": 32}, "after": []},
                        {
                            "key": "j",
                            "kind": "join",
                            "mode": "all",
                            "after": [
                                "s0",
                                "s1",
                                "s2",
                                "s3",
                                "s4",
                                "s5",
                                "s6",
                                "s7",
                                "s8",
                                "s9",
                                "s10",
                                "s11",
                                "s12",
                                "s13",
                                "s14",
                                "s15",
                                "s16",
                                "s17",
                                "s18",
                                "s19",
                                "s20",
                                "s21",
                                "s22",
                                "s23",
                                "s24",
                                "s25",
                                "s26",
                                "s27",
                                "s28",
                                "s29",
                                "s30",
                                "s31",
                                "s32",
                            ],
                        },
                    ],
                    "deliverable": "j",
                },
                "expect_http": 400,
                "expect_error_key": "too_wide_a_fan",
            },
            {
                "create": {
                    "tasks": [
                        {"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": {"$big": 1048586}}, "after": []}
                    ],
                    "deliverable": "a",
                },
                "expect_http": [400, 413],
            },
            {
                "create": {
                    "tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": ["nope"]}],
                    "deliverable": "a",
                },
                "expect_http": 400,
            },
            {"count_runs": "same as before"},
        ],
    },
    "viewer-has-no-write-standing": {
        "spec": ["S32"],
        "steps": [
            {"as": "viewer"},
            {"count_runs": "before"},
            {
                "create": {
                    "tasks": [{"key": "a", "kind": "tool", "tool": "test.echo", "args": {"value": 1}, "after": []}],
                    "deliverable": "a",
                },
                "expect_http": 403,
            },
            {"count_runs": "same as before"},
        ],
    },
    "viewer-sees-kind-not-words": {
        "spec": ["F10", "F11", "F12"],
        "steps": [
            {
                "register_agent": "name: secretive\n"
                "model: script\n"
                "tools: [oz.fail]\n"
                "failures:\n"
                "  - kind: not_found\n"
                "    description: The issue does not exist\n"
            },
            {
                "create": {
                    "agent": "secretive",
                    "tasks": [
                        {
                            "key": "r1",
                            "kind": "round",
                            "model": "script",
                            "prompt": "go",
                            "script": [{"oz_fail": {"kind": "not_found", "message": "customer ACME-7 has no issue"}}],
                            "after": [],
                        }
                    ],
                    "deliverable": "r1",
                }
            },
            {"wait": {"run.status": "canceled"}},
            {"as": "viewer"},
            {"expect": {"run.failure.kind": "not_found", "run.failure.message": None, "run.error": {"contains": "not_found"}}},
            {"expect_nowhere": "ACME-7"},
        ],
    },
}

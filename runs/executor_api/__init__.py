"""The executor API (API.md "Executors"): executors on people's machines register, claim runner
calls, heartbeat their leases and report results over HTTP. `service` holds the rules, `router`
the endpoints; the leases themselves are the kernel's (`runs.kernel` leases). The client side
is `./oz0 runner` (`runs/management/commands/runner.py`)."""

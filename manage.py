#!/usr/bin/env python
"""Django's command line for oz0; a bad or unreachable service URL is one line and exit 2."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oz0site.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db import OperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as error:
        print(f"oz0: {error}", file=sys.stderr)
        sys.exit(2)
    except (OperationalError, RedisConnectionError) as error:
        from oz0site.config import describe_connection_error

        line = describe_connection_error(error)
        if line is None:
            raise
        print(f"oz0: {line}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

"""Start the test provider: `python -m tests.oidc_provider.serve PORT DATABASE SETUP_JSON`.

SETUP_JSON names its client (id, secret, redirect URI) and its people (username, password,
email, groups). It migrates its own SQLite database, makes a signing key, and serves until killed."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    port, database, setup_path = sys.argv[1], sys.argv[2], sys.argv[3]
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"
    os.environ["OZ0_TEST_PROVIDER_URL"] = f"http://127.0.0.1:{port}"
    os.environ["OZ0_TEST_PROVIDER_DB"] = database
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oidc_provider.models import Client, ResponseType

    call_command("migrate", verbosity=0)
    call_command("creatersakey")
    with open(setup_path) as setup_file:
        setup = json.load(setup_file)
    client = Client.objects.create(
        name="oz0",
        client_id=setup["client_id"],
        client_secret=setup["client_secret"],
        client_type="confidential",
        jwt_alg="RS256",
        require_consent=False,
        reuse_consent=True,
        _redirect_uris=setup["redirect_uri"],
    )
    client.response_types.add(ResponseType.objects.get(value="code"))
    for person in setup["people"]:
        user = User.objects.create_user(person["username"], email=person["email"], password=person["password"])
        for name in person["groups"]:
            user.groups.add(Group.objects.get_or_create(name=name)[0])
    from django.core.servers.basehttp import WSGIServer, run
    from django.core.wsgi import get_wsgi_application

    print("provider ready", flush=True)
    run("127.0.0.1", int(port), get_wsgi_application(), threading=True, server_cls=WSGIServer)


if __name__ == "__main__":
    main()

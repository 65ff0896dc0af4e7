"""A real OpenID Connect provider for the single sign-on tests (django-oidc-provider), run as a
process of its own on loopback by `serve.py`: never a mock of the protocol."""

"""What the test provider says about its people: email and name, and their groups as a claim."""

from typing import Any

from oidc_provider.lib.claims import ScopeClaims


def userinfo(claims: dict[str, Any], user: Any) -> dict[str, Any]:
    claims["email"] = user.email
    claims["preferred_username"] = user.username
    return claims


class GroupsClaims(ScopeClaims):
    info_groups = ("Groups", "The groups you are in.")

    def scope_groups(self) -> dict[str, Any]:
        return {"groups": sorted(self.user.groups.values_list("name", flat=True))}

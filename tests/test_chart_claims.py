"""The chart's opt-in grant for the DRA memory budget (issue 29): rendered only with
``rbac.resourceClaims`` on, bound in the listed namespaces only, and allowing exactly the
listing the sidecar's real client sends."""

from __future__ import annotations

from typing import Any

from test_chart import bindings_for, env_map, find, granted, one, render

from oomsight_sidecar.claims import ClaimReader

from kubetools import kube_stub, rbac_allows, rbac_request

CLAIMS = ("resource.k8s.io", "resourceclaims")


def claim_grants(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [d for d in docs if d["metadata"]["name"].endswith("-sidecar-resourceclaims")]


def sidecar_claims_request(namespace: str) -> tuple[str, str, str, str, str]:
    """The request the sidecar's real client sends to list its namespace's claims, as RBAC sees it
    (the stub answers 404; a listing's RBAC verb is list, not get)."""
    with kube_stub() as (client, stub):
        ClaimReader(lambda: client, namespace, "u-1").refresh()
    ((method, path),) = [(r["method"], r["path"]) for r in stub.requests]
    verb, group, resource, ns, name = rbac_request(method, path)
    assert verb == "get" and name == ""  # a GET on the collection
    return "list", group, resource, ns, name


def test_without_the_option_no_claim_grant_is_rendered() -> None:
    for scenario in ("default-values.yaml", "operator-values.yaml"):
        docs = render(scenario)
        assert claim_grants(docs) == []
        assert not {(g, r) for g, r, _ in granted(bindings_for(docs, "team-a", "default"))} & {CLAIMS}


def test_with_the_option_the_listed_namespaces_may_list_their_own_claims_and_nothing_more() -> None:
    docs = render("dra-values.yaml")
    (role,) = find(claim_grants(docs), "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "list"]}
    ]
    assert sorted(b["metadata"]["namespace"] for b in find(claim_grants(docs), "RoleBinding")) == ["team-a", "team-b"]
    request = sidecar_claims_request("team-a")
    assert request == ("list", "resource.k8s.io", "resourceclaims", "team-a", "")
    assert rbac_allows(bindings_for(docs, "team-a", "default"), request)
    assert not rbac_allows(bindings_for(docs, "research", "default"), (*request[:3], "research", ""))
    assert not any(b["kind"] == "ClusterRoleBinding" for b in claim_grants(docs))  # never cluster-wide


def test_the_option_without_namespaces_grants_nothing() -> None:
    docs = render("default-values.yaml", sets=("rbac.resourceClaims=true",))
    assert claim_grants(docs) == []


def test_the_option_reaches_the_webhook_that_tells_the_sidecars() -> None:
    for scenario, expected in (("default-values.yaml", "false"), ("dra-values.yaml", "true")):
        deployment = one(render(scenario), "Deployment")
        assert (
            env_map(deployment["spec"]["template"]["spec"]["containers"][0])["OOMSIGHT_INJECT_RESOURCE_CLAIMS"]
            == expected
        )

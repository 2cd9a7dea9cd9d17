"""Kubernetes RBAC rule evaluation for tests: would these rules allow the requests a client made?

The stand-in does not enforce RBAC; tests record the requests a real client (e.g.
``KubernetesPodOperator``) sent to it and check them against a Role's rules here, the
way the API server's RBAC authorizer matches them: verb from method (and ``watch``),
``apiGroups``, ``resources`` (``pods/log`` for subresources) and ``resourceNames``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

_PATH = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<group>[^/]+)/(?P<gv>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+)(?=/))?"
    r"/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?/?$"
)


@dataclass(frozen=True)
class Access:
    verb: str
    group: str
    resource: str  # "pods" or "pods/log"
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.verb} {self.group or 'core'}/{self.resource} {self.namespace}/{self.name}"


def access_of(method: str, path: str) -> Access | None:
    """The RBAC attributes of one API request (None for non-resource paths such as /version)."""
    url = urlsplit(path)
    m = _PATH.match(url.path)
    if not m:
        return None
    query = parse_qs(url.query)
    name, sub = m["name"] or "", m["sub"]
    watch = query.get("watch", [""])[-1].lower() in ("1", "t", "true")
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method)
    if verb is None and method == "GET":
        verb = "watch" if watch else ("get" if name else "list")
    if verb is None and method == "DELETE":
        verb = "delete" if name else "deletecollection"
    resource = f"{m['plural']}/{sub}" if sub else m["plural"]
    if sub == "exec" and method == "GET":  # WebSocket upgrade: "get" and "create" both seen
        verb = "get"
    return Access(verb, m["group"] or "", resource, m["ns"] or "", name)


def allows(rules: list[dict], access: Access) -> bool:
    for rule in rules:
        if not ({"*", access.group} & set(rule.get("apiGroups", []))):
            continue
        if not ({"*", access.resource} & set(rule.get("resources", []))):
            continue
        if not ({"*", access.verb} & set(rule.get("verbs", []))):
            continue
        names = rule.get("resourceNames")
        if names and access.name not in names:
            continue
        return True
    return False


def denied(rules: list[dict], requests: list[tuple[str, str]]) -> list[str]:
    """Every request (method, path) the rules would refuse, as text."""
    out = []
    for method, path in requests:
        access = access_of(method, path)
        if access is not None and not allows(rules, access):
            out.append(str(access))
    return sorted(set(out))

"""Kubernetes label selectors: parsed exactly as the API server parses them.

Used to reject a malformed selector at the edge (in input validation, before any
write) and to evaluate selectors where the API cannot do it for us.
Grammar (k8s.io/apimachinery/pkg/labels): comma-separated requirements, each one of
`key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`,
`key notin (v1,v2)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A qualified name with an optional DNS-subdomain prefix, as label keys are.
_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
_KEY_RE = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^({_NAME})?$")
_SET_RE = re.compile(r"^\s*(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")
_EQ_RE = re.compile(r"^\s*(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(?P<neg>!?)\s*(?P<key>[^\s!=(),]+)\s*$")


class SelectorError(ValueError):
    """A label selector the API server would reject."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" match objects without the key, as in Kubernetes.
        return not present or value not in self.values


def _split_top_level(selector: str) -> list[str]:
    current: list[str] = []
    parts, depth = [], 0
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' in {selector!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise SelectorError(f"unbalanced '(' in {selector!r}")
    parts.append("".join(current))
    return parts


def _check_key(key: str) -> str:
    if len(key) > 317 or not _KEY_RE.match(key):
        raise SelectorError(f"invalid label key {key!r}")
    return key


def _check_value(value: str) -> str:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise SelectorError(f"invalid label value {value!r}")
    return value


def parse_label_selector(selector: str) -> list[Requirement]:
    """Parse a selector; the empty string selects everything."""
    if not selector.strip():
        return []
    requirements = []
    for part in _split_top_level(selector):
        if m := _SET_RE.match(part):
            values = tuple(_check_value(v.strip()) for v in m["values"].split(","))
            requirements.append(Requirement(_check_key(m["key"]), m["op"], values))
        elif m := _EQ_RE.match(part):
            op = "=" if m["op"] in ("=", "==") else "!="
            requirements.append(Requirement(_check_key(m["key"]), op, (_check_value(m["value"]),)))
        elif m := _EXISTS_RE.match(part):
            requirements.append(Requirement(_check_key(m["key"]), "!" if m["neg"] else "exists"))
        else:
            raise SelectorError(f"cannot parse requirement {part.strip()!r} in selector {selector!r}")
    return requirements


def selector_matches(requirements: list[Requirement], labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in requirements)


_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def requirements_of(selector: dict | None) -> list[Requirement]:
    """A `metav1.LabelSelector` object ({matchLabels, matchExpressions}) as requirements."""
    selector = selector or {}
    requirements = [Requirement(k, "=", (v,)) for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        op = _OPERATORS.get(expr.get("operator"))
        if op is None:
            raise SelectorError(f"{expr.get('operator')!r} is not a valid label selector operator")
        requirements.append(Requirement(expr.get("key", ""), op, tuple(expr.get("values") or ())))
    return requirements

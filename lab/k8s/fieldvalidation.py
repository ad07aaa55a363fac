"""Unknown fields in a request body, handled as the `fieldValidation` query parameter asks.

`Strict` (what kubectl sends) refuses the request with 400 naming every unknown field; `Warn` (the server's default)
and `Ignore` accept it; either way the unknown fields are dropped before the object is stored, as the real server
drops what its types (or a CRD's structural schema) do not declare. The schemas are lab/k8s/schemas.py's.
"""

from __future__ import annotations

from typing import Any

from . import schemas
from .util import ApiError

DIRECTIVES = ("Ignore", "Warn", "Strict")


def directive(query) -> str:
    d = query.get("fieldValidation") or "Warn"
    if d not in DIRECTIVES:
        raise ApiError(
            400,
            f'fieldValidation: Unsupported value: "{d}": supported values: "Ignore", "Strict", "Warn"',
            "BadRequest",
        )
    return d


def prune(value: Any, node: dict | None, path: str = "") -> list[str]:
    """Drop the fields of `value` that `node` does not declare; return their paths (spec.foo, spec.c[0].x)."""
    dropped: list[str] = []
    node_r = schemas.resolve(node)
    if isinstance(value, dict):
        if schemas.preserves_unknown(node_r) and not (node_r or {}).get("properties"):
            return dropped
        for k in list(value):
            if k.startswith("$"):  # strategic-merge directives ($patch, $setElementOrder/..., $retainKeys)
                continue
            sub, declared = schemas.child(node, k)
            where = f"{path}.{k}" if path else k
            if not declared:
                if schemas.preserves_unknown(node_r):
                    continue
                del value[k]
                dropped.append(where)
                continue
            dropped += prune(value[k], sub, where)
    elif isinstance(value, list):
        it = schemas.items(node)
        if it is not None:
            for i, v in enumerate(value):
                dropped += prune(v, it, f"{path}[{i}]")
    return dropped


def check(body: Any, root: dict | None, query, kind: str, version: str, warnings: list[str]) -> None:
    """Apply the request's fieldValidation to `body` (a dict, changed in place)."""
    d = directive(query)
    if root is None or not isinstance(body, dict):
        return
    unknown = prune(body, root)
    if not unknown:
        return
    if d == "Strict":
        fields = ", ".join(f'unknown field "{u}"' for u in unknown)
        raise ApiError(
            400,
            f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {fields}',
            "BadRequest",
        )
    if d == "Warn":
        warnings.extend(f'unknown field "{u}"' for u in unknown)

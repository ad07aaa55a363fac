"""The Kubernetes label selector of the rollout spec (`nodeSelectors`, compartments, `podNonInterruptLabels`).

Keys and values go through the shared parser (activities/support/selectors.py), so they are checked exactly as
the API server checks them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_validator

from activities.support.selectors import Requirement, SelectorError, parse_label_selector, selector_matches
from workflows.rollout.spec.spec_fields import SpecModel


class LabelSelectorRequirement(SpecModel):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def _requirement(key: str, op: str, values: tuple[str, ...]) -> Requirement:
    """Build one requirement through the shared parser, so keys and values are checked
    exactly as the API server checks them; a key or value that would change the
    parse (a comma, a parenthesis) is rejected rather than misread."""
    if op == "=":
        text = f"{key}={values[0]}"
    elif op in ("in", "notin"):
        text = f"{key} {op} ({','.join(values)})"
    elif op == "exists":
        text = key
    else:
        text = f"!{key}"
    try:
        parsed = parse_label_selector(text)
    except SelectorError as err:
        raise ValueError(str(err)) from err
    expected = Requirement(key, op, values)
    if parsed != [expected]:
        raise ValueError(f"invalid label key or value in requirement {text!r}")
    return expected


class LabelSelector(SpecModel):
    """A Kubernetes `metav1.LabelSelector`: `matchLabels` and/or `matchExpressions`, ANDed.

    Empty means "everything" to Kubernetes; Millwright refuses it wherever that would be
    a surprise (see `RolloutInput.node_selectors` and `pod_non_interrupt_labels`).
    """

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    @model_validator(mode="after")
    def _parseable(self) -> LabelSelector:
        self.requirements()
        return self

    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def requirements(self) -> list[Requirement]:
        reqs = [_requirement(k, "=", (v,)) for k, v in sorted(self.match_labels.items())]
        for i, expr in enumerate(self.match_expressions):
            try:
                reqs.append(_requirement(expr.key, _OPS[expr.operator], tuple(expr.values)))
            except ValueError as err:
                raise ValueError(f"matchExpressions.{i}: {err}") from None
        return reqs

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return selector_matches(self.requirements(), dict(labels or {}))

    def to_selector_string(self) -> str:
        """The string form (`a=b,c in (d,e),!f`) the list APIs take as `labelSelector`."""
        parts = []
        for r in self.requirements():
            if r.op == "=":
                parts.append(f"{r.key}={r.values[0]}")
            elif r.op in ("in", "notin"):
                parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
            elif r.op == "exists":
                parts.append(r.key)
            else:
                parts.append(f"!{r.key}")
        return ",".join(parts)

    def canonical(self) -> tuple[Requirement, ...]:
        """Order-independent identity, used to reject identical compartment selectors."""
        canon = set()
        for r in self.requirements():
            values = tuple(sorted(set(r.values)))
            op = {"in": "=", "notin": "!="}.get(r.op, r.op) if len(values) == 1 else r.op
            canon.add(Requirement(r.key, op, values))
        return tuple(sorted(canon, key=lambda r: (r.key, r.op, r.values)))

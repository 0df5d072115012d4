"""Node anti-affinity that keeps new pods off unhealthy or excluded nodes.

Two pure transformations of a pod spec (the ``spec`` of a pod template, as a JSON-style dict):

- :func:`inject_anti_affinity`: pods that use a resource Autopilot watches must avoid nodes whose
  health label carries a NoSchedule/NoExecute value (required) and should avoid PreferNoSchedule
  values (preferred). The rule is static (label values, not node names), so it keeps working as
  node health changes after the pod is created.
- :func:`exclude_nodes`: pods must avoid the named nodes (node exclusion on retry).

Why the expression goes into *every* ``nodeSelectorTerm``: the terms are ORed, so a user term
without it would let the pod onto a bad node. Why a term with neither ``matchExpressions`` nor
``matchFields`` is left alone: Kubernetes defines an empty term as matching no node, and adding
our expression to it would turn it into "any healthy node", widening what the user asked for.

Both functions return a deep copy, never touch the input, never remove or edit a user
expression (they only add), and are idempotent: an expression or preferred term that already
says what would be added is not added again, so re-creating a workload from an already injected
template does not grow it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from shared.taints import PREFER_NO_SCHEDULE, REQUIRED_EFFECTS, ResourceTaints, values_by_key

REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED: Final = "preferredDuringSchedulingIgnoredDuringExecution"

# The only field a node selector may match on; the API server allows exactly one value per
# In/NotIn field requirement, so excluding several nodes takes one requirement per node.
NODE_NAME_FIELD: Final = "metadata.name"

MIN_WEIGHT: Final = 1
MAX_WEIGHT: Final = 100

# Numeric part of a Kubernetes quantity ("8", "0.5", "1e3", "500m", "2Gi"). The suffix only scales
# the number, so the number alone tells zero from non-zero.
_QUANTITY_NUMBER = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+))")

Expression = dict[str, Any]


def quantity_is_nonzero(quantity: object) -> bool:
    """Whether a resource quantity asks for more than nothing.

    Anything that cannot be read as a number counts as non-zero: the API server rejects malformed
    quantities anyway, and protecting a pod by mistake is harmless where the opposite is not.
    """
    if isinstance(quantity, bool):
        return quantity
    if isinstance(quantity, int | float):
        return quantity != 0
    match = _QUANTITY_NUMBER.match(str(quantity))
    if match is None:
        return True
    try:
        return Decimal(match.group(1)) != 0
    except InvalidOperation:
        return True


def _containers(pod_spec: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    for field in ("initContainers", "containers"):
        for container in pod_spec.get(field) or ():
            if isinstance(container, Mapping):
                yield container


def uses_resource(pod_spec: Mapping[str, Any], resource: str) -> bool:
    """True when any container or init container requests or limits a non-zero amount of ``resource``."""
    for container in _containers(pod_spec):
        resources = container.get("resources") or {}
        if not isinstance(resources, Mapping):
            continue
        for kind in ("requests", "limits"):
            amounts = resources.get(kind) or {}
            if not isinstance(amounts, Mapping) or resource not in amounts:
                continue
            if quantity_is_nonzero(amounts[resource]):
                return True
    return False


def used_resources(pod_spec: Mapping[str, Any], resource_taints: ResourceTaints) -> list[str]:
    """The configured resources the pod spec uses, in configuration order."""
    return [resource for resource in resource_taints if uses_resource(pod_spec, resource)]


def anti_affinity_for(
    pod_spec: Mapping[str, Any], resource_taints: ResourceTaints
) -> tuple[list[Expression], list[Expression]]:
    """The required and the preferred ``NotIn`` expressions the pod spec needs, one per label key.

    Values from all the resources the pod uses are grouped per key. A value that is already
    required is not also preferred.
    """
    required: dict[str, list[str]] = {}
    preferred: dict[str, list[str]] = {}
    for resource in used_resources(pod_spec, resource_taints):
        taints = resource_taints[resource]
        _extend(required, values_by_key(taints, REQUIRED_EFFECTS))
        _extend(preferred, values_by_key(taints, frozenset({PREFER_NO_SCHEDULE})))
    for key, values in preferred.items():
        values[:] = [v for v in values if v not in required.get(key, ())]
    return (
        [_not_in(key, values) for key, values in required.items() if values],
        [_not_in(key, values) for key, values in preferred.items() if values],
    )


def inject_anti_affinity(
    pod_spec: Mapping[str, Any], resource_taints: ResourceTaints, preferred_weight: int
) -> dict[str, Any]:
    """A copy of ``pod_spec`` that avoids nodes Autopilot flags for the resources it uses.

    Pod specs that use none of the configured resources come back equal to the input.
    ``preferred_weight`` (1..100, as Kubernetes requires) is the weight of each preferred term.
    """
    if not MIN_WEIGHT <= preferred_weight <= MAX_WEIGHT:
        raise ValueError(f"preferred weight {preferred_weight} is outside {MIN_WEIGHT}..{MAX_WEIGHT}")
    spec = _plain(pod_spec)
    required, preferred = anti_affinity_for(spec, resource_taints)
    if required:
        _add_required(spec, "matchExpressions", required)
    for expression in preferred:
        _add_preferred(spec, expression, preferred_weight)
    return spec


def exclude_nodes(pod_spec: Mapping[str, Any], node_names: Sequence[str]) -> dict[str, Any]:
    """A copy of ``pod_spec`` that may not be scheduled on any of ``node_names``.

    The requirement is on the node's name (``matchFields`` ``metadata.name``) rather than on the
    ``kubernetes.io/hostname`` label: the name is what we know about a failed pod's node, and the
    label is neither guaranteed to exist nor to equal the name.
    """
    if isinstance(node_names, str):
        raise TypeError("node_names must be a sequence of names, not one string")
    spec = _plain(pod_spec)
    names = list(dict.fromkeys(n for n in node_names if n))
    if names:
        _add_required(spec, "matchFields", [_not_in(NODE_NAME_FIELD, [n]) for n in names])
    return spec


# ----------------------------------------------------------------------------- merging


def _plain(value: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy made of plain dicts and lists, so the merge below can edit it in place."""

    def convert(obj: Any) -> Any:
        if isinstance(obj, Mapping):
            return {k: convert(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [convert(v) for v in obj]
        return copy.deepcopy(obj)

    return {k: convert(v) for k, v in value.items()}


def _extend(into: dict[str, list[str]], more: Mapping[str, list[str]]) -> None:
    for key, values in more.items():
        target = into.setdefault(key, [])
        target.extend(v for v in values if v not in target)


def _not_in(key: str, values: Sequence[str]) -> Expression:
    return {"key": key, "operator": "NotIn", "values": list(values)}


def _covers(existing: Iterable[Any], wanted: Expression) -> bool:
    """Whether some existing requirement already excludes at least what ``wanted`` excludes."""
    for req in existing:
        if (
            isinstance(req, Mapping)
            and req.get("key") == wanted["key"]
            and req.get("operator") == "NotIn"
            and set(wanted["values"]) <= set(req.get("values") or ())
        ):
            return True
    return False


def _is_empty_term(term: Any) -> bool:
    return not isinstance(term, Mapping) or not (term.get("matchExpressions") or term.get("matchFields"))


def _child(parent: dict[str, Any], key: str) -> dict[str, Any]:
    """``parent[key]`` as a dict, created when missing or null."""
    value = parent.get(key)
    if not isinstance(value, dict):
        value = {}
        parent[key] = value
    return value


def _add_required(spec: dict[str, Any], field: str, expressions: list[Expression]) -> None:
    required = _child(_child(_child(spec, "affinity"), "nodeAffinity"), REQUIRED)
    terms = required.get("nodeSelectorTerms")
    if not isinstance(terms, list) or not terms:
        required["nodeSelectorTerms"] = [{field: [copy.deepcopy(e) for e in expressions]}]
        return
    for term in terms:
        if _is_empty_term(term):
            continue
        existing = term.get(field)
        if not isinstance(existing, list):
            existing = []
            term[field] = existing
        for expression in expressions:
            if not _covers(existing, expression):
                existing.append(copy.deepcopy(expression))


def _is_our_preferred(term: Any, expression: Expression, weight: int) -> bool:
    # Only a term that says exactly "avoid these values" with our weight counts: a user term with
    # extra expressions scores a narrower set of nodes and does not replace ours.
    if not isinstance(term, Mapping) or term.get("weight") != weight:
        return False
    preference = term.get("preference")
    if not isinstance(preference, Mapping) or preference.get("matchFields"):
        return False
    expressions = preference.get("matchExpressions") or []
    return isinstance(expressions, list) and len(expressions) == 1 and _covers(expressions, expression)


def _add_preferred(spec: dict[str, Any], expression: Expression, weight: int) -> None:
    node_affinity = _child(_child(spec, "affinity"), "nodeAffinity")
    terms = node_affinity.get(PREFERRED)
    if not isinstance(terms, list):
        terms = []
        node_affinity[PREFERRED] = terms
    if any(_is_our_preferred(term, expression, weight) for term in terms):
        return
    terms.append({"weight": weight, "preference": {"matchExpressions": [copy.deepcopy(expression)]}})

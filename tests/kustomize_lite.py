"""A pure-Python renderer of the kustomize subset deploy/kubernetes uses.

CI has no kustomize binary; this renders the overlays well enough to validate
what they produce. It knows only: ``resources`` (files and directories),
``components``, ``namespace``, ``labels`` (metadata labels only: no
``includeSelectors``/``includeTemplates``), ``images`` (``newName``/``newTag``),
``replicas`` and ``patches`` given by ``path`` (a strategic merge patch
addressed by its kind and name: maps merged, lists of maps merged by ``name``,
other lists replaced). Anything else is refused, so a manifest that grows past
the subset fails loudly here instead of rendering wrong. Where a real
``kustomize`` (or ``kubectl kustomize``) exists, tests/unit/test_kubernetes.py
checks this renderer against it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]

KNOWN_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "namespace",
    "labels",
    "images",
    "replicas",
    "patches",
}
# Kinds without a namespace among those we render (the namespace transformer skips them).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


class UnsupportedKustomization(ValueError):
    """The kustomization uses something this renderer does not know."""


def render(directory: Path) -> list[Resource]:
    """The resources ``directory``'s kustomization.yaml renders to."""
    return _build(Path(directory), [])


def _load_kustomization(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(data) - KNOWN_KEYS
    if unknown:
        raise UnsupportedKustomization(f"{directory}: keys {sorted(unknown)} not supported")
    return data


def _build(directory: Path, accumulated: list[Resource]) -> list[Resource]:
    spec = _load_kustomization(directory)
    resources = list(accumulated) if spec.get("kind") == "Component" else []
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            resources.extend(_build(path, []))
        else:
            resources.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for entry in spec.get("components", []):
        resources = _build(directory / entry, resources)
    _transform(directory, spec, resources)
    return resources


def _transform(directory: Path, spec: dict[str, Any], resources: list[Resource]) -> None:
    """The kustomization's own transformers (for this subset, order does not matter)."""
    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise UnsupportedKustomization(f"{directory}: only patches given by path")
        _apply_patch(resources, yaml.safe_load((directory / patch["path"]).read_text()))
    for replicas in spec.get("replicas", []):
        target = _find(resources, None, replicas["name"], kinds={"Deployment", "StatefulSet"})
        target["spec"]["replicas"] = replicas["count"]
    for image in spec.get("images", []):
        _set_image(resources, image)
    for label in spec.get("labels", []):
        if set(label) != {"pairs"}:
            raise UnsupportedKustomization(f"{directory}: labels take pairs only")
        for resource in resources:
            resource.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    if "namespace" in spec:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource.setdefault("metadata", {})["namespace"] = spec["namespace"]


def _find(
    resources: list[Resource], kind: str | None, name: str, kinds: set[str] | None = None
) -> Resource:
    found = [
        r
        for r in resources
        if r["metadata"]["name"] == name
        and (kind is None or r["kind"] == kind)
        and (kinds is None or r["kind"] in kinds)
    ]
    if len(found) != 1:
        raise UnsupportedKustomization(f"patch target {kind}/{name}: {len(found)} matches")
    return found[0]


def _apply_patch(resources: list[Resource], patch: Resource) -> None:
    target = _find(resources, patch["kind"], patch["metadata"]["name"])
    merged = merge(target, patch)
    target.clear()
    target.update(merged)


def merge(base: Any, patch: Any) -> Any:
    """A strategic merge of ``patch`` into ``base`` (the subset described above)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = merge(out[key], value) if key in out else copy.deepcopy(value)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in [*base, *patch])
    ):
        out_list = copy.deepcopy(base)
        by_name = {item["name"]: n for n, item in enumerate(out_list)}
        for item in patch:
            if item["name"] in by_name:
                n = by_name[item["name"]]
                out_list[n] = merge(out_list[n], item)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def _set_image(resources: list[Resource], image: dict[str, str]) -> None:
    for resource in resources:
        pod = resource.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*pod.get("containers", []), *pod.get("initContainers", [])]:
            name, tag = _split_image(container["image"])
            if name != image["name"]:
                continue
            container["image"] = image.get("newName", name) + (
                f":{image['newTag']}" if "newTag" in image else (f":{tag}" if tag else "")
            )


def _split_image(reference: str) -> tuple[str, str | None]:
    head, _, last = reference.rpartition("/")
    if ":" in last:
        last, _, tag = last.partition(":")
        return (f"{head}/{last}" if head else last), tag
    return reference, None

"""Which single runs are replicates of one configuration. A folder of single runs
(``evidence/local``, no sweep.json) holds whatever was run there; two runs pool into one cell
only when their resolved spec is identical apart from the seed. Otherwise each configuration
is its own cell, named by the fields that differ (``proposer.model=...``).

The configuration is the manifest's ``identity`` (what the run id hashes: the fields that
change results, never transport settings such as evidence_root, force or concurrency) without
the seed; evidence written before manifests carried it falls back to the same fields of the
spec."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

CONFIG_AXIS = "config"
# the fields a run id hashes (harness.specs RunSpec.identity), minus the seed
IDENTITY_KEYS = ("algorithm", "budget", "container", "heldout_candidates", "policy", "pools", "proposer")
# model fields outside the identity, for manifests without one
MODEL_TRANSPORT = ("timeout_s", "api_key_env")
MAX_NAMED = 3
ALGORITHM_PARAMS = "algorithm.params."


def _identity(manifest: Mapping[str, Any]) -> dict[str, Any]:
    identity = manifest.get("identity")
    if isinstance(identity, dict):
        return {k: v for k, v in identity.items() if k != "seed"}
    spec = manifest.get("spec") or {}
    out: dict[str, Any] = {}
    for key in IDENTITY_KEYS:
        if key not in spec:
            continue
        value = spec[key]
        if key == "container" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k in ("name", "options")}
        elif key in ("policy", "proposer") and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in MODEL_TRANSPORT}
        out[key] = value
    return out


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """Dotted keys -> canonical JSON of the leaf (lists are leaves)."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: json.dumps(value, sort_keys=True, separators=(",", ":"))}


def run_config(manifest: Mapping[str, Any]) -> dict[str, str]:
    return flatten(_identity(manifest))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def _short(raw: str) -> str:
    """A readable value: strings unquoted, long lists and texts as a size and a digest."""
    value = json.loads(raw)
    if isinstance(value, list) and len(value) > 3:
        return f"[{len(value)} items #{_digest(raw)}]"
    text = value if isinstance(value, str) else raw
    return text if len(text) <= 40 else f"{text[:24]}...#{_digest(raw)}"


def _differing(configs: list[dict[str, str]]) -> list[str]:
    keys = sorted({k for c in configs for k in c})
    differ = [k for k in keys if len({c.get(k) for c in configs}) > 1]
    # a model's source usually moves with its name: name the model only
    return [k for k in differ if not (k.endswith(".source") and k.removesuffix(".source") + ".model" in differ)]


def _name(key: str) -> str:
    """A key as a label names it: an algorithm parameter by its own name, since the label
    starts with the algorithm's (``gepa (minibatch_size=8)``)."""
    return key.removeprefix(ALGORITHM_PARAMS)


def _describe(config: dict[str, str], keys: list[str]) -> str:
    named = [f"{_name(k)}={_short(config[k]) if k in config else 'unset'}" for k in keys[:MAX_NAMED]]
    if len(keys) > MAX_NAMED:
        named.append(f"+{len(keys) - MAX_NAMED} more")
    return ", ".join(named)


def config_labels(configs: Mapping[str, dict[str, str]]) -> dict[str, str] | None:
    """Run id -> the name of its configuration among the runs of the same container and
    algorithm (``-`` where all of them share one), or None when no two configurations differ."""
    groups: dict[tuple[str | None, str | None], list[str]] = defaultdict(list)
    for run_id, config in sorted(configs.items()):
        groups[(config.get("container.name"), config.get("algorithm.name"))].append(run_id)
    labels: dict[str, str] = {}
    for members in groups.values():
        canonical = {r: json.dumps(configs[r], sort_keys=True) for r in members}
        if len(set(canonical.values())) == 1:
            labels.update({r: "-" for r in members})
            continue
        distinct = sorted(set(canonical.values()))
        keys = _differing([json.loads(c) for c in distinct])
        names = {c: _describe(json.loads(c), keys) for c in distinct}
        if len(set(names.values())) < len(names):  # differences hidden past MAX_NAMED: add a digest
            names = {c: f"{name} #{_digest(c)}" for c, name in names.items()}
        labels.update({r: names[canonical[r]] for r in members})
    return labels if any(v != "-" for v in labels.values()) else None

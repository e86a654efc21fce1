"""Where a sweep's runs go and which services they use.

On one machine (`ray.address: null`) the driver's own service set serves every run
(`LocalPlacement`). On a cluster every node that can take a run gets a service set of
its own (containers, model servers, gateway) from a `NodeServices` actor pinned to it,
listening on that node's loopback, which is what the node's workers reach; each run goes
to the least loaded live node and uses that node's endpoints (`ClusterPlacement`).

Limits across the cluster: the sweep's endpoint limiter (one actor on the driver's node)
keys every slot by node and URL, so `ray.container_concurrency` and
`ray.model_concurrency` hold per node's service. A hosted model's requests and tokens per
minute and its concurrency are enforced by each gateway: the stated rule splits them evenly
over the nodes started with a service set (`split_gateway_limits`), so the cluster as a
whole never asks for more than the configured figure. A node lost mid-sweep does not
hand its share to the others (the rest of the sweep runs below the limit, never above)."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray
from pydantic import BaseModel, ConfigDict

from harness.container_keeper import RestartOutcome
from harness.errors import ConfigError, HarnessError
from harness.gateway.models import GatewaySettings, LimitSettings
from harness.services import Endpoints, LocalServerOptions, NodePlace, Services
from harness.specs import ContainerSpec, ModelSpec, RunSpec
from harness.sweep.store import SweepStore

LOCAL = "local"  # the one node key of a sweep on one machine
# how long a run's node may take to be declared dead after its actor died (Ray's health
# checks take seconds): a worker that crashed on a live node costs the driver this pause
NODE_DEATH_WAIT_S = 30.0


def service_key(spec: RunSpec) -> tuple[str, ...]:
    """What identifies the services a run needs: runs with the same key share them."""
    return tuple(s.model_dump_json() for s in (spec.container, spec.policy, spec.proposer))


def split_gateway_limits(settings: GatewaySettings, nodes: int) -> GatewaySettings:
    """Each of `nodes` gateways gets an even share of every rate and concurrency cap."""
    if nodes <= 1:
        return settings

    def share(limits: LimitSettings) -> LimitSettings:
        return limits.model_copy(update={
            "max_concurrency": max(1, limits.max_concurrency // nodes),
            "requests_per_min": limits.requests_per_min / nodes if limits.requests_per_min else None,
            "tokens_per_min": limits.tokens_per_min / nodes if limits.tokens_per_min else None})

    return settings.model_copy(update={"limits": share(settings.limits),
                                       "model_limits": {k: share(v) for k, v in settings.model_limits.items()}})


class ServiceSetOptions(BaseModel):
    model_config = ConfigDict(frozen=True)
    evidence_root: str
    sweep: str
    local_server: LocalServerOptions
    gateway: GatewaySettings | None


class Started(BaseModel):
    """A node's answer to starting one run's services: its endpoints, or why not."""

    endpoints: Endpoints | None = None
    error: str | None = None


@ray.remote(num_cpus=0)
class NodeServices:
    """One node's service set. Its methods run on the actor's main thread, which started
    the processes: their parent-death signal follows this process, so a node's services
    go with it."""

    def __init__(self, options_json: str):
        options = ServiceSetOptions.model_validate_json(options_json)
        self._place = NodePlace(node_id=ray.get_runtime_context().get_node_id(), host=socket.gethostname())
        self._store = SweepStore(options.evidence_root, options.sweep)
        # evidence on a shared disk: logs straight beside it; in an object store: on this
        # node's disk while processes append, copied beside the evidence when the set stops
        local = isinstance(self._store.fs, pafs.LocalFileSystem)
        self._log_dir = (self._store.log_dir if local else Path.home() / ".cache" / "gepa-harness" / "sweep-logs"
                         / options.sweep) / "nodes" / self._place.label
        self._upload = None if local else f"{self._store.dir}/logs/nodes/{self._place.label}"
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._services = Services(self._log_dir, options.local_server, gateway=options.gateway, label=options.sweep)

    def place(self) -> tuple[str, str]:
        return self._place.model_dump_json(), str(self._log_dir)

    def endpoints(self, container_json: str, policy_json: str, proposer_json: str) -> str:
        try:
            endpoints = self._services.endpoints(ContainerSpec.model_validate_json(container_json),
                                                 ModelSpec.model_validate_json(policy_json),
                                                 ModelSpec.model_validate_json(proposer_json))
            return Started(endpoints=endpoints.model_copy(update={"node": self._place})).model_dump_json()
        except Exception as exc:  # noqa: BLE001 - the runs needing it fail with the cause; the sweep goes on
            error = str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}"
            return Started(error=f"on node {self._place.label}: {error}").model_dump_json()

    def revive(self, url: str) -> str:
        """Restart this node's container at `url` if it died: a RestartOutcome (JSON)."""
        return RestartOutcome.of(self._services.revive, url).model_dump_json()

    def close(self) -> None:
        self._services.close()
        if self._upload is not None:
            fs = self._store.fs
            fs.create_dir(self._upload, recursive=True)
            for path in self._log_dir.glob("*.log"):
                with fs.open_output_stream(f"{self._upload}/{path.name}") as out:
                    out.write(path.read_bytes())


def pinned(node_id: str) -> dict[str, Any]:
    """Actor options that place it on `node_id` and nowhere else."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}


class Slot(BaseModel):
    """Where one attempt of a run goes: the node, its endpoints and log folder."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    node: str
    endpoints: Endpoints
    log_dir: str
    actor_options: dict[str, Any] = {}
    node_services: Any = None  # the node's NodeServices actor, which restarts its containers


class LocalPlacement:
    """One machine: every run on the driver's service set, as many at once as its CPUs
    fit (a worker kept for reuse holds its CPUs, so a run beyond them would never start)."""

    def __init__(self, endpoints: Mapping[str, Endpoints], log_dir: Path, capacity: int):
        self._endpoints, self._log_dir, self.capacity = endpoints, str(log_dir), max(1, capacity)

    def assign(self, spec: RunSpec, busy: Mapping[str, int]) -> Slot | None:
        if busy.get(LOCAL, 0) >= self.capacity:
            return None
        return Slot(node=LOCAL, endpoints=self._endpoints[spec.run_id], log_dir=self._log_dir)

    def placeable(self, spec: RunSpec) -> bool:
        return True

    def lost(self, node: str, error: BaseException) -> bool:
        return False

    def label(self, node: str) -> str:
        return node


class ClusterPlacement:
    """A service set on every live node with room for a run; runs go to the least loaded
    node (ties: the first in Ray's node order) whose services for them started."""

    def __init__(self, options: ServiceSetOptions, cpus_per_run: float):
        nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= cpus_per_run]
        if not nodes:
            raise ConfigError(f"no live Ray node has ray.cpus_per_run={cpus_per_run:g} CPUs free for a run")
        if options.gateway is not None:
            options = options.model_copy(update={"gateway": split_gateway_limits(options.gateway, len(nodes))})
        ids = [n["NodeID"] for n in nodes]
        self.capacity = {n["NodeID"]: int(n["Resources"]["CPU"] // cpus_per_run) for n in nodes}
        self._actors = {i: NodeServices.options(**pinned(i)).remote(options.model_dump_json()) for i in ids}
        placed = ray.get([self._actors[i].place.remote() for i in ids])
        self.places = {i: NodePlace.model_validate_json(p) for i, (p, _) in zip(ids, placed)}
        self._log_dirs = {i: d for i, (_, d) in zip(ids, placed)}
        self._endpoints: dict[tuple[str, tuple[str, ...]], Endpoints] = {}
        self.dead: set[str] = set()

    def start(self, specs: list[RunSpec]) -> dict[str, str]:
        """Start every node's services for `specs`, all nodes at once; returns the error of
        each run no node could start services for."""
        keys = {service_key(s): s for s in specs}
        refs = {(node, key): actor.endpoints.remote(s.container.model_dump_json(), s.policy.model_dump_json(),
                                                    s.proposer.model_dump_json())
                for node, actor in self._actors.items() for key, s in keys.items()}
        errors: dict[tuple[str, ...], str] = {}
        for (node, key), ref in refs.items():
            started = Started.model_validate_json(ray.get(ref))
            if started.endpoints is not None:
                self._endpoints[(node, key)] = started.endpoints
            else:
                errors.setdefault(key, started.error or "")
        return {s.run_id: errors[service_key(s)] for s in specs if not self.placeable(s)}

    def endpoints(self) -> list[Endpoints]:
        return list(self._endpoints.values())

    def placeable(self, spec: RunSpec) -> bool:
        key = service_key(spec)
        return any((node, key) in self._endpoints for node in self.places if node not in self.dead)

    def assign(self, spec: RunSpec, busy: Mapping[str, int]) -> Slot | None:
        key = service_key(spec)
        free = [node for node in self.places if node not in self.dead and (node, key) in self._endpoints
                and busy.get(node, 0) < self.capacity[node]]
        if not free:
            return None
        node = min(free, key=lambda n: busy.get(n, 0))  # min keeps the first of equals: Ray's node order
        return Slot(node=node, endpoints=self._endpoints[(node, key)], log_dir=self._log_dirs[node],
                    actor_options=pinned(node), node_services=self._actors[node])

    def lost(self, node: str, error: BaseException) -> bool:
        """Whether `node` is gone (its run moves) rather than one worker process dying.
        The actor's death is reported before the cluster declares its node dead, and its
        error does not say which, so wait for the cluster's verdict."""
        if node in self.dead:
            return True
        deadline = time.monotonic() + NODE_DEATH_WAIT_S
        while True:
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            if node not in alive:
                self._drop(node)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)

    def _drop(self, node: str) -> None:
        """A dead node's services went with it; forget its actor and endpoints."""
        self.dead.add(node)
        ray.kill(self._actors[node], no_restart=True)

    def label(self, node: str) -> str:
        return self.places[node].label if node in self.places else node

    def close(self) -> None:
        live = [a.close.remote() for node, a in self._actors.items() if node not in self.dead]
        if live:
            ray.wait(live, num_returns=len(live), timeout=120)
        for node in self.places:
            if node not in self.dead:
                ray.kill(self._actors[node], no_restart=True)

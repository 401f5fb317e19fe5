"""Where candidates are measured: lanes, each a measuring worker that times one candidate at a time.

Alone, the tuner has one lane: the local :class:`~arke.tune.worker.Worker`. With
``akc tune --ray ADDRESS`` (the ``distributed`` extra) it has one lane per node of a Ray cluster
whose machine identity and versions match this machine's (:mod:`arke.tune.machine`): an actor
there owns a worker subprocess of its own, so a crash or a hang on a node is that candidate's
recorded failure, as it is here. Candidates run on several lanes at once (one per node: nodes do
not share cores), their records go to the tuning database from here (the shared one, for a
team); the confirmation rounds run on one lane, so the defaults and the finalists are compared
on one machine. A node of another kind never measures: its times would be filed under this
machine's identity.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Mapping
from typing import Any, Protocol


class Lane(Protocol):
    """A measuring worker (:class:`arke.tune.worker.Worker` is one)."""

    def request(self, request: Mapping[str, Any], timeout_s: float) -> dict[str, Any]: ...

    def stop(self) -> None: ...


class Lanes:
    """The lanes of a tuning run; :meth:`request` takes the first free one (thread-safe)."""

    def __init__(self, lanes: list[Lane], names: list[str] | None = None):
        if not lanes:
            raise ValueError("a tuning run needs at least one lane to measure on")
        self.all, self.names = lanes, names or ["local"] * len(lanes)
        self._free: queue.Queue[Lane] = queue.Queue()
        for lane in lanes:
            self._free.put(lane)

    @property
    def width(self) -> int:
        return len(self.all)

    def request(self, request: Mapping[str, Any], timeout_s: float, lane: Lane | None = None) -> dict[str, Any]:
        """Measure on ``lane``, or on the first free lane."""
        if lane is not None:
            return lane.request(request, timeout_s)
        taken = self._free.get()
        try:
            return taken.request(request, timeout_s)
        finally:
            self._free.put(taken)

    def stop(self) -> None:
        for lane in self.all:
            lane.stop()


def local() -> Lanes:
    from arke.tune.worker import Worker

    return Lanes([Worker()])


class _RayLane:
    """A lane on a Ray node: an actor pinned there, owning a measuring worker subprocess."""

    def __init__(self, actor: Any, node: str):
        self.actor, self.node = actor, node

    def request(self, request: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        import ray

        try:  # the actor applies the timeout to its worker; this one covers a node that is lost
            reply: dict[str, Any] = ray.get(self.actor.request.remote(dict(request), timeout_s),
                                            timeout=timeout_s + 120)
            return reply
        except Exception as err:
            return {"status": "failed", "error": f"node {self.node}: {type(err).__name__}: {str(err)[:300]}"}

    def stop(self) -> None:
        import ray

        try:
            ray.get(self.actor.stop.remote(), timeout=30)
            ray.kill(self.actor)
        except Exception:  # a node already gone: nothing left to stop
            pass


def _identity(target: str) -> tuple[str, str]:
    from arke.tune import machine

    return machine.digest(machine.identity(target)), machine.digest(machine.versions(target))


def _reachable(address: str) -> None:
    """A ValueError, at once, where nothing listens at a ``host:port`` address (Ray itself retries for minutes)."""
    import socket

    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # `auto`, a ray:// client address: Ray's own words
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as err:
        raise ValueError(f"cannot join the Ray cluster at {address}: nothing answers there ({err}); start one with "
                         "`ray start --head` and give the address it prints") from None


def ray_lanes(address: str, target: str, notes: list[str]) -> Lanes:
    """One lane per alive node of the Ray cluster at ``address`` whose machine identity and versions are
    this machine's (the others are named in ``notes``); a ValueError where none is, or Ray is missing."""
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError:
        raise ValueError("akc tune --ray needs Ray: pip install 'arke[distributed]'") from None
    _reachable(address)
    if ray.is_initialized():  # joined to a cluster already: keep it only if it is this one
        try:
            current = ray.get_runtime_context().gcs_address
        except Exception:
            current = None
        if current != address:
            ray.shutdown()
    try:
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as err:
        raise ValueError(f"cannot join the Ray cluster at {address}: {type(err).__name__}: {err} (start one with "
                         "`ray start --head`, and give the address it prints)") from None
    here = _identity(target)

    @ray.remote(num_cpus=0)
    def identity_there(target: str) -> tuple[str, str]:
        return _identity(target)

    @ray.remote(num_cpus=0)
    class Measurer:  # measuring wants the node's cores to itself: it takes no Ray CPU, so run nothing else there
        def __init__(self) -> None:
            from arke.tune.worker import Worker

            self.worker = Worker()

        def request(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
            return self.worker.request(request, timeout_s)

        def stop(self) -> None:
            self.worker.stop()

    lanes: list[Lane] = []
    names = []
    for node in (n for n in ray.nodes() if n.get("Alive")):
        node_id, name = node["NodeID"], node.get("NodeManagerAddress", node["NodeID"][:12])
        pinned = NodeAffinitySchedulingStrategy(node_id, soft=False)
        try:
            there = ray.get(identity_there.options(scheduling_strategy=pinned).remote(target), timeout=120)
        except Exception as err:
            notes.append(f"Ray node {name} did not answer ({type(err).__name__}); it measures nothing")
            continue
        if tuple(there) != here:
            notes.append(f"Ray node {name} is another machine or toolchain than this one; it measures nothing")
            continue
        actor = Measurer.options(scheduling_strategy=pinned).remote()  # type: ignore[attr-defined]
        lanes.append(_RayLane(actor, name))
        names.append(name)
    if not lanes:
        raise ValueError(f"no node of the Ray cluster at {address} matches this machine (CPU, features, cores, "
                         "arke's and the toolchain's versions): records are kept per machine, so only such nodes "
                         "may measure")
    return Lanes(lanes, names)

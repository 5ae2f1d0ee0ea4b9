"""Where the workers of a distributed run meet: the ``torch.distributed`` backend of their device types, from the
accelerator registry (:func:`backend_for`), a free rendezvous port (:func:`free_port`), the environment ``torchrun``
gives a worker (:func:`worker_environment`) [TR], and a pod's place in a multi-node training job, read from what
its operator set (:func:`node_role`, :class:`NodeRole`) [KT] [PJ].
:func:`heteroflow.components.training.distributed.launch` uses them.

Sources: [TR] torchrun environment variables, https://pytorch.org/docs/stable/elastic/run.html ("Environment
Variables"); [KT] Kubeflow Trainer's torch plugin (``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR``, ``PET_MASTER_PORT``), https://www.kubeflow.org/docs/components/trainer/; [PJ] PyTorchJob's
environment (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``),
https://www.kubeflow.org/docs/components/trainer/legacy-v1/user-guides/pytorch/.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping, Sequence

from heteroflow.components.errors import InvalidParameter

__all__ = ["NODES_ENV", "NodeRole", "backend_for", "free_port", "node_role", "worker_environment"]


def backend_for(device_types: str | Sequence[str]) -> str:
    """The ``torch.distributed`` backend for ranks on the given PyTorch device types, from the registry.

    Args:
        device_types: one device type (``"cuda"``, ``"npu"``, ``"cpu"``, ``"hpu"``) for all ranks, or one per rank.

    Returns:
        The backend of the registry's accelerators of that device type (``nccl`` for ``cuda``, ``hccl`` for
        ``npu``), ``gloo`` for ``cpu``, and the host kind's backend (``gloo``) when ranks use different device
        types (NCCL and HCCL groups cannot span each other's devices).

    Raises:
        InvalidParameter: a device type no registry accelerator uses (the message lists the valid ones).
    """
    from heteroflow.components.devices import all_kinds, cross_kind_backend
    from heteroflow.components.devices.accelerators import ACCELERATORS

    types = [device_types] if isinstance(device_types, str) else list(device_types)
    if not types:
        raise InvalidParameter("device_types is empty; valid: one device type, or one per rank")
    known: dict[str, str] = {}
    for kind in all_kinds():  # the kinds' own backends first (cpu: gloo, cuda: nccl, npu: hccl)
        known.setdefault(kind.torch_device_type, kind.distributed_backend)
    for accel in ACCELERATORS.values():
        known.setdefault(accel.torch_device_type, accel.distributed_backend)
    for t in types:
        if t not in known:
            raise InvalidParameter(f"device type {t!r} is unknown; valid: {', '.join(sorted(known))}")
    if len(set(types)) > 1:
        return cross_kind_backend()
    return known[types[0]]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now (bound to port 0, then released; another process could take it
    before the rendezvous, in which case rank 0 fails with ``EADDRINUSE`` and :func:`launch` retries once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def worker_environment(rank: int, world_size: int, *, master_port: int, master_addr: str = "127.0.0.1", run_id: str = "",
                       local_rank: int | None = None, local_world_size: int | None = None, group_rank: int = 0) -> dict[str, str]:
    """The environment variables ``torchrun`` sets for a worker [TR].

    Args:
        rank: global rank, 0 <= rank < world_size.
        world_size: number of workers on every node together.
        master_port: the rendezvous TCP port on ``master_addr``.
        master_addr: the rendezvous host (one node: the loopback address; several: node 0's address).
        run_id: ``TORCHELASTIC_RUN_ID``.
        local_rank / local_world_size: its rank on this node and the workers of this node (default: one node,
            ``rank`` and ``world_size``).
        group_rank: this node's rank (``GROUP_RANK``).

    Raises:
        InvalidParameter: rank out of range or world_size < 1.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidParameter(f"rank={rank}, world_size={world_size}; valid: world_size >= 1 and 0 <= rank < world_size")
    n = str(world_size)
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "GROUP_RANK": str(group_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "WORLD_SIZE": n,
        "LOCAL_WORLD_SIZE": str(world_size if local_world_size is None else local_world_size),
        "ROLE_WORLD_SIZE": n,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": run_id or "none",
    }


@dataclasses.dataclass(frozen=True, slots=True)
class NodeRole:
    """This pod's place in a multi-node job, as the job's operator told it (:func:`node_role`).

    Attributes:
        nodes: pods (nodes) in the job, >= 2.
        node_rank: this pod's index, 0 .. nodes-1 (0 hosts the rendezvous).
        master_addr / master_port: node 0's address and rendezvous port.
    """

    nodes: int
    node_rank: int
    master_addr: str
    master_port: int


_MIXED_KIND_ENV = "HETEROFLOW_REPLICA_KIND"  # mixed_job.REPLICA_KIND_ENV (not imported: mixed_job imports devices)
_MIXED_ROLES_ENV = "HETEROFLOW_MIXED_ROLES"  # mixed_job.ROLES_ENV
NODES_ENV = "HETEROFLOW_NODES"
"""Set by heteroflow's training-job manifests on every pod: the job's node count (:func:`node_role`)."""


def node_role(environ: Mapping[str, str] | None = None) -> NodeRole | None:
    """This pod's role in a multi-node training job, or None outside one.

    Read from the variables the operators set: Kubeflow Trainer v2's torch plugin sets torchrun's ``PET_NNODES``,
    ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` [KT]; the training operator v1 (PyTorchJob) sets
    ``MASTER_ADDR``, ``MASTER_PORT`` and the pod's ``RANK`` (Master 0, Worker i+1) [PJ]. ``PET_*`` wins; the node
    count falls back to :data:`NODES_ENV`, which heteroflow's manifests set. A job of one node is None; so is a
    pod of a mixed job (``HETEROFLOW_REPLICA_KIND`` or ``HETEROFLOW_MIXED_ROLES`` set, see
    :mod:`heteroflow.components.training.mixed_job`): its agents meet in torchrun's elastic c10d rendezvous
    (``PET_NNODES=1:K``, ``PET_RDZV_ENDPOINT``), with no master address, and the train step takes the mixed path.

    Raises:
        InvalidParameter: a variable that is not a number, or a node rank out of range (names the variable).
    """
    env = os.environ if environ is None else environ
    if env.get(_MIXED_KIND_ENV) or env.get(_MIXED_ROLES_ENV):
        return None  # a mixed job's pod (#29): torchrun's elastic c10d rendezvous (PET_NNODES=1:K), not a static one

    def number(name: str, text: str) -> int:
        try:
            return int(text.split(":")[-1])  # PET_NNODES may be "2:2" (min:max, elastic)
        except ValueError:
            raise InvalidParameter(f"{name}={text!r} is not a number; valid: an integer (set by the training job's operator)") from None

    nodes_name = "PET_NNODES" if env.get("PET_NNODES") else NODES_ENV
    if not env.get(nodes_name):
        return None
    nodes = number(nodes_name, env[nodes_name])
    if nodes <= 1:
        return None
    rank_name = "PET_NODE_RANK" if env.get("PET_NODE_RANK") else "RANK"
    port_name = "PET_MASTER_PORT" if env.get("PET_MASTER_PORT") else "MASTER_PORT"
    rank = number(rank_name, env.get(rank_name, "0"))
    port = number(port_name, env.get(port_name, ""))
    addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
    if not addr:
        raise InvalidParameter("a multi-node job without PET_MASTER_ADDR or MASTER_ADDR; valid: node 0's address, set by the operator")
    if not 0 <= rank < nodes:
        raise InvalidParameter(f"{rank_name}={rank} is out of range for {nodes} nodes; valid: 0 .. {nodes - 1}")
    return NodeRole(nodes=nodes, node_rank=rank, master_addr=addr, master_port=port)

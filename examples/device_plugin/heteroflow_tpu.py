"""An example device-kind plugin for heteroflow: Google Cloud TPUs as the kind ``tpu``.

Installing this package is the whole change: heteroflow finds :data:`TPU` through the entry point
``tpu = "heteroflow_tpu:TPU"`` in the group ``heteroflow.devices`` (see ``pyproject.toml``), and from then on
``tpu`` is accepted wherever a kind is: ``Resources(kind="tpu")``, ``heteroflow run -c tpu -c cpu``,
``HETEROFLOW_SIMULATE_DEVICES=tpu``, ``HETEROFLOW_INJECT_FAULT=train@tpu=device``, KFP and Airflow renderings
(which ask Kubernetes for ``google.com/tpu``).

Facts: GKE advertises TPU chips as the extended resource ``google.com/tpu`` and labels TPU nodes with
``cloud.google.com/gke-tpu-accelerator``; PyTorch drives TPUs through ``torch_xla`` (device type ``xla``,
``torch.distributed`` backend ``xla``). No probe is given: heteroflow counts no TPU on this machine unless it is
simulated (``HETEROFLOW_SIMULATE_DEVICES=tpu``) or listed in an inventory (``{"tpu": 4}``).
"""

from __future__ import annotations

from heteroflow.components.devices import DeviceKind, FailurePattern

__all__ = ["TPU"]

TPU = DeviceKind(
    name="tpu",
    aliases=("google-tpu",),
    description="a Google Cloud TPU, through torch_xla",
    torch_device_type="xla",
    torch_module="torch_xla",
    device_noun="TPU",
    distributed_backend="xla",
    resource_name="google.com/tpu",
    node_label_keys=("cloud.google.com/gke-tpu-accelerator",),
    failure_patterns=(
        FailurePattern(
            rule="TPU/XLA runtime error",
            failure_class="device",
            messages=("TPU initialization failed", "Failed to connect to the TPU"),
            exception_types=(RuntimeError,),
        ),
    ),
)

"""A PVC-backed training pipeline, written as a KFP user writes one (``kubernetes.CreatePVC`` / ``mount_pvc`` /
``DeletePVC``): the steps share a workspace volume instead of passing artifacts, so their order is ``.after()``.

    download -> train-model -> evaluate          (each mounts /mnt/workspace; the claim is deleted at the end)

On a cluster the claim is created for the run and deleted after the last step; on a local engine (``heteroflow run
--pipeline pvc_training:pipeline``) it is a folder of the run, deleted when the run ends. The steps open the mounted
path through :func:`heteroflow.components.core.mounts.local_path`, which maps it to that folder locally.

    heteroflow compile --pipeline pvc_training:pipeline -o pvc_training.yaml     # examples/practitioners on PYTHONPATH
"""

from __future__ import annotations

import json
import random

from heteroflow import ArtifactSpec, ArtifactType, Pipeline, Resources, RetryPolicy, step
from heteroflow.components.core.mounts import local_path
from heteroflow.pipelines.volumes import CreatePVC

WORKSPACE = "/mnt/workspace"

workspace = CreatePVC("workspace", size="1Gi", access_modes=("ReadWriteOnce",))


@step
def download(rows: int = 256, noise: float = 0.05, seed: int = 0) -> dict:
    """Write a regression data set (y = 3 x1 - 2 x2 + 1 + noise) onto the workspace volume.

    Args:
        rows: rows to write [rows].
        noise: standard deviation of the noise added to y.
        seed: random seed.
    """
    rng = random.Random(seed)
    data = []
    for _ in range(rows):
        x1, x2 = rng.uniform(-1, 1), rng.uniform(-1, 1)
        data.append([x1, x2, 3 * x1 - 2 * x2 + 1 + rng.gauss(0, noise)])
    target = local_path(f"{WORKSPACE}/data.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data), encoding="utf-8")
    return {"rows": rows, "path": f"{WORKSPACE}/data.json"}


@step
def train(epochs: int = 200, learning_rate: float = 0.1) -> dict:
    """Fit a linear model with PyTorch on the data set in the workspace; save it there.

    Args:
        epochs: full-batch gradient steps.
        learning_rate: SGD learning rate.
    """
    import torch

    data = torch.tensor(json.loads(local_path(f"{WORKSPACE}/data.json").read_text(encoding="utf-8")))
    x, y = data[:, :2], data[:, 2:]
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    torch.save(model.state_dict(), local_path(f"{WORKSPACE}/model.pt"))
    return {"train_mse": float(loss.detach())}


@step(outputs=[ArtifactSpec(name="metrics", type=ArtifactType.METRICS)])
def evaluate() -> dict:
    """Evaluate the saved model on the data set in the workspace (Metrics: mse and the fitted weights)."""
    import torch

    data = torch.tensor(json.loads(local_path(f"{WORKSPACE}/data.json").read_text(encoding="utf-8")))
    model = torch.nn.Linear(2, 1)
    model.load_state_dict(torch.load(local_path(f"{WORKSPACE}/model.pt"), weights_only=True))
    with torch.no_grad():
        mse = float(torch.nn.functional.mse_loss(model(data[:, :2]), data[:, 2:]))
    w1, w2 = (float(v) for v in model.weight[0].detach())
    return {"mse": mse, "w1": w1, "w2": w2, "bias": float(model.bias.detach()[0])}


pipeline = Pipeline(
    "pvc-training",
    description="download -> train -> evaluate on a shared workspace PVC, created for the run and deleted at its end",
    display_name="PVC-backed training",
    pipeline_root="minio://mlpipeline/v2/artifacts",
)
fetched = pipeline.add(download, volumes={WORKSPACE: workspace}, display_name="download the data set")
trained = pipeline.add(
    train,
    name="train-model",
    volumes={WORKSPACE: workspace},
    candidates=[Resources(kind="cpu", cpu="2", cpu_limit="none", memory="2Gi")],  # a request with no CPU limit
    retry=RetryPolicy(retries=1, backoff_seconds=5, retry_on="any"),  # KFP's behaviour: retry any failure
    base_image="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
).after(fetched)
pipeline.add(evaluate, volumes={WORKSPACE: workspace}).after(trained)

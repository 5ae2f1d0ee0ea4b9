"""A data pipeline with plain environment variables, Secrets (as environment variables and as files) and a ConfigMap
mounted as files, written as a KFP user writes one (``set_env_variable``, ``kubernetes.use_secret_as_env``,
``use_secret_as_volume``, ``use_config_map_as_volume``).

    extract -> transform -> load

On a cluster the Secret ``warehouse-db`` and the ConfigMap ``etl-config`` must exist in the run's namespace. On a local
engine there is no cluster: the Secret's variables come from your environment (``WAREHOUSE_USER`` and
``WAREHOUSE_PASSWORD``), and the ConfigMap and the token file from the ``local_files`` given below.

    heteroflow compile --pipeline env_secrets:pipeline -o env_secrets.yaml       # examples/practitioners on PYTHONPATH
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from heteroflow import ArtifactSpec, ArtifactType, Pipeline, SecretEnv, step
from heteroflow.components.core.mounts import local_path
from heteroflow.pipelines.volumes import ConfigMapVolume, SecretVolume

CONFIG = "/etc/etl"
TOKEN = "/var/run/secrets/warehouse"

config = ConfigMapVolume("etl-config", local_files={"columns.json": json.dumps(["city", "temperature_c"])})
token = SecretVolume("warehouse-token", local_files={"token": "local-stand-in-token"})  # a stand-in, not a credential
credentials = SecretEnv("warehouse-db", {"WAREHOUSE_USER": "username", "WAREHOUSE_PASSWORD": "password"})


@step(outputs=[ArtifactSpec(name="raw", type=ArtifactType.DATASET, param="raw")])
def extract(raw: str, rows: int = 12) -> dict:
    """Extract rows from the source the environment names (SOURCE_REGION) into a CSV data set.

    Args:
        rows: rows to extract.
    """
    region = os.environ["SOURCE_REGION"]  # a plain environment variable of the step
    cities = ["oslo", "lima", "pune", "kyiv"]
    Path(raw).parent.mkdir(parents=True, exist_ok=True)
    with open(raw, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["city", "temperature_c", "region"])
        for i in range(rows):
            out.writerow([cities[i % len(cities)], round(-5 + 2.5 * i, 1), region])
    return {"rows": rows, "region": region}


@step(
    inputs=[ArtifactSpec(name="raw", type=ArtifactType.DATASET, param="raw")],
    outputs=[ArtifactSpec(name="clean", type=ArtifactType.DATASET, param="clean")],
)
def transform(raw: str, clean: str) -> dict:
    """Keep the columns the ConfigMap lists (columns.json, mounted at /etc/etl) and convert Celsius per UNITS."""
    columns = json.loads(local_path(f"{CONFIG}/columns.json").read_text(encoding="utf-8"))
    fahrenheit = os.environ.get("UNITS", "metric") == "imperial"
    with open(raw, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    Path(clean).parent.mkdir(parents=True, exist_ok=True)
    with open(clean, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(columns)
        for row in rows:
            if fahrenheit:
                row["temperature_c"] = str(round(float(row["temperature_c"]) * 9 / 5 + 32, 1))
            out.writerow([row[c] for c in columns])
    return {"rows": len(rows), "columns": ",".join(columns)}


@step(inputs=[ArtifactSpec(name="clean", type=ArtifactType.DATASET, param="clean")])
def load(clean: str) -> dict:
    """Load the clean data set into the warehouse, signed in with the Secret's variables and token file."""
    user = os.environ.get("WAREHOUSE_USER", "")
    password = os.environ.get("WAREHOUSE_PASSWORD", "")
    if not user or not password:
        raise PermissionError("WAREHOUSE_USER / WAREHOUSE_PASSWORD are not set (the Secret warehouse-db)")
    signed = local_path(f"{TOKEN}/token").read_text(encoding="utf-8").strip()
    with open(clean, newline="", encoding="utf-8") as f:
        loaded = sum(1 for _ in csv.DictReader(f))
    return {"loaded": loaded, "user": user, "token_chars": len(signed)}


pipeline = Pipeline("env-secrets-etl", description="extract -> transform -> load with env vars, Secrets and a ConfigMap")
raw = pipeline.add(extract, env={"SOURCE_REGION": "eu-north-1"})
clean = pipeline.add(
    transform, raw=raw.outputs.raw, env={"UNITS": "imperial"}, volumes={CONFIG: config}, packages_to_install=["pyarrow>=15"]
)
pipeline.add(
    load,
    name="load-warehouse",
    clean=clean.outputs.clean,
    secrets=[credentials],
    volumes={TOKEN: token},
    env={"WAREHOUSE_HOST": "warehouse.internal:5432"},
)

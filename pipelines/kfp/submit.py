"""Submit a compiled pipeline to a Kubeflow Pipelines endpoint with ``kfp.Client``."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from heteroflow.components.errors import HeteroflowError, InvalidParameter

__all__ = ["SubmitError", "submit_package"]


class SubmitError(HeteroflowError, ConnectionError):
    """The Kubeflow Pipelines endpoint could not be reached or refused the run."""


def _coerce(value: str, type_name: str) -> Any:
    if type_name == "NUMBER_INTEGER":
        return int(value)
    if type_name == "NUMBER_DOUBLE":
        return float(value)
    if type_name == "BOOLEAN":
        return value.strip().lower() in ("true", "1", "yes")
    return value


def submit_package(
    package: str | os.PathLike[str],
    *,
    host: str,
    arguments: Mapping[str, str] | None = None,
    experiment: str = "heteroflow",
    run_name: str | None = None,
    namespace: str | None = None,
) -> dict[str, str]:
    """Create a run of a compiled pipeline (KFP IR YAML) on ``host``.

    Args:
        package: the compiled pipeline file.
        host: the KFP API endpoint (e.g. ``http://localhost:8080`` through a port-forward of ``ml-pipeline-ui``).
        arguments: run arguments as strings; converted to the types the pipeline declares.
        experiment: experiment name (created if missing).
        run_name: default ``<pipeline name> <UTC time>``.
        namespace: the user namespace of a multi-user Kubeflow.

    Returns:
        ``{"run_id", "url"}``.

    Raises:
        InvalidParameter: the file is not a compiled pipeline, or an argument is unknown or of the wrong type.
        SubmitError: the endpoint cannot be reached or refuses the run.
    """
    path = Path(package)
    try:
        spec = next(yaml.safe_load_all(path.read_text(encoding="utf-8")))  # then, maybe, the platform spec
        declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
        name = spec["pipelineInfo"]["name"]
    except FileNotFoundError:
        raise InvalidParameter(f"{path} does not exist; compile one with `heteroflow compile -o {path}`") from None
    except UnicodeDecodeError as exc:
        from heteroflow.components.core.keys import not_utf8

        raise InvalidParameter(f"{path} is not a compiled KFP pipeline: {not_utf8(exc)}") from None
    except (yaml.YAMLError, KeyError, TypeError, AttributeError, StopIteration) as exc:
        from heteroflow.components.core.keys import yaml_problem

        raise InvalidParameter(f"{path} is not a compiled KFP pipeline ({yaml_problem(exc)})") from None
    args: dict[str, Any] = {}
    for key, value in (arguments or {}).items():
        if key not in declared:
            from heteroflow.components.errors import did_you_mean

            raise InvalidParameter(f"unknown run argument {key!r}{did_you_mean([key], declared)}; valid: {', '.join(sorted(declared))}")
        try:
            args[key] = _coerce(value, declared[key].get("parameterType", "STRING"))
        except ValueError:
            raise InvalidParameter(f"run argument {key}={value!r} is not a valid {declared[key].get('parameterType')}") from None
    from kfp import Client

    try:
        client = Client(host=host, namespace=namespace)
        result = client.create_run_from_pipeline_package(
            str(path),
            arguments=args,
            run_name=run_name or f"{name} {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}",
            experiment_name=experiment,
            namespace=namespace,
        )
    except Exception as exc:  # kfp_server_api's ApiException, urllib3 errors, ...: one clear message
        raise SubmitError(f"cannot submit {path} to {host}: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}") from None
    run_id = str(result.run_id)
    return {"run_id": run_id, "url": f"{host.rstrip('/')}/#/runs/details/{run_id}"}

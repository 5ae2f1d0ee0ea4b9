"""``heteroflow manifests --inventory FILE --profile FILE -o DIR``: the queue, flavor and training-job manifests
that make the pipeline's annotations take effect (see :mod:`heteroflow.pipelines.k8s.manifests`).

Registered in :mod:`heteroflow.pipelines.cli.main` with::

    from heteroflow.pipelines.cli.manifests import manifests_command
    app.command("manifests")(manifests_command)

A user error (a bad inventory, profile or candidate) prints one line naming the file and field and exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["manifests_command"]

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def manifests_command(
    inventory: Annotated[Path, typer.Option("--inventory", help="Cluster inventory YAML/JSON: nodes or device counts, and queues (see examples/manifests/).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the manifests into.")],
    profile: Annotated[
        Optional[Path], typer.Option("--profile", help="Cluster profile YAML (device plugins, node labels, queues, images, training_job).")
    ] = None,
    candidate: Annotated[
        Optional[list[str]],
        typer.Option("--candidate", "-c", help="Train candidate KIND[:key=value,...], most preferred first (repeatable); the ClusterQueue flavor order. A mixed candidate (gpu:count=2+npu:count=4) renders as one Volcano Job."),
    ] = None,
    pipeline_ref: Annotated[
        Optional[str], typer.Option("--pipeline", help="module:attribute of your Pipeline; its first device-bound call's candidates set the flavor order.")
    ] = None,
    workers: Annotated[int, typer.Option("--workers", min=0, help="Pods (nodes) of the multi-worker train job; 0: no job.")] = 2,
    image: Annotated[Optional[str], typer.Option(help="Container image for the train job, every device kind's (default: the profile's image per device kind). With none for a candidate's kind it gets no train job, with a note; the command exits 1 when no candidate got one.")] = None,
    namespace: Annotated[str, typer.Option(help="Namespace of the train job.")] = "default",
    command: Annotated[
        str, typer.Option(help="The train job's container command (split like a shell would).")
    ] = "heteroflow step train",
) -> None:
    """Render Volcano Queues, Kueue ResourceFlavors/ClusterQueues/LocalQueues and a gang-scheduled multi-worker
    train job (TrainJob or PyTorchJob, per the profile), each validated against its real schema."""
    from heteroflow.cache.errors import HeteroflowError
    from heteroflow.components.errors import InvalidResources
    from heteroflow.components.resources import Candidates
    from heteroflow.pipelines.k8s.manifests import load_inventory, render_all, write_manifests

    try:
        from heteroflow.components.devices.cluster import DEFAULT_PROFILE, load_profile

        cluster = load_profile(profile) if profile is not None else DEFAULT_PROFILE
        inv = load_inventory(inventory)
        if candidate and pipeline_ref:
            raise HeteroflowError("give --candidate or --pipeline, not both")
        if candidate:
            try:
                cands = Candidates(candidate)
            except InvalidResources as exc:  # say which option the user got wrong, as run and compile do
                raise InvalidResources(f"-c/--candidate: {exc}") from None
        else:
            if pipeline_ref:
                from heteroflow.pipelines.graph import load_pipeline

                pipeline = load_pipeline(pipeline_ref)
            else:
                from heteroflow.pipelines.default import default_pipeline

                pipeline = default_pipeline()
            placed = pipeline.placed_calls
            if not placed:
                raise HeteroflowError(f"pipeline {pipeline.name!r} has no device-bound call to take candidates from; pass --candidate")
            cands = placed[0].candidates
        import shlex

        argv = shlex.split(command)
        if not argv:
            raise HeteroflowError("--command is empty; valid: a command line such as 'heteroflow step train'")
        try:
            files = render_all(inv, cands, cluster, workers=workers, namespace=namespace, image=image, command=argv)
        except InvalidResources as exc:  # a candidate the profile cannot render: said as the user wrote it
            index = getattr(exc, "candidate_index", None)
            if candidate and index is not None and index < len(candidate):
                raise InvalidResources(f"-c {candidate[index]!r}: {exc.reason}") from None  # type: ignore[attr-defined]
            raise
        if not files:
            raise HeteroflowError(f"{inventory}: nothing to render (no queues, no CPU/memory capacity, no accelerator candidate with an image)")
        written = write_manifests(files, output)
    except (HeteroflowError, OSError) as exc:
        text = f"{exc.filename}: {exc.strerror or exc}" if isinstance(exc, OSError) and getattr(exc, "filename", None) else str(exc)
        err_console.print(f"[bold red]error:[/] {escape(' '.join(text.split()))}", highlight=False)
        raise typer.Exit(code=2) from None
    for path in written:
        kinds = sorted({d["kind"] for d in files[path.name]})
        console.print(f"wrote {escape(str(path))} ({len(files[path.name])}: {', '.join(kinds)})", highlight=False)
    queues = {q.name for q in inv.queues}
    for setting, name in (("queue.kueue", cluster.kueue_queue), ("queue.volcano", cluster.volcano_queue)):
        if name is not None and queues and name not in queues:
            err_console.print(
                f"note: the profile's {setting}={name!r} names no queue of the inventory ({', '.join(sorted(queues))}); "
                "pods annotated with it wait for a queue someone else creates",
                highlight=False,
            )
    if workers >= 1:
        for i, res in enumerate(cands):
            kind = str(getattr(res.kind, "value", res.kind))
            if getattr(res, "replicas", None):  # a mixed candidate: one Volcano Job, an image per kind
                from heteroflow.components.training.mixed_job import missing_images

                for lacking in missing_images(res, image, cluster):
                    err_console.print(f"note: no train-{i}-{'-'.join(res.kinds)}.yaml: {_no_image(profile, lacking)}", highlight=False)
                continue
            if res.accelerator_spec is not None and not (image or cluster.image_for(kind)):
                err_console.print(f"note: no train-{i}-{kind}.yaml: {_no_image(profile, kind)}", highlight=False)
    from heteroflow.pipelines.k8s.manifests import HAMI_KUEUE_TOTALS, HAMI_KUEUE_TRANSFORMATIONS

    totals = set(HAMI_KUEUE_TOTALS.values())
    if any(totals & set(g["coveredResources"]) for d in files.get("kueue.yaml", []) if d["kind"] == "ClusterQueue"
           for g in d["spec"]["resourceGroups"]):
        import yaml

        err_console.print(
            "note: kueue.yaml's ClusterQueues count HAMi vGPU totals (" + ", ".join(HAMI_KUEUE_TOTALS.values()) + "); Kueue "
            "admits a GPU share only once its Configuration (ConfigMap kueue-manager-config) holds these resource "
            "transformations, then restart kueue-controller-manager:\n" + yaml.safe_dump(HAMI_KUEUE_TRANSFORMATIONS, sort_keys=False),
            highlight=False, end="")
    if "kueue.yaml" not in files:
        lacking = " and ".join(what for what, value in (("CPU", inv.cpu_millicores), ("memory", inv.memory_bytes)) if value is None)
        err_console.print(f"note: no kueue.yaml: the inventory states no {lacking or 'CPU and memory'} capacity (give each node "
                          "cpu and memory, or the inventory cpu_cores and memory)", highlight=False)
    jobs = [i for i, res in enumerate(cands) if getattr(res, "replicas", None) or res.accelerator_spec is not None]
    if workers >= 1 and jobs and not any(name.startswith("train-") for name in files):
        # every candidate that would have a train job has none (no image): what was asked for was not written
        err_console.print(
            f"[bold red]error:[/] no train job written: {'the candidate lacks' if len(jobs) == 1 else f'each of the {len(jobs)} candidates lacks'} "
            "an image for a device kind (the notes above say which); give --image, or images.<kind> in the profile",
            highlight=False)
        raise typer.Exit(code=1)


def _no_image(profile: Any, kind: str) -> str:
    """Why a train job has no image: the given profile names none for ``kind``, or no ``--profile`` was given (the
    default profile names no images; it blamed a profile the user never gave)."""
    if profile is None:
        return f"no --profile was given, and the default one names no image for {kind}; give --image, or --profile FILE with images.{kind}"
    return f"the profile names no image for {kind} (images.{kind}); give --image or add it to the profile"

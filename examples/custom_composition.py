"""Compose your own pipeline from heteroflow's steps in plain Python, then run it or compile it for Kubeflow.

    python examples/custom_composition.py -o custom.yaml              # compile only
    python examples/custom_composition.py -o custom.yaml --run        # and run it on kfp.local
    heteroflow params --pipeline custom_composition:build             # (with examples/ on PYTHONPATH)

The pipeline prewarms and preprocesses the data set, then trains on an NVIDIA GPU if there is one, else on 4 CPUs
(no plan step: train starts at its first candidate and falls back on a device failure), evaluates on the CPU, and
skips the archive. Its parameters are the steps' own, lifted automatically; two are fixed here.
"""

from __future__ import annotations

import argparse

from heteroflow import EVALUATE, PREPROCESS, PREWARM, TRAIN, Pipeline, Resources, RetryPolicy, compile, run


def build() -> Pipeline:
    p = Pipeline("digits-gpu-or-cpu", description="prewarm -> preprocess -> train (GPU, else CPU) -> evaluate")
    data = p.add(PREWARM, source_uri=p.param("dataset_uri", help="folder of .csv/.npz files"))
    shards = p.add(PREPROCESS, dataset=data.outputs.dataset, test_fraction=0.2, validation_fraction=0.1)
    model = p.add(
        TRAIN,
        shards=shards.outputs.shards,
        candidates=[Resources(kind="gpu", count=1, cpu="4", memory="16Gi"), Resources(kind="cpu", cpu="4", memory="8Gi")],
        retry=RetryPolicy(retries=1, backoff_seconds=5, window_seconds=6 * 3600),
    )
    p.add(EVALUATE, shards=shards.outputs.shards, model=model.outputs.model)
    return p


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-o", "--output", default="custom.yaml")
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    pipeline = build()
    compile(pipeline, args.output)
    print("wrote", args.output, "with parameters", ", ".join(pipeline.params))
    if args.run:
        record = run(pipeline, {"epochs": args.epochs})
        print(record.status, "accuracy", record.metrics.get("evaluate", {}).get("accuracy"), "record", record.run_dir)


if __name__ == "__main__":
    main()

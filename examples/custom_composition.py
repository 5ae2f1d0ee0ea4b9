"""Compose your own KFP pipeline from heteroflow's components, with one call per task for resources and retries.

    python examples/custom_composition.py -o custom.yaml          # compile only
    python examples/custom_composition.py -o custom.yaml --run    # and run it with kfp.local

The pipeline skips plan and archive: it prewarms, preprocesses, and trains and evaluates on a fixed device
kind (CPU here), using the KFP DSL directly.
"""


import argparse
import tempfile

from kfp import compiler, dsl, local

from heteroflow.components.datasets import export_digits
from heteroflow.components.kfp_components import make_components
from heteroflow.components.resources import Resources, RetryPolicy
from heteroflow.components.spec import DEFAULT_STEPS
from heteroflow.pipelines.kfp_render import apply_resources, apply_retry, apply_step

c = make_components()
cpu = Resources(kind="cpu", cpu="2", memory="4Gi")


@dsl.pipeline(name="digits-on-cpu")
def digits_on_cpu(dataset_uri: str, epochs: int = 5):
    prewarm = c.prewarm(source_uri=dataset_uri, cache_root="")
    apply_step(prewarm, DEFAULT_STEPS["prewarm"])
    shards = c.preprocess(
        dataset=prewarm.outputs["dataset"], validation_fraction=0.1, test_fraction=0.2, seed=7, num_workers=0
    )
    apply_step(shards, DEFAULT_STEPS["preprocess"])
    train = c.train(
        shards=shards.outputs["shards"], torch_device="cpu", device_kind="cpu", epochs=epochs, batch_size=32,
        learning_rate=0.002, hidden_units=64, seed=7, checkpoint_every_steps=25, checkpoint_root="",
    )
    apply_retry(apply_resources(train, cpu), RetryPolicy(retries=1, backoff_seconds=1))
    evaluate = c.evaluate(shards=shards.outputs["shards"], model=train.outputs["model"], torch_device="cpu")
    apply_resources(evaluate, cpu)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-o", "--output", default="custom.yaml")
    parser.add_argument("--run", action="store_true")
    args = parser.parse_args()
    compiler.Compiler().compile(digits_on_cpu, args.output)
    print("wrote", args.output)
    if args.run:
        root = tempfile.mkdtemp(prefix="custom-")
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
        digits_on_cpu(dataset_uri=str(export_digits()), epochs=5)
        print("run finished; artifacts under", root)


if __name__ == "__main__":
    main()

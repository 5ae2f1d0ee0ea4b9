"""The KFP DSL route: use a heteroflow pipeline as a sub-pipeline of your own ``@dsl.pipeline``.

(No ``from __future__ import annotations`` here: KFP reads the component annotations as objects.)

    python examples/kfp_dsl.py -o with-notify.yaml [--run]

``to_kfp`` renders any heteroflow Pipeline (with its placement, fallback routing, resources and retries) as a KFP
graph component; call it inside your pipeline like any component, next to tasks of your own.
"""


import argparse
import tempfile

from kfp import compiler, dsl, local

from heteroflow.components.data.datasets import export_digits
from heteroflow.pipelines.default import default_pipeline
from heteroflow.pipelines.kfp.render import to_kfp

training = to_kfp(default_pipeline())


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def announce(message: str) -> str:
    print(message)
    return message


@dsl.pipeline(name="train-and-announce")
def train_and_announce(dataset_uri: str, epochs: int = 5):
    trained = training(dataset_uri=dataset_uri, epochs=epochs)
    announce(message=f"training of {dataset_uri} finished").after(trained)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-o", "--output", default="with-notify.yaml")
    parser.add_argument("--run", action="store_true")
    args = parser.parse_args()
    compiler.Compiler().compile(train_and_announce, args.output)
    print("wrote", args.output)
    if args.run:
        local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=tempfile.mkdtemp(prefix="dsl-"))
        train_and_announce(dataset_uri=str(export_digits()), epochs=2)


if __name__ == "__main__":
    main()

"""Run the default pipeline from Python (what `heteroflow run` does) and print the run record's essentials.

    python examples/default_pipeline.py [--epochs 10]
"""

from __future__ import annotations

import argparse

import heteroflow


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    record = heteroflow.run(heteroflow.default_pipeline(), {"epochs": args.epochs})
    for step in record.steps:
        print(f"{step.name:<11} {step.status:<10} device={step.device} attempts={step.attempts} seconds={step.seconds:.2f}")
    print("status:", record.status, "accuracy:", record.metrics.get("evaluate", {}).get("accuracy"),
          "archive:", record.results.get("archive", {}).get("path"))


if __name__ == "__main__":
    main()

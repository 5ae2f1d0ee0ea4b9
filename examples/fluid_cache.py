"""Render the cluster side of the cache tier for one data set: a Fluid Dataset, AlluxioRuntime and DataLoad,
validated against the CRDs heteroflow ships, and the data-locality hint a device-bound
step's pod gets (preferred node affinity towards the nodes Fluid labelled as holding the cache).

    python examples/fluid_cache.py s3://datasets/digits/ --name digits --namespace ml --secret s3-creds > fluid.yaml
    kubectl apply -f fluid.yaml
"""

from __future__ import annotations

import argparse
import sys

import yaml

from heteroflow.cache.fluid import fluid_manifests, locality_affinity, validate_manifest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("source", help="the under storage Alluxio caches, e.g. s3://bucket/path/")
    ap.add_argument("--name", default="dataset")
    ap.add_argument("--namespace", default="default")
    ap.add_argument("--secret", default="", help="Kubernetes Secret with the under storage's keys")
    ap.add_argument("--quota", default="2Gi", help="cache per worker (Kubernetes quantity)")
    ap.add_argument("--replicas", type=int, default=1)
    args = ap.parse_args()

    manifests = fluid_manifests(args.name, args.source, namespace=args.namespace, credentials_secret=args.secret,
                                replicas=args.replicas, quota=args.quota)
    for m in manifests:
        validate_manifest(m)  # against the CRD shipped in heteroflow.cache (heteroflow.cache.crds)
    yaml.safe_dump_all(manifests, sys.stdout, sort_keys=False)
    affinity = locality_affinity(dataset=args.name, namespace=args.namespace)
    print("# a device-bound step's pod spec gets:\n# " + yaml.safe_dump({"affinity": affinity}).replace("\n", "\n# "))
    return 0


if __name__ == "__main__":
    sys.exit(main())

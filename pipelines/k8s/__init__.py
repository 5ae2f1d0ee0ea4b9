"""Kubernetes renderings without KFP: queues and flavors (Volcano, Kueue), pod resources, validation.

Owns: ``manifests`` (``heteroflow manifests``: Volcano Queues, Kueue ResourceFlavors / ClusterQueues / LocalQueues,
gang jobs), ``resources`` (requests, limits, node selectors and tolerations of a candidate's pod).
May import: ``heteroflow.components``, ``heteroflow.cache``.
"""

"""Kubeflow Pipelines: rendering a Pipeline to KFP IR, Kubernetes settings per task, and the kfp.local driver.

Owns: ``render`` (``compile_pipeline``), ``resources`` (kfp-kubernetes settings of a call), ``local`` (the
``kfp-local`` engine), ``patches`` (every replacement of a kfp.local internal, with the version check),
``prestart`` (prestarted step processes), ``submit`` (the ``kfp`` engine: a KFP backend), ``control`` (output
parameters, conditions, loops and sub-pipelines in the KFP DSL), ``loop_patch`` (kfp.local's loop inputs),
``artifacts`` (the run report as the last task's HTML artifact), ``platform`` (a call's env, volumes, image and
packages: kfp-kubernetes CreatePVC / mount_pvc / DeletePVC, ConfigMap and Secret volumes; display names of KFP's
generic groups).
May import: ``heteroflow.pipelines`` (graph, environment, runs, engines.base), ``heteroflow.components``,
``heteroflow.cache``, kfp.
"""

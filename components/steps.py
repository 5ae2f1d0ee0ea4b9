"""The steps heteroflow ships, each defined once as a :class:`~heteroflow.components.core.step.Step`.

==============  ===============================================  ===========================  ================
step            function                                         artifacts in -> out          runs on
==============  ===============================================  ===========================  ================
``prewarm``     :func:`heteroflow.cache.prewarm.prewarm_dataset`  -> dataset                   1 CPU
``preprocess``  :func:`heteroflow.components.data.preprocess.preprocess` dataset -> shards          4 CPUs
``plan``        :func:`heteroflow.components.placement.plan.plan_step`      -> placement                 500m CPU
``train``       :func:`heteroflow.components.training.step.train`         shards -> model, metrics     NPU, else GPU,
                                                                                               else 8 CPUs
``evaluate``    :func:`heteroflow.components.models.evaluate.evaluate`   shards, model -> metrics,    2 CPUs
                                                                  classification
``archive``     :func:`heteroflow.components.models.archive.archive_step` dataset, shards, model,     1 CPU
                                                                  eval_metrics -> archived
==============  ===============================================  ===========================  ================

Every parameter of these functions (type, default, unit, help) is read from the function itself; change a
step's candidates or retries for one pipeline with :meth:`Step.with_options` or at the call
(``Pipeline.add(step, candidates=...)``). Importing this module imports no torch, kfp or airflow.
"""

from __future__ import annotations

from heteroflow.components.models.archive import ARCHIVE
from heteroflow.components.models.evaluate import EVALUATE
from heteroflow.components.placement.plan import PLAN
from heteroflow.components.data.preprocess import PREPROCESS
from heteroflow.components.data.prewarm import PREWARM
from heteroflow.components.core.step import Step
from heteroflow.components.training.step import DEFAULT_TRAIN_CANDIDATES, TRAIN

__all__ = [
    "ARCHIVE",
    "DEFAULT_STEPS",
    "DEFAULT_TRAIN_CANDIDATES",
    "EVALUATE",
    "PLAN",
    "PREPROCESS",
    "PREWARM",
    "TRAIN",
]

DEFAULT_STEPS: tuple[Step, ...] = (PREWARM, PREPROCESS, PLAN, TRAIN, EVALUATE, ARCHIVE)
"""The default pipeline's steps, in order."""

"""Training: the train step, its loop and context, AMP, checkpoints, distributed and multi-node launch, profiling.

Owns: ``step`` (the train step; it re-exports the names of ``device`` (device strings), ``model_files`` (the
model files, loading a model), ``params`` (``model_args``, ``batch_sizes``, the model spec), ``checkpoint_lock``
(the checkpoint folder's lock) and ``context`` (one process's ``TrainContext``)), ``loop`` (``TrainContext`` and the built-in loop; it re-exports the names of
``factories``, ``precision``, ``checkpoint`` and ``batches``, and its names are also this package's, so
``heteroflow.components.training:mlp`` resolves), ``factories`` (the built-in model, ``ModelSpec``), ``precision``
(autocast dtype, ``GradScaler``, skipped-step detection), ``checkpoint`` (``Checkpoint``), ``batches`` (``EpochBatches``,
the loaders), ``sample_seeds`` (a dataset's random draws seeded by the sampler's state),
``distributed`` (the DDP launcher; it re-exports the names of ``rendezvous``, ``worker`` and ``gradients``),
``rendezvous`` (backends, torchrun's environment, node roles), ``worker`` (a worker process, ``DistributedContext``,
worker errors), ``gradients`` (weighted and compressed DDP hooks, learning-rate scaling, rank batches),
``trainjob`` (the multi-node launcher of a Kubeflow TrainJob / PyTorchJob), ``mixed_job`` (a job of several device
kinds as one Volcano Job), ``mixed_launch`` (its launcher, which hosts the store, and its pods' worker mode), ``profiling`` (the step profile).
May import: ``heteroflow.components.core``, ``devices``, ``data``, ``placement``, ``errors``, ``heteroflow.cache``.
"""

from heteroflow.components.core.lazy import names_from

__getattr__ = names_from(__name__, "heteroflow.components.training.loop")

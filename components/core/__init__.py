"""The step model every engine shares: a step's definition, one attempt's run, retries, failure classes, fallback.

Owns: ``step`` (``Step``, ``@step``, artifacts), ``runtime`` (``run_step``: one attempt of one step), ``retry``
(``RetryPolicy`` semantics per engine), ``failures`` (the failure classifier, simulated devices, injected faults),
``fallback`` (the fallback and retry rules), ``telemetry`` (per-attempt records), ``keys`` (duplicate-key rule).
May import: ``heteroflow.components.errors``, ``heteroflow.components.devices``, ``heteroflow.cache``; never the
step implementations (data, training, placement, models), which import this.
"""

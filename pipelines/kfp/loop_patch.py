"""A kfp.local patch for loops (:data:`LOOP_INPUTS`): a ``dsl.ParallelFor`` iteration keeps the task outputs it
reads from outside the loop.

kfp 2.17's ``task_spec_utils.create_parameter_loop_iteration_task_spec`` replaces *every* input of an iteration
that comes from a task's output parameter with the loop item, not only the item itself: a step inside a loop that
reads a value (or, in heteroflow's rendering, the route) of a step before the loop gets the loop item instead (seen
running ``examples/practitioners/tuning_fanout.py``: ``heteroflow_after_make_dataset`` received ``0.1``). The
replacement calls kfp's function and puts back, from the loop's own task spec, each such input that is not the
loop item. Applied by :func:`heteroflow.pipelines.kfp.patches.kfp_local_patches` (on kfp 2.17 only, as the
others); ``tests/test_practitioners_control.py`` runs a loop that reads an outside value on kfp.local.

May import: kfp (inside functions), :mod:`heteroflow.pipelines.kfp.patches`, the standard library.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from heteroflow.pipelines.kfp.patches import Patch, _replaced

__all__ = ["LOOP_INPUTS", "loop_inputs"]

LOOP_INPUTS = Patch(
    name="loop-inputs",
    replaces=("kfp.local.orchestrator.task_spec_utils:create_parameter_loop_iteration_task_spec",),
    works_around=(
        "kfp.local sets every input of a ParallelFor iteration that comes from a task's output parameter to the "
        "loop item (kfp 2.17, task_spec_utils); wrapped so that inputs other than the loop item keep their task "
        "output (a value or a route read from a step before the loop)."
    ),
)


@contextlib.contextmanager
def loop_inputs() -> Iterator[None]:
    """:data:`LOOP_INPUTS` for the duration."""
    from kfp.local.orchestrator import task_spec_utils

    def iteration(original_task_spec: Any, loop_item: Any, loop_task_name: str) -> Any:
        spec = original(original_task_spec, loop_item, loop_task_name)
        item = None
        if original_task_spec.WhichOneof("iterator") == "parameter_iterator":
            item = original_task_spec.parameter_iterator.item_input
        for name, source in original_task_spec.inputs.parameters.items():
            if source.HasField("task_output_parameter") and name != item and not name.endswith("-loop-item"):
                spec.inputs.parameters[name].CopyFrom(source)
        return spec

    with _replaced(task_spec_utils, "create_parameter_loop_iteration_task_spec", iteration) as original:
        yield

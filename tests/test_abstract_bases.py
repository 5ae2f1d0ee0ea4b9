"""Base classes whose subclasses must define a method declare it abstract: an incomplete subclass fails when it is
instantiated (TypeError naming the method), not later when the method is first called."""

from __future__ import annotations

import pytest

from heteroflow.pipelines import control, jct


def test_a_reference_without_a_key_cannot_be_made() -> None:
    class Keyless(control._Comparable):
        __slots__ = ()

    with pytest.raises(TypeError, match="abstract method.*_key"):
        Keyless()
    ref = control.ValueRef("train", "best")
    assert ref.same(control.ValueRef("train", "best")) and not ref.same(control.ValueRef("train", "other"))
    assert hash(ref) == hash(("value", "train", "best"))


def test_a_scheduler_without_allocate_cannot_be_made() -> None:
    class NoAllocate(jct.Scheduler):
        name = "none"

    with pytest.raises(TypeError, match="abstract method.*allocate"):
        NoAllocate()


def test_an_ordered_scheduler_needs_order_and_pick() -> None:
    class OrderOnly(jct._Ordered):
        def order(self, jobs, cluster):  # type: ignore[no-untyped-def]
            return list(jobs)

    with pytest.raises(TypeError, match="abstract method.*pick"):
        OrderOnly()


@pytest.mark.parametrize("cls", [jct.FifoAgnostic, jct.StaticBinding, jct.GavelStyle, jct.HeteroflowScheduler])
def test_the_shipped_schedulers_are_complete(cls: type) -> None:
    sched = cls()
    assert sched.waiting == {} and isinstance(sched, jct.Scheduler)

"""DataLoader workers hand batches over in reused shared-memory slots (#32 item 3): the same batches, in the same
order, as without workers, whatever the batch's structure, and no batch the training keeps is ever overwritten."""

from __future__ import annotations

import collections
import gc
import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from heteroflow.components.training import slots  # noqa: E402
from heteroflow.components.training.batches import make_loader  # noqa: E402

Pair = collections.namedtuple("Pair", "ids tag")


class _Nested(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Samples of several structures: a dict of a float tensor and a namedtuple (int16 tensor, string), a label."""

    draws_random = False

    def __len__(self) -> int:
        return 50

    def __getitem__(self, i: int) -> tuple[dict[str, Any], int]:
        return {"x": torch.full((3, 4), float(i)), "pair": Pair(torch.arange(i, i + 2, dtype=torch.int16), f"s{i}")}, i


def _epochs(loader: Any, stop_early_in: int | None = None) -> list[Any]:
    """Every batch of 3 epochs, all kept (a batch the caller holds must not change); the epoch ``stop_early_in``
    stops after 4 batches (its workers' prefetched batches are dropped unread)."""
    kept = []
    for epoch in range(3):
        loader.batch_sampler.set_epoch(epoch)
        for k, batch in enumerate(loader):
            kept.append(batch)
            if epoch == stop_early_in and k == 3:
                break
    return kept


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_hand_over_the_batches_of_no_workers_through_a_few_reused_slots(workers: int) -> None:
    cpu = torch.device("cpu")
    loader = make_loader(_Nested(), batch_size=4, seed=1, shuffle=True, num_workers=workers, device=cpu)
    assert isinstance(loader, slots.SlotLoader)
    got = _epochs(loader, stop_early_in=1)
    expected = _epochs(make_loader(_Nested(), batch_size=4, seed=1, shuffle=True, num_workers=0, device=cpu),
                       stop_early_in=1)
    assert len(got) == len(expected) == 13 + 4 + 13
    assert all(_same(g, e) for g, e in zip(got, expected, strict=True))  # kept batches were never overwritten
    assert type(got[0][0]["pair"]) is Pair and got[0][0]["pair"].tag[0].startswith("s")
    kept = loader._iterator._kept  # the slots this process has seen: a few per worker, for 30 batches
    assert 1 <= len(kept) <= slots.SLOTS * workers < len(got)
    assert {pid for pid, _ in kept} <= {w.pid for w in loader._iterator._workers}


def test_a_worker_without_a_free_slot_hands_the_batch_over_as_torch_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots, "SLOTS", 1)  # read by the worker, forked after this: prefetching outruns one slot
    cpu = torch.device("cpu")
    loader = make_loader(_Nested(), batch_size=4, seed=2, shuffle=True, num_workers=1, device=cpu)
    got = _epochs(loader)
    expected = _epochs(make_loader(_Nested(), batch_size=4, seed=2, shuffle=True, num_workers=0, device=cpu))
    assert len(got) == 39 and all(_same(g, e) for g, e in zip(got, expected, strict=True))
    assert len(loader._iterator._kept) == 1


def test_a_batch_is_copied_out_of_its_slot_and_a_batch_dropped_unread_frees_it() -> None:
    collate = slots.SlotCollate(torch.utils.data.default_collate)
    busy = torch.zeros(slots.SLOTS, dtype=torch.int8)
    buf = torch.zeros(256, dtype=torch.uint8)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    buf[:24].view(torch.float32).copy_(x.flatten())
    layout = (slots._Leaf(0, 24, torch.float32, (2, 3)), "label")
    busy[2] = 1
    taken = slots.SlotBatch(buf, busy, 2, layout, owner=os.getpid() + 1).take()  # received from another process
    assert torch.equal(taken[0], x) and taken[1] == "label" and int(busy[2]) == 0
    taken[0].zero_()
    assert torch.equal(buf[:24].view(torch.float32), x.flatten())  # a copy: the slot is untouched
    busy[4] = 1
    dropped = slots.SlotBatch(buf, busy, 4, layout, owner=os.getpid() + 1)
    del dropped
    gc.collect()
    assert int(busy[4]) == 0  # dropped unread: free again
    busy[5] = 1
    own = slots.SlotBatch(buf, busy, 5, layout, owner=os.getpid())
    del own
    gc.collect()
    assert int(busy[5]) == 1  # the worker's own copy (sent, then collected there) frees nothing
    assert collate([x[0], x[1]]).tolist() == x.tolist()  # in the training process itself: the collate as is
    assert slots.unpack("not a slot batch") == "not a slot batch"

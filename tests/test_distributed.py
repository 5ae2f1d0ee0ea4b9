"""Several workers on one node (heteroflow.components.training.distributed): torchrun's environment, backends from the
registry, failures classified like any step failure, rank-0 checkpoints that resume, and gradients weighted by
per-rank batch size. Process-spawning tests run real gloo process groups on the CPU and are marked slow."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from heteroflow.components.training.distributed import (
    DistributedContext,
    WorkerError,
    WorkerKilled,
    WorkerTimeout,
    backend_for,
    batch_weights,
    comm_hook,
    launch,
    rank_slice,
    run_distributed,
    scaled_learning_rate,
    worker_environment,
)
from heteroflow.components.errors import InvalidParameter
from heteroflow.components.core.failures import FailureClass, classify

# --- a small CNN on the real digits images (8x8, 10 classes) -------------------------------------------------


class SmallCNN(nn.Module):
    """Conv(1->4, 3x3) -> ReLU -> MaxPool(2) -> Linear(64 -> 10). No BatchNorm: its statistics are per rank."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))


def digits(n: int = 480) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images[:n], dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target[:n], dtype=torch.long)
    return x, y


# --- functions the workers run (top level: each worker imports this file by path) ---------------------------


def allreduce_ranks(ctx: DistributedContext, *, add: float = 0.0) -> dict[str, Any]:
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank) + add])
    dist.all_reduce(t)
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    return {"sum": t.item(), "env": {k: os.environ[k] for k in keys}, "backend": dist.get_backend(), "rank": ctx.rank}


def one_step_gradient(ctx: DistributedContext, *, compression: str = "none", weighted: bool = True) -> dict[str, torch.Tensor]:
    """One forward/backward of DDP on this rank's slice of the first global batch; returns the gradients."""
    torch.manual_seed(0)
    model = SmallCNN()
    ddp = ctx.ddp(model, compression=compression, weighted=weighted)
    x, y = digits(sum(ctx.batch_sizes))
    part = rank_slice(ctx.batch_sizes, ctx.rank)
    F.cross_entropy(ddp(x[part]), y[part]).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def train_with_compression(ctx: DistributedContext, *, compression: str, steps: int = 40) -> dict[str, Any]:
    """SGD on the CNN for ``steps`` steps through DDP with ``compression``; the losses of the union batch and this
    rank's final parameters."""
    import torch.distributed as dist

    torch.manual_seed(0)
    model = SmallCNN()
    ddp = ctx.ddp(model, compression=compression)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9)
    x, y = digits()
    total = sum(ctx.batch_sizes)
    part = rank_slice(ctx.batch_sizes, ctx.rank)
    losses = []
    for step in range(steps):
        b = step % (len(x) // total)
        xb, yb = x[b * total:(b + 1) * total][part], y[b * total:(b + 1) * total][part]
        loss = F.cross_entropy(ddp(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach() * len(yb) / total
        dist.all_reduce(mean)
        losses.append(float(mean))
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def one_step_gradient_relayed(ctx: DistributedContext) -> dict[str, torch.Tensor]:
    """As one_step_gradient, through the CPU relay hook (what a NPU rank in a gloo group uses)."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = SmallCNN()
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(*comm_hook(batch_sizes=ctx.batch_sizes, rank=ctx.rank, relay_through_cpu=True))
    x, y = digits(sum(ctx.batch_sizes))
    part = rank_slice(ctx.batch_sizes, ctx.rank)
    F.cross_entropy(ddp(x[part]), y[part]).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def gradient_variants(ctx: DistributedContext) -> dict[str, dict[str, torch.Tensor]]:
    """The gradients of one step in four ways, in one process group (one launch instead of four): the weighted hook,
    DDP's plain average, the CPU relay hook, and the weighted hook over fp16 transport."""
    return {
        "weighted": one_step_gradient(ctx),
        "plain": one_step_gradient(ctx, weighted=False),
        "relayed": one_step_gradient_relayed(ctx),
        "fp16": one_step_gradient(ctx, compression="fp16"),
    }


def train_with_and_without_powersgd(ctx: DistributedContext) -> dict[str, dict[str, Any]]:
    """train_with_compression twice in one process group: PowerSGD, then no compression (one launch instead of two)."""
    return {c: train_with_compression(ctx, compression=c) for c in ("powersgd", "none")}


def train_cnn(
    ctx: DistributedContext,
    *,
    checkpoint: str,
    epochs: int = 2,
    every: int = 5,
    kill_rank: int | None = None,
    kill_at_step: int | None = None,
    lr: float = 0.01,
) -> dict[str, Any]:
    """Adam on the CNN; a global batch of sum(batch_sizes) samples per step, rank r on its rank_slice; rank 0
    checkpoints every ``every`` steps; ``kill_rank`` SIGKILLs itself before step ``kill_at_step``."""
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    start = 0
    state = ctx.load_checkpoint(checkpoint)
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    ddp = ctx.ddp(model)
    x, y = digits()
    total = sum(ctx.batch_sizes)
    part = rank_slice(ctx.batch_sizes, ctx.rank)
    steps_per_epoch = len(x) // total
    for step in range(start, epochs * steps_per_epoch):
        epoch, i = divmod(step, steps_per_epoch)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1000 + epoch))
        idx = order[i * total : (i + 1) * total][part]
        if kill_rank == ctx.rank and kill_at_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        F.cross_entropy(ddp(x[idx]), y[idx]).backward()
        opt.step()
        if (step + 1) % every == 0:
            ctx.save_checkpoint({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, checkpoint)
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "resumed_from": start}


def raise_oom_on_rank_1(ctx: DistributedContext) -> None:
    import torch.distributed as dist

    if ctx.rank == 1:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 15.78 GiB total capacity)")
    dist.barrier()


def raise_value_error(ctx: DistributedContext) -> None:
    raise ValueError(f"bad label on rank {ctx.rank}")


def exit_3(ctx: DistributedContext) -> None:
    if ctx.rank == 0:
        raise SystemExit(3)
    import torch.distributed as dist

    dist.barrier()


def sleep_long(ctx: DistributedContext) -> None:
    import time

    time.sleep(120)


class Ctx:
    """A stand-in for the train step's own context, built from the worker's DistributedContext."""

    def __init__(self, dctx: DistributedContext, *, tag: str) -> None:
        self.dist = dctx
        self.tag = tag


def make_ctx(dctx: DistributedContext, *, tag: str) -> Ctx:
    return Ctx(dctx, tag=tag)


def user_train(ctx: Ctx) -> str:
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return f"{ctx.tag}:{ctx.dist.rank}/{int(t.item())}"


# --- fast tests: no processes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("types", "backend"),
    [("cpu", "gloo"), ("cuda", "nccl"), ("npu", "hccl"), (["cuda", "cuda"], "nccl"), (["cuda", "npu"], "gloo")],
    ids=["cpu", "cuda", "npu", "cuda-x2", "mixed"],
)
def test_backend_from_registry(types: Any, backend: str) -> None:
    assert backend_for(types) == backend


def test_backend_unknown_device_type_names_valid_ones() -> None:
    with pytest.raises(InvalidParameter, match=r"device type 'tpu' is unknown; valid: .*cuda.*npu"):
        backend_for("tpu")


def test_torchrun_environment() -> None:
    env = worker_environment(1, 3, master_port=29500)
    assert env["RANK"] == env["LOCAL_RANK"] == "1"
    assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["GROUP_RANK"]) == ("127.0.0.1", "29500", "0")
    with pytest.raises(InvalidParameter, match="rank=3, world_size=3"):
        worker_environment(3, 3, master_port=1)


def test_weights_slices_and_linear_scaling_rule() -> None:
    assert batch_weights([64, 32]) == (2 / 3, 1 / 3)
    assert [rank_slice([64, 32], r) for r in (0, 1)] == [slice(0, 64), slice(64, 96)]
    # Goyal et al. 2017: lr scales with the union batch, 0.1 at 256 -> 0.0375 at 64 + 32.
    assert scaled_learning_rate(0.1, 256, [64, 32]) == pytest.approx(0.0375)
    for bad in ([], [0, 4], [2.5], [True]):
        with pytest.raises(InvalidParameter, match="batch_sizes"):
            batch_weights(bad)
    with pytest.raises(InvalidParameter, match="compression='zstd' is unknown; valid: none, fp16, bf16, powersgd"):
        comm_hook("zstd")
    with pytest.raises(InvalidParameter, match="compression='bf16' with the CPU relay"):
        comm_hook("bf16", relay_through_cpu=True)


def test_weighted_combination_is_union_gradient_math() -> None:
    """The formula the hook implements: sum_r (b_r / B) g_r == the mean-loss gradient over the union batch."""
    torch.manual_seed(0)
    model = SmallCNN()
    x, y = digits(12)
    sizes = [8, 3, 1]

    def grads(xs: torch.Tensor, ys: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        F.cross_entropy(model(xs), ys).backward()
        return [p.grad.clone() for p in model.parameters()]

    union = grads(x, y)
    per_rank = [grads(x[rank_slice(sizes, r)], y[rank_slice(sizes, r)]) for r in range(3)]
    weighted = [sum(w * g[i] for w, g in zip(batch_weights(sizes), per_rank)) for i in range(len(union))]
    averaged = [sum(g[i] for g in per_rank) / 3 for i in range(len(union))]
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(weighted, union))
    assert not all(torch.allclose(a, b, rtol=1e-3, atol=1e-5) for a, b in zip(averaged, union))


def test_failure_classes_of_worker_errors() -> None:
    assert classify(WorkerKilled("worker rank 1 was killed by SIGKILL", rank=1, signal_number=9)).cls is FailureClass.TRANSIENT
    assert classify(WorkerTimeout("still running")).cls is FailureClass.TRANSIENT
    assert classify(WorkerError("worker rank 0 exited with code 3")).cls is FailureClass.PERMANENT


def test_launch_rejects_bad_arguments() -> None:
    with pytest.raises(InvalidParameter, match="count=0"):
        launch(allreduce_ranks, 0)
    with pytest.raises(InvalidParameter, match="batch_sizes has 1 entries for count=2"):
        launch(allreduce_ranks, 2, batch_sizes=[4])
    with pytest.raises(InvalidParameter, match="top level of a module"):
        launch(lambda ctx: None, 2)


# --- slow tests: real worker processes and gloo process groups ----------------------------------------------


@pytest.mark.slow
def test_workers_get_torchrun_env_and_gloo() -> None:
    out = launch(allreduce_ranks, 2, kwargs={"add": 1.0})
    assert [o["rank"] for o in out] == [0, 1]
    assert {o["sum"] for o in out} == {3.0}  # (0 + 1) + (1 + 1)
    assert {o["backend"] for o in out} == {"gloo"}
    assert out[1]["env"]["RANK"] == "1" and out[1]["env"]["WORLD_SIZE"] == out[1]["env"]["LOCAL_WORLD_SIZE"] == "2"
    assert out[0]["env"]["MASTER_PORT"] == out[1]["env"]["MASTER_PORT"] and out[0]["env"]["MASTER_ADDR"] == "127.0.0.1"


def parent_and_env(ctx: DistributedContext, *, kill_parent_on_rank: int = -1) -> dict[str, Any]:
    """This worker's pid, its parent's, the parent's command line and its torchrun rank; rank ``kill_parent_on_rank``
    SIGKILLs its parent (the zygote, as the OOM killer would) once both ranks met at a barrier."""
    import torch.distributed as dist

    parent = os.getppid()
    cmdline = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    dist.barrier()
    if ctx.rank == kill_parent_on_rank and "_zygote_main" in cmdline:  # never the test's own process
        os.kill(parent, signal.SIGKILL)
        import time

        time.sleep(60)  # PR_SET_PDEATHSIG ends it first
    return {"pid": os.getpid(), "parent": parent, "cmdline": cmdline, "rank": os.environ["RANK"]}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote forks workers on Linux only")
def test_a_launchs_workers_are_forked_from_one_interpreter_and_elsewhere_each_is_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux: one interpreter imports torch and forks the workers (one torch import per launch, not one per worker);
    FORK_WORKERS off (macOS, Windows): each worker is the launcher's own child. Same ranks and collective result."""
    import heteroflow.components.training.distributed as distributed

    forked = launch(parent_and_env, 3)
    assert [o["rank"] for o in forked] == ["0", "1", "2"]
    assert len({o["pid"] for o in forked}) == 3
    (zygote,) = {o["parent"] for o in forked}  # one parent for all three
    assert zygote != os.getpid() and "_zygote_main" in forked[0]["cmdline"]
    assert not Path(f"/proc/{zygote}").exists() or _running(zygote) is False  # it exited with its workers

    monkeypatch.setattr(distributed, "FORK_WORKERS", False)
    own = launch(parent_and_env, 2)
    assert {o["parent"] for o in own} == {os.getpid()} and len({o["pid"] for o in own}) == 2
    assert launch(allreduce_ranks, 2, kwargs={"add": 1.0})[1]["sum"] == 3.0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote forks workers on Linux only")
def test_a_killed_zygote_takes_its_workers_and_is_a_transient_kill() -> None:
    """The OOM killer picks the zygote: its workers end with it (PR_SET_PDEATHSIG), and the launch raises the same
    transient WorkerKilled as for a killed worker, so the step is retried."""
    with pytest.raises(WorkerKilled) as info:
        launch(parent_and_env, 2, kwargs={"kill_parent_on_rank": 1}, timeout_seconds=120)
    assert info.value.signal_number == signal.SIGKILL
    assert classify(info.value).cls is FailureClass.TRANSIENT


@pytest.mark.slow
def test_unequal_batches_give_exactly_the_union_batch_gradient() -> None:
    """One DDP step with 11 + 5 samples on two ranks: the weighted hook's gradient equals the single-process
    gradient over the 16 samples (allclose, fp32 rounding only); DDP's plain average does not."""
    sizes = [11, 5]
    torch.manual_seed(0)
    model = SmallCNN()
    x, y = digits(sum(sizes))
    F.cross_entropy(model(x), y).backward()
    union = {name: p.grad for name, p in model.named_parameters()}

    ranks = launch(gradient_variants, 2, batch_sizes=sizes, deterministic=True)  # the four ways in one process group
    weighted = [r["weighted"] for r in ranks]
    for rank_grads in weighted:  # every rank holds the same combined gradient
        for name, g in union.items():
            torch.testing.assert_close(rank_grads[name], g, rtol=1e-5, atol=1e-7)

    plain = [r["plain"] for r in ranks]
    assert not all(torch.allclose(plain[0][n], g, rtol=1e-3, atol=1e-5) for n, g in union.items())

    relayed = [r["relayed"] for r in ranks]
    for name, g in union.items():
        torch.testing.assert_close(relayed[1][name], g, rtol=1e-5, atol=1e-7)

    fp16 = [r["fp16"] for r in ranks]
    for name, g in union.items():  # fp16 transport: about 3 significant digits
        torch.testing.assert_close(fp16[0][name], g, rtol=2e-3, atol=2e-4)


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path: Path) -> None:
    """Two epochs of the CNN, global batch 48: two workers with 32 + 16 samples end with the weights of one
    process with 48 (tolerance 1e-5 absolute: only the order of float additions differs)."""
    one = launch(train_cnn, 1, kwargs={"checkpoint": str(tmp_path / "one.pt")}, batch_sizes=[48], deterministic=True)[0]
    two = launch(train_cnn, 2, kwargs={"checkpoint": str(tmp_path / "two.pt")}, batch_sizes=[32, 16], deterministic=True)
    for name, w in one["state"].items():
        torch.testing.assert_close(two[0]["state"][name], w, rtol=1e-4, atol=1e-5)
        assert torch.equal(two[0]["state"][name], two[1]["state"][name])  # the replicas agree exactly
    # and the run trained: weights moved from the seed's initialisation
    torch.manual_seed(0)
    assert not torch.allclose(SmallCNN().fc.weight, one["state"]["fc.weight"], atol=1e-3)


@pytest.mark.slow
def test_sigkill_of_a_worker_is_transient_and_the_rerun_resumes_to_the_same_weights(tmp_path: Path) -> None:
    sizes = [24, 24]  # 10 steps per epoch on 480 samples, 20 in all; checkpoints every 5 steps
    reference = launch(train_cnn, 2, kwargs={"checkpoint": str(tmp_path / "ref.pt")}, batch_sizes=sizes, deterministic=True)
    ckpt = tmp_path / "run.pt"
    with pytest.raises(WorkerKilled) as info:
        launch(
            train_cnn, 2, kwargs={"checkpoint": str(ckpt), "kill_rank": 1, "kill_at_step": 17}, batch_sizes=sizes, deterministic=True
        )
    assert (info.value.rank, info.value.signal_number) == (1, signal.SIGKILL)
    assert classify(info.value).cls is FailureClass.TRANSIENT
    assert torch.load(ckpt, weights_only=False)["step"] == 15  # rank 0's last complete checkpoint; killed mid-epoch 2
    assert not list(tmp_path.glob(".run.pt.*"))  # no temporary left beside it

    resumed = launch(train_cnn, 2, kwargs={"checkpoint": str(ckpt)}, batch_sizes=sizes, deterministic=True)
    assert [r["resumed_from"] for r in resumed] == [15, 15]
    for name, w in reference[0]["state"].items():
        assert torch.equal(resumed[0]["state"][name], w), name


@pytest.mark.slow
def test_a_worker_exception_is_reraised_and_classified_as_in_one_process(capfd: pytest.CaptureFixture[str]) -> None:
    import traceback

    with pytest.raises(torch.OutOfMemoryError) as oom:
        launch(raise_oom_on_rank_1, 2)
    assert classify(oom.value).cls is FailureClass.DEVICE
    # the step's one-line error names the rank (records and fallback reasons keep it); the worker's traceback goes to
    # the launcher's stderr (the step's log), not into that line
    line = "".join(traceback.format_exception_only(type(oom.value), oom.value)).strip()
    assert line.endswith("(raised in distributed worker rank 1)") and "Traceback" not in line
    assert "distributed worker rank 1 failed; its traceback:\nTraceback" in capfd.readouterr().err
    with pytest.raises(ValueError, match="bad label on rank") as bad:
        launch(raise_value_error, 2)
    assert classify(bad.value).cls is FailureClass.PERMANENT
    with pytest.raises(WorkerError, match=r"rank 0 called sys.exit\(3\)"):
        launch(exit_3, 2)
    with pytest.raises(WorkerTimeout):
        launch(sleep_long, 2, timeout_seconds=3)


@pytest.mark.slow
def test_run_distributed_builds_the_callers_context_in_each_worker() -> None:
    assert run_distributed(user_train, make_ctx, 2, ctx_kwargs={"tag": "t"}) == ["t:0/2", "t:1/2"]


def test_rank_batches_partition_the_single_process_batches() -> None:
    from heteroflow.components.training.distributed import RankBatches

    sizes = [5, 2, 3]
    ranks = [RankBatches(47, sizes, r, seed=3) for r in range(3)]
    one = RankBatches(47, [10], 0, seed=3)
    for epoch in (0, 1):
        for s in [*ranks, one]:
            s.set_epoch(epoch, start=1)
        per_rank = [list(s) for s in ranks]
        assert [len(b) for b in per_rank] == [3, 3, 3] == [len(s) for s in ranks]  # 4 full global batches, from the 2nd
        for i, whole in enumerate(one):
            assert [x for r in range(3) for x in per_rank[r][i]] == whole
            assert [len(per_rank[r][i]) for r in range(3)] == sizes
    with pytest.raises(InvalidParameter, match="fewer than one global batch"):
        RankBatches(4, sizes, 0)


# --- on accelerators, when the machine has them ---------------------------------------------------------------


def _cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gradient_on_device(ctx: DistributedContext, *, compression: str = "none") -> dict[str, torch.Tensor]:
    import torch.distributed as dist

    torch.manual_seed(0)
    model = SmallCNN().to(ctx.device)
    ddp = ctx.ddp(model, compression=compression)
    x, y = digits(sum(ctx.batch_sizes))
    part = rank_slice(ctx.batch_sizes, ctx.rank)
    F.cross_entropy(ddp(x[part].to(ctx.device)), y[part].to(ctx.device)).backward()
    assert dist.get_backend() == ctx.backend
    return {name: p.grad.detach().cpu() for name, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.skipif(_cuda_devices() < 1, reason="no CUDA device here (NCCL needs one per rank)")
@pytest.mark.parametrize("compression", ["none", "bf16"])
def test_nccl_weighted_gradient_on_cuda(compression: str) -> None:
    count = min(_cuda_devices(), 2)
    sizes = [11, 5][:count]
    torch.manual_seed(0)
    model = SmallCNN()
    x, y = digits(sum(sizes))
    F.cross_entropy(model(x), y).backward()
    out = launch(gradient_on_device, count, kwargs={"compression": compression}, device_type="cuda", batch_sizes=sizes)
    tol = {"none": (1e-4, 1e-5), "bf16": (2e-2, 2e-3)}[compression]  # TF32/cuDNN vs CPU; bf16 transport: ~3 digits
    for name, p in model.named_parameters():
        torch.testing.assert_close(out[0][name], p.grad, rtol=tol[0], atol=tol[1])


@pytest.mark.slow
def test_workers_die_with_a_killed_launcher(tmp_path: Path) -> None:
    """SIGKILL the process that called launch(): its workers end too (no orphan keeps training)."""
    import subprocess
    import sys
    import time

    pids = tmp_path / "pids"
    script = (
        "import sys; sys.path.insert(0, %r)\n"
        "import test_distributed as t\n"
        "from heteroflow.components.training.distributed import launch\n"
        "launch(t.record_pid_and_sleep, 2, kwargs={'folder': %r})\n"
    ) % (str(Path(__file__).parent), str(pids))
    launcher = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(pids.glob("*"))) < 2:
        time.sleep(0.1)
    workers = [int(p.read_text()) for p in pids.glob("*")]
    assert len(workers) == 2
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in workers if _running(pid)]
    assert alive == []


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def record_pid_and_sleep(ctx: DistributedContext, *, folder: str) -> None:
    import time

    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / str(ctx.rank)).write_text(str(os.getpid()))
    time.sleep(120)


# --- the train step on a candidate with count > 1 -----------------------------------------------------------


def test_each_rank_takes_its_share_of_the_single_process_batches_and_the_shares_weigh_them_whole() -> None:
    """EpochBatches with world_size > 1: the ranks' parts of step i are step i of one process (a short last batch
    too), a rank with nothing of a batch gets a stand-in sample weighted 0, and the loss factors average to 1."""
    from heteroflow.components.training.loop import EpochBatches

    n, batch, world = 10, 4, 3  # batches of 4, 4, 2: the last leaves rank 2 nothing
    one = list(EpochBatches(n, batch, seed=7))
    ranks = [EpochBatches(n, batch, seed=7, rank=r, world_size=world) for r in range(world)]
    parts = [list(s) for s in ranks]
    for b, whole in enumerate(one):
        shares = [s.share(b) for s in ranks]
        real = [p[b] for p, share in zip(parts, shares) if share > 0]
        assert sorted(int(i) for part in real for i in part) == sorted(int(i) for i in whole)
        assert sum(shares) / world == pytest.approx(1.0)  # DDP's average of the factors: the batch's mean loss
        for p, share in zip(parts, shares):
            assert share == pytest.approx(world * len(p[b]) / len(whole)) if share else len(p[b]) == 1
    assert [s.share(2) for s in ranks] == [1.5, 1.5, 0.0]


@pytest.mark.slow
@pytest.mark.parametrize(("count", "batch_size"), [(2, 64), (3, 37)])  # 1,259 train samples: 37 leaves a last batch of 1
def test_the_train_step_on_a_multi_device_candidate_runs_one_worker_per_device_like_one_process(
    digits_shards: Path, tmp_path: Path, count: int, batch_size: int
) -> None:
    """train with a gpu x count candidate (simulated here: CPU workers over gloo) starts count workers, each on its
    share of every batch; the losses, history and weights equal one process's (float rounding of the reduction
    aside: 1e-6)."""
    from heteroflow.components.resources import Resources
    from heteroflow.components.training.step import train

    kwargs: dict[str, Any] = dict(epochs=2, batch_size=batch_size, checkpoint_every_steps=10, deterministic=True)
    single = train(digits_shards, tmp_path / "one", checkpoint_root=str(tmp_path / "ck1"), **kwargs)
    multi = train(digits_shards, tmp_path / "many", checkpoint_root=str(tmp_path / "ck2"),
                  resources=Resources(kind="gpu", count=count), **kwargs)
    assert (single.processes, multi.processes) == (1, count)
    assert multi.steps == single.steps and multi.device_kind == "gpu"
    assert [h["epoch"] for h in multi.history] == [1, 2]
    for a, b in zip(single.history, multi.history):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["validation_accuracy"] == pytest.approx(a["validation_accuracy"], abs=1e-3)
    w1 = torch.load(tmp_path / "one" / "model.pt", weights_only=True)
    w2 = torch.load(tmp_path / "many" / "model.pt", weights_only=True)
    assert all(torch.allclose(w1[k], w2[k], atol=1e-6, rtol=0) for k in w1), {k: float((w1[k] - w2[k]).abs().max()) for k in w1}
    assert multi.checkpoints_written >= 1  # rank 0 wrote them


@pytest.mark.slow
def test_powersgd_compression_trains_and_keeps_the_replicas_equal() -> None:
    """torch's PowerSGD hook (rank 1, error feedback, compressed after 10 uncompressed steps) under the batch-size
    weighting: 40 steps on 32 + 16 samples still learn (the last 10 losses well below the first 10), and both
    replicas hold the same parameters after compressed steps (DDP's invariant)."""
    both = launch(train_with_and_without_powersgd, 2, batch_sizes=[32, 16], deterministic=True)  # one process group
    out, plain = [r["powersgd"] for r in both], [r["none"] for r in both]
    losses = out[0]["losses"]
    assert losses == out[1]["losses"]
    assert losses[:11] == pytest.approx(plain[0]["losses"][:11], abs=1e-5)  # 10 uncompressed warm-up steps
    assert losses[20:] != pytest.approx(plain[0]["losses"][20:], abs=1e-4)  # then compressed: another path
    assert sum(losses[-10:]) / 10 < 0.75 * sum(losses[:10]) / 10, losses
    for name, p in out[0]["params"].items():
        torch.testing.assert_close(out[1]["params"][name], p, rtol=0, atol=1e-6)


# --- per-device batch sizes (train's batch_sizes) -------------------------------------------------------------


def test_per_rank_parts_partition_the_union_batches_and_weigh_them_whole() -> None:
    """EpochBatches with parts (48 on rank 0, 16 on rank 1): the ranks' slices of step i are step i of one process
    on batches of 64, a short last batch is split 3:1 too, and the loss factors average to 1."""
    from heteroflow.components.training.loop import EpochBatches

    n, parts = 150, (48, 16)  # batches of 64, 64, 22: the last split 16.5:5.5 -> 17:5 (largest remainder)
    one = list(EpochBatches(n, 64, seed=3))
    ranks = [EpochBatches(n, 64, seed=3, rank=r, world_size=2, parts=parts) for r in range(2)]
    got = [list(s) for s in ranks]
    for b, whole in enumerate(one):
        assert [int(i) for i in np.concatenate([got[0][b], got[1][b]])] == [int(i) for i in whole]
        assert sum(s.share(b) for s in ranks) / 2 == pytest.approx(1.0)
    assert [len(g[0]) for g in got] == [48, 16] and [len(g[2]) for g in got] == [17, 5]
    assert [s.share(0) for s in ranks] == [1.5, 0.5]
    with pytest.raises(InvalidParameter, match="sum to 60, not batch_size=64"):
        EpochBatches(n, 64, seed=3, world_size=2, parts=(48, 12))


def test_batch_sizes_bad_entries_name_the_field_and_the_union_keys_the_checkpoint(digits_shards: Path) -> None:
    """A bad entry names batch_sizes and what is valid; the union batch (not its split) keys the checkpoint folder,
    so '48,16' resumes a batch_size=64 training on any number of devices."""
    from heteroflow.components.training.step import check_train_params, checkpoint_folder, parse_batch_sizes

    assert parse_batch_sizes(" 64, 32 ") == (64, 32) and parse_batch_sizes("") == ()
    for bad in ("64,x", "64,0", "64,,32", "-1"):
        with pytest.raises(InvalidParameter, match=r"batch_sizes=.*valid: comma-separated integers >= 1"):
            check_train_params(batch_sizes=bad)
    assert checkpoint_folder(digits_shards, batch_sizes="48,16") == checkpoint_folder(digits_shards, batch_size=64)
    assert checkpoint_folder(digits_shards, batch_sizes="48,16") != checkpoint_folder(digits_shards, batch_size=32)


@pytest.mark.slow
def test_unequal_per_device_batch_sizes_train_like_one_process_on_the_union_batch(digits_shards: Path, tmp_path: Path) -> None:
    """train on a gpu x2 candidate (simulated: CPU workers over gloo) with batch_sizes '48,16': rank 0 takes 48
    samples of each step, rank 1 16, and the losses and weights equal one process's with batch_size 64 (1e-6)."""
    from heteroflow.components.resources import Resources
    from heteroflow.components.training.step import train

    kwargs: dict[str, Any] = dict(epochs=2, checkpoint_every_steps=10, deterministic=True)
    single = train(digits_shards, tmp_path / "one", checkpoint_root=str(tmp_path / "ck1"), batch_size=64, **kwargs)
    mixed = train(digits_shards, tmp_path / "mixed", checkpoint_root=str(tmp_path / "ck2"), batch_sizes="48,16",
                  resources=Resources(kind="gpu", count=2), **kwargs)
    assert (single.processes, mixed.processes) == (1, 2) and mixed.steps == single.steps
    for a, b in zip(single.history, mixed.history):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
    w1 = torch.load(tmp_path / "one" / "model.pt", weights_only=True)
    w2 = torch.load(tmp_path / "mixed" / "model.pt", weights_only=True)
    assert all(torch.allclose(w1[k], w2[k], atol=1e-6, rtol=0) for k in w1), {k: float((w1[k] - w2[k]).abs().max()) for k in w1}


def test_the_train_summary_says_how_many_worker_processes_trained_and_their_batch_together() -> None:
    """Trial finding: `-c gpu:count=2 --param batch_sizes=64,32` said only "train: 420 steps on gpu (simulated, on
    cpu)"; the two workers and their 96-sample step were in run.json alone. One process says nothing more."""
    from heteroflow.components.training.step import _train_summary

    facts = {"steps": 420, "seconds": 8.3, "samples_per_second": 5000.0, "final_loss": 0.01, "device": "cpu",
             "device_kind": "gpu", "processes": 2, "batch_size": 96}
    (line,) = _train_summary(facts)
    assert line.startswith("train: 420 steps on gpu (simulated, on cpu), 2 worker processes (one per device; 96 samples per step together) in 8.3 s"), line
    (one,) = _train_summary({**facts, "processes": 1, "batch_size": 64})
    assert one.startswith("train: 420 steps on gpu (simulated, on cpu) in 8.3 s"), one
    # trial finding: the samples/s are over the training loop, not the step's seconds (which hold the workers' start):
    # the loop's own seconds are said beside them, so the figures agree with each other
    (timed,) = _train_summary({**facts, "loop_seconds": 2.7})
    assert "in 8.3 s (5000 samples/s in the training loop, its 2.7 s), final loss" in timed, timed


@pytest.mark.slow
def test_a_function_whose_module_does_not_import_is_the_workers_own_error_through_the_zygote() -> None:
    """The zygote imports the function's module before forking; when that fails it forks anyway and each worker
    raises the import error itself, re-raised here as it is (permanent), not a killed or hung launch."""
    with pytest.raises(ModuleNotFoundError, match="nosuch_module_xyz"):
        launch("nosuch_module_xyz:fn", 2, timeout_seconds=120)


def test_batch_sizes_for_another_candidate_are_said_in_the_train_summary() -> None:
    """Trial finding: `--param batch_sizes=64,32` on a one-device candidate (a fallback from two devices) trained one
    worker on the union batch of 96 and said so only in the step's log. The summary says it; batch_sizes that fit
    the candidate, or none, add nothing."""
    import dataclasses

    from heteroflow.components.training.step import TrainResult, _train_facts, _train_summary

    result = TrainResult(model_dir=Path("/nonexistent"), device="cpu", steps=10, resumed_from_step=0, checkpoints_written=0,
                         samples_per_second=100.0, final_loss=0.1, validation_accuracy=None, seconds=1.0, processes=1,
                         batch_size=96, batch_sizes=(64, 32))
    facts = _train_facts(result)
    assert facts["batch_sizes"] == [64, 32]
    lines = _train_summary(facts)
    assert "train: batch_sizes 64,32 lists 2 sizes, for another candidate (this one has 1 worker process): the 1 worker took each step's union batch of 96 samples" in lines, lines
    three = _train_summary({**facts, "processes": 3})
    assert "train: batch_sizes 64,32 lists 2 sizes, for another candidate (this one has 3 worker processes): each step's union batch of 96 samples was split evenly over the 3 workers" in three, three
    fits = _train_summary({**facts, "processes": 2})
    assert not any("batch_sizes" in line for line in fits), fits
    assert not any("batch_sizes" in line for line in _train_summary(_train_facts(dataclasses.replace(result, batch_sizes=()))))


def test_batch_sizes_that_fit_no_candidate_are_refused_before_the_run() -> None:
    """Trial finding: `-c gpu:count=2 --param batch_sizes=64,32,16` ran, and the summary said the sizes were "for
    another candidate" when no candidate had 3 workers. The pipeline's check now refuses sizes that fit no
    single-kind candidate (a candidate with another number of workers, a fallback, still splits the batch evenly)."""
    from heteroflow.components.errors import InvalidParameter
    from heteroflow.pipelines.default import default_pipeline

    p = default_pipeline()
    p.replace("train", candidates=["gpu:count=2", "cpu"])
    with pytest.raises(InvalidParameter, match=r"batch_sizes='64,32,16' lists 3 size\(s\), and no candidate of train has 3 "
                       r"worker process\(es\) \(one per device\); valid: as many sizes as one candidate's workers "
                       r"\(1 for cpu; 2 for gpu x2 \(nvidia-gpu\)\), or leave batch_sizes empty"):
        p.check(p.arguments({"dataset_uri": "x", "batch_sizes": "64,32,16"}))
    p.check(p.arguments({"dataset_uri": "x", "batch_sizes": "64,32"}))  # the gpu candidate's two workers; cpu, a fallback, splits 96
    one = default_pipeline()  # every default candidate has one worker
    with pytest.raises(InvalidParameter, match=r"lists 2 size\(s\), and no candidate of train has 2 worker"):
        one.check(one.arguments({"dataset_uri": "x", "batch_sizes": "64,32"}))
    one.check(one.arguments({"dataset_uri": "x", "batch_sizes": "64"}))

"""Data-parallel training on opendnn: a torch model, converted, under DDP.

``NCCL_NVLS_ENABLE=0 python -m opendnn.apps.data_parallel --device cuda --world-size 1 2 --epochs 5``
trains ``digits_model()`` (the ``opendnn demo`` network as torch modules) on scikit-learn's 8x8
digits, once per world size, with one process per GPU (``torch.multiprocessing.spawn``), and prints
images/s per world size and the ratio to the first.

``NCCL_NVLS_ENABLE=0 python -m opendnn.apps.data_parallel --device cuda --model resnet50 --world-size 1 2``
trains torchvision's ResNet-50 (``weights=None``; torchvision needed: benchmarks/README.md)
channels_last under bf16 autocast on synthetic data: each rank one fixed random batch of
``--batch-size`` 224x224 images and labels, ``--warmup-steps`` untimed steps (they compile the
kernels), then ``--steps`` timed ones; no test set.

Under ``torchrun`` (RANK, WORLD_SIZE and LOCAL_RANK set) each process trains one rank of one run.
Every layer's forward and backward runs on opendnn (``opendnn.torch.convert``: Triton kernels on
CUDA, the NumPy backend on the CPU); torch.distributed averages the gradients (NCCL on CUDA, gloo on
the CPU) and torch's SGD updates.

Scaling is weak: each rank takes ``batch_size`` images per step, so a step of N ranks trains N
times the images of one. Batch norm statistics are per rank, as in any DDP model without SyncBN.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from itertools import repeat
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as TF
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from opendnn.apps.command_line import HelpFormatter, non_negative_int, positive_int
from opendnn.torch import convert

LEARNING_RATE = 0.05
MOMENTUM = 0.9
TIMEOUT_S = 300
IMAGENET_SIZE, IMAGENET_CLASSES = 224, 1000
Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]


def digits_model() -> torch.nn.Sequential:
    """The ``opendnn demo`` CNN as torch modules: (conv 3x3 no bias -> batch norm -> relu -> max pool
    2x2) for 1 -> 16 and 16 -> 32 channels (8x8 -> 4x4 -> 2x2), then Linear(128 -> 10) logits."""

    def block(c_in: int, c_out: int) -> list[torch.nn.Module]:
        return [
            torch.nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(c_out),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
        ]

    return torch.nn.Sequential(*block(1, 16), *block(16, 32), torch.nn.Flatten(), torch.nn.Linear(128, 10))


def digits(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """The demo's 80 / 20 split of the digits (images (N, 1, 8, 8) in [0, 1], int64 labels)."""
    from opendnn.apps.demo import load_digits

    train_x, train_y, test_x, test_y = load_digits(seed)
    return (
        TensorDataset(torch.from_numpy(train_x), torch.from_numpy(train_y).long()),
        TensorDataset(torch.from_numpy(test_x), torch.from_numpy(test_y).long()),
    )


def _torchvision_models() -> Any:
    try:
        import torchvision.models
    except ImportError as error:
        raise ImportError(
            f"--model resnet50 needs torchvision ({error}); benchmarks/README.md says how to install it"
        ) from error
    return torchvision.models


def resnet50_model() -> torch.nn.Module:
    """torchvision's ResNet-50 (``weights=None``: initialised from torch's generator), channels_last."""
    return _torchvision_models().resnet50(weights=None).to(memory_format=torch.channels_last)


def rank_loader(dataset: TensorDataset, rank: int, world_size: int, batch_size: int, seed: int) -> DataLoader:
    """Rank ``rank``'s shard of ``dataset`` (DistributedSampler, shuffled with ``seed``) in batches.
    Needs no process group, so a single process can rebuild any rank's batches."""
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
    )
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler)


# ---- the models: each one's builder and this rank's batches -----------------------------------


@dataclass(frozen=True)
class Rounds:
    """This rank's training: ``rounds`` each give one round's batches (an epoch, the warm-up steps);
    rounds before ``timed_from`` are untimed (they compile the kernels). ``schedule`` says so in
    words; ``test_set`` (or None) is scored on rank 0 at the end."""

    rounds: list[Callable[[], Batches]]
    timed_from: int
    schedule: str
    test_set: TensorDataset | None


def _digits_rounds(
    rank: int, world_size: int, where: torch.device, *, batch_size: int, seed: int, epochs: int, **_: Any
) -> Rounds:
    """One round per epoch over this rank's shard of the digits; all but the first epoch timed."""
    train_set, test_set = digits(seed)
    loader = rank_loader(train_set, rank, world_size, batch_size, seed)

    def epoch(k: int) -> Batches:
        cast(DistributedSampler, loader.sampler).set_epoch(k)  # (rank_loader's)
        return loader

    timed_from = 1 if epochs > 1 else 0
    schedule = f"{epochs} epochs, {'the first untimed' if timed_from else 'timed with compilation'}"
    return Rounds([functools.partial(epoch, k) for k in range(epochs)], timed_from, schedule, test_set)


def _synthetic_imagenet_rounds(
    rank: int,
    world_size: int,
    where: torch.device,
    *,
    batch_size: int,
    seed: int,
    steps: int,
    warmup_steps: int,
    **_: Any,
) -> Rounds:
    """One random batch (images channels_last, labels in [0, 1000)) made once on the device from
    ``seed + rank``, fed ``warmup_steps`` times untimed, then ``steps`` times timed."""
    generator = torch.Generator(where).manual_seed(seed + rank)
    images = torch.randn(batch_size, 3, IMAGENET_SIZE, IMAGENET_SIZE, device=where, generator=generator)
    labels = torch.randint(0, IMAGENET_CLASSES, (batch_size,), device=where, generator=generator)
    batch = images.contiguous(memory_format=torch.channels_last), labels
    return Rounds(
        [lambda: repeat(batch, warmup_steps), lambda: repeat(batch, steps)],
        1,
        f"{steps} steps after {warmup_steps} untimed",
        None,
    )


@dataclass(frozen=True)
class Workload:
    """A model to train: ``build()`` makes it on the CPU (torch seeded by the caller), ``rounds``
    this rank's batches; ``autocast``: forward passes in bf16 autocast on CUDA."""

    build: Callable[[], torch.nn.Module]
    rounds: Callable[..., Rounds]
    autocast: bool


WORKLOADS = {
    "digits": Workload(digits_model, _digits_rounds, autocast=False),
    "resnet50": Workload(resnet50_model, _synthetic_imagenet_rounds, autocast=True),
}


# ---- one rank -------------------------------------------------------------------------------------


def _rank_from_environment(rank: int, world_size: int, init_method: str) -> tuple[int, int, int, str]:
    """(rank, world size, local rank, init method): torchrun's variables when set, else the arguments."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return (
            int(os.environ["RANK"]),
            int(os.environ["WORLD_SIZE"]),
            int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
            "env://",
        )
    return rank, world_size, rank, init_method


def _setup(rank: int, local_rank: int, world_size: int, backend: str, device: str, init_method: str) -> torch.device:
    """Join the process group as ``rank``; on CUDA bind this process to GPU ``local_rank``."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast (NVLS) off: see the README
    where = torch.device("cuda", local_rank) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(where)
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=TIMEOUT_S),
        device_id=where if device == "cuda" else None,
    )
    return where


def _parallel_model(
    seed: int, where: torch.device, dtype: torch.dtype, build: Callable[[], torch.nn.Module] = digits_model
) -> DistributedDataParallel:
    torch.manual_seed(seed)
    model = build().to(where, dtype)
    report = convert(model)
    assert not report.left_alone, f"layers left to torch:\n{report}"
    return DistributedDataParallel(model, device_ids=[where.index] if where.type == "cuda" else None)


def train(
    rank: int,
    world_size: int,
    *,
    backend: str,
    device: str,
    batch_size: int,
    seed: int,
    init_method: str,
    model: str = "digits",
    epochs: int = 5,
    steps: int = 20,
    warmup_steps: int = 3,
) -> dict[str, Any]:
    """Train ``model`` (a key of WORKLOADS) data-parallel as rank ``rank`` of ``world_size`` processes.

    Args:
        rank: this process's rank (its GPU on CUDA); RANK / LOCAL_RANK override it under torchrun.
        world_size: number of processes (WORLD_SIZE overrides it under torchrun).
        backend: torch.distributed backend, "nccl" (CUDA) or "gloo" (CPU).
        device: "cuda" (one GPU per process) or "cpu".
        batch_size: images per rank per step.
        seed: initial weights, data split and shuffling (resnet50: rank r's images from seed + r).
        init_method: torch.distributed rendezvous ("tcp://127.0.0.1:PORT", "file://...");
            "env://" under torchrun.
        model: "digits" (the digits, ``epochs`` passes; images/s timed over all but the first
            when there are several, the first compiling the kernels) or "resnet50" (synthetic
            ImageNet-sized batches, bf16 autocast on CUDA: ``warmup_steps`` untimed steps, then
            ``steps`` timed ones).

    Returns:
        {"rank", "world_size", "device", "model", "schedule" (the timed rounds in words), "images",
        "seconds", "images_per_second" (all ranks' images over the timed rounds per second of wall
        time), "loss" (this rank's mean training loss in the last round: epoch or timed steps),
        "test_accuracy" (rank 0 of digits only, else None)}.
    """
    rank, world_size, local_rank, init_method = _rank_from_environment(rank, world_size, init_method)
    where = _setup(rank, local_rank, world_size, backend, device, init_method)
    try:
        workload = WORKLOADS[model]
        plan = workload.rounds(
            rank,
            world_size,
            where,
            batch_size=batch_size,
            seed=seed,
            epochs=epochs,
            steps=steps,
            warmup_steps=warmup_steps,
        )
        parallel = _parallel_model(seed, where, torch.float32, workload.build)
        optimizer = torch.optim.SGD(parallel.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
        autocast = workload.autocast and where.type == "cuda"
        images, loss_sum, count, start = 0, 0.0, 0, time.perf_counter()
        for k, batches in enumerate(plan.rounds):
            if k == plan.timed_from:
                _synchronize(where)
                images, start = 0, time.perf_counter()
            loss_sum, count = _train_round(parallel, optimizer, batches(), where, autocast)
            images += count * world_size
        _synchronize(where)
        seconds = time.perf_counter() - start
        test_set = plan.test_set if rank == 0 else None
        accuracy = evaluate(parallel.module, test_set, where) if test_set is not None else None
        dist.barrier()  # no rank tears down its connections while another still runs
        return {
            "rank": rank,
            "world_size": world_size,
            "device": str(where),
            "model": model,
            "schedule": plan.schedule,
            "images": images,
            "seconds": seconds,
            "images_per_second": images / seconds,
            "loss": loss_sum / max(count, 1),
            "test_accuracy": accuracy,
        }
    finally:
        dist.destroy_process_group()


def _train_round(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Batches, where: torch.device, autocast: bool
) -> tuple[float, int]:
    """One SGD step per batch (forward and loss in bf16 autocast with ``autocast``); returns the
    sum of the per-image losses (one host copy) and the number of images."""
    model.train()
    total, count = torch.zeros((), device=where), 0
    for x, y in batches:
        x, y = x.to(where, non_blocking=True), y.to(where, non_blocking=True)
        with torch.autocast(where.type, dtype=torch.bfloat16, enabled=autocast):
            loss = TF.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.detach() * len(y)
        count += len(y)
    return float(total), count


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: TensorDataset, where: torch.device, batch_size: int = 256) -> float:
    """Accuracy of ``model`` (eval mode: running batch norm statistics) on ``dataset``."""
    model.eval()
    correct = 0
    for x, y in DataLoader(dataset, batch_size=batch_size):
        correct += int((model(x.to(where)).argmax(1).cpu() == y).sum())
    return correct / len(dataset)


def _synchronize(where: torch.device) -> None:
    if where.type == "cuda":
        torch.cuda.synchronize(where)
    dist.barrier()


# ---- one synchronous step, for the equivalence check -------------------------------------------


def _freeze_batch_norm(model: torch.nn.Module) -> None:
    """Batch norm layers in eval mode: normalized with the running statistics, which a step leaves
    alone, so a rank's gradient no longer depends on which images share its batch."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.eval()


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = TF.cross_entropy(model(x), y)
    loss.backward()


def one_step(
    rank: int, world_size: int, *, init_method: str, batch_size: int, seed: int, dtype: torch.dtype = torch.float32
) -> dict[bool, dict[str, Any]]:
    """One DDP step on the CPU (gloo) from ``seed``'s initial weights on this rank's first batch,
    with batch norm live (per-rank batch statistics) and frozen (``_freeze_batch_norm``).

    Returns:
        {freeze_batch_norm: {"gradients": the averaged gradient of every parameter, "parameters":
        the parameters after one SGD step}} for freeze_batch_norm False and True, each a
        {name: tensor} dict.
    """
    where = _setup(rank, rank, world_size, "gloo", "cpu", init_method)
    try:
        x, y = next(iter(rank_loader(digits(seed)[0], rank, world_size, batch_size, seed)))
        results = {}
        for frozen in (False, True):
            model = _parallel_model(seed, where, dtype)
            if frozen:
                _freeze_batch_norm(model)
            _step(model, x.to(dtype), y)
            gradients = {name: p.grad.clone() for name, p in model.module.named_parameters()}
            torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM).step()
            results[frozen] = {
                "gradients": gradients,
                "parameters": {name: p.detach().clone() for name, p in model.module.named_parameters()},
            }
        dist.barrier()
        return results
    finally:
        dist.destroy_process_group()


def reference_step(
    world_size: int,
    *,
    batch_size: int,
    seed: int,
    freeze_batch_norm: bool,
    union: bool,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """What ``one_step`` must give, in one process without torch.distributed: the same converted
    model and initial weights; with ``union``, one backward on all ranks' first batches together
    (equal to DDP only with frozen batch norm); else one backward per rank's batch, batch norm
    statistics per batch as in DDP, gradients averaged by hand. Then one SGD step."""
    torch.manual_seed(seed)
    model = digits_model().to(dtype)
    convert(model)
    if freeze_batch_norm:
        _freeze_batch_norm(model)
    train_set = digits(seed)[0]
    batches = [next(iter(rank_loader(train_set, r, world_size, batch_size, seed))) for r in range(world_size)]
    if union:
        _step(model, torch.cat([x for x, _ in batches]).to(dtype), torch.cat([y for _, y in batches]))
    else:
        per_rank = []
        for x, y in batches:
            model.zero_grad(set_to_none=True)
            _step(model, x.to(dtype), y)
            per_rank.append([p.grad for p in model.parameters()])
        for p, grads in zip(model.parameters(), zip(*per_rank)):
            p.grad = torch.stack(grads).sum(0) / world_size
    gradients = {name: cast(torch.Tensor, p.grad).clone() for name, p in model.named_parameters()}  # (all set)
    torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM).step()
    return {"gradients": gradients, "parameters": {name: p.detach().clone() for name, p in model.named_parameters()}}


# ---- launching ------------------------------------------------------------------------------------


def _run_and_save(
    rank: int, function: Callable[..., dict[str, Any]], world_size: int, folder: str, options: dict[str, Any]
) -> None:
    torch.save(function(rank, world_size, **options), Path(folder) / f"rank{rank}.pt")
    # The rank's work is done and saved: leave without the interpreter's teardown, where a thread of
    # torch.distributed could abort the process ("terminate called without an active exception"),
    # seen about once in 20 two-rank gloo runs on the CPU, after both ranks had saved their results.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(
    function: Callable[..., dict[str, Any]], world_size: int, timeout_s: float = TIMEOUT_S, **options: Any
) -> list[dict[str, Any]]:
    """Run ``function(rank, world_size, **options)`` in ``world_size`` spawned processes and return
    their result dicts by rank. ``function`` must be importable (module level). Unless ``options``
    name an ``init_method``, the ranks meet through a file in a fresh temporary folder (no port to
    probe, which another process could take before rank 0 binds it).

    Raises:
        TimeoutError: the processes did not all finish in ``timeout_s`` (they are terminated).
        torch.multiprocessing.ProcessRaisedException: a rank raised.
    """
    with tempfile.TemporaryDirectory(prefix="opendnn_ddp_") as folder:
        options.setdefault("init_method", (Path(folder) / "rendezvous").as_uri())
        context = mp.start_processes(
            _run_and_save,
            args=(function, world_size, folder, options),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.terminate()
                raise TimeoutError(f"{world_size} ranks of {function.__name__} still running after {timeout_s} s")
        return [torch.load(Path(folder) / f"rank{rank}.pt") for rank in range(world_size)]


# ---- command line ---------------------------------------------------------------------------------


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m opendnn.apps.data_parallel", description=__doc__.split("\n")[0], formatter_class=HelpFormatter
    )
    parser.add_argument(
        "--world-size",
        type=positive_int,
        nargs="+",
        default=[1, 2],
        help="processes (GPUs on CUDA) per run; one run per value",
    )
    parser.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cuda: one GPU per process, NCCL; cpu: gloo",
    )
    parser.add_argument(
        "--model",
        choices=list(WORKLOADS),
        default="digits",
        help="digits (the demo's CNN) or resnet50 (torchvision's, synthetic data)",
    )
    parser.add_argument("--epochs", type=positive_int, default=5, help="digits: passes over the training set")
    parser.add_argument("--steps", type=positive_int, default=20, help="resnet50: timed steps")
    parser.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        default=3,
        help="resnet50: untimed steps before them, compiling the kernels",
    )
    parser.add_argument("--batch-size", type=positive_int, default=64, help="images per rank per step")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="initial weights, data split and shuffling")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    backend = "nccl" if args.device == "cuda" else "gloo"
    options = {
        "backend": backend,
        "device": args.device,
        "model": args.model,
        "epochs": args.epochs,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "batch_size": args.batch_size,
        "seed": args.seed,
    }
    if args.model == "resnet50":
        _torchvision_models()  # fail here, with the reason, rather than in every spawned rank
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun started this process: one rank
        result = train(0, 0, init_method="env://", **options)
        if result["rank"] == 0:
            _print_row(result, result)
        return 0
    if args.device == "cuda" and max(args.world_size) > torch.cuda.device_count():
        print(
            f"--world-size {max(args.world_size)} needs that many GPUs; {torch.cuda.device_count()} visible",
            file=sys.stderr,
        )
        return 2
    rows = []
    for world_size in args.world_size:
        rows.append(launch(train, world_size, **options)[0])
        _print_row(rows[-1], rows[0])
    return 0


def _print_row(row: dict[str, Any], first: dict[str, Any]) -> None:
    """One run: world size, images/s, speed-up over the ``first`` run, test accuracy ("-": none)."""
    ratio = row["images_per_second"] / first["images_per_second"]
    accuracy = "-" if row["test_accuracy"] is None else f"{row['test_accuracy']:.3f}"
    print(
        f"world_size {row['world_size']}  device {row['device'].split(':')[0]}  {row['images_per_second']:10.0f}"
        f" images/s  x{ratio:.2f} vs world_size {first['world_size']}  test accuracy {accuracy}"
        f"  ({row['images']} images in {row['seconds']:.2f} s; {row['schedule']})",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())

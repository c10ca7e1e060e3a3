"""What the ``opendnn`` subcommands share: argument types that turn a bad value into argparse's
usage error (exit status 2) instead of a traceback, the error a command ends with, the check for
optional packages that names the extra installing them, and the handle --device and --backend
ask for."""

from __future__ import annotations

import argparse
import importlib
import os
import re
from collections.abc import Callable
from typing import Any

import opendnn

AUTO = "auto"
USAGE_ERROR = 2  # argparse's exit status for a bad command line
TRITON_PACKAGES = {"torch": "torch", "triton": "triton"}  # what the Triton backend needs: import name: distribution


class CommandError(Exception):
    """Ends a command: ``opendnn <command>: error: <message>`` on stderr and exit ``status``."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def int_at_least(minimum: int, meaning: str) -> Callable[[str], int]:
    """An argparse type: an int >= ``minimum``, refused as "N is not ``meaning``" otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {meaning}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is not {meaning}")
        return value

    parse.__name__ = meaning  # what argparse calls the type in its own messages
    return parse


positive_int = int_at_least(1, "a positive integer")
non_negative_int = int_at_least(0, "a non-negative integer")


def device(text: str) -> str:
    """An argparse type: "auto" (the first CUDA device when torch sees one, else the CPU), "cpu",
    "cuda" or "cuda:N" for a device that exists; returns "cpu" or "cuda:N"."""
    if text == "cpu":
        return text
    if text == AUTO:
        torch = _torch_or_none()
        return "cuda:0" if torch is not None and torch.cuda.is_available() else "cpu"
    cuda = re.fullmatch(r"cuda(?::(\d+))?", text)
    if cuda is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: use auto, cpu, cuda or cuda:N")
    torch = _torch_or_none()
    if torch is None:
        raise argparse.ArgumentTypeError(f"{text} needs torch, which is not installed: pip install 'opendnn[gpu]'")
    count = torch.cuda.device_count()
    index = int(cuda[1] or 0)
    if index >= count:
        raise argparse.ArgumentTypeError(
            f"{text} does not exist: torch {torch.__version__} sees {count} CUDA device{'' if count == 1 else 's'}"
        )
    return f"cuda:{index}"


def missing_packages(modules: dict[str, str]) -> list[str]:
    """The distribution names of ``modules`` ({import name: distribution name}) that do not import."""
    missing = []
    for module, distribution in modules.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(distribution)
    return missing


def require_packages(purpose: str, modules: dict[str, str], extra: str) -> None:
    """Raise CommandError naming the packages ``purpose`` needs and the extra that installs them."""
    missing = missing_packages(modules)
    if missing:
        raise CommandError(
            f"{purpose} needs {' and '.join(missing)}, not installed here: pip install 'opendnn[{extra}]'"
        )


def _torch_or_none() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help; descriptions keep their line breaks."""


def add_command(commands: Any, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    """A subcommand's parser: ``summary`` in its parent's list, ``description`` atop its own help."""
    return commands.add_parser(name, help=summary, description=description, formatter_class=HelpFormatter)


def add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        type=device,
        default=AUTO,
        help="auto (the first CUDA device when torch sees one, else cpu), cpu, cuda or cuda:N",
    )


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    """--backend, read by ``create_handle``."""
    parser.add_argument(
        "--backend",
        choices=(AUTO, "numpy", "triton"),
        default=AUTO,
        help="auto (triton on CUDA, numpy on the CPU); triton on the CPU runs Triton's interpreter",
    )


def create_handle(device_name: str, backend: str) -> opendnn.Handle:
    """The handle --device and --backend ask for (backend "auto": by device). Triton needs torch and
    triton; on the CPU its interpreter is switched on here, before triton is first imported. A pair
    the library refuses (the NumPy backend on a CUDA device) is a usage error."""
    if backend == "triton":
        if device_name == "cpu":
            os.environ.setdefault("TRITON_INTERPRET", "1")
        require_packages("--backend triton", TRITON_PACKAGES, "gpu")
    try:
        return opendnn.create(device_name, backend=None if backend == AUTO else backend)
    except opendnn.BadParam as refused:
        raise CommandError(f"--device {device_name} --backend {backend}: {refused}", USAGE_ERROR) from None

"""Where to compute: the one check of a device request, in the caller's option name (`--device` for the CLI,
`device=` for the library)."""

from __future__ import annotations

from typing import Any

from qkinspect.errors import InputError


def check_device(device: Any, option: str = "device") -> str:
    """The device's name ("cpu", "cuda", "cuda:N"), or InputError naming it as the caller's option: `--device cuda:
    ...` where `option` starts with "--", else `device='cuda': ...`. Refuses what torch cannot parse, devices other
    than cpu and cuda, and cuda where no GPU is visible (before any work)."""
    name = str(getattr(device, "value", device))
    shown = f"{option} {name}" if option.startswith("--") else f"{option}={name!r}"
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise InputError(f"{shown}: not a torch device (cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"{shown}: no CUDA device is available (torch.cuda.is_available() is False)")
    if dev.type not in ("cpu", "cuda"):
        raise InputError(f"{shown}: only cpu and cuda are supported")
    return name


def requested_device(device: Any, option: str = "device") -> str:
    """`check_device`'s answer, without importing torch for the cpu (a request is checked before torch loads)."""
    name = str(getattr(device, "value", device))
    return name if name == "cpu" else check_device(name, option)

"""How a training process asks glibc's malloc to keep what a step frees (docs/twin.md, "Stacked training"):
a ground module that the single run (twin/train.py) and the stack (twin/stacked.py) both call, so neither imports
the other for it."""

from __future__ import annotations

MMAP_THRESHOLD, TRIM_THRESHOLD = 32 << 20, 256 << 20  # bytes (glibc's mallopt: M_MMAP_THRESHOLD, M_TRIM_THRESHOLD)


def steady_allocations() -> bool:
    """Have glibc's malloc keep the memory a training step frees for the next step (docs/twin.md, "Stacked
    training"): blocks up to 32 MiB from the heap, and the heap trimmed only past 256 MiB free. With glibc's
    defaults a stacked step's activations (MBs each) were returned to the system at each step and faulted in again
    (4,000-10,000 page faults a step for a stack of 9 runs of 2 x 64). Process-wide and kept: called by every
    training task, single or stacked. False where the C library is not glibc (nothing changed)."""
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, MMAP_THRESHOLD)) and bool(libc.mallopt(-1, TRIM_THRESHOLD))  # -3, -1: M_*
    except (OSError, AttributeError):
        return False

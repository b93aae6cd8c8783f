"""What a twin training is asked to do, checked once, before torch is imported or any text is read: the variants,
the model's shape, the tokenizer, the amounts, the learning rates, the engine's options.

Errors name each option as the caller spells it (`qkinspect.names.Names`): the library's argument names by default
(`steps=0`), the CLI's options when the CLI passes `CLI_NAMES` (`--steps 0`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.suggest import did_you_mean

# the variants, each a constraint held at every step (docs/twin.md); names as the experiment's edits where one exists
VARIANTS = ("standard", "share_qk", "share_qk_reformer", "symmetric", "share_qkv", "share_kv", "rank", "wq_identity",
            "bilinear")
ARCHS = ("llama", "gpt2")
MATCHED = "+params"  # suffix of a constrained variant's arm whose saved parameters are given back to its MLP
_RANK = re.compile(r"rank:([0-9]{1,6})")
_BPE = re.compile(r"bpe:([0-9]{1,7})")
MAX_STEPS = 10_000_000
TRAINING_PRECISIONS = ("float32", "bf16")  # the training's arithmetic: float32, or bfloat16 autocast (float32 weights)
INITS = ("draw", "nearest")  # a constrained twin's start: the standard draw put in the form, or the nearest form
SCHEDULES = ("cosine", "constant")  # after the warm-up: cosine to lr/10, or the rate held
# what the twin did before --init and --schedule existed: a folder's resume key names them only where they differ,
# so a folder written then resumes with --init nearest --schedule cosine
LEGACY = {"init": "nearest", "schedule": "cosine"}


LIBRARY_NAMES = Names()
CLI_NAMES = Names.cli()


@dataclass(frozen=True)
class Shape:
    """The model: transformers' `arch` class built from these sizes, or from a config.json (`config`)."""

    arch: str
    layers: int
    d_model: int
    heads: int
    context: int
    config: Path | None = None


@dataclass(frozen=True)
class TwinRequest:
    """A checked twin request. `variants`: each once, standard first, each as its edit text (`rank:8`), then the
    matched arms (`share_qk+params`) where asked. `lrs`: one value, or the values to choose from on seed 0."""

    out: Path
    variants: tuple[str, ...]
    shape: Shape
    text: Path | None
    tokenizer: str
    seeds: int
    lrs: tuple[float, ...]
    steps: int
    warmup: int
    batch: int
    eval_every: int
    eval_windows: int
    track_every: int | None
    margin: float
    device: str
    save_checkpoints: bool
    scheduler: str | None
    workers: int | None
    threads: int | None  # None: the default (qkinspect.twin.run.task_threads)
    init: str = "draw"
    schedule: str = "cosine"
    stack: int | None = None  # runs of one shape trained together (qkinspect.twin.stacked); None: what fits
    precision: str = "float32"  # or bf16: autocast, float32 master weights (stacked runs)
    compile: bool = False  # torch.compile the stacked model's step

    def training(self) -> dict[str, Any]:
        """What a run's numbers depend on besides its variant, seed and learning rate (the resume key)."""
        return {"shape": {"arch": self.shape.arch, "layers": self.shape.layers, "d_model": self.shape.d_model,
                          "heads": self.shape.heads, "context": self.shape.context,
                          "config": str(self.shape.config) if self.shape.config else None},
                "tokenizer": self.tokenizer, "steps": self.steps, "warmup": self.warmup, "batch": self.batch,
                "eval_every": self.eval_every, "eval_windows": self.eval_windows, "track_every": self.track_every,
                "device": self.device, "save_checkpoints": self.save_checkpoints,
                **{k: v for k, v in (("init", self.init), ("schedule", self.schedule)) if v != LEGACY[k]},
                **({"precision": self.precision} if self.precision != "float32" else {})}


def base_variant(variant: str) -> str:
    """The constraint's name: `rank:8` -> rank, `share_qk+params` -> share_qk."""
    return variant.removesuffix(MATCHED).partition(":")[0]


def parse_variants(variants: str | Sequence[str], match_params: bool, names: Names = LIBRARY_NAMES) -> tuple[str, ...]:
    """The variants asked for, standard first; InputError for an empty list or item ("standard" alone is the
    reference only)."""
    if isinstance(variants, str):
        texts = variants.split(",")
    elif isinstance(variants, Sequence) and all(isinstance(t, str) for t in variants):
        texts = list(variants)
    else:
        raise InputError(f"{names.said('variants', variants)}: expected the variants as text (share_qk,symmetric) "
                         "or a list of texts")
    texts = [t.strip() for t in texts]
    if not any(texts):
        raise InputError(f"{names.said('variants', variants, quoted=True)}: no variant; name at least one "
                         f"({', '.join(VARIANTS[1:])}; standard alone trains the reference only)")
    if "" in texts:
        raise InputError(f"{names.said('variants', variants, quoted=True)}: an empty item; give the variants "
                         "separated by single commas")
    out: list[str] = ["standard"]
    for text in texts:
        name, sep, arg = text.partition(":")
        if name not in VARIANTS:
            raise InputError(f"{names.said('variants', text)}: unknown variant{did_you_mean(name, VARIANTS)}; "
                             f"expected {', '.join(VARIANTS)} (rank as rank:K)")
        if name == "rank" and _RANK.fullmatch(text) is None:
            raise InputError(f"{names.said('variants', text)}: rank takes a whole number of dimensions, e.g. rank:8")
        if name != "rank" and sep:
            raise InputError(f"{names.said('variants', text)}: {name} takes no argument")
        if text not in out:
            out.append(text)
    if match_params:
        out += [v + MATCHED for v in out if v != "standard"]
    return tuple(out)


def check_rank_pairs(variants: Sequence[str], arch: str, names: Names = LIBRARY_NAMES) -> None:
    """Refuse rank:K with K odd under llama: rotary positions turn every pair of a head's dimensions together, so
    the form keeps whole pairs and rank:K would hold rank K − 1 (docs/twin.md, "Variants")."""
    if arch != "llama":
        return
    for v in variants:
        m = _RANK.fullmatch(v.removesuffix(MATCHED))
        if m is not None and int(m.group(1)) % 2:
            k = int(m.group(1))
            raise InputError(f"{names.said('variants', v)}: under llama rotary positions turn pairs of dimensions, so "
                             f"a head's rank comes in steps of 2 (rank:{k} would hold rank {k - 1}); give an even K")


def parse_lrs(lr: float | str | Sequence[float], names: Names = LIBRARY_NAMES) -> tuple[float, ...]:
    values: list[Any]
    if isinstance(lr, str):
        values = [s.strip() for s in lr.split(",")]
        if "" in values and any(values):
            raise InputError(f"{names.said('lr', lr, quoted=True)}: an empty item; give the learning rates "
                             "separated by single commas")
        values = [v for v in values if v]
    elif isinstance(lr, (int, float)):
        values = [lr]
    elif isinstance(lr, Sequence):
        values = list(lr)
    else:
        raise InputError(f"{names.said('lr', lr)}: expected a learning rate, or several (a list or \"3e-4,1e-3\")")
    out = []
    for v in values:
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = math.nan
        if isinstance(v, bool) or not math.isfinite(x) or not 0 < x < 10:
            raise InputError(f"{names.said('lr', lr)}: each learning rate must be a number between 0 and 10")
        if x not in out:
            out.append(x)
    if not out:
        raise InputError(f"{names.said('lr', lr)}: give at least one learning rate")
    return tuple(out)


def check_tokenizer(tokenizer: str, names: Names = LIBRARY_NAMES) -> str:
    if tokenizer in ("char", "byte"):
        return tokenizer
    m = _BPE.fullmatch(tokenizer) if isinstance(tokenizer, str) else None
    if m is None or not 260 <= int(m.group(1)) <= 1_000_000:
        raise InputError(f"{names.said('tokenizer', tokenizer)}: expected char, byte or bpe:N (N from 260 to 1000000, "
                         "the BPE vocabulary trained on the training text)")
    return tokenizer


def _types(names: Names, **given: tuple[Any, type | tuple[type, ...], bool]) -> None:
    """InputError naming the first argument whose value is not of its type (None allowed where marked)."""
    for option, (value, kind, optional) in given.items():
        if (value is None and optional) or isinstance(value, kind):
            continue
        what = {bool: "True or False", str: "text"}.get(kind, "a path")  # type: ignore[arg-type]
        raise InputError(f"{names.said(option, _shown(value))}: expected {what}{' or None' if optional else ''}")


def _shown(value: Any) -> Any:
    """A value as an error shows it: a long repr (an object's) cut short."""
    text = repr(value)
    return value if len(text) <= 60 else text[:57] + "..."


def check_types(names: Names, *, out: Any, text: Any, config: Any, progress: Any, notice: Any) -> None:
    """What `qkinspect.twin` checks before anything else (a ladder too): the paths and the callbacks' types."""
    _types(names, out=(out, (str, os.PathLike), False), config=(config, (str, os.PathLike), True),
           text=(text, (str, os.PathLike), True))
    if progress is not None and not callable(progress):
        raise InputError(f"{names.said('progress', _shown(progress))}: expected a progress receiver "
                         "(qkinspect.progress), or None")
    if notice is not None and not callable(notice):
        raise InputError(f"{names.said('notice', _shown(notice))}: expected a function of one line, or None")


def _needs_dask(names: Names) -> None:
    """InputError where Dask distributed is missing (the `sweep` extra), which the local cluster and a scheduler
    need; the runs in this process (0 workers) need no Dask."""
    import importlib.util

    try:
        found = importlib.util.find_spec("distributed") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise InputError(f"twin needs Dask distributed: pip install 'qkinspect[sweep]' (or "
                         f"{names.said('workers', 0)}: the runs in this process, one after another)")


def _whole(value: Any, option: str, names: Names, low: int = 1, high: int = MAX_STEPS) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InputError(f"{names.said(option, value)}: expected a whole number from {low} to {high}")
    return value


def check_request(out: str | Path, *, variants: str | Sequence[str] = "standard,share_qk", match_params: bool = False,
                  arch: str = "llama", layers: int = 4, d_model: int = 128, heads: int = 4, context: int = 64,
                  config: str | Path | None = None, text: str | Path | None = None, tokenizer: str = "char",
                  seeds: int = 3, lr: float | str | Sequence[float] = 1e-3, steps: int = 2000,
                  warmup: int | None = None, batch: int = 12, eval_every: int | None = None,
                  eval_windows: int = 128, track_every: int | None = None, margin: float = 0.02,
                  device: str = "cpu", save_checkpoints: bool = False, scheduler: str | None = None,
                  workers: int | None = None, threads: int | None = None, init: str = "draw",
                  schedule: str = "cosine", stack: int | None = None, precision: str = "float32",
                  compile: bool = False, names: Names = LIBRARY_NAMES) -> TwinRequest:
    """Every option that can be checked without torch, in one place; InputError naming the first bad one."""
    _types(names, out=(out, (str, os.PathLike), False), config=(config, (str, os.PathLike), True),
           text=(text, (str, os.PathLike), True), arch=(arch, str, False), tokenizer=(tokenizer, str, False),
           device=(device, str, False), scheduler=(scheduler, str, True), match_params=(match_params, bool, False),
           save_checkpoints=(save_checkpoints, bool, False))
    if not str(out):
        raise InputError(f"{names.said('out', out, quoted=True)}: give the twin folder")
    chosen = parse_variants(variants, match_params, names)
    if arch not in ARCHS:
        raise InputError(f"{names.said('arch', arch)}: expected one of {', '.join(ARCHS)}{did_you_mean(arch, ARCHS)}")
    for option, value in (("layers", layers), ("heads", heads)):
        _whole(value, option, names, 1, 1024)
    _whole(d_model, "d_model", names, 2, 1 << 16)
    _whole(context, "context", names, 2, 1 << 16)
    if config is None and d_model % heads:
        raise InputError(f"{names.said('d_model', d_model)}: must be a multiple of {names.said('heads', heads)}")
    if config is None and arch == "llama" and (d_model // heads) % 2:
        raise InputError(f"{names.said('d_model', d_model)} / {names.said('heads', heads)}: rotary positions turn "
                         "pairs of dimensions, so a llama head's size must be even")
    if config is None:
        check_rank_pairs(chosen, arch, names)
    cfg = Path(config) if config is not None else None
    if cfg is not None and not cfg.exists():  # what it is (a device, a FIFO) the reader refuses
        raise InputError(f"{names.said('config', cfg)}: no such file (a transformers config.json)")
    src = Path(text) if text is not None else None
    if src is not None and not src.exists():  # what it is (a device, a FIFO) the reader refuses
        raise InputError(f"{names.said('text', src)}: no such file or folder")
    check_tokenizer(tokenizer, names)
    _whole(seeds, "seeds", names, 1, 10_000)
    lrs = parse_lrs(lr, names)
    _whole(steps, "steps", names)
    warm = min(100, steps // 10) if warmup is None else _whole(warmup, "warmup", names, 0, steps)
    _whole(batch, "batch", names, 1, 1 << 16)
    every = steps if eval_every is None else _whole(eval_every, "eval_every", names)
    _whole(eval_windows, "eval_windows", names, 1, 1 << 20)
    if track_every is not None:
        _whole(track_every, "track_every", names)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < math.inf:
        raise InputError(f"{names.said('margin', margin)}: the margin is a loss difference in nats, 0 or more")
    for option, value, allowed in (("init", init, INITS), ("schedule", schedule, SCHEDULES)):
        if value not in allowed:
            raise InputError(f"{names.said(option, value)}: expected {' or '.join(allowed)}"
                             f"{did_you_mean(str(value), allowed)}")
    if device not in ("cpu", "cuda"):
        raise InputError(f"{names.said('device', device)}: expected cpu or cuda")
    from qkinspect.limits import check_threads, check_workers

    if workers is not None and workers != 0:
        check_workers(workers, names.workers)
    if workers != 0 or scheduler is not None:
        _needs_dask(names)
    check_threads(threads, names.threads)
    if scheduler is not None:
        from qkinspect.sweep.scheduler import check_address

        scheduler = check_address(scheduler, names.scheduler)
    if stack is not None:
        _whole(stack, "stack", names, 1, 4096)
    if precision not in TRAINING_PRECISIONS:
        raise InputError(f"{names.said('precision', precision)}: expected one of {', '.join(TRAINING_PRECISIONS)}")
    shape = Shape(arch, layers, d_model, heads, context, cfg)
    return TwinRequest(Path(out), chosen, shape, src, tokenizer, seeds, lrs, steps, warm, batch, every, eval_windows,
                   track_every, float(margin), device, bool(save_checkpoints), scheduler, workers, threads,
                   init, schedule, stack, precision, bool(compile))


Request = TwinRequest  # its name before requests were named <Capability>Request (kept: users import it)

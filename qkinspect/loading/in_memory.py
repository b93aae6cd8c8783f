"""Models already in memory: a `transformers.PreTrainedModel`, or a `(config, state_dict)` pair, opened as a checkpoint
would be (docs/loading.md, "Models in memory").

Nothing is copied: the tensor source hands the adapter the model's own parameters (detached views) one layer at a
time, and the config is the object's own. A parametrised weight (`torch.nn.utils.parametrize`, as healing uses) is
read as the module computes it. Records name the model as the same model given by `config.name_or_path` is named
(a local folder by its own name, never the machine's path; else its class) and say where it came from:
ModelInfo.source "memory:<config.name_or_path>", format "memory".
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.errors import InputError
from qkinspect.loading.source import DictSource, TensorSource, storage_dtype

if TYPE_CHECKING:
    from torch import Tensor, nn

MEMORY = "memory"


def is_in_memory(model: Any) -> bool:
    """Whether `model` is no spec at all (path, hub id, None) and no opened model: then it must be a model object."""
    from qkinspect.loading.model import LoadedModel

    return not (model is None or isinstance(model, (str, Path, LoadedModel)))


def resolve_memory(model: Any):
    """A `Resolved` for an in-memory model: the object's config and a source over its tensors.

    Raises:
        InputError: not a PreTrainedModel nor a (config, state_dict) pair, weights on the meta device, or a
            quantized model (its integer weights are not the model's values).
    """
    from qkinspect.loading.resolve import Resolved

    if isinstance(model, tuple) and len(model) == 2:
        config, state = _pair_config(model[0]), model[1]
        if not isinstance(state, Mapping):
            raise InputError(f"model=(config, state_dict): the state dict is a {type(state).__name__}, not a mapping")
        _check_tensors(state.values(), "the state dict")
        name, origin = _name(config, "state_dict"), f"{MEMORY}:{_origin(config, 'state_dict')}"
        arch = (getattr(config, "architectures", None) or [None])[0]
        return Resolved(name, Path(origin), MEMORY, config, DictSource(dict(state)), origin=origin, architecture=arch)
    module = _pretrained(model)
    config = module.config
    name, origin = _name(config, type(module).__name__), f"{MEMORY}:{_origin(config, type(module).__name__)}"
    return Resolved(name, Path(origin), MEMORY, config, ModuleSource(module), origin=origin,
                    architecture=type(module).__name__, model=module)


def _pretrained(model: Any) -> nn.Module:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        PreTrainedModel = ()  # noqa: N806
    if not isinstance(model, PreTrainedModel):
        raise InputError(f"model must be a path, a hub id, None (the demo), an opened model, a transformers "
                         f"PreTrainedModel or a (config, state_dict) pair, not {type(model).__name__}")
    if any(not p.is_floating_point() for p in model.parameters()):  # bitsandbytes, torchao ... (GGUF dequantizes)
        raise InputError(f"model: this {type(model).__name__} is quantized in memory; its stored integers are not "
                         "its weights (analyze the checkpoint it was loaded from instead)")
    _check_tensors(list(model.parameters()), f"this {type(model).__name__}")
    return model


def _check_tensors(tensors, what: str) -> None:
    import torch

    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise InputError(f"model: {what} holds a {type(t).__name__}, not a tensor")
        if t.is_meta:
            raise InputError(f"model: {what} has weights on the meta device (not loaded); load them first, e.g. "
                             "from_pretrained without device_map='meta', or analyze the checkpoint's path")


def _pair_config(config: Any) -> Any:
    """A PretrainedConfig as is; a dict (a config.json's contents) through transformers' own config class."""
    from transformers import PretrainedConfig

    if isinstance(config, PretrainedConfig):
        return config
    if isinstance(config, dict):
        from transformers import AutoConfig

        model_type = config.get("model_type")
        if not isinstance(model_type, str):
            raise InputError("model=(config, state_dict): the config dict has no model_type")
        _check_type(model_type)  # refused before transformers looks for the type
        try:
            return AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
        except (ValueError, TypeError, KeyError) as e:
            raise InputError(f"model=(config, state_dict): transformers cannot read the config ({e})") from None
    raise InputError(f"model=(config, state_dict): the config is a {type(config).__name__}, not a transformers "
                     "PretrainedConfig or a dict")


def _check_type(model_type: str) -> None:
    from qkinspect.loading.adapters.registry import adapter_for

    adapter_for(model_type)


def _origin(config: Any, fallback: str) -> str:
    """Where the model in memory came from, for ModelInfo.source: `config.name_or_path` whole (a path stays a
    path there, as a model given by path keeps it), else `fallback`."""
    return str(getattr(config, "name_or_path", None) or "") or fallback


def _name(config: Any, fallback: str) -> str:
    """The model's name for titles and tables: `config.name_or_path` as the same model given by path or hub id is
    named (a local folder by its own name, the demo as the demo, a hub cache snapshot as org/name: never the
    machine's path); its class's name when the config names nothing."""
    from qkinspect.loading.resolve import file_name, folder_name

    name = _origin(config, "")
    if not name:
        return fallback
    path = Path(name).expanduser()
    if path.is_file():
        return file_name(path)
    if path.is_dir() or path.is_absolute() or name.startswith(("./", "../", "~")):  # a folder, here or once
        return folder_name(path)
    return name  # a hub id (org/name) is its name


class ModuleSource(TensorSource):
    """The tensors of a live `nn.Module` by their state-dict names, read through the module tree: a parameter or
    buffer is handed out detached (a view: no copy), a parametrised weight as its parametrisation computes it.

    Example:
        >>> from torch import nn
        >>> src = ModuleSource(nn.Linear(3, 2))
        >>> src.shape("weight"), src.get("weight").data_ptr() == src.module.weight.data_ptr()
        ((2, 3), True)
    """

    def __init__(self, module: nn.Module):
        from torch.nn.utils import parametrize

        self.module = module
        self._where: dict[str, tuple[nn.Module, str]] = {}
        for path, m in module.named_modules(remove_duplicate=False):
            if ".parametrizations." in f".{path}." or type(m).__name__ == "ParametrizationList":
                continue  # the originals behind a parametrised weight: read the weight itself instead
            prefix = f"{path}." if path else ""
            names = [n for n, _ in m.named_parameters(recurse=False)]  # public API only: no torch internals
            names += [n for n, _ in m.named_buffers(recurse=False)]
            if parametrize.is_parametrized(m):
                names += list(m.parametrizations)
            for n in names:
                self._where[prefix + n] = (m, n)

    def keys(self) -> list[str]:
        return list(self._where)

    def _read(self, stored_name: str) -> Tensor:
        m, n = self._where[stored_name]
        return getattr(m, n).detach()

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        return tuple(self._read(stored_name).shape)

    def stored_dtype(self, stored_name: str) -> str:
        return storage_dtype(self._read(stored_name))

    def stored_nbytes(self, stored_name: str) -> int:
        t = self._read(stored_name)
        return t.numel() * t.element_size()


__all__ = ["MEMORY", "ModuleSource", "is_in_memory", "resolve_memory"]

"""A model's config.json, read without importing transformers wherever that gives transformers' own values.

Importing a transformers config class takes about two seconds (it pulls in torch.distributed, generation, ...),
while the adapters need a dozen numbers. `LightConfig` answers each attribute from the JSON under its family's
rules (`config_families`), which mirror what the transformers 5 config class does with that field: its default,
its attribute_map aliases, the values its ``__post_init__`` derives (head_dim, num_key_value_heads, layer_types,
rope_parameters ...). Anything the rules do not cover -- a name they do not list, a value of another type, a legacy
form they do not model -- comes from the real transformers config, built once from the same folder.

transformers also validates the config when it builds it. The light path repeats the checks on what qkinspect
reads (types, heads dividing the width, layer_types, RoPE) by deferring when they fail, so such a config is refused
as before; a field qkinspect never reads is not checked.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from qkinspect.errors import CheckpointError
from qkinspect.loading.config_families import FAMILIES, SUB_MODEL_TYPES, defer_keys
from qkinspect.loading.config_rules import DEFER, Alias, quotient

# Families whose config class checks that the heads divide the width (validate_architecture); T5's checks its
# activation's spelling.
_DIVISIBLE = {"llama", "gemma2", "gemma3_text", "gpt_neox", "clip_text_model", "clip_vision_model", "deepseek_v2"}
_T5 = {"t5", "mt5", "umt5"}
_OWN = {"data", "family", "deferred", "_rules", "_make_real", "_real", "_lock", "_values", "_nested"}


class LightConfig:
    """A config.json's attributes as transformers would give them, read from the JSON where that is exact.

    Example:
        >>> cfg = LightConfig({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}, "llama",
        ...                   real=lambda: None)
        >>> cfg.head_dim, cfg.num_key_value_heads, cfg.rope_parameters
        (16, 4, {'rope_theta': 10000.0, 'rope_type': 'default'})
    """

    def __init__(self, data: dict, family: str, real: Callable[[], Any]):
        self.data = data
        self.family = family
        self._rules = FAMILIES[family]
        self._make_real = real
        self._real: Any = None
        self._lock = threading.Lock()
        self._values: dict[str, Any] = {}
        self._nested: dict[str, LightConfig] = {}
        self.deferred: set[str] = set()  # names answered by transformers (tests read this)
        if not self._valid():
            self.real()  # transformers refuses the config (CheckpointError), or knows better than these rules

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN:  # protocol names (copy, pickle), or not yet initialised
            raise AttributeError(name)
        value = self.value(name)
        if value is DEFER:
            self.deferred.add(name)
            return getattr(self.real(), name)
        return value

    def __repr__(self) -> str:
        return f"LightConfig({self.family}, {len(self.data)} keys)"

    def value(self, name: str) -> Any:
        """`name`'s value from the JSON and the family's rules, or DEFER; AttributeError where transformers' config
        has no such attribute."""
        if name == "model_type":
            return self.data.get("model_type", SUB_MODEL_TYPES.get(self.family, self.family))
        if name not in self._values:
            rule = self._rules.get(name)
            self._values[name] = DEFER if rule is None else _attempt(rule, self, name)
        found = self._values[name]
        if isinstance(found, AttributeError):
            raise AttributeError(name)
        return found

    def nested(self, name: str, family: str) -> Any:
        """A sub-config: a LightConfig over the JSON's dict (absent or None: the class defaults), else DEFER."""
        if name not in self._nested:
            sub = self.data.get(name)
            sub = {} if sub is None else sub
            if type(sub) is not dict or defer_keys(family) & set(sub):
                return DEFER
            self._nested[name] = LightConfig(sub, family, real=lambda: getattr(self.real(), name))
        return self._nested[name]

    @property
    def used_transformers(self) -> bool:
        """Whether the transformers config was built (for this config or, through a lookup, its parent)."""
        return self._real is not None

    def real(self) -> Any:
        """The transformers config, built on first need (thread-safe: the prefetch thread may ask too)."""
        with self._lock:
            if self._real is None:
                self._real = self._make_real()
            return self._real

    def _valid(self) -> bool:
        """Every rule answers (a value of the expected type, a layer_types list transformers accepts ...) and the
        class's own checks pass; False when one fails or cannot be decided here, and then transformers decides."""
        checks = [self._checked(n) for n, rule in self._rules.items() if not isinstance(rule, Alias)]
        if self.family in _DIVISIBLE:
            h, n = self.value("hidden_size"), self.value("num_attention_heads")
            checks.append(DEFER if quotient(self) is DEFER or h % n else h)
        if self.family in _T5:
            checks.append(t5_activation_ok(self.data.get("feed_forward_proj", "relu")))
        return all(c is not DEFER for c in checks)

    def _checked(self, name: str) -> Any:
        try:
            return self.value(name)
        except AttributeError:
            return None  # no such attribute: nothing for transformers to check


def _attempt(rule: Callable[[Any, str], Any], cfg: LightConfig, name: str) -> Any:
    """The rule's value, or the AttributeError it raised (kept, so a missing attribute stays missing)."""
    try:
        return rule(cfg, name)
    except AttributeError as e:
        return e


def t5_activation_ok(proj: Any) -> Any:
    """T5's feed_forward_proj must be "ACT" or "gated-ACT" (T5Config.validate_architecture); DEFER otherwise."""
    if type(proj) is not str:
        return DEFER
    parts = proj.split("-")
    return DEFER if (len(parts) > 1 and parts[0] != "gated") or len(parts) > 2 else True


def read_config(folder: Path, raw: dict) -> Any:
    """The config of `folder`, whose parsed config.json is `raw` (model_type already checked): a LightConfig where
    its family has rules and no key that only transformers can interpret, else the transformers config."""
    family = raw["model_type"]

    def real() -> Any:
        return transformers_config(folder)

    text_floats = "__float__" in str(raw)  # special-float tags, which transformers decodes
    if family not in FAMILIES or text_floats or defer_keys(family) & set(raw):
        return real()
    return LightConfig(raw, family, real)


def transformers_config(folder: Path) -> Any:
    """AutoConfig.from_pretrained on a local folder, never running remote code; its failures as CheckpointError."""
    from transformers import AutoConfig

    try:
        with quiet_transformers():
            return AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as e:
        raise CheckpointError(f"{folder / 'config.json'}: transformers cannot read this config ({e})") from None


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' log lines (``[transformers] Missing validation function ... rope_type``) while a config is
    built: what matters is said by qkinspect, once, or the config is refused with one line."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


__all__ = ["LightConfig", "quiet_transformers", "read_config", "transformers_config"]

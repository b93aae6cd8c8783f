"""How a transformers 5 config class turns config.json into the attributes qkinspect reads, one rule per field.

A rule is called as ``rule(cfg, name)`` on a `LightConfig` and returns the value transformers would give, raises
AttributeError where transformers' config has no such attribute, or returns `DEFER` where it does not know: then the
real transformers config answers. A rule never guesses: every form it does not model (a value of another type, a
legacy key, a RoPE type other than "default" and Llama 3's) is DEFER. The family table is in `config_families`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFER: Any = type("Defer", (), {"__repr__": lambda self: "DEFER"})()  # "ask transformers"
ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "ABSENT"})()  # the class has no such attribute

LAYER_KINDS = ("full_attention", "sliding_attention")
_KINDS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: type(v) is int,
    "bool": lambda v: type(v) is bool,
    "float": lambda v: type(v) is float,
    "num": lambda v: type(v) in (int, float),
    "str": lambda v: type(v) is str,
    "strs": lambda v: type(v) is list and all(type(x) is str for x in v),
    "any": lambda v: True,
}


def fits(value: Any, kind: str, nullable: bool = False) -> bool:
    """True when `value` is of `kind` ("int" excludes bool), or None where the field allows None."""
    return (value is None and nullable) or (value is not None and _KINDS[kind](value))


@dataclass(frozen=True)
class Field:
    """A field transformers keeps as the JSON gives it: the JSON value (of `kind`), else `default`.

    `default` ABSENT: the class has no such attribute, so it exists only when the JSON sets it (any JSON value is
    kept as given, None included). A value of another kind is DEFER: transformers may refuse it.
    """

    kind: str
    default: Any = ABSENT
    nullable: bool = False

    def __call__(self, cfg: Any, name: str) -> Any:
        if name in cfg.data:
            value = cfg.data[name]
            return value if fits(value, self.kind, self.nullable or self.default is ABSENT) else DEFER
        if self.default is ABSENT:
            raise AttributeError(name)
        return self.default


def absent(kind: str = "any") -> Field:
    return Field(kind)


@dataclass(frozen=True)
class Alias:
    """An ``attribute_map`` entry: the name reads `target`."""

    target: str

    def __call__(self, cfg: Any, name: str) -> Any:
        return cfg.value(self.target)


@dataclass(frozen=True)
class Popped:
    """A key transformers consumes into another field (rope_theta, partial_rotary_factor into rope_parameters):
    never an attribute of the config, whatever the JSON says."""

    def __call__(self, cfg: Any, name: str) -> Any:
        raise AttributeError(name)


@dataclass(frozen=True)
class OrElse:
    """A field whose None (its default, or the JSON's) ``__post_init__`` replaces by `fallback(cfg)`:
    num_key_value_heads -> num_attention_heads, head_dim -> hidden_size // num_attention_heads."""

    kind: str
    default: Any
    fallback: Callable[[Any], Any]

    def __call__(self, cfg: Any, name: str) -> Any:
        value = Field(self.kind, self.default, nullable=True)(cfg, name)
        return self.fallback(cfg) if value is None else value


@dataclass(frozen=True)
class Derived:
    """A value computed by a function of the config (`fn(cfg)`), for the few fields with their own logic."""

    fn: Callable[[Any], Any]

    def __call__(self, cfg: Any, name: str) -> Any:
        return self.fn(cfg)


@dataclass(frozen=True)
class Nested:
    """A sub-config (CLIP's text_config, MPT's attn_config): a dict, or absent/None for the class defaults."""

    family: str

    def __call__(self, cfg: Any, name: str) -> Any:
        return cfg.nested(name, self.family)


# -- derived values ---------------------------------------------------------------------------------------------


def ints(cfg: Any, *names: str) -> list[int] | None:
    """The named values when all are ints, else None (the caller defers)."""
    values = [cfg.value(n) for n in names]
    return values if all(type(v) is int for v in values) else None


def heads(cfg: Any) -> Any:
    v = ints(cfg, "num_attention_heads")
    return DEFER if v is None else v[0]


def quotient(cfg: Any) -> Any:
    """hidden_size // num_attention_heads (head_dim's default)."""
    v = ints(cfg, "hidden_size", "num_attention_heads")
    return DEFER if v is None or v[1] == 0 else v[0] // v[1]


def other(name: str) -> Callable[[Any], Any]:
    """The value of another field (T5's num_decoder_layers defaults to num_layers)."""
    return lambda cfg: cfg.value(name)


def falcon_head_dim(cfg: Any) -> Any:
    """FalconConfig.head_dim is a property; a JSON key of that name cannot be set on it (transformers fails)."""
    return DEFER if "head_dim" in cfg.data else quotient(cfg)


def window(off: Any) -> Callable[[Any], Any]:
    """Qwen2/Qwen3: sliding_window is kept only when use_sliding_window is set; else None (Qwen2-MoE: 0)."""

    def rule(cfg: Any) -> Any:
        use, size = cfg.value("use_sliding_window"), Field("int", 4096, nullable=True)(cfg, "sliding_window")
        return DEFER if DEFER in (use, size) else (size if use else off)

    return rule


def gemma3_window(cfg: Any) -> Any:
    """Gemma3 halves the window (plus one) for bidirectional attention."""
    size = Field("int", 4096, nullable=True)(cfg, "sliding_window")
    bidirectional = Field("bool", False, nullable=True)(cfg, "use_bidirectional_attention")
    if DEFER in (size, bidirectional) or (bidirectional and type(size) is not int):
        return DEFER
    return size // 2 + 1 if bidirectional else size


def pos_att_types(cfg: Any) -> Any:
    """DeBERTa's pos_att_type: a list as given, or the legacy "c2p|p2c" string split as its __post_init__ splits it."""
    value = cfg.data.get("pos_att_type")
    if type(value) is str:
        return [x.strip() for x in value.lower().split("|")]
    return value if value is None or fits(value, "strs") else DEFER


# -- layer types ------------------------------------------------------------------------------------------------

Pattern = Callable[[Any, int], Any]  # (cfg, layer) -> is that layer sliding (or DEFER)


def layer_types(pattern: Pattern | None) -> Derived:
    """`layer_types` as given (checked as transformers checks it), or, when absent or None, built from `pattern`.
    Without a pattern the class has no such field: absent means no attribute, None stays None."""

    def rule(cfg: Any) -> Any:
        given = cfg.data.get("layer_types")
        if given is not None:
            return checked_layer_types(cfg, given)
        if pattern is None:
            if "layer_types" in cfg.data:
                return None
            raise AttributeError("layer_types")
        n = ints(cfg, "num_hidden_layers")
        if n is None:
            return DEFER
        sliding = [pattern(cfg, i) for i in range(n[0])]
        return DEFER if DEFER in sliding else [LAYER_KINDS[bool(s)] for s in sliding]

    return Derived(rule)


def checked_layer_types(cfg: Any, given: Any) -> Any:
    """A stored layer_types list, when transformers would keep it unchanged and accept it: known kinds only (no
    legacy names to remap) and one per layer."""
    n = cfg.value("num_hidden_layers")
    ok = fits(given, "strs") and all(t in LAYER_KINDS for t in given) and type(n) is int and len(given) == n
    return list(given) if ok else DEFER


def every_other(cfg: Any, i: int) -> bool:
    """Gemma2: layers 0, 2, 4 ... slide."""
    return bool((i + 1) % 2)


def gemma3_pattern(cfg: Any, i: int) -> Any:
    """Gemma3: every `sliding_window_pattern`-th layer (default 6) is global."""
    p = cfg.data.get("sliding_window_pattern", 6)
    return DEFER if type(p) is not int or p == 0 else bool((i + 1) % p)


def modernbert_pattern(cfg: Any, i: int) -> Any:
    """ModernBERT: every `global_attn_every_n_layers`-th layer (default 3, from layer 0) is global."""
    every = cfg.data.get("global_attn_every_n_layers", 3)
    return DEFER if type(every) is not int or every == 0 else bool(i % every)


def qwen_pattern(cfg: Any, i: int) -> Any:
    """Qwen2/Qwen3: layers from max_window_layers on slide, when a window is in use."""
    size, first = cfg.value("sliding_window"), cfg.value("max_window_layers")
    if DEFER in (size, first) or type(first) is not int:
        return DEFER
    return size is not None and i >= first


def qwen2_moe_pattern(cfg: Any, i: int) -> Any:
    """Qwen2-MoE: every other layer below max_window_layers slides, when use_sliding_window is set."""
    use, first = cfg.value("use_sliding_window"), cfg.value("max_window_layers")
    if DEFER in (use, first) or type(first) is not int:
        return DEFER
    return bool((i + 1) % 2) and i < first and bool(use)


def neo_attention_layers(cfg: Any) -> Any:
    """GPT-Neo: attention_layers expanded from attention_types, unless the JSON stores attention_layers (set after
    the expansion, so it wins); one per layer, or transformers refuses the config."""
    types = cfg.data.get("attention_types") or [[["global", "local"], 12]]
    ok = type(types) is list and all(type(t) is list and len(t) == 2 and fits(t[0], "strs") and type(t[1]) is int
                                     for t in types)
    if not ok:
        return DEFER
    expanded = [kind for kinds, n in types for _ in range(n) for kind in kinds]
    layers = cfg.data.get("attention_layers", expanded)
    n = ints(cfg, "num_layers")
    return list(layers) if fits(layers, "strs") and n is not None and len(layers) == n[0] else DEFER


# -- RoPE -------------------------------------------------------------------------------------------------------

_ROPE_KEYS = frozenset({"rope_type", "rope_theta", "partial_rotary_factor"})
# Keys each modelled RoPE type requires besides those (transformers' _validate_<type>_rope_parameters).
SCALING_KEYS = {
    "default": frozenset(),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}),
}


def is_number(v: Any) -> bool:
    return type(v) in (int, float)


def standard_rope(d: Any, need_partial: bool = False, types: tuple[str, ...] = ("default",)) -> bool:
    """A dict in transformers 5's own form, which it keeps unchanged: a rope_type among `types` with exactly its
    keys (numbers), a rope_theta, and a partial_rotary_factor where the family always adds one."""
    if type(d) is not dict or d.get("rope_type") not in types:
        return False
    extra = SCALING_KEYS[d["rope_type"]]
    return (d.keys() <= _ROPE_KEYS | extra and all(is_number(d.get(k)) for k in extra | {"rope_theta"})
            and ("partial_rotary_factor" in d or not need_partial) and is_number(d.get("partial_rotary_factor", 1.0)))


def odd_full_rotation(cfg: Any, params: list[dict]) -> bool:
    """transformers refuses RoPE over a whole head of odd width > 4 (validate_rope)."""
    try:
        d = cfg.value("head_dim")
    except AttributeError:
        return False
    if d is DEFER:
        return True
    return type(d) is int and d > 4 and d % 2 == 1 and any(int(d * p.get("partial_rotary_factor", 1.0)) == d
                                                            for p in params)


@dataclass(frozen=True)
class Rope:
    """rope_parameters of a family with one set of RoPE parameters.

    Stored in the standard form (and no legacy key beside it): as stored. Absent or None (older configs): built as
    the family's convert_rope_params_to_dict builds it, from rope_scaling (None or a dict) with `theta` and
    `partial` (JSON key, default; partial default None: no partial_rotary_factor) filled in, and checked to be in
    the standard form. `types`: the RoPE types modelled (llama3 where the class keeps its
    original_max_position_embeddings as given). Any other form, and `legacy` keys beside a stored dict, defer.
    """

    theta: tuple[str, Any] = ("rope_theta", 10000.0)
    partial: tuple[str, Any] = ("partial_rotary_factor", None)
    legacy: tuple[str, ...] = ("rope_scaling", "rope_theta", "partial_rotary_factor")
    types: tuple[str, ...] = ("default",)

    def __call__(self, cfg: Any, name: str) -> Any:
        data = cfg.data
        stored = data.get("rope_parameters")
        if stored is None:
            out = self.from_legacy(data)
        elif standard_rope(stored, self.partial[1] is not None, self.types) and not any(k in data for k in self.legacy):
            out = dict(stored)
        else:
            out = DEFER
        return DEFER if out is DEFER or odd_full_rotation(cfg, [out]) else out

    def from_legacy(self, data: dict) -> Any:
        built_from = ("rope_scaling", self.theta[0], self.partial[0])
        scaling = data.get("rope_scaling")
        if any(k in data for k in self.legacy if k not in built_from) or type(scaling) not in (dict, type(None)):
            return DEFER
        out = dict(scaling or {})
        out.setdefault("rope_theta", data.get(*self.theta))
        partial = data.get(*self.partial)
        if partial is not None:
            out.setdefault("partial_rotary_factor", partial)
        out.setdefault("rope_type", "default")
        return out if standard_rope(out, self.partial[1] is not None, self.types) else DEFER


@dataclass(frozen=True)
class NestedRope:
    """rope_parameters per layer type (Gemma3, ModernBERT): {"full_attention": {...}, "sliding_attention": {...}}.

    Stored with both entries in the standard form: as stored. Absent or None: each entry's rope_theta from its
    legacy key (`full`, `sliding`: JSON key, default). Any other form defers.
    """

    full: tuple[str, Any]
    sliding: tuple[str, Any]
    legacy: tuple[str, ...] = ()

    def __call__(self, cfg: Any, name: str) -> Any:
        data = cfg.data
        kinds = cfg.value("layer_types")
        if not (type(kinds) is list and kinds) or data.get("rope_scaling") is not None:
            return DEFER  # no layer types: transformers would read the dict as one flat set of parameters
        stored = data.get("rope_parameters")
        if stored is not None:
            ok = type(stored) is dict and sorted(stored) == sorted(LAYER_KINDS) and all(
                standard_rope(p) for p in stored.values()) and not any(k in data for k in self.all_legacy)
            return {k: dict(p) for k, p in stored.items()} if ok and not odd_full_rotation(
                cfg, list(stored.values())) else DEFER
        if any(k in data for k in self.legacy):
            return DEFER
        thetas = {"sliding_attention": data.get(*self.sliding), "full_attention": data.get(*self.full)}
        if not all(is_number(t) for t in thetas.values()):
            return DEFER
        out = {k: {"rope_type": "default", "rope_theta": t} for k, t in thetas.items()}
        return DEFER if odd_full_rotation(cfg, list(out.values())) else out

    @property
    def all_legacy(self) -> tuple[str, ...]:
        return (*self.legacy, "rope_scaling", self.full[0], self.sliding[0])

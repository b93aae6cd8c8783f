"""CLIP: a text tower and a vision tower, both pre-LN encoders, as two blocks labelled "text" and "vision"."""

from __future__ import annotations

from typing import Any, ClassVar

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import ProjectionAdapter, Projections, self_attention_spec
from qkinspect.loading.adapters.registry import register


def _tower(label: str, c: Any) -> BlockSpec:
    return self_attention_spec("encoder", c.num_hidden_layers, c.num_attention_heads, c.hidden_size, label=label)


class ClipTowers(ProjectionAdapter):
    """Each tower's layer i reads its own ``layer_norm1``. Blocks are keyed "text" and "vision"
    (BlockSpec.label): both are encoders, of different widths. A two-tower checkpoint names its towers'
    tensors ``text_model.`` and ``vision_model.``; a one-tower checkpoint names them without (transformers 5)
    or with that prefix (earlier versions), which the tensor source's prefix search finds."""

    tower_prefix: ClassVar[dict[str, str]] = {"text": "", "vision": ""}

    def towers(self) -> dict[str, Any]:
        raise NotImplementedError

    def blocks(self) -> list[BlockSpec]:
        return [_tower(label, cfg) for label, cfg in self.towers().items()]

    def projections(self, block: str, layer: int) -> Projections:
        p = f"{self.tower_prefix[block]}encoder.layers.{layer}"
        a = f"{p}.self_attn"
        return Projections(f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj", f"{a}.out_proj", f"{p}.layer_norm1")


@register
class ClipAdapter(ClipTowers):
    model_types = ("clip",)
    tower_prefix = {"text": "text_model.", "vision": "vision_model."}

    def towers(self) -> dict[str, Any]:
        return {"text": self.config.text_config, "vision": self.config.vision_config}


@register
class ClipTextAdapter(ClipTowers):
    model_types = ("clip_text_model",)

    def towers(self) -> dict[str, Any]:
        return {"text": self.config}


@register
class ClipVisionAdapter(ClipTowers):
    model_types = ("clip_vision_model",)

    def towers(self) -> dict[str, Any]:
        return {"vision": self.config}

"""ALBERT: one set of attention weights read by every layer (cross-layer sharing)."""

from __future__ import annotations

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import ProjectionAdapter, Projections, self_attention_spec
from qkinspect.loading.adapters.registry import register


@register
class AlbertAdapter(ProjectionAdapter):
    """ALBERT applies `num_hidden_layers` times a group of `inner_group_num` layers; group g of
    `num_hidden_groups` serves the layers i with int(i / (num_hidden_layers / num_hidden_groups)) == g.
    Every applied layer is a record; `source_layer` names the first one that reads the same tensors.

    d_model is the hidden size: the embeddings (of `embedding_size`) are normalised and then projected,
    so layer 0's input has no LayerNorm directly before it (norm None); later layers read the previous
    ALBERT layer's ``full_layer_layer_norm`` (post-LN).
    """

    model_types = ("albert",)

    def _weights(self, layer: int) -> tuple[int, int]:
        """(group, layer within the group) whose tensors applied layer `layer` reads."""
        c = self.config
        outer, inner = divmod(layer, c.inner_group_num)
        return int(outer / (c.num_hidden_layers / c.num_hidden_groups)), inner

    def _n_layers(self) -> int:
        return self.config.num_hidden_layers * self.config.inner_group_num

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        distinct = c.num_hidden_groups * c.inner_group_num
        return [self_attention_spec("encoder", self._n_layers(), c.num_attention_heads, c.hidden_size,
                                    shared_layers=distinct < self._n_layers())]

    def _prefix(self, layer: int) -> str:
        g, k = self._weights(layer)
        return f"encoder.albert_layer_groups.{g}.albert_layers.{k}"

    def projections(self, block: str, layer: int) -> Projections:
        a = f"{self._prefix(layer)}.attention"
        norm = None if layer == 0 else f"{self._prefix(layer - 1)}.full_layer_layer_norm"
        return Projections(f"{a}.query", f"{a}.key", f"{a}.value", f"{a}.dense", norm)

    def source_layer(self, block: str, layer: int) -> int | None:
        w = self._weights(layer)
        return next(i for i in range(layer + 1) if self._weights(i) == w)

"""OLMo2: Llama's tensor names, no norm before attention (its norms follow attention and the MLP), and q/k
RMSNorm over the *whole* projection rather than per head.

    layers.{i}.self_attn.q_norm.weight   (H*d,)   one RMSNorm over all H*d query values of a token
    layers.{i}.self_attn.k_norm.weight   (G*d,)

Canonical form: RMSNorm(q)[h] = (x W_Q[h]) * gain[h] / rms(x W_Q), where rms runs over every head. The divisor
is one positive number per token, common to all heads, so per head the bilinear form is
W_Q[h] diag(gain_q[h] gain_k[g(h)]) W_K[g(h)]^T times a per-token temperature. The gains are kept as (H, d) and
(G, d) in `q_norm` / `k_norm`, and `extra["qk_norm_scope"] == "projection"` records that the RMS is shared.
"""

from __future__ import annotations

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register


@register
class Olmo2Adapter(SplitProjectionAdapter):
    """OLMo2: q/k norms over the projection (gains reshaped (H*d,) -> (H, d)); attention reads the raw
    residual stream, so `norm_q` is None.

    Example:
        >>> with open_model("path/to/olmo2") as m:  # doctest: +SKIP
        ...     next(m.layers()).q_norm.shape  # (n_heads, d_head)
    """

    model_types = ("olmo2",)
    norm_path = None
    qk_norm_paths = ("q_norm", "k_norm")
    qk_norm_scope = "projection"

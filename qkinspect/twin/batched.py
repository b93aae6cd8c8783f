"""A batched twin: R runs of one shape as one model whose tensors carry a leading run axis, and whose layers are
batched matrix products over it (docs/twin.md, "Stacked training").

It reproduces what transformers' `LlamaForCausalLM` and `GPT2LMHeadModel` compute for the twins' configs
(`qkinspect.twin.model.config_for`): llama's RMSNorm, rotary positions (default rope), causal attention, SwiGLU MLP
and untied (or tied) output; GPT-2's learned positions, LayerNorm, fused q/k/v with biases, tanh GELU and tied
output. transformers' own modules are not vmapped (their attention-mask code breaks under `torch.func.vmap`).

Each run starts from the very tensors the single-run twin draws: `Stacked.from_built` reads them from each run's
`qkinspect.twin.model.Built` (transformers' initialisation, the constraint's form already on it). A constraint is a
`Form`: the attention tensors it trains and one small function computing the ones the attention reads from them,
on the stacked tensors (e.g. share_qk: q := k). Adding a constraint is one entry in `FORMS`.

Internal layout, per run: a projection as `x @ W` (in, out): llama's Linear weight transposed, GPT-2's Conv1D as
is; the attention's q, k, v (D, H·d) and o (H·d, D); biases (H·d).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

Tensors = dict[str, Tensor]


@dataclass(frozen=True)
class Form:
    """A constraint on one layer's attention tensors: `free`, the ones it trains (biases where the model has them);
    `apply(t)`, the q, k, v (and biases) the attention reads, from the free ones and the form's buffers (each with
    the leading run axis); `attention`: standard, reformer or bilinear."""

    free: tuple[str, ...]
    apply: Callable[[Tensors], Tensors]
    attention: str = "standard"
    extras: tuple[str, ...] = ()  # buffers or free tensors read from the single-run form (`_extras`)


def _tie_qk(t: Tensors) -> Tensors:
    return {**t, "q": t["k"], **({"bq": t["bk"]} if "bk" in t else {})}


def _symmetric(t: Tensors) -> Tensors:
    s = t["signs"]  # (R, H·d) ±1 per column, fixed
    out = {**t, "q": t["k"] * s.unsqueeze(1)}
    if "bk" in t:
        out["bq"] = t["bk"] * s
    return out


def _share_qkv(t: Tensors) -> Tensors:
    return {**_tie_qk(t), "v": t["k"]}


def _share_kv(t: Tensors) -> Tensors:
    return {**t, "k": t["v"], **({"bk": t["bv"]} if "bv" in t else {})}


def _rank(t: Tensors) -> Tensors:
    q, R, D = t["q"], t["q"].shape[0], t["q"].shape[1]
    H, d = t["free_cols"].shape[1:]
    heads = q.view(R, D, H, d).permute(0, 2, 1, 3) * t["free_cols"].unsqueeze(2)  # (R, H, D, d): kept pairs free
    real = t["real_cols"][0]  # (k0,) the same columns for every run
    if real.numel():
        factor = (t["A"] * t["kept_dirs"].unsqueeze(2)) @ t["C"]  # (R, H, D, kmax) @ (R, H, kmax, k0)
        heads = heads.index_copy(-1, real, factor)
    return {**t, "q": heads.permute(0, 2, 1, 3).reshape(R, D, H * d)}


def _identity(t: Tensors) -> Tensors:
    k = t["k"]
    R, D = k.shape[:2]
    out = {**t, "q": torch.eye(D, dtype=k.dtype, device=k.device).expand(R, D, D)}
    if "bk" in t:
        out["bq"] = torch.zeros_like(t["bk"])
    return out


FORMS: dict[str, Form] = {
    "standard": Form(("q", "k", "v", "bq", "bk", "bv"), lambda t: t),
    "share_qk": Form(("k", "v", "bk", "bv"), _tie_qk),
    "share_qk_reformer": Form(("k", "v", "bk", "bv"), _tie_qk, "reformer"),
    "symmetric": Form(("k", "v", "bk", "bv"), _symmetric, extras=("signs",)),
    "share_qkv": Form(("k", "bk", "bv"), _share_qkv),
    "share_kv": Form(("q", "v", "bq", "bv"), _share_kv),
    "rank": Form(("q", "k", "v", "bq", "bk", "bv", "A", "C"), _rank,
                 extras=("A", "C", "free_cols", "kept_dirs", "real_cols")),
    "wq_identity": Form(("k", "v", "bk", "bv"), _identity),
    "bilinear": Form(("v", "bv", "qk"), lambda t: t, "bilinear"),
}


def supported(cfg) -> str | None:
    """Why the batched model cannot reproduce transformers' model of `cfg` (None: it can)."""
    if cfg.model_type == "llama":
        rope = getattr(cfg, "rope_parameters", None) or {}
        checks = {"grouped-query attention": cfg.num_key_value_heads != cfg.num_attention_heads,
                  "attention or MLP biases": bool(cfg.attention_bias or cfg.mlp_bias),
                  f"activation {cfg.hidden_act}": cfg.hidden_act != "silu",
                  "a scaled rope": rope.get("rope_type", "default") != "default",
                  "a head size other than d_model / heads":
                      getattr(cfg, "head_dim", None) not in (None, cfg.hidden_size // cfg.num_attention_heads)}
    elif cfg.model_type == "gpt2":
        checks = {f"activation {cfg.activation_function}": cfg.activation_function != "gelu_new",
                  "unscaled attention": not cfg.scale_attn_weights,
                  "attention scaled by layer": bool(cfg.scale_attn_by_inverse_layer_idx)}
    else:
        return f"model type {cfg.model_type}"
    why = [k for k, bad in checks.items() if bad]
    return ", ".join(why) or None


def _heads(cfg) -> tuple[int, int, int]:
    """(d_model, heads, head size)."""
    D = cfg.hidden_size if cfg.model_type == "llama" else cfg.n_embd
    H = cfg.num_attention_heads
    return D, H, D // H


def _layers(cfg) -> int:
    return cfg.num_hidden_layers


def to_internal(cfg, sd: Tensors) -> Tensors:
    """One run's tensors under the internal names, from its transformers state dict (weights as the modules read
    them: the constraint applied)."""
    D, _, _ = _heads(cfg)
    out: Tensors = {}
    if cfg.model_type == "llama":
        out["emb"] = sd["model.embed_tokens.weight"]
        out["norm"] = sd["model.norm.weight"]
        if not cfg.tie_word_embeddings:
            out["head"] = sd["lm_head.weight"].T
        for i in range(_layers(cfg)):
            p = f"model.layers.{i}."
            out[f"{i}.ln1"] = sd[p + "input_layernorm.weight"]
            out[f"{i}.ln2"] = sd[p + "post_attention_layernorm.weight"]
            for a in ("q", "k", "v", "o"):
                out[f"{i}.{a}"] = sd[f"{p}self_attn.{a}_proj.weight"].T
            for a in ("gate", "up", "down"):
                out[f"{i}.{a}"] = sd[f"{p}mlp.{a}_proj.weight"].T
        return {k: v.contiguous() for k, v in out.items()}
    out["emb"] = sd["transformer.wte.weight"]
    out["pos"] = sd["transformer.wpe.weight"]
    out["lnfw"], out["lnfb"] = sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]
    if not cfg.tie_word_embeddings:
        out["head"] = sd["lm_head.weight"].T
    for i in range(_layers(cfg)):
        p = f"transformer.h.{i}."
        for n in ("ln_1", "ln_2"):
            out[f"{i}.{n}w"], out[f"{i}.{n}b"] = sd[f"{p}{n}.weight"], sd[f"{p}{n}.bias"]
        w, b = sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"]
        for j, a in enumerate("qkv"):
            out[f"{i}.{a}"], out[f"{i}.b{a}"] = w[:, j * D:(j + 1) * D], b[j * D:(j + 1) * D]
        out[f"{i}.o"], out[f"{i}.bo"] = sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"]
        out[f"{i}.fc"], out[f"{i}.bfc"] = sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"]
        out[f"{i}.proj"], out[f"{i}.bproj"] = sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"]
    return {k: v.contiguous() for k, v in out.items()}


def to_state(cfg, t: Tensors) -> Tensors:
    """One run's transformers state dict (the names `qkinspect.twin.model.state_tensors` writes) from its
    internal tensors (`to_internal`'s inverse; a bilinear run's q and k are its pinned zeros, its W_QK `qk`)."""
    D, H, _ = _heads(cfg)
    sd: Tensors = {}

    def qk(i: int, a: str) -> Tensor:
        like = t[f"{i}.bv"] if a.startswith("b") else t[f"{i}.v"]  # a bilinear run's pinned zeros
        return t.get(f"{i}.{a}", torch.zeros_like(like))

    if cfg.model_type == "llama":
        sd["model.embed_tokens.weight"] = t["emb"]
        for i in range(_layers(cfg)):
            p = f"model.layers.{i}."
            for a in ("q", "k", "v", "o"):
                sd[f"{p}self_attn.{a}_proj.weight"] = qk(i, a).T
            if f"{i}.qk" in t:
                sd[p + "self_attn.qk"] = t[f"{i}.qk"]
            for a in ("gate", "up", "down"):
                sd[f"{p}mlp.{a}_proj.weight"] = t[f"{i}.{a}"].T
            sd[p + "input_layernorm.weight"] = t[f"{i}.ln1"]
            sd[p + "post_attention_layernorm.weight"] = t[f"{i}.ln2"]
        sd["model.norm.weight"] = t["norm"]
        sd["lm_head.weight"] = t["head"].T if "head" in t else t["emb"]
    else:
        sd["transformer.wte.weight"], sd["transformer.wpe.weight"] = t["emb"], t["pos"]
        for i in range(_layers(cfg)):
            p = f"transformer.h.{i}."
            sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = t[f"{i}.ln_1w"], t[f"{i}.ln_1b"]
            sd[p + "attn.c_attn.weight"] = torch.cat([qk(i, "q"), qk(i, "k"), t[f"{i}.v"]], 1)
            sd[p + "attn.c_attn.bias"] = torch.cat([qk(i, "bq"), qk(i, "bk"), t[f"{i}.bv"]])
            sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = t[f"{i}.o"], t[f"{i}.bo"]
            if f"{i}.qk" in t:
                sd[p + "attn.qk"] = t[f"{i}.qk"]
            sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = t[f"{i}.ln_2w"], t[f"{i}.ln_2b"]
            sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = t[f"{i}.fc"], t[f"{i}.bfc"]
            sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = t[f"{i}.proj"], t[f"{i}.bproj"]
        sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = t["lnfw"], t["lnfb"]
        sd["lm_head.weight"] = t["head"].T if "head" in t else t["emb"]
    return {k: v.contiguous() for k, v in sd.items()}


ATTENTION = {"q", "k", "v", "bq", "bk", "bv", "A", "C", "qk", "signs", "free_cols", "kept_dirs", "real_cols"}


def _extras(built, i: int, t: Tensors, form: Form) -> Tensors:
    """The form's tensors of layer `i` that are not module weights, from the single-run twin's own form."""
    out: Tensors = {}
    if "signs" in form.extras:  # W_Q = W_K diag(s): s from the weights (+1 on zero columns, as the edit's)
        out["signs"] = torch.where((t["q"].double() * t["k"].double()).sum(0) < 0, -1.0, 1.0).float()
    if "A" in form.extras:
        f = built.forms[i]
        out.update(A=f.A.detach().float().clone(), C=f.C.detach().float().clone(),
                   free_cols=f.free_cols.float().clone(), kept_dirs=f.kept_dirs.float().clone(),
                   real_cols=f.real_cols.clone())
    if form.attention == "bilinear":
        attn = built.model.get_submodule(f"model.layers.{i}.self_attn" if built.model.config.model_type == "llama"
                                         else f"transformer.h.{i}.attn")
        out["qk"] = attn.qk.detach().float().clone()
    return out


@dataclass
class Group:
    """Runs of one form in a stack: their positions `runs` (a contiguous range), their attention tensors."""

    form: str
    runs: range
    free: dict[str, nn.Parameter] = field(default_factory=dict)  # "i.k" -> (R_g, ...)
    buffers: Tensors = field(default_factory=dict)


class Stacked(nn.Module):
    """R twins of one shape as one model: `forward(x)` the per-run next-token losses of windows x (R, B, T + 1)."""

    def __init__(self, cfg, forms: list[str], tensors: list[Tensors]):
        super().__init__()
        self.cfg, self.arch = cfg, cfg.model_type
        self.R = len(forms)
        self.L = _layers(cfg)
        self.D, self.H, self.d = _heads(cfg)
        kinds = {FORMS[f].attention for f in forms}
        if len(kinds) != 1:
            raise ValueError(f"one stack holds one attention kind, not {sorted(kinds)}")
        self.attention = kinds.pop()
        self.groups: list[Group] = []
        for f in forms:
            if not self.groups or self.groups[-1].form != f:
                start = sum(len(g.runs) for g in self.groups)
                self.groups.append(Group(f, range(start, start + 1)))
            else:
                g = self.groups[-1]
                g.runs = range(g.runs.start, g.runs.stop + 1)
        if len({g.form for g in self.groups}) != len(self.groups):
            raise ValueError("a stack's runs are ordered by form")
        shared = [k for k in tensors[0] if k.partition(".")[2] not in ATTENTION and k not in ATTENTION]
        self.shared = nn.ParameterDict({_key(k): nn.Parameter(torch.stack([t[k] for t in tensors]))
                                        for k in shared})
        self.free = nn.ParameterDict()
        for n, g in enumerate(self.groups):
            form = FORMS[g.form]
            for i in range(self.L):
                for a in form.free:
                    if f"{i}.{a}" in tensors[g.runs[0]]:
                        p = nn.Parameter(torch.stack([tensors[r][f"{i}.{a}"] for r in g.runs]))
                        g.free[f"{i}.{a}"] = p
                        self.free[_key(f"g{n}.{i}.{a}")] = p
                for a in form.extras:
                    if a not in form.free:
                        buf = torch.stack([tensors[r][f"{i}.{a}"] for r in g.runs])
                        self.register_buffer(_key(f"g{n}.{i}.{a}"), buf)
                        g.buffers[f"{i}.{a}"] = buf
        self._once: dict[tuple[str, int, str], Tensor] = {}
        self.fused: bool | None = None

    @classmethod
    def from_built(cls, runs: list[tuple[str, object]]) -> Stacked:
        """The stack of `runs` ((form, Built) each, ordered by form), from each run's own initial tensors."""
        from qkinspect.twin.model import state_tensors

        cfg = runs[0][1].model.config
        tensors = []
        for form, built in runs:
            t = to_internal(cfg, state_tensors(built.model))
            for i in range(_layers(cfg)):
                t.update({f"{i}.{k}": v for k, v in _extras(built, i, {a: t[f"{i}.{a}"] for a in "qk"},
                                                           FORMS[form]).items()})
                if FORMS[form].attention == "bilinear":
                    for a in ("q", "k", "bq", "bk"):
                        t.pop(f"{i}.{a}", None)
            tensors.append(t)
        return cls(cfg, [f for f, _ in runs], tensors)

    # ---- the tensors the layers read

    def _buffer(self, g: Group, name: str) -> Tensor:
        return g.buffers[name]

    def attention_tensors(self, i: int) -> Tensors:
        """Layer i's q, k, v (and biases) as the attention reads them, each (R, ...): every group's form applied,
        in run order."""
        parts = []
        for g in self.groups:
            t = {k.partition(".")[2]: v for k, v in {**g.free, **g.buffers}.items() if k.startswith(f"{i}.")}
            parts.append(FORMS[g.form].apply(t))
        if len(parts) == 1:
            return parts[0]
        names = [n for n in ("q", "k", "v", "bq", "bk", "bv") if n in parts[0]]
        return {n: torch.cat([p[n] for p in parts]) for n in names}

    def run_tensors(self, r: int) -> Tensors:
        """Run r's internal tensors now (the constraint applied), detached: what `to_state` saves."""
        out: Tensors = {}
        with torch.no_grad():
            for k, p in self.shared.items():
                out[_unkey(k)] = p[r].detach()
            g = next(g for g in self.groups if r in g.runs)
            j = r - g.runs.start
            for i in range(self.L):
                t = {k.partition(".")[2]: v for k, v in {**g.free, **g.buffers}.items() if k.startswith(f"{i}.")}
                full = FORMS[g.form].apply(t)
                for a in ("q", "k", "v", "bq", "bk", "bv", "qk"):
                    if a in full:
                        out[f"{i}.{a}"] = full[a][j].detach()
        return out

    # ---- the forward

    def forward(self, x: Tensor) -> Tensor:
        """Per-run mean next-token cross-entropy (R,) of windows x (R, B, T + 1): inputs x[..., :-1]."""
        inputs, targets = x[..., :-1], x[..., 1:]
        logits = self.logits(inputs)  # (R, B, T, V)
        V = logits.shape[-1]
        ce = nn.functional.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1), reduction="none")
        return ce.view(self.R, -1).mean(1)

    def logits(self, x: Tensor) -> Tensor:
        R, B, T = x.shape
        s = self.shared
        V = s["emb"].shape[1]
        offsets = (torch.arange(R, device=x.device) * V).view(R, 1, 1)
        h = s["emb"].reshape(R * V, -1).index_select(0, (x + offsets).reshape(-1)).view(R, B, T, self.D)
        if self.arch == "gpt2":
            h = h + s["pos"][:, :T].unsqueeze(1)
        for i in range(self.L):
            a = self.attention_tensors(i)
            if self.arch == "llama":
                n = _rms(h, s[_key(f"{i}.ln1")], self.cfg.rms_norm_eps)
                h = h + self._attend(n, a, i)
                n = _rms(h, s[_key(f"{i}.ln2")], self.cfg.rms_norm_eps)
                gate, up = _mm(n, s[_key(f"{i}.gate")]), _mm(n, s[_key(f"{i}.up")])  # no slices of one product
                h = h + _mm(nn.functional.silu(gate) * up, s[_key(f"{i}.down")])
            else:
                eps = self.cfg.layer_norm_epsilon
                n = _ln(h, s[_key(f"{i}.ln_1w")], s[_key(f"{i}.ln_1b")], eps)
                h = h + self._attend(n, a, i)
                n = _ln(h, s[_key(f"{i}.ln_2w")], s[_key(f"{i}.ln_2b")], eps)
                f = nn.functional.gelu(_mm(n, s[_key(f"{i}.fc")], s[_key(f"{i}.bfc")]), approximate="tanh")
                h = h + _mm(f, s[_key(f"{i}.proj")], s[_key(f"{i}.bproj")])
        if self.arch == "llama":
            h = _rms(h, s["norm"], self.cfg.rms_norm_eps)
        else:
            h = _ln(h, s["lnfw"], s["lnfb"], self.cfg.layer_norm_epsilon)
        head = s["head"] if "head" in s else s["emb"].transpose(1, 2)
        return _mm(h, head)

    def fused_attention(self, device) -> bool:
        """Whether standard attention goes through torch's fused kernel (scaled_dot_product_attention): on a GPU;
        on the CPU two batched products a head are faster at the twins' sizes (docs/twin.md, "Stacked
        training"). `fused` set to True or False overrides it (tests)."""
        return self.fused if self.fused is not None else torch.device(device).type != "cpu"

    def _built(self, what: str, T: int, device) -> Tensor:
        """What the forward reads that depends only on the context T and the device, built once: the rotary
        factors, the interleaving of each head's rotary pairs, the attention masks."""
        key = (what, T, str(device))
        if key not in self._once:
            self._once[key] = _once(what, T, device, self.H, self.d, self.cfg)
        return self._once[key]

    def _attend(self, n: Tensor, a: Tensors, i: int) -> Tensor:
        R, B, T, D = n.shape
        H, d = self.H, self.d
        s = self.shared
        if self.attention == "bilinear":
            v = _mm(n, a["v"], a.get("bv")).view(R, B, T, H, d).transpose(2, 3)
            scores = (n.unsqueeze(2) @ a["qk"].unsqueeze(1)) @ n.transpose(-1, -2).unsqueeze(2)  # (R, B, H, T, T)
            out = _softmax_attend(scores / math.sqrt(d), v, self._built("causal", T, n.device))
            out = out.transpose(2, 3).reshape(R, B, T, H * d)
        else:
            tied = a["q"] is a["k"] and a.get("bq") is a.get("bk")  # share_qk: one projection serves both
            wq, wk = a["q"], a["k"]
            if self.arch == "llama":  # each head's rotary pairs (j, j + d/2) side by side: one complex product
                pairs = self._built("pairs", T, n.device)
                wk = wk.index_select(-1, pairs)
                wq = wk if tied else wq.index_select(-1, pairs)
            k = _mm(n, wk, a.get("bk")).view(R, B, T, H, d)
            q = k if tied else _mm(n, wq, a.get("bq")).view(R, B, T, H, d)
            v = _mm(n, a["v"], a.get("bv")).view(R, B, T, H, d)
            if self.arch == "llama":
                turn = self._built("rotary", T, n.device)  # (T, 1, d/2, 2): cos, sin
                k = _rotary(k, turn)
                q = k if tied else _rotary(q, turn)
            if self.attention == "reformer":
                k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-6)
                mask = self._built("without_self bias", T, n.device)
            else:
                mask = self._built("causal bias", T, n.device)
            if self.attention == "standard" and self.fused_attention(n.device):
                q, k, v = (t.transpose(2, 3).reshape(R * B, H, T, d) for t in (q, k, v))
                out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                out = out.view(R, B, H, T, d).transpose(2, 3).reshape(R, B, T, H * d)
            else:
                out = _attention(q, k, v, mask, 1 / math.sqrt(d))  # (R, B, T, H * d)
        return _mm(out, s[_key(f"{i}.o")], s[_key(f"{i}.bo")] if _key(f"{i}.bo") in s else None)


def _key(name: str) -> str:
    return name.replace(".", "__")


def _unkey(key: str) -> str:
    return key.replace("__", ".")


def _mm(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x (R, ..., in) @ w (R, in, out) (+ b (R, out)), one batched matrix product over the runs."""
    R, shape = x.shape[0], x.shape[1:-1]
    y = torch.bmm(x.reshape(R, -1, x.shape[-1]), w) if b is None else \
        torch.baddbmm(b.unsqueeze(1), x.reshape(R, -1, x.shape[-1]), w)
    return y.view(R, *shape, w.shape[-1])


def _rms(h: Tensor, w: Tensor, eps: float) -> Tensor:
    """llama's RMSNorm (in float32, then the input's dtype, times each run's weight w (R, D))."""
    if h.dtype != torch.float32:
        f = h.float()
        f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)
        return _per_run(w, h) * f.to(h.dtype)
    return _RMSNorm.apply(h, w, eps)


class _RMSNorm(torch.autograd.Function):
    """RMSNorm of float32 h with its backward written out: x·r·w with r = (mean x² + eps)^-1/2; the input's
    gradient r·(g_n − n·mean(g_n·n)) with n = x·r and g_n = g·w (fewer passes over the activations than
    autograd's chain of pow, mean, rsqrt and products)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, eps: float) -> Tensor:
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        n = x * r
        wv = _per_run(w, x)
        ctx.save_for_backward(n, r, wv)
        return n * wv

    @staticmethod
    def backward(ctx, g: Tensor):
        n, r, wv = ctx.saved_tensors
        gw = (g * n).reshape(g.shape[0], -1, g.shape[-1]).sum(1)
        gn = g * wv
        gx = torch.addcmul(gn, n, (gn * n).mean(-1, keepdim=True), value=-1).mul_(r)
        return gx, gw, None


def _per_run(w: Tensor, like: Tensor) -> Tensor:
    """Each run's vector w (R, D) broadcast over `like` (R, ..., D)."""
    return w.view(w.shape[0], *([1] * (like.dim() - 2)), -1)


def _ln(h: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """GPT-2's LayerNorm: torch's own (normalised in float32), then each run's weight and bias."""
    f = nn.functional.layer_norm(h.float(), h.shape[-1:], eps=eps).to(h.dtype)
    return torch.addcmul(_per_run(b, h), f, _per_run(w, h))


def _once(what: str, T: int, device, H: int, d: int, cfg) -> Tensor:
    if what == "pairs":  # column order of q and k: head h's pair j at (2j, 2j + 1), from (j, j + d/2)
        j = torch.arange(d // 2, device=device)
        one = torch.stack([j, j + d // 2], -1).reshape(-1)
        return (one + d * torch.arange(H, device=device).unsqueeze(1)).reshape(-1)
    if what == "rotary":  # llama's default rope: position t turns pair j by t * theta^(-2j/d)
        theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or \
            getattr(cfg, "rope_theta", None) or 10000.0
        inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
        freqs = torch.arange(T, device=device).float()[:, None] * inv[None, :]
        return torch.stack([freqs.cos(), freqs.sin()], -1).view(T, 1, d // 2, 2)
    mask, _, additive = what.partition(" ")  # "causal", "without_self", or either with " bias"
    allowed = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    if mask == "without_self":  # the Reformer's: causal, without a position's own key unless it sees no other
        allowed[1:] &= ~torch.eye(T, dtype=torch.bool, device=device)[1:]
    if additive:  # 0 where allowed, -inf elsewhere: added to the scores
        return torch.zeros(T, T, device=device).masked_fill_(~allowed, float("-inf"))
    return allowed


def _rotary(x: Tensor, turn: Tensor) -> Tensor:
    """Rotary positions on x (R, B, T, H, d) whose rotary pairs are side by side: each pair a complex number
    times its position's turn (cos, sin) (T, 1, d/2, 2): x_j cos - x_j' sin, x_j' cos + x_j sin, transformers'
    rotate_half. One complex product; under torch.compile the same in real numbers (inductor writes no code
    for complex ones, and fuses these)."""
    shape = x.shape
    pairs = x.reshape(*shape[:-1], -1, 2)
    if torch.compiler.is_compiling():
        a, b, c, s = pairs[..., 0], pairs[..., 1], turn[..., 0], turn[..., 1]
        return torch.stack([a * c - b * s, b * c + a * s], -1).view(shape)
    return torch.view_as_real(torch.view_as_complex(pairs) * torch.view_as_complex(turn)).view(shape)


def _attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
    """Softmax attention of q, k, v (R, B, T, H, d) with the additive mask `bias` (T, T: 0 or -inf), each head as
    two batched products over the runs and windows, on views of the projections (no copy into a head-major
    layout; the heads split by `unbind`, whose backward is one `stack`); the heads' outputs side by side
    (R, B, T, H * d)."""
    R, B, T, H, d = q.shape
    qs = q.unbind(3)
    ks = qs if k is q else k.unbind(3)
    outs = []
    for qh, kh, vh in zip(qs, ks, v.unbind(3), strict=True):
        qh, kh, vh = (t.reshape(R * B, T, d) for t in (qh, kh, vh))
        scores = torch.baddbmm(bias, qh, kh.transpose(1, 2), alpha=scale)
        outs.append(torch.softmax(scores, dim=-1, dtype=torch.float32).to(vh.dtype) @ vh)
    return torch.stack(outs, 2).view(R, B, T, H * d)


def _softmax_attend(scores: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype) @ v

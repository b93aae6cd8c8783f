"""`qkinspect.directions`: each head's top singular directions of W_OV and W_QK, read as tokens (docs/directions.md).

For every selected head (query head h reads key/value head h // (H / H_kv), never tiled), the SVD of W_OV = W_V W_O
and W_QK = W_Q W_Kᵀ comes from the factors (`metrics.directions.factored_svd`: QR, then the d × d core). Each side
is scored against a token matrix: W_OV's write side against the unembedding with the final norm's gain γ folded in
((γ ∘ w_t) · v), W_OV's read side and both sides of W_QK against the token embedding (e_t · u). A layer's
directions are scored together, one (V, D) × (D, m) product per token matrix. Only the embedding, the unembedding
(when not tied) and the final norm gain are read beside the attention layers (a GGUF dequantises only those).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from qkinspect.directions.request import LIBRARY_NAMES, DirectionsRequest, check_model, check_request
from qkinspect.directions.results import DirectionRecord, DirectionsResult, Readout
from qkinspect.errors import CheckpointError
from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.loading import opened
from qkinspect.metrics.directions import GAP, best_tokens, continues, factored_svd, subspaces
from qkinspect.metrics.factored import RANK_RTOL
from qkinspect.names import Names


def directions(
    model=None,
    *,
    layers: str | int | Iterable[int] | None = None,
    heads: str | int | Iterable[int] | None = None,
    blocks: str | Iterable[str] | None = None,
    top_directions: int = 3,
    top_tokens: int = 10,
    fold_ln: bool = False,
    fold_qk_norm: bool = False,
    precision: str = "float32",
    device: str = "cpu",
    revision: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    reading: str = "dot",
    names: Names = LIBRARY_NAMES,
) -> DirectionsResult:
    """The top singular directions of each selected head's W_OV and W_QK, read as tokens.

    Args:
        model: a path, hub id or GGUF file; None for the bundled demo model; an opened LoadedModel; or a model in
            memory (a transformers PreTrainedModel, or a (config, state_dict) pair: token ids only, no text).
        layers, heads, blocks: the selection, as `qkinspect.analyze` takes it; None for all.
        top_directions: K, the directions per matrix (a run of near-equal singular values that reaches past K is
            kept as one subspace, grown at most K directions further; `cut` marks a run that goes on).
        top_tokens: tokens per direction, per sign.
        fold_ln: fold each layer's input norm gain into W_Q, W_K, W_V first (default: the weights as stored).
        fold_qk_norm: fold q/k-norm gains into W_Q and W_K (Qwen3, OLMo2, Gemma3).
        precision: "float32" or "float64".
        device: "cpu", "cuda" or "cuda:N".
        revision: hub revision when `model` is a hub id.
        progress: called as progress(done, total) after each layer.
        reading: "dot" (a token's score is its vector's dot product with the direction) or "cosine" (divided by
            the token vector's norm: rare tokens with long embedding rows no longer top every list).
        names: how errors name the options (`qkinspect.directions.request`): these arguments' names by default;
            the CLI passes its own.

    Returns:
        DirectionsResult: records (tokens per direction, sign and side), what the tokens were read through, notes.

    Raises:
        InputError: a bad argument or selection. UnsupportedModelError: a family whose vocabulary tensors are not
        mapped. CheckpointError: no embedding tensor, shapes or vocabulary sizes that disagree, an unreadable
        tokenizer.

    Example:
        >>> import qkinspect
        >>> result = qkinspect.directions(None, layers="0", heads="0", top_directions=1)  # the demo model
        >>> sorted({(r.matrix, r.side) for r in result.records})
        [('ov', 'read'), ('ov', 'write'), ('qk', 'key'), ('qk', 'query')]
    """
    request = check_request(layers=layers, heads=heads, blocks=blocks, top_directions=top_directions,
                            top_tokens=top_tokens, fold_ln=fold_ln, fold_qk_norm=fold_qk_norm, precision=precision,
                            device=device, reading=reading, names=names)
    run = _Run.make(request)
    blocks, layer_sel, head_sel = request.blocks, request.layers, request.heads
    with opened(model, revision) as m:
        chosen = check_model(request, m.info)
        if blocks is not None:  # recorded as the model's block keys, whether kinds or labels were given
            blocks = tuple(b.key for b in chosen)
        vocab = read_vocab(m, chosen, run.dtype, run.device)
        if run.reading == "cosine":
            vocab.use_norms()
        keys = [b.key for b in chosen]
        total = sum(1 for _ in m.plan(keys, layer_sel))
        records: list[DirectionRecord] = []
        if progress is not None:
            progress(0, total)
        for done, layer in enumerate(m.layers(keys, layer_sel, dtype=run.dtype), start=1):
            records += run.layer_records(run.processed(layer), head_sel, vocab)
            del layer
            if progress is not None:
                progress(done, total)
        info = m.info
    return DirectionsResult(info, records, vocab.readout, run.processing(blocks, layer_sel, head_sel),
                            run.notes(chosen, vocab), run.warnings)




# -- the token matrices ------------------------------------------------------------------------------------------


@dataclass
class Vocab:
    """The token matrices (V, D) on the compute device: `embed` for read/query/key sides, `unembed` for the write
    side (the same tensor when tied), `gain` (D,) the final norm's multiplier (None: nothing folded); `text`
    the token strings by id (None: ids only)."""

    embed: Tensor
    unembed: Tensor
    gain: Tensor | None
    text: object  # loading.tokens.Vocabulary or None
    readout: Readout
    norms: dict[bool, Tensor] | None = None  # the cosine reading: each token vector's norm (V,), by write side

    def use_norms(self) -> None:
        """Keep each token vector's norm for the cosine reading: ‖e_t‖ (read, query, key) and ‖γ ∘ w_t‖ (write)."""
        write = self.unembed if self.gain is None else self.unembed * self.gain
        self.norms = {False: torch.linalg.vector_norm(self.embed, dim=1),
                      True: torch.linalg.vector_norm(write, dim=1)}

    def token(self, i: int) -> str | None:
        return None if self.text is None else self.text.get(i)  # type: ignore[attr-defined]


def read_vocab(m, chosen: list[BlockSpec], dtype: torch.dtype, device: str) -> Vocab:
    """Read the embedding, the unembedding (when stored apart and not tied) and the final norm gain, checked
    against each other, the config and the tokenizer."""
    from qkinspect.loading.tokens import read_vocabulary
    from qkinspect.loading.vocab_names import vocab_names

    names = vocab_names(m.info.model_type)
    src, where = m.source, m.info.source
    embed_name = src.resolve(names.embed)
    if embed_name is None:
        raise CheckpointError(f"{where}: no token embedding tensor {names.embed!r}; directions are read through it")
    tie = _tied(m.resolved)
    un_name = None if tie is True else next((n for n in map(src.resolve, names.unembeds) if n is not None), None)
    if un_name is None and tie is False and names.unembed is not None:
        raise CheckpointError(f"{where}: the config unties the embeddings, but there is no unembedding tensor "
                              f"{names.unembed!r}")
    V, D = _shape(src, embed_name, where)  # every check from the headers first: a refusal reads no data
    if un_name is not None and _shape(src, un_name, where) != (V, D):
        raise CheckpointError(f"{where}: the unembedding {un_name!r} has shape {_shape(src, un_name, where)}, the "
                              f"embedding {embed_name!r} {(V, D)}; they should agree")
    declared = _declared_vocab(m.resolved.config)
    if declared is not None and declared != V:
        raise CheckpointError(f"{where}: the embedding {embed_name!r} has {V:,} rows, but the config's vocab_size "
                              f"is {declared:,}")
    for b in chosen:
        widths = {b.d_model, b.kv_width}
        if widths != {D}:
            raise CheckpointError(f"{where}: the {b.key} block reads width {'/'.join(map(str, sorted(widths)))}, "
                                  f"but the embedding {embed_name!r} has width {D}")
    text = read_vocabulary(m.resolved)
    if text is not None and len(text) > V:
        raise CheckpointError(f"{text.source}: {len(text):,} tokens, but the embedding {embed_name!r} has only "
                              f"{V:,} rows: the tokenizer does not belong to this model")
    gain, norm_name = _final_gain(src, names, D, where)
    E = _floating(src.get(embed_name), embed_name, where)
    U = E if un_name is None else _floating(src.get(un_name), un_name, where)
    readout = Readout(embed_name, un_name or embed_name, un_name is None, norm_name, V,
                      None if text is None else text.source, None if text is None else len(text))
    E = _finite(E.to(device=device, dtype=dtype), embed_name, where)
    U = E if un_name is None else _finite(U.to(device=device, dtype=dtype), un_name, where)
    g = None if gain is None else _finite(gain.to(device=device, dtype=dtype), norm_name, where)
    return Vocab(E, U, g, text, readout)


def _finite(t: Tensor, stored: str | None, where: str) -> Tensor:
    """`t` when every entry is finite; CheckpointError naming the tensor otherwise: every token's score is read
    through it (a NaN row would top every list)."""
    if bool(torch.isfinite(t.sum(dtype=torch.float64))):  # one pass, no mask: the sum of finite entries is finite
        return t
    bad = int((~torch.isfinite(t)).sum())
    if bad:
        raise CheckpointError(f"{where}: tensor {stored!r} holds {bad:,} non-finite values (NaN or inf, or too "
                              f"large for the compute precision); directions are read through it")
    return t


def _tied(resolved) -> bool | None:
    """Whether the model ties its unembedding to the embedding: the config's tie_word_embeddings (its family's
    default where the file does not say, as transformers reads it). A GGUF says nothing: its output tensor,
    present or not, decides (None)."""
    if resolved.format == "gguf":
        return None
    try:
        value = getattr(resolved.config, "tie_word_embeddings", None)
    except AttributeError:
        return None
    return value if isinstance(value, bool) else None


def _declared_vocab(config) -> int | None:
    data = getattr(config, "data", None)
    value = data.get("vocab_size") if isinstance(data, dict) else getattr(config, "vocab_size", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _shape(src, stored: str, where: str) -> tuple[int, int]:
    """A token matrix's (rows, width) from the file's header; CheckpointError unless it is one."""
    shape = tuple(src.stored_shape(stored))
    if len(shape) != 2 or min(shape) < 1:
        raise CheckpointError(f"{where}: tensor {stored!r} has shape {shape}, not (vocabulary, width)")
    return shape  # type: ignore[return-value]


def _floating(t: Tensor, stored: str, where: str) -> Tensor:
    if not t.is_floating_point():
        raise CheckpointError(f"{where}: tensor {stored!r} is stored as {t.dtype}, not a floating-point type")
    return t


def _final_gain(src, names, D: int, where: str) -> tuple[Tensor | None, str | None]:
    """The final norm's multiplier (1 + weight for Gemma), or (None, None) where the family has none or the
    checkpoint stores none (a norm without weights)."""
    if names.final_norm is None:
        return None, None
    stored = src.resolve(names.final_norm)
    if stored is None:
        return None, None
    w = _floating(src.get(stored), stored, where)
    if tuple(w.shape) != (D,):
        raise CheckpointError(f"{where}: the final norm {stored!r} has shape {tuple(w.shape)}, expected ({D},)")
    w = w.to(torch.float64)
    return (w + 1 if names.unit_offset else w), stored


READING_NOTE = {  # what the scores are: the table and the JSON say it
    "dot": "scores are dot products: tokens with long embedding rows rank high in many directions (the cosine "
           "reading divides by the row's norm)",
    "cosine": "scores are cosines: each dot product divided by the token vector's norm",
}


# -- one run ---------------------------------------------------------------------------------------------------------


@dataclass
class _Run:
    k: int
    n_tokens: int
    dtype: torch.dtype
    device: str
    fold_ln: bool
    fold_qk_norm: bool
    reading: str = "dot"
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def make(cls, request: DirectionsRequest) -> _Run:
        """The run of a checked request (`qkinspect.directions.request`), with the torch dtype of its precision."""
        return cls(request.top_directions, request.top_tokens, getattr(torch, request.precision), request.device,
                   request.fold_ln, request.fold_qk_norm, request.reading)

    def processed(self, layer: AttentionLayer) -> AttentionLayer:
        from qkinspect.metrics.fold import fold_ln, fold_qk_norm

        if self.fold_ln:
            layer = fold_ln(layer)
        if self.fold_qk_norm and layer.q_norm is not None:
            layer = fold_qk_norm(layer)
        return layer

    def layer_records(self, layer: AttentionLayer, heads: tuple[int, ...] | None, vocab: Vocab
                      ) -> list[DirectionRecord]:
        """The records of one layer's selected heads: both matrices, all four sides, scored in two products."""
        H = layer.spec.n_heads
        chosen = [h for h in range(H) if heads is None or h in heads]
        if not chosen or layer.W_O is None:
            return []
        h_idx = torch.tensor(chosen)
        kv = layer.kv_index()[h_idx]  # query head h reads key/value head h // (H / H_kv)
        dev = dict(device=self.device, dtype=self.dtype)
        keep = 2 * self.k  # subspaces() never reaches past index 2K - 1
        forms = {  # W_V (D, dv) with W_Oᵀ (D, dv); W_Q (D, d) with W_K (D, d)
            "ov": factored_svd(layer.W_V[kv].to(**dev), layer.W_O[h_idx].mT.to(**dev), keep),
            "qk": factored_svd(layer.W_Q[h_idx].to(**dev), layer.W_K[kv].to(**dev), keep),
        }
        unusable = {matrix: ~torch.isfinite(S[:, 0]).cpu() for matrix, (_, S, _) in forms.items()}
        self._warn(layer, chosen, unusable)
        plan = []  # (head position, matrix, side, blocks, vectors (D, r))
        for i in range(len(chosen)):
            for matrix, (U, S, V) in forms.items():
                if unusable[matrix][i]:
                    continue
                groups = subspaces(S[i], self.k)
                cut = continues(S[i], groups)
                left, right = ("read", "write") if matrix == "ov" else ("query", "key")
                plan.append((i, matrix, left, groups, U[i], S[i], cut))
                plan.append((i, matrix, right, groups, V[i], S[i], cut))
        return self._score(layer, chosen, kv.tolist(), plan, vocab)

    def _warn(self, layer: AttentionLayer, chosen: list[int], unusable: dict[str, Tensor]) -> None:
        """One warning per layer and matrix naming the heads whose factors hold NaN or inf (their directions are
        left out), as `analyze` names its non-finite heads."""
        factors = {"ov": "W_V or W_O", "qk": "W_Q or W_K"}
        for matrix, bad in unusable.items():
            heads = [chosen[i] for i in torch.nonzero(bad).flatten().tolist()]
            if heads:
                folded = " or the folded input norm" if self.fold_ln else ""
                self.warnings.append(f"{layer.block} layer {layer.layer} head{'s' if len(heads) > 1 else ''} "
                                     f"{', '.join(map(str, heads))}: non-finite weights ({factors[matrix]}{folded}); "
                                     f"their {matrix.upper()} directions are left out")

    def _score(self, layer, chosen, kv, plan, vocab: Vocab) -> list[DirectionRecord]:
        """Score every planned side against its token matrix (write: unembedding ∘ gain; the rest: embedding)."""
        out: dict[int, list[DirectionRecord]] = {}
        for write in (False, True):
            items = [(j, p) for j, p in enumerate(plan) if (p[2] == "write") == write]
            cols, blocks = [], []
            for _, (_, _, _, groups, vecs, _, _) in items:
                base = sum(c.shape[1] for c in cols)
                used = sorted({i for g in groups for i in g})
                cols.append(vecs[:, used])
                at = {i: base + n for n, i in enumerate(used)}
                blocks += [tuple(at[i] for i in g) for g in groups]
            if not blocks:
                continue
            W = torch.cat(cols, dim=1)  # (D, m)
            T = vocab.unembed if write else vocab.embed
            if write and vocab.gain is not None:
                W = vocab.gain.to(W.dtype)[:, None] * W  # (γ ∘ w_t) · v = w_t · (γ ∘ v): the gain on the vector
            norms = None if vocab.norms is None else vocab.norms[write]
            best = best_tokens(T, W, blocks, self.n_tokens, norms=norms)  # −v: lowest
            pos_v, pos_i, neg_v, neg_i = (x.mT.cpu().tolist() for pair in best for x in pair)  # per block, once
            neg_at = {c: n for n, c in enumerate(k for k, b in enumerate(blocks) if len(b) == 1)}
            col = 0
            for j, (i, matrix, side, groups, _, S, cut) in items:
                recs = out.setdefault(j, [])
                sigmas = S.tolist()
                for g in groups:
                    sig = tuple(sigmas[x] for x in g)
                    head = dict(block=layer.block, layer=layer.layer, head=chosen[i], kv_head=kv[i], matrix=matrix,
                                side=side, index=g[0], sigma=sig[0], indices=g, sigmas=sig,
                                cut=cut and g is groups[-1])
                    if len(g) == 1:
                        recs.append(self._record(head, "+", pos_v[col], pos_i[col], vocab))
                        recs.append(self._record(head, "-", neg_v[neg_at[col]], neg_i[neg_at[col]], vocab))
                    else:
                        recs.append(self._record(head, "±", pos_v[col], pos_i[col], vocab))
                    col += 1
        return [r for j in sorted(out) for r in out[j]]

    @staticmethod
    def _record(head: dict, sign: str, values: list[float], ids: list[int], vocab: Vocab) -> DirectionRecord:
        return DirectionRecord(**head, sign=sign, token_ids=tuple(ids), tokens=tuple(vocab.token(i) for i in ids),
                               scores=tuple(values))

    def processing(self, blocks, layers, heads) -> dict:
        return {"fold_ln": self.fold_ln, "fold_qk_norm": self.fold_qk_norm,
                "precision": "float64" if self.dtype == torch.float64 else "float32", "device": self.device,
                "top_directions": self.k, "top_tokens": self.n_tokens, "gap": GAP, "rank_rtol": RANK_RTOL,
                "reading": self.reading,
                "blocks": None if blocks is None else [blocks] if isinstance(blocks, str) else list(blocks),
                "layers": None if layers is None else list(layers), "heads": None if heads is None else list(heads)}

    def notes(self, chosen: list[BlockSpec], vocab: Vocab) -> list[str]:
        out = [READING_NOTE[self.reading]]
        rotary = [b.key for b in chosen if b.positional == "rope"]
        if rotary:
            out.append(f"rotary ({', '.join(rotary)}): W_QK is the zero-offset form (query and key at the same "
                       f"position); at offset j−i the keys' side is rotated by R_(j−i)")
        qk = [b.key for b in chosen if b.qk_norm]
        if qk and not self.fold_qk_norm:
            out.append(f"q/k norms ({', '.join(qk)}) not folded: W_QK is of the raw projections (fold_qk_norm folds "
                       f"their gains)")
        if not self.fold_ln:
            out.append("input norms not folded: W_Q, W_K, W_V as stored (fold_ln folds each layer's gain)")
        r = vocab.readout
        if r.final_norm is None:
            out.append("no final norm gain folded into the write side (the family or the checkpoint has none)")
        if r.tokenizer is None:
            out.append("no tokenizer found: token ids only")
        return out


__all__ = ["directions", "read_vocab"]

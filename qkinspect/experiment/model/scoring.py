"""What an experiment measures, and how it avoids re-running the unedited prefix (docs/experiments.md).

- causal LMs: mean next-token cross-entropy over non-overlapping windows of W tokens, each scored on its W-1
  predictions (what ``labels=input_ids`` computes in transformers);
- masked LMs: masked-LM cross-entropy, 15 % of the non-special tokens of each window replaced by the mask token,
  the positions drawn once with a fixed seed;
- encoders without a head: drift, 1 - mean cosine of the final hidden states to the unedited model's.

Every pass keeps the loss of each scored token, so that a run's Δloss carries its standard error, paired with the
baseline on the same tokens and computed over blocks of BLOCK consecutive positions (`paired_se`).

`Scorer.baseline` runs the unedited model once over every batch of windows and keeps the hidden states entering
the layers that will be edited; `Scorer.score(start)` then runs only layers start.. (and the head): the layers
before `start` are swapped for a module that hands back the cached states, so the model's own forward still builds
the mask and the position embeddings (rotary included) exactly as it does for the full model.
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkinspect.errors import InputError
from qkinspect.experiment.model.runtime import CAUSAL, DRIFT, MASKED, HFModel
from qkinspect.experiment.requests import BYTES_PER_TOKEN, LIBRARY_NAMES, Text, check_amounts, check_window
from qkinspect.names import Names
from qkinspect.progress import phase
from qkinspect.reading import MAX_TEXT_BYTES

MASK_FRACTION = 0.15
# The standard error of a Δloss treats blocks of this many consecutive positions of one window as the independent
# units (a batch-means / cluster standard error): the loss changes of neighbouring tokens are correlated, so the
# per-token standard error would be too small (docs/experiments.md, "Error bars").
BLOCK = 64


def default_text() -> Text:
    """The topic pages of Python's own help (`pydoc_data.topics`), in key order: English prose and code that ships
    with every Python."""
    from pydoc_data.topics import topics

    return Text(f"pydoc_data.topics (Python {platform.python_version()})",
                "\n\n".join(topics[k] for k in sorted(topics)))


def text_bytes(tokens: int) -> int:
    """How much of a --text file is read for `tokens` tokens: BYTES_PER_TOKEN a token, at least 1 MiB, at most
    MAX_TEXT_BYTES."""
    return min(MAX_TEXT_BYTES, max(1 << 20, BYTES_PER_TOKEN * tokens))


def read_text(path: str | Path, tokens: int | None = None, what: str = LIBRARY_NAMES.text) -> Text:
    """The text of a --text file: only its first `text_bytes(tokens)` bytes (all of MAX_TEXT_BYTES without
    `tokens`); a FIFO, a device or anything else but a regular file is refused (InputError naming the file and
    the option it was given as, `what`: a `Names` entry, "--text" or "text")."""
    from qkinspect.reading import read_text as bounded

    p = Path(path)
    limit = MAX_TEXT_BYTES if tokens is None else text_bytes(tokens)
    return Text(str(p), bounded(p, limit=limit, what=what, prefix=True))


def windows(hf: HFModel, text: Text, tokens: int, window: int, names: Names = LIBRARY_NAMES) -> Tensor:
    """Token windows (n, W) from the first `tokens` tokens of `text`. Encoders get [CLS] … [SEP] around W-2
    text tokens; causal LMs whose tokenizer starts every text with BOS (Gemma, Llama 3) get BOS before W-1 text
    tokens, as they were trained. With fewer tokens than one window, one window of what there is. A window the
    model cannot take is an InputError naming the option as the caller spells it (`names`)."""
    check_amounts(tokens, window, names)
    check_window(hf.model.config, window, names)
    tok = hf.tokenizer
    wrap = hf.kind != CAUSAL and tok.cls_token_id is not None and tok.sep_token_id is not None
    bos = hf.kind == CAUSAL and _adds_bos(tok)
    body = window - 2 if wrap else window - 1 if bos else window
    if body < 1:
        raise InputError(f"{names.said('window', window)}: too short for [CLS] and [SEP]")
    ids = _token_ids(tok, text.text, tokens)
    if len(ids) < 2:
        raise InputError(f"{text.name}: the text gives fewer than 2 tokens")
    if tok.unk_token_id is not None and all(i == tok.unk_token_id for i in ids):
        raise InputError(f"{text.name}: the tokenizer reads nothing but unknown tokens in this text")
    # Encoders and BOS models: `tokens` counts the text tokens, so `body` per window.
    n = max(1, len(ids) // body)
    body = min(body, len(ids))
    rows = torch.tensor(ids[: n * body], dtype=torch.long).view(n, body)  # (n*body,) -> (n, body)
    if wrap:
        cls = torch.full((n, 1), tok.cls_token_id, dtype=torch.long)
        sep = torch.full((n, 1), tok.sep_token_id, dtype=torch.long)
        rows = torch.cat([cls, rows, sep], dim=1)  # (n, body + 2)
    if bos:
        rows = torch.cat([torch.full((n, 1), tok.bos_token_id, dtype=torch.long), rows], dim=1)  # (n, body + 1)
    return rows


def _adds_bos(tok) -> bool:
    """Whether the tokenizer starts a text with its BOS token (what the model saw in training)."""
    bos = tok.bos_token_id
    return bos is not None and tok("a", add_special_tokens=True)["input_ids"][:1] == [bos]


def _token_ids(tok, text: str, tokens: int) -> list[int]:
    """The first `tokens` token ids of `text` (no special tokens); tokenises a prefix first, the whole if short."""
    chars = tokens * 16
    while True:
        ids = tok(text[:chars], add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) > tokens or chars >= len(text):
            return ids[:tokens]
        chars *= 4


class CachedStates(nn.Module):
    """Stands in for a skipped layer: returns the cached states entering the first layer that runs."""

    def __init__(self, states: Tensor, as_tuple: bool):
        super().__init__()
        self.out = (states,) if as_tuple else states

    def forward(self, *args, **kwargs):
        return self.out


class Scorer:
    """Scores the model (as it currently is) on fixed batches of windows, from any layer on.

    Example:
        >>> s = Scorer(hf, windows(hf, default_text(), 4096, 512))  # doctest: +SKIP
        >>> base = s.baseline(cache={3, 7})   # one full pass; keeps the states entering layers 3 and 7
        >>> with written(hf, [edited_layer_7]):
        ...     loss = s.score(start=7)        # runs layers 7.. only
    """

    def __init__(self, hf: HFModel, ids: Tensor, *, batch_tokens: int = 2048, seed: int = 0):
        self.hf = hf
        n, W = ids.shape
        per = max(1, batch_tokens // W)
        self.batches = [ids[i : i + per] for i in range(0, n, per)]
        device = next(hf.model.parameters()).device  # the inputs go where the model is (--device)
        self.inputs = [{k: v.to(device) if isinstance(v, Tensor) else v for k, v in self._inputs(b, seed + i).items()}
                       for i, b in enumerate(self.batches)]
        self.cache: dict[int, list[Tensor]] = {}
        self.reference: list[Tensor] = []  # drift: the unedited final hidden states, per batch
        self.as_tuple = False
        self.counted = 0  # predictions (or masked tokens, or tokens) scored per pass
        self.token_losses: Tensor = torch.zeros(0, dtype=torch.float64)  # the last pass, one per scored token
        self.base_tokens: Tensor = torch.zeros(0, dtype=torch.float64)  # the baseline pass's, same order
        self.blocks: Tensor = torch.zeros(0, dtype=torch.long)  # each scored token's block (BLOCK positions)

    def _inputs(self, ids: Tensor, seed: int) -> dict[str, Tensor]:
        if self.hf.kind == CAUSAL:
            return {"input_ids": ids, "use_cache": False}
        kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if self.hf.kind != MASKED:
            return kw
        tok = self.hf.tokenizer
        special = torch.zeros_like(ids, dtype=torch.bool)
        for t in tok.all_special_ids:
            special |= ids == t
        g = torch.Generator().manual_seed(seed)
        pick = (torch.rand(ids.shape, generator=g) < MASK_FRACTION) & ~special
        if not pick.any():  # a tiny window: mask at least one ordinary token
            pick.view(-1)[int((~special).view(-1).nonzero()[0])] = True
        labels = torch.where(pick, ids, torch.full_like(ids, -100))
        return {**kw, "input_ids": torch.where(pick, torch.full_like(ids, tok.mask_token_id), ids), "labels": labels}

    @property
    def tokens(self) -> int:
        return sum(b.numel() for b in self.batches)

    def baseline(self, cache: set[int] | frozenset[int] = frozenset(), progress=None) -> float:
        """One full unedited pass: the baseline loss; keeps the states entering each layer in `cache`. `progress`:
        a receiver (qkinspect.progress) told the phase and each batch done."""
        layers = self.hf.layers
        self.cache = {i: [] for i in cache}
        self.reference = []
        hooks = [layers[i].register_forward_pre_hook(self._keeper(i), with_kwargs=True) for i in cache]
        hooks.append(layers[0].register_forward_hook(self._shape_probe))
        try:
            with torch.inference_mode():
                loss = self._pass(start=0, keep_reference=True,
                                  tick=phase(progress, "baseline", len(self.inputs), "batches"))
        finally:
            for h in hooks:
                h.remove()
        self.base_tokens = self.token_losses
        return loss

    def _keeper(self, i: int):
        def keep(module, args, kwargs):
            self.cache[i].append(args[0] if args else kwargs["hidden_states"])

        return keep

    def _shape_probe(self, module, args, output) -> None:
        self.as_tuple = isinstance(output, tuple)

    def score(self, start: int = 0) -> float:
        """The loss of the model as it is now, running layers `start`.. on the cached states (0: everything)."""
        if start and start not in self.cache:
            raise ValueError(f"no cached states entering layer {start}; baseline(cache=...) must include it")
        with torch.inference_mode():
            return self._pass(start)

    def paired_se(self) -> float | None:
        """The standard error of the last pass's mean loss minus the baseline's, paired token by token and
        clustered in blocks (BLOCK): sqrt(J/(J-1) · Σ_j (S_j − Δ n_j)²) / Σ_j n_j over the J blocks that hold
        scored tokens (S_j: the block's summed loss differences, n_j its tokens). None with fewer than 2 blocks."""
        return block_se(self.token_losses - self.base_tokens, self.blocks)

    def _pass(self, start: int, keep_reference: bool = False, tick=None) -> float:
        per_token, blocks, offset = [], [], 0
        for b, inputs in enumerate(self.inputs):
            with self._skipping(start, b):
                out = self.hf.model(**{k: v for k, v in inputs.items() if k != "labels"})
            values, block = self._loss(out, b, inputs, keep_reference)
            per_token.append(values)
            blocks.append(block + offset)
            offset += self.batches[b].shape[0] * -(-self.batches[b].shape[1] // BLOCK)
            if tick is not None:
                tick(b + 1)
        self.token_losses = torch.cat(per_token)
        self.blocks = torch.cat(blocks)
        self.counted = int(self.token_losses.numel())
        return float(self.token_losses.sum()) / self.counted

    @contextlib.contextmanager
    def _skipping(self, start: int, b: int) -> Iterator[None]:
        layers = self.hf.layers
        saved = [layers[k] for k in range(start)]
        try:
            for k in range(start):
                layers[k] = CachedStates(self.cache[start][b], self.as_tuple)
            yield
        finally:
            for k, m in enumerate(saved):
                layers[k] = m

    def _loss(self, out, b: int, inputs: dict[str, Tensor], keep_reference: bool) -> tuple[Tensor, Tensor]:
        """Each scored token's loss (float64, in row-major order of the batch) and its block within the batch."""
        kind = self.hf.kind
        if kind == DRIFT:
            h = out.last_hidden_state
            if keep_reference:
                self.reference.append(h)
            cos = F.cosine_similarity(h.float(), self.reference[b].float(), dim=-1)  # (B, W)
            return (1 - cos).double().reshape(-1).cpu(), token_blocks(torch.ones_like(cos, dtype=torch.bool).cpu())
        pred, target = logits_and_targets(out.logits, inputs, kind)
        loss = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), reduction="none",
                               ignore_index=-100)  # (B*T,)
        scored = target.reshape(-1) != -100
        return loss[scored].double().cpu(), token_blocks((target != -100).cpu())  # kept on the CPU (--device)


def logits_and_targets(logits: Tensor, inputs: dict[str, Tensor], kind: str) -> tuple[Tensor, Tensor]:
    """The logits that are scored and their targets (-100: not scored): causal, position t predicts token t+1."""
    logits = logits.float()
    if kind == CAUSAL:
        return logits[:, :-1], inputs["input_ids"][:, 1:]  # (B, W-1, V), (B, W-1)
    return logits, inputs["labels"]


def token_blocks(scored: Tensor) -> Tensor:
    """The block of each scored token of a (B, T) batch, in row-major order: window b, positions BLOCK·j.."""
    B, T = scored.shape
    per_row = -(-T // BLOCK)
    ids = torch.arange(B)[:, None] * per_row + torch.arange(T)[None, :] // BLOCK  # (B, T)
    return ids[scored]


def block_se(diff: Tensor, blocks: Tensor) -> float | None:
    """The standard error of diff.mean() with the tokens of one block as one unit (a cluster / batch-means
    standard error of a ratio estimator); None with fewer than two blocks holding tokens."""
    if diff.numel() == 0:
        return None
    _, b = torch.unique(blocks, return_inverse=True)
    J = int(b.max()) + 1
    if J < 2:
        return None
    d = diff.double()
    S = torch.zeros(J, dtype=torch.float64).index_add_(0, b, d)  # (J,) summed differences per block
    n = torch.zeros(J, dtype=torch.float64).index_add_(0, b, torch.ones_like(d))  # (J,) tokens per block
    mean = S.sum() / n.sum()
    return float(torch.sqrt(J / (J - 1) * ((S - mean * n) ** 2).sum()) / n.sum())

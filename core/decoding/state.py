"""One model's running decoding state over B left-padded rows: its KV cache, attention mask and
positions, and (for a single row) the final hidden states of every position read, for branching.

Buffers grow by doubling and are cut by a length, so a long response costs O(1) bookkeeping per
token (no per-step concatenation of the mask or of recorded states) and a crop is O(1) too.
"""

from __future__ import annotations

from typing import Any

import torch

from core.decoding.kvcache import growing_cache
from core.errors import InvalidInputError
from core.pair.forward import backbone
from core.pair.loading import ModelPair


class _Grow:
    """A tensor that grows along dim 1 by doubling: (B, n, ...) valid entries out of a larger buffer."""

    def __init__(self, first: torch.Tensor) -> None:
        self.buf, self.n = first, first.shape[1]

    def append(self, more: torch.Tensor) -> None:
        need = self.n + more.shape[1]
        if need > self.buf.shape[1]:
            bigger = self.buf.new_empty((self.buf.shape[0], max(need, 2 * self.buf.shape[1], 64), *self.buf.shape[2:]))
            bigger[:, : self.n] = self.buf[:, : self.n]
            self.buf = bigger
        self.buf[:, self.n : need] = more
        self.n = need

    def append_ones(self, n: int) -> None:
        """Append n columns of ones (a mask's newly read tokens), without building them first."""
        need = self.n + n
        if need > self.buf.shape[1]:
            self.append(self.buf.new_ones((self.buf.shape[0], n, *self.buf.shape[2:])))
            return
        self.buf[:, self.n : need] = 1
        self.n = need

    def view(self) -> torch.Tensor:
        return self.buf[:, : self.n]


class ModelState:
    """One model's cache over B rows; `fed` response tokens read so far; `last_hidden` (B, d) predicts
    response token `fed`."""

    def __init__(self, pair: ModelPair, side: str, prompts: list[list[int]], record: int = 0) -> None:
        """Prefill the prompts (left-padded). With record=n (one row only), keep the final hidden states
        of the last n positions and of every later feed, so that a held trace can be branched."""
        self.pair, self.side, self.model = pair, side, pair.model(side)
        self._head, self._decoder = pair.runner(side)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pair.tokenizer.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[row, width - len(p):] = 1
        # no row padded: no mask at all (the model's causal mask is the same, and a 2D mask costs a 4D one per forward)
        self._mask = _Grow(mask.to(pair.device)) if bool((mask == 0).any()) else None
        # position of the first prompt column, per row (≤ 0 when padded); on the device, as are the positions fed
        self.next_pos = (mask.sum(-1) - ids.shape[1]).to(pair.device)
        self.cache = growing_cache(self.model.config)
        self.fed = 0
        hidden = self._forward(ids)
        self.last_hidden = hidden[:, -1]  # (B, d): predicts response token 0
        self._states = _Grow(hidden[:, -record:].clone()) if record else None

    @classmethod
    def resumed(cls, pair: ModelPair, side: str, cache: Any, states: torch.Tensor, fed: int,
                last_token: int | None = None) -> ModelState:
        """A one-row state from a cache holding the prompt and `fed` response tokens and the final hidden
        states (fed + 1, d) that predicted response tokens 0 .. fed: no forward at all. With `last_token`,
        the cache lacks that last response token: it is read (one token) and its hidden state appended."""
        self = cls.__new__(cls)
        self.pair, self.side, self.model, self.cache = pair, side, pair.model(side), cache
        self._head, self._decoder = pair.runner(side)
        length = cache.get_seq_length()
        self._mask = None  # one row, nothing padded
        self.next_pos = torch.tensor([length], dtype=torch.long, device=pair.device)
        self._states = _Grow(states.unsqueeze(0).clone())
        self.last_hidden = states[-1:]
        self.fed = fed - (last_token is not None)
        if last_token is not None:
            self.feed(torch.tensor([[last_token]]))
        return self

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Run the backbone on (B, n) new ids after the cache; returns (B, n, d) final hidden states."""
        n = ids.shape[1]
        # left padding shifts positions
        positions = (self.next_pos.unsqueeze(1) + torch.arange(n, device=self.next_pos.device) if n != 1
                     else self.next_pos.unsqueeze(1)).clamp_min(0)
        self.next_pos = self.next_pos + n
        mask = None if self._mask is None else self._mask.view()
        # host ids are copied without waiting for the device (a pageable source is staged before the call returns)
        hidden, self.cache = backbone(self.model, ids.to(self.pair.device, non_blocking=True), cache=self.cache,
                                      attention_mask=mask, position_ids=positions, decoder=self._decoder)
        return hidden

    def feed(self, ids: torch.Tensor) -> torch.Tensor:
        """Read response tokens (B, n); returns (B, n, d) hidden states (column j predicts token fed+j+1)."""
        if self._mask is not None:
            self._mask.append_ones(ids.shape[1])
        hidden = self._forward(ids)
        self.last_hidden = hidden[:, -1]
        self.fed += ids.shape[1]
        if self._states is not None:
            self._states.append(hidden)
        return hidden

    def crop(self, fed: int) -> None:
        """Forget the response tokens past the first `fed` (cache, mask, positions, recorded states).
        `last_hidden` is stale afterwards: the caller feeds the next token before asking for logits."""
        remove = self.fed - fed
        if remove <= 0:
            return
        self.cache.crop(-remove)
        if self._mask is not None:
            self._mask.n -= remove
        self.next_pos = self.next_pos - remove
        self.fed = fed
        if self._states is not None:
            self._states.n = fed + 1
            self.last_hidden = self._states.view()[:, -1]

    def repeat(self, n: int) -> None:
        """Make this one-row state n identical rows (one prefill shared by n continuations); stops recording."""
        if self.last_hidden.shape[0] != 1:
            raise InvalidInputError(f"repeat needs a one-row state, this one has {self.last_hidden.shape[0]} rows")
        self.cache.batch_repeat_interleave(n)
        for layer in self.cache.layers:  # the next write allocates an n-row buffer owned by the layer
            if hasattr(layer, "_buffers"):
                layer._buffers = None
        self._mask = None if self._mask is None else _Grow(self._mask.view().repeat(n, 1))
        self.next_pos = self.next_pos.repeat(n)
        self.last_hidden = self.last_hidden.repeat(n, 1)
        self._states = None

    def logits(self, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """(..., V) float32 logits of `hidden` (default: last_hidden (B, d) -> (B, V))."""
        return self._head(self.last_hidden if hidden is None else hidden, self.pair.vocab_size)

    def recorded(self) -> torch.Tensor | None:
        """(fed + 1, d) final hidden states of row 0, entry r predicting response token r (None if not kept)."""
        if self._states is None:
            return None
        out = self._states.view()[0]
        return out if out.shape[0] == self.fed + 1 else None

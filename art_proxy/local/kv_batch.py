"""The running batch's KV cache: rows join, leave and advance one token per step.

Rows are left-padded to a common length: the attention mask hides the padding and each row's
position ids count only its real tokens, so a row computes the same logits as it would alone (up
to float rounding). A new group of rows is prefilled on its own and then joined by padding the
shorter cache on the left; rows that finish are dropped, and padding columns no row needs any
more are trimmed, so the cache never outgrows its longest row by much.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class KvBatch:
    def __init__(self, cache: DynamicCache, mask_B_T: torch.Tensor) -> None:
        self.cache = cache
        self.mask_B_T = mask_B_T  # 1 = a real token, 0 = left padding

    @property
    def rows(self) -> int:
        return int(self.mask_B_T.shape[0])

    def positions_B1(self) -> torch.Tensor:
        """The position of each row's next token: how many real tokens it has so far."""
        return self.mask_B_T.sum(dim=-1, keepdim=True)

    def mask_with_next_B_T(self) -> torch.Tensor:
        """The mask for a step that appends one token to every row."""
        return torch.cat([self.mask_B_T, self.mask_B_T.new_ones(self.rows, 1)], dim=1)

    def advanced(self, cache: DynamicCache) -> None:
        """Take the cache a decode step returned (one more column, all real)."""
        self.cache = cache
        self.mask_B_T = self.mask_with_next_B_T()

    def keep(self, rows: list[int]) -> None:
        """Keep only these rows, in this order (repeats allowed: a prompt shared by n choices)."""
        index_R = torch.tensor(rows, dtype=torch.long, device=self.mask_B_T.device)
        self.cache.batch_select_indices(index_R)
        self.mask_B_T = self.mask_B_T[index_R]
        self._trim()

    def extend(self, other: KvBatch) -> None:
        """Append `other`'s rows after these, padding the shorter of the two on the left."""
        length = max(self.mask_B_T.shape[1], other.mask_B_T.shape[1])
        for (mine, keys, values), (_, other_keys, other_values) in zip(
            _layers(self.cache), _layers(other.cache), strict=True
        ):
            mine.keys = torch.cat([_left_pad(keys, length), _left_pad(other_keys, length)])
            mine.values = torch.cat([_left_pad(values, length), _left_pad(other_values, length)])
        self.mask_B_T = torch.cat(
            [_left_pad(self.mask_B_T, length), _left_pad(other.mask_B_T, length)]
        )

    def _trim(self) -> None:
        """Drop the leading columns that are padding in every row."""
        if self.rows == 0:
            return
        first_real = int(self.mask_B_T.argmax(dim=1).min())
        if first_real == 0:
            return
        self.mask_B_T = self.mask_B_T[:, first_real:]
        for layer, keys, values in _layers(self.cache):
            layer.keys = keys[:, :, first_real:]
            layer.values = values[:, :, first_real:]


def _layers(cache: DynamicCache) -> list[tuple[DynamicLayer, torch.Tensor, torch.Tensor]]:
    """Each layer with its keys and values [B, H, T, D]; full-attention layers only."""
    layers = []
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or layer.keys is None or layer.values is None:
            raise TypeError(f"cannot batch a {type(layer).__name__} KV cache layer")
        layers.append((layer, layer.keys, layer.values))
    return layers


def _left_pad(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Zeros before the sequence dimension's start: dim 1 of a mask [B, T], dim 2 of keys [B, H, T, D]."""
    sequence_dim = 1 if tensor.dim() == 2 else 2
    missing = length - tensor.shape[sequence_dim]
    if missing == 0:
        return tensor
    # F.pad lists (before, after) pairs from the last dimension backwards.
    pads = [0, 0] * (tensor.dim() - 1 - sequence_dim) + [missing, 0]
    return F.pad(tensor, pads)

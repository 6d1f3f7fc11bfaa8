"""Allowed ids as packed bitmasks (xgrammar's layout: 32 ids an int32 word, bit i of word w is id
32w + i), the form the replay keeps per token and the scorer unpacks into a mask."""

from __future__ import annotations

import torch


def packed(ids: torch.Tensor, vocabulary: int) -> torch.Tensor:
    """[ceil(vocabulary/32)] int32: the bitmask with the bits of `ids` set (xgrammar's layout)."""
    words = (vocabulary + 31) // 32
    bits = torch.zeros(words * 32, dtype=torch.bool)
    bits[ids[(ids >= 0) & (ids < vocabulary)]] = True
    values = (bits.view(words, 32).long() << torch.arange(32)).sum(dim=-1)
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


def allowed_mask(bitmask_N_W: torch.Tensor, vocabulary: int) -> torch.Tensor:
    """[N, vocabulary] bool from packed bitmasks (ids past the bitmask's width: not allowed)."""
    bits_W_32 = torch.arange(32, device=bitmask_N_W.device, dtype=torch.int32)
    unpacked_N_B = ((bitmask_N_W[:, :, None] >> bits_W_32) & 1).flatten(1).bool()
    width = unpacked_N_B.shape[1]
    if width >= vocabulary:
        return unpacked_N_B[:, :vocabulary]
    return torch.nn.functional.pad(unpacked_N_B, (0, vocabulary - width))

"""The art-proxy sidecar trainer (GRPO on LoRA). Kept apart from `art-proxy` for its heavy deps.

The pure core: `batch` (training sequences from recorded token ids), `advantages` (group-relative),
`loss` (token-level clipped GRPO), `step` (one AdamW step on a peft adapter), `config`. The loop that
waits for scored groups, the adapter hot-swap and checkpointing arrive with the rest of the trainer
issue; the proxy itself never grows a torch dependency.
"""

"""The art-proxy sidecar trainer (GRPO on LoRA). Kept apart from `art-proxy` for its heavy deps.

The pure core: `batch` (training sequences from recorded token ids), `advantages` (group-relative),
`loss` (token-level clipped GRPO), `step` (one AdamW step on a peft adapter). Around it: `trainer`
(one training step and its record, resume, validation), `loop` (the sidecar and the whole loop),
`checkpoint`, `swap` (adapter hot-swap), `promoter` (the production alias) and `command`. Its
settings live with the others (`art_proxy.config`), so the CLI offers its flags without torch.
"""

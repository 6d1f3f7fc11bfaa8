"""The art-proxy sidecar trainer (GRPO on LoRA). Kept apart from `art-proxy` for its heavy deps.

The training loop arrives with the trainer issue; until then this distribution only reserves the
place in the layout so the proxy never grows a torch dependency.
"""

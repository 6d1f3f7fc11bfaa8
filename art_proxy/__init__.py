"""art-proxy: make any OpenAI-compatible agent trainable by RL without changing the agent.

Point `OPENAI_BASE_URL` at `art-proxy serve`; it forwards every call to the inference server, records
it with the exact token ids and logprobs, and stitches calls into trajectories grouped by scenario.
"""

__version__ = "0.1.0"

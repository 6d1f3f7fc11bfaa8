"""RULER: an LLM judge scores the trajectories of one group relative to each other.

`prompt` renders a group (shared beginning once, then each trajectory's rest, then the rubric:
plain text or a weighted `checklist`), `judge` asks any litellm model through the
`client.JudgeClient` seam, `parse`, `checklist` and `logprob` read its answer, `cache` makes
re-scoring free, `ensemble` averages several judges or samples, `reward` mixes in the agent's own
reward, `scorer.Ruler` turns all of it into one `Judgment` per group, and `run` finds the groups
that are ready. `art-proxy judge` (`command`) and the trainer both go through `Ruler`. Importing
this package does not import litellm; `judge` does, at its first call that needs it.
"""

"""RULER: an LLM judge scores the trajectories of one group relative to each other.

`prompt` renders a group (shared beginning once, then each trajectory's rest, then the rubric),
`judge` asks any litellm model through the `client.JudgeClient` seam, `parse` and `logprob` read
its answer, `cache` makes re-scoring free, `scorer.Ruler` turns all of it into one `Judgment` per
group, and `run` finds the groups that are ready. `art-proxy judge` (`command`) and the trainer
both go through `Ruler`. Importing this package does not import litellm; `judge` does.
"""

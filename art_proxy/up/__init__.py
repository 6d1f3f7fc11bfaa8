"""`art-proxy up`: the embedded stack (inference server + proxy) as one command: its parts
(`parts.py`), what it starts (`plan.py`, vLLM's launch in `vllm.py`), the supervisor that starts,
watches and stops them (`supervisor.py`), and the run (`run.py`).

Each part is a child process whose output is streamed with its name in front. Parts start in order
and each must answer its health check before the next starts. The stack stops cleanly (SIGTERM, then
SIGKILL after a grace period) on Ctrl-C, when any part dies (its last lines are shown), or, with
`--run CMD`, when that command ends, after a summary of what the proxy recorded.
"""

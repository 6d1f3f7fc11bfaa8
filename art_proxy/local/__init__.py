"""`art-proxy local-llm`: a vLLM-compatible inference server on CPU (the `[local]` extra).

Importing this package is cheap; torch and transformers load only when the server starts.
"""

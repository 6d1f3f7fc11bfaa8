"""`art-proxy export`'s formats beyond JSONL: a row per sampled call for any trainer (`table.py`:
Parquet, a Hugging Face dataset) and TRL's own dataset formats (`trl.py`: conversational
prompt-completion rows, preference pairs)."""

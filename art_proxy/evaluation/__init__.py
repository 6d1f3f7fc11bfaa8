"""`art-proxy eval`: is the trained model better than the base, or than a hosted model?

The arms (`arms.py`) run side by side on held-out scenarios (`run.py`), their rewards reported
with 95% intervals and paired differences (`intervals.py`, `report.py`)."""

"""What happens to a person's data: who a call belongs to (`subjects`), whether it is recorded
at all (`consent`), secrets redacted before anything is stored (`redaction`), personal data
replaced before the judge, the dashboard or an export sees it (`pii`), erasure on request
(`erasure`) and deletion past retention (`retention`). The SQL they run lives in `store/`
(`store/erasure.py`), their records in `records/erasure.py`, their settings in `config/`."""

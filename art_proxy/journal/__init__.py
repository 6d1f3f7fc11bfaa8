"""The journal before the store: a call's record is appended to a local file before its answer is
sent, and an ingester moves it into the store behind the proxy's back (segments.py, ingester.py).
"""

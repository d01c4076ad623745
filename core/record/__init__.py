"""The record room: what every stage writes into a trace, and nothing that computes it.

`meta.py` (the reproducibility record `make_meta`, `versions`), `request.py` (the request behind a store key:
`request`, beside `core.trace.request_key`), `assembly.py` (a `Trace` from decoded or scored rows:
`assemble`), `problems.py` (the one reader of a problem's fields: `problem_record`, `problem_fields`) and
`typed.py` (which forced tokens were typed: `typed_runs`).
It imports only downward: the trace, errors, settings, the pair and the metric registry.
"""

"""Process telemetry shared by every process (today the JSON log format).

A leaf: it imports only the standard library, so the processors, agents, the HTTP
API and the projections can all use it without depending on one another.
"""

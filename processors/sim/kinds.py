"""Kinds of the simulator's heap entries ``(time_ms, seq, kind, payload)``, and the cell id."""

SUBMIT, TICK, HEARTBEAT, DELIVER, RUN_END, CHECKPOINT, NODE_FAIL, NODE_REPAIR, SAMPLE = range(9)
CELL = "sim"

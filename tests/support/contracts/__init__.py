"""The contract suites of the ports: each runs against every adapter and the fake."""

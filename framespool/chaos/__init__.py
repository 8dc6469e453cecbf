"""The chaos drill: a seeded workload on the embedded stack under injected faults.

``plan`` draws the workload and the fault plan from the seed, ``malformed`` the
undecodable and misplaced records, ``accounting`` the report from the decoded log;
``drill`` runs the stack, injects the plan's faults and collects the log for
``verify``.
It is its own package, not part of the composition root: ``framespool chaos``
(``framespool.commands.chaos``) only parses its flags and calls it.
"""

"""``python -m framespool.services {api,agent}``: the API and agent processes.

    python -m framespool.services api --stack-dir DIR --port P --bootstrap B [--config FILE]
    python -m framespool.services agent --stack-dir DIR --node n0 --cell cell-0 --bootstrap B
    python -m framespool.services agent --stack-dir DIR --simulated \\
        --nodes n0@cell-0/rail-0,n1@cell-1/rail-0 --bootstrap B [--config FILE]

The command Compose and the embedded stack start them with. What it runs is
built in the composition root, :mod:`framespool.bootstrap`
(:func:`~framespool.bootstrap.services_main`: flags, settings, wiring); this
module is only its ``python -m`` name.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from framespool.bootstrap import services_main

    sys.exit(services_main())

"""``python -m framespool.processors {admission,scheduler,clock} --bootstrap HOST:PORT --data-dir DIR``.

The command Compose and the embedded stack start the processors with. What it
runs is built in the composition root, :mod:`framespool.bootstrap`
(:func:`~framespool.bootstrap.processors_main`: flags, wiring, exit statuses);
this module is only its ``python -m`` name, and nothing imports it.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from framespool.bootstrap import processors_main

    sys.exit(processors_main())

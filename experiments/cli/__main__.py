"""``python -m experiments.cli`` is the ``sparsescale`` command (torchrun launches ``ddp`` so)."""

import sys

from experiments.cli.main import main

sys.exit(main())

"""`python -m cpu_grpo ...` is `cpu-grpo ...`."""

import sys

from .cli import main

sys.exit(main())

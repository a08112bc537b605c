"""`python -m vllm_autoheal`: the same entry point as the `vllm-autoheal` command."""

import sys

from .cli import main

sys.exit(main())

"""``python -m vllm_lab_standin`` = the stand-in ``vllm`` command."""

import sys

from .cli import main

sys.exit(main())

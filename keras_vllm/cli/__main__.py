"""`python -m keras_vllm.cli`: the `keras-vllm` command."""

import sys

from keras_vllm.cli.commands import main

sys.exit(main())

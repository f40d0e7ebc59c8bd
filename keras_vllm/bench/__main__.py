"""`python -m keras_vllm.bench`: the benchmark's command line (also the
workers' entry point, `--worker NAME`)."""

import sys

from keras_vllm.bench import run

if __name__ == "__main__":
    sys.exit(run.main())

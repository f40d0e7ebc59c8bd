"""The `keras-vllm` command line (entry point `keras_vllm.cli:main`).

- `commands`: the parser and the commands (`export`, `inspect`, `verify`,
  `demo`, `bench`, ...).
- `serve`, `reload`, `signing`: `keras-vllm serve`, `keras-vllm reload` and
  the signing options and command.
- `inspect_artifact`: what `keras-vllm inspect` prints.
- `demo`: the end-to-end demo on a tiny model built offline.

Nothing in keras-vllm imports this package.
"""

from keras_vllm.cli.commands import EXIT_REFUSED  # noqa: F401
from keras_vllm.cli.commands import main  # noqa: F401

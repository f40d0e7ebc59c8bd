"""The keras-vllm artifact format: one home for every byte on disk.

`export/` writes artifacts and `load/` reads them through this package only;
docs/FORMAT.md describes the same thing in prose. Everything here is plain
Python and JSON: reading or verifying an artifact never imports JAX, Keras
or vLLM, never executes code from the artifact, and never allocates more
than a bound it checked first.

- `names`: file names, vLLM-facing names, limits.
- `files`: confined, bounded file I/O and hashing.
- `manifest`: the manifest's writer and reader (field checks).
- `vllm_files`: `config.json` / `generation_config.json` writers and their
  allowed keys.
- `quantization`: the quantized layers' policy names (format 1.2).
- `configs`: bounds and allowlists of the Keras configs a manifest carries.
- `tokenizer_args`: tokenizer constructor arguments `get_config()` omits
  (format 1.5).
- `checksums`: the files are exactly those listed, bit for bit.
- `consistency`: the files agree with each other and with the manifest.
- `opened`: `open_artifact()`, an `Artifact` verified afresh per open.

Example:

```python
from keras_vllm import format as artifact_format

opened = artifact_format.open_artifact("exports/tuned")  # + checksums
opened.validate()                                        # + consistency
print(opened.manifest["weights"]["mode"])
```
"""

from keras_vllm.format import adapter
from keras_vllm.format import quantization
from keras_vllm.format import tokenizer_args
from keras_vllm.format.checksums import manifest_hash
from keras_vllm.format.checksums import verify_files
from keras_vllm.format.consistency import validate_artifact
from keras_vllm.format.files import file_table
from keras_vllm.format.files import list_files
from keras_vllm.format.files import read_json
from keras_vllm.format.files import safe_join
from keras_vllm.format.files import sha256_file
from keras_vllm.format.files import sha256_files
from keras_vllm.format.files import write_json
from keras_vllm.format.manifest import new_manifest
from keras_vllm.format.manifest import read_manifest
from keras_vllm.format.manifest import tokenizer_fingerprint
from keras_vllm.format.manifest import validate_manifest
from keras_vllm.format.manifest import validate_shape
from keras_vllm.format.names import *  # noqa: F401,F403
from keras_vllm.format.opened import Artifact
from keras_vllm.format.opened import open_artifact
from keras_vllm.format.serving import no_prefix_caching_message
from keras_vllm.format.serving import prefix_caching
from keras_vllm.format.serving import served_modalities
from keras_vllm.format.image_settings import image_settings
from keras_vllm.format.serving import unserved_inputs

"""Format-aware hostile cases for the artifact's trust boundary (issue 13).

Each case edits a good artifact's own files as an attacker would, and
rewrites the manifest's checksums (and the tokenizer fingerprint) so that
checksum verification passes and a deeper check must refuse it. Classes:

- `outside`: a field or file that would make a reader open a path outside
  the artifact (canary files stand at those paths), or a non-regular file;
- `integrity`: the weights index disagrees with orbax or the model, or a
  delta artifact does not pin what its backbone reads;
- `bounds`: a config, asset or count that would allocate or work far
  beyond what is stored;
- `exec`: a value that a careless loader would execute (it would create
  the code-execution canary).

`CASES` holds `Case(name, klass, base, mutate, message, may_load)`: `base`
is the good artifact it starts from (`spm`: a full Llama, `bpe`: a full
GPT-2, `delta`: a Llama delta over a local preset); `message` a regular
expression every refusal must match; `may_load` the readers that do not
read the damaged part, which must then either refuse or load what the
good artifact loads.
"""

# Importing the case modules registers their cases, in this order.
from helpers import trust_outside  # noqa: E402, F401, I001
from helpers import trust_weights  # noqa: E402, F401
from helpers.trust_edits import CASES  # noqa: E402, F401
from helpers.trust_edits import NOT_PRESET  # noqa: E402, F401
from helpers.trust_edits import NOT_WEIGHTS  # noqa: E402, F401
from helpers.trust_edits import READERS  # noqa: E402, F401

"""Signed artifacts, with OpenSSF model-signing (key- or certificate-based).

An artifact's signature is `model.sig` inside its directory, over every
other file (the manifest included), so a copied directory still verifies.
This package sits beside `keras_vllm.format` (which stays stdlib-only): the
format's readers call `require_signature` before they open the manifest.

- `Signer`, `sign_artifact`: write the signature (export or afterwards).
- `verify_signature`: check it against a public key or certificate chain.
- `require_signature`: a reader's policy (`public_key=` or
  `KERAS_VLLM_PUBLIC_KEY`).

Example:

```python
causal_lm.export_vllm("exports/tuned", signing_key="ci/signing.pem")
keras_vllm.verify_signature("exports/tuned", "ci/signing.pub.pem")
keras_vllm.load_causal_lm("exports/tuned", public_key="ci/signing.pub.pem")
```
"""

from keras_vllm.signing.policy import require_signature
from keras_vllm.signing.sign import Signer
from keras_vllm.signing.sign import as_signer
from keras_vllm.signing.sign import sign_artifact
from keras_vllm.signing.verify import verify_signature

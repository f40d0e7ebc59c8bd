"""Generates malformed and hostile artifacts from a good one.

`make_corpus(good_artifact_dir, out_dir)` copies the good artifact once per
case and damages the copy: truncation, bit flips, path traversal, symlinks
out of the artifact, huge or negative dimensions, wrong dtypes, missing and
extra files, manifest type confusion, swapped tokenizer assets, config and
manifest that disagree, class names off the allowlist, version skew.

Many cases also rewrite the manifest's file table ("rehash") so that the
checksums pass and a deeper check has to catch the damage, as it would for
a deliberately crafted artifact.

Run as a script to write a corpus:

    python tests/helpers/hostile_corpus.py GOOD_ARTIFACT OUT_DIR
"""

import os
import shutil
import sys

if not __package__:
    # Run as a script: make `helpers` importable.
    sys.path.insert(
        0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )

# Importing the case modules registers their cases, in this order.
from helpers import hostile_files  # noqa: E402, F401, I001
from helpers import hostile_contents  # noqa: E402, F401
from helpers.hostile_edits import CASES as _CASES  # noqa: E402
from helpers.hostile_edits import EXPECTED_MESSAGES  # noqa: E402, F401


def make_corpus(good_artifact_dir, out_dir):
    """Writes every hostile case as a damaged copy of a good artifact.

    Args:
        good_artifact_dir: an artifact of a tiny llama (full weights).
        out_dir: where to write the cases (one directory each).

    Returns:
        A list of `(case_name, path, expected_error_type)`; the message each
        error must match is `EXPECTED_MESSAGES[case_name]`.
    """
    good_artifact_dir = os.fspath(good_artifact_dir)
    out_dir = os.path.abspath(os.fspath(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    cases = []
    for name, mutate, error in _CASES:
        path = os.path.join(out_dir, name, "artifact")
        scratch = os.path.join(out_dir, name, "outside")
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        os.makedirs(scratch)
        shutil.copytree(good_artifact_dir, path)
        mutate(path, {"scratch": scratch, "out_dir": out_dir})
        cases.append((name, path, error))
    return cases


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    for name, path, error in make_corpus(sys.argv[1], sys.argv[2]):
        print(f"{name:40s} {error.__name__:24s} {path}")

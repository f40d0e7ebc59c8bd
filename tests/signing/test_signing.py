"""Signed artifacts: `model.sig` (OpenSSF model-signing) over every file.

One signed artifact is exported; each hostile case is a copy of it with one
edit. Every case must be refused, with keras-vllm's `SignatureError` naming
what changed, by every reader that has a signature policy: the CLI
(`--public-key`), `load_causal_lm(public_key=)`,
`KerasVllmEngine.from_export(public_key=)`, plain `vllm serve`'s refusal
check and the vLLM tokenizer adapter (`KERAS_VLLM_PUBLIC_KEY`), before the
manifest is parsed. No engine starts here.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric import rsa

import keras_vllm
from helpers.trained_models import trained
from keras_vllm import envs
from keras_vllm import format as fmt
from keras_vllm.serve.frontend import refusals
from keras_vllm import signing
from keras_vllm.format import opened as opened_module

BIN = os.path.dirname(sys.executable)


def _write_key(directory, name, key):
    private = os.path.join(directory, f"{name}.pem")
    public = os.path.join(directory, f"{name}.pub.pem")
    with open(private, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    with open(public, "wb") as f:
        f.write(
            key.public_key().public_bytes(
                serialization.Encoding.PEM,
                serialization.PublicFormat.SubjectPublicKeyInfo,
            )
        )
    return private, public


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("keys"))
    ours = _write_key(root, "ours", ec.generate_private_key(ec.SECP256R1()))
    other = _write_key(root, "other", ec.generate_private_key(ec.SECP384R1()))
    rsa_key = _write_key(
        root, "rsa", rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )
    return {"ours": ours, "other": other, "rsa": rsa_key}


def _flip_byte(path, offset=None):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        i = len(data) // 2 if offset is None else offset
        data[i] ^= 0x01
        f.seek(0)
        f.write(data)


def _largest(directory, under):
    files = [
        rel for rel in fmt.list_files(directory) if rel.startswith(under)
    ]
    return max(files, key=lambda rel: os.path.getsize(os.path.join(directory, rel)))


def _rehash(directory, rel):
    """Rewrites the manifest's checksum of `rel` to match its new bytes."""
    path = os.path.join(directory, fmt.MANIFEST_FILE)
    with open(path) as f:
        manifest = json.load(f)
    full = os.path.join(directory, rel)
    manifest["files"][rel] = {
        "sha256": fmt.sha256_file(full),
        "bytes": os.path.getsize(full),
    }
    fmt.write_json(path, manifest)


def _edit_manifest_value(d):
    # Valid JSON, a valid manifest and matching checksums: only the
    # signature sees it (the manifest holds the checksums).
    path = os.path.join(d, fmt.MANIFEST_FILE)
    with open(path) as f:
        manifest = json.load(f)
    # Keras' generate() would silently truncate prompts to 7 tokens.
    manifest["preprocessor"]["config"]["sequence_length"] = 7
    fmt.write_json(path, manifest)
    return fmt.MANIFEST_FILE


def _garble_manifest(d):
    with open(os.path.join(d, fmt.MANIFEST_FILE), "w") as f:
        f.write("{not json")
    return fmt.MANIFEST_FILE


def _flip_weights(d):
    rel = _largest(d, fmt.WEIGHTS_DIR + "/")
    _flip_byte(os.path.join(d, rel))
    return rel


def _flip_tokenizer_asset(d):
    rel = _largest(d, fmt.TOKENIZER_ASSETS_DIR + "/")
    _flip_byte(os.path.join(d, rel))
    return rel


def _rehashed_golden(d):
    # Edit a file and rewrite the manifest's checksums consistently: the
    # checksums pass, the signature (over the manifest too) does not.
    path = os.path.join(d, fmt.GOLDEN_FILE)
    with open(path) as f:
        golden = json.load(f)
    golden["outputs"][0]["prompt"] = "tampered"
    fmt.write_json(path, golden)
    _rehash(d, fmt.GOLDEN_FILE)
    return f"'{fmt.GOLDEN_FILE}', '{fmt.MANIFEST_FILE}' were changed"


def _remove_file(d):
    os.remove(os.path.join(d, fmt.GENERATION_CONFIG_FILE))
    return fmt.GENERATION_CONFIG_FILE


def _add_file(d):
    # model-signing ignores git files by default; keras-vllm signs them.
    with open(os.path.join(d, ".gitignore"), "w") as f:
        f.write("*\n")
    return ".gitignore"


def _resign_with_other_key(keys):
    def edit(d):
        signing.Signer(keys["other"][0]).sign(d)
        return "another key"

    return edit


def _sign_leaving_out(keys, *left_out):
    """Signs with plain model-signing and its ignore-paths (as
    `model_signing sign key --ignore-paths ...` does)."""

    def edit(d):
        from model_signing import hashing
        from model_signing import signing as ms_signing

        config = hashing.Config().use_file_serialization(
            hashing_algorithm="sha256", allow_symlinks=False
        ).set_ignored_paths(
            paths=[fmt.SIGNATURE_FILE, *left_out], ignore_git_paths=False
        )
        ms_signing.Config().use_elliptic_key_signer(
            private_key=keys["ours"][0]
        ).set_hashing_config(config).sign(
            d, os.path.join(d, fmt.SIGNATURE_FILE)
        )
        if fmt.MANIFEST_FILE in left_out:
            # The unsigned manifest, edited after signing: a different
            # model under a key that "verified".
            _edit_manifest_value(d)
        return f"does not cover '{left_out[0]}'"

    return edit


def _unsign(d):
    os.remove(os.path.join(d, fmt.SIGNATURE_FILE))
    return "is not signed"


EDITS = {
    "manifest_value": _edit_manifest_value,
    "manifest_garbage": _garble_manifest,
    "weights_byte": _flip_weights,
    "tokenizer_asset_byte": _flip_tokenizer_asset,
    "rehashed_manifest": _rehashed_golden,
    "removed_file": _remove_file,
    "added_file": _add_file,
    "other_key": None,  # needs the keys; see `artifacts`
    "unsigned": _unsign,
    # Signatures that leave files out (model-signing's ignore-paths).
    "left_out_golden": None,
    "left_out_manifest": None,
}
LEFT_OUT = {
    "left_out_golden": (fmt.GOLDEN_FILE,),
    "left_out_manifest": (fmt.MANIFEST_FILE,),
}


@pytest.fixture(scope="module")
def artifacts(keys, tmp_path_factory):
    root = tmp_path_factory.mktemp("signed")
    signed = keras_vllm.export_vllm(
        trained("gpt2"),
        str(root / "signed"),
        golden_prompts=["the quick"],
        golden_max_new_tokens=4,
        signing_key=keys["ours"][0],
    )
    cases = {}
    for name, edit in EDITS.items():
        if name in LEFT_OUT:
            edit = _sign_leaving_out(keys, *LEFT_OUT[name])
        edit = edit or _resign_with_other_key(keys)
        path = str(root / name)
        shutil.copytree(signed, path)
        cases[name] = (path, edit(path))
    return {"signed": signed, "cases": cases, "root": root}


@pytest.fixture
def no_policy(monkeypatch):
    monkeypatch.delenv(envs.PUBLIC_KEY.name, raising=False)


@pytest.fixture
def manifest_never_parsed(monkeypatch):
    """Fails the test if a refused artifact's manifest is read."""

    def refuse(directory, **_):
        raise AssertionError(f"the manifest of {directory} was read")

    monkeypatch.setattr(opened_module, "read_manifest", refuse)


def _says(message, case):
    path, what = case
    assert "SignatureError" in message or "signature" in message.lower()
    assert what in message, message
    assert path in message, message


# -- sign -> verify ----------------------------------------------------------


def test_export_signs_inside_the_staging_directory(artifacts, keys):
    signed = artifacts["signed"]
    assert fmt.SIGNATURE_FILE in os.listdir(signed)
    assert fmt.SIGNATURE_FILE not in fmt.open_artifact(signed).manifest["files"]
    assert keras_vllm.verify_signature(signed, keys["ours"][1]).endswith(
        fmt.SIGNATURE_FILE
    )
    # Nothing of the signing is left beside the artifact.
    assert not [n for n in os.listdir(artifacts["root"]) if n.startswith(".")]


def test_a_copied_directory_still_verifies(artifacts, keys, tmp_path):
    copy = shutil.copytree(artifacts["signed"], tmp_path / "elsewhere" / "x")
    keras_vllm.verify_signature(copy, keys["ours"][1])


def test_load_causal_lm_with_the_right_key(artifacts, keys, no_policy):
    import numpy as np

    loaded = keras_vllm.load_causal_lm(
        artifacts["signed"], public_key=keys["ours"][1]
    )
    x = {"token_ids": np.array([[3, 4, 5]]), "padding_mask": np.ones((1, 3))}
    assert np.array_equal(
        np.asarray(loaded(x)), np.asarray(trained("gpt2")(x))
    )


def test_sign_an_existing_artifact_atomically(artifacts, keys, tmp_path):
    path = shutil.copytree(artifacts["cases"]["unsigned"][0], tmp_path / "a")
    before = set(os.listdir(tmp_path))
    keras_vllm.sign_artifact(path, keys["ours"][0])
    keras_vllm.verify_signature(path, keys["ours"][1])
    # Re-signing with another key replaces the signature in one rename.
    keras_vllm.sign_artifact(path, signing.Signer(keys["other"][0]))
    keras_vllm.verify_signature(path, keys["other"][1])
    with pytest.raises(keras_vllm.SignatureError, match="another key"):
        keras_vllm.verify_signature(path, keys["ours"][1])
    assert set(os.listdir(tmp_path)) == before  # no temporary files
    assert sorted(os.listdir(path)) == sorted(
        os.listdir(artifacts["signed"])
    )
    mode = os.stat(os.path.join(path, fmt.SIGNATURE_FILE)).st_mode & 0o777
    assert mode == os.stat(os.path.join(path, fmt.MANIFEST_FILE)).st_mode & 0o777


def test_bytes_rewritten_after_a_verified_load_are_refused_next_time(
    artifacts, keys, tmp_path, no_policy
):
    """Nothing verified is trusted from file stats: the next load in the
    same process hashes again (size, inode and mtime kept here)."""
    path = str(shutil.copytree(artifacts["signed"], tmp_path / "a"))
    public = keys["ours"][1]
    keras_vllm.verify_signature(path, public)
    assert keras_vllm.load_causal_lm(path, public_key=public) is not None
    rel = _largest(path, fmt.WEIGHTS_DIR + "/")
    full = os.path.join(path, rel)
    before = os.stat(full)
    _flip_byte(full)
    os.utime(full, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(full)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns
    )
    for read in (
        lambda: keras_vllm.verify_signature(path, public),
        lambda: keras_vllm.load_causal_lm(path, public_key=public),
    ):
        with pytest.raises(keras_vllm.SignatureError, match=rel):
            read()
    # Without a policy the checksums refuse it the same way.
    with pytest.raises(keras_vllm.IntegrityError, match=rel):
        keras_vllm.load_causal_lm(path)


def test_sign_refuses_an_artifact_that_fails_its_checksums(artifacts, keys, tmp_path):
    path = shutil.copytree(artifacts["cases"]["unsigned"][0], tmp_path / "a")
    _flip_weights(path)
    with pytest.raises(keras_vllm.IntegrityError, match="SHA-256"):
        keras_vllm.sign_artifact(path, keys["ours"][0])
    assert fmt.SIGNATURE_FILE not in os.listdir(path)


@pytest.mark.parametrize(
    "which, says",
    [
        ("rsa", "elliptic-curve keys only"),
        ("missing", "Cannot read the signing key"),
        ("public", "not a PEM private key"),
    ],
)
def test_unusable_signing_keys_are_refused_before_export(
    keys, tmp_path, which, says
):
    key = {
        "rsa": keys["rsa"][0],
        "missing": str(tmp_path / "nope.pem"),
        "public": keys["ours"][1],
    }[which]
    with pytest.raises(keras_vllm.SignatureError, match=says):
        keras_vllm.export_vllm(
            trained("gpt2"), str(tmp_path / "out"), signing_key=key
        )
    assert not os.path.exists(tmp_path / "out")
    assert os.listdir(tmp_path) == []


def test_unsigned_artifacts_keep_working_without_a_policy(artifacts, no_policy):
    unsigned = artifacts["cases"]["unsigned"][0]
    assert keras_vllm.load_causal_lm(unsigned, verify=True) is not None
    assert refusals.refusal(unsigned) is None


# -- each hostile case, refused by every reader ------------------------------


def test_without_a_policy_only_the_signature_would_notice(artifacts, no_policy):
    """The cases the checksums cannot see: why signatures exist."""
    for name in ("manifest_value", "rehashed_manifest", "other_key", "unsigned"):
        fmt.open_artifact(artifacts["cases"][name][0]).validate()


@pytest.mark.parametrize("name", sorted(EDITS))
def test_load_causal_lm_refuses(
    artifacts, keys, no_policy, manifest_never_parsed, name
):
    case = artifacts["cases"][name]
    with pytest.raises(keras_vllm.SignatureError) as raised:
        keras_vllm.load_causal_lm(case[0], public_key=keys["ours"][1])
    _says(str(raised.value), case)


@pytest.mark.parametrize("name", sorted(EDITS))
def test_from_export_refuses_before_vllm_starts(
    artifacts, keys, no_policy, manifest_never_parsed, name
):
    from keras_vllm.serve.engine.engine import KerasVllmEngine

    import vllm

    case = artifacts["cases"][name]

    def started(*args, **kwargs):
        raise AssertionError("vLLM started before the refusal")

    # Refused before vLLM starts: `vllm.LLM` is never constructed (a wall
    # clock bound here flaked on a loaded 2-core host).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm, "LLM", started)
        with pytest.raises(keras_vllm.SignatureError) as raised:
            KerasVllmEngine.from_export(case[0], public_key=keys["ours"][1])
    _says(str(raised.value), case)
    assert envs.PUBLIC_KEY.raw() is None  # nothing leaked to the process


@pytest.mark.parametrize("name", sorted(EDITS))
def test_server_policy_refuses(
    artifacts, keys, monkeypatch, manifest_never_parsed, name
):
    """`KERAS_VLLM_PUBLIC_KEY`: plain `vllm serve`'s refusal check, the
    tokenizer adapter of its front-end and the readers of its engine."""
    from keras_vllm.load.opening import open_verified
    from keras_vllm.serve.tokenizer import KerasVllmTokenizer

    monkeypatch.setenv(envs.PUBLIC_KEY.name, keys["ours"][1])
    case = artifacts["cases"][name]
    _says(refusals.refusal(case[0]), case)
    for read in (KerasVllmTokenizer.from_pretrained, open_verified):
        with pytest.raises(keras_vllm.SignatureError) as raised:
            read(case[0])
        _says(str(raised.value), case)


@pytest.mark.parametrize("name", ["weights_byte", "other_key", "added_file"])
def test_each_worker_verifies_before_it_reads(
    artifacts, keys, monkeypatch, manifest_never_parsed, name
):
    """The served model's `load_weights`, the first artifact read in each
    vLLM worker (one per node of a multi-host engine), verifies with the
    key of that worker's own environment before anything else."""
    from types import SimpleNamespace

    from keras_vllm.serve.worker.model import KerasVllmForCausalLM

    monkeypatch.setenv(envs.PUBLIC_KEY.name, keys["ours"][1])
    case = artifacts["cases"][name]
    # What the model reads of vLLM's `VllmConfig` (no speculation).
    config = SimpleNamespace(
        model_config=SimpleNamespace(model=case[0], dtype="float32"),
        speculative_config=None,
    )
    with pytest.raises(keras_vllm.SignatureError) as raised:
        KerasVllmForCausalLM(config).load_weights()
    _says(str(raised.value), case)


def test_server_policy_passes_the_signed_artifact(artifacts, keys, monkeypatch):
    from keras_vllm.serve.tokenizer import KerasVllmTokenizer

    monkeypatch.setenv(envs.PUBLIC_KEY.name, keys["ours"][1])
    assert refusals.refusal(artifacts["signed"]) is None
    assert KerasVllmTokenizer.from_pretrained(artifacts["signed"]).encode("the")


def test_server_policy_refuses_an_unsigned_hugging_face_directory(
    keys, monkeypatch, tmp_path
):
    # An artifact swapped for a checkpoint vLLM serves natively must not
    # slip past the policy.
    with open(tmp_path / "config.json", "w") as f:
        f.write('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    assert refusals.refusal(str(tmp_path)) is None
    monkeypatch.setenv(envs.PUBLIC_KEY.name, keys["ours"][1])
    assert "is not signed" in refusals.refusal(str(tmp_path))


def test_bad_public_keys_name_the_file(artifacts, keys, tmp_path, no_policy):
    with pytest.raises(keras_vllm.SignatureError, match="elliptic-curve"):
        keras_vllm.verify_signature(artifacts["signed"], keys["rsa"][1])
    missing = str(tmp_path / "missing.pub")
    with pytest.raises(keras_vllm.SignatureError, match="missing.pub"):
        keras_vllm.load_causal_lm(artifacts["signed"], public_key=missing)


def test_a_hostile_signature_file_is_a_signature_error(artifacts, keys, tmp_path):
    path = shutil.copytree(artifacts["signed"], tmp_path / "a")
    for content in (b"", b"\xff\xfe", b"[]", b'{"verificationMaterial": 1}',
                    b"[" * 100_000):
        with open(os.path.join(path, fmt.SIGNATURE_FILE), "wb") as f:
            f.write(content)
        with pytest.raises(keras_vllm.SignatureError, match="model.sig"):
            keras_vllm.verify_signature(path, keys["ours"][1])


# -- the command line, and an install without vLLM ---------------------------

# One process with vLLM made unimportable (an export-only install): it
# exports with a signing key, signs with `keras-vllm sign`, and runs
# `keras-vllm verify --public-key` on the signed artifact and on every case.
EXPORT_ONLY = textwrap.dedent(
    """
    import contextlib, importlib.abc, io, json, sys

    BLOCKED = ("vllm", "tpu_inference", "torch", "torchax")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked (export-only install)")
            return None

    sys.meta_path.insert(0, Block())

    import keras_vllm
    from keras_vllm import testing
    from keras_vllm.cli import commands as cli

    key, pub, out, unsigned, cases = sys.argv[1:6]
    lm = testing.build_tiny_causal_lm("gpt2")
    keras_vllm.export_vllm(lm, out, golden_prompts=["the"], signing_key=key)
    keras_vllm.verify_signature(out, pub)

    def run(*argv):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = cli.main(list(argv))
        return {"rc": rc, "stderr": err.getvalue()}

    results = {
        "sign": run("sign", unsigned, "--key", key),
        "signed": run("verify", out, "--public-key", pub),
        "resigned": run("verify", unsigned, "--public-key", pub),
    }
    for name, path in json.loads(cases).items():
        results[name] = run("verify", path, "--public-key", pub)
    # (A None entry blocks an import: `keras-vllm export` sets them.)
    blocked = [
        m for m, module in sys.modules.items()
        if module is not None and m.split(".")[0] in BLOCKED
    ]
    print("RESULTS " + json.dumps({"results": results, "blocked": blocked}))
    """
)


def test_cli_and_export_only_install(artifacts, keys, tmp_path):
    unsigned = shutil.copytree(
        artifacts["cases"]["unsigned"][0], tmp_path / "unsigned"
    )
    cases = {name: case[0] for name, case in artifacts["cases"].items()}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            EXPORT_ONLY,
            keys["ours"][0],
            keys["ours"][1],
            str(tmp_path / "exported"),
            str(unsigned),
            json.dumps(cases),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [l for l in result.stdout.splitlines() if l.startswith("RESULTS ")]
    assert lines, result.stderr[-3000:]
    report = json.loads(lines[0][len("RESULTS "):])
    assert report["blocked"] == []
    results = report["results"]
    for name in ("sign", "signed", "resigned"):
        assert results[name]["rc"] == 0, results[name]
    for name, case in artifacts["cases"].items():
        assert results[name]["rc"] == 3, (name, results[name])
        assert "keras-vllm: SignatureError: " in results[name]["stderr"]
        _says(results[name]["stderr"], case)


def test_cli_entry_points(artifacts, keys, tmp_path):
    """The installed `keras-vllm` script: verify's exit code and message,
    and `keras-vllm serve --public-key` refusing before vLLM starts."""
    case = artifacts["cases"]["rehashed_manifest"]
    cli = os.path.join(BIN, "keras-vllm")
    result = subprocess.run(
        [cli, "verify", case[0], "--public-key", keys["ours"][1]],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 3, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    _says(result.stderr, case)
    result = subprocess.run(
        [cli, "serve", case[0], "--port", "0", "--public-key", keys["ours"][1]],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 3, result.stderr[-3000:]
    _says(result.stderr, case)
    assert "vllm serve" not in result.stdout  # refused before the command


def test_plain_vllm_serve_refuses_under_the_policy(artifacts, keys):
    """`KERAS_VLLM_PUBLIC_KEY` with plain `vllm serve` (the artifact passes
    its checksums: only the signature can refuse it)."""
    case = artifacts["cases"]["rehashed_manifest"]
    result = subprocess.run(
        [os.path.join(BIN, "vllm"), "serve", case[0], "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, envs.PUBLIC_KEY.name: keys["ours"][1]},
    )
    assert result.returncode == refusals.EXIT_REFUSED, result.stderr[-3000:]
    assert "keras-vllm refused vllm serve: SignatureError: " in result.stderr
    _says(result.stderr, case)
    # Exit 3 is the plugin's refusal while vLLM reads its arguments, before
    # any engine starts (a wall-clock bound here flaked on a loaded host).
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("digest", ["b'\\x01'", "b'\"'"])
def test_mismatch_messages_name_the_files_however_they_are_quoted(digest):
    from keras_vllm.signing.verify import _explain

    diffs = [
        "Extra files found in model 'm': a.txt, b.txt",
        "Missing files in model 'm': config.json",
        f"Hash mismatch for 'weights/x': Expected '{digest}', Actual '{digest}'",
        f"Hash mismatch for 'golden.json': Expected '{digest}', Actual 'x'",
    ]
    text = _explain(ValueError(f"Signature mismatch: {diffs}"))
    assert "files 'weights/x', 'golden.json' were changed" in text
    assert "'a.txt, b.txt' was added" in text
    assert "'config.json' is missing" in text


# -- certificate-based signing (offline: a chain of trust, no Sigstore) -------


def _certificate(directory, name, key, issuer_key=None, issuer=None):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    is_ca = issuer is None
    now = datetime.datetime.now(datetime.timezone.utc)
    usage = dict.fromkeys(
        ("digital_signature", "content_commitment", "key_encipherment",
         "data_encipherment", "key_agreement", "key_cert_sign", "crl_sign",
         "encipher_only", "decipher_only"),
        False,
    )
    usage.update(
        {"key_cert_sign": True, "crl_sign": True} if is_ca
        else {"digital_signature": True}
    )
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if is_ca else issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), True)
        .add_extension(x509.KeyUsage(**usage), True)
        .sign(issuer_key or key, hashes.SHA256())
    )
    path = os.path.join(directory, f"{name}.crt")
    with open(path, "wb") as f:
        f.write(certificate.public_bytes(serialization.Encoding.PEM))
    return path, certificate


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("pki"))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_path, ca = _certificate(root, "ca", ca_key)
    other_ca_path, _ = _certificate(
        root, "other_ca", ec.generate_private_key(ec.SECP256R1())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    key_path, _ = _write_key(root, "leaf", leaf_key)
    leaf_path, _ = _certificate(root, "leaf", leaf_key, ca_key, ca)
    return {"ca": ca_path, "other_ca": other_ca_path, "key": key_path,
            "leaf": leaf_path}


def test_certificate_signing_verifies_against_its_chain(
    artifacts, certificates, tmp_path
):
    path = shutil.copytree(artifacts["cases"]["unsigned"][0], tmp_path / "a")
    with pytest.raises(keras_vllm.SignatureError, match="issuing chain"):
        signing.Signer(certificates["key"], certificate=certificates["leaf"])
    signer = signing.Signer(
        certificates["key"],
        certificate=certificates["leaf"],
        certificate_chain=[certificates["ca"]],
    )
    keras_vllm.sign_artifact(path, signer)
    keras_vllm.verify_signature(path, certificate_chain=[certificates["ca"]])
    with pytest.raises(keras_vllm.SignatureError, match="other_ca.crt"):
        keras_vllm.verify_signature(
            path, certificate_chain=[certificates["other_ca"]]
        )
    _flip_weights(path)
    with pytest.raises(keras_vllm.SignatureError, match="was changed"):
        keras_vllm.verify_signature(path, certificate_chain=[certificates["ca"]])


def test_a_certificate_for_another_key_is_refused(certificates, keys):
    with pytest.raises(keras_vllm.SignatureError, match="not for the key"):
        signing.Signer(
            keys["ours"][0],
            certificate=certificates["leaf"],
            certificate_chain=[certificates["ca"]],
        )


def test_links_and_fifos_are_refused_before_hashing(artifacts, keys, tmp_path):
    path = shutil.copytree(artifacts["signed"], tmp_path / "a")
    os.mkfifo(os.path.join(path, "pipe"))  # hashing it would block forever
    with pytest.raises(keras_vllm.ArtifactError, match="'pipe' is not a regular"):
        keras_vllm.verify_signature(path, keys["ours"][1])
    os.remove(os.path.join(path, "pipe"))
    os.symlink("/etc/passwd", os.path.join(path, "link"))
    with pytest.raises(keras_vllm.ArtifactError, match="'link' is a symbolic"):
        keras_vllm.verify_signature(path, keys["ours"][1])


def test_serve_hands_the_policy_to_vllm_serve(artifacts, keys, monkeypatch):
    """`keras-vllm serve --public-key` checks the signature, then runs
    `vllm serve` with `KERAS_VLLM_PUBLIC_KEY` (its processes check again)."""
    from keras_vllm.cli import commands as cli

    ran = {}

    def execv(program, argv):
        ran["argv"] = argv
        ran["key"] = os.environ.get(envs.PUBLIC_KEY.name)
        raise SystemExit(0)

    saved = dict(os.environ)
    monkeypatch.setattr(os, "execv", execv)
    try:
        args, _ = cli.build_parser().parse_known_args(
            ["-q", "serve", artifacts["signed"], "--port", "1",
             "--public-key", keys["ours"][1]]
        )
        with pytest.raises(SystemExit):
            args.func(args)  # not main(): it configures logging
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert ran["key"] == keys["ours"][1]
    assert "--public-key" not in ran["argv"] and "--port" in ran["argv"]

"""Safe file I/O of the artifact format: listing, joining, JSON, hashing.

Every read here is bounded and confined: nothing follows a link, opens a
special file (a FIFO would block), leaves the artifact directory or reads
more than a limit it checked first. Plain Python only.
"""

import hashlib
import json
import os
import stat
import threading
from concurrent import futures

from keras_vllm.errors import ArtifactError
from keras_vllm.errors import IntegrityError
from keras_vllm.format.names import MANIFEST_FILE
from keras_vllm.format.names import MAX_FILES
from keras_vllm.format.names import MAX_JSON_FILE_BYTES
from keras_vllm.format.names import SIGNATURE_FILE

_CHUNK = 1 << 20
# Threads that hash files at once: hashlib and file reads release the GIL,
# so an artifact's files hash on several cores (a 16 GB checkpoint takes
# ~10 s on one core at ~1.6 GB/s). More than 8 readers gain nothing on
# one disk.
_MAX_HASH_THREADS = 8


def sha256_file(path, on_bytes=None):
    """Returns the hex SHA-256 of a file, read in bounded chunks.

    Args:
        path: the file.
        on_bytes: called with the size of each chunk read (progress).
    """
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ArtifactError(
                f"'{path}' is not a regular file (a FIFO, device or socket); "
                "it is refused without being read."
            )
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            digest.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return digest.hexdigest()


def sha256_files(paths, on_bytes=None):
    """Returns the hex SHA-256 of each file, in order, hashed in parallel.

    Args:
        paths: the files.
        on_bytes: called with the size of each chunk read (progress); calls
            from the hashing threads are serialized.

    Raises:
        ArtifactError: for a path that is not a regular file (the first in
            `paths` order).
    """
    paths = list(paths)
    workers = min(_MAX_HASH_THREADS, os.cpu_count() or 1, len(paths))
    if workers <= 1:
        return [sha256_file(path, on_bytes) for path in paths]
    if on_bytes is not None:
        lock, report = threading.Lock(), on_bytes

        def on_bytes(n):
            with lock:
                report(n)

    with futures.ThreadPoolExecutor(
        workers, thread_name_prefix="keras_vllm_sha256"
    ) as pool:
        return list(pool.map(lambda p: sha256_file(p, on_bytes), paths))


def list_files(directory):
    """Lists every regular file below `directory` as sorted relative paths.

    Raises:
        ArtifactError: if the tree holds a symlink or a special file (an
            artifact is plain files and folders only).
    """
    found = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            full = os.path.join(root, name)
            mode = os.lstat(full).st_mode
            rel = os.path.relpath(full, directory).replace(os.sep, "/")
            if stat.S_ISLNK(mode):
                raise ArtifactError(
                    f"Artifact entry '{rel}' is a symbolic link. Artifacts "
                    "hold plain files only; re-export the model instead of "
                    "linking files into the artifact."
                )
            if stat.S_ISREG(mode):
                found.append(rel)
            elif not stat.S_ISDIR(mode):
                raise ArtifactError(
                    f"Artifact entry '{rel}' is not a regular file."
                )
            if len(found) > MAX_FILES:
                raise ArtifactError(
                    f"Artifact holds more than {MAX_FILES} files."
                )
    return sorted(found)


def file_table(
    directory, exclude=(MANIFEST_FILE, SIGNATURE_FILE), on_bytes=None
):
    """Returns `{relative_path: {"sha256", "bytes"}}` for an artifact tree
    (all files but the manifest and the signature, which covers the others).

    `on_bytes` is called with each chunk's size while hashing (progress).
    """
    names = [rel for rel in list_files(directory) if rel not in exclude]
    fulls = [os.path.join(directory, rel) for rel in names]
    return {
        rel: {"sha256": digest, "bytes": os.path.getsize(full)}
        for rel, full, digest in zip(
            names, fulls, sha256_files(fulls, on_bytes)
        )
    }


def safe_join(directory, relative):
    """Joins a manifest-supplied path to the artifact root, confined to it.

    Raises:
        ArtifactError: for absolute paths, `..` components, or paths that
            resolve (through links) outside the artifact.
    """
    if not isinstance(relative, str) or not relative:
        raise ArtifactError(f"Invalid file reference {relative!r}.")
    if relative.startswith(("/", "\\")) or os.path.isabs(relative):
        raise ArtifactError(
            f"File reference '{relative}' is absolute; artifact files must "
            "be relative to the artifact directory."
        )
    parts = relative.replace("\\", "/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ArtifactError(
            f"File reference '{relative}' leaves the artifact directory."
        )
    root = os.path.realpath(directory)
    full = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, full]) != root:
        raise ArtifactError(
            f"File reference '{relative}' resolves outside the artifact."
        )
    return full


def read_bytes(path, limit, what=None, follow=False):
    """Reads a regular file of at most `limit` bytes.

    The file is opened without blocking and without following a final
    symbolic link (unless `follow`), and checked to be a regular file on
    the open descriptor, so a FIFO, device or socket put in its place is
    refused instead of blocking or streaming forever.

    Raises:
        ArtifactError: naming `what` for a missing, special or larger file.
    """
    what = what or os.path.basename(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise ArtifactError(
            f"Cannot read {what}: {e.strerror or e} (a symbolic link or "
            "missing file). Artifacts hold plain files only."
        ) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError(
                f"{what} is not a regular file (a FIFO, device or socket); "
                "it is refused without being read."
            )
        if st.st_size > limit:
            raise ArtifactError(
                f"{what} is {st.st_size} bytes, more than the {limit} allowed."
            )
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise ArtifactError(f"Cannot read {what}: {e}.") from None
    if len(data) > limit:
        raise ArtifactError(f"{what} is more than the {limit} bytes allowed.")
    return data


def regular_file_size(path, what):
    """The size of a regular file (following links, as keras-hub's preset
    caches use them); refuses FIFOs, devices, sockets and directories."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise ArtifactError(f"Cannot read {what}: {e.strerror or e}.") from None
    if not stat.S_ISREG(st.st_mode):
        raise ArtifactError(
            f"{what} is not a regular file (a FIFO, device, socket or "
            "directory); it is refused without being read."
        )
    return st.st_size


def read_json(path, limit=MAX_JSON_FILE_BYTES, what=None, follow=False,
              sha256=None):
    """Reads a bounded JSON file, raising `ArtifactError` on any problem.

    With `sha256`, the bytes read (and then parsed) must have that digest
    (`IntegrityError` otherwise): what is parsed is what was verified.
    """
    what = what or os.path.basename(path)
    data = read_bytes(path, limit, what, follow=follow)
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise IntegrityError(
            f"Artifact file '{what}' does not match its recorded SHA-256 "
            "checksum as read now (it changed after it was verified, or is "
            "corrupt). Copy the artifact again or re-export."
        )
    try:
        return json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
        )
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{what} is not UTF-8 text: {e}.") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, huge ints
        raise ArtifactError(
            f"{what} is not valid JSON: {str(e)[:200]}. The file is corrupt "
            "or was not written by keras-vllm; re-export the model."
        ) from None


def _unique_keys(pairs):
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key[:100]!r}")
        result[key] = value
    return result


def _no_constant(name):
    # NaN and Infinity are not JSON; Python's parser accepts them by default.
    raise ValueError(f"non-standard constant {name}")


def write_json(path, value):
    """Writes JSON deterministically (sorted keys, UTF-8, trailing newline)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")

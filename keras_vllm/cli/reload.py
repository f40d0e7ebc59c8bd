"""The weight-reload parts of the `keras-vllm` command line.

    keras-vllm serve ARTIFACT --enable-reload ...   adds the reload route
    keras-vllm reload URL ARTIFACT [--api-key KEY]  calls it

Kept apart from `cli/commands.py`, which holds the parser and the other
commands.
"""

import json
import os
import sys
import urllib.error
import urllib.request

ENABLE_RELOAD = "--enable-reload"
# The same as `cli/commands.py`'s EXIT_REFUSED, which cannot be imported here:
# commands.py imports this module.
EXIT_REFUSED = 3


def add_enable_option(parser):
    """`--enable-reload` on `keras-vllm serve`."""
    parser.add_argument(
        ENABLE_RELOAD,
        action="store_true",
        help="add POST /v1/keras_vllm/reload {\"path\": ARTIFACT} (new "
        "weights for the same model, no restart; needs --api-key when the "
        "server has one, else loopback clients only) and the served "
        "artifact's hash in /v1/models",
    )


def serve_arguments(args):
    """The `vllm serve` options `--enable-reload` adds (it may also follow
    the artifact, among vLLM's own options)."""
    from keras_vllm.serve.worker.extension import WORKER_EXTENSION
    from keras_vllm.serve.frontend.reload import MIDDLEWARE

    from keras_vllm.serve.frontend import adapters

    # Adapter loads are checked before vLLM's route (a 400, not a 500).
    added = (["--middleware", adapters.MIDDLEWARE]
             if "--enable-lora" in args.vllm_args else [])
    if ENABLE_RELOAD in args.vllm_args:
        args.vllm_args[:] = [a for a in args.vllm_args if a != ENABLE_RELOAD]
        args.enable_reload = True
    if not args.enable_reload:
        return added
    return added + [
        "--middleware", MIDDLEWARE, "--worker-extension-cls", WORKER_EXTENSION
    ]


def add_reload_command(sub, parents):
    """Adds `keras-vllm reload URL ARTIFACT`."""
    p = sub.add_parser(
        "reload",
        parents=parents,
        help="replace a running `keras-vllm serve --enable-reload` server's "
        "weights with a new export of the same model",
        description="POSTs ARTIFACT (a path on the server's host) to "
        "URL/v1/keras_vllm/reload. The server verifies it as a fresh start "
        "would, checks it is the served model with other weights, and "
        "swaps the weights without a restart; on refusal it serves the old "
        "weights on.",
    )
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("artifact", help="the new export's directory")
    p.add_argument(
        "--api-key", default=None, help="the server's --api-key, if it has one"
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds (default 600)"
    )
    p.set_defaults(func=reload)
    return p


def reload(args):
    """Runs `keras-vllm reload`; prints the server's answer."""
    from keras_vllm.serve.frontend.reload import RELOAD_ROUTE

    url = args.url.rstrip("/")
    if not url.endswith(RELOAD_ROUTE):
        url += RELOAD_ROUTE
    # A local path is sent absolute: the server resolves it in its own
    # working directory otherwise.
    path = args.artifact
    if os.path.isdir(path):
        path = os.path.abspath(path)
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    request = urllib.request.Request(
        url, data=json.dumps({"path": path}).encode(), headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as answer:
            result = json.loads(answer.read())
    except urllib.error.HTTPError as e:
        try:
            message = json.loads(e.read()).get("error", "")
        except ValueError:
            message = ""
        print(f"keras-vllm reload: {e.code}: {message or e.reason}",
              file=sys.stderr)
        # The server answered: it refused the artifact (or the caller),
        # like the CLI's other refusals.
        return EXIT_REFUSED
    except (urllib.error.URLError, OSError) as e:
        print(f"keras-vllm reload: cannot reach {url}: {e}", file=sys.stderr)
        return 1
    print(
        f"reloaded {result['path']} (manifest {result['artifact_hash'][:16]}"
        f"..., {result['variables']} variables, {result['seconds']:.2f} s)"
    )
    return 0

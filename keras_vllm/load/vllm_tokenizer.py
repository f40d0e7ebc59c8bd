"""vLLM tokenizer mode `keras_vllm`: the artifact's own KerasHub tokenizer.

`KerasVllmTokenizer` implements vLLM 0.32's `TokenizerLike` protocol
(`vllm/tokenizers/protocol.py`) over the native KerasHub tokenizer stored in
a keras-vllm artifact, so vLLM tokenizes prompts exactly as
`CausalLM.generate()` does (same ids, same start-token policy) and
detokenizes with the same vocabulary.

```python
from keras_vllm.load import vllm_tokenizer

vllm_tokenizer.register()  # the `vllm.general_plugins` entry point does this
LLM(model="exports/my_model", tokenizer_mode="keras_vllm", ...)
```

How vLLM drives it (0.32):

- `TokenizerRegistry` resolves the mode to this class and calls
  `from_pretrained(path, truncation_side=...)`; the mode also selects the
  renderer, so `register()` maps it to vLLM's `HfRenderer` too.
- `HfRenderer` tokenizes with `__call__`, renders chat through
  `get_chat_template` + `apply_chat_template(conversation=..., ...)`, and
  reads `name_or_path`, `is_fast`, `max_chars_per_token`, `max_token_id`,
  `truncation_side`.
- The engine's output processor uses the *slow* incremental detokenizer
  (`is_fast` is False): `convert_ids_to_tokens` + `convert_tokens_to_string`
  over a sliding window, holding text back while it ends in U+FFFD. Token
  strings are the vocabulary's own pieces and `convert_tokens_to_string`
  decodes their bytes jointly, so a character split across tokens comes out
  whole once its last byte arrives. Ids outside the vocabulary (a model
  vocabulary padded beyond the tokenizer's) decode to nothing.

Nothing here runs a Keras layer's `__call__`: that initializes the JAX
runtime, and vLLM loads the tokenizer in its front-end process *before*
forking the engine process, which a live JAX runtime would abort.
"""

import datetime
import json
import os
import threading

from keras_vllm import format as fmt

MODE = fmt.TOKENIZER_MODE
CLASS_NAME = "KerasVllmTokenizer"
# The renderer vLLM pairs with the mode. HfRenderer only needs the
# TokenizerLike surface plus `name_or_path` and `get_chat_template`.
RENDERER = ("vllm.renderers.hf", "HfRenderer")

_KIND_BPE = "byte_level_bpe"
_KIND_SPM = "sentence_piece"
_KIND_OTHER = "other"

# Returned by `get_chat_template()` when the artifact has no template, so
# that vLLM's HfRenderer (which swallows exceptions from get_chat_template
# and would otherwise report a generic "no chat template" message) hands it
# back to `apply_chat_template`, which raises `NoChatTemplateError` with our
# explanation; HfRenderer turns that into a 400 response. Rendered by any
# other Jinja engine it still fails instead of producing an empty prompt.
_NO_TEMPLATE_MARKER = "{#- keras_vllm: artifact has no chat template -#}"
MISSING_CHAT_TEMPLATE = (
    _NO_TEMPLATE_MARKER
    + "{{ raise_exception('This keras-vllm artifact has no chat template; "
    "re-export it with export_vllm(..., chat_template=...).') }}"
)

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


try:
    from vllm.exceptions import ChatTemplateResolutionError
except ImportError:  # the tokenizer also works without vLLM

    class ChatTemplateResolutionError(Exception):
        pass


class NoChatTemplateError(ChatTemplateResolutionError, ValueError):
    """Chat was requested from an artifact that carries no chat template.

    vLLM's "no chat template" error (and a `ValueError`), so its OpenAI
    server answers 400, and its start-up chat warm-up notes the missing
    template quietly instead of logging a traceback.
    """


def register():
    """Registers tokenizer mode `keras_vllm` with vLLM (idempotent).

    Two registrations, both required by vLLM 0.32 (the tokenizer mode also
    selects the renderer):

    ```python
    TokenizerRegistry.register(
        "keras_vllm", "keras_vllm.load.vllm_tokenizer", "KerasVllmTokenizer"
    )
    RENDERER_REGISTRY.register("keras_vllm", "vllm.renderers.hf", "HfRenderer")
    ```

    keras-hub's own plugin registers `keras_hub` / `KerasHubTokenizer`;
    the names differ, so both coexist.
    """
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry

    tokenizer_entry = (__name__, CLASS_NAME)
    if TokenizerRegistry.tokenizers.get(MODE) != tokenizer_entry:
        TokenizerRegistry.register(MODE, *tokenizer_entry)
    if RENDERER_REGISTRY.renderers.get(MODE) != RENDERER:
        RENDERER_REGISTRY.register(MODE, *RENDERER)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _byte_decoder():
    """GPT-2's byte-level alphabet, inverted: {unicode char: byte}."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    codes = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes)}


def _as_id_list(ids):
    """Token ids (int, numpy scalar/array, sequence) as a list of ints."""
    if hasattr(ids, "tolist"):  # numpy arrays and scalars
        ids = ids.tolist()
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]


def _as_text(value):
    """A native detokenize() result (str, bytes, numpy/tensor) as str."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _rebuild(path, truncation_side):
    """Unpickling: reload from the artifact (tokenizers are not shipped)."""
    return KerasVllmTokenizer.from_pretrained(
        path, truncation_side=truncation_side
    )


class _GenerationTag:
    """Lazily built Jinja extension: `{% generation %}` renders its body.

    HF chat templates may mark assistant spans with it; only the marking is
    ignored (no assistant-token masks are produced).
    """

    _cls = None

    @classmethod
    def get(cls):
        if cls._cls is None:
            import jinja2.ext
            import jinja2.nodes

            class GenerationTag(jinja2.ext.Extension):
                tags = {"generation"}

                def parse(self, parser):
                    lineno = next(parser.stream).lineno
                    body = parser.parse_statements(
                        ("name:endgeneration",), drop_needle=True
                    )
                    call = self.call_method("_render")
                    block = jinja2.nodes.CallBlock(call, [], [], body)
                    return block.set_lineno(lineno)

                def _render(self, caller):
                    return caller()

            cls._cls = GenerationTag
        return cls._cls


_TEMPLATE_CACHE = {}
_TEMPLATE_CACHE_LOCK = threading.Lock()
_TEMPLATE_CACHE_SIZE = 64


def _compile_template(source):
    """Compiles a chat template in a sandbox configured like HF's."""
    with _TEMPLATE_CACHE_LOCK:
        compiled = _TEMPLATE_CACHE.get(source)
    if compiled is not None:
        return compiled

    import jinja2.exceptions
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None,
               sort_keys=False):
        return json.dumps(
            x,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag.get(), jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    compiled = env.from_string(source)
    with _TEMPLATE_CACHE_LOCK:
        if len(_TEMPLATE_CACHE) >= _TEMPLATE_CACHE_SIZE:
            _TEMPLATE_CACHE.clear()
        _TEMPLATE_CACHE[source] = compiled
    return compiled


# ---------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------


class KerasVllmTokenizer:
    """A keras-vllm artifact's KerasHub tokenizer behind vLLM's interface.

    Build it with `from_pretrained(artifact_dir)` (what vLLM calls). All
    tables are built at construction, so the object is read-only afterwards
    and safe to share between vLLM's renderer threads.

    Encoding is the native KerasHub tokenizer's; the start token is
    prepended exactly when `CausalLM.generate()` prepends it (the exported
    preprocessor's `add_start_token` and a start token exists), unless
    `add_special_tokens=False`. `eos_token_id` is the artifact's first stop
    token. Special tokens (for `skip_special_tokens`) are the tokenizer's
    own special tokens plus the stop tokens, the ids `generate()` strips.
    """

    def __init__(
        self,
        tokenizer,
        manifest,
        path,
        *,
        chat_template=None,
        truncation_side="left",
    ):
        """Wraps an already loaded native tokenizer.

        Args:
            tokenizer: the native `keras_hub.tokenizers.Tokenizer`.
            manifest: the artifact's manifest dict.
            path: the artifact directory (for `name_or_path` and pickling).
            chat_template: the artifact's Jinja chat template, or None.
            truncation_side: "left" (keep the end of an over-long prompt,
                vLLM's choice for generation) or "right".
        """
        self._tokenizer = tokenizer
        self._path = str(path)
        self.name_or_path = self._path
        self.truncation_side = truncation_side
        self.chat_template = chat_template
        self.model_max_length = int(
            manifest.get("max_sequence_length") or int(1e30)
        )

        section = manifest.get("tokenizer", {})
        preprocessor = manifest.get("preprocessor", {}).get("config", {})
        start = section.get("start_token_id")
        end = section.get("end_token_id")
        pad = section.get("pad_token_id")
        stops = [int(i) for i in manifest.get("stop_token_ids") or []]

        self._build_vocabulary()

        self._bos_token_id = None if start is None else int(start)
        self._add_bos = bool(preprocessor.get("add_start_token", False)) and (
            self._bos_token_id is not None
        )
        if stops:
            self._eos_token_id = stops[0]
        else:
            self._eos_token_id = None if end is None else int(end)
        self._pad_token_id = None if pad is None else int(pad)

        special = set()
        try:
            special.update(int(i) for i in tokenizer.special_token_ids)
        except (AttributeError, ValueError, TypeError):
            pass
        special.update(stops)
        for value in (self._bos_token_id, end):
            if value is not None:
                special.add(int(value))
        self._special_ids = frozenset(
            i for i in special if 0 <= i < len(self._id_to_token)
            and self._id_to_token[i] is not None
        )
        self._special_ids_sorted = sorted(self._special_ids)

        if self._kind == _KIND_SPM:
            # vLLM's logprob token strings restore the leading spaces that
            # SentencePiece's decode() strips from single tokens, but only
            # for tokenizers it can inspect (HF fast ones). This is the
            # cache attribute its `get_leading_space_marker` reads first.
            self._vllm_space_marker_cache = "\u2581"

    # -- construction ------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id,
        *args,
        trust_remote_code=False,
        revision=None,
        download_dir=None,
        **kwargs,
    ):
        """Loads the tokenizer of the keras-vllm artifact at `path_or_repo_id`.

        The checksums of the files it reads (tokenizer assets, chat
        template) are verified, not the weights': vLLM loads a tokenizer in
        several processes, and the engine verifies the whole artifact. The
        tokenizer must reproduce the ids recorded at export
        (`keras_vllm.load_tokenizer`).
        `truncation_side` is honoured; vLLM's other keyword arguments (hub
        revision, download dir, ...) do not apply to a local artifact.
        """
        from keras_vllm.load.keras_loader import load_tokenizer

        path = os.fspath(path_or_repo_id)
        manifest = fmt.open_artifact(
            path, only=(fmt.TOKENIZER_DIR + "/", fmt.CHAT_TEMPLATE_FILE)
        ).manifest
        native = load_tokenizer(path, manifest=manifest)
        template = None
        template_path = fmt.safe_join(path, fmt.CHAT_TEMPLATE_FILE)
        if os.path.isfile(template_path):
            with open(template_path, encoding="utf-8") as f:
                template = f.read()
        return cls(
            native,
            manifest,
            path,
            chat_template=template,
            truncation_side=kwargs.get("truncation_side") or "left",
        )

    def _build_vocabulary(self):
        """Builds id <-> token tables and the per-kind decoding state."""
        tok = self._tokenizer
        from keras_hub.tokenizers import BytePairTokenizer
        from keras_hub.tokenizers import SentencePieceTokenizer

        if isinstance(tok, BytePairTokenizer):
            self._kind = _KIND_BPE
            vocab = getattr(tok, "vocabulary", None)
            if not isinstance(vocab, dict):
                vocab = {
                    t: int(tok.token_to_id(t)) for t in tok.get_vocabulary()
                }
            vocab = {str(t): int(i) for t, i in vocab.items()}
        else:
            self._kind = (
                _KIND_SPM if isinstance(tok, SentencePieceTokenizer)
                else _KIND_OTHER
            )
            vocab = {}
            for i, t in enumerate(tok.get_vocabulary()):
                if isinstance(t, bytes):
                    t = t.decode("utf-8", errors="replace")
                vocab.setdefault(str(t), i)

        size = max(vocab.values(), default=-1) + 1
        id_to_token = [None] * size
        for t, i in vocab.items():
            if i >= 0:
                id_to_token[i] = t
        self._vocab = vocab
        self._id_to_token = id_to_token
        self._vocab_size = int(tok.vocabulary_size())
        self._max_chars = max((len(t) for t in vocab), default=1) or 1

        if self._kind == _KIND_BPE:
            byte_of = _byte_decoder()
            unsplittable = set(getattr(tok, "unsplittable_tokens", None) or ())
            self._token_bytes = {}
            for t in vocab:
                if t in unsplittable:
                    self._token_bytes[t] = t.encode("utf-8")
                else:
                    self._token_bytes[t] = self._bpe_bytes(t, byte_of)
            self._byte_of = byte_of

    @staticmethod
    def _bpe_bytes(token, byte_of):
        out = bytearray()
        for ch in token:
            b = byte_of.get(ch)
            if b is None:  # not a byte-level symbol: its own UTF-8
                out += ch.encode("utf-8")
            else:
                out.append(b)
        return bytes(out)

    # -- copying and pickling ------------------------------------------------

    def __copy__(self):
        # HfRenderer copies the tokenizer; the tables are read-only, so a
        # copy shares them (and the native tokenizer) instead of reloading.
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo):
        return self.__copy__()

    def __reduce__(self):
        return (_rebuild, (self._path, self.truncation_side))

    # -- sizes and special tokens --------------------------------------------

    @property
    def is_fast(self):
        """False: vLLM uses its slow (Python) incremental detokenizer."""
        return False

    @property
    def vocab_size(self):
        return self._vocab_size

    @property
    def max_token_id(self):
        return len(self._id_to_token) - 1

    @property
    def max_chars_per_token(self):
        """Upper bound on the characters one token decodes to."""
        return self._max_chars

    def __len__(self):
        return max(self._vocab_size, len(self._id_to_token))

    def __hash__(self):
        return hash(id(self))

    @property
    def bos_token_id(self):
        return self._bos_token_id

    @property
    def eos_token_id(self):
        return self._eos_token_id

    @property
    def pad_token_id(self):
        return self._pad_token_id

    @property
    def bos_token(self):
        return self._token_or_none(self._bos_token_id)

    @property
    def eos_token(self):
        return self._token_or_none(self._eos_token_id)

    @property
    def pad_token(self):
        return self._token_or_none(self._pad_token_id)

    @property
    def all_special_ids(self):
        return list(self._special_ids_sorted)

    @property
    def all_special_tokens(self):
        return [self._id_to_token[i] for i in self._special_ids_sorted]

    @property
    def add_bos_token(self):
        """Whether `encode()` prepends the start token (as generate() does)."""
        return self._add_bos

    def num_special_tokens_to_add(self):
        return 1 if self._add_bos else 0

    def _token_or_none(self, token_id):
        if token_id is None or not 0 <= token_id < len(self._id_to_token):
            return None
        return self._id_to_token[token_id]

    # -- vocabulary ----------------------------------------------------------

    def get_vocab(self):
        return dict(self._vocab)

    def get_added_vocab(self):
        """Empty: a KerasHub vocabulary is one fixed table, nothing is added."""
        return {}

    def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
        """Ids to vocabulary pieces; ids outside the vocabulary give "".

        A single int gives a single string, as in HF tokenizers.
        """
        if isinstance(ids, int) or (
            hasattr(ids, "ndim") and getattr(ids, "ndim", 1) == 0
        ):
            i = int(ids)
            if skip_special_tokens and i in self._special_ids:
                return None
            return self._token_or_none(i) or ""
        table = self._id_to_token
        size = len(table)
        special = self._special_ids if skip_special_tokens else ()
        out = []
        for i in _as_id_list(ids):
            if i in special:
                continue
            out.append((table[i] or "") if 0 <= i < size else "")
        return out

    def convert_tokens_to_ids(self, tokens):
        """Pieces to ids; unknown pieces give None (there is no unk id)."""
        if isinstance(tokens, str):
            return self._vocab.get(tokens)
        return [self._vocab.get(t) for t in tokens]

    def convert_tokens_to_string(self, tokens):
        """Decodes vocabulary pieces jointly.

        Byte-level BPE pieces are turned into bytes and decoded together, so
        a character spread over several pieces is whole; an incomplete one
        at the end shows as U+FFFD (which vLLM's incremental detokenizer
        holds back until it completes). Unknown or empty pieces are skipped.
        """
        if self._kind == _KIND_BPE:
            token_bytes = self._token_bytes
            byte_of = self._byte_of
            data = b"".join(
                token_bytes.get(t) or self._bpe_bytes(t, byte_of)
                for t in tokens
                if t
            )
            return data.decode("utf-8", errors="replace")
        vocab = self._vocab
        ids = [vocab[t] for t in tokens if t and t in vocab]
        return self._decode_valid_ids(ids)

    # -- encode / decode -----------------------------------------------------

    def _native_ids(self, text):
        # `tokenize`, not `__call__`: Keras' Layer.__call__ would start the
        # JAX runtime in vLLM's front-end process (see module docstring).
        ids = self._tokenizer.tokenize(text)
        if hasattr(ids, "numpy"):
            ids = ids.numpy()
        return [int(i) for i in getattr(ids, "tolist", lambda: ids)()]

    def encode(
        self,
        text,
        truncation=None,
        max_length=None,
        add_special_tokens=True,
        **kwargs,
    ):
        """Text to ids, as `CausalLM.generate()` tokenizes a prompt.

        With `truncation` and `max_length`, the ids (start token included)
        are cut to `max_length` from `truncation_side`, keeping the start
        token, as HF tokenizers do.
        """
        if not isinstance(text, str):
            raise TypeError(
                f"{CLASS_NAME}.encode() takes one string, got "
                f"{type(text).__name__}."
            )
        ids = self._native_ids(text)
        add_bos = add_special_tokens and self._add_bos
        prefix = [self._bos_token_id] if add_bos else []
        if truncation and max_length is not None:
            budget = max(int(max_length) - len(prefix), 0)
            if len(ids) > budget:
                if self.truncation_side == "left":
                    ids = ids[len(ids) - budget:]
                else:
                    ids = ids[:budget]
        return prefix + ids

    def __call__(
        self,
        text,
        text_pair=None,
        add_special_tokens=True,
        truncation=False,
        max_length=None,
        **kwargs,
    ):
        """HF-style call: `BatchEncoding` of `input_ids`, `attention_mask`."""
        from transformers import BatchEncoding

        if text_pair is not None:
            raise ValueError(
                f"{CLASS_NAME} does not encode text pairs; a CausalLM prompt "
                "is one string."
            )
        if kwargs.get("return_offsets_mapping"):
            raise NotImplementedError(
                f"{CLASS_NAME} does not produce offset mappings."
            )
        options = dict(
            truncation=truncation,
            max_length=max_length,
            add_special_tokens=add_special_tokens,
        )
        if isinstance(text, str):
            ids = self.encode(text, **options)
            return BatchEncoding(
                {"input_ids": ids, "attention_mask": [1] * len(ids)}
            )
        batch = [self.encode(t, **options) for t in text]
        return BatchEncoding(
            {
                "input_ids": batch,
                "attention_mask": [[1] * len(ids) for ids in batch],
            }
        )

    def decode(self, ids, skip_special_tokens=False, **kwargs):
        """Ids to text with the artifact's tokenizer.

        Ids outside the vocabulary are dropped; special tokens are dropped
        when `skip_special_tokens`.
        """
        ids = _as_id_list(ids)
        size = len(self._id_to_token)
        table = self._id_to_token
        special = self._special_ids if skip_special_tokens else ()
        ids = [
            i for i in ids
            if 0 <= i < size and table[i] is not None and i not in special
        ]
        return self._decode_valid_ids(ids)

    def _decode_valid_ids(self, ids):
        if not ids:
            return ""
        if self._kind == _KIND_BPE:
            table = self._id_to_token
            token_bytes = self._token_bytes
            return b"".join(token_bytes[table[i]] for i in ids).decode(
                "utf-8", errors="replace"
            )
        return _as_text(self._tokenizer.detokenize(ids))

    def batch_decode(self, sequences, skip_special_tokens=False, **kwargs):
        return [
            self.decode(ids, skip_special_tokens=skip_special_tokens)
            for ids in sequences
        ]

    def add_special_tokens(self, special_tokens_dict, *args, **kwargs):
        raise NotImplementedError(
            "A keras-vllm tokenizer's vocabulary is fixed by the exported "
            "model; tokens cannot be added (vLLM asks for this only for "
            "prompt embeddings, which keras-vllm does not serve)."
        )

    # -- chat ------------------------------------------------------------------

    def _no_template_error(self):
        return NoChatTemplateError(
            f"The keras-vllm artifact at '{self._path}' has no chat template, "
            "so chat messages cannot be turned into a prompt. Re-export the "
            "model with one: `causal_lm.export_vllm(path, chat_template=...)` "
            "(Jinja text or a path to a .jinja file, stored as "
            f"'{fmt.CHAT_TEMPLATE_FILE}'); or pass a template to vLLM "
            "(`--chat-template` / the request's `chat_template`); or send "
            "plain-text prompts to the completions API."
        )

    def get_chat_template(self, chat_template=None, tools=None, **kwargs):
        """The template to render: the given one, else the artifact's.

        Without either, returns `MISSING_CHAT_TEMPLATE`, which
        `apply_chat_template` turns into `NoChatTemplateError`.
        """
        if chat_template is not None:
            return chat_template
        if self.chat_template is not None:
            return self.chat_template
        return MISSING_CHAT_TEMPLATE

    def apply_chat_template(
        self,
        messages=None,
        tools=None,
        *,
        conversation=None,
        chat_template=None,
        documents=None,
        add_generation_prompt=False,
        continue_final_message=False,
        tokenize=True,
        return_dict=False,
        **kwargs,
    ):
        """Renders messages with the chat template, as HF tokenizers do.

        The template runs in Jinja's immutable sandbox (HF's settings:
        `trim_blocks`, `lstrip_blocks`, `loopcontrols`, `tojson`,
        `raise_exception`, `strftime_now`) with `messages`, `tools`,
        `documents`, `add_generation_prompt`, `bos_token`, `eos_token`,
        `pad_token` and any extra keyword arguments. With `tokenize`, the
        text is encoded without adding a start token (the template adds
        it, as with HF).

        Raises:
            NoChatTemplateError: neither the artifact nor the caller
                supplies a template.
        """
        if conversation is None:
            conversation = messages
        if conversation is None:
            raise TypeError("apply_chat_template() needs `messages`.")
        if hasattr(conversation, "messages"):
            conversation = conversation.messages
        conversation = list(conversation)
        source = self.get_chat_template(chat_template)
        if source.startswith(_NO_TEMPLATE_MARKER):
            raise self._no_template_error()
        if continue_final_message and add_generation_prompt:
            raise ValueError(
                "continue_final_message and add_generation_prompt are not "
                "compatible: use continue_final_message to continue the "
                "final message, add_generation_prompt to start a new one."
            )

        variables = {
            name: value
            for name, value in (
                ("bos_token", self.bos_token),
                ("eos_token", self.eos_token),
                ("pad_token", self.pad_token),
            )
            if value is not None
        }
        variables.update(kwargs)

        final = None
        if continue_final_message:
            if not conversation:
                raise ValueError(
                    "continue_final_message is set but there are no messages."
                )
            key = (
                continue_final_message
                if isinstance(continue_final_message, str)
                else "content"
            )
            last = dict(conversation[-1])
            content = last.get(key)
            if content is None:
                raise ValueError(
                    "continue_final_message is set but the final message has "
                    f"no '{key}' to continue."
                )
            if isinstance(content, (list, tuple)):
                blocks = [
                    dict(b) if isinstance(b, dict) else b for b in content
                ]
                for block in reversed(blocks):
                    if isinstance(block, dict) and "text" in block:
                        final = block["text"]
                        block["text"] = final + _CONTINUE_TAG
                        break
                else:
                    raise ValueError(
                        "continue_final_message is set but the final message "
                        "has no text to continue."
                    )
                last[key] = blocks
            else:
                final = content
                last[key] = content + _CONTINUE_TAG
            conversation = conversation[:-1] + [last]

        text = _compile_template(source).render(
            messages=conversation,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )

        if continue_final_message:
            tag = _CONTINUE_TAG.strip()
            if final.strip() not in text or tag not in text:
                raise ValueError(
                    "continue_final_message is set but the chat template "
                    "dropped (part of) the final message."
                )
            at = text.rindex(tag)
            if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
                text = text[:at]
            else:
                text = text[:at].rstrip()

        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        if return_dict:
            from transformers import BatchEncoding

            return BatchEncoding(
                {"input_ids": ids, "attention_mask": [1] * len(ids)}
            )
        return ids

    def __repr__(self):
        return (
            f"{CLASS_NAME}(path={self._path!r}, "
            f"tokenizer={type(self._tokenizer).__name__}, "
            f"vocab_size={self._vocab_size})"
        )

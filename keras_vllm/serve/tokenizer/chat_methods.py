"""The chat-template half of `KerasVllmTokenizer` (HF's two methods).

A mixin: it reads the host tokenizer's `chat_template`, special tokens,
artifact path and `encode()`; rendering itself is `chat.render`.
"""

from keras_vllm.serve.tokenizer import chat


def batch_encoding(ids):
    """HF's `BatchEncoding` of one row of ids (or a list of rows)."""
    from transformers import BatchEncoding

    if ids and isinstance(ids[0], list):
        mask = [[1] * len(row) for row in ids]
    else:
        mask = [1] * len(ids)
    return BatchEncoding({"input_ids": ids, "attention_mask": mask})


class ChatTemplateMethods:
    """`get_chat_template` and `apply_chat_template`, as HF tokenizers have.

    Example:

    ```python
    tokenizer = KerasVllmTokenizer.from_pretrained("exports/my_model")
    tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ```
    """

    def get_chat_template(self, chat_template=None, tools=None, **kwargs):
        """The template to render: the given one, else the artifact's.

        Without either, returns `MISSING_CHAT_TEMPLATE`, which
        `apply_chat_template` turns into `NoChatTemplateError`.
        """
        if chat_template is not None:
            return chat_template
        if self.chat_template is not None:
            return self.chat_template
        return chat.MISSING_CHAT_TEMPLATE

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

        The template is rendered by transformers (see `chat.render`) with
        `messages`, `tools`, `documents`, `add_generation_prompt`,
        `bos_token`, `eos_token`, `pad_token` and any extra keyword
        arguments. With `tokenize`, the text is encoded without adding a
        start token (the template adds it, as with HF).

        Raises:
            NoChatTemplateError: neither the artifact nor the caller
                supplies a template.
        """
        if conversation is None:
            conversation = messages
        if conversation is None:
            raise TypeError("apply_chat_template() needs `messages`.")
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
        text = chat.render(
            self.get_chat_template(chat_template),
            conversation,
            path=self._path,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **variables,
        )
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return batch_encoding(ids) if return_dict else ids

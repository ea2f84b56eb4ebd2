"""The frontdoor's tokenizer (tokenizers + jinja2) gives the ids transformers gives, for
chats and plain prompts, also where the config asks for a BOS token (which transformers
ignores beside a tokenizer.json); and the
frontdoor never imports transformers or torch to tokenize."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.weights import write_servable_dir

from ebb.errors import InvalidRequest
from ebb.openai.tokenizer import HfPromptTokenizer

CHATS = [
    [{"role": "user", "content": "the capital of france"}],
    [
        {"role": "system", "content": "is the"},
        {"role": "user", "content": "capital of france"},
        {"role": "assistant", "content": "the capital"},
        {"role": "user", "content": "is"},
    ],
]
PROMPTS = ["the capital of france is", "", "unknown words here"]


def _transformers_ids(path, chat=None, prompt=None) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if chat is not None:
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode(prompt, add_special_tokens=True))


@pytest.fixture(params=["as saved", "with add_bos_token"])
def checkpoint(request, tmp_path):
    root = write_servable_dir(tmp_path / "ckpt", mib=1)
    if request.param == "with add_bos_token":
        config_path = root / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config.update(bos_token="[UNK]", add_bos_token=True)
        config_path.write_text(json.dumps(config))
    return root


def test_chats_and_prompts_match_transformers(checkpoint):
    ours = HfPromptTokenizer.from_dir(checkpoint)
    for chat in CHATS:
        assert ours.render_chat(chat) == _transformers_ids(checkpoint, chat=chat)
    for prompt in PROMPTS:
        assert ours.encode(prompt) == _transformers_ids(checkpoint, prompt=prompt)


def test_a_prompt_without_special_tokens_matches_transformers(checkpoint):
    """POST /tokenize with add_special_tokens false (what vLLM's tokenizer gives then)."""
    from transformers import AutoTokenizer

    ours = HfPromptTokenizer.from_dir(checkpoint)
    reference = AutoTokenizer.from_pretrained(str(checkpoint))
    for prompt in PROMPTS:
        plain = ours.encode(prompt, add_special_tokens=False)
        assert plain == list(reference.encode(prompt, add_special_tokens=False))


def test_decode_gives_transformers_text_special_tokens_included(checkpoint):
    """What POST /detokenize answers: transformers' decode of the same ids."""
    from transformers import AutoTokenizer

    ours = HfPromptTokenizer.from_dir(checkpoint)
    reference = AutoTokenizer.from_pretrained(str(checkpoint))
    for chat in CHATS:
        ids = ours.render_chat(chat)
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=False)


def test_a_template_that_refuses_the_messages_is_the_callers_400(tmp_path):
    root = write_servable_dir(tmp_path / "ckpt", mib=1)
    (root / "chat_template.jinja").write_text(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('users speak first') }}"
        "{% endif %}{{ messages[0]['content'] | tojson }}"
    )
    tokenizer = HfPromptTokenizer.from_dir(root)

    with pytest.raises(InvalidRequest) as refused:
        tokenizer.render_chat([{"role": "assistant", "content": "the"}])
    assert "users speak first" in refused.value.message and refused.value.param == "messages"
    assert tokenizer.render_chat([{"role": "user", "content": "the"}]) == tokenizer.encode('"the"')


def test_a_model_without_a_chat_template_says_to_use_completions(tmp_path):
    root = write_servable_dir(tmp_path / "ckpt", mib=1)
    config_path = root / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (root / "chat_template.jinja").unlink(missing_ok=True)

    with pytest.raises(InvalidRequest) as refused:
        HfPromptTokenizer.from_dir(root).render_chat(CHATS[0])
    assert "/v1/completions" in refused.value.message


def test_tokenizing_imports_neither_transformers_nor_torch(tmp_path):
    root = write_servable_dir(tmp_path / "ckpt", mib=1)
    code = (
        "import sys\n"
        "from ebb.frontdoor.app import create_app\n"
        "from ebb.openai.tokenizer import HfPromptTokenizer\n"
        f"t = HfPromptTokenizer.from_dir({str(root)!r})\n"
        "t.render_chat([{'role': 'user', 'content': 'the capital'}]); t.encode('is')\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

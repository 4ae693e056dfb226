"""The text condition: CLIP ViT-L/14's text tower through transformers, last hidden state, padded to 77 tokens.

Weights load from a local folder only (`local_files_only=True`): the service never downloads at run time. The
empty prompt's embedding (the unconditional row of guidance) is computed once and kept. For tests and speed runs,
`random_clip` builds a CLIP text tower of any size with random weights and a word-level tokenizer, in memory;
`save_pretrained` on both gives a folder that `TextEncoder.from_path` loads like the real one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from inference.errors import Cube3DError

log = logging.getLogger(__name__)

BOS, EOS, UNK = "<|startoftext|>", "<|endoftext|>", "<|unk|>"


class TextEncoderError(Cube3DError):
    """The text encoder folder is missing or unreadable."""


class TextEncoder:
    """Prompts -> last hidden states [B, T, H] on the service's device; the empty prompt's row cached."""

    def __init__(self, model: Any, tokenizer: Any, max_length: int, device: torch.device, dtype: torch.dtype):
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.device, self.dtype = device, dtype
        self.width = model.config.hidden_size
        self._empty: Tensor | None = None

    @classmethod
    def from_path(cls, path: str | Path, max_length: int, device: torch.device, dtype: torch.dtype) -> "TextEncoder":
        """The text tower and tokenizer saved under `path` (e.g. a copy of openai/clip-vit-large-patch14)."""
        from transformers import AutoTokenizer, CLIPTextModel

        path = Path(path)
        if not (path / "config.json").exists():
            raise TextEncoderError(f"no text encoder at `{path}` (config.json missing): point `text_encoder` at a "
                                   "local folder holding the CLIP text tower and its tokenizer, as saved by "
                                   "save_pretrained; nothing is downloaded at run time")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = CLIPTextModel.from_pretrained(path, local_files_only=True, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise TextEncoderError(f"cannot load the text encoder from `{path}`: {exc}") from exc
        log.info("text encoder loaded from %s (%d layers, width %d)", path, model.config.num_hidden_layers,
                 model.config.hidden_size)
        return cls(model, tokenizer, max_length, device, dtype)

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> Tensor:
        """[len(prompts), max_length, width] in the service dtype."""
        batch = self.tokenizer(list(prompts), padding="max_length", max_length=self.max_length, truncation=True,
                               return_tensors="pt")
        out = self.model(input_ids=batch["input_ids"].to(self.device),
                         attention_mask=batch["attention_mask"].to(self.device))
        return out.last_hidden_state

    def empty(self) -> Tensor:
        """The empty prompt's embedding [1, T, H], computed once (guidance's unconditional row)."""
        if self._empty is None:
            self._empty = self.encode([""])
        return self._empty


def word_tokenizer(words: Sequence[str]) -> Any:
    """A CLIP-shaped tokenizer over a fixed word list: lower case, BOS prompt EOS, padded with EOS."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(dict.fromkeys([UNK, *(w.lower() for w in words), BOS, EOS]))}
    tok = Tokenizer(WordLevel(vocab, unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A {EOS}",
                                                       special_tokens=[(BOS, vocab[BOS]), (EOS, vocab[EOS])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=EOS)


def random_clip(words: Sequence[str], width: int, layers: int, max_length: int, seed: int = 0,
                vocab_size: int | None = None) -> tuple[Any, Any]:
    """A CLIP text tower with random weights (`width` = 768, 12 layers is ViT-L/14's shape) and its tokenizer.

    `vocab_size` pads the embedding table to a real tokenizer's size (49408 for CLIP) so timings match.
    """
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = word_tokenizer(words)
    heads = max(1, width // 64)
    config = CLIPTextConfig(vocab_size=max(len(tokenizer), vocab_size or 0), hidden_size=width,
                            intermediate_size=4 * width, num_hidden_layers=layers, num_attention_heads=heads,
                            max_position_embeddings=max_length, projection_dim=width,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPTextModel(config)
    return model, tokenizer

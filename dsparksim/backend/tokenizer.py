"""Byte-level BPE tokenizer trained on the same three-domain mix (HF ``tokenizers``)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from dsparksim.errors import InputError
from dsparksim.backend.data import EOT, SPECIAL


def train_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE with the special tokens (EOT, user, assistant) at ids 0..2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # heavy: tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(path: str | Path, expect_vocab: int | None = None, checkpoint: str | Path | None = None):
    """Load ``tokenizer.json``; with ``expect_vocab`` check it matches the model's vocabulary size."""
    from tokenizers import Tokenizer  # heavy: tokenizers

    path = Path(path)
    if not path.is_file():
        raise InputError(path, None, "tokenizer file not found (run `dsparksim train` to create it)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust library raises plain Exception for a corrupt file
        raise InputError(path, None, f"not a valid tokenizers JSON file: {e}") from None
    if tok.token_to_id(EOT) is None:
        raise InputError(path, "added_tokens", f"special token {EOT} missing: not a dsparksim tokenizer")
    if expect_vocab is not None and tok.get_vocab_size() != expect_vocab:
        raise InputError(path, "vocab_size", f"tokenizer/model vocabulary mismatch: tokenizer has "
                         f"{tok.get_vocab_size()} tokens, checkpoint {checkpoint or ''} expects {expect_vocab}")
    return tok


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()

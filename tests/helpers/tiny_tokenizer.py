"""Write a small word-level tokenizer folder that transformers loads offline (bench_serving needs one to
make random prompts; the GLM-5 tokenizer is not on CI machines)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers


def write(folder: Path, size: int = 2000) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0} | {f"w{i}": i for i in range(1, size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 1000000}
        )
    )
    return folder


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))

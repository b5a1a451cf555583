"""Write a tiny, randomly initialised Llama model folder that the real SGLang server loads offline, at test time
(no stored weights): 2 layers, hidden 64, about 0.2 M parameters, bf16 safetensors from a fixed seed; a byte-level
BPE tokenizer trained here with `tokenizers` on the text below; a Jinja chat template in tokenizer_config.json.

    .venv-sglang-cpu/bin/python tests/helpers/tiny_llama.py FOLDER

Runs under .venv-sglang-cpu (torch, safetensors, tokenizers); transformers is not imported: the folder is written
as transformers' LlamaConfig and LlamaForCausalLM save it (config.json keys, tensor names), which SGLang's Llama
(sglang/srt/models/llama.py) loads. Its answers are random text: it stands in for the server's plumbing, never
for a model's answers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL = ["<|endoftext|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
EOS, PAD = SPECIAL[0], SPECIAL[1]
CONTEXT = 4096
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 64, 2, 4, 2, 16, 128
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
TEXT = """
The server loads its weights, allocates the cache and warms up with one request before it says it is ready.
A health check asks whether the server answers; the gateway sends requests only to replicas that are ready.
Operators read the log, watch the metrics and stop the container, which drains the requests in flight.
What is the capital of France? Paris is the capital of France. How much is two plus two? It is four.
Hello world! How are you today? I am fine, thank you. The quick brown fox jumps over the lazy dog.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 16 32 64 100 128 256 512 1000 1024 2048 4096 30000.
Chat completions carry messages with a role and a content; a stream sends one chunk at a time and then done.
"""


def train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=768,
        min_frequency=2,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [line for line in TEXT.splitlines() if line.strip()]
    tokenizer.train_from_iterator(lines * 4, trainer=trainer)
    return tokenizer


def weights(vocab: int) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM's tensors: normal(0, 0.02) matrices, RMSNorm weights of one."""
    generator = torch.Generator().manual_seed(0)

    def matrix(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=generator) * 0.02).to(torch.bfloat16)

    ones = torch.ones(HIDDEN, dtype=torch.bfloat16)
    tensors = {"model.embed_tokens.weight": matrix(vocab, HIDDEN), "model.norm.weight": ones.clone()}
    for i in range(LAYERS):
        layer = f"model.layers.{i}"
        tensors |= {
            f"{layer}.self_attn.q_proj.weight": matrix(HEADS * HEAD_DIM, HIDDEN),
            f"{layer}.self_attn.k_proj.weight": matrix(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{layer}.self_attn.v_proj.weight": matrix(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{layer}.self_attn.o_proj.weight": matrix(HIDDEN, HEADS * HEAD_DIM),
            f"{layer}.mlp.gate_proj.weight": matrix(INTERMEDIATE, HIDDEN),
            f"{layer}.mlp.up_proj.weight": matrix(INTERMEDIATE, HIDDEN),
            f"{layer}.mlp.down_proj.weight": matrix(HIDDEN, INTERMEDIATE),
            f"{layer}.input_layernorm.weight": ones.clone(),
            f"{layer}.post_attention_layernorm.weight": ones.clone(),
        }
    tensors["lm_head.weight"] = matrix(vocab, HIDDEN)
    return tensors


def config(vocab: int, eos: int, pad: int) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "bfloat16",
    }


def write(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer()
    tokenizer.save(str(folder / "tokenizer.json"))
    vocab, eos, pad = tokenizer.get_vocab_size(), tokenizer.token_to_id(EOS), tokenizer.token_to_id(PAD)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": CONTEXT,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
    (folder / "config.json").write_text(json.dumps(config(vocab, eos, pad), indent=1))
    generation = {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": pad}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    save_file(weights(vocab), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))

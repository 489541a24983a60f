"""Build a tiny random-init Qwen2 causal LM and a locally trained byte-level BPE tokenizer (no hub access).

Adapted from tests/fixtures/trl/build_tiny.py (same corpus, seeds and architecture); the output folder is an
argument.  usage: python build_tiny.py OUT_DIR   (writes OUT_DIR, e.g. /tmp/corpus-build/models/tiny-model)
"""

import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

WORDS_TEXT = (
    "the a cat dog sat on mat what is plus minus times answer question think step because so then "
    "yes no good bad blue red green sun moon tree river stone house happy sad quick slow tell me about "
    "write short story poem number add sum result equals is are was were and or but of to in for with"
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def main(out: str) -> None:
    words = WORDS_TEXT.split()
    random.seed(0)
    torch.manual_seed(0)
    corpus = []
    for _ in range(4000):
        a, b = random.randint(0, 99), random.randint(0, 99)
        corpus.append(f"What is {a} plus {b}? The answer is {a + b}.")
        n = random.randint(4, 14)
        corpus.append(" ".join(random.choice(words) for _ in range(n)) + random.choice([".", "!", "?"]))
        corpus.append(f"<think> {a} + {b} = {a + b} </think> <answer> {a + b} </answer>")

    special = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    bpe = trainers.BpeTrainer(vocab_size=512, special_tokens=special,
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=bpe)

    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>",
                                     bos_token=None, model_max_length=256)
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out)

    cfg = Qwen2Config(
        vocab_size=len(hf_tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = hf_tok.eos_token_id
    model.generation_config.pad_token_id = hf_tok.pad_token_id
    model.save_pretrained(out)
    print("policy params:", sum(p.numel() for p in model.parameters()))
    print("vocab:", len(hf_tok), hf_tok.tokenize("What is 12 plus 30? The answer is 42."))


if __name__ == "__main__":
    main(sys.argv[1])

"""SFT of the tiny model on 'What is a plus b?' -> ' The answer is a+b.' (same data, seed and settings as
tests/fixtures/trl/sft/train.py, without eval). Its final model is the starting policy of the GRPO/DPO runs.

usage: python train_sft.py BASE_MODEL_DIR OUT_DIR   (the final model goes to OUT_DIR/final_model)
"""

import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer


def main(base: str, out: str) -> None:
    random.seed(0)
    prompts, completions = [], []
    for _ in range(1200):
        a, b = random.randint(0, 99), random.randint(0, 99)
        prompts.append(f"What is {a} plus {b}?")
        completions.append(f" The answer is {a + b}.")
    train = Dataset.from_dict({"prompt": prompts[:1100], "completion": completions[:1100]})

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    args = SFTConfig(
        output_dir=out,
        max_steps=300,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=10,
        logging_steps=1,
        save_strategy="no",
        max_length=64,
        report_to="none",
        seed=0,
        use_cpu=True,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
    trainer.train()
    trainer.save_state()
    trainer.save_model(os.path.join(out, "final_model"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""An HF Trainer script as it is written for a GPU cluster (no use_cpu=True): a tiny GPT-2 from a config, Trainer,
TrainingArguments. Each rank prints what accelerate built under the Trainer and, at the end, the Trainer's log
history (full precision) as one JSON line."""

import json
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
tokens = torch.randint(0, 64, (32, 16))
data = [{"input_ids": t, "labels": t} for t in tokens]
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=4, max_steps=4, logging_steps=1,
                         learning_rate=1e-3, save_strategy="no", report_to="none", disable_tqdm=True, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=data)
trainer.train()
s = trainer.accelerator.state
print(json.dumps({"distributed_type": str(s.distributed_type), "num_processes": s.num_processes,
                  "process_index": s.process_index, "engine": type(trainer.model_wrapped).__name__,
                  "log_history": trainer.state.log_history}), flush=True)

"""The user scripts of Rapidformer's documentation (../shared/peer-docs/rapidformer-training-
acceleration.txt) as a Rapidformer user saves them: ``MyFintuner``, ``MyBertPreTrainer``, the
plain Hugging Face loop with the page's two diffs, and a local stand-in of
``load_metric("glue", "mrpc")``. ``DEVIATIONS`` lists every change against the page."""

#: where the scripts differ from the page: Python / library drift, no code of ours
DEVIATIONS = """
- `from transformers/easytexmier import AutoConfig,BertForSequenceClassification` (not Python)
  -> `from transformers import ...`, plus the imports the fragments use but never import
  (`torch`, `AutoTokenizer`, `AutoModelForPreTraining`, `functools.partial`, `Finetuner`);
- `datasets.load_metric` (removed in datasets 3; GLUE's metric script comes from the Hub) ->
  `glue_metric.load_metric`, a local accuracy / F1 stand-in;
- `tokenized_datasets.rename_column_(...)` (removed in datasets 2) -> `rename_column`;
- the loop: `AdamW` import dropped (transformers 5 has none; the page's diff removes its use),
  the last two lines' 5-space indent (an IndentationError) made 4.
"""

GLUE_METRIC = '''
"""A local stand-in of load_metric("glue", "mrpc"): accuracy and F1 of the positive class."""


class _Metric:
    def __init__(self):
        self.predictions, self.references = [], []

    def add_batch(self, predictions, references):
        self.predictions += [int(p) for p in predictions]
        self.references += [int(r) for r in references]

    def compute(self):
        pairs = list(zip(self.predictions, self.references))
        self.predictions, self.references = [], []
        tp = sum(p == r == 1 for p, r in pairs)
        positives, actual = sum(p == 1 for p, _ in pairs), sum(r == 1 for _, r in pairs)
        f1 = 2 * tp / (positives + actual) if positives + actual else 0.0
        return {"accuracy": sum(p == r for p, r in pairs) / len(pairs), "f1": f1}


def load_metric(path, name):
    return _Metric()
'''

FINETUNER = """
import torch
from transformers import AutoConfig, AutoTokenizer, BertForSequenceClassification
from datasets import load_dataset
from glue_metric import load_metric
from rapidformer import RapidformerEngine
from rapidformer import get_args
from rapidformer import get_logger
from rapidformer import get_timers
from rapidformer import Finetuner
from rapidformer import Pretrainer
from rapidformer import build_train_valid_test_datasets_for_huggingface

class MyFintuner(Finetuner):
    def __init__(self,engine):
        super().__init__(engine=engine)

    def train_valid_test_datasets_provider(self):
        tokenizer = AutoTokenizer.from_pretrained("bert-base-cased")

        def tokenize_function(examples):
            # max_length=None => use the model max length (it's actually the default)
            outputs = tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None)
            return outputs

        datasets = load_dataset(args.dataset_path, args.dataset_name)
        # Apply the method we just defined to all the examples in all the splits of the dataset
        tokenized_datasets = datasets.map(
            tokenize_function,
            batched=True,
            remove_columns=["idx", "sentence1", "sentence2"],
        )
        tokenized_datasets = tokenized_datasets.rename_column("label", "labels")

        train_dataset = tokenized_datasets["train"]
        valid_dataset = tokenized_datasets['validation']
        test_dataset = tokenized_datasets['test']

        def collate_fn(examples):
            return tokenizer.pad(examples, padding="longest", return_tensors="pt")

        return train_dataset, valid_dataset, test_dataset, collate_fn

    def model_optimizer_lr_scheduler_provider(self):
        args = get_args()
        model = BertForSequenceClassification.from_pretrained(args.load)
        return model, None, None

    def run_forward_step(self, batch, model):
        output_tensor = model(**batch)
        return output_tensor.loss

    # after each epoch run metric on eval dataset
    def run_compute_metrics(self, model, eval_dataloader):
        model = model[0]
        metric = load_metric(args.dataset_path, args.dataset_name)
        for step, batch in enumerate(eval_dataloader):
            with torch.no_grad():
                outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)

            metric.add_batch(
                predictions=self.gather(predictions),
                references=self.gather(batch["labels"]),
            )

        eval_metric = metric.compute()
        return eval_metric

engine = RapidformerEngine()
trainer = MyFintuner(engine=engine)
trainer.train()
"""

PRETRAINER = """
import torch
from transformers import AutoModelForPreTraining
from megatron import mpu
from transformers import BertConfig, BertForPreTraining
from rapidformer import RapidformerEngine, get_args, PreTrainer
from rapidformer import build_train_valid_test_datasets_for_huggingface

class MyBertPreTrainer(PreTrainer):

    def __init__(self,engine):
        super().__init__(engine=engine)

    def train_valid_test_datasets_provider(self, train_val_test_num_samples):
        args = get_args()

        train_ds, valid_ds, test_ds = build_train_valid_test_datasets_for_huggingface(
            data_prefix=args.data_path,
            data_impl=args.data_impl,
            splits_string=args.split,
            train_valid_test_num_samples=train_val_test_num_samples,
            max_seq_length=args.seq_length,
            masked_lm_prob=args.mask_prob,
            short_seq_prob=args.short_seq_prob,
            seed=args.seed,
            skip_warmup=(not args.mmap_warmup),
            binary_head=True)

        return train_ds, valid_ds, test_ds

    def model_optimizer_lr_scheduler_provider(self):
        args = get_args()
        model = AutoModelForPreTraining.from_pretrained(args.pretrained_model_name_or_path)
        return model, None, None

    def run_forward_step(self, data_iterator, model):
        # Items and their type.
        keys = ['input_ids', 'attention_mask', 'token_type_ids', 'labels', 'next_sentence_label']
        datatype = torch.int64

        # Broadcast data.
        if data_iterator is not None:
            data = next(data_iterator)
        else:
            data = None
        data_b = mpu.broadcast_data(keys, data, datatype)
        input_ids = data_b['input_ids'].long()
        attention_mask = data_b['attention_mask'].long()
        token_type_ids = data_b['token_type_ids'].long()
        labels = data_b['labels'].long()
        next_sentence_label = data_b['next_sentence_label'].long()
        output_tensor = model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids, labels=labels, next_sentence_label=next_sentence_label)

        return output_tensor['loss']

engine = RapidformerEngine()
trainer = MyBertPreTrainer(engine=engine)
trainer.train()
"""

COMPOSE_LOOP = """
import torch
from functools import partial
from datasets import load_dataset
from glue_metric import load_metric
from torch.utils.data import DataLoader
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    get_linear_schedule_with_warmup,
    BertForSequenceClassification,

)
from rapidformer import RapidformerEngine, Finetuner

tokenizer = AutoTokenizer.from_pretrained("bert-base-cased")
datasets = load_dataset("glue", "mrpc")
metric = load_metric("glue", "mrpc")

def tokenize_function(examples):
    # max_length=None => use the model max length (it's actually the default)
    outputs = tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=None)
    return outputs

tokenized_datasets = datasets.map(
    tokenize_function,
    batched=True,
    remove_columns=["idx", "sentence1", "sentence2"],
)

model = AutoModelForSequenceClassification.from_pretrained("bert-base-cased", return_dict=True)

engine = RapidformerEngine()
finetuner = Finetuner(engine=engine)

train_dataloader = finetuner.build_data_loader(tokenized_datasets["train"])
eval_dataloader = finetuner.build_data_loader(tokenized_datasets["validation"])

lr_scheduler = partial(
        get_linear_schedule_with_warmup,
        num_warmup_steps=args.lr_warmup_iters,
        num_training_steps=args.train_iters
    )

model, optimizer, lr_scheduler = engine.compose(model_obj=model,
      lr_scheduler_fn=lr_scheduler)

device = torch.device("cuda", args.local_rank)

for epoch in range(args.epochs):
    model.train()
    for step, batch in enumerate(train_dataloader):
        outputs = model(**batch)
        loss = outputs.loss
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()

    model.eval()
    for step, batch in enumerate(eval_dataloader):
        with torch.no_grad():
            outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            metric.add_batch(
                    predictions=engine.gather(predictions),
                    references=engine.gather(batch["labels"]))

    eval_metric = metric.compute()
    print("epoch {}: {}".format(epoch, eval_metric))
"""

"""What the SimCSE configs share: the BERT tokenizer, the model, the optimizer and the
training / evaluation defaults. ``simcse_unsup.py`` and ``simcse_sup.py`` import it and add
their data and hyper-parameters (Gao et al., 2021)."""

from omegaconf import OmegaConf

from libai.config import LazyCall, get_config
from libai.scheduler import WarmupLinearLR
from libai.tokenizer import BertTokenizer
from projects.simcse.evaluator import SpearmanEvaluator
from projects.simcse.modeling import SIMCSE_DEFAULTS, SimCSE

tokenization = OmegaConf.create()
tokenization.tokenizer = LazyCall(BertTokenizer)(
    vocab_file="/path/to/bert-base-uncased/vocab.txt",
    do_lower_case=True,
)
tokenization.append_eod = False
tokenization.make_vocab_size_divisible_by = 128
tokenization.setup = True  # vocab_size from the tokenizer (a Hugging Face start uses its own)

# BERT-base hyper-parameters, then SimCSE's options (see projects/simcse/modeling.py):
# pooling "cls" | "mean"; mlp "train_only" | "always" | "none"; temperature;
# hard_negative_weight; gather_negatives (in-batch negatives of all data-parallel ranks);
# pretrained_model_path (a Hugging Face BERT directory to start from)
cfg = OmegaConf.to_container(get_config("common/models/bert.py").cfg)
cfg.update(SIMCSE_DEFAULTS)
model = LazyCall(SimCSE)(cfg=cfg)
cfg = model.cfg  # LazyCall copied the dict: edit the model's own

graph = get_config("common/models/graph.py").graph
optim = get_config("common/optim.py").optim
optim.weight_decay = 0.0  # SimCSE trains with Hugging Face Trainer's defaults

train = get_config("common/train.py").train
train.update(
    train_iter=0,  # train_epoch decides
    log_period=10,
    warmup_ratio=0.0,
    # linear decay to 0, no warmup (the reference's schedule)
    scheduler=LazyCall(WarmupLinearLR)(warmup_factor=1.0, end_factor=0.0),
)
train.evaluation.update(
    evaluator=LazyCall(SpearmanEvaluator)(),
    eval_period=125,
    eval_metric="spearman",  # model_best keeps the best STS Spearman
    eval_mode="max",
)
train.checkpointer.update(period=1000, max_to_keep=2)

"""SimCSE sentence embeddings on libai's BERT encoder (a self-contained project: see README.md).

``modeling.SimCSE`` (the model), ``loss.contrastive_loss`` (the InfoNCE objective, gathered
over data-parallel ranks), ``dataset`` (unsupervised sentences, NLI triples, STS pairs) and
``evaluator.SpearmanEvaluator``; the configs live in ``configs/``.
"""

"""BERT sentence / sentence-pair classification on local CSV files, as a LiBai project.

``configs/`` (LazyCall configs for ``tools/train_net.py``), ``dataset.py`` (one label list
for every split, saved with the output), ``modeling.py`` (start from Hugging Face weights),
``predict.py`` (classify new texts with a trained checkpoint) and ``prepare_sample_data.py``
(the shipped sample). See README.md.
"""

"""Ready-made task modules for the zoo, so a YAML config alone trains them: GPT
pretraining, Llama / Qwen2 SFT, BERT / RoBERTa sequence classification and ViT image
classification (``Model.module`` names them; see :data:`libai.fleetx.yaml_setup.MODULES`)."""

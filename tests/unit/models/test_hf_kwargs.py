"""Models loaded with ``load_huggingface`` take transformers' keyword names
(``model(**tokenizer(...))``) and give exactly what libai's names give; both spellings of one
input is a clear TypeError (libai.models.utils.hf_kwargs)."""

from __future__ import annotations

import pytest
import torch
import transformers

from libai import dist
from libai.models.utils import load_huggingface
from libai.models.utils.hf_kwargs import HF_KEYWORDS, accepts_hf_keywords

VOCAB, BATCH, SEQ = 99, 2, 8


@pytest.fixture(autouse=True)
def single_process_mesh():
    dist.setup_dist_util({})


def ids_and_mask(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, 5:] = 0
    return ids * mask, mask


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a.keys():  # (BertModel's output is LiBai's tuple: iterating gives tensors)
        assert torch.equal(a[key], b[key]), key


def load(tmp_path, hf):
    hf.save_pretrained(tmp_path)
    return load_huggingface(str(tmp_path)).eval()


def bert_config():
    return transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=SEQ + 4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


@pytest.mark.parametrize("hf_class", ["BertModel", "BertForPreTraining"])
def test_bert_takes_tokenizer_names(tmp_path, hf_class):
    torch.manual_seed(0)
    model = load(tmp_path, getattr(transformers, hf_class)(bert_config()))
    ids, mask = ids_and_mask()
    types = torch.zeros_like(ids)
    types[:, SEQ // 2 :] = 1
    hf_batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    libai_batch = {"input_ids": ids, "attention_mask": mask, "tokentype_ids": types}
    if hf_class == "BertForPreTraining":
        labels = torch.full_like(ids, -100)
        labels[:, 2] = ids[:, 2]
        nsp = torch.tensor([0, 1])
        hf_batch.update(labels=labels, next_sentence_label=nsp)
        libai_batch.update(lm_labels=labels, ns_labels=nsp)
    with torch.no_grad():
        got, want = model(**hf_batch), model(**libai_batch)
    assert_same(got, want)
    # the token types reach the model: other types, other output
    with torch.no_grad():
        other = model(**{**hf_batch, "token_type_ids": torch.zeros_like(ids)})
    first = next(iter(got.keys()))
    assert not torch.equal(other[first], got[first])
    with pytest.raises(TypeError, match="both 'token_type_ids'.*and 'tokentype_ids'"):
        model(**hf_batch, tokentype_ids=types)


def test_t5_encoder_decoder_takes_transformers_names(tmp_path):
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=48,
        num_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        decoder_start_token_id=0,
    )
    model = load(tmp_path, transformers.T5ForConditionalGeneration(config))
    ids, mask = ids_and_mask()
    dec_ids, dec_mask = ids_and_mask(seed=1)
    labels = dec_ids.masked_fill(dec_mask == 0, -100)
    hf_batch = dict(
        input_ids=ids,
        attention_mask=mask,
        decoder_input_ids=dec_ids,
        decoder_attention_mask=dec_mask,
        labels=labels,
    )
    libai_batch = dict(
        encoder_input_ids=ids,
        encoder_attn_mask=mask,
        decoder_input_ids=dec_ids,
        decoder_attn_mask=dec_mask,
        lm_labels=labels,
    )
    with torch.no_grad():
        assert_same(model(**hf_batch), model(**libai_batch))
        no_labels = {k: v for k, v in hf_batch.items() if k != "labels"}
        out = model(**no_labels)
    # the masks reach the model: without them the logits change
    with torch.no_grad():
        unmasked = model(input_ids=ids, decoder_input_ids=dec_ids)
    assert not torch.equal(out["logits"], unmasked["logits"])
    with pytest.raises(TypeError, match="both 'input_ids'.*and 'encoder_input_ids'"):
        model(input_ids=ids, encoder_input_ids=ids, decoder_input_ids=dec_ids)


def test_llama_decoder_names_are_transformers_names(tmp_path):
    """Llama/Qwen2 and GPT-2 already spell every input like transformers: a tokenizer's batch
    plus ``labels`` goes in as is, and the rule maps nothing there."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    hf = transformers.LlamaForCausalLM(config)
    model = load(tmp_path, hf)
    ids, mask = ids_and_mask()
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask, labels=labels)
        want = hf(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(got["lm_loss"], want.loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["logits"], want.logits, rtol=1e-5, atol=1e-5)
    assert not hasattr(type(model).forward, "hf_keywords")


def test_vit_takes_pixel_values(tmp_path):
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = load(tmp_path, transformers.ViTForImageClassification(config))
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert_same(model(pixel_values=images), model(images=images))
    with pytest.raises(TypeError, match="both 'pixel_values'"):
        model(pixel_values=images, images=images)


def test_alias_applies_only_where_libai_spells_it_differently():
    class Plain(torch.nn.Module):
        @accepts_hf_keywords
        def forward(self, input_ids, attention_mask=None, tokentype_ids=None, labels=None):
            return input_ids, attention_mask, tokentype_ids, labels

    assert Plain.forward.hf_keywords == {"token_type_ids": "tokentype_ids"}
    assert Plain()(1, token_type_ids=2, labels=3) == (1, None, 2, 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'pixel_values'"):
        Plain()(1, pixel_values=2)
    assert set(HF_KEYWORDS.values()).isdisjoint(HF_KEYWORDS)  # no chained renames

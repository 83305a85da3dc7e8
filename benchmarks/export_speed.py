"""Times the retriever SavedModel export with the Keras model tracked by the exported module (Keras then traces
and saves every layer's call function) against tracking only its variables, and checks both give equal
embeddings.

    .venv/bin/python benchmarks/export_speed.py configs/tiny.yaml
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

from realm_tf import config  # noqa: E402
from realm_tf.export import retriever_export  # noqa: E402
from realm_tf.layers import bert_tokenizer  # noqa: E402
from realm_tf.models import knowledge_retriever  # noqa: E402


class VariablesOnlyModule(retriever_export.RetrieverExportModule):
    """The same signatures; the module tracks the retriever's variables, not the Keras model."""

    def __init__(self, retriever, *args):
        super().__init__(retriever, *args)
        del self.retriever
        self._variables = list(retriever.variables)
        self.__dict__["retriever"] = retriever  # untracked


def main() -> int:
    cfg = config.load_config(sys.argv[1] if len(sys.argv) > 1 else "configs/tiny.yaml")
    tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    retriever = knowledge_retriever.build_knowledge_retriever(cfg.model)
    lengths = (cfg.model.query_seq_length, cfg.model.block_seq_length)
    out = tempfile.mkdtemp()
    loaded = {}
    for name, module in (("keras-tracked", retriever_export.RetrieverExportModule(retriever, tokenizer, *lengths)),
                         ("variables-only", VariablesOnlyModule(retriever, tokenizer, *lengths))):
        start = time.time()
        tf.saved_model.save(module, os.path.join(out, name), signatures={
            "embed_query": module.embed_query, "embed_block": module.embed_block})
        print(f"{name}: saved in {time.time() - start:.1f} s")
        loaded[name] = tf.saved_model.load(os.path.join(out, name))
    questions = tf.constant(["who wrote hamlet", "what is the capital of france"])
    a, b = (loaded[n].signatures["embed_query"](text=questions)["embedding"] for n in loaded)
    print(f"max |embedding difference|: {float(tf.reduce_max(tf.abs(a - b))):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

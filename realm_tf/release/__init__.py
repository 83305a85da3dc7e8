"""realm_tf.release: the import of Google's released REALM and ORQA models (TF1 checkpoints, TF-Hub modules) and of
ORQA's released corpus and block embeddings."""

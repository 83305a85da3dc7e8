"""RETRO (Borgeaud et al. 2021) and kNN-LM (Khandelwal et al. 2020): the chunk database and its frozen-BERT keys,
chunked cross-attention, the decoder and its neighbours, training, generation, the kNN-LM datastore, bits-per-byte
evaluation and the SavedModel export, in one place."""

"""The SavedModel writers: the retriever's ``embed_query`` / ``embed_block`` export that the index refresh reads
(REALM, Guu et al. 2020, §3.4), the Open-QA model for TF Serving, RETRO's decoder, and their warm-up records."""

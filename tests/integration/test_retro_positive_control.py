"""RETRO reads its neighbours, through the whole path: a baseline decoder RETRO-fitted (RETRO §4.2: only the chunked
cross-attention and the neighbour encoder train) with each chunk's own database entry [C_u, C_{u+1}] forced in
as neighbour 1 (controlled leakage, §2.3) copies the continuation it is handed. The chunk database, the neighbour
tables, the tf.data input, ``train-retro``'s task and ``evaluate-lm``'s scoring are the product's own; a bug
anywhere on that path (an off-by-one chunk shift, a neighbour of the wrong chunk, a mask) leaves the bits where
the baseline has them."""
import pytest

from realm_tf import config
from realm_tf.core import experiment
from realm_tf.retro import lm_evaluation
from realm_tf.retro import retro_lm

pytestmark = pytest.mark.slow  # two short trainings (400 + 600 steps of 8 sequences, a tiny decoder): about a minute

TINY = "configs/tiny.yaml"
#: A decoder wide enough to learn copying in a few hundred steps (at 5e-3 and above it does not learn it at all),
#: reading the forced neighbour alone, over the corpus's own ~3,000 wordpieces (``retro_sets``): with MiniLM's
#: 30,522 the softmax was most of a step, and the same steps took twice as long. Over seeds 0-3, 400 + 600 steps
#: leave 0.50-0.58 of the baseline's bits; 300 + 400 left 0.62-0.74.
DECODER = ["retro.num_neighbours=1", "retro.decoder_width=64", "retro.decoder_heads=2",
           "retro.decoder_intermediate=128", "data.batch_size=8", "data.shuffle_buffer=256",
           "retro_trainer.learning_rate=2e-3", "retro_trainer.warmup_steps=20",
           "retro_trainer.summary_every_steps=50", "retro_trainer.checkpoint_every_steps=1000",
           "retro_trainer.learning_rate_decay=constant"]


def test_a_retro_fitted_decoder_copies_a_forced_neighbour_through_the_real_pipeline(retro_sets, tmp_path):
    _, sets = retro_sets
    base = config.load_config(TINY, sets + DECODER + [f"retro_trainer.model_dir={tmp_path}/baseline",
                                                      "retro_trainer.steps=400"])
    experiment.run_experiment(retro_lm.RetroLmTask(base, retrieval=False))
    fit = config.load_config(TINY, sets + DECODER + [f"retro_trainer.model_dir={tmp_path}/fit",
                                                     "retro_trainer.steps=600", "retro.own_neighbour_rate=1.0",
                                                     f"retro.retro_fit_from={tmp_path}/baseline"])
    experiment.run_experiment(retro_lm.RetroLmTask(fit))

    def bits(cfg, retrieval, neighbours=True):  # on the chunks that read neighbours: a sequence's chunks >= 1
        return lm_evaluation.evaluate(cfg, cfg.retro_trainer.model_dir, retrieval=retrieval, split="validation",
                                      neighbours=neighbours)["later_chunks"]["bpb"]

    baseline, on, off = bits(base, False), bits(fit, True), bits(fit, True, neighbours=False)
    assert off == pytest.approx(baseline, rel=1e-4)  # without neighbours a RETRO-fitted model is its baseline
    assert on < 0.75 * baseline, (on, off, baseline)  # with them it copies: a quarter of the bits gone, and more

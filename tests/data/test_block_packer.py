"""Block packing: never over budget, nothing lost, order kept, long sentences cut at word starts."""
import random

import pytest

from realm_tf.data import block_packer


def _flatten(blocks):
    return [(s.sentence, i) for block in blocks for s in block for i in range(s.start, s.end)]


@pytest.mark.parametrize("seed", range(20))
def test_random_documents_pack_losslessly_within_budget(seed):
    rng = random.Random(seed)
    packer = block_packer.BlockPacker(max_block_length=rng.choice([16, 32, 288]))
    title_length = rng.randint(0, 40)
    sentences = [[rng.random() < 0.7 or i == 0 for i in range(rng.choice([0, 1, 5, 20, 60, 400]))]
                 for _ in range(rng.randint(1, 30))]
    blocks = packer.pack(title_length, sentences)
    budget = packer.body_budget(title_length)
    assert budget > 0 and packer.title_length(title_length) + budget + 3 == packer.max_block_length
    assert all(0 < sum(s.end - s.start for s in block) <= budget for block in blocks)
    expected = [(n, i) for n, sentence in enumerate(sentences) for i in range(len(sentence))]
    assert _flatten(blocks) == expected  # every wordpiece exactly once, in order


def test_sentences_are_not_split_when_they_fit_and_greedy_fill():
    packer = block_packer.BlockPacker(max_block_length=13)  # body budget 10 with no title
    blocks = packer.pack(0, [[True] * 4, [True] * 5, [True] * 3, [True] * 10])
    assert [[(s.sentence, s.start, s.end) for s in b] for b in blocks] == [
        [(0, 0, 4), (1, 0, 5)], [(2, 0, 3)], [(3, 0, 10)]]


def test_long_sentence_cut_at_word_starts():
    packer = block_packer.BlockPacker(max_block_length=13)  # budget 10
    starts = [True, False, False, True, False, True, False, False, False, True, False, False, True, True]
    blocks = packer.pack(0, [starts])
    cuts = [block[0].start for block in blocks[1:]]
    assert cuts == [9]  # the last word start at or before 10
    assert all(starts[c] for c in cuts)
    one_word = [True] + [False] * 25  # a single 26-piece word must be cut inside
    assert [(b[0].start, b[0].end) for b in packer.pack(0, [one_word])] == [(0, 10), (10, 20), (20, 26)]


def test_long_title_is_truncated_and_leaves_room():
    packer = block_packer.BlockPacker(max_block_length=32, max_title_length=64)
    assert packer.title_length(500) == 14 and packer.body_budget(500) == 15
    with pytest.raises(ValueError):
        block_packer.BlockPacker(max_block_length=4)

"""lm_loss's peak memory: the loss's probabilities, a (..., T, V) array, are freed before the backward."""
import tracemalloc

import numpy as np

import attention_ref as ar
from attention_ref.models.families import FAMILY
from attention_ref.nn.cross_entropy import cross_entropy_backward, cross_entropy_forward, next_token_targets


def _peak(fn):
    """Bytes NumPy allocated at the peak of ``fn()`` above what was allocated before (tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_lm_loss_frees_the_probabilities_before_the_backward():
    # wide enough that the backward's gradients (two 4096 x 128 tables) make its peak, as at real sizes
    config = ar.LMConfig.from_dict({**FAMILY["llama"].example, "model_type": "llama", "vocab_size": 4096,
                                    "hidden_size": 128, "intermediate_size": 256})
    params = ar.init_lm_params(config, seed=0)
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, 24))
    probabilities = ids.size * config.vocab_size * 8  # (2, 24, V) float64

    def with_the_probabilities_kept():  # the same steps, the loss's cache alive through the backward
        logits, cache = ar.lm_forward(ids, params, config)
        loss, loss_cache = cross_entropy_forward(logits, next_token_targets(ids))
        return ar.lm_backward(cross_entropy_backward(1.0, loss_cache), cache), loss_cache

    ar.lm_loss(ids, params, config)  # anything made once (caches of constants) is made before measuring
    kept, freed = _peak(with_the_probabilities_kept), _peak(lambda: ar.lm_loss(ids, params, config))
    assert kept - freed >= 0.9 * probabilities, (kept, freed, probabilities)

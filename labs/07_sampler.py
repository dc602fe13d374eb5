"""Lab 7: the sampler (greedy, temperature, top-p).

Run it:  python -m paged_np lab sampler --solution labs/07_sampler.py

The model gives one row of logits per sequence that samples this step; the
sampler turns each row into a token:

- ``temperature == 0`` is greedy: the argmax, and nothing drawn;
- otherwise divide the logits by the temperature, take the softmax, keep the
  *nucleus* (the most likely tokens, most likely first, until their probability
  reaches ``top_p``; the token that crosses it stays in; among equal
  probabilities the lower token id comes first), renormalise, and draw.

A draw is exactly one number from the sample's own generator, ``u = rng.random()``:
the token is the first whose cumulative probability passes ``u`` times the total.
One draw per token is what makes a seeded request give the same text whoever
shares its batch. The lab plugs your sampler into the engine and checks every
token, seeded samples included, against the package's.
"""

import numpy as np  # noqa: F401  (you will want it)


def probabilities(logits, temperature, top_p):
    """float64 [V]: the distribution a token is drawn from (temperature > 0).

    logits: float32 [V]; temperature > 0; 0 < top_p <= 1.
    """
    raise NotImplementedError        # your code here (about eight lines)


def sample(logits, params, rngs):
    """int64 [S]: one token per row of ``logits`` [S, V].

    params[i]: row i's SamplingParams (``.temperature``, ``.top_p``; greedy when the
    temperature is 0); rngs[i]: row i's np.random.Generator.
    """
    raise NotImplementedError        # your code here (about seven lines)

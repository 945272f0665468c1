"""Speculative decoding: several tokens a step for a stream whose text is predictable.

A stream's next tokens are guessed cheaply (drafts), fed in the same batched step as everyone's
work with logits at each guessed position, and kept while they are what the model itself
samples there: the first disagreement ends the run, and the model's own token at that position
is the step's last. So an answer is, token for token, what it is without speculation (and with
sampling each kept token is the one the model sampled there: the distribution is unchanged).

    lookup   drafts from the sequence's own prompt and answer (prompt lookup decoding)
    table    drafts from an n-gram table learnt from earlier answers of the same partition
    policy   how far each stream speculates: its measured acceptance against the measured cost
             of a step by size, inside the step's budget; zero where it does not pay
"""

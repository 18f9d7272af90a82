"""Data for the reference GPT client: a JSONL corpus, a byte tokenizer, the sample order.

Sample id = 0-based line number of the JSONL file. A sample's tokens are the UTF-8
bytes of its "text" field mod the vocabulary size, prefixed by token 0 (a start
token); inputs are tokens[:-1], labels tokens[1:], cut or padded to seq_length with a
loss mask of 0 on padding.

The global order of samples is the ONE function `step_samples`, with the semantics
of `tenplex data batches` (issue 6): epoch e is a permutation of the samples seeded by
(seed, e); the final partial global batch of an epoch is dropped; the position is the
number of samples consumed across epochs; a data-parallel rank's part of a global
batch is a contiguous slice, balanced to within one sample, and the slices of ranks
0..dp-1 concatenated are the global batch whatever dp is. Swap its body for the
Python package's reader (python/tenplex/data.py) when that exists.
"""
import json

import numpy as np
import torch


def step_samples(num_samples, seed, global_batch, position, dp, dp_rank):
    """(global batch sample ids, this dp rank's ids) of the step that starts at `position`."""
    per_epoch = (num_samples // global_batch) * global_batch
    if per_epoch == 0:
        raise ValueError(f"the dataset has {num_samples} samples, fewer than one global batch of {global_batch}")
    if position % global_batch:
        raise ValueError(f"position {position} is not at a global batch boundary ({global_batch})")
    epoch, offset = divmod(position, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(num_samples)
    ids = [int(i) for i in perm[offset:offset + global_batch]]
    begin, end = dp_rank * global_batch // dp, (dp_rank + 1) * global_batch // dp
    return ids, ids[begin:end]


class Corpus:
    def __init__(self, path, vocab_size, seq_length):
        with open(path) as f:
            self.texts = [json.loads(line)["text"] for line in f if line.strip()]
        self.vocab_size, self.seq_length = vocab_size, seq_length

    def __len__(self):
        return len(self.texts)

    def tokens(self, i):
        return [0] + [b % self.vocab_size for b in self.texts[i].encode("utf-8")]

    def batch(self, ids):
        """(inputs [n, s] int64, labels [n, s] int64, loss mask [n, s] float32)."""
        s = self.seq_length
        inputs = torch.zeros(len(ids), s, dtype=torch.int64)
        labels = torch.zeros(len(ids), s, dtype=torch.int64)
        mask = torch.zeros(len(ids), s, dtype=torch.float32)
        for row, i in enumerate(ids):
            t = self.tokens(i)[:s + 1]
            n = len(t) - 1
            inputs[row, :n] = torch.tensor(t[:-1])
            labels[row, :n] = torch.tensor(t[1:])
            mask[row, :n] = 1
        return inputs, labels, mask

    def valid_tokens(self, ids):
        return sum(min(len(self.texts[i].encode("utf-8")), self.seq_length) for i in ids)

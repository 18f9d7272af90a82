"""Data for the reference GPT client: a JSONL corpus, a byte tokenizer, the sample order.

Sample id = 0-based line number of the JSONL file. A sample's tokens are the UTF-8
bytes of its "text" field mod the vocabulary size, prefixed by token 0 (a start
token); inputs are tokens[:-1], labels tokens[1:], cut or padded to seq_length with a
loss mask of 0 on padding.

The global order of samples is the ONE function `step_samples`, following the order
of `tenplex data batches` (src/tenplex/data/order.h, prng.h): epoch e is a
Fisher-Yates permutation driven by SplitMix64 from state Mix64(Mix64(seed) ^ e) with
Lemire's bounded draws; the final partial global batch of an epoch is dropped; the
position is the number of samples consumed across epochs; dp rank r of dp takes the
contiguous slice [r q + min(r, m), (r+1) q + min(r+1, m)) with q = B / dp, m = B mod dp,
so the slices of ranks 0..dp-1 concatenated are the global batch whatever dp is. Swap
its body for the Python package's reader (python/tenplex/data.py) when that exists.
"""
import json

import torch

_M64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _permutation(n, seed, epoch):
    state = _mix64(_mix64(seed & _M64) ^ epoch)
    a = list(range(n))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        while True:
            state = (state + _GAMMA) & _M64
            m = _mix64(state) * bound
            if (m & _M64) >= ((1 << 64) - bound) % bound:  # Lemire: reject when low < 2^64 mod bound
                break
        j = m >> 64
        a[i], a[j] = a[j], a[i]
    return a


_perm_cache = {}


def step_samples(num_samples, seed, global_batch, position, dp, dp_rank):
    """(global batch sample ids, this dp rank's ids) of the step that starts at `position`."""
    per_epoch = (num_samples // global_batch) * global_batch
    if per_epoch == 0:
        raise ValueError(f"the dataset has {num_samples} samples, fewer than one global batch of {global_batch}")
    if position % global_batch:
        raise ValueError(f"position {position} is not at a global batch boundary ({global_batch})")
    if not 0 <= dp_rank < dp <= global_batch:
        raise ValueError(f"dp rank {dp_rank} of dp {dp} with a global batch of {global_batch}")
    epoch, offset = divmod(position, per_epoch)
    key = (num_samples, seed, epoch)
    if key not in _perm_cache:
        _perm_cache.clear()
        _perm_cache[key] = _permutation(num_samples, seed, epoch)
    ids = _perm_cache[key][offset:offset + global_batch]
    q, m = divmod(global_batch, dp)
    begin = dp_rank * q + min(dp_rank, m)
    end = begin + q + (1 if dp_rank < m else 0)
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

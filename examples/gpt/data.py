"""Data for the reference GPT client: a JSONL corpus, a byte tokenizer, the sample order.

Sample id = 0-based line number of the JSONL file. A sample's tokens are the UTF-8
bytes of its "text" field mod the vocabulary size, prefixed by token 0 (a start
token); inputs are tokens[:-1], labels tokens[1:], cut or padded to seq_length with a
loss mask of 0 on padding.

The global order of samples is `step_samples` of the tenplex package (python/tenplex/data.py
over the native module): the same order as `tenplex data batches` and the FUSE view
(docs/data.md), one implementation for all of them.
"""

import json

import torch

from tenplex.data import step_samples  # noqa: F401 (the client's sample order)


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
            t = self.tokens(i)[: s + 1]
            n = len(t) - 1
            inputs[row, :n] = torch.tensor(t[:-1])
            labels[row, :n] = torch.tensor(t[1:])
            mask[row, :n] = 1
        return inputs, labels, mask

    def valid_tokens(self, ids):
        return sum(min(len(self.texts[i].encode("utf-8")), self.seq_length) for i in ids)

"""BERT-style masked language modelling, the pieces pretrain.py trains: sizes, the text, a word tokenizer, the
15% masking with its 80/10/10 split, and the model (torch.nn.TransformerEncoder, post-norm as in BERT).

Pure helpers, tested on the CPU by tests/test_bert_example.py; nothing here talks to other processes.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# BERT's sizes (Devlin et al. 2019, "BERT: Pre-training of Deep Bidirectional Transformers for Language
# Understanding", https://arxiv.org/abs/1810.04805, section 3: BERT-base L=12 H=768 A=12, BERT-large L=24 H=1024
# A=16, feed-forward 4H, a 30,522-token WordPiece vocabulary, 512 positions). `tiny` is for CPU tests.


@dataclass(frozen=True)
class Size:
    layers: int
    hidden: int
    heads: int
    vocab: int        # embedding rows; BERT's 30,522 for base/large, so the gradient is BERT's size
    positions: int    # longest sequence the model takes
    seq_len: int      # tokens per training sequence ([CLS] ... [SEP]); BERT's phase 1 uses 128
    lr: float         # AdamW peak learning rate


SIZES = {
    "tiny": Size(layers=2, hidden=64, heads=2, vocab=2000, positions=64, seq_len=32, lr=2e-3),
    "base": Size(layers=12, hidden=768, heads=12, vocab=30522, positions=512, seq_len=128, lr=1e-4),
    "large": Size(layers=24, hidden=1024, heads=16, vocab=30522, positions=512, seq_len=128, lr=1e-4),
}

# ---------------------------------------------------------------------------------------------- the text

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(len(SPECIALS))
WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")  # lower-case words and numbers; every other visible character alone


def corpus() -> str:
    """Real English that ships with Python itself: the Python reference manual's topics that pydoc shows
    (pydoc_data.topics, about 460,000 characters), in a fixed order. Nothing is downloaded."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise SystemExit("error: this Python has no pydoc_data (its standard library is incomplete); "
                         "use --synthetic, or a Python with its full standard library") from None
    text = "\n\n".join(topics[k] for k in sorted(topics))
    return re.sub(r"^[*=~^-]{3,}[ \t]*$", "", text, flags=re.M)  # reST's heading underlines are no language


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]  # index = token id; the specials first

    @classmethod
    def build(cls, text: str, size: int) -> Vocab:
        """The specials, then the `size - 5` most frequent words of `text` (ties in alphabetical order), so every
        rank builds the same vocabulary from the same text."""
        if size <= len(SPECIALS):
            raise ValueError(f"a vocabulary needs more than the {len(SPECIALS)} special tokens, got {size}")
        counts = Counter(words(text))
        common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size - len(SPECIALS)]
        return cls(SPECIALS + [w for w, _ in common])

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        ids = {t: i for i, t in enumerate(self.tokens)}
        return [ids.get(w, UNK) for w in words(text)]

    def decode(self, ids) -> str:
        return " ".join(self.tokens[int(i)] for i in ids)


def sequences(ids: list[int], seq_len: int) -> torch.Tensor:
    """The token stream cut into [CLS] + seq_len-2 tokens + [SEP] rows; the tail that does not fill a row is left."""
    body = seq_len - 2
    if body < 1:
        raise ValueError(f"seq_len must be >= 3 ([CLS], a token, [SEP]), got {seq_len}")
    n = len(ids) // body
    rows = torch.tensor(ids[:n * body], dtype=torch.long).view(n, body)
    return torch.cat([torch.full((n, 1), CLS), rows, torch.full((n, 1), SEP)], dim=1)


# ---------------------------------------------------------------------------------------------- masking

def mask_tokens(tokens: torch.Tensor, vocab_size: int, generator: torch.Generator, prob: float = 0.15):
    """BERT's masked-LM input (section 3.1, "Task #1: Masked LM"): `prob` of the tokens that are not special are
    chosen for prediction; of those 80% become [MASK], 10% a random word and 10% stay as they are. Returns
    (inputs, labels): labels hold the original token where chosen and -100 (ignored by cross_entropy) elsewhere.
    A row where chance chose nothing gets one chosen token, so every row has something to predict."""
    maskable = tokens >= len(SPECIALS)
    chosen = (torch.rand(tokens.shape, generator=generator) < prob) & maskable
    empty = ~chosen.any(dim=1) & maskable.any(dim=1)
    if empty.any():
        pick = torch.multinomial(maskable[empty].float(), 1, generator=generator).squeeze(1)
        chosen[empty.nonzero().squeeze(1), pick] = True
    labels = torch.where(chosen, tokens, torch.full_like(tokens, -100))
    roll = torch.rand(tokens.shape, generator=generator)
    inputs = tokens.clone()
    inputs[chosen & (roll < 0.8)] = MASK
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[swap] = torch.randint(len(SPECIALS), vocab_size, (int(swap.sum()),), generator=generator)
    return inputs, labels


# ---------------------------------------------------------------------------------------------- the model

class BertMLM(nn.Module):
    """Token and position embeddings, a post-norm Transformer encoder with GELU, and BERT's masked-LM head (a
    dense layer, GELU, LayerNorm, then the decoder tied to the token embeddings). No next-sentence task, no
    segment embeddings and no pooler: masked LM alone (as RoBERTa pre-trains)."""

    def __init__(self, size: Size, dropout: float = 0.1):
        super().__init__()
        self.tokens = nn.Embedding(size.vocab, size.hidden, padding_idx=PAD)
        self.positions = nn.Embedding(size.positions, size.hidden)
        self.norm = nn.LayerNorm(size.hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(size.hidden, size.heads, dim_feedforward=4 * size.hidden,
                                           dropout=dropout, activation="gelu", batch_first=True, norm_first=False,
                                           layer_norm_eps=1e-12)
        self.encoder = nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Linear(size.hidden, size.hidden), nn.GELU(),
                                  nn.LayerNorm(size.hidden, eps=1e-12))
        self.bias = nn.Parameter(torch.zeros(size.vocab))
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        # BERT's initializer: normal(0, 0.02) weights, zero biases.
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary for every position: (batch, seq, vocab)."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.norm(self.tokens(ids) + self.positions(pos)))
        x = self.head(self.encoder(x))
        return F.linear(x, self.tokens.weight, self.bias)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the chosen positions only."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
